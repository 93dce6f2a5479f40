//! Backing members ("block devices") for stripelog.
//!
//! The engine talks to every member through one small trait, [`BlockDevice`]. Its
//! contract:
//!
//! - **Positional, aligned I/O.** `read_at` / `write_at` take a byte offset and a buffer
//!   whose address, offset and length are multiples of [`BlockDevice::alignment_bytes`]
//!   (4096 for every implementation here, which satisfies O_DIRECT on 512e and 4Kn
//!   drives). Misaligned or out-of-range requests return [`DeviceError::InvalidRequest`];
//!   they never panic.
//! - **Many in flight.** Every method takes `&self`; callers may issue I/O from many
//!   threads at once. [`BlockDevice::submit_batch`] hands a whole batch over in one call
//!   (io_uring submits them together) and returns when every request in it has finished.
//! - **Durability.** A completed write is *not* durable. It becomes durable when a later
//!   `flush` returns `Ok`. A crash may drop or tear any write not covered by a completed
//!   flush (see `docs/crash-consistency.md`); [`SimulatedDevice`] does exactly that.
//! - **Discard** is advisory: afterwards the range reads as zeros or as its old contents.
//! - **Errors** are values ([`DeviceError`]); a failing member never brings the process down.
//! - **One opener.** A [`FileDevice`] is the only opener of its file or device: it holds
//!   an exclusive lock (shared when read-only) from open to drop, and a second open — in
//!   this process or another — fails with [`DeviceError::InUse`] naming the holder.
//!
//! Implementations: [`FileDevice`] (regular files, created sparse, and block devices;
//! O_DIRECT where the filesystem allows it; io_uring with a portable fallback),
//! [`MemoryDevice`] (RAM) and [`SimulatedDevice`] (RAM with seeded crashes, torn writes,
//! latent read errors and bit rot, for the deterministic simulation), and
//! [`LatencySpikeDevice`] (any member with seeded latency spikes, for measuring slow members).
//!
//! ```
//! use stripelog_blockdev::{AlignedBuffer, BlockDevice, MemoryDevice};
//! let device = MemoryDevice::new(1 << 20);
//! let mut buffer = AlignedBuffer::zeroed(4096);
//! buffer.as_mut_slice().fill(7);
//! device.write_at(buffer.as_slice(), 8192).unwrap();
//! let mut back = AlignedBuffer::zeroed(4096);
//! device.read_at(back.as_mut_slice(), 8192).unwrap();
//! assert_eq!(back.as_slice(), buffer.as_slice());
//! ```

mod aligned;
mod exclusive;
mod file;
mod memory;
mod prng;
mod read_ring;
mod simulated;
mod spike;
mod throttle;

pub use aligned::{AlignedBuffer, IO_ALIGNMENT_BYTES};
pub use file::{new_ring, refuse_to_create, FileDevice, FileDeviceOptions, IoEngine};
pub use memory::MemoryDevice;
pub use prng::Prng;
pub use read_ring::{FinishedRead, ReadRing, COMPLETIONS_PER_REAP_MAXIMUM};
pub use simulated::{CrashReport, SimulatedArray, SimulatedDevice};
pub use spike::LatencySpikeDevice;

use std::fmt;

/// Errors a member can return. Every variant names what failed, so the engine can say
/// which member and where.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("I/O error at byte {offset_bytes}: {source}")]
    Io { offset_bytes: u64, source: std::io::Error },
    #[error("cannot open {path}: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("device is gone (crashed or removed)")]
    Gone,
    /// Another opener holds the member: this process (another use of it), another
    /// process, or the kernel (docs/data-safety.md).
    #[error("{path}: {holder}")]
    InUse { path: String, holder: String },
}

pub type Result<T> = std::result::Result<T, DeviceError>;

/// One request in a batch handed to [`BlockDevice::submit_batch`].
pub enum IoRequest<'a> {
    Read { buffer: &'a mut [u8], offset_bytes: u64 },
    Write { buffer: &'a [u8], offset_bytes: u64 },
}

impl IoRequest<'_> {
    pub fn offset_bytes(&self) -> u64 {
        match self {
            IoRequest::Read { offset_bytes, .. } | IoRequest::Write { offset_bytes, .. } => *offset_bytes,
        }
    }
    pub fn length_bytes(&self) -> usize {
        match self {
            IoRequest::Read { buffer, .. } => buffer.len(),
            IoRequest::Write { buffer, .. } => buffer.len(),
        }
    }
}

/// A backing member. See the crate documentation for the contract.
pub trait BlockDevice: Send + Sync {
    /// Usable size in bytes (a multiple of `alignment_bytes`).
    fn size_bytes(&self) -> u64;

    /// Required alignment of buffer addresses, offsets and lengths.
    fn alignment_bytes(&self) -> usize {
        IO_ALIGNMENT_BYTES
    }

    fn read_at(&self, buffer: &mut [u8], offset_bytes: u64) -> Result<()>;

    fn write_at(&self, buffer: &[u8], offset_bytes: u64) -> Result<()>;

    /// Run every request in `requests`, possibly all at once, and return one result per
    /// request, in order, when all have finished.
    fn submit_batch(&self, requests: &mut [IoRequest<'_>]) -> Vec<Result<()>> {
        submit_one_by_one(self, requests)
    }

    /// Make every write completed before this call durable.
    fn flush(&self) -> Result<()>;

    /// Devices that return the same key are files on one filesystem: one
    /// [`BlockDevice::flush_filesystem`] on any of them makes all of them durable, at the
    /// cost of one flush of the drive underneath instead of one per file. `None` (the
    /// default): flush this device on its own.
    fn filesystem_key(&self) -> Option<u64> {
        None
    }

    /// Make every write completed before this call durable on this device and on every
    /// device with the same [`BlockDevice::filesystem_key`]: the data and metadata of the
    /// whole filesystem (`syncfs(2)`), which also writes back other files' dirty pages.
    fn flush_filesystem(&self) -> Result<()> {
        self.flush()
    }

    /// Tell the device a range no longer holds data (advisory).
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> Result<()>;

    /// A short human description: path, I/O engine, whether O_DIRECT is in use.
    fn describe(&self) -> String;

    /// A descriptor that reads of this device may be submitted on through an io_uring
    /// (the engine's `ReadQueue`): `pread` on it must be what `read_at` does, and it stays
    /// open as long as the device. `None` (the default): reads go through `read_at`.
    fn read_descriptor(&self) -> Option<std::os::unix::io::RawFd> {
        None
    }

    /// Whether io_uring requests on [`BlockDevice::read_descriptor`] go straight to the
    /// kernel's worker threads (`IOSQE_ASYNC`) instead of an inline attempt first: true for
    /// a device under a block-layer throttle rule, which charges a held-back inline attempt
    /// and its retry both ([`FileDevice`]).
    fn submit_through_kernel_workers(&self) -> bool {
        false
    }

    /// Whether the device is still usable as it was opened: `Err` with the reason when it
    /// is known to be gone (a deleted file, a removed drive) or shrunk. Checked
    /// periodically by the engine, which fails a member that does not pass.
    fn health(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Run a batch one request after the other with `read_at`/`write_at` (the default
/// `submit_batch`, and the fallback of implementations that have a faster path).
pub fn submit_one_by_one<D: BlockDevice + ?Sized>(device: &D, requests: &mut [IoRequest<'_>]) -> Vec<Result<()>> {
    requests
        .iter_mut()
        .map(|request| match request {
            IoRequest::Read { buffer, offset_bytes } => device.read_at(buffer, *offset_bytes),
            IoRequest::Write { buffer, offset_bytes } => device.write_at(buffer, *offset_bytes),
        })
        .collect()
}

/// Check alignment and range once, at the edge of every implementation.
pub fn check_request(size_bytes: u64, offset_bytes: u64, length_bytes: usize, buffer_address: usize) -> Result<()> {
    let alignment = IO_ALIGNMENT_BYTES as u64;
    if !offset_bytes.is_multiple_of(alignment) || !(length_bytes as u64).is_multiple_of(alignment) {
        return Err(DeviceError::InvalidRequest(format!(
            "offset {offset_bytes} or length {length_bytes} is not a multiple of {alignment}"
        )));
    }
    if !buffer_address.is_multiple_of(IO_ALIGNMENT_BYTES) {
        return Err(DeviceError::InvalidRequest(format!(
            "buffer address {buffer_address:#x} is not {alignment}-byte aligned"
        )));
    }
    let end = offset_bytes.checked_add(length_bytes as u64);
    match end {
        Some(end) if end <= size_bytes => Ok(()),
        _ => Err(DeviceError::InvalidRequest(format!(
            "range {offset_bytes}+{length_bytes} is beyond the device size {size_bytes}"
        ))),
    }
}

impl fmt::Debug for dyn BlockDevice {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.describe())
    }
}
