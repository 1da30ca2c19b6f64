//! Lines for a slow sink (stderr), written by a thread of their own.
//!
//! Why: the engine calls its progress observer on the migrating thread,
//! in the downtime too (the final round's `round_finished`), and says the
//! observer must be quick. A write to stderr can block for milliseconds:
//! inside the SVM host stderr is a file on 9p without a cache, a round
//! trip to the outer QEMU for every line, 2-4 ms each on one CPU. So the
//! observer hands its line over and returns; the thread writes it.

use std::io::Write;
use std::sync::mpsc::{channel, Sender};
use std::thread::JoinHandle;

/// A sink's writer thread. Dropping it writes every line handed over,
/// in order, before it returns.
pub struct LineLog {
    lines: Option<Sender<String>>,
    writer: Option<JoinHandle<()>>,
}

impl LineLog {
    /// Lines to this process's stderr.
    pub fn stderr() -> LineLog {
        LineLog::to(std::io::stderr())
    }

    /// Lines to `sink`, each flushed as it is written. A sink that fails
    /// loses the lines after it, not the migration.
    pub fn to(mut sink: impl Write + Send + 'static) -> LineLog {
        let (lines, rx) = channel::<String>();
        let writer = std::thread::Builder::new()
            .name("minivmm-log".into())
            .spawn(move || {
                for line in rx {
                    if writeln!(sink, "{line}").and_then(|_| sink.flush()).is_err() {
                        return;
                    }
                }
            })
            .ok();
        LineLog {
            // Without its thread (one could not start), the lines go
            // nowhere rather than stall the caller.
            lines: writer.as_ref().map(|_| lines),
            writer,
        }
    }

    /// Hands `line` to the writer; never waits for it.
    pub fn line(&self, line: String) {
        if let Some(lines) = &self.lines {
            let _ = lines.send(line);
        }
    }
}

impl Drop for LineLog {
    fn drop(&mut self) {
        self.lines = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier, Mutex};

    /// A sink that blocks its first write until the test lets it go.
    struct Gated {
        gate: Arc<Barrier>,
        opened: bool,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if !self.opened {
                self.gate.wait();
                self.opened = true;
            }
            self.out.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_is_handed_over_while_the_sink_blocks_and_written_in_order_by_the_drop() {
        let gate = Arc::new(Barrier::new(2));
        let out = Arc::new(Mutex::new(Vec::new()));
        let log = LineLog::to(Gated {
            gate: Arc::clone(&gate),
            opened: false,
            out: Arc::clone(&out),
        });
        // The writer thread is stuck in the sink's first write: were the
        // lines written on this thread, the first call would never return.
        for i in 0..3 {
            log.line(format!("round {i}"));
        }
        assert!(out.lock().unwrap().is_empty());
        gate.wait();
        drop(log);
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "round 0\nround 1\nround 2\n");
    }
}
