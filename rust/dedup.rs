//! Deduplication by decision hash: a measurement costs seconds, so the same decisions are
//! never measured twice, whether in this search or in an earlier run held by the database.

use std::collections::HashSet;

use pyo3::prelude::*;

/// A set of decision hashes (`Trace.decision_hash()`). Python: `DecisionSet(hashes=())`.
#[pyclass(module = "probtune._core")]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecisionSet {
    hashes: HashSet<u64>,
}

impl DecisionSet {
    pub fn new() -> DecisionSet {
        DecisionSet::default()
    }

    /// Adds `decision_hash`; true when it was not in the set yet.
    pub fn insert(&mut self, decision_hash: u64) -> bool {
        self.hashes.insert(decision_hash)
    }

    pub fn contains(&self, decision_hash: u64) -> bool {
        self.hashes.contains(&decision_hash)
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }
}

impl Extend<u64> for DecisionSet {
    fn extend<I: IntoIterator<Item = u64>>(&mut self, hashes: I) {
        self.hashes.extend(hashes);
    }
}

impl FromIterator<u64> for DecisionSet {
    fn from_iter<I: IntoIterator<Item = u64>>(hashes: I) -> DecisionSet {
        DecisionSet {
            hashes: hashes.into_iter().collect(),
        }
    }
}

#[pymethods]
impl DecisionSet {
    #[new]
    #[pyo3(signature = (hashes = None))]
    fn py_new(hashes: Option<&Bound<'_, PyAny>>) -> PyResult<DecisionSet> {
        let mut set = DecisionSet::new();
        if let Some(hashes) = hashes {
            set.extend_py(hashes)?;
        }
        Ok(set)
    }

    /// Adds a hash; true when it was new.
    fn add(&mut self, decision_hash: u64) -> bool {
        self.insert(decision_hash)
    }

    /// Adds every hash of an iterable of ints; returns how many were new.
    #[pyo3(name = "extend")]
    fn extend_py(&mut self, hashes: &Bound<'_, PyAny>) -> PyResult<usize> {
        let before = self.len();
        for hash in hashes.try_iter()? {
            self.insert(hash?.extract()?);
        }
        Ok(self.len() - before)
    }

    /// Like a Python set, a value that cannot be a hash (not an int in [0, 2**64)) is absent.
    fn __contains__(&self, decision_hash: &Bound<'_, PyAny>) -> bool {
        decision_hash
            .extract::<u64>()
            .is_ok_and(|hash| self.contains(hash))
    }

    fn __len__(&self) -> usize {
        self.len()
    }

    fn __repr__(&self) -> String {
        format!("DecisionSet({} hashes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_reports_whether_the_hash_is_new() {
        let mut set = DecisionSet::new();
        assert!(set.is_empty());
        assert!(set.insert(7));
        assert!(!set.insert(7));
        assert!(set.insert(u64::MAX));
        assert!(set.contains(7) && set.contains(u64::MAX) && !set.contains(8));
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn extend_and_collect_merge_hashes() {
        let mut set: DecisionSet = [1, 2, 2, 3].into_iter().collect();
        assert_eq!(set.len(), 3);
        set.extend([3, 4]);
        assert_eq!(set.len(), 4);
        assert!(set.contains(4));
    }
}
