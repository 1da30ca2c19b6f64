//! Pre-order iteration over the tables, as the TDP MMU's `tdp_iter`.
//!
//! Zap, walk-based write-protect and eager split all walk the tree with this
//! one iterator. With [`Iteration::PresentOnly`] (the iterator seed) a step
//! jumps from one present entry to the next through the table's present
//! bitmap, so a run of empty entries costs one bit scan instead of one loop
//! step per entry. With [`Iteration::FullScan`] (the baseline) every entry of
//! every visited table is a step. Either way `steps` counts loop iterations,
//! the number the seed reports (9216 become 303 for 18 tables).
//!
//! The caller must hold the MMU lock exclusively, or otherwise ensure no table
//! reachable from `root` is freed during the walk.

use crate::config::Iteration;
use crate::pte::{self, ENTRIES};
use crate::table::{Arena, Table};
use ferry_vm::bitmap::ones;
use std::sync::atomic::Ordering;

/// What the visitor wants after seeing an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Descend into the entry if it (still) points to a table above `min_level`.
    Descend,
    /// Do not descend.
    Skip,
}

/// One visited entry.
pub struct Visit<'a> {
    /// The table holding the entry.
    pub table: &'a Table,
    /// Index of the entry in its table.
    pub index: usize,
    /// Level of the table.
    pub level: u8,
    /// First frame the entry covers.
    pub gfn: u64,
    /// Entry value when visited.
    pub entry: u64,
}

/// A walk over the tables under one root.
pub struct Walker<'a> {
    arena: &'a Arena,
    mode: Iteration,
    /// Loop steps taken.
    pub steps: u64,
    /// Tables entered.
    pub tables: u64,
    /// Steps that found a non-present entry (always 0 in present-only mode).
    pub empty_steps: u64,
}

impl<'a> Walker<'a> {
    /// A walker over `arena` in `mode`.
    pub fn new(arena: &'a Arena, mode: Iteration) -> Self {
        Walker {
            arena,
            mode,
            steps: 0,
            tables: 0,
            empty_steps: 0,
        }
    }

    /// Visits, in pre-order, every entry (present entries only, or all, per the
    /// mode) at levels `>= min_level` covering frames in `start..end`, starting
    /// from table `root`.
    pub fn walk(
        &mut self,
        root: u32,
        min_level: u8,
        start: u64,
        end: u64,
        visit: &mut dyn FnMut(&Visit<'_>) -> Next,
    ) {
        self.walk_table(root, min_level, start, end, visit);
    }

    fn walk_table(
        &mut self,
        t: u32,
        min_level: u8,
        start: u64,
        end: u64,
        visit: &mut dyn FnMut(&Visit<'_>) -> Next,
    ) {
        let table = self.arena.get(t);
        let level = table.level();
        let base = table.base_gfn();
        let span = pte::frames_per_entry(level);
        let table_end = base + span * ENTRIES as u64;
        if end <= base || start >= table_end {
            return;
        }
        self.tables += 1;
        let first = (start.max(base) - base) / span;
        let last = (end.min(table_end) - base).div_ceil(span); // exclusive
        match self.mode {
            Iteration::FullScan => {
                for i in first as usize..last as usize {
                    self.step(table, i, level, base, span, min_level, start, end, visit);
                }
            }
            Iteration::PresentOnly => {
                for w in (first / 64) as usize..(last as usize).div_ceil(64) {
                    for i in ones(w, table.present_word(w)) {
                        if (i as u64) < first || (i as u64) >= last {
                            continue;
                        }
                        self.step(table, i, level, base, span, min_level, start, end, visit);
                    }
                }
            }
        }
    }

    /// One loop step: entry `i` of `table`. A present entry is visited (and
    /// descended into if asked); a non-present one only counts as an empty
    /// step, which present-only iteration never takes.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        table: &Table,
        i: usize,
        level: u8,
        base: u64,
        span: u64,
        min_level: u8,
        start: u64,
        end: u64,
        visit: &mut dyn FnMut(&Visit<'_>) -> Next,
    ) {
        self.steps += 1;
        let entry = table.entries[i].load(Ordering::Acquire);
        if !pte::is_present(entry) {
            self.empty_steps += 1;
            return;
        }
        let v = Visit {
            table,
            index: i,
            level,
            gfn: base + i as u64 * span,
            entry,
        };
        if visit(&v) == Next::Descend && level > min_level {
            let now = table.entries[i].load(Ordering::Acquire);
            if pte::is_present(now) && !pte::is_leaf(now, level) {
                self.walk_table(pte::child(now), min_level, start, end, visit);
            }
        }
    }
}
