//! Waiting for another thread in the MMU: spin briefly, then yield.
//!
//! Every wait in the soft MMU (a table lock, the MMU lock, a flush
//! acknowledgement) may be on a thread the host has descheduled, since there
//! can be more vCPU threads than cores. Spinning alone would then burn the
//! timeslice that thread needs, so every `yield_every`-th turn yields.

/// One turn of a wait loop; `spins` counts the turns so far.
#[inline]
pub(crate) fn back_off(spins: &mut u32, yield_every: u32) {
    *spins += 1;
    if spins.is_multiple_of(yield_every) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}
