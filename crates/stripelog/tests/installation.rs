//! `make install` (scripts/install.sh): the binary, man pages and completions generated
//! from the CLI, and the systemd unit, which `systemd-analyze verify` must accept with no
//! complaint (its Documentation= man page included).

mod common;

use common::*;
use std::process::Command;

#[test]
fn install_puts_man_pages_completions_and_a_unit_systemd_accepts() {
    let Some(systemd_analyze) = tool("systemd-analyze") else { return };
    if tool("man").is_none() {
        return;
    }
    let prefix = fresh_directory("install");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/install.sh");
    let install = run_with_timeout(
        Command::new(script)
            .arg(env!("CARGO_BIN_EXE_stripelog"))
            .env("PREFIX", &prefix)
            .env("SYSCONFDIR", prefix.join("etc"))
            .env_remove("DESTDIR"),
        CLIENT_TIMEOUT,
    );
    assert!(install.status.success(), "install.sh: {}", text(&install));
    let installed = |path: &str| {
        let path = prefix.join(path);
        let content = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        assert!(!content.is_empty(), "{} is empty", path.display());
        content
    };
    assert!(installed("share/man/man1/stripelog-serve.1").contains("Prometheus"));
    assert!(installed("share/man/man1/stripelog-status.1").contains("control"));
    assert!(installed("share/bash-completion/completions/stripelog").contains("--log-level"));
    assert!(installed("share/zsh/site-functions/_stripelog").contains("#compdef stripelog"));
    assert!(installed("share/fish/vendor_completions.d/stripelog.fish").contains("complete -c stripelog"));
    let unit = installed("lib/systemd/system/stripelog@.service");
    let binary = prefix.join("bin/stripelog");
    assert!(unit.contains(&format!("ExecStart={} serve", binary.display())), "{unit}");
    // The service: readiness from serve itself, a bounded wait for the members (a template
    // cannot order itself after its instance's devices), restarts with a limit.
    let setting = |section: &str, key: &str| unit_setting(&unit, section, key);
    assert_eq!(setting("Service", "Type").as_deref(), Some("notify"), "{unit}");
    assert_eq!(setting("Service", "Restart").as_deref(), Some("on-failure"), "{unit}");
    assert!(setting("Service", "RestartSec").is_some(), "{unit}");
    assert!(setting("Unit", "StartLimitIntervalSec").is_some(), "a start limit in [Unit]: {unit}");
    assert!(setting("Unit", "StartLimitBurst").is_some_and(|burst| burst.parse::<u32>().is_ok()), "{unit}");
    let start = setting("Service", "ExecStart").expect("ExecStart");
    let wait = start.split_whitespace().skip_while(|word| *word != "--wait-for-members").nth(1);
    assert!(wait.is_some_and(|duration| duration.ends_with('s') || duration.ends_with('m')), "{start}");
    // The binary takes what the unit gives it.
    let help = run_with_timeout(Command::new(&binary).args(["serve", "--help"]), CLIENT_TIMEOUT);
    assert!(text(&help).contains("--wait-for-members <DURATION>"), "{}", text(&help));
    assert!(installed("share/man/man1/stripelog-serve.1").contains("READY=1"));
    // Each instance needs its own metrics port: the example says so.
    let example = installed("etc/stripelog/stripelog.conf.example");
    assert!(example.contains("each instance") && example.contains("own port"), "{example}");
    assert!(installed("etc/stripelog/stripelog.conf.example").contains("MEMBERS="));
    // systemd's own check: the unit parses, its binary is executable, its man page exists.
    let verify = run_with_timeout(
        Command::new(&systemd_analyze)
            .arg("verify")
            .arg(prefix.join("lib/systemd/system/stripelog@.service"))
            .env("MANPATH", prefix.join("share/man")),
        CLIENT_TIMEOUT,
    );
    assert!(verify.status.success() && text(&verify).trim().is_empty(), "systemd-analyze verify: {}", text(&verify));
    // Installing again keeps a configuration the operator wrote.
    std::fs::write(prefix.join("etc/stripelog/vol.conf"), "MEMBERS=/dev/null\n").expect("write a configuration");
    let again = run_with_timeout(
        Command::new(script)
            .arg(env!("CARGO_BIN_EXE_stripelog"))
            .env("PREFIX", &prefix)
            .env("SYSCONFDIR", prefix.join("etc")),
        CLIENT_TIMEOUT,
    );
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(std::fs::read_to_string(prefix.join("etc/stripelog/vol.conf")).expect("read"), "MEMBERS=/dev/null\n");
    let _ = std::fs::remove_dir_all(&prefix);
}

/// The value of `key` in `[section]` of a unit file (the last one given wins, as in systemd).
fn unit_setting(unit: &str, section: &str, key: &str) -> Option<String> {
    let mut current = "";
    let mut value = None;
    for line in unit.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|line| line.strip_suffix(']')) {
            current = name;
        } else if let Some((name, found)) =
            line.split_once('=').filter(|_| current == section && !line.starts_with('#'))
        {
            if name.trim() == key {
                value = Some(found.trim().to_string());
            }
        }
    }
    value
}
