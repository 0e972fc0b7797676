//! `xp sim` on pipeline workloads through the real binary: `xp sim generate
//! --pipelines` writes a trace that `xp sim` replays with and without the
//! critical-path boost, every pipeline completing and reported; bad options
//! are refused with a clear message.

use std::path::Path;
use std::process::{Command, Output};

fn xp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(args)
        .env_remove("XP_CLUSTER")
        .output()
        .expect("the xp binary runs")
}

fn must_xp(args: &[&str]) -> String {
    let output = xp(args);
    assert!(
        output.status.success(),
        "xp {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("xp prints UTF-8")
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).to_str().expect("a UTF-8 path").to_owned()
}

#[test]
fn pipelines_are_generated_simulated_and_reported_with_and_without_the_boost() {
    let dir = tempfile::tempdir().unwrap();
    let trace = path(dir.path(), "pipelines.csv");
    let cluster = path(dir.path(), "cluster.yaml");
    std::fs::write(
        &cluster,
        "nodes: [{count: 2, gpus: 8, cpu_milli: 128000, mem_mib: 1048576}]\n",
    )
    .unwrap();
    must_generate_pipelines(&trace);
    let makespans: Vec<f64> = [None, Some("critical"), Some("rank")]
        .into_iter()
        .map(|boost| check_every_pipeline_completes(&trace, &cluster, boost))
        .collect();
    // The text report has the pipelines line; a bare flag means `critical`.
    let text = must_xp(&[
        "sim",
        "--trace",
        &trace,
        "--cluster",
        &cluster,
        "--policy",
        "fair",
        "--critical-path-boost",
    ]);
    let line = text
        .lines()
        .find(|line| line.starts_with("pipelines"))
        .unwrap_or_else(|| panic!("no pipelines line in:\n{text}"));
    assert!(line.contains("10 (10 completed)"), "{line}");
    assert!(
        line.contains(&format!("total {:.1} s", makespans[1])),
        "{line} against {makespans:?}"
    );
}

/// `xp sim generate --pipelines` writes ten pipelines with their dependency,
/// estimate and kind columns.
fn must_generate_pipelines(trace: &str) {
    must_xp(&[
        "sim",
        "generate",
        "--pipelines",
        "10",
        "--rate",
        "3",
        "--teams",
        "2",
        "--seed",
        "4",
        "--out",
        trace,
    ]);
    let header = std::fs::read_to_string(trace).unwrap();
    assert!(
        header
            .lines()
            .next()
            .unwrap()
            .contains(",deps,estimate_s,kind"),
        "{}",
        header.lines().next().unwrap()
    );
}

/// `xp sim --json` with the critical-path boost `boost` (or none): every
/// pipeline completes and is reported, the mean makespan is a tenth of the
/// total. The total makespan.
fn check_every_pipeline_completes(trace: &str, cluster: &str, boost: Option<&str>) -> f64 {
    let mut args = vec![
        "sim",
        "--trace",
        trace,
        "--cluster",
        cluster,
        "--policy",
        "fair",
        "--check-invariants",
        "--json",
    ];
    if let Some(boost) = boost {
        args.extend(["--critical-path-boost", boost]);
    }
    let report: serde_json::Value = serde_json::from_str(&must_xp(&args)).unwrap();
    let pipelines = &report["pipelines"];
    assert_eq!(pipelines["count"], 10, "{boost:?}: {report}");
    assert_eq!(pipelines["completed"], 10, "{boost:?}: {report}");
    assert_eq!(report["completed"], report["jobs"], "{boost:?}");
    let mean = pipelines["makespan_mean"].as_f64().unwrap();
    let total = pipelines["makespan_total"].as_f64().unwrap();
    assert!(
        (mean * 10.0 - total).abs() < 1e-6 * total,
        "{boost:?}: {report}"
    );
    total
}

#[test]
fn bad_pipeline_options_are_refused() {
    let refused = |args: &[&str], expected: &str| {
        let output = xp(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "xp {args:?} succeeded");
        assert!(stderr.contains(expected), "xp {args:?}: {stderr}");
    };
    refused(
        &["sim", "generate", "--pipelines", "0", "--rate", "1"],
        "pipelines must be between 1 and 100000 (got 0)",
    );
    refused(
        &[
            "sim",
            "generate",
            "--pipelines",
            "3",
            "--rate",
            "1",
            "--templates",
            "0",
        ],
        "templates must be between 1 and 1000 (got 0)",
    );
    refused(
        &[
            "sim",
            "generate",
            "--pipelines",
            "3",
            "--jobs",
            "3",
            "--rate",
            "1",
        ],
        "cannot be used with",
    );
    refused(
        &[
            "sim",
            "generate",
            "--jobs",
            "3",
            "--rate",
            "1",
            "--templates",
            "2",
        ],
        "--pipelines",
    );
    refused(
        &[
            "sim",
            "--trace",
            "x.csv",
            "--cluster",
            "c.yaml",
            "--critical-path-boost",
            "fastest",
        ],
        "invalid value 'fastest'",
    );
}
