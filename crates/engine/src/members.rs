//! The members of a volume: creating and checking their superblocks, flushing them, and
//! reading one block with verification and reconstruction from redundancy.

use crate::error::{Error, Result};
use crate::format::{Superblock, SuperblockProblem, SUPERBLOCK_OFFSETS_BYTES};
use crate::geometry::{BlockLocation, Geometry, Role, BLOCK_SIZE_BYTES};
use crate::parity;
use crate::stats::{Counters, MemberStatus};
use crate::volume::{CreateOptions, MemberDevice};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use stripelog_blockdev::{AlignedBuffer, BlockDevice};

pub(crate) struct Members {
    /// Members present but left out because an earlier epoch recorded them as failed.
    pub(crate) excluded: Vec<usize>,
    names: Vec<String>,
    devices: Vec<Option<Arc<dyn BlockDevice>>>,
    bytes_written: Vec<AtomicU64>,
}

impl Members {
    pub(crate) fn new(members: Vec<MemberDevice>) -> Members {
        let bytes_written = members.iter().map(|_| AtomicU64::new(0)).collect();
        let (names, devices) = members.into_iter().map(|member| (member.name, member.device)).unzip();
        Members { excluded: Vec::new(), names, devices, bytes_written }
    }

    pub(crate) fn device(&self, member: usize) -> Option<&Arc<dyn BlockDevice>> {
        self.devices[member].as_ref()
    }

    pub(crate) fn name(&self, member: usize) -> &str {
        &self.names[member]
    }

    pub(crate) fn count(&self) -> usize {
        self.devices.len()
    }

    pub(crate) fn missing(&self) -> Vec<usize> {
        (0..self.count()).filter(|&member| self.devices[member].is_none()).collect()
    }

    /// Account `bytes` written to every present member (one batch).
    pub(crate) fn count_written(&self, bytes: u64) {
        for (member, counter) in self.bytes_written.iter().enumerate() {
            if self.devices[member].is_some() {
                Counters::add(counter, bytes);
            }
        }
    }

    pub(crate) fn statuses(&self) -> Vec<MemberStatus> {
        (0..self.count())
            .map(|member| MemberStatus {
                index: member,
                name: self.names[member].clone(),
                present: self.devices[member].is_some(),
                description: match &self.devices[member] {
                    Some(device) => device.describe(),
                    None if self.excluded.contains(&member) => {
                        "excluded: recorded as failed, it missed writes (replace it)".to_string()
                    }
                    None => "missing".to_string(),
                },
                bytes_written: Counters::get(&self.bytes_written[member]),
            })
            .collect()
    }

    fn device_error(&self, member: usize, source: stripelog_blockdev::DeviceError) -> Error {
        Error::Member { member, path: self.names[member].clone(), reason: source.to_string() }
    }

    /// Flush every present member, in parallel when `parallel`.
    pub(crate) fn flush_all(&self, parallel: bool) -> Result<()> {
        let flush_one = |member: usize| match &self.devices[member] {
            Some(device) => device.flush().map_err(|error| self.device_error(member, error)),
            None => Ok(()),
        };
        if !parallel {
            return (0..self.count()).try_for_each(flush_one);
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..self.count()).map(|member| scope.spawn(move || flush_one(member))).collect();
            handles
                .into_iter()
                .try_for_each(|handle| handle.join().unwrap_or(Err(Error::Failed("flush thread panicked".into()))))
        })
    }

    /// Write `block` at `offset_bytes` on every present member.
    pub(crate) fn write_everywhere(&self, block: &AlignedBuffer, offset_bytes: u64) -> Result<()> {
        for member in 0..self.count() {
            if let Some(device) = &self.devices[member] {
                device.write_at(block, offset_bytes).map_err(|error| self.device_error(member, error))?;
            }
        }
        Ok(())
    }

    /// Read one member block raw; `None` when the member is missing or the read fails.
    pub(crate) fn read_raw(&self, member: usize, offset_bytes: u64, counters: &Counters) -> Option<AlignedBuffer> {
        let device = self.devices[member].as_ref()?;
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        match device.read_at(&mut block, offset_bytes) {
            Ok(()) => Some(block),
            Err(_) => {
                Counters::add(&counters.read_errors, 1);
                None
            }
        }
    }

    /// Read the block at `location` into `out`: directly (any copy) when `valid` accepts
    /// it, else rebuilt from the rest of its row. `checksum_of(column)` gives the checksum
    /// of another data column of the row, when known, to pick trustworthy shards.
    /// With `zero_means_unwritten` (scanning for summaries), a block that reads back as all
    /// zeros is unwritten space, not damage: no reconstruction is attempted (bit rot
    /// cannot zero a block; recovery's own destruction of a batch writes zeros).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_verified(
        &self,
        geometry: &Geometry,
        counters: &Counters,
        location: BlockLocation,
        valid: &dyn Fn(&[u8]) -> bool,
        checksum_of: &dyn Fn(usize) -> Option<u32>,
        zero_means_unwritten: bool,
        out: &mut [u8],
    ) -> std::result::Result<ReadSource, String> {
        let offset = geometry.member_offset_bytes(location.segment, location.row);
        let mut every_copy_unwritten = true;
        for member in geometry.members_of_column(location.segment, location.column) {
            if let Some(block) = self.read_raw(member, offset, counters) {
                if valid(&block) {
                    out.copy_from_slice(&block);
                    return Ok(ReadSource::Direct);
                }
                every_copy_unwritten &= crate::volume::is_all_zero(&block);
                if !(zero_means_unwritten && every_copy_unwritten) {
                    Counters::add(&counters.checksum_mismatches, 1);
                }
            } else {
                every_copy_unwritten = false;
            }
        }
        if zero_means_unwritten && every_copy_unwritten {
            return Err("never written".into());
        }
        if geometry.parity_shards() == 0 {
            return Err("no copy of the block is readable and correct, and the RAID level has no parity".into());
        }
        let data_columns = geometry.data_columns();
        let data: Vec<Option<AlignedBuffer>> = (0..data_columns)
            .map(|column| {
                if column == location.column {
                    return None;
                }
                let member = geometry.member_of_role(location.segment, Role::Data { column, copy: 0 });
                let block = self.read_raw(member, offset, counters)?;
                match checksum_of(column) {
                    Some(expected) if crate::format::block_checksum(&block) != expected => {
                        Counters::add(&counters.checksum_mismatches, 1);
                        None
                    }
                    _ => Some(block),
                }
            })
            .collect();
        let parity: Vec<Option<AlignedBuffer>> = (0..geometry.parity_shards())
            .map(|shard| {
                let member = geometry.member_of_role(location.segment, Role::Parity { shard });
                self.read_raw(member, offset, counters)
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
                    return Ok(ReadSource::Reconstructed);
                }
            }
        }
        Err("the block is damaged and the rest of its stripe row cannot rebuild it".into())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadSource {
    Direct,
    Reconstructed,
}

fn now_unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

/// Write the superblocks of a new volume on every member.
pub(crate) fn create(members: &[MemberDevice], options: &CreateOptions) -> Result<()> {
    let mut smallest = u64::MAX;
    for (index, member) in members.iter().enumerate() {
        let device = member.device.as_ref().ok_or_else(|| Error::Member {
            member: index,
            path: member.name.clone(),
            reason: "is missing: every member must be present to create a volume".into(),
        })?;
        smallest = smallest.min(device.size_bytes());
    }
    if members.is_empty() {
        return Err(Error::InvalidGeometry("no members given".into()));
    }
    let geometry =
        Geometry::new(options.raid_level, members.len(), options.chunk_size_bytes, options.spare_ppm, smallest)?;
    let volume_uuid = options.volume_uuid.unwrap_or_else(|| *uuid::Uuid::new_v4().as_bytes());
    let created_unix_seconds = now_unix_seconds();
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for (index, member) in members.iter().enumerate() {
        let device = member.device.as_ref().expect("checked above");
        let member_error = |error: stripelog_blockdev::DeviceError| Error::Member {
            member: index,
            path: member.name.clone(),
            reason: error.to_string(),
        };
        // Tell the device the old content is garbage (advisory; makes files sparse).
        let data_start = geometry.chunk_size_bytes as u64;
        device.discard(data_start, geometry.member_size_bytes - data_start).map_err(member_error)?;
        for (copy, offset) in SUPERBLOCK_OFFSETS_BYTES.iter().enumerate() {
            let superblock = Superblock {
                copy: copy as u32,
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
    for (index, member) in members.iter().enumerate() {
        let Some(device) = &member.device else {
            found.push(None);
            continue;
        };
        found.push(Some(read_superblock(index, &member.name, device.as_ref())?));
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
        .ok_or_else(|| Error::TooManyFailures { level: "any level".into(), reason: "no member is present".into() })?;
    // The geometry is the one most of those members describe (so that an odd member is
    // the one blamed), and its newest superblock is the reference.
    let mut geometry_votes: Vec<(crate::geometry::Geometry, usize)> = Vec::new();
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
        .max_by_key(|superblock| superblock.epoch)
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
    let uuid_text = uuid::Uuid::from_bytes(volume_uuid);
    if reference.member_count as usize != members.len() {
        return Err(Error::InvalidRequest(format!(
            "volume {uuid_text} has {} members but {} were given",
            reference.member_count,
            members.len()
        )));
    }
    for (index, superblock) in found.iter().enumerate() {
        let Some(superblock) = superblock else {
            continue;
        };
        let name = members[index].name.clone();
        let problem = |reason: String| Error::Member { member: index, path: name.clone(), reason };
        if superblock.volume_uuid != volume_uuid {
            return Err(problem(format!(
                "belongs to another volume ({}), not to {uuid_text}",
                uuid::Uuid::from_bytes(superblock.volume_uuid)
            )));
        }
        if superblock.member_index as usize != index {
            return Err(problem(format!(
                "is member {} of this volume, given in position {index}: give the members in their original order",
                superblock.member_index
            )));
        }
        if superblock.geometry() != reference.geometry() {
            return Err(problem("its superblock describes a different geometry from the other members".into()));
        }
        let size = members[index].device.as_ref().expect("present").size_bytes();
        if size < reference.member_size_bytes {
            return Err(problem(format!(
                "is truncated: {size} bytes, the volume needs {} bytes on every member",
                reference.member_size_bytes
            )));
        }
    }
    // Members the newest superblock records as failed missed writes: keep them out.
    let mut members = members;
    let mut excluded = Vec::new();
    for index in 0..members.len() {
        if found[index].is_some() && reference.failed_members & (1 << index) != 0 {
            found[index] = None;
            members[index].device = None;
            excluded.push(index);
        }
    }
    let missing = found.iter().filter(|superblock| superblock.is_none()).count();
    let tolerated = reference.raid_level.failures_tolerated();
    let geometry = reference.geometry();
    // RAID-10 mirrors are fixed pairs (2i, 2i+1): it survives any losses that leave one
    // member of every pair; the other levels survive `tolerated` losses.
    let survivable = if geometry.raid_level == crate::geometry::RaidLevel::Raid10 {
        (0..members.len() / 2).all(|pair| found[2 * pair].is_some() || found[2 * pair + 1].is_some())
    } else {
        missing <= tolerated
    };
    if !survivable {
        let names: Vec<String> = (0..members.len())
            .filter(|&index| found[index].is_none())
            .map(|index| members[index].name.clone())
            .collect();
        return Err(Error::TooManyFailures {
            level: reference.raid_level.to_string(),
            reason: format!("missing {}: {}; it survives {tolerated}", missing, names.join(", ")),
        });
    }
    let mut opened = Members::new(members);
    opened.excluded = excluded;
    Ok((opened, reference))
}

fn read_superblock(index: usize, name: &str, device: &dyn BlockDevice) -> Result<Superblock> {
    let mut problems = Vec::new();
    let mut best: Option<Superblock> = None;
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for (copy, offset) in SUPERBLOCK_OFFSETS_BYTES.iter().enumerate() {
        if device.size_bytes() < offset + BLOCK_SIZE_BYTES as u64 {
            problems.push(format!("copy {copy}: the member is too small to hold it"));
            continue;
        }
        if let Err(error) = device.read_at(&mut block, *offset) {
            problems.push(format!("copy {copy}: {error}"));
            continue;
        }
        match Superblock::decode(&block, copy as u32) {
            Ok(superblock) => {
                let newer = |current: &Superblock| {
                    (superblock.epoch, superblock.durable_through_sequence)
                        > (current.epoch, current.durable_through_sequence)
                };
                if best.as_ref().is_none_or(newer) {
                    best = Some(superblock);
                }
            }
            Err(problem) => problems.push(format!(
                "copy {copy}: {}",
                match problem {
                    SuperblockProblem::NotStripelog => "not a stripelog superblock".to_string(),
                    SuperblockProblem::UnsupportedVersion(version) =>
                        format!("format version {version} is not supported"),
                    SuperblockProblem::BadChecksum => "checksum mismatch (damaged)".to_string(),
                    SuperblockProblem::Inconsistent(reason) => format!("inconsistent ({reason})"),
                }
            )),
        }
    }
    best.ok_or_else(|| Error::Member {
        member: index,
        path: name.to_string(),
        reason: format!("has no valid stripelog superblock: {}", problems.join("; ")),
    })
}

/// Record a new open epoch on every present member, with the members now missing added
/// to the failed set and the recovered log's end as durable, before any batch of the new
/// epoch is written. Returns the new superblock.
pub(crate) fn advance_epoch(
    members: &Members,
    reference: &Superblock,
    durable_through_sequence: u64,
) -> Result<Superblock> {
    let failed_members =
        reference.failed_members | members.missing().iter().fold(0u64, |bits, &member| bits | 1 << member);
    let superblock = Superblock {
        epoch: reference.epoch + 1,
        failed_members,
        durable_through_sequence: durable_through_sequence.max(reference.durable_through_sequence),
        ..reference.clone()
    };
    write_superblocks(members, &superblock)?;
    Ok(superblock)
}

/// Write `superblock` (per member: its index; both copies) to every present member:
/// copy 0 everywhere, flush, then copy 1, flush.
pub(crate) fn write_superblocks(members: &Members, superblock: &Superblock) -> Result<()> {
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for (copy, offset) in SUPERBLOCK_OFFSETS_BYTES.iter().enumerate() {
        for member in 0..members.count() {
            let Some(device) = members.device(member) else {
                continue;
            };
            Superblock { copy: copy as u32, member_index: member as u32, ..superblock.clone() }.encode(&mut block);
            device.write_at(&block, *offset).map_err(|error| members.device_error(member, error))?;
        }
        members.flush_all(false)?;
    }
    Ok(())
}
