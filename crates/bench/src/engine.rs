//! The engine benchmark: 4 KiB random writes in process, with one and several threads,
//! on a fresh volume of file members, against the members' own sequential O_DIRECT write
//! bandwidth measured on the same files in the same run; then random reads.
//!
//! The figure of merit is `(write IOPS × 4 KiB) ÷ (sequential bandwidth × data fraction)`:
//! the share of the drives' linear speed that random writes reach (the seed system claims
//! 0.95). The data fraction is (n−1)/n for RAID-5: parity costs what it must.

use crate::workload::RandomData;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stripelog_blockdev::{AlignedBuffer, BlockDevice, FileDevice, FileDeviceOptions, IoRequest, Prng};
use stripelog_engine::{CreateOptions, MemberDevice, OpenOptions, RaidLevel, Volume};

/// Block size of the random I/O.
pub const IO_SIZE_BYTES: usize = 4096;
/// Sequential baseline: chunk-sized writes, this many in flight per member.
const SEQUENTIAL_QUEUE_DEPTH: usize = 4;
/// A write phase stops when it has written this share of the volume's physical data
/// capacity: it measures the write path of a fresh volume, before the cleaner must run
/// (`stripelog bench saturate` measures the volume in steady state with the cleaner).
const WRITE_BUDGET_SHARE: f64 = 0.7;

#[derive(Clone, Debug)]
pub struct Options {
    pub directory: PathBuf,
    pub member_count: usize,
    pub member_size_bytes: u64,
    pub chunk_size_bytes: u32,
    pub raid_level: RaidLevel,
    pub region_bytes: u64,
    pub duration: Duration,
    pub write_thread_counts: Vec<usize>,
    pub read_thread_counts: Vec<usize>,
    pub keep_files: bool,
    /// Existing files or block devices to run on instead of `member_count` files in
    /// `directory` (empty: files).
    pub devices: Vec<PathBuf>,
    /// Allow member files that already exist in `directory` (they are overwritten).
    pub force: bool,
    /// The engine's block cache (0: none).
    pub cache_size_bytes: u64,
    /// The engine's index page cache (`None`: its default).
    pub map_cache_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    pub threads: usize,
    pub operations: u64,
    pub seconds: f64,
    pub iops: f64,
    pub bytes_per_second: f64,
    /// Writes: IOPS × 4 KiB ÷ (sequential bandwidth × data fraction).
    pub ratio_to_sequential: Option<f64>,
    /// The phase ended on the space budget rather than on time.
    pub stopped_by_space_budget: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub member_count: usize,
    pub raid_level: String,
    pub member_size_bytes: u64,
    pub chunk_size_bytes: u32,
    pub region_bytes: u64,
    pub members: Vec<String>,
    /// The members' sequential bandwidth: the higher of the two measurements (the
    /// conservative choice for the ratio), and each of them.
    pub sequential_write_bytes_per_second: f64,
    pub sequential_write_bytes_per_second_before: f64,
    pub sequential_write_bytes_per_second_after: f64,
    pub data_fraction: f64,
    pub random_write: Vec<Phase>,
    pub random_read: Vec<Phase>,
    pub logical_size_bytes: u64,
    pub map_bytes_per_logical_block: f64,
    pub map_cache: crate::MapCacheUse,
    /// Map, checksums, write buffers and block cache.
    pub engine_memory_bytes: u64,
    pub cache_size_bytes: u64,
    pub engine_memory_bytes_per_logical_gib: f64,
    pub resident_memory_bytes_per_logical_gib: Option<f64>,
}

/// Run `body` on `devices` when named (existing files or block devices, written over and
/// kept: one that holds data is refused unless `force`), otherwise on `count` member files
/// `PREFIX-N` in `directory` (created), then remove them unless `keep`. The run writes
/// over the files and removes them: one that already exists and is not empty (a kept
/// run's volume, or anything else of that name) is refused unless `force`.
pub(crate) fn with_member_files<T>(
    directory: &std::path::Path,
    prefix: &str,
    count: usize,
    devices: &[PathBuf],
    keep: bool,
    force: bool,
    body: impl FnOnce(&[PathBuf]) -> Result<T, String>,
) -> Result<T, String> {
    if !devices.is_empty() {
        if !force {
            for path in devices {
                crate::target::refuse_existing_data(path)?;
            }
        }
        return body(devices);
    }
    std::fs::create_dir_all(directory).map_err(|error| format!("{}: {error}", directory.display()))?;
    let paths: Vec<PathBuf> = (0..count).map(|index| directory.join(format!("{prefix}-{index}"))).collect();
    if !force {
        if let Some(path) = paths.iter().find(|path| std::fs::metadata(path).is_ok_and(|metadata| metadata.len() > 0)) {
            return Err(format!(
                "{} exists and is not empty; the benchmark writes over its member files and removes them (pass \
                 --force to allow that, or choose another --dir)",
                path.display()
            ));
        }
    }
    let result = body(&paths);
    if !keep {
        for path in &paths {
            let _ = std::fs::remove_file(path);
        }
    }
    result
}

/// A fresh volume on `devices`.
pub(crate) fn create_on(
    devices: &[Arc<FileDevice>],
    create: &CreateOptions,
    open: &OpenOptions,
) -> Result<Volume, String> {
    Volume::create(member_devices(devices), create, open).map_err(|error| error.to_string())
}

/// The engine's view of the run's member files.
pub(crate) fn member_devices(devices: &[Arc<FileDevice>]) -> Vec<MemberDevice> {
    devices
        .iter()
        .enumerate()
        .map(|(index, device)| MemberDevice {
            name: format!("member-{index}"),
            device: Some(device.clone() as Arc<dyn BlockDevice>),
        })
        .collect()
}

pub(crate) fn open_devices(paths: &[PathBuf], size_bytes: u64) -> Result<Vec<Arc<FileDevice>>, String> {
    paths
        .iter()
        .map(|path| {
            let options = FileDeviceOptions { create_size_bytes: Some(size_bytes), ..FileDeviceOptions::default() };
            FileDevice::open(path, &options).map(Arc::new).map_err(|error| format!("{}: {error}", path.display()))
        })
        .collect()
}

/// Write every member sequentially, all members at once, with chunk-sized O_DIRECT
/// writes, for `duration` or until the members are full; returns bytes per second
/// (including the final flush).
pub fn sequential_write_bandwidth(
    devices: &[Arc<FileDevice>],
    chunk_size_bytes: usize,
    duration: Duration,
) -> Result<f64, String> {
    sequential_bandwidth(devices, chunk_size_bytes, duration, Direction::Write)
}

/// Read every member sequentially from its start, all members at once, with chunk-sized
/// O_DIRECT reads, for `duration` or until the members end; returns bytes per second.
pub fn sequential_read_bandwidth(
    devices: &[Arc<FileDevice>],
    chunk_size_bytes: usize,
    duration: Duration,
) -> Result<f64, String> {
    sequential_bandwidth(devices, chunk_size_bytes, duration, Direction::Read)
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Read,
    Write,
}

fn sequential_bandwidth(
    devices: &[Arc<FileDevice>],
    chunk_size_bytes: usize,
    duration: Duration,
    direction: Direction,
) -> Result<f64, String> {
    let started = Instant::now();
    let moved: Vec<Result<u64, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .map(|device| {
                scope.spawn(move || {
                    let mut buffers: Vec<AlignedBuffer> = (0..SEQUENTIAL_QUEUE_DEPTH)
                        .map(|index| {
                            let mut buffer = AlignedBuffer::zeroed(chunk_size_bytes);
                            Prng::new(index as u64 + 1).fill(&mut buffer);
                            buffer
                        })
                        .collect();
                    let mut offset = 0u64;
                    let size = device.size_bytes();
                    while started.elapsed() < duration
                        && offset + (chunk_size_bytes * SEQUENTIAL_QUEUE_DEPTH) as u64 <= size
                    {
                        let mut requests: Vec<IoRequest> = match direction {
                            Direction::Write => buffers
                                .iter()
                                .enumerate()
                                .map(|(index, buffer)| IoRequest::Write {
                                    buffer,
                                    offset_bytes: offset + (index * chunk_size_bytes) as u64,
                                })
                                .collect(),
                            Direction::Read => buffers
                                .iter_mut()
                                .enumerate()
                                .map(|(index, buffer)| IoRequest::Read {
                                    buffer,
                                    offset_bytes: offset + (index * chunk_size_bytes) as u64,
                                })
                                .collect(),
                        };
                        for result in device.submit_batch(&mut requests) {
                            result.map_err(|error| error.to_string())?;
                        }
                        offset += (chunk_size_bytes * SEQUENTIAL_QUEUE_DEPTH) as u64;
                    }
                    if direction == Direction::Write {
                        device.flush().map_err(|error| error.to_string())?;
                    }
                    Ok(offset)
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap_or(Err("thread panicked".into()))).collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut total = 0;
    for bytes in moved {
        total += bytes?;
    }
    Ok(total as f64 / seconds)
}

fn create_volume(devices: &[Arc<FileDevice>], options: &Options) -> Result<Volume, String> {
    let create = CreateOptions {
        raid_level: options.raid_level,
        chunk_size_bytes: options.chunk_size_bytes,
        // The run's own member files: measured (written) just before, or the last phase's volume.
        force: true,
        ..CreateOptions::default()
    };
    let open = OpenOptions {
        cache_size_bytes: options.cache_size_bytes,
        map_cache_bytes: options.map_cache_bytes,
        ..OpenOptions::default()
    };
    create_on(devices, &create, &open)
}

/// Run `threads` workers doing 4 KiB random I/O over the first `region_bytes` of the
/// volume until `duration` passes or `byte_budget` bytes are done.
fn random_phase(
    volume: &Volume,
    data: &RandomData,
    threads: usize,
    region_bytes: u64,
    duration: Duration,
    byte_budget: u64,
    write: bool,
) -> Result<Phase, String> {
    let blocks = region_bytes / IO_SIZE_BYTES as u64;
    let operations = AtomicU64::new(0);
    let over_budget = AtomicBool::new(false);
    let failure = std::sync::Mutex::new(None::<String>);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let (operations, over_budget, failure) = (&operations, &over_budget, &failure);
            scope.spawn(move || {
                let mut prng = Prng::new(0xBE_7C4 + thread as u64);
                let mut read_buffer = vec![0u8; IO_SIZE_BYTES];
                while started.elapsed() < duration && !over_budget.load(Ordering::Relaxed) {
                    let offset = prng.below(blocks) * IO_SIZE_BYTES as u64;
                    let result = if write {
                        volume.write(offset, data.window(&mut prng, IO_SIZE_BYTES), false)
                    } else {
                        volume.read(offset, &mut read_buffer)
                    };
                    if let Err(error) = result {
                        if let Ok(mut slot) = failure.lock() {
                            slot.get_or_insert(error.to_string());
                        }
                        over_budget.store(true, Ordering::Relaxed);
                        break;
                    }
                    let done = operations.fetch_add(1, Ordering::Relaxed) + 1;
                    if done * IO_SIZE_BYTES as u64 >= byte_budget {
                        over_budget.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    if write {
        volume.flush().map_err(|error| error.to_string())?;
    }
    if let Some(error) = failure.lock().ok().and_then(|slot| slot.clone()) {
        return Err(error);
    }
    let seconds = started.elapsed().as_secs_f64();
    let operations = operations.load(Ordering::Relaxed);
    let iops = operations as f64 / seconds;
    Ok(Phase {
        threads,
        operations,
        seconds,
        iops,
        bytes_per_second: iops * IO_SIZE_BYTES as f64,
        ratio_to_sequential: None,
        stopped_by_space_budget: over_budget.load(Ordering::Relaxed) && started.elapsed() < duration,
    })
}

/// Fill the first `region_bytes` sequentially with 1 MiB writes, and flush.
pub(crate) fn fill_region(volume: &Volume, data: &RandomData, region_bytes: u64) -> Result<(), String> {
    const FILL_SIZE_BYTES: usize = 1 << 20;
    let mut prng = Prng::new(7);
    let mut offset = 0;
    while offset < region_bytes {
        let length = FILL_SIZE_BYTES.min((region_bytes - offset) as usize);
        volume.write(offset, data.window(&mut prng, length), false).map_err(|error| error.to_string())?;
        offset += length as u64;
    }
    volume.flush().map_err(|error| error.to_string())
}

/// Run the whole benchmark; `progress` receives a line per step.
pub fn run(options: &Options, progress: &dyn Fn(&str)) -> Result<Report, String> {
    with_member_files(
        &options.directory,
        "bench-member",
        options.member_count,
        &options.devices,
        options.keep_files,
        options.force,
        |paths| run_in(options, paths, progress),
    )
}

fn run_in(options: &Options, paths: &[PathBuf], progress: &dyn Fn(&str)) -> Result<Report, String> {
    // Named devices are used at their size, never grown.
    let devices = open_devices(paths, if options.devices.is_empty() { options.member_size_bytes } else { 0 })?;
    let descriptions: Vec<String> = devices.iter().map(|device| device.describe()).collect();
    progress(&format!("members: {}", descriptions.join("; ")));
    progress("measuring the members' sequential O_DIRECT write bandwidth (all members at once)");
    let sequential_before = sequential_write_bandwidth(&devices, options.chunk_size_bytes as usize, options.duration)?;
    progress(&format!("  {:.0} MB/s", sequential_before / 1e6));
    let data = RandomData::new(42);
    let mut random_write = Vec::new();
    for &threads in &options.write_thread_counts {
        let volume = create_volume(&devices, options)?;
        let stats = volume.stats();
        let region = options.region_bytes.min(stats.logical_size_bytes);
        let budget = (stats.physical_data_bytes as f64 * WRITE_BUDGET_SHARE) as u64;
        progress(&format!("4 KiB random writes, {threads} thread(s), region {} MiB", region >> 20));
        let phase = random_phase(&volume, &data, threads, region, options.duration, budget, true)?;
        progress(&format!("  {:.0} IOPS, {:.0} MB/s", phase.iops, phase.bytes_per_second / 1e6));
        random_write.push(phase);
        volume.close().map_err(|error| error.to_string())?;
    }
    // Measure the members again, on the same files, after the writes: the disk is noisy,
    // and the ratio uses the higher figure.
    progress("measuring the members' sequential bandwidth again");
    let sequential_after = sequential_write_bandwidth(&devices, options.chunk_size_bytes as usize, options.duration)?;
    progress(&format!("  {:.0} MB/s", sequential_after / 1e6));
    let sequential = sequential_before.max(sequential_after);
    let memory_before = crate::resident_memory_bytes();
    let volume = create_volume(&devices, options)?;
    let created = volume.stats();
    let data_fraction = created.data_columns as f64 / created.member_count as f64;
    let logical_size_bytes = created.logical_size_bytes;
    for phase in &mut random_write {
        phase.ratio_to_sequential = Some(phase.bytes_per_second / (sequential * data_fraction));
    }
    let region = options.region_bytes.min(logical_size_bytes);
    progress(&format!("filling the {} MiB region for the read phase", region >> 20));
    fill_region(&volume, &data, region)?;
    let mut random_read = Vec::new();
    for &threads in &options.read_thread_counts {
        progress(&format!("4 KiB random reads, {threads} thread(s)"));
        let phase = random_phase(&volume, &data, threads, region, options.duration, u64::MAX, false)?;
        progress(&format!("  {:.0} IOPS", phase.iops));
        random_read.push(phase);
    }
    let stats = volume.stats();
    let logical_gib = logical_size_bytes as f64 / (1u64 << 30) as f64;
    let engine_memory = stats.map_memory_bytes
        + stats.checksum_memory_bytes
        + stats.write_buffer_memory_bytes
        + stats.cache_memory_bytes;
    let resident = match (memory_before, crate::resident_memory_bytes()) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before) as f64 / logical_gib),
        _ => None,
    };
    volume.close().map_err(|error| error.to_string())?;
    Ok(Report {
        member_count: paths.len(),
        raid_level: options.raid_level.to_string(),
        member_size_bytes: if options.devices.is_empty() {
            options.member_size_bytes
        } else {
            devices.iter().map(|device| device.size_bytes()).min().unwrap_or(0)
        },
        chunk_size_bytes: options.chunk_size_bytes,
        region_bytes: options.region_bytes,
        members: descriptions,
        sequential_write_bytes_per_second: sequential,
        sequential_write_bytes_per_second_before: sequential_before,
        sequential_write_bytes_per_second_after: sequential_after,
        data_fraction,
        random_write,
        random_read,
        logical_size_bytes,
        map_bytes_per_logical_block: stats.map_bytes_per_logical_block,
        map_cache: crate::MapCacheUse::of(&stats),
        engine_memory_bytes: engine_memory,
        cache_size_bytes: stats.cache_memory_bytes,
        engine_memory_bytes_per_logical_gib: engine_memory as f64 / logical_gib,
        resident_memory_bytes_per_logical_gib: resident,
    })
}
