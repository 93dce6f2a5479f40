//! The seeds' flash experiments at a small scale: they run end to end on simulated drives
//! and show the shapes the seeds report (the full-size figures are in docs/experiments.md).

use stripelog_bench::flash::{lame_raid, overprovisioning, wear};

const MIB: u64 = 1 << 20;

#[test]
fn write_saturation_drops_to_a_steady_state_and_extra_spare_lifts_it() {
    let report = overprovisioning::run(&overprovisioning::Options {
        drive: "consumer-mlc".into(),
        drive_size_bytes: 128 * MIB,
        raised_spare_fraction: 0.375,
        queue_depth: 32,
        virtual_seconds: 120,
        seed: 7,
    })
    .unwrap();
    let [normal, raised] = &report.runs[..] else { panic!("two runs") };
    assert!(normal.steady_iops < normal.fresh_iops / 3.0, "{normal:?}");
    assert!(report.steady_gap > 2.0, "gap {}", report.steady_gap);
    assert!((raised.total_spare_fraction - 0.375).abs() < 0.01);
    assert!(normal.steady_write_amplification > 3.0 * raised.steady_write_amplification / 2.0);
    assert!(overprovisioning::table(&report).contains("steady IOPS"));
}

#[test]
fn parity_raid_collapses_on_random_writes_and_stripelog_wears_the_drives_least() {
    let report = wear::run(
        &wear::Options {
            drive_presets: vec!["consumer-mlc".into()],
            drives: 4,
            drive_size_bytes: 64 * MIB,
            md_chunk_size_bytes: 64 << 10,
            // Segments of 512 KiB chunks: 127 on each drive, so the spare is many segments.
            stripelog_chunk_size_bytes: 512 << 10,
            stripelog_spare_fraction: Some(0.3),
            warm_passes: 0.5,
            measured_passes: 0.5,
            nominal_drive_size_bytes: 256e9,
            daily_write_bytes: 2e12,
            seed: 3,
        },
        &|_, _| {},
    )
    .unwrap();
    let row = |name: &str| report.rows.iter().find(|row| row.topology.starts_with(name)).unwrap();
    let (raid10, raid5, stripelog5) = (row("md RAID-10"), row("md RAID-5"), row("stripelog RAID-5"));
    // md: every random write is two member writes (mirror, or data + parity).
    assert!((raid10.raid_amplification - 2.0).abs() < 0.05, "{raid10:?}");
    assert!((raid5.raid_amplification - 2.0).abs() < 0.05, "{raid5:?}");
    // stripelog writes the drives sequentially: their FTLs barely amplify.
    assert!(stripelog5.device_write_amplification < 1.3, "{stripelog5:?}");
    assert!(raid5.device_write_amplification > 2.0, "{raid5:?}");
    assert!(stripelog5.nand_bytes_per_host_byte < raid10.nand_bytes_per_host_byte / 1.5);
    assert!(stripelog5.host_iops > 2.0 * raid10.host_iops && raid10.host_iops > raid5.host_iops);
    assert!(stripelog5.life_years_at_daily_writes > raid10.life_years_at_daily_writes);
}

#[test]
fn the_lame_raid_experiment_runs_every_writer_on_paced_drives() {
    let report = lame_raid::run(
        &lame_raid::Options {
            drive: "consumer-mlc".into(),
            drives: 2,
            drive_size_bytes: 32 * MIB,
            chunk_size_bytes: 512 << 10,
            written_share: 0.3,
            precondition_passes: 0.5,
            real_seconds_per_virtual_second: 0.5,
            gc_burst_blocks: Some(4),
            seed: 1,
        },
        &|_| {},
    )
    .unwrap();
    assert_eq!(report.cases.len(), 4);
    for case in &report.cases {
        assert!(case.bytes_per_second > 1e6 && case.virtual_seconds > 0.0, "{case:?}");
    }
    assert_eq!(report.cases[0].per_drive_bytes_per_second.len(), 2);
}
