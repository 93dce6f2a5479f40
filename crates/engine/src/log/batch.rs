//! Batches: the unit of one stripe write. An [`OpenBatch`] collects accepted writes in
//! memory, laid out exactly as they will sit in the segment (row-major over the data
//! columns, groups of a summary block followed by its data blocks); sealing it builds
//! the summaries and hands a [`SealedBatch`] to the stripe writer.

use crate::layout::format::{self, BatchHeader, Entry, Summary, ENTRIES_PER_SUMMARY};
use crate::layout::geometry::{Geometry, BLOCK_SIZE_BYTES};
use crate::layout::packed;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::Instant;
use stripelog_blockdev::AlignedBuffer;

/// Sets of chunk-sized buffers allocated once, at open: one pool holds the data
/// columns of a batch (one set per batch in memory: the open one and the sealed ones in
/// flight), another the parity shards of batches being written. The loans they allow at
/// once bound the memory on the write path: a writer waits for a set to come back, which
/// is the engine's backpressure.
///
/// A pool may hold more sets than it lends at once: the data pool's extra sets are the
/// cache of recent writes. A set that comes back holding a client batch's rows (marked by
/// [`SealedBatch::retain_for_reads`]) keeps serving reads of those rows
/// ([`BufferPool::read_retained`]) until it is lent again, oldest first: recent writes
/// are cached without copying a byte.
pub struct BufferPool {
    state: Mutex<PoolState>,
    returned: Condvar,
    /// Sets out on loan at most.
    loans_maximum: usize,
    /// Bytes of the sets beyond the loans: the cache of recent writes.
    retained_capacity_bytes: u64,
}

struct PoolState {
    /// By set number; `None` while the set is on loan.
    sets: Vec<Option<Vec<AlignedBuffer>>>,
    /// Free set numbers: those holding nothing at the front, the retained ones behind
    /// them oldest first (the next loan takes the front).
    free: std::collections::VecDeque<usize>,
    loans: usize,
    /// (segment, first row) → the free set holding those rows.
    retained: std::collections::BTreeMap<(u64, u32), Retained>,
    /// By set number: its key in `retained`, while it has one.
    retained_keys: Vec<Option<(u64, u32)>>,
}

/// Rows of a written client batch, kept in a free set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetainedRows {
    pub segment: u64,
    pub first_row: u32,
    pub row_count: u32,
    /// The segment's generation when the batch was written: a segment reused since has
    /// another, and its old rows never match again.
    pub generation: u32,
}

struct Retained {
    set: usize,
    row_count: u32,
    generation: u32,
}

impl BufferPool {
    pub fn new(set_count: usize, buffers_per_set: usize, buffer_size_bytes: usize) -> Arc<BufferPool> {
        BufferPool::with_retained(set_count, 0, buffers_per_set, buffer_size_bytes)
    }

    /// A pool that lends at most `loans_maximum` sets and holds `retained_sets` more for
    /// the rows of recent writes.
    pub fn with_retained(
        loans_maximum: usize,
        retained_sets: usize,
        buffers_per_set: usize,
        buffer_size_bytes: usize,
    ) -> Arc<BufferPool> {
        let set_count = loans_maximum + retained_sets;
        let sets = (0..set_count)
            .map(|_| Some((0..buffers_per_set).map(|_| AlignedBuffer::zeroed(buffer_size_bytes)).collect()))
            .collect();
        Arc::new(BufferPool {
            state: Mutex::new(PoolState {
                sets,
                free: (0..set_count).collect(),
                loans: 0,
                retained: Default::default(),
                retained_keys: vec![None; set_count],
            }),
            returned: Condvar::new(),
            loans_maximum,
            retained_capacity_bytes: (retained_sets * buffers_per_set * buffer_size_bytes) as u64,
        })
    }

    /// Bytes of the sets beyond the loans: the cache of recent writes.
    pub fn retained_capacity_bytes(&self) -> u64 {
        self.retained_capacity_bytes
    }

    fn lend(self: &Arc<Self>, state: &mut PoolState) -> Option<PooledBuffers> {
        if state.loans == self.loans_maximum {
            return None;
        }
        let set = state.free.pop_front()?;
        if let Some(key) = state.retained_keys[set].take() {
            // (A newer batch at the same place after the segment's reuse replaced it.)
            if state.retained.get(&key).is_some_and(|entry| entry.set == set) {
                state.retained.remove(&key);
            }
        }
        state.loans += 1;
        let buffers = state.sets[set].take().expect("a free set is in the pool");
        Some(PooledBuffers { buffers: Some(buffers), set, pool: self.clone(), retain: Mutex::new(None) })
    }

    /// Take a set, waiting for one to be returned if none may be lent.
    pub fn take(self: &Arc<Self>) -> PooledBuffers {
        let mut state = self.state.lock();
        loop {
            if let Some(buffers) = self.lend(&mut state) {
                return buffers;
            }
            self.returned.wait(&mut state);
        }
    }

    /// Take a set if one may be lent now.
    pub fn try_take(self: &Arc<Self>) -> Option<PooledBuffers> {
        self.lend(&mut self.state.lock())
    }

    /// Wait until a set may be lent (without taking it).
    pub fn wait_for_free(&self) {
        let mut state = self.state.lock();
        while state.loans == self.loans_maximum || state.free.is_empty() {
            self.returned.wait(&mut state);
        }
    }

    /// Copy the block at `row`, `column` of `segment` into `out` if a free set holds it
    /// from a batch written at this `generation` of the segment.
    pub fn read_retained(&self, segment: u64, row: u32, column: usize, generation: u32, out: &mut [u8]) -> bool {
        if self.retained_capacity_bytes == 0 {
            return false;
        }
        let state = self.state.lock();
        let Some((&(found_segment, first_row), entry)) = state.retained.range(..=(segment, row)).next_back() else {
            return false;
        };
        if found_segment != segment || row >= first_row + entry.row_count || entry.generation != generation {
            return false;
        }
        let Some(buffer) = state.sets[entry.set].as_ref().and_then(|set| set.get(column)) else { return false };
        let start = (row - first_row) as usize * BLOCK_SIZE_BYTES;
        match buffer.get(start..start + BLOCK_SIZE_BYTES) {
            Some(block) => {
                out.copy_from_slice(block);
                true
            }
            None => false,
        }
    }
}

/// A set of buffers on loan from a [`BufferPool`]; goes back when dropped.
pub struct PooledBuffers {
    buffers: Option<Vec<AlignedBuffer>>,
    set: usize,
    pool: Arc<BufferPool>,
    /// The rows it holds, to serve reads once it is back (set when they are written).
    retain: Mutex<Option<RetainedRows>>,
}

impl PooledBuffers {
    pub fn buffers(&self) -> &[AlignedBuffer] {
        self.buffers.as_deref().expect("present until drop")
    }
    pub fn buffers_mut(&mut self) -> &mut [AlignedBuffer] {
        self.buffers.as_deref_mut().expect("present until drop")
    }
}

impl Drop for PooledBuffers {
    fn drop(&mut self) {
        if let Some(set) = self.buffers.take() {
            let mut state = self.pool.state.lock();
            let retains = self.pool.retained_capacity_bytes > 0;
            assert!(state.sets[self.set].is_none(), "set {}: a set on loan is out of the pool", self.set);
            assert!(state.loans > 0, "set {}: a set comes back only from a loan", self.set);
            state.sets[self.set] = Some(set);
            state.loans -= 1;
            match self.retain.get_mut().take().filter(|_| retains) {
                Some(rows) => {
                    let key = (rows.segment, rows.first_row);
                    let entry = Retained { set: self.set, row_count: rows.row_count, generation: rows.generation };
                    state.retained.insert(key, entry);
                    state.retained_keys[self.set] = Some(key);
                    state.free.push_back(self.set);
                }
                None => state.free.push_front(self.set),
            }
            drop(state);
            // Every waiter: `wait_for_free` takes nothing, so waking one could strand others.
            self.pool.returned.notify_all();
        }
    }
}

/// Where a fragment went: the batch index of the packed block it starts in, and every
/// packed block it changed with its block checksum as it now is (the checksums their
/// positions must prove).
pub struct PlacedFragment {
    pub start_index: u32,
    pub touched: Vec<(u32, u32)>,
}

/// What a fragment stores, and so the entries that describe it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FragmentOwner {
    /// Clients' logical blocks: a kind-9 entry for each block of the mask.
    Blocks,
    /// The copy of shared-block record `record` (keyed `2^63 | record`): one kind-15
    /// entry, born or `moved`, with room kept in its summary for the `entries_after`
    /// entries the caller pushes next (the references that share a new copy).
    Record { record: u64, moved: bool, entries_after: usize },
}

/// Where the next entry of an open batch goes.
pub enum Slot {
    /// A data block at this batch index.
    Block(u32),
    /// A range entry (no block).
    Range,
}

struct Group {
    summary_index: u32,
    entries: Vec<Entry>,
}

/// The packed block an open batch is filling (docs/compression.md): its batch index,
/// the group whose summary describes it, and its `Packed` entry in that group.
#[derive(Clone, Copy)]
struct Packing {
    index: u32,
    group: usize,
    entry: usize,
}

pub struct OpenBatch {
    pub sequence: u64,
    pub segment: u64,
    pub segment_open_sequence: u64,
    pub first_row: u32,
    /// Batch indices available: `data_columns × rows left in the segment`.
    capacity_blocks: u32,
    data_columns: u32,
    next_index: u32,
    groups: Vec<Group>,
    /// The packed block being filled, if any. Fragments go into it while it has room and
    /// its group's summary is the last one (a fragment's entry names no block: it starts
    /// in the block its summary's latest `Packed` entry consumed).
    packing: Option<Packing>,
    buffers: PooledBuffers,
    pub opened_at: Instant,
    /// Positions whose blocks the batch's entries made dead: dropped from the block cache
    /// when the batch is written (off the client's path). At most
    /// [`KILLED_POSITIONS_MAXIMUM`]; past that the caller drops them at once.
    pub killed_positions: Vec<u64>,
    /// The stream (open segment) it is in.
    pub stream: usize,
    /// Written by the cleaner (relocated blocks), not by a client.
    pub relocation: bool,
    /// Holds checkpoint blocks (no client data).
    pub metadata: bool,
    /// The oldest write clock of the blocks a relocation batch moves (its header's clock).
    pub oldest_clock: u64,
    /// Sealed as the first of a pair: the next batch (the cold clients' batch) belongs
    /// with it (docs/crash-consistency.md, "Client writes in two streams").
    pub paired_with_next: bool,
}

/// Bound of [`OpenBatch::killed_positions`] (a large trim kills many blocks per entry).
pub const KILLED_POSITIONS_MAXIMUM: usize = 1 << 16;

impl OpenBatch {
    pub fn new(
        geometry: &Geometry,
        sequence: u64,
        segment: u64,
        segment_open_sequence: u64,
        first_row: u32,
        buffers: PooledBuffers,
    ) -> OpenBatch {
        let data_columns = geometry.data_columns() as u32;
        OpenBatch {
            sequence,
            segment,
            segment_open_sequence,
            first_row,
            capacity_blocks: (geometry.rows_per_chunk() - first_row) * data_columns,
            data_columns,
            next_index: 0,
            groups: Vec::new(),
            packing: None,
            buffers,
            opened_at: Instant::now(),
            killed_positions: Vec::new(),
            stream: crate::log::HOST_STREAM,
            relocation: false,
            metadata: false,
            oldest_clock: u64::MAX,
            paired_with_next: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Indices that sealing now would fill with zero padding to complete the last row.
    pub fn padding_blocks(&self) -> u32 {
        (self.data_columns - self.next_index % self.data_columns) % self.data_columns
    }

    /// Reserve room for one more entry (with a block when `with_block`); `None` when the
    /// batch is full and must be sealed first.
    pub fn reserve(&mut self, with_block: bool) -> Option<Slot> {
        let first = self.reserve_run(with_block as u32, 1)?;
        Some(if with_block { Slot::Block(first) } else { Slot::Range })
    }

    /// Reserve `blocks` consecutive batch indices (0 or 1) described by the next `entries`
    /// entries, all in one summary (a shared copy and its references): the first index,
    /// or `None` when the batch is full. The caller pushes the entries in order.
    pub fn reserve_entries(&mut self, blocks: u32, entries: usize) -> Option<u32> {
        self.reserve_run(blocks, entries)
    }

    /// Reserve `blocks` consecutive batch indices described by `entries` entries of one
    /// summary (a new group is started when the last one has no room for them all): the
    /// first index, or `None` when the batch is full.
    fn reserve_run(&mut self, blocks: u32, entries: usize) -> Option<u32> {
        assert!(entries <= ENTRIES_PER_SUMMARY, "a run's {entries} entries fit one summary");
        assert!(blocks as usize <= packed::BLOCKS_PER_FRAGMENT_MAXIMUM, "a run is one record's blocks, not {blocks}");
        let group_full = self.groups.last().is_none_or(|group| group.entries.len() + entries > ENTRIES_PER_SUMMARY);
        let needed = group_full as u32 + blocks;
        if self.next_index + needed > self.capacity_blocks {
            return None;
        }
        // Summary indices are 16-bit on disk.
        if group_full && self.groups.len() > u16::MAX as usize {
            return None;
        }
        if group_full {
            self.groups.push(Group { summary_index: self.next_index, entries: Vec::new() });
            self.next_index += 1;
        }
        self.next_index += blocks;
        Some(self.next_index - blocks)
    }

    /// Record an entry in the slot just reserved (in order).
    pub fn push_entry(&mut self, entry: Entry) {
        let group = self.groups.last_mut().expect("reserve() opened a group");
        group.entries.push(entry);
        assert!(group.entries.len() <= ENTRIES_PER_SUMMARY, "a summary holds the entries reserved in it");
    }

    /// Set the lifetime class of `logical_block`'s entry, when it is among the last few of
    /// the batch (a fragment's entry may be followed by its continuation blocks').
    pub fn set_last_lifetime_class(&mut self, logical_block: u64, class: u8) {
        let recent = self.groups.last_mut().into_iter().flat_map(|group| {
            group.entries.iter_mut().rev().take(packed::BLOCKS_PER_UNIT_MAXIMUM + packed::BLOCKS_PER_FRAGMENT_MAXIMUM)
        });
        let mut found = false;
        for entry in recent {
            if let Entry::Data { logical_block: last, lifetime_class, .. }
            | Entry::Fragment { logical_block: last, lifetime_class, .. } = entry
            {
                if *last == logical_block {
                    *lifetime_class = class;
                    found = true;
                    break;
                }
            }
        }
        assert!(found, "block {logical_block}: the entry just accepted for it is among the batch's last");
    }

    /// Put `fragment` — the unit of `blocks` logical blocks from `first_logical_block`, of
    /// which those in `mask` are stored by it, with unit checksum `checksum` — into the
    /// packed block being filled, spilling into the next batch indices when it does not
    /// fit and that block is the batch's last index, or into a new packed block.
    /// `sixteenths`: each block's share; `owner`: what the entries name. `None` when the
    /// batch is full (nothing is changed then).
    #[allow(clippy::too_many_arguments)]
    pub fn append_fragment(
        &mut self,
        first_logical_block: u64,
        blocks: u8,
        mask: u8,
        fragment: &[u8],
        checksum: u32,
        lifetime_class: u8,
        sixteenths: u8,
        owner: FragmentOwner,
    ) -> Option<PlacedFragment> {
        assert!(
            !fragment.is_empty() && fragment.len() <= packed::UNIT_BYTES_MAXIMUM,
            "a fragment of {} bytes is a unit's at most",
            fragment.len()
        );
        // The entries it needs in the summary of its start block.
        let served = match owner {
            FragmentOwner::Blocks => mask.count_ones() as usize,
            FragmentOwner::Record { record, entries_after, .. } => {
                assert!(
                    blocks == 1 && mask == 1 && first_logical_block == packed::record_key(record),
                    "record {record}: a shared copy is a unit of one block keyed by its record"
                );
                1 + entries_after
            }
        };
        let continuing = self.packing.filter(|packing| packing.group + 1 == self.groups.len()).and_then(|packing| {
            let room = packed::room(self.block(packing.index));
            let spill_blocks = packed::blocks_after(fragment.len(), room);
            let group_room = ENTRIES_PER_SUMMARY - self.groups[packing.group].entries.len();
            let fits_here = spill_blocks == 0 && room > 0 && group_room >= served;
            let spills = spill_blocks > 0
                && room >= packed::SPILL_START_BYTES_MINIMUM
                && packing.index + 1 == self.next_index
                && group_room >= served + spill_blocks
                && self.next_index + spill_blocks as u32 <= self.capacity_blocks;
            if fits_here || spills {
                if spills {
                    self.reserve_run(spill_blocks as u32, 0).expect("checked: room in the group and the batch");
                }
                Some(packing)
            } else {
                None
            }
        });
        let packing = match continuing {
            Some(packing) => packing,
            None => {
                let first_room = packed::EMPTY_BLOCK_ROOM_BYTES;
                let spill_blocks = packed::blocks_after(fragment.len(), first_room);
                let index = self.reserve_run(1 + spill_blocks as u32, 1 + served + spill_blocks)?;
                packed::initialize(self.block_mut(index), 0);
                let group = self.groups.len() - 1;
                let entries = &mut self.groups[group].entries;
                // Its checksum is set below, once the fragment is in.
                entries.push(Entry::Packed { checksum: 0 });
                Packing { index, group, entry: entries.len() - 1 }
            }
        };
        let start_index = packing.index;
        let block = self.block_mut(start_index);
        let mut placed = packed::start_fragment(block, first_logical_block, blocks, mask, fragment, checksum);
        let group = packing.group;
        match owner {
            FragmentOwner::Blocks => {
                for place in (0..blocks).filter(|place| mask & (1 << place) != 0) {
                    self.groups[group].entries.push(Entry::Fragment {
                        logical_block: first_logical_block + place as u64,
                        checksum,
                        lifetime_class,
                        sixteenths,
                    });
                }
            }
            FragmentOwner::Record { record, moved, .. } => {
                self.groups[group].entries.push(Entry::SharedFragment {
                    record,
                    checksum,
                    lifetime_class,
                    sixteenths,
                    moved,
                });
            }
        }
        let mut touched = vec![(start_index, self.refresh_checksum(packing))];
        let mut packing = packing;
        while placed < fragment.len() {
            let index = packing.index + 1;
            assert!(index < self.next_index, "a fragment continues into indices reserved for it");
            placed += packed::continue_fragment(self.block_mut(index), &fragment[placed..]);
            let entries = &mut self.groups[group].entries;
            entries.push(Entry::Packed { checksum: 0 });
            packing = Packing { index, group, entry: entries.len() - 1 };
            touched.push((index, self.refresh_checksum(packing)));
        }
        self.packing = Some(packing);
        Some(PlacedFragment { start_index, touched })
    }

    /// Recompute the block checksum of a packed block being filled into its entry.
    fn refresh_checksum(&mut self, packing: Packing) -> u32 {
        assert!(packing.index < self.next_index, "a packed block being filled is a reserved index");
        let block_checksum = format::block_checksum(self.block(packing.index));
        let entry = &mut self.groups[packing.group].entries[packing.entry];
        assert!(matches!(entry, Entry::Packed { .. }), "a packed block's entry is a `Packed` one, not {entry:?}");
        if let Entry::Packed { checksum } = entry {
            *checksum = block_checksum;
        }
        block_checksum
    }

    /// Extend the last entry when it is a range of the same kind ending at
    /// `logical_block`. Returns false when a new entry is needed.
    pub fn extend_last_range(&mut self, zero: bool, logical_block: u64) -> bool {
        let Some(last) = self.groups.last_mut().and_then(|group| group.entries.last_mut()) else {
            return false;
        };
        match last {
            Entry::Zero { logical_block: start, block_count }
                if zero && *start + *block_count as u64 == logical_block && *block_count < u32::MAX =>
            {
                *block_count += 1;
                return true;
            }
            Entry::Trim { logical_block: start, block_count }
                if !zero && *start + *block_count as u64 == logical_block && *block_count < u32::MAX =>
            {
                *block_count += 1;
                return true;
            }
            _ => {}
        }
        false
    }

    /// (row within the batch, data column) of a batch index.
    pub fn place(&self, index: u32) -> (u32, usize) {
        (index / self.data_columns, (index % self.data_columns) as usize)
    }

    pub fn block_mut(&mut self, index: u32) -> &mut [u8] {
        assert!(index < self.capacity_blocks, "batch index {index} lies in the segment's rows left");
        let (row, column) = self.place(index);
        let start = row as usize * BLOCK_SIZE_BYTES;
        &mut self.buffers.buffers_mut()[column][start..start + BLOCK_SIZE_BYTES]
    }

    pub fn block(&self, index: u32) -> &[u8] {
        let (row, column) = self.place(index);
        let start = row as usize * BLOCK_SIZE_BYTES;
        &self.buffers.buffers()[column][start..start + BLOCK_SIZE_BYTES]
    }

    /// Batch index of data-space row `segment_row`, column `column`, when it is filled.
    pub fn index_of(&self, segment_row: u32, column: usize) -> Option<u32> {
        let row = segment_row.checked_sub(self.first_row)?;
        let index = row * self.data_columns + column as u32;
        (index < self.next_index).then_some(index)
    }

    /// Seal: write the summaries and zero padding into the buffers. Returns the sealed
    /// batch and, for every batch index that is a summary or padding, its checksum.
    pub fn seal(
        mut self,
        volume_uuid: [u8; 16],
        epoch: u64,
        durable_through_sequence: u64,
        previous_segment: u64,
        write_clock: u64,
        next_segment: u64,
    ) -> (SealedBatch, Vec<(u32, u32)>) {
        let row_count = self.next_index.div_ceil(self.data_columns);
        let header = BatchHeader {
            volume_uuid,
            sequence: self.sequence,
            segment: self.segment,
            segment_open_sequence: self.segment_open_sequence,
            durable_through_sequence,
            first_row: self.first_row,
            row_count,
            block_count: self.next_index,
            summary_count: self.groups.len() as u32,
            epoch,
            previous_segment,
            next_segment,
            write_clock,
            stream: self.stream as u8,
            paired_with_next: self.paired_with_next,
        };
        let mut metadata_checksums = Vec::new();
        let groups = std::mem::take(&mut self.groups);
        for (summary_index, group) in groups.into_iter().enumerate() {
            let summary = Summary { header, summary_index: summary_index as u16, entries: group.entries };
            let block = self.block_mut(group.summary_index);
            summary.encode(block);
            metadata_checksums.push((group.summary_index, format::block_checksum(block)));
        }
        let zero_checksum = format::zero_block_checksum();
        for index in self.next_index..row_count * self.data_columns {
            self.block_mut(index).fill(0);
            metadata_checksums.push((index, zero_checksum));
        }
        let sealed = SealedBatch {
            header,
            data_columns: self.buffers,
            killed_positions: self.killed_positions,
            relocation: self.relocation,
            metadata: self.metadata,
        };
        (sealed, metadata_checksums)
    }
}

/// A batch whose content is final: written by the stripe writer, readable from memory
/// until its member writes complete. Its buffers return to the pool when dropped.
pub struct SealedBatch {
    pub header: BatchHeader,
    data_columns: PooledBuffers,
    pub killed_positions: Vec<u64>,
    pub relocation: bool,
    pub metadata: bool,
}

impl SealedBatch {
    /// The slice of this batch (or of its `parity`) that `member` stores, and where.
    pub fn member_part<'a>(&'a self, geometry: &Geometry, parity: &'a PooledBuffers, member: usize) -> (&'a [u8], u64) {
        let header = &self.header;
        let length = header.row_count as usize * BLOCK_SIZE_BYTES;
        let buffer = match geometry.role_of_member(header.segment, member) {
            crate::layout::geometry::Role::Data { column, .. } => self.data_column(column),
            crate::layout::geometry::Role::Parity { shard } => &parity.buffers()[shard][..length],
        };
        (buffer, geometry.member_offset_bytes(header.segment, header.first_row))
    }

    /// Once its buffers are back in the pool, they serve reads of its rows (until lent
    /// again): the segment is at `generation`.
    pub fn retain_for_reads(&self, generation: u32) {
        let header = &self.header;
        *self.data_columns.retain.lock() = Some(RetainedRows {
            segment: header.segment,
            first_row: header.first_row,
            row_count: header.row_count,
            generation,
        });
    }

    pub fn data_column(&self, column: usize) -> &[u8] {
        &self.data_columns.buffers()[column][..self.header.row_count as usize * BLOCK_SIZE_BYTES]
    }

    /// Compute the parity shards of the batch's rows into `parity`.
    pub fn compute_parity(&self, geometry: &Geometry, parity: &mut PooledBuffers) {
        let length = self.header.row_count as usize * BLOCK_SIZE_BYTES;
        let data: Vec<&[u8]> = (0..geometry.data_columns()).map(|column| self.data_column(column)).collect();
        let mut shards: Vec<&mut [u8]> = parity.buffers_mut().iter_mut().map(|shard| &mut shard[..length]).collect();
        crate::array::parity::compute(geometry.raid_level, &data, &mut shards);
    }

    pub fn block(&self, segment_row: u32, column: usize) -> Option<&[u8]> {
        let row = segment_row.checked_sub(self.header.first_row)?;
        if row >= self.header.row_count {
            return None;
        }
        let start = row as usize * BLOCK_SIZE_BYTES;
        Some(&self.data_columns.buffers()[column][start..start + BLOCK_SIZE_BYTES])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK_BYTES: usize = 4 * BLOCK_SIZE_BYTES;

    /// Lend a set, fill every block of it with `fill`, and give it back holding rows
    /// `first_row..first_row + 4` of `segment` (or holding nothing).
    fn write_and_return(pool: &Arc<BufferPool>, fill: u8, rows: Option<(u64, u32, u32)>) -> usize {
        let mut buffers = pool.take();
        for buffer in buffers.buffers_mut() {
            buffer.fill(fill);
        }
        let set = buffers.set;
        if let Some((segment, first_row, generation)) = rows {
            *buffers.retain.lock() = Some(RetainedRows { segment, first_row, row_count: 4, generation });
        }
        drop(buffers);
        set
    }

    fn read(pool: &BufferPool, segment: u64, row: u32, generation: u32) -> Option<u8> {
        let mut out = vec![0u8; BLOCK_SIZE_BYTES];
        pool.read_retained(segment, row, 1, generation, &mut out).then(|| out[0])
    }

    #[test]
    fn returned_sets_serve_their_rows_until_lent_again_oldest_first() {
        let pool = BufferPool::with_retained(1, 2, 2, CHUNK_BYTES);
        assert_eq!(pool.retained_capacity_bytes(), 2 * 2 * CHUNK_BYTES as u64);
        write_and_return(&pool, 1, Some((7, 0, 3)));
        write_and_return(&pool, 2, Some((7, 4, 3)));
        assert_eq!((read(&pool, 7, 0, 3), read(&pool, 7, 3, 3), read(&pool, 7, 4, 3)), (Some(1), Some(1), Some(2)));
        // Rows no set holds, another segment, another generation (the segment reused).
        assert_eq!((read(&pool, 7, 8, 3), read(&pool, 6, 1, 3), read(&pool, 7, 1, 4)), (None, None, None));
        // A set that holds nothing is lent before any that holds rows (set 2, never
        // used; then again the same one).
        write_and_return(&pool, 9, None);
        write_and_return(&pool, 3, Some((8, 0, 5)));
        assert_eq!((read(&pool, 7, 0, 3), read(&pool, 7, 4, 3), read(&pool, 8, 4, 5)), (Some(1), Some(2), None));
        // Then the oldest: rows 0..4 of segment 7 go, the rest stay.
        write_and_return(&pool, 4, Some((9, 0, 6)));
        assert_eq!((read(&pool, 7, 0, 3), read(&pool, 7, 5, 3), read(&pool, 8, 2, 5)), (None, Some(2), Some(3)));
        assert_eq!(read(&pool, 9, 3, 6), Some(4));
    }

    #[test]
    fn a_set_lent_again_leaves_a_newer_batch_at_the_same_place_readable() {
        let pool = BufferPool::with_retained(1, 1, 2, CHUNK_BYTES);
        // The segment is reused: a newer batch at the same first row, another generation.
        let older = write_and_return(&pool, 1, Some((7, 0, 3)));
        let newer = write_and_return(&pool, 2, Some((7, 0, 4)));
        assert_ne!(older, newer);
        assert_eq!((read(&pool, 7, 1, 3), read(&pool, 7, 1, 4)), (None, Some(2)));
        // Lending the older set must not drop the newer one's rows.
        let lent = pool.take();
        assert_eq!(lent.set, older);
        assert_eq!(read(&pool, 7, 1, 4), Some(2));
    }

    #[test]
    fn loans_stay_within_their_bound_while_retained_sets_are_free() {
        let pool = BufferPool::with_retained(2, 3, 1, CHUNK_BYTES);
        let first = pool.take();
        let second = pool.try_take().expect("a second loan");
        assert!(pool.try_take().is_none(), "a third loan while two are out");
        drop(first);
        let third = pool.try_take().expect("a loan once one came back");
        drop((second, third));
        // Without retained sets nothing is kept, whatever the batches ask.
        let plain = BufferPool::new(1, 1, CHUNK_BYTES);
        assert_eq!(plain.retained_capacity_bytes(), 0);
        write_and_return(&plain, 5, Some((1, 0, 0)));
        let mut out = vec![0u8; BLOCK_SIZE_BYTES];
        assert!(!plain.read_retained(1, 0, 0, 0, &mut out));
    }
}
