//! Rust errors as the typed exceptions of `xp.errors`.
//!
//! The classes are defined in Python (so they carry attributes such as
//! `RemoteError.code` and subclass the matching built-in, `LookupError`,
//! `PermissionError`, ...); this module picks the class for each error and
//! keeps the Rust error's whole message, causes included.

use pyo3::prelude::*;
use xp_runtime::error_chain::error_chain;
use xp_runtime::protocol::ErrorCode;
use xp_runtime::transport::TransportError;
use xp_sdk::{SdkError, WorkerError};

/// An instance of `xp.errors.<class>` built from `args`, as a `PyErr`; a
/// `RuntimeError` naming the class if the Python module cannot be imported.
fn raise<'py>(py: Python<'py>, class: &str, args: impl pyo3::call::PyCallArgs<'py>) -> PyErr {
    let made = py
        .import("xp.errors")
        .and_then(|errors| errors.getattr(class))
        .and_then(|class| class.call1(args));
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(error) => error,
    }
}

/// The class name and wire code of an error the head answered with.
fn remote_class(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::NotFound => "NotFoundError",
        ErrorCode::Forbidden | ErrorCode::BadToken => "ForbiddenError",
        ErrorCode::BadRequest => "BadRequestError",
        ErrorCode::TooManyPending | ErrorCode::Unavailable | ErrorCode::StorageUnavailable => {
            "UnavailableError"
        }
        _ => "RemoteError",
    }
}

/// A driver error as an `xp.errors` exception.
pub(crate) fn sdk_error(py: Python<'_>, error: SdkError) -> PyErr {
    let message = error_chain(&error);
    match &error {
        SdkError::JoinString(_) => raise(py, "JoinStringError", (message,)),
        SdkError::Transport(TransportError::Remote(remote)) => raise(
            py,
            remote_class(remote.code),
            (remote.message.clone(), format!("{:?}", remote.code)),
        ),
        SdkError::Transport(_) => raise(py, "ConnectError", (message,)),
        SdkError::Spec(_) => raise(py, "SpecError", (message,)),
        SdkError::Version(_) | SdkError::Program { .. } | SdkError::EntryWithoutProgram { .. } => {
            raise(py, "SubmitError", (message,))
        }
        SdkError::Object(_) | SdkError::ObjectLink(_) | SdkError::ObjectRelease { .. } => {
            raise(py, "ObjectError", (message,))
        }
        SdkError::Unexpected(_) => raise(py, "XpError", (message,)),
    }
}

/// A worker error as an `xp.errors` exception.
pub(crate) fn worker_error(py: Python<'_>, error: WorkerError) -> PyErr {
    let message = error_chain(&error);
    match error {
        WorkerError::Env { .. } => raise(py, "TrialEnvironmentError", (message,)),
        WorkerError::CheckpointFile { .. }
        | WorkerError::Restore { .. }
        | WorkerError::CheckpointRefused { .. }
        | WorkerError::CheckpointTimeout { .. } => raise(py, "CheckpointError", (message,)),
        WorkerError::ObjectFile { .. }
        | WorkerError::NodeChannel { .. }
        | WorkerError::ObjectMessage(_)
        | WorkerError::ObjectRefused { .. }
        | WorkerError::ObjectUnexpected { .. } => raise(py, "ObjectError", (message,)),
        // Parameters and collectives (the `cuda` feature adds NCCL's).
        _ => raise(py, "XpError", (message,)),
    }
}

/// Any other failure, with its message, as `xp.errors.<class>`.
pub(crate) fn other(py: Python<'_>, class: &str, message: String) -> PyErr {
    raise(py, class, (message,))
}
