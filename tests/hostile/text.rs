//! Targets for the text formats that come from outside: join strings, ids typed
//! on a command line or in a URL, metric and checkpoint lines a worker prints,
//! experiment specs (YAML, and the JSON form on the wire), search spaces for
//! `xp tune`, policy files, `xp sim`'s cluster and trace files, and the HTTP
//! API's cursors and filters.

use std::str::FromStr;

use xp_runtime::ids::{BlobHash, ExperimentId, NodeId, ObjectId, TrialId};
use xp_runtime::join::JoinString;
use xp_runtime::metric_line::{MAX_METRIC_LINE, parse_checkpoint_line, parse_metric_line};
use xp_runtime::spec::{ExperimentSpec, MAX_SPEC_BYTES, SearchSpace, SpaceSpec};
use xp_sched::PolicyConfig;
use xp_sched::sim::cluster::MAX_NODES;
use xp_sched::sim::{parse_cluster_csv, parse_cluster_yaml, parse_trace};

use super::{Target, measure, run, text_inputs};

/// YAML's syntax and the values that break numbers: anchors and aliases (the
/// billion-laughs route), flow and block collections, tags, multi-documents.
const YAML_TOKENS: &[&str] = &[
    "&a ",
    "*a",
    "&b [*a, *a, *a, *a]",
    "<<: *a\n",
    "[",
    "]",
    "{",
    "}",
    ", ",
    "\n",
    "\n  ",
    "\n- ",
    "- ",
    ": ",
    "? ",
    "'",
    "\"",
    "\\",
    "!!binary ",
    "!!str ",
    "!!int ",
    "!custom ",
    "|\n  ",
    ">-\n  ",
    "---\n",
    "...\n",
    "# c\n",
    "%YAML 1.2\n---\n",
    "~",
    "null",
    "true",
    "1e400",
    "-0",
    "0x7fffffffffffffff",
    "18446744073709551616",
    "-9223372036854775809",
    ".nan",
    ".inf",
    "-.inf",
    "99999999",
    "4GiB",
    "1e18",
    "\t",
    "\u{feff}",
    "\u{0}",
    "é",
    "{lr}",
    "${x}",
    "name",
    "team",
    "trial",
    "search",
    "space",
    "when",
    "choice",
    "int",
    "grid",
    "trials",
    "nodes",
    "count",
    "queues",
    "quota",
    "gpu",
    "labels",
    "workers",
    "resources",
];

/// CSV's syntax and hostile field values.
const CSV_TOKENS: &[&str] = &[
    ",",
    "\n",
    "\r\n",
    "\"",
    "\"\"",
    " ",
    ";",
    "j0",
    "team-1",
    "true",
    "false",
    "-1",
    "0",
    "1e400",
    "NaN",
    "inf",
    "18446744073709551616",
    "4294967296",
    "99999999999",
    "A100",
    "r1",
    "\u{0}",
    "é",
    "1.5",
    "job_id",
    "deps",
    "rack",
];

/// URL syntax for join strings.
const URL_TOKENS: &[&str] = &[
    "xp://",
    "http://",
    "%",
    "%ff",
    "%00",
    "[",
    "]",
    "::",
    ":",
    "@",
    "?",
    "&",
    "=",
    "#",
    "token=",
    "ca=",
    ":65536",
    ":0",
    "..",
    "/",
    "\\",
    " ",
    "é",
    "xn--",
    "255.255.255.255",
    "0x7f.1",
    "ab",
];

/// JSON for metric and checkpoint lines.
const JSON_TOKENS: &[&str] = &[
    "XP_METRIC ",
    "XP_CHECKPOINT ",
    "{",
    "}",
    "[",
    "]",
    "\"step\"",
    "\"loss\"",
    ": ",
    ",",
    "null",
    "true",
    "1e400",
    "-1",
    "18446744073709551616",
    "0.5",
    "\"\\ud800\"",
    "\\",
    "\"",
    "\n",
    "[[[[[[[[",
    "{\"a\":",
    "-0",
    "1E-400",
];

fn lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

fn corpus(texts: &[&str]) -> Vec<Vec<u8>> {
    texts.iter().map(|text| text.as_bytes().to_vec()).collect()
}

#[test]
fn join_strings() {
    let ca = "ab".repeat(32);
    let texts = [
        format!("xp://127.0.0.1:4100?token=abc123&ca={ca}"),
        format!("xp://[::1]:9?token=t&ca={ca}"),
        format!("xp://head.example.org:4100?ca={ca}&token=s3cr3t%20x"),
    ];
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let target = Target {
        name: "join string",
        cases: 4000,
        limit: 64 << 10,
        per_input_byte: 16,
    };
    run(&target, text_inputs(corpus(&texts), URL_TOKENS), |bytes| {
        JoinString::from_str(&lossy(bytes)).is_ok()
    });
}

#[test]
fn ids() {
    let trial = TrialId {
        experiment: ExperimentId {
            digest: 0xfeed_beef_0000_0001,
            run: 3,
        },
        index: 12,
    };
    let texts = [
        trial.experiment.to_string(),
        trial.to_string(),
        "6f1c2a4e-1d2b-4c3d-8e9f-0a1b2c3d4e5f".to_owned(),
        BlobHash([0xab; 32]).to_string(),
        ObjectId([0xcd; 32]).to_string(),
    ];
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let target = Target {
        name: "ids (experiment, trial, node, blob, object)",
        cases: 4000,
        limit: 16 << 10,
        per_input_byte: 8,
    };
    run(&target, text_inputs(corpus(&texts), URL_TOKENS), |bytes| {
        let text = lossy(bytes);
        [
            ExperimentId::from_str(&text).is_ok(),
            TrialId::from_str(&text).is_ok(),
            NodeId::from_str(&text).is_ok(),
            BlobHash::from_str(&text).is_ok(),
            ObjectId::from_str(&text).is_ok(),
        ]
        .contains(&true)
    });
}

#[test]
fn metric_and_checkpoint_lines() {
    let texts = [
        r#"XP_METRIC {"step": 3, "val_loss": 0.41, "acc": 0.9}"#,
        r#"XP_METRIC {"loss": null, "acc": 0.5}"#,
        r#"XP_CHECKPOINT {"step": 120}"#,
    ];
    let target = Target {
        name: "metric and checkpoint lines",
        cases: 4000,
        // A line is at most MAX_METRIC_LINE when it reaches the parser; its JSON
        // tree is a small multiple of it.
        limit: 64 << 10,
        per_input_byte: 64,
    };
    run(&target, text_inputs(corpus(&texts), JSON_TOKENS), |bytes| {
        let text = lossy(bytes);
        let metric = parse_metric_line(&text);
        let checkpoint = parse_checkpoint_line(&text);
        matches!(metric, Ok(Some(_))) || matches!(checkpoint, Ok(Some(_)))
    });
}

/// The most names a metric line may carry is checked after its JSON is parsed,
/// so a full-length line of tiny names is the worst case the node parses.
#[test]
fn a_full_metric_line_of_tiny_names_stays_bounded() {
    let mut line = String::from("XP_METRIC {");
    let mut index = 0;
    while line.len() < MAX_METRIC_LINE - 16 {
        line.push_str(&format!("\"{index:x}\":1,"));
        index += 1;
    }
    line.push_str("\"z\":1}");
    let (result, peak) = measure(|| parse_metric_line(&line));
    assert!(result.is_err(), "{} names were accepted", index + 1);
    assert!(peak <= 64 * MAX_METRIC_LINE, "held {peak} bytes");
}

const SPEC_CONDITIONAL: &str = "name: tpe-sweep\nteam: vision\ntrial:\n  command: [python, train.py, --opt, '{optimizer}', --lr, '{lr}']\n  resources: {gpu: 1, cpu: 2, memory: 4GiB}\n  workers: 2\nsearch:\n  algorithm: tpe\n  trials: 20\n  metric: loss\n  mode: min\n  space:\n    optimizer: {choice: [sgd, adam]}\n    momentum: {uniform: [0.0, 0.99], when: {optimizer: [sgd]}}\n    layers: {int: [1, 8], step: 1, log: true}\n    width: {int: [16, 256], step: 16}\n    lr: {loguniform: [0.0001, 0.1]}\n";

fn spec_corpus() -> Vec<&'static str> {
    vec![
        include_str!("../../examples/cli/sweep.yaml"),
        include_str!("../../examples/quickstart/sweep.yaml"),
        SPEC_CONDITIONAL,
    ]
}

/// A spec is at most MAX_SPEC_BYTES of text; its parse tree is a multiple of it.
const YAML_PER_BYTE: usize = 256;

#[test]
fn experiment_spec_yaml() {
    for text in spec_corpus() {
        ExperimentSpec::from_yaml(text).expect("the corpus is valid");
    }
    let target = Target {
        name: "experiment spec (YAML)",
        cases: 2000,
        limit: 1 << 20,
        per_input_byte: YAML_PER_BYTE,
    };
    run(
        &target,
        text_inputs(corpus(&spec_corpus()), YAML_TOKENS),
        |bytes| ExperimentSpec::from_yaml(&lossy(bytes)).is_ok(),
    );
}

#[test]
fn experiment_spec_json() {
    let json: Vec<String> = spec_corpus()
        .into_iter()
        .map(|text| {
            ExperimentSpec::from_yaml(text)
                .expect("valid")
                .to_canonical_json()
        })
        .collect();
    let json: Vec<&str> = json.iter().map(String::as_str).collect();
    let target = Target {
        name: "experiment spec (canonical JSON, as submitted)",
        cases: 3000,
        limit: 1 << 20,
        per_input_byte: YAML_PER_BYTE,
    };
    run(&target, text_inputs(corpus(&json), JSON_TOKENS), |bytes| {
        ExperimentSpec::from_json(&lossy(bytes)).is_ok()
    });
}

#[test]
fn pipeline_spec_yaml_and_json() {
    let yaml = [
        include_str!("../../examples/pipeline/digits-pipeline.yaml"),
        "name: p\nstages:\n  a: {trial: {command: [true]}, estimate: 1m}\n  b: {needs: [a], trial: {command: [cat, '{a.outputs}/f', '{a.checkpoint}']}}\n",
    ];
    for text in yaml {
        xp_runtime::spec::PipelineSpec::from_yaml(text).expect("the corpus is valid");
    }
    let target = Target {
        name: "pipeline spec (YAML)",
        cases: 2000,
        limit: 1 << 20,
        per_input_byte: YAML_PER_BYTE,
    };
    run(&target, text_inputs(corpus(&yaml), YAML_TOKENS), |bytes| {
        xp_runtime::spec::PipelineSpec::from_yaml(&lossy(bytes)).is_ok()
    });
    let json: Vec<String> = yaml
        .iter()
        .map(|text| {
            xp_runtime::spec::PipelineSpec::from_yaml(text)
                .expect("valid")
                .to_canonical_json()
        })
        .collect();
    let json: Vec<&str> = json.iter().map(String::as_str).collect();
    let target = Target {
        name: "pipeline spec (canonical JSON, as submitted)",
        cases: 2000,
        limit: 1 << 20,
        per_input_byte: YAML_PER_BYTE,
    };
    run(&target, text_inputs(corpus(&json), JSON_TOKENS), |bytes| {
        xp_runtime::spec::PipelineSpec::from_json(&lossy(bytes)).is_ok()
    });
}

#[test]
fn search_space_yaml() {
    let texts = [
        "lr: {loguniform: [0.001, 0.5]}\nhidden: {choice: [16, 32, 64, 128]}\nepochs: {int: [5, 40]}\n",
        "optimizer: {choice: [sgd, adam]}\nmomentum: {uniform: [0.0, 0.99], when: {optimizer: [sgd]}}\nwidth: {int: [16, 256], step: 16}\n",
    ];
    let target = Target {
        name: "search space (YAML, xp tune)",
        cases: 2000,
        limit: 1 << 20,
        per_input_byte: YAML_PER_BYTE,
    };
    run(&target, text_inputs(corpus(&texts), YAML_TOKENS), |bytes| {
        serde_saphyr::from_str::<SpaceSpec>(&lossy(bytes))
            .ok()
            .is_some_and(|spec| SearchSpace::from_spec(&spec).is_ok())
    });
}

#[test]
fn policy_yaml() {
    let texts = [
        include_str!("../../examples/sim/policy.yaml"),
        include_str!("../../examples/sim/compare/backfill.yaml"),
        include_str!("../../examples/sim/compare/fair.yaml"),
    ];
    let target = Target {
        name: "policy (YAML)",
        cases: 2000,
        limit: 1 << 20,
        per_input_byte: YAML_PER_BYTE,
    };
    run(&target, text_inputs(corpus(&texts), YAML_TOKENS), |bytes| {
        PolicyConfig::from_yaml(&lossy(bytes)).is_ok()
    });
}

#[test]
fn cluster_yaml() {
    let texts = [
        include_str!("../../examples/sim/cluster.yaml"),
        "nodes:\n  - {count: 2, gpus: 8, gpu_model: A100, cpu_milli: 96000, mem_mib: 1024, labels: {rack: r1}}\n  - {gpus: 4, cpu_milli: 1000, mem_mib: 1, name: small}\n",
    ];
    let target = Target {
        name: "cluster (YAML, xp sim)",
        cases: 2000,
        limit: CLUSTER_LIMIT,
        per_input_byte: YAML_PER_BYTE,
    };
    run(&target, text_inputs(corpus(&texts), YAML_TOKENS), |bytes| {
        parse_cluster_yaml(&lossy(bytes)).is_ok()
    });
}

/// What one node of a cluster file may cost (its `NodeSpec`, name, labels and
/// the duplicate check), measured below.
const CLUSTER_BYTES_PER_NODE: usize = 1024;

/// A cluster file may describe up to `MAX_NODES` (a million) nodes in a few
/// bytes (`count`): the limit is that many nodes at their measured cost.
const CLUSTER_LIMIT: usize = MAX_NODES as usize * CLUSTER_BYTES_PER_NODE;

#[test]
fn cluster_csv() {
    let texts = [
        "node_id,gpus,gpu_model,cpu_milli,mem_mib,rack\nn0,8,A100,96000,786432,r1\nn1,8,A100,96000,786432,r2\nn2,0,,4000,16384,r2\n",
        "node_id,gpus,gpu_model,cpu_milli,mem_mib\nn0,8,H100,96000,786432\n",
    ];
    let target = Target {
        name: "cluster (CSV, xp sim)",
        cases: 3000,
        limit: 256 << 10,
        per_input_byte: 256,
    };
    run(&target, text_inputs(corpus(&texts), CSV_TOKENS), |bytes| {
        parse_cluster_csv(&lossy(bytes)).is_ok()
    });
}

#[test]
fn trace_csv() {
    let sample = include_str!("../../examples/sim/trace.csv");
    // The first rows are enough to mutate; the whole file is a valid input too.
    let head: String = sample.lines().take(12).collect::<Vec<_>>().join("\n");
    let texts = [
        head.as_str(),
        "job_id,submit_s,duration_s,num_workers,gpus_per_worker\nj0,0,10,1,1\nj1,5,20,2,8\n",
        // A pipeline: dependencies, declared estimates and stage kinds.
        "job_id,submit_s,duration_s,num_workers,gpus_per_worker,deps,estimate_s,kind\np0.s0.0,0,10,1,1,,12,t0.s0\np0.s1.0,0,20,1,0.5,p0.s0.0,15,t0.s1\n",
    ];
    let target = Target {
        name: "trace (CSV, xp sim)",
        cases: 3000,
        limit: 256 << 10,
        per_input_byte: 256,
    };
    run(&target, text_inputs(corpus(&texts), CSV_TOKENS), |bytes| {
        parse_trace(&lossy(bytes)).is_ok()
    });
}

/// The HTTP API's listing parameters: page cursors (`cursor=`), the sort and
/// the state filter, all from a query string.
#[test]
fn http_cursors_and_filters() {
    use xp_head_core::pages::{
        ExperimentCursor, MetricCursor, NodeCursor, QueueCursor, StateSet, TrialCursor, TrialSort,
    };
    let texts = [
        "e:1764600000000:feedbeef00000001-3",
        "id:12",
        "-id:0",
        "metric:3fb999999999999a:7",
        "-metric:none:3",
        "n:6f1c2a4e-1d2b-4c3d-8e9f-0a1b2c3d4e5f",
        "q:default",
        "m:42",
        "running,queued",
    ];
    let target = Target {
        name: "HTTP cursors and filters",
        cases: 3000,
        limit: 16 << 10,
        per_input_byte: 8,
    };
    run(&target, text_inputs(corpus(&texts), URL_TOKENS), |bytes| {
        let text = lossy(bytes);
        let trial_cursors = TrialSort::ALL
            .iter()
            .any(|sort| TrialCursor::decode(&text, *sort).is_ok());
        [
            trial_cursors,
            TrialSort::parse(&text).is_some(),
            StateSet::parse(&text).is_ok(),
            ExperimentCursor::decode(&text).is_ok(),
            NodeCursor::decode(&text).is_ok(),
            QueueCursor::decode(&text).is_ok(),
            MetricCursor::decode(&text).is_ok(),
        ]
        .contains(&true)
    });
}

/// Documents over their size limit are refused before any parsing.
#[test]
fn oversized_documents_are_refused_unparsed() {
    let huge = "a".repeat(MAX_SPEC_BYTES + 1);
    let (result, peak) = measure(|| ExperimentSpec::from_yaml(&huge));
    assert!(result.is_err());
    assert!(peak < 64 << 10, "held {peak} bytes");
    let (result, peak) = measure(|| PolicyConfig::from_yaml(&huge));
    assert!(result.is_err());
    assert!(peak < 64 << 10, "held {peak} bytes");
    let long = format!("xp://h:1?token={}&ca={}", "t".repeat(8192), "00".repeat(32));
    let (result, peak) = measure(|| JoinString::from_str(&long));
    assert!(result.is_err());
    assert!(peak < 64 << 10, "held {peak} bytes");
}

/// "Billion laughs": ten levels of anchors, each alias ten times the one below,
/// so a 400-byte document would name ten billion leaves if aliases were copied.
fn billion_laughs(top_key: &str) -> String {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..10 {
        let below = level - 1;
        let aliases = vec![format!("*a{below}"); 10].join(", ");
        text.push_str(&format!("a{level}: &a{level} [{aliases}]\n"));
    }
    text.push_str(&format!("{top_key}: *a9\n"));
    text
}

#[test]
fn yaml_alias_bombs_are_refused_within_bounds() {
    let bomb = billion_laughs("name");
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for text in [&bomb, &nested] {
        let bound = (1 << 20) + YAML_PER_BYTE * text.len();
        let (spec, peak) = measure(|| ExperimentSpec::from_yaml(text));
        assert!(spec.is_err());
        assert!(peak <= bound, "spec: held {peak} bytes");
        let (policy, peak) = measure(|| PolicyConfig::from_yaml(text));
        assert!(policy.is_err());
        assert!(peak <= bound, "policy: held {peak} bytes");
        let (cluster, peak) = measure(|| parse_cluster_yaml(text));
        assert!(cluster.is_err());
        assert!(peak <= bound, "cluster: held {peak} bytes");
        let (space, peak) = measure(|| serde_saphyr::from_str::<SpaceSpec>(text));
        assert!(space.is_err());
        assert!(peak <= bound, "space: held {peak} bytes");
    }
}

/// A cluster file's heap grows with the nodes it describes and nothing else:
/// 100,000 nodes (a tenth of the most allowed, to keep the test short) stay
/// within their share of [`CLUSTER_LIMIT`]; one node over the most is refused
/// before any is built.
#[test]
#[expect(clippy::print_stderr, reason = "say what a large cluster costs")]
fn cluster_files_cost_what_their_nodes_do() {
    let nodes = 100_000;
    let text = format!(
        "nodes:\n  - {{count: {nodes}, gpus: 8, gpu_model: A100, cpu_milli: 96000, mem_mib: 786432, labels: {{rack: r1, zone: z1}}}}\n"
    );
    let (cluster, peak) = measure(|| parse_cluster_yaml(&text));
    assert_eq!(cluster.expect("allowed").nodes.len(), nodes);
    eprintln!(
        "a {nodes}-node cluster file: {peak} bytes, {} a node",
        peak / nodes
    );
    assert!(peak <= nodes * CLUSTER_BYTES_PER_NODE, "held {peak} bytes");
    let text = text.replace(&nodes.to_string(), &MAX_NODES.to_string());
    let over = text.replace(&MAX_NODES.to_string(), &(MAX_NODES + 1).to_string());
    let (cluster, peak) = measure(|| parse_cluster_yaml(&over));
    assert!(cluster.is_err());
    assert!(peak < 1 << 20, "held {peak} bytes");
}
