//! `stripelog create` does only what was meant (issue 55): what it refuses, it refuses
//! before making anything, and what a failed create made is gone again; a fresh volume
//! is closed; its spare leaves the cleaner room; inputs that are probably mistakes are
//! refused with the likely meaning. And `status --control` on an NBD socket says so.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

fn create(arguments: &[&str], members: &[PathBuf]) -> Output {
    run_with_timeout(stripelog().arg("create").args(arguments).args(members), CLIENT_TIMEOUT)
}

fn names(directory: &Path, count: usize) -> Vec<PathBuf> {
    (0..count).map(|index| directory.join(format!("m{index}"))).collect()
}

/// The entries of `directory`, sorted.
fn entries(directory: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(directory)
        .map(|entries| entries.filter_map(Result::ok).map(|entry| entry.file_name().to_string_lossy().into()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

fn assert_refused(output: &Output, expected: &[&str]) {
    let said = text(output);
    assert!(!output.status.success(), "refused: {said}");
    assert!(said.lines().count() < 12 && !said.contains("panicked"), "a short message, no panic: {said}");
    for part in expected {
        assert!(said.contains(part), "says {part:?}: {said}");
    }
}

#[test]
fn a_member_whose_directory_does_not_exist_is_refused_and_nothing_is_made() {
    let directory = fresh_directory("create-no-directory");
    let missing = directory.join("no").join("such");
    let members = names(&missing, 3);
    let output = create(&["--member-size", "64MiB"], &members);
    assert_refused(&output, &["no such directory", &missing.display().to_string()]);
    assert!(!directory.join("no").exists(), "no directory made: {:?}", entries(&directory));
    let _ = std::fs::remove_dir_all(directory);
}

#[test]
fn a_missing_name_under_dev_is_no_such_device_and_no_file_is_made_there() {
    let members: Vec<PathBuf> =
        (0..3).map(|index| PathBuf::from(format!("/dev/sdz-stripelog-typo-{}-{index}", std::process::id()))).collect();
    // Should a regression make them, they go again, whatever the assertions say.
    struct RemoveFiles<'a>(&'a [PathBuf]);
    impl Drop for RemoveFiles<'_> {
        fn drop(&mut self) {
            for path in self.0.iter().filter(|path| path.is_file()) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
    let _remove = RemoveFiles(&members);
    let output = create(&["--member-size", "64MiB"], &members);
    assert_refused(&output, &["no such device", "/dev/sdz-stripelog-typo"]);
    for member in &members {
        assert!(!member.exists(), "{} was made", member.display());
    }
}

#[test]
fn new_files_without_a_size_are_refused_before_any_is_made() {
    let directory = fresh_directory("create-no-size");
    let members = names(&directory, 3);
    let output = create(&["--raid", "5"], &members);
    assert_refused(&output, &["--member-size", "nothing was created"]);
    assert_eq!(entries(&directory), Vec::<String>::new(), "no 0-byte files left behind");
    let _ = std::fs::remove_dir_all(directory);
}

#[test]
fn a_failed_create_removes_the_files_it_made_and_only_those() {
    let directory = fresh_directory("create-cleanup");
    let members = names(&directory, 4);
    // m2 exists, as large as a member, and holds data: the engine refuses it once the
    // members are open, after m0, m1 and m3 were made as files of the member size.
    let mut existing = vec![7u8; 1 << 20];
    existing.resize(16 << 20, 0);
    std::fs::write(&members[2], &existing).expect("write m2");
    let output = create(&["--raid", "5", "--chunk", "64KiB", "--member-size", "16MiB"], &members);
    assert_refused(&output, &["m2", "--force", "removed"]);
    assert_eq!(entries(&directory), vec!["m2".to_string()], "only the file that was there before is left");
    assert_eq!(std::fs::read(&members[2]).expect("read m2"), existing, "m2 untouched");

    // A refusal that comes only after the files are made: a member named twice.
    let same = vec![members[0].clone(), members[1].clone(), directory.join(".").join("m0")];
    let output = create(&["--raid", "5", "--chunk", "64KiB", "--member-size", "16MiB"], &same);
    assert_refused(&output, &["m0"]);
    assert!(text(&output).contains("removed"), "says what it removed: {}", text(&output));
    assert_eq!(entries(&directory), vec!["m2".to_string()], "the files it made are gone");
    let _ = std::fs::remove_dir_all(directory);
}

#[test]
fn a_member_too_many_is_a_count_mismatch_before_any_path_is_looked_up() {
    let directory = fresh_directory("create-count");
    // Three members for a two-member mirror; the third's directory does not exist.
    let mut members = names(&directory, 2);
    members.push(directory.join("no-such-directory").join("m2"));
    let output = create(&["--raid", "1", "--member-size", "16MiB"], &members);
    assert_refused(&output, &["mirror of two members: 3 given"]);
    assert!(!text(&output).contains("no such directory"), "the count comes first: {}", text(&output));
    let output = create(&["--raid", "10", "--member-size", "16MiB"], &members);
    assert_refused(&output, &["even number of members, got 3"]);
    assert_eq!(entries(&directory), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(directory);
}

#[test]
fn a_path_too_many_for_a_volume_is_a_count_mismatch_not_a_missing_member() {
    let directory = fresh_directory("open-count");
    let members = names(&directory, 3);
    let output = create(&["--raid", "5", "--chunk", "64KiB", "--member-size", "16MiB"], &members);
    assert!(output.status.success(), "{}", text(&output));
    let mut too_many = members.clone();
    too_many.push(directory.join("m3"));
    let output = run_with_timeout(stripelog().arg("info").args(&too_many), CLIENT_TIMEOUT);
    assert_refused(&output, &["has 3 members but 4 were given"]);
    assert!(!text(&output).contains("missing"), "not taken for a missing member: {}", text(&output));
    let _ = std::fs::remove_dir_all(directory);
}

#[test]
fn a_fresh_volume_is_shown_closed_not_open() {
    let directory = fresh_directory("create-holder");
    let members = names(&directory, 3);
    let output = create(&["--raid", "5", "--chunk", "64KiB", "--member-size", "16MiB"], &members);
    assert!(output.status.success(), "{}", text(&output));
    let said = String::from_utf8_lossy(&output.stdout);
    let holder = said.lines().find(|line| line.trim_start().starts_with("holder")).expect("a holder line");
    assert!(holder.contains("closed cleanly") && !holder.contains("OPEN"), "{holder}");
    let output = create(&["--json", "--force", "--raid", "5", "--chunk", "64KiB"], &members);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(json(&output)["holder"]["open"], serde_json::Value::Bool(false), "{}", text(&output));
    let _ = std::fs::remove_dir_all(directory);
}

#[test]
fn a_spare_too_small_for_the_cleaner_is_raised_by_default_and_refused_when_asked_for() {
    let directory = fresh_directory("create-spare");
    let members = names(&directory, 5);
    // 32 MiB members of 1 MiB chunks: 31 segments; 20 % leaves the cleaner too little.
    let output = create(&["--raid", "5", "--chunk", "1MiB", "--spare", "10%", "--member-size", "32MiB"], &members);
    assert_refused(&output, &["a spare of 10 %", "ENOSPC", "use --spare", "--force"]);
    assert_eq!(entries(&directory), Vec::<String>::new(), "nothing left behind");

    let output = create(&["--json", "--raid", "5", "--chunk", "1MiB", "--member-size", "32MiB"], &members);
    assert!(output.status.success(), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("rather than the default 20 %"), "says it raised the spare: {stderr}");
    let spare = json(&output)["spare_fraction"].as_f64().expect("spare_fraction");
    assert!(spare > 0.2, "the spare was raised: {spare}");

    let output =
        create(&["--force", "--raid", "5", "--chunk", "1MiB", "--spare", "10%", "--member-size", "32MiB"], &members);
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("warning: a spare of 10 %"), "forced, it warns: {}", text(&output));
    let _ = std::fs::remove_dir_all(directory);
}

#[test]
fn inputs_that_are_probably_mistakes_are_refused_with_the_likely_meaning() {
    let directory = fresh_directory("create-inputs");
    let members = names(&directory, 3);
    let output = create(&["--spare", "27", "--member-size", "64MiB"], &members);
    assert_refused(&output, &["did you mean 27%?"]);
    let output = create(&["--logical-size", "4GB", "--member-size", "64MiB"], &members);
    assert_refused(&output, &["did you mean 4GiB?"]);
    assert_eq!(entries(&directory), Vec::<String>::new());
    // A logical size below what the volume holds is a cap, and said to be.
    let output = create(&["--logical-size", "16MiB", "--chunk", "64KiB", "--member-size", "64MiB"], &members);
    assert!(output.status.success(), "{}", text(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("not thin provisioned"), "{}", text(&output));
    // The help says what MB and M mean.
    let help = run_with_timeout(stripelog().args(["create", "--help"]), CLIENT_TIMEOUT);
    let help = text(&help);
    assert!(help.contains("256MB = 256000000 bytes") && help.contains("256M = 256MiB"), "{help}");
    let _ = std::fs::remove_dir_all(directory);
}

#[test]
fn status_on_an_nbd_socket_says_it_is_not_a_control_socket() {
    let server = Server::start_with_members_of("5", "16MiB", &[]);
    let output = run_with_timeout(stripelog().args(["status", "--control"]).arg(&server.socket), CLIENT_TIMEOUT);
    assert_refused(&output, &["not a control socket", ".control"]);
    assert!(!text(&output).contains("reset by peer"), "{}", text(&output));
    let mut control = server.socket.clone().into_os_string();
    control.push(".control");
    let output = run_with_timeout(stripelog().args(["status", "--control"]).arg(&control), CLIENT_TIMEOUT);
    assert!(output.status.success(), "the control socket answers: {}", text(&output));
}
