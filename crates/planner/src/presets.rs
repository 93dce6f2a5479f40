//! The drives of the seeds' tables, with the builds the seeds put them in. Figures the
//! seeds do not give are left out (the plan prints "n/a"), never guessed.

use crate::{Build, Drive, MeasuredIops, PlanInput};

/// Seed 001 Tables 4-7: ESS's measured random-write IOPS on 24 drives.
fn seed_001_measured() -> MeasuredIops {
    MeasuredIops { raid5: 1_531_800.0, raid6: 1_452_000.0, raid5_compressed: 966_000.0, raid6_compressed: 924_000.0 }
}

/// Seed 001's chassis with its ESS licence (200 a TiB, 400 compressed) and measurements.
fn seed_001_build() -> Build {
    Build {
        licence_per_tebibyte: 200.0,
        compressed_licence_per_tebibyte: 400.0,
        stripelog_measured_iops: Some(seed_001_measured()),
        ..Build::seed_001_chassis()
    }
}

/// Seed 000 section 17: eight-drive sets on SATA-2 HBAs (95 000 member I/Os a second),
/// stripelog with the 27 % free space the seed assumes, 2 TB a day (section 10).
fn seed_000_build() -> Build {
    Build {
        drive_count: 8,
        chassis_cost: 0.0,
        controller_iops_limit: Some(95_000.0),
        daily_writes_gigabytes: 2_048.0,
        compression_ratio: 1.0,
        stripelog_spare_fraction: 0.27,
        stripelog_write_amplification: None,
        licence_per_tebibyte: 0.0,
        compressed_licence_per_tebibyte: 0.0,
        raid_group_count: 2,
        service_years: 5.0,
        stripelog_measured_iops: None,
    }
}

fn seed_000_drive(
    name: &str,
    size_gigabytes: f64,
    price: f64,
    random_read_iops: f64,
    random_write_iops: f64,
    linear_write_megabytes_per_second: f64,
) -> Drive {
    Drive {
        name: name.into(),
        size_gigabytes,
        raw_size_gigabytes: None,
        price,
        erase_cycles: None,
        drive_writes_per_day: None,
        write_amplification: None,
        spare_fraction: Some(0.27),
        random_read_iops: Some(random_read_iops),
        random_write_iops,
        linear_write_megabytes_per_second: Some(linear_write_megabytes_per_second),
        source: "seed 000 section 17 (single drive statistics; endurance not given)".into(),
    }
}

fn seed_001_drive(name: &str, size_gigabytes: f64, set_price: f64, random_write_iops: f64, source: &str) -> Drive {
    Drive {
        name: name.into(),
        size_gigabytes,
        raw_size_gigabytes: None,
        price: set_price / 24.0,
        erase_cycles: None,
        drive_writes_per_day: None,
        write_amplification: None,
        spare_fraction: None,
        random_read_iops: None,
        random_write_iops,
        linear_write_megabytes_per_second: None,
        source: source.into(),
    }
}

/// The presets' names, in the order `stripelog plan --help` lists them.
pub const NAMES: [&str; 13] = [
    "crucial-m550",
    "samsung-sm843tn",
    "samsung-sm843t",
    "intel-dc-s3700",
    "intel-x25-e",
    "marvell-p300",
    "sandforce-1500",
    "sandforce-1200",
    "barefoot-32",
    "barefoot-128",
    "jmicron-616",
    "marvell-c300-128",
    "marvell-c300-256",
];

/// A preset drive in the build its seed puts it in.
pub fn preset(name: &str) -> Option<PlanInput> {
    let seed_001 = |drive: Drive| Some(PlanInput { drive, build: seed_001_build() });
    let seed_000 = |drive: Drive| Some(PlanInput { drive, build: seed_000_build() });
    match name {
        "crucial-m550" => seed_001(Drive {
            erase_cycles: Some(3_000.0),
            write_amplification: Some(8.0),
            ..seed_001_drive(
                "Crucial M550 1TB",
                1_024.0,
                10_680.0,
                80_000.0,
                "seed 001 Table 4: 3,000 erase cycles, \"8:1 internal wear amplification, based upon its warranty\"; Table 2: 80,000 random writes",
            )
        }),
        "samsung-sm843tn" => seed_001(Drive {
            erase_cycles: Some(20_000.0),
            write_amplification: Some(8.0),
            ..seed_001_drive(
                "Samsung SM843TN 960GB",
                960.0,
                24_672.0,
                15_000.0,
                "seed 001 Table 5: 20,000 erase cycles, limited free space, 8:1 internal wear amplification; Table 2: 15,000 random writes",
            )
        }),
        "samsung-sm843t" => seed_001(Drive {
            erase_cycles: Some(20_000.0),
            write_amplification: Some(2.0),
            ..seed_001_drive(
                "Samsung SM843T 800GB",
                800.0,
                24_672.0,
                15_000.0,
                "seed 001 Table 6: 20,000 erase cycles, about 20 % more free space, \"typically 2:1\"; Table 2: 15,000 random writes",
            )
        }),
        "intel-dc-s3700" => seed_001(Drive {
            drive_writes_per_day: Some(11.0),
            ..seed_001_drive(
                "Intel DC S3700 800GB",
                800.0,
                47_520.0,
                37_000.0,
                "seed 001 Table 7: warranted for 11 overwrites a day; Table 2: 37,000 random writes",
            )
        }),
        "intel-x25-e" => seed_000(seed_000_drive("Intel x25-E", 64.0, 699.0, 35_000.0, 4_800.0, 170.0)),
        "marvell-p300" => seed_000(seed_000_drive("Marvel/Micron P-300", 100.0, 999.0, 60_000.0, 45_000.0, 275.0)),
        "sandforce-1500" => seed_000(seed_000_drive("SandForce 1500", 100.0, 529.0, 22_836.0, 20_000.0, 90.0)),
        "sandforce-1200" => seed_000(seed_000_drive("SandForce 1200", 128.0, 289.0, 22_836.0, 10_500.0, 90.0)),
        "barefoot-32" => seed_000(seed_000_drive("Barefoot 32GB", 32.0, 92.0, 15_858.0, 2_354.0, 110.0)),
        "barefoot-128" => seed_000(seed_000_drive("Barefoot 128GB", 128.0, 240.0, 18_741.0, 2_782.0, 130.0)),
        "jmicron-616" => seed_000(seed_000_drive("jMicron 616 512GB", 512.0, 1_299.0, 13_312.0, 2_650.0, 59.0)),
        "marvell-c300-128" => {
            seed_000(seed_000_drive("Marvel/Micron C-300 128GB", 128.0, 288.0, 60_000.0, 30_000.0, 140.0))
        }
        "marvell-c300-256" => {
            seed_000(seed_000_drive("Marvel/Micron C-300 256GB", 256.0, 549.0, 60_000.0, 45_000.0, 215.0))
        }
        _ => None,
    }
}
