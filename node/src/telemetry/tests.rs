//! The sampler on real processes: a busy process group shows CPU use and
//! resident memory; a worker that is gone is forgotten.

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
