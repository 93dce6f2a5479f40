//! Client writes paced to what the cleaner frees (docs/garbage-collection.md, "Pacing").
//!
//! On a full volume the cleaner thread, not the clients, sets the pace. Without pacing,
//! writers run at full speed until the free segments reach the cleaner's reserve, then
//! every writer waits for a whole round (tens of milliseconds) at once: the maximum write
//! latency is a round. With pacing, once the free segments fall into a window above the
//! reserve, each client write is admitted at the rate the cleaner's recent rounds freed
//! blocks, slower the closer the free segments are to the reserve: the same throughput,
//! with the wait spread over every write in small sleeps instead of one long stall.
//! The reserve still stops writers outright when the estimate was too generous.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Free segments above the reserve below which client writes are paced, at most; the
/// cleaner thread runs its rounds back to back below the window too. Every segment of
/// the window is spare space the cleaner cannot use, so a small volume gets a smaller one
/// ([`pacing_window_segments`]).
pub(crate) const PACING_WINDOW_SEGMENTS_MAXIMUM: usize = 8;
/// Segments of a volume per segment of pacing window.
const SEGMENTS_PER_WINDOW_SEGMENT: u64 = 256;
/// The smallest window: the low watermark's distance from the reserve.
const PACING_WINDOW_SEGMENTS_MINIMUM: usize = 2;

/// The pacing window of a volume of `segment_count` segments: one segment per 256, from
/// 2 to 8 (8 from 2048 segments on: 0.4 % of the space; 2 on a volume of 127, where 8
/// took 5 % of the space from the cleaner and raised its amplification).
pub(crate) fn pacing_window_segments(segment_count: u64) -> usize {
    ((segment_count / SEGMENTS_PER_WINDOW_SEGMENT) as usize)
        .clamp(PACING_WINDOW_SEGMENTS_MINIMUM, PACING_WINDOW_SEGMENTS_MAXIMUM)
}
/// A writer sleeps only once it is at least this far ahead of its admission time (shorter
/// sleeps cost more in timer slack than they smooth).
const PACING_SLEEP_MINIMUM: Duration = Duration::from_micros(200);
/// The longest a writer is made to wait for its admission in one call: beyond it the
/// estimate is stale and the reserve's own wait takes over.
const PACING_WAIT_MAXIMUM: Duration = Duration::from_millis(20);
/// The cleaner's rate is what its last this many rounds freed net over the time they took
/// (a ratio of sums: most rounds at a small spare win nothing and a few win a segment, and
/// an average of each round's rate would sink towards zero).
const ROUNDS_IN_ESTIMATE: usize = 16;
/// At the bottom of the window clients are admitted at this share of the cleaner's rate,
/// so that the free segments climb back. At a half, writers still reached the reserve now
/// and then (all at once, stalled 5-34 ms for a round); at a fifth, in two 90 s steady
/// states at 27 % spare, never, at the same IOPS (docs/garbage-collection.md, "Pacing").
const BOTTOM_SHARE: f64 = 0.2;

pub(crate) struct WritePacer {
    /// Free segments above the reserve below which writes are paced.
    window_segments: usize,
    /// Blocks per second the cleaner's recent back-to-back rounds freed net (their
    /// victims less the segments they relocated into), as `f64` bits; 0: no estimate.
    cleaner_blocks_per_second: AtomicU64,
    /// The last rounds' net blocks and durations (at most `ROUNDS_IN_ESTIMATE`; only the
    /// cleaner thread records).
    recent_rounds: Mutex<std::collections::VecDeque<(i64, Duration)>>,
    /// Free segments above the reserve, as last seen by a writer opening a segment or by
    /// the cleaner after a round.
    headroom_segments: AtomicI64,
    /// When the next paced block may go.
    next_admission: Mutex<Instant>,
}

impl WritePacer {
    pub(crate) fn new(segment_count: u64) -> WritePacer {
        WritePacer {
            window_segments: pacing_window_segments(segment_count),
            cleaner_blocks_per_second: AtomicU64::new(0),
            recent_rounds: Mutex::new(std::collections::VecDeque::with_capacity(ROUNDS_IN_ESTIMATE)),
            headroom_segments: AtomicI64::new(i64::MAX),
            next_admission: Mutex::new(Instant::now()),
        }
    }
}

impl WritePacer {
    pub(crate) fn window_segments(&self) -> usize {
        self.window_segments
    }

    pub(crate) fn set_headroom(&self, free_segments: usize, reserve_segments: usize) {
        self.headroom_segments.store(free_segments as i64 - reserve_segments as i64, Ordering::Relaxed);
    }

    /// A round freed `net_blocks` in `elapsed` (negative: it took more room than it won).
    /// The estimate becomes the net blocks of the last rounds over their time; none when
    /// they won nothing net (writers are then stopped by the reserve alone).
    pub(crate) fn record_round(&self, net_blocks: i64, elapsed: Duration) {
        let mut rounds = self.recent_rounds.lock();
        if rounds.len() == ROUNDS_IN_ESTIMATE {
            rounds.pop_front();
        }
        rounds.push_back((net_blocks, elapsed));
        let net: i64 = rounds.iter().map(|(blocks, _)| blocks).sum();
        let seconds: f64 = rounds.iter().map(|(_, elapsed)| elapsed.as_secs_f64()).sum();
        let rate = if net > 0 && seconds > 0.0 { net as f64 / seconds } else { 0.0 };
        self.cleaner_blocks_per_second.store(rate.to_bits(), Ordering::Relaxed);
    }

    /// The wait before `blocks` client blocks may be written (zero outside the window,
    /// or without an estimate yet).
    pub(crate) fn admission_wait(&self, blocks: u64, now: Instant) -> Duration {
        let headroom = self.headroom_segments.load(Ordering::Relaxed);
        let rate = f64::from_bits(self.cleaner_blocks_per_second.load(Ordering::Relaxed));
        let mut next = self.next_admission.lock();
        if headroom >= self.window_segments as i64 || rate <= 0.0 {
            // Unpaced; the next paced write starts from its own time.
            *next = now;
            return Duration::ZERO;
        }
        let depth = headroom.max(0) as f64 / self.window_segments as f64;
        let admitted_rate = rate * (BOTTOM_SHARE + (1.0 - BOTTOM_SHARE) * depth);
        // A debt beyond the longest wait is forgiven: the estimate was too low, and the
        // reserve stops writers if it was too high.
        let start = (*next).max(now).min(now + PACING_WAIT_MAXIMUM);
        // A tiny estimate (rounds that freed next to nothing) would make the step huge or
        // infinite: no step is longer than the longest wait.
        let step = Duration::try_from_secs_f64(blocks as f64 / admitted_rate).unwrap_or(PACING_WAIT_MAXIMUM);
        *next = start + step.min(PACING_WAIT_MAXIMUM);
        start.saturating_duration_since(now)
    }

    /// Wait, if need be, before writing `blocks` client blocks; returns the time waited.
    pub(crate) fn pace(&self, blocks: u64) -> Duration {
        let wait = self.admission_wait(blocks, Instant::now());
        if wait < PACING_SLEEP_MINIMUM {
            return Duration::ZERO;
        }
        std::thread::sleep(wait);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_go_unpaced_above_the_window_and_at_the_cleaner_s_rate_within_it() {
        assert_eq!(pacing_window_segments(127), PACING_WINDOW_SEGMENTS_MINIMUM);
        assert_eq!(pacing_window_segments(1024), 4);
        assert_eq!(pacing_window_segments(1 << 20), PACING_WINDOW_SEGMENTS_MAXIMUM);
        let pacer = WritePacer::new(4096);
        const PACING_WINDOW_SEGMENTS: usize = PACING_WINDOW_SEGMENTS_MAXIMUM;
        let now = Instant::now();
        pacer.record_round(10_000, Duration::from_secs(1));
        pacer.set_headroom(20 + PACING_WINDOW_SEGMENTS, 20);
        assert_eq!(pacer.admission_wait(1_000, now), Duration::ZERO);
        // At the top of the window: the cleaner's rate, 10 000 blocks a second.
        pacer.set_headroom(20 + PACING_WINDOW_SEGMENTS - 1, 20);
        assert_eq!(pacer.admission_wait(50, now), Duration::ZERO);
        let second = pacer.admission_wait(50, now);
        let expected = 50.0 / (10_000.0 * (BOTTOM_SHARE + (1.0 - BOTTOM_SHARE) * 7.0 / 8.0));
        assert!((second.as_secs_f64() - expected).abs() < 1e-6, "{second:?}");
        // At the reserve: the bottom share of the rate, and never more than the longest wait.
        pacer.set_headroom(20, 20);
        let later = now + Duration::from_secs(1);
        assert_eq!(pacer.admission_wait(30, later), Duration::ZERO);
        let at_the_reserve = 30.0 / (10_000.0 * BOTTOM_SHARE);
        assert!(at_the_reserve < PACING_WAIT_MAXIMUM.as_secs_f64());
        assert!((pacer.admission_wait(1, later).as_secs_f64() - at_the_reserve).abs() < 1e-6);
        pacer.admission_wait(1_000_000, later);
        assert_eq!(pacer.admission_wait(1, later), PACING_WAIT_MAXIMUM);
        // The estimate is the last rounds' net blocks over their time: a round that won
        // nothing halves it here, one that lost room takes its loss off.
        let rate = || f64::from_bits(pacer.cleaner_blocks_per_second.load(Ordering::Relaxed));
        pacer.record_round(0, Duration::from_secs(1));
        assert_eq!(rate(), 5_000.0);
        pacer.record_round(-1_000, Duration::from_secs(1));
        assert_eq!(rate(), 3_000.0);
        // Once the winning round is out of the window: no estimate, writes go unpaced
        // (the reserve stops them).
        for _ in 0..ROUNDS_IN_ESTIMATE {
            pacer.record_round(0, Duration::from_millis(2));
        }
        assert_eq!(rate(), 0.0);
        assert_eq!(pacer.admission_wait(1_000_000, later), Duration::ZERO);
    }

    /// At the smallest spare most rounds win nothing and a few win a segment: the estimate
    /// is what they won together over their time, not an average of each round's rate,
    /// which sank towards zero (to a subnormal number, where a block's step overflowed a
    /// `Duration`: a client's write panicked) and paced writes at 50 a second.
    #[test]
    fn rounds_that_win_nothing_between_rounds_that_win_keep_the_estimate_at_what_they_win() {
        let pacer = WritePacer::new(127);
        for round in 0..1_000 {
            let won = if round % 8 == 0 { 384 } else { 0 };
            pacer.record_round(won, Duration::from_millis(2));
        }
        let rate = f64::from_bits(pacer.cleaner_blocks_per_second.load(Ordering::Relaxed));
        assert!((rate - 2.0 * 384.0 / (16.0 * 0.002)).abs() < 1e-6, "{rate}");
        // Whatever the estimate, a step is at most the longest wait, and nothing panics.
        pacer.cleaner_blocks_per_second.store(f64::MIN_POSITIVE.to_bits() >> 20, Ordering::Relaxed);
        pacer.set_headroom(7, 7);
        let now = Instant::now();
        assert_eq!(pacer.admission_wait(1, now), Duration::ZERO);
        assert_eq!(pacer.admission_wait(1, now), PACING_WAIT_MAXIMUM);
        assert_eq!(pacer.admission_wait(1, now), PACING_WAIT_MAXIMUM);
    }
}
