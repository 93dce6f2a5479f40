//! The `stripelog` command as a user runs it: create, info (text and JSON), check, and
//! clear errors with a non-zero exit for wrong input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn stripelog(arguments: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stripelog")).args(arguments).output().expect("run stripelog")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A fresh directory under the system temporary directory, removed when dropped.
struct Directory(PathBuf);

impl Directory {
    fn new(label: &str) -> Directory {
        let path = std::env::temp_dir().join(format!("stripelog-cli-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create a directory");
        Directory(path)
    }

    fn members(&self, count: usize) -> Vec<String> {
        (0..count).map(|index| self.0.join(format!("m{index}")).display().to_string()).collect()
    }
}

impl Drop for Directory {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The volume on the member files `members`, opened read-write through the library.
fn open_volume(members: &[String]) -> stripelog_engine::Volume {
    use std::sync::Arc;
    use stripelog_blockdev::{BlockDevice, FileDevice, FileDeviceOptions};
    use stripelog_engine::{MemberDevice, OpenOptions, Volume};
    let devices: Vec<MemberDevice> = members
        .iter()
        .map(|path| MemberDevice {
            name: path.clone(),
            device: Some(Arc::new(FileDevice::open(Path::new(path), &FileDeviceOptions::default()).expect("open"))
                as Arc<dyn BlockDevice>),
        })
        .collect();
    Volume::open(devices, &OpenOptions::default()).expect("open")
}

/// A RAID-5 volume of 64 KiB chunks on `members`, created as files of `member_size`.
fn create_raid5(members: &[String], member_size: &str) {
    let create =
        stripelog(&with_members(&["create", "--raid", "5", "--chunk", "64KiB", "--member-size", member_size], members));
    assert!(create.status.success(), "{}", text(&create));
}

fn with_members<'a>(arguments: &[&'a str], members: &'a [String]) -> Vec<&'a str> {
    arguments.iter().copied().chain(members.iter().map(String::as_str)).collect()
}

#[test]
fn create_info_and_check_a_raid6_volume() {
    let directory = Directory::new("raid6");
    let members = directory.members(6);
    let create = stripelog(&with_members(
        &["create", "--raid", "6", "--chunk", "64KiB", "--spare", "27%", "--member-size", "16MiB"],
        &members,
    ));
    assert!(create.status.success(), "{}", text(&create));
    assert!(text(&create).contains("raid6 on 6 members, 4 data columns"), "{}", text(&create));
    assert!(!text(&create).contains("warning"), "{}", text(&create));
    // Files are created sparse.
    let metadata = std::fs::metadata(Path::new(&members[0])).expect("member exists");
    assert_eq!(metadata.len(), 16 << 20);

    let info = stripelog(&with_members(&["info", "--json"], &members));
    assert!(info.status.success(), "{}", text(&info));
    let stats: serde_json::Value = serde_json::from_slice(&info.stdout).expect("JSON");
    assert_eq!(stats["raid_level"], "raid6");
    assert_eq!(stats["member_count"], 6);
    // A bit-packed entry as narrow as this small volume allows (well under the 8-byte
    // word it replaced), and nothing else per block: the cleaner's lifetime data is in the
    // summaries.
    let entry_bits = stats["index_entry_bits"].as_f64().unwrap();
    assert!((8.0..=32.0).contains(&entry_bits), "{entry_bits}-bit entries");
    let per_block = stats["map_bytes_per_logical_block"].as_f64().unwrap();
    // Page bookkeeping, and the last page's unused entries on this small volume, add a little.
    assert!(per_block > entry_bits / 8.0 && per_block < 0.25 + entry_bits / 8.0, "{per_block}, {entry_bits} bits");
    assert!((stats["spare_fraction"].as_f64().unwrap() - 0.27).abs() < 1e-9);

    let check = stripelog(&with_members(&["check"], &members));
    assert!(check.status.success(), "{}", text(&check));
    assert!(text(&check).contains("clean"));

    // Two members missing: RAID-6 still opens, and says it is degraded — but only on
    // purpose: a path that does not exist is an error unless `--degraded` is given.
    let mut degraded = members.clone();
    degraded[1] = "missing".into();
    degraded[4] = directory.0.join("gone").display().to_string();
    let refused = stripelog(&with_members(&["info"], &degraded));
    assert!(!refused.status.success(), "a mistyped member path opened the volume: {}", text(&refused));
    assert!(text(&refused).contains("gone: no such file or device; write `missing`"), "{}", text(&refused));
    let info = stripelog(&with_members(&["info", "--degraded"], &degraded));
    assert!(info.status.success(), "{}", text(&info));
    assert!(text(&info).contains("DEGRADED: survives 0 more member failure(s)"), "{}", text(&info));
}

#[test]
fn wrong_input_gets_a_clear_error_and_a_failing_exit() {
    let directory = Directory::new("errors");
    let members = directory.members(3);
    create_raid5(&members, "8MiB");
    let mut swapped = members.clone();
    swapped.swap(0, 2);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (with_members(&["info"], &swapped), "original order"),
        (with_members(&["info"], &members[..2]), "3 members but 2 were given"),
        (vec!["create", "--raid", "7", "x"], "unknown RAID level"),
        (vec!["create", "--spare", "100%", "x"], "below 100 %"),
        (vec!["create", "--chunk", "3MiB", "--member-size", "8MiB", "x1", "x2", "x3"], "power of two"),
        (vec!["create", "--chunk", "lots", "x"], "is not a size"),
        // NBD over TCP beyond loopback without TLS; a TCP and a Unix socket at once.
        (with_members(&["serve", "--listen", "0.0.0.0:0"], &members), "is not a loopback address"),
        (with_members(&["serve", "--listen", "0", "--socket", "s.sock"], &members), "cannot be used with"),
        (with_members(&["serve", "--insecure"], &members), "--listen"),
        // TLS: PSK is not offered; a mode needs certificates; an allow-list needs verified
        // certificates and an export of that name; `--tls on` beyond loopback lets plain
        // clients in, so it needs --insecure as no TLS does.
        (with_members(&["serve", "--tls-psk", "keys.psk"], &members), "rustls issue #174"),
        (with_members(&["serve", "--tls", "require"], &members), "needs --tls-certificates"),
        (
            with_members(&["serve", "--tls-certificates", "x-tls", "--allow-clients", "a=b"], &members),
            "--tls-verify-peer",
        ),
        (
            with_members(
                &["serve", "--tls-certificates", "x-tls", "--tls-verify-peer", "--allow-clients", "a=b"],
                &members,
            ),
            "no export is named 'a'",
        ),
        (with_members(&["serve", "--tls-certificates", "x-tls"], &members), "server-cert.pem"),
        (with_members(&["serve", "--tls", "off", "--tls-certificates", "x-tls"], &members), "one or the other"),
        (
            with_members(&["serve", "--listen", "0.0.0.0:0", "--tls", "on", "--tls-certificates", "x-tls"], &members),
            "is not a loopback address",
        ),
    ];
    for (mut arguments, expected) in cases {
        // Paths of members a failing `create` may touch live in the test directory.
        let scratch: Vec<String> =
            arguments.iter().map(|argument| directory.0.join(argument).display().to_string()).collect();
        for (argument, path) in arguments.iter_mut().zip(&scratch) {
            if argument.starts_with('x') {
                *argument = path;
            }
        }
        let output = stripelog(&arguments);
        assert!(!output.status.success(), "{arguments:?} succeeded");
        assert!(text(&output).contains(expected), "{arguments:?}: {}", text(&output));
    }
}

/// Write through the library, damage one member file behind the volume's back, and
/// `check` must say so with a failing exit; `info` still opens (RAID-5 rebuilds).
#[test]
fn check_reports_damage_with_a_failing_exit() {
    use std::os::unix::fs::FileExt;

    let directory = Directory::new("damage");
    let members = directory.members(3);
    create_raid5(&members, "8MiB");
    let volume = open_volume(&members);
    let data: Vec<u8> = (0..256 * 1024).map(|index| (index * 7 % 251) as u8 + 1).collect();
    volume.write(0, &data, true).expect("write");
    volume.close().expect("close");

    // Segment 0 starts after the reserved chunk; damage 16 KiB of member 1 there.
    let file = std::fs::OpenOptions::new().write(true).open(&members[1]).expect("open member");
    file.write_all_at(&[0xA5; 16384], 64 << 10).expect("damage");
    drop(file);

    let check = stripelog(&with_members(&["check", "--json"], &members));
    // Exit status bit 2: damage redundancy repairs (the volume was closed cleanly: no
    // crash left it).
    assert_eq!(check.status.code(), Some(2), "{}", text(&check));
    let report: serde_json::Value = serde_json::from_slice(&check.stdout).expect("JSON");
    let damaged = report["blocks_repairable"].as_u64().unwrap() + report["rows_with_bad_redundancy"].as_u64().unwrap();
    assert!(damaged > 0, "{report}");
    assert_eq!(report["blocks_unrecoverable"], 0, "{report}");
    let human = stripelog(&with_members(&["check"], &members));
    assert!(text(&human).contains("DAMAGED, repairable"), "{}", text(&human));
    let missing =
        stripelog(&with_members(&["check"], &[members[0].clone(), "/nonexistent/m1".into(), members[2].clone()]));
    assert_eq!(missing.status.code(), Some(8), "a check that cannot run: {}", text(&missing));
}

#[test]
fn plan_prints_the_seeds_table_reads_toml_and_refuses_bad_input() {
    let output = stripelog(&["plan", "--preset", "crucial-m550"]);
    assert!(output.status.success(), "{}", text(&output));
    let table = text(&output);
    assert!(table.contains("cost per addressable GB") && table.contains("1,531,800*"), "{table}");

    let output = stripelog(&["plan", "--preset", "samsung-sm843t", "--json"]);
    assert!(output.status.success(), "{}", text(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let raid10 = &plan["columns"][6];
    assert_eq!(raid10["name"], "md RAID-10");
    assert_eq!(raid10["landable_gigabytes"], 9_600.0);

    // Flags over a file: twelve drives, no measurement (it was made on 24).
    let directory = Directory::new("plan");
    let file = directory.0.join("plan.toml");
    std::fs::write(
        &file,
        "[drive]\nname = \"x\"\nsize_gigabytes = 1000\nprice = 100\nerase_cycles = 3000\nspare_fraction = 0.07\n\
         random_write_iops = 50000\nlinear_write_megabytes_per_second = 500\nrandom_read_iops = 90000\n\
         [build]\ndrive_count = 24\nchassis_cost = 4000\ndaily_writes_gigabytes = 5000\ncompression_ratio = 1\n\
         stripelog_spare_fraction = 0.27\nraid_group_count = 3\nservice_years = 5\n",
    )
    .unwrap();
    let path = file.display().to_string();
    let output = stripelog(&["plan", "--config", &path, "--drives", "12", "--json"]);
    assert!(output.status.success(), "{}", text(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(plan["build"]["drive_count"], 12);
    assert_eq!(plan["columns"][7]["random_write_iops_basis"], "Computed");

    // A bare size is gigabytes; a preset's measurement holds only for what it measured.
    let json = |arguments: &[&str]| -> serde_json::Value {
        let output = stripelog(arguments);
        assert!(output.status.success(), "{arguments:?}: {}", text(&output));
        serde_json::from_slice(&output.stdout).expect("JSON")
    };
    let plan = json(&["plan", "--preset", "crucial-m550", "--drive-size", "2048", "--json"]);
    assert_eq!(plan["columns"][0]["gross_gigabytes"], 24.0 * 2048.0);
    assert_eq!(plan["columns"][7]["random_write_iops_basis"], "Computed", "other drives, no measurement");
    let plan = json(&["plan", "--preset", "crucial-m550", "--spare", "5%", "--json"]);
    assert_eq!(plan["columns"][7]["random_write_iops_basis"], "Measured", "the preset's own spare");
    assert_eq!(plan["stripelog_write_amplification"], 1.3);
    let plan = json(&["plan", "--preset", "crucial-m550", "--spare", "20%", "--json"]);
    assert_eq!(plan["columns"][7]["random_write_iops"], serde_json::Value::Null, "no linear speed to compute from");
    assert_eq!(plan["stripelog_write_amplification"], 5.0);

    for (arguments, expected) in [
        (vec!["plan", "--preset", "nope"], "no preset"),
        (vec!["plan", "--preset", "crucial-m550", "--measured-iops", "nan,1,1,1"], "measured stripelog RAID-5"),
        (vec!["plan", "--price", "3"], "--drive-size"),
        (vec!["plan", "--preset", "crucial-m550", "--drives", "7"], "even drive count"),
        (vec!["plan", "--preset", "crucial-m550", "--measured-iops", "1,2"], "4 comma-separated"),
        (vec!["plan", "--config", "/nonexistent/plan.toml"], "plan.toml"),
    ] {
        let output = stripelog(&arguments);
        assert!(!output.status.success(), "{arguments:?} succeeded");
        assert!(text(&output).contains(expected), "{arguments:?}: {}", text(&output));
    }
}

#[test]
fn create_refuses_a_spare_that_leaves_the_cleaner_no_room_unless_forced() {
    let directory = Directory::new("tiny-spare");
    let members = directory.members(4);
    let arguments = ["create", "--raid", "6", "--chunk", "1MiB", "--spare", "10%", "--member-size", "16MiB"];
    let create = stripelog(&with_members(&arguments, &members));
    assert!(!create.status.success(), "{}", text(&create));
    let stderr = String::from_utf8_lossy(&create.stderr);
    // 15 segments: no spare leaves the cleaner its room; smaller chunks would.
    assert!(stderr.contains("a spare of 10 %") && stderr.contains("smaller --chunk"), "{stderr}");
    let forced_arguments = [&["create", "--force"][..], &arguments[1..]].concat();
    let forced = stripelog(&with_members(&forced_arguments, &members));
    assert!(forced.status.success(), "{}", text(&forced));
    let stderr = String::from_utf8_lossy(&forced.stderr);
    assert!(stderr.contains("warning: a spare of 10 %") && stderr.contains("ENOSPC"), "{stderr}");
}

/// A 64 TiB logical volume on sparse file members creates and opens on this machine: its
/// index pages are paged (it used to be refused: a fully resident index would need 70 GiB,
/// and before that it aborted with a backtrace allocating it). A map cache larger than the
/// machine is refused.
#[test]
fn a_64_tib_volume_on_sparse_files_creates_and_opens_with_a_paged_index() {
    let directory = Directory::new("huge");
    let members = directory.members(6);
    for member in &members {
        let file = std::fs::File::create(member).expect("create a member file");
        file.set_len(15 << 40).expect("a 15 TiB sparse file");
    }
    let create = stripelog(&with_members(&["create", "--raid", "5", "--spare", "12%"], &members));
    assert!(create.status.success(), "{}", text(&create));
    let info = stripelog(&with_members(&["info", "--json"], &members));
    assert!(info.status.success(), "{}", text(&info));
    let stats: serde_json::Value = serde_json::from_slice(&info.stdout).expect("JSON");
    assert!(stats["logical_size_bytes"].as_u64().unwrap() > 64 << 40, "{stats}");
    let cache = stats["map_cache_bytes"].as_u64().unwrap();
    let whole_index = stats["map_bytes_per_logical_block"].as_f64().unwrap()
        * (stats["logical_size_bytes"].as_u64().unwrap() / 4096) as f64;
    assert!(cache > 0 && (cache as f64) < whole_index, "the cache is a part of the index: {stats}");
    assert_eq!(stats["recovery"]["segments_scanned"].as_u64(), Some(1), "mounted from the checkpoint: {stats}");
    // Little written: the superblocks, the first checkpoint, zeroed heads.
    for member in &members {
        let metadata = std::fs::metadata(member).expect("metadata");
        let allocated = std::os::unix::fs::MetadataExt::blocks(&metadata) * 512;
        assert!(allocated < 64 << 20, "{member}: {allocated} bytes allocated");
    }
    let serve = stripelog(&with_members(
        &["serve", "--socket", directory.0.join("sock").to_str().unwrap(), "--map-cache", "1000TiB"],
        &members,
    ));
    assert!(!serve.status.success(), "{}", text(&serve));
    assert!(text(&serve).contains("more than this machine's memory"), "{}", text(&serve));
}

/// `bench scale` end to end on a small volume: every step's child opens what it should
/// (the empty volume, the written one, from the checkpoint and by scanning, after SIGKILL)
/// and the report says so.
#[test]
fn bench_scale_measures_every_open_of_a_small_volume() {
    let directory = Directory::new("scale");
    let json = directory.0.join("scale.json");
    let dir = directory.0.join("members");
    let output = stripelog(&[
        "bench",
        "scale",
        "--dir",
        dir.to_str().unwrap(),
        "--members",
        "3",
        "--member-size",
        "96MiB",
        "--chunk",
        "64KiB",
        "--write",
        "64MiB",
        "--empty-size",
        "16GiB",
        "--load",
        "1s",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "bench scale: {}", text(&output));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).expect("JSON");
    for open in ["written_resident", "clean_mount", "clean_scan_mount", "killed_mount", "killed_scan_mount"] {
        assert!(report[open]["error"].is_null(), "{open} failed: {}", report[open]);
        assert!(report[open]["seconds"].as_f64().unwrap() > 0.0, "{open}: {}", report[open]);
    }
    assert!(report["empty"]["open"]["error"].is_null(), "the empty 16 GiB volume: {}", report["empty"]);
    assert!(report["killed_read_write_open"]["error"].is_null(), "{}", report["killed_read_write_open"]);
    assert_eq!(report["clean_mount"]["from_checkpoint"], true, "{}", report["clean_mount"]);
    assert_eq!(report["clean_scan_mount"]["from_checkpoint"], false, "{}", report["clean_scan_mount"]);
    assert!(report["clean_scan_mount"]["segments_scanned"].as_u64().unwrap() > 0);
    assert!(report["written_bytes"].as_u64().unwrap() >= 64 << 20, "{report}");
    assert!(text(&output).contains("per TiB"), "the report prints per-TiB figures: {}", text(&output));
}

/// The write log's commands as an operator uses them: `create --log`, `info` showing it,
/// `log remove`, `log add` (one device or a mirror), and the refusals that keep a mistake
/// from destroying data: a member as its own log, a device that holds an old log.
#[test]
fn a_write_log_is_created_shown_removed_and_added_and_mistakes_are_refused() {
    let directory = Directory::new("write-log");
    let members = directory.members(3);
    let logs: Vec<String> =
        ["log-a", "log-b"].iter().map(|name| directory.0.join(name).display().to_string()).collect();
    let create = stripelog(&with_members(
        &[
            "create",
            "--raid",
            "5",
            "--chunk",
            "64KiB",
            "--member-size",
            "16MiB",
            "--log",
            &logs[0],
            "--log-size",
            "4MiB",
        ],
        &members,
    ));
    assert!(create.status.success(), "{}", text(&create));
    let log_path = |index: usize| std::fs::canonicalize(&logs[index]).unwrap().display().to_string();
    let info_json = |members: &[String]| {
        let info = stripelog(&with_members(&["info", "--json"], members));
        assert!(info.status.success(), "{}", text(&info));
        serde_json::from_slice::<serde_json::Value>(&info.stdout).expect("JSON")
    };
    let stats = info_json(&members);
    let log = &stats["write_log"];
    assert_eq!(log["devices"], serde_json::json!([log_path(0)]), "{stats}");
    assert_eq!(log["active"], true);
    let size = log["size_bytes"].as_u64().unwrap();
    assert!(size > 3 << 20 && size <= 4 << 20, "a 4 MiB log has {size} bytes of records");
    let info = stripelog(&with_members(&["info"], &members));
    assert!(text(&info).contains(&format!("write log      ONLINE, on {}", log_path(0))), "{}", text(&info));

    // A member is not its own log.
    let refused = stripelog(&with_members(&["log", "add", "--device", &members[1]], &members));
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("is a member of the volume"), "{}", text(&refused));

    let remove = stripelog(&with_members(&["log", "remove"], &members));
    assert!(remove.status.success(), "{}", text(&remove));
    assert!(text(&remove).contains("removed: flushes sync the members"), "{}", text(&remove));
    assert!(info_json(&members)["write_log"].is_null());
    let info = stripelog(&with_members(&["info"], &members));
    assert!(text(&info).contains("write log      none: flushes sync the members"), "{}", text(&info));

    // The removed log's device still holds its records: adding it again overwrites them,
    // which takes --force; a fresh file beside it makes a mirror.
    let add = ["log", "add", "--size", "4MiB", "--device", &logs[0], "--device", &logs[1]];
    let refused = stripelog(&with_members(&add, &members));
    assert!(!refused.status.success(), "a device holding an old log was formatted: {}", text(&refused));
    assert!(text(&refused).contains("--force"), "{}", text(&refused));
    assert!(info_json(&members)["write_log"].is_null(), "a refused add changed the volume");
    let forced = stripelog(&with_members(&[&add[..], &["--force"]].concat(), &members));
    assert!(forced.status.success(), "{}", text(&forced));
    let stats = info_json(&members);
    assert_eq!(stats["write_log"]["devices"], serde_json::json!([log_path(0), log_path(1)]), "{stats}");
    let check = stripelog(&with_members(&["check"], &members));
    assert!(check.status.success(), "{}", text(&check));
}

/// `create --compression lz4` makes a volume that compresses (version-4 superblocks,
/// `info` says so); `stripelog set` turns it off and on offline; a volume created
/// without compression refuses to turn it on, and a bad setting is named.
#[test]
fn compression_is_created_shown_and_set() {
    let directory = Directory::new("compression");
    let members = directory.members(3);
    let create = stripelog(&with_members(
        &["create", "--raid", "5", "--chunk", "64KiB", "--member-size", "16MiB", "--compression", "lz4"],
        &members,
    ));
    assert!(create.status.success(), "{}", text(&create));
    assert!(text(&create).contains("compression    lz4"), "{}", text(&create));
    let info = |members: &[String]| -> serde_json::Value {
        let output = stripelog(&with_members(&["info", "--json"], members));
        assert!(output.status.success(), "{}", text(&output));
        serde_json::from_slice(&output.stdout).expect("JSON")
    };
    let stats = info(&members);
    assert_eq!(stats["superblock_version"], 4);
    assert_eq!(stats["compression"]["setting"], "lz4");
    let off = stripelog(&with_members(&["set", "compression=off"], &members));
    assert!(off.status.success(), "{}", text(&off));
    assert_eq!(info(&members)["compression"]["setting"], "off");
    let on = stripelog(&with_members(&["set", "compression=lz4"], &members));
    assert!(on.status.success(), "{}", text(&on));
    assert_eq!(info(&members)["compression"]["setting"], "lz4");
    let bad = stripelog(&with_members(&["set", "compression=zstd"], &members));
    assert!(!bad.status.success() && text(&bad).contains("expected lz4 or off"), "{}", text(&bad));

    let plain = directory.members(6)[3..].to_vec();
    create_raid5(&plain, "16MiB");
    assert!(info(&plain)["compression"].is_null());
    let refused = stripelog(&with_members(&["set", "compression=lz4"], &plain));
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("created without compression"), "{}", text(&refused));

    // The planner takes a measured ratio from `info --json`, and refuses one that
    // measured nothing: a volume without compression, or one holding no data.
    for (stats, expected) in [(info(&plain), "created without compression"), (info(&members), "holds no data")] {
        let file = directory.0.join("info.json");
        std::fs::write(&file, stats.to_string()).unwrap();
        let refused = stripelog(&["plan", "--preset", "crucial-m550", "--compression-of", &file.display().to_string()]);
        assert!(!refused.status.success(), "{}", text(&refused));
        assert!(text(&refused).contains(expected), "{}", text(&refused));
    }
}

/// `bench dedupability` over a file and a copy of it with one block changed finds the
/// copy's duplicates (all but those before its first hook); an input it cannot size
/// (a pipe) needs `--capacity`, and says so.
#[test]
fn dedupability_finds_a_copy_and_asks_for_a_capacity_for_pipes() {
    let directory = Directory::new("dedupability");
    let mut data = vec![0u8; 1 << 20];
    let mut state = 11u64;
    for byte in data.iter_mut() {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *byte = (state >> 33) as u8;
    }
    let first = directory.0.join("first");
    let second = directory.0.join("second");
    std::fs::write(&first, &data).unwrap();
    data[100 * 4096] ^= 1;
    std::fs::write(&second, &data).unwrap();
    let report_file = directory.0.join("found.json");
    let output = stripelog(&[
        "bench",
        "dedupability",
        "--quiet",
        "--json",
        &report_file.display().to_string(),
        &first.display().to_string(),
        &second.display().to_string(),
    ]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("of exact deduplication's duplicates"), "{}", text(&output));
    let reports: serde_json::Value = serde_json::from_slice(&std::fs::read(&report_file).unwrap()).unwrap();
    let last = &reports[1];
    assert_eq!(last["duplicate_blocks"], 255, "{last}");
    let found = last["found_blocks"].as_u64().unwrap();
    assert!((200..=255).contains(&found), "{last}");

    let pipe = directory.0.join("pipe");
    let made = Command::new("mkfifo").arg(&pipe).status().expect("mkfifo");
    assert!(made.success());
    let refused = stripelog(&["bench", "dedupability", "--quiet", &pipe.display().to_string()]);
    assert!(!refused.status.success() && text(&refused).contains("give --capacity"), "{}", text(&refused));
}

/// `info` reports wear: each member's lifetime bytes, the amplification by cause, and,
/// given a rating, the projected life and safe overwrites a day, computed by seed 002's
/// and seed 001's formulas from the figures the report itself shows.
#[test]
fn info_reports_each_member_s_wear_and_the_drives_projected_life() {
    let directory = Directory::new("wear");
    let members = directory.members(3);
    create_raid5(&members, "16MiB");
    let volume = open_volume(&members);
    let data: Vec<u8> = (0..4 << 20).map(|index: u32| (index.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    for _ in 0..3 {
        volume.write(0, &data, false).expect("write");
    }
    volume.close().expect("close");
    let arguments = ["info", "--json", "--drive-tbw", "600TB", "--daily-writes", "2TB"];
    let info = stripelog(&with_members(&arguments, &members));
    assert!(info.status.success(), "{}", text(&info));
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).expect("JSON");
    let wear = &info["wear"];
    let number = |value: &serde_json::Value| value.as_f64().unwrap_or_else(|| panic!("not a number: {wear}"));
    let host = number(&wear["host_bytes_written"]);
    assert_eq!(host, (12 << 20) as f64, "{wear}");
    // One write amplification: member bytes ÷ client bytes, whose parts add up to it, the
    // same in the wear report, the lifetime figures and the human lines; what the members
    // were written over their life.
    let amplification = &wear["write_amplification"];
    let causes: f64 = ["data", "cleaning", "redundancy", "metadata", "padding"]
        .iter()
        .map(|cause| number(&amplification[cause]))
        .sum();
    let total = number(&amplification["total"]);
    assert!((causes - total).abs() < 1e-9, "{wear}");
    assert_eq!(info["lifetime_write_amplification"], *amplification, "one figure in info --json");
    let members_written: f64 =
        wear["members"].as_array().expect("members").iter().map(|m| number(&m["lifetime_bytes_written"])).sum();
    assert!((total - members_written / host).abs() < 0.02, "{wear}");
    assert!((number(&amplification["redundancy"]) - 0.5).abs() < 0.05, "RAID-5 on 3 members: {wear}");
    let human = stripelog(&with_members(&["info"], &members));
    let shown = format!("write amplification {total:.2} (member bytes per client byte)");
    assert_eq!(text(&human).matches(&shown).count(), 2, "the lifetime and wear lines show {shown}: {}", text(&human));
    // Seed 002: years = (rated − written) ÷ (the member's share of 2 TB a day) ÷ 365.
    let rated = number(&wear["rated_bytes_per_drive"]);
    assert_eq!(rated, 600e12);
    for member in wear["members"].as_array().expect("members") {
        let written = number(&member["lifetime_bytes_written"]);
        let expected = (rated - written) / (2e12 * written / host) / 365.0;
        assert!((number(&member["projected_life_years"]) - expected).abs() < 1e-6 * expected, "{member}");
    }
    // Seed 001: overwrites of the logical size a day over 5 years.
    let logical = number(&info["logical_size_bytes"]);
    let expected = rated * 3.0 / (365.0 * 5.0) / total / logical;
    assert!((number(&wear["safe_overwrites_per_day"]) - expected).abs() < 1e-6 * expected, "{wear}");
    let human = stripelog(&with_members(&["info", "--drive-writes-per-day", "1", "--daily-writes", "2TB"], &members));
    assert!(text(&human).contains("safe overwrites of the volume a day; projected life"), "{}", text(&human));
    let refused = stripelog(&with_members(&["info", "--drive-tbw", "1TB", "--drive-writes-per-day", "1"], &members));
    assert!(!refused.status.success() && text(&refused).contains("cannot be used with"), "{}", text(&refused));
}
