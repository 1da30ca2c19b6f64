//! The consoles: a vm-superio 16550 per vCPU (COM1 to COM4), whose output
//! goes to a [`ConsoleOut`], and whose `SerialState` travels as an
//! instance of the `serial` state section. The guest polls nothing and takes no interrupt, so the
//! interrupt line is a no-op.

use crate::DeviceError;
use std::io::Write;
use std::sync::{Arc, Mutex};
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::{Serial, Trigger};

/// The section's name.
pub const SECTION: &str = "serial";
/// The layout [`Console::save`] writes.
pub const VERSION: u32 = 1;

/// An interrupt line nobody listens to.
pub struct NoInterrupt;

impl Trigger for NoInterrupt {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        Ok(())
    }
}

/// Where the console's bytes go, shared with whoever reads them (a file,
/// stdout). Lines are flushed as they end.
#[derive(Clone)]
pub struct ConsoleOut(Arc<Mutex<Box<dyn Write + Send>>>);

impl ConsoleOut {
    /// Output into `w`.
    pub fn new(w: Box<dyn Write + Send>) -> Self {
        ConsoleOut(Arc::new(Mutex::new(w)))
    }

    /// Flushes what has been written.
    pub fn flush(&self) {
        let _ = self.0.lock().unwrap_or_else(|e| e.into_inner()).flush();
    }
}

impl Write for ConsoleOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut w = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = w.write(buf)?;
        if buf.contains(&b'\n') {
            w.flush()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}

/// Where vCPU `i`'s console goes when vCPU 0's goes to `path`: the path
/// itself for vCPU 0, with `.i` appended for the others.
pub fn console_path(path: &std::path::Path, i: u32) -> std::path::PathBuf {
    match i {
        0 => path.to_path_buf(),
        _ => format!("{}.{i}", path.display()).into(),
    }
}

/// The 16550.
pub struct Console {
    serial: Serial<NoInterrupt, NoEvents, ConsoleOut>,
    out: ConsoleOut,
}

impl Console {
    /// A fresh port writing to `out`.
    pub fn new(out: ConsoleOut) -> Self {
        Console {
            serial: Serial::new(NoInterrupt, out.clone()),
            out,
        }
    }

    /// A guest `out` to register `offset` (0..8).
    pub fn write(&mut self, offset: u8, value: u8) {
        // A full output sink is the host's problem; the guest goes on.
        let _ = self.serial.write(offset, value);
    }

    /// A guest `in` from register `offset`.
    pub fn read(&mut self, offset: u8) -> u8 {
        self.serial.read(offset)
    }

    /// The registers and the receive FIFO, in the section's layout: nine
    /// register bytes, then the FIFO.
    pub fn save(&self) -> Vec<u8> {
        let s = self.serial.state();
        let mut out = vec![
            s.baud_divisor_low,
            s.baud_divisor_high,
            s.interrupt_enable,
            s.interrupt_identification,
            s.line_control,
            s.line_status,
            s.modem_control,
            s.modem_status,
            s.scratch,
        ];
        out.extend_from_slice(&s.in_buffer);
        out
    }

    /// Loads what [`Console::save`] wrote; output goes on to this port's sink.
    pub fn restore(&mut self, data: &[u8]) -> Result<(), DeviceError> {
        let [bl, bh, ie, ii, lc, ls, mc, ms, sc, fifo @ ..] = data else {
            return Err(DeviceError::State {
                section: SECTION,
                why: format!("{} bytes, under the 9 of the registers", data.len()),
            });
        };
        let state = SerialState {
            baud_divisor_low: *bl,
            baud_divisor_high: *bh,
            interrupt_enable: *ie,
            interrupt_identification: *ii,
            line_control: *lc,
            line_status: *ls,
            modem_control: *mc,
            modem_status: *ms,
            scratch: *sc,
            in_buffer: fifo.to_vec(),
        };
        self.serial =
            Serial::from_state(&state, NoInterrupt, NoEvents, self.out.clone()).map_err(|e| {
                DeviceError::State {
                    section: SECTION,
                    why: format!("{e:?}"),
                }
            })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_state_round_trips_with_its_fifo() {
        let mut a = Console::new(ConsoleOut::new(Box::new(std::io::sink())));
        a.write(7, 0x5a); // scratch
        a.write(3, 0x80); // DLAB on
        a.write(0, 3); // divisor low
        a.write(3, 0x03); // 8N1
        a.serial.enqueue_raw_bytes(b"hi").unwrap();
        let saved = a.save();
        let mut b = Console::new(ConsoleOut::new(Box::new(std::io::sink())));
        b.restore(&saved).unwrap();
        assert_eq!(b.save(), saved);
        assert_eq!(b.read(7), 0x5a);
        assert!(b.restore(&saved[..4]).is_err());
    }
}
