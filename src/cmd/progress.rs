//! What an experiment's progress display shows, worked out from its status:
//! trials finished out of the total, how many run and wait, failures, the best
//! metric so far with its configuration, and an estimate of the time left.
//!
//! Pure: it reads [`ExperimentStatus`] snapshots and takes the time elapsed as an
//! argument; drawing a bar or printing lines is `watch`'s business.

use std::time::Duration;

use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{ExperimentStatus, TrialState};

/// The best trial by the experiment's metric.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Best {
    pub(crate) trial: TrialId,
    pub(crate) metric: String,
    pub(crate) value: f64,
    pub(crate) config_json: String,
}

/// The best succeeded trial of `status` by its metric (the first of equals), if
/// the experiment names a metric and a succeeded trial reported it.
pub(crate) fn best_trial(status: &ExperimentStatus) -> Option<Best> {
    let metric = status.metric.as_ref()?;
    let mut best: Option<Best> = None;
    for trial in &status.trials {
        if !trial.state.ended_normally() {
            continue;
        }
        let Some(&value) = trial.metrics.get(metric) else {
            continue;
        };
        if value.is_nan() {
            continue;
        }
        let better = best.as_ref().is_none_or(|best| {
            if status.maximize {
                value > best.value
            } else {
                value < best.value
            }
        });
        if better {
            best = Some(Best {
                trial: trial.id,
                metric: metric.clone(),
                value,
                config_json: trial.config_json.clone(),
            });
        }
    }
    best
}

/// Counts of an experiment's trials by what they are doing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Trials known to the head.
    pub(crate) known: usize,
    pub(crate) succeeded: usize,
    pub(crate) failed: usize,
    /// Stopped early by a rule or cancelled.
    pub(crate) ended_otherwise: usize,
    /// Placed, starting, running or preempting.
    pub(crate) running: usize,
    /// Pending or queued.
    pub(crate) waiting: usize,
}

impl Counts {
    fn of(status: &ExperimentStatus) -> Self {
        let mut counts = Self {
            known: status.trials.len(),
            ..Self::default()
        };
        for trial in &status.trials {
            match trial.state {
                TrialState::Succeeded => counts.succeeded += 1,
                TrialState::Failed => counts.failed += 1,
                TrialState::Stopped | TrialState::Cancelled => counts.ended_otherwise += 1,
                TrialState::Placed
                | TrialState::Starting
                | TrialState::Running
                | TrialState::Preempting => counts.running += 1,
                TrialState::Pending | TrialState::Queued => counts.waiting += 1,
            }
        }
        counts
    }

    /// Trials that will not run again.
    pub(crate) fn finished(&self) -> usize {
        self.succeeded + self.failed + self.ended_otherwise
    }
}

/// An experiment's progress, updated from each status snapshot.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    /// How many trials the spec asks for (searches that ask as they go create
    /// trials late); 0 when only the head knows.
    expected_total: usize,
    counts: Counts,
    best: Option<Best>,
    elapsed: Duration,
}

impl Progress {
    pub(crate) fn new(expected_total: usize) -> Self {
        Self {
            expected_total,
            counts: Counts::default(),
            best: None,
            elapsed: Duration::ZERO,
        }
    }

    /// Takes in a snapshot of the experiment, `elapsed` after watching began.
    pub(crate) fn observe(&mut self, status: &ExperimentStatus, elapsed: Duration) {
        self.counts = Counts::of(status);
        self.best = best_trial(status);
        self.elapsed = elapsed;
    }

    pub(crate) fn counts(&self) -> Counts {
        self.counts
    }

    /// The trials expected in all: what the spec asks for, or more if the head made more.
    pub(crate) fn total(&self) -> usize {
        self.expected_total.max(self.counts.known)
    }

    /// The time left at the pace so far (elapsed time per finished trial), once a
    /// trial has finished; zero when all have.
    pub(crate) fn eta(&self) -> Option<Duration> {
        let finished = self.counts.finished();
        let left = self.total().saturating_sub(finished);
        if left == 0 {
            return Some(Duration::ZERO);
        }
        if finished == 0 {
            return None;
        }
        Some(self.elapsed.mul_f64(left as f64 / finished as f64))
    }

    /// One line: `3/8 finished, 2 running, 3 waiting, 1 failed, best loss=0.0123 {"x":1}, about 12s left`.
    pub(crate) fn summary(&self) -> String {
        let mut parts = vec![format!(
            "{}/{} finished",
            self.counts.finished(),
            self.total()
        )];
        parts.push(self.message());
        parts.retain(|part| !part.is_empty());
        parts.join(", ")
    }

    /// The summary without the finished count (a bar shows that itself).
    pub(crate) fn message(&self) -> String {
        let counts = self.counts;
        let mut parts = vec![
            format!("{} running", counts.running),
            format!("{} waiting", counts.waiting),
        ];
        if counts.failed > 0 {
            parts.push(format!("{} failed", counts.failed));
        }
        if let Some(best) = &self.best {
            parts.push(format!(
                "best {}={:.4} {}",
                best.metric, best.value, best.config_json
            ));
        }
        if let Some(eta) = self.eta().filter(|eta| !eta.is_zero()) {
            let rounded = Duration::from_secs(eta.as_secs().max(1));
            parts.push(format!(
                "about {} left",
                humantime::format_duration(rounded)
            ));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use xp_runtime::ids::ExperimentId;
    use xp_runtime::protocol::{ExperimentState, TrialStatus};

    use super::*;

    /// An experiment whose trials have these states and (for `Some`) metric values.
    fn experiment(maximize: bool, trials: &[(TrialState, Option<f64>)]) -> ExperimentStatus {
        let id: ExperimentId = "0123456789abcdef".parse().expect("an experiment id");
        ExperimentStatus {
            id,
            name: "test".to_owned(),
            team: "default".to_owned(),
            state: ExperimentState::Running,
            metric: Some("loss".to_owned()),
            maximize,
            submitted_at: Default::default(),
            code_version: String::new(),
            data_version: String::new(),
            trials: trials
                .iter()
                .enumerate()
                .map(|(index, (state, value))| TrialStatus {
                    id: TrialId {
                        experiment: id,
                        index: index as u32,
                    },
                    state: *state,
                    config_json: format!("{{\"i\":{index}}}"),
                    attempts: Vec::new(),
                    metrics: value
                        .map(|value| BTreeMap::from([("loss".to_owned(), value)]))
                        .unwrap_or_default(),
                    last_step: None,
                    reason: None,
                    reused_from: None,
                    waiting: None,
                    gpu_hours: 0.0,
                    cost: None,
                    malformed_metrics: None,
                })
                .collect(),
            objectives: Vec::new(),
            front: None,
        }
    }

    fn check_best(maximize: bool, trials: &[(TrialState, Option<f64>)], expected: Option<f64>) {
        let best = best_trial(&experiment(maximize, trials)).map(|best| best.value);
        assert_eq!(best, expected);
    }

    fn check_summary(
        expected_total: usize,
        trials: &[(TrialState, Option<f64>)],
        elapsed_s: u64,
        expected: &str,
    ) {
        let mut progress = Progress::new(expected_total);
        progress.observe(&experiment(false, trials), Duration::from_secs(elapsed_s));
        assert_eq!(progress.summary(), expected);
    }

    use TrialState::{Cancelled, Failed, Pending, Queued, Running, Starting, Stopped, Succeeded};

    #[test]
    fn best_is_the_smallest_or_largest_value_of_a_trial_that_ended_normally() {
        check_best(
            false,
            &[(Succeeded, Some(2.0)), (Succeeded, Some(1.0))],
            Some(1.0),
        );
        check_best(
            true,
            &[(Succeeded, Some(2.0)), (Succeeded, Some(1.0))],
            Some(2.0),
        );
        check_best(
            false,
            &[(Running, Some(0.1)), (Succeeded, Some(1.0))],
            Some(1.0),
        );
        // A stopped trial ended normally; a failed one's value is no result.
        check_best(
            false,
            &[(Failed, Some(0.1)), (Stopped, Some(0.2))],
            Some(0.2),
        );
        check_best(false, &[(Failed, Some(0.1)), (Cancelled, Some(0.2))], None);
        check_best(
            false,
            &[(Succeeded, None), (Succeeded, Some(f64::NAN))],
            None,
        );
        check_best(false, &[], None);
    }

    #[test]
    fn best_names_the_first_of_equals() {
        let status = experiment(false, &[(Succeeded, Some(1.0)), (Succeeded, Some(1.0))]);
        let best = best_trial(&status).expect("a best trial");
        assert_eq!(best.trial, status.trials[0].id);
        assert_eq!(best.config_json, "{\"i\":0}");
    }

    #[test]
    fn counts_sort_states() {
        let mut progress = Progress::new(0);
        let trials = [
            (Succeeded, None),
            (Failed, None),
            (Stopped, None),
            (Cancelled, None),
            (Running, None),
            (Starting, None),
            (Pending, None),
            (Queued, None),
        ];
        progress.observe(&experiment(false, &trials), Duration::ZERO);
        let counts = progress.counts();
        assert_eq!(
            (
                counts.succeeded,
                counts.failed,
                counts.finished(),
                counts.running,
                counts.waiting
            ),
            (1, 1, 4, 2, 2)
        );
        assert_eq!(progress.total(), 8);
    }

    #[test]
    fn eta_follows_the_pace_so_far() {
        let mut progress = Progress::new(4);
        progress.observe(
            &experiment(false, &[(Running, None)]),
            Duration::from_secs(5),
        );
        assert_eq!(progress.eta(), None, "nothing finished yet");
        progress.observe(
            &experiment(false, &[(Succeeded, Some(1.0)), (Running, None)]),
            Duration::from_secs(10),
        );
        assert_eq!(progress.eta(), Some(Duration::from_secs(30)));
        progress.observe(
            &experiment(false, &[(Succeeded, None); 4]),
            Duration::from_secs(40),
        );
        assert_eq!(progress.eta(), Some(Duration::ZERO));
    }

    #[test]
    fn summaries() {
        check_summary(
            4,
            &[(Running, None), (Queued, None)],
            3,
            "0/4 finished, 1 running, 1 waiting",
        );
        check_summary(
            4,
            &[
                (Succeeded, Some(0.5)),
                (Failed, None),
                (Running, None),
                (Pending, None),
            ],
            10,
            "2/4 finished, 1 running, 1 waiting, 1 failed, best loss=0.5000 {\"i\":0}, about 10s left",
        );
        check_summary(
            0,
            &[(Succeeded, Some(0.25))],
            1,
            "1/1 finished, 0 running, 0 waiting, best loss=0.2500 {\"i\":0}",
        );
    }
}
