//! `xp tune`: optimise any black-box command on this machine: `xp tune --space S.yaml -- CMD ARGS...`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use xp_runtime::spec::{RuleKind, SearchSpace, StoppingConfig};
use xp_tune::search::{Acquisition, DEFAULT_KAPPA, SearchAlgorithm};
use xp_tune::stopping::StoppingRule;

/// Optimise any black-box command on this machine: `xp tune --space S.yaml -- CMD ARGS...`.
#[derive(clap::Args, Debug)]
pub(crate) struct TuneArgs {
    /// A YAML mapping of parameters, the same as `search.space` in an experiment.
    #[arg(long)]
    space: PathBuf,
    /// The search algorithm (`gp`: the GP with log-EI, as `gp-ei`; `tpe-mv`: multivariate TPE).
    #[arg(long, default_value = "tpe", value_parser = ["gp", "gp-ucb", "gp-ei", "tpe", "tpe-mv", "random", "sobol", "grid"])]
    algo: String,
    /// How many evaluations.
    #[arg(long)]
    budget: u32,
    /// The seed of the search.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How many evaluations run at once.
    #[arg(long, default_value_t = 1)]
    parallel: u32,
    /// Whether smaller or larger objectives are better; one per `--metric` for a
    /// multi-objective run (`--mode max,min`).
    #[arg(long, default_value = "min", value_parser = ["min", "max"], value_delimiter = ',')]
    mode: Vec<String>,
    /// A multi-objective run: 2 to 4 metric names (`--metric acc,latency`), each
    /// read as the last value the command printed in an `XP_METRIC` line.
    #[arg(long, value_delimiter = ',')]
    metric: Vec<String>,
    /// The hypervolume's reference point, one value per `--metric`
    /// (`--reference=0,1000`); each objective's worst value plus 10% of its range when absent.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    reference: Option<Vec<f64>>,
    /// Stop unpromising evaluations from their `XP_METRIC {"step": S, "value": V}` lines.
    #[arg(long, value_parser = ["median", "asha", "hyperband"])]
    early_stopping: Option<String>,
    /// The most steps an evaluation runs under early stopping.
    #[arg(long, default_value_t = 81)]
    max_t: u64,
    /// The first step at which early stopping may judge.
    #[arg(long, default_value_t = 1)]
    grace_period: u64,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub(crate) async fn run(args: TuneArgs) -> anyhow::Result<()> {
    let TuneArgs {
        space,
        algo,
        budget,
        seed,
        parallel,
        mode,
        metric,
        reference,
        early_stopping,
        max_t,
        grace_period,
        command,
    } = args;
    let search_space = read_space(&space)?;
    let objectives = tune_objectives(&metric, &mode, reference.as_deref())?;
    let algorithm = search_algorithm(&algo, objectives.len())?;
    anyhow::ensure!(
        objectives.is_empty() || early_stopping.is_none(),
        "--early-stopping judges one objective; a multi-objective run (--metric) takes none"
    );
    let rule = early_stopping
        .as_deref()
        .map(|name| stopping_rule(name, max_t, grace_period))
        .transpose()?;
    let job = xp::TuneJob {
        searcher: xp_tune::search::make_searcher(algorithm, &search_space, seed),
        rule,
        budget,
        parallel,
        maximize: mode.first().is_some_and(|mode| mode == "max"),
        command,
        objectives,
        reference,
    };
    let summary = xp::tune(job, |line| outln!("{line}")).await?;
    outln!("{}", summary.to_json());
    Ok(())
}

/// The search space in the YAML file `space`.
fn read_space(space: &Path) -> anyhow::Result<SearchSpace> {
    let text = std::fs::read_to_string(space)
        .with_context(|| format!("cannot read {}", space.display()))?;
    let space_spec: xp_runtime::spec::SpaceSpec =
        serde_saphyr::from_str(&text).map_err(|error| {
            anyhow::anyhow!("{} is not a valid search space: {error}", space.display())
        })?;
    SearchSpace::from_spec(&space_spec)
        .with_context(|| format!("{} is not a valid search space", space.display()))
}

/// The algorithm `--algo` names, for `objectives` objectives (0 for a single
/// one): a multi-objective run's TPE is the multi-objective TPE, and the
/// model-based searchers of one objective refuse it.
fn search_algorithm(algo: &str, objectives: usize) -> anyhow::Result<SearchAlgorithm> {
    let algorithm = match algo {
        "gp-ucb" => SearchAlgorithm::Gp {
            acquisition: Acquisition::Ucb {
                kappa: DEFAULT_KAPPA,
            },
        },
        "gp" | "gp-ei" => SearchAlgorithm::Gp {
            acquisition: Acquisition::Ei,
        },
        "tpe" => SearchAlgorithm::Tpe,
        "tpe-mv" => SearchAlgorithm::MultivariateTpe,
        "sobol" => SearchAlgorithm::Sobol,
        "grid" => SearchAlgorithm::Grid,
        _ => SearchAlgorithm::Random,
    };
    Ok(match (algorithm, objectives == 0) {
        (algorithm, true) => algorithm,
        (SearchAlgorithm::Tpe | SearchAlgorithm::MultivariateTpe, false) => {
            SearchAlgorithm::MultiObjectiveTpe { objectives }
        }
        (
            algorithm @ (SearchAlgorithm::Random | SearchAlgorithm::Sobol | SearchAlgorithm::Grid),
            false,
        ) => algorithm,
        (_, false) => anyhow::bail!(
            "--algo {algo} searches one objective; a multi-objective run (--metric) uses tpe, random, sobol or grid"
        ),
    })
}

/// The early-stopping rule `--early-stopping` names, with `--max-t` and
/// `--grace-period`.
fn stopping_rule(
    name: &str,
    max_t: u64,
    grace_period: u64,
) -> anyhow::Result<Box<dyn StoppingRule>> {
    let kind = match name {
        "median" => RuleKind::Median,
        "asha" => RuleKind::Asha,
        _ => RuleKind::Hyperband,
    };
    let config = StoppingConfig {
        max_t,
        grace_period,
        ..StoppingConfig::new(kind)
    };
    config
        .validate()
        .context("invalid early-stopping options")?;
    Ok(xp_tune::stopping::make_rule(&config))
}

/// The objectives of `--metric` with their `--mode`s: none for a single
/// objective (one `--mode`, no `--metric`), else 2 to 4 distinct names, one mode
/// each, and a `--reference` of the same length.
fn tune_objectives(
    metrics: &[String],
    modes: &[String],
    reference: Option<&[f64]>,
) -> anyhow::Result<Vec<(String, bool)>> {
    let max = xp_runtime::spec::MAX_OBJECTIVES;
    if metrics.is_empty() {
        anyhow::ensure!(
            modes.len() == 1,
            "--mode takes one value per --metric; without --metric, one"
        );
        anyhow::ensure!(
            reference.is_none(),
            "--reference applies to a multi-objective run (--metric A,B)"
        );
        return Ok(Vec::new());
    }
    anyhow::ensure!(
        (2..=max).contains(&metrics.len()),
        "--metric names 2 to {max} objectives (a single objective is the last stdout line)"
    );
    for (index, name) in metrics.iter().enumerate() {
        anyhow::ensure!(
            !name.trim().is_empty() && name.len() <= 128,
            "--metric: name {} must be 1 to 128 characters",
            index + 1
        );
        anyhow::ensure!(
            !metrics[..index].contains(name),
            "--metric names `{name}` twice"
        );
    }
    anyhow::ensure!(
        modes.len() == metrics.len(),
        "--mode gives {} direction(s) for {} metrics; give one per metric (--mode max,min)",
        modes.len(),
        metrics.len()
    );
    if let Some(reference) = reference {
        anyhow::ensure!(
            reference.len() == metrics.len() && reference.iter().all(|value| value.is_finite()),
            "--reference needs {} finite values, one per metric",
            metrics.len()
        );
    }
    Ok(metrics
        .iter()
        .cloned()
        .zip(modes.iter().map(|mode| mode == "max"))
        .collect())
}
