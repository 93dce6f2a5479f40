//! Encoding and decoding of everything stored on members: superblocks and batch summary
//! blocks. Byte layouts are in docs/on-disk-format.md; this file is their only encoder.

use crate::geometry::{Geometry, RaidLevel, BLOCK_SIZE_BYTES};

pub const FORMAT_VERSION: u32 = 1;
pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"STRIPLOG";
pub const SUMMARY_MAGIC: &[u8; 8] = b"SLBATCH\0";
/// Member byte offsets of the two superblock copies (both inside the reserved chunk).
pub const SUPERBLOCK_OFFSETS_BYTES: [u64; 2] = [0, 32 << 10];
/// Entries in one summary block: (4092 − 128) / 16, rounded down.
pub const ENTRIES_PER_SUMMARY: usize = 247;
const ENTRIES_OFFSET: usize = 128;
const ENTRY_SIZE_BYTES: usize = 16;
const CHECKSUM_OFFSET: usize = BLOCK_SIZE_BYTES - 4;

pub fn block_checksum(block: &[u8]) -> u32 {
    crc32c::crc32c(block)
}

/// CRC32C of an all-zero block (padding).
pub fn zero_block_checksum() -> u32 {
    static ZERO: [u8; BLOCK_SIZE_BYTES] = [0; BLOCK_SIZE_BYTES];
    crc32c::crc32c(&ZERO)
}

fn seal(block: &mut [u8]) {
    let checksum = crc32c::crc32c(&block[..CHECKSUM_OFFSET]);
    block[CHECKSUM_OFFSET..BLOCK_SIZE_BYTES].copy_from_slice(&checksum.to_le_bytes());
}

fn checksum_matches(block: &[u8]) -> bool {
    crc32c::crc32c(&block[..CHECKSUM_OFFSET]) == read_u32(block, CHECKSUM_OFFSET)
}

fn read_u16(block: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([block[offset], block[offset + 1]])
}
fn read_u32(block: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(block[offset..offset + 4].try_into().expect("4 bytes"))
}
fn read_u64(block: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(block[offset..offset + 8].try_into().expect("8 bytes"))
}
fn put(block: &mut [u8], offset: usize, bytes: &[u8]) {
    block[offset..offset + bytes.len()].copy_from_slice(bytes);
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub copy: u32,
    pub volume_uuid: [u8; 16],
    pub member_index: u32,
    pub member_count: u32,
    pub raid_level: RaidLevel,
    pub chunk_size_bytes: u32,
    pub spare_ppm: u32,
    pub member_size_bytes: u64,
    pub segment_count: u64,
    pub logical_size_bytes: u64,
    pub created_unix_seconds: u64,
    pub epoch: u64,
    /// Bit i set: member i was missing or failed when this epoch began; its content is
    /// stale and it must not rejoin the volume (it can only be replaced).
    pub failed_members: u64,
    /// Every batch with a sequence number up to this was durable when the superblock was
    /// written (a checkpoint of the durable frontier, written before segments whose
    /// batches recovery would otherwise miss are released).
    pub durable_through_sequence: u64,
    /// Bit i set (with the same bit of `failed_members`): member i is a replacement being
    /// rebuilt; it is written but read only where the rebuild has finished
    /// (docs/resilience.md). Zero in volumes written before the field existed.
    pub rebuilding_members: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum SuperblockProblem {
    NotStripelog,
    UnsupportedVersion(u32),
    BadChecksum,
    Inconsistent(String),
}

impl Superblock {
    pub fn encode(&self, block: &mut [u8]) {
        block[..BLOCK_SIZE_BYTES].fill(0);
        put(block, 0, SUPERBLOCK_MAGIC);
        put(block, 8, &FORMAT_VERSION.to_le_bytes());
        put(block, 12, &self.copy.to_le_bytes());
        put(block, 16, &self.volume_uuid);
        put(block, 32, &self.member_index.to_le_bytes());
        put(block, 36, &self.member_count.to_le_bytes());
        put(block, 40, &self.raid_level.code().to_le_bytes());
        put(block, 44, &self.chunk_size_bytes.to_le_bytes());
        put(block, 48, &(BLOCK_SIZE_BYTES as u32).to_le_bytes());
        put(block, 52, &self.spare_ppm.to_le_bytes());
        put(block, 56, &self.member_size_bytes.to_le_bytes());
        put(block, 64, &self.segment_count.to_le_bytes());
        put(block, 72, &self.logical_size_bytes.to_le_bytes());
        put(block, 80, &self.created_unix_seconds.to_le_bytes());
        put(block, 88, &self.epoch.to_le_bytes());
        put(block, 96, &self.failed_members.to_le_bytes());
        put(block, 104, &self.durable_through_sequence.to_le_bytes());
        put(block, 112, &self.rebuilding_members.to_le_bytes());
        seal(block);
    }

    pub fn decode(block: &[u8], expected_copy: u32) -> Result<Superblock, SuperblockProblem> {
        if &block[0..8] != SUPERBLOCK_MAGIC {
            return Err(SuperblockProblem::NotStripelog);
        }
        let version = read_u32(block, 8);
        if version != FORMAT_VERSION {
            return Err(SuperblockProblem::UnsupportedVersion(version));
        }
        if !checksum_matches(block) {
            return Err(SuperblockProblem::BadChecksum);
        }
        let copy = read_u32(block, 12);
        if copy != expected_copy {
            return Err(SuperblockProblem::Inconsistent(format!(
                "copy {copy} found where copy {expected_copy} belongs"
            )));
        }
        let raid_code = read_u32(block, 40);
        let raid_level = RaidLevel::from_code(raid_code)
            .ok_or_else(|| SuperblockProblem::Inconsistent(format!("unknown RAID level {raid_code}")))?;
        let block_size = read_u32(block, 48);
        if block_size as usize != BLOCK_SIZE_BYTES {
            return Err(SuperblockProblem::Inconsistent(format!("block size {block_size}")));
        }
        let superblock = Superblock {
            copy,
            volume_uuid: block[16..32].try_into().expect("16 bytes"),
            member_index: read_u32(block, 32),
            member_count: read_u32(block, 36),
            raid_level,
            chunk_size_bytes: read_u32(block, 44),
            spare_ppm: read_u32(block, 52),
            member_size_bytes: read_u64(block, 56),
            segment_count: read_u64(block, 64),
            logical_size_bytes: read_u64(block, 72),
            created_unix_seconds: read_u64(block, 80),
            epoch: read_u64(block, 88),
            failed_members: read_u64(block, 96),
            durable_through_sequence: read_u64(block, 104),
            rebuilding_members: read_u64(block, 112),
        };
        // The geometry must be one we would have created, and agree with its own sizes.
        let geometry = Geometry::new(
            superblock.raid_level,
            superblock.member_count as usize,
            superblock.chunk_size_bytes,
            superblock.spare_ppm,
            superblock.member_size_bytes,
        )
        .map_err(|error| SuperblockProblem::Inconsistent(error.to_string()))?;
        if geometry.segment_count() != superblock.segment_count
            || geometry.logical_size_bytes() != superblock.logical_size_bytes
            || superblock.member_index >= superblock.member_count
            || superblock.rebuilding_members & !superblock.failed_members != 0
        {
            return Err(SuperblockProblem::Inconsistent("sizes do not match the geometry".into()));
        }
        Ok(superblock)
    }

    pub fn geometry(&self) -> Geometry {
        Geometry {
            raid_level: self.raid_level,
            member_count: self.member_count as usize,
            chunk_size_bytes: self.chunk_size_bytes,
            spare_ppm: self.spare_ppm,
            member_size_bytes: self.member_size_bytes,
        }
    }
}

/// See [`Summary::classify_damaged`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DamagedHead {
    /// All zeros: never written, or released.
    Zero,
    /// A summary of this volume whose zeroing (release) was torn by a crash.
    TornZeroing,
    /// A summary of this volume that fails its checksum: lost metadata, unless its
    /// sequence number lies after the end of the log (a torn write of a new head).
    DamagedSummary { sequence: u64 },
    /// Anything else (a torn new head whose first sector did not land, old data).
    Other,
}

/// One entry of a batch summary: what a batch did to the logical space, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Logical block `logical_block` now holds the next data block of the group.
    Data { logical_block: u64, checksum: u32 },
    /// `block_count` blocks from `logical_block` read as zeros (written zeros).
    Zero { logical_block: u64, block_count: u32 },
    /// `block_count` blocks from `logical_block` are unmapped (trimmed).
    Trim { logical_block: u64, block_count: u32 },
}

const ENTRY_KIND_DATA: u8 = 1;
const ENTRY_KIND_ZERO: u8 = 2;
const ENTRY_KIND_TRIM: u8 = 3;

impl Entry {
    fn encode(&self, bytes: &mut [u8]) {
        let (kind, value, logical_block) = match *self {
            Entry::Data { logical_block, checksum } => (ENTRY_KIND_DATA, checksum, logical_block),
            Entry::Zero { logical_block, block_count } => (ENTRY_KIND_ZERO, block_count, logical_block),
            Entry::Trim { logical_block, block_count } => (ENTRY_KIND_TRIM, block_count, logical_block),
        };
        bytes[..ENTRY_SIZE_BYTES].fill(0);
        bytes[0] = kind;
        put(bytes, 4, &value.to_le_bytes());
        put(bytes, 8, &logical_block.to_le_bytes());
    }

    fn decode(bytes: &[u8]) -> Option<Entry> {
        let value = read_u32(bytes, 4);
        let logical_block = read_u64(bytes, 8);
        match bytes[0] {
            ENTRY_KIND_DATA => Some(Entry::Data { logical_block, checksum: value }),
            ENTRY_KIND_ZERO if value > 0 => Some(Entry::Zero { logical_block, block_count: value }),
            ENTRY_KIND_TRIM if value > 0 => Some(Entry::Trim { logical_block, block_count: value }),
            _ => None,
        }
    }

    pub fn is_data(&self) -> bool {
        matches!(self, Entry::Data { .. })
    }
}

/// The fields every summary block of a batch repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub volume_uuid: [u8; 16],
    pub sequence: u64,
    pub segment: u64,
    pub segment_open_sequence: u64,
    pub durable_through_sequence: u64,
    pub first_row: u32,
    pub row_count: u32,
    pub block_count: u32,
    pub summary_count: u32,
    pub epoch: u64,
    /// The segment that holds batch `sequence − 1`, or [`NO_SEGMENT`]: lets recovery tell
    /// a batch lost to damage from one whose segment was legitimately reused.
    pub previous_segment: u64,
}

/// `previous_segment` when the previous batch's segment is not known.
pub const NO_SEGMENT: u64 = u64::MAX;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub header: BatchHeader,
    pub summary_index: u16,
    pub entries: Vec<Entry>,
}

impl Summary {
    pub fn encode(&self, block: &mut [u8]) {
        assert!(self.entries.len() <= ENTRIES_PER_SUMMARY, "summary holds at most {ENTRIES_PER_SUMMARY} entries");
        let header = &self.header;
        block[..BLOCK_SIZE_BYTES].fill(0);
        put(block, 0, SUMMARY_MAGIC);
        put(block, 8, &(FORMAT_VERSION as u16).to_le_bytes());
        put(block, 10, &self.summary_index.to_le_bytes());
        put(block, 12, &(self.entries.len() as u16).to_le_bytes());
        put(block, 16, &header.volume_uuid);
        put(block, 32, &header.sequence.to_le_bytes());
        put(block, 40, &header.segment.to_le_bytes());
        put(block, 48, &header.segment_open_sequence.to_le_bytes());
        put(block, 56, &header.durable_through_sequence.to_le_bytes());
        put(block, 64, &header.first_row.to_le_bytes());
        put(block, 68, &header.row_count.to_le_bytes());
        put(block, 72, &header.block_count.to_le_bytes());
        put(block, 76, &header.summary_count.to_le_bytes());
        put(block, 80, &header.epoch.to_le_bytes());
        put(block, 88, &header.previous_segment.to_le_bytes());
        for (index, entry) in self.entries.iter().enumerate() {
            let offset = ENTRIES_OFFSET + index * ENTRY_SIZE_BYTES;
            entry.encode(&mut block[offset..offset + ENTRY_SIZE_BYTES]);
        }
        seal(block);
    }

    /// Decode a summary block; `None` when it is not a valid summary of this volume.
    pub fn decode(block: &[u8], volume_uuid: &[u8; 16]) -> Option<Summary> {
        if &block[0..8] != SUMMARY_MAGIC
            || read_u16(block, 8) as u32 != FORMAT_VERSION
            || !checksum_matches(block)
            || &block[16..32] != volume_uuid
        {
            return None;
        }
        let entry_count = read_u16(block, 12) as usize;
        if entry_count > ENTRIES_PER_SUMMARY {
            return None;
        }
        let header = BatchHeader {
            volume_uuid: *volume_uuid,
            sequence: read_u64(block, 32),
            segment: read_u64(block, 40),
            segment_open_sequence: read_u64(block, 48),
            durable_through_sequence: read_u64(block, 56),
            first_row: read_u32(block, 64),
            row_count: read_u32(block, 68),
            block_count: read_u32(block, 72),
            summary_count: read_u32(block, 76),
            epoch: read_u64(block, 80),
            previous_segment: read_u64(block, 88),
        };
        let mut entries = Vec::with_capacity(entry_count);
        for index in 0..entry_count {
            let offset = ENTRIES_OFFSET + index * ENTRY_SIZE_BYTES;
            entries.push(Entry::decode(&block[offset..offset + ENTRY_SIZE_BYTES])?);
        }
        Some(Summary { header, summary_index: read_u16(block, 10), entries })
    }

    /// What a block at the head of a segment that does not decode as a summary looks
    /// like (recovery tells lost metadata from released or torn heads with it).
    pub fn classify_damaged(block: &[u8], volume_uuid: &[u8; 16]) -> DamagedHead {
        if block.iter().all(|&byte| byte == 0) {
            return DamagedHead::Zero;
        }
        if &block[0..8] != SUMMARY_MAGIC || &block[16..32] != volume_uuid {
            return DamagedHead::Other;
        }
        // Sectors a real summary can never have all zero: the header, the entries, the
        // checksum. A zeroing write torn at sector granularity leaves one of them zero;
        // bit rot does not.
        let entry_count = (read_u16(block, 12) as usize).min(ENTRIES_PER_SUMMARY);
        let entries_end = ENTRIES_OFFSET + entry_count * ENTRY_SIZE_BYTES;
        const SECTOR: usize = 512;
        let must_hold_data = |sector: usize| {
            let (start, end) = (sector * SECTOR, (sector + 1) * SECTOR);
            sector == 0 || end > CHECKSUM_OFFSET || (start < entries_end && end > ENTRIES_OFFSET)
        };
        let torn_zeroing = (0..BLOCK_SIZE_BYTES / SECTOR).any(|sector| {
            must_hold_data(sector) && block[sector * SECTOR..(sector + 1) * SECTOR].iter().all(|&b| b == 0)
        });
        if torn_zeroing {
            DamagedHead::TornZeroing
        } else {
            DamagedHead::DamagedSummary { sequence: read_u64(block, 32) }
        }
    }

    pub fn data_block_count(&self) -> usize {
        self.entries.iter().filter(|entry| entry.is_data()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arbitrary_entry() -> impl Strategy<Value = Entry> {
        prop_oneof![
            (any::<u64>(), any::<u32>()).prop_map(|(logical_block, checksum)| Entry::Data { logical_block, checksum }),
            (any::<u64>(), 1u32..).prop_map(|(logical_block, block_count)| Entry::Zero { logical_block, block_count }),
            (any::<u64>(), 1u32..).prop_map(|(logical_block, block_count)| Entry::Trim { logical_block, block_count }),
        ]
    }

    fn sample_superblock() -> Superblock {
        let geometry = Geometry::new(RaidLevel::Raid6, 6, 1 << 20, 200_000, 1 << 30).unwrap();
        Superblock {
            copy: 1,
            volume_uuid: [7; 16],
            member_index: 3,
            member_count: 6,
            raid_level: RaidLevel::Raid6,
            chunk_size_bytes: 1 << 20,
            spare_ppm: 200_000,
            member_size_bytes: geometry.member_size_bytes,
            segment_count: geometry.segment_count(),
            logical_size_bytes: geometry.logical_size_bytes(),
            created_unix_seconds: 1_700_000_000,
            epoch: 9,
            failed_members: 0b100,
            durable_through_sequence: 77,
            rebuilding_members: 0b100,
        }
    }

    #[test]
    fn superblock_round_trips_and_detects_damage() {
        let superblock = sample_superblock();
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        superblock.encode(&mut block);
        assert_eq!(Superblock::decode(&block, 1).unwrap(), superblock);
        assert!(matches!(Superblock::decode(&block, 0), Err(SuperblockProblem::Inconsistent(_))));
        for byte in [0usize, 20, 100, 4000, 4095] {
            let mut damaged = block.clone();
            damaged[byte] ^= 0x10;
            assert!(Superblock::decode(&damaged, 1).is_err(), "flip at {byte} undetected");
        }
        assert_eq!(Superblock::decode(&[0u8; BLOCK_SIZE_BYTES], 0), Err(SuperblockProblem::NotStripelog));
    }

    proptest! {
        #[test]
        fn summaries_round_trip(entries in proptest::collection::vec(arbitrary_entry(), 0..=ENTRIES_PER_SUMMARY),
                                sequence in any::<u64>(), flip in 0usize..BLOCK_SIZE_BYTES * 8) {
            let summary = Summary {
                header: BatchHeader {
                    volume_uuid: [3; 16], sequence, segment: 17, segment_open_sequence: sequence,
                    durable_through_sequence: sequence / 2, first_row: 4, row_count: 8, block_count: 30,
                    summary_count: 1, epoch: 2, previous_segment: 3,
                },
                summary_index: 0,
                entries,
            };
            let mut block = vec![0u8; BLOCK_SIZE_BYTES];
            summary.encode(&mut block);
            prop_assert_eq!(Summary::decode(&block, &[3; 16]), Some(summary.clone()));
            prop_assert_eq!(Summary::decode(&block, &[4; 16]), None);
            block[flip / 8] ^= 1 << (flip % 8);
            prop_assert_eq!(Summary::decode(&block, &[3; 16]), None);
        }
    }
}
