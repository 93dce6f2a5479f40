//! The cleaning experiment (`stripelog sim gc`): the real engine on in-memory members,
//! run synchronously (`IoMode::Inline`) so that it is fast and deterministic. It fills
//! the logical space, overwrites it several times with a chosen distribution of 4 KiB
//! writes, and measures the cleaner's write amplification over the last part.

use crate::workload::ZipfRanks;
use serde::Serialize;
use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, MemoryDevice, Prng};
use stripelog_engine::{
    CleaningPolicy, CreateOptions, IoMode, MemberDevice, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES,
};
use stripelog_flashsim::theory::{greedy_uniform_write_amplification, two_pool_write_amplification};

/// Which blocks the writes go to.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    Uniform,
    /// `hot_percent` % of the writes go to `hot_blocks_percent` % of the blocks.
    HotCold {
        hot_percent: u32,
        hot_blocks_percent: u32,
    },
    /// Zipf-distributed ranks with this exponent; the hottest 20 % of ranks get new
    /// blocks every 512 MiB written (the SepBIT paper's synthetic workload).
    Zipf {
        exponent: f64,
    },
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("unknown workload {text:?} (uniform, hotcold:90/10, zipf:0.8)");
        if text == "uniform" {
            return Ok(Workload::Uniform);
        }
        if let Some(split) = text.strip_prefix("hotcold:") {
            let (hot, blocks) = split.split_once('/').ok_or_else(bad)?;
            let hot_percent: u32 = hot.parse().map_err(|_| bad())?;
            let hot_blocks_percent: u32 = blocks.parse().map_err(|_| bad())?;
            if !(1..100).contains(&hot_percent) || !(1..100).contains(&hot_blocks_percent) {
                return Err(bad());
            }
            return Ok(Workload::HotCold { hot_percent, hot_blocks_percent });
        }
        if let Some(exponent) = text.strip_prefix("zipf:") {
            let exponent: f64 = exponent.parse().map_err(|_| bad())?;
            if !(0.0..=3.0).contains(&exponent) {
                return Err(bad());
            }
            return Ok(Workload::Zipf { exponent });
        }
        Err(bad())
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Workload::Uniform => write!(formatter, "uniform"),
            Workload::HotCold { hot_percent, hot_blocks_percent } => {
                write!(formatter, "hotcold:{hot_percent}/{hot_blocks_percent}")
            }
            Workload::Zipf { exponent } => write!(formatter, "zipf:{exponent}"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub workload: Workload,
    pub spare_fraction: f64,
    pub policy: CleaningPolicy,
    /// Relocated blocks in their own streams by predicted lifetime (the engine's default);
    /// off: one log for everything (the baseline).
    pub separate_streams: bool,
    /// Cold client writes in a stream of their own (feature bit 5, the engine's default;
    /// with `separate_streams` only); off: client writes in one stream.
    pub client_write_pairs: bool,
    /// Segments of the volume (at least 1024 for the figures; the cleaner's fixed
    /// reserve weighs less on more).
    pub segment_count: u64,
    pub chunk_size_bytes: u32,
    /// Writes after the fill, in multiples of the logical size.
    pub overwrite_passes: f64,
    /// Part of the overwrites (the last) over which amplification is measured.
    pub measured_fraction: f64,
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workload: Workload::Uniform,
            spare_fraction: 0.27,
            policy: CleaningPolicy::default(),
            separate_streams: true,
            client_write_pairs: true,
            segment_count: 2048,
            chunk_size_bytes: 256 << 10,
            overwrite_passes: 8.0,
            measured_fraction: 0.5,
            seed: 1,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub workload: String,
    pub policy: String,
    pub separate_streams: bool,
    pub client_write_pairs: bool,
    pub spare_fraction: f64,
    pub segment_count: u64,
    pub blocks_per_segment: u64,
    pub logical_blocks: u64,
    pub writes: u64,
    pub measured_writes: u64,
    /// (new data + relocated) / new data over the measured part.
    pub write_amplification: f64,
    /// Everything written to the members / new data over the measured part (RAID-5).
    pub total_amplification: f64,
    /// Summary blocks and padding of short stripes written per data or relocated block
    /// over the measured part: positions of the segments that hold no data.
    pub summary_share: f64,
    pub padding_share: f64,
    /// The analytic greedy figure for uniform writes and large segments (Desnoyers 2012).
    pub reference_greedy_uniform: Option<f64>,
    /// The spare fraction as the cleaner sees it: of the data capacity left once the
    /// cleaner's reserve segments are taken.
    pub spare_fraction_for_data: f64,
    /// The analytic greedy figure at that spare fraction (uniform writes).
    pub reference_greedy_uniform_for_data: Option<f64>,
    /// Hot/cold workloads: the bound with perfect separation into two pools, each cleaned
    /// greedily, at the nominal spare fraction (the cleaner's reserve not taken off).
    pub reference_two_pool: Option<f64>,
    pub cleaning_rounds: u64,
    /// Client writes that went to the cold stream over the measured part (feature bit 5),
    /// as a share of them.
    pub cold_write_share: f64,
    pub seconds: f64,
}

/// Blocks chosen by the workload's distribution.
struct Chooser {
    workload: Workload,
    logical_blocks: u64,
    /// Zipf: the ranks, and the block of each rank.
    zipf: Option<ZipfRanks>,
    rank_to_block: Vec<u64>,
}

impl Chooser {
    fn new(workload: &Workload, logical_blocks: u64, prng: &mut Prng) -> Chooser {
        let mut chooser = Chooser { workload: workload.clone(), logical_blocks, zipf: None, rank_to_block: Vec::new() };
        if let Workload::Zipf { exponent } = *workload {
            chooser.zipf = Some(ZipfRanks::new(logical_blocks, exponent));
            chooser.rank_to_block = (0..logical_blocks).collect();
            shuffle(&mut chooser.rank_to_block, prng);
        }
        chooser
    }

    fn next(&self, prng: &mut Prng) -> u64 {
        match self.workload {
            Workload::Uniform => prng.below(self.logical_blocks),
            Workload::HotCold { hot_percent, hot_blocks_percent } => {
                let hot_blocks = (self.logical_blocks * hot_blocks_percent as u64 / 100).max(1);
                if prng.below(100) < hot_percent as u64 {
                    prng.below(hot_blocks)
                } else {
                    hot_blocks + prng.below(self.logical_blocks - hot_blocks)
                }
            }
            Workload::Zipf { .. } => {
                let rank = self.zipf.as_ref().expect("built for Zipf").sample(prng);
                self.rank_to_block[rank as usize]
            }
        }
    }

    /// Zipf: give the hottest 20 % of ranks new blocks (hot data moves).
    fn repermute_hot(&mut self, prng: &mut Prng) {
        if self.rank_to_block.is_empty() {
            return;
        }
        let hot = self.rank_to_block.len() / 5;
        shuffle(&mut self.rank_to_block[..hot], prng);
        // And swap them with random colder ranks so that hot blocks land anywhere.
        for rank in 0..hot {
            let other = hot + prng.below((self.rank_to_block.len() - hot) as u64) as usize;
            self.rank_to_block.swap(rank, other);
        }
    }
}

fn shuffle(values: &mut [u64], prng: &mut Prng) {
    for index in (1..values.len()).rev() {
        let other = prng.below(index as u64 + 1) as usize;
        values.swap(index, other);
    }
}

/// Bytes written between two Zipf re-permutations.
const ZIPF_REPERMUTE_BYTES: u64 = 512 << 20;

pub fn run(options: &Options, progress: &dyn Fn(&str)) -> Result<Report, String> {
    if !(0.01..0.9).contains(&options.spare_fraction) {
        return Err("the spare fraction must be between 1 % and 90 %".into());
    }
    let started = std::time::Instant::now();
    let member_count = 5;
    // Room for the superblocks in front of the segments: two chunks.
    let member_size_bytes = (options.segment_count + 2) * options.chunk_size_bytes as u64;
    let members: Vec<MemberDevice> = (0..member_count)
        .map(|index| MemberDevice {
            name: format!("memory-{index}"),
            device: Some(Arc::new(MemoryDevice::new(member_size_bytes)) as Arc<dyn BlockDevice>),
        })
        .collect();
    let create = CreateOptions {
        raid_level: RaidLevel::Raid5,
        chunk_size_bytes: options.chunk_size_bytes,
        spare_ppm: (options.spare_fraction * 1e6).round() as u32,
        volume_uuid: Some([7; 16]),
        force: false,
        compression: Default::default(),
        logical_size_bytes: None,
        deduplication: false,
        client_write_pairs: options.client_write_pairs,
    };
    let open = OpenOptions {
        flush_interval: None,
        io_mode: IoMode::Inline,
        cache_size_bytes: 0,
        cleaning_policy: options.policy,
        separate_streams: options.separate_streams,
        ..OpenOptions::default()
    };
    let volume = Volume::create(members, &create, &open).map_err(|error| error.to_string())?;
    let geometry = volume.geometry().clone();
    let logical_blocks = geometry.logical_block_count();
    let mut prng = Prng::new(options.seed);
    let mut chooser = Chooser::new(&options.workload, logical_blocks, &mut prng);
    let mut block = vec![0xA5u8; BLOCK_SIZE_BYTES];
    // The counter of each block's last write: every block is checked at the end.
    let mut last_written = vec![0u64; logical_blocks as usize];
    let mut write = |volume: &Volume, logical_block: u64, counter: u64| -> Result<(), String> {
        last_written[logical_block as usize] = counter;
        block[..8].copy_from_slice(&counter.to_le_bytes());
        block[8..16].copy_from_slice(&logical_block.to_le_bytes());
        volume.write(logical_block * BLOCK_SIZE_BYTES as u64, &block, false).map_err(|error| error.to_string())
    };
    progress(&format!("filling {logical_blocks} blocks"));
    let mut counter = 0u64;
    for logical_block in 0..logical_blocks {
        write(&volume, logical_block, counter)?;
        counter += 1;
    }
    let overwrites = (logical_blocks as f64 * options.overwrite_passes) as u64;
    let measure_from = overwrites - (overwrites as f64 * options.measured_fraction) as u64;
    let mut baseline = None;
    let blocks_per_repermute = ZIPF_REPERMUTE_BYTES / BLOCK_SIZE_BYTES as u64;
    for index in 0..overwrites {
        if index == measure_from {
            volume.flush().map_err(|error| error.to_string())?;
            baseline = Some(volume.stats());
        }
        if index > 0 && index % blocks_per_repermute == 0 {
            chooser.repermute_hot(&mut prng);
        }
        if index % (overwrites / 8).max(1) == 0 {
            progress(&format!("overwrite {:.0} %", index as f64 * 100.0 / overwrites as f64));
        }
        write(&volume, chooser.next(&mut prng), counter)?;
        counter += 1;
    }
    volume.flush().map_err(|error| error.to_string())?;
    let end = volume.stats();
    // The experiment is also a correctness check of the cleaner: every block must hold
    // its last write.
    progress("verifying every block");
    let mut back = vec![0u8; BLOCK_SIZE_BYTES];
    for logical_block in 0..logical_blocks {
        volume.read(logical_block * BLOCK_SIZE_BYTES as u64, &mut back).map_err(|error| error.to_string())?;
        let counter = u64::from_le_bytes(back[..8].try_into().expect("8 bytes"));
        let stamped = u64::from_le_bytes(back[8..16].try_into().expect("8 bytes"));
        if stamped != logical_block || counter != last_written[logical_block as usize] {
            return Err(format!(
                "block {logical_block} holds write {counter} of block {stamped}, expected write {} (a cleaner bug)",
                last_written[logical_block as usize]
            ));
        }
    }
    let start = baseline.unwrap_or_else(|| end.clone());
    let reserve = stripelog_engine::CLEANING_RESERVE_SEGMENTS as u64;
    let positions_for_data = geometry.segment_count().saturating_sub(reserve)
        * (geometry.blocks_per_segment() - geometry.summary_blocks_per_segment());
    let spare_fraction_for_data = 1.0 - logical_blocks as f64 / positions_for_data as f64;
    let data = (end.member_bytes_data - start.member_bytes_data) as f64;
    let relocated = (end.member_bytes_relocated - start.member_bytes_relocated) as f64;
    let members_written = (end.member_bytes_written - start.member_bytes_written) as f64;
    let summaries = (end.member_bytes_metadata - start.member_bytes_metadata) as f64;
    let padding = (end.member_bytes_padding - start.member_bytes_padding) as f64;
    volume.close().map_err(|error| error.to_string())?;
    Ok(Report {
        workload: options.workload.to_string(),
        policy: options.policy.to_string(),
        separate_streams: options.separate_streams,
        client_write_pairs: options.client_write_pairs && options.separate_streams,
        spare_fraction: options.spare_fraction,
        segment_count: geometry.segment_count(),
        blocks_per_segment: geometry.blocks_per_segment(),
        logical_blocks,
        writes: logical_blocks + overwrites,
        measured_writes: overwrites - measure_from,
        write_amplification: if data > 0.0 { (data + relocated) / data } else { 0.0 },
        total_amplification: if data > 0.0 { members_written / data } else { 0.0 },
        summary_share: if data > 0.0 { summaries / (data + relocated) } else { 0.0 },
        padding_share: if data > 0.0 { padding / (data + relocated) } else { 0.0 },
        reference_greedy_uniform: (options.workload == Workload::Uniform)
            .then(|| greedy_uniform_write_amplification(options.spare_fraction)),
        spare_fraction_for_data,
        reference_greedy_uniform_for_data: (options.workload == Workload::Uniform && spare_fraction_for_data > 0.0)
            .then(|| greedy_uniform_write_amplification(spare_fraction_for_data)),
        reference_two_pool: match options.workload {
            Workload::HotCold { hot_percent, hot_blocks_percent } => Some(two_pool_write_amplification(
                hot_percent as f64 / 100.0,
                hot_blocks_percent as f64 / 100.0,
                options.spare_fraction,
            )),
            _ => None,
        },
        cleaning_rounds: end.cleaning_rounds,
        cold_write_share: (end.blocks_written_cold - start.blocks_written_cold) as f64
            / (overwrites - measure_from).max(1) as f64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_matches_the_published_figures() {
        for (spare, expected) in [(0.07, 7.32), (0.13, 4.03), (0.20, 2.69), (0.27, 2.06), (0.40, 1.48)] {
            let figure = greedy_uniform_write_amplification(spare);
            assert!((figure - expected).abs() < 0.01, "spare {spare}: {figure} against {expected}");
        }
    }

    #[test]
    fn workloads_parse() {
        assert_eq!("uniform".parse::<Workload>().unwrap(), Workload::Uniform);
        assert_eq!(
            "hotcold:90/10".parse::<Workload>().unwrap(),
            Workload::HotCold { hot_percent: 90, hot_blocks_percent: 10 }
        );
        assert_eq!("zipf:0.8".parse::<Workload>().unwrap(), Workload::Zipf { exponent: 0.8 });
        assert!("hotcold:90".parse::<Workload>().is_err());
        assert!("zipf:x".parse::<Workload>().is_err());
    }

    #[test]
    fn lifetime_streams_beat_one_log_on_hot_and_cold_writes() {
        let options = Options {
            workload: Workload::HotCold { hot_percent: 90, hot_blocks_percent: 10 },
            segment_count: 256,
            chunk_size_bytes: 64 << 10,
            overwrite_passes: 6.0,
            spare_fraction: 0.27,
            ..Options::default()
        };
        let streams = run(&options, &|_| {}).unwrap();
        let one_log = run(&Options { separate_streams: false, ..options.clone() }, &|_| {}).unwrap();
        assert!(
            streams.write_amplification < 0.9 * one_log.write_amplification,
            "streams {} against one log {}",
            streams.write_amplification,
            one_log.write_amplification
        );
    }

    #[test]
    fn a_small_run_cleans_and_measures_amplification_above_one() {
        // Small, but with room for the cleaner's reserve and each stream's open and
        // reserved segments (`WORKING_SPARE_SEGMENTS`) inside its spare.
        let options = Options {
            segment_count: 128,
            chunk_size_bytes: 64 << 10,
            overwrite_passes: 3.0,
            spare_fraction: 0.2,
            ..Options::default()
        };
        let report = run(&options, &|_| {}).unwrap();
        assert!(report.cleaning_rounds > 0);
        assert!(report.write_amplification > 1.0 && report.write_amplification < 10.0, "{report:?}");
    }
}
