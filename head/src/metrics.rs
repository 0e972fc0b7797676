//! The head's Prometheus metrics (`GET /metrics`), through `prometheus-client`.
//!
//! Two kinds, kept apart so that neither can drift:
//! - counters and the decision-latency histogram live in [`HeadMetrics`], one
//!   registry the head owns and shares by `Arc` with the actor (the core's
//!   [`Tally`] of state changes, checkpoints and decision timings, taken at
//!   each commit and counted once stored; authorization refusals), the QUIC server
//!   and the HTTP API (requests and errors by kind); they count events where
//!   they happen, after the head has stored them;
//! - gauges that describe state (trials by queue and state, waiting trials per
//!   queue, GPUs per node and model, nodes by state) are built at scrape time
//!   from one actor call (`HeadMsg::MetricsSnapshot`, a
//!   [`xp_head_core::metrics::MetricsSnapshot`]) into a registry of their own.
//!
//! Every label is bounded by the cluster (queues, nodes, GPU models, states,
//! actions, roles, request kinds, error codes), never by submitted work.
//!
//! `prometheus-client` writes OpenMetrics; [`HeadMetrics::render`] serves that
//! to a scraper that asks for it (`Accept: application/openmetrics-text`, as
//! Prometheus does) and otherwise the Prometheus text format 0.0.4, which
//! `promtool check metrics` reads: the two differ, for what is exported here,
//! only in a counter family's name (`_total` on its `# HELP`/`# TYPE` lines), the
//! `# UNIT` line and the closing `# EOF`.

use std::fmt::Write as _;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry, Unit};
use xp_runtime::protocol::TrialState;

use xp_head_core::metrics::{MetricsSnapshot, Tally};

/// The content type of the Prometheus text format.
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of OpenMetrics text.
pub(crate) const OPENMETRICS_TEXT: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A trial's end.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// A failed attempt's kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// A refused request: what it tried and the role of who asked.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    action: &'static str,
    role: &'static str,
}

/// An alert raised: its rule's kind and one action it took (`event` for every
/// alert, `stop` and `webhook` when the rule said so).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlertLabels {
    kind: &'static str,
    action: &'static str,
}

/// How an alert webhook delivery ended: `delivered`, `failed`, `dropped`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    outcome: &'static str,
}

/// A request: which API and what kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    api: &'static str,
    kind: String,
}

/// A request that failed: which API, what kind, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    api: &'static str,
    kind: String,
    code: String,
}

/// A team, as the user table names it (object transfers).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeamLabels {
    team: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStateLabels {
    queue: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuIndexLabels {
    node: String,
    gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    node: String,
    tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// Which API served a request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Api {
    /// The QUIC control plane (CLI, SDK).
    Quic,
    /// The HTTP API.
    Http,
}

impl Api {
    fn as_str(self) -> &'static str {
        match self {
            Self::Quic => "quic",
            Self::Http => "http",
        }
    }
}

/// The head's counters and histograms, and the registry they are in.
#[derive(Debug)]
pub(crate) struct HeadMetrics {
    registry: Registry,
    decision_seconds: Histogram,
    commit_records: Histogram,
    trials: TrialCounters,
    checkpoints: CheckpointCounters,
    requests: RequestCounters,
    alerts: AlertCounters,
    objects: ObjectCounters,
}

impl Default for HeadMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers `metric` (with its unit, if any) and returns a handle to it.
fn register<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: M,
) -> M {
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, metric.clone()),
        None => registry.register(name, help, metric.clone()),
    }
    metric
}

/// What happened to trials and their attempts.
#[derive(Debug)]
struct TrialCounters {
    starts: Counter,
    finishes: Family<OutcomeLabels, Counter>,
    preemptions: Counter,
    gpu_memory_evictions: Counter,
    attempt_failures: Family<KindLabels, Counter>,
}

impl TrialCounters {
    fn register(registry: &mut Registry) -> Self {
        Self {
            starts: register(
                registry,
                "trial_starts",
                "Trial attempts placed and launched",
                None,
                Counter::default(),
            ),
            finishes: register(
                registry,
                "trial_finishes",
                "Trials that ended, by outcome (succeeded, failed, cancelled, stopped)",
                None,
                Family::default(),
            ),
            preemptions: register(
                registry,
                "trial_preemptions",
                "Running trials asked to checkpoint and stop for other work",
                None,
                Counter::default(),
            ),
            gpu_memory_evictions: register(
                registry,
                "gpu_memory_evictions",
                "Oversubscribed workers their nodes stopped through their checkpoints because a GPU ran short of memory; requeued without using a retry",
                None,
                Counter::default(),
            ),
            attempt_failures: register(
                registry,
                "attempt_failures",
                "Trial attempts that failed through the trial's fault, by kind (failed, oom-killed, time-limit); retried under max_retries",
                None,
                Family::default(),
            ),
        }
    }
}

/// Checkpoints recorded, their bytes and how long nodes took to store them.
#[derive(Debug)]
struct CheckpointCounters {
    count: Counter,
    bytes: Counter,
    take_seconds: Histogram,
}

impl CheckpointCounters {
    fn register(registry: &mut Registry) -> Self {
        Self {
            count: register(
                registry,
                "checkpoints",
                "Checkpoints recorded (a report a node resends is counted once)",
                None,
                Counter::default(),
            ),
            bytes: register(
                registry,
                "checkpoint",
                "Bytes of the checkpoints recorded",
                Some(Unit::Bytes),
                Counter::default(),
            ),
            // 1 ms to about 4.4 min: a small state file to many gigabytes.
            take_seconds: register(
                registry,
                "checkpoint_take",
                "Wall time a node took to store a checkpoint (renaming it aside, hashing and storing its files, the backup)",
                Some(Unit::Seconds),
                Histogram::new(exponential_buckets(1e-3, 4.0, 10)),
            ),
        }
    }
}

/// Requests served, refused by authorization, and answered with an error.
#[derive(Debug)]
struct RequestCounters {
    refusals: Family<RefusalLabels, Counter>,
    served: Family<RequestLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    abandoned: Counter,
}

impl RequestCounters {
    fn register(registry: &mut Registry) -> Self {
        Self {
            refusals: register(
                registry,
                "authorization_refusals",
                "Requests refused by authorization, by action and the caller's role",
                None,
                Family::default(),
            ),
            served: register(
                registry,
                "api_requests",
                "Requests served, by API (quic, http) and kind",
                None,
                Family::default(),
            ),
            errors: register(
                registry,
                "api_errors",
                "Requests answered with an error, by API, kind and error code",
                None,
                Family::default(),
            ),
            abandoned: register(
                registry,
                "abandoned_requests",
                "Requests the head actor skipped because their caller had stopped waiting (a timeout, a closed connection)",
                None,
                Counter::default(),
            ),
        }
    }
}

/// Alerts raised and their webhook deliveries.
#[derive(Debug)]
struct AlertCounters {
    raised: Family<AlertLabels, Counter>,
    webhook_deliveries: Family<DeliveryLabels, Counter>,
}

impl AlertCounters {
    fn register(registry: &mut Registry) -> Self {
        Self {
            raised: register(
                registry,
                "alerts_raised",
                "Alerts raised on trials, by rule kind and action (every alert counts once under action event; stop and webhook count those that also did that)",
                None,
                Family::default(),
            ),
            webhook_deliveries: register(
                registry,
                "alert_webhook_deliveries",
                "Alert webhook deliveries that ended, by outcome (delivered, failed after its retries, dropped from the full queue)",
                None,
                Family::default(),
            ),
        }
    }
}

/// What users fetched and stored through the nodes' object servers, per team,
/// as the nodes report it (`NodeMessage::ObjectAccess`).
#[derive(Debug)]
struct ObjectCounters {
    fetches: Family<TeamLabels, Counter>,
    fetched_bytes: Family<TeamLabels, Counter>,
    stores: Family<TeamLabels, Counter>,
    stored_bytes: Family<TeamLabels, Counter>,
    refusals: Family<TeamLabels, Counter>,
}

impl ObjectCounters {
    fn register(registry: &mut Registry) -> Self {
        let family = |registry: &mut Registry, name: &str, help: &str, unit: Option<Unit>| {
            register(registry, name, help, unit, Family::default())
        };
        Self {
            fetches: family(
                registry,
                "object_fetches",
                "Objects users fetched from the nodes' object servers with a capability, by team",
                None,
            ),
            fetched_bytes: family(
                registry,
                "object_fetched",
                "Bytes the nodes' object servers served to users, by team",
                Some(Unit::Bytes),
            ),
            stores: family(
                registry,
                "object_stores",
                "Objects users stored on the nodes' object servers, by team",
                None,
            ),
            stored_bytes: family(
                registry,
                "object_stored",
                "Bytes users stored on the nodes' object servers, by team",
                Some(Unit::Bytes),
            ),
            refusals: family(
                registry,
                "object_refusals",
                "Requests the nodes' object servers refused to a verified capability, by team (each is in the audit trail)",
                None,
            ),
        }
    }

    fn observe(&self, counts: &xp_runtime::protocol::TeamObjectCounts) {
        let team = TeamLabels {
            team: counts.team.clone(),
        };
        let add = |family: &Family<TeamLabels, Counter>, by: u64| {
            if by > 0 {
                family.get_or_create(&team).inc_by(by);
            }
        };
        add(&self.fetches, counts.fetches);
        add(&self.fetched_bytes, counts.fetched_bytes);
        add(&self.stores, counts.stores);
        add(&self.stored_bytes, counts.stored_bytes);
        add(&self.refusals, counts.refusals);
    }
}

impl HeadMetrics {
    /// Every metric registered, at zero.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("xp");
        // 10 µs to about 2.6 s: a pass over a few trials takes microseconds,
        // one over 100,000 waiting trials tens of milliseconds.
        let decision_seconds = register(
            &mut registry,
            "scheduling_decision",
            "Wall time of one call into the head's core that ran a scheduling decision",
            Some(Unit::Seconds),
            Histogram::new(exponential_buckets(1e-5, 4.0, 10)),
        );
        // 1 to 32,768 records: how much one group commit stores.
        let commit_records = register(
            &mut registry,
            "commit_records",
            "Records stored by one commit of the head's database (empty commits not counted)",
            None,
            Histogram::new(exponential_buckets(1.0, 2.0, 16)),
        );
        Self {
            decision_seconds,
            commit_records,
            trials: TrialCounters::register(&mut registry),
            checkpoints: CheckpointCounters::register(&mut registry),
            requests: RequestCounters::register(&mut registry),
            alerts: AlertCounters::register(&mut registry),
            objects: ObjectCounters::register(&mut registry),
            registry,
        }
    }

    /// Counts what the core tallied, once it is stored.
    pub(crate) fn observe(&self, tally: &Tally) {
        for state in &tally.transitions {
            match state {
                TrialState::Placed => {
                    self.trials.starts.inc();
                }
                TrialState::Preempting => {
                    self.trials.preemptions.inc();
                }
                state if state.is_terminal() => {
                    self.trials
                        .finishes
                        .get_or_create(&OutcomeLabels {
                            outcome: state.as_str(),
                        })
                        .inc();
                }
                _ => {}
            }
        }
        for (kind, count) in &tally.attempt_failures {
            self.trials
                .attempt_failures
                .get_or_create(&KindLabels { kind: kind.clone() })
                .inc_by(*count);
        }
        self.trials
            .gpu_memory_evictions
            .inc_by(tally.gpu_memory_evictions);
        self.checkpoints.count.inc_by(tally.checkpoints);
        self.checkpoints.bytes.inc_by(tally.checkpoint_bytes);
        for took in &tally.checkpoint_takes {
            self.checkpoints.take_seconds.observe(took.as_secs_f64());
        }
        for counts in tally.object_access.values() {
            self.objects.observe(counts);
        }
    }

    /// Keeps how many records one commit stored.
    pub(crate) fn committed(&self, records: usize) {
        if records > 0 {
            self.commit_records.observe(records as f64);
        }
    }

    /// Keeps the wall time of one call into the core that ran a policy decision.
    pub(crate) fn decision_took(&self, took: std::time::Duration) {
        self.decision_seconds.observe(took.as_secs_f64());
    }

    /// Counts an alert raised and one action it took.
    pub(crate) fn alert_raised(&self, kind: &'static str, action: &'static str) {
        self.alerts
            .raised
            .get_or_create(&AlertLabels { kind, action })
            .inc();
    }

    /// Counts a webhook delivery that ended with `outcome`.
    pub(crate) fn webhook_delivery(&self, outcome: &'static str) {
        self.alerts
            .webhook_deliveries
            .get_or_create(&DeliveryLabels { outcome })
            .inc();
    }

    /// Counts an authorization refusal; `role` is the caller's role, `node`,
    /// or `unknown` (a revoked credential).
    pub(crate) fn refused(&self, action: &'static str, role: &'static str) {
        self.requests
            .refusals
            .get_or_create(&RefusalLabels { action, role })
            .inc();
    }

    /// Counts a request the actor skipped: its caller had stopped waiting.
    pub(crate) fn abandoned(&self) {
        self.requests.abandoned.inc();
    }

    /// Counts a request served; `error` is its error code when it failed.
    /// `kind` must come from a bounded set (a request kind, a route).
    pub(crate) fn request(&self, api: Api, kind: &str, error: Option<&str>) {
        self.requests
            .served
            .get_or_create(&RequestLabels {
                api: api.as_str(),
                kind: kind.to_owned(),
            })
            .inc();
        if let Some(code) = error {
            self.requests
                .errors
                .get_or_create(&ErrorLabels {
                    api: api.as_str(),
                    kind: kind.to_owned(),
                    code: code.to_owned(),
                })
                .inc();
        }
    }

    /// The whole exposition: the counters and `snapshot`'s gauges, as
    /// OpenMetrics when `openmetrics`, else as Prometheus text.
    pub(crate) fn render(&self, snapshot: &MetricsSnapshot, openmetrics: bool) -> String {
        let mut out = String::new();
        // Writing into a String fails only if an encoder does, which for these
        // metric types it does not; a failure would show as a short page.
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &gauges(snapshot));
        if openmetrics {
            let _ = encode_eof(&mut out);
            out
        } else {
            to_prometheus_text(&out)
        }
    }
}

/// A registry of `snapshot`'s gauges, built for one scrape.
fn gauges(snapshot: &MetricsSnapshot) -> Registry {
    let mut registry = Registry::with_prefix("xp");
    register_trial_gauges(&mut registry, snapshot);
    register_gpu_gauges(&mut registry, snapshot);
    register_node_gauges(&mut registry, snapshot);
    register_gpu_telemetry(&mut registry, snapshot);
    register_store_gauges(&mut registry, snapshot);
    registry
}

/// Trials by queue and state, and those waiting per queue.
fn register_trial_gauges(registry: &mut Registry, snapshot: &MetricsSnapshot) {
    let trials = Family::<QueueStateLabels, Gauge>::default();
    for ((queue, state), count) in &snapshot.trials {
        trials
            .get_or_create(&QueueStateLabels {
                queue: queue.clone(),
                state,
            })
            .set(gauge_value(*count));
    }
    registry.register("trials", "Trials by queue and state", trials);
    let pending = Family::<QueueLabels, Gauge>::default();
    for (queue, count) in &snapshot.pending {
        pending
            .get_or_create(&QueueLabels {
                queue: queue.clone(),
            })
            .set(gauge_value(*count));
    }
    registry.register(
        "queue_pending",
        "Trials waiting to be placed, per queue",
        pending,
    );
}

/// GPUs offered and allocated by node and model.
fn register_gpu_gauges(registry: &mut Registry, snapshot: &MetricsSnapshot) {
    let total = Family::<GpuLabels, Gauge>::default();
    let allocated = Family::<GpuLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    for ((node, model), count) in &snapshot.gpus {
        let labels = GpuLabels {
            node: node.clone(),
            model: model.clone(),
        };
        total.get_or_create(&labels).set(gauge_value(count.total));
        allocated.get_or_create(&labels).set(count.allocated);
    }
    registry.register("gpus", "GPUs nodes offer, by node and model", total);
    registry.register(
        "gpus_allocated",
        "GPUs assigned to live workers, by node and model (fractional shares count as their fraction)",
        allocated,
    );
}

/// GPUs in use by node and model, and each GPU's figures, from the latest
/// telemetry.
fn register_gpu_telemetry(registry: &mut Registry, snapshot: &MetricsSnapshot) {
    let in_use = Family::<GpuLabels, Gauge>::default();
    for ((node, model), count) in &snapshot.gpus_in_use {
        in_use
            .get_or_create(&GpuLabels {
                node: node.clone(),
                model: model.clone(),
            })
            .set(gauge_value(*count));
    }
    registry.register(
        "gpus_in_use",
        "GPUs busier than 5% in their node's latest telemetry, by node and model",
        in_use,
    );
    register_gpu_figures(registry, snapshot);
}

/// Each GPU's utilisation and memory in its node's latest telemetry.
fn register_gpu_figures(registry: &mut Registry, snapshot: &MetricsSnapshot) {
    let util = Family::<GpuIndexLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let memory = Family::<GpuIndexLabels, Gauge>::default();
    for ((node, index), (percent, bytes)) in &snapshot.gpu_figures {
        let labels = GpuIndexLabels {
            node: node.clone(),
            gpu: index.to_string(),
        };
        util.get_or_create(&labels).set(*percent / 100.0);
        memory.get_or_create(&labels).set(gauge_value(*bytes));
    }
    registry.register_with_unit(
        "gpu_utilization",
        "Each GPU's utilisation (0 to 1) in its node's latest telemetry, by node and GPU index",
        Unit::Ratios,
        util,
    );
    registry.register_with_unit(
        "gpu_memory_used",
        "Each GPU's memory in use in its node's latest telemetry, by node and GPU index",
        Unit::Bytes,
        memory,
    );
}

/// Nodes by state.
fn register_node_gauges(registry: &mut Registry, snapshot: &MetricsSnapshot) {
    let nodes = Family::<StateLabels, Gauge>::default();
    for (state, count) in &snapshot.nodes {
        nodes
            .get_or_create(&StateLabels { state })
            .set(gauge_value(*count));
    }
    registry.register("nodes", "Nodes by state", nodes);
}

/// The bytes in each node's object store, by tier.
fn register_store_gauges(registry: &mut Registry, snapshot: &MetricsSnapshot) {
    let store = Family::<TierLabels, Gauge>::default();
    for ((node, tier), bytes) in &snapshot.store_bytes {
        store
            .get_or_create(&TierLabels {
                node: node.clone(),
                tier,
            })
            .set(gauge_value(*bytes));
    }
    registry.register_with_unit(
        "object_store",
        "Bytes in each node's object store, by node and tier (memory, disk)",
        Unit::Bytes,
        store,
    );
}

fn gauge_value(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// OpenMetrics text (without `# EOF`) as Prometheus text format 0.0.4: a
/// counter family's `# HELP` and `# TYPE` lines name it with `_total`, as its
/// samples do, and `# UNIT` lines go (the format has none).
fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let comment = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| line.strip_prefix(prefix).map(|rest| (prefix, rest)));
        if let Some((prefix, rest)) = comment {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            if counters.contains(name) {
                let _ = writeln!(out, "{prefix}{name}_total {tail}");
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use xp_head_core::metrics::GpuCount;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.parse().ok())
    }

    /// Metrics that saw a known tally, decision, refusal and two requests.
    fn observed() -> HeadMetrics {
        let metrics = HeadMetrics::new();
        metrics.observe(&Tally {
            transitions: vec![
                TrialState::Placed,
                TrialState::Running,
                TrialState::Preempting,
                TrialState::Placed,
                TrialState::Succeeded,
                TrialState::Failed,
                TrialState::Succeeded,
            ],
            attempt_failures: BTreeMap::from([("oom-killed".to_owned(), 2)]),
            checkpoints: 2,
            checkpoint_bytes: 30,
            checkpoint_takes: vec![std::time::Duration::from_millis(40)],
            gpu_memory_evictions: 3,
            object_access: BTreeMap::from([(
                "alpha".to_owned(),
                xp_runtime::protocol::TeamObjectCounts {
                    team: "alpha".to_owned(),
                    fetches: 2,
                    fetched_bytes: 300,
                    stores: 1,
                    stored_bytes: 40,
                    refusals: 1,
                },
            )]),
        });
        metrics.decision_took(std::time::Duration::from_micros(50));
        metrics.committed(0);
        metrics.committed(12);
        metrics.refused("cancel", "viewer");
        metrics.request(Api::Http, "/api/nodes", None);
        metrics.request(Api::Quic, "submit", Some("Forbidden"));
        metrics
    }

    /// A known state for the gauges.
    fn snapshot() -> MetricsSnapshot {
        MetricsSnapshot {
            trials: BTreeMap::from([(("default".to_owned(), "succeeded"), 2)]),
            pending: BTreeMap::from([("default".to_owned(), 3)]),
            gpus: BTreeMap::from([(
                ("n1".to_owned(), "H100".to_owned()),
                GpuCount {
                    total: 8,
                    allocated: 2.5,
                },
            )]),
            nodes: BTreeMap::from([("ready", 1)]),
            gpus_in_use: BTreeMap::from([(("n1".to_owned(), "H100".to_owned()), 2)]),
            gpu_figures: BTreeMap::from([(("n1".to_owned(), 3), (50.0, 1 << 30))]),
            store_bytes: BTreeMap::from([(("n1".to_owned(), "disk"), 4096)]),
        }
    }

    #[test]
    fn counts_events_and_renders_both_formats() {
        let metrics = observed();
        let snapshot = snapshot();
        let text = metrics.render(&snapshot, false);
        let expected = [
            ("xp_trial_starts_total", 2.0),
            ("xp_trial_preemptions_total", 1.0),
            ("xp_gpu_memory_evictions_total", 3.0),
            ("xp_trial_finishes_total{outcome=\"succeeded\"}", 2.0),
            ("xp_trial_finishes_total{outcome=\"failed\"}", 1.0),
            (
                "xp_authorization_refusals_total{action=\"cancel\",role=\"viewer\"}",
                1.0,
            ),
            (
                "xp_api_errors_total{api=\"quic\",kind=\"submit\",code=\"Forbidden\"}",
                1.0,
            ),
            ("xp_scheduling_decision_seconds_count", 1.0),
            ("xp_commit_records_count", 1.0),
            ("xp_commit_records_sum", 12.0),
            ("xp_checkpoints_total", 2.0),
            ("xp_attempt_failures_total{kind=\"oom-killed\"}", 2.0),
            ("xp_checkpoint_bytes_total", 30.0),
            ("xp_checkpoint_take_seconds_count", 1.0),
            ("xp_object_fetches_total{team=\"alpha\"}", 2.0),
            ("xp_object_fetched_bytes_total{team=\"alpha\"}", 300.0),
            ("xp_object_stores_total{team=\"alpha\"}", 1.0),
            ("xp_object_stored_bytes_total{team=\"alpha\"}", 40.0),
            ("xp_object_refusals_total{team=\"alpha\"}", 1.0),
            ("xp_gpus_in_use{node=\"n1\",model=\"H100\"}", 2.0),
            ("xp_gpu_utilization_ratios{node=\"n1\",gpu=\"3\"}", 0.5),
            (
                "xp_gpu_memory_used_bytes{node=\"n1\",gpu=\"3\"}",
                f64::from(1u32 << 30),
            ),
            ("xp_object_store_bytes{node=\"n1\",tier=\"disk\"}", 4096.0),
            ("xp_trials{queue=\"default\",state=\"succeeded\"}", 2.0),
            ("xp_queue_pending{queue=\"default\"}", 3.0),
            ("xp_gpus_allocated{node=\"n1\",model=\"H100\"}", 2.5),
            ("xp_nodes{state=\"ready\"}", 1.0),
        ];
        for (name, value) in expected {
            assert_eq!(sample(&text, name), Some(value), "{name}");
        }
        // Prometheus text: counter families are named as their samples are.
        assert!(text.contains("# TYPE xp_trial_starts_total counter\n"));
        assert!(text.contains("# HELP xp_trial_starts_total "));
        assert!(!text.contains("# UNIT") && !text.contains("# EOF"));

        let open = metrics.render(&snapshot, true);
        assert!(open.contains("# TYPE xp_trial_starts counter\n"));
        assert!(open.contains("# UNIT xp_scheduling_decision_seconds seconds\n"));
        assert!(open.ends_with("# EOF\n"));
    }
}
