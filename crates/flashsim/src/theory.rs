//! Analytic figures the model is checked against.

/// Write amplification of greedy garbage collection under uniform random writes, for large
/// erase blocks (Desnoyers 2012, "Analytic modeling of SSD write performance"):
/// `1 / (1 − u)`, where the victim's valid fraction `u` solves `u = exp(−(1 − u) / α)` and
/// `α = 1 − spare_fraction` is the share of the raw space the host can address.
/// 7.32, 4.03 and 2.06 at 7, 13 and 27 % spare.
pub fn greedy_uniform_write_amplification(spare_fraction: f64) -> f64 {
    let alpha = 1.0 - spare_fraction;
    // Fixed point from below converges to the non-trivial root for spare > 0.
    let mut utilisation = 0.0f64;
    for _ in 0..10_000 {
        utilisation = (-(1.0 - utilisation) / alpha).exp();
    }
    1.0 / (1.0 - utilisation)
}

/// Steps of the search over the split of the spare space in
/// [`two_pool_write_amplification`].
const TWO_POOL_SPLIT_STEPS: u32 = 2_000;

/// The bound on write amplification under hot/cold writes with perfect separation: a
/// share `hot_write_fraction` of the writes goes uniformly to a share `hot_data_fraction`
/// of the data, the two kinds are kept in pools of their own, each cleaned greedily
/// ([`greedy_uniform_write_amplification`] at its own spare), and the spare space
/// (`spare_fraction` of the raw space) is split between them in the best proportion.
/// 1.93 / 1.28 for 90/10 and 2.84 / 1.60 for 80/20 at 13 / 27 % spare.
pub fn two_pool_write_amplification(hot_write_fraction: f64, hot_data_fraction: f64, spare_fraction: f64) -> f64 {
    // Data of size 1 in a raw space of 1 / (1 − spare); the hot pool takes its data plus a
    // share of the spare.
    let raw = 1.0 / (1.0 - spare_fraction);
    let spare = raw - 1.0;
    let cold_data_fraction = 1.0 - hot_data_fraction;
    (1..TWO_POOL_SPLIT_STEPS)
        .map(|step| {
            let hot_raw = hot_data_fraction + spare * step as f64 / TWO_POOL_SPLIT_STEPS as f64;
            let cold_raw = raw - hot_raw;
            hot_write_fraction * greedy_uniform_write_amplification(1.0 - hot_data_fraction / hot_raw)
                + (1.0 - hot_write_fraction) * greedy_uniform_write_amplification(1.0 - cold_data_fraction / cold_raw)
        })
        .fold(f64::INFINITY, f64::min)
}

/// Projected life in years by seed 002's formula: P/E cycles × capacity ÷ (write
/// amplification × write rate × duty cycle), with the write rate in bytes per second.
pub fn life_years(
    pe_cycles: u32,
    capacity_bytes: f64,
    write_amplification: f64,
    write_bytes_per_second: f64,
    duty_cycle: f64,
) -> f64 {
    const SECONDS_PER_YEAR: f64 = 365.25 * 24.0 * 3600.0;
    let denominator = write_amplification * write_bytes_per_second * duty_cycle;
    if denominator <= 0.0 {
        return f64::INFINITY;
    }
    pe_cycles as f64 * capacity_bytes / denominator / SECONDS_PER_YEAR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_s_reference_values() {
        for (spare, expected) in [(0.07, 7.32), (0.13, 4.03), (0.27, 2.06)] {
            let computed = greedy_uniform_write_amplification(spare);
            assert!((computed - expected).abs() < 0.005, "spare {spare}: {computed}");
        }
    }

    #[test]
    fn the_two_pool_bound_matches_the_issue_s_figures() {
        for (hot_writes, hot_data, spare, expected) in
            [(0.9, 0.1, 0.13, 1.93), (0.9, 0.1, 0.27, 1.28), (0.8, 0.2, 0.13, 2.84), (0.8, 0.2, 0.27, 1.60)]
        {
            let bound = two_pool_write_amplification(hot_writes, hot_data, spare);
            assert!((bound - expected).abs() < 0.006, "{hot_writes}/{hot_data} at {spare}: {bound}");
        }
        // Uniform writes gain nothing from two pools.
        let uniform = two_pool_write_amplification(0.5, 0.5, 0.27);
        assert!((uniform - greedy_uniform_write_amplification(0.27)).abs() < 0.005, "{uniform}");
    }

    #[test]
    fn life_follows_seed_002_s_formula() {
        // 3,000 cycles × 100 GB at WA 1 and 100 MB/s, always writing: 3e5 GB ÷ 0.1 GB/s.
        let years = life_years(3_000, 100e9, 1.0, 100e6, 1.0);
        assert!((years - 3e6 / 31_557_600.0).abs() < 1e-9);
        assert!(life_years(3_000, 100e9, 2.0, 100e6, 1.0) < years);
    }
}
