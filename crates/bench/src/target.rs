//! What a benchmark drives. Three kinds of target, one interface:
//!
//! - a file or block device, with O_DIRECT and io_uring (`PATH` or `file:PATH`);
//! - an NBD export, through the pipelining client of [`crate::nbd_client`]
//!   (`nbd+unix:///NAME?socket=PATH`, `nbd://HOST[:PORT]/NAME`);
//! - a stripelog volume in this process (`engine:MEMBER,MEMBER,...`).
//!
//! Each worker thread asks the target for an [`IoQueue`] that keeps up to `depth`
//! requests in flight; the workload code in [`crate::run`] is the same for every target.

use crate::nbd_client::{NbdAddress, NbdConnection};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Arc;
use stripelog_blockdev::{AlignedBuffer, BlockDevice, FileDevice, FileDeviceOptions, IoEngine};
use stripelog_engine::{MemberDevice, OpenOptions as VolumeOpenOptions, Volume};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

/// What a write asks of the target before it completes (reads ignore it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// Complete once the target has the data (in a volatile cache, perhaps).
    #[default]
    None,
    /// Forced unit access: complete once this write is durable (NBD's FUA flag,
    /// `RWF_DSYNC` on a file, the engine's FUA write).
    Fua,
    /// The write, and once it has completed a flush (NBD_CMD_FLUSH, `fdatasync`, the
    /// engine's flush), as fio's `--fsync=1` does: the request completes with the flush.
    Flush,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "none" => Ok(Durability::None),
            "fua" => Ok(Durability::Fua),
            "flush" => Ok(Durability::Flush),
            other => Err(format!("durability is none, fua or flush, not {other:?}")),
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Durability::None => "none",
            Durability::Fua => "fua",
            Durability::Flush => "flush",
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub operation: Operation,
    pub offset_bytes: u64,
    pub length_bytes: usize,
    /// For writes: what the write waits for.
    pub durability: Durability,
}

/// Marks the cookie or user data of the first part of a two-part request (a write that a
/// flush follows): its completion is not the request's.
pub(crate) const FIRST_PART: u64 = 1 << 32;

/// A completed request: its slot and, if it failed, why.
pub type Completion = (usize, Result<(), String>);

/// One worker's view of a target: `depth` slots, each with its own buffer.
pub trait IoQueue: Send {
    /// The buffer of `slot` (at least the largest block of the run). A write's payload is
    /// put there before [`IoQueue::submit`]; the slot is not touched again until it completes.
    fn buffer(&mut self, slot: usize) -> &mut [u8];
    /// Queue a request on `slot` (the target may see it only at the next `complete`).
    fn submit(&mut self, slot: usize, request: Request) -> Result<(), String>;
    /// Send what was queued and wait for at least one completion (none if nothing is in
    /// flight); completions are appended to `completions`.
    fn complete(&mut self, completions: &mut Vec<Completion>) -> Result<(), String>;
}

pub trait Target: Send + Sync {
    fn size_bytes(&self) -> u64;
    /// Path or URI, and how it is driven (for reports).
    fn describe(&self) -> String;
    fn writable(&self) -> bool;
    fn queue(&self, depth: usize, buffer_bytes: usize) -> Result<Box<dyn IoQueue>, String>;
}

/// How [`open`] treats the target.
#[derive(Clone, Debug, Default)]
pub struct TargetOptions {
    /// The run writes. Writes never go to an existing, non-empty path without `force`.
    pub writes: bool,
    pub force: bool,
    /// Create a missing file of this size (sparse).
    pub create_size_bytes: Option<u64>,
    /// `engine:` targets: the volume's block cache (`None`: the engine's default; 0: off,
    /// so that every read goes to the members).
    pub engine_cache_bytes: Option<u64>,
    /// `engine:` targets: the volume's index page cache (`None`: the engine's default).
    pub map_cache_bytes: Option<u64>,
}

/// Open the target named by `spec` (see the module documentation for the forms).
pub fn open(spec: &str, options: &TargetOptions) -> Result<Box<dyn Target>, String> {
    if spec.starts_with("nbd://") || spec.starts_with("nbd+unix://") {
        return Ok(Box::new(NbdTarget::open(spec, options)?));
    }
    if let Some(members) = spec.strip_prefix("engine:") {
        return Ok(Box::new(EngineTarget::open(members, options)?));
    }
    let path = spec.strip_prefix("file:").unwrap_or(spec);
    if path.is_empty() {
        return Err("an empty target: give a path, an nbd:// or nbd+unix:// URI, or engine:MEMBERS".into());
    }
    Ok(Box::new(FileTarget::open(Path::new(path), options)?))
}

/// Refuse to write over data without `--force`: a path that exists and is not empty.
pub(crate) fn check_overwrite(path: &Path, options: &TargetOptions) -> Result<(), String> {
    if !options.writes || options.force {
        return Ok(());
    }
    refuse_existing_data(path)
}

/// Refuse a path a benchmark would write over: a block device, or a file that exists and
/// is not empty (names what it found; the caller's `--force` is the way past).
pub fn refuse_existing_data(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.file_type().is_block_device() => Err(format!(
            "{}: a block device; a write benchmark overwrites it (pass --force to allow that)",
            path.display()
        )),
        Ok(metadata) if metadata.len() > 0 => Err(format!(
            "{}: exists and is not empty ({} bytes); a write benchmark overwrites it (pass --force to allow that)",
            path.display(),
            metadata.len()
        )),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------
// Files and block devices.

pub struct FileTarget {
    /// Opened (and created, sized, its O_DIRECT fallback decided) by the member code;
    /// the benchmark drives its descriptor with its own rings.
    device: Arc<FileDevice>,
    writable: bool,
}

impl FileTarget {
    fn open(path: &Path, options: &TargetOptions) -> Result<FileTarget, String> {
        let name = path.display();
        check_overwrite(path, options)?;
        if options.create_size_bytes.is_none() && !path.exists() {
            return Err(format!("{name}: does not exist (give --size to create it)"));
        }
        let device_options = FileDeviceOptions {
            create_size_bytes: options.create_size_bytes,
            direct_io: true,
            // No ring of its own: each worker sets up one sized to its queue depth.
            io_engine: IoEngine::Sync,
            // A missing file is created even for a read-only run (it reads as zeros).
            read_only: !options.writes && path.exists(),
        };
        let device = FileDevice::open(path, &device_options).map_err(|error| format!("{name}: {error}"))?;
        Ok(FileTarget { device: Arc::new(device), writable: options.writes })
    }
}

impl Target for FileTarget {
    fn size_bytes(&self) -> u64 {
        self.device.size_bytes()
    }
    fn describe(&self) -> String {
        let mode = if self.device.direct_io_in_use() { "O_DIRECT" } else { "buffered" };
        format!("{} (io_uring, {mode})", self.device.path().display())
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn queue(&self, depth: usize, buffer_bytes: usize) -> Result<Box<dyn IoQueue>, String> {
        // Two entries per slot: a write and the flush linked to it.
        let entries = (2 * depth.max(1) as u32).next_power_of_two();
        // One thread submits to the ring and reaps from it: the kernel then runs the
        // completions' work only when that thread asks for completions (DEFER_TASKRUN),
        // rather than interrupting it for each. Such a ring belongs to the thread that
        // enables it, which is the worker that first submits (`push`), not this one.
        let (ring, enabled) = match io_uring::IoUring::builder()
            .setup_r_disabled()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(entries)
        {
            Ok(ring) => (ring, false),
            Err(_) => (stripelog_blockdev::new_ring(entries).map_err(|error| format!("io_uring: {error}"))?, true),
        };
        let buffers = (0..depth).map(|_| AlignedBuffer::zeroed(buffer_bytes)).collect();
        Ok(Box::new(FileQueue {
            device: self.device.clone(),
            ring,
            enabled,
            buffers,
            lengths: vec![0; depth],
            flushes: vec![false; depth],
            first_part_errors: vec![None; depth],
            in_flight: 0,
        }))
    }
}

/// A file's queue: used, and dropped, by the one worker thread it is handed to.
struct FileQueue {
    device: Arc<FileDevice>,
    ring: io_uring::IoUring,
    /// Whether the ring is enabled (set up disabled, so that it belongs to the thread
    /// that first submits: a single-issuer ring refuses every other thread).
    enabled: bool,
    /// One per slot; never reallocated while the queue exists (the kernel holds pointers
    /// into them while requests are in flight).
    buffers: Vec<AlignedBuffer>,
    /// Bytes each slot's request moves (a short transfer is an error).
    lengths: Vec<usize>,
    /// Per slot: its request is a write and a linked flush.
    flushes: Vec<bool>,
    /// Per slot: why the write of a write-then-flush failed (reported with the flush).
    first_part_errors: Vec<Option<String>>,
    /// Ring entries in flight (two for a write-then-flush).
    in_flight: usize,
}

impl IoQueue for FileQueue {
    fn buffer(&mut self, slot: usize) -> &mut [u8] {
        self.buffers[slot].as_mut_slice()
    }

    fn submit(&mut self, slot: usize, request: Request) -> Result<(), String> {
        let fd = io_uring::types::Fd(self.device.raw_fd());
        let buffer = self.buffers[slot].as_mut_slice()[..request.length_bytes].as_mut_ptr();
        let length = request.length_bytes as u32;
        self.lengths[slot] = request.length_bytes;
        self.flushes[slot] = request.operation == Operation::Write && request.durability == Durability::Flush;
        self.first_part_errors[slot] = None;
        let user_data = slot as u64;
        let write = || io_uring::opcode::Write::new(fd, buffer, length).offset(request.offset_bytes);
        let entries = match (request.operation, request.durability) {
            (Operation::Read, _) => vec![io_uring::opcode::Read::new(fd, buffer, length)
                .offset(request.offset_bytes)
                .build()
                .user_data(user_data)],
            (Operation::Write, Durability::None) => vec![write().build().user_data(user_data)],
            (Operation::Write, Durability::Fua) => {
                vec![write().rw_flags(libc::RWF_DSYNC).build().user_data(user_data)]
            }
            // The fdatasync is linked: it starts once the write has completed.
            (Operation::Write, Durability::Flush) => vec![
                write().build().flags(io_uring::squeue::Flags::IO_LINK).user_data(user_data | FIRST_PART),
                io_uring::opcode::Fsync::new(fd)
                    .flags(io_uring::types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(user_data),
            ],
        };
        self.push(&entries)
    }

    fn complete(&mut self, completions: &mut Vec<Completion>) -> Result<(), String> {
        if self.in_flight == 0 {
            return Ok(());
        }
        let before = completions.len();
        while completions.len() == before && self.in_flight > 0 {
            self.ring.submit_and_wait(1).map_err(|error| format!("io_uring: {error}"))?;
            for entry in self.ring.completion() {
                let (user_data, result) = (entry.user_data(), entry.result());
                let (slot, first_part) = ((user_data & !FIRST_PART) as usize, user_data & FIRST_PART != 0);
                self.in_flight -= 1;
                // A flush moves no bytes; a read or write moves all of its own.
                let expected = if self.flushes[slot] && !first_part { 0 } else { self.lengths[slot] };
                let outcome = if result < 0 {
                    Err(std::io::Error::from_raw_os_error(-result).to_string())
                } else if result as usize != expected {
                    Err(format!("short transfer: {result} of {expected} bytes"))
                } else {
                    Ok(())
                };
                if first_part {
                    // The write of a write-then-flush: its failure is the request's (the
                    // linked flush is then cancelled).
                    self.first_part_errors[slot] = outcome.err();
                    continue;
                }
                let outcome = match self.first_part_errors[slot].take() {
                    Some(error) => Err(error),
                    None => outcome,
                };
                completions.push((slot, outcome));
            }
        }
        Ok(())
    }
}

impl FileQueue {
    /// Hand `entries` (one request: a read or write, or a write and its linked flush) to
    /// the kernel.
    fn push(&mut self, entries: &[io_uring::squeue::Entry]) -> Result<(), String> {
        if !self.enabled {
            self.ring.submitter().register_enable_rings().map_err(|error| format!("io_uring: {error}"))?;
            self.enabled = true;
        }
        // SAFETY: the entries point into the buffer of their slot in `self.buffers`, which
        // lives as long as the ring (both are fields of `self`; the ring is dropped first
        // only after `Drop` below has waited for every request) and is not reused until
        // this request's completion is reaped. The file descriptor is kept open by
        // `self.device`.
        let pushed = unsafe { self.ring.submission().push_multiple(entries) };
        if pushed.is_err() {
            // The ring holds two entries per slot, rounded up: only reached if the caller
            // submits more than `depth` requests at once.
            return Err("io_uring submission queue full".into());
        }
        self.in_flight += entries.len();
        // Handed to the kernel at once, one request per call, as fio does by default
        // (iodepth_batch_submit=1). Gathering the refills of a whole wakeup into one call
        // cost 25 % on this machine's virtio disk: the host then received and completed the
        // requests in bursts of about 31, and the queue ran empty between bursts
        // (BENCHMARKS.md, "agreement with fio"). On /dev/shm both ways run alike.
        self.ring.submit().map_err(|error| format!("io_uring: {error}"))?;
        Ok(())
    }
}

impl Drop for FileQueue {
    fn drop(&mut self) {
        // Requests still in flight must finish before their buffers are freed.
        while self.in_flight > 0 {
            if self.ring.submit_and_wait(1).is_err() {
                break;
            }
            self.in_flight -= self.ring.completion().count();
        }
    }
}

// ---------------------------------------------------------------------------------------
// NBD exports.

pub struct NbdTarget {
    uri: String,
    address: NbdAddress,
    export: String,
    size_bytes: u64,
    writable: bool,
}

impl NbdTarget {
    fn open(uri: &str, options: &TargetOptions) -> Result<NbdTarget, String> {
        let (address, export) = crate::nbd_client::parse_uri(uri)?;
        let connection = NbdConnection::connect(&address, &export)?;
        let (size_bytes, read_only) = (connection.size_bytes(), connection.read_only());
        connection.disconnect();
        if options.writes && read_only {
            return Err(format!("{uri}: the export is read-only and this benchmark writes"));
        }
        if options.writes && !options.force {
            match NbdConnection::first_allocated_byte(&address, &export) {
                Ok(None) => {}
                Ok(Some(offset)) => {
                    return Err(format!(
                        "{uri}: the export holds data (allocated at byte {offset}, by base:allocation); a write \
                         benchmark overwrites it (pass --force to allow that)"
                    ))
                }
                Err(reason) => {
                    return Err(format!(
                        "{uri}: cannot tell whether the export holds data ({reason}); a write benchmark overwrites \
                         it (pass --force to allow that)"
                    ))
                }
            }
        }
        Ok(NbdTarget { uri: uri.to_string(), address, export, size_bytes, writable: !read_only })
    }
}

impl Target for NbdTarget {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn describe(&self) -> String {
        format!("{} (NBD, one connection per thread)", self.uri)
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn queue(&self, depth: usize, buffer_bytes: usize) -> Result<Box<dyn IoQueue>, String> {
        let connection = NbdConnection::connect(&self.address, &self.export)?;
        Ok(Box::new(connection.into_queue(depth, buffer_bytes)?))
    }
}

// ---------------------------------------------------------------------------------------
// A stripelog volume in this process.

pub struct EngineTarget {
    volume: Arc<Volume>,
    members: String,
    writable: bool,
}

impl EngineTarget {
    /// A volume this process already opened (`compare` also exports it over NBD).
    pub fn from_volume(volume: Arc<Volume>, members: String) -> EngineTarget {
        EngineTarget { volume, members, writable: true }
    }

    fn open(members: &str, options: &TargetOptions) -> Result<EngineTarget, String> {
        let paths: Vec<&str> = members.split(',').filter(|path| !path.is_empty()).collect();
        if paths.is_empty() {
            return Err("engine: name the volume's members: engine:MEMBER,MEMBER,...".into());
        }
        let open = |read_only: bool| -> Result<Volume, String> {
            let mut devices = Vec::new();
            for path in &paths {
                let device_options = FileDeviceOptions { read_only, ..FileDeviceOptions::default() };
                let device = FileDevice::open(Path::new(path), &device_options).map_err(|error| error.to_string())?;
                devices.push(MemberDevice { name: path.to_string(), device: Some(Arc::new(device)) });
            }
            let defaults = VolumeOpenOptions::default();
            let open_options = VolumeOpenOptions {
                read_only,
                holder_program: "stripelog bench".into(),
                cache_size_bytes: options.engine_cache_bytes.unwrap_or(defaults.cache_size_bytes),
                map_cache_bytes: options.map_cache_bytes.or(defaults.map_cache_bytes),
                ..defaults
            };
            Volume::open(devices, &open_options).map_err(|error| format!("engine:{members}: {error}"))
        };
        // A write benchmark on a volume that holds data only with --force: its mapped blocks
        // are what it holds (the member files are never empty). Decided read-only, before
        // anything is written (a read-write open records an epoch).
        if options.writes && !options.force {
            let stats = open(true)?.stats();
            if stats.blocks_mapped > 0 {
                return Err(format!(
                    "engine:{members}: the volume holds data ({} blocks mapped, {} bytes); a write benchmark \
                     overwrites it (pass --force to allow that)",
                    stats.blocks_mapped,
                    stats.blocks_mapped * stats.block_size_bytes as u64
                ));
            }
        }
        let volume = open(!options.writes)?;
        Ok(EngineTarget { volume: Arc::new(volume), members: members.to_string(), writable: options.writes })
    }
}

impl Target for EngineTarget {
    fn size_bytes(&self) -> u64 {
        self.volume.logical_size_bytes()
    }
    fn describe(&self) -> String {
        format!("engine:{} (in process: reads through a read queue, writes one caller per queue slot)", self.members)
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn queue(&self, depth: usize, buffer_bytes: usize) -> Result<Box<dyn IoQueue>, String> {
        Ok(Box::new(EngineQueue {
            reads: self.volume.read_queue(depth),
            writes: CallerQueue::new(self.volume.clone(), depth, buffer_bytes),
        }))
    }
}

/// The engine driven as an application would drive it: reads through the volume's read
/// queue (many in flight from this one thread, io_uring on file members), writes through
/// caller threads (a write without FUA returns once the engine holds it).
pub struct EngineQueue {
    reads: stripelog_engine::ReadQueue,
    writes: CallerQueue,
}

impl EngineQueue {
    fn reads_completed(&mut self, wait: bool, completions: &mut Vec<Completion>) -> usize {
        let completed = self.reads.complete(wait);
        let count = completed.len();
        for read in completed {
            let slot = read.tag as usize;
            self.writes.buffers[slot] = Some(read.buffer);
            completions.push((slot, read.result.map_err(|error| error.to_string())));
        }
        count
    }
}

impl IoQueue for EngineQueue {
    fn buffer(&mut self, slot: usize) -> &mut [u8] {
        self.writes.buffer(slot)
    }

    fn submit(&mut self, slot: usize, request: Request) -> Result<(), String> {
        if request.operation == Operation::Write {
            return self.writes.submit(slot, request);
        }
        let buffer = self.writes.buffers[slot].take().ok_or("slot submitted twice")?;
        self.reads.submit(slot as u64, request.offset_bytes, request.length_bytes, buffer);
        Ok(())
    }

    fn complete(&mut self, completions: &mut Vec<Completion>) -> Result<(), String> {
        match (self.reads.in_flight() > 0, self.writes.in_flight > 0) {
            (false, _) => self.writes.complete(completions),
            (true, false) => {
                self.reads_completed(true, completions);
                Ok(())
            }
            // Both kinds in flight: take whichever finishes first.
            (true, true) => loop {
                let reads = self.reads_completed(false, completions);
                if reads + self.writes.complete_ready(completions) > 0 {
                    return Ok(());
                }
                std::thread::yield_now();
            },
        }
    }
}

impl Drop for EngineTarget {
    fn drop(&mut self) {
        // Flush what the run wrote (the volume closes when its last handle goes).
        if self.writable {
            if let Err(error) = self.volume.flush() {
                eprintln!("stripelog bench: flushing the volume failed: {error}");
            }
        }
    }
}

/// A target whose calls are synchronous and take any buffer: the engine, and the
/// conventional arrays of the flash experiments. A queue of depth `d` is `d` callers.
pub trait SynchronousTarget: Send + Sync + 'static {
    fn read(&self, offset_bytes: u64, buffer: &mut [u8]) -> Result<(), String>;
    fn write(&self, offset_bytes: u64, data: &[u8]) -> Result<(), String>;
    /// A write that waits for `durability`; targets without a notion of it refuse.
    fn write_durable(&self, offset_bytes: u64, data: &[u8], durability: Durability) -> Result<(), String> {
        match durability {
            Durability::None => self.write(offset_bytes, data),
            other => Err(format!("this target cannot make a write durable ({other})")),
        }
    }
}

impl SynchronousTarget for Volume {
    fn read(&self, offset_bytes: u64, buffer: &mut [u8]) -> Result<(), String> {
        Volume::read(self, offset_bytes, buffer).map_err(|error| error.to_string())
    }
    fn write(&self, offset_bytes: u64, data: &[u8]) -> Result<(), String> {
        Volume::write(self, offset_bytes, data, false).map_err(|error| error.to_string())
    }
    fn write_durable(&self, offset_bytes: u64, data: &[u8], durability: Durability) -> Result<(), String> {
        let written = Volume::write(self, offset_bytes, data, durability == Durability::Fua);
        match (written, durability) {
            (Ok(()), Durability::Flush) => Volume::flush(self).map_err(|error| error.to_string()),
            (written, _) => written.map_err(|error| error.to_string()),
        }
    }
}

type CallerJob = (usize, Request, Vec<u8>);

/// `depth` caller threads, each making one synchronous call at a time.
pub struct CallerQueue {
    buffers: Vec<Option<Vec<u8>>>,
    jobs: Option<stripelog_engine::queue::Sender<CallerJob>>,
    done: stripelog_engine::queue::Receiver<(CallerJob, Result<(), String>)>,
    callers: Vec<std::thread::JoinHandle<()>>,
    in_flight: usize,
}

impl CallerQueue {
    pub fn new(target: Arc<dyn SynchronousTarget>, depth: usize, buffer_bytes: usize) -> CallerQueue {
        let (jobs, incoming) = stripelog_engine::queue::bounded::<CallerJob>(depth);
        let (finished, done) = stripelog_engine::queue::bounded(depth);
        let callers = (0..depth)
            .map(|_| {
                let (target, incoming, finished) = (target.clone(), incoming.clone(), finished.clone());
                std::thread::spawn(move || {
                    for (slot, request, mut buffer) in incoming {
                        let data = &mut buffer[..request.length_bytes];
                        let result = match request.operation {
                            Operation::Read => target.read(request.offset_bytes, data),
                            Operation::Write => target.write_durable(request.offset_bytes, data, request.durability),
                        };
                        if finished.send(((slot, request, buffer), result)).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        CallerQueue {
            buffers: (0..depth).map(|_| Some(vec![0u8; buffer_bytes])).collect(),
            jobs: Some(jobs),
            done,
            callers,
            in_flight: 0,
        }
    }
}

impl CallerQueue {
    /// Collect the calls finished by now, without waiting; how many.
    fn complete_ready(&mut self, completions: &mut Vec<Completion>) -> usize {
        let mut count = 0;
        for ((slot, _, buffer), result) in self.done.try_iter() {
            self.buffers[slot] = Some(buffer);
            self.in_flight -= 1;
            completions.push((slot, result));
            count += 1;
        }
        count
    }
}

impl IoQueue for CallerQueue {
    fn buffer(&mut self, slot: usize) -> &mut [u8] {
        self.buffers[slot].as_deref_mut().expect("the slot is not in flight")
    }

    fn submit(&mut self, slot: usize, request: Request) -> Result<(), String> {
        let buffer = self.buffers[slot].take().ok_or("slot submitted twice")?;
        let jobs = self.jobs.as_ref().ok_or("queue closed")?;
        jobs.send((slot, request, buffer)).map_err(|_| "the target's callers stopped".to_string())?;
        self.in_flight += 1;
        Ok(())
    }

    fn complete(&mut self, completions: &mut Vec<Completion>) -> Result<(), String> {
        if self.in_flight == 0 {
            return Ok(());
        }
        let ((slot, _, buffer), result) = self.done.recv().map_err(|_| "the target's callers stopped".to_string())?;
        self.buffers[slot] = Some(buffer);
        self.in_flight -= 1;
        completions.push((slot, result));
        self.complete_ready(completions);
        Ok(())
    }
}

impl Drop for CallerQueue {
    fn drop(&mut self) {
        self.jobs = None;
        for caller in self.callers.drain(..) {
            let _ = caller.join();
        }
    }
}
