//! Layer 6: `Core`, everything the threads of one open volume share, with the read path
//! (memory, the block cache, the members) and the write path that ties the lower layers
//! together: accept a record into the log's open batch, point the index at it, count it
//! in the segment table, seal, dispatch, make durable, release dead segments.
//!
//! Threads and locks (see ARCHITECTURE.md):
//! - Client threads accept writes into the open batch under `state` (the order writes
//!   are accepted in is the order of the log).
//! - Sealed batches go to the log's pipeline (a stripe writer and one worker per member),
//!   which reports each written batch back through [`BatchSink`]. In `IoMode::Inline`
//!   (the deterministic simulation) the calling thread writes them itself.
//! - Lock order: `reuse_fence` before `state`. Readers hold `reuse_fence` for reading
//!   while they look up and read blocks; a segment is only made reusable under
//!   `reuse_fence` for writing, so no reader can be reading a segment being reused.

pub(crate) mod cache;
pub(crate) mod compression;
pub(crate) mod deduplication;
pub(crate) mod read_queue;

use crate::array::members::{Members, ReadPurpose};
use crate::error::{Error, ReadFailure, Result, Shutdown};
use crate::index::checksums::{ChecksumCache, ChecksumTable};
use crate::index::lifetimes::Lifetimes;
use crate::index::map::{BlockMap, Mapping};
use crate::layout::format::{self, Entry};
use crate::layout::geometry::{Geometry, BLOCK_SIZE_BYTES};
use crate::log::batch::{BufferPool, OpenBatch, PooledBuffers, SealedBatch, Slot};
use crate::log::{CurrentSegment, InFlight, IoMode, LogState, HOST_STREAM, METADATA_STREAM, STREAM_COUNT};
use crate::space::{Purpose, SegmentTable};
use crate::stats::{Counters, RecoveryReport};
use parking_lot::{Condvar, Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stripelog_blockdev::AlignedBuffer;

/// Requests are accepted at 512-byte granularity (sub-block writes merge in memory).
pub const SECTOR_SIZE_BYTES: u64 = 512;
/// A reader that finds a shared-block record freed reads the map again this many times
/// (a writer replaced the block meanwhile) before it reports the record as holding nothing.
const SHARED_RESOLVE_ATTEMPTS: usize = 4;

/// The state every writer changes under `Core::state`, one part per layer.
pub(crate) struct WriteState {
    pub(crate) log: LogState,
    pub(crate) space: SegmentTable,
    pub(crate) lifetimes: Lifetimes,
    /// Per stream: its current segment and that segment's checksum table (also pinned in
    /// the cache), so that accepting a block costs no cache lookup under the lock.
    pub(crate) current_checksums: [Option<(u64, Arc<ChecksumTable>)>; STREAM_COUNT],
    /// Client writes accepted since the last append to the write log (empty without one).
    pub(crate) log_staging: crate::write_log::Staging,
    /// Which client writes are cold (volumes with feature bit 5 whose streams are
    /// separated; `None`: every client write goes into the clients' batch).
    pub(crate) write_rates: Option<crate::index::lifetimes::WriteRates>,
}

impl WriteState {
    /// Client writes carrying `purpose` can go on: their segment is open (for data, one
    /// not opened from the records' room, or with that room back), or a free one lies
    /// above their floor (`SegmentTable::clients_floor`).
    pub(crate) fn has_room_for_clients(&self, purpose: Purpose) -> bool {
        match &self.log.current_segments[HOST_STREAM] {
            Some(current) => purpose == Purpose::Records || !current.records_room || self.records_room_is_free(),
            None => self.space.free_count() > self.space.clients_floor(purpose),
        }
    }

    /// The room kept for records is free: a free segment lies above the cleaner's reserve.
    fn records_room_is_free(&self) -> bool {
        self.space.free_count() > self.space.clients_floor(Purpose::Records)
    }

    /// Whether client data may go into the clients' current segment now: it was not
    /// opened from the room kept for records, or that room is back, which ends the
    /// segment's mark.
    pub(crate) fn data_may_enter_clients_segment(&mut self) -> bool {
        let room_back = self.records_room_is_free();
        match &mut self.log.current_segments[HOST_STREAM] {
            Some(current) if current.records_room => {
                current.records_room = !room_back;
                room_back
            }
            _ => true,
        }
    }
}

/// Everything the threads of one volume share.
pub(crate) struct Core {
    pub(crate) geometry: Geometry,
    pub(crate) volume_uuid: [u8; 16],
    pub(crate) epoch: u64,
    pub(crate) read_only: bool,
    pub(crate) members: Arc<Members>,
    pub(crate) map: BlockMap,
    /// CRC32C of every data-space position of every written batch.
    pub(crate) checksums: ChecksumCache,
    /// Per segment: rows whose batches are on the members (reads below go to members).
    pub(crate) rows_on_media: Vec<AtomicU32>,
    /// Per segment: bumped each time it is released (cache entries of older generations
    /// never match).
    pub(crate) generations: Vec<AtomicU32>,
    pub(crate) cache: Option<crate::io::cache::BlockCache>,
    pub(crate) reuse_fence: RwLock<()>,
    pub(crate) state: Mutex<WriteState>,
    pub(crate) progress: Condvar,
    pub(crate) data_pool: Arc<BufferPool>,
    /// One rebuild (or replacement) at a time.
    pub(crate) rebuild_lock: Mutex<()>,
    /// Threaded volumes clean in a thread of their own (`cleaner::background_cleaner`):
    /// client writes wake it below the low watermark instead of cleaning themselves.
    pub(crate) background_cleaning: bool,
    pub(crate) cleaner_wakeup: Condvar,
    pub(crate) cleaner_stop: AtomicBool,
    /// The cleaner thread's last round found nothing to gain: writers at the reserve
    /// stop waiting for it and look for space themselves (or report `OutOfSpace`).
    pub(crate) cleaner_gains_nothing: AtomicBool,
    /// Segments cleaning rounds have emptied less the free segments they took to relocate
    /// into, since the volume opened: the cleaner's own net gain, which client writes do
    /// not move (`cleaner::ProgressWindow`).
    pub(crate) cleaning_net_segments: AtomicI64,
    /// Client writes paced to what the cleaner thread frees (`space::pacing`).
    pub(crate) pacer: crate::space::pacing::WritePacer,
    pub(crate) parity_pool: Arc<BufferPool>,
    /// Sealed batches the write pipeline may hold (the parity pool's sets; each member's
    /// queue bound): how far a slow member may lag.
    pub(crate) write_queue_batches: usize,
    /// Sets of the data pool: one per sealed batch the pipeline may hold, one for the
    /// clients' open batch and, with client write pairs (feature bit 5), one for the cold
    /// batch. The stripe queue holds as many, so that a dispatch never blocks.
    pub(crate) data_sets: usize,
    pub(crate) stripe_queue: Mutex<Option<crate::queue::Sender<crate::log::pipeline::PipelineJob>>>,
    pub(crate) io_mode: IoMode,
    pub(crate) flush_interval: Option<Duration>,
    /// Since this open (shared with `members`, which persists them at every superblock
    /// update on top of the lifetime counters before).
    pub(crate) counters: Arc<Counters>,
    pub(crate) closed: AtomicBool,
    pub(crate) recovery_report: RecoveryReport,
    /// The checkpoint writer's state; held while a checkpoint is written (one at a time).
    pub(crate) checkpoint: Mutex<crate::index::directory::CheckpointState>,
    pub(crate) checkpoint_interval: Duration,
    /// The write log, when the volume has one (docs/write-log.md).
    pub(crate) write_log: Option<Arc<crate::write_log::WriteLog>>,
    /// Entries in `WriteState::log_staging` (read without the state lock).
    pub(crate) staged_entries: std::sync::atomic::AtomicUsize,
    /// Whether client blocks are compressed, and the share the CPU affords.
    pub(crate) compression: compression::Compression,
    /// On a thinly provisioned volume: the last use threshold warned of (0, 80, 90, 95 %).
    pub(crate) thin_warned_percent: std::sync::atomic::AtomicU8,
    /// The shared-block table (volumes with deduplication; empty otherwise). Changed under
    /// `state` (lock order: `reuse_fence`, `state`, `shared`); readers resolve a record
    /// under the reuse fence alone, and a freed record is reused only after the fence has
    /// been passed (`reclaim`).
    pub(crate) shared: RwLock<crate::space::shared::SharedTable>,
    /// The finder of duplicates (volumes created with deduplication).
    pub(crate) deduplication: Option<deduplication::Deduplication>,
}

/// What [`Core::begin_side_batch`] gives back.
pub(crate) struct SideBatch {
    /// The clients' open batch (empty), to be put back by [`Core::end_side_batch`].
    pub(crate) client: Option<OpenBatch>,
    /// Free segments taken for the side batch's stream.
    pub(crate) taken: usize,
    /// The clients' batches sealed ahead of the side batch (a pair at most): dispatched
    /// first, in order, once the state lock is released.
    pub(crate) sealed_clients: Vec<Arc<SealedBatch>>,
}

/// One unit of work for the write loop, per logical block.
#[derive(Clone, Copy)]
pub(crate) enum BlockWrite<'a> {
    /// A whole block and its CRC32C (computed before the state lock is taken).
    Data(u64, &'a [u8], u32),
    /// A unit of whole blocks from a logical block, compressed before the state lock is
    /// taken: stored as one packed fragment (docs/compression.md).
    Compressed(CompressedUnit<'a>),
    /// A partial block: bytes `data` at `offset_bytes` inside logical block.
    Patch(u64, usize, &'a [u8]),
    /// A whole block and its CRC32C, proven equal (outside the state lock) to the content
    /// of a candidate: shared with it when the candidate is unchanged under the lock,
    /// written whole otherwise (docs/deduplication.md).
    Duplicate(u64, &'a [u8], u32, deduplication::Candidate),
    Zero(u64),
    Trim(u64),
}

impl BlockWrite<'_> {
    /// Whether it may store a block of data (a trim or zero record stores none).
    pub(crate) fn carries_data(&self) -> bool {
        !matches!(self, BlockWrite::Zero(_) | BlockWrite::Trim(_))
    }

    /// The logical blocks it writes.
    fn logical_blocks(&self) -> std::ops::Range<u64> {
        let (first, count) = match *self {
            BlockWrite::Compressed(unit) => (unit.first_logical_block, unit.blocks() as u64),
            BlockWrite::Data(logical_block, ..)
            | BlockWrite::Duplicate(logical_block, ..)
            | BlockWrite::Zero(logical_block)
            | BlockWrite::Trim(logical_block)
            | BlockWrite::Patch(logical_block, ..) => (logical_block, 1),
        };
        first..first + count
    }
}

/// A fragment as read from the members: its start block, its table, its index there, and
/// the blocks it continues into, every one proven by its position's checksum.
pub(crate) struct StoredFragment {
    pub start: AlignedBuffer,
    pub entries: Vec<crate::layout::packed::FragmentEntry>,
    pub index: usize,
    pub following: Vec<AlignedBuffer>,
}

impl StoredFragment {
    /// `logical_block` (one the fragment serves) decompressed into `out`, proven.
    pub fn extract(
        &self,
        logical_block: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), crate::layout::packed::PackedProblem> {
        crate::layout::packed::extract(&self.start, &self.entries, self.index, &self.following, logical_block, out)
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

/// Why a client batch cannot be opened now.
pub(crate) enum OpenProblem {
    /// Every write buffer set is in use: wait for one.
    Buffers,
    /// Free segments are at the cleaner's reserve: clean (or fail) before going on.
    Space,
    /// Free segments are below the low watermark: clean one round, then go on.
    Cleaning,
}

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
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        self.check_open()?;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.members.check_running()?;
        Ok(())
    }

    pub(crate) fn check_range(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        if !offset_bytes.is_multiple_of(SECTOR_SIZE_BYTES) || !length_bytes.is_multiple_of(SECTOR_SIZE_BYTES) {
            return Err(Error::InvalidRequest(format!(
                "offset {offset_bytes} and length {length_bytes} must be multiples of {SECTOR_SIZE_BYTES}"
            )));
        }
        let size = self.map.block_count() * BLOCK_SIZE_BYTES as u64;
        match offset_bytes.checked_add(length_bytes) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::InvalidRequest(format!(
                "range {offset_bytes}+{length_bytes} is beyond the end of the volume ({size} bytes)"
            ))),
        }
    }

    /// An error of flushing or releasing the members stops the volume: recorded as its
    /// shutdown reason and returned as `ShutDown`.
    pub(crate) fn stop_on_error<T>(&self, result: Result<T>) -> Result<T> {
        result.map_err(|error| {
            let reason = Shutdown::Members(Arc::new(error));
            self.fail(reason.clone());
            Error::ShutDown(reason)
        })
    }

    pub(crate) fn fail(&self, reason: Shutdown) {
        let mut failure = self.members.shutdown.lock();
        if failure.is_none() {
            *failure = Some(reason);
        }
        drop(failure);
        // Wake flushers waiting for batches that will never complete.
        let _state = self.state.lock();
        self.progress.notify_all();
    }

    /// Open the clients' batch for a write carrying `purpose`; `Ok(true)` when it began a
    /// new segment.
    pub(crate) fn open_batch(
        &self,
        state: &mut WriteState,
        cleaned: bool,
        purpose: Purpose,
    ) -> std::result::Result<bool, OpenProblem> {
        let sequence = state.log.next_sequence;
        let mut from_records_room = false;
        if state.log.current_segments[HOST_STREAM].is_none() {
            let (low_watermark, _) = crate::space::watermarks(&self.geometry);
            let free = state.space.free_count();
            let data_floor = state.space.clients_floor(Purpose::Data);
            self.pacer.set_headroom(free, data_floor);
            if free <= state.space.clients_floor(purpose) {
                return Err(OpenProblem::Space);
            }
            // Records take the room kept for them: client data stays out of the segment
            // until that room is back.
            from_records_room = free <= data_floor;
            if free < crate::space::cleaner_thread_threshold(low_watermark, data_floor, self.pacer.window_segments())
                && self.background_cleaning
            {
                self.cleaner_wakeup.notify_one();
            } else if free < low_watermark && !cleaned && purpose == Purpose::Data {
                // (Records make room: a round on their path, on a full volume, could
                // end a segment short and take the very room they came for.)
                return Err(OpenProblem::Cleaning);
            }
        }
        let buffers: PooledBuffers = self.data_pool.try_take().ok_or(OpenProblem::Buffers)?;
        let new_segment = state.log.current_segments[HOST_STREAM].is_none();
        if new_segment && !self.open_stream_segment(state, HOST_STREAM, sequence) {
            // Checked above: more than the cleaner's reserve is free.
            return Err(OpenProblem::Space);
        }
        let current = state.log.current_segments[HOST_STREAM].as_mut().expect("set above");
        current.records_room |= from_records_room;
        state.log.open = Some(self.batch_in(current, sequence, buffers, HOST_STREAM));
        state.log.next_sequence += 1;
        Ok(new_segment)
    }

    /// Give every stream its reserved successor now (at open), while free segments are
    /// plentiful: a stream's first segment then takes one free segment, as every later one
    /// does, and the cleaner's reserve covers its first round too.
    pub(crate) fn reserve_stream_segments(&self, state: &mut WriteState) {
        for stream in 0..STREAM_COUNT {
            if state.log.reserved_segments[stream].is_none() && !Self::reserve_successor(state, stream) {
                return;
            }
        }
    }

    /// Give `stream` a new current segment: the one it reserved (or, the first time, a free
    /// one), reserving a free one to follow it. `false` (nothing changed): the free list
    /// cannot give both, or only by taking the checkpoint's headroom (the metadata stream
    /// alone may).
    pub(crate) fn open_stream_segment(&self, state: &mut WriteState, stream: usize, sequence: u64) -> bool {
        let headroom = state.space.headroom_for(stream == METADATA_STREAM);
        let needed = headroom + if state.log.reserved_segments[stream].is_some() { 1 } else { 2 };
        if state.space.free_count() < needed {
            return false;
        }
        let reserved = state.log.reserved_segments[stream].take();
        let segment = state.space.start_current(reserved, stream, state.lifetimes.write_clock).expect("counted above");
        Self::reserve_successor(state, stream);
        self.start_stream_segment(state, stream, segment, sequence);
        true
    }

    /// Take the next free segment as `stream`'s reserved successor; `false`: none is free.
    fn reserve_successor(state: &mut WriteState, stream: usize) -> bool {
        let Some(segment) = state.space.take_free_as_reserved() else {
            return false;
        };
        state.log.reserved_segments[stream] = Some(segment);
        true
    }

    /// Make `segment`, which the segment table made current, the current segment of
    /// `stream` in the log.
    fn start_stream_segment(&self, state: &mut WriteState, stream: usize, segment: u64, sequence: u64) {
        // Its checksums exist only here until its batches are sealed: pinned.
        let table = Arc::new(ChecksumTable::new(self.geometry.blocks_per_segment()));
        self.checksums.insert(segment, table.clone(), true);
        state.current_checksums[stream] = Some((segment, table));
        state.log.current_segments[stream] =
            Some(CurrentSegment { segment, next_row: 0, open_sequence: sequence, records_room: false });
        self.members.segment_started(segment);
    }

    /// A new batch at the next free row of a stream's current segment.
    pub(crate) fn batch_in(
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

    /// The generation of `segment` (bumped each time it is released).
    pub(crate) fn generation(&self, segment: u64) -> u32 {
        self.generations[segment as usize].load(Ordering::Acquire)
    }

    /// Accept one block into the open batch. `Ok(false)`: the batch is full.
    pub(crate) fn accept(&self, state: &mut WriteState, block: &BlockWrite) -> Result<bool> {
        // A partial block is merged with its old content first, and accepted (and logged)
        // as the whole block or zero record it becomes.
        let merged;
        let merged_fragment;
        let block = match *block {
            BlockWrite::Patch(logical_block, within, data) => {
                let mut buffer = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                self.read_block(logical_block, &mut buffer, Some(state))?;
                buffer[within..within + data.len()].copy_from_slice(data);
                merged = buffer;
                if format::is_all_zero(&merged) {
                    BlockWrite::Zero(logical_block)
                } else {
                    merged_fragment = self.compression.compress(&self.counters, &merged);
                    match &merged_fragment {
                        Some(fragment) => BlockWrite::Compressed(CompressedUnit {
                            first_logical_block: logical_block,
                            data: &merged,
                            fragment,
                            checksum: crate::layout::packed::unit_checksum(&merged),
                        }),
                        None => BlockWrite::Data(logical_block, &merged, format::block_checksum(&merged)),
                    }
                }
            }
            whole => whole,
        };
        if self.touches_cold_batch(state, &block)? {
            // Only data goes into the cold batch, and a block's records must replay in
            // the order they were accepted: the pair is sealed first.
            return Ok(false);
        }
        let accepted = match block {
            BlockWrite::Data(logical_block, data, checksum) => {
                // The block's index page in RAM before the batch changes: it stays there
                // while the state lock is held (eviction takes it too), so `remap` cannot fail.
                self.map.ensure_resident_for(logical_block)?;
                match self.accept_cold_data(state, logical_block, data, checksum)? {
                    Some(accepted) => accepted,
                    None => self.accept_data(state, logical_block, data, checksum, None),
                }
            }
            BlockWrite::Compressed(unit) => {
                for place in 0..unit.blocks() as u64 {
                    self.map.ensure_resident_for(unit.first_logical_block + place)?;
                }
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
            BlockWrite::Duplicate(logical_block, data, checksum, candidate) => {
                self.map.ensure_resident_for(logical_block)?;
                self.map.ensure_resident_for(candidate.logical_block)?;
                self.accept_duplicate(state, logical_block, data, checksum, candidate)?
            }
            BlockWrite::Zero(logical_block) => self.accept_range(state, logical_block, false)?,
            BlockWrite::Trim(logical_block) => self.accept_range(state, logical_block, true)?,
            BlockWrite::Patch(..) => unreachable!("merged above"),
        };
        if accepted {
            if let Some(rates) = state.write_rates.as_mut() {
                block.logical_blocks().for_each(|logical_block| rates.record(logical_block));
            }
        }
        if accepted && self.write_log.as_ref().is_some_and(|log| log.is_active()) {
            self.stage(state, &block);
        }
        Ok(accepted)
    }

    /// Whether a client write that is not whole-block data names a block whose current
    /// record is in the open cold batch.
    fn touches_cold_batch(&self, state: &WriteState, block: &BlockWrite) -> Result<bool> {
        let candidate = match *block {
            BlockWrite::Data(..) | BlockWrite::Patch(..) => return Ok(false),
            BlockWrite::Duplicate(_, _, _, candidate) => Some(candidate.logical_block),
            _ => None,
        };
        if state.log.cold.as_ref().is_none_or(OpenBatch::is_empty) {
            return Ok(false);
        }
        for logical_block in block.logical_blocks().chain(candidate) {
            if self.in_open_cold_batch(state, self.map.get(logical_block)?) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether the record `mapping` names is in the open cold batch.
    fn in_open_cold_batch(&self, state: &WriteState, mapping: Mapping) -> bool {
        let Some(cold) = state.log.cold.as_ref().filter(|cold| !cold.is_empty()) else {
            return false;
        };
        match mapping {
            Mapping::Data { position } => {
                let location = self.geometry.locate(position);
                location.segment == cold.segment && location.row >= cold.first_row
            }
            // Only data goes into the cold batch.
            _ => false,
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
        let cold_holds_entries = state.log.cold.as_ref().is_some_and(|cold| !cold.is_empty());
        if !predicted_cold && !cold_holds_entries {
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
        std::mem::swap(&mut state.log.open, &mut state.log.cold);
        let accepted = self.accept_data(state, logical_block, data, checksum, None);
        std::mem::swap(&mut state.log.open, &mut state.log.cold);
        if !accepted && state.log.cold.as_ref().is_some_and(OpenBatch::is_empty) {
            state.log.cold = None;
        }
        if accepted {
            Counters::add(&self.counters.blocks_written_cold, 1);
        }
        // Full: the pair is sealed first, rather than the block going into the clients'
        // batch while the cold batch's segment ends (it then goes into the new clients'
        // batch all the same, as the first block of a batch never goes cold — but the
        // rest of that batch's cold blocks go to the next cold batch).
        Ok(match (accepted, state.log.cold.is_some()) {
            (true, _) => Some(true),
            (false, true) => Some(false),
            (false, false) => None,
        })
    }

    /// Make sure the cold batch is open (`false`: it cannot be now). It opens only beside a
    /// clients' batch that holds entries, so that a pair's first batch is never empty, and
    /// never takes the free segments the cleaner keeps in reserve.
    fn open_cold_batch(&self, state: &mut WriteState) -> bool {
        if state.log.cold.is_some() {
            return true;
        }
        let Some(sequence) = state
            .log
            .open
            .as_ref()
            .filter(|open| !open.relocation && !open.metadata && !open.is_empty())
            .map(|open| open.sequence)
        else {
            return false;
        };
        let stream = crate::log::COLD_CLIENT_STREAM;
        let data_columns = self.geometry.data_columns() as u32;
        if state.log.current_segments[stream]
            .as_ref()
            .is_some_and(|current| (self.geometry.rows_per_chunk() - current.next_row) * data_columns < 2)
        {
            self.retire_stream_segment(state, stream);
        }
        if state.log.current_segments[stream].is_none()
            && (state.space.free_count() <= state.space.clients_floor(Purpose::Data) + 1
                || !self.open_stream_segment(state, stream, u64::MAX))
        {
            return false;
        }
        let Some(buffers) = self.data_pool.try_take() else {
            return false;
        };
        let current = state.log.current_segments[stream].as_ref().expect("opened above");
        state.log.cold = Some(self.batch_in(current, sequence, buffers, stream));
        true
    }

    /// Seal the clients' batch and the cold batch: the clients' one alone, or, when the
    /// cold one holds entries too, both as a pair (docs/crash-consistency.md, "Client
    /// writes in two streams"), under this one hold of the state lock. The sealed batches,
    /// in sequence order, to be dispatched in that order.
    pub(crate) fn seal_clients(&self, state: &mut WriteState) -> Vec<Arc<SealedBatch>> {
        let mut sealed = Vec::with_capacity(2);
        let cold = state.log.cold.take().filter(|cold| !cold.is_empty());
        let clients_hold_entries = state.log.open.as_ref().is_some_and(|open| !open.is_empty());
        let Some(mut cold) = cold else {
            if clients_hold_entries {
                sealed.push(self.seal(state));
            }
            return sealed;
        };
        let cold_sequence = if clients_hold_entries {
            state.log.open.as_mut().expect("holds entries").paired_with_next = true;
            sealed.push(self.seal(state));
            Counters::add(&self.counters.client_batch_pairs, 1);
            state.log.next_sequence += 1;
            state.log.next_sequence - 1
        } else {
            // Not reached (the cold batch opens beside entries, which stay): the empty
            // clients' batch moves up, and the cold one takes its sequence.
            debug_assert!(false, "a cold batch with entries beside an empty clients' batch");
            self.move_client_batch_up(state)
        };
        cold.sequence = cold_sequence;
        let current = state.log.current_segments[cold.stream].as_mut().expect("the cold batch's segment");
        if current.open_sequence == u64::MAX {
            current.open_sequence = cold_sequence;
        }
        cold.segment_open_sequence = current.open_sequence;
        let clients = state.log.open.replace(cold);
        sealed.push(self.seal(state));
        state.log.open = clients;
        sealed
    }

    /// Stage an accepted client write (a whole block, or a zero or trim record) for the
    /// write log, in acceptance order, with the batch it went into.
    fn stage(&self, state: &mut WriteState, block: &BlockWrite) {
        use crate::layout::write_log::{LogEntry, LogEntryKind};
        let batch_sequence = state.log.open.as_ref().map_or(state.log.next_sequence, |open| open.sequence);
        if let BlockWrite::Compressed(unit) = block {
            // The log holds whole blocks: each block of the unit is staged as one.
            for (place, data) in unit.data.chunks_exact(BLOCK_SIZE_BYTES).enumerate() {
                self.stage(
                    state,
                    &BlockWrite::Data(unit.first_logical_block + place as u64, data, format::block_checksum(data)),
                );
            }
            return;
        }
        let (logical_block, kind, checksum, data) = match *block {
            BlockWrite::Data(logical_block, data, checksum)
            | BlockWrite::Duplicate(logical_block, data, checksum, _) => {
                (logical_block, LogEntryKind::Data, checksum, Some(data))
            }
            BlockWrite::Compressed(_) => unreachable!("staged block by block above"),
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
    pub(crate) fn accept_data(
        &self,
        state: &mut WriteState,
        logical_block: u64,
        data: &[u8],
        checksum: u32,
        relocated: Option<(u8, u64)>,
    ) -> bool {
        debug_assert_eq!(checksum, format::block_checksum(data));
        let lifetime_class = relocated.map_or(format::LIFETIME_CLASS_UNKNOWN, |(class, _)| class);
        let entry = Entry::Data { logical_block, checksum, lifetime_class };
        let Some(position) = self.append_block(state, data, checksum, entry) else {
            return false;
        };
        if let Some((_, clock)) = relocated {
            let open = state.log.open.as_mut().expect("an open batch");
            open.oldest_clock = open.oldest_clock.min(clock);
        }
        self.remap(state, logical_block, Mapping::Data { position });
        true
    }

    /// Accept a client block proven equal to `candidate`'s content (docs/deduplication.md,
    /// "Paths"): when the candidate is unchanged — the same mapping, its content still
    /// where it was compared — `logical_block` refers to the candidate's shared copy (a
    /// reference entry), or, when the candidate is not shared yet, the block is written as
    /// the copy of a new record that both refer to. Otherwise it is written whole. A block
    /// rewritten with its own content changes nothing. `Ok(false)`: the batch is full.
    pub(crate) fn accept_duplicate(
        &self,
        state: &mut WriteState,
        logical_block: u64,
        data: &[u8],
        checksum: u32,
        candidate: deduplication::Candidate,
    ) -> Result<bool> {
        let counters = &self.deduplication.as_ref().expect("a finder found the candidate").counters;
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
        let open = state.log.open.as_mut().expect("an open batch");
        // The first duplicate: the block becomes the copy of a new record, which the
        // candidate and the block refer to (the candidate's old copy dies).
        let Some(index) = open.reserve_entries(1, 3) else {
            return Ok(false);
        };
        open.block_mut(index).copy_from_slice(data);
        let position = self.record_checksum(state, index, checksum);
        let record = self.shared.write().allocate(position);
        let open = state.log.open.as_mut().expect("an open batch");
        open.push_entry(Entry::SharedCopy {
            record,
            checksum,
            lifetime_class: format::LIFETIME_CLASS_UNKNOWN,
            moved: false,
        });
        open.push_entry(Entry::Reference { record, logical_block: candidate.logical_block });
        open.push_entry(Entry::Reference { record, logical_block });
        let segment = position / self.geometry.blocks_per_segment();
        state.space.add_live(segment, self.geometry.live_units_per_block());
        self.remap(state, candidate.logical_block, Mapping::Shared { record });
        self.remap(state, logical_block, Mapping::Shared { record });
        counters.blocks_shared.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// `logical_block` refers to `record` from now on: a kind-11 entry (`false`: the batch
    /// is full).
    fn add_reference(
        &self,
        state: &mut WriteState,
        logical_block: u64,
        record: u64,
        counters: &deduplication::DeduplicationCounters,
    ) -> bool {
        let open = state.log.open.as_mut().expect("an open batch");
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
        let equal = matches!(self.position_from_memory(copy.position, &mut content, Some(state)), Lookup::Served)
            && content[..] == *data;
        Ok(equal.then_some(record))
    }

    /// The cleaner moves shared-block record `record`'s copy (`data`, CRC32C `checksum`)
    /// into the open relocation batch (`false`: full): a kind-12 entry, the record's new
    /// position, the live count moved from the old copy's segment to the new one.
    pub(crate) fn accept_moved_copy(
        &self,
        state: &mut WriteState,
        record: u64,
        data: &[u8],
        checksum: u32,
        relocated: (u8, u64),
    ) -> bool {
        let old = match self.shared.read().get(record) {
            Some(current) => current.position,
            None => return true, // freed meanwhile: nothing to move
        };
        let entry = Entry::SharedCopy { record, checksum, lifetime_class: relocated.0, moved: true };
        let Some(position) = self.append_block(state, data, checksum, entry) else {
            return false;
        };
        let open = state.log.open.as_mut().expect("an open batch");
        open.oldest_clock = open.oldest_clock.min(relocated.1);
        self.shared.write().moved(record, position);
        if let Some(finder) = &self.deduplication {
            finder.counters.copies_moved.fetch_add(1, Ordering::Relaxed);
        }
        let per_segment = self.geometry.blocks_per_segment();
        state.space.add_live(position / per_segment, self.geometry.live_units_per_block());
        self.release_units(state, old, self.geometry.live_units_per_block());
        true
    }

    /// `units` live units at `position` died: its segment's count goes down (waiting for
    /// the killing batch to be durable when it reaches zero), its cache entry goes.
    fn release_units(&self, state: &mut WriteState, position: u64, units: u64) {
        if let Some(cache) = &self.cache {
            // Its cache entry goes when the batch is written (member workers), or now when
            // the batch already names too many.
            match state.log.open.as_mut() {
                Some(open) if open.killed_positions.len() < crate::log::batch::KILLED_POSITIONS_MAXIMUM => {
                    open.killed_positions.push(position)
                }
                _ => cache.forget(position),
            }
        }
        self.release_segment_units(state, position / self.geometry.blocks_per_segment(), units);
    }

    /// `units` live units of `segment` died (see [`Core::release_units`]).
    fn release_segment_units(&self, state: &mut WriteState, segment: u64, units: u64) {
        let killer = state.log.open.as_ref().map_or(state.log.next_sequence, |open| open.sequence);
        state.space.remove_live(segment, units, killer);
    }

    /// Accept a fragment — the LZ4 form of the unit of `blocks` logical blocks from
    /// `first_logical_block`, with unit checksum `checksum` — into the open batch's packed
    /// blocks, mapping the blocks in `mask` to it (`false`: the batch is full). `relocated`
    /// as for [`Core::accept_data`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accept_fragment(
        &self,
        state: &mut WriteState,
        first_logical_block: u64,
        blocks: u8,
        mask: u8,
        fragment: &[u8],
        checksum: u32,
        relocated: Option<(u8, u64)>,
    ) -> bool {
        let lifetime_class = relocated.map_or(format::LIFETIME_CLASS_UNKNOWN, |(class, _)| class);
        // Shared among the blocks it serves now: what the segment holds for them.
        let sixteenths = crate::layout::packed::sixteenths(fragment.len(), mask.count_ones() as usize);
        let open = state.log.open.as_mut().expect("an open batch");
        let Some(placed) =
            open.append_fragment(first_logical_block, blocks, mask, fragment, checksum, lifetime_class, sixteenths)
        else {
            return false;
        };
        let mut position = 0;
        for (index, block_checksum) in placed.touched {
            let recorded = self.record_checksum(state, index, block_checksum);
            if index == placed.start_index {
                position = recorded;
            }
        }
        if let Some((_, clock)) = relocated {
            let open = state.log.open.as_mut().expect("an open batch");
            open.oldest_clock = open.oldest_clock.min(clock);
        }
        for place in (0..blocks as u64).filter(|place| mask & (1 << place) != 0) {
            self.remap(state, first_logical_block + place, Mapping::Fragment { position, sixteenths });
        }
        true
    }

    /// Put `block` in the open batch's next data slot, described by `entry`, and record its
    /// checksum for its position: the position, or `None` when the batch is full.
    fn append_block(&self, state: &mut WriteState, block: &[u8], checksum: u32, entry: Entry) -> Option<u64> {
        let open = state.log.open.as_mut().expect("an open batch");
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
        let open = state.log.open.as_ref().expect("an open batch");
        let (row, column) = open.place(index);
        let position = self.geometry.position(open.segment, open.first_row + row, column);
        let segment = open.segment;
        let offset = position % self.geometry.blocks_per_segment();
        match &state.current_checksums[open.stream] {
            Some((current, table)) if *current == segment => table.set(offset, checksum),
            _ => self.current_table(segment).set(offset, checksum),
        }
        position
    }

    pub(crate) fn accept_range(&self, state: &mut WriteState, logical_block: u64, trim: bool) -> Result<bool> {
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
    pub(crate) fn record_range(&self, state: &mut WriteState, logical_block: u64, trim: bool) -> bool {
        let open = state.log.open.as_mut().expect("an open batch");
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
    /// in RAM: callers looked the block up under the state lock they still hold.
    pub(crate) fn remap(&self, state: &mut WriteState, logical_block: u64, mapping: Mapping) {
        let per_segment = self.geometry.blocks_per_segment();
        let old = self
            .map
            .set(logical_block, mapping)
            .expect("the index page is in RAM: looked up under the state lock, which eviction needs");
        if let Some(open) = state.log.open.as_mut().filter(|open| !open.relocation) {
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
            state.space.add_live(segment, mapping.live_units(&self.geometry));
        }
        if let Mapping::Shared { record } = mapping {
            // Callers checked it is in use and under the bound, under this lock.
            let added = self.shared.write().add_reference(record);
            debug_assert!(added.is_ok(), "record {record}: {added:?}");
        }
        if let Mapping::Shared { record } = old {
            let freed = self.shared.write().remove_reference(record);
            if let Some(position) = freed {
                self.release_units(state, position, self.geometry.live_units_per_block());
            }
        }
        // (A packed block stays cached: its other fragments may still be live.)
        match old {
            Mapping::Data { position } => self.release_units(state, position, old.live_units(&self.geometry)),
            _ => {
                if let Some(segment) = old.segment(per_segment) {
                    self.release_segment_units(state, segment, old.live_units(&self.geometry));
                }
            }
        }
    }

    /// Open a batch of `stream` (the cleaner's relocations, the checkpoint's pages) in the
    /// log order. The clients' open batch, when it holds anything, is sealed first and
    /// keeps its sequence; the side batch takes the next one. Sequences must follow the
    /// order in which records are accepted and blocks killed:
    /// - a segment's release waits for the sequence of the batch that killed its last
    ///   block; a relocation in a side batch that took the clients' sequence would let a
    ///   victim go once the side batch is durable, while the clients' batch (moved one up)
    ///   that killed its other blocks is not: a crash then brings their older versions
    ///   back (`tests/threaded_crashes.rs`);
    /// - with an active write log, every write accepted into the batch was staged with the
    ///   batch's sequence, and a flush may have made that record durable: were the side
    ///   batch to take the sequence and become durable, mount would take the record's
    ///   writes for ones on the members and skip them — acknowledged writes lost
    ///   (docs/write-log.md, crash analysis).
    ///
    /// An empty clients' batch gives the side batch its sequence and moves one up, or,
    /// with `one_log` (the cleaner writes into the clients' stream, so theirs must end
    /// first), is dropped. Gives back the clients' batch, to be put back by
    /// [`Core::end_side_batch`], the free segments taken, and the clients' sealed batch,
    /// to be dispatched once the state lock is released, before the side batch. A segment
    /// with room for less than a summary and a block is given up.
    pub(crate) fn begin_side_batch(
        &self,
        guard: &mut parking_lot::MutexGuard<'_, WriteState>,
        stream: usize,
        buffers: PooledBuffers,
        one_log: bool,
    ) -> Result<SideBatch> {
        let state = &mut **guard;
        let sealed_clients = self.seal_clients(state);
        if one_log && state.log.open.as_ref().is_some_and(OpenBatch::is_empty) {
            state.log.open = None;
            state.log.next_sequence -= 1;
        }
        let rows_per_chunk = self.geometry.rows_per_chunk();
        let data_columns = self.geometry.data_columns() as u32;
        // Room for a summary and the largest record: a block, or a fragment and the
        // blocks it continues into.
        let indices_needed = if self.geometry.packed_fragments {
            1 + crate::layout::packed::BLOCKS_PER_FRAGMENT_MAXIMUM as u32
        } else {
            2
        };
        if state.log.current_segments[stream]
            .as_ref()
            .is_some_and(|current| (rows_per_chunk - current.next_row) * data_columns < indices_needed)
        {
            self.retire_stream_segment(state, stream);
        }
        let free_before = state.space.free_count();
        if state.log.current_segments[stream].is_none() && !self.open_stream_segment(state, stream, u64::MAX) {
            // The clients' sealed batches are in flight: they must reach the members.
            parking_lot::MutexGuard::unlocked(guard, || {
                sealed_clients.into_iter().try_for_each(|batch| self.dispatch(batch))
            })?;
            return Err(Error::OutOfSpace);
        }
        let taken = free_before - state.space.free_count();
        let sequence = self.move_client_batch_up(state);
        let current = state.log.current_segments[stream].as_mut().expect("opened above");
        if current.open_sequence == u64::MAX {
            current.open_sequence = sequence;
        }
        let batch = self.batch_in(current, sequence, buffers, stream);
        let client = state.log.open.replace(batch);
        Ok(SideBatch { client, taken, sealed_clients })
    }

    /// The next sequence number, given out now: the clients' (empty) open batch's, which
    /// moves up to the one after it, or, without one, the next.
    fn move_client_batch_up(&self, state: &mut WriteState) -> u64 {
        let moved = state.log.next_sequence;
        let sequence = match state.log.open.as_mut() {
            Some(client) => {
                let taken = client.sequence;
                client.sequence = moved;
                if client.segment_open_sequence == taken {
                    client.segment_open_sequence = moved;
                }
                if let Some(current) = state.log.current_segments[HOST_STREAM].as_mut() {
                    if current.open_sequence == taken {
                        current.open_sequence = moved;
                    }
                }
                state.space.renumber_waiting(taken, moved);
                taken
            }
            None => state.log.next_sequence,
        };
        state.log.next_sequence += 1;
        sequence
    }

    /// Seal the side batch (it must hold an entry) and put the clients' batch back.
    pub(crate) fn end_side_batch(&self, state: &mut WriteState, client: Option<OpenBatch>) -> Arc<SealedBatch> {
        let sealed = self.seal(state);
        state.log.open = client;
        sealed
    }

    /// Accept a checkpoint block into the open (side) batch; its position, or `None`
    /// when the batch is full. The copy counts as live in its segment from now on: it
    /// dies when a later checkpoint that replaces it is committed.
    pub(crate) fn accept_page(
        &self,
        state: &mut WriteState,
        kind: format::PageKind,
        number: u64,
        block: &[u8],
    ) -> Option<u64> {
        let checksum = format::block_checksum(block);
        let position = self.append_block(state, block, checksum, Entry::Page { kind, number, checksum })?;
        state.space.add_live(position / self.geometry.blocks_per_segment(), self.geometry.live_units_per_block());
        Some(position)
    }

    /// Give up the rest of the current segment (and the empty open batch in it).
    pub(crate) fn retire_current_segment(&self, state: &mut WriteState) {
        state.log.open = None;
        state.log.next_sequence -= 1;
        self.retire_stream_segment(state, HOST_STREAM);
    }

    /// If `segment` is some stream's current segment, give up the rest of it (the clients'
    /// open batch is sealed first when it is there) so that it can be cleaned. Gives back
    /// the batches it sealed, in sequence order, for the caller to dispatch once the state
    /// lock is released (inline, a dispatch takes it to account the write).
    #[must_use = "the sealed batches must be dispatched"]
    pub(crate) fn retire_if_current(&self, state: &mut WriteState, segment: u64) -> Vec<Arc<SealedBatch>> {
        let in_a_client_batch = [&state.log.open, &state.log.cold]
            .into_iter()
            .any(|batch| batch.as_ref().is_some_and(|batch| batch.segment == segment && !batch.is_empty()));
        let mut sealed = if in_a_client_batch { self.seal_clients(state) } else { Vec::new() };
        for stream in 0..STREAM_COUNT {
            if state.log.current_segments[stream].as_ref().is_some_and(|current| current.segment == segment) {
                if state.log.open.as_ref().is_some_and(|open| open.stream == stream) {
                    if state.log.open.as_ref().is_some_and(|open| !open.is_empty()) {
                        sealed.push(self.seal(state));
                    } else {
                        state.log.open = None;
                        state.log.next_sequence -= 1;
                    }
                }
                self.retire_stream_segment(state, stream);
            }
        }
        sealed
    }

    /// Give up the rest of a stream's current segment.
    pub(crate) fn retire_stream_segment(&self, state: &mut WriteState, stream: usize) {
        if let Some(current) = state.log.current_segments[stream].take() {
            state.current_checksums[stream] = None;
            self.checksums.unpin(current.segment);
            // An empty segment waits for every batch that may have killed its blocks: the
            // open one too, which holds the latest sequence given out.
            let killer = state.log.next_sequence.saturating_sub(1).max(state.log.last_sealed_sequence);
            state.space.leave_current(current.segment, killer);
        }
    }

    /// Seal the open batch (it must hold entries) and queue it for writing.
    pub(crate) fn seal(&self, state: &mut WriteState) -> Arc<SealedBatch> {
        let open = state.log.open.take().expect("an open batch");
        let stream = open.stream;
        let write_clock = if open.relocation {
            open.oldest_clock.min(state.lifetimes.write_clock)
        } else {
            state.lifetimes.write_clock
        };
        let (sealed, metadata) = open.seal(
            self.volume_uuid,
            self.epoch,
            state.log.durable_through_sequence,
            state.log.last_sealed_segment,
            write_clock,
            state.log.reserved_segments[stream].unwrap_or(format::NO_SEGMENT),
        );
        let header = sealed.header;
        let table = match &state.current_checksums[stream] {
            Some((current, table)) if *current == header.segment => table.clone(),
            _ => self.current_table(header.segment),
        };
        for (index, checksum) in metadata {
            let data_columns = self.geometry.data_columns() as u32;
            let position = self.geometry.position(
                header.segment,
                header.first_row + index / data_columns,
                (index % data_columns) as usize,
            );
            table.set(position % self.geometry.blocks_per_segment(), checksum);
        }
        let current = state.log.current_segments[stream].as_mut().expect("a current segment");
        current.next_row = header.first_row + header.row_count;
        let segment_full = current.next_row == self.geometry.rows_per_chunk();
        // A relocation segment is as old as the oldest block it holds.
        let oldest_clock = (stream != HOST_STREAM).then_some(header.write_clock);
        state.space.note_sealed(
            header.segment,
            header.first_row + header.row_count,
            state.lifetimes.write_clock,
            oldest_clock,
        );
        if segment_full {
            state.log.current_segments[stream] = None;
            state.current_checksums[stream] = None;
            self.checksums.unpin(header.segment);
            state.space.leave_current(header.segment, header.sequence);
        }
        state.log.last_sealed_sequence = header.sequence;
        state.log.last_sealed_segment = header.segment;
        let batch = Arc::new(sealed);
        state.log.in_flight.push_back(InFlight { batch: batch.clone(), written: false });
        batch
    }

    pub(crate) fn dispatch(&self, batch: Arc<SealedBatch>) -> Result<()> {
        match self.io_mode {
            IoMode::Inline => {
                let mut parity = self.parity_pool.take();
                batch.compute_parity(&self.geometry, &mut parity);
                let mut error = None;
                for member in 0..self.geometry.member_count {
                    if let Err(failure) = self.write_member_part(&batch, &parity, member) {
                        error.get_or_insert(failure);
                    }
                }
                self.batch_written(&batch, error);
            }
            IoMode::Threaded => {
                let sender = self.stripe_queue.lock().clone().ok_or(Error::Closed)?;
                // Never blocks: the queue holds as many batches as the data pool has sets.
                sender.send(crate::log::pipeline::PipelineJob::Stripe(batch)).map_err(|_| Error::Closed)?;
            }
        }
        self.members.check_running()
    }

    pub(crate) fn write_member_part(&self, batch: &SealedBatch, parity: &PooledBuffers, member: usize) -> Result<()> {
        let Some(device) = self.members.writable(member) else {
            return Ok(());
        };
        let (buffer, offset) = batch.member_part(&self.geometry, parity, member);
        // A member that fails is failed (durably) and the batch counts as written on the
        // others; only a loss the volume cannot survive is an error.
        device.write_at(buffer, offset).or_else(|error| self.members.write_failed(member, error))
    }

    /// Account a batch whose member writes finished (with the first error, if any), and
    /// retire written batches in sequence order.
    pub(crate) fn batch_written(&self, batch: &SealedBatch, error: Option<Error>) {
        if let Some(error) = error {
            self.fail(Shutdown::BatchWrite { sequence: batch.header.sequence, error: Arc::new(error) });
        } else {
            // Before the batch counts as written: until then no flush covers it, so its
            // segment cannot be released (and its generation bumped) meanwhile.
            self.cache_batch(batch);
        }
        self.count_batch(batch);
        let mut state = self.state.lock();
        if let Some(entry) =
            state.log.in_flight.iter_mut().find(|entry| entry.batch.header.sequence == batch.header.sequence)
        {
            entry.written = true;
        }
        let written_through = crate::log::retire_written_front(
            &mut state.log.in_flight,
            |entry| entry.written,
            |entry| (entry.batch.header.sequence, entry.batch.header.paired_with_next),
            |entry| {
                let header = &entry.batch.header;
                self.rows_on_media[header.segment as usize]
                    .store(header.first_row + header.row_count, Ordering::Release);
            },
        );
        if let Some(sequence) = written_through {
            state.log.written_through_sequence = sequence;
        }
        self.progress.notify_all();
    }

    /// Keep a just-written client batch readable from memory (recent writes are hot): its
    /// buffers serve reads once they are back in the pool, or, on a volume whose cache is
    /// too small for sets of its own, every block goes into the block cache.
    pub(crate) fn cache_batch(&self, batch: &SealedBatch) {
        if let Some(cache) = &self.cache {
            for &position in &batch.killed_positions {
                cache.forget(position);
            }
        }
        // Relocated blocks are the ones nobody wrote for a while: they would only push
        // recently written blocks out (reads cache them again when they are wanted).
        if batch.relocation || batch.metadata {
            return;
        }
        let header = &batch.header;
        let generation = self.generation(header.segment);
        if self.data_pool.retained_capacity_bytes() > 0 {
            batch.retain_for_reads(generation);
            return;
        }
        let Some(cache) = &self.cache else { return };
        for row in header.first_row..header.first_row + header.row_count {
            for column in 0..self.geometry.data_columns() {
                if let Some(block) = batch.block(row, column) {
                    cache.insert(self.geometry.position(header.segment, row, column), generation, block);
                }
            }
        }
    }

    pub(crate) fn count_batch(&self, batch: &SealedBatch) {
        let header = &batch.header;
        let block = BLOCK_SIZE_BYTES as u64;
        let data_columns = self.geometry.data_columns() as u64;
        let slots = header.row_count as u64 * data_columns;
        let data_blocks = (header.block_count - header.summary_count) as u64;
        let padding = slots - header.block_count as u64;
        let redundancy = (self.geometry.member_count as u64 - data_columns) * header.row_count as u64;
        let counters = &self.counters;
        Counters::add(&counters.batches_written, 1);
        if header.first_row == 0 && header.row_count == self.geometry.rows_per_chunk() {
            Counters::add(&counters.full_stripes, 1);
        } else {
            Counters::add(&counters.short_stripes, 1);
        }
        if batch.relocation {
            Counters::add(&counters.member_bytes_relocated, data_blocks * block);
        } else if batch.metadata {
            Counters::add(&counters.member_bytes_metadata, data_blocks * block);
        } else {
            Counters::add(&counters.member_bytes_data, data_blocks * block);
        }
        Counters::add(&counters.member_bytes_metadata, header.summary_count as u64 * block);
        Counters::add(&counters.member_bytes_padding, padding * block);
        Counters::add(&counters.member_bytes_redundancy, redundancy * block);
        self.members.count_written(header.row_count as u64 * block);
    }

    pub(crate) fn flush(&self) -> Result<()> {
        self.check_open()?;
        if self.read_only {
            return Ok(());
        }
        if let Some(log) = self.write_log.as_ref().filter(|log| log.is_active()) {
            if self.append_to_write_log(log, true)? {
                return Ok(());
            }
            // The log failed before this flush's writes were staged: they are in the
            // batches; sync the members.
        }
        self.flush_members()
    }

    /// Append the staged client writes to the write log (group commit: one append at a
    /// time; a flush that finds nothing staged was covered by the append before it, synced
    /// now if that one was not) and, with `sync`, make them durable there. `Ok(false)`: nothing was staged and the log
    /// is no longer active (the caller syncs the members instead). When the log is full
    /// of records the members do not hold durably yet, or fails now, the members are
    /// synced instead (which frees the log, or retires it).
    pub(crate) fn append_to_write_log(&self, log: &crate::write_log::WriteLog, sync: bool) -> Result<bool> {
        let mut appender = log.appender.lock();
        let (staging, durable) = {
            let mut state = self.state.lock();
            self.staged_entries.store(0, Ordering::Relaxed);
            (std::mem::take(&mut state.log_staging), state.log.durable_through_sequence)
        };
        let result = if staging.is_empty() {
            if !sync || !log.is_active() {
                return Ok(log.is_active());
            }
            // Covered by an earlier append: synced if it was not, and a device it found
            // failed recorded as dropped even if the thread that found it failed to.
            log.sync(&mut appender)
        } else {
            log.append(&mut appender, &staging, durable, sync)
        };
        match result {
            Ok(()) => {
                self.record_dropped_log_devices(log)?;
                Ok(true)
            }
            Err(crate::write_log::AppendProblem::NeedSpace) => {
                // Everything staged is in batches: made durable on the members it needs
                // no log record, and every record before it dies.
                self.flush_members()?;
                Ok(true)
            }
            Err(crate::write_log::AppendProblem::Failed) => {
                log::error!(
                    "the write log failed ({}): flushes sync the members from now on",
                    log.failure().unwrap_or_default()
                );
                // Retiring it syncs the members: what was staged is durable there.
                self.retire_failed_write_log()?;
                Ok(true)
            }
        }
    }

    /// A log device that failed (a mirror goes on with the other) is recorded as dropped
    /// in the member superblocks, its path emptied, before the append that found it
    /// returns: its records stop at the failure, and a mount that took its chain for the
    /// log's would silently lose what was acknowledged since (docs/write-log.md). An
    /// error here fails the flush or FUA write: it is not acknowledged.
    fn record_dropped_log_devices(&self, log: &crate::write_log::WriteLog) -> Result<()> {
        let failed = log.failed_device_indices();
        if failed.is_empty() {
            // Every flush comes here: no copy of the superblock while the log is whole.
            return Ok(());
        }
        let recorded = self.members.superblock().write_log.as_ref().is_none_or(|reference| {
            failed.iter().all(|&index| reference.paths.get(index).is_none_or(String::is_empty))
        });
        if recorded {
            return Ok(());
        }
        self.members.update_superblock(|superblock| {
            if let Some(reference) = superblock.write_log.as_mut() {
                for &index in &failed {
                    if let Some(path) = reference.paths.get_mut(index) {
                        log::warn!("write log device {path} is dropped from the log: its records stop at its failure");
                        path.clear();
                    }
                }
            }
        })
    }

    /// Every device of the write log failed while serving: sync the members (every
    /// accepted write is in a batch, so everything acknowledged through the log becomes
    /// durable there), and only then remove the log from the member superblocks, so that
    /// a crash from now on mounts without it and loses nothing (docs/write-log.md, crash
    /// analysis).
    pub(crate) fn retire_failed_write_log(&self) -> Result<()> {
        self.flush_members()?;
        crate::write_log::forget(&self.members)
    }

    /// Seal the clients' open batch and make every batch durable on the members.
    pub(crate) fn flush_members(&self) -> Result<()> {
        let (target, sealed) = {
            let mut state = self.state.lock();
            let sealed = self.seal_clients(&mut state);
            (state.log.last_sealed_sequence, sealed)
        };
        for batch in sealed {
            self.dispatch(batch)?;
        }
        self.make_durable(target)
    }

    /// Make every sealed batch durable (the clients' open batch stays open), then
    /// release what that frees (the cleaner's last step).
    pub(crate) fn make_sealed_durable(&self) -> Result<()> {
        let target = self.state.lock().log.last_sealed_sequence;
        self.make_durable(target)
    }

    /// The state lock, taken once every sealed batch is written on the members: while it
    /// is held no batch is sealed, so the log on the members does not change.
    pub(crate) fn lock_with_batches_written(&self) -> parking_lot::MutexGuard<'_, WriteState> {
        let mut state = self.state.lock();
        while !state.log.in_flight.is_empty() && self.members.check_running().is_ok() {
            self.progress.wait(&mut state);
        }
        state
    }

    /// Make every batch up to `target` durable on the members, by group commit: one
    /// thread at a time syncs the members, for every batch sealed when its round began;
    /// flushes that arrive meanwhile wait and are covered by that round or the next one,
    /// so concurrent flushes cost at most two rounds, not one each. Then release the
    /// segments the new durable point frees.
    pub(crate) fn make_durable(&self, target: u64) -> Result<()> {
        let mut sent_a_round = false;
        loop {
            let (round_through, written_at_start) = {
                let mut state = self.state.lock();
                loop {
                    self.members.check_running()?;
                    if state.log.durable_through_sequence >= target {
                        drop(state);
                        // The thread that ran a round releases what it freed.
                        return if sent_a_round { self.stop_on_error(self.reclaim()) } else { Ok(()) };
                    }
                    // A round starts once this flush's batches are written, or, threaded,
                    // once they are queued (a round travels behind them); a second one
                    // only when they are written (a round may have missed a batch sealed
                    // before it but queued after it).
                    let ready = state.log.written_through_sequence >= target
                        || (!sent_a_round && self.io_mode == IoMode::Threaded);
                    if !state.log.sync_in_progress && ready {
                        state.log.sync_in_progress = true;
                        break (state.log.last_sealed_sequence, state.log.written_through_sequence);
                    }
                    // Threaded and closed, the pipeline is gone: no round can come, and
                    // a batch whose dispatch failed is never written. Waiting would hang
                    // the thread (the flush timer, which a close joins) for ever.
                    if self.io_mode == IoMode::Threaded && !ready && self.closed.load(Ordering::SeqCst) {
                        return Err(Error::Closed);
                    }
                    self.progress.wait(&mut state);
                }
            };
            sent_a_round = true;
            let result = self.sync_members();
            let mut state = self.state.lock();
            state.log.sync_in_progress = false;
            if let Ok(covered_through) = result {
                // Only batches written when the round finished, and queued before it, are
                // covered by it. Inline, a batch sealed before the round may be written by
                // another thread (a client's, the flush timer's) while the members sync,
                // after its member's sync: only those written when it began are covered.
                let covered_through = match self.io_mode {
                    IoMode::Inline => covered_through.min(written_at_start),
                    IoMode::Threaded => covered_through,
                };
                let durable = round_through.min(state.log.written_through_sequence).min(covered_through);
                state.log.durable_through_sequence = state.log.durable_through_sequence.max(durable);
            }
            self.progress.notify_all();
            drop(state);
            self.stop_on_error(result)?;
            Counters::add(&self.counters.flushes, 1);
        }
    }

    /// One sync of every member. Threaded: through the write pipeline, behind the batches
    /// already queued (each member's worker syncs its own device); inline: one by one.
    /// Returns the last batch of those the sync covers (every one written before it, and,
    /// threaded, queued before it).
    fn sync_members(&self) -> Result<u64> {
        match self.io_mode {
            IoMode::Inline => self.members.flush_all(false).map(|()| u64::MAX),
            IoMode::Threaded => {
                let round =
                    crate::log::pipeline::SyncRound::new(self.geometry.member_count, self.members.flush_groups());
                let sender = self.stripe_queue.lock().clone().ok_or(Error::Closed)?;
                sender.send(crate::log::pipeline::PipelineJob::Sync(round.clone())).map_err(|_| Error::Closed)?;
                round.wait().map(|()| round.covered_through())
            }
        }
    }

    /// Record in the superblocks that every batch through `durable` is durable, unless
    /// they already say so.
    pub(crate) fn record_durable_through(&self, durable: u64) -> Result<()> {
        if self.members.superblock().durable_through_sequence >= durable {
            return Ok(());
        }
        self.members.update_superblock(|superblock| {
            superblock.durable_through_sequence = superblock.durable_through_sequence.max(durable)
        })
    }

    /// Make segments whose death is durable free again. Their head row is zeroed and
    /// flushed first, on every member, so that recovery can always tell a released
    /// segment from one whose metadata was lost (docs/crash-consistency.md).
    pub(crate) fn reclaim(&self) -> Result<()> {
        let (releasing, durable): (Vec<u64>, u64) = {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            let durable = state.log.durable_through_sequence;
            (state.space.begin_release(durable), durable)
        };
        // Shared-block records freed so far are reused once the fence below is passed.
        let records_freed = self.shared.read().quarantined_through();
        if releasing.is_empty() {
            if let Some(serial) = records_freed {
                let _fence = self.reuse_fence.write();
                self.shared.write().release_through(serial);
            }
            return Ok(());
        }
        // The batches in these segments leave the log: record durably that everything
        // up to `durable` was durable, so that recovery does not take their absence for
        // the end of the log.
        self.record_durable_through(durable)?;
        // Barrier: wait for readers that may still hold a position in these segments;
        // then their cached blocks are retired with a new generation.
        {
            let _fence = self.reuse_fence.write();
            for &segment in &releasing {
                self.generations[segment as usize].fetch_add(1, Ordering::AcqRel);
                self.checksums.forget(segment);
            }
            if let Some(serial) = records_freed {
                self.shared.write().release_through(serial);
            }
        }
        let zeros = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        let heads: Vec<u64> = releasing.iter().map(|&segment| self.geometry.member_offset_bytes(segment, 0)).collect();
        self.members.write_everywhere(&zeros, &heads, self.io_mode == IoMode::Threaded)?;
        self.members.flush_all(self.io_mode == IoMode::Threaded)?;
        let mut state = self.state.lock();
        for segment in releasing {
            self.rows_on_media[segment as usize].store(0, Ordering::Release);
            state.space.finish_release(segment);
        }
        self.progress.notify_all();
        Ok(())
    }

    /// Read logical block `logical_block` into `out` (4096 bytes). Callers hold the reuse
    /// fence, or pass the state they hold (which also keeps segments from being reused).
    pub(crate) fn read_block(&self, logical_block: u64, out: &mut [u8], held: Option<&WriteState>) -> Result<()> {
        match self.resolved(logical_block)? {
            Mapping::Data { position } => self.read_position(position, logical_block, out, held),
            Mapping::Fragment { position, .. } => {
                let stored = self.read_fragment(position, logical_block, held)?;
                stored.extract(logical_block, out).map_err(|problem| self.bad_fragment(logical_block, problem))
            }
            _ => {
                out.fill(0);
                Ok(())
            }
        }
    }

    /// Blocks of data the volume holds: whole blocks, fragments' sixteenths rounded up,
    /// and one per shared copy (however many logical blocks refer to it).
    pub(crate) fn held_blocks(&self) -> u64 {
        self.map.counts().held_blocks() + self.shared.read().in_use()
    }

    /// `logical_block`'s mapping, a shared block's as the data position of its copy.
    /// Callers hold the reuse fence or the state lock (as for [`Core::read_block`]): a
    /// record freed after the map was read is not reused meanwhile, so the map is read
    /// again; a record the map still names that holds no copy is an error.
    pub(crate) fn resolved(&self, logical_block: u64) -> Result<Mapping> {
        let mut mapping = self.map.get(logical_block)?;
        for _ in 0..SHARED_RESOLVE_ATTEMPTS {
            let Mapping::Shared { record } = mapping else {
                return Ok(mapping);
            };
            if let Some(current) = self.shared.read().get(record) {
                return Ok(Mapping::Data { position: current.position });
            }
            let again = self.map.get(logical_block)?;
            if again == mapping {
                break;
            }
            mapping = again;
        }
        Counters::add(&self.counters.unrecoverable_reads, 1);
        let record = match mapping {
            Mapping::Shared { record } => record,
            _ => unreachable!("only a shared mapping gets here"),
        };
        Err(Error::Unrecoverable { logical_block, reason: ReadFailure::FreeSharedRecord(record) })
    }

    fn bad_fragment(&self, logical_block: u64, problem: crate::layout::packed::PackedProblem) -> Error {
        Counters::add(&self.counters.unrecoverable_reads, 1);
        Error::Unrecoverable { logical_block, reason: ReadFailure::BadFragment(problem) }
    }

    /// Read the fragment serving `logical_block` whose start block is at `position`: that
    /// block and the blocks it continues into, each proven by its position's checksum
    /// (from memory when there). Same locking rules as [`Core::read_block`].
    pub(crate) fn read_fragment(
        &self,
        position: u64,
        logical_block: u64,
        held: Option<&WriteState>,
    ) -> Result<StoredFragment> {
        let mut start = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        self.read_position(position, logical_block, &mut start, held)?;
        let (entries, index) = crate::layout::packed::find(&start, logical_block)
            .map_err(|problem| self.bad_fragment(logical_block, problem))?;
        let following = self.read_continuations(position, &entries, index, logical_block, held)?;
        Ok(StoredFragment { start, entries, index, following })
    }

    /// Read the blocks after `position` that fragment `index` of the packed block there
    /// (its table `entries`) continues into, each proven by its position's checksum.
    pub(crate) fn read_continuations(
        &self,
        position: u64,
        entries: &[crate::layout::packed::FragmentEntry],
        index: usize,
        logical_block: u64,
        held: Option<&WriteState>,
    ) -> Result<Vec<AlignedBuffer>> {
        (1..=crate::layout::packed::following_blocks(entries, index) as u64)
            .map(|after| {
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                self.read_position(position + after, logical_block, &mut block, held)?;
                Ok(block)
            })
            .collect()
    }

    /// Read the block at data-space `position` (which holds `logical_block`) into `out`:
    /// from memory when it is there, else from the members, verified. Same locking rules
    /// as [`Core::read_block`].
    pub(crate) fn read_position(
        &self,
        position: u64,
        logical_block: u64,
        out: &mut [u8],
        held: Option<&WriteState>,
    ) -> Result<()> {
        if let Lookup::Served = self.position_from_memory(position, out, held) {
            return Ok(());
        }
        let location = self.geometry.locate(position);
        let generation = self.generation(location.segment);
        let unrecoverable = |reason| {
            Counters::add(&self.counters.unrecoverable_reads, 1);
            Error::Unrecoverable { logical_block, reason }
        };
        let table = self.checksum_table(location.segment, held).map_err(unrecoverable)?;
        let per_segment = self.geometry.blocks_per_segment();
        let expected = table.get(position % per_segment);
        let checksum_of = |column: usize| {
            let other = self.geometry.position(location.segment, location.row, column);
            Some(table.get(other % per_segment))
        };
        self.read_verified(location, &|block| format::checksum_proves(block, expected), &checksum_of, out)
            .map_err(unrecoverable)?;
        if let Some(cache) = &self.cache {
            cache.insert(position, generation, out);
        }
        Ok(())
    }

    pub(crate) fn position_from_memory(&self, position: u64, out: &mut [u8], held: Option<&WriteState>) -> Lookup {
        let location = self.geometry.locate(position);
        if location.row >= self.rows_on_media[location.segment as usize].load(Ordering::Acquire) {
            let found = match held {
                Some(state) => copy_from_memory(state, location, out),
                None => copy_from_memory(&self.state.lock(), location, out),
            };
            if found {
                return Lookup::Served;
            }
        }
        let generation = self.generation(location.segment);
        if self.data_pool.read_retained(location.segment, location.row, location.column, generation, out) {
            Counters::add(&self.counters.reads_from_recent_writes, 1);
            return Lookup::Served;
        }
        if let Some(cache) = &self.cache {
            if cache.get(position, generation, out) {
                Counters::add(&self.counters.reads_from_block_cache, 1);
                return Lookup::Served;
            }
        }
        Lookup::OnMembers
    }

    pub(crate) fn read_verified(
        &self,
        location: crate::layout::geometry::BlockLocation,
        valid: &dyn Fn(&[u8]) -> bool,
        checksum_of: &dyn Fn(usize) -> Option<u32>,
        out: &mut [u8],
    ) -> std::result::Result<(), ReadFailure> {
        self.members
            .read_verified(&self.geometry, &self.counters, location, valid, checksum_of, ReadPurpose::Client, out)
            .map(|_| ())
    }
}

/// A block at a data-space position from what a caller holds in memory (`false`: not
/// there); what it gives must still prove itself.
pub(crate) type BlockSource<'a> = dyn Fn(u64, &mut [u8]) -> bool + 'a;

/// What `Core::for_each_summary` hands each summary to: the summary with its batch index,
/// the CRC32C of its block, and the data-space position of any batch index of its batch.
type SummaryVisitor<'a> = dyn FnMut((&format::Summary, u32), u32, &dyn Fn(u32) -> u64) + 'a;

/// One entry of a segment's summaries, and the data-space position of the block it
/// describes (`None` for range entries).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SegmentEntry {
    pub(crate) entry: Entry,
    pub(crate) position: Option<u64>,
    /// Its batch's write clock (a relocation batch's: the oldest of its blocks).
    pub(crate) write_clock: u64,
}

impl Core {
    /// Every entry of the batches sealed into `segment`, in log order: what each of its
    /// positions holds (the per-segment reverse information, read from its summaries).
    /// Callers hold the reuse fence, so that the segment is not released meanwhile.
    /// `Err`: a summary can be neither read nor rebuilt.
    pub(crate) fn segment_entries(&self, segment: u64) -> std::result::Result<Vec<SegmentEntry>, ReadFailure> {
        let sealed_rows = self.state.lock().space.usage(segment).sealed_rows();
        let mut entries = Vec::new();
        self.for_each_summary(segment, sealed_rows, None, None, &mut |summary, _, position_of| {
            for (index, entry) in format::batch_entries(std::iter::once(summary)) {
                entries.push(SegmentEntry {
                    entry,
                    position: index.map(position_of),
                    write_clock: summary.0.header.write_clock,
                });
            }
        })?;
        Ok(entries)
    }
}

impl Core {
    /// The table of a segment receiving batches (pinned in the cache from the moment it
    /// became current).
    fn current_table(&self, segment: u64) -> Arc<ChecksumTable> {
        self.checksums.get(segment).unwrap_or_else(|| {
            let table = Arc::new(ChecksumTable::new(self.geometry.blocks_per_segment()));
            self.checksums.insert(segment, table.clone(), true);
            table
        })
    }

    /// The checksums of every position of `segment`: cached, or built from its summaries.
    /// Same locking rules as [`Core::read_block`]; `Err`: a summary can be neither read nor
    /// rebuilt, so nothing in the segment can be verified.
    pub(crate) fn checksum_table(
        &self,
        segment: u64,
        held: Option<&WriteState>,
    ) -> std::result::Result<Arc<ChecksumTable>, ReadFailure> {
        if let Some(table) = self.checksums.get(segment) {
            return Ok(table);
        }
        let sealed_rows = match held {
            Some(state) => state.space.usage(segment).sealed_rows(),
            None => self.state.lock().space.usage(segment).sealed_rows(),
        };
        let table = Arc::new(self.load_checksum_table(segment, sealed_rows, held, None)?);
        self.checksums.insert(segment, table.clone(), false);
        Ok(table)
    }

    /// [`Core::checksum_table`] for a caller that has read the segment's rows already (a
    /// rebuild, a scrub): its summaries are taken from `rows` (the block at a data-space
    /// position, `false`: not there) when they prove themselves there, and read from the
    /// members only when not. The table is not cached: a walk over every segment would
    /// evict the tables client reads use.
    pub(crate) fn checksum_table_from_rows(
        &self,
        segment: u64,
        rows: &BlockSource,
    ) -> std::result::Result<Arc<ChecksumTable>, ReadFailure> {
        if let Some(table) = self.checksums.get(segment) {
            return Ok(table);
        }
        let sealed_rows = self.state.lock().space.usage(segment).sealed_rows();
        Ok(Arc::new(self.load_checksum_table(segment, sealed_rows, None, Some(rows))?))
    }

    /// The checksum of every position of `segment`, from its summaries: the CRC of each
    /// data block its entry records, of each summary block as read, and of zeros for
    /// padding.
    fn load_checksum_table(
        &self,
        segment: u64,
        sealed_rows: u32,
        held: Option<&WriteState>,
        rows: Option<&BlockSource>,
    ) -> std::result::Result<ChecksumTable, ReadFailure> {
        let table = ChecksumTable::new(self.geometry.blocks_per_segment());
        self.for_each_summary(segment, sealed_rows, held, rows, &mut |summary, checksum, position_of| {
            self.record_summary_checksums(&table, summary, checksum, position_of)
        })?;
        Ok(table)
    }

    /// Put in `table` what one summary proves: its own block's checksum, the CRC32C of
    /// every data block its entries record, and, after a batch's last summary, the zero
    /// block's for the batch's padding.
    pub(crate) fn record_summary_checksums(
        &self,
        table: &ChecksumTable,
        (summary, index): (&format::Summary, u32),
        checksum: u32,
        position_of: &dyn Fn(u32) -> u64,
    ) {
        let per_segment = self.geometry.blocks_per_segment();
        table.set(position_of(index) % per_segment, checksum);
        for (data_index, entry) in format::batch_entries(std::iter::once((summary, index))) {
            // (A further fragment's checksum is its decompressed block's, not its
            // packed block's: the packed block's is its `Packed` entry's.)
            if let (Some(data_index), Some(checksum)) = (data_index, entry.block_checksum()) {
                table.set(position_of(data_index) % per_segment, checksum);
            }
        }
        let header = summary.header;
        if summary.summary_index as u32 + 1 == header.summary_count {
            let zero = format::zero_block_checksum();
            for padding in header.block_count..header.row_count * self.geometry.data_columns() as u32 {
                table.set(position_of(padding) % per_segment, zero);
            }
        }
    }

    /// Walk the batches sealed into `segment` (rows `[0, sealed_rows)`) and hand every
    /// summary to `visit`, in log order, with its batch index, its block's CRC32C, and the
    /// data-space position of any batch index of its batch. Summaries prove themselves
    /// (their own CRC32C, this volume, this segment and row, or the batch's first header)
    /// or are rebuilt from their stripe row; `Err` when one can be neither read nor rebuilt.
    fn for_each_summary(
        &self,
        segment: u64,
        sealed_rows: u32,
        held: Option<&WriteState>,
        rows: Option<&BlockSource>,
        visit: &mut SummaryVisitor,
    ) -> std::result::Result<(), ReadFailure> {
        let mut walk = SummaryWalk::new(segment, sealed_rows);
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        while let Some(position) = walk.next_position(&self.geometry) {
            let valid = |bytes: &[u8]| walk.expects(bytes, &self.volume_uuid, &self.geometry);
            if !rows.is_some_and(|rows| rows(position, &mut block) && valid(&block)) {
                self.read_self_verifying(position, &valid, held, &mut block)?;
            }
            let summary = format::Summary::decode(&block, &self.volume_uuid).ok_or(ReadFailure::BeyondRedundancy)?;
            visit((&summary, walk.index), format::block_checksum(&block), &|index| {
                walk.position_of(&self.geometry, index)
            });
            walk.advance(&summary);
        }
        Ok(())
    }

    /// Read a block that proves itself (`valid`) at `position`: from memory, else from the
    /// members, rebuilt from its row when no copy is valid.
    fn read_self_verifying(
        &self,
        position: u64,
        valid: &dyn Fn(&[u8]) -> bool,
        held: Option<&WriteState>,
        out: &mut [u8],
    ) -> std::result::Result<(), ReadFailure> {
        if let Lookup::Served = self.position_from_memory(position, out, held) {
            if valid(out) {
                return Ok(());
            }
        }
        let location = self.geometry.locate(position);
        self.members
            .read_verified(&self.geometry, &self.counters, location, valid, &|_| None, ReadPurpose::Verify, out)
            .map(|_| ())
    }
}

/// Where a walk over the batches sealed into a segment stands: each batch's summaries
/// are found one after the other (each says where the next is), so the walk reads the
/// summary it expects next, checks it (`expects`), and moves on (`advance`).
pub(crate) struct SummaryWalk {
    segment: u64,
    sealed_rows: u32,
    /// The first row of the batch being walked.
    row: u32,
    /// The batch index of the summary expected next, and its number in its batch.
    index: u32,
    number: u32,
    /// The header of the batch's first summary, which every other one repeats.
    first: Option<format::BatchHeader>,
}

impl SummaryWalk {
    /// A walk over the rows `[0, sealed_rows)` of `segment`.
    pub(crate) fn new(segment: u64, sealed_rows: u32) -> SummaryWalk {
        SummaryWalk { segment, sealed_rows, row: 0, index: 0, number: 0, first: None }
    }

    /// The data-space position of the summary expected next; `None` once every batch is
    /// walked.
    pub(crate) fn next_position(&self, geometry: &Geometry) -> Option<u64> {
        (self.row < self.sealed_rows).then(|| self.position_of(geometry, self.index))
    }

    /// The data-space position of batch index `index` of the batch being walked.
    pub(crate) fn position_of(&self, geometry: &Geometry, index: u32) -> u64 {
        let data_columns = geometry.data_columns() as u32;
        geometry.position(self.segment, self.row + index / data_columns, (index % data_columns) as usize)
    }

    /// Whether `bytes` is the summary the walk expects next: it proves itself (its own
    /// CRC32C and this volume), has the number expected, and repeats its batch's first
    /// header (or, for a batch's first, has a header that fits this segment and row).
    pub(crate) fn expects(&self, bytes: &[u8], volume_uuid: &[u8; 16], geometry: &Geometry) -> bool {
        format::Summary::decode(bytes, volume_uuid).is_some_and(|summary| {
            let header = summary.header;
            summary.summary_index as u32 == self.number
                && match self.first {
                    Some(first) => header == first,
                    None => header.fits(self.segment, self.row, self.sealed_rows, geometry.data_columns() as u32),
                }
        })
    }

    /// Move past `summary`, the one expected (checked with `expects`).
    pub(crate) fn advance(&mut self, summary: &format::Summary) {
        let header = *self.first.get_or_insert(summary.header);
        self.number += 1;
        let next = format::next_summary_index(self.index, summary);
        if self.number >= header.summary_count || next >= header.block_count {
            self.row = header.first_row + header.row_count;
            self.index = 0;
            self.number = 0;
            self.first = None;
        } else {
            self.index = next;
        }
    }

    /// The batch index of the summary expected next.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }
}

/// Where a block read was served from.
pub(crate) enum Lookup {
    Served,
    /// Not in memory: it must be read from the members at this data-space position.
    OnMembers,
}

/// Copy a block that is still only in memory (open or in-flight batch).
pub(crate) fn copy_from_memory(
    state: &WriteState,
    location: crate::layout::geometry::BlockLocation,
    out: &mut [u8],
) -> bool {
    for open in [&state.log.open, &state.log.cold].into_iter().flatten() {
        if open.segment == location.segment {
            if let Some(index) = open.index_of(location.row, location.column) {
                out.copy_from_slice(open.block(index));
                return true;
            }
        }
    }
    for entry in &state.log.in_flight {
        if entry.batch.header.segment == location.segment {
            if let Some(block) = entry.batch.block(location.row, location.column) {
                out.copy_from_slice(block);
                return true;
            }
        }
    }
    false
}

impl crate::log::pipeline::BatchSink for Core {
    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn members(&self) -> &Members {
        &self.members
    }

    fn parity_pool(&self) -> &Arc<BufferPool> {
        &self.parity_pool
    }

    fn write_queue_batches(&self) -> usize {
        self.write_queue_batches
    }

    fn batch_written(&self, batch: &SealedBatch, error: Option<Error>) {
        Core::batch_written(self, batch, error)
    }

    fn fail(&self, reason: Shutdown) {
        Core::fail(self, reason)
    }
}
