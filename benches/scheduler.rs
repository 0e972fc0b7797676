//! The policy core alone: `decide()` throughput and latency on 10,000 nodes × 8 GPUs
//! with 100,000 waiting trials, as the cluster churns.
//!
//! Setup: nodes in racks of 40 (A100 and H100 models mixed), 100,000 trials of mixed
//! shapes (fractional, 1 to 8 GPUs, multi-node gangs) from four teams with mixed
//! priorities, all submitted, then one `decide` that fills the cluster. Measured:
//! rounds that finish a few hundred running trials, submit as many new ones (so
//! the backlog stays at 100,000) and call `decide` again. Reported: Place decisions
//! per second of decide time, p50/p99 decide latency, and a reference measured in
//! the same run (a plain sort of the 100,000 waiting trials by priority then
//! submission time) so the figure can be read as a ratio on any machine; then the
//! median of 40 passes a tick (250 ms) apart with nothing new, what the head's
//! tick costs while the cluster stays full.
//!
//! Run with `cargo bench --bench scheduler`; `XP_BENCH_POLICY` picks a preset
//! (`default` unless set), `XP_BENCH_PLACEMENT` overrides its placement (as
//! the policy file names it, e.g. `fgd`), `XP_BENCH_ROUNDS` the number of
//! churn rounds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::seeded::SplitMix64;
use xp_sched::sim::cluster::sim_node_id;
use xp_sched::{Amount, Decision, GangShape, NodeSpec, PolicyConfig, PolicyCore, TrialRequest};
use xp_tune::stats::quantile;

const NODES: usize = 10_000;
const GPUS_PER_NODE: u32 = 8;
const NODES_PER_RACK: usize = 40;
const WAITING: usize = 100_000;
const FINISH_PER_ROUND: usize = 300;
const TEAMS: [&str; 4] = ["vision", "language", "speech", "robotics"];
/// Stop churning after this much decide time, whatever the round count.
const TIME_BUDGET: Duration = Duration::from_secs(60);

#[expect(clippy::disallowed_methods, reason = "a bench measures wall time")]
fn now() -> Instant {
    Instant::now()
}

fn trial(index: u64) -> TrialId {
    TrialId {
        experiment: ExperimentId {
            digest: index,
            run: 1,
        },
        index: 0,
    }
}

fn node(index: usize) -> NodeSpec {
    NodeSpec {
        id: sim_node_id(index),
        gpus: GPUS_PER_NODE,
        gpu_model: Some(
            if index.is_multiple_of(3) {
                "H100"
            } else {
                "A100"
            }
            .to_owned(),
        ),
        cpu_milli: 128_000,
        memory_bytes: 1 << 40,
        labels: BTreeMap::from([("rack".to_owned(), format!("r{}", index / NODES_PER_RACK))]),
    }
}

fn request(index: u64, rng: &mut SplitMix64, now: u64) -> TrialRequest {
    let (workers, gpu_milli) = match rng.below(100) {
        0..10 => (1, 250),
        10..20 => (1, 500),
        20..55 => (1, 1000),
        55..65 => (1, 2000),
        65..72 => (1, 4000),
        72..80 => (1, 8000),
        80..88 => (2, 1000),
        88..93 => (4, 1000),
        93..97 => (2, 8000),
        _ => (4, 8000),
    };
    let gpu_models = if rng.below(10) == 0 {
        vec!["H100".to_owned()]
    } else {
        Vec::new()
    };
    TrialRequest {
        id: trial(index),
        team: TEAMS[rng.below(TEAMS.len() as u64) as usize].to_owned(),
        queue: None,
        priority: [0, 0, 0, 100, 1000][rng.below(5) as usize],
        gang: GangShape {
            workers,
            per_worker: Amount {
                gpu_milli,
                cpu_milli: 4 * gpu_milli.max(250),
                memory_bytes: (16 * gpu_milli.max(250)) << 20,
            },
            gpu_models,
            node_labels: BTreeMap::new(),
            spread: false,
            leases: Default::default(),
            oversubscribe: false,
        },
        preemptible: rng.below(10) != 0,
        time_limit_ms: (rng.below(2) == 0).then(|| 3_600_000 * (1 + rng.below(24))),
        submitted_at: now,
        urgency: 0,
    }
}

/// The policy core under churn, and what the bench keeps beside it.
struct Churn {
    core: PolicyCore,
    rng: SplitMix64,
    clock_ms: u64,
    next_trial: u64,
    running: Vec<TrialId>,
}

/// What the timed rounds measured.
struct Rounds {
    /// Each decide's wall time in seconds, sorted.
    latencies: Vec<f64>,
    decide_time: Duration,
    places: u64,
    preempts: u64,
}

impl Churn {
    /// The cluster of [`NODES`] nodes with [`WAITING`] trials submitted; also
    /// the waiting trials' sort keys for the reference.
    fn set_up(config: PolicyConfig) -> (Self, Vec<(i64, u64, TrialId)>) {
        let mut churn = Self {
            core: PolicyCore::new(config),
            rng: SplitMix64::new(42),
            clock_ms: 1_000_000,
            next_trial: 0,
            running: Vec::new(),
        };
        for index in 0..NODES {
            churn.core.upsert_node(node(index));
        }
        let mut waiting_priorities = Vec::with_capacity(WAITING);
        for _ in 0..WAITING {
            let request = request(churn.next_trial, &mut churn.rng, churn.clock_ms);
            waiting_priorities.push((request.priority, request.submitted_at, request.id));
            churn
                .core
                .submit(request, churn.clock_ms)
                .expect("admission is unlimited");
            churn.next_trial += 1;
        }
        (churn, waiting_priorities)
    }

    /// Submits `count` new trials now.
    fn submit_new(&mut self, count: usize) {
        for _ in 0..count {
            let request = request(self.next_trial, &mut self.rng, self.clock_ms);
            self.core
                .submit(request, self.clock_ms)
                .expect("admission is unlimited");
            self.next_trial += 1;
        }
    }

    /// The first decide, which fills the empty cluster, then the backlog
    /// topped up to [`WAITING`] again; its placements and seconds.
    fn fill(&mut self) -> (usize, f64) {
        let fill_started = now();
        let decisions = self.core.decide(self.clock_ms);
        let fill_s = fill_started.elapsed().as_secs_f64();
        let mut fill_places = 0;
        for decision in decisions {
            match decision {
                Decision::Place { trial, .. } => {
                    self.running.push(trial);
                    fill_places += 1;
                }
                Decision::Preempt { trial, .. } => {
                    self.core.requeue(trial, self.clock_ms);
                }
                // No elastic trials here; a resize would restart at once.
                Decision::Resize { trial, .. } => {
                    self.core.resized(trial, self.clock_ms);
                }
            }
        }
        self.submit_new(fill_places);
        (fill_places, fill_s)
    }

    /// Up to `rounds` churn rounds, stopping after [`TIME_BUDGET`] of decide time.
    fn run_rounds(&mut self, rounds: usize) -> Rounds {
        let mut measured = Rounds {
            latencies: Vec::with_capacity(rounds),
            decide_time: Duration::ZERO,
            places: 0,
            preempts: 0,
        };
        for _ in 0..rounds {
            if measured.decide_time > TIME_BUDGET {
                break;
            }
            self.round(&mut measured);
        }
        measured.latencies.sort_unstable_by(f64::total_cmp);
        measured
    }

    /// One round: ten seconds on, [`FINISH_PER_ROUND`] running trials finish,
    /// as many new ones arrive, and one timed decide is applied.
    fn round(&mut self, measured: &mut Rounds) {
        self.clock_ms += 10_000;
        let mut finished = 0;
        while finished < FINISH_PER_ROUND && !self.running.is_empty() {
            let victim = self
                .running
                .swap_remove(self.rng.below(self.running.len() as u64) as usize);
            self.core.finish(victim, self.clock_ms, true);
            finished += 1;
        }
        self.submit_new(finished);
        let started = now();
        let decisions = self.core.decide(self.clock_ms);
        let elapsed = started.elapsed();
        measured.decide_time += elapsed;
        measured.latencies.push(elapsed.as_secs_f64());
        for decision in decisions {
            match decision {
                Decision::Place { trial, .. } => {
                    self.running.push(trial);
                    measured.places += 1;
                }
                Decision::Preempt { trial, .. } => {
                    // The victim stops at once and goes back to its queue.
                    self.core.requeue(trial, self.clock_ms);
                    self.running.retain(|&id| id != trial);
                    measured.preempts += 1;
                }
                Decision::Resize { trial, .. } => {
                    self.core.resized(trial, self.clock_ms);
                }
            }
        }
    }
}

impl Churn {
    /// The median time of [`IDLE_PASSES`] passes a tick apart with nothing
    /// new: what the head's tick costs while the cluster stays full.
    fn idle_pass_p50(&mut self) -> f64 {
        let mut times = Vec::with_capacity(IDLE_PASSES);
        for _ in 0..IDLE_PASSES {
            self.clock_ms += 250;
            let started = now();
            let decisions = self.core.decide(self.clock_ms);
            times.push(started.elapsed().as_secs_f64());
            for decision in decisions {
                match decision {
                    Decision::Place { trial, .. } => self.running.push(trial),
                    Decision::Preempt { trial, .. } => {
                        self.core.requeue(trial, self.clock_ms);
                        self.running.retain(|&id| id != trial);
                    }
                    Decision::Resize { trial, .. } => {
                        self.core.resized(trial, self.clock_ms);
                    }
                }
            }
        }
        times.sort_unstable_by(f64::total_cmp);
        quantile(&times, 0.5).unwrap_or(f64::NAN)
    }
}

/// Passes with nothing new measured after the churn (the head's tick).
const IDLE_PASSES: usize = 40;

/// The reference: the median time of sorting the waiting trials by priority,
/// then submission, over 20 sorts.
fn reference_sort_p50(waiting_priorities: &[(i64, u64, TrialId)]) -> f64 {
    let mut sort_times = Vec::new();
    for _ in 0..20 {
        let mut order = waiting_priorities.to_vec();
        let started = now();
        order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        sort_times.push(started.elapsed().as_secs_f64());
        std::hint::black_box(&order);
    }
    sort_times.sort_unstable_by(f64::total_cmp);
    quantile(&sort_times, 0.5).unwrap_or(f64::NAN)
}

fn main() {
    let policy = std::env::var("XP_BENCH_POLICY").unwrap_or_else(|_| "default".to_owned());
    let rounds: usize = std::env::var("XP_BENCH_ROUNDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(200);
    let mut config = PolicyConfig::preset(&policy).expect("XP_BENCH_POLICY names a preset");
    let mut label = policy.clone();
    if let Ok(placement) = std::env::var("XP_BENCH_PLACEMENT") {
        label = format!("{policy}, placement {placement}");
        config.placement = serde_json::from_value(serde_json::Value::String(placement))
            .expect("XP_BENCH_PLACEMENT names a placement");
    }
    // The bench keeps 100,000 trials waiting; admission control is not what it measures.
    config.admission.max_pending_per_team = u64::MAX;
    let setup_started = now();
    let (mut churn, waiting_priorities) = Churn::set_up(config);
    let setup_s = setup_started.elapsed().as_secs_f64();
    let fill = churn.fill();
    let measured = churn.run_rounds(rounds);
    let idle_p50 = churn.idle_pass_p50();
    let sort_p50 = reference_sort_p50(&waiting_priorities);
    report(&label, setup_s, fill, &measured, (idle_p50, sort_p50));
}

/// Prints the JSON line and the sentence.
#[expect(clippy::print_stdout, reason = "a bench prints its result")]
fn report(
    policy: &str,
    setup_s: f64,
    (fill_places, fill_s): (usize, f64),
    measured: &Rounds,
    (idle_p50, sort_p50): (f64, f64),
) {
    let latencies = &measured.latencies;
    let p50 = quantile(latencies, 0.5).unwrap_or(f64::NAN);
    let p99 = quantile(latencies, 0.99).unwrap_or(f64::NAN);
    let places_per_second = measured.places as f64 / measured.decide_time.as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "bench": "scheduler",
            "policy": policy,
            "nodes": NODES,
            "gpus": NODES * GPUS_PER_NODE as usize,
            "waiting": WAITING,
            "setup_s": setup_s,
            "fill_decide_s": fill_s,
            "fill_places": fill_places,
            "rounds": latencies.len(),
            "finished_per_round": FINISH_PER_ROUND,
            "places": measured.places,
            "preempts": measured.preempts,
            "places_per_second": places_per_second,
            "decide_p50_ms": p50 * 1000.0,
            "decide_p99_ms": p99 * 1000.0,
            "reference_sort_100k_ms": sort_p50 * 1000.0,
            "decide_p50_over_sort": p50 / sort_p50,
            "decide_p99_over_sort": p99 / sort_p50,
            "idle_pass_p50_ms": idle_p50 * 1000.0,
        })
    );
    println!(
        "scheduler ({policy}): {NODES} nodes x {GPUS_PER_NODE} GPUs, {WAITING} waiting: {places_per_second:.0} placements/s of decide time; decide p50 {:.2} ms, p99 {:.2} ms over {} rounds ({:.1}x a sort of the 100k waiting trials, {:.2} ms); first fill {fill_places} placements in {:.2} s; a pass with nothing new {:.2} ms",
        p50 * 1000.0,
        p99 * 1000.0,
        latencies.len(),
        p50 / sort_p50,
        sort_p50 * 1000.0,
        fill_s,
        idle_p50 * 1000.0
    );
}
