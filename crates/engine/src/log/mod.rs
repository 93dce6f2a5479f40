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
    /// A clients' segment that trim and zero records opened from the room kept for them
    /// (`space::RECORDS_ROOM_SEGMENTS`): client data goes into it only once a free segment
    /// above the cleaner's reserve is back (docs/garbage-collection.md, "A physically full
    /// volume").
    pub(crate) records_room: bool,
}

/// A sealed batch on its way to the members.
pub(crate) struct InFlight {
    pub(crate) batch: std::sync::Arc<batch::SealedBatch>,
    pub(crate) written: bool,
}

/// Take the written batches off the front of the in-flight queue (`written` tells which
/// are), in sequence order, handing each to `retired`; returns the new written-through
/// sequence when it moved: the last of them that does not begin a pair (`sequence_and_pair`
/// gives a batch's sequence and whether it is paired with the next). Never half a pair:
/// nothing durable may name a pair's first batch alone (docs/crash-consistency.md,
/// "Client writes in two streams").
pub(crate) fn retire_written_front<T>(
    in_flight: &mut std::collections::VecDeque<T>,
    written: impl Fn(&T) -> bool,
    sequence_and_pair: impl Fn(&T) -> (u64, bool),
    mut retired: impl FnMut(T),
) -> Option<u64> {
    let mut written_through = None;
    while in_flight.front().is_some_and(&written) {
        let entry = in_flight.pop_front().expect("front exists");
        let (sequence, paired_with_next) = sequence_and_pair(&entry);
        if !paired_with_next {
            written_through = Some(sequence);
        }
        retired(entry);
    }
    written_through
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

#[cfg(test)]
mod tests {
    use super::retire_written_front;
    use std::collections::VecDeque;

    /// (sequence, paired with the next, written)
    fn retire(queue: &mut VecDeque<(u64, bool, bool)>) -> (Option<u64>, Vec<u64>) {
        let mut retired = Vec::new();
        let through =
            retire_written_front(queue, |entry| entry.2, |entry| (entry.0, entry.1), |entry| retired.push(entry.0));
        (through, retired)
    }

    #[test]
    fn written_through_stops_before_a_pair_until_both_its_batches_are_written() {
        // 5 written, 6 (a pair's first batch) written, 7 (its second) not yet.
        let mut queue = VecDeque::from([(5, false, true), (6, true, true), (7, false, false), (8, false, true)]);
        assert_eq!(retire(&mut queue), (Some(5), vec![5, 6]));
        // 8 is written, but 7 is in front of it: nothing moves.
        assert_eq!(retire(&mut queue), (None, vec![]));
        queue[0].2 = true;
        assert_eq!(retire(&mut queue), (Some(8), vec![7, 8]));
        // A queue that ends on a pair's first batch, written, with its second not yet queued.
        let mut queue = VecDeque::from([(9, false, true), (10, true, true)]);
        assert_eq!(retire(&mut queue), (Some(9), vec![9, 10]));
        queue.push_back((11, false, true));
        assert_eq!(retire(&mut queue), (Some(11), vec![11]));
        // Only a pair's first batch: the frontier does not move.
        let mut queue = VecDeque::from([(12, true, true)]);
        assert_eq!(retire(&mut queue), (None, vec![12]));
    }
}
