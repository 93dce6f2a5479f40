//! Where the checkpoint's blocks are: per segment table page the position and CRC32C of
//! its latest copy (each index page's is kept by the map, `BlockMap::copy`), and what the
//! checkpoint writer keeps between checkpoints (docs/index-and-checkpoints.md). The writer is the checkpoint module, a later layer.

use crate::index::map::{BlockMap, PointerArray};
use crate::layout::checkpoint::{PagePointer, SegmentRecord, Tree, SEGMENT_RECORDS_PER_PAGE};
use crate::layout::geometry::Geometry;
use std::time::{Duration, Instant};

/// A checkpoint is written when the index pages changed since the last one reach this
/// many (they are copied while writers wait, and mount may have to read them back) ...
pub const CHECKPOINT_DIRTY_PAGES_MAXIMUM: u64 = 16 * 1024;
/// ... or, when more, this many per directory page the committed checkpoint names: under
/// uniform random writes over a large volume nearly every directory page has a page below
/// it that changed, so each checkpoint writes them all, and its changed index pages must
/// outnumber them for the directory to stay a small share of what it writes.
pub const CHECKPOINT_DIRTY_PAGES_PER_DIRECTORY_PAGE: u64 = 4;
/// ... or when this many bytes of batches were written since (what a mount after a
/// crash reads the summaries of).
pub const CHECKPOINT_REPLAY_BUDGET_BYTES: u64 = 1 << 30;

/// What the committed checkpoint holds, and what its writer keeps between checkpoints:
/// where each segment table and shared-block table page's latest copy is (each index
/// page's, the map keeps itself: its loaders read it without a lock), the directory pages
/// and root, the generation. Kept under `io::Core`'s checkpoint lock, which also
/// serialises checkpoints and holds page eviction off from a snapshot to its commit.
pub(crate) struct CheckpointState {
    table_pages: PointerArray,
    /// Per segment table page: CRC32C of the records it was last written with (a page
    /// whose records did not change is not written again).
    table_digests: Vec<u32>,
    /// Per shared-block table page (volumes with deduplication): its latest copy.
    shared_pages: PointerArray,
    /// Per page of deduplication's name index: its latest copy; and the slots and sampling
    /// bits of the table they were cut from (a table of another shape cannot load them).
    name_pages: PointerArray,
    name_shape: (u64, u8),
    /// The directory pages the committed checkpoint names, per tree (by `Tree`'s number),
    /// per level (index 0: level 1, above the leaves), by number within the level. A
    /// checkpoint writes again only the ones whose pages below changed (or that lie in a
    /// mostly dead segment); the others stay named and live.
    directory_pages: [Vec<Vec<Option<PagePointer>>>; TREE_COUNT],
    /// Blocks that die at the next commit although no page replaces them: the pages and
    /// directory pages of a name index of another shape.
    dying_at_next_commit: Vec<u64>,
    /// How many directory pages the committed checkpoint names.
    directory_page_count: u64,
    root: Option<PagePointer>,
    /// The latest committed generation (0: none).
    generation: u64,
    /// When the latest checkpoint was committed, and the batches written by then.
    committed_at: Instant,
    batch_bytes_at_commit: u64,
}

impl CheckpointState {
    /// No checkpoint yet: every page is written by the first one.
    pub(crate) fn empty(geometry: &Geometry) -> CheckpointState {
        let table_page_count = geometry.segment_count().div_ceil(SEGMENT_RECORDS_PER_PAGE as u64);
        CheckpointState {
            table_pages: PointerArray::new(table_page_count),
            table_digests: vec![0; table_page_count as usize],
            shared_pages: PointerArray::new(shared_table_page_count(geometry)),
            name_pages: PointerArray::new(0),
            name_shape: (0, 0),
            directory_pages: Default::default(),
            dying_at_next_commit: Vec::new(),
            directory_page_count: 0,
            root: None,
            generation: 0,
            committed_at: Instant::now(),
            batch_bytes_at_commit: 0,
        }
    }

    /// The state of a checkpoint mount loaded: its generation and root, the directory
    /// pages it read; the table pages' pointers are set by [`CheckpointState::set_table_page`]
    /// and [`CheckpointState::set_shared_page`] as the trees are walked.
    pub(crate) fn loaded(&mut self, generation: u64, root: PagePointer, directory_pages: Vec<DirectoryPageCopy>) {
        assert_eq!(self.generation, 0, "loaded once, into an empty state");
        self.generation = generation;
        self.root = Some(root);
        for page in directory_pages {
            assert!(self.name_directory_page(page).is_none(), "directory page {page:?} named twice");
        }
    }

    /// Record `page` as named by the committed checkpoint; the copy it replaces.
    fn name_directory_page(&mut self, page: DirectoryPageCopy) -> Option<PagePointer> {
        let levels = &mut self.directory_pages[page.tree as usize];
        let level = page.level as usize - 1;
        if levels.len() <= level {
            levels.resize_with(level + 1, Vec::new);
        }
        let pages = &mut levels[level];
        if pages.len() <= page.number as usize {
            pages.resize(page.number as usize + 1, None);
        }
        let old = pages[page.number as usize].replace(page.pointer);
        self.directory_page_count += u64::from(old.is_none());
        old
    }

    /// The copy of directory page `number` of `tree` at `level` (1: above the leaves) the
    /// committed checkpoint names.
    pub(crate) fn directory_page(&self, tree: Tree, level: u8, number: u64) -> Option<PagePointer> {
        *self.directory_pages[tree as usize].get(level as usize - 1)?.get(number as usize)?
    }

    /// Every directory page the committed checkpoint names.
    pub(crate) fn directory_page_copies(&self) -> impl Iterator<Item = PagePointer> + '_ {
        self.directory_pages.iter().flatten().flatten().filter_map(|pointer| *pointer)
    }

    /// Invariant: the count `due` weighs checkpoints by is the directory pages named.
    pub(crate) fn check_invariants(&self) {
        assert_eq!(
            self.directory_page_count,
            self.directory_page_copies().count() as u64,
            "the directory page count follows the directory pages named"
        );
    }

    /// The latest committed generation (0: none).
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn table_page_count(&self) -> u64 {
        self.table_pages.len()
    }

    pub(crate) fn table_page(&self, page: u64) -> Option<PagePointer> {
        self.table_pages.get(page)
    }

    /// Whether segment table page `page` was last written with records of digest `digest`.
    pub(crate) fn table_page_unchanged(&self, page: u64, digest: u32) -> bool {
        self.table_digests[page as usize] == digest
    }

    /// Segment table page `page` is at `pointer`, written with records of digest `digest`;
    /// the copy it replaces, which dies when the checkpoint is committed.
    pub(crate) fn set_table_page(&mut self, page: u64, pointer: PagePointer, digest: u32) -> Option<PagePointer> {
        self.table_digests[page as usize] = digest;
        self.table_pages.set(page, pointer)
    }

    pub(crate) fn shared_page_count(&self) -> u64 {
        self.shared_pages.len()
    }

    pub(crate) fn shared_page(&self, page: u64) -> Option<PagePointer> {
        self.shared_pages.get(page)
    }

    /// The shared-block table pages written, with their copies.
    pub(crate) fn shared_pages(&self) -> impl Iterator<Item = (u64, PagePointer)> + '_ {
        self.shared_pages.iter()
    }

    /// Shared-block table page `page` is at `pointer`; the copy it replaces.
    pub(crate) fn set_shared_page(&mut self, page: u64, pointer: PagePointer) -> Option<PagePointer> {
        self.shared_pages.set(page, pointer)
    }

    /// The name index's pages as a checkpoint names them: `page_count` pages of a table of
    /// `shape` (slots, sampling bits).
    pub(crate) fn set_name_shape(&mut self, shape: (u64, u8), page_count: u64) {
        assert_eq!(self.name_pages.iter().count(), 0, "the shape is set before any page");
        self.name_shape = shape;
        self.name_pages = PointerArray::new(page_count);
    }

    pub(crate) fn name_shape(&self) -> (u64, u8) {
        self.name_shape
    }

    /// The open's name table has `shape` and `page_count` pages: `true` when the pages
    /// the checkpoint named were cut from a table of that shape (they load into it);
    /// otherwise they die at the next commit (with the directory pages) and the table
    /// starts empty.
    pub(crate) fn adopt_name_shape(&mut self, shape: (u64, u8), page_count: u64) -> bool {
        if self.name_shape == shape && self.name_pages.len() == page_count {
            return true;
        }
        let stale: Vec<u64> = self.name_pages.iter().map(|(_, pointer)| pointer.position).collect();
        self.dying_at_next_commit.extend(stale);
        let directory = std::mem::take(&mut self.directory_pages[Tree::NameTable as usize]);
        let stale_directory: Vec<u64> =
            directory.into_iter().flatten().flatten().map(|pointer| pointer.position).collect();
        self.directory_page_count = self
            .directory_page_count
            .checked_sub(stale_directory.len() as u64)
            .expect("the directory page count counts every page named, these among them");
        self.dying_at_next_commit.extend(stale_directory);
        self.name_shape = shape;
        self.name_pages = PointerArray::new(page_count);
        false
    }

    pub(crate) fn name_page_count(&self) -> u64 {
        self.name_pages.len()
    }

    pub(crate) fn name_page(&self, page: u64) -> Option<PagePointer> {
        self.name_pages.get(page)
    }

    /// The name index pages written, with their copies.
    pub(crate) fn name_pages(&self) -> impl Iterator<Item = (u64, PagePointer)> + '_ {
        self.name_pages.iter()
    }

    /// Name index page `page` is at `pointer`; the copy it replaces.
    pub(crate) fn set_name_page(&mut self, page: u64, pointer: PagePointer) -> Option<PagePointer> {
        self.name_pages.set(page, pointer)
    }

    /// The checkpoint of `generation` is committed with `root`, having written the directory
    /// pages `written`, `batch_bytes` written by then: the directory pages and root of the
    /// one before that it replaces are returned (they are dead now).
    pub(crate) fn committed(
        &mut self,
        generation: u64,
        root: PagePointer,
        written: Vec<DirectoryPageCopy>,
        batch_bytes: u64,
    ) -> Vec<u64> {
        assert!(generation > self.generation, "committed generations increase");
        // (Otherwise the new root would die with the old one's position.)
        assert!(
            self.root.is_none_or(|old| old.position != root.position),
            "checkpoint {generation}'s root is a new block"
        );
        let mut dying = std::mem::take(&mut self.dying_at_next_commit);
        for page in written {
            dying.extend(self.name_directory_page(page).map(|old| old.position));
        }
        dying.extend(self.root.replace(root).map(|root| root.position));
        self.generation = generation;
        self.committed_at = Instant::now();
        self.batch_bytes_at_commit = batch_bytes;
        dying
    }

    /// Whether a checkpoint is due: many dirty pages (or half the map cache: they cannot
    /// be evicted before one), a large replay, or a long time with writes. `batch_bytes`:
    /// bytes of batches written since the volume was opened.
    pub(crate) fn due(&self, map: &BlockMap, batch_bytes: u64, interval: Duration) -> Option<CheckpointCause> {
        let replay_bytes = batch_bytes.saturating_sub(self.batch_bytes_at_commit);
        let per_directory = CHECKPOINT_DIRTY_PAGES_PER_DIRECTORY_PAGE * self.directory_page_count;
        if map.dirty_page_count() >= CHECKPOINT_DIRTY_PAGES_MAXIMUM.max(per_directory).min(map.dirty_pages_due()) {
            Some(CheckpointCause::DirtyPages)
        } else if replay_bytes >= CHECKPOINT_REPLAY_BUDGET_BYTES {
            Some(CheckpointCause::ReplayBytes)
        } else if replay_bytes > 0 && self.committed_at.elapsed() >= interval {
            Some(CheckpointCause::Interval)
        } else {
            None
        }
    }

    /// Where every checkpoint block of the committed checkpoint is (its live copies).
    pub(crate) fn live_positions<'a>(&'a self, map: &'a BlockMap) -> impl Iterator<Item = u64> + 'a {
        map.copies()
            .chain(self.table_pages.iter())
            .chain(self.shared_pages.iter())
            .chain(self.name_pages.iter())
            .map(|(_, pointer)| pointer.position)
            .chain(self.directory_page_copies().map(|pointer| pointer.position))
            .chain(self.dying_at_next_commit.iter().copied())
            .chain(self.root.map(|root| root.position))
    }
}

/// The trees of directory pages (`Tree`).
const TREE_COUNT: usize = 4;

/// A directory page's copy: which tree, level (1: above the leaves) and number within the
/// level, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirectoryPageCopy {
    pub tree: Tree,
    pub level: u8,
    pub number: u64,
    pub pointer: PagePointer,
}

/// Why a checkpoint is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CheckpointCause {
    /// The dirty index pages reached their bound (they cannot be evicted until written).
    DirtyPages,
    /// The batches a mount after a crash would replay reached their budget.
    ReplayBytes,
    /// The interval passed with a batch written.
    Interval,
}

/// Pages the shared-block table may take: one record per data position at most (zero
/// without deduplication).
pub(crate) fn shared_table_page_count(geometry: &Geometry) -> u64 {
    if geometry.shared_blocks {
        geometry.physical_data_blocks().div_ceil(crate::layout::checkpoint::SHARED_RECORDS_PER_PAGE as u64)
    } else {
        0
    }
}

/// Name index pages a checkpoint writes at most (the checkpoint headroom counts them):
/// the pages of the table at the default sampling (zero without deduplication). A table
/// with more (fewer sampling bits) writes the rest at later checkpoints.
pub(crate) fn name_table_pages_per_checkpoint(geometry: &Geometry) -> u64 {
    if geometry.shared_blocks {
        crate::index::names::NameTable::page_count_of(
            geometry.physical_data_blocks(),
            crate::index::names::DEFAULT_SAMPLING_BITS,
        )
    } else {
        0
    }
}

/// Digest of a segment table page's records (what decides whether it is written again).
pub(crate) fn records_digest(records: &[SegmentRecord]) -> u32 {
    let mut bytes = Vec::with_capacity(records.len() * 32);
    for record in records {
        bytes.extend_from_slice(&record.live_units.to_le_bytes());
        bytes.extend_from_slice(&[record.status, record.stream, record.pinned as u8, 0]);
        bytes.extend_from_slice(&record.age_clock.to_le_bytes());
        bytes.extend_from_slice(&record.opened_clock.to_le_bytes());
        bytes.extend_from_slice(&record.sealed_rows.to_le_bytes());
    }
    crc32c::crc32c(&bytes)
}
