//! The reports of `xp sim`: a simulation's ([`SimReport`]) and a packing
//! measurement's ([`PlaceOnceReport`]), as text or one JSON object, with the
//! wall time the simulator took.

use std::time::Instant;

use xp_sched::config::PlacementKind;
use xp_sched::sim::place_once::load_key;
use xp_sched::sim::{PlaceOnceReport, SimReport};

/// A value with its unit and one decimal, or `-`.
fn optional(value: Option<f64>, unit: &str) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.1}{unit}"))
}

/// Prints a simulation's report: one JSON object, or text in four parts.
pub(super) fn print_report(report: &SimReport, json: bool, started: Instant) {
    let wall_s = started.elapsed().as_secs_f64();
    if json {
        outln!("{}", report.to_json());
        crate::cmd::eprintln_note(&format!("simulated in {wall_s:.3} s of wall time"));
        return;
    }
    print_outcomes(report);
    print_usage(report);
    print_disruptions(report);
    print_diagnostics(report, wall_s);
}

/// What became of the jobs, how long they took and waited, and the pipelines.
fn print_outcomes(report: &SimReport) {
    let outcomes = &report.outcomes;
    outln!(
        "jobs             {} (completed {}, killed {}, running {}, waiting {}, blocked {}, refused {}, not arrived {}; never started {})",
        report.jobs,
        outcomes.completed,
        outcomes.killed,
        outcomes.running,
        outcomes.waiting,
        outcomes.blocked,
        outcomes.refused,
        outcomes.not_arrived,
        report.never_started
    );
    outln!(
        "completion time  mean {}  median {}  p99 {}",
        optional(report.jct.map(|summary| summary.mean), " s"),
        optional(report.jct.map(|summary| summary.median), " s"),
        optional(report.jct.map(|summary| summary.p99), " s")
    );
    outln!(
        "queueing delay   mean {}  median {}  p99 {}",
        optional(report.queue_delay.map(|summary| summary.mean), " s"),
        optional(report.queue_delay.map(|summary| summary.median), " s"),
        optional(report.queue_delay.map(|summary| summary.p99), " s")
    );
    outln!(
        "makespan         {:.1} s (simulated span {:.1} s)",
        report.makespan,
        report.span
    );
    if let Some(pipelines) = &report.pipelines {
        outln!(
            "pipelines        {} ({} completed): makespan mean {}  median {}  p99 {}  total {:.1} s",
            pipelines.pipelines,
            pipelines.completed,
            optional(pipelines.makespan.map(|summary| summary.mean), " s"),
            optional(pipelines.makespan.map(|summary| summary.median), " s"),
            optional(pipelines.makespan.map(|summary| summary.p99), " s"),
            pipelines.makespan_total
        );
    }
}

/// How busy the GPUs were, and how fairly the teams shared them.
fn print_usage(report: &SimReport) {
    outln!(
        "GPU utilisation  {:.1} % over the span, {} from first to last submission ({:.1} GPU-hours held)",
        report.gpu_utilization * 100.0,
        optional(
            report.gpu_utilization_arrivals.map(|share| share * 100.0),
            " %"
        ),
        report.gpu_hours
    );
    outln!(
        "fairness         Jain {:.3} over {} teams' GPU-hours",
        report.jain_fairness,
        report.teams.len()
    );
    for team in &report.teams {
        outln!(
            "  {:<14} {:>10.1} GPU-hours  share {:>5.1} %  jobs {:>8}  completed {:>8}  mean JCT {}",
            team.name,
            team.gpu_hours,
            team.share * 100.0,
            team.jobs,
            team.completed,
            optional(team.jct_mean, " s")
        );
    }
}

/// Work lost to preemptions and resizes, and how gangs were placed.
fn print_disruptions(report: &SimReport) {
    outln!(
        "preemptions      {} ({} decisions), {:.1} GPU-seconds lost",
        report.preemptions,
        report.preempt_decisions,
        report.gpu_seconds_lost
    );
    if report.resizes > 0 {
        outln!(
            "elastic resizes  {} (their lost work and restarts are in the GPU-seconds above)",
            report.resizes
        );
    }
    outln!(
        "gang locality    {} multi-GPU placements: {} in one node, {} in one rack",
        report.multi_gpu_placements,
        optional(report.multi_gpu_one_node.map(|share| share * 100.0), " %"),
        optional(report.multi_gpu_one_rack.map(|share| share * 100.0), " %")
    );
}

/// Little's law as a consistency check, admission retries, what still waits,
/// and the simulator's own counts.
fn print_diagnostics(report: &SimReport, wall_s: f64) {
    let law = report.littles_law;
    outln!(
        "Little's law     L {:.3} against lambda x W {:.3} (lambda {:.6}/s, W {:.1} s)",
        law.l,
        law.lambda * law.w,
        law.lambda,
        law.w
    );
    if report.submit_retries > 0 {
        outln!(
            "admission        {} resubmissions after too many pending trials",
            report.submit_retries
        );
    }
    for (reason, count) in &report.wait_reasons {
        outln!("still waiting    {count} ({reason})");
    }
    outln!(
        "simulator        {} events, {} decide calls, {} placements, {wall_s:.3} s wall time",
        report.events,
        report.decide_calls,
        report.placements
    );
}

/// Prints a packing measurement's report: one JSON object, or text.
pub(super) fn print_place_once(
    report: &PlaceOnceReport,
    placement: &PlacementKind,
    json: bool,
    started: Instant,
) {
    let wall_s = started.elapsed().as_secs_f64();
    if json {
        let mut value = report.to_json();
        value["placement"] = serde_json::json!(format!("{placement:?}"));
        outln!("{value}");
        crate::cmd::eprintln_note(&format!("measured in {wall_s:.3} s of wall time"));
        return;
    }
    outln!("placement        {placement:?}");
    for (load, ratio) in &report.alloc_ratio {
        outln!(
            "alloc ratio      {:>5.1} % at load {}",
            ratio * 100.0,
            load_key(*load)
        );
    }
    outln!("final load       {:.3}", report.final_load);
    outln!("idle GPU frag.   {:.3}", report.idle_gpu_fragmentation);
    outln!(
        "evictions        {} (GPU memory overflowed)",
        report.evictions
    );
    let (attempted, failed) = (&report.attempted, &report.failed);
    outln!(
        "failed jobs      {} of {} (fractional {} of {}, whole-GPU {} of {}, multi-GPU {} of {}, CPU-only {} of {})",
        failed.total(),
        attempted.total(),
        failed.fractional,
        attempted.fractional,
        failed.whole_gpu,
        attempted.whole_gpu,
        failed.multi_gpu,
        attempted.multi_gpu,
        failed.cpu_only,
        attempted.cpu_only
    );
    outln!("wall time        {wall_s:.3} s");
}
