//! The codec of the checkpoint's blocks: index pages, directory pages, segment table pages
//! and the checkpoint root (docs/on-disk-format.md, "Checkpoint blocks"). Each is
//! one 4096-byte block written in the log like a data block; each names its magic, its
//! version, the volume, its place and the checkpoint generation that wrote it, and ends
//! with a CRC32C of the rest, so that a block from another volume, another place or an
//! older checkpoint is never taken for the one a pointer names.

use crate::layout::format::{checksum_matches, put, read_u16, read_u32, read_u64, read_uuid, seal};
use crate::layout::geometry::BLOCK_SIZE_BYTES;

/// Version of every checkpoint block written by this code.
pub const CHECKPOINT_BLOCK_VERSION: u16 = 1;
pub const INDEX_PAGE_MAGIC: &[u8; 8] = b"SLINDEX\0";
pub const DIRECTORY_PAGE_MAGIC: &[u8; 8] = b"SLIDIR\0\0";
pub const SEGMENT_TABLE_PAGE_MAGIC: &[u8; 8] = b"SLSEGT\0\0";
pub const CHECKPOINT_ROOT_MAGIC: &[u8; 8] = b"SLCKPT\0\0";
pub const SHARED_TABLE_PAGE_MAGIC: &[u8; 8] = b"SLSHARE\0";
pub const NAME_TABLE_PAGE_MAGIC: &[u8; 8] = b"SLNAMES\0";

/// Bytes of bit-packed entries in an index page (from offset 64 to the checksum).
pub const INDEX_PAGE_PAYLOAD_BYTES: usize = BLOCK_SIZE_BYTES - HEADER_BYTES - 4;
/// Pointers in a directory page: 12 bytes each.
pub const DIRECTORY_FANOUT: usize = 335;
/// Segment records in a segment table page: 28 bytes each.
pub const SEGMENT_RECORDS_PER_PAGE: usize = 143;
/// Pointers of each tree the root holds.
pub const ROOT_TOP_POINTERS: usize = 64;
/// Stream positions the root records (clients, three relocation streams, metadata).
pub const ROOT_STREAMS: usize = 5;

const HEADER_BYTES: usize = 64;
const POINTER_BYTES: usize = 12;
const SEGMENT_RECORD_BYTES: usize = 28;
const CHECKSUM_OFFSET: usize = BLOCK_SIZE_BYTES - 4;

/// Where a checkpoint block is, and the CRC32C it must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagePointer {
    /// Data-space position.
    pub position: u64,
    pub checksum: u32,
}

fn put_pointer(block: &mut [u8], offset: usize, pointer: Option<PagePointer>) {
    if let Some(pointer) = pointer {
        put(block, offset, &(pointer.position + 1).to_le_bytes());
        put(block, offset + 8, &pointer.checksum.to_le_bytes());
    }
}

fn read_pointer(block: &[u8], offset: usize) -> Option<PagePointer> {
    let position = read_u64(block, offset);
    (position != 0).then(|| PagePointer { position: position - 1, checksum: read_u32(block, offset + 8) })
}

/// The common header: magic, version, two type-specific bytes (10, 11), the volume,
/// a number saying which page it is (32) and the generation (40).
fn encode_header(
    block: &mut [u8],
    magic: &[u8; 8],
    bytes_10_11: [u8; 2],
    uuid: &[u8; 16],
    number: u64,
    generation: u64,
) {
    block[..BLOCK_SIZE_BYTES].fill(0);
    put(block, 0, magic);
    put(block, 8, &CHECKPOINT_BLOCK_VERSION.to_le_bytes());
    put(block, 10, &bytes_10_11);
    put(block, 16, uuid);
    put(block, 32, &number.to_le_bytes());
    put(block, 40, &generation.to_le_bytes());
}

/// (bytes 10 and 11, number, generation) of a valid block of this kind and volume.
fn decode_header(block: &[u8], magic: &[u8; 8], uuid: &[u8; 16]) -> Option<([u8; 2], u64, u64)> {
    (block.len() >= BLOCK_SIZE_BYTES
        && &block[0..8] == magic
        && read_u16(block, 8) == CHECKPOINT_BLOCK_VERSION
        && read_uuid(block, 16) == *uuid
        && checksum_matches(block))
    .then(|| ([block[10], block[11]], read_u64(block, 32), read_u64(block, 40)))
}

/// An index page: the entries of logical blocks `page_number × E …`, bit-packed
/// little-endian at `entry_width_bits` each (`E = INDEX_PAGE_PAYLOAD_BYTES × 8 / w`).
pub fn encode_index_page(
    block: &mut [u8],
    uuid: &[u8; 16],
    page_number: u64,
    generation: u64,
    entry_width_bits: u8,
    entries: &[u8],
) {
    assert!(entries.len() <= INDEX_PAGE_PAYLOAD_BYTES, "an index page holds {INDEX_PAGE_PAYLOAD_BYTES} bytes");
    encode_header(block, INDEX_PAGE_MAGIC, [entry_width_bits, 0], uuid, page_number, generation);
    put(block, HEADER_BYTES, entries);
    seal(block);
}

/// (page number, generation, entry width, the packed entries) of a valid index page.
pub fn decode_index_page<'a>(block: &'a [u8], uuid: &[u8; 16]) -> Option<(u64, u64, u8, &'a [u8])> {
    let ([width, _], page_number, generation) = decode_header(block, INDEX_PAGE_MAGIC, uuid)?;
    Some((page_number, generation, width, &block[HEADER_BYTES..HEADER_BYTES + INDEX_PAGE_PAYLOAD_BYTES]))
}

/// Which radix tree a directory page belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tree {
    Index = 0,
    SegmentTable = 1,
    /// The shared-block table of deduplication (docs/deduplication.md).
    SharedTable = 2,
    /// Deduplication's name index (docs/deduplication.md, "The persistent name index").
    NameTable = 3,
}

/// A directory page: pointers to the pages of the level below (level 1: index or segment
/// table pages), `DIRECTORY_FANOUT` of them from `first_page` on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryPage {
    pub tree: Tree,
    pub level: u8,
    /// The first page number (of the level below) it covers.
    pub first_page: u64,
    pub generation: u64,
    /// At most `DIRECTORY_FANOUT`; `None`: never written (all unmapped, or all free).
    pub pointers: Vec<Option<PagePointer>>,
}

impl DirectoryPage {
    pub fn encode(&self, block: &mut [u8], uuid: &[u8; 16]) {
        assert!(self.pointers.len() <= DIRECTORY_FANOUT && self.level >= 1);
        encode_header(
            block,
            DIRECTORY_PAGE_MAGIC,
            [self.level, self.tree as u8],
            uuid,
            self.first_page,
            self.generation,
        );
        for (index, pointer) in self.pointers.iter().enumerate() {
            put_pointer(block, HEADER_BYTES + index * POINTER_BYTES, *pointer);
        }
        seal(block);
    }

    pub fn decode(block: &[u8], uuid: &[u8; 16]) -> Option<DirectoryPage> {
        let ([level, tree], first_page, generation) = decode_header(block, DIRECTORY_PAGE_MAGIC, uuid)?;
        let tree = match tree {
            0 => Tree::Index,
            1 => Tree::SegmentTable,
            2 => Tree::SharedTable,
            3 => Tree::NameTable,
            _ => return None,
        };
        if level == 0 {
            return None;
        }
        let pointers =
            (0..DIRECTORY_FANOUT).map(|index| read_pointer(block, HEADER_BYTES + index * POINTER_BYTES)).collect();
        Some(DirectoryPage { tree, level, first_page, generation, pointers })
    }
}

/// One segment's record in a segment table page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentRecord {
    pub live_units: u32,
    /// 0 free, 1 used, 2 current, 3 waiting for its death to be durable, 4 reserved.
    pub status: u8,
    pub stream: u8,
    pub pinned: bool,
    pub age_clock: u64,
    pub opened_clock: u64,
    /// Rows its sealed batches occupy.
    pub sealed_rows: u32,
}

/// A page of the segment table: records of segments `first_segment …`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentTablePage {
    pub first_segment: u64,
    pub generation: u64,
    /// At most `SEGMENT_RECORDS_PER_PAGE`.
    pub records: Vec<SegmentRecord>,
}

impl SegmentTablePage {
    pub fn encode(&self, block: &mut [u8], uuid: &[u8; 16]) {
        assert!(self.records.len() <= SEGMENT_RECORDS_PER_PAGE);
        encode_header(block, SEGMENT_TABLE_PAGE_MAGIC, [0, 0], uuid, self.first_segment, self.generation);
        for (index, record) in self.records.iter().enumerate() {
            let offset = HEADER_BYTES + index * SEGMENT_RECORD_BYTES;
            put(block, offset, &record.live_units.to_le_bytes());
            block[offset + 4] = record.status;
            block[offset + 5] = record.stream;
            block[offset + 6] = record.pinned as u8;
            put(block, offset + 8, &record.age_clock.to_le_bytes());
            put(block, offset + 16, &record.opened_clock.to_le_bytes());
            put(block, offset + 24, &record.sealed_rows.to_le_bytes());
        }
        seal(block);
    }

    /// Every record slot of the page (the caller knows how many segments exist).
    pub fn decode(block: &[u8], uuid: &[u8; 16]) -> Option<SegmentTablePage> {
        let (_, first_segment, generation) = decode_header(block, SEGMENT_TABLE_PAGE_MAGIC, uuid)?;
        let mut records = Vec::with_capacity(SEGMENT_RECORDS_PER_PAGE);
        for index in 0..SEGMENT_RECORDS_PER_PAGE {
            let offset = HEADER_BYTES + index * SEGMENT_RECORD_BYTES;
            if block[offset + 6] > 1 || block[offset + 7] != 0 {
                return None;
            }
            records.push(SegmentRecord {
                live_units: read_u32(block, offset),
                status: block[offset + 4],
                stream: block[offset + 5],
                pinned: block[offset + 6] == 1,
                age_clock: read_u64(block, offset + 8),
                opened_clock: read_u64(block, offset + 16),
                sealed_rows: read_u32(block, offset + 24),
            });
        }
        Some(SegmentTablePage { first_segment, generation, records })
    }
}

/// A page of the shared-block table: records `first_record …`, each 8 bytes (low 56 bits
/// the copy's position + 1, 0 free; top 8 bits the reference count), as
/// `space::shared::SharedRecord` packs them.
pub fn encode_shared_table_page(block: &mut [u8], uuid: &[u8; 16], page_number: u64, generation: u64, records: &[u64]) {
    assert!(records.len() <= SHARED_RECORDS_PER_PAGE);
    encode_header(block, SHARED_TABLE_PAGE_MAGIC, [0, 0], uuid, page_number, generation);
    for (index, record) in records.iter().enumerate() {
        put(block, HEADER_BYTES + index * 8, &record.to_le_bytes());
    }
    seal(block);
}

/// (page number, generation, its [`SHARED_RECORDS_PER_PAGE`] packed records) of a valid
/// shared table page.
pub fn decode_shared_table_page(block: &[u8], uuid: &[u8; 16]) -> Option<(u64, u64, Vec<u64>)> {
    let (_, page_number, generation) = decode_header(block, SHARED_TABLE_PAGE_MAGIC, uuid)?;
    let records = (0..SHARED_RECORDS_PER_PAGE).map(|index| read_u64(block, HEADER_BYTES + index * 8)).collect();
    Some((page_number, generation, records))
}

/// A page of deduplication's name index (docs/deduplication.md): the slots of buckets
/// `page_number × 62 …`, 8 bytes each (a 28-bit tag and a 36-bit logical block + 1; 0
/// empty); byte 10 holds the sampling bits of the table that wrote it.
pub fn encode_name_table_page(
    block: &mut [u8],
    uuid: &[u8; 16],
    page_number: u64,
    generation: u64,
    sampling_bits: u8,
    slots: &[u64],
) {
    assert!(slots.len() <= NAME_SLOTS_PER_PAGE);
    encode_header(block, NAME_TABLE_PAGE_MAGIC, [sampling_bits, 0], uuid, page_number, generation);
    put(block, 12, &(slots.len() as u16).to_le_bytes());
    for (index, slot) in slots.iter().enumerate() {
        put(block, HEADER_BYTES + index * 8, &slot.to_le_bytes());
    }
    seal(block);
}

/// (page number, generation, sampling bits, its slots) of a valid name table page.
pub fn decode_name_table_page(block: &[u8], uuid: &[u8; 16]) -> Option<(u64, u64, u8, Vec<u64>)> {
    let ([sampling_bits, _], page_number, generation) = decode_header(block, NAME_TABLE_PAGE_MAGIC, uuid)?;
    let count = read_u16(block, 12) as usize;
    if count > NAME_SLOTS_PER_PAGE {
        return None;
    }
    let slots = (0..count).map(|index| read_u64(block, HEADER_BYTES + index * 8)).collect();
    Some((page_number, generation, sampling_bits, slots))
}

/// Slots in a name table page (62 buckets of 8 slots).
pub const NAME_SLOTS_PER_PAGE: usize = 496;

/// Records in a shared table page: 8 bytes each.
pub const SHARED_RECORDS_PER_PAGE: usize = (BLOCK_SIZE_BYTES - HEADER_BYTES - 4) / 8;

/// Where a stream was at the checkpoint, and where it goes on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamPosition {
    /// Its current segment (`None`: none open).
    pub current_segment: Option<u64>,
    /// The row its next batch starts at in the current segment.
    pub next_row: u32,
    /// Its reserved successor (`None`: none yet).
    pub reserved_segment: Option<u64>,
}

/// The checkpoint root: what the superblocks name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointRoot {
    pub generation: u64,
    /// Every batch up to this sequence is reflected in the pages the root names.
    pub sequence: u64,
    pub write_clock: u64,
    pub durable_through_sequence: u64,
    pub streams: [StreamPosition; ROOT_STREAMS],
    pub index_tree_depth: u8,
    pub segment_tree_depth: u8,
    /// At most `ROOT_TOP_POINTERS` each.
    pub index_top: Vec<Option<PagePointer>>,
    pub segment_top: Vec<Option<PagePointer>>,
    /// The segment of batch `sequence` (the next batch names it as its predecessor's).
    pub last_segment: u64,
    /// The volume's epoch when the snapshot was taken: every batch a stream wrote after it
    /// has this epoch or a later one (older batches in free segments are stale).
    pub epoch: u64,
    /// The map's entries that are data, and zero records, at `sequence` (mount does not
    /// read every index page to count them).
    pub data_blocks: u64,
    pub zero_blocks: u64,
    /// Entries that are fragments and the sixteenths they take (zero before compression).
    pub fragment_blocks: u64,
    pub fragment_sixteenths: u64,
    /// Entries that name shared-block records (zero without deduplication).
    pub shared_blocks: u64,
    /// The shared-block table's tree (depth 0 and no pointer: no page).
    pub shared_tree_depth: u8,
    pub shared_top: Vec<Option<PagePointer>>,
    /// Deduplication's name index: the slots and sampling bits of the table its pages were
    /// cut from (0 slots: none), and its tree.
    pub name_slots: u64,
    pub name_sampling_bits: u8,
    pub name_tree_depth: u8,
    pub name_top: Vec<Option<PagePointer>>,
}

const ROOT_STREAMS_OFFSET: usize = 64;
const ROOT_STREAM_BYTES: usize = 24;
const ROOT_DEPTHS_OFFSET: usize = 184;
const ROOT_INDEX_TOP_OFFSET: usize = 192;
const ROOT_SEGMENT_TOP_OFFSET: usize = ROOT_INDEX_TOP_OFFSET + ROOT_TOP_POINTERS * POINTER_BYTES;
const NONE_SEGMENT: u64 = u64::MAX;
/// After the lifetime counters' reserved area (1728, 24 × 8).
const ROOT_LAST_SEGMENT_OFFSET: usize = 1920;
/// After the counts (1920 … 1968): the shared-block count, the shared tree's depth and
/// its top pointers (zeros in roots written before deduplication: no shared table).
const ROOT_SHARED_BLOCKS_OFFSET: usize = 1968;
const ROOT_SHARED_DEPTH_OFFSET: usize = 1976;
const ROOT_SHARED_TOP_OFFSET: usize = 1984;
/// After the shared tree (2752): the name index's slots, sampling bits, tree depth and
/// top pointers (zeros in roots written before it: no name pages).
const ROOT_NAME_SLOTS_OFFSET: usize = ROOT_SHARED_TOP_OFFSET + ROOT_TOP_POINTERS * POINTER_BYTES;
const ROOT_NAME_SAMPLING_OFFSET: usize = ROOT_NAME_SLOTS_OFFSET + 8;
const ROOT_NAME_DEPTH_OFFSET: usize = ROOT_NAME_SAMPLING_OFFSET + 1;
const ROOT_NAME_TOP_OFFSET: usize = ROOT_NAME_SLOTS_OFFSET + 16;

impl CheckpointRoot {
    pub fn encode(&self, block: &mut [u8], uuid: &[u8; 16]) {
        assert!(self.index_top.len() <= ROOT_TOP_POINTERS && self.segment_top.len() <= ROOT_TOP_POINTERS);
        encode_header(block, CHECKPOINT_ROOT_MAGIC, [0, 0], uuid, self.generation, self.sequence);
        put(block, 48, &self.write_clock.to_le_bytes());
        put(block, 56, &self.durable_through_sequence.to_le_bytes());
        for (index, stream) in self.streams.iter().enumerate() {
            let offset = ROOT_STREAMS_OFFSET + index * ROOT_STREAM_BYTES;
            put(block, offset, &stream.current_segment.unwrap_or(NONE_SEGMENT).to_le_bytes());
            put(block, offset + 8, &stream.next_row.to_le_bytes());
            put(block, offset + 16, &stream.reserved_segment.unwrap_or(NONE_SEGMENT).to_le_bytes());
        }
        block[ROOT_DEPTHS_OFFSET] = self.index_tree_depth;
        block[ROOT_DEPTHS_OFFSET + 1] = self.segment_tree_depth;
        for (index, pointer) in self.index_top.iter().enumerate() {
            put_pointer(block, ROOT_INDEX_TOP_OFFSET + index * POINTER_BYTES, *pointer);
        }
        for (index, pointer) in self.segment_top.iter().enumerate() {
            put_pointer(block, ROOT_SEGMENT_TOP_OFFSET + index * POINTER_BYTES, *pointer);
        }
        put(block, ROOT_LAST_SEGMENT_OFFSET, &self.last_segment.to_le_bytes());
        put(block, ROOT_LAST_SEGMENT_OFFSET + 8, &self.epoch.to_le_bytes());
        put(block, ROOT_LAST_SEGMENT_OFFSET + 16, &self.data_blocks.to_le_bytes());
        put(block, ROOT_LAST_SEGMENT_OFFSET + 24, &self.zero_blocks.to_le_bytes());
        put(block, ROOT_LAST_SEGMENT_OFFSET + 32, &self.fragment_blocks.to_le_bytes());
        put(block, ROOT_LAST_SEGMENT_OFFSET + 40, &self.fragment_sixteenths.to_le_bytes());
        assert!(self.shared_top.len() <= ROOT_TOP_POINTERS);
        put(block, ROOT_SHARED_BLOCKS_OFFSET, &self.shared_blocks.to_le_bytes());
        block[ROOT_SHARED_DEPTH_OFFSET] = self.shared_tree_depth;
        for (index, pointer) in self.shared_top.iter().enumerate() {
            put_pointer(block, ROOT_SHARED_TOP_OFFSET + index * POINTER_BYTES, *pointer);
        }
        assert!(self.name_top.len() <= ROOT_TOP_POINTERS);
        put(block, ROOT_NAME_SLOTS_OFFSET, &self.name_slots.to_le_bytes());
        block[ROOT_NAME_SAMPLING_OFFSET] = self.name_sampling_bits;
        block[ROOT_NAME_DEPTH_OFFSET] = self.name_tree_depth;
        for (index, pointer) in self.name_top.iter().enumerate() {
            put_pointer(block, ROOT_NAME_TOP_OFFSET + index * POINTER_BYTES, *pointer);
        }
        seal(block);
    }

    pub fn decode(block: &[u8], uuid: &[u8; 16]) -> Option<CheckpointRoot> {
        let (_, generation, sequence) = decode_header(block, CHECKPOINT_ROOT_MAGIC, uuid)?;
        if generation == 0 {
            // The first checkpoint committed is generation 1: this block is no root.
            return None;
        }
        let segment = |value: u64| (value != NONE_SEGMENT).then_some(value);
        let streams = std::array::from_fn(|index| {
            let offset = ROOT_STREAMS_OFFSET + index * ROOT_STREAM_BYTES;
            StreamPosition {
                current_segment: segment(read_u64(block, offset)),
                next_row: read_u32(block, offset + 8),
                reserved_segment: segment(read_u64(block, offset + 16)),
            }
        });
        let pointers = |start: usize| -> Vec<Option<PagePointer>> {
            (0..ROOT_TOP_POINTERS).map(|index| read_pointer(block, start + index * POINTER_BYTES)).collect()
        };
        Some(CheckpointRoot {
            generation,
            sequence,
            write_clock: read_u64(block, 48),
            durable_through_sequence: read_u64(block, 56),
            streams,
            index_tree_depth: block[ROOT_DEPTHS_OFFSET],
            segment_tree_depth: block[ROOT_DEPTHS_OFFSET + 1],
            index_top: pointers(ROOT_INDEX_TOP_OFFSET),
            segment_top: pointers(ROOT_SEGMENT_TOP_OFFSET),
            last_segment: read_u64(block, ROOT_LAST_SEGMENT_OFFSET),
            epoch: read_u64(block, ROOT_LAST_SEGMENT_OFFSET + 8),
            data_blocks: read_u64(block, ROOT_LAST_SEGMENT_OFFSET + 16),
            zero_blocks: read_u64(block, ROOT_LAST_SEGMENT_OFFSET + 24),
            fragment_blocks: read_u64(block, ROOT_LAST_SEGMENT_OFFSET + 32),
            fragment_sixteenths: read_u64(block, ROOT_LAST_SEGMENT_OFFSET + 40),
            shared_blocks: read_u64(block, ROOT_SHARED_BLOCKS_OFFSET),
            shared_tree_depth: block[ROOT_SHARED_DEPTH_OFFSET],
            shared_top: pointers(ROOT_SHARED_TOP_OFFSET),
            name_slots: read_u64(block, ROOT_NAME_SLOTS_OFFSET),
            name_sampling_bits: block[ROOT_NAME_SAMPLING_OFFSET],
            name_tree_depth: block[ROOT_NAME_DEPTH_OFFSET],
            name_top: pointers(ROOT_NAME_TOP_OFFSET),
        })
    }
}

/// Radix tree depth for `pages` leaf pages: the smallest `d` with
/// `ROOT_TOP_POINTERS × DIRECTORY_FANOUT^d ≥ pages` (0: the root points at the leaves).
pub fn tree_depth(pages: u64) -> u8 {
    let mut depth = 0u8;
    let mut covered = ROOT_TOP_POINTERS as u128;
    while covered < pages as u128 {
        covered *= DIRECTORY_FANOUT as u128;
        depth += 1;
    }
    depth
}

const _: () = assert!(HEADER_BYTES + DIRECTORY_FANOUT * POINTER_BYTES <= CHECKSUM_OFFSET);
const _: () = assert!(HEADER_BYTES + SEGMENT_RECORDS_PER_PAGE * SEGMENT_RECORD_BYTES <= CHECKSUM_OFFSET);
const _: () = assert!(ROOT_SEGMENT_TOP_OFFSET + ROOT_TOP_POINTERS * POINTER_BYTES <= CHECKSUM_OFFSET);
const _: () = assert!(ROOT_NAME_TOP_OFFSET + ROOT_TOP_POINTERS * POINTER_BYTES <= CHECKSUM_OFFSET);
const _: () = assert!(HEADER_BYTES + NAME_SLOTS_PER_PAGE * 8 <= CHECKSUM_OFFSET);
const _: () = assert!(ROOT_STREAMS_OFFSET + ROOT_STREAMS * ROOT_STREAM_BYTES <= ROOT_DEPTHS_OFFSET);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UUID: [u8; 16] = [5; 16];

    fn pointer() -> impl Strategy<Value = Option<PagePointer>> {
        proptest::option::of(
            (0u64..u64::MAX - 1, any::<u32>()).prop_map(|(position, checksum)| PagePointer { position, checksum }),
        )
    }

    /// Every flipped bit is caught, and another volume's block is not taken.
    fn assert_damage_detected<T: PartialEq + std::fmt::Debug>(
        block: &[u8],
        decode: impl Fn(&[u8], &[u8; 16]) -> Option<T>,
        flip: usize,
    ) {
        assert!(decode(block, &[6; 16]).is_none(), "another volume's block");
        let mut damaged = block.to_vec();
        damaged[flip / 8] ^= 1 << (flip % 8);
        assert!(decode(&damaged, &UUID).is_none(), "bit {flip} flipped undetected");
    }

    proptest! {
        #[test]
        fn index_pages_round_trip(page in any::<u64>(), generation in any::<u64>(), width in 16u8..64,
                                  entries in proptest::collection::vec(any::<u8>(), INDEX_PAGE_PAYLOAD_BYTES),
                                  flip in 0usize..BLOCK_SIZE_BYTES * 8) {
            let mut block = vec![0u8; BLOCK_SIZE_BYTES];
            encode_index_page(&mut block, &UUID, page, generation, width, &entries);
            let (decoded_page, decoded_generation, decoded_width, payload) = decode_index_page(&block, &UUID).unwrap();
            prop_assert_eq!((decoded_page, decoded_generation, decoded_width), (page, generation, width));
            prop_assert_eq!(payload, &entries[..]);
            assert_damage_detected(&block, |block, uuid| decode_index_page(block, uuid).map(|(p, g, w, e)| (p, g, w, e.to_vec())), flip);
        }

        #[test]
        fn directory_pages_round_trip(level in 1u8..8, first_page in any::<u64>(), generation in any::<u64>(),
                                      pointers in proptest::collection::vec(pointer(), DIRECTORY_FANOUT),
                                      flip in 0usize..BLOCK_SIZE_BYTES * 8) {
            let page = DirectoryPage { tree: Tree::SegmentTable, level, first_page, generation, pointers };
            let mut block = vec![0u8; BLOCK_SIZE_BYTES];
            page.encode(&mut block, &UUID);
            prop_assert_eq!(DirectoryPage::decode(&block, &UUID), Some(page));
            assert_damage_detected(&block, DirectoryPage::decode, flip);
        }

        #[test]
        fn segment_table_pages_round_trip(first_segment in any::<u64>(), generation in any::<u64>(),
                                          records in proptest::collection::vec(
                                              (any::<u32>(), 0u8..5, 0u8..5, any::<bool>(), any::<u64>(), any::<u64>(), any::<u32>()),
                                              SEGMENT_RECORDS_PER_PAGE),
                                          flip in 0usize..BLOCK_SIZE_BYTES * 8) {
            let records = records.into_iter().map(|(live_units, status, stream, pinned, age_clock, opened_clock, sealed_rows)| {
                SegmentRecord { live_units, status, stream, pinned, age_clock, opened_clock, sealed_rows }
            }).collect();
            let page = SegmentTablePage { first_segment, generation, records };
            let mut block = vec![0u8; BLOCK_SIZE_BYTES];
            page.encode(&mut block, &UUID);
            prop_assert_eq!(SegmentTablePage::decode(&block, &UUID), Some(page));
            assert_damage_detected(&block, SegmentTablePage::decode, flip);
        }

        #[test]
        fn shared_table_pages_round_trip(page_number in any::<u64>(), generation in any::<u64>(),
                                         records in proptest::collection::vec(any::<u64>(), SHARED_RECORDS_PER_PAGE),
                                         flip in 0usize..BLOCK_SIZE_BYTES * 8) {
            let mut block = vec![0u8; BLOCK_SIZE_BYTES];
            encode_shared_table_page(&mut block, &UUID, page_number, generation, &records);
            prop_assert_eq!(decode_shared_table_page(&block, &UUID), Some((page_number, generation, records)));
            assert_damage_detected(&block, decode_shared_table_page, flip);
        }

        #[test]
        fn name_table_pages_round_trip(page_number in any::<u64>(), generation in any::<u64>(), bits in any::<u8>(),
                                       slots in proptest::collection::vec(any::<u64>(), 0..=NAME_SLOTS_PER_PAGE),
                                       flip in 0usize..BLOCK_SIZE_BYTES * 8) {
            let mut block = vec![0u8; BLOCK_SIZE_BYTES];
            encode_name_table_page(&mut block, &UUID, page_number, generation, bits, &slots);
            prop_assert_eq!(decode_name_table_page(&block, &UUID), Some((page_number, generation, bits, slots)));
            assert_damage_detected(&block, decode_name_table_page, flip);
        }

        #[test]
        fn roots_round_trip(generation in 1u64.., sequence in any::<u64>(), clock in any::<u64>(),
                            segments in proptest::collection::vec((proptest::option::of(0u64..u64::MAX), any::<u32>(),
                                                                   proptest::option::of(0u64..u64::MAX)), ROOT_STREAMS),
                            index_top in proptest::collection::vec(pointer(), ROOT_TOP_POINTERS),
                            segment_top in proptest::collection::vec(pointer(), ROOT_TOP_POINTERS),
                            shared_top in proptest::collection::vec(pointer(), ROOT_TOP_POINTERS),
                            name_top in proptest::collection::vec(pointer(), ROOT_TOP_POINTERS),
                            flip in 0usize..BLOCK_SIZE_BYTES * 8) {
            let streams = std::array::from_fn(|index| {
                let (current_segment, next_row, reserved_segment) = segments[index];
                StreamPosition { current_segment, next_row, reserved_segment }
            });
            let root = CheckpointRoot {
                generation, sequence, write_clock: clock, durable_through_sequence: sequence / 2, streams,
                index_tree_depth: 2, segment_tree_depth: 1, index_top, segment_top, last_segment: generation ^ 7, epoch: clock ^ 3,
                data_blocks: generation ^ 11, zero_blocks: sequence ^ 13,
                fragment_blocks: generation ^ 17, fragment_sixteenths: sequence ^ 19,
                shared_blocks: clock ^ 23, shared_tree_depth: 1, shared_top,
                name_slots: clock ^ 29, name_sampling_bits: 3, name_tree_depth: 1, name_top,
            };
            let mut block = vec![0u8; BLOCK_SIZE_BYTES];
            root.encode(&mut block, &UUID);
            prop_assert_eq!(CheckpointRoot::decode(&block, &UUID), Some(root.clone()));
            assert_damage_detected(&block, CheckpointRoot::decode, flip);
            // Generation 0 is before the first commit: no root names it.
            CheckpointRoot { generation: 0, ..root }.encode(&mut block, &UUID);
            prop_assert_eq!(CheckpointRoot::decode(&block, &UUID), None);
        }
    }

    #[test]
    fn a_block_of_one_kind_is_not_read_as_another() {
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        encode_index_page(&mut block, &UUID, 1, 1, 30, &[0xAB; 100]);
        assert!(DirectoryPage::decode(&block, &UUID).is_none());
        assert!(SegmentTablePage::decode(&block, &UUID).is_none());
        assert!(CheckpointRoot::decode(&block, &UUID).is_none());
        assert!(decode_shared_table_page(&block, &UUID).is_none());
        assert!(decode_name_table_page(&block, &UUID).is_none());
    }

    #[test]
    fn trees_are_as_shallow_as_their_size_allows() {
        assert_eq!(tree_depth(0), 0);
        assert_eq!(tree_depth(64), 0);
        assert_eq!(tree_depth(65), 1);
        assert_eq!(tree_depth(64 * 335), 1);
        // 64 TiB of 35-bit entries: 2^34 blocks in pages of 920 entries.
        assert_eq!(tree_depth((1u64 << 34).div_ceil(920)), 3);
    }
}
