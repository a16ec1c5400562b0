//! Decisions: the outcome chosen by a sampling instruction, replayable and mutable by search.

use std::fmt;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::hash::{StableHash, StableHasher};

/// The outcome of a sampling instruction. JSON and Python: a list of ints or an int.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Tile factors, outermost first (e.g. `sample_perfect_tile`).
    Tile(Vec<i64>),
    /// Index of the chosen candidate (e.g. `sample_categorical`).
    Index(i64),
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Tile(factors) => write!(f, "{factors:?}"),
            Decision::Index(index) => write!(f, "{index}"),
        }
    }
}

impl Serialize for Decision {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Decision::Tile(factors) => factors.serialize(serializer),
            Decision::Index(index) => serializer.serialize_i64(*index),
        }
    }
}

impl<'de> Deserialize<'de> for Decision {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DecisionVisitor)
    }
}

struct DecisionVisitor;

impl<'de> Visitor<'de> for DecisionVisitor {
    type Value = Decision;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a decision: a 64-bit int or a list of 64-bit ints")
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Decision, E> {
        Ok(Decision::Index(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Decision, E> {
        i64::try_from(value).map(Decision::Index).map_err(|_| {
            E::custom(format!(
                "decision {value} does not fit in a signed 64-bit integer"
            ))
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Decision, A::Error> {
        let mut factors = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(factor) = seq.next_element::<i64>()? {
            factors.push(factor);
        }
        Ok(Decision::Tile(factors))
    }
}

impl StableHash for Decision {
    fn stable_hash(&self, hasher: &mut StableHasher) {
        match self {
            Decision::Tile(factors) => {
                hasher.write_u8(0);
                hasher.write_len(factors.len());
                factors.iter().for_each(|&factor| hasher.write_i64(factor));
            }
            Decision::Index(index) => {
                hasher.write_u8(1);
                hasher.write_i64(*index);
            }
        }
    }
}

/// Converts a Python int or list of ints into a decision; anything else is a `TypeError`.
pub fn decision_from_py(value: &Bound<'_, PyAny>) -> PyResult<Decision> {
    let type_error = || {
        PyTypeError::new_err(format!(
            "a decision must be an int or a list of ints (64-bit), got {}",
            value
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| "<unprintable>".into())
        ))
    };
    if value.is_instance_of::<PyBool>() {
        return Err(type_error());
    }
    if value.is_instance_of::<PyInt>() {
        return value
            .extract::<i64>()
            .map(Decision::Index)
            .map_err(|_| type_error());
    }
    let list = value.cast::<PyList>().map_err(|_| type_error())?;
    let factors = list
        .iter()
        .map(|item| {
            if item.is_instance_of::<PyBool>() || !item.is_instance_of::<PyInt>() {
                return Err(type_error());
            }
            item.extract::<i64>().map_err(|_| type_error())
        })
        .collect::<PyResult<Vec<i64>>>()?;
    Ok(Decision::Tile(factors))
}

/// Converts a decision into a Python int or list of ints.
pub fn decision_to_py<'py>(py: Python<'py>, decision: &Decision) -> PyResult<Bound<'py, PyAny>> {
    Ok(match decision {
        Decision::Tile(factors) => PyList::new(py, factors)?.into_any(),
        Decision::Index(index) => index.into_pyobject(py)?.into_any(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_forms_are_a_list_or_an_int() {
        let tile: Decision = serde_json::from_str("[4, 1, 8]").unwrap();
        assert_eq!(tile, Decision::Tile(vec![4, 1, 8]));
        assert_eq!(serde_json::to_string(&tile).unwrap(), "[4,1,8]");
        let index: Decision = serde_json::from_str("2").unwrap();
        assert_eq!(index, Decision::Index(2));
        assert_eq!(serde_json::to_string(&index).unwrap(), "2");
    }

    #[test]
    fn other_json_is_rejected() {
        for json in [
            "\"a\"",
            "1.5",
            "[1, \"x\"]",
            "{}",
            "null",
            "9223372036854775808",
            "[1.0]",
        ] {
            assert!(serde_json::from_str::<Decision>(json).is_err(), "{json}");
        }
    }

    #[test]
    fn display_matches_python_repr() {
        assert_eq!(Decision::Tile(vec![3, 5]).to_string(), "[3, 5]");
        assert_eq!(Decision::Index(-1).to_string(), "-1");
    }

    #[test]
    fn tile_and_index_hash_differently() {
        let hash = |decision: &Decision| {
            let mut hasher = StableHasher::new();
            decision.stable_hash(&mut hasher);
            hasher.finish()
        };
        assert_ne!(hash(&Decision::Tile(vec![1])), hash(&Decision::Index(1)));
    }
}
