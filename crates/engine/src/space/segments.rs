//! The segment table: every segment's use (status, live units, ages, pin) and the free
//! list, changed only through [`SegmentTable`]'s methods. A segment's life is a state
//! machine and [`SegmentTable::transition`] is its only door:
//!
//! ```text
//!            ┌──────────── reserve_successor ──────────┐
//!            │                                          ▼
//!   Free ────┴── take_free_as_current ──▶ Current ◀── Reserved
//!    ▲                                    │    │
//!    │                    leave_current   │    │ leave_current (nothing live)
//!    │                    (something live)▼    ▼
//!    │                                  Used ──▶ WaitingForFlush(k) ──▶ Releasing ──┘
//!    │                                  (last unit dies)   (k durable, reuse rule)    │
//!    └────────────────────────────────── finish_release (head row zeroed) ◀──────────┘
//! ```
//!
//! Every transition asserts that it is legal and that the live count agrees with it (a
//! segment leaves `Current` for `Used` only with something live, for `WaitingForFlush`
//! and beyond only with nothing); live counts never wrap.

use crate::layout::checkpoint::{SegmentRecord, SEGMENT_RECORDS_PER_PAGE};
use crate::layout::format::BatchHeader;
use crate::layout::geometry::Geometry;
use std::collections::{BTreeSet, VecDeque};

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

impl SegmentStatus {
    /// The status a checkpoint's segment table records (docs/on-disk-format.md, "Segment
    /// table page (entry kind 6)"):
    /// 0 free, 1 used, 2 current, 3 waiting for its death to be durable, 4 reserved.
    fn code(self) -> u8 {
        match self {
            SegmentStatus::Free => 0,
            SegmentStatus::Used => 1,
            SegmentStatus::Current => 2,
            SegmentStatus::WaitingForFlush(_) | SegmentStatus::Releasing => 3,
            SegmentStatus::Reserved => 4,
        }
    }

    /// Whether a segment in this status may hold live units.
    fn may_hold_live_units(self) -> bool {
        match self {
            SegmentStatus::Current | SegmentStatus::Used => true,
            SegmentStatus::Free
            | SegmentStatus::Reserved
            | SegmentStatus::WaitingForFlush(_)
            | SegmentStatus::Releasing => false,
        }
    }
}

/// One segment's use. Its fields change only through [`SegmentTable`] (and, while mount
/// builds the table, through the recovery methods below).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentUse {
    /// What refers to it, in units of [`crate::index::map::Mapping::live_units`]: a whole
    /// block counts [`Geometry::live_units_per_block`] (1, or 16 on volumes with packed
    /// fragments, where a fragment counts its sixteenths), a zero or trim record 1, a
    /// shared copy one block whatever its references, a checkpoint block one block while
    /// the committed checkpoint (or the one being written) names it. Every reference adds
    /// and later removes the same amount, so it is 0 exactly when nothing refers to the
    /// segment.
    live_units: u64,
    status: SegmentStatus,
    /// Write clock when a batch was last written into it (its age, for cost-benefit
    /// cleaning: how long its content has been left alone).
    age_clock: u64,
    /// Write clock when it became a stream's current segment (its lifespan, once cleaned).
    opened_clock: u64,
    /// The stream it was (or is) filled by.
    stream: u8,
    /// Holds a live block redundancy cannot rebuild (found by a scrub), or summaries that
    /// cannot be read: never a cleaning victim, since its blocks cannot be moved.
    pinned: bool,
    /// Rows its sealed batches occupy (its summaries say what each position holds: the
    /// cleaner reads them up to here).
    sealed_rows: u32,
    /// The generation of the latest checkpoint snapshot taken when it last stopped being
    /// a stream's current segment (0: none). Mount follows streams through the segments
    /// they used after the committed checkpoint's snapshot, so the segment is not released
    /// until a checkpoint of a later generation is committed ("Segment reuse").
    left_at_generation: u64,
}

impl SegmentUse {
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

    pub(crate) fn live_units(&self) -> u64 {
        self.live_units
    }

    pub(crate) fn status(&self) -> SegmentStatus {
        self.status
    }

    pub(crate) fn age_clock(&self) -> u64 {
        self.age_clock
    }

    pub(crate) fn opened_clock(&self) -> u64 {
        self.opened_clock
    }

    pub(crate) fn stream(&self) -> usize {
        self.stream as usize
    }

    pub(crate) fn pinned(&self) -> bool {
        self.pinned
    }

    pub(crate) fn sealed_rows(&self) -> u32 {
        self.sealed_rows
    }

    /// Filled and now less than half live: a checkpoint rewrites the pages it holds, so
    /// that a metadata segment empties out.
    pub(crate) fn is_mostly_dead(&self, geometry: &Geometry) -> bool {
        self.status == SegmentStatus::Used
            && self.live_units * 2 < geometry.blocks_per_segment() * geometry.live_units_per_block()
    }

    /// The record a checkpoint's segment table stores for it.
    pub(crate) fn record(&self) -> SegmentRecord {
        SegmentRecord {
            live_units: self.live_units.min(u32::MAX as u64) as u32,
            status: self.status.code(),
            stream: self.stream,
            pinned: self.pinned,
            age_clock: self.age_clock,
            opened_clock: self.opened_clock,
            sealed_rows: self.sealed_rows,
        }
    }

    // Recovery: mount builds every use from what it finds before the table exists;
    // `SegmentTable::new` checks the result.

    /// The use a checkpoint's record says (free and reserved segments were free then).
    pub(crate) fn from_record(record: &SegmentRecord, rows_per_chunk: u32) -> SegmentUse {
        SegmentUse {
            live_units: record.live_units as u64,
            status: if matches!(record.status, 0 | 4) { SegmentStatus::Free } else { SegmentStatus::Used },
            age_clock: record.age_clock,
            opened_clock: record.opened_clock,
            stream: record.stream,
            pinned: record.pinned,
            sealed_rows: record.sealed_rows.min(rows_per_chunk),
            left_at_generation: 0,
        }
    }

    /// A segment entering a new use at recovery, as its first batch (written at clock
    /// `write_clock`) is replayed: nothing of its older use is live.
    pub(crate) fn recovered(write_clock: u64) -> SegmentUse {
        SegmentUse { opened_clock: write_clock, ..SegmentUse::FREE }
    }

    /// Recovery replays a batch of the segment: it is used, by the batch's stream, at
    /// least as old as the batch's clock, and sealed through the batch's rows.
    pub(crate) fn note_batch(&mut self, header: &BatchHeader) {
        assert!(
            matches!(self.status, SegmentStatus::Free | SegmentStatus::Used),
            "recovery replays batches only into free and used segments ({:?})",
            self.status
        );
        assert!(header.row_count > 0, "a replayed batch was checked to fit its segment");
        self.status = SegmentStatus::Used;
        self.stream = header.stream;
        self.opened_clock = self.opened_clock.min(header.write_clock);
        self.age_clock = self.age_clock.max(header.write_clock);
        self.sealed_rows = self.sealed_rows.max(header.first_row + header.row_count);
    }

    /// Recovery: `units` more live units.
    pub(crate) fn add_recovered_units(&mut self, units: u64) {
        self.live_units += units;
    }

    /// Recovery: `units` live units died. Saturating, as media input: a count replayed from
    /// a checkpoint's table may lack what an older use of the segment held.
    pub(crate) fn remove_recovered_units(&mut self, units: u64) {
        self.live_units = self.live_units.saturating_sub(units);
    }

    /// Recovery: the checkpoint blocks of a metadata segment are counted afresh from what
    /// the committed checkpoint names.
    pub(crate) fn forget_checkpoint_blocks(&mut self, metadata_stream: usize) {
        assert!(
            matches!(self.status, SegmentStatus::Free | SegmentStatus::Used),
            "checkpoint blocks are counted before recovery settles the statuses ({:?})",
            self.status
        );
        if self.stream as usize == metadata_stream {
            self.live_units = 0;
        }
    }

    /// Recovery: a block the committed checkpoint names lies here.
    pub(crate) fn add_checkpoint_block(&mut self, units: u64, metadata_stream: usize) {
        assert!(
            matches!(self.status, SegmentStatus::Free | SegmentStatus::Used),
            "checkpoint blocks are counted before recovery settles the statuses ({:?})",
            self.status
        );
        self.live_units += units;
        self.stream = metadata_stream as u8;
        if self.status == SegmentStatus::Free {
            self.status = SegmentStatus::Used;
        }
    }

    /// Recovery: the segment a stream goes on in.
    pub(crate) fn reserved() -> SegmentUse {
        SegmentUse { status: SegmentStatus::Reserved, ..SegmentUse::FREE }
    }

    /// Recovery: the walk from the checkpoint passed through it. It is not released before
    /// a checkpoint after `generation` is committed; empty, it waits for batch
    /// `last_sequence` (the end of the log) to be durable.
    pub(crate) fn walked(&mut self, generation: u64, last_sequence: u64) {
        // (Generation 0 would let the segment go before any commit: the reuse rule.)
        assert!(generation > 0, "a walk starts from a committed checkpoint");
        assert!(
            matches!(self.status, SegmentStatus::Free | SegmentStatus::Used),
            "a walked segment is settled once ({:?})",
            self.status
        );
        self.left_at_generation = generation;
        self.status =
            if self.live_units == 0 { SegmentStatus::WaitingForFlush(last_sequence) } else { SegmentStatus::Used };
    }

    /// Recovery (full scan): used when something is live in it, else free.
    pub(crate) fn settle_after_scan(&mut self) {
        assert!(
            matches!(self.status, SegmentStatus::Free | SegmentStatus::Used),
            "a full scan replays only into free and used segments ({:?})",
            self.status
        );
        assert_eq!(self.left_at_generation, 0, "a full scan knows no checkpoint a segment could wait for");
        if self.live_units > 0 {
            self.status = SegmentStatus::Used;
        } else {
            *self = SegmentUse::FREE;
        }
    }
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

/// Every segment's use, and the free ones in the order they will be taken.
pub(crate) struct SegmentTable {
    segments: Vec<SegmentUse>,
    free_segments: VecDeque<u64>,
    checkpoints: CheckpointGenerations,
    /// Free segments only the metadata stream may take
    /// ([`crate::space::checkpoint_headroom_segments`]).
    checkpoint_headroom: usize,
    /// Units in one segment when every block of it is live.
    units_per_segment: u64,
    /// Units one reference adds at most (a whole block's).
    units_per_block: u64,
    /// The segments waiting for a batch to be durable, as (that batch, segment), and the
    /// number being released: kept by [`SegmentTable::transition`], so that the reclaimer
    /// and the status find them without a pass over every segment (a 64 TiB volume has
    /// millions).
    waiting: BTreeSet<(u64, u64)>,
    releasing: u64,
    /// Checkpoint table pages ([`SEGMENT_RECORDS_PER_PAGE`] records each) with a record
    /// changed since a checkpoint's snapshot last took them: the snapshot encodes only
    /// these (and the pages in mostly dead segments), not every segment's record.
    changed_pages: ChangedPages,
}

/// A set of page numbers with the order they were first marked in: membership by a bit,
/// the members by a list, so that taking them costs their number, not the pages'.
struct ChangedPages {
    bits: Vec<u64>,
    list: Vec<u64>,
}

impl ChangedPages {
    /// Every page of `count` marked.
    fn all(count: u64) -> ChangedPages {
        let mut pages = ChangedPages { bits: vec![0; count.div_ceil(64) as usize], list: Vec::new() };
        for page in 0..count {
            pages.mark(page);
        }
        pages
    }

    fn mark(&mut self, page: u64) {
        let (word, bit) = ((page / 64) as usize, 1u64 << (page % 64));
        if self.bits[word] & bit == 0 {
            self.bits[word] |= bit;
            self.list.push(page);
        }
    }

    fn take(&mut self) -> Vec<u64> {
        for &page in &self.list {
            self.bits[(page / 64) as usize] &= !(1u64 << (page % 64));
        }
        std::mem::take(&mut self.list)
    }
}

impl SegmentTable {
    /// The table as recovered: the free list is every segment whose status is free.
    pub(crate) fn new(
        segments: Vec<SegmentUse>,
        checkpoints: CheckpointGenerations,
        checkpoint_headroom: usize,
        geometry: &Geometry,
    ) -> SegmentTable {
        assert_eq!(segments.len() as u64, geometry.segment_count(), "one use per segment");
        let free_segments = (0..segments.len() as u64)
            .filter(|&segment| segments[segment as usize].status == SegmentStatus::Free)
            .collect();
        let waiting = segments
            .iter()
            .enumerate()
            .filter_map(|(segment, usage)| match usage.status {
                SegmentStatus::WaitingForFlush(killer) => Some((killer, segment as u64)),
                _ => None,
            })
            .collect();
        let releasing = segments.iter().filter(|usage| usage.status == SegmentStatus::Releasing).count() as u64;
        // A table just built (created, or recovered by a mount): the first snapshot looks
        // at every page, and writes those whose records differ from the committed copy.
        let changed_pages = ChangedPages::all((segments.len() as u64).div_ceil(SEGMENT_RECORDS_PER_PAGE as u64));
        let table = SegmentTable {
            segments,
            free_segments,
            checkpoints,
            checkpoint_headroom,
            units_per_segment: geometry.blocks_per_segment() * geometry.live_units_per_block(),
            units_per_block: geometry.live_units_per_block(),
            waiting,
            releasing,
            changed_pages,
        };
        table.check_invariants();
        table
    }

    /// The one door of a segment's life (the diagram at the top of this file): panics on
    /// a transition the engine never makes, or one its live count contradicts.
    fn transition(&mut self, segment: u64, to: SegmentStatus) {
        let usage = &mut self.segments[segment as usize];
        let from = usage.status;
        let live = usage.live_units;
        let legal = match (from, to) {
            (SegmentStatus::Free, SegmentStatus::Reserved | SegmentStatus::Current) => live == 0,
            (SegmentStatus::Reserved, SegmentStatus::Current) => live == 0,
            (SegmentStatus::Current, SegmentStatus::Used) => live > 0,
            (SegmentStatus::Current | SegmentStatus::Used, SegmentStatus::WaitingForFlush(_)) => live == 0,
            // The batch that killed its last block was given a later sequence (an empty
            // clients' batch moved up past a side batch).
            (SegmentStatus::WaitingForFlush(killer), SegmentStatus::WaitingForFlush(later)) => {
                live == 0 && later > killer
            }
            (SegmentStatus::WaitingForFlush(_), SegmentStatus::Releasing) => live == 0,
            (SegmentStatus::Releasing, SegmentStatus::Free) => live == 0,
            _ => false,
        };
        assert!(legal, "segment {segment}: illegal transition {from:?} → {to:?} with {live} live units");
        assert!(
            to != SegmentStatus::WaitingForFlush(u64::MAX),
            "segment {segment} waits for a batch that cannot exist"
        );
        usage.status = to;
        match from {
            SegmentStatus::WaitingForFlush(killer) => assert!(self.waiting.remove(&(killer, segment))),
            SegmentStatus::Releasing => self.releasing -= 1,
            _ => {}
        }
        match to {
            SegmentStatus::WaitingForFlush(killer) => assert!(self.waiting.insert((killer, segment))),
            SegmentStatus::Releasing => self.releasing += 1,
            _ => {}
        }
        self.changed(segment);
    }

    /// Segment `segment`'s record changed: its table page goes to the next snapshot.
    fn changed(&mut self, segment: u64) {
        self.changed_pages.mark(segment / SEGMENT_RECORDS_PER_PAGE as u64);
    }

    /// The table pages with a record changed since the last call (or since the table was
    /// built), for a checkpoint's snapshot.
    pub(crate) fn take_changed_pages(&mut self) -> Vec<u64> {
        self.changed_pages.take()
    }

    /// Table pages a snapshot took whose checkpoint was not committed: the next one
    /// writes them.
    pub(crate) fn mark_pages_changed(&mut self, pages: &[u64]) {
        for &page in pages {
            self.changed_pages.mark(page);
        }
    }

    pub(crate) fn usage(&self, segment: u64) -> &SegmentUse {
        &self.segments[segment as usize]
    }

    /// Every segment's use, by number.
    pub(crate) fn uses(&self) -> impl ExactSizeIterator<Item = (u64, &SegmentUse)> + '_ {
        self.segments.iter().enumerate().map(|(segment, usage)| (segment as u64, usage))
    }

    pub(crate) fn segment_count(&self) -> u64 {
        self.segments.len() as u64
    }

    pub(crate) fn free_count(&self) -> usize {
        self.free_segments.len()
    }

    pub(crate) fn checkpoints(&self) -> CheckpointGenerations {
        self.checkpoints
    }

    /// Free segments client writes leave alone: the cleaner's reserve and the checkpoint's
    /// headroom.
    pub(crate) fn reserve(&self) -> usize {
        crate::space::CLEANING_RESERVE_SEGMENTS + self.checkpoint_headroom
    }

    /// Free segments a stream must leave when it takes one: the checkpoint's headroom,
    /// which only the metadata stream may take.
    pub(crate) fn headroom_for(&self, metadata: bool) -> usize {
        if metadata {
            0
        } else {
            self.checkpoint_headroom
        }
    }

    /// Free segments a clients' batch carrying `purpose` leaves alone when it opens a
    /// segment: the reserve, and for client data the room kept for records too.
    pub(crate) fn clients_floor(&self, purpose: crate::space::Purpose) -> usize {
        self.reserve()
            + match purpose {
                crate::space::Purpose::Data => crate::space::RECORDS_ROOM_SEGMENTS,
                crate::space::Purpose::Records => 0,
            }
    }

    /// Take the next free segment off the free list (its status is still `Free`).
    fn take_free(&mut self) -> Option<u64> {
        let segment = self.free_segments.pop_front()?;
        let usage = &self.segments[segment as usize];
        assert_eq!(usage.sealed_rows, 0, "segment {segment}: a free segment keeps no rows of its last use");
        assert_eq!(usage.left_at_generation, 0, "segment {segment}: a free segment waits for no checkpoint");
        Some(segment)
    }

    /// Take the next free segment as a stream's reserved successor.
    pub(crate) fn take_free_as_reserved(&mut self) -> Option<u64> {
        let segment = self.take_free()?;
        self.transition(segment, SegmentStatus::Reserved);
        Some(segment)
    }

    /// Make `segment` — the next free one (`None`) or the stream's reserved one — the
    /// current segment of `stream`, opened at write clock `clock`. Returns it.
    pub(crate) fn start_current(&mut self, reserved: Option<u64>, stream: usize, clock: u64) -> Option<u64> {
        let segment = match reserved {
            Some(segment) => {
                assert_eq!(self.segments[segment as usize].status, SegmentStatus::Reserved, "segment {segment}");
                segment
            }
            None => self.take_free()?,
        };
        self.transition(segment, SegmentStatus::Current);
        assert!(
            stream == crate::log::METADATA_STREAM || self.free_segments.len() >= self.checkpoint_headroom,
            "stream {stream} took segment {segment} from the checkpoint's headroom"
        );
        let usage = &mut self.segments[segment as usize];
        usage.opened_clock = clock;
        usage.age_clock = 0;
        usage.stream = stream as u8;
        usage.pinned = false;
        usage.sealed_rows = 0;
        usage.left_at_generation = 0;
        Some(segment)
    }

    /// A batch was sealed into current segment `segment`, through row `sealed_rows`, at
    /// write clock `write_clock`; a relocation batch's `oldest_clock` (the oldest of the
    /// blocks it moves) makes the segment as old as that.
    pub(crate) fn note_sealed(&mut self, segment: u64, sealed_rows: u32, write_clock: u64, oldest_clock: Option<u64>) {
        self.changed(segment);
        let usage = &mut self.segments[segment as usize];
        assert_eq!(usage.status, SegmentStatus::Current, "segment {segment} takes batches only while current");
        assert!(sealed_rows > usage.sealed_rows, "segment {segment}: batches seal in row order");
        usage.age_clock = write_clock;
        usage.sealed_rows = sealed_rows;
        if let Some(clock) = oldest_clock {
            usage.opened_clock = usage.opened_clock.min(clock);
        }
    }

    /// Current segment `segment` stops receiving batches: used while something in it is
    /// live, else waiting for batch `killer` (the latest that may have killed its blocks)
    /// to be durable. It leaves at the latest checkpoint snapshot's generation.
    pub(crate) fn leave_current(&mut self, segment: u64, killer: u64) {
        let generation = self.checkpoints.snapshot;
        let usage = &mut self.segments[segment as usize];
        assert_eq!(usage.status, SegmentStatus::Current, "segment {segment}: only a current segment is left");
        assert!(
            usage.live_units == 0 || usage.sealed_rows > 0,
            "segment {segment}: what is live in a segment it leaves was sealed into it"
        );
        usage.left_at_generation = generation;
        let to = if usage.live_units == 0 { SegmentStatus::WaitingForFlush(killer) } else { SegmentStatus::Used };
        self.transition(segment, to);
    }

    /// `units` more live units in current segment `segment` (a record accepted into it).
    pub(crate) fn add_live(&mut self, segment: u64, units: u64) {
        self.changed(segment);
        let usage = &mut self.segments[segment as usize];
        assert_eq!(usage.status, SegmentStatus::Current, "segment {segment}: records go only into a current segment");
        assert!(units > 0, "segment {segment}: a record adds at least one unit");
        assert!(units <= self.units_per_block, "segment {segment}: a record adds at most a block's units, not {units}");
        usage.live_units = usage.live_units.checked_add(units).expect("live units never wrap");
    }

    /// `units` live units of `segment` died, killed by batch `killer` (or, for checkpoint
    /// blocks, dead once `killer` is durable): when nothing is left in a used segment it
    /// waits for `killer` to be durable.
    pub(crate) fn remove_live(&mut self, segment: u64, units: u64, killer: u64) {
        self.changed(segment);
        assert!(
            units > 0 && units <= self.units_per_block,
            "segment {segment}: a death removes what one record added, not {units} units"
        );
        let usage = &mut self.segments[segment as usize];
        assert!(
            usage.status.may_hold_live_units(),
            "segment {segment}: {units} units die in a segment that holds none ({:?})",
            usage.status
        );
        usage.live_units = usage
            .live_units
            .checked_sub(units)
            .unwrap_or_else(|| panic!("segment {segment}: {units} units die where only {} are live", usage.live_units));
        if usage.live_units == 0 && usage.status == SegmentStatus::Used {
            self.transition(segment, SegmentStatus::WaitingForFlush(killer));
        }
    }

    /// An empty clients' batch moved from sequence `from` to `to`: segments waiting for
    /// `from` wait for `to`.
    pub(crate) fn renumber_waiting(&mut self, from: u64, to: u64) {
        assert!(to > from, "a batch moves up, never down");
        if let Some(&(_, segment)) = self.waiting.range((to, 0)..=(to, u64::MAX)).next() {
            panic!("segment {segment} waits for a batch not given out yet");
        }
        let moving: Vec<u64> = self.waiting.range((from, 0)..=(from, u64::MAX)).map(|&(_, segment)| segment).collect();
        for segment in moving {
            self.transition(segment, SegmentStatus::WaitingForFlush(to));
        }
    }

    /// The segments waiting for a batch through `durable`, in the order of those batches.
    fn waiting_through(&self, durable: u64) -> impl Iterator<Item = &SegmentUse> + '_ {
        self.waiting.range(..=(durable, u64::MAX)).map(|&(_, segment)| &self.segments[segment as usize])
    }

    /// Segments whose death is durable through `durable` and that the reuse rule lets go:
    /// each becomes `Releasing` (its caller owns it until [`SegmentTable::finish_release`]).
    pub(crate) fn begin_release(&mut self, durable: u64) -> Vec<u64> {
        let releasing: Vec<u64> = self
            .waiting
            .range(..=(durable, u64::MAX))
            .filter(|&&(_, segment)| self.releasable(&self.segments[segment as usize], durable))
            .map(|&(_, segment)| segment)
            .collect();
        for &segment in &releasing {
            self.transition(segment, SegmentStatus::Releasing);
        }
        releasing
    }

    /// Whether `usage` waits for nothing beyond `durable` and the reuse rule.
    fn releasable(&self, usage: &SegmentUse, durable: u64) -> bool {
        matches!(usage.status, SegmentStatus::WaitingForFlush(killer) if killer <= durable)
            && self.checkpoints.allows_reuse(usage.left_at_generation)
    }

    /// Releasing segment `segment` is free again (its head row was zeroed and flushed).
    pub(crate) fn finish_release(&mut self, segment: u64) {
        self.transition(segment, SegmentStatus::Free);
        let usage = &mut self.segments[segment as usize];
        usage.sealed_rows = 0;
        usage.left_at_generation = 0;
        assert!(
            self.free_segments.len() < self.segments.len(),
            "segment {segment}: the free list holds a segment once"
        );
        self.free_segments.push_back(segment);
    }

    /// Whether a segment is coming free: being released, or waiting for nothing beyond
    /// `durable` and the reuse rule.
    pub(crate) fn any_coming_free(&self, durable: u64) -> bool {
        self.releasing > 0 || self.waiting_through(durable).any(|usage| self.releasable(usage, durable))
    }

    /// Whether a segment's death waits for a batch after `durable` (a flush frees it).
    pub(crate) fn any_waiting_beyond(&self, durable: u64) -> bool {
        self.waiting.last().is_some_and(|&(killer, _)| killer > durable)
    }

    /// Whether a segment whose death is durable through `durable` waits only for a
    /// checkpoint to be committed (the reuse rule).
    pub(crate) fn any_waiting_for_checkpoint(&self, durable: u64) -> bool {
        self.waiting_through(durable).any(|usage| !self.checkpoints.allows_reuse(usage.left_at_generation))
    }

    /// Segments waiting for a batch to be durable or being released: coming free.
    pub(crate) fn waiting_count(&self) -> u64 {
        self.waiting.len() as u64 + self.releasing
    }

    /// Dead blocks in used segments: room cleaning could win.
    pub(crate) fn dead_blocks_in_used(&self, units_per_block: u64) -> u64 {
        self.uses()
            .filter(|(_, usage)| usage.status == SegmentStatus::Used)
            .map(|(_, usage)| self.units_per_segment.saturating_sub(usage.live_units) / units_per_block)
            .sum()
    }

    /// Segment `segment` holds a block nothing can read or rebuild, or summaries that
    /// cannot be read: it is never chosen as a cleaning victim. Found outside the write
    /// lock, so the segment may have emptied since: one that holds nothing any more
    /// (waiting, being released, free) is not pinned, and `false` says so.
    pub(crate) fn pin(&mut self, segment: u64) -> bool {
        self.changed(segment);
        let usage = &mut self.segments[segment as usize];
        if !matches!(usage.status, SegmentStatus::Used | SegmentStatus::Current) {
            return false;
        }
        usage.pinned = true;
        true
    }

    /// A checkpoint snapshot of generation `generation` is taken.
    pub(crate) fn snapshot_taken(&mut self, generation: u64) {
        assert!(generation > self.checkpoints.snapshot, "snapshot generations increase");
        self.checkpoints.snapshot = generation;
    }

    /// The checkpoint of generation `generation` is committed (the superblocks name it).
    pub(crate) fn checkpoint_committed(&mut self, generation: u64) {
        assert!(generation > self.checkpoints.committed, "committed generations increase");
        assert!(generation <= self.checkpoints.snapshot, "a checkpoint is committed after its snapshot");
        self.checkpoints.committed = generation;
    }

    /// The table's own invariants: the free list is exactly the free segments, once each;
    /// segments that may hold nothing live hold nothing; no segment is being released
    /// between calls of the reclaimer (callers that hold a release in progress say so).
    pub(crate) fn check_invariants(&self) {
        let mut listed = vec![false; self.segments.len()];
        for &segment in &self.free_segments {
            let usage = &self.segments[segment as usize];
            assert_eq!(usage.status, SegmentStatus::Free, "segment {segment} is on the free list");
            assert!(!listed[segment as usize], "segment {segment} is on the free list twice");
            listed[segment as usize] = true;
        }
        for (segment, usage) in self.uses() {
            assert_eq!(
                usage.status == SegmentStatus::Free,
                listed[segment as usize],
                "segment {segment} ({:?}) and the free list disagree",
                usage.status
            );
            assert!(
                usage.status.may_hold_live_units() || usage.live_units == 0,
                "segment {segment} is {:?} with {} live units",
                usage.status,
                usage.live_units
            );
            assert!(
                usage.status != SegmentStatus::WaitingForFlush(u64::MAX),
                "segment {segment} waits for a batch that cannot exist"
            );
            if usage.status == SegmentStatus::Free {
                assert_eq!(
                    (usage.sealed_rows, usage.left_at_generation),
                    (0, 0),
                    "free segment {segment} keeps rows or a checkpoint wait of its last use"
                );
            }
            if matches!(usage.status, SegmentStatus::Current | SegmentStatus::Reserved) {
                assert_eq!(usage.left_at_generation, 0, "segment {segment} ({:?}) has not left a stream", usage.status);
            }
        }
        assert!(self.checkpoints.committed <= self.checkpoints.snapshot, "committed after snapshot");
        let waiting: BTreeSet<(u64, u64)> = self
            .uses()
            .filter_map(|(segment, usage)| match usage.status {
                SegmentStatus::WaitingForFlush(killer) => Some((killer, segment)),
                _ => None,
            })
            .collect();
        assert!(waiting == self.waiting, "the waiting set is the segments waiting for a flush");
        let releasing = self.uses().filter(|(_, usage)| usage.status == SegmentStatus::Releasing).count() as u64;
        assert_eq!(releasing, self.releasing, "segments being released");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::geometry::{Geometry, RaidLevel};

    /// A volume with packed fragments: a record adds 1 to 16 units.
    fn table() -> SegmentTable {
        let mut geometry = Geometry::new(RaidLevel::Raid5, 3, 64 << 10, 0, 4 << 20).expect("geometry");
        geometry.packed_fragments = true;
        let uses = vec![SegmentUse::FREE; geometry.segment_count() as usize];
        SegmentTable::new(uses, CheckpointGenerations::default(), 0, &geometry)
    }

    #[test]
    fn a_segment_lives_through_the_legal_transitions_only() {
        let mut table = table();
        let free = table.free_count();
        let segment = table.start_current(None, 0, 7).expect("a free segment");
        assert_eq!(table.free_count(), free - 1);
        table.add_live(segment, 3);
        table.note_sealed(segment, 2, 9, None);
        table.leave_current(segment, 4);
        assert_eq!(table.usage(segment).status(), SegmentStatus::Used);
        table.remove_live(segment, 3, 5);
        assert_eq!(table.usage(segment).status(), SegmentStatus::WaitingForFlush(5));
        table.renumber_waiting(5, 6);
        assert!(table.begin_release(5).is_empty(), "batch 6 is not durable yet");
        assert_eq!(table.begin_release(6), vec![segment]);
        table.finish_release(segment);
        assert_eq!(table.free_count(), free);
        table.check_invariants();
    }

    /// What the reclaimer and the status ask of the waiting segments, answered from the
    /// waiting set, agrees with a pass over every segment, through the reuse rule and a
    /// renumbering.
    #[test]
    fn the_waiting_set_answers_as_a_pass_over_every_segment_would() {
        let mut table = table();
        let mut segments = Vec::new();
        for killer in [3, 5, 5, 8] {
            let segment = table.start_current(None, 0, 0).expect("a free segment");
            table.add_live(segment, 1);
            table.note_sealed(segment, 1, 0, None);
            table.leave_current(segment, 1);
            table.remove_live(segment, 1, killer);
            segments.push(segment);
        }
        // The third left its stream after a snapshot: it waits for a commit too.
        table.snapshot_taken(1);
        let late = table.start_current(None, 0, 0).expect("a free segment");
        table.add_live(late, 1);
        table.note_sealed(late, 1, 0, None);
        table.leave_current(late, 1);
        table.remove_live(late, 1, 4);
        let scan = |table: &SegmentTable, wanted: &dyn Fn(SegmentStatus) -> bool| {
            table.uses().filter(|(_, usage)| wanted(usage.status)).count() as u64
        };
        assert_eq!(table.waiting_count(), 5);
        assert_eq!(
            table.waiting_count(),
            scan(&table, &|status| matches!(status, SegmentStatus::WaitingForFlush(_) | SegmentStatus::Releasing))
        );
        assert!(table.any_waiting_beyond(7) && !table.any_waiting_beyond(8));
        assert!(table.any_waiting_for_checkpoint(4) && !table.any_waiting_for_checkpoint(3));
        assert!(!table.any_coming_free(2) && table.any_coming_free(3));
        table.renumber_waiting(5, 6);
        assert_eq!(
            table.begin_release(5),
            vec![segments[0]],
            "batch 6 is not durable, the late one waits for a commit"
        );
        assert_eq!(table.waiting_count(), 5, "a segment being released still comes free");
        assert!(table.any_coming_free(0), "one is being released");
        table.finish_release(segments[0]);
        table.checkpoint_committed(1);
        assert!(table.any_waiting_for_checkpoint(6), "the late one left at generation 1: it waits for a later commit");
        table.snapshot_taken(2);
        table.checkpoint_committed(2);
        let mut released = table.begin_release(6);
        released.sort_unstable();
        let mut expected = vec![segments[1], segments[2], late];
        expected.sort_unstable();
        assert_eq!(released, expected);
        for segment in released {
            table.finish_release(segment);
        }
        assert_eq!(table.waiting_count(), 1);
        table.check_invariants();
    }

    /// A snapshot takes the table pages whose records changed since the last one, and
    /// only those; a page given back (a checkpoint that failed) is taken again.
    #[test]
    fn a_snapshot_takes_the_pages_whose_records_changed() {
        let mut table = table();
        let pages = (table.segment_count()).div_ceil(SEGMENT_RECORDS_PER_PAGE as u64);
        assert_eq!(table.take_changed_pages().len() as u64, pages, "a table just built: every page");
        assert!(table.take_changed_pages().is_empty());
        let segment = table.start_current(None, 0, 0).expect("a free segment");
        let page = segment / SEGMENT_RECORDS_PER_PAGE as u64;
        assert_eq!(table.take_changed_pages(), vec![page]);
        table.add_live(segment, 2);
        table.note_sealed(segment, 1, 3, None);
        assert_eq!(table.take_changed_pages(), vec![page], "each page once");
        table.mark_pages_changed(&[page]);
        assert_eq!(table.take_changed_pages(), vec![page]);
        table.leave_current(segment, 1);
        table.remove_live(segment, 2, 2);
        assert_eq!(table.take_changed_pages(), vec![page]);
    }

    #[test]
    #[should_panic(expected = "units die where only")]
    fn live_counts_never_wrap() {
        let mut table = table();
        let segment = table.start_current(None, 0, 0).expect("a free segment");
        table.add_live(segment, 1);
        table.remove_live(segment, 2, 1);
    }

    #[test]
    #[should_panic(expected = "illegal transition")]
    fn a_segment_with_live_units_is_never_released() {
        let mut table = table();
        let segment = table.start_current(None, 0, 0).expect("a free segment");
        table.add_live(segment, 1);
        table.transition(segment, SegmentStatus::WaitingForFlush(1));
    }

    #[test]
    #[should_panic(expected = "records go only into a current segment")]
    fn nothing_is_added_to_a_segment_that_left_its_stream() {
        let mut table = table();
        let segment = table.start_current(None, 0, 0).expect("a free segment");
        table.add_live(segment, 1);
        table.note_sealed(segment, 1, 0, None);
        table.leave_current(segment, 1);
        table.add_live(segment, 1);
    }
}
