//! `stripelog bench dedupability`: how many of the duplicate 4 KiB blocks in files or
//! devices the engine's duplicate finder (docs/deduplication.md, decisions 4–6: the
//! engine's own names, sparse and recent tables and runs, `index::names`) finds, against
//! exact deduplication, and with how much RAM. The inputs are taken as written one after
//! another into one volume, each block once, in order. A candidate counts as found only
//! when the block it hints holds the same content (the engine compares bytes; here the
//! 128-bit names of the two blocks are compared, which nothing written once can make
//! stale). It only reads.

use serde::Serialize;
use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};
use stripelog_engine::index::names::{Name, NameTable, Runs};
use stripelog_engine::layout::format::is_all_zero;
use stripelog_engine::BLOCK_SIZE_BYTES;

/// The figures after one input, counting every input read so far.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub path: String,
    /// Blocks read so far, and of them all zeros (zero records: no dedup needed).
    pub logical_blocks: u64,
    pub zero_blocks: u64,
    /// Non-zero blocks whose content an earlier block already had (what exact
    /// deduplication saves), and those the finder found.
    pub duplicate_blocks: u64,
    pub found_blocks: u64,
    /// found ÷ duplicate.
    pub found_share: f64,
    /// Blocks of data kept: without deduplication (non-zero), with exact, with the finder.
    pub physical_blocks_without: u64,
    pub physical_blocks_exact: u64,
    pub physical_blocks_found: u64,
    /// Found by a run's prediction, by the recent table, by the sparse index.
    pub found_by_run: u64,
    pub found_by_recent: u64,
    pub found_by_sparse: u64,
    /// Candidates that did not hold the content (in the engine: reads wasted).
    pub candidates_wrong: u64,
    /// The tables' RAM and the physical blocks the sparse table was sized for.
    pub index_bytes: u64,
    pub capacity_blocks: u64,
    pub index_bytes_per_physical_block: f64,
    /// Time naming the non-zero blocks (XXH3-128, one thread), per GiB.
    pub name_seconds_per_gib: f64,
}

/// The finder over a sequence of inputs.
pub struct Finder {
    sparse: NameTable,
    recent: NameTable,
    runs: Runs,
    sampling_bits: u32,
    /// The name of every logical block written (0: a zero block), the "media".
    stored: Vec<u128>,
    seen: HashSet<u128>,
    report: Report,
    naming: Duration,
    named_bytes: u64,
}

impl Finder {
    /// A finder whose sparse table is sized for `capacity_blocks` physical blocks.
    pub fn new(capacity_blocks: u64, sampling_bits: u32) -> Finder {
        Finder::with_recent(capacity_blocks, sampling_bits, NameTable::recent())
    }

    fn with_recent(capacity_blocks: u64, sampling_bits: u32, recent: NameTable) -> Finder {
        let sparse = NameTable::sparse(capacity_blocks, sampling_bits);
        let index_bytes = sparse.memory_bytes() + recent.memory_bytes();
        Finder {
            sparse,
            recent,
            runs: Runs::default(),
            sampling_bits,
            stored: Vec::new(),
            seen: HashSet::new(),
            report: Report {
                index_bytes,
                capacity_blocks,
                index_bytes_per_physical_block: index_bytes as f64 / capacity_blocks.max(1) as f64,
                ..Report::default()
            },
            naming: Duration::ZERO,
            named_bytes: 0,
        }
    }

    fn holds(&self, logical_block: u64, name: Name) -> bool {
        self.stored.get(logical_block as usize) == Some(&name.0)
    }

    /// Write one block at the next logical address.
    pub fn add(&mut self, block: &[u8]) {
        let logical_block = self.stored.len() as u64;
        self.report.logical_blocks += 1;
        if is_all_zero(block) {
            self.report.zero_blocks += 1;
            // (Not a duplicate of what a run predicted: the run skips it.)
            self.runs.miss(logical_block);
            self.stored.push(0);
            return;
        }
        let started = Instant::now();
        let name = Name::of(block);
        self.naming += started.elapsed();
        self.named_bytes += block.len() as u64;
        self.report.physical_blocks_without += 1;
        if self.seen.insert(name.0) {
            self.report.physical_blocks_exact += 1;
        } else {
            self.report.duplicate_blocks += 1;
        }
        let mut found = None;
        if let Some(candidate) = self.runs.predict(logical_block) {
            if self.holds(candidate, name) {
                found = Some((candidate, 0));
            } else {
                self.report.candidates_wrong += 1;
                self.runs.miss(logical_block);
            }
        }
        if found.is_none() {
            let mut candidates: Vec<(u64, u8)> = self.recent.candidates(name).map(|block| (block, 1)).collect();
            if name.is_hook(self.sampling_bits) {
                candidates.extend(self.sparse.candidates(name).map(|block| (block, 2)));
            }
            for (candidate, source) in candidates {
                if self.holds(candidate, name) {
                    found = Some((candidate, source));
                    break;
                }
                self.report.candidates_wrong += 1;
            }
        }
        match found {
            Some((candidate, source)) => {
                self.report.found_blocks += 1;
                match source {
                    0 => self.report.found_by_run += 1,
                    1 => self.report.found_by_recent += 1,
                    _ => self.report.found_by_sparse += 1,
                }
                self.runs.confirm(logical_block, candidate);
            }
            None => self.report.physical_blocks_found += 1,
        }
        self.recent.insert(name, logical_block);
        if name.is_hook(self.sampling_bits) {
            self.sparse.insert(name, logical_block);
        }
        self.stored.push(name.0);
    }

    /// The figures so far, for `path`.
    pub fn report(&self, path: &str) -> Report {
        let mut report = self.report.clone();
        report.path = path.to_string();
        report.found_share = if report.duplicate_blocks == 0 {
            1.0
        } else {
            report.found_blocks as f64 / report.duplicate_blocks as f64
        };
        let gib = self.named_bytes as f64 / (1u64 << 30) as f64;
        report.name_seconds_per_gib = if gib > 0.0 { self.naming.as_secs_f64() / gib } else { 0.0 };
        report
    }

    /// Read `path` to its end (a partial last block padded with zeros) into the finder.
    pub fn read(&mut self, path: &Path, progress: &dyn Fn(u64)) -> Result<Report, String> {
        crate::read_blocks(path, progress, |buffer| {
            for block in buffer.chunks_exact(BLOCK_SIZE_BYTES) {
                self.add(block);
            }
            Ok(())
        })?;
        Ok(self.report(&path.display().to_string()))
    }
}

pub fn table(reports: &[Report]) -> String {
    let mut text = String::from(
        "| after | non-zero blocks | exact: kept | duplicates | found | found share | kept with the finder | kept ÷ first input's | index B per physical block |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let first = reports.first().map_or(1, |report| report.physical_blocks_found.max(1));
    for report in reports {
        text += &format!(
            "| {} | {} | {} | {} | {} | {:.3} | {} | {:.2} | {:.2} |\n",
            report.path,
            report.physical_blocks_without,
            report.physical_blocks_exact,
            report.duplicate_blocks,
            report.found_blocks,
            report.found_share,
            report.physical_blocks_found,
            report.physical_blocks_found as f64 / first as f64,
            report.index_bytes_per_physical_block,
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(seed: u64) -> Vec<u8> {
        let mut prng = stripelog_blockdev::Prng::new(seed);
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        prng.fill(&mut block);
        block
    }

    /// A second copy of 2000 random blocks (with a zero block and a changed block in
    /// it), written when the recent table no longer holds the first, is found nearly
    /// whole: its hooks start runs that carry over the rest. A block repeated soon after
    /// it was written is found by the recent table.
    #[test]
    fn a_second_copy_is_found_by_hooks_and_runs() {
        let mut finder = Finder::with_recent(1 << 16, 3, NameTable::with_slots(8));
        let first: Vec<Vec<u8>> = (0..2000).map(block).collect();
        for data in &first {
            finder.add(data);
        }
        let after_first = finder.report("first");
        assert_eq!((after_first.duplicate_blocks, after_first.found_blocks), (0, 0));
        assert_eq!(after_first.physical_blocks_found, 2000);
        for (index, data) in first.iter().enumerate() {
            match index {
                500 => finder.add(&vec![0u8; BLOCK_SIZE_BYTES]),
                1000 => finder.add(&block(99_999)),
                _ => finder.add(data),
            }
        }
        let report = finder.report("second");
        assert_eq!(report.zero_blocks, 1);
        assert_eq!(report.duplicate_blocks, 1998);
        // Nearly all are found, most by the run the first hook opened.
        assert!(report.found_blocks >= 1998 - 60, "{report:?}");
        assert!(report.found_by_run > report.found_by_sparse, "{report:?}");
        // Only the blocks before the copy's first hook are missed: the zero block and the
        // changed one do not end the run, it carries on past them.
        let first_hook = first.iter().position(|data| Name::of(data).is_hook(3)).unwrap() as u64;
        assert_eq!(report.found_blocks, 1998 - first_hook, "{report:?}");
        assert_eq!(report.physical_blocks_found, 2000 + 1 + (1998 - report.found_blocks));
        let recent_before = report.found_by_recent;
        let fresh = block(123_456);
        finder.add(&fresh);
        finder.add(&fresh);
        assert_eq!(finder.report("again").found_by_recent, recent_before + 1, "found in the recent table");
    }
}
