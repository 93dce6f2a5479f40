//! The model against theory: under uniform random 4 KiB writes, once steady, the drive's
//! internal write amplification is within 5 % of the analytic greedy value.

use stripelog_blockdev::Prng;
use stripelog_flashsim::theory::greedy_uniform_write_amplification;
use stripelog_flashsim::{DriveModel, FlashDrive};

/// A drive with enough blocks per unit that the reserve and the open blocks (3 per unit)
/// are a negligible share of the spare: 2 units of about 1 700 blocks of 512 pages (2 MiB erase blocks of 4 KiB mapping units:
/// greedy approaches the analytic figure, which is for large blocks, from below).
fn drive(spare_fraction: f64) -> FlashDrive {
    let mut model = DriveModel::preset("consumer-mlc", 3 << 30).unwrap();
    model.geometry.pages_per_block = 512;
    model.geometry.channels = 1;
    model.geometry.dies_per_channel = 1;
    model.geometry.planes_per_die = 2;
    model.ftl.spare_fraction = spare_fraction;
    model.ftl.gc_burst_blocks = 0;
    FlashDrive::new(model).unwrap()
}

/// Fill sequentially, overwrite `warm_passes` × the capacity at random, then measure
/// over `measured_passes` more.
fn steady_write_amplification(drive: &mut FlashDrive, seed: u64, warm_passes: f64, measured_passes: f64) -> f64 {
    let pages = drive.size_bytes() / 4096;
    let mut now = 0;
    for page in 0..pages {
        now = drive.write(page * 4096, 4096, now).unwrap();
    }
    let mut prng = Prng::new(seed);
    let mut overwrite = |drive: &mut FlashDrive, count: u64| {
        for _ in 0..count {
            drive.write(prng.below(pages) * 4096, 4096, 0).unwrap();
        }
    };
    overwrite(drive, (pages as f64 * warm_passes) as u64);
    let before = drive.statistics().clone();
    overwrite(drive, (pages as f64 * measured_passes) as u64);
    drive.statistics().since(&before).write_amplification(4096)
}

#[test]
fn uniform_random_writes_amplify_as_greedy_theory_says() {
    for (spare, seed) in [(0.07, 1), (0.13, 2), (0.27, 3)] {
        let mut drive = drive(spare);
        let measured = steady_write_amplification(&mut drive, seed, 3.0, 1.5);
        let expected = greedy_uniform_write_amplification(spare);
        let error = (measured - expected).abs() / expected;
        eprintln!("spare {spare}: measured {measured:.3}, analytic {expected:.3}, error {:.2} %", error * 100.0);
        assert!(error < 0.05, "spare {spare}: measured {measured:.3} vs analytic {expected:.3}");
        let spread = drive.erase_spread();
        assert!(spread.maximum >= spread.minimum && spread.mean > 0.0);
    }
}
