//! Deterministic simulation of the engine (docs/crash-consistency.md).
//!
//! One seed picks a geometry and drives a random workload — whole and sub-block writes,
//! FUA writes, trims, zero writes, reads, flushes — against a volume on simulated
//! members (`IoMode::Inline`, so every device operation happens in one deterministic
//! order). Faults come from the same seed: crashes between operations and in the middle
//! of them (stripe writes, flushes, recovery itself), which drop or tear every unsynced
//! write; bit rot and latent read errors; a member that disappears mid-workload (the
//! volume goes on degraded), is replaced by a new device and rebuilt online, with crashes
//! inside the replacement and the rebuild; scrubs (which repair what the faults damaged,
//! crashes inside them too). The faults stay within what the RAID level covers: they only
//! ever hit one set of `failures_tolerated` members (a replacement takes its
//! predecessor's place in that set).
//!
//! A reference model checks, after every recovery, that the volume holds exactly the
//! effect of a prefix of the accepted block writes that includes everything acknowledged
//! before a completed flush, and checks every read against the model.
//!
//! Two workloads: `many_seeds` writes a small hot region (many overwrites of few blocks);
//! `filling_seeds` fills the whole logical space first and then overwrites all of it, so
//! that the cleaner runs all the time and crashes strike in the middle of its rounds.
//! In both, running out of space is itself a failure: the spare must always suffice.
//!
//! `beyond_redundancy_seeds` runs the filling workload with faults the RAID level does not
//! cover, on top of the budgeted ones: a live data block and the parity of its stripe row
//! rot or return latent read errors together (data and P of a RAID-5 row, data, P and Q of
//! a RAID-6 row, both halves of a mirror, the block itself on RAID-0), in rows that hold
//! only live data. Blocks are then lost for good, and the model checks what is left of the
//! promise: every read returns the block's right content or an I/O error, never anything
//! else — through cleaning (whose relocations must not turn an unreadable block into
//! data), scrub, rebuild, member loss and crashes; after every recovery the volume holds
//! a prefix of the writes that includes everything durable, blocks that fail to read
//! matching anything. Metadata (summaries) is damaged only within the budget: destroyed
//! beyond it, what recovery can and cannot tell is docs/crash-consistency.md's business.
//! The volume may run out of space here (segments holding unreadable blocks are pinned):
//! that ends the seed.
//!
//! `STRIPELOG_SIM_SEEDS=N` / `STRIPELOG_SIM_FILLING_SEEDS=N` /
//! `STRIPELOG_SIM_BEYOND_SEEDS=N` set how many seeds each runs (default 500 / 100 / 200)
//! and `STRIPELOG_SIM_FIRST_SEED` the first; `STRIPELOG_SIM_SEED=S` (with
//! `STRIPELOG_SIM_FILLING=1` for the filling workload, `STRIPELOG_SIM_BEYOND=1` for
//! faults beyond redundancy) replays one seed with a trace through the ignored
//! `replay_one_seed` (a failure prints the exact command).

use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, Prng, SimulatedArray, SimulatedDevice};
use stripelog_engine::format::CompressionSetting;
use stripelog_engine::geometry::Role;
use stripelog_engine::{
    CreateOptions, Error, IoMode, MaintenanceOptions, Mapping, MemberDevice, OpenOptions, RaidLevel, ReplaceOptions,
    Volume, WriteLogDevices, BLOCK_SIZE_BYTES,
};

const CHUNK_SIZE_BYTES: u32 = 64 << 10;
/// Operations per seed.
const OPERATION_COUNT: usize = 400;

type Content = Option<Arc<Vec<u8>>>;

/// A block as read back after a recovery: its content, or an I/O error (beyond-redundancy
/// faults only; it then matches any prefix).
#[derive(Clone)]
enum Actual {
    Read(Content),
    Unreadable,
}

/// The reference model: the state after the last recovery plus every block write
/// accepted since, in order.
struct Model {
    hot_blocks: u64,
    base: Vec<Content>,
    effects: Vec<(u64, Content)>,
    /// Effects that must survive any crash (acknowledged before a completed flush).
    durable_effects: usize,
    /// Effects known to be durable on the members themselves (a flush without a write
    /// log, a clean close): what must survive when the write log is lost with a crash.
    member_durable_effects: usize,
}

impl Model {
    fn current_block(&self, block: u64) -> Content {
        self.effects
            .iter()
            .rev()
            .find(|(effect_block, _)| *effect_block == block)
            .map_or_else(|| self.base[block as usize].clone(), |(_, content)| content.clone())
    }

    /// What the volume returned for `block`: zeros, a version the model knows, or other.
    fn describe_actual(&self, block: usize, actual: &Actual) -> String {
        let Actual::Read(actual) = actual else {
            return String::new();
        };
        let same = |content: &Content| content.as_deref().map(Vec::as_slice) == actual.as_deref().map(Vec::as_slice);
        let versions: Vec<usize> = (0..self.effects.len())
            .filter(|&index| self.effects[index].0 == block as u64 && same(&self.effects[index].1))
            .collect();
        let mut text = format!(
            " (it reads as {}; the base {}; written by effects {:?} of {})",
            if actual.is_none() { "zeros" } else { "data" },
            if same(&self.base[block]) { "matches" } else { "differs" },
            versions,
            self.effects.iter().enumerate().filter(|(_, effect)| effect.0 == block as u64).count()
        );
        if let (Some(actual), Some(base)) = (actual.as_deref(), self.base[block].as_deref()) {
            let differing = actual.iter().zip(base.iter()).filter(|(a, b)| a != b).count();
            text.push_str(&format!("; {differing} bytes differ from the base"));
        }
        text
    }

    fn push(&mut self, block: u64, content: Content) {
        let content = content.filter(|bytes| bytes.iter().any(|&b| b != 0));
        self.effects.push((block, content));
    }

    /// Find k ≥ `minimum` such that the volume equals base + effects[..k], unreadable
    /// blocks matching anything; make it the new base. Unreadable blocks take their
    /// content in that prefix as their base (what a later read must return, if any).
    fn settle(&mut self, actual: &[Actual], minimum: usize) -> Result<usize, String> {
        let mut state = self.base.clone();
        for (block, content) in &self.effects[..minimum] {
            state[*block as usize] = content.clone();
        }
        let same = |a: &Content, b: &Actual| match b {
            Actual::Read(b) => a.as_deref().map(Vec::as_slice) == b.as_deref().map(Vec::as_slice),
            Actual::Unreadable => true,
        };
        let mut mismatches = (0..self.hot_blocks as usize).filter(|&b| !same(&state[b], &actual[b])).count();
        let mut found = (mismatches == 0).then_some(minimum);
        let mut first_mismatch = (0..self.hot_blocks as usize).find(|&b| !same(&state[b], &actual[b]));
        for k in minimum..self.effects.len() {
            let (block, content) = &self.effects[k];
            let block = *block as usize;
            let before = same(&state[block], &actual[block]);
            state[block] = content.clone();
            let after = same(&state[block], &actual[block]);
            mismatches = mismatches + usize::from(before && !after) - usize::from(!before && after);
            if mismatches == 0 {
                found = Some(k + 1);
            }
            if first_mismatch.is_none() && !after {
                first_mismatch = Some(block);
            }
        }
        let Some(k) = found else {
            let what = first_mismatch.map(|block| self.describe_actual(block, &actual[block])).unwrap_or_default();
            // `state` now holds every effect: what still differs from it.
            let differing: Vec<String> = (0..self.hot_blocks as usize)
                .filter(|&block| !same(&state[block], &actual[block]))
                .take(3)
                .map(|block| format!("{block}{}", self.describe_actual(block, &actual[block])))
                .collect();
            return Err(format!(
                "no prefix of the {} accepted block writes (at least {minimum}) matches the volume; first mismatching block {:?}{what}; against all of them: {}",
                self.effects.len(),
                first_mismatch,
                differing.join(", ")
            ));
        };
        let mut base = self.base.clone();
        for (block, content) in &self.effects[..k] {
            base[*block as usize] = content.clone();
        }
        self.base = base;
        self.effects.clear();
        self.durable_effects = 0;
        self.member_durable_effects = 0;
        Ok(k)
    }
}

struct Simulation {
    seed: u64,
    prng: Prng,
    array: SimulatedArray,
    devices: Vec<Arc<SimulatedDevice>>,
    /// Members that may be lost, and that faults may hit within the budget (as many as the
    /// RAID level tolerates).
    fault_members: Vec<usize>,
    /// Faults beyond what the RAID level covers (see the module documentation).
    beyond_redundancy: bool,
    /// Why the seed ended early (beyond redundancy: the volume lost or full).
    ended: Option<String>,
    /// Reads that failed with an I/O error (beyond redundancy).
    unreadable_reads: u64,
    /// Writes a thin volume refused at its provisioned size.
    thin_refusals: u64,
    /// The most blocks deduplication saved at a recovery.
    shared_blocks_seen: u64,
    /// The most compressed shared copies at a recovery, and those the cleaner moved.
    compressed_copies_seen: u64,
    compressed_copies_moved: u64,
    /// Rows damaged beyond redundancy.
    rows_destroyed: u64,
    /// The engine's durable frontier when the volume was last dropped by a crash (0 after
    /// a clean close, which records it in the superblocks).
    durable_sequence_at_crash: u64,
    missing_member: Option<usize>,
    member_size_bytes: u64,
    raid_level: RaidLevel,
    model: Model,
    volume: Option<Volume>,
    trace: bool,
    recoveries: u64,
    crashes_mid_operation: u64,
    faults_injected: u64,
    members_lost: u64,
    rebuilds_finished: u64,
    scrubs_finished: u64,
    out_of_space: u64,
    /// Cleaning rounds over every incarnation of the volume.
    cleaning_rounds: u64,
    /// Clients' batches sealed as a pair with a cold batch (feature bit 5).
    client_batch_pairs: u64,
    /// The filling workload: every logical block is written, then overwritten.
    filling: bool,
    /// The seed runs with a write log (`write_log_seeds`).
    write_log_mode: bool,
    /// The devices of the volume's write log, when it has one.
    log: Option<SimulatedLog>,
    /// The last open found the write log lost and opened without it (acknowledged writes
    /// only the log held may be missing: the model checks what the members held).
    opened_without_log: bool,
    log_devices_lost: u64,
    log_faults: u64,
    logs_added: u64,
    log_entries_replayed: u64,
    opens_without_log: u64,
}

/// A write log in the simulated array: one device, or a mirror of two of which one (the
/// fault device) may be lost or damaged. A single device may be lost too: that is the
/// case the write log cannot cover when a crash follows before the volume notices.
struct SimulatedLog {
    devices: Vec<Arc<SimulatedDevice>>,
    missing: Vec<bool>,
    fault_device: Option<usize>,
}

/// One seed in three keeps the checksums of a single segment per cache shard, so that
/// tables are evicted and rebuilt from the summaries under every workload (the seed, not
/// the generator, decides: every other choice of a seed stays as it was).
fn open_options(seed: u64) -> OpenOptions {
    OpenOptions {
        read_only: false,
        flush_interval: None,
        io_mode: IoMode::Inline,
        // A third of the seeds cache recent writes in the data sets of written batches
        // (half of 4 MiB: several sets, the rest of the cache too small for one).
        cache_size_bytes: if seed % 3 == 1 { 4 << 20 } else { 256 << 10 },
        checksum_cache_bytes: if seed.is_multiple_of(3) { 0 } else { 64 << 20 },
        // A quarter of the seeds keep no clean index page in RAM: every page is evicted
        // once a checkpoint holds it and read back from there, under every workload.
        map_cache_bytes: if seed % 4 == 1 { Some(0) } else { None },
        // Half the seeds checkpoint at every flush, so that crashes land inside
        // checkpoints and mounts start from recent ones; the rest only at open and close.
        checkpoint_interval: if seed.is_multiple_of(2) {
            std::time::Duration::ZERO
        } else {
            std::time::Duration::from_secs(3600)
        },
        // Compressed seeds store every compressible block as a fragment, or half of them
        // (the CPU-adaptive share, fixed here: deterministic).
        compression_share: compressed(seed).then_some(if seed % 10 == 2 { 1000 } else { 500 }),
        ..OpenOptions::default()
    }
}

/// A fifth of the seeds run on a volume created with compression, writing compressible
/// and incompressible blocks (docs/compression.md).
fn compressed(seed: u64) -> bool {
    seed % 5 == 2
}

/// A quarter of the seeds run on a volume created with deduplication
/// (docs/deduplication.md), writing many duplicates: blocks drawn from a small pool, and
/// copies of what other ranges hold (runs). After every recovery the index's references
/// must match the shared-block records' counts, besides the ordered prefix.
fn deduplicated(seed: u64) -> bool {
    seed % 4 == 3
}

/// Distinct contents the duplicates of a deduplicated seed are drawn from.
const DUPLICATE_POOL: u64 = 6;

/// A seventh of the seeds run on a thinly provisioned volume of twice its provisioned
/// size (docs/deduplication.md, decision 10): filling seeds reach the limit, and writes
/// beyond it are refused with nothing of them accepted, while trims make room again.
fn thin(seed: u64) -> bool {
    seed % 7 == 4
}

/// Two thirds of the filling seeds send four fifths of their whole-block writes to the
/// first fifth of the blocks: the rest of the volume is written seldom, its writes go to
/// the cold stream, and crashes tear pairs of batches (feature bit 5,
/// docs/crash-consistency.md, "Client writes in two streams").
fn skewed(seed: u64) -> bool {
    !seed.is_multiple_of(3)
}

impl Simulation {
    fn new(seed: u64, trace: bool, filling: bool, beyond_redundancy: bool) -> Result<Simulation, String> {
        let mut prng = Prng::new(seed);
        let (raid_level, member_count) = match prng.below(4) {
            0 => (RaidLevel::Raid0, 1 + prng.below(3) as usize),
            1 => (RaidLevel::Raid10, 2 + 2 * prng.below(2) as usize),
            2 => (RaidLevel::Raid5, 3 + prng.below(4) as usize),
            _ => (RaidLevel::Raid6, 4 + prng.below(4) as usize),
        };
        let member_size_bytes = (3 + prng.below(4)) << 20;
        let array = SimulatedArray::new(seed ^ 0x5EED);
        let devices: Vec<_> = (0..member_count).map(|_| array.add_device(member_size_bytes)).collect();
        let tolerated = raid_level.failures_tolerated();
        let mut fault_members = Vec::new();
        while fault_members.len() < tolerated {
            let candidate = prng.below(member_count as u64) as usize;
            // RAID-10: never both halves of one mirror.
            let clashes =
                raid_level == RaidLevel::Raid10 && fault_members.iter().any(|&m: &usize| m / 2 == candidate / 2);
            if !fault_members.contains(&candidate) && !clashes {
                fault_members.push(candidate);
            }
        }
        let options = CreateOptions {
            raid_level,
            chunk_size_bytes: CHUNK_SIZE_BYTES,
            // These volumes have 47 to 95 segments: 40 % is spare, which leaves room beyond
            // `working_spare_segments` (20 here: the cleaner's reserve, the checkpoint's
            // headroom, the room kept for trims, each of the five streams' open and
            // reserved segments) on the smallest. At a fifth, 12 of 100 filling seeds ran out of space once streams
            // reserved their next segments; at a quarter, 14 once the metadata stream came.
            spare_ppm: 400_000,
            volume_uuid: Some(seed.to_le_bytes().repeat(2).try_into().expect("16 bytes")),
            force: false,
            compression: if compressed(seed) { CompressionSetting::Lz4 } else { CompressionSetting::Off },
            deduplication: deduplicated(seed),
            client_write_pairs: true,
            logical_size_bytes: if thin(seed) {
                let geometry = stripelog_engine::Geometry::new(
                    raid_level,
                    member_count,
                    CHUNK_SIZE_BYTES,
                    400_000,
                    member_size_bytes,
                )
                .map_err(|error| format!("geometry: {error}"))?;
                Some(2 * geometry.provisioned_block_count() * BLOCK_SIZE_BYTES as u64)
            } else {
                None
            },
        };
        let members = devices
            .iter()
            .enumerate()
            .map(|(index, device)| MemberDevice {
                name: format!("sim{index}"),
                device: Some(device.clone() as Arc<dyn BlockDevice>),
            })
            .collect();
        let volume =
            Volume::create(members, &options, &open_options(seed)).map_err(|error| format!("create: {error}"))?;
        let logical_blocks = volume.logical_size_bytes() / BLOCK_SIZE_BYTES as u64;
        let hot_blocks = if filling { logical_blocks } else { (logical_blocks / 3).clamp(8, 384) };
        if trace {
            eprintln!("seed {seed}: {raid_level} × {member_count}, {member_size_bytes} B members, {logical_blocks} logical blocks, hot {hot_blocks}, fault members {fault_members:?}, beyond redundancy {beyond_redundancy}");
        }
        Ok(Simulation {
            seed,
            prng,
            array,
            devices,
            fault_members,
            beyond_redundancy,
            ended: None,
            unreadable_reads: 0,
            thin_refusals: 0,
            shared_blocks_seen: 0,
            compressed_copies_seen: 0,
            compressed_copies_moved: 0,
            rows_destroyed: 0,
            durable_sequence_at_crash: 0,
            missing_member: None,
            member_size_bytes,
            raid_level,
            model: Model {
                hot_blocks,
                base: vec![None; hot_blocks as usize],
                effects: Vec::new(),
                durable_effects: 0,
                member_durable_effects: 0,
            },
            volume: Some(volume),
            trace,
            recoveries: 0,
            crashes_mid_operation: 0,
            faults_injected: 0,
            members_lost: 0,
            rebuilds_finished: 0,
            scrubs_finished: 0,
            out_of_space: 0,
            cleaning_rounds: 0,
            client_batch_pairs: 0,
            filling,
            write_log_mode: false,
            log: None,
            opened_without_log: false,
            log_devices_lost: 0,
            log_faults: 0,
            logs_added: 0,
            log_entries_replayed: 0,
            opens_without_log: 0,
        })
    }

    /// The options of every open: the seed's, and the write log's devices (a lost one
    /// missing).
    fn open_options(&self) -> OpenOptions {
        let mut options = open_options(self.seed);
        if let Some(log) = &self.log {
            let devices = log
                .devices
                .iter()
                .zip(&log.missing)
                .map(|(device, &missing)| (!missing).then(|| device.clone() as Arc<dyn BlockDevice>))
                .collect();
            options.write_log_devices = Some(WriteLogDevices(devices));
        }
        options
    }

    /// Give the freshly created volume a write log (closed, given the log, reopened).
    fn start_with_log(&mut self) -> Result<(), String> {
        self.write_log_mode = true;
        let volume = self.volume.take().expect("open");
        volume.close().map_err(|error| format!("close before adding the log: {error}"))?;
        self.add_log().map_err(|error| format!("add the write log: {error}"))?;
        let volume = Volume::open(self.members(), &self.open_options())
            .map_err(|error| format!("open with the log: {error}"))?;
        self.volume = Some(volume);
        Ok(())
    }

    /// Give the closed volume a new write log on new devices: one, or a mirror of two
    /// (half of the time), of 3 to 5 MiB (the smallest log holds four of the largest
    /// records: it wraps and fills often).
    fn add_log(&mut self) -> Result<(), Error> {
        let mirrored = self.prng.chance(1, 2);
        let size_bytes = (3 << 20) + self.prng.below(512) * BLOCK_SIZE_BYTES as u64;
        let devices: Vec<_> = (0..1 + usize::from(mirrored)).map(|_| self.array.add_device(size_bytes)).collect();
        let fault_device = mirrored.then(|| self.prng.below(2) as usize);
        if self.trace {
            eprintln!("  new write log: {} device(s) of {size_bytes} B, fault device {fault_device:?}", devices.len());
        }
        let log_members = devices
            .iter()
            .enumerate()
            .map(|(index, device)| MemberDevice {
                name: format!("simlog{}-{index}", self.logs_added),
                device: Some(device.clone() as Arc<dyn BlockDevice>),
            })
            .collect();
        // Known before it is written: a crash inside leaves a volume that may name it.
        self.log = Some(SimulatedLog { missing: vec![false; devices.len()], devices, fault_device });
        self.logs_added += 1;
        Volume::add_write_log(self.members(), log_members)
    }

    /// A device of the write log disappears while the volume serves: the fault device of
    /// a mirror (the other goes on), or the only device (the volume must notice at its
    /// next append and sync the members instead; a crash before that loses what only the
    /// log held, and mount must refuse to go on silently).
    fn lose_log_device(&mut self) -> Result<(), String> {
        let in_use = self.volume().stats().write_log.is_some_and(|log| log.active);
        let Some(log) = self.log.as_mut().filter(|_| in_use) else {
            return Ok(());
        };
        let index = log.fault_device.unwrap_or(0);
        if log.missing[index] {
            return Ok(());
        }
        if self.trace {
            eprintln!("  write log device {index} of {} disappears", log.devices.len());
        }
        log.missing[index] = true;
        log.devices[index].remove();
        self.log_devices_lost += 1;
        Ok(())
    }

    /// Rot or a latent read error on the fault device of a mirrored log (anywhere: its
    /// superblocks, live records, dead ones).
    fn inject_log_fault(&mut self) -> bool {
        let Some((device, _)) = self.log.as_ref().and_then(|log| {
            log.fault_device.filter(|&index| !log.missing[index]).map(|index| (log.devices[index].clone(), index))
        }) else {
            return false;
        };
        let offset = self.prng.below(device.size_bytes());
        if self.prng.chance(1, 2) {
            device.flip_bit(offset, self.prng.below(8) as u8);
        } else {
            device.inject_read_error(offset);
        }
        if self.trace {
            eprintln!("  fault on the write log's fault device at {offset}");
        }
        self.log_faults += 1;
        true
    }

    /// Whether every device of the log is lost (the one case mount may refuse).
    fn log_lost(&self) -> bool {
        self.log.as_ref().is_some_and(|log| log.missing.iter().all(|&missing| missing))
    }

    /// After a flush or FUA write returned: without a working log it synced the members.
    fn flushed(&mut self) {
        self.model.durable_effects = self.model.effects.len();
        if self.volume().stats().write_log.is_none_or(|log| !log.active) {
            self.model.member_durable_effects = self.model.effects.len();
        }
    }

    /// Open the volume after a crash. A lost log makes mount refuse (`WriteLogMissing`):
    /// only legitimate when every device of the log is lost; the volume is then opened
    /// without it, as `--force-without-log` does.
    fn open_after_crash(&mut self) -> Result<Volume, Error> {
        match Volume::open(self.members(), &self.open_options()) {
            Err(Error::WriteLogMissing(reason)) if !self.array.has_crashed() && self.log_lost() => {
                if self.trace {
                    eprintln!("  mount refuses: {reason}; opened without the log");
                }
                self.opened_without_log = true;
                self.opens_without_log += 1;
                Volume::open(self.members(), &OpenOptions { force_without_log: true, ..self.open_options() })
            }
            other => other,
        }
    }

    /// Write every logical block once (large writes), and flush.
    fn fill(&mut self) -> Result<(), String> {
        const RUN_BLOCKS: u64 = 48;
        let hot = self.model.hot_blocks;
        let mut first = 0;
        while first < hot {
            let count = RUN_BLOCKS.min(hot - first);
            let mut data = Vec::with_capacity((count as usize) * BLOCK_SIZE_BYTES);
            let effects_before = self.model.effects.len();
            for block in first..first + count {
                let content = self.random_content();
                self.model.push(block, Some(Arc::new(content.clone())));
                data.extend(content);
            }
            match self.volume().write(first * BLOCK_SIZE_BYTES as u64, &data, false) {
                Ok(()) => {}
                // A thin volume holds its provisioned size: the fill ends there.
                Err(Error::ThinLimit { .. }) if thin(self.seed) => {
                    self.model.effects.truncate(effects_before);
                    self.thin_refusals += 1;
                    break;
                }
                Err(error) => return Err(format!("fill at block {first}: {error}")),
            }
            first += count;
        }
        self.flush()
    }

    fn volume(&self) -> &Volume {
        self.volume.as_ref().expect("the volume is open")
    }

    fn random_content(&mut self) -> Vec<u8> {
        let mut block = vec![0u8; BLOCK_SIZE_BYTES];
        if deduplicated(self.seed) && self.prng.chance(1, 2) {
            // One of a few contents, again and again.
            let pool = self.prng.below(DUPLICATE_POOL);
            Prng::new(self.seed ^ (0xD0_0000 + pool)).fill(&mut block);
            if compressed(self.seed) && pool.is_multiple_of(2) {
                // Half of them compress: their shared copies are fragments (decision 11).
                let random_bytes = (pool as usize + 1) * 300;
                for (index, byte) in block[random_bytes..].iter_mut().enumerate() {
                    *byte = (pool as u8).wrapping_add((index / 32) as u8);
                }
            }
            return block;
        }
        if !self.prng.chance(1, 10) {
            self.prng.fill(&mut block);
            // On compressed seeds, two blocks in three compress (fragments of tens to
            // thousands of bytes: one to sixteen to a packed block).
            if compressed(self.seed) && !self.prng.chance(1, 3) {
                let random_bytes = self.prng.below(BLOCK_SIZE_BYTES as u64) as usize;
                let pattern = self.prng.below(256) as u8;
                for (index, byte) in block[random_bytes..].iter_mut().enumerate() {
                    *byte = pattern.wrapping_add((index / 32) as u8);
                }
            }
        }
        block
    }

    fn run(&mut self) -> Result<(), String> {
        for step in 0..OPERATION_COUNT {
            let choice = self.prng.below(100);
            let outcome = match choice {
                0..=34 => self.write(false),
                35..=39 => self.write(true),
                40..=44 => self.ranged(true),
                45..=49 => self.ranged(false),
                50..=69 => self.read(),
                70..=79 => self.flush(),
                80..=82 => self.crash_now(),
                83..=85 => self.schedule_crash(),
                86..=93 => self.inject_fault(),
                94..=95 => self.reopen_cleanly(),
                96 if self.write_log_mode && self.prng.chance(1, 2) => self.lose_log_device(),
                96 => self.lose_member(),
                97 => self.replace_member(),
                98 => self.scrub(),
                _ => self.read(),
            };
            if let Err(message) = outcome {
                return Err(format!("step {step} (choice {choice}): {message}"));
            }
            self.trace_watched_block(step);
            if self.ended.is_some() {
                return Ok(());
            }
            // Every invariant of the engine's in-RAM state, after every step (a violated
            // one panics, which fails the seed with its replay command).
            if let Some(volume) = &self.volume {
                volume.check_invariants().map_err(|error| format!("step {step}: invariants: {error}"))?;
            }
        }
        self.crash_now()?;
        if self.ended.is_some() {
            return Ok(());
        }
        let report = self.volume().check().map_err(|error| format!("check: {error}"))?;
        if !report.shared_records_miscounted.is_empty() || report.shared_references_to_free_records > 0 {
            return Err(format!("check found shared-block counts wrong: {report:?}"));
        }
        if self.beyond_redundancy {
            // Whatever check calls unrecoverable must read as an I/O error, and everything
            // else as its content.
            return self.read_everything();
        }
        if !report.logical_blocks_unrecoverable.is_empty() {
            return Err(format!("check found unrecoverable live blocks within the fault budget: {report:?}"));
        }
        Ok(())
    }

    /// With a trace and `STRIPELOG_SIM_WATCH=BLOCK`: that block's mapping after every step.
    fn trace_watched_block(&self, step: usize) {
        let watched = std::env::var("STRIPELOG_SIM_WATCH").ok().and_then(|value| value.parse::<u64>().ok());
        if let (true, Some(block), Some(volume)) = (self.trace, watched, self.volume.as_ref()) {
            let stats = volume.stats();
            eprintln!(
                "  [step {step}] block {block}: {:?}; last sealed {}, durable {}",
                volume.mapping(block),
                stats.last_sequence,
                stats.durable_through_sequence
            );
        }
    }

    /// Read every hot block: its content, or (beyond redundancy) an I/O error.
    fn read_everything(&mut self) -> Result<(), String> {
        let mut buffer = vec![0u8; BLOCK_SIZE_BYTES];
        for block in 0..self.model.hot_blocks {
            match self.volume().read(block * BLOCK_SIZE_BYTES as u64, &mut buffer) {
                Ok(()) => self.check_read(block, &buffer)?,
                // A crash scheduled by the step before struck while it read (the index page
                // a read needs is read from the members too).
                Err(error) if self.array.has_crashed() => return self.after_error("read", error),
                Err(error) => self.unreadable(block, error)?,
            }
        }
        Ok(())
    }

    /// A block read back must be the model's content for it.
    fn check_read(&self, block: u64, actual: &[u8]) -> Result<(), String> {
        let expected = self.model.current_block(block);
        let matches = match &expected {
            Some(content) => content.as_slice() == actual,
            None => actual.iter().all(|&b| b == 0),
        };
        if matches {
            Ok(())
        } else {
            Err(format!("read of block {block} returned the wrong content"))
        }
    }

    /// A read of `block` failed: acceptable beyond redundancy when it is an I/O error
    /// for a block the faults destroyed; never within the budget.
    fn unreadable(&mut self, block: u64, error: Error) -> Result<(), String> {
        if self.beyond_redundancy && matches!(error, Error::Unrecoverable { .. }) {
            self.unreadable_reads += 1;
            if self.trace {
                eprintln!("  block {block} unreadable: {error}");
            }
            return Ok(());
        }
        Err(format!("read of block {block} failed: {error}"))
    }

    /// Handle an operation's error: expected after a (scheduled) crash or when full;
    /// afterwards the volume is recovered and checked against the model.
    fn after_error(&mut self, what: &str, error: Error) -> Result<(), String> {
        if matches!(error, Error::OutOfSpace) && !self.array.has_crashed() {
            if self.beyond_redundancy {
                // Segments holding blocks lost beyond repair are pinned: they eat the spare.
                self.out_of_space += 1;
                self.ended = Some(format!("{what} ran out of space (pinned segments)"));
                return Ok(());
            }
            return Err(format!("{what} ran out of space with the spare fraction held back"));
        }
        if !self.array.has_crashed() {
            return Err(format!("{what} failed without a crash: {error}"));
        } else {
            self.crashes_mid_operation += 1;
        }
        if self.trace {
            eprintln!("  {what}: {error} → recover");
        }
        self.crash_now()
    }

    fn write(&mut self, fua: bool) -> Result<(), String> {
        let hot = self.model.hot_blocks;
        let sub_block = self.prng.chance(3, 10);
        let (offset, data) = if sub_block {
            let sectors_per_block = (BLOCK_SIZE_BYTES / 512) as u64;
            let start_sector = self.prng.below(hot * sectors_per_block);
            let sector_count = 1 + self.prng.below(16.min(hot * sectors_per_block - start_sector));
            let mut data = vec![0u8; (sector_count * 512) as usize];
            if !self.prng.chance(1, 8) {
                self.prng.fill(&mut data);
            }
            (start_sector * 512, data)
        } else {
            let first = if self.filling && skewed(self.seed) && self.prng.chance(4, 5) {
                self.prng.below(hot.div_ceil(5))
            } else {
                self.prng.below(hot)
            };
            let longest = if self.prng.chance(1, if self.filling { 2 } else { 4 }) { 48 } else { 8 };
            let count = 1 + self.prng.below(longest.min(hot - first));
            let mut data = Vec::new();
            if deduplicated(self.seed) && self.prng.chance(1, 4) {
                // A copy of what another range holds now (a run of duplicates).
                let source = self.prng.below(hot - count + 1);
                for block in source..source + count {
                    match self.model.current_block(block) {
                        Some(content) => data.extend_from_slice(&content),
                        None => data.extend(std::iter::repeat_n(0u8, BLOCK_SIZE_BYTES)),
                    }
                }
            } else {
                for _ in 0..count {
                    data.extend(self.random_content());
                }
            }
            (first * BLOCK_SIZE_BYTES as u64, data)
        };
        // Effects per block, merged with the model's current content (as the engine does).
        let effects_before = self.model.effects.len();
        let block_size = BLOCK_SIZE_BYTES as u64;
        let mut position = offset;
        let end = offset + data.len() as u64;
        while position < end {
            let block = position / block_size;
            let within = (position % block_size) as usize;
            let count = ((block_size - within as u64).min(end - position)) as usize;
            let mut content =
                self.model.current_block(block).map_or_else(|| vec![0u8; BLOCK_SIZE_BYTES], |c| c.to_vec());
            let source = (position - offset) as usize;
            content[within..within + count].copy_from_slice(&data[source..source + count]);
            self.model.push(block, Some(Arc::new(content)));
            position += count as u64;
        }
        if self.trace {
            eprintln!("  write {offset}+{} fua={fua}", data.len());
        }
        match self.volume().write(offset, &data, fua) {
            Ok(()) => {
                if fua {
                    self.flushed();
                }
                Ok(())
            }
            Err(error) => self.refused_or_error("write", error, effects_before),
        }
    }

    fn ranged(&mut self, trim: bool) -> Result<(), String> {
        let hot_bytes = self.model.hot_blocks * BLOCK_SIZE_BYTES as u64;
        let offset = self.prng.below(hot_bytes / 512) * 512;
        let length = (1 + self.prng.below(((hot_bytes - offset) / 512).min(64))) * 512;
        let block_size = BLOCK_SIZE_BYTES as u64;
        let effects_before = self.model.effects.len();
        let mut position = offset;
        // The engine accepts the partial blocks at the edges first, then the whole ones.
        let mut whole = Vec::new();
        while position < offset + length {
            let block = position / block_size;
            let within = (position % block_size) as usize;
            let count = ((block_size - within as u64).min(offset + length - position)) as usize;
            match self.model.current_block(block) {
                Some(existing) if count < BLOCK_SIZE_BYTES => {
                    let mut merged = existing.to_vec();
                    merged[within..within + count].fill(0);
                    self.model.push(block, Some(Arc::new(merged)));
                }
                _ if count < BLOCK_SIZE_BYTES => self.model.push(block, None),
                _ => whole.push(block),
            }
            position += count as u64;
        }
        for block in whole {
            self.model.push(block, None);
        }
        if self.trace {
            eprintln!("  {} {offset}+{length}", if trim { "trim" } else { "write-zeroes" });
        }
        let result =
            if trim { self.volume().trim(offset, length) } else { self.volume().write_zeroes(offset, length, false) };
        result.or_else(|error| self.refused_or_error("trim/zero", error, effects_before))
    }

    /// A write, trim or zero-write failed. Beyond redundancy, an I/O error for a partial
    /// block whose old content is lost refuses the whole request before any of it is
    /// accepted: the model forgets its effects. Anything else is `after_error`.
    fn refused_or_error(&mut self, what: &str, error: Error, effects_before: usize) -> Result<(), String> {
        if matches!(error, Error::ThinLimit { .. }) && !self.array.has_crashed() {
            if !thin(self.seed) {
                return Err(format!("{what} refused as beyond a thin volume's limit on a volume that is not thin"));
            }
            // Refused whole, before anything of it was accepted.
            self.model.effects.truncate(effects_before);
            self.thin_refusals += 1;
            return Ok(());
        }
        if self.beyond_redundancy && matches!(error, Error::Unrecoverable { .. }) && !self.array.has_crashed() {
            if self.trace {
                eprintln!("  {what} refused: {error}");
            }
            self.model.effects.truncate(effects_before);
            self.unreadable_reads += 1;
            return Ok(());
        }
        self.after_error(what, error)
    }

    fn read(&mut self) -> Result<(), String> {
        let hot = self.model.hot_blocks;
        let first = self.prng.below(hot);
        let count = 1 + self.prng.below(16.min(hot - first));
        let mut buffer = vec![0u8; (count * BLOCK_SIZE_BYTES as u64) as usize];
        match self.volume().read(first * BLOCK_SIZE_BYTES as u64, &mut buffer) {
            Ok(()) => {}
            Err(error @ Error::Unrecoverable { .. }) if self.beyond_redundancy && !self.array.has_crashed() => {
                // One block of the range is lost: read them one by one.
                if self.trace {
                    eprintln!("  read {first}+{count}: {error}");
                }
                for block in first..first + count {
                    let mut one = vec![0u8; BLOCK_SIZE_BYTES];
                    match self.volume().read(block * BLOCK_SIZE_BYTES as u64, &mut one) {
                        Ok(()) => self.check_read(block, &one)?,
                        Err(error) if self.array.has_crashed() => return self.after_error("read", error),
                        Err(error) => self.unreadable(block, error)?,
                    }
                }
                return Ok(());
            }
            Err(error) => return self.after_error("read", error),
        }
        for (index, actual) in buffer.chunks(BLOCK_SIZE_BYTES).enumerate() {
            self.check_read(first + index as u64, actual)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        if self.trace {
            eprintln!("  flush");
        }
        match self.volume().flush() {
            Ok(()) => {
                self.flushed();
                Ok(())
            }
            Err(error) => self.after_error("flush", error),
        }
    }

    fn schedule_crash(&mut self) -> Result<(), String> {
        self.schedule_crash_within(60);
        Ok(())
    }

    fn inject_fault(&mut self) -> Result<(), String> {
        if self.write_log_mode && self.prng.chance(1, 4) && self.inject_log_fault() {
            return Ok(());
        }
        // A quarter of the faults destroy a row: about eight a seed, each of which pins a
        // segment; many more and the pinned segments fill the spare early.
        if self.beyond_redundancy && self.prng.chance(1, 4) {
            self.destroy_a_live_row();
            return Ok(());
        }
        let Some(&member) = self.fault_members.get(self.prng.below(self.fault_members.len().max(1) as u64) as usize)
        else {
            return Ok(());
        };
        let offset = self.random_data_offset();
        self.inject_fault_on(member, offset);
        Ok(())
    }

    /// A byte offset in the data area of a member (never the superblocks).
    fn random_data_offset(&mut self) -> u64 {
        CHUNK_SIZE_BYTES as u64 + self.prng.below(self.member_size_bytes - CHUNK_SIZE_BYTES as u64)
    }

    /// Damage a live data block beyond what its stripe row can rebuild: its own copies and
    /// the row's parity (rot, or latent read errors on the fault members), in a row whose
    /// every data position is a live data block — never a row holding a summary: metadata
    /// stays within the budget.
    fn destroy_a_live_row(&mut self) {
        const ATTEMPTS: usize = 16;
        let Some(volume) = self.volume.as_ref() else { return };
        let geometry = volume.geometry().clone();
        let live: std::collections::HashSet<u64> = (0..self.model.hot_blocks)
            .filter_map(|block| volume.mapping(block).ok().and_then(Mapping::position))
            .collect();
        let mut candidates: Vec<u64> = live.iter().copied().collect();
        candidates.sort_unstable();
        if candidates.is_empty() {
            return;
        }
        for _ in 0..ATTEMPTS {
            let position = candidates[self.prng.below(candidates.len() as u64) as usize];
            let location = geometry.locate(position);
            let row_is_live = (0..geometry.data_columns())
                .all(|column| live.contains(&geometry.position(location.segment, location.row, column)));
            if !row_is_live {
                continue;
            }
            let mut members = geometry.members_of_column(location.segment, location.column);
            members.extend(
                (0..geometry.parity_shards())
                    .map(|shard| geometry.member_of_role(location.segment, Role::Parity { shard })),
            );
            let offset =
                geometry.member_offset_bytes(location.segment, location.row) + self.prng.below(BLOCK_SIZE_BYTES as u64);
            if self.trace {
                eprintln!("  beyond redundancy: position {position} (row {location:?}) on members {members:?}");
            }
            for member in members {
                if self.fault_members.contains(&member) {
                    self.inject_fault_on(member, offset);
                } else {
                    // Rot only: latent read errors in a row make the engine fail a member,
                    // and a member outside the fault set failing would take metadata beyond
                    // the budget too.
                    let bit = self.prng.below(8) as u8;
                    self.devices[member].flip_bit(offset, bit);
                    self.faults_injected += 1;
                }
            }
            self.rows_destroyed += 1;
            return;
        }
    }

    fn inject_fault_on(&mut self, member: usize, offset: u64) {
        let device = &self.devices[member];
        if self.prng.chance(1, 2) {
            let bit = self.prng.below(8) as u8;
            device.flip_bit(offset, bit);
        } else {
            device.inject_read_error(offset);
        }
        self.faults_injected += 1;
        if self.trace {
            eprintln!("  fault on member {member} at {offset}");
        }
    }

    /// A fault member disappears while the volume serves: the volume must go on degraded.
    /// The engine notices at its next write or read of it, or at a health check (half of
    /// the time one runs now).
    fn lose_member(&mut self) -> Result<(), String> {
        // Not while a member is missing or failed (the engine fails one after read errors
        // in a row): one more loss would be beyond the level.
        if self.missing_member.is_some() || self.fault_members.is_empty() || self.volume().stats().degraded {
            return Ok(());
        }
        let member = self.fault_members[self.prng.below(self.fault_members.len() as u64) as usize];
        if self.trace {
            eprintln!("  member {member} disappears");
        }
        self.missing_member = Some(member);
        self.members_lost += 1;
        self.devices[member].remove();
        if self.prng.chance(1, 2) {
            if let Err(error) = self.volume().check_member_health() {
                return self.after_error("health check", error);
            }
        }
        Ok(())
    }

    /// Replace a failed member with a new device and rebuild it online; or finish a
    /// rebuild a crash interrupted. Half of the time a crash is scheduled somewhere in
    /// the replacement or the rebuild.
    fn replace_member(&mut self) -> Result<(), String> {
        if let Err(error) = self.volume().check_member_health() {
            return self.after_error("health check", error);
        }
        let failed = self.volume().stats().members.iter().find(|member| member.state == "failed").map(|m| m.index);
        if failed.is_none() && self.volume().rebuilding_members().is_empty() {
            return Ok(());
        }
        if self.prng.chance(1, 2) {
            self.schedule_crash_within(300);
        }
        if let Some(member) = failed {
            let replacement = self.array.add_device(self.member_size_bytes);
            if self.trace {
                eprintln!("  member {member} replaced by a new device");
            }
            // From now on the new device is the member: recovery is given it.
            self.devices[member] = replacement.clone();
            self.missing_member = None;
            let device = MemberDevice { name: format!("sim{member}-new"), device: Some(replacement) };
            if let Err(error) = self.volume().replace_member(member, device, &ReplaceOptions::default()) {
                return self.after_error("replace", error);
            }
        }
        match self.volume().rebuild(&MaintenanceOptions::default(), &|_| {}) {
            Ok(report) => {
                self.rebuilds_finished += 1;
                if self.trace {
                    eprintln!("  rebuilt: {report:?}");
                }
                let check = self.volume().check();
                if self.array.has_crashed() {
                    // The scheduled crash struck inside the check: its findings mean nothing.
                    return self.crash_now();
                }
                let check = check.map_err(|error| format!("check after the rebuild: {error}"))?;
                // Fully redundant, except for members failed meanwhile (the simulation's
                // latent read errors can fail another fault member: 8 in a row).
                let failed: Vec<usize> = self
                    .volume()
                    .stats()
                    .members
                    .iter()
                    .filter(|member| member.state == "failed")
                    .map(|member| member.index)
                    .collect();
                if self.beyond_redundancy {
                    // What the rebuild could not reconstruct reads as errors, the rest right.
                    return self.read_everything();
                }
                if check.members_not_redundant != failed || !check.logical_blocks_unrecoverable.is_empty() {
                    return Err(format!("after the rebuild the volume is not fully redundant: {check:?}"));
                }
                Ok(())
            }
            Err(error) => self.after_error("rebuild", error),
        }
    }

    /// Scrub the volume (a crash scheduled inside it a third of the time): within the
    /// fault budget nothing may be unrecoverable.
    fn scrub(&mut self) -> Result<(), String> {
        if self.prng.chance(1, 3) {
            self.schedule_crash_within(300);
        }
        match self.volume().scrub(&MaintenanceOptions::default(), &|_| {}) {
            Ok(report) => {
                self.scrubs_finished += 1;
                if self.trace {
                    eprintln!("  scrub: {report:?}");
                }
                if self.array.has_crashed() {
                    // The crash struck while it read: what it could not read means nothing.
                    return self.crash_now();
                }
                if self.beyond_redundancy {
                    // The scrub's repairs (relocations) must not have turned a lost block
                    // into data: everything reads right or fails.
                    return self.read_everything();
                }
                if !report.logical_blocks_unrecoverable.is_empty() {
                    return Err(format!("scrub found blocks beyond repair within the fault budget: {report:?}"));
                }
                Ok(())
            }
            Err(error) => self.after_error("scrub", error),
        }
    }

    fn schedule_crash_within(&mut self, operations: u64) {
        let at = self.array.operation_count() + self.prng.below(operations);
        if self.trace {
            eprintln!("  crash scheduled at device operation {at}");
        }
        self.array.crash_at_operation(at);
    }

    fn members(&self) -> Vec<MemberDevice> {
        self.devices
            .iter()
            .enumerate()
            .map(|(index, device)| MemberDevice {
                name: format!("sim{index}"),
                device: (self.missing_member != Some(index)).then(|| device.clone() as Arc<dyn BlockDevice>),
            })
            .collect()
    }

    /// Close normally (flush) and reopen: nothing accepted may be lost. With a write log
    /// that lost a device or was retired, the closed volume is given a new one.
    fn reopen_cleanly(&mut self) -> Result<(), String> {
        let volume = self.volume.take().expect("open");
        let stats = volume.stats();
        self.cleaning_rounds += stats.cleaning_rounds;
        self.client_batch_pairs += stats.client_batch_pairs;
        self.compressed_copies_moved += stats.deduplication.as_ref().map_or(0, |dedup| dedup.compressed_copies_moved);
        self.durable_sequence_at_crash = 0;
        let log_needs_renewal = self.write_log_mode
            && (stats.write_log.as_ref().is_none_or(|log| !log.failed_devices.is_empty() || !log.active)
                || self.log.as_ref().is_some_and(|log| log.missing.iter().any(|&missing| missing)));
        match volume.close() {
            Ok(()) => {
                self.model.durable_effects = self.model.effects.len();
                self.model.member_durable_effects = self.model.effects.len();
                if log_needs_renewal {
                    self.renew_log()?;
                }
            }
            Err(error) if self.array.has_crashed() || self.missing_member.is_some() => {
                if self.trace {
                    eprintln!("  close: {error}");
                }
            }
            Err(error) => return Err(format!("close failed without a crash: {error}")),
        }
        self.array.crash();
        self.recover()
    }

    /// The closed volume's write log lost a device or was retired: remove it (if the
    /// volume still names it) and add a new one. A crash inside is recovered like any.
    fn renew_log(&mut self) -> Result<(), String> {
        if let Err(error) = Volume::remove_write_log(self.members()) {
            if !self.array.has_crashed() {
                return Err(format!("remove the write log: {error}"));
            }
            return Ok(());
        }
        match self.add_log() {
            Err(error) if !self.array.has_crashed() => Err(format!("add a new write log: {error}")),
            _ => Ok(()),
        }
    }

    /// The process dies now: unsynced writes are dropped or torn; recover.
    fn crash_now(&mut self) -> Result<(), String> {
        if let Some(volume) = self.volume.take() {
            let stats = volume.stats();
            self.cleaning_rounds += stats.cleaning_rounds;
            self.client_batch_pairs += stats.client_batch_pairs;
            self.compressed_copies_moved +=
                stats.deduplication.as_ref().map_or(0, |dedup| dedup.compressed_copies_moved);
            self.durable_sequence_at_crash = stats.durable_through_sequence;
            volume.abandon();
        }
        let report = self.array.crash();
        if self.trace {
            eprintln!("  crash: {report:?}");
        }
        self.recover()
    }

    fn recover(&mut self) -> Result<(), String> {
        // Recovery itself may be crashed part-way (a scheduled crash of its own).
        if self.prng.chance(1, 6) {
            let at = self.array.operation_count() + self.prng.below(400);
            self.array.crash_at_operation(at);
            match self.open_after_crash() {
                Ok(volume) => volume.abandon(),
                Err(error) if self.array.has_crashed() => {
                    if self.trace {
                        eprintln!("  crash during recovery: {error}");
                    }
                }
                Err(error) => return self.volume_lost(error),
            }
            self.array.crash();
        }
        let volume = match self.open_after_crash() {
            Ok(volume) => volume,
            Err(error) => return self.volume_lost(error),
        };
        self.recoveries += 1;
        self.log_entries_replayed += volume.stats().recovery.write_log_entries_replayed;
        if deduplicated(self.seed) {
            let references =
                volume.check_shared_references().map_err(|error| format!("count shared references: {error}"))?;
            if !references.records_miscounted.is_empty()
                || references.references_to_free_records > 0
                || !references.counts_miscounted.is_empty()
            {
                return Err(format!("after recovery, shared-block counts are wrong: {references:?}"));
            }
            self.shared_blocks_seen =
                self.shared_blocks_seen.max(volume.stats().deduplication.map_or(0, |dedup| dedup.blocks_saved));
            self.compressed_copies_seen = self
                .compressed_copies_seen
                .max(volume.stats().deduplication.map_or(0, |dedup| dedup.compressed_copies));
        }
        let hot = self.model.hot_blocks;
        let mut actual = Vec::with_capacity(hot as usize);
        let mut buffer = vec![0u8; BLOCK_SIZE_BYTES];
        for block in 0..hot {
            match volume.read(block * BLOCK_SIZE_BYTES as u64, &mut buffer) {
                Ok(()) => actual.push(Actual::Read(buffer.iter().any(|&b| b != 0).then(|| Arc::new(buffer.clone())))),
                Err(Error::Unrecoverable { .. }) if self.beyond_redundancy => {
                    self.unreadable_reads += 1;
                    actual.push(Actual::Unreadable);
                }
                Err(error) => return Err(format!("read of block {block} after recovery: {error}")),
            }
        }
        // Outside the hot range nothing was ever written.
        let logical_blocks = volume.logical_size_bytes() / BLOCK_SIZE_BYTES as u64;
        for block in [hot, logical_blocks - 1].into_iter().filter(|&block| block >= hot && block < logical_blocks) {
            volume
                .read(block * BLOCK_SIZE_BYTES as u64, &mut buffer)
                .map_err(|error| format!("read {block}: {error}"))?;
            if buffer.iter().any(|&b| b != 0) {
                return Err(format!("block {block} outside the written range is not zero"));
            }
        }
        // Beyond redundancy, the log may end before a batch the last flush made durable,
        // when a destroyed block of it makes it look torn: nothing recorded its durability
        // yet, so recovery cannot tell (the attempt that saw it reports it in
        // `ended_at_unreadable_batch`, and destroys it and what follows; a later attempt
        // finds nothing). Metadata is never damaged beyond the budget here, so a log that
        // ends before the engine's durable frontier at the crash has no other cause: only
        // then may durable writes be missing.
        let recovery = volume.stats().recovery;
        let durable_may_be_cut = self.beyond_redundancy
            && self.rows_destroyed > 0
            && recovery.last_sequence < self.durable_sequence_at_crash;
        if durable_may_be_cut && self.trace {
            eprintln!(
                "  the log ends at {}, before the durable frontier {}: a batch after it had destroyed blocks",
                recovery.last_sequence, self.durable_sequence_at_crash
            );
        }
        // A lost write log (opened without it) may take with it what only it held: the
        // members must still hold everything they were known to hold durably.
        let minimum = if durable_may_be_cut {
            0
        } else if self.opened_without_log {
            self.model.member_durable_effects
        } else {
            self.model.durable_effects
        };
        let kept = self.model.settle(&actual, minimum).map_err(|message| {
            // How the engine maps the blocks that read as zeros though the model has data.
            let mappings: Vec<String> = (0..hot)
                .filter(|&block| {
                    matches!(&actual[block as usize], Actual::Read(None)) && self.model.current_block(block).is_some()
                })
                .take(3)
                .map(|block| format!("{block}: {:?}", volume.mapping(block)))
                .collect();
            format!("{message}; recovery: {:?}; zero blocks map to {mappings:?}", volume.stats().recovery)
        })?;
        self.opened_without_log = false;
        if self.trace {
            let stats = volume.stats();
            eprintln!("  recovered: kept {kept} block writes; {:?}", stats.recovery);
            let states: Vec<&str> = stats.members.iter().map(|member| member.state.as_str()).collect();
            eprintln!("  members: {states:?}");
        }
        self.volume = Some(volume);
        Ok(())
    }
}

impl Simulation {
    /// The volume cannot be opened: a failure (metadata is never damaged beyond the
    /// budget, so even beyond redundancy every volume must open).
    fn volume_lost(&mut self, error: Error) -> Result<(), String> {
        Err(format!("open failed without a crash: {error}"))
    }
}

/// What one seed exercised.
#[derive(Default)]
struct Exercised {
    cleaner: bool,
    members_lost: u64,
    rebuilds: u64,
    scrubs: u64,
    faults: u64,
    unreadable_reads: u64,
    thin_refusals: u64,
    shared_blocks_seen: u64,
    compressed_copies_seen: u64,
    compressed_copies_moved: u64,
    client_batch_pairs: u64,
    ended_early: bool,
    /// Index pages evicted (to be read back from the log) since the last open.
    map_page_evictions: u64,
    log_entries_replayed: u64,
    log_devices_lost: u64,
    log_faults: u64,
    logs_added: u64,
    opens_without_log: u64,
}

/// What a seed runs.
#[derive(Clone, Copy)]
struct Mode {
    filling: bool,
    beyond_redundancy: bool,
    write_log: bool,
}

const HOT: Mode = Mode { filling: false, beyond_redundancy: false, write_log: false };
const FILLING: Mode = Mode { filling: true, beyond_redundancy: false, write_log: false };
const BEYOND_REDUNDANCY: Mode = Mode { filling: true, beyond_redundancy: true, write_log: false };
/// `write_log_seeds`: even seeds the hot workload, odd ones the filling one.
fn write_log_mode(seed: u64) -> Mode {
    Mode { filling: seed % 2 == 1, beyond_redundancy: false, write_log: true }
}

fn simulate(seed: u64, trace: bool, mode: Mode) -> Result<(String, Exercised), String> {
    let mut simulation = Simulation::new(seed, trace, mode.filling, mode.beyond_redundancy)?;
    if mode.write_log {
        simulation.start_with_log()?;
    }
    if mode.filling {
        simulation.fill()?;
    }
    if simulation.ended.is_none() {
        simulation.run()?;
    }
    let summary = format!(
        "{} recoveries, {} mid-operation crashes, {} faults, {} members lost, {} rebuilds, {} scrubs, raid {}, {} cleaning rounds, {} unreadable reads, {} rows destroyed, {} thin refusals, {} batch pairs{}{}",
        simulation.recoveries,
        simulation.crashes_mid_operation,
        simulation.faults_injected,
        simulation.members_lost,
        simulation.rebuilds_finished,
        simulation.scrubs_finished,
        simulation.raid_level,
        simulation.cleaning_rounds,
        simulation.unreadable_reads,
        simulation.rows_destroyed,
        simulation.thin_refusals,
        simulation.client_batch_pairs,
        if mode.write_log {
            format!(
                "; write log: {} added, {} devices lost, {} faults, {} entries replayed, {} opens without it",
                simulation.logs_added,
                simulation.log_devices_lost,
                simulation.log_faults,
                simulation.log_entries_replayed,
                simulation.opens_without_log
            )
        } else {
            String::new()
        },
        simulation.ended.as_ref().map(|reason| format!("; ended early: {reason}")).unwrap_or_default()
    );
    let exercised = Exercised {
        cleaner: simulation.cleaning_rounds > 0,
        members_lost: simulation.members_lost,
        rebuilds: simulation.rebuilds_finished,
        scrubs: simulation.scrubs_finished,
        faults: simulation.faults_injected,
        unreadable_reads: simulation.unreadable_reads,
        thin_refusals: simulation.thin_refusals,
        shared_blocks_seen: simulation.shared_blocks_seen,
        compressed_copies_seen: simulation.compressed_copies_seen,
        compressed_copies_moved: simulation.compressed_copies_moved
            + simulation
                .volume
                .as_ref()
                .map_or(0, |volume| volume.stats().deduplication.map_or(0, |dedup| dedup.compressed_copies_moved)),
        client_batch_pairs: simulation.client_batch_pairs
            + simulation.volume.as_ref().map_or(0, |volume| volume.stats().client_batch_pairs),
        ended_early: simulation.ended.is_some(),
        map_page_evictions: simulation.volume.as_ref().map_or(0, |volume| volume.stats().map_page_evictions),
        log_entries_replayed: simulation.log_entries_replayed,
        log_devices_lost: simulation.log_devices_lost,
        log_faults: simulation.log_faults,
        logs_added: simulation.logs_added,
        opens_without_log: simulation.opens_without_log,
    };
    Ok((summary, exercised))
}

fn replay_command(seed: u64, mode: Mode) -> String {
    format!(
        "STRIPELOG_SIM_SEED={seed}{}{}{} cargo test -p stripelog-engine --test simulation -- --ignored replay_one_seed --nocapture",
        if mode.filling { " STRIPELOG_SIM_FILLING=1" } else { "" },
        if mode.beyond_redundancy { " STRIPELOG_SIM_BEYOND=1" } else { "" },
        if mode.write_log { " STRIPELOG_SIM_LOG=1" } else { "" }
    )
}

/// A seed runs in well under a second; one that takes this long is hung.
const SEED_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Run one seed: what it exercised, or the failure (a panic or a hang included) with its
/// replay command. A hung seed cannot be stopped: its thread is left behind and the
/// failure is reported at once.
fn check_seed(seed: u64, mode: Mode) -> Result<Exercised, String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("seed-{seed}"))
        .spawn(move || {
            let outcome = std::panic::catch_unwind(|| simulate(seed, false, mode)).unwrap_or_else(|panic| {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                    .unwrap_or_default();
                Err(format!("panicked: {message}"))
            });
            let _ = sender.send(outcome);
        })
        .expect("spawn a seed thread");
    let outcome = receiver
        .recv_timeout(SEED_TIME_LIMIT)
        .unwrap_or_else(|_| Err(format!("hung: no result after {} s", SEED_TIME_LIMIT.as_secs())));
    outcome
        .map(|(_, exercised)| exercised)
        .map_err(|message| format!("seed {seed} failed: {message}\n  replay: {}", replay_command(seed, mode)))
}

fn seed_range(variable: &str, default_count: u64) -> std::ops::Range<u64> {
    let count: u64 = std::env::var(variable).ok().and_then(|value| value.parse().ok()).unwrap_or(default_count);
    let first: u64 = std::env::var("STRIPELOG_SIM_FIRST_SEED").ok().and_then(|value| value.parse().ok()).unwrap_or(0);
    first..first + count
}

#[test]
fn many_seeds() {
    let seeds = seed_range("STRIPELOG_SIM_SEEDS", 500);
    let count = seeds.end - seeds.start;
    let (mut total, mut failures) = (Exercised::default(), Vec::new());
    for seed in seeds {
        match check_seed(seed, HOT) {
            Ok(exercised) => {
                total.members_lost += exercised.members_lost;
                total.rebuilds += exercised.rebuilds;
                total.scrubs += exercised.scrubs;
                total.map_page_evictions += exercised.map_page_evictions;
                total.shared_blocks_seen += u64::from(exercised.shared_blocks_seen > 0);
                total.compressed_copies_seen += u64::from(exercised.compressed_copies_seen > 0);
            }
            Err(message) => failures.push(message),
        }
    }
    assert!(failures.is_empty(), "{} of {count} seeds failed:\n{}", failures.len(), failures.join("\n"));
    // Member loss, online rebuilds, scrubs, index paging and sharing must actually happen.
    eprintln!(
        "{count} seeds: {} members lost, {} rebuilds finished, {} scrubs finished, {} index pages evicted, {} seeds \
         recovered with shared blocks, {} with compressed shared copies",
        total.members_lost,
        total.rebuilds,
        total.scrubs,
        total.map_page_evictions,
        total.shared_blocks_seen,
        total.compressed_copies_seen
    );
    if count >= 100 {
        assert!(total.members_lost * 10 >= count && total.rebuilds * 20 >= count && total.scrubs * 10 >= count);
        assert!(total.map_page_evictions >= count, "the seeds with no map cache must evict pages");
        assert!(total.shared_blocks_seen * 5 >= count, "the deduplicated seeds must share blocks");
        // (Seeds both deduplicated and compressed: one in twenty.)
        assert!(total.compressed_copies_seen * 40 >= count, "the compressed deduplicated seeds must compress copies");
    }
}

#[test]
fn filling_seeds() {
    let seeds = seed_range("STRIPELOG_SIM_FILLING_SEEDS", 100);
    let count = seeds.end - seeds.start;
    let (mut cleaned, mut thin_refusals, mut failures) = (0u64, 0u64, Vec::new());
    let (mut shared_seeds, mut paired_seeds, mut compressed_copy_seeds) = (0u64, 0u64, 0u64);
    for seed in seeds {
        match check_seed(seed, FILLING) {
            Ok(exercised) => {
                cleaned += u64::from(exercised.cleaner);
                thin_refusals += exercised.thin_refusals;
                shared_seeds += u64::from(exercised.shared_blocks_seen > 0);
                paired_seeds += u64::from(exercised.client_batch_pairs > 0);
                compressed_copy_seeds += u64::from(exercised.compressed_copies_moved > 0);
            }
            Err(message) => failures.push(message),
        }
    }
    assert!(failures.is_empty(), "{} of {count} seeds failed:\n{}", failures.len(), failures.join("\n"));
    // The workload exists to exercise the cleaner: it must actually run in nearly every seed.
    eprintln!(
        "{cleaned} of {count} filling seeds ran the cleaner; thin volumes refused {thin_refusals} writes; \
         {shared_seeds} seeds recovered with shared blocks; {paired_seeds} sealed pairs of batches; \
         {compressed_copy_seeds} moved compressed shared copies"
    );
    if count >= 100 {
        assert!(paired_seeds * 2 >= count, "the skewed seeds must seal pairs of batches: {paired_seeds} did");
        assert!(thin_refusals >= count / 7, "the thin seeds must reach their limit: {thin_refusals} refusals");
        assert!(shared_seeds * 5 >= count, "the deduplicated seeds must share blocks: {shared_seeds} did");
        // (One seed in twenty is both; the cleaner reaches a copy's segment in a few.)
        assert!(
            compressed_copy_seeds * 100 >= count,
            "the compressed deduplicated seeds must move compressed copies: {compressed_copy_seeds} did"
        );
    }
    assert!(cleaned * 10 >= count * 9, "only {cleaned} of {count} filling seeds ran the cleaner");
}

#[test]
fn beyond_redundancy_seeds() {
    let seeds = seed_range("STRIPELOG_SIM_BEYOND_SEEDS", 200);
    let count = seeds.end - seeds.start;
    let (mut total, mut cleaned, mut failures) = (Exercised::default(), 0u64, Vec::new());
    let mut ended_early = 0u64;
    for seed in seeds {
        match check_seed(seed, BEYOND_REDUNDANCY) {
            Err(message) if message.contains("hung:") => panic!("{message}"),
            Ok(exercised) => {
                cleaned += u64::from(exercised.cleaner);
                total.faults += exercised.faults;
                total.unreadable_reads += exercised.unreadable_reads;
                total.scrubs += exercised.scrubs;
                total.rebuilds += exercised.rebuilds;
                ended_early += u64::from(exercised.ended_early);
            }
            Err(message) => failures.push(message),
        }
    }
    assert!(failures.is_empty(), "{} of {count} seeds failed:\n{}", failures.len(), failures.join("\n"));
    eprintln!(
        "{count} seeds beyond redundancy: {} faults, {} reads failed as they should, {cleaned} ran the cleaner, {} scrubs, {} rebuilds, {ended_early} ended early (volume full or refused)",
        total.faults, total.unreadable_reads, total.scrubs, total.rebuilds
    );
    // The mode must really lose blocks, clean around them, scrub and rebuild.
    if count >= 100 {
        assert!(total.unreadable_reads > 0 && cleaned * 10 >= count * 8 && total.scrubs > 0 && total.rebuilds > 0);
        assert!(ended_early * 4 < count, "{ended_early} of {count} seeds ended early: the mode tests too little");
    }
}

/// The write log: a volume with a log on one device or a mirror of two, under both
/// workloads, with every crash of the other seeds (which now also tear and drop unsynced
/// log records, and strike inside the replay at mount), log devices lost while serving
/// (with and without a crash before the volume notices), rot and read errors on a
/// mirror's second device, and logs renewed at clean reopens. Every recovery must hold a
/// prefix with everything acknowledged, except after a single log device was lost with a
/// crash: then mount must refuse, and opened without the log the volume must still hold
/// everything the members held durably.
#[test]
fn write_log_seeds() {
    let seeds = seed_range("STRIPELOG_SIM_LOG_SEEDS", 200);
    let count = seeds.end - seeds.start;
    let (mut total, mut failures) = (Exercised::default(), Vec::new());
    for seed in seeds {
        match check_seed(seed, write_log_mode(seed)) {
            Ok(exercised) => {
                total.log_entries_replayed += exercised.log_entries_replayed;
                total.log_devices_lost += exercised.log_devices_lost;
                total.log_faults += exercised.log_faults;
                total.logs_added += exercised.logs_added;
                total.opens_without_log += exercised.opens_without_log;
            }
            Err(message) => failures.push(message),
        }
    }
    assert!(failures.is_empty(), "{} of {count} seeds failed:\n{}", failures.len(), failures.join("\n"));
    eprintln!(
        "{count} write log seeds: {} log entries replayed, {} log devices lost, {} log faults, {} logs added, {} opens without a lost log",
        total.log_entries_replayed, total.log_devices_lost, total.log_faults, total.logs_added, total.opens_without_log
    );
    if count >= 100 {
        assert!(total.log_entries_replayed >= count * 10, "the log must be replayed at mounts");
        assert!(total.log_devices_lost * 5 >= count && total.log_faults * 5 >= count);
        assert!(total.logs_added > count && total.opens_without_log > 0);
    }
}

/// Write log seeds that once failed, kept as regression tests:
/// - 79, 87, 91 (and others among the first 100): a record that ended the log area
///   exactly, or a wrap record, sent the head back to the area's start while the tail was
///   there: the full log read as empty and every acknowledged write only it held was lost.
/// - 127: the only device of a log is lost; the volume must sync the members before it
///   forgets the log (it fails when the log is forgotten first: a crash then loses what
///   only the log held, with nothing left to refuse the mount).
/// - 287: `check` (a full scan) refused a healthy volume. A crash discarded a tail whose
///   first batch (250, epoch 26) had opened a free segment; the next life gave out
///   sequence 250 again elsewhere, and a later crash tore that segment's reuse, leaving
///   the old header with a failing checksum at its head. The scan took it for the log's
///   batch 250 destroyed, and for the lost predecessor of a batch that had lived in the
///   segment before: only the epoch (26 against the log's 27) tells a discarded tail from
///   the log. Each of the two checks fails the seed without its epoch rule.
/// - 179 (deduplicated, thin, filling): the volume ran out of space with the spare held
///   back. Two faults: a thin volume's admission counted an overwrite of a shared block
///   as adding nothing (its copy stays for the other references), and the write log's
///   replay stored duplicates whole (118 % of the provisioned size after one crash).
///   With the finder's later change (a full copy is passed over) the seed no longer
///   reaches either fault alone; `a_thin_deduplicated_volume_counts_shared_blocks_and_
///   replays_its_log_shared` (tests/deduplication.rs) fails with each put back.
#[test]
fn write_log_regression_seeds() {
    for seed in [79, 87, 91, 127, 179, 287] {
        check_seed(seed, write_log_mode(seed)).unwrap();
    }
}

/// Not a test of its own: replays `STRIPELOG_SIM_SEED` with a trace (see `replay_command`).
#[test]
#[ignore = "a replay tool: set STRIPELOG_SIM_SEED and run with --ignored"]
fn replay_one_seed() {
    let seed: u64 = std::env::var("STRIPELOG_SIM_SEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .expect("set STRIPELOG_SIM_SEED to the seed to replay");
    let mode = Mode {
        filling: std::env::var_os("STRIPELOG_SIM_FILLING").is_some(),
        beyond_redundancy: std::env::var_os("STRIPELOG_SIM_BEYOND").is_some(),
        write_log: std::env::var_os("STRIPELOG_SIM_LOG").is_some(),
    };
    let mode = Mode { filling: mode.filling || mode.beyond_redundancy, ..mode };
    match simulate(seed, true, mode) {
        Ok((summary, _)) => eprintln!("seed {seed} passed: {summary}"),
        Err(message) => panic!("seed {seed} failed: {message}"),
    }
}

/// Seeds that once failed, kept as regression tests:
/// - 7: RAID-10 on two members, a segment with one row left could not take even one
///   entry; the empty batch was sealed again and again (hang).
/// - 25: a tail batch that one member lost in a crash was accepted (rebuilt from parity)
///   but its damaged shards were left in place; losing another member later cut the
///   segment's chain. Recovery now rewrites damaged tail shards in place.
/// - 838, 1524: a torn batch beyond the log end that recovery could not read came back
///   when a member went missing (parity rebuilt its head). Recovery now closes every
///   chain by zeroing the rows where such a batch could sit.
/// - 7 (again, after segments were released by zeroing their head): flushed batches in a
///   released segment looked like the end of the log when the crash came before any
///   later summary recorded them as durable. The superblock now records it first.
/// - 282, 293: a crash inside a member's replacement, before the new device had a
///   superblock, left a volume that would not open ("no valid stripelog superblock").
///   A device in the place of a member the others record as failed now needs none.
/// - 74: RAID-10 on two members, a crash dropped one side's write of the last batch, whose
///   row there still held another (self-checksummed) block; every such block has the same
///   whole-block CRC32C, so recovery took it for the batch's summary and "repaired" the
///   good side with it. Self-checksummed blocks are now known by their own CRC.
/// - 11, 103 (deduplicated): mount replayed shared copies born after the checkpoint, then
///   marked the shared table clean, so its own checkpoint did not write them; the next
///   crash mounted an index whose references named records the table did not hold.
///   Replayed pages now stay dirty.
#[test]
fn regression_seeds() {
    const SEEDS: &[u64] = &[7, 11, 25, 74, 103, 282, 293, 838, 1524];
    for &seed in SEEDS {
        check_seed(seed, HOT).unwrap();
    }
}

/// Beyond-redundancy seeds that once failed, kept as regression tests:
/// - 146, 472, 1446, 1784, 1965: the cleaner completed a relocation batch with a block of
///   the next candidate ("filler") that could not be read or rebuilt, relocated as zeros
///   with a fresh, valid checksum: reads returned zeros instead of an I/O error. Unreadable
///   fillers are now skipped and their segment pinned like the victims'.
/// - 1, 2, 81: a relocation stream whose first remaining record was unreadable started a
///   batch that held nothing and was sealed anyway, leaving a hole in the log (an open
///   refused as metadata damaged). A batch now starts only with a record it will hold.
/// - 0 (found by the invariant check after every step): a metadata segment released after
///   a checkpoint's commit and reused before a crash kept, at mount, the count the
///   checkpoint's table gave it — the previous checkpoint's blocks, which died at that
///   commit and which no entry replays — so its live count never reached zero (a segment
///   lost for good). A segment's first batch of a use now starts it from nothing.
#[test]
fn beyond_redundancy_regression_seeds() {
    const SEEDS: &[u64] = &[0, 1, 2, 81, 146, 472, 1446, 1784, 1965];
    for &seed in SEEDS {
        check_seed(seed, BEYOND_REDUNDANCY).unwrap();
    }
}
