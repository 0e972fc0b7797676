//! Search-quality bench: simple regret of random search, GP-UCB, GP-EI, TPE and
//! multivariate TPE (`tpe-mv`) on
//! the shifted and rotated test-function suite (`xp_tune::testfns::suite`) in 2, 5,
//! 10 and 20 dimensions, after 50 and 100 sequential evaluations.
//!
//! Each problem becomes a search space of uniform real parameters `x0`, `x1`, ...
//! on `[-5, 5]`. Each searcher runs sequentially (ask, evaluate, tell) for 100
//! evaluations, once per seed; its simple regret at a budget is the best value it
//! found within that many evaluations minus the problem's known minimum. Per
//! problem the bench takes the median regret over seeds; per dimension it reports
//! the mean over problems of log10 of that median (regrets below 1e-10 count as
//! 1e-10), the measure of xp issue 16, and how many problems each method solves
//! better than random search. Random search is the reference, measured in the same run.
//!
//! `cargo bench --bench search_quality [-- --json] [--dims 2,5] [--families
//! levy,ackley] [--methods random,gp-ei] [--seeds N] [--instances N] [--threads N]
//! [--parallel P]`. With `--parallel P` each searcher keeps P suggestions in flight
//! (asked before earlier ones are told), for regret at equal evaluations.
//! The default run (one instance per family and dimension, two seeds) takes a few
//! minutes on two cores; `XP_SEARCH_QUALITY_FULL=1` runs three instances and three
//! seeds. `--json` prints one line per problem, method and budget.

#![allow(
    clippy::print_stdout,
    reason = "a bench binary reports its table on stdout"
)]

use std::sync::Mutex;

use anyhow::Context;
use xp_runtime::spec::{Config, ParamValue, SearchSpace};
use xp_tune::search::{Acquisition, DEFAULT_KAPPA, SearchAlgorithm, Searcher, make_searcher};
use xp_tune::stats::quantile;
use xp_tune::testfns::suite::BOX_HALF_WIDTH;
use xp_tune::testfns::{Family, Problem};

/// The evaluation budgets reported; every run goes to the largest.
const BUDGETS: [usize; 2] = [50, 100];
/// The floor of a regret before its logarithm: below it a search has found the optimum.
const REGRET_FLOOR: f64 = 1e-10;

/// Builds a fresh searcher over a space for one seed.
type Factory = Box<dyn Fn(&SearchSpace, u64) -> Box<dyn Searcher> + Sync>;

/// One algorithm under test.
struct Method {
    name: &'static str,
    make: Factory,
}

/// The algorithms compared. A new searcher plugs in here: a name and a factory.
fn methods() -> Vec<Method> {
    let engine = |algorithm: SearchAlgorithm| -> Factory {
        Box::new(move |space: &SearchSpace, seed: u64| make_searcher(algorithm, space, seed))
    };
    vec![
        Method {
            name: "random",
            make: engine(SearchAlgorithm::Random),
        },
        Method {
            name: "gp-ucb",
            make: engine(SearchAlgorithm::Gp {
                acquisition: Acquisition::Ucb {
                    kappa: DEFAULT_KAPPA,
                },
            }),
        },
        Method {
            name: "gp-ei",
            make: engine(SearchAlgorithm::Gp {
                acquisition: Acquisition::Ei,
            }),
        },
        Method {
            name: "tpe",
            make: engine(SearchAlgorithm::Tpe),
        },
        Method {
            name: "tpe-mv",
            make: engine(SearchAlgorithm::MultivariateTpe),
        },
    ]
}

struct Args {
    json: bool,
    seeds: u64,
    instances: u64,
    threads: usize,
    parallel: usize,
    dims: Vec<usize>,
    families: Option<Vec<String>>,
    methods: Option<Vec<String>>,
}

fn parse_args() -> anyhow::Result<Args> {
    let full = std::env::var("XP_SEARCH_QUALITY_FULL").is_ok_and(|value| value == "1");
    let mut args = Args {
        json: false,
        seeds: if full { 3 } else { 2 },
        instances: if full { 3 } else { 1 },
        threads: 1,
        parallel: 1,
        dims: vec![2, 5, 10, 20],
        families: None,
        methods: None,
    };
    let mut words = std::env::args().skip(1);
    let list = |text: String| text.split(',').map(str::to_owned).collect::<Vec<_>>();
    fn number<T: std::str::FromStr>(name: &str, text: &str) -> anyhow::Result<T> {
        text.parse()
            .ok()
            .with_context(|| format!("{name} takes whole numbers, not {text:?}"))
    }
    while let Some(word) = words.next() {
        let mut value = |name: &str| {
            words
                .next()
                .with_context(|| format!("{name} needs a value"))
        };
        match word.as_str() {
            // Cargo passes `--bench` to every harness-less bench binary.
            "--bench" => {}
            "--json" => args.json = true,
            "--seeds" => args.seeds = number("--seeds", &value("--seeds")?)?,
            "--instances" => args.instances = number("--instances", &value("--instances")?)?,
            "--threads" => args.threads = number("--threads", &value("--threads")?)?,
            "--parallel" => args.parallel = number("--parallel", &value("--parallel")?)?,
            "--dims" => {
                args.dims = list(value("--dims")?)
                    .iter()
                    .map(|text| number("--dims", text))
                    .collect::<anyhow::Result<_>>()?;
            }
            "--families" => args.families = Some(list(value("--families")?)),
            "--methods" => args.methods = Some(list(value("--methods")?)),
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    anyhow::ensure!(
        args.seeds > 0 && args.instances > 0 && args.threads > 0 && args.parallel > 0,
        "--seeds, --instances, --threads and --parallel must be positive"
    );
    anyhow::ensure!(
        args.dims.iter().all(|dim| *dim > 0),
        "every dimension must be positive"
    );
    Ok(args)
}

fn coordinate_name(axis: usize) -> String {
    format!("x{axis}")
}

/// The search space of a `dim`-dimensional problem: one uniform real per coordinate.
fn space_of(dim: usize) -> anyhow::Result<SearchSpace> {
    let mut builder = SearchSpace::builder();
    for axis in 0..dim {
        builder = builder.uniform(coordinate_name(axis), -BOX_HALF_WIDTH, BOX_HALF_WIDTH);
    }
    builder.build().context("search space of the suite")
}

/// The point a configuration names, or `None` when a coordinate is missing or not real.
fn point_of(dim: usize, config: &Config) -> Option<Vec<f64>> {
    (0..dim)
        .map(|axis| match config.get(&coordinate_name(axis))? {
            ParamValue::Float(value) => Some(*value),
            ParamValue::Int(value) => Some(*value as f64),
            ParamValue::Bool(_) | ParamValue::Str(_) => None,
        })
        .collect()
}

/// Runs one searcher for the largest budget with `parallel` evaluations in flight
/// (each evaluation is told when `parallel − 1` later ones have been asked, as
/// equal-length trials on `parallel` workers finish); returns its simple regret
/// at each of `BUDGETS`.
fn regrets(
    problem: &Problem,
    mut searcher: Box<dyn Searcher>,
    parallel: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut best = f64::INFINITY;
    let mut at_budgets = Vec::with_capacity(BUDGETS.len());
    let last = BUDGETS[BUDGETS.len() - 1];
    let mut in_flight = std::collections::VecDeque::with_capacity(parallel);
    for evaluation in 1..=last {
        while in_flight.len() < parallel.min(last + 1 - evaluation) {
            let Some(suggestion) = searcher.ask() else {
                anyhow::bail!("the searcher ran out after {} suggestions", evaluation - 1);
            };
            in_flight.push_back(suggestion);
        }
        let Some(suggestion) = in_flight.pop_front() else {
            anyhow::bail!("nothing in flight at evaluation {evaluation}");
        };
        let point = point_of(problem.dim, &suggestion.config).with_context(|| {
            format!(
                "suggestion {} is not a point of {}: {:?}",
                suggestion.id,
                problem.name(),
                suggestion.config
            )
        })?;
        let value = problem.eval(&point);
        best = best.min(value);
        searcher.tell(suggestion.id, value);
        if BUDGETS.contains(&evaluation) {
            at_budgets.push(best - problem.minimum());
        }
    }
    Ok(at_budgets)
}

/// One method on one problem: the median regret over seeds at each budget.
struct Cell {
    problem: usize,
    method: usize,
    medians: Vec<f64>,
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let problems: Vec<Problem> = Problem::suite(&args.dims, args.instances)
        .into_iter()
        .filter(|problem| {
            args.families
                .as_ref()
                .is_none_or(|names| names.iter().any(|name| name == problem.family.name()))
        })
        .collect();
    let methods: Vec<Method> = methods()
        .into_iter()
        .filter(|method| {
            args.methods
                .as_ref()
                .is_none_or(|names| names.iter().any(|name| name == method.name))
        })
        .collect();
    anyhow::ensure!(
        !problems.is_empty() && !methods.is_empty(),
        "no problem or no method selected (families: {})",
        Family::ALL.map(Family::name).join(", ")
    );
    let cells = run_cells(&args, &problems, &methods)?;
    if args.json {
        print_json(&args, &problems, &methods, &cells);
    } else {
        print_table(&args, &problems, &methods, &cells);
    }
    Ok(())
}

/// Every (problem, method) cell, sorted by problem then method; the first
/// failure when one fails.
///
/// Work items are (problem, method) pairs, taken by `threads` workers in turn;
/// each result depends only on its item, so the table does not depend on threads.
fn run_cells(args: &Args, problems: &[Problem], methods: &[Method]) -> anyhow::Result<Vec<Cell>> {
    let items: Vec<(usize, usize)> = (0..problems.len())
        .flat_map(|problem| (0..methods.len()).map(move |method| (problem, method)))
        .collect();
    let next = Mutex::new(0usize);
    let cells = Mutex::new(Vec::<Cell>::with_capacity(items.len()));
    let failure = Mutex::new(None::<anyhow::Error>);
    std::thread::scope(|scope| {
        for _ in 0..args.threads {
            scope.spawn(|| {
                loop {
                    let index = {
                        let mut next = next.lock().unwrap_or_else(|poison| poison.into_inner());
                        let index = *next;
                        *next += 1;
                        index
                    };
                    let Some(&(problem_idx, method_idx)) = items.get(index) else {
                        return;
                    };
                    match run_cell(args, problems, methods, problem_idx, method_idx) {
                        Ok(cell) => cells
                            .lock()
                            .unwrap_or_else(|poison| poison.into_inner())
                            .push(cell),
                        Err(error) => {
                            failure
                                .lock()
                                .unwrap_or_else(|poison| poison.into_inner())
                                .get_or_insert(error);
                        }
                    }
                }
            });
        }
    });
    if let Some(error) = failure
        .into_inner()
        .unwrap_or_else(|poison| poison.into_inner())
    {
        return Err(error);
    }
    let mut cells = cells
        .into_inner()
        .unwrap_or_else(|poison| poison.into_inner());
    cells.sort_by_key(|cell| (cell.problem, cell.method));
    Ok(cells)
}

/// One method on one problem over every seed: the median regret at each budget.
fn run_cell(
    args: &Args,
    problems: &[Problem],
    methods: &[Method],
    problem_idx: usize,
    method_idx: usize,
) -> anyhow::Result<Cell> {
    let problem = &problems[problem_idx];
    let method = &methods[method_idx];
    let space = space_of(problem.dim)?;
    let per_seed = (0..args.seeds)
        .map(|seed| regrets(problem, (method.make)(&space, seed), args.parallel))
        .collect::<anyhow::Result<Vec<Vec<f64>>>>()
        .with_context(|| format!("{} on {}", method.name, problem.name()))?;
    let medians = (0..BUDGETS.len())
        .map(|budget| {
            let at: Vec<f64> = per_seed.iter().map(|r| r[budget]).collect();
            quantile(&at, 0.5).unwrap_or(f64::NAN)
        })
        .collect();
    Ok(Cell {
        problem: problem_idx,
        method: method_idx,
        medians,
    })
}

/// log10 of a regret, floored at [`REGRET_FLOOR`].
fn log_regret(regret: f64) -> f64 {
    regret.max(REGRET_FLOOR).log10()
}

/// `--json`: one line per problem, method and budget.
fn print_json(args: &Args, problems: &[Problem], methods: &[Method], cells: &[Cell]) {
    for cell in cells {
        let problem = &problems[cell.problem];
        for (budget, median) in BUDGETS.iter().zip(&cell.medians) {
            let line = serde_json::json!({
                "bench": "search_quality",
                "problem": problem.name(),
                "family": problem.family.name(),
                "dim": problem.dim,
                "instance": problem.instance,
                "method": methods[cell.method].name,
                "budget": budget,
                "seeds": args.seeds,
                "parallel": args.parallel,
                "regret_median": median,
                "log10_regret_median": log_regret(*median),
            });
            println!("{line}");
        }
    }
}

/// The table: a row per dimension and budget, a column per method.
fn print_table(args: &Args, problems: &[Problem], methods: &[Method], cells: &[Cell]) {
    println!(
        "Mean over problems of log10 median simple regret ({} families × {} instance(s), {} seed(s) each; lower is better); in brackets, problems where the method's median regret is below random search's. {} evaluation(s) in flight.\n",
        problems.len() / args.dims.len().max(1) / args.instances.max(1) as usize,
        args.instances,
        args.seeds,
        args.parallel
    );
    print!("| d | evaluations |");
    for method in methods {
        print!(" {} |", method.name);
    }
    println!();
    println!("|---|---|{}", "---|".repeat(methods.len()));
    let random = methods.iter().position(|method| method.name == "random");
    for &dim in &args.dims {
        for (budget_idx, budget) in BUDGETS.iter().enumerate() {
            print!("| {dim} | {budget} |");
            for method_idx in 0..methods.len() {
                let mine: Vec<&Cell> = cells
                    .iter()
                    .filter(|cell| problems[cell.problem].dim == dim && cell.method == method_idx)
                    .collect();
                print!(
                    "{}",
                    table_entry(cells, &mine, budget_idx, method_idx, random)
                );
            }
            println!();
        }
    }
}

/// One method's entry in a row: the mean log regret of its cells `mine` at a
/// budget, and in brackets on how many of their problems it beat random search.
fn table_entry(
    cells: &[Cell],
    mine: &[&Cell],
    budget_idx: usize,
    method_idx: usize,
    random: Option<usize>,
) -> String {
    let mean = mine
        .iter()
        .map(|cell| log_regret(cell.medians[budget_idx]))
        .sum::<f64>()
        / mine.len().max(1) as f64;
    let wins = random.filter(|random| *random != method_idx).map(|random| {
        mine.iter()
            .filter(|cell| {
                cells.iter().any(|other| {
                    other.problem == cell.problem
                        && other.method == random
                        && cell.medians[budget_idx] < other.medians[budget_idx]
                })
            })
            .count()
    });
    match wins {
        Some(wins) => format!(" {mean:.2} ({wins}/{}) |", mine.len()),
        None => format!(" {mean:.2} |"),
    }
}
