//! Response time against queue depth (seed 002): a 70/30 read/write mix of 4 KiB and
//! 8 KiB random requests at queue depths 1, 2, 4, ... 64; for each: IOPS, mean, p50, p99,
//! p99.9 and maximum response time, and the "average maximum" (the mean of the maxima of
//! consecutive 10-second intervals). A chart of mean and average maximum against depth.

use crate::run::{self, Data, Pattern, RunReport, Workload};
use crate::target::{Durability, Target};
use serde::Serialize;
use std::time::Duration;

#[derive(Clone, Debug, Serialize)]
pub struct Options {
    pub queue_depths: Vec<usize>,
    pub read_percent: u32,
    pub block_sizes_bytes: Vec<usize>,
    pub duration_per_depth: Duration,
    pub region_bytes: u64,
    pub data: Data,
    /// What every write waits for (a FUA write, or a flush after it).
    pub durability: Durability,
    pub seed: u64,
}

/// Queue depths 1 to 64, doubling.
pub fn default_queue_depths() -> Vec<usize> {
    (0..=6).map(|shift| 1 << shift).collect()
}

#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub queue_depth: usize,
    pub iops: f64,
    /// Over reads and writes together (nanoseconds).
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p99_9_ns: u64,
    pub max_ns: u64,
    pub average_maximum_ns: f64,
    pub run: RunReport,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub target: String,
    pub options: Options,
    pub points: Vec<Point>,
}

pub fn run(target: &dyn Target, options: &Options, progress: &dyn Fn(&str, f64)) -> Result<Report, String> {
    if options.queue_depths.is_empty() {
        return Err("no queue depths".into());
    }
    let workload = |queue_depth: usize| Workload {
        read_percent: options.read_percent,
        block_sizes_bytes: options.block_sizes_bytes.clone(),
        pattern: Pattern::Random,
        zipf_exponent: None,
        region_offset_bytes: 0,
        region_bytes: options.region_bytes,
        data: options.data,
        threads: 1,
        queue_depth,
        duration: options.duration_per_depth,
        write_limit_bytes: None,
        durability: options.durability,
        seed: options.seed ^ queue_depth as u64,
    };
    for &depth in &options.queue_depths {
        workload(depth).check(target)?;
    }
    let mut points = Vec::new();
    for (index, &depth) in options.queue_depths.iter().enumerate() {
        progress(&format!("queue depth {depth}"), index as f64 / options.queue_depths.len() as f64);
        let report = run::run(target, &workload(depth), &|_| {})?;
        points.push(point(depth, report));
    }
    Ok(Report { target: target.describe(), options: options.clone(), points })
}

/// Reads and writes together: counts add; percentiles and the average maximum are taken
/// from the direction with more requests (the reads, in a 70/30 mix) except the maxima,
/// which are the larger of the two.
fn point(queue_depth: usize, run: RunReport) -> Point {
    let (read, write) = (&run.read, &run.write);
    let total = (read.total_ios + write.total_ios).max(1) as f64;
    let mean_ns = (read.lat_ns.mean * read.total_ios as f64 + write.lat_ns.mean * write.total_ios as f64) / total;
    let major = if read.total_ios >= write.total_ios { read } else { write };
    let percentile = |key: &str| {
        [read, write]
            .iter()
            .filter(|direction| direction.total_ios > 0)
            .map(|direction| direction.lat_ns.percentile.get(key).copied().unwrap_or(0))
            .max()
            .unwrap_or(0)
    };
    Point {
        queue_depth,
        iops: run.total_iops(),
        mean_ns,
        p50_ns: major.lat_ns.percentile.get("50.000000").copied().unwrap_or(0),
        p99_ns: percentile("99.000000"),
        p99_9_ns: percentile("99.900000"),
        max_ns: read.lat_ns.max.max(write.lat_ns.max),
        average_maximum_ns: read.lat_ns.average_maximum.max(write.lat_ns.average_maximum),
        run,
    }
}

/// SVG chart: mean and average-maximum response time (ms, log scale) against queue depth.
pub fn chart(report: &Report, path: &std::path::Path) -> Result<(), String> {
    crate::render_chart!(path, (900, 500), |root| draw(&root, report))
}

fn draw<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    report: &Report,
) -> Result<(), String> {
    use crate::chart::failed;
    use plotters::prelude::*;
    root.fill(&WHITE).map_err(failed)?;
    let to_ms = |nanoseconds: f64| (nanoseconds / 1e6).max(1e-4);
    let highest = report.points.iter().map(|point| to_ms(point.average_maximum_ns)).fold(1e-3, f64::max) * 2.0;
    let lowest = report.points.iter().map(|point| to_ms(point.mean_ns)).fold(highest, f64::min) / 2.0;
    // Depths on a log2 axis: every depth run gets its tick, up to the deepest.
    let deepest = report.points.iter().map(|point| point.queue_depth).max().unwrap_or(1) as f64;
    let last = deepest.log2();
    let mut chart = ChartBuilder::on(root)
        .caption(format!("response time against queue depth: {}", report.target), ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.2f64..last + 0.2, (lowest..highest).log_scale())
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc("queue depth (log)")
        .y_desc("response time, ms (log)")
        .x_labels(last.ceil() as usize + 1)
        .x_label_formatter(&|x| if x.fract().abs() < 1e-9 { crate::chart::tick(&x.exp2()) } else { String::new() })
        .y_label_formatter(&crate::chart::tick)
        .draw()
        .map_err(failed)?;
    // The average maximum needs whole 10 s intervals; a shorter run has only its maximum.
    let maximum_label = if report.options.duration_per_depth >= crate::run::MAXIMUM_INTERVAL {
        "average maximum (10 s intervals)"
    } else {
        "maximum (runs shorter than 10 s)"
    };
    for (label, color, pick) in [
        ("mean", BLUE, (|point: &Point| point.mean_ns) as fn(&Point) -> f64),
        (maximum_label, RED, |point: &Point| point.average_maximum_ns),
    ] {
        chart
            .draw_series(LineSeries::new(
                report.points.iter().map(|point| ((point.queue_depth as f64).log2(), to_ms(pick(point)))),
                color.stroke_width(2),
            ))
            .map_err(failed)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_depths_double_from_one_to_sixty_four() {
        assert_eq!(default_queue_depths(), vec![1, 2, 4, 8, 16, 32, 64]);
    }
}
