//! The members of a volume: creating and checking their superblocks, flushing them, and
//! reading one block with verification and reconstruction from redundancy.

use crate::array::hedge::{PendingRead, ReadHelpers, ReadLatency};
use crate::array::parity;
use crate::error::{
    Error, FailureCause, GeometryProblem, MemberFailure, MemberProblem, ReadFailure, RequestProblem, Result,
};
use crate::layout::format::{Superblock, SUPERBLOCK_OFFSETS_BYTES};
use crate::layout::geometry::{BlockLocation, Geometry, RaidLevel, Role, BLOCK_SIZE_BYTES};
use crate::stats::{Counters, MemberStatus};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stripelog_blockdev::{AlignedBuffer, BlockDevice, IoRequest};

/// Read errors in a row after which a member is failed (one latent sector error is
/// rebuilt from redundancy and counted, not a reason to drop a drive).
pub(crate) const FAILURE_READ_ERRORS: u32 = 8;

/// What a member is to the volume (docs/resilience.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemberState {
    Active,
    /// Not written, not read; its device is dropped.
    Failed,
    /// A replacement: written with every batch, read only in segments it holds in full.
    Rebuilding,
}

struct Slot {
    name: String,
    device: Option<Arc<dyn BlockDevice>>,
    state: MemberState,
    /// Why the member failed (for `info` and the server's log).
    failure: Option<MemberFailure>,
}

pub(crate) struct Members {
    slots: Vec<RwLock<Slot>>,
    /// Per member, per segment: the segment's chunk on a rebuilding member is complete.
    readable_segments: Vec<Vec<AtomicBool>>,
    consecutive_read_errors: Vec<AtomicU32>,
    bytes_written: Vec<AtomicU64>,
    /// Each member's lifetime bytes written before this open (from its own superblock).
    bytes_written_before: Vec<AtomicU64>,
    /// The volume's counters since this open, and its lifetime counters before it (with
    /// what mount counted of the batches it found after them): every superblock update
    /// persists their sum.
    pub(crate) counters: Arc<Counters>,
    lifetime_before: Mutex<crate::stats::LifetimeCounters>,
    /// The last batch the lifetime counters count (persisted with them).
    counted_through_sequence: AtomicU64,
    /// Each member's read time and late reads (docs/resilience.md, "Slow members").
    read_latency: Vec<Arc<ReadLatency>>,
    read_helpers: ReadHelpers,
    /// Client reads of lagging members are hedged (threaded volumes, unless turned off).
    hedged_reads: AtomicBool,
    raid_level: RaidLevel,
    chunk_size_bytes: u64,
    /// The superblock as last written; its lock serialises every superblock update and
    /// every change of a member's state.
    superblock: Mutex<Superblock>,
    /// Set when the volume is shut down (a failure beyond what the RAID level survives, or
    /// an internal error): every later request gets this reason as an error.
    pub(crate) shutdown: Mutex<Option<crate::error::Shutdown>>,
    failures_while_open: AtomicU64,
}

impl Members {
    fn new(
        members: Vec<MemberDevice>,
        failed: Vec<(usize, MemberFailure)>,
        reference: Superblock,
        bytes_written_before: Vec<u64>,
    ) -> Members {
        let count = members.len();
        let segment_count = reference.segment_count as usize;
        let mut failed = failed;
        let slots = members
            .into_iter()
            .enumerate()
            .map(|(index, member)| {
                let rebuilding = reference.rebuilding_members & (1 << index) != 0 && member.device.is_some();
                let failure = failed
                    .iter()
                    .position(|(failed, _)| *failed == index)
                    .map(|position| failed.swap_remove(position).1);
                let state = match (&member.device, rebuilding, &failure) {
                    (Some(_), true, _) => MemberState::Rebuilding,
                    (Some(_), false, None) => MemberState::Active,
                    _ => MemberState::Failed,
                };
                let device = if state == MemberState::Failed { None } else { member.device };
                let failure = (state == MemberState::Failed).then(|| failure.unwrap_or(MemberFailure::Missing));
                RwLock::new(Slot { name: member.name, device, state, failure })
            })
            .collect();
        Members {
            slots,
            readable_segments: (0..count)
                .map(|_| (0..segment_count).map(|_| AtomicBool::new(false)).collect())
                .collect(),
            consecutive_read_errors: (0..count).map(|_| AtomicU32::new(0)).collect(),
            bytes_written: (0..count).map(|_| AtomicU64::new(0)).collect(),
            bytes_written_before: bytes_written_before.into_iter().map(AtomicU64::new).collect(),
            counters: Arc::new(Counters::default()),
            lifetime_before: Mutex::new(reference.lifetime),
            // Not recorded (a volume written before it was): the durable point is the best
            // guess of what the last update counted.
            counted_through_sequence: AtomicU64::new(if reference.lifetime_counted_through_sequence > 0 {
                reference.lifetime_counted_through_sequence
            } else {
                reference.durable_through_sequence
            }),
            read_latency: (0..count).map(|_| Arc::new(ReadLatency::default())).collect(),
            read_helpers: ReadHelpers::default(),
            hedged_reads: AtomicBool::new(false),
            raid_level: reference.raid_level,
            chunk_size_bytes: reference.chunk_size_bytes as u64,
            superblock: Mutex::new(reference),
            shutdown: Mutex::new(None),
            failures_while_open: AtomicU64::new(0),
        }
    }

    /// The device to write member `member`'s part to: active and rebuilding members.
    /// `Err(ShutDown)` once the volume has stopped writing.
    pub(crate) fn check_running(&self) -> Result<()> {
        match &*self.shutdown.lock() {
            Some(reason) => Err(Error::ShutDown(reason.clone())),
            None => Ok(()),
        }
    }

    pub(crate) fn writable(&self, member: usize) -> Option<Arc<dyn BlockDevice>> {
        crate::write_lock::assert_not_held("member I/O");
        let slot = self.slots[member].read();
        match slot.state {
            MemberState::Active | MemberState::Rebuilding => slot.device.clone(),
            MemberState::Failed => None,
        }
    }

    /// The device to read `segment` of member `member` from: active members, and
    /// rebuilding ones where the segment is complete on them.
    pub(crate) fn readable(&self, member: usize, segment: u64) -> Option<Arc<dyn BlockDevice>> {
        crate::write_lock::assert_not_held("member I/O");
        let slot = self.slots[member].read();
        match slot.state {
            MemberState::Active => slot.device.clone(),
            MemberState::Rebuilding if self.readable_segments[member][segment as usize].load(Ordering::Acquire) => {
                slot.device.clone()
            }
            _ => None,
        }
    }

    /// The device a queued client read of `location` goes to: its data column's first
    /// copy, when readable there and not lagging (a lagging member's blocks take the
    /// single-read path, which hedges them).
    pub(crate) fn direct_read_device(
        &self,
        geometry: &Geometry,
        location: BlockLocation,
    ) -> Option<(usize, Arc<dyn BlockDevice>)> {
        let member = geometry.member_of_role(location.segment, Role::Data { column: location.column, copy: 0 });
        if self.hedged_reads.load(Ordering::Relaxed) && self.read_latency[member].lagging() {
            return None;
        }
        self.readable(member, location.segment).map(|device| (member, device))
    }

    /// [`Members::readable`] for the segment holding member byte `offset_bytes`.
    fn readable_at(&self, member: usize, offset_bytes: u64) -> Option<Arc<dyn BlockDevice>> {
        match (offset_bytes / self.chunk_size_bytes).checked_sub(1) {
            Some(segment) => self.readable(member, segment),
            None => self.writable(member),
        }
    }

    pub(crate) fn state(&self, member: usize) -> MemberState {
        self.slots[member].read().state
    }

    pub(crate) fn name(&self, member: usize) -> String {
        self.slots[member].read().name.clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.slots.len()
    }

    /// Replacements being rebuilt.
    pub(crate) fn rebuilding(&self) -> Vec<usize> {
        (0..self.count()).filter(|&member| self.state(member) == MemberState::Rebuilding).collect()
    }

    /// Members that do not hold a full copy of their part: failed or rebuilding.
    pub(crate) fn lost(&self) -> Vec<usize> {
        (0..self.count()).filter(|&member| self.state(member) != MemberState::Active).collect()
    }

    fn lost_bits(&self) -> u64 {
        self.lost().iter().fold(0, |bits, &member| bits | 1 << member)
    }

    /// Whether the volume can serve without the members in `lost` (a bit set).
    pub(crate) fn survives(&self, lost: u64) -> bool {
        if self.raid_level == RaidLevel::Raid10 {
            (0..self.count() / 2).all(|pair| lost & (0b11 << (2 * pair)) != 0b11 << (2 * pair))
        } else {
            lost.count_ones() as usize <= self.raid_level.failures_tolerated()
        }
    }

    /// How many more members the volume survives losing, whichever they are. RAID-10
    /// survives one more loss while every mirror pair is whole, none once a pair has lost
    /// a member (losing its other half loses the volume) — whatever the number of pairs.
    pub(crate) fn further_losses_survived(&self) -> usize {
        further_losses_survived(self.raid_level, self.count(), self.lost_bits())
    }

    pub(crate) fn failures_while_open(&self) -> u64 {
        self.failures_while_open.load(Ordering::Relaxed)
    }

    pub(crate) fn superblock(&self) -> Superblock {
        self.superblock.lock().clone()
    }

    /// Write the superblock changed by `change` to every member that is written (both
    /// copies, flushing after each), and keep it as the current one.
    pub(crate) fn update_superblock(&self, change: impl FnOnce(&mut Superblock)) -> Result<()> {
        crate::write_lock::assert_not_held("member I/O");
        let mut current = self.superblock.lock();
        let mut updated = current.clone();
        change(&mut updated);
        self.write_superblock_everywhere(&mut updated)?;
        *current = updated;
        Ok(())
    }

    /// Fail member `member` for `failure`: durably recorded in the other members'
    /// superblocks before its device is dropped (docs/resilience.md). An error when the
    /// volume cannot survive the loss; the member is then left as it was.
    pub(crate) fn fail(&self, member: usize, failure: MemberFailure) -> Result<()> {
        self.fail_locked(&mut self.superblock.lock(), member, failure)
    }

    /// [`Members::fail`] for a caller holding the superblock lock (`current`).
    fn fail_locked(&self, current: &mut Superblock, member: usize, failure: MemberFailure) -> Result<()> {
        if self.state(member) == MemberState::Failed {
            return Ok(());
        }
        if !self.survives(self.lost_bits() | 1 << member) {
            return Err(Error::TooManyFailures {
                level: self.raid_level.name(),
                cause: FailureCause::MemberFailed { member, path: self.name(member), failure },
            });
        }
        self.mark_failed(member, failure);
        let mut updated = current.clone();
        self.write_superblock_everywhere(&mut updated)?;
        *current = updated;
        Ok(())
    }

    fn mark_failed(&self, member: usize, failure: MemberFailure) {
        self.failures_while_open.fetch_add(1, Ordering::Relaxed);
        let mut slot = self.slots[member].write();
        slot.state = MemberState::Failed;
        slot.device = None;
        slot.failure = Some(failure);
    }

    /// Write `superblock` (with the failed and rebuilding bits of the members' current
    /// states) to every written member: copy 0 everywhere, flush, copy 1, flush. A member
    /// that fails meanwhile is failed too and the update starts again without it, as long
    /// as the volume survives. Callers hold the superblock lock.
    fn write_superblock_everywhere(&self, superblock: &mut Superblock) -> Result<()> {
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        'again: loop {
            let rebuilding = self.rebuilding().iter().fold(0u64, |bits, member| bits | 1 << member);
            superblock.failed_members = self.lost_bits();
            superblock.rebuilding_members = rebuilding;
            superblock.update_sequence += 1;
            superblock.version = if superblock.incompatible_features != 0 {
                crate::layout::format::SUPERBLOCK_VERSION_WITH_FEATURES
            } else {
                crate::layout::format::SUPERBLOCK_VERSION
            };
            superblock.index_entry_width_bits = superblock.geometry().index_entry_width_bits() as u8;
            superblock.lifetime = self.lifetime_counters();
            superblock.lifetime_counted_through_sequence = self.counted_through_sequence();
            for (copy, offset) in SUPERBLOCK_OFFSETS_BYTES.iter().enumerate() {
                for member in 0..self.count() {
                    let Some(device) = self.writable(member) else {
                        continue;
                    };
                    Superblock {
                        copy: copy as u32,
                        member_index: member as u32,
                        member_uuid: superblock.member_uuids[member],
                        member_bytes_written: self.member_lifetime_bytes_written(member),
                        ..superblock.clone()
                    }
                    .encode(&mut block);
                    let written = device.write_at(&block, *offset).and_then(|()| device.flush());
                    if let Err(error) = written {
                        if !self.survives(self.lost_bits() | 1 << member) {
                            return Err(self.device_error(member, Arc::new(error)));
                        }
                        self.mark_failed(member, MemberFailure::SuperblockWrite(error));
                        continue 'again;
                    }
                }
            }
            return Ok(());
        }
    }

    /// The volume's lifetime counters now: those persisted before this open plus those
    /// since.
    pub(crate) fn lifetime_counters(&self) -> crate::stats::LifetimeCounters {
        self.lifetime_before.lock().plus(self.counters.lifetime())
    }

    /// Bytes written to `member` over its life in the volume.
    pub(crate) fn member_lifetime_bytes_written(&self, member: usize) -> u64 {
        Counters::get(&self.bytes_written_before[member]).saturating_add(Counters::get(&self.bytes_written[member]))
    }

    /// The last batch the lifetime counters count.
    pub(crate) fn counted_through_sequence(&self) -> u64 {
        self.counted_through_sequence.load(Ordering::Relaxed)
    }

    /// Batch `sequence` is counted (the pipeline wrote it).
    pub(crate) fn note_counted(&self, sequence: u64) {
        self.counted_through_sequence.fetch_max(sequence, Ordering::Relaxed);
    }

    /// Add what mount found written after the last batch the persisted counters count
    /// (`crate::stats::FoundCounts`): the next superblock update persists it.
    pub(crate) fn count_found(&self, found: &crate::stats::FoundCounts) {
        assert!(
            found.through_sequence == 0 || found.through_sequence > self.counted_through_sequence(),
            "mount counts only batches after those the counters count"
        );
        let mut before = self.lifetime_before.lock();
        let old_total = before.host_bytes_written;
        *before = before.plus(found.lifetime);
        assert!(before.host_bytes_written >= old_total, "lifetime counters never go backwards");
        drop(before);
        for counter in &self.bytes_written_before {
            Counters::add(counter, found.bytes_per_member);
        }
        self.note_counted(found.through_sequence);
    }

    /// Account `bytes` written to every written member (one batch).
    pub(crate) fn count_written(&self, bytes: u64) {
        for (member, counter) in self.bytes_written.iter().enumerate() {
            if self.writable(member).is_some() {
                Counters::add(counter, bytes);
            }
        }
    }

    pub(crate) fn statuses(&self) -> Vec<MemberStatus> {
        let member_uuids = self.superblock().member_uuids;
        (0..self.count())
            .map(|member| {
                let slot = self.slots[member].read();
                let description = match (slot.state, &slot.device) {
                    (MemberState::Active, Some(device)) => device.describe(),
                    (MemberState::Rebuilding, Some(device)) => {
                        let done = self.readable_segments[member]
                            .iter()
                            .filter(|readable| readable.load(Ordering::Relaxed))
                            .count();
                        format!(
                            "{} — rebuilding: {done} of {} segments hold its data",
                            device.describe(),
                            self.readable_segments[member].len()
                        )
                    }
                    // The status keeps the failure as text (`info`, `--json`).
                    _ => format!("failed: {}", slot.failure.as_ref().unwrap_or(&MemberFailure::Missing)),
                };
                MemberStatus {
                    index: member,
                    name: slot.name.clone(),
                    present: slot.state == MemberState::Active,
                    state: match slot.state {
                        MemberState::Active => "active",
                        MemberState::Failed => "failed",
                        MemberState::Rebuilding => "rebuilding",
                    }
                    .to_string(),
                    description,
                    bytes_written: Counters::get(&self.bytes_written[member]),
                    lifetime_bytes_written: self.member_lifetime_bytes_written(member),
                    read_latency_mean_micros: self.read_latency[member].mean().as_secs_f64() * 1e6,
                    late_read_fraction: self.read_latency[member].late_fraction(),
                    lagging: self.hedged_reads.load(Ordering::Relaxed) && self.read_latency[member].lagging(),
                    member_uuid: if member_uuids[member] == [0; 16] {
                        String::new()
                    } else {
                        uuid::Uuid::from_bytes(member_uuids[member]).to_string()
                    },
                }
            })
            .collect()
    }

    fn device_error(&self, member: usize, source: Arc<stripelog_blockdev::DeviceError>) -> Error {
        Error::Member { member, path: self.name(member), problem: MemberProblem::Device(source) }
    }

    /// A member's write or flush failed: fail the member (an error when the volume cannot
    /// survive that).
    pub(crate) fn write_failed(&self, member: usize, error: stripelog_blockdev::DeviceError) -> Result<()> {
        let error = Arc::new(error);
        self.fail(member, MemberFailure::Write(error.clone())).map_err(|_| self.device_error(member, error))
    }

    /// Flush every written member, in parallel when `parallel`. A member whose flush
    /// fails is failed.
    pub(crate) fn flush_all(&self, parallel: bool) -> Result<()> {
        crate::write_lock::assert_not_held("member I/O");
        let groups = self.flush_groups();
        if !parallel || groups.len() == 1 {
            return groups.iter().try_for_each(|group| self.flush_group(group));
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = groups.iter().map(|group| scope.spawn(move || self.flush_group(group))).collect();
            handles.into_iter().try_for_each(|handle| {
                handle.join().unwrap_or(Err(Error::Internal(crate::error::InternalFailure::FlushThreadPanicked)))
            })
        })
    }

    /// The writable members in groups that one flush makes durable together: files on
    /// one filesystem (`BlockDevice::filesystem_key`), each other member alone.
    pub(crate) fn flush_groups(&self) -> Vec<Vec<usize>> {
        let mut groups: Vec<(Option<u64>, Vec<usize>)> = Vec::new();
        for member in 0..self.count() {
            let Some(device) = self.writable(member) else { continue };
            let key = device.filesystem_key();
            match groups.iter_mut().find(|(group_key, _)| key.is_some() && *group_key == key) {
                Some((_, group)) => group.push(member),
                None => groups.push((key, vec![member])),
            }
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }

    /// Make every write completed on the members of `group` durable: one flush of their
    /// filesystem when they share one (one flush of the drive underneath rather than one
    /// per file), else each member's own. A failed filesystem flush is retried member by
    /// member, so that a failure is charged to the member that has it.
    pub(crate) fn flush_group(&self, group: &[usize]) -> Result<()> {
        crate::write_lock::assert_not_held("member I/O");
        let flush_one = |member: usize| match self.writable(member) {
            Some(device) => device.flush().or_else(|error| self.write_failed(member, error)),
            None => Ok(()),
        };
        if let [first, _, ..] = group {
            if let Some(device) = self.writable(*first) {
                if device.flush_filesystem().is_ok() {
                    return Ok(());
                }
            }
        }
        group.iter().try_for_each(|&member| flush_one(member))
    }

    /// Write `block` at each of `offsets_bytes` on every written member.
    pub(crate) fn write_everywhere(&self, block: &AlignedBuffer, offsets_bytes: &[u64], parallel: bool) -> Result<()> {
        crate::write_lock::assert_not_held("member I/O");
        // One submission per member (a slow member delays it once, not once per offset);
        // with `parallel`, every member at once.
        let present: Vec<usize> = (0..self.count()).filter(|&member| self.writable(member).is_some()).collect();
        let results = for_each_member(&present, parallel, |member| -> Result<()> {
            let Some(device) = self.writable(member) else {
                return Ok(());
            };
            let mut requests: Vec<IoRequest> =
                offsets_bytes.iter().map(|&offset_bytes| IoRequest::Write { buffer: block, offset_bytes }).collect();
            match device.submit_batch(&mut requests).into_iter().find_map(|result| result.err()) {
                Some(error) => self.write_failed(member, error),
                None => Ok(()),
            }
        });
        results.into_iter().try_for_each(|result| {
            result.unwrap_or(Err(Error::Internal(crate::error::InternalFailure::MemberWriterPanicked)))
        })
    }

    /// Read one member block raw; `None` when the member is not readable there or the
    /// read fails. `FAILURE_READ_ERRORS` errors in a row fail the member (when the volume
    /// survives it; otherwise it stays, and its blocks are rebuilt where they can be).
    pub(crate) fn read_raw(&self, member: usize, offset_bytes: u64, counters: &Counters) -> Option<AlignedBuffer> {
        self.read_raw_range(member, offset_bytes, BLOCK_SIZE_BYTES, counters)
    }

    /// [`Members::read_raw`] of `length_bytes` (within one segment) in one read.
    pub(crate) fn read_raw_range(
        &self,
        member: usize,
        offset_bytes: u64,
        length_bytes: usize,
        counters: &Counters,
    ) -> Option<AlignedBuffer> {
        let device = self.readable_at(member, offset_bytes)?;
        let mut block = AlignedBuffer::zeroed(length_bytes);
        let started = Instant::now();
        let result = device.read_at(&mut block, offset_bytes);
        self.read_latency[member].record(started.elapsed(), || self.hedge_deadline());
        self.read_done(member, result, counters).then_some(block)
    }

    /// Hedge client reads of lagging members (threaded volumes only: a helper thread's
    /// timing would make the simulation's order of device operations nondeterministic).
    pub(crate) fn set_hedged_reads(&self, enabled: bool) {
        self.hedged_reads.store(enabled, Ordering::Relaxed);
    }

    /// How long a direct read may take before it is late (docs/resilience.md).
    fn hedge_deadline(&self) -> Duration {
        crate::array::hedge::deadline(self.read_latency.iter().map(|latency| latency.as_ref()))
    }

    /// A client's read of one member block: directly, or — when the member lags — in a
    /// read helper, given up on (returned pending) once it is later than the deadline.
    fn read_for_client(&self, member: usize, offset_bytes: u64, counters: &Counters) -> Fetched {
        let lagging = self.hedged_reads.load(Ordering::Relaxed) && self.read_latency[member].lagging();
        if !lagging {
            return Fetched::Now(self.read_raw(member, offset_bytes, counters));
        }
        let deadline = self.hedge_deadline();
        let Some(pending) = self.start_helper_read(member, offset_bytes, deadline) else {
            return Fetched::Now(self.read_raw(member, offset_bytes, counters));
        };
        match pending.wait_for(deadline) {
            Ok(result) => Fetched::Now(self.helper_read_done(member, result, counters)),
            Err(pending) => {
                Counters::add(&counters.late_reads, 1);
                Fetched::Late(member, pending)
            }
        }
    }

    /// Start reading one block of `member` in a read helper; `None` when the member is
    /// not readable there or no helper is free (the caller reads directly).
    fn start_helper_read(&self, member: usize, offset_bytes: u64, deadline: Duration) -> Option<PendingRead> {
        let device = self.readable_at(member, offset_bytes)?;
        self.read_helpers.start(device, offset_bytes, self.read_latency[member].clone(), deadline)
    }

    fn helper_read_done(
        &self,
        member: usize,
        result: crate::array::hedge::HelperResult,
        counters: &Counters,
    ) -> Option<AlignedBuffer> {
        match result {
            Ok(block) => {
                self.read_done(member, Ok(()), counters);
                Some(block)
            }
            Err(error) => {
                self.read_done(member, Err(error), counters);
                None
            }
        }
    }

    /// Account one read of a member (`result`): errors in a row fail it. Whether the read
    /// succeeded.
    pub(crate) fn read_done(
        &self,
        member: usize,
        result: std::result::Result<(), stripelog_blockdev::DeviceError>,
        counters: &Counters,
    ) -> bool {
        let Err(error) = result else {
            self.consecutive_read_errors[member].store(0, Ordering::Relaxed);
            return true;
        };
        Counters::add(&counters.read_errors, 1);
        let in_a_row = self.consecutive_read_errors[member].fetch_add(1, Ordering::Relaxed) + 1;
        if in_a_row >= FAILURE_READ_ERRORS {
            // When the volume cannot survive losing it, the member stays: its blocks are
            // still tried, and rebuilt where they can be.
            let _ = self.fail(member, MemberFailure::ReadErrors { in_a_row, last: error });
        }
        false
    }

    /// Check every written member: its device's own health (deleted, truncated) and its
    /// superblock, which must still name this volume and position. Fails the members
    /// that do not pass; returns the error of a failure the volume cannot survive.
    pub(crate) fn check_health(&self) -> Result<()> {
        let expected = self.superblock();
        for member in 0..self.count() {
            if self.health_problem(member, &expected).is_none() {
                continue;
            }
            // A problem seen without the lock may belong to a state that is changing: a
            // replacement attached after `expected` was taken or the old device was, or
            // attached but not yet given its superblock. Under the lock no change is under
            // way: look again, against the current superblock.
            let mut current = self.superblock.lock();
            if let Some(failure) = self.health_problem(member, &current) {
                self.fail_locked(&mut current, member, failure)?;
            }
        }
        Ok(())
    }

    /// What is wrong with member `member`'s device now, if anything: it reports itself
    /// unhealthy (removed, shrunk), or its superblock no longer names this volume, this
    /// position and the member `expected` records there.
    fn health_problem(&self, member: usize, expected: &Superblock) -> Option<MemberFailure> {
        let device = self.writable(member)?;
        if let Err(reason) = device.health() {
            return Some(MemberFailure::Unhealthy(reason));
        }
        match read_superblock(member, &self.name(member), device.as_ref()) {
            Err(error) => Some(MemberFailure::SuperblockUnreadable(Box::new(error))),
            Ok(found)
                if found.volume_uuid != expected.volume_uuid
                    || found.member_index as usize != member
                    || found.member_uuid != expected.member_uuids[member] =>
            {
                Some(MemberFailure::NoLongerThisMember)
            }
            Ok(_) => None,
        }
    }

    /// Put `replacement` in the place of failed member `member`, as rebuilding: written
    /// from now on, read nowhere yet; the superblocks record it (failed and rebuilding).
    pub(crate) fn attach(&self, member: usize, replacement: MemberDevice) -> Result<()> {
        let mut current = self.superblock.lock();
        if self.state(member) != MemberState::Failed {
            return Err(Error::InvalidRequest(RequestProblem::NotFailed { member }));
        }
        for readable in &self.readable_segments[member] {
            readable.store(false, Ordering::Release);
        }
        self.consecutive_read_errors[member].store(0, Ordering::Relaxed);
        *self.slots[member].write() =
            Slot { name: replacement.name, device: replacement.device, state: MemberState::Rebuilding, failure: None };
        let mut updated = current.clone();
        // The replacement gets an identity of its own; the one it displaces is retired,
        // so the old device is refused by name if it is ever offered again.
        updated.retire_and_replace(member, new_member_uuid(), crate::array::identity::now_unix_seconds());
        self.write_superblock_everywhere(&mut updated)?;
        *current = updated;
        Ok(())
    }

    /// The rebuild wrote all of `segment`'s chunk to rebuilding member `member`.
    pub(crate) fn mark_readable(&self, member: usize, segment: u64) {
        self.readable_segments[member][segment as usize].store(true, Ordering::Release);
    }

    /// The rebuilt `members` hold everything (and it is flushed): make them active and
    /// record it.
    pub(crate) fn finish_rebuild(&self, members: &[usize]) -> Result<()> {
        let mut current = self.superblock.lock();
        for &member in members {
            let mut slot = self.slots[member].write();
            if slot.state == MemberState::Rebuilding {
                slot.state = MemberState::Active;
            }
        }
        let mut updated = current.clone();
        self.write_superblock_everywhere(&mut updated)?;
        *current = updated;
        Ok(())
    }

    /// A segment taken into use: a rebuilding member receives all of its content from
    /// now on, so it is readable there.
    pub(crate) fn segment_started(&self, segment: u64) {
        for member in self.rebuilding() {
            self.readable_segments[member][segment as usize].store(true, Ordering::Release);
        }
    }

    /// Read the block at `location` into `out`: directly (any copy) when `valid` accepts
    /// it, else rebuilt from the rest of its row. `checksum_of(column)` gives the checksum
    /// of another data column of the row, when known, to pick trustworthy shards.
    /// `purpose` says whether a late direct read may be hedged (client reads) and whether
    /// a block that reads back as all zeros is unwritten space rather than damage (scans
    /// for summaries: bit rot cannot zero a block; recovery's own destruction of a batch
    /// writes zeros).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_verified(
        &self,
        geometry: &Geometry,
        counters: &Counters,
        location: BlockLocation,
        valid: &dyn Fn(&[u8]) -> bool,
        checksum_of: &dyn Fn(usize) -> Option<u32>,
        purpose: ReadPurpose,
        out: &mut [u8],
    ) -> std::result::Result<ReadSource, ReadFailure> {
        crate::write_lock::assert_not_held("member I/O");
        let offset = geometry.member_offset_bytes(location.segment, location.row);
        let zero_means_unwritten = purpose == ReadPurpose::Scan;
        let mut every_copy_unwritten = true;
        let mut late = None;
        // A copy that is late is left pending while the other copies (mirrors) or the
        // reconstruction are tried: the first verified block wins.
        let take_copy = |block: Option<AlignedBuffer>, every_copy_unwritten: &mut bool, out: &mut [u8]| {
            let Some(block) = block else {
                *every_copy_unwritten = false;
                return false;
            };
            if valid(&block) {
                out.copy_from_slice(&block);
                return true;
            }
            *every_copy_unwritten &= crate::layout::format::is_all_zero(&block);
            if !(zero_means_unwritten && *every_copy_unwritten) {
                Counters::add(&counters.checksum_mismatches, 1);
            }
            false
        };
        for member in geometry.members_of_column(location.segment, location.column) {
            let fetched = match purpose {
                ReadPurpose::Client => self.read_for_client(member, offset, counters),
                _ => Fetched::Now(self.read_raw(member, offset, counters)),
            };
            match fetched {
                Fetched::Now(block) => {
                    if take_copy(block, &mut every_copy_unwritten, out) {
                        return Ok(ReadSource::Direct);
                    }
                }
                Fetched::Late(member, pending) => late = Some((member, pending)),
            }
        }
        if late.is_none() && zero_means_unwritten && every_copy_unwritten {
            return Err(ReadFailure::NeverWritten);
        }
        // Hedging: the rest of the row is read all at once, so the reconstruction takes
        // one read's time rather than one per member.
        let parallel = late.is_some();
        if geometry.parity_shards() > 0
            && self.reconstruct(geometry, counters, location, valid, checksum_of, parallel, out)
        {
            return Ok(ReadSource::Reconstructed);
        }
        // Nothing else could produce the block: wait for the late read after all.
        if let Some((member, pending)) = late {
            let block = self.helper_read_done(member, pending.wait(), counters);
            if take_copy(block, &mut every_copy_unwritten, out) {
                return Ok(ReadSource::Direct);
            }
        }
        if geometry.parity_shards() == 0 {
            return Err(ReadFailure::NoGoodCopy);
        }
        Err(ReadFailure::BeyondRedundancy)
    }

    /// Rebuild the block at `location` from the rest of its row into `out`; true when
    /// `valid` accepts the result. With `parallel`, the row's other blocks are read in
    /// read helpers all at once.
    #[allow(clippy::too_many_arguments)]
    fn reconstruct(
        &self,
        geometry: &Geometry,
        counters: &Counters,
        location: BlockLocation,
        valid: &dyn Fn(&[u8]) -> bool,
        checksum_of: &dyn Fn(usize) -> Option<u32>,
        parallel: bool,
        out: &mut [u8],
    ) -> bool {
        let offset = geometry.member_offset_bytes(location.segment, location.row);
        let data_columns = geometry.data_columns();
        // The other data columns' members, then the parity members.
        let sources: Vec<Option<usize>> = (0..data_columns)
            .map(|column| {
                (column != location.column)
                    .then(|| geometry.member_of_role(location.segment, Role::Data { column, copy: 0 }))
            })
            .chain(
                (0..geometry.parity_shards())
                    .map(|shard| Some(geometry.member_of_role(location.segment, Role::Parity { shard }))),
            )
            .collect();
        let mut blocks = self.read_blocks(&sources, offset, counters, parallel);
        let parity = blocks.split_off(data_columns);
        let data: Vec<Option<AlignedBuffer>> = blocks
            .into_iter()
            .enumerate()
            .map(|(column, block)| {
                let block = block?;
                match checksum_of(column) {
                    Some(expected) if !crate::layout::format::checksum_proves(&block, expected) => {
                        Counters::add(&counters.checksum_mismatches, 1);
                        None
                    }
                    _ => Some(block),
                }
            })
            .collect();
        // Try with every shard we have; for RAID-6, also without each one in turn (a
        // shard we could not verify may be the bad one).
        let shard_count = data_columns + parity.len();
        let attempts = std::iter::once(None).chain((0..shard_count).map(Some));
        for excluded in attempts {
            if excluded.is_some() && geometry.parity_shards() < 2 {
                break;
            }
            if excluded == Some(location.column) {
                continue;
            }
            let data_view: Vec<Option<&[u8]>> = data
                .iter()
                .enumerate()
                .map(|(column, block)| if excluded == Some(column) { None } else { block.as_deref() })
                .collect();
            let parity_view: Vec<Option<&[u8]>> = parity
                .iter()
                .enumerate()
                .map(|(shard, block)| if excluded == Some(data_columns + shard) { None } else { block.as_deref() })
                .collect();
            if let Some(rebuilt) = parity::reconstruct(geometry.raid_level, &data_view, &parity_view, location.column) {
                if valid(&rebuilt) {
                    out.copy_from_slice(&rebuilt);
                    Counters::add(&counters.reconstructed_blocks, 1);
                    return true;
                }
            }
        }
        false
    }
}

impl Members {
    /// Read the block at member byte `offset_bytes` of each of `sources` (`None`: not
    /// wanted): one after the other, or with `parallel` all at once in read helpers
    /// (directly where none is free).
    fn read_blocks(
        &self,
        sources: &[Option<usize>],
        offset_bytes: u64,
        counters: &Counters,
        parallel: bool,
    ) -> Vec<Option<AlignedBuffer>> {
        if !parallel {
            return sources.iter().map(|source| self.read_raw((*source)?, offset_bytes, counters)).collect();
        }
        let deadline = self.hedge_deadline();
        let pending: Vec<Option<PendingRead>> =
            sources.iter().map(|source| self.start_helper_read((*source)?, offset_bytes, deadline)).collect();
        sources
            .iter()
            .zip(pending)
            .map(|(source, pending)| {
                let member = (*source)?;
                match pending {
                    Some(pending) => self.helper_read_done(member, pending.wait(), counters),
                    None => self.read_raw(member, offset_bytes, counters),
                }
            })
            .collect()
    }
}

/// What a read is for: how `Members::read_verified` treats late and all-zero blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadPurpose {
    /// A client's read: a late direct read of a lagging member may be hedged.
    Client,
    /// Scanning for summaries: an all-zero block is unwritten space.
    Scan,
    /// Anything else (recovery's and the rebuild's verification): plain reads.
    Verify,
}

/// A member block read for a client: done, or late and still running in a helper.
enum Fetched {
    Now(Option<AlignedBuffer>),
    Late(usize, PendingRead),
}

/// [`Members::further_losses_survived`] for `member_count` members of `raid_level` with
/// the members in `lost` (a bit set) gone.
fn further_losses_survived(raid_level: RaidLevel, member_count: usize, lost: u64) -> usize {
    if raid_level == RaidLevel::Raid10 {
        let whole = |pair: usize| lost & (0b11 << (2 * pair)) == 0;
        usize::from((0..member_count / 2).all(whole))
    } else {
        raid_level.failures_tolerated().saturating_sub(lost.count_ones() as usize)
    }
}

/// Run `work` for each of `members`: all at once, a thread each, when `parallel`
/// (threaded volumes), else one after the other (inline volumes keep one order of device
/// operations). One result per member, in order; `None` where a thread panicked.
pub(crate) fn for_each_member<T: Send>(
    members: &[usize],
    parallel: bool,
    work: impl Fn(usize) -> T + Sync,
) -> Vec<Option<T>> {
    for_each_item(members.iter().copied(), parallel, work)
}

/// [`for_each_member`] over any items (a member with its buffer, say).
pub(crate) fn for_each_item<I: Send, T: Send>(
    items: impl IntoIterator<Item = I>,
    parallel: bool,
    work: impl Fn(I) -> T + Sync,
) -> Vec<Option<T>> {
    if !parallel {
        return items.into_iter().map(|item| Some(work(item))).collect();
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items.into_iter().map(|item| scope.spawn(move || work(item))).collect();
        handles.into_iter().map(|handle| handle.join().ok()).collect()
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadSource {
    Direct,
    Reconstructed,
}

/// A new random member UUID.
fn new_member_uuid() -> [u8; 16] {
    *uuid::Uuid::new_v4().as_bytes()
}

/// Write the superblocks of a new volume on every member: only after every member was
/// found present, distinct and — unless `options.force` — holding no data and no volume
/// (docs/data-safety.md).
/// Write fresh superblocks to `members`. `accept` judges the geometry before anything is
/// looked at or written (the layers above check that they can serve it).
pub(crate) fn create(
    members: &[MemberDevice],
    options: &CreateOptions,
    accept: &dyn Fn(&Geometry) -> Result<()>,
) -> Result<()> {
    let mut smallest = u64::MAX;
    for (index, member) in members.iter().enumerate() {
        let device = member.device.as_ref().ok_or_else(|| Error::Member {
            member: index,
            path: member.name.clone(),
            problem: MemberProblem::MissingAtCreate,
        })?;
        if let Some(first) = members[..index].iter().position(|other| {
            other.device.as_ref().is_some_and(|other| std::ptr::addr_eq(Arc::as_ptr(other), Arc::as_ptr(device)))
        }) {
            return Err(Error::Member {
                member: index,
                path: member.name.clone(),
                problem: MemberProblem::SameDevice { first, first_path: members[first].name.clone() },
            });
        }
        smallest = smallest.min(device.size_bytes());
    }
    if members.is_empty() {
        return Err(Error::InvalidGeometry(GeometryProblem::NoMembers));
    }
    let geometry = options.geometry(members.len(), smallest)?;
    accept(&geometry)?;
    if !options.force {
        for (index, member) in members.iter().enumerate() {
            let device = member.device.as_ref().expect("checked above");
            let content = crate::array::identity::inspect(device.as_ref()).map_err(|error| Error::Member {
                member: index,
                path: member.name.clone(),
                problem: MemberProblem::Device(Arc::new(error)),
            })?;
            if let Some(found) = content.found() {
                return Err(Error::WouldDestroy { member: index, path: member.name.clone(), found });
            }
        }
    }
    let volume_uuid = options.volume_uuid.unwrap_or_else(|| *uuid::Uuid::new_v4().as_bytes());
    let member_uuids: Vec<[u8; 16]> = members.iter().map(|_| new_member_uuid()).collect();
    let created_unix_seconds = crate::array::identity::now_unix_seconds();
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for (index, member) in members.iter().enumerate() {
        let device = member.device.as_ref().expect("checked above");
        let member_error = |error: stripelog_blockdev::DeviceError| Error::Member {
            member: index,
            path: member.name.clone(),
            problem: MemberProblem::Device(Arc::new(error)),
        };
        // Tell the device the old content is garbage (advisory; makes files sparse).
        let data_start = geometry.chunk_size_bytes as u64;
        device.discard(data_start, geometry.member_size_bytes - data_start).map_err(member_error)?;
        for (copy, offset) in SUPERBLOCK_OFFSETS_BYTES.iter().enumerate() {
            let superblock = Superblock {
                copy: copy as u32,
                version: crate::layout::format::SUPERBLOCK_VERSION,
                volume_uuid,
                member_index: index as u32,
                member_count: members.len() as u32,
                raid_level: geometry.raid_level,
                chunk_size_bytes: geometry.chunk_size_bytes,
                spare_ppm: geometry.spare_ppm,
                member_size_bytes: geometry.member_size_bytes,
                segment_count: geometry.segment_count(),
                logical_size_bytes: geometry.logical_size_bytes(),
                created_unix_seconds,
                epoch: 0,
                failed_members: 0,
                durable_through_sequence: 0,
                rebuilding_members: 0,
                update_sequence: 0,
                member_uuid: member_uuids[index],
                holder: crate::layout::format::Holder::default(),
                member_uuids: member_uuids.clone(),
                retired: Vec::new(),
                index_entry_width_bits: geometry.index_entry_width_bits() as u8,
                checkpoint: None,
                lifetime: crate::stats::LifetimeCounters::default(),
                lifetime_counted_through_sequence: 0,
                member_bytes_written: 0,
                write_log: None,
                // Compression needs index entries that can name fragments, fixed now.
                incompatible_features: if geometry.packed_fragments {
                    crate::layout::format::FEATURE_PACKED_FRAGMENTS
                } else {
                    0
                } | if geometry.thin_logical_block_count.is_some() {
                    crate::layout::format::FEATURE_THIN_PROVISIONED
                } else {
                    0
                } | if options.deduplication {
                    crate::layout::format::FEATURE_DEDUPLICATION
                } else {
                    0
                } | if options.deduplication && geometry.packed_fragments {
                    // Shared copies compressed as fragments (decision 11) need both.
                    crate::layout::format::FEATURE_COMPRESSED_SHARED_COPIES
                } else {
                    0
                } | if options.client_write_pairs {
                    crate::layout::format::FEATURE_CLIENT_WRITE_PAIRS
                } else {
                    0
                },
                compression: options.compression,
                deduplication: options.deduplication,
            };
            superblock.encode(&mut block);
            device.write_at(&block, *offset).map_err(member_error)?;
        }
        device.flush().map_err(member_error)?;
    }
    Ok(())
}

/// Read and check the superblocks; return the members in order and the newest superblock.
pub(crate) fn open(members: Vec<MemberDevice>) -> Result<(Members, Superblock)> {
    let mut found: Vec<Option<Superblock>> = Vec::with_capacity(members.len());
    // Present members without a valid superblock: an error unless the others record the
    // member as failed (below).
    let mut unreadable: Vec<(usize, Error)> = Vec::new();
    for (index, member) in members.iter().enumerate() {
        let Some(device) = &member.device else {
            found.push(None);
            continue;
        };
        match read_superblock(index, &member.name, device.as_ref()) {
            Ok(superblock) => found.push(Some(superblock)),
            Err(error) => {
                found.push(None);
                unreadable.push((index, error));
            }
        }
    }
    // No member has a superblock this code can read (another format version, not a
    // member at all): say why for the first one, rather than "no member is present".
    if found.iter().all(Option::is_none) && !unreadable.is_empty() {
        return Err(unreadable.swap_remove(0).1);
    }
    // The volume is the UUID most members carry.
    let mut votes: BTreeMap<[u8; 16], usize> = BTreeMap::new();
    for superblock in found.iter().flatten() {
        *votes.entry(superblock.volume_uuid).or_default() += 1;
    }
    let volume_uuid = votes
        .iter()
        .max_by_key(|(_, count)| **count)
        .map(|(uuid, _)| *uuid)
        .ok_or(Error::TooManyFailures { level: "any level", cause: FailureCause::NoMemberPresent })?;
    // The geometry is the one most of those members describe (so that an odd member is
    // the one blamed), and its newest superblock is the reference.
    let mut geometry_votes: Vec<(crate::layout::geometry::Geometry, usize)> = Vec::new();
    for superblock in found.iter().flatten().filter(|superblock| superblock.volume_uuid == volume_uuid) {
        match geometry_votes.iter_mut().find(|(geometry, _)| *geometry == superblock.geometry()) {
            Some((_, count)) => *count += 1,
            None => geometry_votes.push((superblock.geometry(), 1)),
        }
    }
    let voted_geometry = geometry_votes.iter().max_by_key(|(_, count)| *count).map(|(geometry, _)| geometry.clone());
    let reference = found
        .iter()
        .flatten()
        .filter(|superblock| superblock.volume_uuid == volume_uuid && Some(superblock.geometry()) == voted_geometry)
        .fold(None::<&Superblock>, |newest, superblock| match newest {
            Some(newest) if !superblock.is_newer_than(newest) => Some(newest),
            _ => Some(superblock),
        })
        .expect("the voted UUID and geometry come from a member")
        .clone();
    // The durable frontier is the highest any member recorded (a crash can interrupt a
    // superblock update part-way through the members).
    let mut reference = reference;
    reference.durable_through_sequence = found
        .iter()
        .flatten()
        .filter(|superblock| superblock.volume_uuid == volume_uuid)
        .map(|superblock| superblock.durable_through_sequence)
        .max()
        .unwrap_or(0);
    // A device in the place of a member the others record as failed needs no superblock
    // of its own: it is a replacement whose attachment a crash interrupted (before its
    // superblock was written). Rebuilding, it is kept (and rebuilt again); otherwise it
    // stays failed, unread and unwritten.
    let mut failed = Vec::new();
    let mut members = members;
    for (index, error) in unreadable {
        let bit = 1u64 << index;
        if index >= 64 || reference.failed_members & bit == 0 {
            return Err(error);
        }
        if reference.rebuilding_members & bit == 0 {
            failed.push((index, MemberFailure::ExcludedUnreadable(Box::new(error))));
            members[index].device = None;
        }
    }
    let volume = uuid::Uuid::from_bytes(volume_uuid);
    if reference.member_count as usize != members.len() {
        return Err(Error::InvalidRequest(RequestProblem::MemberCount {
            volume,
            recorded: reference.member_count,
            given: members.len(),
        }));
    }
    for (index, superblock) in found.iter().enumerate() {
        let Some(superblock) = superblock else {
            continue;
        };
        let name = members[index].name.clone();
        let problem = |problem: MemberProblem| Error::Member { member: index, path: name.clone(), problem };
        if superblock.volume_uuid != volume_uuid {
            return Err(problem(MemberProblem::AnotherVolume {
                found: uuid::Uuid::from_bytes(superblock.volume_uuid),
                expected: volume,
            }));
        }
        if superblock.member_index as usize != index {
            return Err(problem(MemberProblem::WrongPosition { recorded: superblock.member_index, given: index }));
        }
        if superblock.geometry() != reference.geometry() {
            return Err(problem(MemberProblem::DifferentGeometry));
        }
        let size = members[index].device.as_ref().expect("present").size_bytes();
        if size < reference.member_size_bytes {
            return Err(problem(MemberProblem::Truncated {
                size_bytes: size,
                needed_bytes: reference.member_size_bytes,
            }));
        }
        check_identity(&reference, index, superblock).map_err(problem)?;
    }
    let names: Vec<String> = members.iter().map(|member| member.name.clone()).collect();
    check_not_retired_by_another(&found, &names)?;
    // Members the newest superblock records as failed missed writes: keep them out,
    // except a replacement being rebuilt, which is written again and rebuilt from scratch.
    for (index, superblock) in found.iter_mut().enumerate() {
        let bit = 1u64 << index;
        if superblock.is_some() && reference.failed_members & bit != 0 {
            // Not counted as redundancy below; a replacement being rebuilt stays written.
            *superblock = None;
            if reference.rebuilding_members & bit == 0 {
                failed.push((index, MemberFailure::ExcludedStale));
            }
        }
    }
    let lost = (0..members.len()).filter(|&index| found[index].is_none()).fold(0u64, |bits, index| bits | 1 << index);
    let tolerated = reference.raid_level.failures_tolerated();
    let bytes_written_before = found
        .iter()
        .map(|superblock| superblock.as_ref().map_or(0, |superblock| superblock.member_bytes_written))
        .collect();
    let opened = Members::new(members, failed, reference.clone(), bytes_written_before);
    if !opened.survives(lost) {
        let names: Vec<String> =
            (0..opened.count()).filter(|&index| lost & (1 << index) != 0).map(|index| opened.name(index)).collect();
        return Err(Error::TooManyFailures {
            level: reference.raid_level.name(),
            cause: FailureCause::Missing { names, tolerated },
        });
    }
    Ok((opened, reference))
}

/// A member found in position `index` must carry the member UUID the newest superblock
/// expects there (docs/data-safety.md, "Member identity"); positions whose UUID is not
/// known yet (a volume written by version 1) are not checked.
fn check_identity(reference: &Superblock, index: usize, found: &Superblock) -> std::result::Result<(), MemberProblem> {
    let expected = reference.member_uuids.get(index).copied().unwrap_or_default();
    if expected == [0; 16] || found.member_uuid == expected {
        return Ok(());
    }
    if found.member_uuid == [0; 16] {
        // Written by version 1: the old device of a position replaced since is refused; any
        // other is a member an interrupted upgrade did not reach yet (this open finishes it).
        return match reference.retired_without_identity(index) {
            Some(retired) => Err(MemberProblem::ReplacedBeforeIdentity {
                position: index,
                retired_unix_seconds: retired.retired_unix_seconds,
            }),
            None => Ok(()),
        };
    }
    let found_uuid = uuid::Uuid::from_bytes(found.member_uuid);
    if let Some(retired) = reference.retired_member(&found.member_uuid) {
        return Err(MemberProblem::Replaced {
            position: retired.position,
            retired_unix_seconds: retired.retired_unix_seconds,
            member_uuid: found_uuid,
        });
    }
    Err(MemberProblem::NotTheExpectedMember {
        position: index,
        found: found_uuid,
        expected: uuid::Uuid::from_bytes(expected),
    })
}

/// No present member may be one that another present member records as retired, whatever
/// the newest superblock says: a replaced device opened on its own with `missing` for the
/// others moves on to epochs the real volume never had, and would otherwise be taken for
/// the newest copy (two copies of the volume that went separate ways).
fn check_not_retired_by_another(found: &[Option<Superblock>], names: &[String]) -> Result<()> {
    for (index, member) in found.iter().enumerate() {
        let Some(member) = member.as_ref().filter(|member| member.member_uuid != [0; 16]) else { continue };
        for (other_index, other) in found.iter().enumerate() {
            let Some(retired) = other.as_ref().and_then(|other| other.retired_member(&member.member_uuid)) else {
                continue;
            };
            return Err(Error::Member {
                member: index,
                path: names[index].clone(),
                problem: MemberProblem::RetiredByAnother {
                    position: retired.position,
                    retired_unix_seconds: retired.retired_unix_seconds,
                    by_member: other_index,
                    by_path: names[other_index].clone(),
                },
            });
        }
    }
    Ok(())
}

fn read_superblock(index: usize, name: &str, device: &dyn BlockDevice) -> Result<Superblock> {
    let (newest, copies) = crate::array::identity::read_newest_superblock(device);
    newest.ok_or_else(|| Error::Member {
        member: index,
        path: name.to_string(),
        problem: MemberProblem::NoValidSuperblock { copies },
    })
}

/// Record a new open epoch on every written member, with the members now lost in the
/// failed set and the recovered log's end as durable, before any batch of the new epoch is
/// written. Returns the new superblock.
pub(crate) fn advance_epoch(members: &Members, durable_through_sequence: u64, program: &str) -> Result<Superblock> {
    let present: Vec<usize> = (0..members.count()).filter(|&member| members.writable(member).is_some()).collect();
    members.update_superblock(|superblock| {
        superblock.epoch += 1;
        superblock.durable_through_sequence = durable_through_sequence.max(superblock.durable_through_sequence);
        superblock.holder = crate::array::identity::holder_now(program);
        // A volume written by version 1: every member present now gets its identity.
        for &member in &present {
            if superblock.member_uuids[member] == [0; 16] {
                superblock.member_uuids[member] = new_member_uuid();
            }
        }
    })?;
    Ok(members.superblock())
}

/// Record a clean close: every batch through `durable_through_sequence` is durable and
/// the holder has let go (the open flag cleared, the time of the close).
pub(crate) fn record_clean_close(members: &Members, durable_through_sequence: u64) -> Result<()> {
    members.update_superblock(|superblock| {
        superblock.durable_through_sequence = durable_through_sequence.max(superblock.durable_through_sequence);
        superblock.holder.open = false;
        superblock.holder.closed_unix_seconds = crate::array::identity::now_unix_seconds();
    })
}

/// How a new volume is laid out.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub raid_level: RaidLevel,
    pub chunk_size_bytes: u32,
    /// Spare fraction in parts per million (200 000 = 20 %).
    pub spare_ppm: u32,
    /// The volume UUID; a random one when `None` (tests fix it for determinism).
    pub volume_uuid: Option<[u8; 16]>,
    /// Overwrite members that hold data or another volume. Without it `create` refuses
    /// them, naming what it found (docs/data-safety.md).
    pub force: bool,
    /// Compress client blocks (docs/compression.md). A volume created with compression
    /// can turn it off and on again while served; one created without cannot turn it on
    /// (its index entries cannot name fragments).
    pub compression: crate::layout::format::CompressionSetting,
    /// A logical size of its own, in bytes (a multiple of 4096), instead of the
    /// provisioned size: thin provisioning when it is larger; writes that would hold more
    /// data than the provisioned size then fail with `OutOfSpace` (docs/deduplication.md,
    /// decision 10).
    pub logical_size_bytes: Option<u64>,
    /// Deduplicate client blocks (docs/deduplication.md): sets incompatible feature bit 4,
    /// whose index entries can name shared-block records. A volume created with it can
    /// turn deduplication off and on again while served; one created without cannot.
    pub deduplication: bool,
    /// Client writes predicted to live long go into a stream of their own, sealed with
    /// the clients' batch as a pair (sets incompatible feature bit 5; docs/
    /// crash-consistency.md, "Client writes in two streams"). On by default.
    pub client_write_pairs: bool,
}

impl CreateOptions {
    /// The geometry `create` gives a volume of `member_count` members, the smallest of
    /// `smallest_member_bytes`: what the layers above judge before anything is written
    /// (the spare the cleaner needs, say).
    pub fn geometry(&self, member_count: usize, smallest_member_bytes: u64) -> Result<Geometry> {
        let compressed = self.compression != crate::layout::format::CompressionSetting::Off;
        let thin_logical_blocks = match self.logical_size_bytes {
            None => None,
            Some(bytes) => Some(
                crate::layout::format::thin_logical_blocks(bytes)
                    .ok_or(Error::InvalidGeometry(GeometryProblem::LogicalSize { bytes }))?,
            ),
        };
        Ok(Geometry::new(self.raid_level, member_count, self.chunk_size_bytes, self.spare_ppm, smallest_member_bytes)?
            .with_packed_fragments(compressed)
            .with_thin_logical_blocks(thin_logical_blocks)
            .with_shared_blocks(self.deduplication))
    }
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            raid_level: RaidLevel::Raid5,
            chunk_size_bytes: crate::layout::geometry::DEFAULT_CHUNK_SIZE_BYTES,
            spare_ppm: crate::layout::geometry::DEFAULT_SPARE_PPM,
            volume_uuid: None,
            force: false,
            compression: crate::layout::format::CompressionSetting::Off,
            logical_size_bytes: None,
            deduplication: false,
            client_write_pairs: true,
        }
    }
}

/// A member as given to `create`/`open`: a name for messages and the device, or `None`
/// when it is missing.
pub struct MemberDevice {
    pub name: String,
    pub device: Option<Arc<dyn BlockDevice>>,
}
