//! The threaded write pipeline: one stripe writer computes parity and fans a sealed
//! batch out to one worker per member; each worker drains its queue and submits what it
//! has as one batch (io_uring), and the last worker to finish a stripe completes it.

use crate::array::members::Members;
use crate::layout::geometry::Geometry;
use crate::log::batch::BufferPool;
use crate::log::batch::{PooledBuffers, SealedBatch};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
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

type MemberQueue = Sender<Arc<StripeJob>>;

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
        let (sender, receiver) = crossbeam_channel::bounded(shared.write_queue_batches());
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
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
        shared.fail(crate::error::Shutdown::PipelinePanicked);
    }
}

pub(crate) fn stripe_writer<S: BatchSink>(
    shared: Arc<S>,
    batches: Receiver<Arc<SealedBatch>>,
    members: Vec<MemberQueue>,
) {
    while let Ok(batch) = batches.recv() {
        let mut parity = shared.parity_pool().take();
        batch.compute_parity(shared.geometry(), &mut parity);
        let job = Arc::new(StripeJob {
            batch,
            parity,
            members_remaining: AtomicUsize::new(members.len()),
            first_error: Mutex::new(None),
        });
        for queue in &members {
            if queue.send(job.clone()).is_err() {
                finish_one(&*shared, &job, Some(crate::error::Error::Internal("a member worker stopped")));
            }
        }
    }
}

fn member_worker<S: BatchSink>(shared: Arc<S>, member: usize, jobs: Receiver<Arc<StripeJob>>) {
    while let Ok(first) = jobs.recv() {
        let mut taken = vec![first];
        while taken.len() < MEMBER_SUBMIT_BATCHES_MAXIMUM {
            match jobs.try_recv() {
                Ok(job) => taken.push(job),
                Err(_) => break,
            }
        }
        // Looked up per batch: the member may fail, or be replaced, between batches.
        let Some(device) = shared.members().writable(member) else {
            taken.iter().for_each(|job| finish_one(&*shared, job, None));
            continue;
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
            finish_one(&*shared, job, error);
        }
    }
}

fn finish_one<S: BatchSink + ?Sized>(shared: &S, job: &StripeJob, error: Option<crate::error::Error>) {
    if let Some(error) = error {
        job.first_error.lock().get_or_insert(error);
    }
    if job.members_remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
        let error = job.first_error.lock().take();
        shared.batch_written(&job.batch, error);
    }
}
/// A member worker writes at most this many queued batches in one submission.
pub(crate) const MEMBER_SUBMIT_BATCHES_MAXIMUM: usize = 8;
