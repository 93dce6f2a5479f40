//! Group commit (docs/write-log.md, Part 1): concurrent flushes share one sync of every
//! member instead of syncing once each, and member files on one filesystem are made
//! durable by one sync of the filesystem, not one per file.

#[allow(dead_code)]
mod common;

use common::members;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stripelog_blockdev::{BlockDevice, FileDevice, FileDeviceOptions, MemoryDevice, Result as DeviceResult};
use stripelog_engine::{CreateOptions, OpenOptions, RaidLevel, Volume};

const MEMBER_SIZE_BYTES: u64 = 32 << 20;

/// A member whose sync takes `SYNC_TIME` (as a drive's cache flush does) and is counted.
struct SlowSync {
    inner: MemoryDevice,
    syncs: Arc<AtomicU64>,
}

const SYNC_TIME: Duration = Duration::from_millis(3);

impl BlockDevice for SlowSync {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buffer: &mut [u8], offset_bytes: u64) -> DeviceResult<()> {
        self.inner.read_at(buffer, offset_bytes)
    }
    fn write_at(&self, buffer: &[u8], offset_bytes: u64) -> DeviceResult<()> {
        self.inner.write_at(buffer, offset_bytes)
    }
    fn flush(&self) -> DeviceResult<()> {
        std::thread::sleep(SYNC_TIME);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> DeviceResult<()> {
        self.inner.discard(offset_bytes, length_bytes)
    }
    fn describe(&self) -> String {
        "slow-sync memory".into()
    }
}

fn create_options() -> CreateOptions {
    CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..CreateOptions::default() }
}

fn open_options() -> OpenOptions {
    OpenOptions { flush_interval: None, cache_size_bytes: 0, ..OpenOptions::default() }
}

#[test]
fn concurrent_flushes_share_rounds_of_member_syncs() {
    let syncs = Arc::new(AtomicU64::new(0));
    let devices: Vec<Arc<dyn BlockDevice>> = (0..4)
        .map(|_| Arc::new(SlowSync { inner: MemoryDevice::new(MEMBER_SIZE_BYTES), syncs: syncs.clone() }) as _)
        .collect();
    let volume = Arc::new(Volume::create(members(&devices), &create_options(), &open_options()).unwrap());
    let (threads, flushes_each) = (8u64, 25u64);
    let before = (volume.stats().flushes, syncs.load(Ordering::Relaxed));
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let volume = volume.clone();
            scope.spawn(move || {
                for index in 0..flushes_each {
                    let offset = (thread * flushes_each + index) * 4096;
                    volume.write(offset, &[thread as u8 + 1; 4096], false).unwrap();
                    volume.flush().unwrap();
                }
            });
        }
    });
    let rounds = volume.stats().flushes - before.0;
    let member_syncs = syncs.load(Ordering::Relaxed) - before.1;
    let requested = threads * flushes_each;
    // Eight threads flushing at once: each round covers the flushes that waited for it.
    assert!(rounds * 2 <= requested, "{requested} flushes took {rounds} rounds of member syncs");
    assert!(member_syncs <= (rounds + 8) * 4, "{member_syncs} member syncs for {rounds} rounds");
    for thread in 0..threads {
        let mut block = vec![0u8; 4096];
        volume.read(thread * flushes_each * 4096, &mut block).unwrap();
        assert_eq!(block, vec![thread as u8 + 1; 4096]);
    }
    Arc::try_unwrap(volume).ok().expect("one owner").close().unwrap();
}

#[test]
fn member_files_on_one_filesystem_are_one_flush_group() {
    let directory = std::env::temp_dir().join(format!("stripelog-group-commit-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let options = FileDeviceOptions { create_size_bytes: Some(MEMBER_SIZE_BYTES), ..FileDeviceOptions::default() };
    let files: Vec<FileDevice> =
        (0..3).map(|index| FileDevice::open(&directory.join(format!("member-{index}")), &options).unwrap()).collect();
    let keys: Vec<Option<u64>> = files.iter().map(|file| file.filesystem_key()).collect();
    assert!(keys[0].is_some(), "a writable regular file names its filesystem");
    assert!(keys.iter().all(|key| *key == keys[0]), "files in one directory share a filesystem: {keys:?}");
    assert_eq!(MemoryDevice::new(4096).filesystem_key(), None, "a memory device is flushed on its own");
    files[0].flush_filesystem().unwrap();
    let devices: Vec<Arc<dyn BlockDevice>> = files.into_iter().map(|file| Arc::new(file) as _).collect();
    let volume = Volume::create(members(&devices), &create_options(), &open_options()).unwrap();
    volume.write(0, &[5u8; 8192], true).unwrap();
    volume.flush().unwrap();
    volume.close().unwrap();
    drop(devices);
    std::fs::remove_dir_all(&directory).unwrap();
}
