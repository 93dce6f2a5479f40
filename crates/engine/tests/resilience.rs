//! Member failure while the volume serves, replacement with an online rebuild, crashes
//! during a rebuild, and scrubbing (docs/resilience.md).

#[allow(dead_code)] // (this file uses one helper of the shared module)
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, Prng, SimulatedArray, SimulatedDevice};
use stripelog_engine::{
    CreateOptions, IoMode, MaintenanceOptions, MemberDevice, OpenOptions, RaidLevel, ReplaceOptions, Volume,
    BLOCK_SIZE_BYTES,
};

const CHUNK_SIZE_BYTES: u32 = 64 << 10;
const MEMBER_SIZE_BYTES: u64 = 8 << 20;
/// Logical blocks the tests write (well inside every geometry's logical size).
const BLOCKS: u64 = 1024;

fn members(devices: &[Arc<SimulatedDevice>]) -> Vec<MemberDevice> {
    devices
        .iter()
        .enumerate()
        .map(|(index, device)| MemberDevice {
            name: format!("m{index}"),
            device: Some(device.clone() as Arc<dyn BlockDevice>),
        })
        .collect()
}

fn open_options(io_mode: IoMode) -> OpenOptions {
    OpenOptions { io_mode, ..OpenOptions::default() }
}

struct Model {
    contents: Vec<Option<Vec<u8>>>,
    prng: Prng,
}

impl Model {
    fn new(seed: u64) -> Model {
        Model { contents: vec![None; BLOCKS as usize], prng: Prng::new(seed) }
    }

    /// Write `count` random blocks at random places, each 1-4 blocks long.
    fn write_some(&mut self, volume: &Volume, count: usize) {
        for _ in 0..count {
            let length = 1 + self.prng.below(4);
            let first = self.prng.below(BLOCKS - length);
            let mut data = vec![0u8; (length as usize) * BLOCK_SIZE_BYTES];
            self.prng.fill(&mut data);
            volume.write(first * BLOCK_SIZE_BYTES as u64, &data, false).expect("write");
            for (index, block) in data.chunks(BLOCK_SIZE_BYTES).enumerate() {
                self.contents[first as usize + index] = Some(block.to_vec());
            }
        }
    }

    fn verify(&self, volume: &Volume) {
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        for (index, expected) in self.contents.iter().enumerate() {
            volume.read(index as u64 * BLOCK_SIZE_BYTES as u64, &mut block).expect("read");
            match expected {
                Some(content) => assert!(block == *content, "block {index} differs"),
                None => assert!(block.iter().all(|&byte| byte == 0), "block {index} should read zeros"),
            }
        }
    }
}

fn create(
    level: RaidLevel,
    count: usize,
    seed: u64,
    io_mode: IoMode,
) -> (SimulatedArray, Vec<Arc<SimulatedDevice>>, Volume) {
    let array = SimulatedArray::new(seed);
    let devices: Vec<_> = (0..count).map(|_| array.add_device(MEMBER_SIZE_BYTES)).collect();
    let options = CreateOptions { raid_level: level, chunk_size_bytes: CHUNK_SIZE_BYTES, ..CreateOptions::default() };
    let volume = Volume::create(members(&devices), &options, &open_options(io_mode)).expect("create");
    (array, devices, volume)
}

/// Lose `lost` members while writing, keep serving, replace them online while another
/// thread writes, and end fully redundant — also after reopening with the new members.
fn lose_and_replace(level: RaidLevel, count: usize, lost: &[usize], seed: u64) {
    let (array, mut devices, volume) = create(level, count, seed, IoMode::Threaded);
    let volume = Arc::new(volume);
    let mut model = Model::new(seed);
    model.write_some(&volume, 300);
    volume.flush().expect("flush");
    for &member in lost {
        devices[member].remove();
        model.write_some(&volume, 100);
        volume.flush().expect("a flush survives a member loss the level covers");
    }
    let stats = volume.stats();
    assert!(stats.degraded, "degraded after losing {lost:?}");
    assert_eq!(stats.missing_members, lost.to_vec());
    if level != RaidLevel::Raid10 {
        assert_eq!(stats.failures_still_tolerated, level.failures_tolerated() - lost.len());
    }
    model.verify(&volume);

    // Replace online: a writer keeps going during the rebuild.
    for &member in lost {
        let replacement = array.add_device(MEMBER_SIZE_BYTES);
        devices[member] = replacement.clone();
        volume
            .replace_member(
                member,
                MemberDevice { name: format!("new{member}"), device: Some(replacement as Arc<dyn BlockDevice>) },
                &ReplaceOptions::default(),
            )
            .expect("replace");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (volume, stop) = (volume.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut prng = Prng::new(seed ^ 0xABCD);
            let mut written = Vec::new();
            // Its own range (the model's blocks are not touched), checked afterwards.
            while !stop.load(Ordering::SeqCst) {
                let block = BLOCKS + prng.below(256);
                let mut data = vec![0u8; BLOCK_SIZE_BYTES];
                prng.fill(&mut data);
                volume.write(block * BLOCK_SIZE_BYTES as u64, &data, false).expect("write during rebuild");
                written.push((block, data));
            }
            written
        })
    };
    let report = volume.rebuild(&MaintenanceOptions::default(), &|_| {}).expect("rebuild");
    stop.store(true, Ordering::SeqCst);
    let written = writer.join().expect("writer");
    assert_eq!(report.members, lost.to_vec());
    assert_eq!(report.blocks_unrecoverable, 0);
    let check = volume.check().expect("check");
    assert!(check.is_clean(), "fully redundant after the rebuild: {check:?}");
    model.verify(&volume);
    let mut last: std::collections::BTreeMap<u64, Vec<u8>> = std::collections::BTreeMap::new();
    for (block, data) in written {
        last.insert(block, data);
    }
    let mut buffer = vec![0u8; BLOCK_SIZE_BYTES];
    for (block, data) in &last {
        volume.read(block * BLOCK_SIZE_BYTES as u64, &mut buffer).expect("read");
        assert!(buffer == *data, "block {block} written during the rebuild differs");
    }
    Arc::into_inner(volume).expect("one owner").close().expect("close");

    // Reopened with the new members and without the survivors' help, still whole: each
    // original member can now be lost in turn.
    let volume = Volume::open(members(&devices), &open_options(IoMode::Threaded)).expect("reopen");
    assert!(!volume.stats().degraded);
    assert!(volume.check().expect("check").is_clean());
    volume.close().expect("close");
    for survivor in (0..count).filter(|member| !lost.contains(member)).take(1) {
        let mut degraded = members(&devices);
        degraded[survivor].device = None;
        let volume = Volume::open(degraded, &open_options(IoMode::Threaded)).expect("open without a survivor");
        model.verify(&volume);
        volume.abandon();
    }
}

#[test]
fn raid5_loses_a_member_while_writing_and_rebuilds_it_online() {
    lose_and_replace(RaidLevel::Raid5, 5, &[2], 1);
}

#[test]
fn raid6_loses_two_members_while_writing_and_rebuilds_both_online() {
    lose_and_replace(RaidLevel::Raid6, 6, &[1, 4], 2);
}

#[test]
fn raid10_loses_one_member_of_a_mirror_and_rebuilds_it() {
    lose_and_replace(RaidLevel::Raid10, 4, &[3], 3);
}

#[test]
fn a_loss_beyond_the_level_shuts_the_volume_down_without_losing_what_was_durable() {
    let (_array, devices, volume) = create(RaidLevel::Raid5, 4, 4, IoMode::Threaded);
    let mut model = Model::new(4);
    model.write_some(&volume, 200);
    volume.flush().expect("flush");
    devices[0].remove();
    model.write_some(&volume, 10);
    volume.flush().expect("one loss is survivable");
    devices[1].remove();
    let data = vec![7u8; BLOCK_SIZE_BYTES];
    let outcome = volume.write(0, &data, false).and_then(|()| volume.flush());
    assert!(outcome.is_err(), "a second loss on RAID-5 must fail the flush");
    let error = volume.write(BLOCK_SIZE_BYTES as u64, &data, false).expect_err("shut down: writes refused");
    assert!(error.to_string().contains("shut down"), "{error}");
    volume.abandon();
    // The second member comes back (its cable was loose): with the first still missing,
    // the volume opens degraded and everything flushed before the loss reads back.
    devices[1].reinsert();
    let mut survivors = members(&devices);
    survivors[0].device = None;
    let volume = Volume::open(survivors, &open_options(IoMode::Threaded)).expect("open without member 0");
    assert_eq!(volume.stats().missing_members, vec![0]);
    // Block 0 got a write the failed flush never made durable: either version is right.
    let mut block = vec![0u8; BLOCK_SIZE_BYTES];
    volume.read(0, &mut block).expect("read block 0");
    let old = model.contents[0].clone().unwrap_or_else(|| vec![0u8; BLOCK_SIZE_BYTES]);
    assert!(block == old || block == data, "block 0 is neither its durable content nor the unflushed write");
    model.contents[0] = Some(block);
    model.verify(&volume);
    volume.close().expect("close");
}

#[test]
fn a_crash_during_a_rebuild_restarts_it_on_the_next_open() {
    let (array, mut devices, volume) = create(RaidLevel::Raid5, 5, 5, IoMode::Inline);
    let mut model = Model::new(5);
    model.write_some(&volume, 300);
    volume.flush().expect("flush");
    devices[3].remove();
    model.write_some(&volume, 50);
    volume.flush().expect("flush");
    let replacement = array.add_device(MEMBER_SIZE_BYTES);
    devices[3] = replacement.clone();
    volume
        .replace_member(
            3,
            MemberDevice { name: "new3".into(), device: Some(replacement as Arc<dyn BlockDevice>) },
            &ReplaceOptions::default(),
        )
        .expect("replace");
    model.write_some(&volume, 50);
    volume.flush().expect("flush");
    // Crash part-way into the rebuild: a few device operations from now.
    array.crash_at_operation(array.operation_count() + 40);
    let interrupted = volume.rebuild(&MaintenanceOptions::default(), &|_| {});
    assert!(interrupted.is_err(), "the scheduled crash interrupts the rebuild");
    volume.abandon();
    array.crash();
    let volume = Volume::open(members(&devices), &open_options(IoMode::Inline)).expect("reopen after the crash");
    assert_eq!(volume.rebuilding_members(), vec![3], "the replacement is found rebuilding");
    assert!(volume.stats().degraded);
    model.verify(&volume);
    let report = volume.rebuild(&MaintenanceOptions::default(), &|_| {}).expect("rebuild again");
    assert_eq!(report.members, vec![3]);
    assert!(volume.check().expect("check").is_clean());
    model.verify(&volume);
    volume.close().expect("close");
}

#[test]
fn scrub_repairs_flipped_bits_on_any_member_and_check_is_clean_after() {
    let (_array, devices, volume) = create(RaidLevel::Raid5, 5, 6, IoMode::Threaded);
    let mut model = Model::new(6);
    model.write_some(&volume, 400);
    volume.flush().expect("flush");
    // One flipped bit in each member's first written rows (at most one per stripe row).
    for (member, device) in devices.iter().enumerate() {
        let offset = CHUNK_SIZE_BYTES as u64 + (member as u64 * 3 + 1) * BLOCK_SIZE_BYTES as u64 + 100;
        device.flip_bit(offset, 3);
    }
    let report = volume.scrub(&MaintenanceOptions::default(), &|_| {}).expect("scrub");
    assert_eq!(report.blocks_damaged, devices.len() as u64, "{report:?}");
    assert!(report.segments_repaired >= 1);
    assert!(report.logical_blocks_unrecoverable.is_empty());
    let check = volume.check().expect("check");
    assert!(check.is_clean(), "{check:?}");
    model.verify(&volume);
    let again = volume.scrub(&MaintenanceOptions::default(), &|_| {}).expect("scrub again");
    assert_eq!(again.blocks_damaged, 0, "{again:?}");
    volume.close().expect("close");
}

#[test]
fn check_reads_each_batch_whole_and_still_finds_every_flipped_bit() {
    // Threaded: check verifies several batches at once, each read in one request per member.
    let (_array, devices, volume) = create(RaidLevel::Raid5, 5, 9, IoMode::Threaded);
    let mut model = Model::new(9);
    model.write_some(&volume, 400);
    volume.flush().expect("flush");
    let clean = volume.check().expect("check");
    assert!(clean.is_clean(), "{clean:?}");
    assert!(clean.bytes_read >= clean.blocks_checked * BLOCK_SIZE_BYTES as u64, "{clean:?}");
    // One flipped bit in each member's first written rows, each in a row of its own.
    for (member, device) in devices.iter().enumerate() {
        let offset = CHUNK_SIZE_BYTES as u64 + (member as u64 * 3 + 1) * BLOCK_SIZE_BYTES as u64 + 100;
        device.flip_bit(offset, 3);
    }
    let check = volume.check().expect("check");
    assert_eq!(check.blocks_unrecoverable, 0, "{check:?}");
    // Segment 0 has its parity on one member: that member's flip is bad redundancy, the
    // other four flipped data or summary blocks, each rebuildable (a copy accepted without
    // its checksum would count as bad parity instead).
    assert_eq!(check.blocks_repairable, devices.len() as u64 - 1, "{check:?}");
    assert_eq!(check.rows_with_bad_redundancy, 1, "{check:?}");
    model.verify(&volume);
    volume.close().expect("close");
}

#[test]
fn scrub_lists_blocks_beyond_repair_and_nothing_else_is_affected() {
    let (_array, devices, volume) = create(RaidLevel::Raid5, 4, 7, IoMode::Threaded);
    // Reopened without a cache, which would still serve the damaged blocks' last writes.
    volume.close().expect("close");
    let volume =
        Volume::open(members(&devices), &OpenOptions { cache_size_bytes: 0, ..open_options(IoMode::Threaded) })
            .expect("open");
    let mut model = Model::new(7);
    model.write_some(&volume, 300);
    volume.flush().expect("flush");
    // The same row on two members: RAID-5 cannot rebuild either block of it.
    let offset = CHUNK_SIZE_BYTES as u64 + 5 * BLOCK_SIZE_BYTES as u64 + 10;
    devices[0].flip_bit(offset, 1);
    devices[1].flip_bit(offset, 1);
    let report = volume.scrub(&MaintenanceOptions::default(), &|_| {}).expect("scrub");
    assert!(!report.logical_blocks_unrecoverable.is_empty(), "{report:?}");
    let mut block = vec![0u8; BLOCK_SIZE_BYTES];
    for (index, expected) in model.contents.iter().enumerate() {
        let result = volume.read(index as u64 * BLOCK_SIZE_BYTES as u64, &mut block);
        if report.logical_blocks_unrecoverable.contains(&(index as u64)) {
            assert!(result.is_err(), "block {index} is beyond repair and must read as an error");
        } else {
            result.expect("every other block reads");
            match expected {
                Some(content) => assert!(block == *content, "block {index} differs"),
                None => assert!(block.iter().all(|&byte| byte == 0)),
            }
        }
    }
    // The volume still writes and cleans.
    model.write_some(&volume, 100);
    volume.flush().expect("flush");
    volume.close().expect("close");
}

#[test]
fn a_deleted_member_found_by_the_health_check_is_failed() {
    let (_array, devices, volume) = create(RaidLevel::Raid5, 4, 8, IoMode::Inline);
    let mut model = Model::new(8);
    model.write_some(&volume, 100);
    volume.flush().expect("flush");
    devices[2].remove();
    volume.check_member_health().expect("health check");
    let stats = volume.stats();
    assert_eq!(stats.missing_members, vec![2]);
    assert!(stats.members[2].description.contains("removed"), "{:?}", stats.members[2]);
    model.verify(&volume);
    volume.close().expect("close");
}

/// The replacements' single writes (superblocks) take this much longer; batches (data)
/// and reads are as fast as the device under them.
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_millis(20);

/// The health check runs beside replacements (the server checks every second): a
/// replacement attached but not yet given its superblock, or the device it displaces
/// checked just before it was attached, must not fail the replacement. The replacements'
/// superblock writes are slow so the health check lands inside the attachment.
#[test]
fn the_health_check_never_fails_a_replacement_being_attached() {
    let (array, devices, volume) = create(RaidLevel::Raid6, 5, 12, IoMode::Threaded);
    let volume = Arc::new(volume);
    let mut model = Model::new(12);
    model.write_some(&volume, 200);
    volume.flush().expect("flush");
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let (volume, stop) = (volume.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut checks = 0u64;
            while !stop.load(Ordering::SeqCst) {
                volume.check_member_health().expect("health check");
                checks += 1;
            }
            checks
        })
    };
    for (round, member) in [0usize, 3, 1].into_iter().enumerate() {
        if round % 2 == 0 {
            devices[member].remove();
        }
        let slow: Arc<dyn BlockDevice> = Arc::new(common::SlowWrites {
            device: array.add_device(MEMBER_SIZE_BYTES),
            single_write_delay: SLOW_WRITE,
            batch_delay: std::time::Duration::ZERO,
        });
        volume
            .replace_member(
                member,
                MemberDevice { name: format!("new{member}"), device: Some(slow) },
                &ReplaceOptions::default(),
            )
            .expect("replace");
        assert_eq!(volume.rebuilding_members(), vec![member], "round {round}: {:?}", volume.stats().members);
        let report = volume.rebuild(&MaintenanceOptions::default(), &|_| {}).expect("rebuild");
        assert_eq!(report.members, vec![member], "round {round}: {:?}", volume.stats().members);
        assert!(!volume.stats().degraded, "round {round}: {:?}", volume.stats().members);
    }
    stop.store(true, Ordering::SeqCst);
    assert!(checker.join().expect("checker") > 3, "the health check ran during the replacements");
    model.verify(&volume);
    Arc::into_inner(volume).expect("one owner").close().expect("close");
}

/// A volume whose member 0 is late on every read and write by `spike`; the cache is off
/// so every read reaches a member.
fn volume_with_a_slow_member(level: RaidLevel, spike: std::time::Duration, hedged_reads: bool) -> (Volume, Model) {
    let count = if level == RaidLevel::Raid10 { 4 } else { 5 };
    let devices: Vec<Arc<dyn BlockDevice>> = (0..count)
        .map(|member| {
            let memory: Arc<dyn BlockDevice> = Arc::new(stripelog_blockdev::MemoryDevice::new(MEMBER_SIZE_BYTES));
            if member == 0 {
                Arc::new(stripelog_blockdev::LatencySpikeDevice::new(memory, spike, 1_000_000, 1))
                    as Arc<dyn BlockDevice>
            } else {
                memory
            }
        })
        .collect();
    let members = devices
        .into_iter()
        .enumerate()
        .map(|(index, device)| MemberDevice { name: format!("m{index}"), device: Some(device) })
        .collect();
    let options = CreateOptions { raid_level: level, chunk_size_bytes: CHUNK_SIZE_BYTES, ..CreateOptions::default() };
    let open = OpenOptions { cache_size_bytes: 0, hedged_reads, ..open_options(IoMode::Threaded) };
    let volume = Volume::create(members, &options, &open).expect("create");
    let mut model = Model::new(9);
    model.write_some(&volume, 300);
    volume.flush().expect("flush");
    (volume, model)
}

#[test]
fn reads_of_a_lagging_member_are_served_from_the_rest_of_the_row() {
    let spike = std::time::Duration::from_millis(10);
    for level in [RaidLevel::Raid5, RaidLevel::Raid10] {
        let (volume, model) = volume_with_a_slow_member(level, spike, true);
        let started = std::time::Instant::now();
        model.verify(&volume);
        let elapsed = started.elapsed();
        let stats = volume.stats();
        assert!(stats.members[0].lagging, "{level}: member 0 is not seen lagging: {:?}", stats.members[0]);
        assert!(stats.late_reads > 50, "{level}: only {} late reads", stats.late_reads);
        // A fifth (RAID-5) or a quarter (RAID-10) of 1024 reads hit member 0: waited for in
        // full, that would take over 2 s.
        assert!(elapsed < std::time::Duration::from_millis(1500), "{level}: reads took {elapsed:?}");
        eprintln!("{level}: {elapsed:?}, {} late reads", stats.late_reads);
        volume.close().expect("close");
    }
    // Without hedging, reads of member 0 wait for it (and the data is just as right).
    let (volume, model) = volume_with_a_slow_member(RaidLevel::Raid5, spike, false);
    model.verify(&volume);
    let stats = volume.stats();
    assert_eq!(stats.late_reads, 0);
    assert!(!stats.members[0].lagging);
    volume.close().expect("close");
}
