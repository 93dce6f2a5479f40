//! `stripelog plan`: the seeds' capacity, cost, endurance and IOPS arithmetic for a drive
//! set (crates/planner, docs/planner.md). The drive and build come from a preset, a TOML
//! file, or flags; flags override the other two.

use crate::units;
use clap::Args;
use std::path::PathBuf;
use stripelog_planner::{presets, Build, Drive, MeasuredIops, PlanInput};

#[derive(Args)]
pub(crate) struct PlanArguments {
    /// A drive of the seeds' tables in the build its seed uses (see --list-presets).
    #[arg(long)]
    preset: Option<String>,
    /// A TOML file with [drive] and [build] tables (keys as in --json's "drive" and "build").
    #[arg(long, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// List the presets and exit.
    #[arg(long)]
    list_presets: bool,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,

    /// Drive name.
    #[arg(long, help_heading = "Drive")]
    drive_name: Option<String>,
    /// User capacity of one drive: 960 (GB), 960GB, 1TB (= 1 000 GB, as drives are sold).
    #[arg(long, value_parser = parse_gigabytes, help_heading = "Drive")]
    drive_size: Option<f64>,
    /// NAND behind one drive, the endurance budget (default: the user capacity).
    #[arg(long, value_parser = parse_gigabytes, help_heading = "Drive")]
    raw_drive_size: Option<f64>,
    /// Price of one drive.
    #[arg(long, help_heading = "Drive")]
    price: Option<f64>,
    /// Rated erase (P/E) cycles of its flash.
    #[arg(long, help_heading = "Drive", conflicts_with = "drive_writes_per_day")]
    erase_cycles: Option<f64>,
    /// Rated drive writes per day over --years (instead of erase cycles).
    #[arg(long, help_heading = "Drive")]
    drive_writes_per_day: Option<f64>,
    /// The drive's internal write amplification under random writes.
    #[arg(long, help_heading = "Drive", conflicts_with = "drive_spare")]
    drive_write_amplification: Option<f64>,
    /// The drive's free space, instead: write amplification = 1 ÷ free (seed 000).
    #[arg(long, value_parser = units::parse_fraction_ppm, help_heading = "Drive")]
    drive_spare: Option<u32>,
    /// 4 KiB random read IOPS of one drive.
    #[arg(long, help_heading = "Drive")]
    read_iops: Option<f64>,
    /// 4 KiB random write IOPS of one drive.
    #[arg(long, help_heading = "Drive")]
    write_iops: Option<f64>,
    /// Linear write speed of one drive, MB/s.
    #[arg(long, help_heading = "Drive")]
    linear_write: Option<f64>,

    /// Number of drives.
    #[arg(long, help_heading = "Build")]
    drives: Option<u32>,
    /// Chassis, controllers and the rest of the build.
    #[arg(long, help_heading = "Build")]
    chassis_cost: Option<f64>,
    /// Member I/Os a second the controllers pass.
    #[arg(long, help_heading = "Build")]
    controller_iops: Option<f64>,
    /// Host writes a day: 2048 (GB), 500GB, 2TB.
    #[arg(long, value_parser = parse_gigabytes, help_heading = "Build")]
    daily_writes: Option<f64>,
    /// Assumed compression ratio of the data (2 = 2:1).
    #[arg(long, help_heading = "Build", conflicts_with = "compression_of")]
    compression: Option<f64>,
    /// The compression ratio measured on a volume holding the data: the JSON that
    /// `stripelog info --json` printed for it (its "compression"."ratio").
    #[arg(long, value_name = "INFO.json", help_heading = "Build")]
    compression_of: Option<PathBuf>,
    /// stripelog's spare fraction of its data space.
    #[arg(long, value_parser = units::parse_fraction_ppm, help_heading = "Build")]
    spare: Option<u32>,
    /// stripelog's cleaning write amplification (default: 1 ÷ spare, the seeds' coefficient).
    #[arg(long, help_heading = "Build")]
    log_write_amplification: Option<f64>,
    /// Software cost per started TiB of stripelog's landable space, plain and compressed.
    #[arg(long, value_name = "PLAIN,COMPRESSED", help_heading = "Build")]
    licence_per_tib: Option<String>,
    /// RAID-50/60 groups.
    #[arg(long, help_heading = "Build")]
    groups: Option<u32>,
    /// Service life the overwrites per day are counted over, years.
    #[arg(long, help_heading = "Build")]
    years: Option<f64>,
    /// stripelog's measured random-write IOPS (RAID-5, RAID-6, and both compressed),
    /// printed instead of the computed figure and marked as measured.
    #[arg(long, value_name = "R5,R6,R5C,R6C", help_heading = "Build")]
    measured_iops: Option<String>,
}

fn numbers<const N: usize>(text: &str, what: &str) -> Result<[f64; N], String> {
    let values: Vec<f64> = text
        .split(',')
        .map(|part| part.trim().parse::<f64>().map_err(|_| format!("{what}: '{part}' is not a number")))
        .collect::<Result<_, _>>()?;
    values.try_into().map_err(|_| format!("{what}: expected {N} comma-separated numbers, got '{text}'"))
}

const BYTES_PER_GIGABYTE: f64 = 1e9;

/// A capacity in gigabytes: a bare number is gigabytes; with a unit, decimal or binary as
/// written (1TB = 1 000 GB, 1TiB = 1 099.5 GB).
fn parse_gigabytes(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(gigabytes) => Ok(gigabytes),
        Err(_) => units::parse_size(text).map(|bytes| bytes as f64 / BYTES_PER_GIGABYTE),
    }
}

/// The starting point: a preset, a file, or a blank drive in seed 001's chassis.
fn base(arguments: &PlanArguments) -> Result<PlanInput, String> {
    match (&arguments.preset, &arguments.config) {
        (Some(_), Some(_)) => Err("give --preset or --config, not both".into()),
        (Some(name), None) => presets::preset(name)
            .ok_or_else(|| format!("no preset '{name}'; the presets are: {}", presets::NAMES.join(", "))),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
            PlanInput::from_toml(&text).map_err(|error| format!("{}: {error}", path.display()))
        }
        (None, None) => {
            let missing: Vec<&str> = [
                ("--drive-size", arguments.drive_size.is_none()),
                ("--price", arguments.price.is_none()),
                ("--write-iops", arguments.write_iops.is_none()),
            ]
            .iter()
            .filter(|(_, missing)| *missing)
            .map(|(flag, _)| *flag)
            .collect();
            if !missing.is_empty() {
                return Err(format!("without --preset or --config, give at least {}", missing.join(", ")));
            }
            Ok(PlanInput {
                drive: Drive {
                    name: "drive".into(),
                    size_gigabytes: 0.0,
                    raw_size_gigabytes: None,
                    price: 0.0,
                    erase_cycles: None,
                    drive_writes_per_day: None,
                    write_amplification: None,
                    spare_fraction: None,
                    random_read_iops: None,
                    random_write_iops: 0.0,
                    linear_write_megabytes_per_second: None,
                    source: String::new(),
                },
                // stripelog's own default spare; its write amplification from it.
                build: Build {
                    stripelog_spare_fraction: f64::from(stripelog_engine::geometry::DEFAULT_SPARE_PPM) / 1e6,
                    stripelog_write_amplification: None,
                    ..Build::seed_001_chassis()
                },
            })
        }
    }
}

/// `input` with every flag given laid over it.
fn overlay(arguments: &PlanArguments, mut input: PlanInput) -> Result<PlanInput, String> {
    let (drive, build) = (&mut input.drive, &mut input.build);
    if let Some(name) = &arguments.drive_name {
        drive.name = name.clone();
    }
    if let Some(size) = arguments.drive_size {
        drive.size_gigabytes = size;
    }
    if let Some(size) = arguments.raw_drive_size {
        drive.raw_size_gigabytes = Some(size);
    }
    if let Some(price) = arguments.price {
        drive.price = price;
    }
    if let Some(cycles) = arguments.erase_cycles {
        drive.erase_cycles = Some(cycles);
        drive.drive_writes_per_day = None;
    }
    if let Some(rating) = arguments.drive_writes_per_day {
        drive.drive_writes_per_day = Some(rating);
        drive.erase_cycles = None;
    }
    if let Some(amplification) = arguments.drive_write_amplification {
        drive.write_amplification = Some(amplification);
        drive.spare_fraction = None;
    }
    if let Some(spare) = arguments.drive_spare {
        drive.spare_fraction = Some(f64::from(spare) / 1e6);
        drive.write_amplification = None;
    }
    if let Some(reads) = arguments.read_iops {
        drive.random_read_iops = Some(reads);
    }
    if let Some(writes) = arguments.write_iops {
        drive.random_write_iops = writes;
    }
    if let Some(linear) = arguments.linear_write {
        drive.linear_write_megabytes_per_second = Some(linear);
    }
    if let Some(count) = arguments.drives {
        build.drive_count = count;
    }
    if let Some(cost) = arguments.chassis_cost {
        build.chassis_cost = cost;
    }
    if let Some(limit) = arguments.controller_iops {
        build.controller_iops_limit = Some(limit);
    }
    if let Some(daily) = arguments.daily_writes {
        build.daily_writes_gigabytes = daily;
    }
    if let Some(ratio) = arguments.compression {
        build.compression_ratio = ratio;
    }
    if let Some(path) = &arguments.compression_of {
        build.compression_ratio = measured_compression_ratio(path)?;
    }
    if let Some(spare) = arguments.spare {
        let spare = f64::from(spare) / 1e6;
        if (spare - build.stripelog_spare_fraction).abs() > 1e-9 {
            // A new spare sets the coefficient, unless one is given too.
            build.stripelog_spare_fraction = spare;
            build.stripelog_write_amplification = None;
        }
    }
    if let Some(amplification) = arguments.log_write_amplification {
        build.stripelog_write_amplification = Some(amplification);
    }
    if let Some(text) = &arguments.licence_per_tib {
        let [plain, compressed] = numbers::<2>(text, "--licence-per-tib")?;
        build.licence_per_tebibyte = plain;
        build.compressed_licence_per_tebibyte = compressed;
    }
    if let Some(groups) = arguments.groups {
        build.raid_group_count = groups;
    }
    if let Some(years) = arguments.years {
        build.service_years = years;
    }
    if let Some(text) = &arguments.measured_iops {
        let [raid5, raid6, raid5_compressed, raid6_compressed] = numbers::<4>(text, "--measured-iops")?;
        build.stripelog_measured_iops = Some(MeasuredIops { raid5, raid6, raid5_compressed, raid6_compressed });
    }
    Ok(input)
}

/// The compression ratio in a file of `stripelog info --json`; refused, naming what is
/// wrong, when the file is not one or its volume does not compress or holds no data.
fn measured_compression_ratio(path: &std::path::Path) -> Result<f64, String> {
    let name = path.display();
    let text = std::fs::read_to_string(path).map_err(|error| format!("{name}: {error}"))?;
    let info: serde_json::Value = serde_json::from_str(&text)
        .map_err(|error| format!("{name}: not the JSON of `stripelog info --json`: {error}"))?;
    let compression = match info.get("compression") {
        Some(serde_json::Value::Null) => {
            return Err(format!("{name}: its volume was created without compression: no ratio was measured"))
        }
        Some(compression) => compression,
        None => return Err(format!("{name}: no \"compression\" object: not the JSON of `stripelog info --json`")),
    };
    if compression["logical_data_blocks"].as_u64() == Some(0) {
        return Err(format!("{name}: its volume holds no data: no ratio was measured"));
    }
    match compression["ratio"].as_f64() {
        Some(ratio) if ratio.is_finite() && ratio >= 1.0 => Ok(ratio),
        other => Err(format!("{name}: compression ratio {other:?} is not a measured ratio (≥ 1)")),
    }
}

/// The plan's inputs: the base with the flags laid over it. A measurement the base carries
/// is dropped when a flag changes what it measured (the drives, their number, stripelog's
/// spare or the compression), unless a new one is given.
fn input(arguments: &PlanArguments) -> Result<PlanInput, String> {
    let base = base(arguments)?;
    let mut input = overlay(arguments, base.clone())?;
    if arguments.measured_iops.is_none() && base.build.stripelog_measured_iops.is_some() {
        let measured_differently = input.drive != base.drive
            || input.build.drive_count != base.build.drive_count
            || input.build.stripelog_spare_fraction != base.build.stripelog_spare_fraction
            || input.build.compression_ratio != base.build.compression_ratio;
        if measured_differently {
            input.build.stripelog_measured_iops = None;
        }
    }
    Ok(input)
}

pub(crate) fn run(arguments: PlanArguments) -> Result<(), String> {
    if arguments.list_presets {
        for name in presets::NAMES {
            let preset = presets::preset(name).ok_or_else(|| format!("preset {name} is missing"))?;
            println!("{name:<18} {} — {}", preset.drive.name, preset.drive.source);
        }
        return Ok(());
    }
    let plan = stripelog_planner::plan(&input(&arguments)?)?;
    if arguments.json {
        let text = serde_json::to_string_pretty(&plan).map_err(|error| error.to_string())?;
        println!("{text}");
    } else {
        print!("{}", stripelog_planner::table(&plan));
    }
    Ok(())
}
