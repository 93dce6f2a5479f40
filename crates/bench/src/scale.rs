//! `stripelog bench scale` (issue 20): what a volume costs in RAM and how fast it mounts,
//! measured in separate processes so that each figure is one open's own.
//!
//! The parent creates the volume on member files and writes it; every measurement is a
//! child process (`stripelog bench scale-step`, hidden) that opens the members and prints
//! one JSON line: its resident memory after the open and the open's duration. A mount from
//! the checkpoint and the scan of every segment's summaries (`OpenOptions::mount_by_scan`,
//! what every mount did before checkpoints) are measured on the same state, read-only;
//! then a writer child is killed with SIGKILL under load and both are measured again.

use crate::engine::{create_on, member_devices, open_devices, with_member_files};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stripelog_blockdev::{FileDevice, Prng};
use stripelog_engine::{CreateOptions, IoMode, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};

const TIB: f64 = (1u64 << 40) as f64;
const GIB: f64 = (1u64 << 30) as f64;
/// Sequential fill: one write of this many bytes at a time.
const FILL_WRITE_BYTES: usize = 4 << 20;

pub struct Options {
    pub directory: PathBuf,
    pub members: usize,
    pub member_size_bytes: u64,
    pub raid_level: RaidLevel,
    pub chunk_size_bytes: u32,
    pub spare_ppm: u32,
    /// Bytes written (sequentially) before the mount measurements.
    pub write_bytes: u64,
    /// How long the writer runs before it is killed.
    pub load: Duration,
    /// Logical size of the empty volume whose memory is measured (on sparse members).
    pub empty_logical_bytes: u64,
    /// This program, to run the measuring children.
    pub program: PathBuf,
    pub keep: bool,
    pub force: bool,
}

/// One child's open.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Open {
    pub seconds: f64,
    /// Of which recovery (the mount itself, before the volume's threads start).
    pub recovery_seconds: f64,
    pub resident_bytes: u64,
    /// The process before the open: what the volume's structures add is the difference.
    pub resident_before_open_bytes: u64,
    pub from_checkpoint: bool,
    pub batches_replayed: u64,
    pub segments_scanned: u64,
    /// Why the open failed, when it did.
    pub error: Option<String>,
}

impl Open {
    /// What the open added to the process (the volume's structures, pools and caches).
    pub fn added_bytes(&self) -> u64 {
        self.resident_bytes.saturating_sub(self.resident_before_open_bytes)
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct EmptyVolume {
    pub logical_bytes: u64,
    /// The open (`error` says why, if it was refused).
    pub open: Open,
    pub resident_gib_per_tib: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub empty: EmptyVolume,
    pub logical_bytes: u64,
    pub written_bytes: u64,
    pub write_seconds: f64,
    pub written_resident: Open,
    pub written_resident_gib_per_tib: f64,
    pub clean_mount: Open,
    pub clean_scan_mount: Open,
    pub killed_after_seconds: f64,
    pub killed_mount: Open,
    pub killed_scan_mount: Open,
    /// The read-write open after the kill: replay, repair and a new checkpoint.
    pub killed_read_write_open: Open,
}

fn create_options(options: &Options, force: bool) -> CreateOptions {
    CreateOptions {
        raid_level: options.raid_level,
        chunk_size_bytes: options.chunk_size_bytes,
        spare_ppm: options.spare_ppm,
        force,
        ..CreateOptions::default()
    }
}

fn open_options(program: &str) -> OpenOptions {
    OpenOptions { holder_program: program.into(), ..OpenOptions::default() }
}

/// Run one measuring child and read its line.
fn measure(program: &Path, paths: &[PathBuf], member_size_bytes: u64, step: &str) -> Result<Open, String> {
    let output = Command::new(program)
        .args(["bench", "scale-step", step, "--member-size", &member_size_bytes.to_string()])
        .args(paths)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|error| format!("{}: {error}", program.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().last().ok_or_else(|| format!("scale-step {step} printed nothing"))?;
    serde_json::from_str(line).map_err(|error| format!("scale-step {step}: {error}: {line}"))
}

pub fn run(options: &Options, progress: &dyn Fn(&str)) -> Result<Report, String> {
    let mut report = Report::default();
    // The empty volume: sparse members of the size that gives the logical size asked for.
    let data_columns = options.raid_level.data_columns(options.members).max(1) as u64;
    let spare = f64::from(options.spare_ppm) / 1e6;
    let empty_member_bytes = ((options.empty_logical_bytes as f64 / (1.0 - spare) / data_columns as f64) as u64)
        .next_multiple_of(u64::from(options.chunk_size_bytes))
        + 2 * u64::from(options.chunk_size_bytes);
    progress(&format!(
        "empty volume: {} members of {:.1} TiB (sparse)",
        options.members,
        empty_member_bytes as f64 / TIB
    ));
    report.empty =
        with_member_files(&options.directory, "scale-empty", options.members, &[], false, options.force, |paths| {
            let logical_bytes = {
                let devices = open_devices(paths, empty_member_bytes)?;
                match create_on(&devices, &create_options(options, true), &open_options("stripelog bench scale")) {
                    Ok(volume) => {
                        let bytes = volume.logical_size_bytes();
                        volume.close().map_err(|error| error.to_string())?;
                        Some(bytes)
                    }
                    Err(error) => {
                        return Ok(EmptyVolume {
                            logical_bytes: options.empty_logical_bytes,
                            open: Open { error: Some(format!("create: {error}")), ..Open::default() },
                            resident_gib_per_tib: 0.0,
                        })
                    }
                }
            };
            let logical_bytes = logical_bytes.unwrap_or(0);
            let open = measure(&options.program, paths, empty_member_bytes, "open")?;
            let per_tib = open.added_bytes() as f64 / GIB / (logical_bytes as f64 / TIB);
            Ok(EmptyVolume { logical_bytes, open, resident_gib_per_tib: per_tib })
        })?;
    with_member_files(&options.directory, "scale", options.members, &[], options.keep, options.force, |paths| {
        {
            let devices = open_devices(paths, options.member_size_bytes)?;
            let volume = create_on(&devices, &create_options(options, true), &open_options("stripelog bench scale"))?;
            report.logical_bytes = volume.logical_size_bytes();
            let total =
                options.write_bytes.min(report.logical_bytes) / FILL_WRITE_BYTES as u64 * FILL_WRITE_BYTES as u64;
            progress(&format!(
                "writing {:.1} GiB of {:.1} GiB logical",
                total as f64 / GIB,
                report.logical_bytes as f64 / GIB
            ));
            let mut data = vec![0u8; FILL_WRITE_BYTES];
            Prng::new(20).fill(&mut data);
            let started = Instant::now();
            let mut offset = 0;
            while offset < total {
                volume.write(offset, &data, false).map_err(|error| error.to_string())?;
                offset += FILL_WRITE_BYTES as u64;
            }
            volume.flush().map_err(|error| error.to_string())?;
            report.write_seconds = started.elapsed().as_secs_f64();
            report.written_bytes = total;
            volume.close().map_err(|error| error.to_string())?;
        }
        let logical_tib = report.logical_bytes as f64 / TIB;
        progress("clean mount: from the checkpoint, then by scanning every segment");
        report.clean_mount = measure(&options.program, paths, options.member_size_bytes, "open")?;
        report.written_resident = report.clean_mount.clone();
        report.written_resident_gib_per_tib = report.written_resident.added_bytes() as f64 / GIB / logical_tib;
        report.clean_scan_mount = measure(&options.program, paths, options.member_size_bytes, "open-by-scan")?;
        progress(&format!("random 4 KiB writes for {:.0} s, then SIGKILL", options.load.as_secs_f64()));
        let mut writer: Child = Command::new(&options.program)
            .args(["bench", "scale-step", "load", "--member-size", &options.member_size_bytes.to_string()])
            .args(paths)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|error| format!("{}: {error}", options.program.display()))?;
        // The writer says when it is open; the load runs from then.
        {
            use std::io::BufRead;
            let stdout = writer.stdout.take().ok_or("the writer's output")?;
            let mut line = String::new();
            std::io::BufReader::new(stdout).read_line(&mut line).map_err(|error| error.to_string())?;
            if !line.starts_with("open") {
                let _ = writer.kill();
                return Err(format!("the writer did not open the volume: {line}"));
            }
        }
        let started = Instant::now();
        std::thread::sleep(options.load);
        writer.kill().map_err(|error| format!("SIGKILL: {error}"))?;
        let _ = writer.wait();
        report.killed_after_seconds = started.elapsed().as_secs_f64();
        report.killed_scan_mount = measure(&options.program, paths, options.member_size_bytes, "open-by-scan")?;
        report.killed_mount = measure(&options.program, paths, options.member_size_bytes, "open")?;
        report.killed_read_write_open = measure(&options.program, paths, options.member_size_bytes, "open-read-write")?;
        Ok(())
    })?;
    Ok(report)
}

/// The child's side: `step` is `open`, `open-by-scan`, `open-read-write` (print one JSON
/// line) or `load` (print `open`, then write random 4 KiB blocks until killed).
pub fn step(step: &str, paths: &[PathBuf], member_size_bytes: u64) -> Result<(), String> {
    let devices: Vec<Arc<FileDevice>> = open_devices(paths, member_size_bytes)?;
    let members = member_devices(&devices);
    let read_only = matches!(step, "open" | "open-by-scan");
    let options = OpenOptions {
        read_only,
        mount_by_scan: step == "open-by-scan",
        io_mode: IoMode::Threaded,
        cache_size_bytes: 0,
        ..open_options("stripelog bench scale-step")
    };
    let resident_before_open_bytes = crate::resident_memory_bytes().unwrap_or(0);
    let started = Instant::now();
    let volume = match Volume::open(members, &options) {
        Ok(volume) => volume,
        Err(error) => {
            let open = Open { error: Some(error.to_string()), ..Open::default() };
            println!("{}", serde_json::to_string(&open).map_err(|error| error.to_string())?);
            return Ok(());
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    if step == "load" {
        println!("open");
        let blocks = volume.logical_size_bytes() / BLOCK_SIZE_BYTES as u64;
        let mut prng = Prng::new(21);
        let mut data = vec![0u8; BLOCK_SIZE_BYTES];
        let mut written = 0u64;
        loop {
            prng.fill(&mut data);
            let block = prng.below(blocks);
            volume.write(block * BLOCK_SIZE_BYTES as u64, &data, false).map_err(|error| error.to_string())?;
            written += 1;
            // Now and then a flush, as a filesystem's journal commits.
            if written.is_multiple_of(4096) {
                volume.flush().map_err(|error| error.to_string())?;
            }
        }
    }
    let recovery = volume.stats().recovery;
    let open = Open {
        seconds,
        recovery_seconds: recovery.seconds,
        resident_bytes: crate::resident_memory_bytes().unwrap_or(0),
        resident_before_open_bytes,
        from_checkpoint: recovery.checkpoint_generation.is_some(),
        batches_replayed: recovery.batches_replayed,
        segments_scanned: recovery.segments_scanned,
        error: None,
    };
    println!("{}", serde_json::to_string(&open).map_err(|error| error.to_string())?);
    if read_only {
        drop(volume);
    } else {
        volume.close().map_err(|error| error.to_string())?;
    }
    Ok(())
}

/// Text for a person.
pub fn describe(report: &Report) -> String {
    let logical_tib = report.logical_bytes as f64 / TIB;
    let line = |name: &str, open: &Open| {
        match &open.error {
        Some(error) => format!("  {name:<34} refused: {error}\n"),
        None => format!(
            "  {name:<38} {:>7.3} s (recovery {:.3} s; {:.2} s per TiB)  +{:.1} MiB  {} batches replayed, {} segments read\n",
            open.seconds,
            open.recovery_seconds,
            open.seconds / logical_tib,
            open.added_bytes() as f64 / (1u64 << 20) as f64,
            open.batches_replayed,
            open.segments_scanned
        ),
    }
    };
    let mut text = String::new();
    text += &format!(
        "empty volume, {:.1} TiB logical: {}\n",
        report.empty.logical_bytes as f64 / TIB,
        match &report.empty.open.error {
            Some(error) => format!("refused: {error}"),
            None => format!(
                "the open added {:.1} MiB ({:.3} GiB per TiB), opened in {:.3} s",
                report.empty.open.added_bytes() as f64 / (1u64 << 20) as f64,
                report.empty.resident_gib_per_tib,
                report.empty.open.seconds
            ),
        }
    );
    text += &format!(
        "volume of {:.1} GiB logical ({:.4} TiB), {:.1} GiB written in {:.1} s: the open added {:.1} MiB ({:.3} GiB per TiB, fixed pools included)\n",
        report.logical_bytes as f64 / GIB,
        logical_tib,
        report.written_bytes as f64 / GIB,
        report.write_seconds,
        report.written_resident.added_bytes() as f64 / (1u64 << 20) as f64,
        report.written_resident_gib_per_tib
    );
    text += "mount (read-only opens in their own process):\n";
    text += &line("clean, from the checkpoint", &report.clean_mount);
    text += &line("clean, scanning every segment", &report.clean_scan_mount);
    text += &format!(
        "  (a writer doing random 4 KiB writes killed with SIGKILL after {:.1} s)\n",
        report.killed_after_seconds
    );
    text += &line("after SIGKILL, from the checkpoint", &report.killed_mount);
    text += &line("after SIGKILL, scanning every segment", &report.killed_scan_mount);
    text += &line("after SIGKILL, read-write open", &report.killed_read_write_open);
    text
}
