//! The engine's error type. Lower-level errors are wrapped as variants; every variant
//! says what failed and, where it applies, which member.

use stripelog_blockdev::DeviceError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid geometry: {0}")]
    InvalidGeometry(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("member {member} ({path}): {reason}")]
    Member { member: usize, path: String, reason: String },
    #[error("member {member}: {source}")]
    Device { member: usize, source: DeviceError },
    #[error("I/O error: logical block {logical_block} cannot be read or rebuilt ({reason})")]
    Unrecoverable { logical_block: u64, reason: String },
    #[error(
        "the volume is full: no free segment, and cleaning cannot make one (every used segment is live; trim or \
         delete data, or create the volume with a larger spare)"
    )]
    OutOfSpace,
    /// `create` or `replace` found data or a volume on a device it would overwrite.
    #[error("member {member} ({path}) {found}: refusing to overwrite it unless forced")]
    WouldDestroy { member: usize, path: String, found: String },
    /// The volume is recorded as open read-write on another host and was not closed there.
    #[error(
        "volume {volume} is open on host {host} ({holder}) and was not closed there: it may be in use; if {host} \
         is down and nothing else uses the members, open it with force"
    )]
    HeldByAnotherHost { volume: String, host: String, holder: String },
    #[error("the volume is read-only")]
    ReadOnly,
    #[error("too many members are missing or failed for {level}: {reason}")]
    TooManyFailures { level: String, reason: String },
    #[error("the volume was shut down after a failed member write: {0}")]
    Failed(String),
    #[error("the volume is closed")]
    Closed,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The nearest POSIX errno, for front ends (NBD) that speak errno.
    pub fn errno(&self) -> i32 {
        match self {
            Error::InvalidGeometry(_) | Error::InvalidRequest(_) => 22, // EINVAL
            Error::OutOfSpace => 28,                                    // ENOSPC
            Error::ReadOnly => 1,                                       // EPERM
            Error::Closed => 108,                                       // ESHUTDOWN
            _ => 5,                                                     // EIO
        }
    }
}
