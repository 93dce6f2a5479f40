//! The suite's report: `report.json` (every figure, its peer, the ratio, the commands, the
//! machine and the members' own speeds) and `report.md` (a table per part, the commands
//! below it, and the charts), with `ratios.svg` drawing every ratio against its bar.

use super::{Figure, Report};
use std::fmt::Write as _;
use std::path::Path;

pub fn write(report: &Report, output: &Path) -> Result<(), String> {
    let json = serde_json::to_string_pretty(report).map_err(|error| error.to_string())?;
    let path = output.join("report.json");
    std::fs::write(&path, json + "\n").map_err(|error| format!("{}: {error}", path.display()))?;
    let has_ratios = report.parts.iter().flat_map(|part| &part.figures).any(|figure| figure.ratio.is_some());
    if has_ratios {
        crate::chart::check(&output.join("ratios.svg"))?;
        crate::render_chart!(&output.join("ratios.svg"), (1000, 120 + 28 * ratio_count(report) as u32), |root| {
            draw_ratios(&root, report)
        })?;
    }
    let path = output.join("report.md");
    std::fs::write(&path, markdown(report, has_ratios)).map_err(|error| format!("{}: {error}", path.display()))
}

fn ratio_count(report: &Report) -> usize {
    report.parts.iter().flat_map(|part| &part.figures).filter(|figure| figure.ratio.is_some()).count()
}

/// A figure's value as a table shows it.
fn value(value: f64, unit: &str) -> String {
    let number = if value.abs() >= 100.0 {
        let whole = format!("{value:.0}");
        // Thin spaces between thousands, as the rest of the docs write them.
        let digits: Vec<char> = whole.chars().collect();
        let mut grouped = String::new();
        for (index, digit) in digits.iter().enumerate() {
            if index > 0
                && (digits.len() - index).is_multiple_of(3)
                && digit.is_ascii_digit()
                && digits[index - 1].is_ascii_digit()
            {
                grouped.push('\u{202f}');
            }
            grouped.push(*digit);
        }
        grouped
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    if unit.is_empty() {
        number
    } else {
        format!("{number} {unit}")
    }
}

fn bar_text(figure: &Figure) -> String {
    match &figure.bar {
        None => String::new(),
        Some(bar) => {
            let sign = if bar.direction == "at least" { "≥" } else { "≤" };
            let goal = bar.goal.map(|goal| format!(", goal {goal}")).unwrap_or_default();
            let verdict = if bar.met { "met" } else { "**missed**" };
            format!("{sign} {}{goal}: {verdict}", bar.threshold)
        }
    }
}

pub fn markdown(report: &Report, has_ratios: bool) -> String {
    let mut text = String::new();
    let machine = &report.machine;
    let _ = writeln!(text, "# stripelog benchmark suite report\n");
    let _ = writeln!(
        text,
        "Run {} on {} cores ({}), {:.1} GiB of memory, Linux {}; stripelog {}, {}, nbdkit {}. Each measured cell ran \
         {:.0} s; the whole suite {:.0} s.\n",
        report.started_utc,
        machine.cores,
        machine.cpu,
        machine.memory_bytes as f64 / (1u64 << 30) as f64,
        machine.kernel,
        machine.stripelog_version,
        machine.fio_version,
        machine.nbdkit_version,
        report.cell_seconds,
        report.seconds
    );
    let _ = writeln!(text, "```\n{}\n```\n", report.command);
    let _ = writeln!(text, "## Members: {}\n", report.member_kind);
    if let Some(testbed) = &report.testbed {
        let speed = &testbed.speed;
        let _ = writeln!(
            text,
            "Each drive is a loop device over a file in /dev/shm, throttled by the blkio cgroup {} to {} MB/s \
             read, {} MB/s write, {} read IOPS, {} write IOPS; the suite and everything it starts run in that \
             cgroup. Drives: {}. The throttle charges an io_uring request that it holds back twice (its \
             non-blocking attempt and its retry from the kernel's workers): the engine sends every request to a \
             throttled member straight to the workers, and fio's io_uring runs here do the same (`--force_async=1`), \
             so each is charged once, as libaio's are.\n",
            testbed.cgroup,
            speed.read_bytes_per_second / 1_000_000,
            speed.write_bytes_per_second / 1_000_000,
            speed.read_iops,
            speed.write_iops,
            testbed.drives.join(", ")
        );
    }
    let _ = writeln!(text, "Measured by fio at the start of the run, all members at once:\n");
    let _ = writeln!(
        text,
        "| member | what | size | sequential write | sequential read | write, io_uring | read, io_uring |"
    );
    let _ = writeln!(text, "|---|---|---:|---:|---:|---:|---:|");
    for member in &report.array.members {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} |",
            member.path,
            member.description,
            crate::format_size(member.size_bytes),
            value(member.sequential_write_bytes_per_second / 1e6, "MB/s"),
            value(member.sequential_read_bytes_per_second / 1e6, "MB/s"),
            value(member.sequential_write_io_uring_bytes_per_second / 1e6, "MB/s"),
            value(member.sequential_read_io_uring_bytes_per_second / 1e6, "MB/s")
        );
    }
    let array = &report.array;
    let _ = writeln!(
        text,
        "| all | | | {} | {} | | |\n\nSequential: 1 MiB O_DIRECT requests at depth 4 per member through libaio (the whole \
         member written once, then read for the cell's length): the members' own speeds, the bounds the figures are \
         judged against; then the same through io_uring as the engine submits. 4 KiB random at depth 32 over all members: {} reads/s, {} writes/s.\n",
        value(array.sequential_write_bytes_per_second / 1e6, "MB/s"),
        value(array.sequential_read_bytes_per_second / 1e6, "MB/s"),
        value(array.random_read_iops_depth_32, ""),
        value(array.random_write_iops_depth_32, "")
    );
    let _ = writeln!(text, "<details><summary>fio commands</summary>\n\n```");
    for command in &array.commands {
        let _ = writeln!(text, "{command}");
    }
    let _ = writeln!(text, "```\n</details>\n");
    if has_ratios {
        let _ = writeln!(text, "![every ratio against its peer, with its bar](ratios.svg)\n");
    }
    for part in &report.parts {
        let _ = writeln!(text, "## {} (`{}`)\n", part.title, part.part_name());
        if let Some(error) = &part.error {
            let _ = writeln!(text, "**The part failed:** {error}\n");
        }
        if !part.figures.is_empty() {
            let _ = writeln!(text, "| figure | stripelog | peer | peer's figure | ratio | bar |");
            let _ = writeln!(text, "|---|---:|---|---:|---:|---|");
            for figure in &part.figures {
                let (peer, peer_value) = figure.peer.as_ref().map_or((String::new(), String::new()), |peer| {
                    (peer.name.clone(), value(peer.value, &figure.unit))
                });
                let _ = writeln!(
                    text,
                    "| {} | {} | {} | {} | {} | {} |",
                    figure.name,
                    value(figure.value, &figure.unit),
                    peer,
                    peer_value,
                    figure.ratio.map(|ratio| format!("{ratio:.3}")).unwrap_or_default(),
                    bar_text(figure)
                );
            }
            let _ = writeln!(text);
        }
        let _ = writeln!(
            text,
            "Limit: {}. The part took {:.0} s with {:.2} cores busy on average.\n",
            part.limit, part.seconds, part.cores_busy
        );
        for note in &part.notes {
            let _ = writeln!(text, "- {note}");
        }
        if !part.notes.is_empty() {
            let _ = writeln!(text);
        }
        for chart in &part.charts {
            let _ = writeln!(text, "![{chart}]({chart})\n");
        }
        let mut commands: Vec<&str> = Vec::new();
        for figure in &part.figures {
            for command in [Some(figure.command.as_str()), figure.peer.as_ref().map(|peer| peer.command.as_str())]
                .into_iter()
                .flatten()
            {
                if !command.is_empty() && !commands.contains(&command) {
                    commands.push(command);
                }
            }
        }
        if !commands.is_empty() {
            let _ = writeln!(text, "<details><summary>commands</summary>\n\n```");
            for command in commands {
                let _ = writeln!(text, "{command}");
            }
            let _ = writeln!(text, "```\n</details>\n");
        }
    }
    text
}

impl super::PartReport {
    fn part_name(&self) -> &'static str {
        self.part.name()
    }
}

fn draw_ratios<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    report: &Report,
) -> Result<(), String> {
    use crate::chart::failed;
    use plotters::prelude::*;
    root.fill(&WHITE).map_err(failed)?;
    let rows: Vec<(String, &Figure)> = report
        .parts
        .iter()
        .flat_map(|part| {
            part.figures.iter().map(move |figure| (format!("{}: {}", part.part.name(), figure.name), figure))
        })
        .filter(|(_, figure)| figure.ratio.is_some())
        .collect();
    let widest = rows
        .iter()
        .map(|(_, figure)| figure.ratio.unwrap_or(0.0).max(figure.bar.as_ref().map_or(0.0, |bar| bar.threshold)))
        .fold(1.0, f64::max)
        * 1.1;
    let count = rows.len() as f64;
    let mut chart = ChartBuilder::on(root)
        .caption("stripelog ÷ its peer, measured in the same run (line: the bar)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(0)
        .build_cartesian_2d(0f64..widest, 0f64..count)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("ratio")
        .x_label_formatter(&crate::chart::tick)
        .draw()
        .map_err(failed)?;
    for (index, (label, figure)) in rows.iter().enumerate() {
        let y = count - index as f64 - 1.0;
        let ratio = figure.ratio.unwrap_or(0.0);
        let colour = match &figure.bar {
            Some(bar) if bar.met => GREEN.mix(0.6),
            Some(_) => RED.mix(0.6),
            None => BLUE.mix(0.4),
        };
        chart.draw_series([Rectangle::new([(0.0, y + 0.15), (ratio, y + 0.85)], colour.filled())]).map_err(failed)?;
        if let Some(bar) = &figure.bar {
            chart
                .draw_series(LineSeries::new(
                    [(bar.threshold, y + 0.05), (bar.threshold, y + 0.95)],
                    BLACK.stroke_width(2),
                ))
                .map_err(failed)?;
        }
        chart
            .draw_series([Text::new(format!("{label}: {ratio:.2}"), (widest * 0.01, y + 0.7), ("sans-serif", 13))])
            .map_err(failed)?;
    }
    Ok(())
}
