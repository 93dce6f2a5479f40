//! One opener per member (docs/data-safety.md, "Exclusive access").
//!
//! Every [`crate::FileDevice`] claims its file or device before anything is read from
//! it: an entry in a process-wide table of open members (so the same member given twice
//! in one process — one path twice, two exports, a symlink — is refused with a message
//! saying where it is already in use), then a non-blocking `flock`, exclusive for a
//! writer and shared for a reader (so another process is refused, and told which one holds
//! it). Both are released when the device is dropped; the kernel drops the lock when the
//! process dies, however it dies.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What identifies a member whatever name it is opened by: a block device by its device
/// number (every node and symlink of one disk), anything else by its file system's device
/// and inode (hard links and symlinks of one file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum MemberKey {
    BlockDevice { device_number: u64 },
    File { file_system: u64, inode: u64 },
}

/// Members open in this process, with the path they were opened by.
static OPEN_MEMBERS: Mutex<BTreeMap<MemberKey, String>> = Mutex::new(BTreeMap::new());

/// Why a member cannot be claimed.
#[derive(Debug)]
pub(crate) enum ClaimError {
    /// Held elsewhere: in this process, by another process, or by the kernel.
    InUse(String),
    /// The lock could not be taken for another reason (the file system has no locks).
    Lock(io::Error),
}

/// A claimed member: its entry in the table of open members, removed on drop. The lock
/// itself belongs to the open file and goes with it.
#[derive(Debug)]
pub(crate) struct MemberClaim {
    key: MemberKey,
}

impl Drop for MemberClaim {
    fn drop(&mut self) {
        open_members().remove(&self.key);
    }
}

fn open_members() -> std::sync::MutexGuard<'static, BTreeMap<MemberKey, String>> {
    // A panic while holding this lock cannot leave the table inconsistent (one insert or
    // remove): keep using it.
    OPEN_MEMBERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Claim the member open as `file` (opened by `path`): exclusively for a writer, shared
/// for a reader.
pub(crate) fn claim(file: &File, path: &Path, writer: bool) -> Result<MemberClaim, ClaimError> {
    let metadata = file.metadata().map_err(ClaimError::Lock)?;
    let key = if metadata.file_type().is_block_device() {
        MemberKey::BlockDevice { device_number: metadata.rdev() }
    } else {
        MemberKey::File { file_system: metadata.dev(), inode: metadata.ino() }
    };
    {
        let mut table = open_members();
        if let Some(other) = table.get(&key) {
            let how = if Path::new(other) == path { String::new() } else { format!(" as {other}") };
            return Err(ClaimError::InUse(format!(
                "it is already open in this process{how}: a member can be used once (the same path twice, \
                 two exports of one volume, or a link to another member)"
            )));
        }
        table.insert(key, path.display().to_string());
    }
    let claim = MemberClaim { key };
    let operation = if writer { libc::LOCK_EX } else { libc::LOCK_SH };
    // A process that died with I/O in flight (a SIGKILLed server whose io_uring still has
    // writes in the kernel's workers) keeps its lock until the kernel has finished that
    // I/O and closed its files, shortly after the process is reaped. /proc/locks then
    // names a pid that no longer runs (or 0): such a lock is waited for, for a bounded
    // time, so a restart straight after a crash opens the volume. A lock whose holder
    // runs is refused at once.
    let deadline = Instant::now() + EXITED_HOLDER_RELEASE_WAIT;
    loop {
        // SAFETY: flock takes a file descriptor and flags only; the descriptor belongs to
        // `file`, which is open for the whole call.
        let status = unsafe { libc::flock(file.as_raw_fd(), operation | libc::LOCK_NB) };
        if status == 0 {
            return Ok(claim);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(ClaimError::Lock(error));
        }
        match lock_holder(&metadata) {
            Some(holder) => return Err(ClaimError::InUse(holder)),
            None if Instant::now() < deadline => std::thread::sleep(EXITED_HOLDER_POLL_INTERVAL),
            None => {
                return Err(ClaimError::InUse(format!(
                    "it is in use by another process (it holds the member's lock; the process that took it is \
                     not running or not visible here, and the lock was not released within {} s, as the lock \
                     of a process that has exited would be)",
                    EXITED_HOLDER_RELEASE_WAIT.as_secs()
                )))
            }
        }
    }
}

/// How long a lock whose holder no longer runs (it has exited, its files not yet closed by
/// the kernel) is waited for before the member is refused.
const EXITED_HOLDER_RELEASE_WAIT: Duration = Duration::from_secs(5);
/// How often the lock is tried again meanwhile.
const EXITED_HOLDER_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Who holds a lock on the file with `metadata`, from /proc/locks and the holder's
/// command line: "in use by pid 4242: stripelog serve d/m0 ..."; `None` when no holder
/// runs (it has exited or is a zombie, or lives in a pid namespace this process cannot
/// see: /proc/locks then shows 0).
fn lock_holder(metadata: &std::fs::Metadata) -> Option<String> {
    let holders = std::fs::read_to_string("/proc/locks")
        .map(|locks| lock_holder_pids(&locks, metadata.dev(), metadata.ino()))
        .unwrap_or_default();
    let own = std::process::id();
    // This process's own lock through another open file: what another process is to us.
    if holders.contains(&own) {
        return Some("it is in use by another process (it holds the member's lock)".to_string());
    }
    // A holder that has exited (its pid gone, or a zombie) has no command line.
    holders.into_iter().filter(|&pid| pid != 0).find_map(|pid| {
        let command = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let words: Vec<String> = command
            .split(|&byte| byte == 0)
            .filter(|part| !part.is_empty())
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect();
        if words.is_empty() {
            return None;
        }
        const COMMAND_SHOWN_MAXIMUM_CHARACTERS: usize = 160;
        let command: String = words.join(" ").chars().take(COMMAND_SHOWN_MAXIMUM_CHARACTERS).collect();
        Some(format!("it is in use by another process (pid {pid}: {command})"))
    })
}

/// The pids holding `flock`/POSIX locks on inode `inode` of file system `file_system` in
/// the text of /proc/locks (`1: FLOCK  ADVISORY  WRITE 4242 08:02:1234 0 EOF`; waiters
/// are marked `->` and skipped).
fn lock_holder_pids(locks: &str, file_system: u64, inode: u64) -> Vec<u32> {
    let wanted = format!("{:02x}:{:02x}:{inode}", libc::major(file_system), libc::minor(file_system));
    locks
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(1) == Some(&"->") {
                return None;
            }
            // id, type, advisory, mode, pid, device:inode, start, end
            (fields.get(5) == Some(&wanted.as_str())).then(|| fields.get(4)?.parse().ok())?
        })
        .collect()
}

/// Whether opening `path` for writing should add O_EXCL: block devices only, where the
/// kernel then refuses the open while the device is mounted, claimed by md/dm or opened
/// exclusively by anyone else.
pub(crate) fn wants_exclusive_open(path: &Path, writer: bool) -> bool {
    writer && std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_block_device())
}

/// The message for an O_EXCL open refused with EBUSY.
pub(crate) fn busy_block_device() -> String {
    "it is in use by the kernel or another program (mounted, part of an md/dm array, or opened exclusively)".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_holders_are_read_from_proc_locks_lines() {
        let file_system = libc::makedev(8, 2);
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 08:02:1234 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 77 08:02:1234 0 EOF\n\
                     2: POSIX  ADVISORY  READ 99 08:02:9999 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 5 00:2e:1234 0 EOF\n";
        assert_eq!(lock_holder_pids(locks, file_system, 1234), vec![4242]);
        assert_eq!(lock_holder_pids(locks, file_system, 9999), vec![99]);
        assert!(lock_holder_pids(locks, file_system, 1).is_empty());
    }
}
