//! The volume: the engine's public API and its write path.
//!
//! Threads and locks (see ARCHITECTURE.md):
//! - Client threads call [`Volume::write`], [`Volume::read`], [`Volume::flush`] … .
//!   Accepting a write copies it into the open batch under `state` (the order writes
//!   are accepted in is the order of the log).
//! - Sealed batches go to the stripe writer (one thread) which computes parity and hands
//!   every member its part; one worker thread per member submits them (io_uring batches)
//!   and the last one to finish completes the batch. In `IoMode::Inline` (the
//!   deterministic simulation) the calling thread does all of that itself.
//! - Lock order: `reuse_fence` before `state`. Readers hold `reuse_fence` for reading
//!   while they look up and read blocks; a segment is only made reusable under
//!   `reuse_fence` for writing, so no reader can be reading a segment being reused.

use crate::batch::{BufferPool, OpenBatch, PooledBuffers, SealedBatch, Slot};
use crate::error::{Error, Result};
use crate::format::{self, Entry};
use crate::geometry::{Geometry, RaidLevel, Role, BLOCK_SIZE_BYTES, DEFAULT_CHUNK_SIZE_BYTES, DEFAULT_SPARE_PPM};
use crate::map::{BlockMap, Mapping};
use crate::members::{self, Members, ReadPurpose};
use crate::recovery;
use crate::stats::{Counters, MemberStatus, RecoveryReport, VolumeStats};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stripelog_blockdev::{AlignedBuffer, BlockDevice};

/// The write queue of an inline (simulation) volume, in batches: its member writes are
/// synchronous, so this only bounds batches sealed but not yet dispatched.
const INLINE_WRITE_QUEUE_BATCHES: usize = 3;
/// Requests are accepted at 512-byte granularity (sub-block writes merge in memory).
pub const SECTOR_SIZE_BYTES: u64 = 512;
/// Default time after which a non-empty open batch is sealed and made durable.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(500);

/// How a new volume is laid out.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub raid_level: RaidLevel,
    pub chunk_size_bytes: u32,
    /// Spare fraction in parts per million (200 000 = 20 %).
    pub spare_ppm: u32,
    /// The volume UUID; a random one when `None` (tests fix it for determinism).
    pub volume_uuid: Option<[u8; 16]>,
    /// Overwrite members that hold data or another volume. Without it `create` refuses
    /// them, naming what it found (docs/data-safety.md).
    pub force: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            raid_level: RaidLevel::Raid5,
            chunk_size_bytes: DEFAULT_CHUNK_SIZE_BYTES,
            spare_ppm: DEFAULT_SPARE_PPM,
            volume_uuid: None,
            force: false,
        }
    }
}

/// Who performs member I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// A stripe writer thread and one worker per member (production).
    Threaded,
    /// The calling thread, synchronously, in a deterministic order (simulation).
    Inline,
}

#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub read_only: bool,
    /// Seal and make durable an open batch this old; `None`: only on flush or when full.
    pub flush_interval: Option<Duration>,
    pub io_mode: IoMode,
    /// RAM for caching blocks (filled by reads and by every written batch); 0: none.
    pub cache_size_bytes: u64,
    /// How the cleaner chooses the segments it empties.
    pub cleaning_policy: crate::cleaner::CleaningPolicy,
    /// Relocated blocks go to their own streams, by predicted lifetime (the default). Off:
    /// one log for client writes and relocated blocks alike — the baseline the cleaning
    /// measurements compare against.
    pub separate_streams: bool,
    /// Sealed batches (with their parity) the write pipeline may hold, in bytes: how far
    /// a slow member may fall behind the others before writers wait
    /// (docs/resilience.md, "Per-member write queues"). 0: the members write in lock-step.
    pub write_queue_bytes: u64,
    /// Reads of a member that lags far behind the others are served from the rest of the
    /// row once the direct read is late (threaded volumes).
    pub hedged_reads: bool,
    /// The program recorded in the superblocks as holding the volume (read-write opens).
    pub holder_program: String,
    /// Open read-write although the superblocks say another host has the volume open and
    /// did not close it (it crashed, or still uses it: the caller must know which).
    pub take_over_from_another_host: bool,
}

/// Default write queue: 64 MiB of sealed batches and their parity.
pub const DEFAULT_WRITE_QUEUE_BYTES: u64 = 64 << 20;
/// The write queue holds at most this many batches, whatever its size in bytes.
pub const WRITE_QUEUE_BATCHES_MAXIMUM: usize = 64;
/// A member worker writes at most this many queued batches in one submission.
pub(crate) const MEMBER_SUBMIT_BATCHES_MAXIMUM: usize = 8;

/// Default block cache: 256 MiB.
pub const DEFAULT_CACHE_SIZE_BYTES: u64 = 256 << 20;

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: false,
            flush_interval: Some(DEFAULT_FLUSH_INTERVAL),
            io_mode: IoMode::Threaded,
            cache_size_bytes: DEFAULT_CACHE_SIZE_BYTES,
            cleaning_policy: crate::cleaner::CleaningPolicy::default(),
            separate_streams: true,
            write_queue_bytes: DEFAULT_WRITE_QUEUE_BYTES,
            hedged_reads: true,
            holder_program: crate::identity::default_program(),
            take_over_from_another_host: false,
        }
    }
}

/// A member as given to `create`/`open`: a name for messages and the device, or `None`
/// when it is missing.
pub struct MemberDevice {
    pub name: String,
    pub device: Option<Arc<dyn BlockDevice>>,
}

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
    /// Holds a live block redundancy cannot rebuild (found by a scrub): never a cleaning
    /// victim, since that block cannot be moved.
    pub pinned: bool,
}

/// Open segments (streams): client writes; and relocated blocks in three: short-lived
/// (their previous version lived briefly), middle, and old (unchanged for long) — so that
/// blocks that die together are written together and long-unchanged data collects in
/// full, cold segments (docs/garbage-collection.md).
pub(crate) const HOST_STREAM: usize = 0;
pub(crate) const RELOCATION_STREAMS: [usize; 3] = [1, 2, 3];
pub(crate) const STREAM_COUNT: usize = 4;

/// How often a threaded volume checks that its members are still there and whole
/// (deleted, truncated or overwritten members are failed; docs/resilience.md).
const MEMBER_HEALTH_INTERVAL: Duration = Duration::from_secs(1);

pub(crate) struct CurrentSegment {
    pub(crate) segment: u64,
    pub(crate) next_row: u32,
    pub(crate) open_sequence: u64,
}

struct InFlight {
    batch: Arc<SealedBatch>,
    written: bool,
}

pub(crate) struct WriteState {
    /// The clients' open batch; it always holds sequence `next_sequence - 1`. The cleaner
    /// swaps its own batch in while it fills it.
    pub(crate) open: Option<OpenBatch>,
    pub(crate) current_segments: [Option<CurrentSegment>; STREAM_COUNT],
    pub(crate) next_sequence: u64,
    pub(crate) last_sealed_sequence: u64,
    /// The segment of the last sealed batch (each summary names its predecessor's).
    last_sealed_segment: u64,
    written_through_sequence: u64,
    durable_through_sequence: u64,
    in_flight: VecDeque<InFlight>,
    pub(crate) segments: Vec<SegmentUse>,
    pub(crate) free_segments: VecDeque<u64>,
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
    /// Lifespans of recently cleaned client segments (the lifetime yardstick).
    pub(crate) lifespans: crate::cleaner::Lifespans,
}

/// Memory per logical block for `WriteState::write_times` and `previous_lifetimes`.
const LIFETIME_BYTES_PER_BLOCK: u64 = (std::mem::size_of::<u32>() + std::mem::size_of::<u8>()) as u64;

/// Granularity of `WriteState::write_times`: a `u32` of these wraps after 256 TiB written.
pub(crate) const WRITE_CLOCK_UNIT_BLOCKS: u64 = 16;
/// The write clock at open: blocks written before the open look 2^31 units old.
pub(crate) const WRITE_CLOCK_AT_OPEN: u64 = (1 << 31) * WRITE_CLOCK_UNIT_BLOCKS;

impl WriteState {
    /// Client writes can go on: their segment is open, or a free one lies above the
    /// cleaner's reserve.
    fn has_room_for_clients(&self) -> bool {
        self.free_segments.len() > crate::cleaner::CLEANING_RESERVE_SEGMENTS
            || self.current_segments[HOST_STREAM].is_some()
    }

    /// Blocks written by clients since `logical_block`'s last client write.
    pub(crate) fn block_age(&self, logical_block: u64) -> u64 {
        let now = (self.write_clock / WRITE_CLOCK_UNIT_BLOCKS) as u32;
        now.wrapping_sub(self.write_times[logical_block as usize]) as u64 * WRITE_CLOCK_UNIT_BLOCKS
    }
}

/// Everything the threads of one volume share.
pub(crate) struct Shared {
    pub(crate) geometry: Geometry,
    pub(crate) volume_uuid: [u8; 16],
    pub(crate) epoch: u64,
    pub(crate) read_only: bool,
    pub(crate) members: Members,
    pub(crate) map: BlockMap,
    /// CRC32C of every data-space position of every written batch.
    pub(crate) checksums: Vec<AtomicU32>,
    /// Per segment: rows whose batches are on the members (reads below go to members).
    pub(crate) rows_on_media: Vec<AtomicU32>,
    /// Per segment: bumped each time it is released (cache entries of older generations
    /// never match).
    generations: Vec<AtomicU32>,
    cache: Option<crate::cache::BlockCache>,
    pub(crate) reuse_fence: RwLock<()>,
    pub(crate) state: Mutex<WriteState>,
    pub(crate) progress: Condvar,
    pub(crate) data_pool: Arc<BufferPool>,
    /// One cleaning round at a time.
    pub(crate) cleaner: Mutex<()>,
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
    pub(crate) cleaning_policy: crate::cleaner::CleaningPolicy,
    pub(crate) separate_streams: bool,
    pub(crate) parity_pool: Arc<BufferPool>,
    /// Sealed batches the write pipeline may hold (the parity pool's sets; each member's
    /// queue bound): how far a slow member may lag.
    pub(crate) write_queue_batches: usize,
    stripe_queue: Mutex<Option<crossbeam_channel::Sender<Arc<SealedBatch>>>>,
    pub(crate) io_mode: IoMode,
    flush_interval: Option<Duration>,
    pub(crate) counters: Counters,
    closed: AtomicBool,
    recovery_report: RecoveryReport,
}

/// An open stripelog volume. Share it between threads with `Arc<Volume>`; every method
/// takes `&self`.
///
/// ```
/// use std::sync::Arc;
/// use stripelog_blockdev::{BlockDevice, MemoryDevice};
/// use stripelog_engine::{CreateOptions, MemberDevice, OpenOptions, RaidLevel, Volume};
///
/// let members = || (0..3).map(|index| MemberDevice {
///     name: format!("m{index}"),
///     device: Some(Arc::new(MemoryDevice::new(8 << 20)) as Arc<dyn BlockDevice>),
/// }).collect::<Vec<_>>();
/// let options = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
/// let volume = Volume::create(members(), &options, &OpenOptions::default()).unwrap();
/// volume.write(4096, &[7u8; 8192], false).unwrap();
/// volume.flush().unwrap();
/// let mut back = vec![0u8; 8192];
/// volume.read(4096, &mut back).unwrap();
/// assert_eq!(back, vec![7u8; 8192]);
/// volume.close().unwrap();
/// ```
pub struct Volume {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Stopped first on close, between rounds, while the pipeline still runs.
    cleaner_thread: Mutex<Option<JoinHandle<()>>>,
    abandoned: AtomicBool,
}

/// One unit of work for the write loop, per logical block.
enum BlockWrite<'a> {
    /// A whole block and its CRC32C (computed before the state lock is taken).
    Data(u64, &'a [u8], u32),
    /// A partial block: bytes `data` at `offset_bytes` inside logical block.
    Patch(u64, usize, &'a [u8]),
    Zero(u64),
    Trim(u64),
}

/// Why a client batch cannot be opened now.
enum OpenProblem {
    /// Every write buffer set is in use: wait for one.
    Buffers,
    /// Free segments are at the cleaner's reserve: clean (or fail) before going on.
    Space,
    /// Free segments are below the low watermark: clean one round, then go on.
    Cleaning,
}

impl Volume {
    /// Write fresh superblocks to `members` (any previous content is forgotten) and open
    /// the new volume.
    pub fn create(members: Vec<MemberDevice>, options: &CreateOptions, open_options: &OpenOptions) -> Result<Volume> {
        members::create(&members, options)?;
        Volume::open(members, open_options)
    }

    /// Open a volume: check its members, recover the log, rebuild the map.
    pub fn open(members: Vec<MemberDevice>, options: &OpenOptions) -> Result<Volume> {
        let (members, superblock) = members::open(members)?;
        let holder = &superblock.holder;
        if !options.read_only
            && !options.take_over_from_another_host
            && holder.open
            && !holder.host.is_empty()
            && holder.host != crate::identity::host_name()
        {
            return Err(Error::HeldByAnotherHost {
                volume: uuid::Uuid::from_bytes(superblock.volume_uuid).to_string(),
                host: holder.host.clone(),
                holder: crate::identity::describe_holder(holder),
            });
        }
        let geometry = superblock.geometry();
        let recovered =
            recovery::recover(&geometry, &members, &superblock.volume_uuid, superblock.durable_through_sequence)?;
        let superblock = if options.read_only {
            superblock
        } else {
            recovery::write_back(&geometry, &members, &recovered.discarded, &recovered.repairs)?;
            let superblock = members::advance_epoch(&members, recovered.last_sequence, &options.holder_program)?;
            recovery::release_heads(&geometry, &members, &recovered.release)?;
            superblock
        };
        let epoch = superblock.epoch;
        let physical_blocks = geometry.physical_data_blocks();
        let segment_count = geometry.segment_count();
        // Sealed batches in flight (each with a parity set), plus the open batch's data set.
        let write_queue_batches = match options.io_mode {
            IoMode::Inline => INLINE_WRITE_QUEUE_BATCHES,
            IoMode::Threaded => {
                let stripe_bytes = geometry.chunk_size_bytes as u64 * geometry.member_count as u64;
                ((options.write_queue_bytes / stripe_bytes.max(1)) as usize).clamp(1, WRITE_QUEUE_BATCHES_MAXIMUM)
            }
        };
        let data_pool =
            BufferPool::new(write_queue_batches + 1, geometry.data_columns(), geometry.chunk_size_bytes as usize);
        let parity_pool =
            BufferPool::new(write_queue_batches, geometry.parity_shards(), geometry.chunk_size_bytes as usize);
        members.set_hedged_reads(options.hedged_reads && options.io_mode == IoMode::Threaded);
        let shared = Arc::new(Shared {
            volume_uuid: superblock.volume_uuid,
            epoch,
            read_only: options.read_only,
            map: recovered.map,
            checksums: recovered.checksums,
            rows_on_media: recovered.rows_on_media,
            generations: (0..segment_count).map(|_| AtomicU32::new(0)).collect(),
            cache: crate::cache::BlockCache::new(options.cache_size_bytes),
            reuse_fence: RwLock::new(()),
            state: Mutex::new(WriteState {
                open: None,
                current_segments: [None, None, None, None],
                next_sequence: recovered.last_sequence + 1,
                last_sealed_sequence: recovered.last_sequence,
                last_sealed_segment: recovered.last_segment,
                written_through_sequence: recovered.last_sequence,
                durable_through_sequence: recovered.last_sequence,
                in_flight: VecDeque::new(),
                free_segments: (0..segment_count)
                    .filter(|&segment| recovered.segments[segment as usize].status == SegmentStatus::Free)
                    .collect(),
                segments: recovered.segments,
                write_clock: WRITE_CLOCK_AT_OPEN,
                write_times: vec![0; geometry.logical_block_count() as usize],
                previous_lifetimes: vec![u8::MAX; geometry.logical_block_count() as usize],
                lifespans: crate::cleaner::Lifespans::default(),
            }),
            progress: Condvar::new(),
            data_pool,
            parity_pool,
            write_queue_batches,
            cleaner: Mutex::new(()),
            rebuild_lock: Mutex::new(()),
            background_cleaning: options.io_mode == IoMode::Threaded && !options.read_only,
            cleaner_wakeup: Condvar::new(),
            cleaner_stop: AtomicBool::new(false),
            cleaner_gains_nothing: AtomicBool::new(false),
            cleaning_net_segments: AtomicI64::new(0),
            cleaning_policy: options.cleaning_policy,
            separate_streams: options.separate_streams,
            stripe_queue: Mutex::new(None),
            io_mode: options.io_mode,
            flush_interval: options.flush_interval,
            counters: Counters::default(),
            closed: AtomicBool::new(false),
            recovery_report: recovered.report,
            members,
            geometry,
        });
        debug_assert_eq!(shared.checksums.len() as u64, physical_blocks);
        let volume = Volume {
            threads: Mutex::new(Vec::new()),
            cleaner_thread: Mutex::new(None),
            shared,
            abandoned: AtomicBool::new(false),
        };
        if !options.read_only {
            volume.shared.prepare_rebuilding_members()?;
            volume.start_threads();
        }
        Ok(volume)
    }

    fn start_threads(&self) {
        let mut threads = self.threads.lock();
        if self.shared.io_mode == IoMode::Threaded {
            let (stripe_sender, stripe_receiver) = crossbeam_channel::bounded(self.shared.write_queue_batches + 1);
            *self.shared.stripe_queue.lock() = Some(stripe_sender);
            let (member_senders, member_threads) = crate::pipeline::start_member_workers(&self.shared);
            threads.extend(member_threads);
            let shared = self.shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("stripelog-stripe-writer".into())
                    .spawn(move || {
                        let guard = shared.clone();
                        crate::pipeline::fail_on_panic(&guard, || {
                            crate::pipeline::stripe_writer(shared, stripe_receiver, member_senders)
                        })
                    })
                    .expect("spawn the stripe writer thread"),
            );
        }
        if self.shared.background_cleaning {
            let shared = self.shared.clone();
            *self.cleaner_thread.lock() = Some(
                std::thread::Builder::new()
                    .name("stripelog-cleaner".into())
                    .spawn(move || {
                        let guard = shared.clone();
                        crate::pipeline::fail_on_panic(&guard, || crate::cleaner::background_cleaner(shared))
                    })
                    .expect("spawn the cleaner thread"),
            );
        }
        if let Some(interval) = self.shared.flush_interval {
            let shared = self.shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("stripelog-flush-timer".into())
                    .spawn(move || flush_timer(shared, interval))
                    .expect("spawn the flush timer thread"),
            );
        }
    }

    pub fn geometry(&self) -> &Geometry {
        &self.shared.geometry
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    pub fn logical_size_bytes(&self) -> u64 {
        self.shared.map.block_count() * BLOCK_SIZE_BYTES as u64
    }

    /// Write `data` at `offset_bytes` (both multiples of 512). With `fua`, the call
    /// returns only once this write and every write accepted before it are durable.
    pub fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        self.shared.check_writable()?;
        self.shared.check_range(offset_bytes, data.len() as u64)?;
        let blocks: Vec<BlockWrite> = block_pieces(offset_bytes, data.len())
            .map(|(logical_block, within, range)| {
                let piece = &data[range];
                if piece.len() < BLOCK_SIZE_BYTES {
                    BlockWrite::Patch(logical_block, within, piece)
                } else if is_all_zero(piece) {
                    BlockWrite::Zero(logical_block)
                } else {
                    BlockWrite::Data(logical_block, piece, format::block_checksum(piece))
                }
            })
            .collect();
        self.shared.apply(&blocks)?;
        Counters::add(&self.shared.counters.host_bytes_written, data.len() as u64);
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Make the range read as zeros. Whole blocks cost no media (a zero record); partial
    /// blocks at the edges are written.
    pub fn write_zeroes(&self, offset_bytes: u64, length_bytes: u64, fua: bool) -> Result<()> {
        self.ranged(offset_bytes, length_bytes, false, fua)?;
        Counters::add(&self.shared.counters.host_bytes_zeroed, length_bytes);
        Ok(())
    }

    /// Unmap the range: it reads as zeros and is a hole for block status.
    pub fn trim(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        self.ranged(offset_bytes, length_bytes, true, false)?;
        Counters::add(&self.shared.counters.host_bytes_trimmed, length_bytes);
        Ok(())
    }

    fn ranged(&self, offset_bytes: u64, length_bytes: u64, trim: bool, fua: bool) -> Result<()> {
        self.shared.check_writable()?;
        self.shared.check_range(offset_bytes, length_bytes)?;
        let block = BLOCK_SIZE_BYTES as u64;
        let end = offset_bytes + length_bytes;
        let first_whole = offset_bytes.div_ceil(block);
        let end_whole = end / block;
        static ZEROS: [u8; BLOCK_SIZE_BYTES] = [0; BLOCK_SIZE_BYTES];
        let mut edges = Vec::new();
        if first_whole > end_whole {
            // Entirely inside one block.
            edges.push(BlockWrite::Patch(
                offset_bytes / block,
                (offset_bytes % block) as usize,
                &ZEROS[..length_bytes as usize],
            ));
        } else {
            if !offset_bytes.is_multiple_of(block) {
                let within = (offset_bytes % block) as usize;
                edges.push(BlockWrite::Patch(offset_bytes / block, within, &ZEROS[..BLOCK_SIZE_BYTES - within]));
            }
            if !end.is_multiple_of(block) {
                edges.push(BlockWrite::Patch(end_whole, 0, &ZEROS[..(end % block) as usize]));
            }
        }
        self.shared.apply(&edges)?;
        // Whole blocks, a bounded slice of the work list at a time.
        const BLOCKS_PER_STEP: u64 = 1 << 16;
        let mut start = first_whole;
        while start < end_whole {
            let stop = (start + BLOCKS_PER_STEP).min(end_whole);
            let step: Vec<BlockWrite> =
                (start..stop).map(|lb| if trim { BlockWrite::Trim(lb) } else { BlockWrite::Zero(lb) }).collect();
            self.shared.apply(&step)?;
            start = stop;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Read `buffer.len()` bytes at `offset_bytes` (both multiples of 512).
    pub fn read(&self, offset_bytes: u64, buffer: &mut [u8]) -> Result<()> {
        self.shared.check_open()?;
        self.shared.check_range(offset_bytes, buffer.len() as u64)?;
        let _fence = self.shared.reuse_fence.read();
        let mut scratch = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        for (logical_block, within, range) in block_pieces(offset_bytes, buffer.len()) {
            self.shared.read_block(logical_block, &mut scratch, None)?;
            let count = range.len();
            buffer[range].copy_from_slice(&scratch[within..within + count]);
        }
        Counters::add(&self.shared.counters.host_bytes_read, buffer.len() as u64);
        Ok(())
    }

    /// Like [`Volume::read`], but only from memory (unmapped and zero blocks, batches not
    /// yet on the members, the block cache): `Ok(false)` when some block would need a
    /// member read, and then `buffer` holds nothing useful. Never waits for a member, so
    /// a network server can answer it on its receiving thread.
    pub fn read_from_memory(&self, offset_bytes: u64, buffer: &mut [u8]) -> Result<bool> {
        self.shared.check_open()?;
        self.shared.check_range(offset_bytes, buffer.len() as u64)?;
        let _fence = self.shared.reuse_fence.read();
        let mut scratch = [0u8; BLOCK_SIZE_BYTES];
        for (logical_block, within, range) in block_pieces(offset_bytes, buffer.len()) {
            let target = if range.len() == BLOCK_SIZE_BYTES { &mut buffer[range.clone()] } else { &mut scratch[..] };
            if matches!(self.shared.read_block_from_memory(logical_block, target, None), Lookup::OnMembers) {
                return Ok(false);
            }
            if range.len() < BLOCK_SIZE_BYTES {
                let count = range.len();
                buffer[range].copy_from_slice(&scratch[within..within + count]);
            }
        }
        Counters::add(&self.shared.counters.host_bytes_read, buffer.len() as u64);
        Ok(true)
    }

    /// The mapping of one logical block (for block-status queries).
    pub fn mapping(&self, logical_block: u64) -> Result<Mapping> {
        if logical_block >= self.shared.map.block_count() {
            return Err(Error::InvalidRequest(format!("block {logical_block} is beyond the end of the volume")));
        }
        Ok(self.shared.map.get(logical_block))
    }

    /// Return when every write accepted before the call is durable on the members.
    pub fn flush(&self) -> Result<()> {
        self.shared.flush()
    }

    pub fn stats(&self) -> VolumeStats {
        self.shared.stats()
    }

    /// Verify every live batch on the members: each block against its checksum, each
    /// parity row and mirror copy against the data. Flushes first when writable, and
    /// holds writers back while it runs.
    pub fn check(&self) -> Result<crate::recovery::CheckReport> {
        if !self.shared.read_only {
            self.flush()?;
        }
        let shared = &self.shared;
        // Writers pause while the log is read, so that it does not change under the scan.
        let _state = shared.state.lock();
        let durable = shared.members.superblock().durable_through_sequence;
        let mut report =
            crate::recovery::check(&shared.geometry, &shared.members, &shared.volume_uuid, durable, &shared.map)?;
        report.members_not_redundant = shared.members.lost();
        Ok(report)
    }

    /// Flush, stop the background threads and close the volume.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    /// Drop the volume as if the process died: nothing more is written (simulation).
    pub fn abandon(self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.shared.fail("abandoned (simulated crash)".into());
        self.stop_threads();
    }

    fn shutdown(&self) -> Result<()> {
        if self.shared.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.stop_cleaner();
        let result = if self.shared.read_only || self.abandoned.load(Ordering::SeqCst) {
            Ok(())
        } else {
            self.flush().and_then(|()| {
                let durable = self.shared.state.lock().durable_through_sequence;
                members::record_clean_close(&self.shared.members, durable)
            })
        };
        self.stop_threads();
        result
    }

    /// Let the cleaner thread finish its round (made durable by the round itself) and end.
    fn stop_cleaner(&self) {
        self.shared.cleaner_stop.store(true, Ordering::SeqCst);
        {
            let _state = self.shared.state.lock();
            self.shared.cleaner_wakeup.notify_all();
        }
        if let Some(thread) = self.cleaner_thread.lock().take() {
            let _ = thread.join();
        }
    }

    fn stop_threads(&self) {
        self.stop_cleaner();
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.progress.notify_all();
        // Dropping the stripe queue ends the stripe writer, which ends the member workers.
        self.shared.stripe_queue.lock().take();
        for thread in self.threads.lock().drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Unwinding: the state may be half-changed (a batch sealed and never written);
            // waiting for it would hang. Stop as a crash would: nothing more is written.
            self.abandoned.store(true, Ordering::SeqCst);
            self.shared.fail("dropped while unwinding a panic".into());
            self.stop_threads();
            return;
        }
        let _ = self.shutdown();
    }
}

fn flush_timer(shared: Arc<Shared>, interval: Duration) {
    let tick = (interval / 4).max(Duration::from_millis(5));
    let mut health_checked = Instant::now();
    while !shared.closed.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        if health_checked.elapsed() >= MEMBER_HEALTH_INTERVAL {
            health_checked = Instant::now();
            if let Err(error) = shared.members.check_health() {
                shared.fail(error.to_string());
            }
        }
        let due = {
            let state = shared.state.lock();
            state.open.as_ref().is_some_and(|open| !open.is_empty() && open.opened_at.elapsed() >= interval)
        };
        if due {
            // A failure is recorded in `failure` and reported to the next client call.
            let _ = shared.flush();
        }
        // Idle (nothing accepted for a tick): make free segments ahead of the next burst,
        // up to the high watermark.
        let idle = {
            let state = shared.state.lock();
            let (_, high_watermark) = crate::cleaner::watermarks(shared.geometry.segment_count());
            state.open.as_ref().is_none_or(|open| open.opened_at.elapsed() >= tick && open.is_empty())
                && state.free_segments.len() < high_watermark
        };
        if idle && !shared.background_cleaning && shared.members.shutdown.lock().is_none() {
            if let Err(error) = shared.clean_round() {
                shared.fail(error.to_string());
            }
        }
    }
}

/// Split the byte range `offset_bytes .. + length_bytes` into per-block pieces:
/// (logical block, offset inside it, range of the caller's buffer).
fn block_pieces(offset_bytes: u64, length_bytes: usize) -> impl Iterator<Item = (u64, usize, std::ops::Range<usize>)> {
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

pub(crate) fn is_all_zero(bytes: &[u8]) -> bool {
    let (prefix, words, suffix) = {
        // SAFETY: u64 has no invalid bit patterns; align_to only reinterprets whole,
        // aligned u64s inside the slice and returns the unaligned ends as bytes.
        unsafe { bytes.align_to::<u64>() }
    };
    prefix.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && suffix.iter().all(|&b| b == 0)
}

impl Shared {
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<()> {
        self.check_open()?;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if let Some(reason) = self.members.shutdown.lock().clone() {
            return Err(Error::Failed(reason));
        }
        Ok(())
    }

    fn check_range(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
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

    pub(crate) fn fail(&self, reason: String) {
        let mut failure = self.members.shutdown.lock();
        if failure.is_none() {
            *failure = Some(reason);
        }
        drop(failure);
        // Wake flushers waiting for batches that will never complete.
        let _state = self.state.lock();
        self.progress.notify_all();
    }

    /// The write loop: accept `blocks` in order into open batches, sealing and
    /// dispatching full ones.
    fn apply(&self, blocks: &[BlockWrite]) -> Result<()> {
        // A partial block merges with its old content when it is accepted. One whose old
        // content cannot be read (damage beyond redundancy) fails the request before any
        // of it is accepted, rather than after its other blocks.
        if blocks.iter().any(|block| matches!(block, BlockWrite::Patch(..))) {
            let state = self.state.lock();
            let mut old = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
            for block in blocks {
                if let BlockWrite::Patch(logical_block, ..) = block {
                    self.read_block(*logical_block, &mut old, Some(&state))?;
                }
            }
        }
        let mut next = 0usize;
        let mut cleaned_for_this_segment = false;
        while next < blocks.len() {
            let mut state = self.state.lock();
            if let Some(reason) = self.members.shutdown.lock().clone() {
                return Err(Error::Failed(reason));
            }
            if state.open.is_none() {
                match self.open_batch(&mut state, cleaned_for_this_segment) {
                    // A new segment: it may clean once more (one round per new segment).
                    Ok(new_segment) => cleaned_for_this_segment &= !new_segment,
                    Err(OpenProblem::Buffers) => {
                        drop(state);
                        self.data_pool.wait_for_free();
                        continue;
                    }
                    Err(OpenProblem::Space) => {
                        drop(state);
                        self.make_space()?;
                        continue;
                    }
                    Err(OpenProblem::Cleaning) => {
                        drop(state);
                        // Paced with the writes: one round per new client segment.
                        self.clean_round()?;
                        cleaned_for_this_segment = true;
                        continue;
                    }
                }
            }
            let mut sealed = None;
            while next < blocks.len() {
                if self.accept(&mut state, &blocks[next])? {
                    next += 1;
                } else if state.open.as_ref().is_some_and(OpenBatch::is_empty) {
                    // Too few rows left in the segment for even one entry: retire them.
                    self.retire_current_segment(&mut state);
                    break;
                } else {
                    sealed = Some(self.seal(&mut state));
                    break;
                }
            }
            drop(state);
            if let Some(batch) = sealed {
                self.dispatch(batch)?;
            }
        }
        Ok(())
    }

    /// Open the clients' batch; `Ok(true)` when it starts a new segment.
    fn open_batch(&self, state: &mut WriteState, cleaned: bool) -> std::result::Result<bool, OpenProblem> {
        let sequence = state.next_sequence;
        if state.current_segments[HOST_STREAM].is_none() {
            let (low_watermark, _) = crate::cleaner::watermarks(self.geometry.segment_count());
            let free = state.free_segments.len();
            if free <= crate::cleaner::CLEANING_RESERVE_SEGMENTS {
                return Err(OpenProblem::Space);
            }
            if free < low_watermark && self.background_cleaning {
                self.cleaner_wakeup.notify_one();
            } else if free < low_watermark && !cleaned {
                return Err(OpenProblem::Cleaning);
            }
        }
        let buffers: PooledBuffers = self.data_pool.try_take().ok_or(OpenProblem::Buffers)?;
        let new_segment = state.current_segments[HOST_STREAM].is_none();
        if new_segment {
            let segment = state.free_segments.pop_front().expect("checked above");
            self.start_stream_segment(state, HOST_STREAM, segment, sequence);
        }
        let current = state.current_segments[HOST_STREAM].as_ref().expect("set above");
        state.open = Some(self.batch_in(current, sequence, buffers, HOST_STREAM));
        state.next_sequence += 1;
        Ok(new_segment)
    }

    /// Make free `segment` the current segment of `stream`.
    pub(crate) fn start_stream_segment(&self, state: &mut WriteState, stream: usize, segment: u64, sequence: u64) {
        let usage = &mut state.segments[segment as usize];
        usage.status = SegmentStatus::Current;
        usage.opened_clock = state.write_clock;
        usage.age_clock = 0;
        usage.stream = stream as u8;
        usage.pinned = false;
        state.current_segments[stream] = Some(CurrentSegment { segment, next_row: 0, open_sequence: sequence });
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
    fn accept(&self, state: &mut WriteState, block: &BlockWrite) -> Result<bool> {
        match *block {
            BlockWrite::Data(logical_block, data, checksum) => {
                Ok(self.accept_data(state, logical_block, data, checksum))
            }
            BlockWrite::Zero(logical_block) => Ok(self.accept_range(state, logical_block, false)),
            BlockWrite::Trim(logical_block) => Ok(self.accept_range(state, logical_block, true)),
            BlockWrite::Patch(logical_block, within, data) => {
                let mut merged = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                self.read_block(logical_block, &mut merged, Some(state))?;
                merged[within..within + data.len()].copy_from_slice(data);
                if is_all_zero(&merged) {
                    Ok(self.accept_range(state, logical_block, false))
                } else {
                    let checksum = format::block_checksum(&merged);
                    Ok(self.accept_data(state, logical_block, &merged, checksum))
                }
            }
        }
    }

    pub(crate) fn accept_data(&self, state: &mut WriteState, logical_block: u64, data: &[u8], checksum: u32) -> bool {
        debug_assert_eq!(checksum, format::block_checksum(data));
        let open = state.open.as_mut().expect("an open batch");
        let Some(Slot::Block(index)) = open.reserve(true) else {
            return false;
        };
        open.block_mut(index).copy_from_slice(data);
        let (row, column) = open.place(index);
        let position = self.geometry.position(open.segment, open.first_row + row, column);
        open.push_entry(Entry::Data { logical_block, checksum });
        self.checksums[position as usize].store(checksum, Ordering::Release);
        self.remap(state, logical_block, Mapping::Data { position });
        true
    }

    pub(crate) fn accept_range(&self, state: &mut WriteState, logical_block: u64, trim: bool) -> bool {
        let current = self.map.get(logical_block);
        let redundant = match current {
            Mapping::Unmapped => true,
            Mapping::Trimmed { .. } => true,
            Mapping::Zero { .. } => !trim,
            Mapping::Data { .. } => false,
        };
        if redundant {
            return true;
        }
        self.record_range(state, logical_block, trim)
    }

    /// Add a zero or trim record for `logical_block` to the open batch (`false`: full).
    pub(crate) fn record_range(&self, state: &mut WriteState, logical_block: u64, trim: bool) -> bool {
        let open = state.open.as_mut().expect("an open batch");
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

    /// Point `logical_block` at `mapping`, keeping segment live counts.
    fn remap(&self, state: &mut WriteState, logical_block: u64, mapping: Mapping) {
        let per_segment = self.geometry.blocks_per_segment();
        let old = self.map.set(logical_block, mapping);
        if state.open.as_ref().is_none_or(|open| open.stream == HOST_STREAM) {
            let now = (state.write_clock / WRITE_CLOCK_UNIT_BLOCKS) as u32;
            let index = logical_block as usize;
            state.previous_lifetimes[index] = if old == Mapping::Unmapped {
                u8::MAX
            } else {
                (u32::BITS - now.wrapping_sub(state.write_times[index]).leading_zeros()) as u8
            };
            state.write_times[index] = now;
            state.write_clock += 1;
        }
        if let Some(segment) = mapping.segment(per_segment) {
            state.segments[segment as usize].live_blocks += 1;
        }
        if let (Some(cache), Mapping::Data { position }) = (&self.cache, old) {
            // Its cache entry goes when the batch is written (member workers), or now when
            // the batch already names too many.
            match state.open.as_mut() {
                Some(open) if open.killed_positions.len() < crate::batch::KILLED_POSITIONS_MAXIMUM => {
                    open.killed_positions.push(position)
                }
                _ => cache.forget(position),
            }
        }
        if let Some(segment) = old.segment(per_segment) {
            let killer = state.open.as_ref().map_or(state.next_sequence, |open| open.sequence);
            let usage = &mut state.segments[segment as usize];
            usage.live_blocks -= 1;
            if usage.live_blocks == 0 && usage.status == SegmentStatus::Used {
                usage.status = SegmentStatus::WaitingForFlush(killer);
            }
        }
    }

    /// Give up the rest of the current segment (and the empty open batch in it).
    fn retire_current_segment(&self, state: &mut WriteState) {
        state.open = None;
        state.next_sequence -= 1;
        self.retire_stream_segment(state, HOST_STREAM);
    }

    /// If `segment` is some stream's current segment, give up the rest of it (the clients'
    /// open batch is sealed first when it is there) so that it can be cleaned.
    pub(crate) fn retire_if_current(&self, state: &mut WriteState, segment: u64) {
        for stream in 0..STREAM_COUNT {
            if state.current_segments[stream].as_ref().is_some_and(|current| current.segment == segment) {
                if state.open.as_ref().is_some_and(|open| open.stream == stream) {
                    if state.open.as_ref().is_some_and(|open| !open.is_empty()) {
                        let batch = self.seal(state);
                        // The batch is in flight; dispatch cannot fail here but a
                        // shut-down volume, which the caller sees on its next step.
                        let _ = self.dispatch(batch);
                    } else {
                        state.open = None;
                        state.next_sequence -= 1;
                    }
                }
                self.retire_stream_segment(state, stream);
            }
        }
    }

    /// Give up the rest of a stream's current segment.
    pub(crate) fn retire_stream_segment(&self, state: &mut WriteState, stream: usize) {
        if let Some(current) = state.current_segments[stream].take() {
            let usage = &mut state.segments[current.segment as usize];
            usage.status = if usage.live_blocks == 0 {
                SegmentStatus::WaitingForFlush(state.last_sealed_sequence)
            } else {
                SegmentStatus::Used
            };
        }
    }

    /// Seal the open batch (it must hold entries) and queue it for writing.
    pub(crate) fn seal(&self, state: &mut WriteState) -> Arc<SealedBatch> {
        let open = state.open.take().expect("an open batch");
        let stream = open.stream;
        let (sealed, metadata) =
            open.seal(self.volume_uuid, self.epoch, state.durable_through_sequence, state.last_sealed_segment);
        let header = sealed.header;
        for (index, checksum) in metadata {
            let data_columns = self.geometry.data_columns() as u32;
            let position = self.geometry.position(
                header.segment,
                header.first_row + index / data_columns,
                (index % data_columns) as usize,
            );
            self.checksums[position as usize].store(checksum, Ordering::Release);
        }
        let current = state.current_segments[stream].as_mut().expect("a current segment");
        current.next_row = header.first_row + header.row_count;
        let segment_full = current.next_row == self.geometry.rows_per_chunk();
        let usage = &mut state.segments[header.segment as usize];
        usage.age_clock = state.write_clock;
        if segment_full {
            state.current_segments[stream] = None;
            usage.status = if usage.live_blocks == 0 {
                SegmentStatus::WaitingForFlush(header.sequence)
            } else {
                SegmentStatus::Used
            };
        }
        state.last_sealed_sequence = header.sequence;
        state.last_sealed_segment = header.segment;
        let batch = Arc::new(sealed);
        state.in_flight.push_back(InFlight { batch: batch.clone(), written: false });
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
                sender.send(batch).map_err(|_| Error::Closed)?;
            }
        }
        self.members.shutdown.lock().clone().map_or(Ok(()), |reason| Err(Error::Failed(reason)))
    }

    /// The slice of `batch` (or its parity) that `member` stores, and where.
    pub(crate) fn member_part<'a>(
        &self,
        batch: &'a SealedBatch,
        parity: &'a PooledBuffers,
        member: usize,
    ) -> (&'a [u8], u64) {
        let header = &batch.header;
        let length = header.row_count as usize * BLOCK_SIZE_BYTES;
        let buffer = match self.geometry.role_of_member(header.segment, member) {
            Role::Data { column, .. } => batch.data_column(column),
            Role::Parity { shard } => &parity.buffers()[shard][..length],
        };
        (buffer, self.geometry.member_offset_bytes(header.segment, header.first_row))
    }

    fn write_member_part(
        &self,
        batch: &SealedBatch,
        parity: &PooledBuffers,
        member: usize,
    ) -> std::result::Result<(), String> {
        let Some(device) = self.members.writable(member) else {
            return Ok(());
        };
        let (buffer, offset) = self.member_part(batch, parity, member);
        // A member that fails is failed (durably) and the batch counts as written on the
        // others; only a loss the volume cannot survive is an error.
        device
            .write_at(buffer, offset)
            .or_else(|error| self.members.write_failed(member, error))
            .map_err(|error| error.to_string())
    }

    /// Account a batch whose member writes finished (with the first error, if any), and
    /// retire written batches in sequence order.
    pub(crate) fn batch_written(&self, batch: &SealedBatch, error: Option<String>) {
        if let Some(reason) = error {
            self.fail(format!("writing batch {}: {reason}", batch.header.sequence));
        } else {
            // Before the batch counts as written: until then no flush covers it, so its
            // segment cannot be released (and its generation bumped) meanwhile.
            self.cache_batch(batch);
        }
        self.count_batch(batch);
        let mut state = self.state.lock();
        if let Some(entry) =
            state.in_flight.iter_mut().find(|entry| entry.batch.header.sequence == batch.header.sequence)
        {
            entry.written = true;
        }
        while state.in_flight.front().is_some_and(|entry| entry.written) {
            let entry = state.in_flight.pop_front().expect("front exists");
            let header = &entry.batch.header;
            self.rows_on_media[header.segment as usize].store(header.first_row + header.row_count, Ordering::Release);
            state.written_through_sequence = header.sequence;
        }
        self.progress.notify_all();
    }

    /// Put every block of a just-written batch in the cache (recent writes are hot).
    fn cache_batch(&self, batch: &SealedBatch) {
        let Some(cache) = &self.cache else { return };
        let header = &batch.header;
        for &position in &batch.killed_positions {
            cache.forget(position);
        }
        // Relocated blocks are the ones nobody wrote for a while: they would only push
        // recently written blocks out (reads cache them again when they are wanted).
        if batch.relocation {
            return;
        }
        let generation = self.generation(header.segment);
        for row in header.first_row..header.first_row + header.row_count {
            for column in 0..self.geometry.data_columns() {
                if let Some(block) = batch.block(row, column) {
                    cache.insert(self.geometry.position(header.segment, row, column), generation, block);
                }
            }
        }
    }

    fn count_batch(&self, batch: &SealedBatch) {
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
        let (target, sealed) = {
            let mut state = self.state.lock();
            let sealed = match &state.open {
                Some(open) if !open.is_empty() => Some(self.seal(&mut state)),
                _ => None,
            };
            (state.last_sealed_sequence, sealed)
        };
        if let Some(batch) = sealed {
            self.dispatch(batch)?;
        }
        self.make_durable(target)
    }

    /// Make every sealed batch durable (the clients' open batch stays open), then
    /// release what that frees (the cleaner's last step).
    pub(crate) fn make_sealed_durable(&self) -> Result<()> {
        let target = self.state.lock().last_sealed_sequence;
        self.make_durable(target)
    }

    /// Wait until every batch up to `target` is written, flush the members, record the
    /// new durable point and release the segments it frees.
    fn make_durable(&self, target: u64) -> Result<()> {
        {
            let mut state = self.state.lock();
            loop {
                if let Some(reason) = self.members.shutdown.lock().clone() {
                    return Err(Error::Failed(reason));
                }
                if state.durable_through_sequence >= target {
                    return Ok(());
                }
                if state.written_through_sequence >= target {
                    break;
                }
                self.progress.wait(&mut state);
            }
        }
        self.members.flush_all(self.io_mode == IoMode::Threaded).inspect_err(|error| self.fail(error.to_string()))?;
        Counters::add(&self.counters.flushes, 1);
        {
            let mut state = self.state.lock();
            state.durable_through_sequence = state.durable_through_sequence.max(target);
        }
        self.reclaim().inspect_err(|error| self.fail(error.to_string()))?;
        Ok(())
    }

    /// Record in the superblocks that every batch through `durable` is durable, unless
    /// they already say so.
    fn record_durable_through(&self, durable: u64) -> Result<()> {
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
    fn reclaim(&self) -> Result<()> {
        let (releasing, durable): (Vec<u64>, u64) = {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            let durable = state.durable_through_sequence;
            let mut releasing = Vec::new();
            for (index, segment) in state.segments.iter_mut().enumerate() {
                if matches!(segment.status, SegmentStatus::WaitingForFlush(tag) if tag <= durable) {
                    segment.status = SegmentStatus::Releasing;
                    releasing.push(index as u64);
                }
            }
            (releasing, durable)
        };
        if releasing.is_empty() {
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
            }
        }
        let zeros = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        let heads: Vec<u64> = releasing.iter().map(|&segment| self.geometry.member_offset_bytes(segment, 0)).collect();
        self.members.write_everywhere(&zeros, &heads, self.io_mode == IoMode::Threaded)?;
        self.members.flush_all(self.io_mode == IoMode::Threaded)?;
        let mut state = self.state.lock();
        for segment in releasing {
            state.segments[segment as usize].status = SegmentStatus::Free;
            self.rows_on_media[segment as usize].store(0, Ordering::Release);
            state.free_segments.push_back(segment);
        }
        self.progress.notify_all();
        Ok(())
    }

    /// Flush so that dead segments can be released, release them, and wait for releases
    /// another thread has under way; `OutOfSpace` only when nothing more can come free.
    fn make_space(&self) -> Result<()> {
        if self.background_cleaning {
            // The cleaner thread frees segments (its rounds also release the segments
            // whose death became durable); wait for it while it gains something.
            let mut state = self.state.lock();
            loop {
                if state.has_room_for_clients() {
                    return Ok(());
                }
                if let Some(reason) = self.members.shutdown.lock().clone() {
                    return Err(Error::Failed(reason));
                }
                if self.cleaner_gains_nothing.load(Ordering::SeqCst) || self.cleaner_stop.load(Ordering::SeqCst) {
                    break;
                }
                self.cleaner_wakeup.notify_one();
                self.progress.wait_for(&mut state, Duration::from_millis(10));
            }
        }
        self.flush()?;
        let mut progress = crate::cleaner::ProgressWindow::new(self.cleaning_net_segments.load(Ordering::SeqCst));
        loop {
            self.reclaim().inspect_err(|error| self.fail(error.to_string()))?;
            let state = self.state.lock();
            if state.has_room_for_clients() {
                return Ok(());
            }
            // A round can only gain a free segment if the used segments hold at least a
            // segment's worth of dead blocks between them; less than that is a full volume.
            let per_segment = self.geometry.blocks_per_segment();
            let dead: u64 = state
                .segments
                .iter()
                .filter(|usage| usage.status == SegmentStatus::Used)
                .map(|usage| per_segment.saturating_sub(usage.live_blocks))
                .sum();
            drop(state);
            // Clean until there is room; nothing left to clean means the volume is full, and
            // so do rounds that win no room (a spare too small for the cleaner's overheads).
            if dead >= 2 * per_segment
                && self.clean_round()?
                && progress.after_round(self.cleaning_net_segments.load(Ordering::SeqCst))
            {
                continue;
            }
            let mut state = self.state.lock();
            let durable = state.durable_through_sequence;
            let coming_free = state.segments.iter().any(|segment| match segment.status {
                SegmentStatus::Releasing => true,
                SegmentStatus::WaitingForFlush(tag) => tag <= durable,
                _ => false,
            });
            if !coming_free {
                return Err(Error::OutOfSpace);
            }
            if let Some(reason) = self.members.shutdown.lock().clone() {
                return Err(Error::Failed(reason));
            }
            self.progress.wait_for(&mut state, Duration::from_millis(10));
        }
    }

    /// Read logical block `logical_block` into `out` (4096 bytes). Callers hold the reuse
    /// fence, or pass the state they hold (which also keeps segments from being reused).
    pub(crate) fn read_block(&self, logical_block: u64, out: &mut [u8], held: Option<&WriteState>) -> Result<()> {
        match self.map.get(logical_block) {
            Mapping::Data { position } => self.read_position(position, logical_block, out, held),
            _ => {
                out.fill(0);
                Ok(())
            }
        }
    }

    /// Read the block at data-space `position` (which holds `logical_block`) into `out`:
    /// from memory when it is there, else from the members, verified. Same locking rules
    /// as [`Shared::read_block`].
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
        let expected = self.checksums[position as usize].load(Ordering::Acquire);
        let checksum_of = |column: usize| {
            let other = self.geometry.position(location.segment, location.row, column);
            Some(self.checksums[other as usize].load(Ordering::Acquire))
        };
        self.read_verified(location, &|block| format::block_checksum(block) == expected, &checksum_of, out).map_err(
            |reason| {
                Counters::add(&self.counters.unrecoverable_reads, 1);
                Error::Unrecoverable { logical_block, reason }
            },
        )?;
        if let Some(cache) = &self.cache {
            cache.insert(position, generation, out);
        }
        Ok(())
    }

    /// Serve a block from memory when it is there: unmapped or zero, in a batch not yet
    /// on the members, or in the cache. Same locking rules as [`Shared::read_block`].
    fn read_block_from_memory(&self, logical_block: u64, out: &mut [u8], held: Option<&WriteState>) -> Lookup {
        match self.map.get(logical_block) {
            Mapping::Data { position } => self.position_from_memory(position, out, held),
            _ => {
                out.fill(0);
                Lookup::Served
            }
        }
    }

    fn position_from_memory(&self, position: u64, out: &mut [u8], held: Option<&WriteState>) -> Lookup {
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
        if let Some(cache) = &self.cache {
            if cache.get(position, generation, out) {
                return Lookup::Served;
            }
        }
        Lookup::OnMembers
    }

    fn read_verified(
        &self,
        location: crate::geometry::BlockLocation,
        valid: &dyn Fn(&[u8]) -> bool,
        checksum_of: &dyn Fn(usize) -> Option<u32>,
        out: &mut [u8],
    ) -> std::result::Result<(), String> {
        self.members
            .read_verified(&self.geometry, &self.counters, location, valid, checksum_of, ReadPurpose::Client, out)
            .map(|_| ())
    }

    pub(crate) fn stats(&self) -> VolumeStats {
        let geometry = &self.geometry;
        let (mut blocks_mapped, mut blocks_zero) = (0u64, 0u64);
        for mapping in self.map.iter() {
            match mapping {
                Mapping::Data { .. } => blocks_mapped += 1,
                Mapping::Zero { .. } => blocks_zero += 1,
                _ => {}
            }
        }
        let state = self.state.lock();
        let count_status = |wanted: fn(&SegmentStatus) -> bool| {
            state.segments.iter().filter(|segment| wanted(&segment.status)).count() as u64
        };
        let segments_free = count_status(|status| *status == SegmentStatus::Free);
        let segments_waiting =
            count_status(|status| matches!(status, SegmentStatus::WaitingForFlush(_) | SegmentStatus::Releasing));
        let counters = &self.counters;
        let lost = self.members.lost();
        let (rebuilding, missing): (Vec<usize>, Vec<usize>) =
            lost.iter().partition(|&&member| self.members.state(member) == crate::members::MemberState::Rebuilding);
        let member_statuses: Vec<MemberStatus> = self.members.statuses();
        let superblock = self.members.superblock();
        let holder = &superblock.holder;
        let member_bytes_written = member_statuses.iter().map(|member| member.bytes_written).sum();
        let member_bytes_data = Counters::get(&counters.member_bytes_data);
        let member_bytes_relocated = Counters::get(&counters.member_bytes_relocated);
        let ratio = |numerator: u64, denominator: u64| {
            if denominator == 0 {
                0.0
            } else {
                numerator as f64 / denominator as f64
            }
        };
        VolumeStats {
            volume_uuid: uuid::Uuid::from_bytes(self.volume_uuid).to_string(),
            raid_level: geometry.raid_level.to_string(),
            member_count: geometry.member_count,
            data_columns: geometry.data_columns(),
            chunk_size_bytes: geometry.chunk_size_bytes,
            block_size_bytes: BLOCK_SIZE_BYTES,
            spare_fraction: geometry.spare_ppm as f64 / 1_000_000.0,
            member_size_bytes: geometry.member_size_bytes,
            logical_size_bytes: geometry.logical_size_bytes(),
            physical_data_bytes: geometry.physical_data_blocks() * BLOCK_SIZE_BYTES as u64,
            data_capacity_bytes: geometry.data_capacity_blocks() * BLOCK_SIZE_BYTES as u64,
            epoch: self.epoch,
            read_only: self.read_only,
            degraded: !lost.is_empty(),
            failures_still_tolerated: self.members.further_losses_survived(),
            missing_members: missing,
            rebuilding_members: rebuilding,
            failure: self.members.shutdown.lock().clone(),
            members: member_statuses,
            holder: crate::stats::HolderStatus {
                open: holder.open,
                process_id: holder.process_id,
                host: holder.host.clone(),
                program: holder.program.clone(),
                opened_unix_seconds: holder.opened_unix_seconds,
                closed_unix_seconds: holder.closed_unix_seconds,
                description: crate::identity::describe_holder(holder),
            },
            retired_members: superblock
                .retired
                .iter()
                .map(|retired| crate::stats::RetiredMemberStatus {
                    member_uuid: uuid::Uuid::from_bytes(retired.member_uuid).to_string(),
                    position: retired.position,
                    retired_unix_seconds: retired.retired_unix_seconds,
                })
                .collect(),
            superblock_version: superblock.version,
            blocks_mapped,
            blocks_zero,
            segments_total: geometry.segment_count(),
            segments_used: geometry.segment_count() - segments_free - segments_waiting,
            segments_free,
            segments_waiting_for_flush: segments_waiting,
            host_bytes_written: Counters::get(&counters.host_bytes_written),
            host_bytes_read: Counters::get(&counters.host_bytes_read),
            host_bytes_zeroed: Counters::get(&counters.host_bytes_zeroed),
            host_bytes_trimmed: Counters::get(&counters.host_bytes_trimmed),
            member_bytes_written,
            member_bytes_data,
            member_bytes_relocated,
            cleaning_policy: self.cleaning_policy.to_string(),
            cleaning_rounds: Counters::get(&counters.cleaning_rounds),
            segments_cleaned: Counters::get(&counters.segments_cleaned),
            write_amplification_cleaning: ratio(member_bytes_data + member_bytes_relocated, member_bytes_data),
            write_amplification_raid: ratio(member_bytes_written, member_bytes_data + member_bytes_relocated),
            write_amplification_total: ratio(member_bytes_written, member_bytes_data),
            member_bytes_redundancy: Counters::get(&counters.member_bytes_redundancy),
            member_bytes_metadata: Counters::get(&counters.member_bytes_metadata),
            member_bytes_padding: Counters::get(&counters.member_bytes_padding),
            flushes: Counters::get(&counters.flushes),
            batches_written: Counters::get(&counters.batches_written),
            full_stripes: Counters::get(&counters.full_stripes),
            short_stripes: Counters::get(&counters.short_stripes),
            read_errors: Counters::get(&counters.read_errors),
            checksum_mismatches: Counters::get(&counters.checksum_mismatches),
            reconstructed_blocks: Counters::get(&counters.reconstructed_blocks),
            unrecoverable_reads: Counters::get(&counters.unrecoverable_reads),
            late_reads: Counters::get(&counters.late_reads),
            write_queue_batches: self.write_queue_batches,
            member_failures: self.members.failures_while_open(),
            // The map, and the cleaner's per-block write times and previous lifetimes.
            map_memory_bytes: self.map.size_bytes() + self.map.block_count() * LIFETIME_BYTES_PER_BLOCK,
            map_bytes_per_logical_block: self.map.size_bytes() as f64 / self.map.block_count().max(1) as f64
                + LIFETIME_BYTES_PER_BLOCK as f64,
            checksum_memory_bytes: self.checksums.len() as u64 * 4,
            write_buffer_memory_bytes: ((self.write_queue_batches + 1) * geometry.data_columns()
                + self.write_queue_batches * geometry.parity_shards()) as u64
                * geometry.chunk_size_bytes as u64,
            cache_memory_bytes: self.cache.as_ref().map_or(0, |cache| cache.capacity_bytes()),
            last_sequence: state.last_sealed_sequence,
            durable_through_sequence: state.durable_through_sequence,
            recovery: self.recovery_report.clone(),
        }
    }
}

/// Where a block read was served from.
enum Lookup {
    Served,
    /// Not in memory: it must be read from the members at this data-space position.
    OnMembers,
}

/// Copy a block that is still only in memory (open or in-flight batch).
fn copy_from_memory(state: &WriteState, location: crate::geometry::BlockLocation, out: &mut [u8]) -> bool {
    if let Some(open) = &state.open {
        if open.segment == location.segment {
            if let Some(index) = open.index_of(location.row, location.column) {
                out.copy_from_slice(open.block(index));
                return true;
            }
        }
    }
    for entry in &state.in_flight {
        if entry.batch.header.segment == location.segment {
            if let Some(block) = entry.batch.block(location.row, location.column) {
                out.copy_from_slice(block);
                return true;
            }
        }
    }
    false
}
