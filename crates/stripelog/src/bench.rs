//! `stripelog bench mix` and `stripelog bench grid`: the general benchmark on any target.

use crate::units;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use stripelog_bench::run::{Data, Pattern, RunReport, Workload};
use stripelog_bench::target::{self, TargetOptions};

/// What every run of the general benchmark shares.
#[derive(Args)]
pub struct TargetArguments {
    /// What to measure (see Targets below).
    target: String,
    /// Bytes of the target to use, from --offset (default: all of it; grid: 4GiB).
    #[arg(long, value_parser = units::parse_size)]
    region: Option<u64>,
    /// Where the region starts.
    #[arg(long, default_value = "0", value_parser = units::parse_size)]
    offset: u64,
    /// Create a missing file target of this size (sparse).
    #[arg(long, value_parser = units::parse_size)]
    size: Option<u64>,
    /// engine: targets: the volume's block cache (0: off, every read goes to the members;
    /// default: the engine's, 256 MiB).
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size)]
    engine_cache: Option<u64>,
    /// engine: targets: the volume's index page cache (as `serve --map-cache`; default:
    /// the whole index when it fits a quarter of the machine's memory).
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size)]
    map_cache: Option<u64>,
    /// Allow writing to a target that holds data (its data is overwritten): a file or device
    /// that exists and is not empty, an NBD export with allocated extents (or that cannot say),
    /// an engine: volume with mapped blocks.
    #[arg(long)]
    force: bool,
    /// Make this percentage of every written block zeros (default: random, incompressible).
    #[arg(long, value_name = "PERCENT", conflicts_with = "zero")]
    compressible: Option<u32>,
    /// Write blocks of zeros.
    #[arg(long)]
    zero: bool,
    /// Seed of the offsets and data (runs with the same seed issue the same requests).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the report as JSON (fio-like names: iops, bw_bytes, lat_ns).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

impl TargetArguments {
    fn data(&self) -> Result<Data, String> {
        match (self.compressible, self.zero) {
            (Some(percent), _) if percent > 100 => Err("--compressible is a percentage (0-100)".into()),
            (Some(percent), _) => Ok(Data::Compressible(percent)),
            (None, true) => Ok(Data::Zero),
            (None, false) => Ok(Data::Random),
        }
    }

    fn open(&self, writes: bool) -> Result<Box<dyn target::Target>, String> {
        let options = TargetOptions {
            writes,
            force: self.force,
            create_size_bytes: self.size,
            engine_cache_bytes: self.engine_cache,
            map_cache_bytes: self.map_cache,
        };
        target::open(&self.target, &options)
    }
}

#[derive(Args)]
pub struct MixArguments {
    #[command(flatten)]
    target: TargetArguments,
    /// Share of requests that read (0-100).
    #[arg(long, default_value_t = 0)]
    read_percent: u32,
    /// Request size; several sizes separated by commas are mixed evenly.
    #[arg(long, default_value = "4KiB", value_delimiter = ',', value_parser = units::parse_size)]
    block_size: Vec<u64>,
    /// Requests in flight per thread.
    #[arg(long, default_value_t = 1)]
    queue_depth: usize,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    duration: Duration,
    /// Offsets: random or sequential (each thread its own slice of the region).
    #[arg(long, default_value = "random", value_parser = parse_pattern)]
    pattern: Pattern,
    /// Random offsets follow a Zipf distribution with this exponent (e.g. 0.8).
    #[arg(long, value_name = "THETA")]
    zipf: Option<f64>,
    /// Also stop after writing this much.
    #[arg(long, value_parser = units::parse_size)]
    write_limit: Option<u64>,
    /// Per-second IOPS and bandwidth as CSV.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// A chart of each operation's latency distribution (percentiles in nines, to the
    /// maximum) as SVG or PNG, by the extension.
    #[arg(long, value_name = "FILE")]
    chart: Option<PathBuf>,
}

fn parse_pattern(text: &str) -> Result<Pattern, String> {
    match text {
        "random" => Ok(Pattern::Random),
        "sequential" => Ok(Pattern::Sequential),
        other => Err(format!("unknown pattern {other:?} (random, sequential)")),
    }
}

fn block_size(bytes: u64) -> Result<usize, String> {
    usize::try_from(bytes)
        .ok()
        .filter(|&size| size > 0 && size.is_multiple_of(512) && size <= 64 << 20)
        .ok_or_else(|| format!("block size {bytes}: must be a multiple of 512 bytes, at most 64 MiB"))
}

/// Positions of the progress bar (it shows fractions of the whole).
const PROGRESS_STEPS: u64 = 1000;

fn progress_bar(quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    // indicatif draws nothing when stderr is not a terminal.
    let bar = indicatif::ProgressBar::new(PROGRESS_STEPS);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {percent:>3}% [{elapsed} < {eta}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Run `body` under a progress bar (hidden with --quiet or off a terminal), cleared
/// before the report prints; `body` reports what runs now and the fraction done.
fn with_progress<T>(
    quiet: bool,
    body: impl FnOnce(&(dyn Fn(Option<&str>, f64) + Sync)) -> Result<T, String>,
) -> Result<T, String> {
    let bar = progress_bar(quiet);
    let result = body(&|step, done| show_progress(&bar, step, done));
    bar.finish_and_clear();
    result
}

/// Show `done` (a fraction of the whole) and, if given, what is running now.
fn show_progress(bar: &indicatif::ProgressBar, step: Option<&str>, done: f64) {
    if let Some(step) = step {
        bar.set_message(step.to_string());
    }
    bar.set_position((done * PROGRESS_STEPS as f64) as u64);
}

fn microseconds(nanoseconds: f64) -> String {
    format!("{:.1}", nanoseconds / 1000.0)
}

fn print_run(report: &RunReport) {
    println!("target: {}", report.target);
    let workload = &report.workload;
    println!(
        "{} % reads, {} blocks, {} offsets{}, {} thread(s) × queue depth {}, region {} from {}, {:.1} s",
        workload.read_percent,
        workload
            .block_sizes_bytes
            .iter()
            .map(|&size| stripelog_bench::format_size(size as u64))
            .collect::<Vec<_>>()
            .join("/"),
        match workload.pattern {
            Pattern::Random => "random",
            Pattern::Sequential => "sequential",
        },
        workload.zipf_exponent.map(|theta| format!(" (zipf {theta})")).unwrap_or_default(),
        workload.threads,
        workload.queue_depth,
        stripelog_bench::format_size(workload.region_bytes),
        workload.region_offset_bytes,
        report.elapsed_seconds
    );
    println!(
        "{:<6} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "", "IOPS", "MB/s", "mean µs", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "avg-max µs"
    );
    for (name, direction) in [("read", &report.read), ("write", &report.write)] {
        if direction.total_ios == 0 {
            continue;
        }
        let latency = &direction.lat_ns;
        let percentile = |key: &str| microseconds(latency.percentile.get(key).copied().unwrap_or(0) as f64);
        println!(
            "{:<6} {:>11.0} {:>10.1} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
            name,
            direction.iops,
            direction.bw_bytes / 1e6,
            microseconds(latency.mean),
            percentile("50.000000"),
            percentile("99.000000"),
            percentile("99.900000"),
            microseconds(latency.max as f64),
            microseconds(latency.average_maximum)
        );
    }
}

pub fn mix(arguments: MixArguments) -> Result<ExitCode, String> {
    if let Some(path) = &arguments.chart {
        stripelog_bench::chart::check(path)?;
    }
    let data = arguments.target.data()?;
    let block_sizes_bytes =
        arguments.block_size.iter().map(|&bytes| block_size(bytes)).collect::<Result<Vec<_>, _>>()?;
    let target = arguments.target.open(arguments.read_percent < 100)?;
    let region_bytes =
        arguments.target.region.unwrap_or_else(|| target.size_bytes().saturating_sub(arguments.target.offset));
    let workload = Workload {
        read_percent: arguments.read_percent,
        block_sizes_bytes,
        pattern: arguments.pattern,
        zipf_exponent: arguments.zipf,
        region_offset_bytes: arguments.target.offset,
        region_bytes,
        data,
        threads: arguments.threads,
        queue_depth: arguments.queue_depth,
        duration: arguments.duration,
        write_limit_bytes: arguments.write_limit,
        durability: Default::default(),
        seed: arguments.target.seed,
    };
    let report = with_progress(arguments.target.quiet, |progress| {
        stripelog_bench::run::run(target.as_ref(), &workload, &|done| progress(None, done))
    })?;
    print_run(&report);
    crate::write_json_file(arguments.target.json.as_deref(), &report)?;
    if let Some(path) = &arguments.csv {
        let mut text = String::from("second,read_iops,write_iops,read_bytes,write_bytes\n");
        for second in &report.seconds {
            text.push_str(&format!(
                "{},{},{},{},{}\n",
                second.second, second.read_iops, second.write_iops, second.read_bytes, second.write_bytes
            ));
        }
        std::fs::write(path, text).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    if let Some(path) = &arguments.chart {
        stripelog_bench::distribution::chart(&report, path)?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct GridArguments {
    #[command(flatten)]
    target: TargetArguments,
    /// Block sizes (default: 512B to 4MiB, doubling).
    #[arg(long, value_delimiter = ',', value_parser = units::parse_size)]
    block_sizes: Option<Vec<u64>>,
    /// Thread counts.
    #[arg(long, value_delimiter = ',', default_value = "1,10,40")]
    threads: Vec<usize>,
    /// Requests in flight per thread.
    #[arg(long, default_value_t = 1)]
    queue_depth: usize,
    /// Time per cell.
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    duration: Duration,
    /// Only random reads: never write to the target.
    #[arg(long)]
    read_only: bool,
    /// Do not fill the region sequentially before the cells.
    #[arg(long)]
    no_fill: bool,
}

pub fn grid(arguments: GridArguments) -> Result<ExitCode, String> {
    let data = arguments.target.data()?;
    let block_sizes_bytes = match &arguments.block_sizes {
        Some(sizes) => sizes.iter().map(|&bytes| block_size(bytes)).collect::<Result<Vec<_>, _>>()?,
        None => stripelog_bench::grid::default_block_sizes(),
    };
    let target = arguments.target.open(!arguments.read_only)?;
    let region_bytes = arguments.target.region.unwrap_or(4 << 30);
    if arguments.target.offset != 0 {
        return Err("grid: --offset is not supported (the region starts at 0)".into());
    }
    let options = stripelog_bench::grid::Options {
        block_sizes_bytes,
        thread_counts: arguments.threads.clone(),
        queue_depth: arguments.queue_depth,
        cell_duration: arguments.duration,
        region_bytes,
        data,
        fill: !arguments.no_fill,
        seed: arguments.target.seed,
    };
    let report = with_progress(arguments.target.quiet, |progress| {
        stripelog_bench::grid::run(target.as_ref(), &options, &|cell, done| progress(Some(cell), done))
    })?;
    println!("target: {}", report.target);
    println!(
        "region {}, {} s per cell, queue depth {} per thread, {} data{}",
        stripelog_bench::format_size(options.region_bytes),
        options.cell_duration.as_secs_f64(),
        options.queue_depth,
        match options.data {
            Data::Random => "random".to_string(),
            Data::Zero => "zero".to_string(),
            Data::Compressible(percent) => format!("{percent} % compressible"),
        },
        report
            .fill_bytes_per_second
            .map(|rate| format!("; sequential fill {:.0} MB/s", rate / 1e6))
            .unwrap_or_default()
    );
    print!("{}", stripelog_bench::grid::table(&report));
    crate::write_json_file(arguments.target.json.as_deref(), &report)?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct LatencyArguments {
    #[command(flatten)]
    target: TargetArguments,
    /// Queue depths (default: 1, 2, 4, ... 64).
    #[arg(long, value_delimiter = ',')]
    queue_depths: Option<Vec<usize>>,
    /// Share of requests that read.
    #[arg(long, default_value_t = 70)]
    read_percent: u32,
    /// Request sizes, mixed evenly.
    #[arg(long, default_value = "4KiB,8KiB", value_delimiter = ',', value_parser = units::parse_size)]
    block_size: Vec<u64>,
    /// Time per queue depth (the average maximum needs at least one 10 s interval).
    #[arg(long, default_value = "20s", value_parser = units::parse_duration)]
    duration: Duration,
    /// Chart of mean and average-maximum response time against queue depth (.svg or .png).
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    chart: Option<PathBuf>,
    /// What every write waits for: nothing, its own durability (FUA: the NBD flag,
    /// RWF_DSYNC on a file), or a flush once it has completed (fio's --fsync=1).
    #[arg(long, default_value = "none", value_parser = ["none", "fua", "flush"])]
    durability: String,
}

pub fn latency(arguments: LatencyArguments) -> Result<ExitCode, String> {
    let data = arguments.target.data()?;
    let block_sizes_bytes =
        arguments.block_size.iter().map(|&bytes| block_size(bytes)).collect::<Result<Vec<_>, _>>()?;
    if arguments.target.offset != 0 {
        return Err("latency: --offset is not supported (the region starts at 0)".into());
    }
    if let Some(path) = &arguments.chart {
        stripelog_bench::chart::check(path)?;
    }
    let target = arguments.target.open(arguments.read_percent < 100)?;
    let options = stripelog_bench::latency::Options {
        queue_depths: arguments.queue_depths.clone().unwrap_or_else(stripelog_bench::latency::default_queue_depths),
        read_percent: arguments.read_percent,
        block_sizes_bytes,
        duration_per_depth: arguments.duration,
        region_bytes: arguments.target.region.unwrap_or_else(|| target.size_bytes()),
        data,
        durability: arguments.durability.parse()?,
        seed: arguments.target.seed,
    };
    let report = with_progress(arguments.target.quiet, |progress| {
        stripelog_bench::latency::run(target.as_ref(), &options, &|step, done| progress(Some(step), done))
    })?;
    println!("target: {}", report.target);
    println!(
        "{} % reads, {} blocks, random over {}, {} s per depth, writes wait for {}; response times in µs",
        options.read_percent,
        options
            .block_sizes_bytes
            .iter()
            .map(|&size| stripelog_bench::format_size(size as u64))
            .collect::<Vec<_>>()
            .join("/"),
        stripelog_bench::format_size(options.region_bytes),
        options.duration_per_depth.as_secs_f64(),
        match options.durability {
            stripelog_bench::target::Durability::None => "nothing",
            stripelog_bench::target::Durability::Fua => "their own durability (FUA)",
            stripelog_bench::target::Durability::Flush => "a flush after them",
        }
    );
    println!(
        "{:>6} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "depth", "IOPS", "mean", "p50", "p99", "p99.9", "max", "avg-max"
    );
    for point in &report.points {
        println!(
            "{:>6} {:>11.0} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
            point.queue_depth,
            point.iops,
            microseconds(point.mean_ns),
            microseconds(point.p50_ns as f64),
            microseconds(point.p99_ns as f64),
            microseconds(point.p99_9_ns as f64),
            microseconds(point.max_ns as f64),
            microseconds(point.average_maximum_ns)
        );
    }
    if let Some(path) = &arguments.chart {
        stripelog_bench::latency::chart(&report, path)?;
    }
    crate::write_json_file(arguments.target.json.as_deref(), &report)?;
    Ok(ExitCode::SUCCESS)
}

/// `stripelog bench saturate TARGET` (its flags live with the volume form in main.rs).
pub struct SaturateTarget {
    pub target: String,
    pub size: Option<u64>,
    pub force: bool,
    pub threads: usize,
    pub queue_depth: usize,
    pub precondition: bool,
    pub steady_state: bool,
    pub passes: f64,
    pub time_limit: Duration,
    pub round: Duration,
    pub seed: u64,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    pub chart: Option<PathBuf>,
    pub quiet: bool,
}

pub fn saturate_target(arguments: &SaturateTarget) -> Result<ExitCode, String> {
    if !(arguments.passes > 0.0 && arguments.passes.is_finite()) {
        return Err("--passes must be above zero".into());
    }
    if let Some(path) = &arguments.chart {
        stripelog_bench::chart::check(path)?;
    }
    let options =
        TargetOptions { writes: true, force: arguments.force, create_size_bytes: arguments.size, ..Default::default() };
    let target = target::open(&arguments.target, &options)?;
    let options = stripelog_bench::saturation::Options {
        precondition: arguments.precondition,
        threads: arguments.threads,
        queue_depth: arguments.queue_depth,
        write_limit_bytes: (target.size_bytes() as f64 * arguments.passes) as u64,
        duration_limit: arguments.time_limit,
        round: arguments.round,
        stop_at_steady_state: arguments.steady_state,
        data: Data::Random,
        seed: arguments.seed,
    };
    let report = with_progress(arguments.quiet, |progress| {
        stripelog_bench::saturation::run(target.as_ref(), &options, &|step, done| progress(Some(step), done))
    })?;
    println!("target: {} ({})", report.target, stripelog_bench::format_size(report.size_bytes));
    if let Some(fill) = &report.preconditioning {
        println!(
            "preconditioning: {} written sequentially in {:.1} s ({:.0} MB/s)",
            stripelog_bench::format_size(fill.bytes_written),
            fill.seconds,
            fill.bw_bytes / 1e6
        );
    }
    println!(
        "4 KiB random writes, {} thread(s) × depth {}: {:.2} GiB in {:.1} s, stopped by the {}",
        report.threads,
        report.queue_depth,
        report.bytes_written as f64 / (1u64 << 30) as f64,
        report.seconds,
        report.stopped_by
    );
    println!("{:>9} {:>10} {:>12}", "seconds", "IOPS", "GiB written");
    let per_round = report.round_seconds as usize;
    for (round, iops) in report.iops_per_round.iter().enumerate() {
        let written = report.bytes_written_by_second.get((round + 1) * per_round - 1).copied().unwrap_or(0);
        let span = stripelog_bench::saturation::span_label((round * per_round) as f64, per_round as f64);
        println!("{span:>9} {iops:>10.0} {:>12.2}", written as f64 / (1u64 << 30) as f64);
    }
    match &report.steady_state {
        Some(steady) => println!("{}", steady.describe((steady.first_interval * per_round) as f64)),
        None => println!("no steady state by the SNIA rule"),
    }
    println!(
        "overall {:.0} IOPS; latency mean {} µs, p99 {} µs, max {} µs, average maximum {} µs",
        report.write.iops,
        microseconds(report.write.lat_ns.mean),
        microseconds(report.write.lat_ns.percentile.get("99.000000").copied().unwrap_or(0) as f64),
        microseconds(report.write.lat_ns.max as f64),
        microseconds(report.write.lat_ns.average_maximum)
    );
    crate::write_json_file(arguments.json.as_deref(), &report)?;
    if let Some(path) = &arguments.csv {
        let mut text = String::from("second,iops,bytes_written\n");
        let rows = report.seconds_at_end.iter().zip(&report.iops_per_second).zip(&report.bytes_written_by_second);
        for ((end, iops), written) in rows {
            text.push_str(&format!("{end},{iops:.0},{written}\n"));
        }
        std::fs::write(path, text).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    if let Some(path) = &arguments.chart {
        stripelog_bench::saturation::chart(&report, path)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The member files of a benchmark that creates stripelog volumes on them (`compare`,
/// `slow-member`), and the volume's shape.
#[derive(Args)]
pub struct ArrayArguments {
    /// The member files or devices (written over by the benchmark).
    #[arg(long, value_delimiter = ',', required = true)]
    members: Vec<PathBuf>,
    /// Create missing member files of this size (sparse).
    #[arg(long, value_parser = units::parse_size)]
    member_size: Option<u64>,
    /// Allow writing over members that exist and are not empty.
    #[arg(long)]
    force: bool,
    #[arg(long, default_value = "5")]
    raid: String,
    #[arg(long, default_value = "1MiB", value_parser = units::parse_size)]
    chunk: u64,
    /// Spare fraction of the volume's data capacity.
    #[arg(long, default_value = "27%", value_parser = units::parse_fraction_ppm)]
    spare: u32,
}

#[derive(Args)]
pub struct CompareArguments {
    #[command(flatten)]
    array: ArrayArguments,
    /// An NBD server to compare with, by URI (e.g. nbdkit memory on a Unix socket).
    #[arg(long, value_name = "URI")]
    peer: Option<String>,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 32)]
    queue_depth: usize,
    /// Time per cell.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    duration: Duration,
    /// Bytes of each target used (at most its size).
    #[arg(long, default_value = "4GiB", value_parser = units::parse_size)]
    region: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

pub fn compare(arguments: CompareArguments) -> Result<ExitCode, String> {
    let array = &arguments.array;
    let options = stripelog_bench::compare::Options {
        members: array.members.clone(),
        member_size_bytes: array.member_size,
        force: array.force,
        peer: arguments.peer.clone(),
        raid_level: crate::parse_raid(&array.raid)?,
        chunk_size_bytes: crate::chunk_size(array.chunk)?,
        spare_ppm: array.spare,
        threads: arguments.threads,
        queue_depth: arguments.queue_depth,
        duration: arguments.duration,
        region_bytes: arguments.region,
        seed: arguments.seed,
    };
    if options.threads == 0 || options.queue_depth == 0 {
        return Err("threads and queue depth must be at least 1".into());
    }
    let report = with_progress(arguments.quiet, |progress| {
        stripelog_bench::compare::run(&options, &|step, done| progress(Some(step), done))
    })?;
    print!("{}", stripelog_bench::compare::table(&report));
    for column in &report.columns {
        println!(
            "  {}: {} ({:.0} MiB used)",
            column.name,
            column.target,
            column.region_bytes as f64 / (1u64 << 20) as f64
        );
    }
    crate::write_json_file(arguments.json.as_deref(), &report)?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct SlowMemberArguments {
    #[command(flatten)]
    array: ArrayArguments,
    /// Which member (index in --members) gets the latency spikes.
    #[arg(long, default_value_t = 0)]
    slow_member: usize,
    /// How late a spiked read or write completes.
    #[arg(long, default_value = "20ms", value_parser = units::parse_duration)]
    spike_latency: Duration,
    /// Fraction of the slow member's reads and writes that spike.
    #[arg(long, default_value = "10%", value_parser = units::parse_fraction_ppm)]
    spike_fraction: u32,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 16)]
    queue_depth: usize,
    /// Time per random cell.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    duration: Duration,
    /// Logical bytes written sequentially, then used by the random cells.
    #[arg(long, default_value = "2GiB", value_parser = units::parse_size)]
    region: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

pub fn slow_member(arguments: SlowMemberArguments) -> Result<ExitCode, String> {
    let array = &arguments.array;
    let options = stripelog_bench::slow_member::Options {
        members: array.members.clone(),
        member_size_bytes: array.member_size,
        force: array.force,
        raid_level: crate::parse_raid(&array.raid)?,
        chunk_size_bytes: crate::chunk_size(array.chunk)?,
        spare_ppm: array.spare,
        slow_member: arguments.slow_member,
        spike_latency: arguments.spike_latency,
        spike_parts_per_million: arguments.spike_fraction as u64,
        threads: arguments.threads,
        queue_depth: arguments.queue_depth,
        duration: arguments.duration,
        region_bytes: arguments.region,
        seed: arguments.seed,
    };
    if options.threads == 0 || options.queue_depth == 0 {
        return Err("threads and queue depth must be at least 1".into());
    }
    let report = with_progress(arguments.quiet, |progress| {
        stripelog_bench::slow_member::run(&options, &|step, done| progress(Some(step), done))
    })?;
    print!("{}", stripelog_bench::slow_member::table(&report));
    crate::write_json_file(arguments.json.as_deref(), &report)?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct CompressibilityArguments {
    /// Files or block devices to read (only read, never written).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Write the reports as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

pub fn compressibility(arguments: CompressibilityArguments) -> Result<ExitCode, String> {
    let mut reports = Vec::new();
    for path in &arguments.paths {
        // Only for the progress bar.
        let total_bytes = input_size_bytes(path).unwrap_or(0).max(1);
        let report = with_progress(arguments.quiet, |progress| {
            let step = path.display().to_string();
            stripelog_bench::compressibility::estimate(path, &|read_bytes| {
                progress(Some(&step), (read_bytes as f64 / total_bytes as f64).min(1.0))
            })
        })?;
        reports.push(report);
    }
    print!("{}", stripelog_bench::compressibility::table(&reports));
    crate::write_json_file(arguments.json.as_deref(), &reports)?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct DedupabilityArguments {
    /// Files, block devices or pipes to read in order, as if written one after another
    /// into one volume (only read, never written).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Data capacity of the volume the sparse index is sized for (default: the inputs'
    /// total size; required when an input is a pipe).
    #[arg(long, value_parser = units::parse_size)]
    capacity: Option<u64>,
    /// One name in 2^bits is a hook kept in the sparse index.
    #[arg(long, default_value_t = stripelog_engine::index::names::DEFAULT_SAMPLING_BITS)]
    sampling_bits: u32,
    /// Write the reports as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

pub fn dedupability(arguments: DedupabilityArguments) -> Result<ExitCode, String> {
    if arguments.sampling_bits > 16 {
        return Err("--sampling-bits: at most 16 (one name in 65 536)".into());
    }
    let sizes: Vec<Option<u64>> = arguments.paths.iter().map(|path| input_size_bytes(path)).collect();
    let capacity_bytes = match arguments.capacity {
        Some(capacity) => capacity,
        None => match sizes.iter().copied().collect::<Option<Vec<u64>>>() {
            Some(sizes) => sizes.iter().sum(),
            None => return Err("an input is a pipe or cannot be sized: give --capacity".into()),
        },
    };
    let capacity_blocks = capacity_bytes / stripelog_engine::BLOCK_SIZE_BYTES as u64;
    if capacity_blocks == 0 {
        return Err("--capacity: less than one block".into());
    }
    let mut finder = stripelog_bench::dedupability::Finder::new(capacity_blocks, arguments.sampling_bits);
    let mut reports = Vec::new();
    for (path, size) in arguments.paths.iter().zip(&sizes) {
        let total_bytes = size.unwrap_or(0).max(1);
        let report = with_progress(arguments.quiet, |progress| {
            let step = path.display().to_string();
            finder.read(path, &|read_bytes| progress(Some(&step), (read_bytes as f64 / total_bytes as f64).min(1.0)))
        })?;
        reports.push(report);
    }
    print!("{}", stripelog_bench::dedupability::table(&reports));
    if let Some(last) = reports.last() {
        println!(
            "found {:.1} % of exact deduplication's duplicates (run {}, recent {}, sparse {}; {} wrong candidates); \
             index {:.1} MiB, {:.2} bytes per physical block of {} GiB; naming {:.3} s/GiB",
            last.found_share * 100.0,
            last.found_by_run,
            last.found_by_recent,
            last.found_by_sparse,
            last.candidates_wrong,
            last.index_bytes as f64 / (1u64 << 20) as f64,
            last.index_bytes_per_physical_block,
            capacity_bytes >> 30,
            last.name_seconds_per_gib
        );
    }
    crate::write_json_file(arguments.json.as_deref(), &reports)?;
    Ok(ExitCode::SUCCESS)
}

/// The size of a benchmark's input file or block device (seeking to the end sizes block
/// devices too, whose metadata says 0); `None` for a pipe or anything else, which is not
/// opened here (opening a pipe would wait for its writer).
fn input_size_bytes(path: &std::path::Path) -> Option<u64> {
    let file_type = std::fs::metadata(path).ok()?.file_type();
    if !file_type.is_file() && !std::os::unix::fs::FileTypeExt::is_block_device(&file_type) {
        return None;
    }
    std::fs::File::open(path).and_then(|mut file| std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0))).ok()
}

/// `stripelog bench suite`: which members, which parts, how long.
#[derive(Args)]
pub struct SuiteArguments {
    /// Where report.json, report.md, the charts and the children's logs (work/) go.
    #[arg(long, default_value = "stripelog-suite")]
    output: PathBuf,
    /// Parts to run, comma-separated, in this order (default: all): fresh, steady, reads,
    /// nbd, nbd-multi, sync, rebuild, check, compression, dedup, cores.
    #[arg(long, value_delimiter = ',', value_parser = stripelog_bench::suite::Part::parse)]
    parts: Vec<stripelog_bench::suite::Part>,
    /// Member files: this many files in --dir (plus a spare for the rebuild).
    #[arg(long, default_value_t = 5)]
    members: usize,
    /// Directory for the member files (created; they are removed afterwards).
    #[arg(long, default_value = "stripelog-suite-members", conflicts_with_all = ["devices", "testbed"])]
    dir: PathBuf,
    /// Size of each member file, or of each testbed drive.
    #[arg(long, default_value = "2GiB", value_parser = units::parse_size)]
    member_size: u64,
    /// Run on these files or block devices (comma-separated) instead of files in --dir.
    /// Their data is overwritten: one that holds data is refused unless --force.
    #[arg(long, value_name = "PATHS", value_delimiter = ',', conflicts_with = "testbed")]
    devices: Vec<PathBuf>,
    /// With --devices: a file or device beside them that the rebuild writes to and the
    /// durable-write peer (nbdkit file) uses.
    #[arg(long, value_name = "PATH", requires = "devices")]
    spare_device: Option<PathBuf>,
    /// Run on a testbed of independent drives: --members loop devices over files in
    /// /dev/shm (and one spare), each throttled through the blkio cgroup to the speeds
    /// below. Needs root and cgroup v1.
    #[arg(long)]
    testbed: bool,
    /// Testbed: each drive's sequential write bandwidth.
    #[arg(long, default_value = "100MiB", value_parser = units::parse_size)]
    drive_write: u64,
    /// Testbed: each drive's sequential read bandwidth.
    #[arg(long, default_value = "200MiB", value_parser = units::parse_size)]
    drive_read: u64,
    /// Testbed: each drive's reads per second (one I/O of any size counts one).
    #[arg(long, default_value_t = 5000)]
    drive_read_iops: u64,
    /// Testbed: each drive's writes per second.
    #[arg(long, default_value_t = 5000)]
    drive_write_iops: u64,
    /// Length of each measured cell.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    cell: Duration,
    /// Time limit of the steady-state part (its fill and the writes up to steady state).
    #[arg(long, default_value = "300s", value_parser = units::parse_duration)]
    steady_limit: Duration,
    /// The steady-state part's write queue: bytes of sealed batches in flight to the
    /// members (default: the engine's, 64MiB).
    #[arg(long, value_parser = units::parse_size)]
    steady_write_queue: Option<u64>,
    /// Write over members, drives' backing files and an output directory that hold data.
    #[arg(long)]
    force: bool,
    /// No progress lines.
    #[arg(long, short)]
    quiet: bool,
}

pub fn suite(arguments: SuiteArguments) -> Result<ExitCode, String> {
    use stripelog_bench::suite::{Members, Options, Part};
    let members = if arguments.testbed {
        Members::Testbed(stripelog_bench::testbed::Options {
            drive_count: arguments.members + 1,
            drive_size_bytes: arguments.member_size,
            speed: stripelog_bench::testbed::DriveSpeed {
                read_bytes_per_second: arguments.drive_read,
                write_bytes_per_second: arguments.drive_write,
                read_iops: arguments.drive_read_iops,
                write_iops: arguments.drive_write_iops,
            },
            directory: PathBuf::from("/dev/shm"),
            force: arguments.force,
        })
    } else if !arguments.devices.is_empty() {
        Members::Devices { paths: arguments.devices, spare: arguments.spare_device }
    } else {
        Members::Files { directory: arguments.dir, count: arguments.members }
    };
    let options = Options {
        stripelog: std::env::current_exe().map_err(|error| format!("this program's path: {error}"))?,
        members,
        member_size_bytes: arguments.member_size,
        parts: if arguments.parts.is_empty() { Part::ALL.to_vec() } else { arguments.parts },
        cell: arguments.cell,
        steady_limit: arguments.steady_limit,
        steady_write_queue_bytes: arguments.steady_write_queue,
        output: arguments.output,
        force: arguments.force,
    };
    let words: Vec<String> = std::env::args().collect();
    let quiet = arguments.quiet;
    let report = stripelog_bench::suite::run(&options, &stripelog_bench::suite::shell_words(&words), &|line| {
        if !quiet {
            eprintln!("{line}");
        }
    })?;
    for part in &report.parts {
        println!("{}: {}", part.part.name(), part.title);
        if let Some(error) = &part.error {
            println!("  FAILED: {error}");
        }
        for figure in &part.figures {
            let ratio = figure.ratio.map(|ratio| format!("  ratio {ratio:.3}")).unwrap_or_default();
            let verdict = figure
                .bar
                .as_ref()
                .map(|bar| {
                    format!("  ({} {}: {})", bar.direction, bar.threshold, if bar.met { "met" } else { "MISSED" })
                })
                .unwrap_or_default();
            println!("  {:<72} {:>12.1} {}{ratio}{verdict}", figure.name, figure.value, figure.unit);
        }
        println!("  limit: {}", part.limit);
    }
    println!("report: {}", options.output.join("report.md").display());
    let failed = report.failed_parts();
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "bench suite: {} part(s) failed: {}",
            failed.len(),
            failed.iter().map(|part| part.part.name()).collect::<Vec<_>>().join(", ")
        );
        Ok(ExitCode::FAILURE)
    }
}
