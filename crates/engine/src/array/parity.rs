//! Redundancy over the data columns of a batch: RAID-5 P (XOR) and RAID-6 P+Q.
//!
//! RAID-6 follows the Linux md construction (H. Peter Anvin, "The mathematics of
//! RAID-6"): over GF(2^8) with polynomial x⁸+x⁴+x³+x²+1 and generator g = 2,
//! `P = ⊕ Dᵢ` and `Q = ⊕ gⁱ·Dᵢ`. Q is computed by Horner's rule with a multiply-by-g done
//! on eight bytes at once in a u64, so encoding runs at memory speed without tables;
//! a lost data block with P present is rebuilt by XOR alone, like RAID-5; two lost
//! blocks use the closed-form solution with log/exp tables.
//!
//! Why not a general Reed–Solomon crate: the engine rebuilds one 4 KiB row at a time
//! (degraded reads, recovery's tail check). `reed-solomon-simd`, which we tried first,
//! has a fixed cost of about a millisecond per decode (it evaluates its error locator over
//! all 65 536 field elements), a thousand times the cost of the P+Q algebra for one row.

use crate::layout::geometry::RaidLevel;

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
    for (target_byte, source_byte) in target_words.into_remainder().iter_mut().zip(source_words.remainder()) {
        *target_byte ^= source_byte;
    }
}

/// Multiply each of the eight bytes of `word` by g = 2 in GF(2^8).
fn times_generator(word: u64) -> u64 {
    let high_bits = word & 0x8080_8080_8080_8080;
    let shifted = (word << 1) & 0xFEFE_FEFE_FEFE_FEFE;
    shifted ^ ((high_bits >> 7) * 0x1D)
}

/// `target = target·g ⊕ source`, bytewise in GF(2^8) (one Horner step).
fn horner_step(target: &mut [u8], source: &[u8]) {
    debug_assert_eq!(target.len(), source.len());
    debug_assert_eq!(target.len() % 8, 0);
    for (target_word, source_word) in target.chunks_exact_mut(8).zip(source.chunks_exact(8)) {
        let value = times_generator(u64::from_ne_bytes(target_word.try_into().expect("8 bytes")))
            ^ u64::from_ne_bytes(source_word.try_into().expect("8 bytes"));
        target_word.copy_from_slice(&value.to_ne_bytes());
    }
}

/// Exponentials and logarithms of GF(2^8) with generator 2 (polynomial 0x11D).
struct Field {
    exponential: [u8; 512],
    logarithm: [u8; 256],
}

const FIELD: Field = {
    let mut exponential = [0u8; 512];
    let mut logarithm = [0u8; 256];
    let mut value: u16 = 1;
    let mut power = 0;
    while power < 255 {
        exponential[power] = value as u8;
        exponential[power + 255] = value as u8;
        logarithm[value as usize] = power as u8;
        value <<= 1;
        if value & 0x100 != 0 {
            value ^= 0x11D;
        }
        power += 1;
    }
    Field { exponential, logarithm }
};

fn multiply(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    FIELD.exponential[FIELD.logarithm[a as usize] as usize + FIELD.logarithm[b as usize] as usize]
}

/// g^power for any integer power (negative powers are inverses).
fn generator_power(power: i64) -> u8 {
    FIELD.exponential[power.rem_euclid(255) as usize]
}

fn inverse(a: u8) -> u8 {
    debug_assert_ne!(a, 0);
    FIELD.exponential[(255 - FIELD.logarithm[a as usize] as usize) % 255]
}

fn scale(block: &[u8], factor: u8) -> Vec<u8> {
    block.iter().map(|&byte| multiply(byte, factor)).collect()
}

/// Q over `data` with the given columns treated as zeros.
fn q_syndrome(data: &[Option<&[u8]>], length: usize) -> Vec<u8> {
    let mut q = vec![0u8; length];
    let zeros = vec![0u8; length];
    for block in data.iter().rev() {
        horner_step(&mut q, block.unwrap_or(&zeros));
    }
    q
}

/// Compute the parity shards of `data` (one slice per data column, equal lengths, a
/// multiple of 8 bytes) into `parity` (one slice per parity shard). Nothing to do for
/// RAID-0 and RAID-10.
pub fn compute(level: RaidLevel, data: &[&[u8]], parity: &mut [&mut [u8]]) {
    match level {
        RaidLevel::Raid0 | RaidLevel::Raid10 => debug_assert!(parity.is_empty()),
        RaidLevel::Raid5 | RaidLevel::Raid6 => {
            let target = &mut parity[0];
            target.copy_from_slice(data[0]);
            for column in &data[1..] {
                xor_into(target, column);
            }
            if level == RaidLevel::Raid6 {
                let q = &mut parity[1];
                q.copy_from_slice(data[data.len() - 1]);
                for column in data[..data.len() - 1].iter().rev() {
                    horner_step(q, column);
                }
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
    if matches!(level, RaidLevel::Raid0 | RaidLevel::Raid10) {
        return None;
    }
    let mut data: Vec<Option<&[u8]>> = data.to_vec();
    data[wanted] = None;
    let lost: Vec<usize> = (0..data.len()).filter(|&column| data[column].is_none()).collect();
    let p = parity.first().copied().flatten();
    let q = if level == RaidLevel::Raid6 { parity.get(1).copied().flatten() } else { None };
    // The XOR of every present data block.
    let present_xor = |length: usize| {
        let mut sum = vec![0u8; length];
        for block in data.iter().flatten() {
            xor_into(&mut sum, block);
        }
        sum
    };
    match (lost.as_slice(), p, q) {
        ([_], Some(p), _) => {
            let mut rebuilt = present_xor(p.len());
            xor_into(&mut rebuilt, p);
            Some(rebuilt)
        }
        ([x], None, Some(q)) => {
            // g^x·Dx = Q ⊕ Q(others)
            let mut syndrome = q_syndrome(&data, q.len());
            xor_into(&mut syndrome, q);
            Some(scale(&syndrome, generator_power(-(*x as i64))))
        }
        ([first, second], Some(p), Some(q)) => {
            let (x, y) = (*first as i64, *second as i64);
            let mut p_sum = present_xor(p.len());
            xor_into(&mut p_sum, p); // Dx ⊕ Dy
            let mut q_sum = q_syndrome(&data, q.len());
            xor_into(&mut q_sum, q); // g^x·Dx ⊕ g^y·Dy
            let denominator = inverse(generator_power(y - x) ^ 1);
            let a = multiply(generator_power(y - x), denominator);
            let b = multiply(generator_power(-x), denominator);
            let mut dx = scale(&p_sum, a);
            xor_into(&mut dx, &scale(&q_sum, b));
            if wanted as i64 == x {
                Some(dx)
            } else {
                xor_into(&mut p_sum, &dx);
                Some(p_sum)
            }
        }
        _ => None,
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
    fn field_tables_are_consistent() {
        for a in 1..=255u8 {
            assert_eq!(multiply(a, inverse(a)), 1);
            assert_eq!(multiply(a, 2), (times_generator(a as u64) & 0xFF) as u8);
        }
        assert_eq!(generator_power(255), 1);
    }

    /// Every way of losing two shards of a RAID-6 row (two data, data and P, data and Q),
    /// for every width up to 16 data columns.
    #[test]
    fn raid6_rebuilds_every_pair_of_lost_shards() {
        for data_columns in 2..=16usize {
            let columns = random_columns(data_columns as u64, data_columns, 1);
            let parity = encode(RaidLevel::Raid6, &columns, 2);
            let shard_count = data_columns + 2;
            for first in 0..shard_count {
                for second in first + 1..shard_count {
                    let lost = |shard: usize| shard == first || shard == second;
                    let data: Vec<Option<&[u8]>> =
                        (0..data_columns).map(|c| (!lost(c)).then_some(columns[c].as_slice())).collect();
                    let parity_view: Vec<Option<&[u8]>> =
                        (0..2).map(|s| (!lost(data_columns + s)).then_some(parity[s].as_slice())).collect();
                    for wanted in [first, second].into_iter().filter(|&shard| shard < data_columns) {
                        let rebuilt = reconstruct(RaidLevel::Raid6, &data, &parity_view, wanted);
                        assert_eq!(
                            rebuilt.as_deref(),
                            Some(columns[wanted].as_slice()),
                            "d={data_columns} lost {first},{second}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn raid5_with_two_lost_columns_cannot_rebuild() {
        let columns = random_columns(1, 4, 1);
        let parity = encode(RaidLevel::Raid5, &columns, 1);
        let data = [None, None, Some(columns[2].as_slice()), Some(columns[3].as_slice())];
        assert_eq!(reconstruct(RaidLevel::Raid5, &data, &[Some(parity[0].as_slice())], 0), None);
    }
}
