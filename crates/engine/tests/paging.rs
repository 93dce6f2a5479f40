//! The paged index (docs/index-and-checkpoints.md, "Paging"): a volume whose map
//! cache holds two index pages serves every block right — written, overwritten, trimmed,
//! after a checkpoint, a crash and a reopen — reading pages back from the log and evicting
//! them as it goes; a map cache larger than the machine is refused.

mod common;

use common::{members, memory_members, verify_contents as verify};
use std::collections::BTreeMap;
use stripelog_blockdev::Prng;
use stripelog_engine::index::map::PAGE_ENTRY_BYTES;
use stripelog_engine::layout::checkpoint::DIRECTORY_FANOUT;
use stripelog_engine::{CreateOptions, Error, IoMode, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};

const MEMBER_SIZE_BYTES: u64 = 24 << 20;
const CHUNK_SIZE_BYTES: u32 = 64 << 10;
const BLOCK_BYTES: u64 = BLOCK_SIZE_BYTES as u64;

fn create_options() -> CreateOptions {
    CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: CHUNK_SIZE_BYTES, ..CreateOptions::default() }
}

/// Two index pages in RAM at most; a checkpoint at every flush.
fn small_cache() -> OpenOptions {
    OpenOptions {
        flush_interval: None,
        io_mode: IoMode::Inline,
        cache_size_bytes: 0,
        checkpoint_interval: std::time::Duration::ZERO,
        map_cache_bytes: Some(2 * 4200),
        ..OpenOptions::default()
    }
}

/// Logical block → content (absent: reads zeros).
type Model = BTreeMap<u64, Vec<u8>>;

#[test]
fn a_map_cache_of_two_pages_serves_every_block_through_checkpoints_a_crash_and_a_reopen() {
    let devices = memory_members(4, MEMBER_SIZE_BYTES);
    let volume = Volume::create(members(&devices), &create_options(), &small_cache()).expect("create");
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let pages = logical_blocks.div_ceil(1000);
    assert!(pages >= 8, "the volume spans {pages} index pages: too few to page");
    let mut prng = Prng::new(20);
    let mut model = Model::new();
    // Every block written once, in runs, a flush (and a checkpoint) now and then.
    let run_blocks = 64;
    for first in (0..logical_blocks).step_by(run_blocks as usize) {
        let count = run_blocks.min(logical_blocks - first);
        let mut data = vec![0u8; (count * BLOCK_BYTES) as usize];
        prng.fill(&mut data);
        volume.write(first * BLOCK_BYTES, &data, false).expect("write");
        for (index, content) in data.chunks(BLOCK_SIZE_BYTES).enumerate() {
            model.insert(first + index as u64, content.to_vec());
        }
        if prng.below(8) == 0 {
            volume.flush().expect("flush");
        }
    }
    volume.flush().expect("flush");
    // Random overwrites and trims all over the volume: each touches a page that is
    // probably not in RAM.
    let mut overwrites = 0;
    for _ in 0..600 {
        let block = prng.below(logical_blocks);
        if prng.below(5) == 0 {
            volume.trim(block * BLOCK_BYTES, BLOCK_BYTES).expect("trim");
            model.remove(&block);
        } else {
            let mut data = vec![0u8; BLOCK_SIZE_BYTES];
            prng.fill(&mut data);
            volume.write(block * BLOCK_BYTES, &data, false).expect("overwrite");
            model.insert(block, data);
            overwrites += 1;
        }
        if prng.below(50) == 0 {
            volume.flush().expect("flush");
        }
    }
    volume.flush().expect("flush");
    verify(&volume, &model, logical_blocks, "after the overwrites");
    let stats = volume.stats();
    assert!(stats.map_page_loads > 0 && stats.map_page_evictions > 0, "nothing was paged: {stats:?}");
    assert!(
        stats.map_cache_used_bytes <= 4 * stats.map_cache_bytes,
        "{} of index pages in RAM for a cache of {}",
        stats.map_cache_used_bytes,
        stats.map_cache_bytes
    );
    assert_eq!(stats.blocks_mapped, model.len() as u64, "the counts follow the pages");
    // Where paging's time went (issue 57's counts): every page was created once, the
    // overwrites read pages back, checkpoints wrote the dirty ones (for dirty pages, the
    // cache holding two), and the cache ran over its bound only by pages waiting for one.
    let paging = &stats.paging;
    assert!(paging.pages_created > 1 && paging.pages_created <= pages, "each page is created once: {paging:?}");
    assert_eq!(paging.page_loads, stats.map_page_loads);
    assert!(paging.page_load_seconds > 0.0, "{paging:?}");
    assert!(paging.checkpoints_for_dirty_pages > 0, "{paging:?}");
    assert!(
        paging.checkpoint_index_pages > paging.pages_created,
        "every page was written by a checkpoint, some again: {paging:?}"
    );
    assert!(paging.checkpoint_seconds > 0.0 && paging.evictions_kept_dirty > 0, "{paging:?}");
    assert!(paging.resident_pages_maximum >= paging.cache_pages, "{paging:?}");
    // The clock passes a dirty page once, then leaves it out until a checkpoint takes it:
    // it never rescans every dirty page after every write (what made a small cache crawl).
    assert!(
        paging.evictions_kept_dirty <= paging.pages_created + paging.page_loads + paging.checkpoint_index_pages,
        "the evictor passed dirty pages again and again: {paging:?}"
    );
    assert_eq!(paging.client_blocks_written, logical_blocks + overwrites, "{paging:?}");
    // A crash: the mount starts from the last checkpoint, reading only the pages it needs.
    volume.abandon();
    let volume = Volume::open(members(&devices), &small_cache()).expect("reopen after the crash");
    let stats = volume.stats();
    assert_eq!(stats.blocks_mapped, model.len() as u64, "the counts come from the checkpoint");
    assert!(stats.map_cache_used_bytes <= 4 * stats.map_cache_bytes, "mount loaded every page: {stats:?}");
    verify(&volume, &model, logical_blocks, "after the crash");
    assert!(volume.check().expect("check").is_clean());
    volume.close().expect("close");
    // A cache that holds everything reads the same.
    let whole = OpenOptions { map_cache_bytes: None, ..small_cache() };
    let volume = Volume::open(members(&devices), &whole).expect("reopen with the default cache");
    verify(&volume, &model, logical_blocks, "with the default cache");
    volume.close().expect("close");
}

#[test]
fn a_map_cache_larger_than_the_machine_is_refused() {
    let devices = memory_members(4, MEMBER_SIZE_BYTES);
    let huge = OpenOptions { map_cache_bytes: Some(u64::MAX / 2), ..small_cache() };
    let error = Volume::create(members(&devices), &create_options(), &huge).err().expect("create refused");
    assert!(matches!(error, Error::InvalidRequest(_)), "{error}");
    assert!(error.to_string().contains("more than this machine's memory"), "{error}");
}

/// A checkpoint writes the directory pages above the pages it writes, and keeps the
/// others (docs/index-and-checkpoints.md, "Directory pages are written when they change"):
/// on a thin volume of a few thousand index pages, a checkpoint after one block changed
/// writes the directory page above it, not every non-empty one; the kept copies serve a
/// mount after a crash and a clean reopen, and `check` counts them live. It also writes
/// the segment table pages whose records changed, not every page.
#[test]
fn a_checkpoint_writes_only_the_directory_pages_above_what_changed() {
    const THIN_LOGICAL_BYTES: u64 = 32 << 30;
    let devices = memory_members(3, 64 << 20);
    let create = CreateOptions {
        raid_level: RaidLevel::Raid5,
        chunk_size_bytes: 1 << 20,
        logical_size_bytes: Some(THIN_LOGICAL_BYTES),
        ..CreateOptions::default()
    };
    let options = OpenOptions {
        flush_interval: None,
        io_mode: IoMode::Inline,
        cache_size_bytes: 0,
        checkpoint_interval: std::time::Duration::ZERO,
        ..OpenOptions::default()
    };
    let volume = Volume::create(members(&devices), &create, &options).expect("create");
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let entries_per_page = (PAGE_ENTRY_BYTES as u64 * 8) / volume.stats().index_entry_bits as u64;
    let leaves = logical_blocks.div_ceil(entries_per_page).div_ceil(DIRECTORY_FANOUT as u64);
    assert!(leaves >= 5, "{leaves} directory pages above the index pages: too few to tell");
    let mut prng = Prng::new(57);
    let mut model = Model::new();
    let mut write = |volume: &Volume, block: u64, model: &mut Model| {
        let mut data = vec![0u8; BLOCK_SIZE_BYTES];
        prng.fill(&mut data);
        volume.write(block * BLOCK_BYTES, &data, false).expect("write");
        model.insert(block, data);
    };
    let directory_pages = |volume: &Volume| volume.stats().paging.checkpoint_directory_pages;
    let table_pages = |volume: &Volume| volume.stats().paging.checkpoint_table_pages;
    // A block below every directory page of level 1.
    let span = entries_per_page * DIRECTORY_FANOUT as u64;
    for leaf in 0..leaves {
        write(&volume, (leaf * span + 7).min(logical_blocks - 1), &mut model);
    }
    volume.flush().expect("flush");
    let (before, tables_before) = (directory_pages(&volume), table_pages(&volume));
    // One block below the first: its directory page and the one above it are written.
    write(&volume, 11, &mut model);
    volume.flush().expect("flush");
    let written = directory_pages(&volume) - before;
    // (The index tree's depth here is 1: the page above; a segment table tree's at most.)
    assert!(
        (1..=2).contains(&written),
        "a checkpoint wrote {written} directory pages for one changed index page, of {leaves} non-empty ones"
    );
    let tables = table_pages(&volume) - tables_before;
    assert!(tables <= 2, "a checkpoint wrote {tables} segment table pages for one batch");
    // A crash, then a mount from that checkpoint: the kept pages name what they named.
    write(&volume, 3 * span + 9, &mut model);
    volume.flush().expect("flush");
    volume.abandon();
    let volume = Volume::open(members(&devices), &options).expect("reopen after the crash");
    verify(&volume, &model, logical_blocks, "after the crash");
    assert!(volume.check().expect("check").is_clean(), "check after the crash");
    write(&volume, 2 * span + 1, &mut model);
    volume.close().expect("close");
    let volume = Volume::open(members(&devices), &options).expect("reopen");
    verify(&volume, &model, logical_blocks, "after a clean close");
    assert!(volume.check().expect("check").is_clean(), "check after the reopen");
    volume.close().expect("close");
}

/// A server runs a write on the thread that read it only when no index page must be read
/// first (`Volume::index_pages_resident`): true for pages in RAM and pages never written,
/// false for a page only in the log and for a range beyond the volume.
#[test]
fn a_write_says_whether_its_index_pages_must_be_read_first() {
    let devices = memory_members(4, MEMBER_SIZE_BYTES);
    let volume = Volume::create(members(&devices), &create_options(), &small_cache()).expect("create");
    let size = volume.logical_size_bytes();
    let logical_blocks = size / BLOCK_BYTES;
    // Nothing written: no page to read.
    assert!(volume.index_pages_resident(0, size), "a volume never written has no page to read");
    assert!(!volume.index_pages_resident(size - BLOCK_BYTES, 2 * BLOCK_BYTES), "beyond the volume");
    assert!(!volume.index_pages_resident(u64::MAX - BLOCK_BYTES, 2 * BLOCK_BYTES), "beyond u64");
    let data = vec![0x5au8; 64 * BLOCK_SIZE_BYTES];
    for first in (0..logical_blocks).step_by(64) {
        let count = 64.min(logical_blocks - first);
        volume.write(first * BLOCK_BYTES, &data[..(count * BLOCK_BYTES) as usize], false).expect("write");
    }
    // The checkpoint at the flush writes every page; eviction leaves two or so in RAM.
    volume.flush().expect("flush");
    let out_of_ram: Vec<u64> = (0..logical_blocks)
        .step_by(1000)
        .filter(|&block| !volume.index_pages_resident(block * BLOCK_BYTES, BLOCK_BYTES))
        .collect();
    assert!(out_of_ram.len() >= 4, "most pages left RAM: only {out_of_ram:?} did");
    assert!(!volume.index_pages_resident(0, size), "the whole volume spans pages only in the log");
    // Reading a block loads its page: a write there then needs no read.
    let block = out_of_ram[out_of_ram.len() / 2];
    let mut out = vec![0u8; BLOCK_SIZE_BYTES];
    volume.read(block * BLOCK_BYTES, &mut out).expect("read");
    assert_eq!(out, data[..BLOCK_SIZE_BYTES], "block {block}");
    assert!(volume.index_pages_resident(block * BLOCK_BYTES, BLOCK_BYTES), "block {block}'s page was just read");
    assert!(volume.index_pages_resident(block * BLOCK_BYTES + 512, 1024), "a partial block in the same page");
    volume.close().expect("close");
}

/// The cleaner loads the index pages of the records it moves several at once, ahead of
/// its lookups (`BlockMap::load_pages_of`): on a threaded volume whose map cache holds a
/// few of its pages, random overwrites of a full volume make it clean segments whose
/// blocks lie on many pages; it loads them ahead, and every block reads back right.
#[test]
fn the_cleaner_loads_the_pages_of_the_records_it_moves_ahead() {
    let devices = memory_members(4, 64 << 20);
    let open = OpenOptions { io_mode: IoMode::Threaded, map_cache_bytes: Some(8 * 4200), ..small_cache() };
    let volume = Volume::create(members(&devices), &create_options(), &open).expect("create");
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    assert!(logical_blocks.div_ceil(1000) >= 24, "{logical_blocks} blocks: too few pages for a cache of 8");
    let mut prng = Prng::new(57);
    let mut model = Model::new();
    let mut data = vec![0u8; 64 * BLOCK_SIZE_BYTES];
    for first in (0..logical_blocks).step_by(64) {
        let count = 64.min(logical_blocks - first);
        prng.fill(&mut data);
        volume.write(first * BLOCK_BYTES, &data[..(count * BLOCK_BYTES) as usize], false).expect("write");
        for (index, content) in data.chunks(BLOCK_SIZE_BYTES).take(count as usize).enumerate() {
            model.insert(first + index as u64, content.to_vec());
        }
    }
    for round in 0..2 * logical_blocks {
        let block = prng.below(logical_blocks);
        let mut content = vec![0u8; BLOCK_SIZE_BYTES];
        prng.fill(&mut content);
        volume.write(block * BLOCK_BYTES, &content, false).expect("overwrite");
        model.insert(block, content);
        if round % 4096 == 0 {
            volume.flush().expect("flush");
        }
    }
    volume.flush().expect("flush");
    let stats = volume.stats();
    assert!(stats.segments_cleaned > 0, "the overwrites made the cleaner run: {stats:?}");
    let paging = &stats.paging;
    assert!(paging.pages_loaded_ahead > 0, "the cleaner loaded no page ahead: {paging:?}");
    assert!(paging.pages_loaded_ahead <= paging.page_loads, "pages loaded ahead are loads: {paging:?}");
    verify(&volume, &model, logical_blocks, "after cleaning");
    assert!(volume.check().expect("check").is_clean());
    volume.close().expect("close");
}
