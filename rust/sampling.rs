//! Sampling of random choices (tile sizes, categorical picks) and validation of decisions.
//!
//! The samplers are pure Rust so a search loop can call them without the GIL; the
//! `*_py` functions are their Python entry points.

use pyo3::prelude::*;

use crate::errors::CoreError;
use crate::rng::Rng;

/// Rejection-sampling attempts before falling back to a placement that respects the
/// innermost limit by construction.
const PERFECT_TILE_ATTEMPTS: usize = 64;

/// Prime factors of `n` (n >= 1) in ascending order, with multiplicity.
pub(crate) fn prime_factors(mut n: i64) -> Vec<i64> {
    let mut factors = Vec::new();
    let mut divisor = 2;
    while divisor <= n / divisor {
        while n % divisor == 0 {
            factors.push(divisor);
            n /= divisor;
        }
        divisor += if divisor == 2 { 1 } else { 2 };
    }
    if n > 1 {
        factors.push(n);
    }
    factors
}

/// Divisors of `n` (n >= 1) in ascending order, 1 and `n` included.
pub(crate) fn divisors(n: i64) -> Vec<i64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut divisor = 1;
    while divisor <= n / divisor {
        if n % divisor == 0 {
            small.push(divisor);
            if divisor != n / divisor {
                large.push(n / divisor);
            }
        }
        divisor += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// Whether `factor` is allowed as innermost factor; a non-positive limit means no limit.
pub(crate) fn innermost_allowed(factor: i64, max_innermost_factor: i64) -> bool {
    max_innermost_factor <= 0 || factor <= max_innermost_factor
}

/// The limits a perfect tiling keeps: the innermost factor, and the product of every factor
/// but the outermost (the tile one outer iteration covers); a non-positive limit is none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileLimits {
    pub max_innermost_factor: i64,
    pub max_inner_product: i64,
}

impl TileLimits {
    /// Only the innermost factor limited.
    pub fn innermost(max_innermost_factor: i64) -> Self {
        TileLimits {
            max_innermost_factor,
            max_inner_product: 0,
        }
    }

    /// Whether the innermost factor of `factors` is within its limit.
    fn innermost_fits(&self, factors: &[i64]) -> bool {
        factors
            .last()
            .is_none_or(|&innermost| innermost_allowed(innermost, self.max_innermost_factor))
    }

    /// Whether every factor but the outermost multiplies to within its limit.
    fn inner_product_fits(&self, factors: &[i64]) -> bool {
        if self.max_inner_product <= 0 || factors.len() < 2 {
            return true;
        }
        factors[1..]
            .iter()
            .try_fold(1i64, |acc, &factor| acc.checked_mul(factor))
            .is_some_and(|product| product <= self.max_inner_product)
    }

    /// Whether `factors` keep both limits (no allocation: the sampler and mutator call it per draw).
    pub(crate) fn allow(&self, factors: &[i64]) -> bool {
        self.innermost_fits(factors) && self.inner_product_fits(factors)
    }

    /// Why `factors` break a limit, if they do.
    pub(crate) fn violation(&self, factors: &[i64]) -> Option<String> {
        if !self.innermost_fits(factors) {
            return Some(format!(
                "has innermost factor {} > max_innermost_factor {}",
                factors[factors.len() - 1],
                self.max_innermost_factor
            ));
        }
        if !self.inner_product_fits(factors) {
            return Some(format!(
                "has inner factors {:?} whose product exceeds max_inner_product {}",
                &factors[1..],
                self.max_inner_product
            ));
        }
        None
    }
}

/// Samples `n` factors whose product is exactly `extent`, within `limits`.
///
/// Like MetaSchedule, each prime factor of `extent` goes to a uniformly random position;
/// placements that break a limit are redrawn. After a bounded number of attempts, each
/// prime goes to a random position where it keeps the limits; the outermost always does
/// (it is unlimited), so this always succeeds when `n > 1`.
pub fn sample_perfect_tile(
    rng: &mut Rng,
    extent: i64,
    n: usize,
    limits: TileLimits,
) -> Result<Vec<i64>, CoreError> {
    if extent < 1 {
        return Err(CoreError::InvalidArgument(format!(
            "perfect tiling needs a loop extent >= 1, got {extent}"
        )));
    }
    if n < 1 {
        return Err(CoreError::InvalidArgument(
            "perfect tiling needs at least 1 factor, got 0".to_string(),
        ));
    }
    if n == 1 {
        if !innermost_allowed(extent, limits.max_innermost_factor) {
            return Err(CoreError::InvalidArgument(format!(
                "a single tile factor must equal the loop extent {extent}, \
                 which exceeds max_innermost_factor {}",
                limits.max_innermost_factor
            )));
        }
        return Ok(vec![extent]);
    }
    let primes = prime_factors(extent);
    let positions = n as u64;
    for _ in 0..PERFECT_TILE_ATTEMPTS {
        let mut factors = vec![1i64; n];
        for &prime in &primes {
            factors[rng.below(positions) as usize] *= prime;
        }
        if limits.allow(&factors) {
            return Ok(factors);
        }
    }
    let mut factors = vec![1i64; n];
    for &prime in &primes {
        let fits: Vec<usize> = (0..n)
            .filter(|&position| {
                let mut placed = factors.clone();
                placed[position] *= prime;
                position == 0 || limits.allow(&placed)
            })
            .collect();
        factors[fits[rng.below(fits.len() as u64) as usize]] *= prime;
    }
    Ok(factors)
}

/// Checks that `decision` is a valid perfect tiling of `extent` into `n` factors.
pub fn check_perfect_tile(
    decision: &[i64],
    extent: i64,
    n: usize,
    limits: TileLimits,
) -> Result<(), CoreError> {
    let invalid = |reason: String| {
        Err(CoreError::InvalidDecision(format!(
            "perfect tile decision {decision:?} {reason}"
        )))
    };
    if decision.len() != n {
        return invalid(format!("has {} factors, expected {n}", decision.len()));
    }
    if let Some(factor) = decision.iter().find(|&&factor| factor < 1) {
        return invalid(format!("has non-positive factor {factor}"));
    }
    let product = decision
        .iter()
        .try_fold(1i64, |acc, &factor| acc.checked_mul(factor));
    match product {
        None => {
            return invalid(format!(
                "has a product that overflows, loop extent is {extent}"
            ))
        }
        Some(product) if product != extent => {
            return invalid(format!("has product {product}, loop extent is {extent}"))
        }
        Some(_) => {}
    }
    match limits.violation(decision) {
        Some(reason) => invalid(reason),
        None => Ok(()),
    }
}

/// Samples an index with probability proportional to `weights` (need not sum to 1).
pub fn sample_categorical(rng: &mut Rng, weights: &[f64]) -> Result<usize, CoreError> {
    if weights.is_empty() {
        return Err(CoreError::InvalidArgument(
            "categorical sampling needs at least one probability".to_string(),
        ));
    }
    if let Some(bad) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
        return Err(CoreError::InvalidArgument(format!(
            "categorical probabilities must be finite and >= 0, got {bad}"
        )));
    }
    let total: f64 = weights.iter().sum();
    if total <= 0.0 || !total.is_finite() {
        return Err(CoreError::InvalidArgument(format!(
            "categorical probabilities must have a positive finite sum, got {total}"
        )));
    }
    let target = rng.random() * total;
    let mut cumulative = 0.0;
    let mut last_positive = 0;
    for (index, &weight) in weights.iter().enumerate() {
        if weight > 0.0 {
            cumulative += weight;
            last_positive = index;
            if target < cumulative {
                return Ok(index);
            }
        }
    }
    // Rounding can leave `target` just above the summed weights.
    Ok(last_positive)
}

/// Checks that `decision` indexes one of `num_candidates` candidates.
pub fn check_categorical(decision: i64, num_candidates: i64) -> Result<(), CoreError> {
    if (0..num_candidates).contains(&decision) {
        Ok(())
    } else {
        Err(CoreError::InvalidDecision(format!(
            "categorical decision {decision} is out of range for {num_candidates} candidates"
        )))
    }
}

/// Python passes the factor count as a plain int, which may be negative.
fn factor_count(n: i64) -> Result<usize, CoreError> {
    usize::try_from(n).map_err(|_| {
        CoreError::InvalidArgument(format!("perfect tiling needs at least 1 factor, got {n}"))
    })
}

#[pyfunction]
#[pyo3(name = "sample_perfect_tile", signature = (rng, extent, n, max_innermost_factor, max_inner_product = 0))]
pub fn sample_perfect_tile_py(
    mut rng: PyRefMut<'_, Rng>,
    extent: i64,
    n: i64,
    max_innermost_factor: i64,
    max_inner_product: i64,
) -> Result<Vec<i64>, CoreError> {
    let limits = TileLimits {
        max_innermost_factor,
        max_inner_product,
    };
    sample_perfect_tile(&mut rng, extent, factor_count(n)?, limits)
}

#[pyfunction]
#[pyo3(name = "check_perfect_tile", signature = (decision, extent, n, max_innermost_factor, max_inner_product = 0))]
pub fn check_perfect_tile_py(
    decision: Vec<i64>,
    extent: i64,
    n: i64,
    max_innermost_factor: i64,
    max_inner_product: i64,
) -> Result<(), CoreError> {
    let limits = TileLimits {
        max_innermost_factor,
        max_inner_product,
    };
    check_perfect_tile(&decision, extent, factor_count(n)?, limits)
}

#[pyfunction]
#[pyo3(name = "sample_categorical")]
pub fn sample_categorical_py(
    mut rng: PyRefMut<'_, Rng>,
    probs: Vec<f64>,
) -> Result<usize, CoreError> {
    sample_categorical(&mut rng, &probs)
}

#[pyfunction]
#[pyo3(name = "check_categorical")]
pub fn check_categorical_py(decision: i64, num_candidates: i64) -> Result<(), CoreError> {
    check_categorical(decision, num_candidates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prime_factors_cover_edge_cases() {
        assert_eq!(prime_factors(1), Vec::<i64>::new());
        assert_eq!(prime_factors(2), vec![2]);
        assert_eq!(prime_factors(360), vec![2, 2, 2, 3, 3, 5]);
        assert_eq!(prime_factors(97), vec![97]);
        assert_eq!(prime_factors(2 * 1_000_003), vec![2, 1_000_003]);
    }

    #[test]
    fn divisors_are_sorted_and_complete() {
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(divisors(36), vec![1, 2, 3, 4, 6, 9, 12, 18, 36]);
        assert_eq!(divisors(97), vec![1, 97]);
    }

    #[test]
    fn perfect_tiles_multiply_to_the_extent_within_the_limit() {
        for seed in 0..500 {
            let mut rng = Rng::new(seed);
            for &(extent, n, limit) in &[
                (512, 4, 16),
                (1024, 2, 64),
                (384, 3, 0),
                (7, 2, 1),
                (1, 3, 4),
                (96, 5, 2),
            ] {
                let factors =
                    sample_perfect_tile(&mut rng, extent, n, TileLimits::innermost(limit)).unwrap();
                check_perfect_tile(&factors, extent, n, TileLimits::innermost(limit)).unwrap();
            }
        }
    }

    #[test]
    fn perfect_tile_sampling_is_deterministic_per_seed() {
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..20)
                .map(|_| sample_perfect_tile(&mut rng, 2048, 4, TileLimits::innermost(32)).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(11), draw(11));
        assert_ne!(draw(11), draw(12));
    }

    #[test]
    fn perfect_tile_sampling_reaches_varied_tilings() {
        let mut rng = Rng::new(5);
        let innermost: std::collections::BTreeSet<i64> = (0..300)
            .map(|_| {
                *sample_perfect_tile(&mut rng, 16, 2, TileLimits::innermost(0))
                    .unwrap()
                    .last()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            innermost.into_iter().collect::<Vec<_>>(),
            vec![1, 2, 4, 8, 16]
        );
    }

    #[test]
    fn tight_limit_falls_back_to_a_valid_tiling() {
        // 2^20 over 2 positions: the innermost gets <= 1 prime only with probability ~2^-19,
        // so this exercises the fallback placement.
        for seed in 0..50 {
            let mut rng = Rng::new(seed);
            let factors =
                sample_perfect_tile(&mut rng, 1 << 20, 2, TileLimits::innermost(2)).unwrap();
            check_perfect_tile(&factors, 1 << 20, 2, TileLimits::innermost(2)).unwrap();
        }
    }

    #[test]
    fn perfect_tile_rejects_bad_arguments() {
        let mut rng = Rng::new(0);
        assert!(matches!(
            sample_perfect_tile(&mut rng, 0, 2, TileLimits::innermost(0)),
            Err(CoreError::InvalidArgument(_))
        ));
        assert!(matches!(
            sample_perfect_tile(&mut rng, 8, 0, TileLimits::innermost(0)),
            Err(CoreError::InvalidArgument(_))
        ));
        assert!(matches!(
            sample_perfect_tile(&mut rng, 32, 1, TileLimits::innermost(16)),
            Err(CoreError::InvalidArgument(_))
        ));
        assert_eq!(
            sample_perfect_tile(&mut rng, 32, 1, TileLimits::innermost(0)).unwrap(),
            vec![32]
        );
    }

    #[test]
    fn check_perfect_tile_explains_each_failure() {
        let message = |decision: &[i64], extent, n, limit| {
            check_perfect_tile(decision, extent, n, TileLimits::innermost(limit))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            message(&[3, 5], 16, 2, 0),
            "perfect tile decision [3, 5] has product 15, loop extent is 16"
        );
        assert_eq!(
            message(&[4, 4], 16, 3, 0),
            "perfect tile decision [4, 4] has 2 factors, expected 3"
        );
        assert_eq!(
            message(&[-4, -4], 16, 2, 0),
            "perfect tile decision [-4, -4] has non-positive factor -4"
        );
        assert_eq!(
            message(&[1, 16], 16, 2, 8),
            "perfect tile decision [1, 16] has innermost factor 16 > max_innermost_factor 8"
        );
        assert!(message(&[i64::MAX, 4], 16, 2, 0).contains("overflows"));
        assert!(check_perfect_tile(&[2, 8], 16, 2, TileLimits::innermost(8)).is_ok());
    }

    #[test]
    fn inner_product_limit_bounds_every_factor_but_the_outermost() {
        let mut rng = Rng::new(21);
        let limits = TileLimits {
            max_innermost_factor: 4,
            max_inner_product: 8,
        };
        let mut outermost = std::collections::BTreeSet::new();
        for _ in 0..300 {
            let factors = sample_perfect_tile(&mut rng, 256, 4, limits).unwrap();
            check_perfect_tile(&factors, 256, 4, limits).unwrap();
            assert!(factors[1..].iter().product::<i64>() <= 8 && factors[3] <= 4);
            outermost.insert(factors[0]);
        }
        assert_eq!(
            outermost,
            [32, 64, 128, 256].into_iter().collect(),
            "every inner tile up to 8 is drawn"
        );
        let err = check_perfect_tile(&[4, 4, 4, 4], 256, 4, limits)
            .unwrap_err()
            .to_string();
        assert!(err.contains("product exceeds max_inner_product 8"), "{err}");
    }

    #[test]
    fn categorical_follows_the_weights() {
        let mut rng = Rng::new(8);
        let mut counts = [0usize; 3];
        for _ in 0..3000 {
            counts[sample_categorical(&mut rng, &[1.0, 0.0, 3.0]).unwrap()] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!((600..900).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn categorical_rejects_bad_weights() {
        let mut rng = Rng::new(0);
        for weights in [
            &[][..],
            &[0.0, 0.0],
            &[1.0, -1.0],
            &[f64::NAN],
            &[f64::INFINITY],
        ] {
            assert!(matches!(
                sample_categorical(&mut rng, weights),
                Err(CoreError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn check_categorical_bounds() {
        assert!(check_categorical(0, 3).is_ok());
        assert!(check_categorical(2, 3).is_ok());
        assert_eq!(
            check_categorical(3, 3).unwrap_err().to_string(),
            "categorical decision 3 is out of range for 3 candidates"
        );
        assert!(check_categorical(-1, 3).is_err());
    }
}
