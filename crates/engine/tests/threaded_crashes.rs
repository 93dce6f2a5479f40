//! Crashes of a threaded volume while clients write from several threads and the cleaner
//! thread relocates behind them (the simulation runs inline: it never cleans while a
//! clients' batch is open, and never races the stripe writer or the flush timer).
//!
//! Members (and the write log's device) are simulated: a crash drops or tears every
//! write not yet flushed. After each reopen, each writer thread's blocks must show a
//! prefix of that thread's writes (the ordered-prefix guarantee, seen per thread) that
//! includes every write it had acknowledged — by a flush that returned, or a FUA write.

mod common;

use common::members;
use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, Prng, SimulatedArray, SimulatedDevice};
use stripelog_engine::{CreateOptions, MemberDevice, OpenOptions, RaidLevel, Volume, WriteLogDevices};

const MEMBER_SIZE_BYTES: u64 = 32 << 20;
const LOG_SIZE_BYTES: u64 = 8 << 20;
const WRITERS: u64 = 2;
const WRITES_PER_BURST: u64 = 2500;

/// What a variant changes.
#[derive(Clone, Copy, Default)]
struct Variant {
    write_log: bool,
    /// Compression and deduplication on, and contents that compress (one write in four) or
    /// repeat (one in four, of 64 contents).
    packed_and_shared: bool,
    /// Checkpoints every 100 ms (their page batches take the clients' place too).
    frequent_checkpoints: bool,
    /// RAID-5 on four members unless set.
    raid_level: Option<RaidLevel>,
    /// While the clients write, bits rot on the first member (one member: every row stays
    /// repairable) and scrubs repair them by moving the damaged segments' live blocks.
    rot_and_scrub: bool,
    /// In the second burst the second member is pulled, replaced and rebuilt while the
    /// clients write and the cleaner relocates (the crash comes after the rebuild).
    replace_during_burst: bool,
}

/// A block's content: its write's identity in the first 8 bytes, the rest incompressible;
/// with `repetitive`, some identities stand for compressible or repeated contents.
fn content(identity: u64, repetitive: bool) -> Vec<u8> {
    if repetitive && identity.is_multiple_of(4) {
        let mut data = vec![(identity >> 8) as u8 % 64; 4096];
        data[..8].copy_from_slice(&((identity >> 8) % 64).to_le_bytes());
        return data;
    }
    if repetitive && identity % 4 == 1 {
        let mut data = vec![identity as u8; 4096];
        data[..8].copy_from_slice(&identity.to_le_bytes());
        return data;
    }
    let mut data = vec![0u8; 4096];
    Prng::new(identity).fill(&mut data);
    data[..8].copy_from_slice(&identity.to_le_bytes());
    data
}

fn identity_of(volume: &Volume, logical_block: u64) -> u64 {
    let mut data = vec![0u8; 4096];
    volume.read(logical_block * 4096, &mut data).unwrap();
    u64::from_le_bytes(data[..8].try_into().unwrap())
}

/// One writer's burst: its writes in order, and how many of them were acknowledged.
struct Burst {
    writes: Vec<(u64, u64)>,
    acknowledged: usize,
}

struct Rig {
    array: SimulatedArray,
    /// The members, in order (a replacement takes its position).
    simulated: std::sync::Mutex<Vec<Arc<SimulatedDevice>>>,
    log: Option<Arc<dyn BlockDevice>>,
    variant: Variant,
}

impl Rig {
    fn new(seed: u64, variant: Variant) -> Rig {
        let array = SimulatedArray::new(seed);
        let raid_level = variant.raid_level.unwrap_or(RaidLevel::Raid5);
        let member_count = if raid_level == RaidLevel::Raid5 { 4 } else { 6 };
        let simulated: Vec<_> = (0..member_count).map(|_| array.add_device(MEMBER_SIZE_BYTES)).collect();
        let devices: Vec<Arc<dyn BlockDevice>> =
            simulated.iter().map(|device| device.clone() as Arc<dyn BlockDevice>).collect();
        let options = CreateOptions {
            raid_level,
            chunk_size_bytes: 64 << 10,
            compression: if variant.packed_and_shared {
                stripelog_engine::layout::format::CompressionSetting::Lz4
            } else {
                Default::default()
            },
            deduplication: variant.packed_and_shared,
            // Cold client writes in a stream of their own: the skewed writers seal pairs of
            // batches that the crashes tear (feature bit 5).
            client_write_pairs: true,
            ..Default::default()
        };
        Volume::create(members(&devices), &options, &OpenOptions::default()).unwrap().close().unwrap();
        let log = variant.write_log.then(|| {
            let log = array.add_device(LOG_SIZE_BYTES) as Arc<dyn BlockDevice>;
            let log_member = MemberDevice { name: "log-0".into(), device: Some(log.clone()) };
            Volume::add_write_log(members(&devices), vec![log_member]).unwrap();
            log
        });
        Rig { array, simulated: std::sync::Mutex::new(simulated), log, variant }
    }

    fn open(&self) -> Volume {
        let options = OpenOptions {
            write_log_devices: self.log.as_ref().map(|log| WriteLogDevices(vec![Some(log.clone())])),
            checkpoint_interval: if self.variant.frequent_checkpoints {
                std::time::Duration::from_millis(100)
            } else {
                OpenOptions::default().checkpoint_interval
            },
            ..OpenOptions::default()
        };
        Volume::open(members(&self.devices()), &options).unwrap()
    }

    fn devices(&self) -> Vec<Arc<dyn BlockDevice>> {
        self.simulated.lock().unwrap().iter().map(|device| device.clone() as Arc<dyn BlockDevice>).collect()
    }

    fn member(&self, index: usize) -> Arc<SimulatedDevice> {
        self.simulated.lock().unwrap()[index].clone()
    }

    /// Pull member `index`, attach a new device in its place, and rebuild it.
    fn replace_and_rebuild(&self, volume: &Volume, index: usize) {
        self.member(index).remove();
        // The next stripes find it gone.
        volume.flush().unwrap();
        let replacement = self.array.add_device(MEMBER_SIZE_BYTES);
        self.simulated.lock().unwrap()[index] = replacement.clone();
        let device = MemberDevice { name: format!("new{index}"), device: Some(replacement as Arc<dyn BlockDevice>) };
        volume.replace_member(index, device, &stripelog_engine::ReplaceOptions::default()).unwrap();
        let report = volume.rebuild(&stripelog_engine::MaintenanceOptions::default(), &|_| {}).unwrap();
        assert_eq!(report.blocks_unrecoverable, 0, "{report:?}");
    }
}

/// Each writer's blocks must show one cut of its burst: for some `cut` at or after the
/// acknowledged writes, every block holds its last write before `cut` (or, with none,
/// what it held before the burst). Repeated contents share an identity, so every cut is
/// tried.
fn check_prefix(volume: &Volume, burst: &Burst, before: &std::collections::HashMap<u64, u64>, what: &str) {
    use std::collections::HashMap;
    let mut history: HashMap<u64, Vec<(usize, u64)>> = HashMap::new();
    for (index, &(logical_block, identity)) in burst.writes.iter().enumerate() {
        history.entry(logical_block).or_default().push((index, identity));
    }
    let found: HashMap<u64, u64> =
        history.keys().map(|&logical_block| (logical_block, identity_of(volume, logical_block))).collect();
    for (&logical_block, writes) in &history {
        let identity = found[&logical_block];
        assert!(
            identity == before[&logical_block] || writes.iter().any(|&(_, written)| written == identity),
            "{what}: block {logical_block} holds {identity:#x}, written by no one (it held {:#x} before the burst)",
            before[&logical_block]
        );
    }
    // The cut: how many of the writes the volume holds.
    let holds_cut = |cut: usize| {
        history.iter().all(|(logical_block, writes)| {
            let expected = writes
                .iter()
                .take_while(|&&(index, _)| index < cut)
                .last()
                .map_or(before[logical_block], |&(_, identity)| identity);
            found[logical_block] == expected
        })
    };
    assert!(
        (burst.acknowledged..=burst.writes.len()).any(holds_cut),
        "{what}: the blocks hold no prefix of the writer's {} writes that includes its {} acknowledged ones",
        burst.writes.len(),
        burst.acknowledged
    );
}

/// Returns the pairs of batches sealed while the clients wrote (feature bit 5).
fn crashes_keep_a_prefix_with_every_acknowledged_write(seed: u64, variant: Variant) -> u64 {
    use std::collections::HashMap;
    let rig = Rig::new(seed, variant);
    let repetitive = variant.packed_and_shared;
    let content = |identity: u64| content(identity, repetitive);
    let volume = rig.open();
    let logical_blocks = volume.logical_size_bytes() / 4096;
    let mut holds: HashMap<u64, u64> = HashMap::new();
    // Fill, then overwrite all over: dead blocks in every segment for the cleaner.
    let mut prng = Prng::new(seed);
    for logical_block in 0..logical_blocks {
        holds.insert(logical_block, 1 << 40 | logical_block << 2 | 2);
        volume.write(logical_block * 4096, &content(holds[&logical_block]), false).unwrap();
    }
    for write in 0..logical_blocks {
        let logical_block = prng.below(logical_blocks);
        holds.insert(logical_block, 2 << 40 | write << 2 | 2);
        volume.write(logical_block * 4096, &content(holds[&logical_block]), false).unwrap();
    }
    volume.close().unwrap();
    let (mut cleaning_rounds, mut scrubs, mut segments_repaired, mut rebuilds) = (0, 0, 0, 0);
    let mut pairs = 0;
    for round in 0..5u64 {
        let volume = rig.open();
        let writing = std::sync::atomic::AtomicBool::new(true);
        let bursts: Vec<Burst> = std::thread::scope(|scope| {
            let scrubber = variant.rot_and_scrub.then(|| {
                let (volume, writing, member) = (&volume, &writing, rig.member(0));
                scope.spawn(move || {
                    let mut prng = Prng::new(seed ^ round);
                    let (mut scrubs, mut repaired) = (0, 0);
                    while writing.load(std::sync::atomic::Ordering::SeqCst) {
                        for _ in 0..4 {
                            // Past the superblocks (the first two chunks).
                            let offset = (128 << 10) + prng.below(MEMBER_SIZE_BYTES - (128 << 10));
                            member.flip_bit(offset, prng.below(8) as u8);
                        }
                        match volume.scrub(&stripelog_engine::MaintenanceOptions::default(), &|_| {}) {
                            Ok(report) => {
                                assert!(report.logical_blocks_unrecoverable.is_empty(), "one member's rot: {report:?}");
                                repaired += report.segments_repaired;
                                scrubs += 1;
                            }
                            // A full volume under the clients' writes may have no room to
                            // move a damaged segment's blocks yet: they stay readable
                            // through parity, and the next scrub tries again.
                            Err(stripelog_engine::Error::OutOfSpace) => {
                                std::thread::sleep(std::time::Duration::from_millis(20))
                            }
                            Err(error) => panic!("scrub: {error}"),
                        }
                    }
                    (scrubs, repaired)
                })
            });
            let replacer = variant.replace_during_burst.then(|| {
                let (volume, rig) = (&volume, &rig);
                scope.spawn(move || {
                    if round == 1 {
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        rig.replace_and_rebuild(volume, 1);
                        return 1;
                    }
                    0
                })
            });
            let handles: Vec<_> = (0..WRITERS)
                .map(|writer| {
                    let (volume, content) = (&volume, &content);
                    scope.spawn(move || {
                        let mut prng = Prng::new(seed << 8 | round << 4 | writer);
                        let mut burst = Burst { writes: Vec::new(), acknowledged: 0 };
                        for write in 0..WRITES_PER_BURST {
                            // Each writer owns the blocks of its residue; four writes in five
                            // go to the first fifth of the volume, so that the rest is written
                            // seldom and its writes go to the cold stream, sealed in pairs
                            // (feature bit 5) that the crashes tear.
                            let slots = logical_blocks / WRITERS;
                            let slot =
                                if prng.below(5) != 0 { prng.below(slots.div_ceil(5)) } else { prng.below(slots) };
                            let logical_block = slot * WRITERS + writer;
                            let data = content((round + 3) << 40 | writer << 32 | write << 8 | (write % 4));
                            let identity = u64::from_le_bytes(data[..8].try_into().unwrap());
                            let fua = prng.below(40) == 0;
                            volume.write(logical_block * 4096, &data, fua).unwrap();
                            burst.writes.push((logical_block, identity));
                            if fua {
                                burst.acknowledged = burst.writes.len();
                            } else if prng.below(20) == 0 {
                                volume.flush().unwrap();
                                burst.acknowledged = burst.writes.len();
                            }
                            if write % 500 == 499 {
                                // Idle for a moment: the cleaner thread cleans behind open batches.
                                std::thread::sleep(std::time::Duration::from_millis(30));
                            }
                        }
                        burst
                    })
                })
                .collect();
            let bursts = handles.into_iter().map(|handle| handle.join().unwrap()).collect();
            writing.store(false, std::sync::atomic::Ordering::SeqCst);
            rebuilds += replacer.map_or(0, |replacer| replacer.join().unwrap());
            if let Some((count, repaired)) = scrubber.map(|scrubber| scrubber.join().unwrap()) {
                scrubs += count;
                segments_repaired += repaired;
            }
            bursts
        });
        cleaning_rounds += volume.stats().cleaning_rounds;
        pairs += volume.stats().client_batch_pairs;
        volume.abandon();
        rig.array.crash();
        let volume = rig.open();
        for (writer, burst) in bursts.iter().enumerate() {
            check_prefix(&volume, burst, &holds, &format!("seed {seed}, round {round}, writer {writer}"));
        }
        for &(logical_block, _) in bursts.iter().flat_map(|burst| burst.writes.iter()) {
            holds.insert(logical_block, identity_of(&volume, logical_block));
        }
        volume.close().unwrap();
    }
    assert!(cleaning_rounds > 0, "the cleaner never ran while the clients wrote");
    assert!(!variant.replace_during_burst || rebuilds > 0, "no rebuild ran during a burst");
    assert!(
        !variant.rot_and_scrub || (scrubs > 0 && segments_repaired > 0),
        "scrubs during the bursts: {scrubs}, segments they repaired: {segments_repaired}"
    );
    pairs
}

#[test]
fn crashes_with_the_cleaner_running_keep_each_writers_prefix() {
    let pairs: u64 =
        (1..=2).map(|seed| crashes_keep_a_prefix_with_every_acknowledged_write(seed, Variant::default())).sum();
    assert!(pairs > 0, "no pair of batches was sealed while the clients wrote");
}

#[test]
fn crashes_with_the_cleaner_running_and_a_write_log_keep_each_writers_prefix() {
    for seed in 1..=2 {
        crashes_keep_a_prefix_with_every_acknowledged_write(seed, Variant { write_log: true, ..Variant::default() });
    }
}

#[test]
fn crashes_with_compression_deduplication_and_frequent_checkpoints_keep_each_writers_prefix() {
    for (seed, write_log) in [(3, false), (4, true)] {
        let variant = Variant { write_log, packed_and_shared: true, frequent_checkpoints: true, ..Variant::default() };
        crashes_keep_a_prefix_with_every_acknowledged_write(seed, variant);
    }
}

#[test]
fn crashes_with_the_cleaner_running_on_raid6_and_raid10_keep_each_writers_prefix() {
    for (seed, raid_level) in [(5, RaidLevel::Raid6), (6, RaidLevel::Raid10)] {
        crashes_keep_a_prefix_with_every_acknowledged_write(
            seed,
            Variant { raid_level: Some(raid_level), ..Variant::default() },
        );
    }
}

#[test]
fn crashes_with_rot_repaired_by_scrubs_while_clients_write_keep_each_writers_prefix() {
    for (seed, write_log) in [(7, false), (8, true)] {
        crashes_keep_a_prefix_with_every_acknowledged_write(
            seed,
            Variant { write_log, rot_and_scrub: true, ..Variant::default() },
        );
    }
}

#[test]
fn crashes_while_a_member_is_replaced_and_rebuilt_keep_each_writers_prefix() {
    for (seed, write_log) in [(9, false), (10, true)] {
        let variant = Variant { write_log, replace_during_burst: true, ..Variant::default() };
        crashes_keep_a_prefix_with_every_acknowledged_write(seed, variant);
    }
}
