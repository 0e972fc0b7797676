//! `xp bench fleet`: a real head, in its own `xp-head` process, and many
//! simulated nodes in this one (`xp_node::fleet`: each with its own QUIC
//! session, registration, heartbeats, telemetry, object directory entries and
//! workers that report metrics, checkpoint and exit), running sweeps while
//! nodes die and return and the head is killed and started again.
//!
//! It reports placements per second, how long a freed node waits for its next
//! launch while work waits (p50/p99), the head's CPU time and peak memory, the
//! records per commit, and the trials lost (not succeeded at the end) or
//! duplicated (two live workers of one rank at once), which must both be zero.
//!
//! Files: `head.rs` (the head process), `ledger.rs` (judging what the nodes
//! saw).

mod head;
mod ledger;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xp_node::fleet::{FakeWork, FleetEvent, NodeDisk, SimulatedNode};
use xp_runtime::ids::NodeId;
use xp_runtime::protocol::{NodeState, TrialState};
use xp_runtime::seeded::SplitMix64;
use xp_runtime::spec::{ExperimentSpec, Workers};
use xp_sdk::{Client, SdkError, SubmitOptions};
use xp_tune::stats::quantile;

use self::head::HeadProcess;
use self::ledger::Ledger;

/// Trials per submitted experiment.
const TRIALS_PER_EXPERIMENT: u32 = 100;
/// How often the soak looks at its nodes, its churn and the head.
const TICK: Duration = Duration::from_millis(250);

/// What to soak.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// The `xp-head` program.
    pub head_binary: PathBuf,
    /// Simulated nodes.
    pub nodes: u32,
    /// Whole GPUs each declares.
    pub gpus: u32,
    /// Trials in all, in experiments of 100.
    pub trials: u32,
    /// Every this many experiments is one of gangs of two whole nodes (0: none).
    pub gang_every: u32,
    /// What each worker does.
    pub work: FakeWork,
    /// The share of the live nodes killed per minute.
    pub churn: f64,
    /// How long a killed node stays away.
    pub rejoin_after: Duration,
    /// Kill the head with SIGKILL once half the trials finished, and start it again.
    pub head_restart: bool,
    /// The head's `--node-timeout`.
    pub node_timeout: String,
    /// How often each node sends telemetry.
    pub telemetry_interval: Duration,
    /// The most time the soak runs.
    pub timeout: Duration,
    /// Seeds the churn.
    pub seed: u64,
    /// Where the head's data directory and log are kept; a temporary
    /// directory, removed at the end, when absent.
    pub dir: Option<PathBuf>,
}

/// Why the soak could not run.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The head could not start, or said something unexpected.
    #[error("the head: {0}")]
    Head(String),
    /// A request to the head failed.
    #[error(transparent)]
    Sdk(#[from] SdkError),
    /// A file or process could not be made.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The options make no soak.
    #[error("{0}")]
    Options(String),
}

/// What the soak measured.
#[derive(Debug, Clone)]
pub struct FleetReport {
    /// Simulated nodes.
    pub nodes: u32,
    /// Trials submitted.
    pub trials: u32,
    /// Seconds from the first submission to the end.
    pub seconds: f64,
    /// Worker starts.
    pub placements: u64,
    /// Nodes killed, and head restarts.
    pub kills: u64,
    /// Head restarts (SIGKILL and start again).
    pub head_restarts: u32,
    /// Registrations the head answered (joins and returns).
    pub registrations: u64,
    /// From a freed node to its next launch while work waited, milliseconds: p50, p99.
    pub freed_to_launch_ms: (f64, f64),
    /// The head's CPU seconds over the run (every life), and its peak resident memory.
    pub head_cpu_seconds: f64,
    /// Bytes.
    pub head_peak_rss: u64,
    /// Commits and the records they stored, over the head's lives.
    pub commits: f64,
    /// Records.
    pub committed_records: f64,
    /// Trials succeeded at the end.
    pub succeeded: u32,
    /// Trials not succeeded at the end.
    pub lost: u32,
    /// Trials with two live workers of one rank at once.
    pub duplicated: u32,
    /// Trials whose work was done again after an attempt had done it.
    pub redone: u32,
}

impl FleetReport {
    /// The JSON line `xp bench fleet --json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "bench": "fleet",
            "nodes": self.nodes,
            "trials": self.trials,
            "seconds": self.seconds,
            "placements": self.placements,
            "placements_per_second": self.placements as f64 / self.seconds.max(1e-9),
            "node_kills": self.kills,
            "head_restarts": self.head_restarts,
            "registrations": self.registrations,
            "freed_to_launch_p50_ms": self.freed_to_launch_ms.0,
            "freed_to_launch_p99_ms": self.freed_to_launch_ms.1,
            "head_cpu_seconds": self.head_cpu_seconds,
            "head_cpu_share": self.head_cpu_seconds / self.seconds.max(1e-9),
            "head_peak_rss_mib": self.head_peak_rss as f64 / f64::from(1 << 20),
            "commits": self.commits,
            "records_per_commit": self.committed_records / self.commits.max(1.0),
            "succeeded": self.succeeded,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "redone": self.redone,
        })
    }
}

/// One simulated node and its current life (which ends when this is dropped).
struct FleetNode {
    node: SimulatedNode,
    life: Option<tokio_util::sync::DropGuard>,
    back_at: Option<Instant>,
}

impl FleetNode {
    fn start(&mut self) {
        let death = CancellationToken::new();
        xp_runtime::task::spawn(
            "simulated-node",
            xp_node::fleet::run_simulated(self.node.clone(), death.clone()),
        );
        self.life = Some(death.drop_guard());
        self.back_at = None;
    }

    /// Ends the node's life (as its process dying would); it comes back at `back_at`.
    fn kill(&mut self, back_at: Instant) {
        self.life = None;
        self.back_at = Some(back_at);
    }
}

/// Runs the soak; see the module documentation.
pub async fn bench_fleet(options: FleetOptions) -> Result<FleetReport, FleetError> {
    check(&options)?;
    let temporary = match &options.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            None
        }
        None => Some(tempfile::Builder::new().prefix("xp-fleet-").tempdir()?),
    };
    let dir = options
        .dir
        .clone()
        .or_else(|| temporary.as_ref().map(|dir| dir.path().to_owned()))
        .expect("a directory, given or temporary");
    let mut head = HeadProcess::start(&options.head_binary, &dir, &options.node_timeout).await?;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut nodes = fleet_nodes(&options, &head.node, &events_tx)?;
    nodes.iter_mut().for_each(FleetNode::start);
    let client = Client::connect(&head.admin).await?;
    wait_for_ready(&client, options.nodes as usize).await?;
    client.close().await;
    let started = Instant::now();
    let submitted = Arc::new(AtomicUsize::new(0));
    let submitter = xp_runtime::task::spawn(
        "fleet-submissions",
        submit_all(head.admin.clone(), options.clone(), submitted.clone()),
    );
    let mut soak = Soak {
        options: &options,
        ledger: Ledger::default(),
        submitted,
        rng: SplitMix64::new(options.seed),
        kills: 0,
        head_restarts: 0,
        head_cpu: 0.0,
        commits: (0.0, 0.0),
    };
    if let Err(error) = soak.run(&mut head, &mut nodes, &mut events).await {
        submitter.abort();
        return Err(error);
    }
    let experiments = submitter
        .await
        .map_err(|error| FleetError::Head(format!("the submissions failed: {error}")))??;
    let seconds = started.elapsed().as_secs_f64();
    let (succeeded, lost) = settle(&head.admin, &experiments, options.trials).await?;
    soak.add_commits(&head).await;
    soak.head_cpu = head.sample();
    drop(nodes);
    head.stop().await;
    Ok(soak.report(seconds, succeeded, lost, head.peak_rss))
}

fn check(options: &FleetOptions) -> Result<(), FleetError> {
    let bad = |what: &str| Err(FleetError::Options(what.to_owned()));
    if !(1..=10_000).contains(&options.nodes) {
        return bad("--nodes must be between 1 and 10000");
    }
    if !(1..=64).contains(&options.gpus) {
        return bad("--gpus must be between 1 and 64");
    }
    if !(1..=10_000_000).contains(&options.trials) {
        return bad("--trials must be between 1 and 10000000");
    }
    if !(1..=100_000).contains(&options.work.steps) {
        return bad("--steps must be between 1 and 100000");
    }
    if !(0.0..=1.0).contains(&options.churn) {
        return bad("--churn must be a share of the nodes per minute, between 0 and 1");
    }
    if options.gang_every > 0 && options.nodes < 2 {
        return bad("gangs of two whole nodes need at least two nodes (or --gang-every 0)");
    }
    Ok(())
}

fn fleet_nodes(
    options: &FleetOptions,
    credential: &str,
    events: &mpsc::UnboundedSender<FleetEvent>,
) -> Result<Vec<FleetNode>, FleetError> {
    let join: xp_runtime::join::JoinString = credential
        .parse()
        .map_err(|error| FleetError::Head(format!("a bad node credential: {error}")))?;
    Ok((0..options.nodes)
        .map(|index| FleetNode {
            node: SimulatedNode {
                join: join.clone(),
                node_id: NodeId::random(),
                name: format!("sim-{index:05}"),
                // An address of its own, as each machine of a cluster has
                // (all of 127.0.0.0/8 is this machine's loopback).
                advertise_host: format!("127.1.{}.{}", index / 250, index % 250 + 1),
                gpus: options.gpus,
                work: options.work,
                telemetry_interval: options.telemetry_interval,
                disk: NodeDisk::default(),
                events: events.clone(),
            },
            life: None,
            back_at: None,
        })
        .collect())
}

async fn wait_for_ready(client: &Client, count: usize) -> Result<(), FleetError> {
    let timeout = Duration::from_secs(60) + Duration::from_millis(50) * count as u32;
    let deadline = Instant::now() + timeout;
    loop {
        let nodes = client.nodes().await?;
        let ready = nodes
            .iter()
            .filter(|node| node.state == NodeState::Ready)
            .count();
        if ready >= count {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(FleetError::Head(format!(
                "{ready} of {count} nodes ready after {timeout:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Submits every experiment (each waits while the head refuses for too many
/// pending trials, and is sent again on a new connection when the head was
/// killed under it); the ids, in order.
async fn submit_all(
    admin: String,
    options: FleetOptions,
    submitted_trials: Arc<AtomicUsize>,
) -> Result<Vec<xp_runtime::ids::ExperimentId>, FleetError> {
    let mut client = Client::connect(&admin).await?;
    let mut ids = Vec::new();
    let mut left = options.trials;
    let mut index = 0;
    while left > 0 {
        let trials = left.min(TRIALS_PER_EXPERIMENT);
        let gang = options.gang_every > 0 && index % options.gang_every == options.gang_every - 1;
        let spec = fleet_spec(format!("fleet-{index}"), trials, gang, options.gpus);
        let submit = SubmitOptions {
            rerun: true,
            ..SubmitOptions::default()
        };
        let submitted = loop {
            match client.submit(&spec, &submit).await {
                Ok(submitted) => break submitted,
                Err(SdkError::Transport(_)) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if let Ok(again) = Client::connect(&admin).await {
                        client = again;
                    }
                }
                Err(error) => return Err(error.into()),
            }
        };
        ids.push(submitted.experiment);
        submitted_trials.fetch_add(trials as usize, Ordering::Relaxed);
        left -= trials;
        index += 1;
    }
    client.close().await;
    Ok(ids)
}

/// An experiment of `trials` one-GPU trials, or of gangs of two workers with
/// every GPU of a node each (the bench experiment, with GPUs).
fn fleet_spec(name: String, trials: u32, gang: bool, gpus: u32) -> ExperimentSpec {
    let mut spec = super::bench_spec(name, vec!["simulated".to_owned()], trials);
    spec.trial.workers = Workers::fixed(if gang { 2 } else { 1 });
    spec.trial.resources.gpu = if gang { f64::from(gpus) } else { 1.0 };
    spec
}

/// Waits (up to 60 s) until every submitted trial has ended; how many
/// succeeded and how many did not (or are missing).
async fn settle(
    admin: &str,
    experiments: &[xp_runtime::ids::ExperimentId],
    trials: u32,
) -> Result<(u32, u32), FleetError> {
    let client = Client::connect(admin).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut ended = 0;
        let mut succeeded = 0;
        for experiment in experiments {
            let status = client.experiment(*experiment).await?;
            for trial in &status.trials {
                ended += u32::from(trial.state.is_terminal());
                succeeded += u32::from(trial.state == TrialState::Succeeded);
            }
        }
        if ended >= trials || Instant::now() >= deadline {
            client.close().await;
            return Ok((succeeded, trials.saturating_sub(succeeded)));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The soak's running state.
struct Soak<'a> {
    options: &'a FleetOptions,
    ledger: Ledger,
    /// Trials submitted so far.
    submitted: Arc<AtomicUsize>,
    rng: SplitMix64,
    kills: u64,
    head_restarts: u32,
    head_cpu: f64,
    /// Commits and records of the head's lives that ended.
    commits: (f64, f64),
}

impl Soak<'_> {
    /// Ticks until every trial's work is done once or the time is up.
    async fn run(
        &mut self,
        head: &mut HeadProcess,
        nodes: &mut [FleetNode],
        events: &mut mpsc::UnboundedReceiver<FleetEvent>,
    ) -> Result<(), FleetError> {
        let deadline = Instant::now() + self.options.timeout;
        let total = self.options.trials as usize;
        let mut ticker = tokio::time::interval(TICK);
        while self.ledger.completed() < total {
            ticker.tick().await;
            self.take_events(events);
            if Instant::now() >= deadline {
                return Err(FleetError::Head(format!(
                    "{} of {total} trials done after {:?}",
                    self.ledger.completed(),
                    self.options.timeout
                )));
            }
            self.churn(nodes);
            let half_done = self.ledger.completed() * 2 >= total;
            if self.options.head_restart && self.head_restarts == 0 && half_done {
                self.add_commits(head).await;
                head.kill_and_restart().await?;
                self.head_restarts += 1;
            }
            self.head_cpu = head.sample();
        }
        Ok(())
    }

    fn take_events(&mut self, events: &mut mpsc::UnboundedReceiver<FleetEvent>) {
        // Work waits while some submitted trial never started (a requeued
        // one is missed: the figure errs towards fewer samples).
        let waiting = self.submitted.load(Ordering::Relaxed) > self.ledger.trials_started();
        while let Ok(event) = events.try_recv() {
            self.ledger.record(&event, waiting);
        }
    }

    /// Kills each live node with the churn's odds for one tick, and brings
    /// back those whose time away is over.
    fn churn(&mut self, nodes: &mut [FleetNode]) {
        let now = Instant::now();
        let odds = self.options.churn * TICK.as_secs_f64() / 60.0;
        for node in nodes {
            match node.back_at {
                Some(back_at) if now >= back_at => node.start(),
                Some(_) => {}
                None if odds > 0.0 && self.rng.next_f64() < odds => {
                    node.kill(now + self.options.rejoin_after);
                    self.ledger.node_died(node.node.node_id);
                    self.kills += 1;
                }
                None => {}
            }
        }
    }

    /// Adds the running head's commit counts from `/metrics`.
    async fn add_commits(&mut self, head: &HeadProcess) {
        if let Some((commits, records)) = commit_counts(head).await {
            self.commits.0 += commits;
            self.commits.1 += records;
        }
    }

    fn report(&self, seconds: f64, succeeded: u32, lost: u32, peak_rss: u64) -> FleetReport {
        let mut waits: Vec<f64> = self
            .ledger
            .freed_to_launch
            .iter()
            .map(|wait| wait.as_secs_f64() * 1000.0)
            .collect();
        waits.sort_by(f64::total_cmp);
        let at = |q| quantile(&waits, q).unwrap_or(f64::NAN);
        FleetReport {
            nodes: self.options.nodes,
            trials: self.options.trials,
            seconds,
            placements: self.ledger.starts,
            kills: self.kills,
            head_restarts: self.head_restarts,
            registrations: self.ledger.registrations,
            freed_to_launch_ms: (at(0.5), at(0.99)),
            head_cpu_seconds: self.head_cpu,
            head_peak_rss: peak_rss,
            commits: self.commits.0,
            committed_records: self.commits.1,
            succeeded,
            lost,
            duplicated: self.ledger.duplicated.len() as u32,
            redone: self.ledger.redone() as u32,
        }
    }
}

/// `xp_commit_records`' count and sum from the head's `/metrics`.
async fn commit_counts(head: &HeadProcess) -> Option<(f64, f64)> {
    let admin: xp_runtime::join::JoinString = head.admin.parse().ok()?;
    let text = reqwest::Client::new()
        .get(format!("http://{}/metrics", head.http))
        .bearer_auth(admin.token)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let value = |series: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.parse::<f64>().ok())
    };
    Some((
        value("xp_commit_records_count")?,
        value("xp_commit_records_sum")?,
    ))
}
