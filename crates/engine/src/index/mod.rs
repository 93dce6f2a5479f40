//! Layer 4: the index: which data-space position holds each logical block, and the
//! checksum that proves each position (docs/on-disk-format.md, "What the engine keeps in
//! RAM").

pub mod map;

pub(crate) mod checksums;
pub(crate) mod directory;
pub(crate) mod lifetimes;
