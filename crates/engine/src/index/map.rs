//! The logical-to-physical map: one entry per logical 4 KiB block, bit-packed as narrow
//! as the volume allows, in pages allocated on first write (docs/index-and-checkpoints.md,
//! "Decisions" 1). Readers take no lock: each page has a sequence counter (a seqlock) that
//! its writer makes odd while it changes the page; a reader that saw it change reads
//! again. Writers are the engine's state-lock holders, one at a time per page.

use crate::layout::geometry::Geometry;
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Bytes of entries in an index page (a 4 KiB block less its 64-byte header and CRC).
pub const PAGE_ENTRY_BYTES: usize = 4028;

/// What a logical block currently is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// Never written (or trimmed with no older record anywhere): reads zeros, a hole.
    Unmapped,
    /// Stored at data-space position `position`.
    Data { position: u64 },
    /// Written with zeros; the record is in `segment`.
    Zero { segment: u64 },
    /// Trimmed; the record is in `segment`.
    Trimmed { segment: u64 },
}

impl Mapping {
    /// The segment whose record this mapping depends on (kept live while it does).
    pub fn segment(self, blocks_per_segment: u64) -> Option<u64> {
        match self {
            Mapping::Unmapped => None,
            Mapping::Data { position } => Some(position / blocks_per_segment),
            Mapping::Zero { segment } | Mapping::Trimmed { segment } => Some(segment),
        }
    }
}

/// How mappings become entries for one volume: `0` unmapped, `1 + p` data at position
/// `p`, `1 + P + s` zeros recorded in segment `s`, `1 + P + S + s` trimmed there, for `P`
/// positions and `S` segments; `width_bits` is what the largest value needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryCodec {
    positions: u64,
    segments: u64,
    pub width_bits: u32,
}

impl EntryCodec {
    pub fn new(positions: u64, segments: u64) -> EntryCodec {
        EntryCodec {
            positions,
            segments,
            width_bits: crate::layout::geometry::index_entry_width_bits(positions, segments),
        }
    }

    pub fn for_geometry(geometry: &Geometry) -> EntryCodec {
        EntryCodec::new(geometry.physical_data_blocks(), geometry.segment_count())
    }

    /// The entry of `mapping`; positions and segments beyond the volume are a caller's bug.
    pub fn encode(&self, mapping: Mapping) -> u64 {
        let value = match mapping {
            Mapping::Unmapped => 0,
            Mapping::Data { position } => 1 + position,
            Mapping::Zero { segment } => 1 + self.positions + segment,
            Mapping::Trimmed { segment } => 1 + self.positions + self.segments + segment,
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
            value => Mapping::Trimmed { segment: value - 1 - positions - segments },
        }
    }

    /// Whether `value` is an entry of this volume (below `1 + P + 2S`).
    pub fn is_valid(&self, value: u64) -> bool {
        value <= self.positions + 2 * self.segments
    }

    /// Entries in one index page.
    pub fn entries_per_page(&self) -> u64 {
        (PAGE_ENTRY_BYTES as u64 * 8) / self.width_bits as u64
    }
}

/// One page of entries in RAM.
struct Page {
    /// Even: stable; odd: its writer is changing it.
    sequence: AtomicU32,
    /// Changed since the last checkpoint took it.
    dirty: AtomicBool,
    words: Box<[AtomicU64]>,
}

impl Page {
    fn new(word_count: usize) -> Page {
        Page {
            sequence: AtomicU32::new(0),
            dirty: AtomicBool::new(false),
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

    /// Replace the entry at `bit`, returning the old one. One writer per page at a time:
    /// it makes the sequence odd (waiting while another writer has it so).
    fn write(&self, bit: u64, width: u32, value: u64) -> u64 {
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
        let old = self.bits(bit, width);
        self.set_bits(bit, width, value);
        self.sequence.store(current + 2, Ordering::Release);
        old
    }
}

pub struct BlockMap {
    codec: EntryCodec,
    block_count: u64,
    entries_per_page: u64,
    words_per_page: usize,
    /// One pointer per page; null: never written (every entry unmapped). Pages live until
    /// the map is dropped.
    pages: Box<[AtomicPtr<Page>]>,
    pages_allocated: AtomicU64,
    /// Entries that are data, and zero records, kept by `set` (no scan for statistics).
    data_blocks: AtomicU64,
    zero_blocks: AtomicU64,
    /// Pages changed since the last checkpoint took them.
    dirty_pages: AtomicU64,
}

impl BlockMap {
    pub fn new(block_count: u64, codec: EntryCodec) -> Self {
        let entries_per_page = codec.entries_per_page();
        let words_per_page = (entries_per_page * codec.width_bits as u64).div_ceil(64) as usize;
        let page_count = block_count.div_ceil(entries_per_page);
        BlockMap {
            codec,
            block_count,
            entries_per_page,
            words_per_page,
            pages: (0..page_count).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            pages_allocated: AtomicU64::new(0),
            data_blocks: AtomicU64::new(0),
            zero_blocks: AtomicU64::new(0),
            dirty_pages: AtomicU64::new(0),
        }
    }

    /// The map of a volume with `geometry`.
    pub fn for_geometry(geometry: &Geometry) -> Self {
        BlockMap::new(geometry.logical_block_count(), EntryCodec::for_geometry(geometry))
    }

    pub fn block_count(&self) -> u64 {
        self.block_count
    }

    pub fn codec(&self) -> EntryCodec {
        self.codec
    }

    fn page(&self, index: u64) -> Option<&Page> {
        let pointer = self.pages[index as usize].load(Ordering::Acquire);
        // SAFETY: a non-null pointer was made by `Box::into_raw` in `page_or_new` and is
        // freed only by `drop`, which has `&mut self`: it outlives every `&self` borrow.
        (!pointer.is_null()).then(|| unsafe { &*pointer })
    }

    fn page_or_new(&self, index: u64) -> &Page {
        if let Some(page) = self.page(index) {
            return page;
        }
        let fresh = Box::into_raw(Box::new(Page::new(self.words_per_page)));
        match self.pages[index as usize].compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.pages_allocated.fetch_add(1, Ordering::Relaxed);
                // SAFETY: just stored; see `page`.
                unsafe { &*fresh }
            }
            Err(existing) => {
                // SAFETY: `fresh` came from `Box::into_raw` above and was never shared.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: see `page`.
                unsafe { &*existing }
            }
        }
    }

    fn place(&self, logical_block: u64) -> (u64, u64) {
        assert!(logical_block < self.block_count, "logical block {logical_block} beyond the map");
        (logical_block / self.entries_per_page, (logical_block % self.entries_per_page) * self.codec.width_bits as u64)
    }

    pub fn get(&self, logical_block: u64) -> Mapping {
        let (page, bit) = self.place(logical_block);
        match self.page(page) {
            None => Mapping::Unmapped,
            Some(page) => self.codec.decode(page.read(bit, self.codec.width_bits)),
        }
    }

    /// Replace a mapping and return the old one. Callers hold the state lock.
    pub fn set(&self, logical_block: u64, mapping: Mapping) -> Mapping {
        let (page, bit) = self.place(logical_block);
        let value = self.codec.encode(mapping);
        if value == 0 && self.page(page).is_none() {
            return Mapping::Unmapped;
        }
        let page = self.page_or_new(page);
        let old = self.codec.decode(page.write(bit, self.codec.width_bits, value));
        if !page.dirty.swap(true, Ordering::Relaxed) {
            self.dirty_pages.fetch_add(1, Ordering::Relaxed);
        }
        let counter = |mapping: Mapping| match mapping {
            Mapping::Data { .. } => Some(&self.data_blocks),
            Mapping::Zero { .. } => Some(&self.zero_blocks),
            _ => None,
        };
        if std::mem::discriminant(&old) != std::mem::discriminant(&mapping) {
            if let Some(counter) = counter(old) {
                counter.fetch_sub(1, Ordering::Relaxed);
            }
            if let Some(counter) = counter(mapping) {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        old
    }

    /// Pages in the map (written or not).
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

    /// Whether page `index` changed since a checkpoint last took it.
    pub fn is_dirty(&self, index: u64) -> bool {
        self.page(index).is_some_and(|page| page.dirty.load(Ordering::Relaxed))
    }

    /// The packed entries of page `index` as stored on media (`INDEX_PAGE_PAYLOAD_BYTES`,
    /// little-endian), marking it clean; `None`: never written. Callers hold the state lock
    /// (no writer changes the page meanwhile).
    pub fn take_page(&self, index: u64) -> Option<Vec<u8>> {
        let page = self.page(index)?;
        if page.dirty.swap(false, Ordering::Relaxed) {
            self.dirty_pages.fetch_sub(1, Ordering::Relaxed);
        }
        let mut bytes: Vec<u8> =
            page.words.iter().flat_map(|word| word.load(Ordering::Relaxed).to_le_bytes()).collect();
        bytes.resize(PAGE_ENTRY_BYTES, 0);
        Some(bytes)
    }

    /// Mark page `index` changed again (a checkpoint that took it failed before it
    /// committed).
    pub fn mark_dirty(&self, index: u64) {
        if let Some(page) = self.page(index) {
            if !page.dirty.swap(true, Ordering::Relaxed) {
                self.dirty_pages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Install page `index` from its packed entries as stored on media (mount, before the
    /// map is shared). Entries beyond what the volume can hold are refused: `false`.
    pub fn install_page(&self, index: u64, packed: &[u8]) -> bool {
        let page = self.page_or_new(index);
        for (word, chunk) in page.words.iter().zip(packed.chunks(8)) {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
        let width = self.codec.width_bits;
        let first = index * self.entries_per_page;
        let end = (first + self.entries_per_page).min(self.block_count);
        let (mut data, mut zero) = (0, 0);
        for slot in 0..end - first {
            let value = page.bits(slot * width as u64, width);
            if !self.codec.is_valid(value) {
                return false;
            }
            match self.codec.decode(value) {
                Mapping::Data { .. } => data += 1,
                Mapping::Zero { .. } => zero += 1,
                _ => {}
            }
        }
        // Entries past the volume's last block must be unmapped.
        for slot in end - first..self.entries_per_page {
            if page.bits(slot * width as u64, width) != 0 {
                return false;
            }
        }
        self.data_blocks.fetch_add(data, Ordering::Relaxed);
        self.zero_blocks.fetch_add(zero, Ordering::Relaxed);
        true
    }

    /// Logical blocks mapped to data, and recorded as zeros.
    pub fn counts(&self) -> (u64, u64) {
        (self.data_blocks.load(Ordering::Relaxed), self.zero_blocks.load(Ordering::Relaxed))
    }

    /// RAM the map holds: the page pointers and the pages written so far.
    pub fn size_bytes(&self) -> u64 {
        let page_bytes = (self.words_per_page * 8 + std::mem::size_of::<Page>()) as u64;
        self.pages.len() as u64 * std::mem::size_of::<AtomicPtr<Page>>() as u64
            + self.pages_allocated.load(Ordering::Relaxed) * page_bytes
    }

    /// RAM the map would hold with every page written.
    pub fn resident_size_bytes(&self) -> u64 {
        BlockMap::resident_size_for(self.block_count, self.codec)
    }

    /// RAM a map of `block_count` entries would hold with every page written, computed
    /// without making one.
    pub fn resident_size_for(block_count: u64, codec: EntryCodec) -> u64 {
        let entries_per_page = codec.entries_per_page();
        let words_per_page = (entries_per_page * codec.width_bits as u64).div_ceil(64);
        let page_bytes = words_per_page * 8 + std::mem::size_of::<Page>() as u64;
        block_count.div_ceil(entries_per_page) * (std::mem::size_of::<AtomicPtr<Page>>() as u64 + page_bytes)
    }

    pub fn iter(&self) -> impl Iterator<Item = Mapping> + '_ {
        (0..self.pages.len() as u64).flat_map(move |page_index| {
            let first = page_index * self.entries_per_page;
            let end = (first + self.entries_per_page).min(self.block_count);
            let page = self.page(page_index);
            (first..end).map(move |logical_block| match page {
                None => Mapping::Unmapped,
                Some(page) => self
                    .codec
                    .decode(page.read((logical_block - first) * self.codec.width_bits as u64, self.codec.width_bits)),
            })
        })
    }
}

impl Drop for BlockMap {
    fn drop(&mut self) {
        for pointer in self.pages.iter() {
            let pointer = pointer.load(Ordering::Acquire);
            if !pointer.is_null() {
                // SAFETY: made by `Box::into_raw` in `page_or_new`, freed once, here.
                drop(unsafe { Box::from_raw(pointer) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_mapping(codec: EntryCodec) -> impl Strategy<Value = Mapping> {
        (0u8..4, 0u64..u64::MAX).prop_map(move |(kind, value)| match kind {
            0 => Mapping::Unmapped,
            1 => Mapping::Data { position: value % codec.positions },
            2 => Mapping::Zero { segment: value % codec.segments },
            _ => Mapping::Trimmed { segment: value % codec.segments },
        })
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
        fn entries_round_trip(positions in 1u64..(1 << 40), segments in 1u64..(1 << 24), kind in 0u8..4, value: u64) {
            let codec = EntryCodec::new(positions, segments);
            let mapping = match kind {
                0 => Mapping::Unmapped,
                1 => Mapping::Data { position: value % positions },
                2 => Mapping::Zero { segment: value % segments },
                _ => Mapping::Trimmed { segment: value % segments },
            };
            prop_assert_eq!(codec.decode(codec.encode(mapping)), mapping);
        }

        /// The map behaves like a plain array of mappings under any sequence of sets,
        /// whatever the entry width (entries straddle words at most widths).
        #[test]
        fn map_matches_a_reference(
            (positions, segments) in (1u64..(1 << 45), 1u64..(1 << 20)),
            operations in proptest::collection::vec((0u64..3000, any::<u64>(), 0u8..4), 0..300),
        ) {
            let codec = EntryCodec::new(positions, segments);
            let map = BlockMap::new(3000, codec);
            let mut reference = vec![Mapping::Unmapped; 3000];
            for (block, value, kind) in operations {
                let mapping = match kind {
                    0 => Mapping::Unmapped,
                    1 => Mapping::Data { position: value % positions },
                    2 => Mapping::Zero { segment: value % segments },
                    _ => Mapping::Trimmed { segment: value % segments },
                };
                let old = map.set(block, mapping);
                prop_assert_eq!(old, reference[block as usize]);
                reference[block as usize] = mapping;
            }
            for (block, expected) in reference.iter().enumerate() {
                prop_assert_eq!(map.get(block as u64), *expected);
            }
            let data = reference.iter().filter(|mapping| matches!(mapping, Mapping::Data { .. })).count() as u64;
            let zero = reference.iter().filter(|mapping| matches!(mapping, Mapping::Zero { .. })).count() as u64;
            prop_assert_eq!(map.counts(), (data, zero));
            prop_assert_eq!(map.iter().collect::<Vec<_>>(), reference);
        }

        #[test]
        fn any_mapping_of_a_volume_fits(mapping in any_mapping(EntryCodec::new(1000, 10))) {
            let codec = EntryCodec::new(1000, 10);
            prop_assert_eq!(codec.decode(codec.encode(mapping)), mapping);
        }
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
                            match map.get(block) {
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
                map.set(block, Mapping::Data { position });
            }
        }
        stop.store(true, Ordering::Relaxed);
        for reader in readers {
            assert!(reader.join().expect("reader") > 0);
        }
    }
}
