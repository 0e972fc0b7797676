//! Turning a search specification into trial configurations up front.
//!
//! Pure and deterministic: the same [`SearchSpec`] (including its seed) always
//! yields the same configurations in the same order, so an experiment's content
//! hash fixes its trials. Grid, random and Sobol searches are planned here; the
//! adaptive ones (`gp`, `tpe`) depend on results and are driven through
//! [`super::Searcher`] instead, so they plan no trials.

use std::collections::BTreeMap;

use xp_runtime::spec::{Config, SearchSpace};

use super::{GridSearcher, RandomSearcher, Searcher, SobolSearcher};
use xp_runtime::spec::{Algorithm, ParamValue, SearchSpec};

/// One trial's parameters and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialPlan {
    /// Parameter values by name.
    pub params: BTreeMap<String, ParamValue>,
    /// The replicate seed, exposed to the trial as `XP_SEED`.
    pub seed: u64,
}

impl TrialPlan {
    /// The configuration as the trial sees it in `XP_CONFIG`: the parameters plus `seed`.
    pub fn config_json(&self) -> String {
        let mut object = serde_json::Map::new();
        for (name, value) in &self.params {
            object.insert(
                name.clone(),
                serde_json::to_value(value).expect("parameter values are plain data"),
            );
        }
        object.insert("seed".to_owned(), serde_json::Value::from(self.seed));
        serde_json::Value::Object(object).to_string()
    }
}

/// All trials of a validated search, replicates of one configuration adjacent.
///
/// Empty for the adaptive algorithms (`gp`, `tpe`, see
/// [`Algorithm::is_adaptive`]): their configurations come from
/// [`super::make_searcher`] one `ask` at a time.
pub fn plan_trials(search: &SearchSpec) -> Vec<TrialPlan> {
    let space = SearchSpace::from_spec(&search.space).expect("the search spec was validated");
    let trials = search.trials.unwrap_or(1) as usize;
    let configs: Vec<Config> = match search.algorithm {
        Algorithm::Grid => drain(GridSearcher::new(&space, search.seed), usize::MAX),
        Algorithm::Random => drain(RandomSearcher::new(space, search.seed), trials),
        Algorithm::Sobol => drain(SobolSearcher::new(space, search.seed), trials),
        Algorithm::Gp | Algorithm::Tpe | Algorithm::Bohb => Vec::new(),
    };
    configs
        .into_iter()
        .flat_map(|params| {
            (0..u64::from(search.seeds)).map(move |replicate| TrialPlan {
                params: params.clone(),
                seed: search.seed.wrapping_add(replicate),
            })
        })
        .collect()
}

/// Up to `limit` configurations of a non-adaptive searcher.
fn drain(mut searcher: impl Searcher, limit: usize) -> Vec<Config> {
    std::iter::from_fn(|| searcher.ask())
        .take(limit)
        .map(|suggestion| suggestion.config)
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use xp_runtime::spec::ExperimentSpec;

    fn search(yaml_search: &str) -> SearchSpec {
        let yaml = format!("name: s\ntrial: {{command: [echo]}}\nsearch:\n{yaml_search}");
        ExperimentSpec::from_yaml(&yaml).unwrap().search
    }

    #[test]
    fn grid_enumerates_every_combination_with_replicates() {
        let plans = plan_trials(&search(
            "  algorithm: grid\n  space: {a: {int: [1, 2]}, b: {choice: [x, y, z]}}\n  seeds: 2\n  seed: 7\n",
        ));
        assert_eq!(plans.len(), 12);
        assert_eq!(plans[0].seed, 7);
        assert_eq!(plans[1].seed, 8);
        assert_eq!(plans[0].params, plans[1].params);
        assert_eq!(plans[0].config_json(), r#"{"a":1,"b":"x","seed":7}"#);
    }

    #[test]
    fn an_empty_space_is_one_trial() {
        let plans = plan_trials(&SearchSpec::default());
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].config_json(), r#"{"seed":0}"#);
    }

    proptest! {
        #[test]
        fn random_samples_stay_in_their_domains(seed in any::<u64>(), trials in 1u32..50) {
            let spec = search(&format!(
                "  space: {{u: {{uniform: [-1.5, 2.0]}}, l: {{loguniform: [0.001, 10]}}, i: {{int: [-3, 3]}}, c: {{choice: [a, 2, true]}}}}\n  trials: {trials}\n  seed: {seed}\n"
            ));
            let plans = plan_trials(&spec);
            prop_assert_eq!(plans.len(), trials as usize);
            prop_assert_eq!(&plans, &plan_trials(&spec), "sampling is deterministic");
            for plan in plans {
                match plan.params["u"] { ParamValue::Float(x) => prop_assert!((-1.5..=2.0).contains(&x)), ref other => prop_assert!(false, "{other:?}") }
                match plan.params["l"] { ParamValue::Float(x) => prop_assert!((0.001..=10.0).contains(&x)), ref other => prop_assert!(false, "{other:?}") }
                match plan.params["i"] { ParamValue::Int(x) => prop_assert!((-3..=3).contains(&x)), ref other => prop_assert!(false, "{other:?}") }
                prop_assert!(matches!(&plan.params["c"], ParamValue::Str(s) if s == "a") || plan.params["c"] == ParamValue::Int(2) || plan.params["c"] == ParamValue::Bool(true));
            }
        }
    }
}
