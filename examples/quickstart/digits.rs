//! A small but real training job for the quickstart: a one-hidden-layer MLP
//! that learns to classify the UCI handwritten digits (8x8 images, 10 classes).
//!
//! It exists so the quickstart can run a hyper-parameter sweep whose trials do
//! genuine work in a second or two on a CPU, and whose results differ visibly
//! between good and bad settings (learning rate, hidden width, epochs).
//!
//! The data set (1,797 images, CC BY 4.0; see `data/digits/README.md`) is
//! embedded in the binary at compile time, so nothing is read from disk at run
//! time. The model is built directly on `candle-core` tensors and trained with
//! its autograd (`Var`, `Tensor::backward`, `GradStore`); everything is `f32`
//! on the CPU and fully deterministic for a given [`DigitsConfig::seed`].

use std::io::Read as _;

use anyhow::{Context as _, Result, bail, ensure};
use candle_core::{DType, Device, Tensor, Var};
use xp_runtime::seeded::SplitMix64;

/// The gzip-compressed CSV: per line 64 pixels in `0..=16`, then the label.
static DIGITS_CSV_GZ: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/digits/digits.csv.gz"
));

const PIXELS: usize = 64;
const CLASSES: usize = 10;
const MAX_PIXEL: u32 = 16;
const MIN_ROWS: usize = 100;
/// Momentum of the SGD optimiser.
const MOMENTUM: f64 = 0.9;
/// Share of the data set (in percent) held out for validation.
const VALIDATION_PERCENT: usize = 20;

/// Hyper-parameters of one training run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DigitsConfig {
    /// Step size of SGD with momentum 0.9; must be finite and > 0.
    pub(crate) learning_rate: f64,
    /// Width of the hidden layer; must be >= 1.
    pub(crate) hidden: usize,
    /// Number of passes over the training split; must be >= 1.
    pub(crate) epochs: usize,
    /// Images per optimisation step; must be >= 1 (the last batch of an
    /// epoch may be smaller).
    pub(crate) batch_size: usize,
    /// L2 penalty on the two weight matrices (not the biases), added to the
    /// gradient as `weight_decay * w`; must be finite and >= 0.
    pub(crate) weight_decay: f64,
    /// Seeds the train/validation split, the weight initialisation and the
    /// per-epoch shuffles.
    pub(crate) seed: u64,
}

/// Metrics after one epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct EpochReport {
    /// 1-based epoch number.
    pub(crate) epoch: usize,
    /// Mean cross-entropy over the epoch's training batches (as the model
    /// was while it trained on them), weighted by batch size.
    pub(crate) train_loss: f64,
    /// Mean cross-entropy on the validation split after the epoch.
    pub(crate) val_loss: f64,
    /// Share of the validation split classified correctly, in `0..=1`.
    pub(crate) val_accuracy: f64,
}

/// Loads the embedded data set, splits it deterministically (by `seed`) into
/// 80% train / 20% validation, trains a `64 -> hidden -> 10` MLP (ReLU,
/// softmax cross-entropy) with mini-batch SGD with momentum 0.9 using candle's
/// autograd, calls `on_epoch` after every epoch and returns the last report.
///
/// Fails on an invalid config, on corrupt embedded data, or when training
/// diverges (a non-finite loss, which a too-large learning rate can cause).
#[allow(
    dead_code,
    reason = "the data-parallel example trains through train_sharded"
)]
pub(crate) fn train(cfg: &DigitsConfig, on_epoch: impl FnMut(&EpochReport)) -> Result<EpochReport> {
    train_sharded(cfg, 0, 1, &mut |_| Ok(()), on_epoch)
}

/// [`train`] as rank `rank` of `world` data-parallel workers: every global batch is
/// split into `world` contiguous shards, this rank computes the gradient of its
/// shard (weighted by its share of the batch), and `sum_across_ranks` must replace
/// the flattened gradient (with the batch loss appended) by its sum over all ranks.
/// The result is the full batch's gradient on every rank, so every rank takes the
/// same step as single-worker training with the same global batch and seed.
pub(crate) fn train_sharded(
    cfg: &DigitsConfig,
    rank: usize,
    world: usize,
    sum_across_ranks: &mut dyn FnMut(&mut [f32]) -> Result<()>,
    mut on_epoch: impl FnMut(&EpochReport),
) -> Result<EpochReport> {
    validate(cfg).context("invalid digits training config")?;
    ensure!(
        world >= 1 && rank < world,
        "rank {rank} is not below the world size {world}"
    );
    let mut run = TrainingRun::prepare(cfg, rank, world)?;
    let mut shuffle_rng = stream_rng(cfg.seed, STREAM_SHUFFLE);
    let mut batch_order: Vec<u32> = (0..run.train_set.len)
        .map(|i| u32::try_from(i).context("training split too large"))
        .collect::<Result<_>>()?;
    let mut last = None;
    for epoch in 1..=cfg.epochs {
        shuffle_rng.shuffle(&mut batch_order);
        let mut loss_sum = 0.0_f64;
        for batch in batch_order.chunks(cfg.batch_size) {
            let batch_loss = run.train_batch(batch, sum_across_ranks)?;
            // `batch.len()` is at most a few thousand, exactly representable.
            #[allow(clippy::cast_precision_loss)]
            let weight = batch.len() as f64;
            loss_sum += batch_loss * weight;
        }
        #[allow(clippy::cast_precision_loss)]
        let train_loss = loss_sum / run.train_set.len as f64;
        if !train_loss.is_finite() {
            bail!(
                "training diverged in epoch {epoch}: train loss is {train_loss} \
                 (learning rate {} is probably too large)",
                cfg.learning_rate
            );
        }
        let (val_loss, val_accuracy) = evaluate(&run.model, &run.val_set)
            .with_context(|| format!("evaluating after epoch {epoch}"))?;
        let report = EpochReport {
            epoch,
            train_loss,
            val_loss,
            val_accuracy,
        };
        on_epoch(&report);
        last = Some(report);
    }
    last.context("no epoch ran (epochs must be >= 1)")
}

/// One rank's training: the two splits as tensors, the model and its
/// optimiser, and which shard of each global batch is this rank's.
struct TrainingRun {
    device: Device,
    train_set: Split,
    val_set: Split,
    model: Mlp,
    optimizer: SgdMomentum,
    rank: usize,
    world: usize,
}

impl TrainingRun {
    /// Loads the embedded data, splits it (the first 20% of a seeded shuffle
    /// validate) and initialises the model and SGD.
    fn prepare(cfg: &DigitsConfig, rank: usize, world: usize) -> Result<Self> {
        let data = load_embedded().context("loading the embedded digits data set")?;
        let device = Device::Cpu;
        let mut order: Vec<usize> = (0..data.len()).collect();
        stream_rng(cfg.seed, STREAM_SPLIT).shuffle(&mut order);
        let val_len = data.len() * VALIDATION_PERCENT / 100;
        let (val_idx, train_idx) = order.split_at(val_len);
        let train_set = data
            .to_tensors(train_idx, &device)
            .context("building the training tensors")?;
        let val_set = data
            .to_tensors(val_idx, &device)
            .context("building the validation tensors")?;
        let mut init_rng = stream_rng(cfg.seed, STREAM_INIT);
        let model =
            Mlp::new(cfg.hidden, &mut init_rng, &device).context("initialising the model")?;
        let optimizer = SgdMomentum::new(&model, cfg.learning_rate, cfg.weight_decay)
            .context("creating SGD")?;
        Ok(Self {
            device,
            train_set,
            val_set,
            model,
            optimizer,
            rank,
            world,
        })
    }

    /// One optimisation step on a global batch (training-set indexes): this
    /// rank's shard's gradient, summed over the ranks, then the SGD update.
    /// Returns the batch's mean loss.
    fn train_batch(
        &mut self,
        batch: &[u32],
        sum_across_ranks: &mut dyn FnMut(&mut [f32]) -> Result<()>,
    ) -> Result<f64> {
        let (rank, world) = (self.rank, self.world);
        // This rank's contiguous shard of the global batch; an empty shard (a last
        // batch smaller than the world) contributes a zero gradient.
        let (start, end) = (batch.len() * rank / world, batch.len() * (rank + 1) / world);
        let empty_shard = start == end;
        let chunk = if empty_shard {
            &batch[..1]
        } else {
            &batch[start..end]
        };
        let ids = Tensor::from_slice(chunk, chunk.len(), &self.device)
            .context("building a batch index tensor")?;
        let x = self
            .train_set
            .x
            .index_select(&ids, 0)
            .context("selecting batch images")?;
        let y = self
            .train_set
            .y
            .index_select(&ids, 0)
            .context("selecting batch labels")?;
        let logits = self.model.forward(&x).context("forward pass")?;
        let shard_loss = cross_entropy(&logits, &y).context("computing the batch loss")?;
        // The shard's share of the batch mean: summed over ranks, the batch's gradient.
        #[allow(clippy::cast_precision_loss)]
        let share = if empty_shard {
            0.0
        } else {
            chunk.len() as f64 / batch.len() as f64
        };
        let loss = shard_loss
            .affine(share, 0.0)
            .context("weighting the shard loss")?;
        let mut grads = loss.backward().context("backward pass")?;
        let batch_loss = if world > 1 {
            self.sum_gradients(&mut grads, &loss, sum_across_ranks)?
        } else {
            f64::from(loss.to_scalar::<f32>().context("reading the batch loss")?)
        };
        self.optimizer
            .step(&self.model, &grads)
            .context("applying the SGD update")?;
        Ok(batch_loss)
    }

    /// Replaces this rank's gradients in `grads` by their sum over the ranks
    /// (flattened, with the shard loss appended, through `sum_across_ranks`);
    /// returns the summed loss.
    fn sum_gradients(
        &self,
        grads: &mut candle_core::backprop::GradStore,
        loss: &Tensor,
        sum_across_ranks: &mut dyn FnMut(&mut [f32]) -> Result<()>,
    ) -> Result<f64> {
        let mut flat = Vec::new();
        for param in self.model.params() {
            let grad = grads
                .get(param.as_tensor())
                .context("a parameter has no gradient")?;
            flat.extend(
                grad.flatten_all()?
                    .to_vec1::<f32>()
                    .context("reading a gradient")?,
            );
        }
        flat.push(loss.to_scalar::<f32>().context("reading the shard loss")?);
        sum_across_ranks(&mut flat).context("summing gradients across ranks")?;
        let mut offset = 0;
        for param in self.model.params() {
            let shape = param.as_tensor().shape().clone();
            let len = shape.elem_count();
            let summed = Tensor::from_slice(&flat[offset..offset + len], shape, &self.device)?;
            grads.insert(param.as_tensor(), summed);
            offset += len;
        }
        Ok(f64::from(flat[offset]))
    }
}

fn validate(cfg: &DigitsConfig) -> Result<()> {
    ensure!(cfg.hidden >= 1, "hidden must be >= 1, got {}", cfg.hidden);
    ensure!(cfg.epochs >= 1, "epochs must be >= 1, got {}", cfg.epochs);
    ensure!(
        cfg.batch_size >= 1,
        "batch_size must be >= 1, got {}",
        cfg.batch_size
    );
    ensure!(
        cfg.learning_rate.is_finite() && cfg.learning_rate > 0.0,
        "learning_rate must be finite and > 0, got {}",
        cfg.learning_rate
    );
    ensure!(
        cfg.weight_decay.is_finite() && cfg.weight_decay >= 0.0,
        "weight_decay must be finite and >= 0, got {}",
        cfg.weight_decay
    );
    Ok(())
}

// ---------------------------------------------------------------- data ----

/// The parsed data set, pixels already scaled to `[0, 1]`.
struct Digits {
    /// Row-major, `PIXELS` values per image.
    pixels: Vec<f32>,
    labels: Vec<u32>,
}

/// A split as tensors: `x` is `(len, 64)` f32, `y` is `(len,)` u32.
struct Split {
    x: Tensor,
    y: Tensor,
    len: usize,
}

impl Digits {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn to_tensors(&self, indices: &[usize], device: &Device) -> Result<Split> {
        let mut x = Vec::with_capacity(indices.len() * PIXELS);
        let mut y = Vec::with_capacity(indices.len());
        for &i in indices {
            x.extend_from_slice(&self.pixels[i * PIXELS..(i + 1) * PIXELS]);
            y.push(self.labels[i]);
        }
        let len = indices.len();
        Ok(Split {
            x: Tensor::from_vec(x, (len, PIXELS), device).context("image tensor")?,
            y: Tensor::from_vec(y, len, device).context("label tensor")?,
            len,
        })
    }
}

fn load_embedded() -> Result<Digits> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_CSV_GZ)
        .read_to_string(&mut text)
        .context("decompressing data/digits/digits.csv.gz")?;
    parse_csv(&text)
}

/// Parses the CSV, checking every value; errors name the 1-based line.
fn parse_csv(text: &str) -> Result<Digits> {
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        ensure!(
            fields.len() == PIXELS + 1,
            "line {line_no}: expected {} comma-separated values, found {}",
            PIXELS + 1,
            fields.len()
        );
        for (col, field) in fields[..PIXELS].iter().enumerate() {
            let value: u32 = field.trim().parse().with_context(|| {
                format!("line {line_no}, pixel {col}: {field:?} is not an integer")
            })?;
            ensure!(
                value <= MAX_PIXEL,
                "line {line_no}, pixel {col}: value {value} is outside 0..={MAX_PIXEL}"
            );
            // Exact: `value` is at most 16.
            #[allow(clippy::cast_precision_loss)]
            pixels.push(value as f32 / MAX_PIXEL as f32);
        }
        let field = fields[PIXELS].trim();
        let label: u32 = field
            .parse()
            .with_context(|| format!("line {line_no}: label {field:?} is not an integer"))?;
        ensure!(
            (label as usize) < CLASSES,
            "line {line_no}: label {label} is outside 0..={}",
            CLASSES - 1
        );
        labels.push(label);
    }
    ensure!(
        labels.len() >= MIN_ROWS,
        "expected at least {MIN_ROWS} images, found {}",
        labels.len()
    );
    Ok(Digits { pixels, labels })
}

// --------------------------------------------------------------- model ----

/// `64 -> hidden -> 10`, ReLU in between; outputs logits.
struct Mlp {
    w1: Var,
    b1: Var,
    w2: Var,
    b2: Var,
}

impl Mlp {
    fn new(hidden: usize, rng: &mut SplitMix64, device: &Device) -> Result<Self> {
        Ok(Self {
            w1: glorot_uniform(PIXELS, hidden, rng, device).context("w1")?,
            b1: Var::zeros(hidden, DType::F32, device).context("b1")?,
            w2: glorot_uniform(hidden, CLASSES, rng, device).context("w2")?,
            b2: Var::zeros(CLASSES, DType::F32, device).context("b2")?,
        })
    }

    fn params(&self) -> [&Var; 4] {
        [&self.w1, &self.b1, &self.w2, &self.b2]
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = x
            .matmul(&self.w1)
            .context("x @ w1")?
            .broadcast_add(&self.b1)
            .context("+ b1")?
            .relu()
            .context("relu")?;
        h.matmul(&self.w2)
            .context("h @ w2")?
            .broadcast_add(&self.b2)
            .context("+ b2")
    }
}

/// Weights uniform in `±sqrt(6 / (fan_in + fan_out))`, shape `(fan_in, fan_out)`.
fn glorot_uniform(
    fan_in: usize,
    fan_out: usize,
    rng: &mut SplitMix64,
    device: &Device,
) -> Result<Var> {
    #[allow(clippy::cast_precision_loss)]
    let limit = (6.0 / (fan_in + fan_out) as f64).sqrt();
    #[allow(clippy::cast_possible_truncation)]
    let values: Vec<f32> = (0..fan_in * fan_out)
        .map(|_| ((rng.next_f64() * 2.0 - 1.0) * limit) as f32)
        .collect();
    Var::from_vec(values, (fan_in, fan_out), device).context("creating a weight matrix")
}

/// Mean softmax cross-entropy of `logits` `(n, 10)` against labels `(n,)` u32.
fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    // Numerically stable log-softmax: subtract the row maximum first. The
    // maximum is a constant shift, so it is detached from the graph.
    let max = logits.max_keepdim(1).context("row max")?.detach();
    let shifted = logits.broadcast_sub(&max).context("logits - max")?;
    let log_norm = shifted
        .exp()
        .context("exp")?
        .sum_keepdim(1)
        .context("sum")?
        .log()
        .context("log")?;
    let log_probs = shifted.broadcast_sub(&log_norm).context("log-softmax")?;
    let targets = labels.unsqueeze(1).context("labels as a column")?;
    log_probs
        .gather(&targets, 1)
        .context("picking the target log-probabilities")?
        .mean_all()
        .context("mean")?
        .neg()
        .context("negate")
}

/// Validation loss and accuracy, without touching the autograd state.
fn evaluate(model: &Mlp, split: &Split) -> Result<(f64, f64)> {
    let logits = model.forward(&split.x).context("forward pass")?.detach();
    let loss = cross_entropy(&logits, &split.y)
        .context("loss")?
        .to_scalar::<f32>()
        .context("reading the loss")?;
    let predicted = logits
        .argmax(1)
        .context("argmax")?
        .to_vec1::<u32>()
        .context("reading predictions")?;
    let actual = split.y.to_vec1::<u32>().context("reading labels")?;
    let correct = predicted
        .iter()
        .zip(&actual)
        .filter(|(p, a)| p == a)
        .count();
    #[allow(clippy::cast_precision_loss)]
    let accuracy = correct as f64 / split.len as f64;
    Ok((f64::from(loss), accuracy))
}

// ----------------------------------------------------------- optimiser ----

/// Classic (PyTorch-style) SGD with momentum 0.9:
/// `v = 0.9 * v + (g + weight_decay * w)`, `w -= lr * v`.
struct SgdMomentum {
    learning_rate: f64,
    weight_decay: f64,
    /// One velocity per parameter, in `Mlp::params` order.
    velocity: Vec<Tensor>,
}

impl SgdMomentum {
    fn new(model: &Mlp, learning_rate: f64, weight_decay: f64) -> Result<Self> {
        let velocity = model
            .params()
            .iter()
            .map(|p| p.as_tensor().zeros_like().context("velocity buffer"))
            .collect::<Result<_>>()?;
        Ok(Self {
            learning_rate,
            weight_decay,
            velocity,
        })
    }

    fn step(&mut self, model: &Mlp, grads: &candle_core::backprop::GradStore) -> Result<()> {
        let decayed = [true, false, true, false]; // weights yes, biases no
        for ((param, velocity), decay) in model
            .params()
            .into_iter()
            .zip(&mut self.velocity)
            .zip(decayed)
        {
            let w = param.as_detached_tensor();
            let mut g = grads
                .get(param.as_tensor())
                .context("a parameter has no gradient")?
                .clone();
            if decay && self.weight_decay > 0.0 {
                g = (g + w.affine(self.weight_decay, 0.0).context("decay term")?)
                    .context("adding weight decay")?;
            }
            *velocity = (velocity.affine(MOMENTUM, 0.0).context("momentum")? + g)
                .context("updating velocity")?;
            let updated = (w - velocity
                .affine(self.learning_rate, 0.0)
                .context("scaled step")?)
            .context("computing the new weights")?;
            param.set(&updated).context("writing the new weights")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- rng ----

const STREAM_SPLIT: u64 = 1;
const STREAM_INIT: u64 = 2;
const STREAM_SHUFFLE: u64 = 3;

/// The generator of `stream` for `seed`: the shared `SplitMix64`, its state offset
/// per stream and one draw discarded, so nearby seeds and streams decorrelate
/// before the first real draw.
fn stream_rng(seed: u64, stream: u64) -> SplitMix64 {
    let mut rng = SplitMix64::new(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
    rng.next_u64();
    rng
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_data_parses() {
        let data = load_embedded().unwrap();
        assert_eq!(data.len(), 1797);
        assert_eq!(data.pixels.len(), 1797 * PIXELS);
    }

    #[test]
    fn bad_rows_name_the_line() {
        let good = format!("{}0\n", "0,".repeat(PIXELS));
        let bad = format!("{}17,3\n", "0,".repeat(PIXELS - 1));
        let err = parse_csv(&format!("{good}{bad}"))
            .err()
            .expect("a pixel of 17 must be rejected");
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn invalid_config_is_rejected() {
        let cfg = DigitsConfig {
            learning_rate: 0.0,
            hidden: 8,
            epochs: 1,
            batch_size: 8,
            weight_decay: 0.0,
            seed: 0,
        };
        assert!(train(&cfg, |_| {}).is_err());
    }

    #[test]
    fn same_seed_same_result() {
        let cfg = DigitsConfig {
            learning_rate: 0.05,
            hidden: 16,
            epochs: 2,
            batch_size: 64,
            weight_decay: 1e-4,
            seed: 7,
        };
        let mut calls = 0;
        let a = train(&cfg, |_| calls += 1).unwrap();
        let b = train(&cfg, |_| {}).unwrap();
        assert_eq!(calls, 2);
        assert_eq!(a, b);
        assert!(a.val_accuracy > 0.5, "{a:?}");
    }
}
