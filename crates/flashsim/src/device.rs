//! [`FlashDevice`]: a [`FlashDrive`] as a stripelog member. The model decides when each
//! request completes; the bytes themselves are kept in RAM, so the engine reads back what
//! it wrote and verifies its checksums as on any member.

use crate::drive::{DriveStatistics, EraseSpread, FlashDrive};
use crate::model::DriveModel;
use parking_lot::Mutex;
use std::time::{Duration, Instant};
use stripelog_blockdev::{BlockDevice, IoRequest, MemoryDevice, Result};

/// How requests from real threads meet the drive's virtual clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Clock {
    /// Every request queues behind all earlier ones, as if the host always kept the drive
    /// busy; callers do not wait. The drive's clock then says how long its work took: the
    /// throughput the drive allows, whatever the host's own speed.
    Saturated,
    /// Requests arrive in (scaled) real time and callers wait until the model says their
    /// request completes: one virtual second lasts `real_seconds_per_virtual_second`. The
    /// host's queueing then meets the drive's pauses as it would on real hardware.
    Paced { real_seconds_per_virtual_second: f64 },
}

struct State {
    drive: FlashDrive,
    clock: Clock,
    /// Paced clock: the real instant that corresponds to `virtual_base_ns`.
    epoch: Instant,
    virtual_base_ns: u64,
}

impl State {
    fn arrival_ns(&self) -> u64 {
        match self.clock {
            Clock::Saturated => 0,
            Clock::Paced { real_seconds_per_virtual_second } => {
                let real = self.epoch.elapsed().as_secs_f64();
                self.virtual_base_ns + (real / real_seconds_per_virtual_second * 1e9) as u64
            }
        }
    }

    /// The real instant a paced caller may go on, for a request completing at `virtual_ns`.
    fn deadline(&self, virtual_ns: u64) -> Option<Instant> {
        match self.clock {
            Clock::Saturated => None,
            Clock::Paced { real_seconds_per_virtual_second } => {
                let virtual_seconds = virtual_ns.saturating_sub(self.virtual_base_ns) as f64 / 1e9;
                Some(self.epoch + Duration::from_secs_f64(virtual_seconds * real_seconds_per_virtual_second))
            }
        }
    }
}

pub struct FlashDevice {
    state: Mutex<State>,
    data: MemoryDevice,
    label: String,
}

impl FlashDevice {
    /// A fresh drive of `model`, on the saturated clock.
    pub fn new(model: DriveModel, label: &str) -> std::result::Result<FlashDevice, String> {
        let drive = FlashDrive::new(model)?;
        let data = MemoryDevice::new(drive.size_bytes());
        let state = State { drive, clock: Clock::Saturated, epoch: Instant::now(), virtual_base_ns: 0 };
        Ok(FlashDevice { state: Mutex::new(state), data, label: label.to_string() })
    }

    /// Switch clocks; a paced clock starts now at the drive's current virtual instant.
    pub fn set_clock(&self, clock: Clock) {
        let mut state = self.state.lock();
        state.clock = clock;
        state.epoch = Instant::now();
        state.virtual_base_ns = state.drive.now_ns();
    }

    /// Work on the model directly (preconditioning without data, reading its state).
    pub fn with_drive<T>(&self, work: impl FnOnce(&mut FlashDrive) -> T) -> T {
        work(&mut self.state.lock().drive)
    }

    pub fn statistics(&self) -> DriveStatistics {
        self.state.lock().drive.statistics().clone()
    }

    pub fn erase_spread(&self) -> EraseSpread {
        self.state.lock().drive.erase_spread()
    }

    pub fn now_ns(&self) -> u64 {
        self.state.lock().drive.now_ns()
    }

    pub fn model(&self) -> DriveModel {
        self.state.lock().drive.model().clone()
    }

    /// Run `requests` through the model as one submission (all arriving together), copy
    /// their data, then wait (paced clock) until the last completes.
    fn run(&self, requests: &mut [IoRequest<'_>]) -> Vec<Result<()>> {
        let mut results = Vec::with_capacity(requests.len());
        let mut latest = 0u64;
        let deadline = {
            let mut state = self.state.lock();
            let arrival = state.arrival_ns();
            for request in requests.iter_mut() {
                let offset = request.offset_bytes();
                let length = request.length_bytes() as u64;
                let result = match request {
                    IoRequest::Read { buffer, .. } => state
                        .drive
                        .read(offset, length, arrival)
                        .and_then(|completion| self.data.read_at(buffer, offset).map(|()| completion)),
                    IoRequest::Write { buffer, .. } => state
                        .drive
                        .write(offset, length, arrival)
                        .and_then(|completion| self.data.write_at(buffer, offset).map(|()| completion)),
                };
                results.push(result.map(|completion| latest = latest.max(completion)));
            }
            state.deadline(latest)
        };
        wait_until(deadline);
        results
    }
}

fn wait_until(deadline: Option<Instant>) {
    if let Some(deadline) = deadline {
        let now = Instant::now();
        if deadline > now {
            std::thread::sleep(deadline - now);
        }
    }
}

impl BlockDevice for FlashDevice {
    fn size_bytes(&self) -> u64 {
        self.data.size_bytes()
    }

    fn read_at(&self, buffer: &mut [u8], offset_bytes: u64) -> Result<()> {
        self.run(&mut [IoRequest::Read { buffer, offset_bytes }]).pop().unwrap_or(Ok(()))
    }

    fn write_at(&self, buffer: &[u8], offset_bytes: u64) -> Result<()> {
        self.run(&mut [IoRequest::Write { buffer, offset_bytes }]).pop().unwrap_or(Ok(()))
    }

    fn submit_batch(&self, requests: &mut [IoRequest<'_>]) -> Vec<Result<()>> {
        self.run(requests)
    }

    fn flush(&self) -> Result<()> {
        let deadline = {
            let mut state = self.state.lock();
            let arrival = state.arrival_ns();
            let completion = state.drive.flush(arrival);
            state.deadline(completion)
        };
        wait_until(deadline);
        Ok(())
    }

    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        let deadline = {
            let mut state = self.state.lock();
            let arrival = state.arrival_ns();
            let completion = state.drive.trim(offset_bytes, length_bytes, arrival)?;
            state.deadline(completion)
        };
        wait_until(deadline);
        Ok(())
    }

    fn describe(&self) -> String {
        let state = self.state.lock();
        let model = state.drive.model();
        format!(
            "{} (simulated {}, {} bytes, {:.0} % spare)",
            self.label,
            model.name,
            self.data.size_bytes(),
            model.ftl.spare_fraction * 100.0
        )
    }
}

impl std::fmt::Debug for FlashDevice {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.describe())
    }
}
