//! The core's outputs waiting for the shell: records to persist, commands for
//! nodes and the tally `/metrics` counts.
//!
//! Not here: the records of experiments, trials, nodes and pipelines, which
//! their own sub-states mark dirty and hand over (`HeadCore::take_records`
//! gathers them); this holds what is appended once and never rewritten
//! (events, metric reports, alerts, telemetry windows).
//!
//! Invariant: everything is handed out in the order it was put in, once.

use std::collections::VecDeque;

use xp_runtime::ids::NodeId;
use xp_runtime::protocol::HeadCommand;

use crate::Record;
use crate::metrics::Tally;

/// What the core produced and the shell has not taken yet.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    records: Vec<Record>,
    commands: VecDeque<(NodeId, HeadCommand)>,
    tally: Tally,
}

impl Outbox {
    /// Appends a record to persist.
    pub(crate) fn record(&mut self, record: Record) {
        self.records.push(record);
    }

    /// Queues a command for `node`.
    pub(crate) fn send(&mut self, node: NodeId, command: HeadCommand) {
        self.commands.push_back((node, command));
    }

    /// What `/metrics` counts, to add to.
    pub(crate) fn tally(&mut self) -> &mut Tally {
        &mut self.tally
    }

    /// The appended records, oldest first.
    pub(crate) fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.records)
    }

    /// The oldest command not taken yet.
    pub(crate) fn poll_command(&mut self) -> Option<(NodeId, HeadCommand)> {
        self.commands.pop_front()
    }

    /// The events appended and not taken yet, oldest first: what a test
    /// reads where the shell would read the store.
    #[cfg(test)]
    pub(crate) fn events(&self) -> impl Iterator<Item = &xp_runtime::protocol::TrialEvent> {
        self.records.iter().filter_map(|record| match record {
            Record::Event(event) => Some(event),
            _ => None,
        })
    }

    /// The tally since the last take.
    pub(crate) fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::protocol::TrialState;

    use super::*;

    #[test]
    fn outputs_come_out_once_in_the_order_they_went_in() {
        let mut outbox = Outbox::default();
        let node = NodeId(uuid::Uuid::from_bytes([1; 16]));
        outbox.send(node, HeadCommand::Ack { upto: 1 });
        outbox.send(node, HeadCommand::Ack { upto: 2 });
        outbox.tally().transition(TrialState::Running);
        assert!(matches!(
            outbox.poll_command(),
            Some((_, HeadCommand::Ack { upto: 1 }))
        ));
        assert!(matches!(
            outbox.poll_command(),
            Some((_, HeadCommand::Ack { upto: 2 }))
        ));
        assert!(outbox.poll_command().is_none());
        assert_eq!(outbox.take_tally().transitions, [TrialState::Running]);
        assert!(outbox.take_tally().transitions.is_empty());
        assert!(outbox.take_records().is_empty());
    }
}
