//! Search-quality bench: simple regret of random, Sobol, GP-UCB, GP-EI and TPE search on Branin, Hartmann-6, Rosenbrock-5 and Ackley-10 at budgets 30 and 100.
//!
//! Each function of `xp_tune::testfns` becomes a search space of uniform real
//! parameters `x0`, `x1`, ... over its box. Each searcher runs sequentially (ask,
//! evaluate, tell) for the budget, once per seed; its simple regret is the best
//! value it found minus the function's known minimum. The table reports the
//! median and interquartile range over seeds. Every searcher is built through one
//! factory closure over `Box<dyn Searcher>`, so a new algorithm is one more entry in
//! `methods`.
//!
//! `cargo bench --bench search_quality [-- --json] [--quick] [--seeds N]
//! [--functions branin,hartmann6] [--methods random,tpe] [--budgets 30,100]`.
//! `--quick` (5 seeds, the Gaussian-process searchers at budget 30 only) keeps a
//! run short on a small machine; the default is 20 seeds for every cell.

#![allow(
    clippy::print_stdout,
    reason = "a bench binary reports its table on stdout"
)]

use anyhow::Context;
use xp_runtime::spec::{Config, ParamValue, SearchSpace};
use xp_tune::search::{Acquisition, DEFAULT_KAPPA, SearchAlgorithm, Searcher, make_searcher};
use xp_tune::stats::quantile;
use xp_tune::testfns::TestFunction;

/// Builds a fresh searcher over a space for one seed.
type Factory = Box<dyn Fn(&SearchSpace, u64) -> Box<dyn Searcher>>;

/// One algorithm under test.
struct Method {
    name: &'static str,
    make: Factory,
    /// Whether one run costs enough (a Gaussian process refits every step) that
    /// `--quick` skips it above budget 30.
    expensive: bool,
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
            expensive: false,
        },
        Method {
            name: "sobol",
            make: engine(SearchAlgorithm::Sobol),
            expensive: false,
        },
        Method {
            name: "gp-ucb",
            make: engine(SearchAlgorithm::Gp {
                acquisition: Acquisition::Ucb {
                    kappa: DEFAULT_KAPPA,
                },
            }),
            expensive: true,
        },
        Method {
            name: "gp-ei",
            make: engine(SearchAlgorithm::Gp {
                acquisition: Acquisition::Ei,
            }),
            expensive: true,
        },
        Method {
            name: "tpe",
            make: engine(SearchAlgorithm::Tpe),
            expensive: false,
        },
    ]
}

struct Args {
    json: bool,
    quick: bool,
    seeds: Option<u64>,
    functions: Option<Vec<String>>,
    methods: Option<Vec<String>>,
    budgets: Vec<usize>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        json: false,
        quick: false,
        seeds: None,
        functions: None,
        methods: None,
        budgets: vec![30, 100],
    };
    let mut words = std::env::args().skip(1);
    let list = |text: String| text.split(',').map(str::to_owned).collect::<Vec<_>>();
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
            "--quick" => args.quick = true,
            "--seeds" => {
                let text = value("--seeds")?;
                args.seeds = Some(
                    text.parse()
                        .with_context(|| format!("--seeds takes a whole number, not {text:?}"))?,
                );
            }
            "--functions" => args.functions = Some(list(value("--functions")?)),
            "--methods" => args.methods = Some(list(value("--methods")?)),
            "--budgets" => {
                args.budgets = list(value("--budgets")?)
                    .iter()
                    .map(|text| {
                        text.parse()
                            .with_context(|| format!("--budgets takes whole numbers, not {text:?}"))
                    })
                    .collect::<anyhow::Result<_>>()?;
            }
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    Ok(args)
}

fn coordinate_name(axis: usize) -> String {
    format!("x{axis}")
}

/// The search space of `function`: one uniform real parameter per coordinate.
fn space_of(function: &TestFunction) -> anyhow::Result<SearchSpace> {
    let mut builder = SearchSpace::builder();
    for (axis, (low, high)) in function.bounds.iter().enumerate() {
        builder = builder.uniform(coordinate_name(axis), *low, *high);
    }
    builder
        .build()
        .with_context(|| format!("search space of {}", function.name))
}

/// The point a configuration names, or `None` when a coordinate is missing or not real.
fn point_of(function: &TestFunction, config: &Config) -> Option<Vec<f64>> {
    (0..function.dim())
        .map(|axis| match config.get(&coordinate_name(axis))? {
            ParamValue::Float(value) => Some(*value),
            ParamValue::Int(value) => Some(*value as f64),
            ParamValue::Bool(_) | ParamValue::Str(_) => None,
        })
        .collect()
}

/// Runs one searcher for `budget` sequential evaluations; returns its simple regret.
fn simple_regret(
    function: &TestFunction,
    mut searcher: Box<dyn Searcher>,
    budget: usize,
) -> anyhow::Result<f64> {
    let mut best = f64::INFINITY;
    for evaluation in 0..budget {
        let Some(suggestion) = searcher.ask() else {
            anyhow::bail!("the searcher ran out after {evaluation} of {budget} suggestions");
        };
        let point = point_of(function, &suggestion.config).with_context(|| {
            format!(
                "suggestion {} is not a point of {}: {:?}",
                suggestion.id, function.name, suggestion.config
            )
        })?;
        let value = function.eval(&point);
        best = best.min(value);
        searcher.tell(suggestion.id, value);
    }
    Ok(best - function.minimum)
}

struct Cell {
    function: &'static str,
    budget: usize,
    method: &'static str,
    regrets: Vec<f64>,
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let seeds = args.seeds.unwrap_or(if args.quick { 5 } else { 20 });
    let functions: Vec<TestFunction> = TestFunction::all()
        .into_iter()
        .filter(|function| {
            args.functions
                .as_ref()
                .is_none_or(|names| names.iter().any(|name| name == function.name))
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
        !functions.is_empty() && !methods.is_empty(),
        "no function or no method selected"
    );
    let mut cells = Vec::new();
    for function in &functions {
        let space = space_of(function)?;
        for &budget in &args.budgets {
            for method in &methods {
                if args.quick && method.expensive && budget > 30 {
                    continue;
                }
                let regrets = (0..seeds)
                    .map(|seed| simple_regret(function, (method.make)(&space, seed), budget))
                    .collect::<anyhow::Result<Vec<f64>>>()
                    .with_context(|| format!("{} on {}", method.name, function.name))?;
                let cell = Cell {
                    function: function.name,
                    budget,
                    method: method.name,
                    regrets,
                };
                if args.json {
                    let line = serde_json::json!({
                        "bench": "search_quality",
                        "function": cell.function,
                        "budget": cell.budget,
                        "method": cell.method,
                        "seeds": seeds,
                        "regret_median": quantile(&cell.regrets, 0.5),
                        "regret_q25": quantile(&cell.regrets, 0.25),
                        "regret_q75": quantile(&cell.regrets, 0.75),
                    });
                    println!("{line}");
                }
                cells.push(cell);
            }
        }
    }
    if args.json {
        return Ok(());
    }
    println!(
        "Simple regret (best value found − known minimum), median [IQR] over {seeds} seeds; sequential ask/tell.\n"
    );
    print!("| function | budget |");
    for method in &methods {
        print!(" {} |", method.name);
    }
    println!();
    println!("|---|---|{}", "---|".repeat(methods.len()));
    for function in &functions {
        for &budget in &args.budgets {
            print!("| {} | {budget} |", function.name);
            for method in &methods {
                match cells.iter().find(|cell| {
                    cell.function == function.name
                        && cell.budget == budget
                        && cell.method == method.name
                }) {
                    Some(cell) => {
                        let quartile = |q: f64| quantile(&cell.regrets, q).unwrap_or(f64::NAN);
                        print!(
                            " {} [{}, {}] |",
                            show(quartile(0.5)),
                            show(quartile(0.25)),
                            show(quartile(0.75))
                        );
                    }
                    None => print!(" (skipped) |"),
                }
            }
            println!();
        }
    }
    Ok(())
}

/// Four significant digits, in scientific notation outside `[0.001, 100000)`.
fn show(value: f64) -> String {
    let magnitude = value.abs();
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    if !(1e-3..1e5).contains(&magnitude) {
        return format!("{value:.3e}");
    }
    let decimals = (3 - magnitude.log10().floor() as i32).max(0) as usize;
    format!("{value:.decimals$}")
}
