//! Layer 2: the members as one redundant array. Member slots and their state, the
//! superblock store (create, the checks at open, updates), verified and reconstructing
//! reads, hedged reads of lagging members, parity, and what a device holds before it is
//! written (identity). Knows nothing of batches, the map or how segments are used.

pub(crate) mod hedge;
pub mod identity;
pub(crate) mod members;
pub mod parity;
