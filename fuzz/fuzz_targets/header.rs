//! The stream header: the JSON a source sends first, checked against what
//! a destination expects.
#![no_main]

use ferry_engine::wire::{ExpectedVm, StreamHeader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = StreamHeader::decode(data) else {
        return;
    };
    let _ = header.pages();
    let expect = ExpectedVm {
        memory_bytes: Some(64 << 20),
        vcpus: Some(2),
        vmm: Some("ferry-soft".into()),
    };
    let _ = header.check_expected(&expect);
    let _ = StreamHeader::decode(&header.encode());
});
