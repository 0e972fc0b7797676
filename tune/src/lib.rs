//! Tuning engines: search algorithms, early-stopping rules and the statistics of
//! replicates, all pure (no I/O, no clock, no global randomness).
//!
//! - [`search`]: the ask/tell [`search::Searcher`] of every algorithm (grid,
//!   random, Sobol, Gaussian-process BO, TPE) over the checked
//!   `xp_runtime::spec::SearchSpace`, and `plan_trials` for the searches that
//!   expand up front.
//! - [`stopping`]: the median rule, ASHA and asynchronous Hyperband behind one
//!   sans-io [`stopping::StoppingRule`], built from the spec's `early_stopping`,
//!   and BOHB's Hyperband over [`hyperband`]'s schedule.
//! - [`stats`]: summaries with confidence intervals, Welch's t-test, quantiles and
//!   smoothing.
//! - [`report`]: what `xp report` computes: GPU-hours used and lost, cost,
//!   utilisation, Little's law, the return on GPU-hours and Amdahl fits.
//! - [`testfns`]: standard test functions and synthetic learning curves, for the
//!   benches.
//!
//! The head and `xp tune` link this crate; workers and the SDK do not, so a trial
//! process carries no linear algebra.
#![warn(missing_docs)]

pub mod hyperband;
pub mod report;
pub mod search;
pub mod stats;
pub mod stopping;
pub mod testfns;
