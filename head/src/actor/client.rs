//! The actor's side of a client request: authorize it against the user
//! table and the core, serve it through the core's request table
//! (`xp_head_core::requests`), read what it needs of the stored history, and
//! answer once a change is stored.
//!
//! Not here: the request's rules (its file in `xp_head_core::requests`) and
//! the work that needs the connection or a node (the server's).

use ractor::ActorRef;
use tracing::error;
use xp_head_core::auth::access::{Access, Caller};
use xp_head_core::pages;
use xp_head_core::requests::{self, ConnectionWork, Served, StoredRead};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{
    ErrorCode, MetricPoint, MetricsPage, RemoteError, Request, Response, TrialTelemetry,
};

use super::report::give_back_freed_memory;
use super::{HeadMsg, HeadState, Reply};
use crate::registry::{HistoryReads, RegistryError};

/// A client's request as the server hands it to the actor.
#[derive(Debug)]
pub(crate) struct Asked {
    /// Who the connection authenticated as.
    pub caller: Caller,
    /// What the request does and names (`requests::access`).
    pub access: Access,
    /// The connection's driver session, when the request names one.
    pub session: Option<String>,
    /// The request.
    pub request: Request,
    /// Where the answer goes.
    pub reply: Reply<Answer>,
}

/// What the actor answers a request with.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The response.
    Response(Response),
    /// Work the server does on the connection or with a node.
    Connection(ConnectionWork),
}

impl HeadState {
    /// Authorizes and serves one request. A change is answered with its batch,
    /// once stored; a read at once.
    pub(super) fn serve_request(
        &mut self,
        now: UnixMillis,
        myself: &ActorRef<HeadMsg>,
        asked: Asked,
    ) {
        let Asked {
            caller,
            access,
            session,
            request,
            reply,
        } = asked;
        if let Err(refusal) = requests::admit(&request, &access) {
            let _ = reply.send(Err(refusal.into()));
            return;
        }
        let asker = match self.authorize(now, &caller, &access) {
            Ok(asker) => asker,
            Err(refusal) => {
                let _ = reply.send(Err(refusal));
                return;
            }
        };
        if requests::changes(&request) {
            self.change(now, myself, reply, |core| {
                let served = core.serve(now, &asker, session.as_deref(), request);
                served.map_err(RemoteError::from).and_then(change_answer)
            });
            return;
        }
        // A read may take tens of milliseconds: the worker thread hands its
        // other tasks to another meanwhile.
        let served = tokio::task::block_in_place(|| {
            self.core_call(|core| core.serve(now, &asker, session.as_deref(), request))
        });
        let answer = match served {
            Ok(Served::Answer(response)) => Ok(Answer::Response(response)),
            Ok(Served::Stored(read)) => return self.read_stored(now, myself, read, reply),
            Ok(Served::Connection(work)) => Ok(Answer::Connection(work)),
            Ok(Served::Status(pending)) => {
                // A page of 5,000 trials' statuses, and a front that walks
                // every trial of its experiment, are made off the actor.
                return self.statuses.answer("the status answer", reply, move || {
                    let answer = pending.complete();
                    give_back_freed_memory();
                    Ok(Answer::Response(answer))
                });
            }
            Err(error) => Err(error.into()),
        };
        let _ = reply.send(answer);
    }

    /// A read of the stored history a request needs, answered on `reply`
    /// off the actor (a report once it is computed off the actor).
    fn read_stored(
        &mut self,
        now: UnixMillis,
        myself: &ActorRef<HeadMsg>,
        read: StoredRead,
        reply: Reply<Answer>,
    ) {
        let respond = |response: Result<Response, RemoteError>| response.map(Answer::Response);
        match read {
            StoredRead::Events {
                experiment,
                after,
                wait_ms,
            } => {
                // Taken before the read: a commit between the two wakes the
                // waiter at once instead of being missed.
                let newest = self.args.registry.committed_event_seq();
                self.read_history("events", reply, move |reader| {
                    read_events(reader, experiment, after, wait_ms, newest)
                });
            }
            StoredRead::TrialEvents { trial, limit } => {
                self.read_history("events", reply, move |reader| {
                    respond(trial_events(reader, trial, limit))
                });
            }
            StoredRead::MetricHistory {
                trial,
                after,
                limit,
            } => self.read_history("metric history", reply, move |reader| {
                respond(metric_history(reader, trial, after, limit).map(Response::Metrics))
            }),
            StoredRead::Telemetry(trial) => self.read_history("telemetry", reply, move |reader| {
                respond(telemetry_of(reader, trial).map(Response::Telemetry))
            }),
            StoredRead::Audit { limit } => {
                self.read_history("its audit trail", reply, move |reader| {
                    let trail = reader
                        .audit(limit as usize)
                        .map_err(|error| stored_read_error(error, "its audit trail"));
                    respond(trail.map(Response::Audit))
                })
            }
            StoredRead::Report { request, visible } => {
                let answered = move |report: Result<Response, RemoteError>| {
                    let _ = reply.send(report.map(Answer::Response));
                };
                self.report_cached(now, myself, &request, &visible, Box::new(answered));
            }
        }
    }
}

/// An experiment's stored events after `after`; none and `wait_ms` > 0: the
/// server waits for the next commit of an event after `newest`
/// ([`ConnectionWork::AwaitEvents`]).
fn read_events(
    reader: &dyn HistoryReads,
    experiment: ExperimentId,
    after: u64,
    wait_ms: u32,
    newest: u64,
) -> Result<Answer, RemoteError> {
    let events = reader
        .events_after(experiment, after, requests::MAX_EVENTS_PER_ANSWER)
        .map_err(|error| stored_read_error(error, "events"))?;
    if events.is_empty() && wait_ms > 0 {
        return Ok(Answer::Connection(ConnectionWork::AwaitEvents {
            experiment,
            after,
            wait_ms,
            newest,
        }));
    }
    Ok(Answer::Response(Response::Events(events)))
}

/// A trial's newest `limit` events, oldest first.
fn trial_events(
    reader: &dyn HistoryReads,
    trial: TrialId,
    limit: usize,
) -> Result<Response, RemoteError> {
    let mut events = reader
        .newest_events_of_trial(trial, limit)
        .map_err(|error| stored_read_error(error, "events"))?;
    events.reverse();
    Ok(Response::Events(events))
}

/// A page of a trial's metric history: at most `limit` reports after
/// `after`, and about [`pages::MAX_PAGE_BYTES`] of them.
fn metric_history(
    reader: &dyn HistoryReads,
    trial: TrialId,
    after: Option<u64>,
    limit: usize,
) -> Result<MetricsPage, RemoteError> {
    let page = reader
        .metrics_page(trial, after, limit, pages::MAX_PAGE_BYTES)
        .map_err(|error| stored_read_error(error, "metric history"))?;
    let next = page
        .more
        .then(|| page.records.last().map(|(seq, _)| *seq))
        .flatten();
    Ok(MetricsPage {
        points: page
            .records
            .into_iter()
            .map(|(_, record)| MetricPoint::from(record))
            .collect(),
        next,
        total: page.total,
    })
}

/// A trial's stored telemetry series, per rank.
pub(super) fn telemetry_of(
    reader: &dyn HistoryReads,
    trial: TrialId,
) -> Result<TrialTelemetry, RemoteError> {
    let workers = reader
        .telemetry_of(trial)
        .map_err(|error| stored_read_error(error, "telemetry"))?;
    Ok(TrialTelemetry { trial, workers })
}

/// The answer to a change: the core answers changes itself, so work for the
/// shell here is a bug, answered as one rather than panicking the actor.
fn change_answer(served: Served) -> Result<Answer, RemoteError> {
    match served {
        Served::Answer(response) => Ok(Answer::Response(response)),
        other => {
            error!(?other, "a change asked the shell for work; refused");
            Err(RemoteError::new(
                ErrorCode::Internal,
                "the head could not serve this change",
            ))
        }
    }
}

/// The answer to a read of the database that failed: retryable while the
/// database is closed after a failed write.
pub(super) fn stored_read_error(error: RegistryError, what: &str) -> RemoteError {
    match error {
        RegistryError::Closed => RemoteError::new(
            ErrorCode::StorageUnavailable,
            format!(
                "the head cannot read {what} now: its database is closed after a failed write; retry later"
            ),
        ),
        error => RemoteError::new(ErrorCode::Internal, error.to_string()),
    }
}
