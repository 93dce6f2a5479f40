//! Encoding and decoding of everything stored on members: superblocks and batch summary
//! blocks. Byte layouts are in docs/on-disk-format.md; this file is their only encoder.

/// Who holds a volume, and why a superblock is refused: defined with the errors that
/// report them.
pub use crate::error::{Holder, SuperblockInconsistency, SuperblockProblem};
use crate::layout::geometry::{Geometry, RaidLevel, BLOCK_SIZE_BYTES};
use crate::layout::mapping::Mapping;
pub use crate::stats::LifetimeCounters;
use crate::stats::LIFETIME_COUNTER_COUNT;

/// Version of the superblock written by this code. Versions 1 (without the fields from
/// offset 120) and 2 (without the fields from offset 2304) are read too; a read-write
/// open of such a volume is refused until `stripelog upgrade` rewrites it (its summaries
/// may then be version 2, which older code cannot read).
pub const SUPERBLOCK_VERSION: u32 = 3;
/// The superblock version written while an incompatible feature is in use (offset 2360
/// says which): a stripelog that does not know the feature must refuse the volume. No
/// feature in use: [`SUPERBLOCK_VERSION`] is written, readable by older code.
pub const SUPERBLOCK_VERSION_WITH_FEATURES: u32 = 4;
/// Incompatible feature bit 2: index entries and summaries may name packed fragments,
/// packed blocks version 2 (docs/compression.md); set by `create --compression` and never
/// cleared. (Bit 1, the first packed-block format, was never released and is retired: a
/// volume with it is refused as having an unknown feature.)
pub const FEATURE_PACKED_FRAGMENTS: u64 = 1 << 2;
/// Incompatible feature bit 3: the logical size is the superblock's own, not the
/// provisioned size (thin provisioning, docs/deduplication.md decision 10); set by
/// `create --logical-size`.
pub const FEATURE_THIN_PROVISIONED: u64 = 1 << 3;
/// Incompatible feature bit 4: index entries may name shared-block records and summaries
/// may hold shared copies and references (inline deduplication, docs/deduplication.md);
/// set by `create --dedup on` and never cleared (`set dedup=off` only stops new sharing).
pub const FEATURE_DEDUPLICATION: u64 = 1 << 4;
/// Incompatible feature bit 5: client writes predicted to live long go to a second open
/// batch, sealed with the clients' batch as a pair that recovery keeps whole or not at
/// all (summary header byte 113; docs/crash-consistency.md, "Client writes in two
/// streams"). Code that does not know the pair byte would keep half a pair.
pub const FEATURE_CLIENT_WRITE_PAIRS: u64 = 1 << 5;
/// Incompatible feature bit 6: a shared copy may be a fragment (summary entry kind 15,
/// shared-table records with a share; docs/deduplication.md decision 11); set by
/// `create` with both compression and deduplication (bits 2 and 4), which it needs.
pub const FEATURE_COMPRESSED_SHARED_COPIES: u64 = 1 << 6;
/// The incompatible features this code knows (bit 0, a write log on the members, is
/// planned, not built: a volume with it is refused).
pub const KNOWN_FEATURES: u64 = FEATURE_PACKED_FRAGMENTS
    | FEATURE_THIN_PROVISIONED
    | FEATURE_DEDUPLICATION
    | FEATURE_CLIENT_WRITE_PAIRS
    | FEATURE_COMPRESSED_SHARED_COPIES;
/// The largest logical size of a thin volume, in blocks (2^36: 256 TiB).
pub const THIN_LOGICAL_BLOCKS_MAXIMUM: u64 = 1 << 36;

/// A thin volume's logical size in blocks, when `bytes` is one: a whole number of blocks
/// from 1 to [`THIN_LOGICAL_BLOCKS_MAXIMUM`] (what `create` accepts and a superblock with
/// feature bit 3 must hold).
pub fn thin_logical_blocks(bytes: u64) -> Option<u64> {
    let blocks = bytes / BLOCK_SIZE_BYTES as u64;
    (bytes.is_multiple_of(BLOCK_SIZE_BYTES as u64) && (1..=THIN_LOGICAL_BLOCKS_MAXIMUM).contains(&blocks))
        .then_some(blocks)
}
/// The superblock version before the index fields (entry width, checkpoint root).
pub const SUPERBLOCK_VERSION_WITHOUT_INDEX: u32 = 2;
/// The superblock version before member identity and the holder record.
pub const SUPERBLOCK_VERSION_WITHOUT_IDENTITY: u32 = 1;
/// Version of batch summary blocks holding shared copies or references (entry kinds 10–12,
/// and shared table pages, kind 13); a summary without them is written as
/// [`SUMMARY_VERSION_WITHOUT_SHARING`] or older, so that a volume that never shared a
/// block stays readable by older code.
pub const SUMMARY_VERSION: u16 = 4;
/// Version of batch summary blocks holding packed fragments (entry kinds 8 and 9); a
/// summary without them is written as [`SUMMARY_VERSION_WITHOUT_FRAGMENTS`].
pub const SUMMARY_VERSION_WITHOUT_SHARING: u16 = 3;
/// Summaries before entry kinds 8 and 9.
pub const SUMMARY_VERSION_WITHOUT_FRAGMENTS: u16 = 2;
/// Summaries before the write clock, the stream, the forward link and the lifetime class
/// (read as: clock unknown, class unknown, no link).
pub const SUMMARY_VERSION_WITHOUT_CLOCKS: u16 = 1;
/// The lifetime class of a block whose previous version is not known (never overwritten,
/// or written by summary version 1).
pub const LIFETIME_CLASS_UNKNOWN: u8 = u8::MAX;
pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"STRIPLOG";
pub const SUMMARY_MAGIC: &[u8; 8] = b"SLBATCH\0";
/// Member byte offsets of the two superblock copies (both inside the reserved chunk).
pub const SUPERBLOCK_OFFSETS_BYTES: [u64; 2] = [0, 32 << 10];
/// Entries in one summary block: (4092 − 128) / 16, rounded down.
pub const ENTRIES_PER_SUMMARY: usize = 247;
const ENTRIES_OFFSET: usize = 128;
const ENTRY_SIZE_BYTES: usize = 16;
const CHECKSUM_OFFSET: usize = BLOCK_SIZE_BYTES - 4;

/// Positions the superblock has an expected member UUID for (the largest member count).
pub const MEMBER_UUID_SLOTS: usize = crate::layout::geometry::MAXIMUM_MEMBER_COUNT as usize;
/// Retired (replaced) members the superblock remembers; the oldest is forgotten first.
pub const RETIRED_MEMBERS_MAXIMUM: usize = 32;
/// The member UUID recorded for a retired member that had none (written by version 1):
/// the old device of that position is still refused by name.
pub const RETIRED_WITHOUT_IDENTITY: [u8; 16] = [0xFF; 16];
const HOLDER_HOST_BYTES: usize = 64;
const HOLDER_PROGRAM_BYTES: usize = 24;
const MEMBER_UUIDS_OFFSET: usize = 256;
const RETIRED_OFFSET: usize = MEMBER_UUIDS_OFFSET + MEMBER_UUID_SLOTS * 16;
const RETIRED_RECORD_BYTES: usize = 32;
const HOLDER_FLAG_OPEN: u32 = 1;

/// The checksum that identifies a block's content (docs/on-disk-format.md, "Block
/// checksums"): the CRC32C of the whole block, except for a block that carries the CRC32C
/// of its first 4092 bytes in its last 4 (a summary, a checkpoint page), whose own CRC is
/// its identity. The CRC32C of a whole self-checksummed block is the same constant (the
/// CRC's residue) for every such block, so it would let any stale summary pass for any
/// other.
pub fn block_checksum(block: &[u8]) -> u32 {
    let (own, whole) = checksums_of(block);
    own.unwrap_or(whole)
}

/// Whether `block` is the block whose checksum was recorded as `expected`. Besides
/// [`block_checksum`], the whole-block CRC32C proves a block: what volumes recorded for a
/// self-checksummed client block before the rule above existed.
pub fn checksum_proves(block: &[u8], expected: u32) -> bool {
    let (own, whole) = checksums_of(block);
    own == Some(expected) || whole == expected
}

/// A block's own CRC (when its last 4 bytes hold the CRC32C of the rest) and its
/// whole-block CRC32C, from one pass over it.
fn checksums_of(block: &[u8]) -> (Option<u32>, u32) {
    if block.len() != BLOCK_SIZE_BYTES {
        return (None, crc32c::crc32c(block));
    }
    let head = crc32c::crc32c(&block[..CHECKSUM_OFFSET]);
    let own = (head == read_u32(block, CHECKSUM_OFFSET)).then_some(head);
    (own, crc32c::crc32c_append(head, &block[CHECKSUM_OFFSET..]))
}

/// CRC32C of an all-zero block (padding).
pub fn zero_block_checksum() -> u32 {
    static ZERO: [u8; BLOCK_SIZE_BYTES] = [0; BLOCK_SIZE_BYTES];
    crc32c::crc32c(&ZERO)
}

pub(crate) fn seal(block: &mut [u8]) {
    let checksum = crc32c::crc32c(&block[..CHECKSUM_OFFSET]);
    block[CHECKSUM_OFFSET..BLOCK_SIZE_BYTES].copy_from_slice(&checksum.to_le_bytes());
}

pub(crate) fn checksum_matches(block: &[u8]) -> bool {
    crc32c::crc32c(&block[..CHECKSUM_OFFSET]) == read_u32(block, CHECKSUM_OFFSET)
}

pub(crate) fn read_u16(block: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([block[offset], block[offset + 1]])
}
pub(crate) fn read_u32(block: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(block[offset..offset + 4].try_into().expect("4 bytes"))
}
pub(crate) fn read_u64(block: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(block[offset..offset + 8].try_into().expect("8 bytes"))
}
pub(crate) fn read_uuid(block: &[u8], offset: usize) -> [u8; 16] {
    block[offset..offset + 16].try_into().expect("16 bytes")
}
pub(crate) fn put(block: &mut [u8], offset: usize, bytes: &[u8]) {
    block[offset..offset + bytes.len()].copy_from_slice(bytes);
}

/// Text in a zero-padded field: at most `size` bytes, cut at a character boundary.
fn put_text(block: &mut [u8], offset: usize, size: usize, text: &str) {
    let mut end = text.len().min(size);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    put(block, offset, &text.as_bytes()[..end]);
}
fn read_text(block: &[u8], offset: usize, size: usize) -> String {
    let field = &block[offset..offset + size];
    let length = field.iter().position(|&byte| byte == 0).unwrap_or(size);
    String::from_utf8_lossy(&field[..length]).into_owned()
}

/// A member that a replacement displaced: its UUID is refused in any position from then on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetiredMember {
    pub member_uuid: [u8; 16],
    pub position: u32,
    pub retired_unix_seconds: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub copy: u32,
    /// The version this superblock was read as (always [`SUPERBLOCK_VERSION`] when written).
    pub version: u32,
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
    /// +1 at every superblock update: orders the superblocks of one epoch.
    pub update_sequence: u64,
    /// This device's own member UUID (zero: written by version 1).
    pub member_uuid: [u8; 16],
    pub holder: Holder,
    /// The member UUID expected in each position, `member_count` of them (zero: unknown).
    pub member_uuids: Vec<[u8; 16]>,
    /// Members replaced so far, oldest first, at most [`RETIRED_MEMBERS_MAXIMUM`].
    pub retired: Vec<RetiredMember>,
    /// Bits per index entry, fixed at creation (zero: a version-2 superblock).
    pub index_entry_width_bits: u8,
    /// The latest complete checkpoint (docs/index-and-checkpoints.md); `None`: the log
    /// is read from its beginning at mount.
    pub checkpoint: Option<CheckpointReference>,
    /// The volume's lifetime counters when this superblock was written (the same on every
    /// member).
    pub lifetime: LifetimeCounters,
    /// The last batch whose member bytes `lifetime` counts (0: not recorded, a volume
    /// written before it was): mount adds what it replays after it, so that a crash loses
    /// no count of a write recovery kept.
    pub lifetime_counted_through_sequence: u64,
    /// Bytes written to this member over its life in the volume (differs per member).
    pub member_bytes_written: u64,
    /// The volume's write log (docs/write-log.md), if it has one.
    pub write_log: Option<WriteLogReference>,
    /// Incompatible features in use ([`KNOWN_FEATURES`]); zero: none, version 3.
    pub incompatible_features: u64,
    /// How new writes are stored: [`CompressionSetting`] (changeable while served).
    pub compression: CompressionSetting,
    /// Whether new writes are deduplicated (byte 2338; only with
    /// [`FEATURE_DEDUPLICATION`]; changeable while served).
    pub deduplication: bool,
}

/// Whether new writes are compressed (superblock byte 2337).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressionSetting {
    #[default]
    Off,
    Lz4,
}

impl CompressionSetting {
    pub fn code(self) -> u8 {
        match self {
            CompressionSetting::Off => 0,
            CompressionSetting::Lz4 => 1,
        }
    }

    pub fn from_code(code: u8) -> Option<CompressionSetting> {
        match code {
            0 => Some(CompressionSetting::Off),
            1 => Some(CompressionSetting::Lz4),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CompressionSetting::Off => "off",
            CompressionSetting::Lz4 => "lz4",
        }
    }
}

/// A compression setting that is not one (`CompressionSetting::from_str`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("compression '{text}': expected lz4 or off")]
pub struct UnknownCompressionSetting {
    /// What was given.
    pub text: String,
}

impl std::str::FromStr for CompressionSetting {
    type Err = UnknownCompressionSetting;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "off" => Ok(CompressionSetting::Off),
            "lz4" | "on" => Ok(CompressionSetting::Lz4),
            other => Err(UnknownCompressionSetting { text: other.to_string() }),
        }
    }
}

impl std::fmt::Display for CompressionSetting {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// Where a volume's write log is: its UUID and its devices' paths (two for a mirror).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteLogReference {
    pub log_uuid: [u8; 16],
    pub paths: Vec<String>,
}

const WRITE_LOG_OFFSET: usize = 3072;
/// Bytes for each log device's path in the superblock.
pub const WRITE_LOG_PATH_BYTES: usize = 480;

const LIFETIME_COUNTERS_OFFSET: usize = 2368;
/// After the counters: the last batch they count (8 bytes).
const LIFETIME_COUNTED_THROUGH_OFFSET: usize = LIFETIME_COUNTERS_OFFSET + 8 * LIFETIME_COUNTER_COUNT;

/// Where a superblock says the latest complete checkpoint's root block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointReference {
    /// Data-space position of the root block.
    pub root_position: u64,
    /// CRC32C of the root block.
    pub root_checksum: u32,
    pub generation: u64,
    /// Every batch up to this sequence is reflected in the checkpoint.
    pub sequence: u64,
}

impl Superblock {
    pub fn encode(&self, block: &mut [u8]) {
        block[..BLOCK_SIZE_BYTES].fill(0);
        put(block, 0, SUPERBLOCK_MAGIC);
        let version =
            if self.incompatible_features != 0 { SUPERBLOCK_VERSION_WITH_FEATURES } else { SUPERBLOCK_VERSION };
        put(block, 8, &version.to_le_bytes());
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
        put(block, 120, &self.update_sequence.to_le_bytes());
        put(block, 128, &self.member_uuid);
        let flags = if self.holder.open { HOLDER_FLAG_OPEN } else { 0 };
        put(block, 144, &flags.to_le_bytes());
        put(block, 148, &self.holder.process_id.to_le_bytes());
        put(block, 152, &self.holder.opened_unix_seconds.to_le_bytes());
        put(block, 160, &self.holder.closed_unix_seconds.to_le_bytes());
        put_text(block, 168, HOLDER_HOST_BYTES, &self.holder.host);
        put_text(block, 232, HOLDER_PROGRAM_BYTES, &self.holder.program);
        for (position, uuid) in self.member_uuids.iter().take(MEMBER_UUID_SLOTS).enumerate() {
            put(block, MEMBER_UUIDS_OFFSET + position * 16, uuid);
        }
        let retired = &self.retired[self.retired.len().saturating_sub(RETIRED_MEMBERS_MAXIMUM)..];
        for (index, member) in retired.iter().enumerate() {
            let offset = RETIRED_OFFSET + index * RETIRED_RECORD_BYTES;
            put(block, offset, &member.member_uuid);
            put(block, offset + 16, &member.position.to_le_bytes());
            put(block, offset + 24, &member.retired_unix_seconds.to_le_bytes());
        }
        if let Some(checkpoint) = &self.checkpoint {
            put(block, 2304, &(checkpoint.root_position + 1).to_le_bytes());
            put(block, 2312, &checkpoint.root_checksum.to_le_bytes());
            put(block, 2320, &checkpoint.generation.to_le_bytes());
            put(block, 2328, &checkpoint.sequence.to_le_bytes());
        }
        block[2336] = self.index_entry_width_bits;
        block[2337] = self.compression.code();
        block[2338] = self.deduplication as u8;
        put(block, 2352, &self.member_bytes_written.to_le_bytes());
        put(block, 2360, &self.incompatible_features.to_le_bytes());
        for (index, value) in self.lifetime.to_array().iter().enumerate() {
            put(block, LIFETIME_COUNTERS_OFFSET + 8 * index, &value.to_le_bytes());
        }
        put(block, LIFETIME_COUNTED_THROUGH_OFFSET, &self.lifetime_counted_through_sequence.to_le_bytes());
        if let Some(log) = &self.write_log {
            put(block, WRITE_LOG_OFFSET, &(log.paths.len() as u32).to_le_bytes());
            put(block, WRITE_LOG_OFFSET + 8, &log.log_uuid);
            for (index, path) in log.paths.iter().take(2).enumerate() {
                put_text(block, WRITE_LOG_OFFSET + 24 + index * WRITE_LOG_PATH_BYTES, WRITE_LOG_PATH_BYTES, path);
            }
        }
        seal(block);
    }

    pub fn decode(block: &[u8], expected_copy: u32) -> Result<Superblock, SuperblockProblem> {
        if &block[0..8] != SUPERBLOCK_MAGIC {
            return Err(SuperblockProblem::NotStripelog);
        }
        let version = read_u32(block, 8);
        if !(SUPERBLOCK_VERSION_WITHOUT_IDENTITY..=SUPERBLOCK_VERSION_WITH_FEATURES).contains(&version) {
            return Err(SuperblockProblem::UnsupportedVersion(version));
        }
        if !checksum_matches(block) {
            return Err(SuperblockProblem::BadChecksum);
        }
        let incompatible_features = if version >= SUPERBLOCK_VERSION_WITH_FEATURES { read_u64(block, 2360) } else { 0 };
        if incompatible_features & !KNOWN_FEATURES != 0 {
            return Err(SuperblockProblem::UnknownFeatures(incompatible_features & !KNOWN_FEATURES));
        }
        if version >= SUPERBLOCK_VERSION_WITH_FEATURES && incompatible_features == 0 {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::VersionWithoutFeatures { version }));
        }
        let compression = if version >= SUPERBLOCK_VERSION {
            CompressionSetting::from_code(block[2337]).ok_or_else(|| {
                SuperblockProblem::Inconsistent(SuperblockInconsistency::UnknownCompression(block[2337]))
            })?
        } else {
            CompressionSetting::Off
        };
        if compression != CompressionSetting::Off && incompatible_features & FEATURE_PACKED_FRAGMENTS == 0 {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::CompressionWithoutPackedFragments));
        }
        let both = FEATURE_PACKED_FRAGMENTS | FEATURE_DEDUPLICATION;
        if incompatible_features & FEATURE_COMPRESSED_SHARED_COPIES != 0 && incompatible_features & both != both {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::CompressedCopiesWithoutBoth));
        }
        let deduplication = match if version >= SUPERBLOCK_VERSION { block[2338] } else { 0 } {
            0 => false,
            1 if incompatible_features & FEATURE_DEDUPLICATION != 0 => true,
            other => {
                return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::DeduplicationSetting {
                    setting: other,
                    with_feature: incompatible_features & FEATURE_DEDUPLICATION != 0,
                }))
            }
        };
        let copy = read_u32(block, 12);
        if copy != expected_copy {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::WrongCopy {
                found: copy,
                expected: expected_copy,
            }));
        }
        let raid_code = read_u32(block, 40);
        let raid_level = RaidLevel::from_code(raid_code)
            .ok_or(SuperblockProblem::Inconsistent(SuperblockInconsistency::UnknownRaidLevel(raid_code)))?;
        let block_size = read_u32(block, 48);
        if block_size as usize != BLOCK_SIZE_BYTES {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::BlockSize(block_size)));
        }
        let member_count = read_u32(block, 36);
        let mut superblock = Superblock {
            copy,
            version,
            volume_uuid: read_uuid(block, 16),
            member_index: read_u32(block, 32),
            member_count,
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
            update_sequence: 0,
            member_uuid: [0; 16],
            holder: Holder::default(),
            member_uuids: vec![[0; 16]; (member_count as usize).min(MEMBER_UUID_SLOTS)],
            retired: Vec::new(),
            index_entry_width_bits: 0,
            checkpoint: None,
            lifetime: LifetimeCounters::default(),
            lifetime_counted_through_sequence: 0,
            member_bytes_written: 0,
            write_log: None,
            incompatible_features,
            compression,
            deduplication,
        };
        // The geometry must be one we would have created, and agree with its own sizes.
        let geometry = Geometry::validate(
            superblock.raid_level,
            superblock.member_count as usize,
            superblock.chunk_size_bytes,
            superblock.spare_ppm,
            superblock.member_size_bytes,
        )
        .map_err(|problem| SuperblockProblem::Inconsistent(SuperblockInconsistency::Geometry(problem)))?
        .with_thin_logical_blocks(superblock.geometry().thin_logical_block_count);
        if superblock.incompatible_features & FEATURE_THIN_PROVISIONED != 0
            && thin_logical_blocks(superblock.logical_size_bytes).is_none()
        {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::ThinLogicalSize(
                superblock.logical_size_bytes,
            )));
        }
        if geometry.segment_count() != superblock.segment_count
            || geometry.logical_size_bytes() != superblock.logical_size_bytes
            || superblock.member_index >= superblock.member_count
            || superblock.rebuilding_members & !superblock.failed_members != 0
        {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::SizesDoNotMatch));
        }
        if version >= SUPERBLOCK_VERSION_WITHOUT_INDEX {
            superblock.decode_identity(block)?;
        }
        if version >= SUPERBLOCK_VERSION {
            superblock.index_entry_width_bits = block[2336];
            superblock.member_bytes_written = read_u64(block, 2352);
            let mut values = [0u64; LIFETIME_COUNTER_COUNT];
            for (index, value) in values.iter_mut().enumerate() {
                *value = read_u64(block, LIFETIME_COUNTERS_OFFSET + 8 * index);
            }
            superblock.lifetime = LifetimeCounters::from_array(values);
            superblock.lifetime_counted_through_sequence = read_u64(block, LIFETIME_COUNTED_THROUGH_OFFSET);
            let log_devices = read_u32(block, WRITE_LOG_OFFSET) as usize;
            if log_devices > 0 {
                if log_devices > 2 {
                    return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::WriteLogDevices(log_devices)));
                }
                superblock.write_log = Some(WriteLogReference {
                    log_uuid: read_uuid(block, WRITE_LOG_OFFSET + 8),
                    paths: (0..log_devices)
                        .map(|index| {
                            read_text(block, WRITE_LOG_OFFSET + 24 + index * WRITE_LOG_PATH_BYTES, WRITE_LOG_PATH_BYTES)
                        })
                        .collect(),
                });
            }
            let root = read_u64(block, 2304);
            if root != 0 {
                superblock.checkpoint = Some(CheckpointReference {
                    root_position: root - 1,
                    root_checksum: read_u32(block, 2312),
                    generation: read_u64(block, 2320),
                    sequence: read_u64(block, 2328),
                });
            }
        }
        Ok(superblock)
    }

    /// The fields of version 2: update sequence, member identity, holder, retired members.
    fn decode_identity(&mut self, block: &[u8]) -> Result<(), SuperblockProblem> {
        self.update_sequence = read_u64(block, 120);
        self.member_uuid = read_uuid(block, 128);
        let flags = read_u32(block, 144);
        if flags & !HOLDER_FLAG_OPEN != 0 {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::UnknownHolderFlags(flags)));
        }
        self.holder = Holder {
            open: flags & HOLDER_FLAG_OPEN != 0,
            process_id: read_u32(block, 148),
            opened_unix_seconds: read_u64(block, 152),
            closed_unix_seconds: read_u64(block, 160),
            host: read_text(block, 168, HOLDER_HOST_BYTES),
            program: read_text(block, 232, HOLDER_PROGRAM_BYTES),
        };
        for (position, uuid) in self.member_uuids.iter_mut().enumerate() {
            *uuid = read_uuid(block, MEMBER_UUIDS_OFFSET + position * 16);
        }
        let beyond_count = (self.member_count as usize..MEMBER_UUID_SLOTS)
            .any(|position| read_uuid(block, MEMBER_UUIDS_OFFSET + position * 16) != [0; 16]);
        if beyond_count {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::MemberUuidsBeyondCount));
        }
        if self.member_uuid != [0; 16] && self.member_uuids[self.member_index as usize] != self.member_uuid {
            return Err(SuperblockProblem::Inconsistent(SuperblockInconsistency::OwnUuidMismatch));
        }
        for index in 0..RETIRED_MEMBERS_MAXIMUM {
            let offset = RETIRED_OFFSET + index * RETIRED_RECORD_BYTES;
            let member_uuid = read_uuid(block, offset);
            if member_uuid == [0; 16] {
                break;
            }
            self.retired.push(RetiredMember {
                member_uuid,
                position: read_u32(block, offset + 16),
                retired_unix_seconds: read_u64(block, offset + 24),
            });
        }
        Ok(())
    }

    pub fn geometry(&self) -> Geometry {
        Geometry {
            raid_level: self.raid_level,
            member_count: self.member_count as usize,
            chunk_size_bytes: self.chunk_size_bytes,
            spare_ppm: self.spare_ppm,
            member_size_bytes: self.member_size_bytes,
            packed_fragments: self.incompatible_features & FEATURE_PACKED_FRAGMENTS != 0,
            thin_logical_block_count: (self.incompatible_features & FEATURE_THIN_PROVISIONED != 0)
                .then(|| self.logical_size_bytes / BLOCK_SIZE_BYTES as u64),
            shared_blocks: self.incompatible_features & FEATURE_DEDUPLICATION != 0,
            compressed_shared_copies: self.incompatible_features & FEATURE_COMPRESSED_SHARED_COPIES != 0,
        }
    }

    /// Whether this superblock is newer than `other` (of the same volume): a later epoch,
    /// or a later update within it.
    pub fn is_newer_than(&self, other: &Superblock) -> bool {
        (self.epoch, self.update_sequence, self.durable_through_sequence)
            > (other.epoch, other.update_sequence, other.durable_through_sequence)
    }

    /// The record of a retired member with `member_uuid`, if it is one.
    pub fn retired_member(&self, member_uuid: &[u8; 16]) -> Option<&RetiredMember> {
        self.retired.iter().rev().find(|member| &member.member_uuid == member_uuid)
    }

    /// A retirement of the version-1 device (no member UUID) of `position`.
    pub fn retired_without_identity(&self, position: usize) -> Option<&RetiredMember> {
        self.retired
            .iter()
            .rev()
            .find(|member| member.member_uuid == RETIRED_WITHOUT_IDENTITY && member.position as usize == position)
    }

    /// Retire the member UUID of `position` (unknown: [`RETIRED_WITHOUT_IDENTITY`]) and
    /// expect `new_uuid` there.
    pub fn retire_and_replace(&mut self, position: usize, new_uuid: [u8; 16], now_unix_seconds: u64) {
        let old = std::mem::replace(&mut self.member_uuids[position], new_uuid);
        let old = if old == [0; 16] { RETIRED_WITHOUT_IDENTITY } else { old };
        if old != new_uuid {
            if self.retired.len() == RETIRED_MEMBERS_MAXIMUM {
                self.retired.remove(0);
            }
            self.retired.push(RetiredMember {
                member_uuid: old,
                position: position as u32,
                retired_unix_seconds: now_unix_seconds,
            });
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
    /// sequence number lies after the end of the log (a torn write of a new head) or its
    /// epoch and segment open sequence show an earlier use of the segment (stale content
    /// after the end of a chain).
    DamagedSummary { sequence: u64, epoch: u64, segment_open_sequence: u64 },
    /// Anything else (a torn new head whose first sector did not land, old data).
    Other,
}

/// One entry of a batch summary: what a batch did to the logical space, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Logical block `logical_block` now holds the next data block of the group.
    /// `lifetime_class`: how long the block's previous version lived (the cleaner's
    /// prediction of this one's life; [`LIFETIME_CLASS_UNKNOWN`]: not known).
    Data { logical_block: u64, checksum: u32, lifetime_class: u8 },
    /// `block_count` blocks from `logical_block` read as zeros (written zeros).
    Zero { logical_block: u64, block_count: u32 },
    /// `block_count` blocks from `logical_block` are unmapped (trimmed).
    Trim { logical_block: u64, block_count: u32 },
    /// The next block of the group is a checkpoint block (docs/index-and-checkpoints.md):
    /// the page numbered `number` of its kind. Replay and the cleaner pass over it; only
    /// the checkpoint that names it gives it meaning.
    Page { kind: PageKind, number: u64, checksum: u32 },
    /// The next data block of the group is a packed block (docs/compression.md): fragments
    /// start in it, or continue into it from the packed block before it. `checksum`: its
    /// block checksum (final when its batch is sealed).
    Packed { checksum: u32 },
    /// The next data block of the group is the copy of shared-block record `record`
    /// (docs/deduplication.md): written when the record is born (kind 10) or moved there
    /// by the cleaner (`moved`, kind 12). The record's position is this block's.
    SharedCopy { record: u64, checksum: u32, lifetime_class: u8, moved: bool },
    /// Logical block `logical_block` now refers to shared-block record `record` (kind 11;
    /// it takes no block).
    Reference { record: u64, logical_block: u64 },
    /// Shared-block record `record`'s copy is a fragment keyed `2^63 | record` that starts
    /// in the packed block the latest `Packed` entry of the same summary consumed (kind 15;
    /// no block of its own): born there, or moved there by the cleaner (`moved`).
    /// `checksum`: its unit checksum; `sixteenths`: its share of the space, 1–16.
    SharedFragment { record: u64, checksum: u32, lifetime_class: u8, sixteenths: u8, moved: bool },
    /// Logical block `logical_block` is served by a fragment that starts in the packed
    /// block the latest `Packed` entry of the same summary consumed (it takes no block of
    /// its own). `checksum`: the fragment's unit checksum; `sixteenths`: the block's share
    /// of the fragment's space, 1–16.
    Fragment { logical_block: u64, checksum: u32, lifetime_class: u8, sixteenths: u8 },
}

/// What a checkpoint block in the log is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    Index,
    Directory,
    SegmentTable,
    Root,
    /// A page of the shared-block table (deduplication's records).
    SharedTable,
    /// A page of deduplication's name index (hints, docs/deduplication.md).
    NameTable,
}

const ENTRY_KIND_DATA: u8 = 1;
const ENTRY_KIND_ZERO: u8 = 2;
const ENTRY_KIND_TRIM: u8 = 3;
const ENTRY_KIND_INDEX_PAGE: u8 = 4;
const ENTRY_KIND_DIRECTORY_PAGE: u8 = 5;
const ENTRY_KIND_SEGMENT_TABLE_PAGE: u8 = 6;
const ENTRY_KIND_CHECKPOINT_ROOT: u8 = 7;
const ENTRY_KIND_PACKED: u8 = 8;
const ENTRY_KIND_FRAGMENT: u8 = 9;
const ENTRY_KIND_SHARED_COPY: u8 = 10;
const ENTRY_KIND_REFERENCE: u8 = 11;
const ENTRY_KIND_SHARED_COPY_MOVED: u8 = 12;
const ENTRY_KIND_SHARED_TABLE_PAGE: u8 = 13;
const ENTRY_KIND_NAME_TABLE_PAGE: u8 = 14;
const ENTRY_KIND_SHARED_FRAGMENT: u8 = 15;
/// Shared-block record numbers fit in 56 bits (they are below the data positions).
pub const SHARED_RECORD_BITS: u32 = 56;
/// A fragment's share of its packed block, in sixteenths: 1 … this.
pub const SIXTEENTHS_PER_BLOCK: u8 = 16;

impl Entry {
    fn encode(&self, bytes: &mut [u8]) {
        let mut share = 0u8;
        if let Entry::Reference { record, logical_block } = *self {
            assert!(record >> SHARED_RECORD_BITS == 0, "record {record} beyond 56 bits");
            bytes[..ENTRY_SIZE_BYTES].fill(0);
            bytes[0] = ENTRY_KIND_REFERENCE;
            bytes[1] = (record >> 48) as u8;
            put(bytes, 2, &((record >> 32) as u16).to_le_bytes());
            put(bytes, 4, &(record as u32).to_le_bytes());
            put(bytes, 8, &logical_block.to_le_bytes());
            return;
        }
        let mut flags = 0u8;
        let (kind, class, value, logical_block) = match *self {
            Entry::SharedFragment { record, checksum, lifetime_class, sixteenths, moved } => {
                assert!(record >> SHARED_RECORD_BITS == 0, "record {record} beyond 56 bits");
                share = sixteenths;
                flags = moved as u8;
                (ENTRY_KIND_SHARED_FRAGMENT, lifetime_class, checksum, record)
            }
            Entry::SharedCopy { record, checksum, lifetime_class, moved } => {
                let kind = if moved { ENTRY_KIND_SHARED_COPY_MOVED } else { ENTRY_KIND_SHARED_COPY };
                (kind, lifetime_class, checksum, record)
            }
            Entry::Reference { .. } => unreachable!("encoded above"),
            Entry::Packed { checksum } => (ENTRY_KIND_PACKED, 0, checksum, 0),
            Entry::Fragment { logical_block, checksum, lifetime_class, sixteenths } => {
                share = sixteenths;
                (ENTRY_KIND_FRAGMENT, lifetime_class, checksum, logical_block)
            }
            Entry::Data { logical_block, checksum, lifetime_class } => {
                (ENTRY_KIND_DATA, lifetime_class, checksum, logical_block)
            }
            Entry::Zero { logical_block, block_count } => (ENTRY_KIND_ZERO, 0, block_count, logical_block),
            Entry::Trim { logical_block, block_count } => (ENTRY_KIND_TRIM, 0, block_count, logical_block),
            Entry::Page { kind, number, checksum } => {
                let kind = match kind {
                    PageKind::Index => ENTRY_KIND_INDEX_PAGE,
                    PageKind::Directory => ENTRY_KIND_DIRECTORY_PAGE,
                    PageKind::SegmentTable => ENTRY_KIND_SEGMENT_TABLE_PAGE,
                    PageKind::Root => ENTRY_KIND_CHECKPOINT_ROOT,
                    PageKind::SharedTable => ENTRY_KIND_SHARED_TABLE_PAGE,
                    PageKind::NameTable => ENTRY_KIND_NAME_TABLE_PAGE,
                };
                (kind, 0, checksum, number)
            }
        };
        bytes[..ENTRY_SIZE_BYTES].fill(0);
        bytes[0] = kind;
        bytes[1] = class;
        bytes[2] = share;
        bytes[3] = flags;
        put(bytes, 4, &value.to_le_bytes());
        put(bytes, 8, &logical_block.to_le_bytes());
    }

    fn decode(bytes: &[u8], version: u16) -> Option<Entry> {
        let value = read_u32(bytes, 4);
        let logical_block = read_u64(bytes, 8);
        let lifetime_class = if version == SUMMARY_VERSION_WITHOUT_CLOCKS { LIFETIME_CLASS_UNKNOWN } else { bytes[1] };
        match bytes[0] {
            ENTRY_KIND_DATA => Some(Entry::Data { logical_block, checksum: value, lifetime_class }),
            ENTRY_KIND_ZERO if value > 0 => Some(Entry::Zero { logical_block, block_count: value }),
            ENTRY_KIND_TRIM if value > 0 => Some(Entry::Trim { logical_block, block_count: value }),
            ENTRY_KIND_PACKED
                if version >= SUMMARY_VERSION_WITHOUT_SHARING && logical_block == 0 && bytes[1..4] == [0, 0, 0] =>
            {
                Some(Entry::Packed { checksum: value })
            }
            ENTRY_KIND_FRAGMENT
                if version >= SUMMARY_VERSION_WITHOUT_SHARING && (1..=SIXTEENTHS_PER_BLOCK).contains(&bytes[2]) =>
            {
                Some(Entry::Fragment { logical_block, checksum: value, lifetime_class, sixteenths: bytes[2] })
            }
            kind @ (ENTRY_KIND_SHARED_COPY | ENTRY_KIND_SHARED_COPY_MOVED)
                if version >= SUMMARY_VERSION && bytes[2..4] == [0, 0] && logical_block >> SHARED_RECORD_BITS == 0 =>
            {
                Some(Entry::SharedCopy {
                    record: logical_block,
                    checksum: value,
                    lifetime_class,
                    moved: kind == ENTRY_KIND_SHARED_COPY_MOVED,
                })
            }
            ENTRY_KIND_SHARED_FRAGMENT
                if version >= SUMMARY_VERSION
                    && (1..=SIXTEENTHS_PER_BLOCK).contains(&bytes[2])
                    && bytes[3] <= 1
                    && logical_block >> SHARED_RECORD_BITS == 0 =>
            {
                Some(Entry::SharedFragment {
                    record: logical_block,
                    checksum: value,
                    lifetime_class,
                    sixteenths: bytes[2],
                    moved: bytes[3] == 1,
                })
            }
            ENTRY_KIND_REFERENCE if version >= SUMMARY_VERSION => {
                let record = (bytes[1] as u64) << 48 | (read_u16(bytes, 2) as u64) << 32 | value as u64;
                Some(Entry::Reference { record, logical_block })
            }
            ENTRY_KIND_SHARED_TABLE_PAGE if version >= SUMMARY_VERSION => {
                Some(Entry::Page { kind: PageKind::SharedTable, number: logical_block, checksum: value })
            }
            ENTRY_KIND_NAME_TABLE_PAGE if version >= SUMMARY_VERSION => {
                Some(Entry::Page { kind: PageKind::NameTable, number: logical_block, checksum: value })
            }
            kind @ ENTRY_KIND_INDEX_PAGE..=ENTRY_KIND_CHECKPOINT_ROOT if version > SUMMARY_VERSION_WITHOUT_CLOCKS => {
                let kind = match kind {
                    ENTRY_KIND_INDEX_PAGE => PageKind::Index,
                    ENTRY_KIND_DIRECTORY_PAGE => PageKind::Directory,
                    ENTRY_KIND_SEGMENT_TABLE_PAGE => PageKind::SegmentTable,
                    _ => PageKind::Root,
                };
                Some(Entry::Page { kind, number: logical_block, checksum: value })
            }
            _ => None,
        }
    }

    /// Whether the entry describes the next block of its group (data or a checkpoint page),
    /// rather than a range of logical blocks.
    pub fn has_block(&self) -> bool {
        match self {
            Entry::Data { .. } | Entry::Page { .. } | Entry::Packed { .. } | Entry::SharedCopy { .. } => true,
            Entry::Zero { .. }
            | Entry::Trim { .. }
            | Entry::Reference { .. }
            | Entry::Fragment { .. }
            | Entry::SharedFragment { .. } => false,
        }
    }

    /// Whether the entry needs summary version 4 (kinds 10–15 but 14's page kind).
    pub fn is_sharing(&self) -> bool {
        matches!(self.needs_feature(), Some(EntryFeature::SharedBlocks | EntryFeature::CompressedSharedCopies))
    }

    /// Whether the entry names a packed fragment (kind 8, 9 or 15).
    pub fn is_fragment(&self) -> bool {
        matches!(self.needs_feature(), Some(EntryFeature::PackedFragments | EntryFeature::CompressedSharedCopies))
    }

    /// The volume feature the entry needs: a volume created without it never holds one.
    pub fn needs_feature(&self) -> Option<EntryFeature> {
        match self {
            Entry::Packed { .. } | Entry::Fragment { .. } => Some(EntryFeature::PackedFragments),
            Entry::SharedCopy { .. } | Entry::Reference { .. } => Some(EntryFeature::SharedBlocks),
            Entry::SharedFragment { .. } => Some(EntryFeature::CompressedSharedCopies),
            Entry::Page { kind: PageKind::SharedTable | PageKind::NameTable, .. } => Some(EntryFeature::SharedBlocks),
            Entry::Page {
                kind: PageKind::Index | PageKind::Directory | PageKind::SegmentTable | PageKind::Root,
                ..
            }
            | Entry::Data { .. }
            | Entry::Zero { .. }
            | Entry::Trim { .. } => None,
        }
    }

    /// The CRC32C that the block the entry describes must prove (its position's checksum):
    /// `None` for an entry that describes no block of its own. (A fragment's checksum is its
    /// unit's, decompressed; the packed block it starts in is proven by its `Packed` entry.)
    pub fn block_checksum(&self) -> Option<u32> {
        match *self {
            Entry::Data { checksum, .. }
            | Entry::Page { checksum, .. }
            | Entry::Packed { checksum }
            | Entry::SharedCopy { checksum, .. } => Some(checksum),
            Entry::Zero { .. }
            | Entry::Trim { .. }
            | Entry::Reference { .. }
            | Entry::Fragment { .. }
            | Entry::SharedFragment { .. } => None,
        }
    }

    /// How long the previous version of the block lived, as the writer recorded it (the
    /// cleaner's prediction of this version's life); unknown for entries without one.
    pub fn lifetime_class(&self) -> u8 {
        match *self {
            Entry::Data { lifetime_class, .. }
            | Entry::SharedCopy { lifetime_class, .. }
            | Entry::SharedFragment { lifetime_class, .. }
            | Entry::Fragment { lifetime_class, .. } => lifetime_class,
            Entry::Zero { .. }
            | Entry::Trim { .. }
            | Entry::Page { .. }
            | Entry::Packed { .. }
            | Entry::Reference { .. } => LIFETIME_CLASS_UNKNOWN,
        }
    }

    /// Whether the entry can stand in a batch of a volume of `geometry`: its feature is the
    /// volume's, the shared-block record it names is in range, the logical blocks it maps
    /// are in the volume. Mount refuses a log with an entry that cannot (a log no run of
    /// the engine writes).
    pub fn validate(&self, geometry: &Geometry, sequence: u64) -> Result<(), crate::error::LogInconsistency> {
        use crate::error::LogInconsistency;
        match self.needs_feature() {
            Some(EntryFeature::PackedFragments) if !geometry.packed_fragments => {
                return Err(LogInconsistency::FragmentWithoutFeature { sequence });
            }
            Some(EntryFeature::SharedBlocks) if !geometry.shared_blocks => {
                return Err(LogInconsistency::SharingWithoutFeature { sequence });
            }
            Some(EntryFeature::CompressedSharedCopies) if !geometry.compressed_shared_copies => {
                return Err(LogInconsistency::CompressedCopyWithoutFeature { sequence });
            }
            Some(EntryFeature::PackedFragments | EntryFeature::SharedBlocks | EntryFeature::CompressedSharedCopies)
            | None => {}
        }
        let (first_block, block_count) = match *self {
            Entry::SharedCopy { record, .. }
            | Entry::Reference { record, .. }
            | Entry::SharedFragment { record, .. }
                if record >= geometry.physical_data_blocks() =>
            {
                return Err(LogInconsistency::BadSharedRecord { sequence, record });
            }
            Entry::Data { logical_block, .. }
            | Entry::Fragment { logical_block, .. }
            | Entry::Reference { logical_block, .. } => (logical_block, 1),
            Entry::Zero { logical_block, block_count } | Entry::Trim { logical_block, block_count } => {
                (logical_block, block_count as u64)
            }
            Entry::SharedCopy { .. } | Entry::SharedFragment { .. } | Entry::Page { .. } | Entry::Packed { .. } => {
                return Ok(())
            }
        };
        let logical_blocks = geometry.logical_block_count();
        if first_block.checked_add(block_count).is_none_or(|end| end > logical_blocks) {
            return Err(LogInconsistency::EntryBeyondVolume { sequence, first_block, block_count, logical_blocks });
        }
        Ok(())
    }

    /// What replaying the entry does, given the data-space `position` of the block
    /// [`batch_entries`] says it describes (for a fragment, the packed block it starts in)
    /// and the `segment` of its batch. The one statement of each kind's meaning: mount's
    /// replay, the cleaner's search for live records and `check` all follow it.
    pub fn effect(&self, position: Option<u64>, segment: u64) -> EntryEffect {
        let block_position = || position.expect("batch_entries gives every entry with a block its position");
        match *self {
            Entry::Data { logical_block, .. } => EntryEffect::Map {
                first_logical_block: logical_block,
                block_count: 1,
                mapping: Mapping::Data { position: block_position() },
            },
            Entry::Fragment { logical_block, sixteenths, .. } => EntryEffect::Map {
                first_logical_block: logical_block,
                block_count: 1,
                mapping: Mapping::Fragment { position: block_position(), sixteenths },
            },
            Entry::Reference { record, logical_block } => EntryEffect::Map {
                first_logical_block: logical_block,
                block_count: 1,
                mapping: Mapping::Shared { record },
            },
            Entry::Zero { logical_block, block_count } => EntryEffect::Map {
                first_logical_block: logical_block,
                block_count: block_count as u64,
                mapping: Mapping::Zero { segment },
            },
            Entry::Trim { logical_block, block_count } => EntryEffect::Map {
                first_logical_block: logical_block,
                block_count: block_count as u64,
                mapping: Mapping::Trimmed { segment },
            },
            Entry::SharedCopy { record, moved, .. } => {
                EntryEffect::Copy { record, position: block_position(), fragment: None, moved }
            }
            Entry::SharedFragment { record, sixteenths, moved, .. } => {
                EntryEffect::Copy { record, position: block_position(), fragment: Some(sixteenths), moved }
            }
            // A checkpoint block means something only to the checkpoint that names it; a
            // packed block holds the fragments its `Fragment` entries map.
            Entry::Page { .. } | Entry::Packed { .. } => EntryEffect::Nothing,
        }
    }
}

/// A volume feature an entry kind needs (`Entry::needs_feature`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryFeature {
    /// Compression (feature bit 2): packed blocks and their fragments.
    PackedFragments,
    /// Deduplication (feature bit 4): shared copies, references, shared-table pages.
    SharedBlocks,
    /// Shared copies stored as fragments (feature bit 6, which needs bits 2 and 4).
    CompressedSharedCopies,
}

/// What an entry does to the index when its batch is replayed (`Entry::effect`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryEffect {
    /// Logical blocks `first_logical_block .. + block_count` now map to `mapping`.
    Map { first_logical_block: u64, block_count: u64, mapping: Mapping },
    /// Shared-block record `record`'s copy is the block at `position` (`fragment`: its
    /// share, when it is a fragment keyed by the record in the packed block there): born
    /// there, or moved there by the cleaner (`moved`).
    Copy { record: u64, position: u64, fragment: Option<u8>, moved: bool },
    /// Nothing in the index (a checkpoint block, a packed block).
    Nothing,
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
    /// The segment the batch's stream goes on in when this one is full (reserved when
    /// this one was opened), or [`NO_SEGMENT`]: mount follows these links from a
    /// checkpoint instead of reading every segment.
    pub next_segment: u64,
    /// The write clock (client blocks accepted since the volume was created, from
    /// `WRITE_CLOCK_ORIGIN`) when the batch was sealed; for a relocation batch, the oldest
    /// clock of the blocks it moves. 0: not known (summary version 1).
    pub write_clock: u64,
    /// The stream that wrote it (0 clients, 1–3 relocation).
    pub stream: u8,
    /// The batch with the next sequence number belongs with this one: recovery keeps both
    /// or neither (feature bit 5).
    pub paired_with_next: bool,
}

impl BatchHeader {
    /// Whether this header has the shape of a batch the engine seals at row `row` of
    /// `segment`, ending by row `row_limit`, with `data_columns` blocks per row: at least
    /// one row, a summary first, no more blocks than its rows hold.
    pub fn fits(&self, segment: u64, row: u32, row_limit: u32, data_columns: u32) -> bool {
        self.segment == segment
            && self.first_row == row
            && self.row_count >= 1
            && row as u64 + self.row_count as u64 <= row_limit as u64
            && self.summary_count >= 1
            && self.block_count >= self.summary_count
            && self.block_count as u64 <= self.row_count as u64 * data_columns as u64
    }
}

/// What a batch's data blocks hold, for the counters of member bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchContent {
    /// Clients' blocks (the clients' stream, and a cold batch of client writes).
    Clients,
    /// Blocks the cleaner moved.
    Relocated,
    /// Checkpoint blocks.
    Metadata,
}

impl BatchHeader {
    /// What writing this batch adds to the member-byte counters (and one batch written):
    /// its data blocks as `content`, its summaries as metadata, the empty slots of its
    /// rows as padding, its parity or mirror blocks as redundancy. The one statement of
    /// it: the pipeline counts a batch it wrote so, and mount a batch it found.
    pub fn member_bytes(&self, geometry: &Geometry, content: BatchContent) -> LifetimeCounters {
        let block = BLOCK_SIZE_BYTES as u64;
        let data_columns = geometry.data_columns() as u64;
        let slots = self.row_count as u64 * data_columns;
        assert!(
            self.block_count as u64 <= slots && self.summary_count <= self.block_count,
            "batch {}: its blocks fit its rows",
            self.sequence
        );
        let data_bytes = (self.block_count - self.summary_count) as u64 * block;
        let mut counts = LifetimeCounters {
            member_bytes_metadata: self.summary_count as u64 * block,
            member_bytes_padding: (slots - self.block_count as u64) * block,
            member_bytes_redundancy: (geometry.member_count as u64 - data_columns) * self.row_count as u64 * block,
            batches_written: 1,
            ..LifetimeCounters::default()
        };
        match content {
            BatchContent::Clients => counts.member_bytes_data = data_bytes,
            BatchContent::Relocated => counts.member_bytes_relocated = data_bytes,
            BatchContent::Metadata => counts.member_bytes_metadata += data_bytes,
        }
        counts
    }
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
        let version = if self.entries.iter().any(Entry::is_sharing) {
            SUMMARY_VERSION
        } else if self.entries.iter().any(Entry::is_fragment) {
            SUMMARY_VERSION_WITHOUT_SHARING
        } else {
            SUMMARY_VERSION_WITHOUT_FRAGMENTS
        };
        put(block, 8, &version.to_le_bytes());
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
        put(block, 96, &header.next_segment.to_le_bytes());
        put(block, 104, &header.write_clock.to_le_bytes());
        block[112] = header.stream;
        block[113] = header.paired_with_next as u8;
        for (index, entry) in self.entries.iter().enumerate() {
            let offset = ENTRIES_OFFSET + index * ENTRY_SIZE_BYTES;
            entry.encode(&mut block[offset..offset + ENTRY_SIZE_BYTES]);
        }
        seal(block);
    }

    /// Decode a summary block; `None` when it is not a valid summary of this volume.
    pub fn decode(block: &[u8], volume_uuid: &[u8; 16]) -> Option<Summary> {
        let version = read_u16(block, 8);
        if &block[0..8] != SUMMARY_MAGIC
            || !(SUMMARY_VERSION_WITHOUT_CLOCKS..=SUMMARY_VERSION).contains(&version)
            || !checksum_matches(block)
            || &block[16..32] != volume_uuid
        {
            return None;
        }
        let entry_count = read_u16(block, 12) as usize;
        if entry_count > ENTRIES_PER_SUMMARY {
            return None;
        }
        // Version 1 wrote zeros from 96: no link, clock or stream.
        let (next_segment, write_clock, stream, paired_with_next) = if version == SUMMARY_VERSION_WITHOUT_CLOCKS {
            (NO_SEGMENT, 0, 0, false)
        } else {
            (read_u64(block, 96), read_u64(block, 104), block[112], block[113] != 0)
        };
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
            next_segment,
            write_clock,
            stream,
            paired_with_next,
        };
        let mut entries = Vec::with_capacity(entry_count);
        let mut packed_block_open = false;
        for index in 0..entry_count {
            let offset = ENTRIES_OFFSET + index * ENTRY_SIZE_BYTES;
            let entry = Entry::decode(&block[offset..offset + ENTRY_SIZE_BYTES], version)?;
            // A further fragment belongs to the packed block an earlier entry opened.
            match entry {
                Entry::Packed { .. } => packed_block_open = true,
                Entry::Fragment { .. } | Entry::SharedFragment { .. } if !packed_block_open => return None,
                _ => {}
            }
            entries.push(entry);
        }
        Some(Summary { header, summary_index: read_u16(block, 10), entries })
    }

    /// What a block at the head of a segment that does not decode as a summary looks
    /// like (recovery tells lost metadata from released or torn heads with it).
    pub fn classify_damaged(block: &[u8], volume_uuid: &[u8; 16]) -> DamagedHead {
        if block.iter().all(|&byte| byte == 0) {
            return DamagedHead::Zero;
        }
        // A torn new head whose first sector did not land holds zeros there (released
        // heads are zeroed), old data holds another volume's bytes; a summary whose magic
        // rotted still names this volume.
        if &block[16..32] != volume_uuid {
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
            DamagedHead::DamagedSummary {
                sequence: read_u64(block, 32),
                epoch: read_u64(block, 80),
                segment_open_sequence: read_u64(block, 48),
            }
        }
    }

    pub fn data_block_count(&self) -> usize {
        self.entries.iter().filter(|entry| entry.has_block()).count()
    }
}

/// The batch index of the summary that follows `summary` (at batch index `index`): right
/// after the data blocks `summary` describes.
pub fn next_summary_index(index: u32, summary: &Summary) -> u32 {
    index + 1 + summary.data_block_count() as u32
}

/// Every entry of a batch, in order, with the batch index of the data block it describes
/// (`None` for range entries, which describe no block), given the batch's summaries with
/// their batch indices. Each data entry consumes the next block of its group; a further
/// fragment (kind 9 or 15) starts in the packed block its summary's latest kind-8 entry consumed,
/// whose index it is given (its checksum is not that block's).
pub fn batch_entries<'a>(
    summaries: impl IntoIterator<Item = (&'a Summary, u32)> + 'a,
) -> impl Iterator<Item = (Option<u32>, Entry)> + 'a {
    summaries.into_iter().flat_map(|(summary, summary_index)| {
        let mut next_block = summary_index + 1;
        let mut packed_block = None;
        summary.entries.iter().map(move |entry| {
            if entry.has_block() {
                next_block += 1;
                if matches!(entry, Entry::Packed { .. }) {
                    packed_block = Some(next_block - 1);
                }
                (Some(next_block - 1), *entry)
            } else if matches!(entry, Entry::Fragment { .. } | Entry::SharedFragment { .. }) {
                (packed_block, *entry)
            } else {
                (None, *entry)
            }
        })
    })
}

/// Whether every byte is zero.
pub fn is_all_zero(bytes: &[u8]) -> bool {
    let (prefix, words, suffix) = {
        // SAFETY: u64 has no invalid bit patterns; align_to only reinterprets whole,
        // aligned u64s inside the slice and returns the unaligned ends as bytes.
        unsafe { bytes.align_to::<u64>() }
    };
    prefix.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && suffix.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arbitrary_entry() -> impl Strategy<Value = Entry> {
        prop_oneof![
            (any::<u64>(), any::<u32>(), any::<u8>()).prop_map(|(logical_block, checksum, lifetime_class)| {
                Entry::Data { logical_block, checksum, lifetime_class }
            }),
            (any::<u64>(), 1u32..).prop_map(|(logical_block, block_count)| Entry::Zero { logical_block, block_count }),
            (any::<u64>(), 1u32..).prop_map(|(logical_block, block_count)| Entry::Trim { logical_block, block_count }),
            (0u8..4, any::<u64>(), any::<u32>()).prop_map(|(kind, number, checksum)| {
                let kind =
                    [PageKind::Index, PageKind::Directory, PageKind::SegmentTable, PageKind::Root][kind as usize];
                Entry::Page { kind, number, checksum }
            }),
            any::<u32>().prop_map(|checksum| Entry::Packed { checksum }),
        ]
    }

    /// Self-checksummed blocks share one whole-block CRC32C (the residue): each is told
    /// apart by its own CRC, and none proves another's checksum.
    #[test]
    fn self_checksummed_blocks_are_told_apart() {
        let mut first = vec![1u8; BLOCK_SIZE_BYTES];
        let mut second = vec![2u8; BLOCK_SIZE_BYTES];
        seal(&mut first);
        seal(&mut second);
        assert_eq!(crc32c::crc32c(&first), crc32c::crc32c(&second), "the residue");
        assert_ne!(block_checksum(&first), block_checksum(&second));
        assert!(checksum_proves(&first, block_checksum(&first)));
        assert!(!checksum_proves(&second, block_checksum(&first)));
        assert!(!checksum_proves(&first, block_checksum(&second)));
        let plain = vec![3u8; BLOCK_SIZE_BYTES];
        assert_eq!(block_checksum(&plain), crc32c::crc32c(&plain));
        assert!(checksum_proves(&plain, crc32c::crc32c(&plain)));
        // What an older volume recorded for a self-checksummed client block still proves it.
        assert!(checksum_proves(&first, crc32c::crc32c(&first)));
    }

    fn sample_superblock() -> Superblock {
        let geometry = Geometry::new(RaidLevel::Raid6, 6, 1 << 20, 200_000, 1 << 30).unwrap();
        let member_uuids: Vec<[u8; 16]> = (0..6u8).map(|index| [index + 1; 16]).collect();
        Superblock {
            copy: 1,
            version: SUPERBLOCK_VERSION,
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
            update_sequence: 12,
            member_uuid: member_uuids[3],
            holder: Holder {
                open: true,
                process_id: 4242,
                opened_unix_seconds: 1_700_000_100,
                closed_unix_seconds: 1_700_000_050,
                host: "db1.example".into(),
                program: "stripelog serve".into(),
            },
            member_uuids,
            retired: vec![RetiredMember { member_uuid: [9; 16], position: 2, retired_unix_seconds: 1_700_000_060 }],
            index_entry_width_bits: 27,
            checkpoint: Some(CheckpointReference {
                root_position: 123_456,
                root_checksum: 0xDEAD_BEEF,
                generation: 5,
                sequence: 70,
            }),
            lifetime: LifetimeCounters::from_array(std::array::from_fn(|index| 1000 + index as u64)),
            lifetime_counted_through_sequence: 4321,
            member_bytes_written: 1 << 40,
            write_log: Some(WriteLogReference { log_uuid: [9; 16], paths: vec!["/dev/pmem0".into(), "/x".into()] }),
            incompatible_features: 0,
            compression: CompressionSetting::Off,
            deduplication: false,
        }
    }

    /// A volume with packed fragments is written as version 4 (older code refuses it);
    /// bits this code does not know, a version 4 naming none, and compression on a volume
    /// without the feature are refused, each named.
    #[test]
    fn incompatible_features_are_version_4_and_unknown_ones_are_refused() {
        let mut superblock = sample_superblock();
        superblock.incompatible_features = FEATURE_PACKED_FRAGMENTS;
        superblock.compression = CompressionSetting::Lz4;
        superblock.version = SUPERBLOCK_VERSION_WITH_FEATURES;
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        superblock.encode(&mut block);
        assert_eq!(read_u32(&block, 8), SUPERBLOCK_VERSION_WITH_FEATURES);
        assert_eq!(Superblock::decode(&block, 1).unwrap(), superblock);
        assert!(superblock.geometry().packed_fragments);
        let with = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut changed = block.clone();
            edit(&mut changed);
            seal(&mut changed);
            Superblock::decode(&changed, 1)
        };
        assert_eq!(with(&|block| block[2360] |= 0b011), Err(SuperblockProblem::UnknownFeatures(0b011)));
        // Bit 1 (the first packed-block format, retired) is refused as unknown.
        assert_eq!(with(&|block| block[2360] = 0b010), Err(SuperblockProblem::UnknownFeatures(0b010)));
        assert!(matches!(with(&|block| block[2360] = 0), Err(SuperblockProblem::Inconsistent(_))));
        assert!(matches!(with(&|block| block[2337] = 7), Err(SuperblockProblem::Inconsistent(_))));
        superblock.incompatible_features = 0;
        superblock.encode(&mut block);
        assert_eq!(read_u32(&block, 8), SUPERBLOCK_VERSION);
        assert!(
            matches!(Superblock::decode(&block, 1), Err(SuperblockProblem::Inconsistent(_))),
            "lz4 without the bit"
        );
    }

    /// A thinly provisioned volume keeps a logical size of its own (feature bit 3): its
    /// geometry's logical size is the stored one, its provisioned size the formula's; the
    /// same size without the bit, or a size that is not whole blocks, is refused.
    #[test]
    fn a_thin_logical_size_needs_its_feature_bit_and_whole_blocks() {
        let mut superblock = sample_superblock();
        let provisioned = superblock.geometry().provisioned_block_count();
        superblock.incompatible_features = FEATURE_THIN_PROVISIONED;
        superblock.version = SUPERBLOCK_VERSION_WITH_FEATURES;
        superblock.logical_size_bytes = 4 * provisioned * BLOCK_SIZE_BYTES as u64;
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        superblock.encode(&mut block);
        let decoded = Superblock::decode(&block, 1).expect("a thin superblock");
        assert_eq!(decoded.geometry().logical_block_count(), 4 * provisioned);
        assert_eq!(decoded.geometry().provisioned_block_count(), provisioned);
        let with = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut changed = block.clone();
            edit(&mut changed);
            seal(&mut changed);
            Superblock::decode(&changed, 1)
        };
        assert!(matches!(with(&|block| block[72] = 1), Err(SuperblockProblem::Inconsistent(_))), "not whole blocks");
        superblock.incompatible_features = 0;
        superblock.version = SUPERBLOCK_VERSION;
        superblock.encode(&mut block);
        assert!(matches!(Superblock::decode(&block, 1), Err(SuperblockProblem::Inconsistent(_))), "without the bit");
    }

    /// Kinds 10–13 round-trip in a summary of version 4 (records up to 56 bits), a shared
    /// copy consumes a block and a reference none; a version-3 summary holding them, or a
    /// shared copy naming a record beyond 56 bits, is not a summary.
    #[test]
    fn sharing_entries_round_trip_and_are_checked() {
        let header = sample_header();
        let record = (1u64 << 56) - 3;
        let born = Entry::SharedCopy { record, checksum: 21, lifetime_class: 4, moved: false };
        let moved = Entry::SharedCopy { record: 7, checksum: 22, lifetime_class: LIFETIME_CLASS_UNKNOWN, moved: true };
        let reference = Entry::Reference { record, logical_block: 1 << 40 };
        let page = Entry::Page { kind: PageKind::SharedTable, number: 3, checksum: 23 };
        let data = Entry::Data { logical_block: 1, checksum: 13, lifetime_class: 0 };
        let summary =
            Summary { header, summary_index: 0, entries: vec![born, reference, reference, data, moved, page] };
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        summary.encode(&mut block);
        assert_eq!(read_u16(&block, 8), SUMMARY_VERSION);
        assert_eq!(Summary::decode(&block, &header.volume_uuid).unwrap(), summary);
        let indices: Vec<Option<u32>> = batch_entries([(&summary, 0)]).map(|(index, _)| index).collect();
        assert_eq!(indices, vec![Some(1), None, None, Some(2), Some(3), Some(4)]);
        block[8..10].copy_from_slice(&SUMMARY_VERSION_WITHOUT_SHARING.to_le_bytes());
        seal(&mut block);
        assert_eq!(Summary::decode(&block, &header.volume_uuid), None, "kinds 10-13 need version 4");
        summary.encode(&mut block);
        block[ENTRIES_OFFSET + 15] = 1; // the born copy's record beyond 56 bits
        seal(&mut block);
        assert_eq!(Summary::decode(&block, &header.volume_uuid), None);
    }

    /// Kind 15 (a shared copy as a fragment, born or moved) round-trips in a summary of
    /// version 4 and is given its packed block's index; one before any packed block, with
    /// a share outside 1–16 or a moved byte other than 0 or 1, is not a summary; replayed,
    /// it is the record's copy as a fragment.
    #[test]
    fn compressed_shared_copies_round_trip_and_are_checked() {
        let header = sample_header();
        let packed = Entry::Packed { checksum: 11 };
        let record = (1u64 << 56) - 5;
        let born = Entry::SharedFragment { record, checksum: 31, lifetime_class: 2, sixteenths: 7, moved: false };
        let moved = Entry::SharedFragment { record: 9, checksum: 32, lifetime_class: 5, sixteenths: 16, moved: true };
        let reference = Entry::Reference { record, logical_block: 77 };
        let summary = Summary { header, summary_index: 0, entries: vec![packed, born, reference, moved] };
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        summary.encode(&mut block);
        assert_eq!(read_u16(&block, 8), SUMMARY_VERSION);
        assert_eq!(Summary::decode(&block, &header.volume_uuid).unwrap(), summary);
        let indices: Vec<Option<u32>> = batch_entries([(&summary, 0)]).map(|(index, _)| index).collect();
        assert_eq!(indices, vec![Some(1), Some(1), None, Some(1)]);
        assert_eq!(
            born.effect(Some(40), 0),
            EntryEffect::Copy { record, position: 40, fragment: Some(7), moved: false }
        );
        let orphan = Summary { header, summary_index: 0, entries: vec![born] };
        orphan.encode(&mut block);
        assert_eq!(Summary::decode(&block, &header.volume_uuid), None, "a fragment copy needs its packed block");
        for (offset, value) in [(2, 0u8), (2, 17), (3, 2)] {
            summary.encode(&mut block);
            block[ENTRIES_OFFSET + ENTRY_SIZE_BYTES + offset] = value;
            seal(&mut block);
            assert_eq!(Summary::decode(&block, &header.volume_uuid), None, "byte {offset} = {value}");
        }
        let geometry = sample_superblock().geometry();
        assert!(moved.validate(&geometry.clone().with_shared_blocks(true), 1).is_err(), "needs feature bit 6");
        // Feature bit 6 stands only beside bits 2 and 4.
        let mut superblock = sample_superblock();
        superblock.version = SUPERBLOCK_VERSION_WITH_FEATURES;
        superblock.incompatible_features = FEATURE_COMPRESSED_SHARED_COPIES | FEATURE_DEDUPLICATION;
        superblock.encode(&mut block);
        assert!(matches!(Superblock::decode(&block, 1), Err(SuperblockProblem::Inconsistent(_))), "without bit 2");
        superblock.incompatible_features |= FEATURE_PACKED_FRAGMENTS;
        superblock.encode(&mut block);
        let decoded = Superblock::decode(&block, 1).expect("bits 2, 4 and 6");
        assert!(decoded.geometry().compressed_shared_copies);
        assert!(moved.validate(&decoded.geometry(), 1).is_ok());
    }

    /// Kinds 8 and 9 round-trip in a summary of version 3 (a summary without them stays
    /// version 2); a fragment before any packed block, a share outside 1–16, or a packed
    /// block naming a logical block, is not a summary; a fragment is given the batch index
    /// of the packed block it starts in.
    #[test]
    fn fragment_entries_round_trip_and_are_checked() {
        let header = sample_header();
        let packed = Entry::Packed { checksum: 11 };
        let fragment = Entry::Fragment { logical_block: 9, checksum: 12, lifetime_class: 3, sixteenths: 16 };
        let data = Entry::Data { logical_block: 1, checksum: 13, lifetime_class: 0 };
        let zero = Entry::Zero { logical_block: 2, block_count: 3 };
        let summary = Summary { header, summary_index: 0, entries: vec![data, packed, zero, fragment, fragment] };
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        summary.encode(&mut block);
        assert_eq!(read_u16(&block, 8), SUMMARY_VERSION_WITHOUT_SHARING);
        assert_eq!(Summary::decode(&block, &header.volume_uuid).unwrap(), summary);
        let indices: Vec<Option<u32>> = batch_entries([(&summary, 0)]).map(|(index, _)| index).collect();
        assert_eq!(indices, vec![Some(1), Some(2), None, Some(2), Some(2)]);
        assert_eq!(next_summary_index(0, &summary), 3);
        let orphan = Summary { header, summary_index: 0, entries: vec![data, fragment] };
        orphan.encode(&mut block);
        assert_eq!(Summary::decode(&block, &header.volume_uuid), None);
        let mut bad = Summary { header, summary_index: 0, entries: vec![packed, fragment] };
        bad.encode(&mut block);
        block[ENTRIES_OFFSET + ENTRY_SIZE_BYTES + 2] = 17;
        seal(&mut block);
        assert_eq!(Summary::decode(&block, &header.volume_uuid), None);
        // A packed-block entry names no logical block.
        bad.encode(&mut block);
        block[ENTRIES_OFFSET + 8] = 1;
        seal(&mut block);
        assert_eq!(Summary::decode(&block, &header.volume_uuid), None);
        bad.entries = vec![data, zero];
        bad.encode(&mut block);
        assert_eq!(read_u16(&block, 8), SUMMARY_VERSION_WITHOUT_FRAGMENTS);
        // Version 2 has no kinds 8 and 9.
        Summary { header, summary_index: 0, entries: vec![packed] }.encode(&mut block);
        block[8..10].copy_from_slice(&SUMMARY_VERSION_WITHOUT_FRAGMENTS.to_le_bytes());
        seal(&mut block);
        assert_eq!(Summary::decode(&block, &header.volume_uuid), None);
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

    /// `superblock` as an older `version` wrote it: zeros from `zero_from` on.
    fn older_superblock_block(superblock: &Superblock, version: u32, zero_from: usize) -> Vec<u8> {
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        superblock.encode(&mut block);
        block[8..12].copy_from_slice(&version.to_le_bytes());
        block[zero_from..CHECKSUM_OFFSET].fill(0);
        seal(&mut block);
        block
    }

    #[test]
    fn a_version_1_superblock_is_read_without_identity() {
        let superblock = sample_superblock();
        // Version 1 wrote zeros from offset 120 on.
        let mut block = older_superblock_block(&superblock, SUPERBLOCK_VERSION_WITHOUT_IDENTITY, 120);
        let decoded = Superblock::decode(&block, 1).unwrap();
        assert_eq!(decoded.version, SUPERBLOCK_VERSION_WITHOUT_IDENTITY);
        assert_eq!(decoded.member_uuid, [0; 16]);
        assert_eq!(decoded.member_uuids, vec![[0; 16]; 6]);
        assert_eq!(decoded.holder, Holder::default());
        assert_eq!((decoded.epoch, decoded.failed_members), (superblock.epoch, superblock.failed_members));
        let unknown = SUPERBLOCK_VERSION_WITH_FEATURES + 1;
        block[8..12].copy_from_slice(&unknown.to_le_bytes());
        seal(&mut block);
        assert_eq!(Superblock::decode(&block, 1), Err(SuperblockProblem::UnsupportedVersion(unknown)));
    }

    #[test]
    fn a_version_2_superblock_is_read_without_index_fields() {
        let superblock = sample_superblock();
        // Version 2 wrote zeros from offset 2304 on.
        let block = older_superblock_block(&superblock, SUPERBLOCK_VERSION_WITHOUT_INDEX, 2304);
        let decoded = Superblock::decode(&block, 1).unwrap();
        assert_eq!(decoded.version, SUPERBLOCK_VERSION_WITHOUT_INDEX);
        assert_eq!((decoded.index_entry_width_bits, decoded.checkpoint), (0, None));
        assert_eq!((decoded.lifetime, decoded.member_bytes_written), (LifetimeCounters::default(), 0));
        assert_eq!(decoded.member_uuids, superblock.member_uuids);
    }

    #[test]
    fn retiring_keeps_the_newest_records() {
        let mut superblock = sample_superblock();
        superblock.retired.clear();
        for round in 0..(RETIRED_MEMBERS_MAXIMUM as u64 + 5) {
            let position = (round % 6) as usize;
            superblock.retire_and_replace(position, uuid_of(round), 1_700_000_000 + round);
        }
        // This copy belongs to position 3: its own UUID is the one expected there now.
        superblock.member_uuid = superblock.member_uuids[superblock.member_index as usize];
        assert_eq!(superblock.retired.len(), RETIRED_MEMBERS_MAXIMUM);
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        superblock.encode(&mut block);
        let decoded = Superblock::decode(&block, 1).unwrap();
        assert_eq!(decoded, superblock);
        // The UUID installed last in a position is expected there; the one before is retired.
        let last = RETIRED_MEMBERS_MAXIMUM as u64 + 4;
        assert_eq!(decoded.member_uuids[(last % 6) as usize], uuid_of(last));
        let retired = decoded.retired_member(&uuid_of(last - 6)).expect("retired");
        assert_eq!((retired.position, retired.retired_unix_seconds), ((last % 6) as u32, 1_700_000_000 + last));
        // Rounds 0-5 retired the sample's UUIDs [1; 16] … [6; 16]; the first five are forgotten.
        assert!(decoded.retired_member(&[1; 16]).is_none(), "the oldest records are forgotten");
        assert!(decoded.retired_member(&[5; 16]).is_none(), "the oldest records are forgotten");
        assert_eq!(decoded.retired_member(&[6; 16]).map(|member| member.position), Some(5));
    }

    fn uuid_of(round: u64) -> [u8; 16] {
        let mut uuid = [0xA5; 16];
        uuid[..8].copy_from_slice(&round.to_le_bytes());
        uuid
    }

    #[test]
    fn an_inconsistent_identity_is_refused() {
        let mut superblock = sample_superblock();
        superblock.member_uuid = [0xEE; 16];
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        superblock.encode(&mut block);
        assert!(matches!(Superblock::decode(&block, 1), Err(SuperblockProblem::Inconsistent(_))));
        let mut superblock = sample_superblock();
        superblock.member_uuids.push([1; 16]);
        superblock.encode(&mut block);
        assert!(matches!(Superblock::decode(&block, 1), Err(SuperblockProblem::Inconsistent(_))));
    }

    fn sample_header() -> BatchHeader {
        BatchHeader {
            volume_uuid: [3; 16],
            sequence: 5,
            segment: 1,
            segment_open_sequence: 5,
            durable_through_sequence: 4,
            first_row: 0,
            row_count: 1,
            block_count: 3,
            summary_count: 1,
            epoch: 1,
            previous_segment: 0,
            next_segment: 7,
            write_clock: 99,
            stream: 1,
            paired_with_next: false,
        }
    }

    #[test]
    fn a_version_1_summary_reads_with_unknown_clocks_and_classes() {
        let header = BatchHeader { block_count: 2, ..sample_header() };
        let entries = vec![Entry::Data { logical_block: 8, checksum: 1, lifetime_class: 12 }];
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        Summary { header, summary_index: 0, entries }.encode(&mut block);
        // Version 1 wrote zeros in the header from 96 and in entry byte 1.
        block[8..10].copy_from_slice(&SUMMARY_VERSION_WITHOUT_CLOCKS.to_le_bytes());
        block[96..ENTRIES_OFFSET].fill(0);
        block[ENTRIES_OFFSET + 1] = 0;
        seal(&mut block);
        let decoded = Summary::decode(&block, &[3; 16]).expect("version 1 is read");
        assert_eq!(
            (decoded.header.next_segment, decoded.header.write_clock, decoded.header.stream),
            (NO_SEGMENT, 0, 0)
        );
        assert_eq!(
            decoded.entries,
            vec![Entry::Data { logical_block: 8, checksum: 1, lifetime_class: LIFETIME_CLASS_UNKNOWN }]
        );
        block[8..10].copy_from_slice(&(SUMMARY_VERSION + 1).to_le_bytes());
        seal(&mut block);
        assert_eq!(Summary::decode(&block, &[3; 16]), None, "a later version is not read");
    }

    proptest! {
        #[test]
        fn summaries_round_trip(entries in proptest::collection::vec(arbitrary_entry(), 0..=ENTRIES_PER_SUMMARY),
                                sequence in any::<u64>(), flip in 0usize..BLOCK_SIZE_BYTES * 8) {
            let summary = Summary {
                header: BatchHeader {
                    volume_uuid: [3; 16], sequence, segment: 17, segment_open_sequence: sequence,
                    durable_through_sequence: sequence / 2, first_row: 4, row_count: 8, block_count: 30,
                    summary_count: 1, epoch: 2, previous_segment: 3, next_segment: 9,
                    write_clock: sequence ^ 0x55, stream: 2, paired_with_next: sequence % 2 == 1,
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
