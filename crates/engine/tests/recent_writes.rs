//! The cache of recent writes: the data sets of written client batches stay in the
//! buffer pool and serve reads of their rows until they are lent again, oldest first
//! (ARCHITECTURE.md, `io::cache` and the invariant "The cache can never serve a stale
//! block").

mod common;

use common::{members, memory_members};
use std::collections::BTreeMap;
use stripelog_blockdev::Prng;
use stripelog_engine::{CreateOptions, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};

const BLOCK_BYTES: u64 = BLOCK_SIZE_BYTES as u64;

/// Write `blocks` (each a fresh random content), flush, and note them in `model`.
fn write_blocks(volume: &Volume, prng: &mut Prng, blocks: std::ops::Range<u64>, model: &mut BTreeMap<u64, Vec<u8>>) {
    for block in blocks {
        let mut content = vec![0u8; BLOCK_SIZE_BYTES];
        prng.fill(&mut content);
        volume.write(block * BLOCK_BYTES, &content, false).expect("write");
        model.insert(block, content);
    }
    volume.flush().expect("flush");
}

/// Read `blocks`, check them against `model`, and return how many came from recent writes.
fn read_blocks(volume: &Volume, blocks: std::ops::Range<u64>, model: &BTreeMap<u64, Vec<u8>>) -> u64 {
    let before = volume.stats().reads_from_recent_writes;
    let mut content = vec![0u8; BLOCK_SIZE_BYTES];
    for block in blocks {
        volume.read(block * BLOCK_BYTES, &mut content).expect("read");
        assert!(content == model[&block], "block {block} does not hold what was written");
    }
    volume.stats().reads_from_recent_writes - before
}

fn volume(devices: &[std::sync::Arc<dyn stripelog_blockdev::BlockDevice>], cache_size_bytes: u64) -> Volume {
    let create = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..CreateOptions::default() };
    let open = OpenOptions { cache_size_bytes, ..common::inline_open_options() };
    Volume::create(members(devices), &create, &open).expect("create")
}

#[test]
fn recent_writes_are_read_from_their_batches_until_newer_writes_take_the_sets() {
    // 4 MiB of cache: half of it holds 10 data sets of 3 × 64 KiB (1 440 block places).
    let devices = memory_members(4, 16 << 20);
    let volume = volume(&devices, 4 << 20);
    assert_eq!(volume.stats().cache_memory_bytes, 4 << 20);
    let (mut prng, mut model) = (Prng::new(24), BTreeMap::new());
    write_blocks(&volume, &mut prng, 0..200, &mut model);
    assert_eq!(read_blocks(&volume, 0..200, &model), 200, "just written and flushed: all from memory");
    // Far more than the kept sets hold: the first blocks' sets are lent again, and their
    // reads go to the members; the last ones written are still in memory.
    write_blocks(&volume, &mut prng, 200..4_000, &mut model);
    assert_eq!(read_blocks(&volume, 0..200, &model), 0, "sets lent again must not serve old rows");
    assert_eq!(read_blocks(&volume, 3_800..4_000, &model), 200);
    // Overwritten blocks read their new content (the old rows, still kept, are dead).
    write_blocks(&volume, &mut prng, 3_900..3_950, &mut model);
    assert_eq!(read_blocks(&volume, 3_900..3_950, &model), 50);
    volume.close().expect("close");
    // After a reopen nothing is kept: every read goes to the members, and matches.
    let open = OpenOptions { cache_size_bytes: 4 << 20, ..common::inline_open_options() };
    let volume = Volume::open(members(&devices), &open).expect("open");
    assert_eq!(read_blocks(&volume, 0..4_000, &model), 0);
    volume.close().expect("close");
}

#[test]
fn without_a_cache_nothing_is_kept() {
    let devices = memory_members(4, 16 << 20);
    let volume = volume(&devices, 0);
    assert_eq!(volume.stats().cache_memory_bytes, 0);
    let (mut prng, mut model) = (Prng::new(25), BTreeMap::new());
    write_blocks(&volume, &mut prng, 0..200, &mut model);
    assert_eq!(read_blocks(&volume, 0..200, &model), 0);
    volume.close().expect("close");
}
