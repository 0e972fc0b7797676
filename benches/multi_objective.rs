//! Multi-objective search quality: the hypervolume that multi-objective TPE
//! (`algorithm: tpe` with several metrics, `xp_tune::search::MotpeSearcher`),
//! random search and Sobol points reach on the ZDT1, ZDT2 and ZDT3 problems at equal
//! evaluations, several seeds each.
//!
//! The problems are written from their published definitions (Zitzler, Deb and
//! Thiele 2000): `x ∈ [0, 1]^n`, `f1 = x1`, `g = 1 + 9·Σ_{i≥2} x_i / (n − 1)`,
//! `f2 = g·h(f1, g)` with `h = 1 − √(f1/g)` (ZDT1, a convex front),
//! `h = 1 − (f1/g)²` (ZDT2, concave) and `h = 1 − √(f1/g) − (f1/g)·sin(10π·f1)`
//! (ZDT3, disconnected); both objectives are minimised and the true front is
//! `g = 1`. The hypervolume is taken against the reference point (1.1, 11) (every
//! point of the box has f1 ≤ 1 and f2 ≤ 10, so all count); the table gives each
//! method's gap to the true front's hypervolume (smaller is better), its median
//! and mean over seeds, at each budget, and on how many seeds MOTPE beat random
//! search at the largest budget.
//!
//! `cargo bench --bench multi_objective [-- --json] [--seeds N] [--dims 5,10]
//! [--budgets 50,100,200]`.

#![allow(
    clippy::print_stdout,
    reason = "a bench binary reports its table on stdout"
)]

use anyhow::Context;
use xp_runtime::spec::{Config, ParamValue, SearchSpace};
use xp_tune::search::pareto::{hypervolume, pareto_front};
use xp_tune::search::{SearchAlgorithm, make_searcher};
use xp_tune::stats::quantile;

/// The hypervolume's reference point, beyond every point of the box.
const REFERENCE: [f64; 2] = [1.1, 11.0];

/// One ZDT problem.
#[derive(Debug, Clone, Copy)]
enum Zdt {
    One,
    Two,
    Three,
}

impl Zdt {
    fn name(self) -> &'static str {
        match self {
            Self::One => "zdt1",
            Self::Two => "zdt2",
            Self::Three => "zdt3",
        }
    }

    /// Both objectives of `x` (each in [0, 1]).
    fn evaluate(self, x: &[f64]) -> [f64; 2] {
        let f1 = x[0];
        let g = 1.0 + 9.0 * x[1..].iter().sum::<f64>() / (x.len() - 1) as f64;
        let ratio = f1 / g;
        let h = match self {
            Self::One => 1.0 - ratio.sqrt(),
            Self::Two => 1.0 - ratio * ratio,
            Self::Three => 1.0 - ratio.sqrt() - ratio * (10.0 * std::f64::consts::PI * f1).sin(),
        };
        [f1, g * h]
    }

    /// The hypervolume of the true front against [`REFERENCE`], from a dense
    /// sample of it (exact to well under the gaps reported).
    fn true_hypervolume(self) -> f64 {
        let points: Vec<Vec<f64>> = (0..=20_000)
            .map(|step| {
                let f1 = f64::from(step) / 20_000.0;
                let mut x = vec![0.0; 2];
                x[0] = f1;
                self.evaluate(&x).to_vec()
            })
            .collect();
        // The points come in order of f1, so the non-dominated ones are those
        // below every f2 before them (a quadratic front sort would be slow here).
        let mut lowest = f64::INFINITY;
        let front: Vec<Vec<f64>> = points
            .into_iter()
            .filter(|point| {
                let keep = point[1] < lowest;
                lowest = lowest.min(point[1]);
                keep
            })
            .collect();
        hypervolume(&front, &REFERENCE).expect("finite points of two objectives")
    }
}

fn real(config: &Config, name: &str) -> f64 {
    match config.get(name) {
        Some(ParamValue::Float(value)) => *value,
        other => panic!("{name} is {other:?}"),
    }
}

/// The hypervolume after each budget of one sequential run.
fn run(
    algorithm: SearchAlgorithm,
    problem: Zdt,
    space: &SearchSpace,
    dims: usize,
    seed: u64,
    budgets: &[usize],
) -> Vec<f64> {
    let mut searcher = make_searcher(algorithm, space, seed);
    let mut points: Vec<Vec<f64>> = Vec::new();
    let mut volumes = Vec::new();
    let last = budgets.iter().copied().max().unwrap_or(0);
    for evaluation in 1..=last {
        let suggestion = searcher.ask().expect("these searchers never run out");
        let x: Vec<f64> = (0..dims)
            .map(|axis| real(&suggestion.config, &format!("x{axis}")))
            .collect();
        let objectives = problem.evaluate(&x);
        searcher.tell_objectives(suggestion.id, &objectives);
        points.push(objectives.to_vec());
        if budgets.contains(&evaluation) {
            let front: Vec<Vec<f64>> = pareto_front(&points)
                .into_iter()
                .map(|idx| points[idx].clone())
                .collect();
            volumes.push(hypervolume(&front, &REFERENCE).expect("finite objectives"));
        }
    }
    volumes
}

struct Args {
    json: bool,
    seeds: u64,
    dims: Vec<usize>,
    budgets: Vec<usize>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        json: false,
        seeds: 5,
        dims: vec![5, 10],
        budgets: vec![50, 100, 200],
    };
    let mut words = std::env::args().skip(1);
    let list = |name: &str, text: Option<String>| -> anyhow::Result<Vec<usize>> {
        text.with_context(|| format!("{name} needs a value"))?
            .split(',')
            .map(|item| {
                item.parse::<usize>()
                    .ok()
                    .filter(|value| *value >= 2)
                    .with_context(|| format!("{name} takes whole numbers of at least 2"))
            })
            .collect()
    };
    while let Some(word) = words.next() {
        match word.as_str() {
            "--json" => args.json = true,
            "--seeds" => {
                args.seeds = words
                    .next()
                    .and_then(|text| text.parse().ok())
                    .filter(|seeds| *seeds > 0)
                    .context("--seeds takes a positive whole number")?;
            }
            "--dims" => args.dims = list("--dims", words.next())?,
            "--budgets" => args.budgets = list("--budgets", words.next())?,
            // `cargo bench` passes `--bench` to every bench binary.
            "--bench" => {}
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    args.budgets.sort_unstable();
    args.budgets.dedup();
    Ok(args)
}

/// The searchers compared, by name; random search first, MOTPE last.
const METHODS: [(&str, SearchAlgorithm); 3] = [
    ("random", SearchAlgorithm::Random),
    ("sobol", SearchAlgorithm::Sobol),
    (
        "motpe",
        SearchAlgorithm::MultiObjectiveTpe { objectives: 2 },
    ),
];

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    if !args.json {
        println!(
            "hypervolume gap to the true front (reference {REFERENCE:?}), median and mean over {} seeds; smaller is better",
            args.seeds
        );
        println!(
            "{:<6} {:>4} {:>7} {:<8} {:>12} {:>12}",
            "PROBLEM", "DIM", "EVALS", "METHOD", "MEDIAN GAP", "MEAN GAP"
        );
    }
    let mut wins_total = 0;
    let mut runs_total = 0;
    for problem in [Zdt::One, Zdt::Two, Zdt::Three] {
        for &dims in &args.dims {
            wins_total += measure(problem, dims, &args)?;
            runs_total += args.seeds as usize;
        }
    }
    if !args.json {
        println!("motpe beat random on {wins_total} of {runs_total} runs in all");
    }
    Ok(())
}

/// Every method on `problem` in `dims` dimensions over every seed: prints the
/// gaps at each budget, and returns on how many seeds MOTPE beat random search
/// at the largest budget.
fn measure(problem: Zdt, dims: usize, args: &Args) -> anyhow::Result<usize> {
    let mut builder = SearchSpace::builder();
    for axis in 0..dims {
        builder = builder.uniform(format!("x{axis}"), 0.0, 1.0);
    }
    let space = builder.build().context("a box of uniform parameters")?;
    // Per method, per seed, the hypervolume at each budget.
    let results: Vec<Vec<Vec<f64>>> = METHODS
        .iter()
        .map(|(_, algorithm)| {
            (0..args.seeds)
                .map(|seed| run(*algorithm, problem, &space, dims, seed, &args.budgets))
                .collect()
        })
        .collect();
    let best = problem.true_hypervolume();
    for (budget_idx, budget) in args.budgets.iter().enumerate() {
        for ((name, _), per_seed) in METHODS.iter().zip(&results) {
            let gaps: Vec<f64> = per_seed
                .iter()
                .map(|volumes| best - volumes[budget_idx])
                .collect();
            print_gaps(problem, dims, *budget, name, best, &gaps, args.json);
        }
    }
    let last = args.budgets.len() - 1;
    let wins = (0..args.seeds as usize)
        .filter(|seed| results[2][*seed][last] > results[0][*seed][last])
        .count();
    if !args.json {
        println!(
            "{:<7} {:>4}: motpe beat random on {wins} of {} seeds at {} evaluations",
            problem.name(),
            dims,
            args.seeds,
            args.budgets[last]
        );
    }
    Ok(wins)
}

/// One method's gaps to the true front's hypervolume `best` at one budget, one
/// per seed: a JSON line, or a row.
fn print_gaps(
    problem: Zdt,
    dims: usize,
    budget: usize,
    name: &str,
    best: f64,
    gaps: &[f64],
    json: bool,
) {
    let median = quantile(gaps, 0.5).unwrap_or(f64::NAN);
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "problem": problem.name(), "dims": dims, "evaluations": budget,
                "method": name, "median_gap": median, "mean_gap": mean,
                "true_hypervolume": best, "gaps": gaps,
            })
        );
    } else {
        println!(
            "{:<7} {:>4} {:>7} {:<8} {:>12.4} {:>12.4}",
            problem.name(),
            dims,
            budget,
            name,
            median,
            mean
        );
    }
}
