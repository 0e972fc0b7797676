//! The object book: which node holds which object (`ObjectDirectory`), the
//! checkpoint copies to a second node not made yet (`Replications`), and how
//! many kept checkpoints and outputs name each object.
//!
//! Not here: deciding what to keep (checkpoint retention, `checkpoints`) and
//! the node commands that copy or drop objects; this book only records.
//!
//! Invariant: an object's reference count is the number of kept checkpoints
//! and trial outputs that name it (checked against the trials by
//! `HeadCore::check_invariants`); it leaves the book when that reaches zero,
//! which is when `rekeep` hands it back as released.

use std::collections::{BTreeSet, HashMap};

use xp_runtime::ids::{NodeId, ObjectId};
use xp_runtime::protocol::ObjectEndpoint;

use crate::checkpoints::replication::Replications;
use crate::checkpoints::retention::ObjectDirectory;

/// Where objects are, the copies under way, and what keeps each object.
#[derive(Debug, Default)]
pub(crate) struct ObjectBook {
    directory: ObjectDirectory,
    replications: Replications,
    references: HashMap<ObjectId, u32>,
}

impl ObjectBook {
    /// Which node holds which object.
    pub(crate) fn directory(&self) -> &ObjectDirectory {
        &self.directory
    }

    /// A node (re)registered with its object server and the objects it holds.
    pub(crate) fn node_registered(
        &mut self,
        node: NodeId,
        endpoint: Option<ObjectEndpoint>,
        held: impl IntoIterator<Item = ObjectId>,
    ) {
        self.directory.register(node, endpoint, held);
    }

    /// `node` holds `id` now.
    pub(crate) fn node_holds(&mut self, node: NodeId, id: ObjectId) {
        self.directory.add(node, id);
    }

    /// `node` no longer holds `id`.
    pub(crate) fn node_dropped(&mut self, node: NodeId, id: ObjectId) {
        self.directory.drop_object(node, id);
    }

    /// The copies to a second node under way.
    pub(crate) fn replications(&self) -> &Replications {
        &self.replications
    }

    /// The copies under way, to start, retry or end one.
    pub(crate) fn replications_mut(&mut self) -> &mut Replications {
        &mut self.replications
    }

    /// One more reference to each of `ids` (a name repeated counts again).
    pub(crate) fn keep(&mut self, ids: impl IntoIterator<Item = ObjectId>) {
        for id in ids {
            *self.references.entry(id).or_default() += 1;
        }
    }

    /// What keeps objects changed from `before` to `after` (each a list of
    /// names, repeats counting): the references of `after` are added before
    /// those of `before` are taken away, so an object in both is never
    /// released. Returns the objects nothing keeps any more.
    pub(crate) fn rekeep(
        &mut self,
        before: impl IntoIterator<Item = ObjectId>,
        after: impl IntoIterator<Item = ObjectId>,
    ) -> BTreeSet<ObjectId> {
        self.keep(after);
        let mut released = BTreeSet::new();
        for id in before {
            if let Some(count) = self.references.get_mut(&id) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.references.remove(&id);
                    released.insert(id);
                }
            }
        }
        released
    }

    /// The reference count of every kept object, for the invariant check.
    pub(crate) fn references(&self) -> &HashMap<ObjectId, u32> {
        &self.references
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(byte: u8) -> ObjectId {
        ObjectId([byte; 32])
    }

    #[test]
    fn an_object_is_released_when_the_last_name_of_it_goes() {
        let mut book = ObjectBook::default();
        book.keep([object(1), object(1), object(2)]);
        // A checkpoint naming 1 and 2 is replaced by one naming 2 and 3.
        let released = book.rekeep([object(1), object(2)], [object(2), object(3)]);
        assert!(
            released.is_empty(),
            "1 is still named once, 2 by the new checkpoint"
        );
        assert_eq!(book.references()[&object(1)], 1);
        assert_eq!(
            book.references()[&object(2)],
            1,
            "the old name of 2 went, the new one came"
        );
        let released = book.rekeep([object(1), object(2), object(2)], []);
        assert_eq!(released, BTreeSet::from([object(1), object(2)]));
        assert_eq!(book.references().len(), 1, "only 3 is still kept");
        assert!(
            book.rekeep([object(9)], []).is_empty(),
            "an unknown name releases nothing"
        );
    }

    #[test]
    fn the_directory_follows_what_nodes_say_they_hold() {
        let node = NodeId(uuid::Uuid::from_bytes([1; 16]));
        let mut book = ObjectBook::default();
        book.node_registered(node, None, [object(1)]);
        book.node_holds(node, object(2));
        assert!(book.directory().holds(node, object(1)));
        assert!(book.directory().holds(node, object(2)));
        book.node_dropped(node, object(1));
        assert!(!book.directory().holds(node, object(1)));
        assert_eq!(book.directory().held_count(node), 1);
    }
}
