//! A simulated member for the deterministic simulation: RAM with a durable and a live
//! image, and seeded faults.
//!
//! - Writes land in the live image and in a list of *unsynced* writes; `flush` makes
//!   them durable. [`SimulatedArray::crash`] builds each member's post-crash image from
//!   its durable image plus, for every unsynced write independently, nothing (dropped),
//!   all of it, or a random subset of its 512-byte sectors (torn).
//! - A crash can also be scheduled at the N-th device operation across the array
//!   ([`SimulatedArray::crash_at_operation`]): that operation and every later one fail,
//!   as if the machine stopped mid-way (between the members of a stripe, mid-flush …).
//! - Latent read errors (a 4 KiB block returns EIO until rewritten) and bit flips (in the
//!   durable and live images: rot) are injected explicitly by the test, from its seed.
//!
//! Every random choice comes from the array's [`Prng`], so one seed replays exactly.

use crate::{check_request, BlockDevice, DeviceError, Prng, Result};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const SECTOR_SIZE_BYTES: usize = 512;
const FAULT_BLOCK_SIZE_BYTES: u64 = 4096;

struct Controller {
    prng: Mutex<Prng>,
    operation_count: AtomicU64,
    crash_at_operation: AtomicU64,
    crashed: AtomicBool,
}

impl Controller {
    /// Count one device operation; false when the machine has (just) crashed.
    fn admit(&self) -> bool {
        if self.crashed.load(Ordering::SeqCst) {
            return false;
        }
        let operation = self.operation_count.fetch_add(1, Ordering::SeqCst);
        if operation >= self.crash_at_operation.load(Ordering::SeqCst) {
            self.crashed.store(true, Ordering::SeqCst);
            return false;
        }
        true
    }
}

struct UnsyncedWrite {
    offset_bytes: u64,
    data: Vec<u8>,
}

struct DeviceState {
    durable: Vec<u8>,
    live: Vec<u8>,
    unsynced: Vec<UnsyncedWrite>,
    latent_read_errors: BTreeSet<u64>,
}

/// One simulated member. Create them through [`SimulatedArray::add_device`].
pub struct SimulatedDevice {
    name: String,
    size_bytes: u64,
    controller: Arc<Controller>,
    state: Mutex<DeviceState>,
    removed: AtomicBool,
}

/// What a crash did, for the failure report of a seed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    pub writes_dropped: u64,
    pub writes_applied: u64,
    pub writes_torn: u64,
}

/// The set of simulated members of one volume, sharing one seed and one clock of
/// operations.
#[derive(Clone)]
pub struct SimulatedArray {
    controller: Arc<Controller>,
    devices: Arc<Mutex<Vec<Arc<SimulatedDevice>>>>,
}

impl SimulatedArray {
    pub fn new(seed: u64) -> Self {
        SimulatedArray {
            controller: Arc::new(Controller {
                prng: Mutex::new(Prng::new(seed)),
                operation_count: AtomicU64::new(0),
                crash_at_operation: AtomicU64::new(u64::MAX),
                crashed: AtomicBool::new(false),
            }),
            devices: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn add_device(&self, size_bytes: u64) -> Arc<SimulatedDevice> {
        let size_bytes = size_bytes / FAULT_BLOCK_SIZE_BYTES * FAULT_BLOCK_SIZE_BYTES;
        let mut devices = self.devices.lock();
        let device = Arc::new(SimulatedDevice {
            name: format!("sim{}", devices.len()),
            size_bytes,
            controller: self.controller.clone(),
            state: Mutex::new(DeviceState {
                durable: vec![0; size_bytes as usize],
                live: vec![0; size_bytes as usize],
                unsynced: Vec::new(),
                latent_read_errors: BTreeSet::new(),
            }),
            removed: AtomicBool::new(false),
        });
        devices.push(device.clone());
        device
    }

    pub fn devices(&self) -> Vec<Arc<SimulatedDevice>> {
        self.devices.lock().clone()
    }

    /// Device operations performed so far (reads, writes, flushes, across the array).
    pub fn operation_count(&self) -> u64 {
        self.controller.operation_count.load(Ordering::SeqCst)
    }

    /// The operation with this index (0-based, across the array) and all later ones fail.
    pub fn crash_at_operation(&self, operation: u64) {
        self.controller.crash_at_operation.store(operation, Ordering::SeqCst);
    }

    pub fn has_crashed(&self) -> bool {
        self.controller.crashed.load(Ordering::SeqCst)
    }

    /// A random number from the array's seed (for tests that choose fault sites).
    pub fn random_below(&self, bound: u64) -> u64 {
        self.controller.prng.lock().below(bound)
    }

    /// Crash now: every member keeps its durable image plus a random fate for each
    /// unsynced write. Afterwards the devices work again (the "reboot").
    pub fn crash(&self) -> CrashReport {
        let mut report = CrashReport::default();
        let mut prng = self.controller.prng.lock();
        for device in self.devices.lock().iter() {
            let mut state = device.state.lock();
            let unsynced = std::mem::take(&mut state.unsynced);
            for write in unsynced {
                let start = write.offset_bytes as usize;
                match prng.below(3) {
                    0 => report.writes_dropped += 1,
                    1 => {
                        state.durable[start..start + write.data.len()].copy_from_slice(&write.data);
                        report.writes_applied += 1;
                    }
                    _ => {
                        for (index, sector) in write.data.chunks(SECTOR_SIZE_BYTES).enumerate() {
                            if prng.chance(1, 2) {
                                let at = start + index * SECTOR_SIZE_BYTES;
                                state.durable[at..at + sector.len()].copy_from_slice(sector);
                            }
                        }
                        report.writes_torn += 1;
                    }
                }
            }
            let durable = state.durable.clone();
            state.live = durable;
        }
        self.controller.crashed.store(false, Ordering::SeqCst);
        self.controller.crash_at_operation.store(u64::MAX, Ordering::SeqCst);
        report
    }
}

impl SimulatedDevice {
    /// Reads of the 4 KiB block containing `offset_bytes` fail until it is rewritten.
    pub fn inject_read_error(&self, offset_bytes: u64) {
        self.state.lock().latent_read_errors.insert(offset_bytes / FAULT_BLOCK_SIZE_BYTES);
    }

    /// Flip one bit, durably (bit rot).
    pub fn flip_bit(&self, offset_bytes: u64, bit: u8) {
        let mut state = self.state.lock();
        let index = offset_bytes as usize;
        state.durable[index] ^= 1 << (bit % 8);
        state.live[index] ^= 1 << (bit % 8);
    }

    /// The device disappears: every later operation fails (a pulled drive).
    pub fn remove(&self) {
        self.removed.store(true, Ordering::SeqCst);
    }

    /// A removed device comes back (the drive plugged in again): it holds what was durable
    /// when it went; its unsynced writes are lost, as a pulled drive loses its cache.
    pub fn reinsert(&self) {
        let mut state = self.state.lock();
        state.unsynced.clear();
        state.live = state.durable.clone();
        self.removed.store(false, Ordering::SeqCst);
    }

    fn admit(&self) -> Result<()> {
        if self.removed.load(Ordering::SeqCst) || !self.controller.admit() {
            return Err(DeviceError::Gone);
        }
        Ok(())
    }
}

impl BlockDevice for SimulatedDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buffer: &mut [u8], offset_bytes: u64) -> Result<()> {
        check_request(self.size_bytes, offset_bytes, buffer.len(), buffer.as_ptr() as usize)?;
        self.admit()?;
        if buffer.is_empty() {
            return Ok(());
        }
        let state = self.state.lock();
        let first = offset_bytes / FAULT_BLOCK_SIZE_BYTES;
        let last = (offset_bytes + buffer.len() as u64 - 1) / FAULT_BLOCK_SIZE_BYTES;
        if let Some(block) = state.latent_read_errors.range(first..=last).next() {
            return Err(DeviceError::Io {
                offset_bytes: block * FAULT_BLOCK_SIZE_BYTES,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let start = offset_bytes as usize;
        buffer.copy_from_slice(&state.live[start..start + buffer.len()]);
        Ok(())
    }

    fn write_at(&self, buffer: &[u8], offset_bytes: u64) -> Result<()> {
        check_request(self.size_bytes, offset_bytes, buffer.len(), buffer.as_ptr() as usize)?;
        self.admit()?;
        if buffer.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock();
        let start = offset_bytes as usize;
        state.live[start..start + buffer.len()].copy_from_slice(buffer);
        let first = offset_bytes / FAULT_BLOCK_SIZE_BYTES;
        let last = (offset_bytes + buffer.len() as u64 - 1) / FAULT_BLOCK_SIZE_BYTES;
        let healed: Vec<u64> = state.latent_read_errors.range(first..=last).copied().collect();
        for block in healed {
            state.latent_read_errors.remove(&block);
        }
        state.unsynced.push(UnsyncedWrite { offset_bytes, data: buffer.to_vec() });
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.admit()?;
        let mut state = self.state.lock();
        let unsynced = std::mem::take(&mut state.unsynced);
        for write in unsynced {
            let start = write.offset_bytes as usize;
            state.durable[start..start + write.data.len()].copy_from_slice(&write.data);
        }
        Ok(())
    }

    fn discard(&self, _offset_bytes: u64, _length_bytes: u64) -> Result<()> {
        self.admit()
    }

    fn describe(&self) -> String {
        format!("{} (simulated, {} bytes)", self.name, self.size_bytes)
    }

    fn health(&self) -> std::result::Result<(), String> {
        if self.removed.load(Ordering::SeqCst) {
            return Err(format!("{} was removed", self.name));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuffer;

    fn filled(byte: u8) -> AlignedBuffer {
        let mut buffer = AlignedBuffer::zeroed(8192);
        buffer.fill(byte);
        buffer
    }

    #[test]
    fn flushed_writes_survive_a_crash_and_unsynced_ones_may_not() {
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 0..40 {
            let array = SimulatedArray::new(seed);
            let device = array.add_device(1 << 20);
            device.write_at(&filled(1), 0).unwrap();
            device.flush().unwrap();
            device.write_at(&filled(2), 0).unwrap();
            array.crash();
            let mut back = AlignedBuffer::zeroed(8192);
            device.read_at(&mut back, 0).unwrap();
            assert!(back.iter().all(|&b| b == 1 || b == 2));
            let twos = back.chunks(512).filter(|sector| sector[0] == 2).count();
            outcomes.insert(match twos {
                0 => "dropped",
                16 => "applied",
                _ => "torn",
            });
        }
        assert_eq!(outcomes.len(), 3, "each fate happens for some seed: {outcomes:?}");
    }

    #[test]
    fn empty_requests_do_nothing_and_never_panic() {
        let array = SimulatedArray::new(3);
        let device = array.add_device(1 << 20);
        device.inject_read_error(8192);
        let mut empty = AlignedBuffer::zeroed(4096);
        device.write_at(&empty[..0], 8192).unwrap();
        device.read_at(&mut empty[..0], 8192).unwrap();
        assert!(device.read_at(&mut empty, 8192).is_err(), "the latent error is still there");
    }

    #[test]
    fn a_scheduled_crash_stops_every_later_operation() {
        let array = SimulatedArray::new(5);
        let first = array.add_device(1 << 20);
        let second = array.add_device(1 << 20);
        array.crash_at_operation(1);
        first.write_at(&filled(3), 0).unwrap();
        assert!(matches!(second.write_at(&filled(3), 0), Err(DeviceError::Gone)));
        assert!(matches!(first.flush(), Err(DeviceError::Gone)));
        array.crash();
        assert!(second.write_at(&filled(4), 0).is_ok());
    }

    #[test]
    fn latent_errors_heal_on_rewrite_and_rot_is_durable() {
        let array = SimulatedArray::new(9);
        let device = array.add_device(1 << 20);
        device.inject_read_error(4096);
        let mut back = AlignedBuffer::zeroed(8192);
        assert!(matches!(device.read_at(&mut back, 0), Err(DeviceError::Io { offset_bytes: 4096, .. })));
        device.write_at(&filled(7), 0).unwrap();
        device.read_at(&mut back, 0).unwrap();
        device.flush().unwrap();
        device.flip_bit(100, 0);
        array.crash();
        device.read_at(&mut back, 0).unwrap();
        assert_eq!(back[100], 7 ^ 1);
    }
}
