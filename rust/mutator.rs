//! Decision mutators: small random changes to one decision of a trace, the moves of the
//! evolutionary search.
//!
//! A mutator never touches instructions: its result shares them with its input (cheap to
//! make by the thousand) and only one decision differs. Mutators that need TVM (a compute
//! location must be legal for the program) live in Python; the search loop takes both.

use pyo3::prelude::*;

use crate::decision::Decision;
use crate::instruction::{Arg, Instruction};
use crate::rng::Rng;
use crate::sampling::{divisors, sample_categorical, TileLimits};
use crate::trace::Trace;

/// Random moves tried before a tile-size mutation gives up: a move can be refused by the
/// innermost limit, and a trace may have no legal move at all.
const TILE_MUTATION_ATTEMPTS: usize = 16;

/// Changes one decision of a trace at random.
pub trait Mutator: Send + Sync {
    /// The name the search configuration refers to this mutator by.
    fn name(&self) -> &'static str;

    /// A trace differing from `trace` in exactly one decision, or `None` when this mutator
    /// finds nothing it can change.
    fn mutate(&self, trace: &Trace, rng: &mut Rng) -> Option<Trace>;
}

/// The mutators implemented in Rust.
pub const BUILTIN_MUTATORS: [&'static dyn Mutator; 2] = [&MutateTileSize, &MutateCategorical];

/// The built-in mutator called `name`, if any.
pub fn builtin_mutator(name: &str) -> Option<&'static dyn Mutator> {
    BUILTIN_MUTATORS
        .into_iter()
        .find(|mutator| mutator.name() == name)
}

/// An integer attribute of `inst`, if present and an int.
fn int_attr(inst: &Instruction, name: &str) -> Option<i64> {
    match inst.attrs.get(name) {
        Some(Arg::Int(value)) => Some(*value),
        _ => None,
    }
}

/// Moves a divisor of one level of a `sample_perfect_tile` decision to another level (as
/// MetaSchedule's MutateTileSize does): the product, the number of levels and the
/// instruction's limits (`max_innermost_factor`, `max_inner_product`) are kept. A whole level can move at once, so a tiling a
/// few levels away is a few moves away, not one move per prime factor.
pub struct MutateTileSize;

/// A `sample_perfect_tile` decision with a factor that can move.
struct TileSite<'a> {
    index: usize,
    factors: &'a [i64],
    limits: TileLimits,
}

impl MutateTileSize {
    /// The tile decisions worth mutating: well formed (`n` factors, all positive), at least
    /// two levels and one factor above 1.
    fn sites(trace: &Trace) -> Vec<TileSite<'_>> {
        trace
            .decisions()
            .iter()
            .filter_map(|(index, decision)| {
                let Decision::Tile(factors) = decision else {
                    return None;
                };
                let inst = trace.instruction(*index)?;
                let well_formed = inst.kind == "sample_perfect_tile"
                    && int_attr(inst, "n") == Some(factors.len() as i64)
                    && factors.iter().all(|&factor| factor >= 1);
                let movable = factors.len() >= 2 && factors.iter().any(|&factor| factor > 1);
                (well_formed && movable).then(|| TileSite {
                    index: *index,
                    factors,
                    limits: TileLimits {
                        max_innermost_factor: int_attr(inst, "max_innermost_factor").unwrap_or(0),
                        max_inner_product: int_attr(inst, "max_inner_product").unwrap_or(0),
                    },
                })
            })
            .collect()
    }

    /// One random move of `site`: a random divisor (above 1) of a random level goes to another
    /// random level. `None` when no divisor of that level can move there within the limits.
    fn random_move(site: &TileSite<'_>, rng: &mut Rng) -> Option<Vec<i64>> {
        let levels = site.factors.len();
        let splittable: Vec<usize> = (0..levels).filter(|&l| site.factors[l] > 1).collect();
        let from = splittable[rng.below(splittable.len() as u64) as usize];
        let other = rng.below(levels as u64 - 1) as usize;
        let to = if other >= from { other + 1 } else { other };
        let moves: Vec<i64> = divisors(site.factors[from])
            .into_iter()
            .filter(|&divisor| divisor > 1)
            .filter(|&divisor| {
                let mut moved = site.factors.to_vec();
                moved[from] /= divisor;
                moved[to].checked_mul(divisor).is_some_and(|factor| {
                    moved[to] = factor;
                    site.limits.allow(&moved)
                })
            })
            .collect();
        if moves.is_empty() {
            return None;
        }
        let divisor = moves[rng.below(moves.len() as u64) as usize];
        let mut factors = site.factors.to_vec();
        factors[from] /= divisor;
        factors[to] = factors[to].checked_mul(divisor)?;
        Some(factors)
    }
}

impl Mutator for MutateTileSize {
    fn name(&self) -> &'static str {
        "tile_size"
    }

    fn mutate(&self, trace: &Trace, rng: &mut Rng) -> Option<Trace> {
        let sites = Self::sites(trace);
        if sites.is_empty() {
            return None;
        }
        for _ in 0..TILE_MUTATION_ATTEMPTS {
            let site = &sites[rng.below(sites.len() as u64) as usize];
            if let Some(factors) = Self::random_move(site, rng) {
                return trace
                    .with_decision(site.index, Decision::Tile(factors))
                    .ok();
            }
        }
        None
    }
}

/// Changes a `sample_categorical` decision to another candidate, drawn by the instruction's
/// `probs` with the current choice left out.
pub struct MutateCategorical;

/// A `sample_categorical` decision with another candidate of positive probability.
struct CategoricalSite {
    index: usize,
    /// The instruction's probabilities with the current choice set to zero.
    other_weights: Vec<f64>,
}

impl MutateCategorical {
    /// Probabilities of `inst`: its `probs` attr, or uniform over `candidates` without one.
    /// `None` when they are malformed (wrong length, negative or not finite).
    fn weights(inst: &Instruction) -> Option<Vec<f64>> {
        let Some(Arg::List(candidates)) = inst.attrs.get("candidates") else {
            return None;
        };
        let Some(probs) = inst.attrs.get("probs") else {
            return Some(vec![1.0; candidates.len()]);
        };
        let Arg::List(probs) = probs else {
            return None;
        };
        if probs.len() != candidates.len() {
            return None;
        }
        probs
            .iter()
            .map(|prob| match prob {
                Arg::Float(p) if p.is_finite() && *p >= 0.0 => Some(*p),
                Arg::Int(p) if *p >= 0 => Some(*p as f64),
                _ => None,
            })
            .collect()
    }

    fn sites(trace: &Trace) -> Vec<CategoricalSite> {
        trace
            .decisions()
            .iter()
            .filter_map(|(index, decision)| {
                let Decision::Index(current) = decision else {
                    return None;
                };
                let inst = trace.instruction(*index)?;
                if inst.kind != "sample_categorical" {
                    return None;
                }
                let mut other_weights = Self::weights(inst)?;
                if let Some(weight) = usize::try_from(*current)
                    .ok()
                    .and_then(|current| other_weights.get_mut(current))
                {
                    *weight = 0.0;
                }
                let has_alternative = other_weights.iter().any(|&weight| weight > 0.0);
                has_alternative.then_some(CategoricalSite {
                    index: *index,
                    other_weights,
                })
            })
            .collect()
    }
}

impl Mutator for MutateCategorical {
    fn name(&self) -> &'static str {
        "categorical"
    }

    fn mutate(&self, trace: &Trace, rng: &mut Rng) -> Option<Trace> {
        let sites = Self::sites(trace);
        if sites.is_empty() {
            return None;
        }
        let site = &sites[rng.below(sites.len() as u64) as usize];
        let choice = sample_categorical(rng, &site.other_weights).ok()?;
        trace
            .with_decision(site.index, Decision::Index(choice as i64))
            .ok()
    }
}

#[pyfunction]
#[pyo3(name = "mutate_tile_size")]
pub fn mutate_tile_size_py(trace: PyRef<'_, Trace>, mut rng: PyRefMut<'_, Rng>) -> Option<Trace> {
    MutateTileSize.mutate(&trace, &mut rng)
}

#[pyfunction]
#[pyo3(name = "mutate_categorical")]
pub fn mutate_categorical_py(trace: PyRef<'_, Trace>, mut rng: PyRefMut<'_, Rng>) -> Option<Trace> {
    MutateCategorical.mutate(&trace, &mut rng)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::instruction::RvId;
    use crate::sampling::{check_perfect_tile, TileLimits};

    /// Builds test traces, handing out fresh rv ids.
    #[derive(Default)]
    pub(crate) struct TraceBuilder {
        pub trace: Trace,
        next_rv: RvId,
    }

    impl TraceBuilder {
        fn push(
            &mut self,
            kind: &str,
            inputs: Vec<Arg>,
            attrs: Vec<(&str, Arg)>,
            num_outputs: u32,
            decision: Option<Decision>,
        ) -> Vec<Arg> {
            let outputs: Vec<RvId> = (self.next_rv..self.next_rv + num_outputs).collect();
            self.next_rv += num_outputs;
            let attrs: BTreeMap<String, Arg> = attrs
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect();
            let inst = Instruction::new(kind, inputs, attrs, outputs.clone());
            self.trace.push(inst, decision).unwrap();
            outputs.into_iter().map(Arg::Rv).collect()
        }

        /// A block and `num_loops` of its loops.
        pub fn loops(&mut self, num_loops: u32) -> Vec<Arg> {
            let block = self.push(
                "get_sblock",
                vec![],
                vec![("name", Arg::Str("C".into()))],
                1,
                None,
            );
            self.push("get_loops", block, vec![], num_loops, None)
        }

        pub fn tile(&mut self, loop_rv: &Arg, factors: Vec<i64>, max_innermost_factor: i64) {
            self.tile_within(
                loop_rv,
                factors,
                TileLimits::innermost(max_innermost_factor),
            );
        }

        pub fn tile_within(&mut self, loop_rv: &Arg, factors: Vec<i64>, limits: TileLimits) {
            let mut attrs = vec![
                ("n", Arg::Int(factors.len() as i64)),
                (
                    "max_innermost_factor",
                    Arg::Int(limits.max_innermost_factor),
                ),
            ];
            if limits.max_inner_product > 0 {
                attrs.push(("max_inner_product", Arg::Int(limits.max_inner_product)));
            }
            let n = factors.len() as u32;
            let tiles = self.push(
                "sample_perfect_tile",
                vec![loop_rv.clone()],
                attrs,
                n,
                Some(Decision::Tile(factors)),
            );
            self.push(
                "split",
                vec![loop_rv.clone(), Arg::List(tiles)],
                vec![],
                n,
                None,
            );
        }

        pub fn categorical(&mut self, candidates: &[i64], probs: &[f64], decision: i64) {
            let attrs = vec![
                (
                    "candidates",
                    Arg::List(candidates.iter().map(|&c| Arg::Int(c)).collect()),
                ),
                (
                    "probs",
                    Arg::List(probs.iter().map(|&p| Arg::Float(p)).collect()),
                ),
            ];
            self.push(
                "sample_categorical",
                vec![],
                attrs,
                1,
                Some(Decision::Index(decision)),
            );
        }

        pub fn compute_location(&mut self, block: &Arg, decision: i64) {
            self.push(
                "sample_compute_location",
                vec![block.clone()],
                vec![],
                1,
                Some(Decision::Index(decision)),
            );
        }
    }

    /// Three tiled loops (the last with a tight innermost limit), an unroll choice and a
    /// compute location.
    pub(crate) fn tiled_trace() -> Trace {
        let mut b = TraceBuilder::default();
        let loops = b.loops(3);
        b.tile(&loops[0], vec![4, 2, 8, 8], 16);
        b.tile(&loops[1], vec![1, 1, 1, 96], 0);
        b.tile(&loops[2], vec![64, 2], 4);
        b.categorical(&[0, 16, 64, 512], &[0.25, 0.25, 0.25, 0.25], 1);
        b.compute_location(&loops[0], 2);
        b.trace
    }

    /// Indices whose decisions differ between two traces with the same instructions.
    fn changed_indices(before: &Trace, after: &Trace) -> Vec<usize> {
        assert!(after.shares_instructions_with(before));
        assert_eq!(before.decisions().len(), after.decisions().len());
        before
            .decisions()
            .iter()
            .zip(after.decisions())
            .filter(|(old, new)| old != new)
            .map(|((index, _), _)| *index)
            .collect()
    }

    #[test]
    fn tile_mutation_keeps_product_levels_and_innermost_limit() {
        let trace = tiled_trace();
        let mut mutated_sites = std::collections::BTreeSet::new();
        for seed in 0..2000 {
            let mut rng = Rng::new(seed);
            let mutated = MutateTileSize
                .mutate(&trace, &mut rng)
                .expect("tiles can move");
            let changed = changed_indices(&trace, &mutated);
            assert_eq!(changed.len(), 1, "seed {seed}");
            let index = changed[0];
            mutated_sites.insert(index);
            let inst = trace.instruction(index).unwrap();
            assert_eq!(inst.kind, "sample_perfect_tile");
            let (Some(Decision::Tile(old)), Some(Decision::Tile(new))) =
                (trace.decision(index), mutated.decision(index))
            else {
                panic!("tile decisions expected");
            };
            let product: i64 = old.iter().product();
            let limit = int_attr(inst, "max_innermost_factor").unwrap();
            check_perfect_tile(new, product, old.len(), TileLimits::innermost(limit)).unwrap();
        }
        assert_eq!(mutated_sites.len(), 3, "every tile decision gets mutated");
    }

    #[test]
    fn tile_mutation_keeps_the_inner_product_limit() {
        let limits = TileLimits {
            max_innermost_factor: 4,
            max_inner_product: 8,
        };
        let mut b = TraceBuilder::default();
        let loops = b.loops(1);
        b.tile_within(&loops[0], vec![8, 2, 2, 2], limits);
        let mut trace = b.trace;
        let mut rng = Rng::new(9);
        let mut reached = std::collections::BTreeSet::new();
        for _ in 0..300 {
            trace = MutateTileSize.mutate(&trace, &mut rng).unwrap();
            let Some(Decision::Tile(factors)) = trace.decision(2) else {
                panic!("a tile decision expected");
            };
            check_perfect_tile(factors, 64, 4, limits).unwrap();
            reached.insert(factors[0]);
        }
        assert_eq!(reached, [8, 16, 32, 64].into_iter().collect());
    }

    #[test]
    fn tile_mutation_reaches_every_tiling_of_a_small_extent() {
        let mut b = TraceBuilder::default();
        let loops = b.loops(1);
        b.tile(&loops[0], vec![2, 2, 2], 0);
        let mut trace = b.trace;
        let mut reached = std::collections::BTreeSet::new();
        let mut rng = Rng::new(3);
        for _ in 0..500 {
            trace = MutateTileSize.mutate(&trace, &mut rng).unwrap();
            if let Some(Decision::Tile(factors)) = trace.decision(2) {
                reached.insert(factors.clone());
            }
        }
        assert_eq!(
            reached.len(),
            10,
            "the 10 ways to place three 2s on three levels"
        );
    }

    #[test]
    fn tile_mutation_moves_a_whole_level_at_once() {
        let mut b = TraceBuilder::default();
        let loops = b.loops(1);
        b.tile(&loops[0], vec![1, 16, 2, 4], 4);
        let trace = b.trace;
        let reached: std::collections::BTreeSet<Vec<i64>> = (0..2000)
            .filter_map(|seed| MutateTileSize.mutate(&trace, &mut Rng::new(seed)))
            .filter_map(|mutated| match mutated.decision(2) {
                Some(Decision::Tile(factors)) => Some(factors.clone()),
                _ => None,
            })
            .collect();
        assert!(reached.contains(&vec![1, 1, 32, 4]), "16 moves in one step");
        assert!(
            reached.contains(&vec![4, 16, 2, 1]),
            "so does the innermost 4"
        );
        assert!(reached.contains(&vec![1, 8, 4, 4]), "and a prime alone");
        assert!(
            reached.iter().all(|factors| factors[3] <= 4),
            "within the innermost limit of 4 only: {reached:?}"
        );
    }

    #[test]
    fn tile_mutation_is_none_without_a_legal_move() {
        let mut b = TraceBuilder::default();
        let loops = b.loops(3);
        b.tile(&loops[0], vec![1, 1, 1], 0); // nothing to move
        b.tile(&loops[1], vec![12], 0); // a single level
        b.tile(&loops[2], vec![8, 1], 1); // every move overflows the innermost limit
        b.categorical(&[0, 1], &[0.5, 0.5], 0);
        let trace = b.trace;
        for seed in 0..200 {
            assert!(MutateTileSize.mutate(&trace, &mut Rng::new(seed)).is_none());
        }
        assert!(MutateTileSize
            .mutate(&Trace::new(), &mut Rng::new(0))
            .is_none());
    }

    #[test]
    fn categorical_mutation_picks_another_candidate_by_probability() {
        let trace = tiled_trace();
        let mut counts = [0usize; 4];
        for seed in 0..2000 {
            let mutated = MutateCategorical
                .mutate(&trace, &mut Rng::new(seed))
                .unwrap();
            assert_eq!(changed_indices(&trace, &mutated), vec![8]);
            let Some(Decision::Index(choice)) = mutated.decision(8) else {
                panic!("index decision expected");
            };
            counts[*choice as usize] += 1;
        }
        assert_eq!(counts[1], 0, "never the current choice");
        assert!(
            counts.iter().enumerate().all(|(i, &c)| i == 1 || c > 500),
            "{counts:?}"
        );
    }

    #[test]
    fn categorical_mutation_is_none_without_an_alternative() {
        let mut b = TraceBuilder::default();
        b.categorical(&[7], &[1.0], 0);
        b.categorical(&[0, 16, 64], &[0.0, 1.0, 0.0], 1);
        let trace = b.trace;
        assert!(MutateCategorical.mutate(&trace, &mut Rng::new(0)).is_none());
        let mut tiles_only = TraceBuilder::default();
        let loops = tiles_only.loops(1);
        tiles_only.tile(&loops[0], vec![4, 4], 0);
        assert!(MutateCategorical
            .mutate(&tiles_only.trace, &mut Rng::new(0))
            .is_none());
    }

    #[test]
    fn mutation_is_deterministic_per_seed() {
        let trace = tiled_trace();
        for mutator in BUILTIN_MUTATORS {
            let run = |seed| mutator.mutate(&trace, &mut Rng::new(seed)).unwrap();
            assert_eq!(run(5), run(5));
            assert!(
                (0..20).any(|seed| run(seed) != run(5)),
                "{}",
                mutator.name()
            );
        }
    }

    #[test]
    fn builtin_mutators_are_found_by_name() {
        assert_eq!(builtin_mutator("tile_size").unwrap().name(), "tile_size");
        assert_eq!(
            builtin_mutator("categorical").unwrap().name(),
            "categorical"
        );
        assert!(builtin_mutator("compute_location").is_none());
    }
}
