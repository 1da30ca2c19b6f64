//! The checker's console lines: `checker SEQ key=value ... sum=HEX`, one a
//! second, numbered from 1, each closed by a checksum of the text before
//! it, so that a line lost, doubled or garbled across a migration shows.

/// One line's fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Line {
    /// Its number, from 1.
    pub seq: u64,
    /// Pattern generations completed, over all workers.
    pub generations: u64,
    /// Pages written.
    pub pages: u64,
    /// Pages that did not hold what was last written to them.
    pub mismatches: u64,
    /// The largest gap between two CLOCK_MONOTONIC readings in a worker,
    /// since the checker started (ms).
    pub max_gap_ms: f64,
    /// The largest such gap since the line before (ms): a pause shows in
    /// the line after it.
    pub gap_ms: f64,
    /// Disk records written and acknowledged.
    pub disk_writes: u64,
    /// Disk records read back that did not hold what was written.
    pub disk_bad_reads: u64,
    /// Kernel log lines that were warnings (see [`crate::warnings`]),
    /// logged since the checker started.
    pub warnings: u64,
    /// The guest's CLOCK_MONOTONIC when the line was made, in ms since
    /// the checker started: against the host's time of its arrival, it
    /// shows how far the guest's clock fell behind across a move (a VMM
    /// that stops the kvmclock for part of the pause hides that part from
    /// the gaps above).
    pub clock_ms: f64,
    /// The longest gaps since the line before ([`NOTED_GAPS`] at most,
    /// each at least [`NOTED_GAP_MS`]), in the order they ended: where a
    /// host knows when it paused the guest, it picks out the gap that
    /// spans its pause from those of a throttle just before it.
    pub gaps: Vec<Gap>,
}

/// One gap between two readings of the clock, on the scale of
/// [`Line::clock_ms`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gap {
    /// When the gap ended (the clock's reading after it), in ms since the
    /// checker started.
    pub end_ms: f64,
    /// How long it was, in ms.
    pub ms: f64,
}

impl Gap {
    /// When it began.
    pub fn start_ms(&self) -> f64 {
        self.end_ms - self.ms
    }
}

/// The most gaps a line lists.
pub const NOTED_GAPS: usize = 16;
/// The shortest gap a line lists, in ms: longer than a guest's scheduler
/// tick, so that a worker merely sharing its CPU is not listed.
pub const NOTED_GAP_MS: f64 = 20.0;

/// FNV-1a, 64 bits: the line checksum.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

impl Line {
    /// The line as printed (without its newline).
    pub fn format(&self) -> String {
        let body = format!(
            "checker {} gen={} pages={} mismatches={} max_gap_ms={:.1} gap_ms={:.1} disk_writes={} disk_bad_reads={} warnings={} clock_ms={:.1}",
            self.seq,
            self.generations,
            self.pages,
            self.mismatches,
            self.max_gap_ms,
            self.gap_ms,
            self.disk_writes,
            self.disk_bad_reads,
            self.warnings,
            self.clock_ms
        );
        let body = match self.gaps.is_empty() {
            true => body,
            false => {
                let gaps: Vec<String> = self
                    .gaps
                    .iter()
                    .map(|g| format!("{:.1}:{:.1}", g.end_ms, g.ms))
                    .collect();
                format!("{body} gaps={}", gaps.join(","))
            }
        };
        format!("{body} sum={:016x}", fnv(&body))
    }

    /// Reads a console line: `None` if it is not a checker line at all
    /// (the kernel's, the init script's), `Some(Err)` if it is one that is
    /// damaged.
    pub fn parse(text: &str) -> Option<Result<Line, String>> {
        let text = text.trim_end_matches(['\r', '\n']);
        let rest = text.strip_prefix("checker ")?;
        if !rest.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        Some(Self::parse_fields(text, rest))
    }

    fn parse_fields(text: &str, rest: &str) -> Result<Line, String> {
        let (body, sum) = text
            .rsplit_once(" sum=")
            .ok_or_else(|| format!("no checksum: {text:?}"))?;
        let sum = u64::from_str_radix(sum, 16).map_err(|_| format!("bad checksum: {text:?}"))?;
        if sum != fnv(body) {
            return Err(format!("checksum mismatch: {text:?}"));
        }
        let mut words = rest.split(' ');
        let seq = words.next().and_then(|w| w.parse().ok());
        let mut line = Line {
            seq: seq.ok_or_else(|| format!("no number: {text:?}"))?,
            ..Line::default()
        };
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                continue;
            };
            let int = || v.parse::<u64>().unwrap_or(0);
            let float = || v.parse::<f64>().unwrap_or(0.0);
            match k {
                "gen" => line.generations = int(),
                "pages" => line.pages = int(),
                "mismatches" => line.mismatches = int(),
                "max_gap_ms" => line.max_gap_ms = float(),
                "gap_ms" => line.gap_ms = float(),
                "disk_writes" => line.disk_writes = int(),
                "disk_bad_reads" => line.disk_bad_reads = int(),
                "warnings" => line.warnings = int(),
                "clock_ms" => line.clock_ms = float(),
                "gaps" => line.gaps = parse_gaps(v).ok_or_else(|| format!("bad gaps: {text:?}"))?,
                _ => {}
            }
        }
        Ok(line)
    }
}

/// `END:MS,END:MS`.
fn parse_gaps(v: &str) -> Option<Vec<Gap>> {
    v.split(',')
        .map(|g| {
            let (end, ms) = g.split_once(':')?;
            Some(Gap {
                end_ms: end.parse().ok()?,
                ms: ms.parse().ok()?,
            })
        })
        .collect()
}

/// The prefix of a kernel warning the checker passes on to the console,
/// one logged while it ran.
pub const WARNING_PREFIX: &str = "checker-warning: ";
/// The prefix of one the kernel logged while it booted, before the
/// checker started.
pub const BOOT_WARNING_PREFIX: &str = "checker-boot-warning: ";
/// The checker's last line, before it powers the guest off.
pub const DONE_PREFIX: &str = "checker done ";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_round_trips_and_a_damaged_one_is_caught() {
        let l = Line {
            seq: 12,
            generations: 3,
            pages: 4096,
            gap_ms: 250.5,
            disk_writes: 77,
            clock_ms: 12345.5,
            ..Line::default()
        };
        let text = l.format();
        assert_eq!(Line::parse(&text), Some(Ok(l)));
        let damaged = text.replacen("pages=4096", "pages=4097", 1);
        assert!(matches!(Line::parse(&damaged), Some(Err(_))));
        assert!(matches!(Line::parse(&text[..text.len() - 3]), Some(Err(_))));
        assert_eq!(Line::parse("[    1.0] checker: nothing"), None);
        assert_eq!(Line::parse("checker start: 2 threads"), None);
    }

    #[test]
    fn a_line_lists_its_gaps_and_a_line_without_them_still_reads() {
        let gap = |end_ms, ms| Gap { end_ms, ms };
        let l = Line {
            seq: 41,
            gap_ms: 325.0,
            clock_ms: 51229.8,
            gaps: vec![gap(50110.5, 325.0), gap(50400.0, 96.5)],
            ..Line::default()
        };
        let text = l.format();
        assert!(
            text.contains(" gaps=50110.5:325.0,50400.0:96.5 sum="),
            "{text}"
        );
        assert_eq!(Line::parse(&text), Some(Ok(l.clone())));
        assert_eq!(l.gaps[0].start_ms(), 49785.5);
        let none = Line {
            gaps: Vec::new(),
            ..l
        };
        assert!(!none.format().contains("gaps="));
        assert_eq!(Line::parse(&none.format()), Some(Ok(none)));
        let bad = "checker 1 gaps=12:x";
        let bad = format!("{bad} sum={:016x}", fnv(bad));
        assert!(matches!(Line::parse(&bad), Some(Err(_))));
    }
}
