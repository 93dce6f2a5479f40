//! `stripelog bench slow-member`: what one slow member costs. The same workloads run on a
//! fresh stripelog volume four times: with no slow member, with and without the engine's
//! slow-member tolerance (hedged reads, per-member write queues), then with one member
//! wrapped in a `LatencySpikeDevice` (a fraction of its I/O delayed by a fixed time),
//! again without and with it. The block cache is off, so every read reaches a member.

use crate::run::{self, Data, Pattern, RunReport, Workload};
use crate::target::EngineTarget;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use stripelog_blockdev::LatencySpikeDevice;
use stripelog_engine::{CreateOptions, OpenOptions, RaidLevel, Volume};

const RANDOM_BLOCK_BYTES: usize = 4096;
const SEQUENTIAL_BLOCK_BYTES: usize = 1 << 20;
const SEQUENTIAL_QUEUE_DEPTH: usize = 4;

#[derive(Clone, Debug)]
pub struct Options {
    pub members: Vec<PathBuf>,
    /// Create missing member files of this size (sparse).
    pub member_size_bytes: Option<u64>,
    pub force: bool,
    pub raid_level: RaidLevel,
    pub chunk_size_bytes: u32,
    pub spare_ppm: u32,
    /// Index of the member given latency spikes.
    pub slow_member: usize,
    pub spike_latency: Duration,
    pub spike_parts_per_million: u64,
    pub threads: usize,
    pub queue_depth: usize,
    pub duration: Duration,
    /// Logical bytes written sequentially and then used by the random cells.
    pub region_bytes: u64,
    pub seed: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Column {
    pub name: String,
    pub slow_member: bool,
    pub hedged_reads: bool,
    pub write_queue_batches: usize,
    pub sequential_write_bytes_per_second: f64,
    pub random_write_iops: f64,
    pub random_read_iops: f64,
    pub read_mean_ns: f64,
    pub read_p50_ns: u64,
    pub read_p99_ns: u64,
    pub read_p999_ns: u64,
    /// Direct reads given up at the hedge deadline.
    pub late_reads: u64,
    pub reconstructed_blocks: u64,
    /// Reads and writes of the slow member, and how many of them spiked.
    pub slow_member_requests: u64,
    pub slow_member_spikes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub threads: usize,
    pub queue_depth: usize,
    pub duration_seconds: f64,
    pub region_bytes: u64,
    pub slow_member: String,
    pub spike_latency_ms: f64,
    pub spike_fraction: f64,
    pub columns: Vec<Column>,
}

/// One column's setting.
struct Setting {
    name: &'static str,
    slow_member: bool,
    tolerant: bool,
}

const SETTINGS: [Setting; 4] = [
    Setting { name: "healthy", slow_member: false, tolerant: true },
    Setting { name: "healthy, lock-step", slow_member: false, tolerant: false },
    Setting { name: "slow, lock-step", slow_member: true, tolerant: false },
    Setting { name: "slow, tolerant", slow_member: true, tolerant: true },
];

/// Fill (not reported), then the measured cells: random reads first (on the filled
/// volume, before any cleaning), random writes, sequential writes.
fn workloads(options: &Options) -> [Workload; 4] {
    let random = |read_percent| Workload {
        read_percent,
        block_sizes_bytes: vec![RANDOM_BLOCK_BYTES],
        pattern: Pattern::Random,
        zipf_exponent: None,
        region_offset_bytes: 0,
        region_bytes: options.region_bytes,
        data: Data::Random,
        threads: options.threads,
        queue_depth: options.queue_depth,
        duration: options.duration,
        write_limit_bytes: None,
        durability: Default::default(),
        seed: options.seed,
    };
    let sequential = Workload {
        block_sizes_bytes: vec![SEQUENTIAL_BLOCK_BYTES],
        pattern: Pattern::Sequential,
        threads: 1,
        queue_depth: SEQUENTIAL_QUEUE_DEPTH,
        ..random(0)
    };
    [
        Workload {
            duration: Duration::from_secs(24 * 3600),
            write_limit_bytes: Some(options.region_bytes),
            durability: Default::default(),
            ..sequential.clone()
        },
        random(100),
        random(0),
        sequential,
    ]
}

fn percentile(report: &RunReport, key: &str) -> u64 {
    report.read.lat_ns.percentile.get(key).copied().unwrap_or(0)
}

fn measure_column(
    options: &Options,
    setting: &Setting,
    progress: &(dyn Fn(&str, f64) + Sync),
) -> Result<Column, String> {
    let mut members = crate::compare::open_member_devices(&options.members, options.member_size_bytes)?;
    let mut spiky = None;
    if setting.slow_member {
        let slow = &mut members[options.slow_member].device;
        let file = slow.take().expect("opened");
        let wrapped = Arc::new(LatencySpikeDevice::new(
            file,
            options.spike_latency,
            options.spike_parts_per_million,
            options.seed,
        ));
        *slow = Some(wrapped.clone());
        spiky = Some(wrapped);
    }
    let create = CreateOptions {
        raid_level: options.raid_level,
        chunk_size_bytes: options.chunk_size_bytes,
        spare_ppm: options.spare_ppm,
        volume_uuid: None,
        // Each run creates a fresh volume over the last one: `--force` was checked once.
        force: true,
        compression: Default::default(),
        logical_size_bytes: None,
        deduplication: false,
        client_write_pairs: true,
    };
    let open = OpenOptions {
        cache_size_bytes: 0,
        hedged_reads: setting.tolerant,
        write_queue_bytes: if setting.tolerant { OpenOptions::default().write_queue_bytes } else { 0 },
        ..OpenOptions::default()
    };
    let volume =
        Arc::new(Volume::create(members, &create, &open).map_err(|error| format!("creating the volume: {error}"))?);
    if options.region_bytes > volume.logical_size_bytes() || options.region_bytes < SEQUENTIAL_BLOCK_BYTES as u64 {
        return Err(format!("the region must be between 1 MiB and the volume's {} bytes", volume.logical_size_bytes()));
    }
    let label = options.members.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(",");
    let target = EngineTarget::from_volume(volume.clone(), label);
    let [fill, read, write, sequential] = workloads(options);
    let step = |label: &'static str, part: f64| {
        move |done: f64| progress(&format!("{}: {label}", setting.name), part + done / 4.0)
    };
    run::run(&target, &fill, &step("fill", 0.0))?;
    let read = run::run(&target, &read, &step("random reads", 1.0 / 4.0))?;
    let written = run::run(&target, &write, &step("random writes", 2.0 / 4.0))?;
    let sequential = run::run(&target, &sequential, &step("sequential writes", 3.0 / 4.0))?;
    let stats = volume.stats();
    drop(target);
    crate::compare::close_volume(volume)?;
    let (slow_member_requests, slow_member_spikes) = spiky.map_or((0, 0), |device| device.requests_and_spikes());
    Ok(Column {
        name: setting.name.to_string(),
        slow_member: setting.slow_member,
        hedged_reads: setting.tolerant,
        write_queue_batches: stats.write_queue_batches,
        sequential_write_bytes_per_second: sequential.write.bw_bytes,
        random_write_iops: written.write.iops,
        random_read_iops: read.read.iops,
        read_mean_ns: read.read.lat_ns.mean,
        read_p50_ns: percentile(&read, "50.000000"),
        read_p99_ns: percentile(&read, "99.000000"),
        read_p999_ns: percentile(&read, "99.900000"),
        late_reads: stats.late_reads,
        reconstructed_blocks: stats.reconstructed_blocks,
        slow_member_requests,
        slow_member_spikes,
    })
}

pub fn run(options: &Options, progress: &(dyn Fn(&str, f64) + Sync)) -> Result<Report, String> {
    if options.members.len() < 2 {
        return Err("name at least two member files (--members A,B,...)".into());
    }
    if options.slow_member >= options.members.len() {
        return Err(format!(
            "--slow-member {} is not one of the {} members",
            options.slow_member,
            options.members.len()
        ));
    }
    if !options.region_bytes.is_multiple_of(SEQUENTIAL_BLOCK_BYTES as u64) {
        return Err("the region must be a multiple of 1 MiB".into());
    }
    // A fresh volume is created on the members: written over only with --force.
    let overwrite = crate::target::TargetOptions { writes: true, force: options.force, ..Default::default() };
    for path in &options.members {
        crate::target::check_overwrite(path, &overwrite)?;
    }
    let columns = SETTINGS
        .iter()
        .enumerate()
        .map(|(index, setting)| {
            let part = |label: &str, done: f64| progress(label, (index as f64 + done) / SETTINGS.len() as f64);
            measure_column(options, setting, &part)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Report {
        threads: options.threads,
        queue_depth: options.queue_depth,
        duration_seconds: options.duration.as_secs_f64(),
        region_bytes: options.region_bytes,
        slow_member: options.members[options.slow_member].display().to_string(),
        spike_latency_ms: options.spike_latency.as_secs_f64() * 1e3,
        spike_fraction: options.spike_parts_per_million as f64 / 1e6,
        columns,
    })
}

/// The side-by-side table, with the slow runs as ratios of the healthy one.
pub fn table(report: &Report) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "one slow member ({}): {:.0} ms spikes on {:.1} % of its I/O; 4 KiB random cells {} thread(s) × depth {}, {:.0} s each, over {:.0} MiB; cache off",
        report.slow_member,
        report.spike_latency_ms,
        report.spike_fraction * 100.0,
        report.threads,
        report.queue_depth,
        report.duration_seconds,
        report.region_bytes as f64 / (1u64 << 20) as f64
    );
    type Pick = fn(&Column) -> String;
    let rows: [(&str, Pick); 12] = [
        ("hedged reads", |column| if column.hedged_reads { "on".into() } else { "off".into() }),
        ("write queue (batches)", |column| column.write_queue_batches.to_string()),
        ("random read IOPS", |column| format!("{:.0}", column.random_read_iops)),
        ("  mean µs", |column| format!("{:.0}", column.read_mean_ns / 1e3)),
        ("  p50 µs", |column| format!("{:.0}", column.read_p50_ns as f64 / 1e3)),
        ("  p99 µs", |column| format!("{:.0}", column.read_p99_ns as f64 / 1e3)),
        ("  p99.9 µs", |column| format!("{:.0}", column.read_p999_ns as f64 / 1e3)),
        ("random write IOPS", |column| format!("{:.0}", column.random_write_iops)),
        ("sequential write MB/s (1 MiB)", |column| format!("{:.0}", column.sequential_write_bytes_per_second / 1e6)),
        ("late reads hedged", |column| column.late_reads.to_string()),
        ("blocks reconstructed", |column| column.reconstructed_blocks.to_string()),
        ("slow member I/O spiked", |column| {
            if column.slow_member {
                format!("{}/{}", column.slow_member_spikes, column.slow_member_requests)
            } else {
                "-".into()
            }
        }),
    ];
    let names: Vec<&str> = report.columns.iter().map(|column| column.name.as_str()).collect();
    let cells: Vec<(&str, Vec<String>)> =
        rows.iter().map(|(label, pick)| (*label, report.columns.iter().map(pick).collect())).collect();
    crate::side_by_side::append(&mut text, 30, &names, &cells);
    let healthy = &report.columns[0];
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    for column in report.columns.iter().filter(|column| column.slow_member) {
        let _ = writeln!(
            text,
            "{} ÷ healthy: random read {:.2}, read p99 ×{:.1}, random write {:.2}, sequential write {:.2}",
            column.name,
            ratio(column.random_read_iops, healthy.random_read_iops),
            ratio(column.read_p99_ns as f64, healthy.read_p99_ns as f64),
            ratio(column.random_write_iops, healthy.random_write_iops),
            ratio(column.sequential_write_bytes_per_second, healthy.sequential_write_bytes_per_second)
        );
    }
    text
}
