//! The read path: a logical block's mapping resolved (a shared block to its copy), its
//! block found in memory (the open and in-flight batches, the written batches kept for
//! reads, the block cache) or read from the members, verified against its position's
//! checksum and rebuilt from its stripe row when it fails. Callers hold the reuse fence,
//! and never the write lock (`write_lock::assert_not_held` at every member read).

use super::state::WriteState;
use super::Core;
use crate::array::members::ReadPurpose;
use crate::error::{Error, ReadFailure, Result};
use crate::index::map::Mapping;
use crate::layout::format;
use crate::layout::geometry::BLOCK_SIZE_BYTES;
use crate::stats::Counters;
use stripelog_blockdev::AlignedBuffer;

/// A reader that finds a shared-block record freed reads the map again this many times
/// (a writer replaced the block meanwhile) before it reports the record as holding nothing.
const SHARED_RESOLVE_ATTEMPTS: usize = 4;

/// Where a block read was served from.
pub(crate) enum Lookup {
    Served,
    /// Not in memory: it must be read from the members at this data-space position.
    OnMembers,
}

/// What a block read outside the write lock was: its mapping, and the position and segment
/// generation its content was read at. While all three are the same, so is the content
/// (a position's content never changes while its segment's generation stands).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadVersion {
    pub(crate) mapping: Mapping,
    pub(crate) position: Option<u64>,
    pub(crate) generation: u32,
}

/// A fragment as read from the members: its start block, its table, its index there, and
/// the blocks it continues into, every one proven by its position's checksum.
pub(crate) struct StoredFragment {
    pub start: AlignedBuffer,
    pub entries: Vec<crate::layout::packed::FragmentEntry>,
    pub index: usize,
    pub following: Vec<AlignedBuffer>,
}

impl StoredFragment {
    /// `logical_block` (one the fragment serves) decompressed into `out`, proven.
    pub fn extract(
        &self,
        logical_block: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), crate::layout::packed::PackedProblem> {
        crate::layout::packed::extract(&self.start, &self.entries, self.index, &self.following, logical_block, out)
    }
}

impl Core {
    /// Read logical block `logical_block` into `out` (4096 bytes). Callers hold the reuse
    /// fence.
    pub(crate) fn read_block(&self, logical_block: u64, out: &mut [u8]) -> Result<()> {
        self.read_block_versioned(logical_block, out).map(|_| ())
    }

    /// [`Core::read_block`], saying what it read: the version a write merged with it must
    /// still find under the write lock (`Core::version_is_current`).
    pub(crate) fn read_block_versioned(&self, logical_block: u64, out: &mut [u8]) -> Result<ReadVersion> {
        let (mapping, resolved) = self.resolved(logical_block)?;
        let position = resolved.position();
        // Taken before the content: a segment reused while it is read has a new one.
        let generation = position.map_or(0, |position| self.generation(position / self.geometry.blocks_per_segment()));
        match resolved {
            Mapping::Data { position } => self.read_position(position, logical_block, out)?,
            Mapping::Fragment { position, .. } => {
                // (A shared copy's fragment is keyed by its record.)
                let key = Self::fragment_key_of(logical_block, mapping);
                let stored = self.read_fragment(position, key)?;
                stored.extract(key, out).map_err(|problem| self.bad_fragment(logical_block, problem))?
            }
            Mapping::Unmapped | Mapping::Zero { .. } | Mapping::Trimmed { .. } => out.fill(0),
            Mapping::Shared { .. } => unreachable!("resolved to its copy"),
        }
        Ok(ReadVersion { mapping, position, generation })
    }

    /// What the fragment serving `logical_block` (mapped to `mapping`) is keyed by in its
    /// packed block: the logical block, or a shared copy's record.
    pub(crate) fn fragment_key_of(logical_block: u64, mapping: Mapping) -> u64 {
        match mapping {
            Mapping::Shared { record } => crate::space::shared::fragment_key(record),
            _ => logical_block,
        }
    }

    /// `logical_block`'s mapping, and the same with a shared block's as its copy's content
    /// (a whole block, or a fragment keyed by the record). Callers hold the reuse fence: a
    /// record freed after the map was read is not reused meanwhile, so the map is read
    /// again; a record the map still names that holds no copy is an error.
    pub(crate) fn resolved(&self, logical_block: u64) -> Result<(Mapping, Mapping)> {
        let mut mapping = self.map.get(logical_block)?;
        for _ in 0..SHARED_RESOLVE_ATTEMPTS {
            let Mapping::Shared { record } = mapping else {
                return Ok((mapping, mapping));
            };
            if let Some(current) = self.shared.read().get(record) {
                return Ok((mapping, current.content()));
            }
            let again = self.map.get(logical_block)?;
            if again == mapping {
                break;
            }
            mapping = again;
        }
        Counters::add(&self.counters.unrecoverable_reads, 1);
        let Mapping::Shared { record } = mapping else {
            unreachable!("only a shared mapping is read again");
        };
        Err(Error::Unrecoverable { logical_block, reason: ReadFailure::FreeSharedRecord(record) })
    }

    /// Where `mapping`'s content is: its block or packed block, or its shared record's
    /// copy (`None`: no content, or a record that holds no copy).
    pub(crate) fn content_position(&self, mapping: Mapping) -> Option<u64> {
        match mapping {
            Mapping::Data { position } | Mapping::Fragment { position, .. } => Some(position),
            Mapping::Shared { record } => self.shared.read().get(record).map(|copy| copy.position),
            Mapping::Unmapped | Mapping::Zero { .. } | Mapping::Trimmed { .. } => None,
        }
    }

    pub(super) fn bad_fragment(&self, logical_block: u64, problem: crate::layout::packed::PackedProblem) -> Error {
        Counters::add(&self.counters.unrecoverable_reads, 1);
        Error::Unrecoverable { logical_block, reason: ReadFailure::BadFragment(problem) }
    }

    /// Read the fragment serving `logical_block` whose start block is at `position`: that
    /// block and the blocks it continues into, each proven by its position's checksum
    /// (from memory when there). Callers hold the reuse fence.
    pub(crate) fn read_fragment(&self, position: u64, logical_block: u64) -> Result<StoredFragment> {
        let mut start = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        self.read_position(position, logical_block, &mut start)?;
        let (entries, index) = crate::layout::packed::find(&start, logical_block)
            .map_err(|problem| self.bad_fragment(logical_block, problem))?;
        let following = self.read_continuations(position, &entries, index, logical_block)?;
        Ok(StoredFragment { start, entries, index, following })
    }

    /// Read the blocks after `position` that fragment `index` of the packed block there
    /// (its table `entries`) continues into, each proven by its position's checksum.
    pub(crate) fn read_continuations(
        &self,
        position: u64,
        entries: &[crate::layout::packed::FragmentEntry],
        index: usize,
        logical_block: u64,
    ) -> Result<Vec<AlignedBuffer>> {
        (1..=crate::layout::packed::following_blocks(entries, index) as u64)
            .map(|after| {
                let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
                self.read_position(position + after, logical_block, &mut block)?;
                Ok(block)
            })
            .collect()
    }

    /// Read the block at data-space `position` (which holds `logical_block`) into `out`:
    /// from memory when it is there, else from the members, verified. Callers hold the
    /// reuse fence.
    pub(crate) fn read_position(&self, position: u64, logical_block: u64, out: &mut [u8]) -> Result<()> {
        // (A weak check: some reader holds it. The segment cannot be reused meanwhile.)
        assert!(self.reuse_fence.is_locked(), "position {position}: a block is read under the reuse fence");
        if let Lookup::Served = self.position_from_memory(position, out, None) {
            return Ok(());
        }
        let location = self.geometry.locate(position);
        let generation = self.generation(location.segment);
        let unrecoverable = |reason| {
            Counters::add(&self.counters.unrecoverable_reads, 1);
            Error::Unrecoverable { logical_block, reason }
        };
        let table = self.checksum_table(location.segment).map_err(unrecoverable)?;
        let per_segment = self.geometry.blocks_per_segment();
        let expected = table.get(position % per_segment);
        let checksum_of = |column: usize| {
            let other = self.geometry.position(location.segment, location.row, column);
            Some(table.get(other % per_segment))
        };
        self.read_verified(location, &|block| format::checksum_proves(block, expected), &checksum_of, out)
            .map_err(unrecoverable)?;
        if let Some(cache) = &self.cache {
            cache.insert(position, generation, out);
        }
        Ok(())
    }

    /// The block at `position` when it is in memory: an open or in-flight batch (under the
    /// write lock, which `held` is when the caller holds it), a written batch kept for
    /// reads, the block cache. What it gives must still prove itself where it matters.
    pub(crate) fn position_from_memory(&self, position: u64, out: &mut [u8], held: Option<&WriteState>) -> Lookup {
        let location = self.geometry.locate(position);
        if location.row >= self.rows_on_media(location.segment) {
            let found = match held {
                Some(state) => state.log.copy_from_memory(location, out),
                None => self.lock_state().log.copy_from_memory(location, out),
            };
            if found {
                return Lookup::Served;
            }
        }
        let generation = self.generation(location.segment);
        if self.data_pool.read_retained(location.segment, location.row, location.column, generation, out) {
            Counters::add(&self.counters.reads_from_recent_writes, 1);
            return Lookup::Served;
        }
        if let Some(cache) = &self.cache {
            if cache.get(position, generation, out) {
                Counters::add(&self.counters.reads_from_block_cache, 1);
                return Lookup::Served;
            }
        }
        Lookup::OnMembers
    }

    pub(crate) fn read_verified(
        &self,
        location: crate::layout::geometry::BlockLocation,
        valid: &dyn Fn(&[u8]) -> bool,
        checksum_of: &dyn Fn(usize) -> Option<u32>,
        out: &mut [u8],
    ) -> std::result::Result<(), ReadFailure> {
        self.members
            .read_verified(&self.geometry, &self.counters, location, valid, checksum_of, ReadPurpose::Client, out)
            .map(|_| ())
    }
}
