//! Throughput of the evolutionary search loop itself — mutation, dedup, population
//! bookkeeping and selection — with a trivial Rust scorer standing in for the cost model,
//! on the 40-instruction matmul schedule (population 512, 4 generations).

mod matmul_trace;

use std::hint::black_box;

use _core::decision::Decision;
use _core::dedup::DecisionSet;
use _core::instruction::Arg;
use _core::population::{evolve, EvolveConfig, SearchHooks};
use _core::rng::Rng;
use _core::sampling::{sample_categorical, sample_perfect_tile, TileLimits};
use _core::trace::Trace;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use matmul_trace::matmul_schedule_trace;

/// Fresh samples of the schedule's decisions, like the random part of a search's start.
fn initial_population(size: usize, rng: &mut Rng) -> Vec<Trace> {
    let base = matmul_schedule_trace();
    (0..size)
        .map(|_| {
            let decisions = base.decisions().iter().map(|(index, decision)| {
                let inst = base.instruction(*index).unwrap();
                let resampled = match (inst.kind.as_str(), decision) {
                    ("sample_perfect_tile", Decision::Tile(factors)) => {
                        let Some(Arg::Int(limit)) = inst.attrs.get("max_innermost_factor") else {
                            panic!("tile without a limit");
                        };
                        let extent = factors.iter().product();
                        Decision::Tile(
                            sample_perfect_tile(
                                rng,
                                extent,
                                factors.len(),
                                TileLimits::innermost(*limit),
                            )
                            .unwrap(),
                        )
                    }
                    ("sample_categorical", _) => {
                        Decision::Index(sample_categorical(rng, &[0.25; 4]).unwrap() as i64)
                    }
                    _ => decision.clone(),
                };
                (*index, resampled)
            });
            base.with_decisions(decisions.collect::<Vec<_>>()).unwrap()
        })
        .collect()
}

/// Scores by the sum of innermost tile factors (cheap, and gives the search a slope);
/// counts the candidates it scores.
#[derive(Default)]
struct InnermostScorer {
    scored: u64,
}

impl SearchHooks for InnermostScorer {
    type Error = std::convert::Infallible;

    fn score(&mut self, candidates: &[Trace]) -> Result<Vec<Option<f64>>, Self::Error> {
        self.scored += candidates.len() as u64;
        Ok(candidates
            .iter()
            .map(|trace| {
                let innermost =
                    trace
                        .decisions()
                        .iter()
                        .filter_map(|(_, decision)| match decision {
                            Decision::Tile(factors) => factors.last().copied(),
                            Decision::Index(_) => None,
                        });
                Some(innermost.sum::<i64>() as f64)
            })
            .collect())
    }
}

/// One search: 64 fresh samples in, 64 traces to measure out.
fn search(initial: &[Trace], scorer: &mut InnermostScorer) -> Vec<Trace> {
    let mut seen = DecisionSet::new();
    evolve(
        initial.to_vec(),
        scorer,
        &mut Rng::new(7),
        &mut seen,
        &EvolveConfig::default(),
    )
    .unwrap()
}

fn bench_search_loop(c: &mut Criterion) {
    let initial = initial_population(64, &mut Rng::new(0));
    let mut probe = InnermostScorer::default();
    let selected = search(&initial, &mut probe);
    println!(
        "search: {} initial traces, {} candidates scored per search, {} selected",
        initial.len(),
        probe.scored,
        selected.len()
    );
    let mut group = c.benchmark_group("search_loop");
    group.throughput(Throughput::Elements(probe.scored));
    group.bench_function("evolve_512x4_candidates", |b| {
        b.iter(|| search(black_box(&initial), &mut InnermostScorer::default()))
    });
    group.finish();
}

criterion_group!(benches, bench_search_loop);
criterion_main!(benches);
