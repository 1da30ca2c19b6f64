//! A relay that records every byte of a real migration, and the frames in
//! a recording: the fuzz seed corpora and the wire fixtures are both taken
//! from such recordings.

use ferry_engine::wire::{FrameKind, FrameStream, Replay};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// Every byte stream seen, two per connection in the order the connections
/// were accepted: what the source sent on it, then what the destination
/// answered.
pub type Recorded = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// Relays connections to `target`, recording each direction; returns the
/// relay's address and the recording.
pub fn recording_relay(target: String) -> (String, Recorded) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let recorded: Recorded = Arc::default();
    let rec = Arc::clone(&recorded);
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            let pairs = [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ];
            for (mut from, mut to) in pairs {
                let log: Arc<Mutex<Vec<u8>>> = Arc::default();
                rec.lock().unwrap().push(Arc::clone(&log));
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        log.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = to.shutdown(Shutdown::Write);
                });
            }
        }
    });
    (addr, recorded)
}

/// The frames of one recorded stream: (kind, payload). A source's streams
/// open with the preamble; the destination's answers may not.
pub fn frames(bytes: &[u8]) -> Vec<(FrameKind, Vec<u8>)> {
    let read = |preamble: bool| {
        let mut stream = FrameStream::new(Replay::new(bytes.to_vec()));
        let mut out = Vec::new();
        if preamble && stream.read_preamble().is_err() {
            return out;
        }
        while let Ok(Some((kind, _))) = stream.read_frame_or_end() {
            out.push((kind, stream.payload().to_vec()));
        }
        out
    };
    let with = read(true);
    if with.is_empty() {
        read(false)
    } else {
        with
    }
}
