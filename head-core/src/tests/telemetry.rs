//! Tests of telemetry in the core: only live workers a node hosts are kept,
//! garbage values are dropped, windows become records, and node GPU figures
//! reach `xp nodes` and the `/metrics` snapshot.

use xp_runtime::protocol::{GpuSample, NodeTelemetry, StoreUsage, WorkerSample};

use super::*;
use crate::TelemetryRecord;

fn sample(key: WorkerKey, cpu: f64) -> WorkerSample {
    WorkerSample {
        key,
        cpu_cores: Some(cpu),
        rss_bytes: Some(1 << 30),
        gpu_util: None,
        gpu_mem_bytes: None,
        gpu_power_w: Some(f64::NAN),
    }
}

fn telemetry_records(core: &mut HeadCore) -> Vec<TelemetryRecord> {
    core.take_records()
        .into_iter()
        .filter_map(|record| match record {
            Record::Telemetry(record) => Some(record),
            _ => None,
        })
        .collect()
}

/// A node's telemetry with `workers`: GPU 0 at 87% and 250 W, GPU 1 at an
/// infinite utilisation, and its store's usage.
fn telemetry(workers: Vec<WorkerSample>) -> NodeTelemetry {
    NodeTelemetry {
        at: 0,
        workers,
        gpus: vec![
            GpuSample {
                index: 0,
                util: 87.0,
                memory_used_bytes: 5 << 30,
                power_w: Some(250.0),
            },
            GpuSample {
                index: 1,
                util: f64::INFINITY,
                memory_used_bytes: 0,
                power_w: None,
            },
        ],
        store: StoreUsage {
            memory_bytes: 10,
            disk_bytes: 20,
        },
    }
}

/// Checks that the one window recorded holds the host's sample of slot 0,
/// without the NaN power.
fn check_one_window_of_the_host(core: &mut HeadCore) {
    let records = telemetry_records(core);
    assert_eq!(records.len(), 1, "{records:?}");
    let window = records[0].window.as_ref().unwrap();
    assert_eq!((records[0].slot, window.samples), (0, 1));
    assert_eq!(window.cpu_cores.unwrap().mean(), 1.5);
    assert!(window.gpu_power_w.is_none(), "NaN is dropped, not kept");
}

/// Checks that the GPU figures of `host` reach `xp nodes` (when it is `node`,
/// the one with GPUs) and the `/metrics` snapshot.
fn check_gpus_reach_the_views(core: &HeadCore, node: NodeId, host: NodeId) {
    let gpus = core.node_gpu_telemetry(host);
    if host == node {
        assert_eq!(gpus.len(), 1, "the infinite utilisation is dropped");
        assert_eq!(gpus[0].util, 87.0);
    }
    let snapshot = core.metrics_snapshot();
    let label = host.to_string();
    assert_eq!(
        snapshot.store_bytes.get(&(label.clone(), "disk")),
        Some(&20)
    );
    assert_eq!(
        snapshot
            .gpus_in_use
            .get(&(node.to_string(), "declared".to_owned())),
        Some(&1)
    );
}

#[test]
fn live_workers_samples_become_windows_and_gpus_reach_the_views() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (node, other) = (node_id(1), node_id(2));
    core.handle_node_register(0, registration(node, 2, 2, Vec::new()));
    core.handle_node_register(0, registration(other, 0, 2, Vec::new()));
    let _ = submit(&mut core, 1, ONE, false);
    let placed = launches(&commands(&mut core));
    let (host, key) = placed[0];
    let stranger = if host == node { other } else { node };
    report(&mut core, 2, host, WorkerReport::Started { key, pid: 7 });
    let _ = core.take_records();

    assert_eq!(
        core.telemetry_series_needed(host, &telemetry(vec![sample(key, 1.0)])),
        vec![(key.trial, key.rank)]
    );
    assert!(
        core.telemetry_series_needed(stranger, &telemetry(vec![sample(key, 1.0)]))
            .is_empty(),
        "a node that does not host the worker speaks for nothing"
    );
    core.restore_telemetry_series(key.trial, key.rank, Vec::new());
    let from_host = telemetry(vec![sample(key, 1.5)]);
    core.handle_node_message(10, host, NodeMessage::Telemetry(from_host));
    let from_stranger = telemetry(vec![sample(key, 9.0)]);
    core.handle_node_message(11, stranger, NodeMessage::Telemetry(from_stranger));
    check_one_window_of_the_host(&mut core);
    check_gpus_reach_the_views(&core, node, host);

    // Once the worker has exited its node's samples of it are ignored.
    exited(&mut core, 12, host, key, 0);
    let _ = core.take_records();
    let after_exit = telemetry(vec![sample(key, 2.0)]);
    core.handle_node_message(13, host, NodeMessage::Telemetry(after_exit));
    assert!(telemetry_records(&mut core).is_empty());
}
