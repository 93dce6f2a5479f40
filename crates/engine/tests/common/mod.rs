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
