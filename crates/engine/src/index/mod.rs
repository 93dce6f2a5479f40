//! Layer 4: the index: which data-space position holds each logical block, and the
//! checksum that proves each position (docs/on-disk-format.md, "What the engine keeps in
//! RAM"), and the names that find duplicate blocks (docs/deduplication.md).

pub mod map;
pub mod names;

pub(crate) mod checksums;
pub(crate) mod directory;
pub(crate) mod lifetimes;
