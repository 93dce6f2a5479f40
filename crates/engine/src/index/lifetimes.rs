//! What the cleaner knows of each logical block's life: when the client last wrote it,
//! and how long its previous version lived (docs/garbage-collection.md).

/// Memory per logical block for `Lifetimes::write_times` and `previous_lifetimes`.
pub(crate) const LIFETIME_BYTES_PER_BLOCK: u64 = (std::mem::size_of::<u32>() + std::mem::size_of::<u8>()) as u64;

/// Granularity of `Lifetimes::write_times`: a `u32` of these wraps after 256 TiB written.
pub(crate) const WRITE_CLOCK_UNIT_BLOCKS: u64 = 16;
/// The write clock at open: blocks written before the open look 2^31 units old.
pub(crate) const WRITE_CLOCK_AT_OPEN: u64 = (1 << 31) * WRITE_CLOCK_UNIT_BLOCKS;

pub(crate) struct Lifetimes {
    /// Client records accepted so far (the clock lifetimes and ages are measured in). It
    /// starts far from zero at every open, so that blocks written before count as old.
    pub(crate) write_clock: u64,
    /// Per logical block: the write clock of its last client write, in units of
    /// `WRITE_CLOCK_UNIT_BLOCKS`, wrapping (in memory only; 4 bytes per block).
    pub(crate) write_times: Vec<u32>,
    /// Per logical block: how long its previous version lived before the client
    /// overwrote it, as `u32::BITS - leading_zeros(units)` (`u8::MAX`: never overwritten).
    /// A short previous life predicts a short next one (SepBIT).
    pub(crate) previous_lifetimes: Vec<u8>,
}

impl Lifetimes {
    pub(crate) fn new(logical_blocks: u64) -> Lifetimes {
        Lifetimes {
            write_clock: WRITE_CLOCK_AT_OPEN,
            write_times: vec![0; logical_blocks as usize],
            previous_lifetimes: vec![u8::MAX; logical_blocks as usize],
        }
    }

    /// Blocks written by clients since `logical_block`'s last client write.
    pub(crate) fn block_age(&self, logical_block: u64) -> u64 {
        let now = (self.write_clock / WRITE_CLOCK_UNIT_BLOCKS) as u32;
        now.wrapping_sub(self.write_times[logical_block as usize]) as u64 * WRITE_CLOCK_UNIT_BLOCKS
    }
}
