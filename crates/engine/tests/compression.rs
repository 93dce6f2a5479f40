//! Compression end to end in the engine (docs/compression.md): compressible blocks, and
//! units of up to 4 blocks written together, are stored as fragments packed to the byte
//! (continuing into the next packed block), incompressible ones whole, and every
//! block reads back as written — from the open batch, from the members, after the cleaner
//! moved its fragment, after a reopen from the checkpoint and after a mount by scan, and
//! when the member holding its packed block rotted.

mod common;

use common::inline_open_options as open_options;

use common::{members, memory_members, verify_contents};
use std::collections::BTreeMap;
use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, Prng};
use stripelog_engine::format::CompressionSetting;
use stripelog_engine::{CreateOptions, Mapping, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};

const BLOCK_BYTES: u64 = BLOCK_SIZE_BYTES as u64;

fn compressed_volume(devices: &[Arc<dyn BlockDevice>]) -> Volume {
    let create_options = CreateOptions {
        raid_level: RaidLevel::Raid5,
        chunk_size_bytes: 64 << 10,
        spare_ppm: 250_000,
        compression: CompressionSetting::Lz4,
        ..CreateOptions::default()
    };
    Volume::create(members(devices), &create_options, &open_options()).expect("create")
}

/// A block of which `random_bytes` are random and the rest a pattern LZ4 shrinks to
/// almost nothing (all random: incompressible).
fn block_with(prng: &mut Prng, random_bytes: usize) -> Vec<u8> {
    let mut data = vec![0u8; BLOCK_SIZE_BYTES];
    prng.fill(&mut data[..random_bytes]);
    for (index, byte) in data[random_bytes..].iter_mut().enumerate() {
        *byte = (index / 16) as u8 | 1;
    }
    data
}

/// Every logical block reads as the model says (absent: zeros), and the map's counts agree.
fn verify(volume: &Volume, model: &BTreeMap<u64, Vec<u8>>, logical_blocks: u64, when: &str) {
    verify_contents(volume, model, logical_blocks, when);
    let stats = volume.stats();
    assert_eq!(stats.blocks_mapped, model.len() as u64, "{when}: logical blocks holding data");
}

/// Ten times the logical size in writes of compressible, incompressible and zero blocks,
/// and trims, on a small volume: the cleaner moves fragments all the time. Everything
/// reads back as written, before and after a reopen from the checkpoint, a read-only mount
/// by scan of every segment, and `check` finds the volume clean.
#[test]
fn fragments_survive_cleaning_reopen_and_scan() {
    let devices = memory_members(3, 4 << 20);
    let volume = compressed_volume(&devices);
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let mut prng = Prng::new(22);
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for step in 0..logical_blocks * 10 {
        let first = prng.below(logical_blocks);
        match prng.below(20) {
            0 => {
                volume.trim(first * BLOCK_BYTES, BLOCK_BYTES).expect("trim");
                model.remove(&first);
            }
            1 => {
                volume.write(first * BLOCK_BYTES, &[0u8; BLOCK_SIZE_BYTES], false).expect("zeros");
                model.remove(&first);
            }
            choice @ 5..=8 => {
                // A run of blocks written together: compressed in units of up to 4 that
                // start at multiples of 4, whose fragments continue into the next packed
                // blocks; later single-block writes overwrite blocks inside units.
                let count = (2 + prng.below(7)).min(logical_blocks - first);
                let mut data = Vec::with_capacity(count as usize * BLOCK_SIZE_BYTES);
                for _ in 0..count {
                    let random_bytes = if choice == 5 { 64 + prng.below(400) } else { 64 + prng.below(2400) };
                    data.extend(block_with(&mut prng, random_bytes as usize));
                }
                volume.write(first * BLOCK_BYTES, &data, false).expect("write a run");
                for (place, block) in data.chunks_exact(BLOCK_SIZE_BYTES).enumerate() {
                    model.insert(first + place as u64, block.to_vec());
                }
            }
            choice => {
                // Mostly compressible (fragments of 100 to 2 600 bytes), some not at all.
                let random_bytes = if choice < 5 { BLOCK_SIZE_BYTES } else { 64 + prng.below(2400) as usize };
                let data = block_with(&mut prng, random_bytes);
                if choice == 19 {
                    // An older version in the same packed block: reads and the cleaner
                    // must take the newer one (the last of the block's fragments).
                    volume.write(first * BLOCK_BYTES, &block_with(&mut prng, 200), false).expect("write");
                }
                volume
                    .write(first * BLOCK_BYTES, &data, false)
                    .unwrap_or_else(|error| panic!("write {step} of {}: {error}", logical_blocks * 10));
                model.insert(first, data);
            }
        }
        if step % 499 == 0 {
            // Reads of blocks still in the open batch's packed block, too.
            verify(&volume, &model, logical_blocks.min(64), "while writing");
            volume.flush().expect("flush");
        }
    }
    volume.flush().expect("flush");
    let stats = volume.stats();
    let compression = stats.compression.clone().expect("a volume created with compression reports it");
    assert!(stats.cleaning_rounds > 20, "the cleaner ran only {} rounds", stats.cleaning_rounds);
    assert!(compression.fragment_blocks > model.len() as u64 / 2, "{compression:?}");
    assert!(compression.ratio > 1.4, "ratio {:.2}: fragments are not packed", compression.ratio);
    assert!(compression.blocks_whole_incompressible > 0, "{compression:?}");
    verify(&volume, &model, logical_blocks, "after cleaning");
    volume.close().expect("close");

    let volume = Volume::open(members(&devices), &open_options()).expect("reopen");
    verify(&volume, &model, logical_blocks, "after reopening");
    let report = volume.check().expect("check");
    assert!(report.is_clean(), "{report:?}");
    assert!(report.fragments_checked >= model.len() as u64 / 2, "check decompresses every fragment: {report:?}");
    assert_eq!(volume.compression().0, CompressionSetting::Lz4, "the setting is kept");
    volume.close().expect("close");

    let scan = OpenOptions { read_only: true, mount_by_scan: true, ..open_options() };
    let volume = Volume::open(members(&devices), &scan).expect("mount by scan");
    verify(&volume, &model, logical_blocks, "after a mount by scan");
}

/// A packed block whose member rotted is rebuilt from parity: the fragments in it read
/// back as written. The setting turns off and on while open and holds across a reopen;
/// a volume created without compression cannot turn it on.
#[test]
fn rotted_packed_blocks_are_rebuilt_and_the_setting_changes() {
    let devices = memory_members(3, 4 << 20);
    let volume = compressed_volume(&devices);
    let mut prng = Prng::new(5);
    let data: Vec<Vec<u8>> = (0..40).map(|_| block_with(&mut prng, 300)).collect();
    for (block, content) in data.iter().enumerate() {
        volume.write(block as u64 * BLOCK_BYTES, content, false).expect("write");
    }
    volume.flush().expect("flush");
    let Ok(Mapping::Fragment { position, sixteenths }) = volume.mapping(7) else {
        panic!("block 7 should be a fragment: {:?}", volume.mapping(7));
    };
    assert!(sixteenths <= 5, "a 300-byte-random block takes {sixteenths} sixteenths");
    let shared = (0..40).filter(|&block| volume.mapping(block).ok().and_then(|m| m.position()) == Some(position));
    assert!(shared.count() >= 3, "a packed block holds several fragments");
    let geometry = volume.geometry().clone();
    let location = geometry.locate(position);
    let member = geometry.members_of_column(location.segment, location.column)[0];
    let offset = geometry.member_offset_bytes(location.segment, location.row);
    let mut packed_block = stripelog_blockdev::AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    devices[member].read_at(&mut packed_block, offset).expect("read");
    assert_eq!(&packed_block[..4], b"SLPK", "the position holds a packed block");
    packed_block[100] ^= 0x40;
    devices[member].write_at(&packed_block, offset).expect("rot");
    let mut content = vec![0u8; BLOCK_SIZE_BYTES];
    for (block, expected) in data.iter().enumerate() {
        volume.read(block as u64 * BLOCK_BYTES, &mut content).expect("read");
        assert!(content == *expected, "block {block} after rot");
    }
    assert!(volume.stats().reconstructed_blocks > 0, "the rotted packed block was rebuilt");

    volume.set_compression(CompressionSetting::Off).expect("off");
    let before = volume.stats().compression.expect("status").fragment_blocks;
    volume.write(100 * BLOCK_BYTES, &data[0], false).expect("write");
    assert!(matches!(volume.mapping(100), Ok(Mapping::Data { .. })), "stored whole with compression off");
    assert_eq!(volume.stats().compression.expect("status").fragment_blocks, before);
    volume.close().expect("close");
    let volume = Volume::open(members(&devices), &open_options()).expect("reopen");
    assert_eq!(volume.compression().0, CompressionSetting::Off, "the superblocks keep the setting");
    volume.set_compression(CompressionSetting::Lz4).expect("on again");
    volume.write(101 * BLOCK_BYTES, &data[0], false).expect("write");
    assert!(matches!(volume.mapping(101), Ok(Mapping::Fragment { .. })));
    volume.close().expect("close");

    let plain = memory_members(3, 4 << 20);
    let create_options =
        CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..CreateOptions::default() };
    let volume = Volume::create(members(&plain), &create_options, &open_options()).expect("create");
    let refused = volume.set_compression(CompressionSetting::Lz4).expect_err("no fragments on this volume");
    assert!(refused.to_string().contains("created without compression"), "{refused}");
    assert!(volume.stats().compression.is_none());
}

/// Units written whole, then overwritten block by block at random, many times the volume's
/// size: the cleaner must repack the units whose other blocks died (decompress, zero the
/// dead blocks, compress again), or their dead bytes travel with every move until the
/// volume runs out of space. Everything reads back as written.
#[test]
fn units_overwritten_block_by_block_are_repacked_by_the_cleaner() {
    let devices = memory_members(3, 4 << 20);
    let volume = compressed_volume(&devices);
    let logical_blocks = volume.logical_size_bytes() / BLOCK_BYTES;
    let mut prng = Prng::new(24);
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let run = 16u64;
    for first in (0..logical_blocks).step_by(run as usize) {
        let count = run.min(logical_blocks - first);
        let mut data = Vec::new();
        for place in 0..count {
            let block = block_with(&mut prng, 900);
            model.insert(first + place, block.clone());
            data.extend(block);
        }
        volume.write(first * BLOCK_BYTES, &data, false).expect("fill");
    }
    for step in 0..logical_blocks * 20 {
        let block = prng.below(logical_blocks);
        let data = block_with(&mut prng, 900);
        volume
            .write(block * BLOCK_BYTES, &data, false)
            .unwrap_or_else(|error| panic!("overwrite {step} of {}: {error}", logical_blocks * 20));
        model.insert(block, data);
    }
    volume.flush().expect("flush");
    assert!(volume.stats().cleaning_rounds > 20, "the cleaner ran");
    verify(&volume, &model, logical_blocks, "after overwriting units block by block");
    let report = volume.check().expect("check");
    assert!(report.is_clean(), "{report:?}");
}
