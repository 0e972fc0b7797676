//! Which oversubscribed worker to evict before a GPU runs out of memory.
//!
//! A policy with `oversubscription` above 1 lets fractional workers that opt in
//! share a GPU promised beyond its capacity, betting that they do not all fill
//! their memory at once. When a GPU's memory in use reaches the threshold, the
//! youngest oversubscribed worker on it is evicted through its checkpoint (the
//! node stops it with grace and reports it evicted, so the head requeues it
//! without using a retry): the youngest has lost the least work and is the most
//! likely to be the one whose growth tipped the GPU over.
//!
//! Pure: samples in, decisions out, so that it is tested without a GPU. The
//! telemetry sampler calls it on every sample (`Sampler::sample_and_evict`)
//! with the live workers whose launch said they oversubscribe, and hands its
//! choices to the agent as [`Eviction`]s; the node's core (`node_core`) stops
//! each through its checkpoint unless it is already stopping.
//!
//! GPU memory comes from NVML, or, on machines without it (tests, stand-in
//! GPUs), from a file named by `--gpu-memory-file`: one line per GPU,
//! `INDEX USED_BYTES TOTAL_BYTES`, blank lines and `#` comments ignored, read
//! with a bound ([`MAX_MEMORY_FILE_BYTES`], at most [`MAX_MEMORY_FILE_GPUS`]
//! lines) and refused whole with a [`MemoryFileError`] naming the line when
//! anything is off, so a bad file evicts nobody.

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::WorkerKey;

use crate::gpu::GpuMemory;

/// The default share of a GPU's memory at which eviction starts, in
/// thousandths: 95%, leaving room for the evicted worker's checkpoint.
pub(crate) const DEFAULT_THRESHOLD_MILLI: u32 = 950;

/// A live worker that may be evicted: it opted in to oversubscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Oversubscribed {
    /// The worker.
    pub key: WorkerKey,
    /// The device indices it uses.
    pub gpus: Vec<u32>,
    /// When it started; the latest start is the youngest.
    pub started_at: UnixMillis,
}

/// One worker to evict, and the GPU memory that chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Eviction {
    /// The worker.
    pub key: WorkerKey,
    /// The GPU over the threshold, as sampled.
    pub gpu: GpuMemory,
}

impl Eviction {
    /// The GPU's memory in use, in percent, for logs and reasons.
    pub(crate) fn percent(&self) -> f64 {
        if self.gpu.total_bytes == 0 {
            return 0.0;
        }
        self.gpu.used_bytes as f64 * 100.0 / self.gpu.total_bytes as f64
    }
}

/// The largest `--gpu-memory-file` read; more is refused.
pub(crate) const MAX_MEMORY_FILE_BYTES: u64 = 64 * 1024;
/// The most GPUs a `--gpu-memory-file` may list.
pub(crate) const MAX_MEMORY_FILE_GPUS: usize = 256;

/// A `--gpu-memory-file` that cannot be used; no eviction follows from it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MemoryFileError {
    /// The file cannot be read.
    #[error("cannot read the GPU memory file")]
    Read(#[source] std::io::Error),
    /// The file is longer than [`MAX_MEMORY_FILE_BYTES`].
    #[error("the GPU memory file is longer than {MAX_MEMORY_FILE_BYTES} bytes")]
    TooLarge,
    /// The file is not text.
    #[error("the GPU memory file is not UTF-8 text")]
    NotText,
    /// The path is not a regular file (a FIFO would block the sampler).
    #[error("the GPU memory file is not a regular file")]
    NotAFile,
    /// It lists more than [`MAX_MEMORY_FILE_GPUS`] GPUs.
    #[error("the GPU memory file lists more than {MAX_MEMORY_FILE_GPUS} GPUs")]
    TooManyGpus,
    /// A line is not `INDEX USED_BYTES TOTAL_BYTES` with used at most total.
    #[error("line {line} of the GPU memory file: {reason} (want `INDEX USED_BYTES TOTAL_BYTES`)")]
    Line {
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// Reads a `--gpu-memory-file` (bounded) and parses it.
pub(crate) fn read_memory_file(path: &Path) -> Result<Vec<GpuMemory>, MemoryFileError> {
    // Non-blocking, as `objects::local` opens lane files: opening a FIFO for
    // reading would block until a writer came. A regular file reads as usual.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(MemoryFileError::Read)?;
    if !file.metadata().map_err(MemoryFileError::Read)?.is_file() {
        return Err(MemoryFileError::NotAFile);
    }
    let mut bytes = Vec::new();
    file.take(MAX_MEMORY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(MemoryFileError::Read)?;
    if bytes.len() as u64 > MAX_MEMORY_FILE_BYTES {
        return Err(MemoryFileError::TooLarge);
    }
    let text = String::from_utf8(bytes).map_err(|_| MemoryFileError::NotText)?;
    parse_memory_file(&text)
}

/// Parses the lines of a `--gpu-memory-file`: `INDEX USED_BYTES TOTAL_BYTES`
/// per GPU, each index once, used at most total; blank lines and `#`
/// comments are skipped.
pub(crate) fn parse_memory_file(text: &str) -> Result<Vec<GpuMemory>, MemoryFileError> {
    let mut gpus: Vec<GpuMemory> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let refuse = |reason: String| MemoryFileError::Line {
            line: number + 1,
            reason,
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [index, used, total] = fields[..] else {
            return Err(refuse(format!("{} fields, not 3", fields.len())));
        };
        let index: u32 = index
            .parse()
            .map_err(|_| refuse(format!("GPU index {index:?} is not a whole number")))?;
        let used: u64 = used
            .parse()
            .map_err(|_| refuse(format!("used bytes {used:?} is not a whole number")))?;
        let total: u64 = total
            .parse()
            .map_err(|_| refuse(format!("total bytes {total:?} is not a whole number")))?;
        if used > total {
            return Err(refuse(format!("{used} bytes used of {total}")));
        }
        if gpus.iter().any(|gpu| gpu.index == index) {
            return Err(refuse(format!("GPU {index} listed twice")));
        }
        if gpus.len() >= MAX_MEMORY_FILE_GPUS {
            return Err(MemoryFileError::TooManyGpus);
        }
        gpus.push(GpuMemory {
            index,
            used_bytes: used,
            total_bytes: total,
        });
    }
    Ok(gpus)
}

/// The workers to evict now, at most one per GPU over the threshold: on each
/// GPU whose memory in use is at least `threshold_milli` thousandths of its
/// memory, the youngest oversubscribed worker on it that is not already being
/// evicted (`evicting`). Youngest is the latest start; equal starts go to the
/// largest key, so the choice is the same on every run. A worker chosen for one
/// GPU is not chosen again for another. A GPU with no such worker is left
/// alone: workers that did not opt in are never evicted for memory.
pub(crate) fn choose_evictions(
    gpus: &[GpuMemory],
    workers: &[Oversubscribed],
    evicting: &BTreeSet<WorkerKey>,
    threshold_milli: u32,
) -> Vec<Eviction> {
    let mut chosen: Vec<Eviction> = Vec::new();
    for gpu in gpus {
        if gpu.total_bytes == 0 {
            continue;
        }
        // used / total >= threshold / 1000, in integers.
        let over = u128::from(gpu.used_bytes) * 1000
            >= u128::from(gpu.total_bytes) * u128::from(threshold_milli);
        if !over {
            continue;
        }
        // A GPU already giving back memory through an eviction waits for it.
        let relieving = workers
            .iter()
            .any(|worker| worker.gpus.contains(&gpu.index) && evicting.contains(&worker.key));
        if relieving {
            continue;
        }
        let youngest = workers
            .iter()
            .filter(|worker| worker.gpus.contains(&gpu.index))
            .filter(|worker| !chosen.iter().any(|eviction| eviction.key == worker.key))
            .max_by_key(|worker| (worker.started_at, worker.key));
        if let Some(worker) = youngest {
            chosen.push(Eviction {
                key: worker.key,
                gpu: *gpu,
            });
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::{ExperimentId, TrialId};

    use super::*;

    const GIB: u64 = 1 << 30;

    /// The chosen workers' keys, in order.
    fn choose(
        gpus: &[GpuMemory],
        workers: &[Oversubscribed],
        evicting: &BTreeSet<WorkerKey>,
        threshold_milli: u32,
    ) -> Vec<WorkerKey> {
        choose_evictions(gpus, workers, evicting, threshold_milli)
            .iter()
            .map(|eviction| eviction.key)
            .collect()
    }

    fn key(index: u32) -> WorkerKey {
        WorkerKey {
            trial: TrialId {
                experiment: ExperimentId { digest: 1, run: 1 },
                index,
            },
            attempt: 1,
            rank: 0,
        }
    }

    fn worker(index: u32, gpus: &[u32], started: u64) -> Oversubscribed {
        Oversubscribed {
            key: key(index),
            gpus: gpus.to_vec(),
            started_at: started,
        }
    }

    fn gpu(index: u32, used_gib: u64) -> GpuMemory {
        GpuMemory {
            index,
            used_bytes: used_gib * GIB,
            total_bytes: 80 * GIB,
        }
    }

    #[test]
    fn the_youngest_on_a_full_gpu_goes() {
        let workers = [
            worker(1, &[0], 100),
            worker(2, &[0], 300),
            worker(3, &[0], 200),
        ];
        let chosen = choose(&[gpu(0, 78)], &workers, &BTreeSet::new(), 950);
        assert_eq!(chosen, vec![key(2)]);
    }

    #[test]
    fn below_the_threshold_nobody_goes() {
        let workers = [worker(1, &[0], 100), worker(2, &[0], 300)];
        // 75 GiB of 80 is 93.75%, under 95%.
        assert!(choose(&[gpu(0, 75)], &workers, &BTreeSet::new(), 950).is_empty());
        // Exactly at the threshold counts: 76 of 80 is 95%.
        assert_eq!(
            choose(&[gpu(0, 76)], &workers, &BTreeSet::new(), 950),
            vec![key(2)]
        );
    }

    #[test]
    fn only_oversubscribed_workers_on_that_gpu_are_candidates() {
        // Worker 2 is on another GPU; the full GPU 1 holds only worker 1.
        let workers = [worker(1, &[1], 100), worker(2, &[0], 900)];
        assert_eq!(
            choose(&[gpu(0, 10), gpu(1, 79)], &workers, &BTreeSet::new(), 950),
            vec![key(1)]
        );
        // A full GPU with no oversubscribed worker is left alone.
        assert!(choose(&[gpu(2, 80)], &workers, &BTreeSet::new(), 950).is_empty());
    }

    #[test]
    fn a_gpu_already_relieved_waits_and_nobody_is_chosen_twice() {
        let workers = [worker(1, &[0], 100), worker(2, &[0], 300)];
        let evicting = BTreeSet::from([key(2)]);
        assert!(choose(&[gpu(0, 79)], &workers, &evicting, 950).is_empty());
        // One worker spanning two full GPUs is chosen once; the other GPU
        // then takes its next youngest.
        let workers = [worker(1, &[0, 1], 300), worker(2, &[1], 100)];
        assert_eq!(
            choose(&[gpu(0, 79), gpu(1, 79)], &workers, &BTreeSet::new(), 950),
            vec![key(1), key(2)]
        );
    }

    #[test]
    fn equal_starts_break_by_key_and_unknown_memory_never_evicts() {
        let workers = [worker(1, &[0], 100), worker(2, &[0], 100)];
        assert_eq!(
            choose(&[gpu(0, 80)], &workers, &BTreeSet::new(), 950),
            vec![key(2)]
        );
        let unknown = GpuMemory {
            index: 0,
            used_bytes: 80 * GIB,
            total_bytes: 0,
        };
        assert!(choose(&[unknown], &workers, &BTreeSet::new(), 950).is_empty());
    }

    #[test]
    fn an_eviction_names_the_gpu_that_chose_it() {
        let workers = [worker(1, &[0], 100), worker(2, &[1], 300)];
        let chosen = choose_evictions(&[gpu(0, 10), gpu(1, 78)], &workers, &BTreeSet::new(), 950);
        assert_eq!(chosen.len(), 1);
        assert_eq!(chosen[0].key, key(2));
        assert_eq!(chosen[0].gpu, gpu(1, 78));
        assert!((chosen[0].percent() - 97.5).abs() < 1e-9);
    }

    #[test]
    fn memory_files_parse_or_are_refused_naming_the_line() {
        let gpus = parse_memory_file("# index used total\n0 97 100\n\n 1 0 80 # idle\n").unwrap();
        assert_eq!(
            gpus,
            vec![
                GpuMemory {
                    index: 0,
                    used_bytes: 97,
                    total_bytes: 100
                },
                GpuMemory {
                    index: 1,
                    used_bytes: 0,
                    total_bytes: 80
                },
            ]
        );
        assert!(parse_memory_file("").unwrap().is_empty());
        for (text, fragment) in [
            ("0 97\n", "line 1 of the GPU memory file: 2 fields, not 3"),
            (
                "0 1 2\nx 1 2\n",
                "line 2 of the GPU memory file: GPU index \"x\"",
            ),
            ("0 -1 2\n", "used bytes \"-1\""),
            ("0 1 99999999999999999999999\n", "total bytes"),
            ("0 3 2\n", "3 bytes used of 2"),
            ("0 1 2\n0 1 2\n", "GPU 0 listed twice"),
            ("0 1 2 3\n", "4 fields, not 3"),
        ] {
            let error = parse_memory_file(text).unwrap_err().to_string();
            assert!(error.contains(fragment), "{text:?}: {error}");
        }
        let many: String = (0..=MAX_MEMORY_FILE_GPUS)
            .map(|index| format!("{index} 0 1\n"))
            .collect();
        assert!(matches!(
            parse_memory_file(&many),
            Err(MemoryFileError::TooManyGpus)
        ));
    }

    #[test]
    fn memory_files_are_read_with_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        std::fs::write(&path, "0 5 10\n").unwrap();
        assert_eq!(read_memory_file(&path).unwrap().len(), 1);
        std::fs::write(&path, " ".repeat(MAX_MEMORY_FILE_BYTES as usize + 1)).unwrap();
        assert!(matches!(
            read_memory_file(&path),
            Err(MemoryFileError::TooLarge)
        ));
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            read_memory_file(&path),
            Err(MemoryFileError::NotText)
        ));
        assert!(matches!(
            read_memory_file(&dir.path().join("absent")),
            Err(MemoryFileError::Read(_))
        ));
        // A FIFO with no writer would block the sampler forever if opened.
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(matches!(
            read_memory_file(&fifo),
            Err(MemoryFileError::NotAFile)
        ));
        assert!(matches!(
            read_memory_file(dir.path()),
            Err(MemoryFileError::NotAFile)
        ));
    }
}
