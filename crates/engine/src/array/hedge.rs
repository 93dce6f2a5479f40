//! Slow-member tolerance on the read side (docs/resilience.md, "Slow members"): each
//! member's read latency, the hedge deadline derived from the members' latencies, and the
//! read helper threads that run a direct read a client stops waiting for once it is late.

use crate::queue::{Receiver, Sender};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stripelog_blockdev::{AlignedBuffer, BlockDevice};

/// A direct read is never considered late before this.
pub(crate) const HEDGE_DEADLINE_FLOOR: Duration = Duration::from_micros(500);
/// Late: slower than this many times the median member's mean read time.
pub(crate) const HEDGE_LATENCY_FACTOR: u64 = 3;
/// A member whose fraction of late reads is above this is lagging: its reads are hedged.
/// In units of 1/`FRACTION_ONE`.
pub(crate) const HEDGE_LATE_FRACTION: u32 = FRACTION_ONE / 64;
/// Read helper threads per volume at most; when all are busy, clients read directly.
pub(crate) const READ_HELPERS_MAXIMUM: usize = 64;
/// Fixed-point one for the late fraction.
const FRACTION_ONE: u32 = 1 << 16;
/// Weights of the moving averages: the mean read time moves by 1/16 of each difference,
/// the late fraction by 1/64.
const MEAN_WEIGHT_SHIFT: u32 = 4;
const LATE_WEIGHT_SHIFT: u32 = 6;

/// One member's read latency, updated by every timed read (races between updaters lose an
/// update now and then, which an average does not notice).
#[derive(Default)]
pub(crate) struct ReadLatency {
    mean_nanos: AtomicU64,
    late_fraction: AtomicU32,
}

impl ReadLatency {
    /// Record one read that took `elapsed`; `deadline` gives the hedge deadline, asked for
    /// only when the read took longer than the floor (no deadline is shorter).
    pub(crate) fn record(&self, elapsed: Duration, deadline: impl FnOnce() -> Duration) {
        let nanos = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        let mean = self.mean_nanos.load(Ordering::Relaxed);
        let updated = if mean == 0 {
            nanos
        } else {
            (mean as i128 + ((nanos as i128 - mean as i128) >> MEAN_WEIGHT_SHIFT)) as u64
        };
        self.mean_nanos.store(updated.max(1), Ordering::Relaxed);
        let late = if elapsed > HEDGE_DEADLINE_FLOOR && elapsed > deadline() { FRACTION_ONE } else { 0 };
        let fraction = self.late_fraction.load(Ordering::Relaxed);
        let updated = (fraction as i64 + ((late as i64 - fraction as i64) >> LATE_WEIGHT_SHIFT)) as u32;
        self.late_fraction.store(updated, Ordering::Relaxed);
    }

    pub(crate) fn mean(&self) -> Duration {
        Duration::from_nanos(self.mean_nanos.load(Ordering::Relaxed))
    }

    pub(crate) fn late_fraction(&self) -> f64 {
        self.late_fraction.load(Ordering::Relaxed) as f64 / FRACTION_ONE as f64
    }

    pub(crate) fn lagging(&self) -> bool {
        self.late_fraction.load(Ordering::Relaxed) > HEDGE_LATE_FRACTION
    }
}

/// The hedge deadline for the members whose latencies are `latencies` (those read so far).
pub(crate) fn deadline<'a>(latencies: impl Iterator<Item = &'a ReadLatency>) -> Duration {
    let mut means: Vec<u64> =
        latencies.map(|latency| latency.mean_nanos.load(Ordering::Relaxed)).filter(|&mean| mean > 0).collect();
    if means.is_empty() {
        return HEDGE_DEADLINE_FLOOR;
    }
    means.sort_unstable();
    // The lower median: with two members read so far (a RAID-10 volume reads one side of
    // each mirror), the upper one would be the slow member itself, which then never looks
    // late. (Until the first open of a new volume stopped scanning every segment, every
    // member had been read before any client read.)
    let median = means[(means.len() - 1) / 2];
    HEDGE_DEADLINE_FLOOR.max(Duration::from_nanos(median.saturating_mul(HEDGE_LATENCY_FACTOR)))
}

/// What a helper's read produced: the block, or the device's error.
pub(crate) type HelperResult = Result<AlignedBuffer, stripelog_blockdev::DeviceError>;

/// A direct read running in a helper thread.
#[derive(Debug)]
pub(crate) struct PendingRead {
    reply: Receiver<HelperResult>,
}

impl PendingRead {
    /// The read's result if it finishes within `timeout`; else the read, still pending.
    pub(crate) fn wait_for(self, timeout: Duration) -> Result<HelperResult, PendingRead> {
        match self.reply.recv_timeout(timeout) {
            Ok(result) => Ok(result),
            Err(crate::queue::RecvTimeoutError::Timeout) => Err(self),
            Err(crate::queue::RecvTimeoutError::Disconnected) => Ok(Err(helper_stopped())),
        }
    }

    /// Wait for the read however long it takes.
    pub(crate) fn wait(self) -> HelperResult {
        self.reply.recv().unwrap_or_else(|_| Err(helper_stopped()))
    }
}

/// The error of a read whose helper ended without answering (it panicked).
fn helper_stopped() -> stripelog_blockdev::DeviceError {
    stripelog_blockdev::DeviceError::InvalidRequest("the read helper stopped".into())
}

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run direct reads for hedged clients: started on demand up to
/// `READ_HELPERS_MAXIMUM`, kept until the volume is dropped (when the queue closes).
pub(crate) struct ReadHelpers {
    sender: Sender<Job>,
    receiver: Receiver<Job>,
    idle: Arc<AtomicUsize>,
    started: AtomicUsize,
}

impl Default for ReadHelpers {
    fn default() -> Self {
        // At most one queued job per helper: a job waits only for a helper that is
        // between reads.
        let (sender, receiver) = crate::queue::bounded(READ_HELPERS_MAXIMUM);
        ReadHelpers { sender, receiver, idle: Arc::new(AtomicUsize::new(0)), started: AtomicUsize::new(0) }
    }
}

impl ReadHelpers {
    /// Start reading `offset_bytes` of `device` in a helper, timing it into `latency`
    /// against `deadline`; `None` when every helper is busy (the caller reads directly).
    pub(crate) fn start(
        &self,
        device: Arc<dyn BlockDevice>,
        offset_bytes: u64,
        latency: Arc<ReadLatency>,
        deadline: Duration,
    ) -> Option<PendingRead> {
        if self.idle.load(Ordering::Acquire) == 0 && !self.start_helper() {
            return None;
        }
        let (reply_sender, reply) = crate::queue::bounded(1);
        let job: Job = Box::new(move || {
            let started = std::time::Instant::now();
            let mut block = AlignedBuffer::zeroed(crate::layout::geometry::BLOCK_SIZE_BYTES);
            let result = device.read_at(&mut block, offset_bytes).map(|()| block);
            latency.record(started.elapsed(), || deadline);
            // The client may have stopped waiting: then nobody wants the block.
            let _ = reply_sender.send(result);
        });
        self.sender.try_send(job).ok()?;
        Some(PendingRead { reply })
    }

    /// Start one more helper thread, if the bound allows.
    fn start_helper(&self) -> bool {
        let mut started = self.started.load(Ordering::Relaxed);
        loop {
            if started >= READ_HELPERS_MAXIMUM {
                return false;
            }
            match self.started.compare_exchange(started, started + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => started = now,
            }
        }
        let receiver = self.receiver.clone();
        let idle = self.idle.clone();
        let spawned = std::thread::Builder::new().name("stripelog-read-helper".into()).spawn(move || {
            idle.fetch_add(1, Ordering::AcqRel);
            while let Ok(job) = receiver.recv() {
                idle.fetch_sub(1, Ordering::AcqRel);
                job();
                idle.fetch_add(1, Ordering::AcqRel);
            }
        });
        if spawned.is_err() {
            self.started.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_follows_the_median_member_and_never_drops_below_the_floor() {
        let latencies: Vec<ReadLatency> = (0..5).map(|_| ReadLatency::default()).collect();
        assert_eq!(deadline(latencies.iter()), HEDGE_DEADLINE_FLOOR);
        for (member, latency) in latencies.iter().enumerate() {
            // Four members at 400 µs, one at 20 ms.
            let time = if member == 0 { Duration::from_millis(20) } else { Duration::from_micros(400) };
            latency.record(time, || Duration::from_secs(1));
        }
        assert_eq!(deadline(latencies.iter()), Duration::from_micros(1200));
        let fast = ReadLatency::default();
        fast.record(Duration::from_micros(10), || Duration::from_secs(1));
        assert_eq!(deadline(std::iter::once(&fast)), HEDGE_DEADLINE_FLOOR);
        // Two members read so far, one of them the slow one: the deadline follows the
        // other (RAID-10 reads one side of each mirror).
        let pair = [ReadLatency::default(), ReadLatency::default()];
        pair[0].record(Duration::from_millis(20), || Duration::from_secs(1));
        pair[1].record(Duration::from_millis(1), || Duration::from_secs(1));
        assert_eq!(deadline(pair.iter()), Duration::from_millis(3));
    }

    #[test]
    fn a_member_lags_while_its_late_reads_are_frequent_and_recovers_after() {
        let latency = ReadLatency::default();
        let deadline = Duration::from_millis(1);
        for _ in 0..200 {
            latency.record(Duration::from_micros(200), || deadline);
        }
        assert!(!latency.lagging());
        // One read in ten late.
        for read in 0..400 {
            let time = if read % 10 == 0 { Duration::from_millis(20) } else { Duration::from_micros(200) };
            latency.record(time, || deadline);
        }
        assert!(latency.lagging(), "late fraction {}", latency.late_fraction());
        for _ in 0..400 {
            latency.record(Duration::from_micros(200), || deadline);
        }
        assert!(!latency.lagging(), "late fraction {}", latency.late_fraction());
    }

    #[test]
    fn helpers_run_reads_and_report_late_ones_as_pending() {
        let inner: Arc<dyn BlockDevice> = Arc::new(stripelog_blockdev::MemoryDevice::new(1 << 20));
        let slow: Arc<dyn BlockDevice> = Arc::new(stripelog_blockdev::LatencySpikeDevice::new(
            inner.clone(),
            Duration::from_millis(50),
            1_000_000,
            1,
        ));
        let helpers = ReadHelpers::default();
        let latency = Arc::new(ReadLatency::default());
        let pending = helpers.start(inner, 4096, latency.clone(), HEDGE_DEADLINE_FLOOR).expect("a helper");
        assert!(pending.wait_for(Duration::from_secs(5)).expect("in time").is_ok());
        let pending = helpers.start(slow, 4096, latency.clone(), HEDGE_DEADLINE_FLOOR).expect("a helper");
        let Err(pending) = pending.wait_for(Duration::from_millis(1)) else { panic!("a 50 ms read was not late") };
        assert!(pending.wait().is_ok());
        assert!(latency.late_fraction() > 0.0);
    }
}
