//! A member held in RAM: for tests, benchmarks of the engine alone, and experiments.

use crate::{check_request, BlockDevice, Result};
use parking_lot::RwLock;

/// Size of one lock stripe: members are split into independently locked regions so
/// that concurrent I/O to different regions does not serialise.
const REGION_SIZE_BYTES: u64 = 1 << 20;

pub struct MemoryDevice {
    size_bytes: u64,
    regions: Vec<RwLock<Vec<u8>>>,
}

impl MemoryDevice {
    /// A zero-filled device of `size_bytes` (rounded down to 4 KiB). Memory for a region
    /// is only allocated when it is first written.
    pub fn new(size_bytes: u64) -> Self {
        let size_bytes = size_bytes / 4096 * 4096;
        let region_count = size_bytes.div_ceil(REGION_SIZE_BYTES) as usize;
        MemoryDevice { size_bytes, regions: (0..region_count).map(|_| RwLock::new(Vec::new())).collect() }
    }

    /// Split `offset..offset+length` into (region index, offset within region, range of
    /// the caller's buffer) pieces.
    fn pieces(offset_bytes: u64, length_bytes: usize) -> Vec<(usize, usize, std::ops::Range<usize>)> {
        let mut pieces = Vec::new();
        let mut done = 0usize;
        while done < length_bytes {
            let position = offset_bytes + done as u64;
            let region_index = (position / REGION_SIZE_BYTES) as usize;
            let within = (position % REGION_SIZE_BYTES) as usize;
            let count = (REGION_SIZE_BYTES as usize - within).min(length_bytes - done);
            pieces.push((region_index, within, done..done + count));
            done += count;
        }
        pieces
    }
}

impl MemoryDevice {
    fn region_read(&self, region_index: usize, within: usize, target: &mut [u8]) {
        let region = self.regions[region_index].read();
        if region.is_empty() {
            target.fill(0);
        } else {
            target.copy_from_slice(&region[within..within + target.len()]);
        }
    }

    fn region_write(&self, region_index: usize, within: usize, source: &[u8]) {
        let mut region = self.regions[region_index].write();
        if region.is_empty() {
            region.resize(REGION_SIZE_BYTES as usize, 0);
        }
        region[within..within + source.len()].copy_from_slice(source);
    }
}

impl BlockDevice for MemoryDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buffer: &mut [u8], offset_bytes: u64) -> Result<()> {
        check_request(self.size_bytes, offset_bytes, buffer.len(), buffer.as_ptr() as usize)?;
        for (region, within, range) in Self::pieces(offset_bytes, buffer.len()) {
            self.region_read(region, within, &mut buffer[range]);
        }
        Ok(())
    }

    fn write_at(&self, buffer: &[u8], offset_bytes: u64) -> Result<()> {
        check_request(self.size_bytes, offset_bytes, buffer.len(), buffer.as_ptr() as usize)?;
        for (region, within, range) in Self::pieces(offset_bytes, buffer.len()) {
            self.region_write(region, within, &buffer[range]);
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn discard(&self, _offset_bytes: u64, _length_bytes: u64) -> Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        format!("memory ({} bytes)", self.size_bytes)
    }
}
