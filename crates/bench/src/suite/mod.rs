//! `stripelog bench suite`: every figure users ask about, each measured beside its peer in
//! the same run — fio on the raw members for the hardware's own bound, `nbdkit memory` or
//! `nbdkit file` for the NBD figures, fio running the cleaner's own read/write mix for the
//! steady state — on member files, named devices, or a [`crate::testbed`] of throttled
//! drives. It starts every program it measures as a child (this binary's own subcommands,
//! fio, nbdkit), records each command line beside the figure it produced, fails loudly when
//! a server does not start, and writes `report.json` and `report.md` (tables, commands and
//! SVG charts) into its output directory.

mod parts;
mod process;
mod report;

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use process::shell_words;

/// The parts a user can pick, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    Fresh,
    Steady,
    Reads,
    Nbd,
    NbdMulti,
    Sync,
    Rebuild,
    Check,
    Compression,
    Dedup,
    Cores,
    Index,
}

impl Part {
    pub const ALL: [Part; 12] = [
        Part::Fresh,
        Part::Steady,
        Part::Reads,
        Part::Nbd,
        Part::NbdMulti,
        Part::Sync,
        Part::Rebuild,
        Part::Check,
        Part::Compression,
        Part::Dedup,
        Part::Cores,
        Part::Index,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Part::Fresh => "fresh",
            Part::Steady => "steady",
            Part::Reads => "reads",
            Part::Nbd => "nbd",
            Part::NbdMulti => "nbd-multi",
            Part::Sync => "sync",
            Part::Rebuild => "rebuild",
            Part::Check => "check",
            Part::Compression => "compression",
            Part::Dedup => "dedup",
            Part::Cores => "cores",
            Part::Index => "index",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Part::Fresh => "Fresh volume: 4 KiB random writes in process",
            Part::Steady => "Steady state: a full volume at 27 % spare, the cleaner running",
            Part::Reads => "4 KiB random reads, block cache off",
            Part::Nbd => "NBD, one connection",
            Part::NbdMulti => "NBD, four connections",
            Part::Sync => "Durable writes: one 4 KiB write and flush at a time, through NBD",
            Part::Rebuild => "Rebuild of one member",
            Part::Check => "Check (scrub) of the whole volume",
            Part::Compression => "Compression (lz4), half-compressible data",
            Part::Dedup => "Deduplication: a second copy of the same data",
            Part::Cores => "Cores: the NBD server on one core and on two (members in /dev/shm)",
            Part::Index => {
                "The index beyond its cache: the map cache at the whole index, a half, a quarter and a tenth"
            }
        }
    }

    pub fn parse(text: &str) -> Result<Part, String> {
        Part::ALL.into_iter().find(|part| part.name() == text).ok_or_else(|| {
            format!(
                "unknown part {text:?} (parts: {})",
                Part::ALL.iter().map(|part| part.name()).collect::<Vec<_>>().join(", ")
            )
        })
    }
}

/// Where the members come from.
#[derive(Clone, Debug)]
pub enum Members {
    /// `count` files `member-N` in `directory` (created, removed afterwards), and a
    /// `spare` file for the rebuild.
    Files { directory: PathBuf, count: usize },
    /// Files or block devices the user named, and the spare the rebuild writes to.
    Devices { paths: Vec<PathBuf>, spare: Option<PathBuf> },
    /// A testbed of `drive_count` throttled drives, one of them the spare.
    Testbed(crate::testbed::Options),
}

pub struct Options {
    /// This program: the suite runs its own subcommands as children.
    pub stripelog: PathBuf,
    pub members: Members,
    /// Size of member files the suite creates (the testbed's drives have their own).
    pub member_size_bytes: u64,
    pub parts: Vec<Part>,
    /// Length of each measured cell.
    pub cell: Duration,
    /// The steady-state part's time limit (its fill and the writes until steady state).
    pub steady_limit: Duration,
    /// The steady-state part's write queue (`bench saturate --write-queue`; `None`: the
    /// engine's default).
    pub steady_write_queue_bytes: Option<u64>,
    /// Where report.json, report.md, the charts and the children's logs go.
    pub output: PathBuf,
    pub force: bool,
}

/// One figure, its peer and their ratio.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub name: String,
    pub value: f64,
    pub unit: String,
    pub command: String,
    pub peer: Option<Peer>,
    /// value ÷ the peer's value.
    pub ratio: Option<f64>,
    pub bar: Option<Bar>,
    /// The machine's cores kept busy while stripelog's command ran (all processes).
    pub cores_busy: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Peer {
    pub name: String,
    pub value: f64,
    pub command: String,
}

/// A bar the figure (or its ratio, when it has a peer) is judged against.
#[derive(Clone, Debug, Serialize)]
pub struct Bar {
    /// "at least" or "at most".
    pub direction: String,
    pub threshold: f64,
    pub goal: Option<f64>,
    pub met: bool,
}

impl Figure {
    fn new(name: impl Into<String>, value: f64, unit: &str, command: &str) -> Figure {
        Figure {
            name: name.into(),
            value,
            unit: unit.into(),
            command: command.into(),
            peer: None,
            ratio: None,
            bar: None,
            cores_busy: None,
        }
    }

    fn beside(mut self, name: impl Into<String>, value: f64, command: &str) -> Figure {
        self.ratio = (value > 0.0).then(|| self.value / value);
        self.peer = Some(Peer { name: name.into(), value, command: command.into() });
        self
    }

    /// Judge the ratio (or the value, without a peer) against `threshold`, at least.
    fn at_least(mut self, threshold: f64, goal: Option<f64>) -> Figure {
        let judged = self.ratio.unwrap_or(self.value);
        self.bar = Some(Bar { direction: "at least".into(), threshold, goal, met: judged >= threshold });
        self
    }

    /// Judge the value itself (in its unit, whatever its peer) against `threshold`, at most.
    fn at_most(mut self, threshold: f64) -> Figure {
        self.bar = Some(Bar { direction: "at most".into(), threshold, goal: None, met: self.value <= threshold });
        self
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PartReport {
    pub part: Part,
    pub title: String,
    pub seconds: f64,
    /// CPU time of the part's children ÷ its wall time: cores kept busy.
    pub cores_busy: f64,
    /// What limited the part's figures, and the measurement that shows it.
    pub limit: String,
    pub figures: Vec<Figure>,
    /// Chart files in the output directory.
    pub charts: Vec<String>,
    pub notes: Vec<String>,
    /// Why the part failed, when it did (its figures are then incomplete).
    pub error: Option<String>,
}

/// One member's own speeds, measured by fio with all members running at once.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemberSpeed {
    pub path: String,
    pub description: String,
    pub size_bytes: u64,
    pub sequential_write_bytes_per_second: f64,
    pub sequential_read_bytes_per_second: f64,
    /// The same sequential writes and reads through io_uring as the engine submits
    /// (straight to the kernel's workers on the testbed, where an inline attempt the
    /// throttle holds back is charged twice): the two agree when the engine's path gets the
    /// drive's whole speed.
    pub sequential_write_io_uring_bytes_per_second: f64,
    pub sequential_read_io_uring_bytes_per_second: f64,
}

/// The members together, measured by fio: the hardware's own bounds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ArraySpeed {
    pub members: Vec<MemberSpeed>,
    pub sequential_write_bytes_per_second: f64,
    pub sequential_read_bytes_per_second: f64,
    pub random_read_iops_depth_32: f64,
    pub random_write_iops_depth_32: f64,
    pub commands: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub memory_bytes: u64,
    pub kernel: String,
    pub stripelog_version: String,
    pub fio_version: String,
    pub nbdkit_version: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub started_utc: String,
    pub command: String,
    pub machine: Machine,
    pub member_kind: String,
    pub testbed: Option<crate::testbed::Description>,
    pub array: ArraySpeed,
    pub cell_seconds: f64,
    pub parts: Vec<PartReport>,
    pub seconds: f64,
}

impl Report {
    pub fn failed_parts(&self) -> Vec<&PartReport> {
        self.parts.iter().filter(|part| part.error.is_some()).collect()
    }
}

/// Programs the suite needs beside itself, and the Debian package of each.
const TOOLS: [(&str, &str); 4] =
    [("fio", "fio"), ("nbdkit", "nbdkit"), ("taskset", "util-linux"), ("losetup", "mount")];

/// Run the suite: `command` is how it was started (for the report), `progress` gets a line
/// per step. The report is written to the output directory whatever happens to a part.
pub fn run(options: &Options, command: &str, progress: &dyn Fn(&str)) -> Result<Report, String> {
    for (tool, package) in TOOLS {
        if process::find_program(tool).is_none() {
            return Err(format!(
                "{tool} is missing (Debian package {package}; scripts/install-deps.sh installs it): the suite measures \
                 every figure beside a peer it runs"
            ));
        }
    }
    if options.parts.is_empty() {
        return Err("no parts to run".into());
    }
    prepare_output(&options.output, options.force)?;
    let started = Instant::now();
    let started_utc = process::utc_now();
    let mut testbed = None;
    let (members, spare, member_kind) = match &options.members {
        Members::Files { directory, count } => {
            let paths: Vec<PathBuf> = (0..*count).map(|index| directory.join(format!("member-{index}"))).collect();
            let spare = directory.join("spare");
            if !options.force {
                for path in paths.iter().chain([&spare]) {
                    crate::target::refuse_existing_data(path)?;
                }
            }
            std::fs::create_dir_all(directory).map_err(|error| format!("{}: {error}", directory.display()))?;
            for path in paths.iter().chain([&spare]) {
                let file = std::fs::File::create(path).map_err(|error| format!("{}: {error}", path.display()))?;
                file.set_len(options.member_size_bytes).map_err(|error| format!("{}: {error}", path.display()))?;
            }
            (paths, Some(spare), format!("files in {}", directory.display()))
        }
        Members::Devices { paths, spare } => {
            if !options.force {
                for path in paths.iter().chain(spare) {
                    crate::target::refuse_existing_data(path)?;
                }
            }
            (paths.clone(), spare.clone(), "named files or devices".to_string())
        }
        Members::Testbed(testbed_options) => {
            progress(&format!("bringing up a testbed of {} drives", testbed_options.drive_count));
            let up = crate::testbed::Testbed::up(testbed_options)?;
            let devices = up.devices().to_vec();
            testbed = Some(up);
            let (spare, members) = devices.split_last().ok_or("a testbed without drives")?;
            (members.to_vec(), Some(spare.clone()), "testbed: throttled loop devices over /dev/shm".to_string())
        }
    };
    if members.len() < 3 {
        return Err(format!("the suite needs at least 3 members (RAID-5); it has {}", members.len()));
    }
    let mut context = parts::Context::new(options, members.clone(), spare, progress);
    let result = run_parts(options, &mut context, progress);
    let report = result.map(|(array, parts)| Report {
        started_utc,
        command: command.to_string(),
        machine: machine(),
        member_kind,
        testbed: testbed.as_ref().map(crate::testbed::Testbed::describe),
        array,
        cell_seconds: options.cell.as_secs_f64(),
        parts,
        seconds: started.elapsed().as_secs_f64(),
    });
    drop(testbed);
    if let Members::Files { directory, .. } = &options.members {
        for path in members.iter().chain([&directory.join("spare")]) {
            let _ = std::fs::remove_file(path);
        }
        let _ = std::fs::remove_file(directory.join("peer-file"));
    }
    let report = report?;
    report::write(&report, &options.output)?;
    Ok(report)
}

fn run_parts(
    options: &Options,
    context: &mut parts::Context,
    progress: &dyn Fn(&str),
) -> Result<(ArraySpeed, Vec<PartReport>), String> {
    progress("calibrating the members with fio (sequential and 4 KiB random, all members at once)");
    let array = context.calibrate()?;
    let mut reports = Vec::new();
    for &part in &options.parts {
        progress(&format!("part {}: {}", part.name(), part.title()));
        reports.push(context.run_part(part));
        if let Some(error) = &reports.last().and_then(|report: &PartReport| report.error.clone()) {
            progress(&format!("part {} FAILED: {error}", part.name()));
        }
    }
    Ok((array, reports))
}

/// Refuse an output directory that holds anything but an earlier report, unless forced.
fn prepare_output(output: &Path, force: bool) -> Result<(), String> {
    if let Ok(entries) = std::fs::read_dir(output) {
        let foreign: Vec<String> = entries
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| !name.starts_with("report.") && !name.ends_with(".svg") && name != "work")
            .collect();
        if !foreign.is_empty() && !force {
            return Err(format!(
                "{}: holds {} (not a suite report); the suite writes its report there: choose another --output or \
                 pass --force",
                output.display(),
                foreign.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    std::fs::create_dir_all(output.join("work")).map_err(|error| format!("{}: {error}", output.display()))
}

fn machine() -> Machine {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|line| {
            line.strip_prefix("model name").map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let memory_bytes = read("/proc/meminfo")
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024);
    Machine {
        cores: std::thread::available_parallelism().map_or(1, |count| count.get()),
        cpu,
        memory_bytes,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        stripelog_version: env!("CARGO_PKG_VERSION").to_string(),
        fio_version: process::first_line_of(&["fio", "--version"]),
        nbdkit_version: process::first_line_of(&["nbdkit", "--version"]),
    }
}
