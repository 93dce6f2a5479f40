//! `stripelog bench compare`: the same 4 KiB random-write and random-read cells against
//! the raw member files (all at once: the hardware's figure), stripelog RAID on those
//! members in process and over NBD (a server in this process on a Unix socket), and an
//! NBD peer given by URI (e.g. `nbdkit memory`). Every target is filled sequentially
//! first, so that reads read written data. One side-by-side table with ratios.

use crate::run::{self, Data, Pattern, RunReport, Workload};
use crate::target::{self, EngineTarget, Target, TargetOptions};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use stripelog_blockdev::{FileDevice, FileDeviceOptions};
use stripelog_engine::{CreateOptions, MemberDevice, OpenOptions, RaidLevel, Volume};

const CELL_BLOCK_BYTES: usize = 4096;
const FILL_BLOCK_BYTES: usize = 1 << 20;
const FILL_QUEUE_DEPTH: usize = 4;
/// The export name of the in-process server.
const EXPORT_NAME: &str = "stripelog";

#[derive(Clone, Debug)]
pub struct Options {
    pub members: Vec<PathBuf>,
    /// Create missing member files of this size.
    pub member_size_bytes: Option<u64>,
    pub force: bool,
    pub peer: Option<String>,
    pub raid_level: RaidLevel,
    pub chunk_size_bytes: u32,
    pub spare_ppm: u32,
    pub threads: usize,
    pub queue_depth: usize,
    pub duration: Duration,
    /// Bytes of each target used (at most its size).
    pub region_bytes: u64,
    pub seed: u64,
}

/// One cell's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Cell {
    pub iops: f64,
    pub mean_ns: f64,
    pub p99_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Column {
    pub name: String,
    pub target: String,
    pub region_bytes: u64,
    pub fill_bytes_per_second: f64,
    pub random_write: Cell,
    pub random_read: Cell,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub threads: usize,
    pub queue_depth: usize,
    pub duration_seconds: f64,
    pub columns: Vec<Column>,
}

fn cell(report: &RunReport, write: bool) -> Cell {
    let direction = if write { &report.write } else { &report.read };
    Cell {
        iops: direction.iops,
        mean_ns: direction.lat_ns.mean,
        p99_ns: direction.lat_ns.percentile.get("99.000000").copied().unwrap_or(0),
    }
}

/// The three runs of a column on one target: fill, random writes, random reads.
fn workloads(options: &Options, region_bytes: u64) -> [Workload; 3] {
    let fill_region = region_bytes / FILL_BLOCK_BYTES as u64 * FILL_BLOCK_BYTES as u64;
    let random = |read_percent| Workload {
        read_percent,
        block_sizes_bytes: vec![CELL_BLOCK_BYTES],
        pattern: Pattern::Random,
        zipf_exponent: None,
        region_offset_bytes: 0,
        region_bytes: region_bytes / CELL_BLOCK_BYTES as u64 * CELL_BLOCK_BYTES as u64,
        data: Data::Random,
        threads: options.threads,
        queue_depth: options.queue_depth,
        duration: options.duration,
        write_limit_bytes: None,
        durability: Default::default(),
        seed: options.seed,
    };
    [
        Workload {
            read_percent: 0,
            block_sizes_bytes: vec![FILL_BLOCK_BYTES],
            pattern: Pattern::Sequential,
            region_bytes: fill_region,
            threads: 1,
            queue_depth: FILL_QUEUE_DEPTH,
            duration: Duration::from_secs(24 * 3600),
            write_limit_bytes: Some(fill_region),
            durability: Default::default(),
            ..random(0)
        },
        random(0),
        random(100),
    ]
}

/// Fill, write and read on every target of `targets` at once (one column: the raw
/// members together); IOPS add up, latencies are the mean over the targets.
fn measure(
    name: &str,
    targets: &[Box<dyn Target>],
    options: &Options,
    progress: &(dyn Fn(&str, f64) + Sync),
) -> Result<Column, String> {
    let region_bytes = targets.iter().map(|target| target.size_bytes()).min().unwrap_or(0).min(options.region_bytes);
    if region_bytes < FILL_BLOCK_BYTES as u64 {
        return Err(format!("{name}: smaller than 1 MiB"));
    }
    let [fill, write, read] = workloads(options, region_bytes);
    let runs: Vec<Result<[RunReport; 3], String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .enumerate()
            .map(|(index, target)| {
                let (fill, write, read) = (&fill, &write, &read);
                scope.spawn(move || {
                    // Only the first target reports progress (they run side by side).
                    let step = |label: String, part: f64| {
                        move |done: f64| {
                            if index == 0 {
                                progress(&label, part + done / 3.0)
                            }
                        }
                    };
                    let filled = run::run(target.as_ref(), fill, &step(format!("{name}: sequential fill"), 0.0))?;
                    let written = run::run(target.as_ref(), write, &step(format!("{name}: random writes"), 1.0 / 3.0))?;
                    let read = run::run(target.as_ref(), read, &step(format!("{name}: random reads"), 2.0 / 3.0))?;
                    Ok([filled, written, read])
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap_or_else(|_| Err("a run panicked".into()))).collect()
    });
    let reports: Vec<[RunReport; 3]> = runs.into_iter().collect::<Result<_, _>>()?;
    let count = reports.len() as f64;
    let sum_cell = |pick: &dyn Fn(&[RunReport; 3]) -> Cell| {
        let cells: Vec<Cell> = reports.iter().map(pick).collect();
        Cell {
            iops: cells.iter().map(|cell| cell.iops).sum(),
            mean_ns: cells.iter().map(|cell| cell.mean_ns).sum::<f64>() / count,
            p99_ns: (cells.iter().map(|cell| cell.p99_ns).sum::<u64>() as f64 / count) as u64,
        }
    };
    Ok(Column {
        name: name.to_string(),
        target: targets.iter().map(|target| target.describe()).collect::<Vec<_>>().join(", "),
        region_bytes,
        fill_bytes_per_second: reports.iter().map(|runs| runs[0].write.bw_bytes).sum(),
        random_write: sum_cell(&|runs| cell(&runs[1], true)),
        random_read: sum_cell(&|runs| cell(&runs[2], false)),
    })
}

/// Open the member files at `paths` (creating missing ones of `create_size_bytes`).
pub(crate) fn open_member_devices(
    paths: &[PathBuf],
    create_size_bytes: Option<u64>,
) -> Result<Vec<MemberDevice>, String> {
    let options = FileDeviceOptions { create_size_bytes, ..FileDeviceOptions::default() };
    paths
        .iter()
        .map(|path| {
            let device = FileDevice::open(path, &options).map_err(|error| format!("{}: {error}", path.display()))?;
            Ok(MemberDevice { name: path.display().to_string(), device: Some(Arc::new(device)) })
        })
        .collect()
}

/// Close a volume the benchmark shared with its targets (flush it, when one still holds it).
pub(crate) fn close_volume(volume: Arc<Volume>) -> Result<(), String> {
    match Arc::try_unwrap(volume) {
        Ok(volume) => volume.close().map_err(|error| format!("closing the volume: {error}")),
        Err(volume) => volume.flush().map_err(|error| format!("flushing the volume: {error}")),
    }
}

pub fn run(options: &Options, progress: &(dyn Fn(&str, f64) + Sync)) -> Result<Report, String> {
    if options.members.is_empty() {
        return Err("name the member files (--members A,B,C,...)".into());
    }
    let mut columns = Vec::new();
    // 1. The raw members, all at once. Opening them checks --force for the whole run.
    let target_options = TargetOptions {
        writes: true,
        force: options.force,
        create_size_bytes: options.member_size_bytes,
        ..Default::default()
    };
    let raw: Vec<Box<dyn Target>> = options
        .members
        .iter()
        .map(|path| target::open(&format!("file:{}", path.display()), &target_options))
        .collect::<Result<_, _>>()?;
    // The peer first of all, so that a wrong URI fails before the long runs.
    let peer = match &options.peer {
        // The run writes to the peer too: it must hold nothing, or --force.
        Some(uri) => {
            Some(target::open(uri, &TargetOptions { writes: true, force: options.force, ..Default::default() })?)
        }
        None => None,
    };
    columns.push(measure(&format!("raw members ({})", raw.len()), &raw, options, progress)?);
    drop(raw);
    // 2. stripelog on the same members, in process.
    let create = CreateOptions {
        raid_level: options.raid_level,
        chunk_size_bytes: options.chunk_size_bytes,
        spare_ppm: options.spare_ppm,
        volume_uuid: None,
        // The raw-member run just wrote over them: `--force` was checked for the whole run.
        force: true,
        compression: Default::default(),
        logical_size_bytes: None,
        deduplication: false,
        client_write_pairs: true,
    };
    let volume = Arc::new(
        Volume::create(open_member_devices(&options.members, None)?, &create, &OpenOptions::default())
            .map_err(|error| format!("creating the volume: {error}"))?,
    );
    let label = options.members.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(",");
    let engine: Vec<Box<dyn Target>> = vec![Box::new(EngineTarget::from_volume(volume.clone(), label))];
    columns.push(measure("stripelog (in process)", &engine, options, progress)?);
    drop(engine);
    // 3. The same volume over NBD, from a server in this process.
    let directory = std::env::temp_dir().join(format!("stripelog-compare-{}", std::process::id()));
    std::fs::create_dir_all(&directory).map_err(|error| format!("{}: {error}", directory.display()))?;
    let socket = directory.join("nbd.sock");
    let _ = std::fs::remove_file(&socket);
    let listener =
        std::os::unix::net::UnixListener::bind(&socket).map_err(|error| format!("{}: {error}", socket.display()))?;
    let server = stripelog_nbd::Server::new(vec![stripelog_nbd::Export {
        name: EXPORT_NAME.into(),
        description: "stripelog bench compare".into(),
        volume: volume.clone(),
        read_only: false,
        allowed_clients: Vec::new(),
    }]);
    let over_nbd = std::thread::scope(|scope| {
        let serving = scope.spawn(|| server.run_unix(listener));
        let result = (|| {
            let uri = format!("nbd+unix:///{EXPORT_NAME}?socket={}", socket.display());
            // The volume this run created and wrote: its own data only.
            let own_volume = TargetOptions { writes: true, force: true, ..Default::default() };
            let nbd: Vec<Box<dyn Target>> = vec![target::open(&uri, &own_volume)?];
            measure("stripelog (NBD)", &nbd, options, progress)
        })();
        server.shutdown();
        let _ = serving.join();
        result
    });
    let _ = std::fs::remove_dir_all(&directory);
    columns.push(over_nbd?);
    drop(server);
    close_volume(volume)?;
    // 4. The peer.
    if let Some(peer) = peer {
        columns.push(measure("NBD peer", &[peer], options, progress)?);
    }
    Ok(Report {
        threads: options.threads,
        queue_depth: options.queue_depth,
        duration_seconds: options.duration.as_secs_f64(),
        columns,
    })
}

/// The side-by-side table, with stripelog's ratios to the raw members and to the peer.
pub fn table(report: &Report) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "4 KiB random I/O, {} thread(s) × depth {}, {:.0} s per cell (each target filled sequentially first)",
        report.threads, report.queue_depth, report.duration_seconds
    );
    type Pick = fn(&Column) -> f64;
    let rows: [(&str, Pick); 7] = [
        ("sequential fill MB/s", |column| column.fill_bytes_per_second / 1e6),
        ("random write IOPS", |column| column.random_write.iops),
        ("  mean latency µs", |column| column.random_write.mean_ns / 1e3),
        ("  p99 latency µs", |column| column.random_write.p99_ns as f64 / 1e3),
        ("random read IOPS", |column| column.random_read.iops),
        ("  mean latency µs", |column| column.random_read.mean_ns / 1e3),
        ("  p99 latency µs", |column| column.random_read.p99_ns as f64 / 1e3),
    ];
    let names: Vec<&str> = report.columns.iter().map(|column| column.name.as_str()).collect();
    let cells: Vec<(&str, Vec<String>)> = rows
        .iter()
        .map(|(label, pick)| (*label, report.columns.iter().map(|column| format!("{:.1}", pick(column))).collect()))
        .collect();
    crate::side_by_side::append(&mut text, 24, &names, &cells);
    let find = |prefix: &str| report.columns.iter().find(|column| column.name.starts_with(prefix));
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    if let (Some(raw), Some(engine), Some(nbd)) = (find("raw"), find("stripelog (in"), find("stripelog (NBD")) {
        let _ = writeln!(
            text,
            "stripelog ÷ raw members: write {:.2} in process, {:.2} over NBD; read {:.2} in process, {:.2} over NBD",
            ratio(engine.random_write.iops, raw.random_write.iops),
            ratio(nbd.random_write.iops, raw.random_write.iops),
            ratio(engine.random_read.iops, raw.random_read.iops),
            ratio(nbd.random_read.iops, raw.random_read.iops)
        );
        if let Some(peer) = find("NBD peer") {
            let _ = writeln!(
                text,
                "stripelog over NBD ÷ the NBD peer: write {:.2}, read {:.2}",
                ratio(nbd.random_write.iops, peer.random_write.iops),
                ratio(nbd.random_read.iops, peer.random_read.iops)
            );
        }
    }
    text
}
