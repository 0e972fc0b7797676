//! The bookkeeping every adaptive searcher shares: ids, pending suggestions and
//! observations, in the order they happened.
//!
//! Tolerant by design, as the drivers may race: a `tell` or `forget` of an id that is
//! not pending (unknown, already told, forgotten) is ignored, and a non-finite
//! objective counts as a failure, so it yields no observation.

use std::collections::BTreeMap;

use xp_runtime::spec::{Config, SearchSpace};

use super::Suggestion;

/// One evaluated configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observation {
    pub(crate) config: Config,
    pub(crate) objective: f64,
}

/// Configurations encoded in a search space's unit cube (`None`: a parameter
/// the configuration does not set).
pub(crate) type Encoded = Vec<Vec<Option<f64>>>;

/// Splits `observed` into its `n_good` lowest objectives and the rest (ties
/// keep the order of observation) and encodes both in `space`, the rest
/// followed by `pending`: the two sides a Parzen model is fitted on. With
/// `by_age` each side is in observation order (the joint estimators weigh
/// observations by age); else the good side is in objective order.
pub(crate) fn split_encoded<'a>(
    space: &SearchSpace,
    observed: &'a [Observation],
    n_good: usize,
    pending: impl Iterator<Item = &'a Config>,
    by_age: bool,
) -> (Encoded, Encoded) {
    let mut order: Vec<usize> = (0..observed.len()).collect();
    order.sort_by(|left, right| {
        observed[*left]
            .objective
            .total_cmp(&observed[*right].objective)
    });
    let (good_idx, rest_idx) = order.split_at_mut(n_good.min(observed.len()));
    if by_age {
        good_idx.sort_unstable();
        rest_idx.sort_unstable();
    }
    let good = good_idx
        .iter()
        .map(|idx| space.encode(&observed[*idx].config))
        .collect();
    let rest = rest_idx
        .iter()
        .map(|idx| &observed[*idx].config)
        .chain(pending)
        .map(|config| space.encode(config))
        .collect();
    (good, rest)
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
