//! An NBD server for stripelog volumes.
//!
//! `protocol` holds the constants, `codec` parses and builds every message without I/O,
//! and `server` runs connections: the fixed newstyle handshake (EXPORT_NAME, GO, INFO,
//! LIST, ABORT, STARTTLS, STRUCTURED_REPLY, LIST/SET_META_CONTEXT with `base:allocation`) and then
//! transmission with many requests in flight and replies out of order. The server knows
//! volumes only through `stripelog_engine::Volume`; the engine knows nothing of NBD.

pub mod codec;
pub mod fair_share;
pub mod metrics;
pub mod protocol;
pub mod server;
pub mod tls;

pub use metrics::ExportMetrics;
pub use server::{Export, Server, ServerStatistics};
pub use tls::{TlsMode, TlsSettings, TlsSetupError};
