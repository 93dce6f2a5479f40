//! A member backed by a regular file (created sparse) or a block device.
//!
//! I/O goes through O_DIRECT where the filesystem allows it (falling back to buffered
//! I/O when the open is refused with EINVAL, e.g. on older tmpfs) and, for batches,
//! through io_uring where the kernel allows it (falling back to pread/pwrite when ring
//! setup is refused: ENOSYS on old kernels, EPERM under seccomp in containers).
//! Single `read_at` / `write_at` calls always use pread/pwrite: they are thread-safe,
//! need no lock, and one request gains nothing from a ring.

use crate::{check_request, BlockDevice, DeviceError, IoRequest, Result, IO_ALIGNMENT_BYTES};
use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Submission-queue size of the io_uring (the completion queue is twice this). It bounds
/// how many requests of one batch are in flight at once: larger batches are submitted in
/// chunks of this many. 128 keeps the ring's locked memory small (older kernels charge it
/// to RLIMIT_MEMLOCK, often 64 KiB in containers) while being well above the queue depth
/// one NVMe namespace needs to reach full throughput with the engine's request sizes.
/// Because every chunk is reaped completely before the next is pushed, the completion
/// queue can never overflow.
const QUEUE_DEPTH_ENTRIES: u32 = 128;

/// `BLKGETSIZE64` = `_IOR(0x12, 114, size_t)`: size of a block device in bytes. Encoded
/// with the generic ioctl layout (direction bits 30-31, size bits 16-29) used by x86_64,
/// aarch64, arm and riscv; equals 0x80081272 on 64-bit targets.
const BLKGETSIZE64: u64 = (2 << 30) | ((std::mem::size_of::<usize>() as u64) << 16) | (0x12 << 8) | 114;

/// `BLKDISCARD` = `_IO(0x12, 119)`: discard a byte range `[u64; 2] = {offset, length}`.
const BLKDISCARD: u64 = 0x1277;

/// Largest request handed to the ring in one SQE (the SQE length field is 32 bits).
/// Larger requests are run with pread/pwrite instead.
const MAX_RING_REQUEST_BYTES: usize = (u32::MAX as usize) / IO_ALIGNMENT_BYTES * IO_ALIGNMENT_BYTES;

/// How `submit_batch` performs I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoEngine {
    /// Linux io_uring: a whole batch is submitted with one system call.
    IoUring,
    /// pread/pwrite, one request after another.
    Sync,
}

/// How [`FileDevice::open`] opens its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDeviceOptions {
    /// Create the file (sparse) if it is missing, or extend a smaller regular file, to
    /// this size. Never shrinks. Ignored for block devices.
    pub create_size_bytes: Option<u64>,
    /// Ask for O_DIRECT; silently falls back to buffered I/O if the filesystem refuses.
    pub direct_io: bool,
    /// Preferred engine for batches; falls back to [`IoEngine::Sync`] if io_uring is
    /// unavailable.
    pub io_engine: IoEngine,
    /// Open read-only: writes and discards return [`DeviceError::InvalidRequest`].
    pub read_only: bool,
}

impl Default for FileDeviceOptions {
    fn default() -> Self {
        FileDeviceOptions { create_size_bytes: None, direct_io: true, io_engine: IoEngine::IoUring, read_only: false }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemberKind {
    RegularFile,
    BlockDevice,
}

/// A member backed by a regular file or a block device.
pub struct FileDevice {
    file: File,
    path: PathBuf,
    kind: MemberKind,
    size_bytes: u64,
    read_only: bool,
    direct_io_requested: bool,
    direct_io_in_use: bool,
    /// `Some` when io_uring is in use for batches.
    ring: Option<Mutex<IoUring>>,
    /// Set if the ring ever fails in a way that leaves it unusable; batches then use
    /// pread/pwrite for the rest of the device's life.
    ring_abandoned: AtomicBool,
    /// Why io_uring is not in use although it was asked for.
    io_uring_unavailable_reason: Option<String>,
    /// The block layer's throttle rule that limits this process's I/O to the device, if
    /// one does: io_uring entries then go straight to the kernel's workers
    /// (`IOSQE_ASYNC`), as a throttled inline attempt is charged twice (`throttle`).
    throttle_rule: Option<String>,
    /// This process's claim on the member (its lock goes with `file`, dropped first).
    _claim: crate::exclusive::MemberClaim,
    /// A writable regular file: the filesystem it is on (`st_dev`).
    filesystem_key: Option<u64>,
}

impl FileDevice {
    /// Open (and if asked, create or extend) the file or block device at `path`.
    pub fn open(path: &Path, options: &FileDeviceOptions) -> Result<FileDevice> {
        let open_error = |source: io::Error| DeviceError::Open { path: path.display().to_string(), source };

        prepare_path(path, options).map_err(open_error)?;

        let exclusive_open = crate::exclusive::wants_exclusive_open(path, !options.read_only);
        let (file, direct_io_in_use) = open_file(path, options, exclusive_open).map_err(|error| {
            if exclusive_open && error.raw_os_error() == Some(libc::EBUSY) {
                DeviceError::InUse { path: path.display().to_string(), holder: crate::exclusive::busy_block_device() }
            } else {
                open_error(error)
            }
        })?;
        // Claimed before anything is read or written (docs/data-safety.md).
        let claim = crate::exclusive::claim(&file, path, !options.read_only).map_err(|error| match error {
            crate::exclusive::ClaimError::InUse(holder) => {
                DeviceError::InUse { path: path.display().to_string(), holder }
            }
            crate::exclusive::ClaimError::Lock(source) => DeviceError::Open {
                path: path.display().to_string(),
                source: io::Error::new(source.kind(), format!("cannot lock it for exclusive use: {source}")),
            },
        })?;
        let metadata = file.metadata().map_err(open_error)?;
        // A smaller regular file is extended (sparse) only now that it is ours.
        if let Some(create_size_bytes) = options.create_size_bytes {
            if metadata.file_type().is_file() && metadata.len() < create_size_bytes && !options.read_only {
                file.set_len(create_size_bytes).map_err(open_error)?;
            }
        }
        let metadata = file.metadata().map_err(open_error)?;
        let file_type = metadata.file_type();
        let (kind, raw_size_bytes) = if file_type.is_file() {
            (MemberKind::RegularFile, metadata.len())
        } else if file_type.is_block_device() {
            (MemberKind::BlockDevice, block_device_size_bytes(&file).map_err(open_error)?)
        } else {
            return Err(open_error(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file or block device")));
        };
        let size_bytes = raw_size_bytes / IO_ALIGNMENT_BYTES as u64 * IO_ALIGNMENT_BYTES as u64;

        let throttle_rule = match kind {
            MemberKind::BlockDevice => {
                crate::throttle::throttle_rule(libc::major(metadata.rdev()), libc::minor(metadata.rdev()))
            }
            MemberKind::RegularFile => None,
        };
        let (ring, io_uring_unavailable_reason) = match options.io_engine {
            IoEngine::Sync => (None, None),
            IoEngine::IoUring => match set_up_ring() {
                Ok(ring) => (Some(Mutex::new(ring)), None),
                Err(reason) => (None, Some(reason)),
            },
        };

        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            kind,
            size_bytes,
            read_only: options.read_only,
            direct_io_requested: options.direct_io,
            direct_io_in_use,
            ring,
            ring_abandoned: AtomicBool::new(false),
            io_uring_unavailable_reason,
            throttle_rule,
            _claim: claim,
            filesystem_key: (kind == MemberKind::RegularFile && !options.read_only).then(|| metadata.dev()),
        })
    }

    /// Whether the file was opened with O_DIRECT (false if not asked for, or refused).
    pub fn direct_io_in_use(&self) -> bool {
        self.direct_io_in_use
    }

    /// The throttle rule that limits this process's I/O to the device, if any (its io_uring
    /// requests then go straight to the kernel's workers).
    pub fn throttle_rule(&self) -> Option<&str> {
        self.throttle_rule.as_deref()
    }

    /// The engine `submit_batch` actually uses.
    pub fn io_engine(&self) -> IoEngine {
        if self.ring.is_some() && !self.ring_abandoned.load(Ordering::Acquire) {
            IoEngine::IoUring
        } else {
            IoEngine::Sync
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The open file's descriptor, for callers that drive their own rings on it (the
    /// benchmark). It stays valid as long as the device.
    pub fn raw_fd(&self) -> std::os::unix::io::RawFd {
        self.file.as_raw_fd()
    }

    fn read_only_error() -> DeviceError {
        DeviceError::InvalidRequest("read-only".to_string())
    }

    /// Validate a request of a batch exactly as `read_at` / `write_at` would.
    fn check_batch_request(&self, request: &IoRequest<'_>) -> Result<()> {
        let buffer_address = match request {
            IoRequest::Read { buffer, .. } => buffer.as_ptr() as usize,
            IoRequest::Write { buffer, .. } => {
                if self.read_only {
                    return Err(Self::read_only_error());
                }
                buffer.as_ptr() as usize
            }
        };
        check_request(self.size_bytes, request.offset_bytes(), request.length_bytes(), buffer_address)
    }

    /// pread until `buffer` is full. No validation: callers have checked the request.
    fn read_fully(&self, mut buffer: &mut [u8], mut offset_bytes: u64) -> Result<()> {
        while !buffer.is_empty() {
            match self.file.read_at(buffer, offset_bytes) {
                Ok(0) => {
                    return Err(DeviceError::Io {
                        offset_bytes,
                        source: io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "read returned 0 bytes before the end of the request",
                        ),
                    })
                }
                Ok(count) => {
                    buffer = &mut buffer[count..];
                    offset_bytes += count as u64;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(DeviceError::Io { offset_bytes, source }),
            }
        }
        Ok(())
    }

    /// pwrite until all of `buffer` is written. No validation: callers have checked.
    fn write_fully(&self, mut buffer: &[u8], mut offset_bytes: u64) -> Result<()> {
        while !buffer.is_empty() {
            match self.file.write_at(buffer, offset_bytes) {
                Ok(0) => {
                    return Err(DeviceError::Io {
                        offset_bytes,
                        source: io::Error::new(
                            io::ErrorKind::WriteZero,
                            "write accepted 0 bytes before the end of the request",
                        ),
                    })
                }
                Ok(count) => {
                    buffer = &buffer[count..];
                    offset_bytes += count as u64;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(DeviceError::Io { offset_bytes, source }),
            }
        }
        Ok(())
    }

    /// Finish a validated request synchronously, starting `done_bytes` into it.
    fn finish_synchronously(&self, request: &mut IoRequest<'_>, done_bytes: usize) -> Result<()> {
        match request {
            IoRequest::Read { buffer, offset_bytes } => {
                let remainder = buffer.get_mut(done_bytes..).unwrap_or_default();
                self.read_fully(remainder, *offset_bytes + done_bytes as u64)
            }
            IoRequest::Write { buffer, offset_bytes } => {
                let remainder = buffer.get(done_bytes..).unwrap_or_default();
                self.write_fully(remainder, *offset_bytes + done_bytes as u64)
            }
        }
    }

    /// The batch through io_uring. Requests the ring did not complete in full (short
    /// transfers, oversized requests, transient errors, an abandoned ring) are finished
    /// with pread/pwrite afterwards, so nothing is ever returned short.
    fn submit_batch_with_ring(&self, ring: &Mutex<IoUring>, requests: &mut [IoRequest<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Option<Result<()>>> = requests.iter().map(|_| None).collect();
        // Bytes already transferred per request, for finishing short ones.
        let mut done_bytes: Vec<usize> = vec![0; requests.len()];
        let mut ring_indexes = Vec::with_capacity(requests.len());
        for (index, request) in requests.iter().enumerate() {
            if let Err(error) = self.check_batch_request(request) {
                results[index] = Some(Err(error));
            } else if request.length_bytes() == 0 {
                results[index] = Some(Ok(()));
            } else if request.length_bytes() <= MAX_RING_REQUEST_BYTES {
                ring_indexes.push(index);
            }
            // Oversized valid requests stay `None` and are finished synchronously below.
        }

        if !ring_indexes.is_empty() {
            let mut ring = ring.lock();
            for chunk in ring_indexes.chunks(QUEUE_DEPTH_ENTRIES as usize) {
                if self.ring_abandoned.load(Ordering::Acquire) {
                    break;
                }
                self.run_ring_chunk(&mut ring, requests, chunk, &mut results, &mut done_bytes);
            }
        }

        results
            .into_iter()
            .zip(requests.iter_mut())
            .zip(done_bytes)
            .map(|((result, request), done)| match result {
                Some(result) => result,
                None => self.finish_synchronously(request, done),
            })
            .collect()
    }

    /// Push one chunk (at most the queue depth) of validated requests, wait until the
    /// kernel has completed every one that it accepted, and record the outcomes.
    fn run_ring_chunk(
        &self,
        ring: &mut IoUring,
        requests: &mut [IoRequest<'_>],
        chunk: &[usize],
        results: &mut [Option<Result<()>>],
        done_bytes: &mut [usize],
    ) {
        let fd = types::Fd(self.file.as_raw_fd());
        let mut pushed_count = 0usize;
        {
            let mut submission = ring.submission();
            for &index in chunk {
                // Lengths were checked against MAX_RING_REQUEST_BYTES, so they fit in u32.
                let entry = match &mut requests[index] {
                    IoRequest::Read { buffer, offset_bytes } => {
                        opcode::Read::new(fd, buffer.as_mut_ptr(), buffer.len() as u32).offset(*offset_bytes).build()
                    }
                    IoRequest::Write { buffer, offset_bytes } => {
                        opcode::Write::new(fd, buffer.as_ptr(), buffer.len() as u32).offset(*offset_bytes).build()
                    }
                }
                .flags(submission_flags(self.submit_through_kernel_workers()))
                .user_data(index as u64);
                // SAFETY: the entry points at `requests[index]`'s buffer, which is borrowed
                // for the whole of `submit_batch` and not touched by us until its
                // completion has been reaped. This function does not return while the
                // kernel still owns any pushed entry: it waits below until every
                // submitted entry has completed, and if submission stops for good the
                // ring is abandoned, so entries left in the queue are never submitted
                // after the buffers are gone. `fd` stays open for `self`'s lifetime.
                if unsafe { submission.push(&entry) }.is_err() {
                    // Queue full: cannot happen (each chunk starts with an empty queue and
                    // is no longer than it); the rest of the chunk is finished
                    // synchronously.
                    break;
                }
                pushed_count += 1;
            }
            submission.sync();
        }

        let mut completed_count = 0usize;
        while completed_count < pushed_count {
            match ring.submit_and_wait(pushed_count - completed_count) {
                Ok(_) => {}
                Err(error) if is_transient(&error) => std::thread::yield_now(),
                Err(_) => {
                    let unsubmitted_count = ring.submission().len();
                    let in_flight_count = pushed_count.saturating_sub(completed_count + unsubmitted_count);
                    if in_flight_count == 0 && ring.completion().is_empty() {
                        // Nothing is owned by the kernel: stop here. Entries still in the
                        // queue point at this batch's buffers, so the ring must never be
                        // entered again; their requests are finished synchronously.
                        self.ring_abandoned.store(true, Ordering::Release);
                        break;
                    }
                    // The kernel still owns buffers: keep reaping until it gives them
                    // back (completions are posted without any system call from us).
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            for completion in ring.completion() {
                completed_count += 1;
                let index = completion.user_data() as usize;
                let (Some(slot), Some(request)) = (results.get_mut(index), requests.get(index)) else {
                    continue;
                };
                let result = completion.result();
                let length_bytes = request.length_bytes();
                if result < 0 {
                    let errno = -result;
                    if errno == libc::EINTR || errno == libc::EAGAIN || errno == libc::ECANCELED {
                        // Transient: left `None`, retried synchronously from the start.
                        continue;
                    }
                    *slot = Some(Err(DeviceError::Io {
                        offset_bytes: request.offset_bytes(),
                        source: io::Error::from_raw_os_error(errno),
                    }));
                } else if (result as usize) < length_bytes {
                    // Short transfer: left `None`, the remainder is finished synchronously.
                    done_bytes[index] = result as usize;
                } else {
                    *slot = Some(Ok(()));
                }
            }
        }
    }

    fn check_discard(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        let alignment = IO_ALIGNMENT_BYTES as u64;
        // The alignment is a power of two; a mask test also keeps the crate's MSRV
        // (1.80, before `u64::is_multiple_of`).
        if (offset_bytes | length_bytes) & (alignment - 1) != 0 {
            return Err(DeviceError::InvalidRequest(format!(
                "discard offset {offset_bytes} or length {length_bytes} is not a multiple of {alignment}"
            )));
        }
        match offset_bytes.checked_add(length_bytes) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(DeviceError::InvalidRequest(format!(
                "discard range {offset_bytes}+{length_bytes} is beyond the device size {}",
                self.size_bytes
            ))),
        }
    }
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_descriptor(&self) -> Option<std::os::unix::io::RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn submit_through_kernel_workers(&self) -> bool {
        self.throttle_rule.is_some()
    }

    fn read_at(&self, buffer: &mut [u8], offset_bytes: u64) -> Result<()> {
        check_request(self.size_bytes, offset_bytes, buffer.len(), buffer.as_ptr() as usize)?;
        self.read_fully(buffer, offset_bytes)
    }

    fn write_at(&self, buffer: &[u8], offset_bytes: u64) -> Result<()> {
        if self.read_only {
            return Err(Self::read_only_error());
        }
        check_request(self.size_bytes, offset_bytes, buffer.len(), buffer.as_ptr() as usize)?;
        self.write_fully(buffer, offset_bytes)
    }

    fn submit_batch(&self, requests: &mut [IoRequest<'_>]) -> Vec<Result<()>> {
        match &self.ring {
            Some(ring) if !self.ring_abandoned.load(Ordering::Acquire) => self.submit_batch_with_ring(ring, requests),
            _ => crate::submit_one_by_one(self, requests),
        }
    }

    fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        // SAFETY: fdatasync only takes a file descriptor, which `self.file` keeps open.
        retry_interrupted(|| unsafe { libc::fdatasync(self.file.as_raw_fd()) })
    }

    fn filesystem_key(&self) -> Option<u64> {
        self.filesystem_key
    }

    fn flush_filesystem(&self) -> Result<()> {
        if self.filesystem_key.is_none() {
            return self.flush();
        }
        // SAFETY: syncfs only takes a file descriptor, which `self.file` keeps open.
        retry_interrupted(|| unsafe { libc::syncfs(self.file.as_raw_fd()) })
    }

    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        if self.read_only {
            return Err(Self::read_only_error());
        }
        self.check_discard(offset_bytes, length_bytes)?;
        if length_bytes == 0 {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        loop {
            let status = match self.kind {
                MemberKind::RegularFile => {
                    // Both values are at most the file's size, which the kernel keeps
                    // within off_t; convert without wrapping anyway.
                    let (Ok(offset), Ok(length)) =
                        (libc::off_t::try_from(offset_bytes), libc::off_t::try_from(length_bytes))
                    else {
                        return Err(DeviceError::InvalidRequest(format!(
                            "discard range {offset_bytes}+{length_bytes} does not fit off_t"
                        )));
                    };
                    // SAFETY: fallocate takes only integers and an open file descriptor.
                    unsafe {
                        libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, length)
                    }
                }
                MemberKind::BlockDevice => {
                    let range: [u64; 2] = [offset_bytes, length_bytes];
                    // SAFETY: BLKDISCARD reads two u64 (offset, length) through the
                    // pointer, which points at `range`, alive for the whole call.
                    unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) }
                }
            };
            if status == 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EINTR) => continue,
                // Discard is advisory: a member that cannot discard keeps its old contents.
                Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL | libc::ENOSYS) => return Ok(()),
                _ => return Err(DeviceError::Io { offset_bytes, source: error }),
            }
        }
    }

    fn health(&self) -> std::result::Result<(), String> {
        let metadata = self.file.metadata().map_err(|error| format!("cannot stat it: {error}"))?;
        if metadata.nlink() == 0 {
            return Err(format!("{} was deleted", self.path.display()));
        }
        if self.kind == MemberKind::RegularFile && metadata.len() < self.size_bytes {
            return Err(format!(
                "{} was truncated to {} bytes (it had {})",
                self.path.display(),
                metadata.len(),
                self.size_bytes
            ));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let kind = match self.kind {
            MemberKind::RegularFile => "file",
            MemberKind::BlockDevice => "block device",
        };
        let direct_io = if self.direct_io_in_use {
            "O_DIRECT"
        } else if self.direct_io_requested {
            "buffered (filesystem refused O_DIRECT)"
        } else {
            "buffered"
        };
        let engine = match (self.io_engine(), &self.io_uring_unavailable_reason) {
            (IoEngine::IoUring, _) => match &self.throttle_rule {
                Some(rule) => format!("io_uring through the kernel's workers: throttled by {rule}"),
                None => "io_uring".to_string(),
            },
            (IoEngine::Sync, Some(reason)) => format!("sync I/O (io_uring unavailable: {reason})"),
            (IoEngine::Sync, None) if self.ring.is_some() => "sync I/O (io_uring failed and was abandoned)".to_string(),
            (IoEngine::Sync, None) => "sync I/O".to_string(),
        };
        let read_only = if self.read_only { ", read-only" } else { "" };
        format!("{} ({kind}, {} bytes, {direct_io}, {engine}{read_only})", self.path.display(), self.size_bytes)
    }
}

/// Create or extend the file if asked to; fail clearly if it is missing and may not be
/// created.
fn prepare_path(path: &Path, options: &FileDeviceOptions) -> io::Result<()> {
    let existing = match std::fs::metadata(path) {
        Ok(metadata) => Some(metadata),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(error),
    };
    let Some(create_size_bytes) = options.create_size_bytes else {
        return match existing {
            Some(_) => Ok(()),
            None => Err(io::Error::new(io::ErrorKind::NotFound, "does not exist (give a create size to create it)")),
        };
    };
    match existing {
        // Block devices cannot be resized; the create size does not apply to them.
        Some(metadata) if !metadata.file_type().is_file() => Ok(()),
        Some(metadata) if metadata.len() >= create_size_bytes => Ok(()),
        _ if options.read_only => {
            Err(io::Error::new(io::ErrorKind::PermissionDenied, "read-only open will not create or extend the file"))
        }
        Some(_) => Ok(()), // extended by `FileDevice::open` once it holds the member's lock
        None => {
            refuse_to_create(path).map_err(|reason| io::Error::new(io::ErrorKind::NotFound, reason))?;
            // create(true) rather than create_new: if someone else creates it in the
            // meantime, nothing of theirs is truncated. The size is set once the file is
            // locked (set_len allocates nothing: the new range is a hole).
            OpenOptions::new().write(true).create(true).truncate(false).open(path)?;
            Ok(())
        }
    }
}

/// Why a file must not be created at `path` (which does not exist), if it must not: its
/// directory does not exist (a mistyped path; directories are never made), or it is
/// under /dev, where a missing name is a device that is not there, never a file to make
/// on /dev's tmpfs (/dev/shm, a tmpfs for files, excepted).
pub fn refuse_to_create(path: &Path) -> std::result::Result<(), String> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let directory = match std::fs::canonicalize(parent) {
        Ok(directory) if directory.is_dir() => directory,
        Ok(_) => return Err(format!("{} is not a directory", parent.display())),
        Err(_) => return Err(format!("no such directory: {}", parent.display())),
    };
    if directory.starts_with("/dev") && !directory.starts_with("/dev/shm") {
        return Err(format!(
            "no such device (a missing path under {} is a device that is not there: no file is made there)",
            directory.display()
        ));
    }
    Ok(())
}

/// Run a system call that returns 0 or -1 (with `errno`) until it is not interrupted.
fn retry_interrupted(mut call: impl FnMut() -> libc::c_int) -> Result<()> {
    loop {
        if call() == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(DeviceError::Io { offset_bytes: 0, source: error });
        }
    }
}

/// Open for I/O, with O_DIRECT if asked and allowed. Returns whether O_DIRECT is on.
fn open_file(path: &Path, options: &FileDeviceOptions, exclusive: bool) -> io::Result<(File, bool)> {
    open_with_fallback(options.direct_io, |direct_io| {
        let flags =
            libc::O_CLOEXEC | if direct_io { libc::O_DIRECT } else { 0 } | if exclusive { libc::O_EXCL } else { 0 };
        OpenOptions::new().read(true).write(!options.read_only).custom_flags(flags).open(path)
    })
}

/// Try `open(true)` (O_DIRECT) if asked, and `open(false)` if that was refused with EINVAL
/// (the filesystem does not support O_DIRECT). Returns whether O_DIRECT is on.
fn open_with_fallback<Handle>(
    direct_io: bool,
    open: impl Fn(bool) -> io::Result<Handle>,
) -> io::Result<(Handle, bool)> {
    if direct_io {
        match open(true) {
            Ok(handle) => return Ok((handle, true)),
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {}
            Err(error) => return Err(error),
        }
    }
    Ok((open(false)?, false))
}

fn block_device_size_bytes(file: &File) -> io::Result<u64> {
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at
    // `size_bytes`, alive and exclusively borrowed for the whole call.
    let status = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size_bytes as *mut u64) };
    if status < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size_bytes)
}

/// Set up a ring and check that the kernel supports the read and write opcodes (5.6+).
fn set_up_ring() -> std::result::Result<IoUring, String> {
    let ring = new_ring(QUEUE_DEPTH_ENTRIES).map_err(|error| error.to_string())?;
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe).map_err(|error| format!("cannot probe opcodes: {error}"))?;
    if !probe.is_supported(opcode::Read::CODE) || !probe.is_supported(opcode::Write::CODE) {
        return Err("kernel lacks IORING_OP_READ/IORING_OP_WRITE".to_string());
    }
    Ok(ring)
}

/// A ring of `entries` whose completions do not interrupt the thread with an
/// inter-processor interrupt (IORING_SETUP_COOP_TASKRUN, 5.19+): they are delivered when it
/// next enters the kernel, which every user of a ring here does to submit or wait. Work the
/// kernel hands to its io-wq threads (buffered writes to tmpfs, for one) otherwise costs an
/// IPI per completion: 4 KiB writes to a file in /dev/shm ran at a fifth of fio's rate.
/// Older kernels get a plain ring.
pub fn new_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::builder().setup_coop_taskrun().build(entries).or_else(|_| IoUring::new(entries))
}

/// The flags of an io_uring entry for a device whose requests go straight to the kernel's
/// workers, or not ([`BlockDevice::submit_through_kernel_workers`]).
pub(crate) fn submission_flags(through_kernel_workers: bool) -> squeue::Flags {
    if through_kernel_workers {
        squeue::Flags::ASYNC
    } else {
        squeue::Flags::empty()
    }
}

/// io_uring_enter errors after which simply entering again is right.
fn is_transient(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuffer;
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::AtomicUsize;

    const BLOCK: usize = IO_ALIGNMENT_BYTES;

    /// A directory under the system temp dir, removed on drop.
    struct TemporaryDirectory {
        path: PathBuf,
    }

    impl TemporaryDirectory {
        fn new(base: &Path) -> TemporaryDirectory {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let path = base.join(format!(
                "stripelog-blockdev-file-{}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&path).expect("create temporary directory");
            TemporaryDirectory { path }
        }

        fn file(&self, name: &str) -> PathBuf {
            self.path.join(name)
        }
    }

    impl Drop for TemporaryDirectory {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }

    fn options(create_size_bytes: u64, io_engine: IoEngine) -> FileDeviceOptions {
        FileDeviceOptions { create_size_bytes: Some(create_size_bytes), io_engine, ..Default::default() }
    }

    fn pattern(seed: usize, length_bytes: usize) -> AlignedBuffer {
        let mut buffer = AlignedBuffer::zeroed(length_bytes);
        for (position, byte) in buffer.iter_mut().enumerate() {
            *byte = (position.wrapping_mul(31) ^ seed.wrapping_mul(131)) as u8;
        }
        buffer
    }

    #[test]
    fn default_options() {
        let options = FileDeviceOptions::default();
        assert_eq!(options.create_size_bytes, None);
        assert!(options.direct_io);
        assert_eq!(options.io_engine, IoEngine::IoUring);
        assert!(!options.read_only);
    }

    #[test]
    fn file_is_created_sparse_and_size_is_rounded_down() {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let path = directory.file("member");
        let size_bytes = (1u64 << 30) + 100;
        let device = FileDevice::open(&path, &options(size_bytes, IoEngine::Sync)).unwrap();
        assert_eq!(device.size_bytes(), 1 << 30);
        let metadata = std::fs::metadata(&path).unwrap();
        assert_eq!(metadata.len(), size_bytes);
        // blocks() counts 512-byte units actually allocated.
        let allocated_bytes = metadata.blocks() * 512;
        assert!(allocated_bytes < size_bytes / 100, "allocated {allocated_bytes} bytes");
        assert!(device.describe().contains("(file, 1073741824 bytes"), "{}", device.describe());
    }

    #[test]
    fn a_member_open_in_this_process_is_refused_by_any_name_until_dropped() {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let path = directory.file("member");
        let device = FileDevice::open(&path, &options(1 << 20, IoEngine::Sync)).unwrap();
        let link = directory.file("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let hard_link = directory.file("hard-link");
        std::fs::hard_link(&path, &hard_link).unwrap();
        let read_only = FileDeviceOptions { read_only: true, ..FileDeviceOptions::default() };
        for (name, options) in
            [(&path, FileDeviceOptions::default()), (&link, read_only.clone()), (&hard_link, read_only)]
        {
            match FileDevice::open(name, &options) {
                Err(DeviceError::InUse { holder, .. }) => {
                    assert!(holder.contains("already open in this process"), "{holder}")
                }
                other => panic!("a second open of {} was not refused: {:?}", name.display(), other.map(|_| ())),
            }
        }
        drop(device);
        FileDevice::open(&link, &FileDeviceOptions::default()).expect("free again once dropped");
    }

    #[test]
    fn a_lock_held_by_another_open_file_refuses_the_member() {
        // Another open file description holding the lock is what another process is to us.
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let path = directory.file("member");
        drop(FileDevice::open(&path, &options(1 << 20, IoEngine::Sync)).unwrap());
        let other = File::open(&path).unwrap();
        // SAFETY: flock on a descriptor `other` owns for the whole call.
        assert_eq!(unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) }, 0);
        match FileDevice::open(&path, &FileDeviceOptions::default()) {
            Err(DeviceError::InUse { holder, .. }) => assert!(holder.contains("in use by another process"), "{holder}"),
            other => panic!("a writer was not refused beside a reader: {:?}", other.map(|_| ())),
        }
        let read_only = FileDeviceOptions { read_only: true, ..FileDeviceOptions::default() };
        drop(FileDevice::open(&path, &read_only).expect("readers share the member"));
        drop(other);
        FileDevice::open(&path, &FileDeviceOptions::default()).expect("free once the other lock is gone");
    }

    #[test]
    fn a_lock_left_by_a_process_that_has_exited_is_waited_for() {
        // What a SIGKILLed server leaves behind for a moment: its lock, held by an open file
        // the kernel has not closed yet (here a background `sleep` that inherited it), taken
        // by a process that is gone (here flock(1)). A restart must wait for it, not refuse.
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let path = directory.file("member");
        drop(FileDevice::open(&path, &options(1 << 20, IoEngine::Sync)).unwrap());
        const HELD_SECONDS: f64 = 2.0;
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec 9<\"$1\" && flock --exclusive 9 && {{ sleep {HELD_SECONDS} & }}"))
            .arg("sh")
            .arg(&path)
            .status()
            .expect("sh and flock(1), from util-linux");
        assert!(status.success());
        let started = std::time::Instant::now();
        FileDevice::open(&path, &FileDeviceOptions::default()).expect("opened once the exited holder's lock is gone");
        assert!(started.elapsed().as_secs_f64() > HELD_SECONDS / 4.0, "the lock was not held: {:?}", started.elapsed());
    }

    #[test]
    fn existing_file_is_extended_but_never_shrunk() {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let path = directory.file("member");
        drop(FileDevice::open(&path, &options(1 << 20, IoEngine::Sync)).unwrap());
        let device = FileDevice::open(&path, &options(4 << 20, IoEngine::Sync)).unwrap();
        assert_eq!(device.size_bytes(), 4 << 20);
        drop(device);
        let device = FileDevice::open(&path, &options(1 << 20, IoEngine::Sync)).unwrap();
        assert_eq!(device.size_bytes(), 4 << 20);
        drop(device);
        let without_create = FileDeviceOptions::default();
        assert_eq!(FileDevice::open(&path, &without_create).unwrap().size_bytes(), 4 << 20);
    }

    #[test]
    fn opening_a_missing_file_without_create_size_fails() {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let path = directory.file("missing");
        let result = FileDevice::open(&path, &FileDeviceOptions::default());
        match result {
            Err(DeviceError::Open { path: reported, source }) => {
                assert!(reported.contains("missing"));
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            other => panic!("expected Open error, got {:?}", other.map(|device| device.describe())),
        }
        assert!(!path.exists());
    }

    #[test]
    fn opening_a_directory_fails() {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let options = FileDeviceOptions { direct_io: false, ..Default::default() };
        assert!(matches!(FileDevice::open(&directory.path, &options), Err(DeviceError::Open { .. })));
    }

    fn round_trip(io_engine: IoEngine) {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let device = FileDevice::open(&directory.file("member"), &options(8 << 20, io_engine)).unwrap();
        let written = pattern(1, 3 * BLOCK);
        device.write_at(&written, 5 * BLOCK as u64).unwrap();
        let mut back = AlignedBuffer::zeroed(3 * BLOCK);
        device.read_at(&mut back, 5 * BLOCK as u64).unwrap();
        assert_eq!(back.as_slice(), written.as_slice());
        // Untouched space reads as zeros; the last block is reachable.
        let mut last = pattern(2, BLOCK);
        device.read_at(&mut last, device.size_bytes() - BLOCK as u64).unwrap();
        assert!(last.iter().all(|&byte| byte == 0));
        device.flush().unwrap();
    }

    #[test]
    fn read_write_round_trip_io_uring() {
        round_trip(IoEngine::IoUring);
    }

    #[test]
    fn read_write_round_trip_sync() {
        round_trip(IoEngine::Sync);
    }

    fn batch_round_trip(io_engine: IoEngine) {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let device = FileDevice::open(&directory.file("member"), &options(16 << 20, io_engine)).unwrap();
        if io_engine == IoEngine::Sync {
            assert_eq!(device.io_engine(), IoEngine::Sync);
        }
        eprintln!("batch test on {}", device.describe());

        // First: 32 writes of two blocks each at even slots.
        let first: Vec<AlignedBuffer> = (0..32).map(|index| pattern(index, 2 * BLOCK)).collect();
        let mut requests: Vec<IoRequest<'_>> = first
            .iter()
            .enumerate()
            .map(|(index, buffer)| IoRequest::Write {
                buffer: buffer.as_slice(),
                offset_bytes: (index * 4 * BLOCK) as u64,
            })
            .collect();
        let results = device.submit_batch(&mut requests);
        assert_eq!(results.len(), 32);
        assert!(results.iter().all(Result::is_ok));

        // Then 64 mixed requests: read back the 32 written slots, write 32 new ones.
        let second: Vec<AlignedBuffer> = (0..32).map(|index| pattern(1000 + index, 2 * BLOCK)).collect();
        let mut read_buffers: Vec<AlignedBuffer> = (0..32).map(|_| AlignedBuffer::zeroed(2 * BLOCK)).collect();
        let mut requests: Vec<IoRequest<'_>> = Vec::new();
        for ((index, read_buffer), write_buffer) in read_buffers.iter_mut().enumerate().zip(&second) {
            requests
                .push(IoRequest::Read { buffer: read_buffer.as_mut_slice(), offset_bytes: (index * 4 * BLOCK) as u64 });
            requests.push(IoRequest::Write {
                buffer: write_buffer.as_slice(),
                offset_bytes: ((index * 4 + 2) * BLOCK) as u64,
            });
        }
        assert_eq!(requests.len(), 64);
        let results = device.submit_batch(&mut requests);
        assert_eq!(results.len(), 64);
        for (index, result) in results.iter().enumerate() {
            assert!(result.is_ok(), "request {index}: {result:?}");
        }
        drop(requests);
        for index in 0..32 {
            assert_eq!(read_buffers[index].as_slice(), first[index].as_slice(), "slot {index}");
            let mut back = AlignedBuffer::zeroed(2 * BLOCK);
            device.read_at(&mut back, ((index * 4 + 2) * BLOCK) as u64).unwrap();
            assert_eq!(back.as_slice(), second[index].as_slice(), "slot {index}");
        }
    }

    #[test]
    fn batch_round_trip_io_uring() {
        batch_round_trip(IoEngine::IoUring);
    }

    #[test]
    fn batch_round_trip_sync() {
        batch_round_trip(IoEngine::Sync);
    }

    #[test]
    fn batch_larger_than_queue_depth_io_uring() {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let device = FileDevice::open(&directory.file("member"), &options(8 << 20, IoEngine::IoUring)).unwrap();
        let count = QUEUE_DEPTH_ENTRIES as usize * 2 + 17;
        let written: Vec<AlignedBuffer> = (0..count).map(|index| pattern(index, BLOCK)).collect();
        let mut requests: Vec<IoRequest<'_>> = written
            .iter()
            .enumerate()
            .map(|(index, buffer)| IoRequest::Write { buffer: buffer.as_slice(), offset_bytes: (index * BLOCK) as u64 })
            .collect();
        assert!(device.submit_batch(&mut requests).iter().all(Result::is_ok));
        let mut back: Vec<AlignedBuffer> = (0..count).map(|_| AlignedBuffer::zeroed(BLOCK)).collect();
        let mut requests: Vec<IoRequest<'_>> = back
            .iter_mut()
            .enumerate()
            .map(|(index, buffer)| IoRequest::Read {
                buffer: buffer.as_mut_slice(),
                offset_bytes: (index * BLOCK) as u64,
            })
            .collect();
        assert!(device.submit_batch(&mut requests).iter().all(Result::is_ok));
        drop(requests);
        for index in 0..count {
            assert_eq!(back[index].as_slice(), written[index].as_slice());
        }
    }

    #[test]
    fn concurrent_batches_from_many_threads() {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let device = FileDevice::open(&directory.file("member"), &options(8 << 20, IoEngine::IoUring)).unwrap();
        std::thread::scope(|scope| {
            for thread in 0..4usize {
                let device = &device;
                scope.spawn(move || {
                    for round in 0..8usize {
                        let base = (thread * 64 + round * 8) * BLOCK;
                        let written: Vec<AlignedBuffer> =
                            (0..8).map(|index| pattern(thread * 100 + round * 10 + index, BLOCK)).collect();
                        let mut requests: Vec<IoRequest<'_>> = written
                            .iter()
                            .enumerate()
                            .map(|(index, buffer)| IoRequest::Write {
                                buffer: buffer.as_slice(),
                                offset_bytes: (base + index * BLOCK) as u64,
                            })
                            .collect();
                        assert!(device.submit_batch(&mut requests).iter().all(Result::is_ok));
                        for (index, buffer) in written.iter().enumerate() {
                            let mut back = AlignedBuffer::zeroed(BLOCK);
                            device.read_at(&mut back, (base + index * BLOCK) as u64).unwrap();
                            assert_eq!(back.as_slice(), buffer.as_slice());
                        }
                    }
                });
            }
        });
    }

    fn invalid_requests(io_engine: IoEngine) {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let device = FileDevice::open(&directory.file("member"), &options(1 << 20, io_engine)).unwrap();
        let size_bytes = device.size_bytes();
        let mut buffer = AlignedBuffer::zeroed(2 * BLOCK);
        let invalid = |result: Result<()>| matches!(result, Err(DeviceError::InvalidRequest(_)));

        // Misaligned offset.
        assert!(invalid(device.read_at(&mut buffer[..BLOCK], 512)));
        assert!(invalid(device.write_at(&buffer[..BLOCK], 512)));
        // Misaligned length.
        assert!(invalid(device.read_at(&mut buffer[..512], 0)));
        // Misaligned buffer address.
        assert!(invalid(device.read_at(&mut buffer[512..512 + BLOCK], 0)));
        assert!(invalid(device.write_at(&buffer[512..512 + BLOCK], 0)));
        // Out of range, including offsets that would overflow.
        assert!(invalid(device.read_at(&mut buffer[..BLOCK], size_bytes)));
        assert!(invalid(device.write_at(&buffer[..2 * BLOCK], size_bytes - BLOCK as u64)));
        assert!(invalid(device.read_at(&mut buffer[..BLOCK], u64::MAX - 4095)));

        // In a batch: invalid requests get their error, valid ones still run.
        let good = pattern(7, BLOCK);
        let misaligned = AlignedBuffer::zeroed(2 * BLOCK);
        let mut requests = vec![
            IoRequest::Write { buffer: &misaligned[512..512 + BLOCK], offset_bytes: 0 },
            IoRequest::Write { buffer: good.as_slice(), offset_bytes: BLOCK as u64 },
            IoRequest::Write { buffer: good.as_slice(), offset_bytes: 100 },
            IoRequest::Write { buffer: good.as_slice(), offset_bytes: size_bytes },
        ];
        let results = device.submit_batch(&mut requests);
        assert_eq!(results.len(), 4);
        assert!(matches!(results[0], Err(DeviceError::InvalidRequest(_))));
        assert!(results[1].is_ok());
        assert!(matches!(results[2], Err(DeviceError::InvalidRequest(_))));
        assert!(matches!(results[3], Err(DeviceError::InvalidRequest(_))));
        let mut back = AlignedBuffer::zeroed(BLOCK);
        device.read_at(&mut back, BLOCK as u64).unwrap();
        assert_eq!(back.as_slice(), good.as_slice());
    }

    #[test]
    fn invalid_requests_are_refused_io_uring() {
        invalid_requests(IoEngine::IoUring);
    }

    #[test]
    fn invalid_requests_are_refused_sync() {
        invalid_requests(IoEngine::Sync);
    }

    #[test]
    fn flush_and_discard() {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let path = directory.file("member");
        let device = FileDevice::open(&path, &options(4 << 20, IoEngine::IoUring)).unwrap();
        let written = pattern(3, 64 * BLOCK);
        device.write_at(&written, 0).unwrap();
        device.flush().unwrap();
        device.discard(0, 32 * BLOCK as u64).unwrap();
        device.discard(0, 0).unwrap();
        device.flush().unwrap();
        // Discarded range reads as zeros or as its old contents; the rest is unchanged.
        let mut back = AlignedBuffer::zeroed(64 * BLOCK);
        device.read_at(&mut back, 0).unwrap();
        let discarded = &back[..32 * BLOCK];
        assert!(discarded.iter().all(|&byte| byte == 0) || discarded == &written[..32 * BLOCK]);
        assert_eq!(&back[32 * BLOCK..], &written[32 * BLOCK..]);

        assert!(matches!(device.discard(512, BLOCK as u64), Err(DeviceError::InvalidRequest(_))));
        assert!(matches!(device.discard(0, 100), Err(DeviceError::InvalidRequest(_))));
        assert!(matches!(device.discard(device.size_bytes(), BLOCK as u64), Err(DeviceError::InvalidRequest(_))));
        assert!(matches!(device.discard(BLOCK as u64, u64::MAX - 4095), Err(DeviceError::InvalidRequest(_))));
    }

    #[test]
    fn read_only_refuses_writes() {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let path = directory.file("member");
        let writer = FileDevice::open(&path, &options(1 << 20, IoEngine::Sync)).unwrap();
        let written = pattern(9, BLOCK);
        writer.write_at(&written, 0).unwrap();
        writer.flush().unwrap();
        drop(writer);

        let read_only = FileDeviceOptions { read_only: true, ..Default::default() };
        let device = FileDevice::open(&path, &read_only).unwrap();
        assert!(device.read_only());
        let mut back = AlignedBuffer::zeroed(BLOCK);
        device.read_at(&mut back, 0).unwrap();
        assert_eq!(back.as_slice(), written.as_slice());
        assert!(matches!(device.write_at(&written, 0), Err(DeviceError::InvalidRequest(_))));
        assert!(matches!(device.discard(0, BLOCK as u64), Err(DeviceError::InvalidRequest(_))));
        let mut requests = vec![IoRequest::Write { buffer: written.as_slice(), offset_bytes: 0 }];
        assert!(matches!(device.submit_batch(&mut requests)[0], Err(DeviceError::InvalidRequest(_))));
        device.flush().unwrap();
        assert!(device.describe().contains("read-only"));

        // A read-only open never creates or extends.
        let missing = FileDeviceOptions { create_size_bytes: Some(1 << 20), ..read_only };
        assert!(matches!(FileDevice::open(&directory.file("other"), &missing), Err(DeviceError::Open { .. })));
    }

    /// On tmpfs, O_DIRECT is refused by kernels before 6.6 and accepted after; either
    /// way the device must work, and must report O_DIRECT exactly when the filesystem
    /// accepted it.
    #[test]
    fn direct_io_falls_back_where_refused() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            eprintln!("SKIPPED: /dev/shm does not exist here: the O_DIRECT fallback is not tested");
            return;
        }
        let directory = TemporaryDirectory::new(shm);
        let path = directory.file("member");
        let device = FileDevice::open(&path, &options(1 << 20, IoEngine::IoUring)).unwrap();

        let filesystem_accepts_direct_io =
            OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path).is_ok();
        assert_eq!(device.direct_io_in_use(), filesystem_accepts_direct_io);
        if !filesystem_accepts_direct_io {
            assert!(device.describe().contains("buffered (filesystem refused O_DIRECT)"));
        }
        eprintln!("/dev/shm member: {}", device.describe());

        // The alignment contract holds with or without O_DIRECT.
        let written = pattern(4, 2 * BLOCK);
        assert!(matches!(device.write_at(&written[..BLOCK], 512), Err(DeviceError::InvalidRequest(_))));
        device.write_at(&written, 0).unwrap();
        let mut back = AlignedBuffer::zeroed(2 * BLOCK);
        device.read_at(&mut back, 0).unwrap();
        assert_eq!(back.as_slice(), written.as_slice());

        drop(device);
        let buffered = FileDeviceOptions { direct_io: false, ..options(1 << 20, IoEngine::Sync) };
        let device = FileDevice::open(&path, &buffered).unwrap();
        assert!(!device.direct_io_in_use());
        assert!(device.describe().ends_with("buffered, sync I/O)"), "{}", device.describe());
    }

    #[test]
    fn direct_io_fallback_happens_only_on_einval() {
        let refusing = |direct_io: bool| {
            if direct_io {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                Ok("buffered")
            }
        };
        assert_eq!(open_with_fallback(true, refusing).unwrap(), ("buffered", false));
        let accepting = |direct_io: bool| Ok(if direct_io { "direct" } else { "buffered" });
        assert_eq!(open_with_fallback(true, accepting).unwrap(), ("direct", true));
        assert_eq!(open_with_fallback(false, accepting).unwrap(), ("buffered", false));
        let denied = |_: bool| -> io::Result<&str> { Err(io::Error::from_raw_os_error(libc::EACCES)) };
        assert!(open_with_fallback(true, denied).is_err());
    }

    /// A file shrunk behind the device's back makes the kernel return short (and then
    /// zero-length) reads: the remainder is attempted synchronously and the request ends
    /// in an UnexpectedEof I/O error, never in a short success.
    fn short_read_is_an_error(io_engine: IoEngine) {
        let directory = TemporaryDirectory::new(&std::env::temp_dir());
        let path = directory.file("member");
        let options = FileDeviceOptions { direct_io: false, ..options(1 << 20, io_engine) };
        let device = FileDevice::open(&path, &options).unwrap();
        device.write_at(&pattern(5, 4 * BLOCK), 0).unwrap();
        OpenOptions::new().write(true).open(&path).unwrap().set_len(6000).unwrap();

        let mut whole = AlignedBuffer::zeroed(4 * BLOCK);
        let mut beyond = AlignedBuffer::zeroed(BLOCK);
        let mut requests = vec![
            IoRequest::Read { buffer: whole.as_mut_slice(), offset_bytes: 0 },
            IoRequest::Read { buffer: beyond.as_mut_slice(), offset_bytes: 8 * BLOCK as u64 },
        ];
        for result in device.submit_batch(&mut requests) {
            match result {
                Err(DeviceError::Io { source, .. }) => {
                    assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof)
                }
                other => panic!("expected UnexpectedEof, got {other:?}"),
            }
        }
        drop(requests);
        assert_eq!(&whole[..6000], &pattern(5, 4 * BLOCK)[..6000]);
        match device.read_at(&mut whole, 0) {
            Err(DeviceError::Io { offset_bytes, source }) => {
                assert_eq!(offset_bytes, 6000);
                assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof);
            }
            other => panic!("expected UnexpectedEof, got {other:?}"),
        }
    }

    #[test]
    fn short_read_is_an_error_io_uring() {
        short_read_is_an_error(IoEngine::IoUring);
    }

    #[test]
    fn short_read_is_an_error_sync() {
        short_read_is_an_error(IoEngine::Sync);
    }

    #[test]
    fn ioctl_request_numbers() {
        if std::mem::size_of::<usize>() == 8 {
            assert_eq!(BLKGETSIZE64, 0x8008_1272);
        }
        assert_eq!(BLKDISCARD, 0x1277);
    }
}
