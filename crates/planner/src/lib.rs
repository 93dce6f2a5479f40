//! `stripelog plan`: the arithmetic of seed 000 (sections 9, 10, 17-19) and seed 001
//! (Tables 1-7) for a designer's own drives — landable space, cost per addressable
//! gigabyte, random-write and 70/30 IOPS, safe overwrites per day and projected life, for
//! md RAID-5/6/50/60/10 (written linearly or at random) and stripelog RAID-5/6, with and
//! without compression, side by side. docs/planner.md derives every formula and checks it
//! against the seeds' tables. Pure arithmetic: no I/O beyond reading a TOML file.

pub mod presets;
mod table;

use serde::{Deserialize, Serialize};
pub use table::table;

/// Days in a year (the seeds count 365; seed 001's five years are 1 825 days).
pub const DAYS_PER_YEAR: f64 = 365.0;
/// The seeds' block for random I/O.
pub const RANDOM_IO_BYTES: f64 = 4096.0;
/// Gigabytes per terabyte as the seeds count them (seed 000 section 10: "3.52 * 1,024").
pub const GIGABYTES_PER_TERABYTE: f64 = 1024.0;
/// The 70/30 mix of seed 000 section 18.
pub const READ_SHARE: f64 = 0.7;

/// One drive model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drive {
    pub name: String,
    /// User capacity, in gigabytes as the drive is sold.
    pub size_gigabytes: f64,
    /// NAND behind it, the endurance budget (seed 000 section 10: 256 GB under a 200 GB
    /// enterprise setting). Default: the user capacity, as seed 001 counts "gross surface".
    #[serde(default)]
    pub raw_size_gigabytes: Option<f64>,
    pub price: f64,
    /// Rated erase cycles of its flash…
    #[serde(default)]
    pub erase_cycles: Option<f64>,
    /// …or a rated drive-writes-per-day figure over `service_years` (seed 001, Intel DC
    /// S3700), which already includes the drive's own write amplification.
    #[serde(default)]
    pub drive_writes_per_day: Option<f64>,
    /// The drive's internal write amplification under random writes (seed 001: 8 for the
    /// Crucial M550 and SM843TN, 2 for the SM843T)…
    #[serde(default)]
    pub write_amplification: Option<f64>,
    /// …or its free-space fraction, from which the seeds' wear coefficient is 1 ÷ free
    /// (seed 000 section 9: 27 % → 3.7).
    #[serde(default)]
    pub spare_fraction: Option<f64>,
    #[serde(default)]
    pub random_read_iops: Option<f64>,
    pub random_write_iops: f64,
    #[serde(default)]
    pub linear_write_megabytes_per_second: Option<f64>,
    /// Where the figures come from.
    #[serde(default)]
    pub source: String,
}

/// stripelog's random-write IOPS where they were measured rather than computed (seed 001's
/// ESS columns: "based upon tested performance of 24 drive sets").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredIops {
    pub raid5: f64,
    pub raid6: f64,
    pub raid5_compressed: f64,
    pub raid6_compressed: f64,
}

/// The drive set and the assumptions around it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Build {
    pub drive_count: u32,
    pub chassis_cost: f64,
    /// Member I/Os a second the controllers pass (seed 000 section 17: 95 000 on SATA-2
    /// HBAs). A RAID-10 write is two member I/Os, a read-modify-write RAID-5 write four,
    /// RAID-6 six; stripelog's writes are whole-chunk transfers the limit does not bind.
    #[serde(default)]
    pub controller_iops_limit: Option<f64>,
    /// Host writes a day, in gigabytes (seed 000 section 10: 2 TB = 2 048 GB).
    pub daily_writes_gigabytes: f64,
    /// Assumed compression ratio of the data (seed 001 assumes 2).
    pub compression_ratio: f64,
    /// stripelog's spare: the fraction of its data space held back from the logical size.
    pub stripelog_spare_fraction: f64,
    /// stripelog's cleaning write amplification; default the seeds' wear coefficient
    /// 1 ÷ spare (seed 000 section 10). Seed 001 states 1.3 for ESS.
    #[serde(default)]
    pub stripelog_write_amplification: Option<f64>,
    /// Software cost per started 1 024 GB (seed 001's "TB") of stripelog's landable space
    /// (seed 001's ESS licence: 200; 0 for stripelog)…
    #[serde(default)]
    pub licence_per_tebibyte: f64,
    /// …and with compression (seed 001: 400).
    #[serde(default)]
    pub compressed_licence_per_tebibyte: f64,
    /// RAID-50/60 groups (seed 001: three).
    pub raid_group_count: u32,
    /// The life overwrites per day are counted over (seed 001: five years).
    pub service_years: f64,
    #[serde(default)]
    pub stripelog_measured_iops: Option<MeasuredIops>,
}

impl Build {
    /// Seed 001's assumptions for a 24-drive chassis, stripelog free.
    pub fn seed_001_chassis() -> Build {
        Build {
            drive_count: 24,
            chassis_cost: 3_600.0,
            controller_iops_limit: None,
            daily_writes_gigabytes: 2_048.0,
            compression_ratio: 2.0,
            stripelog_spare_fraction: 0.05,
            stripelog_write_amplification: Some(1.3),
            licence_per_tebibyte: 0.0,
            compressed_licence_per_tebibyte: 0.0,
            raid_group_count: 3,
            service_years: 5.0,
            stripelog_measured_iops: None,
        }
    }
}

/// A drive and a build, as a TOML file holds them (`[drive]` and `[build]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanInput {
    pub drive: Drive,
    pub build: Build,
}

impl PlanInput {
    pub fn from_toml(text: &str) -> Result<PlanInput, String> {
        toml::from_str(text).map_err(|error| error.to_string())
    }
}

/// The columns of seed 001's tables, left to right.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Topology {
    LinearRaid5,
    LinearRaid6,
    Raid5,
    Raid6,
    Raid50,
    Raid60,
    Raid10,
    StripelogRaid5,
    StripelogRaid6,
    StripelogRaid5Compressed,
    StripelogRaid6Compressed,
}

impl Topology {
    pub const ALL: [Topology; 11] = [
        Topology::LinearRaid5,
        Topology::LinearRaid6,
        Topology::Raid5,
        Topology::Raid6,
        Topology::Raid50,
        Topology::Raid60,
        Topology::Raid10,
        Topology::StripelogRaid5,
        Topology::StripelogRaid6,
        Topology::StripelogRaid5Compressed,
        Topology::StripelogRaid6Compressed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topology::LinearRaid5 => "linear RAID-5",
            Topology::LinearRaid6 => "linear RAID-6",
            Topology::Raid5 => "md RAID-5",
            Topology::Raid6 => "md RAID-6",
            Topology::Raid50 => "md RAID-50",
            Topology::Raid60 => "md RAID-60",
            Topology::Raid10 => "md RAID-10",
            Topology::StripelogRaid5 => "stripelog RAID-5",
            Topology::StripelogRaid6 => "stripelog RAID-6",
            Topology::StripelogRaid5Compressed => "stripelog RAID-5 compressed",
            Topology::StripelogRaid6Compressed => "stripelog RAID-6 compressed",
        }
    }

    fn parity_per_group(self) -> u32 {
        match self {
            Topology::LinearRaid6
            | Topology::Raid6
            | Topology::Raid60
            | Topology::StripelogRaid6
            | Topology::StripelogRaid6Compressed => 2,
            _ => 1,
        }
    }

    pub fn is_stripelog(self) -> bool {
        matches!(
            self,
            Topology::StripelogRaid5
                | Topology::StripelogRaid6
                | Topology::StripelogRaid5Compressed
                | Topology::StripelogRaid6Compressed
        )
    }

    pub fn is_compressed(self) -> bool {
        matches!(self, Topology::StripelogRaid5Compressed | Topology::StripelogRaid6Compressed)
    }

    /// Written in whole stripes (large sequential files, or stripelog's log).
    pub fn writes_full_stripes(self) -> bool {
        matches!(self, Topology::LinearRaid5 | Topology::LinearRaid6) || self.is_stripelog()
    }
}

/// Where a figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Basis {
    Computed,
    /// Taken from the inputs: a measurement, not arithmetic.
    Measured,
}

/// One column of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct Column {
    pub topology: Topology,
    pub name: &'static str,
    pub gross_gigabytes: f64,
    pub landable_gigabytes: f64,
    pub chassis_cost: f64,
    pub media_cost: f64,
    pub licence_cost: f64,
    pub total_cost: f64,
    pub cost_per_gigabyte: f64,
    /// Member bytes written per host byte by the RAID layout (and stripelog's log).
    pub raid_amplification: f64,
    /// Write amplification below the RAID layout: the drive's own for random md writes, 1
    /// for full-stripe writes, stripelog's cleaning for stripelog (the drives see it
    /// sequentially). Unused with a drive-writes-per-day rating.
    pub write_amplification: f64,
    /// None: not a random-write topology (seed 001's "n/a"), or a figure the inputs lack.
    pub random_write_iops: Option<f64>,
    pub random_write_iops_basis: Basis,
    pub mixed_70_30_iops: Option<f64>,
    /// Times a day the landable space may be overwritten for `service_years`.
    pub overwrites_per_day: Option<f64>,
    /// Seed 002's formula at `daily_writes_gigabytes`.
    pub life_years: Option<f64>,
}

/// The plan: inputs echoed and every column.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub drive: Drive,
    pub build: Build,
    /// The drive's write amplification as used, and how it was found.
    pub drive_write_amplification: Option<f64>,
    pub stripelog_write_amplification: f64,
    pub columns: Vec<Column>,
}

/// Seed 000 section 18: the IOPS of a 70 % read, 30 % write mix, `R ÷ (0.7 + 0.3 × R ÷ W)`.
pub fn mixed_iops(read_iops: f64, write_iops: f64) -> f64 {
    read_iops / (READ_SHARE + (1.0 - READ_SHARE) * read_iops / write_iops)
}

/// Seed 000 section 9: the wear coefficient of a free-space fraction.
pub fn wear_coefficient(free_fraction: f64) -> f64 {
    1.0 / free_fraction
}

/// Seed 002: years = erase cycles × capacity ÷ (bytes programmed a day) ÷ 365.
pub fn life_years(erase_cycles: f64, capacity_gigabytes: f64, programmed_gigabytes_per_day: f64) -> f64 {
    erase_cycles * capacity_gigabytes / programmed_gigabytes_per_day / DAYS_PER_YEAR
}

fn positive(value: f64, what: &str) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(format!("{what} must be a positive number, got {value}"))
    }
}

fn fraction(value: f64, what: &str) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 && value < 1.0 {
        Ok(value)
    } else {
        Err(format!("{what} must be between 0 and 100 % (exclusive), got {}", value * 100.0))
    }
}

/// Every input checked: a clear error for a value that would make the arithmetic
/// meaningless (a planner must not print infinities).
fn validate(input: &PlanInput) -> Result<(), String> {
    let (drive, build) = (&input.drive, &input.build);
    positive(drive.size_gigabytes, "the drive size")?;
    if let Some(raw) = drive.raw_size_gigabytes {
        positive(raw, "the raw drive size")?;
    }
    if drive.price < 0.0 || !drive.price.is_finite() {
        return Err(format!("the drive price must not be negative, got {}", drive.price));
    }
    match (drive.erase_cycles, drive.drive_writes_per_day) {
        (Some(_), Some(_)) => return Err("give erase cycles or drive writes per day, not both".into()),
        (Some(cycles), None) => {
            positive(cycles, "erase cycles")?;
            if drive.write_amplification.is_none() && drive.spare_fraction.is_none() {
                return Err("with erase cycles, give the drive's write amplification or its spare fraction".into());
            }
        }
        (None, Some(rating)) => {
            positive(rating, "drive writes per day")?;
        }
        (None, None) => {}
    }
    if let Some(amplification) = drive.write_amplification {
        if !(amplification.is_finite() && amplification >= 1.0) {
            return Err(format!("the drive's write amplification must be at least 1, got {amplification}"));
        }
    }
    if let Some(spare) = drive.spare_fraction {
        fraction(spare, "the drive's spare fraction")?;
    }
    positive(drive.random_write_iops, "the drive's random write IOPS")?;
    if let Some(reads) = drive.random_read_iops {
        positive(reads, "the drive's random read IOPS")?;
    }
    if let Some(linear) = drive.linear_write_megabytes_per_second {
        positive(linear, "the drive's linear write speed")?;
    }
    let groups = build.raid_group_count;
    if build.drive_count < 4 || !build.drive_count.is_multiple_of(2) {
        return Err(format!("the planner needs an even drive count of at least 4, got {}", build.drive_count));
    }
    if groups == 0 || !build.drive_count.is_multiple_of(groups) || build.drive_count / groups < 4 {
        return Err(format!(
            "{groups} RAID-50/60 groups do not divide {} drives into groups of at least 4",
            build.drive_count
        ));
    }
    if build.chassis_cost < 0.0 || !build.chassis_cost.is_finite() {
        return Err(format!("the chassis cost must not be negative, got {}", build.chassis_cost));
    }
    if let Some(limit) = build.controller_iops_limit {
        positive(limit, "the controller IOPS limit")?;
    }
    positive(build.daily_writes_gigabytes, "the daily writes")?;
    if !(build.compression_ratio.is_finite() && build.compression_ratio >= 1.0) {
        return Err(format!("the compression ratio must be at least 1, got {}", build.compression_ratio));
    }
    fraction(build.stripelog_spare_fraction, "stripelog's spare fraction")?;
    if let Some(amplification) = build.stripelog_write_amplification {
        if !(amplification.is_finite() && amplification >= 1.0) {
            return Err(format!("stripelog's write amplification must be at least 1, got {amplification}"));
        }
    }
    for (value, what) in [
        (build.licence_per_tebibyte, "the licence per TiB"),
        (build.compressed_licence_per_tebibyte, "the compressed licence per TiB"),
    ] {
        if value < 0.0 || !value.is_finite() {
            return Err(format!("{what} must not be negative, got {value}"));
        }
    }
    positive(build.service_years, "the service life")?;
    if let Some(measured) = &build.stripelog_measured_iops {
        for (value, what) in [
            (measured.raid5, "measured stripelog RAID-5 IOPS"),
            (measured.raid6, "measured stripelog RAID-6 IOPS"),
            (measured.raid5_compressed, "measured compressed stripelog RAID-5 IOPS"),
            (measured.raid6_compressed, "measured compressed stripelog RAID-6 IOPS"),
        ] {
            positive(value, what)?;
        }
    }
    Ok(())
}

/// Every figure of a column finite: inputs that pass one by one can still overflow together
/// (a size of 1e307 GB times 24 drives).
fn check_finite(column: &Column) -> Result<(), String> {
    let optional = [column.random_write_iops, column.mixed_70_30_iops, column.overwrites_per_day, column.life_years];
    let figures = [
        column.gross_gigabytes,
        column.landable_gigabytes,
        column.total_cost,
        column.cost_per_gigabyte,
        column.raid_amplification,
        column.write_amplification,
    ];
    if figures.iter().chain(optional.iter().flatten()).all(|value| value.is_finite()) {
        Ok(())
    } else {
        Err(format!("the inputs are too large or too small to compute {} with", column.name))
    }
}

/// Work out every column for `input`.
pub fn plan(input: &PlanInput) -> Result<Plan, String> {
    validate(input)?;
    let (drive, build) = (&input.drive, &input.build);
    let count = f64::from(build.drive_count);
    let size = drive.size_gigabytes;
    let gross = count * size;
    let raw_gross = count * drive.raw_size_gigabytes.unwrap_or(size);
    let groups = f64::from(build.raid_group_count);
    let drive_write_amplification = drive.write_amplification.or(drive.spare_fraction.map(wear_coefficient));
    let stripelog_write_amplification =
        build.stripelog_write_amplification.unwrap_or_else(|| wear_coefficient(build.stripelog_spare_fraction));
    let read_iops = drive.random_read_iops.map(|reads| {
        let array = count * reads;
        build.controller_iops_limit.map_or(array, |limit| array.min(limit))
    });
    let columns = Topology::ALL
        .iter()
        .map(|&topology| {
            let parity = f64::from(topology.parity_per_group());
            let data_drives = match topology {
                Topology::Raid50 | Topology::Raid60 => count - groups * parity,
                Topology::Raid10 => count / 2.0,
                _ => count - parity,
            };
            let uncompressed_landable =
                data_drives * size * if topology.is_stripelog() { 1.0 - build.stripelog_spare_fraction } else { 1.0 };
            let compression = if topology.is_compressed() { build.compression_ratio } else { 1.0 };
            let landable = uncompressed_landable * compression;
            let licence_cost = if topology.is_stripelog() {
                let per_tebibyte = if topology.is_compressed() {
                    build.compressed_licence_per_tebibyte
                } else {
                    build.licence_per_tebibyte
                };
                per_tebibyte * (uncompressed_landable / GIGABYTES_PER_TERABYTE).ceil()
            } else {
                0.0
            };
            let media_cost = count * drive.price;
            let total_cost = build.chassis_cost + media_cost + licence_cost;
            let raid_amplification = if topology.writes_full_stripes() {
                count / (count - parity)
            } else if topology == Topology::Raid10 {
                2.0
            } else {
                1.0 + parity
            };
            let write_amplification = if topology.is_stripelog() {
                stripelog_write_amplification
            } else if topology.writes_full_stripes() {
                1.0
            } else {
                drive_write_amplification.unwrap_or(1.0)
            };
            // Member I/Os per host write, for the controller limit.
            let member_ios_per_write = match topology {
                Topology::Raid10 => 2.0,
                _ => 2.0 * (1.0 + parity),
            };
            let cap =
                |iops: f64| build.controller_iops_limit.map_or(iops, |limit| iops.min(limit / member_ios_per_write));
            let (random_write_iops, random_write_iops_basis) = match topology {
                Topology::LinearRaid5 | Topology::LinearRaid6 => (None, Basis::Computed),
                Topology::Raid5 | Topology::Raid6 => (Some(cap(drive.random_write_iops)), Basis::Computed),
                Topology::Raid50 | Topology::Raid60 => (Some(cap(groups * drive.random_write_iops)), Basis::Computed),
                Topology::Raid10 => (Some(cap(count / 2.0 * drive.random_write_iops)), Basis::Computed),
                _ => match &build.stripelog_measured_iops {
                    Some(measured) => (
                        Some(match topology {
                            Topology::StripelogRaid5 => measured.raid5,
                            Topology::StripelogRaid6 => measured.raid6,
                            Topology::StripelogRaid5Compressed => measured.raid5_compressed,
                            _ => measured.raid6_compressed,
                        }),
                        Basis::Measured,
                    ),
                    // The data columns' linear bandwidth in 4 KiB writes, less the
                    // cleaner's share; compression puts more host writes in each byte.
                    None => (
                        drive.linear_write_megabytes_per_second.map(|megabytes| {
                            (count - parity) * megabytes * 1e6 / RANDOM_IO_BYTES / stripelog_write_amplification
                                * compression
                        }),
                        Basis::Computed,
                    ),
                },
            };
            let mixed_70_30_iops = match (read_iops, random_write_iops) {
                (Some(reads), Some(writes)) => Some(mixed_iops(reads, writes)),
                _ => None,
            };
            // Compression divides the bytes programmed and multiplies the landable space:
            // overwrites of the landable space are unchanged; life at a given host rate grows.
            let (overwrites_per_day, life) = match (drive.erase_cycles, drive.drive_writes_per_day) {
                (Some(cycles), _) => {
                    let per_day = cycles * raw_gross
                        / (DAYS_PER_YEAR * build.service_years)
                        / write_amplification
                        / raid_amplification
                        / uncompressed_landable;
                    let programmed =
                        build.daily_writes_gigabytes / compression * raid_amplification * write_amplification;
                    (Some(per_day), Some(life_years(cycles, raw_gross, programmed)))
                }
                (None, Some(rating)) => {
                    let per_day = rating * gross / raid_amplification / uncompressed_landable;
                    let allowed_per_day = per_day * uncompressed_landable;
                    let life = build.service_years * allowed_per_day / (build.daily_writes_gigabytes / compression);
                    (Some(per_day), Some(life))
                }
                (None, None) => (None, None),
            };
            Column {
                topology,
                name: topology.name(),
                gross_gigabytes: gross,
                landable_gigabytes: landable,
                chassis_cost: build.chassis_cost,
                media_cost,
                licence_cost,
                total_cost,
                cost_per_gigabyte: total_cost / landable,
                raid_amplification,
                write_amplification,
                random_write_iops,
                random_write_iops_basis,
                mixed_70_30_iops,
                overwrites_per_day,
                life_years: life,
            }
        })
        .collect::<Vec<Column>>();
    for column in &columns {
        check_finite(column)?;
    }
    Ok(Plan {
        drive: drive.clone(),
        build: build.clone(),
        drive_write_amplification,
        stripelog_write_amplification,
        columns,
    })
}
