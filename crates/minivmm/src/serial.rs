//! The consoles: a vm-superio 16550 per vCPU (COM1 to COM4), whose output
//! goes to a [`ConsoleOut`], and whose `SerialState` travels as an
//! instance of the `serial` state section. minivmm's own guest polls
//! nothing and takes no interrupt, so its line goes nowhere; a Linux guest's
//! COM1 raises IRQ 4 through an irqfd ([`IrqLine`]).

use crate::DeviceError;
use std::io::Write;
use std::sync::{Arc, Mutex};
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

/// The section's name.
pub const SECTION: &str = "serial";
/// The layout [`Console::save`] writes.
pub const VERSION: u32 = 1;

/// The port's interrupt line: an irqfd on the in-kernel irqchip, or none.
pub struct IrqLine(Option<EventFd>);

impl IrqLine {
    fn try_clone(&self) -> std::io::Result<Self> {
        self.0
            .as_ref()
            .map(EventFd::try_clone)
            .transpose()
            .map(IrqLine)
    }
}

impl Trigger for IrqLine {
    type E = std::io::Error;
    fn trigger(&self) -> Result<(), Self::E> {
        match &self.0 {
            Some(fd) => fd.write(1),
            None => Ok(()),
        }
    }
}

/// Where the console's bytes go, shared with whoever reads them (a file,
/// stdout). Lines are flushed as they end. While held (a destination's
/// guest that runs before the digest's verdict), bytes wait here in order
/// until released; if the guest is discarded instead, they never go out.
#[derive(Clone)]
pub struct ConsoleOut(Arc<Mutex<Sink>>);

struct Sink {
    w: Box<dyn Write + Send>,
    held: Option<Vec<u8>>,
}

impl ConsoleOut {
    /// Output into `w`.
    pub fn new(w: Box<dyn Write + Send>) -> Self {
        ConsoleOut(Arc::new(Mutex::new(Sink { w, held: None })))
    }

    fn sink(&self) -> std::sync::MutexGuard<'_, Sink> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Flushes what has been written.
    pub fn flush(&self) {
        let _ = self.sink().w.flush();
    }

    /// From now on, bytes wait until [`ConsoleOut::release`].
    pub fn hold(&self) {
        self.sink().held.get_or_insert_with(Vec::new);
    }

    /// Writes out what waited, in order, and stops holding.
    pub fn release(&self) -> std::io::Result<()> {
        let mut sink = self.sink();
        if let Some(bytes) = sink.held.take() {
            sink.w.write_all(&bytes)?;
            sink.w.flush()?;
        }
        Ok(())
    }
}

impl Write for ConsoleOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut sink = self.sink();
        if let Some(held) = sink.held.as_mut() {
            held.extend_from_slice(buf);
            return Ok(buf.len());
        }
        let n = sink.w.write(buf)?;
        if buf.contains(&b'\n') {
            sink.w.flush()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let mut sink = self.sink();
        match sink.held {
            Some(_) => Ok(()),
            None => sink.w.flush(),
        }
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
    serial: Serial<IrqLine, NoEvents, ConsoleOut>,
    out: ConsoleOut,
    irq: IrqLine,
}

impl Console {
    /// A fresh port writing to `out`.
    pub fn new(out: ConsoleOut) -> Self {
        Self::with_interrupt(out, None).expect("no eventfd to clone")
    }

    /// A fresh port writing to `out` that raises its interrupt through
    /// `irqfd`.
    pub fn with_interrupt(out: ConsoleOut, irqfd: Option<EventFd>) -> std::io::Result<Self> {
        let irq = IrqLine(irqfd);
        Ok(Console {
            serial: Serial::new(irq.try_clone()?, out.clone()),
            out,
            irq,
        })
    }

    /// Bytes the guest will read from the port (it is told by an
    /// interrupt, where the port has one).
    pub fn input(&mut self, bytes: &[u8]) -> Result<(), DeviceError> {
        self.serial
            .enqueue_raw_bytes(bytes)
            .map(drop)
            .map_err(|e| DeviceError::State {
                section: SECTION,
                why: format!("the receive FIFO: {e:?}"),
            })
    }

    /// A guest `out` to register `offset` (0..8).
    pub fn write(&mut self, offset: u8, value: u8) {
        // A full output sink is the host's problem; the guest goes on.
        let _ = self.serial.write(offset, value);
    }

    /// Where the port's bytes go.
    pub fn out(&self) -> &ConsoleOut {
        &self.out
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
        let bad = |why: String| DeviceError::State {
            section: SECTION,
            why,
        };
        let irq = self
            .irq
            .try_clone()
            .map_err(|e| bad(format!("its interrupt line: {e}")))?;
        self.serial = Serial::from_state(&state, irq, NoEvents, self.out.clone())
            .map_err(|e| bad(format!("{e:?}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn held_bytes_wait_and_go_out_in_order_on_release() {
        let seen = Shared::default();
        let mut out = ConsoleOut::new(Box::new(seen.clone()));
        out.write_all(b"before\n").unwrap();
        out.hold();
        out.write_all(b"while held\n").unwrap();
        Write::flush(&mut out).unwrap();
        assert_eq!(*seen.0.lock().unwrap(), b"before\n");
        out.release().unwrap();
        out.write_all(b"after\n").unwrap();
        assert_eq!(*seen.0.lock().unwrap(), b"before\nwhile held\nafter\n");
    }

    #[test]
    fn bytes_held_by_a_guest_that_is_dropped_never_go_out() {
        let seen = Shared::default();
        {
            let mut out = ConsoleOut::new(Box::new(seen.clone()));
            out.hold();
            out.write_all(b"speculative\n").unwrap();
        }
        assert!(seen.0.lock().unwrap().is_empty());
    }

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
