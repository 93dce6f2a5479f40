//! The engine's error type. Lower-level errors are wrapped as variants; every variant
//! says what failed and, where it applies, which member.

use std::sync::Arc;
use stripelog_blockdev::DeviceError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid geometry: {0}")]
    InvalidGeometry(GeometryProblem),
    #[error("invalid request: {0}")]
    InvalidRequest(RequestProblem),
    #[error("member {member} ({path}): {problem}")]
    Member { member: usize, path: String, problem: MemberProblem },
    #[error("member {member}: {source}")]
    Device { member: usize, source: DeviceError },
    #[error("I/O error: logical block {logical_block} cannot be read or rebuilt ({reason})")]
    Unrecoverable { logical_block: u64, reason: ReadFailure },
    /// Mount found metadata destroyed beyond what redundancy rebuilds: serving the volume
    /// would return stale or zero blocks for data that was written.
    #[error("metadata damaged beyond repair: {0}")]
    MetadataLost(LostMetadata),
    /// Mount found a log no run of the engine writes.
    #[error("the log is inconsistent: {0}")]
    InconsistentLog(LogInconsistency),
    #[error(
        "the volume is full: no free segment, and cleaning cannot make one (every used segment is live; trim or \
         delete data, or create the volume with a larger spare)"
    )]
    OutOfSpace,
    /// A thinly provisioned volume holds as much data as it may (its provisioned size).
    #[error(
        "the thinly provisioned volume is full: it holds {held_blocks} blocks of data, its provisioned size, and \
         this write needs {needed_blocks} more (trim or overwrite data to free room)"
    )]
    ThinLimit { held_blocks: u64, needed_blocks: u64 },
    /// `create` or `replace` found data or a volume on a device it would overwrite.
    #[error("member {member} ({path}) {found}: refusing to overwrite it unless forced")]
    WouldDestroy { member: usize, path: String, found: FoundContent },
    /// The volume is recorded as open read-write on another host and was not closed there.
    #[error(
        "volume {volume} is open on host {host} ({holder}) and was not closed there: it may be in use; if {host} \
         is down and nothing else uses the members, open it with force"
    )]
    HeldByAnotherHost { volume: uuid::Uuid, host: String, holder: Box<Holder> },
    /// The volume's index and tables would not fit the memory allowed: refused before
    /// any of it is allocated.
    #[error(
        "the volume needs {} of RAM for its index and tables ({needs}) and only {} is available: \
         use fewer or smaller members, or a machine with more memory",
        gibibytes(*needed_bytes),
        gibibytes(*available_bytes)
    )]
    NotEnoughMemory { needed_bytes: u64, available_bytes: u64, needs: MemoryNeeds },
    /// A volume written by an older format: opened read-only, or upgraded on request.
    #[error(
        "volume {volume} has on-disk format version {version}; this stripelog writes version {current}, which \
         older releases cannot read: run `stripelog upgrade` on its members to convert it (one way), or open it \
         read-only"
    )]
    FormatUpgradeNeeded { volume: uuid::Uuid, version: u32, current: u32 },
    #[error("the volume is read-only")]
    ReadOnly,
    /// The volume's write log cannot be read or written.
    #[error("write log: {0}")]
    WriteLogUnavailable(WriteLogProblem),
    /// The volume was not closed cleanly and its write log cannot be read: the writes
    /// acknowledged since the members were last synced may only be there.
    #[error(
        "the volume was not closed cleanly and its write log cannot be read (write log: {0}): writes acknowledged \
         since the members were last synced would be lost; bring the log device back, or open with \
         --force-without-log to accept that loss"
    )]
    WriteLogMissing(WriteLogProblem),
    /// The members lost are more than the RAID level `level` (its name: "raid5"; "any
    /// level" when no member is present) survives.
    #[error("too many members are missing or failed for {level}: {cause}")]
    TooManyFailures { level: &'static str, cause: FailureCause },
    /// The volume stopped writing (a member write the RAID level cannot survive, a crash
    /// simulated, a pipeline thread lost); reads may go on, writes are refused.
    #[error("the volume was shut down: {0}")]
    ShutDown(Shutdown),
    /// A replacement member failed while it was being rebuilt.
    #[error("member {member} failed during its rebuild")]
    RebuildInterrupted { member: usize },
    /// A bug: an engine thread panicked or stopped.
    #[error("internal error: {0}")]
    Internal(InternalFailure),
    #[error("the volume is closed")]
    Closed,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The nearest POSIX errno, for front ends (NBD) that speak errno.
    pub fn errno(&self) -> i32 {
        match self {
            Error::InvalidGeometry(_) | Error::InvalidRequest(_) => 22, // EINVAL
            Error::OutOfSpace | Error::ThinLimit { .. } => 28,          // ENOSPC
            Error::ReadOnly => 1,                                       // EPERM
            Error::Closed => 108,                                       // ESHUTDOWN
            _ => 5,                                                     // EIO
        }
    }
}

/// Why a volume's geometry is refused (`Error::InvalidGeometry`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GeometryProblem {
    #[error("no members given")]
    NoMembers,
    /// `raid_level` is the level's name ("raid5").
    #[error("{raid_level} needs {minimum_members} to {maximum_members} members, got {member_count}")]
    MemberCount { raid_level: &'static str, minimum_members: usize, maximum_members: u32, member_count: usize },
    #[error("raid10 needs an even number of members, got {member_count}")]
    OddRaid10MemberCount { member_count: usize },
    #[error("chunk size must be a power of two from 64 KiB to 16 MiB, got {chunk_size_bytes} bytes")]
    ChunkSize { chunk_size_bytes: u32 },
    #[error("spare fraction must be below 100 %, got {} %", *spare_ppm as f64 / 10_000.0)]
    SpareFraction { spare_ppm: u32 },
    #[error("members of {smallest_member_bytes} bytes hold fewer than 2 segments of {chunk_size_bytes}-byte chunks")]
    MembersTooSmall { smallest_member_bytes: u64, chunk_size_bytes: u32 },
    #[error("the logical size would be zero")]
    ZeroLogicalSize,
    #[error("the logical size must be a multiple of 4096 bytes from 4 KiB to 256 TiB, got {bytes} bytes")]
    LogicalSize { bytes: u64 },
    #[error("the superblocks record {recorded_bits}-bit index entries where the geometry needs {needed_bits}")]
    IndexEntryWidth { recorded_bits: u8, needed_bits: u32 },
}

/// Why a request is refused (`Error::InvalidRequest`): the caller asked for something
/// the volume cannot do as asked.
#[derive(Debug, thiserror::Error)]
pub enum RequestProblem {
    #[error("offset {offset_bytes} and length {length_bytes} must be multiples of {sector_bytes}")]
    Unaligned { offset_bytes: u64, length_bytes: u64, sector_bytes: u64 },
    #[error("range {offset_bytes}+{length_bytes} is beyond the end of the volume ({size_bytes} bytes)")]
    BeyondEnd { offset_bytes: u64, length_bytes: u64, size_bytes: u64 },
    #[error("a read of {length_bytes} bytes into a buffer of {buffer_bytes}")]
    BufferTooSmall { length_bytes: usize, buffer_bytes: usize },
    #[error("block {logical_block} is beyond the end of the volume")]
    BlockBeyondEnd { logical_block: u64 },
    #[error("volume {volume} has {recorded} members but {given} were given")]
    MemberCount { volume: uuid::Uuid, recorded: u32, given: usize },
    #[error("member {member} does not exist (the volume has {member_count})")]
    NoSuchMember { member: usize, member_count: usize },
    #[error("member {member} is not failed: it cannot be replaced")]
    NotFailed { member: usize },
    /// `path`: the replacement as the caller named it.
    #[error("{path}: the replacement is missing")]
    ReplacementMissing { path: String },
    #[error("a rebuild is running: replace the member when it has finished")]
    RebuildRunning,
    #[error(
        "a map cache of {} is more than this machine's memory ({})",
        gibibytes(*map_cache_bytes),
        gibibytes(*machine_bytes)
    )]
    MapCacheTooLarge { map_cache_bytes: u64, machine_bytes: u64 },
    /// The write log of a volume that may hold writes only there cannot change.
    #[error(
        "the volume is open, or was not closed cleanly ({holder}): open and close it (or stop the server using \
         it) before it can be {change}"
    )]
    NotClosedCleanly { holder: Box<Holder>, change: WriteLogChange },
    #[error("the volume already has a write log on {}: remove it first", paths.join(" and "))]
    WriteLogExists { paths: Vec<String> },
    #[error("a write log path must be shorter than {maximum_bytes} bytes: {path}")]
    WriteLogPathTooLong { maximum_bytes: usize, path: String },
    #[error("a write log has one device, or two for a mirror ({given} given)")]
    WriteLogDeviceCount { given: usize },
    #[error("a write log device must hold at least {minimum_bytes} bytes ({path} has {size_bytes})")]
    WriteLogDeviceTooSmall { minimum_bytes: u64, path: String, size_bytes: u64 },
    #[error(
        "a volume with deduplication mounts from its checkpoint: its summaries alone do not hold every \
         reference to a shared block"
    )]
    DeduplicationNeedsCheckpoint,
    #[error(
        "this volume was created without compression: its index cannot name compressed fragments; \
         create a volume with --compression lz4 and copy the data to it"
    )]
    CreatedWithoutCompression,
    #[error(
        "this volume was created without deduplication: its index cannot name shared blocks; \
         create a volume with --dedup on and copy the data to it"
    )]
    CreatedWithoutDeduplication,
}

/// A change of a closed volume's write log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteLogChange {
    Add,
    Remove,
}

impl std::fmt::Display for WriteLogChange {
    /// What the volume would have done to it ("… before it can be given a write log").
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            WriteLogChange::Add => "given a write log",
            WriteLogChange::Remove => "have its write log removed",
        })
    }
}

/// What is wrong with one member (`Error::Member`), said of the member: "member 2
/// (/dev/sdc): is truncated: …".
#[derive(Debug, thiserror::Error)]
pub enum MemberProblem {
    /// The member's device failed a read, write or flush.
    #[error("{0}")]
    Device(Arc<DeviceError>),
    #[error("is missing: every member must be present to create a volume")]
    MissingAtCreate,
    #[error("is the same device as member {first} ({first_path}): every member must be another device")]
    SameDevice { first: usize, first_path: String },
    /// Neither superblock copy is valid: why, per copy.
    #[error("has no valid stripelog superblock: {}", joined(copies, "; "))]
    NoValidSuperblock { copies: Vec<SuperblockCopyProblem> },
    #[error("belongs to another volume ({found}), not to {expected}")]
    AnotherVolume { found: uuid::Uuid, expected: uuid::Uuid },
    #[error(
        "is member {recorded} of this volume, given in position {given}: give the members in their original order"
    )]
    WrongPosition { recorded: u32, given: usize },
    #[error("its superblock describes a different geometry from the other members")]
    DifferentGeometry,
    #[error("is truncated: {size_bytes} bytes, the volume needs {needed_bytes} bytes on every member")]
    Truncated { size_bytes: u64, needed_bytes: u64 },
    /// A replacement smaller than the volume's members.
    #[error("is too small: {size_bytes} bytes, every member needs {needed_bytes}")]
    TooSmall { size_bytes: u64, needed_bytes: u64 },
    /// The old device of a position replaced since, written before members had an identity.
    #[error(
        "member {position} was replaced on {}: this is the old device (written before members had an identity); \
         give its replacement in its place, or `missing`",
        format_unix_seconds(*retired_unix_seconds)
    )]
    ReplacedBeforeIdentity { position: usize, retired_unix_seconds: u64 },
    /// A member the newest superblock records as retired.
    #[error(
        "member {position} was replaced on {}: this is the old device (member UUID {member_uuid}); give its \
         replacement in its place, or `missing`",
        format_unix_seconds(*retired_unix_seconds)
    )]
    Replaced { position: u32, retired_unix_seconds: u64, member_uuid: uuid::Uuid },
    #[error(
        "is not the member this volume expects in position {position}: it carries member UUID {found}, the \
         volume expects {expected} (an old copy of the member, or a device restored from a backup)"
    )]
    NotTheExpectedMember { position: usize, found: uuid::Uuid, expected: uuid::Uuid },
    /// Another present member (`by_member`, `by_path`) records this one as retired.
    #[error(
        "was replaced as member {position} on {}, says member {by_member} ({by_path}): this is the old device, \
         and the two come from copies of the volume that went separate ways; give the replacement in its place",
        format_unix_seconds(*retired_unix_seconds)
    )]
    RetiredByAnother { position: u32, retired_unix_seconds: u64, by_member: usize, by_path: String },
    /// A replacement that is a member the volume uses.
    #[error(
        "is member {position} of this volume ({path}), in use: it cannot replace member {replacing} (that would \
         overwrite it)"
    )]
    InUse { position: usize, path: String, replacing: usize },
}

/// Why one superblock copy of a member is not usable.
#[derive(Debug, thiserror::Error)]
pub enum SuperblockCopyProblem {
    #[error("copy {copy}: the member is too small to hold it")]
    TooSmall { copy: usize },
    #[error("copy {copy}: {error}")]
    Unreadable { copy: usize, error: DeviceError },
    #[error("copy {copy}: {problem}")]
    Invalid { copy: usize, problem: SuperblockProblem },
}

/// Why a block does not decode as a member superblock.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockProblem {
    #[error("not a stripelog superblock")]
    NotStripelog,
    #[error("format version {0} is not supported")]
    UnsupportedVersion(u32),
    /// Incompatible feature bits this code does not know (a newer stripelog wrote them).
    #[error(
        "uses incompatible features {0:#x} this stripelog does not know (a newer stripelog created or changed it)"
    )]
    UnknownFeatures(u64),
    #[error("checksum mismatch (damaged)")]
    BadChecksum,
    #[error("inconsistent ({0})")]
    Inconsistent(SuperblockInconsistency),
}

/// What makes a superblock with a valid checksum one that no stripelog writes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockInconsistency {
    #[error("version {version} names no incompatible feature")]
    VersionWithoutFeatures { version: u32 },
    #[error("unknown compression setting {0}")]
    UnknownCompression(u8),
    #[error("compression is set on a volume created without packed fragments")]
    CompressionWithoutPackedFragments,
    #[error("compressed shared copies (feature bit 6) on a volume without both compression and deduplication")]
    CompressedCopiesWithoutBoth,
    #[error(
        "deduplication setting {setting} on a volume {} deduplication",
        if *with_feature { "with" } else { "created without" }
    )]
    DeduplicationSetting { setting: u8, with_feature: bool },
    #[error("copy {found} found where copy {expected} belongs")]
    WrongCopy { found: u32, expected: u32 },
    #[error("unknown RAID level {0}")]
    UnknownRaidLevel(u32),
    #[error("block size {0}")]
    BlockSize(u32),
    #[error("invalid geometry: {0}")]
    Geometry(GeometryProblem),
    #[error("thin logical size {0} is not a whole number of blocks from 1 to 2^36")]
    ThinLogicalSize(u64),
    #[error("sizes do not match the geometry")]
    SizesDoNotMatch,
    #[error("{0} write log devices")]
    WriteLogDevices(usize),
    #[error("unknown holder flags {0:#x}")]
    UnknownHolderFlags(u32),
    #[error("member UUIDs beyond the member count")]
    MemberUuidsBeyondCount,
    #[error("its member UUID is not the one it lists for its own position")]
    OwnUuidMismatch,
}

/// What `create` or `replace` found on a device it would overwrite (`Error::WouldDestroy`),
/// said of the device: "member 1 (/dev/sdb) holds data (…)".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FoundContent {
    /// A member of a stripelog volume; `raid_level` is the level's name ("raid5").
    #[error(
        "holds member {member_index} of stripelog volume {volume} ({raid_level} on {member_count} members, created {})",
        format_unix_seconds(*created_unix_seconds)
    )]
    Member {
        member_index: u32,
        volume: uuid::Uuid,
        raid_level: &'static str,
        member_count: u32,
        created_unix_seconds: u64,
    },
    /// A non-zero byte at `offset_bytes` (within the first or last MiB).
    #[error("holds data (a non-zero byte at offset {offset_bytes})")]
    Data { offset_bytes: u64 },
    /// A failed member of the volume it would replace a member of.
    #[error("is member {position} of this volume, failed: its content is stale")]
    StaleMember { position: usize },
    #[error("is a retired member of this volume (member {position}, replaced on {})", format_unix_seconds(*retired_unix_seconds))]
    RetiredMember { position: u32, retired_unix_seconds: u64 },
    /// A member of the volume whose identity it no longer carries.
    #[error("holds member {member_index} of this volume from an earlier time")]
    EarlierMember { member_index: u32 },
}

/// Who opened the volume read-write last, and whether it closed it cleanly
/// (docs/data-safety.md, "The holder record"); part of every member superblock. Defined
/// here, beside the errors that report it, and re-exported by the superblock's format.
/// Shown as one line: "OPEN: stripelog serve, pid 4242 on host db1 since …" or "closed
/// cleanly at … (last opened by …)".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// A read-write open is in progress (or ended in a crash): set by every read-write
    /// open, cleared by a clean close.
    pub open: bool,
    pub process_id: u32,
    pub opened_unix_seconds: u64,
    /// The last clean close (0: never).
    pub closed_unix_seconds: u64,
    pub host: String,
    pub program: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.process_id == 0 && self.opened_unix_seconds == 0 {
            return formatter.write_str("never opened read-write by a version that records its holder");
        }
        let who = format!(
            "{}, pid {} on host {}",
            if self.program.is_empty() { "unknown program" } else { &self.program },
            self.process_id,
            if self.host.is_empty() { "(unknown)" } else { &self.host }
        );
        if self.open {
            write!(
                formatter,
                "OPEN: {who} since {} (still in use, or it stopped without closing the volume)",
                format_unix_seconds(self.opened_unix_seconds)
            )
        } else {
            write!(
                formatter,
                "closed cleanly at {} (last opened by {who} at {})",
                format_unix_seconds(self.closed_unix_seconds),
                format_unix_seconds(self.opened_unix_seconds)
            )
        }
    }
}

/// What an open volume allocates whatever its use (`Error::NotEnoughMemory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryNeeds {
    /// The index with every page resident, or its cache.
    pub index_bytes: u64,
    /// The checksum cache.
    pub checksum_bytes: u64,
    /// The per-segment tables.
    pub segment_table_bytes: u64,
}

impl MemoryNeeds {
    pub fn total_bytes(&self) -> u64 {
        self.index_bytes + self.checksum_bytes + self.segment_table_bytes
    }
}

impl std::fmt::Display for MemoryNeeds {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "index {}, checksums {}, segment tables {}",
            gibibytes(self.index_bytes),
            gibibytes(self.checksum_bytes),
            gibibytes(self.segment_table_bytes)
        )
    }
}

/// Why the volume's write log cannot be read or written (`Error::WriteLogUnavailable`,
/// `Error::WriteLogMissing`).
#[derive(Debug, thiserror::Error)]
pub enum WriteLogProblem {
    /// Devices of the log that failed, with why (every device, when none is usable).
    #[error("{}", joined(.0, "; "))]
    Devices(Vec<LogDeviceProblem>),
    /// Superblocks were found but no device's records could be read; the devices whose
    /// superblocks could not be read, with why.
    #[error("no device of the log can be read ({})", joined(.0, "; "))]
    NoDeviceReadable(Vec<LogDeviceProblem>),
    #[error("{0}")]
    Device(LogDeviceProblem),
    #[error("a record names logical block {logical_block} of a volume of {block_count}")]
    BlockBeyondVolume { logical_block: u64, block_count: u64 },
}

/// One device of the write log and why it is not used.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{path}: {failure}")]
pub struct LogDeviceProblem {
    /// The device's path as recorded or given.
    pub path: String,
    /// Shared with the device, which keeps it while the log is open.
    pub failure: Arc<LogDeviceFailure>,
}

/// Why one device of the write log is not used.
#[derive(Debug, thiserror::Error)]
pub enum LogDeviceFailure {
    #[error("missing")]
    Missing,
    /// Neither superblock copy names this volume's log: why, per copy.
    #[error("{}", joined(.0, ", "))]
    NoSuperblock(Vec<LogSuperblockCopyProblem>),
    /// A read, write or sync failed.
    #[error("{0}")]
    Device(DeviceError),
    #[error("the log's mirror thread stopped")]
    MirrorThreadStopped,
}

/// Why one superblock copy of a write log device is not usable.
#[derive(Debug, thiserror::Error)]
pub enum LogSuperblockCopyProblem {
    #[error("copy {copy}: {error}")]
    Unreadable { copy: usize, error: DeviceError },
    #[error("copy {copy}: the log of another volume, or an earlier log of this one")]
    AnotherLog { copy: usize },
    #[error("copy {copy}: {problem}")]
    Invalid { copy: usize, problem: LogSuperblockProblem },
}

/// Why a block does not decode as a write log superblock.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogSuperblockProblem {
    #[error("not a stripelog write log")]
    NotWriteLog,
    #[error("write log format version {0} is not supported")]
    UnsupportedVersion(u32),
    #[error("checksum mismatch")]
    BadChecksum,
    #[error("inconsistent: {0}")]
    Inconsistent(LogSuperblockInconsistency),
}

/// What makes a write log superblock with a valid checksum one that no stripelog writes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogSuperblockInconsistency {
    #[error("copy {found} found where copy {expected} belongs")]
    WrongCopy { found: u32, expected: u32 },
    #[error("positions do not fit the device")]
    PositionsDoNotFit,
}

/// Why the members lost are more than the RAID level survives (`Error::TooManyFailures`).
#[derive(Debug, thiserror::Error)]
pub enum FailureCause {
    #[error("no member is present")]
    NoMemberPresent,
    /// Failing `member` for `failure` would lose the volume: it is left as it was.
    #[error("member {member} ({path}) failed: {failure}")]
    MemberFailed { member: usize, path: String, failure: MemberFailure },
    /// At open: the members missing or recorded as failed (`names`, as given), and how
    /// many the level survives.
    #[error("missing {}: {}; it survives {tolerated}", names.len(), names.join(", "))]
    Missing { names: Vec<String>, tolerated: usize },
}

/// Why a member was failed: recorded in its slot, shown by `info` (its status) and the
/// server's log.
#[derive(Debug, thiserror::Error)]
pub enum MemberFailure {
    /// Missing at open, or failed without a reason recorded.
    #[error("missing")]
    Missing,
    /// A write or flush failed.
    #[error("{0}")]
    Write(Arc<DeviceError>),
    #[error("writing its superblock: {0}")]
    SuperblockWrite(DeviceError),
    #[error("{in_a_row} read errors in a row, the last: {last}")]
    ReadErrors { in_a_row: u32, last: DeviceError },
    /// Its device reports itself unhealthy (removed, shrunk), in its own words.
    #[error("{0}")]
    Unhealthy(String),
    /// The health check found no valid superblock on it.
    #[error("{0}")]
    SuperblockUnreadable(Box<Error>),
    #[error("its superblock no longer names this volume, position and member")]
    NoLongerThisMember,
    /// `replacement`: the replacement as the caller named it.
    #[error("replaced by {replacement}")]
    Replaced { replacement: String },
    /// Recorded as failed, and present without a readable superblock at open.
    #[error("excluded: recorded as failed, and {0}")]
    ExcludedUnreadable(Box<Error>),
    #[error("excluded: recorded as failed by an earlier epoch, it missed writes (replace it)")]
    ExcludedStale,
}

/// A bug: which engine thread or worker panicked or stopped (`Error::Internal`).
#[derive(Debug, thiserror::Error)]
pub enum InternalFailure {
    #[error("a member worker stopped")]
    MemberWorkerStopped,
    #[error("a flush thread panicked")]
    FlushThreadPanicked,
    #[error("a member writer panicked")]
    MemberWriterPanicked,
    #[error("a summary walker panicked")]
    SummaryWalkerPanicked,
    #[error("a durability helper panicked")]
    DurabilityHelperPanicked,
    #[error("cannot start a durability helper: {0}")]
    DurabilityHelperNotStarted(std::io::Error),
    #[error("a check worker panicked")]
    CheckWorkerPanicked,
    #[error("a maintenance worker panicked")]
    MaintenanceWorkerPanicked,
}

/// `items` shown one after the other with `separator` between them, for messages.
fn joined<T: std::fmt::Display>(items: &[T], separator: &str) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(separator)
}

/// A Unix time as `2026-11-23 19:40:02 UTC` (0: "never").
pub fn format_unix_seconds(seconds: u64) -> String {
    if seconds == 0 {
        return "never".to_string();
    }
    let days = (seconds / 86_400) as i64;
    let second_of_day = seconds % 86_400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )
}

/// Why a block could not be read from the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadFailure {
    /// Every copy reads as zeros where a summary was looked for: nothing was written there.
    #[error("never written")]
    NeverWritten,
    #[error("no copy of the block is readable and correct, and the RAID level has no parity")]
    NoGoodCopy,
    #[error("the block is damaged and the rest of its stripe row cannot rebuild it")]
    BeyondRedundancy,
    /// The packed block proved its position's checksum, yet its fragment of the logical
    /// block is missing or does not decompress to the block written (a bug, or damage
    /// that matched a checksum): never returned as data.
    #[error("its compressed fragment is not the block written ({0})")]
    BadFragment(PackedProblem),
    /// The index names a shared-block record that holds no copy (a bug, or metadata
    /// damage that matched its checksums): never returned as data.
    #[error("its shared-block record {0} holds no copy")]
    FreeSharedRecord(u64),
}

/// Which metadata mount found destroyed (docs/crash-consistency.md, "Lost metadata").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LostMetadata {
    #[error(
        "batch {batch}, recorded as durable, cannot be found (its summary failed its checksum and redundancy \
         could not rebuild it); the blocks it held would read as stale"
    )]
    DurableBatchMissing { batch: u64 },
    #[error(
        "batch {batch} in segment {segment} cannot be read (a summary block failed its checksum and redundancy \
         could not rebuild it); the blocks it held would read as stale or zeros"
    )]
    PredecessorMissing { batch: u64, segment: u64 },
    #[error(
        "segment {segment} row {row} cannot be read (nor rebuilt from its stripe row); the blocks a batch there \
         held would read as stale or zeros"
    )]
    UnreadableRow { segment: u64, row: u32 },
    #[error(
        "segment {segment} row {row} holds batch {batch} of the log, damaged; the blocks it held would read as \
         stale or zeros"
    )]
    DamagedSummary { segment: u64, row: u32, batch: u64 },
    #[error(
        "the checkpoint's {what} at data-space position {position} cannot be read (nor rebuilt from its stripe \
         row) or is not the block the checkpoint names; the part of the index it holds is lost"
    )]
    CheckpointBlock { what: &'static str, position: u64 },
}

/// What makes a log one the engine cannot have written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogInconsistency {
    #[error("two batches with sequence {sequence} in segments {first_segment} and {second_segment}")]
    DuplicateSequence { sequence: u64, first_segment: u64, second_segment: u64 },
    #[error("a sequence number or durable claim ({sequence}) beyond any real log")]
    SequenceBeyondLimit { sequence: u64 },
    #[error(
        "batch {sequence}: entry for blocks {first_block}+{block_count} is beyond the volume ({logical_blocks} blocks)"
    )]
    EntryBeyondVolume { sequence: u64, first_block: u64, block_count: u64, logical_blocks: u64 },
    #[error("batch {sequence} names compressed fragments on a volume created without compression")]
    FragmentWithoutFeature { sequence: u64 },
    #[error("batch {sequence} names shared blocks on a volume created without deduplication")]
    SharingWithoutFeature { sequence: u64 },
    #[error("batch {sequence} names a compressed shared copy on a volume created without them")]
    CompressedCopyWithoutFeature { sequence: u64 },
    #[error("batch {sequence} names shared-block record {record}, beyond the volume's or not in use")]
    BadSharedRecord { sequence: u64, record: u64 },
}

/// Why a volume stopped writing. Kept by the volume and returned to every later write.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Shutdown {
    #[error("writing batch {sequence}: {error}")]
    BatchWrite { sequence: u64, error: Arc<Error> },
    /// Flushing, releasing segments or a health check failed beyond the RAID level.
    #[error("{0}")]
    Members(Arc<Error>),
    #[error("the cleaner failed: {0}")]
    Cleaner(Arc<Error>),
    #[error("writing a checkpoint failed: {0}")]
    Checkpoint(Arc<Error>),
    #[error("abandoned (simulated crash)")]
    Abandoned,
    /// A bug: thread `thread` panicked with `message` (its backtrace is logged by the panic
    /// hook). The volume serves nothing more; the next open recovers it as after a crash.
    #[error("stopped by a bug: thread {thread} panicked: {message} (the log has its backtrace)")]
    Panicked { thread: String, message: String },
}

/// What `Shutdown::Panicked` says of a panic seen unwinding, before its message is known.
pub(crate) const UNWINDING_PANIC_MESSAGE: &str = "seen unwinding through the write lock";

impl Shutdown {
    /// The shutdown of a panic in this thread, with the panic's `payload` when it was caught
    /// (`None`: seen while unwinding, its message not at hand).
    pub(crate) fn panicked(payload: Option<&(dyn std::any::Any + Send)>) -> Shutdown {
        let message = match payload {
            Some(payload) => payload
                .downcast_ref::<&str>()
                .map(|message| message.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into()),
            None => UNWINDING_PANIC_MESSAGE.into(),
        };
        Shutdown::Panicked { thread: std::thread::current().name().unwrap_or("unnamed").to_string(), message }
    }
}

/// `bytes` as GiB with two decimals, for messages.
pub(crate) fn gibibytes(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Why a packed block or a fragment of it is not what it should be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PackedProblem {
    #[error("not a packed block (magic or version)")]
    NotPacked,
    #[error("fragment count {0} is over 16, or the table overlaps the continuation")]
    BadCount(u8),
    #[error("fragment {0} lies outside its block's free bytes or overlaps another")]
    BadExtent(usize),
    #[error("no fragment of logical block {0} in the packed block")]
    Missing(u64),
    #[error("fragment {0} spills into blocks that do not continue it")]
    BrokenContinuation(usize),
    #[error("fragment {0} does not decompress to its unit's size")]
    Undecodable(usize),
    #[error("fragment {0} decompresses to a unit whose checksum is not the recorded one")]
    WrongContent(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages are the ones the engine gave as text before its errors were typed:
    /// the CLI's users and tests match them.
    #[test]
    fn typed_causes_say_what_the_text_said() {
        let uuid = uuid::Uuid::from_bytes([0x11; 16]);
        let cases: Vec<(Error, &str)> = vec![
            (
                Error::InvalidGeometry(GeometryProblem::SpareFraction { spare_ppm: 1_000_000 }),
                "invalid geometry: spare fraction must be below 100 %, got 100 %",
            ),
            (
                Error::InvalidGeometry(GeometryProblem::MemberCount {
                    raid_level: "raid5",
                    minimum_members: 3,
                    maximum_members: 64,
                    member_count: 2,
                }),
                "invalid geometry: raid5 needs 3 to 64 members, got 2",
            ),
            (
                Error::InvalidRequest(RequestProblem::MemberCount { volume: uuid, recorded: 4, given: 3 }),
                "invalid request: volume 11111111-1111-1111-1111-111111111111 has 4 members but 3 were given",
            ),
            (
                Error::InvalidRequest(RequestProblem::WriteLogExists { paths: vec!["/a".into(), "/b".into()] }),
                "invalid request: the volume already has a write log on /a and /b: remove it first",
            ),
            (
                Error::InvalidRequest(RequestProblem::NotClosedCleanly {
                    holder: Box::default(),
                    change: WriteLogChange::Remove,
                }),
                "invalid request: the volume is open, or was not closed cleanly (never opened read-write by a version \
                 that records its holder): open and close it (or stop the server using it) before it can be have its \
                 write log removed",
            ),
            (
                Error::Member {
                    member: 1,
                    path: "m1".into(),
                    problem: MemberProblem::NoValidSuperblock {
                        copies: vec![
                            SuperblockCopyProblem::Invalid { copy: 0, problem: SuperblockProblem::NotStripelog },
                            SuperblockCopyProblem::Invalid {
                                copy: 1,
                                problem: SuperblockProblem::Inconsistent(SuperblockInconsistency::Geometry(
                                    GeometryProblem::ZeroLogicalSize,
                                )),
                            },
                        ],
                    },
                },
                "member 1 (m1): has no valid stripelog superblock: copy 0: not a stripelog superblock; copy 1: \
                 inconsistent (invalid geometry: the logical size would be zero)",
            ),
            (
                Error::Member {
                    member: 0,
                    path: "m0".into(),
                    problem: MemberProblem::Replaced {
                        position: 2,
                        retired_unix_seconds: 1_795_462_802,
                        member_uuid: uuid,
                    },
                },
                "member 0 (m0): member 2 was replaced on 2026-11-23 19:40:02 UTC: this is the old device (member UUID \
                 11111111-1111-1111-1111-111111111111); give its replacement in its place, or `missing`",
            ),
            (
                Error::WouldDestroy {
                    member: 0,
                    path: "m0".into(),
                    found: FoundContent::Member {
                        member_index: 0,
                        volume: uuid,
                        raid_level: "raid5",
                        member_count: 4,
                        created_unix_seconds: 1,
                    },
                },
                "member 0 (m0) holds member 0 of stripelog volume 11111111-1111-1111-1111-111111111111 (raid5 on 4 \
                 members, created 1970-01-01 00:00:01 UTC): refusing to overwrite it unless forced",
            ),
            (
                Error::HeldByAnotherHost {
                    volume: uuid,
                    host: "db9".into(),
                    holder: Box::new(Holder {
                        open: true,
                        process_id: 42,
                        opened_unix_seconds: 1,
                        closed_unix_seconds: 0,
                        host: "db9".into(),
                        program: "stripelog serve".into(),
                    }),
                },
                "volume 11111111-1111-1111-1111-111111111111 is open on host db9 (OPEN: stripelog serve, pid 42 on \
                 host db9 since 1970-01-01 00:00:01 UTC (still in use, or it stopped without closing the volume)) \
                 and was not closed there: it may be in use; if db9 is down and nothing else uses the members, open \
                 it with force",
            ),
            (
                Error::NotEnoughMemory {
                    needed_bytes: 3 << 30,
                    available_bytes: 1 << 30,
                    needs: MemoryNeeds { index_bytes: 2 << 30, checksum_bytes: 1 << 29, segment_table_bytes: 1 << 29 },
                },
                "the volume needs 3.00 GiB of RAM for its index and tables (index 2.00 GiB, checksums 0.50 GiB, \
                 segment tables 0.50 GiB) and only 1.00 GiB is available: use fewer or smaller members, or a machine \
                 with more memory",
            ),
            (
                Error::WriteLogMissing(WriteLogProblem::Devices(vec![LogDeviceProblem {
                    path: "/log".into(),
                    failure: Arc::new(LogDeviceFailure::Missing),
                }])),
                "the volume was not closed cleanly and its write log cannot be read (write log: /log: missing): \
                 writes acknowledged since the members were last synced would be lost; bring the log device back, \
                 or open with --force-without-log to accept that loss",
            ),
            (
                Error::WriteLogUnavailable(WriteLogProblem::NoDeviceReadable(vec![LogDeviceProblem {
                    path: "/log".into(),
                    failure: Arc::new(LogDeviceFailure::NoSuperblock(vec![
                        LogSuperblockCopyProblem::AnotherLog { copy: 0 },
                        LogSuperblockCopyProblem::Invalid {
                            copy: 1,
                            problem: LogSuperblockProblem::Inconsistent(LogSuperblockInconsistency::WrongCopy {
                                found: 0,
                                expected: 1,
                            }),
                        },
                    ])),
                }])),
                "write log: no device of the log can be read (/log: copy 0: the log of another volume, or an earlier \
                 log of this one, copy 1: inconsistent: copy 0 found where copy 1 belongs)",
            ),
            (
                Error::TooManyFailures {
                    level: "raid5",
                    cause: FailureCause::Missing { names: vec!["m1".into(), "m2".into()], tolerated: 1 },
                },
                "too many members are missing or failed for raid5: missing 2: m1, m2; it survives 1",
            ),
            (
                Error::TooManyFailures {
                    level: "raid0",
                    cause: FailureCause::MemberFailed {
                        member: 0,
                        path: "m0".into(),
                        failure: MemberFailure::ReadErrors { in_a_row: 8, last: DeviceError::Gone },
                    },
                },
                "too many members are missing or failed for raid0: member 0 (m0) failed: 8 read errors in a row, the \
                 last: device is gone (crashed or removed)",
            ),
            (Error::Internal(InternalFailure::FlushThreadPanicked), "internal error: a flush thread panicked"),
        ];
        for (error, expected) in cases {
            assert_eq!(error.to_string(), expected, "{error:?}");
        }
    }

    #[test]
    fn errno_follows_the_class() {
        assert_eq!(Error::InvalidGeometry(GeometryProblem::NoMembers).errno(), 22);
        assert_eq!(Error::InvalidRequest(RequestProblem::RebuildRunning).errno(), 22);
        assert_eq!(Error::Internal(InternalFailure::CheckWorkerPanicked).errno(), 5);
        assert_eq!(Error::WriteLogUnavailable(WriteLogProblem::Devices(Vec::new())).errno(), 5);
    }
}
