//! The cleaner: makes free segments by relocating the live blocks of partly dead ones.
//!
//! A round (docs/garbage-collection.md):
//! 1. choose victims among the used segments by the policy, as many as one segment can
//!    absorb;
//! 2. find their live records with one pass over the map (data blocks, and the zero and
//!    trim records that must outlive the older copies they cancel);
//! 3. read every live block by position, verified against its checksum, under the reuse
//!    fence;
//! 4. under the state lock, append the records still current to relocation batches in the
//!    relocation stream's segment (the clients' open batch is set aside meanwhile and
//!    renumbered after them, so that the log order stays the acceptance order), and write
//!    them through the normal pipeline;
//! 5. make them durable (without sealing the clients' open batch) and release the victims
//!    the normal way: a segment is reused only once the batches that killed its blocks
//!    are durable, so the old copy stays valid until the new one is.

use crate::error::{Error, Result};
use crate::format;
use crate::geometry::BLOCK_SIZE_BYTES;
use crate::map::Mapping;
use crate::stats::Counters;
use crate::volume::{SegmentStatus, Shared, RELOCATION_STREAM};

/// Free segments only the cleaner may take: it always has room to relocate into.
pub const CLEANING_RESERVE_SEGMENTS: usize = 2;

/// How victims are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CleaningPolicy {
    /// The segments with the fewest live blocks.
    Greedy,
    /// Rosenblum and Ousterhout's LFS: the largest `(1 − u) × age / (1 + u)`.
    #[default]
    CostBenefit,
}

impl CleaningPolicy {
    pub const ALL: [CleaningPolicy; 2] = [CleaningPolicy::Greedy, CleaningPolicy::CostBenefit];

    pub fn name(self) -> &'static str {
        match self {
            CleaningPolicy::Greedy => "greedy",
            CleaningPolicy::CostBenefit => "cost-benefit",
        }
    }
}

impl std::str::FromStr for CleaningPolicy {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        CleaningPolicy::ALL
            .into_iter()
            .find(|policy| policy.name() == text)
            .ok_or_else(|| format!("unknown cleaning policy {text:?} (one of: greedy, cost-benefit)"))
    }
}

impl std::fmt::Display for CleaningPolicy {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// (low, high) free-segment watermarks: below low, client writes clean one round per new
/// segment they open; below high, the idle volume cleans in the background.
pub fn watermarks(segment_count: u64) -> (usize, usize) {
    let segments = segment_count as usize;
    (CLEANING_RESERVE_SEGMENTS + (segments / 256).max(2), CLEANING_RESERVE_SEGMENTS + (segments / 64).max(4))
}

/// One live record of a victim, and its content when it is a data block.
struct Live {
    logical_block: u64,
    mapping: Mapping,
    /// Generation of the block's segment when it was read (detects reuse in between).
    generation: u32,
}

impl Shared {
    /// Run one cleaning round. `Ok(false)`: nothing could be gained (no used segment has
    /// dead space).
    pub(crate) fn clean_round(&self) -> Result<bool> {
        let _cleaner = self.cleaner.lock();
        let per_segment = self.geometry.blocks_per_segment();
        // Room for data in one relocation segment (a summary block per few hundred entries).
        let capacity = per_segment - per_segment.div_ceil(format::ENTRIES_PER_SUMMARY as u64) - 1;
        let (victims, age) = {
            let state = self.state.lock();
            let now = state.next_sequence;
            let mut candidates: Vec<(f64, u64)> = state
                .segments
                .iter()
                .enumerate()
                .filter(|(_, usage)| usage.status == SegmentStatus::Used && usage.live_blocks < capacity)
                .map(|(segment, usage)| {
                    let utilisation = usage.live_blocks as f64 / per_segment as f64;
                    let score = match self.cleaning_policy {
                        CleaningPolicy::Greedy => -utilisation,
                        CleaningPolicy::CostBenefit => {
                            let age = now.saturating_sub(usage.age_sequence) as f64 + 1.0;
                            (1.0 - utilisation) * age / (1.0 + utilisation)
                        }
                    };
                    (score, segment as u64)
                })
                .collect();
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut victims = Vec::new();
            let (mut live, mut age) = (0u64, 0u64);
            for (_, segment) in candidates {
                let usage = &state.segments[segment as usize];
                if !victims.is_empty() && live + usage.live_blocks > capacity {
                    break;
                }
                live += usage.live_blocks;
                age = age.max(usage.age_sequence);
                victims.push(segment);
            }
            (victims, age)
        };
        if victims.is_empty() {
            return Ok(false);
        }
        let mut is_victim = vec![false; self.geometry.segment_count() as usize];
        for &segment in &victims {
            is_victim[segment as usize] = true;
        }
        // Live records of the victims, data blocks in position order (sequential reads).
        let mut live: Vec<Live> = self
            .map
            .iter()
            .enumerate()
            .filter(|(_, mapping)| mapping.segment(per_segment).is_some_and(|segment| is_victim[segment as usize]))
            .map(|(logical_block, mapping)| Live { logical_block: logical_block as u64, mapping, generation: 0 })
            .collect();
        live.sort_by_key(|record| match record.mapping {
            Mapping::Data { position } => position,
            _ => u64::MAX,
        });
        let mut contents = vec![0u8; live.len() * BLOCK_SIZE_BYTES];
        {
            let _fence = self.reuse_fence.read();
            for (record, content) in live.iter_mut().zip(contents.chunks_exact_mut(BLOCK_SIZE_BYTES)) {
                if let Mapping::Data { position } = record.mapping {
                    if self.map.get(record.logical_block) != record.mapping {
                        continue; // overwritten meanwhile: skipped when appending
                    }
                    record.generation = self.generation(self.geometry.locate(position).segment);
                    self.read_position(position, record.logical_block, content, None)?;
                }
            }
        }
        let mut next = 0usize;
        while next < live.len() {
            let buffers = self.data_pool.take();
            let mut guard = self.state.lock();
            let state: &mut crate::volume::WriteState = &mut guard;
            if let Some(reason) = self.failure.lock().clone() {
                return Err(Error::Failed(reason));
            }
            // Skip what the clients overwrote since it was read.
            let still_current = |record: &Live| {
                self.map.get(record.logical_block) == record.mapping
                    && match record.mapping {
                        Mapping::Data { position } => {
                            self.generation(self.geometry.locate(position).segment) == record.generation
                        }
                        _ => true,
                    }
            };
            while next < live.len() && !still_current(&live[next]) {
                next += 1;
            }
            if next == live.len() {
                break;
            }
            // A segment with room for less than one record (a summary and a block) is given up.
            let rows_per_chunk = self.geometry.rows_per_chunk();
            let data_columns = self.geometry.data_columns() as u32;
            if state.current_segments[RELOCATION_STREAM]
                .as_ref()
                .is_some_and(|current| (rows_per_chunk - current.next_row) * data_columns < 2)
            {
                self.retire_stream_segment(state, RELOCATION_STREAM);
            }
            if state.current_segments[RELOCATION_STREAM].is_none() {
                let Some(segment) = state.free_segments.pop_front() else {
                    return Err(Error::OutOfSpace);
                };
                state.segments[segment as usize].status = SegmentStatus::Current;
                state.current_segments[RELOCATION_STREAM] =
                    Some(crate::volume::CurrentSegment { segment, next_row: 0, open_sequence: u64::MAX });
            }
            // The relocation batch takes the clients' open batch's place in the log order;
            // the clients' batch (which holds nothing written after these records were
            // chosen that they depend on) moves one sequence number up.
            let moved = state.next_sequence;
            let sequence = match state.open.as_mut() {
                Some(client) => {
                    let taken = client.sequence;
                    client.sequence = moved;
                    if client.segment_open_sequence == taken {
                        client.segment_open_sequence = moved;
                    }
                    if let Some(current) = state.current_segments[crate::volume::HOST_STREAM].as_mut() {
                        if current.open_sequence == taken {
                            current.open_sequence = moved;
                        }
                    }
                    for usage in state.segments.iter_mut() {
                        if usage.status == SegmentStatus::WaitingForFlush(taken) {
                            usage.status = SegmentStatus::WaitingForFlush(moved);
                        }
                    }
                    taken
                }
                None => state.next_sequence,
            };
            state.next_sequence += 1;
            let current = state.current_segments[RELOCATION_STREAM].as_mut().expect("set above");
            if current.open_sequence == u64::MAX {
                current.open_sequence = sequence;
            }
            let mut batch = self.batch_in(current, sequence, buffers);
            batch.relocation = true;
            batch.age_sequence = age;
            let client = state.open.replace(batch);
            let mut relocated = 0u64;
            while next < live.len() {
                let record = &live[next];
                if !still_current(record) {
                    next += 1;
                    continue;
                }
                let accepted = match record.mapping {
                    Mapping::Data { .. } => {
                        let content = &contents[next * BLOCK_SIZE_BYTES..(next + 1) * BLOCK_SIZE_BYTES];
                        let checksum = format::block_checksum(content);
                        self.accept_data(state, record.logical_block, content, checksum)
                    }
                    Mapping::Zero { .. } => self.record_range(state, record.logical_block, false),
                    Mapping::Trimmed { .. } => self.record_range(state, record.logical_block, true),
                    Mapping::Unmapped => true,
                };
                if !accepted {
                    break;
                }
                if matches!(record.mapping, Mapping::Data { .. }) {
                    relocated += 1;
                }
                next += 1;
            }
            // Never empty: the segment had room for a record and the first one was current.
            let sealed = self.seal(state);
            state.open = client;
            drop(guard);
            Counters::add(&self.counters.blocks_relocated, relocated);
            self.dispatch(sealed)?;
        }
        Counters::add(&self.counters.cleaning_rounds, 1);
        Counters::add(&self.counters.segments_cleaned, victims.len() as u64);
        self.make_sealed_durable()?;
        Ok(true)
    }
}
