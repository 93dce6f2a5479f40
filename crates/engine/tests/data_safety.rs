//! The engine's side of docs/data-safety.md: `create` and `replace` refuse what would
//! destroy data, members are known by their UUID (a replaced one is refused by name), the
//! holder record, RAID-10's survivability, and metadata destroyed beyond redundancy refused
//! rather than served as stale blocks. Every refusal writes nothing: the members compare
//! byte for byte with what they held before.

use std::sync::Arc;
use stripelog_blockdev::{AlignedBuffer, BlockDevice, MemoryDevice, Prng};
use stripelog_engine::format::{
    Superblock, SUPERBLOCK_OFFSETS_BYTES, SUPERBLOCK_VERSION, SUPERBLOCK_VERSION_WITH_FEATURES,
};
use stripelog_engine::{
    CreateOptions, Error, IoMode, MaintenanceOptions, Mapping, MemberDevice, OpenOptions, RaidLevel, ReplaceOptions,
    Volume, BLOCK_SIZE_BYTES,
};

const MEMBER_SIZE_BYTES: u64 = 8 << 20;
const CHUNK_SIZE_BYTES: u32 = 64 << 10;
const BLOCK_BYTES: u64 = BLOCK_SIZE_BYTES as u64;

fn memory_members(count: usize) -> Vec<Arc<dyn BlockDevice>> {
    (0..count).map(|_| Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES)) as Arc<dyn BlockDevice>).collect()
}

fn members(devices: &[Arc<dyn BlockDevice>]) -> Vec<MemberDevice> {
    devices
        .iter()
        .enumerate()
        .map(|(index, device)| MemberDevice { name: format!("m{index}"), device: Some(device.clone()) })
        .collect()
}

fn options(raid_level: RaidLevel) -> CreateOptions {
    CreateOptions { raid_level, chunk_size_bytes: CHUNK_SIZE_BYTES, ..CreateOptions::default() }
}

fn open_options() -> OpenOptions {
    OpenOptions {
        flush_interval: None,
        io_mode: IoMode::Inline,
        cache_size_bytes: 0,
        holder_program: "data-safety test".into(),
        ..OpenOptions::default()
    }
}

/// What `stripelog upgrade` opens with.
fn upgrade() -> OpenOptions {
    OpenOptions { upgrade_format: true, ..open_options() }
}

fn read_only() -> OpenOptions {
    OpenOptions { read_only: true, ..open_options() }
}

/// Every byte of every device.
fn snapshot(devices: &[Arc<dyn BlockDevice>]) -> Vec<Vec<u8>> {
    devices
        .iter()
        .map(|device| {
            let mut buffer = AlignedBuffer::zeroed(device.size_bytes() as usize);
            device.read_at(&mut buffer, 0).expect("read a whole device");
            buffer.to_vec()
        })
        .collect()
}

fn assert_unchanged(devices: &[Arc<dyn BlockDevice>], before: &[Vec<u8>], what: &str) {
    for (index, (now, then)) in snapshot(devices).iter().zip(before).enumerate() {
        assert!(now == then, "{what}: device {index} was written");
    }
}

/// A volume holding `blocks` random blocks from logical block 0; closed. The content.
fn volume_with_data(devices: &[Arc<dyn BlockDevice>], raid_level: RaidLevel, blocks: u64) -> Vec<u8> {
    let volume = Volume::create(members(devices), &options(raid_level), &open_options()).expect("create");
    let mut data = vec![0u8; (blocks * BLOCK_BYTES) as usize];
    Prng::new(blocks).fill(&mut data);
    volume.write(0, &data, false).expect("write");
    volume.close().expect("close");
    data
}

fn assert_reads(volume: &Volume, data: &[u8]) {
    let mut back = vec![0u8; data.len()];
    volume.read(0, &mut back).expect("read back");
    assert!(back == data, "the data does not read back");
}

fn expect_error<T>(result: Result<T, Error>, what: &str) -> Error {
    match result {
        Ok(_) => panic!("{what}: succeeded where it must be refused"),
        Err(error) => error,
    }
}

/// Rewrite both superblock copies of `device` through `change`.
fn rewrite_superblocks(device: &dyn BlockDevice, change: impl Fn(&mut Superblock)) {
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for (copy, &offset) in SUPERBLOCK_OFFSETS_BYTES.iter().enumerate() {
        device.read_at(&mut block, offset).expect("read a superblock");
        let mut superblock = Superblock::decode(&block, copy as u32).expect("a valid superblock");
        change(&mut superblock);
        superblock.encode(&mut block);
        device.write_at(&block, offset).expect("write a superblock");
    }
}

#[test]
fn create_refuses_a_member_of_a_volume_or_one_holding_data_unless_forced() {
    let devices = memory_members(4);
    let data = volume_with_data(&devices, RaidLevel::Raid5, 64);
    let before = snapshot(&devices);
    let error = expect_error(Volume::create(members(&devices), &options(RaidLevel::Raid5), &open_options()), "create");
    assert!(matches!(error, Error::WouldDestroy { member: 0, .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("holds member 0 of stripelog volume") && message.contains("raid5 on 4 members"),
        "{message}"
    );
    assert_unchanged(&devices, &before, "a refused create");
    assert_reads(&Volume::open(members(&devices), &read_only()).expect("still the old volume"), &data);

    // Data in the first or the last MiB of a device that holds no volume.
    for offset in [4096, MEMBER_SIZE_BYTES - 4096] {
        let fresh = memory_members(3);
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        block[9] = 0x5A;
        fresh[2].write_at(&block, offset).unwrap();
        let before = snapshot(&fresh);
        let error = expect_error(Volume::create(members(&fresh), &options(RaidLevel::Raid5), &open_options()), "data");
        let message = error.to_string();
        assert!(message.contains(&format!("holds data (a non-zero byte at offset {})", offset + 9)), "{message}");
        assert!(message.contains("member 2 (m2)"), "{message}");
        assert_unchanged(&fresh, &before, "a refused create on data");
    }

    let forced = CreateOptions { force: true, ..options(RaidLevel::Raid5) };
    let volume = Volume::create(members(&devices), &forced, &open_options()).expect("--force");
    assert_eq!(volume.stats().blocks_mapped, 0, "a new, empty volume");
    volume.close().unwrap();
}

#[test]
fn create_refuses_the_same_device_twice() {
    let devices = memory_members(3);
    let twice = vec![devices[0].clone(), devices[1].clone(), devices[0].clone()];
    let error = expect_error(Volume::create(members(&twice), &options(RaidLevel::Raid5), &open_options()), "twice");
    assert!(error.to_string().contains("is the same device as member 0"), "{error}");
    let forced = CreateOptions { force: true, ..options(RaidLevel::Raid5) };
    let error = expect_error(Volume::create(members(&twice), &forced, &open_options()), "twice, forced");
    assert!(error.to_string().contains("is the same device as member 0"), "{error}");
    assert_unchanged(&devices, &snapshot(&memory_members(3)), "a refused create of one device twice");
}

#[test]
fn replace_refuses_live_members_other_volumes_and_data_and_writes_nothing() {
    let devices = memory_members(5);
    let data = volume_with_data(&devices, RaidLevel::Raid5, 100);
    let other = memory_members(3);
    volume_with_data(&other, RaidLevel::Raid5, 10);
    let holds_data: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES));
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    block[0] = 1;
    holds_data.write_at(&block, 0).unwrap();

    let volume = Volume::open(members(&devices), &open_options()).expect("open");
    let everything: Vec<Arc<dyn BlockDevice>> =
        devices.iter().chain(other.iter()).chain(std::iter::once(&holds_data)).cloned().collect();
    let before = snapshot(&everything);
    let replace = |device: &Arc<dyn BlockDevice>, force: bool| {
        volume.replace_member(
            3,
            MemberDevice { name: "replacement".into(), device: Some(device.clone()) },
            &ReplaceOptions { force },
        )
    };
    // A member the volume uses: never, not even forced.
    for force in [false, true] {
        let error = expect_error(replace(&devices[0], force), "a live member");
        assert!(error.to_string().contains("is member 0 of this volume (m0), in use"), "{error}");
    }
    let error = expect_error(replace(&other[1], false), "another volume's member");
    assert!(error.to_string().contains("holds member 1 of stripelog volume"), "{error}");
    let error = expect_error(replace(&holds_data, false), "a device holding data");
    assert!(error.to_string().contains("holds data (a non-zero byte at offset 0)"), "{error}");
    assert_unchanged(&everything, &before, "refused replacements");
    assert!(!volume.stats().degraded, "no member was failed by a refused replacement");
    assert_reads(&volume, &data);
    // Forced, another volume's member may be overwritten.
    replace(&other[1], true).expect("forced over another volume's member");
    volume.rebuild(&MaintenanceOptions::default(), &|_| {}).expect("rebuild");
    assert_reads(&volume, &data);
    assert!(volume.check().expect("check").is_clean());
    volume.close().unwrap();
}

#[test]
fn a_replaced_member_offered_again_is_refused_by_name() {
    let devices = memory_members(5);
    let data = volume_with_data(&devices, RaidLevel::Raid5, 100);
    let volume = Volume::open(members(&devices), &open_options()).expect("open");
    let new: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES));
    volume
        .replace_member(2, MemberDevice { name: "new2".into(), device: Some(new.clone()) }, &ReplaceOptions::default())
        .expect("replace");
    volume.rebuild(&MaintenanceOptions::default(), &|_| {}).expect("rebuild");
    let stats = volume.stats();
    assert_eq!(stats.retired_members.len(), 1);
    assert_eq!(stats.retired_members[0].position, 2);
    volume.close().unwrap();

    let mut current = devices.clone();
    current[2] = new.clone();
    let before = snapshot(&current);
    // The old device in its old place: refused by name, whatever else.
    let error = expect_error(Volume::open(members(&devices), &open_options()), "the old member");
    let message = error.to_string();
    assert!(
        message.contains("member 2 (m2)")
            && message.contains("member 2 was replaced on")
            && message.contains("this is the old device"),
        "{message}"
    );
    assert_unchanged(&current, &before, "a refused open");
    // As a replacement for another member: retired, so only forced.
    let volume = Volume::open(members(&current), &open_options()).expect("the right members");
    assert_reads(&volume, &data);
    let error = expect_error(
        volume.replace_member(
            4,
            MemberDevice { name: "old2".into(), device: Some(devices[2].clone()) },
            &ReplaceOptions::default(),
        ),
        "a retired member as a replacement",
    );
    assert!(error.to_string().contains("is a retired member of this volume (member 2, replaced on"), "{error}");
    assert!(volume.check().expect("check").is_clean());
    volume.close().unwrap();
}

#[test]
fn a_device_that_is_not_the_member_of_its_position_is_refused() {
    let devices = memory_members(4);
    volume_with_data(&devices, RaidLevel::Raid5, 10);
    // An old copy of member 1 (a restored backup) whose member UUID the volume never knew.
    let copy: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES));
    let content = snapshot(&devices[1..2]).remove(0);
    let mut buffer = AlignedBuffer::zeroed(content.len());
    buffer.copy_from_slice(&content);
    copy.write_at(&buffer, 0).unwrap();
    rewrite_superblocks(copy.as_ref(), |superblock| {
        superblock.member_uuid = [0xEE; 16];
        superblock.member_uuids[1] = [0xEE; 16];
    });
    let mut wrong = devices.clone();
    wrong[1] = copy;
    let error = expect_error(Volume::open(members(&wrong), &open_options()), "an unknown member");
    assert!(error.to_string().contains("is not the member this volume expects in position 1"), "{error}");
    Volume::open(members(&devices), &open_options()).expect("the right members").close().unwrap();
}

#[test]
fn an_old_volume_opens_read_only_and_read_write_only_when_upgraded() {
    let devices = memory_members(4);
    let data = volume_with_data(&devices, RaidLevel::Raid5, 50);
    // What version 1 wrote: the same fields up to offset 120, zeros after.
    downgrade_to_version_1(&devices);
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    let volume = Volume::open(members(&devices), &read_only()).expect("a version-1 volume, read-only");
    let stats = volume.stats();
    assert_eq!(stats.superblock_version, 1);
    assert!(stats.members.iter().all(|member| member.member_uuid.is_empty()));
    assert_reads(&volume, &data);
    drop(volume);
    let error = expect_error(Volume::open(members(&devices), &open_options()), "read-write, not upgraded");
    assert!(
        matches!(error, Error::FormatUpgradeNeeded { version: 1, .. })
            && error.to_string().contains("run `stripelog upgrade`"),
        "{error}"
    );
    let volume = Volume::open(members(&devices), &upgrade()).expect("read-write: upgraded");
    let stats = volume.stats();
    assert_eq!(stats.superblock_version, SUPERBLOCK_VERSION);
    assert!(stats.members.iter().all(|member| !member.member_uuid.is_empty()));
    assert_reads(&volume, &data);
    volume.close().unwrap();
    let volume = Volume::open(members(&devices), &open_options()).expect("the current version now");
    assert_eq!(volume.stats().superblock_version, SUPERBLOCK_VERSION);
    assert_reads(&volume, &data);
    volume.close().unwrap();
    // Version 2 (member identity, no index fields) is refused and upgraded the same way.
    downgrade(&devices, 2, 2304);
    let error = expect_error(Volume::open(members(&devices), &open_options()), "version 2, not upgraded");
    assert!(matches!(error, Error::FormatUpgradeNeeded { version: 2, .. }), "{error}");
    let volume = Volume::open(members(&devices), &upgrade()).expect("version 2 upgraded");
    assert_reads(&volume, &data);
    volume.close().unwrap();
    // A version this code does not know is named, not taken for missing members.
    for device in &devices {
        for &offset in &SUPERBLOCK_OFFSETS_BYTES {
            device.read_at(&mut block, offset).unwrap();
            block[8..12].copy_from_slice(&(SUPERBLOCK_VERSION_WITH_FEATURES + 1).to_le_bytes());
            let checksum = crc32c::crc32c(&block[..BLOCK_SIZE_BYTES - 4]);
            block[BLOCK_SIZE_BYTES - 4..].copy_from_slice(&checksum.to_le_bytes());
            device.write_at(&block, offset).unwrap();
        }
    }
    let error = expect_error(Volume::open(members(&devices), &read_only()), "a later format version");
    let later = format!("format version {} is not supported", SUPERBLOCK_VERSION_WITH_FEATURES + 1);
    assert!(error.to_string().contains(&later), "{error}");
}

/// Rewrite both superblock copies of every device as version 1 wrote them.
fn downgrade_to_version_1(devices: &[Arc<dyn BlockDevice>]) {
    downgrade(devices, 1, 120);
}

/// Rewrite both superblock copies of every device as `version`, which wrote zeros from
/// `fields_from` on.
fn downgrade(devices: &[Arc<dyn BlockDevice>], version: u32, fields_from: usize) {
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for device in devices {
        for &offset in &SUPERBLOCK_OFFSETS_BYTES {
            device.read_at(&mut block, offset).unwrap();
            block[8..12].copy_from_slice(&version.to_le_bytes());
            block[fields_from..BLOCK_SIZE_BYTES - 4].fill(0);
            let checksum = crc32c::crc32c(&block[..BLOCK_SIZE_BYTES - 4]);
            block[BLOCK_SIZE_BYTES - 4..].copy_from_slice(&checksum.to_le_bytes());
            device.write_at(&block, offset).unwrap();
        }
    }
}

/// The first read-write open of a version-1 volume is interrupted after the new superblock
/// reached some members: the others, still version 1, are accepted and upgraded by the next
/// open. A version-1 device replaced since is still refused as the old device.
#[test]
fn an_interrupted_upgrade_opens_and_a_replaced_version_1_device_is_refused() {
    let devices = memory_members(4);
    let data = volume_with_data(&devices, RaidLevel::Raid5, 40);
    downgrade_to_version_1(&devices);
    let version_1 = snapshot(&devices);
    Volume::open(members(&devices), &upgrade()).unwrap().close().unwrap();
    // The superblocks of members 2 and 3 are back to what version 1 wrote: the upgrade's
    // superblock writes never reached them (what it wrote in the log, its checkpoint, did).
    for index in [2, 3] {
        for &offset in &SUPERBLOCK_OFFSETS_BYTES {
            let at = offset as usize;
            let mut buffer = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
            buffer.copy_from_slice(&version_1[index][at..at + BLOCK_SIZE_BYTES]);
            devices[index].write_at(&buffer, offset).unwrap();
        }
    }
    let volume = Volume::open(members(&devices), &open_options()).expect("an interrupted upgrade");
    assert!(volume.stats().members.iter().all(|member| !member.member_uuid.is_empty()));
    assert_reads(&volume, &data);
    volume.close().unwrap();

    // A version-1 volume whose member 1 is missing at the upgrade and replaced later.
    let devices = memory_members(4);
    let data = volume_with_data(&devices, RaidLevel::Raid5, 40);
    downgrade_to_version_1(&devices);
    let mut without_1 = members(&devices);
    without_1[1].device = None;
    let volume = Volume::open(without_1, &upgrade()).expect("degraded, on purpose");
    let new: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES));
    volume
        .replace_member(1, MemberDevice { name: "new1".into(), device: Some(new.clone()) }, &ReplaceOptions::default())
        .unwrap();
    volume.rebuild(&MaintenanceOptions::default(), &|_| {}).unwrap();
    volume.close().unwrap();
    let error = expect_error(Volume::open(members(&devices), &open_options()), "the old version-1 device");
    assert!(
        error.to_string().contains("member 1 was replaced on") && error.to_string().contains("old device"),
        "{error}"
    );
    let mut current = devices.clone();
    current[1] = new;
    assert_reads(&Volume::open(members(&current), &open_options()).expect("the replacement"), &data);
}

/// A mirror's replaced member is opened on its own (`missing` for its partner) and moves on
/// to epochs the real volume never had; given back beside the real members, it would be
/// the newest superblock. The real member's record of it as retired refuses it.
#[test]
fn a_retired_member_that_went_its_own_way_is_refused() {
    let devices = memory_members(2);
    let data = volume_with_data(&devices, RaidLevel::Raid10, 30);
    let volume = Volume::open(members(&devices), &open_options()).unwrap();
    let new: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MEMBER_SIZE_BYTES));
    volume
        .replace_member(0, MemberDevice { name: "new0".into(), device: Some(new.clone()) }, &ReplaceOptions::default())
        .unwrap();
    volume.rebuild(&MaintenanceOptions::default(), &|_| {}).unwrap();
    volume.close().unwrap();
    // The old member alone, twice, so its epoch passes the real volume's.
    for _ in 0..2 {
        let mut alone = members(&devices);
        alone[1].device = None;
        let volume = Volume::open(alone, &open_options()).expect("the old member alone");
        volume.write(0, &vec![0xAB; BLOCK_SIZE_BYTES], false).unwrap();
        volume.close().unwrap();
    }
    let mut mixed = members(&devices);
    mixed[1].device = Some(devices[1].clone());
    let error = expect_error(Volume::open(mixed, &open_options()), "a diverged old member");
    let message = error.to_string();
    assert!(message.contains("member 0 (m0)") && message.contains("went separate ways"), "{message}");
    let mut current = devices.clone();
    current[0] = new;
    assert_reads(&Volume::open(members(&current), &open_options()).expect("the real members"), &data);
}

#[test]
fn the_holder_record_says_who_opened_the_volume_and_whether_it_closed_cleanly() {
    let devices = memory_members(3);
    volume_with_data(&devices, RaidLevel::Raid5, 5);
    let holder = Volume::open(members(&devices), &read_only()).unwrap().stats().holder;
    assert!(!holder.open, "{holder:?}");
    assert!(holder.closed_unix_seconds >= holder.opened_unix_seconds && holder.opened_unix_seconds > 0);
    assert_eq!((holder.process_id, holder.program.as_str()), (std::process::id(), "data-safety test"));
    assert_eq!(holder.host, stripelog_engine::identity::host_name());
    assert!(holder.description.starts_with("closed cleanly at"), "{}", holder.description);
    // A process that dies leaves the volume marked open.
    Volume::open(members(&devices), &open_options()).unwrap().abandon();
    let holder = Volume::open(members(&devices), &read_only()).unwrap().stats().holder;
    assert!(holder.open && holder.description.starts_with("OPEN: data-safety test, pid"), "{}", holder.description);
    // Marked open by another host: a read-write open is refused unless told to take over.
    for device in &devices {
        rewrite_superblocks(device.as_ref(), |superblock| superblock.holder.host = "db9.example".into());
    }
    let before = snapshot(&devices);
    let error = expect_error(Volume::open(members(&devices), &open_options()), "another host's volume");
    assert!(matches!(error, Error::HeldByAnotherHost { .. }), "{error:?}");
    assert!(error.to_string().contains("is open on host db9.example"), "{error}");
    assert_unchanged(&devices, &before, "a refused open");
    Volume::open(members(&devices), &read_only()).expect("read-only is harmless");
    let take_over = OpenOptions { take_over_from_another_host: true, ..open_options() };
    let volume = Volume::open(members(&devices), &take_over).expect("taken over");
    assert_eq!(volume.stats().holder.host, stripelog_engine::identity::host_name());
    volume.close().unwrap();
}

#[test]
fn raid10_survives_one_more_loss_while_every_mirror_pair_is_whole() {
    for count in [2, 4, 6] {
        let devices = memory_members(count);
        volume_with_data(&devices, RaidLevel::Raid10, 5);
        let stats = Volume::open(members(&devices), &read_only()).unwrap().stats();
        assert_eq!(stats.failures_still_tolerated, 1, "a whole RAID-10 of {count}");
        let mut without_one = members(&devices);
        without_one[count - 1].device = None;
        let stats = Volume::open(without_one, &read_only()).unwrap().stats();
        assert_eq!(stats.failures_still_tolerated, 0, "RAID-10 of {count} less one member");
        if count >= 4 {
            let mut two_pairs = members(&devices);
            two_pairs[0].device = None;
            two_pairs[3].device = None;
            assert_eq!(Volume::open(two_pairs, &read_only()).unwrap().stats().failures_still_tolerated, 0);
            let mut one_pair = members(&devices);
            one_pair[0].device = None;
            one_pair[1].device = None;
            expect_error(Volume::open(one_pair, &read_only()), "both halves of a pair");
        }
    }
}

/// The member offset of the summary in front of `logical_block` (one data column: the
/// block before it in the data space).
fn summary_offset(volume: &Volume, logical_block: u64) -> u64 {
    let Ok(Mapping::Data { position }) = volume.mapping(logical_block) else {
        panic!("block {logical_block} is mapped")
    };
    let summary = volume.geometry().locate(position - 1);
    volume.geometry().member_offset_bytes(summary.segment, summary.row)
}

/// Flip one byte of the summary of the batch whose first data block is `logical_block`
/// (RAID-0 on one member: the summary is the block in front of it).
fn damage_summary_of(volume: &Volume, device: &dyn BlockDevice, logical_block: u64) {
    let offset = summary_offset(volume, logical_block);
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    device.read_at(&mut block, offset).unwrap();
    block[200] ^= 0x40;
    device.write_at(&block, offset).unwrap();
}

/// RAID-0 (no redundancy): a batch's summary rots after the batch that followed it in the
/// log was cleaned away, so no surviving batch names its segment. The volume opens from its
/// checkpoint (which holds the batch's map entries), but the blocks of that segment can no
/// longer be proven: reads fail, never serve them as never written (zeros) or stale.
#[test]
fn a_rotten_summary_that_no_later_batch_names_is_refused_not_read_as_zeros() {
    let devices = memory_members(1);
    let volume = Volume::create(members(&devices), &options(RaidLevel::Raid0), &open_options()).unwrap();
    let mut prng = Prng::new(5);
    let mut data = vec![0u8; (15 * BLOCK_BYTES) as usize];
    // Batch 1 fills a segment with blocks 0-14 (a summary and 15 blocks: one chunk).
    prng.fill(&mut data);
    volume.write(0, &data, false).unwrap();
    volume.flush().unwrap();
    // Batch 2 fills the next with blocks 100-114; batch 3 overwrites them, killing batch 2.
    for _ in 0..2 {
        prng.fill(&mut data);
        volume.write(100 * BLOCK_BYTES, &data, false).unwrap();
        volume.flush().unwrap();
    }
    volume.flush().unwrap();
    damage_summary_of(&volume, devices[0].as_ref(), 0);
    volume.close().unwrap();
    let volume = Volume::open(members(&devices), &open_options()).expect("the checkpoint holds the map");
    let mut back = vec![0u8; BLOCK_SIZE_BYTES];
    for block in 0..15 {
        let error = expect_error(volume.read(block * BLOCK_BYTES, &mut back), "a block of the rotten batch");
        assert!(error.to_string().contains("cannot be read"), "block {block}: {error}");
    }
    volume.read(100 * BLOCK_BYTES, &mut back).expect("the other segment's blocks");
}

/// The batch at the recorded durable frontier loses its summary: the batch after it records
/// it as durable, a crash follows. Refused, not a log that silently ends before it (the
/// walk from the checkpoint stops at the damaged batch; it looks beyond for batches that
/// prove it was durable).
#[test]
fn a_lost_batch_at_the_recorded_durable_frontier_is_refused() {
    let devices = memory_members(1);
    let volume = Volume::create(members(&devices), &options(RaidLevel::Raid0), &open_options()).unwrap();
    let mut data = vec![0u8; (4 * BLOCK_BYTES) as usize];
    Prng::new(6).fill(&mut data);
    for block in [0, 200, 300] {
        volume.write(block * BLOCK_BYTES, &data, false).unwrap();
        volume.flush().unwrap();
    }
    damage_summary_of(&volume, devices[0].as_ref(), 200);
    volume.abandon();
    let error = expect_error(Volume::open(members(&devices), &open_options()), "a durable batch lost");
    assert!(error.to_string().contains("metadata damaged beyond repair"), "{error}");
}

/// Host and member bytes written add up over opens: persisted at a clean close, and after
/// a crash up to the last superblock update (the open itself writes one).
#[test]
fn lifetime_counters_survive_a_close_and_a_crash() {
    let devices = memory_members(4);
    let data = volume_with_data(&devices, RaidLevel::Raid5, 50);
    let volume = Volume::open(members(&devices), &read_only()).expect("read-only");
    let first = volume.stats();
    assert_eq!(first.lifetime.host_bytes_written, data.len() as u64);
    assert_eq!(first.host_bytes_written, 0, "nothing since this open");
    let member_bytes: Vec<u64> = first.members.iter().map(|member| member.lifetime_bytes_written).collect();
    assert!(member_bytes.iter().all(|&bytes| bytes > 0), "{member_bytes:?}");
    assert!(first.lifetime.member_bytes_data >= data.len() as u64);
    drop(volume);
    // A second open writes as much again and closes cleanly: the counters add up.
    let volume = Volume::open(members(&devices), &open_options()).expect("read-write");
    volume.write(0, &data, false).expect("write");
    volume.close().expect("close");
    let volume = Volume::open(members(&devices), &read_only()).expect("read-only");
    let second = volume.stats();
    assert_eq!(second.lifetime.host_bytes_written, 2 * data.len() as u64);
    for (member, status) in second.members.iter().enumerate() {
        assert!(status.lifetime_bytes_written > member_bytes[member], "member {member} did not count");
    }
    drop(volume);
    // A crash after more writes loses the counts since the last superblock update only.
    let volume = Volume::open(members(&devices), &open_options()).expect("read-write");
    volume.write(0, &data, false).expect("write");
    volume.flush().expect("flush");
    volume.abandon();
    let volume = Volume::open(members(&devices), &read_only()).expect("after the crash");
    let third = volume.stats();
    assert!(third.lifetime.host_bytes_written >= second.lifetime.host_bytes_written);
    assert!(third.lifetime.batches_written >= second.lifetime.batches_written);
}

/// A mirror (RAID-10 on two members) after a crash: one side holds, where the last batch's summary belongs, another
/// valid summary of the same volume (a batch of an older use of the row, left by a write
/// the crash dropped). Every self-checksummed block has the same whole-block CRC32C, so
/// the tail's verification must not take the stale one for the summary it found and
/// "repair" the good mirror with it: the batch stays readable, then and at the next mount.
#[test]
fn a_stale_summary_on_one_mirror_is_repaired_not_copied_over_the_good_one() {
    for stale_member in 0..2 {
        let devices = memory_members(2);
        let volume = Volume::create(members(&devices), &options(RaidLevel::Raid10), &open_options()).unwrap();
        let mut first = vec![0u8; (4 * BLOCK_BYTES) as usize];
        let mut second = first.clone();
        Prng::new(7).fill(&mut first);
        Prng::new(8).fill(&mut second);
        volume.write(0, &first, false).unwrap();
        volume.flush().unwrap();
        volume.write(100 * BLOCK_BYTES, &second, false).unwrap();
        volume.flush().unwrap();
        let (older, newer) = (summary_offset(&volume, 0), summary_offset(&volume, 100));
        volume.abandon();
        let device = devices[stale_member].as_ref();
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        device.read_at(&mut block, older).unwrap();
        device.write_at(&block, newer).unwrap();
        for mount in ["the mount that repairs", "the next mount"] {
            let volume = Volume::open(members(&devices), &open_options())
                .unwrap_or_else(|error| panic!("stale summary on member {stale_member}, {mount}: {error}"));
            let mut back = vec![0u8; second.len()];
            volume
                .read(100 * BLOCK_BYTES, &mut back)
                .unwrap_or_else(|error| panic!("stale summary on member {stale_member}, {mount}: {error}"));
            assert!(back == second, "stale summary on member {stale_member}, {mount}: the last batch reads wrong");
            volume.abandon();
        }
    }
}
