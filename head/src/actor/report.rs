//! The actor's side of `xp report`: the core's figures, plus busy GPU-time
//! from the telemetry the registry keeps (read here, since the core does no
//! I/O), for the trials of the scope that held GPUs.
//!
//! A team's or the cluster's report walks every trial of its scope (a
//! million, 0.6-0.8 s of CPU here). It runs on a blocking thread, on a
//! [`ReportSnapshot`] the actor takes whatever the number of trials (the
//! book's and the nodes' maps are persistent), so it never
//! holds up a scheduling decision for long; the result
//! comes back to the actor ([`ComputedReport`]) with busy GPU-time read,
//! there too, from up to [`MAX_TELEMETRY_TRIALS`] telemetry ranges, and the
//! actor keeps the report and answers everyone who asked for it meanwhile. So that viewers cannot take the head's CPU with it,
//! [`ReportCache`] answers a repeated request from a report at most
//! [`FRESH_MS`] old, computes at most [`MAX_COMPUTING`] at once, and bounds
//! the time spent computing reports to [`BUDGET_MS`] per
//! [`BUDGET_WINDOW_MS`]: beyond these a request is refused as retryable
//! (`TooManyPending`, with when to retry).

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;

use ractor::ActorRef;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, error};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{ErrorCode, RemoteError, ReportRequest, Response, WorkerTelemetry};
use xp_runtime::report::UsageReport;

use super::{HeadMsg, HeadState};
use crate::registry::HistoryReader;
use xp_head_core::auth::Visibility;
use xp_head_core::{ReportScope, ReportSnapshot};

/// Beyond this many GPU trials in scope, busy GPU-time is not read (one
/// registry range per trial): the report says `null` rather than take the
/// store's reads for long.
const MAX_TELEMETRY_TRIALS: usize = 2_000;

/// How long a computed report answers the same request again.
pub(super) const FRESH_MS: u64 = 5_000;
/// The window over which report computations are budgeted.
pub(super) const BUDGET_WINDOW_MS: u64 = 10_000;
/// The time report computations may take per window (a tenth of a core).
pub(super) const BUDGET_MS: u64 = 1_000;
/// The most reports computed at once (each on a blocking thread).
const MAX_COMPUTING: usize = 2;
/// The most reports kept.
const MAX_CACHED: usize = 32;

/// A report request's key: its scope and window.
type ReportKey = (ReportScope, Option<u64>);

/// Where a report's answer goes.
pub(super) type ReportReply = Box<dyn FnOnce(Result<Response, RemoteError>) + Send>;

/// A report being computed off the actor, and who waits for it.
struct Computing {
    /// The blocking thread's task (it sends [`HeadMsg::ReportComputed`]).
    _task: JoinHandle<()>,
    waiting: Vec<ReportReply>,
}

/// A report computed off the actor, back for its busy time and its waiters.
#[derive(Debug)]
pub(crate) struct ComputedReport {
    key: ReportKey,
    /// The report; or why the computation failed (a panic, answered to the
    /// waiters as an error).
    outcome: Result<UsageReport, String>,
    took_ms: u64,
}

/// Recent reports by (scope, `since`), those being computed, and how long
/// recent computations took. Pure but for [`ReportCache::now`]: times are
/// milliseconds of a monotonic clock, passed in.
pub(crate) struct ReportCache {
    epoch: Instant,
    reports: VecDeque<(ReportScope, Option<u64>, u64, UsageReport)>,
    /// (when it ended, how long it took) of each computation in the window.
    spent: VecDeque<(u64, u64)>,
    computing: HashMap<ReportKey, Computing>,
}

impl ReportCache {
    pub(super) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            reports: VecDeque::new(),
            spent: VecDeque::new(),
            computing: HashMap::new(),
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
        if self.computing.len() >= MAX_COMPUTING {
            // About what one report of many trials takes.
            return Err(1_000);
        }
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
    /// Answers the report `request` asks for, as `visible` may see it: from a
    /// fresh one kept for the same scope, else once one computed off the
    /// actor comes back (see the module's comment).
    pub(super) fn report_cached(
        &mut self,
        now: UnixMillis,
        myself: &ActorRef<HeadMsg>,
        request: &ReportRequest,
        visible: &Visibility,
        reply: ReportReply,
    ) {
        // Authorization first: a kept report is only shown to who may see it.
        let scope = match self.args.core.report_scope(request, visible) {
            Ok(scope) => scope,
            Err(refused) => return reply(Err(refused.into())),
        };
        let clock = self.reports.now();
        if let Some(report) = self.reports.fresh(&scope, request.since_ms, clock) {
            return reply(Ok(Response::Report(Box::new(report.clone()))));
        }
        let key = (scope, request.since_ms);
        if let Some(computing) = self.reports.computing.get_mut(&key) {
            computing.waiting.push(reply);
            return;
        }
        if let Err(wait_ms) = self.reports.admit(clock) {
            return reply(Err(RemoteError::retry_later(
                "the head is busy computing other reports; retry shortly",
                wait_ms,
            )));
        }
        let snapshot = match self.args.core.report_snapshot(now, &key.0, key.1) {
            Ok(snapshot) => snapshot,
            Err(error) => return reply(Err(error.into())),
        };
        let reader = self.args.registry.reader();
        let task = compute_off_actor(myself.clone(), key.clone(), snapshot, reader);
        self.reports.computing.insert(
            key,
            Computing {
                _task: task,
                waiting: vec![reply],
            },
        );
    }

    /// A report computed off the actor: busy time from the stored telemetry
    /// of its GPU trials (up to [`MAX_TELEMETRY_TRIALS`]), kept, answered.
    pub(super) fn report_computed(&mut self, computed: ComputedReport) {
        let ComputedReport {
            key,
            outcome,
            took_ms,
        } = computed;
        let waiting = self
            .reports
            .computing
            .remove(&key)
            .map(|computing| computing.waiting)
            .unwrap_or_default();
        let report = match outcome {
            Ok(report) => report,
            Err(why) => {
                error!(scope = ?key.0, %why, "a report's computation failed");
                for reply in waiting {
                    reply(Err(RemoteError::new(
                        ErrorCode::Internal,
                        format!("the report could not be computed: {why}"),
                    )));
                }
                return;
            }
        };
        debug!(scope = ?key.0, took_ms, "report computed");
        let ended = self.reports.now();
        self.reports
            .record(key.0, key.1, ended, took_ms, report.clone());
        for reply in waiting {
            reply(Ok(Response::Report(Box::new(report.clone()))));
        }
    }
}

/// Returns to the system the memory a computation off the actor (a
/// report's spans, a front's candidates) took and gave back: a
/// blocking thread's malloc arena (glibc's) keeps its freed pages, so each
/// report on a new thread left tens of megabytes (a million trials' head
/// went from 945 to 1,020 MiB over reports, and stayed there).
pub(super) fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim(3) only releases free memory; it takes no pointer.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Computes `snapshot`'s report on a blocking thread, with busy GPU-time
/// from the telemetry `reader` holds of its GPU trials (up to
/// [`MAX_TELEMETRY_TRIALS`]), and sends it to the actor.
fn compute_off_actor(
    head: ActorRef<HeadMsg>,
    key: ReportKey,
    snapshot: ReportSnapshot,
    reader: HistoryReader,
) -> JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        // A panic must still come back: its waiters are answered and its
        // place among the reports computed at once is freed.
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut report = snapshot.report();
            let gpu_trials = snapshot.gpu_trials();
            if !gpu_trials.is_empty() && gpu_trials.len() <= MAX_TELEMETRY_TRIALS {
                // An unreadable store (an outage) leaves busy time unknown.
                let telemetry: Vec<(TrialId, Vec<WorkerTelemetry>)> = gpu_trials
                    .iter()
                    .filter_map(|trial| {
                        let workers = reader.telemetry_of(*trial).ok()?;
                        Some((*trial, workers))
                    })
                    .collect();
                snapshot.add_busy_time(&mut report, &telemetry);
            }
            report
        }))
        .map_err(|panic| {
            panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "it panicked".to_owned())
        });
        let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        give_back_freed_memory();
        // A stopped actor drops its waiters' replies, which tells them.
        let computed = ComputedReport {
            key,
            outcome,
            took_ms,
        };
        let _ = head.cast(HeadMsg::ReportComputed(Box::new(computed)));
    })
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
