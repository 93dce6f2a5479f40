//! Who a device is before anything is written to it, and who holds a volume
//! (docs/data-safety.md): the look `create` and `replace` take at a device, the holder
//! record of a read-write open, and the dates they are reported with.

use crate::error::{FoundContent, SuperblockCopyProblem};
use crate::layout::format::{Holder, Superblock, SUPERBLOCK_OFFSETS_BYTES};
use crate::layout::geometry::BLOCK_SIZE_BYTES;
use stripelog_blockdev::{AlignedBuffer, BlockDevice, DeviceError};

/// How much of each end of a device is read to tell whether it holds data: partition
/// tables, file system and RAID superblocks all live in the first or the last MiB.
pub const INSPECTED_BYTES: u64 = 1 << 20;

/// What a device holds, as far as `create` and `replace` need to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceContent {
    /// Zeros in the first and last [`INSPECTED_BYTES`], and no stripelog superblock.
    Empty,
    /// A valid stripelog superblock (the newer of its two copies).
    Member(Box<Superblock>),
    /// A non-zero byte at `offset_bytes` (within the first or last MiB).
    Data { offset_bytes: u64 },
}

impl DeviceContent {
    /// What `create` or `replace` reports it found, when the device is not empty.
    pub fn found(&self) -> Option<FoundContent> {
        match self {
            DeviceContent::Empty => None,
            DeviceContent::Member(superblock) => Some(FoundContent::Member {
                member_index: superblock.member_index,
                volume: uuid::Uuid::from_bytes(superblock.volume_uuid),
                raid_level: superblock.raid_level.name(),
                member_count: superblock.member_count,
                created_unix_seconds: superblock.created_unix_seconds,
            }),
            DeviceContent::Data { offset_bytes } => Some(FoundContent::Data { offset_bytes: *offset_bytes }),
        }
    }

    /// "holds member 2 of stripelog volume … (RAID-5 on 5 members, created …)" or "holds
    /// data (a non-zero byte at offset 512)".
    pub fn describe(&self) -> String {
        match self.found() {
            None => "is empty".to_string(),
            Some(found) => found.to_string(),
        }
    }
}

/// Both superblock copies of `device`: the newer of the valid ones (by epoch and update
/// sequence), and what is wrong with each copy that is not valid. The only reader of them.
pub(crate) fn read_newest_superblock(device: &dyn BlockDevice) -> (Option<Superblock>, Vec<SuperblockCopyProblem>) {
    let mut problems = Vec::new();
    let mut newest: Option<Superblock> = None;
    let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
    for (copy, &offset) in SUPERBLOCK_OFFSETS_BYTES.iter().enumerate() {
        if device.size_bytes() < offset + BLOCK_SIZE_BYTES as u64 {
            problems.push(SuperblockCopyProblem::TooSmall { copy });
            continue;
        }
        if let Err(error) = device.read_at(&mut block, offset) {
            problems.push(SuperblockCopyProblem::Unreadable { copy, error });
            continue;
        }
        match Superblock::decode(&block, copy as u32) {
            Ok(superblock) => {
                if newest.as_ref().is_none_or(|current| superblock.is_newer_than(current)) {
                    newest = Some(superblock);
                }
            }
            Err(problem) => problems.push(SuperblockCopyProblem::Invalid { copy, problem }),
        }
    }
    (newest, problems)
}

/// Read both superblock copies and both ends of `device`; writes nothing. A copy that
/// cannot be read lies in the first MiB, whose read then reports the error.
pub fn inspect(device: &dyn BlockDevice) -> Result<DeviceContent, DeviceError> {
    let size_bytes = device.size_bytes();
    if let (Some(superblock), _) = read_newest_superblock(device) {
        return Ok(DeviceContent::Member(Box::new(superblock)));
    }
    let head_bytes = INSPECTED_BYTES.min(size_bytes);
    let tail_start = size_bytes.saturating_sub(INSPECTED_BYTES).max(head_bytes);
    for (start, end) in [(0, head_bytes), (tail_start, size_bytes)] {
        if end <= start {
            continue;
        }
        let mut buffer = AlignedBuffer::zeroed((end - start) as usize);
        device.read_at(&mut buffer, start)?;
        if let Some(index) = buffer.iter().position(|&byte| byte != 0) {
            return Ok(DeviceContent::Data { offset_bytes: start + index as u64 });
        }
    }
    Ok(DeviceContent::Empty)
}

/// The holder record of a read-write open starting now in this process.
pub(crate) fn holder_now(program: &str) -> Holder {
    Holder {
        open: true,
        process_id: std::process::id(),
        opened_unix_seconds: now_unix_seconds(),
        closed_unix_seconds: 0,
        host: host_name(),
        program: program.to_string(),
    }
}

/// The name of this host (empty when it cannot be read).
pub fn host_name() -> String {
    const HOST_NAME_MAXIMUM_BYTES: usize = 256;
    let mut buffer = [0u8; HOST_NAME_MAXIMUM_BYTES];
    // SAFETY: gethostname writes at most `buffer.len()` bytes into `buffer`, which is
    // alive and exclusively borrowed for the call.
    let status = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if status != 0 {
        return String::new();
    }
    let length = buffer.iter().position(|&byte| byte == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..length]).into_owned()
}

/// The program name recorded as the holder when the caller gives none: this
/// executable's file name.
pub fn default_program() -> String {
    std::env::args()
        .next()
        .and_then(|path| std::path::Path::new(&path).file_name().map(|name| name.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "stripelog".to_string())
}

pub(crate) fn now_unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

pub use crate::error::format_unix_seconds;

/// One line on a holder record: "OPEN: stripelog serve, pid 4242 on host db1 since …"
/// or "closed cleanly at … (last opened by …)".
pub fn describe_holder(holder: &Holder) -> String {
    holder.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use stripelog_blockdev::MemoryDevice;

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(format_unix_seconds(1), "1970-01-01 00:00:01 UTC");
        assert_eq!(format_unix_seconds(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_unix_seconds(1_795_462_802), "2026-11-23 19:40:02 UTC");
        assert_eq!(format_unix_seconds(0), "never");
    }

    #[test]
    fn inspection_finds_data_at_either_end_and_nothing_in_between() {
        let device = MemoryDevice::new(8 << 20);
        assert_eq!(inspect(&device).unwrap(), DeviceContent::Empty);
        let mut block = AlignedBuffer::zeroed(BLOCK_SIZE_BYTES);
        // The middle is not looked at.
        block[7] = 1;
        device.write_at(&block, 4 << 20).unwrap();
        assert_eq!(inspect(&device).unwrap(), DeviceContent::Empty);
        device.write_at(&block, (8 << 20) - 4096).unwrap();
        assert_eq!(inspect(&device).unwrap(), DeviceContent::Data { offset_bytes: (8 << 20) - 4096 + 7 });
        block[7] = 0;
        block[100] = 0xFF;
        device.write_at(&block, 512 << 10).unwrap();
        let found = inspect(&device).unwrap();
        assert_eq!(found, DeviceContent::Data { offset_bytes: (512 << 10) + 100 });
        assert!(found.describe().contains("non-zero byte at offset 524388"), "{}", found.describe());
        // A device smaller than the inspected ends is read once, whole.
        let small = MemoryDevice::new(64 << 10);
        small.write_at(&block, 60 << 10).unwrap();
        assert_eq!(inspect(&small).unwrap(), DeviceContent::Data { offset_bytes: (60 << 10) + 100 });
    }
}
