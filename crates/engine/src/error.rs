//! The engine's error type. Lower-level errors are wrapped as variants; every variant
//! says what failed and, where it applies, which member.

use std::sync::Arc;
use stripelog_blockdev::DeviceError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid geometry: {0}")]
    InvalidGeometry(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("member {member} ({path}): {reason}")]
    Member { member: usize, path: String, reason: String },
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
    WouldDestroy { member: usize, path: String, found: String },
    /// The volume is recorded as open read-write on another host and was not closed there.
    #[error(
        "volume {volume} is open on host {host} ({holder}) and was not closed there: it may be in use; if {host} \
         is down and nothing else uses the members, open it with force"
    )]
    HeldByAnotherHost { volume: String, host: String, holder: String },
    /// The volume's index and tables would not fit the memory allowed: refused before
    /// any of it is allocated.
    #[error(
        "the volume needs {} of RAM for its index and tables ({detail}) and only {} is available: \
         use fewer or smaller members, or a machine with more memory",
        gibibytes(*needed_bytes),
        gibibytes(*available_bytes)
    )]
    NotEnoughMemory { needed_bytes: u64, available_bytes: u64, detail: String },
    /// A volume written by an older format: opened read-only, or upgraded on request.
    #[error(
        "volume {volume} has on-disk format version {version}; this stripelog writes version {current}, which \
         older releases cannot read: run `stripelog upgrade` on its members to convert it (one way), or open it \
         read-only"
    )]
    FormatUpgradeNeeded { volume: String, version: u32, current: u32 },
    #[error("the volume is read-only")]
    ReadOnly,
    /// The volume's write log cannot be read or written.
    #[error("write log: {0}")]
    WriteLogUnavailable(String),
    /// The volume was not closed cleanly and its write log cannot be read: the writes
    /// acknowledged since the members were last synced may only be there.
    #[error(
        "the volume was not closed cleanly and its write log cannot be read ({0}): writes acknowledged since the \
         members were last synced would be lost; bring the log device back, or open with --force-without-log to \
         accept that loss"
    )]
    WriteLogMissing(String),
    #[error("too many members are missing or failed for {level}: {reason}")]
    TooManyFailures { level: String, reason: String },
    /// The volume stopped writing (a member write the RAID level cannot survive, a crash
    /// simulated, a pipeline thread lost); reads may go on, writes are refused.
    #[error("the volume was shut down: {0}")]
    ShutDown(Shutdown),
    /// A replacement member failed while it was being rebuilt.
    #[error("member {member} failed during its rebuild")]
    RebuildInterrupted { member: usize },
    /// A bug: an engine thread panicked.
    #[error("internal error: {0}")]
    Internal(&'static str),
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
