//! Unit and property tests of the search space.

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn must_build(builder: SpaceBuilder) -> SearchSpace {
    builder.build().expect("a valid space")
}

fn check_error(builder: SpaceBuilder, param: &str, reason: ParamError) {
    assert_eq!(
        builder.build(),
        Err(SpaceError {
            param: param.to_owned(),
            reason
        })
    );
}

/// Every kind of parameter, two levels of conditions, names that sort children first.
fn rich_space() -> SearchSpace {
    must_build(
        SearchSpace::builder()
            .uniform("x", -1.5, 2.0)
            .loguniform("lr", 1e-4, 1e-1)
            .param("layers", ParamSpec::int(1, 100).log())
            .param("width", ParamSpec::int(16, 256).step(16))
            .choice("z_optimizer", ["sgd", "adam", "rmsprop"])
            .param(
                "a_momentum",
                ParamSpec::uniform(0.0, 0.99).when("z_optimizer", ["sgd", "rmsprop"]),
            )
            .param(
                "a_nesterov",
                ParamSpec::choice([true, false]).when("z_optimizer", ["sgd"]),
            )
            .param("b_damping", ParamSpec::int(0, 3).when("a_nesterov", [true])),
    )
}

fn names(space: &SearchSpace) -> Vec<&str> {
    space.params().iter().map(Param::name).collect()
}

#[test]
fn parents_come_before_children_and_ties_go_by_name() {
    assert_eq!(
        names(&rich_space()),
        [
            "layers",
            "lr",
            "width",
            "x",
            "z_optimizer",
            "a_momentum",
            "a_nesterov",
            "b_damping"
        ]
    );
}

#[test]
fn bad_parameters_are_refused_by_name() {
    let builder = SearchSpace::builder;
    check_error(
        builder().uniform("x", 1.0, 1.0),
        "x",
        ParamError::UniformBounds,
    );
    check_error(
        builder().loguniform("x", 0.0, 1.0),
        "x",
        ParamError::LoguniformBounds,
    );
    check_error(builder().int("k", 3, 2), "k", ParamError::IntBounds);
    check_error(
        builder().int("k", i64::MIN, i64::MAX),
        "k",
        ParamError::IntTooWide,
    );
    check_error(
        builder().param("k", ParamSpec::int(0, 8).step(0)),
        "k",
        ParamError::StepNotPositive { step: 0 },
    );
    check_error(
        builder().param("k", ParamSpec::int(0, 8).step(-2)),
        "k",
        ParamError::StepNotPositive { step: -2 },
    );
    check_error(
        builder().param("k", ParamSpec::int(0, 8).log()),
        "k",
        ParamError::LogNotPositive,
    );
    check_error(
        builder().param("k", ParamSpec::int(1, 8).log().step(2)),
        "k",
        ParamError::LogWithStep,
    );
    check_error(
        builder().param("x", ParamSpec::uniform(0.0, 1.0).step(2)),
        "x",
        ParamError::StepNotInt,
    );
    check_error(
        builder().param("x", ParamSpec::loguniform(0.1, 1.0).log()),
        "x",
        ParamError::LogNotInt,
    );
    check_error(
        builder().choice("c", Vec::<ParamValue>::new()),
        "c",
        ParamError::EmptyChoice,
    );
    check_error(
        builder().choice("c", [1.0, f64::NAN]),
        "c",
        ParamError::NonFiniteChoice,
    );
    check_error(
        builder().int("k", 1, 2).uniform("k", 0.0, 1.0),
        "k",
        ParamError::Duplicate,
    );
}

#[test]
fn bad_conditions_are_refused_by_name() {
    let builder = || {
        SearchSpace::builder()
            .choice("opt", ["sgd", "adam"])
            .uniform("x", 0.0, 1.0)
    };
    check_error(
        builder().param("m", ParamSpec::uniform(0.0, 1.0).when("optt", ["sgd"])),
        "m",
        ParamError::UnknownParent {
            parent: "optt".to_owned(),
        },
    );
    check_error(
        builder().param("m", ParamSpec::uniform(0.0, 1.0).when("x", [0.5])),
        "m",
        ParamError::ParentNotDiscrete {
            parent: "x".to_owned(),
        },
    );
    check_error(
        builder().param("m", ParamSpec::uniform(0.0, 1.0).when("opt", ["adamw"])),
        "m",
        ParamError::ValueOutsideParent {
            parent: "opt".to_owned(),
            value: "adamw".into(),
        },
    );
    check_error(
        builder().param(
            "m",
            ParamSpec::uniform(0.0, 1.0).when("opt", Vec::<ParamValue>::new()),
        ),
        "m",
        ParamError::EmptyCondition {
            parent: "opt".to_owned(),
        },
    );
    check_error(
        builder().param("m", ParamSpec::int(0, 3).when("m", [1])),
        "m",
        ParamError::ConditionCycle,
    );
    check_error(
        builder()
            .param("a", ParamSpec::int(0, 3).when("b", [1]))
            .param("b", ParamSpec::int(0, 3).when("c", [1]))
            .param("c", ParamSpec::int(0, 3).when("b", [2]))
            .param("d", ParamSpec::int(0, 3).when("opt", ["sgd"])),
        "b",
        ParamError::ConditionCycle,
    );
    check_error(
        builder()
            .param("m", ParamSpec::uniform(0.0, 1.0).when("k", [3]))
            .param("k", ParamSpec::int(0, 8).step(2)),
        "m",
        ParamError::ValueOutsideParent {
            parent: "k".to_owned(),
            value: ParamValue::Int(3),
        },
    );
}

#[test]
fn activity_follows_the_parents() {
    let space = rich_space();
    let config = |pairs: &[(&str, ParamValue)]| -> Config {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), value.clone()))
            .collect()
    };
    let active_names = |config: &Config| -> Vec<&str> {
        space
            .active(config)
            .iter()
            .zip(space.params())
            .filter(|(active, _)| **active)
            .map(|(_, param)| param.name())
            .collect()
    };
    let base = ["layers", "lr", "width", "x", "z_optimizer"];
    assert_eq!(
        active_names(&config(&[("z_optimizer", "adam".into())])),
        base
    );
    assert_eq!(
        active_names(&config(&[("z_optimizer", "rmsprop".into())])),
        [&base[..], &["a_momentum"]].concat()
    );
    assert_eq!(
        active_names(&config(&[
            ("z_optimizer", "sgd".into()),
            ("a_nesterov", false.into())
        ])),
        [&base[..], &["a_momentum", "a_nesterov"]].concat()
    );
    assert_eq!(
        active_names(&config(&[
            ("z_optimizer", "sgd".into()),
            ("a_nesterov", true.into())
        ])),
        [&base[..], &["a_momentum", "a_nesterov", "b_damping"]].concat()
    );
}

fn check_unit(param: &Param, value: ParamValue, unit: f64) {
    let got = param.to_unit(&value).expect("a value of the parameter");
    assert!((got - unit).abs() < 1e-12, "{value:?}: {got} != {unit}");
    assert_eq!(param.from_unit(got), value);
}

#[test]
fn unit_positions_are_log_aware_and_centre_discrete_cells() {
    let space = rich_space();
    let param = |name: &str| &space.params()[space.index_of(name).unwrap()];
    check_unit(param("x"), ParamValue::Float(-1.5), 0.0);
    check_unit(param("x"), ParamValue::Float(2.0), 1.0);
    check_unit(param("lr"), ParamValue::Float(1e-4), 0.0);
    assert!((param("lr").to_unit(&ParamValue::Float(1e-2)).unwrap() - 2.0 / 3.0).abs() < 1e-12);
    check_unit(param("width"), ParamValue::Int(16), 0.5 / 16.0);
    check_unit(param("width"), ParamValue::Int(256), 15.5 / 16.0);
    assert_eq!(param("width").from_unit(0.0), ParamValue::Int(16));
    assert_eq!(param("width").from_unit(1.0), ParamValue::Int(256));
    check_unit(param("z_optimizer"), "adam".into(), 0.5);
    assert_eq!(param("layers").from_unit(0.0), ParamValue::Int(1));
    assert_eq!(param("layers").from_unit(1.0), ParamValue::Int(100));
    // Each integer owns [k - 0.5, k + 0.5] on the log scale, so the midpoint of
    // 1..=100 is √(0.5 · 100.5) ≈ 7.1.
    assert_eq!(param("layers").from_unit(0.5), ParamValue::Int(7));
    assert_eq!(param("x").to_unit(&"nope".into()), None);
    assert_eq!(param("z_optimizer").to_unit(&"adamw".into()), None);
}

#[test]
fn every_integer_value_is_reachable_and_round_trips() {
    let space = must_build(
        SearchSpace::builder()
            .param("a", ParamSpec::int(1, 40).log())
            .param("b", ParamSpec::int(-7, 30).step(4))
            .int("c", 5, 5),
    );
    for param in space.params() {
        for value in param.grid_values().unwrap() {
            let unit = param.to_unit(&value).unwrap();
            assert_eq!(param.from_unit(unit), value);
            let (low, high) = param.unit_cell(unit);
            assert!(low <= unit && unit <= high);
            assert_eq!(param.from_unit(low + 1e-9), value, "{low}");
            assert_eq!(param.from_unit(high - 1e-9), value, "{high}");
        }
    }
    assert_eq!(
        space.params()[1].grid_values().unwrap().last(),
        Some(&ParamValue::Int(29))
    );
}

#[test]
fn grids_respect_conditions() {
    let space = must_build(
        SearchSpace::builder()
            .choice("opt", ["sgd", "adam"])
            .param("momentum", ParamSpec::int(1, 2).when("opt", ["sgd"]))
            .param("width", ParamSpec::int(0, 10).step(5)),
    );
    let grid = space.grid().unwrap();
    let rendered: Vec<String> = grid
        .iter()
        .map(|config| serde_json::to_string(config).unwrap())
        .collect();
    assert_eq!(
        rendered,
        [
            r#"{"momentum":1,"opt":"sgd","width":0}"#,
            r#"{"momentum":1,"opt":"sgd","width":5}"#,
            r#"{"momentum":1,"opt":"sgd","width":10}"#,
            r#"{"momentum":2,"opt":"sgd","width":0}"#,
            r#"{"momentum":2,"opt":"sgd","width":5}"#,
            r#"{"momentum":2,"opt":"sgd","width":10}"#,
            r#"{"opt":"adam","width":0}"#,
            r#"{"opt":"adam","width":5}"#,
            r#"{"opt":"adam","width":10}"#,
        ]
    );
    assert_eq!(grid.len(), 9);
    assert_eq!(space.grid_len(), Some(9));
    assert!(grid.iter().all(|config| space.contains(config)));
}

#[test]
fn grid_length_counts_nested_conditions_without_enumerating_leaves() {
    let space = rich_space();
    assert_eq!(space.grid_len(), None, "reals have no grid");
    assert_eq!(
        space.grid(),
        Err(SpaceError {
            param: "lr".to_owned(),
            reason: ParamError::Continuous
        })
    );
    let space = must_build(
        SearchSpace::builder()
            .choice("opt", ["sgd", "adam", "rmsprop"])
            .param(
                "nesterov",
                ParamSpec::choice([true, false]).when("opt", ["sgd"]),
            )
            .param("damping", ParamSpec::int(0, 3).when("nesterov", [true]))
            .param(
                "alpha",
                ParamSpec::int(1, 5).when("opt", ["rmsprop", "sgd"]),
            )
            .int("big", 1, 1_000_000),
    );
    // sgd: nesterov true (4 dampings) or false, times 5 alphas; adam: 1; rmsprop: 5.
    let expected = ((4 + 1) * 5 + 1 + 5) * 1_000_000;
    assert_eq!(space.grid_len(), Some(expected));
    let small = must_build(
        SearchSpace::builder()
            .choice("opt", ["sgd", "adam", "rmsprop"])
            .param(
                "nesterov",
                ParamSpec::choice([true, false]).when("opt", ["sgd"]),
            )
            .param("damping", ParamSpec::int(0, 3).when("nesterov", [true]))
            .param(
                "alpha",
                ParamSpec::int(1, 5).when("opt", ["rmsprop", "sgd"]),
            ),
    );
    assert_eq!(small.grid().unwrap().len(), expected / 1_000_000);
    assert_eq!(
        must_build(
            SearchSpace::builder()
                .int("a", 0, i64::from(u32::MAX))
                .int("b", 0, i64::from(u32::MAX))
                .int("c", 0, i64::from(u32::MAX))
        )
        .grid_len(),
        None,
        "overflow"
    );
}

#[test]
fn unconditional_sampling_draws_as_the_first_planner_did() {
    // The planner before conditional spaces drew each parameter in name order.
    let space = must_build(
        SearchSpace::builder()
            .uniform("u", -1.5, 2.0)
            .loguniform("l", 0.001, 10.0)
            .int("i", -3, 3)
            .choice("c", ["a", "b"]),
    );
    let mut rng = StdRng::seed_from_u64(11);
    let mut old_rng = StdRng::seed_from_u64(11);
    for _ in 0..20 {
        let config = space.sample(&mut rng);
        let c = ["a", "b"][old_rng.random_range(0..2)];
        let i = old_rng.random_range(-3..=3);
        let l = old_rng
            .random_range(0.001f64.ln()..=10f64.ln())
            .exp()
            .clamp(0.001, 10.0);
        let u = old_rng.random_range(-1.5..=2.0);
        assert_eq!(config["c"], c.into());
        assert_eq!(config["i"], ParamValue::Int(i));
        assert_eq!(config["l"], ParamValue::Float(l));
        assert_eq!(config["u"], ParamValue::Float(u));
    }
}

#[test]
fn the_empty_space_has_one_empty_configuration() {
    let space = must_build(SearchSpace::builder());
    assert!(space.is_empty());
    assert_eq!(space.grid().unwrap(), vec![Config::new()]);
    assert_eq!(space.grid_len(), Some(1));
    assert_eq!(space.decode(&[]), Config::new());
    assert!(space.contains(&Config::new()));
}

#[test]
fn contains_refuses_missing_extra_and_out_of_domain_values() {
    let space = rich_space();
    let mut config = space.sample(&mut StdRng::seed_from_u64(3));
    assert!(space.contains(&config));
    config.insert("extra".to_owned(), ParamValue::Int(1));
    assert!(!space.contains(&config));
    config.remove("extra");
    config.insert("width".to_owned(), ParamValue::Int(17));
    assert!(!space.contains(&config));
    config.insert("width".to_owned(), ParamValue::Int(32));
    config.remove("x");
    assert!(!space.contains(&config));
}

fn check_close(left: &Config, right: &Config) {
    assert_eq!(
        left.keys().collect::<Vec<_>>(),
        right.keys().collect::<Vec<_>>()
    );
    for (name, value) in left {
        match (value, &right[name]) {
            (ParamValue::Float(a), ParamValue::Float(b)) => {
                assert!(
                    (a - b).abs() <= 1e-9 * a.abs().max(1.0),
                    "{name}: {a} != {b}"
                );
            }
            (a, b) => assert_eq!(a, b, "{name}"),
        }
    }
}

proptest! {
    #[test]
    fn samples_lie_in_their_domains_and_respect_conditions(seed in any::<u64>()) {
        let space = rich_space();
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..20 {
            let config = space.sample(&mut rng);
            prop_assert!(space.contains(&config), "{config:?}");
            let optimizer = config["z_optimizer"].clone();
            prop_assert_eq!(config.contains_key("a_momentum"), optimizer != "adam".into());
            prop_assert_eq!(config.contains_key("a_nesterov"), optimizer == "sgd".into());
            prop_assert_eq!(
                config.contains_key("b_damping"),
                config.get("a_nesterov") == Some(&ParamValue::Bool(true))
            );
        }
    }

    #[test]
    fn decoded_points_lie_in_the_space(point in proptest::collection::vec(0.0f64..=1.0, 8)) {
        let space = rich_space();
        let config = space.decode(&point);
        prop_assert!(space.contains(&config), "{config:?}");
    }

    #[test]
    fn encode_then_decode_gives_the_config_back(seed in any::<u64>()) {
        let space = rich_space();
        let config = space.sample(&mut StdRng::seed_from_u64(seed));
        let point: Vec<f64> = space.encode(&config).into_iter().map(|unit| unit.unwrap_or(0.5)).collect();
        check_close(&space.decode(&point), &config);
        let active = space.active(&config);
        for (unit, active) in space.encode(&config).iter().zip(active) {
            prop_assert_eq!(unit.is_some(), active);
        }
    }
}
