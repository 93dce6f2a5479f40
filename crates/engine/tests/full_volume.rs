//! A volume whose spare is too small for its cleaner fills up for good: new writes fail
//! with ENOSPC. Trims must still be accepted there — they are the only way out — and the
//! room they free must take writes again, across the cleaner and a reopen
//! (docs/garbage-collection.md, "A physically full volume").

mod common;

use common::{members, memory_members, verify_contents};
use std::collections::BTreeMap;
use stripelog_blockdev::Prng;
use stripelog_engine::{CreateOptions, Error, IoMode, OpenOptions, Volume, BLOCK_SIZE_BYTES};

const BLOCK_BYTES: u64 = BLOCK_SIZE_BYTES as u64;

type Model = BTreeMap<u64, Vec<u8>>;

fn open_options(io_mode: IoMode) -> OpenOptions {
    OpenOptions { flush_interval: None, io_mode, cache_size_bytes: 0, ..OpenOptions::default() }
}

/// Members (count, bytes each), spare (ppm) and seed: spares far below what `create`
/// warns about (1 to 10 % of volumes of one to three hundred segments), so that the log
/// fills before the logical space does. Seeds found by trying 40 on each geometry: with
/// data allowed into the records' room, the second phase refused a trim at 4, 1 and 9;
/// with a batch of records running the inline round a new segment runs, at 7.
const VOLUMES: [(usize, u64, u32, u64); 5] = [
    (4, 8 << 20, 100_000, 31),
    (4, 8 << 20, 50_000, 4),
    (5, 4 << 20, 30_000, 1),
    (3, 8 << 20, 20_000, 9),
    (3, 16 << 20, 10_000, 7),
];

#[test]
fn trims_are_accepted_on_a_physically_full_volume_and_make_room() {
    for (count, size, spare_ppm, seed) in VOLUMES {
        eprintln!("inline: {count} members of {size} bytes, spare {spare_ppm} ppm, seed {seed}");
        fill_then_trim(count, size, spare_ppm, seed, IoMode::Inline, Refill::RandomOverwrites);
    }
}

/// The same with a cleaner thread (the server's mode): writers at the reserve wait for it.
#[test]
fn trims_are_accepted_on_a_physically_full_threaded_volume() {
    let (count, size, spare_ppm, seed) = VOLUMES[0];
    fill_then_trim(count, size, spare_ppm, seed, IoMode::Threaded, Refill::NewDataFirst);
}

/// How the second phase fills the volume again.
#[derive(Clone, Copy)]
enum Refill {
    /// Random overwrites (slow with a cleaner thread: each waits for it near the end).
    RandomOverwrites,
    /// The blocks that hold nothing first, then random overwrites.
    NewDataFirst,
}

fn fill_then_trim(count: usize, size: u64, spare_ppm: u32, seed: u64, io_mode: IoMode, refill: Refill) {
    let devices = memory_members(count, size);
    let options = CreateOptions { chunk_size_bytes: 64 << 10, spare_ppm, force: true, ..CreateOptions::default() };
    let volume = Volume::create(members(&devices), &options, &open_options(io_mode)).expect("create");
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let mut prng = Prng::new(seed);
    let mut model = Model::new();
    // Every block once, then random overwrites, until the log is full.
    let refused = (0..6 * logical_blocks).find(|&step| {
        let block = if step < logical_blocks { step } else { prng.below(logical_blocks) };
        !write(&volume, &mut model, &mut prng, block)
    });
    assert!(refused.is_some(), "the volume never filled: the test shows nothing");

    // Trim a fifth of what it holds, scattered (one record per block): each is accepted.
    let held: Vec<u64> = model.keys().copied().collect();
    let trimmed: Vec<u64> = held.iter().copied().step_by(5).collect();
    trim(&volume, &mut model, &trimmed, "a trim on a full volume");
    volume.flush().expect("flush");
    // The room they made takes new data.
    for &block in &trimmed[..trimmed.len() / 2] {
        assert!(write(&volume, &mut model, &mut prng, block), "a trim made room, yet block {block} was refused");
    }

    // Full again. A few trims take the room kept for records; new data must not spend it,
    // or the next trims find none.
    let empty: Vec<u64> = match refill {
        Refill::NewDataFirst => (0..logical_blocks).filter(|block| !model.contains_key(block)).collect(),
        Refill::RandomOverwrites => Vec::new(),
    };
    let refused = (0..6 * logical_blocks).find(|&step| {
        let block = empty.get(step as usize).copied().unwrap_or_else(|| prng.below(logical_blocks));
        !write(&volume, &mut model, &mut prng, block)
    });
    assert!(refused.is_some(), "the volume never filled again");
    let held: Vec<u64> = model.keys().copied().collect();
    trim(&volume, &mut model, &held[..3], "a few trims on a full volume");
    let empty: Vec<u64> = (0..logical_blocks).filter(|block| !model.contains_key(block)).collect();
    let accepted = empty.iter().take_while(|&&block| write(&volume, &mut model, &mut prng, block)).count();
    eprintln!("  new blocks accepted after three trims: {accepted}");
    let held: Vec<u64> = model.keys().copied().collect();
    let trimmed: Vec<u64> = held.iter().copied().skip(3).step_by(5).collect();
    trim(&volume, &mut model, &trimmed, "a trim after new data on a full volume");
    verify_contents(&volume, &model, logical_blocks, "after trims");
    volume.close().expect("close");

    let volume = Volume::open(members(&devices), &open_options(io_mode)).expect("reopen");
    verify_contents(&volume, &model, logical_blocks, "after reopen");
    let report = volume.check().expect("check");
    assert!(report.is_clean(), "{report:?}");
    volume.close().expect("close");
}

/// Write random data to `block`; `false` when the volume refuses it for space.
fn write(volume: &Volume, model: &mut Model, prng: &mut Prng, block: u64) -> bool {
    let mut data = vec![0u8; BLOCK_SIZE_BYTES];
    prng.fill(&mut data);
    match volume.write(block * BLOCK_BYTES, &data, false) {
        Ok(()) => {
            model.insert(block, data);
            true
        }
        Err(Error::OutOfSpace) => false,
        Err(error) => panic!("write {block}: {error}"),
    }
}

fn trim(volume: &Volume, model: &mut Model, blocks: &[u64], what: &str) {
    for &block in blocks {
        volume.trim(block * BLOCK_BYTES, BLOCK_BYTES).unwrap_or_else(|error| panic!("{what} ({block}): {error}"));
        model.remove(&block);
    }
}
