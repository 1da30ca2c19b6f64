//! Stall detection: precopy is stuck when the bytes it still has to send
//! stop shrinking.
//!
//! "Shrinking" means reaching a new low at least 5% under the best seen so
//! far: a guest dirtying at the link's rate leaves the remainder wobbling
//! around one level for ever, and without this the engine would loop to
//! the round cap and then stop with a long downtime.

/// Rounds without a new low before precopy counts as stalled.
pub const STALL_ROUNDS: u32 = 3;

/// Watches the remaining bytes round by round.
#[derive(Debug, Default)]
pub struct Stall {
    best: Option<u64>,
    flat: u32,
}

impl Stall {
    /// Records a round's remaining bytes; true when precopy has stalled
    /// (then the count starts over, so each escalation gets
    /// `STALL_ROUNDS` rounds to work).
    pub fn observe(&mut self, remaining: u64) -> bool {
        match self.best {
            Some(best) if remaining.saturating_mul(20) > best.saturating_mul(19) => {
                self.flat += 1;
            }
            _ => {
                self.best = Some(remaining);
                self.flat = 0;
            }
        }
        if self.flat >= STALL_ROUNDS {
            self.flat = 0;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_remainders_stall_every_k_rounds_and_progress_resets() {
        let mut s = Stall::default();
        assert!(!s.observe(1000));
        assert!(!s.observe(990)); // within 5%: flat
        assert!(!s.observe(1010));
        assert!(s.observe(1000), "three flat rounds");
        assert!(!s.observe(1000));
        assert!(!s.observe(900), "a new low");
        assert!(!s.observe(899));
        assert!(!s.observe(901));
        assert!(s.observe(899));
    }
}
