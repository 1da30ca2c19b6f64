//! Running a Linux guest from the command line: waiting for its checker
//! to start, telling it that it moved, and running it until it powers off.

use ferry_engine::vmm::Vm;
use minivmm::linux::PowerRequest;
use minivmm::MiniVm;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Waits until the checker has printed `lines` numbered lines on the
/// console file `console` (vCPU 0's), so that a migration moves a guest
/// that runs its checks, not one still booting.
pub fn wait_for_checker(
    vm: &MiniVm,
    console: Option<&Path>,
    lines: u64,
    limit: Duration,
) -> Result<Duration, String> {
    let start = Instant::now();
    let Some(console) = console else {
        return Err(
            "--guest linux needs --console FILE: the checker's lines are read there".into(),
        );
    };
    loop {
        vm.check_health().map_err(|e| e.to_string())?;
        if let Some(exit) = vm.guest_exit() {
            return Err(format!("the guest ended ({exit:?}) before its checker ran"));
        }
        let text = std::fs::read_to_string(console).unwrap_or_default();
        if let Some(line) = panic_line(&text) {
            return Err(format!(
                "the guest's kernel panicked before its checker ran: {line}"
            ));
        }
        let seen = minivmm::checks::linux_console(&text).lines.lines;
        if seen >= lines {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= limit {
            return Err(format!(
                "the guest's checker printed {seen} of {lines} lines within {} s of boot",
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the guest until it powers off (or asks for another sleep state),
/// a vCPU stops, its kernel panics (its line on `console`, vCPU 0's
/// console file), or `limit` passes (`None`). A panicked kernel may never
/// exit (`panic=0` spins), so its line on the console is what ends it.
pub fn run_until_exit(
    vm: &MiniVm,
    console: Option<&Path>,
    limit: Duration,
) -> Result<Option<PowerRequest>, String> {
    let start = Instant::now();
    let mut watch = PanicWatch::new(console);
    loop {
        if let Some(exit) = vm.guest_exit() {
            return Ok(Some(exit));
        }
        vm.check_health().map_err(|e| e.to_string())?;
        if let Some(line) = watch.panicked() {
            return Err(format!("the guest's kernel panicked: {line}"));
        }
        if start.elapsed() >= limit {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Watches a console file for the kernel's panic line, reading only what
/// was appended since the last look.
pub struct PanicWatch {
    path: Option<PathBuf>,
    read: u64,
    /// The last line, while it has no end yet.
    partial: String,
}

/// What Linux prints as it panics (`panic()`), whatever the cause.
pub const PANIC_LINE: &str = "Kernel panic - not syncing";

/// The kernel's panic line in console text, if it panicked.
pub fn panic_line(text: &str) -> Option<&str> {
    text.lines().find(|l| l.contains(PANIC_LINE)).map(str::trim)
}

impl PanicWatch {
    pub fn new(console: Option<&Path>) -> Self {
        PanicWatch {
            path: console.map(Path::to_path_buf),
            read: 0,
            partial: String::new(),
        }
    }

    /// The panic line, once the console shows one.
    pub fn panicked(&mut self) -> Option<String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(self.path.as_ref()?).ok()?;
        file.seek(SeekFrom::Start(self.read)).ok()?;
        let mut new = Vec::new();
        self.read += file.read_to_end(&mut new).ok()? as u64;
        self.partial.push_str(&String::from_utf8_lossy(&new));
        let found = panic_line(&self.partial).map(String::from);
        let keep = self.partial.rfind('\n').map_or(0, |i| i + 1);
        self.partial.drain(..keep);
        found
    }
}

/// How the summary names a guest's end.
pub fn exit_name(exit: Option<PowerRequest>) -> Option<String> {
    exit.map(|e| match e {
        PowerRequest::Off => "poweroff".to_string(),
        PowerRequest::Other(s) => format!("sleep state S{s}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_panic_watch_finds_a_panic_line_written_in_pieces() {
        let dir = std::env::temp_dir().join(format!("minivmm-panic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("console");
        let mut f = std::fs::File::create(&path).unwrap();
        let mut watch = PanicWatch::new(Some(&path));
        writeln!(f, "checker 1 ...").unwrap();
        assert_eq!(watch.panicked(), None);
        write!(f, "[ 41.2] Kernel panic - not sy").unwrap();
        assert_eq!(watch.panicked(), None, "half a line");
        writeln!(f, "ncing: sysrq triggered crash").unwrap();
        assert_eq!(
            watch.panicked().as_deref(),
            Some("[ 41.2] Kernel panic - not syncing: sysrq triggered crash")
        );
        assert_eq!(PanicWatch::new(None).panicked(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
