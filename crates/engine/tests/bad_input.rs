//! Bad input: members given wrongly (order, foreign, truncated, damaged, not a member,
//! missing, wrong count), invalid requests and geometries, a full volume, and bit rot.
//!
//! Every case must end in a clear error that names what is wrong (never a panic, never
//! wrong data), and nothing written and flushed before may be harmed: a failed open or
//! create writes nothing, and the correct members open afterwards with the data intact.

mod common;

use common::{members, memory_members};
use std::collections::BTreeMap;
use std::sync::Arc;
use stripelog_blockdev::{AlignedBuffer, BlockDevice, MemoryDevice, Prng, SimulatedArray, SimulatedDevice};
use stripelog_engine::error::FailureCause;
use stripelog_engine::format::Superblock;
use stripelog_engine::{
    CreateOptions, Error, IoMode, Mapping, MemberDevice, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES,
};

const MEMBER_SIZE_BYTES: u64 = 8 << 20;
const CHUNK_SIZE_BYTES: u32 = 64 << 10;
const BLOCK_BYTES: u64 = BLOCK_SIZE_BYTES as u64;
/// Member byte offsets of superblock copies 0 and 1 (docs/on-disk-format.md).
const SUPERBLOCK_COPY_OFFSETS_BYTES: [u64; 2] = [0, 32 << 10];

/// What the test wrote: logical block → content (all blocks not in it read as zeros).
type Model = BTreeMap<u64, Vec<u8>>;

fn member_name(index: usize) -> String {
    format!("member{index}")
}

/// The devices as members, with the members at `missing` positions absent.
fn members_without(devices: &[Arc<dyn BlockDevice>], missing: &[usize]) -> Vec<MemberDevice> {
    devices
        .iter()
        .enumerate()
        .map(|(index, device)| MemberDevice {
            name: member_name(index),
            device: (!missing.contains(&index)).then(|| device.clone()),
        })
        .collect()
}

fn options(raid_level: RaidLevel, chunk_size_bytes: u32) -> CreateOptions {
    CreateOptions { raid_level, chunk_size_bytes, ..CreateOptions::default() }
}

/// Deterministic: the calling thread does all member I/O, no flush timer.
fn open_options() -> OpenOptions {
    OpenOptions {
        read_only: false,
        flush_interval: None,
        io_mode: IoMode::Inline,
        cache_size_bytes: 0,
        ..OpenOptions::default()
    }
}

fn read_only_options() -> OpenOptions {
    OpenOptions { read_only: true, ..open_options() }
}

fn create(devices: &[Arc<dyn BlockDevice>], raid_level: RaidLevel) -> Volume {
    Volume::create(members(devices), &options(raid_level, CHUNK_SIZE_BYTES), &open_options()).expect("create")
}

fn open(devices: &[Arc<dyn BlockDevice>]) -> Volume {
    Volume::open(members(devices), &open_options()).expect("open the correct members")
}

fn random_block(prng: &mut Prng) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK_SIZE_BYTES];
    prng.fill(&mut block);
    block
}

/// Write `run_count` runs of 1 to 8 random blocks at random places below `block_limit`,
/// then flush. Returns what was written.
fn write_random_runs(volume: &Volume, seed: u64, run_count: usize, block_limit: u64) -> Model {
    let mut prng = Prng::new(seed);
    let mut model = Model::new();
    for _ in 0..run_count {
        let length = 1 + prng.below(8);
        let first = prng.below(block_limit - length);
        let mut data = Vec::with_capacity((length * BLOCK_BYTES) as usize);
        for block in first..first + length {
            let content = random_block(&mut prng);
            data.extend_from_slice(&content);
            model.insert(block, content);
        }
        volume.write(first * BLOCK_BYTES, &data, false).expect("write");
    }
    volume.flush().expect("flush");
    model
}

/// A volume on `member_count` memory members holding random data, flushed and closed.
fn volume_with_data(raid_level: RaidLevel, member_count: usize) -> (Vec<Arc<dyn BlockDevice>>, Model) {
    let devices = memory_members(member_count, MEMBER_SIZE_BYTES);
    let volume = create(&devices, raid_level);
    // Enough runs to span several segments, so parity rotation is covered.
    let model = write_random_runs(&volume, 1, 60, 1500);
    volume.close().expect("close");
    (devices, model)
}

/// Every block up to just past the last written one reads as the model says.
fn assert_contents(volume: &Volume, model: &Model) {
    let block_count = volume.logical_size_bytes() / BLOCK_BYTES;
    let end = model.keys().next_back().map_or(0, |last| last + 2).min(block_count);
    let blocks_per_read = 64u64;
    let mut buffer = vec![0u8; (blocks_per_read * BLOCK_BYTES) as usize];
    let mut first = 0;
    while first < end {
        let count = blocks_per_read.min(end - first);
        let buffer = &mut buffer[..(count * BLOCK_BYTES) as usize];
        volume
            .read(first * BLOCK_BYTES, buffer)
            .unwrap_or_else(|error| panic!("read of blocks {first}+{count}: {error}"));
        for (index, actual) in buffer.chunks(BLOCK_SIZE_BYTES).enumerate() {
            let block = first + index as u64;
            match model.get(&block) {
                Some(expected) => assert!(expected.as_slice() == actual, "block {block} has the wrong content"),
                None => {
                    assert!(actual.iter().all(|&byte| byte == 0), "block {block} was never written but is not zero")
                }
            }
        }
        first += count;
    }
}

/// The correct members open (read-write) and hold exactly the model.
fn assert_reopens_intact(devices: &[Arc<dyn BlockDevice>], model: &Model) {
    let volume = open(devices);
    assert!(!volume.stats().degraded, "all members are present");
    assert_contents(&volume, model);
    volume.close().expect("close");
}

/// The whole content of every device, to prove a failed call wrote nothing.
fn snapshot(devices: &[Arc<dyn BlockDevice>]) -> Vec<Vec<u8>> {
    devices
        .iter()
        .map(|device| {
            let mut buffer = AlignedBuffer::zeroed(device.size_bytes() as usize);
            device.read_at(&mut buffer, 0).expect("read the whole device");
            buffer.to_vec()
        })
        .collect()
}

fn assert_unchanged(devices: &[Arc<dyn BlockDevice>], before: &[Vec<u8>]) {
    for (index, content) in snapshot(devices).iter().enumerate() {
        assert!(content == &before[index], "device {index} was modified by a call that failed");
    }
}

/// The error of a call that must fail; a volume that opened anyway is a test failure.
fn expect_error(result: stripelog_engine::Result<Volume>, what: &str) -> Error {
    match result {
        Ok(volume) => {
            volume.abandon();
            panic!("{what}: expected an error, but the volume opened");
        }
        Err(error) => error,
    }
}

/// `error` is `Error::Member` for member `member` (by index and name), and its message
/// contains every one of `needles`.
fn assert_member_error(error: &Error, member: usize, needles: &[&str]) {
    let message = error.to_string();
    match error {
        Error::Member { member: index, path, .. } => {
            assert_eq!(*index, member, "wrong member blamed: {message}");
            assert_eq!(path, &member_name(member), "wrong member name: {message}");
        }
        other => panic!("expected Error::Member for member {member}, got {other:?}"),
    }
    assert!(message.contains(&member_name(member)), "the message does not name the member: {message}");
    for needle in needles {
        assert!(message.contains(needle), "the message does not mention {needle:?}: {message}");
    }
}

fn read_superblock_copy(device: &dyn BlockDevice, copy: usize) -> AlignedBuffer {
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    device.read_at(&mut block, SUPERBLOCK_COPY_OFFSETS_BYTES[copy]).expect("read a superblock copy");
    block
}

/// Overwrite bytes 100..108 and 3000..3004 of a superblock copy with garbage.
fn damage_superblock_copy(device: &dyn BlockDevice, copy: usize) {
    let mut block = read_superblock_copy(device, copy);
    for index in (100..108).chain(3000..3004) {
        block[index] ^= 0xA5;
    }
    device.write_at(&block, SUPERBLOCK_COPY_OFFSETS_BYTES[copy]).expect("write the damaged copy");
}

// ---------------------------------------------------------------------------------------
// Members given wrongly.
// ---------------------------------------------------------------------------------------

#[test]
fn members_in_the_wrong_order_are_refused_and_the_right_order_opens() {
    let (mut devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let before = snapshot(&devices);
    devices.swap(1, 2);
    let error = expect_error(Volume::open(members(&devices), &open_options()), "swapped members");
    assert_member_error(&error, 1, &["is member 2", "order"]);
    devices.swap(1, 2);
    assert_unchanged(&devices, &before);
    assert_reopens_intact(&devices, &model);
}

#[test]
fn the_same_member_given_twice_is_refused() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let before = snapshot(&devices);
    let mut wrong = devices.clone();
    wrong[3] = devices[0].clone();
    let error = expect_error(Volume::open(members(&wrong), &open_options()), "a member given twice");
    assert_member_error(&error, 3, &["is member 0", "order"]);
    assert_unchanged(&devices, &before);
    assert_reopens_intact(&devices, &model);
}

#[test]
fn a_member_of_another_volume_is_refused() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let other_devices = memory_members(4, MEMBER_SIZE_BYTES);
    create(&other_devices, RaidLevel::Raid5).close().expect("close the other volume");
    let before = snapshot(&devices);
    let mut mixed = devices.clone();
    mixed[2] = other_devices[2].clone();
    let error = expect_error(Volume::open(members(&mixed), &open_options()), "a foreign member");
    assert_member_error(&error, 2, &["another volume"]);
    assert_unchanged(&devices, &before);
    assert_reopens_intact(&devices, &model);
}

#[test]
fn a_truncated_member_is_refused() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let before = snapshot(&devices);
    // Same superblocks as member 3, on a device half the size; and one holding only copy 0.
    let half: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES / 2));
    let tiny: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(16 << 10));
    for (copy, offset) in SUPERBLOCK_COPY_OFFSETS_BYTES.into_iter().enumerate() {
        let block = read_superblock_copy(devices[3].as_ref(), copy);
        half.write_at(&block, offset).expect("copy a superblock");
        if offset + BLOCK_BYTES <= tiny.size_bytes() {
            tiny.write_at(&block, offset).expect("copy superblock 0");
        }
    }
    for short in [half, tiny] {
        let mut wrong = devices.clone();
        wrong[3] = short.clone();
        let error = expect_error(Volume::open(members(&wrong), &open_options()), "a truncated member");
        let size = short.size_bytes().to_string();
        assert_member_error(&error, 3, &["truncated", &size, &MEMBER_SIZE_BYTES.to_string()]);
    }
    assert_unchanged(&devices, &before);
    assert_reopens_intact(&devices, &model);
}

#[test]
fn one_damaged_superblock_copy_is_tolerated_and_two_are_refused() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    damage_superblock_copy(devices[1].as_ref(), 0);
    // Copy 1 still describes the member: it opens (read-only first, then read-write).
    let volume = Volume::open(members(&devices), &read_only_options()).expect("open with copy 0 damaged");
    assert_contents(&volume, &model);
    volume.close().expect("close");
    assert_reopens_intact(&devices, &model);

    damage_superblock_copy(devices[2].as_ref(), 0);
    damage_superblock_copy(devices[2].as_ref(), 1);
    let before = snapshot(&devices);
    let error = expect_error(Volume::open(members(&devices), &open_options()), "both copies damaged");
    assert_member_error(&error, 2, &["superblock", "copy 0", "copy 1", "damaged"]);
    assert_unchanged(&devices, &before);
    // Without the damaged member the volume still opens, degraded, with the data intact.
    let volume = Volume::open(members_without(&devices, &[2]), &read_only_options()).expect("open without member 2");
    assert!(volume.stats().degraded);
    assert_contents(&volume, &model);
    volume.close().expect("close");
}

#[test]
fn a_device_that_is_not_a_member_is_refused() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let before = snapshot(&devices);
    let mut wrong = devices.clone();
    wrong[0] = Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES));
    let error = expect_error(Volume::open(members(&wrong), &open_options()), "a fresh device");
    assert_member_error(&error, 0, &["superblock", "not a stripelog superblock"]);
    assert_unchanged(&devices, &before);
    assert_reopens_intact(&devices, &model);
}

/// A device holding valid superblocks with this volume's UUID and `member_index`, but
/// describing 4 MiB members instead of 8 MiB ones.
fn member_with_another_geometry(devices: &[Arc<dyn BlockDevice>], member_index: usize) -> Arc<dyn BlockDevice> {
    let mut block = read_superblock_copy(devices[member_index].as_ref(), 0);
    let original = Superblock::decode(&block, 0).expect("a valid superblock");
    let small = stripelog_engine::Geometry::new(RaidLevel::Raid5, 4, CHUNK_SIZE_BYTES, original.spare_ppm, 4 << 20)
        .expect("a valid geometry");
    let impostor: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES));
    for copy in 0..2u32 {
        let superblock = Superblock {
            copy,
            member_size_bytes: small.member_size_bytes,
            segment_count: small.segment_count(),
            logical_size_bytes: small.logical_size_bytes(),
            ..original.clone()
        };
        superblock.encode(&mut block);
        impostor.write_at(&block, SUPERBLOCK_COPY_OFFSETS_BYTES[copy as usize]).expect("write");
    }
    impostor
}

#[test]
fn a_superblock_describing_another_geometry_is_refused() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let before = snapshot(&devices);
    for position in [0, 3] {
        let mut wrong = devices.clone();
        wrong[position] = member_with_another_geometry(&devices, position);
        let error = expect_error(Volume::open(members(&wrong), &open_options()), "another geometry");
        let message = error.to_string();
        assert!(matches!(error, Error::Member { .. }), "expected Error::Member, got {error:?}");
        assert!(message.contains("different geometry"), "unclear message: {message}");
    }
    assert_unchanged(&devices, &before);
    assert_reopens_intact(&devices, &model);
}

#[test]
fn a_superblock_describing_another_geometry_blames_that_member() {
    let (devices, _model) = volume_with_data(RaidLevel::Raid5, 4);
    for position in [0, 3] {
        let mut wrong = devices.clone();
        wrong[position] = member_with_another_geometry(&devices, position);
        let error = expect_error(Volume::open(members(&wrong), &open_options()), "another geometry");
        assert_member_error(&error, position, &["different geometry"]);
    }
}

#[test]
fn a_wrong_member_count_is_refused() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let before = snapshot(&devices);
    let error = expect_error(Volume::open(members(&devices[..3]), &open_options()), "3 of 4 members");
    assert!(matches!(error, Error::InvalidRequest(_)), "expected InvalidRequest, got {error:?}");
    let message = error.to_string();
    assert!(message.contains("has 4 members but 3 were given"), "unclear message: {message}");

    // Five members: member 3 given a second time as a fifth.
    let mut five = devices.clone();
    five.push(devices[3].clone());
    let error = expect_error(Volume::open(members(&five), &open_options()), "5 of 4 members");
    assert!(matches!(error, Error::InvalidRequest(_)), "expected InvalidRequest, got {error:?}");
    assert!(error.to_string().contains("has 4 members but 5 were given"), "unclear message: {error}");

    let error = expect_error(Volume::open(Vec::new(), &open_options()), "no members");
    assert!(matches!(error, Error::TooManyFailures { .. }), "expected TooManyFailures, got {error:?}");
    assert_unchanged(&devices, &before);
    assert_reopens_intact(&devices, &model);
}

// ---------------------------------------------------------------------------------------
// Missing members.
// ---------------------------------------------------------------------------------------

#[test]
fn raid5_with_one_member_missing_opens_degraded_and_reconstructs() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    // Read-only: nothing is recorded, the member is not marked failed.
    let volume = Volume::open(members_without(&devices, &[1]), &read_only_options()).expect("degraded open");
    let stats = volume.stats();
    assert!(stats.degraded);
    assert_eq!(stats.missing_members, vec![1]);
    assert_eq!(stats.failures_still_tolerated, 0);
    assert!(!stats.members[1].present);
    assert_contents(&volume, &model);
    assert!(volume.stats().reconstructed_blocks > 0, "member 1 held data that had to be rebuilt");
    volume.close().expect("close");
    // A read-only degraded open leaves member 1 a full member.
    assert_reopens_intact(&devices, &model);
}

#[test]
fn too_many_missing_members_are_refused() {
    let cases: &[(RaidLevel, usize, &[usize])] =
        &[(RaidLevel::Raid5, 4, &[1, 2]), (RaidLevel::Raid0, 3, &[0]), (RaidLevel::Raid6, 5, &[0, 2, 4])];
    for &(raid_level, member_count, missing) in cases {
        let (devices, model) = volume_with_data(raid_level, member_count);
        let before = snapshot(&devices);
        let error = expect_error(Volume::open(members_without(&devices, missing), &open_options()), "too many missing");
        let message = error.to_string();
        match &error {
            Error::TooManyFailures { level, cause: FailureCause::Missing { names, .. } } => {
                assert_eq!(*level, raid_level.name());
                let expected: Vec<String> = missing.iter().map(|&member| member_name(member)).collect();
                assert_eq!(names, &expected, "{message}");
            }
            other => panic!("{raid_level} missing {missing:?}: expected TooManyFailures, got {other:?}"),
        }
        for &member in missing {
            assert!(message.contains(&member_name(member)), "the message does not name {member}: {message}");
        }
        assert_unchanged(&devices, &before);
        assert_reopens_intact(&devices, &model);
    }
}

#[test]
fn raid6_with_two_members_missing_opens_and_reads_correctly() {
    let (devices, model) = volume_with_data(RaidLevel::Raid6, 5);
    let volume = Volume::open(members_without(&devices, &[1, 3]), &read_only_options()).expect("open without 2");
    let stats = volume.stats();
    assert!(stats.degraded);
    assert_eq!(stats.missing_members, vec![1, 3]);
    assert_eq!(stats.failures_still_tolerated, 0);
    assert_contents(&volume, &model);
    assert!(volume.stats().reconstructed_blocks > 0);
    volume.close().expect("close");
    assert_reopens_intact(&devices, &model);
}

/// A read-write open without member 2, new writes, then member 2 comes back: it holds
/// stale chunks, so it is kept out, and every block (old and new) still reads right.
fn reopen_with_a_previously_missing_member() -> (Volume, Model) {
    let (devices, mut model) = volume_with_data(RaidLevel::Raid5, 4);
    let volume = Volume::open(members_without(&devices, &[2]), &open_options()).expect("degraded read-write open");
    assert!(volume.stats().degraded);
    assert_contents(&volume, &model);
    // New data while degraded: member 2 misses it.
    let newer = write_random_runs(&volume, 2, 30, 1500);
    model.extend(newer);
    assert_contents(&volume, &model);
    volume.close().expect("close");

    let volume = open(&devices);
    (volume, model)
}

#[test]
fn a_member_missing_at_a_read_write_open_is_kept_out_afterwards() {
    let (volume, model) = reopen_with_a_previously_missing_member();
    let stats = volume.stats();
    assert!(stats.degraded, "the stale member must not rejoin");
    assert_eq!(stats.missing_members, vec![2]);
    assert!(!stats.members[2].present);
    assert!(stats.members[0].present && stats.members[1].present && stats.members[3].present);
    assert_contents(&volume, &model);
    assert!(volume.stats().reconstructed_blocks > 0);
    // And it stays out on the next open too.
    volume.close().expect("close");
}

#[test]
fn a_kept_out_member_is_described_as_excluded() {
    let (volume, _model) = reopen_with_a_previously_missing_member();
    let description = volume.stats().members[2].description.clone();
    volume.close().expect("close");
    assert!(description.contains("excluded"), "member 2 is present but kept out; its description: {description:?}");
}

// ---------------------------------------------------------------------------------------
// Invalid requests.
// ---------------------------------------------------------------------------------------

fn assert_invalid_request(result: stripelog_engine::Result<()>, what: &str, needle: &str) {
    match result {
        Err(error @ Error::InvalidRequest(_)) => {
            assert_eq!(error.errno(), 22);
            let message = error.to_string();
            assert!(message.contains(needle), "{what}: the message does not mention {needle:?}: {message}");
        }
        Err(other) => panic!("{what}: expected InvalidRequest, got {other:?}"),
        Ok(()) => panic!("{what}: expected InvalidRequest, but it succeeded"),
    }
}

#[test]
fn misaligned_and_out_of_range_requests_are_refused() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let volume = open(&devices);
    let size = volume.logical_size_bytes();
    let mut buffer = vec![0u8; 8192];
    let data = vec![0x5Au8; 8192];

    // Not multiples of 512.
    for (offset, length) in [(100u64, 4096usize), (0, 100), (4096 + 511, 512), (512, 513)] {
        let what = format!("{offset}+{length}");
        assert_invalid_request(volume.read(offset, &mut buffer[..length]), &format!("read {what}"), "multiples of 512");
        assert_invalid_request(volume.write(offset, &data[..length], false), &format!("write {what}"), "multiples");
        assert_invalid_request(volume.trim(offset, length as u64), &format!("trim {what}"), "multiples of 512");
        assert_invalid_request(volume.write_zeroes(offset, length as u64, true), &format!("zero {what}"), "multiples");
    }

    // Beyond the end, including offsets where offset + length overflows.
    let beyond =
        [(size - 4096, 8192usize), (size, 512), (size + 4096, 4096), (u64::MAX - 511, 1024), (u64::MAX - 511, 512)];
    for (offset, length) in beyond {
        let what = format!("{offset}+{length}");
        assert_invalid_request(volume.read(offset, &mut buffer[..length]), &format!("read {what}"), "beyond the end");
        assert_invalid_request(volume.write(offset, &data[..length], true), &format!("write {what}"), "beyond the end");
        assert_invalid_request(volume.trim(offset, length as u64), &format!("trim {what}"), "beyond the end");
        assert_invalid_request(volume.write_zeroes(offset, length as u64, false), &format!("zero {what}"), "beyond");
    }
    assert_invalid_request(volume.trim(0, u64::MAX - 511), "trim of almost everything", "beyond the end");
    assert_invalid_request(volume.write_zeroes(512, u64::MAX - 511, false), "zero overflowing", "beyond the end");
    let block_count = size / BLOCK_BYTES;
    for block in [block_count, block_count + 1, u64::MAX] {
        assert!(matches!(volume.mapping(block), Err(Error::InvalidRequest(_))), "mapping of block {block}");
    }

    // Zero-length requests are fine, anywhere up to the end.
    for offset in [0, 512, 4096, size - 512, size] {
        volume.read(offset, &mut []).expect("zero-length read");
        volume.write(offset, &[], false).expect("zero-length write");
        volume.write(offset, &[], true).expect("zero-length FUA write");
        volume.trim(offset, 0).expect("zero-length trim");
        volume.write_zeroes(offset, 0, false).expect("zero-length write-zeroes");
    }
    // The last sector and the last block are addressable.
    volume.write(size - 512, &data[..512], false).expect("write the last sector");
    let mut last = vec![0u8; 512];
    volume.read(size - 512, &mut last).expect("read the last sector");
    assert_eq!(last, data[..512]);
    volume.trim(size - 512, 512).expect("trim the last sector");

    assert_contents(&volume, &model);
    volume.close().expect("close");
    assert_reopens_intact(&devices, &model);
}

#[test]
fn writes_to_a_read_only_volume_are_refused() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let epoch = {
        let volume = open(&devices);
        let epoch = volume.stats().epoch;
        volume.close().expect("close");
        epoch
    };
    let before = snapshot(&devices);
    let volume = Volume::open(members(&devices), &read_only_options()).expect("read-only open");
    let stats = volume.stats();
    assert!(stats.read_only);
    assert_eq!(stats.epoch, epoch, "a read-only open starts no epoch");
    let data = vec![1u8; 4096];
    for (what, result) in [
        ("write", volume.write(0, &data, false)),
        ("FUA write", volume.write(4096, &data, true)),
        ("trim", volume.trim(0, 4096)),
        ("write-zeroes", volume.write_zeroes(0, 4096, false)),
        ("sub-block write", volume.write(512, &data[..512], false)),
    ] {
        match result {
            Err(error @ Error::ReadOnly) => assert!(error.to_string().contains("read-only")),
            Err(other) => panic!("{what}: expected ReadOnly, got {other:?}"),
            Ok(()) => panic!("{what} on a read-only volume succeeded"),
        }
    }
    volume.flush().expect("flushing a read-only volume is a no-op");
    assert_contents(&volume, &model);
    volume.check().expect("check a read-only volume");
    volume.close().expect("close");
    assert_unchanged(&devices, &before);
    assert_reopens_intact(&devices, &model);
}

// ---------------------------------------------------------------------------------------
// Invalid geometries.
// ---------------------------------------------------------------------------------------

#[test]
fn invalid_geometries_are_refused_without_touching_the_members() {
    let (devices, model) = volume_with_data(RaidLevel::Raid5, 4);
    let before = snapshot(&devices);
    let cases: &[(RaidLevel, usize, u32, u32, &str)] = &[
        (RaidLevel::Raid5, 2, CHUNK_SIZE_BYTES, 200_000, "raid5 needs 3"),
        (RaidLevel::Raid6, 3, CHUNK_SIZE_BYTES, 200_000, "raid6 needs 4"),
        (RaidLevel::Raid10, 3, CHUNK_SIZE_BYTES, 200_000, "even number"),
        (RaidLevel::Raid5, 4, 96 << 10, 200_000, "power of two"),
        (RaidLevel::Raid5, 4, 32 << 10, 200_000, "power of two"),
        (RaidLevel::Raid5, 4, 32 << 20, 200_000, "power of two"),
        (RaidLevel::Raid5, 4, 0, 200_000, "power of two"),
        (RaidLevel::Raid5, 4, CHUNK_SIZE_BYTES, 1_000_000, "below 100 %"),
        (RaidLevel::Raid5, 4, CHUNK_SIZE_BYTES, u32::MAX, "below 100 %"),
        // 8 MiB members hold fewer than 2 segments of 4 MiB chunks.
        (RaidLevel::Raid5, 4, 4 << 20, 200_000, "fewer than 2 segments"),
    ];
    for &(raid_level, member_count, chunk_size_bytes, spare_ppm, needle) in cases {
        let create_options = CreateOptions { raid_level, chunk_size_bytes, spare_ppm, ..CreateOptions::default() };
        let result = Volume::create(members(&devices[..member_count]), &create_options, &open_options());
        let error = expect_error(result, &format!("{create_options:?}"));
        assert!(matches!(error, Error::InvalidGeometry(_)), "{create_options:?}: got {error:?}");
        assert!(error.to_string().contains(needle), "{create_options:?}: unclear message: {error}");
    }
    let error =
        expect_error(Volume::create(Vec::new(), &options(RaidLevel::Raid0, CHUNK_SIZE_BYTES), &open_options()), "none");
    assert!(matches!(error, Error::InvalidGeometry(_)), "no members: got {error:?}");
    // A missing member cannot take part in a new volume.
    let error = expect_error(
        Volume::create(members_without(&devices, &[3]), &options(RaidLevel::Raid5, CHUNK_SIZE_BYTES), &open_options()),
        "create with a missing member",
    );
    assert_member_error(&error, 3, &["missing"]);
    assert_unchanged(&devices, &before);
    assert_reopens_intact(&devices, &model);
}

// ---------------------------------------------------------------------------------------
// A full volume.
// ---------------------------------------------------------------------------------------

#[test]
fn a_full_volume_reports_out_of_space_and_keeps_its_data() {
    let devices = memory_members(3, 2 << 20);
    let create_options = CreateOptions { spare_ppm: 0, ..options(RaidLevel::Raid5, CHUNK_SIZE_BYTES) };
    let volume = Volume::create(members(&devices), &create_options, &open_options()).expect("create with no spare");
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    assert_eq!(logical_blocks, volume.geometry().data_capacity_blocks(), "no spare");
    let mut prng = Prng::new(3);
    // Every block once, in random order, then random overwrites, until the volume is full.
    let mut order: Vec<u64> = (0..logical_blocks).collect();
    for index in (1..order.len()).rev() {
        order.swap(index, prng.below(index as u64 + 1) as usize);
    }
    let mut model = Model::new();
    let mut full = false;
    for step in 0..logical_blocks * 4 {
        let block = order.get(step as usize).copied().unwrap_or_else(|| prng.below(logical_blocks));
        let content = random_block(&mut prng);
        match volume.write(block * BLOCK_BYTES, &content, false) {
            Ok(()) => {
                model.insert(block, content);
            }
            Err(Error::OutOfSpace) => {
                full = true;
                break;
            }
            Err(other) => panic!("write {step}: expected success or OutOfSpace, got {other:?}"),
        }
        if step % 100 == 99 {
            volume.flush().expect("flush");
        }
    }
    assert!(full, "writing {} blocks never filled a volume of {logical_blocks} blocks", logical_blocks * 4);
    assert!(Error::OutOfSpace.errno() == 28);
    // Still full, still readable, nothing accepted was lost.
    assert!(matches!(volume.write(0, &random_block(&mut prng), false), Err(Error::OutOfSpace)));
    volume.flush().expect("flush after out of space");
    let stats = volume.stats();
    assert!(stats.failure.is_none(), "out of space is not a failure: {:?}", stats.failure);
    assert_contents(&volume, &model);
    let report = volume.check().expect("check");
    assert!(report.is_clean(), "{report:?}");
    volume.close().expect("close");
    let volume = open(&devices);
    assert_contents(&volume, &model);
    volume.close().expect("close");
}

/// A spare of a few segments (RAID-6 on four 64 MiB members, 1 MiB chunks, 10 %: about 6
/// spare segments against the cleaner's reserve and open streams) cannot make room: each
/// round's relocations take back what its victims give. Writers on a threaded volume waited
/// for ever while the cleaner ran round after round; now they get ENOSPC, and every write
/// accepted before stays readable.
#[test]
fn a_spare_too_small_for_the_cleaner_reports_out_of_space_instead_of_waiting_for_ever() {
    let devices = memory_members(4, 64 << 20);
    let create_options = CreateOptions { spare_ppm: 100_000, ..options(RaidLevel::Raid6, 1 << 20) };
    let threaded = OpenOptions { cache_size_bytes: 0, ..OpenOptions::default() };
    let volume = Arc::new(Volume::create(members(&devices), &create_options, &threaded).expect("create"));
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let (done, finished) = std::sync::mpsc::channel();
    let writer = {
        let volume = volume.clone();
        std::thread::spawn(move || {
            let mut prng = Prng::new(5);
            let mut model = Model::new();
            let mut outcome = Ok(());
            for step in 0..logical_blocks * 3 {
                let block = if step < logical_blocks { step } else { prng.below(logical_blocks) };
                let content = random_block(&mut prng);
                match volume.write(block * BLOCK_BYTES, &content, false) {
                    Ok(()) => {
                        model.insert(block, content);
                    }
                    Err(error) => {
                        outcome = Err(error);
                        break;
                    }
                }
            }
            let _ = done.send(());
            (outcome, model)
        })
    };
    finished.recv_timeout(std::time::Duration::from_secs(120)).expect("the writer is still waiting after 120 s");
    let (outcome, model) = writer.join().expect("writer");
    assert!(matches!(outcome, Err(Error::OutOfSpace)), "expected ENOSPC, got {outcome:?}");
    assert!(volume.stats().failure.is_none());
    volume.flush().expect("flush");
    assert_contents(&volume, &model);
    Arc::try_unwrap(volume).ok().expect("one owner").close().expect("close");
}

// ---------------------------------------------------------------------------------------
// Zeros, trims and sub-block writes.
// ---------------------------------------------------------------------------------------

fn read_block(volume: &Volume, block: u64) -> Vec<u8> {
    let mut content = vec![0u8; BLOCK_SIZE_BYTES];
    volume.read(block * BLOCK_BYTES, &mut content).expect("read");
    content
}

#[test]
fn zero_writes_and_trims_are_recorded_not_stored() {
    let devices = memory_members(4, MEMBER_SIZE_BYTES);
    let volume = create(&devices, RaidLevel::Raid5);
    let mut prng = Prng::new(4);
    let zeros = vec![0u8; BLOCK_SIZE_BYTES];
    for block in 10..14 {
        volume.write(block * BLOCK_BYTES, &random_block(&mut prng), false).expect("write");
    }
    volume.flush().expect("flush");
    // An all-zero client buffer over data, write-zeroes over data, a trim over data.
    volume.write(10 * BLOCK_BYTES, &zeros, false).expect("write zeros");
    volume.write_zeroes(11 * BLOCK_BYTES, BLOCK_BYTES, false).expect("write-zeroes");
    volume.trim(12 * BLOCK_BYTES, BLOCK_BYTES).expect("trim");
    // An all-zero buffer over a block never written.
    volume.write(20 * BLOCK_BYTES, &zeros, false).expect("write zeros to an unwritten block");
    let check = |volume: &Volume| {
        assert!(matches!(volume.mapping(10).unwrap(), Mapping::Zero { .. }), "{:?}", volume.mapping(10));
        assert!(matches!(volume.mapping(11).unwrap(), Mapping::Zero { .. }), "{:?}", volume.mapping(11));
        assert!(matches!(volume.mapping(12).unwrap(), Mapping::Trimmed { .. }), "{:?}", volume.mapping(12));
        assert!(matches!(volume.mapping(13).unwrap(), Mapping::Data { .. }), "{:?}", volume.mapping(13));
        assert_eq!(volume.mapping(15).unwrap(), Mapping::Unmapped);
        assert!(
            matches!(volume.mapping(20).unwrap(), Mapping::Unmapped | Mapping::Zero { .. }),
            "{:?}",
            volume.mapping(20)
        );
        for block in [10, 11, 12, 15, 20] {
            assert_eq!(read_block(volume, block), zeros, "block {block} must read as zeros");
        }
    };
    check(&volume);
    let stats = volume.stats();
    assert_eq!(stats.blocks_zero, 2);
    volume.flush().expect("flush");
    let data_written = volume.stats().member_bytes_data;
    assert_eq!(data_written, 4 * BLOCK_BYTES, "zero writes and trims store no data blocks");
    volume.close().expect("close");
    let volume = open(&devices);
    check(&volume);
    volume.close().expect("close");
}

#[test]
fn sub_block_writes_merge_across_flushes_and_reopens() {
    let devices = memory_members(4, MEMBER_SIZE_BYTES);
    let mut volume = create(&devices, RaidLevel::Raid5);
    let mut prng = Prng::new(5);
    let sectors_per_block = BLOCK_SIZE_BYTES / 512;
    // Blocks 7 and 8, modelled as one byte vector.
    let first_block = 7u64;
    let mut model = vec![0u8; 2 * BLOCK_SIZE_BYTES];
    let mut order: Vec<usize> = (0..2 * sectors_per_block).collect();
    for index in (1..order.len()).rev() {
        order.swap(index, prng.below(index as u64 + 1) as usize);
    }
    let base = first_block * BLOCK_BYTES;
    let assert_matches = |volume: &Volume, model: &[u8], step: usize| {
        let mut actual = vec![0u8; model.len()];
        volume.read(base, &mut actual).expect("read");
        assert!(actual == model, "after step {step} the blocks differ from the model");
        // Sector-sized reads agree as well.
        for sector in 0..model.len() / 512 {
            let mut piece = [0u8; 512];
            volume.read(base + sector as u64 * 512, &mut piece).expect("read a sector");
            assert!(piece[..] == model[sector * 512..(sector + 1) * 512], "sector {sector} after step {step}");
        }
    };
    for (step, &sector) in order.iter().enumerate() {
        let mut data = [0u8; 512];
        // Every fifth sector written as zeros: a patch that keeps the block's other bytes.
        if step % 5 != 0 {
            prng.fill(&mut data);
        }
        volume.write(base + sector as u64 * 512, &data, false).expect("sub-block write");
        model[sector * 512..(sector + 1) * 512].copy_from_slice(&data);
        assert_matches(&volume, &model, step);
        if step == 4 {
            volume.flush().expect("flush");
        }
        if step == 9 {
            volume.close().expect("close");
            volume = open(&devices);
            assert_matches(&volume, &model, step);
        }
    }
    // A write straddling the two blocks, then sub-block zeroing and trimming inside them.
    let mut straddle = [0u8; 1536];
    prng.fill(&mut straddle);
    volume.write(base + BLOCK_BYTES - 1024, &straddle, true).expect("straddling write");
    model[BLOCK_SIZE_BYTES - 1024..BLOCK_SIZE_BYTES + 512].copy_from_slice(&straddle);
    volume.write_zeroes(base + 512, 1024, false).expect("sub-block write-zeroes");
    model[512..1536].fill(0);
    volume.trim(base + BLOCK_BYTES + 2048, 1024).expect("sub-block trim");
    model[BLOCK_SIZE_BYTES + 2048..BLOCK_SIZE_BYTES + 3072].fill(0);
    assert_matches(&volume, &model, usize::MAX);
    assert!(matches!(volume.mapping(first_block).unwrap(), Mapping::Data { .. }));
    volume.close().expect("close");
    let volume = open(&devices);
    assert_matches(&volume, &model, usize::MAX);
    volume.close().expect("close");
}

// ---------------------------------------------------------------------------------------
// Bit rot.
// ---------------------------------------------------------------------------------------

const ROT_MEMBER_SIZE_BYTES: u64 = 4 << 20;
const ROTTEN_MEMBER: usize = 1;

struct RotScenario {
    devices: Vec<Arc<SimulatedDevice>>,
    volume: Volume,
    model: Model,
    bits_flipped: usize,
}

fn simulated_members(devices: &[Arc<SimulatedDevice>]) -> Vec<MemberDevice> {
    let devices: Vec<Arc<dyn BlockDevice>> =
        devices.iter().map(|device| device.clone() as Arc<dyn BlockDevice>).collect();
    members(&devices)
}

/// A volume on simulated members with random data written and flushed, then one random
/// bit flipped in every written (non-zero) block of member `ROTTEN_MEMBER` only.
fn rotten_volume(raid_level: RaidLevel, member_count: usize) -> RotScenario {
    let array = SimulatedArray::new(6);
    let devices: Vec<Arc<SimulatedDevice>> =
        (0..member_count).map(|_| array.add_device(ROT_MEMBER_SIZE_BYTES)).collect();
    let create_options = options(raid_level, CHUNK_SIZE_BYTES);
    let volume = Volume::create(simulated_members(&devices), &create_options, &open_options()).expect("create");
    let model = write_random_runs(&volume, 7, 40, 600);
    let rotten = &devices[ROTTEN_MEMBER];
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    let mut bits_flipped = 0;
    let mut offset = CHUNK_SIZE_BYTES as u64;
    while offset < rotten.size_bytes() {
        rotten.read_at(&mut block, offset).expect("scan the member");
        if block.iter().any(|&byte| byte != 0) {
            let byte = array.random_below(BLOCK_BYTES);
            rotten.flip_bit(offset + byte, array.random_below(8) as u8);
            bits_flipped += 1;
        }
        offset += BLOCK_BYTES;
    }
    assert!(bits_flipped > 10, "the member holds written blocks to damage");
    RotScenario { devices, volume, model, bits_flipped }
}

#[test]
fn bit_rot_on_one_raid5_member_is_detected_and_rebuilt() {
    let scenario = rotten_volume(RaidLevel::Raid5, 4);
    let volume = &scenario.volume;
    assert_contents(volume, &scenario.model);
    let stats = volume.stats();
    assert!(stats.checksum_mismatches > 0, "{} flipped bits went unnoticed", scenario.bits_flipped);
    assert!(stats.reconstructed_blocks > 0);
    assert_eq!(stats.unrecoverable_reads, 0);
    let report = volume.check().expect("check");
    assert!(report.blocks_repairable > 0, "{report:?}");
    assert!(report.logical_blocks_unrecoverable.is_empty(), "{report:?}");
    assert_eq!(report.blocks_unrecoverable, 0, "{report:?}");
    // Reopening (recovery reads damaged summaries too) keeps everything readable.
    scenario.volume.close().expect("close");
    let volume = Volume::open(simulated_members(&scenario.devices), &open_options()).expect("reopen");
    assert_contents(&volume, &scenario.model);
    volume.close().expect("close");
}

/// Read every block of the model one at a time: each read returns the right data or
/// `Unrecoverable` for that very block. Returns the blocks that were unrecoverable.
fn read_right_or_unrecoverable(volume: &Volume, model: &Model) -> Vec<u64> {
    let mut unrecoverable = Vec::new();
    let mut content = vec![0u8; BLOCK_SIZE_BYTES];
    for (&block, expected) in model {
        match volume.read(block * BLOCK_BYTES, &mut content) {
            Ok(()) => assert!(
                &content == expected,
                "block {block}: wrong data returned ({})",
                if content.iter().all(|&byte| byte == 0) { "zeros" } else { "not zeros" }
            ),
            Err(error @ Error::Unrecoverable { logical_block, .. }) => {
                assert_eq!(logical_block, block, "{error}");
                assert_eq!(error.errno(), 5);
                assert!(error.to_string().contains(&format!("logical block {block}")), "{error}");
                unrecoverable.push(block);
            }
            Err(other) => panic!("block {block}: expected data or Unrecoverable, got {other:?}"),
        }
    }
    unrecoverable
}

#[test]
fn bit_rot_on_raid0_is_an_error_never_wrong_data() {
    let scenario = rotten_volume(RaidLevel::Raid0, 3);
    let volume = &scenario.volume;
    let unrecoverable = read_right_or_unrecoverable(volume, &scenario.model);
    assert!(!unrecoverable.is_empty(), "member {ROTTEN_MEMBER} held data blocks that rotted");
    assert!(unrecoverable.len() < scenario.model.len(), "the other members are intact");
    let stats = volume.stats();
    assert!(stats.checksum_mismatches > 0);
    assert_eq!(stats.reconstructed_blocks, 0);
    assert_eq!(stats.unrecoverable_reads, unrecoverable.len() as u64);
    let report = volume.check().expect("check");
    assert!(!report.logical_blocks_unrecoverable.is_empty(), "{report:?}");
    for block in &report.logical_blocks_unrecoverable {
        assert!(unrecoverable.contains(block), "check names block {block}, which read correctly");
    }
    assert!(!report.is_clean());
}

/// Member byte offset of row 0 of the second segment the clients' stream filled (the
/// first after segment 0): on RAID-0 (fixed roles), member 0 holds data column 0 there,
/// where the segment's first summary block lives.
fn second_client_segment_head_bytes(member_0: &SimulatedDevice) -> u64 {
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    // Summary byte 112: the stream that wrote the batch (0: clients).
    (0..)
        .map(|segment: u64| (1 + segment) * CHUNK_SIZE_BYTES as u64)
        .take(1024)
        .filter(|&offset| {
            member_0.read_at(&mut block, offset).expect("read");
            &block[..8] == b"SLBATCH\0" && block[112] == 0
        })
        .nth(1)
        .expect("a second client segment was written")
}

#[test]
fn raid0_summary_rot_is_never_silently_wrong_data_after_a_reopen() {
    let array = SimulatedArray::new(8);
    let devices: Vec<Arc<SimulatedDevice>> = (0..3).map(|_| array.add_device(ROT_MEMBER_SIZE_BYTES)).collect();
    let create_options = options(RaidLevel::Raid0, CHUNK_SIZE_BYTES);
    let volume = Volume::create(simulated_members(&devices), &create_options, &open_options()).expect("create");
    // 200 blocks in 4 flushed batches of 50: three segments are written.
    let mut prng = Prng::new(9);
    let mut model = Model::new();
    for block in 0..200u64 {
        let content = random_block(&mut prng);
        volume.write(block * BLOCK_BYTES, &content, false).expect("write");
        model.insert(block, content);
        if block % 50 == 49 {
            volume.flush().expect("flush");
        }
    }
    volume.close().expect("close");
    let head = second_client_segment_head_bytes(&devices[0]);
    devices[0].flip_bit(head + 200, 3);

    let volume = match Volume::open(simulated_members(&devices), &read_only_options()) {
        // Refusing to open a volume whose log lost a batch is a clear error too.
        Err(error) => {
            eprintln!("open refused: {error}");
            return;
        }
        Ok(volume) => volume,
    };
    // Mounted from its checkpoint, the volume does not read the damaged segment; `check`
    // reads every segment and must see the damage, as a report or as lost metadata.
    match volume.check() {
        Ok(report) => assert!(!report.is_clean(), "check must see the damaged summary: {report:?}"),
        Err(Error::MetadataLost(lost)) => eprintln!("check: {lost}"),
        Err(other) => panic!("check: {other}"),
    }
    let unrecoverable = read_right_or_unrecoverable(&volume, &model);
    assert!(!unrecoverable.is_empty(), "the blocks of the damaged batch cannot be read");
    volume.close().expect("close");
}

/// A volume whose index and tables need more RAM than allowed is refused, by `create`
/// before anything is written and by `open` before anything is allocated; with enough
/// memory the same members open.
#[test]
fn a_volume_whose_index_does_not_fit_the_memory_allowed_is_refused() {
    let devices = memory_members(4, MEMBER_SIZE_BYTES);
    let tight = OpenOptions { memory_limit_bytes: Some(16 << 10), ..open_options() };
    let error = Volume::create(members(&devices), &options(RaidLevel::Raid5, CHUNK_SIZE_BYTES), &tight)
        .err()
        .expect("create refused");
    assert!(matches!(error, Error::NotEnoughMemory { .. }), "{error}");
    assert!(error.to_string().contains("index") && error.to_string().contains("checksums"), "{error}");
    for device in &devices {
        let content = stripelog_engine::identity::inspect(device.as_ref()).expect("inspect");
        assert_eq!(content, stripelog_engine::identity::DeviceContent::Empty, "create wrote before refusing");
    }
    create(&devices, RaidLevel::Raid5).close().expect("close");
    let error = Volume::open(members(&devices), &tight).err().expect("open refused");
    assert!(
        matches!(error, Error::NotEnoughMemory { needed_bytes, available_bytes, .. } if needed_bytes > available_bytes)
    );
    open(&devices).close().expect("the same members open with enough memory");
}

/// ENOSPC is the engine's last word: a write refused for want of space is refused again
/// after the volume is closed and opened (which releases every segment a flush or a
/// checkpoint frees). Were it accepted then, the engine had room it did not find. Volumes
/// with spares from tiny to reasonable, overwritten at random until they report full.
#[test]
fn a_write_refused_for_space_is_refused_again_after_a_reopen() {
    let mut full_volumes = 0;
    let threaded = OpenOptions { cache_size_bytes: 0, ..OpenOptions::default() };
    // Inline volumes with three seeds each; threaded ones (the cleaner thread racing the
    // writer) with one, as they take seconds at the smaller spares.
    let cases = [2u32, 4, 6, 8, 10, 14, 20].into_iter().flat_map(|spare| {
        (0..3u64).map(move |seed| (spare, seed, open_options())).chain([(spare, 0, threaded.clone())])
    });
    for (spare_percent, seed, open_options) in cases {
        let devices = memory_members(4, 8 << 20);
        // Seed 2 with client writes in one stream; the others with the cold stream too,
        // whose partly filled segments must not be room only a reopen can win.
        let create_options = CreateOptions {
            spare_ppm: spare_percent * 10_000,
            client_write_pairs: seed != 2,
            ..options(RaidLevel::Raid5, 64 << 10)
        };
        let volume = Volume::create(members(&devices), &create_options, &open_options).expect("create");
        let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
        let mut prng = Prng::new(seed);
        let refused = (0..logical_blocks * 6).find_map(|step| {
            let block = if step < logical_blocks { step } else { prng.below(logical_blocks) };
            let content = random_block(&mut prng);
            match volume.write(block * BLOCK_BYTES, &content, false) {
                Ok(()) => None,
                Err(Error::OutOfSpace) => Some((step, block, content)),
                Err(other) => panic!("spare {spare_percent} %, seed {seed}, write {step}: {other:?}"),
            }
        });
        volume.close().expect("close");
        let Some((step, block, content)) = refused else { continue };
        full_volumes += 1;
        let volume = Volume::open(members(&devices), &open_options).expect("open");
        let again = volume.write(block * BLOCK_BYTES, &content, false);
        assert!(
            matches!(again, Err(Error::OutOfSpace)),
            "spare {spare_percent} %, seed {seed}: write {step} was refused for space, then accepted after a \
             reopen ({again:?})"
        );
        volume.close().expect("close");
    }
    assert!(full_volumes > 0, "no volume filled up: the test shows nothing");
}
