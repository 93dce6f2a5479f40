//! `stripelog bench saturate TARGET`: the SNIA PTS write-saturation run (seed 004) on any
//! target — optional preconditioning (one sequential pass over the whole target), then
//! 4 KiB random writes over all of it, IOPS recorded every second, until a written
//! volume, a time limit or (optionally) the steady state by the SNIA rule over rounds.
//! The engine-specific experiment with cleaner figures is `saturate::run`.

use crate::run::{self, Data, DirectionReport, Pattern, Second, Workload};
use crate::saturate::{steady_state, SteadyState};
use crate::target::Target;
use serde::Serialize;
use std::time::Duration;

/// Request size of the random writes.
pub const WRITE_SIZE_BYTES: usize = 4096;
/// Request size and depth of the sequential preconditioning pass.
const PRECONDITION_BLOCK_BYTES: usize = 1 << 20;
const PRECONDITION_QUEUE_DEPTH: usize = 4;

#[derive(Clone, Debug)]
pub struct Options {
    /// One sequential pass over the whole target first (SNIA's workload-independent
    /// preconditioning).
    pub precondition: bool,
    pub threads: usize,
    pub queue_depth: usize,
    /// Stop after writing this many bytes of random writes…
    pub write_limit_bytes: u64,
    /// …or after this long…
    pub duration_limit: Duration,
    /// …or, when asked, once the IOPS of consecutive rounds of this length are steady.
    pub round: Duration,
    pub stop_at_steady_state: bool,
    pub data: Data,
    pub seed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Preconditioning {
    pub seconds: f64,
    pub bytes_written: u64,
    pub bw_bytes: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub target: String,
    pub size_bytes: u64,
    pub threads: usize,
    pub queue_depth: usize,
    pub preconditioning: Option<Preconditioning>,
    pub seconds: f64,
    pub bytes_written: u64,
    /// Random writes completed each second, as a rate: the run's last, partial second's
    /// over its own length (dropped when shorter than a quarter of a second).
    pub iops_per_second: Vec<f64>,
    /// Where each entry of `iops_per_second` ends, in seconds from the start: whole
    /// seconds, then the run's end for a partial last one.
    pub seconds_at_end: Vec<f64>,
    /// Bytes of random writes completed by the end of each entry.
    pub bytes_written_by_second: Vec<u64>,
    pub round_seconds: f64,
    /// Mean IOPS of each whole round.
    pub iops_per_round: Vec<f64>,
    pub steady_state: Option<SteadyState>,
    /// "steady state", "written volume" or "time limit".
    pub stopped_by: String,
    pub write: DirectionReport,
}

/// A partial last second shorter than this is not drawn: too short to be a rate.
const PARTIAL_SECOND_MINIMUM_SECONDS: f64 = 0.25;

/// One point of the per-second series.
#[derive(Clone, Debug, PartialEq)]
pub struct SecondPoint {
    /// When the second (or the partial last one) ends, from the start of the run.
    pub end_seconds: f64,
    pub iops: f64,
    pub write_bytes: u64,
}

/// The per-second series of a run that lasted `elapsed_seconds`: each whole second's
/// writes, and the last, partial second's as a rate over its own length (so that a run
/// that ends 0.05 s into a second does not fall to zero), or dropped when it is shorter
/// than a quarter of a second.
pub fn per_second_points(seconds: &[Second], elapsed_seconds: f64) -> Vec<SecondPoint> {
    seconds
        .iter()
        .filter_map(|second| {
            let start = second.second.saturating_sub(1) as f64;
            let end = (second.second as f64).min(elapsed_seconds.max(start));
            let length = end - start;
            // (A run shorter than that keeps its one point: a rate over what there is.)
            let only = seconds.len() == 1 && length > 0.0;
            (length >= 1.0 - 1e-9 || length >= PARTIAL_SECOND_MINIMUM_SECONDS || only).then(|| SecondPoint {
                end_seconds: end,
                iops: second.write_iops as f64 / length,
                write_bytes: second.write_bytes,
            })
        })
        .collect()
}

/// "0-5": the seconds a round or interval covers, in the report's tables. A chart draws
/// each per-second point at the end of its second, so the first at 1, within "0-5".
pub fn span_label(start_seconds: f64, length_seconds: f64) -> String {
    format!("{:.0}-{:.0}", start_seconds, start_seconds + length_seconds)
}

/// Mean IOPS of each whole round of `round_seconds` seconds.
fn rounds(seconds: &[Second], round_seconds: usize) -> Vec<f64> {
    seconds
        .chunks_exact(round_seconds.max(1))
        .map(|round| round.iter().map(|second| second.write_iops as f64).sum::<f64>() / round.len() as f64)
        .collect()
}

pub fn run(target: &dyn Target, options: &Options, progress: &dyn Fn(&str, f64)) -> Result<Report, String> {
    if !target.writable() {
        return Err("the target is read-only; a saturation run writes".into());
    }
    let region_bytes = target.size_bytes() / WRITE_SIZE_BYTES as u64 * WRITE_SIZE_BYTES as u64;
    if region_bytes < PRECONDITION_BLOCK_BYTES as u64 {
        return Err(format!("the target ({} bytes) is smaller than 1 MiB", target.size_bytes()));
    }
    let round_seconds = options.round.as_secs().max(1) as usize;
    let workload = Workload {
        read_percent: 0,
        block_sizes_bytes: vec![WRITE_SIZE_BYTES],
        pattern: Pattern::Random,
        zipf_exponent: None,
        region_offset_bytes: 0,
        region_bytes,
        data: options.data,
        threads: options.threads,
        queue_depth: options.queue_depth,
        duration: options.duration_limit,
        write_limit_bytes: Some(options.write_limit_bytes),
        durability: Default::default(),
        seed: options.seed,
    };
    let preconditioning = if options.precondition {
        let fill_bytes = region_bytes / PRECONDITION_BLOCK_BYTES as u64 * PRECONDITION_BLOCK_BYTES as u64;
        let fill = Workload {
            block_sizes_bytes: vec![PRECONDITION_BLOCK_BYTES],
            pattern: Pattern::Sequential,
            region_bytes: fill_bytes,
            threads: 1,
            queue_depth: PRECONDITION_QUEUE_DEPTH,
            write_limit_bytes: Some(fill_bytes),
            durability: Default::default(),
            seed: options.seed ^ 0xF111,
            ..workload.clone()
        };
        let report = run::run(target, &fill, &|done| progress("preconditioning (sequential fill)", done))?;
        Some(Preconditioning {
            seconds: report.elapsed_seconds,
            bytes_written: report.write.io_bytes,
            bw_bytes: report.write.bw_bytes,
        })
    } else {
        None
    };
    let steady_stop = options.stop_at_steady_state;
    let report = run::run_until(target, &workload, &|done| progress("4 KiB random writes", done), &|seconds| {
        steady_stop && steady_state(&rounds(seconds, round_seconds)).is_some()
    })?;
    let points = per_second_points(&report.seconds, report.elapsed_seconds);
    let iops_per_second: Vec<f64> = points.iter().map(|point| point.iops).collect();
    let seconds_at_end: Vec<f64> = points.iter().map(|point| point.end_seconds).collect();
    let bytes_written_by_second = points
        .iter()
        .scan(0u64, |total, point| {
            *total += point.write_bytes;
            Some(*total)
        })
        .collect();
    // The sampler records the run's last, partial second too; rounds take whole seconds.
    let whole_seconds = (report.elapsed_seconds.floor() as usize).min(report.seconds.len());
    let iops_per_round = rounds(&report.seconds[..whole_seconds], round_seconds);
    let steady = steady_state(&iops_per_round);
    let stopped_by = if report.write.io_bytes >= options.write_limit_bytes {
        "written volume"
    } else if steady_stop && steady.is_some() && report.elapsed_seconds < options.duration_limit.as_secs_f64() {
        "steady state"
    } else {
        "time limit"
    };
    Ok(Report {
        target: report.target.clone(),
        size_bytes: target.size_bytes(),
        threads: options.threads,
        queue_depth: options.queue_depth,
        preconditioning,
        seconds: report.elapsed_seconds,
        bytes_written: report.write.io_bytes,
        iops_per_second,
        seconds_at_end,
        bytes_written_by_second,
        round_seconds: round_seconds as f64,
        iops_per_round,
        steady_state: steady,
        stopped_by: stopped_by.into(),
        write: report.write,
    })
}

/// IOPS against time and against bytes written, in the style of seed 004's saturation
/// plots, with the steady-state level; SVG or PNG by the extension of `path`.
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
    let (top, bottom) = root.split_vertically(350);
    let peak = crate::chart::linear_top(report.iops_per_second.iter().cloned().fold(1.0, f64::max));
    let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
    let written = report.bytes_written_by_second.last().map_or(1e-3, |&bytes| gib(bytes).max(1e-3));
    let seconds = report.seconds_at_end.last().copied().unwrap_or(1.0).max(1.0);
    let caption =
        format!("4 KiB random writes, {} thread(s) × depth {}: {}", report.threads, report.queue_depth, report.target);
    // Points are at the end of each second (the tables' spans end there too).
    let by_time: Vec<(f64, f64)> =
        report.seconds_at_end.iter().copied().zip(report.iops_per_second.iter().copied()).collect();
    let by_volume: Vec<(f64, f64)> = report
        .bytes_written_by_second
        .iter()
        .zip(&report.iops_per_second)
        .map(|(&bytes, &iops)| (gib(bytes), iops))
        .collect();
    for (area, x_range, x_label, points, caption) in [
        (&top, seconds, "seconds", by_time, Some(caption.as_str())),
        (&bottom, written, "GiB written", by_volume, None),
    ] {
        let mut builder = ChartBuilder::on(area);
        if let Some(caption) = caption {
            builder.caption(caption, ("sans-serif", 16));
        }
        let mut chart = builder
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..x_range, 0f64..peak)
            .map_err(failed)?;
        crate::chart::draw_axes(&mut chart, x_label, "write IOPS")?;
        chart
            .draw_series(LineSeries::new(points, &BLUE))
            .map_err(failed)?
            .label("IOPS each second")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        if let Some(steady) = &report.steady_state {
            chart
                .draw_series(LineSeries::new([(0.0, steady.iops), (x_range, steady.iops)], RED.stroke_width(2)))
                .map_err(failed)?
                .label(format!("steady state {:.0} IOPS", steady.iops))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        }
        crate::chart::draw_legend(&mut chart)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(write_iops: u64) -> Second {
        Second { second: 0, read_iops: 0, write_iops, read_bytes: 0, write_bytes: write_iops * 4096 }
    }

    #[test]
    fn a_partial_last_second_is_a_rate_over_its_own_length() {
        let mut seconds: Vec<Second> = [1000, 1000, 8].into_iter().map(second).collect();
        for (index, second) in seconds.iter_mut().enumerate() {
            second.second = index as u64 + 1;
        }
        // 8 writes in the last 0.5 s: 16 IOPS at 2.5 s, not 8 at 3.
        let points = per_second_points(&seconds, 2.5);
        let drawn: Vec<(f64, f64)> = points.iter().map(|point| (point.end_seconds, point.iops)).collect();
        assert_eq!(drawn, vec![(1.0, 1000.0), (2.0, 1000.0), (2.5, 16.0)]);
        // 8 writes in the last 0.05 s: too short to be a rate, not drawn.
        let points = per_second_points(&seconds, 2.05);
        assert_eq!(points.len(), 2);
        // A run that ended on a whole second keeps every second whole.
        assert_eq!(per_second_points(&seconds, 3.0).last().map(|point| point.iops), Some(8.0));
    }

    #[test]
    fn the_tables_spans_end_where_the_chart_draws_their_seconds() {
        let seconds: Vec<Second> = (1..=10).map(|index| Second { second: index, ..second(100) }).collect();
        let points = per_second_points(&seconds, 10.0);
        // The first round, seconds 0-5, holds the points drawn at 1 to 5.
        assert_eq!(span_label(0.0, 5.0), "0-5");
        assert_eq!(points[0].end_seconds, 1.0);
        assert_eq!(points[4].end_seconds, 5.0);
    }

    #[test]
    fn rounds_average_whole_rounds_only() {
        let seconds: Vec<Second> = [10, 20, 30, 40, 50].into_iter().map(second).collect();
        assert_eq!(rounds(&seconds, 2), vec![15.0, 35.0]);
        assert_eq!(rounds(&seconds, 10), Vec::<f64>::new());
    }
}
