//! `xp tune`: optimise any black-box command on this machine: `xp tune --space S.yaml -- CMD ARGS...`.

use std::path::PathBuf;

use anyhow::Context;

/// Optimise any black-box command on this machine: `xp tune --space S.yaml -- CMD ARGS...`.
#[derive(clap::Args, Debug)]
pub(crate) struct TuneArgs {
    /// A YAML mapping of parameters, the same as `search.space` in an experiment.
    #[arg(long)]
    space: PathBuf,
    /// The search algorithm (`tpe-mv`: multivariate TPE).
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
    /// Whether smaller or larger objectives are better.
    #[arg(long, default_value = "min", value_parser = ["min", "max"])]
    mode: String,
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
        early_stopping,
        max_t,
        grace_period,
        command,
    } = args;
    let text = std::fs::read_to_string(&space)
        .with_context(|| format!("cannot read {}", space.display()))?;
    let space_spec: xp_runtime::spec::SpaceSpec =
        serde_saphyr::from_str(&text).map_err(|error| {
            anyhow::anyhow!("{} is not a valid search space: {error}", space.display())
        })?;
    let search_space = xp_runtime::spec::SearchSpace::from_spec(&space_spec)
        .with_context(|| format!("{} is not a valid search space", space.display()))?;
    use xp_tune::search::{Acquisition, DEFAULT_KAPPA, SearchAlgorithm};
    let algorithm = match algo.as_str() {
        "gp" | "gp-ucb" => SearchAlgorithm::Gp {
            acquisition: Acquisition::Ucb {
                kappa: DEFAULT_KAPPA,
            },
        },
        "gp-ei" => SearchAlgorithm::Gp {
            acquisition: Acquisition::Ei,
        },
        "tpe" => SearchAlgorithm::Tpe,
        "tpe-mv" => SearchAlgorithm::MultivariateTpe,
        "sobol" => SearchAlgorithm::Sobol,
        "grid" => SearchAlgorithm::Grid,
        _ => SearchAlgorithm::Random,
    };
    let rule = match early_stopping.as_deref() {
        Some(name) => {
            let kind = match name {
                "median" => xp_runtime::spec::RuleKind::Median,
                "asha" => xp_runtime::spec::RuleKind::Asha,
                _ => xp_runtime::spec::RuleKind::Hyperband,
            };
            let config = xp_runtime::spec::StoppingConfig {
                max_t,
                grace_period,
                ..xp_runtime::spec::StoppingConfig::new(kind)
            };
            config
                .validate()
                .context("invalid early-stopping options")?;
            Some(xp_tune::stopping::make_rule(&config))
        }
        None => None,
    };
    let job = xp::tune::TuneJob {
        searcher: xp_tune::search::make_searcher(algorithm, &search_space, seed),
        rule,
        budget,
        parallel,
        maximize: mode == "max",
        command,
    };
    let summary = xp::tune::tune(job, |line| outln!("{line}")).await?;
    outln!("{}", summary.to_json());
    Ok(())
}
