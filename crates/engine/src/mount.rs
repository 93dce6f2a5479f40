//! Mount-time recovery and the full check. The procedure and why it is safe are in
//! docs/crash-consistency.md ("Recovery"); step numbers below refer to it.

use crate::array::members::{Members, ReadPurpose, ReadSource};
use crate::error::{Error, LogInconsistency, LostMetadata, Result};
use crate::index::map::{BlockMap, Mapping};
use crate::layout::format::{self, BatchHeader, DamagedHead, Entry, Summary, NO_SEGMENT};
use crate::layout::geometry::{BlockLocation, Geometry, RaidLevel, Role, BLOCK_SIZE_BYTES};
use crate::space::{SegmentStatus, SegmentUse};
use crate::stats::{Counters, RecoveryReport};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;
use stripelog_blockdev::AlignedBuffer;

/// A batch found on the members, with its summaries.
pub(crate) struct FoundBatch {
    pub header: BatchHeader,
    summaries: Vec<Summary>,
    /// Batch index of each summary block.
    summary_indices: Vec<u32>,
    summary_checksums: Vec<u32>,
}

impl FoundBatch {
    /// The expected checksum of every batch index (summaries, data, padding).
    fn expected_checksums(&self, data_columns: usize) -> Vec<u32> {
        let slots = self.header.row_count as usize * data_columns;
        let mut checksums = vec![format::zero_block_checksum(); slots];
        for (index, entry) in self.data_blocks() {
            if let Entry::Data { checksum, .. } = entry {
                checksums[index as usize] = checksum;
            }
        }
        for (summary, &index) in self.summary_indices.iter().enumerate() {
            checksums[index as usize] = self.summary_checksums[summary];
        }
        checksums
    }

    /// Every entry in order, with the batch index of its data block (`None`: a range).
    fn entries(&self) -> impl Iterator<Item = (Option<u32>, Entry)> + '_ {
        format::batch_entries(self.summaries.iter().zip(self.summary_indices.iter().copied()))
    }

    fn data_blocks(&self) -> impl Iterator<Item = (u32, Entry)> + '_ {
        self.entries().filter_map(|(index, entry)| Some((index?, entry)))
    }

    fn location(&self, geometry: &Geometry, index: u32) -> BlockLocation {
        let data_columns = geometry.data_columns() as u32;
        BlockLocation {
            segment: self.header.segment,
            row: self.header.first_row + index / data_columns,
            column: (index % data_columns) as usize,
        }
    }

    fn position(&self, geometry: &Geometry, index: u32) -> u64 {
        let location = self.location(geometry, index);
        geometry.position(location.segment, location.row, location.column)
    }
}

/// What recovery hands to the volume.
pub(crate) struct Recovered {
    pub map: BlockMap,
    pub rows_on_media: Vec<AtomicU32>,
    pub segments: Vec<SegmentUse>,
    pub last_sequence: u64,
    /// (segment, first row) of every batch found after the end of the log.
    pub discarded: Vec<(u64, u32)>,
    /// Damaged shards of the tail, rebuilt: (member, byte offset, content).
    pub repairs: Vec<(usize, u64, AlignedBuffer)>,
    /// Rows where no batch of the log may start: the head of free segments and the row
    /// after each chain. Zeroed (where anything is there) before new writes.
    pub release: Vec<(u64, u32)>,
    /// The segment of batch `last_sequence`, or `NO_SEGMENT`.
    pub last_segment: u64,
    /// The write clock of the last client batch replayed (0: none known).
    pub write_clock: u64,
    pub report: RecoveryReport,
}

struct Reader<'a> {
    geometry: &'a Geometry,
    members: &'a Members,
    volume_uuid: &'a [u8; 16],
    counters: Counters,
}

impl Reader<'_> {
    /// Read batch index `index` of a batch starting at `first_row` of `segment`, accepted
    /// by `valid`, reconstructing it when needed.
    fn read(&self, location: BlockLocation, valid: &dyn Fn(&[u8]) -> bool, out: &mut [u8]) -> Option<ReadSource> {
        self.members
            .read_verified(self.geometry, &self.counters, location, valid, &|_| None, ReadPurpose::Scan, out)
            .ok()
    }

    /// Follow the batch at `first_row` of `segment`: all its summaries, checked against
    /// each other and the geometry.
    fn read_batch(&self, segment: u64, first_row: u32) -> Option<FoundBatch> {
        let geometry = self.geometry;
        let data_columns = geometry.data_columns() as u32;
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        let uuid = self.volume_uuid;
        let first_valid = |bytes: &[u8]| {
            Summary::decode(bytes, uuid).is_some_and(|summary| {
                let header = summary.header;
                summary.summary_index == 0
                    && header.fits(segment, first_row, geometry.rows_per_chunk(), data_columns)
                    && header.durable_through_sequence < header.sequence
            })
        };
        let location = BlockLocation { segment, row: first_row, column: 0 };
        self.read(location, &first_valid, &mut block)?;
        let first = Summary::decode(&block, uuid)?;
        let header = first.header;
        let mut found = FoundBatch {
            header,
            summary_indices: vec![0],
            summary_checksums: vec![format::block_checksum(&block)],
            summaries: vec![first],
        };
        loop {
            let last = found.summaries.last().expect("at least one");
            let next_index = format::next_summary_index(*found.summary_indices.last().expect("at least one"), last);
            let summary_number = found.summaries.len() as u32;
            if summary_number == header.summary_count {
                return (next_index == header.block_count).then_some(found);
            }
            if next_index >= header.block_count {
                return None;
            }
            let valid = |bytes: &[u8]| {
                Summary::decode(bytes, uuid)
                    .is_some_and(|summary| summary.header == header && summary.summary_index as u32 == summary_number)
            };
            let location = BlockLocation {
                segment,
                row: first_row + next_index / data_columns,
                column: (next_index % data_columns) as usize,
            };
            self.read(location, &valid, &mut block)?;
            found.summary_checksums.push(format::block_checksum(&block));
            found.summaries.push(Summary::decode(&block, uuid)?);
            found.summary_indices.push(next_index);
        }
    }

    /// Step 2: the chain of batches of one segment, and when it has none, what its head
    /// block holds.
    fn scan_segment(&self, segment: u64) -> SegmentScan {
        let mut batches: Vec<FoundBatch> = Vec::new();
        let mut row = 0;
        let mut end = None;
        while row < self.geometry.rows_per_chunk() {
            let Some(batch) = self.read_batch(segment, row) else {
                // No batch starts here: what does (docs/crash-consistency.md)?
                if let Some(first) = batches.first() {
                    end = Some(ChainEnd {
                        row,
                        found: self.classify_row(segment, row),
                        epoch: first.header.epoch,
                        open_sequence: first.header.segment_open_sequence,
                    });
                }
                break;
            };
            let header = batch.header;
            let continues = match batches.first() {
                None => header.sequence == header.segment_open_sequence,
                Some(first) => {
                    header.epoch == first.header.epoch
                        && header.segment_open_sequence == first.header.segment_open_sequence
                        && header.sequence > batches.last().expect("non-empty").header.sequence
                }
            };
            if !continues {
                break;
            }
            row = header.first_row + header.row_count;
            batches.push(batch);
        }
        let head = if batches.is_empty() { self.classify_row(segment, 0) } else { None };
        SegmentScan { batches, head, end }
    }

    /// What the block at column 0 of `row` (where a batch would start: the head of a
    /// segment without a chain, or the row after a chain) holds, as read from the first
    /// present copy; `None` when it can be neither read nor rebuilt from its row (nothing
    /// can be said of it). A block rebuilt from the rest of its row proves less than a
    /// copy: a release whose zeroing a crash tore on another member rebuilds as half a
    /// summary, half garbage. So a rebuilt block that is not zeros counts as `Other`.
    fn classify_row(&self, segment: u64, row: u32) -> Option<DamagedHead> {
        let location = BlockLocation { segment, row, column: 0 };
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        // Any content will do: what it is, is the question.
        let accept_any = |_: &[u8]| true;
        let source = self
            .members
            .read_verified(
                self.geometry,
                &self.counters,
                location,
                &accept_any,
                &|_| None,
                ReadPurpose::Verify,
                &mut block,
            )
            .ok()?;
        Some(match (source, Summary::classify_damaged(&block, self.volume_uuid)) {
            (ReadSource::Direct, found) | (ReadSource::Reconstructed, found @ DamagedHead::Zero) => found,
            (ReadSource::Reconstructed, _) => DamagedHead::Other,
        })
    }

    /// Read every row of a batch: every data block against its checksum (rebuilding it
    /// from the rest of the row when needed), then every member's shard of the row
    /// against what it must hold. Damaged shards that the row can rebuild become repairs.
    fn verify(&self, batch: &FoundBatch) -> Verification {
        let geometry = self.geometry;
        let data_columns = geometry.data_columns();
        let expected = batch.expected_checksums(data_columns);
        let segment = batch.header.segment;
        let mut verification = Verification::default();
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        for row_in_batch in 0..batch.header.row_count {
            let row = batch.header.first_row + row_in_batch;
            let base = row_in_batch as usize * data_columns;
            let mut row_data: Vec<Vec<u8>> = Vec::with_capacity(data_columns);
            let mut row_complete = true;
            for column in 0..data_columns {
                let want = expected[base + column];
                let location = BlockLocation { segment, row, column };
                let checksum_of = |other: usize| Some(expected[base + other]);
                let valid = |bytes: &[u8]| format::checksum_proves(bytes, want);
                verification.blocks_checked += 1;
                match self.members.read_verified(
                    geometry,
                    &self.counters,
                    location,
                    &valid,
                    &checksum_of,
                    ReadPurpose::Verify,
                    &mut block,
                ) {
                    Ok(ReadSource::Direct) => {}
                    Ok(ReadSource::Reconstructed) => verification.blocks_repairable.push((base + column) as u32),
                    Err(_) => {
                        verification.blocks_unrecoverable.push((base + column) as u32);
                        row_complete = false;
                    }
                }
                row_data.push(block.to_vec());
            }
            if row_complete {
                self.compare_shards(segment, row, &row_data, &mut verification);
            }
        }
        verification
    }

    /// Compare what every present member holds for one row with what it must hold.
    fn compare_shards(&self, segment: u64, row: u32, row_data: &[Vec<u8>], verification: &mut Verification) {
        let geometry = self.geometry;
        let offset = geometry.member_offset_bytes(segment, row);
        let mut parity = vec![vec![0u8; BLOCK_SIZE_BYTES]; geometry.parity_shards()];
        {
            let data: Vec<&[u8]> = row_data.iter().map(Vec::as_slice).collect();
            let mut targets: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            crate::array::parity::compute(geometry.raid_level, &data, &mut targets);
        }
        let mut redundancy_bad = false;
        for member in 0..geometry.member_count {
            if self.members.readable(member, segment).is_none() {
                continue;
            }
            let role = geometry.role_of_member(segment, member);
            let must_hold = match role {
                Role::Data { column, .. } => &row_data[column],
                Role::Parity { shard } => &parity[shard],
            };
            let holds = self.members.read_raw(member, offset, &self.counters);
            if holds.as_deref() != Some(must_hold.as_slice()) {
                let is_redundancy = matches!(role, Role::Parity { .. } | Role::Data { copy: 1, .. })
                    || geometry.raid_level == RaidLevel::Raid10;
                redundancy_bad |= is_redundancy;
                let mut repair = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                repair.copy_from_slice(must_hold);
                verification.repairs.push((member, offset, repair));
            }
        }
        if redundancy_bad {
            verification.rows_with_bad_redundancy += 1;
        }
    }
}

struct SegmentScan {
    batches: Vec<FoundBatch>,
    /// For a segment without a chain: what its head block holds.
    head: Option<DamagedHead>,
    /// For a chain that ends before the end of its segment: what the row after it holds.
    end: Option<ChainEnd>,
}

/// Where a segment's chain stops before the end of the segment, and what is there.
#[derive(Clone, Copy, Debug)]
struct ChainEnd {
    row: u32,
    /// `None`: the block cannot be read, nor rebuilt as zeros.
    found: Option<DamagedHead>,
    /// The chain's epoch and segment open sequence (a batch that would continue it has both).
    epoch: u64,
    open_sequence: u64,
}

#[derive(Default)]
struct Verification {
    blocks_checked: u64,
    blocks_repairable: Vec<u32>,
    blocks_unrecoverable: Vec<u32>,
    rows_with_bad_redundancy: u64,
    /// (member, byte offset, content): damaged shards and what they must hold.
    repairs: Vec<(usize, u64, AlignedBuffer)>,
}

/// Steps 2–4: every batch found, by sequence number, and where the log ends.
struct Log {
    batches: BTreeMap<u64, FoundBatch>,
    last_sequence: u64,
    /// Damaged shards of tail batches, to rewrite in place.
    repairs: Vec<(usize, u64, AlignedBuffer)>,
    tail_verified: u64,
    segments_scanned: u64,
    /// The batch after the end of the log, found but with blocks nothing could read.
    ended_at_unreadable_batch: Option<u64>,
}

/// Per segment: the open sequence of its chain, or what its head holds.
#[derive(Clone, Copy, Debug)]
enum SegmentHead {
    Chain { open_sequence: u64 },
    Damaged(Option<DamagedHead>),
}

fn read_log(reader: &Reader, verify_tail: bool, superblock_durable_through: u64) -> Result<Log> {
    let geometry = reader.geometry;
    let mut batches: BTreeMap<u64, FoundBatch> = BTreeMap::new();
    let mut heads = Vec::with_capacity(geometry.segment_count() as usize);
    let mut ends = Vec::new();
    for segment in 0..geometry.segment_count() {
        let scan = reader.scan_segment(segment);
        if let Some(end) = scan.end {
            ends.push((segment, end));
        }
        heads.push(match scan.batches.first() {
            Some(first) => SegmentHead::Chain { open_sequence: first.header.segment_open_sequence },
            None => SegmentHead::Damaged(scan.head),
        });
        for batch in scan.batches {
            let sequence = batch.header.sequence;
            match batches.get(&sequence) {
                Some(other) if other.header.epoch == batch.header.epoch => {
                    return Err(Error::InconsistentLog(LogInconsistency::DuplicateSequence {
                        sequence,
                        first_segment: other.header.segment,
                        second_segment: batch.header.segment,
                    }));
                }
                Some(other) if other.header.epoch > batch.header.epoch => {}
                _ => {
                    batches.insert(sequence, batch);
                }
            }
        }
    }
    let durable = batches
        .values()
        .map(|batch| batch.header.durable_through_sequence)
        .max()
        .unwrap_or(0)
        .max(superblock_durable_through);
    // Sequence numbers grow by one per batch: no real log comes near the top of u64.
    const SEQUENCE_LIMIT: u64 = u64::MAX / 4;
    if durable >= SEQUENCE_LIMIT || batches.keys().next_back().is_some_and(|&last| last >= SEQUENCE_LIMIT) {
        let sequence = durable.max(batches.keys().next_back().copied().unwrap_or(0));
        return Err(Error::InconsistentLog(LogInconsistency::SequenceBeyondLimit { sequence }));
    }
    // The batch at the durable frontier is never released: that takes a later frontier,
    // recorded first (docs/crash-consistency.md). Missing, its metadata was destroyed
    // beyond repair, and the blocks it wrote would read stale: refuse.
    if durable > 0 && !batches.contains_key(&durable) {
        return Err(Error::MetadataLost(LostMetadata::DurableBatchMissing { batch: durable }));
    }
    let mut last_sequence = durable;
    let mut repairs = Vec::new();
    let mut tail_verified = 0;
    let mut ended_at_unreadable_batch = None;
    while let Some(batch) = batches.get(&(last_sequence + 1)) {
        if verify_tail {
            let verification = reader.verify(batch);
            tail_verified += 1;
            if !verification.blocks_unrecoverable.is_empty() {
                // A crash tore it — or, if the last flush made it durable and nothing
                // recorded that yet, damage beyond redundancy struck it: no way to tell.
                ended_at_unreadable_batch = Some(batch.header.sequence);
                break;
            }
            repairs.extend(verification.repairs);
        }
        last_sequence += 1;
    }
    check_predecessors(&batches, &heads, last_sequence)?;
    check_chain_ends(&heads, &ends, last_sequence)?;
    Ok(Log {
        batches,
        last_sequence,
        repairs,
        tail_verified,
        segments_scanned: geometry.segment_count(),
        ended_at_unreadable_batch,
    })
}

/// Every accepted batch names the segment of its predecessor. A predecessor that is not
/// found must have been released with its segment (zeroed head, or a newer chain there);
/// otherwise metadata was lost and the blocks it described cannot be told apart from
/// never-written ones: refuse rather than return zeros for them.
fn check_predecessors(batches: &BTreeMap<u64, FoundBatch>, heads: &[SegmentHead], last_sequence: u64) -> Result<()> {
    if last_sequence < 2 {
        return Ok(());
    }
    for (&sequence, batch) in batches.range(2..=last_sequence) {
        let previous = sequence - 1;
        let segment = batch.header.previous_segment;
        if segment == NO_SEGMENT || batches.contains_key(&previous) {
            continue;
        }
        let lost = match heads.get(segment as usize) {
            None => true,
            // A chain that starts after the predecessor: the segment was reused.
            Some(SegmentHead::Chain { open_sequence }) => *open_sequence <= previous,
            Some(SegmentHead::Damaged(head)) => match head {
                Some(DamagedHead::DamagedSummary { sequence: head_sequence, .. }) => *head_sequence <= last_sequence,
                // A head that cannot be read at all is refused by `check_chain_ends`.
                _ => false,
            },
        };
        if lost {
            return Err(Error::MetadataLost(LostMetadata::PredecessorMissing { batch: previous, segment }));
        }
    }
    Ok(())
}

/// Where a batch of the log could be that no other batch names (its successor in the log
/// was released since): at the head of a segment without a chain, and at the row after a
/// chain. A released segment's head is zeroed and a chain grows only at the row after
/// its end, so what is found there must be zeros, a torn or complete batch after the end
/// of the log, or (after a chain only) stale content of an earlier use of the segment. A
/// damaged summary of the log there (its sequence within the log; after a chain, also its
/// epoch and open sequence), or a head that cannot be read at all, is metadata destroyed
/// beyond repair: refuse rather than serve the blocks it held as stale or zeros.
fn check_chain_ends(heads: &[SegmentHead], ends: &[(u64, ChainEnd)], last_sequence: u64) -> Result<()> {
    for (segment, head) in heads.iter().enumerate() {
        match head {
            SegmentHead::Damaged(None) => {
                return Err(Error::MetadataLost(LostMetadata::UnreadableRow { segment: segment as u64, row: 0 }));
            }
            SegmentHead::Damaged(Some(DamagedHead::DamagedSummary { sequence, .. })) if *sequence <= last_sequence => {
                return Err(Error::MetadataLost(LostMetadata::DamagedSummary {
                    segment: segment as u64,
                    row: 0,
                    batch: *sequence,
                }));
            }
            _ => {}
        }
    }
    for &(segment, end) in ends {
        // A block there that cannot be read proves nothing: stale content of an earlier
        // use of the segment may be what damage made unreadable.
        match end.found {
            Some(DamagedHead::DamagedSummary { sequence, epoch, segment_open_sequence })
                if sequence <= last_sequence && epoch == end.epoch && segment_open_sequence == end.open_sequence =>
            {
                return Err(Error::MetadataLost(LostMetadata::DamagedSummary {
                    segment,
                    row: end.row,
                    batch: sequence,
                }));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Recover the volume's state from its members (steps 2–6).
pub(crate) fn recover(
    geometry: &Geometry,
    members: &Members,
    volume_uuid: &[u8; 16],
    superblock_durable_through: u64,
) -> Result<Recovered> {
    let started = Instant::now();
    let reader = Reader { geometry, members, volume_uuid, counters: Counters::default() };
    let log = read_log(&reader, true, superblock_durable_through)?;
    let logical_blocks = geometry.logical_block_count();
    let map = BlockMap::for_geometry(geometry);
    let rows_on_media: Vec<AtomicU32> = (0..geometry.segment_count()).map(|_| AtomicU32::new(0)).collect();
    let mut segments = vec![
        SegmentUse {
            live_blocks: 0,
            status: SegmentStatus::Free,
            age_clock: 0,
            // The oldest clock of its batches: the minimum over them, from the top.
            opened_clock: u64::MAX,
            stream: 0,
            pinned: false,
            sealed_rows: 0,
        };
        geometry.segment_count() as usize
    ];
    // Replay, taking clocks and streams from the batches' headers (0 where summaries of
    // version 1 do not say): a segment is as old as its oldest batch's clock.
    let mut replayed = 0;
    let mut write_clock = 0;
    for (_, batch) in log.batches.range(..=log.last_sequence) {
        replay(geometry, batch, &map, logical_blocks).map_err(Error::InconsistentLog)?;
        let header = &batch.header;
        rows_on_media[header.segment as usize].fetch_max(header.first_row + header.row_count, Ordering::Relaxed);
        let usage = &mut segments[header.segment as usize];
        usage.opened_clock = usage.opened_clock.min(header.write_clock);
        usage.age_clock = usage.age_clock.max(header.write_clock);
        usage.stream = header.stream;
        write_clock = write_clock.max(header.write_clock);
        replayed += 1;
    }
    let per_segment = geometry.blocks_per_segment();
    for mapping in map.iter() {
        if let Some(segment) = mapping.segment(per_segment) {
            segments[segment as usize].live_blocks += 1;
        }
    }
    for (index, segment) in segments.iter_mut().enumerate() {
        if segment.opened_clock == u64::MAX {
            segment.opened_clock = 0;
        }
        if segment.live_blocks > 0 {
            segment.status = SegmentStatus::Used;
            segment.sealed_rows = rows_on_media[index].load(Ordering::Relaxed);
        } else {
            rows_on_media[index].store(0, Ordering::Relaxed);
        }
    }
    // Where a batch nobody could read may sit (a torn write beyond the log end that a
    // different set of members might rebuild later): the row after each used segment's
    // chain, and row 0 of each free segment. They are zeroed before new writes.
    let mut chain_ends = vec![0u32; geometry.segment_count() as usize];
    for batch in log.batches.values() {
        let end = batch.header.first_row + batch.header.row_count;
        let slot = &mut chain_ends[batch.header.segment as usize];
        *slot = (*slot).max(end);
    }
    let release: Vec<(u64, u32)> = (0..geometry.segment_count())
        .filter_map(|segment| {
            let row =
                if segments[segment as usize].status == SegmentStatus::Free { 0 } else { chain_ends[segment as usize] };
            (row < geometry.rows_per_chunk()).then_some((segment, row))
        })
        .collect();
    let last_segment = log.batches.get(&log.last_sequence).map_or(NO_SEGMENT, |batch| batch.header.segment);
    let discarded: Vec<(u64, u32)> = log
        .batches
        .range(log.last_sequence + 1..)
        .map(|(_, batch)| (batch.header.segment, batch.header.first_row))
        .collect();
    let report = RecoveryReport {
        segments_scanned: log.segments_scanned,
        batches_found: log.batches.len() as u64,
        batches_replayed: replayed,
        tail_batches_verified: log.tail_verified,
        batches_discarded: discarded.len() as u64,
        shards_repaired: log.repairs.len() as u64,
        last_sequence: log.last_sequence,
        ended_at_unreadable_batch: log.ended_at_unreadable_batch,
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok(Recovered {
        map,
        rows_on_media,
        segments,
        last_sequence: log.last_sequence,
        discarded,
        repairs: log.repairs,
        release,
        last_segment,
        write_clock,
        report,
    })
}

/// Apply one batch to the map (step 6).
fn replay(
    geometry: &Geometry,
    batch: &FoundBatch,
    map: &BlockMap,
    logical_blocks: u64,
) -> std::result::Result<(), LogInconsistency> {
    let segment = batch.header.segment;
    for (index, entry) in batch.entries() {
        let (first, count, mapping) = match entry {
            Entry::Data { logical_block, .. } => {
                let index = index.expect("a data entry describes a block");
                (logical_block, 1, Mapping::Data { position: batch.position(geometry, index) })
            }
            Entry::Zero { logical_block, block_count } => {
                (logical_block, block_count as u64, Mapping::Zero { segment })
            }
            Entry::Trim { logical_block, block_count } => {
                (logical_block, block_count as u64, Mapping::Trimmed { segment })
            }
        };
        if first.checked_add(count).is_none_or(|end| end > logical_blocks) {
            return Err(LogInconsistency::EntryBeyondVolume {
                sequence: batch.header.sequence,
                first_block: first,
                block_count: count,
                logical_blocks,
            });
        }
        for logical_block in first..first + count {
            map.set(logical_block, mapping);
        }
    }
    Ok(())
}

/// Steps 4–5 on the media: rewrite the damaged shards of the tail in place, make the
/// batches found after the end of the log unreadable, then flush every member so that
/// both are durable before anything new is written.
pub(crate) fn write_back(
    geometry: &Geometry,
    members: &Members,
    discarded: &[(u64, u32)],
    repairs: &[(usize, u64, AlignedBuffer)],
) -> Result<()> {
    for (member, offset, content) in repairs {
        if let Some(device) = members.writable(*member) {
            device.write_at(content, *offset).or_else(|error| members.write_failed(*member, error))?;
        }
    }
    let zeros = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for &(segment, first_row) in discarded {
        members.write_everywhere(&zeros, &[geometry.member_offset_bytes(segment, first_row)], false)?;
    }
    members.flush_all(false)
}

/// Close every chain: zero, on every member, the rows where a batch beyond the log could
/// sit (head of free segments, row after each chain) wherever any member holds anything
/// there, then flush. Runs after the superblock records the recovered log's end as
/// durable (docs/crash-consistency.md, step 7).
pub(crate) fn release_heads(geometry: &Geometry, members: &Members, release: &[(u64, u32)]) -> Result<()> {
    let zeros = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    let counters = Counters::default();
    let mut written = false;
    for &(segment, row) in release {
        let offset = geometry.member_offset_bytes(segment, row);
        let holds_something = (0..geometry.member_count).any(|member| {
            members.writable(member).is_some()
                && members
                    .read_raw(member, offset, &counters)
                    .is_none_or(|block| !crate::layout::format::is_all_zero(&block))
        });
        if holds_something {
            members.write_everywhere(&zeros, &[offset], false)?;
            written = true;
        }
    }
    if written {
        members.flush_all(false)?;
    }
    Ok(())
}

/// What `check` found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckReport {
    pub segments_scanned: u64,
    pub batches_checked: u64,
    pub blocks_checked: u64,
    /// Damaged blocks that redundancy can still rebuild.
    pub blocks_repairable: u64,
    /// Damaged blocks that cannot be rebuilt, by logical block address (live ones).
    pub logical_blocks_unrecoverable: Vec<u64>,
    /// Damaged blocks that cannot be rebuilt (metadata, padding and dead data included).
    pub blocks_unrecoverable: u64,
    /// Stripe rows whose parity or mirror copy does not match the data.
    pub rows_with_bad_redundancy: u64,
    /// Batches after the end of the log (unflushed writes lost in a crash; not damage).
    pub batches_after_log_end: u64,
    /// Members failed, missing or still rebuilding: the volume is degraded while any are.
    pub members_not_redundant: Vec<usize>,
}

impl CheckReport {
    /// No damage found and every member holds its part: fully redundant.
    pub fn is_clean(&self) -> bool {
        self.blocks_repairable == 0
            && self.blocks_unrecoverable == 0
            && self.rows_with_bad_redundancy == 0
            && self.members_not_redundant.is_empty()
    }
}

/// Verify every batch of the log that still holds live blocks: every block against its
/// checksum, every parity row and mirror copy against the data.
pub(crate) fn check(
    geometry: &Geometry,
    members: &Members,
    volume_uuid: &[u8; 16],
    superblock_durable_through: u64,
    map: &BlockMap,
) -> Result<CheckReport> {
    let reader = Reader { geometry, members, volume_uuid, counters: Counters::default() };
    let log = read_log(&reader, false, superblock_durable_through)?;
    let per_segment = geometry.blocks_per_segment();
    let mut live_segments = vec![false; geometry.segment_count() as usize];
    for mapping in map.iter() {
        if let Some(segment) = mapping.segment(per_segment) {
            live_segments[segment as usize] = true;
        }
    }
    let mut report = CheckReport {
        segments_scanned: log.segments_scanned,
        batches_after_log_end: log.batches.range(log.last_sequence + 1..).count() as u64,
        ..CheckReport::default()
    };
    for batch in log.batches.range(..=log.last_sequence).map(|(_, batch)| batch) {
        if !live_segments[batch.header.segment as usize] {
            continue;
        }
        let verification = reader.verify(batch);
        report.batches_checked += 1;
        report.blocks_checked += verification.blocks_checked;
        report.blocks_repairable += verification.blocks_repairable.len() as u64;
        report.blocks_unrecoverable += verification.blocks_unrecoverable.len() as u64;
        report.rows_with_bad_redundancy += verification.rows_with_bad_redundancy;
        for (index, entry) in batch.data_blocks() {
            if let Entry::Data { logical_block, .. } = entry {
                let live = map.get(logical_block) == (Mapping::Data { position: batch.position(geometry, index) });
                if live && verification.blocks_unrecoverable.contains(&index) {
                    report.logical_blocks_unrecoverable.push(logical_block);
                }
            }
        }
    }
    Ok(report)
}
