//! A driver binary with small Rust trainables, used by the end-to-end tests and as
//! a template for your own drivers.
//!
//! `trainables submit --trials N [--step-ms MS] [--steps S]` submits a
//! random search of the `quadratic` trainable and prints the experiment id;
//! `trainables submit --entry allreduce_check --workers W [--crash-rank R]`
//! submits one data-parallel trial that checks a ring all-reduce;
//! `trainables submit --spec FILE` submits any spec whose trials are
//! entries of this binary (`counter` is the checkpointing one, `elastic_sgd`
//! the data-parallel one that keeps its global batch across resizes, `objects_check`
//! moves an object between nodes, `lane_check` tries to leave its lane on the
//! node's object channel). Nodes re-execute
//! this binary with `XP_ENTRY=quadratic` to run a trial. The cluster's join string
//! comes from `XP_CLUSTER` (`--cluster JOIN` also works, but shows the cluster
//! secret to every local user in `ps`).
#![allow(
    clippy::print_stdout,
    reason = "an example's output is for the person running it"
)]

use std::time::Duration;

use anyhow::Context;
use xp::{BoxError, Client, ExperimentSpec, SubmitOptions, Trainables, TrialContext};

/// Descends `(x - 3)^2` from the trial's `x` in `steps` steps, reporting the loss.
fn quadratic(ctx: &TrialContext) -> Result<(), BoxError> {
    let mut x = ctx.param_f64("x")?;
    let steps = ctx.param_i64("steps")?;
    let step_ms = u64::try_from(ctx.param_i64("step_ms")?)?;
    for step in 1..=steps {
        x -= 0.2 * 2.0 * (x - 3.0);
        ctx.report(
            step as u64,
            &[("loss", (x - 3.0).powi(2)), ("rank", f64::from(ctx.rank))],
        );
        #[expect(
            clippy::disallowed_methods,
            reason = "a synchronous trainable paces its steps"
        )]
        std::thread::sleep(Duration::from_millis(step_ms));
    }
    Ok(())
}

/// Checks a ring all-reduce end to end: rank r contributes r + 1 everywhere, and
/// every rank must see W(W+1)/2; it reports the sum, its rank, how many of its
/// links use shared memory (`shm_links`) and its user id (`uid`). With
/// `crash_rank` at or above 0, that rank exits with status 3 in the first attempt
/// right after joining, to drill failure handling.
fn allreduce_check(ctx: &TrialContext) -> Result<(), BoxError> {
    let mut communicator = ctx.collective()?;
    if ctx.attempt == 1 && ctx.param_i64("crash_rank")? == i64::from(ctx.rank) {
        std::process::exit(3);
    }
    let mut values = vec![ctx.rank as f32 + 1.0; 100_000];
    communicator.all_reduce(&mut values, xp::ReduceOp::Sum)?;
    let world = ctx.world_size as f32;
    let expected = world * (world + 1.0) / 2.0;
    if values.iter().any(|value| *value != expected) {
        return Err(format!("rank {} saw a wrong sum", ctx.rank).into());
    }
    // How many of this rank's two ring links run over shared memory (ranks on
    // one node), and the user id the rank runs as, for the tests to check.
    let shm_links = communicator
        .communicator()
        .link_transports()
        .iter()
        .filter(|transport| **transport == "shm")
        .count();
    ctx.report(
        1,
        &[
            ("sum", f64::from(values[0])),
            ("rank", f64::from(ctx.rank)),
            ("shm_links", shm_links as f64),
            ("uid", f64::from(nix::unistd::getuid().as_raw())),
        ],
    );
    Ok(())
}

/// One step of `counter`'s recurrence: deterministic, and sensitive to every
/// earlier step, so a resumed run matches an uninterrupted one only if it resumed
/// from exactly the state it saved.
pub fn counter_step(step: u64, value: f64) -> f64 {
    value * 0.999 + (step as f64).sin()
}

/// Runs `counter_step` for `steps` steps from `start`, saving a checkpoint every
/// `every` steps and when asked to stop, and resuming from the latest one. Reports `value` and `attempt`
/// each step and `final` at the end. With `fail_flag` set, the first attempt fails
/// at the next step after that file appears.
fn counter(ctx: &TrialContext) -> Result<(), BoxError> {
    let steps = u64::try_from(ctx.param_i64("steps")?)?;
    let every = u64::try_from(ctx.param_i64("every")?)?.max(1);
    let step_ms = u64::try_from(ctx.param_i64("step_ms")?)?;
    let fail_flag = ctx
        .param_str("fail_flag")
        .ok()
        .filter(|flag| !flag.is_empty());
    let (mut step, mut value) = match ctx.restore()? {
        Some((step, state)) => {
            let bytes: [u8; 8] = state
                .as_slice()
                .try_into()
                .map_err(|_| format!("a checkpoint of {} bytes, not 8", state.len()))?;
            println!("resumed from step {step}");
            (step, f64::from_le_bytes(bytes))
        }
        None => (0, ctx.param_f64("start")?),
    };
    while step < steps {
        if ctx.stop_requested() {
            // Preempted (or the node is going away): save where we are and go.
            ctx.checkpoint(step, &value.to_le_bytes())?;
            return Ok(());
        }
        if ctx.attempt == 1 && fail_flag.is_some_and(|flag| std::path::Path::new(flag).exists()) {
            return Err(format!("asked to fail at step {step}").into());
        }
        step += 1;
        value = counter_step(step, value);
        ctx.report(
            step,
            &[("value", value), ("attempt", f64::from(ctx.attempt))],
        );
        if step % every == 0 {
            ctx.checkpoint(step, &value.to_le_bytes())?;
        }
        #[expect(
            clippy::disallowed_methods,
            reason = "a synchronous trainable paces its steps"
        )]
        std::thread::sleep(Duration::from_millis(step_ms));
    }
    ctx.report(steps, &[("final", value)]);
    Ok(())
}

/// Features of the linear model `elastic_sgd` fits.
const SGD_FEATURES: usize = 4;
/// Samples in its data set.
const SGD_SAMPLES: u64 = 256;
/// Its learning rate: a power of two, so that the update is exact.
const SGD_LEARNING_RATE: f64 = 0.125;

/// Sample `index` of `elastic_sgd`'s data set for `seed`: features and target,
/// all multiples of 1/256, so sums of gradients stay exact.
pub fn sgd_sample(seed: u64, index: u64) -> ([f64; SGD_FEATURES], f64) {
    let mix = |salt: u64| {
        let mut z = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(index.wrapping_mul(0xBF58_476D_1CE4_E5B9))
            .wrapping_add(salt.wrapping_mul(0x94D0_49BB_1331_11EB));
        z ^= z >> 31;
        z = z.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        z ^ (z >> 29)
    };
    let truth = [0.5, -0.25, 0.75, 1.0];
    let mut features = [0.0; SGD_FEATURES];
    let mut target = 0.125 + ((mix(99) % 16) as f64 - 8.0) / 256.0;
    for (feature, (value, weight)) in features.iter_mut().zip(truth).enumerate() {
        *value = (mix(feature as u64) % 64) as f64 / 64.0 - 0.5;
        target += weight * *value;
    }
    (features, target)
}

/// One sample's gradient of the squared error (weights, then bias), each part
/// rounded to a multiple of 2^-24: a sum of such numbers is exact in any
/// order, so every way of splitting the batch adds up to the same bits.
pub fn sgd_gradient(
    params: &[f64; SGD_FEATURES + 1],
    seed: u64,
    index: u64,
) -> [f64; SGD_FEATURES + 1] {
    let (features, target) = sgd_sample(seed, index % SGD_SAMPLES);
    let prediction =
        params[SGD_FEATURES] + features.iter().zip(params).map(|(x, w)| x * w).sum::<f64>();
    let error = prediction - target;
    let quantum = f64::from(1u32 << 24);
    let round = |value: f64| (value * quantum).round() / quantum;
    let mut gradient = [0.0; SGD_FEATURES + 1];
    for (part, x) in gradient.iter_mut().zip(features) {
        *part = round(error * x);
    }
    gradient[SGD_FEATURES] = round(error);
    gradient
}

/// Applies one step's summed gradient of a global batch of `batch` samples.
pub fn sgd_update(params: &mut [f64; SGD_FEATURES + 1], sum: &[f64], batch: u64) {
    for (param, part) in params.iter_mut().zip(sum) {
        *param -= SGD_LEARNING_RATE * (part / batch as f64);
    }
}

/// Data-parallel SGD of a linear model that keeps its global batch whatever
/// the gang's size: step `s` uses samples `s·batch .. (s+1)·batch` (mod the data
/// set), rank `r` of `w` takes those at positions `r, r + w, ...`, and the
/// ranks all-reduce the summed gradient; the parameters are the same on every
/// rank, and rank 0 checkpoints them (every `every` steps and when asked to
/// stop). A resize restarts the gang with a new `XP_WORLD_SIZE` and rank, and
/// it resumes from the checkpoint with the same batch, so its final parameters
/// equal those of a run that never resized. A stop travels with the gradients
/// (one more element of the all-reduce), so every rank stops after the same
/// step. Reports `mean_error` and `world` each step from rank 0, and the
/// final `w0`..`w3`, `b`.
fn elastic_sgd(ctx: &TrialContext) -> Result<(), BoxError> {
    let steps = u64::try_from(ctx.param_i64("steps")?)?;
    let every = u64::try_from(ctx.param_i64("every")?)?.max(1);
    let batch = u64::try_from(ctx.param_i64("batch")?)?.max(1);
    let step_ms = u64::try_from(ctx.param_i64("step_ms")?)?;
    let seed = u64::try_from(ctx.param_i64("data_seed")?)?;
    // Watch for SIGTERM from the start.
    let _ = ctx.stop_requested();
    let mut communicator = ctx.collective()?;
    let encode = |params: &[f64; SGD_FEATURES + 1]| -> Vec<u8> {
        params
            .iter()
            .flat_map(|value| value.to_le_bytes())
            .collect()
    };
    let (mut step, mut params) = match ctx.restore()? {
        Some((step, state)) => {
            let mut params = [0.0; SGD_FEATURES + 1];
            if state.len() != params.len() * 8 {
                return Err(format!("a checkpoint of {} bytes", state.len()).into());
            }
            for (param, bytes) in params.iter_mut().zip(state.chunks_exact(8)) {
                *param = f64::from_le_bytes(bytes.try_into()?);
            }
            (step, params)
        }
        None => (0, [0.0; SGD_FEATURES + 1]),
    };
    let world = u64::from(ctx.world_size);
    let rank = u64::from(ctx.rank);
    while step < steps {
        let mut sum = vec![0.0f64; SGD_FEATURES + 2];
        let mut position = rank;
        while position < batch {
            let gradient = sgd_gradient(&params, seed, step * batch + position);
            for (total, part) in sum.iter_mut().zip(gradient) {
                *total += part;
            }
            position += world;
        }
        sum[SGD_FEATURES + 1] = if ctx.stop_requested() { 1.0 } else { 0.0 };
        communicator.all_reduce(&mut sum, xp::ReduceOp::Sum)?;
        if sum[SGD_FEATURES + 1] > 0.0 {
            // Some rank was asked to stop: all save this step and leave.
            ctx.checkpoint(step, &encode(&params))?;
            // Leave once this rank's own SIGTERM is here too (the head sends it to
            // every rank), so it exits as stopped, never as finished.
            for _ in 0..1000 {
                if ctx.stop_requested() {
                    return Ok(());
                }
                #[expect(
                    clippy::disallowed_methods,
                    reason = "a synchronous trainable waits for its own stop signal"
                )]
                std::thread::sleep(Duration::from_millis(10));
            }
            return Err("the gang stopped but this rank was never asked to".into());
        }
        let loss = sum[SGD_FEATURES].abs() / batch as f64;
        sgd_update(&mut params, &sum[..=SGD_FEATURES], batch);
        step += 1;
        if ctx.rank == 0 {
            ctx.report(step, &[("mean_error", loss), ("world", world as f64)]);
        }
        if step % every == 0 {
            ctx.checkpoint(step, &encode(&params))?;
        }
        #[expect(
            clippy::disallowed_methods,
            reason = "a synchronous trainable paces its steps"
        )]
        std::thread::sleep(Duration::from_millis(step_ms));
    }
    let names = ["w0", "w1", "w2", "w3", "b"];
    let finals: Vec<(&str, f64)> = names.iter().copied().zip(params).collect();
    ctx.report(steps, &finals);
    Ok(())
}

/// Moves an object between the ranks of a gang through the object store: rank 0
/// puts `size` bytes and leaves their id in the file `exchange`; every other rank
/// reads the id there, gets the object (from rank 0's node if its own lacks it),
/// and checks every byte. Reports `checked_bytes`.
fn objects_check(ctx: &TrialContext) -> Result<(), BoxError> {
    let size = usize::try_from(ctx.param_i64("size")?)?;
    let exchange = std::path::PathBuf::from(ctx.param_str("exchange")?);
    let expected: Vec<u8> = (0..size).map(|index| (index % 251) as u8).collect();
    let id = if ctx.rank == 0 {
        let id = ctx.put(&expected)?;
        let temporary = exchange.with_extension("tmp");
        std::fs::write(&temporary, id.to_string())?;
        std::fs::rename(&temporary, &exchange)?;
        id
    } else {
        let mut waited = 0;
        loop {
            if let Ok(text) = std::fs::read_to_string(&exchange) {
                break text.trim().parse()?;
            }
            waited += 1;
            if waited > 600 {
                return Err("rank 0 never published the object id".into());
            }
            #[expect(
                clippy::disallowed_methods,
                reason = "a synchronous trainable polls a file"
            )]
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let got = ctx.get(id)?;
    if got != expected {
        return Err(format!(
            "rank {} got {} bytes that differ from what was put",
            ctx.rank,
            got.len()
        )
        .into());
    }
    ctx.report(
        1,
        &[
            ("checked_bytes", got.len() as f64),
            ("rank", f64::from(ctx.rank)),
        ],
    );
    Ok(())
}

/// Tries to leave its lane on the node's object channel and reports, as metrics,
/// what the node did (1 when it behaved as it must, 0 otherwise):
/// `passwd_refused` (a put of `/etc/passwd`), `symlink_refused` (a put through a
/// symlink in the work directory that points outside it), `own_roundtrip` (a put
/// of its own bytes and a get of them back), and, for each of the config's object
/// ids that is not empty, `victim_refused` (a get of another trial's object),
/// `shared_read` (a get of an object its experiment's driver stored) and
/// `unshared_refused` (a get of an object another driver stored).
fn lane_check(ctx: &TrialContext) -> Result<(), BoxError> {
    let refused = |result: Result<xp::ObjectId, xp::WorkerError>, rule: &str| match result {
        Err(error) => f64::from(u8::from(error.to_string().contains(rule))),
        Ok(_) => 0.0,
    };
    let mut metrics = vec![(
        "passwd_refused",
        refused(
            ctx.put_file(std::path::Path::new("/etc/passwd")),
            "put refused: the rule \"only the worker's own directory\" refuses /etc/passwd",
        ),
    )];
    let link = ctx.work_dir.join("lane-link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/etc/passwd", &link)?;
    metrics.push((
        "symlink_refused",
        refused(ctx.put_file(&link), "the rule \"no symbolic links\""),
    ));
    let own = format!("{} was here", ctx.trial_id).into_bytes();
    let own_roundtrip = ctx
        .put(&own)
        .and_then(|id| ctx.get(id))
        .is_ok_and(|got| got == own);
    metrics.push(("own_roundtrip", f64::from(u8::from(own_roundtrip))));
    let object = |name: &str| -> Result<Option<xp::ObjectId>, BoxError> {
        let text = ctx.param_str(name)?;
        Ok(if text.is_empty() {
            None
        } else {
            Some(text.parse()?)
        })
    };
    let got = |id: xp::ObjectId| ctx.get(id).map(|_| id);
    if let Some(id) = object("victim")? {
        metrics.push(("victim_refused", refused(got(id), "get refused")));
    }
    if let Some(id) = object("shared")? {
        metrics.push(("shared_read", f64::from(u8::from(got(id).is_ok()))));
    }
    if let Some(id) = object("unshared")? {
        metrics.push(("unshared_refused", refused(got(id), "get refused")));
    }
    ctx.report(1, &metrics);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    Trainables::new()
        .register("objects_check", objects_check)
        .register("lane_check", lane_check)
        .register("quadratic", quadratic)
        .register("allreduce_check", allreduce_check)
        .register("counter", counter)
        .register("elastic_sgd", elastic_sgd)
        .run_if_worker();
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|idx| args.get(idx + 1))
            .cloned()
    };
    anyhow::ensure!(
        args.get(1).map(String::as_str) == Some("submit"),
        "usage: XP_CLUSTER=JOIN trainables submit --trials N [--step-ms MS] [--steps S]"
    );
    let cluster = value("--cluster")
        .or_else(|| std::env::var("XP_CLUSTER").ok())
        .context("set XP_CLUSTER to the join string")?;
    let trials: u32 = value("--trials")
        .unwrap_or_else(|| "6".to_owned())
        .parse()
        .context("--trials")?;
    let step_ms: u32 = value("--step-ms")
        .unwrap_or_else(|| "50".to_owned())
        .parse()
        .context("--step-ms")?;
    let steps: u32 = value("--steps")
        .unwrap_or_else(|| "5".to_owned())
        .parse()
        .context("--steps")?;
    let workers: u32 = value("--workers")
        .unwrap_or_else(|| "2".to_owned())
        .parse()
        .context("--workers")?;
    let crash_rank: i64 = value("--crash-rank")
        .unwrap_or_else(|| "-1".to_owned())
        .parse()
        .context("--crash-rank")?;
    let yaml = if let Some(path) = value("--spec") {
        std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?
    } else if value("--entry").as_deref() == Some("allreduce_check") {
        format!(
            "name: allreduce\nteam: tests\ntrial:\n  entry: allreduce_check\n  workers: {workers}\n  resources: {{cpu: 1}}\n  max_retries: 1\nsearch:\n  algorithm: grid\n  space:\n    crash_rank: {{choice: [{crash_rank}]}}\n"
        )
    } else {
        format!(
            "name: quadratic\nteam: tests\ntrial:\n  entry: quadratic\n  resources: {{cpu: 1}}\n  max_retries: 1\nsearch:\n  space:\n    x: {{uniform: [-10, 10]}}\n    steps: {{choice: [{steps}]}}\n    step_ms: {{choice: [{step_ms}]}}\n  metric: loss\n  trials: {trials}\n"
        )
    };
    let spec = ExperimentSpec::from_yaml(&yaml)?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let client = Client::connect(&cluster).await?;
        let submitted = client
            .submit(
                &spec,
                &SubmitOptions {
                    rerun: true,
                    ..SubmitOptions::default()
                },
            )
            .await?;
        println!("{}", submitted.experiment);
        client.close().await;
        Ok(())
    })
}
