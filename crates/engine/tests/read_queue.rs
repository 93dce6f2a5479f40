//! `Volume::read_queue`: many reads in flight from one thread through io_uring on file
//! members, each returning exactly what `Volume::read` returns for the same range — from
//! the members, from memory (writes not yet flushed), zeros and trimmed blocks, reads that
//! cross blocks and start inside one, and a block whose member copy rotted (its checksum
//! fails on the ring's read, and the single-read path rebuilds it from its row). After a
//! reopen with room for few checksum tables, the tables are read through the ring too
//! (the summaries of a segment one after the other, while other reads go on), and a rotten
//! summary sends its table's load to the single-read path, which rebuilds it. With room
//! for two index pages the map's pages are read through the ring as well, and a rotten
//! page copy is rebuilt by the single-read path.
mod common;

use std::path::PathBuf;
use std::sync::Arc;
use stripelog_blockdev::{AlignedBuffer, BlockDevice, FileDevice, FileDeviceOptions, Prng};
use stripelog_engine::{CreateOptions, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};

const MEMBER_BYTES: u64 = 16 << 20;
const QUEUE_DEPTH: usize = 16;

struct Directory(PathBuf);

impl Drop for Directory {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A RAID-5 volume on five file members of `MEMBER_BYTES` in a new directory under the
/// system's temporary one (removed when the `Directory` is dropped), opened with no block
/// cache: every block not in a batch comes from a member.
fn new_volume(name: &str) -> (Directory, Vec<Arc<dyn BlockDevice>>, Volume) {
    let directory = Directory(std::env::temp_dir().join(format!("{name}-{}", std::process::id())));
    std::fs::create_dir_all(&directory.0).expect("directory");
    let device_options = FileDeviceOptions { create_size_bytes: Some(MEMBER_BYTES), ..FileDeviceOptions::default() };
    let devices: Vec<Arc<dyn BlockDevice>> = (0..5)
        .map(|index| {
            Arc::new(FileDevice::open(&directory.0.join(format!("m{index}")), &device_options).expect("open"))
                as Arc<dyn BlockDevice>
        })
        .collect();
    let create = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..CreateOptions::default() };
    let open = OpenOptions { cache_size_bytes: 0, ..OpenOptions::default() };
    let volume = Volume::create(common::members(&devices), &create, &open).expect("create");
    (directory, devices, volume)
}

/// Every read of `reads` through a queue of `QUEUE_DEPTH` against `Volume::read`.
fn compare_queued_with_plain(volume: &Volume, reads: &[(u64, usize)], when: &str) {
    let mut queue = volume.read_queue(QUEUE_DEPTH);
    let mut next = 0;
    let mut done = 0;
    while done < reads.len() {
        while next < reads.len() && queue.in_flight() < QUEUE_DEPTH {
            let (offset, length) = reads[next];
            // A buffer larger than the read: only its start is read into.
            queue.submit(next as u64, offset, length, vec![0xEE; length + 512]);
            next += 1;
        }
        for completed in queue.complete(true) {
            let (offset, length) = reads[completed.tag as usize];
            completed.result.unwrap_or_else(|error| panic!("{when}: queued read {offset}+{length}: {error}"));
            let mut plain = vec![0u8; length];
            volume.read(offset, &mut plain).expect("plain read");
            assert!(completed.buffer[length..].iter().all(|&byte| byte == 0xEE), "{when}: read beyond its length");
            assert!(
                completed.buffer[..length] == plain,
                "{when}: queued read {offset}+{length} differs from a plain read"
            );
            done += 1;
        }
    }
    assert_eq!(queue.in_flight(), 0);
}

#[test]
fn queued_reads_return_what_plain_reads_do_and_a_rotten_block_is_rebuilt() {
    let (_directory, devices, volume) = new_volume("stripelog-read-queue");
    let blocks = volume.logical_size_bytes() / BLOCK_SIZE_BYTES as u64;
    let mut random = Prng::new(24);
    // Random data over half the blocks, some overwritten, a run trimmed; flushed.
    for _ in 0..(blocks / 2) {
        let block = random.below(blocks - 4);
        let mut data = vec![0u8; BLOCK_SIZE_BYTES * (1 + random.below(3) as usize)];
        random.fill(&mut data);
        volume.write(block * BLOCK_SIZE_BYTES as u64, &data, false).expect("write");
    }
    volume.trim(64 * BLOCK_SIZE_BYTES as u64, 32 * BLOCK_SIZE_BYTES as u64).expect("trim");
    volume.flush().expect("flush");
    // A few writes left in memory (no flush since).
    let mut recent = vec![0u8; 8 * BLOCK_SIZE_BYTES];
    random.fill(&mut recent);
    volume.write(200 * BLOCK_SIZE_BYTES as u64, &recent, false).expect("write");

    let reads: Vec<(u64, usize)> = (0..600)
        .map(|index| {
            let length = match index % 4 {
                0 => BLOCK_SIZE_BYTES,
                1 => 512 * (1 + random.below(24) as usize),
                2 => BLOCK_SIZE_BYTES * (2 + random.below(15) as usize),
                _ => BLOCK_SIZE_BYTES,
            };
            let offset = 512 * random.below((blocks * BLOCK_SIZE_BYTES as u64 - length as u64) / 512);
            (offset, length)
        })
        .chain([(200 * BLOCK_SIZE_BYTES as u64, 8 * BLOCK_SIZE_BYTES), (64 * BLOCK_SIZE_BYTES as u64, 4096)])
        .collect();
    let before = volume.stats();
    compare_queued_with_plain(&volume, &reads, "healthy");
    let queued = volume.stats().queued_member_reads - before.queued_member_reads;
    assert!(queued > 500, "only {queued} member blocks went through the ring");

    // Reopened with room for one checksum table per shard of the cache: the reads find
    // their segments' tables missing, and the queue reads them through the ring.
    volume.close().expect("close");
    let open = OpenOptions { cache_size_bytes: 0, checksum_cache_bytes: 0, ..OpenOptions::default() };
    let volume = Volume::open(common::members(&devices), &open).expect("reopen");
    let before = volume.stats();
    compare_queued_with_plain(&volume, &reads, "reopened, few checksum tables cached");
    let after = volume.stats();
    let loads = after.queued_checksum_table_loads - before.queued_checksum_table_loads;
    assert!(loads > 50, "only {loads} checksum tables were read through the ring");
    assert!(after.queued_member_reads - before.queued_member_reads > 500);

    // Reopened with room for two index pages: most blocks find their map page only in
    // the log, and the queue reads the pages through the ring too (the checkpoint at
    // close wrote every page, so none is in RAM at first).
    volume.close().expect("close");
    let open = OpenOptions { map_cache_bytes: Some(2 * 4200), ..open };
    let volume = Volume::open(common::members(&devices), &open).expect("reopen");
    let before = volume.stats();
    compare_queued_with_plain(&volume, &reads, "reopened, two index pages cached");
    let after = volume.stats();
    let page_loads = after.queued_map_page_loads - before.queued_map_page_loads;
    assert!(page_loads > 20, "only {page_loads} index pages were read through the ring");

    // Rot: flip a byte in every block of member 1's chunks that hold written data.
    let mut chunk = AlignedBuffer::zeroed(64 << 10);
    for chunk_index in 1..(MEMBER_BYTES / (64 << 10)) - 1 {
        let at = chunk_index * (64 << 10);
        devices[1].read_at(&mut chunk, at).expect("read a chunk");
        if chunk.iter().all(|&byte| byte == 0) {
            continue;
        }
        for block in 0..16 {
            chunk[block * BLOCK_SIZE_BYTES + 100] ^= 0x5A;
        }
        devices[1].write_at(&chunk, at).expect("rot a chunk");
    }
    let before = volume.stats();
    compare_queued_with_plain(&volume, &reads, "with member 1 rotten");
    let after = volume.stats();
    assert!(after.checksum_mismatches > before.checksum_mismatches, "no rotten block was read");
    assert_eq!(after.unrecoverable_reads, 0);
    volume.close().expect("close");
}

/// The ring gives the queue its completions a few at a time; a read of many blocks whose
/// blocks have all finished still comes back from one `complete`, without waiting.
#[test]
fn a_read_whose_blocks_have_all_finished_comes_back_from_one_complete() {
    let (_directory, devices, volume) = new_volume("stripelog-read-queue-one");
    let open = OpenOptions { cache_size_bytes: 0, ..OpenOptions::default() };
    let length = 16 * BLOCK_SIZE_BYTES;
    let mut data = vec![0u8; length];
    Prng::new(7).fill(&mut data);
    volume.write(0, &data, false).expect("write");
    volume.close().expect("close");
    let volume = Volume::open(common::members(&devices), &open).expect("reopen");
    // A plain read first: the segment's checksum table is then cached, so every block of
    // the queued read goes to the ring when it is submitted.
    let mut plain = vec![0u8; length];
    volume.read(0, &mut plain).expect("plain read");
    assert!(plain == data);
    let before = volume.stats();
    let mut queue = volume.read_queue(QUEUE_DEPTH);
    queue.submit(1, 0, length, vec![0u8; length]);
    // Until the kernel has finished every block (each sleep enters it, which posts them).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while queue.member_reads_finished() < 16 {
        assert!(std::time::Instant::now() < deadline, "the kernel did not finish 16 reads in 30 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let completed = queue.complete(false);
    assert_eq!(completed.len(), 1, "the read, all of whose blocks have finished, from one complete");
    completed[0].result.as_ref().expect("queued read");
    assert!(completed[0].buffer == data);
    assert_eq!(volume.stats().queued_member_reads - before.queued_member_reads, 16);
    assert_eq!(queue.in_flight(), 0);
    drop(queue);
    volume.close().expect("close");
}
