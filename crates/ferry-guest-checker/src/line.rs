//! The checker's console lines: `checker SEQ key=value ... sum=HEX`, one a
//! second, numbered from 1, each closed by a checksum of the text before
//! it, so that a line lost, doubled or garbled across a migration shows.
//!
//! A line is short on purpose. Every byte a guest sends through a 16550 is
//! a VM exit, and Linux sends a line from its serial interrupt in one
//! burst, so the vCPU that takes the interrupt stalls for the whole line.
//! Inside the SVM host a 300-400-byte line cost about 440 exits, and most
//! of the guest's longest stalls began as one was printed: a stall that
//! adds to the pause of a move it coincides with. Hence short keys, whole
//! milliseconds, counters that are zero left out, and gaps given relative
//! to the line's clock.

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

/// The most gaps a line lists: the longest of its second. Inside the SVM
/// host the gap that spanned a move's pause was the longest, second or
/// third longest of its line's in each of 11 runs (ferry's and QEMU's);
/// each one listed costs a line some 8 bytes.
pub const NOTED_GAPS: usize = 8;
/// The shortest gap a line lists, in ms: longer than a guest's scheduler
/// tick, so that a worker merely sharing its CPU is not listed.
pub const NOTED_GAP_MS: f64 = 20.0;

/// FNV-1a, 64 bits folded to 32: the line checksum (a garbled line is
/// what it must catch, not a forged one).
fn fnv(text: &str) -> u32 {
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h ^ (h >> 32)) as u32
}

/// Whole milliseconds, as a line prints them.
fn ms(v: f64) -> i64 {
    v.round() as i64
}

impl Line {
    /// The line as printed (without its newline): counters that are zero
    /// are left out, and each gap is `AGO:MS`, where AGO is how long
    /// before the line's clock it ended.
    pub fn format(&self) -> String {
        let mut body = format!(
            "checker {} gen={} pages={} max={} gap={} disk={} clock={}",
            self.seq,
            self.generations,
            self.pages,
            ms(self.max_gap_ms),
            ms(self.gap_ms),
            self.disk_writes,
            ms(self.clock_ms)
        );
        for (key, v) in [
            ("mis", self.mismatches),
            ("bad", self.disk_bad_reads),
            ("warn", self.warnings),
        ] {
            if v != 0 {
                body += &format!(" {key}={v}");
            }
        }
        if !self.gaps.is_empty() {
            let clock = ms(self.clock_ms);
            let gaps: Vec<String> = self
                .gaps
                .iter()
                .map(|g| format!("{}:{}", clock - ms(g.end_ms), ms(g.ms)))
                .collect();
            body += &format!(" gaps={}", gaps.join(","));
        }
        format!("{body} sum={:08x}", fnv(&body))
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
        let sum = u32::from_str_radix(sum, 16).map_err(|_| format!("bad checksum: {text:?}"))?;
        if sum != fnv(body) {
            return Err(format!("checksum mismatch: {text:?}"));
        }
        let mut words = rest.split(' ');
        let seq = words.next().and_then(|w| w.parse().ok());
        let mut line = Line {
            seq: seq.ok_or_else(|| format!("no number: {text:?}"))?,
            ..Line::default()
        };
        let mut gaps = None;
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                continue;
            };
            let int = || v.parse::<u64>().unwrap_or(0);
            let float = || v.parse::<f64>().unwrap_or(0.0);
            match k {
                "gen" => line.generations = int(),
                "pages" => line.pages = int(),
                "mis" => line.mismatches = int(),
                "max" => line.max_gap_ms = float(),
                "gap" => line.gap_ms = float(),
                "disk" => line.disk_writes = int(),
                "bad" => line.disk_bad_reads = int(),
                "warn" => line.warnings = int(),
                "clock" => line.clock_ms = float(),
                "gaps" => gaps = Some(v),
                _ => {}
            }
        }
        if let Some(v) = gaps {
            line.gaps =
                parse_gaps(v, line.clock_ms).ok_or_else(|| format!("bad gaps: {text:?}"))?;
        }
        Ok(line)
    }
}

/// `AGO:MS,AGO:MS`, against the line's clock.
fn parse_gaps(v: &str, clock_ms: f64) -> Option<Vec<Gap>> {
    v.split(',')
        .map(|g| {
            let (ago, ms) = g.split_once(':')?;
            Some(Gap {
                end_ms: clock_ms - ago.parse::<f64>().ok()?,
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
            gap_ms: 250.0,
            disk_writes: 77,
            clock_ms: 12345.0,
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
    fn counters_that_are_zero_are_left_out_and_the_rest_read_back() {
        let quiet = Line {
            seq: 5,
            ..Line::default()
        };
        let text = quiet.format();
        for key in ["mis=", "bad=", "warn=", "gaps="] {
            assert!(!text.contains(key), "{text}");
        }
        let loud = Line {
            mismatches: 3,
            disk_bad_reads: 2,
            warnings: 1,
            ..quiet
        };
        let text = loud.format();
        assert!(text.contains(" mis=3 bad=2 warn=1 sum="), "{text}");
        assert_eq!(Line::parse(&text), Some(Ok(loud)));
    }

    #[test]
    fn a_line_lists_its_gaps_and_a_line_without_them_still_reads() {
        let gap = |end_ms, ms| Gap { end_ms, ms };
        let l = Line {
            seq: 41,
            gap_ms: 325.0,
            clock_ms: 51230.0,
            gaps: vec![gap(50110.0, 325.0), gap(50400.0, 97.0)],
            ..Line::default()
        };
        let text = l.format();
        assert!(text.contains(" gaps=1120:325,830:97 sum="), "{text}");
        assert_eq!(Line::parse(&text), Some(Ok(l.clone())));
        assert_eq!(l.gaps[0].start_ms(), 49785.0);
        let none = Line {
            gaps: Vec::new(),
            ..l
        };
        assert!(!none.format().contains("gaps="));
        assert_eq!(Line::parse(&none.format()), Some(Ok(none)));
        let bad = "checker 1 gaps=12:x";
        let bad = format!("{bad} sum={:08x}", fnv(bad));
        assert!(matches!(Line::parse(&bad), Some(Err(_))));
    }

    #[test]
    fn times_are_whole_milliseconds_and_a_gap_may_end_after_the_clock() {
        let l = Line {
            seq: 2,
            max_gap_ms: 96.6,
            clock_ms: 2000.4,
            gaps: vec![Gap {
                end_ms: 2001.2,
                ms: 96.6,
            }],
            ..Line::default()
        };
        let read = Line::parse(&l.format()).and_then(Result::ok);
        let read = read.expect("the line reads back");
        assert_eq!((read.max_gap_ms, read.clock_ms), (97.0, 2000.0));
        assert_eq!(
            read.gaps,
            vec![Gap {
                end_ms: 2001.0,
                ms: 97.0
            }]
        );
    }

    /// A busy guest's line at its longest: a day's counters and every
    /// gap listed (under the format before this one, an ordinary line in
    /// the SVM host took 349 bytes, the median of run o1's).
    #[test]
    fn a_full_line_stays_short() {
        let l = Line {
            seq: 86_400,
            generations: 9_999_999,
            pages: 999_999_999,
            max_gap_ms: 2_695.0,
            gap_ms: 1_336.0,
            disk_writes: 4_320_000,
            clock_ms: 86_400_000.0,
            gaps: (0..NOTED_GAPS)
                .map(|i| Gap {
                    end_ms: 86_399_000.0 + 60.0 * i as f64,
                    ms: 125.0,
                })
                .collect(),
            ..Line::default()
        };
        let text = l.format();
        assert!(text.len() <= 190, "{} bytes: {text}", text.len());
    }
}
