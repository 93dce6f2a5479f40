//! Benchmarks that print figures (never timed tests). Every figure is a ratio against a
//! limit measured in the same run, because this kind of machine is small and noisy.
//!
//! [`engine::run`] measures stripelog's 4 KiB random writes in process against the
//! members' own sequential O_DIRECT write bandwidth on the same files; [`saturate::run`]
//! writes a volume until the cleaner reaches steady state; [`gc::run`] measures the
//! cleaner's write amplification on in-memory members.

pub mod engine;
pub mod gc;
mod memory;
pub mod saturate;
mod workload;

pub use memory::resident_memory_bytes;
