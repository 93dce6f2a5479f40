//! systemd's readiness protocol (sd_notify(3)) for `serve` under a `Type=notify` unit:
//! `READY=1` once it listens with its volumes open, `STOPPING=1` when it begins to shut
//! down, and `STATUS=` lines saying what it is doing. Each message is one datagram to the
//! socket $NOTIFY_SOCKET names (a path, or `@NAME` in the abstract namespace). Without
//! the variable nothing is sent; a message that cannot be sent is logged, never fatal.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;

/// Where the messages go, read from the environment once.
fn destination() -> Option<&'static SocketAddr> {
    static DESTINATION: OnceLock<Option<SocketAddr>> = OnceLock::new();
    DESTINATION
        .get_or_init(|| {
            let name = std::env::var_os("NOTIFY_SOCKET")?;
            let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str());
            let address = match bytes.strip_prefix(b"@") {
                Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name),
                None => SocketAddr::from_pathname(&name),
            };
            address.map_err(|error| log::warn!("NOTIFY_SOCKET={}: {error}", name.to_string_lossy())).ok()
        })
        .as_ref()
}

/// Send `message` (`READY=1`, `STOPPING=1`, ...) to systemd, if it listens.
pub fn send(message: &str) {
    let Some(address) = destination() else { return };
    let sent = UnixDatagram::unbound().and_then(|socket| socket.send_to_addr(message.as_bytes(), address));
    if let Err(error) = sent {
        log::warn!("telling systemd {message:?} (NOTIFY_SOCKET): {error}");
    }
}

/// `STATUS=text`: what `systemctl status` shows the service doing (one line).
pub fn status(text: &str) {
    send(&format!("STATUS={}", text.replace('\n', " ")));
}
