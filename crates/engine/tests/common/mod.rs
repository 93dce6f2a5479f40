//! Helpers the engine's integration tests share.

use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, MemoryDevice};
use stripelog_engine::MemberDevice;

/// `count` in-memory devices of `size_bytes` each.
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
