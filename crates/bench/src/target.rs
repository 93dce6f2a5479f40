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

#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub operation: Operation,
    pub offset_bytes: u64,
    pub length_bytes: usize,
}

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
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.file_type().is_block_device() || metadata.len() > 0 => Err(format!(
            "{}: exists and is not empty; a write benchmark overwrites it (pass --force to allow that)",
            path.display()
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
        let entries = (depth.max(1) as u32).next_power_of_two();
        let ring = io_uring::IoUring::new(entries).map_err(|error| format!("io_uring: {error}"))?;
        let buffers = (0..depth).map(|_| AlignedBuffer::zeroed(buffer_bytes)).collect();
        Ok(Box::new(FileQueue { device: self.device.clone(), ring, buffers, lengths: vec![0; depth], in_flight: 0 }))
    }
}

struct FileQueue {
    device: Arc<FileDevice>,
    ring: io_uring::IoUring,
    /// One per slot; never reallocated while the queue exists (the kernel holds pointers
    /// into them while requests are in flight).
    buffers: Vec<AlignedBuffer>,
    /// Bytes each slot's request moves (a short transfer is an error).
    lengths: Vec<usize>,
    in_flight: usize,
}

impl IoQueue for FileQueue {
    fn buffer(&mut self, slot: usize) -> &mut [u8] {
        self.buffers[slot].as_mut_slice()
    }

    fn submit(&mut self, slot: usize, request: Request) -> Result<(), String> {
        let fd = io_uring::types::Fd(self.device.raw_fd());
        let buffer = &mut self.buffers[slot].as_mut_slice()[..request.length_bytes];
        let length = request.length_bytes as u32;
        let entry = match request.operation {
            Operation::Read => {
                io_uring::opcode::Read::new(fd, buffer.as_mut_ptr(), length).offset(request.offset_bytes).build()
            }
            Operation::Write => {
                io_uring::opcode::Write::new(fd, buffer.as_ptr(), length).offset(request.offset_bytes).build()
            }
        };
        self.push(slot, request, entry)
    }

    fn complete(&mut self, completions: &mut Vec<Completion>) -> Result<(), String> {
        if self.in_flight == 0 {
            return Ok(());
        }
        self.ring.submit_and_wait(1).map_err(|error| format!("io_uring: {error}"))?;
        for entry in self.ring.completion() {
            let slot = entry.user_data() as usize;
            let expected = self.lengths[slot];
            let result = entry.result();
            self.in_flight -= 1;
            completions.push((
                slot,
                if result < 0 {
                    Err(std::io::Error::from_raw_os_error(-result).to_string())
                } else if result as usize != expected {
                    Err(format!("short transfer: {result} of {expected} bytes"))
                } else {
                    Ok(())
                },
            ));
        }
        Ok(())
    }
}

impl FileQueue {
    fn push(&mut self, slot: usize, request: Request, entry: io_uring::squeue::Entry) -> Result<(), String> {
        self.lengths[slot] = request.length_bytes;
        let entry = entry.user_data(slot as u64);
        // SAFETY: the entry points into `self.buffers[slot]`, which lives as long as the
        // ring (both are fields of `self`; the ring is dropped first only after `Drop`
        // below has waited for every request) and is not reused until this request's
        // completion is reaped. The file descriptor is kept open by `self.device`.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // The ring holds `depth` entries rounded up: only reached if the caller
            // submits more than `depth` requests at once.
            return Err("io_uring submission queue full".into());
        }
        self.in_flight += 1;
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
            let open_options = VolumeOpenOptions {
                read_only,
                holder_program: "stripelog bench".into(),
                ..VolumeOpenOptions::default()
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
        format!("engine:{} (in process, one caller per queue slot)", self.members)
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn queue(&self, depth: usize, buffer_bytes: usize) -> Result<Box<dyn IoQueue>, String> {
        Ok(Box::new(CallerQueue::new(self.volume.clone(), depth, buffer_bytes)))
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
}

impl SynchronousTarget for Volume {
    fn read(&self, offset_bytes: u64, buffer: &mut [u8]) -> Result<(), String> {
        Volume::read(self, offset_bytes, buffer).map_err(|error| error.to_string())
    }
    fn write(&self, offset_bytes: u64, data: &[u8]) -> Result<(), String> {
        Volume::write(self, offset_bytes, data, false).map_err(|error| error.to_string())
    }
}

type CallerJob = (usize, Request, Vec<u8>);

/// `depth` caller threads, each making one synchronous call at a time.
pub struct CallerQueue {
    buffers: Vec<Option<Vec<u8>>>,
    jobs: Option<crossbeam_channel::Sender<CallerJob>>,
    done: crossbeam_channel::Receiver<(CallerJob, Result<(), String>)>,
    callers: Vec<std::thread::JoinHandle<()>>,
    in_flight: usize,
}

impl CallerQueue {
    pub fn new(target: Arc<dyn SynchronousTarget>, depth: usize, buffer_bytes: usize) -> CallerQueue {
        let (jobs, incoming) = crossbeam_channel::bounded::<CallerJob>(depth);
        let (finished, done) = crossbeam_channel::bounded(depth);
        let callers = (0..depth)
            .map(|_| {
                let (target, incoming, finished) = (target.clone(), incoming.clone(), finished.clone());
                std::thread::spawn(move || {
                    for (slot, request, mut buffer) in incoming {
                        let data = &mut buffer[..request.length_bytes];
                        let result = match request.operation {
                            Operation::Read => target.read(request.offset_bytes, data),
                            Operation::Write => target.write(request.offset_bytes, data),
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
        let first = self.done.recv().map_err(|_| "the target's callers stopped".to_string())?;
        for ((slot, _, buffer), result) in std::iter::once(first).chain(self.done.try_iter()) {
            self.buffers[slot] = Some(buffer);
            self.in_flight -= 1;
            completions.push((slot, result));
        }
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
