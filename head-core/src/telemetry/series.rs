//! One worker's telemetry series, downsampled so that it stays bounded however
//! long the trial runs: pure, no I/O.
//!
//! A series is at most [`MAX_SERIES_POINTS`] windows of consecutive samples.
//! Each window holds up to `per_window` samples (1 at first); when the series is
//! full and its last window too, neighbouring windows merge pairwise (halving
//! the count and doubling `per_window`) and the new sample opens a window of its
//! own. A window keeps, per field, min, max, sum and count, so a merge loses no
//! mean, minimum or maximum (property-tested below).
//!
//! Invariants: at most [`MAX_SERIES_POINTS`] windows; every window but the last
//! holds exactly `per_window` samples, so `per_window` is the largest window's
//! count and a series rebuilt from its stored windows ([`Series::from_windows`])
//! goes on exactly as the original would.

use xp_runtime::clock::UnixMillis;
use xp_runtime::protocol::{FieldStats, MAX_SERIES_POINTS, TelemetryWindow};

/// One sample's values, each absent when it was not measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Values {
    /// CPU cores.
    pub cpu_cores: Option<f64>,
    /// Resident bytes.
    pub rss_bytes: Option<f64>,
    /// GPU utilisation, percent.
    pub gpu_util: Option<f64>,
    /// GPU memory bytes.
    pub gpu_mem_bytes: Option<f64>,
    /// GPU power, watts.
    pub gpu_power_w: Option<f64>,
}

/// Which stored windows a push changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Only this window (updated or appended).
    Slot(usize),
    /// Every window from 0 to `len` was rewritten (a merge); windows from `len`
    /// to `old_len` are gone.
    Rebuilt {
        /// Windows now.
        len: usize,
        /// Windows before.
        old_len: usize,
    },
}

/// A bounded, downsampled series of one worker's samples.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    windows: Vec<TelemetryWindow>,
    per_window: u64,
}

impl Default for Series {
    fn default() -> Self {
        Self::new()
    }
}

fn window_of(at: UnixMillis, values: Values) -> TelemetryWindow {
    TelemetryWindow {
        start_ms: at,
        end_ms: at,
        samples: 1,
        cpu_cores: values.cpu_cores.map(FieldStats::of),
        rss_bytes: values.rss_bytes.map(FieldStats::of),
        gpu_util: values.gpu_util.map(FieldStats::of),
        gpu_mem_bytes: values.gpu_mem_bytes.map(FieldStats::of),
        gpu_power_w: values.gpu_power_w.map(FieldStats::of),
    }
}

/// Two consecutive windows as one.
pub(crate) fn merge(a: &TelemetryWindow, b: &TelemetryWindow) -> TelemetryWindow {
    TelemetryWindow {
        start_ms: a.start_ms.min(b.start_ms),
        end_ms: a.end_ms.max(b.end_ms),
        samples: a.samples + b.samples,
        cpu_cores: FieldStats::merge_opt(a.cpu_cores, b.cpu_cores),
        rss_bytes: FieldStats::merge_opt(a.rss_bytes, b.rss_bytes),
        gpu_util: FieldStats::merge_opt(a.gpu_util, b.gpu_util),
        gpu_mem_bytes: FieldStats::merge_opt(a.gpu_mem_bytes, b.gpu_mem_bytes),
        gpu_power_w: FieldStats::merge_opt(a.gpu_power_w, b.gpu_power_w),
    }
}

impl Series {
    /// An empty series.
    pub(crate) fn new() -> Self {
        Self {
            windows: Vec::new(),
            per_window: 1,
        }
    }

    /// The series whose stored windows these are (oldest first); more than
    /// [`MAX_SERIES_POINTS`] (a store written otherwise) merge down first.
    pub(crate) fn from_windows(mut windows: Vec<TelemetryWindow>) -> Self {
        while windows.len() > MAX_SERIES_POINTS {
            windows = windows
                .chunks(2)
                .map(|pair| {
                    pair.iter()
                        .skip(1)
                        .fold(pair[0].clone(), |a, b| merge(&a, b))
                })
                .collect();
        }
        let per_window = windows
            .iter()
            .map(|window| window.samples)
            .max()
            .unwrap_or(1)
            .max(1);
        Self {
            windows,
            per_window,
        }
    }

    /// The windows, oldest first.
    pub(crate) fn windows(&self) -> &[TelemetryWindow] {
        &self.windows
    }

    /// Adds a sample taken at `at`; says which windows changed.
    pub(crate) fn push(&mut self, at: UnixMillis, values: Values) -> Change {
        let new = window_of(at, values);
        let per_window = self.per_window;
        if let Some(last) = self.windows.last_mut()
            && last.samples < per_window
        {
            *last = merge(last, &new);
            return Change::Slot(self.windows.len() - 1);
        }
        if self.windows.len() < MAX_SERIES_POINTS {
            self.windows.push(new);
            return Change::Slot(self.windows.len() - 1);
        }
        let old_len = self.windows.len();
        self.windows = self
            .windows
            .chunks(2)
            .map(|pair| {
                pair.iter()
                    .skip(1)
                    .fold(pair[0].clone(), |a, b| merge(&a, b))
            })
            .collect();
        self.per_window = self.per_window.saturating_mul(2);
        self.windows.push(new);
        Change::Rebuilt {
            len: self.windows.len(),
            old_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn values() -> impl Strategy<Value = Values> {
        (
            proptest::option::of(0.0f64..64.0),
            proptest::option::of(0.0f64..1e12),
            proptest::option::of(0.0f64..100.0),
        )
            .prop_map(|(cpu_cores, rss_bytes, gpu_util)| Values {
                cpu_cores,
                rss_bytes,
                gpu_util,
                gpu_mem_bytes: None,
                gpu_power_w: gpu_util.map(|util| util * 3.0),
            })
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Bounded whatever the length; every sample counted once; per field
        /// the sum (so the mean over all windows), minimum and maximum kept.
        #[test]
        fn bounded_and_means_preserved(samples in proptest::collection::vec(values(), 0..3000)) {
            let mut series = Series::new();
            for (index, sample) in samples.iter().enumerate() {
                series.push(index as u64 * 1000, *sample);
                prop_assert!(series.windows().len() <= MAX_SERIES_POINTS);
            }
            let windows = series.windows();
            prop_assert_eq!(windows.iter().map(|w| w.samples).sum::<u64>(), samples.len() as u64);
            for pair in windows.windows(2) {
                prop_assert!(pair[0].end_ms < pair[1].start_ms);
            }
            let raw: Vec<f64> = samples.iter().filter_map(|s| s.cpu_cores).collect();
            let merged: Vec<FieldStats> = windows.iter().filter_map(|w| w.cpu_cores).collect();
            prop_assert_eq!(merged.iter().map(|s| s.n).sum::<u64>(), raw.len() as u64);
            prop_assert!(close(merged.iter().map(|s| s.sum).sum::<f64>(), raw.iter().sum::<f64>()));
            if !raw.is_empty() {
                let min = raw.iter().copied().fold(f64::INFINITY, f64::min);
                let max = raw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                prop_assert_eq!(merged.iter().map(|s| s.min).fold(f64::INFINITY, f64::min), min);
                prop_assert_eq!(merged.iter().map(|s| s.max).fold(f64::NEG_INFINITY, f64::max), max);
            }
            // Each window's mean is the mean of the samples it holds.
            let mut next = 0;
            for window in windows {
                let held = &samples[next..next + window.samples as usize];
                next += window.samples as usize;
                let rss: Vec<f64> = held.iter().filter_map(|s| s.rss_bytes).collect();
                match window.rss_bytes {
                    Some(stats) => prop_assert!(close(stats.mean(), rss.iter().sum::<f64>() / rss.len() as f64)),
                    None => prop_assert!(rss.is_empty()),
                }
            }
        }

        /// A series rebuilt from its stored windows at any point goes on as the original.
        #[test]
        fn rebuilt_from_windows_goes_on_the_same(
            samples in proptest::collection::vec(values(), 1..1500),
            cut in 0usize..1500,
        ) {
            let cut = cut % samples.len();
            let mut original = Series::new();
            for (index, sample) in samples[..cut].iter().enumerate() {
                original.push(index as u64, *sample);
            }
            let mut rebuilt = Series::from_windows(original.windows().to_vec());
            prop_assert_eq!(&rebuilt, &original);
            for (index, sample) in samples[cut..].iter().enumerate() {
                let at = (cut + index) as u64;
                prop_assert_eq!(rebuilt.push(at, *sample), original.push(at, *sample));
            }
            prop_assert_eq!(rebuilt, original);
        }
    }

    #[test]
    fn a_week_at_five_seconds_stays_within_the_bound() {
        let mut series = Series::new();
        let samples = 7 * 24 * 3600 / 5;
        let mut rebuilt = 0;
        for index in 0..samples {
            let change = series.push(
                index * 5000,
                Values {
                    cpu_cores: Some(1.5),
                    ..Values::default()
                },
            );
            if matches!(change, Change::Rebuilt { .. }) {
                rebuilt += 1;
            }
        }
        assert!(series.windows().len() <= MAX_SERIES_POINTS);
        assert!(series.windows().len() > MAX_SERIES_POINTS / 2);
        // Merges are rare: one per doubling of the length.
        assert!(rebuilt <= 12, "{rebuilt} merges");
        let mean = series.windows()[3].cpu_cores.unwrap().mean();
        assert!((mean - 1.5).abs() < 1e-12);
    }
}
