//! One `xp tune` evaluation: the command started with its parameters in the
//! environment, its stdout read for `XP_METRIC` lines and its last line, and its
//! stop (SIGTERM to its process group, then SIGKILL after [`STOP_GRACE`]).
//!
//! Not here: what the values mean (the tuner's), or which evaluation runs when.

use std::process::Stdio;
use std::sync::Arc;

use tokio::io::BufReader;
use tokio::process::{Child, ChildStdout};
use tokio::sync::{mpsc, oneshot};
use xp_runtime::metric_line::{MAX_METRIC_LINE, parse_metric_line, read_bounded_line};
use xp_runtime::spec::Config;

use super::TuneError;

/// How long a stopped evaluation has between SIGTERM and SIGKILL.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// What an evaluation's task reports to the tuner.
pub(super) enum EvalEvent {
    /// An intermediate `XP_METRIC` value (its `value` key, finite).
    Metric { i: u32, step: u64, value: f64 },
    /// The evaluation ended.
    Done(Ended),
}

/// How one evaluation ended.
pub(super) struct Ended {
    pub(super) i: u32,
    /// The last stdout line that was not a metric line.
    pub(super) last_line: Option<String>,
    /// The last value of each objective's metric, for a multi-objective run.
    pub(super) named: Vec<Option<f64>>,
    pub(super) status: Option<i32>,
    /// Whether it was stopped.
    pub(super) stopped: bool,
}

fn env_name(param: &str) -> String {
    format!("XP_PARAM_{}", param.to_ascii_uppercase())
}

/// Starts evaluation `i` of `config`: the command in its own process group,
/// with `XP_CONFIG`, `XP_TRIAL_ID` and one `XP_PARAM_<NAME>` per parameter.
pub(super) fn spawn_command(
    program: &str,
    args: &[String],
    i: u32,
    config: &Config,
) -> Result<Child, TuneError> {
    let config_json = serde_json::to_string(config).expect("configs serialise");
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env("XP_CONFIG", &config_json)
        .env("XP_TRIAL_ID", format!("tune-{i}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        // Its own process group, so a stop reaches the script and its children.
        .process_group(0);
    for (name, value) in config {
        command.env(env_name(name), value.to_string());
    }
    command.spawn().map_err(|source| TuneError::Spawn {
        program: program.to_owned(),
        source,
    })
}

/// Runs evaluation `i` to its end: reads its output, stops it when `stop`
/// fires, kills what it left behind, and reports [`EvalEvent::Done`].
pub(super) async fn evaluate(
    i: u32,
    mut child: Child,
    stop: oneshot::Receiver<()>,
    events: mpsc::UnboundedSender<EvalEvent>,
    names: Arc<Vec<String>>,
) {
    let stdout = child.stdout.take().expect("stdout is piped");
    let reader =
        xp_runtime::task::spawn("tune-stdout", read_output(stdout, i, names, events.clone()));
    let group = child.id().map(|pid| nix::unistd::Pid::from_raw(pid as i32));
    let signal_group = |signal| {
        if let Some(group) = group {
            let _ = nix::sys::signal::killpg(group, signal);
        }
    };
    let mut stopped = false;
    let status = tokio::select! {
        status = child.wait() => status.ok(),
        _ = stop => {
            stopped = true;
            signal_group(nix::sys::signal::Signal::SIGTERM);
            match tokio::time::timeout(STOP_GRACE, child.wait()).await {
                Ok(status) => status.ok(),
                Err(_) => {
                    signal_group(nix::sys::signal::Signal::SIGKILL);
                    child.wait().await.ok()
                }
            }
        }
    };
    // Whatever the command left behind goes too, and its output is read for a bounded time.
    signal_group(nix::sys::signal::Signal::SIGKILL);
    let (last_line, named) = tokio::time::timeout(STOP_GRACE, reader)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let _ = events.send(EvalEvent::Done(Ended {
        i,
        last_line,
        named,
        status: status.and_then(|status| status.code()),
        stopped,
    }));
}

/// Reads evaluation `i`'s stdout to its end, sending each finite `value` of a
/// metric line with a step; returns the last other non-empty line and the last
/// value of each of `names`.
async fn read_output(
    stdout: ChildStdout,
    i: u32,
    names: Arc<Vec<String>>,
    metrics: mpsc::UnboundedSender<EvalEvent>,
) -> (Option<String>, Vec<Option<f64>>) {
    let mut reader = BufReader::new(stdout);
    let mut buffer = Vec::with_capacity(256);
    let mut last = None;
    // The last value of each objective's metric (multi-objective runs).
    let mut named: Vec<Option<f64>> = vec![None; names.len()];
    while let Ok(read) = read_bounded_line(&mut reader, &mut buffer, MAX_METRIC_LINE).await {
        if read == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buffer).trim_end().to_owned();
        if let Ok(Some(report)) = parse_metric_line(&line) {
            for (slot, name) in named.iter_mut().zip(names.iter()) {
                if let Some(value) = report.values.get(name) {
                    *slot = Some(*value);
                }
            }
            // A NaN or infinite value is kept by the line parser; here it
            // must neither feed the stopping rule nor become the result.
            let value = report.values.get("value").filter(|value| value.is_finite());
            if let (Some(step), Some(value)) = (report.step, value) {
                let _ = metrics.send(EvalEvent::Metric {
                    i,
                    step,
                    value: *value,
                });
            }
        } else if !line.trim().is_empty() {
            last = Some(line);
        }
    }
    (last, named)
}
