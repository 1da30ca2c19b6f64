//! The stream decoder against hostile input: random bytes, bit flips and
//! truncation give errors, never panics or huge allocations.

use ferry_engine::wire::{
    decode_batch, FrameKind, FrameStream, Message, PageBatch, Replay, StreamError, StreamHeader,
};
use ferry_vm::Gfn;
use proptest::prelude::*;
use std::io::Cursor;

/// Everything a destination would do with these bytes, until the first error.
fn consume(bytes: Vec<u8>) -> Result<(), StreamError> {
    let mut io = FrameStream::new(Replay::new(bytes));
    io.read_preamble()?;
    loop {
        let (kind, offset) = io.read_frame()?;
        match kind {
            FrameKind::Header => {
                let _ = StreamHeader::decode(io.payload());
            }
            FrameKind::Pages => {
                let _ = decode_batch(io.payload(), 1 << 20);
            }
            FrameKind::VcpuState => {}
            k => {
                Message::decode(k, io.payload(), offset)?;
            }
        }
    }
}

fn valid_stream() -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = FrameStream::new(Cursor::new(&mut out));
    w.write_preamble().unwrap();
    w.write_frame(FrameKind::Header, &[b"{\"x\":1}"]).unwrap();
    let mut batch = PageBatch::new(4);
    batch.push_run(Gfn(3), 2).fill(7);
    batch.push_run(Gfn(9), 1).fill(0);
    batch.seal(0);
    w.write_frame(FrameKind::Pages, &batch.parts()).unwrap();
    let m = Message::Resumed { resume_ns: 5 };
    w.write_frame(m.kind(), &[&m.encode()]).unwrap();
    w.flush().unwrap();
    drop(w);
    out
}

fn with_preamble(mut tail: Vec<u8>) -> Vec<u8> {
    let mut v = valid_stream()[..16].to_vec();
    v.append(&mut tail);
    v
}

#[test]
fn valid_stream_decodes_to_the_end() {
    let err = consume(valid_stream()).unwrap_err();
    assert!(
        matches!(
            err,
            StreamError::Truncated {
                what: "a frame header",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn oversized_length_field_is_refused_without_allocating() {
    let mut tail = vec![3u8, 0, 0, 0];
    tail.extend_from_slice(&0xffff_fff0u32.to_le_bytes());
    tail.extend_from_slice(&[0; 4]);
    let err = consume(with_preamble(tail)).unwrap_err();
    assert!(
        matches!(err, StreamError::TooLong { offset: 16, .. }),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = consume(bytes.clone());
        let _ = consume(with_preamble(bytes));
    }

    #[test]
    fn any_flipped_bit_after_the_preamble_is_caught(bit in 16usize * 8..valid_stream().len() * 8) {
        let mut bytes = valid_stream();
        bytes[bit / 8] ^= 1 << (bit % 8);
        let err = consume(bytes).unwrap_err();
        let caught = matches!(
            err,
            StreamError::Checksum { .. } | StreamError::TooLong { .. }
        ) || matches!(err, StreamError::Truncated { what: "a frame payload", .. });
        prop_assert!(caught, "bit {}: {}", bit, err);
    }

    #[test]
    fn any_truncation_is_an_error(cut in 0usize..valid_stream().len()) {
        let bytes = valid_stream()[..cut].to_vec();
        let err = consume(bytes).unwrap_err();
        prop_assert!(matches!(err, StreamError::Truncated { .. }), "cut {}: {}", cut, err);
    }
}
