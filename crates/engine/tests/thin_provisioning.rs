//! Thin provisioning (docs/deduplication.md, decision 10): a volume whose logical size is
//! four times what it may hold accepts new data up to its provisioned size, then refuses
//! writes that would hold more with ENOSPC while overwrites, zero writes and trims go on;
//! trimming frees room for new writes; nothing accepted is harmed, across the cleaner and
//! a reopen.

mod common;

use common::{members, memory_members, verify_contents};
use std::collections::BTreeMap;
use stripelog_blockdev::Prng;
use stripelog_engine::{CreateOptions, Error, IoMode, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};

const BLOCK_BYTES: u64 = BLOCK_SIZE_BYTES as u64;

fn open_options() -> OpenOptions {
    OpenOptions { flush_interval: None, io_mode: IoMode::Inline, cache_size_bytes: 0, ..OpenOptions::default() }
}

#[test]
fn a_thin_volume_fills_to_its_provisioned_size_and_trims_make_room() {
    let devices = memory_members(3, 16 << 20);
    let plain = Volume::create(
        members(&devices),
        &CreateOptions { chunk_size_bytes: 64 << 10, spare_ppm: 250_000, force: true, ..CreateOptions::default() },
        &open_options(),
    )
    .expect("create a plain volume to learn the provisioned size");
    let provisioned_blocks = plain.logical_size_bytes() / BLOCK_BYTES;
    assert!(plain.stats().thin_provisioning.is_none());
    plain.close().expect("close");

    let logical_blocks = 4 * provisioned_blocks;
    let options = CreateOptions {
        raid_level: RaidLevel::Raid5,
        chunk_size_bytes: 64 << 10,
        spare_ppm: 250_000,
        force: true,
        logical_size_bytes: Some(logical_blocks * BLOCK_BYTES),
        ..CreateOptions::default()
    };
    let volume = Volume::create(members(&devices), &options, &open_options()).expect("create thin");
    assert_eq!(volume.logical_size_bytes(), logical_blocks * BLOCK_BYTES);
    let thin = volume.stats().thin_provisioning.expect("thin status");
    assert_eq!(thin.provisioned_size_bytes, provisioned_blocks * BLOCK_BYTES);

    // New blocks spread over the whole logical size until the volume refuses one.
    let mut prng = Prng::new(23);
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut data = vec![0u8; BLOCK_SIZE_BYTES];
    let mut refused = None;
    for index in 0..logical_blocks {
        let block = (index * 7919) % logical_blocks;
        prng.fill(&mut data);
        match volume.write(block * BLOCK_BYTES, &data, false) {
            Ok(()) => {
                model.insert(block, data.clone());
            }
            Err(error) => {
                refused = Some((block, error));
                break;
            }
        }
    }
    let (refused_block, error) = refused.expect("the thin volume refused a write");
    assert!(matches!(error, Error::ThinLimit { .. }), "{error}");
    assert_eq!(error.errno(), 28, "ENOSPC");
    assert_eq!(model.len() as u64, provisioned_blocks, "it held exactly its provisioned size");
    let thin = volume.stats().thin_provisioning.expect("thin status");
    assert_eq!(thin.held_data_bytes, provisioned_blocks * BLOCK_BYTES);
    assert!((thin.used_fraction - 1.0).abs() < 1e-9);

    // Full: overwrites (the cleaner makes room for them) and zero writes go on.
    let written: Vec<u64> = model.keys().copied().collect();
    for round in 0..3 {
        for &block in written.iter().skip(round).step_by(3) {
            prng.fill(&mut data);
            volume.write(block * BLOCK_BYTES, &data, false).expect("overwrite at the limit");
            model.insert(block, data.clone());
        }
    }
    volume.write_zeroes(refused_block * BLOCK_BYTES, BLOCK_BYTES, false).expect("zeros cost no data");
    assert!(matches!(volume.write(refused_block * BLOCK_BYTES, &data, false), Err(Error::ThinLimit { .. })));

    // Trims free room for exactly as many new blocks.
    for &block in &written[..100] {
        volume.trim(block * BLOCK_BYTES, BLOCK_BYTES).expect("trim");
        model.remove(&block);
    }
    let unwritten: Vec<u64> = (0..logical_blocks).filter(|block| !model.contains_key(block)).take(101).collect();
    for &block in &unwritten[..100] {
        prng.fill(&mut data);
        volume.write(block * BLOCK_BYTES, &data, false).expect("a trim made room");
        model.insert(block, data.clone());
    }
    assert!(matches!(volume.write(unwritten[100] * BLOCK_BYTES, &data, false), Err(Error::ThinLimit { .. })));
    verify_contents(&volume, &model, logical_blocks, "full");
    volume.close().expect("close");

    let volume = Volume::open(members(&devices), &open_options()).expect("reopen");
    assert_eq!(volume.logical_size_bytes(), logical_blocks * BLOCK_BYTES, "the logical size is the volume's own");
    verify_contents(&volume, &model, logical_blocks, "after reopen");
    assert!(matches!(volume.write(unwritten[100] * BLOCK_BYTES, &data, false), Err(Error::ThinLimit { .. })));
    let report = volume.check().expect("check");
    assert!(report.is_clean(), "{report:?}");
    volume.close().expect("close");
}

/// A logical size that is not a whole number of blocks is refused, and named.
#[test]
fn a_bad_logical_size_is_refused() {
    let devices = memory_members(3, 16 << 20);
    let options =
        CreateOptions { chunk_size_bytes: 64 << 10, logical_size_bytes: Some(5000), ..CreateOptions::default() };
    let error = Volume::create(members(&devices), &options, &open_options()).err().expect("refused");
    assert!(error.to_string().contains("multiple of 4096"), "{error}");
}
