//! Leaf module: which threads hold a volume's write lock (the state lock of `io::Core`),
//! and how long each hold lasted. The lock is taken by every write, so nothing slow may
//! happen under it: member I/O asserts [`assert_not_held`] at the places it starts
//! (`array::members`), which makes "no member I/O under the write lock" an invariant
//! checked on every I/O rather than a convention (ARCHITECTURE.md, "Invariants").

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

thread_local! {
    /// Write locks this thread holds (of any volume: a process may serve several).
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// This thread took a write lock.
pub(crate) fn entered() {
    HELD.with(|held| held.set(held.get() + 1));
}

/// This thread released a write lock it held.
pub(crate) fn left() {
    HELD.with(|held| {
        let count = held.get();
        assert!(count > 0, "a write lock released that this thread did not hold");
        held.set(count - 1);
    });
}

/// Whether this thread holds a write lock.
pub(crate) fn held() -> bool {
    HELD.with(|held| held.get() > 0)
}

/// Panics when this thread holds a write lock: `what` (member I/O, a page load, a
/// checksum table rebuilt from summaries) must never happen under it, where it would
/// stall every writer of the volume.
#[track_caller]
pub(crate) fn assert_not_held(what: &str) {
    assert!(!held(), "{what} under the write lock");
}

/// Sub-buckets per power of two of [`HoldHistogram`]: a recorded duration is known to
/// within 1/8 (12.5 %).
const SUB_BUCKETS: usize = 8;
/// Powers of two of nanoseconds the histogram spans (1 ns to about 73 minutes).
const POWERS: usize = 42;

/// How long the write lock was held, hold by hold: a log-linear histogram of relaxed
/// atomic counters (no lock, a few nanoseconds per hold), read as percentiles by `stats`.
pub struct HoldHistogram {
    buckets: Box<[AtomicU64]>,
    maximum_nanoseconds: AtomicU64,
}

impl Default for HoldHistogram {
    fn default() -> Self {
        HoldHistogram {
            buckets: (0..POWERS * SUB_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            maximum_nanoseconds: AtomicU64::new(0),
        }
    }
}

impl HoldHistogram {
    fn bucket_of(nanoseconds: u64) -> usize {
        let value = nanoseconds.max(1);
        let power = 63 - value.leading_zeros() as usize;
        // The three bits after the leading one pick the sub-bucket.
        let sub =
            if power >= 3 { ((value >> (power - 3)) & 7) as usize } else { ((value << (3 - power)) & 7) as usize };
        (power * SUB_BUCKETS + sub).min(POWERS * SUB_BUCKETS - 1)
    }

    /// The largest duration bucket `bucket` holds.
    fn bucket_ceiling_nanoseconds(bucket: usize) -> u64 {
        let (power, sub) = (bucket / SUB_BUCKETS, (bucket % SUB_BUCKETS) as u64);
        let low = (1u64 << power) + ((sub << power) >> 3);
        let width = ((1u64 << power) >> 3).max(1);
        low + width - 1
    }

    pub(crate) fn record(&self, held: Duration) {
        let nanoseconds = held.as_nanos().min(u64::MAX as u128) as u64;
        self.buckets[Self::bucket_of(nanoseconds)].fetch_add(1, Ordering::Relaxed);
        self.maximum_nanoseconds.fetch_max(nanoseconds, Ordering::Relaxed);
    }

    /// Holds recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|bucket| bucket.load(Ordering::Relaxed)).sum()
    }

    /// The duration under which a `quantile` (0–1) of the holds ended, to within 12.5 %
    /// (the bucket's upper end); zero when nothing was recorded.
    pub fn quantile(&self, quantile: f64) -> Duration {
        let counts: Vec<u64> = self.buckets.iter().map(|bucket| bucket.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((quantile.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let ceiling = Self::bucket_ceiling_nanoseconds(bucket);
                return Duration::from_nanos(ceiling.min(self.maximum_nanoseconds.load(Ordering::Relaxed)));
            }
        }
        self.maximum()
    }

    pub fn maximum(&self) -> Duration {
        Duration::from_nanos(self.maximum_nanoseconds.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_count_follows_enter_and_leave() {
        assert!(!held());
        entered();
        entered();
        left();
        assert!(held());
        left();
        assert!(!held());
        assert_not_held("nothing");
    }

    #[test]
    #[should_panic(expected = "member I/O under the write lock")]
    fn member_io_under_the_lock_is_refused() {
        entered();
        assert_not_held("member I/O");
    }

    #[test]
    fn quantiles_are_within_an_eighth_of_the_recorded_durations() {
        let histogram = HoldHistogram::default();
        for micros in 1..=1000u64 {
            histogram.record(Duration::from_micros(micros));
        }
        assert_eq!(histogram.count(), 1000);
        for (quantile, expected_micros) in [(0.5, 500.0), (0.99, 990.0), (0.999, 999.0)] {
            let got = histogram.quantile(quantile).as_nanos() as f64 / 1000.0;
            assert!(got >= expected_micros && got <= expected_micros * 1.125, "{quantile}: {got} µs");
        }
        assert_eq!(histogram.quantile(1.0), Duration::from_micros(1000));
        for nanoseconds in [1u64, 7, 8, 9, 1023, 1024, 1 << 40] {
            let bucket = HoldHistogram::bucket_of(nanoseconds);
            assert!(HoldHistogram::bucket_ceiling_nanoseconds(bucket) >= nanoseconds, "{nanoseconds}");
        }
    }
}
