//! What a logical block is mapped to: the value the index holds for it (encoded into index
//! pages by `index::map::EntryCodec`) and the meaning summary entries give it on replay.
//! A pure value type, at the layout layer so that an entry kind can say what mapping it
//! makes (`format::Entry::effect`).

use crate::layout::geometry::Geometry;

/// What a logical block currently is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// Never written (or trimmed with no older record anywhere): reads zeros, a hole.
    Unmapped,
    /// Stored at data-space position `position`.
    Data { position: u64 },
    /// Written with zeros; the record is in `segment`.
    Zero { segment: u64 },
    /// Trimmed; the record is in `segment`.
    Trimmed { segment: u64 },
    /// Compressed, a fragment of the packed block at data-space `position` taking
    /// `sixteenths` (1–16) of it (volumes with packed fragments; docs/compression.md). The
    /// block's own table says which fragment: the last one of this logical block.
    Fragment { position: u64, sixteenths: u8 },
    /// Served by the copy shared-block record `record` names (volumes with deduplication,
    /// docs/deduplication.md): the record says where the copy is and counts its references.
    Shared { record: u64 },
}

impl Mapping {
    /// The segment whose record this mapping depends on (kept live while it does). A
    /// shared block's copy is counted once, through its record, not by each reference.
    pub fn segment(self, blocks_per_segment: u64) -> Option<u64> {
        match self {
            Mapping::Unmapped | Mapping::Shared { .. } => None,
            Mapping::Data { position } | Mapping::Fragment { position, .. } => Some(position / blocks_per_segment),
            Mapping::Zero { segment } | Mapping::Trimmed { segment } => Some(segment),
        }
    }

    /// The data-space position whose block holds the content (data or a packed block).
    /// Whether the entry names stored data (a whole block or a fragment).
    pub fn holds_data(self) -> bool {
        matches!(self, Mapping::Data { .. } | Mapping::Fragment { .. } | Mapping::Shared { .. })
    }

    pub fn position(self) -> Option<u64> {
        match self {
            Mapping::Data { position } | Mapping::Fragment { position, .. } => Some(position),
            _ => None,
        }
    }

    /// What this mapping adds to its segment's live count (docs/compression.md): a whole
    /// block [`Geometry::live_units_per_block`], a fragment its sixteenths, a zero or trim
    /// record one unit (it takes no block: a summary entry).
    pub fn live_units(self, geometry: &Geometry) -> u64 {
        match self {
            Mapping::Unmapped | Mapping::Shared { .. } => 0,
            Mapping::Data { .. } => geometry.live_units_per_block(),
            Mapping::Fragment { sixteenths, .. } => sixteenths as u64,
            Mapping::Zero { .. } | Mapping::Trimmed { .. } => 1,
        }
    }
}
