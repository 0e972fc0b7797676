//! What went wrong with each node lately: judged lost, its session closed
//! without draining, or its session silent for longer than the suspicion
//! threshold. A gang's rank that exits with an error while a peer's node is
//! in trouble may be collateral damage; the gang fault rule (`gang_faults`)
//! asks this record whether any of an attempt's nodes was in trouble around
//! the exit.
//!
//! Memory only: after a restart the head holds exits until every node of the
//! attempt has registered again, so nothing here needs to survive.
//!
//! Invariants: at most [`MAX_TROUBLES_PER_NODE`] troubles are kept per node
//! (the oldest go first); a trouble's interval never ends before it starts; a
//! node is suspect only while no frame of its session has been read for
//! longer than the threshold.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::NodeId;

/// Enough for the window of any attempt's judgement.
const MAX_TROUBLES_PER_NODE: usize = 8;

/// What befell a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TroubleKind {
    /// Judged lost (by silence, or it left); until it registers again.
    Lost,
    /// Its session closed while it was not draining.
    SessionClosed,
    /// Its session was silent past the suspicion threshold.
    Silent,
}

/// One trouble of one node, over `[from, to]` (`to` is `None` while it lasts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trouble {
    pub(crate) kind: TroubleKind,
    pub(crate) from: UnixMillis,
    pub(crate) to: Option<UnixMillis>,
}

impl Trouble {
    /// Whether it overlaps `[from, to]`.
    fn overlaps(&self, from: UnixMillis, to: UnixMillis) -> bool {
        self.from <= to && self.to.is_none_or(|end| end >= from)
    }
}

/// A node's trouble, named for an attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeTrouble {
    pub(crate) node: NodeId,
    pub(crate) trouble: Trouble,
}

impl fmt::Display for NodeTrouble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = self.node;
        match self.trouble.kind {
            TroubleKind::Lost => write!(f, "node {node} lost"),
            TroubleKind::SessionClosed => write!(f, "node {node} lost its session"),
            TroubleKind::Silent => {
                let Trouble { from, to, .. } = self.trouble;
                match to {
                    Some(to) => write!(
                        f,
                        "node {node} was unreachable for {:.1} s",
                        to.saturating_sub(from) as f64 / 1000.0
                    ),
                    None => write!(f, "node {node} unreachable"),
                }
            }
        }
    }
}

/// The recent troubles of every node.
#[derive(Debug, Default)]
pub(crate) struct NodeTroubles {
    recent: BTreeMap<NodeId, VecDeque<Trouble>>,
}

impl NodeTroubles {
    fn push(&mut self, node: NodeId, trouble: Trouble) {
        let troubles = self.recent.entry(node).or_default();
        if troubles.len() == MAX_TROUBLES_PER_NODE {
            troubles.pop_front();
        }
        troubles.push_back(trouble);
    }

    /// The trouble of `kind` that `node` is in now, if any.
    fn ongoing(&mut self, node: NodeId, kind: TroubleKind) -> Option<&mut Trouble> {
        self.recent
            .get_mut(&node)?
            .iter_mut()
            .rev()
            .find(|trouble| trouble.kind == kind && trouble.to.is_none())
    }

    /// `node`'s session last read a frame at `heard_at`, as seen at `now`: a
    /// silence longer than `suspect_after_ms` begins a trouble, and a frame
    /// read after it ends it.
    pub(crate) fn session_heard(
        &mut self,
        node: NodeId,
        heard_at: UnixMillis,
        now: UnixMillis,
        suspect_after_ms: u64,
    ) {
        if let Some(silent) = self.ongoing(node, TroubleKind::Silent) {
            if heard_at > silent.from {
                silent.to = Some(heard_at);
            }
            return;
        }
        if now.saturating_sub(heard_at) > suspect_after_ms {
            self.push(
                node,
                Trouble {
                    kind: TroubleKind::Silent,
                    from: heard_at,
                    to: None,
                },
            );
        }
    }

    /// `node`'s session closed at `at` while it was not draining.
    pub(crate) fn session_closed(&mut self, node: NodeId, at: UnixMillis) {
        self.push(
            node,
            Trouble {
                kind: TroubleKind::SessionClosed,
                from: at,
                to: Some(at),
            },
        );
    }

    /// `node` was judged lost; it was last heard at `last_seen`.
    pub(crate) fn lost(&mut self, node: NodeId, last_seen: UnixMillis) {
        if self.ongoing(node, TroubleKind::Lost).is_none() {
            self.push(
                node,
                Trouble {
                    kind: TroubleKind::Lost,
                    from: last_seen,
                    to: None,
                },
            );
        }
    }

    /// `node` registered at `at`: whatever troubled it is over.
    pub(crate) fn registered(&mut self, node: NodeId, at: UnixMillis) {
        if let Some(troubles) = self.recent.get_mut(&node) {
            for trouble in troubles.iter_mut().filter(|trouble| trouble.to.is_none()) {
                trouble.to = Some(at.max(trouble.from));
            }
        }
    }

    /// The first trouble (by when it began) of any of `nodes` that overlaps
    /// `[from, to]`.
    pub(crate) fn first_between(
        &self,
        nodes: impl IntoIterator<Item = NodeId>,
        from: UnixMillis,
        to: UnixMillis,
    ) -> Option<NodeTrouble> {
        nodes
            .into_iter()
            .filter_map(|node| {
                let trouble = self
                    .recent
                    .get(&node)?
                    .iter()
                    .filter(|trouble| trouble.overlaps(from, to))
                    .min_by_key(|trouble| trouble.from)?;
                Some(NodeTrouble {
                    node,
                    trouble: *trouble,
                })
            })
            .min_by_key(|found| found.trouble.from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(seed: u8) -> NodeId {
        NodeId(uuid::Uuid::from_bytes([seed; 16]))
    }

    #[test]
    fn a_silence_past_the_threshold_is_a_trouble_from_the_last_frame_until_the_next() {
        let mut troubles = NodeTroubles::default();
        let a = node(1);
        troubles.session_heard(a, 1_000, 2_000, 1_500);
        assert_eq!(troubles.first_between([a], 0, 10_000), None, "1 s is fine");
        troubles.session_heard(a, 1_000, 2_600, 1_500);
        let found = troubles.first_between([a], 2_000, 2_000).unwrap();
        assert_eq!(found.trouble.from, 1_000);
        assert_eq!(found.trouble.to, None, "still silent");
        assert_eq!(found.to_string(), format!("node {a} unreachable"));
        troubles.session_heard(a, 3_100, 3_200, 1_500);
        let found = troubles.first_between([a], 3_000, 3_000).unwrap();
        assert_eq!(found.trouble.to, Some(3_100));
        assert_eq!(
            found.to_string(),
            format!("node {a} was unreachable for 2.1 s")
        );
        assert_eq!(
            troubles.first_between([a], 3_101, 9_000),
            None,
            "over once heard again"
        );
    }

    #[test]
    fn the_first_trouble_of_any_node_in_the_window_is_named() {
        let mut troubles = NodeTroubles::default();
        let (a, b, c) = (node(1), node(2), node(3));
        troubles.session_closed(b, 5_000);
        troubles.lost(a, 4_000);
        troubles.lost(a, 4_500);
        let found = troubles.first_between([a, b, c], 4_800, 6_000).unwrap();
        assert_eq!((found.node, found.trouble.kind), (a, TroubleKind::Lost));
        assert_eq!(found.to_string(), format!("node {a} lost"));
        troubles.registered(a, 4_900);
        let found = troubles.first_between([a, b, c], 4_950, 6_000).unwrap();
        assert_eq!(
            (found.node, found.trouble.kind),
            (b, TroubleKind::SessionClosed)
        );
        assert_eq!(troubles.first_between([c], 0, u64::MAX), None);
    }

    #[test]
    fn each_node_keeps_only_its_latest_troubles() {
        let mut troubles = NodeTroubles::default();
        let a = node(1);
        for at in 0..20 {
            troubles.session_closed(a, at * 100);
        }
        assert_eq!(troubles.recent[&a].len(), MAX_TROUBLES_PER_NODE);
        assert_eq!(troubles.first_between([a], 0, 1_100), None);
        assert!(troubles.first_between([a], 1_200, 1_200).is_some());
    }
}
