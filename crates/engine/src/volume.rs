//! Layer 10: the public [`Volume`] facade. Options, open (mount the log, build the
//! [`Core`], start the threads), the clients' write loop (which cleans when space runs
//! low), the flush timer and health checks, stats, close.

use crate::array::members::{self, CreateOptions, MemberDevice};
use crate::checkpoint::Checkpointer;
use crate::cleaner::Cleaner;
use crate::error::{
    Error, GeometryProblem, LogDeviceFailure, LogDeviceProblem, MemoryNeeds, RequestProblem, Result, Shutdown,
    WriteLogChange, WriteLogProblem,
};
use crate::index::checksums::ChecksumCache;
use crate::index::map::{BlockMap, Mapping};
use crate::io::deduplication::Candidate;
use crate::io::{
    block_pieces, BlockWrite, CompressedUnit, Core, CoreParts, InvariantDepth, MergedBlock, OpenProblem, RunStop,
    WriteState,
};
use crate::layout::geometry::{Geometry, BLOCK_SIZE_BYTES};
use crate::layout::{format, packed};
use crate::log::batch::BufferPool;
use crate::log::IoMode;
use crate::log::LogState;
use crate::maintenance::{
    Maintenance, MaintenanceOptions, MaintenanceProgress, RebuildReport, ReplaceOptions, ScrubReport,
};
use crate::mount;
use crate::space::signals::CleanerSignals;
use crate::space::Purpose;
use crate::space::SegmentTable;
use crate::stats::{Counters, MemberStatus, VolumeStats};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stripelog_blockdev::AlignedBuffer;

pub use crate::io::SECTOR_SIZE_BYTES;

/// The write queue of an inline (simulation) volume, in batches: its member writes are
/// synchronous, so this only bounds batches sealed but not yet dispatched.
const INLINE_WRITE_QUEUE_BATCHES: usize = 3;
/// Default time after which a non-empty open batch is sealed and made durable.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(500);

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
    /// RAM the volume's index and tables may take; `None`: what the machine has available
    /// (`MemAvailable`). A volume that needs more is refused before anything is allocated.
    pub memory_limit_bytes: Option<u64>,
    /// RAM for the checksums of segments not receiving batches (4 bytes per position, a
    /// table per segment, built from its summaries when missing).
    pub checksum_cache_bytes: u64,
    /// Open read-write although the superblocks say another host has the volume open and
    /// did not close it (it crashed, or still uses it: the caller must know which).
    pub take_over_from_another_host: bool,
    /// Open read-write a volume of an older format version, converting it to the current
    /// one (`stripelog upgrade`); without it such an open is refused.
    pub upgrade_format: bool,
    /// A checkpoint is written when this long has passed since the last one with any
    /// batch written (besides the dirty-page and replay-size bounds); threaded volumes
    /// check at every flush-timer tick, inline ones at every flush.
    pub checkpoint_interval: Duration,
    /// Ignore the checkpoint and rebuild the map from every segment's summaries, as a
    /// volume without one mounts (to compare the two: `stripelog bench scale`). Read-only
    /// opens only: a read-write open always mounts from the checkpoint.
    pub mount_by_scan: bool,
    /// RAM for index pages (`--map-cache`); `None`: [`default_map_cache_bytes`]. Clean
    /// pages beyond it are evicted and read again from the log when needed.
    pub map_cache_bytes: Option<u64>,
    /// The write log's devices, in the order the superblocks list them; `None`: open the
    /// paths the superblocks record (O_DIRECT files or block devices).
    pub write_log_devices: Option<WriteLogDevices>,
    /// Open a volume that was not closed cleanly although its write log cannot be read,
    /// accepting the loss of the writes acknowledged since the members were last synced.
    pub force_without_log: bool,
    /// On a volume with compression: the thousandths of client blocks compressed, fixed
    /// (`None`: the CPU-adaptive share, docs/compression.md; the simulation fixes it).
    pub compression_share: Option<u32>,
    /// On a volume with deduplication: one block name in `2^bits` enters the sparse index
    /// (`serve --dedup-sampling-bits`; docs/deduplication.md, decision 5). More bits, less RAM and
    /// fewer duplicates found away from the runs.
    pub dedup_sampling_bits: u32,
    /// A fault hook for tests: panic inside the write path, with the write lock held, once
    /// this many client blocks were accepted (`None`: never). What "a bug stops the volume"
    /// is tested with.
    #[doc(hidden)]
    pub fault_panic_after_accepted_blocks: Option<u64>,
}

/// Devices given for a volume's write log (by the simulation and tests; the CLI opens
/// the recorded paths).
#[derive(Clone)]
pub struct WriteLogDevices(pub Vec<Option<Arc<dyn stripelog_blockdev::BlockDevice>>>);

impl std::fmt::Debug for WriteLogDevices {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{} write log device(s)", self.0.len())
    }
}

/// Default write queue: 64 MiB of sealed batches and their parity.
pub const DEFAULT_WRITE_QUEUE_BYTES: u64 = 64 << 20;
/// The write queue holds at most this many batches, whatever its size in bytes.
pub const WRITE_QUEUE_BATCHES_MAXIMUM: usize = 64;

/// Default checksum cache: 64 MiB, the checksums of 16 M positions (64 GiB of data).
pub const DEFAULT_CHECKSUM_CACHE_BYTES: u64 = 64 << 20;

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
            holder_program: crate::array::identity::default_program(),
            take_over_from_another_host: false,
            upgrade_format: false,
            memory_limit_bytes: None,
            checksum_cache_bytes: DEFAULT_CHECKSUM_CACHE_BYTES,
            checkpoint_interval: crate::checkpoint::CHECKPOINT_INTERVAL,
            mount_by_scan: false,
            map_cache_bytes: None,
            write_log_devices: None,
            force_without_log: false,
            compression_share: None,
            dedup_sampling_bits: crate::index::names::DEFAULT_SAMPLING_BITS,
            fault_panic_after_accepted_blocks: None,
        }
    }
}

/// The map cache when none is given: the whole index when it fits a quarter of the
/// memory the machine has, else that quarter, and at least 64 MiB.
pub fn default_map_cache_bytes(geometry: &Geometry) -> u64 {
    let resident = crate::index::map::BlockMap::resident_size_for(
        geometry.logical_block_count(),
        crate::index::map::EntryCodec::for_geometry(geometry),
    );
    let quarter = machine_memory_bytes().map_or(u64::MAX, |total| total / 4);
    resident.min(quarter).max(MAP_CACHE_DEFAULT_MINIMUM_BYTES)
}

/// The smallest default map cache.
pub const MAP_CACHE_DEFAULT_MINIMUM_BYTES: u64 = 64 << 20;

/// The map cache of this open, refused when larger than the machine's memory.
fn map_cache_bytes(geometry: &Geometry, options: &OpenOptions) -> Result<u64> {
    match options.map_cache_bytes {
        None => Ok(default_map_cache_bytes(geometry)),
        Some(bytes) => match machine_memory_bytes() {
            Some(total) if bytes > total => Err(Error::InvalidRequest(RequestProblem::MapCacheTooLarge {
                map_cache_bytes: bytes,
                machine_bytes: total,
            })),
            _ => Ok(bytes),
        },
    }
}

/// Changing a volume's write log needs a volume closed cleanly: one that crashed may
/// have writes only in its log.
fn check_closed_cleanly(superblock: &format::Superblock, change: WriteLogChange) -> Result<()> {
    if superblock.holder.open {
        return Err(Error::InvalidRequest(RequestProblem::NotClosedCleanly {
            holder: Box::new(superblock.holder.clone()),
            change,
        }));
    }
    Ok(())
}

/// Entries of the write log replayed per call of the write path at mount.
const REPLAY_CHUNK_ENTRIES: usize = 256;

/// Open the volume's write log, if it has one: the log and what it holds. A log that
/// cannot be read is an error after a crash (acknowledged writes may be only there)
/// unless `force_without_log`; after a clean close the volume opens without it.
#[allow(clippy::type_complexity)]
fn open_write_log(
    superblock: &format::Superblock,
    options: &OpenOptions,
    closed_cleanly: bool,
) -> Result<(Option<Arc<crate::write_log::WriteLog>>, Option<crate::write_log::LogContents>)> {
    let Some(reference) = &superblock.write_log else {
        return Ok((None, None));
    };
    let devices: Vec<(String, Option<Arc<dyn stripelog_blockdev::BlockDevice>>)> = match &options.write_log_devices {
        Some(given) => reference
            .paths
            .iter()
            .enumerate()
            .map(|(index, path)| (path.clone(), given.0.get(index).cloned().flatten().filter(|_| !path.is_empty())))
            .collect(),
        None => reference
            .paths
            .iter()
            .map(|path| (path.clone(), (!path.is_empty()).then(|| open_log_device(path, options.read_only)).flatten()))
            .collect(),
    };
    match crate::write_log::WriteLog::open(devices, superblock.volume_uuid, reference.log_uuid) {
        Ok((log, contents)) => Ok((Some(Arc::new(log)), Some(contents))),
        Err(problem) if closed_cleanly || options.force_without_log || options.read_only => {
            log::warn!(
                "{}: the volume opens without its write log (flushes sync the members)",
                Error::WriteLogUnavailable(problem)
            );
            Ok((None, None))
        }
        Err(problem) => Err(Error::WriteLogMissing(problem)),
    }
}

/// A write log device by its recorded path (`None` when it cannot be opened).
fn open_log_device(path: &str, read_only: bool) -> Option<Arc<dyn stripelog_blockdev::BlockDevice>> {
    let options = stripelog_blockdev::FileDeviceOptions { read_only, ..Default::default() };
    match stripelog_blockdev::FileDevice::open(std::path::Path::new(path), &options) {
        Ok(device) => Some(Arc::new(device)),
        Err(error) => {
            log::warn!("write log device {path}: {error}");
            None
        }
    }
}

/// How often a threaded volume checks that its members are still there and whole
/// (deleted, truncated or overwritten members are failed; docs/resilience.md).
const MEMBER_HEALTH_INTERVAL: Duration = Duration::from_secs(1);

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
    /// The read and write paths (layer 6).
    core: Arc<Core>,
    /// The checkpoint writer (layer 7): the flush timer, the cleaner and close write them.
    checkpointer: Arc<Checkpointer>,
    /// The cleaner (layer 8): client writes, the flush timer, its own thread and
    /// maintenance run its rounds.
    cleaner: Arc<Cleaner>,
    /// Replacement, rebuild and scrub (layer 10).
    maintenance: Maintenance,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Stopped first on close, between rounds, while the pipeline still runs.
    cleaner_thread: Mutex<Option<JoinHandle<()>>>,
    abandoned: AtomicBool,
    /// Seal and make durable an open batch this old; `None`: only on flush or when full.
    flush_interval: Option<Duration>,
    /// What mount found and did.
    recovery_report: crate::stats::RecoveryReport,
    /// On a thinly provisioned volume: the last use threshold warned of (0, 80, 90, 95 %).
    thin_warned_percent: AtomicU8,
}

impl Volume {
    /// Write fresh superblocks to `members` (any previous content is forgotten) and open
    /// the new volume.
    pub fn create(members: Vec<MemberDevice>, options: &CreateOptions, open_options: &OpenOptions) -> Result<Volume> {
        members::create(&members, options, &|geometry| {
            check_memory(geometry, open_options, map_cache_bytes(geometry, open_options)?)
        })?;
        Volume::open_volume(members, open_options, true)
    }

    /// Open a volume: check its members, recover the log, rebuild the map.
    pub fn open(members: Vec<MemberDevice>, options: &OpenOptions) -> Result<Volume> {
        Volume::open_volume(members, options, false)
    }

    /// Give a closed volume a write log on `log_devices` (one device, or two for a mirror),
    /// which are formatted (the caller has checked that they hold nothing of value).
    /// Refused when the volume was not closed cleanly or already has a log.
    pub fn add_write_log(members: Vec<MemberDevice>, log_devices: Vec<MemberDevice>) -> Result<()> {
        let (members, superblock) = members::open(members)?;
        check_closed_cleanly(&superblock, WriteLogChange::Add)?;
        if let Some(existing) = &superblock.write_log {
            return Err(Error::InvalidRequest(RequestProblem::WriteLogExists { paths: existing.paths.clone() }));
        }
        let mut devices = Vec::new();
        for log in log_devices {
            if log.name.len() >= format::WRITE_LOG_PATH_BYTES {
                return Err(Error::InvalidRequest(RequestProblem::WriteLogPathTooLong {
                    maximum_bytes: format::WRITE_LOG_PATH_BYTES,
                    path: log.name,
                }));
            }
            let Some(device) = log.device else {
                return Err(Error::WriteLogUnavailable(WriteLogProblem::Device(LogDeviceProblem {
                    path: log.name,
                    failure: Arc::new(LogDeviceFailure::Missing),
                })));
            };
            devices.push((log.name, device));
        }
        let log_uuid = crate::write_log::WriteLog::format(&devices, superblock.volume_uuid)?;
        let paths = devices.into_iter().map(|(path, _)| path).collect();
        members
            .update_superblock(|superblock| superblock.write_log = Some(format::WriteLogReference { log_uuid, paths }))
    }

    /// Take a closed volume's write log away (flushes sync the members again): the paths
    /// it was on, `None` when it had none. Refused when the volume was not closed cleanly
    /// (the log may hold writes the members lack: open the volume once to replay them).
    pub fn remove_write_log(members: Vec<MemberDevice>) -> Result<Option<Vec<String>>> {
        let (members, superblock) = members::open(members)?;
        let Some(existing) = superblock.write_log.clone() else {
            return Ok(None);
        };
        check_closed_cleanly(&superblock, WriteLogChange::Remove)?;
        members.update_superblock(|superblock| superblock.write_log = None)?;
        Ok(Some(existing.paths))
    }

    /// `new_volume`: `create` just wrote the superblocks (no log to recover).
    fn open_volume(members: Vec<MemberDevice>, options: &OpenOptions, new_volume: bool) -> Result<Volume> {
        let (members, superblock) = members::open(members)?;
        let members = Arc::new(members);
        let map_cache_bytes = map_cache_bytes(&superblock.geometry(), options)?;
        check_memory(&superblock.geometry(), options, map_cache_bytes)?;
        let holder = &superblock.holder;
        if !options.read_only
            && !options.take_over_from_another_host
            && holder.open
            && !holder.host.is_empty()
            && holder.host != crate::array::identity::host_name()
        {
            return Err(Error::HeldByAnotherHost {
                volume: uuid::Uuid::from_bytes(superblock.volume_uuid),
                host: holder.host.clone(),
                holder: Box::new(holder.clone()),
            });
        }
        if !options.read_only && superblock.version < format::SUPERBLOCK_VERSION && !options.upgrade_format {
            return Err(Error::FormatUpgradeNeeded {
                volume: uuid::Uuid::from_bytes(superblock.volume_uuid),
                version: superblock.version,
                current: format::SUPERBLOCK_VERSION,
            });
        }
        let geometry = superblock.geometry();
        if superblock.version >= format::SUPERBLOCK_VERSION
            && superblock.index_entry_width_bits as u32 != geometry.index_entry_width_bits()
        {
            return Err(Error::InvalidGeometry(GeometryProblem::IndexEntryWidth {
                recorded_bits: superblock.index_entry_width_bits,
                needed_bits: geometry.index_entry_width_bits(),
            }));
        }
        let by_scan = options.mount_by_scan && options.read_only;
        if by_scan && geometry.shared_blocks && superblock.checkpoint.is_some() {
            // A reference entry takes no block and the cleaner does not move it: once a
            // checkpoint holds it, the segment it was written in may be reused, so the
            // summaries alone no longer say which blocks share (docs/deduplication.md).
            return Err(Error::InvalidRequest(RequestProblem::DeduplicationNeedsCheckpoint));
        }
        let codec = crate::index::map::EntryCodec::for_geometry(&geometry);
        let source = crate::checkpoint::MediaPages {
            geometry: geometry.clone(),
            members: members.clone(),
            volume_uuid: superblock.volume_uuid,
            width_bits: codec.width_bits as u8,
        };
        let map = BlockMap::paged(
            geometry.logical_block_count(),
            codec,
            Some(Arc::new(source)),
            BlockMap::cache_pages(geometry.logical_block_count(), codec, map_cache_bytes),
        );
        let (mut recovered, mut checkpoint_state) = match superblock.checkpoint.as_ref().filter(|_| !by_scan) {
            Some(reference) => mount::recover_from_checkpoint(
                &geometry,
                &members,
                &superblock.volume_uuid,
                superblock.durable_through_sequence,
                reference,
                map,
            )?,
            None => {
                let recovered = mount::recover(
                    &geometry,
                    &members,
                    &superblock.volume_uuid,
                    superblock.durable_through_sequence,
                    map,
                    new_volume && superblock.checkpoint.is_none(),
                )?;
                (recovered, crate::checkpoint::CheckpointState::empty(&geometry))
            }
        };
        // Counted before the epoch's superblock update, which persists it.
        members.count_found(&recovered.found_counts);
        let closed_cleanly = !superblock.holder.open;
        recovered.report.closed_cleanly = closed_cleanly;
        recovered.report.previous_holder = superblock.holder.to_string();
        let (write_log, log_contents) = open_write_log(&superblock, options, closed_cleanly)?;
        let replay_after = log_contents
            .as_ref()
            .map(|contents| contents.replay_after_sequence.unwrap_or(recovered.last_sequence))
            .unwrap_or(recovered.last_sequence);
        let log_entries_after = log_contents.as_ref().map_or(0, |contents| {
            contents.entries.iter().filter(|(entry, _)| entry.batch_sequence > replay_after).count() as u64
        });
        if options.read_only {
            recovered.report.write_log_entries_pending = log_entries_after;
        } else {
            recovered.report.write_log_entries_replayed = log_entries_after;
        }
        let superblock = if options.read_only {
            superblock
        } else {
            mount::write_back(&geometry, &members, &recovered.discarded, &recovered.repairs)?;
            let mut superblock = members::advance_epoch(&members, recovered.last_sequence, &options.holder_program)?;
            mount::release_heads(&geometry, &members, &recovered.release)?;
            if superblock.write_log.is_some() && write_log.is_none() {
                // Opened without its log (it cannot be read): the volume forgets it, so
                // that its old records are never replayed over newer writes.
                crate::write_log::forget(&members)?;
                superblock.write_log = None;
            }
            superblock
        };
        let epoch = superblock.epoch;
        let segment_count = geometry.segment_count();
        // Sealed batches in flight (each with a parity set), plus the open batch's data set.
        let write_queue_batches = match options.io_mode {
            IoMode::Inline => INLINE_WRITE_QUEUE_BATCHES,
            IoMode::Threaded => {
                let stripe_bytes = geometry.chunk_size_bytes as u64 * geometry.member_count as u64;
                ((options.write_queue_bytes / stripe_bytes.max(1)) as usize).clamp(1, WRITE_QUEUE_BATCHES_MAXIMUM)
            }
        };
        // Half the cache holds recent writes, as the data sets of batches kept once written
        // (no copy); the block cache takes the rest, for blocks read from members.
        let set_bytes = geometry.data_columns() as u64 * geometry.chunk_size_bytes as u64;
        let retained_sets = (options.cache_size_bytes / 2 / set_bytes.max(1)) as usize;
        let client_write_pairs = superblock.incompatible_features & crate::layout::format::FEATURE_CLIENT_WRITE_PAIRS
            != 0
            && options.separate_streams
            && !options.read_only;
        let data_sets = write_queue_batches + 1 + usize::from(client_write_pairs);
        let data_pool = BufferPool::with_retained(
            data_sets,
            retained_sets,
            geometry.data_columns(),
            geometry.chunk_size_bytes as usize,
        );
        let block_cache_bytes = options.cache_size_bytes - retained_sets as u64 * set_bytes;
        let parity_pool =
            BufferPool::new(write_queue_batches, geometry.parity_shards(), geometry.chunk_size_bytes as usize);
        members.set_hedged_reads(options.hedged_reads && options.io_mode == IoMode::Threaded);
        let state = WriteState::new(
            LogState::recovered(recovered.last_sequence, recovered.last_segment, recovered.reserved_segments),
            SegmentTable::new(
                recovered.segments,
                recovered.checkpoints,
                crate::space::checkpoint_headroom_segments(&geometry),
                &geometry,
            ),
            recovered.write_clock,
            client_write_pairs.then(|| crate::index::lifetimes::WriteRates::new(geometry.logical_block_count())),
        );
        let compression =
            crate::io::compression::Compression::new(superblock.compression, options.compression_share.is_none());
        if let Some(share) = options.compression_share {
            compression.set_share(share);
        }
        let deduplication = geometry.shared_blocks.then(|| {
            crate::io::deduplication::Deduplication::new(
                superblock.deduplication,
                geometry.physical_data_blocks(),
                options.dedup_sampling_bits.min(crate::index::names::SAMPLING_BITS_MAXIMUM),
            )
        });
        // The name index's pages the checkpoint names load into a table of their shape;
        // pages of another shape die at the next checkpoint.
        if let Some(finder) = &deduplication {
            let table = finder.index();
            let shape = (table.slot_count(), finder.sampling_bits as u8);
            let stored_shape = checkpoint_state.name_shape();
            if checkpoint_state.adopt_name_shape(shape, table.page_count()) {
                // (A read-only open finds no duplicates: it loads nothing.)
                if !options.read_only {
                    table.expect_loads(checkpoint_state.name_pages().map(|(page, _)| page));
                }
            } else if stored_shape.0 != 0 {
                log::warn!(
                    "deduplication's name index was written for another table (sampling bits or data space changed): it starts empty"
                );
            }
        }
        let core = Arc::new(Core::new(CoreParts {
            volume_uuid: superblock.volume_uuid,
            epoch,
            read_only: options.read_only,
            io_mode: options.io_mode,
            map: recovered.map,
            checksums: ChecksumCache::new(geometry.blocks_per_segment(), options.checksum_cache_bytes),
            rows_on_media: recovered.rows_on_media,
            cache: crate::io::cache::BlockCache::new(block_cache_bytes),
            state,
            data_pool,
            parity_pool,
            write_queue_batches,
            data_sets,
            cleaner: CleanerSignals::new(options.io_mode == IoMode::Threaded && !options.read_only, segment_count),
            write_log,
            compression,
            shared: recovered.shared,
            deduplication,
            directory: checkpoint_state,
            fault_panic_after_accepted_blocks: options.fault_panic_after_accepted_blocks,
            members,
            geometry,
        }));
        let checkpointer = Arc::new(Checkpointer::new(core.clone(), options.checkpoint_interval));
        let cleaner = Arc::new(Cleaner::new(
            core.clone(),
            checkpointer.clone(),
            options.cleaning_policy,
            options.separate_streams,
        ));
        let volume = Volume {
            threads: Mutex::new(Vec::new()),
            cleaner_thread: Mutex::new(None),
            maintenance: Maintenance::new(cleaner.clone()),
            cleaner,
            checkpointer,
            core,
            abandoned: AtomicBool::new(false),
            flush_interval: options.flush_interval,
            recovery_report: recovered.report,
            thin_warned_percent: AtomicU8::new(0),
        };
        if !options.read_only {
            volume.core.reserve_stream_segments(&mut volume.core.lock_state());
            volume.maintenance.prepare_rebuilding_members()?;
            // The name index loads in the background, except before a write-log replay
            // (which deduplicates like any write) and on inline volumes.
            let replays = log_contents.as_ref().is_some_and(|contents| !contents.entries.is_empty());
            if replays || volume.core.io_mode() == IoMode::Inline {
                load_name_index(&volume.core);
            }
            volume.start_threads();
            if let (Some(log), Some(contents)) = (volume.core.write_log().cloned(), log_contents) {
                volume.replay_write_log(&log, contents, replay_after)?;
            }
            // Every mount that replayed anything (and a new or upgraded volume) ends
            // with a checkpoint: the next mount's walk starts here, and the segments this
            // one's walk passed through may be reused once it is committed.
            if volume.recovery_report.batches_replayed > 0 || volume.recovery_report.checkpoint_generation.is_none() {
                volume.checkpointer.write_checkpoint()?;
            }
        }
        volume.recovery_report.report_unclean_shutdown(options.read_only);
        Ok(volume)
    }

    fn start_threads(&self) {
        let mut threads = self.threads.lock();
        // Every engine thread runs under `fail_on_panic`: a panic stops the volume (it
        // serves nothing more from state the panic may have left half changed).
        let spawn = |name: &str, core: Arc<Core>, body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || crate::log::pipeline::fail_on_panic(&*core, body))
                .expect("spawn an engine thread")
        };
        if self.core.io_mode() == IoMode::Threaded {
            // Nothing is sealed and unwritten yet: every batch through this one is on the
            // members (a sync round covers the batches queued after it).
            let last_sequence = self.core.last_sealed_sequence();
            let (stripe_sender, stripe_receiver) = crate::queue::bounded(self.core.stripe_queue_batches());
            self.core.start_pipeline(stripe_sender);
            let (member_senders, member_threads) = crate::log::pipeline::start_member_workers(&self.core);
            threads.extend(member_threads);
            if let Some(log) = self.core.write_log() {
                log.start_mirror_helper();
            }
            let core = self.core.clone();
            threads.push(spawn(
                "stripelog-stripe-writer",
                self.core.clone(),
                Box::new(move || {
                    crate::log::pipeline::stripe_writer(core, stripe_receiver, member_senders, last_sequence)
                }),
            ));
        }
        if self.core.cleaner().background() {
            let cleaner = self.cleaner.clone();
            *self.cleaner_thread.lock() = Some(spawn(
                "stripelog-cleaner",
                self.core.clone(),
                Box::new(move || crate::cleaner::background_cleaner(cleaner)),
            ));
        }
        if self.core.io_mode() == IoMode::Threaded {
            if let Some(finder) = self.core.deduplication() {
                let (requests, receiver) = crate::queue::bounded(crate::io::deduplication::RUN_AHEAD_QUEUE);
                finder.read_ahead_through(requests);
                let core = self.core.clone();
                threads.push(spawn(
                    "stripelog-run-ahead",
                    self.core.clone(),
                    Box::new(move || run_ahead(&core, receiver)),
                ));
            }
        }
        let loading = self.core.deduplication().is_some_and(|finder| finder.index().pages_waiting_to_load() > 0);
        if loading {
            let core = self.core.clone();
            threads.push(spawn("stripelog-name-loader", self.core.clone(), Box::new(move || load_name_index(&core))));
        }
        if let Some(interval) = self.flush_interval {
            let (cleaner, checkpointer) = (self.cleaner.clone(), self.checkpointer.clone());
            threads.push(spawn(
                "stripelog-flush-timer",
                self.core.clone(),
                Box::new(move || flush_timer(&cleaner, &checkpointer, interval)),
            ));
        }
    }

    /// Replay the write log's entries the members lack (those of batches after
    /// `after_sequence`, in order, as client writes), make them durable on the members,
    /// then start the log afresh. A crash during the replay replays again from the same
    /// point (recorded in the log before the first entry is applied).
    fn replay_write_log(
        &self,
        log: &crate::write_log::WriteLog,
        contents: crate::write_log::LogContents,
        after_sequence: u64,
    ) -> Result<()> {
        use crate::layout::write_log::LogEntryKind;
        let replay: Vec<_> =
            contents.entries.into_iter().filter(|(entry, _)| entry.batch_sequence > after_sequence).collect();
        if !replay.is_empty() {
            let block_count = self.core.map().block_count();
            if let Some((entry, _)) = replay.iter().find(|(entry, _)| entry.logical_block >= block_count) {
                return Err(Error::WriteLogUnavailable(WriteLogProblem::BlockBeyondVolume {
                    logical_block: entry.logical_block,
                    block_count,
                }));
            }
            log.begin_replay(after_sequence)?;
            // In order, as the client wrote them: runs of consecutive data blocks are
            // stored as client writes are (shared when duplicates, compressed), so that a
            // replay takes no more space than the writes took before the crash; trims and
            // zeros a chunk at a time.
            let is_data = |index: usize| replay[index].0.kind == LogEntryKind::Data && replay[index].1.is_some();
            // The end of the run from `start` (at most a chunk) of entries `belongs` takes.
            let run_end = |start: usize, belongs: &dyn Fn(usize) -> bool| {
                let limit = replay.len().min(start + REPLAY_CHUNK_ENTRIES);
                (start + 1..limit).find(|&index| !belongs(index)).unwrap_or(limit)
            };
            let mut next = 0;
            while next < replay.len() {
                let first = &replay[next].0;
                let end = if is_data(next) {
                    let consecutive = |index: usize| {
                        is_data(index) && replay[index].0.logical_block == first.logical_block + (index - next) as u64
                    };
                    let end = run_end(next, &consecutive);
                    let bytes: Vec<u8> = replay[next..end]
                        .iter()
                        .flat_map(|(_, data)| data.as_deref().unwrap_or_default())
                        .copied()
                        .collect();
                    self.store(first.logical_block * BLOCK_SIZE_BYTES as u64, &bytes, Admission::Replay)?;
                    end
                } else {
                    let end = run_end(next, &|index| !is_data(index));
                    let blocks: Vec<BlockWrite> = replay[next..end]
                        .iter()
                        .map(|(entry, _)| match entry.kind {
                            LogEntryKind::Trim => BlockWrite::Trim(entry.logical_block),
                            _ => BlockWrite::Zero(entry.logical_block),
                        })
                        .collect();
                    apply(&self.cleaner, &blocks, Admission::Replay)?;
                    end
                };
                next = end;
            }
            self.core.flush_members()?;
        }
        match log.take_over() {
            Ok(()) => Ok(()),
            // The members hold everything the log did (replayed and synced above): the
            // volume goes on without a log rather than refusing to open.
            Err(error) => {
                log::error!("the write log cannot be written ({error}): flushes sync the members");
                self.core.retire_failed_write_log()
            }
        }
    }

    /// Run `operation` so that a panic in it stops the volume (`Shutdown::Panicked`: it
    /// serves nothing more, from state the panic may have left half changed) and comes back
    /// as its error (`ShutDown`), rather than unwinding into the caller — a server thread
    /// that would drop it and serve on. The panic's message and backtrace go to the panic
    /// hook (the binary logs them).
    fn guarded<T>(&self, operation: impl FnOnce() -> Result<T>) -> Result<T> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(operation)) {
            Ok(result) => result,
            Err(payload) => {
                let reason = Shutdown::panicked(Some(payload.as_ref()));
                self.core.fail(reason.clone());
                Err(Error::ShutDown(reason))
            }
        }
    }

    /// Whether a bug (a panic in an engine thread or inside a call) stopped the volume.
    pub fn stopped_by_panic(&self) -> bool {
        matches!(&*self.core.members().shutdown.lock(), Some(Shutdown::Panicked { .. }))
    }

    pub fn geometry(&self) -> &Geometry {
        self.core.geometry()
    }

    pub fn logical_size_bytes(&self) -> u64 {
        self.core.map().block_count() * BLOCK_SIZE_BYTES as u64
    }

    /// Write `data` at `offset_bytes` (both multiples of 512). With `fua`, the call
    /// returns only once this write and every write accepted before it are durable.
    pub fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        self.guarded(|| {
            self.core.check_writable()?;
            self.core.check_range(offset_bytes, data.len() as u64)?;
            if self.core.cleaner().background() {
                let waited = self.core.cleaner().pacer().pace(data.len().div_ceil(BLOCK_SIZE_BYTES) as u64);
                let counters = self.core.counters();
                Counters::add_wait(&counters.paced_writes, &counters.paced_nanoseconds, waited);
            }
            self.store(offset_bytes, data, Admission::Client)?;
            Counters::add(&self.core.counters().host_bytes_written, data.len() as u64);
            if fua {
                self.flush()?;
            }
            Ok(())
        })
    }

    /// Store a write as the volume stores client writes: named and shared when a
    /// duplicate, compressed when it compresses. `Admission::Client` checks a thin
    /// volume's limit first; a write the write log replays was admitted before the crash.
    fn store(&self, offset_bytes: u64, data: &[u8], admission: Admission) -> Result<()> {
        /// What a piece of the request is, decided once, before the state lock: whole
        /// blocks are told apart from zeros, and runs of whole non-zero blocks are cut into
        /// units at logical addresses that are multiples of 4 and compressed here
        /// (docs/compression.md). The fragments live here, for the write list to borrow.
        enum Piece {
            Partial,
            Zeros,
            Whole,
        }
        let pieces: Vec<(u64, usize, std::ops::Range<usize>, Piece)> = block_pieces(offset_bytes, data.len())
            .map(|(logical_block, within, range)| {
                let piece = &data[range.clone()];
                let kind = if piece.len() < BLOCK_SIZE_BYTES {
                    Piece::Partial
                } else if format::is_all_zero(piece) {
                    Piece::Zeros
                } else {
                    Piece::Whole
                };
                (logical_block, within, range, kind)
            })
            .collect();
        // Deduplication first (docs/deduplication.md, decision 7): each whole non-zero
        // block is named and compared with its candidates, under the reuse fence, before
        // the state lock; the duplicates found are not compressed.
        let finder = self.core.deduplication().filter(|finder| finder.enabled());
        let mut names: Vec<Option<(crate::index::names::Name, u32, Option<Candidate>)>> = Vec::new();
        // Whole blocks equal to an earlier block of this request that found no candidate
        // (decision 10): (this block's index, the earlier one's). The earlier one is
        // stored whole and each later one as a `Repeat` of it, in the same apply.
        let mut within_request: Vec<(usize, usize)> = Vec::new();
        if let Some(finder) = finder {
            let _fence = self.core.read_fence();
            // Every whole block's candidate is looked for at once (one round of reads).
            let whole: Vec<(u64, &[u8], crate::index::names::Name, u32)> = pieces
                .iter()
                .filter(|(.., piece)| matches!(piece, Piece::Whole))
                .map(|(logical_block, _, range, _)| {
                    let block = &data[range.clone()];
                    (*logical_block, block, crate::index::names::Name::of(block), format::block_checksum(block))
                })
                .collect();
            let mut found = self.core.find_duplicates(finder, &whole)?.into_iter().zip(&whole);
            // Per name: the block a group of equal blocks waits for, and the group's size
            // (at most a copy's references: the next equal block starts a group).
            let mut first_of_name: std::collections::HashMap<crate::index::names::Name, (usize, u8)> =
                std::collections::HashMap::new();
            for (index, (logical_block, _, _, piece)) in pieces.iter().enumerate() {
                if !matches!(piece, Piece::Whole) {
                    // (Not a duplicate of what a run predicted: the run skips it.)
                    finder.missed(*logical_block);
                    names.push(None);
                    continue;
                }
                let (candidate, &(_, block, name, checksum)) = found.next().expect("one result per whole block");
                // Only a block that found no candidate starts a group: one that found one
                // is a duplicate already; an equal block after it found its own.
                let group = first_of_name.get_mut(&name).filter(|(earlier, size)| {
                    candidate.is_none()
                        && *size < crate::space::shared::REFERENCES_MAXIMUM
                        && data[pieces[*earlier].2.clone()] == *block
                });
                match group {
                    // An equal block earlier in the request, with no candidate: this one
                    // waits for it (a `Repeat` of it).
                    Some((earlier, size)) => {
                        *size += 1;
                        within_request.push((index, *earlier));
                    }
                    None if candidate.is_none() => drop(first_of_name.insert(name, (index, 1))),
                    None => {}
                }
                names.push(Some((name, checksum, candidate)));
            }
        }
        let waits_for_the_request = |index: usize| within_request.iter().any(|&(waiting, _)| waiting == index);
        let waited_for = |index: usize| within_request.iter().any(|&(_, earlier)| earlier == index);
        let duplicate = |index: usize| names.get(index).and_then(|named| named.as_ref()?.2);
        // The request in order: partial blocks (their piece), zero blocks, duplicates, and
        // units (the first piece, the count, the fragment when it compressed) of whole
        // non-zero blocks, up to 4, each ending before a logical address that is a multiple
        // of 4.
        // A duplicate that may become a new shared copy (its candidate is not shared yet;
        // for blocks equal within the request, the first that waits) carries its LZ4 form:
        // the copy is stored compressed (decision 11), compressed here, off the lock.
        enum Step {
            Patch(usize),
            Zero(u64),
            Duplicate(usize, Candidate, Option<Vec<u8>>),
            Unit(usize, usize, Option<Vec<u8>>),
            /// A block equal to an earlier one of the request (`within_request`), stored
            /// once that one is.
            Later(usize, Option<Vec<u8>>),
        }
        let compression = &self.core.compression();
        let compressed_copies = self.core.geometry().compressed_shared_copies;
        let copy_fragment = |index: usize| {
            let range = pieces[index].2.clone();
            compressed_copies.then(|| compression.compress(self.core.counters(), &data[range])).flatten()
        };
        let first_waiting = |index: usize| {
            let earlier = within_request.iter().find(|&&(waiting, _)| waiting == index).map(|&(_, earlier)| earlier);
            within_request.iter().find(|&&(_, of)| Some(of) == earlier).is_some_and(|&(waiting, _)| waiting == index)
        };
        let mut steps: Vec<Step> = Vec::with_capacity(pieces.len());
        let mut next = 0;
        while next < pieces.len() {
            let (step, end) = match pieces[next].3 {
                Piece::Partial => (Step::Patch(next), next + 1),
                Piece::Zeros => (Step::Zero(pieces[next].0), next + 1),
                Piece::Whole if duplicate(next).is_some() => {
                    let candidate = duplicate(next).expect("checked");
                    let fragment = match candidate.mapping {
                        Mapping::Shared { .. } => None,
                        _ => copy_fragment(next),
                    };
                    (Step::Duplicate(next, candidate, fragment), next + 1)
                }
                Piece::Whole if waits_for_the_request(next) => {
                    let fragment = if first_waiting(next) { copy_fragment(next) } else { None };
                    (Step::Later(next, fragment), next + 1)
                }
                // A block later ones wait for is stored whole (as shared copies are): its
                // copy is what they are compared with under the lock.
                Piece::Whole if waited_for(next) => (Step::Unit(next, 1, None), next + 1),
                Piece::Whole => {
                    let mut end = next + 1;
                    while end < pieces.len()
                        && end - next < packed::BLOCKS_PER_UNIT_MAXIMUM
                        && matches!(pieces[end].3, Piece::Whole)
                        && duplicate(end).is_none()
                        && !waits_for_the_request(end)
                        && !waited_for(end)
                        && !pieces[end].0.is_multiple_of(packed::BLOCKS_PER_UNIT_MAXIMUM as u64)
                    {
                        end += 1;
                    }
                    let bytes = &data[pieces[next].2.start..pieces[end - 1].2.end];
                    (Step::Unit(next, end - next, compression.compress(self.core.counters(), bytes)), end)
                }
            };
            steps.push(step);
            next = end;
        }
        let mut blocks: Vec<BlockWrite> = Vec::with_capacity(pieces.len());
        for step in &steps {
            match step {
                // Shared with the earlier block under the write lock, when that block
                // still holds its content (in memory), in this request's one apply: the
                // request is admitted and accepted as one, in order.
                Step::Later(index, fragment) => {
                    let (_, earlier) = *within_request
                        .iter()
                        .find(|&&(waiting, _)| waiting == *index)
                        .expect("a later block waits for an earlier one");
                    assert!(earlier < *index, "a block waits only for an earlier one");
                    let (logical_block, _, range, _) = &pieces[*index];
                    let checksum = names[*index].as_ref().expect("named").1;
                    let earlier = pieces[earlier].0;
                    let fragment = fragment.as_deref();
                    blocks.push(BlockWrite::Repeat(*logical_block, &data[range.clone()], checksum, earlier, fragment));
                }
                Step::Patch(index) => {
                    let (logical_block, within, range, _) = &pieces[*index];
                    blocks.push(BlockWrite::Patch(*logical_block, *within, &data[range.clone()]));
                }
                Step::Zero(logical_block) => blocks.push(BlockWrite::Zero(*logical_block)),
                Step::Duplicate(index, candidate, fragment) => {
                    let (logical_block, _, range, _) = &pieces[*index];
                    let checksum = names[*index].as_ref().expect("named").1;
                    let data = &data[range.clone()];
                    blocks.push(BlockWrite::Duplicate(*logical_block, data, checksum, *candidate, fragment.as_deref()));
                }
                Step::Unit(first, count, fragment) => {
                    let first_logical_block = pieces[*first].0;
                    let bytes = &data[pieces[*first].2.start..pieces[first + count - 1].2.end];
                    match fragment {
                        Some(fragment) => blocks.push(BlockWrite::Compressed(CompressedUnit {
                            first_logical_block,
                            data: bytes,
                            fragment,
                            checksum: packed::unit_checksum(bytes),
                        })),
                        None => {
                            blocks.extend(bytes.chunks_exact(BLOCK_SIZE_BYTES).enumerate().map(|(place, block)| {
                                BlockWrite::Data(
                                    first_logical_block + place as u64,
                                    block,
                                    format::block_checksum(block),
                                )
                            }))
                        }
                    }
                }
            }
        }
        if admission == Admission::Client {
            self.admit_on_thin_volume(&blocks)?;
        }
        apply(&self.cleaner, &blocks, admission)?;
        if let Some(finder) = finder {
            // What the blocks now hold is what later duplicates are compared with.
            for ((logical_block, ..), named) in pieces.iter().zip(&names) {
                if let Some((name, _, _)) = named {
                    finder.remember(*name, *logical_block);
                }
            }
        }
        self.core.evict_map_pages_if_needed();
        Ok(())
    }

    /// On a thinly provisioned volume, refuse a write that would make the volume hold more
    /// blocks of data than its provisioned size (`Error::ThinLimit`, ENOSPC), before any of
    /// it is accepted. What a write adds is counted as [`Core::held_blocks`] counts, in
    /// sixteenths of a block: what it stores (a whole block, a fragment's share, nothing
    /// for a duplicate of a copy already stored) less what it frees (a whole block, a
    /// fragment's share, a shared copy whose last reference it is; zeros in the request
    /// free nothing here). Overwriting a shared block with new data therefore adds a
    /// block, and a write of duplicates adds none.
    /// Concurrent writers, and a duplicate whose candidate changes before it is shared,
    /// may overshoot by what they write at once, which the spare absorbs. Warns on
    /// standard error as use crosses 80, 90 and 95 % (docs/deduplication.md, decision 10).
    fn admit_on_thin_volume(&self, blocks: &[BlockWrite]) -> Result<()> {
        if self.core.geometry().thin_logical_block_count.is_none() {
            return Ok(());
        }
        let whole = format::SIXTEENTHS_PER_BLOCK as i64;
        let freed = |logical_block: u64| -> Result<i64> {
            Ok(match self.core.map().get(logical_block)? {
                Mapping::Data { .. } => whole,
                Mapping::Fragment { sixteenths, .. } => sixteenths as i64,
                Mapping::Shared { record } => match self.core.shared_table().read().get(record) {
                    Some(copy) if copy.references <= 1 => copy.live_units(whole as u64) as i64,
                    _ => 0,
                },
                _ => 0,
            })
        };
        let mut growth_sixteenths = 0i64;
        for block in blocks {
            match block {
                BlockWrite::Data(logical_block, ..) | BlockWrite::Patch(logical_block, ..) => {
                    growth_sixteenths += whole - freed(*logical_block)?;
                }
                BlockWrite::Compressed(unit) => {
                    let share = packed::sixteenths(unit.fragment.len(), unit.blocks() as usize) as i64;
                    for logical_block in unit.first_logical_block..unit.first_logical_block + unit.blocks() as u64 {
                        growth_sixteenths += share - freed(logical_block)?;
                    }
                }
                BlockWrite::Duplicate(logical_block, _, _, candidate, fragment) => {
                    // A whole candidate's block gives way to the shared copy (compressed:
                    // its share instead of a block); a shared one gains a reference; a
                    // fragment's share stays with its unit, beside the new copy.
                    let copy = fragment.map_or(whole, |fragment| packed::sixteenths(fragment.len(), 1) as i64);
                    let stored = match candidate.mapping {
                        Mapping::Data { .. } => copy - whole,
                        Mapping::Shared { .. } => 0,
                        _ => copy,
                    };
                    growth_sixteenths += stored - freed(*logical_block)?;
                }
                // Shared with an earlier block of the request, counted above: as a
                // duplicate of a whole block, it stores nothing more.
                BlockWrite::Repeat(logical_block, ..) => growth_sixteenths -= freed(*logical_block)?,
                // A zero or trim record frees the block it replaces only in later
                // requests' view: it keeps a place in its segment until cleaned.
                BlockWrite::Zero(_) | BlockWrite::Trim(_) => {}
            }
        }
        let needed_blocks = (growth_sixteenths.max(0) as u64).div_ceil(whole as u64);
        let held_blocks = self.core.held_blocks();
        let provisioned = self.core.geometry().provisioned_block_count();
        if needed_blocks > 0 && held_blocks + needed_blocks > provisioned {
            return Err(Error::ThinLimit { held_blocks, needed_blocks });
        }
        let percent = ((held_blocks + needed_blocks) * 100 / provisioned.max(1)) as u8;
        let level = [95u8, 90, 80].into_iter().find(|&level| percent >= level).unwrap_or(0);
        let warned = self.thin_warned_percent.swap(level, std::sync::atomic::Ordering::Relaxed);
        if level > warned {
            log::warn!(
                "the thinly provisioned volume holds {percent} % of its provisioned size \
                 ({} of {} blocks); writes beyond it will fail with ENOSPC",
                held_blocks + needed_blocks,
                provisioned
            );
        } else if level == 0 && warned > 0 {
            log::info!("the thinly provisioned volume holds {percent} % of its provisioned size, under 80 % again");
        }
        Ok(())
    }

    /// Make the range read as zeros. Whole blocks cost no media (a zero record); partial
    /// blocks at the edges are written.
    pub fn write_zeroes(&self, offset_bytes: u64, length_bytes: u64, fua: bool) -> Result<()> {
        self.guarded(|| self.ranged(offset_bytes, length_bytes, false, fua))?;
        Counters::add(&self.core.counters().host_bytes_zeroed, length_bytes);
        Ok(())
    }

    /// Make the range read as zeros the cheapest way, a hole (NBD's write-zeroes without
    /// NO_HOLE): done as a trim, counted as zeroes (`host_bytes_zeroed`).
    pub fn write_zeroes_as_hole(&self, offset_bytes: u64, length_bytes: u64, fua: bool) -> Result<()> {
        self.guarded(|| self.ranged(offset_bytes, length_bytes, true, false))?;
        Counters::add(&self.core.counters().host_bytes_zeroed, length_bytes);
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Unmap the range: it reads as zeros and is a hole for block status.
    pub fn trim(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        self.guarded(|| self.ranged(offset_bytes, length_bytes, true, false))?;
        Counters::add(&self.core.counters().host_bytes_trimmed, length_bytes);
        Ok(())
    }

    fn ranged(&self, offset_bytes: u64, length_bytes: u64, trim: bool, fua: bool) -> Result<()> {
        self.core.check_writable()?;
        self.core.check_range(offset_bytes, length_bytes)?;
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
        // A partial edge is a write: on a thin volume at its limit, one that needs a block
        // (an edge of a shared block, or of a block not yet stored) is refused with
        // ENOSPC before anything is done. Whole blocks only free space. The ends go first,
        // then the whole blocks: the order in which the ordered prefix counts the blocks of
        // a request (whole blocks first broke simulation seed 146). So on a physically full
        // volume an unaligned end can be refused before the whole blocks free anything.
        self.admit_on_thin_volume(&edges)?;
        apply(&self.cleaner, &edges, Admission::Client)?;
        // Whole blocks, a bounded slice of the work list at a time.
        const BLOCKS_PER_STEP: u64 = 1 << 16;
        let mut start = first_whole;
        while start < end_whole {
            let stop = (start + BLOCKS_PER_STEP).min(end_whole);
            let step: Vec<BlockWrite> =
                (start..stop).map(|lb| if trim { BlockWrite::Trim(lb) } else { BlockWrite::Zero(lb) }).collect();
            apply(&self.cleaner, &step, Admission::Client)?;
            start = stop;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Read `buffer.len()` bytes at `offset_bytes` (both multiples of 512).
    pub fn read(&self, offset_bytes: u64, buffer: &mut [u8]) -> Result<()> {
        self.guarded(|| {
            self.core.check_open()?;
            self.core.check_range(offset_bytes, buffer.len() as u64)?;
            let fence = self.core.read_fence();
            let mut scratch = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
            for (logical_block, within, range) in block_pieces(offset_bytes, buffer.len()) {
                self.core.read_block(logical_block, &mut scratch)?;
                let count = range.len();
                buffer[range].copy_from_slice(&scratch[within..within + count]);
            }
            Counters::add(&self.core.counters().host_bytes_read, buffer.len() as u64);
            drop(fence);
            self.core.evict_map_pages_if_needed();
            Ok(())
        })
    }

    /// A queue that keeps up to about `depth` reads in flight from one thread, each
    /// completing as its member reads do (io_uring on file and block-device members),
    /// instead of one blocked thread per read: what a network server or a benchmark
    /// with a queue depth wants. Drop it before closing the volume.
    pub fn read_queue(&self, depth: usize) -> crate::io::read_queue::ReadQueue {
        crate::io::read_queue::ReadQueue::new(self.core.clone(), depth)
    }

    /// The mapping of one logical block (for block-status queries).
    pub fn mapping(&self, logical_block: u64) -> Result<Mapping> {
        if logical_block >= self.core.map().block_count() {
            return Err(Error::InvalidRequest(RequestProblem::BlockBeyondEnd { logical_block }));
        }
        self.core.map().get(logical_block)
    }

    /// Whether a flush (and a FUA write) is made durable by a working write log: an append
    /// and a sync of the log device, microseconds on the devices a log is meant for, rather
    /// than a round of member syncs. A server may then run it on the thread that read the
    /// request instead of handing it to another.
    pub fn flushes_to_a_write_log(&self) -> bool {
        self.core.write_log().as_ref().is_some_and(|log| log.is_active())
    }

    /// Whether writing `length_bytes` at `offset_bytes` needs no index page read from the
    /// members first (each block's page is in RAM, or was never written). A server runs
    /// such a write on the thread that read it and hands the others, which wait on a page
    /// load, to a worker (docs/index-and-checkpoints.md, "Paging"). `false` for a range
    /// the write itself refuses (unaligned, or beyond the volume).
    pub fn index_pages_resident(&self, offset_bytes: u64, length_bytes: u64) -> bool {
        if self.core.check_range(offset_bytes, length_bytes).is_err() {
            return false;
        }
        let block = BLOCK_SIZE_BYTES as u64;
        let first = offset_bytes / block;
        self.core.map().resident_for(first, (offset_bytes + length_bytes).div_ceil(block) - first)
    }

    /// Return when every write accepted before the call is durable: on the write log when
    /// the volume has one (the stripes follow), else on the members.
    pub fn flush(&self) -> Result<()> {
        self.guarded(|| {
            self.core.flush()?;
            // Threaded volumes checkpoint from their flush timer, off the clients' path.
            if self.core.io_mode() == IoMode::Inline && !self.core.read_only() {
                match self.checkpointer.checkpoint_if_due() {
                    Ok(()) | Err(Error::OutOfSpace) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(())
        })
    }

    pub fn stats(&self) -> VolumeStats {
        volume_stats(&self.cleaner, &self.recovery_report)
    }

    /// Turn compression of new writes on or off while the volume is open (written to the
    /// superblocks first: the setting holds across opens). Blocks already stored stay as
    /// they are. Refused on a volume created without compression: its index entries
    /// cannot name fragments (docs/compression.md).
    pub fn set_compression(&self, setting: format::CompressionSetting) -> Result<()> {
        self.core.check_writable()?;
        if setting != format::CompressionSetting::Off && !self.core.geometry().packed_fragments {
            return Err(Error::InvalidRequest(RequestProblem::CreatedWithoutCompression));
        }
        self.core.members().update_superblock(|superblock| superblock.compression = setting)?;
        self.core.compression().set(setting);
        Ok(())
    }

    /// Turn deduplication of new writes on or off while the volume is open (written to the
    /// superblocks first). Blocks already shared stay shared. Refused on a volume created
    /// without deduplication: its index entries cannot name shared blocks.
    pub fn set_deduplication(&self, on: bool) -> Result<()> {
        self.core.check_writable()?;
        let Some(finder) = self.core.deduplication() else {
            return Err(Error::InvalidRequest(RequestProblem::CreatedWithoutDeduplication));
        };
        self.core.members().update_superblock(|superblock| superblock.deduplication = on)?;
        finder.set_enabled(on);
        Ok(())
    }

    /// Whether new writes are compressed, and the thousandths of them the CPU affords now.
    pub fn compression(&self) -> (format::CompressionSetting, u32) {
        (self.core.compression().setting(), self.core.compression().share())
    }

    /// Verify every live batch on the members: each block against its checksum, each
    /// parity row and mirror copy against the data; and every invariant of the in-RAM state
    /// (a violated one panics: `Volume::check_invariants`). Flushes first when writable,
    /// and pauses writers while it runs.
    pub fn check(&self) -> Result<crate::mount::CheckReport> {
        self.guarded(|| {
            if !self.core.read_only() {
                self.core.flush_members()?;
            }
            let core = &self.core;
            // Writers pause while the log is read, so that it does not change under the
            // scan, and batches sealed before (the cleaner's, a checkpoint's) finish writing
            // first: a batch on some members and not yet on others is not damage. (No
            // checkpoint runs meanwhile either: the checkpoint lock is held, first.)
            let directory = core.directory().lock();
            let _paused = core.pause_writers();
            let durable = core.members().superblock().durable_through_sequence;
            let durability = crate::mount::Durability {
                superblock_durable_through: durable,
                // A read-write open repaired what a crash left at its mount.
                unclean_shutdown: core.read_only() && !self.recovery_report.closed_cleanly,
            };
            let mut report = crate::mount::check(
                core.geometry(),
                core.members(),
                core.volume_uuid(),
                durability,
                core.map(),
                &core.shared_table().read(),
                core.io_mode() == IoMode::Threaded,
            )?;
            report.members_not_redundant = core.members().lost();
            report.write_log_entries_pending = self.recovery_report.write_log_entries_pending;
            core.check_invariants_with(&directory, InvariantDepth::WholeIndex)?;
            Ok(report)
        })
    }

    /// Check every invariant of the volume's in-RAM state (each component's, how they agree,
    /// and, when the whole index is in RAM, every segment's live count against the index,
    /// the shared copies and the checkpoint's blocks), pausing writers meanwhile; it reads
    /// nothing from the members (`check` does the same over the whole index). A violated
    /// invariant is a bug: it panics — and, as any panic inside the engine, stops the
    /// volume. The simulation runs it after every step.
    pub fn check_invariants(&self) -> Result<()> {
        self.guarded(|| self.core.check_invariants(InvariantDepth::ResidentIndex))
    }

    /// Count the index's references to every shared-block record and compare them with the
    /// records' counts (deduplication; one pass over the index, no member read). Writers
    /// wait meanwhile.
    pub fn check_shared_references(&self) -> Result<crate::mount::SharedReferenceCheck> {
        self.guarded(|| {
            let _paused = self.core.pause_writers();
            crate::mount::check_shared_references(self.core.map(), &self.core.shared_table().read())
        })
    }

    /// Flush, stop the background threads and close the volume.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    /// Drop the volume as if the process died: nothing more is written (simulation).
    pub fn abandon(self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.core.fail(Shutdown::Abandoned);
        self.stop_threads();
    }

    fn shutdown(&self) -> Result<()> {
        if self.core.is_closed() {
            return Ok(());
        }
        self.stop_cleaner();
        let result = if self.stopped_by_panic() {
            // As after a crash: nothing more is written, the next open recovers.
            self.core.check_writable()
        } else if self.core.read_only() || self.abandoned.load(Ordering::SeqCst) {
            Ok(())
        } else {
            self.core.flush_members().and_then(|()| self.checkpointer.write_checkpoint()).and_then(|_| {
                let durable = self.core.lock_state().log().durable_through();
                members::record_clean_close(self.core.members(), durable)
            })
        };
        self.stop_threads();
        result
    }

    /// Let the cleaner thread finish its round (made durable by the round itself) and end.
    fn stop_cleaner(&self) {
        self.core.cleaner().request_stop();
        {
            let _state = self.core.lock_state();
            self.core.cleaner().wake_all();
        }
        if let Some(thread) = self.cleaner_thread.lock().take() {
            let _ = thread.join();
        }
    }

    fn stop_threads(&self) {
        self.stop_cleaner();
        self.core.mark_closed();
        self.core.end_pipeline();
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
            self.core.fail(Shutdown::panicked(None));
            self.stop_threads();
            return;
        }
        let _ = self.shutdown();
    }
}

/// Name index pages one round of the loader reads (4 MiB).
const NAME_INDEX_LOAD_ROUND_PAGES: usize = 1024;

/// Read the name index's pages the committed checkpoint names into the finder's table
/// (docs/deduplication.md, "The persistent name index"): each verified against its
/// pointer, its page number and shape; one that cannot be read loses its hints only.
/// Stops early when the volume closes (the pages not loaded stay as they were on disk).
fn load_name_index(core: &Core) {
    let Some(finder) = core.deduplication() else { return };
    let table = finder.index();
    let mut pages: Vec<(u64, crate::layout::checkpoint::PagePointer)> =
        core.directory().lock().name_pages().filter(|(page, _)| !table.is_loaded(*page)).collect();
    // In the order of their positions, a bounded round at a time: a checkpoint writes
    // them in runs of rows, which one read per member brings in.
    pages.sort_unstable_by_key(|(_, pointer)| pointer.position);
    let sampling_bits = finder.sampling_bits as u8;
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for round in pages.chunks(NAME_INDEX_LOAD_ROUND_PAGES) {
        if core.is_closed() {
            return;
        }
        let positions: Vec<u64> = round.iter().map(|(_, pointer)| pointer.position).collect();
        let mut read: std::collections::HashMap<u64, Arc<[u8]>> = {
            let _fence = core.read_fence();
            core.read_positions(&positions).into_iter().collect()
        };
        for &(page, pointer) in round {
            let proven = match read.remove(&pointer.position) {
                Some(found) if format::checksum_proves(&found, pointer.checksum) => {
                    block.copy_from_slice(&found);
                    true
                }
                // (The checkpoint's own read: verified, rebuilt from its row when damaged.)
                _ => crate::checkpoint::read_block(
                    core.geometry(),
                    core.members(),
                    pointer,
                    "name index page",
                    &mut block,
                )
                .is_ok(),
            };
            let slots = proven
                .then(|| crate::layout::checkpoint::decode_name_table_page(&block, core.volume_uuid()))
                .flatten()
                .filter(|(number, _, bits, _)| *number == page && *bits == sampling_bits)
                .map(|(_, _, _, slots)| slots);
            let counter = if slots.is_some() {
                &finder.counters.name_pages_loaded
            } else {
                &finder.counters.name_pages_unreadable
            };
            counter.fetch_add(1, Ordering::Relaxed);
            table.load_page(page, slots.as_deref());
        }
    }
}

/// The run-ahead thread: reads the candidates deduplication's runs ask for ahead of them
/// until the volume closes. A read that fails costs nothing but the hits it would give.
fn run_ahead(core: &Core, requests: crate::queue::Receiver<(u64, u64)>) {
    let Some(finder) = core.deduplication() else { return };
    while !core.is_closed() {
        match requests.recv_timeout(Duration::from_millis(100)) {
            Ok((first, end)) => {
                let _ = core.run_ahead(finder, first, end);
            }
            Err(crate::queue::RecvTimeoutError::Timeout) => {}
            Err(crate::queue::RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn flush_timer(cleaner: &Cleaner, checkpointer: &Checkpointer, interval: Duration) {
    let core = &cleaner.core;
    let tick = (interval / 4).max(Duration::from_millis(5));
    let mut health_checked = Instant::now();
    while !core.is_closed() {
        std::thread::sleep(tick);
        if health_checked.elapsed() >= MEMBER_HEALTH_INTERVAL {
            health_checked = Instant::now();
            if let Err(error) = core.members().check_health() {
                core.fail(Shutdown::Members(Arc::new(error)));
            }
        }
        // With a write log more than half full, the members are synced off the clients'
        // path, so that an append rarely has to wait for it.
        if core.open_batch_older_than(interval) || core.write_log_filling() {
            // A failure is recorded as the volume's shutdown reason and reported to the
            // next client call.
            let _ = core.flush_members();
        }
        match checkpointer.checkpoint_if_due() {
            // No room for the checkpoint's blocks now: it is tried again at the next tick.
            Ok(()) | Err(Error::OutOfSpace) | Err(Error::Closed) => {}
            Err(error) => core.fail(Shutdown::Checkpoint(Arc::new(error))),
        }
        core.evict_map_pages_if_needed();
        // The compressed share follows the CPU; the members are busy when the write
        // queue holds more than one batch waiting for them.
        core.compression().control(core.members_busy());
        // Idle (nothing accepted for a tick): make free segments ahead of the next burst,
        // up to the high watermark.
        if !core.cleaner().background()
            && core.idle_below_high_watermark(tick)
            && core.members().check_running().is_ok()
        {
            if let Err(error) = cleaner.clean_round() {
                core.fail(Shutdown::Cleaner(Arc::new(error)));
            }
        }
    }
}

/// Whether a store is checked against a thin volume's limit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Admission {
    /// A client's write: refused whole when it would pass the limit.
    Client,
    /// A write the write log replays at mount: accepted before the crash, never refused.
    Replay,
}

/// The write loop: accept `blocks` in order into open batches, sealing and
/// dispatching full ones.
///
/// Client data never takes the free segment kept above the cleaner's reserve for trim and
/// zero records (docs/garbage-collection.md, "A physically full volume"); a write the
/// write log replays was accepted before, and may.
fn apply(cleaner: &Cleaner, blocks: &[BlockWrite], admission: Admission) -> Result<()> {
    let core = &cleaner.core;
    let purpose = if admission == Admission::Replay || blocks.iter().all(|block| !block.carries_data()) {
        Purpose::Records
    } else {
        Purpose::Data
    };
    // Outside the write lock: each partial block merged with its old content (one whose
    // old content cannot be read — damage beyond redundancy — fails the request before
    // any of it is accepted), and the index pages the request looks at made resident.
    let mut merged: Vec<Option<MergedBlock>> = blocks
        .iter()
        .map(|block| match *block {
            BlockWrite::Patch(logical_block, within, data) => core.prepare_patch(logical_block, within, data).map(Some),
            _ => Ok(None),
        })
        .collect::<Result<_>>()?;
    core.load_pages_for(blocks)?;
    let mut next = 0usize;
    let mut cleaned_for_this_segment = false;
    let mut stalls = WriteStalls { counters: core.counters(), buffers: Duration::ZERO, space: Duration::ZERO };
    while next < blocks.len() {
        let mut state = core.lock_state_to_write();
        core.members().check_running()?;
        if state.log().open().is_none() {
            match core.open_batch(&mut state, cleaned_for_this_segment, purpose) {
                // A new segment: it may clean once more (one round per new segment).
                Ok(new_segment) => cleaned_for_this_segment &= !new_segment,
                Err(OpenProblem::Buffers) => {
                    drop(state);
                    timed(&mut stalls.buffers, || core.data_pool().wait_for_free());
                    continue;
                }
                Err(OpenProblem::Space) => {
                    drop(state);
                    timed(&mut stalls.space, || cleaner.make_space(purpose))?;
                    continue;
                }
                Err(OpenProblem::Cleaning) => {
                    drop(state);
                    // Paced with the writes: one round per new client segment.
                    timed(&mut stalls.space, || cleaner.clean_round())?;
                    cleaned_for_this_segment = true;
                    continue;
                }
            }
        }
        let stop = core.accept_run(&mut state, blocks, &merged, &mut next, purpose)?;
        drop(state);
        match stop {
            RunStop::Done | RunStop::SegmentRetired | RunStop::Yield => {}
            RunStop::Sealed(sealed) => sealed.into_iter().try_for_each(|batch| core.dispatch(batch))?,
            RunStop::WaitForRoom => timed(&mut stalls.space, || cleaner.make_space(Purpose::Data))?,
            RunStop::Retry(retry) => core.prepare_retry(retry, blocks, next, &mut merged)?,
        }
    }
    // Many writes and no flush: what is staged goes to the write log unsynced, which
    // bounds the RAM it takes and the work of the next flush.
    if let Some(log) = core.active_write_log() {
        if core.staging_is_full() {
            core.append_to_write_log(log, false)?;
        }
    }
    Ok(())
}

/// The time one write stalled, by cause, added to the volume's counters however the
/// write ends (an error after a stall still stalled).
struct WriteStalls<'a> {
    counters: &'a Counters,
    buffers: Duration,
    space: Duration,
}

impl Drop for WriteStalls<'_> {
    fn drop(&mut self) {
        let counters = self.counters;
        Counters::add_wait(&counters.writes_stalled_for_buffers, &counters.buffer_stall_nanoseconds, self.buffers);
        Counters::add_wait(&counters.writes_stalled_for_space, &counters.space_stall_nanoseconds, self.space);
    }
}

/// Run `work`, adding the time it took to `total`.
fn timed<T>(total: &mut Duration, work: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let result = work();
    *total += started.elapsed();
    result
}

fn volume_stats(cleaner: &Cleaner, recovery_report: &crate::stats::RecoveryReport) -> VolumeStats {
    let core = &cleaner.core;
    let geometry = &core.geometry();
    // Kept by the map as it changes: no scan of the volume per call.
    let counts = core.map().counts();
    // Mapped: every logical block that reads data (whole, compressed, shared).
    let blocks_mapped = counts.data_blocks + counts.fragment_blocks + counts.shared_blocks;
    let blocks_zero = counts.zero_blocks;
    let shared = core.shared_table().read();
    let (shared_copies, (fragment_copies, fragment_copy_sixteenths)) = (shared.in_use(), shared.fragment_copies());
    let (shared_sixteenths, shared_held_blocks) = (shared.stored_sixteenths(), shared.held_blocks());
    let shared_table_memory_bytes = shared.memory_bytes();
    drop(shared);
    // Stored: what holds the data (whole blocks, fragments' shares, shared copies whole or
    // by their share).
    let sixteenths = crate::layout::format::SIXTEENTHS_PER_BLOCK as u64;
    let stored_sixteenths = counts.data_blocks * sixteenths + counts.fragment_sixteenths + shared_sixteenths;
    let stored_data_bytes = stored_sixteenths * BLOCK_SIZE_BYTES as u64 / sixteenths;
    let compression = geometry.packed_fragments.then(|| {
        // Over the distinct contents stored: whole blocks, fragments and shared copies.
        let content_blocks = counts.data_blocks + counts.fragment_blocks + shared_copies;
        let physical = stored_sixteenths as f64 / sixteenths as f64;
        let compressed = Counters::get(&core.counters().blocks_compressed);
        crate::stats::CompressionStatus {
            setting: core.compression().setting().to_string(),
            share: core.compression().share() as f64 / crate::io::compression::SHARE_WHOLE as f64,
            logical_data_blocks: content_blocks,
            fragment_blocks: counts.fragment_blocks + fragment_copies,
            physical_data_blocks: physical,
            ratio: if physical > 0.0 { content_blocks as f64 / physical } else { 1.0 },
            blocks_compressed: compressed,
            blocks_whole_incompressible: Counters::get(&core.counters().blocks_whole_incompressible),
            blocks_whole_by_share: Counters::get(&core.counters().blocks_whole_by_share),
            mean_fragment_bytes: Counters::get(&core.counters().fragment_bytes) as f64 / compressed.max(1) as f64,
        }
    });
    let held_blocks = counts.held_blocks() + shared_held_blocks;
    let thin_provisioning = geometry.thin_logical_block_count.map(|_| {
        let provisioned = geometry.provisioned_block_count();
        crate::stats::ThinStatus {
            provisioned_size_bytes: provisioned * BLOCK_SIZE_BYTES as u64,
            held_data_bytes: held_blocks * BLOCK_SIZE_BYTES as u64,
            used_fraction: held_blocks as f64 / provisioned.max(1) as f64,
        }
    });
    let deduplication = core.deduplication().map(|finder| {
        let found = &finder.counters;
        let get = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        let stored = stored_sixteenths as f64 / sixteenths as f64;
        let logical = blocks_mapped as f64;
        crate::stats::DeduplicationStatus {
            setting: if finder.enabled() { "on" } else { "off" }.to_string(),
            shared_logical_blocks: counts.shared_blocks,
            shared_copies,
            blocks_saved: counts.shared_blocks.saturating_sub(shared_copies),
            ratio: if stored > 0.0 { logical / stored } else { 1.0 },
            sampling_bits: finder.sampling_bits,
            index_memory_bytes: finder.memory_bytes(),
            index_memory_bytes_per_physical_block: finder.memory_bytes() as f64
                / geometry.physical_data_blocks().max(1) as f64,
            shared_table_memory_bytes,
            blocks_named: get(&found.blocks_named),
            duplicates_by_run: get(&found.duplicates_by_run),
            duplicates_by_recent: get(&found.duplicates_by_recent),
            duplicates_by_sparse: get(&found.duplicates_by_sparse),
            duplicates_within_requests: get(&found.duplicates_within_requests),
            candidates_rejected_by_checksum: get(&found.candidates_rejected_by_checksum),
            candidates_read_unequal: get(&found.candidates_read_unequal),
            duplicates_lost_to_races: get(&found.duplicates_lost_to_races),
            duplicates_over_bound: get(&found.duplicates_over_bound),
            copies_moved: get(&found.copies_moved),
            compressed_copies: fragment_copies,
            compressed_copies_sixteenths: fragment_copy_sixteenths,
            copies_compressed: get(&found.copies_compressed),
            compressed_copies_moved: get(&found.compressed_copies_moved),
            candidates_read_ahead: get(&found.candidates_read_ahead),
            candidates_found_ahead: get(&found.candidates_found_ahead),
            name_index_pages: finder.index().page_count(),
            name_index_pages_waiting_to_load: finder.index().pages_waiting_to_load(),
            name_index_pages_loaded: get(&found.name_pages_loaded),
            name_index_pages_unreadable: get(&found.name_pages_unreadable),
            name_index_pages_written: get(&found.name_pages_written),
        }
    });
    let map_cache = core.map().cache_stats();
    let state = core.lock_state();
    let segments_free = state.space().free_count() as u64;
    let segments_waiting = state.space().waiting_count();
    let counters = &core.counters();
    let lost = core.members().lost();
    let (rebuilding, missing): (Vec<usize>, Vec<usize>) = lost
        .iter()
        .partition(|&&member| core.members().state(member) == crate::array::members::MemberState::Rebuilding);
    let member_statuses: Vec<MemberStatus> = core.members().statuses();
    let superblock = core.members().superblock();
    let holder = &superblock.holder;
    let member_bytes_written = member_statuses.iter().map(|member| member.bytes_written).sum();
    let member_bytes_data = Counters::get(&counters.member_bytes_data);
    let member_bytes_relocated = Counters::get(&counters.member_bytes_relocated);
    let lifetime = core.members().lifetime_counters();
    let write_log = core.write_log().as_ref().map(|log| {
        let counters = &log.counters;
        let syncs = counters.syncs.load(Ordering::Relaxed);
        crate::stats::WriteLogStatus {
            devices: log.devices.iter().map(|device| device.path.clone()).collect(),
            // The status keeps why as text (`info`, `--json`).
            failed_devices: log
                .failed_devices()
                .into_iter()
                .map(|problem| (problem.path, problem.failure.to_string()))
                .collect(),
            active: log.failure().is_none(),
            size_bytes: log.size_bytes(),
            used_bytes: counters.used_bytes.load(Ordering::Relaxed),
            records_appended: counters.appends.load(Ordering::Relaxed),
            bytes_appended: counters.bytes_appended.load(Ordering::Relaxed),
            syncs,
            mean_sync_microseconds: counters.sync_nanoseconds.load(Ordering::Relaxed) as f64
                / 1000.0
                / syncs.max(1) as f64,
        }
    });
    VolumeStats {
        write_log,
        compression,
        thin_provisioning,
        deduplication,
        volume_uuid: uuid::Uuid::from_bytes(*core.volume_uuid()).to_string(),
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
        epoch: core.epoch(),
        read_only: core.read_only(),
        degraded: !lost.is_empty(),
        failures_still_tolerated: core.members().further_losses_survived(),
        missing_members: missing,
        rebuilding_members: rebuilding,
        failure: core.members().shutdown.lock().as_ref().map(ToString::to_string),
        members: member_statuses,
        holder: crate::stats::HolderStatus {
            open: holder.open,
            process_id: holder.process_id,
            host: holder.host.clone(),
            program: holder.program.clone(),
            opened_unix_seconds: holder.opened_unix_seconds,
            closed_unix_seconds: holder.closed_unix_seconds,
            description: holder.to_string(),
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
        created_unix_seconds: superblock.created_unix_seconds,
        lifetime,
        lifetime_write_amplification: lifetime.write_amplification(),
        blocks_mapped,
        stored_data_bytes,
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
        cleaning_policy: cleaner.policy().to_string(),
        cleaning_rounds: Counters::get(&counters.cleaning_rounds),
        segments_cleaned: Counters::get(&counters.segments_cleaned),
        blocks_written_cold: Counters::get(&counters.blocks_written_cold),
        client_batch_pairs: Counters::get(&counters.client_batch_pairs),
        write_amplification: counters.lifetime().write_amplification(),
        member_bytes_redundancy: Counters::get(&counters.member_bytes_redundancy),
        member_bytes_metadata: Counters::get(&counters.member_bytes_metadata),
        member_bytes_padding: Counters::get(&counters.member_bytes_padding),
        flushes: Counters::get(&counters.flushes),
        checkpoints: Counters::get(&counters.checkpoints),
        batches_written: Counters::get(&counters.batches_written),
        full_stripes: Counters::get(&counters.full_stripes),
        short_stripes: Counters::get(&counters.short_stripes),
        read_errors: Counters::get(&counters.read_errors),
        checksum_mismatches: Counters::get(&counters.checksum_mismatches),
        queued_member_reads: Counters::get(&counters.queued_member_reads),
        reads_from_recent_writes: Counters::get(&counters.reads_from_recent_writes),
        reads_from_block_cache: Counters::get(&counters.reads_from_block_cache),
        queued_checksum_table_loads: Counters::get(&counters.queued_checksum_table_loads),
        queued_map_page_loads: Counters::get(&counters.queued_map_page_loads),
        reconstructed_blocks: Counters::get(&counters.reconstructed_blocks),
        unrecoverable_reads: Counters::get(&counters.unrecoverable_reads),
        late_reads: Counters::get(&counters.late_reads),
        paced_writes: Counters::get(&counters.paced_writes),
        paced_seconds: Counters::get(&counters.paced_nanoseconds) as f64 / 1e9,
        writes_stalled_for_buffers: Counters::get(&counters.writes_stalled_for_buffers),
        buffer_stall_seconds: Counters::get(&counters.buffer_stall_nanoseconds) as f64 / 1e9,
        writes_stalled_for_space: Counters::get(&counters.writes_stalled_for_space),
        space_stall_seconds: Counters::get(&counters.space_stall_nanoseconds) as f64 / 1e9,
        member_bytes_read_cleaning: Counters::get(&counters.member_bytes_read_cleaning),
        write_queue_batches: core.write_queue_batches(),
        member_failures: core.members().failures_while_open(),
        map_memory_bytes: core.map().size_bytes(),
        map_bytes_per_logical_block: core.map().resident_size_bytes() as f64 / core.map().block_count().max(1) as f64,
        map_cache_bytes: map_cache.capacity_pages.saturating_mul(core.map().page_size_bytes()),
        map_cache_used_bytes: map_cache.resident_pages * core.map().page_size_bytes(),
        map_page_loads: map_cache.loads,
        map_page_evictions: map_cache.evictions,
        paging: crate::stats::PagingStatus {
            client_blocks_written: Counters::get(&counters.host_bytes_written) / BLOCK_SIZE_BYTES as u64,
            resident_pages_maximum: map_cache.resident_pages_maximum,
            cache_pages: map_cache.capacity_pages,
            page_loads: map_cache.loads,
            page_load_seconds: map_cache.load_nanoseconds as f64 / 1e9,
            pages_created: map_cache.pages_created,
            pages_loaded_ahead: map_cache.loaded_ahead,
            page_evictions: map_cache.evictions,
            evictions_kept_dirty: map_cache.evictions_kept_dirty,
            evictions_kept_referenced: map_cache.evictions_kept_referenced,
            evictions_blocked_by_checkpoints: Counters::get(&counters.evictions_blocked_by_checkpoints),
            evictions_blocked_by_writers: Counters::get(&counters.evictions_blocked_by_writers),
            checkpoints: Counters::get(&counters.checkpoints),
            checkpoints_for_dirty_pages: Counters::get(&counters.checkpoints_for_dirty_pages),
            checkpoints_for_replay_bytes: Counters::get(&counters.checkpoints_for_replay_bytes),
            checkpoints_for_interval: Counters::get(&counters.checkpoints_for_interval),
            checkpoint_index_pages: Counters::get(&counters.checkpoint_index_pages),
            checkpoint_directory_pages: Counters::get(&counters.checkpoint_directory_pages),
            checkpoint_table_pages: Counters::get(&counters.checkpoint_table_pages),
            checkpoint_seconds: Counters::get(&counters.checkpoint_nanoseconds) as f64 / 1e9,
            write_lock_waits: Counters::get(&counters.write_lock_waits),
            write_lock_wait_seconds: Counters::get(&counters.write_lock_wait_nanoseconds) as f64 / 1e9,
        },
        write_lock_holds: core.lock_holds().count(),
        write_lock_hold_p99_microseconds: core.lock_holds().quantile(0.99).as_secs_f64() * 1e6,
        write_lock_hold_p999_microseconds: core.lock_holds().quantile(0.999).as_secs_f64() * 1e6,
        write_lock_hold_maximum_microseconds: core.lock_holds().maximum().as_secs_f64() * 1e6,
        index_entry_bits: core.map().codec().width_bits,
        checksum_memory_bytes: core.checksum_memory_bytes(),
        write_buffer_memory_bytes: core.write_buffer_memory_bytes(),
        cache_memory_bytes: core.cache_memory_bytes(),
        last_sequence: state.log().last_sealed_sequence(),
        durable_through_sequence: state.log().durable_through(),
        recovery: recovery_report.clone(),
    }
}

impl Volume {
    /// Put `replacement` in the place of member `member` (failed, missing, or active: it
    /// is failed first) and start its rebuild: the replacement is written from now on; run
    /// [`Volume::rebuild`] to fill it.
    pub fn replace_member(&self, member: usize, replacement: MemberDevice, options: &ReplaceOptions) -> Result<()> {
        self.guarded(|| {
            self.core.check_open()?;
            self.maintenance.replace_member(member, replacement, options)
        })
    }

    /// Members being rebuilt (after [`Volume::replace_member`], or found rebuilding when
    /// the volume was opened after a crash).
    pub fn rebuilding_members(&self) -> Vec<usize> {
        self.core.members().rebuilding()
    }

    /// Reconstruct every rebuilding member's data from the others while the volume
    /// serves; at the end the superblocks record them as whole.
    pub fn rebuild(
        &self,
        options: &MaintenanceOptions,
        progress: &dyn Fn(MaintenanceProgress),
    ) -> Result<RebuildReport> {
        self.guarded(|| {
            self.core.check_open()?;
            if self.core.read_only() {
                return Err(Error::ReadOnly);
            }
            self.maintenance.rebuild(options, progress)
        })
    }

    /// Verify every live row on every member and repair what redundancy allows by moving
    /// the live blocks of damaged segments (read-only volumes: verify and report only).
    pub fn scrub(&self, options: &MaintenanceOptions, progress: &dyn Fn(MaintenanceProgress)) -> Result<ScrubReport> {
        self.guarded(|| {
            self.core.check_open()?;
            self.maintenance.scrub(options, progress)
        })
    }

    /// Check every member's health now (the flush timer of a threaded volume does it every
    /// second): a deleted, truncated or overwritten member is failed.
    pub fn check_member_health(&self) -> Result<()> {
        self.core.check_open()?;
        self.core.members().check_health()
    }
}

/// What an open volume of `geometry` allocates whatever its use: the index with every page
/// resident (it is not paged yet), the checksum cache, and the per-segment tables. (Buffers and the block cache are
/// fixed budgets of their own.)
pub(crate) fn memory_needed(geometry: &Geometry, checksum_cache_bytes: u64, map_cache_bytes: u64) -> MemoryNeeds {
    let codec = crate::index::map::EntryCodec::for_geometry(geometry);
    let map = BlockMap::size_with_cache(geometry.logical_block_count(), codec, map_cache_bytes);
    // The cache's budget, or every table when fewer fill it (the tables of the segments
    // receiving batches are pinned besides: a few).
    let checksums = (geometry.physical_data_blocks() * 4).min(checksum_cache_bytes);
    // The segment table, rows on the members, generations, and the free list.
    let segments = geometry.segment_count() * (std::mem::size_of::<crate::space::SegmentUse>() as u64 + 4 + 4 + 8);
    MemoryNeeds { index_bytes: map, checksum_bytes: checksums, segment_table_bytes: segments }
}

/// Refuse a volume whose index and tables need more RAM than allowed.
fn check_memory(geometry: &Geometry, options: &OpenOptions, map_cache_bytes: u64) -> Result<()> {
    let Some(available_bytes) = options.memory_limit_bytes.or_else(available_memory_bytes) else {
        return Ok(()); // the machine does not say: nothing to judge by
    };
    let needs = memory_needed(geometry, options.checksum_cache_bytes, map_cache_bytes);
    let needed_bytes = needs.total_bytes();
    if needed_bytes > available_bytes {
        return Err(Error::NotEnoughMemory { needed_bytes, available_bytes, needs });
    }
    Ok(())
}

/// The memory the kernel says new work can have (`MemAvailable` in /proc/meminfo).
fn available_memory_bytes() -> Option<u64> {
    meminfo_bytes("MemAvailable:")
}

/// The machine's memory (`MemTotal`).
fn machine_memory_bytes() -> Option<u64> {
    meminfo_bytes("MemTotal:")
}

fn meminfo_bytes(field: &str) -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with(field))?;
    let kibibytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kibibytes * 1024)
}
