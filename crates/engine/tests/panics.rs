//! A bug stops the volume, never spreads (ARCHITECTURE.md, "Invariants"): a panic inside
//! the write path, with the write lock held and a request half accepted (the fault hook
//! `OpenOptions::fault_panic_after_accepted_blocks`), comes back to the caller as
//! `ShutDown(Panicked)`; from then on every request — reads too — gets that error, nothing
//! more is written, and the next open recovers an ordered prefix of the writes that holds
//! every one flushed before, as after a crash.

mod common;

use std::sync::Arc;
use stripelog_engine::error::Shutdown;
use stripelog_engine::{CreateOptions, Error, IoMode, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};

const BLOCK: usize = BLOCK_SIZE_BYTES;
/// Blocks written and flushed before the fault.
const FLUSHED_BLOCKS: u64 = 24;
/// Blocks of the request the fault strikes in the middle of.
const STRUCK_BLOCKS: u64 = 32;
/// The fault fires with the write lock held after this many accepted blocks: the 11th
/// block of the struck request.
const FAULT_AFTER_BLOCKS: u64 = FLUSHED_BLOCKS + 11;

fn content(block: u64) -> Vec<u8> {
    (0..BLOCK).map(|index| (block as usize * 31 + index * 7) as u8 | 1).collect()
}

fn is_stopped_by_a_bug(result: &stripelog_engine::Result<()>) -> bool {
    matches!(result, Err(Error::ShutDown(Shutdown::Panicked { .. })))
}

fn panic_stops_the_volume(io_mode: IoMode) {
    let devices = common::memory_members(5, 16 << 20);
    let create = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
    let options = |fault: Option<u64>| OpenOptions {
        io_mode,
        flush_interval: None,
        fault_panic_after_accepted_blocks: fault,
        ..OpenOptions::default()
    };
    let volume = Arc::new(
        Volume::create(common::members(&devices), &create, &options(Some(FAULT_AFTER_BLOCKS))).expect("create"),
    );
    let flushed: Vec<u8> = (0..FLUSHED_BLOCKS).flat_map(content).collect();
    volume.write(0, &flushed, false).expect("the writes before the fault");
    volume.flush().expect("flush before the fault");
    // A reader on another thread, as a server's other connection would be.
    let reader = {
        let volume = volume.clone();
        std::thread::spawn(move || {
            let mut buffer = vec![0u8; BLOCK];
            loop {
                match volume.read(0, &mut buffer) {
                    Ok(()) => assert_eq!(buffer, content(0), "a read before the volume stopped"),
                    Err(error) => return error,
                }
                std::thread::yield_now();
            }
        })
    };
    let struck: Vec<u8> = (FLUSHED_BLOCKS..FLUSHED_BLOCKS + STRUCK_BLOCKS).flat_map(content).collect();
    let result = volume.write(FLUSHED_BLOCKS * BLOCK as u64, &struck, false);
    assert!(is_stopped_by_a_bug(&result), "{io_mode:?}: the struck write gets the panic as its error: {result:?}");
    assert!(volume.stopped_by_panic());
    // The reader may see the stop between the unwinding (which stops the volume as it
    // passes the write lock, its message not yet known) and the catch (which tells the
    // message): either telling is the panic.
    let reader_error = reader.join().expect("the reader thread ends");
    assert!(
        matches!(reader_error, Error::ShutDown(Shutdown::Panicked { ref message, .. })
            if message.contains("fault hook") || message.contains("unwinding through the write lock")),
        "{io_mode:?}: the other thread's reads get the panic too: {reader_error}"
    );
    // Nothing is served or written from the half-changed state.
    let mut buffer = vec![0u8; BLOCK];
    assert!(is_stopped_by_a_bug(&volume.read(0, &mut buffer)), "a read after the panic");
    assert!(is_stopped_by_a_bug(&volume.write(0, &content(0), false)), "a write after the panic");
    assert!(is_stopped_by_a_bug(&volume.flush()), "a flush after the panic");
    let stats = volume.stats();
    assert!(stats.failure.as_deref().is_some_and(|failure| failure.contains("fault hook")), "{:?}", stats.failure);
    let volume = Arc::into_inner(volume).expect("the reader has ended");
    assert!(volume.close().is_err(), "closing a volume a bug stopped writes nothing and says so");

    // The next open recovers as after a crash: the flushed writes, and an ordered prefix of
    // the struck request's blocks (each whole or absent, in order).
    let volume = Volume::open(common::members(&devices), &options(None)).expect("open after the panic");
    assert!(volume.stats().recovery.checkpoint_generation.is_some());
    for block in 0..FLUSHED_BLOCKS {
        volume.read(block * BLOCK as u64, &mut buffer).expect("read a flushed block");
        assert_eq!(buffer, content(block), "{io_mode:?}: flushed block {block} after the panic");
    }
    let mut kept = 0;
    for block in FLUSHED_BLOCKS..FLUSHED_BLOCKS + STRUCK_BLOCKS {
        volume.read(block * BLOCK as u64, &mut buffer).expect("read a struck block");
        if buffer == content(block) {
            assert_eq!(block, FLUSHED_BLOCKS + kept, "{io_mode:?}: block {block} kept after a lost one");
            kept += 1;
        } else {
            assert!(buffer.iter().all(|&byte| byte == 0), "{io_mode:?}: block {block} is neither written nor zero");
        }
    }
    assert!(kept <= FAULT_AFTER_BLOCKS - FLUSHED_BLOCKS, "more kept than was accepted before the panic");
    let report = volume.check().expect("check after the panic");
    assert!(report.is_clean(), "{io_mode:?}: {report:?}");
    volume.write(0, &content(7), false).expect("the recovered volume takes writes");
    volume.close().expect("close");
}

#[test]
fn a_panic_in_the_write_path_stops_an_inline_volume_and_the_next_open_recovers() {
    panic_stops_the_volume(IoMode::Inline);
}

#[test]
fn a_panic_in_the_write_path_stops_a_threaded_volume_and_the_next_open_recovers() {
    panic_stops_the_volume(IoMode::Threaded);
}
