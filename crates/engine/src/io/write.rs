//! The write path under the write lock: open the clients' batch (and its cold partner),
//! accept each block write into it, point the index at the new record, and move live
//! counts in the segment table. Everything a write needs from the members — the old
//! content of a partial block, its index pages — is read before the lock is taken
//! ([`Core::prepare_patch`], [`Core::load_pages_for`]) and checked again under it; a block
//! whose old content changed meanwhile, or whose index page left RAM, is given back to
//! the caller to prepare again ([`Accepted::Retry`]).

use super::read::ReadVersion;
use super::state::WriteState;
use super::Core;
use crate::error::Result;
use crate::index::map::Mapping;
use crate::layout::format::{self, Entry};
use crate::layout::geometry::BLOCK_SIZE_BYTES;
use crate::log::batch::{OpenBatch, PooledBuffers, SealedBatch, Slot};
use crate::log::{CurrentSegment, HOST_STREAM, METADATA_STREAM, STREAM_COUNT};
use crate::space::Purpose;
use crate::stats::Counters;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use stripelog_blockdev::AlignedBuffer;

/// One unit of work for the write loop, per logical block.
#[derive(Clone, Copy)]
pub(crate) enum BlockWrite<'a> {
    /// A whole block and its CRC32C (computed before the state lock is taken).
    Data(u64, &'a [u8], u32),
    /// A unit of whole blocks from a logical block, compressed before the state lock is
    /// taken: stored as one packed fragment (docs/compression.md).
    Compressed(CompressedUnit<'a>),
    /// A partial block: bytes `data` at `offset_bytes` inside logical block. Merged with
    /// the block's old content before the lock ([`Core::prepare_patch`]).
    Patch(u64, usize, &'a [u8]),
    /// A whole block and its CRC32C, proven equal (outside the state lock) to the content
    /// of a candidate: shared with it when the candidate is unchanged under the lock,
    /// written whole otherwise (docs/deduplication.md). The last field: the block's LZ4
    /// fragment when it compressed, compressed before the lock for the case where it
    /// becomes a new shared copy (decision 11).
    Duplicate(u64, &'a [u8], u32, super::deduplication::Candidate, Option<&'a [u8]>),
    /// A whole block and its CRC32C, equal (compared before the state lock) to an
    /// earlier block of the same request, the last `u64` (docs/deduplication.md, "Paths"):
    /// shared with it when that block still holds the content under the lock, in memory;
    /// written whole otherwise. The last field as for `Duplicate`.
    Repeat(u64, &'a [u8], u32, u64, Option<&'a [u8]>),
    Zero(u64),
    Trim(u64),
}

impl BlockWrite<'_> {
    /// Whether it may store a block of data (a trim or zero record stores none).
    pub(crate) fn carries_data(&self) -> bool {
        match self {
            BlockWrite::Data(..)
            | BlockWrite::Compressed(_)
            | BlockWrite::Patch(..)
            | BlockWrite::Duplicate(..)
            | BlockWrite::Repeat(..) => true,
            BlockWrite::Zero(_) | BlockWrite::Trim(_) => false,
        }
    }

    /// The logical blocks it writes.
    pub(crate) fn logical_blocks(&self) -> std::ops::Range<u64> {
        let (first, count) = match *self {
            BlockWrite::Compressed(unit) => (unit.first_logical_block, unit.blocks() as u64),
            BlockWrite::Data(logical_block, ..)
            | BlockWrite::Duplicate(logical_block, ..)
            | BlockWrite::Repeat(logical_block, ..)
            | BlockWrite::Zero(logical_block)
            | BlockWrite::Trim(logical_block)
            | BlockWrite::Patch(logical_block, ..) => (logical_block, 1),
        };
        first..first + count
    }

    /// The logical blocks whose index pages accepting it reads: its own, and a
    /// duplicate's candidate's.
    fn blocks_looked_up(&self) -> impl Iterator<Item = u64> {
        let candidate = match *self {
            BlockWrite::Duplicate(_, _, _, candidate, _) => Some(candidate.logical_block),
            BlockWrite::Repeat(_, _, _, earlier, _) => Some(earlier),
            _ => None,
        };
        self.logical_blocks().chain(candidate)
    }
}

/// Whole consecutive blocks written together and their LZ4 fragment.
#[derive(Clone, Copy)]
pub(crate) struct CompressedUnit<'a> {
    pub first_logical_block: u64,
    /// The blocks, `n × 4096` bytes (1 ≤ n ≤ 4).
    pub data: &'a [u8],
    pub fragment: &'a [u8],
    /// `layout::packed::unit_checksum` of `data`.
    pub checksum: u32,
}

impl CompressedUnit<'_> {
    pub fn blocks(&self) -> u8 {
        (self.data.len() / BLOCK_SIZE_BYTES) as u8
    }
}

/// A partial block merged with its old content outside the write lock: the whole block it
/// becomes, how it is stored (zeros, compressed or whole), and the version of the old
/// content it was merged with (accepted only while that version is current).
pub(crate) struct MergedBlock {
    logical_block: u64,
    content: AlignedBuffer,
    fragment: Option<Vec<u8>>,
    version: ReadVersion,
}

/// What accepting a block write did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Accepted {
    /// It is in the open batch (or changed nothing).
    Done,
    /// The open batch (or the cold batch it must go to) is full: seal, then try again.
    Full,
    /// It needs what only a read can give, which is not done under the write lock:
    /// prepare it again outside the lock ([`Core::prepare_retry`]), then try again.
    Retry(Retry),
}

/// What a write needs again before it can be accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// The index page of this logical block is not in RAM.
    IndexPage(u64),
    /// The old content the partial block was merged with changed.
    Patch,
}

/// Why a client batch cannot be opened now.
pub(crate) enum OpenProblem {
    /// Every write buffer set is in use: wait for one.
    Buffers,
    /// Free segments are at the cleaner's reserve: clean (or fail) before going on.
    Space,
    /// Free segments are below the low watermark: clean one round, then go on.
    Cleaning,
}

/// Where a run of block writes stopped ([`Core::accept_run`]).
pub(crate) enum RunStop {
    /// Every block is accepted.
    Done,
    /// The batches sealed to make room, to dispatch once the lock is released.
    Sealed(Vec<Arc<SealedBatch>>),
    /// The open batch's segment had too few rows left for one entry: they were given up.
    SegmentRetired,
    /// Client data waits for the room kept for records to come back (the cleaner).
    WaitForRoom,
    /// The block at `next` needs preparing again outside the lock.
    Retry(Retry),
    /// `BLOCKS_PER_HOLD_MAXIMUM` blocks are accepted: the lock is let go before the rest
    /// (a large write does not hold the other writers and the cleaner off for long).
    Yield,
}

/// The most blocks one hold of the write lock accepts (a 1 MiB write takes four holds).
pub(crate) const BLOCKS_PER_HOLD_MAXIMUM: usize = 64;

/// Split the byte range `offset_bytes .. + length_bytes` into per-block pieces:
/// (logical block, offset inside it, range of the caller's buffer).
pub(crate) fn block_pieces(
    offset_bytes: u64,
    length_bytes: usize,
) -> impl Iterator<Item = (u64, usize, std::ops::Range<usize>)> {
    let block = BLOCK_SIZE_BYTES as u64;
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= length_bytes {
            return None;
        }
        let position = offset_bytes + done as u64;
        let within = (position % block) as usize;
        let count = (BLOCK_SIZE_BYTES - within).min(length_bytes - done);
        let piece = (position / block, within, done..done + count);
        done += count;
        Some(piece)
    })
}

impl Core {
    /// Merge a partial block write (bytes `data` at `within` in `logical_block`) with the
    /// block's content, read now, outside the write lock; compress the result when the
    /// volume compresses. Fails (before anything of the request is accepted) when the old
    /// content cannot be read.
    pub(crate) fn prepare_patch(&self, logical_block: u64, within: usize, data: &[u8]) -> Result<MergedBlock> {
        crate::write_lock::assert_not_held("merging a partial block");
        assert!(within + data.len() <= BLOCK_SIZE_BYTES, "a patch stays inside its block");
        let mut content = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        let version = {
            let _fence = self.read_fence();
            self.read_block_versioned(logical_block, &mut content)?
        };
        content[within..within + data.len()].copy_from_slice(data);
        let fragment =
            if format::is_all_zero(&content) { None } else { self.compression.compress(&self.counters, &content) };
        Ok(MergedBlock { logical_block, content, fragment, version })
    }

    /// Make `blocks`' index pages resident before the write lock is taken (a page load
    /// reads the members).
    pub(crate) fn load_pages_for(&self, blocks: &[BlockWrite]) -> Result<()> {
        for block in blocks {
            for logical_block in block.blocks_looked_up() {
                self.map.ensure_resident_for(logical_block)?;
            }
        }
        Ok(())
    }

    /// Prepare block `index` of `blocks` again after `retry` said what it needs.
    pub(crate) fn prepare_retry(
        &self,
        retry: Retry,
        blocks: &[BlockWrite],
        index: usize,
        merged: &mut [Option<MergedBlock>],
    ) -> Result<()> {
        match retry {
            Retry::IndexPage(logical_block) => self.map.ensure_resident_for(logical_block),
            Retry::Patch => {
                let BlockWrite::Patch(logical_block, within, data) = blocks[index] else {
                    unreachable!("only a partial block is merged");
                };
                merged[index] = Some(self.prepare_patch(logical_block, within, data)?);
                Ok(())
            }
        }
    }

    /// Accept `blocks[*next..]` into the clients' open batch (which the caller opened), in
    /// order, advancing `next`, until one does not fit or needs preparing again.
    /// `merged[i]`: block `i` merged, when it is a partial block.
    pub(crate) fn accept_run(
        &self,
        state: &mut WriteState,
        blocks: &[BlockWrite],
        merged: &[Option<MergedBlock>],
        next: &mut usize,
        purpose: Purpose,
    ) -> Result<RunStop> {
        assert!(state.log.open().is_some(), "a run is accepted into an open batch");
        assert!(*next < blocks.len(), "a run has a block to accept");
        let first = *next;
        while *next < blocks.len() {
            if *next - first == BLOCKS_PER_HOLD_MAXIMUM {
                return Ok(RunStop::Yield);
            }
            let block = &blocks[*next];
            if purpose == Purpose::Data && block.carries_data() && !state.data_may_enter_clients_segment() {
                // The clients' segment was opened from the records' room: data waits for
                // the cleaner to bring that room back, as at the reserve.
                return Ok(RunStop::WaitForRoom);
            }
            match self.accept(state, block, merged[*next].as_ref())? {
                Accepted::Done => *next += 1,
                Accepted::Retry(retry) => return Ok(RunStop::Retry(retry)),
                Accepted::Full if state.log.open().is_some_and(OpenBatch::is_empty) => {
                    // Too few rows left in the segment for even one entry: retire them.
                    self.retire_current_segment(state);
                    return Ok(RunStop::SegmentRetired);
                }
                // The clients' batch is full, or the cold one that the block must go to.
                Accepted::Full => return Ok(RunStop::Sealed(self.seal_clients(state))),
            }
        }
        Ok(RunStop::Done)
    }

    /// Open the clients' batch for a write carrying `purpose`; `Ok(true)` when it began a
    /// new segment.
    pub(crate) fn open_batch(
        &self,
        state: &mut WriteState,
        cleaned: bool,
        purpose: Purpose,
    ) -> std::result::Result<bool, OpenProblem> {
        assert!(state.log.open().is_none(), "one clients' batch open at a time");
        let sequence = state.log.next_sequence();
        let mut from_records_room = false;
        if state.log.current(HOST_STREAM).is_none() {
            let (low_watermark, _) = crate::space::watermarks(&self.geometry);
            let free = state.space.free_count();
            let data_floor = state.space.clients_floor(Purpose::Data);
            let pacer = self.cleaner.pacer();
            pacer.set_headroom(free, data_floor);
            if free <= state.space.clients_floor(purpose) {
                return Err(OpenProblem::Space);
            }
            // Records take the room kept for them: client data stays out of the segment
            // until that room is back.
            from_records_room = free <= data_floor;
            if free < crate::space::cleaner_thread_threshold(low_watermark, data_floor, pacer.window_segments())
                && self.cleaner.background()
            {
                self.cleaner.wake();
            } else if free < low_watermark && !cleaned && purpose == Purpose::Data {
                // (Records make room: a round on their path, on a full volume, could
                // end a segment short and take the very room they came for.)
                return Err(OpenProblem::Cleaning);
            }
        }
        let buffers: PooledBuffers = self.data_pool.try_take().ok_or(OpenProblem::Buffers)?;
        let new_segment = state.log.current(HOST_STREAM).is_none();
        if new_segment && !self.open_stream_segment(state, HOST_STREAM, sequence) {
            // Checked above: more than the cleaner's reserve is free.
            return Err(OpenProblem::Space);
        }
        let current = state.log.current_mut(HOST_STREAM).expect("set above");
        current.records_room |= from_records_room;
        let batch = self.batch_in(current, sequence, buffers, HOST_STREAM);
        let taken = state.log.take_sequence();
        assert_eq!(taken, sequence, "the clients' batch takes the next sequence");
        state.log.replace_open(Some(batch));
        Ok(new_segment)
    }

    /// Give every stream its reserved successor now (at open), while free segments are
    /// plentiful: a stream's first segment then takes one free segment, as every later one
    /// does, and the cleaner's reserve covers its first round too.
    pub(crate) fn reserve_stream_segments(&self, state: &mut WriteState) {
        for stream in 0..STREAM_COUNT {
            if state.log.reserved(stream).is_none() && !Self::reserve_successor(state, stream) {
                return;
            }
        }
    }

    /// Give `stream` a new current segment: the one it reserved (or, the first time, a free
    /// one), reserving a free one to follow it. `false` (nothing changed): the free list
    /// cannot give both, or only by taking the checkpoint's headroom (the metadata stream
    /// alone may).
    pub(super) fn open_stream_segment(&self, state: &mut WriteState, stream: usize, sequence: u64) -> bool {
        assert!(state.log.current(stream).is_none(), "stream {stream} has a current segment");
        let headroom = state.space.headroom_for(stream == METADATA_STREAM);
        let needed = headroom + if state.log.reserved(stream).is_some() { 1 } else { 2 };
        if state.space.free_count() < needed {
            return false;
        }
        let reserved = state.log.take_reserved(stream);
        let segment = state.space.start_current(reserved, stream, state.lifetimes.write_clock).expect("counted above");
        assert_eq!(self.rows_on_media(segment), 0, "segment {segment} starts a new use with no rows of its last one");
        let reserved_next = Self::reserve_successor(state, stream);
        assert!(reserved_next, "counted above: a successor is free");
        // Its checksums exist only here until its batches are sealed: pinned.
        let table = Arc::new(crate::index::checksums::ChecksumTable::new(self.geometry.blocks_per_segment()));
        self.checksums.insert(segment, table.clone(), true);
        state.current_checksums[stream] = Some((segment, table));
        state.log.start_current(
            stream,
            CurrentSegment { segment, next_row: 0, open_sequence: sequence, records_room: false },
        );
        self.members.segment_started(segment);
        true
    }

    /// Take the next free segment as `stream`'s reserved successor; `false`: none is free.
    fn reserve_successor(state: &mut WriteState, stream: usize) -> bool {
        let Some(segment) = state.space.take_free_as_reserved() else {
            return false;
        };
        assert!(
            (0..STREAM_COUNT).all(|other| state.log.reserved(other) != Some(segment)),
            "segment {segment} is reserved by two streams"
        );
        assert_eq!(
            state.log.streams_in(segment).next(),
            None,
            "segment {segment} is reserved while a stream's current"
        );
        state.log.set_reserved(stream, segment);
        true
    }

    /// A new batch at the next free row of a stream's current segment.
    pub(super) fn batch_in(
        &self,
        current: &CurrentSegment,
        sequence: u64,
        buffers: PooledBuffers,
        stream: usize,
    ) -> OpenBatch {
        let mut batch =
            OpenBatch::new(&self.geometry, sequence, current.segment, current.open_sequence, current.next_row, buffers);
        batch.stream = stream;
        batch
    }

    /// Accept one block into the open batch.
    pub(crate) fn accept(
        &self,
        state: &mut WriteState,
        block: &BlockWrite,
        merged: Option<&MergedBlock>,
    ) -> Result<Accepted> {
        // Every index page it looks at is in RAM (eviction needs this lock, so it stays).
        if let Some(missing) = block.blocks_looked_up().find(|&block| self.map.get_if_resident(block).is_none()) {
            return Ok(Accepted::Retry(Retry::IndexPage(missing)));
        }
        // A partial block is accepted (and logged) as the whole block or zero record it
        // became, when the content it was merged with is still the block's.
        let block = match *block {
            BlockWrite::Patch(logical_block, ..) => {
                let merged = merged.expect("a partial block is merged before it is accepted");
                assert_eq!(merged.logical_block, logical_block, "merged for this block");
                if !self.version_is_current(logical_block, &merged.version)? {
                    return Ok(Accepted::Retry(Retry::Patch));
                }
                match &merged.fragment {
                    _ if format::is_all_zero(&merged.content) => BlockWrite::Zero(logical_block),
                    Some(fragment) => BlockWrite::Compressed(CompressedUnit {
                        first_logical_block: logical_block,
                        data: &merged.content,
                        fragment,
                        checksum: crate::layout::packed::unit_checksum(&merged.content),
                    }),
                    None => BlockWrite::Data(logical_block, &merged.content, format::block_checksum(&merged.content)),
                }
            }
            whole => whole,
        };
        if self.touches_cold_batch(state, &block)? {
            // Only data goes into the cold batch, and a block's records must replay in
            // the order they were accepted: the pair is sealed first.
            return Ok(Accepted::Full);
        }
        let accepted = match block {
            BlockWrite::Data(logical_block, data, checksum) => {
                match self.accept_cold_data(state, logical_block, data, checksum)? {
                    Some(accepted) => accepted,
                    None => self.accept_data(state, logical_block, data, checksum, None),
                }
            }
            BlockWrite::Compressed(unit) => {
                let mask = (1u8 << unit.blocks()) - 1;
                self.accept_fragment(
                    state,
                    unit.first_logical_block,
                    unit.blocks(),
                    mask,
                    unit.fragment,
                    unit.checksum,
                    None,
                )
            }
            BlockWrite::Duplicate(logical_block, data, checksum, candidate, fragment) => {
                self.accept_duplicate(state, logical_block, data, checksum, candidate, fragment)?
            }
            BlockWrite::Repeat(logical_block, data, checksum, earlier, fragment) => {
                self.accept_repeat(state, logical_block, data, checksum, earlier, fragment)?
            }
            BlockWrite::Zero(logical_block) => self.accept_range(state, logical_block, false)?,
            BlockWrite::Trim(logical_block) => self.accept_range(state, logical_block, true)?,
            BlockWrite::Patch(..) => unreachable!("merged above"),
        };
        if !accepted {
            return Ok(Accepted::Full);
        }
        if let Some(rates) = state.write_rates.as_mut() {
            block.logical_blocks().for_each(|logical_block| rates.record(logical_block));
        }
        if self.active_write_log().is_some() {
            self.stage(state, &block);
        }
        self.fault_hook_accepted();
        Ok(Accepted::Done)
    }

    /// The test hook `OpenOptions::fault_panic_after_accepted_blocks`: a panic in the middle
    /// of the write path, the write lock held and a request half accepted.
    fn fault_hook_accepted(&self) {
        let countdown = &self.fault_panic_countdown;
        if countdown.load(Ordering::Relaxed) != u64::MAX && countdown.fetch_sub(1, Ordering::Relaxed) == 1 {
            panic!("fault hook: a panic in the write path with the write lock held");
        }
    }

    /// Whether a client write that is not whole-block data names a block whose current
    /// record is in the open cold batch.
    fn touches_cold_batch(&self, state: &WriteState, block: &BlockWrite) -> Result<bool> {
        if matches!(block, BlockWrite::Data(..) | BlockWrite::Patch(..)) || state.log.cold_with_entries().is_none() {
            return Ok(false);
        }
        for logical_block in block.blocks_looked_up() {
            if self.in_open_cold_batch(state, self.map.get(logical_block)?) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether the record `mapping` names is in the open cold batch.
    fn in_open_cold_batch(&self, state: &WriteState, mapping: Mapping) -> bool {
        let Some(cold) = state.log.cold_with_entries() else {
            return false;
        };
        match mapping {
            Mapping::Data { position } => {
                let location = self.geometry.locate(position);
                location.segment == cold.segment && location.row >= cold.first_row
            }
            // Only data goes into the cold batch.
            Mapping::Unmapped
            | Mapping::Zero { .. }
            | Mapping::Trimmed { .. }
            | Mapping::Fragment { .. }
            | Mapping::Shared { .. } => false,
        }
    }

    /// Accept a client's data block into the cold batch when it goes there: its region is
    /// cold, or its current record is in the cold batch (its next one must not come
    /// before it). `None`: it goes into the clients' batch; `Some(false)`: the cold batch
    /// is full and the block must go there — the pair is to be sealed first.
    fn accept_cold_data(
        &self,
        state: &mut WriteState,
        logical_block: u64,
        data: &[u8],
        checksum: u32,
    ) -> Result<Option<bool>> {
        let Some(rates) = state.write_rates.as_mut() else {
            return Ok(None);
        };
        let predicted_cold = rates.is_cold(logical_block);
        if !predicted_cold && state.log.cold_with_entries().is_none() {
            return Ok(None);
        }
        let mapping = self.map.get(logical_block)?;
        let bound_to_cold = self.in_open_cold_batch(state, mapping);
        // A block that refers to a shared-block record stays in the clients' batch: the
        // cold batch never frees a record, which the clients' batch of the same pair
        // could take again and which replay would then see born before it dies.
        let goes_cold = bound_to_cold
            || (predicted_cold && !matches!(mapping, Mapping::Shared { .. }) && self.open_cold_batch(state));
        if !goes_cold {
            return Ok(None);
        }
        let clients_sequence = state.log.open().map(|open| open.sequence);
        let cold_sequence = state.log.cold().map(|cold| cold.sequence);
        assert_eq!(cold_sequence, clients_sequence, "a cold batch carries its pair's first sequence");
        state.log.swap_open_and_cold();
        let accepted = self.accept_data(state, logical_block, data, checksum, None);
        state.log.swap_open_and_cold();
        assert!(
            state.log.open().is_some_and(|open| open.stream == HOST_STREAM && !open.relocation),
            "the clients' batch is back in its place"
        );
        if !accepted && state.log.cold().is_some_and(OpenBatch::is_empty) {
            state.log.replace_cold(None);
        }
        if accepted {
            Counters::add(&self.counters.blocks_written_cold, 1);
        }
        // Full: the pair is sealed first, rather than the block going into the clients'
        // batch while the cold batch's segment ends (it then goes into the new clients'
        // batch all the same, as the first block of a batch never goes cold — but the
        // rest of that batch's cold blocks go to the next cold batch).
        Ok(match (accepted, state.log.cold().is_some()) {
            (true, _) => Some(true),
            (false, true) => Some(false),
            (false, false) => None,
        })
    }

    /// Make sure the cold batch is open (`false`: it cannot be now). It opens only beside a
    /// clients' batch that holds entries, so that a pair's first batch is never empty, and
    /// never takes the free segments the cleaner keeps in reserve.
    fn open_cold_batch(&self, state: &mut WriteState) -> bool {
        if state.log.cold().is_some() {
            return true;
        }
        let Some(sequence) = state
            .log
            .open()
            .filter(|open| !open.relocation && !open.metadata && !open.is_empty())
            .map(|open| open.sequence)
        else {
            return false;
        };
        let stream = crate::log::COLD_CLIENT_STREAM;
        let data_columns = self.geometry.data_columns() as u32;
        if state
            .log
            .current(stream)
            .is_some_and(|current| (self.geometry.rows_per_chunk() - current.next_row) * data_columns < 2)
        {
            self.retire_stream_segment(state, stream);
        }
        let opens_a_segment = state.log.current(stream).is_none();
        if opens_a_segment
            && (state.space.free_count() <= state.space.clients_floor(Purpose::Data) + 1
                || !self.open_stream_segment(state, stream, u64::MAX))
        {
            return false;
        }
        assert!(
            !opens_a_segment || state.space.free_count() >= state.space.clients_floor(Purpose::Data),
            "a cold batch never opens a segment below the clients' floor"
        );
        let Some(buffers) = self.data_pool.try_take() else {
            return false;
        };
        let current = state.log.current(stream).expect("opened above");
        let batch = self.batch_in(current, sequence, buffers, stream);
        state.log.replace_cold(Some(batch));
        true
    }

    /// Stage an accepted client write (a whole block, or a zero or trim record) for the
    /// write log, in acceptance order, with the batch it went into.
    fn stage(&self, state: &mut WriteState, block: &BlockWrite) {
        use crate::layout::write_log::{LogEntry, LogEntryKind};
        let batch_sequence = state.log.accepting_sequence();
        // (Mount skips the records of durable batches: the write would be lost.)
        assert!(batch_sequence > state.log.durable_through(), "a write is staged with a batch not yet durable");
        assert!(
            state.log.open().is_some_and(|open| !open.relocation && !open.metadata),
            "only a client's write is staged, with the clients' batch"
        );
        let (logical_block, kind, checksum, data) = match *block {
            BlockWrite::Compressed(unit) => {
                // The log holds whole blocks: each block of the unit is staged as one.
                for (place, data) in unit.data.chunks_exact(BLOCK_SIZE_BYTES).enumerate() {
                    let checksum = format::block_checksum(data);
                    self.stage(state, &BlockWrite::Data(unit.first_logical_block + place as u64, data, checksum));
                }
                return;
            }
            BlockWrite::Data(logical_block, data, checksum)
            | BlockWrite::Duplicate(logical_block, data, checksum, ..)
            | BlockWrite::Repeat(logical_block, data, checksum, ..) => {
                (logical_block, LogEntryKind::Data, checksum, Some(data))
            }
            BlockWrite::Zero(logical_block) => (logical_block, LogEntryKind::Zero, 0, None),
            BlockWrite::Trim(logical_block) => (logical_block, LogEntryKind::Trim, 0, None),
            BlockWrite::Patch(..) => unreachable!("a partial block is staged as the block it merged into"),
        };
        state.log_staging.push(LogEntry { batch_sequence, logical_block, kind, checksum }, data);
        self.staged_entries.store(state.log_staging.len(), Ordering::Relaxed);
    }

    /// Accept a data block into the open batch (`false`: full). `relocated`: the block's
    /// lifetime class and write clock, kept when the cleaner moves it; a client's block
    /// gets its class from the version it replaces.
    pub(super) fn accept_data(
        &self,
        state: &mut WriteState,
        logical_block: u64,
        data: &[u8],
        checksum: u32,
        relocated: Option<(u8, u64)>,
    ) -> bool {
        debug_assert_eq!(checksum, format::block_checksum(data));
        assert_eq!(
            relocated.is_some(),
            state.log.open().is_some_and(|open| open.relocation),
            "block {logical_block}: relocated blocks go into relocation batches, clients' into theirs"
        );
        let lifetime_class = relocated.map_or(format::LIFETIME_CLASS_UNKNOWN, |(class, _)| class);
        let entry = Entry::Data { logical_block, checksum, lifetime_class };
        let Some(position) = self.append_block(state, data, checksum, entry) else {
            return false;
        };
        if let Some((_, clock)) = relocated {
            let open = state.log.open_batch();
            open.oldest_clock = open.oldest_clock.min(clock);
        }
        self.remap(state, logical_block, Mapping::Data { position });
        true
    }

    /// Accept a client block proven equal to `candidate`'s content (docs/deduplication.md,
    /// "Paths"): when the candidate is unchanged — the same mapping, its content still
    /// where it was compared — `logical_block` refers to the candidate's shared copy (a
    /// reference entry), or, when the candidate is not shared yet, the block is written as
    /// the copy of a new record that both refer to — as `fragment` (its LZ4 form) when it
    /// compressed and the volume stores compressed copies (decision 11). Otherwise it is
    /// written whole. A block rewritten with its own content changes nothing. `Ok(false)`:
    /// the batch is full.
    fn accept_duplicate(
        &self,
        state: &mut WriteState,
        logical_block: u64,
        data: &[u8],
        checksum: u32,
        candidate: super::deduplication::Candidate,
        fragment: Option<&[u8]>,
    ) -> Result<bool> {
        let counters = &self.deduplication.as_ref().expect("a finder found the candidate").counters;
        assert!(
            state.log.open().is_some_and(|open| !open.relocation && !open.metadata),
            "block {logical_block}: a duplicate is a client's write"
        );
        let unchanged = self.map.get(candidate.logical_block)? == candidate.mapping
            && self.generation(self.geometry.locate(candidate.position).segment) == candidate.generation;
        let shared_record = match candidate.mapping {
            Mapping::Shared { record } => {
                let current = self.shared.read().get(record);
                match current {
                    Some(current) if unchanged && current.position == candidate.position => {
                        if current.references >= crate::space::shared::REFERENCES_MAXIMUM {
                            counters.duplicates_over_bound.fetch_add(1, Ordering::Relaxed);
                            return Ok(self.accept_data(state, logical_block, data, checksum, None));
                        }
                        Some(record)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if !unchanged || (matches!(candidate.mapping, Mapping::Shared { .. }) && shared_record.is_none()) {
            // The candidate changed since it was compared — often because an earlier
            // block of the same or a concurrent request shared it: its copy, when still
            // in memory, is compared now instead.
            if let Some(record) = self.shared_copy_equal_in_memory(state, candidate.logical_block, data)? {
                return Ok(self.add_reference(state, logical_block, record, counters));
            }
            counters.duplicates_lost_to_races.fetch_add(1, Ordering::Relaxed);
            return Ok(self.accept_data(state, logical_block, data, checksum, None));
        }
        if candidate.logical_block == logical_block {
            // Its own content again: already accepted.
            counters.blocks_shared.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        if let Some(record) = shared_record {
            return Ok(self.add_reference(state, logical_block, record, counters));
        }
        assert_eq!(
            candidate.mapping.position(),
            Some(candidate.position),
            "block {}: a candidate not yet shared was compared where it is mapped",
            candidate.logical_block
        );
        if let Some(fragment) = fragment {
            // (`Volume::store` compresses a copy only on a volume with feature bit 6.)
            assert!(self.geometry.compressed_shared_copies, "block {logical_block}: a compressed copy needs bit 6");
            return Ok(self.accept_compressed_copy(state, logical_block, data, fragment, candidate.logical_block));
        }
        let open = state.log.open_batch();
        // The first duplicate: the block becomes the copy of a new record, which the
        // candidate and the block refer to (the candidate's old copy dies).
        let Some(index) = open.reserve_entries(1, 3) else {
            return Ok(false);
        };
        open.block_mut(index).copy_from_slice(data);
        let position = self.record_checksum(state, index, checksum);
        let record = self.shared.write().allocate(position, None);
        let open = state.log.open_batch();
        open.push_entry(Entry::SharedCopy {
            record,
            checksum,
            lifetime_class: format::LIFETIME_CLASS_UNKNOWN,
            moved: false,
        });
        let copy = crate::space::shared::SharedRecord { position, references: 0, fragment: None };
        self.share_new_copy(state, record, copy, candidate.logical_block, logical_block);
        Ok(true)
    }

    /// Record `record`, just born with its copy `copy` in the open batch (whose summary
    /// has room for two more entries), is shared by `candidate` (the copy's former owner)
    /// and `logical_block`: their two reference entries, the copy counted live in its
    /// segment, both blocks remapped to it.
    fn share_new_copy(
        &self,
        state: &mut WriteState,
        record: u64,
        copy: crate::space::shared::SharedRecord,
        candidate: u64,
        logical_block: u64,
    ) {
        assert_eq!(
            self.shared.read().get(record),
            Some(copy),
            "record {record} was just born with this copy and no reference"
        );
        let open = state.log.open_batch();
        open.push_entry(Entry::Reference { record, logical_block: candidate });
        open.push_entry(Entry::Reference { record, logical_block });
        let segment = copy.position / self.geometry.blocks_per_segment();
        state.space.add_live(segment, copy.live_units(self.geometry.live_units_per_block()));
        self.remap(state, candidate, Mapping::Shared { record });
        self.remap(state, logical_block, Mapping::Shared { record });
        let counters = &self.deduplication.as_ref().expect("a finder found the candidate").counters;
        counters.blocks_shared.fetch_add(1, Ordering::Relaxed);
    }

    /// The first duplicate of `candidate` (a logical block whose own block or fragment
    /// holds `data`, unchanged under this lock): `data`'s LZ4 form `fragment` becomes the
    /// copy of a new record — a fragment keyed by the record, its kind-15 entry and the
    /// two references in one summary — and both blocks refer to it (`false`: the batch is
    /// full, nothing changed).
    fn accept_compressed_copy(
        &self,
        state: &mut WriteState,
        logical_block: u64,
        data: &[u8],
        fragment: &[u8],
        candidate: u64,
    ) -> bool {
        use crate::log::batch::FragmentOwner;
        let counters = &self.deduplication.as_ref().expect("a finder found the candidate").counters;
        let checksum = crate::layout::packed::unit_checksum(data);
        let sixteenths = crate::layout::packed::sixteenths(fragment.len(), 1);
        // The record's number is its fragment's key: taken before the fragment is placed,
        // allocated once it is (no other writer runs: this is the write lock).
        let mut shared = self.shared.write();
        let record = shared.next_record();
        let owner = FragmentOwner::Record { record, moved: false, entries_after: 2 };
        let key = crate::space::shared::fragment_key(record);
        let Some(position) = self.place_fragment(
            state,
            key,
            1,
            1,
            fragment,
            checksum,
            format::LIFETIME_CLASS_UNKNOWN,
            sixteenths,
            owner,
        ) else {
            return false;
        };
        assert_eq!(shared.allocate(position, Some(sixteenths)), record, "the record its fragment is keyed by");
        drop(shared);
        let copy = crate::space::shared::SharedRecord { position, references: 0, fragment: Some(sixteenths) };
        self.share_new_copy(state, record, copy, candidate, logical_block);
        counters.copies_compressed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Accept `data` for `logical_block`, equal to what `earlier` (a block of the same
    /// request, accepted before it) was given: shared with it when `earlier` still holds
    /// that content — its whole block or its shared copy, compared here in memory (the
    /// open batch, a batch being written, the cache) — and written whole otherwise
    /// (`false`: the batch is full). `fragment` as for [`Core::accept_duplicate`].
    fn accept_repeat(
        &self,
        state: &mut WriteState,
        logical_block: u64,
        data: &[u8],
        checksum: u32,
        earlier: u64,
        fragment: Option<&[u8]>,
    ) -> Result<bool> {
        assert_ne!(logical_block, earlier, "a block repeats another block of its request");
        let counters = &self.deduplication.as_ref().expect("a finder paired the blocks").counters;
        let mapping = self.map.get(earlier)?;
        let shared = match mapping {
            Mapping::Shared { .. } => {
                self.shared_copy_equal_in_memory(state, earlier, data)?.map(|record| (record, None))
            }
            Mapping::Data { position } => {
                let mut content = [0u8; BLOCK_SIZE_BYTES];
                let in_memory =
                    matches!(self.position_from_memory(position, &mut content, Some(state)), super::Lookup::Served);
                (in_memory && content[..] == *data).then_some((0, Some(position)))
            }
            Mapping::Fragment { .. } | Mapping::Unmapped | Mapping::Zero { .. } | Mapping::Trimmed { .. } => None,
        };
        let Some((record, position)) = shared else {
            counters.duplicates_lost_to_races.fetch_add(1, Ordering::Relaxed);
            return Ok(self.accept_data(state, logical_block, data, checksum, None));
        };
        counters.duplicates_within_requests.fetch_add(1, Ordering::Relaxed);
        match position {
            None => Ok(self.add_reference(state, logical_block, record, counters)),
            // Its whole block, unchanged under this lock: the first duplicate's path.
            Some(position) => {
                let segment = self.geometry.locate(position).segment;
                let candidate = super::deduplication::Candidate {
                    logical_block: earlier,
                    mapping,
                    position,
                    generation: self.generation(segment),
                };
                self.accept_duplicate(state, logical_block, data, checksum, candidate, fragment)
            }
        }
    }

    /// `logical_block` refers to `record` from now on: a kind-11 entry (`false`: the batch
    /// is full).
    fn add_reference(
        &self,
        state: &mut WriteState,
        logical_block: u64,
        record: u64,
        counters: &super::deduplication::DeduplicationCounters,
    ) -> bool {
        let open = state.log.open_batch();
        assert!(
            !open.relocation && !open.metadata && open.stream == HOST_STREAM,
            "block {logical_block}: a reference is a client's write into the clients' batch"
        );
        if open.reserve(false).is_none() {
            return false;
        }
        open.push_entry(Entry::Reference { record, logical_block });
        self.remap(state, logical_block, Mapping::Shared { record });
        counters.blocks_shared.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The record `logical_block` now refers to, when it has room for one more reference
    /// and its copy, still in memory (the open batch, a batch being written, the cache),
    /// equals `data` byte for byte.
    fn shared_copy_equal_in_memory(&self, state: &WriteState, logical_block: u64, data: &[u8]) -> Result<Option<u64>> {
        let Mapping::Shared { record } = self.map.get(logical_block)? else {
            return Ok(None);
        };
        let Some(copy) = self.shared.read().get(record) else {
            return Ok(None);
        };
        if copy.references >= crate::space::shared::REFERENCES_MAXIMUM {
            return Ok(None);
        }
        let mut content = [0u8; BLOCK_SIZE_BYTES];
        let in_memory = match copy.fragment {
            None => {
                matches!(self.position_from_memory(copy.position, &mut content, Some(state)), super::Lookup::Served)
            }
            Some(_) => self.fragment_from_memory(
                state,
                copy.position,
                crate::space::shared::fragment_key(record),
                &mut content,
            ),
        };
        Ok((in_memory && content[..] == *data).then_some(record))
    }

    /// The block keyed `key` of the fragment starting in the packed block at `position`,
    /// decompressed into `out` and proven by its unit checksum, when that packed block and
    /// the ones it continues into are all in memory (`false` otherwise).
    fn fragment_from_memory(&self, state: &WriteState, position: u64, key: u64, out: &mut [u8]) -> bool {
        let mut start = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        if !matches!(self.position_from_memory(position, &mut start, Some(state)), super::Lookup::Served) {
            return false;
        }
        let Ok((entries, index)) = crate::layout::packed::find(&start, key) else {
            return false;
        };
        let mut following = Vec::new();
        for after in 1..=crate::layout::packed::following_blocks(&entries, index) as u64 {
            let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
            if !matches!(self.position_from_memory(position + after, &mut block, Some(state)), super::Lookup::Served) {
                return false;
            }
            following.push(block);
        }
        crate::layout::packed::extract(&start, &entries, index, &following, key, out).is_ok()
    }

    /// The cleaner moves shared-block record `record`'s copy (`data`, CRC32C `checksum`)
    /// into the open relocation batch (`false`: full): a kind-12 entry, the record's new
    /// position, the live count moved from the old copy's segment to the new one.
    pub(super) fn accept_moved_copy(
        &self,
        state: &mut WriteState,
        record: u64,
        data: &[u8],
        checksum: u32,
        relocated: (u8, u64),
    ) -> bool {
        assert!(state.log.open().is_some_and(|open| open.relocation), "record {record}: only the cleaner moves a copy");
        let Some(old) = self.shared.read().get(record) else {
            return true; // freed meanwhile: nothing to move
        };
        assert_eq!(old.fragment, None, "record {record}: a whole copy is moved as one");
        let entry = Entry::SharedCopy { record, checksum, lifetime_class: relocated.0, moved: true };
        let Some(position) = self.append_block(state, data, checksum, entry) else {
            return false;
        };
        self.copy_moved(state, record, old, position, relocated.1);
        true
    }

    /// Record `record`'s copy `old` was moved by the cleaner to `position` in the open
    /// relocation batch (oldest write clock `clock`): the record names it, and its live
    /// units move from the old segment to the new one.
    fn copy_moved(
        &self,
        state: &mut WriteState,
        record: u64,
        old: crate::space::shared::SharedRecord,
        position: u64,
        clock: u64,
    ) {
        let per_segment = self.geometry.blocks_per_segment();
        assert_ne!(
            old.position / per_segment,
            position / per_segment,
            "record {record}: a copy moves out of its (victim) segment"
        );
        let open = state.log.open_batch();
        open.oldest_clock = open.oldest_clock.min(clock);
        self.shared.write().moved(record, position, old.fragment);
        if let Some(finder) = &self.deduplication {
            finder.counters.copies_moved.fetch_add(1, Ordering::Relaxed);
            if old.fragment.is_some() {
                finder.counters.compressed_copies_moved.fetch_add(1, Ordering::Relaxed);
            }
        }
        state.space.add_live(position / per_segment, old.live_units(self.geometry.live_units_per_block()));
        self.release_copy(state, old);
    }

    /// Copy `copy` of a shared-block record died (its last reference went, or it moved):
    /// its segment's live count goes down by what it counted (a whole copy's cache entry
    /// goes; a packed block stays cached, as its other fragments may still be live).
    fn release_copy(&self, state: &mut WriteState, copy: crate::space::shared::SharedRecord) {
        match copy.fragment {
            None => self.release_units(state, copy.position, self.geometry.live_units_per_block()),
            Some(share) => {
                Self::release_segment_units(state, copy.position / self.geometry.blocks_per_segment(), share as u64)
            }
        }
    }

    /// The cleaner moves shared-block record `record`'s copy, a fragment (`fragment` as
    /// stored, unit checksum `checksum`), into the open relocation batch (`false`: full):
    /// a moved kind-15 entry, the record's new position, its share moved from the old
    /// packed block's segment to the new one.
    pub(super) fn accept_moved_compressed_copy(
        &self,
        state: &mut WriteState,
        record: u64,
        fragment: &[u8],
        checksum: u32,
        relocated: (u8, u64),
    ) -> bool {
        use crate::log::batch::FragmentOwner;
        assert!(state.log.open().is_some_and(|open| open.relocation), "record {record}: only the cleaner moves a copy");
        let Some(old) = self.shared.read().get(record) else {
            return true; // freed meanwhile: nothing to move
        };
        let sixteenths = old.fragment.expect("a fragment copy is moved as one");
        let owner = FragmentOwner::Record { record, moved: true, entries_after: 0 };
        let key = crate::space::shared::fragment_key(record);
        let Some(position) = self.place_fragment(state, key, 1, 1, fragment, checksum, relocated.0, sixteenths, owner)
        else {
            return false;
        };
        self.copy_moved(state, record, old, position, relocated.1);
        true
    }

    /// `units` live units at `position` died: its segment's count goes down (waiting for
    /// the killing batch to be durable when it reaches zero), its cache entry goes.
    fn release_units(&self, state: &mut WriteState, position: u64, units: u64) {
        assert!(
            state.log.open().is_some(),
            "position {position}: a block dies only by a record the open batch accepts"
        );
        if let Some(cache) = &self.cache {
            // Its cache entry goes when the batch is written (member workers), or now when
            // the batch already names too many.
            match state.log.open_mut() {
                Some(open) if open.killed_positions.len() < crate::log::batch::KILLED_POSITIONS_MAXIMUM => {
                    open.killed_positions.push(position)
                }
                _ => cache.forget(position),
            }
        }
        Self::release_segment_units(state, position / self.geometry.blocks_per_segment(), units);
    }

    /// `units` live units of `segment` died, killed by the batch accepting now.
    fn release_segment_units(state: &mut WriteState, segment: u64, units: u64) {
        let killer = state.log.accepting_sequence();
        assert!(
            killer > state.log.last_sealed_sequence(),
            "segment {segment}: its units die by batch {killer}, which is sealed already"
        );
        state.space.remove_live(segment, units, killer);
    }

    /// Accept a fragment — the LZ4 form of the unit of `blocks` logical blocks from
    /// `first_logical_block`, with unit checksum `checksum` — into the open batch's packed
    /// blocks, mapping the blocks in `mask` to it (`false`: the batch is full). `relocated`
    /// as for [`Core::accept_data`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn accept_fragment(
        &self,
        state: &mut WriteState,
        first_logical_block: u64,
        blocks: u8,
        mask: u8,
        fragment: &[u8],
        checksum: u32,
        relocated: Option<(u8, u64)>,
    ) -> bool {
        assert!(mask != 0 && mask >> blocks == 0, "the blocks served are among the unit's");
        let lifetime_class = relocated.map_or(format::LIFETIME_CLASS_UNKNOWN, |(class, _)| class);
        // Shared among the blocks it serves now: what the segment holds for them.
        let sixteenths = crate::layout::packed::sixteenths(fragment.len(), mask.count_ones() as usize);
        let owner = crate::log::batch::FragmentOwner::Blocks;
        let Some(position) = self.place_fragment(
            state,
            first_logical_block,
            blocks,
            mask,
            fragment,
            checksum,
            lifetime_class,
            sixteenths,
            owner,
        ) else {
            return false;
        };
        if let Some((_, clock)) = relocated {
            let open = state.log.open_batch();
            open.oldest_clock = open.oldest_clock.min(clock);
        }
        for place in (0..blocks as u64).filter(|place| mask & (1 << place) != 0) {
            self.remap(state, first_logical_block + place, Mapping::Fragment { position, sixteenths });
        }
        true
    }

    /// Put a fragment into the open batch's packed blocks (`OpenBatch::append_fragment`)
    /// and record the checksums of the packed blocks it touched: the position of the one
    /// it starts in, or `None` when the batch is full (nothing changed).
    #[allow(clippy::too_many_arguments)]
    fn place_fragment(
        &self,
        state: &mut WriteState,
        key: u64,
        blocks: u8,
        mask: u8,
        fragment: &[u8],
        checksum: u32,
        lifetime_class: u8,
        sixteenths: u8,
        owner: crate::log::batch::FragmentOwner,
    ) -> Option<u64> {
        let open = state.log.open_batch();
        let placed = open.append_fragment(key, blocks, mask, fragment, checksum, lifetime_class, sixteenths, owner)?;
        let mut position = None;
        for (index, block_checksum) in placed.touched {
            let recorded = self.record_checksum(state, index, block_checksum);
            if index == placed.start_index {
                position = Some(recorded);
            }
        }
        Some(position.expect("a fragment touches the packed block it starts in"))
    }

    /// Put `block` in the open batch's next data slot, described by `entry`, and record its
    /// checksum for its position: the position, or `None` when the batch is full.
    pub(super) fn append_block(
        &self,
        state: &mut WriteState,
        block: &[u8],
        checksum: u32,
        entry: Entry,
    ) -> Option<u64> {
        assert!(entry.has_block(), "an entry appended with a block describes one: {entry:?}");
        assert_eq!(entry.block_checksum(), Some(checksum), "the entry records the checksum its position proves");
        let open = state.log.open_batch();
        let Some(Slot::Block(index)) = open.reserve(true) else {
            return None;
        };
        open.block_mut(index).copy_from_slice(block);
        open.push_entry(entry);
        Some(self.record_checksum(state, index, checksum))
    }

    /// Record `checksum` for the position of batch index `index` of the open batch (in its
    /// segment's table, which readers of the members verify with): its position.
    fn record_checksum(&self, state: &mut WriteState, index: u32, checksum: u32) -> u64 {
        let open = state.log.open().expect("an open batch");
        let (row, column) = open.place(index);
        assert_eq!(open.index_of(open.first_row + row, column), Some(index), "only a reserved index gets a checksum");
        let position = self.geometry.position(open.segment, open.first_row + row, column);
        let segment = open.segment;
        let offset = position % self.geometry.blocks_per_segment();
        assert!(
            matches!(&state.current_checksums[open.stream], Some((current, _)) if *current == segment),
            "segment {segment}: the open batch's checksums go into its stream's table"
        );
        match &state.current_checksums[open.stream] {
            Some((current, table)) if *current == segment => table.set(offset, checksum),
            _ => self.current_table(segment).set(offset, checksum),
        }
        position
    }

    fn accept_range(&self, state: &mut WriteState, logical_block: u64, trim: bool) -> Result<bool> {
        assert!(
            state.log.open().is_some_and(|open| !open.relocation && !open.metadata),
            "block {logical_block}: a client's zero or trim goes into the clients' batch"
        );
        // (`get` would load it: member I/O under the write lock.)
        assert!(
            self.map.get_if_resident(logical_block).is_some(),
            "block {logical_block}: its index page is in RAM under the write lock"
        );
        let current = self.map.get(logical_block)?;
        let redundant = match current {
            Mapping::Unmapped => true,
            Mapping::Trimmed { .. } => true,
            Mapping::Zero { .. } => !trim,
            Mapping::Data { .. } | Mapping::Fragment { .. } | Mapping::Shared { .. } => false,
        };
        if redundant {
            return Ok(true);
        }
        Ok(self.record_range(state, logical_block, trim))
    }

    /// Add a zero or trim record for `logical_block` to the open batch (`false`: full).
    pub(super) fn record_range(&self, state: &mut WriteState, logical_block: u64, trim: bool) -> bool {
        let open = state.log.open_batch();
        assert!(!open.metadata, "block {logical_block}: a checkpoint's batch carries no zero or trim record");
        assert!(
            open.relocation || open.stream == HOST_STREAM,
            "block {logical_block}: a client's zero or trim record goes into the clients' batch, never the cold one"
        );
        let segment = open.segment;
        if !open.extend_last_range(!trim, logical_block) {
            if open.reserve(false).is_none() {
                return false;
            }
            open.push_entry(if trim {
                Entry::Trim { logical_block, block_count: 1 }
            } else {
                Entry::Zero { logical_block, block_count: 1 }
            });
        }
        let mapping = if trim { Mapping::Trimmed { segment } } else { Mapping::Zero { segment } };
        self.remap(state, logical_block, mapping);
        true
    }

    /// Point `logical_block` at `mapping`, keeping segment live counts. Its index page is
    /// in RAM: callers looked the block up under the write lock they still hold.
    fn remap(&self, state: &mut WriteState, logical_block: u64, mapping: Mapping) {
        let per_segment = self.geometry.blocks_per_segment();
        let old = self
            .map
            .set(logical_block, mapping)
            .expect("the index page is in RAM: looked up under the write lock, which eviction needs");
        if let Some(open) = state.log.open_mut().filter(|open| !open.relocation) {
            // The old version lived since its segment's oldest clock (no per-block time).
            if let (Mapping::Data { .. } | Mapping::Fragment { .. }, Some(segment)) =
                (mapping, old.segment(per_segment))
            {
                let class = state.lifetimes.class_since(state.space.usage(segment).opened_clock());
                open.set_last_lifetime_class(logical_block, class);
            }
            state.lifetimes.write_clock += 1;
        }
        if let Some(segment) = mapping.segment(per_segment) {
            assert!(
                state.log.open().is_some_and(|open| open.segment == segment),
                "block {logical_block}: mapped into segment {segment}, not the batch accepting it"
            );
            state.space.add_live(segment, mapping.live_units(&self.geometry));
        }
        if let Mapping::Shared { record } = mapping {
            // Callers checked it is in use and under the bound, under this lock.
            let added = self.shared.write().add_reference(record);
            assert!(added.is_ok(), "record {record}: {added:?}");
        }
        if let Mapping::Shared { record } = old {
            let freed = {
                let mut shared = self.shared.write();
                assert!(
                    shared.get(record).is_some_and(|copy| copy.references > 0),
                    "block {logical_block} referred to record {record}, which counts it"
                );
                shared.remove_reference(record)
            };
            if let Some(copy) = freed {
                self.release_copy(state, copy);
            }
        }
        // (A packed block stays cached: its other fragments may still be live.)
        match old {
            Mapping::Data { position } => self.release_units(state, position, old.live_units(&self.geometry)),
            Mapping::Fragment { .. } | Mapping::Zero { .. } | Mapping::Trimmed { .. } => {
                let segment = old.segment(per_segment).expect("a fragment or a record lies in a segment");
                Self::release_segment_units(state, segment, old.live_units(&self.geometry));
            }
            Mapping::Unmapped | Mapping::Shared { .. } => {}
        }
    }

    /// Give up the rest of the current segment (and the empty open batch in it).
    fn retire_current_segment(&self, state: &mut WriteState) {
        let open = state.log.replace_open(None).expect("an open batch");
        assert!(open.is_empty(), "only an empty batch is dropped");
        assert_eq!(open.sequence, state.log.next_sequence() - 1, "the dropped batch holds the sequence given back");
        state.log.give_back_sequence();
        self.retire_stream_segment(state, HOST_STREAM);
    }

    /// If `segment` is some stream's current segment, give up the rest of it (the clients'
    /// open batch is sealed first when it is there) so that it can be cleaned. Gives back
    /// the batches it sealed, in sequence order, for the caller to dispatch once the state
    /// lock is released (inline, a dispatch takes it to account the write).
    #[must_use = "the sealed batches must be dispatched"]
    pub(crate) fn retire_if_current(&self, state: &mut WriteState, segment: u64) -> Vec<Arc<SealedBatch>> {
        let in_a_client_batch = [state.log.open(), state.log.cold()]
            .into_iter()
            .any(|batch| batch.is_some_and(|batch| batch.segment == segment && !batch.is_empty()));
        let mut sealed = if in_a_client_batch { self.seal_clients(state) } else { Vec::new() };
        let streams: Vec<usize> = state.log.streams_in(segment).collect();
        for stream in streams {
            if state.log.open().is_some_and(|open| open.stream == stream) {
                if state.log.open().is_some_and(|open| !open.is_empty()) {
                    sealed.push(self.seal(state));
                } else {
                    state.log.replace_open(None);
                    state.log.give_back_sequence();
                }
            }
            self.retire_stream_segment(state, stream);
        }
        // (The log and the table agree: it can be cleaned now.)
        assert_ne!(
            state.space.usage(segment).status(),
            crate::space::SegmentStatus::Current,
            "segment {segment} is left once retired"
        );
        sealed
    }

    /// Give up the rest of a stream's current segment.
    pub(super) fn retire_stream_segment(&self, state: &mut WriteState, stream: usize) {
        if let Some(current) = state.log.take_current(stream) {
            assert!(
                [state.log.open(), state.log.cold()]
                    .into_iter()
                    .flatten()
                    .all(|batch| batch.segment != current.segment),
                "segment {}: a stream gives up its segment with no open batch left in it",
                current.segment
            );
            let table = state.current_checksums[stream].take();
            assert!(
                table.is_some_and(|(segment, _)| segment == current.segment),
                "stream {stream}'s checksum table is its segment's"
            );
            self.checksums.unpin(current.segment);
            // An empty segment waits for every batch that may have killed its blocks: the
            // open one too, which holds the latest sequence given out.
            let killer = state.log.next_sequence().saturating_sub(1).max(state.log.last_sealed_sequence());
            state.space.leave_current(current.segment, killer);
        }
    }

    /// Whether `version` — what a read outside the lock found for `logical_block` — is
    /// still its content: the same mapping, its content at the same position, in a
    /// segment of the same generation. The block's index page is in RAM.
    pub(super) fn version_is_current(&self, logical_block: u64, version: &ReadVersion) -> Result<bool> {
        if self.map.get(logical_block)? != version.mapping {
            return Ok(false);
        }
        let position = self.content_position(version.mapping);
        Ok(position == version.position
            && position.is_none_or(|position| {
                self.generation(position / self.geometry.blocks_per_segment()) == version.generation
            }))
    }
}
