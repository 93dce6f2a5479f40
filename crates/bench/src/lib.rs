//! Benchmarks that print figures (never timed tests). Every figure is a ratio against a
//! limit measured in the same run, because this kind of machine is small and noisy.
//!
//! [`engine::run`] measures stripelog's 4 KiB random writes in process against the
//! members' own sequential O_DIRECT write bandwidth on the same files; [`saturate::run`]
//! writes a volume until the cleaner reaches steady state; [`gc::run`] measures the
//! cleaner's write amplification on in-memory members.
//!
//! The general benchmark (`stripelog bench mix|grid`) drives any [`target`] — a file or
//! block device, an NBD export, the engine in process — with the same workload code in
//! [`run`]; [`grid`] is the seeds' test program on top of it.

pub mod chart;
pub mod compare;
pub mod compressibility;
pub mod dedupability;
pub mod distribution;
pub mod engine;
pub mod gc;
pub mod grid;
pub mod latency;
mod memory;
pub mod nbd_client;
pub mod run;
pub mod saturate;
pub mod saturation;
pub mod scale;
mod side_by_side;
pub mod slow_member;
pub mod suite;
pub mod target;
pub mod testbed;
mod workload;

pub use memory::resident_memory_bytes;

/// Bytes read per call by [`read_blocks`] (a bound on the estimators' buffer; a whole
/// number of 16 KiB units).
const READ_BUFFER_BYTES: usize = 1 << 20;

/// Read `path` (a file, block device or pipe) to its end and hand `each` its blocks a
/// buffer at a time, a partial last block padded with zeros; `progress` gets the bytes
/// read so far after each buffer. The estimators of `bench compressibility` and
/// `bench dedupability` read their inputs through it.
pub(crate) fn read_blocks(
    path: &std::path::Path,
    progress: &dyn Fn(u64),
    mut each: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    use std::io::Read;
    let block = stripelog_engine::BLOCK_SIZE_BYTES;
    let mut file = std::fs::File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let mut buffer = vec![0u8; READ_BUFFER_BYTES];
    let mut read_bytes = 0u64;
    loop {
        let mut filled = 0;
        while filled < buffer.len() {
            match file.read(&mut buffer[filled..]) {
                Ok(0) => break,
                Ok(count) => filled += count,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(format!("{}: {error}", path.display())),
            }
        }
        if filled == 0 {
            return Ok(());
        }
        read_bytes += filled as u64;
        let whole = filled.div_ceil(block) * block;
        buffer[filled..whole].fill(0);
        each(&buffer[..whole])?;
        progress(read_bytes);
        if filled < buffer.len() {
            return Ok(());
        }
    }
}

/// How the engine's index page cache did during a benchmark (`--map-cache`).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct MapCacheUse {
    /// The cache, and the whole index with every page in RAM.
    pub cache_bytes: u64,
    pub whole_index_bytes: u64,
    /// Index pages read back from the log, and evicted, during the open.
    pub page_loads: u64,
    pub page_evictions: u64,
    pub checkpoints: u64,
    /// Where paging spent its time (`info`'s paging lines).
    pub paging: stripelog_engine::PagingStatus,
}

impl MapCacheUse {
    pub fn of(stats: &stripelog_engine::VolumeStats) -> MapCacheUse {
        MapCacheUse {
            cache_bytes: stats.map_cache_bytes,
            whole_index_bytes: (stats.map_bytes_per_logical_block
                * (stats.logical_size_bytes / stripelog_engine::BLOCK_SIZE_BYTES as u64) as f64)
                as u64,
            page_loads: stats.map_page_loads,
            page_evictions: stats.map_page_evictions,
            checkpoints: stats.checkpoints,
            paging: stats.paging,
        }
    }

    /// One line for a report.
    pub fn describe(&self) -> String {
        let paging = &self.paging;
        let per_million = |count: u64| count as f64 * 1e6 / paging.client_blocks_written.max(1) as f64;
        format!(
            "map cache {:.1} MiB of a {:.1} MiB index: {} pages read back ({:.1} s), {} evicted, {} checkpoints \
             ({} for dirty pages), most pages resident {} of {}; per M client blocks: {:.0} page reads, {:.0} pages \
             written by {:.0} checkpoints ({:.1} s); evictor blocked by checkpoints {} and writers {}, kept dirty {}; \
             write lock waited {} times ({:.1} s)",
            self.cache_bytes as f64 / (1 << 20) as f64,
            self.whole_index_bytes as f64 / (1 << 20) as f64,
            self.page_loads,
            paging.page_load_seconds,
            self.page_evictions,
            self.checkpoints,
            paging.checkpoints_for_dirty_pages,
            paging.resident_pages_maximum,
            paging.cache_pages,
            per_million(paging.page_loads),
            per_million(paging.checkpoint_index_pages),
            per_million(paging.checkpoints),
            paging.checkpoint_seconds,
            paging.evictions_blocked_by_checkpoints,
            paging.evictions_blocked_by_writers,
            paging.evictions_kept_dirty,
            paging.write_lock_waits,
            paging.write_lock_wait_seconds
        )
    }
}

/// A size for tables: `512B`, `4KiB`, `1MiB`.
pub fn format_size(bytes: u64) -> String {
    match bytes {
        bytes if bytes >= 1 << 30 && bytes % (1 << 30) == 0 => format!("{}GiB", bytes >> 30),
        bytes if bytes >= 1 << 20 && bytes % (1 << 20) == 0 => format!("{}MiB", bytes >> 20),
        bytes if bytes >= 1 << 10 && bytes % (1 << 10) == 0 => format!("{}KiB", bytes >> 10),
        bytes => format!("{bytes}B"),
    }
}
pub mod flash;
