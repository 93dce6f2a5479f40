//! A testbed of independent drives on one machine: loop devices over files in a tmpfs
//! (/dev/shm), each throttled to a drive's speed by the cgroup-v1 blkio controller, so each
//! member is a drive of its own and N members are N drives' worth of bandwidth — which the
//! files of one shared disk are not. The process that brings the testbed up joins its
//! cgroup, so everything it starts (the engine in process, `stripelog serve`, fio) does its
//! I/O to the loop devices under the drives' limits; I/O to anything else is not limited.
//!
//! Throttling counts the bios a process submits to the loop device (O_DIRECT I/O is
//! submitted in the caller's context, io_uring's too), so a 1 MiB write costs one I/O of
//! the IOPS limit and 1 MiB of the bandwidth limit, as on a drive.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the cgroup-v1 blkio controller is mounted.
const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";

/// What one emulated drive can do.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct DriveSpeed {
    pub read_bytes_per_second: u64,
    pub write_bytes_per_second: u64,
    pub read_iops: u64,
    pub write_iops: u64,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub drive_count: usize,
    pub drive_size_bytes: u64,
    pub speed: DriveSpeed,
    /// Where the drives' backing files go: a tmpfs, so that the throttle and not a disk is
    /// the limit.
    pub directory: PathBuf,
    /// Write over backing files that already exist and are not empty.
    pub force: bool,
}

/// What a report says about the testbed.
#[derive(Clone, Debug, Serialize)]
pub struct Description {
    pub drives: Vec<String>,
    pub backing_files: Vec<String>,
    pub drive_size_bytes: u64,
    pub speed: DriveSpeed,
    pub cgroup: String,
}

/// A testbed that is up: its loop devices exist and the calling process is in its cgroup.
/// Dropping it takes it down again (the process leaves the cgroup, the loop devices are
/// detached, the backing files removed).
pub struct Testbed {
    options: Options,
    backing_files: Vec<PathBuf>,
    devices: Vec<PathBuf>,
    cgroup: PathBuf,
    joined: bool,
}

impl Testbed {
    /// Bring up `drive_count` drives and join their cgroup.
    pub fn up(options: &Options) -> Result<Testbed, String> {
        if !Path::new(BLKIO_ROOT).join("cgroup.procs").exists() {
            return Err(format!(
                "the testbed needs the cgroup-v1 blkio controller at {BLKIO_ROOT} (throttling per device); this \
                 machine has none"
            ));
        }
        if options.drive_count == 0 || options.drive_size_bytes == 0 {
            return Err("the testbed needs at least one drive of a size above zero".into());
        }
        std::fs::create_dir_all(&options.directory)
            .map_err(|error| format!("{}: {error}", options.directory.display()))?;
        let backing_files: Vec<PathBuf> = (0..options.drive_count)
            .map(|index| options.directory.join(format!("stripelog-testbed-drive-{index}")))
            .collect();
        if !options.force {
            for path in &backing_files {
                crate::target::refuse_existing_data(path)
                    .map_err(|error| format!("testbed drive backing file {error}"))?;
            }
        }
        let cgroup = Path::new(BLKIO_ROOT).join(format!("stripelog-testbed-{}", std::process::id()));
        let mut testbed =
            Testbed { options: options.clone(), backing_files: Vec::new(), devices: Vec::new(), cgroup, joined: false };
        std::fs::create_dir_all(&testbed.cgroup).map_err(|error| format!("{}: {error}", testbed.cgroup.display()))?;
        for path in &backing_files {
            let file = std::fs::File::create(path).map_err(|error| format!("{}: {error}", path.display()))?;
            file.set_len(options.drive_size_bytes).map_err(|error| format!("{}: {error}", path.display()))?;
            testbed.backing_files.push(path.clone());
            let device = attach_loop_device(path)?;
            testbed.devices.push(device.clone());
            testbed.throttle(&device)?;
        }
        testbed.join()?;
        Ok(testbed)
    }

    pub fn devices(&self) -> &[PathBuf] {
        &self.devices
    }

    pub fn describe(&self) -> Description {
        Description {
            drives: self.devices.iter().map(|path| path.display().to_string()).collect(),
            backing_files: self.backing_files.iter().map(|path| path.display().to_string()).collect(),
            drive_size_bytes: self.options.drive_size_bytes,
            speed: self.options.speed,
            cgroup: self.cgroup.display().to_string(),
        }
    }

    fn throttle(&self, device: &Path) -> Result<(), String> {
        let (major, minor) = device_number(device)?;
        let speed = self.options.speed;
        for (file, limit) in [
            ("blkio.throttle.read_bps_device", speed.read_bytes_per_second),
            ("blkio.throttle.write_bps_device", speed.write_bytes_per_second),
            ("blkio.throttle.read_iops_device", speed.read_iops),
            ("blkio.throttle.write_iops_device", speed.write_iops),
        ] {
            if limit == 0 {
                continue;
            }
            let path = self.cgroup.join(file);
            std::fs::write(&path, format!("{major}:{minor} {limit}\n"))
                .map_err(|error| format!("{}: {error}", path.display()))?;
        }
        Ok(())
    }

    /// Move this process (all its threads) into the testbed's cgroup: its I/O to the
    /// drives, and its children's, is throttled from now on.
    fn join(&mut self) -> Result<(), String> {
        let procs = self.cgroup.join("cgroup.procs");
        std::fs::write(&procs, format!("{}\n", std::process::id()))
            .map_err(|error| format!("{}: {error}", procs.display()))?;
        self.joined = true;
        Ok(())
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if self.joined {
            let _ = std::fs::write(Path::new(BLKIO_ROOT).join("cgroup.procs"), format!("{}\n", std::process::id()));
        }
        for device in &self.devices {
            let _ = Command::new("losetup").arg("--detach").arg(device).status();
        }
        for path in &self.backing_files {
            let _ = std::fs::remove_file(path);
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// `losetup --find --show FILE`: the loop device now over `file`.
fn attach_loop_device(file: &Path) -> Result<PathBuf, String> {
    let output = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(file)
        .output()
        .map_err(|error| format!("losetup: {error} (util-linux; the testbed needs root)"))?;
    if !output.status.success() {
        return Err(format!(
            "losetup --find --show {}: {}",
            file.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
}

/// The major and minor numbers of a block device.
fn device_number(device: &Path) -> Result<(u32, u32), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let metadata = std::fs::metadata(device).map_err(|error| format!("{}: {error}", device.display()))?;
    if !metadata.file_type().is_block_device() {
        return Err(format!("{}: not a block device", device.display()));
    }
    Ok((libc::major(metadata.rdev()), libc::minor(metadata.rdev())))
}
