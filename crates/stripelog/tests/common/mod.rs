//! What the tests of `stripelog` as a program share: running the binary with timeouts,
//! finding the tools `make test` installs (failing under CI where one is missing, loudly
//! skipping elsewhere), and a RAID-5 volume served by `stripelog serve` on a Unix socket.
//! Each test crate uses a part of it.
#![allow(dead_code)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const KIBIBYTE: u64 = 1024;
pub const MEBIBYTE: u64 = 1024 * KIBIBYTE;
pub const MEMBER_COUNT: usize = 5;
/// Longest a server may take to accept connections, and to exit after SIGTERM.
pub const SERVER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest one client invocation may take.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Export name the server uses when `--export` is not given.
pub const EXPORT_NAME: &str = "stripelog";

pub static NEXT_DIRECTORY: AtomicUsize = AtomicUsize::new(0);

pub fn stripelog() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stripelog"))
}

pub fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A test cannot run here: outside CI it says so loudly and is skipped; under CI
/// (`CI=true`), where `make test` installs every tool first, it fails.
pub fn cannot_run(reason: &str) {
    if std::env::var("CI").is_ok_and(|value| value == "true") {
        panic!("{reason}, and CI=true: `make test` installs everything these tests need (scripts/install-deps.sh)");
    }
    eprintln!("SKIPPED: {reason} (run scripts/install-deps.sh; under CI=true this is a failure)");
}

/// The path of an installed program, or `None` after `cannot_run`.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = find_in_path(name).into_iter().next();
    if found.is_none() {
        cannot_run(&format!("{name} is not installed"));
    }
    found
}

/// Every executable called `name` in the directories of PATH, in PATH order.
pub fn find_in_path(name: &str) -> Vec<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|directory| directory.join(name))
        .filter(|candidate| {
            std::fs::metadata(candidate)
                .map(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
        .collect()
}

/// A command that runs nbdsh, or `None` after saying the test is skipped. `nbdsh` runs `python3 -m
/// nbd` with the first python3 on PATH, which may lack the nbd module (a pyenv or virtualenv python in
/// front of the system one): then use the first python3 on PATH that has it.
pub fn nbd_shell() -> Option<Command> {
    let nbdsh = tool("nbdsh")?;
    if runs_successfully(Command::new(&nbdsh).arg("--version")) {
        return Some(Command::new(nbdsh));
    }
    for python in find_in_path("python3") {
        if runs_successfully(Command::new(&python).args(["-m", "nbd", "--version"])) {
            let mut command = Command::new(python);
            command.args(["-m", "nbd"]);
            return Some(command);
        }
    }
    cannot_run("nbdsh does not run (no python3 on PATH has the nbd module of python3-libnbd)");
    None
}

/// The first python3 on PATH (or the system's) that can import `module`, or `None` after
/// saying the test is skipped.
#[allow(dead_code)] // (not every test binary uses it)
pub fn python_with(module: &str, package: &str) -> Option<PathBuf> {
    let mut pythons = find_in_path("python3");
    pythons.push(PathBuf::from("/usr/bin/python3"));
    let found = pythons
        .into_iter()
        .find(|python| runs_successfully(Command::new(python).args(["-c", &format!("import {module}")])));
    if found.is_none() {
        cannot_run(&format!("no python3 here imports {module} (Debian package {package})"));
    }
    found
}

pub fn runs_successfully(command: &mut Command) -> bool {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Run a command to completion with its output captured; kill it and panic if it takes longer
/// than `timeout`.
pub fn run_with_timeout(command: &mut Command, timeout: Duration) -> Output {
    let description = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {description}: {error}"));
    // Drain both pipes while waiting, so a chatty client cannot block on a full pipe.
    let stdout_reader = drain(child.stdout.take().expect("stdout is piped"));
    let stderr_reader = drain(child.stderr.take().expect("stderr is piped"));
    let status = match wait_with_timeout(&mut child, timeout) {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{description} did not finish within {timeout:?}");
        }
    };
    Output {
        status,
        stdout: stdout_reader.join().expect("stdout reader"),
        stderr: stderr_reader.join().expect("stderr reader"),
    }
}

pub fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// The exit status of `child`, or `None` if it is still running after `timeout`.
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("wait for a child process") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deterministic pseudo-random bytes (xorshift64*): incompressible, and different for each seed.
pub fn random_bytes(length: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut bytes = Vec::with_capacity(length + 8);
    while bytes.len() < length {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        bytes.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    bytes.truncate(length);
    bytes
}

/// Panic, with the first differing offset, unless `actual` equals `expected`.
pub fn assert_same_bytes(actual: &[u8], expected: &[u8], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length differs");
    if let Some(offset) = actual.iter().zip(expected).position(|(left, right)| left != right) {
        panic!(
            "{what}: first difference at byte {offset}: {:#04x} instead of {:#04x}",
            actual[offset], expected[offset]
        );
    }
}

pub fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("output is not JSON ({error}): {}", String::from_utf8_lossy(&output.stdout)))
}

/// A new, empty directory under the system temporary directory, unique in this process.
pub fn fresh_directory(label: &str) -> PathBuf {
    let directory = std::env::temp_dir().join(format!(
        "stripelog-{label}-{}-{}",
        std::process::id(),
        NEXT_DIRECTORY.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).expect("create a temporary directory");
    directory
}

/// A RAID-5 volume (5 members, 64 KiB chunks, 64 MiB members) in a fresh temporary directory, served
/// by `stripelog serve` on a Unix socket there. Dropping it stops the server (SIGTERM, then SIGKILL
/// after 10 s) and removes the directory.
pub struct Server {
    pub directory: PathBuf,
    pub members: Vec<PathBuf>,
    pub socket: PathBuf,
    pub logical_size: u64,
    pub process: Option<Child>,
    /// How many times a server was started on this volume; names each run's log file.
    pub starts: usize,
    /// Given to `stripelog serve` after the members and socket.
    pub serve_arguments: Vec<String>,
}

impl Server {
    pub fn start() -> Server {
        Server::start_raid("5")
    }

    pub fn start_raid(raid: &str) -> Server {
        Server::start_with(raid, &[])
    }

    /// A volume of RAID level `raid` created with `create_arguments` added.
    pub fn start_with(raid: &str, create_arguments: &[&str]) -> Server {
        // 96 MiB members: about 307 MiB of logical space, room for the 256 MiB image.
        Server::start_with_members_of(raid, "96MiB", create_arguments)
    }

    /// A volume of RAID level `raid` on members of `member_size` (a size as `create`
    /// takes it), created with `create_arguments` added.
    pub fn start_with_members_of(raid: &str, member_size: &str, create_arguments: &[&str]) -> Server {
        let directory = fresh_directory("nbd");
        let members: Vec<PathBuf> = (0..MEMBER_COUNT).map(|index| directory.join(format!("m{index}"))).collect();
        let socket = directory.join("stripelog.sock");
        // sockaddr_un holds 108 bytes, the terminating NUL included.
        assert!(socket.as_os_str().len() < 100, "socket path too long for a Unix socket: {}", socket.display());

        let create = run_with_timeout(
            stripelog()
                .args(["create", "--raid", raid, "--chunk", "64KiB", "--member-size", member_size])
                .args(create_arguments)
                .args(&members),
            CLIENT_TIMEOUT,
        );
        assert!(create.status.success(), "stripelog create: {}", text(&create));
        let info = run_with_timeout(stripelog().args(["info", "--json"]).args(&members), CLIENT_TIMEOUT);
        assert!(info.status.success(), "stripelog info: {}", text(&info));
        let logical_size = json(&info)["logical_size_bytes"].as_u64().expect("logical_size_bytes in info --json");

        let mut server =
            Server { directory, members, socket, logical_size, process: None, starts: 0, serve_arguments: Vec::new() };
        server.spawn();
        server
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///{EXPORT_NAME}?socket={}", self.socket.display())
    }

    pub fn log_path(&self, start: usize) -> PathBuf {
        self.directory.join(format!("serve-{start}.log"))
    }

    /// Everything the server runs wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|start| {
                let log = std::fs::read_to_string(self.log_path(start)).unwrap_or_default();
                format!("--- stripelog serve, run {start} ---\n{log}")
            })
            .collect()
    }

    /// Start `stripelog serve` on the members and wait until it answers on the socket.
    pub fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!("{log}");
        }
    }

    /// `spawn`, with `arguments(port)` added to the serve arguments for a TCP port from
    /// `free_port`: a port another test took between `free_port` and the server's bind
    /// ("Address already in use") is replaced by a fresh one, up to `PORT_ATTEMPTS` times.
    /// Returns the port the server listens on.
    pub fn spawn_on_free_port(&mut self, arguments: impl Fn(u16) -> Vec<String>) -> u16 {
        let base = self.serve_arguments.clone();
        retry_on_a_taken_port(|| {
            let port = free_port();
            self.serve_arguments = base.iter().cloned().chain(arguments(port)).collect();
            self.try_spawn().map(|()| port).inspect_err(|_| {
                // The attempt that lost its port is not one of the server's runs.
                let _ = std::fs::remove_file(self.log_path(self.starts));
                self.starts -= 1;
            })
        })
    }

    /// Start the server and wait until it is ready; `Err` with its log when it exits first.
    fn try_spawn(&mut self) -> Result<(), String> {
        assert!(self.process.is_none(), "a server is already running");
        self.starts += 1;
        let log = std::fs::File::create(self.log_path(self.starts)).expect("create the server log");
        let process = stripelog()
            .arg("serve")
            .args(&self.members)
            .arg("--socket")
            .arg(&self.socket)
            .args(&self.serve_arguments)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file"))
            .stderr(log)
            .spawn()
            .expect("start stripelog serve");
        self.process = Some(process);
        self.try_wait_until_ready()
    }

    /// Wait (at most SERVER_TIMEOUT) until a connection to the socket gets the whole NBD fixed-newstyle
    /// greeting ("NBDMAGIC", "IHAVEOPT", handshake flags with NBD_FLAG_FIXED_NEWSTYLE); the connection
    /// is then closed without an answer, and the server must carry on.
    pub fn wait_until_ready(&mut self) {
        if let Err(log) = self.try_wait_until_ready() {
            panic!("{log}");
        }
    }

    /// `wait_until_ready`, with `Err` (the server's log) when the server exits first.
    fn try_wait_until_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + SERVER_TIMEOUT;
        let mut last_error = String::from("the socket does not exist yet");
        loop {
            let process = self.process.as_mut().expect("a server process");
            if let Some(status) = process.try_wait().expect("wait for the server") {
                self.process = None;
                return Err(format!("stripelog serve exited ({status}) before accepting connections:\n{}", self.log()));
            }
            if self.socket.exists() {
                match greeting(&self.socket) {
                    Ok(greeting) if &greeting[..16] == b"NBDMAGICIHAVEOPT" && greeting[17] & 1 == 1 => return Ok(()),
                    Ok(greeting) => panic!(
                        "the server's greeting is {:?}, not NBDMAGIC IHAVEOPT with NBD_FLAG_FIXED_NEWSTYLE:\n{}",
                        String::from_utf8_lossy(&greeting),
                        self.log()
                    ),
                    Err(error) => last_error = error.to_string(),
                }
            }
            if Instant::now() >= deadline {
                panic!("stripelog serve not ready within {SERVER_TIMEOUT:?} ({last_error}):\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Send `signal` and wait for the server to exit: its exit status, or an error if it had to be
    /// killed after SERVER_TIMEOUT. Does nothing (Ok of a success status) if no server is running.
    pub fn stop(&mut self, signal: libc::c_int) -> Result<ExitStatus, String> {
        let Some(mut process) = self.process.take() else { return Ok(ExitStatus::from_raw(0)) };
        let pid = libc::pid_t::try_from(process.id()).expect("a pid fits pid_t");
        // SAFETY: kill has no memory-safety preconditions; pid is our own child, not yet reaped.
        unsafe { libc::kill(pid, signal) };
        if let Some(status) = wait_with_timeout(&mut process, SERVER_TIMEOUT) {
            return Ok(status);
        }
        let _ = process.kill();
        let _ = process.wait();
        Err(format!("stripelog serve still running {SERVER_TIMEOUT:?} after signal {signal}: killed"))
    }

    /// Stop the server with `signal`: it must exit successfully within SERVER_TIMEOUT.
    pub fn stop_cleanly(&mut self, signal: libc::c_int) {
        let status = self.stop(signal).unwrap_or_else(|error| panic!("{error}:\n{}", self.log()));
        assert!(status.success(), "stripelog serve exited with {status} after signal {signal}:\n{}", self.log());
    }

    /// Run a client to completion (at most CLIENT_TIMEOUT); panic, with its output and the
    /// server's log, unless it succeeds.
    pub fn client(&self, command: &mut Command) -> Output {
        let description = format!("{command:?}");
        let output = run_with_timeout(command, CLIENT_TIMEOUT);
        assert!(
            output.status.success(),
            "{description} failed ({}):\n{}\n{}",
            output.status,
            text(&output),
            self.log()
        );
        output
    }

    /// qemu-io on the export with the given commands (`-c` each). Write-back caching: plain writes go
    /// out without FUA, `write -f` with FUA, `flush` as NBD_CMD_FLUSH. qemu-io exits non-zero when
    /// a command fails or a read finds another pattern; both are errors here.
    pub fn qemu_io<S: AsRef<str>>(&self, qemu_io: &Path, commands: &[S]) -> Output {
        let output = self.client(&mut self.qemu_io_command(qemu_io, commands));
        assert!(
            !text(&output).contains("Pattern verification failed"),
            "qemu-io read another pattern:\n{}\n{}",
            text(&output),
            self.log()
        );
        output
    }

    pub fn qemu_io_command<S: AsRef<str>>(&self, qemu_io: &Path, commands: &[S]) -> Command {
        let mut command = Command::new(qemu_io);
        command.args(["-f", "raw", "-t", "writeback"]).arg(self.uri());
        for each in commands {
            command.arg("-c").arg(each.as_ref());
        }
        command
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop(libc::SIGTERM);
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

/// A free TCP port on loopback: bind port 0, note it, release it.
/// Servers started on a `free_port` that another test took before the server bound it are
/// started again on another, this many times at most.
pub const PORT_ATTEMPTS: usize = 5;

/// Run `start` (a server on ports `free_port` gave) again while it fails because another
/// test took a port first ("Address already in use" in its `Err`, the server's log), at
/// most `PORT_ATTEMPTS` times; any other failure panics with the log.
pub fn retry_on_a_taken_port<T>(mut start: impl FnMut() -> Result<T, String>) -> T {
    let mut last_log = String::new();
    for _ in 0..PORT_ATTEMPTS {
        match start() {
            Ok(server) => return server,
            Err(log) if log.contains("Address already in use") => last_log = log,
            Err(log) => panic!("{log}"),
        }
    }
    panic!("no free port after {PORT_ATTEMPTS} attempts:\n{last_log}")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port()
}

/// `GET path` from an HTTP server on loopback `port`: the status line and the body.
pub fn http_get(port: u16, path: &str) -> (String, String) {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the HTTP port");
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).expect("set a read timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

/// The 18 bytes a newstyle server sends on a new connection.
pub fn greeting(socket: &Path) -> std::io::Result<[u8; 18]> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut greeting = [0; 18];
    stream.read_exact(&mut greeting)?;
    Ok(greeting)
}
