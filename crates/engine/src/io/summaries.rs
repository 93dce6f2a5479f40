//! What a segment's summaries say: every entry of its batches, in log order (the
//! cleaner's and the scrub's reverse information), and the checksum of every position
//! (its table, cached in `index::checksums`, rebuilt from the summaries when evicted).
//! Summaries are read outside the write lock; a segment receiving batches has its table
//! pinned in the cache from the moment it became current.

use super::Core;
use crate::array::members::ReadPurpose;
use crate::error::ReadFailure;
use crate::index::checksums::ChecksumTable;
use crate::layout::format::{self, Entry};
use crate::layout::geometry::{Geometry, BLOCK_SIZE_BYTES};
use std::sync::Arc;
use stripelog_blockdev::AlignedBuffer;

/// A block at a data-space position from what a caller holds in memory (`false`: not
/// there); what it gives must still prove itself.
pub(crate) type BlockSource<'a> = dyn Fn(u64, &mut [u8]) -> bool + 'a;

/// What `Core::for_each_summary` hands each summary to: the summary with its batch index,
/// the CRC32C of its block, and the data-space position of any batch index of its batch.
type SummaryVisitor<'a> = dyn FnMut((&format::Summary, u32), u32, &dyn Fn(u32) -> u64) + 'a;

/// One entry of a segment's summaries, and the data-space position of the block it
/// describes (`None` for range entries).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SegmentEntry {
    pub(crate) entry: Entry,
    pub(crate) position: Option<u64>,
    /// Its batch's write clock (a relocation batch's: the oldest of its blocks).
    pub(crate) write_clock: u64,
}

impl Core {
    /// Every entry of the batches sealed into `segment`, in log order: what each of its
    /// positions holds (the per-segment reverse information, read from its summaries).
    /// Callers hold the reuse fence, so that the segment is not released meanwhile.
    /// `Err`: a summary can be neither read nor rebuilt.
    pub(crate) fn segment_entries(&self, segment: u64) -> std::result::Result<Vec<SegmentEntry>, ReadFailure> {
        let sealed_rows = self.lock_state().space().usage(segment).sealed_rows();
        let mut entries = Vec::new();
        self.for_each_summary(segment, sealed_rows, None, &mut |summary, _, position_of| {
            for (index, entry) in format::batch_entries(std::iter::once(summary)) {
                entries.push(SegmentEntry {
                    entry,
                    position: index.map(position_of),
                    write_clock: summary.0.header.write_clock,
                });
            }
        })?;
        Ok(entries)
    }

    /// The table of a segment receiving batches (pinned in the cache from the moment it
    /// became current).
    pub(super) fn current_table(&self, segment: u64) -> Arc<ChecksumTable> {
        self.checksums.get(segment).unwrap_or_else(|| {
            let table = Arc::new(ChecksumTable::new(self.geometry.blocks_per_segment()));
            self.checksums.insert(segment, table.clone(), true);
            table
        })
    }

    /// The checksums of every position of `segment`: cached, or built from its summaries
    /// (read from the members: never under the write lock). Callers hold the reuse fence;
    /// `Err`: a summary can be neither read nor rebuilt, so nothing in the segment can be
    /// verified.
    pub(crate) fn checksum_table(&self, segment: u64) -> std::result::Result<Arc<ChecksumTable>, ReadFailure> {
        if let Some(table) = self.checksums.get(segment) {
            return Ok(table);
        }
        crate::write_lock::assert_not_held("rebuilding a checksum table");
        let sealed_rows = self.lock_state().space().usage(segment).sealed_rows();
        let table = Arc::new(self.load_checksum_table(segment, sealed_rows, None)?);
        self.checksums.insert(segment, table.clone(), false);
        Ok(table)
    }

    /// [`Core::checksum_table`] for a caller that has read the segment's rows already (a
    /// rebuild, a scrub): its summaries are taken from `rows` (the block at a data-space
    /// position, `false`: not there) when they prove themselves there, and read from the
    /// members only when not. The table is not cached: a walk over every segment would
    /// evict the tables client reads use.
    pub(crate) fn checksum_table_from_rows(
        &self,
        segment: u64,
        rows: &BlockSource,
    ) -> std::result::Result<Arc<ChecksumTable>, ReadFailure> {
        if let Some(table) = self.checksums.get(segment) {
            return Ok(table);
        }
        let sealed_rows = self.lock_state().space().usage(segment).sealed_rows();
        Ok(Arc::new(self.load_checksum_table(segment, sealed_rows, Some(rows))?))
    }

    /// The checksum of every position of `segment`, from its summaries: the CRC of each
    /// data block its entry records, of each summary block as read, and of zeros for
    /// padding.
    fn load_checksum_table(
        &self,
        segment: u64,
        sealed_rows: u32,
        rows: Option<&BlockSource>,
    ) -> std::result::Result<ChecksumTable, ReadFailure> {
        let table = ChecksumTable::new(self.geometry.blocks_per_segment());
        self.for_each_summary(segment, sealed_rows, rows, &mut |summary, checksum, position_of| {
            self.record_summary_checksums(&table, summary, checksum, position_of)
        })?;
        Ok(table)
    }

    /// Put in `table` what one summary proves: its own block's checksum, the CRC32C of
    /// every data block its entries record, and, after a batch's last summary, the zero
    /// block's for the batch's padding.
    pub(crate) fn record_summary_checksums(
        &self,
        table: &ChecksumTable,
        (summary, index): (&format::Summary, u32),
        checksum: u32,
        position_of: &dyn Fn(u32) -> u64,
    ) {
        let per_segment = self.geometry.blocks_per_segment();
        table.set(position_of(index) % per_segment, checksum);
        for (data_index, entry) in format::batch_entries(std::iter::once((summary, index))) {
            // (A further fragment's checksum is its decompressed block's, not its
            // packed block's: the packed block's is its `Packed` entry's.)
            if let (Some(data_index), Some(checksum)) = (data_index, entry.block_checksum()) {
                table.set(position_of(data_index) % per_segment, checksum);
            }
        }
        let header = summary.header;
        if summary.summary_index as u32 + 1 == header.summary_count {
            let zero = format::zero_block_checksum();
            for padding in header.block_count..header.row_count * self.geometry.data_columns() as u32 {
                table.set(position_of(padding) % per_segment, zero);
            }
        }
    }

    /// Walk the batches sealed into `segment` (rows `[0, sealed_rows)`) and hand every
    /// summary to `visit`, in log order, with its batch index, its block's CRC32C, and the
    /// data-space position of any batch index of its batch. Summaries prove themselves
    /// (their own CRC32C, this volume, this segment and row, or the batch's first header)
    /// or are rebuilt from their stripe row; `Err` when one can be neither read nor rebuilt.
    fn for_each_summary(
        &self,
        segment: u64,
        sealed_rows: u32,
        rows: Option<&BlockSource>,
        visit: &mut SummaryVisitor,
    ) -> std::result::Result<(), ReadFailure> {
        let mut walk = SummaryWalk::new(segment, sealed_rows);
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        while let Some(position) = walk.next_position(&self.geometry) {
            let valid = |bytes: &[u8]| walk.expects(bytes, &self.volume_uuid, &self.geometry);
            if !rows.is_some_and(|rows| rows(position, &mut block) && valid(&block)) {
                self.read_self_verifying(position, &valid, &mut block)?;
            }
            let summary = format::Summary::decode(&block, &self.volume_uuid).ok_or(ReadFailure::BeyondRedundancy)?;
            visit((&summary, walk.index), format::block_checksum(&block), &|index| {
                walk.position_of(&self.geometry, index)
            });
            walk.advance(&summary);
        }
        Ok(())
    }

    /// Read a block that proves itself (`valid`) at `position`: from memory, else from the
    /// members, rebuilt from its row when no copy is valid.
    fn read_self_verifying(
        &self,
        position: u64,
        valid: &dyn Fn(&[u8]) -> bool,
        out: &mut [u8],
    ) -> std::result::Result<(), ReadFailure> {
        if let super::Lookup::Served = self.position_from_memory(position, out, None) {
            if valid(out) {
                return Ok(());
            }
        }
        let location = self.geometry.locate(position);
        self.members
            .read_verified(&self.geometry, &self.counters, location, valid, &|_| None, ReadPurpose::Verify, out)
            .map(|_| ())
    }
}

/// Where a walk over the batches sealed into a segment stands: each batch's summaries
/// are found one after the other (each says where the next is), so the walk reads the
/// summary it expects next, checks it (`expects`), and moves on (`advance`).
pub(crate) struct SummaryWalk {
    segment: u64,
    sealed_rows: u32,
    /// The first row of the batch being walked.
    row: u32,
    /// The batch index of the summary expected next, and its number in its batch.
    index: u32,
    number: u32,
    /// The header of the batch's first summary, which every other one repeats.
    first: Option<format::BatchHeader>,
}

impl SummaryWalk {
    /// A walk over the rows `[0, sealed_rows)` of `segment`.
    pub(crate) fn new(segment: u64, sealed_rows: u32) -> SummaryWalk {
        SummaryWalk { segment, sealed_rows, row: 0, index: 0, number: 0, first: None }
    }

    /// The data-space position of the summary expected next; `None` once every batch is
    /// walked.
    pub(crate) fn next_position(&self, geometry: &Geometry) -> Option<u64> {
        (self.row < self.sealed_rows).then(|| self.position_of(geometry, self.index))
    }

    /// The data-space position of batch index `index` of the batch being walked.
    pub(crate) fn position_of(&self, geometry: &Geometry, index: u32) -> u64 {
        let data_columns = geometry.data_columns() as u32;
        geometry.position(self.segment, self.row + index / data_columns, (index % data_columns) as usize)
    }

    /// Whether `bytes` is the summary the walk expects next: it proves itself (its own
    /// CRC32C and this volume), has the number expected, and repeats its batch's first
    /// header (or, for a batch's first, has a header that fits this segment and row).
    pub(crate) fn expects(&self, bytes: &[u8], volume_uuid: &[u8; 16], geometry: &Geometry) -> bool {
        format::Summary::decode(bytes, volume_uuid).is_some_and(|summary| {
            let header = summary.header;
            summary.summary_index as u32 == self.number
                && match self.first {
                    Some(first) => header == first,
                    None => header.fits(self.segment, self.row, self.sealed_rows, geometry.data_columns() as u32),
                }
        })
    }

    /// Move past `summary`, the one expected (checked with `expects`).
    pub(crate) fn advance(&mut self, summary: &format::Summary) {
        assert_eq!(summary.summary_index as u32, self.number, "the walk moves past the summary it expects");
        let (row, index) = (self.row, self.index);
        let header = *self.first.get_or_insert(summary.header);
        self.number += 1;
        let next = format::next_summary_index(self.index, summary);
        if self.number >= header.summary_count || next >= header.block_count {
            self.row = header.first_row + header.row_count;
            self.index = 0;
            self.number = 0;
            self.first = None;
        } else {
            self.index = next;
        }
        assert!(self.row > row || (self.row == row && self.index > index), "a summary walk always moves forward");
    }

    /// The batch index of the summary expected next.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }
}
