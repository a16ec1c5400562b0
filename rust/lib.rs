//! `probtune._core`: traces, decisions, deterministic sampling, stable hashing, mutation,
//! deduplication and the evolutionary search loop of probtune.
//!
//! Everything is usable from pure Rust (tests, benches) without the GIL; this file only
//! registers the Python-visible names.

pub mod decision;
pub mod dedup;
pub mod errors;
pub mod hash;
pub mod instruction;
pub mod mutator;
pub mod population;
pub mod rng;
pub mod sampling;
pub mod trace;

use pyo3::prelude::*;

/// Traces, decisions, sampling, hashing, mutation, dedup and evolutionary search for probtune.
#[pymodule]
fn _core(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add_class::<trace::Trace>()?;
    module.add_class::<instruction::Instruction>()?;
    module.add_class::<rng::Rng>()?;
    module.add_class::<dedup::DecisionSet>()?;
    module.add_function(wrap_pyfunction!(sampling::sample_perfect_tile_py, module)?)?;
    module.add_function(wrap_pyfunction!(sampling::check_perfect_tile_py, module)?)?;
    module.add_function(wrap_pyfunction!(sampling::sample_categorical_py, module)?)?;
    module.add_function(wrap_pyfunction!(sampling::check_categorical_py, module)?)?;
    module.add_function(wrap_pyfunction!(mutator::mutate_tile_size_py, module)?)?;
    module.add_function(wrap_pyfunction!(mutator::mutate_categorical_py, module)?)?;
    module.add_function(wrap_pyfunction!(population::evolve_py, module)?)?;
    module.add(
        "TraceFormatError",
        py.get_type::<errors::TraceFormatError>(),
    )?;
    module.add(
        "InvalidDecisionError",
        py.get_type::<errors::InvalidDecisionError>(),
    )?;
    Ok(())
}
