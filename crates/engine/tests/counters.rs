//! What the volume counts is true across opens and crashes (docs/on-disk-format.md, "The
//! superblock"): write amplification is one figure (member bytes ÷ client bytes) whose
//! parts add up to it; after a crash the lifetime counters count at least every write
//! recovery kept, and no member's wear goes backwards; the recovery report says whether
//! the last open closed cleanly.

mod common;

use stripelog_engine::{CreateOptions, IoMode, OpenOptions, RaidLevel, Volume, VolumeStats, BLOCK_SIZE_BYTES};

const BLOCK: u64 = BLOCK_SIZE_BYTES as u64;

fn content(seed: u64, blocks: u64) -> Vec<u8> {
    (0..blocks * BLOCK).map(|index| ((index * 2_654_435_761 + seed * 97) >> 11) as u8).collect()
}

fn options(io_mode: IoMode) -> OpenOptions {
    // No flush timer and no checkpoint timer: nothing updates the superblocks between the
    // open and the crash but what the test does.
    OpenOptions { io_mode, flush_interval: None, ..OpenOptions::default() }
}

fn assert_amplification_is_one_figure(stats: &VolumeStats, when: &str) {
    // RAID-5 on 5 members: a quarter of the data again as parity, at least.
    assert_amplification_is_one_figure_with(stats, 0.24, when);
    assert!(stats.lifetime_write_amplification.total > 1.0, "{when}: {:?}", stats.lifetime_write_amplification);
}

/// Member bytes ÷ client bytes, the parts adding up to it, and RAID-5 on 5 members giving
/// at least `redundancy_at_least` of parity per client byte.
fn assert_amplification_is_one_figure_with(stats: &VolumeStats, redundancy_at_least: f64, when: &str) {
    let lifetime = &stats.lifetime;
    let amplification = &stats.lifetime_write_amplification;
    let members = lifetime.member_bytes_data
        + lifetime.member_bytes_relocated
        + lifetime.member_bytes_redundancy
        + lifetime.member_bytes_metadata
        + lifetime.member_bytes_padding;
    let expected = members as f64 / lifetime.host_bytes_written as f64;
    assert!((amplification.total - expected).abs() < 1e-9, "{when}: member bytes ÷ client bytes: {amplification:?}");
    let parts = amplification.data
        + amplification.cleaning
        + amplification.redundancy
        + amplification.metadata
        + amplification.padding;
    assert!((parts - amplification.total).abs() < 1e-9, "{when}: the parts add up to the total: {amplification:?}");
    assert!(amplification.redundancy >= redundancy_at_least, "{when}: {amplification:?}");
}

fn lifetime_counters_survive_a_crash(io_mode: IoMode) {
    let devices = common::memory_members(5, 64 << 20);
    let create = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
    let volume = Volume::create(common::members(&devices), &create, &options(io_mode)).expect("create");
    volume.write(0, &content(1, 256), false).expect("write before the clean close");
    volume.close().expect("close");

    let volume = Volume::open(common::members(&devices), &options(io_mode)).expect("open after a clean close");
    let stats = volume.stats();
    assert!(stats.recovery.closed_cleanly, "a volume closed cleanly is reported so: {:?}", stats.recovery);
    assert_eq!(stats.lifetime.host_bytes_written, 256 * BLOCK);
    assert_amplification_is_one_figure(&stats, "after a clean close");
    // Written and flushed after the open's superblock update, then a crash.
    let flushed_blocks = 512;
    volume.write(256 * BLOCK, &content(2, flushed_blocks), false).expect("write before the crash");
    volume.flush().expect("flush before the crash");
    let before_crash = volume.stats();
    assert_eq!(before_crash.lifetime.host_bytes_written, (256 + flushed_blocks) * BLOCK);
    volume.abandon();

    let volume = Volume::open(common::members(&devices), &options(io_mode)).expect("open after the crash");
    let stats = volume.stats();
    assert!(!stats.recovery.closed_cleanly, "a crash is reported: {:?}", stats.recovery);
    assert!(stats.recovery.unclean_shutdown_summary().contains("not closed cleanly"));
    assert!(
        stats.lifetime.host_bytes_written >= before_crash.lifetime.host_bytes_written,
        "{io_mode:?}: the lifetime counters count every write recovery kept: {} before the crash, {} after",
        before_crash.lifetime.host_bytes_written,
        stats.lifetime.host_bytes_written
    );
    for (after, before) in stats.members.iter().zip(&before_crash.members) {
        assert!(
            after.lifetime_bytes_written >= before.lifetime_bytes_written,
            "{io_mode:?}: member {}'s wear went back from {} to {}",
            after.index,
            before.lifetime_bytes_written,
            after.lifetime_bytes_written
        );
    }
    assert!(stats.lifetime.member_bytes_data >= before_crash.lifetime.member_bytes_data);
    assert_amplification_is_one_figure(&stats, "after the crash");
    // Counted once: a clean close and open after the recovery count nothing again.
    let recovered = stats.lifetime;
    volume.close().expect("close after recovery");
    let volume = Volume::open(common::members(&devices), &options(io_mode)).expect("open again");
    let stats = volume.stats();
    assert_eq!(stats.lifetime.host_bytes_written, recovered.host_bytes_written, "nothing counted twice");
    assert_eq!(stats.lifetime.member_bytes_data, recovered.member_bytes_data, "nothing counted twice");
    volume.close().expect("close");
}

#[test]
fn lifetime_counters_survive_a_crash_inline() {
    lifetime_counters_survive_a_crash(IoMode::Inline);
}

#[test]
fn lifetime_counters_survive_a_crash_threaded() {
    lifetime_counters_survive_a_crash(IoMode::Threaded);
}

/// `check` right after a crash tells what the crash left — stripes torn after the last
/// durable point, which the next read-write open rebuilds — from damage: exit status 1
/// (`check_status::CRASH_LEFTOVERS`), never 2 or 4; after a read-write open it is clean.
/// Several seeds, so that some crashes tear stripes (the test says how many did).
#[test]
fn check_after_a_crash_reports_torn_stripes_as_leftovers_not_damage() {
    use std::sync::Arc;
    use stripelog_blockdev::{BlockDevice, SimulatedArray};
    use stripelog_engine::check_status;

    let mut torn_seeds = 0;
    for seed in 0..12u64 {
        let array = SimulatedArray::new(seed);
        let devices: Vec<Arc<dyn BlockDevice>> =
            (0..5).map(|_| array.add_device(16 << 20) as Arc<dyn BlockDevice>).collect();
        let create = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
        let inline = options(IoMode::Inline);
        let volume = Volume::create(common::members(&devices), &create, &inline).expect("create");
        volume.write(0, &content(seed, 64), false).expect("write");
        volume.flush().expect("flush");
        // Batches sealed and written but not synced: the crash drops or tears them.
        for round in 0..4 {
            volume.write((64 + round * 96) * BLOCK, &content(seed + round, 96), false).expect("unflushed write");
        }
        volume.abandon();
        array.crash();

        let read_only = OpenOptions { read_only: true, ..inline.clone() };
        let volume = Volume::open(common::members(&devices), &read_only).expect("read-only open after the crash");
        let report = volume.check().expect("check after the crash");
        assert!(report.unclean_shutdown, "seed {seed}: {report:?}");
        assert_eq!(
            report.status() & !check_status::CRASH_LEFTOVERS,
            0,
            "seed {seed}: a crash is not damage: {report:?}"
        );
        if report.blocks_torn_by_crash + report.rows_torn_by_crash > 0 {
            assert_eq!(report.status(), check_status::CRASH_LEFTOVERS, "seed {seed}: {report:?}");
            torn_seeds += 1;
        }
        drop(volume);

        let volume = Volume::open(common::members(&devices), &inline).expect("read-write open repairs");
        volume.close().expect("close");
        let volume = Volume::open(common::members(&devices), &read_only).expect("read-only open");
        let report = volume.check().expect("check after the repair");
        assert!(report.is_clean() && !report.unclean_shutdown, "seed {seed}: {report:?}");
    }
    eprintln!("{torn_seeds} of 12 crashes tore stripes that check reported as leftovers");
    assert!(torn_seeds > 0, "no crash tore a stripe: the test does not exercise what it guards");
}

/// On a deduplicated volume the write amplification is still member bytes ÷ client bytes:
/// eight copies of one content cost the members a few copies (the finder samples), so the
/// total is below 1 (divided by the data stored, it said more than 1.3).
#[test]
fn write_amplification_counts_what_deduplication_saved() {
    let devices = common::memory_members(5, 64 << 20);
    let create = CreateOptions {
        raid_level: RaidLevel::Raid5,
        chunk_size_bytes: 64 << 10,
        deduplication: true,
        ..Default::default()
    };
    let volume = Volume::create(common::members(&devices), &create, &common::inline_open_options()).expect("create");
    let copy = content(9, 256);
    for index in 0..8u64 {
        volume.write(index * 256 * BLOCK, &copy, false).expect("write a copy");
    }
    volume.close().expect("close");
    let volume = Volume::open(common::members(&devices), &common::inline_open_options()).expect("open");
    let stats = volume.stats();
    assert_eq!(stats.lifetime.host_bytes_written, 8 * 256 * BLOCK);
    assert_amplification_is_one_figure_with(&stats, 0.0, "eight copies deduplicated");
    let amplification = stats.lifetime_write_amplification;
    assert!(amplification.data < 0.5, "a few copies of eight stored: {amplification:?}");
    assert!(amplification.total < 0.75, "{amplification:?}");
    volume.close().expect("close");
}
