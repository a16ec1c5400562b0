//! Instructions of a trace and the JSON-like argument values they carry.
//!
//! An argument is plain JSON except that a reference to a random variable (the output of
//! an earlier instruction) is kept apart from literals: it is encoded as the object
//! `{"rv": id}`, in JSON and in Python alike. An object whose only key is `"rv"` is
//! therefore always a reference, and must hold an id in `0..=u32::MAX`.

use std::collections::BTreeMap;
use std::fmt;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::hash::{StableHash, StableHasher};

/// Id of a random variable: an output of one instruction, input of later ones.
pub type RvId = u32;

/// The key that marks an object as a random-variable reference.
const RV_KEY: &str = "rv";

/// Kinds starting with this prefix sample a random choice and may carry a decision.
const SAMPLING_PREFIX: &str = "sample_";

/// A JSON-like argument value in which random-variable references are distinct from literals.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Rv(RvId),
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Arg>),
    Map(BTreeMap<String, Arg>),
}

impl Arg {
    /// Appends every random variable referenced anywhere inside this value to `out`.
    pub fn collect_rvs(&self, out: &mut Vec<RvId>) {
        match self {
            Arg::Rv(id) => out.push(*id),
            Arg::List(items) => items.iter().for_each(|item| item.collect_rvs(out)),
            Arg::Map(entries) => entries.values().for_each(|value| value.collect_rvs(out)),
            Arg::Null | Arg::Bool(_) | Arg::Int(_) | Arg::Float(_) | Arg::Str(_) => {}
        }
    }

    /// Checks that the JSON encoding of this value decodes back to the same value:
    /// floats must be finite and no map may look like an rv reference.
    pub fn check_encodable(&self) -> Result<(), String> {
        match self {
            Arg::Float(value) if !value.is_finite() => {
                Err(format!("float {value} has no JSON encoding"))
            }
            Arg::List(items) => items.iter().try_for_each(Arg::check_encodable),
            Arg::Map(entries) => {
                if entries.len() == 1 && entries.contains_key(RV_KEY) {
                    return Err(format!(
                        "a map whose only key is \"{RV_KEY}\" would read back as an rv reference; use Arg::Rv"
                    ));
                }
                entries.values().try_for_each(Arg::check_encodable)
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let json = serde_json::to_string(self).map_err(|_| fmt::Error)?;
        f.write_str(&json)
    }
}

impl Serialize for Arg {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Arg::Rv(id) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry(RV_KEY, id)?;
                map.end()
            }
            Arg::Null => serializer.serialize_unit(),
            Arg::Bool(value) => serializer.serialize_bool(*value),
            Arg::Int(value) => serializer.serialize_i64(*value),
            Arg::Float(value) => serializer.serialize_f64(*value),
            Arg::Str(value) => serializer.serialize_str(value),
            Arg::List(items) => items.serialize(serializer),
            Arg::Map(entries) => entries.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Arg {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ArgVisitor)
    }
}

struct ArgVisitor;

impl<'de> Visitor<'de> for ArgVisitor {
    type Value = Arg;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a JSON value (null, bool, 64-bit int, float, string, list, object or {\"rv\": id})",
        )
    }

    fn visit_unit<E: de::Error>(self) -> Result<Arg, E> {
        Ok(Arg::Null)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Arg, E> {
        Ok(Arg::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Arg, E> {
        Ok(Arg::Int(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Arg, E> {
        i64::try_from(value).map(Arg::Int).map_err(|_| {
            E::custom(format!(
                "integer {value} does not fit in a signed 64-bit integer"
            ))
        })
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Arg, E> {
        Ok(Arg::Float(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Arg, E> {
        Ok(Arg::Str(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Arg, E> {
        Ok(Arg::Str(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Arg, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Arg::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Arg, A::Error> {
        let entries = collect_unique_entries(map)?;
        if entries.len() == 1 {
            if let Some(value) = entries.get(RV_KEY) {
                return rv_reference(value).map(Arg::Rv).map_err(de::Error::custom);
            }
        }
        Ok(Arg::Map(entries))
    }
}

/// Reads a JSON object into a map, rejecting repeated keys (JSON parsers disagree on them).
fn collect_unique_entries<'de, A: MapAccess<'de>>(
    mut map: A,
) -> Result<BTreeMap<String, Arg>, A::Error> {
    let mut entries = BTreeMap::new();
    while let Some(key) = map.next_key::<String>()? {
        let value = map.next_value()?;
        if entries.contains_key(&key) {
            return Err(de::Error::custom(format!("duplicate key \"{key}\"")));
        }
        entries.insert(key, value);
    }
    Ok(entries)
}

/// The rv id held by the value of an `{"rv": ...}` object.
fn rv_reference(value: &Arg) -> Result<RvId, String> {
    match value {
        Arg::Int(id) => RvId::try_from(*id).map_err(|_| {
            format!(
                "rv reference {{\"{RV_KEY}\": {id}}} needs an id in 0..={}",
                RvId::MAX
            )
        }),
        other => Err(format!(
            "rv reference {{\"{RV_KEY}\": {other}}} needs an integer id in 0..={}",
            RvId::MAX
        )),
    }
}

/// Deserializes instruction attributes, rejecting repeated keys like argument maps do.
fn deserialize_attrs<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, Arg>, D::Error> {
    struct AttrsVisitor;

    impl<'de> Visitor<'de> for AttrsVisitor {
        type Value = BTreeMap<String, Arg>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of attributes")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            collect_unique_entries(map)
        }
    }

    deserializer.deserialize_map(AttrsVisitor)
}

impl StableHash for Arg {
    fn stable_hash(&self, hasher: &mut StableHasher) {
        match self {
            Arg::Rv(id) => {
                hasher.write_u8(0);
                hasher.write_u32(*id);
            }
            Arg::Null => hasher.write_u8(1),
            Arg::Bool(value) => {
                hasher.write_u8(2);
                hasher.write_u8(u8::from(*value));
            }
            Arg::Int(value) => {
                hasher.write_u8(3);
                hasher.write_i64(*value);
            }
            Arg::Float(value) => {
                hasher.write_u8(4);
                hasher.write_f64(*value);
            }
            Arg::Str(value) => {
                hasher.write_u8(5);
                hasher.write_str(value);
            }
            Arg::List(items) => {
                hasher.write_u8(6);
                hasher.write_len(items.len());
                items.iter().for_each(|item| item.stable_hash(hasher));
            }
            Arg::Map(entries) => {
                hasher.write_u8(7);
                hash_entries(entries, hasher);
            }
        }
    }
}

fn hash_entries(entries: &BTreeMap<String, Arg>, hasher: &mut StableHasher) {
    hasher.write_len(entries.len());
    for (key, value) in entries {
        hasher.write_str(key);
        value.stable_hash(hasher);
    }
}

/// One step of a schedule program: `outputs = kind(inputs, attrs)`.
#[pyclass(frozen, eq, module = "probtune._core")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instruction {
    pub kind: String,
    pub inputs: Vec<Arg>,
    #[serde(deserialize_with = "deserialize_attrs")]
    pub attrs: BTreeMap<String, Arg>,
    pub outputs: Vec<RvId>,
}

impl Instruction {
    pub fn new(
        kind: impl Into<String>,
        inputs: Vec<Arg>,
        attrs: BTreeMap<String, Arg>,
        outputs: Vec<RvId>,
    ) -> Self {
        Instruction {
            kind: kind.into(),
            inputs,
            attrs,
            outputs,
        }
    }

    /// Whether this instruction makes a random choice, i.e. may carry a decision.
    pub fn is_sampling(&self) -> bool {
        self.kind.starts_with(SAMPLING_PREFIX)
    }
}

impl StableHash for Instruction {
    fn stable_hash(&self, hasher: &mut StableHasher) {
        hasher.write_str(&self.kind);
        hasher.write_len(self.inputs.len());
        self.inputs
            .iter()
            .for_each(|input| input.stable_hash(hasher));
        hash_entries(&self.attrs, hasher);
        hasher.write_len(self.outputs.len());
        self.outputs
            .iter()
            .for_each(|&output| hasher.write_u32(output));
    }
}

#[pymethods]
impl Instruction {
    #[getter(kind)]
    fn kind_py(&self) -> &str {
        &self.kind
    }

    #[getter(inputs)]
    fn inputs_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        args_to_py_list(py, &self.inputs)
    }

    #[getter(attrs)]
    fn attrs_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        entries_to_py_dict(py, &self.attrs)
    }

    #[getter(outputs)]
    fn outputs_py(&self) -> Vec<RvId> {
        self.outputs.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "Instruction(kind={:?}, inputs={}, attrs={}, outputs={})",
            self.kind,
            compact_json(&self.inputs),
            compact_json(&self.attrs),
            compact_json(&self.outputs)
        )
    }
}

/// Compact JSON for reprs; serializing arguments cannot fail (maps have string keys).
fn compact_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// Converts a Python value (None, bool, int, float, str, list, dict with str keys, or an
/// `{"rv": id}` dict) into an argument; any other type is a `TypeError` naming the value.
pub fn arg_from_py(value: &Bound<'_, PyAny>) -> PyResult<Arg> {
    if value.is_none() {
        return Ok(Arg::Null);
    }
    if let Ok(flag) = value.cast::<PyBool>() {
        return Ok(Arg::Bool(flag.is_true()));
    }
    if value.is_instance_of::<PyInt>() {
        return value.extract::<i64>().map(Arg::Int).map_err(|_| {
            PyTypeError::new_err(format!(
                "trace argument {} does not fit in a signed 64-bit integer",
                describe(value)
            ))
        });
    }
    if let Ok(float) = value.cast::<PyFloat>() {
        let number = float.value();
        if !number.is_finite() {
            return Err(PyValueError::new_err(format!(
                "trace argument {number} is not finite and has no JSON encoding"
            )));
        }
        return Ok(Arg::Float(number));
    }
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(Arg::Str(text.to_str()?.to_owned()));
    }
    if let Ok(list) = value.cast::<PyList>() {
        return list
            .iter()
            .map(|item| arg_from_py(&item))
            .collect::<PyResult<_>>()
            .map(Arg::List);
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let entries = entries_from_py(dict)?;
        if entries.len() == 1 {
            if let Some(id) = entries.get(RV_KEY) {
                return rv_reference(id).map(Arg::Rv).map_err(PyValueError::new_err);
            }
        }
        return Ok(Arg::Map(entries));
    }
    Err(PyTypeError::new_err(format!(
        "unsupported trace argument {}: expected None, bool, int, float, str, list, \
         dict with str keys, or {{\"rv\": id}}",
        describe(value)
    )))
}

/// Converts a dict with str keys (instruction attributes, argument maps) into entries.
pub fn entries_from_py(dict: &Bound<'_, PyDict>) -> PyResult<BTreeMap<String, Arg>> {
    let mut entries = BTreeMap::new();
    for (key, value) in dict.iter() {
        let key = key.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "trace argument keys must be str, got {}",
                describe(&key)
            ))
        })?;
        entries.insert(key.to_str()?.to_owned(), arg_from_py(&value)?);
    }
    Ok(entries)
}

/// Converts an argument into plain Python values, rv references becoming `{"rv": id}` dicts.
pub fn arg_to_py<'py>(py: Python<'py>, arg: &Arg) -> PyResult<Bound<'py, PyAny>> {
    Ok(match arg {
        Arg::Rv(id) => {
            let dict = PyDict::new(py);
            dict.set_item(RV_KEY, id)?;
            dict.into_any()
        }
        Arg::Null => py.None().into_bound(py),
        Arg::Bool(value) => PyBool::new(py, *value).to_owned().into_any(),
        Arg::Int(value) => value.into_pyobject(py)?.into_any(),
        Arg::Float(value) => PyFloat::new(py, *value).into_any(),
        Arg::Str(value) => PyString::new(py, value).into_any(),
        Arg::List(items) => args_to_py_list(py, items)?.into_any(),
        Arg::Map(entries) => entries_to_py_dict(py, entries)?.into_any(),
    })
}

fn args_to_py_list<'py>(py: Python<'py>, args: &[Arg]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for arg in args {
        list.append(arg_to_py(py, arg)?)?;
    }
    Ok(list)
}

fn entries_to_py_dict<'py>(
    py: Python<'py>,
    entries: &BTreeMap<String, Arg>,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in entries {
        dict.set_item(key, arg_to_py(py, value)?)?;
    }
    Ok(dict)
}

/// `repr(value)` and its type name, for error messages.
fn describe(value: &Bound<'_, PyAny>) -> String {
    let repr = value
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into());
    let type_name = value
        .get_type()
        .fully_qualified_name()
        .map(|name| name.to_string())
        .unwrap_or_else(|_| "?".into());
    format!("{repr} (type {type_name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Arg, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn rv_reference_is_distinct_from_a_plain_map() {
        assert_eq!(parse(r#"{"rv": 3}"#).unwrap(), Arg::Rv(3));
        let map = parse(r#"{"rv": 3, "other": null}"#).unwrap();
        assert!(matches!(map, Arg::Map(ref entries) if entries.len() == 2));
    }

    #[test]
    fn json_round_trip_keeps_every_variant() {
        let json = r#"[{"rv":0},null,true,-7,1.5,"x",[1,[2]],{"a":{"rv":4},"b":0.0}]"#;
        let arg = parse(json).unwrap();
        assert_eq!(serde_json::to_string(&arg).unwrap(), json);
    }

    #[test]
    fn malformed_rv_references_are_rejected() {
        for json in [
            r#"{"rv": -1}"#,
            r#"{"rv": 4294967296}"#,
            r#"{"rv": "a"}"#,
            r#"{"rv": 1.0}"#,
        ] {
            let err = parse(json).unwrap_err().to_string();
            assert!(err.contains("rv reference"), "{json}: {err}");
        }
    }

    #[test]
    fn huge_and_duplicate_values_are_rejected() {
        assert!(parse("18446744073709551615")
            .unwrap_err()
            .to_string()
            .contains("64-bit"));
        assert!(parse(r#"{"a": 1, "a": 2}"#)
            .unwrap_err()
            .to_string()
            .contains("duplicate key"));
    }

    #[test]
    fn collect_rvs_finds_nested_references() {
        let arg = parse(r#"[{"rv": 1}, {"k": [{"rv": 2}]}, 3]"#).unwrap();
        let mut rvs = Vec::new();
        arg.collect_rvs(&mut rvs);
        assert_eq!(rvs, vec![1, 2]);
    }

    #[test]
    fn check_encodable_rejects_what_json_cannot_carry() {
        assert!(Arg::Float(f64::NAN).check_encodable().is_err());
        let fake_rv = Arg::Map(BTreeMap::from([("rv".to_string(), Arg::Int(1))]));
        assert!(Arg::List(vec![fake_rv]).check_encodable().is_err());
        assert!(parse(r#"[1, {"a": 2.5}]"#)
            .unwrap()
            .check_encodable()
            .is_ok());
    }

    #[test]
    fn sampling_kinds_are_recognised_by_prefix() {
        let inst = |kind: &str| Instruction::new(kind, vec![], BTreeMap::new(), vec![]);
        assert!(inst("sample_perfect_tile").is_sampling());
        assert!(!inst("split").is_sampling());
    }

    #[test]
    fn instruction_rejects_unknown_fields() {
        let json = r#"{"kind":"a","inputs":[],"attrs":{},"outputs":[],"extra":1}"#;
        assert!(serde_json::from_str::<Instruction>(json).is_err());
    }
}
