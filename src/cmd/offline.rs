//! Reading what `xp run` kept in its data directory, with no cluster running:
//! `xp status`, `xp compare` and `xp logs` with `--data-dir DIR`.
//!
//! The head's records come from its database opened read-only
//! (`xp_head::OfflineHead`); a worker's log from the node's log files
//! (`xp_node::read_log`). The layout is `xp run`'s: `DIR/head` and
//! `DIR/node`. Nothing here writes to the directory.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{ExperimentStatus, LogRequest};

use super::{ClusterArg, exit_on_output_error};

/// The head's data under an `xp run` data directory.
pub(crate) fn head_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("head")
}

/// The node's data under an `xp run` data directory.
pub(crate) fn node_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("node")
}

/// Where a reading command gets its answers: a running cluster, or the data
/// directory a local run left.
#[derive(clap::Args, Debug)]
pub(crate) struct SourceArg {
    /// Your credential (from `xp-head user add`). Prefer XP_CLUSTER or
    /// --cluster-file: an argument is visible to every local user in `ps`.
    #[arg(long, env = "XP_CLUSTER", hide_env_values = true)]
    cluster: Option<String>,
    /// A file holding your credential; only its owner may read it (`chmod 600`).
    #[arg(long, value_name = "FILE", conflicts_with = "data_dir")]
    cluster_file: Option<PathBuf>,
    /// Read the data directory `xp run` kept (`.xp` by default there) instead of
    /// asking a cluster; no cluster needs to run.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

/// A reading command's source, once chosen.
pub(crate) enum Source {
    Cluster(ClusterArg),
    DataDir(PathBuf),
}

impl SourceArg {
    /// `--data-dir` when given, else the cluster.
    pub(crate) fn source(self) -> anyhow::Result<Source> {
        match (self.data_dir, self.cluster, self.cluster_file) {
            (Some(data_dir), _, _) => Ok(Source::DataDir(data_dir)),
            (None, None, None) => anyhow::bail!(
                "no cluster named: set XP_CLUSTER or pass --cluster-file FILE, or read a local run's data with --data-dir DIR"
            ),
            (None, cluster, cluster_file) => Ok(Source::Cluster(ClusterArg {
                cluster,
                cluster_file,
            })),
        }
    }
}

fn open_head(data_dir: &Path) -> anyhow::Result<xp_head::OfflineHead> {
    xp_head::OfflineHead::open(&head_dir(data_dir)).with_context(|| {
        format!(
            "cannot read the records in {} (if a cluster still runs on it, ask it with --cluster)",
            data_dir.display()
        )
    })
}

/// The experiments matching `filter` recorded in `data_dir`.
pub(crate) fn status(
    data_dir: &Path,
    filter: Option<&str>,
) -> anyhow::Result<Vec<ExperimentStatus>> {
    Ok(open_head(data_dir)?.status(filter)?)
}

/// Writes a worker's whole kept log from `data_dir` to stdout.
pub(crate) fn print_log(
    data_dir: &Path,
    trial: TrialId,
    rank: u32,
    attempt: Option<u32>,
) -> anyhow::Result<()> {
    let (_node, key) = open_head(data_dir)?.locate_worker(&LogRequest {
        trial,
        rank,
        attempt,
        offset: 0,
        max_bytes: 0,
    })?;
    let path = xp_node::log_path(&node_dir(data_dir), key);
    let mut offset = 0;
    loop {
        let read = xp_node::read_log(&path, offset, 1 << 20)
            .with_context(|| format!("cannot read the log of {trial} rank {rank}"))?;
        if read.data.is_empty() {
            return Ok(());
        }
        offset = read.next_offset;
        let mut stdout = std::io::stdout().lock();
        if let Err(error) = stdout.write_all(&read.data).and_then(|()| stdout.flush()) {
            exit_on_output_error(&error);
        }
    }
}
