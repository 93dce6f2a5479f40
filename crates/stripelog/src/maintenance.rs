//! `stripelog replace` and `stripelog scrub`, offline on the members or online through
//! the control socket of `stripelog serve` (docs/resilience.md). The control protocol is
//! one JSON request line from the client, then JSON lines from the server: any number of
//! `{"progress": {...}}`, then one `{"report": {...}}` or `{"error": "..."}`.

use crate::units::{self, format_bytes};
use crate::{device_error, engine_error, open_members, print_json, DegradedArgument};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use stripelog_blockdev::{BlockDevice, FileDevice, FileDeviceOptions};
use stripelog_engine::{MaintenanceOptions, MaintenanceProgress, MemberDevice, OpenOptions, ReplaceOptions, Volume};

#[derive(Args)]
pub(crate) struct ReplaceArguments {
    /// The member to replace: its position (0, 1, ...) or its path as given to the volume.
    #[arg(long)]
    member: String,
    /// The new member: a file (created sparse at the member size when missing) or a block
    /// device. One that holds data or belongs to a volume is refused unless --force; a
    /// member this volume uses, always.
    #[arg(long = "with")]
    replacement: PathBuf,
    /// At most this much written to the new member per second (e.g. 200MiB).
    #[arg(long, value_parser = units::parse_size)]
    rate: Option<u64>,
    /// Overwrite a replacement that holds data, another volume's member, or a retired or
    /// failed member of this volume.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    volume: VolumeArguments,
}

#[derive(Args)]
pub(crate) struct SetArguments {
    /// The setting, as NAME=VALUE: compression=lz4|off, dedup=on|off (new writes only; a
    /// volume created without compression or deduplication cannot turn it on).
    setting: String,
    #[command(flatten)]
    volume: VolumeArguments,
}

/// `stripelog set NAME=VALUE`: on a running server through its control socket, or on the
/// members offline.
pub(crate) fn set(arguments: SetArguments) -> Result<ExitCode, String> {
    let Some((setting, value)) = arguments.setting.split_once('=') else {
        return Err(format!("{}: the setting must be NAME=VALUE", arguments.setting));
    };
    // Checked here, before a volume is opened or a server asked.
    let value = setting_value(setting, value)?;
    if let Some(control) = &arguments.volume.control {
        let request = ControlRequest::Set {
            export: arguments.volume.export.clone(),
            setting: setting.to_string(),
            value: value.clone(),
        };
        call(control, &request, "set")?;
    } else {
        let volume = arguments.volume.open("stripelog set")?;
        apply_setting(&volume, setting, &value)?;
        volume.close().map_err(engine_error)?;
    }
    println!("{setting}={value}");
    Ok(ExitCode::SUCCESS)
}

/// The value of a setting `stripelog set` takes, as it is shown (`lz4`, `on`), or why it
/// is not one.
pub(crate) fn setting_value(setting: &str, value: &str) -> Result<String, String> {
    match setting {
        "compression" => Ok(value
            .parse::<stripelog_engine::format::CompressionSetting>()
            .map_err(|error| error.to_string())?
            .to_string()),
        "dedup" => Ok(if crate::units::parse_on_off(value)? { "on" } else { "off" }.to_string()),
        _ => Err(format!("{setting}: the setting must be compression=lz4|off or dedup=on|off")),
    }
}

/// Change `setting` of an open volume to `value` (checked by [`setting_value`]).
pub(crate) fn apply_setting(volume: &Volume, setting: &str, value: &str) -> Result<(), String> {
    let value = setting_value(setting, value)?;
    let result = match setting {
        "dedup" => volume.set_deduplication(value == "on"),
        _ => volume.set_compression(
            value.parse::<stripelog_engine::format::CompressionSetting>().map_err(|error| error.to_string())?,
        ),
    };
    result.map_err(engine_error)
}

#[derive(Args)]
pub(crate) struct ScrubArguments {
    /// At most this much read from the members per second (e.g. 500MiB).
    #[arg(long, value_parser = units::parse_size)]
    rate: Option<u64>,
    #[command(flatten)]
    volume: VolumeArguments,
}

/// Where `replace` and `scrub` act: a running server's control socket, or the members.
#[derive(Args)]
struct VolumeArguments {
    /// Ask a running `stripelog serve` to do it, through its control socket.
    #[arg(long)]
    control: Option<PathBuf>,
    /// The export to act on (with --control; default: the first).
    #[arg(long)]
    export: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    degraded: DegradedArgument,
    /// The volume's members in order (offline; `missing` for a lost one).
    members: Vec<PathBuf>,
}

impl VolumeArguments {
    /// The volume opened read-write on its members (offline), by `program`.
    fn open(&self, program: &str) -> Result<Volume, String> {
        let members = self.member_devices()?;
        self.open_volume(members, program)
    }

    /// The members, opened (and claimed) but not yet read.
    fn member_devices(&self) -> Result<Vec<MemberDevice>, String> {
        if self.members.is_empty() {
            return Err("give the volume's members (offline), or --control SOCKET of a running server".into());
        }
        open_members(&self.members, None, false, self.degraded.degraded)
    }

    fn open_volume(&self, members: Vec<MemberDevice>, program: &str) -> Result<Volume, String> {
        let options = OpenOptions { holder_program: program.to_string(), ..OpenOptions::default() };
        Volume::open(members, &options).map_err(engine_error)
    }
}

/// Offline, before the volume is opened read-write (which records an epoch): open the
/// replacement at `path` if it exists — a member of this volume is already claimed, so that
/// fails here — and refuse one holding data or another volume's member unless `force`
/// (docs/data-safety.md). A member of this volume (retired, failed) is left to the engine,
/// which names what it is. `None` when nothing is at `path` yet.
fn check_replacement_offline(
    members: &[MemberDevice],
    path: &Path,
    force: bool,
) -> Result<Option<MemberDevice>, String> {
    if !path.exists() {
        return Ok(None);
    }
    let name = path.display().to_string();
    let device = FileDevice::open(path, &FileDeviceOptions::default()).map_err(|error| device_error(&name, error))?;
    let content = stripelog_engine::identity::inspect(&device).map_err(|error| device_error(&name, error))?;
    let volume_uuid = members.iter().filter_map(|member| member.device.as_ref()).find_map(|member| {
        match stripelog_engine::identity::inspect(member.as_ref()) {
            Ok(stripelog_engine::identity::DeviceContent::Member(superblock)) => Some(superblock.volume_uuid),
            _ => None,
        }
    });
    let refused = match &content {
        stripelog_engine::identity::DeviceContent::Empty => false,
        stripelog_engine::identity::DeviceContent::Member(found) => Some(found.volume_uuid) != volume_uuid,
        stripelog_engine::identity::DeviceContent::Data { .. } => true,
    };
    if refused && !force {
        return Err(format!(
            "{name} {}: refusing to overwrite it unless forced (pass --force to overwrite it)",
            content.describe()
        ));
    }
    Ok(Some(MemberDevice { name, device: Some(Arc::new(device) as Arc<dyn BlockDevice>) }))
}

/// One request on the control socket.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "command", rename_all = "lowercase")]
pub(crate) enum ControlRequest {
    Replace {
        export: Option<String>,
        member: String,
        replacement: PathBuf,
        rate: Option<u64>,
        #[serde(default)]
        force: bool,
    },
    Scrub {
        export: Option<String>,
        rate: Option<u64>,
    },
    Status {
        export: Option<String>,
    },
    /// The whole server: every export's health, clients, space, counters, and what is
    /// under way (`stripelog status`).
    Overview {},
    /// Change a setting of the served volume (`stripelog set`).
    Set {
        export: Option<String>,
        /// `compression` or `dedup`.
        setting: String,
        value: String,
    },
}

/// Which member `text` names: a position, or a member's name (its path as given).
pub(crate) fn member_index(volume: &Volume, text: &str) -> Result<usize, String> {
    let stats = volume.stats();
    if let Ok(index) = text.parse::<usize>() {
        if index < stats.member_count {
            return Ok(index);
        }
        return Err(format!("member {index} does not exist (the volume has {})", stats.member_count));
    }
    stats
        .members
        .iter()
        .find(|member| member.name == text || Path::new(&member.name) == Path::new(text))
        .map(|member| member.index)
        .ok_or_else(|| format!("no member is named {text}: give its position or its path as given to the volume"))
}

/// Open the replacement device, created at the volume's member size if it is a missing
/// file. A device this process already has open (a member of this or another served
/// volume) is refused here, before anything is written (docs/data-safety.md).
pub(crate) fn open_replacement(volume: &Volume, path: &Path) -> Result<MemberDevice, String> {
    let size = volume.geometry().member_size_bytes;
    let options = FileDeviceOptions {
        create_size_bytes: (!path.exists()).then_some(size),
        read_only: false,
        ..FileDeviceOptions::default()
    };
    let name = path.display().to_string();
    let device = FileDevice::open(path, &options).map_err(|error| device_error(&name, error))?;
    Ok(MemberDevice { name, device: Some(Arc::new(device) as Arc<dyn BlockDevice>) })
}

/// Replace `member` of `volume` by the device at `replacement` (unless a rebuild of that
/// member is already under way: a crash interrupted it, and the rebuild finishes it).
pub(crate) fn attach_replacement(
    volume: &Volume,
    member: usize,
    replacement: &Path,
    force: bool,
) -> Result<(), String> {
    if volume.rebuilding_members().contains(&member) {
        return Ok(());
    }
    let device = open_replacement(volume, replacement)?;
    volume.replace_member(member, device, &ReplaceOptions { force }).map_err(engine_error)
}

/// A progress bar over segments (hidden off a terminal).
fn maintenance_bar(what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(1);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} segments [{elapsed} < {eta}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(what.to_string());
    bar
}

fn show(bar: &indicatif::ProgressBar, progress: &MaintenanceProgress, verb: &str) {
    bar.set_length(progress.segments_total);
    bar.set_position(progress.segments_done);
    bar.set_message(format!("{} {verb}", format_bytes(progress.bytes)));
}

pub(crate) fn replace(arguments: ReplaceArguments) -> Result<ExitCode, String> {
    if let Some(control) = &arguments.volume.control {
        let request = ControlRequest::Replace {
            export: arguments.volume.export.clone(),
            member: arguments.member.clone(),
            replacement: std::path::absolute(&arguments.replacement).map_err(|error| error.to_string())?,
            rate: arguments.rate,
            force: arguments.force,
        };
        let report = call(control, &request, "written")?;
        return print_report(&report, arguments.volume.json, print_rebuild);
    }
    let members = arguments.volume.member_devices()?;
    let replacement = check_replacement_offline(&members, &arguments.replacement, arguments.force)?;
    let volume = arguments.volume.open_volume(members, "stripelog replace")?;
    let member = member_index(&volume, &arguments.member)?;
    // A rebuild a crash interrupted is finished first (the same member, or another).
    match replacement {
        Some(device) if !volume.rebuilding_members().contains(&member) => {
            volume.replace_member(member, device, &ReplaceOptions { force: arguments.force }).map_err(engine_error)?
        }
        _ => attach_replacement(&volume, member, &arguments.replacement, arguments.force)?,
    }
    let bar = maintenance_bar("rebuilding");
    let options = MaintenanceOptions { rate_bytes_per_second: arguments.rate };
    let report = volume.rebuild(&options, &|progress| show(&bar, &progress, "written"));
    bar.finish_and_clear();
    let report = report.map_err(|error| error.to_string())?;
    volume.close().map_err(|error| error.to_string())?;
    let value = serde_json::to_value(&report).map_err(|error| error.to_string())?;
    eprintln!("stripelog: give {} in place of member {member} from now on", arguments.replacement.display());
    print_report(&value, arguments.volume.json, print_rebuild)
}

pub(crate) fn scrub(arguments: ScrubArguments) -> Result<ExitCode, String> {
    let report = if let Some(control) = &arguments.volume.control {
        call(control, &ControlRequest::Scrub { export: arguments.volume.export.clone(), rate: arguments.rate }, "read")?
    } else {
        let volume = arguments.volume.open("stripelog scrub")?;
        let bar = maintenance_bar("scrubbing");
        let options = MaintenanceOptions { rate_bytes_per_second: arguments.rate };
        let report = volume.scrub(&options, &|progress| show(&bar, &progress, "read"));
        bar.finish_and_clear();
        let report = report.map_err(|error| error.to_string())?;
        volume.close().map_err(|error| error.to_string())?;
        serde_json::to_value(&report).map_err(|error| error.to_string())?
    };
    let unrecoverable = report["logical_blocks_unrecoverable"].as_array().map_or(0, Vec::len);
    print_report(&report, arguments.volume.json, print_scrub)?;
    Ok(if unrecoverable == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn print_report(report: &serde_json::Value, json: bool, print: fn(&serde_json::Value)) -> Result<ExitCode, String> {
    if json {
        print_json(report)?;
    } else {
        print(report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_rebuild(report: &serde_json::Value) {
    let bytes = report["bytes_written"].as_u64().unwrap_or(0);
    let seconds = report["seconds"].as_f64().unwrap_or(0.0);
    println!(
        "rebuilt members {}: {} segments, {} written in {:.1} s ({}/s); {} blocks unrecoverable",
        report["members"],
        report["segments_rebuilt"],
        format_bytes(bytes),
        seconds,
        format_bytes((bytes as f64 / seconds.max(1e-9)) as u64),
        report["blocks_unrecoverable"]
    );
}

fn print_scrub(report: &serde_json::Value) {
    println!(
        "scrubbed {} segments ({} read in {:.1} s): {} member blocks and {} parity rows checked",
        report["segments_scanned"],
        format_bytes(report["bytes_read"].as_u64().unwrap_or(0)),
        report["seconds"].as_f64().unwrap_or(0.0),
        report["blocks_checked"],
        report["parity_rows_checked"]
    );
    println!(
        "  damaged {}; repaired: {} segments evacuated, {} live blocks rewritten; unrecoverable {}",
        report["blocks_damaged"],
        report["segments_repaired"],
        report["blocks_repaired"],
        report["logical_blocks_unrecoverable"].as_array().map_or(0, Vec::len)
    );
    if let Some(blocks) = report["logical_blocks_unrecoverable"].as_array().filter(|blocks| !blocks.is_empty()) {
        let list: Vec<String> = blocks.iter().map(ToString::to_string).collect();
        println!("  unrecoverable logical blocks (4 KiB): {}", list.join(" "));
    }
}

/// What an NBD server sends first, on every connection (the newstyle greeting).
const NBD_GREETING: &[u8] = b"NBDMAGIC";

fn not_a_control_socket(path: &Path) -> String {
    format!(
        "{}: not a control socket: an NBD server answered (the control socket of `stripelog serve --socket S` is \
         S.control, or the one given with --control)",
        path.display()
    )
}

/// Send `request` to a server's control socket; show its progress; return its report.
fn call(control: &Path, request: &ControlRequest, verb: &str) -> Result<serde_json::Value, String> {
    let mut stream = UnixStream::connect(control)
        .map_err(|error| format!("{}: {error} (is stripelog serve running?)", control.display()))?;
    let line = serde_json::to_string(request).map_err(|error| error.to_string())?;
    writeln!(stream, "{line}").map_err(|error| format!("{}: {error}", control.display()))?;
    let bar = maintenance_bar("");
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        let read = reader.read_until(b'\n', &mut line);
        // An NBD server greets first ("NBDMAGIC"), then drops a client that sends a line
        // of JSON: what was read says what answered, before the error or end.
        if line.starts_with(NBD_GREETING) {
            bar.finish_and_clear();
            return Err(not_a_control_socket(control));
        }
        match read {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => return Err(format!("{}: {error}", control.display())),
        }
        let message: serde_json::Value = serde_json::from_slice(&line).map_err(|error| {
            format!("{}: bad reply (is it a stripelog control socket?): {error}", control.display())
        })?;
        if let Some(progress) = message.get("progress") {
            let field = |name: &str| progress[name].as_u64().unwrap_or(0);
            let progress = MaintenanceProgress {
                segments_done: field("segments_done"),
                segments_total: field("segments_total"),
                bytes: field("bytes"),
            };
            show(&bar, &progress, verb);
        } else if let Some(report) = message.get("report") {
            bar.finish_and_clear();
            return Ok(report.clone());
        } else if let Some(error) = message.get("error") {
            bar.finish_and_clear();
            return Err(error.as_str().unwrap_or("error").to_string());
        }
    }
    bar.finish_and_clear();
    Err(format!("{}: the server closed the connection without a report", control.display()))
}

#[derive(Args)]
pub(crate) struct StatusArguments {
    /// The control socket of a running `stripelog serve` (it listens on SOCKET.control
    /// unless given --control).
    #[arg(long)]
    control: PathBuf,
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
}

/// `stripelog status --control SOCKET`: a running server's exports at a glance.
pub(crate) fn status(arguments: StatusArguments) -> Result<ExitCode, String> {
    let status = call(&arguments.control, &ControlRequest::Overview {}, "status")?;
    if arguments.json {
        print_json(&status)?;
    } else {
        print!("{}", status_text(&status));
    }
    let healthy =
        status["exports"].as_array().is_some_and(|exports| exports.iter().all(|export| export["health"] == "ONLINE"));
    Ok(if healthy { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The human form of `status`, in the style of `zpool status`.
fn status_text(status: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let number = |value: &serde_json::Value| value.as_u64().unwrap_or(0);
    let mut text = String::new();
    let _ = writeln!(
        text,
        "server   pid {}, stripelog {}, up {}, TLS {}, {} connection(s) accepted{}",
        number(&status["process_id"]),
        status["version"].as_str().unwrap_or("?"),
        units::format_seconds(status["uptime_seconds"].as_f64().unwrap_or(0.0)),
        match status["tls"].as_str().unwrap_or("off") {
            "off" => "off".to_string(),
            mode => format!(
                "{mode} ({} handshake(s), {} failed)",
                number(&status["tls_handshakes_completed"]) + number(&status["tls_handshakes_failed"]),
                number(&status["tls_handshakes_failed"])
            ),
        },
        number(&status["connections_accepted"]),
        if status["shutting_down"] == true { ", SHUTTING DOWN" } else { "" }
    );
    for export in status["exports"].as_array().into_iter().flatten() {
        let space = &export["space"];
        let (total, free) = (number(&space["segments_total"]), number(&space["segments_free"]));
        let (mapped, logical) = (number(&space["blocks_mapped"]), number(&space["logical_blocks"]).max(1));
        let _ = writeln!(text);
        let _ = writeln!(
            text,
            "export   {}  ({}, {})",
            export["name"].as_str().unwrap_or("?"),
            export["raid_level"].as_str().unwrap_or("?"),
            format_bytes(number(&export["logical_size_bytes"]))
        );
        let _ = writeln!(text, "health   {}", export["health_detail"].as_str().unwrap_or("?"));
        let _ = writeln!(text, "clients  {} connected", number(&export["clients"]));
        let recovery = &export["recovery"];
        if recovery["closed_cleanly"] == false {
            let _ = writeln!(
                text,
                "recovery at this open: the volume had not been closed cleanly; {} batches replayed, {} unflushed or \
                 torn ones discarded, {} shards repaired, {} write log entries replayed",
                number(&recovery["batches_replayed"]),
                number(&recovery["batches_discarded"]),
                number(&recovery["shards_repaired"]),
                number(&recovery["write_log_entries_replayed"]),
            );
        }
        let _ = writeln!(
            text,
            "space    {:.1} % of the logical blocks hold data; {free} of {total} segments free",
            100.0 * mapped as f64 / logical as f64
        );
        let counters = &export["counters"];
        let flush_requests = number(&counters["requests"]["flush"]["requests"]);
        let _ = writeln!(
            text,
            "since    open: clients wrote {}, read {}, zeroed {}, trimmed {}; {} flush requests served by {} syncs \
             of the members; {} cleaning rounds",
            format_bytes(number(&counters["host_bytes_written"])),
            format_bytes(number(&counters["host_bytes_read"])),
            format_bytes(number(&counters["host_bytes_zeroed"])),
            format_bytes(number(&counters["host_bytes_trimmed"])),
            flush_requests,
            number(&counters["member_syncs"]),
            number(&counters["cleaning_rounds"]),
        );
        let amplification: stripelog_engine::WriteAmplification =
            serde_json::from_value(counters["write_amplification"].clone()).unwrap_or_default();
        let _ = writeln!(
            text,
            "wear     over the volume's life: write amplification {}",
            crate::describe_write_amplification(&amplification)
        );
        let lock = &export["write_lock"];
        let _ = writeln!(
            text,
            "lock     the write lock held {} times; p99 {}, p99.9 {}, longest {}",
            number(&lock["holds"]),
            units::format_seconds(lock["hold_p99_seconds"].as_f64().unwrap_or(0.0)),
            units::format_seconds(lock["hold_p999_seconds"].as_f64().unwrap_or(0.0)),
            units::format_seconds(lock["hold_maximum_seconds"].as_f64().unwrap_or(0.0)),
        );
        let cold_blocks = number(&counters["blocks_written_cold"]);
        if cold_blocks > 0 {
            let _ = writeln!(
                text,
                "streams  {} client blocks written to the cold stream, {} pairs of batches",
                cold_blocks,
                number(&counters["client_batch_pairs"]),
            );
        }
        if let Some(requests) = counters["requests"].as_object() {
            for (command, figures) in requests {
                let _ = writeln!(
                    text,
                    "  {command:<13} {:>12} requests {:>12}  mean {}",
                    number(&figures["requests"]),
                    format_bytes(number(&figures["bytes"])),
                    units::format_seconds(figures["latency_mean_seconds"].as_f64().unwrap_or(0.0))
                );
            }
        }
        if let Some(errors) = counters["errors"].as_object().filter(|errors| !errors.is_empty()) {
            let list: Vec<String> = errors.iter().map(|(kind, count)| format!("{kind} {}", number(count))).collect();
            let _ = writeln!(text, "errors   {}", list.join(", "));
        }
        let _ = writeln!(text, "members");
        for member in export["members"].as_array().into_iter().flatten() {
            let _ = writeln!(
                text,
                "  {:>2}  {:<11} {}",
                number(&member["index"]),
                member["state"].as_str().unwrap_or("?"),
                member["name"].as_str().unwrap_or("?")
            );
        }
        for operation in export["in_progress"].as_array().into_iter().flatten() {
            let (done, total) = (number(&operation["segments_done"]), number(&operation["segments_total"]));
            let _ = writeln!(
                text,
                "{:<8} {done} of {total} segments ({:.0} %), {} in {}",
                operation["kind"].as_str().unwrap_or("?"),
                100.0 * done as f64 / total.max(1) as f64,
                format_bytes(number(&operation["bytes"])),
                units::format_seconds(operation["seconds"].as_f64().unwrap_or(0.0))
            );
        }
    }
    text
}

#[derive(Args)]
pub(crate) struct TopArguments {
    /// The control socket of a running `stripelog serve`.
    #[arg(long)]
    control: PathBuf,
    /// Time between two samples.
    #[arg(long, default_value = "1s", value_parser = units::parse_duration)]
    interval: std::time::Duration,
    /// Stop after this many samples (default: until interrupted).
    #[arg(long)]
    count: Option<u64>,
}

/// What `top` keeps of a sample to compute rates from the next.
struct TopSample {
    at: std::time::Instant,
    /// Per export: (reads, read bytes, writes, written bytes, flushes, cleaning rounds).
    exports: Vec<[u64; 6]>,
}

fn top_figures(export: &serde_json::Value) -> [u64; 6] {
    let counters = &export["counters"];
    let requests = &counters["requests"];
    let number = |value: &serde_json::Value| value.as_u64().unwrap_or(0);
    [
        number(&requests["read"]["requests"]),
        number(&requests["read"]["bytes"]),
        number(&requests["write"]["requests"]),
        number(&requests["write"]["bytes"]),
        number(&requests["flush"]["requests"]),
        number(&counters["cleaning_rounds"]),
    ]
}

/// `stripelog top --control SOCKET`: a running server's exports every interval, as rates:
/// one line per export and sample, like vmstat (a terminal is cleared between samples).
pub(crate) fn top(arguments: TopArguments) -> Result<ExitCode, String> {
    use std::io::IsTerminal;
    let terminal = std::io::stdout().is_terminal();
    let mut previous: Option<TopSample> = None;
    let mut samples = 0u64;
    loop {
        let status = call(&arguments.control, &ControlRequest::Overview {}, "top")?;
        let exports = status["exports"].as_array().cloned().unwrap_or_default();
        let sample = TopSample { at: std::time::Instant::now(), exports: exports.iter().map(top_figures).collect() };
        if let Some(previous) = &previous {
            let seconds = sample.at.duration_since(previous.at).as_secs_f64().max(1e-3);
            if terminal {
                print!("\x1b[H\x1b[2J");
            }
            if terminal || samples == 1 {
                println!(
                    "{:<16} {:<9} {:>7} {:>10} {:>12} {:>10} {:>12} {:>9} {:>11} {:>8} {:>8}",
                    "export",
                    "health",
                    "clients",
                    "reads/s",
                    "read/s",
                    "writes/s",
                    "written/s",
                    "flushes/s",
                    "free segs",
                    "WA",
                    "rounds/s"
                );
            }
            for (index, export) in exports.iter().enumerate() {
                let now = sample.exports[index];
                let before = previous.exports.get(index).copied().unwrap_or(now);
                let rate = |field: usize| now[field].saturating_sub(before[field]) as f64 / seconds;
                println!(
                    "{:<16} {:<9} {:>7} {:>10.0} {:>12} {:>10.0} {:>12} {:>9.1} {:>11} {:>8.2} {:>8.1}",
                    export["name"].as_str().unwrap_or("?"),
                    export["health"].as_str().unwrap_or("?"),
                    export["clients"].as_u64().unwrap_or(0),
                    rate(0),
                    format_bytes(rate(1) as u64),
                    rate(2),
                    format_bytes(rate(3) as u64),
                    rate(4),
                    export["space"]["segments_free"].as_u64().unwrap_or(0),
                    export["counters"]["write_amplification"]["total"].as_f64().unwrap_or(0.0),
                    rate(5)
                );
            }
            if arguments.count.is_some_and(|count| samples >= count) {
                return Ok(ExitCode::SUCCESS);
            }
        }
        previous = Some(sample);
        samples += 1;
        std::thread::sleep(arguments.interval);
    }
}
