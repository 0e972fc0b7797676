//! How long `ask()` takes once a searcher holds 200 observations in 10 dimensions,
//! for each algorithm: p50 and p99 in milliseconds over 40 asks, of wall time and
//! of the asking thread's CPU time (which a machine busy with other work inflates
//! far less than wall time).
//!
//! `cargo bench --bench ask_latency [-- --json]`. The reference in the same run is
//! random search, whose `ask` costs next to nothing.
#![allow(clippy::print_stdout, reason = "a bench binary reports on stdout")]

use std::time::Instant;

use nix::libc;

use xp_runtime::spec::{Config, SearchSpace};
use xp_tune::search::{Acquisition, SearchAlgorithm, make_searcher};
use xp_tune::stats::quantile;

const DIMENSIONS: usize = 10;
const OBSERVATIONS: usize = 200;
const TIMED_ASKS: usize = 40;

fn objective(config: &Config) -> f64 {
    config
        .values()
        .map(|value| match value {
            xp_runtime::spec::ParamValue::Float(x) => (x - 0.3) * (x - 0.3),
            _ => 0.0,
        })
        .sum()
}

/// The CPU time this thread has used, in milliseconds.
fn thread_cpu_millis() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec and the clock id is a constant
    // every Linux kernel since 2.6.12 knows; the call writes only into `now`.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "the thread CPU clock is readable on Linux");
    now.tv_sec as f64 * 1e3 + now.tv_nsec as f64 / 1e6
}

fn main() {
    let json = std::env::args().any(|arg| arg == "--json");
    let mut builder = SearchSpace::builder();
    for dimension in 0..DIMENSIONS {
        builder = builder.uniform(format!("x{dimension}"), -1.0, 1.0);
    }
    let space = builder.build().expect("a valid 10-dimensional space");
    let algorithms = [
        ("random", SearchAlgorithm::Random),
        (
            "gp-ucb",
            SearchAlgorithm::Gp {
                acquisition: Acquisition::Ucb { kappa: 2.0 },
            },
        ),
        (
            "gp-ei",
            SearchAlgorithm::Gp {
                acquisition: Acquisition::Ei,
            },
        ),
        ("tpe", SearchAlgorithm::Tpe),
        ("tpe-mv", SearchAlgorithm::MultivariateTpe),
    ];
    if !json {
        println!(
            "| algorithm | observations | dims | ask p50 ms | ask p99 ms | CPU p50 ms | CPU p99 ms |\n|---|---|---|---|---|---|---|"
        );
    }
    for (name, algorithm) in algorithms {
        let mut searcher = make_searcher(algorithm, &space, 1);
        for _ in 0..OBSERVATIONS {
            let suggestion = searcher
                .ask()
                .expect("an unbounded searcher always suggests");
            searcher.tell(suggestion.id, objective(&suggestion.config));
        }
        let mut millis = Vec::with_capacity(TIMED_ASKS);
        let mut cpu_millis = Vec::with_capacity(TIMED_ASKS);
        for _ in 0..TIMED_ASKS {
            #[expect(clippy::disallowed_methods, reason = "a bench measures wall time")]
            let started = Instant::now();
            let cpu_started = thread_cpu_millis();
            let suggestion = searcher
                .ask()
                .expect("an unbounded searcher always suggests");
            cpu_millis.push(thread_cpu_millis() - cpu_started);
            millis.push(started.elapsed().as_secs_f64() * 1e3);
            searcher.tell(suggestion.id, objective(&suggestion.config));
        }
        let at = |values: &[f64], q: f64| quantile(values, q).unwrap_or(f64::NAN);
        let (p50, p99) = (at(&millis, 0.5), at(&millis, 0.99));
        let (cpu_p50, cpu_p99) = (at(&cpu_millis, 0.5), at(&cpu_millis, 0.99));
        if json {
            println!(
                "{}",
                serde_json::json!({ "bench": "ask_latency", "algorithm": name, "observations": OBSERVATIONS, "dims": DIMENSIONS, "p50_ms": p50, "p99_ms": p99, "cpu_p50_ms": cpu_p50, "cpu_p99_ms": cpu_p99 })
            );
        } else {
            println!(
                "| {name} | {OBSERVATIONS} | {DIMENSIONS} | {p50:.2} | {p99:.2} | {cpu_p50:.2} | {cpu_p99:.2} |"
            );
        }
    }
}
