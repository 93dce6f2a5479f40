//! `stripelog serve`: open volumes, offer them as NBD exports on a Unix socket (or TCP
//! on request), stop cleanly on SIGINT/SIGTERM.

use crate::maintenance::{attach_replacement, member_index, ControlRequest};
use crate::{engine_error, open_members, ServeArguments, TlsModeArgument};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use stripelog_engine::{MaintenanceOptions, MaintenanceProgress, OpenOptions, Volume};
use stripelog_nbd::{Export, Server, TlsMode, TlsSettings};

/// How often the server looks at its volumes' health to log changes.
const HEALTH_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// `serve`'s exit code when a bug (a panic) stopped it or one of its volumes (sysexits'
/// EX_SOFTWARE).
pub const EXIT_STOPPED_BY_A_BUG: u8 = 70;
/// At most this often a progress line goes to a control client.
const CONTROL_PROGRESS_INTERVAL: Duration = Duration::from_millis(200);
/// Longest control request line accepted.
const CONTROL_REQUEST_MAX_BYTES: u64 = 64 << 10;

pub(crate) type Volumes = Vec<(String, Weak<Volume>)>;

/// The rebuilds and scrubs under way (for `status` and the metrics).
#[derive(Default)]
pub(crate) struct Maintenance {
    operations: std::sync::Mutex<Vec<(u64, Operation)>>,
    next: std::sync::atomic::AtomicU64,
}

/// A rebuild or scrub under way, as last reported.
#[derive(Clone, serde::Serialize)]
pub(crate) struct Operation {
    pub export: String,
    /// "rebuild" or "scrub".
    pub kind: &'static str,
    pub segments_done: u64,
    pub segments_total: u64,
    /// Written by a rebuild, read by a scrub.
    pub bytes: u64,
    #[serde(skip)]
    pub started: Instant,
    pub seconds: f64,
}

impl Maintenance {
    /// Record an operation starting; returns its number for `update` and `finish`.
    pub(crate) fn start(&self, export: &str, kind: &'static str) -> u64 {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let operation = Operation {
            export: export.to_string(),
            kind,
            segments_done: 0,
            segments_total: 0,
            bytes: 0,
            started: Instant::now(),
            seconds: 0.0,
        };
        self.lock().push((number, operation));
        number
    }

    pub(crate) fn update(&self, number: u64, progress: &MaintenanceProgress) {
        if let Some((_, operation)) = self.lock().iter_mut().find(|(each, _)| *each == number) {
            operation.segments_done = progress.segments_done;
            operation.segments_total = progress.segments_total;
            operation.bytes = progress.bytes;
        }
    }

    pub(crate) fn finish(&self, number: u64) {
        self.lock().retain(|(each, _)| *each != number);
    }

    pub(crate) fn snapshot(&self) -> Vec<Operation> {
        self.lock()
            .iter()
            .map(|(_, operation)| Operation { seconds: operation.started.elapsed().as_secs_f64(), ..operation.clone() })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Operation)>> {
        self.operations.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

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

/// Log every change of a volume's health (a member failing, a rebuild ending), and the
/// writes refused for lack of space, once a second at most (the engine itself logs a thin
/// volume's use crossing 80, 90 and 95 %).
fn watch_health(served: Served) {
    let volumes = &served.volumes;
    let mut last: Vec<String> = vec![String::new(); volumes.len()];
    let mut refused_for_space: Vec<u64> = vec![0; volumes.len()];
    loop {
        for (index, (name, volume)) in volumes.iter().enumerate() {
            let Some(volume) = volume.upgrade() else {
                return;
            };
            let refused = served.server.upgrade().and_then(|server| {
                Some(server.metrics().get(index)?.error_count(stripelog_nbd::protocol::ERROR_NO_SPACE))
            });
            if let Some(refused) = refused.filter(|refused| *refused > refused_for_space[index]) {
                log::warn!(
                    "export '{name}': {} request(s) refused for lack of space (ENOSPC), {refused} since the start: \
                     trim unused blocks, or give the volume more room",
                    refused - refused_for_space[index]
                );
                refused_for_space[index] = refused;
            }
            if volume.stopped_by_panic() {
                // A bug stopped the volume (its clients get EIO): the server stops too, and
                // `serve` exits with an error; the next open recovers the volume as after
                // a crash.
                log::error!("export '{name}': a bug stopped the volume; the server stops");
                if let Some(server) = served.server.upgrade() {
                    server.shutdown();
                }
                return;
            }
            let line = health_line(name, &volume);
            if line != last[index] {
                if !last[index].is_empty() || line.contains("DEGRADED") || line.contains("FAILED") {
                    match line {
                        _ if line.contains("FAILED") => log::error!("{line}"),
                        _ if line.contains("DEGRADED") => log::warn!("{line}"),
                        _ => log::info!("{line}"),
                    }
                }
                last[index] = line;
            }
        }
        std::thread::sleep(HEALTH_LOG_INTERVAL);
    }
}

/// Finish a rebuild found under way at open (a crash interrupted it).
fn resume_rebuild(name: String, volume: Weak<Volume>, maintenance: Arc<Maintenance>) {
    let Some(volume) = volume.upgrade() else { return };
    let members = volume.rebuilding_members();
    log::info!("export '{name}': resuming the rebuild of members {members:?} in the background");
    let operation = maintenance.start(&name, "rebuild");
    let outcome = volume.rebuild(&MaintenanceOptions::default(), &|progress| maintenance.update(operation, &progress));
    maintenance.finish(operation);
    match outcome {
        Ok(report) => log::info!(
            "export '{name}': members {:?} rebuilt ({} segments in {:.1} s)",
            report.members,
            report.segments_rebuilt,
            report.seconds
        ),
        Err(error) => log::error!("export '{name}': rebuild stopped: {error}"),
    }
}

/// What the control socket and the metrics see of the running server.
#[derive(Clone)]
pub(crate) struct Served {
    pub server: Weak<Server>,
    pub volumes: Volumes,
    pub maintenance: Arc<Maintenance>,
    pub started: Instant,
}

fn serve_control(listener: std::os::unix::net::UnixListener, served: Served) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let served = served.clone();
        std::thread::spawn(move || {
            let mut writer = match stream.try_clone() {
                Ok(writer) => writer,
                Err(_) => return,
            };
            let outcome = control_request(&stream, &mut writer, &served);
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
    served: &Served,
) -> Result<serde_json::Value, String> {
    use std::io::Read;
    let mut line = String::new();
    BufReader::new(stream.take(CONTROL_REQUEST_MAX_BYTES)).read_line(&mut line).map_err(|error| error.to_string())?;
    let request: ControlRequest = serde_json::from_str(&line).map_err(|error| format!("bad request: {error}"))?;
    let volumes = &served.volumes;
    let export = match &request {
        ControlRequest::Overview {} => return Ok(overview(served)),
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
    let operation = match &request {
        ControlRequest::Scrub { .. } => Some(served.maintenance.start(name, "scrub")),
        ControlRequest::Replace { .. } => Some(served.maintenance.start(name, "rebuild")),
        _ => None,
    };
    let outcome = run_control_request(request, name, &volume, operation, served, writer);
    if let Some(operation) = operation {
        served.maintenance.finish(operation);
    }
    outcome
}

fn run_control_request(
    request: ControlRequest,
    name: &str,
    volume: &Arc<Volume>,
    operation: Option<u64>,
    served: &Served,
    writer: &mut std::os::unix::net::UnixStream,
) -> Result<serde_json::Value, String> {
    let mut last_progress = Instant::now();
    let mut progress = |progress: MaintenanceProgress| {
        if let Some(operation) = operation {
            served.maintenance.update(operation, &progress);
        }
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
        // (Answered before an export is chosen; here for completeness.)
        ControlRequest::Overview {} => Ok(overview(served)),
        ControlRequest::Set { setting, value, .. } => {
            let value = crate::maintenance::setting_value(setting.as_str(), value.as_str())?;
            crate::maintenance::apply_setting(volume.as_ref(), setting.as_str(), &value)?;
            log::info!("export '{name}': {setting} set to {value}");
            Ok(serde_json::json!({ setting.as_str(): value }))
        }
        ControlRequest::Scrub { rate, .. } => {
            log::info!("export '{name}': scrub requested");
            let report = volume
                .scrub(&MaintenanceOptions { rate_bytes_per_second: rate }, &report_progress)
                .map_err(|error| error.to_string())?;
            log::info!(
                "export '{name}': scrub done: {} damaged, {} segments repaired, {} unrecoverable",
                report.blocks_damaged,
                report.segments_repaired,
                report.logical_blocks_unrecoverable.len()
            );
            to_json(serde_json::to_value(report))
        }
        ControlRequest::Replace { member, replacement, rate, force, .. } => {
            let member = member_index(volume, &member)?;
            attach_replacement(volume, member, &replacement, force)?;
            log::info!("export '{name}': member {member} replaced by {}; rebuilding", replacement.display());
            let report = volume
                .rebuild(&MaintenanceOptions { rate_bytes_per_second: rate }, &report_progress)
                .map_err(|error| error.to_string())?;
            log::info!(
                "export '{name}': member {member} rebuilt: {} segments, {} bytes in {:.1} s",
                report.segments_rebuilt,
                report.bytes_written,
                report.seconds
            );
            to_json(serde_json::to_value(report))
        }
    }
}

/// The whole server at a glance (`stripelog status`): each export's health, clients,
/// space, counters and what is under way.
fn overview(served: &Served) -> serde_json::Value {
    let server = served.server.upgrade();
    let operations = served.maintenance.snapshot();
    let exports: Vec<serde_json::Value> = served
        .volumes
        .iter()
        .enumerate()
        .filter_map(|(index, (name, volume))| {
            let volume = volume.upgrade()?;
            let stats = volume.stats();
            let health = if stats.failure.is_some() {
                "FAILED"
            } else if stats.degraded {
                "DEGRADED"
            } else {
                "ONLINE"
            };
            let metrics = server.as_ref().and_then(|server| server.metrics().get(index));
            let requests: serde_json::Map<String, serde_json::Value> = metrics
                .map(|metrics| {
                    metrics
                        .commands()
                        .into_iter()
                        .filter(|command| command.requests > 0)
                        .map(|command| {
                            let mean = command.latency_sum_seconds / command.requests.max(1) as f64;
                            let value = serde_json::json!({
                                "requests": command.requests,
                                "bytes": command.bytes,
                                "latency_mean_seconds": mean,
                            });
                            (command.name.to_string(), value)
                        })
                        .collect()
                })
                .unwrap_or_default();
            let errors: serde_json::Map<String, serde_json::Value> = metrics
                .map(|metrics| {
                    metrics
                        .errors()
                        .into_iter()
                        .filter(|(_, count)| *count > 0)
                        .map(|(kind, count)| (kind.to_string(), count.into()))
                        .collect()
                })
                .unwrap_or_default();
            let clients = metrics.map_or(0, |metrics| metrics.connections_open.load(Ordering::Relaxed));
            let members: Vec<serde_json::Value> = stats
                .members
                .iter()
                .map(|member| {
                    serde_json::json!({ "index": member.index, "name": member.name, "state": member.state,
                        "description": member.description })
                })
                .collect();
            let in_progress: Vec<&Operation> =
                operations.iter().filter(|operation| operation.export == *name).collect();
            Some(serde_json::json!({
                "name": name,
                "health": health,
                "health_detail": health_line(name, &volume),
                "failure": stats.failure,
                "failures_still_tolerated": stats.failures_still_tolerated,
                "raid_level": stats.raid_level,
                "clients": clients,
                "logical_size_bytes": stats.logical_size_bytes,
                "space": {
                    "segments_total": stats.segments_total,
                    "segments_used": stats.segments_used,
                    "segments_free": stats.segments_free,
                    "blocks_mapped": stats.blocks_mapped,
                    "stored_data_bytes": stats.stored_data_bytes,
                    "logical_blocks": stats.logical_size_bytes / stats.block_size_bytes as u64,
                },
                "counters": {
                    "requests": requests,
                    "errors": errors,
                    "host_bytes_written": stats.host_bytes_written,
                    "host_bytes_read": stats.host_bytes_read,
                    "host_bytes_zeroed": stats.host_bytes_zeroed,
                    "host_bytes_trimmed": stats.host_bytes_trimmed,
                    "member_syncs": stats.flushes,
                    "cleaning_rounds": stats.cleaning_rounds,
                    "write_amplification": stats.lifetime_write_amplification,
                    "write_amplification_since_open": stats.write_amplification,
                    "blocks_written_cold": stats.blocks_written_cold,
                    "client_batch_pairs": stats.client_batch_pairs,
                },
                "members": members,
                "write_lock": {
                    "holds": stats.write_lock_holds,
                    "hold_p99_seconds": stats.write_lock_hold_p99_microseconds / 1e6,
                    "hold_p999_seconds": stats.write_lock_hold_p999_microseconds / 1e6,
                    "hold_maximum_seconds": stats.write_lock_hold_maximum_microseconds / 1e6,
                },
                "write_queue_batches": stats.write_queue_batches,
                "paging": stats.paging,
                "write_log": stats.write_log,
                "compression": stats.compression,
                "deduplication": stats.deduplication,
                "thin_provisioning": stats.thin_provisioning,
                "recovery": stats.recovery,
                "in_progress": in_progress,
            }))
        })
        .collect();
    serde_json::json!({
        "process_id": std::process::id(),
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": served.started.elapsed().as_secs_f64(),
        "connections_accepted": server.as_ref().map_or(0, |server| server.statistics.connections.load(Ordering::Relaxed)),
        "tls": server.as_ref().map_or(TlsMode::Off, |server| server.tls_mode()).name(),
        "tls_handshakes_completed": server.as_ref()
            .map_or(0, |server| server.statistics.tls_handshakes_completed.load(Ordering::Relaxed)),
        "tls_handshakes_failed": server.as_ref()
            .map_or(0, |server| server.statistics.tls_handshakes_failed.load(Ordering::Relaxed)),
        "shutting_down": server.as_ref().is_none_or(|server| server.is_shutting_down()),
        "exports": exports,
    })
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

fn bind_listener(arguments: &ServeArguments, tls: TlsMode) -> Result<Listener, String> {
    match &arguments.listen {
        Some(address) => {
            let address = if address.contains(':') { address.clone() } else { format!("127.0.0.1:{address}") };
            let listener =
                std::net::TcpListener::bind(&address).map_err(|error| format!("listen on {address}: {error}"))?;
            let bound = listener.local_addr().map_err(|error| format!("listen on {address}: {error}"))?;
            if !bound.ip().is_loopback() && tls != TlsMode::Require {
                if !arguments.insecure {
                    return Err(format!(
                        "--listen {address}: {} is not a loopback address, and NBD has no authentication or \
                         encryption of its own: whoever reaches the port could read and write every export. \
                         Require TLS (--tls-certificates DIR, with --tls-verify-peer to admit only clients with \
                         certificates; docs/tls.md), or give --insecure on a network you trust",
                        bound.ip()
                    ));
                }
                log::warn!(
                    "serving NBD on {bound} without requiring TLS (--insecure, --tls {}): whoever reaches this \
                     port can read and write every export",
                    tls.name()
                );
            }
            Ok(Listener::Tcp(listener, bound.to_string()))
        }
        None => Ok(Listener::Unix(bind_unix(&arguments.socket)?)),
    }
}

/// `--tls`, `--tls-certificates` and `--tls-psk` as the server's TLS mode (the files
/// are read later, by `tls_settings`).
fn tls_mode(arguments: &ServeArguments) -> Result<TlsMode, String> {
    if let Some(file) = &arguments.tls_psk {
        return Err(format!(
            "--tls-psk {}: pre-shared keys are not supported: rustls, the TLS library stripelog uses, has no \
             external PSK yet (rustls issue #174). Use X.509 certificates: --tls-certificates DIR (docs/tls.md)",
            file.display()
        ));
    }
    match (arguments.tls, &arguments.tls_certificates) {
        (None, None) | (Some(TlsModeArgument::Off), None) => Ok(TlsMode::Off),
        (Some(TlsModeArgument::Off), Some(_)) => Err("--tls off with --tls-certificates: give one or the other".into()),
        (Some(TlsModeArgument::On | TlsModeArgument::Require), None) => {
            Err("--tls on/require needs --tls-certificates DIR (server-cert.pem, server-key.pem)".into())
        }
        (None | Some(TlsModeArgument::Require), Some(_)) => Ok(TlsMode::Require),
        (Some(TlsModeArgument::On), Some(_)) => Ok(TlsMode::On),
    }
}

/// The credentials of `--tls-certificates` for `mode` (`None`: TLS off).
fn tls_settings(arguments: &ServeArguments, mode: TlsMode) -> Result<Option<TlsSettings>, String> {
    let Some(directory) = arguments.tls_certificates.as_deref().filter(|_| mode != TlsMode::Off) else {
        return Ok(None);
    };
    let settings = TlsSettings::from_directory(directory, mode, arguments.tls_verify_peer)
        .map_err(|error| format!("--tls-certificates {}: {error}", directory.display()))?;
    Ok(Some(settings))
}

/// `--allow-clients EXPORT=NAME,...` as each export's list of admitted certificate names.
fn allowed_clients(arguments: &ServeArguments, exports: &[(String, Vec<PathBuf>)]) -> Result<Vec<Vec<String>>, String> {
    let mut allowed = vec![Vec::new(); exports.len()];
    for given in &arguments.allow_clients {
        let (export, names) =
            given.split_once('=').ok_or_else(|| format!("--allow-clients {given}: expected EXPORT=NAME,NAME,..."))?;
        let index = exports
            .iter()
            .position(|(name, _)| name == export)
            .ok_or_else(|| format!("--allow-clients {given}: no export is named '{export}'"))?;
        let names: Vec<String> = names.split(',').filter(|name| !name.is_empty()).map(String::from).collect();
        if names.is_empty() {
            return Err(format!("--allow-clients {given}: no client name given"));
        }
        allowed[index].extend(names);
    }
    Ok(allowed)
}

/// The metrics listener: ADDRESS:PORT, or PORT on loopback.
fn bind_metrics(address: &str) -> Result<(std::net::TcpListener, String), String> {
    let address = if address.contains(':') { address.to_string() } else { format!("127.0.0.1:{address}") };
    let listener = std::net::TcpListener::bind(&address).map_err(|error| match error.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "--metrics {address}: {error}: another process listens there (each served volume, each instance of \
             the systemd unit, needs its own metrics port)"
        ),
        _ => format!("--metrics {address}: {error}"),
    })?;
    let bound = listener.local_addr().map_err(|error| format!("--metrics {address}: {error}"))?;
    if !bound.ip().is_loopback() {
        // Read-only, but it names the member devices and the exports' traffic.
        log::warn!("metrics on {bound}, not loopback: whoever reaches the port sees the volumes' names and counters");
    }
    let bound = bound.to_string();
    Ok((listener, bound))
}

/// Loud, several lines: a degraded volume has less redundancy than the user chose.
fn degraded_banner(name: &str, volume: &Volume) {
    let stats = volume.stats();
    if !stats.degraded {
        return;
    }
    let lost = members_not_active(&stats);
    log::warn!("WARNING: export '{name}' runs DEGRADED ({} on {} members)", stats.raid_level, stats.member_count);
    for line in &lost {
        log::warn!("WARNING:   {line}");
    }
    log::warn!("WARNING: it survives {} more member failure(s); replace the member:", stats.failures_still_tolerated);
    log::warn!("WARNING:   stripelog replace --control SOCKET.control --member N --with NEW-DEVICE");
}

fn print_commands(socket: &Path, exports: &[Export], tls: TlsMode) {
    let socket = std::fs::canonicalize(socket).unwrap_or_else(|_| socket.to_path_buf());
    let socket = socket.display();
    for export in exports {
        let uri = match tls {
            TlsMode::Off => format!("nbd+unix:///{}?socket={socket}", export.name),
            // The client's own directory: its ca-cert.pem (and client-cert.pem, client-key.pem).
            TlsMode::On | TlsMode::Require => {
                format!("nbds+unix:///{}?socket={socket}&tls-certificates=CLIENT-DIR", export.name)
            }
        };
        log::info!(
            "export '{}': {} ({} bytes); try:",
            export.name,
            crate::units::format_bytes(export.volume.logical_size_bytes()),
            export.volume.logical_size_bytes()
        );
        log::info!("  nbdinfo '{uri}'");
        log::info!("  qemu-io -f raw '{uri}' -c 'write -P 0xab 0 4k' -c 'read -P 0xab 0 4k'");
        log::info!("  mkdir -p /tmp/sl && nbdfuse /tmp/sl/disk '{uri}' &");
        log::info!("  losetup -f --show /tmp/sl/disk   # then: mkfs.ext4 /dev/loopN && mount /dev/loopN /mnt");
    }
}

/// SIGINT and SIGTERM, watched from before the first volume opens: a signal that arrives
/// while `serve` starts (waiting for members, mounting, replaying the log) is remembered
/// and acted on as soon as the open in progress ends; one that arrives while it serves
/// stops the server.
#[derive(Default)]
struct Stop {
    state: std::sync::Mutex<StopState>,
}

#[derive(Default)]
struct StopState {
    /// The first signal received.
    signal: Option<i32>,
    /// The running server, once it serves (a weak handle: the server must be ours alone
    /// again at the end to close the volumes).
    server: Option<Weak<Server>>,
}

impl Stop {
    fn lock(&self) -> std::sync::MutexGuard<'_, StopState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The signal that asked to stop, if one did.
    fn requested(&self) -> Option<i32> {
        self.lock().signal
    }

    /// From now on a signal stops `server`; a signal that came before is returned instead.
    fn serve(&self, server: &Arc<Server>) -> Option<i32> {
        let mut state = self.lock();
        if state.signal.is_none() {
            state.server = Some(Arc::downgrade(server));
        }
        state.signal
    }
}

/// Watch SIGINT and SIGTERM for the whole life of `serve`.
fn watch_signals(stop: Arc<Stop>) -> Result<(), String> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .map_err(|error| format!("signals: {error}"))?;
    std::thread::spawn(move || {
        for signal in signals.forever() {
            let mut state = stop.lock();
            if state.signal.is_some() {
                log::info!(
                    "second signal: exiting now (flushed data is safe; a volume still opening recovers at its next open)"
                );
                std::process::exit(130);
            }
            state.signal = Some(signal);
            crate::notify::send("STOPPING=1");
            match state.server.as_ref().map(Weak::upgrade) {
                Some(server) => {
                    log::info!("signal {signal}: finishing requests in flight, flushing, closing");
                    crate::notify::status("stopping: finishing requests in flight, flushing, closing");
                    if let Some(server) = server {
                        server.shutdown();
                    }
                }
                None => {
                    log::info!(
                        "signal {signal} while starting: stopping once what is under way ends (a wait for members \
                         at once; a volume being opened once it is open, then closed cleanly without being served)"
                    );
                    crate::notify::status("stopping once what is under way ends");
                }
            }
        }
    });
    Ok(())
}

/// Wait, at most `limit`, until every member path of `exports` exists (`missing` is not
/// waited for), saying which are awaited. `Ok(false)`: a signal asked to stop meanwhile.
fn wait_for_members(
    exports: &[(String, Vec<PathBuf>)],
    limit: Duration,
    degraded: bool,
    stop: &Stop,
) -> Result<bool, String> {
    const POLL_INTERVAL: Duration = Duration::from_millis(100);
    let started = Instant::now();
    let waited = humantime::format_duration(Duration::from_secs(limit.as_secs().max(1)));
    let mut awaited = String::new();
    loop {
        let absent: Vec<String> = exports
            .iter()
            .flat_map(|(_, members)| members)
            .filter(|path| path.as_os_str() != "missing" && !path.exists())
            .map(|path| path.display().to_string())
            .collect();
        let absent = absent.join(", ");
        if absent.is_empty() {
            if !awaited.is_empty() {
                log::info!("every member is there after {:.1} s", started.elapsed().as_secs_f64());
            }
            return Ok(true);
        }
        if stop.requested().is_some() {
            return Ok(false);
        }
        if started.elapsed() >= limit {
            if degraded {
                log::warn!("members still absent after waiting {waited}: {absent}; opening without them (--degraded)");
                return Ok(true);
            }
            return Err(format!(
                "members still absent after waiting {waited} (--wait-for-members): {absent}. Are the drives attached \
                 and the paths right? `--degraded` opens the volume without them"
            ));
        }
        if absent != awaited {
            log::info!("waiting up to {waited} for members to appear: {absent}");
            crate::notify::status(&format!("waiting up to {waited} for members to appear: {absent}"));
            awaited = absent;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Close the volumes of `exports`: `Ok(true)` if a bug (a panic) had stopped one of them,
/// which is then left as after a crash (its next open recovers it).
fn close_exports(exports: Vec<Export>) -> Result<bool, String> {
    let mut stopped_by_a_bug = false;
    for export in exports {
        let name = export.name;
        if export.volume.stopped_by_panic() {
            log::error!("export '{name}': stopped by a bug; left as after a crash (the next open recovers it)");
            stopped_by_a_bug = true;
            drop(export.volume);
            continue;
        }
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
    Ok(stopped_by_a_bug)
}

/// A signal arrived while `serve` started: close what is open, serve nothing, exit 0.
fn stop_while_starting(signal: i32, exports: Vec<Export>) -> Result<ExitCode, String> {
    log::info!("signal {signal} arrived while starting: closing {} open volume(s) without serving them", exports.len());
    crate::notify::status("closing the volumes: a signal arrived while starting");
    if close_exports(exports)? {
        return Ok(ExitCode::from(EXIT_STOPPED_BY_A_BUG));
    }
    log::info!("volumes flushed and closed");
    Ok(ExitCode::SUCCESS)
}

pub fn serve(arguments: ServeArguments) -> Result<ExitCode, String> {
    // SAFETY: a valid signal and action, set before the server's threads start. A server
    // writes to sockets whose peers may be gone (NBD clients, scrapers, control clients):
    // that must be an EPIPE error for that connection, never the death of the process
    // (main restored the default action for the pipelines of the other commands).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // Signals first: one that comes while the volumes open must not be lost (nor, with its
    // default action, kill the process in the middle of a log replay).
    let stop = Arc::new(Stop::default());
    watch_signals(stop.clone())?;
    let exports_wanted = parse_exports(&arguments)?;
    let mut allowed_clients = allowed_clients(&arguments, &exports_wanted)?.into_iter();
    let tls_mode = tls_mode(&arguments)?;
    // Sockets before volumes: one that is busy (or not a socket) must not cost a volume an
    // epoch.
    let mut listener = bind_listener(&arguments, tls_mode)?;
    let tls = tls_settings(&arguments, tls_mode)?;
    let control = arguments.control.clone().or_else(|| {
        arguments.listen.is_none().then(|| PathBuf::from(format!("{}.control", arguments.socket.display())))
    });
    let mut control_socket = control.as_deref().map(bind_unix).transpose()?;
    let metrics_listener = arguments.metrics.as_deref().map(bind_metrics).transpose()?;
    if let Some(limit) = arguments.wait_for_members {
        if !wait_for_members(&exports_wanted, limit, arguments.degraded.degraded, &stop)? {
            log::info!("a signal arrived while waiting for members: exiting; nothing was opened");
            return Ok(ExitCode::SUCCESS);
        }
    }
    let mut exports = Vec::new();
    for (name, members) in exports_wanted {
        if let Some(signal) = stop.requested() {
            return stop_while_starting(signal, exports);
        }
        crate::notify::status(&format!(
            "opening export '{name}': mounting (and replaying the write log if it was not closed cleanly)"
        ));
        let devices = open_members(&members, None, arguments.read_only, arguments.degraded.degraded)
            .map_err(|error| format!("export '{name}': {error}"))?;
        let options = OpenOptions {
            read_only: arguments.read_only,
            cache_size_bytes: arguments.cache,
            map_cache_bytes: arguments.map_cache,
            write_queue_bytes: arguments.write_queue.unwrap_or(stripelog_engine::DEFAULT_WRITE_QUEUE_BYTES),
            dedup_sampling_bits: arguments.dedup_sampling_bits,
            holder_program: "stripelog serve".into(),
            take_over_from_another_host: arguments.force,
            force_without_log: arguments.force_without_log,
            fault_panic_after_accepted_blocks: arguments.fault_panic_after_blocks,
            ..OpenOptions::default()
        };
        let volume =
            Volume::open(devices, &options).map_err(|error| format!("export '{name}': {}", engine_error(error)))?;
        if let Some(pause) = arguments.fault_pause_after_open {
            std::thread::sleep(pause);
        }
        degraded_banner(&name, &volume);
        let stats = volume.stats();
        let description = format!("stripelog {} on {} members", stats.raid_level, stats.member_count);
        exports.push(Export {
            name,
            description,
            volume: Arc::new(volume),
            read_only: arguments.read_only,
            allowed_clients: allowed_clients.next().unwrap_or_default(),
        });
    }
    if let Some(signal) = stop.requested() {
        return stop_while_starting(signal, exports);
    }
    let volumes: Volumes = exports.iter().map(|export| (export.name.clone(), Arc::downgrade(&export.volume))).collect();
    let maintenance = Arc::new(Maintenance::default());
    for (name, volume) in &volumes {
        if volume.upgrade().is_some_and(|volume| !volume.rebuilding_members().is_empty()) {
            let (name, volume, maintenance) = (name.clone(), volume.clone(), maintenance.clone());
            std::thread::spawn(move || resume_rebuild(name, volume, maintenance));
        }
    }
    if let Some(settings) = &tls {
        log::info!(
            "TLS {}: certificate {}; {}",
            settings.mode.name(),
            settings.certificate,
            if settings.verify_peer {
                "clients need a certificate signed by ca-cert.pem"
            } else {
                "client certificates are not asked for"
            }
        );
    }
    let server = Server::with_tls(exports, tls);
    let served = Served { server: Arc::downgrade(&server), volumes, maintenance, started: Instant::now() };
    {
        let served = served.clone();
        std::thread::spawn(move || watch_health(served));
    }
    if let Some(socket) = control_socket.as_mut() {
        let path = socket.path.display();
        log::info!("control socket {path} (stripelog status/replace/scrub --control {path})");
        let listener = socket.listener.take().expect("bound above");
        let served = served.clone();
        std::thread::spawn(move || serve_control(listener, served));
    }
    if let Some((listener, address)) = metrics_listener {
        log::info!("metrics on http://{address}/metrics");
        let served = served.clone();
        std::thread::spawn(move || crate::metrics::serve_metrics(listener, served));
    }
    let signalled_while_starting = stop.serve(&server);
    if let Some(signal) = signalled_while_starting {
        // It came after the volumes opened, before the server took over the signals.
        log::info!("signal {signal} arrived while starting: closing the volumes without serving them");
        server.shutdown();
    }
    let ready = |location: &str| {
        log::info!("ready: serving on {location}");
        crate::notify::status(&format!("serving {} export(s) on {location}", server.exports().len()));
        crate::notify::send("READY=1");
    };
    let result = match &mut listener {
        _ if signalled_while_starting.is_some() => Ok(()),
        Listener::Tcp(listener, address) => {
            let scheme = if tls_mode == TlsMode::Off { "nbd" } else { "nbds" };
            let listener = listener.try_clone().map_err(|error| format!("listen on {address}: {error}"))?;
            ready(&format!("{scheme}://{address}/{}", server.exports()[0].name));
            server.run_tcp(listener)
        }
        Listener::Unix(socket) => {
            ready(&socket.path.display().to_string());
            print_commands(&socket.path, server.exports(), tls_mode);
            server.run_unix(socket.listener.take().expect("bound above"))
        }
    };
    // Stopped by a signal (which said so already) or by a bug.
    crate::notify::send("STOPPING=1");
    drop(listener);
    result.map_err(|error| format!("accepting connections: {error}"))?;
    let statistics = &server.statistics;
    log::info!(
        "served {} connection(s), {} request(s), {} read, {} written, {} error(s)",
        statistics.connections.load(Ordering::Relaxed),
        statistics.requests.load(Ordering::Relaxed),
        crate::units::format_bytes(statistics.bytes_read.load(Ordering::Relaxed)),
        crate::units::format_bytes(statistics.bytes_written.load(Ordering::Relaxed)),
        statistics.errors.load(Ordering::Relaxed)
    );
    drop(control_socket);
    let server = Arc::into_inner(server).ok_or("connections still hold the server")?;
    // A bug (a panic) stopped the server or a volume: nothing more is written to that
    // volume; its next open recovers it as after a crash, and serve exits with an error.
    let panicked = server.panicked();
    let stopped_by_a_bug = close_exports(server.into_exports())? || panicked;
    if stopped_by_a_bug {
        log::error!("serve stopped by a bug (a panic, logged above with its backtrace)");
        return Ok(ExitCode::from(EXIT_STOPPED_BY_A_BUG));
    }
    log::info!("volumes flushed and closed");
    Ok(ExitCode::SUCCESS)
}
