//! A bounded cache of 4 KiB blocks in RAM, keyed by data-space position.
//!
//! The content at a position never changes while its segment is in use, so entries need
//! no invalidation on writes. When a segment is released its generation is bumped (under
//! the reuse fence): entries stored with an older generation never match again and age
//! out. Filled by member reads (and by every written client batch on a volume whose
//! cache is too small to keep their data sets: `log::batch::BufferPool`); FIFO eviction per
//! shard within a fixed byte budget.

use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;

/// Shards: independent locks so that concurrent readers rarely contend.
const SHARD_COUNT: usize = 16;
const BLOCK_BYTES: usize = crate::layout::geometry::BLOCK_SIZE_BYTES;

struct Shard {
    entries: FxHashMap<u64, (u32, Box<[u8]>)>,
    /// Insertion order, for eviction. May name positions forgotten since (skipped then).
    order: VecDeque<u64>,
    /// Buffers of forgotten entries, reused by the next inserts.
    spare: Vec<Box<[u8]>>,
}

pub(crate) struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    blocks_per_shard: usize,
}

impl BlockCache {
    /// A cache of about `capacity_bytes`; `None` when that is less than one block per shard.
    pub(crate) fn new(capacity_bytes: u64) -> Option<BlockCache> {
        let blocks_per_shard = (capacity_bytes / BLOCK_BYTES as u64 / SHARD_COUNT as u64) as usize;
        if blocks_per_shard == 0 {
            return None;
        }
        let shards = (0..SHARD_COUNT)
            .map(|_| Mutex::new(Shard { entries: FxHashMap::default(), order: VecDeque::new(), spare: Vec::new() }))
            .collect();
        Some(BlockCache { shards, blocks_per_shard })
    }

    pub(crate) fn capacity_bytes(&self) -> u64 {
        (self.blocks_per_shard * SHARD_COUNT * BLOCK_BYTES) as u64
    }

    fn shard(&self, position: u64) -> &Mutex<Shard> {
        &self.shards[(position % SHARD_COUNT as u64) as usize]
    }

    /// Copy the block at `position` into `out` if it is cached for this generation.
    pub(crate) fn get(&self, position: u64, generation: u32, out: &mut [u8]) -> bool {
        let shard = self.shard(position).lock();
        match shard.entries.get(&position) {
            Some((stored, block)) if *stored == generation => {
                out.copy_from_slice(block);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn insert(&self, position: u64, generation: u32, block: &[u8]) {
        debug_assert_eq!(block.len(), BLOCK_BYTES);
        let mut shard = self.shard(position).lock();
        if let Some(entry) = shard.entries.get_mut(&position) {
            entry.0 = generation;
            entry.1.copy_from_slice(block);
            return;
        }
        // A forgotten entry's buffer, or at capacity the evicted one's, is reused: no
        // allocation in steady state.
        let mut recycled = shard.spare.pop();
        while shard.entries.len() >= self.blocks_per_shard {
            let Some(oldest) = shard.order.pop_front() else { break };
            if let Some((_, buffer)) = shard.entries.remove(&oldest) {
                recycled = Some(buffer);
            }
        }
        // Forgotten positions leave stale names in `order`; keep it within twice the
        // budget by dropping them (amortised over the inserts that made them).
        if shard.order.len() >= 2 * self.blocks_per_shard {
            let Shard { entries, order, .. } = &mut *shard;
            let mut seen = FxHashSet::default();
            order.retain(|position| entries.contains_key(position) && seen.insert(*position));
        }
        let buffer = match recycled {
            Some(mut buffer) => {
                buffer.copy_from_slice(block);
                buffer
            }
            None => block.into(),
        };
        shard.entries.insert(position, (generation, buffer));
        shard.order.push_back(position);
    }

    /// The block at `position` is dead (overwritten, trimmed): drop it, keep its buffer.
    pub(crate) fn forget(&self, position: u64) {
        let mut shard = self.shard(position).lock();
        if let Some((_, buffer)) = shard.entries.remove(&position) {
            shard.spare.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_need_the_same_generation_and_the_budget_holds() {
        let cache = BlockCache::new(SHARD_COUNT as u64 * 2 * BLOCK_BYTES as u64).unwrap();
        let mut out = vec![0u8; BLOCK_BYTES];
        cache.insert(5, 1, &[7u8; BLOCK_BYTES]);
        assert!(cache.get(5, 1, &mut out) && out == [7u8; BLOCK_BYTES]);
        assert!(!cache.get(5, 2, &mut out), "an older generation never matches");
        // Three positions in one shard with room for two: the first goes.
        for position in [1u64, 1 + SHARD_COUNT as u64, 1 + 2 * SHARD_COUNT as u64] {
            cache.insert(position, 0, &[position as u8; BLOCK_BYTES]);
        }
        assert!(!cache.get(1, 0, &mut out));
        assert!(cache.get(1 + 2 * SHARD_COUNT as u64, 0, &mut out));
        assert!(BlockCache::new(100).is_none());
    }

    #[test]
    fn forgotten_positions_free_their_room_and_order_stays_bounded() {
        let cache = BlockCache::new(SHARD_COUNT as u64 * 2 * BLOCK_BYTES as u64).unwrap();
        let mut out = vec![0u8; BLOCK_BYTES];
        let stride = SHARD_COUNT as u64;
        cache.insert(0, 0, &[1u8; BLOCK_BYTES]);
        cache.insert(stride, 0, &[2u8; BLOCK_BYTES]);
        cache.forget(0);
        assert!(!cache.get(0, 0, &mut out));
        // The room of the forgotten one takes a new entry without evicting the other.
        cache.insert(2 * stride, 0, &[3u8; BLOCK_BYTES]);
        assert!(cache.get(stride, 0, &mut out) && out == [2u8; BLOCK_BYTES]);
        assert!(cache.get(2 * stride, 0, &mut out) && out == [3u8; BLOCK_BYTES]);
        // Endless insert + forget cycles keep the bookkeeping within its bound.
        for round in 0..1000u64 {
            let position = (3 + round) * stride;
            cache.insert(position, 0, &[4u8; BLOCK_BYTES]);
            cache.forget(position);
        }
        let shard = cache.shards[0].lock();
        assert!(shard.order.len() <= 4 && shard.entries.len() <= 2 && shard.spare.len() <= 2);
    }
}
