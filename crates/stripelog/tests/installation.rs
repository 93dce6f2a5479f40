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
