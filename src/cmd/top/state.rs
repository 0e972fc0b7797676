//! The model behind `xp top`: the latest snapshot of the cluster, the trial
//! selection, the sort and team filter, and the open log tail.
//!
//! It does no I/O and reads no clock: the fetcher hands it snapshots (stamped
//! with the time they were taken) and log chunks, the terminal shell hands it
//! key presses, and it answers with the [`Action`] the shell must perform.
//!
//! Invariant: the selection always names a trial of [`TopState::visible_trials`]
//! when that list is not empty, and follows its trial when rows move.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId};
use xp_runtime::protocol::{ExperimentStatus, NodeStatus, QueueStatus, TrialEvent, TrialState};

/// The most events kept for the events panel.
const MAX_EVENTS: usize = 200;
/// The most log lines kept for the log view.
const MAX_LOG_LINES: usize = 1_000;
/// The team of a queue that serves every team.
const ANY_TEAM: &str = "*";

/// One trial that holds slots, as the trials table shows it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TrialRow {
    pub(crate) id: TrialId,
    pub(crate) experiment: String,
    pub(crate) team: String,
    pub(crate) state: TrialState,
    /// The node of each rank of the current attempt.
    pub(crate) nodes: Vec<NodeId>,
    /// When the current attempt was placed (started running, when it has).
    pub(crate) since: UnixMillis,
    pub(crate) last_step: Option<u64>,
    /// The latest value of each metric (rank 0).
    pub(crate) metrics: BTreeMap<String, f64>,
    /// The experiment's ranking metric and whether larger is better.
    pub(crate) objective: Option<(String, bool)>,
}

impl TrialRow {
    /// The objective's latest value, made "smaller is better".
    fn objective_key(&self) -> Option<f64> {
        let (name, maximize) = self.objective.as_ref()?;
        let value = *self.metrics.get(name)?;
        let key = if *maximize { -value } else { value };
        key.is_finite().then_some(key)
    }
}

/// A trial event worth a line: failures, preemptions, requeues, cancellations.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EventRow {
    pub(crate) event: TrialEvent,
    pub(crate) team: String,
}

/// Whether an event belongs in the events panel.
pub(crate) fn is_notable(event: &TrialEvent) -> bool {
    match event.state {
        TrialState::Failed
        | TrialState::Preempting
        | TrialState::Cancelled
        | TrialState::Stopped => true,
        // A trial queued again after an attempt: requeued after a preemption or a retry.
        TrialState::Queued => event.attempt > 0,
        _ => false,
    }
}

/// What the fetcher took from the head in one round.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// When it was taken (the fetcher's clock).
    pub(crate) taken_at: UnixMillis,
    pub(crate) nodes: Vec<NodeStatus>,
    pub(crate) queues: Vec<QueueStatus>,
    pub(crate) trials: Vec<TrialRow>,
    /// Every team with an experiment or a queue.
    pub(crate) teams: BTreeSet<String>,
    /// New notable events since the last snapshot, oldest first.
    pub(crate) new_events: Vec<EventRow>,
}

impl Snapshot {
    /// A snapshot from the head's views: the trials that hold slots, each with
    /// its experiment's name, team and objective.
    pub(crate) fn from_views(
        taken_at: UnixMillis,
        nodes: Vec<NodeStatus>,
        queues: Vec<QueueStatus>,
        experiments: &[ExperimentStatus],
        new_events: Vec<EventRow>,
    ) -> Self {
        let mut teams: BTreeSet<String> = queues.iter().map(|queue| queue.team.clone()).collect();
        let mut trials = Vec::new();
        for experiment in experiments {
            teams.insert(experiment.team.clone());
            let objective = experiment
                .metric
                .clone()
                .map(|metric| (metric, experiment.maximize));
            for trial in &experiment.trials {
                let Some(attempt) = trial.attempts.last() else {
                    continue;
                };
                if !trial.state.holds_slots() {
                    continue;
                }
                trials.push(TrialRow {
                    id: trial.id,
                    experiment: experiment.name.clone(),
                    team: experiment.team.clone(),
                    state: trial.state,
                    nodes: attempt.nodes.clone(),
                    since: attempt.running_at.unwrap_or(attempt.placed_at),
                    last_step: trial.last_step,
                    metrics: trial.metrics.clone(),
                    objective: objective.clone(),
                });
            }
        }
        teams.retain(|team| !team.is_empty() && team != ANY_TEAM);
        Self {
            taken_at,
            nodes,
            queues,
            trials,
            teams,
            new_events,
        }
    }
}

/// How the trials table is ordered; `s` cycles through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum TrialSort {
    /// Longest running first.
    #[default]
    Age,
    /// By experiment name, then trial id.
    Experiment,
    /// By the first node of the attempt.
    Node,
    /// Best objective first; trials without it last.
    Objective,
}

impl TrialSort {
    fn next(self) -> Self {
        match self {
            Self::Age => Self::Experiment,
            Self::Experiment => Self::Node,
            Self::Node => Self::Objective,
            Self::Objective => Self::Age,
        }
    }

    /// The name shown in the header.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Age => "age",
            Self::Experiment => "experiment",
            Self::Node => "node",
            Self::Objective => "objective",
        }
    }
}

/// A key press, already translated from the terminal's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    Up,
    Down,
    Enter,
    Esc,
    Char(char),
}

/// What the shell must do after a key press.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Restore the terminal and exit.
    Quit,
    /// Start following this trial's rank-0 log.
    OpenLog(TrialId),
    /// Stop following the log.
    CloseLog,
}

/// The log tail being shown.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct LogTail {
    pub(crate) trial: Option<TrialId>,
    /// Complete lines, the newest last.
    pub(crate) lines: VecDeque<String>,
    /// A last line not yet ended by a newline.
    pub(crate) partial: String,
    /// The worker has exited.
    pub(crate) complete: bool,
    /// Why the log cannot be read, when it cannot.
    pub(crate) error: Option<String>,
}

/// Everything `xp top` shows, and the user's choices.
#[derive(Debug, Default)]
pub(crate) struct TopState {
    pub(crate) snapshot: Snapshot,
    /// Whether a snapshot has arrived yet.
    pub(crate) loaded: bool,
    /// Notable events, the newest first.
    pub(crate) events: VecDeque<EventRow>,
    pub(crate) sort: TrialSort,
    /// Only this team's trials, queues and events; all when `None`.
    pub(crate) team: Option<String>,
    selected: Option<TrialId>,
    selected_index: usize,
    /// The open log view, if any.
    pub(crate) log: Option<LogTail>,
    /// The last fetch error, cleared by the next snapshot.
    pub(crate) error: Option<String>,
}

impl TopState {
    /// Takes a new snapshot; the selection stays on its trial, or on the row
    /// at the same place when its trial is gone.
    pub(crate) fn handle_snapshot(&mut self, mut snapshot: Snapshot) {
        for event in snapshot.new_events.drain(..) {
            self.events.push_front(event);
        }
        self.events.truncate(MAX_EVENTS);
        if let Some(team) = &self.team
            && !snapshot.teams.contains(team)
        {
            self.team = None;
        }
        self.snapshot = snapshot;
        self.loaded = true;
        self.error = None;
        self.fix_selection();
    }

    /// Notes a failed fetch; the last snapshot stays on screen.
    pub(crate) fn handle_fetch_error(&mut self, error: String) {
        self.error = Some(error);
    }

    /// Appends a piece of the open log (ignored when it is for another trial).
    pub(crate) fn handle_log_chunk(&mut self, trial: TrialId, data: &[u8], complete: bool) {
        let Some(log) = self.log.as_mut().filter(|log| log.trial == Some(trial)) else {
            return;
        };
        log.complete = complete;
        log.error = None;
        let text = String::from_utf8_lossy(data);
        let mut pieces = text.split('\n').peekable();
        while let Some(piece) = pieces.next() {
            if pieces.peek().is_none() {
                log.partial.push_str(piece);
                break;
            }
            let mut line = std::mem::take(&mut log.partial);
            line.push_str(piece);
            log.lines.push_back(line);
        }
        while log.lines.len() > MAX_LOG_LINES {
            log.lines.pop_front();
        }
    }

    /// Notes that the open log cannot be read.
    pub(crate) fn handle_log_error(&mut self, trial: TrialId, error: String) {
        if let Some(log) = self.log.as_mut().filter(|log| log.trial == Some(trial)) {
            log.error = Some(error);
        }
    }

    /// Applies a key press and says what the shell must do.
    pub(crate) fn handle_key(&mut self, key: Key) -> Option<Action> {
        if self.log.is_some() {
            return match key {
                Key::Char('q') => Some(Action::Quit),
                Key::Esc | Key::Char('h') => {
                    self.log = None;
                    Some(Action::CloseLog)
                }
                _ => None,
            };
        }
        match key {
            Key::Char('q') => return Some(Action::Quit),
            Key::Up | Key::Char('k') => self.move_selection(-1),
            Key::Down | Key::Char('j') => self.move_selection(1),
            Key::Char('s') => {
                self.sort = self.sort.next();
                self.fix_selection();
            }
            Key::Char('t') => {
                self.team = self.next_team();
                self.selected = None;
                self.selected_index = 0;
                self.fix_selection();
            }
            Key::Enter => {
                let trial = self.selected?;
                self.log = Some(LogTail {
                    trial: Some(trial),
                    ..LogTail::default()
                });
                return Some(Action::OpenLog(trial));
            }
            Key::Esc | Key::Char(_) => {}
        }
        None
    }

    /// The selected trial, if any.
    #[cfg(test)]
    pub(crate) fn selected(&self) -> Option<TrialId> {
        self.selected
    }

    /// The trials shown, filtered by team and sorted.
    pub(crate) fn visible_trials(&self) -> Vec<&TrialRow> {
        let mut trials: Vec<&TrialRow> = self
            .snapshot
            .trials
            .iter()
            .filter(|trial| self.shows_team(&trial.team))
            .collect();
        match self.sort {
            TrialSort::Age => trials.sort_by_key(|trial| (trial.since, trial.id)),
            TrialSort::Experiment => {
                trials.sort_by(|a, b| (&a.experiment, a.id).cmp(&(&b.experiment, b.id)));
            }
            TrialSort::Node => trials.sort_by_key(|trial| (trial.nodes.first().copied(), trial.id)),
            TrialSort::Objective => trials.sort_by(|a, b| {
                match (a.objective_key(), b.objective_key()) {
                    (Some(x), Some(y)) => x.total_cmp(&y),
                    (Some(_), None) => std::cmp::Ordering::Less,
                    (None, Some(_)) => std::cmp::Ordering::Greater,
                    (None, None) => std::cmp::Ordering::Equal,
                }
                .then(a.id.cmp(&b.id))
            }),
        }
        trials
    }

    /// The queues shown, filtered by team (a queue for any team always shows).
    pub(crate) fn visible_queues(&self) -> Vec<&QueueStatus> {
        self.snapshot
            .queues
            .iter()
            .filter(|queue| queue.team == ANY_TEAM || self.shows_team(&queue.team))
            .collect()
    }

    /// The events shown, the newest first, filtered by team.
    pub(crate) fn visible_events(&self) -> impl Iterator<Item = &EventRow> {
        self.events
            .iter()
            .filter(|event| self.shows_team(&event.team))
    }

    /// The trials holding slots on `node` (all teams: a node is shared).
    pub(crate) fn trials_on(&self, node: NodeId) -> Vec<&TrialRow> {
        let mut trials: Vec<&TrialRow> = self
            .snapshot
            .trials
            .iter()
            .filter(|trial| trial.nodes.contains(&node))
            .collect();
        trials.sort_by_key(|trial| trial.id);
        trials
    }

    fn shows_team(&self, team: &str) -> bool {
        self.team.as_deref().is_none_or(|wanted| wanted == team)
    }

    /// All teams, then each team in order, then all again.
    fn next_team(&self) -> Option<String> {
        let teams = &self.snapshot.teams;
        match &self.team {
            None => teams.iter().next().cloned(),
            Some(team) => teams
                .range::<String, _>((std::ops::Bound::Excluded(team), std::ops::Bound::Unbounded))
                .next()
                .cloned(),
        }
    }

    fn move_selection(&mut self, delta: isize) {
        let trials = self.visible_trials();
        if trials.is_empty() {
            return;
        }
        let last = trials.len() - 1;
        let index = self.selected_index.saturating_add_signed(delta).min(last);
        let trial = trials[index].id;
        self.selected_index = index;
        self.selected = Some(trial);
    }

    fn fix_selection(&mut self) {
        let trials = self.visible_trials();
        let found = self
            .selected
            .and_then(|selected| trials.iter().position(|trial| trial.id == selected));
        let (index, trial) = match found {
            Some(index) => (index, self.selected),
            None if trials.is_empty() => (0, None),
            None => {
                let index = self.selected_index.min(trials.len() - 1);
                (index, Some(trials[index].id))
            }
        };
        self.selected_index = index;
        self.selected = trial;
    }

    /// The selected row's place in [`Self::visible_trials`].
    pub(crate) fn selected_index(&self) -> Option<usize> {
        self.selected.map(|_| self.selected_index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xp_runtime::ids::ExperimentId;

    fn experiment_id(name: &str) -> ExperimentId {
        // Any fixed id per name: the tests only need distinct, stable ones.
        let digest = name
            .bytes()
            .fold(7u64, |hash, byte| hash.wrapping_mul(31) + u64::from(byte));
        ExperimentId { digest, run: 1 }
    }

    fn node(index: u8) -> NodeId {
        format!("00000000-0000-0000-0000-0000000000{index:02}")
            .parse()
            .expect("a node id")
    }

    /// A trial of experiment `name` (team `team`), index `index`, placed at
    /// `since` on node `node_index`, with objective `loss` (minimised).
    fn row(
        name: &str,
        team: &str,
        index: u32,
        since: u64,
        node_index: u8,
        loss: Option<f64>,
    ) -> TrialRow {
        TrialRow {
            id: TrialId {
                experiment: experiment_id(name),
                index,
            },
            experiment: name.to_owned(),
            team: team.to_owned(),
            state: TrialState::Running,
            nodes: vec![node(node_index)],
            since,
            last_step: None,
            metrics: loss
                .map(|loss| ("loss".to_owned(), loss))
                .into_iter()
                .collect(),
            objective: Some(("loss".to_owned(), false)),
        }
    }

    fn state_with(trials: Vec<TrialRow>) -> TopState {
        let teams = trials.iter().map(|trial| trial.team.clone()).collect();
        let mut state = TopState::default();
        state.handle_snapshot(Snapshot {
            trials,
            teams,
            ..Snapshot::default()
        });
        state
    }

    fn sample() -> Vec<TrialRow> {
        vec![
            row("bravo", "vision", 0, 300, 2, Some(0.5)),
            row("alpha", "nlp", 1, 100, 3, None),
            row("alpha", "nlp", 0, 200, 1, Some(0.2)),
            row("charlie", "vision", 0, 50, 4, Some(0.9)),
        ]
    }

    /// The visible trials as `experiment/index`.
    fn names(state: &TopState) -> Vec<String> {
        state
            .visible_trials()
            .iter()
            .map(|trial| format!("{}/{}", trial.experiment, trial.id.index))
            .collect()
    }

    fn selected_name(state: &TopState) -> Option<String> {
        let selected = state.selected()?;
        let trial = state
            .snapshot
            .trials
            .iter()
            .find(|trial| trial.id == selected)?;
        Some(format!("{}/{}", trial.experiment, trial.id.index))
    }

    fn check_sort(sort: TrialSort, expected: &[&str]) {
        let mut state = state_with(sample());
        while state.sort != sort {
            state.handle_key(Key::Char('s'));
        }
        assert_eq!(names(&state), expected, "sort {}", sort.as_str());
    }

    #[test]
    fn sorts_cycle_through_every_order() {
        check_sort(
            TrialSort::Age,
            &["charlie/0", "alpha/1", "alpha/0", "bravo/0"],
        );
        check_sort(
            TrialSort::Experiment,
            &["alpha/0", "alpha/1", "bravo/0", "charlie/0"],
        );
        check_sort(
            TrialSort::Node,
            &["alpha/0", "bravo/0", "alpha/1", "charlie/0"],
        );
        check_sort(
            TrialSort::Objective,
            &["alpha/0", "bravo/0", "charlie/0", "alpha/1"],
        );
    }

    #[test]
    fn objective_sort_puts_the_largest_first_when_maximised() {
        let mut trials = sample();
        for trial in &mut trials {
            trial.objective = Some(("loss".to_owned(), true));
        }
        let mut state = state_with(trials);
        state.sort = TrialSort::Objective;
        assert_eq!(
            names(&state),
            ["charlie/0", "bravo/0", "alpha/0", "alpha/1"]
        );
    }

    #[test]
    fn team_filter_cycles_through_teams_and_back_to_all() {
        let mut state = state_with(sample());
        assert_eq!(state.team, None);
        state.handle_key(Key::Char('t'));
        assert_eq!(state.team.as_deref(), Some("nlp"));
        assert_eq!(names(&state), ["alpha/1", "alpha/0"]);
        state.handle_key(Key::Char('t'));
        assert_eq!(state.team.as_deref(), Some("vision"));
        assert_eq!(names(&state), ["charlie/0", "bravo/0"]);
        state.handle_key(Key::Char('t'));
        assert_eq!(state.team, None);
        assert_eq!(names(&state).len(), 4);
    }

    #[test]
    fn team_filter_applies_to_events_and_is_dropped_when_the_team_goes() {
        let mut state = state_with(sample());
        let event = |team: &str, state: TrialState| EventRow {
            event: TrialEvent {
                seq: 1,
                at: 0,
                trial: row("alpha", team, 0, 0, 1, None).id,
                state,
                attempt: 1,
                reason: "node lost".to_owned(),
            },
            team: team.to_owned(),
        };
        state.handle_snapshot(Snapshot {
            trials: sample(),
            teams: ["nlp", "vision"].map(str::to_owned).into(),
            new_events: vec![
                event("nlp", TrialState::Failed),
                event("vision", TrialState::Preempting),
            ],
            ..Snapshot::default()
        });
        state.handle_key(Key::Char('t'));
        let shown: Vec<&str> = state
            .visible_events()
            .map(|row| row.team.as_str())
            .collect();
        assert_eq!(shown, ["nlp"]);
        state.handle_snapshot(Snapshot {
            trials: sample(),
            teams: ["vision"].map(str::to_owned).into(),
            ..Snapshot::default()
        });
        assert_eq!(state.team, None, "a team that is gone is no filter");
        assert_eq!(state.visible_events().count(), 2);
    }

    #[test]
    fn a_queue_for_any_team_shows_under_every_filter() {
        let queue = |name: &str, team: &str| QueueStatus {
            name: name.to_owned(),
            team: team.to_owned(),
            cohort: None,
            weight: 1.0,
            usage: Default::default(),
            quota: Default::default(),
            borrowed: Default::default(),
            lent: Default::default(),
            pending: 0,
            running: 0,
            fair_share: 0.0,
            leases: Default::default(),
            lease_quota: Default::default(),
        };
        let queues = vec![
            queue("shared", ANY_TEAM),
            queue("nlp-q", "nlp"),
            queue("cv-q", "vision"),
        ];
        let mut state = TopState::default();
        state.handle_snapshot(Snapshot::from_views(0, vec![], queues, &[], vec![]));
        assert_eq!(
            state.snapshot.teams,
            ["nlp", "vision"].map(str::to_owned).into()
        );
        state.handle_key(Key::Char('t'));
        let shown: Vec<&str> = state
            .visible_queues()
            .iter()
            .map(|queue| queue.name.as_str())
            .collect();
        assert_eq!(shown, ["shared", "nlp-q"]);
    }

    #[test]
    fn selection_moves_within_bounds() {
        let mut state = state_with(sample());
        assert_eq!(selected_name(&state).as_deref(), Some("charlie/0"));
        state.handle_key(Key::Up);
        assert_eq!(selected_name(&state).as_deref(), Some("charlie/0"));
        for _ in 0..10 {
            state.handle_key(Key::Down);
        }
        assert_eq!(selected_name(&state).as_deref(), Some("bravo/0"));
        assert_eq!(state.selected_index(), Some(3));
    }

    #[test]
    fn selection_follows_its_trial_when_rows_move() {
        let mut state = state_with(sample());
        state.handle_key(Key::Down);
        assert_eq!(selected_name(&state).as_deref(), Some("alpha/1"));
        state.handle_key(Key::Char('s'));
        assert_eq!(state.sort, TrialSort::Experiment);
        assert_eq!(selected_name(&state).as_deref(), Some("alpha/1"));
        assert_eq!(state.selected_index(), Some(1));
    }

    #[test]
    fn selection_stays_in_place_when_its_trial_ends() {
        let mut state = state_with(sample());
        state.handle_key(Key::Down);
        state.handle_key(Key::Down);
        assert_eq!(selected_name(&state).as_deref(), Some("alpha/0"));
        let trials: Vec<TrialRow> = sample()
            .into_iter()
            .filter(|trial| !(trial.experiment == "alpha" && trial.id.index == 0))
            .collect();
        state.handle_snapshot(Snapshot {
            trials,
            teams: ["nlp", "vision"].map(str::to_owned).into(),
            ..Snapshot::default()
        });
        assert_eq!(selected_name(&state).as_deref(), Some("bravo/0"));
        state.handle_snapshot(Snapshot::default());
        assert_eq!(state.selected(), None);
        assert_eq!(state.handle_key(Key::Enter), None, "nothing to open");
    }

    #[test]
    fn enter_opens_the_selected_log_and_esc_closes_it() {
        let mut state = state_with(sample());
        let selected = state.selected().expect("a selection");
        assert_eq!(
            state.handle_key(Key::Enter),
            Some(Action::OpenLog(selected))
        );
        state.handle_log_chunk(selected, b"one\ntw", false);
        state.handle_log_chunk(selected, b"o\nthree", false);
        let log = state.log.as_ref().expect("an open log");
        assert_eq!(log.lines, ["one", "two"]);
        assert_eq!(log.partial, "three");
        assert_eq!(
            state.handle_key(Key::Down),
            None,
            "keys other than Esc and q wait"
        );
        assert_eq!(state.handle_key(Key::Esc), Some(Action::CloseLog));
        assert!(state.log.is_none());
        assert_eq!(state.handle_key(Key::Char('q')), Some(Action::Quit));
    }

    #[test]
    fn log_keeps_only_the_last_lines() {
        let mut state = state_with(sample());
        let selected = state.selected().expect("a selection");
        state.handle_key(Key::Enter);
        let text: String = (0..MAX_LOG_LINES + 10)
            .map(|line| format!("{line}\n"))
            .collect();
        state.handle_log_chunk(selected, text.as_bytes(), true);
        let log = state.log.as_ref().expect("an open log");
        assert_eq!(log.lines.len(), MAX_LOG_LINES);
        assert_eq!(log.lines.front().map(String::as_str), Some("10"));
        assert!(log.complete);
    }

    #[test]
    fn only_failures_preemptions_and_requeues_are_notable() {
        let event = |state: TrialState, attempt: u32| TrialEvent {
            seq: 1,
            at: 0,
            trial: row("alpha", "nlp", 0, 0, 1, None).id,
            state,
            attempt,
            reason: String::new(),
        };
        assert!(is_notable(&event(TrialState::Failed, 1)));
        assert!(is_notable(&event(TrialState::Preempting, 1)));
        assert!(is_notable(&event(TrialState::Queued, 1)));
        assert!(!is_notable(&event(TrialState::Queued, 0)));
        assert!(!is_notable(&event(TrialState::Running, 1)));
        assert!(!is_notable(&event(TrialState::Succeeded, 1)));
    }
}
