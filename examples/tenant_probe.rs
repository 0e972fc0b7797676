//! A hostile tenant's trial, for the end-to-end tests of the node's tenant
//! boundary (`tests/tenant_files.rs`): a command trial that tries, through the
//! documented channel (the SDK's `put_file` and `get`), to make its node hand
//! back what is not its own, and the ports and rendezvous of data-parallel
//! command trials.
//!
//! `tenant_probe files` runs the file probes and reports one metric each: 1 when
//! the node refused naming a rule (`the rule "..."`), 2 when it refused
//! otherwise, 0 when bytes that are not the worker's own came back; the refusals
//! are printed to stderr (the trial's log). `EXCHANGE` names a directory the
//! test prepared: `open/foreign` (another user's 0600 file in a directory
//! anyone may write), `shared` (another user's 0666 file) and `other` (the path
//! of another trial's file).
//!
//! `tenant_probe squat FIRST LAST` binds every port of FIRST-LAST it can (on
//! every address), reports how many as `squatted`, says so in
//! `$EXCHANGE/squatting` and holds them until `$EXCHANGE/done` appears.
//!
//! `tenant_probe allocate MIB` reports its memory limit (`limit_mib`) and
//! allocates MIB MiB, reporting as it goes (`allocated_mib`).
//!
//! `tenant_probe rendezvous` meets like PyTorch's `env://`: rank 0 listens on
//! `MASTER_PORT` (on every address), the others connect to
//! `MASTER_ADDR:MASTER_PORT` and trade a greeting; each reports `rendezvous` 1.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a probe's findings are for its log"
)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use xp::TrialContext;

/// How one probe ended.
enum Outcome {
    /// Bytes that are not the worker's came back.
    Leaked(usize),
    /// The node refused.
    Refused(String),
}

impl Outcome {
    fn metric(&self) -> f64 {
        match self {
            Self::Leaked(_) => 0.0,
            Self::Refused(message) if message.contains("the rule \"") => 1.0,
            Self::Refused(_) => 2.0,
        }
    }
}

/// Puts `path` and, when the node stores it, gets it back: a leak unless the
/// node refused.
fn put_and_get(ctx: &TrialContext, path: &Path) -> Outcome {
    match ctx.put_file(path).and_then(|id| ctx.get(id)) {
        Ok(bytes) => Outcome::Leaked(bytes.len()),
        Err(error) => Outcome::Refused(error.to_string()),
    }
}

/// Replaces the checkpoint directory with a link to `/` for `probe`, and
/// puts it back after.
fn with_checkpoint_linked_to_root<T>(
    ctx: &TrialContext,
    probe: impl FnOnce() -> T,
) -> anyhow::Result<T> {
    let aside = ctx.work_dir.join("checkpoint.aside");
    std::fs::rename(&ctx.checkpoint_dir, &aside).context("move the checkpoint aside")?;
    std::os::unix::fs::symlink("/", &ctx.checkpoint_dir).context("link it to /")?;
    let result = probe();
    std::fs::remove_file(&ctx.checkpoint_dir).context("remove the link")?;
    std::fs::rename(&aside, &ctx.checkpoint_dir).context("move it back")?;
    Ok(result)
}

/// The file probes, each with its name.
fn file_probes(
    ctx: &TrialContext,
    exchange: &Path,
) -> anyhow::Result<Vec<(&'static str, Outcome)>> {
    let node_pid = nix::unistd::getppid();
    let work = &ctx.work_dir;
    let other = PathBuf::from(
        std::fs::read_to_string(exchange.join("other"))
            .context("the other trial's path")?
            .trim(),
    );
    let mut outcomes = Vec::new();
    let through_root = |inside: &str| ctx.checkpoint_dir.join(inside.trim_start_matches('/'));
    outcomes.extend(with_checkpoint_linked_to_root(ctx, || {
        [
            (
                "checkpoint_link_shadow",
                put_and_get(ctx, &through_root("etc/shadow")),
            ),
            (
                "checkpoint_link_environ",
                put_and_get(ctx, &through_root("proc/self/environ")),
            ),
            (
                "checkpoint_link_other_trial",
                put_and_get(ctx, &through_root(&other.display().to_string())),
            ),
        ]
    })?);
    std::os::unix::fs::symlink("/etc", work.join("etc")).context("link")?;
    outcomes.push(("work_link", put_and_get(ctx, &work.join("etc/shadow"))));
    let environ = work.join("environ");
    std::os::unix::fs::symlink(format!("/proc/{node_pid}/environ"), &environ).context("link")?;
    outcomes.push(("node_environ_link", put_and_get(ctx, &environ)));
    let hard = work.join("hard");
    std::fs::hard_link(exchange.join("shared"), &hard).context("hard link")?;
    outcomes.push(("hard_link", put_and_get(ctx, &hard)));
    let fifo = work.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
        .context("mkfifo")?;
    outcomes.push(("fifo", put_and_get(ctx, &fifo)));
    let moved = work.join("moved-in");
    std::fs::rename(exchange.join("open/foreign"), &moved).context("move the foreign file in")?;
    outcomes.push(("foreign_moved_in", put_and_get(ctx, &moved)));
    outcomes.push(("other_trial_path", put_and_get(ctx, &other)));
    outcomes.push((
        "dot_dot",
        put_and_get(ctx, &work.join("../../../../../etc/shadow")),
    ));
    // Its own file still goes both ways.
    let own = work.join("own");
    std::fs::write(&own, ctx.trial_id.as_bytes())?;
    let own_back = ctx.put_file(&own).and_then(|id| ctx.get(id));
    println!(
        "XP_METRIC {{\"step\": 0, \"own_roundtrip\": {}}}",
        u8::from(own_back.is_ok_and(|bytes| bytes == ctx.trial_id.as_bytes()))
    );
    Ok(outcomes)
}

fn files() -> anyhow::Result<()> {
    let ctx = TrialContext::from_env()?;
    let exchange = PathBuf::from(std::env::var("EXCHANGE").context("EXCHANGE")?);
    wait_for(&exchange.join("other"));
    let outcomes = file_probes(&ctx, &exchange)?;
    let mut fields = vec!["\"step\": 1".to_owned()];
    for (name, outcome) in &outcomes {
        match outcome {
            Outcome::Leaked(len) => eprintln!("probe {name}: LEAKED {len} bytes"),
            Outcome::Refused(message) => eprintln!("probe {name}: refused: {message}"),
        }
        fields.push(format!("\"{name}\": {}", outcome.metric()));
    }
    println!("XP_METRIC {{{}}}", fields.join(", "));
    Ok(())
}

/// Waits (up to ten minutes) until `path` exists.
fn wait_for(path: &Path) {
    for _ in 0..6000 {
        if path.exists() {
            return;
        }
        #[expect(clippy::disallowed_methods, reason = "a probe polls a file")]
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn squat(first: u16, last: u16) -> anyhow::Result<()> {
    let exchange = PathBuf::from(std::env::var("EXCHANGE").context("EXCHANGE")?);
    let mut held = Vec::new();
    for port in first..=last {
        let bound = ["[::]", "0.0.0.0", "127.0.0.1"]
            .iter()
            .find_map(|host| std::net::TcpListener::bind(format!("{host}:{port}")).ok());
        if let Some(listener) = bound {
            held.push(listener);
        }
    }
    eprintln!("squatting {} of the ports {first}-{last}", held.len());
    println!("XP_METRIC {{\"step\": 1, \"squatted\": {}}}", held.len());
    std::io::stdout().flush()?;
    std::fs::write(exchange.join("squatting.tmp"), held.len().to_string())?;
    std::fs::rename(exchange.join("squatting.tmp"), exchange.join("squatting"))?;
    wait_for(&exchange.join("done"));
    Ok(())
}

fn rendezvous() -> anyhow::Result<()> {
    let rank: u32 = std::env::var("RANK")?.parse()?;
    let world: u32 = std::env::var("WORLD_SIZE")?.parse()?;
    let host = std::env::var("MASTER_ADDR")?;
    let port: u16 = std::env::var("MASTER_PORT")?.parse()?;
    if rank == 0 {
        let listener = std::net::TcpListener::bind(format!("[::]:{port}"))
            .or_else(|_| std::net::TcpListener::bind(format!("0.0.0.0:{port}")))
            .with_context(|| format!("rank 0 cannot listen on MASTER_PORT {port}"))?;
        for _ in 1..world {
            let (mut stream, _) = listener.accept()?;
            let mut greeting = [0u8; 5];
            stream.read_exact(&mut greeting)?;
            stream.write_all(b"hello")?;
        }
    } else {
        let mut tries = 0;
        let mut stream = loop {
            match std::net::TcpStream::connect((host.as_str(), port)) {
                Ok(stream) => break stream,
                Err(error) if tries < 600 => {
                    tries += 1;
                    let _ = error;
                    #[expect(clippy::disallowed_methods, reason = "rank 0 may start later")]
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(error) => return Err(error).context("rank 0 never listened"),
            }
        };
        stream.write_all(b"hello")?;
        let mut answer = [0u8; 5];
        stream.read_exact(&mut answer)?;
        anyhow::ensure!(&answer == b"hello", "a stranger answered on MASTER_PORT");
    }
    println!("XP_METRIC {{\"step\": 1, \"rendezvous\": 1, \"port\": {port}}}");
    Ok(())
}

/// Allocates `mib` MiB and touches every page, reporting its memory cgroup's
/// limit first (`limit_mib`, 0 when there is none) and then how much it holds.
fn allocate(mib: usize) -> anyhow::Result<()> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")?;
    let limit = cgroup
        .lines()
        .find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let file = match controllers {
                "" => format!("/sys/fs/cgroup{path}/memory.max"),
                list if list.split(',').any(|name| name == "memory") => {
                    format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
                }
                _ => return None,
            };
            std::fs::read_to_string(file).ok()
        })
        .and_then(|text| text.trim().parse::<u64>().ok())
        .filter(|bytes| *bytes < 1 << 60)
        .unwrap_or(0);
    println!("XP_METRIC {{\"step\": 0, \"limit_mib\": {}}}", limit >> 20);
    std::io::stdout().flush()?;
    let mut held: Vec<Vec<u8>> = Vec::new();
    for step in 1..=mib {
        held.push(vec![1u8; 1 << 20]);
        if step % 64 == 0 {
            println!("XP_METRIC {{\"step\": {step}, \"allocated_mib\": {step}}}");
        }
    }
    println!(
        "XP_METRIC {{\"step\": {mib}, \"allocated_mib\": {}}}",
        held.len()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["files"] => files(),
        ["squat", first, last] => squat(first.parse()?, last.parse()?),
        ["rendezvous"] => rendezvous(),
        ["allocate", mib] => allocate(mib.parse()?),
        _ => anyhow::bail!(
            "usage: tenant_probe files | squat FIRST LAST | rendezvous | allocate MIB"
        ),
    }
}
