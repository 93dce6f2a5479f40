//! The state every writer changes under the volume's write lock, one part per component,
//! and the guard that holds the lock.

use crate::index::checksums::ChecksumTable;
use crate::index::lifetimes::{Lifetimes, WriteRates};
use crate::log::{LogState, HOST_STREAM, STREAM_COUNT};
use crate::space::{Purpose, SegmentTable};
use parking_lot::{Condvar, MutexGuard};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The state every writer changes under the write lock (`Core::lock_state`): each part is
/// a component of its own type with private fields — the log (`log::LogState`), the segment
/// table (`space::SegmentTable`), the write clock (`index::lifetimes`) — and a function of
/// the write path takes the parts it uses. Kept together because they change together: a
/// write accepted into the log remaps a block, moves live counts and ticks the clock at
/// once.
pub(crate) struct WriteState {
    pub(super) log: LogState,
    pub(super) space: SegmentTable,
    pub(super) lifetimes: Lifetimes,
    /// Per stream: its current segment and that segment's checksum table (also pinned in
    /// the cache), so that accepting a block costs no cache lookup under the lock.
    pub(super) current_checksums: [Option<(u64, Arc<ChecksumTable>)>; STREAM_COUNT],
    /// Client writes accepted since the last append to the write log (empty without one).
    pub(super) log_staging: crate::write_log::Staging,
    /// Which client writes are cold (volumes with feature bit 5 whose streams are
    /// separated; `None`: every client write goes into the clients' batch).
    pub(super) write_rates: Option<WriteRates>,
    /// Writers are paused (`Core::pause_writers`): nothing changes the log on the members.
    pub(super) paused: bool,
}

impl WriteState {
    pub(crate) fn new(log: LogState, space: SegmentTable, write_clock: u64, write_rates: Option<WriteRates>) -> Self {
        WriteState {
            log,
            space,
            lifetimes: Lifetimes::new(write_clock),
            current_checksums: Default::default(),
            log_staging: Default::default(),
            write_rates,
            paused: false,
        }
    }

    pub(crate) fn log(&self) -> &LogState {
        &self.log
    }

    pub(crate) fn space(&self) -> &SegmentTable {
        &self.space
    }

    pub(crate) fn space_mut(&mut self) -> &mut SegmentTable {
        &mut self.space
    }

    pub(crate) fn lifetimes(&self) -> &Lifetimes {
        &self.lifetimes
    }

    /// Client writes carrying `purpose` can go on: their segment is open (for data, one
    /// not opened from the records' room, or with that room back), or a free one lies
    /// above their floor (`SegmentTable::clients_floor`).
    pub(crate) fn has_room_for_clients(&self, purpose: Purpose) -> bool {
        match self.log.current(HOST_STREAM) {
            Some(current) => purpose == Purpose::Records || !current.records_room || self.records_room_is_free(),
            None => self.space.free_count() > self.space.clients_floor(purpose),
        }
    }

    /// The room kept for records is free: a free segment lies above the cleaner's reserve.
    pub(super) fn records_room_is_free(&self) -> bool {
        self.space.free_count() > self.space.clients_floor(Purpose::Records)
    }

    /// Whether client data may go into the clients' current segment now: it was not
    /// opened from the room kept for records, or that room is back, which ends the
    /// segment's mark.
    pub(super) fn data_may_enter_clients_segment(&mut self) -> bool {
        if let Some(current) = self.log.current(HOST_STREAM) {
            assert_eq!(
                self.space.usage(current.segment).status(),
                crate::space::SegmentStatus::Current,
                "the clients' segment {} is current in the segment table",
                current.segment
            );
            assert!(
                self.log.open().is_none_or(|open| open.segment == current.segment),
                "the clients' batch is in the clients' current segment"
            );
        }
        let room_back = self.records_room_is_free();
        match self.log.current_mut(HOST_STREAM) {
            Some(current) if current.records_room => {
                current.records_room = !room_back;
                room_back
            }
            _ => true,
        }
    }

    /// The components agree with each other (each checks its own invariants first): the
    /// streams' current and reserved segments are `Current` and `Reserved` in the segment
    /// table and every `Current` or `Reserved` segment belongs to a stream; the checksum
    /// tables of the current segments are the streams'.
    pub(crate) fn check_invariants(&self) {
        use crate::space::SegmentStatus;
        self.log.check_invariants();
        self.space.check_invariants();
        let mut claimed = vec![false; self.space.segment_count() as usize];
        for stream in 0..STREAM_COUNT {
            if let Some(current) = self.log.current(stream) {
                assert_eq!(
                    self.space.usage(current.segment).status(),
                    SegmentStatus::Current,
                    "stream {stream}'s current segment {}",
                    current.segment
                );
                assert_eq!(self.space.usage(current.segment).stream(), stream, "segment {}", current.segment);
                claimed[current.segment as usize] = true;
                let table = self.current_checksums[stream].as_ref().map(|(segment, _)| *segment);
                assert_eq!(table, Some(current.segment), "stream {stream}'s checksum table");
            }
            if self.log.current(stream).is_none() {
                assert!(self.current_checksums[stream].is_none(), "stream {stream} keeps a table without a segment");
            }
            if let Some(reserved) = self.log.reserved(stream) {
                assert_eq!(
                    self.space.usage(reserved).status(),
                    SegmentStatus::Reserved,
                    "stream {stream}'s reserved segment {reserved}"
                );
                claimed[reserved as usize] = true;
            }
        }
        for (segment, usage) in self.space.uses() {
            if matches!(usage.status(), SegmentStatus::Current | SegmentStatus::Reserved) {
                assert!(claimed[segment as usize], "segment {segment} is {:?} but no stream's", usage.status());
            }
        }
    }
}

/// The write lock, held: the state it guards, and the hold being timed. A panic that
/// unwinds through a holder stops the volume (`Core::fail` with `Shutdown::Panicked`): the
/// state may be half changed, and nothing may be served from it (parking_lot's locks do
/// not poison).
pub(crate) struct StateGuard<'a> {
    guard: Option<MutexGuard<'a, WriteState>>,
    core: &'a super::Core,
    acquired: Instant,
}

impl<'a> StateGuard<'a> {
    pub(super) fn new(guard: MutexGuard<'a, WriteState>, core: &'a super::Core) -> StateGuard<'a> {
        crate::write_lock::entered();
        StateGuard { guard: Some(guard), core, acquired: Instant::now() }
    }

    fn mutex_guard(&mut self) -> &mut MutexGuard<'a, WriteState> {
        self.guard.as_mut().expect("held until dropped")
    }

    /// The hold so far ends (recorded); the lock is released while `work` runs, then held
    /// again.
    pub(crate) fn unlocked<T>(&mut self, work: impl FnOnce() -> T) -> T {
        self.end_hold();
        let result = MutexGuard::unlocked(self.mutex_guard(), work);
        self.begin_hold();
        result
    }

    /// Wait on `condition` (which releases the lock) until notified or `timeout` passes.
    pub(crate) fn wait_for(&mut self, condition: &Condvar, timeout: Duration) {
        self.end_hold();
        condition.wait_for(self.mutex_guard(), timeout);
        self.begin_hold();
    }

    /// Wait on `condition` (which releases the lock) until notified.
    pub(crate) fn wait(&mut self, condition: &Condvar) {
        self.end_hold();
        condition.wait(self.mutex_guard());
        self.begin_hold();
    }

    fn end_hold(&mut self) {
        self.core.lock_holds().record(self.acquired.elapsed());
        crate::write_lock::left();
    }

    fn begin_hold(&mut self) {
        crate::write_lock::entered();
        self.acquired = Instant::now();
    }
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = WriteState;
    fn deref(&self) -> &WriteState {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut WriteState {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        self.end_hold();
        let guard = self.guard.take();
        if std::thread::panicking() {
            // Release the lock first: stopping the volume takes it to wake waiters.
            drop(guard);
            self.core.fail(crate::error::Shutdown::panicked(None));
        }
    }
}
