//! A deterministic, seedable random number generator with the same stream on every platform.
//!
//! Tuning must be reproducible from a seed and resumable from a saved state, so the
//! generator is specified here rather than borrowed from a library whose stream may change:
//! xoshiro256** (Blackman and Vigna), its 256-bit state filled from the seed by SplitMix64.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::CoreError;

/// One SplitMix64 step: advances `counter` and returns a well-mixed 64-bit word.
fn splitmix64(counter: &mut u64) -> u64 {
    *counter = counter.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *counter;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** generator. Python: `Rng(seed)`.
#[pyclass(eq, module = "probtune._core")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// Restores a generator from `state` (as returned by [`Rng::state`]).
    pub fn from_state_words(state: [u64; 4]) -> Result<Rng, CoreError> {
        if state == [0; 4] {
            return Err(CoreError::InvalidArgument(
                "an all-zero state is not a valid xoshiro256** state".to_string(),
            ));
        }
        Ok(Rng { state })
    }

    /// A uniform integer in `[0, bound)`, without modulo bias (Lemire's method).
    /// `bound` must be positive.
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0, "Rng::below needs a positive bound");
        let mut product = u128::from(self.next_u64()) * u128::from(bound);
        if (product as u64) < bound {
            let threshold = bound.wrapping_neg() % bound;
            while (product as u64) < threshold {
                product = u128::from(self.next_u64()) * u128::from(bound);
            }
        }
        (product >> 64) as u64
    }
}

#[pymethods]
impl Rng {
    /// Seeds the generator; equal seeds give equal streams on every platform.
    #[new]
    pub fn new(seed: u64) -> Rng {
        let mut counter = seed;
        let state = std::array::from_fn(|_| splitmix64(&mut counter));
        // SplitMix64 is a bijection of its counter, so the four words are never all zero.
        Rng { state }
    }

    pub fn next_u64(&mut self) -> u64 {
        let [s0, s1, s2, s3] = self.state;
        let result = s1.wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s1 << 17;
        let mut next = [s0, s1, s2 ^ s0, s3 ^ s1];
        next[1] ^= next[2];
        next[0] ^= next[3];
        next[2] ^= t;
        next[3] = next[3].rotate_left(45);
        self.state = next;
        result
    }

    /// A uniform integer in `[low, high)`.
    pub fn randint(&mut self, low: i64, high: i64) -> Result<i64, CoreError> {
        if low >= high {
            return Err(CoreError::InvalidArgument(format!(
                "randint needs low < high, got the empty range [{low}, {high})"
            )));
        }
        let span = (i128::from(high) - i128::from(low)) as u64;
        Ok((i128::from(low) + i128::from(self.below(span))) as i64)
    }

    /// A uniform float in `[0, 1)` with 53 random bits.
    pub fn random(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A child generator with its own stream, derived deterministically from this one
    /// (which advances by one step), so parallel workers can draw independently.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }

    /// The four 64-bit words of the state, to save and later resume the stream.
    #[getter]
    pub fn state(&self) -> [u64; 4] {
        self.state
    }

    /// Restores a generator from the four words of [`Rng::state`].
    #[staticmethod]
    pub fn from_state(state: Vec<u64>) -> Result<Rng, CoreError> {
        let words: [u64; 4] = state.as_slice().try_into().map_err(|_| {
            CoreError::InvalidArgument(format!("an Rng state has 4 words, got {}", state.len()))
        })?;
        Rng::from_state_words(words)
    }

    fn __getnewargs__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, [0u64])
    }

    fn __getstate__(&self) -> [u64; 4] {
        self.state
    }

    fn __setstate__(&mut self, state: Vec<u64>) -> Result<(), CoreError> {
        *self = Rng::from_state(state)?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("Rng.from_state({:?})", self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_stream() {
        let mut counter = 0;
        let words: Vec<u64> = (0..3).map(|_| splitmix64(&mut counter)).collect();
        assert_eq!(
            words,
            vec![
                0xE220_A839_7B1D_CDAF,
                0x6E78_9E6A_A1B9_65F4,
                0x06C4_5D18_8009_454F
            ]
        );
    }

    #[test]
    fn xoshiro_matches_the_reference_step() {
        // Reference values from the authors' C implementation with state {1, 2, 3, 4}.
        let mut rng = Rng::from_state_words([1, 2, 3, 4]).unwrap();
        let outputs: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        assert_eq!(outputs, vec![11520, 0, 1509978240]);
    }

    #[test]
    fn same_seed_same_stream() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(42).next_u64(), Rng::new(43).next_u64());
    }

    #[test]
    fn seeded_stream_is_pinned() {
        let mut rng = Rng::new(2024);
        assert_eq!(rng.next_u64(), 1029197146548041518);
    }

    #[test]
    fn fork_is_deterministic_and_independent() {
        let mut parent_a = Rng::new(7);
        let mut parent_b = Rng::new(7);
        let mut child_a = parent_a.fork();
        let mut child_b = parent_b.fork();
        assert_eq!(child_a, child_b);
        let child_stream: Vec<u64> = (0..64).map(|_| child_a.next_u64()).collect();
        let parent_stream: Vec<u64> = (0..64).map(|_| parent_a.next_u64()).collect();
        assert!(child_stream
            .iter()
            .all(|word| !parent_stream.contains(word)));
        assert_ne!(parent_a.fork(), child_b.fork());
    }

    #[test]
    fn randint_stays_in_range_and_hits_both_ends() {
        let mut rng = Rng::new(1);
        let draws: Vec<i64> = (0..1000).map(|_| rng.randint(-2, 3).unwrap()).collect();
        assert!(draws.iter().all(|d| (-2..3).contains(d)));
        assert!(draws.contains(&-2) && draws.contains(&2));
        assert!(rng.randint(i64::MIN, i64::MAX).is_ok());
        assert!(matches!(
            rng.randint(5, 5),
            Err(CoreError::InvalidArgument(_))
        ));
    }

    #[test]
    fn random_is_in_unit_interval() {
        let mut rng = Rng::new(3);
        let draws: Vec<f64> = (0..1000).map(|_| rng.random()).collect();
        assert!(draws.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
    }

    #[test]
    fn state_round_trip_resumes_the_stream() {
        let mut rng = Rng::new(9);
        rng.next_u64();
        let mut resumed = Rng::from_state(rng.state().to_vec()).unwrap();
        assert_eq!(rng.next_u64(), resumed.next_u64());
        assert!(Rng::from_state(vec![1, 2, 3]).is_err());
        assert!(Rng::from_state(vec![0; 4]).is_err());
    }
}
