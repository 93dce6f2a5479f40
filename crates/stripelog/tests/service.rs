//! `stripelog serve` as a service: the readiness protocol of a `Type=notify` unit (READY=1,
//! STOPPING=1, STATUS= on a $NOTIFY_SOCKET the test binds), `--wait-for-members`, and a
//! SIGINT or SIGTERM that arrives while the server is still starting: it must stop by
//! itself, with the volume closed cleanly.

mod common;

use common::*;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A volume of three 64 MiB file members in a fresh directory.
struct Volume {
    directory: PathBuf,
    members: Vec<PathBuf>,
    socket: PathBuf,
}

impl Volume {
    fn create(label: &str) -> Volume {
        let directory = fresh_directory(label);
        let members: Vec<PathBuf> = (0..3).map(|index| directory.join(format!("m{index}"))).collect();
        let create = run_with_timeout(
            stripelog().args(["create", "--raid", "5", "--chunk", "64KiB", "--member-size", "64MiB"]).args(&members),
            CLIENT_TIMEOUT,
        );
        assert!(create.status.success(), "stripelog create: {}", text(&create));
        let socket = directory.join("s.sock");
        Volume { directory, members, socket }
    }

    /// `stripelog serve` on the volume with `arguments` added, telling `notify` what it
    /// does; its output goes to the log file of run `run`.
    fn serve(&self, notify: &Notify, run: usize, arguments: &[&str]) -> Child {
        let log = std::fs::File::create(self.log_path(run)).expect("create the server log");
        stripelog()
            .arg("serve")
            .args(&self.members)
            .arg("--socket")
            .arg(&self.socket)
            .args(arguments)
            .env("NOTIFY_SOCKET", &notify.variable)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file"))
            .stderr(log)
            .spawn()
            .expect("start stripelog serve")
    }

    fn log_path(&self, run: usize) -> PathBuf {
        self.directory.join(format!("serve-{run}.log"))
    }

    fn log(&self, run: usize) -> String {
        std::fs::read_to_string(self.log_path(run)).unwrap_or_default()
    }

    /// Whether `info` finds the volume open (not closed cleanly).
    fn holder_open(&self) -> bool {
        let info = run_with_timeout(stripelog().args(["info", "--json"]).args(&self.members), CLIENT_TIMEOUT);
        assert!(info.status.success(), "stripelog info: {}", text(&info));
        json(&info)["holder"]["open"].as_bool().expect("holder.open in info --json")
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

/// The socket systemd would listen on for a `Type=notify` service, bound by the test.
struct Notify {
    socket: UnixDatagram,
    /// What NOTIFY_SOCKET is set to: a path, or `@NAME` in the abstract namespace.
    variable: String,
    /// Every message received so far, in order.
    received: Vec<String>,
}

impl Notify {
    fn at_path(path: &Path) -> Notify {
        let socket = UnixDatagram::bind(path).expect("bind the notify socket");
        Notify { socket, variable: path.display().to_string(), received: Vec::new() }
    }

    fn abstract_named(name: &str) -> Notify {
        let address = SocketAddr::from_abstract_name(name.as_bytes()).expect("an abstract socket name");
        let socket = UnixDatagram::bind_addr(&address).expect("bind the notify socket");
        Notify { socket, variable: format!("@{name}"), received: Vec::new() }
    }

    /// Receive messages until one satisfies `wanted` (returned), or panic after `timeout`
    /// or when `server` exits first, with the messages and `log()`.
    fn wait_for(
        &mut self,
        what: &str,
        wanted: impl Fn(&str) -> bool,
        timeout: Duration,
        server: &mut Child,
        log: impl Fn() -> String,
    ) -> String {
        let deadline = Instant::now() + timeout;
        self.socket.set_read_timeout(Some(Duration::from_millis(50))).expect("set a read timeout");
        loop {
            let mut buffer = [0u8; 4096];
            if let Ok(length) = self.socket.recv(&mut buffer) {
                let message = String::from_utf8_lossy(&buffer[..length]).into_owned();
                self.received.push(message.clone());
                if wanted(&message) {
                    return message;
                }
                continue;
            }
            if let Some(status) = server.try_wait().expect("wait for the server") {
                // What it sent just before it exited may have come after the last receive.
                self.drain();
                if let Some(message) = self.received.iter().find(|message| wanted(message)) {
                    return message.clone();
                }
                panic!("stripelog serve exited ({status}) before sending {what}; sent {:?}:\n{}", self.received, log());
            }
            if Instant::now() >= deadline {
                panic!("no {what} within {timeout:?}; sent {:?}:\n{}", self.received, log());
            }
        }
    }

    /// Whatever else is queued, without waiting.
    fn drain(&mut self) {
        self.socket.set_nonblocking(true).expect("non-blocking");
        let mut buffer = [0u8; 4096];
        while let Ok(length) = self.socket.recv(&mut buffer) {
            self.received.push(String::from_utf8_lossy(&buffer[..length]).into_owned());
        }
        self.socket.set_nonblocking(false).expect("blocking");
    }
}

fn signal(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
    // SAFETY: kill has no memory-safety preconditions; pid is our own child, not yet reaped.
    unsafe { libc::kill(pid, signal) };
}

/// The child's exit status within `timeout`, or it is killed and the test fails.
fn exits_within(child: &mut Child, timeout: Duration, log: impl Fn() -> String) -> std::process::ExitStatus {
    match wait_with_timeout(child, timeout) {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("stripelog serve still ran {timeout:?} after the signal (killed now):\n{}", log());
        }
    }
}

#[test]
fn serve_tells_systemd_when_it_is_ready_and_when_it_stops() {
    let volume = Volume::create("notify");
    let mut notify = Notify::at_path(&volume.directory.join("notify"));
    let mut server = volume.serve(&notify, 1, &[]);
    let log = || volume.log(1);
    notify.wait_for("READY=1", |message| message == "READY=1", SERVER_TIMEOUT, &mut server, log);
    // Ready means what a client needs: the socket answers, with the volume open.
    let greeting = greeting(&volume.socket).unwrap_or_else(|error| panic!("no greeting after READY=1: {error}"));
    assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
    let statuses: Vec<&String> = notify.received.iter().filter(|message| message.starts_with("STATUS=")).collect();
    assert!(statuses.iter().any(|status| status.contains("opening export 'stripelog'")), "{statuses:?}");
    assert!(
        statuses.last().is_some_and(|status| status.starts_with("STATUS=serving 1 export(s) on ")),
        "the last status before READY=1 says it serves: {statuses:?}"
    );
    signal(&server, libc::SIGTERM);
    notify.wait_for("STOPPING=1", |message| message == "STOPPING=1", SERVER_TIMEOUT, &mut server, log);
    let status = exits_within(&mut server, SERVER_TIMEOUT, log);
    assert!(status.success(), "stripelog serve exited with {status} after SIGTERM:\n{}", log());
    assert!(!volume.holder_open(), "the volume is not closed cleanly after SIGTERM:\n{}", log());
}

/// The case: a SIGINT right after a restart from SIGKILL, while the volume mounts
/// and recovers. The fault hook holds the server after the open, before it serves, so the
/// signal surely arrives while it starts.
#[test]
fn a_signal_while_the_volume_opens_closes_it_cleanly_without_serving() {
    let volume = Volume::create("signal-opening");
    let mut notify = Notify::at_path(&volume.directory.join("notify"));
    let mut crashed = volume.serve(&notify, 1, &[]);
    notify.wait_for("READY=1", |message| message == "READY=1", SERVER_TIMEOUT, &mut crashed, || volume.log(1));
    signal(&crashed, libc::SIGKILL);
    let _ = crashed.wait();
    assert!(volume.holder_open(), "after SIGKILL the volume should look open (not closed cleanly)");

    notify.received.clear();
    let pause = Duration::from_secs(3);
    let mut server = volume.serve(&notify, 2, &["--fault-pause-after-open", "3s"]);
    let log = || volume.log(2);
    notify.wait_for(
        "STATUS=opening",
        |message| message.starts_with("STATUS=opening"),
        SERVER_TIMEOUT,
        &mut server,
        log,
    );
    signal(&server, libc::SIGINT);
    let status = exits_within(&mut server, SERVER_TIMEOUT + pause, log);
    assert!(status.success(), "stripelog serve exited with {status} after a SIGINT while starting:\n{}", log());
    assert!(log().contains("arrived while starting"), "the log says the signal came while starting:\n{}", log());
    notify.drain();
    assert!(notify.received.iter().any(|message| message == "STOPPING=1"), "{:?}", notify.received);
    assert!(!notify.received.iter().any(|message| message == "READY=1"), "ready after a stop: {:?}", notify.received);
    assert!(!volume.holder_open(), "the volume is not closed cleanly:\n{}", log());
}

#[test]
fn a_signal_while_waiting_for_members_ends_serve_without_opening() {
    let volume = Volume::create("signal-waiting");
    let away = volume.directory.join("m2.away");
    std::fs::rename(&volume.members[2], &away).expect("take member 2 away");
    let name = format!("stripelog-test-notify-{}", std::process::id());
    let mut notify = Notify::abstract_named(&name);
    let mut server = volume.serve(&notify, 1, &["--wait-for-members", "60s"]);
    let log = || volume.log(1);
    let member = volume.members[2].display().to_string();
    let waiting = notify.wait_for(
        "STATUS=waiting",
        |message| message.starts_with("STATUS=waiting up to 1m for members to appear"),
        SERVER_TIMEOUT,
        &mut server,
        log,
    );
    assert!(waiting.ends_with(&member), "{waiting} names {member}");
    assert!(log().contains(&format!("for members to appear: {member}")), "{}", log());
    signal(&server, libc::SIGTERM);
    let status = exits_within(&mut server, SERVER_TIMEOUT, log);
    assert!(status.success(), "stripelog serve exited with {status} after SIGTERM while waiting:\n{}", log());
    assert!(log().contains("while waiting for members"), "{}", log());
    std::fs::rename(&away, &volume.members[2]).expect("bring member 2 back");
    assert!(!volume.holder_open(), "the volume was opened by a server told to stop:\n{}", log());
}

#[test]
fn members_that_appear_during_the_wait_are_served_and_absent_ones_fail_at_its_end() {
    let volume = Volume::create("wait");
    let away = volume.directory.join("m2.away");
    std::fs::rename(&volume.members[2], &away).expect("take member 2 away");
    let member = volume.members[2].display().to_string();

    // Still absent at the end of the wait: an error naming it, within the bound.
    let mut notify = Notify::at_path(&volume.directory.join("notify"));
    let started = Instant::now();
    let mut server = volume.serve(&notify, 1, &["--wait-for-members", "1s"]);
    let status = exits_within(&mut server, SERVER_TIMEOUT, || volume.log(1));
    assert!(!status.success(), "serve succeeded without member 2:\n{}", volume.log(1));
    assert!(started.elapsed() >= Duration::from_secs(1), "it gave up before the wait's end");
    assert!(
        volume.log(1).contains(&format!("members still absent after waiting 1s (--wait-for-members): {member}")),
        "{}",
        volume.log(1)
    );

    // It appears while serve waits: the volume opens and is served.
    notify.drain();
    notify.received.clear();
    let mut server = volume.serve(&notify, 2, &["--wait-for-members", "60s"]);
    let log = || volume.log(2);
    notify.wait_for(
        "STATUS=waiting",
        |message| message.starts_with("STATUS=waiting"),
        SERVER_TIMEOUT,
        &mut server,
        log,
    );
    std::fs::rename(&away, &volume.members[2]).expect("bring member 2 back");
    notify.wait_for("READY=1", |message| message == "READY=1", SERVER_TIMEOUT, &mut server, log);
    assert!(log().contains("every member is there after"), "{}", log());
    signal(&server, libc::SIGTERM);
    let status = exits_within(&mut server, SERVER_TIMEOUT, log);
    assert!(status.success(), "stripelog serve exited with {status} after SIGTERM:\n{}", log());
    assert!(!volume.holder_open(), "the volume is not closed cleanly:\n{}", log());
}
