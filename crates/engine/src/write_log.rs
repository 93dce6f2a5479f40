//! The write log at run time (docs/write-log.md, Part 2): client writes are staged in RAM
//! as they are accepted, and a flush (or a FUA write) appends what is staged to the log
//! device as checksummed, sequence-numbered records and syncs it — one append at a time,
//! so concurrent flushes share it (group commit). The stripes are written as before; a
//! record is dead once the member batches holding its entries are durable. Mount reads
//! the records back from the persisted tail and replays what the members lack.
//!
//! Knows the log's devices and format; nothing of batches beyond their sequence numbers.

use crate::error::{
    Error, LogDeviceFailure, LogDeviceProblem, LogSuperblockCopyProblem, RequestProblem, Result, WriteLogProblem,
};
use crate::layout::format;
use crate::layout::geometry::BLOCK_SIZE_BYTES;
use crate::layout::write_log::{
    LogEntry, LogEntryKind, LogSuperblock, RecordHeader, LOG_AREA_START_BYTES, LOG_DEVICE_MINIMUM_BYTES,
    LOG_SUPERBLOCK_OFFSETS_BYTES, RECORD_BYTES_MAXIMUM, RECORD_ENTRIES_MAXIMUM,
};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use stripelog_blockdev::{AlignedBuffer, BlockDevice, DeviceError};

/// A log may mirror its records on this many devices.
pub const LOG_MIRRORS_MAXIMUM: usize = 2;
/// Client writes staged in RAM before a writer appends them to the log unsynced (a flush
/// appends whatever is staged at any size): bounds the RAM and the work of one flush.
pub(crate) const STAGING_BLOCKS_SOFT_LIMIT: usize = 1024;
const BLOCK: u64 = BLOCK_SIZE_BYTES as u64;

/// Client writes accepted since the last append, in acceptance order.
#[derive(Default)]
pub(crate) struct Staging {
    pub(crate) entries: Vec<LogEntry>,
    /// The data blocks of the data entries, in order.
    pub(crate) data: Vec<u8>,
}

impl Staging {
    pub(crate) fn push(&mut self, entry: LogEntry, data: Option<&[u8]>) {
        if let Some(block) = data {
            self.data.extend_from_slice(block);
        }
        self.entries.push(entry);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// One device of the log (two for a mirrored log).
pub(crate) struct LogDevice {
    pub(crate) path: String,
    device: Option<Arc<dyn BlockDevice>>,
    /// Why the device is no longer written (a failed write or sync, or missing at open).
    failure: Mutex<Option<Arc<LogDeviceFailure>>>,
}

impl LogDevice {
    fn usable(&self) -> Option<&Arc<dyn BlockDevice>> {
        if self.failure.lock().is_some() {
            return None;
        }
        self.device.as_ref()
    }

    fn fail(&self, reason: LogDeviceFailure) {
        let mut failure = self.failure.lock();
        if failure.is_none() {
            log::error!("write log device {} failed: {reason}", self.path);
            *failure = Some(Arc::new(reason));
        }
    }

    /// The device and why it failed, if it did.
    fn problem(&self) -> Option<LogDeviceProblem> {
        let failure = self.failure.lock().clone()?;
        Some(LogDeviceProblem { path: self.path.clone(), failure })
    }
}

/// A record on the log that holds entries the members may not hold durably yet.
struct LiveRecord {
    start_bytes: u64,
    sequence: u64,
    /// The largest member batch sequence of its entries (0 for a wrap record).
    last_batch_sequence: u64,
}

/// The appender's position; one append at a time holds it.
pub(crate) struct Appender {
    head_bytes: u64,
    next_record_sequence: u64,
    records: VecDeque<LiveRecord>,
    superblock: LogSuperblock,
    /// The record being written; shared with the mirror helper while it writes it.
    buffer: Arc<AlignedBuffer>,
    /// Records were written since the devices were last synced (an append past the soft
    /// limit is not synced): the next flush must sync even with nothing staged.
    unsynced: bool,
}

/// What the mirror helper runs on one device (a copy shares the record).
#[derive(Clone)]
enum MirrorOperation {
    Write { record: Arc<AlignedBuffer>, length: usize, offset_bytes: u64 },
    Flush,
}

impl MirrorOperation {
    fn run(&self, device: &dyn BlockDevice) -> std::result::Result<(), DeviceError> {
        match self {
            MirrorOperation::Write { record, length, offset_bytes } => {
                device.write_at(&record[..*length], *offset_bytes)
            }
            MirrorOperation::Flush => device.flush(),
        }
    }
}

struct MirrorJob {
    device: Arc<dyn BlockDevice>,
    operation: MirrorOperation,
    reply: crate::queue::Sender<std::result::Result<(), DeviceError>>,
}

/// A thread that writes and syncs a mirrored log's second device while the appender
/// writes and syncs the first, so that a mirror costs one device's time rather than two
/// (threaded volumes; the simulation's inline volumes keep one order of device
/// operations). It stops when the log is dropped (its queue closes).
struct MirrorHelper {
    jobs: crate::queue::Sender<MirrorJob>,
}

/// Why an append did not complete.
pub(crate) enum AppendProblem {
    /// The log is full of records whose batches are not durable on the members yet.
    NeedSpace,
    /// Every device of the log failed: the volume falls back to syncing the members.
    Failed,
}

/// A logged entry and, for a data entry, its block.
pub(crate) type LoggedEntry = (LogEntry, Option<AlignedBuffer>);

/// What [`scan`] found: the entries of the chain, the head, the next record sequence.
type Chain = (Vec<LoggedEntry>, u64, u64);

/// What the log reported at open: the entries of its records in order, with their data.
pub(crate) struct LogContents {
    pub(crate) entries: Vec<LoggedEntry>,
    /// A replay interrupted by a crash went on from this member batch.
    pub(crate) replay_after_sequence: Option<u64>,
}

/// Counters since the open.
#[derive(Default)]
pub(crate) struct LogCounters {
    pub(crate) appends: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) sync_nanoseconds: AtomicU64,
    pub(crate) bytes_appended: AtomicU64,
    pub(crate) used_bytes: AtomicU64,
}

pub(crate) struct WriteLog {
    pub(crate) volume_uuid: [u8; 16],
    pub(crate) log_uuid: [u8; 16],
    pub(crate) devices: Vec<LogDevice>,
    /// Lock order: the appender before the volume's state lock (a flush holds it while it
    /// takes the staged writes, and while it syncs the members when the log is full).
    pub(crate) appender: Mutex<Appender>,
    /// The record area's size (fixed when the log was formatted).
    size_bytes: u64,
    /// Records are written (false until the open has replayed the log and taken it over,
    /// and once every device has failed).
    active: AtomicBool,
    pub(crate) counters: LogCounters,
    /// Started by threaded volumes with a mirrored log (`start_mirror_helper`).
    mirror_helper: OnceLock<MirrorHelper>,
}

/// The usable size of a log device: whole blocks.
fn area_end_bytes(devices: &[Arc<dyn BlockDevice>]) -> u64 {
    devices.iter().map(|device| device.size_bytes()).min().unwrap_or(0) / BLOCK * BLOCK
}

impl WriteLog {
    /// Write a new, empty log on `devices` (one, or two for a mirror): returns its UUID.
    pub(crate) fn format(devices: &[(String, Arc<dyn BlockDevice>)], volume_uuid: [u8; 16]) -> Result<[u8; 16]> {
        if devices.is_empty() || devices.len() > LOG_MIRRORS_MAXIMUM {
            return Err(Error::InvalidRequest(RequestProblem::WriteLogDeviceCount { given: devices.len() }));
        }
        let plain: Vec<Arc<dyn BlockDevice>> = devices.iter().map(|(_, device)| device.clone()).collect();
        let area_end = area_end_bytes(&plain);
        if area_end < LOG_DEVICE_MINIMUM_BYTES {
            return Err(Error::InvalidRequest(RequestProblem::WriteLogDeviceTooSmall {
                minimum_bytes: LOG_DEVICE_MINIMUM_BYTES,
                path: devices[0].0.clone(),
                size_bytes: plain.iter().map(|device| device.size_bytes()).min().unwrap_or(0),
            }));
        }
        let log_uuid = *uuid::Uuid::new_v4().as_bytes();
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        for (index, (path, device)) in devices.iter().enumerate() {
            let superblock = LogSuperblock {
                copy: 0,
                volume_uuid,
                log_uuid,
                mirror_index: index as u32,
                mirror_count: devices.len() as u32,
                device_size_bytes: device.size_bytes(),
                area_end_bytes: area_end,
                tail_position_bytes: LOG_AREA_START_BYTES,
                tail_record_sequence: 1,
                replay_after_sequence: None,
                update_sequence: 1,
                generation: 1,
            };
            for (copy, &offset) in LOG_SUPERBLOCK_OFFSETS_BYTES.iter().enumerate() {
                LogSuperblock { copy: copy as u32, ..superblock.clone() }.encode(&mut block);
                device.write_at(&block, offset).map_err(|error| log_device_error(path, error))?;
            }
            device.flush().map_err(|error| log_device_error(path, error))?;
        }
        Ok(log_uuid)
    }

    /// Open the log of volume `volume_uuid` named `log_uuid` on `devices` (a missing one:
    /// `None`) and read its records from the persisted tail. Fails when no device holds
    /// the log.
    pub(crate) fn open(
        devices: Vec<(String, Option<Arc<dyn BlockDevice>>)>,
        volume_uuid: [u8; 16],
        log_uuid: [u8; 16],
    ) -> std::result::Result<(WriteLog, LogContents), WriteLogProblem> {
        let mut opened = Vec::new();
        let mut best: Option<(usize, LogSuperblock)> = None;
        let mut problems = Vec::new();
        for (index, (path, device)) in devices.into_iter().enumerate() {
            let failure = match &device {
                None => Some(LogDeviceFailure::Missing),
                Some(device) => match read_superblock(device.as_ref(), &volume_uuid, &log_uuid) {
                    Ok(superblock) => {
                        if best.as_ref().is_none_or(|(_, current)| superblock.update_sequence > current.update_sequence)
                        {
                            best = Some((index, superblock));
                        }
                        None
                    }
                    Err(copies) => Some(LogDeviceFailure::NoSuperblock(copies)),
                },
            };
            let failure = failure.map(Arc::new);
            if let Some(failure) = &failure {
                problems.push(LogDeviceProblem { path: path.clone(), failure: failure.clone() });
            }
            opened.push(LogDevice { path, device, failure: Mutex::new(failure) });
        }
        let Some((_, superblock)) = best else {
            return Err(WriteLogProblem::Devices(problems));
        };
        // The longest valid chain of records on any device (a mirror's devices are written
        // alike; one may hold a record the other lost in a crash, never acknowledged).
        let mut chosen: Option<Chain> = None;
        for device in &opened {
            let Some(handle) = device.usable() else { continue };
            match scan(handle.as_ref(), &superblock) {
                Ok(found) => {
                    if chosen.as_ref().is_none_or(|current| found.2 > current.2) {
                        chosen = Some(found);
                    }
                }
                Err(error) => device.fail(LogDeviceFailure::Device(error)),
            }
        }
        let Some((entries, head_bytes, next_record_sequence)) = chosen else {
            return Err(WriteLogProblem::NoDeviceReadable(problems));
        };
        let contents = LogContents { entries, replay_after_sequence: superblock.replay_after_sequence };
        let size_bytes = superblock.area_end_bytes - LOG_AREA_START_BYTES;
        let log = WriteLog {
            volume_uuid,
            log_uuid,
            devices: opened,
            appender: Mutex::new(Appender {
                head_bytes,
                next_record_sequence,
                records: VecDeque::new(),
                superblock,
                buffer: Arc::new(AlignedBuffer::zeroed(RECORD_BYTES_MAXIMUM as usize)),
                unsynced: false,
            }),
            mirror_helper: OnceLock::new(),
            active: AtomicBool::new(false),
            counters: LogCounters::default(),
            size_bytes,
        };
        Ok((log, contents))
    }

    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Why the log is not written, if it is not (every device failed).
    pub(crate) fn failure(&self) -> Option<WriteLogProblem> {
        let failed = self.failed_devices();
        (failed.len() == self.devices.len()).then_some(WriteLogProblem::Devices(failed))
    }

    /// The positions (in the member superblocks' list) of the devices that failed.
    pub(crate) fn failed_device_indices(&self) -> Vec<usize> {
        self.devices
            .iter()
            .enumerate()
            .filter(|(_, device)| device.failure.lock().is_some())
            .map(|(index, _)| index)
            .collect()
    }

    /// Devices of the log that failed, with why.
    pub(crate) fn failed_devices(&self) -> Vec<LogDeviceProblem> {
        self.devices.iter().filter_map(LogDevice::problem).collect()
    }

    /// Record that mount replays the log's entries after member batch `after_sequence`:
    /// a replay interrupted by a crash starts again from the same point.
    pub(crate) fn begin_replay(&self, after_sequence: u64) -> Result<()> {
        let mut appender = self.appender.lock();
        if appender.superblock.replay_after_sequence.is_some() {
            return Ok(());
        }
        appender.superblock.replay_after_sequence = Some(after_sequence);
        self.persist_superblock(&mut appender)
    }

    /// Everything the log held is durable on the members (replayed, or already there):
    /// start a new generation with an empty log at the current head, and accept appends.
    pub(crate) fn take_over(&self) -> Result<()> {
        let mut appender = self.appender.lock();
        appender.records.clear();
        appender.superblock.tail_position_bytes = appender.head_bytes;
        appender.superblock.tail_record_sequence = appender.next_record_sequence;
        appender.superblock.replay_after_sequence = None;
        appender.superblock.generation += 1;
        self.persist_superblock(&mut appender)?;
        self.counters.used_bytes.store(0, Ordering::Relaxed);
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// Write both superblock copies on every usable device (the copy the update sequence
    /// names first) and sync them.
    fn persist_superblock(&self, appender: &mut Appender) -> Result<()> {
        appender.superblock.update_sequence += 1;
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        let mut written = 0;
        for device in &self.devices {
            let Some(handle) = device.usable() else { continue };
            let superblock = &appender.superblock;
            let result = (|| {
                for copy in [superblock.update_sequence % 2, 1 - superblock.update_sequence % 2] {
                    LogSuperblock { copy: copy as u32, device_size_bytes: handle.size_bytes(), ..superblock.clone() }
                        .encode(&mut block);
                    handle.write_at(&block, LOG_SUPERBLOCK_OFFSETS_BYTES[copy as usize])?;
                    handle.flush()?;
                }
                Ok::<(), stripelog_blockdev::DeviceError>(())
            })();
            match result {
                Ok(()) => written += 1,
                Err(error) => device.fail(LogDeviceFailure::Device(error)),
            }
        }
        if written == 0 {
            self.active.store(false, Ordering::Release);
            return Err(Error::WriteLogUnavailable(self.failure().unwrap_or(WriteLogProblem::Devices(Vec::new()))));
        }
        Ok(())
    }

    /// Append `staging` as records (and sync the devices when `sync`). Records whose
    /// batches are durable through `durable_through` are dropped first.
    pub(crate) fn append(
        &self,
        appender: &mut Appender,
        staging: &Staging,
        durable_through: u64,
        sync: bool,
    ) -> std::result::Result<(), AppendProblem> {
        if !self.is_active() {
            return Err(AppendProblem::Failed);
        }
        while appender.records.front().is_some_and(|record| record.last_batch_sequence <= durable_through) {
            appender.records.pop_front();
        }
        let mut data_offset = 0usize;
        for chunk in staging.entries.chunks(RECORD_ENTRIES_MAXIMUM) {
            let data_blocks = chunk.iter().filter(|entry| entry.kind == LogEntryKind::Data).count();
            let length = (1 + data_blocks as u64) * BLOCK;
            if appender.head_bytes + length > appender.superblock.area_end_bytes {
                // The rest of the area is too short: a wrap record sends the chain back
                // to the start. Both places must be free before either is written (with
                // the head still here, so that a head at the tail means an empty log).
                self.make_room(appender, appender.head_bytes, BLOCK)?;
                self.make_room(appender, LOG_AREA_START_BYTES, length)?;
                let header = self.header(appender, true, Vec::new());
                self.write_record(appender, &header, &[])?;
                appender.head_bytes = LOG_AREA_START_BYTES;
            }
            self.make_room(appender, appender.head_bytes, length)?;
            let header = self.header(appender, false, chunk.to_vec());
            let data = &staging.data[data_offset..data_offset + data_blocks * BLOCK_SIZE_BYTES];
            data_offset += data.len();
            self.write_record(appender, &header, data)?;
        }
        self.counters.used_bytes.store(used_bytes(appender), Ordering::Relaxed);
        appender.unsynced = true;
        if sync {
            self.sync(appender)?;
        }
        Ok(())
    }

    /// Sync every device if records were written since the last sync: what earlier
    /// appends wrote without a sync becomes durable (a flush that finds nothing staged).
    pub(crate) fn sync(&self, appender: &mut Appender) -> std::result::Result<(), AppendProblem> {
        if !appender.unsynced {
            return Ok(());
        }
        let started = Instant::now();
        let synced = self.on_every_device(MirrorOperation::Flush);
        if synced == 0 {
            self.active.store(false, Ordering::Release);
            return Err(AppendProblem::Failed);
        }
        appender.unsynced = false;
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        self.counters.sync_nanoseconds.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Start the thread that runs a mirror's second device beside the first (threaded
    /// volumes; once).
    pub(crate) fn start_mirror_helper(&self) {
        if self.devices.len() < 2 || self.mirror_helper.get().is_some() {
            return;
        }
        // One job at a time: the appender waits for each before the next.
        let (jobs, incoming) = crate::queue::bounded::<MirrorJob>(1);
        let spawned = std::thread::Builder::new().name("stripelog-log-mirror".into()).spawn(move || {
            for MirrorJob { device, operation, reply } in incoming {
                let result = operation.run(&*device);
                // The record goes back before the answer: the appender reuses its buffer.
                drop(operation);
                drop(device);
                let _ = reply.send(result);
            }
        });
        match spawned {
            Ok(_) => {
                let _ = self.mirror_helper.set(MirrorHelper { jobs });
            }
            // Without the thread the devices are written one after the other, as inline.
            Err(error) => log::warn!("write log: no mirror thread ({error}): mirror writes in turn"),
        }
    }

    /// Run `operation` on every usable device; the number that succeeded (the others are
    /// failed). With the mirror helper, the last device's part runs there (on a copy of
    /// the operation) while this thread runs the others. Every share of a record is
    /// dropped when this returns.
    fn on_every_device(&self, operation: MirrorOperation) -> usize {
        let usable: Vec<(&LogDevice, &Arc<dyn BlockDevice>)> =
            self.devices.iter().filter_map(|device| device.usable().map(|handle| (device, handle))).collect();
        let mut local: &[(&LogDevice, &Arc<dyn BlockDevice>)] = &usable;
        let mut pending = None;
        if let (Some(helper), [rest @ .., (device, handle)]) = (self.mirror_helper.get(), usable.as_slice()) {
            if !rest.is_empty() {
                let (reply, answer) = crate::queue::bounded(1);
                let job = MirrorJob { device: (*handle).clone(), operation: operation.clone(), reply };
                if helper.jobs.send(job).is_ok() {
                    local = rest;
                    pending = Some((*device, answer));
                }
            }
        }
        let mut succeeded = 0;
        for (device, handle) in local {
            match operation.run(handle.as_ref()) {
                Ok(()) => succeeded += 1,
                Err(error) => device.fail(LogDeviceFailure::Device(error)),
            }
        }
        if let Some((device, answer)) = pending {
            match answer.recv() {
                Ok(Ok(())) => succeeded += 1,
                Ok(Err(error)) => device.fail(LogDeviceFailure::Device(error)),
                Err(_) => device.fail(LogDeviceFailure::MirrorThreadStopped),
            }
        }
        succeeded
    }

    fn header(&self, appender: &Appender, wrap: bool, entries: Vec<LogEntry>) -> RecordHeader {
        RecordHeader {
            volume_uuid: self.volume_uuid,
            log_uuid: self.log_uuid,
            generation: appender.superblock.generation,
            record_sequence: appender.next_record_sequence,
            wrap,
            entries,
        }
    }

    /// Whether `[start, start + length)` may be written: it must not reach a record
    /// reading from the persisted tail needs. The persisted tail moves up to the live one
    /// first when that makes room.
    fn make_room(&self, appender: &mut Appender, start: u64, length: u64) -> std::result::Result<(), AppendProblem> {
        if fits(appender, start, length) {
            return Ok(());
        }
        let (live_tail, live_sequence) =
            appender.records.front().map_or((appender.head_bytes, appender.next_record_sequence), |record| {
                (record.start_bytes, record.sequence)
            });
        if live_tail != appender.superblock.tail_position_bytes {
            appender.superblock.tail_position_bytes = live_tail;
            appender.superblock.tail_record_sequence = live_sequence;
            self.persist_superblock(appender).map_err(|_| AppendProblem::Failed)?;
            if fits(appender, start, length) {
                return Ok(());
            }
        }
        Err(AppendProblem::NeedSpace)
    }

    fn write_record(
        &self,
        appender: &mut Appender,
        header: &RecordHeader,
        data: &[u8],
    ) -> std::result::Result<(), AppendProblem> {
        let length = BLOCK_SIZE_BYTES + data.len();
        {
            // The mirror helper dropped its share of the last record before it answered
            // (a new buffer if it could not: it stopped).
            if Arc::get_mut(&mut appender.buffer).is_none() {
                appender.buffer = Arc::new(AlignedBuffer::zeroed(RECORD_BYTES_MAXIMUM as usize));
            }
            let buffer = Arc::get_mut(&mut appender.buffer).expect("the record buffer is not shared");
            header.encode(&mut buffer[..BLOCK_SIZE_BYTES]);
            buffer[BLOCK_SIZE_BYTES..length].copy_from_slice(data);
        }
        let written = self.on_every_device(MirrorOperation::Write {
            record: appender.buffer.clone(),
            length,
            offset_bytes: appender.head_bytes,
        });
        if written == 0 {
            self.active.store(false, Ordering::Release);
            return Err(AppendProblem::Failed);
        }
        let last_batch_sequence = header.entries.iter().map(|entry| entry.batch_sequence).max().unwrap_or(0);
        appender.records.push_back(LiveRecord {
            start_bytes: appender.head_bytes,
            sequence: header.record_sequence,
            last_batch_sequence,
        });
        appender.head_bytes += length as u64;
        if appender.head_bytes == appender.superblock.area_end_bytes {
            // A record that ends the area exactly: the next one starts the area again
            // (no wrap record needed; the scan follows the same rule).
            appender.head_bytes = LOG_AREA_START_BYTES;
        }
        appender.next_record_sequence += 1;
        self.counters.appends.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_appended.fetch_add(length as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Bytes of live records: from the oldest record the members may still need to the head.
fn used_bytes(appender: &Appender) -> u64 {
    let tail = appender.records.front().map_or(appender.head_bytes, |record| record.start_bytes);
    let (head, end) = (appender.head_bytes, appender.superblock.area_end_bytes);
    if head >= tail {
        head - tail
    } else {
        (end - tail) + (head - LOG_AREA_START_BYTES)
    }
}

/// `[start, start + length)` lies inside the area and clear of `[persisted tail, head)`
/// (taken around the end of the area), with a block to spare so that the head never
/// catches up with the tail (equal positions mean an empty log) — also when a record that
/// ends the area exactly sends the head back to the area's start.
fn fits(appender: &Appender, start: u64, length: u64) -> bool {
    let (tail, head, end) =
        (appender.superblock.tail_position_bytes, appender.head_bytes, appender.superblock.area_end_bytes);
    fits_between(tail, head, end, start, length)
}

fn fits_between(tail: u64, head: u64, end: u64, start: u64, length: u64) -> bool {
    let stop = start + length;
    if stop > end {
        return false;
    }
    // The head after this record: a record ending the area sends it to the start.
    let head_after_at_tail = stop == end && tail == LOG_AREA_START_BYTES;
    if tail == head {
        return !head_after_at_tail;
    }
    if tail < head {
        // Occupied: [tail, head). Free: [head, end) and [area start, tail).
        (start >= head && !head_after_at_tail) || stop < tail
    } else {
        // Occupied: [tail, end) and [area start, head). Free: [head, tail).
        start >= head && stop < tail
    }
}

/// The volume no longer has a write log: remove it from the member superblocks (once;
/// a second call finds nothing to do), so that its records are never asked for nor
/// replayed again. The caller has made everything the log held durable on the members,
/// or accepted its loss.
pub(crate) fn forget(members: &crate::array::members::Members) -> Result<()> {
    if members.superblock().write_log.is_none() {
        return Ok(());
    }
    members.update_superblock(|superblock| superblock.write_log = None)?;
    log::warn!("the volume no longer has a write log; add one with `stripelog log add`");
    Ok(())
}

fn log_device_error(path: &str, error: stripelog_blockdev::DeviceError) -> Error {
    Error::WriteLogUnavailable(WriteLogProblem::Device(LogDeviceProblem {
        path: path.to_string(),
        failure: Arc::new(LogDeviceFailure::Device(error)),
    }))
}

/// The newer of the valid superblock copies of `device` that name this volume's log, or
/// what is wrong with each copy.
fn read_superblock(
    device: &dyn BlockDevice,
    volume_uuid: &[u8; 16],
    log_uuid: &[u8; 16],
) -> std::result::Result<LogSuperblock, Vec<LogSuperblockCopyProblem>> {
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    let mut best: Option<LogSuperblock> = None;
    let mut problems = Vec::new();
    for (copy, &offset) in LOG_SUPERBLOCK_OFFSETS_BYTES.iter().enumerate() {
        if let Err(error) = device.read_at(&mut block, offset) {
            problems.push(LogSuperblockCopyProblem::Unreadable { copy, error });
            continue;
        }
        match LogSuperblock::decode(&block, copy as u32) {
            Ok(superblock) if superblock.volume_uuid != *volume_uuid || superblock.log_uuid != *log_uuid => {
                problems.push(LogSuperblockCopyProblem::AnotherLog { copy });
            }
            Ok(superblock) => {
                if best.as_ref().is_none_or(|current| superblock.update_sequence > current.update_sequence) {
                    best = Some(superblock);
                }
            }
            Err(problem) => problems.push(LogSuperblockCopyProblem::Invalid { copy, problem }),
        }
    }
    best.ok_or(problems)
}

/// Follow the chain of records from the persisted tail: its entries with their data, the
/// head (where the next record goes) and the next record sequence. Stops at the first
/// block that is not the next record of this generation, or whose data fails its CRC.
fn scan(device: &dyn BlockDevice, superblock: &LogSuperblock) -> std::result::Result<Chain, DeviceError> {
    let mut entries = Vec::new();
    let (mut position, mut sequence) = (superblock.tail_position_bytes, superblock.tail_record_sequence);
    let mut walked = 0u64;
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    let area = superblock.area_end_bytes - LOG_AREA_START_BYTES;
    while walked < area {
        if position == superblock.area_end_bytes {
            position = LOG_AREA_START_BYTES;
        }
        device.read_at(&mut block, position)?;
        let Some(header) =
            RecordHeader::decode(&block, &superblock.volume_uuid, &superblock.log_uuid, superblock.generation)
        else {
            break;
        };
        if header.record_sequence != sequence || position + header.length_bytes() > superblock.area_end_bytes {
            break;
        }
        if header.wrap {
            walked += superblock.area_end_bytes - position;
            position = LOG_AREA_START_BYTES;
            sequence += 1;
            continue;
        }
        let mut record = Vec::with_capacity(header.entries.len());
        let mut data_position = position + BLOCK;
        let mut whole = true;
        for entry in &header.entries {
            let data = if entry.kind == LogEntryKind::Data {
                let mut data = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                device.read_at(&mut data, data_position)?;
                data_position += BLOCK;
                if format::block_checksum(&data) != entry.checksum {
                    whole = false;
                    break;
                }
                Some(data)
            } else {
                None
            };
            record.push((*entry, data));
        }
        if !whole {
            // A torn record: it was never acknowledged, nor was anything after it.
            break;
        }
        entries.extend(record);
        walked += header.length_bytes();
        position += header.length_bytes();
        sequence += 1;
    }
    Ok((entries, position, sequence))
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: u64 = LOG_AREA_START_BYTES;
    const END: u64 = START + 100 * BLOCK;

    #[test]
    fn the_head_never_lands_on_the_tail() {
        // Empty log in the middle: anything up to the end fits.
        assert!(fits_between(START + 10 * BLOCK, START + 10 * BLOCK, END, START + 10 * BLOCK, 90 * BLOCK));
        // Tail at the area's start, head near the end: a record ending the area exactly
        // would send the head onto the tail (a full log read as empty).
        assert!(!fits_between(START, START + 90 * BLOCK, END, START + 90 * BLOCK, 10 * BLOCK));
        assert!(fits_between(START, START + 90 * BLOCK, END, START + 90 * BLOCK, 9 * BLOCK));
        assert!(fits_between(START + BLOCK, START + 90 * BLOCK, END, START + 90 * BLOCK, 10 * BLOCK));
        // After a wrap: the start of the area is free only up to a block before the tail.
        assert!(!fits_between(START, START + 90 * BLOCK, END, START, BLOCK));
        assert!(fits_between(START + 5 * BLOCK, START + 90 * BLOCK, END, START, 4 * BLOCK));
        assert!(!fits_between(START + 5 * BLOCK, START + 90 * BLOCK, END, START, 5 * BLOCK));
        // Wrapped log: free between the head and the tail, a block to spare.
        assert!(fits_between(START + 50 * BLOCK, START + 10 * BLOCK, END, START + 10 * BLOCK, 39 * BLOCK));
        assert!(!fits_between(START + 50 * BLOCK, START + 10 * BLOCK, END, START + 10 * BLOCK, 40 * BLOCK));
    }
}
