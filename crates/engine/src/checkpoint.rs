//! Layer 7 (mount): checkpoints. Writing the index pages, the segment table and a root
//! into the log and naming the root in the superblocks; loading them at mount
//! (docs/index-and-checkpoints.md, "Writing a checkpoint", "Mount"; the crash analysis is
//! in docs/crash-consistency.md, "Checkpoints").

use crate::array::members::Members;
use crate::error::{Error, LostMetadata, Result};
pub(crate) use crate::index::directory::CheckpointState;
use crate::index::directory::{records_digest, DirectoryPageCopy};
use crate::index::map::{BlockMap, PageSource};
use crate::io::{Core, SideKind, WriteState};
use crate::layout::checkpoint::{
    self as codec, CheckpointRoot, DirectoryPage, PagePointer, SegmentRecord, SegmentTablePage, StreamPosition, Tree,
    DIRECTORY_FANOUT, ROOT_STREAMS, ROOT_TOP_POINTERS, SEGMENT_RECORDS_PER_PAGE,
};
use crate::layout::format::{self, CheckpointReference, PageKind};
use crate::layout::geometry::{Geometry, BLOCK_SIZE_BYTES};
use crate::log::{METADATA_STREAM, STREAM_COUNT};
use crate::space::SegmentUse;
use crate::stats::Counters;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
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
    /// The index pages it took (their entries are copied after the write lock is
    /// released: `BlockMap::copy_snapshot_pages`).
    index_pages: Vec<u64>,
    /// Their packed entries as of the snapshot, once copied.
    index_entries: Vec<(u64, Vec<u8>)>,
    /// (page number, encoded block, digest of its records)
    table_pages: Vec<(u64, AlignedBuffer, u32)>,
    /// (page number, encoded block) of the shared-block table pages that changed.
    shared_pages: Vec<(u64, AlignedBuffer)>,
    /// (page number, encoded block) of the name index pages that changed.
    name_pages: Vec<(u64, AlignedBuffer)>,
    /// Positions of the committed directory pages whose copy lies in a mostly dead
    /// segment: written again, so that the segment empties.
    sparse_directory_pages: HashSet<u64>,
}

/// One tree's leaves as a checkpoint writes its directory: how many, each one's copy (the
/// one written now, else the committed one), and whether any in `first..end` was written
/// now.
struct TreeLeaves<'a> {
    tree: Tree,
    count: u64,
    leaf: &'a dyn Fn(u64) -> Option<PagePointer>,
    changed: &'a dyn Fn(u64, u64) -> bool,
}

/// The checkpoint writer of one open volume (layer 7): writes the index pages, the
/// segment table, the shared-block table, their directories and a root into the metadata
/// stream, and commits by naming the root in the superblocks. What the committed
/// checkpoint holds is the core's (`io::Core::directory`), whose lock the writer holds
/// from its snapshot to its commit.
pub(crate) struct Checkpointer {
    core: Arc<Core>,
    /// A checkpoint is written when this long has passed since the last one with any batch
    /// written (besides the dirty-page and replay-size bounds).
    interval: Duration,
}

impl Checkpointer {
    pub(crate) fn new(core: Arc<Core>, interval: Duration) -> Checkpointer {
        Checkpointer { core, interval }
    }

    /// Write a checkpoint when one is due.
    pub(crate) fn checkpoint_if_due(&self) -> Result<()> {
        let due = self.core.directory().lock().due(self.core.map(), self.batch_bytes_written(), self.interval);
        if let Some(cause) = due {
            if self.write_checkpoint()?.is_some() {
                let counters = self.core.counters();
                Counters::add(
                    match cause {
                        crate::index::directory::CheckpointCause::DirtyPages => &counters.checkpoints_for_dirty_pages,
                        crate::index::directory::CheckpointCause::ReplayBytes => &counters.checkpoints_for_replay_bytes,
                        crate::index::directory::CheckpointCause::Interval => &counters.checkpoints_for_interval,
                    },
                    1,
                );
            }
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
        let (free_before, blocked) = {
            let state = self.core.lock_state();
            (state.space().free_count(), state.space().any_waiting_for_checkpoint(state.log().durable_through()))
        };
        if !blocked || self.write_checkpoint()?.is_none() {
            return Ok(false);
        }
        self.core.stop_on_error(self.core.reclaim())?;
        Ok(self.core.lock_state().space().free_count() > free_before)
    }

    /// Bytes of batches (data columns) written since the volume was opened.
    fn batch_bytes_written(&self) -> u64 {
        let counters = self.core.counters();
        Counters::get(&counters.member_bytes_data)
            + Counters::get(&counters.member_bytes_relocated)
            + Counters::get(&counters.member_bytes_metadata)
    }

    /// Write a checkpoint and commit it (docs/index-and-checkpoints.md, "Writing a
    /// checkpoint"). Returns its generation; `None` when no checkpoint can be taken now
    /// (a stream has no reserved successor: no free segment is left).
    pub(crate) fn write_checkpoint(&self) -> Result<Option<u64>> {
        let core = &*self.core;
        core.check_writable()?;
        let started = std::time::Instant::now();
        let mut directory = core.directory().lock();
        let batch_bytes = self.batch_bytes_written();
        // Pages whose copy sits in a mostly dead metadata segment are written again, so
        // that the segment empties: in RAM first (no eviction while this lock is held).
        let sparse_pages = self.sparse_pages()?;
        // 1. Snapshot: the clients' open batch is sealed, so that the map and the table
        // reflect exactly the batches up to `sequence`.
        let (mut snapshot, sealed) = {
            let mut state = core.lock_state_to_write();
            core.reserve_stream_segments(&mut state);
            if !state.log().every_stream_reserved() {
                return Ok(None);
            }
            let sealed = core.seal_clients(&mut state);
            (self.snapshot(&mut state, &directory, &sparse_pages), sealed)
        };
        // The pages' entries as the snapshot took them, copied without the write lock.
        snapshot.index_entries = core.map().copy_snapshot_pages(&snapshot.index_pages);
        for batch in sealed {
            core.dispatch(batch)?;
        }
        let taken_pages = std::mem::take(&mut snapshot.index_pages);
        let index_pages_written = taken_pages.len() as u64;
        let table_pages_written = snapshot.table_pages.len() as u64;
        let taken_shared_pages: Vec<u64> = snapshot.shared_pages.iter().map(|(page, _)| *page).collect();
        let taken_name_pages: Vec<u64> = snapshot.name_pages.iter().map(|(page, _)| *page).collect();
        let taken_table_pages: Vec<u64> = snapshot.table_pages.iter().map(|(page, _, _)| *page).collect();
        let result = self.write_snapshot(&mut directory, snapshot, batch_bytes);
        match &result {
            // Committed: every clean page's copy is durable and named, so pages may go.
            Ok(_) => core.evict_map_pages_fenced(true),
            // Not committed: what the snapshot took is still to be written.
            Err(_) => {
                for page in taken_pages {
                    core.map().mark_dirty(page);
                }
                core.lock_state_to_write().space_mut().mark_pages_changed(&taken_table_pages);
                core.shared_table().write().mark_dirty(taken_shared_pages);
                if let Some(finder) = core.deduplication() {
                    finder.index().mark_dirty(taken_name_pages);
                }
            }
        }
        drop(directory);
        let generation = result?;
        Counters::add(&core.counters().checkpoints, 1);
        Counters::add(&core.counters().checkpoint_index_pages, index_pages_written);
        Counters::add(&core.counters().checkpoint_table_pages, table_pages_written);
        Counters::add(&core.counters().checkpoint_nanoseconds, started.elapsed().as_nanos() as u64);
        core.reclaim()?;
        Ok(Some(generation))
    }

    /// Steps 2–5 of a checkpoint whose snapshot is taken. When it fails before its commit,
    /// nothing in RAM names the blocks it wrote (the committed checkpoint's copies stay
    /// named) and they are dead: their live units go.
    fn write_snapshot(&self, directory: &mut CheckpointState, snapshot: Snapshot, batch_bytes: u64) -> Result<u64> {
        let generation = snapshot.generation;
        assert!(generation > directory.generation(), "checkpoint {generation} follows the committed one");
        let mut copies = Vec::new();
        let result = self.write_and_commit(directory, snapshot, batch_bytes, &mut copies);
        assert_eq!(
            result.is_ok(),
            directory.generation() == generation,
            "checkpoint {generation} is named in RAM exactly when it is committed"
        );
        if result.is_err() {
            let core = &*self.core;
            let mut state = core.lock_state();
            let killer = state.log().last_sealed_sequence();
            let per_segment = core.geometry().blocks_per_segment();
            for position in copies {
                state.space_mut().remove_live(position / per_segment, core.geometry().live_units_per_block(), killer);
            }
        }
        result
    }

    /// Write the pages, the directories above them and the root (their positions go to
    /// `copies` as they are written), make them durable, commit, and only then name the new
    /// copies in RAM: until the superblocks name the new root, the map and the directory
    /// name the committed checkpoint's copies.
    fn write_and_commit(
        &self,
        directory: &mut CheckpointState,
        snapshot: Snapshot,
        batch_bytes: u64,
        copies: &mut Vec<u64>,
    ) -> Result<u64> {
        let core = &*self.core;
        let generation = snapshot.generation;
        let uuid = *core.volume_uuid();
        // 2. The pages, then the directories above them, then the root.
        let width_bits = core.map().codec().width_bits as u8;
        let index_blocks: Vec<(PageKind, u64, AlignedBuffer)> = snapshot
            .index_entries
            .iter()
            .map(|(page, packed)| {
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                codec::encode_index_page(&mut block, &uuid, *page, generation, width_bits, packed);
                (PageKind::Index, *page, block)
            })
            .collect();
        let index_page_count = snapshot.index_entries.len();
        drop(snapshot.index_entries);
        let (written, _) = self.write_blocks(index_blocks, copies)?;
        let new_index: BTreeMap<u64, PagePointer> = written.into_iter().collect();
        let (table_blocks, digests): (Vec<_>, Vec<_>) = snapshot
            .table_pages
            .into_iter()
            .map(|(page, block, digest)| ((PageKind::SegmentTable, page, block), digest))
            .unzip();
        let (written, _) = self.write_blocks(table_blocks, copies)?;
        let new_tables: BTreeMap<u64, (PagePointer, u32)> =
            written.into_iter().zip(digests).map(|((page, pointer), digest)| (page, (pointer, digest))).collect();
        let shared_blocks: Vec<(PageKind, u64, AlignedBuffer)> =
            snapshot.shared_pages.into_iter().map(|(page, block)| (PageKind::SharedTable, page, block)).collect();
        let (written, _) = self.write_blocks(shared_blocks, copies)?;
        let new_shared: BTreeMap<u64, PagePointer> = written.into_iter().collect();
        let name_blocks: Vec<(PageKind, u64, AlignedBuffer)> =
            snapshot.name_pages.into_iter().map(|(page, block)| (PageKind::NameTable, page, block)).collect();
        if let Some(finder) = core.deduplication() {
            finder
                .counters
                .name_pages_written
                .fetch_add(name_blocks.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        let (written, _) = self.write_blocks(name_blocks, copies)?;
        let new_names: BTreeMap<u64, PagePointer> = written.into_iter().collect();
        let mut directory_written = Vec::new();
        let map = core.map();
        let sparse = &snapshot.sparse_directory_pages;
        let (index_depth, index_top) = self.write_tree(
            TreeLeaves {
                tree: Tree::Index,
                count: map.page_count(),
                leaf: &|page| new_index.get(&page).copied().or_else(|| map.copy(page)),
                changed: &|first, end| new_index.range(first..end).next().is_some(),
            },
            directory,
            sparse,
            generation,
            &mut directory_written,
            copies,
        )?;
        let (segment_depth, segment_top) = self.write_tree(
            TreeLeaves {
                tree: Tree::SegmentTable,
                count: directory.table_page_count(),
                leaf: &|page| new_tables.get(&page).map(|(pointer, _)| *pointer).or_else(|| directory.table_page(page)),
                changed: &|first, end| new_tables.range(first..end).next().is_some(),
            },
            directory,
            sparse,
            generation,
            &mut directory_written,
            copies,
        )?;
        let (shared_depth, shared_top) = self.write_tree(
            TreeLeaves {
                tree: Tree::SharedTable,
                count: directory.shared_page_count(),
                leaf: &|page| new_shared.get(&page).copied().or_else(|| directory.shared_page(page)),
                changed: &|first, end| new_shared.range(first..end).next().is_some(),
            },
            directory,
            sparse,
            generation,
            &mut directory_written,
            copies,
        )?;
        let (name_depth, name_top) = self.write_tree(
            TreeLeaves {
                tree: Tree::NameTable,
                count: directory.name_page_count(),
                leaf: &|page| new_names.get(&page).copied().or_else(|| directory.name_page(page)),
                changed: &|first, end| new_names.range(first..end).next().is_some(),
            },
            directory,
            sparse,
            generation,
            &mut directory_written,
            copies,
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
            epoch: core.epoch(),
            data_blocks: snapshot.counts.data_blocks,
            zero_blocks: snapshot.counts.zero_blocks,
            fragment_blocks: snapshot.counts.fragment_blocks,
            fragment_sixteenths: snapshot.counts.fragment_sixteenths,
            shared_blocks: snapshot.counts.shared_blocks,
            shared_tree_depth: shared_depth,
            shared_top,
            name_slots: directory.name_shape().0,
            name_sampling_bits: directory.name_shape().1,
            name_tree_depth: name_depth,
            name_top,
        };
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        root.encode(&mut block, &uuid);
        let (written, root_batch) = self.write_blocks(vec![(PageKind::Root, generation, block)], copies)?;
        let root_pointer = written[0].1;
        // (Mount replays the log from the snapshot on: the checkpoint's blocks come after.)
        assert!(root_batch > snapshot.sequence, "checkpoint {generation}'s blocks follow its snapshot in the log");
        assert_eq!(new_index.len(), index_page_count, "checkpoint {generation} wrote every index page it took");
        // 3. Every batch up to the root's durable.
        core.make_durable(root_batch)?;
        // 4. The commit point: the superblocks name the new root.
        core.members().update_superblock(|superblock| {
            superblock.checkpoint = Some(CheckpointReference {
                root_position: root_pointer.position,
                root_checksum: root_pointer.checksum,
                generation,
                sequence: snapshot.sequence,
            });
            superblock.durable_through_sequence = superblock.durable_through_sequence.max(root_batch);
        })?;
        // 5. Named in RAM now; the copies the previous checkpoint named and this one
        // replaced are dead.
        let mut dying: Vec<u64> = Vec::new();
        for (page, pointer) in new_index {
            dying.extend(map.set_copy(page, pointer).map(|old| old.position));
        }
        for (page, (pointer, digest)) in new_tables {
            dying.extend(directory.set_table_page(page, pointer, digest).map(|old| old.position));
        }
        for (page, pointer) in new_shared {
            dying.extend(directory.set_shared_page(page, pointer).map(|old| old.position));
        }
        for (page, pointer) in new_names {
            dying.extend(directory.set_name_page(page, pointer).map(|old| old.position));
        }
        Counters::add(&core.counters().checkpoint_directory_pages, directory_written.len() as u64);
        dying.extend(directory.committed(generation, root_pointer, directory_written, batch_bytes));
        let mut state = core.lock_state();
        let durable = state.log().durable_through();
        assert!(durable >= root_batch, "the root's batch is durable before the commit");
        let space = state.space_mut();
        space.checkpoint_committed(generation);
        let per_segment = core.geometry().blocks_per_segment();
        for position in dying {
            space.remove_live(position / per_segment, core.geometry().live_units_per_block(), durable);
        }
        Ok(generation)
    }

    /// The index pages whose copy sits in a mostly dead metadata segment, brought into RAM
    /// (callers hold the checkpoint lock, so they stay there until the snapshot takes them).
    fn sparse_pages(&self) -> Result<Vec<u64>> {
        let core = &*self.core;
        let geometry = core.geometry();
        let per_segment = geometry.blocks_per_segment();
        let sparse: Vec<bool> = {
            let state = core.lock_state();
            state.space().uses().map(|(_, usage)| usage.is_mostly_dead(geometry)).collect()
        };
        let pages: Vec<u64> = core
            .map()
            .copies()
            .filter(|(_, pointer)| sparse[(pointer.position / per_segment) as usize])
            .map(|(page, _)| page)
            .collect();
        for &page in &pages {
            core.map().ensure_resident(page)?;
        }
        Ok(pages)
    }

    /// Step 1 under the write lock: the dirty index pages and `sparse_pages`, the changed
    /// segment table pages, the streams' positions.
    fn snapshot(&self, state: &mut WriteState, directory: &CheckpointState, sparse_pages: &[u64]) -> Snapshot {
        let core = &*self.core;
        // (The map and the table then reflect exactly the batches up to its sequence.)
        assert!(
            state.log().open().is_none_or(|open| open.is_empty()) && state.log().cold().is_none(),
            "a snapshot follows the clients' batches sealed"
        );
        let generation = state.space().checkpoints().snapshot.max(directory.generation()) + 1;
        state.space_mut().snapshot_taken(generation);
        let changed_table_pages = state.space_mut().take_changed_pages();
        let geometry = core.geometry();
        let per_segment = geometry.blocks_per_segment();
        let space = state.space();
        let sparse = |pointer: Option<PagePointer>| {
            pointer.is_some_and(|pointer| space.usage(pointer.position / per_segment).is_mostly_dead(geometry))
        };
        let map = core.map();
        let mut pages = map.take_dirty_list();
        pages.extend_from_slice(sparse_pages);
        pages.sort_unstable();
        pages.dedup();
        map.begin_snapshot();
        let index_pages: Vec<u64> = pages.into_iter().filter(|&page| map.take_page(page)).collect();
        let counts = map.counts();
        // (Mount refuses a root whose counts exceed the volume.)
        assert!(
            counts.data_blocks + counts.zero_blocks + counts.fragment_blocks + counts.shared_blocks
                <= geometry.logical_block_count(),
            "the map's counts fit the volume: {counts:?}"
        );
        assert!(
            counts.fragment_sixteenths <= counts.fragment_blocks * format::SIXTEENTHS_PER_BLOCK as u64,
            "a fragment takes at most a block: {counts:?}"
        );
        // The segment table's pages with a changed record, and those in mostly dead
        // segments; a page whose records equal its committed copy's is not written.
        let mut table_page_numbers = changed_table_pages;
        table_page_numbers.extend((0..directory.table_page_count()).filter(|&page| sparse(directory.table_page(page))));
        table_page_numbers.sort_unstable();
        table_page_numbers.dedup();
        let mut table_pages = Vec::new();
        let segment_count = space.segment_count();
        for page in table_page_numbers {
            let first = page * SEGMENT_RECORDS_PER_PAGE as u64;
            let end = (first + SEGMENT_RECORDS_PER_PAGE as u64).min(segment_count);
            let records: Vec<SegmentRecord> = (first..end).map(|segment| space.usage(segment).record()).collect();
            let digest = records_digest(&records);
            let pointer = directory.table_page(page);
            let unchanged = match pointer {
                Some(_) => directory.table_page_unchanged(page, digest),
                // Never written: every record free, as mount takes a missing page.
                None => records.iter().all(|record| *record == SegmentUse::FREE.record()),
            };
            if !unchanged || sparse(pointer) {
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                SegmentTablePage { first_segment: first, generation, records }.encode(&mut block, core.volume_uuid());
                table_pages.push((page, block, digest));
            }
        }
        // The shared-block table's changed pages (and those in mostly dead segments).
        let mut shared_table = core.shared_table().write();
        let mut shared_page_numbers = shared_table.take_dirty_pages();
        shared_page_numbers
            .extend(directory.shared_pages().filter(|(_, pointer)| sparse(Some(*pointer))).map(|(page, _)| page));
        shared_page_numbers.sort_unstable();
        shared_page_numbers.dedup();
        let shared_pages = shared_page_numbers
            .into_iter()
            .filter(|&page| page < directory.shared_page_count())
            .map(|page| {
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                codec::encode_shared_table_page(
                    &mut block,
                    core.volume_uuid(),
                    page,
                    generation,
                    &shared_table.page(page),
                );
                (page, block)
            })
            .collect();
        drop(shared_table);
        // The name index's changed pages (and those in mostly dead segments) that are
        // loaded, at most what the headroom counts; the rest wait for the next checkpoint.
        let mut name_pages = Vec::new();
        if let Some(finder) = core.deduplication() {
            let table = finder.index();
            let mut numbers = table.take_dirty_pages();
            numbers.extend(
                directory
                    .name_pages()
                    .filter(|(page, pointer)| sparse(Some(*pointer)) && table.is_loaded(*page))
                    .map(|(page, _)| page),
            );
            numbers.sort_unstable();
            numbers.dedup();
            numbers.retain(|&page| page < directory.name_page_count());
            let most = crate::index::directory::name_table_pages_per_checkpoint(geometry) as usize;
            if numbers.len() > most {
                table.mark_dirty(numbers.split_off(most));
            }
            let (_, sampling_bits) = directory.name_shape();
            name_pages = numbers
                .into_iter()
                .map(|page| {
                    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                    codec::encode_name_table_page(
                        &mut block,
                        core.volume_uuid(),
                        page,
                        generation,
                        sampling_bits,
                        &table.page_slots(page),
                    );
                    (page, block)
                })
                .collect();
        }
        let sparse_directory_pages = directory
            .directory_page_copies()
            .filter(|pointer| sparse(Some(*pointer)))
            .map(|pointer| pointer.position)
            .collect();
        let log = state.log();
        let streams = std::array::from_fn(|stream| {
            if stream >= STREAM_COUNT {
                return StreamPosition::default();
            }
            let current = log.current(stream);
            StreamPosition {
                current_segment: current.map(|current| current.segment),
                next_row: current.map_or(0, |current| current.next_row),
                reserved_segment: log.reserved(stream),
            }
        });
        Snapshot {
            generation,
            sequence: log.last_sealed_sequence(),
            last_segment: log.last_sealed_segment(),
            write_clock: state.lifetimes().write_clock,
            durable_through_sequence: log.durable_through(),
            streams,
            counts,
            index_pages,
            index_entries: Vec::new(),
            table_pages,
            shared_pages,
            name_pages,
            sparse_directory_pages,
        }
    }

    /// Write the directory pages of one tree that need writing, bottom up: those with a
    /// page below written now, with no copy yet, or whose copy is in `sparse` (a mostly
    /// dead segment); every other one keeps the copy the committed checkpoint names
    /// (docs/index-and-checkpoints.md, "Directory pages are written when they change").
    /// Returns the tree's depth and the root's top pointers; the pages written go to
    /// `written`.
    fn write_tree(
        &self,
        leaves: TreeLeaves,
        committed: &CheckpointState,
        sparse: &HashSet<u64>,
        generation: u64,
        written: &mut Vec<DirectoryPageCopy>,
        copies: &mut Vec<u64>,
    ) -> Result<(u8, Vec<Option<PagePointer>>)> {
        let tree = leaves.tree;
        let depth = codec::tree_depth(leaves.count);
        // The level below's pointers and which of them were written now (the leaves are
        // read a directory page's worth at a time: a large volume has millions).
        let mut level_pointers: Vec<Option<PagePointer>> = Vec::new();
        let mut level_written: Vec<bool> = Vec::new();
        let mut level_count = leaves.count;
        for level in 1..=depth {
            let mut blocks = Vec::new();
            let mut numbers = Vec::new();
            let parent_count = level_count.div_ceil(DIRECTORY_FANOUT as u64);
            let mut parents = vec![None; parent_count as usize];
            let mut parents_written = vec![false; parent_count as usize];
            for index in 0..parent_count {
                let first = index * DIRECTORY_FANOUT as u64;
                let end = (first + DIRECTORY_FANOUT as u64).min(level_count);
                let old = committed.directory_page(tree, level, index);
                let below_written = if level == 1 {
                    (leaves.changed)(first, end)
                } else {
                    level_written[first as usize..end as usize].iter().any(|written| *written)
                };
                if let Some(old) = old.filter(|old| !below_written && !sparse.contains(&old.position)) {
                    parents[index as usize] = Some(old);
                    continue;
                }
                let children: Vec<Option<PagePointer>> = if level == 1 {
                    (first..end).map(leaves.leaf).collect()
                } else {
                    level_pointers[first as usize..end as usize].to_vec()
                };
                // (Leaves keep their copies once written: a page with a copy has children.)
                if children.iter().all(Option::is_none) {
                    assert!(old.is_none(), "{tree:?} directory page {level}/{index} lost every page below it");
                    continue;
                }
                let page = DirectoryPage {
                    tree,
                    level,
                    first_page: index * DIRECTORY_FANOUT as u64,
                    generation,
                    pointers: children,
                };
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                page.encode(&mut block, self.core.volume_uuid());
                // The page number in the summary: the level in the top byte.
                blocks.push((PageKind::Directory, (level as u64) << 56 | index, block));
                numbers.push(index);
            }
            let (new_copies, _) = self.write_blocks(blocks, copies)?;
            for ((_, pointer), number) in new_copies.into_iter().zip(numbers) {
                parents[number as usize] = Some(pointer);
                parents_written[number as usize] = true;
                written.push(DirectoryPageCopy { tree, level, number, pointer });
            }
            level_pointers = parents;
            level_written = parents_written;
            level_count = parent_count;
        }
        if depth == 0 {
            level_pointers = (0..leaves.count).map(leaves.leaf).collect();
        }
        debug_assert!(level_pointers.len() <= ROOT_TOP_POINTERS);
        Ok((depth, level_pointers))
    }

    /// Write checkpoint blocks into the metadata stream, in batches of their own that take
    /// their place in the log order like the cleaner's. Returns each block's pointer (by
    /// its number) and the sequence of the last batch; each block's position also goes to
    /// `copies` as soon as it is accepted (a failure after it leaves it counted live).
    fn write_blocks(
        &self,
        blocks: Vec<(PageKind, u64, AlignedBuffer)>,
        copies: &mut Vec<u64>,
    ) -> Result<(Vec<(u64, PagePointer)>, u64)> {
        let mut written = Vec::with_capacity(blocks.len());
        let mut last_batch = 0;
        let mut next = 0;
        while next < blocks.len() {
            let mut side = self.core.begin_side_batch(METADATA_STREAM, SideKind::Metadata)?;
            while next < blocks.len() {
                let (kind, number, block) = &blocks[next];
                let Some(position) = side.accept_page(*kind, *number, block) else {
                    break;
                };
                copies.push(position);
                written.push((*number, PagePointer { position, checksum: format::block_checksum(block) }));
                next += 1;
            }
            // Never empty: a fresh side batch has room for a summary and a block.
            last_batch = side.finish()?;
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
    let mut directory_pages = Vec::new();
    let index_page_count = map.page_count();
    load_tree(
        geometry,
        members,
        volume_uuid,
        Tree::Index,
        root.index_tree_depth,
        &root.index_top,
        &mut |page, pointer| page < index_page_count && map.set_copy(page, pointer).is_none(),
        &mut directory_pages,
    )?;
    // Each leaf once, within its tree.
    let leaf_into =
        |leaves: &mut Vec<Option<PagePointer>>, page: u64, pointer: PagePointer| match leaves.get_mut(page as usize) {
            Some(leaf @ None) => {
                *leaf = Some(pointer);
                true
            }
            _ => false,
        };
    let mut table_pages = vec![None; state.table_page_count() as usize];
    load_tree(
        geometry,
        members,
        volume_uuid,
        Tree::SegmentTable,
        root.segment_tree_depth,
        &root.segment_top,
        &mut |page, pointer| leaf_into(&mut table_pages, page, pointer),
        &mut directory_pages,
    )?;
    let mut shared_pages = vec![None; state.shared_page_count() as usize];
    load_tree(
        geometry,
        members,
        volume_uuid,
        Tree::SharedTable,
        root.shared_tree_depth,
        &root.shared_top,
        &mut |page, pointer| leaf_into(&mut shared_pages, page, pointer),
        &mut directory_pages,
    )?;
    // The name index: its pages are read after the open (`Volume`'s name loader).
    let name_page_count =
        name_table_page_count(geometry, root.name_slots).ok_or(lost("root", reference.root_position))?;
    state.set_name_shape((root.name_slots, root.name_sampling_bits), name_page_count);
    let mut name_pages = vec![None; name_page_count as usize];
    load_tree(
        geometry,
        members,
        volume_uuid,
        Tree::NameTable,
        root.name_tree_depth,
        &root.name_top,
        &mut |page, pointer| leaf_into(&mut name_pages, page, pointer),
        &mut directory_pages,
    )?;
    for (page, pointer) in name_pages.into_iter().enumerate() {
        if let Some(pointer) = pointer {
            state.set_name_page(page as u64, pointer);
        }
    }
    state.loaded(root.generation, root_pointer, directory_pages);
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
    for (page, pointer) in table_pages.into_iter().enumerate() {
        let page = page as u64;
        let Some(pointer) = pointer else { continue };
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
        state.set_table_page(page, pointer, records_digest(page_records));
    }
    let mut shared = crate::space::shared::SharedTable::default();
    for (page, pointer) in shared_pages.into_iter().enumerate() {
        let (page, Some(pointer)) = (page as u64, pointer) else { continue };
        state.set_shared_page(page, pointer);
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

/// Pages of a name index of `slots` slots, when a table of the volume can have that many
/// (at most one slot per data position at one hook per block, in whole buckets).
fn name_table_page_count(geometry: &Geometry, slots: u64) -> Option<u64> {
    let most = crate::index::names::NameTable::page_count_of(geometry.physical_data_blocks(), 0)
        * crate::index::names::SLOTS_PER_PAGE as u64;
    let bucket = crate::index::names::SLOTS_PER_BUCKET as u64;
    (geometry.shared_blocks || slots == 0).then_some(())?;
    (slots <= most && slots.is_multiple_of(bucket))
        .then(|| (slots / bucket).div_ceil(crate::index::names::BUCKETS_PER_PAGE))
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
    directory_pages: &mut Vec<DirectoryPageCopy>,
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
        directory_pages.push(DirectoryPageCopy { tree, level, number: index, pointer });
        for (child, pointer) in page.pointers.iter().enumerate() {
            if let Some(pointer) = pointer {
                pending.push((level - 1, index * DIRECTORY_FANOUT as u64 + child as u64, *pointer));
            }
        }
    }
    Ok(())
}
