//! What a simulated drive is made of: NAND geometry, timings, FTL policy, and the presets
//! for the drive classes the seeds describe. Every number of a preset says where it
//! comes from (docs/flash-simulator.md has the table).
//!
//! The presets calibrate what the host sees — linear bandwidth, random IOPS, spare,
//! mapping unit, endurance — not the die count: a real drive reaches 150 MB/s with some
//! 32 planes programming 8 KiB pages in ~1.3 ms; the presets use 4 parallel units with
//! proportionally shorter program times, so that the small drives of the experiments
//! (hundreds of MiB) still have over a hundred erase blocks per unit, as real drives have
//! thousands, and garbage collection behaves as on a full-size drive.

use serde::Serialize;

/// The NAND array. A page is also the FTL's mapping unit (real MLC drives program 8 KiB
/// pages but map 4 KiB; the model folds the two into one 4 KiB page with half the
/// program time, which keeps bandwidth and IOPS).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NandGeometry {
    pub page_size_bytes: u32,
    pub pages_per_block: u32,
    pub channels: u32,
    pub dies_per_channel: u32,
    pub planes_per_die: u32,
}

impl NandGeometry {
    /// Planes that program, read and erase independently (the model's parallel units).
    pub fn parallel_units(&self) -> u32 {
        self.channels * self.dies_per_channel * self.planes_per_die
    }
    pub fn block_size_bytes(&self) -> u64 {
        self.page_size_bytes as u64 * self.pages_per_block as u64
    }
}

/// Latencies of the NAND, its buses and the controller.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NandTiming {
    pub read_page_ns: u64,
    pub program_page_ns: u64,
    pub erase_block_ns: u64,
    /// Bandwidth of one channel between controller and dies.
    pub channel_bytes_per_second: u64,
    /// Bandwidth of the host link (SATA/SAS), shared by reads and writes.
    pub host_link_bytes_per_second: u64,
    /// Controller time per command, serialised: the ceiling on IOPS of any kind.
    pub command_overhead_ns: u64,
}

/// The SandForce 1200's cap: after some minutes of writing, at most this many write
/// requests per second (seed 000 section 15).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Throttle {
    pub after_seconds: f64,
    pub write_requests_per_second_maximum: u32,
}

/// The flash translation layer's policy.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FtlPolicy {
    /// Share of the raw NAND the host cannot address (the drive's own spare area).
    pub spare_fraction: f64,
    /// Per parallel unit: garbage collection starts when fewer blocks than this are free…
    pub gc_reserve_blocks: u32,
    /// …and, once started, runs until this many more are free (0: one victim at a time,
    /// as smooth controllers do; more: the bursts that make low-end drives stall).
    pub gc_burst_blocks: u32,
    /// Static wear levelling moves the coldest block's data when a unit's erase counts
    /// spread further than this.
    pub wear_leveling_threshold_erases: u32,
    /// Pages of (power-protected) DRAM write cache: a write completes once its data is
    /// in the cache; 0 for none.
    pub write_cache_pages: u32,
    pub throttle: Option<Throttle>,
    /// Whether TRIM is acted on (2010-era software RAID did not pass it down).
    pub honours_trim: bool,
}

/// One drive: the user-visible capacity and everything above.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DriveModel {
    pub name: String,
    pub description: String,
    pub user_capacity_bytes: u64,
    pub geometry: NandGeometry,
    pub timing: NandTiming,
    pub ftl: FtlPolicy,
    /// Rated program/erase cycles of the NAND (for projected life).
    pub endurance_pe_cycles: u32,
}

/// Names of the presets, for `--drive` and help texts.
pub const PRESET_NAMES: [&str; 4] = ["consumer-mlc", "enterprise-emlc", "barefoot", "sandforce-1200"];

const MICROSECOND_NS: u64 = 1_000;
const MEGABYTE: u64 = 1_000_000;

impl DriveModel {
    /// A preset by name, at `user_capacity_bytes` (the experiments run small drives; the
    /// NAND timings are per parallel unit, so bandwidth and IOPS do not depend on size).
    pub fn preset(name: &str, user_capacity_bytes: u64) -> Option<DriveModel> {
        let model = match name {
            // Seed 003: "MLC SSD: 690$, 256GB, 150MB/sec seq. writes"; seed 000 section 9:
            // consumer drives keep 7 % free space; seed 002: "3K consumer MLC". 4 units at
            // 109 µs per 4 KiB page program 150 MB/s; 25 µs per command caps IOPS at
            // 40 000 (seed 004's consumer drives start near there). Low-end controllers
            // clean in bursts (seed 003: "limitations in SSD controller ... garbage
            // collection").
            "consumer-mlc" => DriveModel {
                name: name.into(),
                description: "consumer MLC drive, 7 % spare, 150 MB/s linear writes, bursty garbage collection".into(),
                user_capacity_bytes,
                geometry: NandGeometry {
                    page_size_bytes: 4096,
                    pages_per_block: 128,
                    channels: 2,
                    dies_per_channel: 1,
                    planes_per_die: 2,
                },
                timing: NandTiming {
                    read_page_ns: 50 * MICROSECOND_NS,
                    program_page_ns: 109 * MICROSECOND_NS,
                    erase_block_ns: 2_000 * MICROSECOND_NS,
                    channel_bytes_per_second: 200 * MEGABYTE,
                    host_link_bytes_per_second: 550 * MEGABYTE,
                    command_overhead_ns: 25 * MICROSECOND_NS,
                },
                ftl: FtlPolicy {
                    spare_fraction: 0.07,
                    gc_reserve_blocks: 2,
                    gc_burst_blocks: 2,
                    wear_leveling_threshold_erases: 64,
                    write_cache_pages: 1024,
                    throttle: None,
                    honours_trim: true,
                },
                endurance_pe_cycles: 3_000,
            },
            // Seed 000 section 9: "27% free space (as is explicitly the case with Enterprise
            // class SSDs)"; seed 002: enterprise MLC "30K or greater" P/E cycles, sequential
            // writes 150-480 MB/s, random writes 5-40 K IOPS, random reads 35-55 K IOPS.
            // 4 units at 67 µs per page: 243 MB/s; 18 µs per command: 55 K IOPS; a
            // power-protected 1 MiB write cache; garbage collection one victim at a time
            // (seed 004's enterprise drive: "remarkably tight distribution").
            "enterprise-emlc" => DriveModel {
                name: name.into(),
                description: "enterprise eMLC drive, 27 % spare, 243 MB/s linear writes, 30 000 P/E cycles".into(),
                user_capacity_bytes,
                geometry: NandGeometry {
                    page_size_bytes: 4096,
                    pages_per_block: 128,
                    channels: 2,
                    dies_per_channel: 1,
                    planes_per_die: 2,
                },
                timing: NandTiming {
                    read_page_ns: 50 * MICROSECOND_NS,
                    program_page_ns: 67 * MICROSECOND_NS,
                    erase_block_ns: 2_000 * MICROSECOND_NS,
                    channel_bytes_per_second: 200 * MEGABYTE,
                    host_link_bytes_per_second: 550 * MEGABYTE,
                    command_overhead_ns: 18 * MICROSECOND_NS,
                },
                ftl: FtlPolicy {
                    spare_fraction: 0.27,
                    gc_reserve_blocks: 2,
                    gc_burst_blocks: 0,
                    wear_leveling_threshold_erases: 64,
                    write_cache_pages: 256,
                    throttle: None,
                    honours_trim: true,
                },
                endurance_pe_cycles: 30_000,
            },
            // Seed 000 section 15: the Indilinx Barefoot (A-Data S596): 7 % free space,
            // linear writes "a tad below 110MB/sec", 4 KiB random writes 2,357 IOPS, random
            // reads 15,800 IOPS at 10 threads, and "a core block size of 16k": a 4 KiB
            // write reads and reprograms a whole 16 KiB mapping unit. 5,000-cycle MLC of
            // its era (seed 000 section 10).
            "barefoot" => DriveModel {
                name: name.into(),
                description: "Indilinx Barefoot class: 16 KiB mapping unit (slow small random writes), 7 % spare, 105 MB/s linear".into(),
                user_capacity_bytes,
                geometry: NandGeometry {
                    page_size_bytes: 16384,
                    pages_per_block: 64,
                    channels: 2,
                    dies_per_channel: 1,
                    planes_per_die: 2,
                },
                timing: NandTiming {
                    read_page_ns: 100 * MICROSECOND_NS,
                    program_page_ns: 625 * MICROSECOND_NS,
                    erase_block_ns: 2_000 * MICROSECOND_NS,
                    channel_bytes_per_second: 200 * MEGABYTE,
                    host_link_bytes_per_second: 300 * MEGABYTE,
                    command_overhead_ns: 63 * MICROSECOND_NS,
                },
                ftl: FtlPolicy {
                    spare_fraction: 0.07,
                    gc_reserve_blocks: 2,
                    gc_burst_blocks: 0,
                    wear_leveling_threshold_erases: 64,
                    write_cache_pages: 0,
                    throttle: None,
                    honours_trim: true,
                },
                endurance_pe_cycles: 5_000,
            },
            // Seed 000 section 15: the SandForce 1200 (OCZ Vertex 2): 13 % free space, about
            // 90 MB/s linear writes, 21,900 4 KiB random writes at 10 threads, 22,800
            // random reads, and "crippled to not more than 10000 IOPS" after five minutes.
            "sandforce-1200" => DriveModel {
                name: name.into(),
                description: "SandForce 1200 class: 13 % spare, 90 MB/s linear, random writes capped at 10 000 IOPS after 5 minutes".into(),
                user_capacity_bytes,
                geometry: NandGeometry {
                    page_size_bytes: 4096,
                    pages_per_block: 128,
                    channels: 2,
                    dies_per_channel: 1,
                    planes_per_die: 2,
                },
                timing: NandTiming {
                    read_page_ns: 50 * MICROSECOND_NS,
                    program_page_ns: 182 * MICROSECOND_NS,
                    erase_block_ns: 2_000 * MICROSECOND_NS,
                    channel_bytes_per_second: 200 * MEGABYTE,
                    host_link_bytes_per_second: 300 * MEGABYTE,
                    command_overhead_ns: 43 * MICROSECOND_NS,
                },
                ftl: FtlPolicy {
                    spare_fraction: 0.13,
                    gc_reserve_blocks: 2,
                    gc_burst_blocks: 0,
                    wear_leveling_threshold_erases: 64,
                    write_cache_pages: 0,
                    throttle: Some(Throttle { after_seconds: 300.0, write_requests_per_second_maximum: 10_000 }),
                    honours_trim: true,
                },
                endurance_pe_cycles: 5_000,
            },
            _ => return None,
        };
        Some(model)
    }

    /// The linear write bandwidth of the NAND (all units programming), before the host
    /// link and the channels are considered.
    pub fn nand_write_bytes_per_second(&self) -> f64 {
        let units = self.geometry.parallel_units() as f64;
        units * self.geometry.page_size_bytes as f64 * 1e9 / self.timing.program_page_ns as f64
    }

    /// The linear write bandwidth the host sees: the NAND's, or the host link's if slower.
    pub fn linear_write_bytes_per_second(&self) -> f64 {
        self.nand_write_bytes_per_second().min(self.timing.host_link_bytes_per_second as f64)
    }

    /// Check what the simulator relies on; the reason when something is off.
    pub fn validate(&self) -> Result<(), String> {
        let geometry = &self.geometry;
        if geometry.page_size_bytes < 4096 || !geometry.page_size_bytes.is_power_of_two() {
            return Err("the page size must be a power of two of at least 4096 bytes".into());
        }
        if geometry.pages_per_block < 2 || geometry.parallel_units() == 0 {
            return Err("a drive needs at least one parallel unit and two pages per block".into());
        }
        if !(0.0..0.95).contains(&self.ftl.spare_fraction) {
            return Err(format!("spare fraction {} is outside 0-95 %", self.ftl.spare_fraction));
        }
        if self.ftl.gc_reserve_blocks < 2 {
            return Err("garbage collection needs a reserve of at least 2 blocks per unit".into());
        }
        if self.user_capacity_bytes < geometry.block_size_bytes() * geometry.parallel_units() as u64 {
            return Err("the drive is smaller than one erase block per parallel unit".into());
        }
        if self.timing.channel_bytes_per_second == 0 || self.timing.host_link_bytes_per_second == 0 {
            return Err("bandwidths must be positive".into());
        }
        Ok(())
    }
}
