//! How long `ask()` takes once a searcher holds 200 observations in 10 dimensions,
//! for each algorithm: p50 and p99 in milliseconds over 40 asks.
//!
//! `cargo bench --bench ask_latency [-- --json]`. The reference in the same run is
//! random search, whose `ask` costs next to nothing.
#![allow(clippy::print_stdout, reason = "a bench binary reports on stdout")]

use std::time::Instant;

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
    ];
    if !json {
        println!(
            "| algorithm | observations | dims | ask p50 ms | ask p99 ms |\n|---|---|---|---|---|"
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
        for _ in 0..TIMED_ASKS {
            #[expect(clippy::disallowed_methods, reason = "a bench measures wall time")]
            let started = Instant::now();
            let suggestion = searcher
                .ask()
                .expect("an unbounded searcher always suggests");
            millis.push(started.elapsed().as_secs_f64() * 1e3);
            searcher.tell(suggestion.id, objective(&suggestion.config));
        }
        millis.sort_by(f64::total_cmp);
        let (p50, p99) = (
            quantile(&millis, 0.5).unwrap_or(f64::NAN),
            quantile(&millis, 0.99).unwrap_or(f64::NAN),
        );
        if json {
            println!(
                "{}",
                serde_json::json!({ "bench": "ask_latency", "algorithm": name, "observations": OBSERVATIONS, "dims": DIMENSIONS, "p50_ms": p50, "p99_ms": p99 })
            );
        } else {
            println!("| {name} | {OBSERVATIONS} | {DIMENSIONS} | {p50:.2} | {p99:.2} |");
        }
    }
}
