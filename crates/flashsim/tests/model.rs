//! The drive model's behaviour: bandwidth, partial-page writes, trim, throttle, cache,
//! wear levelling, clocks, and the FTL's bookkeeping under random operations.

use proptest::prelude::*;
use std::time::Instant;
use stripelog_blockdev::{AlignedBuffer, BlockDevice, Prng};
use stripelog_flashsim::{Clock, DriveModel, FlashDevice, FlashDrive};

const MIB: u64 = 1 << 20;

fn preset(name: &str, size_bytes: u64) -> DriveModel {
    DriveModel::preset(name, size_bytes).unwrap()
}

#[test]
fn a_fresh_drive_writes_sequentially_at_its_nand_bandwidth() {
    for name in stripelog_flashsim::PRESET_NAMES {
        let model = preset(name, 256 * MIB);
        let expected = model.linear_write_bytes_per_second();
        let mut drive = FlashDrive::new(model).unwrap();
        let mut end = 0;
        for offset in (0..128 * MIB).step_by(MIB as usize) {
            end = drive.write(offset, MIB, 0).unwrap();
        }
        let measured = (128 * MIB) as f64 / (end as f64 / 1e9);
        assert!((measured / expected - 1.0).abs() < 0.05, "{name}: {measured:.0} B/s vs {expected:.0}");
        assert_eq!(drive.statistics().write_amplification(drive.model().geometry.page_size_bytes), 1.0);
    }
}

#[test]
fn a_small_write_to_a_large_mapping_unit_reprograms_the_whole_unit() {
    let mut drive = FlashDrive::new(preset("barefoot", 64 * MIB)).unwrap();
    drive.write(0, 16384, 0).unwrap();
    drive.write(4096, 4096, 0).unwrap();
    let statistics = drive.statistics();
    assert_eq!(statistics.host_program_pages, 2);
    assert_eq!(statistics.nand_read_pages, 1, "the old 16 KiB unit is read to merge");
    assert!((statistics.write_amplification(16384) - 32768.0 / 20480.0).abs() < 1e-9);
}

#[test]
fn trim_frees_pages_only_when_the_drive_honours_it() {
    for honours in [true, false] {
        let mut model = preset("consumer-mlc", 64 * MIB);
        model.ftl.honours_trim = honours;
        let mut drive = FlashDrive::new(model).unwrap();
        drive.write(0, 8 * MIB, 0).unwrap();
        drive.trim(0, 4 * MIB, 0).unwrap();
        let expected = if honours { 4 * MIB / 4096 } else { 8 * MIB / 4096 };
        assert_eq!(drive.mapped_pages(), expected);
        drive.verify_consistency().unwrap();
    }
}

#[test]
fn the_throttle_caps_write_requests_after_its_delay() {
    let mut model = preset("sandforce-1200", 64 * MIB);
    model.ftl.throttle.as_mut().unwrap().after_seconds = 0.5;
    let mut drive = FlashDrive::new(model).unwrap();
    let pages = drive.size_bytes() / 4096;
    let mut prng = Prng::new(5);
    // Always backlogged (arrival 0): completions counted in the first 0.4 s of virtual
    // time and in a later second.
    let (mut early, mut late) = (0, 0);
    let mut now = 0;
    while now < 3_000_000_000 {
        now = drive.write(prng.below(pages / 4) * 4096, 4096, 0).unwrap();
        match now {
            0..=400_000_000 => early += 1,
            2_000_000_000..=2_999_999_999 => late += 1,
            _ => {}
        }
    }
    assert!(early as f64 / 0.4 > 15_000.0, "unthrottled: {early} in 0.4 s");
    assert!(late <= 10_001, "throttled to 10 000 per second: {late}");
}

#[test]
fn a_write_cache_acknowledges_before_the_nand_is_programmed() {
    let mut with_cache = preset("enterprise-emlc", 64 * MIB);
    with_cache.ftl.write_cache_pages = 64;
    let mut without = with_cache.clone();
    without.ftl.write_cache_pages = 0;
    let mut cached = FlashDrive::new(with_cache).unwrap();
    let mut uncached = FlashDrive::new(without).unwrap();
    let cached_done = cached.write(0, 4096, 0).unwrap();
    let uncached_done = uncached.write(0, 4096, 0).unwrap();
    assert!(cached_done < uncached_done);
    assert_eq!(cached.flush(cached_done), uncached_done, "a flush waits for the program");
}

#[test]
fn wear_levelling_moves_cold_data_so_that_erases_spread_less() {
    let spread = |threshold: u32| {
        let mut model = preset("consumer-mlc", 128 * MIB);
        model.ftl.wear_leveling_threshold_erases = threshold;
        let mut drive = FlashDrive::new(model).unwrap();
        let pages = drive.size_bytes() / 4096;
        for page in 0..pages {
            drive.write(page * 4096, 4096, 0).unwrap();
        }
        // Hot: the first tenth of the drive takes every write; the rest stays cold.
        let mut prng = Prng::new(9);
        for _ in 0..pages * 30 {
            drive.write(prng.below(pages / 10) * 4096, 4096, 0).unwrap();
        }
        drive.verify_consistency().unwrap();
        (drive.erase_spread(), drive.statistics().wear_leveling_moves)
    };
    let (levelled, moves) = spread(16);
    let (unlevelled, no_moves) = spread(u32::MAX);
    assert!(moves > 0 && no_moves == 0);
    assert!(
        levelled.standard_deviation < unlevelled.standard_deviation / 2.0 && levelled.minimum > unlevelled.minimum,
        "levelled {levelled:?} against {unlevelled:?}"
    );
}

#[test]
fn a_device_keeps_data_and_a_paced_clock_takes_real_time() {
    let device = FlashDevice::new(preset("consumer-mlc", 64 * MIB), "test").unwrap();
    let mut buffer = AlignedBuffer::zeroed(MIB as usize);
    Prng::new(3).fill(buffer.as_mut_slice());
    device.write_at(buffer.as_slice(), 4 * MIB).unwrap();
    let mut back = AlignedBuffer::zeroed(MIB as usize);
    device.read_at(back.as_mut_slice(), 4 * MIB).unwrap();
    assert_eq!(back.as_slice(), buffer.as_slice());
    assert!(device.write_at(&buffer.as_slice()[..512], 0).is_err(), "misaligned requests are refused");
    // Past the write cache, 24 MiB take at least their NAND program time; paced at 1:1
    // the writes take as long for real.
    let model = device.model();
    let cache_bytes = u64::from(model.ftl.write_cache_pages) * u64::from(model.geometry.page_size_bytes);
    let minimum_seconds = (24 * MIB - cache_bytes) as f64 / model.nand_write_bytes_per_second();
    device.set_clock(Clock::Paced { real_seconds_per_virtual_second: 1.0 });
    let started = Instant::now();
    for offset in (8 * MIB..32 * MIB).step_by(MIB as usize) {
        device.write_at(buffer.as_slice(), offset).unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert!(elapsed > 0.9 * minimum_seconds, "paced writes returned after {elapsed} s");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Random writes, partial writes, trims and flushes never break the FTL's maps,
    /// and every written page stays mapped.
    #[test]
    fn the_ftl_s_bookkeeping_survives_any_sequence(seed in any::<u64>(), barefoot in any::<bool>()) {
        let name = if barefoot { "barefoot" } else { "consumer-mlc" };
        let mut model = preset(name, 8 * MIB);
        model.ftl.gc_burst_blocks = (seed % 4) as u32;
        let mut drive = FlashDrive::new(model).unwrap();
        let blocks = drive.size_bytes() / 4096;
        let mut prng = Prng::new(seed);
        let mut now = 0;
        for _ in 0..6_000 {
            let offset = prng.below(blocks) * 4096;
            let length = (1 + prng.below(8)).min(blocks - offset / 4096) * 4096;
            now = match prng.below(20) {
                0 => drive.trim(offset, length, now).unwrap(),
                1 => drive.flush(now),
                2 => drive.read(offset, length, now).unwrap(),
                _ => drive.write(offset, length, now).unwrap(),
            };
        }
        prop_assert!(drive.verify_consistency().is_ok(), "{:?}", drive.verify_consistency());
        prop_assert!(drive.mapped_pages() <= drive.size_bytes() / drive.model().geometry.page_size_bytes as u64);
    }
}
