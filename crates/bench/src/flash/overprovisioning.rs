//! `stripelog sim overprovisioning` (seed 004): the SNIA write-saturation test on one
//! simulated drive, fresh out of the box: 4 KiB random writes at queue depth 32 over the
//! whole drive, IOPS each virtual second; then the same drive with its total spare raised
//! (the host leaves part of the drive unwritten, as the seed's testers left space
//! unpartitioned). The model runs in virtual time, so two hours take seconds.

use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use stripelog_blockdev::Prng;
use stripelog_flashsim::{DriveModel, DriveStatistics, FlashDrive};

const WRITE_SIZE_BYTES: u64 = 4096;
const NANOSECONDS_PER_SECOND: u64 = 1_000_000_000;

#[derive(Clone, Debug)]
pub struct Options {
    pub drive: String,
    pub drive_size_bytes: u64,
    /// Total spare (drive's own plus the unwritten part) of the second run, of the raw NAND.
    pub raised_spare_fraction: f64,
    pub queue_depth: usize,
    pub virtual_seconds: u64,
    pub seed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub name: String,
    /// Share of the raw NAND the host never writes (drive's spare plus unwritten space).
    pub total_spare_fraction: f64,
    pub written_region_bytes: u64,
    pub iops_per_second: Vec<u64>,
    /// Mean IOPS over the first 10 virtual seconds (fresh out of the box).
    pub fresh_iops: f64,
    /// Mean IOPS over the last fifth of the run.
    pub steady_iops: f64,
    /// Relative spread (standard deviation ÷ mean) of the per-second IOPS in the last fifth.
    pub steady_variation: f64,
    /// The first second whose IOPS fell below half of the fresh figure.
    pub first_drop_second: Option<usize>,
    pub steady_write_amplification: f64,
    pub analytic_greedy_write_amplification: f64,
    pub statistics: DriveStatistics,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub drive: DriveModel,
    pub queue_depth: usize,
    pub virtual_seconds: u64,
    pub raw_size_bytes: u64,
    pub runs: Vec<Run>,
    /// Steady IOPS with raised spare ÷ with the normal spare.
    pub steady_gap: f64,
    pub simulation_seconds: f64,
}

fn mean(values: &[u64]) -> f64 {
    values.iter().sum::<u64>() as f64 / values.len().max(1) as f64
}

fn one_run(model: &DriveModel, options: &Options, name: &str, total_spare: Option<f64>) -> Result<Run, String> {
    let mut drive = FlashDrive::new(model.clone())?;
    let raw = drive.raw_size_bytes();
    let region = match total_spare {
        Some(spare) => ((raw as f64 * (1.0 - spare)) as u64).min(drive.size_bytes()),
        None => drive.size_bytes(),
    } / WRITE_SIZE_BYTES
        * WRITE_SIZE_BYTES;
    let blocks = region / WRITE_SIZE_BYTES;
    let mut prng = Prng::new(options.seed);
    // Queue depth 32, closed loop: each slot issues its next write when its last completes.
    let mut slots: BinaryHeap<Reverse<u64>> = (0..options.queue_depth.max(1)).map(|_| Reverse(0)).collect();
    let end_ns = options.virtual_seconds * NANOSECONDS_PER_SECOND;
    let mut iops_per_second = vec![0u64; options.virtual_seconds as usize];
    let steady_start = options.virtual_seconds * 4 / 5;
    let mut steady_before: Option<DriveStatistics> = None;
    while let Some(Reverse(arrival)) = slots.pop() {
        if arrival >= end_ns {
            break;
        }
        if steady_before.is_none() && arrival >= steady_start * NANOSECONDS_PER_SECOND {
            steady_before = Some(drive.statistics().clone());
        }
        let completion = drive
            .write(prng.below(blocks) * WRITE_SIZE_BYTES, WRITE_SIZE_BYTES, arrival)
            .map_err(|error| format!("{name}: {error}"))?;
        if let Some(count) = iops_per_second.get_mut((completion / NANOSECONDS_PER_SECOND) as usize) {
            *count += 1;
        }
        slots.push(Reverse(completion));
    }
    let statistics = drive.statistics().clone();
    let steady = &iops_per_second[steady_start as usize..];
    let steady_iops = mean(steady);
    let deviation = (steady.iter().map(|&iops| (iops as f64 - steady_iops).powi(2)).sum::<f64>()
        / steady.len().max(1) as f64)
        .sqrt();
    let fresh_iops = mean(&iops_per_second[..iops_per_second.len().min(10)]);
    let spare = 1.0 - region as f64 / raw as f64;
    Ok(Run {
        name: name.to_string(),
        total_spare_fraction: spare,
        written_region_bytes: region,
        first_drop_second: iops_per_second.iter().position(|&iops| (iops as f64) < fresh_iops / 2.0),
        fresh_iops,
        steady_iops,
        steady_variation: deviation / steady_iops.max(1e-9),
        steady_write_amplification: steady_before
            .map_or(0.0, |before| statistics.since(&before).write_amplification(model.geometry.page_size_bytes)),
        analytic_greedy_write_amplification: stripelog_flashsim::theory::greedy_uniform_write_amplification(spare),
        iops_per_second,
        statistics,
    })
}

pub fn run(options: &Options) -> Result<Report, String> {
    let model = DriveModel::preset(&options.drive, options.drive_size_bytes).ok_or_else(|| {
        format!("no drive preset {:?} (one of {:?})", options.drive, stripelog_flashsim::PRESET_NAMES)
    })?;
    if options.virtual_seconds < 20 {
        return Err("run for at least 20 virtual seconds".into());
    }
    let started = std::time::Instant::now();
    let raw_size_bytes = FlashDrive::new(model.clone())?.raw_size_bytes();
    let (normal, raised) = std::thread::scope(|scope| {
        let normal = scope.spawn(|| one_run(&model, options, "normal spare", None));
        let raised = one_run(&model, options, "raised spare", Some(options.raised_spare_fraction));
        (normal.join().unwrap_or(Err("the normal-spare run panicked".into())), raised)
    });
    let (normal, raised) = (normal?, raised?);
    Ok(Report {
        steady_gap: raised.steady_iops / normal.steady_iops.max(1e-9),
        drive: model,
        queue_depth: options.queue_depth,
        virtual_seconds: options.virtual_seconds,
        raw_size_bytes,
        runs: vec![normal, raised],
        simulation_seconds: started.elapsed().as_secs_f64(),
    })
}

pub fn table(report: &Report) -> String {
    let mut text = format!(
        "{} ({}), {} MiB raw, 4 KiB random writes at queue depth {}, {} virtual seconds (simulated in {:.1} s)\n",
        report.drive.name,
        report.drive.description,
        report.raw_size_bytes >> 20,
        report.queue_depth,
        report.virtual_seconds,
        report.simulation_seconds
    );
    text += &format!(
        "{:<22} {:>10} {:>12} {:>12} {:>8} {:>10} {:>9} {:>9}\n",
        "run", "spare", "fresh IOPS", "steady IOPS", "drop", "1st drop", "WA", "greedy WA"
    );
    for run in &report.runs {
        text += &format!(
            "{:<22} {:>9.1}% {:>12.0} {:>12.0} {:>7.1}x {:>9} {:>9.2} {:>9.2}\n",
            run.name,
            run.total_spare_fraction * 100.0,
            run.fresh_iops,
            run.steady_iops,
            run.fresh_iops / run.steady_iops.max(1e-9),
            run.first_drop_second.map_or("-".to_string(), |second| format!("{second} s")),
            run.steady_write_amplification,
            run.analytic_greedy_write_amplification
        );
    }
    text += &format!("steady IOPS with raised spare ÷ normal spare: {:.2}\n", report.steady_gap);
    text
}

/// IOPS each virtual second of both runs, as dots (the seed's scatter charts).
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
    let peak = report.runs.iter().flat_map(|run| run.iops_per_second.iter()).copied().max().unwrap_or(1) as f64 * 1.1;
    let caption =
        format!("Write saturation, {} (simulated): 4 KiB random writes, QD {}", report.drive.name, report.queue_depth);
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..report.virtual_seconds as f64, 0f64..peak)
        .map_err(failed)?;
    crate::chart::draw_axes(&mut chart, "virtual seconds", "IOPS")?;
    for (run, color) in report.runs.iter().zip([RED, BLUE]) {
        chart
            .draw_series(
                run.iops_per_second
                    .iter()
                    .enumerate()
                    .map(|(second, &iops)| Circle::new((second as f64 + 0.5, iops as f64), 1, color.filled())),
            )
            .map_err(failed)?
            .label(format!("{}: {:.1} % of the NAND never written", run.name, run.total_spare_fraction * 100.0))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(failed)
}
