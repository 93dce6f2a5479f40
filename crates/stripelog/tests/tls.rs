//! NBD over TLS (docs/tls.md) with real clients: qemu-img (QEMU's `tls-creds-x509`) and
//! libnbd's nbdinfo and nbdcopy (`nbds://...?tls-certificates=DIR`) against `stripelog serve
//! --listen --tls-certificates --tls-verify-peer --allow-clients` on loopback TCP. The
//! certificates come from `scripts/tls-certificates.sh` (openssl), fresh for each run. A
//! missing tool skips loudly, and fails under CI (`CI=true`).
mod common;

use common::*;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Certificate directories: `server`, and one per client named by its certificate's CN.
struct Credentials {
    directory: PathBuf,
}

impl Credentials {
    /// Two authorities: ours (server, alice, bob) and a stranger's (mallory).
    fn make(directory: &Path) -> Credentials {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/tls-certificates.sh");
        for (authority, clients) in [("ours", &["alice", "bob"][..]), ("stranger", &["mallory"][..])] {
            let output = run_with_timeout(
                Command::new("sh").arg(script).arg(directory.join(authority)).args(clients),
                CLIENT_TIMEOUT,
            );
            assert!(output.status.success(), "{script}: {}", text(&output));
        }
        let credentials = Credentials { directory: directory.to_path_buf() };
        // Mallory trusts our server but holds a certificate our authority never signed;
        // nobody has no certificate at all.
        for (name, files) in [("mallory-here", &["client-cert.pem", "client-key.pem"][..]), ("nobody", &[][..])] {
            let client = directory.join(name);
            std::fs::create_dir_all(&client).expect("create a client directory");
            std::fs::copy(credentials.client("alice").join("ca-cert.pem"), client.join("ca-cert.pem")).expect("copy");
            for file in files {
                std::fs::copy(directory.join("stranger/mallory").join(file), client.join(file)).expect("copy");
            }
        }
        credentials
    }

    fn server(&self) -> PathBuf {
        self.directory.join("ours/server")
    }

    fn client(&self, name: &str) -> PathBuf {
        match name {
            "alice" | "bob" => self.directory.join("ours").join(name),
            other => self.directory.join(other),
        }
    }
}

/// `stripelog serve` on a free loopback port; stopped with SIGTERM when dropped.
struct TlsServer {
    process: Option<Child>,
    port: u16,
    metrics_port: u16,
    log: PathBuf,
    control: PathBuf,
}

impl TlsServer {
    /// Start a server, on fresh ports again when one was taken meanwhile.
    fn start(directory: &Path, exports: &[String], tls_arguments: &[String]) -> TlsServer {
        retry_on_a_taken_port(|| {
            TlsServer::start_on_free_ports(directory, exports, tls_arguments)
                .map_err(|log| format!("stripelog serve exited:\n{log}"))
        })
    }

    /// Start a server on two ports free a moment ago; `Err(its log)` when it exits first.
    fn start_on_free_ports(
        directory: &Path,
        exports: &[String],
        tls_arguments: &[String],
    ) -> Result<TlsServer, String> {
        let port = free_port();
        let metrics_port = free_port();
        let log = directory.join("serve.log");
        let control = directory.join("serve.control");
        let file = std::fs::File::create(&log).expect("create the server log");
        let process = stripelog()
            .args(["serve", "--log-level", "debug", "--listen", &port.to_string()])
            .arg("--control")
            .arg(&control)
            .args(["--metrics", &metrics_port.to_string()])
            .args(exports.iter().map(|export| format!("--export={export}")))
            .args(tls_arguments)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone the log file"))
            .stderr(file)
            .spawn()
            .expect("start stripelog serve");
        let mut server = TlsServer { process: Some(process), port, metrics_port, log, control };
        let deadline = Instant::now() + SERVER_TIMEOUT;
        // The port is bound before the volumes are opened, and accepts connections into
        // its backlog from then: ready is when the server says so (its signal handler is
        // in place, and its start-up lines are all in the log).
        while !server.log().contains("ready: serving on") {
            if let Some(status) = server.process.as_mut().and_then(|process| process.try_wait().ok().flatten()) {
                server.process = None;
                return Err(format!("({status})\n{}", server.log()));
            }
            assert!(Instant::now() < deadline, "the server was not ready on port {port}:\n{}", server.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An `nbds://` URI for libnbd's tools, with a client's certificate directory.
    fn uri(&self, export: &str, client: &Path) -> String {
        format!("nbds://localhost:{}/{export}?tls-certificates={}", self.port, client.display())
    }

    /// QEMU's image options for an export, with the `tls0` credentials object.
    fn qemu_image(&self, export: &str) -> String {
        format!(
            "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={},export={export},tls-creds=tls0",
            self.port
        )
    }

    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut process = self.process.take()?;
        // SAFETY: kill with a valid pid of our own child (not yet reaped) and a valid signal.
        unsafe { libc::kill(process.id() as libc::pid_t, libc::SIGTERM) };
        let status = wait_with_timeout(&mut process, SERVER_TIMEOUT);
        if status.is_none() {
            let _ = process.kill();
            let _ = process.wait();
        }
        status
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A RAID-5 volume on three member files named after the export, as `--export NAME=...`.
fn create_export(directory: &Path, name: &str, member_size: &str) -> String {
    let members: Vec<PathBuf> = (0..3).map(|index| directory.join(format!("{name}{index}"))).collect();
    let create = run_with_timeout(
        stripelog().args(["create", "--raid", "5", "--chunk", "64KiB", "--member-size", member_size]).args(&members),
        CLIENT_TIMEOUT,
    );
    assert!(create.status.success(), "create: {}", text(&create));
    let joined: Vec<String> = members.iter().map(|member| member.display().to_string()).collect();
    format!("{name}={}", joined.join(","))
}

fn qemu_tls_object(client: &Path) -> String {
    format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", client.display())
}

fn failed_with(output: &Output, expected: &str, what: &str) {
    assert!(!output.status.success(), "{what} succeeded:\n{}", text(output));
    assert!(text(output).contains(expected), "{what}: expected '{expected}' in:\n{}", text(output));
}

/// Two exports: `secret` admits only the certificate named alice, `shared` any client
/// with a certificate from our authority. Data goes in with qemu-img and comes back with
/// nbdcopy, both through TLS; libnbd sees TLS and structured replies; clients without TLS,
/// without a certificate, with a stranger's certificate, or not on the allow-list are
/// refused, and neither the plain nor bob's listing reveals `secret`.
#[test]
fn tls_clients_with_certificates_copy_data_and_the_others_are_refused() {
    let (Some(_openssl), Some(qemu_img), Some(nbdinfo), Some(nbdcopy)) =
        (tool("openssl"), tool("qemu-img"), tool("nbdinfo"), tool("nbdcopy"))
    else {
        return;
    };
    let directory = fresh_directory("tls");
    let credentials = Credentials::make(&directory.join("credentials"));
    let exports = vec![create_export(&directory, "secret", "32MiB"), create_export(&directory, "shared", "32MiB")];
    let tls_arguments: Vec<String> = vec![
        "--tls-certificates".into(),
        credentials.server().display().to_string(),
        "--tls-verify-peer".into(),
        "--allow-clients".into(),
        "secret=alice".into(),
    ];
    let mut server = TlsServer::start(&directory, &exports, &tls_arguments);
    let client = |command: &mut Command| {
        let description = format!("{command:?}");
        let output = run_with_timeout(command, CLIENT_TIMEOUT);
        assert!(output.status.success(), "{description}: {}\n{}", text(&output), server.log());
        output
    };

    // Alice writes 8 MiB into `secret` with qemu-img and reads them back with nbdcopy.
    let image = directory.join("image");
    let data = random_bytes(8 << 20, 25);
    std::fs::write(&image, &data).expect("write the image");
    client(
        Command::new(&qemu_img)
            .args(["convert", "-n", "-f", "raw", "--object"])
            .arg(qemu_tls_object(&credentials.client("alice")))
            .arg("--target-image-opts")
            .arg(&image)
            .arg(server.qemu_image("secret")),
    );
    let copy = client(
        Command::new(&nbdcopy).arg(server.uri("secret", &credentials.client("alice"))).arg("-").arg("--synchronous"),
    );
    assert_same_bytes(&copy.stdout[..data.len()], &data, "secret, read back through TLS");
    let information =
        client(Command::new(&nbdinfo).arg("--json").arg(server.uri("secret", &credentials.client("alice"))));
    let information = json(&information);
    assert_eq!(information["TLS"], true, "{information}");
    assert_eq!(information["protocol"], "newstyle-fixed", "{information}");

    // The handshake's first options often arrive behind the client's last TLS message:
    // a server that waits for more before passing them on stalls a connection for the
    // handshake timeout, so every one of these must be quick.
    for attempt in 0..12 {
        let started = Instant::now();
        let output = run_with_timeout(
            Command::new(&nbdinfo).arg("--size").arg(server.uri("shared", &credentials.client("bob"))),
            Duration::from_secs(10),
        );
        assert!(output.status.success(), "attempt {attempt}: {}\n{}", text(&output), server.log());
        assert!(started.elapsed() < Duration::from_secs(5), "attempt {attempt} took {:?}", started.elapsed());
    }

    // Bob's certificate is good, but `secret` admits only alice: refused as policy, and
    // his listing shows `shared` alone.
    let bob = credentials.client("bob");
    failed_with(
        &run_with_timeout(Command::new(&nbdinfo).arg(server.uri("secret", &bob)), CLIENT_TIMEOUT),
        "server replied with error to opt_go request",
        "bob opening secret",
    );
    assert!(server.log().contains("export 'secret' does not admit client 'bob'"), "{}", server.log());
    let listing = client(Command::new(&nbdinfo).arg("--list").arg(server.uri("", &bob)));
    assert!(text(&listing).contains("export=\"shared\""), "{}", text(&listing));
    assert!(!text(&listing).contains("secret"), "bob's listing names secret:\n{}", text(&listing));
    let listing = client(Command::new(&nbdinfo).arg("--list").arg(server.uri("", &credentials.client("alice"))));
    assert!(text(&listing).contains("export=\"secret\""), "{}", text(&listing));

    // Without TLS: refused, and the listing reveals nothing.
    let plain = format!("nbd://localhost:{}/shared", server.port);
    failed_with(&run_with_timeout(Command::new(&nbdinfo).arg(&plain), CLIENT_TIMEOUT), "opt_go", "a plain client");
    let plain_listing = run_with_timeout(Command::new(&nbdinfo).arg("--list").arg(&plain), CLIENT_TIMEOUT);
    assert!(!text(&plain_listing).contains("shared"), "a plain listing names an export:\n{}", text(&plain_listing));
    // A stranger's certificate, and none: the TLS handshake fails, and the log says why.
    for (name, reason) in [("mallory-here", "invalid peer certificate"), ("nobody", "peer sent no certificates")] {
        let output = run_with_timeout(
            Command::new(&nbdinfo).arg("--size").arg(server.uri("shared", &credentials.client(name))),
            CLIENT_TIMEOUT,
        );
        failed_with(&output, "TLS", name);
        assert!(server.log().contains(reason), "no '{reason}' in the log:\n{}", server.log());
    }
    // Status and the metrics tell the operator TLS is required, and how many clients
    // failed it: mallory and nobody.
    let status = client(stripelog().arg("status").arg("--control").arg(&server.control));
    assert!(text(&status).contains("TLS require ("), "{}", text(&status));
    // (The server counts a failed handshake just after its alert reaches the client.)
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        let status = json(&client(stripelog().args(["status", "--json", "--control"]).arg(&server.control)));
        if status["tls_handshakes_failed"] == 2 || Instant::now() > deadline {
            break status;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status["tls"], "require", "{status}");
    assert_eq!(status["tls_handshakes_failed"], 2, "{status}");
    let completed = status["tls_handshakes_completed"].as_u64().expect("tls_handshakes_completed");
    assert!(completed >= 16, "{status}");
    let (status_line, metrics) = http_get(server.metrics_port, "/metrics");
    assert_eq!(status_line, "HTTP/1.1 200 OK", "{metrics}");
    assert!(metrics.contains("stripelog_nbd_tls_handshakes_total{result=\"failed\"} 2\n"), "{metrics}");
    assert!(metrics.contains(&format!("stripelog_nbd_tls_handshakes_total{{result=\"completed\"}} {completed}\n")));

    let stopped = server.stop();
    let log = server.log();
    let _ = std::fs::remove_dir_all(&directory);
    assert!(stopped.is_some_and(|status| status.success()), "serve did not exit cleanly: {stopped:?}\n{log}");
}

/// The protocol's rules before STARTTLS, on a raw socket (proto.md, "TLS support"):
/// with TLS required, LIST gets NBD_REP_ERR_TLS_REQD, EXPORT_NAME closes the connection,
/// and a STARTTLS followed by something that is not a TLS ClientHello ends it.
#[test]
fn before_starttls_a_server_that_requires_tls_reveals_nothing() {
    let Some(_openssl) = tool("openssl") else { return };
    let directory = fresh_directory("tls-raw");
    let credentials = Credentials::make(&directory.join("credentials"));
    let export = create_export(&directory, "disk", "16MiB");
    let tls_arguments = vec!["--tls-certificates".to_string(), credentials.server().display().to_string()];
    let server = TlsServer::start(&directory, &[export], &tls_arguments);

    const OPTION_EXPORT_NAME: u32 = 1;
    const OPTION_LIST: u32 = 3;
    const OPTION_STARTTLS: u32 = 5;
    const REPLY_ACK: u32 = 1;
    const REPLY_ERROR_TLS_REQUIRED: u32 = (1 << 31) + 5;
    let connect = || {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).expect("greeting");
        assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
        stream.write_all(&1u32.to_be_bytes()).expect("client flags: fixed newstyle");
        stream
    };
    let send_option = |stream: &mut std::net::TcpStream, option: u32, payload: &[u8]| {
        let mut message = b"IHAVEOPT".to_vec();
        message.extend(option.to_be_bytes());
        message.extend((payload.len() as u32).to_be_bytes());
        message.extend(payload);
        stream.write_all(&message).expect("send an option");
    };
    // Reply header: magic (8), option (4), type (4), length (4), then the payload.
    let read_reply = |stream: &mut std::net::TcpStream| -> (u32, u32, Vec<u8>) {
        let mut header = [0u8; 20];
        stream.read_exact(&mut header).expect("an option reply");
        let field = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("four bytes"));
        let mut payload = vec![0u8; field(16) as usize];
        stream.read_exact(&mut payload).expect("the reply's payload");
        (field(8), field(12), payload)
    };
    // Whether the server closes the connection (what it sends first, a TLS alert, aside)
    // rather than waiting for more.
    let at_end = |stream: &mut std::net::TcpStream| {
        let mut rest = Vec::new();
        match stream.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
        }
    };

    let mut stream = connect();
    send_option(&mut stream, OPTION_LIST, &[]);
    let (option, reply, payload) = read_reply(&mut stream);
    assert_eq!((option, reply), (OPTION_LIST, REPLY_ERROR_TLS_REQUIRED), "{}", String::from_utf8_lossy(&payload));
    assert!(!String::from_utf8_lossy(&payload).contains("disk"), "the refusal names the export");

    let mut stream = connect();
    send_option(&mut stream, OPTION_EXPORT_NAME, b"disk");
    assert!(at_end(&mut stream), "EXPORT_NAME before TLS was answered");

    let mut stream = connect();
    send_option(&mut stream, OPTION_STARTTLS, &[]);
    let (option, reply, _) = read_reply(&mut stream);
    assert_eq!((option, reply), (OPTION_STARTTLS, REPLY_ACK));
    stream.write_all(b"IHAVEOPT this is not a TLS ClientHello").expect("send");
    assert!(at_end(&mut stream), "the server went on after a failed TLS handshake");

    drop(server);
    let _ = std::fs::remove_dir_all(&directory);
}

/// Certificate trouble found at start, before any client meets it: a server certificate
/// that is not valid now is refused (naming its dates); one that expires within 30 days,
/// and a private key other users can read, are warned about.
#[test]
fn serve_refuses_an_expired_certificate_and_warns_of_one_expiring_and_of_a_readable_key() {
    let Some(openssl) = tool("openssl") else { return };
    let directory = fresh_directory("tls-dates");
    let openssl_in = |place: &Path, arguments: &[&str]| {
        let output = run_with_timeout(Command::new(&openssl).current_dir(place).args(arguments), CLIENT_TIMEOUT);
        assert!(output.status.success(), "openssl {arguments:?}: {}", text(&output));
    };
    // Expired: signed by itself through `openssl ca`, the one way OpenSSL 3.0 takes dates.
    let expired = directory.join("expired");
    std::fs::create_dir_all(&expired).expect("create a directory");
    std::fs::write(expired.join("index.txt"), "").expect("write");
    std::fs::write(expired.join("serial"), "01\n").expect("write");
    std::fs::write(
        expired.join("ca.cnf"),
        "[ca]\ndefault_ca = test\n[test]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\n\
         policy = anything\ndefault_md = sha256\n[anything]\ncommonName = supplied\n",
    )
    .expect("write");
    openssl_in(
        &expired,
        &["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=old", "-keyout", "server-key.pem", "-out", "r.csr"],
    );
    openssl_in(
        &expired,
        &[
            "ca",
            "-batch",
            "-config",
            "ca.cnf",
            "-selfsign",
            "-keyfile",
            "server-key.pem",
            "-in",
            "r.csr",
            "-out",
            "server-cert.pem",
            "-startdate",
            "20200101000000Z",
            "-enddate",
            "20200102000000Z",
            "-notext",
        ],
    );
    let refused = run_with_timeout(
        stripelog()
            .args(["serve", "--listen", "0", "--tls-certificates"])
            .arg(&expired)
            .arg(directory.join("m0"))
            .arg(directory.join("m1")),
        CLIENT_TIMEOUT,
    );
    failed_with(&refused, "the certificate CN=old is valid from Jan  1 00:00:00 2020", "an expired certificate");
    failed_with(&refused, "not now", "an expired certificate");

    // Expiring tomorrow, with a key every user can read: served, with two warnings.
    let soon = directory.join("soon");
    std::fs::create_dir_all(&soon).expect("create a directory");
    openssl_in(
        &soon,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=soon",
            "-keyout",
            "server-key.pem",
            "-out",
            "server-cert.pem",
        ],
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(soon.join("server-key.pem"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let export = create_export(&directory, "disk", "16MiB");
    let mut server =
        TlsServer::start(&directory, &[export], &["--tls-certificates".into(), soon.display().to_string()]);
    let stopped = server.stop();
    let log = server.log();
    let _ = std::fs::remove_dir_all(&directory);
    assert!(log.contains("the certificate CN=soon expires on") && log.contains("renew it"), "{log}");
    assert!(log.contains("mode 644 lets other users read the private key"), "{log}");
    assert!(log.contains("TLS require: certificate CN=soon, valid until"), "{log}");
    assert!(stopped.is_some_and(|status| status.success()), "serve did not exit cleanly: {stopped:?}\n{log}");
}
