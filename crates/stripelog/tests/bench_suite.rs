//! `stripelog bench suite`: it refuses members that hold data, measures each figure beside
//! a peer it runs itself (fio, nbdkit) and writes its report; its testbed's drives run at
//! the speeds they were given and are gone afterwards.

mod common;

use common::{cannot_run, fresh_directory, stripelog, text, tool};
use serde_json::Value;
use std::path::Path;

fn report(directory: &Path) -> Value {
    let path = directory.join("report.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("report.json")).expect("report.json is JSON")
}

/// `stripelog bench suite` on three 192 MiB member files it creates in `directory`,
/// with cells of 1 s and `arguments`; it must succeed. The report and its directory.
fn suite_on_files(directory: &Path, arguments: &[&str]) -> (Value, std::path::PathBuf) {
    let output_directory = directory.join("report");
    let output = stripelog()
        .args(["bench", "suite", "--members", "3", "--member-size", "192MiB", "--cell", "1s"])
        .args(arguments)
        .arg("--dir")
        .arg(directory.join("members"))
        .arg("--output")
        .arg(&output_directory)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    (report(&output_directory), output_directory)
}

fn figure<'a>(report: &'a Value, part: &str) -> &'a Value {
    let parts = report["parts"].as_array().expect("parts");
    let found = parts.iter().find(|entry| entry["part"] == part).unwrap_or_else(|| panic!("no part {part}"));
    assert!(found["error"].is_null(), "part {part} failed: {}", found["error"]);
    &found["figures"][0]
}

#[test]
fn the_suite_refuses_members_that_hold_data_and_names_them() {
    let directory = fresh_directory("suite-refuses");
    let members: Vec<_> = (0..3).map(|index| directory.join(format!("m{index}"))).collect();
    for member in &members {
        std::fs::write(member, b"").unwrap();
    }
    std::fs::write(&members[1], b"a database lives here").unwrap();
    let list = members.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(",");
    let output = stripelog()
        .args(["bench", "suite", "--devices", &list, "--parts", "check", "--output"])
        .arg(directory.join("out"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let said = text(&output);
    assert!(said.contains(&members[1].display().to_string()) && said.contains("--force"), "{said}");
    assert_eq!(std::fs::read(&members[1]).unwrap(), b"a database lives here");
    std::fs::remove_dir_all(&directory).unwrap();
}

#[test]
fn each_figure_is_measured_beside_its_peer_and_reported() {
    if tool("fio").is_none() || tool("nbdkit").is_none() || tool("taskset").is_none() {
        return;
    }
    let directory = fresh_directory("suite-files");
    let (report, output_directory) = suite_on_files(&directory, &["--parts", "nbd,check"]);
    let nbd = figure(&report, "nbd");
    assert!(nbd["value"].as_f64().unwrap() > 0.0 && nbd["peer"]["value"].as_f64().unwrap() > 0.0, "{nbd}");
    assert!(nbd["ratio"].as_f64().unwrap() > 0.0);
    assert!(nbd["command"].as_str().unwrap().contains("--ioengine=nbd"), "{nbd}");
    assert!(nbd["peer"]["name"].as_str().unwrap().contains("nbdkit memory"), "{nbd}");
    let check = figure(&report, "check");
    assert!(check["command"].as_str().unwrap().contains("stripelog check"), "{check}");
    assert!(check["peer"]["command"].as_str().unwrap().starts_with("fio "), "{check}");
    assert_eq!(report["array"]["members"].as_array().unwrap().len(), 3);
    let markdown = std::fs::read_to_string(output_directory.join("report.md")).unwrap();
    assert!(markdown.contains("| figure | stripelog | peer |") && markdown.contains("ratios.svg"), "{markdown}");
    assert!(std::fs::read_to_string(output_directory.join("ratios.svg")).unwrap().starts_with("<svg"));
    // The member files the suite created are gone.
    assert!(!directory.join("members").join("member-0").exists());
    std::fs::remove_dir_all(&directory).unwrap();
}

#[test]
fn a_testbed_drive_runs_at_its_given_speed_and_is_gone_afterwards() {
    let blkio = Path::new("/sys/fs/cgroup/blkio/cgroup.procs");
    // SAFETY: geteuid has no preconditions.
    if !blkio.exists() || unsafe { libc::geteuid() } != 0 {
        cannot_run("the testbed needs root and the cgroup-v1 blkio controller");
        return;
    }
    if tool("fio").is_none() || tool("losetup").is_none() {
        return;
    }
    let directory = fresh_directory("suite-testbed");
    let (read_limit, write_limit) = ((48u64 << 20) as f64, (24u64 << 20) as f64);
    let output = stripelog()
        .args(["bench", "suite", "--testbed", "--members", "3", "--member-size", "96MiB", "--cell", "2s"])
        .args(["--drive-read", "48MiB", "--drive-write", "24MiB", "--parts", "check", "--output"])
        .arg(&directory)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let report = report(&directory);
    for member in report["array"]["members"].as_array().unwrap() {
        // Every request is charged once by the throttle: libaio's, and io_uring's as the
        // engine submits them (straight to the kernel's workers), so both reach the drive's
        // own speed.
        for key in [
            "sequential_write_bytes_per_second",
            "sequential_read_bytes_per_second",
            "sequential_write_io_uring_bytes_per_second",
            "sequential_read_io_uring_bytes_per_second",
        ] {
            let limit = if key.contains("write") { write_limit } else { read_limit };
            let share = member[key].as_f64().unwrap() / limit;
            assert!((0.75..1.1).contains(&share), "{key}: a drive ran at {share:.2} of its limit: {member}");
        }
        assert!(member["path"].as_str().unwrap().starts_with("/dev/loop"), "{member}");
    }
    let check = figure(&report, "check");
    // The check reads no faster than three drives can (a short run may spend the
    // throttle's first slice).
    let check_bytes_per_second = check["value"].as_f64().unwrap() * 1e6;
    assert!(check_bytes_per_second < 1.25 * 3.0 * read_limit, "check read faster than the drives: {check}");
    assert!(check["ratio"].as_f64().unwrap() < 1.25, "check read faster than fio on the drives: {check}");
    // Down again: no loop device over a drive's file, no cgroup, no backing file.
    let loops = std::process::Command::new("losetup").arg("-a").output().unwrap();
    assert!(!String::from_utf8_lossy(&loops.stdout).contains("stripelog-testbed-drive"));
    let cgroup = report["testbed"]["cgroup"].as_str().unwrap();
    assert!(!Path::new(cgroup).exists(), "{cgroup} is left behind");
    assert!(!Path::new("/dev/shm/stripelog-testbed-drive-0").exists());
    std::fs::remove_dir_all(&directory).unwrap();
}

/// The index part (issue 57): every map cache's figure beside the whole index's, the bars
/// at a quarter and a tenth, and the paging counts and mount times in its notes.
#[test]
fn the_index_part_measures_each_map_cache_beside_the_whole_index() {
    if tool("fio").is_none() {
        return;
    }
    let directory = fresh_directory("suite-index");
    let (report, _) = suite_on_files(&directory, &["--parts", "index", "--steady-limit", "6s"]);
    figure(&report, "index");
    let part = report["parts"].as_array().unwrap().iter().find(|entry| entry["part"] == "index").unwrap();
    let figures = part["figures"].as_array().unwrap();
    let named = |words: &[&str]| {
        figures
            .iter()
            .find(|figure| words.iter().all(|word| figure["name"].as_str().unwrap().contains(word)))
            .unwrap_or_else(|| panic!("no figure {words:?} in {figures:?}"))
    };
    for cache in ["a half", "a quarter", "a tenth"] {
        let steady = named(&["steady state", cache]);
        assert!(steady["value"].as_f64().unwrap() > 0.0, "{steady}");
        assert!(steady["peer"]["name"].as_str().unwrap().contains("whole index"), "{steady}");
        assert!(steady["command"].as_str().unwrap().contains("--map-cache"), "{steady}");
    }
    assert_eq!(named(&["steady state", "a quarter"])["bar"]["threshold"], 0.7);
    assert_eq!(named(&["steady state", "a tenth"])["bar"]["threshold"], 0.5);
    assert_eq!(named(&["reads", "a quarter"])["bar"]["threshold"], 0.7);
    let zipf = named(&["Zipf(0.99)", "a tenth"]);
    assert_eq!(zipf["bar"]["threshold"], 0.85);
    assert!(zipf["command"].as_str().unwrap().contains("--random_distribution=zipf:0.99"), "{zipf}");
    let notes = part["notes"].as_array().unwrap().iter().map(|note| note.as_str().unwrap()).collect::<Vec<_>>();
    assert!(notes.iter().any(|note| note.contains("page reads") && note.contains("a tenth")), "{notes:?}");
    assert!(notes.iter().any(|note| note.contains("after a SIGKILL")), "{notes:?}");
    assert!(!directory.join("members").join("member-0").exists());
    std::fs::remove_dir_all(&directory).unwrap();
}
