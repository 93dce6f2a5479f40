//! The stripelog engine: a log-structured, checksummed, full-stripe RAID block store.
//!
//! Writes are copied into an in-memory *batch*, laid out exactly as it will sit on the
//! members; a sealed batch is written as one stripe (every member at once, parity over
//! what it holds), never over live data. Every batch carries summaries (sequence number,
//! logical address and CRC32C of every block) from which [`Volume::open`] rebuilds the
//! map, keeping exactly an ordered prefix of the accepted writes (docs/crash-consistency.md).
//!
//! The engine is built in layers, each depending only on the ones before it
//! (ARCHITECTURE.md, "The engine's layers"): [`layout`] → [`array`] → `log` → [`index`]
//! → `space` → `io` → [`cleaner`] → `mount` → [`maintenance`] → [`Volume`].
//!
//! Main types: [`Volume`] (create, open, read, write, flush, trim, write-zeroes, stats,
//! check, close), [`Geometry`] and [`RaidLevel`] (layout), [`VolumeStats`] and
//! [`CheckReport`] (reports). The engine knows nothing about sockets, NBD or the CLI; it
//! talks to members only through `stripelog_blockdev::BlockDevice`.
//!
//! See [`Volume`] for a runnable example.

pub mod error;
pub mod stats;

pub mod array;
mod checkpoint;
pub mod cleaner;
pub mod index;
mod io;
pub mod layout;
mod log;
pub mod maintenance;
mod mount;
pub mod queue;
mod space;
mod volume;
mod write_lock;
mod write_log;

pub use array::{identity, parity};
pub use index::map;
pub use layout::{format, geometry};

pub use array::members::{CreateOptions, MemberDevice};
pub use cleaner::CleaningPolicy;
pub use error::{Error, Result};
pub use geometry::{Geometry, RaidLevel, BLOCK_SIZE_BYTES};
/// The deduplication finder's sparse-index sampling (one name in 2^bits): the default and
/// the most `OpenOptions::dedup_sampling_bits` takes.
pub use index::names::{
    DEFAULT_SAMPLING_BITS as DEDUP_SAMPLING_BITS_DEFAULT, SAMPLING_BITS_MAXIMUM as DEDUP_SAMPLING_BITS_MAXIMUM,
};
pub use io::read_queue::{CompletedRead, ReadQueue};
pub use log::IoMode;
pub use maintenance::{MaintenanceOptions, MaintenanceProgress, RebuildReport, ReplaceOptions, ScrubReport};
pub use map::Mapping;
pub use mount::{check_status, CheckReport, SharedReferenceCheck};
pub use space::{checkpoint_headroom_segments, watermarks, working_spare_segments, CLEANING_RESERVE_SEGMENTS};
pub use stats::{MemberStatus, PagingStatus, RecoveryReport, VolumeStats, WriteAmplification, WriteLogStatus};
pub use volume::{
    OpenOptions, Volume, WriteLogDevices, DEFAULT_FLUSH_INTERVAL, DEFAULT_WRITE_QUEUE_BYTES, SECTOR_SIZE_BYTES,
    WRITE_QUEUE_BATCHES_MAXIMUM,
};
pub use write_log::LOG_MIRRORS_MAXIMUM;
