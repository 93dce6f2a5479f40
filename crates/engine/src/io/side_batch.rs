//! Side batches: the batches of the cleaner's relocation streams and of the checkpoint's
//! metadata stream, opened in the log order while the clients' open batch is set aside.
//! A [`SideBatch`] holds the write lock from its opening to [`SideBatch::finish`], which
//! seals it, puts the clients' batch back, releases the lock and dispatches what it sealed.

use super::state::StateGuard;
use super::Core;
use crate::error::{Error, Result};
use crate::layout::format::{self, Entry};
use crate::log::batch::{OpenBatch, SealedBatch};
use std::sync::Arc;

/// What a side batch carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SideKind {
    /// The cleaner's relocated records. `one_log`: the cleaner writes into the clients'
    /// stream (the baseline without separate streams), so the clients' batch ends first,
    /// even when empty.
    Relocation { one_log: bool },
    /// Checkpoint blocks (index, directory and segment table pages, roots).
    Metadata,
}

/// A side batch being filled, with the write lock held.
pub(crate) struct SideBatch<'a> {
    core: &'a Core,
    state: StateGuard<'a>,
    /// The clients' open batch (empty), put back by `finish`.
    client: Option<OpenBatch>,
    /// The clients' batches sealed ahead of the side batch (a pair at most): dispatched
    /// first, in order, once the lock is released.
    sealed_clients: Vec<Arc<SealedBatch>>,
    /// Free segments taken for the side batch's stream.
    taken: usize,
    finished: bool,
}

impl Core {
    /// Open a batch of `stream` in the log order. The clients' open batch, when it holds
    /// anything, is sealed first and keeps its sequence; the side batch takes the next one.
    /// Sequences must follow the order in which records are accepted and blocks killed:
    /// - a segment's release waits for the sequence of the batch that killed its last
    ///   block; a relocation in a side batch that took the clients' sequence would let a
    ///   victim go once the side batch is durable, while the clients' batch (moved one up)
    ///   that killed its other blocks is not: a crash then brings their older versions
    ///   back (`tests/threaded_crashes.rs`);
    /// - with an active write log, every write accepted into the batch was staged with the
    ///   batch's sequence, and a flush may have made that record durable: were the side
    ///   batch to take the sequence and become durable, mount would take the record's
    ///   writes for ones on the members and skip them — acknowledged writes lost
    ///   (docs/write-log.md, crash analysis).
    ///
    /// An empty clients' batch gives the side batch its sequence and moves one up, or,
    /// with one log, is dropped. A segment with room for less than a summary and its
    /// largest record is given up. Takes a write buffer set first (waiting for one), then
    /// the write lock; `OutOfSpace` when the stream cannot open a segment.
    pub(crate) fn begin_side_batch(&self, stream: usize, kind: SideKind) -> Result<SideBatch<'_>> {
        let side = self.begin_side_batch_if(kind, || Some(stream))?;
        Ok(side.expect("the stream is given"))
    }

    /// [`Core::begin_side_batch`] in the stream `choose` names, under the write lock, before
    /// anything changes (`None`: no batch is opened). The cleaner chooses there, where it
    /// can tell which of its records are still current.
    pub(crate) fn begin_side_batch_if(
        &self,
        kind: SideKind,
        choose: impl FnOnce() -> Option<usize>,
    ) -> Result<Option<SideBatch<'_>>> {
        let buffers = self.data_pool.take();
        let mut state = self.lock_state_to_write();
        self.members.check_running()?;
        let Some(stream) = choose() else {
            return Ok(None);
        };
        match kind {
            SideKind::Relocation { one_log: false } => {
                assert!(crate::log::RELOCATION_STREAMS.contains(&stream), "relocations go to a relocation stream")
            }
            SideKind::Relocation { one_log: true } => assert_eq!(stream, crate::log::HOST_STREAM, "one log"),
            SideKind::Metadata => assert_eq!(stream, crate::log::METADATA_STREAM, "checkpoint blocks"),
        }
        let sealed_clients = self.seal_clients(&mut state);
        if kind == (SideKind::Relocation { one_log: true }) && state.log.open().is_some_and(OpenBatch::is_empty) {
            state.log.replace_open(None);
            state.log.give_back_sequence();
        }
        let rows_per_chunk = self.geometry.rows_per_chunk();
        let data_columns = self.geometry.data_columns() as u32;
        // Room for a summary and the largest record: a block, or a fragment and the
        // blocks it continues into.
        let indices_needed = if self.geometry.packed_fragments {
            1 + crate::layout::packed::BLOCKS_PER_FRAGMENT_MAXIMUM as u32
        } else {
            2
        };
        if state
            .log
            .current(stream)
            .is_some_and(|current| (rows_per_chunk - current.next_row) * data_columns < indices_needed)
        {
            self.retire_stream_segment(&mut state, stream);
        }
        let free_before = state.space.free_count();
        if state.log.current(stream).is_none() && !self.open_stream_segment(&mut state, stream, u64::MAX) {
            // The clients' sealed batches are in flight: they must reach the members.
            state.unlocked(|| sealed_clients.into_iter().try_for_each(|batch| self.dispatch(batch)))?;
            return Err(Error::OutOfSpace);
        }
        let taken = free_before - state.space.free_count();
        let sequence = self.move_client_batch_up(&mut state);
        let current = state.log.current_mut(stream).expect("opened above");
        if current.open_sequence == u64::MAX {
            current.open_sequence = sequence;
        }
        let mut batch = self.batch_in(current, sequence, buffers, stream);
        match kind {
            SideKind::Relocation { .. } => batch.relocation = true,
            SideKind::Metadata => batch.metadata = true,
        }
        let client = state.log.replace_open(Some(batch));
        assert!(client.as_ref().is_none_or(OpenBatch::is_empty), "the clients' batch is set aside empty");
        Ok(Some(SideBatch { core: self, state, client, sealed_clients, taken, finished: false }))
    }
}

impl SideBatch<'_> {
    /// Free segments its stream took to open a segment.
    pub(crate) fn taken_segments(&self) -> usize {
        self.taken
    }

    /// Indices that sealing now would fill with zero padding to complete the last row.
    pub(crate) fn padding_blocks(&self) -> u32 {
        self.state.log.open().map_or(0, OpenBatch::padding_blocks)
    }

    /// Whether `logical_block`'s index page is in RAM (a relocation needs it: remapping a
    /// block reads its page, and no page is read under the write lock).
    pub(crate) fn page_resident(&self, logical_block: u64) -> bool {
        self.core.map.get_if_resident(logical_block).is_some()
    }

    /// A relocated data block (`false`: the batch is full). `relocated`: its lifetime class
    /// and write clock, kept.
    pub(crate) fn accept_data(&mut self, logical_block: u64, data: &[u8], checksum: u32, relocated: (u8, u64)) -> bool {
        assert!(self.page_resident(logical_block), "block {logical_block}: its index page is in RAM");
        self.core.accept_data(&mut self.state, logical_block, data, checksum, Some(relocated))
    }

    /// A shared copy moved (`false`: the batch is full).
    pub(crate) fn accept_moved_copy(&mut self, record: u64, data: &[u8], checksum: u32, relocated: (u8, u64)) -> bool {
        self.core.accept_moved_copy(&mut self.state, record, data, checksum, relocated)
    }

    /// A shared copy stored as a fragment moved as stored (`false`: the batch is full).
    pub(crate) fn accept_moved_compressed_copy(
        &mut self,
        record: u64,
        fragment: &[u8],
        checksum: u32,
        relocated: (u8, u64),
    ) -> bool {
        self.core.accept_moved_compressed_copy(&mut self.state, record, fragment, checksum, relocated)
    }

    /// A fragment moved as stored (or repacked) for the blocks of `mask` (`false`: full).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accept_fragment(
        &mut self,
        first_logical_block: u64,
        blocks: u8,
        mask: u8,
        fragment: &[u8],
        checksum: u32,
        relocated: (u8, u64),
    ) -> bool {
        assert!(self.state.log.open().is_some_and(|open| open.relocation), "a fragment moves in a relocation batch");
        assert!(
            (0..blocks as u64)
                .filter(|place| mask & (1 << place) != 0)
                .all(|place| self.page_resident(first_logical_block + place)),
            "blocks of {first_logical_block}: their index pages are in RAM"
        );
        self.core.accept_fragment(
            &mut self.state,
            first_logical_block,
            blocks,
            mask,
            fragment,
            checksum,
            Some(relocated),
        )
    }

    /// A zero or trim record moved (`false`: the batch is full).
    pub(crate) fn record_range(&mut self, logical_block: u64, trim: bool) -> bool {
        assert!(self.page_resident(logical_block), "block {logical_block}: its index page is in RAM");
        self.core.record_range(&mut self.state, logical_block, trim)
    }

    /// A checkpoint block; its position, or `None` when the batch is full. The copy counts
    /// as live in its segment from now on: it dies when a later checkpoint that replaces
    /// it is committed.
    pub(crate) fn accept_page(&mut self, kind: format::PageKind, number: u64, block: &[u8]) -> Option<u64> {
        assert!(
            self.state.log.open().is_some_and(|open| open.metadata),
            "a checkpoint block goes into a metadata batch"
        );
        let checksum = format::block_checksum(block);
        let entry = Entry::Page { kind, number, checksum };
        let position = self.core.append_block(&mut self.state, block, checksum, entry)?;
        let per_segment = self.core.geometry.blocks_per_segment();
        let segment = position / per_segment;
        // (Mount counts the committed checkpoint's blocks in metadata segments.)
        assert_eq!(
            self.state.space.usage(segment).stream(),
            crate::log::METADATA_STREAM,
            "segment {segment}: checkpoint blocks lie in metadata segments"
        );
        self.state.space.add_live(segment, self.core.geometry.live_units_per_block());
        Some(position)
    }

    /// Seal the side batch (it must hold an entry), put the clients' batch back, release
    /// the write lock and dispatch the clients' sealed batches, then this one. Returns the
    /// side batch's sequence.
    pub(crate) fn finish(mut self) -> Result<u64> {
        self.finished = true;
        assert!(
            self.state.log.open().is_some_and(|open| open.relocation || open.metadata),
            "the side batch is still in the clients' place when it is finished"
        );
        let sealed = self.core.seal(&mut self.state);
        let client = self.client.take();
        let sequence = sealed.header.sequence;
        assert!(
            client.as_ref().is_none_or(|client| client.sequence > sequence),
            "the clients' batch follows the side batch in the log"
        );
        self.state.log.replace_open(client);
        let core = self.core;
        let sealed_clients = std::mem::take(&mut self.sealed_clients);
        drop(self);
        for batch in sealed_clients {
            core.dispatch(batch)?;
        }
        core.dispatch(sealed)?;
        Ok(sequence)
    }
}

impl Drop for SideBatch<'_> {
    fn drop(&mut self) {
        // A side batch swapped in for the clients' must be sealed and the clients' put
        // back: otherwise the log is left half changed. (Unwinding, the write lock's guard
        // stops the volume.)
        assert!(self.finished || std::thread::panicking(), "a side batch was dropped without being finished");
    }
}
