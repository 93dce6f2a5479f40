//! The cleaner finds a victim's live records from the victim's own summaries (its reverse
//! information, docs/index-and-checkpoints.md): data blocks, and the zero and trim records
//! that must outlive the older copies they cancel. A record it missed would stay behind
//! in its segment, which could then never be freed: a volume overwritten many times over
//! would run out of space. A record it moved that was no longer current would bring old
//! data back.

mod common;

use common::{members, memory_members};
use std::collections::BTreeMap;
use stripelog_blockdev::Prng;
use stripelog_engine::{CreateOptions, IoMode, Mapping, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};

const BLOCK_BYTES: u64 = BLOCK_SIZE_BYTES as u64;

/// What a logical block must read as.
#[derive(Clone, Debug, PartialEq)]
enum Expected {
    Data(Vec<u8>),
    Zeros,
    Hole,
}

/// Deterministic: the calling thread writes and cleans.
fn open_options() -> OpenOptions {
    OpenOptions { flush_interval: None, io_mode: IoMode::Inline, cache_size_bytes: 0, ..OpenOptions::default() }
}

fn verify(volume: &Volume, model: &BTreeMap<u64, Expected>, logical_blocks: u64, when: &str) {
    // The map keeps its counts as it changes (cleaning and replay included).
    let stats = volume.stats();
    let data = model.values().filter(|expected| matches!(expected, Expected::Data(_))).count() as u64;
    let zeros = model.values().filter(|expected| matches!(expected, Expected::Zeros)).count() as u64;
    assert_eq!((stats.blocks_mapped, stats.blocks_zero), (data, zeros), "{when}: blocks mapped and zero");
    let mut content = vec![0u8; BLOCK_SIZE_BYTES];
    for block in 0..logical_blocks {
        volume.read(block * BLOCK_BYTES, &mut content).expect("read");
        let mapping = volume.mapping(block).expect("mapping");
        match model.get(&block).unwrap_or(&Expected::Hole) {
            Expected::Data(data) => assert!(content == *data, "{when}: block {block} does not hold its data"),
            Expected::Zeros => {
                assert!(content.iter().all(|&byte| byte == 0), "{when}: block {block} should read as zeros");
                assert!(matches!(mapping, Mapping::Zero { .. }), "{when}: block {block} should be a zero record");
            }
            Expected::Hole => {
                assert!(content.iter().all(|&byte| byte == 0), "{when}: block {block} should read as zeros");
                assert!(
                    matches!(mapping, Mapping::Unmapped | Mapping::Trimmed { .. }),
                    "{when}: block {block} should be a hole, is {mapping:?}"
                );
            }
        }
    }
}

/// Zeros written over a hole leave it a hole (nothing to record); over data, a zero record.
fn zeroed(model: &mut BTreeMap<u64, Expected>, block: u64) {
    if !matches!(model.get(&block).unwrap_or(&Expected::Hole), Expected::Hole) {
        model.insert(block, Expected::Zeros);
    }
}

/// Ten times the logical size in writes, zero-writes and trims over a small RAID-5 volume
/// with little spare: cleaning runs all the time, and every victim holds all three kinds
/// of records. Nothing may run out of space, every block must read back as last written,
/// before and after a reopen (which replays the relocated records).
#[test]
fn cleaning_moves_data_zero_and_trim_records_and_frees_every_victim() {
    let devices = memory_members(3, 4 << 20);
    let create_options = CreateOptions {
        raid_level: RaidLevel::Raid5,
        chunk_size_bytes: 64 << 10,
        spare_ppm: 250_000,
        ..CreateOptions::default()
    };
    let volume = Volume::create(members(&devices), &create_options, &open_options()).expect("create");
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let mut prng = Prng::new(20);
    let mut model: BTreeMap<u64, Expected> = BTreeMap::new();
    let zeros = vec![0u8; BLOCK_SIZE_BYTES];
    for step in 0..logical_blocks * 10 {
        // A run of 1 to 4 blocks, so that zero and trim records cover ranges too.
        let first = prng.below(logical_blocks);
        let count = (1 + prng.below(4)).min(logical_blocks - first);
        match prng.below(10) {
            0 => {
                volume.trim(first * BLOCK_BYTES, count * BLOCK_BYTES).expect("trim");
                (first..first + count).for_each(|block| {
                    model.insert(block, Expected::Hole);
                });
            }
            1 => {
                volume.write(first * BLOCK_BYTES, &zeros, false).expect("write zeros");
                zeroed(&mut model, first);
            }
            2 => {
                volume.write_zeroes(first * BLOCK_BYTES, count * BLOCK_BYTES, false).expect("write zeroes");
                (first..first + count).for_each(|block| zeroed(&mut model, block));
            }
            _ => {
                let mut data = vec![0u8; BLOCK_SIZE_BYTES];
                prng.fill(&mut data);
                volume.write(first * BLOCK_BYTES, &data, false).unwrap_or_else(|error| {
                    panic!("write {step} of {}: {error}", logical_blocks * 10);
                });
                model.insert(first, Expected::Data(data));
            }
        }
        if step % 997 == 0 {
            volume.flush().expect("flush");
        }
    }
    volume.flush().expect("flush");
    let stats = volume.stats();
    assert!(stats.cleaning_rounds > 50, "the cleaner ran only {} rounds", stats.cleaning_rounds);
    verify(&volume, &model, logical_blocks, "after cleaning");
    volume.close().expect("close");
    let volume = Volume::open(members(&devices), &open_options()).expect("reopen");
    verify(&volume, &model, logical_blocks, "after reopening");
    let report = volume.check().expect("check");
    assert!(report.is_clean(), "{report:?}");
    volume.close().expect("close");
}

/// Every summary names the segment its stream goes on in (the forward link mount follows
/// from a checkpoint, docs/index-and-checkpoints.md): written before that segment is
/// opened, and the segment the stream then opens.
#[test]
fn each_segment_names_the_next_segment_of_its_stream() {
    let devices = memory_members(4, 8 << 20);
    let create_options =
        CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..CreateOptions::default() };
    let volume = Volume::create(members(&devices), &create_options, &open_options()).expect("create");
    let geometry = volume.geometry().clone();
    // Several segments' worth, flushed now and then (short stripes: several batches per
    // segment, each naming the same successor).
    let blocks = geometry.blocks_per_segment() * 5;
    let mut data = vec![0u8; BLOCK_SIZE_BYTES];
    for block in 0..blocks {
        Prng::new(block + 1).fill(&mut data);
        volume.write(block * BLOCK_BYTES, &data, block % 97 == 0).expect("write");
    }
    let stats = volume.stats();
    volume.close().expect("close");
    let uuid = *uuid::Uuid::parse_str(&stats.volume_uuid).expect("uuid").as_bytes();
    // (open sequence, segment, successors named by its batches)
    let mut chain: Vec<(u64, u64, Vec<u64>)> = Vec::new();
    let mut block = stripelog_blockdev::AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for segment in 0..geometry.segment_count() {
        let mut named = Vec::new();
        let mut row = 0;
        let mut open_sequence = None;
        while row < geometry.rows_per_chunk() {
            let member = geometry.members_of_column(segment, 0)[0];
            devices[member].read_at(&mut block, geometry.member_offset_bytes(segment, row)).expect("read");
            let Some(summary) = stripelog_engine::format::Summary::decode(&block, &uuid) else {
                break;
            };
            // Checkpoint blocks have a stream of their own (4); the cleaner has not run.
            if summary.header.stream != 0 {
                assert_eq!(summary.header.stream, 4, "only client writes and checkpoints here");
                break;
            }
            open_sequence = Some(summary.header.segment_open_sequence);
            named.push(summary.header.next_segment);
            row += summary.header.row_count;
        }
        if let Some(open_sequence) = open_sequence {
            chain.push((open_sequence, segment, named));
        }
    }
    chain.sort();
    assert!(chain.len() >= 5, "{} segments written", chain.len());
    for pair in chain.windows(2) {
        let (_, segment, named) = &pair[0];
        let (_, next, _) = &pair[1];
        assert!(
            named.iter().all(|named| named == next),
            "segment {segment} names {named:?}, the stream went on in {next}"
        );
    }
    let (_, last, named) = chain.last().expect("non-empty");
    assert!(
        named.iter().all(|&named| named != *last && named < geometry.segment_count()),
        "the current segment names a reserved successor: {named:?}"
    );
}
