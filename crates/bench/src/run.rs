//! One benchmark run: `threads` workers, each keeping `queue_depth` requests in flight on
//! its own [`IoQueue`], for a time or a written volume. Latencies go to HDR histograms
//! (per thread, merged at the end); operations are counted every second and the largest
//! latency of every 10-second interval is kept for the "average maximum" of seed 002.

use crate::target::{Completion, Durability, IoQueue, Operation, Request, Target};
use crate::workload::{RandomData, ZipfRanks};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use stripelog_blockdev::Prng;

/// Length of the intervals whose maximum latencies are averaged (seed 002).
pub const MAXIMUM_INTERVAL: Duration = Duration::from_secs(10);
/// Highest latency the histograms hold exactly (larger ones are clamped to it).
pub const LATENCY_CEILING_NANOSECONDS: u64 = 600_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Random,
    Sequential,
}

/// What written blocks contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Data {
    /// Random bytes, different for every write.
    Random,
    /// This percentage of every block is zeros, the rest random.
    Compressible(u32),
    Zero,
}

#[derive(Clone, Debug, Serialize)]
pub struct Workload {
    /// Share of requests that read, 0-100.
    pub read_percent: u32,
    /// Each request takes one of these sizes at random (all multiples of 512).
    pub block_sizes_bytes: Vec<usize>,
    pub pattern: Pattern,
    /// Random offsets follow a Zipf distribution with this exponent instead of a uniform one.
    pub zipf_exponent: Option<f64>,
    pub region_offset_bytes: u64,
    pub region_bytes: u64,
    pub data: Data,
    pub threads: usize,
    pub queue_depth: usize,
    pub duration: Duration,
    /// Stop once this many bytes have been written (in addition to the time limit).
    pub write_limit_bytes: Option<u64>,
    /// What every write waits for (a FUA write, or a flush after it).
    pub durability: Durability,
    pub seed: u64,
}

impl Workload {
    fn largest_block_bytes(&self) -> usize {
        self.block_sizes_bytes.iter().copied().max().unwrap_or(4096)
    }

    /// Refuse what cannot run on `target`.
    pub fn check(&self, target: &dyn Target) -> Result<(), String> {
        if self.block_sizes_bytes.is_empty()
            || self.block_sizes_bytes.iter().any(|&size| size == 0 || !size.is_multiple_of(512))
        {
            return Err("block sizes must be non-zero multiples of 512 bytes".into());
        }
        if self.read_percent > 100 {
            return Err("--read-percent is at most 100".into());
        }
        if self.threads == 0 || self.queue_depth == 0 {
            return Err("threads and queue depth must be at least 1".into());
        }
        if !self.region_offset_bytes.is_multiple_of(512) || !self.region_bytes.is_multiple_of(512) {
            return Err("the region must be aligned to 512 bytes".into());
        }
        let end = self.region_offset_bytes.checked_add(self.region_bytes);
        if end.is_none_or(|end| end > target.size_bytes()) {
            return Err(format!(
                "the region ({} bytes from {}) is larger than the target ({} bytes)",
                self.region_bytes,
                self.region_offset_bytes,
                target.size_bytes()
            ));
        }
        if (self.largest_block_bytes() as u64) > self.region_bytes {
            return Err("the largest block does not fit in the region".into());
        }
        if self.read_percent < 100 && !target.writable() {
            return Err("the target is read-only and this workload writes".into());
        }
        if let Some(exponent) = self.zipf_exponent {
            if !(exponent > 0.0 && exponent.is_finite()) {
                return Err("the Zipf exponent must be positive".into());
            }
        }
        Ok(())
    }
}

/// Figures of one direction (read or write), with fio's names where fio has one.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DirectionReport {
    pub io_bytes: u64,
    pub total_ios: u64,
    pub iops: f64,
    pub bw_bytes: f64,
    pub lat_ns: LatencyReport,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LatencyReport {
    pub min: u64,
    pub mean: f64,
    pub max: u64,
    /// Keys as fio writes them ("99.000000").
    pub percentile: std::collections::BTreeMap<String, u64>,
    /// Mean of the maxima of consecutive 10-second intervals (seed 002); the maximum
    /// when the run was shorter than one interval.
    pub average_maximum: f64,
    /// The latency at percentiles spaced evenly in nines, up to the maximum (what
    /// `bench mix --chart` draws).
    pub distribution: Vec<crate::distribution::DistributionPoint>,
}

/// One second of the run.
#[derive(Clone, Debug, Serialize)]
pub struct Second {
    pub second: u64,
    pub read_iops: u64,
    pub write_iops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub target: String,
    pub workload: Workload,
    pub elapsed_seconds: f64,
    pub read: DirectionReport,
    pub write: DirectionReport,
    pub seconds: Vec<Second>,
}

impl RunReport {
    pub fn total_iops(&self) -> f64 {
        self.read.iops + self.write.iops
    }
    pub fn total_bytes_per_second(&self) -> f64 {
        self.read.bw_bytes + self.write.bw_bytes
    }
}

/// Shared counters the sampler reads every second.
#[derive(Default)]
struct Counters {
    read_operations: AtomicU64,
    write_operations: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    /// Bytes of writes submitted, for the write limit.
    write_bytes_submitted: AtomicU64,
}

/// What the workers of one run share.
struct Shared<'run> {
    workload: &'run Workload,
    counters: Counters,
    stop: AtomicBool,
    random: RandomData,
    zipf: Option<ZipfRanks>,
    started: Instant,
}

impl Shared<'_> {
    fn write_limit_reached(&self) -> bool {
        let submitted = self.counters.write_bytes_submitted.load(Ordering::Relaxed);
        self.workload.write_limit_bytes.is_some_and(|limit| submitted >= limit)
    }

    /// Reserves `length_bytes` of the write limit for one write; false when the limit is
    /// reached. Reserving in one atomic step keeps workers on other threads from all seeing
    /// room for one more write and overshooting the limit together.
    fn reserve_write(&self, length_bytes: u64) -> bool {
        let Some(limit) = self.workload.write_limit_bytes else {
            self.counters.write_bytes_submitted.fetch_add(length_bytes, Ordering::Relaxed);
            return true;
        };
        self.counters
            .write_bytes_submitted
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |submitted| {
                (submitted < limit).then_some(submitted + length_bytes)
            })
            .is_ok()
    }
}

/// What one worker thread measured.
struct WorkerResult {
    latencies: [Histogram<u64>; 2],
    /// Per direction, the largest latency of every `MAXIMUM_INTERVAL`.
    interval_maxima: [Vec<u64>; 2],
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_CEILING_NANOSECONDS, 3).expect("valid histogram bounds")
}

/// Offsets of one worker.
struct Chooser<'run> {
    pattern: Pattern,
    region_offset_bytes: u64,
    region_blocks: u64,
    /// Zipf: the run's ranks (spread over the region by a multiplier).
    zipf: Option<&'run ZipfRanks>,
    next_sequential_block: u64,
    /// The worker's own slice of the region for sequential runs: [first, end) in 512-byte blocks.
    sequential_range: (u64, u64),
}

/// Zipf ranks are tracked at this granularity at most (bounds the table's memory).
const ZIPF_RANKS_MAXIMUM: u64 = 1 << 22;

/// The Zipf ranks of a run, if it asks for them: one table shared by every worker.
fn zipf_ranks(workload: &Workload) -> Option<ZipfRanks> {
    let exponent = workload.zipf_exponent?;
    let ranks = (workload.region_bytes / workload.largest_block_bytes() as u64).clamp(1, ZIPF_RANKS_MAXIMUM);
    Some(ZipfRanks::new(ranks, exponent))
}

impl<'run> Chooser<'run> {
    fn new(workload: &Workload, worker: usize, zipf: Option<&'run ZipfRanks>) -> Chooser<'run> {
        let region_blocks = workload.region_bytes / 512;
        let slice = region_blocks / workload.threads as u64;
        let first = slice * worker as u64;
        Chooser {
            pattern: workload.pattern,
            region_offset_bytes: workload.region_offset_bytes,
            region_blocks,
            zipf,
            next_sequential_block: first,
            sequential_range: (first, if slice == 0 { region_blocks } else { first + slice }),
        }
    }

    /// Offset of a request of `length` bytes (aligned to 512 bytes, within the region).
    fn next(&mut self, prng: &mut Prng, length_bytes: usize) -> u64 {
        let length_blocks = (length_bytes / 512) as u64;
        let block = match self.pattern {
            Pattern::Sequential => {
                let (first, end) = self.sequential_range;
                if self.next_sequential_block + length_blocks > end.max(first + length_blocks) {
                    self.next_sequential_block = first;
                }
                let block = self.next_sequential_block;
                self.next_sequential_block += length_blocks;
                block.min(self.region_blocks - length_blocks)
            }
            Pattern::Random if self.zipf.is_some() => {
                let zipf = self.zipf.expect("checked");
                let rank = zipf.sample(prng);
                // Spread the ranks over the region (hot blocks are not all at its start):
                // an odd multiplier is a bijection modulo a power of two.
                let ranks = zipf.len().next_power_of_two();
                let spread = rank.wrapping_mul(0x9E37_79B9_7F4A_7C15) % ranks;
                let slots = self.region_blocks / length_blocks;
                (spread * slots / ranks) * length_blocks
            }
            Pattern::Random => {
                // Aligned to the request's own size, as fio and the seeds' program do.
                prng.below(self.region_blocks / length_blocks) * length_blocks
            }
        };
        self.region_offset_bytes + block * 512
    }
}

/// Bytes of fresh random data written into each 512-byte sector of a buffer that already
/// holds random data, to make it a new block (as fio's `scramble_buffers`).
const SCRAMBLE_BYTES_PER_SECTOR: usize = 8;

/// Make `buffer`, which already holds what `fill` put there for a write of the same
/// length and data, a new block: a fresh random word at the start of each sector (only of
/// the random part of a compressible block, so that its zeros stay zeros). Unique and
/// incompressible as before, without copying the whole block again: on a fast target the
/// copy was a sixth of the loop's time.
fn scramble(buffer: &mut [u8], data: Data, prng: &mut Prng) {
    let percent = match data {
        Data::Random => 0,
        Data::Zero => return,
        Data::Compressible(percent) => percent,
    };
    for block in buffer.chunks_mut(COMPRESSIBLE_BLOCK_BYTES) {
        let zeros = zero_bytes(block.len(), percent);
        for sector in block[zeros..].chunks_exact_mut(512) {
            sector[..SCRAMBLE_BYTES_PER_SECTOR].copy_from_slice(&prng.next_u64().to_le_bytes());
        }
    }
}

/// Fill `buffer` with what a write carries.
fn fill(buffer: &mut [u8], data: Data, random: &RandomData, prng: &mut Prng) {
    match data {
        Data::Random => buffer.copy_from_slice(random.window(prng, buffer.len())),
        Data::Zero => buffer.fill(0),
        Data::Compressible(percent) => {
            // Each 4 KiB block of the request (what the engine compresses) is zeros at the
            // start, as much as asked, and random after.
            for block in buffer.chunks_mut(COMPRESSIBLE_BLOCK_BYTES) {
                let (zero_part, random_part) = block.split_at_mut(zero_bytes(block.len(), percent));
                zero_part.fill(0);
                random_part.copy_from_slice(random.window(prng, random_part.len()));
            }
        }
    }
}

/// The unit `Data::Compressible` makes compressible: the engine's block.
const COMPRESSIBLE_BLOCK_BYTES: usize = stripelog_engine::BLOCK_SIZE_BYTES;

/// Bytes of zeros at the start of a compressible block of `length` bytes (whole sectors).
fn zero_bytes(length: usize, percent: u32) -> usize {
    (length * percent.min(100) as usize / 100) / 512 * 512
}

/// Run `workload` on `target`. `progress` gets the fraction done about every second.
pub fn run(target: &dyn Target, workload: &Workload, progress: &dyn Fn(f64)) -> Result<RunReport, String> {
    run_until(target, workload, progress, &|_| false)
}

/// [`run`], also ended when `stop_when` (asked every second with the seconds so far)
/// says so: the steady-state rule of a saturation run.
pub fn run_until(
    target: &dyn Target,
    workload: &Workload,
    progress: &dyn Fn(f64),
    stop_when: &dyn Fn(&[Second]) -> bool,
) -> Result<RunReport, String> {
    workload.check(target)?;
    let queues: Vec<Box<dyn IoQueue>> = (0..workload.threads)
        .map(|_| target.queue(workload.queue_depth, workload.largest_block_bytes()))
        .collect::<Result<_, _>>()?;
    let shared = Shared {
        workload,
        counters: Counters::default(),
        stop: AtomicBool::new(false),
        random: RandomData::new(workload.seed ^ 0x5EED),
        zipf: zipf_ranks(workload),
        started: Instant::now(),
    };
    let mut seconds = Vec::new();
    let results: Vec<Result<WorkerResult, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = queues
            .into_iter()
            .enumerate()
            .map(|(worker, queue)| {
                let shared = &shared;
                scope.spawn(move || {
                    let result = work(queue, worker, shared);
                    // One failed worker ends the run for all.
                    if result.is_err() {
                        shared.stop.store(true, Ordering::Release);
                    }
                    result
                })
            })
            .collect();
        sample_every_second(&shared, &mut seconds, progress, stop_when, &handles);
        handles.into_iter().map(|handle| handle.join().unwrap_or_else(|_| Err("a worker panicked".into()))).collect()
    });
    let (counters, started) = (&shared.counters, shared.started);
    let elapsed = started.elapsed();
    let mut latencies = [new_histogram(), new_histogram()];
    let mut interval_maxima: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for result in results {
        let result = result?;
        for direction in 0..2 {
            latencies[direction].add(&result.latencies[direction]).expect("same bounds");
            let maxima = &mut interval_maxima[direction];
            for (interval, &maximum) in result.interval_maxima[direction].iter().enumerate() {
                if interval >= maxima.len() {
                    maxima.resize(interval + 1, 0);
                }
                maxima[interval] = maxima[interval].max(maximum);
            }
        }
    }
    let direction = |index: usize, bytes: &AtomicU64, operations: &AtomicU64| {
        let histogram = &latencies[index];
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let (io_bytes, total_ios) = (bytes.load(Ordering::Relaxed), operations.load(Ordering::Relaxed));
        let mut latency = LatencyReport::default();
        if !histogram.is_empty() {
            latency.min = histogram.min();
            latency.mean = histogram.mean();
            latency.max = histogram.max();
            for quantile in [1.0, 5.0, 10.0, 50.0, 90.0, 95.0, 99.0, 99.9, 99.99] {
                latency.percentile.insert(format!("{quantile:.6}"), histogram.value_at_quantile(quantile / 100.0));
            }
            latency.average_maximum = average_maximum(&interval_maxima[index], elapsed, histogram.max());
            latency.distribution = crate::distribution::points(histogram);
        }
        DirectionReport {
            io_bytes,
            total_ios,
            iops: total_ios as f64 / seconds,
            bw_bytes: io_bytes as f64 / seconds,
            lat_ns: latency,
        }
    };
    Ok(RunReport {
        target: target.describe(),
        workload: workload.clone(),
        elapsed_seconds: elapsed.as_secs_f64(),
        read: direction(0, &counters.read_bytes, &counters.read_operations),
        write: direction(1, &counters.write_bytes, &counters.write_operations),
        seconds,
    })
}

/// Mean of the maxima of the whole 10-second intervals; a trailing partial interval
/// counts only when there is no whole one.
fn average_maximum(maxima: &[u64], elapsed: Duration, overall_maximum: u64) -> f64 {
    let whole = (elapsed.as_secs_f64() / MAXIMUM_INTERVAL.as_secs_f64()) as usize;
    let counted: Vec<u64> = maxima.iter().take(whole).copied().filter(|&maximum| maximum > 0).collect();
    if counted.is_empty() {
        overall_maximum as f64
    } else {
        counted.iter().sum::<u64>() as f64 / counted.len() as f64
    }
}

/// The main thread: record the operations of every second until the workers stop.
fn sample_every_second<T>(
    shared: &Shared,
    seconds: &mut Vec<Second>,
    progress: &dyn Fn(f64),
    stop_when: &dyn Fn(&[Second]) -> bool,
    handles: &[std::thread::ScopedJoinHandle<'_, T>],
) {
    let (workload, counters, stop, started) = (shared.workload, &shared.counters, &shared.stop, shared.started);
    let mut last = [0u64; 4];
    let mut next = 1u64;
    loop {
        let finished = handles.iter().all(|handle| handle.is_finished());
        let deadline = started + Duration::from_secs(next);
        let now = Instant::now();
        if !finished && now < deadline {
            std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
            continue;
        }
        let current = [
            counters.read_operations.load(Ordering::Relaxed),
            counters.write_operations.load(Ordering::Relaxed),
            counters.read_bytes.load(Ordering::Relaxed),
            counters.write_bytes.load(Ordering::Relaxed),
        ];
        if !finished || current != last {
            seconds.push(Second {
                second: next,
                read_iops: current[0] - last[0],
                write_iops: current[1] - last[1],
                read_bytes: current[2] - last[2],
                write_bytes: current[3] - last[3],
            });
        }
        last = current;
        next += 1;
        if !finished && stop_when(seconds) {
            stop.store(true, Ordering::Release);
        }
        let time_done = started.elapsed().as_secs_f64() / workload.duration.as_secs_f64().max(1e-9);
        let bytes_done = workload
            .write_limit_bytes
            .map_or(0.0, |limit| counters.write_bytes_submitted.load(Ordering::Relaxed) as f64 / limit.max(1) as f64);
        progress(time_done.max(bytes_done).min(1.0));
        if finished {
            stop.store(true, Ordering::Release);
            return;
        }
    }
}

/// One worker: keep the queue full until the run ends, then drain it.
fn work(mut queue: Box<dyn IoQueue>, worker: usize, shared: &Shared) -> Result<WorkerResult, String> {
    let (workload, counters, started) = (shared.workload, &shared.counters, shared.started);
    let mut prng = Prng::new(workload.seed.wrapping_add(0x9E37_79B9 * (worker as u64 + 1)));
    let mut chooser = Chooser::new(workload, worker, shared.zipf.as_ref());
    let mut latencies = [new_histogram(), new_histogram()];
    let mut interval_maxima: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    let mut free: Vec<usize> = (0..workload.queue_depth).rev().collect();
    // Per slot: the length of the write its buffer was last filled for (0: none yet).
    let mut filled_bytes = vec![0usize; workload.queue_depth];
    let mut issued: Vec<(Instant, Request)> = vec![
        (
            started,
            Request { operation: Operation::Read, offset_bytes: 0, length_bytes: 0, durability: Durability::None }
        );
        workload.queue_depth
    ];
    let mut completions: Vec<Completion> = Vec::with_capacity(workload.queue_depth);
    let mut ending = false;
    loop {
        if !ending {
            ending = shared.stop.load(Ordering::Acquire) || started.elapsed() >= workload.duration;
        }
        // Refill every free slot, unless the run is ending (then only drain).
        if !ending {
            while let Some(slot) = free.pop() {
                // Once the write limit is reached no request of either kind is started; each
                // write also reserves its bytes (`reserve_write`), so the limit is not overshot.
                if shared.write_limit_reached() {
                    free.push(slot);
                    ending = true;
                    break;
                }
                let length_bytes =
                    workload.block_sizes_bytes[prng.below(workload.block_sizes_bytes.len() as u64) as usize];
                let operation =
                    if prng.below(100) < workload.read_percent as u64 { Operation::Read } else { Operation::Write };
                let request = Request {
                    operation,
                    offset_bytes: chooser.next(&mut prng, length_bytes),
                    length_bytes,
                    durability: workload.durability,
                };
                if operation == Operation::Write {
                    if !shared.reserve_write(length_bytes as u64) {
                        free.push(slot);
                        ending = true;
                        break;
                    }
                    let buffer = &mut queue.buffer(slot)[..length_bytes];
                    if filled_bytes[slot] == length_bytes {
                        scramble(buffer, workload.data, &mut prng);
                    } else {
                        fill(buffer, workload.data, &shared.random, &mut prng);
                        filled_bytes[slot] = length_bytes;
                    }
                }
                if operation == Operation::Read {
                    // A read brings the target's data into the buffer.
                    filled_bytes[slot] = 0;
                }
                queue.submit(slot, request)?;
                issued[slot] = (Instant::now(), request);
            }
        }
        if free.len() == workload.queue_depth {
            break;
        }
        completions.clear();
        queue.complete(&mut completions)?;
        let now = Instant::now();
        for (slot, result) in completions.drain(..) {
            let (at, request) = issued[slot];
            let place = match request.operation {
                Operation::Read => "read",
                Operation::Write => "write",
            };
            result.map_err(|error| {
                format!("{place} of {} bytes at {}: {error}", request.length_bytes, request.offset_bytes)
            })?;
            let direction = (request.operation == Operation::Write) as usize;
            let latency =
                now.saturating_duration_since(at).as_nanos().clamp(1, LATENCY_CEILING_NANOSECONDS as u128) as u64;
            latencies[direction].record(latency).expect("clamped within bounds");
            let interval = (now.saturating_duration_since(started).as_nanos() / MAXIMUM_INTERVAL.as_nanos()) as usize;
            let maxima = &mut interval_maxima[direction];
            if interval >= maxima.len() {
                maxima.resize(interval + 1, 0);
            }
            maxima[interval] = maxima[interval].max(latency);
            let (operations, bytes) = match request.operation {
                Operation::Read => (&counters.read_operations, &counters.read_bytes),
                Operation::Write => (&counters.write_operations, &counters.write_bytes),
            };
            operations.fetch_add(1, Ordering::Relaxed);
            bytes.fetch_add(request.length_bytes as u64, Ordering::Relaxed);
            free.push(slot);
        }
    }
    Ok(WorkerResult { latencies, interval_maxima })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrambled_block_is_a_new_block_and_keeps_its_zeros() {
        let random = RandomData::new(1);
        let mut prng = Prng::new(2);
        let mut buffer = vec![0u8; 4096];
        fill(&mut buffer, Data::Compressible(50), &random, &mut prng);
        let before = buffer.clone();
        scramble(&mut buffer, Data::Compressible(50), &mut prng);
        assert!(buffer[..2048].iter().all(|&byte| byte == 0), "the compressible part stays zeros");
        for (new, old) in buffer[2048..].chunks(512).zip(before[2048..].chunks(512)) {
            assert_ne!(new[..SCRAMBLE_BYTES_PER_SECTOR], old[..SCRAMBLE_BYTES_PER_SECTOR], "every sector changes");
            assert_eq!(new[SCRAMBLE_BYTES_PER_SECTOR..], old[SCRAMBLE_BYTES_PER_SECTOR..]);
        }
        let before = buffer.clone();
        scramble(&mut buffer, Data::Random, &mut prng);
        assert!(buffer.chunks(512).zip(before.chunks(512)).all(|(new, old)| new[..8] != old[..8]));
    }

    fn workload(pattern: Pattern, zipf: Option<f64>) -> Workload {
        Workload {
            read_percent: 0,
            block_sizes_bytes: vec![4096],
            pattern,
            zipf_exponent: zipf,
            region_offset_bytes: 1 << 20,
            region_bytes: 64 << 20,
            data: Data::Random,
            threads: 2,
            queue_depth: 4,
            duration: Duration::from_secs(1),
            write_limit_bytes: None,
            durability: Default::default(),
            seed: 7,
        }
    }

    #[test]
    fn offsets_stay_aligned_inside_the_region() {
        let mut prng = Prng::new(1);
        for (pattern, zipf) in [(Pattern::Random, None), (Pattern::Random, Some(0.9)), (Pattern::Sequential, None)] {
            let workload = workload(pattern, zipf);
            for worker in 0..2 {
                let zipf = zipf_ranks(&workload);
                let mut chooser = Chooser::new(&workload, worker, zipf.as_ref());
                for _ in 0..100_000 {
                    let offset = chooser.next(&mut prng, 4096);
                    assert_eq!(offset % 4096, 0);
                    assert!(offset >= workload.region_offset_bytes);
                    assert!(offset + 4096 <= workload.region_offset_bytes + workload.region_bytes);
                }
            }
        }
    }

    #[test]
    fn sequential_workers_walk_their_own_slices_in_order() {
        let workload = workload(Pattern::Sequential, None);
        let mut prng = Prng::new(1);
        let mut chooser = Chooser::new(&workload, 1, None);
        let first = chooser.next(&mut prng, 4096);
        assert_eq!(first, (1 << 20) + (32 << 20));
        assert_eq!(chooser.next(&mut prng, 4096), first + 4096);
    }

    #[test]
    fn zipf_offsets_are_skewed() {
        let workload = workload(Pattern::Random, Some(1.0));
        let mut prng = Prng::new(3);
        let zipf = zipf_ranks(&workload);
        let mut chooser = Chooser::new(&workload, 0, zipf.as_ref());
        let mut counts = std::collections::HashMap::new();
        for _ in 0..100_000 {
            *counts.entry(chooser.next(&mut prng, 4096)).or_insert(0u32) += 1;
        }
        let hottest = counts.values().copied().max().unwrap();
        // Uniform over 16 384 blocks would put about 6 requests on each.
        assert!(hottest > 1000, "hottest block got {hottest} requests");
    }

    #[test]
    fn average_maximum_uses_whole_intervals() {
        assert_eq!(average_maximum(&[10, 30, 99], Duration::from_secs(25), 99), 20.0);
        assert_eq!(average_maximum(&[7], Duration::from_secs(3), 7), 7.0);
    }

    #[test]
    fn compressible_blocks_are_zero_where_asked() {
        let random = RandomData::new(1);
        let mut prng = Prng::new(2);
        let mut block = vec![1u8; 4096];
        fill(&mut block, Data::Compressible(50), &random, &mut prng);
        assert!(block[..2048].iter().all(|&byte| byte == 0));
        assert!(block[2048..].iter().any(|&byte| byte != 0));
        fill(&mut block, Data::Zero, &random, &mut prng);
        assert!(block.iter().all(|&byte| byte == 0));
        // A larger request is compressible in every one of its 4 KiB blocks, as the
        // engine compresses them, not zeros in its first half only.
        let mut request = vec![1u8; 1 << 20];
        fill(&mut request, Data::Compressible(50), &random, &mut prng);
        scramble(&mut request, Data::Compressible(50), &mut prng);
        for block in request.chunks(4096) {
            assert!(block[..2048].iter().all(|&byte| byte == 0));
            assert!(block[2048..].iter().any(|&byte| byte != 0));
        }
    }
}
