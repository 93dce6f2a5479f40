//! Layer 5: space. The segment table (status, live counts, ages, pins), the reserve and
//! watermarks that say how much free space is kept for whom.

use crate::log::RELOCATION_STREAMS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegmentStatus {
    Free,
    /// Receiving batches.
    Current,
    Used,
    /// No live blocks; reusable once the batch with this sequence number is durable.
    WaitingForFlush(u64),
    /// Its head row is being zeroed before it becomes free (one reclaimer owns it).
    Releasing,
    /// Free, and named by a stream's current segment as the segment it goes on in (the
    /// forward link mount follows, docs/index-and-checkpoints.md): taken by that stream
    /// only.
    Reserved,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SegmentUse {
    pub live_blocks: u64,
    pub status: SegmentStatus,
    /// Write clock when a batch was last written into it (its age, for cost-benefit
    /// cleaning: how long its content has been left alone).
    pub age_clock: u64,
    /// Write clock when it became a stream's current segment (its lifespan, once cleaned).
    pub opened_clock: u64,
    /// The stream it was (or is) filled by.
    pub stream: u8,
    /// Holds a live block redundancy cannot rebuild (found by a scrub), or summaries that
    /// cannot be read: never a cleaning victim, since its blocks cannot be moved.
    pub pinned: bool,
    /// Rows its sealed batches occupy (its summaries say what each position holds: the
    /// cleaner reads them up to here).
    pub sealed_rows: u32,
}
/// A round relocates at most this many segments' worth of blocks. Each round ends its
/// relocation batches (one or more per stream, each with a summary and a partly padded
/// last row), so larger rounds waste less space; and each frees its victims only at its
/// end, so larger rounds need a larger reserve.
pub(crate) const ROUND_SEGMENTS: u64 = 2;

/// Free segments only the cleaner may take: it always has room to relocate into. A round
/// fills at most `ROUND_SEGMENTS` segments' worth of blocks into the relocation streams,
/// which opens fewer than `ROUND_SEGMENTS + RELOCATION_STREAMS.len()` new segments.
pub const CLEANING_RESERVE_SEGMENTS: usize = RELOCATION_STREAMS.len() + ROUND_SEGMENTS as usize;

/// (low, high) free-segment watermarks: below low, client writes clean one round per new
/// segment they open; below high, the idle volume cleans in the background.
///
/// Under a steady write load the free count settles at the low watermark, so every free
/// segment it holds above the reserve is spare space the cleaner cannot use: it stays a
/// small constant. The high watermark (reached only when idle) scales with the volume.
pub fn watermarks(segment_count: u64) -> (usize, usize) {
    let segments = segment_count as usize;
    (CLEANING_RESERVE_SEGMENTS + LOW_WATERMARK_ABOVE_RESERVE, CLEANING_RESERVE_SEGMENTS + (segments / 64).max(4))
}

/// Net segments a window of rounds must win (the streams' open segments can hide a few).
pub const MINIMUM_WON_SEGMENTS: usize = 2;

/// Free segments above the reserve at which client writes start cleaning (one round per
/// new segment), so that they rarely reach the reserve and wait for a whole round.
const LOW_WATERMARK_ABOVE_RESERVE: usize = 2;

/// Spare segments below which a full volume cannot clean: the cleaner's reserve, one open
/// and one reserved segment per write stream, and the net room a window of rounds must
/// win. A volume with
/// fewer works until its logical space has been written, then reports ENOSPC; `stripelog
/// create` warns about it (docs/garbage-collection.md).
pub const WORKING_SPARE_SEGMENTS: u64 =
    (CLEANING_RESERVE_SEGMENTS + 2 * (RELOCATION_STREAMS.len() + 1) + MINIMUM_WON_SEGMENTS) as u64;

/// Every segment's use, and the free ones in the order they will be taken.
pub(crate) struct SegmentTable {
    pub(crate) segments: Vec<SegmentUse>,
    pub(crate) free_segments: std::collections::VecDeque<u64>,
}

impl SegmentTable {
    /// The table as recovered: the free list is every segment whose status is free.
    pub(crate) fn new(segments: Vec<SegmentUse>) -> SegmentTable {
        let free_segments = (0..segments.len() as u64)
            .filter(|&segment| segments[segment as usize].status == SegmentStatus::Free)
            .collect();
        SegmentTable { segments, free_segments }
    }
}
