//! Layer 3: the log. Batches laid out as on the members (open, sealed, the buffer pools
//! that bound them), the write streams, and the pipeline that writes sealed batches as
//! stripes (stripe writer, one worker per member). Knows nothing of what a logical block
//! maps to.

pub(crate) mod batch;
pub(crate) mod pipeline;

/// Who performs member I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// A stripe writer thread and one worker per member (production).
    Threaded,
    /// The calling thread, synchronously, in a deterministic order (simulation).
    Inline,
}
/// Open segments (streams): client writes; and relocated blocks in three: short-lived
/// (their previous version lived briefly), middle, and old (unchanged for long) — so that
/// blocks that die together are written together and long-unchanged data collects in
/// full, cold segments (docs/garbage-collection.md).
pub(crate) const HOST_STREAM: usize = 0;
pub(crate) const RELOCATION_STREAMS: [usize; 3] = [1, 2, 3];
/// Client writes predicted to live long (volumes with feature bit 5) go into the old
/// relocation stream, in a batch of their own sealed with the clients' batch as a pair
/// (docs/crash-consistency.md, "Client writes in two streams").
pub(crate) const COLD_CLIENT_STREAM: usize = RELOCATION_STREAMS[2];
/// Checkpoint blocks (index, directory and segment table pages, roots): never cleaning
/// victims, emptied by later checkpoints instead (docs/index-and-checkpoints.md).
pub(crate) const METADATA_STREAM: usize = 4;
pub(crate) const STREAM_COUNT: usize = 5;

/// A stream's segment receiving batches.
pub(crate) struct CurrentSegment {
    pub(crate) segment: u64,
    pub(crate) next_row: u32,
    pub(crate) open_sequence: u64,
}

/// A sealed batch on its way to the members.
pub(crate) struct InFlight {
    pub(crate) batch: std::sync::Arc<batch::SealedBatch>,
    pub(crate) written: bool,
}

/// The log's position: batches open, sealed, written and durable.
pub(crate) struct LogState {
    /// The clients' open batch; it always holds sequence `next_sequence - 1`. The cleaner
    /// swaps its own batch in while it fills it.
    pub(crate) open: Option<batch::OpenBatch>,
    /// The clients' cold batch, in [`COLD_CLIENT_STREAM`]: it holds entries only while
    /// `open` does, carries `open`'s sequence until both are sealed as a pair, and then
    /// takes the next one.
    pub(crate) cold: Option<batch::OpenBatch>,
    pub(crate) current_segments: [Option<CurrentSegment>; STREAM_COUNT],
    /// Per stream: the free segment it takes when its current one is full, reserved when
    /// that one was opened and named in each of its summaries (`None`: the stream has not
    /// opened a segment since the volume was opened).
    pub(crate) reserved_segments: [Option<u64>; STREAM_COUNT],
    pub(crate) next_sequence: u64,
    pub(crate) last_sealed_sequence: u64,
    /// The segment of the last sealed batch (each summary names its predecessor's).
    pub(crate) last_sealed_segment: u64,
    pub(crate) written_through_sequence: u64,
    pub(crate) durable_through_sequence: u64,
    /// A thread is syncing the members (group commit: one round at a time).
    pub(crate) sync_in_progress: bool,
    pub(crate) in_flight: std::collections::VecDeque<InFlight>,
}

impl LogState {
    /// The log as recovered: batch `last_sequence` (in `last_segment`) is the last one,
    /// and durable.
    pub(crate) fn recovered(
        last_sequence: u64,
        last_segment: u64,
        reserved_segments: [Option<u64>; STREAM_COUNT],
    ) -> LogState {
        LogState {
            open: None,
            cold: None,
            current_segments: Default::default(),
            reserved_segments,
            next_sequence: last_sequence + 1,
            last_sealed_sequence: last_sequence,
            last_sealed_segment: last_segment,
            written_through_sequence: last_sequence,
            durable_through_sequence: last_sequence,
            sync_in_progress: false,
            in_flight: std::collections::VecDeque::new(),
        }
    }
}
