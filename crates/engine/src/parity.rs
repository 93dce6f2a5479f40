//! Redundancy over the data columns of a batch: XOR for RAID-5, Reed–Solomon P+Q for
//! RAID-6 (`reed-solomon-simd`, which codes every 64-byte piece of a shard on its own, so
//! one 4 KiB row can be rebuilt from the same 4 KiB of the other shards).

use crate::geometry::RaidLevel;
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

/// XOR `source` into `target` (same length), a machine word at a time.
pub fn xor_into(target: &mut [u8], source: &[u8]) {
    debug_assert_eq!(target.len(), source.len());
    let mut target_words = target.chunks_exact_mut(8);
    let mut source_words = source.chunks_exact(8);
    for (target_word, source_word) in (&mut target_words).zip(&mut source_words) {
        let value = u64::from_ne_bytes(target_word.try_into().expect("8 bytes"))
            ^ u64::from_ne_bytes(source_word.try_into().expect("8 bytes"));
        target_word.copy_from_slice(&value.to_ne_bytes());
    }
    for (target_byte, source_byte) in target_words
        .into_remainder()
        .iter_mut()
        .zip(source_words.remainder())
    {
        *target_byte ^= source_byte;
    }
}

/// Compute the parity shards of `data` (one slice per data column, equal lengths) into
/// `parity` (one slice per parity shard). Nothing to do for RAID-0 and RAID-10.
pub fn compute(level: RaidLevel, data: &[&[u8]], parity: &mut [&mut [u8]]) {
    match level {
        RaidLevel::Raid0 | RaidLevel::Raid10 => debug_assert!(parity.is_empty()),
        RaidLevel::Raid5 => {
            let target = &mut parity[0];
            target.copy_from_slice(data[0]);
            for column in &data[1..] {
                xor_into(target, column);
            }
        }
        RaidLevel::Raid6 => {
            let shard_bytes = data[0].len();
            let mut encoder = ReedSolomonEncoder::new(data.len(), 2, shard_bytes)
                .expect("RAID-6 codec parameters are validated by Geometry");
            for column in data {
                encoder
                    .add_original_shard(column)
                    .expect("equal shard sizes");
            }
            let result = encoder.encode().expect("all original shards added");
            for (target, recovery) in parity.iter_mut().zip(result.recovery_iter()) {
                target.copy_from_slice(recovery);
            }
        }
    }
}

/// Rebuild data column `wanted` of one row from the other shards of that row.
/// `data[c]` is column c's block when it was read and verified, `parity[p]` likewise.
/// Returns `None` when too few shards are available.
pub fn reconstruct(
    level: RaidLevel,
    data: &[Option<&[u8]>],
    parity: &[Option<&[u8]>],
    wanted: usize,
) -> Option<Vec<u8>> {
    match level {
        RaidLevel::Raid0 | RaidLevel::Raid10 => None,
        RaidLevel::Raid5 => {
            let mut rebuilt = parity[0]?.to_vec();
            for (column, block) in data.iter().enumerate() {
                if column != wanted {
                    xor_into(&mut rebuilt, (*block)?);
                }
            }
            Some(rebuilt)
        }
        RaidLevel::Raid6 => {
            let shard_bytes = parity.iter().chain(data.iter()).flatten().next()?.len();
            let mut decoder = ReedSolomonDecoder::new(data.len(), 2, shard_bytes).ok()?;
            for (column, block) in data.iter().enumerate() {
                if let (Some(block), true) = (block, column != wanted) {
                    decoder.add_original_shard(column, block).ok()?;
                }
            }
            for (shard, block) in parity.iter().enumerate() {
                if let Some(block) = block {
                    decoder.add_recovery_shard(shard, block).ok()?;
                }
            }
            let result = decoder.decode().ok()?;
            let rebuilt = result.restored_original(wanted).map(<[u8]>::to_vec);
            rebuilt
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BLOCK: usize = 4096;

    fn random_columns(seed: u64, columns: usize, rows: usize) -> Vec<Vec<u8>> {
        let mut prng = stripelog_blockdev::Prng::new(seed);
        (0..columns)
            .map(|_| {
                let mut column = vec![0u8; rows * BLOCK];
                prng.fill(&mut column);
                column
            })
            .collect()
    }

    fn encode(level: RaidLevel, columns: &[Vec<u8>], shards: usize) -> Vec<Vec<u8>> {
        let mut parity = vec![vec![0u8; columns[0].len()]; shards];
        let data: Vec<&[u8]> = columns.iter().map(Vec::as_slice).collect();
        let mut targets: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        compute(level, &data, &mut targets);
        parity
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Any single row of any column is rebuilt from the same row of the others, for
        /// one (RAID-5) or two (RAID-6) lost columns, with shards encoded whole.
        #[test]
        fn one_row_is_rebuilt_from_the_same_row_of_the_others(
            seed in any::<u64>(), data_columns in 2usize..8, rows in 1usize..5,
            lost in any::<prop::sample::Index>(), second in any::<prop::sample::Index>(),
            row in any::<prop::sample::Index>(), raid6 in any::<bool>(), lose_parity in any::<bool>())
        {
            let (level, shards) = if raid6 { (RaidLevel::Raid6, 2) } else { (RaidLevel::Raid5, 1) };
            let columns = random_columns(seed, data_columns, rows);
            let parity = encode(level, &columns, shards);
            let lost = lost.index(data_columns);
            let row = row.index(rows);
            let slice = |buffer: &Vec<u8>| buffer[row * BLOCK..(row + 1) * BLOCK].to_vec();
            let data_rows: Vec<Vec<u8>> = columns.iter().map(slice).collect();
            let parity_rows: Vec<Vec<u8>> = parity.iter().map(slice).collect();
            let mut data: Vec<Option<&[u8]>> = data_rows.iter().map(|b| Some(b.as_slice())).collect();
            let mut parity_view: Vec<Option<&[u8]>> = parity_rows.iter().map(|b| Some(b.as_slice())).collect();
            data[lost] = None;
            if raid6 {
                // A second failure: another data column, or one parity shard.
                if lose_parity {
                    parity_view[second.index(2)] = None;
                } else {
                    let other = (lost + 1 + second.index(data_columns - 1)) % data_columns;
                    data[other] = None;
                }
            }
            let rebuilt = reconstruct(level, &data, &parity_view, lost);
            prop_assert_eq!(rebuilt.as_deref(), Some(data_rows[lost].as_slice()));
        }
    }

    #[test]
    fn raid5_with_two_lost_columns_cannot_rebuild() {
        let columns = random_columns(1, 4, 1);
        let parity = encode(RaidLevel::Raid5, &columns, 1);
        let data = [
            None,
            None,
            Some(columns[2].as_slice()),
            Some(columns[3].as_slice()),
        ];
        assert_eq!(
            reconstruct(RaidLevel::Raid5, &data, &[Some(parity[0].as_slice())], 0),
            None
        );
    }
}
