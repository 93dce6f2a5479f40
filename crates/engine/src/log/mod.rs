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
pub(crate) const STREAM_COUNT: usize = 4;
