//! The planner reproduces the seeds' published figures from their inputs (docs/planner.md
//! derives each one). Where a seed's figure does not follow from its own inputs, the test
//! says which and why instead of bending the formula.

use stripelog_planner::{mixed_iops, plan, presets, Basis, Build, Column, Drive, Plan, PlanInput, Topology};

fn planned(preset: &str) -> Plan {
    plan(&presets::preset(preset).unwrap()).unwrap()
}

fn column(plan: &Plan, topology: Topology) -> &Column {
    plan.columns.iter().find(|column| column.topology == topology).unwrap()
}

/// Rounds as the seeds print: to `decimals` places.
fn rounded(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

const SEED_001_COLUMNS: [Topology; 11] = Topology::ALL;

/// One row of a seed 001 table, checked column by column.
fn assert_row(plan: &Plan, what: &str, expected: [f64; 11], value: impl Fn(&Column) -> f64, decimals: i32) {
    for (topology, expected) in SEED_001_COLUMNS.iter().zip(expected) {
        let measured = rounded(value(column(plan, *topology)), decimals);
        assert_eq!(measured, expected, "{}: {what} of {}", plan.drive.name, topology.name());
    }
}

#[test]
fn seed_001_landable_surface_tables_4_to_7() {
    let cases: [(&str, f64, [f64; 11]); 4] = [
        (
            "crucial-m550",
            24_576.0,
            [
                23_552.0, 22_528.0, 23_552.0, 22_528.0, 21_504.0, 18_432.0, 12_288.0, 22_374.0, 21_402.0, 44_749.0,
                42_803.0,
            ],
        ),
        (
            "samsung-sm843tn",
            23_040.0,
            [
                22_080.0, 21_120.0, 22_080.0, 21_120.0, 20_160.0, 17_280.0, 11_520.0, 20_976.0, 20_064.0, 41_952.0,
                40_128.0,
            ],
        ),
        (
            "samsung-sm843t",
            19_200.0,
            [
                18_400.0, 17_600.0, 18_400.0, 17_600.0, 16_800.0, 14_400.0, 9_600.0, 17_480.0, 16_720.0, 34_960.0,
                33_440.0,
            ],
        ),
        (
            "intel-dc-s3700",
            19_200.0,
            [
                18_400.0, 17_600.0, 18_400.0, 17_600.0, 16_800.0, 14_400.0, 9_600.0, 17_480.0, 16_720.0, 34_960.0,
                33_440.0,
            ],
        ),
    ];
    for (preset, gross, landable) in cases {
        let plan = planned(preset);
        assert_row(&plan, "gross surface", [gross; 11], |column| column.gross_gigabytes, 0);
        assert_row(&plan, "landable surface", landable, |column| column.landable_gigabytes, 0);
    }
}

#[test]
fn seed_001_costs_table_3_and_tables_4_to_7() {
    let cases: [(&str, f64, [f64; 4], [f64; 11]); 4] = [
        (
            "crucial-m550",
            10_680.0,
            [4_400.0, 4_200.0, 8_800.0, 8_400.0],
            [0.61, 0.63, 0.61, 0.63, 0.66, 0.77, 1.16, 0.83, 0.86, 0.52, 0.53],
        ),
        (
            "samsung-sm843tn",
            24_672.0,
            [4_200.0, 4_000.0, 8_400.0, 8_000.0],
            [1.28, 1.34, 1.28, 1.34, 1.40, 1.64, 2.45, 1.55, 1.61, 0.87, 0.90],
        ),
        (
            "samsung-sm843t",
            24_672.0,
            [3_600.0, 3_400.0, 7_200.0, 6_800.0],
            [1.54, 1.61, 1.54, 1.61, 1.68, 1.96, 2.95, 1.82, 1.89, 1.01, 1.05],
        ),
        (
            "intel-dc-s3700",
            47_520.0,
            [3_600.0, 3_400.0, 7_200.0, 6_800.0],
            [2.78, 2.90, 2.78, 2.90, 3.04, 3.55, 5.33, 3.13, 3.26, 1.67, 1.73],
        ),
    ];
    for (preset, media, licences, cost_per_gigabyte) in cases {
        let plan = planned(preset);
        for column in &plan.columns {
            assert_eq!(rounded(column.media_cost, 0), media, "{preset}: media cost");
            assert_eq!(column.chassis_cost, 3_600.0);
        }
        // The licence: 200 per started TiB of landable space, 400 compressed.
        let stripelog = [
            Topology::StripelogRaid5,
            Topology::StripelogRaid6,
            Topology::StripelogRaid5Compressed,
            Topology::StripelogRaid6Compressed,
        ];
        for (topology, licence) in stripelog.iter().zip(licences) {
            assert_eq!(column(&plan, *topology).licence_cost, licence, "{preset}: licence of {}", topology.name());
        }
        assert_row(&plan, "cost per addressable GB", cost_per_gigabyte, |column| column.cost_per_gigabyte, 2);
    }
}

#[test]
fn seed_001_overwrites_per_day_table_1_where_they_follow_from_the_inputs() {
    // Crucial M550 (3,000 cycles, WA 8): every column reproduces.
    assert_row(
        &planned("crucial-m550"),
        "overwrites per day",
        [1.64, 1.64, 0.11, 0.07, 0.12, 0.09, 0.21, 1.33, 1.33, 1.33, 1.33],
        |column| column.overwrites_per_day.unwrap(),
        2,
    );
    // Intel DC S3700 (rated 11 drive writes a day): every column reproduces.
    assert_row(
        &planned("intel-dc-s3700"),
        "overwrites per day",
        [11.00, 11.00, 5.74, 4.00, 6.29, 4.89, 11.00, 11.58, 11.58, 11.58, 11.58],
        |column| column.overwrites_per_day.unwrap(),
        2,
    );
    // SM843TN (20,000 cycles, WA 8): the linear columns and RAID-6/60 reproduce; the seed's
    // RAID-5, RAID-50 and RAID-10 (0.72, 0.79, 1.38) need a write amplification of 7.94;
    // 8 gives 0.71, 0.78, 1.37. Its ESS columns print 8.91, which needs 1.295 where the
    // seed states 1.3 (8.87). The Samsung tables all sit about 0.4 % above their inputs.
    let tn = planned("samsung-sm843tn");
    let expected = [10.96, 10.96, 0.71, 0.50, 0.78, 0.61, 1.37, 8.87, 8.87, 8.87, 8.87];
    assert_row(&tn, "overwrites per day", expected, |column| column.overwrites_per_day.unwrap(), 2);
    let implied: f64 = 20_000.0 * 23_040.0 / 1_825.0 / 2.0 / 11_520.0 / 1.38;
    assert!((implied - 7.94).abs() < 0.01, "the seed's 1.38 implies a write amplification of {implied}");
    // SM843T ("typically 2:1"): linear columns and RAID-60 reproduce; RAID-5, RAID-6,
    // RAID-50 and RAID-10 print 2.87, 2.00, 3.14, 5.50, which need a write amplification
    // of 1.9925; 2 gives 2.86, 1.99, 3.13, 5.48. Its ESS columns are 8.87 as above.
    let t = planned("samsung-sm843t");
    let expected = [10.96, 10.96, 2.86, 1.99, 3.13, 2.44, 5.48, 8.87, 8.87, 8.87, 8.87];
    assert_row(&t, "overwrites per day", expected, |column| column.overwrites_per_day.unwrap(), 2);
    let implied: f64 = 20_000.0 * 19_200.0 / 1_825.0 / 2.0 / 18_400.0 / 2.87;
    assert!((implied - 1.9925).abs() < 0.002, "the seed's 2.87 implies a write amplification of {implied}");
}

#[test]
fn seed_001_random_write_iops_table_2() {
    let cases = [
        ("crucial-m550", [80_000.0, 80_000.0, 240_000.0, 240_000.0, 960_000.0]),
        ("samsung-sm843tn", [15_000.0, 15_000.0, 45_000.0, 45_000.0, 180_000.0]),
        ("samsung-sm843t", [15_000.0, 15_000.0, 45_000.0, 45_000.0, 180_000.0]),
        ("intel-dc-s3700", [37_000.0, 37_000.0, 111_000.0, 111_000.0, 444_000.0]),
    ];
    for (preset, md) in cases {
        let plan = planned(preset);
        for topology in [Topology::LinearRaid5, Topology::LinearRaid6] {
            assert_eq!(column(&plan, topology).random_write_iops, None, "n/a for linear columns");
        }
        for (topology, expected) in SEED_001_COLUMNS[2..7].iter().zip(md) {
            assert_eq!(column(&plan, *topology).random_write_iops, Some(expected), "{preset} {topology:?}");
        }
        // ESS figures are the seed's measurements, taken as inputs and labelled so.
        for (topology, expected) in SEED_001_COLUMNS[7..].iter().zip([1_531_800.0, 1_452_000.0, 966_000.0, 924_000.0]) {
            let ess = column(&plan, *topology);
            assert_eq!((ess.random_write_iops, ess.random_write_iops_basis), (Some(expected), Basis::Measured));
        }
    }
}

/// Seed 000 section 10: 24 drives of 256 GB flash, 5,000 erase cycles, 2 TB a day.
/// RAID-10 on the 200 GB enterprise setting (27 % free, wear coefficient 3.7) lasts 5.55
/// years; SuperCharger RAID-5 on the 256 GB setting with the same 2,400 GB addressable
/// (59.25 % free) 23.35 years.
#[test]
fn seed_000_section_10_life_raid10_against_the_log() {
    let build = Build {
        drive_count: 24,
        chassis_cost: 0.0,
        daily_writes_gigabytes: 2_048.0,
        compression_ratio: 1.0,
        stripelog_write_amplification: None,
        ..Build::seed_001_chassis()
    };
    let drive = Drive {
        name: "MLC 256 GB".into(),
        size_gigabytes: 200.0,
        raw_size_gigabytes: Some(256.0),
        price: 0.0,
        erase_cycles: Some(5_000.0),
        drive_writes_per_day: None,
        write_amplification: None,
        spare_fraction: Some(0.27),
        random_read_iops: None,
        random_write_iops: 1.0,
        linear_write_megabytes_per_second: None,
        source: String::new(),
    };
    let enterprise = plan(&PlanInput { drive: drive.clone(), build: build.clone() }).unwrap();
    let raid10 = column(&enterprise, Topology::Raid10);
    assert_eq!(raid10.landable_gigabytes, 2_400.0);
    assert_eq!(rounded(raid10.life_years.unwrap(), 2), 5.55);
    // The log: drives at their 256 GB setting, spare chosen for RAID-10's 2,400 GB.
    let consumer_setting =
        Drive { size_gigabytes: 256.0, spare_fraction: None, write_amplification: Some(1.0), ..drive };
    let spare = 1.0 - 2_400.0 / (23.0 * 256.0);
    assert_eq!(rounded(spare, 4), 0.5924);
    let log = plan(&PlanInput { drive: consumer_setting, build: Build { stripelog_spare_fraction: spare, ..build } })
        .unwrap();
    let raid5 = column(&log, Topology::StripelogRaid5);
    assert!((raid5.landable_gigabytes - 2_400.0).abs() < 1e-6);
    // The seed rounds 3.5223 TB a day to 3.52 before dividing: 23.35; unrounded 23.33.
    let life = raid5.life_years.unwrap();
    assert_eq!(rounded(life, 2), 23.33, "unrounded");
    assert!((life / 23.35 - 1.0).abs() < 0.001, "within the seed's rounding: {life}");
    assert!(life / raid10.life_years.unwrap() > 4.0, "the seed's four-fold");
}

/// Seed 000 section 18: the 70/30 normalisation of section 17's array figures — its R and
/// W, which section 17 builds with an unstated 0.9 and measured overrides (docs/planner.md),
/// taken here as inputs. All four tables that have a section 17 counterpart, nine drives
/// each, both columns: 72 figures. (The fifth, SATA-3, table's R and W are not given.)
#[test]
fn seed_000_section_18_seventy_thirty_columns() {
    // Drives in the seed's order: Intel x25-E, Marvel P-300, SandForce 1500, SandForce
    // 1200, Barefoot 32GB, Barefoot 128GB, jMicron 616, Marvel C-300 128GB and 256GB.
    let raw_reads = [252_000.0, 432_000.0, 164_419.0, 120_000.0, 114_178.0, 134_937.0, 95_846.0, 432_000.0, 432_000.0];
    let limited_reads = [95_000.0; 9];
    let full_speed_log =
        [247_273.0, 400_000.0, 143_338.0, 143_338.0, 160_051.0, 189_091.0, 85_818.0, 203_636.0, 312_727.0];
    // (table, reads, RAID-10 writes, log writes, RAID-10 70/30, log 70/30)
    type Table = (&'static str, [f64; 9], [f64; 9], [f64; 9], [f64; 9], [f64; 9]);
    let tables: [Table; 4] = [
        (
            "raw",
            raw_reads,
            [17_280.0, 162_000.0, 72_000.0, 37_410.0, 8_669.0, 10_015.0, 9_540.0, 108_000.0, 162_000.0],
            full_speed_log,
            [49_655.0, 288_000.0, 118_707.0, 72_189.0, 24_548.0, 28_456.0, 25_807.0, 227_368.0, 288_000.0],
            [250_563.0, 421_875.0, 157_471.0, 126_162.0, 124_919.0, 147_620.0, 92_600.0, 323_250.0, 387_646.0],
        ),
        (
            "controller limits",
            limited_reads,
            [17_280.0, 47_500.0, 47_500.0, 37_410.0, 8_669.0, 10_015.0, 9_540.0, 47_500.0, 47_500.0],
            full_speed_log,
            [40_437.0, 73_077.0, 73_077.0, 64_987.0, 23_824.0, 26_793.0, 25_763.0, 73_077.0, 73_077.0],
            [116_528.0, 123_177.0, 105_693.0, 105_693.0, 108_192.0, 111_670.0, 92_046.0, 113_101.0, 120_081.0],
        ),
        (
            "worst-case wear",
            limited_reads,
            [13_200.0, 47_500.0, 20_201.0, 10_101.0, 2_341.0, 3_005.0, 2_862.0, 32_400.0, 47_500.0],
            [66_764.0, 108_000.0, 38_701.0, 38_701.0, 43_214.0, 51_055.0, 23_171.0, 54_982.0, 84_436.0],
            [33_227.0, 73_077.0, 45_007.0, 26_976.0, 7_378.0, 9_327.0, 8_913.0, 60_141.0, 73_077.0],
            [84_304.0, 98_559.0, 66_137.0, 66_137.0, 69_878.0, 75_503.0, 49_223.0, 77_974.0, 91_563.0],
        ),
        (
            "average wear",
            limited_reads,
            [13_200.0, 47_500.0, 44_892.0, 22_446.0, 5_201.0, 6_677.0, 6_360.0, 47_500.0, 47_500.0],
            [148_364.0, 240_000.0, 86_003.0, 86_003.0, 96_031.0, 113_455.0, 51_491.0, 122_182.0, 187_636.0],
            [33_227.0, 73_077.0, 71_169.0, 48_230.0, 15_374.0, 19_120.0, 18_336.0, 73_077.0, 73_077.0],
            [106_491.0, 116_031.0, 92_109.0, 92_109.0, 95_307.0, 99_874.0, 75_788.0, 101_794.0, 111_517.0],
        ),
    ];
    // Within 0.02 %: the seed's inputs are themselves rounded (Barefoot worst case:
    // 95,000 / 2,341 gives 7,379.05, printed 7,378; its 2,341 is 8,669 × 0.27 rounded).
    for (table, reads, raid10_writes, log_writes, raid10_mixed, log_mixed) in tables {
        for drive in 0..9 {
            let raid10 = mixed_iops(reads[drive], raid10_writes[drive]);
            assert!((raid10 / raid10_mixed[drive] - 1.0).abs() < 2e-4, "{table}, drive {drive}, RAID-10: {raid10}");
            let log = mixed_iops(reads[drive], log_writes[drive]);
            assert!((log / log_mixed[drive] - 1.0).abs() < 2e-4, "{table}, drive {drive}, log: {log}");
        }
    }
}

/// The planner's own figures for a section 17 drive follow the section's method: reads
/// capped at 95,000 member I/Os, RAID-10 writes at half that.
#[test]
fn controller_limits_cap_member_ios() {
    let plan = planned("marvell-p300");
    let raid10 = column(&plan, Topology::Raid10);
    assert_eq!(raid10.random_write_iops, Some(47_500.0));
    assert_eq!(raid10.mixed_70_30_iops.map(f64::round), Some(73_077.0), "section 18's controller-limited P-300");
    let raid5 = column(&plan, Topology::Raid5);
    assert_eq!(raid5.random_write_iops, Some(23_750.0), "four member I/Os per read-modify-write");
    // stripelog: 7 data drives × 275 MB/s in 4 KiB writes ÷ the cleaner's 1 ÷ 0.27.
    let log = column(&plan, Topology::StripelogRaid5);
    let expected = 7.0 * 275e6 / 4096.0 * 0.27;
    assert!((log.random_write_iops.unwrap() - expected).abs() < 1.0);
    assert_eq!(log.random_write_iops_basis, Basis::Computed);
}

#[test]
fn every_preset_plans_and_bad_inputs_get_clear_errors() {
    for name in presets::NAMES {
        let plan = planned(name);
        assert_eq!(plan.columns.len(), 11);
        assert!(stripelog_planner::table(&plan).contains("cost per addressable GB"), "{name}");
    }
    let good = presets::preset("crucial-m550").unwrap();
    let mut odd = good.clone();
    odd.build.drive_count = 7;
    assert!(plan(&odd).unwrap_err().contains("even drive count"));
    let mut groups = good.clone();
    groups.build.raid_group_count = 5;
    assert!(plan(&groups).unwrap_err().contains("groups"));
    let mut spare = good.clone();
    spare.build.stripelog_spare_fraction = 1.0;
    assert!(plan(&spare).unwrap_err().contains("spare"));
    let mut both = good.clone();
    both.drive.drive_writes_per_day = Some(3.0);
    assert!(plan(&both).unwrap_err().contains("not both"));
    let mut nan = good.clone();
    nan.drive.size_gigabytes = f64::NAN;
    assert!(plan(&nan).unwrap_err().contains("drive size"));
    let mut measured = good.clone();
    measured.build.stripelog_measured_iops.as_mut().unwrap().raid6 = -1.0;
    assert!(plan(&measured).unwrap_err().contains("measured stripelog RAID-6"));
    let mut huge = good;
    huge.drive.size_gigabytes = 1e307;
    assert!(plan(&huge).unwrap_err().contains("too large or too small"));
}

#[test]
fn a_toml_file_describes_a_plan() {
    let text = r#"
        [drive]
        name = "my drive"
        size_gigabytes = 3840
        price = 300
        drive_writes_per_day = 1
        random_read_iops = 700000
        random_write_iops = 90000
        linear_write_megabytes_per_second = 2000

        [build]
        drive_count = 12
        chassis_cost = 5000
        daily_writes_gigabytes = 10000
        compression_ratio = 1.5
        stripelog_spare_fraction = 0.2
        raid_group_count = 2
        service_years = 5
    "#;
    let input = PlanInput::from_toml(text).unwrap();
    let plan = plan(&input).unwrap();
    let log = column(&plan, Topology::StripelogRaid5);
    assert_eq!(log.write_amplification, 5.0, "the seeds' wear coefficient 1 ÷ 20 %");
    assert!(log.mixed_70_30_iops.is_some() && log.overwrites_per_day.is_some());
    assert!(PlanInput::from_toml("[drive]\nname = 1").unwrap_err().contains("name"));
    assert!(PlanInput::from_toml(&text.replace("price", "prize")).is_err(), "unknown keys are refused");
}
