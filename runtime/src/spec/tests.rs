//! Parsing, validation and rendering cases of the experiment spec.

use super::*;

const GOOD: &str = r#"
name: digits
team: vision
trial:
  command: ["python", "train.py", "--lr", "{lr}", "--seed={seed}"]
  workers: 2
  resources: {gpu: 1, cpu: 2, memory: 4GiB}
  max_retries: 2
search:
  algorithm: random
  space:
    lr: {loguniform: [0.0001, 0.1]}
    hidden: {choice: [16, 32, 64]}
    depth: {int: [1, 4]}
    dropout: {uniform: [0.0, 0.5]}
  metric: val_acc
  mode: max
  trials: 16
  parallel: 4
"#;

fn check_error(yaml: &str, expected_fragment: &str) {
    let error = ExperimentSpec::from_yaml(yaml)
        .expect_err("spec should be refused")
        .to_string();
    assert!(
        error.contains(expected_fragment),
        "error {error:?} lacks {expected_fragment:?}"
    );
}

#[test]
fn a_full_spec_parses() {
    let spec = ExperimentSpec::from_yaml(GOOD).unwrap();
    assert_eq!(spec.trial.workers, Workers::fixed(2));
    assert_eq!(spec.trial.resources.memory, MemoryBytes(4 << 30));
    assert_eq!(spec.trial.cpu_milli(), 2000);
    assert_eq!(spec.search.mode, Mode::Max);
    assert_eq!(spec.trial_count(), 16);
    assert_eq!(
        spec.search.space["hidden"].domain,
        Domain::Choice(vec![
            ParamValue::Int(16),
            ParamValue::Int(32),
            ParamValue::Int(64)
        ])
    );
}

#[test]
fn canonical_json_round_trips_and_ignores_spelling() {
    let spec = ExperimentSpec::from_yaml(GOOD).unwrap();
    let json = spec.to_canonical_json();
    assert_eq!(ExperimentSpec::from_json(&json).unwrap(), spec);
    let respelled = GOOD.replace("memory: 4GiB", "memory: 4294967296");
    assert_eq!(
        ExperimentSpec::from_yaml(&respelled)
            .unwrap()
            .to_canonical_json(),
        json
    );
}

#[test]
fn bad_specs_name_the_field() {
    check_error(&GOOD.replace("workers: 2", "workerz: 2"), "workerz");
    check_error(&GOOD.replace("workers: 2", "workerz: 2"), "line");
    check_error(&GOOD.replace("workers: 2", "workers: 0"), "trial.workers");
    check_error(
        &GOOD.replace("[0.0001, 0.1]", "[0.1, 0.0001]"),
        "search.space.lr",
    );
    check_error(&GOOD.replace("{lr}", "{learning_rate}"), "learning_rate");
    check_error(&GOOD.replace("memory: 4GiB", "memory: lots"), "memory");
    for bad_memory in ["memory: -1", "memory: 1.5", "memory: [1]"] {
        let text = GOOD.replace("memory: 4GiB", bad_memory);
        check_error(&text, "memory");
        check_error(
            &text,
            "size such as 16GiB or 512MB, or a whole number of bytes",
        );
        let message = ExperimentSpec::from_yaml(&text).unwrap_err().to_string();
        assert!(!message.contains("untagged"), "{message}");
    }
    for bad_priority in [
        "priority: 1e308",
        "priority: 2.5",
        "priority: 18446744073709551615",
    ] {
        let text = GOOD.replace("team: vision", &format!("team: vision\n{bad_priority}"));
        check_error(&text, "priority");
        check_error(&text, "a whole number");
        let message = ExperimentSpec::from_yaml(&text).unwrap_err().to_string();
        assert!(!message.contains("untagged"), "{message}");
    }
    let classed = GOOD.replace("team: vision", "team: vision\npriority: high");
    assert_eq!(
        ExperimentSpec::from_yaml(&classed).unwrap().priority,
        Priority::Class("high".to_owned())
    );
    check_error(&GOOD.replace("trials: 16", "trials: 0"), "search.trials");
    check_error(
        &GOOD.replace("algorithm: random", "algorithm: grid"),
        "search.space.dropout",
    );
    check_error(&GOOD.replace("mode: max", "mode: biggest"), "biggest");
    check_error("name: [unclosed", "invalid experiment spec");
    check_error("name: x\ntrial: {}\n", "trial");
    assert_eq!(
        ExperimentSpec::from_yaml("name: x\ntrial: {command: [echo]}\n")
            .unwrap()
            .trial_count(),
        1
    );
}

#[test]
fn grid_size_multiplies_discrete_domains() {
    let spec = ExperimentSpec::from_yaml(
            "name: g\ntrial: {command: [echo, '{a}', '{b}']}\nsearch:\n  algorithm: grid\n  space: {a: {int: [1, 3]}, b: {choice: [x, y]}}\n  seeds: 2\n",
        )
        .unwrap();
    assert_eq!(spec.trial_count(), 12);
}

#[test]
fn placeholders_render_and_escape() {
    let render = |arg: &str| render_arg(arg, |name| (name == "lr").then(|| "0.1".to_owned()));
    assert_eq!(render("--lr={lr}").unwrap(), "--lr=0.1");
    assert_eq!(render("{{lr}}").unwrap(), "{lr}");
    assert!(render("{nope}").is_err());
    assert_eq!(render("{lr").unwrap(), "{lr");
    assert_eq!(render(r#"{"loss": {lr}}"#).unwrap(), r#"{"loss": 0.1}"#);
    assert_eq!(render("${HOME} {1x}").unwrap(), "${HOME} {1x}");
}

fn search_yaml(search: &str) -> String {
    format!("name: s\ntrial: {{command: [echo]}}\nsearch:\n{search}")
}

const CONDITIONAL: &str = "  algorithm: tpe\n  trials: 20\n  space:\n    optimizer: {choice: [sgd, adam]}\n    momentum: {uniform: [0.0, 0.99], when: {optimizer: [sgd]}}\n    layers: {int: [1, 8], step: 1, log: true}\n    width: {int: [16, 256], step: 16}\n    lr: {loguniform: [0.0001, 0.1]}\n";

#[test]
fn conditional_step_and_log_parameters_parse_and_serialise_canonically() {
    let yaml = search_yaml(CONDITIONAL);
    let spec = ExperimentSpec::from_yaml(&yaml).unwrap();
    let space = &spec.search.space;
    assert_eq!(
        space["momentum"],
        ParamSpec::uniform(0.0, 0.99).when("optimizer", ["sgd"])
    );
    assert_eq!(space["layers"], ParamSpec::int(1, 8).log());
    assert_eq!(space["width"], ParamSpec::int(16, 256).step(16));
    let json = spec.to_canonical_json();
    assert!(
            json.contains(
                r#""space":{"layers":{"int":[1,8],"log":true},"lr":{"loguniform":[0.0001,0.1]},"momentum":{"uniform":[0.0,0.99],"when":{"optimizer":["sgd"]}},"optimizer":{"choice":["sgd","adam"]},"width":{"int":[16,256],"step":16}}"#
            ),
            "{json}"
        );
    assert_eq!(ExperimentSpec::from_json(&json).unwrap(), spec);
    // Defaults are left out of the canonical form, so they do not change identity.
    let respelled = yaml.replace("step: 1, log: true", "log: true, step: 1");
    assert_eq!(
        ExperimentSpec::from_yaml(&respelled)
            .unwrap()
            .to_canonical_json(),
        json
    );
    let defaults = yaml.replace(
        "{int: [1, 8], step: 1, log: true}",
        "{int: [1, 8], log: true}",
    );
    assert_eq!(
        ExperimentSpec::from_yaml(&defaults)
            .unwrap()
            .to_canonical_json(),
        json
    );
}

#[test]
fn plain_domains_keep_their_canonical_json() {
    let json = ExperimentSpec::from_yaml(GOOD).unwrap().to_canonical_json();
    assert!(
            json.contains(
                r#""search":{"algorithm":"random","space":{"depth":{"int":[1,4]},"dropout":{"uniform":[0.0,0.5]},"hidden":{"choice":[16,32,64]},"lr":{"loguniform":[0.0001,0.1]}},"metric":"val_acc""#
            ),
            "{json}"
        );
    let from_domains: SpaceSpec = [("a".to_owned(), Domain::Int([1, 2]))]
        .into_iter()
        .collect();
    assert_eq!(
        serde_json::to_string(&from_domains).unwrap(),
        r#"{"a":{"int":[1,2]}}"#
    );
}

#[test]
fn bad_parameters_name_the_parameter() {
    let check = |params: &str, fragment: &str| {
        check_error(
            &search_yaml(&format!(
                "  trials: 3\n  space:\n    opt: {{choice: [sgd, adam]}}\n{params}"
            )),
            fragment,
        );
    };
    let unknown_key = "    m: {uniform: [0, 1], whem: {opt: [sgd]}}\n";
    check(unknown_key, "search.space.m");
    check(unknown_key, "whem");
    check(unknown_key, "line");
    let unknown_parent = "    m: {uniform: [0, 1], when: {optt: [sgd]}}\n";
    check(unknown_parent, "search.space.m");
    check(unknown_parent, "unknown parameter `optt`");
    check(
        "    m: {uniform: [0, 1], when: {opt: [adamw]}}\n",
        "condition value adamw is not a value of `opt`",
    );
    check(
        "    a: {int: [0, 3], when: {b: [1]}}\n    b: {int: [0, 3], when: {a: [1]}}\n",
        "search.space.a`: conditions form a cycle",
    );
    check(
        "    k: {int: [0, 8], step: 0}\n",
        "search.space.k`: step must be at least 1",
    );
    check(
        "    k: {int: [0, 8], log: true}\n",
        "search.space.k`: a log scale needs bounds above 0",
    );
    check("    x: {uniform: [0, 1], step: 2}\n", "search.space.x");
    check(
        "    x: {uniform: [0, 1], log: true}\n",
        "`log` applies to `int`",
    );
    check("    x: {uniform: [0, 1], int: [0, 3]}\n", "exactly one of");
    check(
        "    x: {when: {opt: [sgd]}}\n",
        "search.space.x: needs one of",
    );
    check(
        "    m: {uniform: [0, 1], when: {opt: [sgd]}}\n    m2: {int: [1, 2], when: {m: [1]}}\n",
        "must be an int or choice",
    );
}

#[test]
fn algorithms_and_their_options_are_checked() {
    let space = "  space: {x: {uniform: [0, 1]}}\n";
    check_error(
        &search_yaml(&format!("  algorithm: gp\n{space}")),
        "gp search needs the number of trials",
    );
    check_error(
        &search_yaml(&format!(
            "  algorithm: tpe\n  trials: 4\n  acquisition: ei\n{space}"
        )),
        "search.acquisition",
    );
    check_error(
        &search_yaml(&format!(
            "  algorithm: sobol\n  trials: 4\n  kappa: 1\n{space}"
        )),
        "search.kappa",
    );
    check_error(
        &search_yaml(&format!(
            "  algorithm: gp\n  trials: 4\n  tpe: {{multivariate: true}}\n{space}"
        )),
        "search.tpe",
    );
    check_error(
        &search_yaml(&format!(
            "  algorithm: tpe\n  trials: 4\n  tpe: {{multivariate: true, group: true}}\n{space}"
        )),
        "group",
    );
    check_error(
        &search_yaml(&format!(
            "  algorithm: gp\n  trials: 4\n  acquisition: ei\n  kappa: 1\n{space}"
        )),
        "search.kappa",
    );
    check_error(
        &search_yaml(&format!(
            "  algorithm: gp\n  trials: 4\n  kappa: -1\n{space}"
        )),
        "search.kappa",
    );
    check_error(
        &search_yaml(&format!("  algorithm: bayes\n  trials: 4\n{space}")),
        "bayes",
    );
    for algorithm in ["sobol", "gp", "tpe"] {
        let spec = ExperimentSpec::from_yaml(&search_yaml(&format!(
            "  algorithm: {algorithm}\n  trials: 7\n  seeds: 2\n{space}"
        )))
        .unwrap();
        assert_eq!(spec.trial_count(), 14, "{algorithm}");
        assert_eq!(spec.search.algorithm.as_str(), algorithm);
        assert_eq!(spec.search.algorithm.is_adaptive(), algorithm != "sobol");
    }
}

#[test]
fn conditional_parameters_cannot_be_placeholders() {
    check_error(
        "name: c\ntrial: {command: [echo, '{m}']}\nsearch:\n  trials: 2\n  space:\n    opt: {choice: [a, b]}\n    m: {int: [1, 2], when: {opt: [a]}}\n",
        "names a conditional parameter",
    );
}

#[test]
fn grid_size_counts_conditional_parameters_where_active() {
    let spec = ExperimentSpec::from_yaml(&search_yaml(
            "  algorithm: grid\n  space:\n    opt: {choice: [sgd, adam]}\n    momentum: {int: [1, 3], when: {opt: [sgd]}}\n    width: {int: [0, 10], step: 5}\n",
        ))
        .unwrap();
    assert_eq!(spec.trial_count(), (3 + 1) * 3);
}

#[test]
fn a_metric_can_declare_what_a_unit_is_worth() {
    let spec = ExperimentSpec::from_yaml(&search_yaml(
        "  metric: acc\n  mode: max\n  value: {per_unit: 100.0}\n",
    ))
    .unwrap();
    assert_eq!(spec.search.value, Some(MetricValue { per_unit: 100.0 }));
    // Left out of the canonical JSON when absent, so identities stay as they were.
    let plain = ExperimentSpec::from_yaml(&search_yaml("  metric: acc\n")).unwrap();
    assert!(!plain.to_canonical_json().contains("value"));
    check_error(&search_yaml("  value: {per_unit: 1}\n"), "search.value");
    check_error(
        &search_yaml("  metric: acc\n  value: {per_unit: -1}\n"),
        "search.value.per_unit",
    );
    check_error(
        &search_yaml("  metric: acc\n  value: {per_unit: 1, currency: eur}\n"),
        "currency",
    );
}

#[test]
fn trial_leases_are_checked_and_left_out_of_canonical_json_when_absent() {
    let spec = ExperimentSpec::from_yaml(
        "name: l\ntrial:\n  command: [x]\n  resources: {gpu: 1, leases: {feature-store: 1, matlab-licence: 2}}\n",
    )
    .unwrap();
    assert_eq!(spec.trial.resources.leases["matlab-licence"], 2);
    let json = spec.to_canonical_json();
    assert_eq!(ExperimentSpec::from_json(&json).unwrap(), spec);
    let plain = ExperimentSpec::from_yaml("name: l\ntrial:\n  command: [x]\n").unwrap();
    assert!(!plain.to_canonical_json().contains("leases"));
    let base = "name: l\ntrial:\n  command: [x]\n  resources: {leases: ";
    check_error(&format!("{base}{{fs: 0}}}}\n"), "trial.resources.leases.fs");
    check_error(&format!("{base}{{'a b': 1}}}}\n"), "trial.resources.leases");
    check_error(
        &format!("{base}{{{}: 1}}}}\n", "x".repeat(65)),
        "longer than 64",
    );
    let many: Vec<String> = (0..17).map(|index| format!("l{index}: 1")).collect();
    check_error(
        &format!("{base}{{{}}}}}\n", many.join(", ")),
        "at most 16 leases",
    );
}

#[test]
fn elastic_workers_parse_validate_and_keep_plain_identities() {
    let elastic = GOOD.replace("workers: 2", "workers: {min: 2, max: 8}");
    let spec = ExperimentSpec::from_yaml(&elastic).unwrap();
    assert_eq!(spec.trial.workers, Workers { min: 2, max: 8 });
    assert!(spec.trial.workers.is_elastic());
    let json = spec.to_canonical_json();
    assert!(json.contains(r#""workers":{"min":2,"max":8}"#), "{json}");
    assert_eq!(ExperimentSpec::from_json(&json).unwrap(), spec);
    // A plain number stays a plain number in the canonical form (and so in
    // the experiment's identity), as does a range that is not one.
    let plain = ExperimentSpec::from_yaml(GOOD).unwrap().to_canonical_json();
    assert!(plain.contains(r#""workers":2"#), "{plain}");
    let degenerate = GOOD.replace("workers: 2", "workers: {min: 2, max: 2}");
    assert_eq!(
        ExperimentSpec::from_yaml(&degenerate)
            .unwrap()
            .to_canonical_json(),
        plain
    );
    for (bad, fragment) in [
        ("workers: {min: 0, max: 4}", "trial.workers"),
        (
            "workers: {min: 4, max: 2}",
            "min (4) must not exceed max (2)",
        ),
        ("workers: {min: 1, max: 100000}", "trial.workers"),
        ("workers: {min: 2}", "both `min` and `max`"),
        ("workers: {min: 2, max: 4, step: 1}", "step"),
        ("workers: {min: 2, min: 3, max: 4}", "min"),
        ("workers: 1.5", "whole number or {min: N, max: M}"),
        ("workers: -1", "whole number"),
        ("workers: [2, 4]", "workers"),
        ("workers: {min: two, max: 4}", "workers"),
    ] {
        check_error(&GOOD.replace("workers: 2", bad), fragment);
    }
}

#[test]
fn oversubscribe_needs_a_fraction_and_stays_out_of_canonical_json_when_off() {
    let yaml = "name: o\ntrial:\n  command: [x]\n  resources: {gpu: 0.45, oversubscribe: true}\n";
    let spec = ExperimentSpec::from_yaml(yaml).unwrap();
    assert!(spec.trial.resources.oversubscribe);
    let json = spec.to_canonical_json();
    assert!(json.contains(r#""oversubscribe":true"#), "{json}");
    assert_eq!(ExperimentSpec::from_json(&json).unwrap(), spec);
    // Off (or absent) writes nothing, so existing experiment ids are unchanged.
    let off = ExperimentSpec::from_yaml(&yaml.replace("true", "false")).unwrap();
    let plain =
        ExperimentSpec::from_yaml("name: o\ntrial:\n  command: [x]\n  resources: {gpu: 0.45}\n")
            .unwrap();
    assert_eq!(off.to_canonical_json(), plain.to_canonical_json());
    assert!(!plain.to_canonical_json().contains("oversubscribe"));
    for gpu in ["2", "1", "0"] {
        check_error(
            &yaml.replace("0.45", gpu),
            "`trial.resources.oversubscribe`: needs a fraction of one GPU (0 < gpu < 1)",
        );
    }
    check_error(
        &yaml.replace("oversubscribe: true", "oversubscribe: 2"),
        "oversubscribe",
    );
}

#[test]
fn a_commands_directory_is_filled_in_from_where_it_was_submitted() {
    let check = |yaml: &str, base: &str, expected: Option<&str>| {
        let mut spec = ExperimentSpec::from_yaml(yaml).unwrap();
        spec.trial.fill_command_dir(std::path::Path::new(base));
        assert_eq!(
            spec.trial.command_dir.as_deref(),
            expected,
            "{yaml} from {base}"
        );
    };
    let command = "name: a\ntrial: {command: [python3, train.py]}\n";
    check(command, "/home/me/proj", Some("/home/me/proj"));
    check(command, "/home/me/./proj/", Some("/home/me/proj"));
    check(command, "relative", None);
    let own = "name: a\ntrial: {command: [python3, train.py], command_dir: src}\n";
    check(own, "/home/me/proj", Some("/home/me/proj/src"));
    let absolute = "name: a\ntrial: {command: [python3, train.py], command_dir: /srv/code}\n";
    check(absolute, "/home/me/proj", Some("/srv/code"));
    check("name: a\ntrial: {entry: digits}\n", "/home/me/proj", None);
    check_error(
        "name: a\ntrial: {entry: digits, command_dir: /srv}\n",
        "invalid value for `trial.command_dir`: is only meaningful with `command`",
    );
    // Unset, it leaves the canonical JSON (and with it the identity) as it was.
    let spec = ExperimentSpec::from_yaml(command).unwrap();
    assert!(!spec.to_canonical_json().contains("command_dir"));
}
