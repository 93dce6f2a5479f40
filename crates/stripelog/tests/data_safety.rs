//! Administrators' mistakes, each tried as a user would with the `stripelog` binary and refused
//! with a message that names what was found; the data written before reads back intact after
//! each (docs/data-safety.md). The numbers are those of the mistakes in the issue that asked for
//! this (two servers, create over a volume, replace with a live member, a socket path that is a
//! file, a mistyped member, a replaced member offered again, benchmarks over data, RAID-10's
//! survivability).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// A pattern written through qemu-io before each mistake and read back after it.
const PATTERN: &str = "0x5a";
const PATTERN_LENGTH: &str = "2M";

fn run(arguments: &[&str]) -> Output {
    run_with_timeout(stripelog().args(arguments), CLIENT_TIMEOUT)
}

fn run_on(arguments: &[&str], members: &[PathBuf]) -> Output {
    run_with_timeout(stripelog().args(arguments).args(members), CLIENT_TIMEOUT)
}

/// `output` failed with exit status 2 (an error, not a crash) and says every one of `needles`.
fn assert_refused(output: &Output, needles: &[&str], what: &str) {
    // `check` says "could not run" with bit 8 of its fsck-like status; the others exit 2.
    let expected = if what.contains("check") { 8 } else { 2 };
    assert_eq!(output.status.code(), Some(expected), "{what}: expected a refusal (exit {expected}):\n{}", text(output));
    for needle in needles {
        assert!(text(output).contains(needle), "{what}: the message does not say {needle:?}:\n{}", text(output));
    }
}

fn path_text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Write the pattern at 0 and flush.
fn write_pattern(server: &Server, qemu_io: &Path) {
    server.qemu_io(qemu_io, &[format!("write -P {PATTERN} 0 {PATTERN_LENGTH}"), "flush".to_string()]);
}

/// The pattern reads back (qemu-io fails on another pattern).
fn assert_pattern(server: &Server, qemu_io: &Path) {
    server.qemu_io(qemu_io, &[format!("read -P {PATTERN} 0 {PATTERN_LENGTH}")]);
}

fn assert_check_clean(members: &[PathBuf]) {
    let check = run_on(&["check"], members);
    assert!(check.status.success() && text(&check).contains("clean"), "check:\n{}", text(&check));
}

fn server_pid(server: &Server) -> u32 {
    server.process.as_ref().expect("a running server").id()
}

/// 1. Two processes, or one process twice, never serve the same members; offline maintenance
///    and benchmarks wait for the server to stop. The data flushed through the server survives.
#[test]
fn a_served_volume_is_opened_by_no_one_else() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let mut server = Server::start();
    write_pattern(&server, &qemu_io);
    let members = server.members.clone();
    let pid = server_pid(&server).to_string();
    let holder = ["in use by another process (pid", pid.as_str(), "stripelog serve"];

    let second_socket = server.directory.join("second.sock");
    let second = run_on(&["serve", "--socket", path_text(&second_socket)], &members);
    assert_refused(&second, &holder, "a second server on the same members");
    assert!(!second_socket.exists(), "the refused server left its socket behind");

    let list = members.iter().map(|path| path_text(path)).collect::<Vec<_>>().join(",");
    let third_socket = server.directory.join("third.sock");
    let twice = run(&[
        "serve",
        "--socket",
        path_text(&third_socket),
        "--export",
        &format!("a={list}"),
        "--export",
        &format!("b={list}"),
    ]);
    // The first export already meets the running server's lock.
    assert_refused(&twice, &["in use by another process"], "two exports of served members");

    let replacement = server.directory.join("new-member");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["info".into()], "info"),
        (vec!["check".into()], "check"),
        (vec!["scrub".into()], "offline scrub"),
        (
            vec!["replace".into(), "--member".into(), "2".into(), "--with".into(), path_text(&replacement).into()],
            "offline replace",
        ),
        (vec!["create".into(), "--force".into(), "--raid".into(), "5".into()], "create --force"),
    ];
    for (arguments, what) in cases {
        let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
        assert_refused(&run_on(&arguments, &members), &holder, what);
    }
    assert!(!replacement.exists() || std::fs::metadata(&replacement).unwrap().len() == 0, "replace wrote");
    let engine_target = format!("engine:{list}");
    let bench = run(&["bench", "mix", &engine_target, "--force", "--duration", "1s", "--quiet"]);
    assert_refused(&bench, &holder, "bench mix engine: on served members");
    let bench = run(&["bench", "mix", path_text(&members[0]), "--force", "--duration", "1s", "--quiet"]);
    assert_refused(&bench, &holder, "bench mix on a served member file");

    assert_pattern(&server, &qemu_io);
    server.stop_cleanly(libc::SIGTERM);
    assert_check_clean(&members);
    server.spawn();
    assert_pattern(&server, &qemu_io);
}

/// One process never opens a member twice: the same path twice in one volume, or two exports
/// of one volume.
#[test]
fn one_process_opens_a_member_once() {
    let mut server = Server::start();
    server.stop_cleanly(libc::SIGTERM);
    let members = server.members.clone();
    let mut twice = members.clone();
    twice[4] = members[0].clone();
    assert_refused(&run_on(&["info"], &twice), &["already open in this process"], "one path twice");
    // A symbolic link to member 0 is member 0.
    let link = server.directory.join("link-to-m0");
    std::os::unix::fs::symlink(&members[0], &link).unwrap();
    twice[4] = link;
    assert_refused(&run_on(&["info"], &twice), &["already open in this process as"], "a link to a member");

    let list = members.iter().map(|path| path_text(path)).collect::<Vec<_>>().join(",");
    let socket = server.directory.join("twice.sock");
    let output = run(&[
        "serve",
        "--socket",
        path_text(&socket),
        "--export",
        &format!("a={list}"),
        "--export",
        &format!("b={list}"),
    ]);
    assert_refused(&output, &["export 'b'", "already open in this process"], "two exports of one volume");
    assert!(!socket.exists(), "the refused server left its socket behind");
    let output =
        run(&["serve", "--socket", path_text(&socket), "--export", &format!("a={list}"), "--export", "a=x,y,z"]);
    assert_refused(&output, &["export name 'a' is given twice"], "one export name twice");
    assert_check_clean(&members);
}

/// 2. `create` over an existing volume, or over a file holding data, is refused unless `--force`.
#[test]
fn create_refuses_a_volume_or_data_unless_forced() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let mut server = Server::start();
    write_pattern(&server, &qemu_io);
    server.stop_cleanly(libc::SIGTERM);
    let members = server.members.clone();
    let info_before = run_on(&["info", "--json"], &members);
    let create = run_on(&["create", "--raid", "5", "--chunk", "64KiB"], &members);
    assert_refused(
        &create,
        &["member 0", "holds member 0 of stripelog volume", "raid5 on 5 members", "pass --force to overwrite it"],
        "create over a volume",
    );
    let info_after = run_on(&["info", "--json"], &members);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&info_after.stdout).unwrap()["volume_uuid"],
        serde_json::from_slice::<serde_json::Value>(&info_before.stdout).unwrap()["volume_uuid"],
        "the volume is still the same one"
    );
    server.spawn();
    assert_pattern(&server, &qemu_io);
    server.stop_cleanly(libc::SIGTERM);

    // A file that is no member but holds data (a disk image, a database file).
    let image = server.directory.join("image");
    let mut bytes = vec![0u8; 4 << 20];
    bytes[100_000] = 7;
    std::fs::write(&image, &bytes).unwrap();
    let others: Vec<PathBuf> = (0..2).map(|index| server.directory.join(format!("fresh{index}"))).collect();
    let mut new_members = others.clone();
    new_members.push(image.clone());
    let create = run_on(&["create", "--raid", "5", "--chunk", "64KiB", "--member-size", "8MiB"], &new_members);
    assert_refused(&create, &["member 2", "holds data (a non-zero byte at offset 100000)"], "create over data");
    assert!(std::fs::read(&image).unwrap() == bytes, "the file was written (or grown)");
    let forced =
        run_on(&["create", "--force", "--raid", "5", "--chunk", "64KiB", "--member-size", "8MiB"], &new_members);
    assert!(forced.status.success(), "--force: {}", text(&forced));
}

/// 3. `replace --with` a live member of the same volume, a member of another volume, or a file
///    holding data, is refused before anything is written — offline and online.
#[test]
fn replace_refuses_live_members_other_volumes_and_data() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let mut server = Server::start();
    write_pattern(&server, &qemu_io);
    let members = server.members.clone();
    let control = format!("{}.control", server.socket.display());

    let other: Vec<PathBuf> = (0..3).map(|index| server.directory.join(format!("other{index}"))).collect();
    let create = run_on(&["create", "--raid", "5", "--chunk", "64KiB", "--member-size", "96MiB"], &other);
    assert!(create.status.success(), "{}", text(&create));
    let data_file = server.directory.join("data-file");
    let mut bytes = vec![0u8; 96 << 20];
    bytes[(96 << 20) - 10] = 1;
    std::fs::write(&data_file, &bytes).unwrap();

    // Online, through the server's control socket.
    let live = run(&["replace", "--control", &control, "--member", "3", "--with", path_text(&members[0])]);
    assert_refused(&live, &["already open in this process"], "online: replace with a live member");
    let foreign = run(&["replace", "--control", &control, "--member", "3", "--with", path_text(&other[0])]);
    assert_refused(
        &foreign,
        &["holds member 0 of stripelog volume", "pass --force"],
        "online: another volume's member",
    );
    let data = run(&["replace", "--control", &control, "--member", "3", "--with", path_text(&data_file)]);
    assert_refused(&data, &["holds data (a non-zero byte at offset"], "online: a file holding data");
    assert_pattern(&server, &qemu_io);
    server.stop_cleanly(libc::SIGTERM);
    assert!(!text(&run_on(&["info"], &members)).contains("DEGRADED"), "a refused replacement failed a member");

    // Offline: refused before the volume is opened read-write (its epoch does not move).
    let epoch = |members: &[PathBuf]| -> u64 {
        let info = run_on(&["info", "--json"], members);
        serde_json::from_slice::<serde_json::Value>(&info.stdout).unwrap()["epoch"].as_u64().unwrap()
    };
    let epoch_before = epoch(&members);
    let live = run_on(&["replace", "--member", "3", "--with", path_text(&members[0])], &members);
    assert_refused(&live, &["already open in this process"], "offline: replace with a live member");
    let live_forced = run_on(&["replace", "--force", "--member", "3", "--with", path_text(&members[0])], &members);
    assert_refused(&live_forced, &["already open in this process"], "offline: --force with a live member");
    let foreign = run_on(&["replace", "--member", "3", "--with", path_text(&other[1])], &members);
    assert_refused(&foreign, &["holds member 1 of stripelog volume"], "offline: another volume's member");
    let data = run_on(&["replace", "--member", "3", "--with", path_text(&data_file)], &members);
    assert_refused(&data, &["holds data"], "offline: a file holding data");
    assert!(std::fs::read(&data_file).unwrap() == bytes, "the data file was written");
    assert_eq!(epoch(&members), epoch_before, "a refused offline replace opened the volume read-write");
    let other_info = run_on(&["info"], &other);
    assert!(other_info.status.success() && text(&other_info).contains("ONLINE"), "{}", text(&other_info));
    assert_check_clean(&members);
    server.spawn();
    assert_pattern(&server, &qemu_io);
}

/// 4. `serve --socket PATH` never removes anything but a socket nobody listens on.
#[test]
fn serve_removes_only_a_stale_socket() {
    let mut server = Server::start();
    let members = server.members.clone();
    let notes = server.directory.join("notes.txt");
    std::fs::write(&notes, "meeting at ten\n").unwrap();
    let output = run_on(&["serve", "--socket", path_text(&notes)], &members);
    assert_refused(&output, &["exists and is a regular file, not a socket: it is not removed"], "a regular file");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "meeting at ten\n");
    let directory = server.directory.join("a-directory");
    std::fs::create_dir(&directory).unwrap();
    let output = run_on(&["serve", "--socket", path_text(&directory)], &members);
    assert_refused(&output, &["exists and is a directory, not a socket"], "a directory");
    // The running server's socket is live: in use (before the members are even looked at).
    let output = run_on(&["serve", "--socket", path_text(&server.socket)], &members);
    assert_refused(&output, &["is in use by a running server"], "a live socket");
    server.stop_cleanly(libc::SIGTERM);
    // A socket left by a server that died is replaced.
    let stale = server.directory.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    server.socket = stale;
    server.spawn();
    server.stop_cleanly(libc::SIGTERM);
}

/// 5. A mistyped member path is an error, and the real member stays in the volume; `missing`
///    serves degraded, and says so loudly.
#[test]
fn a_mistyped_member_is_an_error_and_missing_is_degraded_on_purpose() {
    let mut server = Server::start();
    server.stop_cleanly(libc::SIGTERM);
    let members = server.members.clone();
    let mut mistyped = members.clone();
    mistyped[4] = server.directory.join("m4-typo");
    let socket = server.directory.join("typo.sock");
    let output = run_on(&["serve", "--socket", path_text(&socket)], &mistyped);
    assert_refused(&output, &["m4-typo: no such file or device; write `missing` in its place", "--degraded"], "serve");
    for command in ["info", "check", "scrub"] {
        assert_refused(&run_on(&[command], &mistyped), &["m4-typo: no such file or device"], command);
    }
    let info = run_on(&["info", "--json"], &members);
    let stats: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(stats["degraded"], false, "the refused opens excluded the real member: {stats}");

    // `missing` on purpose: the server runs degraded and prints a banner.
    let mut degraded = members.clone();
    degraded[4] = PathBuf::from("missing");
    let child = stripelog()
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .args(&degraded)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Serving (the banner is printed before it accepts connections).
    let deadline = std::time::Instant::now() + SERVER_TIMEOUT;
    while greeting(&socket).is_err() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let output = child.wait_with_output().unwrap();
    let log = text(&output);
    assert!(log.contains("WARNING: export 'stripelog' runs DEGRADED"), "{log}");
    assert!(
        log.contains("WARNING:   member 4 (missing)") && log.contains("survives 0 more member failure(s)"),
        "{log}"
    );
}

/// 6. A replaced member is retired: offered again in its old place it is refused by name.
#[test]
fn a_replaced_member_offered_again_is_refused_by_name() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let mut server = Server::start();
    write_pattern(&server, &qemu_io);
    server.stop_cleanly(libc::SIGTERM);
    let members = server.members.clone();
    let new = server.directory.join("m2-new");
    let replace = run_on(&["replace", "--member", "2", "--with", path_text(&new)], &members);
    assert!(replace.status.success(), "{}", text(&replace));
    let old = run_on(&["info"], &members);
    assert_refused(&old, &["member 2", "member 2 was replaced on", "this is the old device"], "the old member");
    let mut current = members.clone();
    current[2] = new;
    let info = run_on(&["info"], &current);
    assert!(text(&info).contains("ONLINE") && text(&info).contains("retired: member 2 replaced on"), "{}", text(&info));
    assert_check_clean(&current);
    server.members = current;
    server.spawn();
    assert_pattern(&server, &qemu_io);
}

/// 7. A write benchmark never writes to an NBD export or a volume that holds data, unless
///    `--force`: stripelog's own export, an `engine:` volume, and nbdkit peers (with and
///    without `base:allocation`).
#[test]
fn benchmarks_never_write_over_data_unasked() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let mut server = Server::start();
    let uri = server.uri();
    let quick = ["--duration", "1s", "--quiet"];
    let empty = run(&[&["bench", "mix", uri.as_str()][..], &quick].concat());
    assert!(empty.status.success(), "an export holding nothing: {}", text(&empty));
    write_pattern(&server, &qemu_io);
    let refused = run(&[&["bench", "mix", uri.as_str()][..], &quick].concat());
    assert_refused(&refused, &["the export holds data (allocated at byte", "base:allocation", "--force"], "NBD");
    let read_only = run(&[&["bench", "mix", uri.as_str(), "--read-percent", "100"][..], &quick].concat());
    assert!(read_only.status.success(), "reads only: {}", text(&read_only));
    assert_pattern(&server, &qemu_io);
    server.stop_cleanly(libc::SIGTERM);
    let engine = format!("engine:{}", server.members.iter().map(|path| path_text(path)).collect::<Vec<_>>().join(","));
    let refused = run(&[&["bench", "mix", engine.as_str()][..], &quick].concat());
    assert_refused(&refused, &["the volume holds data (", "blocks mapped", "--force"], "engine:");
    assert_check_clean(&server.members);
    server.spawn();
    assert_pattern(&server, &qemu_io);

    let Some(nbdkit) = tool("nbdkit") else { return };
    // nbdkit memory: empty; written to; with the noextents filter (it reports everything as
    // data); without structured replies (no base:allocation at all: nothing can be told).
    for (option, data, expected) in [
        (None, false, None),
        (None, true, Some("the export holds data")),
        (Some("--filter=noextents"), false, Some("the export holds data (allocated at byte 0")),
        (Some("--no-sr"), false, Some("cannot tell whether the export holds data")),
    ] {
        let socket = server.directory.join("nbdkit.sock");
        let mut command = Command::new(&nbdkit);
        command.args(["--foreground", "--exit-with-parent", "--unix"]).arg(&socket);
        if let Some(option) = option {
            command.arg(option);
        }
        let mut peer = command.args(["memory", "64M"]).stdin(Stdio::null()).spawn().expect("start nbdkit");
        let deadline = std::time::Instant::now() + SERVER_TIMEOUT;
        while !socket.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let peer_uri = format!("nbd+unix:///?socket={}", socket.display());
        if data {
            let written = run_with_timeout(
                Command::new(&qemu_io).args(["-f", "raw", &peer_uri, "-c", "write -P 0x11 1M 4k"]),
                CLIENT_TIMEOUT,
            );
            assert!(written.status.success(), "{}", text(&written));
        }
        let output = run(&[&["bench", "mix", peer_uri.as_str()][..], &quick].concat());
        match expected {
            None => assert!(output.status.success(), "nbdkit memory, empty: {}", text(&output)),
            Some(needle) => assert_refused(&output, &[needle, "--force"], "nbdkit"),
        }
        let _ = peer.kill();
        let _ = peer.wait();
        let _ = std::fs::remove_file(&socket);
    }
}

/// 8. RAID-10 survives one more loss while every mirror pair is whole — not one per pair.
#[test]
fn raid10_says_how_many_more_losses_it_survives() {
    let server = Server::start();
    let members: Vec<PathBuf> = (0..4).map(|index| server.directory.join(format!("mirror{index}"))).collect();
    let create = run_on(&["create", "--raid", "10", "--chunk", "64KiB", "--member-size", "16MiB"], &members);
    assert!(create.status.success(), "{}", text(&create));
    let info = run_on(&["info"], &members);
    assert!(text(&info).contains("ONLINE: survives 1 more member failure(s)"), "{}", text(&info));
    let mut one_lost = members.clone();
    one_lost[3] = PathBuf::from("missing");
    let info = run_on(&["info"], &one_lost);
    assert!(text(&info).contains("DEGRADED: survives 0 more member failure(s)"), "{}", text(&info));
}

/// Who holds the volume: `info` says closed cleanly, or open by which process.
#[test]
fn info_shows_who_opened_the_volume_last() {
    let mut server = Server::start();
    let pid = server_pid(&server);
    let info = run_on(&["info"], &server.members);
    assert_refused(&info, &["in use by another process"], "info while served");
    server.stop(libc::SIGKILL).unwrap();
    let info = run_on(&["info"], &server.members);
    assert!(
        text(&info).contains(&format!("holder         OPEN: stripelog serve, pid {pid} on host")),
        "after a crash: {}",
        text(&info)
    );
    server.spawn();
    server.stop_cleanly(libc::SIGTERM);
    let info = run_on(&["info"], &server.members);
    assert!(text(&info).contains("holder         closed cleanly at"), "after a clean stop: {}", text(&info));
}
