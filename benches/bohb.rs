//! Multi-fidelity bench: BOHB (`algorithm: bohb`) against ASHA with random sampling and against Hyperband with random sampling, at equal epochs, on synthetic learning curves over the standard test functions.
//!
//! Each problem is a function of the shifted, rotated suite
//! (`xp_tune::testfns::Problem`, on `[-5, 5]^d`). Configuration `x` trains on
//! the curve `y(x, t) = F(x) + h(x)·(t^−½ − T^−½) + s·σ·ε/√t`, where
//! `F(x) = ln(1 + f(x) − f*)` is its final value (minimum 0, at the problem's
//! optimum), `s` is the interquartile range of `F` over 512 random
//! configurations, `h(x) = s·(0.25 + 1.5·u(x))` with `u ∈ [0, 1]` a cosine ridge
//! along a random direction, independent of `f` (slow and fast starters), and
//! `ε` standard normal noise (σ = 0.2). Early values therefore rank
//! configurations only partly as their final values do: the table prints the
//! Spearman correlation between `y(·, 1)` and `F`.
//!
//! Every method runs the same discrete-event loop on a virtual clock: `--workers`
//! slots (4), each trial taking 80 to 120 ticks per step, its reports fed to the
//! searcher (`Searcher::observe`) and to the stopping rule, a stop freeing the
//! slot for the next `ask`. Each run ends when the trials together have reported
//! exactly `--trainings` × `T` steps (default 30 × 81), so every method consumes
//! the same sum of reported steps, as `xp sim` would count epochs. The result is
//! the trial with the best value at the largest step any trial reached (the
//! budget `T` in practice); its regret is its noise-free `F`.
//!
//! Methods: `asha` (random sampling, ASHA with grace period 1, η 3, `max_t` T),
//! `hyperband` (random sampling, BOHB's own Hyperband rule: every bracket, with
//! Hyperband's shares), `bohb` (BOHB's sampler with the same rule), so
//! `hyperband` against `bohb` isolates the model, and `asha-bohb` (BOHB's
//! sampler under ASHA's single bracket: `algorithm: bohb` with
//! `early_stopping: {rule: asha}`), so `asha` against `asha-bohb` isolates it too.
//!
//! `cargo bench --bench bohb [-- --json] [--dims 2,5] [--seeds N] [--trainings N]
//! [--max-t N] [--workers N] [--families levy,ackley]`: per dimension, the mean
//! over problems of the median regret over seeds, the median over problems, how
//! many problems each method solves better than ASHA (by median regret), and the
//! configurations tried and steps used per run.

#![allow(
    clippy::print_stdout,
    reason = "a bench binary reports its table on stdout"
)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use anyhow::Context;
use xp_runtime::seeded::{SplitMix64, mix_seed, splitmix64};
use xp_runtime::spec::{Config, ParamValue, RuleKind, SearchSpace, StoppingConfig};
use xp_tune::hyperband::HyperbandSchedule;
use xp_tune::search::{BohbOptions, BohbSearcher, RandomSearcher, Searcher};
use xp_tune::stats::quantile;
use xp_tune::stopping::{StoppingRule, make_bohb_rule, make_rule};
use xp_tune::testfns::suite::BOX_HALF_WIDTH;
use xp_tune::testfns::{Family, Problem};

/// The methods compared, in table order.
const METHODS: [&str; 4] = ["asha", "hyperband", "bohb", "asha-bohb"];
/// The reduction factor of every rule.
const ETA: u32 = 3;
/// The relative noise of a report at step 1.
const NOISE: f64 = 0.2;

struct Args {
    json: bool,
    seeds: u64,
    trainings: u64,
    max_t: u64,
    workers: usize,
    dims: Vec<usize>,
    families: Option<Vec<String>>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        json: false,
        seeds: 5,
        trainings: 30,
        max_t: 81,
        workers: 4,
        dims: vec![2, 5],
        families: None,
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = |name: &str| {
            words
                .next()
                .with_context(|| format!("{name} needs a value"))
        };
        fn number<T: std::str::FromStr>(name: &str, text: &str) -> anyhow::Result<T> {
            text.parse()
                .ok()
                .with_context(|| format!("{name} takes whole numbers, not {text:?}"))
        }
        match word.as_str() {
            // Cargo passes `--bench` to every harness-less bench binary.
            "--bench" => {}
            "--json" => args.json = true,
            "--seeds" => args.seeds = number("--seeds", &value("--seeds")?)?,
            "--trainings" => args.trainings = number("--trainings", &value("--trainings")?)?,
            "--max-t" => args.max_t = number("--max-t", &value("--max-t")?)?,
            "--workers" => args.workers = number("--workers", &value("--workers")?)?,
            "--dims" => {
                args.dims = value("--dims")?
                    .split(',')
                    .map(|dim| number("--dims", dim))
                    .collect::<anyhow::Result<_>>()?;
            }
            "--families" => {
                args.families = Some(value("--families")?.split(',').map(str::to_owned).collect());
            }
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    anyhow::ensure!(
        args.seeds > 0 && args.trainings > 0 && args.workers > 0,
        "--seeds, --trainings and --workers must be at least 1"
    );
    anyhow::ensure!(
        args.max_t >= 3 * u64::from(ETA),
        "--max-t must be at least {} so that there are three budgets",
        3 * ETA
    );
    anyhow::ensure!(
        args.dims.iter().all(|dim| (1..=64).contains(dim)),
        "--dims takes dimensions from 1 to 64"
    );
    Ok(args)
}

/// One problem's learning curves.
struct Curves {
    problem: Problem,
    max_t: u64,
    /// The interquartile range of `F` over random configurations.
    scale: f64,
    /// The direction of the slow-start ridge.
    ridge: Vec<f64>,
}

impl Curves {
    fn new(problem: Problem, max_t: u64) -> Self {
        let dim = problem.dim;
        let mut rng = SplitMix64::new(mix_seed(0xB0_4B, (dim as u64) << 32 | problem.instance));
        let mut ridge: Vec<f64> = (0..dim).map(|_| rng.normal()).collect();
        let norm = ridge.iter().map(|w| w * w).sum::<f64>().sqrt().max(1e-12);
        ridge.iter_mut().for_each(|w| *w *= 3.0 / norm);
        let mut curves = Self {
            problem,
            max_t,
            scale: 1.0,
            ridge,
        };
        let mut finals: Vec<f64> = (0..512)
            .map(|_| curves.final_value(&random_point(dim, &mut rng)))
            .collect();
        finals.sort_by(f64::total_cmp);
        let quartile = |q| quantile(&finals, q).expect("512 values");
        curves.scale = (quartile(0.75) - quartile(0.25)).max(1e-9);
        curves
    }

    /// `F(x)`: the noise-free value at `max_t`, 0 at the optimum.
    fn final_value(&self, x: &[f64]) -> f64 {
        (self.problem.eval(x) - self.problem.minimum())
            .max(0.0)
            .ln_1p()
    }

    /// `h(x)`: how far above its final value the configuration starts.
    fn slow_start(&self, x: &[f64]) -> f64 {
        let along: f64 = x
            .iter()
            .zip(&self.ridge)
            .map(|(coordinate, weight)| coordinate / BOX_HALF_WIDTH * weight)
            .sum();
        let ridge = 0.5 + 0.5 * (std::f64::consts::PI * along).cos();
        self.scale * (0.25 + 1.5 * ridge)
    }

    /// The noise-free value at `step`.
    fn mean(&self, x: &[f64], step: u64) -> f64 {
        let decay = (step as f64).powf(-0.5) - (self.max_t as f64).powf(-0.5);
        self.final_value(x) + self.slow_start(x) * decay
    }

    /// A report at `step`, its noise fixed by `noise_seed`.
    fn observe(&self, x: &[f64], step: u64, noise_seed: u64) -> f64 {
        let epsilon = SplitMix64::new(mix_seed(noise_seed, step)).normal();
        self.mean(x, step) + self.scale * NOISE * epsilon / (step as f64).sqrt()
    }
}

fn random_point(dim: usize, rng: &mut SplitMix64) -> Vec<f64> {
    (0..dim)
        .map(|_| (2.0 * rng.next_f64() - 1.0) * BOX_HALF_WIDTH)
        .collect()
}

/// Spearman's rank correlation.
fn spearman(left: &[f64], right: &[f64]) -> f64 {
    let ranks = |values: &[f64]| {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|a, b| values[*a].total_cmp(&values[*b]));
        let mut ranks = vec![0.0; values.len()];
        for (rank, index) in order.into_iter().enumerate() {
            ranks[index] = rank as f64;
        }
        ranks
    };
    let (left, right) = (ranks(left), ranks(right));
    let n = left.len() as f64;
    let mean = (n - 1.0) / 2.0;
    let covariance: f64 = left
        .iter()
        .zip(&right)
        .map(|(a, b)| (a - mean) * (b - mean))
        .sum();
    let variance: f64 = left.iter().map(|a| (a - mean) * (a - mean)).sum();
    covariance / variance
}

/// The early/final rank correlation of `curves` over random configurations.
fn early_rank_correlation(curves: &Curves) -> f64 {
    let mut rng = SplitMix64::new(7);
    let points: Vec<Vec<f64>> = (0..256)
        .map(|_| random_point(curves.problem.dim, &mut rng))
        .collect();
    let early: Vec<f64> = points
        .iter()
        .enumerate()
        .map(|(index, x)| curves.observe(x, 1, index as u64))
        .collect();
    let finals: Vec<f64> = points.iter().map(|x| curves.final_value(x)).collect();
    spearman(&early, &finals)
}

fn space(dim: usize) -> SearchSpace {
    (0..dim)
        .fold(SearchSpace::builder(), |builder, index| {
            builder.uniform(format!("x{index}"), -BOX_HALF_WIDTH, BOX_HALF_WIDTH)
        })
        .build()
        .expect("uniform parameters make a space")
}

fn point_of(config: &Config, dim: usize) -> Vec<f64> {
    (0..dim)
        .map(|index| match config.get(&format!("x{index}")) {
            Some(ParamValue::Float(value)) => *value,
            other => panic!("x{index} is {other:?}"),
        })
        .collect()
}

/// What one run produced.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    regret: f64,
    configs: u64,
    steps: u64,
}

/// One trial in flight.
struct Running {
    suggestion: u64,
    x: Vec<f64>,
    step: u64,
    ticks_per_step: u64,
}

/// The searcher and the stopping rule of `method`, seeded from `seed`.
fn searcher_and_rule(
    method: &str,
    space: SearchSpace,
    seed: u64,
    args: &Args,
) -> (Box<dyn Searcher>, Box<dyn StoppingRule>) {
    let schedule =
        HyperbandSchedule::new(1, args.max_t, ETA).expect("--max-t was checked against η");
    let searcher_seed = mix_seed(seed, 11);
    let asha = || {
        make_rule(&StoppingConfig {
            grace_period: 1,
            reduction_factor: ETA,
            max_t: args.max_t,
            ..StoppingConfig::new(RuleKind::Asha)
        })
    };
    let random =
        |space| -> Box<dyn Searcher> { Box::new(RandomSearcher::new(space, searcher_seed)) };
    let bohb = |space| -> Box<dyn Searcher> {
        Box::new(BohbSearcher::new(
            space,
            schedule,
            searcher_seed,
            BohbOptions::default(),
        ))
    };
    match method {
        "asha" => (random(space), asha()),
        "hyperband" => (random(space), make_bohb_rule(schedule)),
        "asha-bohb" => (bohb(space), asha()),
        _ => (bohb(space), make_bohb_rule(schedule)),
    }
}

/// One simulated run: the searcher, the rule, the trials started so far and
/// the clock's next reports.
struct Run<'a> {
    curves: &'a Curves,
    seed: u64,
    max_t: u64,
    searcher: Box<dyn Searcher>,
    rule: Box<dyn StoppingRule>,
    running: Vec<Running>,
    /// Min-heap of (time of the next report, trial).
    events: BinaryHeap<Reverse<(u64, u64)>>,
}

impl Run<'_> {
    /// Starts a new trial at `now` on the next suggestion.
    fn start(&mut self, now: u64) {
        let suggestion = self.searcher.ask().expect("random and BOHB never run out");
        let trial = self.running.len() as u64;
        let ticks_per_step = 80 + splitmix64(mix_seed(self.seed, trial)) % 41;
        self.running.push(Running {
            suggestion: suggestion.id,
            x: point_of(&suggestion.config, self.curves.problem.dim),
            step: 0,
            ticks_per_step,
        });
        self.events.push(Reverse((now + ticks_per_step, trial)));
    }

    /// `trial` reports its next step at `now`; a trial that stops (or reaches
    /// `max_t`) gives its worker to a new one. Returns the step and its value.
    fn report(&mut self, now: u64, trial: u64) -> (u64, f64) {
        let index = trial as usize;
        self.running[index].step += 1;
        let step = self.running[index].step;
        let noise_seed = mix_seed(mix_seed(self.seed, 0x5EED), trial);
        let value = self
            .curves
            .observe(&self.running[index].x, step, noise_seed);
        self.searcher
            .observe(self.running[index].suggestion, step, value);
        let stopped = self.rule.report(trial, step, value).is_stop() || step >= self.max_t;
        if stopped {
            self.rule.finished(trial);
            self.searcher.tell(self.running[index].suggestion, value);
            self.start(now);
        } else {
            self.events
                .push(Reverse((now + self.running[index].ticks_per_step, trial)));
        }
        (step, value)
    }
}

/// Runs `method` on `curves` until the trials have reported `total_steps` steps.
fn simulate(method: &str, curves: &Curves, seed: u64, args: &Args) -> Outcome {
    let (searcher, rule) = searcher_and_rule(method, space(curves.problem.dim), seed, args);
    let mut run = Run {
        curves,
        seed,
        max_t: args.max_t,
        searcher,
        rule,
        running: Vec::new(),
        events: BinaryHeap::new(),
    };
    for _ in 0..args.workers {
        run.start(0);
    }
    let total_steps = args.trainings * args.max_t;
    let mut steps = 0;
    // Per trial that reported: its largest step and the value there.
    let mut last: Vec<Option<(u64, f64)>> = Vec::new();
    while steps < total_steps {
        let Some(Reverse((now, trial))) = run.events.pop() else {
            break;
        };
        steps += 1;
        let reached = run.report(now, trial);
        let index = trial as usize;
        if last.len() <= index {
            last.resize(index + 1, None);
        }
        last[index] = Some(reached);
    }
    // The chosen trial went furthest, and of those reported the lowest value.
    let (chosen, _) = last
        .iter()
        .enumerate()
        .filter_map(|(index, reached)| reached.map(|(step, value)| (index, (step, value))))
        .max_by(|(_, left), (_, right)| {
            left.0
                .cmp(&right.0)
                .then_with(|| right.1.total_cmp(&left.1))
        })
        .expect("some trial reported");
    Outcome {
        regret: curves.final_value(&run.running[chosen].x),
        configs: run.running.len() as u64,
        steps,
    }
}

/// Every method on one dimension's problems.
struct DimResult {
    /// The problems' mean early/final rank correlation.
    correlation: f64,
    /// `medians[method][problem]`: the median regret over seeds.
    medians: Vec<Vec<f64>>,
    /// Per method, configurations tried and steps run, over all runs.
    configs: Vec<u64>,
    steps: Vec<u64>,
    /// How many runs each method made.
    runs: f64,
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let families: Vec<Family> = Family::ALL
        .into_iter()
        .filter(|family| {
            args.families
                .as_ref()
                .is_none_or(|names| names.iter().any(|name| name == family.name()))
        })
        .collect();
    anyhow::ensure!(!families.is_empty(), "--families matches no family");
    if !args.json {
        print_header(&args);
    }
    for dim in &args.dims {
        let result = measure_dim(*dim, &families, &args);
        if !args.json {
            print_rows(*dim, &result);
        }
    }
    Ok(())
}

/// Runs every method on every family's problem in `dim` dimensions; with
/// `--json`, prints a line per problem and method.
fn measure_dim(dim: usize, families: &[Family], args: &Args) -> DimResult {
    let problems: Vec<Curves> = families
        .iter()
        .map(|family| Curves::new(Problem::new(*family, dim, 0), args.max_t))
        .collect();
    let correlation =
        problems.iter().map(early_rank_correlation).sum::<f64>() / problems.len() as f64;
    let mut result = DimResult {
        correlation,
        medians: vec![Vec::new(); METHODS.len()],
        configs: vec![0_u64; METHODS.len()],
        steps: vec![0_u64; METHODS.len()],
        runs: (problems.len() as u64 * args.seeds) as f64,
    };
    for curves in &problems {
        for (method_idx, method) in METHODS.iter().enumerate() {
            let mut regrets: Vec<f64> = (0..args.seeds)
                .map(|seed| {
                    let outcome = simulate(method, curves, seed, args);
                    result.configs[method_idx] += outcome.configs;
                    result.steps[method_idx] += outcome.steps;
                    outcome.regret
                })
                .collect();
            regrets.sort_by(f64::total_cmp);
            let median = quantile(&regrets, 0.5).expect("at least one seed");
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "problem": curves.problem.name(),
                        "method": method,
                        "median_regret": median,
                        "regrets": regrets,
                    })
                );
            }
            result.medians[method_idx].push(median);
        }
    }
    result
}

/// The table's heading.
fn print_header(args: &Args) {
    println!(
        "{} seeds, {} × {} steps per run, {} workers, η {ETA}\n",
        args.seeds, args.trainings, args.max_t, args.workers
    );
    println!(
        "| d | early/final rank corr. | method | mean of median regret | median regret | beats asha | configs per run | steps per run |"
    );
    println!("|---|---|---|---|---|---|---|---|");
}

/// One dimension's rows, a row per method.
fn print_rows(dim: usize, result: &DimResult) {
    let DimResult {
        correlation,
        medians,
        configs,
        steps,
        runs,
    } = result;
    for (method_idx, method) in METHODS.iter().enumerate() {
        let values = &medians[method_idx];
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let wins = values
            .iter()
            .zip(&medians[0])
            .filter(|(mine, asha)| mine < asha)
            .count();
        println!(
            "| {dim} | {correlation:.2} | {method} | {mean:.3} | {:.3} | {wins}/{} | {:.0} | {:.0} |",
            quantile(&sorted, 0.5).expect("at least one problem"),
            values.len(),
            configs[method_idx] as f64 / runs,
            steps[method_idx] as f64 / runs,
        );
    }
}
