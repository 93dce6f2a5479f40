//! Member replacement with an online rebuild, and scrubbing with repair by evacuation
//! (docs/resilience.md).

use crate::array::members::MemberDevice;
use crate::array::members::{MemberState, ReadPurpose};
use crate::cleaner::Cleaner;
use crate::error::{Error, Result};
use crate::index::checksums::ChecksumTable;
use crate::io::Core;
use crate::layout::format;
use crate::layout::geometry::{BlockLocation, Role, BLOCK_SIZE_BYTES};
use crate::space::SegmentStatus;
use serde::Serialize;
use std::sync::atomic::Ordering;
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

/// A walk over every segment (rebuild, scrub): kept at or below a byte rate by sleeping,
/// and reported to a progress callback at every segment and at the end.
struct SegmentWalk<'a> {
    started: Instant,
    bytes_per_second: Option<u64>,
    segment_count: u64,
    progress: &'a dyn Fn(MaintenanceProgress),
}

impl SegmentWalk<'_> {
    fn new<'a>(
        options: &MaintenanceOptions,
        segment_count: u64,
        progress: &'a dyn Fn(MaintenanceProgress),
    ) -> SegmentWalk<'a> {
        SegmentWalk {
            started: Instant::now(),
            bytes_per_second: options.rate_bytes_per_second,
            segment_count,
            progress,
        }
    }

    /// About to do `segment`, with `bytes_so_far` moved: wait as the rate requires, report.
    fn at(&self, segment: u64, bytes_so_far: u64) {
        if let Some(rate) = self.bytes_per_second.filter(|&rate| rate > 0) {
            let due = Duration::from_secs_f64(bytes_so_far as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        self.report(segment, bytes_so_far);
    }

    fn finish(&self, bytes: u64) {
        self.report(self.segment_count, bytes);
    }

    fn report(&self, segments_done: u64, bytes: u64) {
        (self.progress)(MaintenanceProgress { segments_done, segments_total: self.segment_count, bytes });
    }
}

/// One segment's rows as read from every member (`None`: not readable there).
struct SegmentRows {
    segment: u64,
    chunks: Vec<Option<AlignedBuffer>>,
}

impl SegmentRows {
    fn block(&self, member: usize, row: u32) -> Option<&[u8]> {
        let start = row as usize * BLOCK_SIZE_BYTES;
        self.chunks[member].as_ref().map(|chunk| &chunk[start..start + BLOCK_SIZE_BYTES])
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

/// Maintenance of one volume: replacement, rebuild and scrub, over its `Core` and, for
/// the scrub's repairs, its cleaner.
pub(crate) struct Maintenance<'a> {
    core: &'a Core,
    cleaner: &'a Cleaner,
}

impl<'a> Maintenance<'a> {
    pub(crate) fn new(cleaner: &'a Cleaner) -> Maintenance<'a> {
        Maintenance { core: &cleaner.core, cleaner }
    }

    /// A segment's status and the rows of it on the members (callers hold the reuse fence,
    /// so that a release cannot change either meanwhile).
    fn segment_status_and_rows(&self, segment: u64) -> (SegmentStatus, u32) {
        let state = self.core.state.lock();
        (
            state.space.segments[segment as usize].status,
            self.core.rows_on_media[segment as usize].load(Ordering::Acquire),
        )
    }

    /// Read rows `[0, rows)` of `segment` from every member readable there, one read each.
    fn read_segment_rows(&self, segment: u64, rows: u32, skip: &[usize]) -> SegmentRows {
        let length = rows as usize * BLOCK_SIZE_BYTES;
        let offset = self.core.geometry.member_offset_bytes(segment, 0);
        let read_member = |member: usize| {
            if skip.contains(&member) {
                return None;
            }
            let device = self.core.members.readable(member, segment)?;
            let mut chunk = AlignedBuffer::zeroed(length);
            let result = device.read_at(&mut chunk, offset);
            self.core.members.read_done(member, result.as_ref().err(), &self.core.counters);
            result.ok().map(|()| chunk)
        };
        let members: Vec<usize> = (0..self.core.geometry.member_count).collect();
        let parallel = self.core.io_mode == crate::log::IoMode::Threaded;
        let chunks = crate::array::members::for_each_member(&members, parallel, read_member)
            .into_iter()
            .map(Option::flatten)
            .collect();
        SegmentRows { segment, chunks }
    }

    /// The data of one row, every block checked against its CRC32C: a copy that
    /// verifies, else a reconstruction from the row in memory, else the full
    /// `read_verified` (every combination of shards the level allows). Parity and mirror
    /// copies are compared with the verified data.
    /// `table`: the segment's checksums (`None`: its summaries are lost, and no block of
    /// it can be verified).
    fn verify_row(&self, read: &SegmentRows, row: u32, table: Option<&ChecksumTable>) -> VerifiedRow {
        let geometry = &self.core.geometry;
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
                    None if read.chunks[member].is_none() && self.core.members.readable(member, segment).is_some() => {
                        damaged_members.push(member)
                    }
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
                self.core
                    .members
                    .read_verified(
                        geometry,
                        &self.core.counters,
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
                    None if self.core.members.readable(member, segment).is_some() => damaged_members.push(member),
                    _ => {}
                }
            }
        }
        VerifiedRow { data, parity: computed, unrecoverable, damaged_members }
    }

    fn row_parity(&self, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut parity = vec![vec![0u8; BLOCK_SIZE_BYTES]; self.core.geometry.parity_shards()];
        let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut targets: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        crate::array::parity::compute(self.core.geometry.raid_level, &views, &mut targets);
        parity
    }

    /// At open, a member found rebuilding (a crash interrupted its rebuild) may be another
    /// device than the one attached: the head rows of the free segments are zeroed on it
    /// again before anything is written, as when it was attached.
    pub(crate) fn prepare_rebuilding_members(&self) -> Result<()> {
        let free: Vec<u64> = {
            let state = self.core.state.lock();
            (0..self.core.geometry.segment_count())
                .filter(|&segment| state.space.segments[segment as usize].status == SegmentStatus::Free)
                .collect()
        };
        for member in self.core.members.rebuilding() {
            let Some(device) = self.core.members.writable(member) else {
                continue;
            };
            self.zero_head_rows(device.as_ref(), &free)
                .or_else(|error| self.core.members.write_failed(member, error))?;
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
                    offset_bytes: self.core.geometry.member_offset_bytes(segment, 0),
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
        if self.core.read_only {
            return Err(Error::ReadOnly);
        }
        if member >= self.core.geometry.member_count {
            return Err(Error::InvalidRequest(format!(
                "member {member} does not exist (the volume has {})",
                self.core.geometry.member_count
            )));
        }
        let Some(device) = replacement.device.clone() else {
            return Err(Error::InvalidRequest(format!("{}: the replacement is missing", replacement.name)));
        };
        let member_error = |reason: String| Error::Member { member, path: replacement.name.clone(), reason };
        if device.size_bytes() < self.core.geometry.member_size_bytes {
            return Err(member_error(format!(
                "is too small: {} bytes, every member needs {}",
                device.size_bytes(),
                self.core.geometry.member_size_bytes
            )));
        }
        // Nothing is written anywhere before the replacement is known to be safe to use.
        self.check_replacement(member, &replacement.name, device.as_ref(), options)?;
        let _rebuild = self.core.rebuild_lock.try_lock().ok_or_else(|| {
            Error::InvalidRequest("a rebuild is running: replace the member when it has finished".into())
        })?;
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
            .map_err(|error| member_error(error.to_string()))?;
        if self.core.members.state(member) != MemberState::Failed {
            self.core.members.fail(member, &format!("replaced by {}", replacement.name))?;
        }
        // Nothing old on the replacement may look like a batch: its data area is discarded
        // and the head row of every segment zeroed before anything else is written to it.
        let chunk = self.core.geometry.chunk_size_bytes as u64;
        device
            .discard(chunk, self.core.geometry.member_size_bytes - chunk)
            .map_err(|error| member_error(error.to_string()))?;
        let segments: Vec<u64> = (0..self.core.geometry.segment_count()).collect();
        self.zero_head_rows(device.as_ref(), &segments).map_err(|error| member_error(error.to_string()))?;
        self.core.members.attach(member, replacement)
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
        let refuse = |reason: String| Error::Member { member, path: name.to_string(), reason };
        let content = crate::array::identity::inspect(device).map_err(|error| refuse(error.to_string()))?;
        let found = match &content {
            crate::array::identity::DeviceContent::Empty => return Ok(()),
            crate::array::identity::DeviceContent::Member(found) if found.volume_uuid == self.core.volume_uuid => found,
            _ if options.force => return Ok(()),
            _ => return Err(Error::WouldDestroy { member, path: name.to_string(), found: content.describe() }),
        };
        let current = self.core.members.superblock();
        let position = current.member_uuids.iter().position(|uuid| *uuid != [0; 16] && *uuid == found.member_uuid);
        let description = match position {
            Some(position) if self.core.members.state(position) != MemberState::Failed => {
                return Err(refuse(format!(
                    "is member {position} of this volume ({}), in use: it cannot replace member {member} (that \
                     would overwrite it)",
                    self.core.members.name(position)
                )));
            }
            Some(position) => format!("is member {position} of this volume, failed: its content is stale"),
            None => match current.retired_member(&found.member_uuid) {
                Some(retired) => format!(
                    "is a retired member of this volume (member {}, replaced on {})",
                    retired.position,
                    crate::array::identity::format_unix_seconds(retired.retired_unix_seconds)
                ),
                None => format!("holds member {} of this volume from an earlier time", found.member_index),
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
        let _rebuild = self.core.rebuild_lock.lock();
        let started = Instant::now();
        let targets = self.core.members.rebuilding();
        let mut report = RebuildReport { members: targets.clone(), ..RebuildReport::default() };
        if targets.is_empty() {
            return Ok(report);
        }
        // Batches sealed before the replacement was attached may have skipped it: they
        // must be on the members (below `rows_on_media`) before the walk reads them.
        self.core.flush_members()?;
        let segment_count = self.core.geometry.segment_count();
        let walk = SegmentWalk::new(options, segment_count, progress);
        for segment in 0..segment_count {
            walk.at(segment, report.bytes_written);
            let targets: Vec<usize> = targets
                .iter()
                .copied()
                .filter(|&member| self.core.members.readable(member, segment).is_none())
                .collect();
            if targets.is_empty() {
                continue;
            }
            self.core.members.check_running()?;
            // No release (and reuse) of the segment while it is rebuilt.
            let _fence = self.core.reuse_fence.read();
            let (status, rows) = self.segment_status_and_rows(segment);
            if matches!(status, SegmentStatus::Free | SegmentStatus::Releasing) {
                continue;
            }
            if rows > 0 {
                let read = self.read_segment_rows(segment, rows, &targets);
                let length = rows as usize * BLOCK_SIZE_BYTES;
                let mut outputs: Vec<AlignedBuffer> = targets.iter().map(|_| AlignedBuffer::zeroed(length)).collect();
                let table = self.core.checksum_table(segment, None).ok();
                for row in 0..rows {
                    let verified = self.verify_row(&read, row, table.as_deref());
                    report.blocks_unrecoverable += verified.unrecoverable.len() as u64;
                    for (index, &target) in targets.iter().enumerate() {
                        let block = match self.core.geometry.role_of_member(segment, target) {
                            Role::Data { column, .. } => &verified.data[column],
                            Role::Parity { shard } => &verified.parity[shard],
                        };
                        let start = row as usize * BLOCK_SIZE_BYTES;
                        outputs[index][start..start + BLOCK_SIZE_BYTES].copy_from_slice(block);
                    }
                }
                let offset = self.core.geometry.member_offset_bytes(segment, 0);
                for (index, &target) in targets.iter().enumerate() {
                    let Some(device) = self.core.members.writable(target) else {
                        return Err(Error::RebuildInterrupted { member: target });
                    };
                    device
                        .write_at(&outputs[index], offset)
                        .or_else(|error| self.core.members.write_failed(target, error))?;
                    report.bytes_written += length as u64;
                }
                report.segments_rebuilt += 1;
            }
            for &target in &targets {
                self.core.members.mark_readable(target, segment);
            }
        }
        // Durable on the new members before the superblocks say they are whole.
        self.core.members.flush_all(self.core.io_mode == crate::log::IoMode::Threaded)?;
        for &target in &targets {
            if self.core.members.state(target) != MemberState::Rebuilding {
                return Err(Error::RebuildInterrupted { member: target });
            }
        }
        self.core.members.finish_rebuild(&targets)?;
        walk.finish(report.bytes_written);
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
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
        if !self.core.read_only {
            self.core.flush_members()?;
        }
        let segment_count = self.core.geometry.segment_count();
        let walk = SegmentWalk::new(options, segment_count, progress);
        let mut damaged_segments = Vec::new();
        let mut unrecoverable_positions = Vec::new();
        for segment in 0..segment_count {
            walk.at(segment, report.bytes_read);
            let _fence = self.core.reuse_fence.read();
            let (status, rows) = self.segment_status_and_rows(segment);
            if rows == 0 || !matches!(status, SegmentStatus::Used | SegmentStatus::Current) {
                continue;
            }
            report.segments_scanned += 1;
            let read = self.read_segment_rows(segment, rows, &[]);
            report.bytes_read += read.chunks.iter().flatten().map(|chunk| chunk.len() as u64).sum::<u64>();
            let mut damaged = false;
            let table = self.core.checksum_table(segment, None).ok();
            for row in 0..rows {
                let verified = self.verify_row(&read, row, table.as_deref());
                report.blocks_checked += self.core.geometry.member_count as u64;
                report.parity_rows_checked += (self.core.geometry.parity_shards() > 0) as u64;
                report.blocks_damaged += verified.damaged_members.len() as u64;
                damaged |= !verified.damaged_members.is_empty() || !verified.unrecoverable.is_empty();
                for column in verified.unrecoverable {
                    unrecoverable_positions.push(self.core.geometry.position(segment, row, column));
                }
            }
            if damaged {
                damaged_segments.push(segment);
            }
        }
        // Live blocks at positions nothing can rebuild stay where they are (their reads
        // fail); their segments are kept from the cleaner.
        let mut pinned = Vec::new();
        if !unrecoverable_positions.is_empty() {
            unrecoverable_positions.sort_unstable();
            self.core.map.for_each(|logical_block, mapping| {
                if let Some(position) = mapping.position() {
                    if unrecoverable_positions.binary_search(&position).is_ok() {
                        report.logical_blocks_unrecoverable.push(logical_block);
                        pinned.push(self.core.geometry.locate(position).segment);
                    }
                }
            })?;
        }
        if !self.core.read_only {
            for segment in damaged_segments {
                let moved = self.evacuate(segment, &pinned)?;
                report.blocks_repaired += moved;
                report.segments_repaired += 1;
            }
            self.core.make_sealed_durable()?;
        }
        report.seconds = started.elapsed().as_secs_f64();
        walk.finish(report.bytes_read);
        Ok(report)
    }

    /// Move every readable live block of `segment` into new segments (the cleaner's
    /// relocation); a segment holding an unrecoverable live block (`pinned`) is kept from
    /// the cleaner from then on. Returns the blocks moved.
    fn evacuate(&self, segment: u64, pinned: &[u64]) -> Result<u64> {
        {
            let mut state = self.core.state.lock();
            self.core.retire_if_current(&mut state, segment);
            if pinned.contains(&segment) {
                state.space.segments[segment as usize].pinned = true;
            }
        }
        self.cleaner.relocate_segment(segment)
    }
}
