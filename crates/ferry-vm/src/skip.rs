//! A test that cannot run here says so in one `SKIP` line. The test runner
//! hides a passing test's output, so the line also goes to the file named
//! by `FERRY_SKIP_LOG` (the workspace's `.cargo/config.toml` points it at
//! `target/setup/skipped`), which the set-up empties and CI prints: every
//! skip shows, with its reason.

use std::io::Write;

/// Prints `line` and appends it to `$FERRY_SKIP_LOG`, if set.
pub fn record(line: &str) {
    println!("{line}");
    if let Some(path) = std::env::var_os("FERRY_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write per line: lines from tests running at once stay whole.
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// `skip!("SKIP {test}: {why}")`: [`record`] a formatted line.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {
        $crate::skip::record(&format!($($arg)*))
    };
}
