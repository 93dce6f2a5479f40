//! Incompressible data for writes, without generating it on the hot path: a pool of
//! random bytes from which each write takes a window at a random offset.

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
