//! The plan as seed 001's tables lay it out: one row per quantity, one column per
//! topology.

use crate::{Basis, Column, Plan};

const LABEL_WIDTH: usize = 30;
const COLUMN_WIDTH: usize = 12;

fn thousands(value: f64) -> String {
    let rounded = value.round() as i128;
    let digits = rounded.unsigned_abs().to_string();
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    if rounded < 0 {
        format!("-{grouped}")
    } else {
        grouped
    }
}

fn row(text: &mut String, label: &str, columns: &[Column], cell: impl Fn(&Column) -> String) {
    text.push_str(&format!("{label:<LABEL_WIDTH$}"));
    for column in columns {
        text.push_str(&format!("{:>COLUMN_WIDTH$}", cell(column)));
    }
    text.push('\n');
}

fn optional(value: Option<f64>, format: impl Fn(f64) -> String) -> String {
    value.map_or_else(|| "n/a".to_string(), format)
}

/// The plan as text.
pub fn table(plan: &Plan) -> String {
    let (drive, build) = (&plan.drive, &plan.build);
    let columns = &plan.columns;
    let mut text = format!(
        "{} × {} ({} GB, {}){}\n",
        build.drive_count,
        drive.name,
        thousands(drive.size_gigabytes),
        match (drive.erase_cycles, drive.drive_writes_per_day) {
            (Some(cycles), _) => format!(
                "{} erase cycles, drive write amplification {}",
                thousands(cycles),
                plan.drive_write_amplification.map_or("n/a".into(), |amplification| format!("{amplification:.2}"))
            ),
            (None, Some(rating)) => format!("rated {rating} drive writes a day"),
            (None, None) => "endurance not given".into(),
        },
        if drive.source.is_empty() { String::new() } else { format!("\n  source: {}", drive.source) },
    );
    text.push_str(&format!(
        "stripelog: {:.0} % spare, write amplification {:.2}{}; compression {}:1; {} RAID-50/60 groups; {} GB written a day\n\n",
        build.stripelog_spare_fraction * 100.0,
        plan.stripelog_write_amplification,
        if build.stripelog_write_amplification.is_some() { "" } else { " (1 ÷ spare: the seeds' wear coefficient)" },
        build.compression_ratio,
        build.raid_group_count,
        thousands(build.daily_writes_gigabytes),
    ));
    let heads: Vec<(&str, &str)> = columns
        .iter()
        .map(|column| {
            let (kind, level) = column.name.split_once(' ').unwrap_or((column.name, ""));
            (kind, level.trim_end_matches(" compressed"))
        })
        .collect();
    text.push_str(&" ".repeat(LABEL_WIDTH));
    for (column, (kind, _)) in columns.iter().zip(&heads) {
        let kind = if kind == &"stripelog" { "log" } else { kind };
        let kind = if column.name.ends_with("compressed") { format!("{kind} compr") } else { kind.to_string() };
        text.push_str(&format!("{kind:>COLUMN_WIDTH$}"));
    }
    text.push('\n');
    text.push_str(&" ".repeat(LABEL_WIDTH));
    for (_, level) in &heads {
        text.push_str(&format!("{level:>COLUMN_WIDTH$}"));
    }
    text.push('\n');
    row(&mut text, "gross surface, GB", columns, |column| thousands(column.gross_gigabytes));
    row(&mut text, "landable surface, GB", columns, |column| thousands(column.landable_gigabytes));
    row(&mut text, "chassis cost", columns, |column| thousands(column.chassis_cost));
    row(&mut text, "media cost", columns, |column| thousands(column.media_cost));
    row(&mut text, "licence", columns, |column| {
        if column.licence_cost > 0.0 {
            thousands(column.licence_cost)
        } else {
            "-".into()
        }
    });
    row(&mut text, "total build cost", columns, |column| thousands(column.total_cost));
    row(&mut text, "cost per addressable GB", columns, |column| format!("{:.2}", column.cost_per_gigabyte));
    row(&mut text, "RAID amplification", columns, |column| format!("{:.3}", column.raid_amplification));
    // With a rating the write amplification is in the rating; with no endurance and no
    // figure for the drive, its random-write amplification is unknown.
    let rated = drive.erase_cycles.is_none() && drive.drive_writes_per_day.is_some();
    row(&mut text, "write amplification", columns, |column| {
        let full_stripes = column.topology.writes_full_stripes();
        if rated {
            "in rating".into()
        } else if !full_stripes && plan.drive_write_amplification.is_none() {
            "n/a".into()
        } else {
            format!("{:.2}", column.write_amplification)
        }
    });
    row(&mut text, "4KB random write IOPS", columns, |column| {
        let mark = if column.random_write_iops_basis == Basis::Measured { "*" } else { "" };
        optional(column.random_write_iops, |iops| format!("{}{mark}", thousands(iops)))
    });
    row(&mut text, "70/30 read/write IOPS", columns, |column| optional(column.mixed_70_30_iops, thousands));
    row(&mut text, "overwrites per day", columns, |column| {
        optional(column.overwrites_per_day, |value| format!("{value:.2}"))
    });
    row(&mut text, "life at the daily writes, years", columns, |column| {
        optional(column.life_years, |value| format!("{value:.1}"))
    });
    if columns.iter().any(|column| column.random_write_iops_basis == Basis::Measured) {
        text.push_str("* measured (an input), not computed\n");
    }
    if rated {
        text.push_str(
            "a drive-writes-per-day rating includes the drive's own write amplification; as seed 001 (Table 7) does, \
             full-stripe and stripelog writes are counted against it without it\n",
        );
    }
    text.push_str(&format!(
        "overwrites per day: of the landable space, for {} years; linear columns write whole stripes (no drive write amplification)\n",
        build.service_years
    ));
    text
}
