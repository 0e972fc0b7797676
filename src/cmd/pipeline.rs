//! `xp pipeline`: submit a pipeline of dependent stages, show its status (each
//! stage's state, experiment, inputs, outputs, where it was reused from and why
//! it waits; the critical path and the estimated finish), cancel it, retry its
//! failed part, and list pipelines.

use std::path::{Path, PathBuf};

use anyhow::Context;
use xp::Client;
use xp_runtime::protocol::{PipelineStatus, StageState};
use xp_runtime::spec::PipelineSpec;

use super::{ClusterArg, connect};

/// Pipelines of dependent stages.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum PipelineCommand {
    /// Submit a pipeline file; with --wait, follow it to its end (exit status 1
    /// unless every stage succeeded or was reused).
    Submit {
        /// The pipeline YAML.
        file: PathBuf,
        /// Wait until no stage runs or waits.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// One pipeline's stages: state, experiment, inputs, outputs, reuse, why
    /// each waits, the critical path and the estimated finish.
    Status {
        /// The pipeline's id (`7` or `p7`).
        id: String,
        /// The status as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Cancel a pipeline's running and waiting stages.
    Cancel {
        /// The pipeline's id.
        id: String,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Rerun a pipeline's failed and cancelled stages, those whose outputs
    /// no live node holds, and what depends on them, reusing the rest.
    Retry {
        /// The pipeline's id.
        id: String,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Every pipeline you may see, newest first.
    List {
        /// The list as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArg,
    },
}

fn parse_id(text: &str) -> anyhow::Result<u64> {
    text.strip_prefix('p')
        .unwrap_or(text)
        .parse()
        .with_context(|| format!("{text:?} is not a pipeline id (such as 7 or p7)"))
}

pub(crate) async fn run(command: PipelineCommand) -> anyhow::Result<()> {
    match command {
        PipelineCommand::Submit {
            file,
            wait,
            cluster,
        } => submit(&file, wait, &cluster).await,
        PipelineCommand::Status { id, json, cluster } => status(&id, json, &cluster).await,
        PipelineCommand::Cancel { id, cluster } => cancel(&id, &cluster).await,
        PipelineCommand::Retry { id, cluster } => retry(&id, &cluster).await,
        PipelineCommand::List { json, cluster } => list(json, &cluster).await,
    }
}

/// `xp pipeline submit`: submits the file's pipeline, its relative paths
/// resolved from the file's directory, and with `--wait` follows it.
async fn submit(file: &Path, wait: bool, cluster: &ClusterArg) -> anyhow::Result<()> {
    let spec = read_pipeline(file)?;
    let client = connect(cluster).await?;
    let base = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let submitted = client
        .submit_pipeline(&spec, &base)
        .await
        .context("submission refused")?;
    outln!(
        "pipeline {} submitted: {} stage(s), {} reused",
        submitted.pipeline,
        submitted.stages,
        submitted.reused
    );
    let result = if wait {
        follow(&client, submitted.pipeline).await
    } else {
        Ok(())
    };
    client.close().await;
    result
}

/// `xp pipeline status`: one pipeline and its stages.
async fn status(id: &str, json: bool, cluster: &ClusterArg) -> anyhow::Result<()> {
    let id = parse_id(id)?;
    let client = connect(cluster).await?;
    let status = client.pipeline_status(id).await;
    client.close().await;
    let status = status?;
    if json {
        super::write_output(format_args!(
            "{}\n",
            serde_json::to_string_pretty(&status.to_json())?
        ));
    } else {
        print_status(&status, now_ms());
    }
    Ok(())
}

/// `xp pipeline cancel`.
async fn cancel(id: &str, cluster: &ClusterArg) -> anyhow::Result<()> {
    let id = parse_id(id)?;
    let client = connect(cluster).await?;
    let stages = client.cancel_pipeline(id).await;
    client.close().await;
    outln!("cancelled {} stage(s) of pipeline {id}", stages?);
    Ok(())
}

/// `xp pipeline retry`.
async fn retry(id: &str, cluster: &ClusterArg) -> anyhow::Result<()> {
    let id = parse_id(id)?;
    let client = connect(cluster).await?;
    let stages = client.retry_pipeline(id).await;
    client.close().await;
    outln!("retrying {} stage(s) of pipeline {id}", stages?);
    Ok(())
}

/// `xp pipeline list`: every pipeline the user may see, one line each.
async fn list(json: bool, cluster: &ClusterArg) -> anyhow::Result<()> {
    let client = connect(cluster).await?;
    let list = client.pipelines().await;
    client.close().await;
    let list = list?;
    if json {
        let list: Vec<serde_json::Value> = list.iter().map(PipelineStatus::to_json).collect();
        super::write_output(format_args!("{}\n", serde_json::to_string_pretty(&list)?));
        return Ok(());
    }
    outln!(
        "{:<6} {:<28} {:<12} {:<10} STAGES",
        "ID",
        "NAME",
        "TEAM",
        "STATE"
    );
    for pipeline in &list {
        let done = pipeline
            .stages
            .iter()
            .filter(|stage| stage.state.has_result())
            .count();
        outln!(
            "{:<6} {:<28} {:<12} {:<10} {done}/{} done",
            pipeline.id,
            pipeline.name,
            pipeline.team,
            pipeline.state,
            pipeline.stages.len()
        );
    }
    Ok(())
}

/// Reads and checks the pipeline file `file`.
fn read_pipeline(file: &Path) -> anyhow::Result<PipelineSpec> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    PipelineSpec::from_yaml(&text)
        .with_context(|| format!("{} is not a valid pipeline", file.display()))
}

/// Prints each stage's changes until the pipeline ends; fails unless every
/// stage has a result.
async fn follow(client: &Client, id: u64) -> anyhow::Result<()> {
    let mut seen: Vec<(String, StageState)> = Vec::new();
    let status = client
        .wait_pipeline(id, |status| {
            for stage in &status.stages {
                let now = (stage.name.clone(), stage.state);
                if !seen.contains(&now) {
                    seen.retain(|(name, _)| *name != stage.name);
                    outln!(
                        "{:<16} {:<10} {}",
                        stage.name,
                        stage.state.as_str(),
                        stage.reason
                    );
                    seen.push(now);
                }
            }
        })
        .await?;
    outln!("pipeline {id}: {}", status.state);
    if status.state != "succeeded" {
        anyhow::bail!("pipeline {id} {}", status.state);
    }
    Ok(())
}

#[expect(
    clippy::disallowed_methods,
    reason = "the CLI shows the estimated finish relative to the wall clock"
)]
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

fn print_status(status: &PipelineStatus, now: u64) {
    outln!(
        "pipeline {} {} (team {}): {}",
        status.id,
        status.name,
        status.team,
        status.state
    );
    if !status.critical_path.is_empty() {
        let finish = match (status.remaining_s, status.estimated_finish) {
            (Some(remaining), Some(at)) => format!(
                "; estimated finish in {} (in {} from now)",
                humantime::format_duration(
                    std::time::Duration::from_secs(remaining.round() as u64)
                ),
                humantime::format_duration(std::time::Duration::from_secs(
                    at.saturating_sub(now) / 1000
                ))
            ),
            _ => "; estimated finish unknown (no history or estimate for some stage)".to_owned(),
        };
        outln!(
            "critical path: {}{finish}",
            status.critical_path.join(" → ")
        );
    }
    outln!(
        "{:<16} {:<10} {:<20} {:<9} DETAIL",
        "STAGE",
        "STATE",
        "EXPERIMENT",
        "ESTIMATE"
    );
    for stage in &status.stages {
        let experiment = stage
            .experiment
            .map_or_else(|| "-".to_owned(), |id| id.to_string());
        let estimate = stage.estimate_s.map_or_else(
            || "-".to_owned(),
            |seconds| {
                humantime::format_duration(std::time::Duration::from_secs(seconds.round() as u64))
                    .to_string()
            },
        );
        let mark = if stage.critical { "*" } else { " " };
        outln!(
            "{:<16} {:<10} {:<20} {:<9} {mark}{}",
            stage.name,
            stage.state.as_str(),
            experiment,
            estimate,
            stage.reason
        );
        if let Some(from) = &stage.reused_from {
            outln!(
                "    reused from: pipeline {} stage {}",
                from.pipeline,
                from.stage
            );
        }
        for input in &stage.inputs {
            outln!("    input {{{}}} = {}", input.reference, input.value);
        }
        if let Some(params) = &stage.best_params_json {
            outln!("    best params: {params}");
        }
        for file in &stage.outputs {
            outln!(
                "    output {} (object {}, {} bytes)",
                file.name,
                file.object,
                file.size
            );
        }
    }
}
