//! `xp top`: a live full-screen view of a cluster: nodes with their GPU slots
//! and the trials on them, queues, running trials with their latest metrics,
//! and recent failures and preemptions; a trial's log tail on Enter.
//!
//! Three parts: the model (`state`, pure, unit-tested), the fetcher task
//! (`fetch`, the only part that talks to the head) and the drawing (`render`).
//! This shell owns the terminal: it connects before touching the screen (so a
//! bad join string reads as a plain error), restores the terminal on every exit
//! path (quit, error, panic through ratatui's hook, SIGTERM), and turns key
//! presses into the model's inputs and the model's actions into requests.

mod fetch;
mod render;
mod state;

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use self::fetch::Update;
use self::state::{Action, Key, TopState};
use super::{ClusterArg, connect};

/// A live full-screen view of the cluster. Keys: ↑/↓ select a trial, Enter
/// shows its log tail (Esc goes back), `s` cycles the sort of the trials, `t`
/// cycles the team filter, `q` quits.
#[derive(clap::Args, Debug)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    cluster: ClusterArg,
}

/// How long the input thread waits for a key before checking whether to stop.
const INPUT_POLL: Duration = Duration::from_millis(100);

/// What the input thread hands the shell.
enum Input {
    Key(Key),
    /// Ctrl-C, which raw mode turns into a key press.
    Interrupt,
    /// The terminal changed size: draw again.
    Resize,
}

pub(crate) async fn run(args: TopArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        std::io::stdout().is_terminal(),
        "xp top draws a full-screen view and needs a terminal on stdout"
    );
    let client = connect(&args.cluster).await?;
    let terminal = match ratatui::try_init() {
        Ok(terminal) => terminal,
        Err(error) => {
            ratatui::restore();
            client.close().await;
            return Err(error).context("cannot set up the terminal");
        }
    };
    let cancel = CancellationToken::new();
    let (update_tx, mut updates) = mpsc::channel(64);
    let (log_tx, log_rx) = watch::channel(None);
    let fetcher = xp_runtime::task::spawn(
        "top-fetcher",
        fetch::run(client, update_tx, log_rx, cancel.clone()),
    );
    let stop_input = Arc::new(AtomicBool::new(false));
    let (input_tx, mut inputs) = mpsc::channel(64);
    let input_thread = {
        let stop_input = Arc::clone(&stop_input);
        tokio::task::spawn_blocking(move || read_input(&input_tx, &stop_input))
    };
    let result = event_loop(terminal, &mut updates, &mut inputs, &log_tx).await;
    ratatui::restore();
    cancel.cancel();
    stop_input.store(true, Ordering::Relaxed);
    drop(updates);
    input_thread.await.context("the input thread panicked")?;
    fetcher.await.context("the fetcher task panicked")?;
    result
}

/// Draws, then waits for a snapshot, a key or SIGTERM, until the user quits.
async fn event_loop(
    mut terminal: ratatui::DefaultTerminal,
    updates: &mut mpsc::Receiver<Update>,
    inputs: &mut mpsc::Receiver<anyhow::Result<Input>>,
    log_tx: &watch::Sender<Option<xp_runtime::ids::TrialId>>,
) -> anyhow::Result<()> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot watch for SIGTERM")?;
    let mut state = TopState::default();
    loop {
        terminal
            .draw(|frame| render::draw(frame, &state))
            .context("cannot draw on the terminal")?;
        tokio::select! {
            update = updates.recv() => match update {
                Some(update) => apply_update(&mut state, update),
                None => anyhow::bail!("the fetcher stopped"),
            },
            input = inputs.recv() => match input {
                Some(Ok(Input::Key(key))) => match state.handle_key(key) {
                    Some(Action::Quit) => return Ok(()),
                    Some(Action::OpenLog(trial)) => {
                        log_tx.send_replace(Some(trial));
                    }
                    Some(Action::CloseLog) => {
                        log_tx.send_replace(None);
                    }
                    None => {}
                },
                Some(Ok(Input::Resize)) => {}
                Some(Ok(Input::Interrupt)) | None => return Ok(()),
                Some(Err(error)) => return Err(error),
            },
            _ = sigterm.recv() => return Ok(()),
        }
    }
}

fn apply_update(state: &mut TopState, update: Update) {
    match update {
        Update::Snapshot(snapshot) => state.handle_snapshot(snapshot),
        Update::FetchError(error) => {
            tracing::debug!(%error, "fetch failed");
            state.handle_fetch_error(error);
        }
        Update::LogChunk {
            trial,
            data,
            complete,
        } => state.handle_log_chunk(trial, &data, complete),
        Update::LogError { trial, error } => state.handle_log_error(trial, error),
    }
}

/// Reads terminal events on a blocking thread until `stop` is set or the shell
/// goes away; a failure to read is handed over and ends the thread.
fn read_input(inputs: &mpsc::Sender<anyhow::Result<Input>>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let read = event::poll(INPUT_POLL)
            .and_then(|ready| ready.then(event::read).transpose())
            .context("cannot read the terminal");
        let input = match read {
            Ok(None) => continue,
            Ok(Some(event)) => match translate(&event) {
                Some(input) => Ok(input),
                None => continue,
            },
            Err(error) => Err(error),
        };
        let failed = input.is_err();
        if inputs.blocking_send(input).is_err() || failed {
            break;
        }
    }
}

/// The terminal event as an input for the shell, if it is one.
fn translate(event: &Event) -> Option<Input> {
    let key_event = match event {
        Event::Key(key_event) if key_event.kind != KeyEventKind::Release => key_event,
        Event::Resize(..) => return Some(Input::Resize),
        _ => return None,
    };
    let key = match key_event.code {
        KeyCode::Char('c') if key_event.modifiers.contains(KeyModifiers::CONTROL) => {
            return Some(Input::Interrupt);
        }
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        _ => return None,
    };
    Some(Input::Key(key))
}
