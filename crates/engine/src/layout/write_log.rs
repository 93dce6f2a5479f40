//! The write log device's on-disk structures (docs/on-disk-format.md, "Write log device"): its superblock (two
//! copies at the start of the device) and the records of the circular area after them.
//! Every structure has a magic, a version and a CRC32C in its last 4 bytes.

/// Why a log superblock copy is not usable: defined with the errors that report it.
pub use crate::error::{LogSuperblockInconsistency, LogSuperblockProblem};
use crate::layout::format::{checksum_matches, put, read_u32, read_u64, read_uuid, seal};
use crate::layout::geometry::BLOCK_SIZE_BYTES;

pub const LOG_SUPERBLOCK_MAGIC: &[u8; 8] = b"SLWLOG\0\0";
pub const LOG_RECORD_MAGIC: &[u8; 8] = b"SLWREC\0\0";
pub const LOG_FORMAT_VERSION: u32 = 1;
/// Device byte offsets of the two superblock copies.
pub const LOG_SUPERBLOCK_OFFSETS_BYTES: [u64; 2] = [0, BLOCK_SIZE_BYTES as u64];
/// Where the record area starts.
pub const LOG_AREA_START_BYTES: u64 = 64 << 10;
/// The smallest log device: the superblocks and room for a few largest records.
pub const LOG_DEVICE_MINIMUM_BYTES: u64 = LOG_AREA_START_BYTES + 4 * RECORD_BYTES_MAXIMUM;
/// Entries one record header describes ((4092 − 72) / 24 = 167, rounded down).
pub const RECORD_ENTRIES_MAXIMUM: usize = 160;
/// A record's largest size: its header and a data block per entry.
pub const RECORD_BYTES_MAXIMUM: u64 = (1 + RECORD_ENTRIES_MAXIMUM as u64) * BLOCK_SIZE_BYTES as u64;
const RECORD_ENTRIES_OFFSET: usize = 72;
const RECORD_ENTRY_BYTES: usize = 24;
const RECORD_FLAG_WRAP: u32 = 1;

/// A log device's superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSuperblock {
    pub copy: u32,
    pub volume_uuid: [u8; 16],
    /// Names this log (the same on both devices of a mirror): records of another log,
    /// or of this device's earlier life, are never taken for this one's.
    pub log_uuid: [u8; 16],
    pub mirror_index: u32,
    pub mirror_count: u32,
    pub device_size_bytes: u64,
    pub area_end_bytes: u64,
    /// The oldest record that may still be needed, and its record sequence: mount reads
    /// records from here. Never behind a record already overwritten.
    pub tail_position_bytes: u64,
    pub tail_record_sequence: u64,
    /// Set while mount replays the log: the last member batch the replay goes on from.
    /// A replay interrupted by a crash starts again from the same point.
    pub replay_after_sequence: Option<u64>,
    /// +1 at every update; the copy with the larger one is current.
    pub update_sequence: u64,
    /// +1 each time a read-write open takes the log over (after replaying it): records
    /// carry it, so that a record of an earlier life of the log — one left behind a torn
    /// one by a crash — never joins the chain of a later one.
    pub generation: u64,
}

impl LogSuperblock {
    pub fn encode(&self, block: &mut [u8]) {
        block[..BLOCK_SIZE_BYTES].fill(0);
        put(block, 0, LOG_SUPERBLOCK_MAGIC);
        put(block, 8, &LOG_FORMAT_VERSION.to_le_bytes());
        put(block, 12, &self.copy.to_le_bytes());
        put(block, 16, &self.volume_uuid);
        put(block, 32, &self.log_uuid);
        put(block, 48, &self.mirror_index.to_le_bytes());
        put(block, 52, &self.mirror_count.to_le_bytes());
        put(block, 56, &self.device_size_bytes.to_le_bytes());
        put(block, 64, &LOG_AREA_START_BYTES.to_le_bytes());
        put(block, 72, &self.area_end_bytes.to_le_bytes());
        put(block, 80, &self.tail_position_bytes.to_le_bytes());
        put(block, 88, &self.tail_record_sequence.to_le_bytes());
        put(block, 96, &self.replay_after_sequence.map_or(0, |sequence| sequence + 1).to_le_bytes());
        put(block, 104, &self.update_sequence.to_le_bytes());
        put(block, 112, &self.generation.to_le_bytes());
        seal(block);
    }

    pub fn decode(block: &[u8], expected_copy: u32) -> Result<LogSuperblock, LogSuperblockProblem> {
        if &block[0..8] != LOG_SUPERBLOCK_MAGIC {
            return Err(LogSuperblockProblem::NotWriteLog);
        }
        let version = read_u32(block, 8);
        if version != LOG_FORMAT_VERSION {
            return Err(LogSuperblockProblem::UnsupportedVersion(version));
        }
        if !checksum_matches(block) {
            return Err(LogSuperblockProblem::BadChecksum);
        }
        let replay = read_u64(block, 96);
        let superblock = LogSuperblock {
            copy: read_u32(block, 12),
            volume_uuid: read_uuid(block, 16),
            log_uuid: read_uuid(block, 32),
            mirror_index: read_u32(block, 48),
            mirror_count: read_u32(block, 52),
            device_size_bytes: read_u64(block, 56),
            area_end_bytes: read_u64(block, 72),
            tail_position_bytes: read_u64(block, 80),
            tail_record_sequence: read_u64(block, 88),
            replay_after_sequence: replay.checked_sub(1),
            update_sequence: read_u64(block, 104),
            generation: read_u64(block, 112),
        };
        let aligned = |value: u64| value.is_multiple_of(BLOCK_SIZE_BYTES as u64);
        if superblock.copy != expected_copy {
            return Err(LogSuperblockProblem::Inconsistent(LogSuperblockInconsistency::WrongCopy {
                found: superblock.copy,
                expected: expected_copy,
            }));
        }
        if read_u64(block, 64) != LOG_AREA_START_BYTES
            || superblock.area_end_bytes > superblock.device_size_bytes
            || superblock.area_end_bytes < LOG_AREA_START_BYTES + 4 * RECORD_BYTES_MAXIMUM
            || !aligned(superblock.area_end_bytes)
            || !(LOG_AREA_START_BYTES..superblock.area_end_bytes).contains(&superblock.tail_position_bytes)
            || !aligned(superblock.tail_position_bytes)
            || superblock.mirror_count == 0
            || superblock.mirror_index >= superblock.mirror_count
        {
            return Err(LogSuperblockProblem::Inconsistent(LogSuperblockInconsistency::PositionsDoNotFit));
        }
        Ok(superblock)
    }
}

/// What one logged entry does to its logical block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogEntryKind {
    /// A whole block, which follows the header.
    Data,
    Zero,
    Trim,
}

impl LogEntryKind {
    fn code(self) -> u8 {
        match self {
            LogEntryKind::Data => 1,
            LogEntryKind::Zero => 2,
            LogEntryKind::Trim => 3,
        }
    }

    fn from_code(code: u8) -> Option<LogEntryKind> {
        match code {
            1 => Some(LogEntryKind::Data),
            2 => Some(LogEntryKind::Zero),
            3 => Some(LogEntryKind::Trim),
            _ => None,
        }
    }
}

/// One accepted client write of one logical block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The member batch it was accepted into: replay skips entries the members' recovered
    /// prefix already holds.
    pub batch_sequence: u64,
    pub logical_block: u64,
    pub kind: LogEntryKind,
    /// CRC32C of the data block (data entries).
    pub checksum: u32,
}

/// A record's header block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub volume_uuid: [u8; 16],
    pub log_uuid: [u8; 16],
    /// The log's generation when the record was written.
    pub generation: u64,
    /// +1 per record, never reused within a log.
    pub record_sequence: u64,
    /// The rest of the area is unused: the next record is at the area's start.
    pub wrap: bool,
    pub entries: Vec<LogEntry>,
}

impl RecordHeader {
    /// Data blocks that follow the header.
    pub fn data_blocks(&self) -> usize {
        self.entries.iter().filter(|entry| entry.kind == LogEntryKind::Data).count()
    }

    /// The record's size on the device.
    pub fn length_bytes(&self) -> u64 {
        (1 + self.data_blocks() as u64) * BLOCK_SIZE_BYTES as u64
    }

    pub fn encode(&self, block: &mut [u8]) {
        assert!(self.entries.len() <= RECORD_ENTRIES_MAXIMUM, "a record holds at most {RECORD_ENTRIES_MAXIMUM}");
        block[..BLOCK_SIZE_BYTES].fill(0);
        put(block, 0, LOG_RECORD_MAGIC);
        put(block, 8, &LOG_FORMAT_VERSION.to_le_bytes());
        put(block, 12, &(if self.wrap { RECORD_FLAG_WRAP } else { 0 }).to_le_bytes());
        put(block, 16, &self.volume_uuid);
        put(block, 32, &self.log_uuid);
        put(block, 48, &self.record_sequence.to_le_bytes());
        put(block, 56, &(self.entries.len() as u32).to_le_bytes());
        put(block, 60, &(self.data_blocks() as u32).to_le_bytes());
        put(block, 64, &self.generation.to_le_bytes());
        for (index, entry) in self.entries.iter().enumerate() {
            let offset = RECORD_ENTRIES_OFFSET + index * RECORD_ENTRY_BYTES;
            put(block, offset, &entry.batch_sequence.to_le_bytes());
            put(block, offset + 8, &entry.logical_block.to_le_bytes());
            put(block, offset + 16, &entry.checksum.to_le_bytes());
            block[offset + 20] = entry.kind.code();
        }
        seal(block);
    }

    /// The header of the record expected here, or `None` when the block is not one: not
    /// a record, another log's or another generation's, a torn or stale one.
    pub fn decode(block: &[u8], volume_uuid: &[u8; 16], log_uuid: &[u8; 16], generation: u64) -> Option<RecordHeader> {
        if &block[0..8] != LOG_RECORD_MAGIC
            || read_u32(block, 8) != LOG_FORMAT_VERSION
            || !checksum_matches(block)
            || read_uuid(block, 16) != *volume_uuid
            || read_uuid(block, 32) != *log_uuid
            || read_u64(block, 64) != generation
        {
            return None;
        }
        let count = read_u32(block, 56) as usize;
        if count > RECORD_ENTRIES_MAXIMUM {
            return None;
        }
        let mut entries = Vec::with_capacity(count);
        for index in 0..count {
            let offset = RECORD_ENTRIES_OFFSET + index * RECORD_ENTRY_BYTES;
            entries.push(LogEntry {
                batch_sequence: read_u64(block, offset),
                logical_block: read_u64(block, offset + 8),
                checksum: read_u32(block, offset + 16),
                kind: LogEntryKind::from_code(block[offset + 20])?,
            });
        }
        let header = RecordHeader {
            volume_uuid: *volume_uuid,
            log_uuid: *log_uuid,
            generation,
            record_sequence: read_u64(block, 48),
            wrap: read_u32(block, 12) & RECORD_FLAG_WRAP != 0,
            entries,
        };
        (header.data_blocks() == read_u32(block, 60) as usize).then_some(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn superblock() -> LogSuperblock {
        LogSuperblock {
            copy: 1,
            volume_uuid: [1; 16],
            log_uuid: [2; 16],
            mirror_index: 1,
            mirror_count: 2,
            device_size_bytes: 64 << 20,
            area_end_bytes: 64 << 20,
            tail_position_bytes: LOG_AREA_START_BYTES + 8192,
            tail_record_sequence: 17,
            replay_after_sequence: Some(0),
            update_sequence: 5,
            generation: 3,
        }
    }

    #[test]
    fn a_superblock_round_trips_and_damage_is_named() {
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        superblock().encode(&mut block);
        assert_eq!(LogSuperblock::decode(&block, 1), Ok(superblock()));
        assert!(matches!(LogSuperblock::decode(&block, 0), Err(LogSuperblockProblem::Inconsistent(_))));
        block[100] ^= 1;
        assert_eq!(LogSuperblock::decode(&block, 1), Err(LogSuperblockProblem::BadChecksum));
        block[0] = b'X';
        assert_eq!(LogSuperblock::decode(&block, 1), Err(LogSuperblockProblem::NotWriteLog));
        let mut outside = superblock();
        outside.tail_position_bytes = outside.area_end_bytes;
        outside.encode(&mut block);
        assert!(matches!(LogSuperblock::decode(&block, 1), Err(LogSuperblockProblem::Inconsistent(_))));
    }

    #[test]
    fn a_record_header_round_trips_and_belongs_to_one_log() {
        let entries = vec![
            LogEntry { batch_sequence: 9, logical_block: 4, kind: LogEntryKind::Data, checksum: 0xABCD },
            LogEntry { batch_sequence: 9, logical_block: 5, kind: LogEntryKind::Trim, checksum: 0 },
            LogEntry { batch_sequence: 10, logical_block: 6, kind: LogEntryKind::Zero, checksum: 0 },
        ];
        let header = RecordHeader {
            volume_uuid: [1; 16],
            log_uuid: [2; 16],
            generation: 4,
            record_sequence: 77,
            wrap: false,
            entries,
        };
        assert_eq!(header.length_bytes(), 2 * BLOCK_SIZE_BYTES as u64);
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        header.encode(&mut block);
        assert_eq!(RecordHeader::decode(&block, &[1; 16], &[2; 16], 4), Some(header));
        assert_eq!(RecordHeader::decode(&block, &[1; 16], &[3; 16], 4), None, "another log's record");
        assert_eq!(RecordHeader::decode(&block, &[1; 16], &[2; 16], 5), None, "an earlier generation's record");
        block[80] ^= 1;
        assert_eq!(RecordHeader::decode(&block, &[1; 16], &[2; 16], 4), None, "a torn header");
    }
}
