//! Helpers the engine's integration tests share.

use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, MemoryDevice};
use stripelog_engine::MemberDevice;

/// `count` in-memory devices of `size_bytes` each.
#[allow(dead_code)] // (the read queue's test uses file members)
pub fn memory_members(count: usize, size_bytes: u64) -> Vec<Arc<dyn BlockDevice>> {
    (0..count).map(|_| Arc::new(MemoryDevice::new(size_bytes)) as Arc<dyn BlockDevice>).collect()
}

/// The devices as members, in the order given, named `member0`, `member1`, ….
pub fn members(devices: &[Arc<dyn BlockDevice>]) -> Vec<MemberDevice> {
    devices
        .iter()
        .enumerate()
        .map(|(index, device)| MemberDevice { name: format!("member{index}"), device: Some(device.clone()) })
        .collect()
}

/// Every logical block below `logical_blocks` reads as `model` says (absent: zeros).
#[allow(dead_code)] // (not every test that includes this module checks contents so)
pub fn verify_contents(
    volume: &stripelog_engine::Volume,
    model: &std::collections::BTreeMap<u64, Vec<u8>>,
    logical_blocks: u64,
    when: &str,
) {
    let block_bytes = stripelog_engine::BLOCK_SIZE_BYTES as u64;
    let mut content = vec![0u8; stripelog_engine::BLOCK_SIZE_BYTES];
    for block in 0..logical_blocks {
        volume.read(block * block_bytes, &mut content).unwrap_or_else(|error| panic!("{when}: read {block}: {error}"));
        match model.get(&block) {
            Some(data) => assert!(content == *data, "{when}: block {block} does not hold its data"),
            None => assert!(content.iter().all(|&byte| byte == 0), "{when}: block {block} should read as zeros"),
        }
    }
}

/// Options for tests that drive the engine step by step: no flush timer, I/O on the
/// calling thread, no block cache, every block tried for compression.
#[allow(dead_code)] // (used by the compression and deduplication tests)
pub fn inline_open_options() -> stripelog_engine::OpenOptions {
    stripelog_engine::OpenOptions {
        flush_interval: None,
        io_mode: stripelog_engine::IoMode::Inline,
        cache_size_bytes: 0,
        compression_share: Some(1000),
        ..stripelog_engine::OpenOptions::default()
    }
}

/// A device whose writes take longer: each single write (`write_at`, superblocks and the
/// inline pipeline's member parts) by `single_write_delay`, each batch (`submit_batch`,
/// the threaded pipeline's data) by `batch_delay`. Reads are as fast as the device under it.
#[allow(dead_code)] // (used by the tests that need a slow member)
pub struct SlowWrites {
    pub device: Arc<dyn BlockDevice>,
    pub single_write_delay: std::time::Duration,
    pub batch_delay: std::time::Duration,
}

impl BlockDevice for SlowWrites {
    fn size_bytes(&self) -> u64 {
        self.device.size_bytes()
    }
    fn read_at(&self, buffer: &mut [u8], offset_bytes: u64) -> stripelog_blockdev::Result<()> {
        self.device.read_at(buffer, offset_bytes)
    }
    fn write_at(&self, buffer: &[u8], offset_bytes: u64) -> stripelog_blockdev::Result<()> {
        std::thread::sleep(self.single_write_delay);
        self.device.write_at(buffer, offset_bytes)
    }
    fn submit_batch(&self, requests: &mut [stripelog_blockdev::IoRequest<'_>]) -> Vec<stripelog_blockdev::Result<()>> {
        std::thread::sleep(self.batch_delay);
        self.device.submit_batch(requests)
    }
    fn flush(&self) -> stripelog_blockdev::Result<()> {
        self.device.flush()
    }
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> stripelog_blockdev::Result<()> {
        self.device.discard(offset_bytes, length_bytes)
    }
    fn describe(&self) -> String {
        format!("slow writes over {}", self.device.describe())
    }
    fn health(&self) -> Result<(), String> {
        self.device.health()
    }
}
