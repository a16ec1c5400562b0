//! Errors of the core, usable from pure Rust and mapped onto Python exceptions at the FFI.

use std::fmt;

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::PyErr;

create_exception!(
    probtune._core,
    TraceFormatError,
    PyValueError,
    "Serialized trace text that does not describe a valid trace."
);
create_exception!(
    probtune._core,
    InvalidDecisionError,
    PyValueError,
    "A decision that does not fit its instruction (non-sampling kind, wrong tile product...)."
);

/// Every failure of the core; each variant becomes a distinct Python exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreError {
    /// Serialized trace text that is not a valid trace (raised as `TraceFormatError`).
    TraceFormat(String),
    /// A decision that does not fit its instruction (raised as `InvalidDecisionError`).
    InvalidDecision(String),
    /// An argument outside what the operation accepts (raised as `ValueError`).
    InvalidArgument(String),
}

impl CoreError {
    /// The human-readable description, without the variant name.
    pub fn message(&self) -> &str {
        match self {
            CoreError::TraceFormat(msg)
            | CoreError::InvalidDecision(msg)
            | CoreError::InvalidArgument(msg) => msg,
        }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for CoreError {}

impl From<CoreError> for PyErr {
    fn from(err: CoreError) -> PyErr {
        match err {
            CoreError::TraceFormat(msg) => TraceFormatError::new_err(msg),
            CoreError::InvalidDecision(msg) => InvalidDecisionError::new_err(msg),
            CoreError::InvalidArgument(msg) => PyValueError::new_err(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_shows_only_the_message() {
        let err = CoreError::InvalidDecision("decision [2] has product 2".to_string());
        assert_eq!(err.to_string(), "decision [2] has product 2");
        assert_eq!(CoreError::TraceFormat("x".into()).message(), "x");
        assert_eq!(CoreError::InvalidArgument("y".into()).message(), "y");
    }
}
