//! `stripelog bench compressibility`: what stripelog's compression (docs/compression.md)
//! would store for the data in a file or device, by running the engine's own fragment
//! codec and packing (`layout::packed`: units of up to 4 blocks, the probe, the 1/8 rule,
//! fragments packed in order and continuing into the next block) over its 4 KiB blocks, and what that costs in CPU. It only reads.
//! Every fragment is decompressed again and proven by its checksum, so the figures are
//! those of blocks that come back as they went in.

use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};
use stripelog_engine::layout::format::is_all_zero;
use stripelog_engine::layout::packed::{self, Compressed, COMPRESS_BUFFER_BYTES};
use stripelog_engine::BLOCK_SIZE_BYTES;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub path: String,
    /// Whole 4 KiB blocks read (a partial last block is read as if padded with zeros).
    pub logical_blocks: u64,
    /// All-zero blocks: stored as zero records with or without compression.
    pub zero_blocks: u64,
    /// Stored whole: the probe refused them, or compressed whole they saved less than 1/8.
    pub refused_by_probe_blocks: u64,
    pub too_large_blocks: u64,
    /// Blocks stored in fragments, the fragments (units of up to 4 blocks), and the packed
    /// blocks holding them.
    pub fragment_blocks: u64,
    pub fragments: u64,
    pub packed_blocks: u64,
    pub fragment_bytes: u64,
    /// Blocks on the members without compression (non-zero blocks) and with it (whole
    /// blocks + packed blocks), and their ratio.
    pub physical_blocks_without_compression: u64,
    pub physical_blocks_with_compression: u64,
    pub compression_ratio: f64,
    /// Time in the codec (one thread): compressing every non-zero block (probe included),
    /// and decompressing and proving every fragment; per GiB of non-zero data.
    pub compress_seconds: f64,
    pub decompress_seconds: f64,
    pub compress_seconds_per_gib: f64,
    pub decompress_seconds_per_gib: f64,
}

/// Packs fragments as the engine does (packed blocks version 2: a fragment continues into
/// the next blocks when the rest of the block being filled holds at least
/// `SPILL_START_BYTES_MINIMUM` of it) and proves each fragment once placed, from the
/// packed blocks it lies in.
struct Packer {
    /// The packed block being filled, when there is one.
    block: Option<Vec<u8>>,
    unit: Vec<u8>,
    decompress: Duration,
}

impl Packer {
    fn add(
        &mut self,
        report: &mut Report,
        first: u64,
        blocks: u8,
        fragment: &[u8],
        checksum: u32,
    ) -> Result<(), String> {
        let room = self.block.as_deref().map_or(0, packed::room);
        let starts_here = room >= fragment.len() || room >= packed::SPILL_START_BYTES_MINIMUM;
        let mut start = match self.block.take() {
            Some(block) if starts_here => block,
            _ => {
                let mut block = vec![0u8; BLOCK_SIZE_BYTES];
                packed::initialize(&mut block, 0);
                report.packed_blocks += 1;
                block
            }
        };
        let mut placed = packed::start_fragment(&mut start, first, blocks, (1 << blocks) - 1, fragment, checksum);
        let mut following = Vec::new();
        while placed < fragment.len() {
            let mut block = vec![0u8; BLOCK_SIZE_BYTES];
            placed += packed::continue_fragment(&mut block, &fragment[placed..]);
            report.packed_blocks += 1;
            following.push(block);
        }
        let started = Instant::now();
        let entries = packed::table(&start).map_err(|problem| format!("a packed block it built: {problem}"))?;
        let index = entries.len() - 1;
        packed::gather(&start, &entries, index, &following)
            .and_then(|bytes| packed::decompress(&bytes, entries[index], index, &mut self.unit))
            .map_err(|problem| format!("a fragment did not come back: {problem}"))?;
        self.decompress += started.elapsed();
        self.block = Some(following.pop().unwrap_or(start));
        Ok(())
    }
}

/// Estimate for `path` (a file or a block device), calling `progress(bytes read)` now and
/// then.
pub fn estimate(path: &Path, progress: &dyn Fn(u64)) -> Result<Report, String> {
    let mut report = Report { path: path.display().to_string(), ..Report::default() };
    let mut output = vec![0u8; COMPRESS_BUFFER_BYTES];
    let mut packer = Packer { block: None, unit: vec![0; packed::UNIT_BYTES_MAXIMUM], decompress: Duration::ZERO };
    let mut compress = Duration::ZERO;
    crate::read_blocks(path, progress, |buffer| {
        // Units as the volume cuts a request: runs of whole non-zero blocks, ending at
        // logical addresses that are multiples of 4 (the buffer is a multiple of 16 KiB).
        let blocks: Vec<&[u8]> = buffer.chunks_exact(BLOCK_SIZE_BYTES).collect();
        let first_in_buffer = report.logical_blocks;
        let mut next = 0;
        while next < blocks.len() {
            if is_all_zero(blocks[next]) {
                report.zero_blocks += 1;
                next += 1;
                continue;
            }
            let mut end = next + 1;
            while end < blocks.len()
                && end - next < packed::BLOCKS_PER_UNIT_MAXIMUM
                && !end.is_multiple_of(packed::BLOCKS_PER_UNIT_MAXIMUM)
                && !is_all_zero(blocks[end])
            {
                end += 1;
            }
            let unit = &buffer[next * BLOCK_SIZE_BYTES..end * BLOCK_SIZE_BYTES];
            let count = (end - next) as u64;
            let started = Instant::now();
            let judged = packed::compress(unit, &mut output);
            let checksum = packed::unit_checksum(unit);
            compress += started.elapsed();
            match judged {
                Compressed::Fragment { length } => {
                    report.fragment_blocks += count;
                    report.fragments += 1;
                    report.fragment_bytes += length as u64;
                    let first = first_in_buffer + next as u64;
                    packer.add(&mut report, first, count as u8, &output[..length], checksum)?;
                }
                Compressed::RefusedByProbe => report.refused_by_probe_blocks += count,
                Compressed::TooLarge => report.too_large_blocks += count,
            }
            next = end;
        }
        report.logical_blocks += blocks.len() as u64;
        Ok(())
    })?;
    let whole_blocks = report.refused_by_probe_blocks + report.too_large_blocks;
    report.physical_blocks_without_compression = report.logical_blocks - report.zero_blocks;
    report.physical_blocks_with_compression = whole_blocks + report.packed_blocks;
    report.compression_ratio = if report.physical_blocks_with_compression == 0 {
        1.0
    } else {
        report.physical_blocks_without_compression as f64 / report.physical_blocks_with_compression as f64
    };
    let data_gib = (report.physical_blocks_without_compression * BLOCK_SIZE_BYTES as u64) as f64 / (1u64 << 30) as f64;
    let fragment_gib = (report.fragment_blocks * BLOCK_SIZE_BYTES as u64) as f64 / (1u64 << 30) as f64;
    report.compress_seconds = compress.as_secs_f64();
    report.decompress_seconds = packer.decompress.as_secs_f64();
    report.compress_seconds_per_gib = if data_gib > 0.0 { report.compress_seconds / data_gib } else { 0.0 };
    report.decompress_seconds_per_gib = if fragment_gib > 0.0 { report.decompress_seconds / fragment_gib } else { 0.0 };
    Ok(report)
}

/// The report as a table a person reads.
pub fn table(reports: &[Report]) -> String {
    let mut text = String::from(
        "| data | non-zero 4 KiB blocks | zero | fragments | stored whole (probe / too large) | packed blocks | ratio | compress s/GiB | decompress s/GiB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for report in reports {
        text += &format!(
            "| {} | {} | {} | {} | {} / {} | {} | {:.2} | {:.2} | {:.2} |\n",
            report.path,
            report.physical_blocks_without_compression,
            report.zero_blocks,
            report.fragment_blocks,
            report.refused_by_probe_blocks,
            report.too_large_blocks,
            report.packed_blocks,
            report.compression_ratio,
            report.compress_seconds_per_gib,
            report.decompress_seconds_per_gib,
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_known_blocks_gives_the_counts_and_ratio_it_must() {
        let directory = std::env::temp_dir().join(format!("stripelog-compressibility-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("data");
        let mut bytes = Vec::new();
        // 8 blocks that compress to a few dozen bytes (two units of 4, sharing one packed
        // block),
        bytes.extend((0..8u8).flat_map(|value| vec![value + 1; BLOCK_SIZE_BYTES]));
        // a unit of 4 random blocks (xorshift), refused by the probe,
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        bytes.extend((0..4 * BLOCK_SIZE_BYTES).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        }));
        // and 2 zero blocks.
        bytes.extend(vec![0u8; 2 * BLOCK_SIZE_BYTES]);
        // A partial last block, padded with zeros as the volume would read it.
        bytes.extend(vec![7u8; 100]);
        std::fs::write(&path, &bytes).unwrap();
        let report = estimate(&path, &|_| {}).unwrap();
        std::fs::remove_dir_all(&directory).unwrap();
        assert_eq!(report.logical_blocks, 15);
        assert_eq!(report.zero_blocks, 2);
        assert_eq!(report.fragment_blocks, 9);
        assert_eq!(report.fragments, 3, "units 0-3, 4-7 and the last block alone");
        assert_eq!(report.refused_by_probe_blocks, 4);
        assert_eq!(report.packed_blocks, 1);
        assert_eq!(report.physical_blocks_without_compression, 13);
        assert_eq!(report.physical_blocks_with_compression, 5);
        assert!((report.compression_ratio - 2.6).abs() < 1e-9);
    }
}
