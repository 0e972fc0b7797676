//! Alerts in the core: the rules in force for each experiment (its own, the
//! policy's defaults, the built-in `nonfinite`), judging rank 0's metric reports
//! and, on the tick, silence and GPU underuse (`watch`, pure), and turning
//! what they decide into alerts: an [`AlertRecord`] and a trial event each, the
//! trial stopped (state `stopped`, the alert as its reason) when the rule says
//! `stop`, and one [`WebhookDelivery`] per webhook for the actor to hand to the
//! delivery task once the alert is stored.
//!
//! Sans-io like the rest of the core. Bounded: at most [`MAX_ALERTS_PER_TRIAL`]
//! alerts are kept per trial (a rule flapping past that is logged, not kept),
//! and a rule raises once until its condition clears (`watch`'s invariant).
//! The evaluators' state (EMAs, silences) is soft: after a restart it starts
//! again, while an alert stored as not cleared stays active, so it is not
//! raised a second time.

mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::{info, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId, WorkerKey};
use xp_runtime::metric_value::value_json;
use xp_runtime::protocol::{AlertStatus, DeliveryState, MAX_ALERTS_LISTED, TrialState};
use xp_runtime::spec::{AlertAction, AlertCondition, AlertRule, effective_rules};

use self::watch::{Firing, TrialWatch, Verdict};
use super::pages::{Page, PageError};
use super::{AlertRecord, CoreError, HeadCore, Record};

/// The most alerts kept per trial.
pub const MAX_ALERTS_PER_TRIAL: u32 = 100;

/// How often the time-based rules are judged (the actor ticks more often).
const TICK_EVERY_MS: u64 = 1_000;

/// A GPU utilisation figure older than this is not judged on.
const GPU_FIGURE_FRESH_MS: u64 = 120_000;

/// One POST to make: the alert's JSON body to one webhook URL.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookDelivery {
    /// The alert.
    pub alert: u64,
    /// Where to.
    pub url: String,
    /// The JSON body: rule, experiment, trial, metric, value, step, time, message.
    pub body: String,
    /// The team of the alert's experiment: deliveries are queued fairly per
    /// team (filled in by [`HeadCore::take_webhook_deliveries`]).
    pub team: String,
}

/// How one webhook delivery went, as the delivery task reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// A 2xx answer after this many attempts.
    Delivered {
        /// Attempts made.
        attempts: u32,
    },
    /// Given up after this many attempts.
    Failed {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        error: String,
    },
    /// Dropped from the full queue, never sent.
    Dropped,
    /// Not sent because its host failed too often lately (the delivery task's
    /// circuit breaker is open for it).
    HostFailing,
}

/// Webhooks of one alert not settled yet (soft state).
#[derive(Debug, Clone, Default)]
struct Outstanding {
    remaining: u32,
    attempts: u32,
    failed: Option<String>,
    dropped: bool,
    /// Why a webhook was not sent, when the breaker skipped it.
    skipped: Option<&'static str>,
}

/// What the core keeps of alerts.
#[derive(Debug, Default)]
pub(super) struct AlertState {
    /// The rules in force per experiment, merged on first use; forgotten when
    /// the policy's defaults change.
    rules: BTreeMap<ExperimentId, Arc<[AlertRule]>>,
    /// The policy's default rules the merged rules were made with.
    defaults: Vec<AlertRule>,
    /// Each trial's evaluation state.
    watches: BTreeMap<TrialId, TrialWatch>,
    /// Every alert, by id.
    alerts: BTreeMap<u64, AlertRecord>,
    /// How many alerts each trial has.
    per_trial: BTreeMap<TrialId, u32>,
    next_id: u64,
    /// Webhook posts to hand to the delivery task once stored.
    deliveries: Vec<WebhookDelivery>,
    /// Webhooks not settled, by alert.
    outstanding: BTreeMap<u64, Outstanding>,
    /// Each trial's latest GPU utilisation (a fraction) and when it came.
    gpu_utilisation: BTreeMap<TrialId, (UnixMillis, f64)>,
    last_tick: UnixMillis,
    /// Alerts raised since the actor last took the tally: (kind, action).
    raised: Vec<(&'static str, &'static str)>,
}

impl AlertState {
    /// The state restored from stored alerts: ids continue after the newest,
    /// uncleared alerts stay active, and deliveries that were pending are queued
    /// again (their bodies are rebuilt from the record; a core rebuilt in the
    /// same head drops them, as its delivery task still holds them).
    pub(super) fn restore(records: Vec<AlertRecord>) -> Self {
        let mut state = Self {
            next_id: 1,
            ..Self::default()
        };
        for record in records {
            state.next_id = state.next_id.max(record.id + 1);
            *state.per_trial.entry(record.trial).or_default() += 1;
            if record.cleared_at.is_none() {
                state
                    .watches
                    .entry(record.trial)
                    .or_default()
                    .mark_active(&record.rule);
            }
            if matches!(record.delivery, DeliveryState::Pending { .. }) {
                let urls: Vec<String> = webhooks_of(&record.actions).collect();
                state.outstanding.insert(
                    record.id,
                    Outstanding {
                        remaining: urls.len() as u32,
                        ..Outstanding::default()
                    },
                );
                for url in urls {
                    state.deliveries.push(WebhookDelivery {
                        alert: record.id,
                        url,
                        body: webhook_body(&record),
                        team: String::new(),
                    });
                }
            }
            state.alerts.insert(record.id, record);
        }
        state
    }

    /// Notes a trial's GPU utilisation (a fraction) from telemetry.
    pub(super) fn note_gpu_utilisation(&mut self, now: UnixMillis, trial: TrialId, fraction: f64) {
        if fraction.is_finite() {
            self.gpu_utilisation
                .insert(trial, (now, fraction.clamp(0.0, 1.0)));
        }
    }

    /// The alerts raised since the last call, as (kind, action) pairs.
    pub(super) fn take_raised(&mut self) -> Vec<(&'static str, &'static str)> {
        std::mem::take(&mut self.raised)
    }
}

fn webhooks_of(actions: &[AlertAction]) -> impl Iterator<Item = String> + '_ {
    actions.iter().filter_map(|action| match action {
        AlertAction::Webhook(url) => Some(url.clone()),
        _ => None,
    })
}

/// The JSON body posted to a webhook.
fn webhook_body(record: &AlertRecord) -> String {
    serde_json::json!({
        "alert": record.id,
        "rule": record.rule,
        "kind": record.kind.as_str(),
        "experiment": record.trial.experiment.to_string(),
        "trial": record.trial.to_string(),
        "metric": record.metric,
        "value": record.value.map(value_json),
        "step": record.step,
        "time_ms": record.at,
        "time": humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(record.at)
        )
        .to_string(),
        "message": record.message,
    })
    .to_string()
}

/// An alert as `xp alerts` shows it.
fn alert_status(record: &AlertRecord) -> AlertStatus {
    let mut actions = vec!["event".to_owned()];
    for action in &record.actions {
        if *action != AlertAction::Event && !actions.iter().any(|seen| seen == action.label()) {
            actions.push(action.label().to_owned());
        }
    }
    AlertStatus {
        id: record.id,
        trial: record.trial,
        rule: record.rule.clone(),
        kind: record.kind.as_str().to_owned(),
        metric: record.metric.clone(),
        value: record.value,
        step: record.step,
        at: record.at,
        message: record.message.clone(),
        actions,
        delivery: record.delivery.clone(),
        cleared_at: record.cleared_at,
    }
}

/// Where a listing of alerts (newest first) continues: the last id returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlertCursor(pub u64);

impl AlertCursor {
    /// The cursor's text.
    pub fn encode(&self) -> String {
        format!("a:{}", self.0)
    }

    /// A cursor from its text.
    pub fn decode(text: &str) -> Option<Self> {
        let id = text.strip_prefix("a:")?;
        if id.is_empty() || !id.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        id.parse().ok().map(Self)
    }
}

impl HeadCore {
    /// The rules in force for an experiment.
    fn alert_rules(&mut self, experiment: ExperimentId) -> Arc<[AlertRule]> {
        if self.alerts.defaults != self.placement.policy().config().alerts {
            self.alerts.defaults = self.placement.policy().config().alerts.clone();
            self.alerts.rules.clear();
        }
        if let Some(rules) = self.alerts.rules.get(&experiment) {
            return rules.clone();
        }
        let own = self
            .book
            .get_spec(experiment)
            .map(|spec| spec.alerts.as_slice())
            .unwrap_or_default();
        let rules: Arc<[AlertRule]> =
            effective_rules(&self.placement.policy().config().alerts, own).into();
        self.alerts.rules.insert(experiment, rules.clone());
        rules
    }

    /// Judges a metric report of the live rank 0 of an unfinished trial; returns
    /// the reason to stop the trial with, when a rule that fired says `stop`.
    pub(super) fn judge_alerts(
        &mut self,
        now: UnixMillis,
        key: WorkerKey,
        step: Option<u64>,
        values: &BTreeMap<String, f64>,
    ) -> Option<String> {
        let rules = self.alert_rules(key.trial.experiment);
        let verdicts = self
            .alerts
            .watches
            .entry(key.trial)
            .or_default()
            .on_metric(&rules, now, step, values);
        self.apply_verdicts(now, key.trial, &rules, verdicts, step)
    }

    /// Judges the time-based rules (`stalled`, `gpu_underused`) of running
    /// trials, at most once a second, and forgets finished trials' watches.
    pub(super) fn tick_alerts(&mut self, now: UnixMillis) {
        if now.saturating_sub(self.alerts.last_tick) < TICK_EVERY_MS {
            return;
        }
        self.alerts.last_tick = now;
        let finished: Vec<TrialId> = self
            .alerts
            .watches
            .keys()
            .filter(|trial| {
                self.book
                    .get_trial(**trial)
                    .is_none_or(|record| record.state.is_terminal())
            })
            .copied()
            .collect();
        for trial in finished {
            self.alerts.watches.remove(&trial);
            self.alerts.gpu_utilisation.remove(&trial);
        }
        let experiments: Vec<ExperimentId> = self
            .book
            .experiment_ids()
            .filter(|experiment| {
                self.experiment_state(*experiment) == xp_runtime::protocol::ExperimentState::Running
            })
            .collect();
        for experiment in experiments {
            let rules = self.alert_rules(experiment);
            let timed = rules.iter().any(|rule| {
                matches!(
                    rule.condition(),
                    AlertCondition::Stalled { .. } | AlertCondition::GpuUnderused { .. }
                )
            });
            if !timed {
                continue;
            }
            let running: Vec<(TrialId, Option<UnixMillis>, bool)> = self
                .book
                .trials_of(experiment)
                .filter(|(_, trial)| trial.state == TrialState::Running)
                .map(|(id, trial)| {
                    let live = trial
                        .attempts
                        .iter()
                        .rev()
                        .find(|attempt| attempt.is_live());
                    let has_gpu = live.is_some_and(|attempt| {
                        attempt
                            .workers
                            .iter()
                            .any(|worker| !worker.gpu_indices.is_empty())
                    });
                    (*id, live.and_then(|attempt| attempt.running_at), has_gpu)
                })
                .collect();
            for (trial, running_since, has_gpu) in running {
                let gpu = self
                    .alerts
                    .gpu_utilisation
                    .get(&trial)
                    .filter(|(at, _)| has_gpu && now.saturating_sub(*at) <= GPU_FIGURE_FRESH_MS)
                    .map(|(_, fraction)| *fraction);
                let verdicts = self.alerts.watches.entry(trial).or_default().on_tick(
                    &rules,
                    now,
                    running_since,
                    gpu,
                );
                if let Some(reason) = self.apply_verdicts(now, trial, &rules, verdicts, None) {
                    self.stop_for_alert(now, trial, reason);
                }
            }
        }
    }

    /// Ends the trial's live attempt and stops it with `reason`.
    fn stop_for_alert(&mut self, now: UnixMillis, trial: TrialId, reason: String) {
        if self
            .book
            .get_trial(trial)
            .is_none_or(|record| record.state.is_terminal())
        {
            return;
        }
        self.end_live_attempt(now, trial, "stopped by an alert");
        self.transition(now, trial, TrialState::Stopped, reason);
    }

    /// Turns verdicts into alerts and clears; returns the stop reason, if any.
    fn apply_verdicts(
        &mut self,
        now: UnixMillis,
        trial: TrialId,
        rules: &[AlertRule],
        verdicts: Vec<Verdict>,
        step: Option<u64>,
    ) -> Option<String> {
        let mut stop = None;
        for verdict in verdicts {
            match verdict {
                Verdict::Clear(index) => {
                    self.clear_alert(now, trial, rules[index].effective_name())
                }
                Verdict::Raise(firing) => {
                    let rule = &rules[firing.rule];
                    if let Some(text) = self.raise_alert(now, trial, rule, firing, step) {
                        stop.get_or_insert(text);
                    }
                }
            }
        }
        stop
    }

    /// The trial's active alert of rule `name`, if any, has cleared.
    fn clear_alert(&mut self, now: UnixMillis, trial: TrialId, name: &str) {
        let active = self.alerts.alerts.values_mut().rev().find(|record| {
            record.trial == trial && record.rule == name && record.cleared_at.is_none()
        });
        if let Some(record) = active {
            record.cleared_at = Some(now);
            self.outbox.record(Record::Alert(record.clone()));
        }
    }

    /// Raises an alert of `rule` on `trial` (at most `MAX_ALERTS_PER_TRIAL`
    /// per trial): stored, an event on the trial, its webhooks queued. Returns
    /// the event's text when the rule stops the trial.
    fn raise_alert(
        &mut self,
        now: UnixMillis,
        trial: TrialId,
        rule: &AlertRule,
        firing: Firing,
        step: Option<u64>,
    ) -> Option<String> {
        let count = self.alerts.per_trial.entry(trial).or_default();
        if *count >= MAX_ALERTS_PER_TRIAL {
            warn!(trial_id = %trial, rule = rule.effective_name(), "alert not kept: the trial has {MAX_ALERTS_PER_TRIAL} already");
            return None;
        }
        *count += 1;
        let id = self.alerts.next_id;
        self.alerts.next_id += 1;
        let webhooks: Vec<String> = webhooks_of(&rule.action).collect();
        let record = AlertRecord {
            id,
            trial,
            rule: rule.effective_name().to_owned(),
            kind: rule.kind,
            metric: firing.metric,
            value: firing.value,
            step,
            at: now,
            message: firing.message,
            actions: rule.action.clone(),
            delivery: if webhooks.is_empty() {
                DeliveryState::NotRequested
            } else {
                DeliveryState::Pending { attempts: 0 }
            },
            cleared_at: None,
        };
        let text = format!("alert `{}`: {}", record.rule, record.message);
        info!(trial_id = %trial, alert = id, rule = %record.rule, message = %record.message, "alert raised");
        let (state, attempt) = self
            .book
            .get_trial(trial)
            .map(|trial| (trial.state, trial.attempts.len() as u32))
            .unwrap_or((TrialState::Running, 0));
        self.push_event(now, trial, state, attempt, text.clone());
        let kind = rule.kind.as_str();
        self.alerts.raised.push((kind, "event"));
        let stop = rule.stops().then(|| {
            self.alerts.raised.push((kind, "stop"));
            text
        });
        if !webhooks.is_empty() {
            self.alerts.raised.push((kind, "webhook"));
            self.queue_webhooks(&record, webhooks);
        }
        self.outbox.record(Record::Alert(record.clone()));
        self.alerts.alerts.insert(id, record);
        stop
    }

    /// Queues one delivery per webhook of a raised alert.
    fn queue_webhooks(&mut self, record: &AlertRecord, webhooks: Vec<String>) {
        self.alerts.outstanding.insert(
            record.id,
            Outstanding {
                remaining: webhooks.len() as u32,
                ..Outstanding::default()
            },
        );
        for url in webhooks {
            self.alerts.deliveries.push(WebhookDelivery {
                alert: record.id,
                url,
                body: webhook_body(record),
                team: String::new(),
            });
        }
    }

    /// The webhook posts of alerts raised since the last call; the caller hands
    /// them to the delivery task only once the alerts are stored.
    pub fn take_webhook_deliveries(&mut self) -> Vec<WebhookDelivery> {
        let mut deliveries = std::mem::take(&mut self.alerts.deliveries);
        for delivery in &mut deliveries {
            // Done here rather than when raised so that restored deliveries
            // (built before the specs are known) get their team too.
            if let Some(spec) = self
                .alerts
                .alerts
                .get(&delivery.alert)
                .and_then(|record| self.book.get_spec(record.trial.experiment))
            {
                delivery.team.clone_from(&spec.team);
            }
        }
        deliveries
    }

    /// Where the policy lets alert webhooks be posted.
    pub fn webhook_policy(&self) -> &xp_sched::config::WebhookPolicy {
        &self.placement.policy().config().webhooks
    }

    /// How one webhook post of an alert went: the alert's delivery state is
    /// settled once all its webhooks are (failed if any failed).
    pub fn handle_alert_delivery(&mut self, now: UnixMillis, alert: u64, outcome: DeliveryOutcome) {
        let Some(outstanding) = self.alerts.outstanding.get_mut(&alert) else {
            return;
        };
        outstanding.remaining = outstanding.remaining.saturating_sub(1);
        match &outcome {
            DeliveryOutcome::Delivered { attempts } => {
                outstanding.attempts = outstanding.attempts.max(*attempts);
            }
            DeliveryOutcome::Failed { attempts, error } => {
                outstanding.attempts = outstanding.attempts.max(*attempts);
                outstanding.failed = Some(error.clone());
            }
            DeliveryOutcome::Dropped => outstanding.dropped = true,
            DeliveryOutcome::HostFailing => outstanding.skipped = Some("host failing"),
        }
        let settled = outstanding.remaining == 0;
        let state = if let Some(error) = &outstanding.failed {
            DeliveryState::Failed {
                attempts: outstanding.attempts,
                error: error.clone(),
            }
        } else if let Some(reason) = outstanding.skipped {
            DeliveryState::DroppedBecause {
                reason: reason.to_owned(),
            }
        } else if outstanding.dropped {
            DeliveryState::Dropped
        } else if settled {
            DeliveryState::Delivered {
                attempts: outstanding.attempts,
                at: now,
            }
        } else {
            DeliveryState::Pending {
                attempts: outstanding.attempts,
            }
        };
        if settled {
            self.alerts.outstanding.remove(&alert);
        }
        if let Some(record) = self.alerts.alerts.get_mut(&alert)
            && record.delivery != state
        {
            if let DeliveryOutcome::Failed { error, .. } = &outcome {
                warn!(alert, trial_id = %record.trial, %error, "alert webhook given up");
            }
            record.delivery = state;
            self.outbox.record(Record::Alert(record.clone()));
        }
    }

    /// The alerts of the experiment named by `filter` (id or prefix), or of
    /// every experiment whose team `visible_team` shows, newest first, at most
    /// [`MAX_ALERTS_LISTED`].
    pub fn alerts_list(
        &self,
        filter: Option<&str>,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<AlertStatus>, CoreError> {
        let experiment = filter
            .map(|text| self.resolve_experiment(text))
            .transpose()?;
        Ok(self
            .alerts
            .alerts
            .values()
            .rev()
            .filter(|record| {
                let of = record.trial.experiment;
                experiment.is_none_or(|wanted| wanted == of)
                    && self
                        .book
                        .get_spec(of)
                        .is_some_and(|spec| visible_team(&spec.team))
            })
            .take(MAX_ALERTS_LISTED)
            .map(alert_status)
            .collect())
    }

    /// A page of alerts, newest first, of one experiment or of every visible one.
    pub fn alerts_page(
        &self,
        experiment: Option<ExperimentId>,
        limit: usize,
        cursor: Option<AlertCursor>,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<Page<AlertStatus>, PageError> {
        if let Some(experiment_id) = experiment {
            let visible = self
                .book
                .get_spec(experiment_id)
                .is_some_and(|spec| visible_team(&spec.team));
            if !visible {
                return Err(PageError::ExperimentNotFound { experiment_id });
            }
        }
        let limit = limit.clamp(1, super::pages::MAX_LIMIT);
        let wanted = |record: &&AlertRecord| {
            let of = record.trial.experiment;
            experiment.is_none_or(|wanted| wanted == of)
                && self
                    .book
                    .get_spec(of)
                    .is_some_and(|spec| visible_team(&spec.team))
        };
        let total = self.alerts.alerts.values().filter(wanted).count() as u64;
        let upper = cursor.map_or(u64::MAX, |AlertCursor(last)| last.saturating_sub(1));
        let mut chosen: Vec<&AlertRecord> = self
            .alerts
            .alerts
            .range(..=upper)
            .rev()
            .map(|(_, record)| record)
            .filter(wanted)
            .take(limit + 1)
            .collect();
        let more = chosen.len() > limit;
        chosen.truncate(limit);
        let next_cursor = more
            .then(|| chosen.last().map(|record| AlertCursor(record.id).encode()))
            .flatten();
        Ok(Page {
            items: chosen.into_iter().map(alert_status).collect(),
            next_cursor,
            total,
        })
    }

    /// The tally of alerts raised, for `/metrics`.
    pub fn take_alerts_raised(&mut self) -> Vec<(&'static str, &'static str)> {
        self.alerts.take_raised()
    }
}
