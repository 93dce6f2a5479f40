//! Whether a client block is compressed when it is accepted: the volume's setting, and
//! the share of blocks the CPU can afford (docs/compression.md, "Where the CPU goes").
//! Compression runs on the accepting thread before the state lock is taken.

use crate::layout::format::CompressionSetting;
use crate::layout::packed::{self, Compressed};
use crate::stats::Counters;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// The share of blocks compressed is in thousandths.
pub const SHARE_WHOLE: u32 = 1000;
/// The controller looks at the CPU at most this often.
pub const CONTROL_INTERVAL: Duration = Duration::from_millis(100);
/// The CPU counts as the limit at this share of the cores the process may use.
const CPU_BUSY_PER_MILLE: u64 = 900;
/// After this many offered units in a row did not compress, only one in
/// [`TRIED_WHILE_REFUSING`] is tried until one compresses again: incompressible data comes
/// in runs (media, encrypted or already compressed files), and even the probe costs CPU
/// that a 2-core server lacks (docs/compression.md, "Where the CPU goes").
pub const REFUSALS_BEFORE_SKIPPING: u64 = 64;
pub const TRIED_WHILE_REFUSING: u64 = 8;
/// The share never drops below this: the controller keeps measuring what compression
/// costs, and incompressible data is refused by the probe at little cost anyway.
const SHARE_MINIMUM: u32 = 50;

thread_local! {
    /// Each accepting thread's output buffer for [`Compression::compress`], big enough for
    /// any unit ([`packed::COMPRESS_BUFFER_BYTES`]).
    static COMPRESS_BUFFER: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(vec![0u8; packed::COMPRESS_BUFFER_BYTES]);
}

pub(crate) struct Compression {
    setting: AtomicU8,
    /// Blocks compressed per [`SHARE_WHOLE`] offered.
    share: AtomicU32,
    /// The share follows the CPU (`false`: fixed, as the simulation runs it).
    adaptive: bool,
    /// Advanced by the share for each block offered; a block is compressed when it
    /// crosses a multiple of [`SHARE_WHOLE`] (deterministic: no randomness).
    credit: AtomicU64,
    /// Offered blocks in a row that did not compress, and the offers skipped since.
    refused_in_a_row: AtomicU64,
    offers_while_refusing: AtomicU64,
    controller: Mutex<Controller>,
}

struct Controller {
    measured_at: Instant,
    cpu_seconds: f64,
}

impl Compression {
    pub(crate) fn new(setting: CompressionSetting, adaptive: bool) -> Compression {
        Compression {
            setting: AtomicU8::new(setting.code()),
            share: AtomicU32::new(SHARE_WHOLE),
            adaptive,
            credit: AtomicU64::new(0),
            refused_in_a_row: AtomicU64::new(0),
            offers_while_refusing: AtomicU64::new(0),
            controller: Mutex::new(Controller { measured_at: Instant::now(), cpu_seconds: process_cpu_seconds() }),
        }
    }

    pub(crate) fn setting(&self) -> CompressionSetting {
        CompressionSetting::from_code(self.setting.load(Ordering::Relaxed)).unwrap_or_default()
    }

    pub(crate) fn set(&self, setting: CompressionSetting) {
        self.setting.store(setting.code(), Ordering::Relaxed);
    }

    /// Thousandths of the blocks offered that are compressed now.
    pub(crate) fn share(&self) -> u32 {
        self.share.load(Ordering::Relaxed)
    }

    /// Fix the share (tests and the simulation; an adaptive volume's controller moves it).
    pub(crate) fn set_share(&self, share: u32) {
        self.share.store(share.min(SHARE_WHOLE), Ordering::Relaxed);
    }

    /// The fragment of `unit` (1 … 4 whole blocks) when the volume compresses, the share
    /// takes this unit and it saves an eighth; `None`: store its blocks whole. Counts the
    /// outcome for each block.
    pub(crate) fn compress(&self, counters: &Counters, unit: &[u8]) -> Option<Vec<u8>> {
        if self.setting() == CompressionSetting::Off {
            return None;
        }
        let blocks = (unit.len() / crate::layout::geometry::BLOCK_SIZE_BYTES) as u64;
        let share = self.share() as u64;
        let before = self.credit.fetch_add(share, Ordering::Relaxed);
        if (before + share) / SHARE_WHOLE as u64 == before / SHARE_WHOLE as u64 {
            Counters::add(&counters.blocks_whole_by_share, blocks);
            return None;
        }
        if self.refused_in_a_row.load(Ordering::Relaxed) >= REFUSALS_BEFORE_SKIPPING
            && !self.offers_while_refusing.fetch_add(1, Ordering::Relaxed).is_multiple_of(TRIED_WHILE_REFUSING)
        {
            Counters::add(&counters.blocks_whole_incompressible, blocks);
            return None;
        }
        // The output goes to this thread's buffer first: a unit the probe refuses then
        // costs no allocation, and one that compresses costs one of its fragment's size.
        let judged = COMPRESS_BUFFER.with_borrow_mut(|output| {
            let judged = packed::compress(unit, output);
            match judged {
                Compressed::Fragment { length } => (judged, output[..length].to_vec()),
                _ => (judged, Vec::new()),
            }
        });
        match judged {
            (Compressed::Fragment { length }, fragment) => {
                self.refused_in_a_row.store(0, Ordering::Relaxed);
                self.offers_while_refusing.store(0, Ordering::Relaxed);
                Counters::add(&counters.blocks_compressed, blocks);
                Counters::add(&counters.fragment_bytes, length as u64);
                Some(fragment)
            }
            (Compressed::RefusedByProbe | Compressed::TooLarge, _) => {
                self.refused_in_a_row.fetch_add(1, Ordering::Relaxed);
                Counters::add(&counters.blocks_whole_incompressible, blocks);
                None
            }
        }
    }

    /// Move the share after the CPU, at most every [`CONTROL_INTERVAL`]: down a quarter
    /// when the process kept the cores it may use busy while the members were not the
    /// limit (`members_busy`: the write queue holds batches waiting for them), up a quarter
    /// of what remains otherwise.
    pub(crate) fn control(&self, members_busy: bool) {
        if !self.adaptive || self.setting() == CompressionSetting::Off {
            return;
        }
        let mut controller = self.controller.lock();
        let elapsed = controller.measured_at.elapsed();
        if elapsed < CONTROL_INTERVAL {
            return;
        }
        let cpu_seconds = process_cpu_seconds();
        let busy_per_mille =
            ((cpu_seconds - controller.cpu_seconds) / elapsed.as_secs_f64() / usable_cores() as f64 * 1000.0) as u64;
        *controller = Controller { measured_at: Instant::now(), cpu_seconds };
        let next = next_share(self.share(), busy_per_mille >= CPU_BUSY_PER_MILLE, members_busy);
        self.share.store(next, Ordering::Relaxed);
    }
}

/// The controller's step: down a quarter when the CPU is the limit (busy, and the members
/// are not), else up a quarter of what remains.
fn next_share(share: u32, cpu_busy: bool, members_busy: bool) -> u32 {
    if cpu_busy && !members_busy {
        (share - share / 4).max(SHARE_MINIMUM)
    } else {
        (share + (SHARE_WHOLE - share).div_ceil(4)).min(SHARE_WHOLE)
    }
}

/// CPU time (user + system) of this process so far.
fn process_cpu_seconds() -> f64 {
    // SAFETY: `getrusage` writes a `rusage` into the zeroed struct we own; RUSAGE_SELF
    // is always valid.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The cores this process may run on.
fn usable_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| cores.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compressible() -> Vec<u8> {
        (0..4096u32).map(|index| (index / 64) as u8).collect()
    }

    /// A fixed share compresses exactly that share of the blocks offered, evenly; off
    /// compresses none; incompressible blocks are counted apart.
    #[test]
    fn the_share_decides_deterministically() {
        let counters = Counters::default();
        let compression = Compression::new(CompressionSetting::Lz4, false);
        compression.set_share(250);
        let outcomes: Vec<bool> = (0..8).map(|_| compression.compress(&counters, &compressible()).is_some()).collect();
        assert_eq!(outcomes, [false, false, false, true, false, false, false, true]);
        assert_eq!(Counters::get(&counters.blocks_whole_by_share), 6);
        compression.set_share(SHARE_WHOLE);
        let mut state = 7u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 33) as u8
            })
            .collect();
        assert!(compression.compress(&counters, &noise).is_none());
        assert_eq!(Counters::get(&counters.blocks_whole_incompressible), 1);
        let fragment = compression.compress(&counters, &compressible()).expect("compressible");
        let mut out = vec![0u8; 4096];
        assert_eq!(lz4_flex::block::decompress_into(&fragment, &mut out).unwrap(), 4096);
        assert_eq!(out, compressible());
        compression.set(CompressionSetting::Off);
        assert!(compression.compress(&counters, &compressible()).is_none());
        assert_eq!(Counters::get(&counters.blocks_compressed), 3);
    }

    /// A run of blocks that do not compress makes it try one block in eight, until one
    /// compresses again.
    #[test]
    fn runs_of_incompressible_blocks_are_mostly_not_tried() {
        let counters = Counters::default();
        let compression = Compression::new(CompressionSetting::Lz4, false);
        let mut prng = stripelog_blockdev::Prng::new(3);
        let mut noise = vec![0u8; 4096];
        for _ in 0..=REFUSALS_BEFORE_SKIPPING {
            prng.fill(&mut noise);
            assert!(compression.compress(&counters, &noise).is_none());
        }
        let outcomes: Vec<bool> =
            (0..TRIED_WHILE_REFUSING + 1).map(|_| compression.compress(&counters, &compressible()).is_some()).collect();
        assert_eq!(outcomes, [false, false, false, false, false, false, false, true, true]);
        assert_eq!(Counters::get(&counters.blocks_whole_incompressible), REFUSALS_BEFORE_SKIPPING + 1 + 7);
    }

    /// The controller lowers the share when the CPU is busy and the members are not, and
    /// raises it again otherwise; the CPU time it reads grows with work done.
    #[test]
    fn the_controller_follows_the_cpu() {
        assert_eq!(next_share(1000, true, false), 750, "busy CPU, idle members: a quarter less");
        assert_eq!(next_share(750, true, true), 813, "members busy: a quarter of what remains more");
        assert_eq!(next_share(813, false, false), 860, "idle CPU: up");
        assert_eq!(next_share(SHARE_MINIMUM, true, false), SHARE_MINIMUM, "never below the minimum");
        assert_eq!(next_share(SHARE_WHOLE, false, false), SHARE_WHOLE);
        let before = process_cpu_seconds();
        let until = Instant::now() + Duration::from_millis(50);
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(process_cpu_seconds() > before + 0.01, "{} -> {}", before, process_cpu_seconds());
    }
}
