//! The `xp-head` binary: runs one head until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use xp_head_core::CoreConfig;

#[derive(Parser, Debug)]
#[command(
    name = "xp-head",
    version,
    about = "The xp head: placement, registry and APIs of an xp cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the head. Its first start on a data directory prints the first
    /// admin's credential (`admin:`) and the node credential (`node:`); later
    /// starts print the address only (`head:`).
    Start {
        /// UDP address for QUIC; port 0 picks a free port.
        #[arg(long, default_value = "0.0.0.0:7700")]
        listen: SocketAddr,
        /// Where the database, trust material and blobs are kept.
        #[arg(long)]
        data_dir: PathBuf,
        /// Serve the HTTP API on this address.
        #[arg(long)]
        http: Option<SocketAddr>,
        /// The host name or address to put in the join string.
        #[arg(long)]
        advertise: Option<String>,
        /// A node silent this long is lost and its trials are retried elsewhere
        /// (nodes send a heartbeat every sixth of it, between 100 ms and 1 s).
        /// After the head restarts, a node it knew gets this plus the time a node
        /// takes to notice and reconnect (12 s) to come back before it is lost.
        #[arg(long, default_value = "3s", value_parser = parse_node_timeout)]
        node_timeout: Duration,
        /// The most changes one commit of the database holds: what arrives while
        /// a commit runs is stored by the next one, with one disk sync. 1 stores
        /// each change alone (slower; for comparison).
        #[arg(long, default_value_t = xp_head::DEFAULT_COMMIT_BATCH, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65_536))]
        commit_batch: usize,
        /// The scheduling policy: a YAML file or a preset (fifo, priority, fair,
        /// backfill, default). Without it the head keeps the policy it last applied.
        #[arg(long)]
        policy: Option<String>,
        /// Keep the records in this PostgreSQL database (15 or later) instead of
        /// the data directory: `postgres://USER@HOST:PORT/DB` or `host=... user=...`.
        /// Its password comes from --store-password-file or XP_STORE_PASSWORD,
        /// never from the address.
        #[arg(long, value_name = "ADDRESS")]
        store: Option<String>,
        /// A file holding the PostgreSQL password (one line).
        #[arg(long, value_name = "FILE", requires = "store")]
        store_password_file: Option<PathBuf>,
        /// Talk TLS to PostgreSQL, checking its certificate against the CA
        /// certificates in this PEM file.
        #[arg(long, value_name = "FILE", requires = "store")]
        store_ca_file: Option<PathBuf>,
        /// Another head sharing --store, as HOST:PORT (repeatable): the join
        /// strings this head prints name it too, so nodes and clients reach
        /// whichever head leads.
        #[arg(long = "peer", value_name = "HOST:PORT", requires = "store", value_parser = parse_peer)]
        peers: Vec<(String, u16)>,
    },
    /// Print the node credential (what nodes join with), on the head machine:
    /// the first start printed it, and it is kept in the data directory.
    NodeCredential {
        /// The head's data directory.
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Work on a stopped head's store.
    Store {
        #[command(subcommand)]
        command: StoreCli,
    },
    /// Manage the cluster's users, on the head machine: through the running
    /// head, or on a stopped head's database.
    User {
        /// The head's data directory.
        #[arg(long, global = true)]
        data_dir: Option<PathBuf>,
        #[command(subcommand)]
        command: UserCli,
    },
}

#[derive(Subcommand, Debug)]
enum StoreCli {
    /// Copy every record of a stopped head's store into an empty one (a data
    /// directory or redb file to PostgreSQL, or back), then read both again
    /// and compare them table by table: rows and a digest of each.
    Copy {
        /// The store to copy: a data directory, a redb file, or a PostgreSQL
        /// address (`postgres://USER@HOST/DB`).
        from: String,
        /// The empty store to copy into, named the same ways.
        to: String,
        /// A file holding the PostgreSQL password (else XP_STORE_PASSWORD).
        #[arg(long, value_name = "FILE")]
        store_password_file: Option<PathBuf>,
        /// Talk TLS to PostgreSQL, checking it against the CAs in this PEM file.
        #[arg(long, value_name = "FILE")]
        store_ca_file: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum UserCli {
    /// Add a user and print their personal credential (shown once).
    Add {
        /// The user's name.
        name: String,
        /// Their team.
        #[arg(long)]
        team: String,
        /// Their role: viewer, member, team-admin or admin.
        #[arg(long, default_value = "member")]
        role: xp_head_core::auth::Role,
        /// Give an existing user a new credential (and this team and role);
        /// their old one stops working at once.
        #[arg(long)]
        replace: bool,
    },
    /// List the users.
    List,
    /// Change a user's role.
    Role {
        /// The user's name.
        name: String,
        /// The new role: viewer, member, team-admin or admin.
        role: xp_head_core::auth::Role,
    },
    /// Revoke a user's credential; their open connections are closed.
    Revoke {
        /// The user's name.
        name: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let cli = Cli::parse();
    match cli.command {
        Command::Start {
            listen,
            data_dir,
            http,
            advertise,
            node_timeout,
            policy,
            commit_batch,
            store,
            store_password_file,
            store_ca_file,
            peers,
        } => {
            let policy = policy.map(|name| read_policy(&name)).transpose()?;
            let store = store
                .map(|address| {
                    store_target(
                        &address,
                        store_password_file.as_deref(),
                        store_ca_file.as_deref(),
                    )
                })
                .transpose()?;
            let advertise = advertise.or_else(|| listen.ip().is_unspecified().then(hostname));
            let config = xp_head::HeadConfig {
                listen,
                data_dir,
                http,
                advertise_host: advertise,
                core: CoreConfig {
                    node_timeout_ms: node_timeout.as_millis() as u64,
                    heartbeat_interval_ms: (node_timeout.as_millis() as u64 / 6).clamp(100, 1_000),
                    ..CoreConfig::default()
                },
                policy,
                commit_batch,
                store,
                peers,
            };
            run_head(config).await
        }
        Command::NodeCredential { data_dir } => print_node_credential(&data_dir),
        Command::Store {
            command:
                StoreCli::Copy {
                    from,
                    to,
                    store_password_file,
                    store_ca_file,
                },
        } => copy_store(
            &from,
            &to,
            store_password_file.as_deref(),
            store_ca_file.as_deref(),
        ),
        Command::User { data_dir, command } => {
            let data_dir =
                data_dir.context("--data-dir DIR is required: the head's data directory")?;
            user_command(&data_dir, command).await
        }
    }
}

/// Starts a head and serves until SIGTERM or Ctrl-C, or until it steps down
/// (another head leads its store: an error, for its supervisor to see).
async fn run_head(config: xp_head::HeadConfig) -> anyhow::Result<()> {
    let data_dir = config.data_dir.clone();
    let head = xp_head::start(config).await.with_context(|| {
        format!(
            "cannot start the head with data directory {}",
            data_dir.display()
        )
    })?;
    print_addresses(&head, &data_dir);
    let stepped_down = tokio::select! {
        signal = wait_for_signal() => {
            signal?;
            false
        }
        stepped_down = head.stopped() => stepped_down,
    };
    tracing::info!("shutting down");
    head.shutdown().await;
    anyhow::ensure!(
        !stepped_down,
        "this head stepped down: another head leads the store now"
    );
    Ok(())
}

/// Runs a user command and prints its answer; a credential goes to stdout
/// only, once.
async fn user_command(data_dir: &std::path::Path, command: UserCli) -> anyhow::Result<()> {
    use xp_head_core::auth::users::{UserAnswer, UserCommand};
    let command = match command {
        UserCli::Add {
            name,
            team,
            role,
            replace,
        } => UserCommand::Add {
            name,
            team,
            role,
            replace,
        },
        UserCli::List => UserCommand::List,
        UserCli::Role { name, role } => UserCommand::Role { name, role },
        UserCli::Revoke { name } => UserCommand::Revoke { name },
    };
    let answer = xp_head::run_user_command(data_dir, &command)
        .await
        .with_context(|| format!("xp-head user on {}", data_dir.display()))?;
    let text = match answer {
        UserAnswer::Added { user, credential } => {
            tracing::info!(user = %user.name, team = %user.team, role = %user.role, "user added; their credential is printed once");
            format!("{}\n", credential.0)
        }
        UserAnswer::List { users } => {
            let mut text = format!("{:<24} {:<24} {:<11} {}\n", "NAME", "TEAM", "ROLE", "STATE");
            for user in users {
                text.push_str(&format!(
                    "{:<24} {:<24} {:<11} {}\n",
                    user.name,
                    user.team,
                    user.role.as_str(),
                    if user.revoked { "revoked" } else { "active" }
                ));
            }
            text
        }
        UserAnswer::Changed { user } => format!(
            "user {} (team {}): role {}, {}\n",
            user.name,
            user.team,
            user.role,
            if user.revoked { "revoked" } else { "active" }
        ),
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")
}

/// Prints the first admin's credential when this start made it (only its
/// hash is kept, so it is shown once), the node credential on the first start
/// only (later starts print `head: HOST:PORT` instead: a start's output often
/// ends up in a log, and `xp-head node-credential` shows it again), and the
/// HTTP address. A closed stdout (`xp-head start | head -1`) must not stop a
/// running head: the lines are best effort, and the node join string is also
/// in the data directory (`node.join`).
fn print_addresses(head: &xp_head::RunningHead, data_dir: &std::path::Path) {
    use std::io::Write;
    // The admin line comes first: a reader waiting for `node:` or `head:` has
    // both by then.
    let mut text = String::new();
    if let Some(admin) = &head.admin {
        text.push_str(&format!("admin: {admin}\n"));
    }
    if head.first_start {
        text.push_str(&format!("node: {}\n", head.join));
    } else {
        text.push_str(&format!(
            "head: {}:{} (the node credential was printed at the first start; `xp-head node-credential --data-dir {}` prints it again)\n",
            head.join.host,
            head.join.port,
            data_dir.display()
        ));
    }
    if let Some(http) = head.http_addr {
        text.push_str(&format!("http://{http}\n"));
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        tracing::warn!(%error, "cannot print the join string to stdout");
    }
}

/// `xp-head node-credential`: the node join string kept in the data directory.
fn print_node_credential(data_dir: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write;
    let join = xp_head::node_credential(data_dir).with_context(|| {
        format!(
            "no node credential in {}: start the head once on this data directory",
            data_dir.display()
        )
    })?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(format!("{join}\n").as_bytes())
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    tokio::select! {
        _ = terminate.recv() => {}
        result = tokio::signal::ctrl_c() => result.context("cannot listen for Ctrl-C")?,
    }
    Ok(())
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("XP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// The policy's YAML text and a name for it: a preset's canonical YAML, or a
/// file's contents (bounded, so a wrong path to a huge file fails clearly).
fn read_policy(name: &str) -> anyhow::Result<(String, String)> {
    use xp_sched::PolicyConfig;
    if let Some(preset) = PolicyConfig::preset(name) {
        // JSON is YAML, and the policy's serde form reads back as itself.
        let yaml = serde_json::to_string_pretty(&preset)
            .with_context(|| format!("cannot write preset {name} out"))?;
        return Ok((yaml, format!("preset {name}")));
    }
    let path = PathBuf::from(name);
    let metadata = std::fs::metadata(&path).with_context(|| {
        format!("--policy {name}: not a preset (fifo, priority, fair, backfill, default) nor a readable file")
    })?;
    anyhow::ensure!(
        metadata.len() <= xp_sched::config::MAX_POLICY_BYTES as u64,
        "--policy {name}: the file is larger than {} bytes",
        xp_sched::config::MAX_POLICY_BYTES
    );
    let yaml = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the policy file {}", path.display()))?;
    PolicyConfig::from_yaml(&yaml)
        .with_context(|| format!("the policy file {} is invalid", path.display()))?;
    Ok((yaml, path.display().to_string()))
}

/// A node timeout: a duration of at least a second (six heartbeats of at
/// least 100 ms each must fit in it).
/// `xp-head store copy`: copies, compares, and prints each table's rows and digest.
#[expect(clippy::print_stdout, reason = "the command's answer")]
fn copy_store(
    from: &str,
    to: &str,
    password_file: Option<&std::path::Path>,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let password = store_password(password_file)?;
    let spec =
        |text: &str| xp_head::StoreSpec::parse(text, password.as_deref())?.with_ca_file(ca_file);
    let from = spec(from).context("FROM")?;
    let to = spec(to).context("TO")?;
    let tables = xp_head::copy_store(&from, &to)?;
    let rows: u64 = tables.iter().map(|table| table.rows).sum();
    for table in &tables {
        println!(
            "{:<12} {:>10} rows  {}",
            table.table, table.rows, table.digest
        );
    }
    println!("copied {rows} rows from {from} to {to}; both read back the same");
    Ok(())
}

/// The PostgreSQL password: from `password_file` (its first line), or else
/// from `XP_STORE_PASSWORD`, or none.
fn store_password(password_file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    Ok(match password_file {
        Some(path) => {
            use std::io::Read;
            // A password is one short line: read no more than a page of it.
            let mut text = String::new();
            std::fs::File::open(path)
                .and_then(|file| file.take(4096).read_to_string(&mut text))
                .with_context(|| {
                    format!("cannot read the store password from {}", path.display())
                })?;
            Some(text.lines().next().unwrap_or_default().to_owned())
        }
        None => std::env::var("XP_STORE_PASSWORD").ok(),
    })
}

/// The PostgreSQL store at `address`, with its password from `password_file`
/// or else from `XP_STORE_PASSWORD`.
fn store_target(
    address: &str,
    password_file: Option<&std::path::Path>,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<xp_head::PostgresTarget> {
    let password = store_password(password_file)?;
    let target = xp_head::PostgresTarget::parse(address, password.as_deref())
        .with_context(|| format!("--store {address}"))?;
    match ca_file {
        Some(ca_file) => target
            .with_ca_file(ca_file)
            .with_context(|| format!("--store-ca-file {}", ca_file.display())),
        None => Ok(target),
    }
}

/// `HOST:PORT` of another head.
fn parse_peer(text: &str) -> Result<(String, u16), String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not HOST:PORT"))?;
    let port = port
        .parse()
        .map_err(|_| format!("{text:?} has no port number"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{text:?} has no host"));
    }
    Ok((host.to_owned(), port))
}

fn parse_node_timeout(text: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(text).map_err(|error| error.to_string())?;
    if timeout < Duration::from_secs(1) {
        return Err(format!("{text} is too short: at least 1s"));
    }
    Ok(timeout)
}
