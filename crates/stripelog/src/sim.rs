//! `stripelog sim overprovisioning|lame-raid|wear`: the seeds' flash experiments on the
//! flash drive model (docs/experiments.md). Each prints a table and writes its report as
//! JSON and a chart; the default scale finishes within two minutes, `--full` runs larger.

use crate::units;
use clap::Args;
use std::path::PathBuf;

/// Where an experiment writes its report and chart.
#[derive(Args)]
pub(crate) struct SimOutput {
    /// The report as JSON (default: sim-NAME.json).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The chart, .svg or .png (default: sim-NAME.svg).
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    chart: Option<PathBuf>,
    /// Larger drives and longer runs (minutes rather than seconds).
    #[arg(long)]
    full: bool,
}

impl SimOutput {
    fn paths(&self, name: &str) -> Result<(PathBuf, PathBuf), String> {
        let json = self.json.clone().unwrap_or_else(|| PathBuf::from(format!("sim-{name}.json")));
        let chart = self.chart.clone().unwrap_or_else(|| PathBuf::from(format!("sim-{name}.svg")));
        stripelog_bench::chart::check(&chart)?;
        Ok((json, chart))
    }
}

fn finish<T: serde::Serialize>(
    report: &T,
    table: String,
    json: &std::path::Path,
    chart: &std::path::Path,
    draw: impl FnOnce(&T, &std::path::Path) -> Result<(), String>,
) -> Result<(), String> {
    print!("{table}");
    crate::write_json_file(Some(json), report)?;
    draw(report, chart)?;
    println!("report: {}  chart: {}", json.display(), chart.display());
    Ok(())
}

#[derive(Args)]
pub(crate) struct OverprovisioningArguments {
    /// Drive preset: consumer-mlc, enterprise-emlc, barefoot, sandforce-1200.
    #[arg(long, default_value = "consumer-mlc")]
    drive: String,
    /// User capacity of the simulated drive (default 1GiB; 8GiB with --full).
    #[arg(long, value_parser = units::parse_size)]
    drive_size: Option<u64>,
    /// Total spare of the second run, of the raw NAND (seed 004: 96 GB of 256 GB).
    #[arg(long, default_value = "37.5%", value_parser = units::parse_fraction_ppm)]
    raised_spare: u32,
    /// Virtual seconds of writing (default 600; 7200, the seed's two hours, with --full).
    #[arg(long)]
    seconds: Option<u64>,
    #[arg(long, default_value_t = 32)]
    queue_depth: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    output: SimOutput,
}

pub(crate) fn overprovisioning(arguments: OverprovisioningArguments) -> Result<(), String> {
    let (json, chart) = arguments.output.paths("overprovisioning")?;
    let full = arguments.output.full;
    let options = stripelog_bench::flash::overprovisioning::Options {
        drive: arguments.drive,
        drive_size_bytes: arguments.drive_size.unwrap_or(if full { 8 << 30 } else { 1 << 30 }),
        raised_spare_fraction: arguments.raised_spare as f64 / 1e6,
        queue_depth: arguments.queue_depth,
        virtual_seconds: arguments.seconds.unwrap_or(if full { 7200 } else { 600 }),
        seed: arguments.seed,
    };
    let bar = crate::spinner("simulating both drives");
    let report = stripelog_bench::flash::overprovisioning::run(&options);
    bar.finish_and_clear();
    let report = report?;
    let table = stripelog_bench::flash::overprovisioning::table(&report);
    finish(&report, table, &json, &chart, stripelog_bench::flash::overprovisioning::chart)
}

#[derive(Args)]
pub(crate) struct LameRaidArguments {
    /// Drive preset: consumer-mlc, enterprise-emlc, barefoot, sandforce-1200.
    #[arg(long, default_value = "consumer-mlc")]
    drive: String,
    #[arg(long, default_value_t = 6)]
    drives: usize,
    /// User capacity of each simulated drive (default 256MiB; 1GiB with --full).
    #[arg(long, value_parser = units::parse_size)]
    drive_size: Option<u64>,
    /// Chunk written to one drive per stripe (md's default).
    #[arg(long, default_value = "512KiB", value_parser = units::parse_size)]
    chunk: u64,
    /// Share of each drive written by every writer.
    #[arg(long, default_value = "25%", value_parser = units::parse_fraction_ppm)]
    written: u32,
    /// Random overwrites of each drive before the run, in drive capacities.
    #[arg(long, default_value_t = 1.0)]
    precondition_passes: f64,
    /// Real seconds per virtual second: more than 1 runs the drives slower than modelled,
    /// should the host's CPU not keep up with them (it does at the default drives' speed).
    #[arg(long, default_value_t = 1.0)]
    slowdown: f64,
    /// Blocks per parallel unit each garbage-collection burst frees beyond the reserve: a
    /// low-end controller's long pauses (the preset's own burst with 0).
    #[arg(long, default_value_t = 16)]
    gc_burst: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    output: SimOutput,
}

pub(crate) fn lame_raid(arguments: LameRaidArguments) -> Result<(), String> {
    let (json, chart) = arguments.output.paths("lame-raid")?;
    let chunk_size_bytes = crate::chunk_size(arguments.chunk)? as u64;
    if !(0.5..=1000.0).contains(&arguments.slowdown) {
        return Err("--slowdown must be between 0.5 and 1000".into());
    }
    let options = stripelog_bench::flash::lame_raid::Options {
        drive: arguments.drive,
        drives: arguments.drives,
        drive_size_bytes: arguments.drive_size.unwrap_or(if arguments.output.full { 1 << 30 } else { 256 << 20 }),
        chunk_size_bytes,
        written_share: arguments.written as f64 / 1e6,
        precondition_passes: arguments.precondition_passes,
        real_seconds_per_virtual_second: arguments.slowdown,
        gc_burst_blocks: (arguments.gc_burst > 0).then_some(arguments.gc_burst),
        seed: arguments.seed,
    };
    let bar = crate::spinner("preconditioning");
    let report = stripelog_bench::flash::lame_raid::run(&options, &|step| bar.set_message(step.to_string()));
    bar.finish_and_clear();
    let report = report?;
    let table = stripelog_bench::flash::lame_raid::table(&report);
    finish(&report, table, &json, &chart, stripelog_bench::flash::lame_raid::chart)
}

#[derive(Args)]
pub(crate) struct WearArguments {
    /// Drive presets, comma-separated.
    #[arg(long, default_value = "consumer-mlc,enterprise-emlc", value_delimiter = ',')]
    drives: Vec<String>,
    #[arg(long, default_value_t = 8)]
    drive_count: usize,
    /// User capacity of each simulated drive (default 256MiB; 1GiB with --full).
    #[arg(long, value_parser = units::parse_size)]
    drive_size: Option<u64>,
    /// md's chunk.
    #[arg(long, default_value = "64KiB", value_parser = units::parse_size)]
    md_chunk: u64,
    /// stripelog's chunk (a multiple of the drives' erase block).
    #[arg(long, default_value = "1MiB", value_parser = units::parse_size)]
    chunk: u64,
    /// stripelog's spare fraction of its data capacity (default: what gives it the
    /// addressable space of RAID-10 on the same drives, as seed 000 section 10 compares, and
    /// at least 10 %).
    #[arg(long, value_parser = units::parse_fraction_ppm)]
    spare: Option<u32>,
    /// Random overwrites before measuring, in multiples of each array's addressable space
    /// (default 1; 3 with --full).
    #[arg(long)]
    warm_passes: Option<f64>,
    /// Random overwrites measured (default 1; 2 with --full).
    #[arg(long)]
    measured_passes: Option<f64>,
    /// Life projection: the size of the real drives.
    #[arg(long, default_value = "256GB", value_parser = units::parse_size)]
    nominal_drive_size: u64,
    /// Life projection: host writes a day (seed 000 section 10: 2 TB).
    #[arg(long, default_value = "2TB", value_parser = units::parse_size)]
    daily_writes: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    output: SimOutput,
}

pub(crate) fn wear(arguments: WearArguments) -> Result<(), String> {
    let (json, chart) = arguments.output.paths("wear")?;
    let full = arguments.output.full;
    let options = stripelog_bench::flash::wear::Options {
        drive_presets: arguments.drives,
        drives: arguments.drive_count,
        drive_size_bytes: arguments.drive_size.unwrap_or(if full { 1 << 30 } else { 256 << 20 }),
        md_chunk_size_bytes: arguments.md_chunk,
        stripelog_chunk_size_bytes: crate::chunk_size(arguments.chunk)?,
        stripelog_spare_fraction: arguments.spare.map(|ppm| ppm as f64 / 1e6),
        warm_passes: arguments.warm_passes.unwrap_or(if full { 3.0 } else { 1.0 }),
        measured_passes: arguments.measured_passes.unwrap_or(if full { 2.0 } else { 1.0 }),
        nominal_drive_size_bytes: arguments.nominal_drive_size as f64,
        daily_write_bytes: arguments.daily_writes as f64,
        seed: arguments.seed,
    };
    let bar = crate::spinner("starting");
    let report = stripelog_bench::flash::wear::run(&options, &|step, _| bar.set_message(step.to_string()));
    bar.finish_and_clear();
    let report = report?;
    let table = stripelog_bench::flash::wear::table(&report);
    finish(&report, table, &json, &chart, stripelog_bench::flash::wear::chart)
}
