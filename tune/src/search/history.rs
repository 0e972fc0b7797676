//! The bookkeeping every adaptive searcher shares: ids, pending suggestions and
//! observations, in the order they happened.
//!
//! Tolerant by design, as the drivers may race: a `tell` or `forget` of an id that is
//! not pending (unknown, already told, forgotten) is ignored, and a non-finite
//! objective counts as a failure, so it yields no observation.

use std::collections::BTreeMap;

use xp_runtime::spec::Config;

use super::Suggestion;

/// One evaluated configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observation {
    pub(crate) config: Config,
    pub(crate) objective: f64,
}

/// Suggestions handed out and what became of them.
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    next_id: u64,
    /// Suggestions asked and not yet told or forgotten, by id (so in asking order).
    pending: BTreeMap<u64, Config>,
    /// Told suggestions in telling order.
    observed: Vec<Observation>,
}

impl History {
    /// Records `config` as pending under a fresh id.
    pub(crate) fn issue(&mut self, config: Config) -> Suggestion {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, config.clone());
        Suggestion { id, config }
    }

    /// Turns pending suggestion `id` into an observation.
    pub(crate) fn tell(&mut self, id: u64, objective: f64) {
        if let Some(config) = self.pending.remove(&id)
            && objective.is_finite()
        {
            self.observed.push(Observation { config, objective });
        }
    }

    /// Drops pending suggestion `id` without an observation.
    pub(crate) fn forget(&mut self, id: u64) {
        self.pending.remove(&id);
    }

    pub(crate) fn observed(&self) -> &[Observation] {
        &self.observed
    }

    /// Pending configurations in asking order.
    pub(crate) fn pending(&self) -> impl Iterator<Item = &Config> {
        self.pending.values()
    }

    /// Whether `config` was already observed or is pending.
    pub(crate) fn is_known(&self, config: &Config) -> bool {
        self.pending.values().any(|pending| pending == config)
            || self
                .observed
                .iter()
                .any(|observation| &observation.config == config)
    }
}
