//! Block names and the tables that turn a name into a candidate duplicate
//! (docs/deduplication.md, decisions 4–6). A name is XXH3-128 of a block's 4096 bytes.
//! The tables hold *hints*: a logical block that held the content when it was named. A
//! hint may be stale or, through a tag collision, wrong; the caller reads the candidate and
//! compares bytes before sharing anything, so nothing here needs to be exact, only small
//! and fast. Slots are atomics: concurrent writers may lose or duplicate a hint, never
//! tear one.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots per bucket: one 64-byte cache line of 8-byte slots.
pub const SLOTS_PER_BUCKET: usize = 8;
/// The sparse table is sized for this load (7/8) at one hook per `2^sampling_bits`
/// physical blocks.
const LOAD_NUMERATOR: u64 = 7;
const LOAD_DENOMINATOR: u64 = 8;
/// A slot holds a 28-bit tag of the name and a 36-bit logical block + 1 (0: empty), so
/// volumes up to 2^36 logical blocks (256 TiB) have every block nameable.
const TAG_BITS: u32 = 28;
const LOGICAL_BITS: u32 = 36;
pub const LOGICAL_BLOCKS_NAMEABLE: u64 = (1 << LOGICAL_BITS) - 1;
/// Names the recent table holds (all names written, hooks or not): duplicates close in
/// time, such as a benchmark's repeated buffers, are found whether they are hooks or not.
pub const RECENT_NAMES: usize = 65_536;
/// Open runs (decision 6), least recently used replaced.
pub const RUNS_MAXIMUM: usize = 64;
/// A run survives this many predictions in a row that were not duplicates: copies of a
/// filesystem image hold the same data blocks at the same offsets between metadata blocks
/// of their own (measured on ten /usr images: docs/deduplication.md, "The finder on a
/// real corpus").
pub const RUN_MISSES_MAXIMUM: u32 = 16;
/// The sampling of the sparse index by default: one name in 8 is a hook.
pub const DEFAULT_SAMPLING_BITS: u32 = 3;
/// At most one name in 2^this is a hook (beyond, the sparse index finds next to nothing).
pub const SAMPLING_BITS_MAXIMUM: u32 = 16;

/// XXH3-128 of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Name(pub u128);

impl Name {
    pub fn of(block: &[u8]) -> Name {
        Name(xxhash_rust::xxh3::xxh3_128(block))
    }

    /// A hook: its low `sampling_bits` bits are zero (1 name in 2^bits, by content).
    pub fn is_hook(self, sampling_bits: u32) -> bool {
        self.0 & ((1u128 << sampling_bits) - 1) == 0
    }

    /// The bits that choose the bucket (above the sampling bits, which are zero in hooks).
    fn bucket_bits(self) -> u64 {
        (self.0 >> 32) as u64
    }

    /// The tag kept in the slot (bits the bucket choice does not use).
    fn tag(self) -> u64 {
        ((self.0 >> 96) as u64) & ((1 << TAG_BITS) - 1)
    }
}

/// Buckets a name page holds (docs/deduplication.md, "The persistent name index"): 62
/// buckets of 8 slots, 3968 bytes of a 4096-byte checkpoint block.
pub const BUCKETS_PER_PAGE: u64 = (SLOTS_PER_PAGE / SLOTS_PER_BUCKET) as u64;
pub const SLOTS_PER_PAGE: usize = crate::layout::checkpoint::NAME_SLOTS_PER_PAGE;
const _: () = assert!(SLOTS_PER_PAGE.is_multiple_of(SLOTS_PER_BUCKET));

/// A table of hints: buckets of [`SLOTS_PER_BUCKET`] slots, each bucket most recent first;
/// a full bucket drops its oldest hint. Its slots are cut into pages of
/// [`BUCKETS_PER_PAGE`] buckets, the unit a checkpoint writes and an open loads: each
/// page is *dirty* (changed since a checkpoint took it) and *loaded* (holds what the
/// committed checkpoint's copy held, or there was none); a checkpoint takes only loaded
/// pages, so it never writes a page that lacks the hints its copy holds.
pub struct NameTable {
    slots: Box<[AtomicU64]>,
    buckets: u64,
    dirty: Box<[AtomicU64]>,
    loaded: Box<[AtomicU64]>,
}

fn sparse_slots(physical_blocks: u64, sampling_bits: u32) -> u64 {
    (physical_blocks >> sampling_bits) * LOAD_DENOMINATOR / LOAD_NUMERATOR
}

/// A bit per page.
fn page_bits(pages: u64, set: bool) -> Box<[AtomicU64]> {
    (0..pages.div_ceil(64)).map(|_| AtomicU64::new(if set { u64::MAX } else { 0 })).collect()
}

fn test_bit(bits: &[AtomicU64], page: u64) -> bool {
    bits[(page / 64) as usize].load(Ordering::Acquire) & (1 << (page % 64)) != 0
}

impl NameTable {
    /// A table of at least `hints` slots (whole buckets, at least one).
    pub fn with_slots(hints: u64) -> NameTable {
        let buckets = hints.div_ceil(SLOTS_PER_BUCKET as u64).max(1);
        let slots = (0..buckets * SLOTS_PER_BUCKET as u64).map(|_| AtomicU64::new(0)).collect();
        let pages = buckets.div_ceil(BUCKETS_PER_PAGE);
        NameTable { slots, buckets, dirty: page_bits(pages, false), loaded: page_bits(pages, true) }
    }

    /// Slots in the table (what a stored copy must match to be loaded into it).
    pub fn slot_count(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Pages of [`BUCKETS_PER_PAGE`] buckets (the last one may be short).
    pub fn page_count(&self) -> u64 {
        self.buckets.div_ceil(BUCKETS_PER_PAGE)
    }

    fn page_range(&self, page: u64) -> std::ops::Range<usize> {
        let first = (page * BUCKETS_PER_PAGE).min(self.buckets) as usize * SLOTS_PER_BUCKET;
        let end = ((page + 1) * BUCKETS_PER_PAGE).min(self.buckets) as usize * SLOTS_PER_BUCKET;
        first..end
    }

    /// The slots of `page` as they are now (at most [`SLOTS_PER_PAGE`]).
    pub fn page_slots(&self, page: u64) -> Vec<u64> {
        self.slots[self.page_range(page)].iter().map(|slot| slot.load(Ordering::Relaxed)).collect()
    }

    /// Pages that are to be loaded from a stored copy before a checkpoint may write them.
    pub fn expect_loads(&self, pages: impl IntoIterator<Item = u64>) {
        for page in pages {
            self.loaded[(page / 64) as usize].fetch_and(!(1 << (page % 64)), Ordering::AcqRel);
        }
    }

    pub fn is_loaded(&self, page: u64) -> bool {
        test_bit(&self.loaded, page)
    }

    /// Pages not loaded yet.
    pub fn pages_waiting_to_load(&self) -> u64 {
        (0..self.page_count()).filter(|&page| !self.is_loaded(page)).count() as u64
    }

    /// Merge a stored copy of `page` (`stored`, [`NameTable::page_slots`] as a checkpoint
    /// took them) behind the hints inserted since the open: each bucket keeps its current
    /// hints first, then the stored ones it lacks, up to [`SLOTS_PER_BUCKET`] (the
    /// oldest go). `None`: a page that could not be read (its hints are lost). Either way
    /// the page is loaded (dirty only if an insert since the open changed it).
    pub fn load_page(&self, page: u64, stored: Option<&[u64]>) {
        let range = self.page_range(page);
        if let Some(stored) = stored.filter(|stored| stored.len() == range.len()) {
            for (bucket, stored) in
                self.slots[range].chunks_exact(SLOTS_PER_BUCKET).zip(stored.chunks_exact(SLOTS_PER_BUCKET))
            {
                let mut merged: Vec<u64> =
                    bucket.iter().map(|slot| slot.load(Ordering::Relaxed)).filter(|&slot| slot != 0).collect();
                for &slot in stored {
                    if slot != 0 && merged.len() < SLOTS_PER_BUCKET && !merged.contains(&slot) {
                        merged.push(slot);
                    }
                }
                for (index, slot) in bucket.iter().enumerate() {
                    slot.store(merged.get(index).copied().unwrap_or(0), Ordering::Relaxed);
                }
            }
        }
        self.loaded[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::AcqRel);
    }

    /// The dirty pages that are loaded, no longer dirty (a checkpoint writes them; if it
    /// fails it gives them back with [`NameTable::mark_dirty`]).
    pub fn take_dirty_pages(&self) -> Vec<u64> {
        let mut pages = Vec::new();
        for (word, bits) in self.dirty.iter().enumerate() {
            let loaded = self.loaded[word].load(Ordering::Acquire);
            let taken = bits.fetch_and(!loaded, Ordering::AcqRel) & loaded;
            pages.extend((0..64).filter(|bit| taken & (1 << bit) != 0).map(|bit| word as u64 * 64 + bit));
        }
        pages
    }

    pub fn mark_dirty(&self, pages: impl IntoIterator<Item = u64>) {
        for page in pages {
            self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::AcqRel);
        }
    }

    pub fn dirty_page_count(&self) -> u64 {
        self.dirty.iter().map(|bits| bits.load(Ordering::Relaxed).count_ones() as u64).sum()
    }

    /// The sparse index of a data space of `physical_blocks`: one slot per hook expected,
    /// at 7/8 load.
    pub fn sparse(physical_blocks: u64, sampling_bits: u32) -> NameTable {
        NameTable::with_slots(sparse_slots(physical_blocks, sampling_bits))
    }

    /// [`NameTable::page_count`] of [`NameTable::sparse`] without building it.
    pub fn page_count_of(physical_blocks: u64, sampling_bits: u32) -> u64 {
        sparse_slots(physical_blocks, sampling_bits).div_ceil(SLOTS_PER_BUCKET as u64).max(1).div_ceil(BUCKETS_PER_PAGE)
    }

    /// The recent table ([`RECENT_NAMES`] slots).
    pub fn recent() -> NameTable {
        NameTable::with_slots(RECENT_NAMES as u64)
    }

    pub fn memory_bytes(&self) -> u64 {
        self.slots.len() as u64 * std::mem::size_of::<AtomicU64>() as u64
    }

    fn bucket(&self, name: Name) -> &[AtomicU64] {
        let first = (name.bucket_bits() % self.buckets) as usize * SLOTS_PER_BUCKET;
        &self.slots[first..first + SLOTS_PER_BUCKET]
    }

    /// Remember that `logical_block` holds the content named `name`. An existing hint of
    /// the same name and block moves to the front; otherwise the oldest of the bucket is
    /// dropped. Blocks beyond [`LOGICAL_BLOCKS_NAMEABLE`] are not remembered.
    pub fn insert(&self, name: Name, logical_block: u64) {
        if logical_block >= LOGICAL_BLOCKS_NAMEABLE {
            return;
        }
        let slot = (name.tag() << LOGICAL_BITS) | (logical_block + 1);
        let bucket = self.bucket(name);
        let found = bucket.iter().position(|existing| existing.load(Ordering::Relaxed) == slot);
        if found == Some(0) {
            return;
        }
        let page = (name.bucket_bits() % self.buckets) / BUCKETS_PER_PAGE;
        self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::Relaxed);
        let last = found.unwrap_or(SLOTS_PER_BUCKET - 1);
        for index in (1..=last).rev() {
            bucket[index].store(bucket[index - 1].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        bucket[0].store(slot, Ordering::Relaxed);
    }

    /// The logical blocks hinted for `name`, most recent first (usually none or one; a
    /// tag collision may add another name's block).
    pub fn candidates(&self, name: Name) -> impl Iterator<Item = u64> + '_ {
        let tag = name.tag();
        self.bucket(name).iter().filter_map(move |slot| {
            let slot = slot.load(Ordering::Relaxed);
            (slot != 0 && slot >> LOGICAL_BITS == tag).then(|| (slot & ((1 << LOGICAL_BITS) - 1)) - 1)
        })
    }
}

/// An open run: the next incoming block expected and its predicted candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    next_incoming: u64,
    next_candidate: u64,
    used_at: u64,
    /// Predictions in a row that were not duplicates.
    misses: u32,
}

/// Open runs of duplicates (decision 6): a verified `incoming ≡ candidate` predicts
/// `incoming + 1 ≡ candidate + 1`.
#[derive(Default)]
pub struct Runs {
    runs: Mutex<(Vec<Run>, u64)>,
}

impl Runs {
    /// The candidate a run predicts for `incoming`, if one expects it.
    pub fn predict(&self, incoming: u64) -> Option<u64> {
        let runs = self.runs.lock();
        runs.0.iter().find(|run| run.next_incoming == incoming).map(|run| run.next_candidate)
    }

    /// `incoming` was found to duplicate `candidate`: the run continues (or opens) with the
    /// next pair; the least recently used run makes room.
    pub fn confirm(&self, incoming: u64, candidate: u64) {
        let mut guard = self.runs.lock();
        let (runs, clock) = &mut *guard;
        *clock += 1;
        let next = Run { next_incoming: incoming + 1, next_candidate: candidate + 1, used_at: *clock, misses: 0 };
        if let Some(run) = runs.iter_mut().find(|run| run.next_incoming == incoming) {
            *run = next;
        } else if runs.len() < RUNS_MAXIMUM {
            runs.push(next);
        } else if let Some(oldest) = runs.iter_mut().min_by_key(|run| run.used_at) {
            *oldest = next;
        }
    }

    /// `incoming` did not duplicate what a run predicted: the run goes on to the next pair,
    /// and ends after [`RUN_MISSES_MAXIMUM`] misses in a row.
    pub fn miss(&self, incoming: u64) {
        let mut guard = self.runs.lock();
        let runs = &mut guard.0;
        if let Some(run) = runs.iter_mut().find(|run| run.next_incoming == incoming) {
            run.next_incoming += 1;
            run.next_candidate += 1;
            run.misses += 1;
        }
        runs.retain(|run| run.misses < RUN_MISSES_MAXIMUM);
    }

    pub fn open_runs(&self) -> usize {
        self.runs.lock().0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn block(seed: u64) -> Vec<u8> {
        let mut prng = stripelog_blockdev::Prng::new(seed);
        let mut block = vec![0u8; 4096];
        prng.fill(&mut block);
        block
    }

    /// Names are of the content: equal blocks, equal names; a changed byte, another name.
    /// About one name in 2^bits is a hook.
    #[test]
    fn names_follow_content_and_hooks_are_sampled_by_it() {
        let a = block(1);
        let mut b = a.clone();
        assert_eq!(Name::of(&a), Name::of(&b));
        b[4095] ^= 1;
        assert_ne!(Name::of(&a), Name::of(&b));
        let hooks = (0..8000u64).filter(|seed| Name::of(&block(*seed)).is_hook(3)).count();
        assert!((800..1200).contains(&hooks), "{hooks} hooks of 8000 at 1 in 8");
        assert!((0..100u64).all(|seed| Name::of(&block(seed)).is_hook(0)), "0 bits: every name");
    }

    /// The sparse index of 1 TiB of data at 1 in 8 takes about 1.14 bytes per block.
    #[test]
    fn the_sparse_index_fits_its_budget() {
        let physical_blocks = 1u64 << 28;
        let table = NameTable::sparse(physical_blocks, DEFAULT_SAMPLING_BITS);
        let per_block = table.memory_bytes() as f64 / physical_blocks as f64;
        assert!((1.1..1.2).contains(&per_block), "{per_block}");
        assert_eq!(NameTable::recent().memory_bytes(), RECENT_NAMES as u64 * 8);
    }

    /// A bucket keeps its 8 most recent hints; re-inserting one moves it to the front
    /// rather than taking a second slot.
    #[test]
    fn a_full_bucket_drops_its_oldest_hint() {
        let table = NameTable::with_slots(1); // one bucket: every name shares it
        let names: Vec<Name> = (0..9u64).map(|seed| Name::of(&block(seed))).collect();
        for (logical, name) in names.iter().enumerate() {
            table.insert(*name, logical as u64);
        }
        assert_eq!(table.candidates(names[0]).count(), 0, "the oldest was dropped");
        assert_eq!(table.candidates(names[8]).collect::<Vec<_>>(), [8]);
        table.insert(names[1], 1);
        table.insert(names[1], 1);
        assert_eq!(table.candidates(names[1]).collect::<Vec<_>>(), [1]);
        assert_eq!(table.candidates(names[2]).collect::<Vec<_>>(), [2], "re-inserting dropped nothing");
        table.insert(names[3], LOGICAL_BLOCKS_NAMEABLE);
        assert_eq!(table.candidates(names[3]).collect::<Vec<_>>(), [3], "an unnameable block is ignored");
    }

    /// Runs predict the next pair, end on a miss, and the least recently used makes room.
    #[test]
    fn runs_predict_continue_and_end() {
        let runs = Runs::default();
        assert_eq!(runs.predict(10), None);
        runs.confirm(10, 500);
        assert_eq!(runs.predict(11), Some(501));
        runs.confirm(11, 501);
        assert_eq!(runs.predict(12), Some(502));
        assert_eq!(runs.open_runs(), 1, "a continued run is one run");
        runs.miss(12);
        assert_eq!(runs.predict(13), Some(503), "a miss skips a pair");
        runs.confirm(13, 503);
        for incoming in 14..14 + RUN_MISSES_MAXIMUM as u64 - 1 {
            runs.miss(incoming);
        }
        assert_eq!(runs.predict(13 + RUN_MISSES_MAXIMUM as u64), Some(503 + RUN_MISSES_MAXIMUM as u64));
        runs.miss(13 + RUN_MISSES_MAXIMUM as u64);
        assert_eq!(runs.open_runs(), 0, "too many misses in a row end the run");
        for index in 0..RUNS_MAXIMUM as u64 + 1 {
            runs.confirm(1000 * index, 7);
        }
        assert_eq!(runs.open_runs(), RUNS_MAXIMUM);
        assert_eq!(runs.predict(1), None, "the least recently used run made room");
        assert_eq!(runs.predict(1000 * RUNS_MAXIMUM as u64 + 1), Some(8));
    }

    /// A page a checkpoint took and an open loads back gives the same candidates, behind
    /// the hints inserted since the open; an unloaded page is never taken.
    #[test]
    fn pages_round_trip_behind_newer_hints() {
        let names: Vec<Name> = (0..4000u64).map(|seed| Name::of(&block(seed))).collect();
        let before = NameTable::with_slots(2000);
        assert!(before.page_count() > 2, "several pages");
        for (logical, name) in names.iter().enumerate().take(1500) {
            before.insert(*name, logical as u64);
        }
        let dirty = before.take_dirty_pages();
        assert_eq!(dirty.len() as u64, before.page_count(), "every page changed");
        assert!(before.take_dirty_pages().is_empty(), "taken once");
        let stored: Vec<Vec<u64>> = (0..before.page_count()).map(|page| before.page_slots(page)).collect();
        let after = NameTable::with_slots(2000);
        after.expect_loads(0..after.page_count());
        after.insert(names[3999], 3999);
        assert!(after.take_dirty_pages().is_empty(), "a page not loaded is not taken");
        assert_eq!(after.pages_waiting_to_load(), after.page_count());
        for (page, slots) in stored.iter().enumerate() {
            after.load_page(page as u64, Some(slots));
        }
        assert_eq!(after.pages_waiting_to_load(), 0);
        for (logical, name) in names.iter().enumerate().take(1500) {
            let expected: Vec<u64> = before.candidates(*name).collect();
            let found: Vec<u64> = after.candidates(*name).collect();
            assert!(
                expected.iter().all(|block| found.contains(block)) || found.len() == SLOTS_PER_BUCKET,
                "name {logical}: {expected:?} kept in {found:?}"
            );
        }
        assert_eq!(after.candidates(names[3999]).next(), Some(3999), "the newer hint comes first");
        assert_eq!(after.take_dirty_pages().len(), 1, "the page with the newer hint");
        after.load_page(0, None);
    }

    proptest! {
        /// Whatever is inserted, a name's latest hint is found while fewer than 8 other
        /// hints went into its bucket after it, and every candidate returned is a block
        /// some name with the same bucket and tag was inserted with.
        #[test]
        fn the_latest_hints_are_found(inserts in proptest::collection::vec((0u64..64, 0u64..1000), 1..200)) {
            let table = NameTable::with_slots(64);
            let names: Vec<Name> = (0..64u64).map(|seed| Name::of(&block(seed))).collect();
            for (step, &(name, logical)) in inserts.iter().enumerate() {
                table.insert(names[name as usize], logical);
                let bucket = |name: Name| name.bucket_bits() % table.buckets;
                for (earlier, &(other, other_logical)) in inserts[..=step].iter().enumerate() {
                    let later_in_bucket = inserts[earlier + 1..=step]
                        .iter()
                        .filter(|(name, _)| bucket(names[*name as usize]) == bucket(names[other as usize]))
                        .count();
                    let latest_of_name = inserts[earlier + 1..=step].iter().all(|(name, _)| *name != other);
                    if latest_of_name && later_in_bucket < SLOTS_PER_BUCKET {
                        prop_assert!(table.candidates(names[other as usize]).any(|found| found == other_logical));
                    }
                }
                for (name, _) in &inserts[..=step] {
                    let name = names[*name as usize];
                    for found in table.candidates(name) {
                        prop_assert!(inserts[..=step].iter().any(|(other, logical)| *logical == found
                            && bucket(names[*other as usize]) == bucket(name)
                            && names[*other as usize].tag() == name.tag()));
                    }
                }
            }
        }
    }
}
