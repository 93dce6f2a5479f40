//! The threaded pipeline (`IoMode::Threaded`, a stripe writer, one worker per member,
//! the flush timer) under concurrent clients, on memory members and on files.
//!
//! - Writers on disjoint ranges, each checking its reads against its own model, then a
//!   reopen that must hold exactly every model.
//! - Readers racing writers on the same few blocks of a small volume (segments die and
//!   are reused all the time): every block read is one whole version of the right block,
//!   and versions never go backwards for one reader.
//! - The flush timer, FUA and the byte accounting of `stats()`.

mod common;

use common::{members, memory_members};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stripelog_blockdev::{BlockDevice, FileDevice, FileDeviceOptions, Prng, SimulatedArray};
use stripelog_engine::{CreateOptions, MemberDevice, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};

const CHUNK_SIZE_BYTES: u32 = 64 << 10;
const BLOCK_BYTES: u64 = BLOCK_SIZE_BYTES as u64;
const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// Members that forget what was not flushed when `SimulatedArray::crash` is called: what
/// a test reads back after a reopen was really made durable (memory members, which keep
/// every write, cannot tell).
fn crashable_members(count: usize, size_bytes: u64, seed: u64) -> (SimulatedArray, Vec<Arc<dyn BlockDevice>>) {
    let array = SimulatedArray::new(seed);
    let devices = (0..count).map(|_| array.add_device(size_bytes) as Arc<dyn BlockDevice>).collect();
    (array, devices)
}

/// A directory under the system temporary directory, removed when dropped.
struct TemporaryDirectory {
    path: PathBuf,
}

impl TemporaryDirectory {
    fn new(label: &str) -> TemporaryDirectory {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanoseconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "stripelog-concurrency-{label}-{}-{nanoseconds}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TemporaryDirectory { path }
    }
}

impl Drop for TemporaryDirectory {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `count` file members in `directory`: created sparse at `size_bytes` when given, else
/// opened as they are.
fn file_members(directory: &Path, count: usize, size_bytes: Option<u64>) -> Vec<Arc<dyn BlockDevice>> {
    (0..count)
        .map(|index| {
            let options = FileDeviceOptions { create_size_bytes: size_bytes, ..FileDeviceOptions::default() };
            let device =
                FileDevice::open(&directory.join(format!("member{index}.img")), &options).expect("open a file");
            Arc::new(device) as Arc<dyn BlockDevice>
        })
        .collect()
}

fn options(raid_level: RaidLevel, chunk_size_bytes: u32) -> CreateOptions {
    CreateOptions { raid_level, chunk_size_bytes, ..CreateOptions::default() }
}

/// The production pipeline, with a short flush interval.
fn threaded_options() -> OpenOptions {
    OpenOptions { flush_interval: Some(FLUSH_INTERVAL), ..OpenOptions::default() }
}

fn create(devices: &[Arc<dyn BlockDevice>], raid_level: RaidLevel) -> Volume {
    Volume::create(members(devices), &options(raid_level, CHUNK_SIZE_BYTES), &threaded_options()).expect("create")
}

fn open(devices: &[Arc<dyn BlockDevice>]) -> Volume {
    Volume::open(members(devices), &threaded_options()).expect("open")
}

fn member_count(raid_level: RaidLevel) -> usize {
    match raid_level {
        RaidLevel::Raid6 => 5,
        _ => 4,
    }
}

// ---------------------------------------------------------------------------------------
// Writers on disjoint ranges.
// ---------------------------------------------------------------------------------------

const WRITER_THREADS: u64 = 4;
const BLOCKS_PER_WRITER: u64 = 96;
/// Writer `t` owns blocks `t × WRITER_STRIDE_BLOCKS ..` (+ BLOCKS_PER_WRITER).
const WRITER_STRIDE_BLOCKS: u64 = 1000;
const WRITER_DURATION: Duration = Duration::from_millis(700);
const WRITER_MAXIMUM_OPERATIONS: usize = 3000;

/// One writer's view of its range: the content of every block (`None`: reads zeros).
struct RangeModel {
    first_block: u64,
    blocks: Vec<Option<Vec<u8>>>,
}

impl RangeModel {
    fn expected(&self, first: u64, count: u64) -> Vec<u8> {
        let mut bytes = Vec::with_capacity((count * BLOCK_BYTES) as usize);
        for block in first..first + count {
            match &self.blocks[(block - self.first_block) as usize] {
                Some(content) => bytes.extend_from_slice(content),
                None => bytes.resize(bytes.len() + BLOCK_SIZE_BYTES, 0),
            }
        }
        bytes
    }

    /// Apply `data` written at byte `offset` (inside the range).
    fn apply(&mut self, offset: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let position = offset + done as u64;
            let index = (position / BLOCK_BYTES - self.first_block) as usize;
            let within = (position % BLOCK_BYTES) as usize;
            let count = (BLOCK_SIZE_BYTES - within).min(data.len() - done);
            let block = self.blocks[index].get_or_insert_with(|| vec![0u8; BLOCK_SIZE_BYTES]);
            block[within..within + count].copy_from_slice(&data[done..done + count]);
            if block.iter().all(|&byte| byte == 0) {
                self.blocks[index] = None;
            }
            done += count;
        }
    }
}

fn check_range(volume: &Volume, model: &RangeModel, first: u64, count: u64, what: &str) -> Result<(), String> {
    let mut actual = vec![0u8; (count * BLOCK_BYTES) as usize];
    volume.read(first * BLOCK_BYTES, &mut actual).map_err(|error| format!("{what}: read {first}+{count}: {error}"))?;
    let expected = model.expected(first, count);
    match actual.chunks(BLOCK_SIZE_BYTES).zip(expected.chunks(BLOCK_SIZE_BYTES)).position(|(a, e)| a != e) {
        Some(index) => Err(format!("{what}: block {} differs from the model", first + index as u64)),
        None => Ok(()),
    }
}

/// Random writes (whole and sub-block, some FUA), zeroing, trims, flushes and reads in
/// the writer's own range, every write read back at once.
fn disjoint_writer(volume: &Volume, thread: u64) -> Result<RangeModel, String> {
    let mut prng = Prng::new(0xD15_0000 + thread);
    let first_block = thread * WRITER_STRIDE_BLOCKS;
    let mut model = RangeModel { first_block, blocks: vec![None; BLOCKS_PER_WRITER as usize] };
    let deadline = Instant::now() + WRITER_DURATION;
    let mut operations = 0;
    while Instant::now() < deadline && operations < WRITER_MAXIMUM_OPERATIONS {
        operations += 1;
        let choice = prng.below(100);
        let count = 1 + prng.below(4);
        let first = first_block + prng.below(BLOCKS_PER_WRITER - count + 1);
        let what = format!("thread {thread} operation {operations}");
        match choice {
            0..=54 => {
                let mut data = vec![0u8; (count * BLOCK_BYTES) as usize];
                if !prng.chance(1, 20) {
                    prng.fill(&mut data);
                }
                let fua = prng.chance(1, 20);
                volume.write(first * BLOCK_BYTES, &data, fua).map_err(|error| format!("{what}: write: {error}"))?;
                model.apply(first * BLOCK_BYTES, &data);
                check_range(volume, &model, first, count, &format!("{what}: read after write"))?;
            }
            55..=64 => {
                // At most 6 KiB from inside a block: within three blocks of the range.
                let first = first_block + prng.below(BLOCKS_PER_WRITER - 2);
                let offset = first * BLOCK_BYTES + prng.below(7) * 512;
                let mut data = vec![0u8; (1 + prng.below(12)) as usize * 512];
                prng.fill(&mut data);
                volume.write(offset, &data, false).map_err(|error| format!("{what}: sub-block write: {error}"))?;
                model.apply(offset, &data);
                check_range(volume, &model, first, 3, &format!("{what}: read after sub-block write"))?;
            }
            65..=69 => {
                let (offset, length) = (first * BLOCK_BYTES, count * BLOCK_BYTES);
                let result = if prng.chance(1, 2) {
                    volume.trim(offset, length)
                } else {
                    volume.write_zeroes(offset, length, false)
                };
                result.map_err(|error| format!("{what}: trim or write-zeroes: {error}"))?;
                model.apply(offset, &vec![0u8; length as usize]);
                check_range(volume, &model, first, count, &format!("{what}: read after trim"))?;
            }
            70..=74 => volume.flush().map_err(|error| format!("{what}: flush: {error}"))?,
            _ => check_range(volume, &model, first, count, &what)?,
        }
    }
    Ok(model)
}

/// Run the disjoint writers on `volume`; returns their models.
fn run_disjoint_writers(volume: &Volume) -> Vec<RangeModel> {
    let results: Vec<Result<RangeModel, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            (0..WRITER_THREADS).map(|thread| scope.spawn(move || disjoint_writer(volume, thread))).collect();
        handles.into_iter().map(|handle| handle.join().expect("writer thread panicked")).collect()
    });
    results.into_iter().collect::<Result<Vec<_>, String>>().unwrap_or_else(|message| panic!("{message}"))
}

fn verify_models(volume: &Volume, models: &[RangeModel]) {
    for model in models {
        // Read the range with a block on either side (never written: zeros).
        let first = model.first_block.saturating_sub(1);
        let mut actual = vec![0u8; ((BLOCKS_PER_WRITER + 2) * BLOCK_BYTES) as usize];
        volume.read(first * BLOCK_BYTES, &mut actual).expect("read a range after reopening");
        for (index, content) in actual.chunks(BLOCK_SIZE_BYTES).enumerate() {
            let block = first + index as u64;
            let expected = block
                .checked_sub(model.first_block)
                .and_then(|offset| model.blocks.get(offset as usize))
                .and_then(Option::as_ref);
            match expected {
                Some(expected) => assert!(content == expected.as_slice(), "block {block} differs after reopening"),
                None => assert!(content.iter().all(|&byte| byte == 0), "block {block} should read as zeros"),
            }
        }
    }
}

/// Writers on `devices`; then close (or, with `crash`, flush and let the process and the
/// power die: only a flush can have made the writes durable), reopen (through `reopen`)
/// and verify every model.
fn disjoint_writers_keep_their_data(
    raid_level: RaidLevel,
    devices: Vec<Arc<dyn BlockDevice>>,
    crash: Option<SimulatedArray>,
    reopen: impl FnOnce() -> Vec<Arc<dyn BlockDevice>>,
) {
    let volume = create(&devices, raid_level);
    let models = run_disjoint_writers(&volume);
    verify_models(&volume, &models);
    let stats = volume.stats();
    assert!(stats.failure.is_none(), "{:?}", stats.failure);
    assert_eq!(stats.unrecoverable_reads, 0);
    assert_eq!(stats.checksum_mismatches, 0);
    match crash {
        Some(array) => {
            volume.flush().expect("flush");
            volume.abandon();
            array.crash();
        }
        None => volume.close().expect("close"),
    }
    drop(devices);
    let devices = reopen();
    let volume = open(&devices);
    verify_models(&volume, &models);
    let report = volume.check().expect("check");
    assert!(report.is_clean(), "{report:?}");
    volume.close().expect("close");
}

const DISJOINT_MEMBER_SIZE_BYTES: u64 = 32 << 20;

fn disjoint_writers_on_memory(raid_level: RaidLevel) {
    let (array, devices) = crashable_members(member_count(raid_level), DISJOINT_MEMBER_SIZE_BYTES, 21);
    let same = devices.clone();
    disjoint_writers_keep_their_data(raid_level, devices, Some(array), move || same);
}

fn disjoint_writers_on_files(raid_level: RaidLevel) {
    let directory = TemporaryDirectory::new(raid_level.name());
    let count = member_count(raid_level);
    let devices = file_members(&directory.path, count, Some(DISJOINT_MEMBER_SIZE_BYTES));
    disjoint_writers_keep_their_data(raid_level, devices, None, || file_members(&directory.path, count, None));
}

#[test]
fn disjoint_writers_on_raid5_memory_members() {
    disjoint_writers_on_memory(RaidLevel::Raid5);
}

#[test]
fn disjoint_writers_on_raid6_memory_members() {
    disjoint_writers_on_memory(RaidLevel::Raid6);
}

#[test]
fn disjoint_writers_on_raid10_memory_members() {
    disjoint_writers_on_memory(RaidLevel::Raid10);
}

#[test]
fn disjoint_writers_on_raid5_file_members() {
    disjoint_writers_on_files(RaidLevel::Raid5);
}

#[test]
fn disjoint_writers_on_raid6_file_members() {
    disjoint_writers_on_files(RaidLevel::Raid6);
}

#[test]
fn disjoint_writers_on_raid10_file_members() {
    disjoint_writers_on_files(RaidLevel::Raid10);
}

// ---------------------------------------------------------------------------------------
// Readers racing writers on the same blocks.
// ---------------------------------------------------------------------------------------

const HOT_BLOCK_COUNT: u64 = 24;
/// Hot block `i` is logical block `i × HOT_BLOCK_SPACING`.
const HOT_BLOCK_SPACING: u64 = 37;
const RACE_WRITERS: u64 = 2;
const RACE_READERS: u64 = 3;
/// Each writer stops after this many writes (enough to pass the data space through
/// several times: 2 writers × 3000 × (4 KiB + short-stripe overhead) ≫ 6 MiB) …
const RACE_WRITES_PER_WRITER: u64 = 3000;
/// … or at this safety cap on a very slow machine.
const RACE_TIME_LIMIT: Duration = Duration::from_secs(30);

/// Version `version` (≥ 1) of logical block `block`: the block number, the version, then
/// words derived from both, so a torn or misplaced block never passes for a whole one.
fn versioned_content(block: u64, version: u64) -> Vec<u8> {
    let mut content = vec![0u8; BLOCK_SIZE_BYTES];
    content[..8].copy_from_slice(&block.to_le_bytes());
    content[8..16].copy_from_slice(&version.to_le_bytes());
    Prng::new(block.wrapping_mul(0x1_0000_0001) ^ version.rotate_left(17)).fill(&mut content[16..]);
    content
}

/// The version a read block holds (0: zeros, never written), or why it is not whole.
fn version_of(block: u64, content: &[u8]) -> Result<u64, String> {
    if content.iter().all(|&byte| byte == 0) {
        return Ok(0);
    }
    let found_block = u64::from_le_bytes(content[..8].try_into().expect("8 bytes"));
    let version = u64::from_le_bytes(content[8..16].try_into().expect("8 bytes"));
    if found_block != block {
        return Err(format!("block {block} holds content of block {found_block} (version {version})"));
    }
    if version == 0 || content != versioned_content(block, version).as_slice() {
        return Err(format!("block {block} holds a torn or corrupt version {version}"));
    }
    Ok(version)
}

fn hot_block(index: u64) -> u64 {
    index * HOT_BLOCK_SPACING
}

/// Writer `writer` owns the hot blocks with `index % RACE_WRITERS == writer` and writes
/// ever newer versions of them, flushing often. Returns the last version of every block.
fn racing_writer(volume: &Volume, writer: u64) -> Result<Vec<(u64, u64)>, String> {
    let mut prng = Prng::new(0xACE + writer);
    let owned: Vec<u64> = (0..HOT_BLOCK_COUNT).filter(|index| index % RACE_WRITERS == writer).map(hot_block).collect();
    let mut versions = vec![0u64; owned.len()];
    let deadline = Instant::now() + RACE_TIME_LIMIT;
    let mut writes = 0u64;
    while writes < RACE_WRITES_PER_WRITER && Instant::now() < deadline {
        let index = prng.below(owned.len() as u64) as usize;
        versions[index] += 1;
        let block = owned[index];
        let fua = prng.chance(1, 30);
        volume
            .write(block * BLOCK_BYTES, &versioned_content(block, versions[index]), fua)
            .map_err(|error| format!("writer {writer}: write {writes}: {error}"))?;
        writes += 1;
        if writes.is_multiple_of(16) {
            volume.flush().map_err(|error| format!("writer {writer}: flush: {error}"))?;
        }
    }
    Ok(owned.into_iter().zip(versions).collect())
}

/// Read hot blocks (alone, or in a range spanning two of them) until `stop`; every block
/// must be whole, and its version never older than one this reader saw before.
fn racing_reader(volume: &Volume, reader: u64, stop: &AtomicBool) -> Result<u64, String> {
    let mut prng = Prng::new(0xBEAD + reader);
    let mut seen = vec![0u64; HOT_BLOCK_COUNT as usize];
    let mut reads = 0u64;
    let mut buffer = vec![0u8; ((HOT_BLOCK_SPACING + 1) * BLOCK_BYTES) as usize];
    while !stop.load(Ordering::SeqCst) {
        let spanning = prng.chance(1, 8);
        let index = prng.below(if spanning { HOT_BLOCK_COUNT - 1 } else { HOT_BLOCK_COUNT });
        let length = if spanning { (HOT_BLOCK_SPACING + 1) * BLOCK_BYTES } else { BLOCK_BYTES };
        let first = hot_block(index);
        volume
            .read(first * BLOCK_BYTES, &mut buffer[..length as usize])
            .map_err(|error| format!("reader {reader}: read {reads}: {error}"))?;
        reads += 1;
        for (offset, content) in buffer[..length as usize].chunks(BLOCK_SIZE_BYTES).enumerate() {
            let block = first + offset as u64;
            if !block.is_multiple_of(HOT_BLOCK_SPACING) {
                if content.iter().any(|&byte| byte != 0) {
                    return Err(format!("reader {reader}: block {block} was never written but is not zero"));
                }
                continue;
            }
            let hot_index = (block / HOT_BLOCK_SPACING) as usize;
            let version = version_of(block, content).map_err(|message| format!("reader {reader}: {message}"))?;
            if version < seen[hot_index] {
                return Err(format!(
                    "reader {reader}: block {block} went back from version {} to {version}",
                    seen[hot_index]
                ));
            }
            seen[hot_index] = version;
        }
    }
    Ok(reads)
}

#[test]
fn readers_see_whole_versions_that_never_go_back_while_segments_are_reused() {
    // 31 segments: the hot blocks' segments die and are reused many times over.
    let devices = memory_members(4, 2 << 20);
    let volume = create(&devices, RaidLevel::Raid5);
    let stop = AtomicBool::new(false);
    let (writer_results, reader_results) = std::thread::scope(|scope| {
        let (volume, stop) = (&volume, &stop);
        let readers: Vec<_> =
            (0..RACE_READERS).map(|reader| scope.spawn(move || racing_reader(volume, reader, stop))).collect();
        let writers: Vec<_> =
            (0..RACE_WRITERS).map(|writer| scope.spawn(move || racing_writer(volume, writer))).collect();
        let writer_results: Vec<_> =
            writers.into_iter().map(|handle| handle.join().expect("writer panicked")).collect();
        stop.store(true, Ordering::SeqCst);
        let reader_results: Vec<_> =
            readers.into_iter().map(|handle| handle.join().expect("reader panicked")).collect();
        (writer_results, reader_results)
    });
    let mut last_versions = Vec::new();
    for result in writer_results {
        last_versions.extend(result.unwrap_or_else(|message| panic!("{message}")));
    }
    let reads: u64 =
        reader_results.into_iter().map(|result| result.unwrap_or_else(|message| panic!("{message}"))).sum();
    assert!(reads > 100, "the readers ran ({reads} reads)");

    volume.flush().expect("flush");
    let stats = volume.stats();
    assert!(stats.failure.is_none(), "{:?}", stats.failure);
    // More went through the data space than it holds: segments were reused.
    let data_space_written = stats.member_bytes_data + stats.member_bytes_metadata + stats.member_bytes_padding;
    assert!(
        data_space_written > 2 * stats.physical_data_bytes,
        "{data_space_written} bytes written to {} bytes of data space: too little to reuse segments",
        stats.physical_data_bytes
    );
    let check_final = |volume: &Volume| {
        for &(block, version) in &last_versions {
            let mut content = vec![0u8; BLOCK_SIZE_BYTES];
            volume.read(block * BLOCK_BYTES, &mut content).expect("read");
            assert_eq!(version_of(block, &content), Ok(version), "block {block} after the race");
        }
    };
    check_final(&volume);
    volume.close().expect("close");
    let volume = open(&devices);
    check_final(&volume);
    volume.close().expect("close");
}

// ---------------------------------------------------------------------------------------
// The flush timer, FUA and accounting.
// ---------------------------------------------------------------------------------------

fn random_data(prng: &mut Prng, length_bytes: u64) -> Vec<u8> {
    let mut data = vec![0u8; length_bytes as usize];
    prng.fill(&mut data);
    data
}

#[test]
fn the_flush_timer_makes_unflushed_writes_durable() {
    let (array, devices) = crashable_members(4, 8 << 20, 11);
    let volume = create(&devices, RaidLevel::Raid5);
    let mut prng = Prng::new(11);
    let data = random_data(&mut prng, 3 * BLOCK_BYTES);
    volume.write(5 * BLOCK_BYTES, &data, false).expect("write");
    std::thread::sleep(Duration::from_millis(300));
    let stats = volume.stats();
    assert!(stats.last_sequence >= 1, "the timer sealed the batch: {stats:?}");
    assert!(
        stats.durable_through_sequence >= stats.last_sequence,
        "durable through {} of {}",
        stats.durable_through_sequence,
        stats.last_sequence
    );
    assert!(stats.short_stripes > 0, "a few blocks make a short stripe");
    assert!(stats.flushes > 0);
    // Durable means it survives a process that dies now, and the power with it.
    volume.abandon();
    array.crash();
    let volume = open(&devices);
    let mut back = vec![0u8; data.len()];
    volume.read(5 * BLOCK_BYTES, &mut back).expect("read");
    assert!(back == data, "the timer-flushed write did not survive");
    volume.close().expect("close");
}

#[test]
fn a_fua_write_returns_durable() {
    let (array, devices) = crashable_members(4, 8 << 20, 12);
    let volume = create(&devices, RaidLevel::Raid5);
    let mut prng = Prng::new(12);
    let mut fua_writes = Vec::new();
    for round in 0..20u64 {
        // Some ordinary writes first, then one FUA write.
        for block in 0..prng.below(20) {
            volume
                .write((round * 40 + block) * BLOCK_BYTES, &random_data(&mut prng, BLOCK_BYTES), false)
                .expect("write");
        }
        let before = volume.stats().last_sequence;
        let length = (1 + prng.below(8)) * 512;
        let data = random_data(&mut prng, length);
        let offset = (round * 40 + 30) * BLOCK_BYTES;
        volume.write(offset, &data, true).expect("FUA write");
        let stats = volume.stats();
        assert!(stats.last_sequence > before, "round {round}: the FUA write sealed a batch");
        assert_eq!(
            stats.durable_through_sequence, stats.last_sequence,
            "round {round}: a FUA write returned before it was durable"
        );
        fua_writes.push((offset, data));
    }
    // The process and the power go now: every FUA write is there after the crash.
    volume.abandon();
    array.crash();
    let volume = open(&devices);
    for (offset, data) in &fua_writes {
        let mut back = vec![0u8; data.len()];
        volume.read(*offset, &mut back).expect("read");
        assert!(&back == data, "the FUA write at {offset} did not survive a crash");
    }
    volume.close().expect("close");
}

#[test]
fn member_bytes_account_for_data_parity_and_metadata() {
    let member_count = 5;
    let devices = memory_members(member_count, 8 << 20);
    let volume = create(&devices, RaidLevel::Raid5);
    let data_columns = volume.geometry().data_columns() as u64;
    assert_eq!(data_columns, 4);
    let full_stripe_bytes = data_columns * CHUNK_SIZE_BYTES as u64;
    let stripe_count = 16;
    let total_bytes = stripe_count * full_stripe_bytes;
    let mut prng = Prng::new(13);
    for stripe in 0..stripe_count {
        volume.write(stripe * full_stripe_bytes, &random_data(&mut prng, full_stripe_bytes), false).expect("write");
    }
    volume.flush().expect("flush");
    let stats = volume.stats();
    assert_eq!(stats.host_bytes_written, total_bytes);
    assert_eq!(stats.member_bytes_data, total_bytes, "every data block is stored exactly once");
    assert!(stats.member_bytes_metadata > 0, "summaries");
    // Parity is one block per row, and a row holds data, summaries or padding.
    let data_space_bytes = stats.member_bytes_data + stats.member_bytes_metadata + stats.member_bytes_padding;
    assert_eq!(stats.member_bytes_redundancy * data_columns, data_space_bytes, "{stats:?}");
    let quarter = total_bytes / data_columns;
    assert!(stats.member_bytes_redundancy >= quarter);
    assert!(
        stats.member_bytes_redundancy <= quarter + quarter / 20,
        "parity {} is more than 5 % above a quarter of the data ({quarter})",
        stats.member_bytes_redundancy
    );
    assert!(stats.full_stripes > 0, "{stats:?}");
    // Every member wrote one block per row: data space plus parity, spread evenly.
    let per_member: Vec<u64> = stats.members.iter().map(|member| member.bytes_written).collect();
    assert_eq!(stats.member_bytes_written, per_member.iter().sum::<u64>());
    assert_eq!(stats.member_bytes_written, data_space_bytes + stats.member_bytes_redundancy);
    assert!(per_member.iter().all(|&bytes| bytes == stats.member_bytes_redundancy), "{per_member:?}");
    volume.close().expect("close");
}

// ---------------------------------------------------------------------------------------
// The cleaner thread under concurrent writers.
// ---------------------------------------------------------------------------------------

/// Writers overwrite the whole logical space of a small volume several times over, so the
/// cleaner thread has to keep making free segments while they write; every block holds its
/// last write before and after a reopen, and the volume checks clean.
#[test]
fn the_cleaner_thread_keeps_up_with_writers_on_a_full_volume() {
    let (array, devices) = crashable_members(4, 8 << 20, 13);
    let create_options = CreateOptions { spare_ppm: 200_000, ..options(RaidLevel::Raid5, CHUNK_SIZE_BYTES) };
    let volume = Volume::create(members(&devices), &create_options, &threaded_options()).expect("create");
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let share = logical_blocks / WRITER_THREADS;
    let models: Vec<RangeModel> = std::thread::scope(|scope| {
        let volume = &volume;
        let handles: Vec<_> = (0..WRITER_THREADS)
            .map(|thread| {
                scope.spawn(move || {
                    let first_block = thread * share;
                    let mut model = RangeModel { first_block, blocks: vec![None; share as usize] };
                    let mut prng = Prng::new(0xC1EA_0000 + thread);
                    let mut data = vec![0u8; BLOCK_SIZE_BYTES];
                    for _ in 0..4 * share {
                        let block = first_block + prng.below(share);
                        prng.fill(&mut data);
                        volume.write(block * BLOCK_BYTES, &data, false).expect("write while cleaning");
                        model.apply(block * BLOCK_BYTES, &data);
                    }
                    model
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().expect("writer thread panicked")).collect()
    });
    let stats = volume.stats();
    assert!(stats.failure.is_none(), "{:?}", stats.failure);
    assert!(stats.cleaning_rounds > 0, "the cleaner never ran");
    // Idle, the cleaner thread makes free segments ahead of the next burst, up to the high
    // watermark.
    let (_, high_watermark) = stripelog_engine::watermarks(volume.geometry());
    let deadline = Instant::now() + Duration::from_secs(10);
    while (volume.stats().segments_free as usize) < high_watermark && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        volume.stats().segments_free as usize >= high_watermark,
        "idle: {} free segments, high watermark {high_watermark} (before: {}; {} client writes went to the cold stream)",
        volume.stats().segments_free,
        stats.segments_free,
        stats.blocks_written_cold
    );
    for model in &models {
        check_range(&volume, model, model.first_block, share, "after the writers")
            .unwrap_or_else(|error| panic!("{error}"));
    }
    // A flush, then the process and the power die: the reopened volume holds only what
    // the flush made durable, cleaned segments included.
    volume.flush().expect("flush");
    volume.abandon();
    array.crash();
    let volume = open(&devices);
    for model in &models {
        check_range(&volume, model, model.first_block, share, "after reopening")
            .unwrap_or_else(|error| panic!("{error}"));
    }
    assert!(volume.check().expect("check").is_clean());
    volume.close().expect("close");
}

/// Four writers overwriting a full volume at random, with a reasonable spare (20 %): the
/// cleaner is under pressure the whole time and clients take the segments it frees as fast
/// as it frees them. Its progress judgement must not mistake that for a stall: no write may
/// get ENOSPC.
#[test]
fn sustained_random_overwrites_by_several_writers_never_get_out_of_space() {
    let devices = memory_members(4, 32 << 20);
    let members: Vec<MemberDevice> = devices
        .iter()
        .enumerate()
        .map(|(index, device)| MemberDevice { name: format!("m{index}"), device: Some(device.clone()) })
        .collect();
    let create =
        CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: CHUNK_SIZE_BYTES, ..CreateOptions::default() };
    let open = OpenOptions { cache_size_bytes: 0, ..OpenOptions::default() };
    let volume = Arc::new(Volume::create(members, &create, &open).expect("create"));
    let blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let content = vec![0x5a; BLOCK_SIZE_BYTES];
    for block in 0..blocks {
        volume.write(block * BLOCK_BYTES, &content, false).expect("fill");
    }
    let writers: Vec<_> = (0..4u64)
        .map(|writer| {
            let volume = volume.clone();
            let content = content.clone();
            std::thread::spawn(move || {
                let mut prng = Prng::new(100 + writer);
                for _ in 0..blocks * 3 / 4 {
                    volume.write(prng.below(blocks) * BLOCK_BYTES, &content, false).expect("overwrite");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("a writer failed");
    }
    let stats = volume.stats();
    assert!(stats.failure.is_none());
    // The writers outrun the cleaner: they are paced to what it frees rather than left to
    // run into its reserve and wait there for whole rounds.
    assert!(stats.paced_writes > 0, "no write was paced ({} cleaning rounds)", stats.cleaning_rounds);
    eprintln!("{} writes paced, {:.3} s in all", stats.paced_writes, stats.paced_seconds);
    // The cleaner read the live blocks it relocated from the members (victims are long
    // out of memory), whole spans of rows: at least as many bytes as it relocated.
    assert!(stats.member_bytes_relocated > 0);
    assert!(
        stats.member_bytes_read_cleaning >= stats.member_bytes_relocated,
        "read {} bytes to relocate {}",
        stats.member_bytes_read_cleaning,
        stats.member_bytes_relocated
    );
    Arc::try_unwrap(volume).ok().expect("one owner").close().expect("close");
}

/// Each write of a slow member takes this much longer: the write pipeline falls behind
/// the clients.
const SLOW_MEMBER_WRITE: Duration = Duration::from_millis(3);

/// Where a write's time went when it stalled, by cause (`stats`, the metrics, `bench
/// saturate`'s intervals): on slow members every write buffer waits for them (buffer
/// stalls, no space stalls on a fresh volume); on a full inline volume the writers clean
/// for themselves (space stalls).
#[test]
fn stalled_writes_are_counted_by_cause() {
    let devices: Vec<Arc<dyn BlockDevice>> = memory_members(4, 32 << 20)
        .into_iter()
        .map(|device| {
            Arc::new(common::SlowWrites {
                device,
                single_write_delay: SLOW_MEMBER_WRITE,
                batch_delay: SLOW_MEMBER_WRITE,
            }) as Arc<dyn BlockDevice>
        })
        .collect();
    let create =
        CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: CHUNK_SIZE_BYTES, ..CreateOptions::default() };
    let open = OpenOptions { cache_size_bytes: 0, ..OpenOptions::default() };
    let volume = Volume::create(members(&devices), &create, &open).expect("create");
    let content = vec![0x3c; BLOCK_SIZE_BYTES];
    // A quarter of the volume: far more batches than the pipeline holds, no cleaning.
    let blocks = volume.logical_size_bytes() / BLOCK_BYTES / 4;
    for block in 0..blocks {
        volume.write(block * BLOCK_BYTES, &content, false).expect("write");
    }
    let stats = volume.stats();
    assert!(stats.writes_stalled_for_buffers > 0, "no buffer stall behind slow members: {stats:?}");
    assert!(stats.buffer_stall_seconds > 0.0, "{stats:?}");
    assert_eq!(stats.writes_stalled_for_space, 0, "a space stall on a fresh volume: {stats:?}");
    eprintln!("{} writes stalled for buffers, {:.3} s", stats.writes_stalled_for_buffers, stats.buffer_stall_seconds);
    volume.close().expect("close");

    let devices = memory_members(4, 32 << 20);
    let volume = Volume::create(members(&devices), &create, &common::inline_open_options()).expect("create");
    let blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let mut prng = Prng::new(7);
    for block in 0..blocks {
        volume.write(block * BLOCK_BYTES, &content, false).expect("fill");
    }
    for _ in 0..blocks {
        volume.write(prng.below(blocks) * BLOCK_BYTES, &content, false).expect("overwrite");
    }
    let stats = volume.stats();
    assert!(stats.cleaning_rounds > 0);
    assert!(stats.writes_stalled_for_space > 0, "no space stall on a full inline volume: {stats:?}");
    assert!(stats.space_stall_seconds > 0.0, "{stats:?}");
    eprintln!("{} writes stalled for space, {:.3} s", stats.writes_stalled_for_space, stats.space_stall_seconds);
    volume.close().expect("close");
}
