//! Communicator tests: whole rings in one process, over in-memory pipes for the
//! property tests and over real TCP, QUIC and shared memory on 127.0.0.1.

use std::future::Future;
use std::time::Duration;

use half::{bf16, f16};
use proptest::prelude::*;

use super::communicator::Engine;
use super::link::{Links, mem_pair};
use super::*;

fn quick_config(timeout_ms: u64) -> CollectiveConfig {
    CollectiveConfig {
        timeout: Duration::from_millis(timeout_ms),
        segmenting: Segmenting {
            max_segment_bytes: 4 << 10,
            min_segments: 2,
            min_segment_bytes: 1 << 10,
            lag_segments: 2,
        },
        small_buffer_bytes: 256,
        shm_ring_bytes: 64 << 10,
        // These tests name the transport they exercise, local ranks included.
        same_host_shm: false,
        quic: QuicTuning {
            min_window_bytes: 1 << 20,
            ..QuicTuning::default()
        },
    }
}

/// A ring over in-memory pipes.
fn mem_ring(world: u32, config: &CollectiveConfig) -> Vec<Communicator> {
    let mut outgoing = Vec::new();
    let mut incoming = Vec::new();
    for _ in 0..world {
        let (out, inc) = mem_pair(16 << 10);
        outgoing.push(Some(out));
        incoming.push(Some(inc));
    }
    (0..world)
        .map(|rank| {
            let links = (world > 1).then(|| {
                let (to_next, from_next) = outgoing[rank as usize].take().unwrap();
                let prev = ((rank + world - 1) % world) as usize;
                let (from_prev, to_prev) = incoming[prev].take().unwrap();
                Links {
                    to_next,
                    from_next,
                    from_prev,
                    to_prev,
                    quic: Default::default(),
                }
            });
            Communicator::new(Engine::new(rank, world, config.clone(), links))
        })
        .collect()
}

/// Runs `body` for every rank at once and returns the communicators and results in
/// rank order.
async fn on_every_rank<R, F, Fut>(
    communicators: Vec<Communicator>,
    body: F,
) -> Vec<(Communicator, R)>
where
    R: Send + 'static,
    F: Fn(Communicator) -> Fut,
    Fut: Future<Output = (Communicator, R)> + Send + 'static,
{
    let tasks: Vec<_> = communicators
        .into_iter()
        .map(|communicator| crate::task::spawn("test-rank", body(communicator)))
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

fn input(rank: u32, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((rank as usize * 31 + i * 7) % 13) as f32 - 6.0)
        .collect()
}

/// All-reduces `input(rank, len)` on every rank and checks the exact sum (small
/// integers add exactly in any order) and the bits across ranks.
async fn check_all_reduce(communicators: Vec<Communicator>, len: usize) -> Vec<Communicator> {
    let world = communicators.len() as u32;
    let results = on_every_rank(communicators, move |mut communicator| async move {
        let mut data = input(communicator.rank(), len);
        communicator
            .all_reduce(&mut data, ReduceOp::Sum)
            .await
            .unwrap();
        (communicator, data)
    })
    .await;
    let inputs: Vec<Vec<f32>> = (0..world).map(|rank| input(rank, len)).collect();
    let expected: Vec<f32> = (0..len)
        .map(|i| inputs.iter().map(|input| input[i]).sum())
        .collect();
    for (communicator, data) in &results {
        assert_eq!(
            data,
            &expected,
            "rank {} of {world}, len {len}",
            communicator.rank()
        );
    }
    results
        .into_iter()
        .map(|(communicator, _)| communicator)
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn all_reduce_matches_a_plain_sum_bit_identically(
        world in 1u32..=8,
        len in prop_oneof![Just(0usize), Just(1), 0usize..8, 9usize..100, 1000usize..3000],
        seed in any::<u64>(),
        mean in any::<bool>(),
    ) {
        let op = if mean { ReduceOp::Mean } else { ReduceOp::Sum };
        let results = runtime().block_on(async {
            let communicators = mem_ring(world, &quick_config(5_000));
            on_every_rank(communicators, move |mut communicator| async move {
                let rank = u64::from(communicator.rank());
                let mut data: Vec<f32> = (0..len)
                    .map(|i| {
                        let bits = (seed ^ rank.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_add(i as u64 * 0x2545_F491);
                        ((bits >> 11) % 20_000) as f32 / 7.0 - 1000.0
                    })
                    .collect();
                let original = data.clone();
                communicator.all_reduce(&mut data, op).await.unwrap();
                (communicator, (original, data))
            })
            .await
        });
        let first = &results[0].1.1;
        for (_, (_, data)) in &results {
            let same = data.iter().zip(first).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "ranks disagree bitwise");
        }
        for i in 0..len {
            let mut plain: f64 = results.iter().map(|(_, (original, _))| f64::from(original[i])).sum();
            if mean {
                plain /= f64::from(world);
            }
            prop_assert!((f64::from(first[i]) - plain).abs() < 1e-2, "element {}: {} vs {}", i, first[i], plain);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_rings_sum_awkward_lengths() {
    for world in [1, 2, 3] {
        let mut communicators = local_ring_with(world, TransportKind::Tcp, quick_config(5_000))
            .await
            .unwrap();
        for len in [0, 1, 2, 7, 1001, 5000] {
            communicators = check_all_reduce(communicators, len).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_all_gather_and_barrier() {
    let communicators = mem_ring(4, &quick_config(5_000));
    let results = on_every_rank(communicators, |mut communicator| async move {
        let rank = communicator.rank();
        let mut data = vec![rank as f64; 3000];
        communicator.broadcast(&mut data, 2).await.unwrap();
        let gathered = communicator
            .all_gather(&[rank as f64, 10.0 * rank as f64])
            .await
            .unwrap();
        communicator.barrier().await.unwrap();
        let invalid = communicator.broadcast(&mut data, 9).await;
        assert!(matches!(
            invalid,
            Err(CollectiveError::InvalidRank {
                rank: 9,
                world_size: 4
            })
        ));
        (communicator, (data, gathered))
    })
    .await;
    for (_, (data, gathered)) in &results {
        assert!(data.iter().all(|&x| x == 2.0));
        assert_eq!(gathered, &vec![0.0, 0.0, 1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_types_reduce_identically_on_every_rank() {
    let communicators = mem_ring(3, &quick_config(5_000));
    let results = on_every_rank(communicators, |mut communicator| async move {
        let rank = communicator.rank() as f32;
        let mut halves: Vec<f16> = (0..777)
            .map(|i| f16::from_f32(rank + i as f32 / 64.0))
            .collect();
        let mut brains: Vec<bf16> = (0..777)
            .map(|i| bf16::from_f32(rank * 0.5 + i as f32))
            .collect();
        communicator
            .all_reduce(&mut halves, ReduceOp::Sum)
            .await
            .unwrap();
        communicator
            .all_reduce(&mut brains, ReduceOp::Mean)
            .await
            .unwrap();
        (communicator, (halves, brains))
    })
    .await;
    let (first_halves, first_brains) = &results[0].1;
    for (_, (halves, brains)) in &results {
        assert_eq!(
            halves.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            first_halves.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            brains.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            first_brains.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
    // 0 + 1 + 2 + 3 × (i / 64): exact in f16 for small i.
    assert_eq!(first_halves[1].to_f32(), 3.0 + 3.0 / 64.0);
    // The mean of 0, 0.5 and 1 plus i, rounded to bf16.
    assert_eq!(first_brains[2].to_f32(), 2.5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_rank_is_named_by_every_other_rank() {
    for (kind, len) in [
        (TransportKind::Tcp, 5000),
        (TransportKind::Tcp, 10),
        (TransportKind::Shm, 5000),
    ] {
        let config = quick_config(800);
        let mut communicators = local_ring_with(4, kind, config).await.unwrap();
        communicators = check_all_reduce(communicators, len).await;
        drop(communicators.remove(2));
        let started = tokio::time::Instant::now();
        let results = on_every_rank(communicators, move |mut communicator| async move {
            let mut data = vec![1.0f32; len];
            let result = communicator.all_reduce(&mut data, ReduceOp::Sum).await;
            let again = communicator.barrier().await;
            (communicator, (result, again))
        })
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{kind:?} took {:?}",
            started.elapsed()
        );
        for (communicator, (result, again)) in results {
            let error = result.expect_err("a ring with a dead rank must fail");
            assert_eq!(
                error.rank(),
                2,
                "{kind:?} rank {} blamed the wrong rank: {error}",
                communicator.rank()
            );
            assert!(matches!(again, Err(CollectiveError::Poisoned { rank: 2 })));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_rank_is_named_within_the_timeout() {
    let communicators = local_ring_with(4, TransportKind::Tcp, quick_config(300))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let results = on_every_rank(communicators, |mut communicator| async move {
        if communicator.rank() == 2 {
            // Alive but never calling the collective.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            return (communicator, None);
        }
        let mut data = vec![1.0f32; 3000];
        let result = communicator.all_reduce(&mut data, ReduceOp::Sum).await;
        (communicator, Some((result, tokio::time::Instant::now())))
    })
    .await;
    for (communicator, outcome) in results {
        let Some((result, finished)) = outcome else {
            continue;
        };
        let error = result.expect_err("a ring with a stalled rank must fail");
        assert_eq!(
            error.rank(),
            2,
            "rank {} blamed the wrong rank: {error}",
            communicator.rank()
        );
        // The others must not wait for the stalled rank to come back.
        assert!(
            finished - started < Duration::from_millis(1_400),
            "took {:?}",
            finished - started
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_that_disagree_on_the_length_fail_with_a_mismatch() {
    let communicators = mem_ring(2, &quick_config(2_000));
    let results = on_every_rank(communicators, |mut communicator| async move {
        let mut data = vec![1.0f32; 100 + communicator.rank() as usize];
        let result = communicator.all_reduce(&mut data, ReduceOp::Sum).await;
        (communicator, result)
    })
    .await;
    for (_, result) in results {
        let error = result.unwrap_err();
        assert!(
            matches!(
                error,
                CollectiveError::Mismatch { .. }
                    | CollectiveError::PeerFailed {
                        cause: FailureCause::Mismatch,
                        ..
                    }
            ),
            "{error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_and_the_right_ring_still_forms() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let config = quick_config(3_000);
    let bind = || RingListener::bind_with(TransportKind::Tcp, "127.0.0.1", config.clone());
    let (listener0, good1, bad1) = (
        bind().await.unwrap(),
        bind().await.unwrap(),
        bind().await.unwrap(),
    );
    let good_peers = vec![
        listener0.peer_info(0, "127.0.0.1", true),
        good1.peer_info(1, "127.0.0.1", true),
    ];
    let bad_peers = vec![good_peers[0].clone(), bad1.peer_info(1, "127.0.0.1", true)];
    let token = [7u8; 32];
    let rank0 = {
        let peers = good_peers.clone();
        let config = config.clone();
        crate::task::spawn("rank0", async move {
            connect_ring_with(listener0, 0, &peers, TransportKind::Tcp, &token, config).await
        })
    };

    // An impostor with the wrong token, claiming to be rank 1, gets no answer.
    let mut impostor = tokio::net::TcpStream::connect(("127.0.0.1", good_peers[0].port))
        .await
        .unwrap();
    let hello = wire::Hello {
        kind: wire::LinkKind::Tcp,
        token: [8u8; 32],
        rank: 1,
        stream: 0,
        extra: 0,
    };
    impostor.write_all(&hello.encode()).await.unwrap();
    let mut answer = [0u8; 1];
    assert_eq!(
        impostor.read(&mut answer).await.unwrap(),
        0,
        "the impostor must be dropped unanswered"
    );

    // A rank with the wrong token is refused by the rank it connects to.
    let wrong = connect_ring_with(
        bad1,
        1,
        &bad_peers,
        TransportKind::Tcp,
        &[9u8; 32],
        config.clone(),
    )
    .await;
    assert!(
        matches!(wrong, Err(CollectiveError::Refused { rank: 0 })),
        "{wrong:?}"
    );

    // Rank 0 kept waiting, and the right rank 1 completes the ring.
    let mut second = connect_ring_with(good1, 1, &good_peers, TransportKind::Tcp, &token, config)
        .await
        .unwrap();
    let mut first = rank0.await.unwrap().unwrap();
    let mut ones = vec![1.0f32; 10];
    let mut twos = vec![2.0f32; 10];
    let (a, b) = tokio::join!(
        first.all_reduce(&mut ones, ReduceOp::Sum),
        second.all_reduce(&mut twos, ReduceOp::Sum)
    );
    a.unwrap();
    b.unwrap();
    assert_eq!(ones, vec![3.0; 10]);
    assert_eq!(twos, vec![3.0; 10]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_and_quic_rings_reduce_mid_size_buffers() {
    for (kind, world) in [
        (TransportKind::Shm, 3),
        (TransportKind::Quic, 3),
        (TransportKind::Shm, 2),
    ] {
        let mut config = quick_config(5_000);
        config.segmenting = Segmenting::default();
        config.small_buffer_bytes = 64 << 10;
        let mut communicators = local_ring_with(world, kind, config).await.unwrap();
        for len in [300_000, 10, 0] {
            communicators = check_all_reduce(communicators, len).await;
        }
        let results = on_every_rank(communicators, |mut communicator| async move {
            let mut data = vec![communicator.rank() as f32; 70_001];
            communicator.broadcast(&mut data, 1).await.unwrap();
            (communicator, data)
        })
        .await;
        assert!(
            results
                .iter()
                .all(|(_, data)| data.iter().all(|&x| x == 1.0)),
            "{kind:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_refuses_a_certificate_with_another_hash() {
    let config = quick_config(1_500);
    let listeners = [
        RingListener::bind_with(TransportKind::Quic, "127.0.0.1", config.clone())
            .await
            .unwrap(),
        RingListener::bind_with(TransportKind::Quic, "127.0.0.1", config.clone())
            .await
            .unwrap(),
    ];
    let mut peers: Vec<PeerInfo> = listeners
        .iter()
        .enumerate()
        .map(|(rank, l)| l.peer_info(rank as u32, "127.0.0.1", true))
        .collect();
    peers[1].cert_sha256 = Some([0u8; 32]);
    let token = [3u8; 32];
    let [first, second] = listeners;
    let peers_for_1 = peers.clone();
    let other = crate::task::spawn("rank1", async move {
        connect_ring_with(
            second,
            1,
            &peers_for_1,
            TransportKind::Quic,
            &token,
            quick_config(1_500),
        )
        .await
    });
    let result = connect_ring_with(first, 0, &peers, TransportKind::Quic, &token, config).await;
    assert!(
        matches!(result, Err(CollectiveError::Quic { rank: 1, .. })),
        "{result:?}"
    );
    let _ = other.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_all_reduces_run_in_order_and_hand_the_ring_back() {
    let communicators = mem_ring(3, &quick_config(5_000));
    let results = on_every_rank(communicators, |mut communicator| async move {
        let rank = communicator.rank() as f32;
        let handles: Vec<_> = (0..4)
            .map(|bucket| {
                communicator
                    .all_reduce_async(vec![rank + bucket as f32; 1000 + bucket], ReduceOp::Sum)
            })
            .collect();
        let mut sums = Vec::new();
        for handle in handles {
            sums.push(handle.wait().await.unwrap());
        }
        // A blocking-style call after the queue takes the engine back.
        communicator.barrier().await.unwrap();
        (communicator, sums)
    })
    .await;
    for (_, sums) in results {
        for (bucket, sum) in sums.iter().enumerate() {
            assert_eq!(sum.len(), 1000 + bucket);
            assert!(sum.iter().all(|&x| x == 3.0 + 3.0 * bucket as f32));
        }
    }
}

#[test]
fn the_blocking_facade_runs_a_ring_from_plain_threads() {
    let config = quick_config(5_000);
    let listeners: Vec<BlockingRingListener> = (0..2)
        .map(|_| {
            BlockingRingListener::bind(TransportKind::Tcp, "127.0.0.1", config.clone()).unwrap()
        })
        .collect();
    let peers: Vec<PeerInfo> = listeners
        .iter()
        .enumerate()
        .map(|(rank, l)| l.peer_info(rank as u32, "127.0.0.1", true))
        .collect();
    let threads: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let peers = peers.clone();
            std::thread::spawn(move || {
                let mut communicator = listener
                    .connect_ring(
                        rank as u32,
                        &peers,
                        TransportKind::Tcp,
                        &[1; 32],
                        Duration::from_secs(5),
                    )
                    .unwrap();
                let mut data = vec![rank as f32 + 1.0; 100_000];
                communicator.all_reduce(&mut data, ReduceOp::Mean).unwrap();
                let handle = communicator.all_reduce_async(vec![1.0f64; 10], ReduceOp::Sum);
                let summed = handle.wait_blocking().unwrap();
                let gathered = communicator.all_gather(&[rank as f32]).unwrap();
                communicator.barrier().unwrap();
                (data, summed, gathered)
            })
        })
        .collect();
    for thread in threads {
        let (data, summed, gathered) = thread.join().unwrap();
        assert!(data.iter().all(|&x| x == 1.5));
        assert_eq!(summed, vec![2.0; 10]);
        assert_eq!(gathered, vec![0.0, 1.0]);
    }
}

/// A rank that leaves right after its last collective must not cut the bytes its
/// next rank is still reading: QUIC discards undelivered data on close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_that_leave_at_once_lose_no_bytes_in_flight() {
    let len = 1 << 18;
    let inputs: Vec<Vec<f32>> = (0..3).map(|rank| input(rank, len)).collect();
    let expected: Vec<f32> = (0..len)
        .map(|i| inputs.iter().map(|input| input[i]).sum())
        .collect();
    for round in 0..6u32 {
        let communicators = local_ring(3, TransportKind::Quic).await.unwrap();
        let tasks: Vec<_> = communicators
            .into_iter()
            .map(|mut communicator| {
                crate::task::spawn("test-rank", async move {
                    let mut data = input(communicator.rank(), len);
                    let rank = communicator.rank();
                    let result = communicator.all_reduce(&mut data, ReduceOp::Sum).await;
                    // Even rounds drop (closing in the background), odd rounds close.
                    if round % 2 == 0 {
                        drop(communicator);
                    } else {
                        communicator.close().await;
                    }
                    (rank, result.map(|()| data))
                })
            })
            .collect();
        for task in tasks {
            let (rank, result) = task.await.unwrap();
            let data = result.unwrap_or_else(|error| panic!("round {round}, rank {rank}: {error}"));
            assert!(data == expected, "round {round}, rank {rank}: wrong sum");
        }
    }
}

/// Two "hosts" of two ranks each: the links inside a host use shared memory, the
/// links between hosts QUIC, and the sums are still exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_choose_shared_memory_inside_a_host_and_quic_between_hosts() {
    let config = CollectiveConfig {
        timeout: Duration::from_secs(20),
        ..CollectiveConfig::default()
    };
    let host_of = |rank: u32| rank / 2;
    let mut listeners = Vec::new();
    for _ in 0..4 {
        listeners.push(
            RingListener::bind_with(TransportKind::Quic, "127.0.0.1", config.clone())
                .await
                .unwrap(),
        );
    }
    let entries: Vec<PeerInfo> = listeners
        .iter()
        .enumerate()
        .map(|(rank, listener)| listener.peer_info(rank as u32, "127.0.0.1", false))
        .collect();
    let token: [u8; 32] = rand::random();
    let tasks: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let rank = rank as u32;
            // Each rank sees "same host" from its own point of view.
            let peers: Vec<PeerInfo> = entries
                .iter()
                .map(|entry| PeerInfo {
                    same_host: host_of(entry.rank) == host_of(rank),
                    ..entry.clone()
                })
                .collect();
            let config = config.clone();
            crate::task::spawn("test-rank", async move {
                connect_ring_with(listener, rank, &peers, TransportKind::Quic, &token, config)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut communicators = Vec::new();
    for task in tasks {
        communicators.push(task.await.unwrap());
    }
    let transports: Vec<[&str; 2]> = communicators
        .iter()
        .map(Communicator::link_transports)
        .collect();
    assert_eq!(
        transports,
        vec![
            ["shm", "quic"],
            ["quic", "shm"],
            ["shm", "quic"],
            ["quic", "shm"]
        ]
    );
    let communicators = check_all_reduce(communicators, 100_003).await;
    // Every rank closes at once, as separate processes would.
    let closing: Vec<_> = communicators
        .into_iter()
        .map(|communicator| crate::task::spawn("test-close", communicator.close()))
        .collect();
    for task in closing {
        task.await.unwrap();
    }
}
