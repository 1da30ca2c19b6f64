//! The control socket's parser: one line, in ferry's dialect or QMP's.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    let _ = ferry_control::parse(&line);
});
