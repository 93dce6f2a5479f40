//! Request metrics of one export, kept with relaxed atomic adds only (no lock on the I/O
//! path): per command, the requests, their bytes and a latency histogram; errors by kind.
//! The caller renders them (`stripelog serve --metrics`, in Prometheus text format).

use crate::protocol::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in nanoseconds (a last bucket takes the rest):
/// from a request served from memory (25 µs) to one that waited on a member for seconds.
pub const LATENCY_BUCKET_BOUNDS_NANOSECONDS: [u64; 16] = [
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
];
const BUCKETS: usize = LATENCY_BUCKET_BOUNDS_NANOSECONDS.len() + 1;

/// The commands counted, by their name in metrics.
pub const COMMAND_NAMES: [&str; 7] = ["read", "write", "flush", "trim", "write_zeroes", "cache", "block_status"];

/// The errors counted, by their name in metrics (the protocol's errno values).
pub const ERROR_NAMES: [&str; 8] = ["EPERM", "EIO", "ENOMEM", "EINVAL", "ENOSPC", "EOVERFLOW", "ENOTSUP", "ESHUTDOWN"];
const ERROR_VALUES: [u32; 8] = [
    ERROR_PERMISSION,
    ERROR_IO,
    ERROR_NO_MEMORY,
    ERROR_INVALID,
    ERROR_NO_SPACE,
    ERROR_OVERFLOW,
    ERROR_NOT_SUPPORTED,
    ERROR_SHUTDOWN,
];

#[derive(Default)]
pub struct CommandMetrics {
    requests: AtomicU64,
    bytes: AtomicU64,
    /// Requests per bucket (not cumulative), the last one above every bound.
    latency_buckets: [AtomicU64; BUCKETS],
    latency_sum_nanoseconds: AtomicU64,
}

/// What a scrape sees of one command.
pub struct CommandSnapshot {
    pub name: &'static str,
    pub requests: u64,
    pub bytes: u64,
    /// Requests within each bound (in seconds) and above the one
    /// before (not cumulative: the Prometheus encoder sums them); `latency_count` also
    /// counts those above the last bound.
    pub latency_buckets: Vec<(f64, u64)>,
    pub latency_count: u64,
    pub latency_sum_seconds: f64,
}

/// The metrics of one export.
#[derive(Default)]
pub struct ExportMetrics {
    commands: [CommandMetrics; COMMAND_NAMES.len()],
    errors: [AtomicU64; ERROR_NAMES.len()],
    /// Errors whose value is none of the protocol's (never sent: counted to be seen).
    other_errors: AtomicU64,
    /// Connections to this export now open.
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
}

fn command_index(command: u16) -> Option<usize> {
    match command {
        COMMAND_READ => Some(0),
        COMMAND_WRITE => Some(1),
        COMMAND_FLUSH => Some(2),
        COMMAND_TRIM => Some(3),
        COMMAND_WRITE_ZEROES => Some(4),
        COMMAND_CACHE => Some(5),
        COMMAND_BLOCK_STATUS => Some(6),
        _ => None,
    }
}

impl ExportMetrics {
    /// One request of `command` over `bytes`, answered `elapsed` after it was read.
    pub fn record(&self, command: u16, bytes: u64, elapsed: Duration) {
        let Some(index) = command_index(command) else { return };
        let metrics = &self.commands[index];
        let nanoseconds = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        let bucket = LATENCY_BUCKET_BOUNDS_NANOSECONDS.partition_point(|&bound| bound < nanoseconds);
        metrics.requests.fetch_add(1, Ordering::Relaxed);
        metrics.bytes.fetch_add(bytes, Ordering::Relaxed);
        metrics.latency_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        metrics.latency_sum_nanoseconds.fetch_add(nanoseconds, Ordering::Relaxed);
    }

    /// An error reply with the protocol's `error` value.
    pub fn record_error(&self, error: u32) {
        match ERROR_VALUES.iter().position(|&value| value == error) {
            Some(index) => self.errors[index].fetch_add(1, Ordering::Relaxed),
            None => self.other_errors.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Error replies with the protocol's `error` value so far (0 for a value not counted
    /// on its own).
    pub fn error_count(&self, error: u32) -> u64 {
        ERROR_VALUES
            .iter()
            .position(|&value| value == error)
            .map_or(0, |index| self.errors[index].load(Ordering::Relaxed))
    }

    pub fn commands(&self) -> Vec<CommandSnapshot> {
        COMMAND_NAMES
            .iter()
            .zip(&self.commands)
            .map(|(&name, metrics)| {
                let latency_buckets: Vec<(f64, u64)> = LATENCY_BUCKET_BOUNDS_NANOSECONDS
                    .iter()
                    .zip(&metrics.latency_buckets)
                    .map(|(&bound, count)| (bound as f64 / 1e9, count.load(Ordering::Relaxed)))
                    .collect();
                let latency_count = latency_buckets.iter().map(|(_, count)| count).sum::<u64>()
                    + metrics.latency_buckets[BUCKETS - 1].load(Ordering::Relaxed);
                CommandSnapshot {
                    name,
                    requests: metrics.requests.load(Ordering::Relaxed),
                    bytes: metrics.bytes.load(Ordering::Relaxed),
                    latency_buckets,
                    latency_count,
                    latency_sum_seconds: metrics.latency_sum_nanoseconds.load(Ordering::Relaxed) as f64 / 1e9,
                }
            })
            .collect()
    }

    /// Errors by name, the protocol's values first, then "other".
    pub fn errors(&self) -> Vec<(&'static str, u64)> {
        let mut errors: Vec<(&'static str, u64)> =
            ERROR_NAMES.iter().zip(&self.errors).map(|(&name, count)| (name, count.load(Ordering::Relaxed))).collect();
        errors.push(("other", self.other_errors.load(Ordering::Relaxed)));
        errors
    }

    /// Count a connection open until the guard is dropped.
    pub fn connection_opened(&self) -> OpenConnection<'_> {
        self.connections_open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(self)
    }

    pub fn requests_total(&self) -> u64 {
        self.commands.iter().map(|metrics| metrics.requests.load(Ordering::Relaxed)).sum()
    }
}

/// A connection counted in `connections_open` until dropped.
pub struct OpenConnection<'a>(&'a ExportMetrics);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_land_in_their_command_and_latency_bucket_and_errors_by_kind() {
        let metrics = ExportMetrics::default();
        metrics.record(COMMAND_WRITE, 4096, Duration::from_micros(30));
        metrics.record(COMMAND_WRITE, 4096, Duration::from_millis(3));
        metrics.record(COMMAND_READ, 8192, Duration::from_secs(10));
        metrics.record(COMMAND_DISCONNECT, 0, Duration::ZERO);
        metrics.record_error(ERROR_NO_SPACE);
        metrics.record_error(9999);
        let commands = metrics.commands();
        let write = &commands[1];
        assert_eq!((write.name, write.requests, write.bytes, write.latency_count), ("write", 2, 8192, 2));
        // 30 µs is above 25 µs, within 50 µs; 3 ms within 5 ms.
        let at = |bound: f64| write.latency_buckets.iter().find(|(b, _)| *b == bound).unwrap().1;
        assert_eq!((at(25e-6), at(50e-6), at(2.5e-3), at(5e-3), at(2.5)), (0, 1, 0, 1, 0));
        assert!((write.latency_sum_seconds - 0.00303).abs() < 1e-9);
        // Beyond the last bound: counted, in no finite bucket.
        let read = &commands[0];
        assert_eq!((read.latency_count, read.latency_buckets.iter().map(|(_, count)| count).sum::<u64>()), (1, 0));
        assert_eq!(metrics.requests_total(), 3);
        let errors = metrics.errors();
        assert!(errors.contains(&("ENOSPC", 1)) && errors.contains(&("other", 1)) && errors.contains(&("EIO", 0)));
        assert_eq!((metrics.error_count(ERROR_NO_SPACE), metrics.error_count(ERROR_IO)), (1, 0));
    }
}
