//! Traces: the record of a probabilistic schedule program applied to a tensor program.
//!
//! A trace is an ordered list of instructions plus the decisions taken by its sampling
//! instructions. Search clones traces and swaps their decisions constantly, so the
//! instructions live behind an `Arc` (shared by clones, copied only when a shared trace is
//! appended to) while the few decisions are held in a small sorted vector.

use std::collections::HashSet;
use std::sync::Arc;

use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde::{Deserialize, Deserializer, Serialize};

use crate::decision::{decision_from_py, decision_to_py, Decision};
use crate::errors::{CoreError, InvalidDecisionError};
use crate::hash::{StableHash, StableHasher};
use crate::instruction::{arg_from_py, entries_from_py, Instruction, RvId};

/// The serialization format version this build reads and writes.
const FORMAT_VERSION: u32 = 1;

/// The instructions of a trace and the random variables they define, shared between clones.
#[derive(Debug, Clone, Default)]
struct Program {
    instructions: Vec<Instruction>,
    defined_rvs: HashSet<RvId>,
}

impl Program {
    /// Appends `inst` after checking that it only uses defined rvs and defines new ones.
    fn push(&mut self, inst: Instruction) -> Result<usize, String> {
        let index = self.instructions.len();
        check_instruction(index, &inst, &self.defined_rvs)?;
        self.defined_rvs.extend(inst.outputs.iter().copied());
        self.instructions.push(inst);
        Ok(index)
    }
}

/// Checks that `inst`, to be placed at `index`, has JSON-encodable arguments, refers only
/// to rvs in `defined`, and defines rvs that are new.
fn check_instruction(
    index: usize,
    inst: &Instruction,
    defined: &HashSet<RvId>,
) -> Result<(), String> {
    let at = || format!("instruction {index} ({})", inst.kind);
    let mut referenced = Vec::new();
    for input in &inst.inputs {
        input
            .check_encodable()
            .map_err(|reason| format!("{}: input: {reason}", at()))?;
        input.collect_rvs(&mut referenced);
    }
    if let Some(rv) = referenced.iter().find(|rv| !defined.contains(rv)) {
        return Err(format!("{}: input refers to undefined rv {rv}", at()));
    }
    for (name, value) in &inst.attrs {
        value
            .check_encodable()
            .map_err(|reason| format!("{}: attr \"{name}\": {reason}", at()))?;
        referenced.clear();
        value.collect_rvs(&mut referenced);
        if let Some(rv) = referenced.iter().find(|rv| !defined.contains(rv)) {
            return Err(format!(
                "{}: attr \"{name}\" refers to undefined rv {rv}",
                at()
            ));
        }
    }
    for (position, rv) in inst.outputs.iter().enumerate() {
        if defined.contains(rv) || inst.outputs[..position].contains(rv) {
            return Err(format!("{}: output rv {rv} is already defined", at()));
        }
    }
    Ok(())
}

/// An ordered list of instructions plus the decisions of its sampling instructions.
#[pyclass(eq, module = "probtune._core")]
#[derive(Debug, Clone, Default)]
pub struct Trace {
    program: Arc<Program>,
    /// Sorted by instruction index, at most one per index, only on sampling instructions.
    decisions: Vec<(usize, Decision)>,
}

impl PartialEq for Trace {
    fn eq(&self, other: &Self) -> bool {
        (Arc::ptr_eq(&self.program, &other.program)
            || self.program.instructions == other.program.instructions)
            && self.decisions == other.decisions
    }
}

impl Trace {
    pub fn len(&self) -> usize {
        self.program.instructions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.program.instructions.is_empty()
    }

    pub fn instructions(&self) -> &[Instruction] {
        &self.program.instructions
    }

    pub fn instruction(&self, index: usize) -> Option<&Instruction> {
        self.program.instructions.get(index)
    }

    /// The decisions as (instruction index, decision), sorted by index.
    pub fn decisions(&self) -> &[(usize, Decision)] {
        &self.decisions
    }

    pub fn decision(&self, index: usize) -> Option<&Decision> {
        self.decisions
            .binary_search_by_key(&index, |(at, _)| *at)
            .ok()
            .map(|position| &self.decisions[position].1)
    }

    /// Whether both traces share one instruction list (as clones do until one appends).
    pub fn shares_instructions_with(&self, other: &Trace) -> bool {
        Arc::ptr_eq(&self.program, &other.program)
    }

    /// Appends `inst` (with the decision of a sampling instruction) and returns its index.
    /// Copies the instruction list first if another trace shares it.
    pub fn push(
        &mut self,
        inst: Instruction,
        decision: Option<Decision>,
    ) -> Result<usize, CoreError> {
        if decision.is_some() && !inst.is_sampling() {
            return Err(CoreError::InvalidDecision(format!(
                "instruction {} ({}) is not a sampling instruction and cannot carry a decision",
                self.len(),
                inst.kind
            )));
        }
        let index = Arc::make_mut(&mut self.program)
            .push(inst)
            .map_err(CoreError::InvalidArgument)?;
        if let Some(decision) = decision {
            // The new index is the largest, so the vector stays sorted.
            self.decisions.push((index, decision));
        }
        Ok(index)
    }

    /// A trace sharing these instructions with exactly the given decisions.
    pub fn with_decisions(
        &self,
        decisions: impl IntoIterator<Item = (usize, Decision)>,
    ) -> Result<Trace, CoreError> {
        let decisions = self
            .checked_decisions(decisions.into_iter().collect())
            .map_err(CoreError::InvalidDecision)?;
        Ok(Trace {
            program: Arc::clone(&self.program),
            decisions,
        })
    }

    /// A trace sharing these instructions with the decision of instruction `index` set to
    /// `decision` and every other decision kept: the one-decision change mutators make.
    pub fn with_decision(&self, index: usize, decision: Decision) -> Result<Trace, CoreError> {
        let mut decisions = self.decisions.clone();
        match decisions.binary_search_by_key(&index, |(at, _)| *at) {
            Ok(position) => decisions[position].1 = decision,
            Err(position) => {
                self.check_sampling_index(index)
                    .map_err(CoreError::InvalidDecision)?;
                decisions.insert(position, (index, decision));
            }
        }
        Ok(Trace {
            program: Arc::clone(&self.program),
            decisions,
        })
    }

    /// Sorts `decisions` by index after checking each names a distinct sampling instruction.
    fn checked_decisions(
        &self,
        mut decisions: Vec<(usize, Decision)>,
    ) -> Result<Vec<(usize, Decision)>, String> {
        decisions.sort_by_key(|(index, _)| *index);
        for (position, (index, _)) in decisions.iter().enumerate() {
            if position > 0 && decisions[position - 1].0 == *index {
                return Err(format!("instruction {index} is given two decisions"));
            }
            self.check_sampling_index(*index)?;
        }
        Ok(decisions)
    }

    /// Checks that `index` names a sampling instruction of this trace.
    fn check_sampling_index(&self, index: usize) -> Result<(), String> {
        let inst = self.instruction(index).ok_or_else(|| {
            format!(
                "decision for instruction {index}, but the trace has {} instructions",
                self.len()
            )
        })?;
        if !inst.is_sampling() {
            return Err(format!(
                "instruction {index} ({}) is not a sampling instruction and cannot carry a decision",
                inst.kind
            ));
        }
        Ok(())
    }

    /// Canonical JSON in the format [`Trace::from_json`] reads; equal traces give equal text.
    pub fn to_json(&self) -> String {
        let file = TraceFileRef {
            version: FORMAT_VERSION,
            insts: &self.program.instructions,
            decisions: &self.decisions,
        };
        serde_json::to_string(&file).expect("a validated trace always serializes")
    }

    /// Parses and validates `{"version": 1, "insts": [...], "decisions": [[index, decision], ...]}`.
    /// Any problem is a `TraceFormat` error saying what is wrong and where.
    pub fn from_json(text: &str) -> Result<Trace, CoreError> {
        let format_error = |reason: String| CoreError::TraceFormat(format!("trace JSON: {reason}"));
        let file = parse_trace_file(text).map_err(format_error)?;
        let mut program = Program {
            instructions: Vec::with_capacity(file.insts.len()),
            defined_rvs: HashSet::new(),
        };
        for inst in file.insts {
            program.push(inst).map_err(format_error)?;
        }
        let mut trace = Trace {
            program: Arc::new(program),
            decisions: Vec::new(),
        };
        trace.decisions = trace
            .checked_decisions(file.decisions)
            .map_err(format_error)?;
        Ok(trace)
    }
}

/// The serialized form, borrowed from a trace for writing.
#[derive(Serialize)]
struct TraceFileRef<'a> {
    version: u32,
    insts: &'a [Instruction],
    decisions: &'a [(usize, Decision)],
}

/// The serialized form as read, before semantic validation.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a trace object with version, insts and decisions"
)]
struct TraceFile {
    #[serde(rename = "version", deserialize_with = "deserialize_version")]
    _version: u32,
    insts: Vec<Instruction>,
    decisions: Vec<(usize, Decision)>,
}

/// Accepts only the version this build understands, so newer files fail loudly.
fn deserialize_version<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let version = u64::deserialize(deserializer)?;
    if version != u64::from(FORMAT_VERSION) {
        return Err(serde::de::Error::custom(format!(
            "unsupported trace format version {version}, this build reads version {FORMAT_VERSION}"
        )));
    }
    Ok(FORMAT_VERSION)
}

/// Parses the JSON text. Tracking the path of each value slows parsing by a third, so only
/// a failed parse is redone with tracking, to name where the problem is (`insts[3].outputs[0]`).
fn parse_trace_file(text: &str) -> Result<TraceFile, String> {
    serde_json::from_str(text).map_err(|err| {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        match serde_path_to_error::deserialize::<_, TraceFile>(&mut deserializer) {
            Err(located) if located.path().iter().next().is_some() => {
                format!("{}: {}", located.path(), located.inner())
            }
            _ => err.to_string(),
        }
    })
}

#[pymethods]
impl Trace {
    /// An empty trace.
    #[new]
    pub fn new() -> Trace {
        Trace::default()
    }

    /// Appends an instruction and returns its index (see `_core.pyi`).
    #[pyo3(signature = (kind, inputs, attrs, outputs, decision = None))]
    fn append(
        &mut self,
        kind: String,
        inputs: &Bound<'_, PyList>,
        attrs: &Bound<'_, PyDict>,
        outputs: Vec<RvId>,
        decision: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let inputs = inputs
            .iter()
            .map(|input| arg_from_py(&input))
            .collect::<PyResult<_>>()?;
        let inst = Instruction::new(kind, inputs, entries_from_py(attrs)?, outputs);
        let decision = decision.map(decision_from_py).transpose()?;
        Ok(self.push(inst, decision)?)
    }

    fn __len__(&self) -> usize {
        self.len()
    }

    #[getter(instructions)]
    fn instructions_py(&self) -> Vec<Instruction> {
        self.program.instructions.clone()
    }

    #[pyo3(name = "instruction")]
    fn instruction_py(&self, index: i64) -> PyResult<Instruction> {
        self.checked_index(index)
            .map(|index| self.program.instructions[index].clone())
    }

    #[getter(decisions)]
    fn decisions_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (index, decision) in &self.decisions {
            dict.set_item(index, decision_to_py(py, decision)?)?;
        }
        Ok(dict)
    }

    #[pyo3(name = "decision")]
    fn decision_py<'py>(&self, py: Python<'py>, index: i64) -> PyResult<Option<Bound<'py, PyAny>>> {
        let index = self.checked_index(index)?;
        self.decision(index)
            .map(|decision| decision_to_py(py, decision))
            .transpose()
    }

    #[pyo3(name = "with_decisions")]
    fn with_decisions_py(&self, decisions: &Bound<'_, PyDict>) -> PyResult<Trace> {
        let mut pairs = Vec::with_capacity(decisions.len());
        for (key, value) in decisions.iter() {
            let index: i64 = key.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "decision keys must be instruction indices (int), got {key:?}"
                ))
            })?;
            let index = usize::try_from(index).map_err(|_| {
                InvalidDecisionError::new_err(format!(
                    "decision for instruction {index}, which does not exist"
                ))
            })?;
            pairs.push((index, decision_from_py(&value)?));
        }
        Ok(self.with_decisions(pairs)?)
    }

    /// Stable hash of the decisions, equal for traces with equal decisions.
    pub fn decision_hash(&self) -> u64 {
        let mut hasher = StableHasher::new();
        hasher.write_len(self.decisions.len());
        for (index, decision) in &self.decisions {
            hasher.write_len(*index);
            decision.stable_hash(&mut hasher);
        }
        hasher.finish()
    }

    /// Stable hash of the instructions (kinds, inputs, attrs, outputs), ignoring decisions.
    pub fn structure_hash(&self) -> u64 {
        let mut hasher = StableHasher::new();
        hasher.write_len(self.len());
        self.program
            .instructions
            .iter()
            .for_each(|inst| inst.stable_hash(&mut hasher));
        hasher.finish()
    }

    /// Indices of the sampling instructions, in order.
    pub fn sampling_indices(&self) -> Vec<usize> {
        let insts = self.program.instructions.iter().enumerate();
        insts
            .filter(|(_, inst)| inst.is_sampling())
            .map(|(index, _)| index)
            .collect()
    }

    #[pyo3(name = "to_json")]
    fn to_json_py(&self, py: Python<'_>) -> String {
        py.detach(|| self.to_json())
    }

    #[staticmethod]
    #[pyo3(name = "from_json")]
    fn from_json_py(py: Python<'_>, text: &str) -> Result<Trace, CoreError> {
        py.detach(|| Trace::from_json(text))
    }

    fn copy(&self) -> Trace {
        self.clone()
    }

    fn __copy__(&self) -> Trace {
        self.clone()
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> Trace {
        self.clone()
    }

    fn __getstate__(&self, py: Python<'_>) -> String {
        self.to_json_py(py)
    }

    fn __setstate__(&mut self, py: Python<'_>, state: &str) -> Result<(), CoreError> {
        *self = Trace::from_json_py(py, state)?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "Trace({} instructions, {} decisions)",
            self.len(),
            self.decisions.len()
        )
    }
}

impl Trace {
    /// Turns a Python index into a valid instruction index, or raises `IndexError`.
    fn checked_index(&self, index: i64) -> PyResult<usize> {
        usize::try_from(index)
            .ok()
            .filter(|&index| index < self.len())
            .ok_or_else(|| {
                PyIndexError::new_err(format!(
                    "instruction index {index} out of range for a trace of {} instructions",
                    self.len()
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::instruction::Arg;

    fn inst(kind: &str, inputs: Vec<Arg>, outputs: Vec<RvId>) -> Instruction {
        Instruction::new(kind, inputs, BTreeMap::new(), outputs)
    }

    /// get_sblock -> get_loops -> sample_perfect_tile -> split -> sample_categorical.
    fn small_trace() -> Trace {
        let mut trace = Trace::new();
        let mut attrs = BTreeMap::new();
        attrs.insert("name".to_string(), Arg::Str("C".into()));
        trace
            .push(Instruction::new("get_sblock", vec![], attrs, vec![0]), None)
            .unwrap();
        trace
            .push(inst("get_loops", vec![Arg::Rv(0)], vec![1, 2]), None)
            .unwrap();
        let mut tile_attrs = BTreeMap::new();
        tile_attrs.insert("n".to_string(), Arg::Int(2));
        tile_attrs.insert("max_innermost_factor".to_string(), Arg::Int(16));
        trace
            .push(
                Instruction::new(
                    "sample_perfect_tile",
                    vec![Arg::Rv(1)],
                    tile_attrs,
                    vec![3, 4],
                ),
                Some(Decision::Tile(vec![8, 16])),
            )
            .unwrap();
        trace
            .push(
                inst(
                    "split",
                    vec![Arg::Rv(1), Arg::List(vec![Arg::Rv(3), Arg::Rv(4)])],
                    vec![5, 6],
                ),
                None,
            )
            .unwrap();
        trace
            .push(
                inst(
                    "sample_categorical",
                    vec![Arg::List(vec![Arg::Int(0), Arg::Int(16)])],
                    vec![7],
                ),
                Some(Decision::Index(1)),
            )
            .unwrap();
        trace
    }

    const SMALL_TRACE_JSON: &str = concat!(
        r#"{"version":1,"insts":["#,
        r#"{"kind":"get_sblock","inputs":[],"attrs":{"name":"C"},"outputs":[0]},"#,
        r#"{"kind":"get_loops","inputs":[{"rv":0}],"attrs":{},"outputs":[1,2]},"#,
        r#"{"kind":"sample_perfect_tile","inputs":[{"rv":1}],"attrs":{"max_innermost_factor":16,"n":2},"outputs":[3,4]},"#,
        r#"{"kind":"split","inputs":[{"rv":1},[{"rv":3},{"rv":4}]],"attrs":{},"outputs":[5,6]},"#,
        r#"{"kind":"sample_categorical","inputs":[[0,16]],"attrs":{},"outputs":[7]}"#,
        r#"],"decisions":[[2,[8,16]],[4,1]]}"#
    );

    fn format_error(json: &str) -> String {
        match Trace::from_json(json) {
            Err(CoreError::TraceFormat(message)) => message,
            other => panic!("expected a TraceFormat error for {json}, got {other:?}"),
        }
    }

    #[test]
    fn json_is_canonical_and_round_trips() {
        let trace = small_trace();
        assert_eq!(trace.to_json(), SMALL_TRACE_JSON);
        let parsed = Trace::from_json(SMALL_TRACE_JSON).unwrap();
        assert_eq!(parsed, trace);
        assert_eq!(parsed.to_json(), SMALL_TRACE_JSON);
    }

    #[test]
    fn json_accepts_whitespace_and_unsorted_decisions() {
        let json = SMALL_TRACE_JSON.replace(r#"[[2,[8,16]],[4,1]]"#, "[ [4, 1], [2, [8, 16]] ]");
        assert_eq!(Trace::from_json(&json).unwrap(), small_trace());
    }

    #[test]
    fn malformed_json_is_a_format_error_saying_what_and_where() {
        let replace = |from: &str, to: &str| {
            assert!(SMALL_TRACE_JSON.contains(from), "{from}");
            SMALL_TRACE_JSON.replacen(from, to, 1)
        };
        let cases: Vec<(String, &str)> = vec![
            ("not json".into(), "expected"),
            ("".into(), "EOF"),
            (
                "[]".into(),
                "expected a trace object with version, insts and decisions",
            ),
            (format!("{SMALL_TRACE_JSON} extra"), "trailing characters"),
            (
                replace(r#""version":1"#, r#""version":2"#),
                "unsupported trace format version 2",
            ),
            (
                replace(r#""version":1"#, r#""version":"1""#),
                "version: invalid type",
            ),
            (replace(r#""version":1,"#, ""), "missing field `version`"),
            (
                replace(r#""decisions""#, r#""extra":0,"decisions""#),
                "unknown field `extra`",
            ),
            (
                replace(r#""outputs":[0]"#, r#""outputs":[-1]"#),
                "insts[0].outputs[0]",
            ),
            (
                replace(r#""outputs":[0]"#, r#""outputs":[4294967296]"#),
                "insts[0].outputs[0]",
            ),
            (
                replace(
                    r#""attrs":{"name":"C"}"#,
                    r#""attrs":{"n":9223372036854775808}"#,
                ),
                "insts[0].attrs.n: integer 9223372036854775808 does not fit",
            ),
            (
                replace("[4,1]]", "[4,9223372036854775808]]"),
                "decisions[1][1]: decision 9223372036854775808 does not fit",
            ),
            (
                replace(r#""kind":"get_sblock""#, r#""kind":5"#),
                "insts[0].kind: invalid type",
            ),
            (
                replace(r#"{"rv":0}"#, r#"{"rv":17}"#),
                "instruction 1 (get_loops): input refers to undefined rv 17",
            ),
            (
                replace(r#""outputs":[1,2]"#, r#""outputs":[0,2]"#),
                "instruction 1 (get_loops): output rv 0 is already defined",
            ),
            (
                replace(r#""outputs":[1,2]"#, r#""outputs":[2,2]"#),
                "output rv 2 is already defined",
            ),
            (
                replace("[4,1]]", "[9,1]]"),
                "decision for instruction 9, but the trace has 5 instructions",
            ),
            (
                replace("[4,1]]", "[3,1]]"),
                "instruction 3 (split) is not a sampling instruction",
            ),
            (
                replace("[4,1]]", "[2,1]]"),
                "instruction 2 is given two decisions",
            ),
            (replace("[4,1]]", "[-4,1]]"), "decisions[1]"),
            (replace("[4,1]]", "[4,\"a\"]]"), "decisions[1]"),
            (replace("[4,1]]", "[4,1,2]]"), "decisions[1]"),
            (replace(r#"{"rv":0}"#, r#"{"rv":-3}"#), "rv reference"),
        ];
        for (json, expected) in cases {
            let message = format_error(&json);
            assert!(message.starts_with("trace JSON: "), "{message}");
            assert!(
                message.contains(expected),
                "for {json}\n  got: {message}\n  want: {expected}"
            );
        }
    }

    #[test]
    fn push_validates_rvs_and_decisions() {
        let mut trace = small_trace();
        let undefined = trace
            .push(inst("fuse", vec![Arg::Rv(99)], vec![8]), None)
            .unwrap_err();
        assert_eq!(
            undefined,
            CoreError::InvalidArgument(
                "instruction 5 (fuse): input refers to undefined rv 99".into()
            )
        );
        let reused = trace.push(inst("fuse", vec![], vec![7]), None).unwrap_err();
        assert!(matches!(reused, CoreError::InvalidArgument(_)));
        let not_sampling = trace
            .push(inst("fuse", vec![], vec![8]), Some(Decision::Index(0)))
            .unwrap_err();
        assert!(matches!(not_sampling, CoreError::InvalidDecision(_)));
        let mut attrs = BTreeMap::new();
        attrs.insert("x".to_string(), Arg::Float(f64::INFINITY));
        let bad_float = trace
            .push(Instruction::new("annotate", vec![], attrs, vec![]), None)
            .unwrap_err();
        assert!(bad_float.message().contains("attr \"x\""), "{bad_float}");
        assert_eq!(trace.len(), 5, "failed pushes leave the trace unchanged");
        assert_eq!(
            trace
                .push(inst("fuse", vec![Arg::Rv(5)], vec![8]), None)
                .unwrap(),
            5
        );
    }

    #[test]
    fn clone_shares_instructions_until_append() {
        let trace = small_trace();
        let mut copy = trace.clone();
        assert!(Arc::ptr_eq(&trace.program, &copy.program));
        copy.push(inst("fuse", vec![], vec![100]), None).unwrap();
        assert!(!copy.shares_instructions_with(&trace));
        assert_eq!(trace.len(), 5);
        assert_eq!(copy.len(), 6);
    }

    #[test]
    fn with_decisions_shares_instructions_and_replaces_decisions() {
        let trace = small_trace();
        let replaced = trace.with_decisions([(4, Decision::Index(0))]).unwrap();
        assert!(replaced.shares_instructions_with(&trace));
        assert_eq!(replaced.decisions(), &[(4, Decision::Index(0))]);
        assert_eq!(trace.with_decisions([]).unwrap().decisions(), &[]);
        let err = trace.with_decisions([(1, Decision::Index(0))]).unwrap_err();
        assert_eq!(
            err,
            CoreError::InvalidDecision(
                "instruction 1 (get_loops) is not a sampling instruction and cannot carry a decision".into()
            )
        );
        assert!(matches!(
            trace.with_decisions([(50, Decision::Index(0))]),
            Err(CoreError::InvalidDecision(_))
        ));
    }

    #[test]
    fn with_decision_changes_one_decision_and_shares_instructions() {
        let trace = small_trace();
        let changed = trace.with_decision(2, Decision::Tile(vec![16, 8])).unwrap();
        assert!(changed.shares_instructions_with(&trace));
        assert_eq!(
            changed.decisions(),
            &[(2, Decision::Tile(vec![16, 8])), (4, Decision::Index(1))]
        );
        let without_tile = trace.with_decisions([(4, Decision::Index(1))]).unwrap();
        let added = without_tile
            .with_decision(2, Decision::Tile(vec![1, 128]))
            .unwrap();
        assert_eq!(added.decisions()[0], (2, Decision::Tile(vec![1, 128])));
        assert!(matches!(
            trace.with_decision(3, Decision::Index(0)),
            Err(CoreError::InvalidDecision(_))
        ));
        assert!(matches!(
            trace.with_decision(9, Decision::Index(0)),
            Err(CoreError::InvalidDecision(_))
        ));
    }

    #[test]
    fn decision_lookup_and_sampling_indices() {
        let trace = small_trace();
        assert_eq!(trace.decision(2), Some(&Decision::Tile(vec![8, 16])));
        assert_eq!(trace.decision(3), None);
        assert_eq!(trace.sampling_indices(), vec![2, 4]);
    }

    #[test]
    fn hashes_are_pinned_across_runs_and_platforms() {
        let trace = small_trace();
        assert_eq!(trace.decision_hash(), 875637795184119841);
        assert_eq!(trace.structure_hash(), 15626604576768467756);
    }

    #[test]
    fn decision_hash_follows_decisions_only() {
        let trace = small_trace();
        let same = Trace::from_json(SMALL_TRACE_JSON).unwrap();
        assert_eq!(trace.decision_hash(), same.decision_hash());
        let changed = trace
            .with_decisions([(2, Decision::Tile(vec![16, 8])), (4, Decision::Index(1))])
            .unwrap();
        assert_ne!(trace.decision_hash(), changed.decision_hash());
        assert_eq!(trace.structure_hash(), changed.structure_hash());
        let mut longer = trace.clone();
        longer.push(inst("fuse", vec![], vec![100]), None).unwrap();
        assert_eq!(trace.decision_hash(), longer.decision_hash());
        assert_ne!(trace.structure_hash(), longer.structure_hash());
    }

    #[test]
    fn equality_compares_instructions_and_decisions() {
        let trace = small_trace();
        assert_eq!(trace, Trace::from_json(&trace.to_json()).unwrap());
        assert_ne!(trace, trace.with_decisions([]).unwrap());
        assert_ne!(trace, Trace::new());
    }
}
