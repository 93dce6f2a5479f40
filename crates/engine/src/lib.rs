//! The stripelog engine: a log-structured, checksummed, full-stripe RAID block store.
//!
//! Writes are copied into an in-memory *batch*, laid out exactly as it will sit on the
//! members; a sealed batch is written as one stripe (every member at once, parity over
//! what it holds), never over live data. Every batch carries summaries (sequence number,
//! logical address and CRC32C of every block) from which [`Volume::open`] rebuilds the
//! map, keeping exactly an ordered prefix of the accepted writes (docs/crash-consistency.md).
//!
//! Main types: [`Volume`] (create, open, read, write, flush, trim, write-zeroes, stats,
//! check, close), [`Geometry`] and [`RaidLevel`] (layout), [`VolumeStats`] and
//! [`CheckReport`] (reports). The engine knows nothing about sockets, NBD or the CLI; it
//! talks to members only through `stripelog_blockdev::BlockDevice`.
//!
//! See [`Volume`] for a runnable example.

mod batch;
mod cache;
pub mod cleaner;
pub mod error;
pub mod format;
pub mod geometry;
mod hedge;
pub mod identity;
pub mod map;
mod members;
pub mod parity;
mod pipeline;
mod recovery;
pub mod resilience;
pub mod stats;
mod volume;

pub use cleaner::CleaningPolicy;
pub use error::{Error, Result};
pub use geometry::{Geometry, RaidLevel, BLOCK_SIZE_BYTES, WORKING_SPARE_SEGMENTS};
pub use map::Mapping;
pub use recovery::CheckReport;
pub use resilience::{MaintenanceOptions, MaintenanceProgress, RebuildReport, ReplaceOptions, ScrubReport};
pub use stats::{RecoveryReport, VolumeStats};
pub use volume::{
    CreateOptions, IoMode, MemberDevice, OpenOptions, Volume, DEFAULT_FLUSH_INTERVAL, DEFAULT_WRITE_QUEUE_BYTES,
    SECTOR_SIZE_BYTES, WRITE_QUEUE_BATCHES_MAXIMUM,
};
