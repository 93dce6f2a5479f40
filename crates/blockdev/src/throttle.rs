//! Whether the block layer's throttle limits this process's I/O to a block device.
//!
//! The throttle is the cgroup blkio controller's `blkio.throttle.{read,write}_{bps,iops}_device`
//! (cgroup v1) or `io.max` (cgroup v2): container runtimes set it for `--device-write-bps`
//! and the like, and `stripelog bench suite --testbed` uses it to make loop devices drives
//! of a given speed. io_uring first tries each request without blocking; when the throttle
//! holds the bio back, the kernel charges it, fails the attempt and retries the request
//! from an io-wq worker, which charges it again. On this machine's kernel a throttled drive
//! then moves half its limit through io_uring (fio at depth 4, 1 MiB writes: 51.6 of 102.7
//! MB/s; reads 144 of 205) and its full limit with every request sent straight to a worker
//! (`IOSQE_ASYNC`, fio's `force_async=1`: 102.7 and 205), as libaio does. So a member under a
//! throttle rule is submitted that way ([`crate::FileDevice`]).

use std::path::{Path, PathBuf};

/// Where cgroup v1's blkio hierarchy and the unified (v2) hierarchy are mounted.
const BLKIO_V1_ROOT: &str = "/sys/fs/cgroup/blkio";
const UNIFIED_ROOT: &str = "/sys/fs/cgroup";
/// The v1 files that hold per-device throttle rules.
const V1_RULE_FILES: [&str; 4] = [
    "blkio.throttle.read_bps_device",
    "blkio.throttle.write_bps_device",
    "blkio.throttle.read_iops_device",
    "blkio.throttle.write_iops_device",
];

/// The throttle rule that limits this process's I/O to device `major:minor`, named as
/// `FILE in CGROUP` (the first found, from the process's own cgroup up to the root);
/// `None` when no rule names it or the cgroup files cannot be read.
pub(crate) fn throttle_rule(major: u32, minor: u32) -> Option<String> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let device = format!("{major}:{minor}");
    let (v1, unified) = cgroup_paths(&membership);
    if let Some(path) = v1 {
        for directory in self_and_ancestors(Path::new(BLKIO_V1_ROOT), &path) {
            for file in V1_RULE_FILES {
                let rules = std::fs::read_to_string(directory.join(file)).unwrap_or_default();
                if v1_rules_name(&rules, &device) {
                    return Some(format!("{file} in {}", directory.display()));
                }
            }
        }
    }
    if let Some(path) = unified {
        for directory in self_and_ancestors(Path::new(UNIFIED_ROOT), &path) {
            let rules = std::fs::read_to_string(directory.join("io.max")).unwrap_or_default();
            if io_max_limits(&rules, &device) {
                return Some(format!("io.max in {}", directory.display()));
            }
        }
    }
    None
}

/// The process's blkio (v1) cgroup and its unified (v2) cgroup, from `/proc/self/cgroup`
/// (`ID:CONTROLLERS:PATH` per line; the unified one has ID 0 and no controllers).
fn cgroup_paths(membership: &str) -> (Option<String>, Option<String>) {
    let mut v1 = None;
    let mut unified = None;
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if controllers.split(',').any(|controller| controller == "blkio") {
            v1 = Some(path.to_string());
        } else if id == "0" && controllers.is_empty() {
            unified = Some(path.to_string());
        }
    }
    (v1, unified)
}

/// `root` joined with the cgroup `path` and each of its ancestors up to `root` itself:
/// a parent's rule limits its children too.
fn self_and_ancestors(root: &Path, path: &str) -> Vec<PathBuf> {
    let mut directories = vec![root.to_path_buf()];
    let mut directory = root.to_path_buf();
    for component in path.split('/').filter(|component| !component.is_empty() && *component != "..") {
        directory.push(component);
        directories.push(directory.clone());
    }
    directories.reverse();
    directories
}

/// Whether a v1 throttle file (`MAJOR:MINOR LIMIT` per line) has a rule for `device`.
fn v1_rules_name(rules: &str, device: &str) -> bool {
    rules.lines().any(|line| {
        let mut fields = line.split_whitespace();
        fields.next() == Some(device) && fields.next().is_some_and(|limit| limit != "0")
    })
}

/// Whether an `io.max` file (`MAJOR:MINOR rbps=… wbps=… riops=… wiops=…` per line) limits
/// `device` (any key not `max`).
fn io_max_limits(rules: &str, device: &str) -> bool {
    rules.lines().any(|line| {
        let mut fields = line.split_whitespace();
        fields.next() == Some(device)
            && fields.any(|setting| setting.split_once('=').is_some_and(|(_, value)| value != "max"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blkio_and_unified_cgroups_are_found_in_proc_self_cgroup() {
        let membership = "12:cpu,cpuacct:/\n9:blkio:/stripelog-testbed-7\n0::/system.slice/ssh.service\n";
        assert_eq!(
            cgroup_paths(membership),
            (Some("/stripelog-testbed-7".to_string()), Some("/system.slice/ssh.service".to_string()))
        );
        assert_eq!(cgroup_paths("5:blkio,net_cls:/a/b\n"), (Some("/a/b".to_string()), None));
        assert_eq!(cgroup_paths("0::/\n"), (None, Some("/".to_string())));
    }

    #[test]
    fn a_rule_counts_for_its_own_device_only() {
        let rules = "7:0 104857600\n7:12 5000\n";
        assert!(v1_rules_name(rules, "7:0"));
        assert!(v1_rules_name(rules, "7:12"));
        assert!(!v1_rules_name(rules, "7:1"));
        assert!(!v1_rules_name("", "7:0"));
        assert!(!v1_rules_name("7:0 0\n", "7:0"), "a limit of 0 is no limit");
        assert!(io_max_limits("8:16 rbps=max wbps=1048576 riops=max wiops=max\n", "8:16"));
        assert!(!io_max_limits("8:16 rbps=max wbps=max riops=max wiops=max\n", "8:16"));
        assert!(!io_max_limits("8:16 rbps=2 wbps=max riops=max wiops=max\n", "8:1"));
    }

    #[test]
    fn a_parent_cgroup_s_rule_is_looked_for_too() {
        let root = Path::new("/sys/fs/cgroup/blkio");
        assert_eq!(self_and_ancestors(root, "/a/b"), vec![root.join("a/b"), root.join("a"), root.to_path_buf()]);
        assert_eq!(self_and_ancestors(root, "/"), vec![root.to_path_buf()]);
    }
}
