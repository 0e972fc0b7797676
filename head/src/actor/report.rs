//! The actor's side of `xp report`: the core's figures, plus busy GPU-time
//! from the telemetry the registry keeps (read here, since the core does no
//! I/O), for the trials of the scope that held GPUs.
//!
//! A team's or the cluster's report walks every trial of its scope and reads
//! up to [`MAX_TELEMETRY_TRIALS`] telemetry ranges inside the actor (the
//! core's state and the registry's one database handle live here; copying
//! the spans out would cost about what computing them does). So that viewers
//! cannot stall the head with it, [`ReportCache`] answers a repeated request
//! from a report at most [`FRESH_MS`] old, and bounds the actor time spent
//! computing reports to [`BUDGET_MS`] per [`BUDGET_WINDOW_MS`]: beyond it a
//! request is refused as retryable (`TooManyPending`, with when to retry).

use std::collections::VecDeque;
use tokio::time::Instant;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{RemoteError, ReportRequest, Response, WorkerTelemetry};
use xp_runtime::report::UsageReport;
use xp_tune::report::{Window, busy_gpu_hours, utilization};

use super::HeadState;
use xp_head_core::ReportScope;
use xp_head_core::auth::Visibility;

/// Beyond this many GPU trials in scope, busy GPU-time is not read (one
/// registry range per trial): the report says `null` rather than stall the
/// actor.
const MAX_TELEMETRY_TRIALS: usize = 2_000;

/// How long a computed report answers the same request again.
pub(super) const FRESH_MS: u64 = 5_000;
/// The window over which report computations are budgeted.
pub(super) const BUDGET_WINDOW_MS: u64 = 10_000;
/// The actor time report computations may take per window (a tenth).
pub(super) const BUDGET_MS: u64 = 1_000;
/// The most reports kept.
const MAX_CACHED: usize = 32;

/// Recent reports by (scope, `since`), and how long recent computations took.
/// Pure but for [`ReportCache::now`]: times are milliseconds of a monotonic
/// clock, passed in.
#[derive(Debug)]
pub(crate) struct ReportCache {
    epoch: Instant,
    reports: VecDeque<(ReportScope, Option<u64>, u64, UsageReport)>,
    /// (when it ended, how long it took) of each computation in the window.
    spent: VecDeque<(u64, u64)>,
}

impl ReportCache {
    pub(super) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            reports: VecDeque::new(),
            spent: VecDeque::new(),
        }
    }

    /// Milliseconds since this cache was made (monotonic).
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A report of `scope` over `since` computed less than [`FRESH_MS`] before `now`.
    fn fresh(&self, scope: &ReportScope, since: Option<u64>, now: u64) -> Option<&UsageReport> {
        self.reports
            .iter()
            .rev()
            .find(|(kept, kept_since, at, _)| {
                kept == scope && *kept_since == since && now.saturating_sub(*at) < FRESH_MS
            })
            .map(|(.., report)| report)
    }

    /// Whether a computation may start at `now`; else how many ms to wait.
    fn admit(&mut self, now: u64) -> Result<(), u64> {
        while self
            .spent
            .front()
            .is_some_and(|(ended, _)| now.saturating_sub(*ended) >= BUDGET_WINDOW_MS)
        {
            self.spent.pop_front();
        }
        let used: u64 = self.spent.iter().map(|(_, took)| *took).sum();
        if used < BUDGET_MS {
            return Ok(());
        }
        // Until the oldest computation leaves the window (at least a second).
        let oldest = self.spent.front().map_or(now, |(ended, _)| *ended);
        Err((oldest + BUDGET_WINDOW_MS).saturating_sub(now).max(1_000))
    }

    /// Keeps a report computed by `now` that took `took` ms.
    fn record(
        &mut self,
        scope: ReportScope,
        since: Option<u64>,
        now: u64,
        took: u64,
        report: UsageReport,
    ) {
        self.spent.push_back((now, took));
        self.reports
            .retain(|(kept, kept_since, _, _)| !(*kept == scope && *kept_since == since));
        if self.reports.len() >= MAX_CACHED {
            self.reports.pop_front();
        }
        self.reports.push_back((scope, since, now, report));
    }
}

impl HeadState {
    /// The report `request` asks for, as `visible` may see it: a fresh one
    /// kept for the same scope, else one computed when the budget allows.
    pub(super) fn report_cached(
        &mut self,
        now: UnixMillis,
        request: &ReportRequest,
        visible: &Visibility,
    ) -> Result<Response, RemoteError> {
        // Authorization first: a kept report is only shown to who may see it.
        let scope = self.args.core.report_scope(request, visible)?;
        let clock = self.reports.now();
        if let Some(report) = self.reports.fresh(&scope, request.since_ms, clock) {
            return Ok(Response::Report(Box::new(report.clone())));
        }
        if let Err(wait_ms) = self.reports.admit(clock) {
            return Err(RemoteError::retry_later(
                "the head is busy computing other reports; retry shortly",
                wait_ms,
            ));
        }
        let started = Instant::now();
        let report = self.report(now, &scope, request.since_ms)?;
        let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let ended = self.reports.now();
        self.reports
            .record(scope, request.since_ms, ended, took, report.clone());
        Ok(Response::Report(Box::new(report)))
    }

    /// Computes the report of `scope` over `since_ms` at `now`.
    fn report(
        &self,
        now: UnixMillis,
        scope: &ReportScope,
        since_ms: Option<u64>,
    ) -> Result<UsageReport, RemoteError> {
        let core = &self.args.core;
        let mut report = core.report(now, scope, since_ms)?;
        let trials = core.report_gpu_trials(scope);
        if !trials.is_empty() && trials.len() <= MAX_TELEMETRY_TRIALS {
            let telemetry: Vec<(TrialId, Vec<WorkerTelemetry>)> =
                tokio::task::block_in_place(|| {
                    trials
                        .iter()
                        .filter_map(|trial| {
                            // An unreadable store (an outage) leaves busy time unknown.
                            self.args
                                .registry
                                .telemetry_of(*trial)
                                .ok()
                                .map(|workers| (*trial, workers))
                        })
                        .collect()
                });
            let window = Window {
                start: report.window_start,
                end: report.window_end,
            };
            report.busy_gpu_hours = busy_gpu_hours(&core.busy_spans(&telemetry), window);
            report.busy_utilization = report
                .busy_gpu_hours
                .and_then(|busy| utilization(busy, report.available_gpu_hours));
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team(name: &str) -> ReportScope {
        ReportScope::Team(name.to_owned())
    }

    fn named(scope: &str) -> UsageReport {
        UsageReport {
            scope: scope.to_owned(),
            ..UsageReport::default()
        }
    }

    #[test]
    fn a_report_answers_the_same_request_while_fresh() {
        let mut cache = ReportCache::new();
        cache.record(team("a"), None, 1_000, 5, named("team a"));
        let fresh = |cache: &ReportCache, scope: &ReportScope, since, now| {
            cache
                .fresh(scope, since, now)
                .map(|report| report.scope.clone())
        };
        assert_eq!(
            fresh(&cache, &team("a"), None, 1_000 + FRESH_MS - 1).as_deref(),
            Some("team a")
        );
        assert_eq!(fresh(&cache, &team("a"), None, 1_000 + FRESH_MS), None);
        assert_eq!(fresh(&cache, &team("a"), Some(60_000), 1_001), None);
        assert_eq!(fresh(&cache, &team("b"), None, 1_001), None);
        assert_eq!(fresh(&cache, &ReportScope::Cluster, None, 1_001), None);
        // A newer computation replaces the older one.
        cache.record(team("a"), None, 2_000, 5, named("team a, later"));
        assert_eq!(
            fresh(&cache, &team("a"), None, 2_001).as_deref(),
            Some("team a, later")
        );
        // Bounded.
        for index in 0..100 {
            cache.record(team(&index.to_string()), None, 3_000, 0, named("x"));
        }
        assert_eq!(cache.reports.len(), MAX_CACHED);
    }

    #[test]
    fn computations_past_the_budget_are_refused_until_it_frees() {
        let mut cache = ReportCache::new();
        assert_eq!(cache.admit(0), Ok(()));
        cache.record(team("a"), None, 100, BUDGET_MS / 2, named("a"));
        assert_eq!(cache.admit(200), Ok(()));
        cache.record(team("b"), None, 300, BUDGET_MS / 2, named("b"));
        // The budget is spent: wait until the first leaves the window.
        assert_eq!(cache.admit(400), Err(100 + BUDGET_WINDOW_MS - 400));
        assert!(cache.admit(100 + BUDGET_WINDOW_MS - 1).is_err());
        assert_eq!(cache.admit(100 + BUDGET_WINDOW_MS), Ok(()));
        // One computation longer than the whole budget: its window, at least a second.
        let mut slow = ReportCache::new();
        slow.record(ReportScope::Cluster, None, 0, 50 * BUDGET_MS, named("c"));
        assert_eq!(slow.admit(BUDGET_WINDOW_MS - 1), Err(1_000));
        assert_eq!(slow.admit(BUDGET_WINDOW_MS), Ok(()));
    }
}
