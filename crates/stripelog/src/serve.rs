//! `stripelog serve`: open volumes, offer them as NBD exports on a Unix socket (or TCP
//! on request), stop cleanly on SIGINT/SIGTERM.

use crate::{open_members, ServeArguments};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use stripelog_engine::{OpenOptions, Volume};
use stripelog_nbd::{Export, Server};

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
    Ok(exports)
}

fn bind_unix(path: &Path) -> Result<std::os::unix::net::UnixListener, String> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!("{} is in use by a running server", path.display()));
        }
        std::fs::remove_file(path).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    std::os::unix::net::UnixListener::bind(path).map_err(|error| format!("{}: {error}", path.display()))
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
    let mut exports = Vec::new();
    for (name, members) in parse_exports(&arguments)? {
        let devices = open_members(&members, None, arguments.read_only)?;
        let options =
            OpenOptions { read_only: arguments.read_only, cache_size_bytes: arguments.cache, ..OpenOptions::default() };
        let volume = Volume::open(devices, &options).map_err(|error| format!("export '{name}': {error}"))?;
        let stats = volume.stats();
        if stats.degraded {
            eprintln!(
                "stripelog: export '{name}' is DEGRADED: members {:?} missing; it survives {} more failure(s)",
                stats.missing_members, stats.failures_still_tolerated
            );
        }
        let description = format!("stripelog {} on {} members", stats.raid_level, stats.member_count);
        exports.push(Export { name, description, volume: Arc::new(volume), read_only: arguments.read_only });
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
    let result = match &arguments.listen {
        Some(address) => {
            let address = if address.contains(':') { address.clone() } else { format!("127.0.0.1:{address}") };
            let listener =
                std::net::TcpListener::bind(&address).map_err(|error| format!("listen on {address}: {error}"))?;
            eprintln!("stripelog: ready: serving on nbd://{address}/{}", server.exports()[0].name);
            server.run_tcp(listener)
        }
        None => {
            let listener = bind_unix(&arguments.socket)?;
            eprintln!("stripelog: ready: serving on {}", arguments.socket.display());
            print_commands(&arguments.socket, server.exports());
            let result = server.run_unix(listener);
            let _ = std::fs::remove_file(&arguments.socket);
            result
        }
    };
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
    let server = Arc::into_inner(server).ok_or("connections still hold the server")?;
    for export in server.into_exports() {
        let name = export.name;
        match Arc::into_inner(export.volume) {
            Some(volume) => volume.close().map_err(|error| format!("closing '{name}': {error}"))?,
            None => return Err(format!("export '{name}' is still in use")),
        }
    }
    eprintln!("stripelog: volumes flushed and closed");
    Ok(ExitCode::SUCCESS)
}
