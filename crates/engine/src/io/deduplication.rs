//! Inline deduplication's finder (docs/deduplication.md, decisions 4–7): each whole
//! client block is named (XXH3-128), a candidate logical block is looked for — the open
//! runs first, then the recent table, then (hooks only) the sparse index — and proven
//! equal byte for byte before it is shared. The finder runs on the accepting thread,
//! before the state lock is taken; the engine rechecks under the lock that the candidate
//! is still what was compared.

use crate::index::map::Mapping;
use crate::index::names::{Name, NameTable, Runs};
use crate::layout::format;
use crate::layout::geometry::BLOCK_SIZE_BYTES;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use stripelog_blockdev::AlignedBuffer;

/// Rows one verification read takes at most from one member (1 MiB).
pub(crate) const VERIFICATION_READ_ROWS_MAXIMUM: usize = 256;

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

/// A block's candidate chosen for the request's round of reads.
#[derive(Clone, Copy)]
struct Chosen {
    candidate: u64,
    source: Source,
    mapping: Mapping,
    position: u64,
    /// The segment's generation before the read (the content is still there while it is).
    generation: u32,
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
    /// Name index pages: written by checkpoints, loaded at the open, unreadable then
    /// (their hints lost).
    pub name_pages_written: AtomicU64,
    pub name_pages_loaded: AtomicU64,
    pub name_pages_unreadable: AtomicU64,
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

    /// The sparse index (hooks), the table checkpoints persist.
    pub(crate) fn index(&self) -> &NameTable {
        &self.sparse
    }

    /// RAM the name tables take (their fixed allocation).
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.sparse.memory_bytes() + self.recent.memory_bytes()
    }

    /// What a run predicts for `logical_block`.
    pub(crate) fn predicted(&self, logical_block: u64) -> Option<u64> {
        self.runs.predict(logical_block)
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
    /// Look for a block proven equal to each whole, non-zero block of one request among
    /// the finder's candidates: its stored checksum first (most stale hints cost no read),
    /// then its content, read and compared byte for byte, with one round of reads for all (docs/deduplication.md, "Verification"): each block's first candidate
    /// that passes the position checksum — a run's prediction, or the block after the
    /// previous block's candidate, then the recent table, then the sparse index — is
    /// read, the reads of each member coalesced into runs of rows and the members read in
    /// parallel; then compared in order. A block whose first candidate differs tries the
    /// rest one by one. A candidate that cannot be read is passed over (the write does
    /// not fail for it). `blocks`: (logical block, data, name,
    /// checksum). Callers hold the reuse fence.
    pub(crate) fn find_duplicates(
        &self,
        finder: &Deduplication,
        blocks: &[(u64, &[u8], Name, u32)],
    ) -> crate::error::Result<Vec<Option<Candidate>>> {
        let per_segment = self.geometry.blocks_per_segment();
        let counters = &finder.counters;
        // 1. Each block's first candidate whose position checksum matches.
        let mut chosen: Vec<Option<Chosen>> = Vec::with_capacity(blocks.len());
        let mut previous_candidate: Option<(u64, u64)> = None;
        for &(logical_block, _, name, checksum) in blocks {
            counters.blocks_named.fetch_add(1, Ordering::Relaxed);
            let mut candidates = finder.candidates(name, logical_block);
            if let Some((previous_block, candidate)) = previous_candidate {
                // The run this request continues (confirmed only after the comparison).
                if previous_block + 1 == logical_block && finder.predicted(logical_block).is_none() {
                    candidates.insert(0, (candidate + 1, Source::Run));
                }
            }
            let mut found = None;
            for (candidate, source) in candidates {
                if let Some((mapping, position)) =
                    self.candidate_position(candidate, checksum, per_segment, counters)?
                {
                    let generation = self.generation(position / per_segment);
                    found = Some(Chosen { candidate, source, mapping, position, generation });
                    break;
                }
                if source == Source::Run {
                    finder.missed(logical_block);
                }
            }
            previous_candidate = found.map(|chosen| (logical_block, chosen.candidate));
            chosen.push(found);
        }
        // 2. One round of reads: memory first, then each member's rows in runs.
        let mut contents: std::collections::HashMap<u64, AlignedBuffer> = std::collections::HashMap::new();
        let mut on_members: Vec<u64> = Vec::new();
        for &Chosen { mapping, position, .. } in chosen.iter().flatten() {
            if matches!(mapping, Mapping::Fragment { .. }) || contents.contains_key(&position) {
                continue;
            }
            let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
            if let crate::io::read::Lookup::Served = self.position_from_memory(position, &mut block, None) {
                contents.insert(position, block);
            } else {
                on_members.push(position);
            }
        }
        contents.extend(self.read_positions(&on_members, per_segment));
        // 3. Compare in order; a block whose first candidate differs tries the others.
        let mut scratch = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        let mut results = Vec::with_capacity(blocks.len());
        for (&(logical_block, data, name, checksum), chosen) in blocks.iter().zip(chosen) {
            let Some(Chosen { candidate, source, mapping, position, generation }) = chosen else {
                results.push(None);
                continue;
            };
            let equal = match mapping {
                Mapping::Fragment { .. } => self
                    .read_fragment(position, candidate)
                    .is_ok_and(|stored| stored.extract(candidate, &mut scratch).is_ok() && scratch[..] == *data),
                _ => match contents.get(&position) {
                    Some(block) => block[..] == *data,
                    None => self.read_position(position, candidate, &mut scratch).is_ok() && scratch[..] == *data,
                },
            };
            if equal {
                finder.found(logical_block, candidate, source);
                results.push(Some(Candidate { logical_block: candidate, mapping, position, generation }));
                continue;
            }
            counters.candidates_read_unequal.fetch_add(1, Ordering::Relaxed);
            if source == Source::Run {
                finder.missed(logical_block);
            }
            let mut found = None;
            for (other, source) in finder.candidates(name, logical_block) {
                if other == candidate {
                    continue;
                }
                if let Some(proven) =
                    self.compare_candidate(other, data, checksum, per_segment, &mut scratch, counters)?
                {
                    finder.found(logical_block, other, source);
                    found = Some(proven);
                    break;
                }
            }
            results.push(found);
        }
        Ok(results)
    }

    /// The blocks at `positions` (whole blocks on the members), read in one round: each
    /// member's rows in runs of consecutive rows (at most [`VERIFICATION_READ_ROWS_MAXIMUM`]
    /// a read), the members in parallel on threaded volumes, each block proven by its
    /// position checksum. A block that cannot be read so (damaged, a member lost) is read
    /// through the usual path, which rebuilds it, or left out.
    fn read_positions(&self, positions: &[u64], per_segment: u64) -> Vec<(u64, AlignedBuffer)> {
        if positions.is_empty() {
            return Vec::new();
        }
        // (member, member offset in rows' order, positions of consecutive rows)
        let mut located: Vec<(u64, usize, u32, u64)> = positions
            .iter()
            .map(|&position| {
                let location = self.geometry.locate(position);
                (location.segment, location.column, location.row, position)
            })
            .collect();
        located.sort_unstable();
        located.dedup();
        let mut runs: Vec<(u64, usize, u32, Vec<u64>)> = Vec::new();
        for (segment, column, row, position) in located {
            match runs.last_mut() {
                Some((run_segment, run_column, first_row, run))
                    if *run_segment == segment
                        && *run_column == column
                        && *first_row + run.len() as u32 == row
                        && run.len() < VERIFICATION_READ_ROWS_MAXIMUM =>
                {
                    run.push(position)
                }
                _ => runs.push((segment, column, row, vec![position])),
            }
        }
        let parallel = self.io_mode() == crate::log::IoMode::Threaded && runs.len() > 1;
        let read_run = |(segment, column, first_row, run): (u64, usize, u32, Vec<u64>)| {
            let mut read = Vec::with_capacity(run.len());
            let Ok(table) = self.checksum_table(segment) else { return read };
            let member = self.geometry.members_of_column(segment, column)[0];
            let offset = self.geometry.member_offset_bytes(segment, first_row);
            let bytes = self.members.read_raw_range(member, offset, run.len() * BLOCK_SIZE_BYTES, &self.counters);
            for (index, position) in run.into_iter().enumerate() {
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                let direct =
                    bytes.as_ref().map(|bytes| &bytes[index * BLOCK_SIZE_BYTES..(index + 1) * BLOCK_SIZE_BYTES]);
                match direct {
                    Some(direct) if format::checksum_proves(direct, table.get(position % per_segment)) => {
                        block.copy_from_slice(direct);
                    }
                    // (The usual path verifies, hedges and rebuilds.)
                    _ if self.read_position(position, position, &mut block).is_ok() => {}
                    _ => continue,
                }
                read.push((position, block));
            }
            read
        };
        crate::array::members::for_each_item(runs, parallel, read_run).into_iter().flatten().flatten().collect()
    }

    /// `candidate`'s mapping and the position its content is at, when its stored checksum
    /// may be `checksum` (a fragment's is checked when it is read).
    fn candidate_position(
        &self,
        candidate: u64,
        checksum: u32,
        per_segment: u64,
        counters: &DeduplicationCounters,
    ) -> crate::error::Result<Option<(Mapping, u64)>> {
        if candidate >= self.map.block_count() {
            return Ok(None);
        }
        let mapping = self.map.get(candidate)?;
        let position = match mapping {
            Mapping::Data { position } | Mapping::Fragment { position, .. } => position,
            Mapping::Shared { record } => match self.shared.read().get(record) {
                Some(copy) if copy.references < crate::space::shared::REFERENCES_MAXIMUM => copy.position,
                Some(_) => {
                    counters.duplicates_over_bound.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
                None => return Ok(None),
            },
            Mapping::Unmapped | Mapping::Zero { .. } | Mapping::Trimmed { .. } => return Ok(None),
        };
        if !matches!(mapping, Mapping::Fragment { .. }) {
            let segment = position / per_segment;
            let Ok(table) = self.checksum_table(segment) else {
                return Ok(None);
            };
            if table.get(position % per_segment) != checksum {
                counters.candidates_rejected_by_checksum.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        }
        Ok(Some((mapping, position)))
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
        let Some((mapping, position)) = self.candidate_position(candidate, checksum, per_segment, counters)? else {
            return Ok(None);
        };
        let generation = self.generation(position / per_segment);
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
