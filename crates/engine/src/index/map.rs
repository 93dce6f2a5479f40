//! The logical-to-physical map: one 8-byte word per logical 4 KiB block, read without
//! locks, written under the engine's state lock.

use std::sync::atomic::{AtomicU64, Ordering};

const KIND_SHIFT: u32 = 61;
const PAYLOAD_MASK: u64 = (1 << KIND_SHIFT) - 1;
const KIND_DATA: u64 = 1;
const KIND_ZERO: u64 = 2;
const KIND_TRIMMED: u64 = 3;

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
}

impl Mapping {
    pub fn encode(self) -> u64 {
        match self {
            Mapping::Unmapped => 0,
            Mapping::Data { position } => (KIND_DATA << KIND_SHIFT) | (position & PAYLOAD_MASK),
            Mapping::Zero { segment } => (KIND_ZERO << KIND_SHIFT) | (segment & PAYLOAD_MASK),
            Mapping::Trimmed { segment } => (KIND_TRIMMED << KIND_SHIFT) | (segment & PAYLOAD_MASK),
        }
    }

    pub fn decode(word: u64) -> Mapping {
        let payload = word & PAYLOAD_MASK;
        match word >> KIND_SHIFT {
            KIND_DATA => Mapping::Data { position: payload },
            KIND_ZERO => Mapping::Zero { segment: payload },
            KIND_TRIMMED => Mapping::Trimmed { segment: payload },
            _ => Mapping::Unmapped,
        }
    }

    /// The segment whose record this mapping depends on (kept live while it does).
    pub fn segment(self, blocks_per_segment: u64) -> Option<u64> {
        match self {
            Mapping::Unmapped => None,
            Mapping::Data { position } => Some(position / blocks_per_segment),
            Mapping::Zero { segment } | Mapping::Trimmed { segment } => Some(segment),
        }
    }
}

pub struct BlockMap {
    words: Vec<AtomicU64>,
}

impl BlockMap {
    pub fn new(block_count: u64) -> Self {
        BlockMap { words: (0..block_count).map(|_| AtomicU64::new(0)).collect() }
    }

    pub fn block_count(&self) -> u64 {
        self.words.len() as u64
    }

    pub fn get(&self, logical_block: u64) -> Mapping {
        Mapping::decode(self.words[logical_block as usize].load(Ordering::Acquire))
    }

    /// Replace a mapping and return the old one. Callers hold the state lock.
    pub fn set(&self, logical_block: u64, mapping: Mapping) -> Mapping {
        Mapping::decode(self.words[logical_block as usize].swap(mapping.encode(), Ordering::AcqRel))
    }

    pub fn size_bytes(&self) -> u64 {
        self.words.len() as u64 * std::mem::size_of::<AtomicU64>() as u64
    }

    pub fn iter(&self) -> impl Iterator<Item = Mapping> + '_ {
        self.words.iter().map(|word| Mapping::decode(word.load(Ordering::Acquire)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn mappings_round_trip(kind in 0u8..4, payload in 0u64..(1 << 61)) {
            let mapping = match kind {
                0 => Mapping::Unmapped,
                1 => Mapping::Data { position: payload },
                2 => Mapping::Zero { segment: payload },
                _ => Mapping::Trimmed { segment: payload },
            };
            prop_assert_eq!(Mapping::decode(mapping.encode()), mapping);
        }

        /// The map behaves like a plain array of mappings under any sequence of sets.
        #[test]
        fn map_matches_a_reference(operations in proptest::collection::vec((0u64..64, 0u64..1000), 0..200)) {
            let map = BlockMap::new(64);
            let mut reference = vec![Mapping::Unmapped; 64];
            for (block, position) in operations {
                let old = map.set(block, Mapping::Data { position });
                prop_assert_eq!(old, reference[block as usize]);
                reference[block as usize] = Mapping::Data { position };
            }
            for (block, expected) in reference.iter().enumerate() {
                prop_assert_eq!(map.get(block as u64), *expected);
            }
        }
    }
}
