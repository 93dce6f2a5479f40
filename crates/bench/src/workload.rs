//! What the benchmarks' workloads share: incompressible data for writes, without
//! generating it on the hot path (a pool of random bytes from which each write takes a
//! window at a random offset), and Zipf-distributed ranks.

use stripelog_blockdev::Prng;

/// Size of the random pool: large enough that windows rarely repeat within a cache.
const RANDOM_POOL_SIZE_BYTES: usize = 64 << 20;

pub struct RandomData {
    pool: Vec<u8>,
}

impl RandomData {
    pub fn new(seed: u64) -> Self {
        let mut pool = vec![0u8; RANDOM_POOL_SIZE_BYTES];
        Prng::new(seed).fill(&mut pool);
        RandomData { pool }
    }

    /// `length_bytes` of random data starting at a random 512-byte aligned offset.
    pub fn window(&self, prng: &mut Prng, length_bytes: usize) -> &[u8] {
        let slots = (self.pool.len() - length_bytes) / 512;
        let start = prng.below(slots as u64) as usize * 512;
        &self.pool[start..start + length_bytes]
    }
}

/// Ranks 0..n drawn with weights 1/(rank+1)^exponent, by inverting the cumulative weights
/// (a binary search per draw). Built once per run and shared by its workers.
pub struct ZipfRanks {
    cumulative: Vec<f64>,
}

impl ZipfRanks {
    /// `ranks` at least 1.
    pub fn new(ranks: u64, exponent: f64) -> ZipfRanks {
        let mut total = 0.0;
        let cumulative = (1..=ranks.max(1))
            .map(|rank| {
                total += 1.0 / (rank as f64).powf(exponent);
                total
            })
            .collect();
        ZipfRanks { cumulative }
    }

    pub fn len(&self) -> u64 {
        self.cumulative.len() as u64
    }

    pub fn sample(&self, prng: &mut Prng) -> u64 {
        let total = *self.cumulative.last().expect("at least one rank");
        let target = (prng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let rank = self.cumulative.partition_point(|&weight| weight < target);
        rank.min(self.cumulative.len() - 1) as u64
    }
}
