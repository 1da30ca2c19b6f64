//! What the source believes its link moves: the guest bytes a second it
//! plans rounds and the pause with, learned from transfers large enough to
//! measure, and how many guest bytes a wire byte carries (compression
//! raises it above 1).
//!
//! Kept apart from the source's other state because the rule is subtle and
//! easy to break: a small transfer is swallowed by socket buffers at memory
//! speed, so it must not teach a rate; only a whole round teaches the
//! compression ratio, since a round's first batches are not typical; and
//! the bandwidth cap counts wire bytes, so it admits more guest bytes the
//! better the round compressed.

use std::time::Duration;

/// Transfers that put less than this on the wire do not update the
/// estimate: a socket buffer swallows them at memory speed, and an idle
/// guest's full pass is almost all zero-page bits.
pub(crate) const MIN_MEASURED_BYTES: u64 = 4 << 20;
/// Guest bytes a second assumed until a transfer could be measured:
/// 1 Gbit/s.
pub(crate) const NOMINAL_BYTES_PER_SEC: f64 = 125e6;

/// What part of a round moved, for measuring the link.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Transfer {
    /// Guest bytes handed to the senders.
    pub(crate) raw: u64,
    /// Bytes the data connections carried.
    pub(crate) wire: u64,
    pub(crate) secs: f64,
    /// A whole round (else the part sent so far).
    pub(crate) whole_round: bool,
}

/// The link as the source has measured it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LinkEstimate {
    /// Guest bytes a second in the last transfer large enough to measure.
    measured: Option<f64>,
    /// Guest bytes per wire byte in the last whole round measured.
    expansion: f64,
}

impl Default for LinkEstimate {
    fn default() -> Self {
        LinkEstimate {
            measured: None,
            expansion: 1.0,
        }
    }
}

impl LinkEstimate {
    /// Learns from `transfer` when it carried enough to be measured.
    pub(crate) fn learn(&mut self, transfer: Transfer) {
        if transfer.wire < MIN_MEASURED_BYTES {
            return;
        }
        if transfer.whole_round {
            self.expansion = (transfer.raw as f64 / transfer.wire as f64).max(1.0);
        }
        // Wire bytes, not the bytes handed to the senders: early in a round
        // those run ahead of the link by the senders' queues.
        self.measured = Some(transfer.wire as f64 * self.expansion / transfer.secs.max(1e-9));
    }

    /// Guest bytes a second to plan with: the last measured rate, else
    /// [`NOMINAL_BYTES_PER_SEC`]; never above `cap` wire bytes a second
    /// (0: none) times the compression ratio.
    pub(crate) fn guest_rate(&self, cap: u64) -> f64 {
        let bw = self.measured.unwrap_or(NOMINAL_BYTES_PER_SEC);
        match cap {
            0 => bw,
            cap => bw.min(cap as f64 * self.expansion),
        }
    }

    /// Wire bytes a second the link moves, as last measured.
    pub(crate) fn wire_rate(&self) -> f64 {
        self.measured.unwrap_or(NOMINAL_BYTES_PER_SEC) / self.expansion
    }

    /// The guest bytes that `wire` bytes carry, at the last round's ratio.
    pub(crate) fn guest_bytes(&self, wire: u64) -> u64 {
        (wire as f64 * self.expansion) as u64
    }

    /// How long `queued` wire bytes take to drain, at most `max`.
    pub(crate) fn drain_time(&self, queued: u64, max: Duration) -> Duration {
        let secs = queued as f64 / self.wire_rate().max(1.0);
        Duration::from_secs_f64(secs.min(max.as_secs_f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(raw: u64, wire: u64, secs: f64, whole_round: bool) -> Transfer {
        Transfer {
            raw,
            wire,
            secs,
            whole_round,
        }
    }

    #[test]
    fn before_any_measurement_the_nominal_rate_is_planned_within_the_cap() {
        let e = LinkEstimate::default();
        assert_eq!(e.guest_rate(0), NOMINAL_BYTES_PER_SEC);
        assert_eq!(e.guest_rate(10 << 20), (10 << 20) as f64);
        assert_eq!(e.wire_rate(), NOMINAL_BYTES_PER_SEC);
    }

    #[test]
    fn a_transfer_too_small_to_measure_teaches_nothing() {
        let mut e = LinkEstimate::default();
        e.learn(transfer(64 << 20, MIN_MEASURED_BYTES - 1, 0.001, true));
        assert_eq!(e, LinkEstimate::default());
    }

    #[test]
    fn a_whole_round_teaches_the_ratio_and_the_cap_admits_more_guest_bytes() {
        let mut e = LinkEstimate::default();
        // 64 MiB of guest memory went out as 16 MiB in 1 s: 4x compression.
        e.learn(transfer(64 << 20, 16 << 20, 1.0, true));
        assert_eq!(e.guest_rate(0), (64 << 20) as f64);
        assert_eq!(e.wire_rate(), (16 << 20) as f64);
        // A cap of 8 MiB/s of wire admits 32 MiB/s of guest memory.
        assert_eq!(e.guest_rate(8 << 20), (32 << 20) as f64);
        assert_eq!(e.guest_bytes(1 << 20), 4 << 20);
    }

    #[test]
    fn a_part_of_a_round_teaches_the_rate_at_the_last_whole_rounds_ratio() {
        let mut e = LinkEstimate::default();
        e.learn(transfer(64 << 20, 16 << 20, 1.0, true));
        // The first batches of the next round compressed 8x: not typical,
        // so the ratio stays 4x and only the rate is learned.
        e.learn(transfer(128 << 20, 16 << 20, 2.0, false));
        assert_eq!(e.guest_rate(0), (32 << 20) as f64);
        assert_eq!(e.guest_bytes(1), 4);
    }

    #[test]
    fn incompressible_data_never_counts_as_less_than_it_is() {
        let mut e = LinkEstimate::default();
        // Framing makes the wire carry more than the guest bytes.
        e.learn(transfer(16 << 20, 17 << 20, 1.0, true));
        assert_eq!(e.guest_bytes(100), 100);
    }

    #[test]
    fn draining_takes_the_queue_over_the_wire_rate_at_most_the_limit() {
        let mut e = LinkEstimate::default();
        e.learn(transfer(8 << 20, 8 << 20, 1.0, true));
        let max = Duration::from_secs(1);
        assert_eq!(e.drain_time(4 << 20, max), Duration::from_millis(500));
        assert_eq!(e.drain_time(64 << 20, max), max);
    }
}
