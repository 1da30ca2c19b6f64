//! The Sections frame: the devices' state at the switchover; and a
//! LiveSection frame's payload, a chunk of live state. Whatever decodes
//! re-encodes to itself, and the destination's checks refuse with words,
//! never a panic.
#![no_main]

use ferry_engine::wire::sections::{
    check_manifest, check_sections, decode, decode_live, encode, encode_live,
};
use ferry_vm::{SectionId, SectionSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let gpu = SectionId {
        name: "gpu".into(),
        instance: 0,
        version: 1,
    };
    if let Ok((id, chunk)) = decode_live(data, std::slice::from_ref(&gpu)) {
        assert_eq!(id, gpu);
        assert_eq!(encode_live(&id, chunk), data);
    }
    let Ok(sections) = decode(data) else {
        return;
    };
    assert_eq!(decode(&encode(&sections)).ok().as_ref(), Some(&sections));
    let specs = [
        SectionSpec::new("serial", 2, 1).with_subsection("fifo"),
        SectionSpec::new("virtio-blk", 1, 1).with_instances(vec![0, 1]),
    ];
    let announced: Vec<_> = sections.iter().map(|s| s.id.clone()).collect();
    let _ = check_manifest(&announced, &specs);
    let _ = check_sections(&sections, &announced, &specs);
});
