//! `xp._native`: the Rust SDK as a Python extension module.
//!
//! Everything that speaks one of xp's protocols goes through here, so Python
//! never reimplements one: the head's QUIC API (`client::Client` over
//! `xp_sdk::Client`), the node's metric and checkpoint lines, its verdict on a
//! checkpoint and its local object channel (`trial::Trial` over
//! `xp_sdk::TrialContext`). The `xp` package (python/xp/) wraps these in typed,
//! documented functions; errors become the exception classes of `xp.errors`.

use pyo3::prelude::*;

mod client;
mod errors;
mod trial;

/// The module `xp._native`.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<trial::Trial>()?;
    module.add_class::<client::Client>()?;
    module.add("PROTOCOL_VERSION", xp_runtime::protocol::PROTOCOL_VERSION)?;
    Ok(())
}
