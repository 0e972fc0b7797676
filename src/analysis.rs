//! `xp compare`: statistics of seed replicates per configuration, and whether the
//! best configuration is significantly better than each runner-up.
//!
//! Pure: it works on an [`ExperimentStatus`] already fetched from the head.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{ExperimentStatus, TrialState};
use xp_tune::stats::{Summary, WelchTest, summarize, welch_t_test};

/// Why an experiment cannot be compared.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompareError {
    /// The spec names no metric to compare by.
    #[error("experiment {0} declares no search.metric to compare by")]
    NoMetric(String),
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
    let metric = status
        .metric
        .clone()
        .ok_or_else(|| CompareError::NoMetric(status.id.to_string()))?;
    let mut groups: BTreeMap<String, (Value, Vec<TrialId>, Vec<f64>)> = BTreeMap::new();
    for trial in &status.trials {
        let mut config: serde_json::Map<String, Value> =
            serde_json::from_str(&trial.config_json).unwrap_or_default();
        config.remove("seed");
        let key = Value::Object(config.clone()).to_string();
        let group = groups
            .entry(key)
            .or_insert_with(|| (Value::Object(config), Vec::new(), Vec::new()));
        if trial.state == TrialState::Succeeded
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
            "std_dev": self.summary.as_ref().map(|summary| summary.std_dev),
            "ci95": self.summary.as_ref().map(|summary| [summary.ci95.0, summary.ci95.1]),
            "trials": self.trials.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "vs_best": self.vs_best.as_ref().map(|test| json!({
                "t": test.t, "dof": test.dof, "p_value": test.p_value, "significant": test.significant,
            })),
        })
    }

    /// How this configuration compares with the best, in words.
    pub fn verdict(&self, alpha: f64) -> String {
        match &self.vs_best {
            None if self.values.is_empty() => "no finished replicate".to_owned(),
            None => "best".to_owned(),
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

#[cfg(test)]
mod tests {
    use xp_runtime::ids::ExperimentId;
    use xp_runtime::protocol::{ExperimentState, TrialStatus};

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
        assert!(comparison.configs[1].verdict(0.05).contains("significant"));
    }

    #[test]
    fn no_metric_is_a_clear_error() {
        let mut no_metric = status(Vec::new());
        no_metric.metric = None;
        assert!(matches!(
            compare(&no_metric, 0.05),
            Err(CompareError::NoMetric(_))
        ));
    }
}
