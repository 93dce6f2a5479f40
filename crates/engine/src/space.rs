//! Layer 5: space. The segment table (status, live counts, ages, pins), the reserve and
//! watermarks that say how much free space is kept for whom, and the shared-block table
//! of deduplication's reference counts (`space::shared`).

pub(crate) mod pacing;
pub mod shared;

use crate::layout::geometry::Geometry;
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
    /// What refers to it, in units of [`crate::index::map::Mapping::live_units`]: a whole
    /// block counts [`Geometry::live_units_per_block`] (1, or 16 on volumes with packed
    /// fragments, where a fragment counts its sixteenths), a zero or trim record 1. Every
    /// reference adds and later removes the same amount, so it is 0 exactly when nothing
    /// refers to the segment.
    pub live_units: u64,
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
    /// The generation of the latest checkpoint snapshot taken when it last stopped being
    /// a stream's current segment (0: none). Mount follows streams through the segments
    /// they used after the committed checkpoint's snapshot, so the segment is not released
    /// until a checkpoint of a later generation is committed ("Segment reuse").
    pub left_at_generation: u64,
}

impl SegmentUse {
    /// Filled and now less than half live: a checkpoint rewrites the pages it holds, so
    /// that a metadata segment empties out.
    pub(crate) fn is_mostly_dead(&self, geometry: &Geometry) -> bool {
        self.status == SegmentStatus::Used
            && self.live_units * 2 < geometry.blocks_per_segment() * geometry.live_units_per_block()
    }

    /// A segment entering a new use at recovery, as its first batch (written at clock
    /// `write_clock`) is replayed: live units already counted for it stay.
    pub(crate) fn recovered(live_units: u64, write_clock: u64) -> SegmentUse {
        SegmentUse { live_units, opened_clock: write_clock, ..SegmentUse::FREE }
    }

    /// Recovery replays a batch of the segment: it is used, by the batch's stream, at
    /// least as old as the batch's clock, and sealed through the batch's rows.
    pub(crate) fn note_batch(&mut self, header: &crate::layout::format::BatchHeader) {
        self.status = SegmentStatus::Used;
        self.stream = header.stream;
        self.opened_clock = self.opened_clock.min(header.write_clock);
        self.age_clock = self.age_clock.max(header.write_clock);
        self.sealed_rows = self.sealed_rows.max(header.first_row + header.row_count);
    }

    pub(crate) const FREE: SegmentUse = SegmentUse {
        live_units: 0,
        status: SegmentStatus::Free,
        age_clock: 0,
        opened_clock: 0,
        stream: 0,
        pinned: false,
        sealed_rows: 0,
        left_at_generation: 0,
    };
}

/// Where checkpoints stand, kept with the segment table (the reuse rule needs both).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CheckpointGenerations {
    /// The latest snapshot taken (its checkpoint may still be being written).
    pub snapshot: u64,
    /// The latest checkpoint the superblocks name (0: none; mount scans every segment).
    pub committed: u64,
}

impl CheckpointGenerations {
    /// Whether a segment that left its stream at `left_at_generation` may be reused: no
    /// committed checkpoint's walk can pass through it.
    pub(crate) fn allows_reuse(&self, left_at_generation: u64) -> bool {
        left_at_generation == 0 || self.committed > left_at_generation
    }
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
    let pages = index_pages
        + table_pages
        + shared_pages
        + directory_pages(index_pages)
        + directory_pages(table_pages)
        + directory_pages(shared_pages)
        + 1;
    // Four kinds of page (index, segment table, directories, root), six with a shared
    // table (its pages and directory), at least one batch each, each ending in a padded row.
    let batches: u64 = if geometry.shared_blocks { 6 } else { 4 };
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
/// `stripelog create` warns about it
/// (docs/garbage-collection.md).
pub fn working_spare_segments(geometry: &Geometry) -> u64 {
    (CLEANING_RESERVE_SEGMENTS
        + checkpoint_headroom_segments(geometry)
        + RECORDS_ROOM_SEGMENTS
        + 2 * crate::log::STREAM_COUNT
        + MINIMUM_WON_SEGMENTS) as u64
}

/// Every segment's use, and the free ones in the order they will be taken.
pub(crate) struct SegmentTable {
    pub(crate) segments: Vec<SegmentUse>,
    pub(crate) free_segments: std::collections::VecDeque<u64>,
    pub(crate) checkpoints: CheckpointGenerations,
    /// Free segments only the metadata stream may take ([`checkpoint_headroom_segments`]).
    pub(crate) checkpoint_headroom: usize,
}

impl SegmentTable {
    /// The table as recovered: the free list is every segment whose status is free.
    pub(crate) fn new(
        segments: Vec<SegmentUse>,
        checkpoints: CheckpointGenerations,
        checkpoint_headroom: usize,
    ) -> SegmentTable {
        let free_segments = (0..segments.len() as u64)
            .filter(|&segment| segments[segment as usize].status == SegmentStatus::Free)
            .collect();
        SegmentTable { segments, free_segments, checkpoints, checkpoint_headroom }
    }

    /// Free segments client writes leave alone: the cleaner's reserve and the checkpoint's
    /// headroom.
    pub(crate) fn reserve(&self) -> usize {
        CLEANING_RESERVE_SEGMENTS + self.checkpoint_headroom
    }

    /// Free segments a clients' batch carrying `purpose` leaves alone when it opens a
    /// segment: the reserve, and for client data the room kept for records too.
    pub(crate) fn clients_floor(&self, purpose: Purpose) -> usize {
        self.reserve()
            + match purpose {
                Purpose::Data => RECORDS_ROOM_SEGMENTS,
                Purpose::Records => 0,
            }
    }
}

/// What a client write carries, for the free segments it may take.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Purpose {
    /// Blocks of data (whole, partial, compressed or shared): they take room.
    Data,
    /// Only trim and zero records: they make room (they kill what they replace).
    Records,
}
