//! The page-batch decoders: a Pages payload (runs, zero bitmap, data), a
//! Delta payload and its apply, and a compressed payload. The first 8
//! bytes give the guest's size in pages, the 9th the frame flags.
#![no_main]

use ferry_engine::wire::{compress, decode_batch, delta};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let total_pages = u64::from_le_bytes(data[..8].try_into().unwrap_or([0; 8]));
    let flags = data[8];
    let payload = &data[9..];
    if let Ok(batch) = decode_batch(payload, total_pages) {
        let mut pages = 0u64;
        let _ = batch.visit(|segment| {
            let (first, n) = segment.range();
            assert!(first.0 + n <= total_pages, "a segment outside the guest");
            pages += n;
            Ok::<(), ()>(())
        });
        assert_eq!(pages, batch.pages() as u64);
    }
    if let Ok(view) = delta::decode_delta(payload, total_pages) {
        let mut page = vec![0u8; 4096];
        for (gfn, d) in view.entries() {
            assert!(gfn.0 < total_pages, "a delta outside the guest");
            let _ = delta::apply(&mut page, d);
        }
    }
    let mut out = Vec::new();
    let _ = compress::decompress(flags, payload, &mut out);
});
