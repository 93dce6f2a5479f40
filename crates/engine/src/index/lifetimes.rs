//! What the cleaner knows of blocks' lives, without a byte of RAM per block: the write
//! clock, and the lifetime classes that summaries carry next to the data
//! (docs/index-and-checkpoints.md, decision 2; docs/garbage-collection.md).
//!
//! When a client overwrites a block, the life of the old version is taken as the time
//! since its segment was opened (for a relocation segment: the oldest clock of the blocks
//! it holds): longer than the truth by at most the time the segment took to fill. Its
//! class goes into the new version's summary entry; the batch's header carries the clock
//! it was sealed at. The cleaner reads both from its victims' summaries.

use crate::layout::format::LIFETIME_CLASS_UNKNOWN;

/// The write clock of a new volume. Clocks below it are not known (summary version 1,
/// or a segment never opened): such blocks count as old.
pub(crate) const WRITE_CLOCK_ORIGIN: u64 = 1 << 35;

/// Lifetimes are classed in units of this many client blocks.
pub(crate) const WRITE_CLOCK_UNIT_BLOCKS: u64 = 16;

/// The largest class used: longer lives are as good as never overwritten.
const LIFETIME_CLASS_LONGEST: u8 = 60;

/// The write clock: client records accepted since the volume was created (from
/// `WRITE_CLOCK_ORIGIN`), the clock lifetimes and ages are measured in.
pub(crate) struct Lifetimes {
    pub(crate) write_clock: u64,
}

impl Lifetimes {
    pub(crate) fn new(write_clock: u64) -> Lifetimes {
        Lifetimes { write_clock: write_clock.max(WRITE_CLOCK_ORIGIN) }
    }

    /// The class of a version written when its segment's clock said `written_clock` and
    /// overwritten now: `⌈log2⌉` of its life in units (`LIFETIME_CLASS_UNKNOWN` when the
    /// clock is not known).
    pub(crate) fn class_since(&self, written_clock: u64) -> u8 {
        if written_clock < WRITE_CLOCK_ORIGIN {
            return LIFETIME_CLASS_UNKNOWN;
        }
        let units = self.write_clock.saturating_sub(written_clock) / WRITE_CLOCK_UNIT_BLOCKS;
        ((u64::BITS - units.leading_zeros()) as u8).min(LIFETIME_CLASS_LONGEST)
    }

    /// Client blocks written since `written_clock` (`u64::MAX` when it is not known).
    pub(crate) fn age_since(&self, written_clock: u64) -> u64 {
        if written_clock < WRITE_CLOCK_ORIGIN {
            return u64::MAX;
        }
        self.write_clock.saturating_sub(written_clock)
    }
}

/// The life a class stands for, in client blocks: 3/4 of its upper bound, the middle of
/// `[2^(c−1), 2^c)` units. `None` for an unknown class.
pub(crate) fn class_length_blocks(class: u8) -> Option<u64> {
    (class <= LIFETIME_CLASS_LONGEST).then(|| (1u64 << class) * 3 / 4 * WRITE_CLOCK_UNIT_BLOCKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_grow_with_the_log_of_a_life() {
        let lifetimes = Lifetimes { write_clock: WRITE_CLOCK_ORIGIN + 1000 * WRITE_CLOCK_UNIT_BLOCKS };
        assert_eq!(lifetimes.class_since(WRITE_CLOCK_ORIGIN + 1000 * WRITE_CLOCK_UNIT_BLOCKS), 0);
        assert_eq!(lifetimes.class_since(WRITE_CLOCK_ORIGIN + 999 * WRITE_CLOCK_UNIT_BLOCKS), 1);
        assert_eq!(lifetimes.class_since(WRITE_CLOCK_ORIGIN), 10, "1000 units: 2^9 ≤ 1000 < 2^10");
        assert_eq!(lifetimes.class_since(0), LIFETIME_CLASS_UNKNOWN);
        assert_eq!(lifetimes.age_since(0), u64::MAX);
        assert_eq!(class_length_blocks(10), Some(768 * WRITE_CLOCK_UNIT_BLOCKS));
        assert_eq!(class_length_blocks(LIFETIME_CLASS_UNKNOWN), None);
    }
}
