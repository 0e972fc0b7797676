//! Unit and property tests of the node pool and gang placement.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::{
    ProptestConfig, any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest,
};
use proptest::strategy::Strategy as _;

use super::*;
use crate::GpuShare;

const GIB: u64 = 1 << 30;

fn node_id(seed: u8) -> NodeId {
    NodeId(uuid::Uuid::from_bytes([seed; 16]))
}

fn spec(seed: u8, gpus: u32, rack: &str) -> NodeSpec {
    NodeSpec {
        id: node_id(seed),
        gpus,
        gpu_model: Some("A100".to_string()),
        cpu_milli: 64_000,
        memory_bytes: 512 * GIB,
        labels: BTreeMap::from([("rack".to_string(), rack.to_string())]),
    }
}

fn gang(workers: u32, gpu_milli: u64) -> GangShape {
    GangShape {
        workers,
        per_worker: Amount {
            gpu_milli,
            cpu_milli: 1000,
            memory_bytes: GIB,
        },
        gpu_models: Vec::new(),
        node_labels: BTreeMap::new(),
        spread: false,
        leases: Default::default(),
        oversubscribe: false,
    }
}

fn pool_of(specs: Vec<NodeSpec>) -> NodePool {
    let mut pool = NodePool::new();
    for spec in specs {
        pool.upsert_node(spec);
    }
    pool.check_indexes();
    pool
}

fn must_place(pool: &mut NodePool, gang: &GangShape, strategy: Strategy) -> Vec<WorkerPlacement> {
    let placement = pool.find(gang, strategy).expect("the gang fits");
    assert_eq!(placement.len(), gang.workers as usize);
    pool.allocate(&placement)
        .expect("a placement from find allocates");
    pool.check_indexes();
    placement
}

fn worker(node: u8, gpus: &[(u32, u32)], cpu_milli: u64) -> WorkerPlacement {
    WorkerPlacement {
        node: node_id(node),
        gpus: gpus
            .iter()
            .map(|(index, milli)| GpuShare {
                index: *index,
                milli: *milli,
            })
            .collect(),
        cpu_milli,
        memory_bytes: GIB,
    }
}

fn nodes_used(placement: &[WorkerPlacement]) -> BTreeSet<NodeId> {
    placement.iter().map(|worker| worker.node).collect()
}

/// Places one worker of `gpu_milli` and says where its GPU share went.
fn check_share(pool: &mut NodePool, gpu_milli: u64, strategy: Strategy, expected: (u8, u32)) {
    let placement = must_place(pool, &gang(1, gpu_milli), strategy);
    assert_eq!(placement[0].node, node_id(expected.0));
    assert_eq!(placement[0].gpus[0].index, expected.1);
}

#[test]
fn fractional_workers_pack_onto_one_shared_gpu() {
    let mut pool = pool_of(vec![spec(1, 2, "r1")]);
    for _ in 0..4 {
        check_share(&mut pool, 250, Strategy::BinPack, (1, 0));
    }
    assert_eq!(pool.node_gpu_used(node_id(1)).unwrap(), &[1000, 0]);

    let mut pool = pool_of(vec![spec(1, 2, "r1")]);
    let placement = must_place(&mut pool, &gang(4, 250), Strategy::BinPack);
    let gpus: BTreeSet<u32> = placement
        .iter()
        .map(|worker| worker.gpus[0].index)
        .collect();
    assert_eq!(gpus, BTreeSet::from([0]));
}

#[test]
fn a_fraction_goes_to_a_shared_gpu_first_and_never_to_one_held_whole() {
    let mut pool = pool_of(vec![spec(1, 2, "r1")]);
    check_share(&mut pool, 1000, Strategy::BinPack, (1, 0));
    check_share(&mut pool, 500, Strategy::BinPack, (1, 1));
    check_share(&mut pool, 500, Strategy::BinPack, (1, 1));
    assert_eq!(pool.find(&gang(1, 500), Strategy::BinPack), None);
    assert_eq!(pool.find(&gang(1, 1), Strategy::FragmentationAware), None);

    // A partly used GPU takes the fraction before a free one, with every strategy.
    for strategy in [
        Strategy::BinPack,
        Strategy::Spread,
        Strategy::Random { seed: 7 },
        Strategy::FragmentationAware,
    ] {
        let mut pool = pool_of(vec![spec(1, 2, "r1")]);
        pool.allocate(&[worker(1, &[(1, 250)], 0)]).unwrap();
        check_share(&mut pool, 500, strategy, (1, 1));
    }
}

#[test]
fn a_fraction_takes_the_tightest_shared_gpu_across_nodes() {
    let mut pool = pool_of(vec![spec(1, 1, "r1"), spec(2, 1, "r1"), spec(3, 1, "r1")]);
    pool.allocate(&[worker(1, &[(0, 500)], 0), worker(2, &[(0, 750)], 0)])
        .unwrap();
    check_share(&mut pool, 250, Strategy::BinPack, (2, 0));
    check_share(&mut pool, 250, Strategy::BinPack, (1, 0));
    check_share(&mut pool, 400, Strategy::BinPack, (3, 0));
}

#[test]
fn a_gang_prefers_one_node_then_one_rack() {
    // One node holds the whole gang.
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 4, "r2"), spec(3, 4, "r2")]);
    let placement = must_place(&mut pool, &gang(2, 4000), Strategy::BinPack);
    assert_eq!(nodes_used(&placement), BTreeSet::from([node_id(1)]));
    // No node holds it now, but rack r2 does.
    let placement = must_place(&mut pool, &gang(2, 4000), Strategy::BinPack);
    assert_eq!(
        nodes_used(&placement),
        BTreeSet::from([node_id(2), node_id(3)])
    );

    // Only across racks.
    let mut pool = pool_of(vec![spec(1, 4, "r1"), spec(2, 4, "r2")]);
    let placement = must_place(&mut pool, &gang(2, 4000), Strategy::FragmentationAware);
    assert_eq!(nodes_used(&placement).len(), 2);

    // The fewest nodes within the rack: the 8-GPU node and two 2-GPU nodes.
    let mut pool = pool_of(vec![
        spec(1, 2, "r1"),
        spec(2, 8, "r1"),
        spec(3, 2, "r1"),
        spec(4, 2, "r1"),
        spec(5, 8, "r2"),
    ]);
    pool.allocate(&[worker(5, &[(0, 1000)], 0)]).unwrap();
    let placement = must_place(&mut pool, &gang(6, 2000), Strategy::BinPack);
    let used = nodes_used(&placement);
    assert_eq!(used.len(), 3);
    assert!(used.contains(&node_id(2)));
    assert!(!used.contains(&node_id(5)));
}

#[test]
fn bin_pack_takes_the_fullest_node_and_spread_the_emptiest() {
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
    pool.allocate(&[worker(2, &[(0, 1000), (1, 1000), (2, 1000)], 0)])
        .unwrap();
    let one_gpu = gang(1, 1000);
    assert_eq!(
        pool.find(&one_gpu, Strategy::BinPack).unwrap()[0].node,
        node_id(2)
    );
    assert_eq!(
        pool.find(&one_gpu, Strategy::Spread).unwrap()[0].node,
        node_id(1)
    );
    // Among nodes with as many free GPUs, the one with less free CPU.
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
    pool.allocate(&[worker(1, &[], 8000)]).unwrap();
    assert_eq!(
        pool.find(&one_gpu, Strategy::BinPack).unwrap()[0].node,
        node_id(1)
    );
    assert_eq!(
        pool.find(&one_gpu, Strategy::Spread).unwrap()[0].node,
        node_id(2)
    );
}

#[test]
fn cpu_only_workers_keep_off_nodes_with_free_gpus() {
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 0, "r1")]);
    let placement = must_place(&mut pool, &gang(1, 0), Strategy::BinPack);
    assert!(placement[0].gpus.is_empty());
    assert_eq!(placement[0].node, node_id(2));
}

#[test]
fn spread_puts_workers_on_different_nodes() {
    let specs = || (1..=4).map(|seed| spec(seed, 8, "r1")).collect::<Vec<_>>();
    let mut spread_gang = gang(3, 1000);
    spread_gang.spread = true;
    let mut pool = pool_of(specs());
    assert_eq!(
        nodes_used(&must_place(&mut pool, &spread_gang, Strategy::BinPack)).len(),
        3
    );
    let mut pool = pool_of(specs());
    assert_eq!(
        nodes_used(&must_place(&mut pool, &gang(3, 1000), Strategy::Spread)).len(),
        3
    );
    let mut pool = pool_of(specs());
    assert_eq!(
        nodes_used(&must_place(&mut pool, &gang(3, 1000), Strategy::BinPack)).len(),
        1
    );

    // More workers than nodes: dealt round the nodes.
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
    let placement = must_place(&mut pool, &gang(4, 1000), Strategy::Spread);
    let on_first = placement
        .iter()
        .filter(|worker| worker.node == node_id(1))
        .count();
    assert_eq!(on_first, 2);

    // One rack with enough nodes is preferred.
    let mut pool = pool_of(vec![
        spec(1, 8, "r1"),
        spec(2, 8, "r1"),
        spec(3, 4, "r2"),
        spec(4, 4, "r2"),
        spec(5, 4, "r2"),
    ]);
    let placement = must_place(&mut pool, &gang(3, 1000), Strategy::Spread);
    assert_eq!(
        nodes_used(&placement),
        BTreeSet::from([node_id(3), node_id(4), node_id(5)])
    );
}

#[test]
fn labels_and_gpu_models_are_respected() {
    let mut specs = vec![spec(1, 8, "r1"), spec(2, 8, "r1"), spec(3, 8, "r2")];
    specs[1].gpu_model = Some("H100".to_string());
    specs[2].gpu_model = Some("H100".to_string());
    specs[2].labels.insert("zone".to_string(), "a".to_string());
    specs[0].labels.insert("zone".to_string(), "a".to_string());
    // Many unlabelled nodes make the search visit the labelled ones only.
    specs.extend((10..60).map(|seed| spec(seed, 8, "r3")));
    let mut pool = pool_of(specs);
    let mut constrained = gang(1, 1000);
    constrained.gpu_models = vec!["H100".to_string()];
    constrained.node_labels = BTreeMap::from([("zone".to_string(), "a".to_string())]);
    for strategy in [
        Strategy::BinPack,
        Strategy::Spread,
        Strategy::Random { seed: 1 },
        Strategy::FragmentationAware,
    ] {
        assert_eq!(
            pool.find(&constrained, strategy).unwrap()[0].node,
            node_id(3)
        );
    }
    let mut two = constrained.clone();
    two.workers = 2;
    two.per_worker.gpu_milli = 8000;
    assert_eq!(pool.find(&two, Strategy::BinPack), None);
    assert!(!pool.could_ever_fit(&two));

    let mut unknown_model = gang(1, 500);
    unknown_model.gpu_models = vec!["V100".to_string()];
    assert_eq!(pool.find(&unknown_model, Strategy::BinPack), None);
    assert!(!pool.could_ever_fit(&unknown_model));
    // A worker without GPUs does not care about GPU models.
    unknown_model.per_worker.gpu_milli = 0;
    assert!(pool.find(&unknown_model, Strategy::BinPack).is_some());

    let mut unknown_label = gang(1, 0);
    unknown_label.node_labels = BTreeMap::from([("zone".to_string(), "b".to_string())]);
    assert_eq!(pool.find(&unknown_label, Strategy::BinPack), None);
    assert!(!pool.could_ever_fit(&unknown_label));

    must_place(&mut pool, &constrained, Strategy::BinPack);
    pool.set_schedulable(node_id(3), false);
    assert_eq!(pool.find(&constrained, Strategy::BinPack), None);
}

#[test]
fn nodes_that_are_not_schedulable_get_nothing() {
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 2, "r1")]);
    let held = must_place(&mut pool, &gang(1, 4000), Strategy::BinPack);
    assert_eq!(held[0].node, node_id(1));
    pool.set_schedulable(node_id(1), false);
    pool.check_indexes();
    assert_eq!(pool.is_schedulable(node_id(1)), Some(false));
    assert_eq!(pool.capacity().gpu_milli, 2000);
    assert_eq!(pool.free().gpu_milli, 2000);
    assert_eq!(pool.find(&gang(1, 4000), Strategy::BinPack), None);
    assert!(!pool.could_ever_fit(&gang(1, 4000)));
    assert_eq!(
        pool.allocate(&[worker(1, &[(7, 1000)], 0)]),
        Err(PlaceError::NotSchedulable { node: node_id(1) })
    );
    // A draining node still gives back what it held.
    pool.release(&held);
    assert_eq!(pool.node_free(node_id(1)).unwrap().gpu_milli, 8000);
    pool.set_schedulable(node_id(1), true);
    pool.check_indexes();
    assert_eq!(
        pool.find(&gang(1, 8000), Strategy::BinPack).unwrap()[0].node,
        node_id(1)
    );
}

#[test]
fn allocate_is_all_or_nothing() {
    let mut small = spec(1, 2, "r1");
    small.cpu_milli = 4000;
    small.memory_bytes = 4 * GIB;
    let mut pool = pool_of(vec![small]);
    let free = pool.free();
    let node = node_id(1);
    let cases = [
        (
            vec![worker(1, &[(0, 1000)], 1000), worker(1, &[], 3500)],
            PlaceError::CpuOverCapacity {
                node,
                requested: 4500,
                free: 4000,
            },
        ),
        (
            vec![worker(1, &[(1, 600)], 0), worker(1, &[(1, 600)], 0)],
            PlaceError::GpuOverCapacity {
                node,
                index: 1,
                requested: 1200,
                free: 1000,
            },
        ),
        (
            vec![worker(1, &[(0, 500)], 0), worker(9, &[], 0)],
            PlaceError::UnknownNode { node: node_id(9) },
        ),
        (
            vec![worker(1, &[(2, 500)], 0)],
            PlaceError::GpuIndexOutOfRange {
                node,
                index: 2,
                gpus: 2,
            },
        ),
        (
            vec![worker(1, &[(0, 0)], 0)],
            PlaceError::InvalidGpuShare {
                node,
                index: 0,
                milli: 0,
            },
        ),
        (
            vec![worker(1, &[(0, 1001)], 0)],
            PlaceError::InvalidGpuShare {
                node,
                index: 0,
                milli: 1001,
            },
        ),
        (
            (0..5).map(|_| worker(1, &[], 0)).collect(),
            PlaceError::MemoryOverCapacity {
                node,
                requested: 5 * GIB,
                free: 4 * GIB,
            },
        ),
    ];
    for (workers, expected) in cases {
        assert_eq!(pool.allocate(&workers), Err(expected));
        assert_eq!(pool.free(), free, "a refused allocation holds nothing");
        assert_eq!(pool.node_gpu_used(node).unwrap(), &[0, 0]);
    }
    pool.allocate(&[worker(1, &[(1, 400)], 0)]).unwrap();
    assert_eq!(
        pool.allocate(&[worker(1, &[(1, 1000)], 0)]),
        Err(PlaceError::GpuOverCapacity {
            node,
            index: 1,
            requested: 1000,
            free: 600
        })
    );
    pool.check_indexes();
}

#[test]
fn find_with_freed_finds_room_that_only_freeing_makes() {
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 3, "r1")]);
    let victim = must_place(&mut pool, &gang(1, 8000), Strategy::BinPack);
    let other = must_place(&mut pool, &gang(1, 2000), Strategy::BinPack);
    assert_eq!(other[0].node, node_id(2));
    let big = gang(1, 4000);
    assert_eq!(pool.find(&big, Strategy::BinPack), None);
    let free = pool.free();
    let found = pool
        .find_with_freed(&big, Strategy::BinPack, &[&victim])
        .expect("freeing the victim makes room");
    assert_eq!(found[0].node, node_id(1));
    assert_eq!(pool.free(), free, "a what-if changes nothing");
    pool.check_indexes();
    // Freeing the small one is not enough.
    assert_eq!(
        pool.find_with_freed(&big, Strategy::BinPack, &[&other]),
        None
    );
    // Both together: the gang of two fits.
    let pair = gang(2, 4000);
    assert!(
        pool.find_with_freed(&pair, Strategy::BinPack, &[&other])
            .is_none()
    );
    let found_pair = pool
        .find_with_freed(&pair, Strategy::FragmentationAware, &[&victim, &other])
        .unwrap();
    assert_eq!(nodes_used(&found_pair), BTreeSet::from([node_id(1)]));
    pool.release(&victim);
    pool.allocate(&found).unwrap();
    pool.check_indexes();
}

#[test]
fn could_ever_fit_ignores_what_is_held() {
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r2")]);
    assert!(!pool.could_ever_fit(&gang(1, 16000)));
    assert!(pool.could_ever_fit(&gang(2, 8000)));
    assert!(!pool.could_ever_fit(&gang(3, 8000)));
    assert!(pool.could_ever_fit(&gang(64, 250)));
    assert!(!pool.could_ever_fit(&gang(65, 250)));
    must_place(&mut pool, &gang(2, 8000), Strategy::BinPack);
    assert!(pool.could_ever_fit(&gang(2, 8000)));
    assert_eq!(pool.find(&gang(1, 250), Strategy::BinPack), None);
    assert!(!NodePool::new().could_ever_fit(&gang(1, 0)));
}

#[test]
fn odd_gpu_amounts_and_empty_gangs() {
    let pool = pool_of(vec![spec(1, 8, "r1")]);
    assert_eq!(pool.find(&gang(1, 1500), Strategy::BinPack), None);
    assert!(!pool.could_ever_fit(&gang(1, 1500)));
    assert_eq!(
        pool.find(&gang(0, 1000), Strategy::BinPack),
        Some(Vec::new())
    );
}

#[test]
fn random_is_deterministic_and_varies_with_the_seed() {
    let pool = pool_of((1..=10).map(|seed| spec(seed, 8, "r1")).collect());
    let one = gang(1, 1000);
    let chosen: BTreeSet<NodeId> = (0..40)
        .map(|seed| {
            let first = pool.find(&one, Strategy::Random { seed }).unwrap();
            assert_eq!(pool.find(&one, Strategy::Random { seed }).unwrap(), first);
            first[0].node
        })
        .collect();
    assert!(
        chosen.len() >= 4,
        "random picks spread over nodes: {chosen:?}"
    );
}

#[test]
fn fragmentation_aware_keeps_idle_capacity_usable() {
    // It does not break an idle node when a partly used one fits, and fills a
    // node exactly when it can.
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1"), spec(3, 8, "r1")]);
    pool.allocate(&[worker(
        2,
        &[(0, 1000), (1, 1000), (2, 1000), (3, 1000), (4, 1000)],
        0,
    )])
    .unwrap();
    pool.allocate(&[worker(
        3,
        &[
            (0, 1000),
            (1, 1000),
            (2, 1000),
            (3, 1000),
            (4, 1000),
            (5, 1000),
            (6, 1000),
        ],
        0,
    )])
    .unwrap();
    let one = gang(1, 1000);
    assert_eq!(
        pool.find(&one, Strategy::FragmentationAware).unwrap()[0].node,
        node_id(3)
    );
    assert_eq!(
        pool.find(&gang(1, 3000), Strategy::FragmentationAware)
            .unwrap()[0]
            .node,
        node_id(2)
    );

    // A fraction goes where a GPU is already shared.
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
    pool.allocate(&[worker(2, &[(3, 500)], 0)]).unwrap();
    let placement = pool
        .find(&gang(1, 500), Strategy::FragmentationAware)
        .unwrap();
    assert_eq!(
        (placement[0].node, placement[0].gpus[0].index),
        (node_id(2), 3)
    );

    // Fractions gather on the node that shares most GPUs, where bin-pack
    // takes the tightest shared GPU anywhere.
    let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
    pool.allocate(&[worker(1, &[(0, 700)], 0)]).unwrap();
    pool.allocate(&[worker(2, &[(0, 400), (1, 400), (2, 400)], 0)])
        .unwrap();
    check_share(&mut pool.clone(), 250, Strategy::BinPack, (1, 0));
    check_share(&mut pool, 250, Strategy::FragmentationAware, (2, 0));

    // Among equally full nodes, whole GPUs go where GPUs are shared, where
    // bin-pack takes the node with less free CPU.
    let mut pool = pool_of(vec![spec(1, 4, "r1"), spec(2, 5, "r1")]);
    pool.allocate(&[worker(1, &[(0, 1000)], 8000)]).unwrap();
    pool.allocate(&[worker(2, &[(0, 500), (1, 500)], 0)])
        .unwrap();
    assert_eq!(
        pool.find(&one, Strategy::BinPack).unwrap()[0].node,
        node_id(1)
    );
    assert_eq!(
        pool.find(&one, Strategy::FragmentationAware).unwrap()[0].node,
        node_id(2)
    );
}

#[test]
fn idle_gpu_fragmentation_counts_idle_room_on_shared_gpus() {
    let mut pool = pool_of(vec![spec(1, 2, "r1")]);
    assert_eq!(pool.idle_gpu_fragmentation(), 0.0);
    pool.allocate(&[worker(1, &[(0, 250)], 0)]).unwrap();
    assert!((pool.idle_gpu_fragmentation() - 750.0 / 1750.0).abs() < 1e-12);
    pool.allocate(&[worker(1, &[(0, 750), (1, 1000)], 0)])
        .unwrap();
    assert_eq!(pool.idle_gpu_fragmentation(), 0.0);
}

#[test]
fn upsert_keeps_allocations_and_remove_forgets_the_node() {
    let mut pool = pool_of(vec![spec(1, 4, "r1"), spec(2, 4, "r1"), spec(3, 4, "r2")]);
    pool.allocate(&[worker(1, &[(0, 1000), (3, 500)], 2000)])
        .unwrap();
    let mut bigger = spec(1, 4, "r2");
    bigger.cpu_milli = 128_000;
    pool.upsert_node(bigger);
    pool.check_indexes();
    assert_eq!(pool.node_gpu_used(node_id(1)).unwrap(), &[1000, 0, 0, 500]);
    assert_eq!(pool.node_free(node_id(1)).unwrap().cpu_milli, 126_000);
    // Fewer GPUs: what was held on the lost ones is forgotten.
    pool.upsert_node(spec(1, 2, "r2"));
    pool.check_indexes();
    assert_eq!(pool.node_gpu_used(node_id(1)).unwrap(), &[1000, 0]);
    assert_eq!(pool.node_count(), 3);
    assert!(pool.remove_node(node_id(1)));
    assert!(!pool.remove_node(node_id(1)));
    pool.check_indexes();
    assert_eq!(pool.node_count(), 2);
    assert_eq!(pool.capacity().gpu_milli, 8000);
    assert_eq!(pool.node_free(node_id(1)), None);
    let listed: BTreeSet<NodeId> = pool.nodes().map(|(spec, _)| spec.id).collect();
    assert_eq!(listed, BTreeSet::from([node_id(2), node_id(3)]));
    // Releasing on a removed node is ignored.
    pool.release(&[worker(1, &[(0, 1000)], 0)]);
    assert_eq!(pool.free(), pool.capacity());
}

// Property tests: random pools and random sequences of placements, what-ifs,
// releases and draining, checked against a brute-force count after every step.

#[derive(Debug, Clone)]
struct NodeGen {
    gpus: u32,
    cpu_cores: u64,
    memory_gib: u64,
    rack: u8,
    model: u8,
    zone: bool,
}

#[derive(Debug, Clone)]
struct GangGen {
    workers: u32,
    gpu_milli: u64,
    cpu_milli: u64,
    memory_gib: u64,
    strategy: u8,
    spread: bool,
    model: Option<u8>,
    zone: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Place(GangGen),
    WhatIf(GangGen, usize),
    Release(usize),
    Schedulable(usize, bool),
    Remove(usize),
}

fn node_gen() -> impl proptest::strategy::Strategy<Value = NodeGen> {
    (0u32..8, 1u64..33, 1u64..65, 0u8..3, 0u8..3, any::<bool>()).prop_map(
        |(gpus, cpu_cores, memory_gib, rack, model, zone)| NodeGen {
            gpus,
            cpu_cores,
            memory_gib,
            rack,
            model,
            zone,
        },
    )
}

fn gang_gen() -> impl proptest::strategy::Strategy<Value = GangGen> {
    (
        1u32..6,
        prop::sample::select(vec![0u64, 250, 470, 500, 1000, 2000, 3000, 4000, 1500]),
        0u64..9000,
        0u64..17,
        0u8..4,
        prop::bool::weighted(0.2),
        prop::option::weighted(0.2, 0u8..3),
        prop::bool::weighted(0.15),
    )
        .prop_map(
            |(workers, gpu_milli, cpu_milli, memory_gib, strategy, spread, model, zone)| GangGen {
                workers,
                gpu_milli,
                cpu_milli,
                memory_gib,
                strategy,
                spread,
                model,
                zone,
            },
        )
}

fn op_gen() -> impl proptest::strategy::Strategy<Value = Op> {
    prop_oneof![
        6 => gang_gen().prop_map(Op::Place),
        2 => (gang_gen(), any::<usize>()).prop_map(|(gang, victim)| Op::WhatIf(gang, victim)),
        3 => any::<usize>().prop_map(Op::Release),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(node, on)| Op::Schedulable(node, on)),
        1 => any::<usize>().prop_map(Op::Remove),
    ]
}

const MODELS: [&str; 2] = ["A100", "H100"];

fn build_pool(nodes: &[NodeGen]) -> NodePool {
    let mut pool = NodePool::new();
    for (seed, node) in nodes.iter().enumerate() {
        let mut labels = BTreeMap::from([("rack".to_string(), format!("r{}", node.rack))]);
        if node.zone {
            labels.insert("zone".to_string(), "a".to_string());
        }
        pool.upsert_node(NodeSpec {
            id: node_id(seed as u8 + 1),
            gpus: node.gpus,
            gpu_model: MODELS
                .get(usize::from(node.model))
                .map(|model| model.to_string()),
            cpu_milli: node.cpu_cores * 1000,
            memory_bytes: node.memory_gib * GIB,
            labels,
        });
    }
    pool
}

fn gang_of(generated: &GangGen) -> (GangShape, Strategy) {
    let gang = GangShape {
        workers: generated.workers,
        per_worker: Amount {
            gpu_milli: generated.gpu_milli,
            cpu_milli: generated.cpu_milli,
            memory_bytes: generated.memory_gib * GIB,
        },
        gpu_models: generated
            .model
            .map(|model| {
                MODELS
                    .get(usize::from(model))
                    .unwrap_or(&"V100")
                    .to_string()
            })
            .into_iter()
            .collect(),
        node_labels: if generated.zone {
            BTreeMap::from([("zone".to_string(), "a".to_string())])
        } else {
            BTreeMap::new()
        },
        spread: generated.spread,
        leases: Default::default(),
        oversubscribe: false,
    };
    let strategy = match generated.strategy {
        0 => Strategy::BinPack,
        1 => Strategy::Spread,
        2 => Strategy::Random {
            seed: u64::from(generated.workers) * 31 + generated.cpu_milli,
        },
        _ => Strategy::FragmentationAware,
    };
    (gang, strategy)
}

/// How many workers of `gang` each usable node holds, counted from first
/// principles rather than through the pool's own helpers.
fn brute_force_fits(pool: &NodePool, gang: &GangShape) -> Vec<(NodeId, Option<String>, u64)> {
    let per_worker = gang.per_worker;
    let needs_gpu = per_worker.gpu_milli > 0;
    pool.nodes
        .iter()
        .filter(|node| node.schedulable)
        .filter(|node| {
            gang.node_labels
                .iter()
                .all(|(key, value)| node.spec.labels.get(key) == Some(value))
                && (!needs_gpu
                    || gang.gpu_models.is_empty()
                    || node
                        .spec
                        .gpu_model
                        .as_ref()
                        .is_some_and(|model| gang.gpu_models.contains(model)))
        })
        .map(|node| {
            let rooms = node
                .usage
                .gpu_used
                .iter()
                .map(|used| u64::from(1000 - *used));
            let by_gpu = match per_worker.gpu_milli {
                0 => u64::MAX,
                milli if milli < 1000 => rooms.map(|room| room / milli).sum(),
                milli => rooms.filter(|room| *room == 1000).count() as u64 / (milli / 1000),
            };
            let by_cpu = (node.spec.cpu_milli - node.usage.cpu_milli)
                .checked_div(per_worker.cpu_milli)
                .unwrap_or(u64::MAX);
            let by_memory = (node.spec.memory_bytes - node.usage.memory_bytes)
                .checked_div(per_worker.memory_bytes)
                .unwrap_or(u64::MAX);
            let fits = by_gpu
                .min(by_cpu)
                .min(by_memory)
                .min(u64::from(gang.workers));
            (node.spec.id, node.spec.labels.get("rack").cloned(), fits)
        })
        .filter(|(_, _, fits)| *fits > 0)
        .collect()
}

/// The fewest of these nodes that hold `workers`.
fn fewest(fits: &[u64], workers: u64) -> usize {
    let mut sorted = fits.to_vec();
    sorted.sort_unstable_by(|left, right| right.cmp(left));
    let mut held = 0;
    for (count, fit) in sorted.iter().enumerate() {
        held += fit;
        if held >= workers {
            return count + 1;
        }
    }
    usize::MAX
}

/// Checks a placement `find` returned against the brute-force count.
fn check_placement(
    pool: &NodePool,
    gang: &GangShape,
    strategy: Strategy,
    found: Option<&Vec<WorkerPlacement>>,
) -> Result<(), proptest::test_runner::TestCaseError> {
    if gang.per_worker.gpu_milli > 1000 && !gang.per_worker.gpu_milli.is_multiple_of(1000) {
        prop_assert!(found.is_none());
        return Ok(());
    }
    let workers = u64::from(gang.workers);
    let fits = brute_force_fits(pool, gang);
    let total: u64 = fits.iter().map(|(_, _, fit)| fit).sum();
    prop_assert_eq!(
        found.is_some(),
        total >= workers,
        "find is complete and sound"
    );
    let Some(found) = found else {
        return Ok(());
    };
    prop_assert!(pool.could_ever_fit(gang));
    prop_assert_eq!(found.len(), gang.workers as usize);
    for node in &nodes_used(found) {
        let on_node = found.iter().filter(|worker| worker.node == *node).count() as u64;
        let (_, fit) = fit_of(&fits, *node).expect("placed on a usable node with room");
        prop_assert!(on_node <= fit);
    }
    for worker in found {
        let shares: u64 = worker.gpus.iter().map(|share| u64::from(share.milli)).sum();
        prop_assert_eq!(shares, gang.per_worker.gpu_milli);
    }
    check_layout(gang, strategy, found, &fits)?;
    check_single_worker_choice(pool, gang, strategy, found, &fits)
}

/// A node's rack and how many workers it holds, from the brute-force count.
fn fit_of(fits: &[(NodeId, Option<String>, u64)], id: NodeId) -> Option<(Option<String>, u64)> {
    fits.iter()
        .find(|(node, _, _)| *node == id)
        .map(|(_, rack, fit)| (rack.clone(), *fit))
}

/// How a gang is laid out: one worker per node (in one rack when possible)
/// when spread, else one node, else one rack, when one holds it, on the fewest
/// nodes for bin-packing.
fn check_layout(
    gang: &GangShape,
    strategy: Strategy,
    found: &[WorkerPlacement],
    fits: &[(NodeId, Option<String>, u64)],
) -> Result<(), proptest::test_runner::TestCaseError> {
    let workers = u64::from(gang.workers);
    let used = nodes_used(found);
    let spread = !matches!(strategy, Strategy::Random { .. })
        && (gang.spread || strategy == Strategy::Spread);
    let one_node_holds_all = fits.iter().any(|(_, _, fit)| *fit >= workers);
    let mut racks: BTreeMap<Option<String>, Vec<u64>> = BTreeMap::new();
    for (_, rack, fit) in fits {
        racks.entry(rack.clone()).or_default().push(*fit);
    }
    let rack_holds_all = racks
        .iter()
        .any(|(rack, fits)| rack.is_some() && fits.iter().sum::<u64>() >= workers);
    let placed_racks: BTreeSet<Option<String>> = used
        .iter()
        .map(|node| fit_of(fits, *node).unwrap().0)
        .collect();
    if spread && workers > 1 {
        if fits.len() as u64 >= workers {
            prop_assert_eq!(
                used.len() as u64,
                workers,
                "one worker per node when possible"
            );
        }
        if racks
            .iter()
            .any(|(rack, fits)| rack.is_some() && fits.len() as u64 >= workers)
        {
            prop_assert_eq!(placed_racks.len(), 1);
        }
    } else if one_node_holds_all {
        prop_assert_eq!(used.len(), 1, "one node when one holds the gang");
    } else if rack_holds_all {
        prop_assert_eq!(placed_racks.len(), 1, "one rack when one holds the gang");
        if matches!(strategy, Strategy::BinPack | Strategy::FragmentationAware) {
            let rack = placed_racks.iter().next().unwrap();
            prop_assert_eq!(
                used.len(),
                fewest(&racks[rack], workers),
                "the fewest nodes of the rack"
            );
        }
    } else if matches!(strategy, Strategy::BinPack | Strategy::FragmentationAware) {
        let all: Vec<u64> = fits.iter().map(|(_, _, fit)| *fit).collect();
        prop_assert_eq!(used.len(), fewest(&all, workers), "the fewest nodes");
    }
    Ok(())
}

/// Where a single worker goes: bin-packing takes the fullest node that holds
/// it (and a partly used GPU before a free one), spread the emptiest.
fn check_single_worker_choice(
    pool: &NodePool,
    gang: &GangShape,
    strategy: Strategy,
    found: &[WorkerPlacement],
    fits: &[(NodeId, Option<String>, u64)],
) -> Result<(), proptest::test_runner::TestCaseError> {
    let workers = u64::from(gang.workers);
    let spread = !matches!(strategy, Strategy::Random { .. })
        && (gang.spread || strategy == Strategy::Spread);
    if workers == 1 && gang.per_worker.gpu_milli >= 1000 {
        let free_whole = |id: NodeId| pool.nodes[pool.index_of[&id]].usage.free_whole;
        let chosen = free_whole(found[0].node);
        let candidates = fits.iter().map(|(node, _, _)| free_whole(*node));
        if matches!(strategy, Strategy::BinPack | Strategy::FragmentationAware) && !gang.spread {
            prop_assert_eq!(
                chosen,
                candidates.min().unwrap(),
                "bin-pack takes the fullest"
            );
        } else if spread {
            prop_assert_eq!(
                chosen,
                candidates.max().unwrap(),
                "spread takes the emptiest"
            );
        }
    }
    let share = gang.per_worker.gpu_milli;
    if workers == 1
        && share > 0
        && share < 1000
        && matches!(strategy, Strategy::BinPack | Strategy::FragmentationAware)
        && !gang.spread
    {
        let room_before = |id: NodeId, index: u32| {
            1000 - pool.nodes[pool.index_of[&id]].usage.gpu_used[index as usize]
        };
        let shared_fits = fits.iter().any(|(id, _, _)| {
            pool.nodes[pool.index_of[id]]
                .usage
                .gpu_used
                .iter()
                .any(|used| *used > 0 && u64::from(1000 - *used) >= share)
        });
        let took_free_gpu = room_before(found[0].node, found[0].gpus[0].index) == 1000;
        prop_assert!(!(shared_fits && took_free_gpu), "a shared GPU goes first");
    }
    Ok(())
}

/// The pool's usage equals the sum of what is held, and stays within capacity.
fn check_usage(
    pool: &NodePool,
    held: &[Vec<WorkerPlacement>],
) -> Result<(), proptest::test_runner::TestCaseError> {
    pool.check_indexes();
    let mut expected: BTreeMap<NodeId, Usage> = pool
        .nodes
        .iter()
        .map(|node| (node.spec.id, Usage::empty(node.spec.gpus)))
        .collect();
    for worker in held.iter().flatten() {
        if let Some(usage) = expected.get_mut(&worker.node) {
            usage.hold(worker);
        }
    }
    for node in &pool.nodes {
        prop_assert_eq!(&node.usage, &expected[&node.spec.id]);
        prop_assert!(node.usage.gpu_used.iter().all(|used| *used <= 1000));
        prop_assert!(node.usage.cpu_milli <= node.spec.cpu_milli);
        prop_assert!(node.usage.memory_bytes <= node.spec.memory_bytes);
    }
    Ok(())
}

/// One what-if of the placement property test: a search with some held
/// allocations freed changes nothing, sees the pool as if they were released,
/// and finds no room where freeing more of them found none.
fn check_what_if(
    pool: &NodePool,
    held: &[Vec<WorkerPlacement>],
    generated: &GangGen,
    victim: usize,
) -> Result<(), proptest::test_runner::TestCaseError> {
    let (gang, strategy) = gang_of(generated);
    // Distinct allocations: each is freed once.
    let mut chosen: Vec<usize> = Vec::new();
    if !held.is_empty() {
        chosen.push(victim % held.len());
        chosen.push((victim / 7) % held.len());
        chosen.dedup();
    }
    let victims: Vec<&[WorkerPlacement]> =
        chosen.iter().map(|which| held[*which].as_slice()).collect();
    let before_free = pool.free();
    let before_nodes: Vec<Usage> = pool.nodes.iter().map(|node| node.usage.clone()).collect();
    let found = pool.find_with_freed(&gang, strategy, &victims);
    prop_assert_eq!(pool.free(), before_free);
    let after_nodes: Vec<Usage> = pool.nodes.iter().map(|node| node.usage.clone()).collect();
    prop_assert_eq!(before_nodes, after_nodes);
    let mut released = pool.clone();
    for workers in &victims {
        released.release(workers);
    }
    if matches!(strategy, Strategy::Random { .. }) {
        prop_assert_eq!(found.is_some(), released.find(&gang, strategy).is_some());
    } else {
        prop_assert_eq!(
            &found,
            &released.find(&gang, strategy),
            "a what-if sees the pool after freeing"
        );
    }
    check_placement(&released, &gang, strategy, found.as_ref())?;
    if found.is_none() {
        // Freeing fewer never finds room that freeing more did
        // not: a preemption search stops at the first failure
        // with every candidate gone.
        for fewer in 0..victims.len() {
            prop_assert!(
                pool.find_with_freed(&gang, strategy, &victims[..fewer])
                    .is_none(),
                "freeing {} of {} victims found room",
                fewer,
                victims.len()
            );
        }
    }
    if let Some(found) = found {
        prop_assert_eq!(released.allocate(&found), Ok(()));
        released.check_indexes();
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn placements_allocate_and_never_overallocate(
        nodes in prop::collection::vec(node_gen(), 1..12),
        ops in prop::collection::vec(op_gen(), 1..40),
    ) {
        let mut pool = build_pool(&nodes);
        let mut held: Vec<Vec<WorkerPlacement>> = Vec::new();
        for op in ops {
            match op {
                Op::Place(generated) => {
                    let (gang, strategy) = gang_of(&generated);
                    let found = pool.find(&gang, strategy);
                    check_placement(&pool, &gang, strategy, found.as_ref())?;
                    if !matches!(strategy, Strategy::Random { .. }) {
                        // Without the kept per-model index a one-model gang walks
                        // the pool's own: the same nodes in the same order.
                        let mut walked = pool.clone();
                        walked.model_usage.clear();
                        prop_assert_eq!(&found, &walked.find(&gang, strategy));
                    }
                    if let Some(found) = found {
                        prop_assert_eq!(pool.allocate(&found), Ok(()));
                        held.push(found);
                    }
                }
                Op::WhatIf(generated, victim) => check_what_if(&pool, &held, &generated, victim)?,
                Op::Release(which) => {
                    if !held.is_empty() {
                        let workers = held.swap_remove(which % held.len());
                        pool.release(&workers);
                    }
                }
                Op::Schedulable(which, on) => {
                    let id = pool.nodes[which % pool.nodes.len()].spec.id;
                    pool.set_schedulable(id, on);
                }
                Op::Remove(which) => {
                    if pool.node_count() > 1 {
                        let id = pool.nodes[which % pool.nodes.len()].spec.id;
                        prop_assert!(pool.remove_node(id));
                    }
                }
            }
            check_usage(&pool, &held)?;
            prop_assert!((0.0..=1.0).contains(&pool.idle_gpu_fragmentation()));
        }
        for workers in held.drain(..) {
            pool.release(&workers);
        }
        for (spec, _) in pool.nodes().map(|(spec, on)| (spec.clone(), on)).collect::<Vec<_>>() {
            pool.set_schedulable(spec.id, true);
        }
        check_usage(&pool, &held)?;
        prop_assert_eq!(pool.free(), pool.capacity());
    }
}

fn mix(kinds: &[(u64, u64, &[&str], u64)]) -> TaskMix {
    let models: Vec<Vec<String>> = kinds
        .iter()
        .map(|(_, _, models, _)| models.iter().map(|model| (*model).to_owned()).collect())
        .collect();
    TaskMix::from_workers(
        kinds
            .iter()
            .zip(&models)
            .map(|((gpu, cpu, _, count), models)| {
                (
                    Amount {
                        gpu_milli: *gpu,
                        cpu_milli: *cpu,
                        memory_bytes: 0,
                    },
                    &models[..],
                    *count,
                )
            }),
    )
    .unwrap()
}

#[test]
fn expected_fragmentation_counts_what_each_kind_cannot_use() {
    let halves_and_wholes = mix(&[(500, 0, &[], 1), (1000, 0, &[], 1)]);
    // A free GPU and one with 300 left: the half cannot use the 300, nor can
    // the whole GPU; each kind is half the mix.
    let rooms = [1000, 300];
    assert_eq!(
        halves_and_wholes.expected_fragmentation(None, &rooms, 0, 0),
        300.0
    );
    // A kind that asks CPU the node lacks cannot use any of its idle GPU.
    let with_cpu = mix(&[(500, 4000, &[], 1), (1000, 0, &[], 1)]);
    assert_eq!(
        with_cpu.expected_fragmentation(None, &rooms, 2000, 0),
        0.5 * 1300.0 + 0.5 * 300.0
    );
    assert_eq!(
        with_cpu.expected_fragmentation(None, &rooms, 4000, 0),
        300.0
    );
    // Nor a kind that names another GPU model.
    let on_v100 = mix(&[(500, 0, &["V100"], 1)]);
    assert_eq!(
        on_v100.expected_fragmentation(Some("A100"), &rooms, 0, 0),
        1300.0
    );
    assert_eq!(
        on_v100.expected_fragmentation(Some("V100"), &rooms, 0, 0),
        300.0
    );
    // Nothing idle, nothing fragmented.
    assert_eq!(
        halves_and_wholes.expected_fragmentation(None, &[0, 0], 0, 0),
        0.0
    );
}

#[test]
fn task_mixes_group_workers_by_gpu_ask_and_keep_the_most_common_types() {
    // 0.495 rounds up to 0.5, so three workers form the half-GPU class, each
    // standing for a third of it; the whole-GPU class's three workers ask
    // alike, so they are one type.
    let mixed = mix(&[
        (495, 1000, &[], 1),
        (500, 9000, &[], 1),
        (500, 2000, &[], 1),
        (1000, 8000, &[], 3),
    ]);
    let kinds: Vec<(u64, u64, f64)> = mixed
        .types()
        .iter()
        .map(|kind| (kind.gpu_milli, kind.cpu_milli, kind.weight))
        .collect();
    let sixth = 1.0 / 6.0;
    assert_eq!(
        kinds,
        [
            (1000, 8000, 0.5),
            (500, 1000, sixth),
            (500, 2000, sixth),
            (500, 9000, sixth)
        ]
    );
    // A class of eight asks keeps them all while the mix is small: the 8-core
    // ask is as much a type as the 1-core one.
    let cores: Vec<(u64, u64, &[&str], u64)> = (1..=8)
        .map(|core| (1000, core * 1000, &[][..], 1))
        .collect();
    let exact: Vec<(u64, f64)> = mix(&cores)
        .types()
        .iter()
        .map(|kind| (kind.cpu_milli, kind.weight))
        .collect();
    let expected: Vec<(u64, f64)> = (1..=8).map(|core| (core * 1000, 0.125)).collect();
    assert_eq!(exact, expected);
    // A class is its GPU ask and its models: the same share on V100 only is
    // another class, and a CPU-only worker's models are ignored.
    let constrained = mix(&[
        (500, 0, &[], 2),
        (500, 0, &["V100"], 1),
        (0, 0, &["V100"], 1),
    ]);
    let kinds = constrained.types();
    assert_eq!(kinds.len(), 3);
    assert_eq!((kinds[0].gpu_milli, kinds[0].weight), (500, 0.5));
    assert!(kinds[0].gpu_models.is_empty());
    assert_eq!(kinds[1].gpu_milli, 0, "equal counts in key order");
    assert!(kinds[1].gpu_models.is_empty());
    assert_eq!(kinds[2].gpu_models, ["V100"]);
    assert!(TaskMix::from_workers(std::iter::empty()).is_none());
}

#[test]
fn a_mix_too_large_for_exact_asks_keeps_every_class_by_quantiles() {
    // 99 classes (shares 0.01 to 0.99, the larger the more common, each
    // worker asking other cores) have 4,950 distinct asks, more than a mix
    // keeps: each class is stood for by the medians of its halves (three
    // parts would make 294 types), 197 types, and no class is left out.
    let many: Vec<(u64, u64, &[&str], u64)> = (1..=99)
        .flat_map(|step| (1..=step).map(move |core| (step * 10, core * 1000, &[][..], 1)))
        .collect();
    let kept = mix(&many);
    let types = kept.types();
    assert_eq!(types.len(), 1 + 2 * 98);
    assert!(
        types
            .windows(2)
            .all(|pair| pair[0].weight >= pair[1].weight),
        "the most common first"
    );
    let shares: std::collections::BTreeSet<u64> = types.iter().map(|kind| kind.gpu_milli).collect();
    assert_eq!(shares.len(), 99);
    // The 0.99 class's 99 workers: the medians of workers 0..49 and 49..99.
    let mut largest: Vec<u64> = types
        .iter()
        .filter(|kind| kind.gpu_milli == 990)
        .map(|kind| kind.cpu_milli)
        .collect();
    largest.sort_unstable();
    assert_eq!(largest, [25_000, 75_000]);
    let total: f64 = types.iter().map(|kind| kind.weight).sum();
    assert!((total - 1.0).abs() < 1e-9);
}

#[test]
fn fgd_keeps_cpu_for_the_gpus_that_need_it() {
    // Two nodes of two GPUs; the tight one has 8 cores, the other 32. The
    // workload is mostly whole GPUs asking 4 cores each.
    let node = |seed: u8, cores: u64| NodeSpec {
        cpu_milli: cores * 1000,
        ..spec(seed, 2, "r1")
    };
    let mut pool = pool_of(vec![node(1, 8), node(2, 32)]);
    let mut hungry = gang(1, 500);
    hungry.per_worker.cpu_milli = 6000;
    // Bin-pack takes the node with the least CPU, leaving it 2 cores for two GPUs.
    assert_eq!(
        pool.find(&hungry, Strategy::FragmentationAware).unwrap()[0].node,
        node_id(1)
    );
    pool.set_task_mix(Some(mix(&[(1000, 4000, &[], 9), (500, 6000, &[], 1)])));
    // FGD sees that a whole-GPU worker could no longer use the tight node.
    assert_eq!(
        pool.find(&hungry, Strategy::FragmentationAware).unwrap()[0].node,
        node_id(2)
    );
}

#[test]
fn fgd_breaks_equal_growths_toward_cpu_in_step_with_the_gpus_left() {
    // Node 1: four GPUs, three held, 40 cores free; node 2: two free GPUs,
    // 40 cores. The mix's GPU work asks 32 cores a GPU. A one-core worker on
    // one GPU grows the fragmentation of neither. Bin-pack takes node 1's last
    // GPU, leaving node 2 two GPUs but cores for one 32-core worker; FGD takes
    // node 2, leaving each node a GPU with the cores to use it.
    let node = |seed: u8, gpus: u32| NodeSpec {
        cpu_milli: 41_000,
        ..spec(seed, gpus, "r1")
    };
    let mut pool = pool_of(vec![node(1, 4), node(2, 2)]);
    pool.allocate(&[worker(1, &[(0, 1000), (1, 1000), (2, 1000)], 1000)])
        .unwrap();
    pool.allocate(&[worker(2, &[], 1000)]).unwrap();
    let small = gang(1, 1000);
    let bin_pack = pool.find(&small, Strategy::FragmentationAware).unwrap();
    assert_eq!(bin_pack[0].node, node_id(1));
    pool.set_task_mix(Some(mix(&[(1000, 32_000, &[], 1)])));
    let fgd = pool.find(&small, Strategy::FragmentationAware).unwrap();
    assert_eq!(fgd[0].node, node_id(2));
}

#[test]
fn fgd_picks_the_gpu_that_keeps_room_usable() {
    // One node of two GPUs, 0.3 held on GPU 0. Another 0.3 would go to GPU 0
    // by best fit, leaving 0.4 that the workload's 0.6 shares cannot use; FGD
    // breaks the free GPU instead, leaving two rooms of 0.7.
    let mut pool = pool_of(vec![spec(1, 2, "r1")]);
    pool.allocate(&[worker(1, &[(0, 300)], 0)]).unwrap();
    let third = gang(1, 300);
    let best_fit = pool.find(&third, Strategy::FragmentationAware).unwrap();
    assert_eq!(
        best_fit[0].gpus,
        vec![GpuShare {
            index: 0,
            milli: 300
        }]
    );
    pool.set_task_mix(Some(mix(&[(600, 0, &[], 1)])));
    let fgd = pool.find(&third, Strategy::FragmentationAware).unwrap();
    assert_eq!(
        fgd[0].gpus,
        vec![GpuShare {
            index: 1,
            milli: 300
        }]
    );
    // With whole GPUs half the mix, keeping GPU 1 free is worth more than a
    // usable 0.4 on GPU 0 (growth 0.05 against 0.35), so best fit it is.
    pool.set_task_mix(Some(mix(&[(600, 0, &[], 1), (1000, 0, &[], 1)])));
    let wholes_too = pool.find(&third, Strategy::FragmentationAware).unwrap();
    assert_eq!(wholes_too, best_fit);
    assert_eq!(pool.allocate(&wholes_too), Ok(()));
}

/// The growth of expected fragmentation (in FGD's steps, see
/// `fragmentation::growth_steps`) when `gang`'s one worker goes to the node at
/// `idx` on GPU `gpu`, computed from the mix alone.
fn growth_by_hand(
    pool: &NodePool,
    mix: &TaskMix,
    idx: usize,
    gang: &GangShape,
    gpu: Option<u32>,
) -> i64 {
    let node = &pool.nodes[idx];
    let model = node.spec.gpu_model.as_deref();
    let rooms: Vec<u32> = node.usage.gpu_used.iter().map(|used| 1000 - used).collect();
    let free_cpu = node.spec.cpu_milli - node.usage.cpu_milli;
    let free_memory = node.spec.memory_bytes - node.usage.memory_bytes;
    let before = mix.expected_fragmentation(model, &rooms, free_cpu, free_memory);
    let mut after = rooms.clone();
    let ask = gang.per_worker;
    match gpu {
        Some(gpu) => after[gpu as usize] -= ask.gpu_milli as u32,
        None => {
            let mut wanted = ask.gpu_milli / 1000;
            for room in after.iter_mut() {
                if wanted > 0 && *room == 1000 {
                    *room = 0;
                    wanted -= 1;
                }
            }
        }
    }
    let grown = mix.expected_fragmentation(
        model,
        &after,
        free_cpu - ask.cpu_milli,
        free_memory - ask.memory_bytes,
    );
    fragmentation::growth_steps(grown - before)
}

#[test]
fn fgd_takes_the_least_growth_of_every_fitting_node() {
    // Random pools and asks: FGD's choice has the least growth (in steps) of
    // all the fitting nodes and GPUs, computed by hand from the mix.
    let mut rng = xp_runtime::seeded::SplitMix64::new(15);
    for round in 0..200 {
        let mut pool = random_fgd_pool(&mut rng);
        let mix = random_fgd_mix(&mut rng);
        pool.set_task_mix(Some(mix.clone()));
        for _ in 0..30 {
            let shape = draw_fgd_gang(&mut rng);
            let found = pool.find(&shape, Strategy::FragmentationAware);
            let fitting: Vec<usize> = brute_force_fits(&pool, &shape)
                .iter()
                .map(|(id, _, _)| pool.index_of[id])
                .collect();
            assert_eq!(found.is_some(), !fitting.is_empty(), "round {round}");
            let Some(found) = found else { continue };
            let least = least_growth_by_hand(&pool, &mix, &shape, &fitting);
            let chosen_idx = pool.index_of[&found[0].node];
            let chosen_gpu = if (1..1000).contains(&shape.per_worker.gpu_milli) {
                Some(found[0].gpus[0].index)
            } else {
                None
            };
            assert_eq!(
                growth_by_hand(&pool, &mix, chosen_idx, &shape, chosen_gpu),
                least,
                "round {round}: {shape:?}"
            );
            assert_eq!(pool.allocate(&found), Ok(()));
        }
        pool.check_indexes();
    }
}

/// One to twelve nodes of two models, 2, 4 or 8 GPUs, random CPU and memory.
fn random_fgd_pool(rng: &mut xp_runtime::seeded::SplitMix64) -> NodePool {
    let nodes: Vec<NodeSpec> = (0..1 + rng.below(12))
        .map(|seed| NodeSpec {
            gpu_model: Some(MODELS[rng.index(2)].to_owned()),
            cpu_milli: (4 + rng.below(60)) * 1000,
            memory_bytes: (8 + rng.below(120)) * GIB,
            ..spec(seed as u8 + 1, [2, 4, 8][rng.index(3)], "r1")
        })
        .collect();
    pool_of(nodes)
}

/// One worker of a random GPU share, CPU and memory, sometimes bound to a model.
fn draw_fgd_gang(rng: &mut xp_runtime::seeded::SplitMix64) -> GangShape {
    let shares = [0, 100, 250, 300, 500, 600, 750, 1000, 2000, 4000];
    let mut shape = gang(1, shares[rng.index(shares.len())]);
    shape.per_worker.cpu_milli = (1 + rng.below(16)) * 1000;
    shape.per_worker.memory_bytes = (1 + rng.below(32)) * GIB;
    if rng.below(4) == 0 && shape.per_worker.gpu_milli > 0 {
        shape.gpu_models = vec![MODELS[0].to_owned()];
    }
    shape
}

/// The mix of a workload of twenty random gangs.
fn random_fgd_mix(rng: &mut xp_runtime::seeded::SplitMix64) -> TaskMix {
    let workload: Vec<GangShape> = (0..20).map(|_| draw_fgd_gang(rng)).collect();
    let models: Vec<Vec<String>> = workload
        .iter()
        .map(|shape| shape.gpu_models.clone())
        .collect();
    TaskMix::from_workers(
        workload
            .iter()
            .zip(&models)
            .map(|(shape, models)| (shape.per_worker, &models[..], 1)),
    )
    .unwrap()
}

/// The least growth of fragmentation over the `fitting` nodes, and for a
/// fraction of a GPU over each of their GPUs with room.
fn least_growth_by_hand(
    pool: &NodePool,
    mix: &TaskMix,
    shape: &GangShape,
    fitting: &[usize],
) -> i64 {
    fitting
        .iter()
        .flat_map(|idx| {
            let share = shape.per_worker.gpu_milli;
            let gpus: Vec<Option<u32>> = if (1..1000).contains(&share) {
                pool.nodes[*idx]
                    .usage
                    .gpu_used
                    .iter()
                    .enumerate()
                    .filter(|(_, used)| u64::from(1000 - **used) >= share)
                    .map(|(gpu, _)| Some(gpu as u32))
                    .collect()
            } else {
                vec![None]
            };
            gpus.into_iter()
                .map(|gpu| growth_by_hand(pool, mix, *idx, shape, gpu))
                .collect::<Vec<_>>()
        })
        .min()
        .unwrap()
}
