//! `stripelog sim lame-raid` (seed 003): six simulated consumer drives, each
//! preconditioned with its own random writes so that their garbage-collection pauses
//! strike at independent times, written sequentially in real (scaled) time:
//!
//! 1. each drive alone, all six at once but uncoupled, four chunk writes in flight on
//!    each: the sum is what the set could do;
//! 2. a naive in-order stripe writer (md RAID-0: each stripe's chunks issued together,
//!    the next stripe only when all have finished): every pause of any drive stalls all;
//! 3. stripelog RAID-0 on the same drives: its per-member write queues let each member
//!    run ahead of the others, so a pause on one does not idle the rest;
//! 4. stripelog with its write queue off (lock-step), to show the queues are the cause.
//!
//! The drives ignore TRIM here, as md passed none down in 2010: every case writes over the
//! same stale data (stripelog's create would otherwise trim the whole drive).

use super::arrays::{ArrayLevel, ConventionalArray};
use crate::run::{self, Data, Pattern, Workload};
use crate::target::{EngineTarget, SynchronousTarget};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stripelog_blockdev::{AlignedBuffer, BlockDevice, Prng};
use stripelog_engine::{CreateOptions, MemberDevice, OpenOptions, RaidLevel, Volume};
use stripelog_flashsim::{Clock, DriveModel, FlashDevice};

/// Real time between samples of the drives' progress.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(200);
/// Queue depth of stripelog's sequential writer (1 MiB requests).
const STRIPELOG_QUEUE_DEPTH: usize = 8;
const STRIPELOG_REQUEST_BYTES: usize = 1 << 20;
/// Chunk writes kept in flight on each drive written alone.
const ALONE_QUEUE_DEPTH: usize = 4;

#[derive(Clone, Debug)]
pub struct Options {
    pub drive: String,
    pub drives: usize,
    pub drive_size_bytes: u64,
    pub chunk_size_bytes: u64,
    /// Share of each drive written in every case.
    pub written_share: f64,
    /// Random overwrites of each drive after its sequential fill, in drive capacities (each
    /// drive takes a random 50-150 % of this).
    pub precondition_passes: f64,
    pub real_seconds_per_virtual_second: f64,
    /// Blocks per parallel unit each garbage-collection burst frees beyond the reserve
    /// (the preset's own when `None`): long bursts are long pauses.
    pub gc_burst_blocks: Option<u32>,
    pub seed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Case {
    pub name: String,
    pub data_bytes: u64,
    pub virtual_seconds: f64,
    pub bytes_per_second: f64,
    /// Of the sum of the drives written alone.
    pub share_of_sum: f64,
    /// Each drive's own throughput (the "alone" case) or bytes it took (the others).
    pub per_drive_bytes_per_second: Vec<f64>,
    /// Bytes the drives accepted in each sample interval, per virtual second.
    pub drive_bytes_per_second_over_time: Vec<(f64, f64)>,
    /// Share of the drives' time spent in garbage collection (mean over drives).
    pub collection_share: f64,
    pub device_write_amplification: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The drives as simulated (the preset with TRIM ignored and the burst chosen).
    pub drive: DriveModel,
    pub drives: usize,
    pub chunk_size_bytes: u64,
    pub real_seconds_per_virtual_second: f64,
    pub cases: Vec<Case>,
}

/// The drive as simulated: the preset with TRIM ignored and the burst chosen.
fn drive_model(options: &Options) -> Result<DriveModel, String> {
    let mut model = DriveModel::preset(&options.drive, options.drive_size_bytes)
        .ok_or_else(|| format!("no drive preset {:?}", options.drive))?;
    model.ftl.honours_trim = false;
    if let Some(burst) = options.gc_burst_blocks {
        model.ftl.gc_burst_blocks = burst;
    }
    Ok(model)
}

/// The preconditioned drives; identical for every case.
fn drives(options: &Options) -> Result<Vec<Arc<FlashDevice>>, String> {
    let model = drive_model(options)?;
    (0..options.drives)
        .map(|index| {
            let device = Arc::new(FlashDevice::new(model.clone(), &format!("drive{index}"))?);
            device.with_drive(|drive| -> Result<(), String> {
                let size = drive.size_bytes();
                for offset in (0..size).step_by(1 << 20) {
                    drive.write(offset, (1 << 20).min(size - offset), 0).map_err(|error| error.to_string())?;
                }
                let pages = size / 4096;
                let mut prng = Prng::new(options.seed.wrapping_mul(1000).wrapping_add(index as u64));
                // Each drive its own history: between half and one and a half times the
                // passes, so that their collections do not fall on the same bytes.
                let passes = options.precondition_passes * (0.5 + prng.below(1000) as f64 / 1000.0);
                for _ in 0..(pages as f64 * passes) as u64 {
                    drive.write(prng.below(pages) * 4096, 4096, 0).map_err(|error| error.to_string())?;
                }
                drive.reset_statistics();
                Ok(())
            })?;
            Ok(device)
        })
        .collect()
}

fn pace(drives: &[Arc<FlashDevice>], options: &Options) {
    for drive in drives {
        drive.set_clock(Clock::Paced { real_seconds_per_virtual_second: options.real_seconds_per_virtual_second });
    }
}

/// Throughput over time: (virtual seconds, bytes per virtual second).
type Samples = Vec<(f64, f64)>;

/// Samples the drives' accepted bytes while `work` runs; returns its result, the real
/// seconds it took and the samples (virtual seconds, bytes per virtual second).
fn measured<T>(
    drives: &[Arc<FlashDevice>],
    options: &Options,
    work: impl FnOnce() -> Result<T, String>,
) -> Result<(T, f64, Samples), String> {
    let dilation = options.real_seconds_per_virtual_second;
    let done = AtomicBool::new(false);
    let started = Instant::now();
    let written = || drives.iter().map(|drive| drive.statistics().host_write_bytes).sum::<u64>();
    let (result, samples) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut samples = Vec::new();
            let mut last = written();
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(SAMPLE_INTERVAL);
                let now = written();
                let virtual_seconds = started.elapsed().as_secs_f64() / dilation;
                samples.push((virtual_seconds, (now - last) as f64 / (SAMPLE_INTERVAL.as_secs_f64() / dilation)));
                last = now;
            }
            samples
        });
        let result = work();
        done.store(true, Ordering::Relaxed);
        (result, sampler.join().unwrap_or_default())
    });
    Ok((result?, started.elapsed().as_secs_f64(), samples))
}

fn case(
    name: &str,
    drives: &[Arc<FlashDevice>],
    data_bytes: u64,
    real_seconds: f64,
    samples: Samples,
    per_drive: Vec<f64>,
    options: &Options,
) -> Case {
    let virtual_seconds = real_seconds / options.real_seconds_per_virtual_second;
    let statistics: Vec<_> = drives.iter().map(|drive| drive.statistics()).collect();
    let page = drives[0].model().geometry.page_size_bytes;
    let host: u64 = statistics.iter().map(|statistics| statistics.host_write_bytes).sum();
    let nand: u64 = statistics.iter().map(|statistics| statistics.nand_program_pages() * page as u64).sum();
    let collection: f64 = statistics.iter().map(|statistics| statistics.collection_busy_ns as f64).sum::<f64>()
        / drives[0].model().geometry.parallel_units() as f64
        / drives.len() as f64;
    Case {
        name: name.to_string(),
        data_bytes,
        virtual_seconds,
        bytes_per_second: data_bytes as f64 / virtual_seconds,
        share_of_sum: 0.0,
        per_drive_bytes_per_second: per_drive,
        drive_bytes_per_second_over_time: samples,
        collection_share: collection / 1e9 / virtual_seconds,
        device_write_amplification: nand as f64 / host.max(1) as f64,
    }
}

fn per_drive_bytes(options: &Options) -> u64 {
    let bytes = (options.drive_size_bytes as f64 * options.written_share) as u64;
    bytes / options.chunk_size_bytes * options.chunk_size_bytes
}

fn alone(options: &Options) -> Result<Case, String> {
    let drives = drives(options)?;
    let bytes = per_drive_bytes(options);
    pace(&drives, options);
    let dilation = options.real_seconds_per_virtual_second;
    let (per_drive, seconds, samples) = measured(&drives, options, || {
        std::thread::scope(|scope| {
            let writers: Vec<_> = drives
                .iter()
                .map(|drive| {
                    scope.spawn(move || -> Result<f64, String> {
                        let started = Instant::now();
                        // ALONE_QUEUE_DEPTH writers per drive, each taking every n-th chunk:
                        // the drive always has work queued, as a drive benchmark keeps it.
                        std::thread::scope(|inner| {
                            let lanes: Vec<_> = (0..ALONE_QUEUE_DEPTH)
                                .map(|lane| {
                                    inner.spawn(move || -> Result<(), String> {
                                        let buffer = AlignedBuffer::zeroed(options.chunk_size_bytes as usize);
                                        let first = lane as u64 * options.chunk_size_bytes;
                                        let step = options.chunk_size_bytes as usize * ALONE_QUEUE_DEPTH;
                                        for offset in (first..bytes).step_by(step) {
                                            drive
                                                .write_at(buffer.as_slice(), offset)
                                                .map_err(|error| error.to_string())?;
                                        }
                                        Ok(())
                                    })
                                })
                                .collect();
                            lanes
                                .into_iter()
                                .try_for_each(|lane| lane.join().unwrap_or(Err("a writer panicked".into())))
                        })?;
                        drive.flush().map_err(|error| error.to_string())?;
                        Ok(bytes as f64 / (started.elapsed().as_secs_f64() / dilation))
                    })
                })
                .collect();
            writers
                .into_iter()
                .map(|writer| writer.join().unwrap_or(Err("a writer panicked".into())))
                .collect::<Result<Vec<f64>, String>>()
        })
    })?;
    let mut result = case(
        "each drive alone (sum)",
        &drives,
        bytes * drives.len() as u64,
        seconds,
        samples,
        per_drive.clone(),
        options,
    );
    // The sum of the drives' own rates, not total bytes over the slowest drive's time.
    result.bytes_per_second = per_drive.iter().sum();
    Ok(result)
}

fn naive(options: &Options) -> Result<Case, String> {
    let drives = drives(options)?;
    let members: Vec<Arc<dyn BlockDevice>> = drives.iter().map(|drive| drive.clone() as Arc<dyn BlockDevice>).collect();
    let array = ConventionalArray::new(ArrayLevel::Raid0, members, options.chunk_size_bytes, true)?;
    let stripe = options.chunk_size_bytes as usize * drives.len();
    let total = per_drive_bytes(options) * drives.len() as u64;
    pace(&drives, options);
    let data = vec![0u8; stripe];
    let ((), seconds, samples) = measured(&drives, options, || {
        (0..total).step_by(stripe).try_for_each(|offset| array.write(offset, &data))?;
        drives.iter().try_for_each(|drive| drive.flush().map_err(|error| error.to_string()))
    })?;
    Ok(case("naive in-order stripe writer", &drives, total, seconds, samples, Vec::new(), options))
}

fn stripelog(options: &Options, write_queue_bytes: u64, name: &str) -> Result<Case, String> {
    let drives = drives(options)?;
    let members = drives
        .iter()
        .enumerate()
        .map(|(index, drive)| MemberDevice {
            name: format!("drive{index}"),
            device: Some(drive.clone() as Arc<dyn BlockDevice>),
        })
        .collect();
    let create = CreateOptions {
        raid_level: RaidLevel::Raid0,
        chunk_size_bytes: options.chunk_size_bytes as u32,
        ..CreateOptions::default()
    };
    // No periodic flush: like the other writers, durable once, at the end.
    let open = OpenOptions { cache_size_bytes: 0, write_queue_bytes, flush_interval: None, ..OpenOptions::default() };
    let volume =
        Arc::new(Volume::create(members, &create, &open).map_err(|error| format!("creating the volume: {error}"))?);
    let total = (per_drive_bytes(options) * drives.len() as u64).min(volume.logical_size_bytes())
        / STRIPELOG_REQUEST_BYTES as u64
        * STRIPELOG_REQUEST_BYTES as u64;
    for drive in &drives {
        drive.with_drive(|drive| drive.reset_statistics());
    }
    pace(&drives, options);
    let target = EngineTarget::from_volume(volume.clone(), "simulated drives".into());
    let workload = Workload {
        read_percent: 0,
        block_sizes_bytes: vec![STRIPELOG_REQUEST_BYTES],
        pattern: Pattern::Sequential,
        zipf_exponent: None,
        region_offset_bytes: 0,
        region_bytes: total,
        data: Data::Random,
        threads: 1,
        queue_depth: STRIPELOG_QUEUE_DEPTH,
        duration: Duration::from_secs(24 * 3600),
        write_limit_bytes: Some(total),
        durability: Default::default(),
        seed: options.seed,
    };
    let (_, seconds, samples) = measured(&drives, options, || {
        run::run(&target, &workload, &|_| {})?;
        volume.flush().map_err(|error| error.to_string())
    })?;
    drop(target);
    crate::compare::close_volume(volume)?;
    Ok(case(name, &drives, total, seconds, samples, Vec::new(), options))
}

pub fn run(options: &Options, progress: &dyn Fn(&str)) -> Result<Report, String> {
    if options.drives < 2 || !(0.05..=0.75).contains(&options.written_share) {
        return Err("at least two drives, and a written share between 5 % and 75 % of each".into());
    }
    let model = drive_model(options)?;
    progress("each drive alone");
    let mut cases = vec![alone(options)?];
    progress("naive in-order stripe writer");
    cases.push(naive(options)?);
    progress("stripelog");
    let queue = OpenOptions::default().write_queue_bytes;
    cases.push(stripelog(options, queue, "stripelog (per-member write queues)")?);
    progress("stripelog, lock-step");
    cases.push(stripelog(options, 0, "stripelog, write queue off (lock-step)")?);
    let sum = cases[0].bytes_per_second;
    for case in &mut cases {
        case.share_of_sum = case.bytes_per_second / sum;
    }
    Ok(Report {
        drive: model,
        drives: options.drives,
        chunk_size_bytes: options.chunk_size_bytes,
        real_seconds_per_virtual_second: options.real_seconds_per_virtual_second,
        cases,
    })
}

pub fn table(report: &Report) -> String {
    let megabytes = |bytes: f64| bytes / 1e6;
    let mut text = format!(
        "{} × {} ({}; garbage collection in bursts of {} blocks per unit), chunk {} KiB, sequential writes over preconditioned drives (paced: 1 virtual s = {} real s)\n",
        report.drives,
        report.drive.name,
        report.drive.description,
        report.drive.ftl.gc_burst_blocks,
        report.chunk_size_bytes >> 10,
        report.real_seconds_per_virtual_second
    );
    text += &format!("{:<42} {:>10} {:>10} {:>10} {:>9}\n", "writer", "MB/s", "of sum", "GC share", "drive WA");
    for case in &report.cases {
        text += &format!(
            "{:<42} {:>10.0} {:>9.0}% {:>9.0}% {:>9.2}\n",
            case.name,
            megabytes(case.bytes_per_second),
            case.share_of_sum * 100.0,
            case.collection_share * 100.0,
            case.device_write_amplification
        );
    }
    if let Some(alone) = report.cases.first() {
        let rates: Vec<String> =
            alone.per_drive_bytes_per_second.iter().map(|&rate| format!("{:.0}", megabytes(rate))).collect();
        text += &format!("each drive alone, MB/s: {}\n", rates.join(" "));
    }
    text
}

/// The drives' aggregate accepted bandwidth over virtual time, one line per writer.
pub fn chart(report: &Report, path: &std::path::Path) -> Result<(), String> {
    crate::render_chart!(path, (1000, 560), |root| draw(&root, report))
}

fn draw<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    report: &Report,
) -> Result<(), String> {
    use crate::chart::failed;
    use plotters::prelude::*;
    root.fill(&WHITE).map_err(failed)?;
    // Cumulative megabytes accepted: a stall is a flat stretch, the slope is the rate.
    let cumulative = |case: &Case| -> Vec<(f64, f64)> {
        let mut total_megabytes = 0.0;
        let mut previous_seconds = 0.0;
        let mut line = vec![(0.0, 0.0)];
        for &(seconds, bytes_per_second) in &case.drive_bytes_per_second_over_time {
            total_megabytes += bytes_per_second / 1e6 * (seconds - previous_seconds);
            previous_seconds = seconds;
            line.push((seconds, total_megabytes));
        }
        line
    };
    let lines: Vec<Vec<(f64, f64)>> = report.cases.iter().map(cumulative).collect();
    let points = || lines.iter().flatten();
    let longest = points().map(|&(seconds, _)| seconds).fold(0.1, f64::max);
    let peak = points().map(|&(_, megabytes)| megabytes).fold(1.0, f64::max) * 1.1;
    let caption = format!("Lame RAID: {} simulated {} drives, sequential writes", report.drives, report.drive.name);
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..longest, 0f64..peak)
        .map_err(failed)?;
    crate::chart::draw_axes(&mut chart, "virtual seconds", "MB accepted by the drives (flat: stalled)")?;
    for ((case, line), color) in report.cases.iter().zip(&lines).zip([BLACK, RED, BLUE, MAGENTA]) {
        chart
            .draw_series(LineSeries::new(line.iter().copied(), color.stroke_width(2)))
            .map_err(failed)?
            .label(format!("{}: {:.0} MB/s", case.name, case.bytes_per_second / 1e6))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(failed)
}
