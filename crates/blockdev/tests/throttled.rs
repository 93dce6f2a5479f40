//! A member under a block-layer throttle rule moves its whole limit through io_uring.
//!
//! A loop device over a file in /dev/shm, limited by a cgroup-v1 blkio rule that this test
//! process joins (a process of its own: the rule applies to every thread of it, and only
//! to I/O to that loop device). Needs root, losetup and the blkio controller; without them
//! the test says so and skips, and under `CI=true` it fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use stripelog_blockdev::{AlignedBuffer, BlockDevice, FileDevice, FileDeviceOptions, IoRequest};

const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";
const DEVICE_SIZE_BYTES: u64 = 96 << 20;
const WRITE_LIMIT_BYTES_PER_SECOND: u64 = 32 << 20;
const READ_LIMIT_BYTES_PER_SECOND: u64 = 64 << 20;
const REQUEST_BYTES: usize = 1 << 20;
/// Requests in flight per batch, as the engine writes a stripe's chunks to a member.
const BATCH_REQUESTS: usize = 4;

fn cannot_run(reason: &str) {
    if std::env::var("CI").is_ok_and(|value| value == "true") {
        panic!("{reason}, and CI=true: `make test` runs as root with util-linux (scripts/install-deps.sh)");
    }
    eprintln!("SKIPPED: {reason} (under CI=true this is a failure)");
}

/// The loop device, its cgroup and its backing file, taken down on drop.
struct ThrottledDrive {
    backing_file: PathBuf,
    device: Option<PathBuf>,
    cgroup: PathBuf,
}

impl ThrottledDrive {
    fn up() -> ThrottledDrive {
        let backing_file = PathBuf::from(format!("/dev/shm/stripelog-throttled-test-{}", std::process::id()));
        let cgroup = Path::new(BLKIO_ROOT).join(format!("stripelog-throttled-test-{}", std::process::id()));
        let mut drive = ThrottledDrive { backing_file, device: None, cgroup };
        std::fs::File::create(&drive.backing_file).unwrap().set_len(DEVICE_SIZE_BYTES).unwrap();
        let output = Command::new("losetup").arg("--find").arg("--show").arg(&drive.backing_file).output().unwrap();
        assert!(output.status.success(), "losetup: {}", String::from_utf8_lossy(&output.stderr));
        let device = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        drive.device = Some(device.clone());
        let number =
            std::fs::read_to_string(Path::new("/sys/class/block").join(device.file_name().unwrap()).join("dev"))
                .unwrap();
        std::fs::create_dir_all(&drive.cgroup).unwrap();
        for (file, limit) in [
            ("blkio.throttle.write_bps_device", WRITE_LIMIT_BYTES_PER_SECOND),
            ("blkio.throttle.read_bps_device", READ_LIMIT_BYTES_PER_SECOND),
        ] {
            std::fs::write(drive.cgroup.join(file), format!("{} {limit}\n", number.trim())).unwrap();
        }
        std::fs::write(drive.cgroup.join("cgroup.procs"), format!("{}\n", std::process::id())).unwrap();
        drive
    }
}

impl Drop for ThrottledDrive {
    fn drop(&mut self) {
        let _ = std::fs::write(Path::new(BLKIO_ROOT).join("cgroup.procs"), format!("{}\n", std::process::id()));
        if let Some(device) = &self.device {
            let _ = Command::new("losetup").arg("--detach").arg(device).status();
        }
        let _ = std::fs::remove_file(&self.backing_file);
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// Bytes per second moved by batches of 1 MiB requests over the whole device, each
/// region once (the first 16 MiB excluded from the timing: the throttle's first slice may
/// let a burst through).
fn rate(device: &FileDevice, write: bool) -> f64 {
    let mut buffers: Vec<AlignedBuffer> = (0..BATCH_REQUESTS).map(|_| AlignedBuffer::zeroed(REQUEST_BYTES)).collect();
    let batch_bytes = (BATCH_REQUESTS * REQUEST_BYTES) as u64;
    let warm_up_bytes = 16 << 20;
    let mut started = Instant::now();
    let mut offset_bytes = 0u64;
    while offset_bytes < DEVICE_SIZE_BYTES {
        if offset_bytes == warm_up_bytes {
            started = Instant::now();
        }
        let mut requests: Vec<IoRequest<'_>> = buffers
            .iter_mut()
            .enumerate()
            .map(|(index, buffer)| {
                let at = offset_bytes + (index * REQUEST_BYTES) as u64;
                if write {
                    IoRequest::Write { buffer: buffer.as_slice(), offset_bytes: at }
                } else {
                    IoRequest::Read { buffer: buffer.as_mut_slice(), offset_bytes: at }
                }
            })
            .collect();
        for result in device.submit_batch(&mut requests) {
            result.unwrap();
        }
        offset_bytes += batch_bytes;
    }
    (DEVICE_SIZE_BYTES - warm_up_bytes) as f64 / started.elapsed().as_secs_f64()
}

#[test]
fn a_throttled_member_moves_its_whole_limit_through_io_uring() {
    // SAFETY: geteuid has no preconditions.
    if !Path::new(BLKIO_ROOT).join("cgroup.procs").exists() || unsafe { libc::geteuid() } != 0 {
        cannot_run("a throttled drive needs root and the cgroup-v1 blkio controller");
        return;
    }
    if Command::new("losetup").arg("--version").output().is_err() {
        cannot_run("losetup (util-linux) is not installed");
        return;
    }
    let drive = ThrottledDrive::up();
    let device_path = drive.device.clone().unwrap();
    let device = FileDevice::open(&device_path, &FileDeviceOptions::default()).unwrap();
    let rule = device.throttle_rule().map(str::to_string);
    assert!(
        rule.as_deref().is_some_and(|rule| rule.contains("stripelog-throttled-test")),
        "the rule on {} was not found: {rule:?}",
        device_path.display()
    );
    assert!(device.describe().contains("through the kernel's workers"), "{}", device.describe());

    let write = rate(&device, true) / WRITE_LIMIT_BYTES_PER_SECOND as f64;
    let read = rate(&device, false) / READ_LIMIT_BYTES_PER_SECOND as f64;
    eprintln!("through io_uring: writes at {write:.2} and reads at {read:.2} of the drive's limits");
    // Charged twice, a held-back request gets half the limit; charged once, all of it.
    assert!((0.8..1.25).contains(&write), "writes moved {write:.2} of the drive's limit");
    assert!((0.8..1.25).contains(&read), "reads moved {read:.2} of the drive's limit");
    drop(device);
    drop(drive);
}
