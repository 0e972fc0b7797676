//! End-to-end runs of the simulator on small traces, checked against hand-computed
//! results, with the core's invariants checked after every decision.

use super::*;
use crate::PolicyConfig;
use crate::place::Strategy;

fn must_simulate(
    trace_csv: &str,
    cluster_yaml: &str,
    policy: &str,
    until_s: Option<u64>,
) -> SimReport {
    let trace = parse_trace(trace_csv).unwrap();
    let cluster = parse_cluster_yaml(cluster_yaml).unwrap();
    let config = PolicyConfig::preset(policy).unwrap();
    let options = SimOptions {
        until_ms: until_s.map(|seconds| seconds * 1000),
        check_invariants: true,
        ..SimOptions::default()
    };
    simulate(&trace, &cluster, config, &options).unwrap()
}

fn check_close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() < 1e-9,
        "got {actual}, expected {expected}"
    );
}

const ONE_NODE_TWO_GPUS: &str = "nodes: [{gpus: 2, cpu_milli: 16000, mem_mib: 65536}]\n";
const ONE_NODE_ONE_GPU: &str = "nodes: [{gpus: 1, cpu_milli: 16000, mem_mib: 65536}]\n";
const HEADER: &str = "job_id,submit_s,duration_s,num_workers,gpus_per_worker";

#[test]
fn three_jobs_on_two_gpus_under_fifo() {
    // a and b start at 0; a ends at 10 and c starts; b ends at 20, c at 40.
    let report = must_simulate(
        &format!("{HEADER}\na,0,10,1,1\nb,0,20,1,1\nc,0,30,1,1\n"),
        ONE_NODE_TWO_GPUS,
        "fifo",
        None,
    );
    assert_eq!(report.jobs, 3);
    assert_eq!(report.outcomes.completed, 3);
    let jct = report.jct.unwrap();
    check_close(jct.mean, 70.0 / 3.0);
    check_close(jct.median, 20.0);
    check_close(jct.p99, 40.0);
    let delay = report.queue_delay.unwrap();
    check_close(delay.mean, 10.0 / 3.0);
    check_close(delay.p99, 10.0);
    check_close(report.makespan, 40.0);
    // 60 GPU-seconds held out of 2 GPUs × 40 s.
    check_close(report.gpu_utilization, 0.75);
    assert_eq!(report.gpu_utilization_arrivals, None);
    check_close(report.gpu_hours, 60.0 / 3600.0);
    // Jobs in the system: 3 for 10 s, 2 for 10 s, 1 for 20 s: 70 job-seconds over 40 s.
    check_close(report.littles_law.l, 1.75);
    check_close(report.littles_law.lambda * report.littles_law.w, 1.75);
    assert_eq!(report.preemptions, 0);
    assert_eq!(report.never_started, 0);
    let json = report.to_json();
    for key in [
        "jobs",
        "jct_mean",
        "jct_median",
        "jct_p99",
        "queue_delay_mean",
        "queue_delay_p99",
        "makespan",
        "gpu_utilization",
        "jain_fairness",
        "preemptions",
        "littles_law",
        "teams",
    ] {
        assert!(json.get(key).is_some(), "missing key {key}");
    }
    check_close(json["littles_law"]["lambda_w"].as_f64().unwrap(), 1.75);
    check_close(json["teams"]["default"]["share"].as_f64().unwrap(), 1.0);
}

#[test]
fn dependencies_wait_for_completion() {
    let trace = format!(
        "{HEADER},deps,time_limit_s\n\
         a,0,10,1,1,,\n\
         b,0,5,1,1,a,\n\
         forever,0,,1,1,,\n\
         c,0,5,1,1,forever,\n\
         cut,0,100,1,1,,20\n\
         d,0,5,1,1,cut,\n"
    );
    let cluster = "nodes: [{gpus: 8, cpu_milli: 16000, mem_mib: 65536}]\n";
    let report = must_simulate(&trace, cluster, "fifo", None);
    // b is submitted when a completes at 10 and runs 10 to 15: its JCT counts from 10.
    assert_eq!(report.outcomes.completed, 2);
    assert_eq!(report.outcomes.killed, 1);
    assert_eq!(report.outcomes.running, 1);
    // c waits on a job that never finishes, d on a job killed at its limit.
    assert_eq!(report.outcomes.blocked, 2);
    assert_eq!(report.never_started, 2);
    let jct = report.jct.unwrap();
    check_close(jct.mean, 7.5);
    check_close(jct.p99, 10.0);
    // The last end is the kill at 20.
    check_close(report.makespan, 20.0);
}

#[test]
fn never_finishing_jobs_stay_unfinished() {
    let trace = format!("{HEADER}\nforever,0,,1,1\nnext,1,10,1,1\n");
    let report = must_simulate(&trace, ONE_NODE_ONE_GPU, "fifo", None);
    assert_eq!(report.outcomes.running, 1);
    assert_eq!(report.outcomes.waiting, 1);
    assert_eq!(report.never_started, 1);
    assert_eq!(report.jct, None);
    assert_eq!(report.to_json()["unfinished"], 2);
    assert_eq!(report.wait_reasons.values().sum::<u64>(), 1);
    // From the first submission (0) to the last (1) the one GPU is held.
    check_close(report.gpu_utilization_arrivals.unwrap(), 1.0);
    // With an end time the forever job holds its GPU for the whole span.
    let until = must_simulate(&trace, ONE_NODE_ONE_GPU, "fifo", Some(100));
    check_close(until.span, 100.0);
    check_close(until.gpu_utilization, 1.0);
    check_close(until.gpu_hours, 100.0 / 3600.0);
}

#[test]
fn time_limits_kill_at_the_limit() {
    let report = must_simulate(
        &format!("{HEADER},time_limit_s\nlong,0,100,1,1,30\nshort,0,10,1,1,30\n"),
        ONE_NODE_TWO_GPUS,
        "fifo",
        None,
    );
    assert_eq!(report.outcomes.killed, 1);
    assert_eq!(report.outcomes.completed, 1);
    check_close(report.makespan, 30.0);
    check_close(report.gpu_hours, 40.0 / 3600.0);
}

/// A low-priority job runs from 0; a high-priority one arrives at 400 s. The
/// preset (`default` or `priority`) preempts after its 5-minute minimum run
/// time with a 60 s grace: the victim stops at 460 s after 460 s of run time.
fn preemption_report(ckpt_interval: &str, policy: &str) -> SimReport {
    let trace = format!(
        "{HEADER},priority,ckpt_interval_s\n\
         low,0,1000,1,1,low,{ckpt_interval}\n\
         high,400,50,1,1,high,\n"
    );
    must_simulate(&trace, ONE_NODE_ONE_GPU, policy, None)
}

#[test]
fn preemption_loses_work_since_the_last_checkpoint() {
    // Checkpoints every 100 s: 60 s lost; 600 s left after 400 s kept.
    let report = preemption_report("100", "default");
    assert_eq!(report.preemptions, 1);
    check_close(report.gpu_seconds_lost, 60.0);
    // high runs 460 to 510; low resumes at 510 for 600 s.
    check_close(report.makespan, 1110.0);
    assert_eq!(report.outcomes.completed, 2);
    let jct = report.jct.unwrap();
    check_close(jct.mean, (110.0 + 1110.0) / 2.0);
}

#[test]
fn preemption_without_checkpoints_loses_the_whole_run() {
    let report = preemption_report("", "priority");
    assert_eq!(report.preemptions, 1);
    check_close(report.gpu_seconds_lost, 460.0);
    // low starts over at 510 and runs its full 1000 s.
    check_close(report.makespan, 1510.0);
    // GPU time held: 460 (lost run) + 50 + 1000.
    check_close(report.gpu_hours, 1510.0 / 3600.0);
}

#[test]
fn the_default_waits_rather_than_destroy_a_run_that_never_checkpointed() {
    // The victim would lose more than `max_loss`, and keeps losing as fast
    // as the newcomer waits: low runs to its end at 1000 s, high after it.
    let report = preemption_report("", "default");
    assert_eq!(report.preemptions, 0);
    check_close(report.gpu_seconds_lost, 0.0);
    check_close(report.makespan, 1050.0);
    check_close(report.jct.unwrap().mean, (1000.0 + 650.0) / 2.0);
}

#[test]
fn equal_teams_are_perfectly_fair() {
    let trace =
        format!("{HEADER},team\na1,0,10,1,1,a\nb1,0,10,1,1,b\na2,0,20,2,1,a\nb2,0,20,2,1,b\n");
    let report = must_simulate(&trace, ONE_NODE_TWO_GPUS, "fair", None);
    check_close(report.jain_fairness, 1.0);
    check_close(report.teams[0].share, 0.5);
}

#[test]
fn unknown_priority_class_is_an_input_error() {
    let trace = parse_trace(&format!("{HEADER},priority\na,0,10,1,1,urgent\n")).unwrap();
    let cluster = parse_cluster_yaml(ONE_NODE_ONE_GPU).unwrap();
    let error = simulate(
        &trace,
        &cluster,
        PolicyConfig::preset("fifo").unwrap(),
        &SimOptions::default(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("line 2"), "{error}");
}

const SIXTEEN_NODES: &str = "nodes:\n  - {count: 8, gpus: 8, cpu_milli: 96000, mem_mib: 786432, labels: {rack: r1}}\n  - {count: 8, gpus: 8, cpu_milli: 96000, mem_mib: 786432, labels: {rack: r2}}\n";

#[test]
fn littles_law_holds_on_a_generated_trace() {
    let trace = generate(&GenerateOptions {
        jobs: 300,
        rate_per_hour: 120.0,
        teams: 3,
        seed: 11,
    })
    .unwrap();
    let cluster = parse_cluster_yaml(SIXTEEN_NODES).unwrap();
    for policy in ["default", "fifo"] {
        let options = SimOptions {
            check_invariants: true,
            ..SimOptions::default()
        };
        let report = simulate(
            &trace,
            &cluster,
            PolicyConfig::preset(policy).unwrap(),
            &options,
        )
        .unwrap();
        assert_eq!(
            report.outcomes.running + report.outcomes.waiting,
            0,
            "{policy}: the system empties"
        );
        let law = report.littles_law;
        let lambda_w = law.lambda * law.w;
        assert!(
            (law.l - lambda_w).abs() <= 0.05 * lambda_w,
            "{policy}: L {} against lambda W {lambda_w}",
            law.l
        );
        assert!(report.gpu_utilization > 0.0 && report.gpu_utilization <= 1.0);
        assert!(report.multi_gpu_placements > 0);
        // Same inputs, same report.
        let again = simulate(
            &trace,
            &cluster,
            PolicyConfig::preset(policy).unwrap(),
            &options,
        )
        .unwrap();
        assert_eq!(report, again);
    }
}

#[test]
fn binpacking_packs_at_least_as_well_as_random() {
    let trace = generate(&GenerateOptions {
        jobs: 2000,
        rate_per_hour: 100.0,
        teams: 2,
        seed: 5,
    })
    .unwrap();
    let cluster = parse_cluster_yaml(SIXTEEN_NODES).unwrap();
    let run = |strategy| {
        place_once(
            &trace,
            &cluster,
            &PlaceOnceOptions {
                load: 1.3,
                strategy,
                seed: 9,
                oversubscription_milli: 1000,
            },
        )
        .unwrap()
    };
    let binpack = run(Strategy::BinPack);
    let random = run(Strategy::Random { seed: 0 });
    let final_ratio = |report: &PlaceOnceReport| report.alloc_ratio.last().unwrap().1;
    assert!(
        final_ratio(&binpack) >= final_ratio(&random),
        "binpack {binpack:?} random {random:?}"
    );
    assert_eq!(
        binpack.attempted, random.attempted,
        "both strategies see the same jobs"
    );
    assert_eq!(binpack.alloc_ratio.len(), 3);
    assert!(
        binpack.final_load > 1.0 && binpack.final_load <= 1.3,
        "{binpack:?}"
    );
    let json = binpack.to_json();
    assert!(json["alloc_ratio"]["1.3"].is_number());
    assert!(json["alloc_ratio"]["0.9"].is_number());
}

fn place_eight_gpus_once(csv: &str, load: f64, seed: u64) -> PlaceOnceReport {
    let trace = parse_trace(csv).unwrap();
    let cluster =
        parse_cluster_yaml("nodes: [{count: 2, gpus: 4, cpu_milli: 64000, mem_mib: 65536}]\n")
            .unwrap();
    let options = PlaceOnceOptions {
        load,
        strategy: Strategy::BinPack,
        seed,
        oversubscription_milli: 1000,
    };
    place_once(&trace, &cluster, &options).unwrap()
}

#[test]
fn place_once_brings_every_job_once_then_copies_within_the_load() {
    // 3 of the 8 GPUs asked for, and a CPU-only job: each arrives, then
    // copies while the GPUs asked for stay within 8, stopping at the first
    // that would pass (as the FGD paper's simulator): 7 or 8 GPUs arrive.
    let csv = format!(
        "{HEADER},cpu_milli_per_worker\none,0,,1,1,1000\ntwo,0,,1,2,1000\ncpu,0,,1,0,1000\n"
    );
    for seed in 0..20 {
        let report = place_eight_gpus_once(&csv, 1.0, seed);
        let arrived = report.attempted;
        assert!(
            arrived.whole_gpu >= 1 && arrived.multi_gpu >= 1 && arrived.cpu_only >= 1,
            "{arrived:?}"
        );
        let gpus = arrived.whole_gpu + 2 * arrived.multi_gpu;
        assert!(gpus == 7 || gpus == 8, "{arrived:?}");
        check_close(report.final_load, gpus as f64 / 8.0);
    }
}

#[test]
fn place_once_thins_a_trace_that_asks_for_more_than_the_load() {
    let jobs: String = (0..10).map(|job| format!("j{job},0,,1,1\n")).collect();
    let csv = format!("{HEADER}\n{jobs}");
    let report = place_eight_gpus_once(&csv, 0.5, 3);
    assert_eq!(report.attempted.whole_gpu, 4);
    check_close(report.final_load, 0.5);
    check_close(report.alloc_ratio.last().unwrap().1, 0.5);
}

#[test]
fn refused_submissions_wait_in_a_backlog_and_retry() {
    // One pending trial per team: b and c are refused at 0 and retried every 5 s.
    let mut config = PolicyConfig::preset("fifo").unwrap();
    config.admission.max_pending_per_team = 1;
    config.admission.retry_after_ms = 5_000;
    let trace = parse_trace(&format!("{HEADER}\na,0,10,1,1\nb,0,10,1,1\nc,0,10,1,1\n")).unwrap();
    let cluster = parse_cluster_yaml(ONE_NODE_ONE_GPU).unwrap();
    let options = SimOptions {
        check_invariants: true,
        ..SimOptions::default()
    };
    let report = simulate(&trace, &cluster, config, &options).unwrap();
    // a runs 0-10; b is accepted at 5 and runs 10-20; c is accepted at 15 and runs 20-30.
    assert_eq!(report.outcomes.completed, 3);
    check_close(report.makespan, 30.0);
    // Completion and queueing count from the first attempt at 0.
    check_close(report.jct.unwrap().mean, 20.0);
    check_close(report.queue_delay.unwrap().p99, 20.0);
    // b at 5; c at 5, 10 and 15.
    assert_eq!(report.submit_retries, 4);
    check_close(
        report.littles_law.l,
        report.littles_law.lambda * report.littles_law.w,
    );
}

#[test]
fn a_seed_changes_ids_but_not_a_tie_free_result() {
    let trace = parse_trace(&format!("{HEADER}\na,0,10,1,1\nb,1,20,1,1\nc,2,30,1,1\n")).unwrap();
    let cluster = parse_cluster_yaml(ONE_NODE_TWO_GPUS).unwrap();
    let run = |seed| {
        let options = SimOptions {
            check_invariants: true,
            seed,
            ..SimOptions::default()
        };
        simulate(
            &trace,
            &cluster,
            PolicyConfig::preset("fifo").unwrap(),
            &options,
        )
        .unwrap()
    };
    assert_eq!(run(0), run(12_345));
}

#[test]
fn the_critical_path_boost_starts_the_long_chain_first() {
    // r (1 s), then x1, x2 and y (10 s each) on two GPUs; z (50 s) needs y.
    // In arrival order x1 and x2 take both GPUs, y runs 11-21, z 21-71. With
    // the boost y goes first beside x1 (1-11), then z and x2 (z ends at 61).
    let trace = parse_trace(&format!(
        "{HEADER},deps,estimate_s\nr,0,1,1,1,,1\nx1,0,10,1,1,r,10\nx2,0,10,1,1,r,10\ny,0,10,1,1,r,10\nz,0,50,1,1,y,50\n"
    ))
    .unwrap();
    let cluster = parse_cluster_yaml(ONE_NODE_TWO_GPUS).unwrap();
    let run = |critical_path_boost| {
        let options = SimOptions {
            check_invariants: true,
            critical_path_boost,
            ..SimOptions::default()
        };
        simulate(
            &trace,
            &cluster,
            PolicyConfig::preset("fair").unwrap(),
            &options,
        )
        .unwrap()
    };
    for (boost, expected) in [
        (CriticalPathBoost::Off, 71.0),
        (CriticalPathBoost::Critical, 61.0),
        (CriticalPathBoost::Rank, 61.0),
    ] {
        let report = run(boost);
        check_close(report.makespan, expected);
        let pipelines = report.pipelines.unwrap();
        assert_eq!(
            (pipelines.pipelines, pipelines.completed),
            (1, 1),
            "{boost:?}"
        );
        check_close(pipelines.makespan.unwrap().mean, expected);
        check_close(pipelines.makespan_total, expected);
    }
    // Under FIFO urgency is ignored, like priority.
    let options = SimOptions {
        critical_path_boost: CriticalPathBoost::Critical,
        ..SimOptions::default()
    };
    let fifo = simulate(
        &trace,
        &cluster,
        PolicyConfig::preset("fifo").unwrap(),
        &options,
    )
    .unwrap();
    check_close(fifo.makespan, 71.0);
}

#[test]
fn generated_pipelines_all_complete_under_every_boost() {
    let trace = generate_pipelines(&PipelineOptions {
        pipelines: 12,
        rate_per_hour: 6.0,
        teams: 2,
        templates: 3,
        seed: 5,
    })
    .unwrap();
    let cluster =
        parse_cluster_yaml("nodes: [{count: 2, gpus: 8, cpu_milli: 128000, mem_mib: 1048576}]\n")
            .unwrap();
    for boost in [
        CriticalPathBoost::Off,
        CriticalPathBoost::Critical,
        CriticalPathBoost::Rank,
    ] {
        let options = SimOptions {
            check_invariants: true,
            critical_path_boost: boost,
            ..SimOptions::default()
        };
        let report = simulate(
            &trace,
            &cluster,
            PolicyConfig::preset("default").unwrap(),
            &options,
        )
        .unwrap();
        assert_eq!(report.outcomes.completed, report.jobs, "{boost:?}");
        let pipelines = report.pipelines.unwrap();
        assert_eq!(
            (pipelines.pipelines, pipelines.completed),
            (12, 12),
            "{boost:?}"
        );
    }
}
