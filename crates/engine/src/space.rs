//! Layer 5: space. The segment table (status, live counts, ages, pins), the reserve and
//! watermarks that say how much free space is kept for whom, and the shared-block table
//! of deduplication's reference counts (`space::shared`).

pub(crate) mod pacing;
mod segments;
pub mod shared;
pub(crate) mod signals;

pub(crate) use segments::{CheckpointGenerations, SegmentStatus, SegmentTable, SegmentUse};

use crate::layout::geometry::Geometry;
use crate::log::RELOCATION_STREAMS;

/// A round relocates at most this many segments' worth of blocks. Each round ends its
/// relocation batches (one or more per stream, each with a summary and a partly padded
/// last row), so larger rounds waste less space; and each frees its victims only at its
/// end, so larger rounds need a larger reserve.
pub(crate) const ROUND_SEGMENTS: u64 = 2;

/// Free segments only the cleaner may take: it always has room to relocate into. A round
/// fills at most `ROUND_SEGMENTS` segments' worth of blocks into the relocation streams,
/// which opens fewer than `ROUND_SEGMENTS + RELOCATION_STREAMS.len()` new segments.
pub const CLEANING_RESERVE_SEGMENTS: usize = RELOCATION_STREAMS.len() + ROUND_SEGMENTS as usize;

/// Free segments above the cleaner's reserve that client data never takes: room for a
/// batch of trim and zero records on a physically full volume, the only writes that can
/// make room there (docs/garbage-collection.md, "A physically full volume").
pub const RECORDS_ROOM_SEGMENTS: usize = 1;

/// (low, high) free-segment watermarks: below low, client writes clean one round per new
/// segment they open; below high, the idle volume cleans in the background. Both are
/// counted from the clients' floor (the reserve and the room kept for records).
///
/// Under a steady write load the free count settles at the low watermark, so every free
/// segment it holds above the reserve is spare space the cleaner cannot use: it stays a
/// small constant. The high watermark (reached only when idle) scales with the volume.
pub fn watermarks(geometry: &Geometry) -> (usize, usize) {
    let segments = geometry.segment_count() as usize;
    let floor = CLEANING_RESERVE_SEGMENTS + checkpoint_headroom_segments(geometry) + RECORDS_ROOM_SEGMENTS;
    (floor + LOW_WATERMARK_ABOVE_FLOOR, floor + (segments / 64).max(4))
}

/// Free segments below which the cleaner thread of a threaded volume runs its rounds back
/// to back: the low watermark, or the top of the window where client writes are paced
/// (`pacing`), whichever is higher — clients are never slowed while the cleaner rests.
pub(crate) fn cleaner_thread_threshold(low_watermark: usize, reserve: usize, pacing_window: usize) -> usize {
    low_watermark.max(reserve + pacing_window)
}

/// Free segments only the checkpoint may take: room for one that rewrites every index,
/// segment table and directory page the volume can have, with the summaries and padding
/// of its batches, plus one for a current segment with little room left. The segments a
/// stream leaves come free only once a checkpoint is committed (docs/index-and-
/// checkpoints.md, "Segment reuse"), so a full volume must always be able to write one.
/// About 0.1 % of the capacity (the index's own size) on a large volume.
pub fn checkpoint_headroom_segments(geometry: &Geometry) -> usize {
    use crate::layout::checkpoint::{DIRECTORY_FANOUT, INDEX_PAGE_PAYLOAD_BYTES, SEGMENT_RECORDS_PER_PAGE};
    let entries_per_page = (INDEX_PAGE_PAYLOAD_BYTES as u64 * 8) / u64::from(geometry.index_entry_width_bits()).max(1);
    let index_pages = geometry.logical_block_count().div_ceil(entries_per_page.max(1));
    let table_pages = geometry.segment_count().div_ceil(SEGMENT_RECORDS_PER_PAGE as u64);
    let directory_pages = |leaves: u64| {
        let (mut level, mut pages) = (leaves, 1);
        while level > 1 {
            level = level.div_ceil(DIRECTORY_FANOUT as u64);
            pages += level;
        }
        pages
    };
    let shared_pages = crate::index::directory::shared_table_page_count(geometry);
    let name_pages = crate::index::directory::name_table_pages_per_checkpoint(geometry);
    let pages = index_pages
        + table_pages
        + shared_pages
        + directory_pages(index_pages)
        + directory_pages(table_pages)
        + directory_pages(shared_pages)
        + name_pages
        + directory_pages(name_pages)
        + 1;
    // Four kinds of page (index, segment table, directories, root), seven with
    // deduplication (the shared table's pages, the name index's, their directories), at
    // least one batch each, each ending in a padded row.
    let batches: u64 = if geometry.shared_blocks { 7 } else { 4 };
    let summaries = pages.div_ceil(crate::layout::format::ENTRIES_PER_SUMMARY as u64) + batches;
    let padding = batches * geometry.data_columns() as u64;
    let blocks = pages + summaries + padding;
    blocks.div_ceil(geometry.blocks_per_segment()) as usize + 1
}

/// Net segments a window of rounds must win (the streams' open segments can hide a few).
pub const MINIMUM_WON_SEGMENTS: usize = 2;

/// Free segments above the clients' floor at which client writes start cleaning (one
/// round per new segment), so that they rarely reach the reserve and wait for a whole
/// round.
const LOW_WATERMARK_ABOVE_FLOOR: usize = 2;

/// Spare segments below which a full volume cannot clean: the cleaner's reserve, the
/// checkpoint's headroom, the room kept for trim and zero records, one open and one
/// reserved segment per stream, and the net room a window of rounds must win. A volume
/// with fewer works until its logical space has been written, then reports ENOSPC;
/// `stripelog create` raises its default spare to leave this room, and refuses a spare
/// asked for that does not unless forced (docs/garbage-collection.md,
/// docs/operations.md).
pub fn working_spare_segments(geometry: &Geometry) -> u64 {
    (CLEANING_RESERVE_SEGMENTS
        + checkpoint_headroom_segments(geometry)
        + RECORDS_ROOM_SEGMENTS
        + 2 * crate::log::STREAM_COUNT
        + MINIMUM_WON_SEGMENTS) as u64
}

/// What a client write carries, for the free segments it may take.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Purpose {
    /// Blocks of data (whole, partial, compressed or shared): they take room.
    Data,
    /// Only trim and zero records: they make room (they kill what they replace).
    Records,
}
