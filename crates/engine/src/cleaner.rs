//! The cleaner: makes free segments by relocating the live blocks of partly dead ones.
//!
//! A round (docs/garbage-collection.md):
//! 1. choose victims among the used segments by the policy, as many as two segments can
//!    absorb;
//! 2. find their live records from their own summaries — what each position holds — and
//!    the index (data blocks it still maps there, and the zero and trim records that must
//!    outlive the older copies they cancel), so a round costs in proportion to its victims;
//!    give each record a relocation stream by predicted lifetime;
//! 3. read the live blocks, one read per segment column, each verified against its
//!    checksum (rebuilt when it fails), under the reuse fence;
//! 4. under the state lock, append the records still current to relocation batches in
//!    their streams' segments (the clients' open batch is set aside meanwhile and
//!    renumbered after them, so that the log order stays the acceptance order), and write
//!    them through the normal pipeline;
//! 5. make them durable (without sealing the clients' open batch) and release the victims
//!    the normal way: a segment is reused only once the batches that killed its blocks
//!    are durable, so the old copy stays valid until the new one is.

use crate::error::{Error, InternalFailure, Result};
use crate::index::lifetimes::{class_length_blocks, WRITE_CLOCK_ORIGIN};
use crate::index::map::Mapping;
use crate::io::{Core, SegmentEntry, SideKind, WriteState};
use crate::layout::format;
use crate::layout::format::EntryEffect;
use crate::layout::geometry::BLOCK_SIZE_BYTES;
use crate::layout::packed::{BLOCKS_PER_UNIT_MAXIMUM, FRAGMENTS_PER_BLOCK_MAXIMUM};
use crate::log::{HOST_STREAM, METADATA_STREAM, RELOCATION_STREAMS};
use crate::space::{watermarks, Purpose, SegmentStatus, MINIMUM_WON_SEGMENTS, ROUND_SEGMENTS};
use crate::stats::Counters;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stripelog_blockdev::AlignedBuffer;

/// How many cleaned client segments the lifetime yardstick averages over.
const LIFESPAN_SAMPLES: usize = 16;
/// Relocated blocks unchanged for this many yardsticks go to the old stream (SepBIT uses
/// 4 and 16 with a shorter yardstick; 2 measured best here, docs/garbage-collection.md).
const OLD_AGE_YARDSTICKS: u64 = 2;
/// Relocated blocks whose previous version lived at most this many yardsticks go to the
/// short-lived stream.
const SHORT_LIFE_YARDSTICKS: u64 = 2;

/// The lifetime yardstick ℓ: the average lifespan (write clock from opening to cleaning)
/// of the last few cleaned client segments. Relocated blocks are classified against it.
#[derive(Default)]
pub(crate) struct Lifespans {
    recent: VecDeque<u64>,
}

impl Lifespans {
    fn record(&mut self, lifespan: u64) {
        if self.recent.len() == LIFESPAN_SAMPLES {
            self.recent.pop_front();
        }
        self.recent.push_back(lifespan);
    }

    fn average(&self) -> Option<u64> {
        (!self.recent.is_empty()).then(|| self.recent.iter().sum::<u64>() / self.recent.len() as u64)
    }
}

/// The relocation stream of a block: old (unchanged for several yardsticks) first; then
/// short-lived (its previous version lived less than a yardstick: likely to die soon);
/// the rest in between. Without a yardstick yet, the middle stream.
fn relocation_stream(state: &WriteState, record: &Live, yardstick: Option<u64>) -> usize {
    let [short, middle, old] = RELOCATION_STREAMS;
    let Some(yardstick) = yardstick else {
        return middle;
    };
    if state.lifetimes().age_since(record.write_clock) >= OLD_AGE_YARDSTICKS.saturating_mul(yardstick) {
        return old;
    }
    let short_lived = class_length_blocks(record.lifetime_class)
        .is_some_and(|previous_life| previous_life <= SHORT_LIFE_YARDSTICKS * yardstick);
    if short_lived {
        short
    } else {
        middle
    }
}

/// How victims are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CleaningPolicy {
    /// The segments with the fewest live blocks.
    Greedy,
    /// After Rosenblum and Ousterhout's LFS: the largest `(1 − u) × age / 2u` (LFS divides
    /// by `1 + u`, the cost of reading a whole segment; this cleaner reads and writes only
    /// the live blocks).
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

/// A cleaning policy that is not one (`CleaningPolicy::from_str`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown cleaning policy {text:?} (one of: greedy, cost-benefit)")]
pub struct UnknownCleaningPolicy {
    /// What was given.
    pub text: String,
}

impl std::str::FromStr for CleaningPolicy {
    type Err = UnknownCleaningPolicy;
    fn from_str(text: &str) -> std::result::Result<Self, UnknownCleaningPolicy> {
        CleaningPolicy::ALL
            .into_iter()
            .find(|policy| policy.name() == text)
            .ok_or_else(|| UnknownCleaningPolicy { text: text.to_string() })
    }
}

impl std::fmt::Display for CleaningPolicy {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// How long the background cleaner sleeps when there is nothing to do; a tick without a
/// client write also counts as idle.
const BACKGROUND_TICK: std::time::Duration = std::time::Duration::from_millis(20);

/// The cleaner thread of a threaded volume. It runs rounds back to back while the free
/// segments are below the low watermark (client writes opening a segment there wake it),
/// and while the volume is idle (no client write for a tick) up to the high watermark.
/// Client writes wait for it only at the reserve, where `make_space` also cleans itself
/// if this thread cannot keep up, and reports `OutOfSpace` when nothing can be gained.
pub(crate) fn background_cleaner(cleaner: std::sync::Arc<Cleaner>) {
    run_rounds(&cleaner);
    // Its last round is durable before the thread ends.
    if let Err(error) = cleaner.finish_deferred_durability() {
        cleaner.core.fail(crate::error::Shutdown::Cleaner(std::sync::Arc::new(error)));
    }
}

fn run_rounds(cleaner: &Cleaner) {
    let shared = &cleaner.core;
    let (low_watermark, high_watermark) = watermarks(shared.geometry());
    let mut nothing_to_gain = false;
    let net_segments = || shared.cleaner().net_segments();
    let mut progress = ProgressWindow::new(net_segments());
    let mut clock_seen = u64::MAX;
    loop {
        {
            let mut state = shared.lock_state();
            loop {
                if shared.cleaner().stop_requested() || shared.members().check_running().is_err() {
                    return;
                }
                let free = state.space().free_count();
                shared.cleaner().pacer().set_headroom(free, state.space().clients_floor(Purpose::Data));
                let idle = state.lifetimes().write_clock == clock_seen;
                clock_seen = state.lifetimes().write_clock;
                let threshold = crate::space::cleaner_thread_threshold(
                    low_watermark,
                    state.space().clients_floor(Purpose::Data),
                    shared.cleaner().pacer().window_segments(),
                );
                if !nothing_to_gain && (free < threshold || (idle && free < high_watermark)) {
                    break;
                }
                nothing_to_gain = false;
                // A new burst of rounds is judged afresh.
                progress = ProgressWindow::new(net_segments());
                state.wait_for(shared.cleaner().wakeup(), BACKGROUND_TICK);
            }
        }
        // Dead segments waiting only for a checkpoint come free without a round.
        match cleaner.checkpoint_for_space() {
            Ok(true) => {
                shared.notify_progress();
                continue;
            }
            Ok(false) => {}
            Err(error) => {
                shared.fail(crate::error::Shutdown::Checkpoint(std::sync::Arc::new(error)));
                return;
            }
        }
        let (round_started, net_before) = (std::time::Instant::now(), net_segments());
        let gained = match cleaner.clean_round_with(RoundDurability::Overlapped) {
            Ok(gained) => gained,
            // No free segment to relocate into. The last round's victims come free once
            // its helper has made it durable: wait for it, and try again. Otherwise it is
            // as good as nothing to gain; writers at the reserve then look for space
            // themselves and report it.
            Err(Error::OutOfSpace) => match cleaner.finish_deferred_durability() {
                Ok(was_pending) => was_pending,
                Err(error) => {
                    shared.fail(crate::error::Shutdown::Cleaner(std::sync::Arc::new(error)));
                    return;
                }
            },
            Err(error) => {
                shared.fail(crate::error::Shutdown::Cleaner(std::sync::Arc::new(error)));
                return;
            }
        };
        // What the round freed net, for the pace of client writes.
        let client_blocks_per_segment = shared.geometry().blocks_per_segment() as i64;
        shared
            .cleaner()
            .pacer()
            .record_round((net_segments() - net_before) * client_blocks_per_segment, round_started.elapsed());
        let gained = gained && progress.after_round(net_segments());
        if !gained {
            progress = ProgressWindow::new(net_segments());
        }
        nothing_to_gain = !gained;
        shared.cleaner().set_gains_nothing(!gained);
        shared.notify_progress();
    }
}

/// Rounds over which cleaning must win at least `MINIMUM_WON_SEGMENTS` segments net: the
/// segments its rounds emptied less the free segments they took to relocate into
/// (`Core::cleaning_net_segments`, which client writes do not move). A round that
/// relocates live blocks always "runs", but with a spare of only a few segments its
/// relocations and the padding that ends them take as much room as its victims give: rounds
/// would go on for ever while writers wait for room. Over this many rounds (up to twice as
/// many segments relocated) a cleaner with any real margin wins several segments.
const PROGRESS_WINDOW_ROUNDS: u32 = 64;
/// Before refusing a write for space, the relocation streams give up their partly filled
/// segments (as a reopen would) at most this many times in a row without the cleaner
/// winning a segment: each time, its rounds may leave new partly filled ones.
const FRUITLESS_RETIREMENTS_MAXIMUM: u32 = 4;
/// Whether cleaning rounds are winning room, judged over windows of rounds.
pub(crate) struct ProgressWindow {
    net_at_start: i64,
    rounds: u32,
}

impl ProgressWindow {
    pub(crate) fn new(net_segments: i64) -> ProgressWindow {
        ProgressWindow { net_at_start: net_segments, rounds: 0 }
    }

    /// After a round that ran, with the cleaner's net segments won so far: false when a
    /// whole window of rounds has won fewer than `MINIMUM_WON_SEGMENTS` (a new window
    /// starts).
    pub(crate) fn after_round(&mut self, net_segments: i64) -> bool {
        if net_segments >= self.net_at_start + MINIMUM_WON_SEGMENTS as i64 {
            *self = ProgressWindow::new(net_segments);
            return true;
        }
        self.rounds += 1;
        if self.rounds < PROGRESS_WINDOW_ROUNDS {
            return true;
        }
        *self = ProgressWindow::new(net_segments);
        false
    }
}

/// A live data block of a victim to read: its record in the round's list, and where it is.
#[derive(Clone)]
struct BlockToRead {
    record: usize,
    row: u32,
    position: u64,
}

/// A record's index and its content as read, when it matched its checksum.
type VerifiedBlock = (usize, Option<Box<[u8]>>);

/// One live record of a victim, and its content when it is a data block.
struct Live {
    logical_block: u64,
    mapping: Mapping,
    /// Generation of the block's segment when it was read (detects reuse in between).
    generation: u32,
    /// The relocation stream it goes to.
    stream: usize,
    /// Its write clock and lifetime class, from the summary that describes it.
    write_clock: u64,
    lifetime_class: u8,
    /// Redundancy could not rebuild it: it stays where it is (its reads fail) and its
    /// segment is pinned.
    unreadable: bool,
    /// The shared-block record whose copy it is (then `logical_block` is the record's
    /// number and `mapping` the copy's position as data): moved once for every logical
    /// block that refers to it, by rewriting the record (docs/deduplication.md).
    shared_record: Option<u64>,
}

/// The cleaner of one volume: its policy, and the state of its rounds.
pub(crate) struct Cleaner {
    pub(crate) core: std::sync::Arc<Core>,
    /// Checkpoints free the dead segments a stream left (the reuse rule).
    checkpointer: Arc<crate::checkpoint::Checkpointer>,
    policy: CleaningPolicy,
    /// Relocated blocks go to their own streams by predicted lifetime; off: into the
    /// clients' stream (the baseline the cleaning measurements compare against).
    separate_streams: bool,
    /// One round at a time; it holds the lifetime yardstick the rounds measure.
    round: parking_lot::Mutex<Lifespans>,
    /// The cleaner thread's last round, being made durable while the next one reads its
    /// victims (at most one at a time).
    deferred_durability: parking_lot::Mutex<Option<std::thread::JoinHandle<Result<()>>>>,
    /// Rounds begun, by any thread: a writer short of space tells from it whether the
    /// cleaner thread ran one while it looked.
    rounds_begun: std::sync::atomic::AtomicU64,
    /// Writers short of space for whom the relocation streams' partly filled segments
    /// have been given up: while there is one, rounds relocate into one stream (the
    /// middle one), so that they leave one partly filled segment rather than one per
    /// stream.
    writers_packing_for_space: AtomicU32,
}

/// One of [`Cleaner::writers_packing_for_space`], for as long as it lives.
struct PackingForSpace<'a>(&'a AtomicU32);

impl<'a> PackingForSpace<'a> {
    fn new(writers: &'a AtomicU32) -> PackingForSpace<'a> {
        writers.fetch_add(1, Ordering::SeqCst);
        PackingForSpace(writers)
    }
}

impl Drop for PackingForSpace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// When a round's relocations are made durable (and its victims released).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoundDurability {
    /// Before the round returns.
    Now,
    /// In a helper, while the caller goes on with the next round (the cleaner thread): the
    /// disks then read the next victims while they write this round's relocations.
    Overlapped,
}

impl Cleaner {
    pub(crate) fn new(
        core: Arc<Core>,
        checkpointer: Arc<crate::checkpoint::Checkpointer>,
        policy: CleaningPolicy,
        separate_streams: bool,
    ) -> Cleaner {
        Cleaner {
            core,
            checkpointer,
            policy,
            separate_streams,
            round: parking_lot::Mutex::new(Lifespans::default()),
            deferred_durability: parking_lot::Mutex::new(None),
            rounds_begun: std::sync::atomic::AtomicU64::new(0),
            writers_packing_for_space: AtomicU32::new(0),
        }
    }

    pub(crate) fn policy(&self) -> CleaningPolicy {
        self.policy
    }
}

impl Cleaner {
    /// Flush so that dead segments can be released, release them, and wait for releases
    /// another thread has under way, until client writes carrying `purpose` have room
    /// (`WriteState::has_room_for_clients`); `OutOfSpace` only when nothing more can come
    /// free.
    pub(crate) fn make_space(&self, purpose: Purpose) -> Result<()> {
        if self.core.cleaner().background() {
            // The cleaner thread frees segments (its rounds also release the segments
            // whose death became durable); wait for it while it gains something.
            let mut state = self.core.lock_state();
            loop {
                if state.has_room_for_clients(purpose) {
                    return Ok(());
                }
                self.core.members().check_running()?;
                if self.core.cleaner().gains_nothing() || self.core.cleaner().stop_requested() {
                    break;
                }
                self.core.cleaner().wake();
                self.core.wait_for_progress(&mut state, Duration::from_millis(10));
            }
        }
        self.core.flush_members()?;
        let mut progress = ProgressWindow::new(self.core.cleaner().net_segments());
        // Times the relocation streams gave up their segments since the cleaner last won
        // a segment net, and its net gain then.
        let mut fruitless_retirements = (0u32, self.core.cleaner().net_segments());
        let mut packing: Option<PackingForSpace> = None;
        loop {
            self.core.stop_on_error(self.core.reclaim())?;
            let state = self.core.lock_state();
            if state.has_room_for_clients(purpose) {
                return Ok(());
            }
            // A round can only gain a free segment if the used segments hold at least a
            // segment's worth of dead blocks between them; less than that is a full volume.
            let per_segment = self.core.geometry().blocks_per_segment();
            let units_per_block = self.core.geometry().live_units_per_block();
            let dead = state.space().dead_blocks_in_used(units_per_block);
            drop(state);
            // Dead segments a stream left since the last checkpoint come free once the
            // next one is committed: cheaper than a round, and a round may need them.
            if self.checkpoint_for_space()? {
                continue;
            }
            // Clean until there is room; nothing left to clean means the volume is full, and
            // so do rounds that win no room (a spare too small for the cleaner's overheads)
            // or find no free segment to relocate into.
            let gained = dead >= 2 * per_segment
                && match self.clean_round() {
                    Ok(gained) => gained,
                    Err(Error::OutOfSpace) => false,
                    Err(error) => return Err(error),
                };
            if gained && progress.after_round(self.core.cleaner().net_segments()) {
                continue;
            }
            let rounds_seen = self.rounds_begun.load(Ordering::SeqCst);
            // Rounds that ran since this flush and that checkpoint (this thread's, and the
            // cleaner thread's, whose durability runs in a helper) may have emptied segments
            // that come free only with one more flush or checkpoint: not a full volume if
            // they make room. (Only then: going round again on a volume that stays full
            // would run rounds for ever.)
            let after_a_flush = {
                let state = self.core.lock_state();
                state.space().any_waiting_beyond(state.log().durable_through())
            };
            if after_a_flush {
                self.core.flush_members()?;
                self.core.stop_on_error(self.core.reclaim())?;
            }
            // (It writes one only when segments wait for it.)
            self.checkpoint_for_space()?;
            let mut state = self.core.lock_state();
            if state.has_room_for_clients(purpose) {
                return Ok(());
            }
            // (One that waits for a checkpoint too is not coming: one was just tried.)
            let coming_free = state.space().any_coming_free(state.log().durable_through());
            if !coming_free {
                drop(state);
                // The cleaner thread may be in a round that empties segments (holding the
                // free ones it relocates into), or its helper may be making the last one
                // durable: not a full volume while they change something. Wait for them and
                // look again, within the window of rounds that must win room.
                if self.core.cleaner().background()
                    && self.wait_for_the_cleaner_thread(rounds_seen)?
                    && progress.after_round(self.core.cleaner().net_segments())
                {
                    continue;
                }
                // The rows the relocation streams (and the clients' cold batches) have not
                // filled in their current segments are room no round can reach while the
                // segments stay current; a reopen gives them up and can clean them. Give
                // them up now, so that a refusal for space stands after a reopen too. The
                // rounds that follow may leave new such rows: again, a few times without a
                // net gain (each time is what a reopen would do), for as long as they win.
                let net = self.core.cleaner().net_segments();
                if net > fruitless_retirements.1 {
                    fruitless_retirements = (0, net);
                }
                if fruitless_retirements.0 < FRUITLESS_RETIREMENTS_MAXIMUM && self.give_up_relocation_segments()? {
                    fruitless_retirements.0 += 1;
                    packing.get_or_insert_with(|| PackingForSpace::new(&self.writers_packing_for_space));
                    progress = ProgressWindow::new(net);
                    continue;
                }
                return Err(Error::OutOfSpace);
            }
            self.core.members().check_running()?;
            self.core.wait_for_progress(&mut state, Duration::from_millis(10));
        }
    }

    /// Give up the current segments of the relocation streams, so that their unfilled
    /// rows can be won by cleaning them, and the metadata stream's, which the next
    /// checkpoint then empties; `true` when there was one. Under the round lock, so that
    /// no round is filling one (a round's side batch lives under the state lock anyway); the
    /// metadata stream's only when no checkpoint is being written (each segment it gave up
    /// mid-checkpoint would cost that checkpoint one of its headroom). A clients' cold
    /// batch in one is sealed first, and dispatched once the state lock is released.
    ///
    /// A segment the stream has not written a batch into yet is kept: nothing is won by
    /// giving it up, and it would break the chain mount follows (a stream's next segment
    /// is named only by the summaries in the one before, and it has none).
    fn give_up_relocation_segments(&self) -> Result<bool> {
        let _one_round_at_a_time = self.round.lock();
        let no_checkpoint_running = self.core.directory().try_lock();
        let streams = RELOCATION_STREAMS.into_iter().chain(no_checkpoint_running.is_some().then_some(METADATA_STREAM));
        let mut gave_up = false;
        let mut sealed = Vec::new();
        {
            let mut state = self.core.lock_state_to_write();
            for stream in streams {
                let Some(segment) =
                    state.log().current(stream).filter(|current| current.next_row > 0).map(|current| current.segment)
                else {
                    continue;
                };
                sealed.extend(self.core.retire_if_current(&mut state, segment));
                gave_up = true;
            }
        }
        for batch in sealed {
            self.core.dispatch(batch)?;
        }
        Ok(gave_up)
    }

    /// Wait for the round in progress, if any, and for the durability of the cleaner
    /// thread's last one. Returns whether there was such durability or a round begun
    /// since `rounds_seen`: whether the cleaner thread may have changed what is free.
    fn wait_for_the_cleaner_thread(&self, rounds_seen: u64) -> Result<bool> {
        let _one_round_at_a_time = self.round.lock();
        let was_pending = self.finish_deferred_durability()?;
        Ok(was_pending || self.rounds_begun.load(Ordering::SeqCst) != rounds_seen)
    }

    /// Write a checkpoint when segments wait for one to come free; `true` when it left
    /// more free segments than before, `false` when none waits, when it freed nothing net,
    /// or when no free segment is left for the checkpoint's streams.
    fn checkpoint_for_space(&self) -> Result<bool> {
        match self.checkpointer.checkpoint_for_space() {
            Err(Error::OutOfSpace) => Ok(false),
            other => other,
        }
    }

    /// Read the live data blocks of the victims into `contents` (one block per record):
    /// one read per segment and data column, over the rows from its first to its last live
    /// block, rather than one read per block. A block whose checksum does not match (bit
    /// rot, a read error, or rows still only in memory) is read again by `read_position`,
    /// which serves it from memory or rebuilds it from the rest of its row.
    /// Returns, for each fragment record, its fragment as stored (start block and
    /// continuations, proven).
    fn read_live(&self, live: &mut [Live], contents: &mut [u8]) -> Result<Vec<Option<MovedFragment>>> {
        let _fence = self.core.read_fence();
        // (segment, column) → its live data blocks.
        let mut runs: std::collections::BTreeMap<(u64, usize), Vec<BlockToRead>> = Default::default();
        for (index, record) in live.iter_mut().enumerate() {
            if let Some(position) = record.mapping.position() {
                if !self.is_current(record)? {
                    continue; // overwritten meanwhile: skipped when appending
                }
                let location = self.core.geometry().locate(position);
                record.generation = self.core.generation(location.segment);
                runs.entry((location.segment, location.column)).or_default().push(BlockToRead {
                    record: index,
                    row: location.row,
                    position,
                });
            }
        }
        // One reader per member, in parallel on threaded volumes: each reads its runs
        // in turn into one buffer of at most a chunk and keeps the blocks that match
        // their checksums.
        let mut by_member: Vec<Vec<(u64, Vec<BlockToRead>)>> = vec![Vec::new(); self.core.geometry().member_count];
        for ((segment, column), blocks) in runs {
            let member = self
                .core
                .geometry()
                .members_of_column(segment, column)
                .into_iter()
                .find(|&member| self.core.members().readable(member, segment).is_some());
            // A column with no member present is rebuilt from parity below.
            if let Some(member) = member {
                by_member[member].push((segment, blocks));
            }
        }
        let read_member = |member: usize, runs: &[(u64, Vec<BlockToRead>)]| {
            let mut verified: Vec<VerifiedBlock> = Vec::new();
            let mut buffer = AlignedBuffer::zeroed(self.core.geometry().chunk_size_bytes as usize);
            for (segment, blocks) in runs {
                let Some(device) = self.core.members().readable(member, *segment) else {
                    continue;
                };
                let first_row = blocks.iter().map(|block| block.row).min().unwrap_or(0);
                let last_row = blocks.iter().map(|block| block.row).max().unwrap_or(0);
                let run = &mut buffer[..(last_row - first_row + 1) as usize * BLOCK_SIZE_BYTES];
                let result = device.read_at(run, self.core.geometry().member_offset_bytes(*segment, first_row));
                let read = self.core.members().read_done(member, result, self.core.counters());
                Counters::add(&self.core.counters().member_bytes_read_cleaning, run.len() as u64);
                // Without the segment's checksums nothing here verifies: each block is
                // then read again by position below, which reports it unreadable.
                let table = self.core.checksum_table(*segment).ok();
                let per_segment = self.core.geometry().blocks_per_segment();
                for block in blocks {
                    let start = (block.row - first_row) as usize * BLOCK_SIZE_BYTES;
                    let content = &run[start..start + BLOCK_SIZE_BYTES];
                    let expected = table.as_ref().map(|table| table.get(block.position % per_segment));
                    let good = read && expected.is_some_and(|expected| format::checksum_proves(content, expected));
                    verified.push((block.record, good.then(|| content.into())));
                }
            }
            verified
        };
        let readers: Vec<usize> = (0..by_member.len()).filter(|&member| !by_member[member].is_empty()).collect();
        let parallel = self.core.io_mode() == crate::log::IoMode::Threaded;
        let results: Vec<Vec<VerifiedBlock>> = crate::array::members::for_each_member(&readers, parallel, |member| {
            read_member(member, &by_member[member])
        })
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect();
        // Blocks that did not verify (bit rot, a read error, rows still only in memory, a
        // reader that panicked) are read again by position.
        let mut done = vec![false; live.len()];
        for (index, content) in results.into_iter().flatten() {
            if let Some(content) = content {
                contents[index * BLOCK_SIZE_BYTES..(index + 1) * BLOCK_SIZE_BYTES].copy_from_slice(&content);
                done[index] = true;
            }
        }
        for (index, record) in live.iter_mut().enumerate() {
            if let (Some(position), false) = (record.mapping.position(), done[index]) {
                if self.is_current(record)? {
                    let content = &mut contents[index * BLOCK_SIZE_BYTES..(index + 1) * BLOCK_SIZE_BYTES];
                    match self.core.read_position(position, record.logical_block, content) {
                        Ok(()) => {}
                        Err(Error::Unrecoverable { .. }) => record.unreadable = true,
                        Err(error) => return Err(error),
                    }
                }
            }
        }
        // A packed block proven by its checksum must hold the fragment its entry names,
        // and the blocks it continues into must continue it; one that does not cannot be
        // moved (its reads fail the same way). The blocks of one unit share their read.
        let mut fragments: Vec<Option<MovedFragment>> = vec![None; live.len()];
        let mut gathered: rustc_hash::FxHashMap<(u64, usize), Option<MovedFragment>> = Default::default();
        for (index, record) in live.iter_mut().enumerate() {
            let Mapping::Fragment { position, .. } = record.mapping else {
                continue;
            };
            if record.unreadable || !self.is_current(record)? {
                continue;
            }
            let content = &contents[index * BLOCK_SIZE_BYTES..(index + 1) * BLOCK_SIZE_BYTES];
            let found = crate::layout::packed::find(content, record.logical_block).ok();
            let moved = match found {
                None => None,
                Some((entries, entry_index)) => match gathered.get(&(position, entry_index)) {
                    Some(moved) => moved.clone(),
                    None => {
                        // A continuation nothing can read or rebuild leaves the fragment
                        // unreadable, as its reads are.
                        let following =
                            match self.core.read_continuations(position, &entries, entry_index, record.logical_block) {
                                Ok(following) => Some(following),
                                Err(Error::Unrecoverable { .. }) => None,
                                Err(error) => return Err(error),
                            };
                        let moved = following
                            .and_then(|following| {
                                crate::layout::packed::gather(content, &entries, entry_index, &following).ok()
                            })
                            .map(|bytes| {
                                let entry = entries[entry_index];
                                // Blocks it served died: their bytes would travel for
                                // ever. The unit is decompressed, its dead blocks zeroed
                                // and it is compressed again, so only the live blocks take
                                // space; here, outside the state lock, for the blocks
                                // served now (any that die before the move travel until
                                // the next one).
                                let mapping_of = |block| Some(self.core.map().get(block).unwrap_or(Mapping::Unmapped));
                                // (A shared copy's unit is its one block, current above.)
                                let mask = match record.shared_record {
                                    Some(_) => entry.mask,
                                    None => self
                                        .served_mask(content, position, &entry, entry_index, &mapping_of)
                                        .unwrap_or(0),
                                };
                                let repacked = (mask != 0 && mask != entry.mask)
                                    .then(|| repack(&bytes, entry, entry_index, mask))
                                    .flatten()
                                    .map(|(bytes, checksum)| Arc::new(Repacked { mask, bytes, checksum }));
                                MovedFragment { entry, index: entry_index, bytes: Arc::new(bytes), repacked }
                            });
                        gathered.insert((position, entry_index), moved.clone());
                        moved
                    }
                },
            };
            match moved {
                Some(moved) => fragments[index] = Some(moved),
                None => record.unreadable = true,
            }
        }
        Ok(fragments)
    }

    /// The blocks of fragment `index` of the packed block `start_block` at `position`
    /// (table entry `entry`) it still serves: mapped to that position and found there in
    /// that fragment, as bits of its live mask.
    /// Whether what `record` describes is still where it was found: the index still maps
    /// its logical block there, or its shared-block record still names its position.
    fn is_current(&self, record: &Live) -> Result<bool> {
        match record.shared_record {
            Some(shared) => {
                let copy = self.core.shared_table().read().get(shared);
                Ok(copy.is_some_and(|copy| copy.content() == record.mapping))
            }
            None => Ok(self.core.map().get(record.logical_block)? == record.mapping),
        }
    }

    fn served_mask(
        &self,
        start_block: &[u8],
        position: u64,
        entry: &crate::layout::packed::FragmentEntry,
        index: usize,
        mapping_of: &dyn Fn(u64) -> Option<Mapping>,
    ) -> std::result::Result<u8, u64> {
        let mut mask = 0u8;
        for place in 0..entry.blocks {
            let logical_block = entry.first_logical_block + place as u64;
            if !entry.serves(logical_block) {
                continue;
            }
            let mapping = mapping_of(logical_block).ok_or(logical_block)?;
            let served_here = matches!(mapping, Mapping::Fragment { position: at, .. } if at == position)
                && crate::layout::packed::find(start_block, logical_block).is_ok_and(|(_, found)| found == index);
            if served_here {
                mask |= 1 << place;
            }
        }
        Ok(mask)
    }

    /// Under the write lock: whether `record` is still where it was found and read, and
    /// readable; `None` when its index page is not in RAM (it is loaded outside the lock,
    /// and the record looked at again).
    fn still_current(&self, record: &Live) -> Option<bool> {
        let in_place = match record.shared_record {
            Some(shared) => {
                let copy = self.core.shared_table().read().get(shared);
                copy.is_some_and(|copy| copy.content() == record.mapping)
            }
            None => self.core.map().get_if_resident(record.logical_block)? == record.mapping,
        };
        let same_generation = record.mapping.position().is_none_or(|position| {
            self.core.generation(self.core.geometry().locate(position).segment) == record.generation
        });
        Some(in_place && same_generation && !record.unreadable)
    }

    /// Pin the segments of the records that could not be read or rebuilt.
    fn pin_unreadable<'a>(&self, records: impl Iterator<Item = &'a Live>) {
        let per_segment = self.core.geometry().blocks_per_segment();
        let mut state = self.core.lock_state();
        for record in records.filter(|record| record.unreadable) {
            // (A segment reused since the read holds other blocks: it is not pinned.)
            if let Some(segment) = record.mapping.segment(per_segment) {
                if self.core.generation(segment) == record.generation {
                    state.space_mut().pin(segment);
                }
            }
        }
    }

    /// The records of `segment` that are still current, found from its summaries (the
    /// segment's reverse information) and checked against the index: data blocks the
    /// index still maps to their position there, and zero or trim records the index still
    /// refers to (`data_only`: data blocks alone). A segment whose summaries can be
    /// neither read nor rebuilt is pinned (its blocks cannot be found to move them) and
    /// yields nothing.
    /// Load the index pages of `blocks` that are not in RAM, several at once on threaded
    /// volumes, at most half the map cache's pages (the rest load one at a time when
    /// needed).
    fn load_pages_of(&self, blocks: impl IntoIterator<Item = u64>) -> Result<()> {
        let map = self.core.map();
        let pages_maximum = (map.cache_stats().capacity_pages / 2) as usize;
        map.load_pages_of(blocks, self.core.io_mode() == crate::log::IoMode::Threaded, pages_maximum)
    }

    fn live_records(&self, segment: u64, data_only: bool) -> Result<Vec<Live>> {
        let core = &self.core;
        let (entries, generation) = {
            let _fence = core.read_fence();
            (core.segment_entries(segment), core.generation(segment))
        };
        let Ok(entries) = entries else {
            let mut state = core.lock_state();
            if core.generation(segment) == generation {
                state.space_mut().pin(segment);
            }
            return Ok(Vec::new());
        };
        let record = |logical_block: u64, mapping: Mapping, write_clock: u64, lifetime_class: u8| Live {
            logical_block,
            mapping,
            generation: 0,
            stream: RELOCATION_STREAMS[0],
            write_clock,
            lifetime_class,
            unreadable: false,
            shared_record: None,
        };
        let logical_blocks = core.map().block_count();
        let effects: Vec<(EntryEffect, SegmentEntry)> =
            entries.into_iter().map(|entry| (entry.entry.effect(entry.position, segment), entry)).collect();
        // The entries' index pages, loaded several at once (one at a time below, they
        // would cost one member read each in turn: a segment's blocks written at random
        // lie on as many pages).
        self.load_pages_of(effects.iter().filter_map(|(effect, _)| match *effect {
            EntryEffect::Map { first_logical_block, .. } => Some(first_logical_block),
            _ => None,
        }))?;
        let mut records = Vec::new();
        let mut ranged = rustc_hash::FxHashSet::default();
        for (effect, SegmentEntry { entry, write_clock, .. }) in effects {
            let lifetime_class = entry.lifetime_class();
            let (first, count, mapping) = match effect {
                EntryEffect::Map { first_logical_block, block_count, mapping } => {
                    (first_logical_block, block_count, mapping)
                }
                EntryEffect::Copy { record: shared, position, fragment, .. } => {
                    let copy = core.shared_table().read().get(shared);
                    if let Some(copy) = copy.filter(|copy| !data_only && copy.position == position) {
                        // A fragment copy goes by its key, which its packed block's table
                        // holds; it is current while its record names this packed block.
                        let key = match fragment {
                            Some(_) => crate::space::shared::fragment_key(shared),
                            None => shared,
                        };
                        if copy.fragment == fragment {
                            records.push(Live {
                                shared_record: Some(shared),
                                ..record(key, copy.content(), write_clock, lifetime_class)
                            });
                        }
                    }
                    continue;
                }
                EntryEffect::Nothing => continue,
            };
            let end = first.saturating_add(count).min(logical_blocks);
            match mapping {
                Mapping::Data { .. } => {
                    if first < logical_blocks && core.map().get(first)? == mapping {
                        records.push(record(first, mapping, write_clock, lifetime_class));
                    }
                }
                // (An older version of the block in the same packed block with the same
                // share is the same mapping: one record.)
                Mapping::Fragment { .. } if !data_only => {
                    if first < logical_blocks
                        && core.map().get(first)? == mapping
                        && !records
                            .iter()
                            .rev()
                            .take(FRAGMENTS_PER_BLOCK_MAXIMUM * BLOCKS_PER_UNIT_MAXIMUM)
                            .any(|other: &Live| other.logical_block == first && other.mapping == mapping)
                    {
                        records.push(record(first, mapping, write_clock, lifetime_class));
                    }
                }
                // A block zeroed or trimmed twice in the segment is one record.
                Mapping::Zero { .. } | Mapping::Trimmed { .. } if !data_only => {
                    for block in first..end {
                        if core.map().get(block)? == mapping && ranged.insert(block) {
                            records.push(record(block, mapping, write_clock, format::LIFETIME_CLASS_UNKNOWN));
                        }
                    }
                }
                // Filler candidates are whole data blocks only.
                Mapping::Fragment { .. } | Mapping::Zero { .. } | Mapping::Trimmed { .. } => {}
                // A reference takes no block: the cleaner moves the shared copy (above), never
                // the references to it.
                Mapping::Shared { .. } | Mapping::Unmapped => {}
            }
        }
        Ok(records)
    }

    /// Run one cleaning round. `Ok(false)`: nothing could be gained (no used segment has
    /// dead space).
    pub(crate) fn clean_round(&self) -> Result<bool> {
        self.clean_round_with(RoundDurability::Now)
    }

    /// Wait for the durability of the cleaner thread's last round, if it is still running.
    /// Returns whether there was one.
    pub(crate) fn finish_deferred_durability(&self) -> Result<bool> {
        let pending = self.deferred_durability.lock().take();
        match pending {
            Some(handle) => {
                handle.join().unwrap_or(Err(Error::Internal(InternalFailure::DurabilityHelperPanicked))).map(|()| true)
            }
            None => Ok(false),
        }
    }

    pub(crate) fn clean_round_with(&self, durability: RoundDurability) -> Result<bool> {
        let mut lifespans = self.round.lock();
        self.rounds_begun.fetch_add(1, Ordering::SeqCst);
        let per_segment = self.core.geometry().blocks_per_segment();
        // Room for data in one relocation segment (a summary block per few hundred entries).
        let capacity = per_segment - per_segment.div_ceil(format::ENTRIES_PER_SUMMARY as u64) - 1;
        // In live units (docs/compression.md: sixteenths where blocks may be fragments).
        let units_per_block = self.core.geometry().live_units_per_block();
        let capacity = capacity * ROUND_SEGMENTS * units_per_block;
        let (victims, filler, yardstick) = {
            let mut guard = self.core.lock_state();
            let state = &mut *guard;
            let now = state.lifetimes().write_clock;
            let mut candidates: Vec<(f64, u64)> = state
                .space()
                .uses()
                .filter(|(_, usage)| {
                    usage.status() == SegmentStatus::Used
                        && usage.live_units() < capacity
                        && !usage.pinned()
                        && usage.stream() != METADATA_STREAM
                })
                .map(|(segment, usage)| {
                    let utilisation = usage.live_units() as f64 / (per_segment * units_per_block) as f64;
                    let score: f64 = match self.policy {
                        CleaningPolicy::Greedy => -utilisation,
                        CleaningPolicy::CostBenefit => {
                            let age = now.saturating_sub(usage.age_clock()) as f64 + 1.0;
                            // LFS divides by 1 + u: it read whole segments. This cleaner
                            // reads and writes the live blocks only: the cost is 2u.
                            (1.0 - utilisation) * age / (2.0 * utilisation).max(f64::MIN_POSITIVE)
                        }
                    };
                    (score, segment)
                })
                .collect();
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut victims = Vec::new();
            let mut filler = None;
            let mut live = 0u64;
            for (_, segment) in candidates {
                let usage = state.space().usage(segment);
                if !victims.is_empty() && live + usage.live_units() > capacity {
                    filler = Some(segment);
                    break;
                }
                live += usage.live_units();
                // Client segments opened since the volume was opened measure the yardstick.
                if usage.stream() == HOST_STREAM && usage.opened_clock() >= WRITE_CLOCK_ORIGIN {
                    assert!(usage.opened_clock() <= now, "segment {segment} was opened before the clock's now");
                    let lifespan = now - usage.opened_clock();
                    lifespans.record(lifespan);
                }
                victims.push(segment);
            }
            // (Without a yardstick, every block goes to the middle stream.)
            let packing = self.writers_packing_for_space.load(Ordering::SeqCst) > 0;
            (victims, filler, if packing { None } else { lifespans.average() })
        };
        if victims.is_empty() {
            return Ok(false);
        }
        self.relocate(&victims, filler, yardstick, durability)?;
        Ok(true)
    }

    /// Move every live block of `segment` elsewhere now (a scrub's repair), whatever the
    /// cleaning policy thinks of it. Returns the data blocks moved.
    pub(crate) fn relocate_segment(&self, segment: u64) -> Result<u64> {
        let lifespans = self.round.lock();
        let yardstick = lifespans.average();
        self.relocate(&[segment], None, yardstick, RoundDurability::Now)
    }

    /// Relocate the live records of `victims` (completing the last rows with `filler`'s
    /// blocks) and make the result durable. Returns the data blocks moved.
    fn relocate(
        &self,
        victims: &[u64],
        filler: Option<u64>,
        yardstick: Option<u64>,
        durability: RoundDurability,
    ) -> Result<u64> {
        let mut blocks_moved = 0u64;
        // Live records of the victims, and the data blocks of the filler: what their
        // summaries say each position holds, where the index still points there.
        // Each segment's summaries are a chain read one after the other (each says where
        // the next is): the segments are walked at once, each on its own thread on
        // threaded volumes, so a round waits for the longest chain, not for their sum.
        let walks: Vec<(u64, bool)> =
            victims.iter().map(|&segment| (segment, false)).chain(filler.map(|segment| (segment, true))).collect();
        let parallel = self.core.io_mode() == crate::log::IoMode::Threaded;
        let mut walked = crate::array::members::for_each_item(walks, parallel, |(segment, data_only)| {
            self.live_records(segment, data_only)
        })
        .into_iter()
        .map(|records| records.unwrap_or(Err(Error::Internal(InternalFailure::SummaryWalkerPanicked))))
        .collect::<Result<Vec<Vec<Live>>>>()?;
        // (The filler's walk is the last.)
        let mut fillers: Vec<Live> = if filler.is_some() { walked.pop().unwrap_or_default() } else { Vec::new() };
        let mut live: Vec<Live> = walked.into_iter().flatten().collect();
        {
            let state = self.core.lock_state();
            for record in live.iter_mut() {
                record.stream =
                    if self.separate_streams { relocation_stream(&state, record, yardstick) } else { HOST_STREAM };
            }
        }
        // By stream (one batch run each), data blocks in position order (sequential reads).
        live.sort_by_key(|record| (record.stream, record.mapping.position().unwrap_or(u64::MAX), record.logical_block));
        let mut contents = vec![0u8; live.len() * BLOCK_SIZE_BYTES];
        let fragments = self.read_live(&mut live, &mut contents)?;
        // Blocks of the next candidate complete the last rows of the relocation batches,
        // which would otherwise be padded: it is cleaned soon, and a block moved early
        // costs no more space than a padding block.
        fillers.sort_by_key(|record| match record.mapping {
            Mapping::Data { position } => position,
            _ => u64::MAX,
        });
        fillers.truncate(RELOCATION_STREAMS.len() * (self.core.geometry().data_columns() + 1));
        let mut filler_contents = vec![0u8; fillers.len() * BLOCK_SIZE_BYTES];
        self.read_live(&mut fillers, &mut filler_contents)?;
        // A block nothing can rebuild cannot move — its content is not known, and moving
        // it would turn an I/O error into data — so it stays where it is (its reads keep
        // failing) and its segment is pinned, out of the cleaner's way. Victims and fillers
        // alike.
        self.pin_unreadable(live.iter().chain(fillers.iter()));
        // Their pages again (reading the records took a while), several at once.
        self.load_pages_of(
            live.iter().filter(|record| record.shared_record.is_none()).map(|record| record.logical_block),
        )?;
        let mut next_filler = 0usize;
        let mut next = 0usize;
        let kind = SideKind::Relocation { one_log: !self.separate_streams };
        while next < live.len() {
            // Under the write lock, before a batch is opened: skip what the clients
            // overwrote since it was read, and find the stream of the first record still
            // current (a batch starts with a record it will hold: it is never sealed
            // empty). An index page not in RAM is loaded outside the lock, and the record
            // looked at again.
            let mut page_to_load = None;
            let side = self.core.begin_side_batch_if(kind, || {
                while next < live.len() {
                    let record = &live[next];
                    match self.still_current(record) {
                        Some(true) => {}
                        Some(false) => {
                            next += 1;
                            continue;
                        }
                        None => {
                            page_to_load = Some(record.logical_block);
                            return None;
                        }
                    }
                    let Mapping::Fragment { position, .. } = record.mapping else {
                        return Some(record.stream);
                    };
                    if record.shared_record.is_some() {
                        // A shared copy's fragment: current above, it serves its record.
                        match fragments[next] {
                            Some(_) => return Some(record.stream),
                            None => {
                                next += 1;
                                continue;
                            }
                        }
                    }
                    // A fragment moves for the blocks of its unit it still serves, whose
                    // pages must be in RAM too; one that serves none is skipped.
                    let content = &contents[next * BLOCK_SIZE_BYTES..(next + 1) * BLOCK_SIZE_BYTES];
                    let mapping_of = |block| self.core.map().get_if_resident(block);
                    let served = fragments[next]
                        .as_ref()
                        .map(|moved| self.served_mask(content, position, &moved.entry, moved.index, &mapping_of));
                    match served {
                        Some(Ok(mask)) if mask != 0 => return Some(record.stream),
                        Some(Err(logical_block)) => {
                            page_to_load = Some(logical_block);
                            return None;
                        }
                        Some(Ok(_)) | None => next += 1,
                    }
                }
                None
            })?;
            let Some(mut side) = side else {
                match page_to_load {
                    Some(logical_block) => {
                        self.core.map().ensure_resident_for(logical_block)?;
                        continue;
                    }
                    None => break,
                }
            };
            self.core.cleaner().took(side.taken_segments());
            let stream = live[next].stream;
            let mut relocated = 0u64;
            while next < live.len() && live[next].stream == stream {
                let record = &live[next];
                match self.still_current(record) {
                    Some(true) => {}
                    Some(false) => {
                        next += 1;
                        continue;
                    }
                    // Its page is loaded before the next batch.
                    None => break,
                }
                let kept = (record.lifetime_class, record.write_clock);
                let content = &contents[next * BLOCK_SIZE_BYTES..(next + 1) * BLOCK_SIZE_BYTES];
                let accepted = match record.mapping {
                    Mapping::Data { .. } => match record.shared_record {
                        Some(shared) => side.accept_moved_copy(shared, content, format::block_checksum(content), kept),
                        None => side.accept_data(record.logical_block, content, format::block_checksum(content), kept),
                    },
                    // Moved as stored, without decompressing, once for every block of its
                    // unit still served by it: read and checked above.
                    Mapping::Fragment { .. } if record.shared_record.is_some() => {
                        let Some(moved) = &fragments[next] else {
                            next += 1;
                            continue;
                        };
                        let shared = record.shared_record.expect("matched");
                        side.accept_moved_compressed_copy(shared, &moved.bytes, moved.entry.checksum, kept)
                    }
                    Mapping::Fragment { position, .. } => {
                        let Some(moved) = &fragments[next] else {
                            next += 1;
                            continue;
                        };
                        let entry = moved.entry;
                        let mapping_of = |block| self.core.map().get_if_resident(block);
                        let mask = match self.served_mask(content, position, &entry, moved.index, &mapping_of) {
                            Ok(0) => {
                                next += 1;
                                continue;
                            }
                            Ok(mask) => mask,
                            Err(_) => break, // a page of its unit is loaded before the next batch
                        };
                        // Repacked when read (for the blocks served then, of which these
                        // are all or some), or as stored.
                        let (bytes, checksum) = match &moved.repacked {
                            Some(repacked) if mask & !repacked.mask == 0 => {
                                (repacked.bytes.as_slice(), repacked.checksum)
                            }
                            _ => (moved.bytes.as_slice(), entry.checksum),
                        };
                        let accepted =
                            side.accept_fragment(entry.first_logical_block, entry.blocks, mask, bytes, checksum, kept);
                        if accepted {
                            // (This record's block is one of them: counted below.)
                            relocated += mask.count_ones() as u64 - 1;
                        }
                        accepted
                    }
                    Mapping::Zero { .. } => side.record_range(record.logical_block, false),
                    Mapping::Trimmed { .. } => side.record_range(record.logical_block, true),
                    // (Live records name a shared copy by its position, never by its record.)
                    Mapping::Unmapped | Mapping::Shared { .. } => true,
                };
                if !accepted {
                    break;
                }
                if matches!(record.mapping, Mapping::Data { .. } | Mapping::Fragment { .. }) {
                    relocated += 1;
                }
                next += 1;
            }
            // The filler's blocks complete the last row instead of padding (one whose page
            // is not in RAM is left where it is).
            while next_filler < fillers.len() && side.padding_blocks() > 0 {
                let record = &fillers[next_filler];
                next_filler += 1;
                if self.still_current(record) != Some(true) {
                    continue;
                }
                let content = &filler_contents[(next_filler - 1) * BLOCK_SIZE_BYTES..next_filler * BLOCK_SIZE_BYTES];
                let kept = (record.lifetime_class, record.write_clock);
                if !side.accept_data(record.logical_block, content, format::block_checksum(content), kept) {
                    break;
                }
                relocated += 1;
            }
            // Never empty: the segment had room for a record and the first one was current.
            side.finish()?;
            Counters::add(&self.core.counters().blocks_relocated, relocated);
            blocks_moved += relocated;
        }
        // Only victims left without a live block count as won: one whose blocks could not
        // all be found or moved stays, and a window of rounds that win nothing ends in
        // `OutOfSpace` rather than rounds for ever.
        let emptied = {
            let state = self.core.lock_state();
            victims.iter().filter(|&&segment| state.space().usage(segment).live_units() == 0).count()
        };
        Counters::add(&self.core.counters().cleaning_rounds, 1);
        Counters::add(&self.core.counters().segments_cleaned, emptied as u64);
        self.core.cleaner().emptied(emptied as u64);
        // The previous round's durability first: one helper at a time.
        self.finish_deferred_durability()?;
        match durability {
            RoundDurability::Now => self.core.make_sealed_durable()?,
            RoundDurability::Overlapped => {
                let core = self.core.clone();
                let target = core.last_sealed_sequence();
                let helper = std::thread::Builder::new()
                    .name("stripelog-clean-durable".into())
                    .spawn(move || core.make_durable(target))
                    .map_err(|error| Error::Internal(InternalFailure::DurabilityHelperNotStarted(error)))?;
                *self.deferred_durability.lock() = Some(helper);
            }
        }
        Ok(blocks_moved)
    }
}

/// The unit of `entry` (whose stored bytes are `bytes`) with the blocks not in `mask`
/// zeroed, compressed again: its fragment and unit checksum, or `None` when it does not
/// come out proven or would not save space (then it moves as stored).
fn repack(bytes: &[u8], entry: crate::layout::packed::FragmentEntry, index: usize, mask: u8) -> Option<(Vec<u8>, u32)> {
    use crate::layout::packed;
    let mut unit = vec![0u8; entry.blocks as usize * BLOCK_SIZE_BYTES];
    packed::decompress(bytes, entry, index, &mut unit).ok()?;
    for (place, block) in unit.chunks_exact_mut(BLOCK_SIZE_BYTES).enumerate() {
        if mask & (1 << place) == 0 {
            block.fill(0);
        }
    }
    let mut output = vec![0u8; packed::compress_buffer_bytes(unit.len())];
    let length = packed::recompress(&unit, &mut output)?;
    (length < bytes.len()).then(|| {
        output.truncate(length);
        (output, packed::unit_checksum(&unit))
    })
}

/// A fragment a cleaning round moves: its table entry and index in its start block, its
/// bytes as stored, and the unit repacked for the blocks it served when read when some
/// others had died (shared by the records of its unit's blocks).
#[derive(Clone)]
struct MovedFragment {
    entry: crate::layout::packed::FragmentEntry,
    index: usize,
    bytes: Arc<Vec<u8>>,
    repacked: Option<Arc<Repacked>>,
}

/// A unit compressed again with only the blocks of `mask` kept (the others zeroed).
struct Repacked {
    mask: u8,
    bytes: Vec<u8>,
    checksum: u32,
}
