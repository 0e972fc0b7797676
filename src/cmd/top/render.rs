//! Drawing `xp top` from a [`TopState`]: a header, the nodes and queues side by
//! side, the trials table and the recent events, or the open log tail.
//!
//! Only layout and formatting live here: what is shown, in which order and for
//! which team is decided by the model. Text that users, workers or nodes wrote
//! (names, metric names, reasons, log lines, errors) goes through `shown`, so
//! its control characters appear as escapes.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState};
use xp_runtime::clock::UnixMillis;
use xp_runtime::protocol::{NodeState, TrialState};

use super::state::{LogTail, TopState, TrialRow};
use crate::cmd::shown;

/// Draws the whole screen.
pub(crate) fn draw(frame: &mut Frame<'_>, state: &TopState) {
    let [header, body] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(frame.area());
    frame.render_widget(Paragraph::new(header_line(state)), header);
    if let Some(log) = &state.log {
        draw_log(frame, body, log);
        return;
    }
    let [top, trials, events] = Layout::vertical([
        Constraint::Percentage(30),
        Constraint::Min(6),
        Constraint::Length(8),
    ])
    .areas(body);
    let [nodes, queues] =
        Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(top);
    draw_nodes(frame, nodes, state);
    draw_queues(frame, queues, state);
    draw_trials(frame, trials, state);
    draw_events(frame, events, state);
}

fn header_line(state: &TopState) -> Line<'static> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut spans = vec![
        Span::styled("xp top", bold),
        Span::raw(format!(
            "  {} nodes  {} trials on slots  sort: {} [s]  team: {} [t]  ",
            state.snapshot.nodes.len(),
            state.snapshot.trials.len(),
            state.sort.as_str(),
            state.team.as_deref().unwrap_or("all"),
        )),
    ];
    let keys = if state.log.is_some() {
        "Esc back  q quit"
    } else {
        "↑↓ select  Enter log  q quit"
    };
    spans.push(Span::styled(keys, Style::default().fg(Color::DarkGray)));
    if !state.loaded {
        spans.push(Span::raw("  connecting…"));
    }
    if let Some(error) = &state.error {
        spans.push(Span::styled(
            format!("  {}", shown(error)),
            Style::default().fg(Color::Red),
        ));
    }
    Line::from(spans)
}

fn titled(title: String) -> Block<'static> {
    Block::default().borders(Borders::ALL).title(title)
}

fn header_row(names: &[&'static str]) -> Row<'static> {
    Row::new(names.iter().copied()).style(Style::default().add_modifier(Modifier::BOLD))
}

fn draw_nodes(frame: &mut Frame<'_>, area: Rect, state: &TopState) {
    let rows = state.snapshot.nodes.iter().map(|node| {
        let total = node.capacity.gpus.len();
        let used = total.saturating_sub(node.free_gpus as usize);
        let slots = format!(
            "{}{} {used}/{total}",
            "■".repeat(used),
            "□".repeat(total - used)
        );
        let trials: Vec<String> = state
            .trials_on(node.id)
            .iter()
            .map(|trial| trial.id.to_string())
            .collect();
        let style = match node.state {
            NodeState::Ready => Style::default(),
            NodeState::Lost => Style::default().fg(Color::Red),
            NodeState::Draining => Style::default().fg(Color::Yellow),
        };
        Row::new([
            Cell::from(shown(&node.name).into_owned()),
            Cell::from(node.state.as_str()),
            Cell::from(slots),
            Cell::from(format!(
                "{:.1}/{:.1}",
                f64::from(
                    node.capacity.cpu_milli - node.free_cpu_milli.min(node.capacity.cpu_milli)
                ) / 1000.0,
                f64::from(node.capacity.cpu_milli) / 1000.0
            )),
            Cell::from(trials.join(" ")),
        ])
        .style(style)
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(16),
            Constraint::Length(8),
            Constraint::Length(16),
            Constraint::Length(11),
            Constraint::Min(10),
        ],
    )
    .header(header_row(&["NODE", "STATE", "GPU SLOTS", "CPU", "TRIALS"]))
    .block(titled(format!("Nodes ({})", state.snapshot.nodes.len())));
    frame.render_widget(table, area);
}

fn draw_queues(frame: &mut Frame<'_>, area: Rect, state: &TopState) {
    let queues = state.visible_queues();
    let rows = queues.iter().map(|queue| {
        Row::new([
            shown(&queue.name).into_owned(),
            shown(&queue.team).into_owned(),
            format!("{}/{}", amount(queue.usage.gpu), amount(queue.quota.gpu)),
            queue.pending.to_string(),
            queue.running.to_string(),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Min(10),
            Constraint::Length(10),
            Constraint::Length(13),
            Constraint::Length(7),
            Constraint::Length(7),
        ],
    )
    .header(header_row(&[
        "QUEUE",
        "TEAM",
        "GPU USE/QUOTA",
        "PENDING",
        "RUNNING",
    ]))
    .block(titled(format!("Queues ({})", queues.len())));
    frame.render_widget(table, area);
}

/// A resource amount: `-` for unlimited.
fn amount(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.1}"))
}

fn draw_trials(frame: &mut Frame<'_>, area: Rect, state: &TopState) {
    let trials = state.visible_trials();
    let now = state.snapshot.taken_at;
    let rows = trials.iter().map(|trial| trial_row(trial, now));
    let table = Table::new(
        rows,
        [
            Constraint::Length(22),
            Constraint::Length(18),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(18),
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Min(20),
        ],
    )
    .header(header_row(&[
        "TRIAL",
        "EXPERIMENT",
        "TEAM",
        "STATE",
        "NODES",
        "AGE",
        "STEP",
        "METRICS",
    ]))
    .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
    .block(titled(format!("Trials ({})", trials.len())));
    let mut table_state = TableState::default().with_selected(state.selected_index());
    frame.render_stateful_widget(table, area, &mut table_state);
}

fn trial_row(trial: &TrialRow, now: UnixMillis) -> Row<'static> {
    let nodes: Vec<String> = trial
        .nodes
        .iter()
        .map(|node| node.to_string().chars().take(8).collect())
        .collect();
    // The objective first, then the other metrics by name.
    let objective = trial.objective.as_ref().map(|(name, _)| name.as_str());
    let mut metrics: Vec<String> = objective
        .and_then(|name| trial.metrics.get_key_value(name))
        .into_iter()
        .chain(
            trial
                .metrics
                .iter()
                .filter(|(name, _)| Some(name.as_str()) != objective),
        )
        .map(|(name, value)| format!("{}={value:.4}", shown(name)))
        .collect();
    metrics.truncate(6);
    let style = match trial.state {
        TrialState::Preempting => Style::default().fg(Color::Yellow),
        _ => Style::default(),
    };
    Row::new([
        trial.id.to_string(),
        shown(&trial.experiment).into_owned(),
        shown(&trial.team).into_owned(),
        trial.state.as_str().to_owned(),
        nodes.join(","),
        age_text(now.saturating_sub(trial.since)),
        trial
            .last_step
            .map_or_else(|| "-".to_owned(), |step| step.to_string()),
        metrics.join(" "),
    ])
    .style(style)
}

/// A duration in milliseconds as `42s`, `3m05s` or `2h07m`.
pub(crate) fn age_text(millis: u64) -> String {
    let seconds = millis / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h{:02}m", seconds / 3600, seconds % 3600 / 60),
    }
}

fn draw_events(frame: &mut Frame<'_>, area: Rect, state: &TopState) {
    let now = state.snapshot.taken_at;
    let height = usize::from(area.height.saturating_sub(2));
    let lines: Vec<Line<'static>> = state
        .visible_events()
        .take(height)
        .map(|row| {
            let event = &row.event;
            let color = match event.state {
                TrialState::Failed => Color::Red,
                TrialState::Preempting | TrialState::Queued => Color::Yellow,
                _ => Color::Reset,
            };
            Line::from(vec![
                Span::raw(format!(
                    "{:>7} ago  ",
                    age_text(now.saturating_sub(event.at))
                )),
                Span::raw(format!("{}  a{}  ", event.trial, event.attempt)),
                Span::styled(event.state.as_str(), Style::default().fg(color)),
                Span::raw(format!("  {}", shown(&event.reason))),
            ])
        })
        .collect();
    let paragraph =
        Paragraph::new(lines).block(titled("Events: failures, preemptions, requeues".to_owned()));
    frame.render_widget(paragraph, area);
}

fn draw_log(frame: &mut Frame<'_>, area: Rect, log: &LogTail) {
    let height = usize::from(area.height.saturating_sub(2));
    let mut lines: Vec<Line<'_>> = log
        .lines
        .iter()
        .map(String::as_str)
        .chain((!log.partial.is_empty()).then_some(log.partial.as_str()))
        .map(|line| Line::raw(shown(line)))
        .collect();
    if let Some(error) = &log.error {
        lines.push(Line::styled(shown(error), Style::default().fg(Color::Red)));
    }
    let skip = lines.len().saturating_sub(height);
    let lines: Vec<Line<'_>> = lines.into_iter().skip(skip).collect();
    let trial = log
        .trial
        .map_or_else(String::new, |trial| trial.to_string());
    let ended = if log.complete { " (exited)" } else { "" };
    let paragraph = Paragraph::new(lines).block(titled(format!("Log of {trial}, rank 0{ended}")));
    frame.render_widget(paragraph, area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age_text(0), "0s");
        assert_eq!(age_text(59_999), "59s");
        assert_eq!(age_text(185_000), "3m05s");
        assert_eq!(age_text(7_620_000), "2h07m");
    }
}
