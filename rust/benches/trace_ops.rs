//! Benchmarks of the trace operations a search performs per candidate: clone, JSON round
//! trip (database and worker transfer) and decision hashing (deduplication).

mod matmul_trace;

use std::hint::black_box;

use _core::trace::Trace;
use criterion::{criterion_group, criterion_main, Criterion};
use matmul_trace::matmul_schedule_trace;

fn bench_trace_ops(c: &mut Criterion) {
    let trace = matmul_schedule_trace();
    assert_eq!(trace.len(), 40);
    let json = trace.to_json();
    println!(
        "bench trace: {} instructions, {} decisions, {} bytes of JSON",
        trace.len(),
        trace.decisions().len(),
        json.len()
    );

    c.bench_function("clone", |b| b.iter(|| black_box(&trace).clone()));
    c.bench_function("to_json", |b| b.iter(|| black_box(&trace).to_json()));
    c.bench_function("from_json", |b| {
        b.iter(|| Trace::from_json(black_box(&json)).expect("valid"))
    });
    c.bench_function("json_round_trip", |b| {
        b.iter(|| Trace::from_json(&black_box(&trace).to_json()).expect("valid"))
    });
    c.bench_function("decision_hash", |b| {
        b.iter(|| black_box(&trace).decision_hash())
    });
    c.bench_function("clone_round_trip_hash", |b| {
        b.iter(|| {
            let copy = black_box(&trace).clone();
            let restored = Trace::from_json(&copy.to_json()).expect("valid");
            restored.decision_hash()
        })
    });
}

criterion_group!(benches, bench_trace_ops);
criterion_main!(benches);
