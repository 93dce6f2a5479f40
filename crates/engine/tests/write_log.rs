//! The write log (docs/write-log.md, Part 2): a flush makes writes durable on the log
//! while their stripes stay in RAM; a crash then leaves them only on the log, and mount
//! replays them. A log lost together with a crash is refused unless forced; a log that
//! fails while the volume runs is replaced by syncing the members; a mirrored log
//! survives the loss of one device.

#[allow(dead_code)]
mod common;

use common::members;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, DeviceError, MemoryDevice, Result as DeviceResult};
use stripelog_engine::error::{LogDeviceFailure, WriteLogProblem};
use stripelog_engine::{CreateOptions, Error, MemberDevice, OpenOptions, RaidLevel, Volume, WriteLogDevices};

const MEMBER_SIZE_BYTES: u64 = 32 << 20;
const LOG_SIZE_BYTES: u64 = 8 << 20;

/// A device that can be made to fail every write and sync.
struct Breakable {
    inner: MemoryDevice,
    broken: AtomicBool,
}

impl Breakable {
    fn check(&self) -> DeviceResult<()> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(DeviceError::Io { offset_bytes: 0, source: std::io::Error::other("the log device is gone") });
        }
        Ok(())
    }
}

impl BlockDevice for Breakable {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buffer: &mut [u8], offset_bytes: u64) -> DeviceResult<()> {
        self.check()?;
        self.inner.read_at(buffer, offset_bytes)
    }
    fn write_at(&self, buffer: &[u8], offset_bytes: u64) -> DeviceResult<()> {
        self.check()?;
        self.inner.write_at(buffer, offset_bytes)
    }
    fn flush(&self) -> DeviceResult<()> {
        self.check()?;
        self.inner.flush()
    }
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> DeviceResult<()> {
        self.inner.discard(offset_bytes, length_bytes)
    }
    fn describe(&self) -> String {
        "breakable memory".into()
    }
}

struct Setup {
    members: Vec<Arc<dyn BlockDevice>>,
    logs: Vec<Arc<Breakable>>,
}

impl Setup {
    fn new(log_count: usize) -> Setup {
        Setup::with_log_size(log_count, LOG_SIZE_BYTES)
    }

    fn with_log_size(log_count: usize, log_size_bytes: u64) -> Setup {
        let options = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
        Setup::with_options(log_count, log_size_bytes, &options)
    }

    fn with_options(log_count: usize, log_size_bytes: u64, options: &CreateOptions) -> Setup {
        let member_devices: Vec<Arc<dyn BlockDevice>> =
            (0..4).map(|_| Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES)) as _).collect();
        let logs: Vec<Arc<Breakable>> = (0..log_count)
            .map(|_| Arc::new(Breakable { inner: MemoryDevice::new(log_size_bytes), broken: AtomicBool::new(false) }))
            .collect();
        Volume::create(members(&member_devices), options, &OpenOptions::default()).unwrap().close().unwrap();
        let log_members = logs
            .iter()
            .enumerate()
            .map(|(index, log)| MemberDevice { name: format!("log-{index}"), device: Some(log.clone() as _) })
            .collect();
        Volume::add_write_log(members(&member_devices), log_members).unwrap();
        Setup { members: member_devices, logs }
    }

    /// Open with the log devices (`present[i]` false: device i missing).
    fn open(&self, present: &[bool], force_without_log: bool) -> stripelog_engine::Result<Volume> {
        let devices = self
            .logs
            .iter()
            .zip(present)
            .map(|(log, &present)| present.then(|| log.clone() as Arc<dyn BlockDevice>))
            .collect();
        let options = OpenOptions {
            // No timer: stripes are only written when a batch fills or the members are synced.
            flush_interval: None,
            cache_size_bytes: 0,
            write_log_devices: Some(WriteLogDevices(devices)),
            force_without_log,
            ..OpenOptions::default()
        };
        Volume::open(members(&self.members), &options)
    }
}

fn block(value: u8) -> Vec<u8> {
    vec![value; 4096]
}

fn read(volume: &Volume, logical_block: u64) -> Vec<u8> {
    let mut data = vec![0u8; 4096];
    volume.read(logical_block * 4096, &mut data).unwrap();
    data
}

#[test]
fn a_flush_goes_to_the_log_and_mount_replays_what_the_members_lack() {
    let setup = Setup::new(1);
    let volume = setup.open(&[true], false).unwrap();
    // Made durable on the members: a member sync (close) ends the first open.
    volume.write(0, &block(1), false).unwrap();
    volume.close().unwrap();
    let volume = setup.open(&[true], false).unwrap();
    let batches_at_open = volume.stats().batches_written;
    for logical_block in 0..40u64 {
        volume.write(logical_block * 4096, &block(10 + logical_block as u8), logical_block % 3 == 0).unwrap();
    }
    volume.write(7 * 4096 + 512, &[0xEE; 1024], false).unwrap();
    volume.trim(20 * 4096, 4096).unwrap();
    volume.flush().unwrap();
    let stats = volume.stats();
    let log = stats.write_log.expect("the volume has a log");
    assert!(log.active && log.records_appended > 0 && log.syncs > 0, "{log:?}");
    assert_eq!(stats.batches_written, batches_at_open, "the flushes wrote no stripes");
    volume.abandon();
    let volume = setup.open(&[true], false).unwrap();
    assert!(volume.stats().recovery.write_log_entries_replayed >= 42, "{:?}", volume.stats().recovery);
    for logical_block in 0..40u64 {
        let mut expected = block(10 + logical_block as u8);
        if logical_block == 7 {
            expected[512..1536].fill(0xEE);
        }
        if logical_block == 20 {
            expected = block(0);
        }
        assert_eq!(read(&volume, logical_block), expected, "block {logical_block}");
    }
    volume.abandon();
    // Replayed and made durable on the members: a second crash loses nothing either.
    let volume = setup.open(&[true], false).unwrap();
    assert_eq!(read(&volume, 39), block(49));
    volume.close().unwrap();
}

#[test]
fn a_log_lost_with_a_crash_is_refused_unless_forced_and_a_clean_volume_opens_without_it() {
    let setup = Setup::new(1);
    let volume = setup.open(&[true], false).unwrap();
    volume.write(0, &block(1), false).unwrap();
    volume.close().unwrap();
    let volume = setup.open(&[true], false).unwrap();
    volume.write(4096, &block(2), true).unwrap();
    volume.abandon();
    match setup.open(&[false], false) {
        Err(Error::WriteLogMissing(problem)) => {
            let all_missing = match &problem {
                WriteLogProblem::Devices(devices) => {
                    devices.iter().all(|device| matches!(*device.failure, LogDeviceFailure::Missing))
                }
                _ => false,
            };
            assert!(all_missing, "{problem:?}");
            assert!(problem.to_string().contains("missing"), "{problem}");
        }
        Err(other) => panic!("expected WriteLogMissing, got {other}"),
        Ok(_) => panic!("opened after a crash without its log"),
    }
    // Forced: what the members held survives, what only the log held is gone, and the
    // volume forgets the log (its records are never replayed later).
    let volume = setup.open(&[false], true).unwrap();
    assert_eq!(read(&volume, 0), block(1));
    assert_eq!(read(&volume, 1), block(0));
    assert!(volume.stats().write_log.is_none());
    volume.close().unwrap();
    let volume = setup.open(&[true], false).unwrap();
    assert!(volume.stats().write_log.is_none(), "the forgotten log is not used again");
    volume.close().unwrap();
}

#[test]
fn a_log_that_fails_while_serving_falls_back_to_syncing_the_members() {
    let setup = Setup::new(1);
    let volume = setup.open(&[true], false).unwrap();
    volume.write(0, &block(3), true).unwrap();
    setup.logs[0].broken.store(true, Ordering::SeqCst);
    volume.write(4096, &block(4), true).unwrap();
    volume.flush().unwrap();
    let log = volume.stats().write_log.unwrap();
    assert!(!log.active && log.failed_devices.len() == 1, "{log:?}");
    assert!(volume.stats().batches_written > 0, "the fallback wrote and synced the stripes");
    volume.abandon();
    // The failure synced the members and then retired the log from the superblocks: a
    // crash now mounts without it (no force needed) and loses nothing.
    let volume = setup.open(&[true], false).expect("the retired log is not asked for");
    assert!(volume.stats().write_log.is_none(), "the volume has no log any more");
    assert_eq!(read(&volume, 0), block(3));
    assert_eq!(read(&volume, 1), block(4));
    volume.close().unwrap();
}

#[test]
fn a_mirrored_log_replays_from_the_device_that_is_left() {
    let setup = Setup::new(2);
    let volume = setup.open(&[true, true], false).unwrap();
    volume.write(0, &block(5), false).unwrap();
    volume.close().unwrap();
    let volume = setup.open(&[true, true], false).unwrap();
    for logical_block in 1..10u64 {
        volume.write(logical_block * 4096, &block(50 + logical_block as u8), true).unwrap();
    }
    volume.abandon();
    let volume = setup.open(&[false, true], false).unwrap();
    for logical_block in 1..10u64 {
        assert_eq!(read(&volume, logical_block), block(50 + logical_block as u8));
    }
    let log = volume.stats().write_log.unwrap();
    assert!(log.active && log.failed_devices.len() == 1, "{log:?}");
    volume.close().unwrap();
}

/// Either half of a mirror may fail while the volume serves (the first is written by the
/// appender, the second by the mirror thread beside it): the log goes on with the other,
/// and a crash then replays every acknowledged write from it.
#[test]
fn a_mirror_half_that_fails_while_serving_leaves_the_log_on_the_other() {
    for broken in 0..2 {
        let setup = Setup::new(2);
        let volume = writes_acknowledged_by_one_half(&setup, broken);
        let log = volume.stats().write_log.unwrap();
        assert!(log.active && log.failed_devices.len() == 1, "device {broken} broken: {log:?}");
        assert!(log.failed_devices[0].0.ends_with(&broken.to_string()), "{log:?}");
        volume.abandon();
        let present = [broken != 0, broken != 1];
        let volume = setup.open(&present, false).unwrap();
        assert_every_write_is_there(&volume, broken);
        volume.close().unwrap();
    }
}

/// A mirror's two halves: block 0 written (FUA) while both work, then half `broken` fails
/// and blocks 1 to 9 are written (FUA), acknowledged by the other half alone.
fn writes_acknowledged_by_one_half(setup: &Setup, broken: usize) -> Volume {
    let volume = setup.open(&[true, true], false).unwrap();
    volume.write(0, &block(7), true).unwrap();
    setup.logs[broken].broken.store(true, Ordering::SeqCst);
    for logical_block in 1..10u64 {
        volume.write(logical_block * 4096, &block(70 + logical_block as u8), true).unwrap();
    }
    volume
}

fn assert_every_write_is_there(volume: &Volume, broken: usize) {
    assert_eq!(read(volume, 0), block(7));
    for logical_block in 1..10u64 {
        assert_eq!(read(volume, logical_block), block(70 + logical_block as u8), "device {broken} broken");
    }
}

/// A mirror half that failed holds a chain that stops at its failure. When the other half
/// is then lost with a crash, mount must not take the stale half's chain for the log (it
/// would silently lose every write acknowledged since the failure): the failed half was
/// recorded as dropped before anything more was acknowledged, so mount finds no device
/// that holds the log and refuses unless forced (`write_log_seeds` seed 31 once lost a
/// FUA write this way).
#[test]
fn a_mirror_half_that_failed_is_never_read_when_the_other_is_lost() {
    for broken in 0..2 {
        let setup = Setup::new(2);
        writes_acknowledged_by_one_half(&setup, broken).abandon();
        // The failed half comes back with what it held at its failure; the other is lost.
        setup.logs[broken].broken.store(false, Ordering::SeqCst);
        let present = [broken == 0, broken == 1];
        match setup.open(&present, false) {
            Err(Error::WriteLogMissing(_)) => {}
            Ok(volume) => {
                panic!("device {broken} broken: mount read the stale half; block 5 reads {:?}", &read(&volume, 5)[..1])
            }
            Err(other) => panic!("device {broken} broken: {other}"),
        }
        // With the half that holds the log, nothing acknowledged is missing.
        let volume = setup.open(&[true, true], false).unwrap();
        assert_every_write_is_there(&volume, broken);
        volume.close().unwrap();
    }
}

/// Writes past the staging soft limit are appended to the log without a sync; a flush
/// that then finds nothing staged must still sync the log, or it acknowledges writes that
/// sit in the device's volatile cache (a review found it).
#[test]
fn a_flush_after_an_unsynced_append_syncs_the_log() {
    let setup = Setup::new(1);
    let volume = setup.open(&[true], false).unwrap();
    volume.write(0, &block(1), true).unwrap();
    let syncs_before = volume.stats().write_log.unwrap().syncs;
    // One request of 1 024 blocks: staged, then appended unsynced as it crosses the limit.
    volume.write(4096, &vec![9u8; 1024 * 4096], false).unwrap();
    let log = volume.stats().write_log.unwrap();
    assert_eq!(log.syncs, syncs_before, "the append past the soft limit is not synced: {log:?}");
    assert!(log.records_appended > 1, "{log:?}");
    volume.flush().unwrap();
    let log = volume.stats().write_log.unwrap();
    assert_eq!(log.syncs, syncs_before + 1, "the flush must sync what the unsynced append wrote: {log:?}");
    volume.close().unwrap();
}

#[test]
fn a_log_cannot_be_added_twice_or_removed_from_a_volume_that_crashed() {
    let setup = Setup::new(1);
    let another =
        MemberDevice { name: "another".into(), device: Some(Arc::new(MemoryDevice::new(LOG_SIZE_BYTES)) as _) };
    assert!(Volume::add_write_log(members(&setup.members), vec![another]).is_err());
    let volume = setup.open(&[true], false).unwrap();
    volume.write(0, &block(6), true).unwrap();
    volume.abandon();
    assert!(Volume::remove_write_log(members(&setup.members)).is_err(), "the log may hold writes");
    setup.open(&[true], false).unwrap().close().unwrap();
    assert_eq!(Volume::remove_write_log(members(&setup.members)).unwrap(), Some(vec!["log-0".to_string()]));
    let volume = setup.open(&[], false).unwrap();
    assert_eq!(read(&volume, 0), block(6));
    assert!(volume.stats().write_log.is_none());
    volume.close().unwrap();
}

#[test]
fn a_small_log_wraps_many_times_through_crashes_and_keeps_every_acknowledged_write() {
    use stripelog_blockdev::Prng;
    let setup = Setup::with_log_size(1, stripelog_engine::layout::write_log::LOG_DEVICE_MINIMUM_BYTES);
    let mut model = std::collections::BTreeMap::new();
    let mut prng = Prng::new(21);
    for round in 0..12u64 {
        let volume = setup.open(&[true], false).unwrap();
        for (&logical_block, &value) in &model {
            assert_eq!(read(&volume, logical_block), block(value), "round {round}, block {logical_block}");
        }
        for write in 0..300u64 {
            let logical_block = prng.below(600);
            let value = (round * 300 + write) as u8 | 1;
            // Runs of writes, each run made durable by a FUA write or a flush.
            let fua = prng.below(4) == 0;
            volume.write(logical_block * 4096, &block(value), fua).unwrap();
            model.insert(logical_block, value);
            if write % 7 == 0 {
                volume.flush().unwrap();
            }
        }
        volume.flush().unwrap();
        volume.abandon();
    }
}

/// A write acknowledged through the log sits in the clients' open batch while the cleaner
/// thread relocates in the background: its relocation batches must not take the open
/// batch's place in the log order once the log names that place (the records' batch
/// sequence). Otherwise the relocations become durable under the sequence the log
/// recorded for the write, and mount, taking that sequence as on the members, skips the
/// record: an acknowledged write lost.
#[test]
fn a_cleaner_round_behind_a_logged_write_does_not_hide_it_from_the_replay() {
    let setup = Setup::new(1);
    let volume = setup.open(&[true], false).unwrap();
    let logical_blocks = volume.logical_size_bytes() / 4096;
    // Fill the volume and overwrite part of it: dead blocks for the cleaner, and fewer
    // free segments than its high watermark.
    let mut prng = stripelog_blockdev::Prng::new(5);
    for logical_block in 0..logical_blocks {
        volume.write(logical_block * 4096, &block(1), false).unwrap();
    }
    for _ in 0..logical_blocks {
        volume.write(prng.below(logical_blocks / 2) * 4096, &block(2), false).unwrap();
    }
    volume.flush().unwrap();
    // Idle: let the cleaner thread finish what the fill started.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut lost = Vec::new();
    for attempt in 0..20u64 {
        // A burst of overwrites takes the free segments below the high watermark again.
        for _ in 0..logical_blocks / 5 {
            volume.write(prng.below(logical_blocks / 2) * 4096, &block(0x40), false).unwrap();
        }
        let rounds_before = volume.stats().cleaning_rounds;
        let logical_block = logical_blocks / 2 + attempt;
        volume.write(logical_block * 4096, &block(0x70 + attempt as u8), false).unwrap();
        volume.flush().unwrap();
        // No client write for a while: the cleaner thread cleans, the write's batch open.
        std::thread::sleep(std::time::Duration::from_millis(150));
        if volume.stats().cleaning_rounds > rounds_before {
            lost.push((logical_block, 0x70 + attempt as u8));
            break;
        }
    }
    assert!(!lost.is_empty(), "the cleaner thread never ran behind a logged write");
    volume.abandon();
    let volume = setup.open(&[true], false).unwrap();
    for (logical_block, value) in lost {
        let content = read(&volume, logical_block);
        assert!(
            content == block(value),
            "block {logical_block} holds {:#x}, acknowledged through the log with {value:#x}",
            content[0]
        );
    }
    volume.close().unwrap();
}
