//! The sampler on real processes: a busy process group shows CPU use and
//! resident memory; a worker that is gone is forgotten. The eviction watch on
//! a real `--gpu-memory-file`.

use std::os::unix::process::CommandExt;

use xp_runtime::ids::{ExperimentId, TrialId};

use super::*;

fn key(index: u32) -> WorkerKey {
    WorkerKey {
        trial: TrialId {
            experiment: ExperimentId { digest: 9, run: 1 },
            index,
        },
        attempt: 1,
        rank: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_process_group_shows_cpu_and_memory() {
    // A shell that spins in a child of its own process group: the group counts.
    let mut child = std::process::Command::new("sh")
        .args(["-c", "sh -c 'while :; do :; done' & wait"])
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id();
    let targets = Targets::default();
    let guard = targets.register(
        key(0),
        Target {
            pid,
            cgroup: None,
            gpu_indices: vec![0],
            oversubscribed: false,
            started_at: 0,
        },
    );
    let mut sampler = Sampler::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut first = true;
    let sample = loop {
        let telemetry = sampler.sample(
            tokio::time::Instant::now(),
            0,
            &targets.snapshot(),
            StoreUsage::default(),
        );
        assert_eq!(telemetry.workers.len(), 1);
        let sample = telemetry.workers[0].clone();
        if first {
            assert_eq!(sample.cpu_cores, None, "no rate from one sample");
            first = false;
        } else if sample.cpu_cores.is_some_and(|cores| cores > 0.1) {
            break sample;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no CPU use seen: {sample:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(sample.rss_bytes.unwrap() > 0, "{sample:?}");
    assert!(sample.cpu_cores.unwrap() < 64.0, "{sample:?}");
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
    drop(guard);
    assert!(targets.snapshot().is_empty());
    let telemetry = sampler.sample(
        tokio::time::Instant::now(),
        0,
        &targets.snapshot(),
        StoreUsage::default(),
    );
    assert!(telemetry.workers.is_empty());
    assert!(
        sampler.last_cpu.is_empty(),
        "a worker that is gone is forgotten"
    );
}

#[test]
fn intervals_are_bounded() {
    assert!(check_interval(Duration::ZERO).is_ok());
    assert!(check_interval(Duration::from_secs(1)).is_ok());
    assert!(check_interval(Duration::from_millis(1)).is_err());
    assert!(check_interval(Duration::from_secs(7200)).is_err());
}

/// A live worker on GPU 0 that started at `started_at` (its process is this
/// test's own, only there to be sampled).
fn on_gpu_zero(index: u32, oversubscribed: bool, started_at: u64) -> (WorkerKey, Target) {
    (
        key(index),
        Target {
            pid: std::process::id(),
            cgroup: None,
            gpu_indices: vec![0],
            oversubscribed,
            started_at,
        },
    )
}

#[test]
fn the_eviction_watch_reads_the_memory_file_and_evicts_the_youngest_oversubscribed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpu-memory");
    let mut sampler = Sampler::new().with_memory_file(Some(file.clone()));
    let mut evict = |targets: &[(WorkerKey, Target)]| -> Vec<WorkerKey> {
        sampler
            .sample_and_evict(
                tokio::time::Instant::now(),
                0,
                targets,
                StoreUsage::default(),
            )
            .1
            .iter()
            .map(|eviction| eviction.key)
            .collect()
    };
    // Worker 3 is the youngest of all but did not opt in: never a candidate.
    let mut targets = vec![
        on_gpu_zero(1, true, 100),
        on_gpu_zero(2, true, 200),
        on_gpu_zero(3, false, 300),
    ];
    // No file yet, then a malformed one: said, and nobody is evicted.
    assert!(evict(&targets).is_empty());
    std::fs::write(&file, "0 99 100 extra\n").unwrap();
    assert!(evict(&targets).is_empty());
    std::fs::write(&file, "0 50 100\n").unwrap();
    assert!(evict(&targets).is_empty(), "50% is below the threshold");
    std::fs::write(&file, "0 97 100\n").unwrap();
    assert_eq!(evict(&targets), vec![key(2)]);
    // While worker 2 stops, the GPU waits for it.
    assert!(evict(&targets).is_empty());
    // Gone, with the same figure: no news, nobody more.
    targets.retain(|(key, _)| *key != self::key(2));
    assert!(evict(&targets).is_empty());
    // A new figure over the threshold takes the next youngest opted-in worker.
    std::fs::write(&file, "0 98 100\n").unwrap();
    assert_eq!(evict(&targets), vec![key(1)]);
    // With only a worker that did not opt in, even 99% evicts nobody.
    targets.retain(|(key, _)| *key == self::key(3));
    std::fs::write(&file, "0 99 100\n").unwrap();
    assert!(evict(&targets).is_empty());
}
