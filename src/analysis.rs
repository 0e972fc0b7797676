//! `xp compare`: statistics of seed replicates per configuration, and whether the
//! best configuration is significantly better than each runner-up.
//!
//! Pure: it works on an [`ExperimentStatus`] already fetched from the head.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{ExperimentStatus, ObjectiveStatus};
use xp_tune::search::front::summarize_front;
use xp_tune::stats::{Summary, WelchTest, summarize, welch_t_test};

/// Why an experiment cannot be compared.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompareError {
    /// The spec names no metric to compare by.
    #[error("experiment {experiment} declares no search.metric to compare by")]
    NoMetric {
        /// The experiment compared.
        experiment: ExperimentId,
    },
}

/// One configuration's replicates.
#[derive(Debug, Clone)]
pub struct ConfigSummary {
    /// The parameters, without the seed.
    pub config: Value,
    /// Its succeeded trials that reported the metric.
    pub trials: Vec<TrialId>,
    /// Their final metric values.
    pub values: Vec<f64>,
    /// Mean, standard deviation and 95% interval, when there is a value.
    pub summary: Option<Summary>,
    /// Welch's test against the best configuration (absent for the best itself).
    pub vs_best: Option<WelchTest>,
}

/// Every configuration, best first.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The metric compared.
    pub metric: String,
    /// Whether larger is better.
    pub maximize: bool,
    /// Configurations, best mean first; those without values last.
    pub configs: Vec<ConfigSummary>,
}

/// Groups succeeded trials by configuration (ignoring the seed) and compares them.
pub fn compare(status: &ExperimentStatus, alpha: f64) -> Result<Comparison, CompareError> {
    let metric = status.metric.clone().ok_or(CompareError::NoMetric {
        experiment: status.id,
    })?;
    let mut groups: BTreeMap<String, (Value, Vec<TrialId>, Vec<f64>)> = BTreeMap::new();
    for trial in &status.trials {
        let (key, config) = config_without_seed(&trial.config_json);
        let group = groups
            .entry(key)
            .or_insert_with(|| (config, Vec::new(), Vec::new()));
        if trial.state.ended_normally()
            && let Some(value) = trial
                .metrics
                .get(&metric)
                .copied()
                .filter(|value| value.is_finite())
        {
            group.1.push(trial.id);
            group.2.push(value);
        }
    }
    let mut configs: Vec<ConfigSummary> = groups
        .into_values()
        .map(|(config, trials, values)| ConfigSummary {
            config,
            trials,
            summary: summarize(&values),
            values,
            vs_best: None,
        })
        .collect();
    let goodness = |config: &ConfigSummary| {
        config.summary.as_ref().map(|summary| {
            if status.maximize {
                summary.mean
            } else {
                -summary.mean
            }
        })
    };
    configs.sort_by(|a, b| match (goodness(a), goodness(b)) {
        (Some(x), Some(y)) => y.total_cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    if let Some((best, rest)) = configs.split_first_mut() {
        for other in rest {
            other.vs_best = welch_t_test(&best.values, &other.values, alpha);
        }
    }
    Ok(Comparison {
        metric,
        maximize: status.maximize,
        configs,
    })
}

impl ConfigSummary {
    /// The JSON line `xp compare --json` prints for this configuration.
    pub fn to_json(&self, rank: usize) -> Value {
        json!({
            "rank": rank,
            "config": self.config,
            "n": self.values.len(),
            "mean": self.summary.as_ref().map(|summary| summary.mean),
            // One replicate has no spread: no interval is made up for it.
            "std_dev": self.summary.as_ref().filter(|summary| summary.n > 1).map(|summary| summary.std_dev),
            "ci95": self.summary.as_ref().filter(|summary| summary.n > 1).map(|summary| [summary.ci95.0, summary.ci95.1]),
            "trials": self.trials.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "vs_best": self.vs_best.as_ref().map(|test| json!({
                "t": test.t, "dof": test.dof, "p_value": test.p_value, "significant": test.significant,
            })),
        })
    }

    /// How this configuration, ranked `rank` (from 1), compares with the
    /// best, in words. With fewer than two replicates on either side nothing
    /// is tested, and the verdict says so rather than call each one best.
    pub fn verdict(&self, rank: usize, alpha: f64) -> String {
        match &self.vs_best {
            None if self.values.is_empty() => "no finished replicate".to_owned(),
            None if rank == 1 && self.values.len() > 1 => "best".to_owned(),
            None if rank == 1 => {
                "best mean (one replicate: add `search.seeds` to test differences)".to_owned()
            }
            None => "not tested (needs two replicates on each side)".to_owned(),
            Some(test) if test.significant => format!(
                "worse than the best, significant (Welch p={:.3} < {alpha})",
                test.p_value
            ),
            Some(test) => format!(
                "not significantly different from the best (Welch p={:.3})",
                test.p_value
            ),
        }
    }
}

/// One configuration of a multi-objective experiment: its replicates' mean of
/// each objective.
#[derive(Debug, Clone)]
pub struct ConfigObjectives {
    /// The parameters, without the seed.
    pub config: Value,
    /// Its succeeded trials that reported every objective.
    pub trials: Vec<TrialId>,
    /// Per objective, in declared order: the replicates' summary, when one
    /// reported it.
    pub summaries: Vec<Option<Summary>>,
    /// Its hypervolume contribution when it is on the front.
    pub contribution: Option<f64>,
}

/// The Pareto front of a multi-objective experiment's configurations, each
/// judged by its replicates' means.
#[derive(Debug, Clone)]
pub struct FrontComparison {
    /// The objectives.
    pub objectives: Vec<ObjectiveStatus>,
    /// The reference point (the metrics' units), when there is one.
    pub reference: Option<Vec<f64>>,
    /// Whether the spec declared it.
    pub reference_declared: bool,
    /// The hypervolume of the front of configuration means.
    pub hypervolume: f64,
    /// Every configuration: the front first, by contribution, then the rest.
    pub configs: Vec<ConfigObjectives>,
}

/// The front of configurations (seed replicates grouped, each objective their
/// mean over succeeded trials that reported it finite); `None` for one metric.
pub fn compare_front(status: &ExperimentStatus) -> Option<FrontComparison> {
    let front = status.front.as_ref()?;
    let objectives = status.objectives.clone();
    let mut configs = config_objectives(status, &objectives);
    let candidates: Vec<(usize, Vec<Option<f64>>)> = configs
        .iter()
        .enumerate()
        .map(|(idx, config)| {
            let means = config
                .summaries
                .iter()
                .map(|summary| summary.as_ref().map(|summary| summary.mean))
                .collect();
            (idx, means)
        })
        .collect();
    let maximize: Vec<bool> = objectives
        .iter()
        .map(|objective| objective.maximize)
        .collect();
    let declared = front
        .reference_declared
        .then_some(front.reference.as_slice());
    let summary = summarize_front(&candidates, &maximize, declared).ok()?;
    for point in &summary.front {
        configs[point.key].contribution = Some(point.contribution);
    }
    let order: Vec<usize> = summary.front.iter().map(|point| point.key).collect();
    Some(FrontComparison {
        objectives,
        reference: summary.reference,
        reference_declared: summary.reference_declared,
        hypervolume: summary.hypervolume,
        configs: front_first(configs, order),
    })
}

/// Every configuration's replicates (its succeeded trials) summarised per
/// objective, in the order of their parameters; none on the front yet.
fn config_objectives(
    status: &ExperimentStatus,
    objectives: &[ObjectiveStatus],
) -> Vec<ConfigObjectives> {
    /// One configuration's replicates: its trials with every objective, and
    /// each objective's finite values.
    struct Group {
        config: Value,
        trials: Vec<TrialId>,
        columns: Vec<Vec<f64>>,
    }
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for trial in &status.trials {
        let (key, config) = config_without_seed(&trial.config_json);
        let group = groups.entry(key).or_insert_with(|| Group {
            config,
            trials: Vec::new(),
            columns: vec![Vec::new(); objectives.len()],
        });
        if !trial.state.ended_normally() {
            continue;
        }
        let values: Vec<Option<f64>> = objectives
            .iter()
            .map(|objective| {
                trial
                    .metrics
                    .get(&objective.metric)
                    .copied()
                    .filter(|value| value.is_finite())
            })
            .collect();
        if values.iter().all(Option::is_some) {
            group.trials.push(trial.id);
        }
        for (column, value) in group.columns.iter_mut().zip(values) {
            column.extend(value);
        }
    }
    groups
        .into_values()
        .map(|group| ConfigObjectives {
            config: group.config,
            trials: group.trials,
            summaries: group
                .columns
                .iter()
                .map(|column| summarize(column))
                .collect(),
            contribution: None,
        })
        .collect()
}

/// The configurations at the indexes of `front` first, in that order, then
/// the rest in their order.
fn front_first(configs: Vec<ConfigObjectives>, mut front: Vec<usize>) -> Vec<ConfigObjectives> {
    front.extend((0..configs.len()).filter(|idx| configs[*idx].contribution.is_none()));
    let mut slots: Vec<Option<ConfigObjectives>> = configs.into_iter().map(Some).collect();
    front
        .into_iter()
        .filter_map(|idx| slots[idx].take())
        .collect()
}

/// A trial's parameters without the seed, and the key that groups its seed
/// replicates (the same parameters).
fn config_without_seed(config_json: &str) -> (String, Value) {
    let mut config: serde_json::Map<String, Value> =
        serde_json::from_str(config_json).unwrap_or_default();
    config.remove("seed");
    let config = Value::Object(config);
    (config.to_string(), config)
}

impl FrontComparison {
    /// The JSON line `xp compare --json` prints first for a multi-objective experiment.
    pub fn to_json(&self) -> Value {
        json!({
            "objectives": xp_runtime::views::objectives_json(&self.objectives),
            "front": {
                "hypervolume": xp_runtime::metric_value::value_json(self.hypervolume),
                "reference": self.reference,
                "reference_declared": self.reference_declared,
                "size": self.configs.iter().filter(|config| config.contribution.is_some()).count(),
            },
        })
    }
}

impl ConfigObjectives {
    /// The JSON line `xp compare --json` prints for this configuration.
    pub fn to_json(&self, objectives: &[ObjectiveStatus], rank: usize) -> Value {
        let values: serde_json::Map<String, Value> = objectives
            .iter()
            .zip(&self.summaries)
            .map(|(objective, summary)| {
                (
                    objective.metric.clone(),
                    json!({
                        "n": summary.as_ref().map_or(0, |summary| summary.n),
                        "mean": summary.as_ref().map(|summary| summary.mean),
                        "std_dev": summary.as_ref().map(|summary| summary.std_dev),
                        "ci95": summary.as_ref().map(|summary| [summary.ci95.0, summary.ci95.1]),
                    }),
                )
            })
            .collect();
        json!({
            "rank": rank,
            "config": self.config,
            "on_front": self.contribution.is_some(),
            "contribution": self.contribution.map(xp_runtime::metric_value::value_json),
            "objectives": values,
            "trials": self.trials.iter().map(ToString::to_string).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::ExperimentId;
    use xp_runtime::protocol::{ExperimentState, TrialState, TrialStatus};

    use super::*;

    fn trial(index: u32, config: &str, value: f64) -> TrialStatus {
        TrialStatus {
            id: TrialId {
                experiment: ExperimentId { digest: 1, run: 1 },
                index,
            },
            state: TrialState::Succeeded,
            config_json: config.to_owned(),
            attempts: Vec::new(),
            metrics: BTreeMap::from([("acc".to_owned(), value)]),
            last_step: None,
            reason: None,
            reused_from: None,
            waiting: None,
            gpu_hours: 0.0,
            cost: None,
            malformed_metrics: None,
        }
    }

    fn status(trials: Vec<TrialStatus>) -> ExperimentStatus {
        ExperimentStatus {
            id: ExperimentId { digest: 1, run: 1 },
            name: "c".to_owned(),
            team: "t".to_owned(),
            state: ExperimentState::Succeeded,
            metric: Some("acc".to_owned()),
            maximize: true,
            submitted_at: 0,
            code_version: "none".to_owned(),
            data_version: "none".to_owned(),
            trials,
            objectives: Vec::new(),
            front: None,
        }
    }

    #[test]
    fn replicates_group_by_config_and_the_best_comes_first() {
        let mut trials = Vec::new();
        for (seed, (a, b)) in [(0.90, 0.80), (0.91, 0.81), (0.92, 0.79), (0.905, 0.805)]
            .into_iter()
            .enumerate()
        {
            trials.push(trial(
                seed as u32 * 2,
                &format!(r#"{{"lr":0.1,"seed":{seed}}}"#),
                a,
            ));
            trials.push(trial(
                seed as u32 * 2 + 1,
                &format!(r#"{{"lr":0.01,"seed":{seed}}}"#),
                b,
            ));
        }
        let comparison = compare(&status(trials), 0.05).unwrap();
        assert_eq!(comparison.configs.len(), 2);
        assert_eq!(comparison.configs[0].config["lr"], 0.1);
        assert_eq!(comparison.configs[0].values.len(), 4);
        let runner_up = comparison.configs[1].vs_best.as_ref().unwrap();
        assert!(runner_up.significant && runner_up.p_value < 0.001);
        assert!(
            comparison.configs[1]
                .verdict(2, 0.05)
                .contains("significant")
        );
    }

    #[test]
    fn one_replicate_per_configuration_gets_no_interval_and_no_second_best() {
        let trials = vec![
            trial(0, r#"{"lr":0.1,"seed":0}"#, 0.9),
            trial(1, r#"{"lr":0.01,"seed":0}"#, 0.8),
        ];
        let comparison = compare(&status(trials), 0.05).unwrap();
        let verdicts: Vec<String> = comparison
            .configs
            .iter()
            .enumerate()
            .map(|(rank, config)| config.verdict(rank + 1, 0.05))
            .collect();
        assert!(
            verdicts[0].starts_with("best mean (one replicate"),
            "{verdicts:?}"
        );
        assert!(verdicts[1].starts_with("not tested"), "{verdicts:?}");
        let json = comparison.configs[0].to_json(1);
        assert!(
            json["ci95"].is_null() && json["std_dev"].is_null(),
            "{json}"
        );
    }

    #[test]
    fn the_front_of_configurations_by_replicate_means() {
        let objectives = vec![
            ObjectiveStatus {
                metric: "acc".to_owned(),
                maximize: true,
            },
            ObjectiveStatus {
                metric: "ms".to_owned(),
                maximize: false,
            },
        ];
        // Two replicates each: A = (0.9, 30), B = (0.8, 10), C = (0.7, 20), which
        // B dominates; one more of C never reported `ms`.
        let mut trials = Vec::new();
        for (index, (config, acc, ms)) in [
            (r#"{"k":"a","seed":0}"#, 0.89, Some(29.0)),
            (r#"{"k":"a","seed":1}"#, 0.91, Some(31.0)),
            (r#"{"k":"b","seed":0}"#, 0.80, Some(9.0)),
            (r#"{"k":"b","seed":1}"#, 0.80, Some(11.0)),
            (r#"{"k":"c","seed":0}"#, 0.70, Some(20.0)),
            (r#"{"k":"c","seed":1}"#, 0.70, Some(20.0)),
            (r#"{"k":"c","seed":2}"#, 0.70, None),
        ]
        .into_iter()
        .enumerate()
        {
            let mut status = trial(index as u32, config, acc);
            if let Some(ms) = ms {
                status.metrics.insert("ms".to_owned(), ms);
            }
            trials.push(status);
        }
        let mut experiment = status(trials);
        experiment.objectives = objectives;
        experiment.front = Some(xp_runtime::protocol::FrontStatus {
            reference: vec![0.5, 40.0],
            reference_declared: true,
            hypervolume: 0.0,
            evaluated: 6,
            trials: Vec::new(),
        });
        let front = compare_front(&experiment).unwrap();
        let keys: Vec<&str> = front
            .configs
            .iter()
            .map(|config| config.config["k"].as_str().unwrap())
            .collect();
        assert_eq!(keys, vec!["b", "a", "c"]);
        assert!(front.configs[2].contribution.is_none());
        assert_eq!(front.configs[2].trials.len(), 2);
        assert_eq!(front.configs[2].summaries[0].as_ref().unwrap().n, 3);
        // Slices of accuracy above 0.5: (0.8, 0.9] × (40 − 30) + (0.5, 0.8] × (40 − 10).
        assert!((front.hypervolume - (0.1 * 10.0 + 0.3 * 30.0)).abs() < 1e-9);
        assert!((front.configs[0].contribution.unwrap() - 0.3 * 20.0).abs() < 1e-9);
        assert!(compare_front(&status(Vec::new())).is_none());
    }

    #[test]
    fn no_metric_is_a_clear_error() {
        let mut no_metric = status(Vec::new());
        no_metric.metric = None;
        assert!(matches!(
            compare(&no_metric, 0.05),
            Err(CompareError::NoMetric { .. })
        ));
    }
}
