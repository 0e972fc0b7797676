//! Targets for the binary wires: control-plane frames (`runtime::frame`, every
//! `Message`, checkpoint manifests included), object requests and answers between
//! nodes, object capabilities (decoded and verified), the worker's local object
//! channel, and the collectives' rendezvous.

use std::collections::BTreeMap;

use xp_runtime::frame::{self, FrameError, MAX_FRAME_BYTES};
use xp_runtime::ids::{BlobHash, ExperimentId, NodeId, ObjectId, TrialId, WorkerKey};
use xp_runtime::object_wire::{
    self, Credential, FetchErrorCode, FetchHeader, LocalOp, LocalRequest, LocalResponse,
    MAX_LOCAL_MESSAGE, MAX_REQUEST_BYTES, ObjectOp, ObjectRequest, StoreAnswer,
};
use xp_runtime::protocol::{
    CapabilityKey, CheckpointFile, ErrorCode, GpuInfo, Grant, HeadCommand, HeldObject, Hello,
    Holder, Launch, Message, NodeMessage, NodeRegistration, NodeResources, ObjectAccessReport,
    ObjectCapability, ObjectEndpoint, ObjectRefusal, ObjectRules, ObjectSource, PeerRole, Program,
    ReadScope, RemoteError, Request, ResumeFrom, Revocation, RevocationEntry, RevocationList,
    SubmitRequest, TeamObjectCounts, TeamQuota, WorkerReport,
};
use xp_runtime::rendezvous::{self, RankAddress, StoreMessage};
use xp_runtime::spec::CollectiveTransport;

use super::{Target, bytes_and_mutations, run};

/// Structure-aware edits of binary encodings need no text tokens.
const NO_TOKENS: &[&str] = &[];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
}

fn trial(index: u32) -> TrialId {
    TrialId {
        experiment: ExperimentId {
            digest: 0x1234_5678_9abc_def0,
            run: 2,
        },
        index,
    }
}

fn key(rank: u32) -> WorkerKey {
    WorkerKey {
        trial: trial(3),
        attempt: 1,
        rank,
    }
}

fn node_id() -> NodeId {
    "6f1c2a4e-1d2b-4c3d-8e9f-0a1b2c3d4e5f"
        .parse()
        .expect("a valid node id")
}

fn source(port: u16) -> ObjectSource {
    ObjectSource {
        node: node_id(),
        host: "10.0.0.7".to_owned(),
        endpoint: ObjectEndpoint {
            port,
            cert_sha256: [9; 32],
        },
    }
}

/// A driver session's capability naming one of each read scope.
fn capability() -> ObjectCapability {
    let grant = Grant {
        holder: Holder::Session("driver-0123456789abcdef01234567".to_owned()),
        subject: "alice".to_owned(),
        team: "vision".to_owned(),
        read: vec![
            ReadScope::Driver("driver-0123456789abcdef01234567".to_owned()),
            ReadScope::Experiment(trial(0).experiment),
            ReadScope::Trial(trial(3)),
            ReadScope::Object(ObjectId([9; 32])),
            ReadScope::Everything,
        ],
        issued_ms: 1_800_000_000_000,
        expires_ms: 1_800_000_600_000,
    };
    ObjectCapability::issue(&CapabilityKey::derive("cluster-token"), grant)
}

/// Revocations of each kind.
fn revocations() -> Vec<RevocationEntry> {
    [
        Revocation::Holder(Holder::Attempt {
            trial: trial(3),
            attempt: 2,
        }),
        Revocation::Subject {
            subject: "alice".to_owned(),
            before_ms: 1_800_000_000_000,
        },
        Revocation::SessionsBefore {
            before_ms: 1_800_000_000_000,
        },
    ]
    .into_iter()
    .map(|revocation| RevocationEntry {
        revocation,
        until_ms: 1_800_000_600_000,
    })
    .collect()
}

/// The object plane's messages on the control plane.
fn object_plane_messages() -> Vec<Message> {
    let quota = |team: &str| TeamQuota {
        team: team.to_owned(),
        memory_bytes: 1 << 30,
        disk_bytes: 64 << 30,
    };
    vec![
        Message::Request(Request::ObjectCapability {
            objects: vec![ObjectId([1; 32]), ObjectId([2; 32])],
        }),
        Message::Response(xp_runtime::protocol::Response::ObjectCapability(Box::new(
            capability(),
        ))),
        Message::ToNode(HeadCommand::ObjectRules(ObjectRules {
            default_quota: quota(""),
            teams: vec![quota("vision")],
            revoked: revocations(),
        })),
        Message::ToNode(HeadCommand::RevokeCapabilities(revocations())),
        Message::ToNode(HeadCommand::RenewCapabilities(vec![capability()])),
        Message::FromNode(NodeMessage::ObjectAccess(ObjectAccessReport {
            counts: vec![TeamObjectCounts {
                team: "vision".to_owned(),
                fetches: 3,
                fetched_bytes: 3 << 20,
                stores: 1,
                stored_bytes: 1 << 20,
                refusals: 2,
            }],
            refusals: vec![ObjectRefusal {
                at_ms: 1_800_000_000_000,
                subject: "alice".to_owned(),
                team: "vision".to_owned(),
                action: "fetch object 0909".to_owned(),
                reason: "the capability was revoked".to_owned(),
            }],
        })),
    ]
}

fn manifest() -> Vec<CheckpointFile> {
    ["model.bin", "optimizer/state.bin", "rng"]
        .iter()
        .enumerate()
        .map(|(index, name)| CheckpointFile {
            name: (*name).to_owned(),
            object: ObjectId([index as u8; 32]),
            size: 1 << (10 * index),
        })
        .collect()
}

/// Valid messages of every direction, with the nested vectors, strings and maps
/// whose length prefixes a hostile peer would inflate.
fn messages() -> Vec<Message> {
    vec![
        Message::Hello(Hello {
            token: "f00dcafe".repeat(8),
            role: PeerRole::Node,
            agent: "xp-node 0.1".to_owned(),
        }),
        submit(),
        Message::Request(Request::SharingDrivers {
            experiment: trial(0).experiment,
            sessions: vec!["driver-a".to_owned(), "driver-b".to_owned()],
        }),
        register(),
        Message::Request(Request::SubmitPipeline(
            xp_runtime::protocol::PipelineSubmit {
                spec_json: r#"{"name":"p","stages":{"a":{"trial":{"command":["true"]}}}}"#
                    .to_owned(),
                code_version: "git:0123abcd".to_owned(),
                data_version: "blake3:99aa".to_owned(),
            },
        )),
        Message::Request(Request::RetryPipeline { pipeline: 7 }),
        Message::ToNode(HeadCommand::Replicate {
            trial: trial(3),
            objects: vec![(ObjectId([2; 32]), 4096), (ObjectId([3; 32]), 1 << 20)],
            sources: vec![source(4200)],
            path: xp_runtime::protocol::FetchPath::Tcp,
        }),
        telemetry(),
        Message::Request(Request::Telemetry { trial: trial(3) }),
        Message::Request(Request::Report(xp_runtime::protocol::ReportRequest {
            experiment: Some("0123abcd".to_owned()),
            team: None,
            since_ms: Some(3_600_000),
        })),
        Message::Response(xp_runtime::protocol::Response::Report(Box::new(report()))),
        status_query(),
        status_page(),
        Message::Error(RemoteError::new(ErrorCode::BadRequest, "no such trial")),
    ]
    .into_iter()
    .chain(node_reports())
    .chain(object_plane_messages())
    .collect()
}

/// A node's numbered reports, each kind with nested data.
fn node_reports() -> Vec<Message> {
    let report = |seq: u64, report: WorkerReport| {
        Message::FromNode(NodeMessage::Report {
            seq,
            at: 1_700_000_000_000,
            report,
        })
    };
    vec![
        report(
            41,
            WorkerReport::Checkpoint {
                key: key(0),
                step: 1200,
                files: manifest(),
                backup: Some("/backup/ckpt".to_owned()),
                take_ms: 840,
            },
        ),
        report(
            42,
            WorkerReport::Metric {
                key: key(0),
                index: 7,
                step: Some(1200),
                values: vec![("loss".to_owned(), 0.25), ("acc".to_owned(), 0.9)],
            },
        ),
        launch(),
        report(
            43,
            WorkerReport::Outputs {
                key: key(0),
                files: manifest(),
                error: None,
            },
        ),
        report(
            44,
            WorkerReport::Evicted {
                key: key(0),
                gpu: 0,
                used_bytes: 97 << 30,
                total_bytes: 100 << 30,
            },
        ),
        report(
            45,
            WorkerReport::ExitedWithStderr {
                key: key(0),
                code: Some(2),
                signal: None,
                stderr_tail: "Traceback (most recent call last):\n  ValueError".to_owned(),
            },
        ),
        report(
            46,
            WorkerReport::MalformedMetrics {
                key: key(0),
                count: 3,
                first: "XP_METRIC {\"acc\": 1,} (not an object)".to_owned(),
            },
        ),
    ]
}

/// A request for a status page, from a cursor.
fn status_query() -> Message {
    Message::Request(Request::StatusPage(xp_runtime::protocol::StatusQuery {
        experiment: Some("0123abcd".to_owned()),
        from: Some(xp_runtime::protocol::StatusCursor {
            experiment: trial(0).experiment,
            trial: 5_000,
        }),
    }))
}

/// A status page: one experiment continuing from trial 3, and where the next
/// page starts.
fn status_page() -> Message {
    use xp_runtime::protocol::{
        AttemptStatus, ExperimentState, ExperimentStatus, StatusCursor, StatusPage, TrialState,
        TrialStatus,
    };
    let trial_status = |index: u32| TrialStatus {
        id: trial(index),
        state: TrialState::Succeeded,
        config_json: r#"{"lr":0.1,"seed":0}"#.to_owned(),
        attempts: vec![AttemptStatus {
            number: 1,
            nodes: vec![node_id()],
            placed_at: 1_700_000_000_000,
            running_at: Some(1_700_000_000_500),
            ended_at: Some(1_700_000_060_000),
            outcome: Some("exited 0".to_owned()),
            resumed_from: None,
        }],
        metrics: BTreeMap::from([("loss".to_owned(), 0.25)]),
        last_step: Some(100),
        reason: None,
        reused_from: None,
        waiting: None,
        gpu_hours: 0.5,
        cost: None,
        malformed_metrics: None,
    };
    Message::Response(xp_runtime::protocol::Response::StatusPage(StatusPage {
        experiments: vec![ExperimentStatus {
            id: trial(0).experiment,
            name: "sweep".to_owned(),
            team: "vision".to_owned(),
            state: ExperimentState::Running,
            metric: Some("loss".to_owned()),
            maximize: false,
            submitted_at: 1_700_000_000_000,
            code_version: "git:0123abcd".to_owned(),
            data_version: "none".to_owned(),
            trials: vec![trial_status(3), trial_status(4)],
            objectives: Vec::new(),
            front: None,
        }],
        next: Some(StatusCursor {
            experiment: trial(0).experiment,
            trial: 5,
        }),
    }))
}

/// A submission with a spec, a program and versions.
fn submit() -> Message {
    let spec_json = r#"{"name":"sweep","team":"vision","trial":{"command":["python","train.py","--lr","{lr}"]},"search":{"algorithm":"grid","space":{"lr":{"values":[0.1,0.01]}}}}"#;
    Message::Request(Request::Submit(SubmitRequest {
        spec_json: spec_json.to_owned(),
        program: Some(BlobHash([4; 32])),
        code_version: "git:0123abcd+dirty:ffee".to_owned(),
        data_version: "blake3:99aa".to_owned(),
        rerun: false,
    }))
}

/// A node's registration, with its GPUs, labels, running workers and held objects.
fn register() -> Message {
    Message::FromNode(NodeMessage::Register(NodeRegistration {
        node_id: node_id(),
        name: "gpu-7".to_owned(),
        advertise_host: "10.0.0.7".to_owned(),
        resources: NodeResources {
            gpus: vec![
                GpuInfo {
                    index: 0,
                    model: "H100".to_owned(),
                    memory_bytes: 80 << 30,
                };
                2
            ],
            cpu_milli: 64_000,
            memory_bytes: 512 << 30,
        },
        labels: BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
        running: vec![key(0), key(1)],
        objects: Some(source(4200).endpoint),
        held_objects: vec![HeldObject {
            id: ObjectId([1; 32]),
            pinned: true,
            trials: vec![trial(1), trial(2)],
            drivers: vec!["driver-a".to_owned()],
        }],
        isolation: Default::default(),
    }))
}

/// A launch of a resumed worker with its inputs.
fn launch() -> Message {
    Message::ToNode(HeadCommand::Launch(Box::new(Launch {
        key: key(1),
        world_size: 2,
        local_rank: 1,
        program: Program::Command {
            argv: vec!["python".to_owned(), "train.py".to_owned()],
        },
        config_json: r#"{"lr":0.1,"seed":7}"#.to_owned(),
        seed: 7,
        gpu_indices: vec![0, 1],
        gpu_milli: 1000,
        master_addr: "10.0.0.7".to_owned(),
        master_port: 29_500,
        collective_token: [5; 32],
        transport: CollectiveTransport::Quic,
        resume: Some(ResumeFrom {
            step: 1200,
            attempt: 1,
            files: manifest(),
            sources: vec![source(4200), source(4201)],
            backup: None,
        }),
        cpu_milli: 4000,
        memory_bytes: 16 << 30,
        inputs: vec![xp_runtime::protocol::LaunchInput {
            name: "prepare.outputs".to_owned(),
            marker: "{xp-input:prepare.outputs:0123456789abcdef}".to_owned(),
            files: manifest(),
            sources: vec![source(4200)],
        }],
        collect_outputs: true,
        oversubscription_milli: 1500,
        object_capability: Some(Box::new(capability())),
        command_dir: Some("/home/someone/project".to_owned()),
        object_path: xp_runtime::protocol::FetchPath::Tcp,
    })))
}

/// A node's telemetry: a worker's and a GPU's samples and its store's usage.
fn telemetry() -> Message {
    Message::FromNode(NodeMessage::Telemetry(
        xp_runtime::protocol::NodeTelemetry {
            at: 1_700_000_000_000,
            workers: vec![xp_runtime::protocol::WorkerSample {
                key: key(0),
                cpu_cores: Some(1.5),
                rss_bytes: Some(200 << 20),
                gpu_util: Some(87.0),
                gpu_mem_bytes: None,
                gpu_power_w: Some(250.0),
            }],
            gpus: vec![xp_runtime::protocol::GpuSample {
                index: 0,
                util: 87.0,
                memory_used_bytes: 5 << 30,
                power_w: Some(250.0),
            }],
            store: xp_runtime::protocol::StoreUsage {
                memory_bytes: 1 << 20,
                disk_bytes: 4 << 20,
            },
        },
    ))
}

/// A report with every nested sequence filled: models, a curve, an Amdahl fit.
fn report() -> xp_runtime::report::UsageReport {
    use xp_runtime::report::{
        AmdahlFit, BestPoint, ExperimentReturn, ModelUsage, SpeedupPoint, UsageReport,
    };
    UsageReport {
        scope: "team vision".to_owned(),
        window_start: 1_700_000_000_000,
        window_end: 1_700_003_600_000,
        gpu_hours: 12.5,
        by_model: vec![ModelUsage {
            model: "H100".to_owned(),
            gpu_hours: 12.5,
            price_per_hour: Some(3.2),
            cost: Some(40.0),
        }],
        cost: Some(40.0),
        returns: vec![ExperimentReturn {
            experiment: trial(0).experiment,
            metric: "acc".to_owned(),
            maximize: true,
            gpu_hours: 12.5,
            cost: Some(40.0),
            best_vs_gpu_hours: vec![
                BestPoint {
                    gpu_hours: 1.0,
                    best: 0.5,
                    trial: trial(1),
                    value: 0.5,
                };
                3
            ],
            best: Some(0.5),
            last_quarter_gain: Some(0.0),
            value_per_unit: Some(100.0),
            roi_percent: Some(-100.0),
        }],
        amdahl: vec![AmdahlFit {
            name: "sweep".to_owned(),
            varied: "parallel".to_owned(),
            points: vec![SpeedupPoint {
                parallelism: 2.0,
                seconds: 60.0,
                speedup: 1.8,
                experiments: vec![trial(0).experiment, trial(1).experiment],
            }],
            serial_fraction: 0.1,
            predicted_parallelism: 4.0,
            predicted_speedup: 3.1,
        }],
        ..UsageReport::default()
    }
}

/// Every corpus message as a whole frame, length prefix included.
fn frames() -> Vec<Vec<u8>> {
    messages()
        .iter()
        .map(|message| frame::encode(message).expect("a corpus message encodes"))
        .collect()
}

/// What reading and decoding any frame may hold beyond its input: the body is
/// buffered only as its bytes arrive and bincode's limit is within 16 times
/// the payload (at least 16 KiB), so no announced frame or string length costs
/// more; but serde reserves up to 1 MiB for each sequence from the length it
/// announces, a few of them nested. (Before authentication only a hello, which
/// has no sequence, is decoded: [`HELLO_LIMIT`].)
const FRAME_LIMIT: usize = 4 << 20;
/// What reading a hello may hold beyond 16 bytes per input byte.
const HELLO_LIMIT: usize = 64 << 10;
/// What a frame may hold per input byte (the decode limit's step, and the
/// body buffer's doubling).
const FRAME_PER_INPUT_BYTE: usize = 16;

#[test]
fn frame_bodies() {
    let bodies: Vec<Vec<u8>> = frames()
        .into_iter()
        .map(|frame| frame[4..].to_vec())
        .collect();
    let target = Target {
        name: "frame body (Message)",
        cases: 4000,
        limit: FRAME_LIMIT,
        per_input_byte: FRAME_PER_INPUT_BYTE,
    };
    run(
        &target,
        bytes_and_mutations(bodies, NO_TOKENS, 512),
        |body| frame::decode_body(body).is_ok(),
    );
}

#[test]
fn frame_streams() {
    let runtime = runtime();
    let target = Target {
        name: "frame stream (read_message)",
        cases: 3000,
        limit: FRAME_LIMIT,
        per_input_byte: FRAME_PER_INPUT_BYTE,
    };
    run(
        &target,
        bytes_and_mutations(frames(), NO_TOKENS, 512),
        |bytes| {
            runtime
                .block_on(frame::read_message(&mut &bytes[..]))
                .is_ok_and(|message| message.is_some())
        },
    );
}

/// The hello of a peer not yet authenticated, read under its 16 KiB limit: a
/// few bytes claiming a long string or sequence make no buffer of that length.
#[test]
fn hello_streams() {
    let runtime = runtime();
    let target = Target {
        name: "hello stream (read_hello)",
        cases: 3000,
        limit: HELLO_LIMIT,
        per_input_byte: FRAME_PER_INPUT_BYTE,
    };
    run(
        &target,
        bytes_and_mutations(frames(), NO_TOKENS, 512),
        |bytes| {
            runtime
                .block_on(frame::read_hello(&mut &bytes[..], 16 << 10))
                .is_ok_and(|hello| hello.is_some())
        },
    );
}

/// A 4 GiB announced length is refused from its four bytes, before any of the
/// body is allocated; so is one byte over the limit.
#[test]
fn frame_length_prefixes_set_huge_are_refused_without_allocating() {
    let runtime = runtime();
    for announced in [u32::MAX, 0x8000_0000, MAX_FRAME_BYTES as u32 + 1] {
        let mut bytes = announced.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[0u8; 64]);
        let (result, peak) =
            super::measure(|| runtime.block_on(frame::read_message(&mut &bytes[..])));
        assert!(
            matches!(result, Err(FrameError::TooLarge { len }) if len == announced as usize),
            "{announced}: {result:?}"
        );
        assert!(peak < 64 << 10, "{announced}: held {peak} bytes");
    }
    // The hello of a peer not yet authenticated has a tighter limit.
    let bytes = (64u32 << 10).to_be_bytes();
    let (result, peak) =
        super::measure(|| runtime.block_on(frame::read_message_limited(&mut &bytes[..], 16 << 10)));
    assert!(
        matches!(result, Err(FrameError::TooLarge { .. })),
        "{result:?}"
    );
    assert!(peak < 64 << 10, "held {peak} bytes");
}

/// Encodes `message` the way `write_small` puts it on an object stream.
fn small_frame<T: serde::Serialize>(runtime: &tokio::runtime::Runtime, message: &T) -> Vec<u8> {
    let mut out = Vec::new();
    runtime
        .block_on(object_wire::write_small(&mut out, message))
        .expect("a corpus message encodes");
    out
}

#[test]
fn object_requests() {
    let runtime = runtime();
    let credentials = [
        Credential::Node(object_wire::node_credential("cluster-token")),
        Credential::Capability(Box::new(capability())),
    ];
    let corpus = [
        ObjectOp::Fetch {
            id: ObjectId([1; 32]),
            offset: 8 << 20,
            len: 8 << 20,
        },
        ObjectOp::Store {
            owner: "driver-a".to_owned(),
            size: 1 << 30,
        },
        ObjectOp::Damaged {
            id: ObjectId([2; 32]),
        },
        ObjectOp::Release {
            owner: "driver-a".to_owned(),
            id: ObjectId([3; 32]),
        },
        ObjectOp::Owners {
            id: ObjectId([4; 32]),
        },
    ]
    .into_iter()
    .flat_map(|op| {
        credentials.clone().map(|credential| ObjectRequest {
            credential,
            op: op.clone(),
        })
    })
    .map(|request| small_frame(&runtime, &request))
    .collect();
    let target = Target {
        name: "object request (ObjectRequest)",
        cases: 3000,
        // The request buffer, and what bincode may build within the same limit.
        limit: 2 * MAX_REQUEST_BYTES,
        per_input_byte: 0,
    };
    run(
        &target,
        bytes_and_mutations(corpus, NO_TOKENS, 256),
        |bytes| {
            runtime
                .block_on(object_wire::read_small::<ObjectRequest>(&mut &bytes[..]))
                .is_ok()
        },
    );
}

/// The capability's decoder and verifier: whatever the bytes, decoding under
/// the object wire's limit answers a capability or an error, and verifying
/// what decodes answers its grant or a typed refusal, never a panic; only
/// the untouched capability verifies.
#[test]
fn object_capabilities() {
    let runtime = runtime();
    let original = capability();
    let corpus = vec![small_frame(&runtime, &original)];
    let target = Target {
        name: "object capability (ObjectCapability, verified)",
        cases: 3000,
        limit: 2 * MAX_REQUEST_BYTES,
        per_input_byte: 0,
    };
    let key = CapabilityKey::derive("cluster-token");
    let revoked = RevocationList::default();
    run(
        &target,
        bytes_and_mutations(corpus, NO_TOKENS, 256),
        |bytes| {
            let Ok(decoded) =
                runtime.block_on(object_wire::read_small::<ObjectCapability>(&mut &bytes[..]))
            else {
                return false;
            };
            let verified = decoded.verify(&key, original.grant.issued_ms, &revoked);
            assert!(
                verified.is_err() || decoded == original,
                "an altered capability verified: {decoded:?}"
            );
            verified.is_ok()
        },
    );
}

#[test]
fn object_answers() {
    let runtime = runtime();
    let mut corpus = vec![
        small_frame(
            &runtime,
            &FetchHeader::Bytes {
                size: 1 << 30,
                len: 8 << 20,
            },
        ),
        small_frame(
            &runtime,
            &FetchHeader::Error {
                code: FetchErrorCode::NotFound,
                message: "not here".to_owned(),
            },
        ),
    ];
    for answer in [
        StoreAnswer::Stored {
            id: ObjectId([5; 32]),
        },
        StoreAnswer::Released { existed: true },
        StoreAnswer::Owners {
            trials: vec![trial(1), trial(2), trial(3)],
            drivers: vec!["driver-a".to_owned(), "driver-b".to_owned()],
        },
        StoreAnswer::Error {
            code: FetchErrorCode::Refused,
            message: "store full".to_owned(),
        },
    ] {
        corpus.push(small_frame(&runtime, &answer));
    }
    let target = Target {
        name: "object answer (FetchHeader, StoreAnswer)",
        cases: 3000,
        limit: 2 * MAX_REQUEST_BYTES,
        per_input_byte: 0,
    };
    run(
        &target,
        bytes_and_mutations(corpus, NO_TOKENS, 256),
        |bytes| {
            let header = runtime.block_on(object_wire::read_small::<FetchHeader>(&mut &bytes[..]));
            let answer = runtime.block_on(object_wire::read_small::<StoreAnswer>(&mut &bytes[..]));
            header.is_ok() || answer.is_ok()
        },
    );
}

/// The node's side of the local channel: the prefix checked, then the body read
/// and decoded (`node::objects::local` does exactly this).
fn read_local<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, object_wire::WireError> {
    let prefix: [u8; 4] = bytes
        .get(..4)
        .and_then(|prefix| prefix.try_into().ok())
        .ok_or_else(|| object_wire::WireError::Io(std::io::ErrorKind::UnexpectedEof.into()))?;
    let len = object_wire::local_length(prefix)?;
    let mut body = vec![0u8; len];
    let available = &bytes[4..];
    if available.len() < len {
        return Err(object_wire::WireError::Io(
            std::io::ErrorKind::UnexpectedEof.into(),
        ));
    }
    body.copy_from_slice(&available[..len]);
    object_wire::decode_local(&body)
}

#[test]
fn local_channel_messages() {
    let requests = [
        LocalOp::Put {
            path: "/work/trial-3/out/model.bin".into(),
        },
        LocalOp::Get {
            id: ObjectId([6; 32]),
        },
        LocalOp::Delete {
            id: ObjectId([7; 32]),
        },
        LocalOp::Capability,
    ]
    .into_iter()
    .map(|op| LocalRequest {
        secret: [8; 32],
        op,
    })
    .map(|request| object_wire::encode_local(&request).expect("encodes"));
    let responses = [
        LocalResponse::Stored {
            id: ObjectId([6; 32]),
            size: 1 << 20,
        },
        LocalResponse::Got {
            path: "/work/trial-3/objects/abc".into(),
            size: 1 << 20,
        },
        LocalResponse::Released { existed: false },
        LocalResponse::Error {
            message: "outside the worker's lane".to_owned(),
        },
        LocalResponse::Capability(Box::new(capability())),
    ]
    .into_iter()
    .map(|response| object_wire::encode_local(&response).expect("encodes"));
    let corpus = requests.chain(responses).collect();
    let target = Target {
        name: "local object channel (LocalRequest, LocalResponse)",
        cases: 3000,
        limit: 2 * MAX_LOCAL_MESSAGE,
        per_input_byte: 0,
    };
    run(
        &target,
        bytes_and_mutations(corpus, NO_TOKENS, 256),
        |bytes| {
            let request = read_local::<LocalRequest>(bytes);
            let response = read_local::<LocalResponse>(bytes);
            request.is_ok() || response.is_ok()
        },
    );
}

#[test]
fn local_channel_prefixes_set_huge_are_refused() {
    for announced in [u32::MAX, MAX_LOCAL_MESSAGE as u32 + 1] {
        let (result, peak) = super::measure(|| object_wire::local_length(announced.to_le_bytes()));
        assert!(
            matches!(result, Err(object_wire::WireError::TooLarge { .. })),
            "{result:?}"
        );
        assert_eq!(peak, 0, "a refused prefix allocates nothing");
    }
    let runtime = runtime();
    let bytes = u32::MAX.to_le_bytes();
    let (result, peak) = super::measure(|| {
        runtime.block_on(object_wire::read_small::<ObjectRequest>(&mut &bytes[..]))
    });
    assert!(
        matches!(result, Err(object_wire::WireError::TooLarge { .. })),
        "{result:?}"
    );
    assert!(peak < 64 << 10, "held {peak} bytes");
}

fn rank_address(rank: u32) -> RankAddress {
    RankAddress {
        rank,
        host: format!("10.0.0.{}", rank + 1),
        port: 40_000 + rank as u16,
        machine: format!("machine-{rank}"),
        cert_sha256: Some([rank as u8; 32]),
        shm_port: Some(41_000),
        nccl_capable: rank == 0,
        nccl_id: (rank == 0).then(|| vec![3u8; rendezvous::NCCL_UNIQUE_ID_BYTES]),
    }
}

#[test]
fn rendezvous_messages() {
    let runtime = runtime();
    let corpus = [
        StoreMessage::Arrive {
            token: [1; 32],
            address: rank_address(1),
        },
        StoreMessage::Table((0..4).map(rank_address).collect()),
        StoreMessage::Failed("rank 3 did not arrive".to_owned()),
    ]
    .iter()
    .map(|message| rendezvous::encode_message(message).expect("encodes"))
    .collect();
    let target = Target {
        name: "rendezvous (StoreMessage)",
        cases: 3000,
        limit: 2 * rendezvous::MAX_MESSAGE,
        per_input_byte: 0,
    };
    run(
        &target,
        bytes_and_mutations(corpus, NO_TOKENS, 256),
        |bytes| {
            runtime
                .block_on(rendezvous::read_message(&mut &bytes[..]))
                .is_ok()
        },
    );
    let huge = u32::MAX.to_be_bytes();
    let (result, peak) =
        super::measure(|| runtime.block_on(rendezvous::read_message(&mut &huge[..])));
    assert!(result.is_err());
    assert!(peak < 64 << 10, "held {peak} bytes");
}

/// Regression: a 10-byte `StoreAnswer::Owners` announcing 2^32 - 1 trials made
/// serde reserve 1 MiB of them before reading one, 256 times the 4 KiB limit
/// of the object channel (found by `object_answers`; fixed by `wire_seq`).
#[test]
fn announced_sequence_lengths_reserve_nothing_on_small_channels() {
    let runtime = runtime();
    // Variant 3 (`Owners`), then a u32 varint length of 2^32 - 1 and no element.
    let body = [3u8, 0xfc, 0xff, 0xff, 0xff, 0xff];
    let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(&body);
    let (result, peak) = super::measure(|| {
        runtime.block_on(object_wire::read_small::<StoreAnswer>(&mut &bytes[..]))
    });
    assert!(result.is_err(), "{result:?}");
    assert!(peak <= 2 * MAX_REQUEST_BYTES, "held {peak} bytes");
    // The rendezvous table (variant 1) and a rank 0 address's NCCL id.
    let body = [1u8, 0xfc, 0xff, 0xff, 0xff, 0xff];
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&body);
    let (result, peak) =
        super::measure(|| runtime.block_on(rendezvous::read_message(&mut &bytes[..])));
    assert!(result.is_err());
    assert!(peak <= 2 * rendezvous::MAX_MESSAGE, "held {peak} bytes");
    let mut arrive = rendezvous::encode_message(&StoreMessage::Arrive {
        token: [1; 32],
        address: rank_address(0),
    })
    .expect("encodes");
    // The NCCL id is the address's last field: its length prefix (128) sits
    // 129 bytes from the end; announce 2^32 - 1 bytes there and cut the rest.
    let at = arrive.len() - rendezvous::NCCL_UNIQUE_ID_BYTES - 1;
    arrive.truncate(at);
    arrive.extend_from_slice(&[0xfc, 0xff, 0xff, 0xff, 0xff]);
    let len = (arrive.len() - 4) as u32;
    arrive[..4].copy_from_slice(&len.to_be_bytes());
    let (result, peak) =
        super::measure(|| runtime.block_on(rendezvous::read_message(&mut &arrive[..])));
    assert!(result.is_err());
    assert!(peak <= 2 * rendezvous::MAX_MESSAGE, "held {peak} bytes");
}
