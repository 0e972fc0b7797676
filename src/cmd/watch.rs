//! Watching an experiment to its end for `xp run` and `xp submit --wait`: a
//! progress bar on a terminal, plain lines otherwise.
//!
//! On a terminal (stdout and stderr both) an `indicatif` bar on stderr shows the
//! trials finished out of the total and `Progress::message`, and each trial that
//! ends is printed above it. Anywhere else each event is one line on stderr
//! (`TRIAL STATE REASON`, as before the bar existed), and each change in the
//! finished count adds a `progress:` line. What is shown is worked out by
//! `progress`; this module only draws it.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use xp::Client;
use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::{ExperimentState, ExperimentStatus, TrialEvent};

use super::eprintln_note;
use super::progress::Progress;

/// How long one wait for new events lasts before the status is read again.
const EVENT_WAIT: Duration = Duration::from_secs(1);

/// Where progress goes: a bar, or plain lines.
enum View {
    Bar(ProgressBar),
    Plain { last_finished: Option<usize> },
}

impl View {
    fn new() -> Self {
        if !(std::io::stderr().is_terminal() && std::io::stdout().is_terminal()) {
            return Self::Plain {
                last_finished: None,
            };
        }
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{bar:30}] {pos}/{len} trials  {elapsed}  {wide_msg}",
            )
            .expect("a valid progress template")
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Self::Bar(bar)
    }

    fn update(&mut self, progress: &Progress) {
        match self {
            Self::Bar(bar) => {
                bar.set_length(progress.total() as u64);
                bar.set_position(progress.counts().finished() as u64);
                bar.set_message(super::shown(&progress.message()).into_owned());
            }
            Self::Plain { last_finished } => {
                let finished = progress.counts().finished();
                if *last_finished != Some(finished) && progress.total() > 0 {
                    *last_finished = Some(finished);
                    eprintln_note(&format!("progress: {}", progress.summary()));
                }
            }
        }
    }

    fn event(&self, event: &TrialEvent) {
        let line = format!(
            "{} {} {}",
            event.trial,
            event.state,
            super::shown(&event.reason)
        );
        match self {
            Self::Bar(bar) if event.state.is_terminal() => bar.suspend(|| eprintln_note(&line)),
            Self::Bar(_) => {}
            Self::Plain { .. } => eprintln_note(&line),
        }
    }

    fn finish(&self) {
        if let Self::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // An interrupted watch must not leave the bar's ticker drawing.
        self.finish();
    }
}

/// Follows `experiment` until no trial of it is left to run, showing progress,
/// and returns its final status. `expected_total` is how many trials its spec
/// asks for (0 when unknown).
pub(crate) async fn watch(
    client: &Client,
    experiment: ExperimentId,
    expected_total: usize,
) -> anyhow::Result<ExperimentStatus> {
    let started = tokio::time::Instant::now();
    let mut progress = Progress::new(expected_total);
    let mut view = View::new();
    let mut after = 0;
    let mut ended: Option<ExperimentStatus> = None;
    loop {
        // Events first, so the counts drawn after them include them; once the
        // experiment ended, deliver the events left and stop.
        let wait = if ended.is_some() {
            Duration::ZERO
        } else {
            EVENT_WAIT
        };
        let events = client.events(experiment, after, wait).await?;
        if events.is_empty()
            && let Some(status) = ended
        {
            view.finish();
            return Ok(status);
        }
        for event in events {
            after = after.max(event.seq);
            view.event(&event);
        }
        let status = client.experiment(experiment).await?;
        progress.observe(&status, started.elapsed());
        view.update(&progress);
        if status.state != ExperimentState::Running {
            ended = Some(status);
        }
    }
}

/// The number of trials `spec` asks for, or 0 when only the search knows
/// (a grid's size is known to the head at once).
pub(crate) fn expected_trials(spec: &xp::ExperimentSpec) -> usize {
    spec.search.trials.map_or(0, |trials| {
        trials as usize * spec.search.seeds.max(1) as usize
    })
}

/// The results table (as `xp status` prints it) and the best configuration by
/// the experiment's metric.
pub(crate) fn print_results(status: &ExperimentStatus) {
    super::status::print_status_table(status);
    match (super::progress::best_trial(status), &status.metric) {
        (Some(best), _) => outln!(
            "best: {} {}={:.4} {}",
            best.trial,
            best.metric,
            best.value,
            best.config_json
        ),
        (None, Some(metric)) => outln!("best: no succeeded trial reported {metric}"),
        (None, None) => {}
    }
}
