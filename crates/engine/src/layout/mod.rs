//! Layer 1: where everything lives on the members, and the bytes that say so.
//! Geometry (levels, columns, roles, positions) and the codec of every on-disk structure
//! (docs/on-disk-format.md). Pure functions, no I/O and no policy.

pub mod checkpoint;
pub mod format;
pub mod geometry;
pub mod mapping;
pub mod packed;
pub mod write_log;
