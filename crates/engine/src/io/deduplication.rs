//! Inline deduplication's finder (docs/deduplication.md, decisions 4–7): each whole
//! client block is named (XXH3-128), a candidate logical block is looked for — the open
//! runs first, then the recent table, then (hooks only) the sparse index — and proven
//! equal byte for byte before it is shared. The finder runs on the accepting thread,
//! before the state lock is taken; the engine rechecks under the lock that the candidate
//! is still what was compared.

use crate::index::map::Mapping;
use crate::index::names::{Name, NameTable, Runs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A candidate that was proven equal to an incoming block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The logical block whose content it is.
    pub logical_block: u64,
    /// Its mapping when it was read and compared (data, a fragment or a shared record).
    pub mapping: Mapping,
    /// The data-space position the compared content was read from, and its segment's
    /// generation then: the content is still there while the generation is the same.
    pub position: u64,
    pub generation: u32,
}

/// Where a candidate came from (for the counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Run,
    Recent,
    Sparse,
}

/// The finder's tables and what it has found, for one open volume.
pub(crate) struct Deduplication {
    enabled: AtomicBool,
    pub(crate) sampling_bits: u32,
    sparse: NameTable,
    recent: NameTable,
    runs: Runs,
    pub(crate) counters: DeduplicationCounters,
}

/// What the finder did since the volume was opened.
#[derive(Default)]
pub(crate) struct DeduplicationCounters {
    pub blocks_named: AtomicU64,
    /// Candidates whose stored checksum differed (no read needed).
    pub candidates_rejected_by_checksum: AtomicU64,
    /// Candidates read and found different (a stale hint or a tag collision).
    pub candidates_read_unequal: AtomicU64,
    pub duplicates_by_run: AtomicU64,
    pub duplicates_by_recent: AtomicU64,
    pub duplicates_by_sparse: AtomicU64,
    /// Blocks equal to an earlier block of the same request, shared with it.
    pub duplicates_within_requests: AtomicU64,
    /// Proven duplicates the state lock found changed meanwhile (written whole).
    pub duplicates_lost_to_races: AtomicU64,
    /// Duplicates written as references or as the first shared copy.
    pub blocks_shared: AtomicU64,
    /// Duplicates of blocks already at the reference bound (written whole).
    pub duplicates_over_bound: AtomicU64,
    /// Shared copies the cleaner moved (one record rewritten each).
    pub copies_moved: AtomicU64,
}

impl Deduplication {
    /// The finder of a volume of `physical_blocks` data positions, hooks one name in
    /// `2^sampling_bits`.
    pub(crate) fn new(enabled: bool, physical_blocks: u64, sampling_bits: u32) -> Deduplication {
        Deduplication {
            enabled: AtomicBool::new(enabled),
            sampling_bits,
            sparse: NameTable::sparse(physical_blocks, sampling_bits),
            recent: NameTable::recent(),
            runs: Runs::default(),
            counters: DeduplicationCounters::default(),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub(crate) fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// RAM the name tables take (their fixed allocation).
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.sparse.memory_bytes() + self.recent.memory_bytes()
    }

    /// The candidates for a block named `name` written at `logical_block`, best first:
    /// a run's prediction, then the recent table's hints, then the sparse index's (hooks
    /// only). May repeat a block; never names `logical_block` itself unless a hint does.
    pub(crate) fn candidates(&self, name: Name, logical_block: u64) -> Vec<(u64, Source)> {
        let mut candidates = Vec::with_capacity(2);
        if let Some(predicted) = self.runs.predict(logical_block) {
            candidates.push((predicted, Source::Run));
        }
        candidates.extend(self.recent.candidates(name).map(|block| (block, Source::Recent)));
        if name.is_hook(self.sampling_bits) {
            candidates.extend(self.sparse.candidates(name).map(|block| (block, Source::Sparse)));
        }
        candidates
    }

    /// A run predicted a candidate for `logical_block` that was not a duplicate.
    pub(crate) fn missed(&self, logical_block: u64) {
        self.runs.miss(logical_block);
    }

    /// `logical_block` was proven to duplicate `candidate` (found through `source`).
    pub(crate) fn found(&self, logical_block: u64, candidate: u64, source: Source) {
        self.runs.confirm(logical_block, candidate);
        let counter = match source {
            Source::Run => &self.counters.duplicates_by_run,
            Source::Recent => &self.counters.duplicates_by_recent,
            Source::Sparse => &self.counters.duplicates_by_sparse,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Remember that `logical_block` now holds the content named `name`.
    pub(crate) fn remember(&self, name: Name, logical_block: u64) {
        self.recent.insert(name, logical_block);
        if name.is_hook(self.sampling_bits) {
            self.sparse.insert(name, logical_block);
        }
    }
}

impl crate::io::Core {
    /// Look for a block proven equal to `data` (a whole, non-zero client block for
    /// `logical_block`, named `name`, with CRC32C `checksum`) among the finder's
    /// candidates: its stored checksum first (most stale hints cost no read), then its
    /// content, read and compared byte for byte. Callers hold the reuse fence. A candidate
    /// that cannot be read is passed over (the write does not fail for it).
    pub(crate) fn find_duplicate(
        &self,
        finder: &Deduplication,
        logical_block: u64,
        data: &[u8],
        name: Name,
        checksum: u32,
        scratch: &mut [u8],
    ) -> crate::error::Result<Option<Candidate>> {
        finder.counters.blocks_named.fetch_add(1, Ordering::Relaxed);
        let per_segment = self.geometry.blocks_per_segment();
        for (candidate, source) in finder.candidates(name, logical_block) {
            let found = self.compare_candidate(candidate, data, checksum, per_segment, scratch, &finder.counters)?;
            match found {
                Some(found) => {
                    finder.found(logical_block, candidate, source);
                    return Ok(Some(found));
                }
                None if source == Source::Run => finder.missed(logical_block),
                None => {}
            }
        }
        Ok(None)
    }

    /// `candidate` as a [`Candidate`] when its content is `data`.
    fn compare_candidate(
        &self,
        candidate: u64,
        data: &[u8],
        checksum: u32,
        per_segment: u64,
        scratch: &mut [u8],
        counters: &DeduplicationCounters,
    ) -> crate::error::Result<Option<Candidate>> {
        if candidate >= self.map.block_count() {
            return Ok(None);
        }
        let mapping = self.map.get(candidate)?;
        let position = match mapping {
            Mapping::Data { position } | Mapping::Fragment { position, .. } => position,
            Mapping::Shared { record } => match self.shared.read().get(record) {
                Some(copy) if copy.references < crate::space::shared::REFERENCES_MAXIMUM => copy.position,
                Some(_) => {
                    // Full: the next source may name a copy with room (the recent table
                    // names the newest block of this content); else the block is
                    // written whole and becomes the next copy.
                    counters.duplicates_over_bound.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
                None => return Ok(None),
            },
            Mapping::Unmapped | Mapping::Zero { .. } | Mapping::Trimmed { .. } => return Ok(None),
        };
        let segment = position / per_segment;
        let generation = self.generation(segment);
        if !matches!(mapping, Mapping::Fragment { .. }) {
            // A whole block's checksum is its position's: compared before any read.
            let Ok(table) = self.checksum_table(segment) else {
                return Ok(None);
            };
            if table.get(position % per_segment) != checksum {
                counters.candidates_rejected_by_checksum.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        }
        let read = match mapping {
            Mapping::Fragment { position, .. } => {
                self.read_fragment(position, candidate).is_ok_and(|stored| stored.extract(candidate, scratch).is_ok())
            }
            _ => self.read_position(position, candidate, scratch).is_ok(),
        };
        if !read || scratch[..] != *data {
            counters.candidates_read_unequal.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        Ok(Some(Candidate { logical_block: candidate, mapping, position, generation }))
    }
}
