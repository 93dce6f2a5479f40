//! A wrapper that gives any member latency spikes: a seeded random fraction of its reads
//! and writes complete only after an extra, fixed delay — a drive's internal garbage
//! collection or retries, made reproducible for measuring how the engine copes with one
//! slow member (docs/resilience.md, "Slow members").

use crate::{BlockDevice, IoRequest, Prng, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Spike probabilities are drawn in parts per million.
const PARTS_PER_MILLION: u64 = 1_000_000;

pub struct LatencySpikeDevice {
    inner: Arc<dyn BlockDevice>,
    spike_latency: Duration,
    spike_parts_per_million: u64,
    prng: Mutex<Prng>,
    requests: AtomicU64,
    spikes: AtomicU64,
}

impl LatencySpikeDevice {
    /// Wrap `inner`: each read or write is delayed by `spike_latency` with probability
    /// `spike_parts_per_million` / 1 000 000, drawn from `seed`.
    pub fn new(
        inner: Arc<dyn BlockDevice>,
        spike_latency: Duration,
        spike_parts_per_million: u64,
        seed: u64,
    ) -> LatencySpikeDevice {
        LatencySpikeDevice {
            inner,
            spike_latency,
            spike_parts_per_million: spike_parts_per_million.min(PARTS_PER_MILLION),
            prng: Mutex::new(Prng::new(seed)),
            requests: AtomicU64::new(0),
            spikes: AtomicU64::new(0),
        }
    }

    /// Reads and writes so far, and how many of them were delayed.
    pub fn requests_and_spikes(&self) -> (u64, u64) {
        (self.requests.load(Ordering::Relaxed), self.spikes.load(Ordering::Relaxed))
    }

    /// Draw `count` requests; true when any of them spikes.
    fn draw(&self, count: usize) -> bool {
        let spiked = {
            let mut prng = self.prng.lock();
            (0..count).filter(|_| prng.chance(self.spike_parts_per_million, PARTS_PER_MILLION)).count()
        };
        self.requests.fetch_add(count as u64, Ordering::Relaxed);
        self.spikes.fetch_add(spiked as u64, Ordering::Relaxed);
        spiked > 0
    }

    fn delay_if(&self, spiked: bool) {
        if spiked {
            std::thread::sleep(self.spike_latency);
        }
    }
}

impl BlockDevice for LatencySpikeDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn alignment_bytes(&self) -> usize {
        self.inner.alignment_bytes()
    }

    fn read_at(&self, buffer: &mut [u8], offset_bytes: u64) -> Result<()> {
        let result = self.inner.read_at(buffer, offset_bytes);
        self.delay_if(self.draw(1));
        result
    }

    fn write_at(&self, buffer: &[u8], offset_bytes: u64) -> Result<()> {
        let result = self.inner.write_at(buffer, offset_bytes);
        self.delay_if(self.draw(1));
        result
    }

    /// The requests run together, so the batch is late once if any of them spiked.
    fn submit_batch(&self, requests: &mut [IoRequest<'_>]) -> Vec<Result<()>> {
        let results = self.inner.submit_batch(requests);
        self.delay_if(self.draw(requests.len()));
        results
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        self.inner.discard(offset_bytes, length_bytes)
    }

    fn describe(&self) -> String {
        format!(
            "{} + latency spikes of {:?} on {:.1} % of reads and writes",
            self.inner.describe(),
            self.spike_latency,
            self.spike_parts_per_million as f64 / 1e4
        )
    }

    fn health(&self) -> std::result::Result<(), String> {
        self.inner.health()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AlignedBuffer, MemoryDevice};
    use std::time::Instant;

    #[test]
    fn spikes_the_given_fraction_and_delays_only_those() {
        let inner: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20));
        let device = LatencySpikeDevice::new(inner, Duration::from_millis(5), 100_000, 7);
        let mut buffer = AlignedBuffer::zeroed(4096);
        let started = Instant::now();
        for round in 0..400u64 {
            device.read_at(buffer.as_mut_slice(), (round % 256) * 4096).unwrap();
        }
        let (requests, spikes) = device.requests_and_spikes();
        assert_eq!(requests, 400);
        assert!((20..=60).contains(&spikes), "{spikes} spikes in 400 requests at 10 %");
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(5) * spikes as u32, "{elapsed:?} for {spikes} spikes");
        // Data passes through untouched.
        buffer.as_mut_slice().fill(9);
        device.write_at(buffer.as_slice(), 8192).unwrap();
        let mut back = AlignedBuffer::zeroed(4096);
        device.read_at(back.as_mut_slice(), 8192).unwrap();
        assert_eq!(back.as_slice(), buffer.as_slice());
    }
}
