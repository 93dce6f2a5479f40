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
struct InFlight {
    batch: std::sync::Arc<batch::SealedBatch>,
    written: bool,
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

/// The log's position: the clients' open batches, the streams' current and reserved
/// segments, and the batches sealed, written and durable. Kept under the volume's state
/// lock; its fields change only through these methods, which assert the log's order:
/// batches are sealed in sequence order, the written frontier follows the sealed batches
/// in order (never half a pair), and the durable frontier never passes a batch that is
/// not written.
pub(crate) struct LogState {
    /// The clients' open batch; it always holds sequence `next_sequence - 1`. The cleaner
    /// and the checkpoint swap their own batch in while they fill it.
    open: Option<batch::OpenBatch>,
    /// The clients' cold batch, in [`COLD_CLIENT_STREAM`]: it holds entries only while
    /// `open` does, carries `open`'s sequence until both are sealed as a pair, and then
    /// takes the next one.
    cold: Option<batch::OpenBatch>,
    current_segments: [Option<CurrentSegment>; STREAM_COUNT],
    /// Per stream: the free segment it takes when its current one is full, reserved when
    /// that one was opened and named in each of its summaries (`None`: the stream has not
    /// opened a segment since the volume was opened).
    reserved_segments: [Option<u64>; STREAM_COUNT],
    next_sequence: u64,
    last_sealed_sequence: u64,
    /// The segment of the last sealed batch (each summary names its predecessor's).
    last_sealed_segment: u64,
    written_through_sequence: u64,
    durable_through_sequence: u64,
    /// A thread is syncing the members (group commit: one round at a time).
    sync_in_progress: bool,
    in_flight: std::collections::VecDeque<InFlight>,
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

    /// The open batch: the clients', or a side batch swapped in for the time it is filled.
    pub(crate) fn open(&self) -> Option<&batch::OpenBatch> {
        self.open.as_ref()
    }

    pub(crate) fn open_mut(&mut self) -> Option<&mut batch::OpenBatch> {
        self.open.as_mut()
    }

    /// The open batch, which the caller knows is there (it opened it under this lock).
    pub(crate) fn open_batch(&mut self) -> &mut batch::OpenBatch {
        self.open.as_mut().expect("an open batch")
    }

    /// Put `batch` in the place of the open batch, giving back what was there.
    pub(crate) fn replace_open(&mut self, batch: Option<batch::OpenBatch>) -> Option<batch::OpenBatch> {
        std::mem::replace(&mut self.open, batch)
    }

    pub(crate) fn cold(&self) -> Option<&batch::OpenBatch> {
        self.cold.as_ref()
    }

    /// The cold batch, when it holds entries.
    pub(crate) fn cold_with_entries(&self) -> Option<&batch::OpenBatch> {
        self.cold.as_ref().filter(|cold| !cold.is_empty())
    }

    pub(crate) fn replace_cold(&mut self, batch: Option<batch::OpenBatch>) -> Option<batch::OpenBatch> {
        std::mem::replace(&mut self.cold, batch)
    }

    /// The cold batch takes the open batch's place for one block (and back).
    pub(crate) fn swap_open_and_cold(&mut self) {
        std::mem::swap(&mut self.open, &mut self.cold);
    }

    pub(crate) fn current(&self, stream: usize) -> Option<&CurrentSegment> {
        self.current_segments[stream].as_ref()
    }

    pub(crate) fn current_mut(&mut self, stream: usize) -> Option<&mut CurrentSegment> {
        self.current_segments[stream].as_mut()
    }

    /// The streams whose current segment is `segment`.
    pub(crate) fn streams_in(&self, segment: u64) -> impl Iterator<Item = usize> + '_ {
        (0..STREAM_COUNT).filter(move |&stream| self.current(stream).is_some_and(|current| current.segment == segment))
    }

    /// `stream` goes on in `current` (it had no current segment).
    pub(crate) fn start_current(&mut self, stream: usize, current: CurrentSegment) {
        assert!(self.current_segments[stream].is_none(), "stream {stream} already has a current segment");
        assert!(
            self.current_segments.iter().flatten().all(|other| other.segment != current.segment),
            "segment {} is current in two streams",
            current.segment
        );
        self.current_segments[stream] = Some(current);
    }

    /// `stream` stops writing into its current segment.
    pub(crate) fn take_current(&mut self, stream: usize) -> Option<CurrentSegment> {
        self.current_segments[stream].take()
    }

    pub(crate) fn reserved(&self, stream: usize) -> Option<u64> {
        self.reserved_segments[stream]
    }

    pub(crate) fn take_reserved(&mut self, stream: usize) -> Option<u64> {
        self.reserved_segments[stream].take()
    }

    pub(crate) fn set_reserved(&mut self, stream: usize, segment: u64) {
        assert!(self.reserved_segments[stream].is_none(), "stream {stream} already has a reserved successor");
        self.reserved_segments[stream] = Some(segment);
    }

    /// Every stream has a reserved successor (a checkpoint can name where each goes on).
    pub(crate) fn every_stream_reserved(&self) -> bool {
        self.reserved_segments.iter().all(Option::is_some)
    }

    /// The sequence the next batch opened takes.
    pub(crate) fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Give out the next sequence.
    pub(crate) fn take_sequence(&mut self) -> u64 {
        self.next_sequence += 1;
        self.next_sequence - 1
    }

    /// The last sequence given out was not used (its batch was dropped empty).
    pub(crate) fn give_back_sequence(&mut self) {
        assert!(self.next_sequence - 1 > self.last_sealed_sequence, "a sealed batch's sequence is never given back");
        self.next_sequence -= 1;
    }

    /// The batch a write accepted now goes into, or would: the open batch's, else the next.
    pub(crate) fn accepting_sequence(&self) -> u64 {
        self.open.as_ref().map_or(self.next_sequence, |open| open.sequence)
    }

    pub(crate) fn last_sealed_sequence(&self) -> u64 {
        self.last_sealed_sequence
    }

    pub(crate) fn last_sealed_segment(&self) -> u64 {
        self.last_sealed_segment
    }

    /// `batch` was sealed: it is the log's newest and goes in flight.
    pub(crate) fn sealed(&mut self, batch: std::sync::Arc<batch::SealedBatch>) {
        let header = &batch.header;
        assert!(
            header.sequence > self.last_sealed_sequence,
            "batch {} sealed after batch {}: sequences seal in order",
            header.sequence,
            self.last_sealed_sequence
        );
        assert!(header.sequence < self.next_sequence, "batch {} was never given out", header.sequence);
        self.last_sealed_sequence = header.sequence;
        self.last_sealed_segment = header.segment;
        self.in_flight.push_back(InFlight { batch, written: false });
    }

    /// Batch `sequence` is written on the members: the written frontier moves over the
    /// written front of the batches in flight (never half a pair), handing each to
    /// `retired`.
    pub(crate) fn written(&mut self, sequence: u64, retired: impl FnMut(&batch::SealedBatch)) {
        let mut retired = retired;
        let entry = self.in_flight.iter_mut().find(|entry| entry.batch.header.sequence == sequence);
        assert!(entry.is_some(), "batch {sequence} is written while it is in flight");
        if let Some(entry) = entry {
            assert!(!entry.written, "batch {sequence} is written once");
            entry.written = true;
        }
        let through = retire_written_front(
            &mut self.in_flight,
            |entry| entry.written,
            |entry| (entry.batch.header.sequence, entry.batch.header.paired_with_next),
            |entry| retired(&entry.batch),
        );
        if let Some(through) = through {
            assert!(through > self.written_through_sequence, "the written frontier only moves forward");
            assert!(through <= self.last_sealed_sequence, "batch {through} is written before it was sealed");
            self.written_through_sequence = through;
        }
    }

    pub(crate) fn written_through(&self) -> u64 {
        self.written_through_sequence
    }

    pub(crate) fn durable_through(&self) -> u64 {
        self.durable_through_sequence
    }

    /// Batches sealed and not yet written.
    pub(crate) fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    /// Start a sync round (group commit: one at a time): the last batch sealed and the
    /// written frontier as it starts; `None` when a round is under way.
    pub(crate) fn begin_sync_round(&mut self) -> Option<(u64, u64)> {
        if self.sync_in_progress {
            return None;
        }
        self.sync_in_progress = true;
        Some((self.last_sealed_sequence, self.written_through_sequence))
    }

    /// The sync round ended; when it succeeded, every batch through `durable` is durable.
    /// The durable frontier never passes a batch that is not written.
    pub(crate) fn end_sync_round(&mut self, durable: Option<u64>) {
        assert!(self.sync_in_progress, "a sync round ends only after it began");
        self.sync_in_progress = false;
        if let Some(durable) = durable {
            assert!(
                durable <= self.written_through_sequence,
                "the durable frontier ({durable}) passes the written one ({})",
                self.written_through_sequence
            );
            self.durable_through_sequence = self.durable_through_sequence.max(durable);
        }
    }

    /// Copy the block at `location` when it is still only in memory (an open batch, or a
    /// sealed batch not yet written).
    pub(crate) fn copy_from_memory(&self, location: crate::layout::geometry::BlockLocation, out: &mut [u8]) -> bool {
        for open in [&self.open, &self.cold].into_iter().flatten() {
            if open.segment == location.segment {
                if let Some(index) = open.index_of(location.row, location.column) {
                    out.copy_from_slice(open.block(index));
                    return true;
                }
            }
        }
        for entry in &self.in_flight {
            if entry.batch.header.segment == location.segment {
                if let Some(block) = entry.batch.block(location.row, location.column) {
                    out.copy_from_slice(block);
                    return true;
                }
            }
        }
        false
    }

    /// The log's order, between operations (no side batch swapped in): the frontiers in
    /// order (durable ≤ written ≤ sealed < next), the batches in flight in sequence order
    /// after the written frontier, the clients' open batch holding the last sequence given
    /// out, a cold batch beside an open batch that holds entries, and a stream's open batch
    /// in its current segment.
    pub(crate) fn check_invariants(&self) {
        assert!(self.durable_through_sequence <= self.written_through_sequence, "durable ≤ written");
        assert!(self.written_through_sequence <= self.last_sealed_sequence, "written ≤ sealed");
        assert!(self.last_sealed_sequence < self.next_sequence, "sealed < next");
        let mut previous = self.written_through_sequence;
        for entry in &self.in_flight {
            let sequence = entry.batch.header.sequence;
            assert!(sequence > previous, "batch {sequence} in flight out of order");
            previous = sequence;
        }
        assert!(previous <= self.last_sealed_sequence, "a batch in flight after the last sealed");
        if let Some(open) = &self.open {
            assert!(!open.relocation && !open.metadata, "a side batch left in the clients' place");
            assert_eq!(open.sequence, self.next_sequence - 1, "the clients' open batch holds the last sequence");
            let current = self.current(open.stream).expect("the open batch's stream has a current segment");
            assert_eq!(current.segment, open.segment, "the open batch is in its stream's current segment");
        }
        if let Some(cold) = self.cold_with_entries() {
            assert!(self.open.as_ref().is_some_and(|open| !open.is_empty()), "a cold batch beside entries only");
            assert_eq!(self.current(cold.stream).map(|current| current.segment), Some(cold.segment));
        }
        for (stream, current) in self.current_segments.iter().enumerate() {
            if let Some(current) = current {
                assert_ne!(self.reserved_segments[stream], Some(current.segment), "stream {stream} reserves itself");
            }
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
