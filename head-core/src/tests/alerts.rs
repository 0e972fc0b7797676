//! Tests of alerts in the core: a NaN raises the built-in alert without any
//! rule and never wins; a `stop` rule stops the trial with the alert as its
//! reason and queues its webhook; the policy's defaults apply; deliveries
//! settle the alert's state; a restart keeps active alerts from being raised
//! again; a stalled trial is caught on the tick.

use xp_runtime::protocol::{AdminAction, AdminRequest, DeliveryState};

use super::*;
use crate::alerts::DeliveryOutcome;
use crate::{AlertRecord, TrialRecord};

fn started(core: &mut HeadCore, yaml: &str) -> (NodeId, WorkerKey) {
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 4, Vec::new()));
    let _ = submit(core, 1, yaml, false);
    let (host, key) = launches(&commands(core))[0];
    report(core, 2, host, WorkerReport::Started { key, pid: 7 });
    (host, key)
}

fn metric(key: WorkerKey, index: u64, values: &[(&str, f64)]) -> WorkerReport {
    WorkerReport::Metric {
        key,
        index,
        step: Some(index),
        values: values
            .iter()
            .map(|(name, value)| (name.to_string(), *value))
            .collect(),
    }
}

fn alert_records(records: &[Record]) -> Vec<AlertRecord> {
    records
        .iter()
        .filter_map(|record| match record {
            Record::Alert(alert) => Some(alert.clone()),
            _ => None,
        })
        .collect()
}

const METRIC_ONE: &str = "name: one\ntrial: {command: [train]}\nsearch: {metric: loss}\n";

#[test]
fn a_nan_raises_the_builtin_alert_once_and_is_recorded_as_nan() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (node, key) = started(&mut core, METRIC_ONE);
    let _ = core.take_records();
    report(&mut core, 3, node, metric(key, 1, &[("loss", f64::NAN)]));
    report(&mut core, 4, node, metric(key, 2, &[("loss", f64::NAN)]));
    let records = core.take_records();
    let alerts = alert_records(&records);
    assert_eq!(alerts.len(), 1, "raised once, not per report: {alerts:?}");
    assert_eq!(alerts[0].rule, "nonfinite");
    assert_eq!(alerts[0].delivery, DeliveryState::NotRequested);
    assert!(alerts[0].value.unwrap().is_nan());
    assert!(
        core.book
            .trial(key.trial)
            .metrics
            .get("loss")
            .copied()
            .expect("the metric is recorded")
            .is_nan()
    );
    // The event says so, and the trial keeps running (the built-in rule only records).
    assert!(records.iter().any(|record| matches!(record,
        Record::Event(event) if event.reason == "alert `nonfinite`: loss is NaN at step 1")));
    assert_eq!(core.book.trial(key.trial).state, TrialState::Running);
    // The stored trial record reads back with its NaN.
    let stored = records
        .iter()
        .find_map(|record| match record {
            Record::Trial(trial) => Some(serde_json::to_string(&**trial).unwrap()),
            _ => None,
        })
        .unwrap();
    let back: TrialRecord = serde_json::from_str(&stored).unwrap();
    assert!(
        back.metrics
            .get("loss")
            .copied()
            .expect("the metric is recorded")
            .is_nan()
    );
    // A NaN never wins: the trial that succeeds with NaN is not the best.
    report(
        &mut core,
        5,
        node,
        WorkerReport::Exited {
            key,
            code: Some(0),
            signal: None,
        },
    );
    let page = core.experiments_page(10, None, &|_| true);
    assert!(page.items[0].best.is_none(), "{:?}", page.items[0].best);
    let listed = core.alerts_list(None, &|_| true).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].actions, ["event"]);
    core.check_invariants();
}

#[test]
fn a_stop_rule_stops_the_trial_with_its_reason_and_queues_the_webhook() {
    let spec = "name: s\ntrial: {command: [train]}\nalerts:\n  - name: nan-loss\n    kind: nonfinite\n    metric: loss\n    action: [stop, {webhook: \"http://127.0.0.1:9/hook\"}]\n";
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (node, key) = started(&mut core, spec);
    let _ = commands(&mut core);
    report(&mut core, 3, node, metric(key, 1, &[("loss", 0.5)]));
    assert!(core.take_webhook_deliveries().is_empty());
    report(
        &mut core,
        4,
        node,
        metric(key, 2, &[("loss", f64::INFINITY), ("acc", f64::NAN)]),
    );
    let trial = &core.book.trial(key.trial);
    assert_eq!(trial.state, TrialState::Stopped);
    let reason = trial.reason.as_deref().unwrap();
    assert_eq!(reason, "alert `nan-loss`: loss is Infinity at step 2");
    // Its workers are told to stop.
    assert!(
        commands(&mut core)
            .iter()
            .any(|(_, command)| matches!(command, HeadCommand::Kill { .. }))
    );
    let deliveries = core.take_webhook_deliveries();
    assert_eq!(deliveries.len(), 1);
    let body: serde_json::Value = serde_json::from_str(&deliveries[0].body).unwrap();
    assert_eq!(body["rule"], "nan-loss");
    assert_eq!(body["trial"], key.trial.to_string());
    assert_eq!(body["experiment"], key.trial.experiment.to_string());
    assert_eq!(body["metric"], "loss");
    assert_eq!(body["value"], "Infinity");
    assert_eq!(body["step"], 2);
    // The built-in rule still catches the other metric, as an event only.
    let alerts = alert_records(&core.take_records());
    let rules: Vec<&str> = alerts.iter().map(|alert| alert.rule.as_str()).collect();
    assert_eq!(rules, ["nan-loss", "nonfinite"]);
    assert_eq!(alerts[0].delivery, DeliveryState::Pending { attempts: 0 });
    // The delivery task reports back: the alert's state settles and is stored.
    let id = alerts[0].id;
    core.handle_alert_delivery(5, id, DeliveryOutcome::Delivered { attempts: 3 });
    let settled = alert_records(&core.take_records());
    assert_eq!(
        settled[0].delivery,
        DeliveryState::Delivered { attempts: 3, at: 5 }
    );
    core.check_invariants();
}

#[test]
fn the_policy_defaults_apply_unless_the_experiment_overrides_them() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    core.handle_admin(
        0,
        AdminRequest {
            action: AdminAction::ApplyPolicy {
                yaml: "alerts: [{name: grad, kind: threshold, metric: grad_norm, above: 1000}]\n"
                    .to_owned(),
            },
            who: "admin".to_owned(),
            why: "test".to_owned(),
        },
    )
    .unwrap();
    let (node, key) = started(&mut core, METRIC_ONE);
    let _ = core.take_records();
    report(&mut core, 3, node, metric(key, 1, &[("grad_norm", 10.0)]));
    report(&mut core, 4, node, metric(key, 2, &[("grad_norm", 5000.0)]));
    let alerts = alert_records(&core.take_records());
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].rule, "grad");
    assert_eq!(alerts[0].message, "grad_norm is 5000 at step 2, above 1000");
    // Back under the bound: the alert clears (stored with its clearing time).
    report(&mut core, 5, node, metric(key, 3, &[("grad_norm", 1.0)]));
    let cleared = alert_records(&core.take_records());
    assert_eq!(cleared[0].cleared_at, Some(5));
}

#[test]
fn a_restart_keeps_an_active_alert_from_being_raised_again() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (node, key) = started(&mut core, METRIC_ONE);
    report(&mut core, 3, node, metric(key, 1, &[("loss", f64::NAN)]));
    let records = core.take_records();
    let mut restarted = HeadCore::restore(CONFIG, loaded_from(records), 10);
    restarted.handle_node_register(10, registration(node, 0, 4, vec![key]));
    report(
        &mut restarted,
        11,
        node,
        metric(key, 2, &[("loss", f64::NAN)]),
    );
    assert!(alert_records(&restarted.take_records()).is_empty());
    // Ids continue after the stored ones.
    report(&mut restarted, 12, node, metric(key, 3, &[("loss", 1.0)]));
    report(
        &mut restarted,
        13,
        node,
        metric(key, 4, &[("loss", f64::NAN)]),
    );
    let again = alert_records(&restarted.take_records());
    assert_eq!(again.last().map(|alert| alert.id), Some(2));
}

#[test]
fn a_silent_running_trial_is_stalled_on_the_tick() {
    let spec =
        "name: q\ntrial: {command: [train]}\nalerts: [{kind: stalled, for: 10s, action: stop}]\n";
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (node, key) = started(&mut core, spec);
    let heartbeat = |core: &mut HeadCore, now| {
        core.handle_node_message(now, node, NodeMessage::Heartbeat);
        core.handle_tick(now);
    };
    heartbeat(&mut core, 5_000);
    assert_eq!(core.book.trial(key.trial).state, TrialState::Running);
    heartbeat(&mut core, 13_000);
    assert_eq!(core.book.trial(key.trial).state, TrialState::Stopped);
    let reason = core.book.trial(key.trial).reason.clone().unwrap();
    assert!(
        reason.starts_with("alert `stalled`: no metric report for 12s"),
        "{reason}"
    );
    core.check_invariants();
}
