//! From an open batch to durable: seal it (under the write lock), dispatch it to the
//! members (outside it), account it written, make it durable by group commit — on the
//! write log when the volume has one, else on the members — and release the segments
//! whose death became durable.

use super::state::WriteState;
use super::Core;
use crate::error::{Error, Result, Shutdown};
use crate::layout::format::{self, BatchContent};
use crate::layout::geometry::{Geometry, BLOCK_SIZE_BYTES};
use crate::log::batch::{BufferPool, OpenBatch, PooledBuffers, SealedBatch};
use crate::log::{IoMode, HOST_STREAM};
use crate::stats::Counters;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use stripelog_blockdev::AlignedBuffer;

impl Core {
    /// Seal the clients' batch and the cold batch: the clients' one alone, or, when the
    /// cold one holds entries too, both as a pair (docs/crash-consistency.md, "Client
    /// writes in two streams"), under this one hold of the write lock. The sealed batches,
    /// in sequence order, to be dispatched in that order.
    pub(crate) fn seal_clients(&self, state: &mut WriteState) -> Vec<Arc<SealedBatch>> {
        let mut sealed = Vec::with_capacity(2);
        let cold = state.log.replace_cold(None).filter(|cold| !cold.is_empty());
        let clients_hold_entries = state.log.open().is_some_and(|open| !open.is_empty());
        let Some(mut cold) = cold else {
            if clients_hold_entries {
                sealed.push(self.seal(state));
            }
            return sealed;
        };
        // The cold batch opens beside entries, which stay: its pair's first batch.
        assert!(clients_hold_entries, "a cold batch with entries beside an empty clients' batch");
        state.log.open_batch().paired_with_next = true;
        sealed.push(self.seal(state));
        Counters::add(&self.counters.client_batch_pairs, 1);
        let cold_sequence = state.log.take_sequence();
        cold.sequence = cold_sequence;
        let current = state.log.current_mut(cold.stream).expect("the cold batch's segment");
        if current.open_sequence == u64::MAX {
            current.open_sequence = cold_sequence;
        }
        cold.segment_open_sequence = current.open_sequence;
        let clients = state.log.replace_open(Some(cold));
        sealed.push(self.seal(state));
        state.log.replace_open(clients);
        assert_eq!(sealed[1].header.sequence, sealed[0].header.sequence + 1, "a pair's batches are consecutive");
        sealed
    }

    /// The next sequence number, given out now: the clients' (empty) open batch's, which
    /// moves up to the one after it, or, without one, the next.
    pub(super) fn move_client_batch_up(&self, state: &mut WriteState) -> u64 {
        let moved = state.log.take_sequence();
        let Some(client) = state.log.open_mut() else {
            return moved;
        };
        assert!(client.is_empty(), "only an empty clients' batch moves up");
        let taken = client.sequence;
        assert!(taken < moved, "the clients' batch moves up");
        client.sequence = moved;
        if client.segment_open_sequence == taken {
            client.segment_open_sequence = moved;
        }
        if let Some(current) = state.log.current_mut(HOST_STREAM) {
            if current.open_sequence == taken {
                current.open_sequence = moved;
            }
        }
        state.space.renumber_waiting(taken, moved);
        taken
    }

    /// Seal the open batch (it must hold entries) and queue it for writing.
    pub(super) fn seal(&self, state: &mut WriteState) -> Arc<SealedBatch> {
        let open: OpenBatch = state.log.replace_open(None).expect("an open batch");
        assert!(!open.is_empty(), "batch {}: an empty batch is never sealed", open.sequence);
        assert!(!state.paused, "batch {}: nothing is sealed while writers are paused", open.sequence);
        let stream = open.stream;
        let write_clock = if open.relocation {
            open.oldest_clock.min(state.lifetimes.write_clock)
        } else {
            state.lifetimes.write_clock
        };
        let (sealed, metadata) = open.seal(
            self.volume_uuid,
            self.epoch,
            state.log.durable_through(),
            state.log.last_sealed_segment(),
            write_clock,
            state.log.reserved(stream).unwrap_or(format::NO_SEGMENT),
        );
        let header = sealed.header;
        let table = match &state.current_checksums[stream] {
            Some((current, table)) if *current == header.segment => table.clone(),
            _ => self.current_table(header.segment),
        };
        for (index, checksum) in metadata {
            let data_columns = self.geometry.data_columns() as u32;
            let position = self.geometry.position(
                header.segment,
                header.first_row + index / data_columns,
                (index % data_columns) as usize,
            );
            table.set(position % self.geometry.blocks_per_segment(), checksum);
        }
        let current = state.log.current_mut(stream).expect("a current segment");
        assert_eq!(current.segment, header.segment, "a batch seals into its stream's current segment");
        assert_eq!(current.next_row, header.first_row, "batches follow each other in a segment");
        // (Never an overwrite of live data: rows written stay below the new batch's.)
        assert!(
            self.rows_on_media(header.segment) <= header.first_row,
            "batch {}: its rows in segment {} are written already",
            header.sequence,
            header.segment
        );
        current.next_row = header.first_row + header.row_count;
        let segment_full = current.next_row == self.geometry.rows_per_chunk();
        // A relocation segment is as old as the oldest block it holds.
        let oldest_clock = (stream != HOST_STREAM).then_some(header.write_clock);
        let sealed_rows = header.first_row + header.row_count;
        state.space.note_sealed(header.segment, sealed_rows, state.lifetimes.write_clock, oldest_clock);
        if segment_full {
            state.log.take_current(stream);
            state.current_checksums[stream] = None;
            self.checksums.unpin(header.segment);
            state.space.leave_current(header.segment, header.sequence);
        }
        let batch = Arc::new(sealed);
        state.log.sealed(batch.clone());
        batch
    }

    /// Send a sealed batch to the members: threaded, to the stripe writer's queue (never
    /// blocks); inline, written now. Callers do not hold the write lock.
    pub(crate) fn dispatch(&self, batch: Arc<SealedBatch>) -> Result<()> {
        crate::write_lock::assert_not_held("dispatching a batch");
        // A batch sealed before the volume stopped is not written after (a panic may have
        // left it half changed).
        self.members.check_running()?;
        match self.io_mode {
            IoMode::Inline => {
                let mut parity = self.parity_pool.take();
                batch.compute_parity(&self.geometry, &mut parity);
                let mut error = None;
                for member in 0..self.geometry.member_count {
                    if let Err(failure) = self.write_member_part(&batch, &parity, member) {
                        error.get_or_insert(failure);
                    }
                }
                self.batch_written(&batch, error);
            }
            IoMode::Threaded => {
                let sender = self.stripe_queue.lock().clone().ok_or(Error::Closed)?;
                // Never blocks: the queue holds as many batches as the data pool has sets.
                sender.send(crate::log::pipeline::PipelineJob::Stripe(batch)).map_err(|_| Error::Closed)?;
            }
        }
        self.members.check_running()
    }

    fn write_member_part(&self, batch: &SealedBatch, parity: &PooledBuffers, member: usize) -> Result<()> {
        let Some(device) = self.members.writable(member) else {
            return Ok(());
        };
        let (buffer, offset) = batch.member_part(&self.geometry, parity, member);
        // A member that fails is failed (durably) and the batch counts as written on the
        // others; only a loss the volume cannot survive is an error.
        device.write_at(buffer, offset).or_else(|error| self.members.write_failed(member, error))
    }

    /// Account a batch whose member writes finished (with the first error, if any), and
    /// retire written batches in sequence order.
    pub(crate) fn batch_written(&self, batch: &SealedBatch, error: Option<Error>) {
        if let Some(error) = error {
            self.fail(Shutdown::BatchWrite { sequence: batch.header.sequence, error: Arc::new(error) });
        } else {
            // Before the batch counts as written: until then no flush covers it, so its
            // segment cannot be released (and its generation bumped) meanwhile.
            self.cache_batch(batch);
        }
        self.count_batch(batch);
        let mut state = self.lock_state();
        state.log.written(batch.header.sequence, |written| {
            let header = &written.header;
            let before =
                self.rows_on_media[header.segment as usize].swap(header.first_row + header.row_count, Ordering::AcqRel);
            assert!(before <= header.first_row, "segment {}: rows on the members only grow", header.segment);
        });
        self.progress.notify_all();
    }

    /// Keep a just-written client batch readable from memory (recent writes are hot): its
    /// buffers serve reads once they are back in the pool, or, on a volume whose cache is
    /// too small for sets of its own, every block goes into the block cache.
    fn cache_batch(&self, batch: &SealedBatch) {
        if let Some(cache) = &self.cache {
            for &position in &batch.killed_positions {
                cache.forget(position);
            }
        }
        // Relocated blocks are the ones nobody wrote for a while: they would only push
        // recently written blocks out (reads cache them again when they are wanted).
        if batch.relocation || batch.metadata {
            return;
        }
        let header = &batch.header;
        let generation = self.generation(header.segment);
        if self.data_pool.retained_capacity_bytes() > 0 {
            batch.retain_for_reads(generation);
            return;
        }
        let Some(cache) = &self.cache else { return };
        for row in header.first_row..header.first_row + header.row_count {
            for column in 0..self.geometry.data_columns() {
                if let Some(block) = batch.block(row, column) {
                    cache.insert(self.geometry.position(header.segment, row, column), generation, block);
                }
            }
        }
    }

    fn count_batch(&self, batch: &SealedBatch) {
        let header = &batch.header;
        let block = BLOCK_SIZE_BYTES as u64;
        let content = if batch.relocation {
            BatchContent::Relocated
        } else if batch.metadata {
            BatchContent::Metadata
        } else {
            BatchContent::Clients
        };
        let counters = &self.counters;
        counters.add_batch(&header.member_bytes(&self.geometry, content));
        if header.first_row == 0 && header.row_count == self.geometry.rows_per_chunk() {
            Counters::add(&counters.full_stripes, 1);
        } else {
            Counters::add(&counters.short_stripes, 1);
        }
        self.members.count_written(header.row_count as u64 * block);
        self.members.note_counted(header.sequence);
    }

    /// Return when every write accepted before the call is durable: on the write log when
    /// it works, else on the members.
    pub(crate) fn flush(&self) -> Result<()> {
        self.check_open()?;
        if self.read_only {
            return Ok(());
        }
        if let Some(log) = self.active_write_log() {
            if self.append_to_write_log(log, true)? {
                return Ok(());
            }
            // The log failed before this flush's writes were staged: they are in the
            // batches; sync the members.
        }
        self.flush_members()
    }

    /// Whether enough writes are staged for the write log that they should be appended
    /// (unsynced) now, bounding the RAM they take and the work of the next flush.
    pub(crate) fn staging_is_full(&self) -> bool {
        self.staged_entries.load(Ordering::Relaxed) >= crate::write_log::STAGING_BLOCKS_SOFT_LIMIT
    }

    /// Append the staged client writes to the write log (group commit: one append at a
    /// time; a flush that finds nothing staged was covered by the append before it, synced
    /// now if that one was not) and, with `sync`, make them durable there. `Ok(false)`:
    /// nothing was staged and the log is no longer active (the caller syncs the members
    /// instead). When the log is full of records the members do not hold durably yet, or
    /// fails now, the members are synced instead (which frees the log, or retires it).
    pub(crate) fn append_to_write_log(&self, log: &crate::write_log::WriteLog, sync: bool) -> Result<bool> {
        let mut appender = log.appender.lock();
        let (staging, durable) = {
            let mut state = self.lock_state();
            self.staged_entries.store(0, Ordering::Relaxed);
            (std::mem::take(&mut state.log_staging), state.log.durable_through())
        };
        let result = if staging.is_empty() {
            if !sync || !log.is_active() {
                return Ok(log.is_active());
            }
            // Covered by an earlier append: synced if it was not, and a device it found
            // failed recorded as dropped even if the thread that found it failed to.
            log.sync(&mut appender)
        } else {
            log.append(&mut appender, &staging, durable, sync)
        };
        match result {
            Ok(()) => {
                self.record_dropped_log_devices(log)?;
                Ok(true)
            }
            Err(crate::write_log::AppendProblem::NeedSpace) => {
                // Everything staged is in batches: made durable on the members it needs
                // no log record, and every record before it dies.
                self.flush_members()?;
                Ok(true)
            }
            Err(crate::write_log::AppendProblem::Failed) => {
                log::error!(
                    "the write log failed ({}): flushes sync the members from now on",
                    log.failure().map(|problem| problem.to_string()).unwrap_or_default()
                );
                // Retiring it syncs the members: what was staged is durable there.
                self.retire_failed_write_log()?;
                Ok(true)
            }
        }
    }

    /// A log device that failed (a mirror goes on with the other) is recorded as dropped
    /// in the member superblocks, its path emptied, before the append that found it
    /// returns: its records stop at the failure, and a mount that took its chain for the
    /// log's would silently lose what was acknowledged since (docs/write-log.md). An
    /// error here fails the flush or FUA write: it is not acknowledged.
    fn record_dropped_log_devices(&self, log: &crate::write_log::WriteLog) -> Result<()> {
        let failed = log.failed_device_indices();
        if failed.is_empty() {
            // Every flush comes here: no copy of the superblock while the log is whole.
            return Ok(());
        }
        let recorded = self.members.superblock().write_log.as_ref().is_none_or(|reference| {
            failed.iter().all(|&index| reference.paths.get(index).is_none_or(String::is_empty))
        });
        if recorded {
            return Ok(());
        }
        self.members.update_superblock(|superblock| {
            if let Some(reference) = superblock.write_log.as_mut() {
                for &index in &failed {
                    if let Some(path) = reference.paths.get_mut(index) {
                        log::warn!("write log device {path} is dropped from the log: its records stop at its failure");
                        path.clear();
                    }
                }
            }
        })
    }

    /// Every device of the write log failed while serving: sync the members (every
    /// accepted write is in a batch, so everything acknowledged through the log becomes
    /// durable there), and only then remove the log from the member superblocks, so that
    /// a crash from now on mounts without it and loses nothing (docs/write-log.md, crash
    /// analysis).
    pub(crate) fn retire_failed_write_log(&self) -> Result<()> {
        self.flush_members()?;
        crate::write_log::forget(&self.members)
    }

    /// Seal the clients' open batch and make every batch durable on the members.
    pub(crate) fn flush_members(&self) -> Result<()> {
        // A stopped volume seals nothing more: what its open batch holds may be half
        // changed (a panic), or never reach the members.
        self.members.check_running()?;
        let (target, sealed) = {
            let mut state = self.lock_state_to_write();
            let sealed = self.seal_clients(&mut state);
            (state.log.last_sealed_sequence(), sealed)
        };
        for batch in sealed {
            self.dispatch(batch)?;
        }
        self.make_durable(target)
    }

    /// Make every sealed batch durable (the clients' open batch stays open), then
    /// release what that frees (the cleaner's last step).
    pub(crate) fn make_sealed_durable(&self) -> Result<()> {
        let target = self.lock_state().log.last_sealed_sequence();
        self.make_durable(target)
    }

    /// The last batch sealed so far.
    pub(crate) fn last_sealed_sequence(&self) -> u64 {
        self.lock_state().log.last_sealed_sequence()
    }

    /// Make every batch up to `target` durable on the members, by group commit: one
    /// thread at a time syncs the members, for every batch sealed when its round began;
    /// flushes that arrive meanwhile wait and are covered by that round or the next one,
    /// so concurrent flushes cost at most two rounds, not one each. Then release the
    /// segments the new durable point frees.
    pub(crate) fn make_durable(&self, target: u64) -> Result<()> {
        let mut sent_a_round = false;
        loop {
            let (round_through, written_at_start) = {
                let mut state = self.lock_state();
                loop {
                    self.members.check_running()?;
                    if state.log.durable_through() >= target {
                        drop(state);
                        // The thread that ran a round releases what it freed.
                        return if sent_a_round { self.stop_on_error(self.reclaim()) } else { Ok(()) };
                    }
                    // A round starts once this flush's batches are written, or, threaded,
                    // once they are queued (a round travels behind them); a second one
                    // only when they are written (a round may have missed a batch sealed
                    // before it but queued after it).
                    let ready =
                        state.log.written_through() >= target || (!sent_a_round && self.io_mode == IoMode::Threaded);
                    if ready {
                        if let Some(round) = state.log.begin_sync_round() {
                            break round;
                        }
                    }
                    // Threaded and closed, the pipeline is gone: no round can come, and
                    // a batch whose dispatch failed is never written. Waiting would hang
                    // the thread (the flush timer, which a close joins) for ever.
                    if self.io_mode == IoMode::Threaded && !ready && self.is_closed() {
                        return Err(Error::Closed);
                    }
                    state.wait(&self.progress);
                }
            };
            sent_a_round = true;
            let result = self.sync_members();
            let mut state = self.lock_state();
            let durable = result.as_ref().ok().map(|&covered_through| {
                // Only batches written when the round finished, and queued before it, are
                // covered by it. Inline, a batch sealed before the round may be written by
                // another thread (a client's, the flush timer's) while the members sync,
                // after its member's sync: only those written when it began are covered.
                let covered_through = match self.io_mode {
                    IoMode::Inline => covered_through.min(written_at_start),
                    IoMode::Threaded => covered_through,
                };
                round_through.min(state.log.written_through()).min(covered_through)
            });
            state.log.end_sync_round(durable);
            self.progress.notify_all();
            drop(state);
            self.stop_on_error(result)?;
            Counters::add(&self.counters.flushes, 1);
        }
    }

    /// One sync of every member. Threaded: through the write pipeline, behind the batches
    /// already queued (each member's worker syncs its own device); inline: one by one.
    /// Returns the last batch of those the sync covers (every one written before it, and,
    /// threaded, queued before it).
    fn sync_members(&self) -> Result<u64> {
        match self.io_mode {
            IoMode::Inline => self.members.flush_all(false).map(|()| u64::MAX),
            IoMode::Threaded => {
                let round =
                    crate::log::pipeline::SyncRound::new(self.geometry.member_count, self.members.flush_groups());
                let sender = self.stripe_queue.lock().clone().ok_or(Error::Closed)?;
                sender.send(crate::log::pipeline::PipelineJob::Sync(round.clone())).map_err(|_| Error::Closed)?;
                round.wait().map(|()| round.covered_through())
            }
        }
    }

    /// Record in the superblocks that every batch through `durable` is durable, unless
    /// they already say so.
    pub(crate) fn record_durable_through(&self, durable: u64) -> Result<()> {
        if self.members.superblock().durable_through_sequence >= durable {
            return Ok(());
        }
        self.members.update_superblock(|superblock| {
            superblock.durable_through_sequence = superblock.durable_through_sequence.max(durable)
        })
    }

    /// Make segments whose death is durable free again. Their head row is zeroed and
    /// flushed first, on every member, so that recovery can always tell a released
    /// segment from one whose metadata was lost (docs/crash-consistency.md).
    pub(crate) fn reclaim(&self) -> Result<()> {
        let (releasing, durable) = {
            let mut state = self.lock_state_to_write();
            let durable = state.log.durable_through();
            let releasing = state.space.begin_release(durable);
            for &segment in &releasing {
                assert_eq!(state.log.streams_in(segment).next(), None, "segment {segment} is released while current");
                assert!(
                    (0..crate::log::STREAM_COUNT).all(|stream| state.log.reserved(stream) != Some(segment)),
                    "segment {segment} is released while a stream's successor"
                );
            }
            (releasing, durable)
        };
        // Shared-block records freed so far are reused once the fence below is passed.
        let records_freed = self.shared.read().quarantined_through();
        if releasing.is_empty() {
            if let Some(serial) = records_freed {
                let _fence = self.reuse_fence.write();
                self.shared.write().release_through(serial);
            }
            return Ok(());
        }
        // The batches in these segments leave the log: record durably that everything
        // up to `durable` was durable, so that recovery does not take their absence for
        // the end of the log.
        self.record_durable_through(durable)?;
        // Barrier: wait for readers that may still hold a position in these segments;
        // then their cached blocks are retired with a new generation.
        {
            let _fence = self.reuse_fence.write();
            for &segment in &releasing {
                self.generations[segment as usize].fetch_add(1, Ordering::AcqRel);
                self.checksums.forget(segment);
            }
            if let Some(serial) = records_freed {
                self.shared.write().release_through(serial);
            }
        }
        let zeros = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        let heads: Vec<u64> = releasing.iter().map(|&segment| self.geometry.member_offset_bytes(segment, 0)).collect();
        self.members.write_everywhere(&zeros, &heads, self.io_mode == IoMode::Threaded)?;
        self.members.flush_all(self.io_mode == IoMode::Threaded)?;
        let mut state = self.lock_state();
        for segment in releasing {
            self.rows_on_media[segment as usize].store(0, Ordering::Release);
            state.space.finish_release(segment);
        }
        self.progress.notify_all();
        Ok(())
    }
}

impl crate::log::pipeline::BatchSink for Core {
    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn members(&self) -> &crate::array::members::Members {
        &self.members
    }

    fn parity_pool(&self) -> &Arc<BufferPool> {
        &self.parity_pool
    }

    fn write_queue_batches(&self) -> usize {
        self.write_queue_batches
    }

    fn batch_written(&self, batch: &SealedBatch, error: Option<Error>) {
        Core::batch_written(self, batch, error)
    }

    fn fail(&self, reason: Shutdown) {
        Core::fail(self, reason)
    }
}
