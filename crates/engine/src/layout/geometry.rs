//! Volume geometry: RAID level, columns, roles and where every block lives.
//! See docs/on-disk-format.md, "Volume geometry".

use crate::error::{Error, GeometryProblem, Result};
use serde::Serialize;

/// The logical and physical block size. Fixed by the format.
pub const BLOCK_SIZE_BYTES: usize = 4096;
pub const MINIMUM_CHUNK_SIZE_BYTES: u32 = 64 << 10;
pub const MAXIMUM_CHUNK_SIZE_BYTES: u32 = 16 << 20;
pub const DEFAULT_CHUNK_SIZE_BYTES: u32 = 1 << 20;
/// Default spare fraction: 20 % of the data capacity is held back from the logical size.
pub const DEFAULT_SPARE_PPM: u32 = 200_000;
/// Member counts above this are refused (a bound for every per-member table).
pub const MAXIMUM_MEMBER_COUNT: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RaidLevel {
    Raid0,
    Raid10,
    Raid5,
    Raid6,
}

impl RaidLevel {
    pub fn code(self) -> u32 {
        match self {
            RaidLevel::Raid0 => 0,
            RaidLevel::Raid10 => 10,
            RaidLevel::Raid5 => 5,
            RaidLevel::Raid6 => 6,
        }
    }

    pub fn from_code(code: u32) -> Option<RaidLevel> {
        match code {
            0 => Some(RaidLevel::Raid0),
            1 | 10 => Some(RaidLevel::Raid10),
            5 => Some(RaidLevel::Raid5),
            6 => Some(RaidLevel::Raid6),
            _ => None,
        }
    }

    /// How many failed members this level always survives.
    /// Members of a stripe row that hold data, for `member_count` members.
    pub fn data_columns(self, member_count: usize) -> usize {
        match self {
            RaidLevel::Raid0 => member_count,
            RaidLevel::Raid10 => member_count / 2,
            RaidLevel::Raid5 => member_count.saturating_sub(1),
            RaidLevel::Raid6 => member_count.saturating_sub(2),
        }
    }

    pub fn failures_tolerated(self) -> usize {
        match self {
            RaidLevel::Raid0 => 0,
            RaidLevel::Raid10 | RaidLevel::Raid5 => 1,
            RaidLevel::Raid6 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RaidLevel::Raid0 => "raid0",
            RaidLevel::Raid10 => "raid10",
            RaidLevel::Raid5 => "raid5",
            RaidLevel::Raid6 => "raid6",
        }
    }
}

impl std::fmt::Display for RaidLevel {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// What a member holds for one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Data column `column` (for RAID-10, `copy` 0 or 1 of it).
    Data { column: usize, copy: usize },
    /// Parity shard 0 (P) or 1 (Q).
    Parity { shard: usize },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Geometry {
    pub raid_level: RaidLevel,
    pub member_count: usize,
    pub chunk_size_bytes: u32,
    pub spare_ppm: u32,
    pub member_size_bytes: u64,
    /// Index entries and summaries may name packed fragments (a volume created with
    /// compression, superblock feature bit 2; docs/compression.md): wider index entries,
    /// and live counts in sixteenths of a block.
    pub packed_fragments: bool,
    /// A thinly provisioned volume's logical size in blocks (superblock feature bit 3,
    /// docs/deduplication.md decision 10), larger than the data it may hold; `None`: the
    /// logical size is the provisioned size.
    pub thin_logical_block_count: Option<u64>,
    /// Index entries may name shared-block records (deduplication, feature bit 4).
    pub shared_blocks: bool,
    /// A shared copy may be a fragment (feature bit 6, docs/deduplication.md decision 11).
    pub compressed_shared_copies: bool,
}

impl Geometry {
    /// Validate the parameters of a new volume; `smallest_member_bytes` is the size of
    /// the smallest member.
    pub fn new(
        raid_level: RaidLevel,
        member_count: usize,
        chunk_size_bytes: u32,
        spare_ppm: u32,
        smallest_member_bytes: u64,
    ) -> Result<Geometry> {
        Geometry::validate(raid_level, member_count, chunk_size_bytes, spare_ppm, smallest_member_bytes)
            .map_err(Error::InvalidGeometry)
    }

    /// [`Geometry::new`], with what is wrong when the parameters are refused.
    pub fn validate(
        raid_level: RaidLevel,
        member_count: usize,
        chunk_size_bytes: u32,
        spare_ppm: u32,
        smallest_member_bytes: u64,
    ) -> std::result::Result<Geometry, GeometryProblem> {
        let minimum_members = match raid_level {
            RaidLevel::Raid0 => 1,
            RaidLevel::Raid10 => 2,
            RaidLevel::Raid5 => 3,
            RaidLevel::Raid6 => 4,
        };
        if member_count < minimum_members || member_count > MAXIMUM_MEMBER_COUNT as usize {
            return Err(GeometryProblem::MemberCount {
                raid_level: raid_level.name(),
                minimum_members,
                maximum_members: MAXIMUM_MEMBER_COUNT,
                member_count,
            });
        }
        if raid_level == RaidLevel::Raid10 && !member_count.is_multiple_of(2) {
            return Err(GeometryProblem::OddRaid10MemberCount { member_count });
        }
        if !chunk_size_bytes.is_power_of_two()
            || !(MINIMUM_CHUNK_SIZE_BYTES..=MAXIMUM_CHUNK_SIZE_BYTES).contains(&chunk_size_bytes)
        {
            return Err(GeometryProblem::ChunkSize { chunk_size_bytes });
        }
        if spare_ppm >= 1_000_000 {
            return Err(GeometryProblem::SpareFraction { spare_ppm });
        }
        let member_size_bytes = smallest_member_bytes / chunk_size_bytes as u64 * chunk_size_bytes as u64;
        let geometry = Geometry {
            raid_level,
            member_count,
            chunk_size_bytes,
            spare_ppm,
            member_size_bytes,
            packed_fragments: false,
            thin_logical_block_count: None,
            shared_blocks: false,
            compressed_shared_copies: false,
        };
        if geometry.segment_count() < 2 {
            return Err(GeometryProblem::MembersTooSmall { smallest_member_bytes, chunk_size_bytes });
        }
        if geometry.logical_block_count() == 0 {
            return Err(GeometryProblem::ZeroLogicalSize);
        }
        Ok(geometry)
    }

    pub fn data_columns(&self) -> usize {
        self.raid_level.data_columns(self.member_count)
    }

    pub fn parity_shards(&self) -> usize {
        match self.raid_level {
            RaidLevel::Raid0 | RaidLevel::Raid10 => 0,
            RaidLevel::Raid5 => 1,
            RaidLevel::Raid6 => 2,
        }
    }

    pub fn rows_per_chunk(&self) -> u32 {
        self.chunk_size_bytes / BLOCK_SIZE_BYTES as u32
    }

    /// Data-space positions per segment (`d × rows_per_chunk`).
    pub fn blocks_per_segment(&self) -> u64 {
        self.data_columns() as u64 * self.rows_per_chunk() as u64
    }

    pub fn segment_count(&self) -> u64 {
        (self.member_size_bytes / self.chunk_size_bytes as u64).saturating_sub(1)
    }

    pub fn physical_data_blocks(&self) -> u64 {
        self.segment_count() * self.blocks_per_segment()
    }

    /// Bits of one index entry: enough for `1 + positions + 2 × segments` values
    /// (unmapped, data at a position, zeros or trimmed recorded in a segment;
    /// docs/index-and-checkpoints.md, decision 1).
    pub fn index_entry_width_bits(&self) -> u32 {
        index_entry_width_bits(
            self.physical_data_blocks(),
            self.segment_count(),
            self.packed_fragments,
            self.shared_blocks,
        )
    }

    /// The same geometry with shared-block records (deduplication) on or off.
    pub fn with_shared_blocks(mut self, on: bool) -> Geometry {
        self.shared_blocks = on;
        self
    }

    /// The same geometry with a logical size of `blocks` (thin provisioning), or the
    /// provisioned size (`None`).
    pub fn with_thin_logical_blocks(mut self, blocks: Option<u64>) -> Geometry {
        self.thin_logical_block_count = blocks;
        self
    }

    /// The same geometry with packed fragments on or off.
    pub fn with_packed_fragments(mut self, on: bool) -> Geometry {
        self.packed_fragments = on;
        self
    }

    /// What a whole block (a data block, a checkpoint block) adds to its segment's live
    /// count: 1, or 16 where fragments count their sixteenths (docs/compression.md).
    pub fn live_units_per_block(&self) -> u64 {
        if self.packed_fragments {
            crate::layout::format::SIXTEENTHS_PER_BLOCK as u64
        } else {
            1
        }
    }

    /// Summary blocks in a segment written as one batch: one in front of every
    /// `ENTRIES_PER_SUMMARY` data blocks (docs/on-disk-format.md).
    pub fn summary_blocks_per_segment(&self) -> u64 {
        self.blocks_per_segment().div_ceil(crate::layout::format::ENTRIES_PER_SUMMARY as u64 + 1)
    }

    /// Positions of all segments that can hold client data: the data space less the
    /// summary blocks of segments written whole. The format's own overhead, like parity,
    /// is not spare; the spare fraction is a fraction of this.
    pub fn data_capacity_blocks(&self) -> u64 {
        self.segment_count() * (self.blocks_per_segment() - self.summary_blocks_per_segment())
    }

    /// Whole segments' worth of data positions beyond the logical size: the room the
    /// cleaner works in once every logical block has been written.
    pub fn spare_segments(&self) -> u64 {
        let data_blocks_per_segment = self.blocks_per_segment() - self.summary_blocks_per_segment();
        self.segment_count().saturating_sub(self.provisioned_block_count().div_ceil(data_blocks_per_segment))
    }

    /// The blocks of data the volume may hold: the data capacity less the spare fraction.
    /// The logical size, unless the volume is thinly provisioned; then the admission
    /// limit of its writes.
    pub fn provisioned_block_count(&self) -> u64 {
        let usable = self.data_capacity_blocks() as u128 * (1_000_000 - self.spare_ppm as u128) / 1_000_000;
        usable as u64
    }

    /// Logical size: the provisioned size, or a thin volume's own.
    pub fn logical_block_count(&self) -> u64 {
        self.thin_logical_block_count.unwrap_or_else(|| self.provisioned_block_count())
    }

    pub fn logical_size_bytes(&self) -> u64 {
        self.logical_block_count() * BLOCK_SIZE_BYTES as u64
    }

    /// The role member `member` plays in segment `segment`.
    pub fn role_of_member(&self, segment: u64, member: usize) -> Role {
        let count = self.member_count as u64;
        let rotation = self.rotation(segment);
        let role_index = ((member as u64 + count - rotation) % count) as usize;
        self.role_at(role_index)
    }

    /// Roles rotate by one member per segment so that parity is spread evenly; RAID-0
    /// and RAID-10 have no parity and keep fixed places (RAID-10 mirrors stay the fixed
    /// pairs 2i, 2i+1, so losing one member of every pair is survivable).
    fn rotation(&self, segment: u64) -> u64 {
        match self.raid_level {
            RaidLevel::Raid5 | RaidLevel::Raid6 => segment % self.member_count as u64,
            RaidLevel::Raid0 | RaidLevel::Raid10 => 0,
        }
    }

    fn role_at(&self, role_index: usize) -> Role {
        let data = self.data_columns();
        match self.raid_level {
            RaidLevel::Raid10 => Role::Data { column: role_index / 2, copy: role_index % 2 },
            _ if role_index < data => Role::Data { column: role_index, copy: 0 },
            _ => Role::Parity { shard: role_index - data },
        }
    }

    /// The member holding `role` in `segment`.
    pub fn member_of_role(&self, segment: u64, role: Role) -> usize {
        let role_index = match (self.raid_level, role) {
            (RaidLevel::Raid10, Role::Data { column, copy }) => column * 2 + copy,
            (_, Role::Data { column, .. }) => column,
            (_, Role::Parity { shard }) => self.data_columns() + shard,
        };
        ((role_index as u64 + self.rotation(segment)) % self.member_count as u64) as usize
    }

    /// Every member holding a copy of data column `column` of `segment`.
    pub fn members_of_column(&self, segment: u64, column: usize) -> Vec<usize> {
        let copies = if self.raid_level == RaidLevel::Raid10 { 2 } else { 1 };
        (0..copies).map(|copy| self.member_of_role(segment, Role::Data { column, copy })).collect()
    }

    /// Member byte offset of row `row` of segment `segment`.
    pub fn member_offset_bytes(&self, segment: u64, row: u32) -> u64 {
        (1 + segment) * self.chunk_size_bytes as u64 + row as u64 * BLOCK_SIZE_BYTES as u64
    }

    /// Split a data-space position into (segment, row, column).
    pub fn locate(&self, position: u64) -> BlockLocation {
        let per_segment = self.blocks_per_segment();
        let within = position % per_segment;
        let data = self.data_columns() as u64;
        BlockLocation { segment: position / per_segment, row: (within / data) as u32, column: (within % data) as usize }
    }

    pub fn position(&self, segment: u64, row: u32, column: usize) -> u64 {
        segment * self.blocks_per_segment() + row as u64 * self.data_columns() as u64 + column as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLocation {
    pub segment: u64,
    pub row: u32,
    pub column: usize,
}

/// Bits of an index entry for `positions` data-space positions and `segments` segments.
pub fn index_entry_width_bits(positions: u64, segments: u64, packed_fragments: bool, shared_blocks: bool) -> u32 {
    // Fragments: 16 more values per position (its position and its share in sixteenths).
    let fragments = if packed_fragments { positions * crate::layout::format::SIXTEENTHS_PER_BLOCK as u64 } else { 0 };
    // Shared-block records: one value per position (records never outnumber copies).
    let shared = if shared_blocks { positions } else { 0 };
    let largest = positions + 2 * segments + fragments + shared;
    (u64::BITS - largest.leading_zeros()).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn geometry(level: RaidLevel, members: usize) -> Geometry {
        Geometry::new(level, members, 64 << 10, 200_000, 16 << 20).unwrap()
    }

    #[test]
    fn invalid_parameters_are_refused_with_a_reason() {
        let cases: &[(RaidLevel, usize, u32, u32, u64)] = &[
            (RaidLevel::Raid5, 2, 1 << 20, 0, 1 << 30),
            (RaidLevel::Raid6, 3, 1 << 20, 0, 1 << 30),
            (RaidLevel::Raid10, 3, 1 << 20, 0, 1 << 30),
            (RaidLevel::Raid5, 5, 3 << 20, 0, 1 << 30),
            (RaidLevel::Raid5, 5, 32 << 20, 0, 1 << 30),
            (RaidLevel::Raid5, 5, 1 << 20, 1_000_000, 1 << 30),
            (RaidLevel::Raid5, 5, 1 << 20, 0, 2 << 20),
        ];
        for &(level, members, chunk, spare, size) in cases {
            assert!(matches!(Geometry::new(level, members, chunk, spare, size), Err(Error::InvalidGeometry(_))));
        }
    }

    #[test]
    fn sizes_follow_the_spare_fraction() {
        let geometry = Geometry::new(RaidLevel::Raid5, 5, 1 << 20, 200_000, 4 << 30).unwrap();
        assert_eq!(geometry.segment_count(), 4095);
        assert_eq!(geometry.blocks_per_segment(), 1024);
        // 1024 positions per segment, 5 of them summaries (one per 247 data blocks).
        assert_eq!(geometry.summary_blocks_per_segment(), 5);
        assert_eq!(geometry.logical_block_count(), 4095 * 1019 * 8 / 10);
    }

    proptest! {
        #[test]
        fn roles_are_a_permutation_and_invert(members in 1usize..12, segment in 0u64..1000, level in 0usize..4) {
            let level = [RaidLevel::Raid0, RaidLevel::Raid10, RaidLevel::Raid5, RaidLevel::Raid6][level];
            let members = match level {
                RaidLevel::Raid10 => (members.max(2) / 2) * 2,
                RaidLevel::Raid5 => members.max(3),
                RaidLevel::Raid6 => members.max(4),
                RaidLevel::Raid0 => members,
            };
            let geometry = geometry(level, members);
            let mut roles = Vec::new();
            for member in 0..members {
                let role = geometry.role_of_member(segment, member);
                prop_assert_eq!(geometry.member_of_role(segment, role), member);
                prop_assert!(!roles.contains(&role), "role {:?} played twice", role);
                roles.push(role);
            }
        }

        #[test]
        fn positions_round_trip(position in 0u64..1_000_000) {
            let geometry = geometry(RaidLevel::Raid6, 6);
            let location = geometry.locate(position);
            prop_assert_eq!(geometry.position(location.segment, location.row, location.column), position);
        }
    }
}
