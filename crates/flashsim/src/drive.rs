//! The drive in virtual time: a page-mapped FTL over a NAND array whose parallel units,
//! channels, host link and controller each have a "busy until" instant. A request is
//! given its arrival instant and returns its completion instant; nothing sleeps, so the
//! model runs as fast as its bookkeeping allows and replays exactly.
//!
//! Garbage collection is greedy (the sealed block with the fewest valid pages), per unit,
//! in the foreground: when a unit has fewer free blocks than its reserve, the write that
//! needs a block waits while victims are copied back within the unit and erased. Free
//! blocks are taken least-worn first (dynamic wear levelling); when a unit's erase counts
//! spread beyond a threshold, the coldest block is collected next (static wear levelling).

use crate::model::DriveModel;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use stripelog_blockdev::DeviceError;

/// A logical page with no physical page, or a physical page holding no live data.
const UNMAPPED: u32 = u32::MAX;
/// Static wear levelling looks at a unit's spread of erase counts this often.
const WEAR_CHECK_INTERVAL_ERASES: u32 = 16;
/// Requests are checked against this alignment (the block-device contract).
const REQUEST_ALIGNMENT_BYTES: u64 = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BlockState {
    Free,
    Active,
    Sealed,
}

#[derive(Clone, Debug)]
struct Block {
    state: BlockState,
    valid_pages: u32,
    written_pages: u32,
    erase_count: u32,
    /// Position in its unit's bucket of sealed blocks with `valid_pages` valid pages.
    bucket_position: u32,
}

struct Unit {
    channel: usize,
    busy_until_ns: u64,
    /// Free blocks, least-worn first (dynamic wear levelling).
    free_blocks: BinaryHeap<Reverse<(u32, u32)>>,
    host_block: Option<u32>,
    collection_block: Option<u32>,
    /// Sealed blocks by number of valid pages: the greedy victim is in the lowest bucket.
    sealed_by_valid: Vec<Vec<u32>>,
    erases_since_wear_check: u32,
    wear_victim: Option<u32>,
}

/// What the drive has done since it was made (or since [`FlashDrive::reset_statistics`]).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct DriveStatistics {
    pub host_write_requests: u64,
    pub host_write_bytes: u64,
    pub host_read_requests: u64,
    pub host_read_bytes: u64,
    pub trimmed_bytes: u64,
    /// Pages programmed for the host (a partial-page write programs a whole page).
    pub host_program_pages: u64,
    /// Pages copied by garbage collection and wear levelling.
    pub relocated_pages: u64,
    pub nand_read_pages: u64,
    pub erases: u64,
    pub wear_leveling_moves: u64,
    /// Total time garbage collection kept units busy (summed over units).
    pub collection_busy_ns: u64,
}

impl DriveStatistics {
    pub fn nand_program_pages(&self) -> u64 {
        self.host_program_pages + self.relocated_pages
    }

    /// NAND bytes programmed per host byte written.
    pub fn write_amplification(&self, page_size_bytes: u32) -> f64 {
        if self.host_write_bytes == 0 {
            return 0.0;
        }
        (self.nand_program_pages() * page_size_bytes as u64) as f64 / self.host_write_bytes as f64
    }

    /// Counters accumulated from `earlier` to `self`.
    pub fn since(&self, earlier: &DriveStatistics) -> DriveStatistics {
        DriveStatistics {
            host_write_requests: self.host_write_requests - earlier.host_write_requests,
            host_write_bytes: self.host_write_bytes - earlier.host_write_bytes,
            host_read_requests: self.host_read_requests - earlier.host_read_requests,
            host_read_bytes: self.host_read_bytes - earlier.host_read_bytes,
            trimmed_bytes: self.trimmed_bytes - earlier.trimmed_bytes,
            host_program_pages: self.host_program_pages - earlier.host_program_pages,
            relocated_pages: self.relocated_pages - earlier.relocated_pages,
            nand_read_pages: self.nand_read_pages - earlier.nand_read_pages,
            erases: self.erases - earlier.erases,
            wear_leveling_moves: self.wear_leveling_moves - earlier.wear_leveling_moves,
            collection_busy_ns: self.collection_busy_ns - earlier.collection_busy_ns,
        }
    }
}

/// How evenly the blocks wear.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EraseSpread {
    pub minimum: u32,
    pub maximum: u32,
    pub mean: f64,
    pub standard_deviation: f64,
}

pub struct FlashDrive {
    model: DriveModel,
    units: Vec<Unit>,
    blocks: Vec<Block>,
    blocks_per_unit: u32,
    logical_to_physical: Vec<u32>,
    physical_to_logical: Vec<u32>,
    channel_busy_until_ns: Vec<u64>,
    controller_busy_until_ns: u64,
    link_busy_until_ns: u64,
    next_unit: usize,
    /// Program completions of the pages in the write cache (earliest first).
    cache_program_ends_ns: BinaryHeap<Reverse<u64>>,
    latest_program_end_ns: u64,
    first_write_ns: Option<u64>,
    throttle_next_ns: u64,
    now_ns: u64,
    statistics: DriveStatistics,
}

impl FlashDrive {
    /// A fresh (secure-erased) drive.
    pub fn new(model: DriveModel) -> Result<FlashDrive, String> {
        model.validate()?;
        let geometry = &model.geometry;
        let units = geometry.parallel_units();
        let page_bytes = geometry.page_size_bytes as u64;
        let logical_pages = model.user_capacity_bytes / page_bytes;
        let raw_pages = (logical_pages as f64 / (1.0 - model.ftl.spare_fraction)).ceil() as u64;
        let blocks_per_unit =
            raw_pages.div_ceil(geometry.pages_per_block as u64 * units as u64) as u32 + model.ftl.gc_reserve_blocks + 1;
        let total_blocks = blocks_per_unit as u64 * units as u64;
        if total_blocks * geometry.pages_per_block as u64 >= UNMAPPED as u64 {
            return Err("the drive has more pages than the model can address (2^32)".into());
        }
        let channels = geometry.channels as usize;
        let units: Vec<Unit> = (0..units as usize)
            .map(|unit| Unit {
                channel: unit % channels,
                busy_until_ns: 0,
                free_blocks: (0..blocks_per_unit)
                    .map(|local| Reverse((0, unit as u32 * blocks_per_unit + local)))
                    .collect(),
                host_block: None,
                collection_block: None,
                sealed_by_valid: vec![Vec::new(); geometry.pages_per_block as usize + 1],
                erases_since_wear_check: 0,
                wear_victim: None,
            })
            .collect();
        let block =
            Block { state: BlockState::Free, valid_pages: 0, written_pages: 0, erase_count: 0, bucket_position: 0 };
        Ok(FlashDrive {
            units,
            blocks: vec![block; total_blocks as usize],
            blocks_per_unit,
            logical_to_physical: vec![UNMAPPED; logical_pages as usize],
            physical_to_logical: vec![UNMAPPED; (total_blocks * geometry.pages_per_block as u64) as usize],
            channel_busy_until_ns: vec![0; channels],
            controller_busy_until_ns: 0,
            link_busy_until_ns: 0,
            next_unit: 0,
            cache_program_ends_ns: BinaryHeap::new(),
            latest_program_end_ns: 0,
            first_write_ns: None,
            throttle_next_ns: 0,
            now_ns: 0,
            statistics: DriveStatistics::default(),
            model,
        })
    }

    pub fn model(&self) -> &DriveModel {
        &self.model
    }

    /// Bytes the host can address (whole pages).
    pub fn size_bytes(&self) -> u64 {
        self.logical_to_physical.len() as u64 * self.model.geometry.page_size_bytes as u64
    }

    /// Raw NAND bytes, spare and reserve included.
    pub fn raw_size_bytes(&self) -> u64 {
        self.blocks.len() as u64 * self.model.geometry.block_size_bytes()
    }

    /// The latest completion instant handed out (the drive's clock).
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    pub fn statistics(&self) -> &DriveStatistics {
        &self.statistics
    }

    pub fn erase_spread(&self) -> EraseSpread {
        let counts = self.blocks.iter().map(|block| block.erase_count as f64);
        let count = self.blocks.len() as f64;
        let mean = counts.clone().sum::<f64>() / count;
        let variance = counts.map(|erases| (erases - mean).powi(2)).sum::<f64>() / count;
        EraseSpread {
            minimum: self.blocks.iter().map(|block| block.erase_count).min().unwrap_or(0),
            maximum: self.blocks.iter().map(|block| block.erase_count).max().unwrap_or(0),
            mean,
            standard_deviation: variance.sqrt(),
        }
    }

    /// Pages of live data the FTL holds.
    pub fn mapped_pages(&self) -> u64 {
        self.logical_to_physical.iter().filter(|&&physical| physical != UNMAPPED).count() as u64
    }

    fn check(&self, offset_bytes: u64, length_bytes: u64) -> Result<(), DeviceError> {
        if !offset_bytes.is_multiple_of(REQUEST_ALIGNMENT_BYTES)
            || !length_bytes.is_multiple_of(REQUEST_ALIGNMENT_BYTES)
        {
            return Err(DeviceError::InvalidRequest(format!(
                "offset {offset_bytes} or length {length_bytes} is not a multiple of {REQUEST_ALIGNMENT_BYTES}"
            )));
        }
        match offset_bytes.checked_add(length_bytes) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(DeviceError::InvalidRequest(format!(
                "range {offset_bytes}+{length_bytes} is beyond the drive's {} bytes",
                self.size_bytes()
            ))),
        }
    }

    /// The controller takes the command.
    fn command(&mut self, arrival_ns: u64) -> u64 {
        let start = arrival_ns.max(self.controller_busy_until_ns);
        self.controller_busy_until_ns = start + self.model.timing.command_overhead_ns;
        self.controller_busy_until_ns
    }

    /// `length_bytes` cross the host link, starting no earlier than `ready_ns`.
    fn link(&mut self, ready_ns: u64, length_bytes: u64) -> u64 {
        let start = ready_ns.max(self.link_busy_until_ns);
        self.link_busy_until_ns = start + transfer_ns(length_bytes, self.model.timing.host_link_bytes_per_second);
        self.link_busy_until_ns
    }

    fn page_transfer_ns(&self) -> u64 {
        transfer_ns(self.model.geometry.page_size_bytes as u64, self.model.timing.channel_bytes_per_second)
    }

    fn unit_of_block(&self, block: u32) -> usize {
        (block / self.blocks_per_unit) as usize
    }

    /// Read one physical page to the controller; returns when its data is there.
    fn read_physical(&mut self, physical: u32, ready_ns: u64) -> u64 {
        let unit_index = self.unit_of_block(physical / self.model.geometry.pages_per_block);
        let transfer = self.page_transfer_ns();
        let unit = &mut self.units[unit_index];
        let sensed = ready_ns.max(unit.busy_until_ns) + self.model.timing.read_page_ns;
        unit.busy_until_ns = sensed;
        let channel = &mut self.channel_busy_until_ns[unit.channel];
        let start = sensed.max(*channel);
        *channel = start + transfer;
        self.statistics.nand_read_pages += 1;
        start + transfer
    }

    /// Host write of `length_bytes` at `offset_bytes` arriving at `arrival_ns`: returns
    /// the instant it completes (data in the write cache, or programmed).
    pub fn write(&mut self, offset_bytes: u64, length_bytes: u64, arrival_ns: u64) -> Result<u64, DeviceError> {
        self.check(offset_bytes, length_bytes)?;
        let mut ready = self.command(arrival_ns);
        ready = self.link(ready, length_bytes);
        let first_write = *self.first_write_ns.get_or_insert(ready);
        // The throttle holds back acknowledgements, one per interval; the drive's work goes
        // on meanwhile, so a drive that is slower than its cap is not slowed further.
        let mut acknowledgement_slot = ready;
        if let Some(throttle) = &self.model.ftl.throttle {
            if ready.saturating_sub(first_write) as f64 >= throttle.after_seconds * 1e9 {
                let interval = 1_000_000_000 / throttle.write_requests_per_second_maximum.max(1) as u64;
                self.throttle_next_ns = self.throttle_next_ns.max(ready) + interval;
                acknowledgement_slot = self.throttle_next_ns;
            }
        }
        let page_bytes = self.model.geometry.page_size_bytes as u64;
        let end_bytes = offset_bytes + length_bytes;
        let mut completion = acknowledgement_slot;
        for logical in offset_bytes / page_bytes..end_bytes.div_ceil(page_bytes) {
            let whole = logical * page_bytes >= offset_bytes && (logical + 1) * page_bytes <= end_bytes;
            let old = self.logical_to_physical[logical as usize];
            // A partial page is merged with its old content: read it first.
            let data_ready = if !whole && old != UNMAPPED { self.read_physical(old, ready) } else { ready };
            let programmed = self.program_host_page(logical as u32, data_ready, offset_bytes)?;
            completion = completion.max(self.cache_acknowledgement(data_ready, programmed));
        }
        self.statistics.host_write_requests += 1;
        self.statistics.host_write_bytes += length_bytes;
        self.now_ns = self.now_ns.max(completion);
        Ok(completion)
    }

    /// When the host is told a page programmed at `programmed_ns` is written.
    fn cache_acknowledgement(&mut self, ready_ns: u64, programmed_ns: u64) -> u64 {
        self.latest_program_end_ns = self.latest_program_end_ns.max(programmed_ns);
        let capacity = self.model.ftl.write_cache_pages as usize;
        if capacity == 0 {
            return programmed_ns;
        }
        while self.cache_program_ends_ns.peek().is_some_and(|Reverse(end)| *end <= ready_ns) {
            self.cache_program_ends_ns.pop();
        }
        let mut acknowledged = ready_ns;
        if self.cache_program_ends_ns.len() >= capacity {
            if let Some(Reverse(slot_free)) = self.cache_program_ends_ns.pop() {
                acknowledged = acknowledged.max(slot_free);
            }
        }
        self.cache_program_ends_ns.push(Reverse(programmed_ns));
        acknowledged
    }

    /// Host read; returns when the data has crossed the link.
    pub fn read(&mut self, offset_bytes: u64, length_bytes: u64, arrival_ns: u64) -> Result<u64, DeviceError> {
        self.check(offset_bytes, length_bytes)?;
        let ready = self.command(arrival_ns);
        let page_bytes = self.model.geometry.page_size_bytes as u64;
        let mut data_at_controller = ready;
        for logical in offset_bytes / page_bytes..(offset_bytes + length_bytes).div_ceil(page_bytes) {
            let physical = self.logical_to_physical[logical as usize];
            if physical != UNMAPPED {
                data_at_controller = data_at_controller.max(self.read_physical(physical, ready));
            }
        }
        let completion = self.link(data_at_controller, length_bytes);
        self.statistics.host_read_requests += 1;
        self.statistics.host_read_bytes += length_bytes;
        self.now_ns = self.now_ns.max(completion);
        Ok(completion)
    }

    /// TRIM: whole pages in the range hold no data any more (if the drive honours it).
    pub fn trim(&mut self, offset_bytes: u64, length_bytes: u64, arrival_ns: u64) -> Result<u64, DeviceError> {
        self.check(offset_bytes, length_bytes)?;
        let completion = self.command(arrival_ns);
        if self.model.ftl.honours_trim {
            let page_bytes = self.model.geometry.page_size_bytes as u64;
            for logical in offset_bytes.div_ceil(page_bytes)..(offset_bytes + length_bytes) / page_bytes {
                let physical = self.logical_to_physical[logical as usize];
                if physical != UNMAPPED {
                    self.invalidate(physical);
                    self.logical_to_physical[logical as usize] = UNMAPPED;
                }
            }
            self.statistics.trimmed_bytes += length_bytes;
        }
        self.now_ns = self.now_ns.max(completion);
        Ok(completion)
    }

    /// FLUSH: completes when every page accepted so far is programmed.
    pub fn flush(&mut self, arrival_ns: u64) -> u64 {
        let completion = self.command(arrival_ns).max(self.latest_program_end_ns);
        self.now_ns = self.now_ns.max(completion);
        completion
    }

    /// Program a host page on the next unit that can take one.
    fn program_host_page(&mut self, logical: u32, ready_ns: u64, offset_bytes: u64) -> Result<u64, DeviceError> {
        let units = self.units.len();
        for _ in 0..units {
            let unit = self.next_unit;
            self.next_unit = (self.next_unit + 1) % units;
            if let Some(physical) = self.host_page_on(unit, ready_ns) {
                let old = self.logical_to_physical[logical as usize];
                if old != UNMAPPED {
                    self.invalidate(old);
                }
                self.map(logical, physical);
                self.statistics.host_program_pages += 1;
                return Ok(self.program(unit, ready_ns, true));
            }
        }
        Err(DeviceError::Io {
            offset_bytes,
            source: std::io::Error::other("flash model: no unit can reclaim an erase block (more live data than NAND)"),
        })
    }

    /// The time a program of one page on `unit` ends; `transfer` when its data crosses
    /// the channel first (host data), not for a copy-back within the unit.
    fn program(&mut self, unit_index: usize, ready_ns: u64, transfer: bool) -> u64 {
        let transfer_ns = self.page_transfer_ns();
        let program_ns = self.model.timing.program_page_ns;
        let unit = &mut self.units[unit_index];
        let mut data_in_die = ready_ns;
        if transfer {
            // Cache programming: the data crosses the channel into the die's cache
            // register while the previous page is still being programmed.
            let channel = &mut self.channel_busy_until_ns[unit.channel];
            let start = ready_ns.max(*channel);
            *channel = start + transfer_ns;
            data_in_die = start + transfer_ns;
        }
        unit.busy_until_ns = data_in_die.max(unit.busy_until_ns) + program_ns;
        unit.busy_until_ns
    }

    fn map(&mut self, logical: u32, physical: u32) {
        self.logical_to_physical[logical as usize] = physical;
        self.physical_to_logical[physical as usize] = logical;
        let block = physical / self.model.geometry.pages_per_block;
        self.blocks[block as usize].valid_pages += 1;
    }

    /// The page no longer holds live data; a sealed block moves down one bucket.
    fn invalidate(&mut self, physical: u32) {
        self.physical_to_logical[physical as usize] = UNMAPPED;
        let block_index = physical / self.model.geometry.pages_per_block;
        let unit_index = self.unit_of_block(block_index);
        let block = &self.blocks[block_index as usize];
        let (valid, state) = (block.valid_pages, block.state);
        if state == BlockState::Sealed {
            self.bucket_remove(unit_index, block_index, valid);
            self.blocks[block_index as usize].valid_pages = valid - 1;
            self.bucket_insert(unit_index, block_index, valid - 1);
        } else {
            self.blocks[block_index as usize].valid_pages = valid - 1;
        }
    }

    fn bucket_insert(&mut self, unit: usize, block: u32, valid: u32) {
        let bucket = &mut self.units[unit].sealed_by_valid[valid as usize];
        self.blocks[block as usize].bucket_position = bucket.len() as u32;
        bucket.push(block);
    }

    fn bucket_remove(&mut self, unit: usize, block: u32, valid: u32) {
        let position = self.blocks[block as usize].bucket_position as usize;
        let bucket = &mut self.units[unit].sealed_by_valid[valid as usize];
        bucket.swap_remove(position);
        if let Some(&moved) = bucket.get(position) {
            self.blocks[moved as usize].bucket_position = position as u32;
        }
    }

    fn seal(&mut self, unit: usize, block: u32) {
        self.blocks[block as usize].state = BlockState::Sealed;
        let valid = self.blocks[block as usize].valid_pages;
        self.bucket_insert(unit, block, valid);
    }

    /// The least-worn free block of `unit`.
    fn take_free_block(&mut self, unit_index: usize) -> Option<u32> {
        let Reverse((_, block)) = self.units[unit_index].free_blocks.pop()?;
        let entry = &mut self.blocks[block as usize];
        entry.state = BlockState::Active;
        entry.written_pages = 0;
        Some(block)
    }

    /// A physical page for a host write on `unit`, collecting garbage first if the unit
    /// is short of free blocks. `None` when the unit can reclaim nothing.
    fn host_page_on(&mut self, unit: usize, ready_ns: u64) -> Option<u32> {
        let pages_per_block = self.model.geometry.pages_per_block;
        let current =
            self.units[unit].host_block.filter(|&block| self.blocks[block as usize].written_pages < pages_per_block);
        let block = match current {
            Some(block) => block,
            None => {
                if let Some(full) = self.units[unit].host_block.take() {
                    self.seal(unit, full);
                }
                if (self.units[unit].free_blocks.len() as u32) < self.model.ftl.gc_reserve_blocks {
                    self.collect(unit, ready_ns);
                }
                // The last free block is kept for garbage collection's own copies.
                if self.units[unit].free_blocks.len() < 2 {
                    return None;
                }
                let block = self.take_free_block(unit)?;
                self.units[unit].host_block = Some(block);
                block
            }
        };
        let entry = &mut self.blocks[block as usize];
        let physical = block * pages_per_block + entry.written_pages;
        entry.written_pages += 1;
        Some(physical)
    }

    /// Garbage collection on `unit`, started by a write ready at `ready_ns`: greedy
    /// victims until the reserve (plus the burst) is free.
    fn collect(&mut self, unit: usize, ready_ns: u64) {
        let target = (self.model.ftl.gc_reserve_blocks + self.model.ftl.gc_burst_blocks) as usize;
        let busy_before = self.units[unit].busy_until_ns.max(ready_ns);
        self.units[unit].busy_until_ns = busy_before;
        while self.units[unit].free_blocks.len() < target {
            let Some(victim) = self.choose_victim(unit) else { break };
            if !self.relocate_and_erase(unit, victim) {
                break;
            }
        }
        self.statistics.collection_busy_ns += self.units[unit].busy_until_ns - busy_before;
    }

    /// Greedy: the sealed block with the fewest valid pages, unless static wear levelling
    /// asks for the coldest block. `None` when no block would free any space.
    fn choose_victim(&mut self, unit_index: usize) -> Option<u32> {
        if let Some(cold) = self.units[unit_index].wear_victim.take() {
            if self.blocks[cold as usize].state == BlockState::Sealed {
                self.statistics.wear_leveling_moves += 1;
                return Some(cold);
            }
        }
        let pages_per_block = self.model.geometry.pages_per_block as usize;
        let unit = &self.units[unit_index];
        (0..pages_per_block).find_map(|valid| unit.sealed_by_valid[valid].last().copied())
    }

    /// Copy `victim`'s valid pages into the unit's collection block and erase it.
    /// `false` when no free block is left for the copies.
    fn relocate_and_erase(&mut self, unit: usize, victim: u32) -> bool {
        let pages_per_block = self.model.geometry.pages_per_block;
        let copy_ns = self.model.timing.read_page_ns + self.model.timing.program_page_ns;
        let valid = self.blocks[victim as usize].valid_pages;
        self.bucket_remove(unit, victim, valid);
        self.blocks[victim as usize].state = BlockState::Active;
        for page in 0..pages_per_block {
            let physical = victim * pages_per_block + page;
            let logical = self.physical_to_logical[physical as usize];
            if logical == UNMAPPED {
                continue;
            }
            let Some(destination) = self.collection_page(unit) else {
                // Put the victim back as it was: nothing was lost, nothing freed.
                self.blocks[victim as usize].state = BlockState::Sealed;
                let valid = self.blocks[victim as usize].valid_pages;
                self.bucket_insert(unit, victim, valid);
                return false;
            };
            self.invalidate(physical);
            self.map(logical, destination);
            self.units[unit].busy_until_ns += copy_ns;
            self.statistics.relocated_pages += 1;
        }
        self.units[unit].busy_until_ns += self.model.timing.erase_block_ns;
        let block = &mut self.blocks[victim as usize];
        block.state = BlockState::Free;
        block.valid_pages = 0;
        block.written_pages = 0;
        block.erase_count += 1;
        let erases = block.erase_count;
        self.units[unit].free_blocks.push(Reverse((erases, victim)));
        self.statistics.erases += 1;
        self.check_wear(unit);
        true
    }

    fn collection_page(&mut self, unit: usize) -> Option<u32> {
        let pages_per_block = self.model.geometry.pages_per_block;
        let current = self.units[unit]
            .collection_block
            .filter(|&block| self.blocks[block as usize].written_pages < pages_per_block);
        let block = match current {
            Some(block) => block,
            None => {
                if let Some(full) = self.units[unit].collection_block.take() {
                    self.seal(unit, full);
                }
                let block = self.take_free_block(unit)?;
                self.units[unit].collection_block = Some(block);
                block
            }
        };
        let entry = &mut self.blocks[block as usize];
        let physical = block * pages_per_block + entry.written_pages;
        entry.written_pages += 1;
        Some(physical)
    }

    /// Every so many erases, see whether the unit's wear has spread too far; if so, the
    /// coldest sealed block is the next victim (its data is cold: moving it lets its
    /// block take hot writes).
    fn check_wear(&mut self, unit_index: usize) {
        let unit = &mut self.units[unit_index];
        unit.erases_since_wear_check += 1;
        if unit.erases_since_wear_check < WEAR_CHECK_INTERVAL_ERASES {
            return;
        }
        unit.erases_since_wear_check = 0;
        let first = unit_index as u32 * self.blocks_per_unit;
        let range = first..first + self.blocks_per_unit;
        let maximum = range.clone().map(|block| self.blocks[block as usize].erase_count).max().unwrap_or(0);
        let coldest = range
            .filter(|&block| self.blocks[block as usize].state == BlockState::Sealed)
            .min_by_key(|&block| self.blocks[block as usize].erase_count);
        if let Some(cold) = coldest {
            if maximum - self.blocks[cold as usize].erase_count > self.model.ftl.wear_leveling_threshold_erases {
                self.units[unit_index].wear_victim = Some(cold);
            }
        }
    }

    /// Check the FTL's bookkeeping: the forward and reverse maps agree, every block's
    /// valid count matches its pages, every sealed block is in the right bucket. For tests.
    pub fn verify_consistency(&self) -> Result<(), String> {
        let pages_per_block = self.model.geometry.pages_per_block;
        for (logical, &physical) in self.logical_to_physical.iter().enumerate() {
            if physical != UNMAPPED && self.physical_to_logical[physical as usize] != logical as u32 {
                return Err(format!("logical page {logical} maps to {physical}, which does not map back"));
            }
        }
        for (index, block) in self.blocks.iter().enumerate() {
            let first = index as u32 * pages_per_block;
            let live = (first..first + pages_per_block)
                .filter(|&physical| self.physical_to_logical[physical as usize] != UNMAPPED)
                .count() as u32;
            if live != block.valid_pages {
                return Err(format!("block {index} counts {} valid pages but holds {live}", block.valid_pages));
            }
            if block.state == BlockState::Sealed {
                let unit = &self.units[self.unit_of_block(index as u32)];
                let bucket = &unit.sealed_by_valid[live as usize];
                if bucket.get(block.bucket_position as usize) != Some(&(index as u32)) {
                    return Err(format!("sealed block {index} is not in its bucket"));
                }
            }
        }
        Ok(())
    }

    /// Forget the counters (the state of the NAND stays).
    pub fn reset_statistics(&mut self) {
        self.statistics = DriveStatistics::default();
    }
}

/// Nanoseconds to move `bytes` at `bytes_per_second`.
fn transfer_ns(bytes: u64, bytes_per_second: u64) -> u64 {
    (bytes as u128 * 1_000_000_000 / bytes_per_second.max(1) as u128) as u64
}
