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
use std::sync::Arc;
use stripelog_blockdev::AlignedBuffer;

/// Rows one verification read takes at most from one member (1 MiB).
pub(crate) const VERIFICATION_READ_ROWS_MAXIMUM: usize = 256;
/// Bytes of candidates read ahead of a run that the run-ahead cache keeps at most (the
/// oldest go first).
pub(crate) const RUN_AHEAD_CACHE_BYTES: usize = 16 << 20;
/// Candidates read ahead of a run (4 MiB): asked for when a run's next candidate is
/// within half of this of the end of what was asked for.
pub(crate) const RUN_AHEAD_BLOCKS: u64 = 1024;
/// How long a request waits for a read ahead in flight that holds its candidates before
/// it reads them itself.
pub(crate) const RUN_AHEAD_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// Reads ahead waiting for the run-ahead thread at most (more are not asked for).
pub(crate) const RUN_AHEAD_QUEUE: usize = 4;

/// A round of verification reads smaller than this is read on the request's thread, one
/// member after the other; larger ones read the members in parallel.
pub(crate) const VERIFICATION_PARALLEL_BYTES_MINIMUM: usize = 1 << 20;

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
    /// What its content is keyed by in the packed block at `position`, when a fragment.
    fragment_key: Option<u64>,
    /// The segment's generation before the read (the content is still there while it is).
    generation: u32,
}

/// A block read ahead: its position and its segment's generation when it was read.
type ReadAheadKey = (u64, u32);

/// Candidates read ahead of a run (docs/deduplication.md, "Verification"), keyed by
/// position and the segment's generation when they were read: a reused segment's new
/// content is never taken for them. Each was proven by its position checksum.
#[derive(Default)]
struct RunAheadCache {
    /// Shared with the requests that find them (no copy per candidate).
    blocks: std::collections::HashMap<ReadAheadKey, Arc<[u8]>>,
    order: std::collections::VecDeque<ReadAheadKey>,
    /// The candidates asked for last: `start .. end`.
    asked: Option<(u64, u64)>,
    /// Candidates asked for and not read yet (queued or being read): `start .. end`.
    in_flight: Vec<(u64, u64)>,
}

/// The finder's tables and what it has found, for one open volume.
pub(crate) struct Deduplication {
    enabled: AtomicBool,
    pub(crate) sampling_bits: u32,
    sparse: NameTable,
    recent: NameTable,
    runs: Runs,
    run_ahead: parking_lot::Mutex<RunAheadCache>,
    /// Signalled when a read ahead is done.
    run_ahead_done: parking_lot::Condvar,
    /// Where reads ahead are asked for (threaded volumes: the run-ahead thread).
    run_ahead_requests: parking_lot::Mutex<Option<crate::queue::Sender<(u64, u64)>>>,
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
    /// Shared copies born compressed, as fragments (decision 11), and those moved.
    pub copies_compressed: AtomicU64,
    pub compressed_copies_moved: AtomicU64,
    /// Candidates read ahead of runs, and those a request then found there.
    pub candidates_read_ahead: AtomicU64,
    pub candidates_found_ahead: AtomicU64,
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
            run_ahead: parking_lot::Mutex::new(RunAheadCache::default()),
            run_ahead_done: parking_lot::Condvar::new(),
            run_ahead_requests: parking_lot::Mutex::new(None),
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

    /// Reads ahead go to `requests` from now on (the run-ahead thread's queue).
    pub(crate) fn read_ahead_through(&self, requests: crate::queue::Sender<(u64, u64)>) {
        *self.run_ahead_requests.lock() = Some(requests);
    }

    /// A run's next candidate is `next`: ask for the candidates after it to be read
    /// ahead, unless what was asked for last still covers half a read ahead of it.
    fn ask_ahead(&self, next: u64) {
        let requests = self.run_ahead_requests.lock();
        let Some(requests) = requests.as_ref() else { return };
        let mut cache = self.run_ahead.lock();
        let start = match cache.asked {
            Some((start, end)) if (start..end).contains(&next) => {
                if end - next > RUN_AHEAD_BLOCKS / 2 {
                    return;
                }
                end
            }
            _ => next,
        };
        let end = next + RUN_AHEAD_BLOCKS;
        if requests.try_send((start, end)).is_ok() {
            cache.asked = Some((next.min(start), end));
            cache.in_flight.push((start, end));
        }
    }

    /// Wait (at most [`RUN_AHEAD_WAIT`]) until no read ahead in flight holds `candidate`;
    /// whether one did.
    fn wait_for_read_ahead(&self, candidate: u64) -> bool {
        let deadline = std::time::Instant::now() + RUN_AHEAD_WAIT;
        let mut cache = self.run_ahead.lock();
        let in_flight =
            |cache: &RunAheadCache| cache.in_flight.iter().any(|range| (range.0..range.1).contains(&candidate));
        let waited = in_flight(&cache);
        while in_flight(&cache) {
            if self.run_ahead_done.wait_until(&mut cache, deadline).timed_out() {
                break;
            }
        }
        waited
    }

    /// The read ahead of `start .. end` is done (or given up).
    fn read_ahead_done(&self, start: u64, end: u64) {
        let mut cache = self.run_ahead.lock();
        if let Some(index) = cache.in_flight.iter().position(|range| *range == (start, end)) {
            cache.in_flight.swap_remove(index);
        }
        self.run_ahead_done.notify_all();
    }

    /// The content of `position` (of segment generation `generation`) if it was read
    /// ahead.
    fn read_ahead(&self, position: u64, generation: u32) -> Option<Arc<[u8]>> {
        self.run_ahead.lock().blocks.get(&(position, generation)).cloned()
    }

    fn keep_read_ahead(&self, blocks: Vec<(ReadAheadKey, Arc<[u8]>)>) {
        let mut cache = self.run_ahead.lock();
        for (key, block) in blocks {
            if cache.blocks.insert(key, block).is_none() {
                cache.order.push_back(key);
            }
        }
        while cache.order.len() * BLOCK_SIZE_BYTES > RUN_AHEAD_CACHE_BYTES {
            let Some(oldest) = cache.order.pop_front() else { break };
            cache.blocks.remove(&oldest);
        }
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
        self.count_found(source);
    }

    /// A duplicate was found through `source` (its run confirmed already).
    fn count_found(&self, source: Source) {
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
    /// the finder's candidates, with one round of reads for all (docs/deduplication.md,
    /// "Verification"): each block's first candidate whose stored checksum matches (most
    /// stale hints cost no read) — a run's prediction, then the recent table, then the
    /// sparse index — is taken from the run-ahead cache or memory, or read with the
    /// request's others (each member's rows in runs), then compared byte for byte in
    /// order. A block whose first candidate differs tries the rest one by one. A
    /// candidate that cannot be read is passed over (the write does not fail for it).
    /// `blocks`: (logical block, data, name, checksum). Callers hold the reuse fence.
    pub(crate) fn find_duplicates(
        &self,
        finder: &Deduplication,
        blocks: &[(u64, &[u8], Name, u32)],
    ) -> crate::error::Result<Vec<Option<Candidate>>> {
        let per_segment = self.geometry.blocks_per_segment();
        let counters = &finder.counters;
        // 1. Each block's first candidate whose position checksum matches.
        // The runs go on through the request as each block chooses its candidate (its
        // run confirmed before the comparison, as a hint: a candidate that turns out
        // different costs a read, never a wrong share), so that a block's run predicts the
        // next block's candidate, and survives blocks of the request that have none.
        let mut chosen: Vec<Option<Chosen>> = Vec::with_capacity(blocks.len());
        for &(logical_block, _, name, checksum) in blocks {
            counters.blocks_named.fetch_add(1, Ordering::Relaxed);
            let candidates = finder.candidates(name, logical_block);
            let mut found = None;
            for (candidate, source) in candidates {
                if let Some((mapping, position, fragment_key)) =
                    self.candidate_position(candidate, checksum, per_segment, counters)?
                {
                    let generation = self.generation(position / per_segment);
                    found = Some(Chosen { candidate, source, mapping, position, fragment_key, generation });
                    break;
                }
            }
            match found {
                Some(Chosen { candidate, .. }) => finder.runs.confirm(logical_block, candidate),
                None => finder.missed(logical_block),
            }
            chosen.push(found);
        }
        // 2. One round of reads: memory first, then each member's rows in runs.
        let mut contents: std::collections::HashMap<u64, Arc<[u8]>> = std::collections::HashMap::new();
        let mut on_members: Vec<u64> = Vec::new();
        let mut waited = false;
        for &Chosen { candidate, position, fragment_key, generation, .. } in chosen.iter().flatten() {
            if fragment_key.is_some() || contents.contains_key(&position) {
                continue;
            }
            let mut ahead = finder.read_ahead(position, generation);
            if ahead.is_none() && !waited {
                // (Once per request: the first candidate being read ahead waits for its
                // read, which brings the request's others with it.)
                waited = finder.wait_for_read_ahead(candidate);
                ahead = finder.read_ahead(position, generation);
            }
            if let Some(block) = ahead {
                counters.candidates_found_ahead.fetch_add(1, Ordering::Relaxed);
                contents.insert(position, block);
                continue;
            }
            let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
            if let crate::io::read::Lookup::Served = self.position_from_memory(position, &mut block, None) {
                contents.insert(position, Arc::from(&block[..]));
            } else {
                on_members.push(position);
            }
        }
        contents.extend(self.read_positions(&on_members));
        // 3. Compare in order; a block whose first candidate differs tries the others.
        let mut scratch = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        let mut results = Vec::with_capacity(blocks.len());
        for (&(logical_block, data, name, checksum), chosen) in blocks.iter().zip(chosen) {
            let Some(Chosen { candidate, source, mapping, position, fragment_key, generation }) = chosen else {
                results.push(None);
                continue;
            };
            let equal = match fragment_key {
                Some(key) => self
                    .read_fragment(position, key)
                    .is_ok_and(|stored| stored.extract(key, &mut scratch).is_ok() && scratch[..] == *data),
                None => match contents.get(&position) {
                    Some(block) => block[..] == *data,
                    None => self.read_position(position, candidate, &mut scratch).is_ok() && scratch[..] == *data,
                },
            };
            if equal {
                finder.count_found(source);
                results.push(Some(Candidate { logical_block: candidate, mapping, position, generation }));
                continue;
            }
            counters.candidates_read_unequal.fetch_add(1, Ordering::Relaxed);
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
        // A run that reaches the end of the request goes on in the next one: its next
        // candidates are read ahead meanwhile.
        if let (Some(&(logical_block, ..)), Some(Some(candidate))) = (blocks.last(), results.last()) {
            if finder.predicted(logical_block + 1) == Some(candidate.logical_block + 1) {
                finder.ask_ahead(candidate.logical_block + 1);
            }
        }
        Ok(results)
    }

    /// Read candidates `first .. end` ahead of a run into the run-ahead cache (the
    /// run-ahead thread; docs/deduplication.md, "Verification"): their positions as the
    /// index has them now, read in one round and proven by their position checksums.
    pub(crate) fn run_ahead(&self, finder: &Deduplication, first: u64, end: u64) -> crate::error::Result<()> {
        let result = self.read_ahead_of_run(finder, first, end);
        finder.read_ahead_done(first, end);
        result
    }

    fn read_ahead_of_run(&self, finder: &Deduplication, first: u64, end: u64) -> crate::error::Result<()> {
        let _fence = self.read_fence();
        let per_segment = self.geometry.blocks_per_segment();
        let mut wanted: Vec<(u64, u32)> = Vec::new();
        for candidate in first..end.min(self.map.block_count()) {
            // (Fragments are read with their packed block, not ahead.)
            let position = match self.map.get(candidate)? {
                Mapping::Data { position } => position,
                Mapping::Shared { record } => match self.shared.read().get(record) {
                    Some(copy) if copy.fragment.is_none() => copy.position,
                    _ => continue,
                },
                _ => continue,
            };
            let generation = self.generation(position / per_segment);
            if finder.read_ahead(position, generation).is_none() {
                wanted.push((position, generation));
            }
        }
        let positions: Vec<u64> = wanted.iter().map(|(position, _)| *position).collect();
        let generations: std::collections::HashMap<u64, u32> = wanted.into_iter().collect();
        let read: Vec<(ReadAheadKey, Arc<[u8]>)> = self
            .read_positions(&positions)
            .into_iter()
            .map(|(position, block)| ((position, generations[&position]), block))
            .collect();
        finder.counters.candidates_read_ahead.fetch_add(read.len() as u64, Ordering::Relaxed);
        finder.keep_read_ahead(read);
        Ok(())
    }

    /// The blocks at `positions` (whole blocks on the members), read in one round: each
    /// member's rows in runs of consecutive rows (at most [`VERIFICATION_READ_ROWS_MAXIMUM`]
    /// a read), the members in parallel on threaded volumes when the round is at least
    /// [`VERIFICATION_PARALLEL_BYTES_MINIMUM`], each block proven by its
    /// position checksum. A block that cannot be read so (damaged, a member lost) is read
    /// through the usual path, which rebuilds it, or left out.
    pub(crate) fn read_positions(&self, positions: &[u64]) -> Vec<(u64, Arc<[u8]>)> {
        let per_segment = self.geometry.blocks_per_segment();
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
        // A thread per member costs more than it saves on small rounds.
        let bytes: usize = runs.iter().map(|(.., run)| run.len() * BLOCK_SIZE_BYTES).sum();
        let parallel = self.io_mode() == crate::log::IoMode::Threaded
            && runs.len() > 1
            && bytes >= VERIFICATION_PARALLEL_BYTES_MINIMUM;
        let read_run = |(segment, column, first_row, run): (u64, usize, u32, Vec<u64>)| {
            let mut read = Vec::with_capacity(run.len());
            let Ok(table) = self.checksum_table(segment) else { return read };
            let member = self.geometry.members_of_column(segment, column)[0];
            let offset = self.geometry.member_offset_bytes(segment, first_row);
            let bytes = self.members.read_raw_range(member, offset, run.len() * BLOCK_SIZE_BYTES, &self.counters);
            for (index, position) in run.into_iter().enumerate() {
                let direct =
                    bytes.as_ref().map(|bytes| &bytes[index * BLOCK_SIZE_BYTES..(index + 1) * BLOCK_SIZE_BYTES]);
                // (Copied once out of the run's buffer: no zeroed, aligned block each.)
                let block: Arc<[u8]> = match direct {
                    Some(direct) if format::checksum_proves(direct, table.get(position % per_segment)) => {
                        Arc::from(direct)
                    }
                    // (The usual path verifies, hedges and rebuilds.)
                    _ => {
                        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                        if self.read_position(position, position, &mut block).is_err() {
                            continue;
                        }
                        Arc::from(&block[..])
                    }
                };
                read.push((position, block));
            }
            read
        };
        crate::array::members::for_each_item(runs, parallel, read_run).into_iter().flatten().flatten().collect()
    }

    /// `candidate`'s mapping, the position its content is at and, when that is a
    /// fragment, what it is keyed by there — when its stored checksum may be `checksum` (a
    /// fragment's is checked when it is read).
    fn candidate_position(
        &self,
        candidate: u64,
        checksum: u32,
        per_segment: u64,
        counters: &DeduplicationCounters,
    ) -> crate::error::Result<Option<(Mapping, u64, Option<u64>)>> {
        if candidate >= self.map.block_count() {
            return Ok(None);
        }
        let mapping = self.map.get(candidate)?;
        let (position, fragment_key) = match mapping {
            Mapping::Data { position } => (position, None),
            Mapping::Fragment { position, .. } => (position, Some(candidate)),
            Mapping::Shared { record } => match self.shared.read().get(record) {
                Some(copy) if copy.references < crate::space::shared::REFERENCES_MAXIMUM => {
                    (copy.position, copy.fragment.map(|_| crate::space::shared::fragment_key(record)))
                }
                Some(_) => {
                    counters.duplicates_over_bound.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
                None => return Ok(None),
            },
            Mapping::Unmapped | Mapping::Zero { .. } | Mapping::Trimmed { .. } => return Ok(None),
        };
        if fragment_key.is_none() {
            let segment = position / per_segment;
            let Ok(table) = self.checksum_table(segment) else {
                return Ok(None);
            };
            if table.get(position % per_segment) != checksum {
                counters.candidates_rejected_by_checksum.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        }
        Ok(Some((mapping, position, fragment_key)))
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
        let Some((mapping, position, fragment_key)) =
            self.candidate_position(candidate, checksum, per_segment, counters)?
        else {
            return Ok(None);
        };
        let generation = self.generation(position / per_segment);
        let read = match fragment_key {
            Some(key) => self.read_fragment(position, key).is_ok_and(|stored| stored.extract(key, scratch).is_ok()),
            None => self.read_position(position, candidate, scratch).is_ok(),
        };
        if !read || scratch[..] != *data {
            counters.candidates_read_unequal.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        Ok(Some(Candidate { logical_block: candidate, mapping, position, generation }))
    }
}
