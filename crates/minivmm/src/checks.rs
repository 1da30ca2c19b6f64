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
    fn the_disk_journal_finds_gaps_and_repeats() {
        assert_eq!(disk(&[3, 4, 5]).lost + disk(&[3, 4, 5]).doubled, 0);
        let c = disk(&[3, 4, 4, 7]);
        assert_eq!((c.requests, c.doubled, c.lost), (4, 1, 2));
    }
}
