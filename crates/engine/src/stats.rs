//! Counters the engine keeps, and the snapshot it reports (`stripelog info --json`).

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic event counters, updated without locks.
#[derive(Default)]
pub struct Counters {
    pub host_bytes_written: AtomicU64,
    pub host_bytes_read: AtomicU64,
    pub host_bytes_zeroed: AtomicU64,
    pub host_bytes_trimmed: AtomicU64,
    pub flushes: AtomicU64,
    pub batches_written: AtomicU64,
    pub full_stripes: AtomicU64,
    pub short_stripes: AtomicU64,
    pub member_bytes_data: AtomicU64,
    pub member_bytes_relocated: AtomicU64,
    pub blocks_relocated: AtomicU64,
    pub cleaning_rounds: AtomicU64,
    pub segments_cleaned: AtomicU64,
    /// Client blocks written to the cold stream, and clients' batches sealed as a pair
    /// with a cold batch (feature bit 5).
    pub blocks_written_cold: AtomicU64,
    pub client_batch_pairs: AtomicU64,
    pub member_bytes_redundancy: AtomicU64,
    pub member_bytes_metadata: AtomicU64,
    pub member_bytes_padding: AtomicU64,
    pub read_errors: AtomicU64,
    pub checksum_mismatches: AtomicU64,
    pub reconstructed_blocks: AtomicU64,
    pub unrecoverable_reads: AtomicU64,
    /// Direct reads of a lagging member given up at the hedge deadline.
    pub late_reads: AtomicU64,
    /// Member blocks a `ReadQueue` read through its ring and took as read (not read again).
    pub queued_member_reads: AtomicU64,
    /// Blocks read from the data sets of recently written batches kept in the buffer pool,
    /// and from the block cache.
    pub reads_from_recent_writes: AtomicU64,
    pub reads_from_block_cache: AtomicU64,
    /// Checksum tables a `ReadQueue` read through its ring (summaries read one after the
    /// other while other reads went on) and cached.
    pub queued_checksum_table_loads: AtomicU64,
    /// Index pages a `ReadQueue` read through its ring and the map took.
    pub queued_map_page_loads: AtomicU64,
    /// Client writes held back by the write pacer (`space::pacing`), and for how long.
    pub paced_writes: AtomicU64,
    pub paced_nanoseconds: AtomicU64,
    /// Writes that stalled, and for how long in all, by cause: no free write buffer (the
    /// members are writing every sealed batch the pool holds), and no free segment (the
    /// writer waited for the cleaner, or cleaned itself).
    pub writes_stalled_for_buffers: AtomicU64,
    pub buffer_stall_nanoseconds: AtomicU64,
    pub writes_stalled_for_space: AtomicU64,
    pub space_stall_nanoseconds: AtomicU64,
    /// Bytes the cleaner read from members to relocate live blocks (whole spans of rows,
    /// dead blocks between live ones included).
    pub member_bytes_read_cleaning: AtomicU64,
    /// Checkpoints committed.
    pub checkpoints: AtomicU64,
    /// Of those, the ones written because they were due (`CheckpointState::due`), by
    /// cause: dirty index pages at their bound, the batches a mount would replay at their
    /// budget, the interval; the rest were written for space, at a close or a mount.
    pub checkpoints_for_dirty_pages: AtomicU64,
    pub checkpoints_for_replay_bytes: AtomicU64,
    pub checkpoints_for_interval: AtomicU64,
    /// Index pages the committed checkpoints wrote, and the time checkpoints took
    /// (from taking the checkpoint lock to the commit; no page is evicted meanwhile).
    pub checkpoint_index_pages: AtomicU64,
    /// Directory pages (every tree) and segment table pages the committed checkpoints
    /// wrote.
    pub checkpoint_directory_pages: AtomicU64,
    pub checkpoint_table_pages: AtomicU64,
    pub checkpoint_nanoseconds: AtomicU64,
    /// Times the map cache was over its bound and the evictor gave up because a
    /// checkpoint held its lock, or a writer the write lock.
    pub evictions_blocked_by_checkpoints: AtomicU64,
    pub evictions_blocked_by_writers: AtomicU64,
    /// Takings of the write lock that waited for another holder, and for how long in all.
    pub write_lock_waits: AtomicU64,
    pub write_lock_wait_nanoseconds: AtomicU64,
    /// Client blocks stored as fragments, and those offered to compression but stored
    /// whole because they did not save an eighth (the probe's refusals included), or
    /// because the CPU share left them out (docs/compression.md).
    pub blocks_compressed: AtomicU64,
    pub blocks_whole_incompressible: AtomicU64,
    pub blocks_whole_by_share: AtomicU64,
    /// Bytes of the fragments written (their share of the packed blocks).
    pub fragment_bytes: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
    /// Count one wait of `waited` in `waits` and `nanoseconds`; nothing when it is zero.
    pub fn add_wait(waits: &AtomicU64, nanoseconds: &AtomicU64, waited: std::time::Duration) {
        if !waited.is_zero() {
            Counters::add(waits, 1);
            Counters::add(nanoseconds, waited.as_nanos() as u64);
        }
    }
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Add a batch's member bytes and the batch (`BatchHeader::member_bytes`).
    pub(crate) fn add_batch(&self, batch: &LifetimeCounters) {
        Counters::add(&self.member_bytes_data, batch.member_bytes_data);
        Counters::add(&self.member_bytes_relocated, batch.member_bytes_relocated);
        Counters::add(&self.member_bytes_metadata, batch.member_bytes_metadata);
        Counters::add(&self.member_bytes_padding, batch.member_bytes_padding);
        Counters::add(&self.member_bytes_redundancy, batch.member_bytes_redundancy);
        Counters::add(&self.batches_written, batch.batches_written);
    }

    /// The counters that persist, as they stand now.
    pub fn lifetime(&self) -> LifetimeCounters {
        LifetimeCounters {
            host_bytes_written: Counters::get(&self.host_bytes_written),
            host_bytes_read: Counters::get(&self.host_bytes_read),
            host_bytes_zeroed: Counters::get(&self.host_bytes_zeroed),
            host_bytes_trimmed: Counters::get(&self.host_bytes_trimmed),
            member_bytes_data: Counters::get(&self.member_bytes_data),
            member_bytes_redundancy: Counters::get(&self.member_bytes_redundancy),
            member_bytes_metadata: Counters::get(&self.member_bytes_metadata),
            member_bytes_padding: Counters::get(&self.member_bytes_padding),
            member_bytes_relocated: Counters::get(&self.member_bytes_relocated),
            cleaning_rounds: Counters::get(&self.cleaning_rounds),
            segments_cleaned: Counters::get(&self.segments_cleaned),
            flushes: Counters::get(&self.flushes),
            batches_written: Counters::get(&self.batches_written),
        }
    }
}

/// What a volume has done over its whole life, persisted at every superblock update (so
/// after a crash: up to the last update). Byte offsets from 2368, 8 bytes each, in this
/// order (docs/on-disk-format.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LifetimeCounters {
    pub host_bytes_written: u64,
    pub host_bytes_read: u64,
    pub host_bytes_zeroed: u64,
    pub host_bytes_trimmed: u64,
    pub member_bytes_data: u64,
    pub member_bytes_redundancy: u64,
    pub member_bytes_metadata: u64,
    pub member_bytes_padding: u64,
    pub member_bytes_relocated: u64,
    pub cleaning_rounds: u64,
    pub segments_cleaned: u64,
    pub flushes: u64,
    pub batches_written: u64,
}

/// The number of [`LifetimeCounters`] fields.
pub const LIFETIME_COUNTER_COUNT: usize = 13;

impl LifetimeCounters {
    /// Write amplification over these counters (member bytes ÷ client bytes, by part).
    pub fn write_amplification(&self) -> WriteAmplification {
        WriteAmplification::of(MemberBytes {
            client: self.host_bytes_written,
            data: self.member_bytes_data,
            relocated: self.member_bytes_relocated,
            redundancy: self.member_bytes_redundancy,
            metadata: self.member_bytes_metadata,
            padding: self.member_bytes_padding,
        })
    }

    pub fn to_array(self) -> [u64; LIFETIME_COUNTER_COUNT] {
        [
            self.host_bytes_written,
            self.host_bytes_read,
            self.host_bytes_zeroed,
            self.host_bytes_trimmed,
            self.member_bytes_data,
            self.member_bytes_redundancy,
            self.member_bytes_metadata,
            self.member_bytes_padding,
            self.member_bytes_relocated,
            self.cleaning_rounds,
            self.segments_cleaned,
            self.flushes,
            self.batches_written,
        ]
    }

    pub fn from_array(values: [u64; LIFETIME_COUNTER_COUNT]) -> LifetimeCounters {
        let [host_bytes_written, host_bytes_read, host_bytes_zeroed, host_bytes_trimmed, member_bytes_data, member_bytes_redundancy, member_bytes_metadata, member_bytes_padding, member_bytes_relocated, cleaning_rounds, segments_cleaned, flushes, batches_written] =
            values;
        LifetimeCounters {
            host_bytes_written,
            host_bytes_read,
            host_bytes_zeroed,
            host_bytes_trimmed,
            member_bytes_data,
            member_bytes_redundancy,
            member_bytes_metadata,
            member_bytes_padding,
            member_bytes_relocated,
            cleaning_rounds,
            segments_cleaned,
            flushes,
            batches_written,
        }
    }

    /// Field by field sum (counters since an open on top of those persisted before it).
    pub fn plus(self, other: LifetimeCounters) -> LifetimeCounters {
        let (mut sum, other) = (self.to_array(), other.to_array());
        for (value, more) in sum.iter_mut().zip(other) {
            *value = value.saturating_add(more);
        }
        LifetimeCounters::from_array(sum)
    }
}

/// Bytes written by clients and to the members, by cause: what [`WriteAmplification`] is
/// computed from.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemberBytes {
    /// Bytes clients wrote (write requests; zeroes and trims are not writes).
    pub client: u64,
    /// Client data as stored: below `client` when compression or deduplication saved.
    pub data: u64,
    /// Live blocks the cleaner moved.
    pub relocated: u64,
    /// Parity or mirror copies.
    pub redundancy: u64,
    /// Summaries, checkpoints, index pages.
    pub metadata: u64,
    /// The unused slots of short stripes.
    pub padding: u64,
}

impl MemberBytes {
    pub fn member_total(&self) -> u64 {
        self.data + self.relocated + self.redundancy + self.metadata + self.padding
    }
}

/// Write amplification as the seeds and SNIA define it: bytes written to the members per
/// byte clients wrote (`total`), and its parts, which add up to it: `data` (below 1 when
/// compression or deduplication saved), `cleaning` (the cleaner's relocations),
/// `redundancy` (parity or mirror), `metadata` (summaries, checkpoints) and `padding`
/// (short stripes). 0 before any client write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct WriteAmplification {
    pub total: f64,
    pub data: f64,
    pub cleaning: f64,
    pub redundancy: f64,
    pub metadata: f64,
    pub padding: f64,
    /// Not a write amplification: the cleaner's write cost, as the LFS papers define it
    /// — (new data + relocated) ÷ new data, both as stored on the members.
    pub cleaning_write_cost: f64,
}

impl WriteAmplification {
    pub fn of(bytes: MemberBytes) -> WriteAmplification {
        let part = |member_bytes: u64| ratio(member_bytes, bytes.client);
        let amplification = WriteAmplification {
            total: part(bytes.member_total()),
            data: part(bytes.data),
            cleaning: part(bytes.relocated),
            redundancy: part(bytes.redundancy),
            metadata: part(bytes.metadata),
            padding: part(bytes.padding),
            cleaning_write_cost: ratio(bytes.data + bytes.relocated, bytes.data),
        };
        let parts = amplification.data
            + amplification.cleaning
            + amplification.redundancy
            + amplification.metadata
            + amplification.padding;
        assert!(
            (parts - amplification.total).abs() <= 1e-9 * amplification.total.max(1.0),
            "the parts of write amplification add up to it: {amplification:?}"
        );
        amplification
    }
}

/// What mount found written after the last batch the persisted lifetime counters count:
/// the replayed batches (client bytes and member bytes) and the batches beyond the end of
/// the log (member bytes only: the members were written, the writes are lost).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FoundCounts {
    pub lifetime: LifetimeCounters,
    /// Bytes each member was written (its block of every row).
    pub bytes_per_member: u64,
    /// The last batch counted (0: none).
    pub through_sequence: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    pub index: usize,
    pub name: String,
    pub present: bool,
    /// "active", "failed" or "rebuilding".
    pub state: String,
    pub description: String,
    /// Bytes written to it since the volume was opened.
    pub bytes_written: u64,
    /// Bytes written to it over its life in the volume (persisted in its superblock at
    /// every update: after a crash, up to the last update).
    pub lifetime_bytes_written: u64,
    /// Mean time of a direct read of one block (moving average), in microseconds.
    pub read_latency_mean_micros: f64,
    /// Fraction of recent reads later than the hedge deadline.
    pub late_read_fraction: f64,
    /// Its reads are hedged (docs/resilience.md, "Slow members").
    pub lagging: bool,
    /// The member UUID expected in this position (empty: not known yet, a volume written
    /// by format version 1 that was not opened read-write since).
    pub member_uuid: String,
}

/// Who opened the volume read-write last (docs/data-safety.md, "The holder record").
#[derive(Clone, Debug, Serialize)]
pub struct HolderStatus {
    /// A read-write open that has not closed cleanly (still running, or it crashed).
    pub open: bool,
    pub process_id: u32,
    pub host: String,
    pub program: String,
    pub opened_unix_seconds: u64,
    /// The last clean close (0: never).
    pub closed_unix_seconds: u64,
    /// One line for people.
    pub description: String,
}

/// A member replaced by another: its device is refused if it is ever offered again.
#[derive(Clone, Debug, Serialize)]
pub struct RetiredMemberStatus {
    pub member_uuid: String,
    pub position: u32,
    pub retired_unix_seconds: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RecoveryReport {
    /// The checkpoint mount started from (its generation; `None`: every segment scanned).
    pub checkpoint_generation: Option<u64>,
    /// Batches after the checkpoint the walk along the streams' links read.
    pub segments_scanned: u64,
    pub batches_found: u64,
    pub batches_replayed: u64,
    /// Batches after the last durable point whose data was read back and verified.
    pub tail_batches_verified: u64,
    /// Batches found after the end of the recovered log (unflushed, torn or orphaned).
    pub batches_discarded: u64,
    /// Damaged shards of the tail that recovery rebuilt and rewrote in place.
    pub shards_repaired: u64,
    pub last_sequence: u64,
    /// The log ended before this batch because blocks of it could be neither read nor
    /// rebuilt: writes a crash tore (the common case), or — when the last flush made it
    /// durable and no later record says so yet — damage beyond what the RAID level covers.
    pub ended_at_unreadable_batch: Option<u64>,
    pub seconds: f64,
    /// Write log entries the members lacked, replayed at this (read-write) open.
    pub write_log_entries_replayed: u64,
    /// Write log entries the members lack, not replayed by this read-only open: reads
    /// show the volume without them until a read-write open replays them.
    pub write_log_entries_pending: u64,
    /// The last read-write open closed the volume cleanly (false: it crashed, was killed
    /// or is still running); and who it was.
    pub closed_cleanly: bool,
    pub previous_holder: String,
}

impl RecoveryReport {
    /// One line on what recovery after an unclean shutdown did.
    pub fn unclean_shutdown_summary(&self) -> String {
        let start = match self.checkpoint_generation {
            Some(generation) => format!("from checkpoint {generation}"),
            None => "by a full scan".to_string(),
        };
        let mut summary = format!(
            "the volume was not closed cleanly ({}); recovery {start} replayed {} batches through {}, \
             discarded {} unflushed or torn ones after the end of the log, repaired {} shards",
            self.previous_holder,
            self.batches_replayed,
            self.last_sequence,
            self.batches_discarded,
            self.shards_repaired
        );
        if self.write_log_entries_replayed > 0 {
            summary += &format!(", replayed {} write log entries", self.write_log_entries_replayed);
        }
        if self.write_log_entries_pending > 0 {
            summary +=
                &format!(", left {} write log entries for a read-write open to replay", self.write_log_entries_pending);
        }
        summary + &format!(" in {:.3} s", self.seconds)
    }

    /// Log what recovery did after an unclean shutdown: a warning when this open repaired
    /// it (read-write), a note when it only looked (read-only).
    pub(crate) fn report_unclean_shutdown(&self, read_only: bool) {
        if self.closed_cleanly {
            return;
        }
        if read_only {
            log::info!("{} (read-only: nothing was written)", self.unclean_shutdown_summary());
        } else {
            log::warn!("{}", self.unclean_shutdown_summary());
        }
    }
}

/// The write log's state (`info`, `--json`).
#[derive(Clone, Debug, Serialize)]
pub struct WriteLogStatus {
    pub devices: Vec<String>,
    /// Devices that failed, with why.
    pub failed_devices: Vec<(String, String)>,
    /// False once every device failed (flushes sync the members from then on).
    pub active: bool,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub records_appended: u64,
    pub bytes_appended: u64,
    pub syncs: u64,
    /// Mean time of one sync of the log device(s), since the open.
    pub mean_sync_microseconds: f64,
}

/// Compression on a volume created with it (docs/compression.md).
#[derive(Clone, Debug, Serialize)]
pub struct CompressionStatus {
    /// How new writes are stored: "lz4" or "off".
    pub setting: String,
    /// Share of offered client blocks compressed now (the CPU-adaptive controller's), 0–1.
    pub share: f64,
    /// Distinct contents stored, in blocks: whole blocks, fragments (logical blocks stored
    /// compressed) and shared copies, each once (a reference to a shared copy is
    /// deduplication's saving, not compression's).
    pub logical_data_blocks: u64,
    /// Contents stored as fragments: logical blocks, and shared copies compressed.
    pub fragment_blocks: u64,
    /// Blocks of the data space those contents take: whole blocks and whole shared
    /// copies, plus the fragments' and compressed copies' sixteenths / 16.
    pub physical_data_blocks: f64,
    /// logical ÷ physical: what compression saves on what is stored.
    pub ratio: f64,
    /// Since this open: client blocks stored compressed, stored whole because they did
    /// not save an eighth, and stored whole because the CPU share left them out.
    pub blocks_compressed: u64,
    pub blocks_whole_incompressible: u64,
    pub blocks_whole_by_share: u64,
    /// Mean fragment size of the blocks compressed since this open.
    pub mean_fragment_bytes: f64,
}

/// Deduplication on a volume created with it (docs/deduplication.md).
#[derive(Clone, Debug, Serialize)]
pub struct DeduplicationStatus {
    /// Whether new writes are deduplicated: "on" or "off".
    pub setting: String,
    /// Logical blocks served by shared copies, and the copies (records in use).
    pub shared_logical_blocks: u64,
    pub shared_copies: u64,
    /// Blocks the sharing saves: shared logical blocks less their copies.
    pub blocks_saved: u64,
    /// Logical blocks holding data ÷ blocks of data stored (whole blocks, fragments'
    /// sixteenths, shared copies).
    pub ratio: f64,
    /// One block name in 2^bits enters the sparse index.
    pub sampling_bits: u32,
    /// RAM of the name index (sparse and recent tables, fixed at open), and per data
    /// position of the volume.
    pub index_memory_bytes: u64,
    pub index_memory_bytes_per_physical_block: f64,
    /// RAM of the shared-block table (8 bytes per record number up to the highest used).
    pub shared_table_memory_bytes: u64,
    /// Since this open: whole blocks named, duplicates found by a run, the recent table
    /// and the sparse index, candidates turned away by their stored checksum and by
    /// their content, duplicates found but changed before the state lock (written whole),
    /// and duplicates of copies at the 254-reference bound (written whole).
    pub blocks_named: u64,
    pub duplicates_by_run: u64,
    pub duplicates_by_recent: u64,
    pub duplicates_by_sparse: u64,
    /// Since this open: blocks equal to an earlier block of the same request, shared
    /// with it.
    pub duplicates_within_requests: u64,
    pub candidates_rejected_by_checksum: u64,
    pub candidates_read_unequal: u64,
    pub duplicates_lost_to_races: u64,
    pub duplicates_over_bound: u64,
    /// Since this open: shared copies the cleaner moved (one record rewritten each).
    pub copies_moved: u64,
    /// Shared copies in use stored compressed, as fragments (decision 11), and the
    /// sixteenths of a block they take; since this open, copies born compressed.
    pub compressed_copies: u64,
    pub compressed_copies_sixteenths: u64,
    pub copies_compressed: u64,
    /// Since this open: of the copies moved, those that are fragments.
    pub compressed_copies_moved: u64,
    /// Since this open: candidates read ahead of runs, and those requests found there.
    pub candidates_read_ahead: u64,
    pub candidates_found_ahead: u64,
    /// The name index persisted by checkpoints (docs/deduplication.md, "The persistent
    /// name index"): its pages, those still to be loaded since the open, those loaded and
    /// unreadable at the open, and those checkpoints wrote since.
    pub name_index_pages: u64,
    pub name_index_pages_waiting_to_load: u64,
    pub name_index_pages_loaded: u64,
    pub name_index_pages_unreadable: u64,
    pub name_index_pages_written: u64,
}

/// Thin provisioning (docs/deduplication.md, decision 10): what the volume may hold and
/// holds.
#[derive(Clone, Debug, Serialize)]
pub struct ThinStatus {
    /// The data the volume may hold (the data capacity less the spare); writes beyond it
    /// fail with ENOSPC.
    pub provisioned_size_bytes: u64,
    /// The data it holds: whole blocks, fragments' sixteenths rounded up to blocks, and
    /// shared copies (once each).
    pub held_data_bytes: u64,
    /// held ÷ provisioned.
    pub used_fraction: f64,
}

/// Where the index's paging spends its time, since the open: what `info` prints as the
/// paging lines and the figures per million client blocks written beside them.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PagingStatus {
    /// Client blocks accepted since the open (the denominator of the ratios below).
    pub client_blocks_written: u64,
    /// The most index pages resident at once, against the cache's bound in pages.
    pub resident_pages_maximum: u64,
    pub cache_pages: u64,
    /// Pages read in by lookups, and the seconds they took; pages created empty.
    pub page_loads: u64,
    pub page_load_seconds: f64,
    pub pages_created: u64,
    /// Of the loads, pages the cleaner loaded ahead of its lookups, several at once.
    pub pages_loaded_ahead: u64,
    /// Pages evicted; passes of the clock that kept a page because it was dirty or used
    /// since; times the evictor gave up because a checkpoint or a writer held a lock.
    pub page_evictions: u64,
    pub evictions_kept_dirty: u64,
    pub evictions_kept_referenced: u64,
    pub evictions_blocked_by_checkpoints: u64,
    pub evictions_blocked_by_writers: u64,
    /// Checkpoints committed, by cause (the rest: for space, at a close, at a mount),
    /// the index pages they wrote and the seconds they took.
    pub checkpoints: u64,
    pub checkpoints_for_dirty_pages: u64,
    pub checkpoints_for_replay_bytes: u64,
    pub checkpoints_for_interval: u64,
    pub checkpoint_index_pages: u64,
    /// The directory pages of every tree and the segment table pages they wrote.
    pub checkpoint_directory_pages: u64,
    pub checkpoint_table_pages: u64,
    pub checkpoint_seconds: f64,
    /// Takings of the write lock that waited, and the seconds they waited in all.
    pub write_lock_waits: u64,
    pub write_lock_wait_seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct VolumeStats {
    /// The write log, when the volume has one.
    pub write_log: Option<WriteLogStatus>,
    /// Compression, on a volume created with it.
    pub compression: Option<CompressionStatus>,
    /// Thin provisioning, on a volume created with a logical size of its own.
    pub thin_provisioning: Option<ThinStatus>,
    /// Deduplication, on a volume created with it.
    pub deduplication: Option<DeduplicationStatus>,
    pub volume_uuid: String,
    pub raid_level: String,
    pub member_count: usize,
    pub data_columns: usize,
    pub chunk_size_bytes: u32,
    pub block_size_bytes: usize,
    pub spare_fraction: f64,
    pub member_size_bytes: u64,
    pub logical_size_bytes: u64,
    pub physical_data_bytes: u64,
    /// What the log can fill with client data: the data space less the summary blocks of
    /// whole segments. The spare fraction is a fraction of it.
    pub data_capacity_bytes: u64,
    pub epoch: u64,
    pub read_only: bool,
    pub degraded: bool,
    /// Failed or missing members (not written, not read).
    pub missing_members: Vec<usize>,
    /// Replacements being rebuilt (written, read only where rebuilt).
    pub rebuilding_members: Vec<usize>,
    /// How many more member failures the volume survives now.
    pub failures_still_tolerated: usize,
    pub failure: Option<String>,
    pub members: Vec<MemberStatus>,
    /// The superblocks' record of the last read-write open (this one, when read-write).
    pub holder: HolderStatus,
    /// Members replaced so far (most recent last).
    pub retired_members: Vec<RetiredMemberStatus>,
    /// The superblock format version found on the members (3; 1 or 2 for a volume not
    /// upgraded yet, which opens read-only).
    pub superblock_version: u32,
    /// When the volume was created (seconds since 1970, from its superblock).
    pub created_unix_seconds: u64,
    /// What the volume has done over its whole life: persisted at every superblock update,
    /// plus what this open has done since. The fields below without `lifetime` count
    /// since this open.
    pub lifetime: LifetimeCounters,
    /// Write amplification over the volume's life (member bytes ÷ client bytes, by part),
    /// from `lifetime`.
    pub lifetime_write_amplification: WriteAmplification,
    /// Logical blocks that read data: whole, compressed, or referring to a shared copy.
    pub blocks_mapped: u64,
    /// Bytes of data-space the mapped blocks' contents take: whole blocks, fragments'
    /// shares, shared copies once each.
    pub stored_data_bytes: u64,
    pub blocks_zero: u64,
    pub segments_total: u64,
    pub segments_used: u64,
    pub segments_free: u64,
    pub segments_waiting_for_flush: u64,
    pub host_bytes_written: u64,
    pub host_bytes_read: u64,
    pub host_bytes_zeroed: u64,
    pub host_bytes_trimmed: u64,
    pub member_bytes_written: u64,
    /// New data from clients, as written to the members (before redundancy).
    pub member_bytes_data: u64,
    /// Live blocks moved by the cleaner.
    pub member_bytes_relocated: u64,
    pub member_bytes_redundancy: u64,
    pub member_bytes_metadata: u64,
    pub member_bytes_padding: u64,
    pub cleaning_policy: String,
    pub cleaning_rounds: u64,
    pub segments_cleaned: u64,
    /// Client blocks written to the cold stream since the open (feature bit 5;
    /// docs/garbage-collection.md, "Streams"), and clients' batches sealed as a pair with
    /// a cold batch.
    pub blocks_written_cold: u64,
    pub client_batch_pairs: u64,
    /// Write amplification since this open (member bytes ÷ client bytes, by part).
    pub write_amplification: WriteAmplification,
    /// Syncs of the members since the open (a flush request that finds a sync running
    /// shares the next one; with a write log, flushes sync the log, and the members are
    /// synced at checkpoints and when the log needs room).
    pub flushes: u64,
    /// Checkpoints committed since the open.
    pub checkpoints: u64,
    pub batches_written: u64,
    pub full_stripes: u64,
    pub short_stripes: u64,
    pub read_errors: u64,
    pub checksum_mismatches: u64,
    pub reconstructed_blocks: u64,
    pub unrecoverable_reads: u64,
    /// Direct reads of a lagging member given up at the hedge deadline (the block came
    /// from the rest of its row, or the read was waited for after all).
    pub late_reads: u64,
    /// Member blocks read through a `ReadQueue`'s ring (io_uring) and taken as read.
    pub queued_member_reads: u64,
    /// Blocks read from memory: from the kept data sets of recent writes (the first half
    /// of the cache), and from the block cache (blocks read from members).
    pub reads_from_recent_writes: u64,
    pub reads_from_block_cache: u64,
    /// Segments' checksum tables read through a `ReadQueue`'s ring rather than on the
    /// reading thread.
    pub queued_checksum_table_loads: u64,
    /// Index pages read through a `ReadQueue`'s ring rather than on the reading thread.
    pub queued_map_page_loads: u64,
    /// Client writes the pacer held back on a full volume, and the seconds they waited in
    /// all (docs/garbage-collection.md, "Pacing").
    pub paced_writes: u64,
    pub paced_seconds: f64,
    /// Writes that stalled because every write buffer was waiting for the members, and
    /// the seconds they stalled in all: the members are the limit.
    pub writes_stalled_for_buffers: u64,
    pub buffer_stall_seconds: f64,
    /// Writes that stalled because no segment was free (waiting for the cleaner thread,
    /// or cleaning on the writer's own thread), and the seconds they stalled in all: the
    /// cleaner is the limit. With the pacer working these stay near zero.
    pub writes_stalled_for_space: u64,
    pub space_stall_seconds: f64,
    /// Bytes the cleaner read from members since the volume was opened: each victim
    /// column's rows from its first to its last live block, in one request. Over
    /// `member_bytes_relocated` it shows what reading whole spans costs against reading
    /// exactly the live blocks.
    pub member_bytes_read_cleaning: u64,
    /// Sealed batches the write pipeline holds at most: how far a slow member may lag.
    pub write_queue_batches: usize,
    /// Members failed while the volume was open (I/O errors, health checks).
    pub member_failures: u64,
    /// RAM the index holds now (the pages written so far) and the cleaner's per-block
    /// lifetime data.
    pub map_memory_bytes: u64,
    /// The same per logical block with every index page resident.
    pub map_bytes_per_logical_block: f64,
    /// The map cache (`--map-cache`): RAM index pages may take, and what they take now.
    pub map_cache_bytes: u64,
    pub map_cache_used_bytes: u64,
    /// Index pages read from the log since the open (misses), and evicted.
    pub map_page_loads: u64,
    pub map_page_evictions: u64,
    /// Where paging's time goes since the open (docs/index-and-checkpoints.md, "Paging").
    pub paging: PagingStatus,
    /// Holds of the write lock since the open, and how long they lasted: the 99th and
    /// 99.9th percentiles and the longest (to within 12.5 %). Every write takes it; nothing
    /// under it waits for a member.
    pub write_lock_holds: u64,
    pub write_lock_hold_p99_microseconds: f64,
    pub write_lock_hold_p999_microseconds: f64,
    pub write_lock_hold_maximum_microseconds: f64,
    /// Bits of one index entry (as narrow as the volume's positions and segments allow).
    pub index_entry_bits: u32,
    pub checksum_memory_bytes: u64,
    pub write_buffer_memory_bytes: u64,
    /// RAM given to the block cache (0: no cache).
    pub cache_memory_bytes: u64,
    pub last_sequence: u64,
    pub durable_through_sequence: u64,
    pub recovery: RecoveryReport,
}

/// `numerator / denominator`, 0 when nothing was counted.
pub(crate) fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 {
        0.0
    } else {
        numerator as f64 / denominator as f64
    }
}
