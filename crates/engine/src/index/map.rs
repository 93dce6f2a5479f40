//! The logical-to-physical map: one entry per logical 4 KiB block, bit-packed as narrow
//! as the volume allows, in pages (docs/index-and-checkpoints.md, "Decisions" 1 and
//! "Paging"). A page is in RAM or only in the log: the map knows where each
//! page's latest copy is, loads a missing page on demand from a [`PageSource`], and
//! evicts clean pages to stay within its cache. Readers take no lock: each page has a
//! sequence counter (a seqlock) that its writer makes odd while it changes the page; a
//! reader that saw it change reads again. Writers are the engine's state-lock holders, one
//! at a time per page; an evictor takes a page as a writer would.

use crate::error::{Error, LostMetadata, Result};
use crate::layout::checkpoint::PagePointer;
use crate::layout::geometry::Geometry;
use crossbeam_epoch as epoch;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of entries in an index page (a 4 KiB block less its 64-byte header and CRC).
pub const PAGE_ENTRY_BYTES: usize = 4028;

pub use crate::layout::mapping::Mapping;

/// How mappings become entries for one volume: `0` unmapped, `1 + p` data at position
/// `p`, `1 + P + s` zeros recorded in segment `s`, `1 + P + S + s` trimmed there, and on
/// volumes with packed fragments `1 + P + 2S + 16·p + (k − 1)` a fragment of `k`
/// sixteenths in the packed block at `p`, and on volumes with deduplication
/// `1 + P + 2S + F + r` shared-block record `r` (`F` = 16·P with fragments, else 0), for
/// `P` positions and `S` segments; `width_bits` is what the largest value needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryCodec {
    positions: u64,
    segments: u64,
    fragments: bool,
    shared: bool,
    pub width_bits: u32,
}

const SIXTEENTHS: u64 = crate::layout::format::SIXTEENTHS_PER_BLOCK as u64;

impl EntryCodec {
    pub fn new(positions: u64, segments: u64) -> EntryCodec {
        EntryCodec::with_fragments(positions, segments, false)
    }

    pub fn with_fragments(positions: u64, segments: u64, fragments: bool) -> EntryCodec {
        EntryCodec::with_ranges(positions, segments, fragments, false)
    }

    pub fn with_ranges(positions: u64, segments: u64, fragments: bool, shared: bool) -> EntryCodec {
        EntryCodec {
            positions,
            segments,
            fragments,
            shared,
            width_bits: crate::layout::geometry::index_entry_width_bits(positions, segments, fragments, shared),
        }
    }

    pub fn for_geometry(geometry: &Geometry) -> EntryCodec {
        EntryCodec::with_ranges(
            geometry.physical_data_blocks(),
            geometry.segment_count(),
            geometry.packed_fragments,
            geometry.shared_blocks,
        )
    }

    /// Where the shared-block records' range starts.
    fn shared_base(&self) -> u64 {
        let fragments = if self.fragments { SIXTEENTHS * self.positions } else { 0 };
        1 + self.positions + 2 * self.segments + fragments
    }

    /// The entry of `mapping`; positions and segments beyond the volume are a caller's bug.
    pub fn encode(&self, mapping: Mapping) -> u64 {
        let value = match mapping {
            Mapping::Unmapped => 0,
            Mapping::Data { position } => 1 + position,
            Mapping::Zero { segment } => 1 + self.positions + segment,
            Mapping::Trimmed { segment } => 1 + self.positions + self.segments + segment,
            Mapping::Fragment { position, sixteenths } => {
                assert!(self.fragments, "a fragment on a volume without packed fragments");
                assert!((1..=SIXTEENTHS).contains(&(sixteenths as u64)), "{mapping:?}: share outside 1-16");
                1 + self.positions + 2 * self.segments + SIXTEENTHS * position + (sixteenths as u64 - 1)
            }
            Mapping::Shared { record } => {
                assert!(self.shared && record < self.positions, "{mapping:?} on a volume without deduplication");
                self.shared_base() + record
            }
        };
        assert!(value >> self.width_bits == 0, "{mapping:?} is beyond the volume");
        value
    }

    pub fn decode(&self, value: u64) -> Mapping {
        let (positions, segments) = (self.positions, self.segments);
        match value {
            0 => Mapping::Unmapped,
            value if value <= positions => Mapping::Data { position: value - 1 },
            value if value <= positions + segments => Mapping::Zero { segment: value - 1 - positions },
            value if value <= positions + 2 * segments => {
                Mapping::Trimmed { segment: value - 1 - positions - segments }
            }
            value if self.shared && value >= self.shared_base() => {
                Mapping::Shared { record: value - self.shared_base() }
            }
            value => {
                let fragment = value - 1 - positions - 2 * segments;
                Mapping::Fragment { position: fragment / SIXTEENTHS, sixteenths: (fragment % SIXTEENTHS) as u8 + 1 }
            }
        }
    }

    /// Whether `value` is an entry of this volume (below `1 + P + 2S`, or `1 + 17P + 2S`
    /// with packed fragments).
    pub fn is_valid(&self, value: u64) -> bool {
        let shared = if self.shared { self.positions } else { 0 };
        value < self.shared_base() + shared
    }

    /// Entries in one index page.
    pub fn entries_per_page(&self) -> u64 {
        (PAGE_ENTRY_BYTES as u64 * 8) / self.width_bits as u64
    }
}

/// Load locks (a loader holds its page's while it reads and installs it; an evictor
/// only evicts a page whose lock is free).
const LOAD_LOCK_COUNT: usize = 256;

/// Threads that load index pages at once for [`BlockMap::load_pages_of`] (the cleaner's
/// records, spread over many pages): each load is one member read.
const PAGE_LOADS_IN_FLIGHT: usize = 8;

/// Where the map reads a page that is not in RAM: the copy a pointer names, verified,
/// returned as its packed entries (`PAGE_ENTRY_BYTES`, little-endian).
pub trait PageSource: Send + Sync {
    fn read_page(&self, page: u64, pointer: PagePointer) -> Result<Vec<u8>>;
    /// The entries of page `page` in `block`, a copy read elsewhere (a read queue's ring)
    /// from where `pointer` says: `None` unless its checksum proves it is that copy.
    fn decode_page(&self, page: u64, pointer: PagePointer, block: &[u8]) -> Option<Vec<u8>>;
}

/// One page of entries in RAM.
struct Page {
    /// Even: stable; odd: its writer (or evictor) is changing it.
    sequence: AtomicU32,
    /// Changed since the last checkpoint took it.
    dirty: AtomicBool,
    /// Looked up since the eviction clock last passed it.
    referenced: AtomicBool,
    /// Taken out of the map: writers look the page up again.
    evicted: AtomicBool,
    /// In the eviction clock's queue. A dirty page leaves it when the clock passes it and
    /// comes back when a checkpoint takes it, so that the clock visits pages it may
    /// evict, not every dirty page after every write.
    in_clock: AtomicBool,
    /// Taken by a checkpoint's snapshot and not copied yet: the first writer to change it
    /// first leaves its entries as they were in the snapshot stash
    /// ([`BlockMap::copy_snapshot_pages`]).
    snapshot_pending: AtomicBool,
    words: Box<[AtomicU64]>,
}

impl Page {
    fn new(word_count: usize) -> Page {
        Page {
            sequence: AtomicU32::new(0),
            dirty: AtomicBool::new(false),
            referenced: AtomicBool::new(true),
            evicted: AtomicBool::new(false),
            in_clock: AtomicBool::new(true),
            snapshot_pending: AtomicBool::new(false),
            words: (0..word_count).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The `width` bits at `bit` (they may straddle two words).
    fn bits(&self, bit: u64, width: u32) -> u64 {
        let (word, shift) = ((bit / 64) as usize, (bit % 64) as u32);
        let mask = if width == 64 { u64::MAX } else { (1u64 << width) - 1 };
        let low = self.words[word].load(Ordering::Relaxed) >> shift;
        let value =
            if shift + width > 64 { low | (self.words[word + 1].load(Ordering::Relaxed) << (64 - shift)) } else { low };
        value & mask
    }

    fn set_bits(&self, bit: u64, width: u32, value: u64) {
        let (word, shift) = ((bit / 64) as usize, (bit % 64) as u32);
        let mask = if width == 64 { u64::MAX } else { (1u64 << width) - 1 };
        let old = self.words[word].load(Ordering::Relaxed);
        self.words[word].store((old & !(mask << shift)) | (value << shift), Ordering::Relaxed);
        if shift + width > 64 {
            let high_bits = shift + width - 64;
            let high_mask = (1u64 << high_bits) - 1;
            let old = self.words[word + 1].load(Ordering::Relaxed);
            self.words[word + 1].store((old & !high_mask) | (value >> (64 - shift)), Ordering::Relaxed);
        }
    }

    /// Read the entry at `bit` consistently with respect to its writer.
    fn read(&self, bit: u64, width: u32) -> u64 {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
        loop {
            let before = self.sequence.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let value = self.bits(bit, width);
            fence(Ordering::Acquire);
            if self.sequence.load(Ordering::Relaxed) == before {
                return value;
            }
        }
    }

    /// Make the sequence odd (waiting while another writer has it so); returns the even
    /// value it had.
    fn lock(&self) -> u32 {
        let mut current = self.sequence.load(Ordering::Relaxed);
        loop {
            if current % 2 == 1 {
                std::hint::spin_loop();
                current = self.sequence.load(Ordering::Relaxed);
                continue;
            }
            match self.sequence.compare_exchange_weak(current, current + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        fence(Ordering::Release);
        current
    }

    fn unlock(&self, locked_at: u32) {
        assert_eq!(
            self.sequence.load(Ordering::Relaxed),
            locked_at + 1,
            "a page is unlocked by the writer that locked it"
        );
        self.sequence.store(locked_at + 2, Ordering::Release);
    }

    /// Replace the entry at `bit`: the old entry and whether the page became dirty.
    /// `None`: the page was evicted meanwhile (look it up again). A page a snapshot took
    /// and no one copied yet leaves its entries in `stash` first, under its lock.
    fn write(&self, bit: u64, width: u32, value: u64, stash: impl FnOnce(Vec<u8>)) -> Option<(u64, bool)> {
        let locked_at = self.lock();
        if self.evicted.load(Ordering::Relaxed) {
            self.unlock(locked_at);
            return None;
        }
        if self.snapshot_pending.swap(false, Ordering::Relaxed) {
            stash(self.packed());
        }
        let old = self.bits(bit, width);
        self.set_bits(bit, width, value);
        self.referenced.store(true, Ordering::Relaxed);
        let became_dirty = !self.dirty.swap(true, Ordering::Relaxed);
        self.unlock(locked_at);
        Some((old, became_dirty))
    }

    /// Mark the page evicted unless it is dirty (then `false`).
    fn evict(&self) -> bool {
        let locked_at = self.lock();
        let clean = !self.dirty.load(Ordering::Relaxed);
        if clean {
            self.evicted.store(true, Ordering::Relaxed);
        }
        self.unlock(locked_at);
        clean
    }

    fn packed(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.words.len() * 8);
        for word in self.words.iter() {
            bytes.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        bytes.resize(PAGE_ENTRY_BYTES, 0);
        bytes
    }
}

/// A slice of `length` zeroed values, from zeroed memory the system gives lazily: the
/// slots of pages never used cost no resident memory.
///
/// # Safety
/// All-zero bytes must be a valid `T` (an atomic integer or an atomic pointer: zero, null).
unsafe fn zeroed_slice<T>(length: usize) -> Box<[T]> {
    if length == 0 || std::mem::size_of::<T>() == 0 {
        return Vec::new().into_boxed_slice();
    }
    let layout = std::alloc::Layout::array::<T>(length).expect("slice size overflows");
    // SAFETY: the layout has a non-zero size (checked above).
    let memory = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if memory.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `memory` is an allocation of `length` values of `T` made with the global
    // allocator and `Layout::array::<T>(length)` (what `Box<[T]>` frees with), and every
    // value is valid because zeroed memory is a valid `T` (the caller's promise).
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(memory, length)) }
}

/// Where the latest copy of each page of one kind is (index pages, segment table pages):
/// data-space position + 1 (0: never written) and its CRC32C. Atomic, so that the map's
/// loaders read it without the checkpoint writer's lock; made of zeroed memory, which the
/// system gives lazily: a large volume's untouched pages cost no resident memory.
pub(crate) struct PointerArray {
    positions: Box<[AtomicU64]>,
    checksums: Box<[AtomicU32]>,
}

impl PointerArray {
    pub(crate) fn new(length: u64) -> PointerArray {
        PointerArray {
            // SAFETY: a zeroed atomic integer is zero.
            positions: unsafe { zeroed_slice(length as usize) },
            // SAFETY: as above.
            checksums: unsafe { zeroed_slice(length as usize) },
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.positions.len() as u64
    }

    pub(crate) fn get(&self, index: u64) -> Option<PagePointer> {
        let position = self.positions[index as usize].load(Ordering::Acquire);
        (position != 0).then(|| PagePointer {
            position: position - 1,
            checksum: self.checksums[index as usize].load(Ordering::Acquire),
        })
    }

    /// Point page `index` at `pointer` (one writer at a time: the checkpoint writer, or
    /// mount); returns the pointer it replaces.
    pub(crate) fn set(&self, index: u64, pointer: PagePointer) -> Option<PagePointer> {
        let old = self.get(index);
        self.checksums[index as usize].store(pointer.checksum, Ordering::Release);
        self.positions[index as usize].store(pointer.position + 1, Ordering::Release);
        old
    }

    /// Every page that has a copy, and the copy's pointer.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, PagePointer)> + '_ {
        (0..self.len()).filter_map(|index| Some((index, self.get(index)?)))
    }
}

/// What the map's entries are, counted as they change (no scan): logical blocks stored
/// whole, recorded as zeros, and stored as fragments with the sixteenths of a block those
/// take (their physical share).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapCounts {
    pub data_blocks: u64,
    pub zero_blocks: u64,
    pub fragment_blocks: u64,
    pub fragment_sixteenths: u64,
    /// Logical blocks served by shared copies (their copies are counted by the shared
    /// table's records in use, not here).
    pub shared_blocks: u64,
}

impl MapCounts {
    /// The blocks of data the entries hold: whole blocks, and fragments' sixteenths
    /// rounded up to blocks (a thin volume's admission limit counts these).
    pub fn held_blocks(&self) -> u64 {
        self.data_blocks + self.fragment_sixteenths.div_ceil(crate::layout::format::SIXTEENTHS_PER_BLOCK as u64)
    }
}

/// What [`BlockMap::install_read_copy`] did with a page copy read elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadCopy {
    /// The page is in RAM from this copy.
    Installed,
    /// The page was in RAM already; the copy was not needed.
    AlreadyInRam,
    /// Not taken: not the page's current copy, or not what its pointer names.
    Refused,
}

/// What the eviction clock did with a page it passed.
enum Visit {
    Evicted,
    /// Used since the last pass (its bit is cleared now), or its load lock was held.
    Kept,
    /// Dirty or never written: out of the clock until a checkpoint takes it.
    LeftClock,
    NotResident,
}

/// Cache figures for `info` and the benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct MapCacheStats {
    pub capacity_pages: u64,
    pub resident_pages: u64,
    /// The most pages resident at once since the open (dirty pages cannot be evicted, so
    /// the cache may run over its bound until a checkpoint writes them).
    pub resident_pages_maximum: u64,
    pub loads: u64,
    /// Time spent reading pages in (the loads by a lookup; not those of a read queue).
    pub load_nanoseconds: u64,
    /// Pages never written before, created empty in RAM by a writer.
    pub pages_created: u64,
    /// Of the loads, pages loaded ahead of their lookups, several at once
    /// ([`BlockMap::load_pages_of`]: the cleaner's records).
    pub loaded_ahead: u64,
    pub evictions: u64,
    /// Pages the evictor's clock passed and kept: dirty (waiting for a checkpoint), or
    /// used since its last pass.
    pub evictions_kept_dirty: u64,
    pub evictions_kept_referenced: u64,
}

pub struct BlockMap {
    codec: EntryCodec,
    block_count: u64,
    entries_per_page: u64,
    words_per_page: usize,
    /// One pointer per page; null: not in RAM. A page is freed once evicted and no thread
    /// can still hold it (epoch-based reclamation).
    pages: Box<[AtomicPtr<Page>]>,
    /// Per page: its latest checkpoint copy.
    copies: PointerArray,
    source: Option<Arc<dyn PageSource>>,
    load_locks: Box<[Mutex<()>]>,
    /// Pages the map may hold (clean ones are evicted beyond it); `u64::MAX`: no bound.
    capacity_pages: AtomicU64,
    resident_pages: AtomicU64,
    /// Resident pages in the order the eviction clock visits them.
    clock: Mutex<VecDeque<u64>>,
    resident_pages_maximum: AtomicU64,
    loads: AtomicU64,
    load_nanoseconds: AtomicU64,
    pages_created: AtomicU64,
    loaded_ahead: AtomicU64,
    evictions: AtomicU64,
    evictions_kept_dirty: AtomicU64,
    evictions_kept_referenced: AtomicU64,
    /// Entries that are data, and zero records, kept by `set` (no scan for statistics).
    data_blocks: AtomicU64,
    zero_blocks: AtomicU64,
    /// Entries that are fragments, and the sixteenths of a block they take in all.
    fragment_blocks: AtomicU64,
    fragment_sixteenths: AtomicU64,
    shared_blocks: AtomicU64,
    /// Pages changed since the last checkpoint took them, and their numbers.
    dirty_pages: AtomicU64,
    dirty_list: Mutex<Vec<u64>>,
    /// Pages a checkpoint's snapshot took that a writer changed before the checkpoint
    /// copied them: their entries as of the snapshot, by page.
    snapshot_stash: Mutex<HashMap<u64, Vec<u8>>>,
}

impl BlockMap {
    /// A map with every page in RAM and nowhere else (tests, and a volume mounted by
    /// scanning its log before its first checkpoint).
    pub fn new(block_count: u64, codec: EntryCodec) -> Self {
        BlockMap::paged(block_count, codec, None, u64::MAX)
    }

    /// A map whose pages not in RAM are read from `source`, holding at most about
    /// `capacity_pages` of them (0: none stays once clean — the simulation's setting).
    pub fn paged(
        block_count: u64,
        codec: EntryCodec,
        source: Option<Arc<dyn PageSource>>,
        capacity_pages: u64,
    ) -> Self {
        let entries_per_page = codec.entries_per_page();
        let words_per_page = (entries_per_page * codec.width_bits as u64).div_ceil(64) as usize;
        let page_count = block_count.div_ceil(entries_per_page) as usize;
        BlockMap {
            codec,
            block_count,
            entries_per_page,
            words_per_page,
            // SAFETY: a zeroed `AtomicPtr` is null, a zeroed atomic integer is zero.
            pages: unsafe { zeroed_slice(page_count) },
            copies: PointerArray::new(page_count as u64),
            source,
            load_locks: (0..LOAD_LOCK_COUNT).map(|_| Mutex::new(())).collect(),
            capacity_pages: AtomicU64::new(capacity_pages),
            resident_pages: AtomicU64::new(0),
            clock: Mutex::new(VecDeque::new()),
            resident_pages_maximum: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            load_nanoseconds: AtomicU64::new(0),
            pages_created: AtomicU64::new(0),
            loaded_ahead: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            evictions_kept_dirty: AtomicU64::new(0),
            evictions_kept_referenced: AtomicU64::new(0),
            data_blocks: AtomicU64::new(0),
            zero_blocks: AtomicU64::new(0),
            fragment_blocks: AtomicU64::new(0),
            fragment_sixteenths: AtomicU64::new(0),
            shared_blocks: AtomicU64::new(0),
            dirty_pages: AtomicU64::new(0),
            dirty_list: Mutex::new(Vec::new()),
            snapshot_stash: Mutex::new(HashMap::new()),
        }
    }

    /// The map of a volume with `geometry`, every page in RAM.
    pub fn for_geometry(geometry: &Geometry) -> Self {
        BlockMap::new(geometry.logical_block_count(), EntryCodec::for_geometry(geometry))
    }

    pub fn block_count(&self) -> u64 {
        self.block_count
    }

    pub fn codec(&self) -> EntryCodec {
        self.codec
    }

    /// Page `index` if it is in RAM, valid while `guard` is held.
    fn resident<'g>(&self, index: u64, _guard: &'g epoch::Guard) -> Option<&'g Page> {
        let pointer = self.pages[index as usize].load(Ordering::Acquire);
        // SAFETY: a non-null pointer was made by `Box::into_raw` in `install` and is freed
        // only after it was replaced by null and every guard pinned before then is gone
        // (`evict_page` defers the free through the epoch; `drop` has `&mut self`).
        (!pointer.is_null()).then(|| unsafe { &*pointer })
    }

    /// Put `page` in RAM as page `index`; `false`: another one got there first.
    fn install(&self, index: u64, page: Page) -> bool {
        let fresh = Box::into_raw(Box::new(page));
        match self.pages[index as usize].compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                let resident = self.resident_pages.fetch_add(1, Ordering::Relaxed) + 1;
                self.resident_pages_maximum.fetch_max(resident, Ordering::Relaxed);
                self.clock.lock().push_back(index);
                true
            }
            Err(_) => {
                // SAFETY: `fresh` came from `Box::into_raw` above and was never shared.
                drop(unsafe { Box::from_raw(fresh) });
                false
            }
        }
    }

    /// The pointer to page `index`'s latest checkpoint copy.
    pub fn copy(&self, index: u64) -> Option<PagePointer> {
        self.copies.get(index)
    }

    /// Point page `index` at a new copy (the checkpoint writer, which holds its lock);
    /// returns the pointer it replaces.
    pub fn set_copy(&self, index: u64, pointer: PagePointer) -> Option<PagePointer> {
        self.copies.set(index, pointer)
    }

    /// Every page copy (page number, pointer).
    pub fn copies(&self) -> impl Iterator<Item = (u64, PagePointer)> + '_ {
        self.copies.iter()
    }

    /// Read page `index`'s copy and check its entries: the page (not yet in the map), or
    /// lost metadata.
    fn read_copy(&self, index: u64, pointer: PagePointer) -> Result<Page> {
        let lost =
            || Error::MetadataLost(LostMetadata::CheckpointBlock { what: "index page", position: pointer.position });
        let source = self.source.as_ref().ok_or_else(lost)?;
        self.checked_page(index, &source.read_page(index, pointer)?).ok_or_else(lost)
    }

    /// Page `index` from its packed entries, if every entry is one the volume can hold.
    fn checked_page(&self, index: u64, packed: &[u8]) -> Option<Page> {
        let page = self.page_from(packed);
        self.holds_valid_entries(index, &page).then_some(page)
    }

    fn page_from(&self, packed: &[u8]) -> Page {
        let page = Page::new(self.words_per_page);
        for (word, chunk) in page.words.iter().zip(packed.chunks(8)) {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
        page
    }

    /// Whether every entry of page `index` is one the volume can hold, and those past its
    /// last block are unmapped.
    fn holds_valid_entries(&self, index: u64, page: &Page) -> bool {
        let width = self.codec.width_bits;
        let first = index * self.entries_per_page;
        let end = (first + self.entries_per_page).min(self.block_count);
        (0..end - first).all(|slot| self.codec.is_valid(page.bits(slot * width as u64, width)))
            && (end - first..self.entries_per_page).all(|slot| page.bits(slot * width as u64, width) == 0)
    }

    /// Bring page `index` into RAM from its copy (it has one). `Ok(false)`: nothing to
    /// read (in RAM already, or never written).
    fn load(&self, index: u64) -> Result<bool> {
        let _load = self.load_locks[index as usize % LOAD_LOCK_COUNT].lock();
        if !self.pages[index as usize].load(Ordering::Acquire).is_null() {
            return Ok(false);
        }
        let Some(pointer) = self.copy(index) else {
            return Ok(false);
        };
        let started = std::time::Instant::now();
        let page = self.read_copy(index, pointer)?;
        self.load_nanoseconds.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.install_loaded(index, page);
        Ok(true)
    }

    /// Whether page `index` is only in the log: not in RAM, and written (it has a copy).
    fn only_in_log(&self, index: u64) -> bool {
        self.pages[index as usize].load(Ordering::Acquire).is_null() && self.copy(index).is_some()
    }

    /// Install page `index`, read from its copy by a loader holding its load lock.
    fn install_loaded(&self, index: u64, page: Page) {
        let installed = self.install(index, page);
        assert!(installed, "page {index}: a page is only installed under its load lock or with no copy");
        self.loads.fetch_add(1, Ordering::Relaxed);
    }

    /// The page `logical_block`'s entry is in, and the copy to read it from, when that
    /// page is only in the log (`None`: in RAM, or never written).
    pub(crate) fn page_to_load(&self, logical_block: u64) -> Option<(u64, PagePointer)> {
        let (index, _) = self.place(logical_block);
        if !self.pages[index as usize].load(Ordering::Acquire).is_null() {
            return None;
        }
        Some((index, self.copy(index)?))
    }

    /// Install page `index` from `block`, its copy at `pointer` read by someone else (a
    /// read queue's ring). `Refused`, leaving the map as it was, when the block is not
    /// that copy (a failed or rotten read: the single-read path's `load` rebuilds it from
    /// its row) or `pointer` is no longer the page's copy (a checkpoint wrote the page
    /// again since); `AlreadyInRam` when another loader got there first (the page may
    /// hold changes no copy has yet: it is left as it is).
    pub(crate) fn install_read_copy(&self, index: u64, pointer: PagePointer, block: &[u8]) -> ReadCopy {
        let _load = self.load_locks[index as usize % LOAD_LOCK_COUNT].lock();
        if !self.pages[index as usize].load(Ordering::Acquire).is_null() {
            return ReadCopy::AlreadyInRam;
        }
        if self.copy(index) != Some(pointer) {
            return ReadCopy::Refused;
        }
        let packed = self.source.as_ref().and_then(|source| source.decode_page(index, pointer, block));
        let Some(page) = packed.and_then(|packed| self.checked_page(index, &packed)) else {
            return ReadCopy::Refused;
        };
        self.install_loaded(index, page);
        ReadCopy::Installed
    }

    fn place(&self, logical_block: u64) -> (u64, u64) {
        assert!(logical_block < self.block_count, "logical block {logical_block} beyond the map");
        (logical_block / self.entries_per_page, (logical_block % self.entries_per_page) * self.codec.width_bits as u64)
    }

    /// The mapping of `logical_block`, loading its page when it is only in the log.
    pub fn get(&self, logical_block: u64) -> Result<Mapping> {
        let (index, bit) = self.place(logical_block);
        loop {
            {
                let guard = epoch::pin();
                if let Some(page) = self.resident(index, &guard) {
                    return Ok(self.codec.decode(page.read(bit, self.codec.width_bits)));
                }
            }
            if self.copy(index).is_none() {
                return Ok(Mapping::Unmapped);
            }
            self.load(index)?;
        }
    }

    /// The mapping of `logical_block` when its page is in RAM or was never written;
    /// `None`: it would have to be read.
    pub fn get_if_resident(&self, logical_block: u64) -> Option<Mapping> {
        let (index, bit) = self.place(logical_block);
        let guard = epoch::pin();
        match self.resident(index, &guard) {
            Some(page) => Some(self.codec.decode(page.read(bit, self.codec.width_bits))),
            None => self.copy(index).is_none().then_some(Mapping::Unmapped),
        }
    }

    /// Replace a mapping and return the old one. Callers hold the state lock.
    pub fn set(&self, logical_block: u64, mapping: Mapping) -> Result<Mapping> {
        let (index, bit) = self.place(logical_block);
        let value = self.codec.encode(mapping);
        let (old, became_dirty) = loop {
            {
                let guard = epoch::pin();
                if let Some(page) = self.resident(index, &guard) {
                    let stash = |entries| drop(self.snapshot_stash.lock().insert(index, entries));
                    match page.write(bit, self.codec.width_bits, value, stash) {
                        Some(done) => break done,
                        None => continue, // evicted meanwhile
                    }
                }
            }
            if self.copy(index).is_some() {
                self.load(index)?;
            } else if value == 0 {
                return Ok(Mapping::Unmapped);
            } else {
                // Never written: a page of unmapped entries.
                if self.install(index, Page::new(self.words_per_page)) {
                    self.pages_created.fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        if became_dirty {
            self.dirty_pages.fetch_add(1, Ordering::Relaxed);
            self.dirty_list.lock().push(index);
        }
        let old = self.codec.decode(old);
        // (Callers hold the state lock: the counts change one writer at a time.)
        let take = |counter: &AtomicU64, amount: u64| {
            let before = counter.fetch_sub(amount, Ordering::Relaxed);
            assert!(before >= amount, "block {logical_block}: the map's counts never wrap ({old:?} → {mapping:?})");
        };
        let counter = |mapping: Mapping| match mapping {
            Mapping::Data { .. } => Some(&self.data_blocks),
            Mapping::Zero { .. } => Some(&self.zero_blocks),
            Mapping::Shared { .. } => Some(&self.shared_blocks),
            _ => None,
        };
        if std::mem::discriminant(&old) != std::mem::discriminant(&mapping) {
            if let Some(counter) = counter(old) {
                take(counter, 1);
            }
            if let Some(counter) = counter(mapping) {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Mapping::Fragment { sixteenths, .. } = old {
            take(&self.fragment_blocks, 1);
            take(&self.fragment_sixteenths, sixteenths as u64);
        }
        if let Mapping::Fragment { sixteenths, .. } = mapping {
            self.fragment_blocks.fetch_add(1, Ordering::Relaxed);
            self.fragment_sixteenths.fetch_add(sixteenths as u64, Ordering::Relaxed);
        }
        Ok(old)
    }

    /// Pages in the map (in RAM or not).
    pub fn page_count(&self) -> u64 {
        self.pages.len() as u64
    }

    pub fn entries_per_page(&self) -> u64 {
        self.entries_per_page
    }

    /// Pages changed since a checkpoint last took them.
    pub fn dirty_page_count(&self) -> u64 {
        self.dirty_pages.load(Ordering::Relaxed)
    }

    /// The pages changed since a checkpoint last took them (the list empties; a page
    /// taken by [`BlockMap::take_page`] is clean again, one that is not stays dirty and
    /// listed by [`BlockMap::mark_dirty`] if needed).
    pub fn take_dirty_list(&self) -> Vec<u64> {
        let mut list = std::mem::take(&mut *self.dirty_list.lock());
        list.sort_unstable();
        list.dedup();
        list
    }

    /// Make sure page `index` is in RAM (the checkpoint writer, before its snapshot, for
    /// pages it rewrites to empty a metadata segment).
    pub fn ensure_resident(&self, index: u64) -> Result<()> {
        self.load(index).map(drop)
    }

    /// Make sure the page of `logical_block` is in RAM if it has a copy (writers, before
    /// they take the write lock, under which they only check it is still there): one
    /// atomic load when it is there.
    pub fn ensure_resident_for(&self, logical_block: u64) -> Result<()> {
        let (index, _) = self.place(logical_block);
        if self.only_in_log(index) {
            self.load(index)?;
        }
        Ok(())
    }

    /// Load the pages of `blocks` that are only in the log, `PAGE_LOADS_IN_FLIGHT` at a
    /// time on threads of their own when `parallel` (threaded volumes; the simulation's
    /// inline volumes keep one order of reads). At most `pages_maximum` pages are loaded
    /// (a cache much smaller than the pages asked for would evict them before they are
    /// used). The first load that fails is returned.
    pub fn load_pages_of(
        &self,
        blocks: impl IntoIterator<Item = u64>,
        parallel: bool,
        pages_maximum: usize,
    ) -> Result<()> {
        let mut pages: Vec<u64> = blocks
            .into_iter()
            .filter(|&block| block < self.block_count)
            .map(|block| self.place(block).0)
            .filter(|&index| self.only_in_log(index))
            .collect();
        pages.sort_unstable();
        pages.dedup();
        pages.truncate(pages_maximum);
        // (A page another loader read meanwhile is not counted.)
        let load_ahead = |index: u64| -> Result<()> {
            if self.load(index)? {
                self.loaded_ahead.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        };
        if !parallel || pages.len() < 2 {
            return pages.into_iter().try_for_each(load_ahead);
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let load_in_turn = || -> Result<()> {
            loop {
                let taken = next.fetch_add(1, Ordering::Relaxed);
                let Some(&index) = pages.get(taken) else {
                    return Ok(());
                };
                load_ahead(index)?;
            }
        };
        std::thread::scope(|scope| {
            let loaders: Vec<_> =
                (0..PAGE_LOADS_IN_FLIGHT.min(pages.len())).map(|_| scope.spawn(load_in_turn)).collect();
            loaders
                .into_iter()
                .try_for_each(|loader| loader.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
        })
    }

    /// Whether the index pages of `count` blocks from `first_logical_block` are all in RAM
    /// or were never written (no page load is needed to write them now).
    pub fn resident_for(&self, first_logical_block: u64, count: u64) -> bool {
        if count == 0 {
            return true;
        }
        let (first, _) = self.place(first_logical_block);
        let (last, _) = self.place(first_logical_block + count - 1);
        (first..=last).all(|index| !self.only_in_log(index))
    }

    /// The packed entries of resident page `index` now (tests).
    #[cfg(test)]
    fn resident_page_packed(&self, index: u64) -> Vec<u8> {
        let guard = epoch::pin();
        self.resident(index, &guard).expect("resident").packed()
    }

    /// A checkpoint's snapshot begins: pre-images a failed checkpoint left are dropped.
    /// Callers hold the state lock and the checkpoint lock.
    pub fn begin_snapshot(&self) {
        self.snapshot_stash.lock().clear();
    }

    /// Take page `index` into a checkpoint's snapshot, marking it clean: its entries as
    /// they are now are what [`BlockMap::copy_snapshot_pages`] gives, even when writers
    /// change it first. `false`: not in RAM. Callers hold the state lock (no writer
    /// changes the page meanwhile) and the checkpoint lock (no eviction until the commit).
    pub fn take_page(&self, index: u64) -> bool {
        let guard = epoch::pin();
        let Some(page) = self.resident(index, &guard) else { return false };
        if page.dirty.swap(false, Ordering::Relaxed) {
            let before = self.dirty_pages.fetch_sub(1, Ordering::Relaxed);
            assert!(before > 0, "page {index}: a dirty page is counted dirty");
        }
        // Clean once this checkpoint commits: back in the clock (no evictor runs before).
        if !page.in_clock.swap(true, Ordering::Relaxed) {
            self.clock.lock().push_back(index);
        }
        page.snapshot_pending.store(true, Ordering::Relaxed);
        true
    }

    /// The packed entries (`PAGE_ENTRY_BYTES`, little-endian, as stored on media) of the
    /// pages a snapshot took, as they were when it took them: copied from the page, or
    /// from the stash where a writer that changed it since left them. Outside the write
    /// lock, holding the checkpoint lock (the pages stay in RAM).
    pub fn copy_snapshot_pages(&self, pages: &[u64]) -> Vec<(u64, Vec<u8>)> {
        pages
            .iter()
            .map(|&index| {
                let guard = epoch::pin();
                let page = self.resident(index, &guard).expect("a page a snapshot took stays in RAM until the commit");
                let locked_at = page.lock();
                let entries = if page.snapshot_pending.swap(false, Ordering::Relaxed) {
                    page.packed()
                } else {
                    self.snapshot_stash.lock().remove(&index).expect("a writer that changed a taken page stashed it")
                };
                page.unlock(locked_at);
                (index, entries)
            })
            .collect()
    }

    /// Mark page `index` changed again (a checkpoint that took it failed before it
    /// committed).
    pub fn mark_dirty(&self, index: u64) {
        let guard = epoch::pin();
        if let Some(page) = self.resident(index, &guard) {
            if !page.dirty.swap(true, Ordering::Relaxed) {
                self.dirty_pages.fetch_add(1, Ordering::Relaxed);
                self.dirty_list.lock().push(index);
            }
        }
    }

    /// Start from a checkpoint's counts (mount, before the map is shared; the directory
    /// gave each page's copy through [`BlockMap::set_copy`]).
    pub fn start_counts(&self, counts: MapCounts) {
        self.data_blocks.store(counts.data_blocks, Ordering::Relaxed);
        self.zero_blocks.store(counts.zero_blocks, Ordering::Relaxed);
        self.fragment_blocks.store(counts.fragment_blocks, Ordering::Relaxed);
        self.fragment_sixteenths.store(counts.fragment_sixteenths, Ordering::Relaxed);
        self.shared_blocks.store(counts.shared_blocks, Ordering::Relaxed);
    }

    /// Logical blocks mapped to whole data blocks, to zero records, and to fragments.
    pub fn counts(&self) -> MapCounts {
        MapCounts {
            data_blocks: self.data_blocks.load(Ordering::Relaxed),
            zero_blocks: self.zero_blocks.load(Ordering::Relaxed),
            fragment_blocks: self.fragment_blocks.load(Ordering::Relaxed),
            fragment_sixteenths: self.fragment_sixteenths.load(Ordering::Relaxed),
            shared_blocks: self.shared_blocks.load(Ordering::Relaxed),
        }
    }

    /// Whether more pages are in RAM than the cache allows.
    pub fn over_capacity(&self) -> bool {
        self.resident_pages.load(Ordering::Relaxed) > self.capacity_pages.load(Ordering::Relaxed)
    }

    /// The dirty pages at which a checkpoint is due: half the cache (they cannot be
    /// evicted until one writes them).
    pub fn dirty_pages_due(&self) -> u64 {
        (self.capacity_pages.load(Ordering::Relaxed) / 2).max(1)
    }

    /// Evict clean pages not used since the clock last passed them, down to 15/16 of the
    /// cache. Callers hold the checkpoint lock (no checkpoint between its snapshot and
    /// its commit). Returns the pages evicted.
    pub fn evict(&self) -> u64 {
        self.evict_at_most(u64::MAX)
    }

    /// [`BlockMap::evict`], evicting at most `limit` pages (and passing at most twice as
    /// many), so that a caller holding the write lock holds it for a bounded time.
    pub fn evict_at_most(&self, limit: u64) -> u64 {
        let capacity = self.capacity_pages.load(Ordering::Relaxed);
        let target = capacity - capacity / 16;
        let mut evicted = 0;
        // Each resident page is visited at most twice (once to clear its bit).
        let mut visits = (2 * self.resident_pages.load(Ordering::Relaxed)).min(limit.saturating_mul(2));
        while self.resident_pages.load(Ordering::Relaxed) > target && visits > 0 && evicted < limit {
            visits -= 1;
            let Some(index) = self.clock.lock().pop_front() else { break };
            match self.try_evict(index) {
                Visit::Evicted => evicted += 1,
                Visit::Kept => self.clock.lock().push_back(index),
                // Dirty: out of the clock until a checkpoint takes it; not resident: its
                // entry goes.
                Visit::LeftClock | Visit::NotResident => {}
            }
        }
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
        evicted
    }

    /// Evict page `index` if it may go.
    fn try_evict(&self, index: u64) -> Visit {
        let Some(_load) = self.load_locks[index as usize % LOAD_LOCK_COUNT].try_lock() else {
            return Visit::Kept;
        };
        let guard = epoch::pin();
        let pointer = self.pages[index as usize].load(Ordering::Acquire);
        let Some(page) = self.resident(index, &guard) else {
            return Visit::NotResident;
        };
        // (The evictor holds the checkpoint lock: no checkpoint takes a page meanwhile.)
        if self.copy(index).is_none() || page.dirty.load(Ordering::Relaxed) {
            self.evictions_kept_dirty.fetch_add(1, Ordering::Relaxed);
            page.in_clock.store(false, Ordering::Relaxed);
            return Visit::LeftClock;
        }
        if page.referenced.swap(false, Ordering::Relaxed) {
            self.evictions_kept_referenced.fetch_add(1, Ordering::Relaxed);
            return Visit::Kept;
        }
        if !page.evict() {
            self.evictions_kept_dirty.fetch_add(1, Ordering::Relaxed);
            page.in_clock.store(false, Ordering::Relaxed);
            return Visit::LeftClock;
        }
        self.pages[index as usize].store(std::ptr::null_mut(), Ordering::Release);
        let before = self.resident_pages.fetch_sub(1, Ordering::Relaxed);
        assert!(before > 0, "page {index}: an evicted page was counted resident");
        // SAFETY: `pointer` came from `Box::into_raw` in `install`; it is no longer in
        // the map, and the epoch frees it once every guard that could have loaded it is
        // gone. Evicting needs the load lock, so nothing installs it again.
        unsafe { guard.defer_unchecked(move || drop(Box::from_raw(pointer))) };
        Visit::Evicted
    }

    /// Visit every entry in logical order without filling the cache: pages not in RAM
    /// are read from their copies and dropped (scans: check, scrub, counts).
    pub fn for_each(&self, mut visit: impl FnMut(u64, Mapping)) -> Result<()> {
        let width = self.codec.width_bits;
        for index in 0..self.page_count() {
            let first = index * self.entries_per_page;
            let end = (first + self.entries_per_page).min(self.block_count);
            let guard = epoch::pin();
            let loaded;
            let page = match self.resident(index, &guard) {
                Some(page) => Some(page),
                None => match self.copy(index) {
                    None => None,
                    Some(pointer) => {
                        loaded = self.read_copy(index, pointer)?;
                        Some(&loaded)
                    }
                },
            };
            for logical_block in first..end {
                let mapping = match page {
                    None => Mapping::Unmapped,
                    Some(page) => self.codec.decode(page.read((logical_block - first) * width as u64, width)),
                };
                visit(logical_block, mapping);
            }
        }
        Ok(())
    }

    /// [`BlockMap::for_each`] without reading the members: `false` (after visiting what is
    /// in RAM) when a page is only in the log.
    pub fn for_each_resident(&self, mut visit: impl FnMut(u64, Mapping)) -> bool {
        let width = self.codec.width_bits;
        let mut complete = true;
        for index in 0..self.page_count() {
            let first = index * self.entries_per_page;
            let end = (first + self.entries_per_page).min(self.block_count);
            let guard = epoch::pin();
            match self.resident(index, &guard) {
                Some(page) => {
                    for logical_block in first..end {
                        visit(
                            logical_block,
                            self.codec.decode(page.read((logical_block - first) * width as u64, width)),
                        );
                    }
                }
                None if self.copy(index).is_some() => complete = false,
                None => (first..end).for_each(|logical_block| visit(logical_block, Mapping::Unmapped)),
            }
        }
        complete
    }

    /// Every mapping in logical order (a map with every page in RAM: tests).
    pub fn iter(&self) -> impl Iterator<Item = Mapping> + '_ {
        let mut all = Vec::with_capacity(self.block_count as usize);
        self.for_each(|_, mapping| all.push(mapping)).expect("a map in RAM reads no page");
        all.into_iter()
    }

    pub fn cache_stats(&self) -> MapCacheStats {
        MapCacheStats {
            capacity_pages: self.capacity_pages.load(Ordering::Relaxed),
            resident_pages: self.resident_pages.load(Ordering::Relaxed),
            resident_pages_maximum: self.resident_pages_maximum.load(Ordering::Relaxed),
            loads: self.loads.load(Ordering::Relaxed),
            load_nanoseconds: self.load_nanoseconds.load(Ordering::Relaxed),
            pages_created: self.pages_created.load(Ordering::Relaxed),
            loaded_ahead: self.loaded_ahead.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            evictions_kept_dirty: self.evictions_kept_dirty.load(Ordering::Relaxed),
            evictions_kept_referenced: self.evictions_kept_referenced.load(Ordering::Relaxed),
        }
    }

    /// RAM one page in the cache takes.
    pub fn page_size_bytes(&self) -> u64 {
        (self.words_per_page * 8 + std::mem::size_of::<Page>()) as u64
    }

    /// RAM the map holds: the per-page slots and the pages in RAM.
    pub fn size_bytes(&self) -> u64 {
        self.pages.len() as u64 * SLOT_BYTES + self.resident_pages.load(Ordering::Relaxed) * self.page_size_bytes()
    }

    /// RAM the map would hold with every page in RAM.
    pub fn resident_size_bytes(&self) -> u64 {
        BlockMap::resident_size_for(self.block_count, self.codec)
    }

    /// RAM a map of `block_count` entries would hold with every page in RAM, computed
    /// without making one.
    pub fn resident_size_for(block_count: u64, codec: EntryCodec) -> u64 {
        let (pages, page_bytes) = BlockMap::pages_for(block_count, codec);
        pages * (SLOT_BYTES + page_bytes)
    }

    /// Pages of a map of `block_count` entries, and the RAM each takes in the cache.
    pub fn pages_for(block_count: u64, codec: EntryCodec) -> (u64, u64) {
        let entries_per_page = codec.entries_per_page();
        let words_per_page = (entries_per_page * codec.width_bits as u64).div_ceil(64);
        (block_count.div_ceil(entries_per_page), words_per_page * 8 + std::mem::size_of::<Page>() as u64)
    }

    /// The pages a cache of `cache_bytes` holds, for a map of `block_count` entries.
    pub fn cache_pages(block_count: u64, codec: EntryCodec, cache_bytes: u64) -> u64 {
        let (_, page_bytes) = BlockMap::pages_for(block_count, codec);
        cache_bytes / page_bytes.max(1)
    }

    /// RAM a map of `block_count` entries holds with a cache of `cache_bytes`.
    pub fn size_with_cache(block_count: u64, codec: EntryCodec, cache_bytes: u64) -> u64 {
        let (pages, page_bytes) = BlockMap::pages_for(block_count, codec);
        pages * SLOT_BYTES + pages.min(BlockMap::cache_pages(block_count, codec, cache_bytes)) * page_bytes
    }
}

/// Per page whether in RAM or not: its slot (8 bytes) and its copy's pointer (12).
const SLOT_BYTES: u64 = 20;

impl Drop for BlockMap {
    fn drop(&mut self) {
        let (mut resident, mut in_clock) = (0, 0);
        for (index, pointer) in self.pages.iter().enumerate() {
            let pointer = pointer.load(Ordering::Acquire);
            if !pointer.is_null() {
                resident += 1;
                // SAFETY: made by `Box::into_raw` in `install`, still in the map (evicted
                // pages were replaced by null), freed once, here.
                let page = unsafe { Box::from_raw(pointer) };
                let listed = page.in_clock.load(Ordering::Relaxed);
                in_clock += listed as u64;
                // (A page leaves the clock only dirty or without a copy, and comes back
                // when a checkpoint takes it: one that may be evicted is always in it.)
                let evictable = !page.dirty.load(Ordering::Relaxed) && self.copies.get(index as u64).is_some();
                if !std::thread::panicking() {
                    assert!(listed || !evictable, "page {index}: a clean page with a copy is in the eviction clock");
                }
            }
        }
        if !std::thread::panicking() {
            assert_eq!(resident, *self.resident_pages.get_mut(), "the map counts every page in RAM");
            assert!(
                self.clock.get_mut().len() as u64 >= in_clock,
                "the eviction clock lists every page in RAM marked as in it"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_mapping(codec: EntryCodec) -> impl Strategy<Value = Mapping> {
        (0u8..5, 0u64..u64::MAX).prop_map(move |(kind, value)| mapping_of(codec, kind, value))
    }

    /// A mapping of kind `kind` (0–4; a fragment only where the codec has them) from `value`.
    fn mapping_of(codec: EntryCodec, kind: u8, value: u64) -> Mapping {
        match kind {
            0 => Mapping::Unmapped,
            1 => Mapping::Data { position: value % codec.positions },
            2 => Mapping::Zero { segment: value % codec.segments },
            4 if codec.fragments => {
                Mapping::Fragment { position: value % codec.positions, sixteenths: (value >> 59) as u8 % 16 + 1 }
            }
            3 if codec.shared => Mapping::Shared { record: value % codec.positions },
            _ => Mapping::Trimmed { segment: value % codec.segments },
        }
    }

    /// Fragments take 4 more bits on the same volume, and their entries stay apart from
    /// every other kind (the last trim record and the first fragment are neighbours).
    #[test]
    fn fragments_widen_the_entry_and_decode_apart() {
        let plain = EntryCodec::new(350_000_000, 85_000);
        let packed = EntryCodec::with_fragments(350_000_000, 85_000, true);
        assert_eq!((plain.width_bits, packed.width_bits), (29, 33));
        let first = Mapping::Fragment { position: 0, sixteenths: 1 };
        let last = Mapping::Fragment { position: 349_999_999, sixteenths: 16 };
        let last_trim = Mapping::Trimmed { segment: 84_999 };
        assert_eq!(packed.encode(first), packed.encode(last_trim) + 1);
        for mapping in [first, last, last_trim, Mapping::Data { position: 349_999_999 }] {
            assert_eq!(packed.decode(packed.encode(mapping)), mapping);
        }
        assert!(packed.is_valid(packed.encode(last)) && !packed.is_valid(packed.encode(last) + 1));
        assert!(!plain.is_valid(packed.encode(first)));
    }

    /// Shared-block records take one more range after the fragments (at most one more
    /// bit), and decode apart from the last fragment and the last trim record.
    #[test]
    fn shared_records_follow_the_fragments_and_decode_apart() {
        let packed = EntryCodec::with_fragments(350_000_000, 85_000, true);
        let both = EntryCodec::with_ranges(350_000_000, 85_000, true, true);
        let shared = EntryCodec::with_ranges(350_000_000, 85_000, false, true);
        assert_eq!((packed.width_bits, both.width_bits, shared.width_bits), (33, 33, 30));
        let last_fragment = Mapping::Fragment { position: 349_999_999, sixteenths: 16 };
        let first = Mapping::Shared { record: 0 };
        let last = Mapping::Shared { record: 349_999_999 };
        assert_eq!(both.encode(first), both.encode(last_fragment) + 1);
        assert_eq!(shared.encode(first), shared.encode(Mapping::Trimmed { segment: 84_999 }) + 1);
        for codec in [both, shared] {
            for mapping in [first, last, Mapping::Trimmed { segment: 84_999 }, Mapping::Data { position: 7 }] {
                assert_eq!(codec.decode(codec.encode(mapping)), mapping);
            }
            assert!(codec.is_valid(codec.encode(last)) && !codec.is_valid(codec.encode(last) + 1));
        }
        assert!(!packed.is_valid(both.encode(first)));
    }

    #[test]
    fn the_width_is_what_the_largest_entry_needs() {
        // 1 TiB of logical space at 20 % spare: about 2^28.4 positions.
        let codec = EntryCodec::new(350_000_000, 85_000);
        assert_eq!(codec.width_bits, 29);
        assert_eq!(codec.entries_per_page(), 1111);
        assert_eq!(EntryCodec::new(1 << 34, 1 << 22).width_bits, 35);
        let last = Mapping::Trimmed { segment: 84_999 };
        assert_eq!(codec.decode(codec.encode(last)), last);
    }

    proptest! {
        #[test]
        fn entries_round_trip(positions in 1u64..(1 << 40), segments in 1u64..(1 << 24), kind in 0u8..5, value: u64,
                              fragments: bool, shared: bool) {
            let codec = EntryCodec::with_ranges(positions, segments, fragments, shared);
            let mapping = mapping_of(codec, kind, value);
            prop_assert_eq!(codec.decode(codec.encode(mapping)), mapping);
        }

        /// The map behaves like a plain array of mappings under any sequence of sets,
        /// whatever the entry width (entries straddle words at most widths).
        #[test]
        fn map_matches_a_reference(
            (positions, segments) in (1u64..(1 << 45), 1u64..(1 << 20)),
            operations in proptest::collection::vec((0u64..3000, any::<u64>(), 0u8..5), 0..300),
            fragments: bool,
            shared: bool,
        ) {
            let codec = EntryCodec::with_ranges(positions, segments, fragments, shared);
            let map = BlockMap::new(3000, codec);
            let mut reference = vec![Mapping::Unmapped; 3000];
            for (block, value, kind) in operations {
                let mapping = mapping_of(codec, kind, value);
                let old = map.set(block, mapping).expect("in RAM");
                prop_assert_eq!(old, reference[block as usize]);
                reference[block as usize] = mapping;
            }
            for (block, expected) in reference.iter().enumerate() {
                prop_assert_eq!(map.get(block as u64).expect("in RAM"), *expected);
            }
            let data = reference.iter().filter(|mapping| matches!(mapping, Mapping::Data { .. })).count() as u64;
            let zero = reference.iter().filter(|mapping| matches!(mapping, Mapping::Zero { .. })).count() as u64;
            let fragments: Vec<u64> = reference.iter().filter_map(|mapping| match mapping {
                Mapping::Fragment { sixteenths, .. } => Some(*sixteenths as u64),
                _ => None,
            }).collect();
            let counts = MapCounts {
                data_blocks: data,
                zero_blocks: zero,
                fragment_blocks: fragments.len() as u64,
                fragment_sixteenths: fragments.iter().sum(),
                shared_blocks: reference.iter().filter(|mapping| matches!(mapping, Mapping::Shared { .. })).count() as u64,
            };
            prop_assert_eq!(map.counts(), counts);
            prop_assert_eq!(map.iter().collect::<Vec<_>>(), reference);
        }

        #[test]
        fn any_mapping_of_a_volume_fits(mapping in any_mapping(EntryCodec::new(1000, 10))) {
            let codec = EntryCodec::new(1000, 10);
            prop_assert_eq!(codec.decode(codec.encode(mapping)), mapping);
        }
    }

    /// Page copies kept in memory, by position; a block is its packed entries, and it is
    /// the copy a pointer names when its CRC32C is the pointer's.
    struct CopiesInMemory(Mutex<std::collections::HashMap<u64, Vec<u8>>>);

    impl PageSource for CopiesInMemory {
        fn read_page(&self, page: u64, pointer: PagePointer) -> Result<Vec<u8>> {
            let block = self.0.lock().get(&pointer.position).cloned().unwrap_or_default();
            self.decode_page(page, pointer, &block)
                .ok_or(Error::MetadataLost(LostMetadata::CheckpointBlock { what: "index page", position: 0 }))
        }

        fn decode_page(&self, _page: u64, pointer: PagePointer, block: &[u8]) -> Option<Vec<u8>> {
            (!block.is_empty() && crc32c::crc32c(block) == pointer.checksum).then(|| block.to_vec())
        }
    }

    /// A snapshot's pages are copied after the write lock is released: a page a writer
    /// changed in between gives the entries it had when the snapshot took it, a page no
    /// one changed its own; the change itself stays in the page, dirty for the next one.
    #[test]
    fn a_snapshot_copies_its_pages_as_they_were_when_it_took_them() {
        let codec = EntryCodec::new(1000, 10);
        let map = BlockMap::new(codec.entries_per_page() * 2, codec);
        let first = codec.entries_per_page();
        map.set(3, Mapping::Data { position: 7 }).unwrap();
        map.set(first + 3, Mapping::Data { position: 9 }).unwrap();
        let before: Vec<Vec<u8>> = [0, 1].iter().map(|&page| map.resident_page_packed(page)).collect();
        map.begin_snapshot();
        assert!(map.take_page(0) && map.take_page(1));
        assert_eq!(map.dirty_page_count(), 0);
        // A writer changes page 0 before the checkpoint copies it.
        map.set(4, Mapping::Data { position: 8 }).unwrap();
        let copied = map.copy_snapshot_pages(&[0, 1]);
        assert!(
            copied == vec![(0, before[0].clone()), (1, before[1].clone())],
            "the copies are the pages as the snapshot took them"
        );
        assert_eq!(map.get(4).unwrap(), Mapping::Data { position: 8 });
        assert_eq!(map.dirty_page_count(), 1, "the change goes to the next checkpoint");
        // Taken again, nothing stashed: the page's own entries, with the change.
        map.begin_snapshot();
        assert!(map.take_page(0));
        let again = map.copy_snapshot_pages(&[0]);
        assert!(again[0].1 != before[0] && again[0].1 == map.resident_page_packed(0), "the page's own entries");
    }

    /// A page read elsewhere (a read queue's ring) is taken only while the pointer it was
    /// read from is still the page's copy and the page is not in RAM, and only when the
    /// block is that copy: a read that raced a load, a change, a checkpoint and an
    /// eviction must not bring back the older entries.
    #[test]
    fn a_page_read_elsewhere_is_taken_only_while_its_copy_is_current() {
        let codec = EntryCodec::new(1000, 10);
        let source = Arc::new(CopiesInMemory(Mutex::new(std::collections::HashMap::new())));
        let map = BlockMap::paged(codec.entries_per_page(), codec, Some(source.clone()), 0);
        let old = Mapping::Data { position: 7 };
        let new = Mapping::Data { position: 8 };
        // A checkpoint writes the page with `old` at position 100, and the page is evicted.
        map.set(3, old).unwrap();
        assert!(map.take_page(0));
        let packed_old = map.copy_snapshot_pages(&[0]).remove(0).1;
        let pointer_old = PagePointer { position: 100, checksum: crc32c::crc32c(&packed_old) };
        source.0.lock().insert(100, packed_old.clone());
        map.set_copy(0, pointer_old);
        assert_eq!(map.evict(), 1);
        assert_eq!(map.page_to_load(3), Some((0, pointer_old)));
        // A queue starts reading the copy at 100. Meanwhile a writer loads the page,
        // changes the entry, a checkpoint writes it at 200 and it is evicted again.
        map.set(3, new).unwrap();
        assert!(map.take_page(0));
        let packed_new = map.copy_snapshot_pages(&[0]).remove(0).1;
        let pointer_new = PagePointer { position: 200, checksum: crc32c::crc32c(&packed_new) };
        source.0.lock().insert(200, packed_new.clone());
        map.set_copy(0, pointer_new);
        assert_eq!(map.evict(), 1);
        // The queue's read of the old copy comes back: refused, and the map still says `new`.
        assert_eq!(map.install_read_copy(0, pointer_old, &packed_old), ReadCopy::Refused);
        assert_eq!(map.get_if_resident(3), None);
        assert_eq!(map.get(3).unwrap(), new);
        assert_eq!(map.evict(), 1);
        // A block that is not the copy the pointer names (rotten, or another block read
        // from a reused place) is refused too; the copy itself is taken.
        let mut rotten = packed_new.clone();
        rotten[0] ^= 1;
        assert_eq!(map.install_read_copy(0, pointer_new, &rotten), ReadCopy::Refused);
        assert_eq!(map.get_if_resident(3), None);
        assert_eq!(map.install_read_copy(0, pointer_new, &packed_new), ReadCopy::Installed);
        assert_eq!(map.get_if_resident(3), Some(new));
        assert_eq!(map.page_to_load(3), None);
        // A page already in RAM is left as it is (it may hold changes no copy has yet).
        map.set(3, old).unwrap();
        assert_eq!(map.install_read_copy(0, pointer_new, &packed_new), ReadCopy::AlreadyInRam);
        assert_eq!(map.get(3).unwrap(), old);
    }

    /// Readers on other threads never see a torn entry while a writer changes the page.
    #[test]
    fn readers_see_whole_entries_while_a_writer_changes_them() {
        let codec = EntryCodec::new((1 << 35) - 1, 1);
        assert!(codec.width_bits >= 35);
        let map = std::sync::Arc::new(BlockMap::new(4000, codec));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (map, stop) = (map.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for block in 0..4000 {
                            match map.get(block).expect("in RAM") {
                                Mapping::Unmapped => {}
                                // Every value written is all ones or all zeros below bit 34.
                                Mapping::Data { position } => {
                                    assert!(position == (1 << 34) - 1 || position == 0, "torn: {position:#x}")
                                }
                                other => panic!("never written: {other:?}"),
                            }
                            reads += 1;
                        }
                    }
                    reads
                })
            })
            .collect();
        for round in 0..200u64 {
            for block in 0..4000 {
                let position = if (block + round) % 2 == 0 { (1 << 34) - 1 } else { 0 };
                map.set(block, Mapping::Data { position }).expect("in RAM");
            }
        }
        stop.store(true, Ordering::Relaxed);
        for reader in readers {
            assert!(reader.join().expect("reader") > 0);
        }
    }
}
