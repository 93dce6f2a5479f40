//! The latency distribution of a run (`stripelog bench mix --chart`): each operation's
//! latency at every percentile, from its HDR histogram, drawn against the percentile on
//! the "nines" scale (50, 90, 99, 99.9, …) where the tail that users look at is wide.

use crate::run::RunReport;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Points per nine of the percentile axis (90 → 99 is one nine).
const POINTS_PER_NINE: u32 = 10;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DistributionPoint {
    /// 0 to 100.
    pub percentile: f64,
    pub latency_ns: u64,
}

/// The latency at percentiles spaced evenly in nines, from 0 to the last one the sample
/// count resolves (1 − 1 / count), then 100 (the maximum).
pub fn points(histogram: &Histogram<u64>) -> Vec<DistributionPoint> {
    let count = histogram.len();
    if count == 0 {
        return Vec::new();
    }
    let mut points: Vec<DistributionPoint> = (0..)
        .map(|step: u32| 1.0 - 10f64.powf(-f64::from(step) / f64::from(POINTS_PER_NINE)))
        .take_while(|&quantile| quantile <= 1.0 - 1.0 / count as f64 + 1e-12)
        .map(|quantile| DistributionPoint {
            percentile: quantile * 100.0,
            // (The histogram's quantile 0 is the bottom of its range, not the minimum.)
            latency_ns: if quantile == 0.0 { histogram.min() } else { histogram.value_at_quantile(quantile) },
        })
        .collect();
    points.push(DistributionPoint { percentile: 100.0, latency_ns: histogram.max() });
    points
}

/// Where a percentile goes on the nines axis: 0 → 0, 90 → 1, 99 → 2, 99.9 → 3. 100 goes
/// one nine beyond the highest one resolved (`last_nines`).
pub fn nines(percentile: f64, last_nines: f64) -> f64 {
    if percentile >= 100.0 {
        return last_nines;
    }
    -(1.0 - percentile / 100.0).log10()
}

/// The percentile at `x` on the nines axis, as a tick: "0", "90", "99", "99.9", "99.99",
/// and "max" at `last_nines`.
fn nines_tick(x: f64, last_nines: f64) -> String {
    if (x - x.round()).abs() > 1e-9 || x < 0.0 {
        return String::new();
    }
    if (x - last_nines).abs() < 1e-9 {
        return "max".into();
    }
    let nines = x.round() as usize;
    match nines {
        0 => "0".into(),
        1 => "90".into(),
        _ => format!("99{}{}", if nines > 2 { "." } else { "" }, "9".repeat(nines.saturating_sub(2))),
    }
}

/// The latency distribution of each operation that ran (SVG or PNG by extension).
pub fn chart(report: &RunReport, path: &std::path::Path) -> Result<(), String> {
    crate::render_chart!(path, (900, 500), |root| draw(&root, report))
}

fn draw<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    report: &RunReport,
) -> Result<(), String> {
    use crate::chart::failed;
    use plotters::prelude::*;
    root.fill(&WHITE).map_err(failed)?;
    let directions: Vec<(&str, &[DistributionPoint], RGBColor)> =
        [("read", &report.read, BLUE), ("write", &report.write, RED)]
            .into_iter()
            .filter(|(_, direction, _)| !direction.lat_ns.distribution.is_empty())
            .map(|(name, direction, color)| (name, direction.lat_ns.distribution.as_slice(), color))
            .collect();
    let resolved = |points: &[DistributionPoint]| {
        points
            .iter()
            .filter(|point| point.percentile < 100.0)
            .map(|point| nines(point.percentile, 0.0))
            .fold(0.0, f64::max)
    };
    let last_nines = directions.iter().map(|(_, points, _)| resolved(points)).fold(1.0, f64::max).ceil() + 1.0;
    let to_us = |nanoseconds: u64| (nanoseconds as f64 / 1e3).max(0.1);
    let all = || directions.iter().flat_map(|(_, points, _)| points.iter().map(|point| to_us(point.latency_ns)));
    let highest = all().fold(1.0, f64::max);
    let lowest = (all().fold(highest, f64::min) / 1.5).max(0.1);
    let top = crate::chart::log_top(lowest, highest * 1.2);
    let mut chart = ChartBuilder::on(root)
        .caption(format!("latency distribution: {}", report.target), ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..last_nines, (lowest..top).log_scale())
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc("percentile (each step one more nine; the last point is the maximum)")
        .y_desc("latency, µs (log)")
        .x_labels(last_nines as usize + 1)
        .x_label_formatter(&|x| nines_tick(*x, last_nines))
        .y_label_formatter(&crate::chart::tick)
        .draw()
        .map_err(failed)?;
    for (name, points, color) in &directions {
        let color = *color;
        let line: Vec<(f64, f64)> =
            points.iter().map(|point| (nines(point.percentile, last_nines), to_us(point.latency_ns))).collect();
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(failed)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    crate::chart::draw_legend(&mut chart)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_distribution_runs_from_the_minimum_to_the_maximum_in_nines() {
        let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        // 1000 latencies: 1 µs to 1000 µs.
        for microseconds in 1..=1000u64 {
            histogram.record(microseconds * 1000).unwrap();
        }
        let points = points(&histogram);
        assert_eq!(points.first(), Some(&DistributionPoint { percentile: 0.0, latency_ns: histogram.min() }));
        assert_eq!(points.last(), Some(&DistributionPoint { percentile: 100.0, latency_ns: histogram.max() }));
        // Three nines resolved by 1000 samples: 0 to 99.9 in 30 steps, then the maximum.
        assert_eq!(points.len(), 3 * POINTS_PER_NINE as usize + 2);
        let at = |percentile: f64| {
            points.iter().find(|point| (point.percentile - percentile).abs() < 1e-6).map(|point| point.latency_ns)
        };
        assert_eq!(at(90.0), Some(histogram.value_at_quantile(0.9)));
        assert_eq!(at(99.0), Some(histogram.value_at_quantile(0.99)));
        assert!(points.windows(2).all(|pair| pair[0].latency_ns <= pair[1].latency_ns));
        assert!(super::points(&Histogram::<u64>::new(3).unwrap()).is_empty());
    }

    #[test]
    fn the_nines_axis_puts_each_nine_one_step_on() {
        assert!((nines(90.0, 5.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9, 5.0) - 3.0).abs() < 1e-9);
        assert_eq!(nines(100.0, 5.0), 5.0);
        assert_eq!(nines_tick(0.0, 5.0), "0");
        assert_eq!(nines_tick(1.0, 5.0), "90");
        assert_eq!(nines_tick(2.0, 5.0), "99");
        assert_eq!(nines_tick(4.0, 5.0), "99.99");
        assert_eq!(nines_tick(5.0, 5.0), "max");
        assert_eq!(nines_tick(2.5, 5.0), "");
    }
}
