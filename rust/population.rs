//! The evolutionary search loop (MetaSchedule's EvolutionarySearch, re-thought for batches).
//!
//! A population of traces is scored by a cost model, parents are drawn in proportion to
//! their scores, mutated, and the best of parents and children survive. What needs TVM or
//! the cost model — scoring, and mutators written in Python — is reached through
//! [`SearchHooks`], called once per generation with the whole batch, so the Python binding
//! holds the GIL only for those calls and runs everything else without it.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::dedup::DecisionSet;
use crate::errors::CoreError;
use crate::mutator::{builtin_mutator, Mutator, BUILTIN_MUTATORS};
use crate::rng::Rng;
use crate::trace::Trace;

/// Attempts to make one new child before the slot stays empty: a mutation may find nothing
/// to change or give decisions already produced (MetaSchedule's `genetic_max_fail_count`).
const MUTATION_ATTEMPTS_PER_CHILD: usize = 10;

/// How a child is made from its parent.
#[derive(Clone, Copy)]
pub enum MutatorChoice {
    /// A mutator implemented in Rust, applied inside the loop.
    Builtin(&'static dyn Mutator),
    /// An index into the hooks' own mutators (the Python callables, in the binding), all
    /// applied in one batch per generation.
    External(usize),
}

/// The parameters of one search (see `evolve` in `_core.pyi` for their meaning).
#[derive(Clone)]
pub struct EvolveConfig {
    pub population_size: usize,
    pub generations: usize,
    pub mutate_prob: f64,
    /// Mutators with their relative weights.
    pub mutators: Vec<(MutatorChoice, f64)>,
    pub num_select: usize,
    pub eps_greedy: f64,
}

impl Default for EvolveConfig {
    fn default() -> Self {
        let weights = default_mutator_weights();
        EvolveConfig {
            population_size: 512,
            generations: 4,
            mutate_prob: 0.85,
            mutators: weights
                .iter()
                .map(|(name, weight)| {
                    let mutator = builtin_mutator(name).expect("defaults name built-in mutators");
                    (MutatorChoice::Builtin(mutator), *weight)
                })
                .collect(),
            num_select: 64,
            eps_greedy: 0.05,
        }
    }
}

/// The default mutators by name: mostly tile sizes, which matter most on CPU.
fn default_mutator_weights() -> Vec<(String, f64)> {
    vec![
        ("tile_size".to_string(), 0.9),
        ("categorical".to_string(), 0.1),
    ]
}

impl EvolveConfig {
    /// Rejects parameters the loop cannot honour, before any work is done.
    pub fn check(&self) -> Result<(), CoreError> {
        let invalid = |message: String| Err(CoreError::InvalidArgument(message));
        if self.population_size == 0 {
            return invalid("population_size must be at least 1".to_string());
        }
        for (name, value) in [
            ("mutate_prob", self.mutate_prob),
            ("eps_greedy", self.eps_greedy),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return invalid(format!("{name} must be in [0, 1], got {value}"));
            }
        }
        if let Some((_, weight)) = self
            .mutators
            .iter()
            .find(|(_, weight)| !weight.is_finite() || *weight < 0.0)
        {
            return invalid(format!(
                "mutator weights must be finite and >= 0, got {weight}"
            ));
        }
        if WeightedChoice::new(self.mutators.iter().map(|(_, weight)| *weight)).is_none() {
            return invalid("mutator weights must have a positive sum".to_string());
        }
        Ok(())
    }
}

/// A child to be made by an external mutator: `mutator` applied to `parent`, drawing from
/// `rng` (forked from the search's generator, so the search stays deterministic).
pub struct ExternalMutation {
    pub mutator: usize,
    pub parent: Trace,
    pub rng: Rng,
}

/// What the loop cannot do itself, each called with a whole generation at once.
pub trait SearchHooks {
    type Error;

    /// One score per candidate, higher is better; `None` marks an invalid candidate.
    fn score(&mut self, candidates: &[Trace]) -> Result<Vec<Option<f64>>, Self::Error>;

    /// One result per request (`None`: nothing to change). Hooks that define no external
    /// mutators never receive requests; by default they answer none.
    fn mutate(
        &mut self,
        requests: Vec<ExternalMutation>,
    ) -> Result<Vec<Option<Trace>>, Self::Error> {
        Ok(requests.iter().map(|_| None).collect())
    }
}

/// Why a search failed: a hook's own error, passed through unchanged, or the loop's.
#[derive(Debug)]
pub enum SearchError<E> {
    Hook(E),
    /// A bad configuration, or a hook reply of the wrong shape.
    Invalid(CoreError),
}

impl From<SearchError<PyErr>> for PyErr {
    fn from(err: SearchError<PyErr>) -> PyErr {
        match err {
            SearchError::Hook(err) => err,
            SearchError::Invalid(err) => err.into(),
        }
    }
}

/// A candidate with its score.
#[derive(Debug, Clone)]
pub struct Scored {
    pub trace: Trace,
    pub decision_hash: u64,
    pub score: f64,
}

/// Draws indices with probability proportional to non-negative weights.
struct WeightedChoice {
    cumulative: Vec<f64>,
    /// Returned when rounding puts a draw at the very end of the range.
    last_positive: usize,
}

impl WeightedChoice {
    /// `None` unless the weights have a positive, finite sum.
    fn new(weights: impl IntoIterator<Item = f64>) -> Option<WeightedChoice> {
        let mut total = 0.0;
        let mut last_positive = 0;
        let cumulative: Vec<f64> = weights
            .into_iter()
            .enumerate()
            .map(|(index, weight)| {
                if weight > 0.0 {
                    last_positive = index;
                }
                total += weight;
                total
            })
            .collect();
        (total > 0.0 && total.is_finite()).then_some(WeightedChoice {
            cumulative,
            last_positive,
        })
    }

    /// Parents by score: shifted so the lowest is zero when any is negative (higher is
    /// better whatever the sign); uniform when that leaves no usable weights (all equal).
    fn by_score(population: &[&Scored]) -> WeightedChoice {
        let lowest = population
            .iter()
            .map(|scored| scored.score)
            .fold(0.0, f64::min);
        let weights = population.iter().map(|scored| scored.score - lowest);
        WeightedChoice::new(weights)
            .unwrap_or_else(|| WeightedChoice::new(population.iter().map(|_| 1.0)).unwrap())
    }

    fn pick(&self, rng: &mut Rng) -> usize {
        let total = self.cumulative[self.cumulative.len() - 1];
        let target = rng.random() * total;
        let index = self.cumulative.partition_point(|&bound| bound <= target);
        if index < self.cumulative.len() {
            index
        } else {
            self.last_positive
        }
    }
}

/// Traces whose decisions are new in this search, with their hashes, waiting to be scored.
#[derive(Default)]
struct Batch {
    traces: Vec<Trace>,
    hashes: Vec<u64>,
}

impl Batch {
    /// Adds `trace` unless its decisions were already produced; says whether it was added.
    fn offer(&mut self, trace: Trace, produced: &mut DecisionSet) -> bool {
        let hash = trace.decision_hash();
        let new = produced.insert(hash);
        if new {
            self.traces.push(trace);
            self.hashes.push(hash);
        }
        new
    }
}

/// Scores `batch` with one hook call and keeps the candidates with a score.
fn score_batch<H: SearchHooks>(
    hooks: &mut H,
    batch: Batch,
) -> Result<Vec<Scored>, SearchError<H::Error>> {
    if batch.traces.is_empty() {
        return Ok(Vec::new());
    }
    let scores = hooks.score(&batch.traces).map_err(SearchError::Hook)?;
    if scores.len() != batch.traces.len() {
        return Err(SearchError::Invalid(CoreError::InvalidArgument(format!(
            "score returned {} scores for {} candidates",
            scores.len(),
            batch.traces.len()
        ))));
    }
    if let Some((index, score)) = scores
        .iter()
        .enumerate()
        .find_map(|(index, score)| score.filter(|s| !s.is_finite()).map(|s| (index, s)))
    {
        return Err(SearchError::Invalid(CoreError::InvalidArgument(format!(
            "score returned {score} for candidate {index}; a score is a finite float, or None for an invalid candidate"
        ))));
    }
    let candidates = batch.traces.into_iter().zip(batch.hashes).zip(scores);
    Ok(candidates
        .filter_map(|((trace, decision_hash), score)| {
            score.map(|score| Scored {
                trace,
                decision_hash,
                score,
            })
        })
        .collect())
}

/// Orders candidates best first; ties keep their order, so results are deterministic.
fn sort_best_first(candidates: &mut [Scored]) {
    candidates.sort_by(|a, b| b.score.total_cmp(&a.score));
}

/// Keeps the best `size` of `population` (indices into `scored`), best first; ties keep
/// their order, so parents stay ahead of equally good children.
fn keep_best(population: &mut Vec<usize>, scored: &[Scored], size: usize) {
    population.sort_by(|&a, &b| scored[b].score.total_cmp(&scored[a].score));
    population.truncate(size);
}

/// One generation's new children: `population_size` slots, each (with probability
/// `mutate_prob`) a mutation of a parent drawn by score. A slot that copies its parent
/// adds nothing, since parents stay in the population anyway. External mutations are
/// collected and made in one hook call at the end.
fn breed<H: SearchHooks>(
    population: &[&Scored],
    mutators: &WeightedChoice,
    hooks: &mut H,
    rng: &mut Rng,
    config: &EvolveConfig,
    produced: &mut DecisionSet,
) -> Result<Batch, SearchError<H::Error>> {
    let parents = WeightedChoice::by_score(population);
    let mut children = Batch::default();
    let mut external = Vec::new();
    for _ in 0..config.population_size {
        if rng.random() >= config.mutate_prob {
            continue;
        }
        for _ in 0..MUTATION_ATTEMPTS_PER_CHILD {
            let parent = &population[parents.pick(rng)].trace;
            match config.mutators[mutators.pick(rng)].0 {
                MutatorChoice::External(mutator) => {
                    external.push(ExternalMutation {
                        mutator,
                        parent: parent.clone(),
                        rng: rng.fork(),
                    });
                    break;
                }
                MutatorChoice::Builtin(mutator) => {
                    let child = mutator.mutate(parent, rng);
                    if child.is_some_and(|child| children.offer(child, produced)) {
                        break;
                    }
                }
            }
        }
    }
    if !external.is_empty() {
        let requested = external.len();
        let results = hooks.mutate(external).map_err(SearchError::Hook)?;
        if results.len() != requested {
            return Err(SearchError::Invalid(CoreError::InvalidArgument(format!(
                "external mutators returned {} results for {requested} requests",
                results.len()
            ))));
        }
        for child in results.into_iter().flatten() {
            children.offer(child, produced);
        }
    }
    Ok(children)
}

/// Runs the generations and returns every candidate that got a score, in scoring order,
/// each decision hash once. `initial` is scored first (one hook call), then each
/// generation's new children (one call per generation that made any).
pub fn explore<H: SearchHooks>(
    initial: Vec<Trace>,
    hooks: &mut H,
    rng: &mut Rng,
    config: &EvolveConfig,
) -> Result<Vec<Scored>, SearchError<H::Error>> {
    config.check().map_err(SearchError::Invalid)?;
    let mutators = WeightedChoice::new(config.mutators.iter().map(|(_, weight)| *weight))
        .expect("checked: positive total weight");
    let mut produced = DecisionSet::new();
    let mut first = Batch::default();
    for trace in initial {
        first.offer(trace, &mut produced);
    }
    let mut scored = score_batch(hooks, first)?;
    let mut population: Vec<usize> = (0..scored.len()).collect();
    keep_best(&mut population, &scored, config.population_size);
    for _ in 0..config.generations {
        if population.is_empty() {
            break;
        }
        let parents: Vec<&Scored> = population.iter().map(|&index| &scored[index]).collect();
        let children = breed(&parents, &mutators, hooks, rng, config, &mut produced)?;
        let first_child = scored.len();
        scored.extend(score_batch(hooks, children)?);
        population.extend(first_child..scored.len());
        keep_best(&mut population, &scored, config.population_size);
    }
    Ok(scored)
}

/// Picks up to `num_select` candidates whose hashes are not in `seen`, all distinct: the
/// best by score, then [`random_share`] of them uniformly at random from the remaining ones
/// (exploration the cost model cannot bias). Adds them to `seen` and returns them best
/// first, then the random ones.
pub fn select(
    candidates: Vec<Scored>,
    seen: &mut DecisionSet,
    config: &EvolveConfig,
    rng: &mut Rng,
) -> Vec<Trace> {
    let mut pool: Vec<Scored> = candidates
        .into_iter()
        .filter(|candidate| !seen.contains(candidate.decision_hash))
        .collect();
    sort_best_first(&mut pool);
    let mut distinct = DecisionSet::new();
    pool.retain(|candidate| distinct.insert(candidate.decision_hash));
    let num_random = random_share(config, rng);
    let num_best = (config.num_select - num_random).min(pool.len());
    let mut rest = pool.split_off(num_best);
    let num_random = num_random.min(rest.len());
    for position in 0..num_random {
        let remaining = (rest.len() - position) as u64;
        rest.swap(position, position + rng.below(remaining) as usize);
    }
    rest.truncate(num_random);
    pool.extend(rest);
    pool.into_iter()
        .map(|candidate| {
            seen.insert(candidate.decision_hash);
            candidate.trace
        })
        .collect()
}

/// How many of `num_select` are drawn at random: `num_select * eps_greedy` rounded down,
/// plus one with the probability of its fraction, so that small batches explore too (16 at
/// 0.05 would otherwise never draw one) and the share is `eps_greedy` on average.
fn random_share(config: &EvolveConfig, rng: &mut Rng) -> usize {
    let expected = config.num_select as f64 * config.eps_greedy;
    let rounded_up = rng.random() < expected.fract();
    (expected as usize + usize::from(rounded_up)).min(config.num_select)
}

/// [`explore`] then [`select`]: the traces to measure next.
pub fn evolve<H: SearchHooks>(
    initial: Vec<Trace>,
    hooks: &mut H,
    rng: &mut Rng,
    seen: &mut DecisionSet,
    config: &EvolveConfig,
) -> Result<Vec<Trace>, SearchError<H::Error>> {
    let candidates = explore(initial, hooks, rng, config)?;
    Ok(select(candidates, seen, config, rng))
}

/// The hooks of a search driven from Python: each call takes the GIL for its batch.
struct PythonHooks {
    score: Py<PyAny>,
    mutators: PythonMutators,
}

/// `type(value).__name__`, for error messages.
fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|name| name.to_string())
        .unwrap_or_else(|_| "<unknown type>".to_string())
}

impl SearchHooks for PythonHooks {
    type Error = PyErr;

    fn score(&mut self, candidates: &[Trace]) -> PyResult<Vec<Option<f64>>> {
        Python::attach(|py| {
            let batch = PyList::new(py, candidates.iter().cloned())?;
            let scores = self.score.bind(py).call1((batch,))?;
            scores.extract().map_err(|cause| {
                let err = PyTypeError::new_err(format!(
                    "score must return a sequence of float or None, got {}",
                    type_name(&scores)
                ));
                err.set_cause(py, Some(cause));
                err
            })
        })
    }

    fn mutate(&mut self, requests: Vec<ExternalMutation>) -> PyResult<Vec<Option<Trace>>> {
        Python::attach(|py| {
            requests
                .into_iter()
                .map(|request| {
                    let (name, mutator) = &self.mutators[request.mutator];
                    let child = mutator.bind(py).call1((request.parent, request.rng))?;
                    if child.is_none() {
                        return Ok(None);
                    }
                    let child = child.cast::<Trace>().map_err(|_| {
                        PyTypeError::new_err(format!(
                            "python mutator '{name}' returned {}, expected Trace or None",
                            type_name(&child)
                        ))
                    })?;
                    Ok(Some(child.borrow().clone()))
                })
                .collect()
        })
    }
}

/// Python mutators by name, in the order `MutatorChoice::External` indexes them.
type PythonMutators = Vec<(String, Py<PyAny>)>;

/// Resolves `mutators` (name, weight) against the built-in mutators and `python_mutators`;
/// returns the weighted choices and the Python callables they index.
fn resolve_mutators(
    weights: Vec<(String, f64)>,
    python_mutators: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Vec<(MutatorChoice, f64)>, PythonMutators)> {
    let mut python = Vec::new();
    for (name, mutator) in python_mutators.into_iter().flat_map(|dict| dict.iter()) {
        let name = name
            .cast::<PyString>()
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "python_mutators keys must be str, got {}",
                    type_name(&name)
                ))
            })?
            .to_string();
        if builtin_mutator(&name).is_some() {
            return Err(PyValueError::new_err(format!(
                "python mutator '{name}' has the name of a built-in mutator; give it another name"
            )));
        }
        if !mutator.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "python mutator '{name}' is not callable ({})",
                type_name(&mutator)
            )));
        }
        python.push((name, mutator.unbind()));
    }
    let mut choices = Vec::with_capacity(weights.len());
    for (position, (name, weight)) in weights.iter().enumerate() {
        if weights[..position]
            .iter()
            .any(|(earlier, _)| earlier == name)
        {
            return Err(PyValueError::new_err(format!(
                "mutator '{name}' is given two weights"
            )));
        }
        let choice = if let Some(index) = python.iter().position(|(known, _)| known == name) {
            MutatorChoice::External(index)
        } else if let Some(mutator) = builtin_mutator(name) {
            MutatorChoice::Builtin(mutator)
        } else {
            let builtin: Vec<&str> = BUILTIN_MUTATORS.iter().map(|m| m.name()).collect();
            let python: Vec<&str> = python.iter().map(|(name, _)| name.as_str()).collect();
            return Err(PyValueError::new_err(format!(
                "unknown mutator '{name}'; built-in: {}; python_mutators: {}",
                builtin.join(", "),
                if python.is_empty() {
                    "none".to_string()
                } else {
                    python.join(", ")
                }
            )));
        };
        choices.push((choice, *weight));
    }
    if let Some((name, _)) = python
        .iter()
        .find(|(name, _)| !weights.iter().any(|(weighted, _)| weighted == name))
    {
        return Err(PyValueError::new_err(format!(
            "python mutator '{name}' has no weight in mutators"
        )));
    }
    Ok((choices, python))
}

/// Evolves `initial` and returns the traces to measure next (see `_core.pyi`).
#[pyfunction]
#[pyo3(
    name = "evolve",
    signature = (
        initial, score, rng, *, seen, population_size = 512, generations = 4,
        mutate_prob = 0.85, mutators = default_mutator_weights(), python_mutators = None,
        num_select = 64, eps_greedy = 0.05,
    )
)]
#[allow(clippy::too_many_arguments)]
pub fn evolve_py(
    py: Python<'_>,
    initial: Vec<PyRef<'_, Trace>>,
    score: &Bound<'_, PyAny>,
    rng: &Bound<'_, Rng>,
    seen: &Bound<'_, DecisionSet>,
    population_size: usize,
    generations: usize,
    mutate_prob: f64,
    mutators: Vec<(String, f64)>,
    python_mutators: Option<&Bound<'_, PyDict>>,
    num_select: usize,
    eps_greedy: f64,
) -> PyResult<Vec<Trace>> {
    if !score.is_callable() {
        return Err(PyTypeError::new_err(format!(
            "score must be callable, got {}",
            type_name(score)
        )));
    }
    let (mutators, python_mutators) = resolve_mutators(mutators, python_mutators)?;
    let config = EvolveConfig {
        population_size,
        generations,
        mutate_prob,
        mutators,
        num_select,
        eps_greedy,
    };
    // Cloning consumes the borrows, so the caller's traces are free while the GIL is released.
    let initial: Vec<Trace> = initial
        .into_iter()
        .map(|trace| Trace::clone(&trace))
        .collect();
    let mut hooks = PythonHooks {
        score: score.clone().unbind(),
        mutators: python_mutators,
    };
    // The search draws from a copy, so Python code run by the hooks may use `rng` freely;
    // the copy's state is written back whatever the outcome.
    let mut search_rng = rng.try_borrow()?.clone();
    let explored = py.detach(|| explore(initial, &mut hooks, &mut search_rng, &config));
    let selected = explored.map_err(PyErr::from).and_then(|candidates| {
        let mut seen = seen.try_borrow_mut()?;
        let seen: &mut DecisionSet = &mut seen;
        Ok(py.detach(|| select(candidates, seen, &config, &mut search_rng)))
    });
    *rng.try_borrow_mut()? = search_rng;
    selected
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Decision;
    use crate::mutator::tests::{tiled_trace, TraceBuilder};
    use crate::mutator::{MutateCategorical, MutateTileSize};
    use crate::sampling::{sample_perfect_tile, TileLimits};

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Call {
        Score(usize),
        Mutate(usize),
    }

    /// Scores with a plain function, applies Rust mutators as if they were external, and
    /// records every call.
    struct TestHooks {
        objective: fn(&Trace) -> Option<f64>,
        external: Vec<&'static dyn Mutator>,
        calls: Vec<Call>,
        /// The valid scores of each score call.
        batch_scores: Vec<Vec<f64>>,
    }

    impl TestHooks {
        fn new(objective: fn(&Trace) -> Option<f64>) -> TestHooks {
            TestHooks {
                objective,
                external: Vec::new(),
                calls: Vec::new(),
                batch_scores: Vec::new(),
            }
        }
    }

    impl SearchHooks for TestHooks {
        type Error = String;

        fn score(&mut self, candidates: &[Trace]) -> Result<Vec<Option<f64>>, String> {
            self.calls.push(Call::Score(candidates.len()));
            let scores: Vec<Option<f64>> = candidates.iter().map(self.objective).collect();
            self.batch_scores
                .push(scores.iter().flatten().copied().collect());
            Ok(scores)
        }

        fn mutate(
            &mut self,
            requests: Vec<ExternalMutation>,
        ) -> Result<Vec<Option<Trace>>, String> {
            self.calls.push(Call::Mutate(requests.len()));
            Ok(requests
                .into_iter()
                .map(|mut request| {
                    self.external[request.mutator].mutate(&request.parent, &mut request.rng)
                })
                .collect())
        }
    }

    /// The innermost factor of the first tiling (of extent 512, limit 16).
    fn innermost(trace: &Trace) -> i64 {
        match trace.decision(2) {
            Some(Decision::Tile(factors)) => *factors.last().unwrap(),
            other => panic!("tile decision expected, got {other:?}"),
        }
    }

    fn prefer_large_innermost(trace: &Trace) -> Option<f64> {
        Some(innermost(trace) as f64)
    }

    /// `size` variants of [`tiled_trace`], all with innermost factor 1 in the first tiling.
    fn initial_population(size: usize, seed: u64) -> Vec<Trace> {
        let base = tiled_trace();
        let mut rng = Rng::new(seed);
        (0..size)
            .map(|_| {
                let mut first =
                    sample_perfect_tile(&mut rng, 512, 3, TileLimits::default()).unwrap();
                first.push(1);
                let second = sample_perfect_tile(&mut rng, 96, 4, TileLimits::default()).unwrap();
                base.with_decision(2, Decision::Tile(first))
                    .and_then(|trace| trace.with_decision(4, Decision::Tile(second)))
                    .unwrap()
            })
            .collect()
    }

    fn small_config() -> EvolveConfig {
        EvolveConfig {
            population_size: 64,
            generations: 4,
            num_select: 16,
            ..EvolveConfig::default()
        }
    }

    fn hashes(traces: &[Trace]) -> Vec<u64> {
        traces.iter().map(Trace::decision_hash).collect()
    }

    #[test]
    fn evolve_is_deterministic_per_seed() {
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut hooks = TestHooks::new(prefer_large_innermost);
            let mut seen = DecisionSet::new();
            let initial = initial_population(32, 0);
            let selected = evolve(initial, &mut hooks, &mut rng, &mut seen, &small_config());
            (hashes(&selected.unwrap()), rng, hooks.calls)
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1).0, run(2).0);
    }

    #[test]
    fn never_returns_seen_decisions_and_records_what_it_returns() {
        let initial = initial_population(32, 0);
        let mut seen: DecisionSet = hashes(&initial[..16]).into_iter().collect();
        let config = small_config();
        let run = |seen: &mut DecisionSet| {
            let mut hooks = TestHooks::new(prefer_large_innermost);
            evolve(initial.clone(), &mut hooks, &mut Rng::new(3), seen, &config).unwrap()
        };
        let before = seen.clone();
        let first = hashes(&run(&mut seen));
        assert_eq!(first.len(), 16);
        assert!(first.iter().all(|hash| !before.contains(*hash)));
        assert!(first.iter().all(|hash| seen.contains(*hash)));
        assert_eq!(seen.len(), before.len() + first.len());
        let second = hashes(&run(&mut seen));
        assert_eq!(second.len(), 16);
        assert!(second
            .iter()
            .all(|hash| !first.contains(hash) && !before.contains(*hash)));
    }

    #[test]
    fn returns_at_most_num_select_distinct_traces() {
        let config = EvolveConfig {
            num_select: 40,
            ..small_config()
        };
        let selected = evolve(
            initial_population(32, 1),
            &mut TestHooks::new(prefer_large_innermost),
            &mut Rng::new(0),
            &mut DecisionSet::new(),
            &config,
        )
        .unwrap();
        let mut distinct = hashes(&selected);
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 40);

        // A space of three points: 4 = 4*1 = 2*2 = 1*4.
        let mut b = TraceBuilder::default();
        let loops = b.loops(1);
        b.tile(&loops[0], vec![2, 2], 0);
        let selected = evolve(
            vec![b.trace],
            &mut TestHooks::new(|_| Some(0.0)),
            &mut Rng::new(0),
            &mut DecisionSet::new(),
            &config,
        )
        .unwrap();
        assert_eq!(selected.len(), 3);
    }

    #[test]
    fn eps_greedy_takes_the_best_then_random_others() {
        let mut hooks = TestHooks::new(|trace| Some(trace.decision_hash() as f64));
        let candidates = explore(
            initial_population(32, 2),
            &mut hooks,
            &mut Rng::new(0),
            &small_config(),
        )
        .unwrap();
        let mut by_score = candidates.clone();
        sort_best_first(&mut by_score);
        let ranked = |traces: &[Trace]| -> Vec<usize> {
            traces
                .iter()
                .map(|trace| {
                    by_score
                        .iter()
                        .position(|c| c.decision_hash == trace.decision_hash())
                        .unwrap()
                })
                .collect()
        };
        let config = EvolveConfig {
            num_select: 16,
            eps_greedy: 0.25,
            ..small_config()
        };
        let mut random_parts = Vec::new();
        for seed in 0..5 {
            let selected = select(
                candidates.clone(),
                &mut DecisionSet::new(),
                &config,
                &mut Rng::new(seed),
            );
            let ranks = ranked(&selected);
            assert_eq!(ranks[..12], (0..12).collect::<Vec<_>>(), "best first");
            assert!(ranks[12..].iter().all(|&rank| rank >= 12), "then others");
            random_parts.push(ranks[12..].to_vec());
        }
        random_parts.dedup();
        assert!(random_parts.len() > 1, "the others are drawn at random");
        let greedy = EvolveConfig {
            eps_greedy: 0.0,
            ..config
        };
        let selected = select(
            candidates,
            &mut DecisionSet::new(),
            &greedy,
            &mut Rng::new(0),
        );
        assert_eq!(ranked(&selected), (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn small_batches_draw_their_random_share_on_average() {
        let config = EvolveConfig {
            num_select: 16,
            eps_greedy: 0.05,
            ..small_config()
        };
        let mut rng = Rng::new(0);
        let draws: Vec<usize> = (0..4000).map(|_| random_share(&config, &mut rng)).collect();
        assert!(draws.iter().all(|&n| n <= 1), "0.8 rounds to 0 or 1");
        let mean = draws.iter().sum::<usize>() as f64 / draws.len() as f64;
        assert!((mean - 0.8).abs() < 0.03, "mean {mean}");
        let whole = EvolveConfig {
            eps_greedy: 0.25,
            ..config
        };
        assert!((0..100).all(|_| random_share(&whole, &mut rng) == 4));
    }

    #[test]
    fn population_improves_under_a_simple_objective() {
        let mut hooks = TestHooks::new(prefer_large_innermost);
        let selected = evolve(
            initial_population(64, 4),
            &mut hooks,
            &mut Rng::new(4),
            &mut DecisionSet::new(),
            &EvolveConfig {
                generations: 8,
                ..small_config()
            },
        )
        .unwrap();
        let mean = |scores: &[f64]| scores.iter().sum::<f64>() / scores.len() as f64;
        let means: Vec<f64> = hooks.batch_scores.iter().map(|s| mean(s)).collect();
        assert_eq!(means[0], 1.0, "initial innermost factors are all 1");
        // Rising each generation until half the limit; near the limit, mutations can only lower it.
        assert!(
            means
                .windows(2)
                .all(|pair| pair[1] > pair[0] || pair[0] > 8.0),
            "{means:?}"
        );
        assert!(means.last().unwrap() > &8.0, "{means:?}");
        assert_eq!(innermost(&selected[0]), 16, "the limit is found");
        let selected_mean = mean(
            &selected
                .iter()
                .map(|t| innermost(t) as f64)
                .collect::<Vec<_>>(),
        );
        assert!(selected_mean > 8.0, "{selected_mean}");
    }

    #[test]
    fn scores_and_external_mutations_come_in_one_batch_per_generation() {
        let mut hooks = TestHooks::new(prefer_large_innermost);
        hooks.external = vec![&MutateCategorical];
        let config = EvolveConfig {
            mutators: vec![
                (MutatorChoice::Builtin(&MutateTileSize), 0.5),
                (MutatorChoice::External(0), 0.5),
            ],
            ..small_config()
        };
        let mut rng = Rng::new(5);
        explore(initial_population(32, 5), &mut hooks, &mut rng, &config).unwrap();
        assert_eq!(hooks.calls[0], Call::Score(32));
        let generations: Vec<&[Call]> = hooks.calls[1..].chunks(2).collect();
        assert_eq!(generations.len(), config.generations);
        for generation in generations {
            let [Call::Mutate(requests), Call::Score(children)] = generation else {
                panic!("each generation mutates once, then scores once: {generation:?}");
            };
            assert!(*requests > 10 && *children > *requests, "{generation:?}");
        }
    }

    #[test]
    fn copying_only_scores_the_initial_population() {
        let mut hooks = TestHooks::new(prefer_large_innermost);
        let config = EvolveConfig {
            mutate_prob: 0.0,
            ..small_config()
        };
        let mut initial = initial_population(8, 6);
        initial.push(initial[0].clone());
        let candidates = explore(initial, &mut hooks, &mut Rng::new(6), &config).unwrap();
        assert_eq!(
            hooks.calls,
            vec![Call::Score(8)],
            "duplicates are scored once"
        );
        assert_eq!(candidates.len(), 8);
    }

    #[test]
    fn invalid_candidates_are_dropped() {
        let reject_odd_hashes = |trace: &Trace| {
            trace
                .decision_hash()
                .is_multiple_of(2)
                .then_some(innermost(trace) as f64)
        };
        let mut hooks = TestHooks::new(reject_odd_hashes);
        let candidates = explore(
            initial_population(32, 7),
            &mut hooks,
            &mut Rng::new(7),
            &small_config(),
        )
        .unwrap();
        assert!(candidates.len() > 100);
        assert!(candidates.iter().all(|c| c.decision_hash.is_multiple_of(2)));
        let none_valid = explore(
            initial_population(8, 7),
            &mut TestHooks::new(|_| None),
            &mut Rng::new(7),
            &small_config(),
        )
        .unwrap();
        assert!(none_valid.is_empty());
    }

    struct FailingHooks(Result<Vec<Option<f64>>, String>);

    impl SearchHooks for FailingHooks {
        type Error = String;

        fn score(&mut self, _: &[Trace]) -> Result<Vec<Option<f64>>, String> {
            self.0.clone()
        }
    }

    fn explore_with(hooks: &mut FailingHooks) -> Result<Vec<Scored>, SearchError<String>> {
        explore(
            initial_population(3, 0),
            hooks,
            &mut Rng::new(0),
            &small_config(),
        )
    }

    #[test]
    fn hook_errors_and_malformed_scores_stop_the_search() {
        let failing = explore_with(&mut FailingHooks(Err("boom".into())));
        assert!(matches!(failing, Err(SearchError::Hook(message)) if message == "boom"));
        let short = explore_with(&mut FailingHooks(Ok(vec![Some(1.0)])));
        assert!(
            matches!(short, Err(SearchError::Invalid(CoreError::InvalidArgument(m)))
            if m == "score returned 1 scores for 3 candidates")
        );
        let nan = explore_with(&mut FailingHooks(Ok(vec![None, Some(f64::NAN), None])));
        assert!(
            matches!(nan, Err(SearchError::Invalid(CoreError::InvalidArgument(m)))
            if m.starts_with("score returned NaN for candidate 1"))
        );
    }

    #[test]
    fn bad_configurations_are_rejected() {
        let check = |config: EvolveConfig| config.check().unwrap_err().to_string();
        assert_eq!(
            check(EvolveConfig {
                population_size: 0,
                ..EvolveConfig::default()
            }),
            "population_size must be at least 1"
        );
        assert_eq!(
            check(EvolveConfig {
                mutate_prob: 1.5,
                ..EvolveConfig::default()
            }),
            "mutate_prob must be in [0, 1], got 1.5"
        );
        assert!(check(EvolveConfig {
            eps_greedy: f64::NAN,
            ..EvolveConfig::default()
        })
        .starts_with("eps_greedy"));
        let weighted = |weight| EvolveConfig {
            mutators: vec![(MutatorChoice::Builtin(&MutateTileSize), weight)],
            ..EvolveConfig::default()
        };
        assert!(check(weighted(-1.0)).contains("finite and >= 0"));
        assert!(check(weighted(0.0)).contains("positive sum"));
        assert!(EvolveConfig::default().check().is_ok());
    }

    #[test]
    fn parents_are_drawn_by_shifted_score_or_uniformly() {
        let scored = |scores: &[f64]| -> Vec<Scored> {
            scores
                .iter()
                .map(|&score| Scored {
                    trace: Trace::new(),
                    decision_hash: 0,
                    score,
                })
                .collect()
        };
        let counts = |scores: &[f64]| {
            let population = scored(scores);
            let choice = WeightedChoice::by_score(&population.iter().collect::<Vec<_>>());
            let mut rng = Rng::new(0);
            let mut counts = vec![0usize; scores.len()];
            for _ in 0..4000 {
                counts[choice.pick(&mut rng)] += 1;
            }
            counts
        };
        let positive = counts(&[1.0, 3.0]);
        assert!((2800..3200).contains(&positive[1]), "{positive:?}");
        let negative = counts(&[-10.0, -5.0, 0.0]);
        assert_eq!(
            negative[0], 0,
            "the worst of negative scores is never a parent"
        );
        assert!(negative[2] > negative[1], "{negative:?}");
        let equal = counts(&[-2.0, -2.0]);
        assert!((1800..2200).contains(&equal[0]), "{equal:?}");
    }
}
