//! Layer 7 (mount): checkpoints. Writing the index pages, the segment table and a root
//! into the log and naming the root in the superblocks; loading them at mount
//! (docs/index-and-checkpoints.md, "Writing a checkpoint", "Mount"; the crash analysis is
//! in docs/crash-consistency.md, "Checkpoints").

use crate::array::members::Members;
use crate::error::{Error, LostMetadata, Result};
pub(crate) use crate::index::directory::{records_digest, CheckpointState};
use crate::index::map::{BlockMap, PageSource};
use crate::io::{Core, WriteState};
use crate::layout::checkpoint::{
    self as codec, CheckpointRoot, DirectoryPage, PagePointer, SegmentRecord, SegmentTablePage, StreamPosition, Tree,
    DIRECTORY_FANOUT, ROOT_STREAMS, ROOT_TOP_POINTERS, SEGMENT_RECORDS_PER_PAGE,
};
use crate::layout::format::{self, CheckpointReference, PageKind};
use crate::layout::geometry::{Geometry, BLOCK_SIZE_BYTES};
use crate::log::{METADATA_STREAM, STREAM_COUNT};
use crate::space::SegmentUse;
use crate::stats::Counters;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stripelog_blockdev::AlignedBuffer;

/// ... or when this long has passed with any batch written.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(30);

/// What a snapshot (taken under the state lock) says the checkpoint holds.
struct Snapshot {
    generation: u64,
    sequence: u64,
    last_segment: u64,
    write_clock: u64,
    durable_through_sequence: u64,
    streams: [StreamPosition; ROOT_STREAMS],
    /// The map's counts of data, zero and fragment entries.
    counts: crate::index::map::MapCounts,
    /// (page number, packed entries)
    index_pages: Vec<(u64, Vec<u8>)>,
    /// (page number, encoded block, digest of its records)
    table_pages: Vec<(u64, AlignedBuffer, u32)>,
    /// (page number, encoded block) of the shared-block table pages that changed.
    shared_pages: Vec<(u64, AlignedBuffer)>,
}

impl Core {
    /// Write a checkpoint when one is due (`interval`: the time rule).
    pub(crate) fn checkpoint_if_due(&self, interval: Duration) -> Result<()> {
        let due = {
            let checkpoint = self.checkpoint.lock();
            checkpoint.due(&self.map, self.batch_bytes_written(), interval)
        };
        if due {
            self.write_checkpoint()?;
        }
        Ok(())
    }

    /// Write a checkpoint when dead segments wait only for one to be committed (the reuse
    /// rule) — the cleaner and writers short of space call it — and release what it
    /// freed. `true`: one was written and there are more free segments than before. (A
    /// checkpoint also writes pages, and the metadata segments it empties wait for the
    /// next one: on a volume short of space, checkpoints can free no more than they take,
    /// and a caller that went on while one was merely written would loop for ever.)
    pub(crate) fn checkpoint_for_space(&self) -> Result<bool> {
        let free_before = self.state.lock().space.free_count();
        let blocked = {
            let state = self.state.lock();
            state.space.any_waiting_for_checkpoint(state.log.durable_through_sequence)
        };
        if !blocked || self.write_checkpoint()?.is_none() {
            return Ok(false);
        }
        self.stop_on_error(self.reclaim())?;
        Ok(self.state.lock().space.free_count() > free_before)
    }

    /// Bytes of batches (data columns) written since the volume was opened.
    fn batch_bytes_written(&self) -> u64 {
        let counters = &self.counters;
        Counters::get(&counters.member_bytes_data)
            + Counters::get(&counters.member_bytes_relocated)
            + Counters::get(&counters.member_bytes_metadata)
    }

    /// Write a checkpoint and commit it (docs/index-and-checkpoints.md, "Writing a
    /// checkpoint"). Returns its generation; `None` when no checkpoint can be taken now
    /// (a stream has no reserved successor: no free segment is left).
    pub(crate) fn write_checkpoint(&self) -> Result<Option<u64>> {
        self.check_writable()?;
        let mut checkpoint = self.checkpoint.lock();
        let batch_bytes = self.batch_bytes_written();
        // Pages whose copy sits in a mostly dead metadata segment are written again, so
        // that the segment empties: in RAM first (no eviction while this lock is held).
        let sparse_pages = self.sparse_pages()?;
        // 1. Snapshot: the clients' open batch is sealed, so that the map and the table
        // reflect exactly the batches up to `sequence`.
        let (snapshot, sealed) = {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            self.reserve_stream_segments(state);
            if state.log.reserved_segments.iter().any(Option::is_none) {
                return Ok(None);
            }
            let sealed = self.seal_clients(state);
            (self.snapshot(state, &checkpoint, &sparse_pages), sealed)
        };
        for batch in sealed {
            self.dispatch(batch)?;
        }
        let taken_pages: Vec<u64> = snapshot.index_pages.iter().map(|(page, _)| *page).collect();
        let taken_shared_pages: Vec<u64> = snapshot.shared_pages.iter().map(|(page, _)| *page).collect();
        let result = self.write_snapshot(&mut checkpoint, snapshot, batch_bytes);
        if result.is_err() {
            // Not committed: what the snapshot took is still to be written.
            for page in taken_pages {
                self.map.mark_dirty(page);
            }
            self.shared.write().mark_dirty(taken_shared_pages);
        }
        if result.is_ok() {
            // Committed: every clean page's copy is durable and named, so pages may go.
            self.evict_map_pages(&checkpoint);
        }
        drop(checkpoint);
        let generation = result?;
        Counters::add(&self.counters.checkpoints, 1);
        self.reclaim()?;
        Ok(Some(generation))
    }

    /// Steps 2–5 of a checkpoint whose snapshot is taken.
    fn write_snapshot(&self, checkpoint: &mut CheckpointState, snapshot: Snapshot, batch_bytes: u64) -> Result<u64> {
        let generation = snapshot.generation;
        let uuid = self.volume_uuid;
        // 2. The pages, then the directories above them, then the root.
        let mut dying: Vec<u64> = Vec::new();
        let index_blocks: Vec<(PageKind, u64, AlignedBuffer)> = snapshot
            .index_pages
            .iter()
            .map(|(page, packed)| {
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                codec::encode_index_page(
                    &mut block,
                    &uuid,
                    *page,
                    generation,
                    self.map.codec().width_bits as u8,
                    packed,
                );
                (PageKind::Index, *page, block)
            })
            .collect();
        drop(snapshot.index_pages);
        let (written, _) = self.write_blocks(index_blocks)?;
        for (page, pointer) in written {
            dying.extend(self.map.set_copy(page, pointer).map(|old| old.position));
        }
        let (table_blocks, digests): (Vec<_>, Vec<_>) = snapshot
            .table_pages
            .into_iter()
            .map(|(page, block, digest)| ((PageKind::SegmentTable, page, block), digest))
            .unzip();
        let (written, _) = self.write_blocks(table_blocks)?;
        for ((page, pointer), digest) in written.into_iter().zip(digests) {
            dying.extend(checkpoint.table_pages.set(page, pointer).map(|old| old.position));
            checkpoint.table_digests[page as usize] = digest;
        }
        let shared_blocks: Vec<(PageKind, u64, AlignedBuffer)> =
            snapshot.shared_pages.into_iter().map(|(page, block)| (PageKind::SharedTable, page, block)).collect();
        let (written, _) = self.write_blocks(shared_blocks)?;
        for (page, pointer) in written {
            dying.extend(checkpoint.shared_pages.set(page, pointer).map(|old| old.position));
        }
        let mut directory_positions = Vec::new();
        let (index_depth, index_top) = self.write_tree(
            Tree::Index,
            self.map.page_count(),
            &|page| self.map.copy(page),
            generation,
            &mut directory_positions,
        )?;
        let table_pages = &checkpoint.table_pages;
        let (segment_depth, segment_top) = self.write_tree(
            Tree::SegmentTable,
            table_pages.len(),
            &|page| table_pages.get(page),
            generation,
            &mut directory_positions,
        )?;
        let shared_pages = &checkpoint.shared_pages;
        let (shared_depth, shared_top) = self.write_tree(
            Tree::SharedTable,
            shared_pages.len(),
            &|page| shared_pages.get(page),
            generation,
            &mut directory_positions,
        )?;
        let root = CheckpointRoot {
            generation,
            sequence: snapshot.sequence,
            write_clock: snapshot.write_clock,
            durable_through_sequence: snapshot.durable_through_sequence,
            streams: snapshot.streams,
            index_tree_depth: index_depth,
            segment_tree_depth: segment_depth,
            index_top,
            segment_top,
            last_segment: snapshot.last_segment,
            epoch: self.epoch,
            data_blocks: snapshot.counts.data_blocks,
            zero_blocks: snapshot.counts.zero_blocks,
            fragment_blocks: snapshot.counts.fragment_blocks,
            fragment_sixteenths: snapshot.counts.fragment_sixteenths,
            shared_blocks: snapshot.counts.shared_blocks,
            shared_tree_depth: shared_depth,
            shared_top,
        };
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        root.encode(&mut block, &uuid);
        let (written, root_batch) = self.write_blocks(vec![(PageKind::Root, generation, block)])?;
        let root_pointer = written[0].1;
        // 3. Every batch up to the root's durable.
        self.make_durable(root_batch)?;
        // 4. The commit point: the superblocks name the new root.
        self.members.update_superblock(|superblock| {
            superblock.checkpoint = Some(CheckpointReference {
                root_position: root_pointer.position,
                root_checksum: root_pointer.checksum,
                generation,
                sequence: snapshot.sequence,
            });
            superblock.durable_through_sequence = superblock.durable_through_sequence.max(root_batch);
        })?;
        // 5. The copies the previous checkpoint named and this one replaced are dead.
        dying.append(&mut checkpoint.directory_positions);
        dying.extend(checkpoint.root.map(|root| root.position));
        checkpoint.directory_positions = directory_positions;
        checkpoint.root = Some(root_pointer);
        checkpoint.generation = generation;
        checkpoint.committed_at = Instant::now();
        checkpoint.batch_bytes_at_commit = batch_bytes;
        {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            state.space.checkpoint_committed(generation);
            let per_segment = self.geometry.blocks_per_segment();
            let durable = state.log.durable_through_sequence;
            for position in dying {
                state.space.remove_live(position / per_segment, self.geometry.live_units_per_block(), durable);
            }
        }
        Ok(generation)
    }

    /// The index pages whose copy sits in a mostly dead metadata segment, brought into RAM
    /// (callers hold the checkpoint lock, so they stay there until the snapshot takes them).
    fn sparse_pages(&self) -> Result<Vec<u64>> {
        let per_segment = self.geometry.blocks_per_segment();
        let sparse: Vec<bool> = {
            let state = self.state.lock();
            state.space.uses().map(|(_, usage)| usage.is_mostly_dead(&self.geometry)).collect()
        };
        let pages: Vec<u64> = self
            .map
            .copies()
            .filter(|(_, pointer)| sparse[(pointer.position / per_segment) as usize])
            .map(|(page, _)| page)
            .collect();
        for &page in &pages {
            self.map.ensure_resident(page)?;
        }
        Ok(pages)
    }

    /// Evict clean index pages beyond the map cache (callers hold the checkpoint lock: no
    /// checkpoint is between its snapshot and its commit) — when no writer holds the state
    /// lock, which keeps the pages writers looked up in RAM.
    pub(crate) fn evict_map_pages(&self, _checkpoint: &CheckpointState) {
        if self.map.over_capacity() {
            if let Some(_state) = self.state.try_lock() {
                self.map.evict();
            }
        }
    }

    /// Evict beyond the map cache if no checkpoint is being written (readers and writers
    /// call it after their work, holding no lock).
    pub(crate) fn evict_map_pages_if_needed(&self) {
        if self.map.over_capacity() {
            if let Some(checkpoint) = self.checkpoint.try_lock() {
                self.evict_map_pages(&checkpoint);
            }
        }
    }

    /// Step 1 under the state lock: the dirty index pages and `sparse_pages`, the changed
    /// segment table pages, the streams' positions.
    fn snapshot(&self, state: &mut WriteState, checkpoint: &CheckpointState, sparse_pages: &[u64]) -> Snapshot {
        let generation = state.space.checkpoints().snapshot.max(checkpoint.generation) + 1;
        state.space.snapshot_taken(generation);
        let per_segment = self.geometry.blocks_per_segment();
        let sparse = |pointer: Option<PagePointer>| {
            pointer
                .is_some_and(|pointer| state.space.usage(pointer.position / per_segment).is_mostly_dead(&self.geometry))
        };
        let mut pages = self.map.take_dirty_list();
        pages.extend_from_slice(sparse_pages);
        pages.sort_unstable();
        pages.dedup();
        let index_pages: Vec<(u64, Vec<u8>)> =
            pages.into_iter().filter_map(|page| Some((page, self.map.take_page(page)?))).collect();
        let counts = self.map.counts();
        let mut table_pages = Vec::new();
        let segment_count = state.space.segment_count();
        for page in 0..checkpoint.table_pages.len() {
            let first = page * SEGMENT_RECORDS_PER_PAGE as u64;
            let end = (first + SEGMENT_RECORDS_PER_PAGE as u64).min(segment_count);
            let records: Vec<SegmentRecord> = (first..end).map(|segment| state.space.usage(segment).record()).collect();
            let digest = records_digest(&records);
            let pointer = checkpoint.table_pages.get(page);
            let unchanged = match pointer {
                Some(_) => digest == checkpoint.table_digests[page as usize],
                // Never written: every record free, as mount takes a missing page.
                None => records.iter().all(|record| *record == SegmentUse::FREE.record()),
            };
            if !unchanged || sparse(pointer) {
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                SegmentTablePage { first_segment: first, generation, records }.encode(&mut block, &self.volume_uuid);
                table_pages.push((page, block, digest));
            }
        }
        // The shared-block table's changed pages (and those in mostly dead segments).
        let mut shared_table = self.shared.write();
        let mut shared_page_numbers = shared_table.take_dirty_pages();
        shared_page_numbers
            .extend(checkpoint.shared_pages.iter().filter(|(_, pointer)| sparse(Some(*pointer))).map(|(page, _)| page));
        shared_page_numbers.sort_unstable();
        shared_page_numbers.dedup();
        let shared_pages = shared_page_numbers
            .into_iter()
            .filter(|&page| page < checkpoint.shared_pages.len())
            .map(|page| {
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                codec::encode_shared_table_page(
                    &mut block,
                    &self.volume_uuid,
                    page,
                    generation,
                    &shared_table.page(page),
                );
                (page, block)
            })
            .collect();
        drop(shared_table);
        let streams = std::array::from_fn(|stream| {
            if stream >= STREAM_COUNT {
                return StreamPosition::default();
            }
            let current = state.log.current_segments[stream].as_ref();
            StreamPosition {
                current_segment: current.map(|current| current.segment),
                next_row: current.map_or(0, |current| current.next_row),
                reserved_segment: state.log.reserved_segments[stream],
            }
        });
        Snapshot {
            generation,
            sequence: state.log.last_sealed_sequence,
            last_segment: state.log.last_sealed_segment,
            write_clock: state.lifetimes.write_clock,
            durable_through_sequence: state.log.durable_through_sequence,
            streams,
            counts,
            index_pages,
            table_pages,
            shared_pages,
        }
    }

    /// Write the directory pages of one tree over `leaves`, bottom up; returns the tree's
    /// depth and the root's top pointers. Their positions go to `positions`.
    fn write_tree(
        &self,
        tree: Tree,
        leaf_count: u64,
        leaf: &dyn Fn(u64) -> Option<PagePointer>,
        generation: u64,
        positions: &mut Vec<u64>,
    ) -> Result<(u8, Vec<Option<PagePointer>>)> {
        let depth = codec::tree_depth(leaf_count);
        // The leaves are read a directory page's worth at a time (a large volume has
        // millions): the levels above are small.
        let mut level_pointers: Vec<Option<PagePointer>> = Vec::new();
        let mut level_count = leaf_count;
        for level in 1..=depth {
            let mut blocks = Vec::new();
            let mut numbers = Vec::new();
            let parent_count = level_count.div_ceil(DIRECTORY_FANOUT as u64);
            for index in 0..parent_count {
                let first = index * DIRECTORY_FANOUT as u64;
                let end = (first + DIRECTORY_FANOUT as u64).min(level_count);
                let children: Vec<Option<PagePointer>> = if level == 1 {
                    (first..end).map(leaf).collect()
                } else {
                    level_pointers[first as usize..end as usize].to_vec()
                };
                if children.iter().all(Option::is_none) {
                    continue;
                }
                let index = index as usize;
                let page = DirectoryPage {
                    tree,
                    level,
                    first_page: (index * DIRECTORY_FANOUT) as u64,
                    generation,
                    pointers: children,
                };
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                page.encode(&mut block, &self.volume_uuid);
                // The page number in the summary: the level in the top byte.
                blocks.push((PageKind::Directory, (level as u64) << 56 | index as u64, block));
                numbers.push(index);
            }
            let mut parents = vec![None; parent_count as usize];
            let (written, _) = self.write_blocks(blocks)?;
            for ((_, pointer), index) in written.into_iter().zip(numbers) {
                positions.push(pointer.position);
                parents[index] = Some(pointer);
            }
            level_pointers = parents;
            level_count = parent_count;
        }
        if depth == 0 {
            level_pointers = (0..leaf_count).map(leaf).collect();
        }
        debug_assert!(level_pointers.len() <= ROOT_TOP_POINTERS);
        Ok((depth, level_pointers))
    }

    /// Write checkpoint blocks into the metadata stream, in batches of their own that take
    /// their place in the log order like the cleaner's. Returns each block's pointer (by
    /// its number) and the sequence of the last batch.
    fn write_blocks(&self, blocks: Vec<(PageKind, u64, AlignedBuffer)>) -> Result<(Vec<(u64, PagePointer)>, u64)> {
        let mut written = Vec::with_capacity(blocks.len());
        let mut last_batch = 0;
        let mut next = 0;
        while next < blocks.len() {
            let buffers = self.data_pool.take();
            let mut guard = self.state.lock();
            self.members.check_running()?;
            let side = self.begin_side_batch(&mut guard, METADATA_STREAM, buffers, false)?;
            let state = &mut *guard;
            state.log.open.as_mut().expect("the side batch").metadata = true;
            while next < blocks.len() {
                let (kind, number, block) = &blocks[next];
                let Some(position) = self.accept_page(state, *kind, *number, block) else {
                    break;
                };
                written.push((*number, PagePointer { position, checksum: format::block_checksum(block) }));
                next += 1;
            }
            // Never empty: a fresh side batch has room for a summary and a block.
            let sealed = self.end_side_batch(state, side.client);
            last_batch = sealed.header.sequence;
            drop(guard);
            for client_batch in side.sealed_clients {
                self.dispatch(client_batch)?;
            }
            self.dispatch(sealed)?;
        }
        Ok((written, last_batch))
    }
}

/// Read the checkpoint block at `pointer` (verified against the pointer's CRC32C,
/// rebuilt from its row when needed) into `out`.
pub(crate) fn read_block(
    geometry: &Geometry,
    members: &crate::array::members::Members,
    pointer: PagePointer,
    what: &'static str,
    out: &mut [u8],
) -> Result<()> {
    use crate::array::members::ReadPurpose;
    if pointer.position >= geometry.physical_data_blocks() {
        return Err(Error::MetadataLost(LostMetadata::CheckpointBlock { what, position: pointer.position }));
    }
    let valid = |bytes: &[u8]| format::checksum_proves(bytes, pointer.checksum);
    members
        .read_verified(
            geometry,
            &Counters::default(),
            geometry.locate(pointer.position),
            &valid,
            &|_| None,
            ReadPurpose::Scan,
            out,
        )
        .map(|_| ())
        .map_err(|_| Error::MetadataLost(LostMetadata::CheckpointBlock { what, position: pointer.position }))
}

/// A checkpoint loaded at mount: the map, the segment table, and where its blocks are.
pub(crate) struct Loaded {
    pub root: CheckpointRoot,
    pub records: Vec<SegmentRecord>,
    pub state: CheckpointState,
    /// The shared-block table as the checkpoint holds it.
    pub shared: crate::space::shared::SharedTable,
}

/// Where a paged map reads its pages: the copies checkpoints wrote, verified like every
/// member read (and rebuilt from their rows when damaged).
pub(crate) struct MediaPages {
    pub(crate) geometry: Geometry,
    pub(crate) members: Arc<Members>,
    pub(crate) volume_uuid: [u8; 16],
    pub(crate) width_bits: u8,
}

impl PageSource for MediaPages {
    fn read_page(&self, page: u64, pointer: PagePointer) -> Result<Vec<u8>> {
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        read_block(&self.geometry, &self.members, pointer, "index page", &mut block)?;
        self.decode_page(page, pointer, &block).ok_or(Error::MetadataLost(LostMetadata::CheckpointBlock {
            what: "index page",
            position: pointer.position,
        }))
    }

    fn decode_page(&self, page: u64, pointer: PagePointer, block: &[u8]) -> Option<Vec<u8>> {
        if !format::checksum_proves(block, pointer.checksum) {
            return None;
        }
        codec::decode_index_page(block, &self.volume_uuid)
            .filter(|(number, _, width, _)| *number == page && *width == self.width_bits)
            .map(|(_, _, _, payload)| payload.to_vec())
    }
}

/// Load the checkpoint `reference` names: its root, its segment table and the directory;
/// `map` learns where each index page is (pages load on demand) and the counts.
pub(crate) fn load(
    geometry: &Geometry,
    members: &crate::array::members::Members,
    volume_uuid: &[u8; 16],
    reference: &CheckpointReference,
    map: &BlockMap,
) -> Result<Loaded> {
    let lost = |what, position| Error::MetadataLost(LostMetadata::CheckpointBlock { what, position });
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    let root_pointer = PagePointer { position: reference.root_position, checksum: reference.root_checksum };
    read_block(geometry, members, root_pointer, "root", &mut block)?;
    let root = CheckpointRoot::decode(&block, volume_uuid)
        .filter(|root| root.generation == reference.generation && root.sequence == reference.sequence)
        .ok_or(lost("root", reference.root_position))?;
    let mut state = CheckpointState::empty(geometry);
    state.root = Some(root_pointer);
    state.generation = root.generation;
    let mut directory_positions = Vec::new();
    let index_page_count = map.page_count();
    load_tree(
        geometry,
        members,
        volume_uuid,
        Tree::Index,
        root.index_tree_depth,
        &root.index_top,
        &mut |page, pointer| page < index_page_count && map.set_copy(page, pointer).is_none(),
        &mut directory_positions,
    )?;
    let table_pages = &state.table_pages;
    load_tree(
        geometry,
        members,
        volume_uuid,
        Tree::SegmentTable,
        root.segment_tree_depth,
        &root.segment_top,
        &mut |page, pointer| page < table_pages.len() && table_pages.set(page, pointer).is_none(),
        &mut directory_positions,
    )?;
    let shared_pages = &state.shared_pages;
    load_tree(
        geometry,
        members,
        volume_uuid,
        Tree::SharedTable,
        root.shared_tree_depth,
        &root.shared_top,
        &mut |page, pointer| page < shared_pages.len() && shared_pages.set(page, pointer).is_none(),
        &mut directory_positions,
    )?;
    state.directory_positions = directory_positions;
    let fragments_possible = geometry.packed_fragments || (root.fragment_blocks == 0 && root.fragment_sixteenths == 0);
    if root
        .data_blocks
        .saturating_add(root.zero_blocks)
        .saturating_add(root.fragment_blocks)
        .saturating_add(root.shared_blocks)
        > geometry.logical_block_count()
        || (root.shared_blocks > 0 && !geometry.shared_blocks)
        || root.fragment_sixteenths > root.fragment_blocks.saturating_mul(16)
        || !fragments_possible
    {
        return Err(lost("root", reference.root_position));
    }
    map.start_counts(crate::index::map::MapCounts {
        data_blocks: root.data_blocks,
        zero_blocks: root.zero_blocks,
        fragment_blocks: root.fragment_blocks,
        fragment_sixteenths: root.fragment_sixteenths,
        shared_blocks: root.shared_blocks,
    });
    let segment_count = geometry.segment_count();
    let mut records = vec![SegmentUse::FREE.record(); segment_count as usize];
    for page in 0..state.table_pages.len() {
        let Some(pointer) = state.table_pages.get(page) else { continue };
        read_block(geometry, members, pointer, "segment table page", &mut block)?;
        let first = page * SEGMENT_RECORDS_PER_PAGE as u64;
        let decoded = SegmentTablePage::decode(&block, volume_uuid)
            .filter(|decoded| decoded.first_segment == first)
            .ok_or(lost("segment table page", pointer.position))?;
        let end = (first + SEGMENT_RECORDS_PER_PAGE as u64).min(segment_count);
        let page_records = &decoded.records[..(end - first) as usize];
        if page_records.iter().any(|record| record.status > 4 || record.stream as usize >= STREAM_COUNT) {
            return Err(lost("segment table page", pointer.position));
        }
        records[first as usize..end as usize].copy_from_slice(page_records);
        state.table_digests[page as usize] = records_digest(page_records);
    }
    let mut shared = crate::space::shared::SharedTable::default();
    for (page, pointer) in state.shared_pages.iter() {
        read_block(geometry, members, pointer, "shared table page", &mut block)?;
        let records = codec::decode_shared_table_page(&block, volume_uuid)
            .filter(|(number, _, _)| *number == page)
            .map(|(_, _, records)| records)
            .ok_or(lost("shared table page", pointer.position))?;
        let positions = geometry.physical_data_blocks();
        let in_volume = records.iter().all(|&value| {
            crate::space::shared::SharedRecord::unpack(value).is_none_or(|record| record.position < positions)
        });
        if !in_volume || !shared.install_page(page, &records) {
            return Err(lost("shared table page", pointer.position));
        }
    }
    shared.finish_loading();
    Ok(Loaded { root, records, state, shared })
}

/// Read one tree's directory pages from the root's top pointers down, filling `leaves`.
#[allow(clippy::too_many_arguments)]
fn load_tree(
    geometry: &Geometry,
    members: &crate::array::members::Members,
    volume_uuid: &[u8; 16],
    tree: Tree,
    depth: u8,
    top: &[Option<PagePointer>],
    // Record leaf `page`'s pointer; `false`: beyond the tree, or named twice.
    set_leaf: &mut dyn FnMut(u64, PagePointer) -> bool,
    directory_positions: &mut Vec<u64>,
) -> Result<()> {
    let lost = |position| Error::MetadataLost(LostMetadata::CheckpointBlock { what: "directory page", position });
    // (level, index at that level, pointer)
    let mut pending: Vec<(u8, u64, PagePointer)> =
        top.iter().enumerate().filter_map(|(index, pointer)| Some((depth, index as u64, (*pointer)?))).collect();
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    while let Some((level, index, pointer)) = pending.pop() {
        if level == 0 {
            if !set_leaf(index, pointer) {
                return Err(lost(pointer.position));
            }
            continue;
        }
        read_block(geometry, members, pointer, "directory page", &mut block)?;
        let page = DirectoryPage::decode(&block, volume_uuid)
            .filter(|page| {
                page.tree == tree && page.level == level && page.first_page == index * DIRECTORY_FANOUT as u64
            })
            .ok_or(lost(pointer.position))?;
        directory_positions.push(pointer.position);
        for (child, pointer) in page.pointers.iter().enumerate() {
            if let Some(pointer) = pointer {
                pending.push((level - 1, index * DIRECTORY_FANOUT as u64 + child as u64, *pointer));
            }
        }
    }
    Ok(())
}
