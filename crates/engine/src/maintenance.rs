//! Member replacement with an online rebuild, and scrubbing with repair by evacuation
//! (docs/resilience.md).

use crate::array::members::MemberDevice;
use crate::array::members::{MemberState, ReadPurpose};
use crate::cleaner::Cleaner;
use crate::error::{Error, FoundContent, InternalFailure, MemberFailure, MemberProblem, RequestProblem, Result};
use crate::index::checksums::ChecksumTable;
use crate::io::Core;
use crate::layout::format;
use crate::layout::geometry::{BlockLocation, Role, BLOCK_SIZE_BYTES};
use crate::space::SegmentStatus;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use stripelog_blockdev::{AlignedBuffer, IoRequest};

/// Head rows zeroed on a replacement per batch of writes before it is attached.
const HEAD_ROWS_PER_BATCH: usize = 64;

/// How a rebuild or a scrub runs.
#[derive(Clone, Debug, Default)]
pub struct MaintenanceOptions {
    /// At most this many bytes per second read (scrub) or written (rebuild); `None`: as
    /// fast as the members go.
    pub rate_bytes_per_second: Option<u64>,
}

/// How `Volume::replace_member` treats the device
/// it is given.
#[derive(Clone, Debug, Default)]
pub struct ReplaceOptions {
    /// Overwrite a replacement that holds data, a member of another volume, a retired or
    /// failed member of this one. Never a member this volume is using.
    pub force: bool,
}

/// Where a rebuild or scrub is, for progress bars.
#[derive(Clone, Copy, Debug)]
pub struct MaintenanceProgress {
    pub segments_done: u64,
    pub segments_total: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RebuildReport {
    /// Members rebuilt (now active).
    pub members: Vec<usize>,
    pub segments_rebuilt: u64,
    pub bytes_written: u64,
    /// Blocks of the rebuilt members that the rest of their rows could not rebuild
    /// (their reads keep failing; a scrub lists them by address).
    pub blocks_unrecoverable: u64,
    pub seconds: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ScrubReport {
    pub segments_scanned: u64,
    pub blocks_checked: u64,
    pub parity_rows_checked: u64,
    /// Member blocks (data, summaries, padding, parity, mirror copies) found wrong or
    /// unreadable.
    pub blocks_damaged: u64,
    /// Segments with damage whose live blocks were rewritten elsewhere.
    pub segments_repaired: u64,
    /// Live blocks moved out of damaged segments.
    pub blocks_repaired: u64,
    /// Live blocks that redundancy cannot rebuild, by logical block address: they read
    /// as I/O errors.
    pub logical_blocks_unrecoverable: Vec<u64>,
    pub bytes_read: u64,
    pub seconds: f64,
}

/// Segments a rebuild or scrub works on at once (each read from every member, checked and
/// written while the others wait on their I/O), bounded again by
/// [`MAINTENANCE_BUFFER_BYTES_MAXIMUM`].
const MAINTENANCE_WORKERS_MAXIMUM: usize = 8;

/// The most buffer memory the workers of a rebuild or scrub hold together (each holds one
/// chunk per member and one per rebuilt member).
const MAINTENANCE_BUFFER_BYTES_MAXIMUM: usize = 256 << 20;

/// How often the thread that started a parallel walk reports its progress.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// A walk over every segment (rebuild, scrub): kept at or below a byte rate by sleeping,
/// and reported to a progress callback as it goes and at the end.
struct SegmentWalk<'a> {
    progress: &'a dyn Fn(MaintenanceProgress),
    tally: WalkTally,
}

/// What the workers of a walk share: the segments handed out and done, bytes moved.
struct WalkTally {
    started: Instant,
    bytes_per_second: Option<u64>,
    segment_count: u64,
    /// The next segment to hand out.
    next_segment: AtomicU64,
    segments_done: AtomicU64,
    /// Bytes moved so far (read by a scrub, written by a rebuild).
    bytes: AtomicU64,
    /// A worker failed: the others stop at their next segment.
    stopped: AtomicBool,
}

impl WalkTally {
    /// The next segment to work on, once the rate allows (`None`: every segment is taken,
    /// or a worker failed).
    fn take(&self) -> Option<u64> {
        if self.stopped.load(Ordering::Acquire) {
            return None;
        }
        if let Some(rate) = self.bytes_per_second.filter(|&rate| rate > 0) {
            let due = Duration::from_secs_f64(self.bytes.load(Ordering::Acquire) as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let segment = self.next_segment.fetch_add(1, Ordering::AcqRel);
        (segment < self.segment_count).then_some(segment)
    }

    fn done(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        self.segments_done.fetch_add(1, Ordering::AcqRel);
    }

    /// Take segments and `work` on them until none is left or one fails.
    fn work_through<S>(&self, state: &mut S, work: &impl Fn(&mut S, u64) -> Result<u64>) -> Result<()> {
        while let Some(segment) = self.take() {
            match work(state, segment) {
                Ok(bytes) => self.done(bytes),
                Err(error) => {
                    self.stopped.store(true, Ordering::Release);
                    return Err(error);
                }
            }
        }
        Ok(())
    }
}

impl SegmentWalk<'_> {
    fn new<'a>(
        options: &MaintenanceOptions,
        segment_count: u64,
        progress: &'a dyn Fn(MaintenanceProgress),
    ) -> SegmentWalk<'a> {
        SegmentWalk {
            progress,
            tally: WalkTally {
                started: Instant::now(),
                bytes_per_second: options.rate_bytes_per_second,
                segment_count,
                next_segment: AtomicU64::new(0),
                segments_done: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                stopped: AtomicBool::new(false),
            },
        }
    }

    fn report(&self) {
        let tally = &self.tally;
        (self.progress)(MaintenanceProgress {
            segments_done: tally.segments_done.load(Ordering::Acquire).min(tally.segment_count),
            segments_total: tally.segment_count,
            bytes: tally.bytes.load(Ordering::Acquire),
        });
    }

    fn finish(&self) {
        self.tally.segments_done.store(self.tally.segment_count, Ordering::Release);
        self.report();
    }

    /// Run `work` on every segment, each worker with its own `state` (buffers, counts),
    /// and return the workers' states. Several segments at once when the engine's I/O is
    /// threaded (`workers` of them); one after another on the calling thread otherwise, so
    /// that a simulation stays deterministic. `work` returns the bytes it moved.
    fn run<S: Send>(
        &self,
        workers: usize,
        make_state: impl Fn() -> S + Sync,
        work: impl Fn(&mut S, u64) -> Result<u64> + Sync,
    ) -> Result<Vec<S>> {
        let tally = &self.tally;
        if workers <= 1 {
            let mut state = make_state();
            let report_each = |state: &mut S, segment: u64| {
                self.report();
                work(state, segment)
            };
            return tally.work_through(&mut state, &report_each).map(|()| vec![state]);
        }
        let (work, make_state) = (&work, &make_state);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(move || {
                        let mut state = make_state();
                        tally.work_through(&mut state, work).map(|()| state)
                    })
                })
                .collect();
            while !handles.iter().all(|handle| handle.is_finished()) {
                self.report();
                std::thread::sleep(PROGRESS_INTERVAL);
            }
            let mut states = Vec::with_capacity(workers);
            let mut failure = None;
            for handle in handles {
                match handle.join() {
                    Ok(Ok(state)) => states.push(state),
                    Ok(Err(error)) => {
                        failure.get_or_insert(error);
                    }
                    Err(_) => {
                        failure.get_or_insert(Error::Internal(InternalFailure::MaintenanceWorkerPanicked));
                    }
                }
            }
            match failure {
                Some(error) => Err(error),
                None => Ok(states),
            }
        })
    }
}

/// One segment's rows as read from every member. A worker keeps one and reads every
/// segment it takes into the same buffers (fresh ones would cost a page fault per 4 KiB).
struct SegmentRows {
    segment: u64,
    /// One chunk-sized buffer per member.
    buffers: Vec<AlignedBuffer>,
    /// Per member: whether its rows were read (not readable there, skipped, or failed).
    read: Vec<bool>,
    /// Bytes read from each member that was read.
    length_bytes: usize,
}

impl SegmentRows {
    fn new(member_count: usize, chunk_size_bytes: usize) -> SegmentRows {
        SegmentRows {
            segment: 0,
            buffers: (0..member_count).map(|_| AlignedBuffer::zeroed(chunk_size_bytes)).collect(),
            read: vec![false; member_count],
            length_bytes: 0,
        }
    }

    /// The block of `row` as read from `member` (`None`: not read there, or beyond the rows
    /// read; the buffer may hold an earlier segment there).
    fn block(&self, member: usize, row: u32) -> Option<&[u8]> {
        let start = row as usize * BLOCK_SIZE_BYTES;
        (self.read[member] && start + BLOCK_SIZE_BYTES <= self.length_bytes)
            .then(|| &self.buffers[member][start..start + BLOCK_SIZE_BYTES])
    }

    fn bytes_read(&self) -> u64 {
        self.read.iter().filter(|&&read| read).count() as u64 * self.length_bytes as u64
    }
}

/// The verified content of one stripe row and what was wrong with it.
struct VerifiedRow {
    /// One block per data column; zeros where it could not be rebuilt.
    data: Vec<Vec<u8>>,
    /// The row's parity shards computed from `data`.
    parity: Vec<Vec<u8>>,
    /// Data columns that no copy and no reconstruction could produce.
    unrecoverable: Vec<usize>,
    /// Member blocks of the row that were unreadable or wrong (data copies and parity).
    damaged_members: Vec<usize>,
}

/// What one worker of a rebuild keeps from segment to segment.
struct RebuildWorker {
    read: SegmentRows,
    /// One chunk per rebuilt member.
    outputs: Vec<AlignedBuffer>,
    report: RebuildReport,
}

/// What one worker of a scrub keeps from segment to segment.
struct ScrubWorker {
    read: SegmentRows,
    report: ScrubReport,
    damaged_segments: Vec<u64>,
    unrecoverable_positions: Vec<u64>,
}

/// Maintenance of one volume: replacement, rebuild and scrub, over its `Core` and, for
/// the scrub's repairs, its cleaner.
pub(crate) struct Maintenance {
    cleaner: std::sync::Arc<Cleaner>,
    /// One rebuild (or replacement) at a time.
    rebuild_lock: parking_lot::Mutex<()>,
}

impl Maintenance {
    pub(crate) fn new(cleaner: std::sync::Arc<Cleaner>) -> Maintenance {
        Maintenance { cleaner, rebuild_lock: parking_lot::Mutex::new(()) }
    }

    fn core(&self) -> &Core {
        &self.cleaner.core
    }

    /// A segment's status and the rows of it on the members (callers hold the reuse fence,
    /// so that a release cannot change either meanwhile).
    fn segment_status_and_rows(&self, segment: u64) -> (SegmentStatus, u32) {
        let state = self.core().lock_state();
        (state.space().usage(segment).status(), self.core().rows_on_media(segment))
    }

    /// Segments worked on at once: as many as [`MAINTENANCE_WORKERS_MAXIMUM`] and the
    /// buffer bound allow with threaded I/O, one with inline I/O (simulation).
    fn workers(&self, chunks_per_worker: usize) -> usize {
        if self.core().io_mode() != crate::log::IoMode::Threaded {
            return 1;
        }
        let bytes_per_worker = chunks_per_worker.max(1) * self.core().geometry().chunk_size_bytes as usize;
        (MAINTENANCE_BUFFER_BYTES_MAXIMUM / bytes_per_worker).clamp(1, MAINTENANCE_WORKERS_MAXIMUM)
    }

    fn segment_rows(&self) -> SegmentRows {
        SegmentRows::new(self.core().geometry().member_count, self.core().geometry().chunk_size_bytes as usize)
    }

    /// Read rows `[0, rows)` of `segment` from every member readable there, one read each
    /// and all members at once, into `into`.
    fn read_segment_rows(&self, segment: u64, rows: u32, skip: &[usize], into: &mut SegmentRows) {
        let length = rows as usize * BLOCK_SIZE_BYTES;
        let offset = self.core().geometry().member_offset_bytes(segment, 0);
        let read_member = |(member, buffer): (usize, &mut AlignedBuffer)| {
            if skip.contains(&member) {
                return false;
            }
            let Some(device) = self.core().members().readable(member, segment) else {
                return false;
            };
            let result = device.read_at(&mut buffer[..length], offset);
            self.core().members().read_done(member, result, self.core().counters())
        };
        into.segment = segment;
        into.length_bytes = length;
        let parallel = self.core().io_mode() == crate::log::IoMode::Threaded;
        into.read = crate::array::members::for_each_item(into.buffers.iter_mut().enumerate(), parallel, read_member)
            .into_iter()
            .map(|read| read.unwrap_or(false))
            .collect();
    }

    /// The data of one row, every block checked against its CRC32C: a copy that
    /// verifies, else a reconstruction from the row in memory, else the full
    /// `read_verified` (every combination of shards the level allows). Parity and mirror
    /// copies are compared with the verified data.
    /// `table`: the segment's checksums (`None`: its summaries are lost, and no block of
    /// it can be verified).
    fn verify_row(&self, read: &SegmentRows, row: u32, table: Option<&ChecksumTable>) -> VerifiedRow {
        let geometry = &self.core().geometry();
        let segment = read.segment;
        let data_columns = geometry.data_columns();
        let per_segment = geometry.blocks_per_segment();
        let expected: Vec<Option<u32>> = (0..data_columns)
            .map(|column| table.map(|table| table.get(geometry.position(segment, row, column) % per_segment)))
            .collect();
        // A block of `column` is good when it proves the checksum recorded for its place.
        let proves = |column: usize, block: &[u8]| {
            expected[column].is_some_and(|expected| format::checksum_proves(block, expected))
        };
        let mut damaged_members = Vec::new();
        let mut data: Vec<Option<Vec<u8>>> = vec![None; data_columns];
        for (column, slot) in data.iter_mut().enumerate() {
            for member in geometry.members_of_column(segment, column) {
                match read.block(member, row) {
                    Some(block) if proves(column, block) => {
                        slot.get_or_insert_with(|| block.to_vec());
                    }
                    Some(_) => damaged_members.push(member),
                    None if self.core().members().readable(member, segment).is_some() => damaged_members.push(member),
                    None => {}
                }
            }
        }
        let parity: Vec<Option<&[u8]>> = (0..geometry.parity_shards())
            .map(|shard| read.block(geometry.member_of_role(segment, Role::Parity { shard }), row))
            .collect();
        let missing: Vec<usize> = (0..data_columns).filter(|&column| data[column].is_none()).collect();
        for &column in &missing {
            let view: Vec<Option<&[u8]>> = data.iter().map(|block| block.as_deref()).collect();
            let rebuilt = crate::array::parity::reconstruct(geometry.raid_level, &view, &parity, column)
                .filter(|block| proves(column, block));
            data[column] = rebuilt.or_else(|| {
                let mut out = vec![0u8; BLOCK_SIZE_BYTES];
                let location = BlockLocation { segment, row, column };
                let checksum_of = |other: usize| expected[other];
                self.core()
                    .members()
                    .read_verified(
                        geometry,
                        self.core().counters(),
                        location,
                        &|block| proves(column, block),
                        &checksum_of,
                        ReadPurpose::Verify,
                        &mut out,
                    )
                    .ok()
                    .map(|_| out)
            });
        }
        let unrecoverable: Vec<usize> = (0..data_columns).filter(|&column| data[column].is_none()).collect();
        let data: Vec<Vec<u8>> =
            data.into_iter().map(|block| block.unwrap_or_else(|| vec![0u8; BLOCK_SIZE_BYTES])).collect();
        let computed = self.row_parity(&data);
        // Parity against the verified data (only meaningful when every column is known).
        if unrecoverable.is_empty() {
            for (shard, block) in computed.iter().enumerate() {
                let member = geometry.member_of_role(segment, Role::Parity { shard });
                match parity[shard] {
                    Some(held) if held != block.as_slice() => damaged_members.push(member),
                    None if self.core().members().readable(member, segment).is_some() => damaged_members.push(member),
                    _ => {}
                }
            }
        }
        VerifiedRow { data, parity: computed, unrecoverable, damaged_members }
    }

    /// The checksums of the segment in `read`, its summaries taken from the rows read
    /// (rebuilt from their row when their member was not read) where they prove
    /// themselves there, from the members otherwise. `None`: its summaries are lost.
    fn checksum_table(&self, read: &SegmentRows) -> Option<std::sync::Arc<ChecksumTable>> {
        let geometry = &self.core().geometry();
        let from_rows = |position: u64, out: &mut [u8]| {
            let location = geometry.locate(position);
            if location.segment != read.segment {
                return false;
            }
            let row = location.row;
            if let Some(block) = geometry
                .members_of_column(read.segment, location.column)
                .into_iter()
                .find_map(|member| read.block(member, row))
            {
                out.copy_from_slice(block);
                return true;
            }
            let data: Vec<Option<&[u8]>> = (0..geometry.data_columns())
                .map(|column| {
                    geometry
                        .members_of_column(read.segment, column)
                        .into_iter()
                        .find_map(|member| read.block(member, row))
                })
                .collect();
            let parity: Vec<Option<&[u8]>> = (0..geometry.parity_shards())
                .map(|shard| read.block(geometry.member_of_role(read.segment, Role::Parity { shard }), row))
                .collect();
            match crate::array::parity::reconstruct(geometry.raid_level, &data, &parity, location.column) {
                Some(block) => {
                    out.copy_from_slice(&block);
                    true
                }
                None => false,
            }
        };
        self.core().checksum_table_from_rows(read.segment, &from_rows).ok()
    }

    fn row_parity(&self, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut parity = vec![vec![0u8; BLOCK_SIZE_BYTES]; self.core().geometry().parity_shards()];
        let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut targets: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        crate::array::parity::compute(self.core().geometry().raid_level, &views, &mut targets);
        parity
    }

    /// At open, a member found rebuilding (a crash interrupted its rebuild) may be another
    /// device than the one attached: the head rows of the free segments are zeroed on it
    /// again before anything is written, as when it was attached.
    pub(crate) fn prepare_rebuilding_members(&self) -> Result<()> {
        let free: Vec<u64> = {
            let state = self.core().lock_state();
            (0..self.core().geometry().segment_count())
                .filter(|&segment| state.space().usage(segment).status() == SegmentStatus::Free)
                .collect()
        };
        for member in self.core().members().rebuilding() {
            let Some(device) = self.core().members().writable(member) else {
                continue;
            };
            self.zero_head_rows(device.as_ref(), &free)
                .or_else(|error| self.core().members().write_failed(member, error))?;
        }
        Ok(())
    }

    fn zero_head_rows(
        &self,
        device: &dyn stripelog_blockdev::BlockDevice,
        segments: &[u64],
    ) -> stripelog_blockdev::Result<()> {
        let zeros = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        for group in segments.chunks(HEAD_ROWS_PER_BATCH) {
            let mut requests: Vec<IoRequest> = group
                .iter()
                .map(|&segment| IoRequest::Write {
                    buffer: &zeros,
                    offset_bytes: self.core().geometry().member_offset_bytes(segment, 0),
                })
                .collect();
            device.submit_batch(&mut requests).into_iter().collect::<stripelog_blockdev::Result<Vec<()>>>()?;
        }
        device.flush()
    }

    /// Attach `replacement` as member `member`, to be rebuilt (docs/resilience.md,
    /// "Replacement and rebuild", steps 1-2). The rebuild itself is [`Core::rebuild`].
    pub(crate) fn replace_member(
        &self,
        member: usize,
        replacement: MemberDevice,
        options: &ReplaceOptions,
    ) -> Result<()> {
        if self.core().read_only() {
            return Err(Error::ReadOnly);
        }
        if member >= self.core().geometry().member_count {
            return Err(Error::InvalidRequest(RequestProblem::NoSuchMember {
                member,
                member_count: self.core().geometry().member_count,
            }));
        }
        let Some(device) = replacement.device.clone() else {
            return Err(Error::InvalidRequest(RequestProblem::ReplacementMissing { path: replacement.name }));
        };
        let member_error = |problem: MemberProblem| Error::Member { member, path: replacement.name.clone(), problem };
        let device_error = |error: stripelog_blockdev::DeviceError| member_error(MemberProblem::Device(error.into()));
        if device.size_bytes() < self.core().geometry().member_size_bytes {
            return Err(member_error(MemberProblem::TooSmall {
                size_bytes: device.size_bytes(),
                needed_bytes: self.core().geometry().member_size_bytes,
            }));
        }
        // Nothing is written anywhere before the replacement is known to be safe to use.
        self.check_replacement(member, &replacement.name, device.as_ref(), options)?;
        let _rebuild = self.rebuild_lock.try_lock().ok_or(Error::InvalidRequest(RequestProblem::RebuildRunning))?;
        // The replacement's old superblocks go first (a device forced over another volume's
        // member, or an old member of this one): a crash before the attachment then leaves
        // a device with none, which the open takes as the replacement it is.
        let zeros = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        let mut wipes: Vec<IoRequest> = format::SUPERBLOCK_OFFSETS_BYTES
            .iter()
            .map(|&offset_bytes| IoRequest::Write { buffer: &zeros, offset_bytes })
            .collect();
        device
            .submit_batch(&mut wipes)
            .into_iter()
            .chain(std::iter::once(device.flush()))
            .collect::<stripelog_blockdev::Result<Vec<()>>>()
            .map_err(device_error)?;
        if self.core().members().state(member) != MemberState::Failed {
            self.core().members().fail(member, MemberFailure::Replaced { replacement: replacement.name.clone() })?;
        }
        // Nothing old on the replacement may look like a batch: its data area is discarded
        // and the head row of every segment zeroed before anything else is written to it.
        let chunk = self.core().geometry().chunk_size_bytes as u64;
        device.discard(chunk, self.core().geometry().member_size_bytes - chunk).map_err(device_error)?;
        let segments: Vec<u64> = (0..self.core().geometry().segment_count()).collect();
        self.zero_head_rows(device.as_ref(), &segments).map_err(device_error)?;
        self.core().members().attach(member, replacement)
    }

    /// Refuse a replacement that is a member this volume uses (always), or that holds
    /// data, another volume or a retired or failed member of this one (unless forced):
    /// docs/data-safety.md, "Refusing to destroy data".
    fn check_replacement(
        &self,
        member: usize,
        name: &str,
        device: &dyn stripelog_blockdev::BlockDevice,
        options: &ReplaceOptions,
    ) -> Result<()> {
        let refuse = |problem: MemberProblem| Error::Member { member, path: name.to_string(), problem };
        let content =
            crate::array::identity::inspect(device).map_err(|error| refuse(MemberProblem::Device(error.into())))?;
        let found = match &content {
            crate::array::identity::DeviceContent::Empty => return Ok(()),
            crate::array::identity::DeviceContent::Member(found) if found.volume_uuid == *self.core().volume_uuid() => {
                found
            }
            _ if options.force => return Ok(()),
            _ => {
                let found = content.found().expect("the device is not empty");
                return Err(Error::WouldDestroy { member, path: name.to_string(), found });
            }
        };
        let current = self.core().members().superblock();
        let position = current.member_uuids.iter().position(|uuid| *uuid != [0; 16] && *uuid == found.member_uuid);
        let description = match position {
            Some(position) if self.core().members().state(position) != MemberState::Failed => {
                return Err(refuse(MemberProblem::InUse {
                    position,
                    path: self.core().members().name(position),
                    replacing: member,
                }));
            }
            Some(position) => FoundContent::StaleMember { position },
            None => match current.retired_member(&found.member_uuid) {
                Some(retired) => FoundContent::RetiredMember {
                    position: retired.position,
                    retired_unix_seconds: retired.retired_unix_seconds,
                },
                None => FoundContent::EarlierMember { member_index: found.member_index },
            },
        };
        if options.force {
            Ok(())
        } else {
            Err(Error::WouldDestroy { member, path: name.to_string(), found: description })
        }
    }

    /// Rebuild every rebuilding member (docs/resilience.md, steps 3-4).
    pub(crate) fn rebuild(
        &self,
        options: &MaintenanceOptions,
        progress: &dyn Fn(MaintenanceProgress),
    ) -> Result<RebuildReport> {
        let _rebuild = self.rebuild_lock.lock();
        let started = Instant::now();
        let targets = self.core().members().rebuilding();
        let mut report = RebuildReport { members: targets.clone(), ..RebuildReport::default() };
        if targets.is_empty() {
            return Ok(report);
        }
        // Batches sealed before the replacement was attached may have skipped it: they
        // must be on the members (below `rows_on_media`) before the walk reads them.
        self.core().flush_members()?;
        let segment_count = self.core().geometry().segment_count();
        let walk = SegmentWalk::new(options, segment_count, progress);
        let chunk_size_bytes = self.core().geometry().chunk_size_bytes as usize;
        let workers = self.workers(self.core().geometry().member_count + targets.len());
        let make_state = || RebuildWorker {
            read: self.segment_rows(),
            outputs: targets.iter().map(|_| AlignedBuffer::zeroed(chunk_size_bytes)).collect(),
            report: RebuildReport::default(),
        };
        let states =
            walk.run(workers, make_state, |worker, segment| self.rebuild_segment(&targets, segment, worker))?;
        for state in states {
            report.segments_rebuilt += state.report.segments_rebuilt;
            report.bytes_written += state.report.bytes_written;
            report.blocks_unrecoverable += state.report.blocks_unrecoverable;
        }
        // Durable on the new members before the superblocks say they are whole.
        self.core().members().flush_all(self.core().io_mode() == crate::log::IoMode::Threaded)?;
        for &target in &targets {
            if self.core().members().state(target) != MemberState::Rebuilding {
                return Err(Error::RebuildInterrupted { member: target });
            }
        }
        self.core().members().finish_rebuild(&targets)?;
        walk.finish();
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Rebuild `segment` on those of `targets` not yet readable there: read its written
    /// rows from every other member, verify them row by row, write the targets' chunks.
    /// Returns the bytes written.
    fn rebuild_segment(&self, targets: &[usize], segment: u64, worker: &mut RebuildWorker) -> Result<u64> {
        let targets: Vec<usize> = targets
            .iter()
            .copied()
            .filter(|&member| self.core().members().readable(member, segment).is_none())
            .collect();
        if targets.is_empty() {
            return Ok(0);
        }
        self.core().members().check_running()?;
        // No release (and reuse) of the segment while it is rebuilt.
        let _fence = self.core().read_fence();
        let (status, rows) = self.segment_status_and_rows(segment);
        if matches!(status, SegmentStatus::Free | SegmentStatus::Releasing) {
            return Ok(0);
        }
        let mut bytes_written = 0;
        if rows > 0 {
            self.read_segment_rows(segment, rows, &targets, &mut worker.read);
            let length = rows as usize * BLOCK_SIZE_BYTES;
            let table = self.checksum_table(&worker.read);
            for row in 0..rows {
                let verified = self.verify_row(&worker.read, row, table.as_deref());
                worker.report.blocks_unrecoverable += verified.unrecoverable.len() as u64;
                for (index, &target) in targets.iter().enumerate() {
                    let block = match self.core().geometry().role_of_member(segment, target) {
                        Role::Data { column, .. } => &verified.data[column],
                        Role::Parity { shard } => &verified.parity[shard],
                    };
                    let start = row as usize * BLOCK_SIZE_BYTES;
                    worker.outputs[index][start..start + BLOCK_SIZE_BYTES].copy_from_slice(block);
                }
            }
            let offset = self.core().geometry().member_offset_bytes(segment, 0);
            for (index, &target) in targets.iter().enumerate() {
                let Some(device) = self.core().members().writable(target) else {
                    return Err(Error::RebuildInterrupted { member: target });
                };
                device
                    .write_at(&worker.outputs[index][..length], offset)
                    .or_else(|error| self.core().members().write_failed(target, error))?;
                bytes_written += length as u64;
            }
            worker.report.segments_rebuilt += 1;
            worker.report.bytes_written += bytes_written;
        }
        for &target in &targets {
            self.core().members().mark_readable(target, segment);
        }
        Ok(bytes_written)
    }

    /// Read every written row of every segment in use from every member, verify it, and
    /// evacuate the segments that hold damage (docs/resilience.md, "Scrub").
    pub(crate) fn scrub(
        &self,
        options: &MaintenanceOptions,
        progress: &dyn Fn(MaintenanceProgress),
    ) -> Result<ScrubReport> {
        let started = Instant::now();
        let mut report = ScrubReport::default();
        if !self.core().read_only() {
            self.core().flush_members()?;
        }
        let segment_count = self.core().geometry().segment_count();
        let walk = SegmentWalk::new(options, segment_count, progress);
        let workers = self.workers(self.core().geometry().member_count);
        let make_state = || ScrubWorker {
            read: self.segment_rows(),
            report: ScrubReport::default(),
            damaged_segments: Vec::new(),
            unrecoverable_positions: Vec::new(),
        };
        let states = walk.run(workers, make_state, |worker, segment| Ok(self.scrub_segment(segment, worker)))?;
        let mut damaged_segments = Vec::new();
        let mut unrecoverable_positions = Vec::new();
        for state in states {
            report.segments_scanned += state.report.segments_scanned;
            report.bytes_read += state.report.bytes_read;
            report.blocks_checked += state.report.blocks_checked;
            report.parity_rows_checked += state.report.parity_rows_checked;
            report.blocks_damaged += state.report.blocks_damaged;
            damaged_segments.extend(state.damaged_segments);
            unrecoverable_positions.extend(state.unrecoverable_positions);
        }
        // Repairs in segment order, whatever order the workers finished in.
        damaged_segments.sort_unstable();
        // Live blocks at positions nothing can rebuild stay where they are (their reads
        // fail); their segments are kept from the cleaner.
        let mut pinned = Vec::new();
        if !unrecoverable_positions.is_empty() {
            unrecoverable_positions.sort_unstable();
            self.core().map().for_each(|logical_block, mapping| {
                if let Some(position) = mapping.position() {
                    if unrecoverable_positions.binary_search(&position).is_ok() {
                        report.logical_blocks_unrecoverable.push(logical_block);
                        pinned.push(self.core().geometry().locate(position).segment);
                    }
                }
            })?;
        }
        if !self.core().read_only() {
            for segment in damaged_segments {
                let moved = self.evacuate(segment, &pinned)?;
                report.blocks_repaired += moved;
                report.segments_repaired += 1;
            }
            self.core().make_sealed_durable()?;
        }
        report.seconds = started.elapsed().as_secs_f64();
        walk.finish();
        Ok(report)
    }

    /// Read `segment`'s written rows from every member and verify them, if it is in use;
    /// counts go to `worker`. Returns the bytes read.
    fn scrub_segment(&self, segment: u64, worker: &mut ScrubWorker) -> u64 {
        let _fence = self.core().read_fence();
        let (status, rows) = self.segment_status_and_rows(segment);
        if rows == 0 || !matches!(status, SegmentStatus::Used | SegmentStatus::Current) {
            return 0;
        }
        worker.report.segments_scanned += 1;
        self.read_segment_rows(segment, rows, &[], &mut worker.read);
        let bytes_read = worker.read.bytes_read();
        worker.report.bytes_read += bytes_read;
        let mut damaged = false;
        let table = self.checksum_table(&worker.read);
        for row in 0..rows {
            let verified = self.verify_row(&worker.read, row, table.as_deref());
            worker.report.blocks_checked += self.core().geometry().member_count as u64;
            worker.report.parity_rows_checked += (self.core().geometry().parity_shards() > 0) as u64;
            worker.report.blocks_damaged += verified.damaged_members.len() as u64;
            damaged |= !verified.damaged_members.is_empty() || !verified.unrecoverable.is_empty();
            for column in verified.unrecoverable {
                worker.unrecoverable_positions.push(self.core().geometry().position(segment, row, column));
            }
        }
        if damaged {
            worker.damaged_segments.push(segment);
        }
        bytes_read
    }

    /// Move every readable live block of `segment` into new segments (the cleaner's
    /// relocation); a segment holding an unrecoverable live block (`pinned`) is kept from
    /// the cleaner from then on. Returns the blocks moved.
    fn evacuate(&self, segment: u64, pinned: &[u64]) -> Result<u64> {
        let sealed = {
            let mut state = self.core().lock_state_to_write();
            if pinned.contains(&segment) {
                state.space_mut().pin(segment);
            }
            self.core().retire_if_current(&mut state, segment)
        };
        for batch in sealed {
            self.core().dispatch(batch)?;
        }
        self.cleaner.relocate_segment(segment)
    }
}
