//! The checksums that prove every data-space position, kept per segment in a bounded
//! cache rather than 4 bytes per position for the whole volume (docs/index-and-checkpoints.md,
//! "Decisions" 2). A segment's table is built from its own summaries (which carry the CRC32C
//! of every block they describe) when it is missing; the tables of segments receiving
//! batches are pinned, since their newest entries exist only in RAM until sealed.

use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Shards of the cache (each with its own lock), so that readers of different segments
/// rarely meet.
const SHARD_COUNT: usize = 16;

/// The CRC32C of every position of one segment, in position order.
pub(crate) struct ChecksumTable {
    values: Box<[AtomicU32]>,
}

impl ChecksumTable {
    pub(crate) fn new(positions: u64) -> ChecksumTable {
        ChecksumTable { values: (0..positions).map(|_| AtomicU32::new(0)).collect() }
    }

    /// The checksum of the position `offset` inside the segment.
    pub(crate) fn get(&self, offset: u64) -> u32 {
        self.values[offset as usize].load(Ordering::Acquire)
    }

    pub(crate) fn set(&self, offset: u64, checksum: u32) {
        self.values[offset as usize].store(checksum, Ordering::Release);
    }
}

struct Cached {
    table: Arc<ChecksumTable>,
    /// A segment receiving batches: never evicted.
    pinned: bool,
    /// Used since the clock hand last passed (second chance).
    referenced: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Shard {
    tables: FxHashMap<u64, Cached>,
    /// Segments in the order the clock hand visits them (each at most once).
    clock: VecDeque<u64>,
}

pub(crate) struct ChecksumCache {
    positions_per_segment: u64,
    /// Unpinned tables each shard keeps at most.
    capacity_per_shard: usize,
    shards: Vec<RwLock<Shard>>,
}

impl ChecksumCache {
    /// A cache of at most `capacity_bytes` of unpinned tables (at least one per shard),
    /// for segments of `positions_per_segment` positions.
    pub(crate) fn new(positions_per_segment: u64, capacity_bytes: u64) -> ChecksumCache {
        let table_bytes = positions_per_segment * 4;
        let tables = (capacity_bytes / table_bytes.max(1)) as usize;
        ChecksumCache {
            positions_per_segment,
            capacity_per_shard: (tables / SHARD_COUNT).max(1),
            shards: (0..SHARD_COUNT).map(|_| RwLock::new(Shard::default())).collect(),
        }
    }

    fn shard(&self, segment: u64) -> &RwLock<Shard> {
        &self.shards[(segment % SHARD_COUNT as u64) as usize]
    }

    /// Readers share the shard: the second-chance bit is an atomic.
    pub(crate) fn get(&self, segment: u64) -> Option<Arc<ChecksumTable>> {
        let shard = self.shard(segment).read();
        let cached = shard.tables.get(&segment)?;
        cached.referenced.store(true, Ordering::Relaxed);
        Some(cached.table.clone())
    }

    /// Put `table` in the cache for `segment` (replacing any), evicting unpinned tables
    /// beyond the capacity.
    pub(crate) fn insert(&self, segment: u64, table: Arc<ChecksumTable>, pinned: bool) {
        assert_eq!(
            table.values.len() as u64,
            self.positions_per_segment,
            "segment {segment}: a table covers its positions"
        );
        let mut shard = self.shard(segment).write();
        let cached = Cached { table, pinned, referenced: std::sync::atomic::AtomicBool::new(true) };
        if shard.tables.insert(segment, cached).is_none() {
            shard.clock.push_back(segment);
        }
        self.evict(&mut shard);
    }

    /// A segment that stopped receiving batches: its table may go when room is needed.
    pub(crate) fn unpin(&self, segment: u64) {
        let mut shard = self.shard(segment).write();
        if let Some(cached) = shard.tables.get_mut(&segment) {
            cached.pinned = false;
        }
        self.evict(&mut shard);
    }

    /// A released segment: its table describes content that no longer exists.
    pub(crate) fn forget(&self, segment: u64) {
        let mut shard = self.shard(segment).write();
        if shard.tables.remove(&segment).is_some() {
            shard.clock.retain(|&other| other != segment);
        }
    }

    fn evict(&self, shard: &mut Shard) {
        let mut unpinned = shard.tables.values().filter(|cached| !cached.pinned).count();
        // Each pass of the hand clears a referenced bit or evicts: two turns at most.
        let mut steps = 2 * shard.clock.len();
        while unpinned > self.capacity_per_shard && steps > 0 {
            steps -= 1;
            let Some(segment) = shard.clock.pop_front() else { break };
            let cached = shard.tables.get_mut(&segment).expect("the clock lists cached segments");
            if cached.pinned || cached.referenced.swap(false, Ordering::Relaxed) {
                shard.clock.push_back(segment);
            } else {
                shard.tables.remove(&segment);
                unpinned -= 1;
            }
        }
        assert_eq!(shard.clock.len(), shard.tables.len(), "the clock lists every cached table once");
    }

    /// RAM the cached tables hold.
    pub(crate) fn size_bytes(&self) -> u64 {
        let tables: usize = self.shards.iter().map(|shard| shard.read().tables.len()).sum();
        tables as u64 * self.positions_per_segment * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpinned_tables_are_bounded_and_pinned_ones_stay() {
        // Room for 16 tables of 8 positions: one per shard.
        let cache = ChecksumCache::new(8, 16 * 8 * 4);
        for segment in 0..4 * SHARD_COUNT as u64 {
            cache.insert(segment, Arc::new(ChecksumTable::new(8)), segment < SHARD_COUNT as u64);
        }
        // The first 16 (pinned, one per shard) and one unpinned per shard.
        assert!((0..SHARD_COUNT as u64).all(|segment| cache.get(segment).is_some()));
        let unpinned = (SHARD_COUNT as u64..4 * SHARD_COUNT as u64).filter(|&s| cache.get(s).is_some()).count();
        assert_eq!(unpinned, SHARD_COUNT);
        cache.unpin(0);
        cache.insert(64, Arc::new(ChecksumTable::new(8)), false);
        assert!(cache.size_bytes() <= (2 * SHARD_COUNT as u64 + 1) * 8 * 4);
        cache.forget(64);
        assert!(cache.get(64).is_none());
        let table = ChecksumTable::new(8);
        table.set(3, 0xABCD);
        assert_eq!(table.get(3), 0xABCD);
    }
}
