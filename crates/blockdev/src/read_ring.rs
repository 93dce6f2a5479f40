//! Reads of many devices in flight at once from one thread, each completing on its own:
//! an io_uring that owns what its reads need until the kernel is done with them (the
//! device, so its descriptor stays open, and the buffer the kernel writes into). The
//! engine's `ReadQueue` serves client reads through one, instead of one blocked thread
//! per read.
//!
//! Devices without a descriptor ([`BlockDevice::read_descriptor`]: the simulation's,
//! wrappers that add latency) are read with `read_at` when the read is pushed; their
//! completion waits in the ring's own list. A read the kernel does not complete in full
//! (an error, a short transfer) is done again with `read_at`, which reports errors as every
//! other read does.

use crate::{check_request, AlignedBuffer, BlockDevice, Result};
use io_uring::{opcode, types, IoUring};
use std::collections::VecDeque;
use std::os::unix::io::RawFd;
use std::sync::Arc;

/// One finished read: the caller's tag, the buffer, and whether it holds the data.
pub struct FinishedRead {
    pub tag: u64,
    pub buffer: AlignedBuffer,
    pub result: Result<()>,
}

/// A read the kernel holds: what must outlive it.
struct Submitted {
    tag: u64,
    device: Arc<dyn BlockDevice>,
    offset_bytes: u64,
    buffer: AlignedBuffer,
}

pub struct ReadRing {
    /// `None` when no ring could be set up: every read then goes through `read_at`.
    ring: Option<IoUring>,
    /// Indexed by the entries' user data; `None` where free.
    submitted: Vec<Option<Submitted>>,
    free: Vec<usize>,
    /// Reads done without the kernel's ring, waiting to be reaped.
    finished: VecDeque<FinishedRead>,
    /// Entries pushed but not yet handed to the kernel.
    unsubmitted: usize,
    /// A descriptor (a socket the caller also reads requests from) whose becoming
    /// readable ends a wait in `reap_or_readable`, and whether the ring is watching it now.
    watched: Option<RawFd>,
    watch_armed: bool,
}

/// The user data of the entry that watches the watched descriptor.
const WATCH_TAG: u64 = u64::MAX;
/// Completions one `reap` takes from the kernel's ring; the rest wait there for the next
/// call, which takes them without waiting. A caller answers what it is given and pushes
/// its next reads before it reaps again, so a burst of completions taken whole would keep
/// the device short of reads for as long as the caller works through it (checksums,
/// copies, replies). Alternated runs of 4 KiB random reads at depth 32 (BENCHMARKS.md,
/// issue 24's eleventh session): one at a time served 1.15 times the reads of a whole
/// burst in process and 1.27 times over NBD; four at a time, 1.11 times in process and
/// 0.91 of one at a time over NBD.
pub const COMPLETIONS_PER_REAP_MAXIMUM: usize = 1;
/// Waits `Drop` makes for the kernel to give back buffers before it gives up and leaks
/// them (a ring that no longer answers).
const DROP_REAP_ATTEMPTS_MAXIMUM: u32 = 1_000_000;

impl ReadRing {
    /// A ring for at most `capacity` reads in flight (more are refused by `push`).
    pub fn new(capacity: usize) -> ReadRing {
        let capacity = capacity.clamp(1, 4096);
        // One entry more than reads: the watch of the watched descriptor.
        let ring = crate::new_ring((capacity + 1).next_power_of_two() as u32).ok();
        ReadRing {
            ring,
            submitted: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
            finished: VecDeque::new(),
            unsubmitted: 0,
            watched: None,
            watch_armed: false,
        }
    }

    /// Let `reap_or_readable` also return, perhaps with nothing, once `descriptor`
    /// becomes readable (or hung up). The ring only watches it: it reads nothing from it.
    /// The caller keeps it open while the ring lives.
    pub fn watch(&mut self, descriptor: RawFd) {
        self.watched = Some(descriptor);
    }

    /// Reads pushed and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.submitted.len() - self.free.len() + self.finished.len()
    }

    /// Whether another read can be pushed now.
    pub fn has_room(&self) -> bool {
        !self.free.is_empty()
    }

    /// Start reading `buffer.len()` bytes at `offset_bytes` of `device`. `Err` gives the
    /// buffer back when the ring is full.
    pub fn push(
        &mut self,
        tag: u64,
        device: Arc<dyn BlockDevice>,
        offset_bytes: u64,
        mut buffer: AlignedBuffer,
    ) -> std::result::Result<(), AlignedBuffer> {
        let checked = check_request(device.size_bytes(), offset_bytes, buffer.len(), buffer.as_ptr() as usize);
        let descriptor = device.read_descriptor().filter(|_| checked.is_ok() && buffer.len() <= u32::MAX as usize);
        let (Some(descriptor), Some(ring)) = (descriptor, self.ring.as_mut()) else {
            let result = checked.and_then(|()| device.read_at(&mut buffer, offset_bytes));
            self.finished.push_back(FinishedRead { tag, buffer, result });
            return Ok(());
        };
        let Some(index) = self.free.pop() else {
            return Err(buffer);
        };
        let entry = opcode::Read::new(types::Fd(descriptor), buffer.as_mut_ptr(), buffer.len() as u32)
            .offset(offset_bytes)
            .build()
            .flags(crate::file::submission_flags(device.submit_through_kernel_workers()))
            .user_data(index as u64);
        // SAFETY: the entry points into `buffer`, whose heap allocation does not move when
        // the buffer is moved into `self.submitted[index]` below; it is kept there, with the
        // device whose descriptor the entry names, until the entry's completion is reaped
        // (`reap`), and `Drop` waits for every entry still with the kernel. The ring has an
        // entry for every slot of `submitted`, so the queue cannot be full here; if it were,
        // the entry is not queued and the slot is given back.
        if unsafe { ring.submission().push(&entry) }.is_err() {
            self.free.push(index);
            let result = device.read_at(&mut buffer, offset_bytes);
            self.finished.push_back(FinishedRead { tag, buffer, result });
            return Ok(());
        }
        self.submitted[index] = Some(Submitted { tag, device, offset_bytes, buffer });
        self.unsubmitted += 1;
        Ok(())
    }

    /// Hand the pushed reads to the kernel now, without waiting for any.
    pub fn submit(&mut self) {
        if let (Some(ring), true) = (self.ring.as_mut(), self.unsubmitted > 0) {
            if ring.submit().is_ok() {
                self.unsubmitted = 0;
            }
        }
    }

    /// Hand the pushed reads to the kernel and collect those finished into `out` (at most
    /// `COMPLETIONS_PER_REAP_MAXIMUM` from the kernel), waiting for at least one when
    /// `wait` and any is in flight.
    pub fn reap(&mut self, wait: bool, out: &mut Vec<FinishedRead>) {
        self.reap_watching(wait, false, out);
    }

    /// `reap`, waiting until a read finishes or the watched descriptor (`watch`) is
    /// readable, whichever comes first.
    pub fn reap_or_readable(&mut self, out: &mut Vec<FinishedRead>) {
        self.reap_watching(true, true, out);
    }

    /// Whether `reap` would find a finished read without waiting.
    pub fn has_finished(&mut self) -> bool {
        self.finished_count() > 0
    }

    /// Finished reads `reap` would find without waiting (the kernel posts a completion
    /// when the thread next enters it: a sleep does).
    pub fn finished_count(&mut self) -> usize {
        self.finished.len() + self.ring.as_mut().map_or(0, |ring| ring.completion().len())
    }

    /// Whether the kernel's ring is in use (`false`: it could not be set up, and every read
    /// is done with `read_at` when it is pushed).
    pub fn uses_the_kernel(&self) -> bool {
        self.ring.is_some()
    }

    fn reap_watching(&mut self, wait: bool, watch: bool, out: &mut Vec<FinishedRead>) {
        let before = out.len();
        out.extend(self.finished.drain(..));
        let waiting_in_kernel = self.submitted.len() - self.free.len();
        if let Some(ring) = self.ring.as_mut() {
            if let (true, Some(descriptor), false) = (watch, self.watched, self.watch_armed) {
                let entry =
                    opcode::PollAdd::new(types::Fd(descriptor), libc::POLLIN as u32).build().user_data(WATCH_TAG);
                // SAFETY: a poll entry points at no memory of ours; the descriptor is kept
                // open by the caller while the ring lives (`watch`). The ring has an entry
                // beyond every read, so there is room.
                if unsafe { ring.submission().push(&entry) }.is_ok() {
                    self.watch_armed = true;
                    self.unsubmitted += 1;
                }
            }
            let ready = !ring.completion().is_empty();
            let want =
                usize::from(wait && !ready && out.len() == before && (waiting_in_kernel > 0 || self.watch_armed));
            if self.unsubmitted > 0 || want > 0 {
                match ring.submit_and_wait(want) {
                    Ok(_) => self.unsubmitted = 0,
                    // Interrupted or busy: the caller comes back; nothing is lost.
                    Err(error) if matches!(error.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
                    // Anything else: the completions below are still reaped; the caller
                    // comes back (without spinning the core it shares with the kernel).
                    Err(_) => std::thread::yield_now(),
                }
            }
            let completions: Vec<(u64, i32)> = ring
                .completion()
                .take(COMPLETIONS_PER_REAP_MAXIMUM)
                .map(|entry| (entry.user_data(), entry.result()))
                .collect();
            for (index, result) in completions {
                if index == WATCH_TAG {
                    self.watch_armed = false;
                    continue;
                }
                let Some(Submitted { tag, device, offset_bytes, mut buffer }) =
                    self.submitted.get_mut(index as usize).and_then(Option::take)
                else {
                    continue;
                };
                self.free.push(index as usize);
                let result = if result >= 0 && result as usize == buffer.len() {
                    Ok(())
                } else {
                    // Short, failed or refused: the plain read says what is wrong.
                    device.read_at(&mut buffer, offset_bytes)
                };
                out.push(FinishedRead { tag, buffer, result });
            }
        }
    }
}

impl Drop for ReadRing {
    fn drop(&mut self) {
        // The kernel may still write into buffers this ring owns: wait for every read.
        let mut sink = Vec::new();
        let mut attempts = 0u32;
        while self.submitted.len() > self.free.len() && self.ring.is_some() {
            self.reap(true, &mut sink);
            sink.clear();
            attempts += 1;
            if attempts > DROP_REAP_ATTEMPTS_MAXIMUM {
                // The ring no longer answers: leak what it may still write into rather
                // than free it under the kernel.
                for submitted in self.submitted.iter_mut().filter_map(Option::take) {
                    std::mem::forget(submitted.buffer);
                }
                if let Some(ring) = self.ring.take() {
                    std::mem::forget(ring);
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileDevice, FileDeviceOptions, MemoryDevice};

    #[test]
    fn a_reap_takes_a_few_completions_and_the_next_takes_the_rest_without_waiting() {
        let directory = std::env::temp_dir().join(format!("stripelog-read-ring-few-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("directory");
        let options = FileDeviceOptions { create_size_bytes: Some(1 << 20), ..FileDeviceOptions::default() };
        let device: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&directory.join("f"), &options).expect("open"));
        assert!(device.read_descriptor().is_some(), "a file device is read through the kernel's ring");
        let mut ring = ReadRing::new(16);
        if !ring.uses_the_kernel() {
            let message = "io_uring could not be set up here: the ring reads with read_at, and this test cannot run";
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
            eprintln!("SKIPPED a_reap_takes_a_few_completions_and_the_next_takes_the_rest_without_waiting: {message}");
            return;
        }
        let reads = 3 * COMPLETIONS_PER_REAP_MAXIMUM + 2;
        for index in 0..reads {
            let pushed = ring.push(index as u64, device.clone(), index as u64 * 4096, AlignedBuffer::zeroed(4096));
            assert!(pushed.is_ok(), "room for every read");
        }
        ring.submit();
        // Until every read has finished in the kernel (each sleep enters it, which posts the
        // completions).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while ring.finished_count() < reads {
            assert!(std::time::Instant::now() < deadline, "the kernel did not finish {reads} reads in 30 s");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut finished = Vec::new();
        let mut reaps = 0;
        while ring.in_flight() > 0 {
            assert!(ring.has_finished(), "a finished read is waiting after {} of {reads}", finished.len());
            let before = finished.len();
            ring.reap(false, &mut finished);
            assert!(
                (1..=COMPLETIONS_PER_REAP_MAXIMUM).contains(&(finished.len() - before)),
                "a reap took {} completions",
                finished.len() - before
            );
            reaps += 1;
        }
        assert_eq!(reaps, reads.div_ceil(COMPLETIONS_PER_REAP_MAXIMUM));
        assert!(!ring.has_finished());
        assert!(finished.iter().all(|read| read.result.is_ok()));
        let _ = std::fs::remove_dir_all(&directory);
    }

    #[test]
    fn reads_of_files_and_of_a_memory_device_complete_with_their_tags() {
        let directory = std::env::temp_dir().join(format!("stripelog-read-ring-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("directory");
        let size = 1 << 20;
        let options = FileDeviceOptions { create_size_bytes: Some(size), ..FileDeviceOptions::default() };
        let mut devices: Vec<Arc<dyn BlockDevice>> = (0..3)
            .map(|index| {
                Arc::new(FileDevice::open(&directory.join(format!("f{index}")), &options).expect("open"))
                    as Arc<dyn BlockDevice>
            })
            .collect();
        devices.push(Arc::new(MemoryDevice::new(size)));
        for (number, device) in devices.iter().enumerate() {
            for block in 0..(size / 4096) {
                let mut buffer = AlignedBuffer::zeroed(4096);
                buffer[..16].copy_from_slice(&[number as u64, block].map(u64::to_le_bytes).concat());
                device.write_at(&buffer, block * 4096).expect("write");
            }
        }
        let mut ring = ReadRing::new(16);
        let mut finished = Vec::new();
        let wanted: Vec<(usize, u64)> =
            (0..200).map(|index| (index % 4, (index as u64 * 37) % (size / 4096))).collect();
        let mut next = 0;
        while finished.len() < wanted.len() {
            while next < wanted.len() && ring.has_room() {
                let (number, block) = wanted[next];
                let pushed = ring.push(next as u64, devices[number].clone(), block * 4096, AlignedBuffer::zeroed(4096));
                assert!(pushed.is_ok(), "no room with room");
                next += 1;
            }
            ring.reap(true, &mut finished);
        }
        // One beyond the end: its own error.
        assert!(ring.push(999, devices[1].clone(), size, AlignedBuffer::zeroed(4096)).is_ok());
        let mut beyond = Vec::new();
        while beyond.is_empty() {
            ring.reap(true, &mut beyond);
        }
        assert!(beyond[0].tag == 999 && beyond[0].result.is_err());
        assert_eq!(ring.in_flight(), 0);
        finished.sort_by_key(|read| read.tag);
        for (read, &(number, block)) in finished.iter().zip(&wanted) {
            read.result.as_ref().expect("read");
            assert_eq!(
                read.buffer[..16],
                [number as u64, block].map(u64::to_le_bytes).concat()[..],
                "tag {}",
                read.tag
            );
        }
        drop(ring);
        drop(devices);
        let _ = std::fs::remove_dir_all(&directory);
    }
}
