//! `stripelog sim wear` (seed 000 sections 10 and 16, seed 001 Tables 1-2, seed 002):
//! 4 KiB random writes to eight simulated drives built four ways — md RAID-10, md RAID-5
//! (read-modify-write), stripelog RAID-5 and stripelog RAID-6 — for each drive class.
//! Every array is filled sequentially, overwritten at random for `warm_passes` of its
//! addressable space, then measured over `measured_passes` more.
//!
//! The drives run on the saturated clock: each request queues behind all earlier ones, so
//! a drive's clock is the time its work takes. Host IOPS = host writes ÷ the busiest
//! drive's time: what the array allows with enough requests in flight (`sim lame-raid`
//! shows stripelog's writer keeps its members busy in real time; md's RAID-5 is credited
//! with perfect overlap of its reads and writes, its best case).

use super::arrays::{ArrayLevel, ArrayTarget, ConventionalArray};
use crate::run::{self, Data, Pattern, Workload};
use crate::target::{EngineTarget, Target};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use stripelog_blockdev::BlockDevice;
use stripelog_engine::{CreateOptions, MemberDevice, OpenOptions, RaidLevel, Volume};
use stripelog_flashsim::{theory, DriveModel, DriveStatistics, FlashDevice};

const WRITE_SIZE_BYTES: usize = 4096;
const FILL_REQUEST_BYTES: usize = 1 << 20;
const WRITER_THREADS: usize = 2;
const WRITER_QUEUE_DEPTH: usize = 16;
const SECONDS_PER_DAY: f64 = 86_400.0;
/// The default spare never goes below this: RAID-6 on four drives has RAID-10's data
/// fraction, and a log with no spare would spend all its time cleaning.
const MINIMUM_DEFAULT_SPARE_FRACTION: f64 = 0.1;

#[derive(Clone, Debug)]
pub struct Options {
    pub drive_presets: Vec<String>,
    pub drives: usize,
    pub drive_size_bytes: u64,
    /// md's chunk.
    pub md_chunk_size_bytes: u64,
    /// stripelog's chunk (a multiple of the drives' erase block).
    pub stripelog_chunk_size_bytes: u32,
    /// stripelog's spare fraction of its data capacity; `None`: as much as gives it the
    /// addressable space of RAID-10 on the same drives (seed 000 section 10's comparison at
    /// equal addressable space), but at least 10 %.
    pub stripelog_spare_fraction: Option<f64>,
    pub warm_passes: f64,
    pub measured_passes: f64,
    /// Life projections: drives of this size (the experiment's small drives scaled up;
    /// every figure the model measures is a ratio)…
    pub nominal_drive_size_bytes: f64,
    /// …taking this many host bytes a day (seed 000 section 10: 2 TB).
    pub daily_write_bytes: f64,
    pub seed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub drive: String,
    pub topology: String,
    /// stripelog's spare fraction of its data capacity (none for md).
    pub spare_fraction: Option<f64>,
    pub addressable_bytes: u64,
    pub host_write_bytes: u64,
    pub host_iops: f64,
    /// Host write bandwidth ÷ (the drives' linear write bandwidth × the data fraction).
    pub share_of_linear_speed: f64,
    /// Bytes the drives were asked to write per host byte (mirror, parity, read-modify-
    /// write, stripelog's own cleaning and metadata).
    pub raid_amplification: f64,
    /// NAND bytes programmed per byte the drives were asked to write (their FTLs).
    pub device_write_amplification: f64,
    pub nand_bytes_per_host_byte: f64,
    /// Erases of the most- and least-erased block over all drives.
    pub erase_count_maximum: u32,
    pub erase_count_minimum: u32,
    /// Seed 002's formula at the daily host writes of the options.
    pub life_years_at_daily_writes: f64,
    /// Seed 002's formula with the array written flat out at `host_iops` (duty cycle 1).
    pub life_years_at_full_speed: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub drives: usize,
    pub drive_models: Vec<DriveModel>,
    pub drive_size_bytes: u64,
    pub nominal_drive_size_bytes: f64,
    pub daily_write_bytes: f64,
    pub warm_passes: f64,
    pub measured_passes: f64,
    pub rows: Vec<Row>,
    pub simulation_seconds: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Topology {
    MdRaid10,
    MdRaid5,
    Stripelog(RaidLevel),
}

impl Topology {
    fn name(self) -> &'static str {
        match self {
            Topology::MdRaid10 => "md RAID-10",
            Topology::MdRaid5 => "md RAID-5 (read-modify-write)",
            Topology::Stripelog(RaidLevel::Raid6) => "stripelog RAID-6",
            Topology::Stripelog(_) => "stripelog RAID-5",
        }
    }
    fn data_fraction(self, drives: usize) -> f64 {
        match self {
            Topology::MdRaid10 => 0.5,
            Topology::MdRaid5 | Topology::Stripelog(RaidLevel::Raid5) => (drives - 1) as f64 / drives as f64,
            Topology::Stripelog(_) => (drives - 2) as f64 / drives as f64,
        }
    }
}

const TOPOLOGIES: [Topology; 4] = [
    Topology::MdRaid10,
    Topology::MdRaid5,
    Topology::Stripelog(RaidLevel::Raid5),
    Topology::Stripelog(RaidLevel::Raid6),
];

fn workload(random: bool, region_bytes: u64, write_limit_bytes: u64, seed: u64) -> Workload {
    Workload {
        read_percent: 0,
        block_sizes_bytes: vec![if random { WRITE_SIZE_BYTES } else { FILL_REQUEST_BYTES }],
        pattern: if random { Pattern::Random } else { Pattern::Sequential },
        zipf_exponent: None,
        region_offset_bytes: 0,
        region_bytes,
        data: Data::Random,
        threads: if random { WRITER_THREADS } else { 1 },
        queue_depth: if random { WRITER_QUEUE_DEPTH } else { 4 },
        duration: Duration::from_secs(24 * 3600),
        write_limit_bytes: Some(write_limit_bytes),
        durability: Default::default(),
        seed,
    }
}

/// The drives' counters and clocks at one instant.
struct Snapshot {
    statistics: Vec<DriveStatistics>,
    clocks_ns: Vec<u64>,
}

fn snapshot(drives: &[Arc<FlashDevice>]) -> Snapshot {
    Snapshot {
        statistics: drives.iter().map(|drive| drive.statistics()).collect(),
        clocks_ns: drives.iter().map(|drive| drive.now_ns()).collect(),
    }
}

/// Fill, warm up and measure one topology on fresh drives of `model`.
fn measure(options: &Options, model: &DriveModel, topology: Topology) -> Result<Row, String> {
    let drives: Vec<Arc<FlashDevice>> = (0..options.drives)
        .map(|index| FlashDevice::new(model.clone(), &format!("drive{index}")).map(Arc::new))
        .collect::<Result<_, _>>()?;
    let members: Vec<Arc<dyn BlockDevice>> = drives.iter().map(|drive| drive.clone() as Arc<dyn BlockDevice>).collect();
    let mut volume = None;
    let mut spare_fraction = None;
    let target: Box<dyn Target> = match topology {
        Topology::MdRaid10 | Topology::MdRaid5 => {
            let level = if topology == Topology::MdRaid10 { ArrayLevel::Raid10 } else { ArrayLevel::Raid5 };
            let array = ConventionalArray::new(level, members, options.md_chunk_size_bytes, false)?;
            Box::new(ArrayTarget { array: Arc::new(array), label: topology.name().into() })
        }
        Topology::Stripelog(raid_level) => {
            let members = members
                .into_iter()
                .enumerate()
                .map(|(index, device)| MemberDevice { name: format!("drive{index}"), device: Some(device) })
                .collect();
            let equal_to_raid10 = 1.0 - 0.5 / topology.data_fraction(options.drives);
            let spare = options.stripelog_spare_fraction.unwrap_or(equal_to_raid10.max(MINIMUM_DEFAULT_SPARE_FRACTION));
            spare_fraction = Some(spare);
            let create = CreateOptions {
                raid_level,
                chunk_size_bytes: options.stripelog_chunk_size_bytes,
                spare_ppm: (spare * 1e6) as u32,
                volume_uuid: None,
                force: false,
                compression: Default::default(),
                logical_size_bytes: None,
                deduplication: false,
                client_write_pairs: true,
            };
            let open = OpenOptions { cache_size_bytes: 0, ..OpenOptions::default() };
            let created = Arc::new(
                Volume::create(members, &create, &open).map_err(|error| format!("creating the volume: {error}"))?,
            );
            volume = Some(created.clone());
            Box::new(EngineTarget::from_volume(created, topology.name().into()))
        }
    };
    let addressable = target.size_bytes() / FILL_REQUEST_BYTES as u64 * FILL_REQUEST_BYTES as u64;
    let passes = |count: f64| (addressable as f64 * count) as u64;
    let flush = || volume.as_ref().map_or(Ok(()), |volume| volume.flush().map_err(|error| error.to_string()));
    run::run(target.as_ref(), &workload(false, addressable, addressable, options.seed), &|_| {})?;
    run::run(target.as_ref(), &workload(true, addressable, passes(options.warm_passes), options.seed + 1), &|_| {})?;
    flush()?;
    let before = snapshot(&drives);
    let measured = run::run(
        target.as_ref(),
        &workload(true, addressable, passes(options.measured_passes), options.seed + 2),
        &|_| {},
    )?;
    flush()?;
    let after = snapshot(&drives);
    drop(target);
    if let Some(volume) = volume {
        crate::compare::close_volume(volume)?;
    }

    let host_bytes = measured.write.io_bytes;
    let page = model.geometry.page_size_bytes as u64;
    let deltas: Vec<DriveStatistics> =
        after.statistics.iter().zip(&before.statistics).map(|(after, before)| after.since(before)).collect();
    let drive_writes: u64 = deltas.iter().map(|delta| delta.host_write_bytes).sum();
    let nand: u64 = deltas.iter().map(|delta| delta.nand_program_pages() * page).sum();
    let busiest_ns =
        after.clocks_ns.iter().zip(&before.clocks_ns).map(|(after, before)| after - before).max().unwrap_or(0);
    let host_iops = (host_bytes / WRITE_SIZE_BYTES as u64) as f64 / (busiest_ns.max(1) as f64 / 1e9);
    let raid_amplification = drive_writes as f64 / host_bytes.max(1) as f64;
    let device_write_amplification = nand as f64 / drive_writes.max(1) as f64;
    let nand_per_host = nand as f64 / host_bytes.max(1) as f64;
    let spreads: Vec<_> = drives.iter().map(|drive| drive.erase_spread()).collect();
    let drives_count = options.drives as f64;
    // Seed 002 per drive: P/E × capacity ÷ (device WA × the drive's write rate × duty cycle),
    // the drive's write rate being its share of the host rate times the RAID amplification.
    let life = |host_bytes_per_second: f64| {
        theory::life_years(
            model.endurance_pe_cycles,
            options.nominal_drive_size_bytes,
            device_write_amplification,
            host_bytes_per_second * raid_amplification / drives_count,
            1.0,
        )
    };
    let linear = model.linear_write_bytes_per_second();
    Ok(Row {
        drive: model.name.clone(),
        topology: topology.name().into(),
        spare_fraction,
        addressable_bytes: addressable,
        host_write_bytes: host_bytes,
        host_iops,
        share_of_linear_speed: host_iops * WRITE_SIZE_BYTES as f64
            / (linear * drives_count * topology.data_fraction(options.drives)),
        raid_amplification,
        device_write_amplification,
        nand_bytes_per_host_byte: nand_per_host,
        erase_count_maximum: spreads.iter().map(|spread| spread.maximum).max().unwrap_or(0),
        erase_count_minimum: spreads.iter().map(|spread| spread.minimum).min().unwrap_or(0),
        life_years_at_daily_writes: life(options.daily_write_bytes / SECONDS_PER_DAY),
        life_years_at_full_speed: life(host_iops * WRITE_SIZE_BYTES as f64),
    })
}

pub fn run(options: &Options, progress: &dyn Fn(&str, f64)) -> Result<Report, String> {
    if options.drives < 4 || options.warm_passes < 0.0 || options.measured_passes <= 0.0 {
        return Err("at least four drives and a positive measured pass".into());
    }
    let started = std::time::Instant::now();
    let models: Vec<DriveModel> = options
        .drive_presets
        .iter()
        .map(|name| {
            DriveModel::preset(name, options.drive_size_bytes).ok_or_else(|| format!("no drive preset {name:?}"))
        })
        .collect::<Result<_, _>>()?;
    let total = (models.len() * TOPOLOGIES.len()) as f64;
    let mut rows = Vec::new();
    for model in &models {
        for topology in TOPOLOGIES {
            progress(&format!("{}: {}", model.name, topology.name()), rows.len() as f64 / total);
            rows.push(measure(options, model, topology)?);
        }
    }
    Ok(Report {
        drives: options.drives,
        drive_models: models,
        drive_size_bytes: options.drive_size_bytes,
        nominal_drive_size_bytes: options.nominal_drive_size_bytes,
        daily_write_bytes: options.daily_write_bytes,
        warm_passes: options.warm_passes,
        measured_passes: options.measured_passes,
        rows,
        simulation_seconds: started.elapsed().as_secs_f64(),
    })
}

pub fn table(report: &Report) -> String {
    let mut text = format!(
        "{} drives of {} MiB, 4 KiB random writes; life: drives of {:.0} GB taking {:.1} TB of host writes a day (seed 002's formula); simulated in {:.0} s\n",
        report.drives,
        report.drive_size_bytes >> 20,
        report.nominal_drive_size_bytes / 1e9,
        report.daily_write_bytes / 1e12,
        report.simulation_seconds
    );
    text += &format!(
        "{:<16} {:<33} {:>9} {:>9} {:>7} {:>6} {:>6} {:>8} {:>9} {:>10}\n",
        "drive", "topology", "GiB", "IOPS", "linear", "RAID", "drive", "NAND/", "life", "life flat"
    );
    text += &format!(
        "{:<16} {:<33} {:>9} {:>9} {:>7} {:>6} {:>6} {:>8} {:>9} {:>10}\n",
        "", "", "usable", "", "share", "amp", "WA", "host", "years", "out, years"
    );
    for row in &report.rows {
        text += &format!(
            "{:<16} {:<33} {:>9.2} {:>9.0} {:>6.0}% {:>6.2} {:>6.2} {:>8.2} {:>9.2} {:>10.2}\n",
            row.drive,
            match row.spare_fraction {
                Some(spare) => format!("{} ({:.0} % spare)", row.topology, spare * 100.0),
                None => row.topology.clone(),
            },
            row.addressable_bytes as f64 / (1u64 << 30) as f64,
            row.host_iops,
            row.share_of_linear_speed * 100.0,
            row.raid_amplification,
            row.device_write_amplification,
            row.nand_bytes_per_host_byte,
            row.life_years_at_daily_writes,
            row.life_years_at_full_speed
        );
    }
    text
}

/// Host IOPS and NAND bytes per host byte, per drive class and topology (two bar panels).
pub fn chart(report: &Report, path: &std::path::Path) -> Result<(), String> {
    crate::render_chart!(path, (1100, 520), |root| draw(&root, report))
}

fn draw<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    report: &Report,
) -> Result<(), String> {
    use crate::chart::failed;
    use plotters::prelude::*;
    root.fill(&WHITE).map_err(failed)?;
    let (left, right) = root.split_horizontally(550);
    let colors = [RED, MAGENTA, BLUE, CYAN];
    type Panel<'a, DB> = (&'a DrawingArea<DB, plotters::coord::Shift>, &'static str, fn(&Row) -> f64);
    let panels: [Panel<DB>; 2] = [
        (&left, "host 4 KiB write IOPS", |row| row.host_iops),
        (&right, "NAND bytes written per host byte", |row| row.nand_bytes_per_host_byte),
    ];
    let groups: Vec<&String> = report.drive_models.iter().map(|model| &model.name).collect();
    for (area, title, value) in panels {
        let peak = report.rows.iter().map(value).fold(1e-9, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..groups.len() as f64, 0f64..peak)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(groups.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let index = x.floor() as usize;
                if (x - index as f64 - 0.5).abs() < 0.01 {
                    groups.get(index).map_or(String::new(), |name| name.to_string())
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&crate::chart::tick)
            .draw()
            .map_err(failed)?;
        for (slot, color) in colors.iter().enumerate() {
            let bars = report.rows.iter().enumerate().filter(|(index, _)| index % TOPOLOGIES.len() == slot).map(
                |(index, row)| {
                    let group = (index / TOPOLOGIES.len()) as f64;
                    let left = group + 0.1 + slot as f64 * 0.2;
                    Rectangle::new([(left, 0.0), (left + 0.18, value(row))], color.filled())
                },
            );
            let name = TOPOLOGIES[slot].name();
            chart
                .draw_series(bars)
                .map_err(failed)?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(failed)?;
    }
    Ok(())
}
