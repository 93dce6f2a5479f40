//! Client reads many at a time from one thread (docs/resilience.md, "Reads in flight"):
//! each read's blocks that need a member go to the kernel through a `ReadRing` and the
//! read completes when its last block does, so one thread keeps a queue depth of reads in
//! flight without a thread blocked per read.
//!
//! Only the common case takes the ring: a whole data block on the first copy of its
//! column, on a member that is readable and not lagging. Everything else — blocks in
//! memory, zeros, compressed fragments, a lagging member (hedged), a missing one (rebuilt
//! from its row) — goes through the single-read path (`Core::read_block`) when the read is
//! submitted, as `Volume::read` would. What a block's lookup needs first is read through
//! the ring as well, while other reads go on: its index page when the map holds it only in
//! the log (`PageLoad`), and its segment's checksum table when that is not cached
//! (`TableLoad`).
//!
//! Segment reuse: a plain read holds the reuse fence through its member reads. A queued
//! read holds it only while it looks its blocks up. Each block notes its segment's
//! generation then, and its data is taken only if that generation is unchanged once the
//! kernel has read it. A segment's generation is bumped under the fence before the segment
//! is written again, so an unchanged generation after the read means the block still held
//! what the lookup found. A block that fails that check, its checksum, or its read is read
//! again through the single-read path, which rebuilds it if it must and counts what went
//! wrong.

use super::{block_pieces, Core, Lookup, SummaryWalk};
use crate::error::{Error, RequestProblem, Result};
use crate::index::checksums::ChecksumTable;
use crate::index::map::{Mapping, ReadCopy};
use crate::layout::format;
use crate::layout::geometry::BLOCK_SIZE_BYTES;
use crate::stats::Counters;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use stripelog_blockdev::{AlignedBuffer, FinishedRead, ReadRing};

/// Member reads in flight per queued client read, on average, that the ring makes room
/// for; a read whose blocks find the ring full reads the rest through the single-read path.
pub const RING_ENTRIES_PER_READ: usize = 4;
/// The ring holds at least this many member reads: four 1 MiB reads in flight whatever
/// the depth (each entry holds a 4 KiB buffer while in flight: 4 MiB).
pub const RING_ENTRIES_MINIMUM: usize = 1024;
/// Checksum tables a queue reads through its ring at once; a block whose segment's table
/// is missing beyond that has it loaded by the single-read path, on the queue's thread.
pub const TABLE_LOADS_IN_FLIGHT_MAXIMUM: usize = 64;
/// Tags of the ring's summary reads (a table being loaded) have this bit set, and the
/// segment in the others; those of data blocks are a read and a block (`ring_tag`).
const SUMMARY_READ_TAG: u64 = 1 << 63;
/// Index pages a queue reads through its ring at once; a block whose map page is missing
/// beyond that has it loaded by the single-read path, on the queue's thread.
pub const PAGE_LOADS_IN_FLIGHT_MAXIMUM: usize = 64;
/// Tags of the ring's index page reads have this bit set, and the page in the others.
const PAGE_READ_TAG: u64 = 1 << 62;

/// A finished client read: the caller's tag and buffer, and whether the buffer holds the
/// data.
pub struct CompletedRead {
    pub tag: u64,
    pub buffer: Vec<u8>,
    pub result: Result<()>,
}

/// One block's part of a queued read: the block, where in it the read's bytes start, and
/// where they go in the read's buffer.
#[derive(Clone)]
struct Piece {
    logical_block: u64,
    within: usize,
    range: Range<usize>,
}

/// One block of a queued read that the ring reads.
struct RingBlock {
    piece: Piece,
    position: u64,
    segment: u64,
    /// The segment's generation when the block was looked up.
    generation: u32,
    expected_checksum: u32,
    member: usize,
}

struct QueuedRead {
    tag: u64,
    buffer: Vec<u8>,
    length_bytes: usize,
    blocks: Vec<RingBlock>,
    /// Blocks still with the ring or waiting for their segment's checksum table.
    pending: usize,
    error: Option<Error>,
}

/// A segment's checksum table being read through the ring: its summaries one after the
/// other, while the queue goes on with other reads.
struct TableLoad {
    walk: SummaryWalk,
    table: ChecksumTable,
    /// The segment's generation when the load started: a summary read after the segment
    /// was released and written again is not taken.
    generation: u32,
    /// The member the summary in flight is read from.
    member: usize,
    /// The pieces of queued reads (by index) that wait for the table.
    waiting: Vec<(usize, Piece)>,
}

/// An index page being read through the ring: the map has evicted it (or not loaded it
/// since the volume was opened), and the blocks it maps wait for it while the queue goes on
/// with other reads.
struct PageLoad {
    /// The copy being read (the map takes it only if it is still the page's copy).
    pointer: crate::layout::checkpoint::PagePointer,
    member: usize,
    /// The pieces of queued reads (by index) that wait for the page.
    waiting: Vec<(usize, Piece)>,
}

/// How a table load moved on.
enum LoadProgress {
    /// A summary read is with the ring.
    Reading,
    /// Every summary is recorded: the table is whole.
    Walked,
    /// The ring cannot go on (a member to rebuild from, a summary that does not prove
    /// itself, a full ring): the single-read path loads the table.
    Stopped,
}

/// Reads submitted from one thread and completed as their member reads finish. Drop it
/// before the volume is closed (it keeps the members' devices open while it lives).
pub struct ReadQueue {
    core: Arc<Core>,
    ring: ReadRing,
    reads: Vec<Option<QueuedRead>>,
    free: Vec<usize>,
    /// Reads finished when they were submitted (nothing for the ring to do).
    completed: Vec<CompletedRead>,
    finished: Vec<FinishedRead>,
    /// Block buffers back from the ring, for the next reads: no allocation per block.
    spare: Vec<AlignedBuffer>,
    /// Checksum tables being read through the ring, by segment (at most
    /// `TABLE_LOADS_IN_FLIGHT_MAXIMUM`).
    loads: HashMap<u64, TableLoad>,
    /// Index pages being read through the ring, by page (at most
    /// `PAGE_LOADS_IN_FLIGHT_MAXIMUM`).
    page_loads: HashMap<u64, PageLoad>,
}

impl ReadQueue {
    pub(crate) fn new(core: Arc<Core>, depth: usize) -> ReadQueue {
        ReadQueue {
            core,
            ring: ReadRing::new((depth.max(1) * RING_ENTRIES_PER_READ).max(RING_ENTRIES_MINIMUM)),
            reads: Vec::new(),
            free: Vec::new(),
            completed: Vec::new(),
            finished: Vec::new(),
            spare: Vec::new(),
            loads: HashMap::new(),
            page_loads: HashMap::new(),
        }
    }

    /// Let `complete_or_readable` also return once `descriptor` becomes readable: a thread
    /// that reads requests from a socket and serves them waits for both at once. The queue
    /// only watches it (it reads nothing from it); the caller keeps it open while the
    /// queue lives.
    pub fn watch(&mut self, descriptor: std::os::unix::io::RawFd) {
        self.ring.watch(descriptor);
    }

    /// Member reads the kernel has finished that the next `complete` takes without
    /// waiting (the kernel posts a completion when the thread next enters it).
    pub fn member_reads_finished(&mut self) -> usize {
        self.ring.finished_count()
    }

    /// Reads submitted and not yet returned by `complete`.
    pub fn in_flight(&self) -> usize {
        self.reads.len() - self.free.len() + self.completed.len()
    }

    /// Start reading `length_bytes` at `offset_bytes` (both multiples of 512) into the
    /// start of `buffer`; `complete` gives the buffer back with `tag`.
    pub fn submit(&mut self, tag: u64, offset_bytes: u64, length_bytes: usize, buffer: Vec<u8>) {
        let core = self.core.clone();
        let checked = if length_bytes > buffer.len() {
            Err(Error::InvalidRequest(RequestProblem::BufferTooSmall { length_bytes, buffer_bytes: buffer.len() }))
        } else {
            core.check_open().and_then(|()| core.check_range(offset_bytes, length_bytes as u64))
        };
        if let Err(error) = checked {
            self.completed.push(CompletedRead { tag, buffer, result: Err(error) });
            return;
        }
        let index = self.free.pop().unwrap_or_else(|| {
            self.reads.push(None);
            self.reads.len() - 1
        });
        self.reads[index] = Some(QueuedRead { tag, buffer, length_bytes, blocks: Vec::new(), pending: 0, error: None });
        {
            let _fence = core.reuse_fence.read();
            for (logical_block, within, range) in block_pieces(offset_bytes, length_bytes) {
                if self.reads[index].as_ref().is_some_and(|read| read.error.is_some()) {
                    break;
                }
                self.start_piece(&core, index, Piece { logical_block, within, range }, true);
            }
        }
        // To the kernel at once, rather than with the next wait: reads reach the device
        // as they come, not in bursts (which a device serves more slowly, measured).
        self.ring.submit();
        self.finish_if_done(index);
    }

    fn block_buffer(&mut self) -> AlignedBuffer {
        self.spare.pop().unwrap_or_else(|| AlignedBuffer::zeroed(BLOCK_SIZE_BYTES))
    }

    /// Serve `piece` of read `index` now, or hand its block to the ring, or have it wait for
    /// its index page or its segment's checksum table (only `may_wait_for_load`). The
    /// caller holds the reuse fence, and finishes the read if nothing of it is pending.
    fn start_piece(&mut self, core: &Core, index: usize, piece: Piece, may_wait_for_load: bool) {
        let mut scratch = self.block_buffer();
        let plan = self.plan_block(core, piece.logical_block, &mut scratch, may_wait_for_load);
        let Some(read) = self.reads[index].as_mut() else { return };
        match plan {
            Ok(Plan::Served) => read.take(&piece, &scratch),
            Ok(Plan::WaitForPage { page }) => match self.page_loads.get_mut(&page) {
                Some(load) => {
                    load.waiting.push((index, piece));
                    read.pending += 1;
                }
                // (`plan_block` answers this only with the load under way.)
                None => read.read_now(core, &piece, &mut scratch),
            },
            Ok(Plan::WaitForTable { segment }) => match self.loads.get_mut(&segment) {
                Some(load) => {
                    load.waiting.push((index, piece));
                    read.pending += 1;
                }
                // (`plan_block` answers this only with the load under way.)
                None => read.read_now(core, &piece, &mut scratch),
            },
            Ok(Plan::Ring { position, segment, generation, expected_checksum, member, device, offset_bytes }) => {
                let block_tag = ring_tag(index, read.blocks.len());
                match self.ring.push(block_tag, device, offset_bytes, scratch) {
                    Ok(()) => {
                        scratch = self.spare.pop().unwrap_or_else(|| AlignedBuffer::zeroed(BLOCK_SIZE_BYTES));
                        read.blocks.push(RingBlock { piece, position, segment, generation, expected_checksum, member });
                        read.pending += 1;
                    }
                    Err(returned) => {
                        // The ring is full: this block takes the single-read path.
                        scratch = returned;
                        read.read_now(core, &piece, &mut scratch);
                    }
                }
            }
            Err(failure) => read.error = Some(failure),
        }
        self.spare.push(scratch);
    }

    /// How one block is served: from memory or the single-read path now (`Served`, into
    /// `scratch`), by the ring, or once its index page or its segment's checksum table has
    /// been read through the ring (a load this starts, or joins). The caller holds the
    /// reuse fence.
    fn plan_block(
        &mut self,
        core: &Core,
        logical_block: u64,
        scratch: &mut AlignedBuffer,
        may_wait_for_load: bool,
    ) -> Result<Plan> {
        if may_wait_for_load {
            if let Some((page, pointer)) = core.map.page_to_load(logical_block) {
                if self.page_loads.contains_key(&page) || self.start_page_load(core, page, pointer) {
                    return Ok(Plan::WaitForPage { page });
                }
            }
        }
        let position = match core.resolved(logical_block)?.1 {
            Mapping::Data { position } => position,
            _ => {
                core.read_block(logical_block, scratch)?;
                return Ok(Plan::Served);
            }
        };
        if let Lookup::Served = core.position_from_memory(position, scratch, None) {
            return Ok(Plan::Served);
        }
        let location = core.geometry.locate(position);
        let device = core.members.direct_read_device(&core.geometry, location);
        let table = match core.checksums.get(location.segment) {
            Some(table) => Some(table),
            None if device.is_some()
                && may_wait_for_load
                && (self.loads.contains_key(&location.segment) || self.start_load(core, location.segment)) =>
            {
                return Ok(Plan::WaitForTable { segment: location.segment });
            }
            None => core.checksum_table(location.segment).ok(),
        };
        let (Some(table), Some((member, device))) = (table, device) else {
            core.read_block(logical_block, scratch)?;
            return Ok(Plan::Served);
        };
        Ok(Plan::Ring {
            position,
            segment: location.segment,
            generation: core.generation(location.segment),
            expected_checksum: table.get(position % core.geometry.blocks_per_segment()),
            member,
            device,
            offset_bytes: core.geometry.member_offset_bytes(location.segment, location.row),
        })
    }

    /// Start reading index page `page`'s copy at `pointer` through the ring; `false` when it
    /// is not (too many loads, the ring is full, or its member cannot take the ring's
    /// reads: the single-read path loads it, rebuilding it if it must).
    fn start_page_load(&mut self, core: &Core, page: u64, pointer: crate::layout::checkpoint::PagePointer) -> bool {
        if self.page_loads.len() >= PAGE_LOADS_IN_FLIGHT_MAXIMUM
            || pointer.position >= core.geometry.physical_data_blocks()
        {
            return false;
        }
        let location = core.geometry.locate(pointer.position);
        let Some((member, device)) = core.members.direct_read_device(&core.geometry, location) else {
            return false;
        };
        let offset_bytes = core.geometry.member_offset_bytes(location.segment, location.row);
        let block = self.block_buffer();
        match self.ring.push(PAGE_READ_TAG | page, device, offset_bytes, block) {
            Ok(()) => {
                self.page_loads.insert(page, PageLoad { pointer, member, waiting: Vec::new() });
                true
            }
            Err(returned) => {
                self.spare.push(returned);
                false
            }
        }
    }

    /// An index page read is back: the map takes the page if the read proves to be its
    /// copy, and the pieces that waited for it start again (through the single-read
    /// path's own load when the map did not take it).
    fn page_read(&mut self, core: &Core, page: u64, read: FinishedRead) {
        let Some(load) = self.page_loads.remove(&page) else {
            self.spare.push(read.buffer);
            return;
        };
        let outcome = match read.result {
            Ok(()) => core.map.install_read_copy(page, load.pointer, &read.buffer),
            Err(_) => ReadCopy::Refused,
        };
        self.spare.push(read.buffer);
        if outcome == ReadCopy::Installed {
            core.members.read_done(load.member, Ok(()), &core.counters);
            Counters::add(&core.counters.queued_map_page_loads, 1);
        }
        let installed = outcome != ReadCopy::Refused;
        let _fence = core.reuse_fence.read();
        self.restart_waiting(core, load.waiting, installed);
    }

    /// Start again the pieces that waited for a page or a table load that has ended,
    /// letting them wait for another load only when `may_wait_for_load` (a load that
    /// failed sends them to the single-read path). The caller holds the reuse fence.
    fn restart_waiting(&mut self, core: &Core, waiting: Vec<(usize, Piece)>, may_wait_for_load: bool) {
        for (index, piece) in waiting {
            let Some(read) = self.reads[index].as_mut() else { continue };
            read.pending -= 1;
            if read.error.is_none() {
                self.start_piece(core, index, piece, may_wait_for_load);
            }
            self.finish_if_done(index);
        }
    }

    /// Start reading `segment`'s checksum table through the ring; `false` when it is not
    /// (too many loads, or the ring cannot read its first summary). A load that needs no
    /// member read completes here, its table cached. The caller holds the reuse fence.
    fn start_load(&mut self, core: &Core, segment: u64) -> bool {
        if self.loads.len() >= TABLE_LOADS_IN_FLIGHT_MAXIMUM {
            return false;
        }
        let sealed_rows = core.state.lock().space.usage(segment).sealed_rows();
        self.loads.insert(
            segment,
            TableLoad {
                walk: SummaryWalk::new(segment, sealed_rows),
                table: ChecksumTable::new(core.geometry.blocks_per_segment()),
                generation: core.generation(segment),
                member: 0,
                waiting: Vec::new(),
            },
        );
        match self.advance_load(core, segment) {
            LoadProgress::Reading => true,
            LoadProgress::Walked => {
                if let Some(load) = self.loads.remove(&segment) {
                    core.checksums.insert(segment, Arc::new(load.table), false);
                }
                false
            }
            LoadProgress::Stopped => {
                self.loads.remove(&segment);
                false
            }
        }
    }

    /// Record the summaries of `segment`'s load found in memory, and hand the next one on
    /// the members to the ring.
    fn advance_load(&mut self, core: &Core, segment: u64) -> LoadProgress {
        let mut block = self.block_buffer();
        let Some(load) = self.loads.get_mut(&segment) else {
            self.spare.push(block);
            return LoadProgress::Stopped;
        };
        loop {
            let Some(position) = load.walk.next_position(&core.geometry) else {
                self.spare.push(block);
                return LoadProgress::Walked;
            };
            if let Lookup::Served = core.position_from_memory(position, &mut block, None) {
                if load.walk.expects(&block, &core.volume_uuid, &core.geometry) && load.record(core, &block) {
                    continue;
                }
            }
            let location = core.geometry.locate(position);
            let Some((member, device)) = core.members.direct_read_device(&core.geometry, location) else {
                self.spare.push(block);
                return LoadProgress::Stopped;
            };
            let offset_bytes = core.geometry.member_offset_bytes(location.segment, location.row);
            return match self.ring.push(SUMMARY_READ_TAG | segment, device, offset_bytes, block) {
                Ok(()) => {
                    load.member = member;
                    LoadProgress::Reading
                }
                Err(returned) => {
                    self.spare.push(returned);
                    LoadProgress::Stopped
                }
            };
        }
    }

    /// A summary read of `segment`'s load is back: record it and read the next, or end
    /// the load.
    fn summary_read(&mut self, core: &Core, segment: u64, read: FinishedRead) {
        let Some(load) = self.loads.get_mut(&segment) else {
            self.spare.push(read.buffer);
            return;
        };
        let intact = read.result.is_ok()
            && core.generation(segment) == load.generation
            && load.walk.expects(&read.buffer, &core.volume_uuid, &core.geometry);
        let progress = if intact && load.record(core, &read.buffer) {
            core.members.read_done(load.member, Ok(()), &core.counters);
            self.spare.push(read.buffer);
            self.advance_load(core, segment)
        } else {
            self.spare.push(read.buffer);
            LoadProgress::Stopped
        };
        match progress {
            LoadProgress::Reading => {}
            LoadProgress::Walked => self.end_load(core, segment, true),
            LoadProgress::Stopped => self.end_load(core, segment, false),
        }
    }

    /// Cache the table of `segment`'s load if it is whole (`walked`) and the segment was
    /// not released meanwhile, and start the pieces that waited for it (through the
    /// single-read path's own load when it is not cached).
    fn end_load(&mut self, core: &Core, segment: u64, walked: bool) {
        let Some(load) = self.loads.remove(&segment) else { return };
        let _fence = core.reuse_fence.read();
        if walked && core.generation(segment) == load.generation {
            Counters::add(&core.counters.queued_checksum_table_loads, 1);
            core.checksums.insert(segment, Arc::new(load.table), false);
        }
        self.restart_waiting(core, load.waiting, false);
    }

    /// The reads finished since the last call, waiting for at least one when `wait` and
    /// any is in flight.
    pub fn complete(&mut self, wait: bool) -> Vec<CompletedRead> {
        self.complete_waiting(wait && self.completed.is_empty(), false)
    }

    /// `complete`, waiting (if none has finished) until a read finishes or the watched
    /// descriptor (`watch`) is readable: perhaps with nothing.
    pub fn complete_or_readable(&mut self) -> Vec<CompletedRead> {
        self.complete_waiting(self.completed.is_empty(), true)
    }

    /// Reap once (waiting when `wait`, for the watched descriptor too when `watch`), then
    /// go on without waiting while what was taken finishes no read. The ring gives its
    /// completions a few at a time (`stripelog_blockdev::COMPLETIONS_PER_REAP_MAXIMUM`), so
    /// that the caller answers each read and starts the next one soon; the blocks of a
    /// larger read, a summary or an index page finish none, and the next completions the
    /// kernel holds are taken at once.
    fn complete_waiting(&mut self, mut wait: bool, watch: bool) -> Vec<CompletedRead> {
        loop {
            let mut finished = std::mem::take(&mut self.finished);
            if wait && watch {
                self.ring.reap_or_readable(&mut finished);
            } else {
                self.ring.reap(wait, &mut finished);
            }
            let completed = self.take_finished(finished);
            if !completed.is_empty() || !self.ring.has_finished() {
                return completed;
            }
            wait = false;
        }
    }

    fn take_finished(&mut self, mut finished: Vec<FinishedRead>) -> Vec<CompletedRead> {
        let core = self.core.clone();
        let mut scratch = self.block_buffer();
        for read in finished.drain(..) {
            if read.tag & SUMMARY_READ_TAG != 0 {
                self.summary_read(&core, read.tag & !SUMMARY_READ_TAG, read);
                continue;
            }
            if read.tag & PAGE_READ_TAG != 0 {
                self.page_read(&core, read.tag & !PAGE_READ_TAG, read);
                continue;
            }
            let (index, block_index) = from_ring_tag(read.tag);
            let Some(queued) = self.reads.get_mut(index).and_then(Option::as_mut) else { continue };
            let Some(block) = queued.blocks.get(block_index) else { continue };
            let piece = block.piece.clone();
            // Unchanged generation first: then the checksum proves the data is the block's.
            let intact = read.result.is_ok()
                && core.generation(block.segment) == block.generation
                && format::checksum_proves(&read.buffer, block.expected_checksum);
            if intact {
                core.members.read_done(block.member, Ok(()), &core.counters);
                Counters::add(&core.counters.queued_member_reads, 1);
                if let Some(cache) = &core.cache {
                    cache.insert(block.position, block.generation, &read.buffer);
                }
                queued.take(&piece, &read.buffer);
            } else if queued.error.is_none() {
                let _fence = core.reuse_fence.read();
                queued.read_now(&core, &piece, &mut scratch);
            }
            queued.pending -= 1;
            self.finish_if_done(index);
            self.spare.push(read.buffer);
        }
        self.spare.push(scratch);
        self.finished = finished;
        // Blocks started for the tables that came in, and the loads' next summaries.
        self.ring.submit();
        if !self.completed.is_empty() {
            core.evict_map_pages_if_needed();
        }
        std::mem::take(&mut self.completed)
    }

    /// Finish read `index` if nothing of it is pending.
    fn finish_if_done(&mut self, index: usize) {
        if self.reads[index].as_ref().is_none_or(|read| read.pending > 0) {
            return;
        }
        let Some(read) = self.reads[index].take() else { return };
        self.free.push(index);
        let result = match read.error {
            Some(error) => Err(error),
            None => {
                Counters::add(&self.core.counters.host_bytes_read, read.length_bytes as u64);
                Ok(())
            }
        };
        self.completed.push(CompletedRead { tag: read.tag, buffer: read.buffer, result });
    }
}

impl QueuedRead {
    /// Copy `piece`'s bytes out of its whole block `block` into the read's buffer.
    fn take(&mut self, piece: &Piece, block: &[u8]) {
        self.buffer[piece.range.clone()].copy_from_slice(&block[piece.within..piece.within + piece.range.len()]);
    }

    /// Read `piece`'s block through the single-read path now (rebuilding it if it must;
    /// the caller holds the reuse fence), or note why it cannot be read.
    fn read_now(&mut self, core: &Core, piece: &Piece, scratch: &mut AlignedBuffer) {
        match core.read_block(piece.logical_block, scratch) {
            Ok(()) => self.take(piece, scratch),
            Err(failure) => self.error = Some(failure),
        }
    }
}

impl TableLoad {
    /// Take the summary the walk expected (checked with `expects`) into the table;
    /// `false` if it does not decode after all.
    fn record(&mut self, core: &Core, block: &[u8]) -> bool {
        let Some(summary) = format::Summary::decode(block, &core.volume_uuid) else { return false };
        let walk = &self.walk;
        core.record_summary_checksums(&self.table, (&summary, walk.index()), format::block_checksum(block), &|index| {
            walk.position_of(&core.geometry, index)
        });
        self.walk.advance(&summary);
        true
    }
}

enum Plan {
    Served,
    /// Once the block's index page, being read through the ring, is in the map.
    WaitForPage {
        page: u64,
    },
    /// Once the segment's checksum table, being read through the ring, is in.
    WaitForTable {
        segment: u64,
    },
    Ring {
        position: u64,
        segment: u64,
        generation: u32,
        expected_checksum: u32,
        member: usize,
        device: Arc<dyn stripelog_blockdev::BlockDevice>,
        /// Where the block is on the member.
        offset_bytes: u64,
    },
}

/// A ring entry's tag: the queued read and its block.
fn ring_tag(read: usize, block: usize) -> u64 {
    ((read as u64) << 32) | block as u64
}

fn from_ring_tag(tag: u64) -> (usize, usize) {
    ((tag >> 32) as usize, (tag & u32::MAX as u64) as usize)
}
