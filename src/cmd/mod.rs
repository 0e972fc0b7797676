//! The `xp` commands, one file each: their arguments and what they do.
//!
//! Every command writes its output through [`outln!`], one line at a time with
//! every control character in it escaped (`terminal`), so a reader that goes away
//! (`xp status | head -1`) ends the command quietly instead of a panic, and its
//! notes and errors through [`eprintln_note`], which never panics either: `xp`
//! exits with its own status (0, or 1 on an error) whatever its stdout and
//! stderr are, closed pipes included, never 101.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};
use xp::Client;
use xp_runtime::join::JoinString;

pub(crate) use terminal::shown;

/// `println!` for the commands' output: one line, in which every control
/// character (a newline too) of what it prints is shown as an escape, so user
/// text can neither drive the terminal nor forge a line; a closed pipe ends
/// the command quietly, and any other failure to write says so and exits
/// non-zero.
macro_rules! outln {
    () => {
        $crate::cmd::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cmd::write_line(format_args!($($arg)*))
    };
}

mod admin;
mod alerts;
mod audit;
mod bench;
mod cancel;
mod checkpoints;
mod compare;
mod ended;
mod leases;
mod logs;
mod metrics;
mod nodes;
mod offline;
mod pipeline;
mod progress;
mod queue;
mod report;
mod run;
mod sim;
mod status;
mod submit;
mod terminal;
mod top;
mod trial_detail;
mod tune;
mod watch;

#[derive(Parser, Debug)]
#[command(
    name = "xp",
    version,
    about = "Run many ML experiments in parallel on a cluster and keep an exact record of each"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How a command reaches the cluster. The credential (a user's, printed by
/// `xp-head user add`, or the first admin's, printed as `admin:` by `xp-head
/// start`) holds a personal secret: the `XP_CLUSTER` environment variable or
/// `--cluster-file` keep it out of `ps`, while `--cluster` still works but shows
/// it to every local user.
#[derive(clap::Args, Debug)]
pub(crate) struct ClusterArg {
    /// Your credential (`xp://HOST:PORT?token=SECRET&ca=...`, from `xp-head user
    /// add`). Prefer setting the XP_CLUSTER environment variable (or
    /// --cluster-file): an argument is visible to every local user in `ps`.
    #[arg(long, env = "XP_CLUSTER", hide_env_values = true)]
    pub(crate) cluster: Option<String>,
    /// A file holding your credential; only its owner may read it (`chmod 600`).
    #[arg(long, value_name = "FILE")]
    pub(crate) cluster_file: Option<std::path::PathBuf>,
}

impl ClusterArg {
    /// The join string: from `--cluster-file` when given, else `--cluster` or
    /// `XP_CLUSTER`; warns once when it came from the command line.
    pub(crate) fn join(&self) -> anyhow::Result<JoinString> {
        if let Some(path) = &self.cluster_file {
            return Ok(xp_runtime::join::read_join_file(path)?);
        }
        let cluster = self.cluster.as_deref().context(
            "no cluster named: set XP_CLUSTER to your credential (from `xp-head user add`), or pass --cluster-file FILE",
        )?;
        if std::env::var("XP_CLUSTER").ok().as_deref() != Some(cluster) {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln_note(
                    "warning: --cluster shows your secret to every local user in `ps`; set XP_CLUSTER or use --cluster-file instead",
                );
            });
        }
        cluster.parse().context("the join string is invalid")
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an experiment to its end (on a local cluster unless one is named) and print its results.
    Run(run::RunArgs),
    /// Submit an experiment declared in YAML and print its id.
    Submit(submit::SubmitArgs),
    /// Show experiments and their trials.
    Status(status::StatusArgs),
    /// Cancel an experiment or a single trial.
    Cancel(cancel::CancelArgs),
    /// Print a worker's output.
    Logs(logs::LogsArgs),
    /// List the cluster's nodes.
    Nodes(nodes::NodesArgs),
    /// Statistics of seed replicates per configuration, and significance against the best.
    Compare(compare::CompareArgs),
    /// A trial's metric history, optionally smoothed.
    Metrics(metrics::MetricsArgs),
    /// Optimise any black-box command on this machine: `xp tune --space S.yaml -- CMD ARGS...`.
    Tune(tune::TuneArgs),
    /// Replay a workload trace through the scheduling policy on a simulated cluster.
    Sim(sim::SimArgs),
    /// The scheduling queues: usage, quota, borrowed, lent, pending, fair share,
    /// leases and preemptions waiting for approval.
    Queue(queue::QueueArgs),
    /// Shared leases: capacity, holders and waiters.
    Leases(leases::LeasesArgs),
    /// The checkpoints kept for an experiment's trials, and where their replicas are.
    Checkpoints(checkpoints::CheckpointsArgs),
    /// Alerts raised on trials (NaN metrics, thresholds, divergence, silence, idle GPUs), newest first.
    Alerts(alerts::AlertsArgs),
    /// Arbitration by an admin; each action is recorded with who and why.
    Admin(admin::AdminArgs),
    /// The head's audit trail: admin actions and refusals (admins only).
    Audit(audit::AuditArgs),
    /// What it cost and whether it paid: GPU-hours used and lost, cost, utilisation, Little's law, return on GPU-hours, Amdahl.
    Report(report::ReportArgs),
    /// A live full-screen view of the cluster: nodes, queues, running trials, events.
    Top(top::TopArgs),
    /// Measure the runtime on an embedded local cluster.
    #[command(subcommand)]
    Bench(bench::Bench),
    /// Pipelines of dependent stages: submit, status, cancel, retry, list.
    #[command(subcommand)]
    Pipeline(pipeline::PipelineCommand),
}

/// Runs the command the user asked for.
/// The exit status for a command that failed with `error`: how the
/// experiment ended for `xp run` and `xp submit --wait` ([`ended`]), 1 for
/// anything else.
pub(crate) fn exit_code(error: &anyhow::Error) -> u8 {
    error
        .downcast_ref::<ended::Ended>()
        .map_or(1, ended::Ended::exit_code)
}

pub(crate) async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::run(args).await,
        Command::Submit(args) => submit::run(args).await,
        Command::Status(args) => status::run(args).await,
        Command::Cancel(args) => cancel::run(args).await,
        Command::Logs(args) => logs::run(args).await,
        Command::Nodes(args) => nodes::run(args).await,
        Command::Compare(args) => compare::run(args).await,
        Command::Metrics(args) => metrics::run(args).await,
        Command::Tune(args) => tune::run(args).await,
        Command::Sim(args) => sim::run(args),
        Command::Queue(args) => queue::run(args).await,
        Command::Leases(args) => leases::run(args).await,
        Command::Checkpoints(args) => checkpoints::run(args).await,
        Command::Alerts(args) => alerts::run(args).await,
        Command::Admin(args) => admin::run(args).await,
        Command::Audit(args) => audit::run(args).await,
        Command::Report(args) => report::run(args).await,
        Command::Top(args) => top::run(args).await,
        Command::Bench(bench) => bench::run(bench).await,
        Command::Pipeline(command) => pipeline::run(command).await,
    }
}

/// Writes one line of the command's output to stdout, its control characters
/// escaped (see [`outln!`]).
pub(crate) fn write_line(line: std::fmt::Arguments<'_>) {
    let line = line.to_string();
    write_stdout(&format!("{}\n", shown(&line)));
}

/// Writes text that is several lines by design (a CSV trace, pretty JSON) to
/// stdout: its newlines stay, every other control character is escaped.
pub(crate) fn write_output(text: std::fmt::Arguments<'_>) {
    let text = text.to_string();
    write_stdout(&terminal::shown_lines(&text));
}

fn write_stdout(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        exit_on_output_error(&error);
    }
}

/// A reader that went away (`| head -1`) is not an error: stop quietly, as `cat`
/// does. Any other failure to write (a full disk behind a redirect) is one.
pub(crate) fn exit_on_output_error(error: &std::io::Error) -> ! {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln_note(&format!("error: cannot write the output: {error}"));
    std::process::exit(1);
}

async fn connect(cluster: &ClusterArg) -> anyhow::Result<Client> {
    Client::connect_to(&cluster.join()?)
        .await
        .context("cannot connect to the cluster")
}

/// Writes a note (progress, a warning, the final error) to stderr, so stdout
/// stays parseable, its control characters but newlines escaped (user text
/// in it that must stay on one line goes through [`shown`] first). Best
/// effort: where stderr cannot be written (a closed pipe) the note is lost,
/// but the command goes on and exits with its own status; `eprintln!` would
/// panic.
pub(crate) fn eprintln_note(note: &str) {
    let mut stderr = std::io::stderr().lock();
    let note = terminal::shown_lines(note);
    let _ = writeln!(stderr, "{note}").and_then(|()| stderr.flush());
}
