//! The threaded write pipeline: one stripe writer computes parity and fans a sealed
//! batch out to one worker per member; each worker drains its queue and submits what it
//! has as one batch (io_uring), and the last worker to finish a stripe completes it.
//! A sync round travels the same queues: each member's worker syncs its device after the
//! writes queued before the round, so a round costs one message per member and no thread.

use crate::array::members::Members;
use crate::layout::geometry::Geometry;
use crate::log::batch::BufferPool;
use crate::log::batch::{PooledBuffers, SealedBatch};
use crate::queue::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use stripelog_blockdev::IoRequest;

/// A stripe being written: the batch, its parity, and how many members still write.
pub(crate) struct StripeJob {
    batch: Arc<SealedBatch>,
    parity: PooledBuffers,
    members_remaining: AtomicUsize,
    first_error: Mutex<Option<crate::error::Error>>,
}

/// What the stripe writer receives.
pub(crate) enum PipelineJob {
    Stripe(Arc<SealedBatch>),
    Sync(Arc<SyncRound>),
}

/// What one member's worker receives.
pub(crate) enum MemberJob {
    Stripe(Arc<StripeJob>),
    Sync(Arc<SyncRound>),
}

pub(crate) type MemberQueue = Sender<MemberJob>;

/// One sync of every member, ordered after every batch queued before it. Members are
/// synced in groups (`Members::flush_groups`: files on one filesystem share one flush):
/// each member's worker arrives once it has written what was queued before the round,
/// and the last of a group to arrive syncs the group. The round completes when every
/// group has synced.
pub(crate) struct SyncRound {
    /// Per member: its group (`None`: nothing to sync, e.g. a failed member).
    group_of: Vec<Option<usize>>,
    /// Every batch up to this sequence went to the members' queues before the round (set
    /// by the stripe writer when it takes the round): the batches the round covers. A
    /// batch sealed before the round was sent but queued behind it is not covered, even
    /// if it is written by the time the round ends.
    covered_through: AtomicU64,
    progress: Mutex<RoundProgress>,
    finished: Condvar,
}

struct RoundProgress {
    groups: Vec<Vec<usize>>,
    /// Per group: members that have not arrived yet.
    waiting: Vec<usize>,
    members_remaining: usize,
    first_error: Option<crate::error::Error>,
}

impl SyncRound {
    pub(crate) fn new(member_count: usize, groups: Vec<Vec<usize>>) -> Arc<SyncRound> {
        let mut group_of = vec![None; member_count];
        for (index, group) in groups.iter().enumerate() {
            for &member in group {
                group_of[member] = Some(index);
            }
        }
        let waiting = groups.iter().map(Vec::len).collect();
        Arc::new(SyncRound {
            group_of,
            covered_through: AtomicU64::new(0),
            progress: Mutex::new(RoundProgress { groups, waiting, members_remaining: member_count, first_error: None }),
            finished: Condvar::new(),
        })
    }

    /// `member` has written everything queued before the round: the group to sync when
    /// it is the last of its group to arrive.
    fn arrive(&self, member: usize) -> Option<Vec<usize>> {
        let mut progress = self.progress.lock();
        let Some(group) = self.group_of.get(member).copied().flatten() else {
            Self::count_done(&mut progress, 1, Ok(()), &self.finished);
            return None;
        };
        assert!(progress.waiting[group] > 0, "member {member} arrives once per round");
        progress.waiting[group] -= 1;
        (progress.waiting[group] == 0).then(|| progress.groups[group].clone())
    }

    fn group_synced(&self, group: &[usize], result: crate::error::Result<()>) {
        Self::count_done(&mut self.progress.lock(), group.len(), result, &self.finished);
    }

    /// A member that will never arrive (its worker is gone): the round fails if it had
    /// something to sync, and it counts as arrived.
    fn member_lost(&self, member: usize) {
        if self.group_of.get(member).copied().flatten().is_some() {
            self.progress
                .lock()
                .first_error
                .get_or_insert(crate::error::Error::Internal(crate::error::InternalFailure::MemberWorkerStopped));
        }
        if let Some(group) = self.arrive(member) {
            // The last of its group: the others wait for nobody to sync them.
            self.group_synced(&group, Ok(()));
        }
    }

    fn count_done(progress: &mut RoundProgress, members: usize, result: crate::error::Result<()>, finished: &Condvar) {
        if let Err(error) = result {
            progress.first_error.get_or_insert(error);
        }
        assert!(members <= progress.members_remaining, "a round's members are done once each");
        progress.members_remaining -= members;
        if progress.members_remaining == 0 {
            finished.notify_all();
        }
    }

    /// The batches the round covers: every one up to this sequence (valid once it is done).
    pub(crate) fn covered_through(&self) -> u64 {
        self.covered_through.load(Ordering::Acquire)
    }

    /// Wait until every member has synced; the first failure, if any (for the one caller
    /// that sent the round).
    pub(crate) fn wait(&self) -> crate::error::Result<()> {
        let mut progress = self.progress.lock();
        while progress.members_remaining > 0 {
            self.finished.wait(&mut progress);
        }
        match progress.first_error.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// What the pipeline writes for and reports to: the layer that owns the volume's state
/// (`io::Core`) implements it, so the log knows nothing above it.
pub(crate) trait BatchSink: Send + Sync + 'static {
    fn geometry(&self) -> &Geometry;
    fn members(&self) -> &Members;
    /// Parity sets: one per batch in the pipeline.
    fn parity_pool(&self) -> &Arc<BufferPool>;
    /// Batches each member's queue holds (how far a slow member may lag).
    fn write_queue_batches(&self) -> usize;
    /// Every member finished its part of `batch`; `error`: the first failure.
    fn batch_written(&self, batch: &SealedBatch, error: Option<crate::error::Error>);
    /// Stop the volume: a pipeline thread cannot go on.
    fn fail(&self, reason: crate::error::Shutdown);
}

/// Start one worker per member. A member's queue holds as many jobs as the write queue
/// has batches (every job holds one of its parity sets), so the stripe writer never waits
/// on a queue: a slow member may lag that far behind the others, and then the stripe
/// writer waits for a parity set.
pub(crate) fn start_member_workers<S: BatchSink>(shared: &Arc<S>) -> (Vec<MemberQueue>, Vec<JoinHandle<()>>) {
    let mut senders = Vec::new();
    let mut threads = Vec::new();
    // Every member has a worker: a failed one skips its jobs, and a replacement attached
    // later is written by it from then on.
    for member in 0..shared.geometry().member_count {
        let (sender, receiver) = crate::queue::bounded(shared.write_queue_batches());
        senders.push(sender);
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("stripelog-member-{member}"))
                .spawn(move || {
                    let guard = shared.clone();
                    fail_on_panic(&*guard, || member_worker(shared, member, receiver))
                })
                .expect("spawn a member worker thread"),
        );
    }
    (senders, threads)
}

/// Run a pipeline thread's body; a panic in it (a bug, or a device implementation's)
/// fails the volume instead of leaving flushes waiting for batches that never complete.
pub(crate) fn fail_on_panic<S: BatchSink + ?Sized>(shared: &S, body: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        shared.fail(crate::error::Shutdown::panicked(Some(payload.as_ref())));
    }
}

/// The batches the stripe writer has sent to the members' queues, for the sync rounds it
/// takes: every one through `through`, and those in `ahead` (with whether each is the
/// first of a pair). Batches are dispatched outside the state lock, so one sealed later
/// may come first; `ahead` holds at most the batches in the pipeline, each of which holds
/// one of the data pool's sets.
struct TakenBatches {
    through: u64,
    through_starts_a_pair: bool,
    ahead: std::collections::BTreeMap<u64, bool>,
}

impl TakenBatches {
    fn new(last_sequence: u64) -> TakenBatches {
        TakenBatches { through: last_sequence, through_starts_a_pair: false, ahead: Default::default() }
    }

    fn take(&mut self, sequence: u64, starts_a_pair: bool) {
        if sequence == self.through + 1 {
            (self.through, self.through_starts_a_pair) = (sequence, starts_a_pair);
            while let Some(starts_a_pair) = self.ahead.remove(&(self.through + 1)) {
                (self.through, self.through_starts_a_pair) = (self.through + 1, starts_a_pair);
            }
        } else if sequence > self.through {
            let seen = self.ahead.insert(sequence, starts_a_pair);
            assert!(seen.is_none(), "batch {sequence} is taken once");
        }
    }

    /// What a sync round taken now covers: never half a pair — a round taken between a
    /// pair's two batches covers neither (docs/crash-consistency.md, "Client writes in two
    /// streams", rule 2).
    fn covered_through(&self) -> u64 {
        self.through - u64::from(self.through_starts_a_pair)
    }
}

/// `last_sequence`: the last batch sealed before the pipeline started (all of them on the
/// members).
pub(crate) fn stripe_writer<S: BatchSink>(
    shared: Arc<S>,
    jobs: Receiver<PipelineJob>,
    members: Vec<MemberQueue>,
    last_sequence: u64,
) {
    let mut taken = TakenBatches::new(last_sequence);
    while let Ok(job) = jobs.recv() {
        let batch = match job {
            PipelineJob::Stripe(batch) => {
                taken.take(batch.header.sequence, batch.header.paired_with_next);
                batch
            }
            PipelineJob::Sync(round) => {
                round.covered_through.store(taken.covered_through(), Ordering::Release);
                for (member, queue) in members.iter().enumerate() {
                    if queue.send(MemberJob::Sync(round.clone())).is_err() {
                        round.member_lost(member);
                    }
                }
                continue;
            }
        };
        let mut parity = shared.parity_pool().take();
        batch.compute_parity(shared.geometry(), &mut parity);
        let job = Arc::new(StripeJob {
            batch,
            parity,
            members_remaining: AtomicUsize::new(members.len()),
            first_error: Mutex::new(None),
        });
        for queue in &members {
            if queue.send(MemberJob::Stripe(job.clone())).is_err() {
                finish_one(
                    &*shared,
                    &job,
                    Some(crate::error::Error::Internal(crate::error::InternalFailure::MemberWorkerStopped)),
                );
            }
        }
    }
}

fn member_worker<S: BatchSink>(shared: Arc<S>, member: usize, jobs: Receiver<MemberJob>) {
    let mut next = None;
    loop {
        let job = match next.take() {
            Some(job) => job,
            None => match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let first = match job {
            MemberJob::Stripe(first) => first,
            MemberJob::Sync(round) => {
                if let Some(group) = round.arrive(member) {
                    round.group_synced(&group, shared.members().flush_group(&group));
                }
                continue;
            }
        };
        // Stripes queued behind the first go in the same submission, up to a sync round
        // (which must follow the writes queued before it).
        let mut taken = vec![first];
        while taken.len() < MEMBER_SUBMIT_BATCHES_MAXIMUM {
            match jobs.try_recv() {
                Ok(MemberJob::Stripe(job)) => taken.push(job),
                Ok(sync) => {
                    next = Some(sync);
                    break;
                }
                Err(_) => break,
            }
        }
        write_stripes(&*shared, member, &taken);
    }
}

fn write_stripes<S: BatchSink>(shared: &S, member: usize, taken: &[Arc<StripeJob>]) {
    // Looked up per batch: the member may fail, or be replaced, between batches.
    let Some(device) = shared.members().writable(member) else {
        taken.iter().for_each(|job| finish_one(shared, job, None));
        return;
    };
    let results = {
        let mut requests: Vec<IoRequest> = taken
            .iter()
            .map(|job| {
                let (buffer, offset_bytes) = job.batch.member_part(shared.geometry(), &job.parity, member);
                IoRequest::Write { buffer, offset_bytes }
            })
            .collect();
        device.submit_batch(&mut requests)
    };
    for (job, result) in taken.iter().zip(results) {
        // A failed write fails the member (recorded durably before the batch counts as
        // written on the others); only a loss beyond the RAID level is the batch's error.
        let error = result.err().and_then(|error| shared.members().write_failed(member, error).err());
        finish_one(shared, job, error);
    }
}

fn finish_one<S: BatchSink + ?Sized>(shared: &S, job: &StripeJob, error: Option<crate::error::Error>) {
    if let Some(error) = error {
        job.first_error.lock().get_or_insert(error);
    }
    let remaining = job.members_remaining.fetch_sub(1, Ordering::AcqRel);
    assert!(remaining > 0, "batch {}: each member finishes its part once", job.batch.header.sequence);
    if remaining == 1 {
        let error = job.first_error.lock().take();
        shared.batch_written(&job.batch, error);
    }
}
/// A member worker writes at most this many queued batches in one submission.
pub(crate) const MEMBER_SUBMIT_BATCHES_MAXIMUM: usize = 8;

#[cfg(test)]
mod tests {
    use super::TakenBatches;

    #[test]
    fn a_round_covers_the_batches_taken_before_it_and_never_half_a_pair() {
        let mut taken = TakenBatches::new(10);
        assert_eq!(taken.covered_through(), 10);
        // 12 is dispatched before 11: nothing past 10 is covered until 11 comes.
        taken.take(12, false);
        assert_eq!(taken.covered_through(), 10);
        taken.take(11, false);
        assert_eq!(taken.covered_through(), 12);
        // 13 starts a pair: a round taken before 14 covers neither.
        taken.take(13, true);
        assert_eq!(taken.covered_through(), 12);
        taken.take(14, false);
        assert_eq!(taken.covered_through(), 14);
        // The pair's first batch arriving last, behind its second.
        taken.take(16, false);
        taken.take(15, true);
        assert_eq!(taken.covered_through(), 16);
        // Out of order with a pair ending the run taken so far.
        taken.take(18, true);
        taken.take(17, false);
        assert_eq!(taken.covered_through(), 17);
        // Seen before: ignored.
        taken.take(17, false);
        assert_eq!(taken.covered_through(), 17);
    }
}
