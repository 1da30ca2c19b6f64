//! The frame decoder: a byte stream as a peer would send it (preamble,
//! then frames with length and CRC), and every main-channel message's payload
//! decoder, reached directly (random bytes rarely carry a valid CRC).
#![no_main]

use ferry_engine::wire::{FrameKind, FrameStream, Message, Replay};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte: which frame kind the rest is a payload of.
    if let Some((&kind, payload)) = data.split_first() {
        if let Some(kind) = FrameKind::from_u8(kind) {
            let _ = Message::decode(kind, payload, 0);
        }
    }
    // The whole input as a stream.
    let mut stream = FrameStream::new(Replay::new(data.to_vec()));
    if stream.read_preamble().is_err() {
        return;
    }
    for _ in 0..64 {
        match stream.read_frame_or_end() {
            Ok(Some((kind, offset))) => {
                let _ = Message::decode(kind, stream.payload(), offset);
            }
            _ => break,
        }
    }
});
