//! The streams a migration must not break, read from both ends:
//!
//! - **console**: the source's output, then the destination's, put
//!   together, must hold the guest's numbered lines each exactly once and
//!   in order (a line cut by the switchover is finished by the
//!   destination);
//! - **disk**: the write sequence numbers the source's device served, then
//!   the destination's, must hold each number exactly once, in order.

use crate::layout::CHECK_MUL;
use serde::Serialize;

/// What the console streams show.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConsoleCheck {
    /// Well-formed lines.
    pub lines: u64,
    /// Numbers missing between the first line and the last.
    pub lost: u64,
    /// Lines whose number came again.
    pub doubled: u64,
    /// Lines that are not `L<16 hex> <16 hex>` with the right check, or
    /// that go backwards.
    pub bad: u64,
}

impl ConsoleCheck {
    /// Adds another stream's counts (another vCPU's console).
    pub fn add(&mut self, other: &ConsoleCheck) {
        self.lines += other.lines;
        self.lost += other.lost;
        self.doubled += other.doubled;
        self.bad += other.bad;
    }
}

/// Reads the guest's console `text` (the source's output followed by the
/// destination's); a last line without its newline is still being
/// written and is not counted.
pub fn console(text: &str) -> ConsoleCheck {
    let mut c = ConsoleCheck::default();
    let mut last: Option<u64> = None;
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    for line in complete.lines() {
        let Some(seq) = parse_line(line) else {
            c.bad += 1;
            continue;
        };
        c.lines += 1;
        match last {
            Some(prev) if seq == prev => c.doubled += 1,
            Some(prev) if seq < prev => c.bad += 1,
            Some(prev) => c.lost += seq - prev - 1,
            None => {}
        }
        last = Some(last.map_or(seq, |p| p.max(seq)));
    }
    c
}

fn parse_line(line: &str) -> Option<u64> {
    let rest = line.strip_prefix('L')?;
    let (seq, check) = rest.split_once(' ')?;
    if seq.len() != 16 || check.len() != 16 {
        return None;
    }
    let seq = u64::from_str_radix(seq, 16).ok()?;
    let check = u64::from_str_radix(check, 16).ok()?;
    (check == seq.wrapping_mul(CHECK_MUL)).then_some(seq)
}

/// What the disk journals show.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiskCheck {
    /// Writes served.
    pub requests: u64,
    /// Numbers missing between the first write served and the last.
    pub lost: u64,
    /// Writes served twice.
    pub doubled: u64,
}

impl DiskCheck {
    /// Adds another disk's counts.
    pub fn add(&mut self, other: &DiskCheck) {
        self.requests += other.requests;
        self.lost += other.lost;
        self.doubled += other.doubled;
    }
}

/// Reads the write journals, the source's then the destination's.
pub fn disk(journal: &[u64]) -> DiskCheck {
    let mut c = DiskCheck {
        requests: journal.len() as u64,
        ..DiskCheck::default()
    };
    let mut seen = journal.to_vec();
    seen.sort_unstable();
    for w in seen.windows(2) {
        match w[1] - w[0] {
            0 => c.doubled += 1,
            gap => c.lost += gap - 1,
        }
    }
    c
}

/// What a Linux guest's checker printed on both ends' consoles
/// ([`ferry_guest_checker::line`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinuxConsole {
    /// The checker's numbered lines, each exactly once and in order.
    pub lines: ConsoleCheck,
    /// The guest's kernel release, from the checker's first line.
    pub kernel: Option<String>,
    /// The checker's last line (its `done` line, where it printed one).
    pub last: Option<ferry_guest_checker::line::Line>,
    /// Whether the checker printed its `done` line.
    pub done: bool,
    /// Kernel warnings while the checker ran: its `checker-warning:`
    /// lines, and the kernel's own on the console that it did not repeat.
    pub warnings: Vec<String>,
    /// Warnings the kernel logged as it booted, before the checker
    /// started (`checker-boot-warning:`): they come from the machine the
    /// guest was given, not from a migration.
    pub boot_warnings: Vec<String>,
    /// The first checker lines that failed to parse or went backwards,
    /// verbatim: what a failed run shows so its cause can be read.
    pub bad_lines: Vec<String>,
}

/// How many bad lines a [`LinuxConsole`] keeps.
const BAD_LINES_KEPT: usize = 5;

/// Reads a Linux guest's console `text` (the source's output followed by
/// the destination's): the kernel's lines and the init script's are not
/// the checker's and are only read for warnings.
pub fn linux_console(text: &str) -> LinuxConsole {
    use ferry_guest_checker::line::{Line, BOOT_WARNING_PREFIX, DONE_PREFIX, WARNING_PREFIX};
    use ferry_guest_checker::warnings::is_warning;
    let mut out = LinuxConsole::default();
    let c = &mut out.lines;
    let mut last_seq: Option<u64> = None;
    let mut kernel_lines = Vec::new();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    for raw in complete.lines() {
        if let Some(w) = raw.strip_prefix(WARNING_PREFIX) {
            out.warnings.push(w.to_string());
            continue;
        }
        if let Some(w) = raw.strip_prefix(BOOT_WARNING_PREFIX) {
            out.boot_warnings.push(w.to_string());
            continue;
        }
        if let Some(rest) = raw.strip_prefix("checker start:") {
            out.kernel = rest
                .rsplit_once("kernel ")
                .map(|(_, k)| k.trim().to_string());
            continue;
        }
        let mut bad = |c: &mut ConsoleCheck| {
            c.bad += 1;
            if out.bad_lines.len() < BAD_LINES_KEPT {
                out.bad_lines.push(raw.trim_end().to_string());
            }
        };
        if let Some(rest) = raw.strip_prefix(DONE_PREFIX) {
            out.done = true;
            match Line::parse(rest) {
                Some(Ok(l)) => out.last = Some(l),
                _ => bad(c),
            }
            continue;
        }
        match Line::parse(raw) {
            None if is_warning(raw) => kernel_lines.push(raw.trim().to_string()),
            None => {}
            Some(Err(_)) => bad(c),
            Some(Ok(l)) => {
                c.lines += 1;
                match last_seq {
                    Some(prev) if l.seq == prev => c.doubled += 1,
                    Some(prev) if l.seq < prev => bad(c),
                    Some(prev) => c.lost += l.seq - prev - 1,
                    None => {}
                }
                last_seq = Some(last_seq.map_or(l.seq, |p| p.max(l.seq)));
                if !out.done {
                    out.last = Some(l);
                }
            }
        }
    }
    // The kernel's own warning lines count where the checker did not
    // repeat them (it repeats those it read from the kernel log).
    for k in kernel_lines {
        let repeated = out.warnings.iter().chain(&out.boot_warnings);
        if !repeated.into_iter().any(|w| k.ends_with(w.as_str())) {
            out.warnings.push(k);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64) -> String {
        format!("L{seq:016x} {:016x}\n", seq.wrapping_mul(CHECK_MUL))
    }

    #[test]
    fn a_line_cut_by_the_switchover_is_whole_once_both_ends_are_joined() {
        let (a, b) = (line(7), line(8));
        let (head, tail) = b.split_at(10);
        let joined = format!("{a}{head}{tail}{}", line(9));
        assert_eq!(
            console(&joined),
            ConsoleCheck {
                lines: 3,
                ..Default::default()
            }
        );
        // The source's half alone: the cut line is not counted yet.
        assert_eq!(console(&format!("{a}{head}")).lines, 1);
    }

    #[test]
    fn lost_doubled_and_bad_lines_are_counted() {
        let text = format!("{}{}{}{}garbage\n", line(1), line(1), line(4), line(2));
        let c = console(&text);
        assert_eq!((c.lines, c.doubled, c.lost, c.bad), (4, 1, 2, 2));
        let mut forged = line(5);
        forged.replace_range(1..2, "1");
        assert_eq!(console(&forged).bad, 1);
    }

    #[test]
    fn a_linux_console_counts_the_checker_lines_and_the_warnings() {
        use ferry_guest_checker::line::Line;
        let l = |seq| {
            Line {
                seq,
                ..Line::default()
            }
            .format()
                + "\n"
        };
        let src = format!(
            "[    0.1] Linux version\ncheckerstray\nchecker start: 2 threads x 8 MiB, disk none, kernel 6.1.0-56-amd64\n{}{}",
            l(1),
            l(2)
        );
        let dst = format!(
            "{}[   20.0] WARNING: CPU: 1 PID: 9 at x.c:1\nchecker-warning: WARNING: CPU: 1 PID: 9 at x.c:1\n[ 0.1] WARNING: boot\nchecker-boot-warning: WARNING: boot\n{}{}checker done {}",
            l(2),
            l(4),
            l(5),
            l(5)
        );
        let c = linux_console(&(src + &dst));
        assert_eq!(c.kernel.as_deref(), Some("6.1.0-56-amd64"));
        assert_eq!(
            (c.lines.lines, c.lines.doubled, c.lines.lost, c.lines.bad),
            (5, 1, 1, 0)
        );
        assert!(c.done);
        assert_eq!(c.last.map(|l| l.seq), Some(5));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert_eq!(c.boot_warnings, ["WARNING: boot"]);
        // A garbled checker line is bad.
        let garbled = l(1).replace("pages=0", "pages=9");
        assert_eq!(linux_console(&garbled).lines.bad, 1);
        // A line cut by other output is bad, and kept to be read.
        let cut = l(1).replace('\n', "moved\n");
        let c = linux_console(&cut);
        assert_eq!(c.lines.bad, 1);
        assert_eq!(c.bad_lines, [cut.trim_end()]);
    }

    #[test]
    fn the_disk_journal_finds_gaps_and_repeats() {
        assert_eq!(disk(&[3, 4, 5]).lost + disk(&[3, 4, 5]).doubled, 0);
        let c = disk(&[3, 4, 4, 7]);
        assert_eq!((c.requests, c.doubled, c.lost), (4, 1, 2));
    }
}
