//! The general benchmark against each kind of target: a file, an NBD export served by
//! stripelog's own server on a Unix socket, and the engine in process. Each run must move
//! real data (checked afterwards where the data can be seen) and every refusal must be a
//! clear error, not a panic.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use stripelog_bench::run::{self, Data, Pattern, Workload};
use stripelog_bench::target::{self, TargetOptions};
use stripelog_blockdev::{BlockDevice, FileDevice, FileDeviceOptions, MemoryDevice};
use stripelog_engine::{CreateOptions, MemberDevice, OpenOptions, RaidLevel, Volume};
use stripelog_nbd::{Export, Server};

const MIB: u64 = 1 << 20;

struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let path = std::env::temp_dir().join(format!("stripelog-bench-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("scratch directory");
        Scratch(path)
    }
    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An export of `volume` named `name`, open to every client.
fn export(name: &str, volume: &Arc<Volume>, read_only: bool) -> Export {
    Export {
        name: name.into(),
        description: String::new(),
        volume: volume.clone(),
        read_only,
        allowed_clients: Vec::new(),
    }
}

fn workload(read_percent: u32, region_bytes: u64) -> Workload {
    Workload {
        read_percent,
        block_sizes_bytes: vec![4096, 8192],
        pattern: Pattern::Random,
        zipf_exponent: None,
        region_offset_bytes: 0,
        region_bytes,
        data: Data::Random,
        threads: 2,
        queue_depth: 8,
        duration: Duration::from_millis(500),
        write_limit_bytes: None,
        durability: Default::default(),
        seed: 11,
    }
}

fn writes(create_size_bytes: Option<u64>, force: bool) -> TargetOptions {
    TargetOptions { writes: true, force, create_size_bytes, ..Default::default() }
}

#[test]
fn a_file_target_is_written_and_read_and_not_overwritten_without_force() {
    let scratch = Scratch::new("file");
    let path = scratch.join("target");
    let spec = path.to_str().unwrap();
    // Missing, no size: refused.
    let error = target::open(spec, &writes(None, false)).err().expect("no size given");
    assert!(error.contains("--size"), "{error}");

    let file = target::open(spec, &writes(Some(16 * MIB), false)).expect("create the file");
    assert_eq!(file.size_bytes(), 16 * MIB);
    // One sequential pass of random data covers the whole file.
    let fill = Workload {
        pattern: Pattern::Sequential,
        threads: 1,
        block_sizes_bytes: vec![MIB as usize],
        duration: Duration::from_secs(60),
        write_limit_bytes: Some(16 * MIB),
        durability: Default::default(),
        ..workload(0, 16 * MIB)
    };
    let report = run::run(file.as_ref(), &fill, &|_| {}).expect("fill");
    assert_eq!(report.write.io_bytes, 16 * MIB);
    drop(file);
    let content = std::fs::read(&path).unwrap();
    let zero_blocks = content.chunks(4096).filter(|block| block.iter().all(|&byte| byte == 0)).count();
    assert_eq!(zero_blocks, 0, "every block was written with random data");

    // Now the file exists and holds data: writing needs --force, reading does not.
    let error = target::open(spec, &writes(None, false)).err().expect("would overwrite");
    assert!(error.contains("--force"), "{error}");
    let reader = target::open(spec, &TargetOptions::default()).expect("read-only open");
    let error = run::run(reader.as_ref(), &workload(50, 16 * MIB), &|_| {}).expect_err("writes on a read-only target");
    assert!(error.contains("read-only"), "{error}");
    let report = run::run(reader.as_ref(), &workload(100, 16 * MIB), &|_| {}).expect("reads");
    assert!(report.read.total_ios > 100 && report.write.total_ios == 0);
    assert!(report.read.lat_ns.max >= report.read.lat_ns.min && report.read.lat_ns.mean > 0.0);
    // One target per file in a process (docs/data-safety.md).
    let error = target::open(spec, &writes(None, true)).err().expect("the file is open as the reader");
    assert!(error.contains("already open in this process"), "{error}");
    drop(reader);

    let forced = target::open(spec, &writes(None, true)).expect("--force");
    let report = run::run(forced.as_ref(), &workload(30, 16 * MIB), &|_| {}).expect("mixed run");
    assert!(report.read.total_ios > 0 && report.write.total_ios > 0);
    let error = run::run(forced.as_ref(), &workload(30, 32 * MIB), &|_| {}).expect_err("region too large");
    assert!(error.contains("larger than the target"), "{error}");
}

fn memory_volume(member_bytes: u64) -> Arc<Volume> {
    memory_volume_with(member_bytes, &OpenOptions::default())
}

fn memory_volume_with(member_bytes: u64, open: &OpenOptions) -> Arc<Volume> {
    let members = (0..4)
        .map(|index| MemberDevice {
            name: format!("memory-{index}"),
            device: Some(Arc::new(MemoryDevice::new(member_bytes)) as Arc<dyn BlockDevice>),
        })
        .collect();
    let options = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
    Arc::new(Volume::create(members, &options, open).expect("volume"))
}

/// stripelog's NBD server on a Unix socket, serving until `shutdown`.
fn serve(exports: Vec<Export>, socket: &Path) -> (Arc<Server>, std::thread::JoinHandle<std::io::Result<()>>) {
    let server = Server::new(exports);
    let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind");
    let serving = {
        let server = server.clone();
        std::thread::spawn(move || server.run_unix(listener))
    };
    (server, serving)
}

#[test]
fn an_nbd_export_is_driven_with_many_requests_in_flight() {
    let scratch = Scratch::new("nbd");
    let socket = scratch.join("s.sock");
    let volume = memory_volume(64 * MIB);
    let size = volume.logical_size_bytes();
    let exports = vec![export("disk", &volume, false), export("ro", &volume, true)];
    let (server, serving) = serve(exports, &socket);
    let uri = format!("nbd+unix:///disk?socket={}", socket.display());
    let export = target::open(&uri, &writes(None, false)).expect("connect");
    assert_eq!(export.size_bytes(), size);
    let report = run::run(export.as_ref(), &workload(50, size), &|_| {}).expect("mixed run over NBD");
    assert!(
        report.read.total_ios > 100 && report.write.total_ios > 100,
        "{:?}",
        (report.read.total_ios, report.write.total_ios)
    );
    let statistics = &server.statistics;
    let served = statistics.requests.load(std::sync::atomic::Ordering::Relaxed);
    let written = statistics.bytes_written.load(std::sync::atomic::Ordering::Relaxed);
    drop(export);
    // The export now holds data (base:allocation says so): a write benchmark needs --force.
    let error = target::open(&uri, &writes(None, false)).err().expect("the export holds data");
    assert!(error.contains("holds data") && error.contains("base:allocation") && error.contains("--force"), "{error}");
    drop(target::open(&uri, &TargetOptions::default()).expect("a read-only benchmark"));
    drop(target::open(&uri, &writes(None, true)).expect("--force"));
    // Trimmed whole, it holds nothing again.
    volume.trim(0, size).expect("trim everything");
    drop(target::open(&uri, &writes(None, false)).expect("an export that holds nothing"));

    let read_only = format!("nbd+unix:///ro?socket={}", socket.display());
    let error = target::open(&read_only, &writes(None, false)).err().expect("read-only export");
    assert!(error.contains("read-only"), "{error}");
    let error = target::open("nbd+unix:///nothing?socket=/nonexistent/socket", &writes(None, false)).err().unwrap();
    assert!(error.contains("cannot connect"), "{error}");
    let error =
        target::open(&format!("nbd+unix:///missing?socket={}", socket.display()), &writes(None, false)).err().unwrap();
    assert!(error.contains("refused"), "{error}");

    server.shutdown();
    serving.join().unwrap().expect("server ends cleanly");
    // Connections are counted when they end: the server saw what the client sent.
    let served_total = statistics.requests.load(std::sync::atomic::Ordering::Relaxed).max(served);
    assert!(served_total >= report.read.total_ios + report.write.total_ios);
    assert!(statistics.bytes_written.load(std::sync::atomic::Ordering::Relaxed).max(written) >= report.write.io_bytes);
}

fn file_members(scratch: &Scratch) -> Vec<PathBuf> {
    (0..3).map(|index| scratch.join(&format!("member-{index}"))).collect()
}

fn open_members(paths: &[PathBuf]) -> Vec<MemberDevice> {
    paths
        .iter()
        .map(|path: &PathBuf| {
            let options = FileDeviceOptions { create_size_bytes: Some(64 * MIB), ..FileDeviceOptions::default() };
            let device = FileDevice::open(Path::new(path), &options).expect("member");
            MemberDevice { name: path.display().to_string(), device: Some(Arc::new(device)) }
        })
        .collect()
}

#[test]
fn the_engine_in_process_needs_force_to_write_and_keeps_what_it_wrote() {
    let scratch = Scratch::new("engine");
    let paths = file_members(&scratch);
    let options = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
    Volume::create(open_members(&paths), &options, &OpenOptions::default()).unwrap().close().unwrap();
    let spec = format!("engine:{}", paths.iter().map(|path| path.to_str().unwrap()).collect::<Vec<_>>().join(","));
    // An empty volume holds nothing to lose: a write benchmark needs no --force.
    let engine = target::open(&spec, &writes(None, false)).expect("an empty volume");
    let size = engine.size_bytes();
    let fill = Workload {
        pattern: Pattern::Sequential,
        threads: 1,
        // The volume's size is a multiple of 4 KiB, not of larger blocks.
        block_sizes_bytes: vec![4096],
        duration: Duration::from_secs(60),
        write_limit_bytes: Some(size),
        durability: Default::default(),
        ..workload(0, size)
    };
    let report = run::run(engine.as_ref(), &fill, &|_| {}).expect("fill through the engine");
    assert_eq!(report.write.io_bytes, size);
    let report = run::run(engine.as_ref(), &workload(50, size), &|_| {}).expect("mixed run");
    assert!(report.read.total_ios > 0 && report.write.total_ios > 0);
    drop(engine);
    // Now it holds data: writing needs --force, naming what it holds; reading does not.
    let error = target::open(&spec, &writes(None, false)).err().expect("the volume holds data");
    assert!(error.contains("holds data") && error.contains("blocks mapped") && error.contains("--force"), "{error}");
    drop(target::open(&spec, &TargetOptions::default()).expect("a read-only benchmark"));
    drop(target::open(&spec, &writes(None, true)).expect("--force"));
    // The volume reopens with every block written (random data: no zero blocks).
    let volume = Volume::open(open_members(&paths), &OpenOptions::default()).expect("reopen");
    let mut block = vec![0u8; 4096];
    for offset in (0..size).step_by(4096 * 97) {
        volume.read(offset, &mut block).unwrap();
        assert!(block.iter().any(|&byte| byte != 0), "block at {offset} reads as zeros");
    }
    volume.close().unwrap();
}

#[test]
fn a_saturation_run_preconditions_stops_on_the_written_volume_and_charts_svg_and_png() {
    let scratch = Scratch::new("saturate");
    let path = scratch.join("target.img");
    let target = target::open(path.to_str().unwrap(), &writes(Some(32 * MIB), false)).expect("create the file");
    let options = stripelog_bench::saturation::Options {
        precondition: true,
        threads: 2,
        queue_depth: 8,
        write_limit_bytes: 2 * 32 * MIB,
        duration_limit: Duration::from_secs(120),
        round: Duration::from_secs(1),
        stop_at_steady_state: false,
        data: Data::Random,
        seed: 3,
    };
    let report = stripelog_bench::saturation::run(target.as_ref(), &options, &|_, _| {}).expect("saturate");
    let fill = report.preconditioning.as_ref().expect("preconditioned");
    assert_eq!(fill.bytes_written, 32 * MIB);
    assert_eq!(report.bytes_written, 2 * 32 * MIB, "stops at the written volume, not past it");
    assert_eq!(report.stopped_by, "written volume");
    assert_eq!(report.bytes_written_by_second.last().copied(), Some(report.bytes_written));
    // Each point is a rate over its own span (the last may be a partial second; one
    // shorter than a quarter second is dropped): the rates times their spans give back
    // the bytes written, less at most that dropped quarter second.
    assert_eq!(report.iops_per_second.len(), report.seconds_at_end.len());
    let mut span_start = 0.0;
    let mut counted_bytes = 0.0;
    for (&rate, &end) in report.iops_per_second.iter().zip(&report.seconds_at_end) {
        assert!(end > span_start, "spans go forward: {:?}", report.seconds_at_end);
        counted_bytes += rate * (end - span_start) * 4096.0;
        span_start = end;
    }
    let fastest = report.iops_per_second.iter().copied().fold(0.0, f64::max) * 4096.0;
    let missing = report.bytes_written as f64 - counted_bytes;
    assert!(
        missing > -4096.0 && missing <= 0.25 * fastest + 4096.0,
        "{counted_bytes} of {} bytes",
        report.bytes_written
    );
    for (name, signature) in [("chart.svg", &b"<svg"[..]), ("chart.png", &b"\x89PNG"[..])] {
        let chart = scratch.join(name);
        stripelog_bench::saturation::chart(&report, &chart).expect("draw the chart");
        let bytes = std::fs::read(&chart).expect("read the chart back");
        assert!(bytes.windows(signature.len()).take(64).any(|window| window == signature), "{name}");
    }
    assert!(stripelog_bench::saturation::chart(&report, &scratch.join("chart.jpg")).is_err());
}

#[test]
fn compare_measures_raw_members_stripelog_in_process_and_over_nbd() {
    let scratch = Scratch::new("compare");
    let members: Vec<PathBuf> = (0..3).map(|index| scratch.join(&format!("m{index}"))).collect();
    let options = stripelog_bench::compare::Options {
        members: members.clone(),
        member_size_bytes: Some(24 * MIB),
        force: false,
        peer: None,
        raid_level: RaidLevel::Raid5,
        chunk_size_bytes: 256 << 10,
        spare_ppm: 200_000,
        threads: 1,
        queue_depth: 8,
        duration: Duration::from_millis(500),
        region_bytes: 16 * MIB,
        seed: 5,
    };
    let report = stripelog_bench::compare::run(&options, &|_, _| {}).expect("compare");
    let names: Vec<&str> = report.columns.iter().map(|column| column.name.as_str()).collect();
    assert_eq!(names, ["raw members (3)", "stripelog (in process)", "stripelog (NBD)"]);
    for column in &report.columns {
        assert!(column.random_write.iops > 0.0 && column.random_read.iops > 0.0, "{column:?}");
        assert!(column.fill_bytes_per_second > 0.0, "{column:?}");
    }
    let table = stripelog_bench::compare::table(&report);
    assert!(table.contains("stripelog ÷ raw members"), "{table}");
    // The members now hold a volume: a second run needs --force.
    let error = stripelog_bench::compare::run(&options, &|_, _| {}).expect_err("members are not empty");
    assert!(error.contains("--force"), "{error}");
    // A peer that is not there fails before anything is written.
    let peer = Some(format!("nbd+unix:///?socket={}", scratch.join("absent.sock").display()));
    let error =
        stripelog_bench::compare::run(&stripelog_bench::compare::Options { force: true, peer, ..options }, &|_, _| {})
            .expect_err("no such peer");
    assert!(!error.is_empty());
}

/// 300 ms of 4 KiB writes from one thread at `queue_depth`, each waiting for `durability`.
fn durable_writes(durability: stripelog_bench::target::Durability, queue_depth: usize, region: u64) -> Workload {
    Workload {
        threads: 1,
        queue_depth,
        block_sizes_bytes: vec![4096],
        duration: Duration::from_millis(300),
        durability,
        ..workload(0, region)
    }
}

/// Writes that wait for durability: every write with FUA, or followed by a flush once it
/// completed, over NBD (stripelog's server, counting the member syncs it makes), in
/// process, and on a file (io_uring: RWF_DSYNC, or a linked fdatasync whose completion is
/// the request's). At depth 1 each such write costs the volume a sync of its members; the
/// same writes without durability cost none.
#[test]
fn writes_wait_for_fua_or_a_flush_on_every_kind_of_target() {
    use stripelog_bench::target::Durability;
    let scratch = Scratch::new("durability");
    let socket = scratch.join("s.sock");
    // No flush timer: every member sync counted below is one a write asked for.
    let volume = memory_volume_with(64 * MIB, &OpenOptions { flush_interval: None, ..OpenOptions::default() });
    let size = volume.logical_size_bytes();
    let exports = vec![export("disk", &volume, false)];
    let (server, serving) = serve(exports, &socket);
    let uri = format!("nbd+unix:///disk?socket={}", socket.display());
    let syncs_made = |target: &dyn stripelog_bench::target::Target, durability| {
        let before = volume.stats().flushes;
        let report = run::run(target, &durable_writes(durability, 1, size), &|_| {}).expect("a durable run");
        (report.write.total_ios, volume.stats().flushes - before)
    };
    let export = target::open(&uri, &writes(None, true)).expect("connect");
    let engine: Arc<dyn stripelog_bench::target::Target> =
        Arc::new(target::EngineTarget::from_volume(volume.clone(), "memory".into()));
    for (name, target) in [("NBD", export.as_ref()), ("engine", engine.as_ref())] {
        for durability in [Durability::Fua, Durability::Flush] {
            let (writes, syncs) = syncs_made(target, durability);
            assert!(writes > 10 && syncs >= writes, "{name} {durability}: {writes} writes, {syncs} member syncs");
        }
        let (writes, syncs) = syncs_made(target, Durability::None);
        assert!(writes > 10 && syncs * 10 < writes, "{name} without durability: {writes} writes, {syncs} member syncs");
    }
    drop(export);
    server.shutdown();
    serving.join().unwrap().expect("server ends cleanly");

    // A file: many requests in flight, each completed exactly once (a write-then-flush
    // has two ring entries and one completion).
    let path = scratch.join("file");
    let file = target::open(path.to_str().unwrap(), &writes(Some(16 * MIB), false)).expect("create the file");
    for durability in [Durability::Fua, Durability::Flush] {
        let report = run::run(file.as_ref(), &Workload { durability, ..workload(0, 16 * MIB) }, &|_| {})
            .expect("durable writes to a file");
        assert!(report.write.total_ios > 10, "{durability}: {}", report.write.total_ios);
    }
}

/// Served with a write log, FUA writes and write + flush pairs over NBD are made durable
/// by syncs of the log, not rounds of member syncs (the server runs them on the reader
/// thread: `Volume::flushes_to_a_write_log`), and what they acknowledged survives a crash
/// that leaves it only on the log.
#[test]
fn over_nbd_a_write_log_takes_flushes_and_fua_writes_and_keeps_them_through_a_crash() {
    use stripelog_bench::target::Durability;
    use stripelog_engine::WriteLogDevices;
    let scratch = Scratch::new("durability-log");
    let socket = scratch.join("s.sock");
    let member_devices: Vec<Arc<dyn BlockDevice>> =
        (0..4).map(|_| Arc::new(MemoryDevice::new(64 * MIB)) as Arc<dyn BlockDevice>).collect();
    let members = || -> Vec<MemberDevice> {
        member_devices
            .iter()
            .enumerate()
            .map(|(index, device)| MemberDevice { name: format!("memory-{index}"), device: Some(device.clone()) })
            .collect()
    };
    let log_device: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(16 * MIB));
    let options = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
    Volume::create(members(), &options, &OpenOptions::default()).expect("volume").close().expect("close");
    Volume::add_write_log(members(), vec![MemberDevice { name: "log".into(), device: Some(log_device.clone()) }])
        .expect("add the log");
    let open = OpenOptions {
        // No flush timer: stripes are written only when batches fill or members are synced.
        flush_interval: None,
        cache_size_bytes: 0,
        write_log_devices: Some(WriteLogDevices(vec![Some(log_device.clone())])),
        ..OpenOptions::default()
    };
    let volume = Arc::new(Volume::open(members(), &open).expect("open with the log"));
    assert!(volume.flushes_to_a_write_log());
    let exports = vec![export("disk", &volume, false)];
    let (server, serving) = serve(exports, &socket);
    let uri = format!("nbd+unix:///disk?socket={}", socket.display());
    let export = target::open(&uri, &writes(None, true)).expect("connect");
    // A small region, so that some blocks are written many times and the last versions
    // are in batches not yet on the members.
    let region = 2 * MIB;
    for durability in [Durability::Fua, Durability::Flush] {
        let (member_syncs, log_syncs) = (volume.stats().flushes, volume.stats().write_log.unwrap().syncs);
        let report = run::run(export.as_ref(), &durable_writes(durability, 4, region), &|_| {}).expect("a durable run");
        let stats = volume.stats();
        let log = stats.write_log.expect("the log");
        let writes = report.write.total_ios;
        assert!(writes > 10, "{durability}: {writes} writes");
        assert!(log.syncs - log_syncs > 0, "{durability}: {writes} writes and no log sync");
        assert!(
            (stats.flushes - member_syncs) * 10 < writes,
            "{durability}: {writes} writes cost {} member syncs",
            stats.flushes - member_syncs
        );
    }
    // What the last acknowledged writes left, read through the server.
    let mut before = vec![0u8; region as usize];
    volume.read(0, &mut before).expect("read");
    drop(export);
    server.shutdown();
    serving.join().unwrap().expect("server ends cleanly");
    drop(server);
    let volume = Arc::try_unwrap(volume).ok().expect("the server let the volume go");
    volume.abandon();
    let volume = Volume::open(members(), &open).expect("mount after the crash");
    assert!(volume.stats().recovery.write_log_entries_replayed > 0, "{:?}", volume.stats().recovery);
    let mut after = vec![0u8; region as usize];
    volume.read(0, &mut after).expect("read");
    assert!(after == before, "acknowledged writes were lost with the crash");
    volume.close().expect("close");
}
