//! Each busy connection gets its share of the server.
//!
//! Two cores serve every connection: a client that keeps a connection busy with requests
//! that run in memory (writes accepted into the open batch) takes the CPU that another
//! connection's reads need to be submitted and answered, and that connection's clients
//! starve. Fair queueing by cost, as start-time fair queueing and mClock do:
//!
//! - every connection has a clock, the cost of the requests it has taken
//!   (`request_cost`: one per request, one more for a partial block, which reads its old
//!   block first, and one per 64 KiB carried);
//! - a connection is *backlogged* while it has requests taken and not yet answered, and
//!   its clock moved within the last `ACTIVE_WINDOW` (a stuck connection holds nobody
//!   back for longer than that);
//! - a connection that becomes backlogged starts no further behind than the slowest
//!   backlogged one (time without requests is not saved up as credit);
//! - before it takes its next request, a connection whose clock runs more than
//!   `ALLOWANCE_COST` ahead of the slowest other backlogged connection pauses (`PAUSE`)
//!   until that one catches up or has nothing left to answer.
//!
//! A lone connection, or one beside connections that keep up with their clients (a
//! client that sends less than its share), never pauses.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How far (in cost) a connection may run ahead of the slowest other backlogged one:
/// twice a connection's requests in flight, so that a client's burst (taken at once)
/// makes nobody wait.
pub const ALLOWANCE_COST: u64 = 2 * crate::server::REQUESTS_IN_FLIGHT_PER_CONNECTION as u64;
/// A connection whose clock has not moved for this long holds nobody back.
pub const ACTIVE_WINDOW: Duration = Duration::from_millis(2);
/// How long a connection ahead of its share sleeps before it looks again.
pub const PAUSE: Duration = Duration::from_micros(50);
/// The payload bytes that cost as much as a request.
pub const COST_BYTES: u64 = 64 << 10;

/// The cost of a request carrying (or asking for) `length_bytes`; `partial_block` when
/// it writes part of a block (its old content is read first).
pub fn request_cost(length_bytes: u32, partial_block: bool) -> u64 {
    1 + u64::from(partial_block) + u64::from(length_bytes) / COST_BYTES
}

#[repr(align(64))]
#[derive(Default)]
struct Slot {
    in_use: AtomicBool,
    clock: AtomicU64,
    /// When the clock last moved, in nanoseconds since `FairShare::epoch` (0: never).
    moved_nanos: AtomicU64,
    /// Requests taken and not yet answered.
    unanswered: AtomicU64,
}

/// The clocks of the server's connections, one slot each.
pub struct FairShare {
    slots: Box<[Slot]>,
    epoch: Instant,
}

/// One connection's place in `FairShare`; freed when dropped.
pub struct Share<'a> {
    fair_share: &'a FairShare,
    slot: usize,
}

impl FairShare {
    pub fn new(connections_maximum: usize) -> FairShare {
        assert!(connections_maximum > 0);
        FairShare { slots: (0..connections_maximum).map(|_| Slot::default()).collect(), epoch: Instant::now() }
    }

    /// A slot for a new connection; `None` when every slot is taken (the connection then
    /// runs without a share: it neither waits nor holds others back).
    pub fn join(&self) -> Option<Share<'_>> {
        let slot = self
            .slots
            .iter()
            .position(|slot| slot.in_use.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok())?;
        let joined = &self.slots[slot];
        assert_eq!(joined.unanswered.load(Ordering::Acquire), 0, "a free slot has nothing unanswered");
        assert_eq!(joined.moved_nanos.load(Ordering::Acquire), 0, "a free slot's clock never moved");
        Some(Share { fair_share: self, slot })
    }

    fn now_nanos(&self) -> u64 {
        // Never 0: 0 marks a clock that never moved.
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// The lowest clock among the backlogged connections other than `except`.
    fn slowest_other_backlogged(&self, except: usize, now_nanos: u64) -> Option<u64> {
        let window = ACTIVE_WINDOW.as_nanos() as u64;
        let mut slowest: Option<u64> = None;
        for (index, slot) in self.slots.iter().enumerate() {
            if index == except || !slot.in_use.load(Ordering::Acquire) || slot.unanswered.load(Ordering::Acquire) == 0 {
                continue;
            }
            let moved = slot.moved_nanos.load(Ordering::Acquire);
            if moved == 0 || now_nanos.saturating_sub(moved) > window {
                continue;
            }
            let clock = slot.clock.load(Ordering::Acquire);
            slowest = Some(slowest.map_or(clock, |lowest: u64| lowest.min(clock)));
        }
        slowest
    }
}

impl Share<'_> {
    fn slot(&self) -> &Slot {
        &self.fair_share.slots[self.slot]
    }

    /// Count a request of `cost` taken by this connection (unanswered until `answered`).
    pub fn charge(&self, cost: u64) {
        assert!(cost > 0, "every request costs something");
        let now = self.fair_share.now_nanos();
        let slot = self.slot();
        let mut clock = slot.clock.load(Ordering::Acquire);
        if slot.unanswered.fetch_add(1, Ordering::AcqRel) == 0 {
            // Backlogged again: no further behind than the slowest backlogged connection.
            if let Some(slowest) = self.fair_share.slowest_other_backlogged(self.slot, now) {
                clock = clock.max(slowest);
            }
        }
        let charged = clock.checked_add(cost).expect("a connection's cost clock never wraps");
        assert!(charged > clock && slot.unanswered.load(Ordering::Acquire) > 0);
        slot.clock.store(charged, Ordering::Release);
        slot.moved_nanos.store(now, Ordering::Release);
    }

    /// One request taken by `charge` is answered.
    pub fn answered(&self) {
        let before = self.slot().unanswered.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "every answer follows a charge");
    }

    /// Whether this connection runs more than its allowance ahead of the slowest other
    /// backlogged connection (it should pause before taking another request).
    pub fn ahead(&self) -> bool {
        let now = self.fair_share.now_nanos();
        let Some(slowest) = self.fair_share.slowest_other_backlogged(self.slot, now) else { return false };
        self.slot().clock.load(Ordering::Acquire) > slowest.saturating_add(ALLOWANCE_COST)
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        let slot = self.slot();
        slot.unanswered.store(0, Ordering::Release);
        slot.moved_nanos.store(0, Ordering::Release);
        slot.clock.store(0, Ordering::Release);
        let was_in_use = slot.in_use.swap(false, Ordering::AcqRel);
        assert!(was_in_use, "a share's slot is in use until the share is dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` requests of cost 1 taken and answered at once.
    fn served(share: &Share, count: u64) {
        for _ in 0..count {
            share.charge(1);
            share.answered();
        }
    }

    #[test]
    fn a_lone_connection_is_never_ahead() {
        let fair_share = FairShare::new(4);
        let share = fair_share.join().unwrap();
        for _ in 0..10_000 {
            share.charge(request_cost(4096, false));
        }
        assert!(!share.ahead());
    }

    #[test]
    fn a_connection_ahead_of_a_backlogged_one_by_more_than_its_allowance_waits_until_it_catches_up() {
        let fair_share = FairShare::new(4);
        let (busy, other) = (fair_share.join().unwrap(), fair_share.join().unwrap());
        other.charge(1);
        // Level with the other (at 1) when it starts, then its allowance.
        served(&busy, ALLOWANCE_COST);
        assert!(!busy.ahead(), "within the allowance");
        served(&busy, 1);
        assert!(busy.ahead(), "one request beyond the allowance");
        assert!(!other.ahead(), "the slower connection never waits");
        other.charge(1);
        other.charge(1);
        assert!(!busy.ahead(), "the other caught up");
        other.answered();
        other.answered();
        other.answered();
        served(&busy, 10);
        assert!(!busy.ahead(), "the other has nothing unanswered: it keeps up with its client");
    }

    #[test]
    fn a_connection_whose_clock_stopped_holds_nobody_back() {
        let fair_share = FairShare::new(4);
        let (busy, stalled) = (fair_share.join().unwrap(), fair_share.join().unwrap());
        stalled.charge(1);
        served(&busy, ALLOWANCE_COST + 2);
        assert!(busy.ahead());
        std::thread::sleep(ACTIVE_WINDOW + Duration::from_millis(1));
        assert!(!busy.ahead(), "the stalled connection no longer counts");
    }

    #[test]
    fn a_connection_backlogged_again_starts_level_with_the_slowest_without_credit() {
        let fair_share = FairShare::new(4);
        let (busy, returning) = (fair_share.join().unwrap(), fair_share.join().unwrap());
        served(&returning, 1);
        busy.charge(1);
        for _ in 0..1000 {
            busy.charge(1);
            busy.answered();
        }
        // Its next request, after a time with nothing unanswered: level with the busy
        // one, not 1000 behind it.
        returning.charge(1);
        assert!(!busy.ahead(), "the busy connection does not wait for the other's idle time");
        assert!(returning.slot().clock.load(Ordering::Acquire) >= 1000);
    }

    #[test]
    fn costs_count_requests_partial_blocks_and_bytes_and_slots_are_reused() {
        assert_eq!(request_cost(0, false), 1);
        assert_eq!(request_cost(4096, false), 1);
        assert_eq!(request_cost(512, true), 2);
        assert_eq!(request_cost(1 << 20, false), 17);
        let fair_share = FairShare::new(2);
        let first = fair_share.join().unwrap();
        let second = fair_share.join().unwrap();
        assert!(fair_share.join().is_none(), "every slot is taken");
        first.charge(5);
        drop(first);
        let third = fair_share.join().expect("a dropped share frees its slot");
        assert_eq!(third.slot().unanswered.load(Ordering::Acquire), 0, "nothing carried over");
        third.charge(1);
        second.charge(1);
        assert!(!third.ahead() && !second.ahead());
    }
}
