//! Turning a search specification into trial configurations.
//!
//! Pure and deterministic: the same [`SearchSpec`] (including its seed) always
//! yields the same configurations in the same order, so an experiment's content
//! hash fixes its trials.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::spec::{Algorithm, Domain, ParamValue, SearchSpec};

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
pub fn plan_trials(search: &SearchSpec) -> Vec<TrialPlan> {
    let configs = match search.algorithm {
        Algorithm::Grid => grid(&search.space),
        Algorithm::Random => random(&search.space, search.trials.unwrap_or(1), search.seed),
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

fn grid(space: &BTreeMap<String, Domain>) -> Vec<BTreeMap<String, ParamValue>> {
    let mut points = vec![BTreeMap::new()];
    for (name, domain) in space {
        let values: Vec<ParamValue> = match domain {
            Domain::Int([lo, hi]) => (*lo..=*hi).map(ParamValue::Int).collect(),
            Domain::Choice(values) => values.clone(),
            Domain::Uniform(_) | Domain::Loguniform(_) => {
                unreachable!("validation refuses continuous domains in a grid")
            }
        };
        points = points
            .into_iter()
            .flat_map(|point| {
                values.iter().map(move |value| {
                    let mut next = point.clone();
                    next.insert(name.clone(), value.clone());
                    next
                })
            })
            .collect();
    }
    points
}

fn random(
    space: &BTreeMap<String, Domain>,
    trials: u32,
    seed: u64,
) -> Vec<BTreeMap<String, ParamValue>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..trials)
        .map(|_| {
            space
                .iter()
                .map(|(name, domain)| (name.clone(), sample(domain, &mut rng)))
                .collect()
        })
        .collect()
}

fn sample(domain: &Domain, rng: &mut StdRng) -> ParamValue {
    match domain {
        Domain::Uniform([lo, hi]) => ParamValue::Float(rng.random_range(*lo..=*hi)),
        Domain::Loguniform([lo, hi]) => {
            ParamValue::Float(rng.random_range(lo.ln()..=hi.ln()).exp().clamp(*lo, *hi))
        }
        Domain::Int([lo, hi]) => ParamValue::Int(rng.random_range(*lo..=*hi)),
        Domain::Choice(values) => values[rng.random_range(0..values.len())].clone(),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::spec::ExperimentSpec;

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
