//! `stripelog serve` driven by real NBD clients: nbdinfo, nbdcopy and nbdsh (libnbd), qemu-io and
//! qemu-img (QEMU's NBD client) and fio's nbd engine. Every test creates its own RAID-5 volume on five
//! 64 MiB member files, serves it on a Unix socket in a temporary directory and stops the server with
//! SIGTERM. A test whose client is not installed prints "SKIPPED: X is not installed" and passes —
//! except under CI (`CI=true`), where it fails: `make test` runs `scripts/install-deps.sh`, which
//! installs them all.
//!
//! Out of scope for now: clients that need FUSE or a kernel block device (nbdfuse with mkfs.ext4 and
//! e2fsck on the mounted export, nbd-client with /dev/nbdX, loop devices).
mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The type (bit 0: hole, bit 1: reads as zero) of the `nbdinfo --map --json` extent holding `offset`.
fn extent_type_at(extents: &[serde_json::Value], offset: u64) -> u64 {
    extents
        .iter()
        .find(|extent| {
            let start = extent["offset"].as_u64().expect("extent offset");
            start <= offset && offset < start + extent["length"].as_u64().expect("extent length")
        })
        .unwrap_or_else(|| panic!("no extent holds offset {offset}: {extents:?}"))["type"]
        .as_u64()
        .expect("extent type")
}

#[test]
fn nbdinfo_reports_size_flags_and_block_sizes() {
    let Some(nbdinfo) = tool("nbdinfo") else { return };
    let server = Server::start();
    let output = server.client(Command::new(nbdinfo).arg("--json").arg(server.uri()));
    let report = json(&output);
    assert_eq!(report["protocol"], "newstyle-fixed", "{report}");
    assert_eq!(report["structured"], true, "structured replies are needed for block status: {report}");
    let exports = report["exports"].as_array().expect("exports");
    assert_eq!(exports.len(), 1, "{report}");
    let export = &exports[0];
    assert_eq!(export["export-name"], EXPORT_NAME, "{export}");
    assert_eq!(export["export-size"], server.logical_size, "{export}");
    assert_eq!(export["is_read_only"], false, "{export}");
    for flag in ["can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero", "can_cache", "can_multi_conn"] {
        assert_eq!(export[flag], true, "{flag}: {export}");
    }
    let contexts = export["contexts"].as_array().expect("contexts");
    assert!(contexts.iter().any(|context| context == "base:allocation"), "{export}");
    assert_eq!(export["block_size_minimum"], 512, "{export}");
    assert_eq!(export["block_size_preferred"], 4096, "{export}");
    let maximum = export["block_size_maximum"].as_u64().unwrap_or_else(|| panic!("no block_size_maximum: {export}"));
    assert!(maximum >= 4096 && maximum.is_multiple_of(4096), "block_size_maximum {maximum}");
}

#[test]
fn nbdinfo_map_shows_written_data_and_trimmed_holes() {
    let (Some(nbdinfo), Some(qemu_io)) = (tool("nbdinfo"), tool("qemu-io")) else { return };
    let server = Server::start();
    let size = server.logical_size;
    server.qemu_io(
        &qemu_io,
        &[
            "write -P 0xab 0 1M",
            "discard 256k 256k",
            "write -z 4M 256k",
            "write -P 0xcd 8M 64k",
            "flush",
            "read -P 0xab 0 256k",
            "read -P 0 256k 256k",
            "read -P 0xab 512k 512k",
            "read -P 0 4M 256k",
            "read -P 0xcd 8M 64k",
        ],
    );
    let output = server.client(Command::new(nbdinfo).args(["--map", "--json"]).arg(server.uri()));
    let map = json(&output);
    let extents = map.as_array().expect("a JSON array of extents");
    // The extents tile the whole export, in order.
    let mut next = 0;
    for extent in extents {
        assert_eq!(extent["offset"], next, "extents are not contiguous: {map}");
        next += extent["length"].as_u64().expect("extent length");
    }
    assert_eq!(next, size, "extents do not cover the export: {map}");

    let allocated = 0;
    let hole_and_zero = 3;
    assert_eq!(extent_type_at(extents, 0), allocated, "written: {map}");
    assert_eq!(extent_type_at(extents, 256 * KIBIBYTE), hole_and_zero, "trimmed: {map}");
    assert_eq!(extent_type_at(extents, 512 * KIBIBYTE), allocated, "written: {map}");
    assert_eq!(extent_type_at(extents, 2 * MEBIBYTE), hole_and_zero, "never written: {map}");
    assert_eq!(extent_type_at(extents, 4 * MEBIBYTE) & 2, 2, "zeroed reads as zero: {map}");
    assert_eq!(extent_type_at(extents, 8 * MEBIBYTE), allocated, "written: {map}");
    assert_eq!(extent_type_at(extents, size - 4096), hole_and_zero, "never written: {map}");
}

#[test]
fn qemu_io_writes_and_reads_back_patterns() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let server = Server::start();
    let size = server.logical_size;
    let middle = size / 2 / (64 * KIBIBYTE) * (64 * KIBIBYTE);
    let last_sector = size - 512;
    server.qemu_io(
        &qemu_io,
        &[
            "write -P 0xab 0 4k".to_string(),
            format!("write -P 0xcd {middle} 64k"),
            format!("write -P 0xef {last_sector} 512"),
            "flush".to_string(),
            "read -P 0xab 0 4k".to_string(),
            format!("read -P 0xcd {middle} 64k"),
            format!("read -P 0xef {last_sector} 512"),
            // Never written: reads as zeros.
            "read -P 0 4k 4k".to_string(),
            format!("read -P 0 {} 512", last_sector - 512),
        ],
    );
    // A FUA write, and an unaligned 512-byte write inside a 4 KiB block, by a second connection.
    server.qemu_io(
        &qemu_io,
        &[
            "write -f -P 0x12 8k 4k",
            "write -P 0x34 13824 512",
            "read -P 0x12 8k 4k",
            "read -P 0 12k 1536",
            "read -P 0x34 13824 512",
            "read -P 0 14336 2k",
            "read -P 0xab 0 4k",
        ],
    );
}

#[test]
fn qemu_img_converts_a_file_into_the_export() {
    let Some(qemu_img) = tool("qemu-img") else { return };
    let server = Server::start();
    let length = 256 * MEBIBYTE;
    let source = server.directory.join("source.raw");
    let data = random_bytes(length as usize, 1);
    std::fs::write(&source, &data).expect("write the source file");

    server.client(
        Command::new(&qemu_img).args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&source).arg(server.uri()),
    );
    // The export is larger than the file: a non-strict compare also checks the rest reads as zeros.
    let compare = server
        .client(Command::new(&qemu_img).args(["compare", "-f", "raw", "-F", "raw"]).arg(&source).arg(server.uri()));
    assert!(text(&compare).contains("Images are identical"), "{}", text(&compare));

    let copy = server.directory.join("copy.raw");
    server.client(
        Command::new(&qemu_img)
            .args(["dd", "-f", "raw", "-O", "raw", "bs=1M", &format!("count={}", length / MEBIBYTE)])
            .arg(format!("if={}", server.uri()))
            .arg(format!("of={}", copy.display())),
    );
    assert_same_bytes(&std::fs::read(&copy).expect("read the copy"), &data, "qemu-img dd of the export");
}

#[test]
fn nbdcopy_copies_into_and_out_of_the_export() {
    let Some(nbdcopy) = tool("nbdcopy") else { return };
    let server = Server::start();
    let length = 256 * MEBIBYTE;
    let source = server.directory.join("source.raw");
    let data = random_bytes(length as usize, 2);
    std::fs::write(&source, &data).expect("write the source file");

    // Several connections at once when the server advertises multi-conn; --flush ends with a flush.
    server.client(Command::new(&nbdcopy).args(["--flush", "--connections=4"]).arg(&source).arg(server.uri()));
    let copy = server.directory.join("copy.raw");
    server.client(Command::new(&nbdcopy).arg(server.uri()).arg(&copy));
    let copied = std::fs::read(&copy).expect("read the copy");
    assert_eq!(copied.len() as u64, server.logical_size, "nbdcopy copies the whole export");
    assert_same_bytes(&copied[..length as usize], &data, "nbdcopy round trip");
    if let Some(offset) = copied[length as usize..].iter().position(|&byte| byte != 0) {
        panic!(
            "never-written byte {} is {:#04x}, not zero",
            length as usize + offset,
            copied[length as usize + offset]
        );
    }
}

#[test]
fn nbdsh_script_writes_flushes_and_reads_back() {
    let Some(mut nbdsh) = nbd_shell() else { return };
    let server = Server::start();
    let size = server.logical_size;
    let script = format!(
        r#"
assert h.get_size() == {size}, h.get_size()
assert h.can_multi_conn() and h.can_flush() and h.can_fua()
assert h.can_trim() and h.can_zero() and h.can_fast_zero() and h.can_cache()
assert not h.is_read_only()
data = bytes(range(256)) * 1024
h.pwrite(data, 1048576)
h.pwrite(b"\x5a" * 4096, 2097152, nbd.CMD_FLAG_FUA)
h.pwrite(b"\x77" * 512, {size} - 512)
h.flush()
assert h.pread(len(data), 1048576) == data
assert h.pread(4096, 2097152) == b"\x5a" * 4096
assert h.pread(512, {size} - 512) == b"\x77" * 512
h.cache(len(data), 1048576)
h.zero(65536, 1048576)
assert h.pread(65536, 1048576) == bytes(65536)
assert h.pread(len(data) - 65536, 1048576 + 65536) == data[65536:]
h.trim(65536, 1048576 + 131072)
assert h.pread(65536, 1048576 + 131072) == bytes(65536)
# Requests past the end reach the server (no client-side checks) and get the errors the NBD
# protocol names (section "Error values"): NBD_EINVAL for reads and trims, NBD_ENOSPC for writes
# and write zeroes. The connection stays usable.
h.set_strict_mode(0)
past_the_end = [
    ("read", "EINVAL", lambda: h.pread(4096, {size} - 2048)),
    ("trim", "EINVAL", lambda: h.trim(4096, {size} - 2048)),
    ("write", "ENOSPC", lambda: h.pwrite(b"\x01" * 4096, {size} - 2048)),
    ("write zeroes", "ENOSPC", lambda: h.zero(4096, {size} - 2048)),
]
for name, expected, request in past_the_end:
    try:
        request()
        raise AssertionError(name + " past the end succeeded")
    except nbd.Error as error:
        assert error.errno == expected, name + " past the end: " + str(error) + ", expected " + expected
assert h.pread(4096, 2097152) == b"\x5a" * 4096
h.shutdown()
print("nbdsh script done")
"#
    );
    let output = server.client(nbdsh.arg("-u").arg(server.uri()).arg("-c").arg(script));
    assert!(text(&output).contains("nbdsh script done"), "{}", text(&output));
}

/// A bug stops the volume, never spreads (the fault hook panics inside the engine's write
/// path with its write lock held, in the middle of a request): the client gets EIO for it,
/// serve logs the panic with its backtrace, stops and exits with 70 (EX_SOFTWARE), writing
/// nothing more; the next serve recovers what was flushed and an ordered prefix of the
/// struck request, as after a crash.
#[test]
fn a_panic_in_the_engine_stops_serve_with_an_error_and_the_next_open_recovers() {
    let Some(mut nbdsh) = nbd_shell() else { return };
    let mut server = Server::start();
    server.stop_cleanly(libc::SIGTERM);
    // 16 blocks flushed, then the 11th block of a 32-block write panics.
    server.serve_arguments = vec!["--fault-panic-after-blocks".into(), "27".into()];
    server.spawn();
    let script = r#"
h.pwrite(b"\x11" * 65536, 0)
h.flush()
try:
    h.pwrite(b"\x22" * 131072, 65536)
    raise AssertionError("the struck write succeeded")
except nbd.Error as error:
    assert error.errno == "EIO", str(error)
print("the struck write got EIO")
"#;
    let output = server.client(nbdsh.arg("-u").arg(server.uri()).arg("-c").arg(script));
    assert!(text(&output).contains("got EIO"), "{}", text(&output));
    let status = {
        let process = server.process.as_mut().expect("the server runs");
        wait_with_timeout(process, SERVER_TIMEOUT).expect("serve stops by itself after the panic")
    };
    server.process = None;
    assert_eq!(status.code(), Some(70), "serve's exit status after a panic:\n{}", server.log());
    let log = server.log();
    for expected in ["panic: thread", "fault hook", "backtrace", "a bug stopped the volume", "stopped by a bug"] {
        assert!(log.contains(expected), "the log does not say {expected:?}:\n{log}");
    }
    // Left as after a crash: the next open recovers, and check is clean.
    server.serve_arguments.clear();
    server.spawn();
    let Some(mut nbdsh) = nbd_shell() else { return };
    let script = r#"
assert h.pread(65536, 0) == b"\x11" * 65536
states = ""
for block in range(32):
    data = h.pread(4096, 65536 + block * 4096)
    states += "x" if data == b"\x22" * 4096 else "z" if data == bytes(4096) else "?"
assert "?" not in states and "zx" not in states, states
print("ordered prefix:", states)
"#;
    let output = server.client(nbdsh.arg("-u").arg(server.uri()).arg("-c").arg(script));
    assert!(text(&output).contains("ordered prefix"), "{}", text(&output));
    server.stop_cleanly(libc::SIGTERM);
    let check = run_with_timeout(stripelog().arg("check").args(&server.members), CLIENT_TIMEOUT);
    assert!(check.status.success(), "stripelog check after the recovery: {}", text(&check));
}

#[test]
fn data_survives_server_restarts() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let mut server = Server::start();
    let middle = server.logical_size / 2 / MEBIBYTE * MEBIBYTE;
    server.qemu_io(&qemu_io, &["write -P 0x5e 0 1M".to_string(), format!("write -P 0x6f {middle} 256k")]);
    server.stop_cleanly(libc::SIGTERM);
    // The volume is consistent on the members once the server has exited.
    let check = run_with_timeout(stripelog().arg("check").args(&server.members), CLIENT_TIMEOUT);
    assert!(check.status.success(), "stripelog check after SIGTERM: {}", text(&check));

    server.spawn();
    server.qemu_io(
        &qemu_io,
        &[
            "read -P 0x5e 0 1M".to_string(),
            format!("read -P 0x6f {middle} 256k"),
            "read -P 0 1M 1M".to_string(),
            "write -P 0x7a 2M 64k".to_string(),
        ],
    );
    server.stop_cleanly(libc::SIGINT);

    server.spawn();
    server.qemu_io(
        &qemu_io,
        &["read -P 0x5e 0 1M".to_string(), format!("read -P 0x6f {middle} 256k"), "read -P 0x7a 2M 64k".to_string()],
    );
    for start in 1..=server.starts {
        let log = std::fs::read_to_string(server.log_path(start)).expect("read a server log");
        assert!(log.contains("ready"), "run {start} of the server did not say \"ready\":\n{}", server.log());
    }
}

#[test]
fn two_connections_write_interleaved_chunks_concurrently() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let server = Server::start();
    let chunk = 64 * KIBIBYTE;
    let chunk_count = 64;
    let pattern = |index: u64| if index.is_multiple_of(2) { 0x11 } else { 0x22 };
    // Client A writes the even 64 KiB chunks, client B the odd ones: they share every stripe.
    let writes = |parity: u64| -> Vec<String> {
        (0..chunk_count)
            .filter(|index| index % 2 == parity)
            .map(|index| format!("write -P {:#x} {} {chunk}", pattern(index), index * chunk))
            .chain(["flush".to_string()])
            .collect()
    };
    std::thread::scope(|scope| {
        for parity in [0, 1] {
            let (server, qemu_io, writes) = (&server, &qemu_io, &writes);
            scope.spawn(move || server.qemu_io(qemu_io, &writes(parity)));
        }
    });
    let reads: Vec<String> =
        (0..chunk_count).map(|index| format!("read -P {:#x} {} {chunk}", pattern(index), index * chunk)).collect();
    server.qemu_io(&qemu_io, &reads);
}

#[test]
fn fio_random_writes_verify() {
    let Some(fio) = tool("fio") else { return };
    let server = Server::start();
    let report = server.directory.join("fio.json");
    server.client(
        Command::new(fio)
            .current_dir(&server.directory)
            .args([
                "--name=verify",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bs=4k",
                "--offset=64M",
                "--size=16M",
                "--iodepth=32",
                "--numjobs=2",
                // Each job in its own 16 MiB: one job's blocks are not the other's to verify.
                "--offset_increment=16M",
                "--group_reporting",
                "--verify=crc32c",
                "--verify_fatal=1",
                // No local-verify-*.state file in the working directory.
                "--verify_state_save=0",
                "--output-format=json",
            ])
            .arg(format!("--uri={}", server.uri()))
            .arg(format!("--output={}", report.display())),
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("read fio's report")).expect("fio's report is JSON");
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert_eq!(job["write"]["io_bytes"], 2 * 16 * MEBIBYTE, "{job}");
    // The verify pass reads every block back.
    assert_eq!(job["read"]["io_bytes"], 2 * 16 * MEBIBYTE, "{job}");
}

/// fio's random writes of 75 %-compressible data verify on a volume created with
/// compression; `stripelog set` turns it off through the control socket while served and
/// the next writes verify too; after a clean stop `info` shows the fragments and the
/// setting, and `check` finds the volume clean.
#[test]
fn a_compressed_volume_serves_fio_and_changes_its_setting_while_served() {
    let Some(fio) = tool("fio") else { return };
    let mut server = Server::start_with("5", &["--compression", "lz4"]);
    let write_and_verify = |offset: &str| {
        let output = server.client(
            Command::new(&fio)
                .current_dir(&server.directory)
                .args(["--name=verify", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--size=16M", "--iodepth=16"])
                .args(["--buffer_compress_percentage=75", "--refill_buffers", "--verify=crc32c", "--verify_fatal=1"])
                .args(["--verify_state_save=0", "--output-format=json"])
                .arg(format!("--offset={offset}"))
                .arg(format!("--uri={}", server.uri())),
        );
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let report: serde_json::Value = serde_json::from_str(&text[text.find('{').expect("JSON")..]).expect("JSON");
        let job = &report["jobs"][0];
        assert_eq!(job["error"], 0, "{job}");
        assert_eq!(job["read"]["io_bytes"], 16 * MEBIBYTE, "the verify pass read every block: {job}");
    };
    write_and_verify("0");
    let control = format!("{}.control", server.socket.display());
    let set = run_with_timeout(stripelog().args(["set", "compression=off", "--control", &control]), CLIENT_TIMEOUT);
    assert!(set.status.success(), "stripelog set: {}\n{}", text(&set), server.log());
    write_and_verify("32M");
    server.stop_cleanly(libc::SIGTERM);
    let info = run_with_timeout(stripelog().args(["info", "--json"]).args(&server.members), CLIENT_TIMEOUT);
    assert!(info.status.success(), "stripelog info: {}", text(&info));
    let compression = &json(&info)["compression"];
    assert_eq!(compression["setting"], "off", "{compression}");
    // fio's 75 % data packs about three to a block; the blocks written after the switch
    // are whole.
    let fragments = compression["fragment_blocks"].as_u64().expect("fragment_blocks");
    assert!(fragments > 3000 && fragments <= 4096, "{compression}");
    // The planner's compressed columns take the ratio measured here.
    let measured = compression["ratio"].as_f64().expect("ratio");
    assert!(measured > 1.2, "{compression}");
    let info_file = server.directory.join("info.json");
    std::fs::write(&info_file, &info.stdout).expect("write info.json");
    let plan = run_with_timeout(
        stripelog().args(["plan", "--preset", "crucial-m550", "--json", "--compression-of"]).arg(&info_file),
        CLIENT_TIMEOUT,
    );
    assert!(plan.status.success(), "stripelog plan: {}", text(&plan));
    assert_eq!(json(&plan)["build"]["compression_ratio"].as_f64(), Some(measured));
    let check = run_with_timeout(stripelog().args(["check"]).args(&server.members), CLIENT_TIMEOUT);
    assert!(check.status.success() && text(&check).contains("clean"), "{}", text(&check));
}

/// SIGKILL in the middle of a write load, after a completed flush: everything
/// acknowledged before the flush reads back after a restart, and the volume checks clean.
#[test]
fn sigkill_during_a_write_load_keeps_what_was_flushed() {
    sigkill_during_a_write_load(&[]);
}

/// The same with a write log: `check` before the restart reports the log's entries the
/// members lack as an unclean shutdown's leftovers (exit 1), never as damage.
#[test]
fn sigkill_during_a_write_load_with_a_write_log_keeps_what_was_flushed() {
    sigkill_during_a_write_load(&["--write-log"]);
}

/// `check` right after a crash: what the crash left (torn stripes after the durable point,
/// write log entries not replayed) is reported as such with exit status 0 or 1 (fsck's
/// way: docs/operations.md), never as damage; the restart logs, at warning level, that the
/// volume was not closed cleanly and what recovery did.
fn check_after_a_crash(server: &Server, expect_pending_log_entries: bool) {
    let check = run_with_timeout(stripelog().args(["check", "--json"]).args(&server.members), CLIENT_TIMEOUT);
    let report = json(&check);
    let code = check.status.code();
    assert!(matches!(code, Some(0) | Some(1)), "check after SIGKILL exits 0 or 1, not {code:?}: {report}");
    assert_eq!(report["unclean_shutdown"], true, "{report}");
    assert_eq!(report["blocks_repairable"], 0, "torn stripes are not damage: {report}");
    assert_eq!(report["blocks_unrecoverable"], 0, "{report}");
    assert_eq!(report["rows_with_bad_redundancy"], 0, "{report}");
    let leftovers = ["blocks_torn_by_crash", "rows_torn_by_crash", "write_log_entries_pending"]
        .iter()
        .map(|field| report[field].as_u64().expect("a count"))
        .sum::<u64>();
    assert_eq!(code == Some(1), leftovers > 0, "exit 1 exactly when the crash left something: {report}");
    if expect_pending_log_entries {
        assert!(report["write_log_entries_pending"].as_u64() > Some(0), "{report}");
    }
    let human = run_with_timeout(stripelog().arg("check").args(&server.members), CLIENT_TIMEOUT);
    assert!(!text(&human).contains("DAMAGED"), "{}", text(&human));
    assert!(text(&human).contains("not closed cleanly"), "{}", text(&human));
}

fn sigkill_during_a_write_load(serve_arguments: &[&str]) {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let mut server = Server::start();
    let with_log = !serve_arguments.is_empty();
    if with_log {
        let log = server.directory.join("write-log");
        server.stop_cleanly(libc::SIGTERM);
        let added = run_with_timeout(
            stripelog().args(["log", "add", "--size", "64MiB", "--device"]).arg(&log).args(&server.members),
            CLIENT_TIMEOUT,
        );
        assert!(added.status.success(), "stripelog log add: {}", text(&added));
        server.spawn();
    }
    // qemu-io flushes before it exits: these writes are acknowledged and flushed.
    server.qemu_io(&qemu_io, &["write -P 0x3c 0 2M", "write -P 0x4d 8M 1M"]);
    let load: Vec<String> =
        (0..64).map(|index| format!("write -P 0x99 {} 256k", 16 * MEBIBYTE + index * 262_144)).collect();
    let mut writer = server
        .qemu_io_command(&qemu_io, &load)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qemu-io");
    std::thread::sleep(Duration::from_millis(150));
    let _ = server.stop(libc::SIGKILL);
    let _ = writer.kill();
    let _ = writer.wait();
    check_after_a_crash(&server, with_log);

    server.spawn();
    let log = server.log();
    let restart = log.rsplit("--- stripelog serve, run").next().unwrap_or_default();
    assert!(
        restart.contains("level=warn") && restart.contains("not closed cleanly") && restart.contains("replayed"),
        "the restart says, at warning level, that the volume was not closed cleanly:\n{restart}"
    );
    let status = run_with_timeout(
        stripelog().args(["status", "--json", "--control"]).arg(format!("{}.control", server.socket.display())),
        CLIENT_TIMEOUT,
    );
    assert_eq!(json(&status)["exports"][0]["recovery"]["closed_cleanly"], false, "{}", text(&status));
    server.qemu_io(&qemu_io, &["read -P 0x3c 0 2M", "read -P 0x4d 8M 1M"]);
    server.stop_cleanly(libc::SIGTERM);
    let check = run_with_timeout(stripelog().arg("check").args(&server.members), CLIENT_TIMEOUT);
    assert!(check.status.success(), "stripelog check after SIGKILL and restart: {}", text(&check));
}

/// Mounts and devices made by the filesystem test, undone even when it fails.
struct FilesystemGuard {
    fuse_directory: PathBuf,
    mount_directory: PathBuf,
    loop_device: Option<String>,
    nbdfuse: Option<Child>,
}

impl FilesystemGuard {
    fn attach(server: &Server, nbdfuse: &Path) -> FilesystemGuard {
        let fuse_directory = server.directory.join("fuse");
        let mount_directory = server.directory.join("mnt");
        std::fs::create_dir_all(&fuse_directory).expect("fuse directory");
        std::fs::create_dir_all(&mount_directory).expect("mount directory");
        let child = Command::new(nbdfuse)
            .arg(fuse_directory.join("disk"))
            .arg(server.uri())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nbdfuse");
        let mut guard = FilesystemGuard { fuse_directory, mount_directory, loop_device: None, nbdfuse: Some(child) };
        let disk = guard.fuse_directory.join("disk");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(&disk).map(|metadata| metadata.len()).unwrap_or(0) != server.logical_size {
            assert!(std::time::Instant::now() < deadline, "nbdfuse did not show {}", disk.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        let losetup = run_with_timeout(Command::new("losetup").args(["-f", "--show"]).arg(&disk), CLIENT_TIMEOUT);
        assert!(losetup.status.success(), "losetup: {}", text(&losetup));
        guard.loop_device = Some(String::from_utf8_lossy(&losetup.stdout).trim().to_string());
        guard
    }

    fn device(&self) -> &str {
        self.loop_device.as_deref().expect("attached")
    }

    fn run(&self, command: &mut Command, what: &str) {
        let output = run_with_timeout(command, Duration::from_secs(60));
        assert!(output.status.success(), "{what}: {}", text(&output));
    }

    fn mount(&self) {
        self.run(Command::new("mount").arg(self.device()).arg(&self.mount_directory), "mount");
    }

    fn unmount(&self) {
        self.run(Command::new("umount").arg(&self.mount_directory), "umount");
    }

    fn detach(&mut self) {
        if let Some(device) = self.loop_device.take() {
            let _ = run_with_timeout(Command::new("losetup").args(["-d", &device]), CLIENT_TIMEOUT);
        }
        let _ = run_with_timeout(Command::new("fusermount3").arg("-u").arg(&self.fuse_directory), CLIENT_TIMEOUT);
        if let Some(mut child) = self.nbdfuse.take() {
            if wait_with_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for FilesystemGuard {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount_directory).stderr(Stdio::null()).status();
        self.detach();
    }
}

/// nbdfuse + a loop device + ext4: write files, unmount, fsck clean; restart the
/// server, mount again, every file reads back the same.
#[test]
fn ext4_on_nbdfuse_and_a_loop_device_survives_a_restart() {
    let Some(nbdfuse) = filesystem_tools() else { return };
    let mut server = Server::start();
    let files: Vec<(String, Vec<u8>)> = (0..6)
        .map(|index| (format!("file-{index}"), random_bytes(1_500_000 + index * 333_333, index as u64)))
        .collect();
    {
        let mut filesystem = FilesystemGuard::attach(&server, &nbdfuse);
        filesystem.run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(filesystem.device()), "mkfs.ext4");
        filesystem.mount();
        for (name, content) in &files {
            std::fs::write(filesystem.mount_directory.join(name), content).expect("write a file");
        }
        filesystem.unmount();
        filesystem.run(Command::new("fsck.ext4").arg("-fn").arg(filesystem.device()), "fsck.ext4 -fn");
        filesystem.detach();
    }
    server.stop_cleanly(libc::SIGTERM);
    server.spawn();
    let mut filesystem = FilesystemGuard::attach(&server, &nbdfuse);
    filesystem.mount();
    for (name, content) in &files {
        let back = std::fs::read(filesystem.mount_directory.join(name)).expect("read a file back");
        assert_same_bytes(&back, content, name);
    }
    filesystem.unmount();
    filesystem.detach();
}

/// Whether nbdfuse, loop devices and ext4 tools are here (and we are root); `None` skips.
fn filesystem_tools() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        cannot_run("these tests need root and /dev/fuse for nbdfuse and loop devices");
        return None;
    }
    let nbdfuse = tool("nbdfuse")?;
    for needed in ["losetup", "mkfs.ext4", "fsck.ext4", "mount", "umount", "fusermount3"] {
        tool(needed)?;
    }
    Some(nbdfuse)
}

/// ext4 through nbdfuse while members of the volume disappear (one deleted, one
/// truncated for RAID-6): the files written before and after read back, the members are
/// replaced online through the control socket, and `check` then finds the volume fully
/// redundant. Then random bytes flipped in the member files are all repaired by a scrub.
fn members_lost_under_a_filesystem(raid: &str, lost: &[usize]) {
    let Some(nbdfuse) = filesystem_tools() else { return };
    let mut server = Server::start_raid(raid);
    let control = PathBuf::from(format!("{}.control", server.socket.display()));
    let files: Vec<(String, Vec<u8>)> = (0..8)
        .map(|index| (format!("file-{index}"), random_bytes(1_000_000 + index * 250_000, 40 + index as u64)))
        .collect();
    let mut filesystem = FilesystemGuard::attach(&server, &nbdfuse);
    filesystem.run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(filesystem.device()), "mkfs.ext4");
    filesystem.mount();
    let (before, after) = files.split_at(files.len() / 2);
    for (name, content) in before {
        std::fs::write(filesystem.mount_directory.join(name), content).expect("write a file");
    }
    filesystem.run(&mut Command::new("sync"), "sync");
    for (step, &member) in lost.iter().enumerate() {
        let path = &server.members[member];
        if step % 2 == 0 {
            std::fs::remove_file(path).expect("delete a member file");
        } else {
            std::fs::OpenOptions::new().write(true).open(path).and_then(|file| file.set_len(0)).expect("truncate");
        }
    }
    for (name, content) in after {
        std::fs::write(filesystem.mount_directory.join(name), content).expect("write a file with members lost");
    }
    filesystem.run(&mut Command::new("sync"), "sync");
    for (name, content) in &files {
        let back = std::fs::read(filesystem.mount_directory.join(name)).expect("read a file back");
        assert_same_bytes(&back, content, name);
    }
    // The server checks its members every second and logs what it finds.
    std::thread::sleep(Duration::from_millis(2500));
    let log = server.log();
    assert!(log.contains("DEGRADED"), "the server's log says the volume is degraded:\n{log}");
    let status = run_with_timeout(stripelog().args(["replace", "--control"]).arg(&control), CLIENT_TIMEOUT);
    assert!(!status.status.success(), "replace without --member must fail");
    let mut new_members = server.members.clone();
    for &member in lost {
        let replacement = server.directory.join(format!("new{member}"));
        let replace = run_with_timeout(
            stripelog()
                .args(["replace", "--json", "--control"])
                .arg(&control)
                .args(["--member", &member.to_string(), "--with"])
                .arg(&replacement),
            CLIENT_TIMEOUT,
        );
        assert!(replace.status.success(), "replace {member}: {}\n{}", text(&replace), server.log());
        assert_eq!(json(&replace)["members"][0], member);
        new_members[member] = replacement;
    }
    for (name, content) in &files {
        let back = std::fs::read(filesystem.mount_directory.join(name)).expect("read a file back");
        assert_same_bytes(&back, content, name);
    }
    filesystem.unmount();
    filesystem.run(Command::new("fsck.ext4").arg("-fn").arg(filesystem.device()), "fsck.ext4 -fn");
    filesystem.detach();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !server.log().contains("is ONLINE") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = server.log();
    assert!(log.contains("is ONLINE"), "the server's log says the volume is whole again:\n{log}");
    server.stop_cleanly(libc::SIGTERM);
    let check = run_with_timeout(stripelog().arg("check").args(&new_members), CLIENT_TIMEOUT);
    assert!(check.status.success(), "check after the replacement: {}", text(&check));

    // Bit rot on every member: a scrub finds and repairs every flipped byte.
    let mut prng = 0x5EED_u64;
    let mut flipped = 0;
    for path in &new_members {
        let mut bytes = std::fs::read(path).expect("read a member");
        for _ in 0..3 {
            prng = prng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Inside the first written segments (past the 64 KiB superblock chunk).
            let offset = 65536 + (prng >> 33) as usize % (2 << 20);
            bytes[offset] ^= 0x5a;
            flipped += 1;
        }
        std::fs::write(path, bytes).expect("write a member back");
    }
    let scrub = run_with_timeout(stripelog().args(["scrub", "--json"]).args(&new_members), CLIENT_TIMEOUT);
    assert!(scrub.status.success(), "scrub: {}", text(&scrub));
    let report = json(&scrub);
    assert!(report["blocks_damaged"].as_u64().unwrap_or(0) <= flipped, "{report}");
    let check = run_with_timeout(stripelog().arg("check").args(&new_members), CLIENT_TIMEOUT);
    assert!(check.status.success(), "check after the scrub: {}", text(&check));
    server.members = new_members;
    server.spawn();
    let mut filesystem = FilesystemGuard::attach(&server, &nbdfuse);
    filesystem.mount();
    for (name, content) in &files {
        let back = std::fs::read(filesystem.mount_directory.join(name)).expect("read a file back after the scrub");
        assert_same_bytes(&back, content, name);
    }
    filesystem.unmount();
    filesystem.detach();
}

#[test]
fn raid5_member_deleted_under_ext4_is_replaced_online() {
    members_lost_under_a_filesystem("5", &[1]);
}

#[test]
fn raid6_two_members_deleted_and_truncated_under_ext4_are_replaced_online() {
    members_lost_under_a_filesystem("6", &[0, 3]);
}

/// TCP on the loopback address when asked, several volumes as several exports.
#[test]
fn tcp_on_loopback_serves_several_exports() {
    let Some(nbdinfo) = tool("nbdinfo") else { return };
    let directory = fresh_directory("nbd-tcp");
    let alpha: Vec<PathBuf> = (0..3).map(|index| directory.join(format!("a{index}"))).collect();
    let beta: Vec<PathBuf> = (0..2).map(|index| directory.join(format!("b{index}"))).collect();
    for (raid, members) in [("5", &alpha), ("10", &beta)] {
        let create = run_with_timeout(
            stripelog().args(["create", "--raid", raid, "--chunk", "64KiB", "--member-size", "16MiB"]).args(members),
            CLIENT_TIMEOUT,
        );
        assert!(create.status.success(), "create: {}", text(&create));
    }
    let join = |members: &[PathBuf]| members.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(",");
    // On a port another test took meanwhile the server exits ("Address already in use")
    // and is started again on another; the server is the one listening once it still runs
    // after the port answers.
    let log = directory.join("serve.log");
    let exited = |child: &mut Child| -> Option<String> {
        let status = child.try_wait().expect("wait for the server")?;
        Some(format!("stripelog serve exited ({status}):\n{}", std::fs::read_to_string(&log).unwrap_or_default()))
    };
    let (mut child, port) = retry_on_a_taken_port(|| {
        let port = free_port();
        let file = std::fs::File::create(&log).expect("create the server log");
        let mut child = stripelog()
            .args(["serve", "--listen", &port.to_string()])
            .arg(format!("--export=alpha={}", join(&alpha)))
            .arg(format!("--export=beta={}", join(&beta)))
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start stripelog serve");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(log) = exited(&mut child) {
                return Err(log);
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                std::thread::sleep(Duration::from_millis(250));
                return match exited(&mut child) {
                    Some(log) => Err(log),
                    None => Ok((child, port)),
                };
            }
            assert!(Instant::now() < deadline, "the server did not listen on 127.0.0.1:{port}");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let list =
        run_with_timeout(Command::new(&nbdinfo).arg("--list").arg(format!("nbd://127.0.0.1:{port}")), CLIENT_TIMEOUT);
    let beta_info = run_with_timeout(
        Command::new(&nbdinfo).arg("--json").arg(format!("nbd://127.0.0.1:{port}/beta")),
        CLIENT_TIMEOUT,
    );
    // SAFETY: kill with a valid pid of our own child and a valid signal number.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&directory);
    assert!(list.status.success(), "nbdinfo --list: {}", text(&list));
    assert!(text(&list).contains("export=\"alpha\"") && text(&list).contains("export=\"beta\""), "{}", text(&list));
    assert!(beta_info.status.success(), "nbdinfo beta: {}", text(&beta_info));
    assert_eq!(json(&beta_info)["exports"][0]["export-name"], "beta");
    assert!(status.is_some_and(|status| status.success()), "serve did not exit cleanly on SIGTERM: {status:?}");
}

/// A volume whose spare is far below what `create` warns about fills up before its
/// logical space does: nbdsh writes until the server answers ENOSPC, then trims a fifth of
/// the blocks one by one — each is accepted, as it must be: trims are the only way out of a
/// full volume (docs/garbage-collection.md, "A physically full volume") — writes half of
/// them again, reads everything back, and `check` finds the volume clean after a stop.
#[test]
fn a_physically_full_export_accepts_trims_and_takes_writes_again() {
    let Some(mut nbdsh) = nbd_shell() else { return };
    // Five 8 MiB members, 64 KiB chunks: 128 segments, 6 of them spare.
    // --force: a spare this small is refused without it (the cleaner needs more room once
    // the whole space is written), and that full volume is what this test is about.
    let mut server = Server::start_with_members_of("5", "8MiB", &["--spare", "5%", "--force"]);
    let script = r#"
size = h.get_size()
chunk = 64 * 1024
pattern = lambda offset: (offset // 4096 % 251 + 1).to_bytes(1, "little") * 4096
written = 0
refusal = None
while written + chunk <= size:
    try:
        h.pwrite(b"".join(pattern(written + i) for i in range(0, chunk, 4096)), written)
        written += chunk
    except nbd.Error as error:
        refusal = error.errno
        break
assert refusal == "ENOSPC", "the log never filled: " + str(refusal)
try:
    h.pwrite(b"\x01" * 4096, written)
    raise AssertionError("a write on a full volume succeeded")
except nbd.Error as error:
    assert error.errno == "ENOSPC", error
trimmed = list(range(0, written, 5 * 4096))
for offset in trimmed:
    h.trim(4096, offset)
h.flush()
half = len(trimmed) // 2
for offset in trimmed[:half]:
    h.pwrite(b"\x5a" * 4096, offset)
h.flush()
for index, offset in enumerate(trimmed):
    assert h.pread(4096, offset) == (b"\x5a" * 4096 if index < half else bytes(4096)), offset
for offset in range(0, written, 4096):
    if offset % (5 * 4096) != 0:
        assert h.pread(4096, offset) == pattern(offset), offset
h.shutdown()
print("full volume script done", written, size, len(trimmed))
"#;
    let output = server.client(nbdsh.arg("-u").arg(server.uri()).arg("-c").arg(script));
    assert!(text(&output).contains("full volume script done"), "{}", text(&output));
    server.stop_cleanly(libc::SIGTERM);
    let check = run_with_timeout(stripelog().args(["check"]).args(&server.members), CLIENT_TIMEOUT);
    assert!(check.status.success() && text(&check).contains("clean"), "{}", text(&check));
}

/// A thinly provisioned export (`create --logical-size 1GiB` on members that hold about
/// 300 MiB of data) through qemu-io: it shows its logical size, takes writes up to its
/// provisioned size, refuses the next with ENOSPC ("No space left on device") without
/// harming what it holds, and takes new writes again after a discard; `info` reports the
/// use and `check` finds the volume clean.
#[test]
fn a_thin_export_refuses_writes_beyond_its_provisioned_size_with_enospc() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let mut server = Server::start_with("5", &["--logical-size", "1GiB"]);
    assert_eq!(server.logical_size, 1 << 30);
    server.qemu_io(&qemu_io, &["write -P 0x11 0 200M"]);
    let refused = run_with_timeout(&mut server.qemu_io_command(&qemu_io, &["write -P 0x22 512M 200M"]), CLIENT_TIMEOUT);
    assert!(!refused.status.success(), "a write beyond the provisioned size succeeded: {}", text(&refused));
    assert!(text(&refused).contains("No space left on device"), "{}", text(&refused));
    // The log says so: the thin volume's use crossing its thresholds, and the refusals
    // (counted once a second, so wait for the next count).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !server.log().contains("refused for lack of space (ENOSPC)") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = server.log();
    assert!(log.contains("level=warn") && log.contains("the thinly provisioned volume holds"), "{log}");
    assert!(
        log.contains("export 'stripelog': ") && log.contains("request(s) refused for lack of space (ENOSPC)"),
        "{log}"
    );
    server.qemu_io(&qemu_io, &["read -P 0x11 0 200M"]);
    server.qemu_io(&qemu_io, &["discard 0 128M", "write -P 0x33 768M 100M", "read -P 0x33 768M 100M"]);
    server.qemu_io(&qemu_io, &["read -P 0x11 128M 72M"]);
    server.stop_cleanly(libc::SIGTERM);
    let info = run_with_timeout(stripelog().args(["info", "--json"]).args(&server.members), CLIENT_TIMEOUT);
    assert!(info.status.success(), "stripelog info: {}", text(&info));
    let thin = &json(&info)["thin_provisioning"];
    let held = thin["held_data_bytes"].as_u64().expect("held_data_bytes");
    let provisioned = thin["provisioned_size_bytes"].as_u64().expect("provisioned_size_bytes");
    assert!(provisioned < 400 << 20, "{thin}");
    assert!(held >= 172 << 20 && held <= provisioned, "{thin}");
    let human = run_with_timeout(stripelog().arg("info").args(&server.members), CLIENT_TIMEOUT);
    assert!(text(&human).contains("provisioned"), "{}", text(&human));
    let check = run_with_timeout(stripelog().args(["check"]).args(&server.members), CLIENT_TIMEOUT);
    assert!(check.status.success() && text(&check).contains("clean"), "{}", text(&check));
}

/// nbdcopy writes three copies of 48 MiB of random data and 16 MiB of one repeated block
/// to an export created with `--dedup on`: the copies are stored once (their blocks share
/// copies), everything reads back through nbdcopy as written; `stripelog set dedup=off`
/// through the control socket stops new sharing while served; after a clean stop `info
/// --json` shows what was saved and `check` finds the volume clean, reference counts
/// included.
#[test]
fn a_deduplicated_export_stores_copies_once_and_changes_its_setting_while_served() {
    let Some(nbdcopy) = tool("nbdcopy") else { return };
    let Some(qemu_io) = tool("qemu-io") else { return };
    let mut server = Server::start_with("5", &["--dedup", "on"]);
    // Served with half the default sparse index (one name in 16).
    server.stop_cleanly(libc::SIGTERM);
    server.serve_arguments = vec!["--dedup-sampling-bits".into(), "4".into()];
    server.spawn();
    const PART: usize = 48 << 20;
    let random = random_bytes(PART, 23);
    let repeated: Vec<u8> = random_bytes(4096, 29).repeat(4096);
    let source_bytes = [random.as_slice(), &random, &random, &repeated].concat();
    let source = server.directory.join("source.img");
    std::fs::write(&source, &source_bytes).expect("write the source image");
    server.client(Command::new(&nbdcopy).args(["--flush", "--connections=2"]).arg(&source).arg(server.uri()));
    let control = format!("{}.control", server.socket.display());
    let set = run_with_timeout(stripelog().args(["set", "dedup=off", "--control", &control]), CLIENT_TIMEOUT);
    assert!(set.status.success(), "stripelog set: {}\n{}", text(&set), server.log());
    // Identical blocks written while off are stored whole.
    server.qemu_io(&qemu_io, &["write -P 0x33 200M 8M", "read -P 0x33 200M 8M"]);
    let copy = server.directory.join("copy.img");
    server.client(Command::new(&nbdcopy).arg(server.uri()).arg(&copy));
    let copied = std::fs::read(&copy).expect("read the copy");
    assert_same_bytes(&copied[..source_bytes.len()], &source_bytes, "the export read back");
    std::fs::remove_file(&copy).expect("remove the copy");
    // The served volume's counters, through the control socket.
    let status = {
        use std::io::{BufRead, Write};
        let mut stream = std::os::unix::net::UnixStream::connect(&control).expect("connect to the control socket");
        writeln!(stream, r#"{{"command":"status"}}"#).expect("ask for the status");
        let mut line = String::new();
        std::io::BufReader::new(stream).read_line(&mut line).expect("read the status");
        serde_json::from_str::<serde_json::Value>(&line).expect("a JSON status")
    };
    let served = &status["report"]["deduplication"];
    assert_eq!(served["sampling_bits"], 4, "serve --dedup-sampling-bits: {served}");
    server.stop_cleanly(libc::SIGTERM);
    let info = run_with_timeout(stripelog().args(["info", "--json"]).args(&server.members), CLIENT_TIMEOUT);
    assert!(info.status.success(), "stripelog info: {}", text(&info));
    let dedup = &json(&info)["deduplication"];
    assert_eq!(dedup["setting"], "off", "{dedup}");
    let saved = dedup["blocks_saved"].as_u64().expect("blocks_saved");
    let copies = dedup["shared_copies"].as_u64().expect("shared_copies");
    // Two of the three random copies and all but a few of the repeated blocks (254 per
    // copy); the first copy's blocks before the finder's first hit may stay unshared.
    let random_blocks = (PART / 4096) as u64;
    assert!(saved >= 2 * random_blocks * 95 / 100 + 4000, "{dedup}");
    // (nbdcopy's two connections write the second and third copies at once: a few pairs
    // of their blocks each start a copy of their own, 2.8 % measured.)
    assert!(copies <= random_blocks * 105 / 100 + 20, "{dedup}");
    let human = run_with_timeout(stripelog().arg("info").args(&server.members), CLIENT_TIMEOUT);
    assert!(text(&human).contains("dedup          off;"), "{}", text(&human));
    let check = run_with_timeout(stripelog().args(["check", "--json"]).args(&server.members), CLIENT_TIMEOUT);
    assert!(check.status.success(), "{}", text(&check));
    let report = json(&check);
    assert!(report["shared_records_checked"].as_u64().expect("shared_records_checked") > 0, "{report}");
    assert_eq!(report["shared_records_miscounted"], serde_json::json!([]), "{report}");
}

/// Every sample of a scrape as parsed by the Prometheus project's own Python parser
/// (`prometheus_client.parser`): {"name": [[labels, value], ...]}. It raises on any line
/// it does not take.
const PARSE_METRICS: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
samples = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        samples.setdefault(sample.name, []).append([sample.labels, sample.value])
print(json.dumps(samples))
"#;

/// `serve --metrics` during a write load from qemu-io, scraped several times and parsed by
/// Prometheus's own parser: the request counters only grow, the write histogram counts
/// every write with cumulative buckets ending at its count, the bytes cover the load, and
/// `stripelog status` shows the same counters and the client.
#[test]
fn metrics_are_scraped_during_a_load_and_parsed_by_prometheus_s_own_parser() {
    let Some(qemu_io) = tool("qemu-io") else { return };
    let Some(python) = python_with("prometheus_client.parser", "python3-prometheus-client") else { return };
    let mut server = Server::start();
    server.stop_cleanly(libc::SIGTERM);
    server.serve_arguments.clear();
    let port = server.spawn_on_free_port(|port| vec!["--metrics".into(), format!("127.0.0.1:{port}")]);
    let parse = |body: &str| -> serde_json::Value {
        use std::io::Write;
        let mut child = Command::new(&python)
            .args(["-c", PARSE_METRICS])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start python3");
        child.stdin.take().expect("stdin").write_all(body.as_bytes()).expect("give the scrape to the parser");
        let output = child.wait_with_output().expect("the parser");
        assert!(output.status.success(), "Prometheus's parser refused the scrape: {}\n{body}", text(&output));
        serde_json::from_slice(&output.stdout).expect("the parser's JSON")
    };
    let value = |samples: &serde_json::Value, name: &str, labels: &[(&str, &str)]| -> f64 {
        samples[name]
            .as_array()
            .into_iter()
            .flatten()
            .find(|sample| labels.iter().all(|(key, wanted)| sample[0][*key] == *wanted))
            .and_then(|sample| sample[1].as_f64())
            .unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
    };
    let writes = |samples: &serde_json::Value| {
        value(samples, "stripelog_nbd_requests_total", &[("export", "stripelog"), ("command", "write")])
    };
    // 96 writes of 1 MiB, each flushed, while the metrics are scraped.
    let commands: Vec<String> = (0..96).map(|index| format!("write -P 0x5a {}M 1M", index)).collect();
    let mut load = server.qemu_io_command(&qemu_io, &commands);
    let mut load = load.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start qemu-io");
    let mut seen = Vec::new();
    while seen.len() < 3 || load.try_wait().expect("qemu-io").is_none() {
        let (status, body) = http_get(port, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
        seen.push(writes(&parse(&body)));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(load.wait().expect("qemu-io").success(), "qemu-io failed\n{}", server.log());
    assert!(seen.windows(2).all(|pair| pair[0] <= pair[1]), "the write counter went back: {seen:?}");
    let (_, body) = http_get(port, "/metrics");
    let samples = parse(&body);
    let labels = [("export", "stripelog"), ("command", "write")];
    assert!(writes(&samples) >= 96.0, "{body}");
    assert!(value(&samples, "stripelog_nbd_request_bytes_total", &labels) >= (96 << 20) as f64, "{body}");
    let count = value(&samples, "stripelog_nbd_request_duration_seconds_count", &labels);
    assert_eq!(count, writes(&samples), "the histogram counts every write");
    let buckets: Vec<(f64, f64)> = samples["stripelog_nbd_request_duration_seconds_bucket"]
        .as_array()
        .expect("buckets")
        .iter()
        .filter(|sample| sample[0]["command"] == "write")
        .map(|sample| {
            let bound = sample[0]["le"].as_str().expect("le");
            (
                if bound == "+Inf" { f64::INFINITY } else { bound.parse().expect("a bound") },
                sample[1].as_f64().expect("count"),
            )
        })
        .collect();
    assert!(buckets.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1), "{buckets:?}");
    assert_eq!(buckets.last().expect("+Inf"), &(f64::INFINITY, count));
    assert!(value(&samples, "stripelog_volume_host_bytes_total", &[("operation", "written")]) >= (96 << 20) as f64);
    assert_eq!(value(&samples, "stripelog_member_state", &[("member", "0"), ("state", "active")]), 1.0);
    assert_eq!(value(&samples, "stripelog_volume_degraded", &[("export", "stripelog")]), 0.0);
    for cause in ["buffers", "space"] {
        let labels = [("export", "stripelog"), ("cause", cause)];
        assert!(value(&samples, "stripelog_volume_write_stalls_total", &labels) >= 0.0);
        assert!(value(&samples, "stripelog_volume_write_stall_seconds_total", &labels) >= 0.0);
    }
    let (status, _) = http_get(port, "/nothing");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    // `stripelog status` through the control socket: the same counters, for a person and as JSON.
    let control = format!("{}.control", server.socket.display());
    let human = run_with_timeout(stripelog().args(["status", "--control", &control]), CLIENT_TIMEOUT);
    assert!(human.status.success(), "stripelog status: {}", text(&human));
    let human = text(&human);
    assert!(human.contains("is ONLINE") && human.contains("  write ") && human.contains("MiB"), "{human}");
    let status = run_with_timeout(stripelog().args(["status", "--json", "--control", &control]), CLIENT_TIMEOUT);
    let status = json(&status);
    let export = &status["exports"][0];
    assert_eq!(export["health"], "ONLINE", "{status}");
    assert_eq!(export["counters"]["requests"]["write"]["requests"].as_f64(), Some(writes(&samples)), "{status}");
    // `stripelog top` during a write load: one line per sample with the rates.
    let commands: Vec<String> = (0..192).map(|index| format!("write -P 0x6b {}M 1M", index % 96)).collect();
    let mut load = server.qemu_io_command(&qemu_io, &commands);
    let mut load = load.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start qemu-io");
    let top = run_with_timeout(
        stripelog().args(["top", "--control", &control, "--interval", "100ms", "--count", "3"]),
        CLIENT_TIMEOUT,
    );
    assert!(load.wait().expect("qemu-io").success());
    assert!(top.status.success(), "stripelog top: {}", text(&top));
    let top = String::from_utf8_lossy(&top.stdout).to_string();
    let lines: Vec<&str> = top.lines().filter(|line| line.starts_with("stripelog ")).collect();
    assert!(top.starts_with("export ") && lines.len() == 3, "{top}");
    // (export, health, clients, reads/s, read/s as "N unit", writes/s, ...)
    let writes_per_second = |line: &str| line.split_whitespace().nth(6).and_then(|rate| rate.parse::<f64>().ok());
    assert!(lines.iter().all(|line| line.contains(" ONLINE ") && writes_per_second(line).is_some()), "{top}");
    assert!(lines.iter().any(|line| writes_per_second(line).is_some_and(|rate| rate > 0.0)), "{top}");
    // During an online rebuild (replace, slowed by --rate), `status` and the metrics show
    // it under way, with its progress.
    let replacement = server.directory.join("new2");
    let mut replace = stripelog()
        .args(["replace", "--control", &control, "--member", "2", "--rate", "16MiB", "--with"])
        .arg(&replacement)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start stripelog replace");
    let deadline = Instant::now() + Duration::from_secs(20);
    let (rebuild, maintenance) = loop {
        assert!(Instant::now() < deadline, "no rebuild in progress in `stripelog status`");
        let status = run_with_timeout(stripelog().args(["status", "--json", "--control", &control]), CLIENT_TIMEOUT);
        let rebuild = json(&status)["exports"][0]["in_progress"][0].clone();
        if rebuild["segments_total"].as_u64().unwrap_or(0) > 0 {
            let (_, body) = http_get(port, "/metrics");
            break (rebuild, parse(&body));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(rebuild["kind"], "rebuild", "{rebuild}");
    let labels = [("export", "stripelog"), ("operation", "rebuild")];
    assert!(value(&maintenance, "stripelog_maintenance_segments", &labels) > 0.0);
    assert!(value(&maintenance, "stripelog_volume_rebuilding_members", &[("export", "stripelog")]) >= 1.0);
    let human = run_with_timeout(stripelog().args(["status", "--control", &control]), CLIENT_TIMEOUT);
    assert!(text(&human).contains("DEGRADED") && text(&human).contains("rebuild "), "{}", text(&human));
    assert_eq!(human.status.code(), Some(1), "status exits 1 while an export is not ONLINE");
    assert!(wait_with_timeout(&mut replace, Duration::from_secs(60)).is_some_and(|status| status.success()));
    let status = run_with_timeout(stripelog().args(["status", "--json", "--control", &control]), CLIENT_TIMEOUT);
    assert_eq!(json(&status)["exports"][0]["in_progress"], serde_json::json!([]));
    server.stop_cleanly(libc::SIGTERM);
    // The log: one structured line per event, health changes among them; per-connection
    // lines only at --log-level debug.
    let log = server.log();
    // (The test's log file separates the runs with "--- stripelog serve, run N ---".)
    let lines = log.lines().filter(|line| !line.starts_with("--- "));
    assert!(lines.clone().all(|line| line.starts_with("time=") && line.contains(" level=")), "{log}");
    assert!(log.contains("level=warn") && log.contains("DEGRADED"), "{log}");
    let noise: Vec<&str> = lines.filter(|line| line.contains("connection=")).collect();
    assert!(noise.is_empty(), "per-connection lines at the default level: {noise:#?}");
    server.serve_arguments = vec!["--log-level".into(), "debug".into()];
    server.members[2] = replacement; // the old member 2 is refused now
    server.spawn();
    server.qemu_io(&qemu_io, &["read 0 4k"]);
    server.stop_cleanly(libc::SIGTERM);
    let log = server.log();
    assert!(log.contains("level=debug") && log.contains("connection="), "{log}");
}

/// `serve --write-queue` sets the RAM for sealed batches on their way to the members, in
/// whole stripes (five members of 64 KiB chunks: 320 KiB), at most 64; the status reports
/// the batches.
#[test]
fn the_write_queue_is_the_one_serve_is_given() {
    let mut server = Server::start();
    let batches = |server: &Server| {
        let status = run_with_timeout(
            stripelog().args(["status", "--json", "--control"]).arg(format!("{}.control", server.socket.display())),
            CLIENT_TIMEOUT,
        );
        assert!(status.status.success(), "stripelog status: {}", text(&status));
        json(&status)["exports"][0]["write_queue_batches"].as_u64().expect("write_queue_batches in the status")
    };
    assert_eq!(batches(&server), 64, "64 MiB of 320 KiB stripes, at most 64 batches");
    server.stop_cleanly(libc::SIGTERM);
    server.serve_arguments = vec!["--write-queue".into(), "1MiB".into()];
    server.spawn();
    assert_eq!(batches(&server), 3, "1 MiB holds three 320 KiB stripes");
    server.stop_cleanly(libc::SIGTERM);
}
