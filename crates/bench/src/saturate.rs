//! Write saturation on the real engine (`stripelog bench saturate`): a fresh volume on file
//! members is filled sequentially, then written with 4 KiB random writes over its whole
//! logical space until it has been overwritten several times, so that the cleaner runs
//! all the time. Recorded: IOPS every second; per interval (10 s by default) IOPS, write
//! latency p50/p99/maximum from an HDR histogram, the cleaner's write amplification and
//! the free segments; whether and where the IOPS reached steady state by the SNIA PTS
//! rule; the steady IOPS as a share of the members' own sequential write bandwidth
//! (measured on the same files in the same run).

use crate::engine::{
    create_on, fill_region, open_devices, sequential_read_bandwidth, sequential_write_bandwidth, with_member_files,
    IO_SIZE_BYTES,
};
use crate::workload::RandomData;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use stripelog_blockdev::{BlockDevice, Prng};
use stripelog_engine::{CleaningPolicy, CreateOptions, OpenOptions, RaidLevel, VolumeStats};

/// Rounds in the SNIA PTS steady-state window.
const STEADY_WINDOW_ROUNDS: usize = 5;
/// Largest latency the histograms hold (longer ones are clamped to it): one minute.
const LATENCY_MAXIMUM_NANOSECONDS: u64 = 60_000_000_000;
/// How long each measurement of the members' sequential bandwidth runs.
const SEQUENTIAL_MEASUREMENT: Duration = Duration::from_secs(5);
/// How often the coordinating thread looks at the clock and the written volume.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

#[derive(Clone, Debug)]
pub struct Options {
    pub directory: PathBuf,
    pub member_count: usize,
    pub member_size_bytes: u64,
    pub chunk_size_bytes: u32,
    pub raid_level: RaidLevel,
    pub spare_ppm: u32,
    pub policy: CleaningPolicy,
    pub threads: usize,
    /// Stop after writing this many times the logical size (after the fill)…
    pub overwrite_passes: f64,
    /// …or after this long.
    pub duration_limit: Duration,
    /// Latency and amplification are reported per interval of this length.
    pub interval: Duration,
    pub cache_size_bytes: u64,
    /// The engine's index page cache (`None`: its default).
    pub map_cache_bytes: Option<u64>,
    /// Bytes of sealed batches in flight to the members (`None`: the engine's default).
    pub write_queue_bytes: Option<u64>,
    pub keep_files: bool,
    /// Existing files or block devices to run on instead of `member_count` files in
    /// `directory` (empty: files).
    pub devices: Vec<PathBuf>,
    /// Allow member files that already exist in `directory` (they are overwritten).
    pub force: bool,
    pub seed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Interval {
    pub start_seconds: f64,
    pub length_seconds: f64,
    pub iops: f64,
    pub latency_p50_ns: u64,
    pub latency_p99_ns: u64,
    pub latency_max_ns: u64,
    /// (new data + relocated) ÷ new data written to the members in this interval.
    pub write_amplification: f64,
    pub segments_free_at_end: u64,
    pub cleaning_rounds: u64,
    /// Writes in this interval that stalled with every write buffer waiting for the
    /// members, and for no free segment (the cleaner), with the seconds they stalled; and
    /// the writes the pacer held back. They say where an interval's latency went.
    pub writes_stalled_for_buffers: u64,
    pub buffer_stall_seconds: f64,
    pub writes_stalled_for_space: u64,
    pub space_stall_seconds: f64,
    pub paced_writes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SteadyState {
    /// Index of the first interval of the first window that met the rule.
    pub first_interval: usize,
    pub iops: f64,
    /// (max − min) ÷ mean of the window's IOPS (the rule: at most 0.2).
    pub range_fraction: f64,
    /// Excursion of the least-squares line over the window ÷ mean (the rule: at most 0.1).
    pub slope_excursion_fraction: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub member_count: usize,
    pub raid_level: String,
    pub member_size_bytes: u64,
    pub chunk_size_bytes: u32,
    pub spare_fraction: f64,
    pub policy: String,
    pub threads: usize,
    pub logical_size_bytes: u64,
    pub members: Vec<String>,
    /// The members' own sequential O_DIRECT write and read bandwidth, all at once, as the
    /// ratios use them: measured after the run, on members in the state the steady state
    /// works in (its writes overwrite blocks written before, its reads read blocks written
    /// long before). Before the run the files are written for the first time and read
    /// just after, which a virtual disk may serve at other speeds (on the test machine,
    /// first writes at about half the speed of overwrites). Each measurement is kept. The
    /// write is measured after the run only when the member files are not kept (it
    /// overwrites them); otherwise the ratios use the one before.
    pub sequential_write_bytes_per_second: f64,
    pub sequential_write_bytes_per_second_before: f64,
    pub sequential_write_bytes_per_second_after: Option<f64>,
    pub sequential_read_bytes_per_second: f64,
    pub sequential_read_bytes_per_second_before: f64,
    pub sequential_read_bytes_per_second_after: f64,
    pub data_fraction: f64,
    pub fill_seconds: f64,
    pub seconds: f64,
    pub writes: u64,
    /// Writes per second, every second.
    pub iops_per_second: Vec<f64>,
    pub intervals: Vec<Interval>,
    pub steady_state: Option<SteadyState>,
    /// Steady IOPS (or, without a steady state, the mean of the last window) × 4 KiB ÷
    /// (sequential bandwidth × data fraction).
    pub ratio_to_sequential: f64,
    /// What the cleaner's own traffic allows at the measured amplification WA: each host
    /// block costs WA × 4 KiB written with parity (at the sequential write bandwidth) and
    /// (WA − 1) × 4 KiB of live blocks read (at the sequential read bandwidth).
    pub cleaner_bound_iops: f64,
    /// Steady IOPS ÷ `cleaner_bound_iops`.
    pub ratio_to_cleaner_bound: f64,
    /// Over the second half of the run: bytes the cleaner read from members ÷ the live
    /// bytes it relocated. Above 1, it read the dead blocks between live ones too (one
    /// request per victim column, from its first to its last live block).
    pub cleaner_read_per_relocated_byte: f64,
    /// The same bound with the bytes the cleaner really read: what its traffic allows
    /// with whole-span reads.
    pub span_read_bound_iops: f64,
    /// Steady IOPS ÷ `span_read_bound_iops`.
    pub ratio_to_span_read_bound: f64,
    /// Over the second half of the run.
    pub write_amplification: f64,
    pub write_amplification_total: f64,
    pub latency_p99_ns: u64,
    pub latency_max_ns: u64,
    /// Client writes the engine's pacer held back, and the seconds they waited in all.
    pub paced_writes: u64,
    pub paced_seconds: f64,
    pub writes_stalled_for_buffers: u64,
    pub buffer_stall_seconds: f64,
    pub writes_stalled_for_space: u64,
    pub space_stall_seconds: f64,
    /// Sealed batches in flight at most (`--write-queue` ÷ a stripe), and the batches
    /// written as whole stripes and as short ones (sealed before they were full: by a
    /// flush, or by a cleaner's or checkpoint's batch, which seals the clients' open batch
    /// first to keep the log order). A short one holds a whole stripe's buffers while it is
    /// in flight.
    pub write_queue_batches: usize,
    pub full_stripes: u64,
    pub short_stripes: u64,
    pub map_cache: crate::MapCacheUse,
}

/// Per-thread records, merged at the end (nothing shared on the write path but one counter).
struct ThreadRecord {
    per_second: Vec<u64>,
    per_interval: Vec<Histogram<u64>>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAXIMUM_NANOSECONDS, 3).expect("valid histogram bounds")
}

impl SteadyState {
    /// The report's line for it, the window starting `from_seconds` into the run.
    pub fn describe(&self, from_seconds: f64) -> String {
        format!(
            "steady state (SNIA: {STEADY_WINDOW_ROUNDS} rounds within 20 % range, 10 % slope) from {from_seconds:.0} s: \
             {:.0} IOPS (range {:.1} %, slope {:.1} %)",
            self.iops,
            self.range_fraction * 100.0,
            self.slope_excursion_fraction * 100.0
        )
    }
}

/// The SNIA PTS steady-state rule over consecutive rounds: the first window of
/// `STEADY_WINDOW_ROUNDS` whose range is within 20 % of its mean and whose least-squares
/// line moves by at most 10 % of its mean across the window.
pub fn steady_state(rounds: &[f64]) -> Option<SteadyState> {
    (0..rounds.len().checked_sub(STEADY_WINDOW_ROUNDS - 1)?).find_map(|first| {
        let window = &rounds[first..first + STEADY_WINDOW_ROUNDS];
        let count = window.len() as f64;
        let mean = window.iter().sum::<f64>() / count;
        if mean <= 0.0 {
            return None;
        }
        let maximum = window.iter().cloned().fold(f64::MIN, f64::max);
        let minimum = window.iter().cloned().fold(f64::MAX, f64::min);
        let x_mean = (count - 1.0) / 2.0;
        let (mut covariance, mut variance) = (0.0, 0.0);
        for (index, value) in window.iter().enumerate() {
            covariance += (index as f64 - x_mean) * (value - mean);
            variance += (index as f64 - x_mean).powi(2);
        }
        let slope = covariance / variance;
        let range_fraction = (maximum - minimum) / mean;
        let slope_excursion_fraction = (slope * (count - 1.0)).abs() / mean;
        (range_fraction <= 0.2 && slope_excursion_fraction <= 0.1).then_some(SteadyState {
            first_interval: first,
            iops: mean,
            range_fraction,
            slope_excursion_fraction,
        })
    })
}

fn cleaning_amplification(before: &VolumeStats, after: &VolumeStats) -> f64 {
    let data = after.member_bytes_data.saturating_sub(before.member_bytes_data) as f64;
    let relocated = after.member_bytes_relocated.saturating_sub(before.member_bytes_relocated) as f64;
    if data > 0.0 {
        (data + relocated) / data
    } else {
        0.0
    }
}

pub fn run(options: &Options, progress: &dyn Fn(&str)) -> Result<Report, String> {
    if options.threads == 0 || options.interval.is_zero() {
        return Err("threads and the interval must be above zero".into());
    }
    with_member_files(
        &options.directory,
        "saturate-member",
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
    type Bandwidth = fn(&[std::sync::Arc<stripelog_blockdev::FileDevice>], usize, Duration) -> Result<f64, String>;
    let measure = |what: &str, bandwidth: Bandwidth| -> Result<f64, String> {
        progress(&format!(
            "measuring the members' sequential O_DIRECT {what} bandwidth (all members at once, {} s)",
            SEQUENTIAL_MEASUREMENT.as_secs()
        ));
        let bytes_per_second = bandwidth(&devices, options.chunk_size_bytes as usize, SEQUENTIAL_MEASUREMENT)?;
        progress(&format!("  {:.0} MB/s", bytes_per_second / 1e6));
        Ok(bytes_per_second)
    };
    let write_before = measure("write", sequential_write_bandwidth)?;
    let read_before = measure("read", sequential_read_bandwidth)?;
    let create = CreateOptions {
        raid_level: options.raid_level,
        chunk_size_bytes: options.chunk_size_bytes,
        spare_ppm: options.spare_ppm,
        // The run's own member files, written just before to measure them.
        force: true,
        ..CreateOptions::default()
    };
    let open = OpenOptions {
        cache_size_bytes: options.cache_size_bytes,
        map_cache_bytes: options.map_cache_bytes,
        cleaning_policy: options.policy,
        write_queue_bytes: options.write_queue_bytes.unwrap_or(stripelog_engine::DEFAULT_WRITE_QUEUE_BYTES),
        ..OpenOptions::default()
    };
    let volume = create_on(&devices, &create, &open)?;
    let created = volume.stats();
    let logical_size_bytes = created.logical_size_bytes;
    let data_fraction = created.data_columns as f64 / created.member_count as f64;
    let data = RandomData::new(options.seed);

    progress(&format!("filling the {} MiB logical space sequentially", logical_size_bytes >> 20));
    let fill_started = Instant::now();
    fill_region(&volume, &data, logical_size_bytes)?;
    let fill_seconds = fill_started.elapsed().as_secs_f64();

    let blocks = logical_size_bytes / IO_SIZE_BYTES as u64;
    let write_budget = (options.overwrite_passes * blocks as f64) as u64;
    progress(&format!(
        "4 KiB random writes, {} thread(s), until {:.1} × the logical space is written or {} s pass",
        options.threads,
        options.overwrite_passes,
        options.duration_limit.as_secs()
    ));
    let written = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failure = std::sync::Mutex::new(None::<String>);
    let started = Instant::now();
    let mut snapshots = vec![volume.stats()];
    let records: Vec<ThreadRecord> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..options.threads)
            .map(|thread| {
                let (volume, data, written, stop, failure) = (&volume, &data, &written, &stop, &failure);
                let interval = options.interval;
                scope.spawn(move || {
                    let mut record = ThreadRecord { per_second: Vec::new(), per_interval: Vec::new() };
                    let mut prng = Prng::new(options.seed.wrapping_mul(31) + thread as u64);
                    while !stop.load(Ordering::Relaxed) {
                        let offset = prng.below(blocks) * IO_SIZE_BYTES as u64;
                        let payload = data.window(&mut prng, IO_SIZE_BYTES);
                        let issued = Instant::now();
                        if let Err(error) = volume.write(offset, payload, false) {
                            if let Ok(mut slot) = failure.lock() {
                                slot.get_or_insert(error.to_string());
                            }
                            stop.store(true, Ordering::Relaxed);
                            break;
                        }
                        let done = Instant::now();
                        let latency = done.duration_since(issued).as_nanos().min(u64::MAX as u128) as u64;
                        let since_start = done.duration_since(started);
                        let second = since_start.as_secs() as usize;
                        let interval_index = (since_start.as_nanos() / interval.as_nanos()) as usize;
                        if record.per_second.len() <= second {
                            record.per_second.resize(second + 1, 0);
                        }
                        record.per_second[second] += 1;
                        while record.per_interval.len() <= interval_index {
                            record.per_interval.push(histogram());
                        }
                        record.per_interval[interval_index].saturating_record(latency.max(1));
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                    record
                })
            })
            .collect();
        // The coordinator: stop on the budget or the time limit; snapshot the volume's
        // counters at every interval boundary.
        let mut next_snapshot = options.interval;
        loop {
            std::thread::sleep(POLL_INTERVAL);
            let elapsed = started.elapsed();
            if elapsed >= next_snapshot {
                snapshots.push(volume.stats());
                next_snapshot += options.interval;
            }
            if written.load(Ordering::Relaxed) >= write_budget || elapsed >= options.duration_limit {
                stop.store(true, Ordering::Relaxed);
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let done = written.load(Ordering::Relaxed);
            if elapsed.as_millis() % 1000 < POLL_INTERVAL.as_millis() {
                progress(&format!(
                    "{:.0} s: {:.2} × logical written, {} free segments",
                    elapsed.as_secs_f64(),
                    done as f64 / blocks as f64,
                    snapshots.last().map_or(0, |stats| stats.segments_free)
                ));
            }
        }
        handles.into_iter().map(|handle| handle.join().expect("writer threads do not panic")).collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    if let Some(error) = failure.lock().ok().and_then(|slot| slot.clone()) {
        return Err(error);
    }
    volume.flush().map_err(|error| error.to_string())?;
    let end = volume.stats();
    snapshots.push(end.clone());
    volume.close().map_err(|error| error.to_string())?;
    let read_after = measure("read (again, after the run)", sequential_read_bandwidth)?;
    // (It overwrites the member files.)
    let write_after = if options.keep_files {
        None
    } else {
        Some(measure("write (again, after the run)", sequential_write_bandwidth)?)
    };
    let sequential = write_after.unwrap_or(write_before);
    let sequential_read = read_after;

    // Merge the threads' records. The last second and interval are partial: dropped.
    let whole_seconds = seconds.floor() as usize;
    let mut iops_per_second = vec![0f64; whole_seconds];
    let interval_seconds = options.interval.as_secs_f64();
    let whole_intervals = (seconds / interval_seconds).floor() as usize;
    let mut merged: Vec<Histogram<u64>> = (0..whole_intervals).map(|_| histogram()).collect();
    let mut overall = histogram();
    for record in &records {
        for (second, &count) in record.per_second.iter().enumerate().take(whole_seconds) {
            iops_per_second[second] += count as f64;
        }
        for (index, histogram) in record.per_interval.iter().enumerate() {
            if index < whole_intervals {
                merged[index].add(histogram).map_err(|error| error.to_string())?;
            }
            overall.add(histogram).map_err(|error| error.to_string())?;
        }
    }
    let intervals: Vec<Interval> = merged
        .iter()
        .enumerate()
        .map(|(index, histogram)| {
            let (before, after) =
                (&snapshots[index.min(snapshots.len() - 1)], &snapshots[(index + 1).min(snapshots.len() - 1)]);
            Interval {
                start_seconds: index as f64 * interval_seconds,
                length_seconds: interval_seconds,
                iops: histogram.len() as f64 / interval_seconds,
                latency_p50_ns: histogram.value_at_quantile(0.5),
                latency_p99_ns: histogram.value_at_quantile(0.99),
                latency_max_ns: histogram.max(),
                write_amplification: cleaning_amplification(before, after),
                segments_free_at_end: after.segments_free,
                cleaning_rounds: after.cleaning_rounds - before.cleaning_rounds,
                writes_stalled_for_buffers: after.writes_stalled_for_buffers - before.writes_stalled_for_buffers,
                buffer_stall_seconds: after.buffer_stall_seconds - before.buffer_stall_seconds,
                writes_stalled_for_space: after.writes_stalled_for_space - before.writes_stalled_for_space,
                space_stall_seconds: after.space_stall_seconds - before.space_stall_seconds,
                paced_writes: after.paced_writes - before.paced_writes,
            }
        })
        .collect();
    let interval_iops: Vec<f64> = intervals.iter().map(|interval| interval.iops).collect();
    let steady = steady_state(&interval_iops);
    let steady_iops = steady.as_ref().map(|steady| steady.iops).unwrap_or_else(|| {
        let tail = &interval_iops[interval_iops.len().saturating_sub(STEADY_WINDOW_ROUNDS)..];
        tail.iter().sum::<f64>() / tail.len().max(1) as f64
    });
    // Amplification over the second half of the run (the snapshots are per interval).
    let half = &snapshots[snapshots.len() / 2];
    let write_amplification = cleaning_amplification(half, &end);
    let data_written = end.member_bytes_data.saturating_sub(half.member_bytes_data) as f64;
    let members_written = end.member_bytes_written.saturating_sub(half.member_bytes_written) as f64;
    let cleaner_bound_iops = cleaner_bound_iops(write_amplification, data_fraction, sequential, sequential_read);
    let relocated = end.member_bytes_relocated.saturating_sub(half.member_bytes_relocated) as f64;
    let cleaner_read = end.member_bytes_read_cleaning.saturating_sub(half.member_bytes_read_cleaning) as f64;
    let cleaner_read_per_relocated_byte = if relocated > 0.0 { cleaner_read / relocated } else { 0.0 };
    let span_read_bound_iops = cleaner_bound_iops_reading(
        write_amplification,
        data_fraction,
        sequential,
        sequential_read,
        cleaner_read_per_relocated_byte.max(1.0),
    );
    let report = Report {
        member_count: paths.len(),
        raid_level: options.raid_level.to_string(),
        member_size_bytes: if options.devices.is_empty() {
            options.member_size_bytes
        } else {
            devices.iter().map(|device| device.size_bytes()).min().unwrap_or(0)
        },
        chunk_size_bytes: options.chunk_size_bytes,
        spare_fraction: options.spare_ppm as f64 / 1e6,
        policy: options.policy.to_string(),
        threads: options.threads,
        logical_size_bytes,
        members: descriptions,
        sequential_write_bytes_per_second: sequential,
        sequential_write_bytes_per_second_before: write_before,
        sequential_write_bytes_per_second_after: write_after,
        sequential_read_bytes_per_second: sequential_read,
        sequential_read_bytes_per_second_before: read_before,
        sequential_read_bytes_per_second_after: read_after,
        data_fraction,
        fill_seconds,
        seconds,
        writes: written.load(Ordering::Relaxed),
        iops_per_second,
        intervals,
        ratio_to_sequential: steady_iops * IO_SIZE_BYTES as f64 / (sequential * data_fraction),
        cleaner_bound_iops,
        ratio_to_cleaner_bound: steady_iops / cleaner_bound_iops.max(1e-9),
        cleaner_read_per_relocated_byte,
        span_read_bound_iops,
        ratio_to_span_read_bound: steady_iops / span_read_bound_iops.max(1e-9),
        steady_state: steady,
        write_amplification,
        write_amplification_total: if data_written > 0.0 { members_written / data_written } else { 0.0 },
        latency_p99_ns: overall.value_at_quantile(0.99),
        latency_max_ns: overall.max(),
        paced_writes: end.paced_writes,
        paced_seconds: end.paced_seconds,
        writes_stalled_for_buffers: end.writes_stalled_for_buffers,
        buffer_stall_seconds: end.buffer_stall_seconds,
        writes_stalled_for_space: end.writes_stalled_for_space,
        space_stall_seconds: end.space_stall_seconds,
        write_queue_batches: end.write_queue_batches,
        full_stripes: end.full_stripes,
        short_stripes: end.short_stripes,
        map_cache: crate::MapCacheUse::of(&end),
    };
    Ok(report)
}

/// 4 KiB host writes per second that the members can take at write amplification
/// `write_amplification` (cleaning: (host + relocated) ÷ host): each host block is written
/// `write_amplification` times, with parity (`data_fraction` of what the members write is
/// data), and `write_amplification − 1` relocated blocks are read first. Reads and writes
/// are taken to share the members' time, as they do on one drive.
pub fn cleaner_bound_iops(
    write_amplification: f64,
    data_fraction: f64,
    sequential_write_bytes_per_second: f64,
    sequential_read_bytes_per_second: f64,
) -> f64 {
    cleaner_bound_iops_reading(
        write_amplification,
        data_fraction,
        sequential_write_bytes_per_second,
        sequential_read_bytes_per_second,
        1.0,
    )
}

/// [`cleaner_bound_iops`] with `read_bytes_per_relocated_byte` bytes read for each live
/// byte relocated (1: exactly the live blocks).
pub fn cleaner_bound_iops_reading(
    write_amplification: f64,
    data_fraction: f64,
    sequential_write_bytes_per_second: f64,
    sequential_read_bytes_per_second: f64,
    read_bytes_per_relocated_byte: f64,
) -> f64 {
    let block = IO_SIZE_BYTES as f64;
    let amplification = write_amplification.max(1.0);
    let seconds_per_block = amplification * block / (data_fraction * sequential_write_bytes_per_second)
        + (amplification - 1.0) * read_bytes_per_relocated_byte * block / sequential_read_bytes_per_second;
    1.0 / seconds_per_block
}

/// A chart (SVG or PNG by extension): IOPS every second (top) and write latency p99 and maximum per interval
/// on a logarithmic scale (bottom).
pub fn chart(report: &Report, path: &std::path::Path) -> Result<(), String> {
    crate::render_chart!(path, (1000, 700), |root| draw(&root, report))
}

fn draw<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    report: &Report,
) -> Result<(), String> {
    use crate::chart::failed;
    use plotters::prelude::*;
    root.fill(&WHITE).map_err(failed)?;
    let (top, bottom) = root.split_vertically(380);
    let seconds = report.iops_per_second.len().max(1) as f64;
    let peak = crate::chart::linear_top(report.iops_per_second.iter().cloned().fold(1.0, f64::max));
    let mut iops_chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "stripelog: 4 KiB random writes, {} × {} RAID, {:.0} % spare, {} thread(s)",
                report.member_count,
                report.raid_level,
                report.spare_fraction * 100.0,
                report.threads
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, 0f64..peak)
        .map_err(failed)?;
    crate::chart::draw_axes(&mut iops_chart, "seconds (after the sequential fill)", "write IOPS")?;
    iops_chart
        .draw_series(LineSeries::new(
            // Each second's point at its end, as the tables' spans "0-10" end there.
            report.iops_per_second.iter().enumerate().map(|(second, &iops)| (second as f64 + 1.0, iops)),
            &BLUE,
        ))
        .map_err(failed)?
        .label("IOPS each second")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if let Some(steady) = &report.steady_state {
        let interval = report.intervals.first().map_or(10.0, |interval| interval.length_seconds);
        let from = steady.first_interval as f64 * interval;
        iops_chart
            .draw_series(LineSeries::new([(from, steady.iops), (seconds, steady.iops)], RED.stroke_width(2)))
            .map_err(failed)?
            .label(format!("steady state {:.0} IOPS", steady.iops))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    }
    crate::chart::draw_legend(&mut iops_chart)?;
    let to_ms = |nanoseconds: u64| nanoseconds as f64 / 1e6;
    let highest = report.intervals.iter().map(|interval| to_ms(interval.latency_max_ns)).fold(1e-3, f64::max);
    let lowest = (report.intervals.iter().map(|interval| to_ms(interval.latency_p99_ns)).fold(highest, f64::min) / 2.0)
        .max(1e-3);
    let highest = crate::chart::log_top(lowest, highest * 1.2);
    let mut latency_chart = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, (lowest..highest).log_scale())
        .map_err(failed)?;
    crate::chart::draw_axes(&mut latency_chart, "seconds", "write latency, ms (log)")?;
    for (label, color, pick) in [
        ("p99 per interval", GREEN, (|interval: &Interval| interval.latency_p99_ns) as fn(&Interval) -> u64),
        ("maximum per interval", MAGENTA, |interval: &Interval| interval.latency_max_ns),
    ] {
        latency_chart
            .draw_series(LineSeries::new(
                report.intervals.iter().map(|interval| {
                    (interval.start_seconds + interval.length_seconds, to_ms(pick(interval)).max(1e-3))
                }),
                color.stroke_width(2),
            ))
            .map_err(failed)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    crate::chart::draw_legend(&mut latency_chart)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_state_follows_the_snia_rule() {
        // Falling, then flat within the limits.
        let rounds = [1000.0, 800.0, 600.0, 500.0, 480.0, 500.0, 490.0, 505.0, 495.0];
        let steady = steady_state(&rounds).expect("steady");
        assert_eq!(steady.first_interval, 3);
        assert!((steady.iops - 495.0).abs() < 1e-9);
        // Still falling by 5 % a round: the range passes but the slope does not.
        let falling: Vec<f64> = (0..10).map(|round| 1000.0 * 0.97f64.powi(round)).collect();
        assert!(steady_state(&falling).is_none());
        assert!(steady_state(&[1.0, 1.0]).is_none());
    }

    #[test]
    fn the_cleaner_bound_charges_parity_writes_and_relocation_reads() {
        // No cleaning: the members' write bandwidth less parity.
        let fresh = cleaner_bound_iops(1.0, 0.8, 1e9, 2e9);
        assert!((fresh - 0.8e9 / 4096.0).abs() < 1e-3);
        // WA 2: two parity-laden writes and one read per host block.
        let steady = cleaner_bound_iops(2.0, 0.8, 1e9, 2e9);
        let expected = 1.0 / (2.0 * 4096.0 / 0.8e9 + 4096.0 / 2e9);
        assert!((steady - expected).abs() < 1e-6 * expected);
        // Reading twice the live bytes doubles the read term only.
        let spans = cleaner_bound_iops_reading(2.0, 0.8, 1e9, 2e9, 2.0);
        let expected = 1.0 / (2.0 * 4096.0 / 0.8e9 + 2.0 * 4096.0 / 2e9);
        assert!((spans - expected).abs() < 1e-6 * expected);
    }
}
