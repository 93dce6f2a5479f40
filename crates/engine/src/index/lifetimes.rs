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

/// Client blocks per region of [`WriteRates`], at least: 1 MiB of 4 KiB blocks.
const RATE_REGION_BLOCKS_MINIMUM: u64 = 256;
/// Regions of [`WriteRates`], at most: 4 MiB of counts, whatever the volume's size.
const RATE_REGIONS_MAXIMUM: u64 = 1 << 20;
/// A region written at less than `1 / COLD_RATE_DIVISOR` of the mean rate per region is
/// cold.
const COLD_RATE_DIVISOR: u64 = 2;
/// Counts are trusted once the regions have seen this many writes each, on average.
const WRITES_PER_REGION_TRUSTED: u64 = 64;

/// Which client writes are cold (docs/garbage-collection.md, "Streams"): a decayed count
/// of client writes per region of the logical space, halved each time the clients have
/// written half the logical size. A write goes to the cold stream when its region is
/// written at less than half the mean rate: data that lives long where it is, spread
/// over regions that are seldom written, is told apart by where it lives. Nothing is
/// kept per block; at most 4 MiB for any volume, rebuilt from nothing at each open.
pub(crate) struct WriteRates {
    region_shift: u32,
    counts: Vec<u32>,
    total: u64,
    writes_since_decay: u64,
    decay_after_writes: u64,
}

impl WriteRates {
    pub(crate) fn new(logical_blocks: u64) -> WriteRates {
        let region_blocks =
            logical_blocks.div_ceil(RATE_REGIONS_MAXIMUM).next_power_of_two().max(RATE_REGION_BLOCKS_MINIMUM);
        let region_shift = region_blocks.trailing_zeros();
        let regions = logical_blocks.div_ceil(region_blocks).max(1);
        WriteRates {
            region_shift,
            counts: vec![0; regions as usize],
            total: 0,
            writes_since_decay: 0,
            decay_after_writes: (logical_blocks / 2).max(1),
        }
    }

    fn region(&self, logical_block: u64) -> usize {
        ((logical_block >> self.region_shift) as usize).min(self.counts.len() - 1)
    }

    /// Count a client write of `logical_block`.
    pub(crate) fn record(&mut self, logical_block: u64) {
        let region = self.region(logical_block);
        self.counts[region] = self.counts[region].saturating_add(1);
        self.total += 1;
        self.writes_since_decay += 1;
        if self.writes_since_decay >= self.decay_after_writes {
            self.writes_since_decay = 0;
            self.total = 0;
            for count in &mut self.counts {
                *count /= 2;
                self.total += *count as u64;
            }
        }
    }

    /// Whether a write of `logical_block` is cold: its region is written at less than
    /// half the mean rate, and the counts are trusted.
    pub(crate) fn is_cold(&self, logical_block: u64) -> bool {
        let region = self.region(logical_block);
        let regions = self.counts.len() as u64;
        self.total >= regions * WRITES_PER_REGION_TRUSTED
            && self.counts[region] as u64 * regions * COLD_RATE_DIVISOR < self.total
    }
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

    #[test]
    fn regions_written_seldom_are_cold_and_uniform_writes_are_never() {
        let logical_blocks = 256 * 100;
        let mut prng = stripelog_blockdev::Prng::new(7);
        // 80 % of the writes to the first 20 % of the blocks.
        let mut rates = WriteRates::new(logical_blocks);
        let (mut hot_called_cold, mut cold_called_cold, mut cold_writes) = (0u64, 0u64, 0u64);
        for write in 0..20 * logical_blocks {
            let hot = prng.below(100) < 80;
            let block = if hot {
                prng.below(logical_blocks / 5)
            } else {
                logical_blocks / 5 + prng.below(logical_blocks * 4 / 5)
            };
            let cold = rates.is_cold(block);
            rates.record(block);
            if write >= 4 * logical_blocks {
                if hot {
                    hot_called_cold += cold as u64;
                } else {
                    cold_writes += 1;
                    cold_called_cold += cold as u64;
                }
            }
        }
        assert_eq!(hot_called_cold, 0);
        assert!(cold_called_cold * 100 >= cold_writes * 99, "{cold_called_cold} of {cold_writes}");
        // Uniform writes: no region stands out once a logical size has been written.
        let mut rates = WriteRates::new(logical_blocks);
        let cold = (0..20 * logical_blocks)
            .filter(|&write| {
                let block = prng.below(logical_blocks);
                let cold = rates.is_cold(block);
                rates.record(block);
                cold && write >= logical_blocks
            })
            .count();
        assert_eq!(cold, 0);
        // Nothing is called cold before the counts are trusted; the last region may be short.
        let mut rates = WriteRates::new(logical_blocks + 3);
        rates.record(logical_blocks + 2);
        assert!(!rates.is_cold(logical_blocks + 2));
        assert_eq!(rates.counts.len(), 101);
    }
}
