//! Client reads many at a time from one thread (docs/resilience.md, "Reads in flight"):
//! each read's blocks that need a member go to the kernel through a `ReadRing` and the
//! read completes when its last block does, so one thread keeps a queue depth of reads in
//! flight without a thread blocked per read.
//!
//! Only the common case takes the ring: a whole data block on the first copy of its
//! column, on a member that is readable and not lagging. Everything else — blocks in
//! memory, zeros, compressed fragments, a lagging member (hedged), a missing one (rebuilt
//! from its row) — goes through the single-read path (`Core::read_block`) when the read is
//! submitted, as `Volume::read` would.
//!
//! Segment reuse: a plain read holds the reuse fence through its member reads. A queued
//! read holds it only while it looks its blocks up. Each block notes its segment's
//! generation then, and its data is taken only if that generation is unchanged once the
//! kernel has read it. A segment's generation is bumped under the fence before the segment
//! is written again, so an unchanged generation after the read means the block still held
//! what the lookup found. A block that fails that check, its checksum, or its read is read
//! again through the single-read path, which rebuilds it if it must and counts what went
//! wrong.

use super::{block_pieces, Core, Lookup};
use crate::error::{Error, Result};
use crate::index::map::Mapping;
use crate::layout::format;
use crate::layout::geometry::BLOCK_SIZE_BYTES;
use crate::stats::Counters;
use std::ops::Range;
use std::sync::Arc;
use stripelog_blockdev::{AlignedBuffer, FinishedRead, ReadRing};

/// Member reads in flight per queued client read, on average, that the ring makes room
/// for; a read whose blocks find the ring full reads the rest through the single-read path.
pub const RING_ENTRIES_PER_READ: usize = 4;
/// The ring holds at least this many member reads: four 1 MiB reads in flight whatever
/// the depth (each entry holds a 4 KiB buffer while in flight: 4 MiB).
pub const RING_ENTRIES_MINIMUM: usize = 1024;

/// A finished client read: the caller's tag and buffer, and whether the buffer holds the
/// data.
pub struct CompletedRead {
    pub tag: u64,
    pub buffer: Vec<u8>,
    pub result: Result<()>,
}

/// One block of a queued read that the ring reads.
struct RingBlock {
    logical_block: u64,
    /// Where in the block the read's bytes start, and where they go in the read's buffer.
    within: usize,
    range: Range<usize>,
    position: u64,
    segment: u64,
    /// The segment's generation when the block was looked up.
    generation: u32,
    expected_checksum: u32,
    member: usize,
}

struct QueuedRead {
    tag: u64,
    buffer: Vec<u8>,
    length_bytes: usize,
    blocks: Vec<RingBlock>,
    /// Blocks still with the ring.
    pending: usize,
    error: Option<Error>,
}

/// Reads submitted from one thread and completed as their member reads finish. Drop it
/// before the volume is closed (it keeps the members' devices open while it lives).
pub struct ReadQueue {
    core: Arc<Core>,
    ring: ReadRing,
    reads: Vec<Option<QueuedRead>>,
    free: Vec<usize>,
    /// Reads finished when they were submitted (nothing for the ring to do).
    completed: Vec<CompletedRead>,
    finished: Vec<FinishedRead>,
    /// Block buffers back from the ring, for the next reads: no allocation per block.
    spare: Vec<AlignedBuffer>,
}

impl ReadQueue {
    pub(crate) fn new(core: Arc<Core>, depth: usize) -> ReadQueue {
        ReadQueue {
            core,
            ring: ReadRing::new((depth.max(1) * RING_ENTRIES_PER_READ).max(RING_ENTRIES_MINIMUM)),
            reads: Vec::new(),
            free: Vec::new(),
            completed: Vec::new(),
            finished: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Let `complete` also return (perhaps with nothing) once `descriptor`, a non-blocking
    /// eventfd, becomes readable: a thread that serves reads handed to it by another waits
    /// for both at once. The caller keeps the descriptor open while the queue lives.
    pub fn wake_on(&mut self, descriptor: std::os::unix::io::RawFd) {
        self.ring.wake_on(descriptor);
    }

    /// Reads submitted and not yet returned by `complete`.
    pub fn in_flight(&self) -> usize {
        self.reads.len() - self.free.len() + self.completed.len()
    }

    /// Start reading `length_bytes` at `offset_bytes` (both multiples of 512) into the
    /// start of `buffer`; `complete` gives the buffer back with `tag`.
    pub fn submit(&mut self, tag: u64, offset_bytes: u64, length_bytes: usize, mut buffer: Vec<u8>) {
        let core = self.core.clone();
        let checked = if length_bytes > buffer.len() {
            Err(Error::InvalidRequest(format!("a read of {length_bytes} bytes into a buffer of {}", buffer.len())))
        } else {
            core.check_open().and_then(|()| core.check_range(offset_bytes, length_bytes as u64))
        };
        if let Err(error) = checked {
            self.completed.push(CompletedRead { tag, buffer, result: Err(error) });
            return;
        }
        let index = self.free.pop().unwrap_or_else(|| {
            self.reads.push(None);
            self.reads.len() - 1
        });
        let mut blocks = Vec::new();
        let mut error = None;
        let mut scratch = self.block_buffer();
        {
            let _fence = core.reuse_fence.read();
            for (logical_block, within, range) in block_pieces(offset_bytes, length_bytes) {
                if error.is_some() {
                    break;
                }
                match self.plan_block(&core, logical_block, &mut scratch) {
                    Ok(Plan::Served) => buffer[range.clone()].copy_from_slice(&scratch[within..within + range.len()]),
                    Ok(Plan::Ring {
                        position,
                        segment,
                        generation,
                        expected_checksum,
                        member,
                        device,
                        offset_bytes,
                    }) => {
                        let block_tag = ring_tag(index, blocks.len());
                        match self.ring.push(block_tag, device, offset_bytes, scratch) {
                            Ok(()) => {
                                scratch = self.block_buffer();
                                blocks.push(RingBlock {
                                    logical_block,
                                    within,
                                    range,
                                    position,
                                    segment,
                                    generation,
                                    expected_checksum,
                                    member,
                                });
                            }
                            Err(returned) => {
                                // The ring is full: this block takes the single-read path.
                                scratch = returned;
                                match core.read_block(logical_block, &mut scratch, None) {
                                    Ok(()) => {
                                        buffer[range.clone()].copy_from_slice(&scratch[within..within + range.len()])
                                    }
                                    Err(failure) => error = Some(failure),
                                }
                            }
                        }
                    }
                    Err(failure) => error = Some(failure),
                }
            }
        }
        self.spare.push(scratch);
        // To the kernel at once, rather than with the next wait: reads reach the device
        // as they come, not in bursts (which a device serves more slowly, measured).
        self.ring.submit();
        let pending = blocks.len();
        self.reads[index] = Some(QueuedRead { tag, buffer, length_bytes, blocks, pending, error });
        if pending == 0 {
            self.finish(index);
        }
    }

    fn block_buffer(&mut self) -> AlignedBuffer {
        self.spare.pop().unwrap_or_else(|| AlignedBuffer::zeroed(BLOCK_SIZE_BYTES))
    }

    /// How one block is served: from memory or the single-read path now (`Served`, into
    /// `scratch`), or by the ring. The caller holds the reuse fence.
    fn plan_block(&self, core: &Core, logical_block: u64, scratch: &mut AlignedBuffer) -> Result<Plan> {
        let position = match core.resolved(logical_block)? {
            Mapping::Data { position } => position,
            _ => {
                core.read_block(logical_block, scratch, None)?;
                return Ok(Plan::Served);
            }
        };
        if let Lookup::Served = core.position_from_memory(position, scratch, None) {
            return Ok(Plan::Served);
        }
        let location = core.geometry.locate(position);
        let table = core.checksum_table(location.segment, None).ok();
        let device = core.members.direct_read_device(&core.geometry, location);
        let (Some(table), Some((member, device))) = (table, device) else {
            core.read_block(logical_block, scratch, None)?;
            return Ok(Plan::Served);
        };
        Ok(Plan::Ring {
            position,
            segment: location.segment,
            generation: core.generation(location.segment),
            expected_checksum: table.get(position % core.geometry.blocks_per_segment()),
            member,
            device,
            offset_bytes: core.geometry.member_offset_bytes(location.segment, location.row),
        })
    }

    /// The reads finished since the last call, waiting for at least one when `wait` and
    /// any is in flight.
    pub fn complete(&mut self, wait: bool) -> Vec<CompletedRead> {
        let mut finished = std::mem::take(&mut self.finished);
        let wait = wait && self.completed.is_empty();
        self.ring.reap(wait, &mut finished);
        let core = self.core.clone();
        let mut scratch = self.block_buffer();
        for read in finished.drain(..) {
            let (index, block_index) = from_ring_tag(read.tag);
            let Some(queued) = self.reads.get_mut(index).and_then(Option::as_mut) else { continue };
            let Some(block) = queued.blocks.get(block_index) else { continue };
            // Unchanged generation first: then the checksum proves the data is the block's.
            let intact = read.result.is_ok()
                && core.generation(block.segment) == block.generation
                && format::checksum_proves(&read.buffer, block.expected_checksum);
            if intact {
                core.members.read_done(block.member, None, &core.counters);
                Counters::add(&core.counters.queued_member_reads, 1);
                if let Some(cache) = &core.cache {
                    cache.insert(block.position, block.generation, &read.buffer);
                }
                queued.buffer[block.range.clone()]
                    .copy_from_slice(&read.buffer[block.within..block.within + block.range.len()]);
            } else if queued.error.is_none() {
                let _fence = core.reuse_fence.read();
                match core.read_block(block.logical_block, &mut scratch, None) {
                    Ok(()) => queued.buffer[block.range.clone()]
                        .copy_from_slice(&scratch[block.within..block.within + block.range.len()]),
                    Err(error) => queued.error = Some(error),
                }
            }
            queued.pending -= 1;
            if queued.pending == 0 {
                self.finish(index);
            }
            self.spare.push(read.buffer);
        }
        self.spare.push(scratch);
        self.finished = finished;
        if !self.completed.is_empty() {
            core.evict_map_pages_if_needed();
        }
        std::mem::take(&mut self.completed)
    }

    fn finish(&mut self, index: usize) {
        let Some(read) = self.reads[index].take() else { return };
        self.free.push(index);
        let result = match read.error {
            Some(error) => Err(error),
            None => {
                Counters::add(&self.core.counters.host_bytes_read, read.length_bytes as u64);
                Ok(())
            }
        };
        self.completed.push(CompletedRead { tag: read.tag, buffer: read.buffer, result });
    }
}

enum Plan {
    Served,
    Ring {
        position: u64,
        segment: u64,
        generation: u32,
        expected_checksum: u32,
        member: usize,
        device: Arc<dyn stripelog_blockdev::BlockDevice>,
        /// Where the block is on the member.
        offset_bytes: u64,
    },
}

/// A ring entry's tag: the queued read and its block.
fn ring_tag(read: usize, block: usize) -> u64 {
    ((read as u64) << 32) | block as u64
}

fn from_ring_tag(tag: u64) -> (usize, usize) {
    ((tag >> 32) as usize, (tag & u32::MAX as u64) as usize)
}
