//! `stripelog serve`: open volumes, offer them as NBD exports on a Unix socket (or TCP
//! on request), stop cleanly on SIGINT/SIGTERM.

use crate::maintenance::{attach_replacement, member_index, ControlRequest};
use crate::{engine_error, open_members, ServeArguments};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use stripelog_engine::{MaintenanceOptions, MaintenanceProgress, OpenOptions, Volume};
use stripelog_nbd::{Export, Server};

/// How often the server looks at its volumes' health to log changes.
const HEALTH_LOG_INTERVAL: Duration = Duration::from_secs(1);
/// At most this often a progress line goes to a control client.
const CONTROL_PROGRESS_INTERVAL: Duration = Duration::from_millis(200);
/// Longest control request line accepted.
const CONTROL_REQUEST_MAX_BYTES: u64 = 64 << 10;

type Volumes = Vec<(String, Weak<Volume>)>;

/// One line on what a volume's members are now: logged when it changes.
fn health_line(name: &str, volume: &Volume) -> String {
    let stats = volume.stats();
    if let Some(failure) = &stats.failure {
        return format!("export '{name}' FAILED: {failure}");
    }
    if !stats.degraded {
        return format!("export '{name}' is ONLINE: every member holds its part");
    }
    format!(
        "export '{name}' is DEGRADED: {}; it survives {} more member failure(s)",
        members_not_active(&stats).join("; "),
        stats.failures_still_tolerated
    )
}

/// "member 4 (d/m4): failed: missing" for each member that is not active.
fn members_not_active(stats: &stripelog_engine::VolumeStats) -> Vec<String> {
    stats
        .members
        .iter()
        .filter(|member| member.state != "active")
        .map(|member| format!("member {} ({}): {}", member.index, member.name, member.description))
        .collect()
}

/// Log every change of a volume's health (a member failing, a rebuild ending).
fn watch_health(volumes: Volumes) {
    let mut last: Vec<String> = vec![String::new(); volumes.len()];
    loop {
        for (index, (name, volume)) in volumes.iter().enumerate() {
            let Some(volume) = volume.upgrade() else {
                return;
            };
            let line = health_line(name, &volume);
            if line != last[index] {
                if !last[index].is_empty() || line.contains("DEGRADED") || line.contains("FAILED") {
                    eprintln!("stripelog: {line}");
                }
                last[index] = line;
            }
        }
        std::thread::sleep(HEALTH_LOG_INTERVAL);
    }
}

/// Finish a rebuild found under way at open (a crash interrupted it).
fn resume_rebuild(name: String, volume: Weak<Volume>) {
    let Some(volume) = volume.upgrade() else { return };
    let members = volume.rebuilding_members();
    eprintln!("stripelog: export '{name}': resuming the rebuild of members {members:?} in the background");
    match volume.rebuild(&MaintenanceOptions::default(), &|_| {}) {
        Ok(report) => eprintln!(
            "stripelog: export '{name}': members {:?} rebuilt ({} segments in {:.1} s)",
            report.members, report.segments_rebuilt, report.seconds
        ),
        Err(error) => eprintln!("stripelog: export '{name}': rebuild stopped: {error}"),
    }
}

fn serve_control(listener: std::os::unix::net::UnixListener, volumes: Volumes) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let volumes = volumes.clone();
        std::thread::spawn(move || {
            let mut writer = match stream.try_clone() {
                Ok(writer) => writer,
                Err(_) => return,
            };
            let outcome = control_request(&stream, &mut writer, &volumes);
            let line = match outcome {
                Ok(report) => serde_json::json!({ "report": report }),
                Err(error) => serde_json::json!({ "error": error }),
            };
            let _ = writeln!(writer, "{line}");
        });
    }
}

fn control_request(
    stream: &std::os::unix::net::UnixStream,
    writer: &mut std::os::unix::net::UnixStream,
    volumes: &Volumes,
) -> Result<serde_json::Value, String> {
    use std::io::Read;
    let mut line = String::new();
    BufReader::new(stream.take(CONTROL_REQUEST_MAX_BYTES)).read_line(&mut line).map_err(|error| error.to_string())?;
    let request: ControlRequest = serde_json::from_str(&line).map_err(|error| format!("bad request: {error}"))?;
    let export = match &request {
        ControlRequest::Replace { export, .. }
        | ControlRequest::Scrub { export, .. }
        | ControlRequest::Status { export }
        | ControlRequest::Set { export, .. } => export.clone(),
    };
    let (name, volume) = match &export {
        Some(wanted) => volumes.iter().find(|(name, _)| name == wanted),
        None => volumes.first(),
    }
    .ok_or_else(|| format!("no export named {}", export.unwrap_or_default()))?;
    let volume = volume.upgrade().ok_or("the server is shutting down")?;
    let mut last_progress = Instant::now();
    let mut progress = |progress: MaintenanceProgress| {
        if last_progress.elapsed() >= CONTROL_PROGRESS_INTERVAL {
            last_progress = Instant::now();
            let line = serde_json::json!({ "progress": {
                "segments_done": progress.segments_done,
                "segments_total": progress.segments_total,
                "bytes": progress.bytes,
            }});
            let _ = writeln!(writer, "{line}");
        }
    };
    let progress = std::sync::Mutex::new(&mut progress);
    let report_progress = |update: MaintenanceProgress| {
        if let Ok(mut progress) = progress.lock() {
            (*progress)(update);
        }
    };
    let to_json = |value: Result<serde_json::Value, serde_json::Error>| value.map_err(|error| error.to_string());
    match request {
        ControlRequest::Status { .. } => to_json(serde_json::to_value(volume.stats())),
        ControlRequest::Set { setting, value, .. } => {
            let value = crate::maintenance::setting_value(setting.as_str(), value.as_str())?;
            crate::maintenance::apply_setting(volume.as_ref(), setting.as_str(), &value)?;
            eprintln!("stripelog: export '{name}': {setting} set to {value}");
            Ok(serde_json::json!({ setting.as_str(): value }))
        }
        ControlRequest::Scrub { rate, .. } => {
            eprintln!("stripelog: export '{name}': scrub requested");
            let report = volume
                .scrub(&MaintenanceOptions { rate_bytes_per_second: rate }, &report_progress)
                .map_err(|error| error.to_string())?;
            eprintln!(
                "stripelog: export '{name}': scrub done: {} damaged, {} segments repaired, {} unrecoverable",
                report.blocks_damaged,
                report.segments_repaired,
                report.logical_blocks_unrecoverable.len()
            );
            to_json(serde_json::to_value(report))
        }
        ControlRequest::Replace { member, replacement, rate, force, .. } => {
            let member = member_index(&volume, &member)?;
            attach_replacement(&volume, member, &replacement, force)?;
            eprintln!("stripelog: export '{name}': member {member} replaced by {}; rebuilding", replacement.display());
            let report = volume
                .rebuild(&MaintenanceOptions { rate_bytes_per_second: rate }, &report_progress)
                .map_err(|error| error.to_string())?;
            eprintln!(
                "stripelog: export '{name}': member {member} rebuilt: {} segments, {} bytes in {:.1} s",
                report.segments_rebuilt, report.bytes_written, report.seconds
            );
            to_json(serde_json::to_value(report))
        }
    }
}

/// NAME=MEMBER,MEMBER,... or just NAME (then the positional members are its volume).
fn parse_exports(arguments: &ServeArguments) -> Result<Vec<(String, Vec<PathBuf>)>, String> {
    let mut exports = Vec::new();
    let mut default_name = None;
    for export in &arguments.export {
        match export.split_once('=') {
            Some((name, members)) => {
                let members: Vec<PathBuf> = members.split(',').filter(|m| !m.is_empty()).map(PathBuf::from).collect();
                if name.is_empty() || members.is_empty() {
                    return Err(format!("--export {export}: expected NAME=MEMBER,MEMBER,..."));
                }
                exports.push((name.to_string(), members));
            }
            None => default_name = Some(export.clone()),
        }
    }
    if !arguments.members.is_empty() {
        exports.insert(0, (default_name.unwrap_or_else(|| "stripelog".to_string()), arguments.members.clone()));
    }
    if exports.is_empty() {
        return Err("nothing to serve: give MEMBER... or --export NAME=MEMBER,MEMBER,...".into());
    }
    for (index, (name, _)) in exports.iter().enumerate() {
        if exports[..index].iter().any(|(other, _)| other == name) {
            return Err(format!("export name '{name}' is given twice: every export needs its own name"));
        }
    }
    Ok(exports)
}

/// A Unix socket bound at `path`, removed again when dropped (unless `keep` is called).
struct BoundSocket {
    path: PathBuf,
    listener: Option<std::os::unix::net::UnixListener>,
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Bind a Unix socket at `path`. Something already there is removed only when it is a
/// socket that refuses connections (left by a server that died); a live socket is in use,
/// and any other kind of file is never touched (docs/data-safety.md, "Sockets").
fn bind_unix(path: &Path) -> Result<BoundSocket, String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(format!("{} is in use by a running server", path.display())),
            // Refused: nothing listens on it any more (its server died).
            Err(error) if error.raw_os_error() == Some(libc::ECONNREFUSED) => {
                std::fs::remove_file(path).map_err(|error| format!("{}: {error}", path.display()))?;
            }
            // Anything else (no permission: another user's socket) proves nothing stale.
            Err(error) => {
                return Err(format!("{}: a socket that cannot be checked ({error}): it is not removed", path.display()))
            }
        },
        Ok(metadata) => {
            let kind = match metadata.file_type() {
                kind if kind.is_file() => "a regular file",
                kind if kind.is_dir() => "a directory",
                kind if kind.is_symlink() => "a symbolic link",
                _ => "a special file",
            };
            return Err(format!(
                "{} exists and is {kind}, not a socket: it is not removed (choose another --socket path)",
                path.display()
            ));
        }
        Err(_) => {}
    }
    let listener =
        std::os::unix::net::UnixListener::bind(path).map_err(|error| format!("{}: {error}", path.display()))?;
    Ok(BoundSocket { path: path.to_path_buf(), listener: Some(listener) })
}

/// Where the server listens, bound before any volume is opened.
enum Listener {
    Unix(BoundSocket),
    Tcp(std::net::TcpListener, String),
}

fn bind_listener(arguments: &ServeArguments) -> Result<Listener, String> {
    match &arguments.listen {
        Some(address) => {
            let address = if address.contains(':') { address.clone() } else { format!("127.0.0.1:{address}") };
            let listener =
                std::net::TcpListener::bind(&address).map_err(|error| format!("listen on {address}: {error}"))?;
            Ok(Listener::Tcp(listener, address))
        }
        None => Ok(Listener::Unix(bind_unix(&arguments.socket)?)),
    }
}

/// Loud, several lines: a degraded volume has less redundancy than the user chose.
fn degraded_banner(name: &str, volume: &Volume) {
    let stats = volume.stats();
    if !stats.degraded {
        return;
    }
    let lost = members_not_active(&stats);
    eprintln!("stripelog: ************************************************************************");
    eprintln!(
        "stripelog: WARNING: export '{name}' runs DEGRADED ({} on {} members)",
        stats.raid_level, stats.member_count
    );
    for line in &lost {
        eprintln!("stripelog: WARNING:   {line}");
    }
    eprintln!(
        "stripelog: WARNING: it survives {} more member failure(s); replace the member:",
        stats.failures_still_tolerated
    );
    eprintln!("stripelog: WARNING:   stripelog replace --control SOCKET.control --member N --with NEW-DEVICE");
    eprintln!("stripelog: ************************************************************************");
}

fn print_commands(socket: &Path, exports: &[Export]) {
    let socket = std::fs::canonicalize(socket).unwrap_or_else(|_| socket.to_path_buf());
    let socket = socket.display();
    for export in exports {
        let uri = format!("nbd+unix:///{}?socket={socket}", export.name);
        eprintln!("export '{}': {} bytes; try:", export.name, export.volume.logical_size_bytes());
        eprintln!("  nbdinfo '{uri}'");
        eprintln!("  qemu-io -f raw '{uri}' -c 'write -P 0xab 0 4k' -c 'read -P 0xab 0 4k'");
        eprintln!("  mkdir -p /tmp/sl && nbdfuse /tmp/sl/disk '{uri}' &");
        eprintln!("  losetup -f --show /tmp/sl/disk   # then: mkfs.ext4 /dev/loopN && mount /dev/loopN /mnt");
    }
}

pub fn serve(arguments: ServeArguments) -> Result<ExitCode, String> {
    let exports_wanted = parse_exports(&arguments)?;
    // Sockets first: one that is busy (or not a socket) must not cost a volume an epoch.
    let mut listener = bind_listener(&arguments)?;
    let control = arguments.control.clone().or_else(|| {
        arguments.listen.is_none().then(|| PathBuf::from(format!("{}.control", arguments.socket.display())))
    });
    let mut control_socket = control.as_deref().map(bind_unix).transpose()?;
    let mut exports = Vec::new();
    for (name, members) in exports_wanted {
        let devices = open_members(&members, None, arguments.read_only, arguments.degraded.degraded)
            .map_err(|error| format!("export '{name}': {error}"))?;
        let options = OpenOptions {
            read_only: arguments.read_only,
            cache_size_bytes: arguments.cache,
            map_cache_bytes: arguments.map_cache,
            dedup_sampling_bits: arguments.dedup_sampling_bits,
            holder_program: "stripelog serve".into(),
            take_over_from_another_host: arguments.force,
            force_without_log: arguments.force_without_log,
            ..OpenOptions::default()
        };
        let volume =
            Volume::open(devices, &options).map_err(|error| format!("export '{name}': {}", engine_error(error)))?;
        degraded_banner(&name, &volume);
        let stats = volume.stats();
        let description = format!("stripelog {} on {} members", stats.raid_level, stats.member_count);
        exports.push(Export { name, description, volume: Arc::new(volume), read_only: arguments.read_only });
    }
    let volumes: Volumes = exports.iter().map(|export| (export.name.clone(), Arc::downgrade(&export.volume))).collect();
    for (name, volume) in &volumes {
        if volume.upgrade().is_some_and(|volume| !volume.rebuilding_members().is_empty()) {
            let (name, volume) = (name.clone(), volume.clone());
            std::thread::spawn(move || resume_rebuild(name, volume));
        }
    }
    {
        let volumes = volumes.clone();
        std::thread::spawn(move || watch_health(volumes));
    }
    if let Some(socket) = control_socket.as_mut() {
        let path = socket.path.display();
        eprintln!("stripelog: control socket {path} (stripelog replace/scrub --control {path})");
        let listener = socket.listener.take().expect("bound above");
        let volumes = volumes.clone();
        std::thread::spawn(move || serve_control(listener, volumes));
    }
    let server = Server::new(exports);
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .map_err(|error| format!("signals: {error}"))?;
    {
        // A weak handle: the server must be ours alone again at the end to close volumes.
        let server = Arc::downgrade(&server);
        std::thread::spawn(move || {
            let mut received = 0;
            for signal in signals.forever() {
                received += 1;
                if received == 1 {
                    eprintln!("stripelog: signal {signal}: finishing requests in flight, flushing, closing");
                    if let Some(server) = server.upgrade() {
                        server.shutdown();
                    }
                } else {
                    eprintln!("stripelog: second signal: exiting now (flushed data is safe)");
                    std::process::exit(130);
                }
            }
        });
    }
    let result = match &mut listener {
        Listener::Tcp(listener, address) => {
            eprintln!("stripelog: ready: serving on nbd://{address}/{}", server.exports()[0].name);
            server.run_tcp(listener.try_clone().map_err(|error| format!("listen on {address}: {error}"))?)
        }
        Listener::Unix(socket) => {
            eprintln!("stripelog: ready: serving on {}", socket.path.display());
            print_commands(&socket.path, server.exports());
            server.run_unix(socket.listener.take().expect("bound above"))
        }
    };
    drop(listener);
    result.map_err(|error| format!("accepting connections: {error}"))?;
    let statistics = &server.statistics;
    eprintln!(
        "stripelog: served {} connection(s), {} request(s), {} bytes read, {} bytes written, {} error(s)",
        statistics.connections.load(Ordering::Relaxed),
        statistics.requests.load(Ordering::Relaxed),
        statistics.bytes_read.load(Ordering::Relaxed),
        statistics.bytes_written.load(Ordering::Relaxed),
        statistics.errors.load(Ordering::Relaxed)
    );
    drop(control_socket);
    let server = Arc::into_inner(server).ok_or("connections still hold the server")?;
    for export in server.into_exports() {
        let name = export.name;
        match Arc::try_unwrap(export.volume) {
            Ok(volume) => volume.close().map_err(|error| format!("closing '{name}': {error}"))?,
            Err(volume) => {
                // A rebuild or scrub still runs: make everything accepted durable anyway
                // (a rebuild resumes at the next open).
                volume.flush().map_err(|error| format!("flushing '{name}': {error}"))?;
                return Err(format!("export '{name}' was flushed but a rebuild or scrub still held it open"));
            }
        }
    }
    eprintln!("stripelog: volumes flushed and closed");
    Ok(ExitCode::SUCCESS)
}
