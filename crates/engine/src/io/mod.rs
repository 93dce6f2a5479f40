//! Layer 6: `Core`, the read and write paths of one open volume, composed of the
//! components below it, each with private state and its own API:
//!
//! | part of `Core` | component | what it owns |
//! |---|---|---|
//! | `state` (the write lock) | [`WriteState`]: `log::LogState`, `space::SegmentTable`, `index::lifetimes` | open batches, streams, sequences and frontiers; segment uses and the free list; the write clock |
//! | `map`, `checksums` | `index::map::BlockMap`, `index::checksums::ChecksumCache` | the index pages; the checksum of every position |
//! | `shared` | `space::shared::SharedTable` | deduplication's shared copies and their references |
//! | `cache`, `rows_on_media`, `generations`, `reuse_fence` | the read path (`io::read`, `io::cache`, `io::read_queue`) | blocks in RAM, what is on the members, the reuse fence |
//! | `data_pool`, `parity_pool`, `stripe_queue` | `log::batch`, `log::pipeline` | write buffers and the stripe writer's queue |
//! | `cleaner` | `space::signals::CleanerSignals` | the signals between writers and the cleaner thread |
//! | `write_log` | `write_log::WriteLog` | the optional write log |
//!
//! The write path (`io::write`): accept a record into the log's open batch, point the
//! index at it, count it in the segment table; `io::durability`: seal, dispatch, make
//! durable, release dead segments; `io::side_batch`: the batches of the cleaner and the
//! checkpoint in the log order; `io::read`: the read path; `io::summaries`: what a
//! segment's summaries say (its entries, its checksum table).
//!
//! Threads and locks (see ARCHITECTURE.md):
//! - Client threads accept writes into the open batch under the write lock (`state`; the
//!   order writes are accepted in is the order of the log). Nothing under it waits for a
//!   member: what a write needs from the members (the old content of a partial block, an
//!   index page, a checksum table) is read before the lock is taken and checked again
//!   under it (`write_lock::assert_not_held` at every member I/O enforces it).
//! - Sealed batches go to the log's pipeline (a stripe writer and one worker per member),
//!   which reports each written batch back through `BatchSink`. In `IoMode::Inline` (the
//!   deterministic simulation) the calling thread writes them itself.
//! - Lock order: `directory` (the checkpoint lock), then `reuse_fence`, then `state`, then
//!   `shared`.
//!   Readers hold `reuse_fence` for reading while they look up and read blocks; a segment
//!   is only made reusable under `reuse_fence` for writing, so no reader can be reading a
//!   segment being reused.

pub(crate) mod cache;
pub(crate) mod compression;
pub(crate) mod deduplication;
mod durability;
mod read;
pub(crate) mod read_queue;
mod side_batch;
mod state;
mod summaries;
mod write;

pub(crate) use read::Lookup;
pub(crate) use side_batch::SideKind;
pub(crate) use state::{StateGuard, WriteState};
pub(crate) use summaries::{SegmentEntry, SummaryWalk};
pub(crate) use write::{block_pieces, BlockWrite, CompressedUnit, MergedBlock, OpenProblem, RunStop};

use crate::array::members::Members;
use crate::error::{Error, RequestProblem, Result, Shutdown};
use crate::index::checksums::ChecksumCache;
use crate::index::directory::CheckpointState;
use crate::index::map::BlockMap;
use crate::layout::geometry::{Geometry, BLOCK_SIZE_BYTES};
use crate::log::batch::BufferPool;
use crate::log::pipeline::PipelineJob;
use crate::log::IoMode;
use crate::space::shared::SharedTable;
use crate::space::signals::CleanerSignals;
use crate::stats::Counters;
use crate::write_lock::HoldHistogram;
use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// Requests are accepted at 512-byte granularity (sub-block writes merge in memory).
pub const SECTOR_SIZE_BYTES: u64 = 512;

/// How far `Core::check_invariants` goes to check every segment's live count against what
/// refers to it (each component's own invariants, and how they agree, are always checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InvariantDepth {
    /// When the whole index is in RAM: no member is read (the simulation's device
    /// operations stay its seed's).
    ResidentIndex,
    /// Reading the index pages that are only in the log.
    WholeIndex,
}

/// Writers paused (`Core::pause_writers`) for as long as it lives.
pub(crate) struct WritersPaused<'a> {
    core: &'a Core,
    /// The last batch sealed when writers paused.
    sealed_at_pause: u64,
}

impl Drop for WritersPaused<'_> {
    fn drop(&mut self) {
        let mut state = self.core.lock_state();
        assert!(state.paused, "writers were paused");
        // (`check` reads a log that does not change.)
        assert_eq!(
            state.log.last_sealed_sequence(),
            self.sealed_at_pause,
            "nothing is sealed while writers are paused"
        );
        state.paused = false;
        self.core.progress.notify_all();
    }
}

/// The parts a volume's `Core` is composed of (`volume` builds them at open).
pub(crate) struct CoreParts {
    pub geometry: Geometry,
    pub volume_uuid: [u8; 16],
    pub epoch: u64,
    pub read_only: bool,
    pub io_mode: IoMode,
    pub members: Arc<Members>,
    pub map: BlockMap,
    pub checksums: ChecksumCache,
    pub rows_on_media: Vec<AtomicU32>,
    pub cache: Option<cache::BlockCache>,
    pub state: WriteState,
    pub data_pool: Arc<BufferPool>,
    pub parity_pool: Arc<BufferPool>,
    pub write_queue_batches: usize,
    pub data_sets: usize,
    pub cleaner: CleanerSignals,
    pub write_log: Option<Arc<crate::write_log::WriteLog>>,
    pub compression: compression::Compression,
    pub shared: SharedTable,
    pub deduplication: Option<deduplication::Deduplication>,
    pub directory: CheckpointState,
    pub fault_panic_after_accepted_blocks: Option<u64>,
}

/// The read and write paths of one open volume, shared by its threads. Its fields are
/// private to `io`: the layers above use its methods.
pub(crate) struct Core {
    geometry: Geometry,
    volume_uuid: [u8; 16],
    epoch: u64,
    read_only: bool,
    io_mode: IoMode,
    members: Arc<Members>,
    /// Since this open (shared with `members`, which persists them at every superblock
    /// update on top of the lifetime counters before).
    counters: Arc<Counters>,
    map: BlockMap,
    /// CRC32C of every data-space position of every written batch.
    checksums: ChecksumCache,
    /// Per segment: rows whose batches are on the members (reads below go to members).
    rows_on_media: Vec<AtomicU32>,
    /// Per segment: bumped each time it is released (cache entries of older generations
    /// never match).
    generations: Vec<AtomicU32>,
    cache: Option<cache::BlockCache>,
    reuse_fence: RwLock<()>,
    /// The write lock.
    state: Mutex<WriteState>,
    /// Batches written, made durable, segments released: waiters for any of it.
    progress: Condvar,
    /// How long each hold of the write lock lasted.
    lock_holds: HoldHistogram,
    /// What the committed checkpoint holds (the index's directory). Held by the checkpoint
    /// writer from its snapshot to its commit (one checkpoint at a time), and by what must
    /// not run meanwhile: evicting index pages, a stream giving up its segment.
    directory: Mutex<CheckpointState>,
    data_pool: Arc<BufferPool>,
    parity_pool: Arc<BufferPool>,
    /// Sealed batches the write pipeline may hold (the parity pool's sets; each member's
    /// queue bound): how far a slow member may lag.
    write_queue_batches: usize,
    /// Sets of the data pool: one per sealed batch the pipeline may hold, one for the
    /// clients' open batch and, with client write pairs (feature bit 5), one for the cold
    /// batch. The stripe queue holds as many, so that a dispatch never blocks.
    data_sets: usize,
    stripe_queue: Mutex<Option<crate::queue::Sender<PipelineJob>>>,
    cleaner: CleanerSignals,
    closed: AtomicBool,
    /// The write log, when the volume has one (docs/write-log.md).
    write_log: Option<Arc<crate::write_log::WriteLog>>,
    /// Entries in `WriteState::log_staging` (read without the state lock).
    staged_entries: AtomicUsize,
    /// Whether client blocks are compressed, and the share the CPU affords.
    compression: compression::Compression,
    /// The shared-block table (volumes with deduplication; empty otherwise). Changed under
    /// `state`; readers resolve a record under the reuse fence alone, and a freed record
    /// is reused only after the fence has been passed (`reclaim`).
    shared: RwLock<SharedTable>,
    /// The finder of duplicates (volumes created with deduplication).
    deduplication: Option<deduplication::Deduplication>,
    /// A fault hook for tests (`OpenOptions::fault_panic_after_accepted_blocks`): client
    /// blocks left to accept before the write path panics with the write lock held
    /// (`u64::MAX`: never).
    fault_panic_countdown: std::sync::atomic::AtomicU64,
}

/// Index pages evicted under one hold of the write lock (a few milliseconds' work).
const EVICTIONS_PER_HOLD: u64 = 4096;

impl Core {
    pub(crate) fn new(parts: CoreParts) -> Core {
        let segment_count = parts.geometry.segment_count();
        assert_eq!(parts.rows_on_media.len() as u64, segment_count, "rows on media of every segment");
        assert!(parts.data_sets > parts.write_queue_batches, "a set for the open batch beyond the queue");
        parts.state.check_invariants();
        Core {
            counters: parts.members.counters.clone(),
            geometry: parts.geometry,
            volume_uuid: parts.volume_uuid,
            epoch: parts.epoch,
            read_only: parts.read_only,
            io_mode: parts.io_mode,
            members: parts.members,
            map: parts.map,
            checksums: parts.checksums,
            rows_on_media: parts.rows_on_media,
            generations: (0..segment_count).map(|_| AtomicU32::new(0)).collect(),
            cache: parts.cache,
            reuse_fence: RwLock::new(()),
            state: Mutex::new(parts.state),
            progress: Condvar::new(),
            lock_holds: HoldHistogram::default(),
            directory: Mutex::new(parts.directory),
            data_pool: parts.data_pool,
            parity_pool: parts.parity_pool,
            write_queue_batches: parts.write_queue_batches,
            data_sets: parts.data_sets,
            stripe_queue: Mutex::new(None),
            cleaner: parts.cleaner,
            closed: AtomicBool::new(false),
            write_log: parts.write_log,
            staged_entries: AtomicUsize::new(0),
            compression: parts.compression,
            shared: RwLock::new(parts.shared),
            deduplication: parts.deduplication,
            fault_panic_countdown: std::sync::atomic::AtomicU64::new(
                parts.fault_panic_after_accepted_blocks.unwrap_or(u64::MAX),
            ),
        }
    }

    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub(crate) fn volume_uuid(&self) -> &[u8; 16] {
        &self.volume_uuid
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    pub(crate) fn io_mode(&self) -> IoMode {
        self.io_mode
    }

    pub(crate) fn members(&self) -> &Arc<Members> {
        &self.members
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    pub(crate) fn map(&self) -> &BlockMap {
        &self.map
    }

    pub(crate) fn shared_table(&self) -> &RwLock<SharedTable> {
        &self.shared
    }

    pub(crate) fn deduplication(&self) -> Option<&deduplication::Deduplication> {
        self.deduplication.as_ref()
    }

    pub(crate) fn compression(&self) -> &compression::Compression {
        &self.compression
    }

    pub(crate) fn write_log(&self) -> Option<&Arc<crate::write_log::WriteLog>> {
        self.write_log.as_ref()
    }

    /// The write log, when it works (appends, not the members, make flushes durable).
    pub(crate) fn active_write_log(&self) -> Option<&Arc<crate::write_log::WriteLog>> {
        self.write_log.as_ref().filter(|log| log.is_active())
    }

    pub(crate) fn cleaner(&self) -> &CleanerSignals {
        &self.cleaner
    }

    pub(crate) fn lock_holds(&self) -> &HoldHistogram {
        &self.lock_holds
    }

    pub(crate) fn write_queue_batches(&self) -> usize {
        self.write_queue_batches
    }

    pub(crate) fn data_pool(&self) -> &Arc<BufferPool> {
        &self.data_pool
    }

    /// RAM of the write buffers (the data and parity pools' sets).
    pub(crate) fn write_buffer_memory_bytes(&self) -> u64 {
        (self.data_sets * self.geometry.data_columns() + self.write_queue_batches * self.geometry.parity_shards())
            as u64
            * self.geometry.chunk_size_bytes as u64
    }

    /// RAM of the block cache and the written batches kept for reads.
    pub(crate) fn cache_memory_bytes(&self) -> u64 {
        self.cache.as_ref().map_or(0, |cache| cache.capacity_bytes()) + self.data_pool.retained_capacity_bytes()
    }

    /// RAM of the checksum tables.
    pub(crate) fn checksum_memory_bytes(&self) -> u64 {
        self.checksums.size_bytes()
    }

    /// What the committed checkpoint holds, under the checkpoint lock (lock order: before
    /// the reuse fence and the write lock): held from a checkpoint's snapshot to its
    /// commit.
    pub(crate) fn directory(&self) -> &Mutex<CheckpointState> {
        &self.directory
    }

    /// The write lock.
    pub(crate) fn lock_state(&self) -> StateGuard<'_> {
        if let Some(guard) = self.state.try_lock() {
            return StateGuard::new(guard, self);
        }
        let started = std::time::Instant::now();
        let guard = self.state.lock();
        Counters::add(&self.counters.write_lock_waits, 1);
        Counters::add(&self.counters.write_lock_wait_nanoseconds, started.elapsed().as_nanos() as u64);
        StateGuard::new(guard, self)
    }

    pub(crate) fn try_lock_state(&self) -> Option<StateGuard<'_>> {
        self.state.try_lock().map(|guard| StateGuard::new(guard, self))
    }

    /// The write lock, for a change of the log on the members (accepting and sealing
    /// batches, releasing segments): taken once writers are not paused.
    pub(crate) fn lock_state_to_write(&self) -> StateGuard<'_> {
        let mut state = self.lock_state();
        while state.paused {
            state.wait(&self.progress);
        }
        state
    }

    /// Pause every change of the log on the members — new batches, releases — and wait
    /// until every sealed batch is written, without holding the write lock: while the
    /// guard lives the members hold a log that does not change (what `check` reads).
    /// Writers wait in [`Core::lock_state_to_write`]. One pause at a time.
    pub(crate) fn pause_writers(&self) -> WritersPaused<'_> {
        let mut state = self.lock_state_to_write();
        state.paused = true;
        while state.log.in_flight_count() > 0 && self.members.check_running().is_ok() {
            state.wait(&self.progress);
        }
        WritersPaused { core: self, sealed_at_pause: state.log.last_sealed_sequence() }
    }

    /// The reuse fence, for reading: no segment is reused while it is held.
    pub(crate) fn read_fence(&self) -> RwLockReadGuard<'_, ()> {
        self.reuse_fence.read()
    }

    /// Wake everyone waiting for progress (batches written, durability, room).
    pub(crate) fn notify_progress(&self) {
        self.progress.notify_all();
    }

    /// Wait (holding `state`, which the wait releases) until progress is notified or
    /// `timeout` passes.
    pub(crate) fn wait_for_progress(&self, state: &mut StateGuard<'_>, timeout: std::time::Duration) {
        state.wait_for(&self.progress, timeout);
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        // A volume a bug stopped serves nothing: its state may be half changed.
        if let Some(reason @ Shutdown::Panicked { .. }) = &*self.members.shutdown.lock() {
            return Err(Error::ShutDown(reason.clone()));
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        self.check_open()?;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.members.check_running()
    }

    pub(crate) fn check_range(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        if !offset_bytes.is_multiple_of(SECTOR_SIZE_BYTES) || !length_bytes.is_multiple_of(SECTOR_SIZE_BYTES) {
            return Err(Error::InvalidRequest(RequestProblem::Unaligned {
                offset_bytes,
                length_bytes,
                sector_bytes: SECTOR_SIZE_BYTES,
            }));
        }
        let size_bytes = self.map.block_count() * BLOCK_SIZE_BYTES as u64;
        match offset_bytes.checked_add(length_bytes) {
            Some(end) if end <= size_bytes => Ok(()),
            _ => Err(Error::InvalidRequest(RequestProblem::BeyondEnd { offset_bytes, length_bytes, size_bytes })),
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The volume is closed: waiters look at it under the write lock, then wait.
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _state = self.lock_state();
        self.progress.notify_all();
    }

    /// The stripe writer's queue (threaded volumes, once the pipeline started).
    pub(crate) fn start_pipeline(&self, sender: crate::queue::Sender<PipelineJob>) {
        let mut queue = self.stripe_queue.lock();
        assert!(queue.is_none(), "one pipeline per open");
        *queue = Some(sender);
    }

    /// Drop the stripe queue: the stripe writer ends, and with it the member workers.
    pub(crate) fn end_pipeline(&self) {
        self.stripe_queue.lock().take();
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

    /// Stop the volume for `reason` (the first reason stays): every later write, and after
    /// a panic every request, gets it as an error.
    pub(crate) fn fail(&self, reason: Shutdown) {
        let mut failure = self.members.shutdown.lock();
        // A panic first seen unwinding through the write lock is told again, with its
        // message, by whoever caught it: that telling replaces the first.
        if let (Some(Shutdown::Panicked { message: first, .. }), Shutdown::Panicked { message, .. }) =
            (&*failure, &reason)
        {
            if first == crate::error::UNWINDING_PANIC_MESSAGE && message != first {
                *failure = Some(reason.clone());
            }
        }
        if failure.is_none() {
            match &reason {
                Shutdown::Panicked { .. } => log::error!("the volume stopped: {reason}"),
                _ => log::warn!("the volume stopped writing: {reason}"),
            }
            *failure = Some(reason);
        }
        drop(failure);
        // Wake flushers waiting for batches that will never complete. (A thread that
        // panics while holding the write lock released it first: `StateGuard::drop`. The
        // lock is taken bare here: a guard dropped while unwinding would stop the volume
        // again.)
        let _state = self.state.lock();
        self.progress.notify_all();
        self.cleaner.wake_all();
    }

    /// Batches the stripe writer's queue holds: as many as the data pool has sets, so that
    /// a dispatch never blocks.
    pub(crate) fn stripe_queue_batches(&self) -> usize {
        self.data_sets
    }

    /// Whether the clients' open batch holds writes accepted `interval` ago or earlier
    /// (the flush timer seals and makes it durable).
    pub(crate) fn open_batch_older_than(&self, interval: std::time::Duration) -> bool {
        let state = self.lock_state();
        state.log.open().is_some_and(|open| !open.is_empty() && open.opened_at.elapsed() >= interval)
    }

    /// Whether no client write was accepted for `tick` and the free segments are below
    /// the high watermark (idle time cleans ahead of the next burst).
    pub(crate) fn idle_below_high_watermark(&self, tick: std::time::Duration) -> bool {
        let state = self.lock_state();
        let (_, high_watermark) = crate::space::watermarks(&self.geometry);
        state.log.open().is_none_or(|open| open.opened_at.elapsed() >= tick && open.is_empty())
            && state.space.free_count() < high_watermark
    }

    /// Whether more than one sealed batch waits for the members.
    pub(crate) fn members_busy(&self) -> bool {
        self.lock_state().log.in_flight_count() > 1
    }

    /// Whether the write log is more than half full (the members are synced off the
    /// clients' path, so that an append rarely waits for it).
    pub(crate) fn write_log_filling(&self) -> bool {
        self.active_write_log()
            .is_some_and(|log| log.counters.used_bytes.load(Ordering::Relaxed) * 2 > log.size_bytes())
    }

    /// The generation of `segment` (bumped each time it is released).
    pub(crate) fn generation(&self, segment: u64) -> u32 {
        self.generations[segment as usize].load(Ordering::Acquire)
    }

    /// Rows of `segment` whose batches are on the members.
    pub(crate) fn rows_on_media(&self, segment: u64) -> u32 {
        self.rows_on_media[segment as usize].load(Ordering::Acquire)
    }

    /// Blocks of data the volume holds: whole blocks, fragments' sixteenths rounded up,
    /// and each shared copy once (however many logical blocks refer to it), whole or by
    /// its share.
    pub(crate) fn held_blocks(&self) -> u64 {
        self.map.counts().held_blocks() + self.shared.read().held_blocks()
    }

    /// Evict clean index pages beyond the map cache — when no checkpoint is between its
    /// snapshot and its commit and no writer holds the write lock (which keeps the pages
    /// writers looked up in RAM). Never waits: it only tries both. Readers and writers call
    /// it after their work, holding no lock.
    pub(crate) fn evict_map_pages_if_needed(&self) {
        if self.map.over_capacity() {
            match self.directory.try_lock() {
                Some(_directory) => self.evict_map_pages_fenced(false),
                None => Counters::add(&self.counters.evictions_blocked_by_checkpoints, 1),
            }
        }
    }

    /// [`Core::evict_map_pages_if_needed`] for a caller that holds the checkpoint lock (a
    /// checkpoint just committed: every clean page's copy is durable and named). It takes
    /// the write lock for [`EVICTIONS_PER_HOLD`] pages at a time: a checkpoint that
    /// cleaned a few hundred thousand pages beyond the cache otherwise held writers for
    /// their whole eviction (0.4 s on a 60 TiB volume). With `wait_for_writers` (the
    /// checkpoint writer after its commit) it waits for the write lock between those
    /// holds rather than leave the cache over its bound; otherwise (readers and writers
    /// after their work) it gives up when a writer holds it.
    pub(crate) fn evict_map_pages_fenced(&self, wait_for_writers: bool) {
        if !self.map.over_capacity() {
            return;
        }
        let mut first = true;
        loop {
            let state = if wait_for_writers && !first { Some(self.lock_state()) } else { self.try_lock_state() };
            first = false;
            match state {
                // Fewer than asked: down to the clock's target, or nothing more may go.
                Some(_state) => {
                    if self.map.evict_at_most(EVICTIONS_PER_HOLD) < EVICTIONS_PER_HOLD {
                        return;
                    }
                }
                None => {
                    Counters::add(&self.counters.evictions_blocked_by_writers, 1);
                    return;
                }
            }
        }
    }

    /// Check every invariant of the in-RAM state that holds between operations: the
    /// components' own, how they agree with each other, what is on the members against
    /// what is sealed, and with `deep` the live count of every segment against everything
    /// that refers to it (the index, the shared copies, the committed checkpoint's blocks).
    /// Panics on the first one violated. Takes the checkpoint lock and pauses writers
    /// meanwhile.
    pub(crate) fn check_invariants(&self, depth: InvariantDepth) -> Result<()> {
        let directory = self.directory.lock();
        let _paused = self.pause_writers();
        self.check_invariants_with(&directory, depth)
    }

    /// [`Core::check_invariants`] for a caller that holds the checkpoint lock and has
    /// paused writers.
    pub(crate) fn check_invariants_with(&self, directory: &CheckpointState, depth: InvariantDepth) -> Result<()> {
        // What refers to each segment, counted first: the index's pages are read outside
        // the write lock (writers are paused, so they do not change meanwhile).
        let expected = self.live_units_referred(directory, depth)?;
        directory.check_invariants();
        let state = self.lock_state();
        state.check_invariants();
        for (segment, usage) in state.space().uses() {
            let on_media = self.rows_on_media(segment);
            match usage.status() {
                crate::space::SegmentStatus::Free | crate::space::SegmentStatus::Reserved => {
                    assert_eq!(on_media, 0, "free segment {segment} has rows on the members")
                }
                _ => assert!(on_media <= usage.sealed_rows(), "segment {segment}: more rows written than sealed"),
            }
        }
        assert_eq!(directory.generation(), state.space().checkpoints().committed, "the committed checkpoint");
        if let Some(expected) = expected {
            for (segment, usage) in state.space().uses() {
                assert_eq!(
                    usage.live_units(),
                    expected[segment as usize],
                    "segment {segment} ({:?}): its live count disagrees with what refers to it",
                    usage.status()
                );
            }
        }
        Ok(())
    }

    /// Per segment, the live units everything refers to there: the index's mappings, the
    /// shared copies, the blocks of the committed checkpoint (`directory`).
    /// `None` with `ResidentIndex` when an index page is not in RAM.
    fn live_units_referred(&self, directory: &CheckpointState, depth: InvariantDepth) -> Result<Option<Vec<u64>>> {
        let per_segment = self.geometry.blocks_per_segment();
        let mut expected = vec![0u64; self.geometry.segment_count() as usize];
        let mut count = |_, mapping: crate::index::map::Mapping| {
            if let Some(segment) = mapping.segment(per_segment) {
                expected[segment as usize] += mapping.live_units(&self.geometry);
            }
        };
        match depth {
            InvariantDepth::WholeIndex => self.map.for_each(count)?,
            InvariantDepth::ResidentIndex => {
                if !self.map.for_each_resident(&mut count) {
                    return Ok(None);
                }
            }
        }
        for (_, copy) in self.shared.read().in_use_records() {
            expected[(copy.position / per_segment) as usize] += copy.live_units(self.geometry.live_units_per_block());
        }
        for position in directory.live_positions(&self.map) {
            expected[(position / per_segment) as usize] += self.geometry.live_units_per_block();
        }
        Ok(Some(expected))
    }
}
