//! The `xp-node` binary: joins a cluster and runs workers until SIGTERM or Ctrl-C.
//!
//! Only parses the command line, installs the tracing subscriber (`XP_LOG`) and
//! turns signals into the shutdown token; the node itself is `xp_node::run`.
//!
//! A secret handed over in the environment (`XP_JOIN`, or a user's
//! `XP_CLUSTER` that `sbatch` passed on) stays readable in
//! `/proc/PID/environ` for the life of the process whatever the process does to
//! its own copy, so the node first re-executes itself without it
//! ([`reexec_without_secrets`]): the join string travels to the new image
//! through an inherited pipe, and the running node's environment and
//! arguments hold no secret.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use xp_runtime::join::JoinString;

#[derive(Parser, Debug)]
#[command(
    name = "xp-node",
    version,
    about = "The xp node agent: offers this machine's slots to an xp cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Join the cluster named by a join string. The join string holds the
    /// cluster secret, so it is never an argument (every local user sees
    /// arguments in `ps`): give it in a file (`--join-file`), in the `XP_JOIN`
    /// environment variable, or as `-` to read one line from standard input.
    Join(JoinArgs),
}

/// The arguments of `xp-node join`.
#[derive(clap::Args, Debug)]
struct JoinArgs {
    /// Only `-`: read the join string from standard input.
    #[arg(value_name = "-")]
    join: Option<String>,
    /// A file holding the join string printed by `xp-head start`; only its
    /// owner may read it (`chmod 600`).
    #[arg(long, value_name = "FILE")]
    join_file: Option<PathBuf>,
    /// Where logs and cached binaries are kept.
    #[arg(long)]
    data_dir: PathBuf,
    /// Declare N GPU slots (machines without NVML); NVML decides when absent,
    /// and inside a Slurm job the GPUs the job was granted.
    #[arg(long)]
    gpus: Option<u32>,
    /// CPU cores to offer; all when absent (inside a Slurm job, the job's).
    #[arg(long)]
    cpus: Option<f64>,
    /// Memory to offer, such as 16GiB; all when absent (inside a Slurm job,
    /// the job's).
    #[arg(long, value_parser = xp_runtime::spec::parse_memory)]
    memory: Option<u64>,
    /// A label KEY=VALUE, repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// The host or address other nodes and their workers reach this one at.
    /// When absent, the local address of the route to the head (never the
    /// host name, which may resolve to a loopback address).
    #[arg(long)]
    advertise: Option<String>,
    /// Memory the object store may use before spilling to disk, such as 1GiB.
    #[arg(long, value_parser = xp_runtime::spec::parse_memory, default_value = "1GiB")]
    object_memory: u64,
    /// Disk the object store may use under the data directory, such as 100GiB.
    #[arg(long, value_parser = xp_runtime::spec::parse_memory, default_value = "256GiB")]
    object_disk: u64,
    /// The UDP port other nodes fetch objects from (QUIC), also the TCP port
    /// of the bulk path of trials on trusted networks (`transport: tcp`) when
    /// that number is free there; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    object_port: u16,
    /// A durable directory (such as a shared file system mounted at the same
    /// path on every node) that each checkpoint is also written to, so that
    /// losing every node holding it loses nothing.
    #[arg(long)]
    checkpoint_backup: Option<PathBuf>,
    /// The most disk each worker's log keeps, such as 64MiB: the first half of
    /// its output and a rolling tail, with a marker saying what was dropped
    /// between. 64MiB holds about half a million lines of 128 bytes, far more
    /// than a training run usually prints, so ordinary logs are never cut,
    /// while a worker printing in a loop cannot fill the disk: 16 workers stay
    /// within 1GiB per round of attempts, and `xp logs` reads a whole log in
    /// seconds.
    #[arg(long, value_parser = xp_runtime::spec::parse_memory, default_value = "64MiB")]
    log_cap: u64,
    /// User ids for workers, START-END, or `none`. On a node running as root
    /// the ranks of each live trial attempt run under an id of this range
    /// that no other live attempt has (group id the same number), shared by
    /// those ranks only, with their work directories owned by it, so workers
    /// of different trials cannot read each other's memory, environment or
    /// files. The ids must belong to no account or other program: the node
    /// kills whatever runs under an id before handing it out and after its
    /// last worker ends. The default, 1900000000-1900009999, lies where systemd
    /// assigns nothing (above users, dynamic service users, `nobody`,
    /// subordinate ids in /etc/subuid and nspawn containers; below 2^31, which
    /// some tools take for negative), and nodes on one machine share it
    /// without clashing (each id is claimed in /run/xp-node/uids). `none`, or
    /// a node not running as root, runs workers under the node's own id,
    /// where they can read each other; the node warns at start and `xp nodes`
    /// shows it. The directories above --data-dir must let other users pass
    /// (`chmod o+x`) and the node must be able to switch to the ids (a user
    /// namespace must map them): otherwise the default falls back to `none`
    /// with a warning, and an explicit range is an error.
    #[arg(long, value_name = "START-END|none")]
    worker_uids: Option<xp_node::WorkerUids>,
    /// The most files rank 0 of a trial may leave in `XP_OUTPUT_DIR`; past
    /// it the attempt fails saying so.
    #[arg(long, default_value_t = 1000)]
    output_max_files: usize,
    /// The most bytes (such as 1GiB) rank 0 of a trial may leave in
    /// `XP_OUTPUT_DIR`; past it the attempt fails saying so.
    #[arg(long, default_value = "1GiB")]
    output_max_bytes: bytesize::ByteSize,
    /// How often each live worker's CPU and memory and each GPU (through
    /// NVML, where present) are sampled and sent to the head; 0 turns
    /// telemetry off (between 200ms and 1h otherwise).
    #[arg(long, default_value = "5s", value_parser = parse_telemetry_interval)]
    telemetry_interval: std::time::Duration,
    /// The most time from SIGTERM to exit (2s to 10m). On SIGTERM the node
    /// tells the head it is leaving (nothing more is placed on it) and stops
    /// its workers with SIGTERM, giving them three quarters of this to
    /// checkpoint before SIGKILL, then waits until the head has stored their
    /// ends; their trials resume elsewhere without using a retry. Keep it under
    /// Slurm's KillWait (30s by default), after which Slurm kills the node.
    #[arg(long, default_value = "20s", value_parser = parse_drain_timeout)]
    drain_timeout: std::time::Duration,
    /// Read each GPU's memory for the eviction watch of oversubscribed
    /// workers from this file instead of NVML: one line per GPU,
    /// `INDEX USED_BYTES TOTAL_BYTES`, reread on every telemetry sample (for
    /// machines without NVML, stand-in GPUs and tests). A file that cannot be
    /// read or parsed is reported in the log and evicts nobody.
    #[arg(long, value_name = "FILE")]
    gpu_memory_file: Option<PathBuf>,
}

fn parse_telemetry_interval(text: &str) -> anyhow::Result<std::time::Duration> {
    let interval = humantime::parse_duration(text)?;
    Ok(xp_node::check_telemetry_interval(interval)?)
}

fn parse_drain_timeout(text: &str) -> anyhow::Result<std::time::Duration> {
    let timeout = humantime::parse_duration(text)?;
    Ok(xp_node::check_drain_timeout(timeout)?)
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("label {text:?} is not KEY=VALUE"))?;
    if key.is_empty() || key.len() > 63 || value.len() > 253 {
        return Err(format!(
            "label {text:?}: the key must be 1-63 and the value at most 253 characters"
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// What to say to someone who put the secret where `ps` shows it.
const HOW_TO_JOIN: &str = "pass the join string in a file only you can read (`--join-file FILE` after `chmod 600 FILE`), in the XP_JOIN environment variable, or on standard input (`xp-node join - --data-dir DIR < FILE`)";

/// The variable naming the descriptor through which a re-executed node gets
/// the `XP_JOIN` its first image was given (not a secret: a number).
const JOIN_FD_ENV: &str = "XP_JOIN_FD";

/// The variables that hold a secret the node must not keep in its environment.
const SECRET_ENV: [&str; 2] = [xp_runtime::join::JOIN_ENV, "XP_CLUSTER"];

/// Re-executes this program without [`SECRET_ENV`] in its environment, handing
/// `XP_JOIN`'s value to the new image through a pipe it inherits
/// ([`JOIN_FD_ENV`]); returns only when there was nothing to hide (or with
/// the reason it could not). Called first thing in `main`, before any other
/// thread starts and before standard input is read.
fn reexec_without_secrets() -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    if SECRET_ENV
        .iter()
        .all(|name| std::env::var_os(name).is_none())
    {
        return Ok(());
    }
    let mut command = std::process::Command::new("/proc/self/exe");
    command.args(std::env::args_os().skip(1));
    if let Some(name) = std::env::args_os().next() {
        command.arg0(name);
    }
    for name in SECRET_ENV {
        command.env_remove(name);
    }
    // Kept open across the exec only: O_CLOEXEC is cleared on the read end alone.
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .context("cannot make a pipe for the join string")?;
    if let Some(join) = std::env::var_os(xp_runtime::join::JOIN_ENV) {
        std::fs::File::from(write_end)
            .write_all(std::os::unix::ffi::OsStrExt::as_bytes(join.as_os_str()))
            .context("cannot hand the join string over")?;
        nix::fcntl::fcntl(
            &read_end,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .context("cannot hand the join string over")?;
        command.env(
            JOIN_FD_ENV,
            std::os::fd::AsRawFd::as_raw_fd(&read_end).to_string(),
        );
    }
    let error = command.exec();
    Err(anyhow::Error::new(error).context(format!(
        "cannot re-execute without {} in the environment, where every process of this user could read it for as long as the node runs; {HOW_TO_JOIN}",
        SECRET_ENV.join(" and ")
    )))
}

/// The join string a first image handed over through [`JOIN_FD_ENV`], if any
/// (the descriptor is read to its end and closed, and the variable removed).
fn join_from_fd() -> anyhow::Result<Option<String>> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let Some(fd) = std::env::var(JOIN_FD_ENV).ok() else {
        return Ok(None);
    };
    // SAFETY: called from `main` before the tokio runtime or any other thread starts.
    unsafe { std::env::remove_var(JOIN_FD_ENV) };
    let fd: std::os::fd::RawFd = fd
        .parse()
        .with_context(|| format!("{JOIN_FD_ENV} is not a descriptor"))?;
    anyhow::ensure!(fd > 2, "{JOIN_FD_ENV} names a standard stream");
    // SAFETY: the descriptor was left open for this image by the one before it
    // and nothing else here uses it; the file takes ownership and closes it.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut join = String::new();
    pipe.read_to_string(&mut join)
        .context("cannot read the join string handed over")?;
    Ok(Some(join))
}

/// The join string from `--join-file`, standard input (`-`) or `XP_JOIN`
/// (handed over by the image before, [`join_from_fd`]), never from an
/// argument. `XP_JOIN` is removed from the environment either way, so the
/// workers this node starts do not inherit the cluster secret.
fn read_join(argument: Option<&str>, join_file: Option<&Path>) -> anyhow::Result<JoinString> {
    let from_env = match join_from_fd()? {
        Some(join) => Some(join),
        None => std::env::var(xp_runtime::join::JOIN_ENV).ok(),
    };
    // SAFETY: called from `main` before the tokio runtime or any other thread starts.
    unsafe { std::env::remove_var(xp_runtime::join::JOIN_ENV) };
    match (argument, join_file) {
        (Some(argument), _) if argument != "-" => anyhow::bail!(
            "refusing a join string given as an argument: it holds the cluster secret, and every local user can read arguments with `ps`; {HOW_TO_JOIN}"
        ),
        (Some(_), Some(_)) => anyhow::bail!("give the join string once: `-` or --join-file"),
        (Some(_), None) => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("cannot read the join string from standard input")?;
            line.parse().context("the join string is invalid")
        }
        (None, Some(path)) => Ok(xp_runtime::join::read_join_file(path)?),
        (None, None) => from_env
            .context(format!("no join string: {HOW_TO_JOIN}"))?
            .parse()
            .with_context(|| {
                format!(
                    "the join string is invalid (from {})",
                    xp_runtime::join::JOIN_ENV
                )
            }),
    }
}

fn main() -> anyhow::Result<()> {
    reexec_without_secrets()?;
    let filter = tracing_subscriber::EnvFilter::try_from_env("XP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let Command::Join(args) = Cli::parse().command;
    let config = node_config(args)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?
        .block_on(run(config))
}

/// The node's configuration from `xp-node join`'s arguments; inside a Slurm
/// job, what the allocation grants for each resource no flag sets, and the
/// job's id as a label.
fn node_config(args: JoinArgs) -> anyhow::Result<xp_node::NodeConfig> {
    let join = read_join(args.join.as_deref(), args.join_file.as_deref())?;
    if let Some(cpus) = args.cpus {
        anyhow::ensure!(
            cpus.is_finite() && cpus > 0.0,
            "--cpus must be a positive number"
        );
    }
    let explicit = xp_node::ExplicitFlags {
        gpus: args.gpus.is_some(),
        cpus: args.cpus.is_some(),
        memory: args.memory.is_some(),
    };
    let slurm = xp_node::detect_slurm(explicit, args.checkpoint_backup.is_some())?;
    let mut labels = args.labels.into_iter().collect::<BTreeMap<_, _>>();
    if let Some(offer) = &slurm {
        // A label the operator set wins.
        labels
            .entry(xp_node::SLURM_JOB_LABEL.to_owned())
            .or_insert_with(|| offer.job_id.clone());
    }
    Ok(xp_node::NodeConfig {
        join,
        data_dir: args.data_dir,
        gpus: args.gpus,
        cpus: args
            .cpus
            .or_else(|| slurm.as_ref()?.cpus.as_ref().map(|cpus| cpus.value)),
        memory_bytes: args.memory.or_else(|| {
            slurm
                .as_ref()?
                .memory_bytes
                .as_ref()
                .map(|memory| memory.value)
        }),
        labels,
        advertise_host: args.advertise,
        object_limits: xp_node::StoreLimits {
            memory_bytes: args.object_memory,
            disk_bytes: args.object_disk,
            ..xp_node::StoreLimits::default()
        },
        object_port: args.object_port,
        checkpoint_backup: args.checkpoint_backup,
        log_cap: xp_node::LogCap::new(args.log_cap).context("--log-cap")?,
        worker_uids: args.worker_uids.unwrap_or_default(),
        output_limits: xp_node::OutputLimits {
            max_files: args.output_max_files,
            max_bytes: args.output_max_bytes.as_u64(),
        },
        telemetry_interval: args.telemetry_interval,
        granted_gpus: slurm.and_then(|offer| offer.gpus.map(|gpus| gpus.value)),
        drain_timeout: args.drain_timeout,
        gpu_memory_file: args.gpu_memory_file,
    })
}

/// Runs the node until SIGTERM or Ctrl-C.
async fn run(config: xp_node::NodeConfig) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let _signal_task = xp_runtime::task::spawn("signals", async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutting down");
        signals.cancel();
    });
    xp_node::run(config, shutdown)
        .await
        .context("the node stopped")?;
    Ok(())
}
