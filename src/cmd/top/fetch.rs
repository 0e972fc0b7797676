//! The fetcher task of `xp top`: about once a second it takes the head's cheap
//! views (nodes, queues, experiments with their trials' latest metrics) and the
//! new events of running experiments, and follows the open log.
//!
//! It never fetches metric histories: a trial's latest values come with its
//! status. Events are asked with no wait (one request per running experiment
//! and round), from a cursor per experiment, so each arrives once. A failed
//! round is reported and the next one tried; only the shell going away or the
//! cancel token ends the task.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use xp::Client;
use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::ExperimentState;

use super::state::{EventRow, Snapshot, is_notable};

/// How often the views are taken.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// The most log bytes read in one round, so a long log catches up over a few
/// rounds instead of holding up the views.
const LOG_BYTES_PER_ROUND: usize = 4 << 20;

/// What the fetcher hands the shell.
#[derive(Debug)]
pub(crate) enum Update {
    Snapshot(Snapshot),
    FetchError(String),
    LogChunk {
        trial: TrialId,
        data: Vec<u8>,
        complete: bool,
    },
    LogError {
        trial: TrialId,
        error: String,
    },
}

/// The log being followed and where the next read starts.
struct LogCursor {
    trial: TrialId,
    offset: u64,
    complete: bool,
}

/// Runs until `cancel` fires or the shell drops its receivers; closes `client`.
pub(crate) async fn run(
    client: Client,
    updates: mpsc::Sender<Update>,
    mut log_wanted: watch::Receiver<Option<TrialId>>,
    cancel: CancellationToken,
) {
    let mut event_cursors: BTreeMap<ExperimentId, u64> = BTreeMap::new();
    let mut log_cursor: Option<LogCursor> = None;
    loop {
        let update = match fetch_snapshot(&client, &mut event_cursors).await {
            Ok(snapshot) => Update::Snapshot(snapshot),
            Err(error) => Update::FetchError(format!("{error:#}")),
        };
        if updates.send(update).await.is_err() {
            break;
        }
        let wanted = *log_wanted.borrow_and_update();
        if !follow_log(&client, wanted, &mut log_cursor, &updates).await {
            break;
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(POLL_EVERY) => {}
            changed = log_wanted.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    client.close().await;
}

/// One round of views, with the notable events since the last round.
async fn fetch_snapshot(
    client: &Client,
    event_cursors: &mut BTreeMap<ExperimentId, u64>,
) -> anyhow::Result<Snapshot> {
    use anyhow::Context;
    let nodes = client.nodes().await.context("cannot list the nodes")?;
    let queues = client.queues().await.context("cannot list the queues")?;
    let experiments = client
        .status(None)
        .await
        .context("cannot list the experiments")?;
    let mut new_events = Vec::new();
    for experiment in &experiments {
        let running = experiment.state == ExperimentState::Running;
        // A finished experiment is asked once more, for the events of its end.
        let after = match event_cursors.get(&experiment.id) {
            Some(after) => *after,
            None if running => 0,
            None => continue,
        };
        let events = client
            .events(experiment.id, after, Duration::ZERO)
            .await
            .with_context(|| format!("cannot read the events of experiment {}", experiment.id))?;
        let cursor = events.iter().map(|event| event.seq).fold(after, u64::max);
        if running {
            event_cursors.insert(experiment.id, cursor);
        } else {
            event_cursors.remove(&experiment.id);
        }
        new_events.extend(events.into_iter().filter(is_notable).map(|event| EventRow {
            event,
            team: experiment.team.clone(),
        }));
    }
    event_cursors.retain(|id, _| experiments.iter().any(|experiment| experiment.id == *id));
    new_events.sort_by_key(|row| row.event.seq);
    Ok(Snapshot::from_views(
        SystemClock.now(),
        nodes,
        queues,
        &experiments,
        new_events,
    ))
}

/// Reads what is new in the wanted log (from its start when it changed).
/// Returns `false` when the shell has gone away.
async fn follow_log(
    client: &Client,
    wanted: Option<TrialId>,
    log_cursor: &mut Option<LogCursor>,
    updates: &mpsc::Sender<Update>,
) -> bool {
    let Some(trial) = wanted else {
        *log_cursor = None;
        return true;
    };
    let cursor = match log_cursor {
        Some(cursor) if cursor.trial == trial => cursor,
        _ => log_cursor.insert(LogCursor {
            trial,
            offset: 0,
            complete: false,
        }),
    };
    if cursor.complete {
        return true;
    }
    let mut read = 0;
    while read < LOG_BYTES_PER_ROUND {
        let update = match client.logs(trial, 0, None, cursor.offset).await {
            Ok(chunk) => {
                read += chunk.data.len();
                cursor.offset = chunk.next_offset;
                let done = chunk.data.is_empty();
                cursor.complete = done && chunk.complete;
                let update = Update::LogChunk {
                    trial,
                    data: chunk.data,
                    complete: cursor.complete,
                };
                if done {
                    return updates.send(update).await.is_ok();
                }
                update
            }
            Err(error) => {
                let error = format!("{:#}", anyhow::Error::from(error));
                return updates
                    .send(Update::LogError { trial, error })
                    .await
                    .is_ok();
            }
        };
        if updates.send(update).await.is_err() {
            return false;
        }
    }
    true
}
