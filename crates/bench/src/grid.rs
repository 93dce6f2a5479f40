//! The seeds' test program (seed 000 sections 14-16): random reads, then random writes,
//! for every block size and thread count, a fixed time per cell, over one region; the
//! table in the seeds' layout and the 70/30 read/write figure R/(0.7+0.3R/W).

use crate::run::{self, Data, Pattern, RunReport, Workload};
use crate::target::Target;
use serde::Serialize;
use std::time::Duration;

/// Size of the writes that fill the region before the cells (reads then hit written data).
pub const FILL_BLOCK_BYTES: usize = 1 << 20;
/// Requests in flight while filling.
pub const FILL_QUEUE_DEPTH: usize = 8;

#[derive(Clone, Debug, Serialize)]
pub struct Options {
    pub block_sizes_bytes: Vec<usize>,
    pub thread_counts: Vec<usize>,
    /// Requests in flight per thread (the seeds' program: 1).
    pub queue_depth: usize,
    pub cell_duration: Duration,
    pub region_bytes: u64,
    pub data: Data,
    /// Write the whole region sequentially first.
    pub fill: bool,
    pub seed: u64,
}

/// The seeds' block sizes: 512 bytes to 4 MiB, doubling.
pub fn default_block_sizes() -> Vec<usize> {
    (9..=22).map(|shift| 1usize << shift).collect()
}

#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub operation: &'static str,
    pub block_size_bytes: usize,
    pub threads: usize,
    pub iops: f64,
    pub bytes_per_second: f64,
    pub latency_mean_nanoseconds: f64,
    pub latency_p99_nanoseconds: u64,
    pub latency_max_nanoseconds: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Mixed {
    pub block_size_bytes: usize,
    pub threads: usize,
    /// R/(0.7+0.3R/W) with R and W the random read and write IOPS of the cell.
    pub iops_70_30: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub target: String,
    pub options: Options,
    /// Bytes per second of the sequential fill, if there was one.
    pub fill_bytes_per_second: Option<f64>,
    pub cells: Vec<Cell>,
    pub mixed: Vec<Mixed>,
}

/// The 70/30 normalisation of seeds 000 and 001: the IOPS of a stream of 70 % reads and
/// 30 % writes when reads run at `read_iops` and writes at `write_iops`.
pub fn mixed_70_30(read_iops: f64, write_iops: f64) -> f64 {
    if read_iops <= 0.0 || write_iops <= 0.0 {
        return 0.0;
    }
    read_iops / (0.7 + 0.3 * read_iops / write_iops)
}

fn workload(options: &Options, read_percent: u32, block_size_bytes: usize, threads: usize) -> Workload {
    Workload {
        read_percent,
        block_sizes_bytes: vec![block_size_bytes],
        pattern: Pattern::Random,
        zipf_exponent: None,
        region_offset_bytes: 0,
        region_bytes: options.region_bytes,
        data: options.data,
        threads,
        queue_depth: options.queue_depth,
        duration: options.cell_duration,
        write_limit_bytes: None,
        durability: Default::default(),
        seed: options.seed ^ (block_size_bytes as u64) << 8 ^ threads as u64,
    }
}

/// Run the grid. `progress` gets a line naming the cell and the fraction of the whole done.
pub fn run(target: &dyn Target, options: &Options, progress: &dyn Fn(&str, f64)) -> Result<Report, String> {
    if options.block_sizes_bytes.is_empty() || options.thread_counts.is_empty() {
        return Err("the grid needs at least one block size and one thread count".into());
    }
    let writes = target.writable();
    let cell_count = options.block_sizes_bytes.len() * options.thread_counts.len() * if writes { 2 } else { 1 };
    // Check every cell's workload before running any.
    for &size in &options.block_sizes_bytes {
        for &threads in &options.thread_counts {
            workload(options, if writes { 0 } else { 100 }, size, threads).check(target)?;
        }
    }
    let mut fill_bytes_per_second = None;
    if options.fill && writes {
        progress("filling the region sequentially", 0.0);
        let fill = Workload {
            read_percent: 0,
            block_sizes_bytes: vec![FILL_BLOCK_BYTES.min(options.region_bytes as usize / 512 * 512)],
            pattern: Pattern::Sequential,
            threads: 1,
            queue_depth: FILL_QUEUE_DEPTH,
            duration: Duration::from_secs(24 * 3600),
            write_limit_bytes: Some(options.region_bytes),
            durability: Default::default(),
            ..workload(options, 0, FILL_BLOCK_BYTES, 1)
        };
        let report = run::run(target, &fill, &|_| {})?;
        fill_bytes_per_second = Some(report.write.bw_bytes);
    }
    let mut cells = Vec::new();
    let operations: &[(&'static str, u32)] = if writes { &[("read", 100), ("write", 0)] } else { &[("read", 100)] };
    for &(operation, read_percent) in operations {
        for &size in &options.block_sizes_bytes {
            for &threads in &options.thread_counts {
                let done = cells.len() as f64 / cell_count as f64;
                progress(&format!("random {operation} {} × {threads} threads", crate::format_size(size as u64)), done);
                let report = run::run(target, &workload(options, read_percent, size, threads), &|_| {})?;
                cells.push(cell(operation, size, threads, &report));
            }
        }
    }
    let mut mixed = Vec::new();
    for &size in &options.block_sizes_bytes {
        for &threads in &options.thread_counts {
            let find = |operation: &str| {
                cells
                    .iter()
                    .find(|cell| {
                        cell.operation == operation && cell.block_size_bytes == size && cell.threads == threads
                    })
                    .map(|cell| cell.iops)
            };
            if let (Some(read), Some(write)) = (find("read"), find("write")) {
                mixed.push(Mixed { block_size_bytes: size, threads, iops_70_30: mixed_70_30(read, write) });
            }
        }
    }
    Ok(Report { target: target.describe(), options: options.clone(), fill_bytes_per_second, cells, mixed })
}

fn cell(operation: &'static str, block_size_bytes: usize, threads: usize, report: &RunReport) -> Cell {
    let direction = if operation == "read" { &report.read } else { &report.write };
    Cell {
        operation,
        block_size_bytes,
        threads,
        iops: direction.iops,
        bytes_per_second: direction.bw_bytes,
        latency_mean_nanoseconds: direction.lat_ns.mean,
        latency_p99_nanoseconds: direction.lat_ns.percentile.get("99.000000").copied().unwrap_or(0),
        latency_max_nanoseconds: direction.lat_ns.max,
    }
}

/// The table in the seeds' layout: per block size, IOPS and MB/s for each thread count,
/// reads then writes, then the 70/30 IOPS for each thread count.
pub fn table(report: &Report) -> String {
    use std::fmt::Write;
    let threads = &report.options.thread_counts;
    let mut text = String::new();
    let header = |title: &str| {
        let mut line = format!("{title:<10}");
        for count in threads {
            let label = format!("{count} thread{}", if *count == 1 { "" } else { "s" });
            let _ = write!(line, " {label:>21}");
        }
        line
    };
    let units = {
        let mut line = format!("{:<10}", "block");
        for _ in threads {
            let _ = write!(line, " {:>11} {:>9}", "IOPS", "MB/s");
        }
        line
    };
    for operation in ["read", "write"] {
        if !report.cells.iter().any(|cell| cell.operation == operation) {
            continue;
        }
        let _ = writeln!(text, "{}", header(&format!("random {operation}")));
        let _ = writeln!(text, "{units}");
        for &size in &report.options.block_sizes_bytes {
            let mut line = format!("{:<10}", crate::format_size(size as u64));
            for &count in threads {
                match report
                    .cells
                    .iter()
                    .find(|cell| cell.operation == operation && cell.block_size_bytes == size && cell.threads == count)
                {
                    Some(cell) => {
                        let _ = write!(line, " {:>11.0} {:>9.1}", cell.iops, cell.bytes_per_second / 1e6);
                    }
                    None => {
                        let _ = write!(line, " {:>11} {:>9}", "-", "-");
                    }
                }
            }
            let _ = writeln!(text, "{line}");
        }
        text.push('\n');
    }
    if !report.mixed.is_empty() {
        let _ = writeln!(text, "{}", header("70/30"));
        let mut line = format!("{:<10}", "block");
        for _ in threads {
            let _ = write!(line, " {:>21}", "IOPS");
        }
        let _ = writeln!(text, "{line}");
        for &size in &report.options.block_sizes_bytes {
            let mut line = format!("{:<10}", crate::format_size(size as u64));
            for &count in threads {
                let value = report.mixed.iter().find(|mixed| mixed.block_size_bytes == size && mixed.threads == count);
                let _ =
                    write!(line, " {:>21}", value.map_or("-".to_string(), |mixed| format!("{:.0}", mixed.iops_70_30)));
            }
            let _ = writeln!(text, "{line}");
        }
        let _ = writeln!(text, "70/30 = R/(0.7+0.3R/W) from the random read (R) and write (W) IOPS of the same cell");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_figure_follows_the_seeds_formula() {
        // Equal speeds give that speed; writes ten times slower pull it down hard.
        assert_eq!(mixed_70_30(1000.0, 1000.0), 1000.0);
        assert!((mixed_70_30(1000.0, 100.0) - 1000.0 / 3.7).abs() < 1e-9);
        assert_eq!(mixed_70_30(1000.0, 0.0), 0.0);
        assert_eq!(default_block_sizes().first(), Some(&512));
        assert_eq!(default_block_sizes().last(), Some(&(4 << 20)));
    }
}
