//! `xp bench`: measure the runtime on this machine (all-reduce, object store, no-op trials,
//! worker logs), each against a reference measured in the same run; and soak a real head
//! with many simulated nodes (`fleet`).

use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Subcommand, Debug)]
pub(crate) enum Bench {
    /// Ring all-reduce time and bandwidth, against QUIC, TCP and memory-copy ceilings.
    Allreduce {
        /// Ranks in the ring (all on this machine).
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// Buffer sizes in bytes; repeat the flag for several.
        #[arg(long = "size", default_values_t = [4096usize, 1 << 20, 16 << 20, 64 << 20])]
        sizes: Vec<usize>,
        /// The links.
        #[arg(long, default_value = "tcp", value_parser = ["quic", "tcp", "shm"])]
        transport: String,
        /// One JSON line per size.
        #[arg(long)]
        json: bool,
    },
    /// Object store put/get, remote get and checkpoint throughput, against memory
    /// copy and loopback TCP measured in the same run.
    Objects {
        /// Object sizes in bytes; repeat the flag for several.
        #[arg(long = "size", default_values_t = [1u64 << 20, 16 << 20, 256 << 20, 1 << 30])]
        sizes: Vec<u64>,
        /// The checkpoint saved and restored, in bytes (0 skips it).
        #[arg(long, default_value_t = 512 << 20)]
        checkpoint_bytes: u64,
        /// Where the stores live (a temporary directory under it); the system's
        /// temporary directory when absent.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// One JSON line per measurement.
        #[arg(long)]
        json: bool,
    },
    /// Worker output through the node's log path (pipes, metric parsing, the
    /// capped log), against `cat` of the same bytes into a file, with and without
    /// a pipe, measured in the same run.
    Logs {
        /// How much output the worker prints, such as 200MiB.
        #[arg(long, value_parser = xp_runtime::spec::parse_memory, default_value = "200MiB")]
        size: u64,
        /// The worker's log cap (`xp-node join --log-cap`).
        #[arg(long, value_parser = xp_runtime::spec::parse_memory, default_value = "64MiB")]
        log_cap: u64,
        /// Where the output and logs live (a temporary directory under it); the
        /// system's temporary directory when absent.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Print one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Throughput and start latency of no-op trials.
    Trials {
        /// How many trials.
        #[arg(long, default_value_t = 200)]
        trials: u32,
        /// How many one-core slots the local node offers.
        #[arg(long, default_value_t = 8)]
        slots: u32,
        /// Then group commit against one commit per change: how many trials
        /// report metrics at once (0 skips the comparison).
        #[arg(long, default_value_t = 32)]
        reporters: u32,
        /// How many metric lines each of them prints.
        #[arg(long, default_value_t = 100)]
        reports: u32,
        /// Milliseconds between two metric lines of one trial (0: no pause).
        #[arg(long, default_value_t = 5)]
        every_ms: u32,
        /// Then each measurement again with the head's records in PostgreSQL:
        /// a throw-away server made with initdb in a temporary directory (fsync
        /// on, as the embedded store syncs), a fresh database per head. Needs
        /// PostgreSQL's server programs (Debian: postgresql).
        #[arg(long)]
        postgres: bool,
        /// Print one JSON line per measurement.
        #[arg(long)]
        json: bool,
    },
    /// Soak a real head (an `xp-head` process) with many simulated nodes in this
    /// process, each with its own QUIC session, heartbeats, telemetry and workers
    /// that report, checkpoint and exit, while nodes die and return and the head
    /// is killed and started again; then count lost and duplicated trials.
    Fleet(FleetArgs),
}

/// `xp bench fleet`'s options.
#[derive(clap::Args, Debug)]
pub(crate) struct FleetArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    nodes: u32,
    /// Whole GPUs each node declares.
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Trials in all, in experiments of 100; twice the GPUs when absent.
    #[arg(long)]
    trials: Option<u32>,
    /// Every this many experiments is one of gangs of two whole nodes (0: none).
    #[arg(long, default_value_t = 10)]
    gang_every: u32,
    /// Steps of each worker (one metric each).
    #[arg(long, default_value_t = 10)]
    steps: u32,
    /// Time per step.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "500ms")]
    step_time: std::time::Duration,
    /// Rank 0 checkpoints every this many steps (0: never).
    #[arg(long, default_value_t = 4)]
    checkpoint_every: u32,
    /// The share of the live nodes killed per minute (0 to 1).
    #[arg(long, default_value_t = 0.05)]
    churn: f64,
    /// How long a killed node stays away.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    rejoin_after: std::time::Duration,
    /// Do not kill and restart the head halfway.
    #[arg(long)]
    no_head_restart: bool,
    /// The head's --node-timeout.
    #[arg(long, default_value = "3s")]
    node_timeout: String,
    /// How often each node sends telemetry (0s: never).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    telemetry_interval: std::time::Duration,
    /// The most time the soak may take.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    timeout: std::time::Duration,
    /// Seeds which nodes die when.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The `xp-head` program; the one beside `xp` when absent.
    #[arg(long)]
    head_bin: Option<PathBuf>,
    /// Keep the head's data directory and log (`head.log`) here; a temporary
    /// directory, removed at the end, when absent.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(bench: Bench) -> anyhow::Result<()> {
    match bench {
        Bench::Allreduce {
            workers,
            sizes,
            transport,
            json,
        } => allreduce(workers, sizes, transport, json).await,
        Bench::Objects {
            sizes,
            checkpoint_bytes,
            dir,
            json,
        } => objects(sizes, checkpoint_bytes, dir, json).await,
        Bench::Logs {
            size,
            log_cap,
            dir,
            json,
        } => logs(size, log_cap, dir, json).await,
        Bench::Fleet(args) => fleet(args).await,
        Bench::Trials {
            trials,
            slots,
            reporters,
            reports,
            every_ms,
            postgres,
            json,
        } => {
            let server = postgres
                .then(|| xp_head::test_postgres::TestPostgres::start(true))
                .transpose()
                .map_err(|reason| anyhow::anyhow!("--postgres: {reason}"))?;
            let store = |name: &str| -> anyhow::Result<Option<xp_head::PostgresTarget>> {
                let Some(server) = &server else {
                    return Ok(None);
                };
                let url = server
                    .create_database(name)
                    .map_err(|reason| anyhow::anyhow!("--postgres: {reason}"))?;
                Ok(Some(xp_head::PostgresTarget::parse(&url, None)?))
            };
            no_op_trials(trials, slots, None, json).await?;
            if let Some(target) = store("bench_trials")? {
                no_op_trials(trials, slots, Some(target), json).await?;
            }
            if reporters > 0 {
                let commits = Commits {
                    reporters,
                    reports,
                    every_ms,
                };
                commit_comparison(&commits, None, json).await?;
                if server.is_some() {
                    let stores = [store("bench_one_commit")?, store("bench_group_commit")?];
                    commit_comparison(&commits, stores[0].clone().zip(stores[1].clone()), json)
                        .await?;
                }
            }
            Ok(())
        }
    }
}

async fn allreduce(
    workers: u32,
    sizes: Vec<usize>,
    transport: String,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=64).contains(&workers),
        "--workers must be between 1 and 64"
    );
    anyhow::ensure!(
        sizes.iter().all(|size| (4..=(1usize << 31)).contains(size)),
        "--size must be between 4 bytes and 2 GiB"
    );
    let kind: xp_runtime::collective::TransportKind = transport.parse()?;
    let config = xp_runtime::collective::CollectiveConfig::default();
    let ceilings = xp_runtime::collective::bench::ceilings(64 << 20, &config)
        .await
        .context("measuring the ceilings")?;
    let measurements = xp_runtime::collective::bench::bench_allreduce(workers, &sizes, kind)
        .await
        .context("running the all-reduce")?;
    if !json {
        outln!(
            "ceilings: QUIC p2p {:.2} GB/s ({:.2} CPU cores busy), loopback TCP {:.2} GB/s, memcpy {:.2} GB/s",
            ceilings.quic_p2p_gbps,
            ceilings.quic_p2p_cpu_cores,
            ceilings.tcp_loopback_gbps,
            ceilings.memcpy_gbps,
        );
        outln!(
            "{:>12} {:>8} {:>10} {:>12} {:>12} {:>12} {:>10}",
            "size_bytes",
            "workers",
            "transport",
            "time_ms",
            "algbw_GB/s",
            "busbw_GB/s",
            "cpu_cores"
        );
    }
    for measurement in &measurements {
        if json {
            outln!(
                "{}",
                serde_json::json!({
                    "size_bytes": measurement.size_bytes,
                    "workers": measurement.workers,
                    "transport": measurement.transport.name(),
                    "time_s": measurement.time_s,
                    "algbw_gbps": measurement.algbw_gbps,
                    "busbw_gbps": measurement.busbw_gbps,
                    "cpu_cores": measurement.cpu_cores,
                    "quic_p2p_gbps": ceilings.quic_p2p_gbps,
                    "quic_p2p_cpu_cores": ceilings.quic_p2p_cpu_cores,
                    "tcp_loopback_gbps": ceilings.tcp_loopback_gbps,
                    "memcpy_gbps": ceilings.memcpy_gbps,
                })
            );
        } else {
            outln!(
                "{:>12} {:>8} {:>10} {:>12.3} {:>12.3} {:>12.3} {:>10.2}",
                measurement.size_bytes,
                measurement.workers,
                measurement.transport.name(),
                measurement.time_s * 1e3,
                measurement.algbw_gbps,
                measurement.busbw_gbps,
                measurement.cpu_cores
            );
        }
    }
    Ok(())
}

async fn objects(
    sizes: Vec<u64>,
    checkpoint_bytes: u64,
    dir: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        sizes
            .iter()
            .chain([&checkpoint_bytes])
            .all(|size| *size <= 4 << 30),
        "sizes must be at most 4 GiB"
    );
    anyhow::ensure!(
        sizes.iter().all(|size| *size > 0),
        "--size must be positive"
    );
    let scratch = match &dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("cannot create a scratch directory")?;
    let measurements = xp::bench_objects(scratch.path(), &sizes, checkpoint_bytes)
        .await
        .map_err(|error| anyhow::anyhow!(error))
        .context("the objects bench failed")?;
    if !json {
        outln!(
            "{:<19} {:<7} {:>12} {:>10} {:>12} {:>7}  REFERENCE",
            "OP",
            "TIER",
            "SIZE_BYTES",
            "GB/s",
            "REF_GB/s",
            "RATIO"
        );
    }
    for measurement in &measurements {
        let ratio = measurement.gbps / measurement.reference_gbps;
        if json {
            outln!(
                "{}",
                serde_json::json!({
                    "op": measurement.op,
                    "tier": measurement.tier,
                    "size_bytes": measurement.size_bytes,
                    "gbps": measurement.gbps,
                    "reference_gbps": measurement.reference_gbps,
                    "reference": measurement.reference,
                    "ratio": ratio,
                })
            );
        } else {
            outln!(
                "{:<19} {:<7} {:>12} {:>10.3} {:>12.3} {:>7.2}  {}",
                measurement.op,
                measurement.tier,
                measurement.size_bytes,
                measurement.gbps,
                measurement.reference_gbps,
                ratio,
                measurement.reference
            );
        }
    }
    Ok(())
}

async fn logs(size: u64, log_cap: u64, dir: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=16 << 30).contains(&size),
        "--size must be between 1 byte and 16 GiB"
    );
    let cap = xp_node::LogCap::new(log_cap).context("--log-cap")?;
    let scratch = match &dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("cannot create a scratch directory")?;
    let result = xp::bench_logs(scratch.path(), size, cap)
        .await
        .map_err(|error| anyhow::anyhow!(xp_runtime::error_chain::error_chain(&error)))
        .context("the logs bench failed")?;
    let node = result.mbps(result.node_seconds);
    let direct = result.mbps(result.direct_seconds);
    let piped = result.mbps(result.piped_seconds);
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "bytes": result.bytes,
                "log_cap": result.cap,
                "node_mbps": node,
                "cat_to_file_mbps": direct,
                "cat_pipe_cat_to_file_mbps": piped,
                "metric_lines": result.metric_lines,
                "metrics_reported": result.metrics_reported,
                "kept_bytes": result.kept_bytes,
            })
        );
    } else {
        outln!(
            "{} bytes of worker output (a metric line every {} lines), best of 3:
  through the node's log path: {:>8.1} MB/s ({:.2} s); {} of {} metric lines reported; {} bytes kept under a cap of {}
  cat FILE > OUT:              {:>8.1} MB/s ({:.2} s); the node reaches {:.0}%
  cat FILE | cat > OUT:        {:>8.1} MB/s ({:.2} s); the node reaches {:.0}%",
            result.bytes,
            xp_node::METRIC_EVERY,
            node,
            result.node_seconds,
            result.metrics_reported,
            result.metric_lines,
            result.kept_bytes,
            result.cap,
            direct,
            result.direct_seconds,
            100.0 * node / direct,
            piped,
            result.piped_seconds,
            100.0 * node / piped,
        );
    }
    Ok(())
}

/// What the commit comparison runs.
struct Commits {
    reporters: u32,
    reports: u32,
    every_ms: u32,
}

/// The name of the store a measurement ran on, for its output.
fn store_name(on_postgres: bool) -> &'static str {
    if on_postgres { "postgres" } else { "redb" }
}

/// Prints `value`, a measurement's JSON object, with the store it ran on.
fn json_line(mut value: serde_json::Value, on_postgres: bool) {
    value["store"] = store_name(on_postgres).into();
    outln!("{value}");
}

async fn commit_comparison(
    commits: &Commits,
    stores: Option<(xp_head::PostgresTarget, xp_head::PostgresTarget)>,
    json: bool,
) -> anyhow::Result<()> {
    let Commits {
        reporters,
        reports,
        every_ms,
    } = *commits;
    anyhow::ensure!(
        reports > 0 && reporters <= 1024 && reports <= 100_000,
        "--reports must be positive, --reporters at most 1024 and --reports at most 100000"
    );
    let on_postgres = stores.is_some();
    let stores = stores.map(|(one, group)| [one, group]);
    let result = xp::bench_commits(reporters, reports, every_ms, stores)
        .await
        .context("the commit comparison failed")?;
    if json {
        json_line(result.to_json(), on_postgres);
    } else {
        outln!(
            "[{}] {} trials each reporting {} metrics {} ms apart: {:.0} reports/s with group commit, {:.0} reports/s with one commit per change (--commit-batch 1): {:.1}x",
            store_name(on_postgres),
            result.reporters,
            result.reports_each,
            result.every_ms,
            result.group_commit,
            result.one_commit_each,
            result.group_commit / result.one_commit_each
        );
    }
    Ok(())
}

async fn no_op_trials(
    trials: u32,
    slots: u32,
    store: Option<xp_head::PostgresTarget>,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        trials > 0 && slots > 0,
        "--trials and --slots must be positive"
    );
    let on_postgres = store.is_some();
    let result = xp::bench_trials(trials, slots, store)
        .await
        .context("the trials bench failed")?;
    if json {
        json_line(result.to_json(), on_postgres);
    } else {
        outln!(
            "[{}] {} no-op trials on {} slots in {:.2} s: {:.1} trials/s ({:.0}% of the {:.0} processes/s spawned directly)",
            store_name(on_postgres),
            result.trials,
            result.slots,
            result.seconds,
            result.trials_per_second,
            100.0 * result.trials_per_second / result.direct_spawns_per_second,
            result.direct_spawns_per_second,
        );
        outln!(
            "submit -> running: p50 {:.0} ms, p99 {:.0} ms (includes queueing)",
            result.submit_to_running_ms.0,
            result.submit_to_running_ms.1,
        );
        outln!(
            "placed -> running: p50 {:.0} ms, p99 {:.0} ms",
            result.placed_to_running_ms.0,
            result.placed_to_running_ms.1
        );
    }
    Ok(())
}

async fn fleet(args: FleetArgs) -> anyhow::Result<()> {
    let head_binary = match args.head_bin {
        Some(path) => path,
        None => std::env::current_exe()
            .context("finding this program")?
            .with_file_name("xp-head"),
    };
    anyhow::ensure!(
        head_binary.is_file(),
        "{} not found: build it (cargo build -p xp-head) or name it with --head-bin",
        head_binary.display()
    );
    let options = xp::FleetOptions {
        head_binary,
        nodes: args.nodes,
        gpus: args.gpus,
        trials: args
            .trials
            .unwrap_or_else(|| args.nodes.saturating_mul(args.gpus).saturating_mul(2)),
        gang_every: args.gang_every,
        work: xp_node::fleet::FakeWork {
            steps: args.steps,
            step_time: args.step_time,
            checkpoint_every: args.checkpoint_every,
        },
        churn: args.churn,
        rejoin_after: args.rejoin_after,
        head_restart: !args.no_head_restart,
        node_timeout: args.node_timeout,
        telemetry_interval: args.telemetry_interval,
        timeout: args.timeout,
        seed: args.seed,
        dir: args.dir,
    };
    let report = xp::bench_fleet(options)
        .await
        .context("the fleet soak failed")?;
    if args.json {
        outln!("{}", report.to_json());
    } else {
        print_fleet(&report);
    }
    anyhow::ensure!(
        report.lost == 0 && report.duplicated == 0,
        "{} trials lost and {} duplicated",
        report.lost,
        report.duplicated
    );
    Ok(())
}

fn print_fleet(report: &xp::FleetReport) {
    let json = report.to_json();
    let number = |key: &str| json[key].as_f64().unwrap_or(f64::NAN);
    outln!(
        "{} simulated nodes, {} trials in {:.1} s: {} placements ({:.1}/s), {} node kills, {} head restarts, {} registrations",
        report.nodes,
        report.trials,
        report.seconds,
        report.placements,
        number("placements_per_second"),
        report.kills,
        report.head_restarts,
        report.registrations,
    );
    outln!(
        "freed node -> next launch while work waits: p50 {:.0} ms, p99 {:.0} ms",
        report.freed_to_launch_ms.0,
        report.freed_to_launch_ms.1
    );
    outln!(
        "head: {:.1} CPU s ({:.0}% of a core), peak RSS {:.0} MiB, {:.0} commits of {:.1} records on average",
        report.head_cpu_seconds,
        100.0 * number("head_cpu_share"),
        number("head_peak_rss_mib"),
        report.commits,
        number("records_per_commit"),
    );
    outln!(
        "trials: {} succeeded, {} lost, {} duplicated, {} redone after a finished attempt",
        report.succeeded,
        report.lost,
        report.duplicated,
        report.redone
    );
}
