//! Parameter importance by PED-ANOVA (Watanabe, Bansal and Hutter, 2023,
//! "PED-ANOVA: Efficiently Quantifying Hyperparameter Importance in Arbitrary
//! Subspaces"), computed as Optuna's `PedAnovaImportanceEvaluator` computes it
//! with its defaults, for the dashboard's experiment page.
//!
//! The importance of a parameter is the Pearson divergence between two Parzen
//! densities of its values on a grid: that of the top-γ quantile of trials by
//! the metric, and that of all trials. A parameter whose good trials sit where
//! trials in general do not is important; one whose good trials look like all
//! trials is not. The steps, each as Optuna takes it:
//! - the top set: the trials whose loss is at most the γ-quantile (γ = 0.1,
//!   the `ceil(γ·n)`-th smallest loss, ties kept), and at least the two best;
//! - numeric parameters are counted on a grid of 50 points over their domain
//!   (on the log scale for log-distributed ones; fewer points for integers
//!   with few values), categorical ones per choice;
//! - the density over the grid is a mixture of discretised truncated normal
//!   kernels, one per occupied grid point weighted by its count, with Scott's
//!   rule bandwidth, plus a wide prior kernel of weight 1 at the centre
//!   (categorical: one kernel per chosen value, smoothed towards uniform by
//!   the prior);
//! - importances are divided by their sum, so they add up to 1;
//!   single-valued parameters get 0.
//!
//! Pure and bounded: no I/O, no clock; at most [`MAX_TRIALS`] trials and
//! [`GRID_POINTS`] grid points per parameter, so one call costs at most
//! `parameters × trials × grid points` kernel evaluations. The caller picks
//! which trials count (finished ones with a finite metric) and says whether
//! lower is better by the sign of the loss it hands in.

/// The method's name, as the dashboard shows it.
pub const METHOD: &str = "PED-ANOVA";
/// The quantile of trials that counts as good (Optuna's `baseline_quantile`).
pub const DEFAULT_GAMMA: f64 = 0.1;
/// The fewest trials in the top set, whatever γ says (Optuna's `_min_n_top_trials`).
pub const MIN_TOP_TRIALS: usize = 2;
/// The fewest finished trials for which importances are computed at all.
pub const MIN_TRIALS: usize = 4;
/// The most trials one computation reads (the caller's newest).
pub const MAX_TRIALS: usize = 10_000;
/// Grid points over a numeric domain (Optuna's `_n_steps`).
pub const GRID_POINTS: usize = 50;

/// The weight of the prior kernel (Optuna's `_prior_weight`).
const PRIOR_WEIGHT: f64 = 1.0;
/// Added to every density so the ratio is defined (Optuna's `1e-12`).
const PDF_FLOOR: f64 = 1e-12;
/// The narrowest kernel on the grid: 1.64 sigma (90%) fits in one grid cell.
const MIN_SIGMA: f64 = 0.5 / 1.64;

/// Where a parameter's values lie.
#[derive(Debug, Clone, PartialEq)]
pub enum Domain {
    /// A real number in `[low, high]`, on a log scale when `log`.
    Real {
        /// The lower bound.
        low: f64,
        /// The upper bound.
        high: f64,
        /// Whether the logarithm is uniform (`loguniform`).
        log: bool,
    },
    /// An integer in `[low, high]` in steps of `step` (linear) or on a log scale.
    Int {
        /// The lower bound.
        low: i64,
        /// The upper bound.
        high: i64,
        /// The spacing of values on a linear scale.
        step: i64,
        /// Whether it is searched on a log scale.
        log: bool,
    },
    /// One of `choices` values; a trial's value is the index of its choice.
    Choice {
        /// How many values there are.
        choices: usize,
    },
}

/// One parameter: its name and domain.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// The name.
    pub name: String,
    /// Its domain.
    pub domain: Domain,
}

/// One finished trial: its loss (lower is better: the caller negates a
/// metric to maximise) and its value of each parameter, in the order of the
/// parameters (a choice's index for a [`Domain::Choice`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The metric, signed so that lower is better.
    pub loss: f64,
    /// One value per parameter.
    pub values: Vec<f64>,
}

/// What a computation found.
#[derive(Debug, Clone, PartialEq)]
pub struct Importances {
    /// How many trials were read.
    pub trials: usize,
    /// How many of them were in the top set.
    pub top_trials: usize,
    /// The quantile asked for.
    pub gamma: f64,
    /// Each parameter's importance, most important first (ties by name);
    /// they add up to 1.
    pub ranked: Vec<(String, f64)>,
}

/// Why no importances were computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImportanceError {
    /// Too few finished trials for a top set to mean anything.
    #[error("not enough trials: {trials} finished, {needed} needed")]
    NotEnoughTrials {
        /// Finished trials with a finite metric.
        trials: usize,
        /// How many are needed.
        needed: usize,
    },
    /// The search space has no parameter to rate.
    #[error("no parameter to rate")]
    NoParameters,
}

/// The importance of each parameter by PED-ANOVA with quantile `gamma`, over
/// the last [`MAX_TRIALS`] of `observations` (those with a finite loss and
/// finite values only).
pub fn ped_anova(
    params: &[Param],
    observations: &[Observation],
    gamma: f64,
) -> Result<Importances, ImportanceError> {
    if params.is_empty() {
        return Err(ImportanceError::NoParameters);
    }
    let usable: Vec<&Observation> = observations
        .iter()
        .filter(|observation| {
            observation.loss.is_finite()
                && observation.values.len() == params.len()
                && observation.values.iter().all(|value| value.is_finite())
        })
        .collect();
    let usable = &usable[usable.len().saturating_sub(MAX_TRIALS)..];
    if usable.len() < MIN_TRIALS {
        return Err(ImportanceError::NotEnoughTrials {
            trials: usable.len(),
            needed: MIN_TRIALS,
        });
    }
    let gamma = if gamma.is_finite() {
        gamma.clamp(f64::MIN_POSITIVE, 1.0)
    } else {
        DEFAULT_GAMMA
    };
    let top = top_set(usable, gamma);
    let mut raw: Vec<(String, f64)> = params
        .iter()
        .enumerate()
        .map(|(index, param)| {
            let all: Vec<f64> = usable.iter().map(|o| o.values[index]).collect();
            let best: Vec<f64> = top.iter().map(|o| o.values[index]).collect();
            (param.name.clone(), divergence(&param.domain, &best, &all))
        })
        .collect();
    let rated = params.iter().filter(|p| !is_single(&p.domain)).count();
    let sum: f64 = raw.iter().map(|(_, value)| value).sum();
    for ((_, value), param) in raw.iter_mut().zip(params) {
        *value = if is_single(&param.domain) {
            0.0
        } else if sum > 0.0 {
            *value / sum
        } else {
            1.0 / rated.max(1) as f64
        };
    }
    raw.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(Importances {
        trials: usable.len(),
        top_trials: top.len(),
        gamma,
        ranked: raw,
    })
}

/// The trials whose loss is at most the larger of the `MIN_TOP_TRIALS`-th
/// smallest and the `ceil(gamma · n)`-th smallest loss (Optuna's quantile
/// filter, ties kept).
fn top_set<'a>(observations: &[&'a Observation], gamma: f64) -> Vec<&'a Observation> {
    let mut losses: Vec<f64> = observations.iter().map(|o| o.loss).collect();
    losses.sort_by(f64::total_cmp);
    let quantile_rank = ((gamma * losses.len() as f64).ceil() as usize).clamp(1, losses.len());
    let rank = quantile_rank.max(MIN_TOP_TRIALS).min(losses.len());
    let cutoff = losses[rank - 1];
    observations
        .iter()
        .filter(|o| o.loss <= cutoff)
        .copied()
        .collect()
}

/// Whether a domain holds one value only (its importance is 0).
fn is_single(domain: &Domain) -> bool {
    match *domain {
        Domain::Real { low, high, .. } => low >= high,
        Domain::Int { low, high, .. } => low >= high,
        Domain::Choice { choices } => choices <= 1,
    }
}

/// The Pearson divergence of the top set's density from all trials' over
/// the parameter's grid: `Σ p_all · (p_top / p_all − 1)²`.
fn divergence(domain: &Domain, top: &[f64], all: &[f64]) -> f64 {
    if is_single(domain) {
        return 0.0;
    }
    let top_pdf = density(domain, top);
    let all_pdf = density(domain, all);
    top_pdf
        .iter()
        .zip(&all_pdf)
        .map(|(top, all)| {
            let (top, all) = (top + PDF_FLOOR, all + PDF_FLOOR);
            all * (top / all - 1.0).powi(2)
        })
        .sum()
}

/// The Parzen density of `values` at each grid point of `domain`.
fn density(domain: &Domain, values: &[f64]) -> Vec<f64> {
    match *domain {
        Domain::Choice { choices } => {
            let mut counts = vec![0.0; choices];
            for value in values {
                let index = (*value as usize).min(choices - 1);
                counts[index] += 1.0;
            }
            categorical_density(&counts)
        }
        _ => numeric_density(&grid_counts(domain, values)),
    }
}

/// How many of `values` fall at each point of the domain's grid: the grid is
/// `GRID_POINTS` points evenly over `[low, high]` (their logarithms for a log
/// domain), fewer for an integer domain with fewer values; a value counts at
/// the first grid point at or above it less half a grid step.
fn grid_counts(domain: &Domain, values: &[f64]) -> Vec<f64> {
    let (low, high, log, points) = match *domain {
        Domain::Real { low, high, log } => (low, high, log, GRID_POINTS),
        Domain::Int {
            low,
            high,
            step,
            log,
        } => {
            let points = if log {
                let size = (high - low + 1) as f64;
                (size.log2().ceil() as usize + 1).min(GRID_POINTS)
            } else {
                let steps = ((high - low) as f64 / step.max(1) as f64).round() as usize;
                (steps + 1).min(GRID_POINTS)
            };
            (low as f64, high as f64, log, points)
        }
        Domain::Choice { choices } => (0.0, choices as f64 - 1.0, false, choices),
    };
    let scale = |value: f64| {
        if log {
            value.max(f64::MIN_POSITIVE).ln()
        } else {
            value
        }
    };
    let (low, high) = (scale(low), scale(high));
    let points = points.max(2);
    let step = (high - low) / (points - 1) as f64;
    let mut counts = vec![0.0; points];
    for value in values {
        let shifted = scale(*value) - step / 2.0;
        // The number of grid points below `shifted`: numpy's `searchsorted`.
        let below = (0..points)
            .take_while(|&index| low + step * (index as f64) < shifted)
            .count();
        counts[below.min(points - 1)] += 1.0;
    }
    counts
}

/// The density over grid points `0..counts.len()`: one discretised truncated
/// normal kernel at each occupied point, weighted by its count, with Scott's
/// rule bandwidth (at least [`MIN_SIGMA`]), plus a prior kernel of weight
/// [`PRIOR_WEIGHT`] at the centre as wide as the grid.
fn numeric_density(counts: &[f64]) -> Vec<f64> {
    let points = counts.len();
    let occupied: Vec<(f64, f64)> = counts
        .iter()
        .enumerate()
        .filter(|(_, count)| **count > 0.0)
        .map(|(index, count)| (index as f64, *count))
        .collect();
    let sigma = scott_bandwidth(&occupied).max(MIN_SIGMA);
    let mut kernels: Vec<(f64, f64, f64)> = occupied
        .iter()
        .map(|(mu, count)| (*mu, sigma, *count))
        .collect();
    let high = (points - 1) as f64;
    kernels.push((0.5 * high, high + 1.0, PRIOR_WEIGHT));
    let total: f64 = kernels.iter().map(|(_, _, weight)| weight).sum();
    (0..points)
        .map(|x| {
            kernels
                .iter()
                .map(|(mu, sigma, weight)| weight * discrete_normal(x as f64, *mu, *sigma, high))
                .sum::<f64>()
                / total
        })
        .collect()
}

/// Scott's rule over grid indices with counts:
/// `1.059 · min(IQR / 1.34, sd) · n^(-1/5)`, the quartiles read off the
/// cumulative counts as Optuna reads them.
fn scott_bandwidth(occupied: &[(f64, f64)]) -> f64 {
    let n: f64 = occupied.iter().map(|(_, count)| count).sum();
    if occupied.is_empty() || n <= 0.0 {
        return 0.0;
    }
    let mean = occupied.iter().map(|(mu, count)| mu * count).sum::<f64>() / n;
    let variance = occupied
        .iter()
        .map(|(mu, count)| (mu - mean).powi(2) * count)
        .sum::<f64>()
        / (n - 1.0).max(1.0);
    let mut cumulative = Vec::with_capacity(occupied.len());
    let mut running = 0.0;
    for (_, count) in occupied {
        running += count;
        cumulative.push(running);
    }
    let quarter = (n / 4.0).floor();
    let three_quarters = (n * 3.0 / 4.0).floor();
    let q25 = cumulative.iter().take_while(|&&c| c < quarter).count();
    let q75 = cumulative
        .iter()
        .take_while(|&&c| c <= three_quarters)
        .count();
    let last = occupied.len() - 1;
    let iqr = occupied[q75.min(last)].0 - occupied[q25.min(last)].0;
    1.059 * (iqr / 1.34).min(variance.sqrt()) * n.powf(-0.2)
}

/// The mass a normal of `mu` and `sigma` puts on `[x − ½, x + ½]`, truncated
/// to `[−½, high + ½]`.
fn discrete_normal(x: f64, mu: f64, sigma: f64, high: f64) -> f64 {
    let (lower, upper) = (-0.5, high + 0.5);
    let mass = |a: f64, b: f64| gauss_mass((a - mu) / sigma, (b - mu) / sigma);
    let accepted = mass(lower, upper);
    if accepted <= 0.0 {
        return 0.0;
    }
    mass((x - 0.5).max(lower), (x + 0.5).min(upper)) / accepted
}

/// `Φ(b) − Φ(a)` for `a ≤ b`, taken on the side of zero that keeps its
/// precision in the tails.
fn gauss_mass(a: f64, b: f64) -> f64 {
    let tail = |z: f64| 0.5 * erfc(z / std::f64::consts::SQRT_2);
    if a >= 0.0 {
        tail(a) - tail(b)
    } else if b <= 0.0 {
        tail(-b) - tail(-a)
    } else {
        1.0 - tail(-a) - tail(b)
    }
}

/// The complementary error function (Numerical Recipes' `erfcc`, a Chebyshev
/// fit with a relative error below 1.2e-7 everywhere).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let value = t * poly.exp();
    if x >= 0.0 { value } else { 2.0 - value }
}

/// The density over choices: one kernel per chosen value, weighted by how
/// often it was chosen, each putting `1 + w` on its value and `w` on every
/// other (`w` = the prior weight over the number of kernels), normalised;
/// plus a uniform prior kernel of weight [`PRIOR_WEIGHT`].
fn categorical_density(counts: &[f64]) -> Vec<f64> {
    let choices = counts.len();
    let chosen: Vec<(usize, f64)> = counts
        .iter()
        .enumerate()
        .filter(|(_, count)| **count > 0.0)
        .map(|(index, count)| (index, *count))
        .collect();
    let uniform = 1.0 / choices as f64;
    if chosen.is_empty() {
        return vec![uniform; choices];
    }
    let kernels = (chosen.len() + 1) as f64;
    let floor = PRIOR_WEIGHT / kernels;
    let row_sum = floor * choices as f64 + 1.0;
    let total: f64 = chosen.iter().map(|(_, count)| count).sum::<f64>() + PRIOR_WEIGHT;
    (0..choices)
        .map(|x| {
            let kernels_mass: f64 = chosen
                .iter()
                .map(|(index, count)| {
                    let mass = if *index == x { floor + 1.0 } else { floor };
                    count * mass / row_sum
                })
                .sum();
            (kernels_mass + PRIOR_WEIGHT * uniform) / total
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded stream of numbers in [0, 1) (splitmix64), so the synthetic
    /// studies are the same on every run.
    struct Stream(u64);

    impl Stream {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn real(name: &str, low: f64, high: f64, log: bool) -> Param {
        Param {
            name: name.to_owned(),
            domain: Domain::Real { low, high, log },
        }
    }

    fn choice(name: &str, choices: usize) -> Param {
        Param {
            name: name.to_owned(),
            domain: Domain::Choice { choices },
        }
    }

    /// `n` trials with values drawn by `draw` and the loss `loss` of them.
    fn study(
        n: usize,
        seed: u64,
        draw: impl Fn(&mut Stream) -> Vec<f64>,
        loss: impl Fn(&[f64], &mut Stream) -> f64,
    ) -> Vec<Observation> {
        let mut stream = Stream(seed);
        (0..n)
            .map(|_| {
                let values = draw(&mut stream);
                let loss = loss(&values, &mut stream);
                Observation { loss, values }
            })
            .collect()
    }

    /// Checks the parameters' order by importance, and that the importances
    /// add up to 1.
    fn check(params: &[Param], observations: &[Observation], expected_order: &[&str]) {
        let found = ped_anova(params, observations, DEFAULT_GAMMA).expect("importances");
        let order: Vec<&str> = found.ranked.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(order, expected_order, "{:?}", found.ranked);
        let sum: f64 = found.ranked.iter().map(|(_, value)| value).sum();
        assert!((sum - 1.0).abs() < 1e-9, "they add up to {sum}");
    }

    #[test]
    fn a_parameter_that_decides_the_metric_ranks_above_noise() {
        let params = [real("noise", 0.0, 1.0, false), real("x", -5.0, 5.0, false)];
        let observations = study(
            200,
            7,
            |s| vec![s.next(), -5.0 + 10.0 * s.next()],
            |v, s| (v[1] - 2.0).powi(2) + 0.01 * s.next(),
        );
        check(&params, &observations, &["x", "noise"]);
        let found = ped_anova(&params, &observations, DEFAULT_GAMMA).expect("importances");
        assert!(found.ranked[0].1 > 0.8, "{:?}", found.ranked);
        assert_eq!(found.top_trials, 20);
        assert_eq!(found.trials, 200);
    }

    #[test]
    fn a_log_parameter_is_rated_on_its_log_scale() {
        // The good learning rates are the smallest decade of four: on a
        // linear grid they would all fall in the first cell with most others.
        let params = [real("lr", 1e-5, 1e-1, true), real("noise", 0.0, 1.0, false)];
        let observations = study(
            300,
            11,
            |s| vec![10f64.powf(-5.0 + 4.0 * s.next()), s.next()],
            |v, s| (v[0].log10() + 4.5).abs() + 0.05 * s.next(),
        );
        check(&params, &observations, &["lr", "noise"]);
    }

    #[test]
    fn a_categorical_parameter_is_rated_by_frequency() {
        let params = [
            choice("optimizer", 3),
            Param {
                name: "width".to_owned(),
                domain: Domain::Int {
                    low: 16,
                    high: 256,
                    step: 16,
                    log: false,
                },
            },
        ];
        let observations = study(
            120,
            3,
            |s| {
                vec![
                    (s.next() * 3.0).floor(),
                    16.0 * (1.0 + (s.next() * 16.0).floor()),
                ]
            },
            |v, s| if v[0] == 1.0 { 0.1 } else { 1.0 } + 0.05 * s.next(),
        );
        check(&params, &observations, &["optimizer", "width"]);
    }

    #[test]
    fn maximising_is_minimising_the_negated_metric() {
        let params = [real("a", 0.0, 1.0, false), real("b", 0.0, 1.0, false)];
        let observations = study(100, 5, |s| vec![s.next(), s.next()], |v, _| -(v[1] * 10.0));
        check(&params, &observations, &["b", "a"]);
    }

    #[test]
    fn fewer_than_four_trials_are_not_enough() {
        let params = [real("x", 0.0, 1.0, false)];
        let observations = study(3, 1, |s| vec![s.next()], |v, _| v[0]);
        assert_eq!(
            ped_anova(&params, &observations, DEFAULT_GAMMA),
            Err(ImportanceError::NotEnoughTrials {
                trials: 3,
                needed: MIN_TRIALS
            })
        );
        // A trial without a finite metric does not count.
        let mut observations = study(4, 1, |s| vec![s.next()], |v, _| v[0]);
        observations[0].loss = f64::NAN;
        assert!(matches!(
            ped_anova(&params, &observations, DEFAULT_GAMMA),
            Err(ImportanceError::NotEnoughTrials { trials: 3, .. })
        ));
        assert_eq!(
            ped_anova(&[], &observations, DEFAULT_GAMMA),
            Err(ImportanceError::NoParameters)
        );
    }

    #[test]
    fn the_top_set_holds_at_least_two_trials_and_keeps_ties() {
        let losses = |losses: &[f64]| -> Vec<Observation> {
            losses
                .iter()
                .map(|loss| Observation {
                    loss: *loss,
                    values: vec![*loss],
                })
                .collect()
        };
        let check_top = |values: &[f64], gamma: f64, expected: usize| {
            let observations = losses(values);
            let refs: Vec<&Observation> = observations.iter().collect();
            assert_eq!(top_set(&refs, gamma).len(), expected, "{values:?} {gamma}");
        };
        check_top(&[5.0, 1.0, 4.0, 2.0, 3.0], 0.1, 2);
        check_top(&[5.0, 1.0, 4.0, 2.0, 3.0], 0.5, 3);
        check_top(&[1.0, 1.0, 1.0, 2.0], 0.1, 3);
        check_top(&(0..40).map(f64::from).collect::<Vec<_>>(), 0.1, 4);
    }

    #[test]
    fn equal_losses_or_single_values_give_no_false_importance() {
        // Every trial equally good: all are in the top set, nothing differs.
        let params = [real("a", 0.0, 1.0, false), real("b", 0.0, 1.0, false)];
        let observations = study(10, 2, |s| vec![s.next(), s.next()], |_, _| 1.0);
        let found = ped_anova(&params, &observations, DEFAULT_GAMMA).expect("importances");
        for (_, value) in &found.ranked {
            assert!((value - 0.5).abs() < 1e-9, "{:?}", found.ranked);
        }
        // A parameter with one value is worth 0; the others share the rest.
        let params = [choice("tag", 1), real("x", 0.0, 1.0, false)];
        let observations = study(10, 2, |s| vec![0.0, s.next()], |v, _| v[1]);
        let found = ped_anova(&params, &observations, DEFAULT_GAMMA).expect("importances");
        assert_eq!(
            found.ranked,
            vec![("x".to_owned(), 1.0), ("tag".to_owned(), 0.0)]
        );
    }

    #[test]
    fn densities_are_distributions_over_the_grid() {
        for counts in [vec![0.0; 50], vec![3.0, 0.0, 0.0, 1.0], {
            let mut counts = vec![0.0; 50];
            counts[49] = 10.0;
            counts
        }] {
            let total: f64 = numeric_density(&counts).iter().sum();
            assert!((total - 1.0).abs() < 1e-6, "{counts:?}: {total}");
        }
        let total: f64 = categorical_density(&[0.0, 4.0, 1.0]).iter().sum();
        assert!((total - 1.0).abs() < 1e-12);
        // A value above the grid's last point counts at the last point.
        let counts = grid_counts(
            &Domain::Real {
                low: 0.0,
                high: 1.0,
                log: false,
            },
            &[0.0, 1.0, 7.0],
        );
        assert_eq!((counts[0], counts[49]), (1.0, 2.0));
        // Integers on a log scale: ceil(log2(1024)) + 1 points.
        let counts = grid_counts(
            &Domain::Int {
                low: 1,
                high: 1024,
                step: 1,
                log: true,
            },
            &[1.0, 1024.0],
        );
        assert_eq!(counts.len(), 11);
        assert!((erfc(0.0) - 1.0).abs() < 1e-7 && (erfc(1.0) - 0.157_299_207).abs() < 1e-7);
    }

    #[test]
    fn at_most_the_last_ten_thousand_trials_are_read() {
        let params = [real("x", 0.0, 1.0, false)];
        let observations = study(MAX_TRIALS + 50, 9, |s| vec![s.next()], |v, _| v[0]);
        let found = ped_anova(&params, &observations, DEFAULT_GAMMA).expect("importances");
        assert_eq!(found.trials, MAX_TRIALS);
        assert_eq!(found.top_trials, MAX_TRIALS / 10);
    }
}
