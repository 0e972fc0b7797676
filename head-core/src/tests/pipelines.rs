//! Tests of pipelines in the core: upstream triggers in the same step, inputs
//! resolved into the launch, a failed stage cancelling only its descendants,
//! cache identity across submissions, retry selection, the critical path's
//! urgency, and a restart releasing a stage whose need finished while the head
//! was down.

use xp_runtime::ids::ObjectId;
use xp_runtime::protocol::{
    CheckpointFile, HeadCommand, PipelineSubmit, Program, StageState, WorkerReport,
};
use xp_runtime::spec::PipelineSpec;

use super::*;

const THREE: &str = "name: digits\nteam: vision\nstages:\n  prepare:\n    trial: {command: [sh, -c, 'echo 42 > $XP_OUTPUT_DIR/n.txt']}\n  sweep:\n    needs: [prepare]\n    trial: {command: [sh, -c, 'cat {prepare.outputs}/n.txt; echo {x}']}\n    search: {algorithm: grid, space: {x: {choice: [1, 2, 3]}}, metric: y, mode: max}\n  evaluate:\n    needs: [sweep]\n    trial: {command: [echo, 'best x = {sweep.best.params.x}']}\n";

fn submit_pipeline(core: &mut HeadCore, now: u64, yaml: &str) -> (u64, u32) {
    let spec = PipelineSpec::from_yaml(yaml).unwrap();
    let (id, _, reused) = core
        .submit_pipeline(
            now,
            &PipelineSubmit {
                spec_json: spec.to_canonical_json(),
                code_version: "none".to_owned(),
                data_version: "none".to_owned(),
            },
        )
        .unwrap();
    (id, reused)
}

fn stage_states(core: &HeadCore, id: u64) -> Vec<(String, StageState)> {
    core.pipelines_status(0, Some(id), &|_| true).unwrap()[0]
        .stages
        .iter()
        .map(|stage| (stage.name.clone(), stage.state))
        .collect()
}

fn state_of(core: &HeadCore, id: u64, stage: &str) -> StageState {
    stage_states(core, id)
        .into_iter()
        .find(|(name, _)| name == stage)
        .unwrap()
        .1
}

/// Runs every launched worker to its end: rank 0 of a command containing
/// `fail` exits 1, others report `y` = their `x` and, when `outputs`, a file.
fn run_launched(core: &mut HeadCore, now: u64, node: NodeId) -> Vec<Vec<String>> {
    let launched: Vec<_> = commands(core)
        .into_iter()
        .filter_map(|(_, command)| match command {
            HeadCommand::Launch(launch) => Some(launch),
            _ => None,
        })
        .collect();
    let mut argvs = Vec::new();
    for launch in launched {
        let key = launch.key;
        let Program::Command { argv } = &launch.program else {
            panic!("command trials only")
        };
        argvs.push(argv.clone());
        let config: serde_json::Value = serde_json::from_str(&launch.config_json).unwrap();
        report(core, now, node, WorkerReport::Started { key, pid: 1 });
        if let Some(x) = config.get("x").and_then(serde_json::Value::as_f64) {
            report(
                core,
                now,
                node,
                WorkerReport::Metric {
                    key,
                    index: 1,
                    step: Some(1),
                    values: vec![("y".to_owned(), x)],
                },
            );
        }
        let fails = argv.iter().any(|arg| arg.contains("fail"));
        if !fails {
            report(
                core,
                now,
                node,
                WorkerReport::Outputs {
                    key,
                    files: vec![CheckpointFile {
                        name: "n.txt".to_owned(),
                        object: ObjectId([7; 32]),
                        size: 3,
                    }],
                    error: None,
                },
            );
        }
        report(
            core,
            now,
            node,
            WorkerReport::Exited {
                key,
                code: Some(if fails { 1 } else { 0 }),
                signal: None,
            },
        );
    }
    argvs
}

#[test]
fn stages_start_when_their_needs_succeed_with_inputs_resolved() {
    let (mut core, node) = cluster(0, 16);
    let (id, reused) = submit_pipeline(&mut core, 1, THREE);
    assert_eq!(reused, 0);
    assert_eq!(
        stage_states(&core, id),
        [
            ("prepare".to_owned(), StageState::Running),
            ("sweep".to_owned(), StageState::Waiting),
            ("evaluate".to_owned(), StageState::Waiting),
        ]
    );
    let status = &core.pipelines_status(1, Some(id), &|_| true).unwrap()[0];
    assert_eq!(status.stages[1].reason, "waiting for `prepare`");
    assert_eq!(status.critical_path, ["prepare", "sweep", "evaluate"]);
    // Prepare's exit releases the sweep in the same step: its launches carry
    // prepare's output as an input directory, its argv the node's marker.
    run_launched(&mut core, 2, node);
    assert_eq!(state_of(&core, id, "prepare"), StageState::Succeeded);
    assert_eq!(state_of(&core, id, "sweep"), StageState::Running);
    let launches: Vec<_> = std::iter::from_fn(|| core.poll_command()).collect();
    let sweep_launches: Vec<_> = launches
        .iter()
        .filter_map(|(_, command)| match command {
            HeadCommand::Launch(launch) => Some(launch.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(sweep_launches.len(), 3);
    let input = &sweep_launches[0].inputs[0];
    assert_eq!(input.name, "prepare.outputs");
    assert_eq!(input.files[0].object, ObjectId([7; 32]));
    assert_eq!(
        input.sources.len(),
        1,
        "the node that reported the output holds it"
    );
    let Program::Command { argv } = &sweep_launches[0].program else {
        panic!()
    };
    assert!(input.marker.starts_with("{xp-input:prepare.outputs:"));
    assert!(
        argv[2].contains(&format!("cat {}/n.txt", input.marker)),
        "{argv:?}"
    );
    // Put the launches back and run them: the best x (3) goes to evaluate.
    for (node, command) in launches {
        core.outbox.send(node, command);
    }
    run_launched(&mut core, 3, node);
    assert_eq!(state_of(&core, id, "sweep"), StageState::Succeeded);
    let argvs = run_launched(&mut core, 4, node);
    assert_eq!(argvs, [vec!["echo".to_owned(), "best x = 3".to_owned()]]);
    assert_eq!(state_of(&core, id, "evaluate"), StageState::Succeeded);
    let status = &core.pipelines_status(5, Some(id), &|_| true).unwrap()[0];
    assert_eq!(status.state, "succeeded");
    assert_eq!(status.stages[2].inputs[0].value, "3");
}

#[test]
fn a_resubmission_reuses_unchanged_stages_and_reruns_the_changed_one() {
    let (mut core, node) = cluster(0, 16);
    let (first, _) = submit_pipeline(&mut core, 1, THREE);
    for now in 2..5 {
        run_launched(&mut core, now, node);
    }
    assert_eq!(
        core.pipelines_status(5, Some(first), &|_| true).unwrap()[0].state,
        "succeeded"
    );
    let changed = THREE.replace("best x = ", "the best x is ");
    let (second, reused) = submit_pipeline(&mut core, 6, &changed);
    assert_eq!(reused, 2);
    assert_eq!(
        stage_states(&core, second),
        [
            ("prepare".to_owned(), StageState::Reused),
            ("sweep".to_owned(), StageState::Reused),
            ("evaluate".to_owned(), StageState::Running),
        ]
    );
    let status = &core.pipelines_status(6, Some(second), &|_| true).unwrap()[0];
    let from = status.stages[1].reused_from.as_ref().unwrap();
    assert_eq!((from.pipeline, from.stage.as_str()), (first, "sweep"));
    let argvs = run_launched(&mut core, 7, node);
    assert_eq!(
        argvs,
        [vec!["echo".to_owned(), "the best x is 3".to_owned()]]
    );
    // The same file again: everything is reused, nothing runs.
    let (third, reused) = submit_pipeline(&mut core, 8, THREE);
    assert_eq!(reused, 3);
    assert_eq!(
        core.pipelines_status(8, Some(third), &|_| true).unwrap()[0].state,
        "succeeded"
    );
    assert!(launches(&commands(&mut core)).is_empty());
}

const BRANCHES: &str = "name: branches\nstages:\n  a:\n    trial: {command: [echo, a]}\n  b:\n    needs: [a]\n    trial: {command: [sh, -c, 'test -e /tmp/flag || fail']}\n  c:\n    needs: [b]\n    trial: {command: [echo, c]}\n  d:\n    needs: [a]\n    trial: {command: [echo, d]}\n";

#[test]
fn a_failed_stage_cancels_its_descendants_only_and_retry_reruns_just_them() {
    let (mut core, node) = cluster(0, 16);
    let (id, _) = submit_pipeline(&mut core, 1, BRANCHES);
    run_launched(&mut core, 2, node);
    run_launched(&mut core, 3, node);
    assert_eq!(
        stage_states(&core, id),
        [
            ("a".to_owned(), StageState::Succeeded),
            ("b".to_owned(), StageState::Failed),
            ("d".to_owned(), StageState::Succeeded),
            ("c".to_owned(), StageState::Cancelled),
        ]
    );
    let status = &core.pipelines_status(3, Some(id), &|_| true).unwrap()[0];
    assert_eq!(status.stages[3].reason, "needs `b`, which failed");
    assert_eq!(status.state, "failed");
    // The retry puts back only b and c; a and d keep their experiments.
    let experiments_before: Vec<_> = status.stages.iter().map(|s| s.experiment).collect();
    assert_eq!(core.retry_pipeline(4, id).unwrap(), 2);
    assert_eq!(state_of(&core, id, "b"), StageState::Running);
    assert_eq!(state_of(&core, id, "c"), StageState::Waiting);
    let status = &core.pipelines_status(4, Some(id), &|_| true).unwrap()[0];
    assert_eq!(status.stages[0].experiment, experiments_before[0]);
    assert_eq!(status.stages[2].experiment, experiments_before[2]);
    assert_ne!(status.stages[1].experiment, experiments_before[1]);
    let rerun = run_launched(&mut core, 5, node);
    assert_eq!(rerun.len(), 1, "only b runs again");
}

#[test]
fn cancel_stops_running_and_waiting_stages() {
    let (mut core, _node) = cluster(0, 16);
    let (id, _) = submit_pipeline(&mut core, 1, THREE);
    let _ = commands(&mut core);
    assert_eq!(core.cancel_pipeline(2, id).unwrap(), 3);
    assert!(
        stage_states(&core, id)
            .iter()
            .all(|(_, state)| *state == StageState::Cancelled)
    );
    assert_eq!(
        core.pipelines_status(2, Some(id), &|_| true).unwrap()[0].state,
        "cancelled"
    );
    assert!(matches!(
        core.cancel_pipeline(2, 99),
        Err(CoreError::PipelineNotFound { pipeline: 99 })
    ));
}

#[test]
fn stages_on_the_critical_path_get_urgency() {
    let (mut core, _node) = cluster(0, 16);
    let yaml = "name: wide\nstages:\n  long:\n    trial: {command: [echo, l]}\n    estimate: 1h\n  short:\n    trial: {command: [echo, s]}\n    estimate: 1m\n  last:\n    needs: [long, short]\n    trial: {command: [echo, x]}\n    estimate: 1m\n";
    let (id, _) = submit_pipeline(&mut core, 1, yaml);
    let status = &core.pipelines_status(1, Some(id), &|_| true).unwrap()[0];
    assert_eq!(status.critical_path, ["long", "last"]);
    assert_eq!(status.remaining_s, Some(3660.0));
    assert_eq!(status.estimated_finish, Some(1 + 3_660_000));
    let experiment_of = |name: &str| {
        status
            .stages
            .iter()
            .find(|stage| stage.name == name)
            .unwrap()
            .experiment
            .unwrap()
    };
    let trial = |experiment| TrialId {
        experiment,
        index: 0,
    };
    assert_eq!(core.pipeline_urgency(trial(experiment_of("long"))), 1);
    assert_eq!(core.pipeline_urgency(trial(experiment_of("short"))), 0);
}

#[test]
fn a_stage_whose_need_finished_while_the_head_was_down_is_released_on_load() {
    let (mut core, node) = cluster(0, 16);
    let (id, _) = submit_pipeline(&mut core, 1, THREE);
    let mut stored = core.take_records();
    // Prepare finishes; the pipeline's record of it is lost with the head, as if
    // the head stopped between storing the trial and advancing the pipeline.
    run_launched(&mut core, 2, node);
    stored.extend(
        core.take_records()
            .into_iter()
            .filter(|record| !matches!(record, Record::Pipeline(_))),
    );
    let mut restarted = HeadCore::restore(CONFIG, loaded_from(stored), 10);
    assert_eq!(state_of(&restarted, id, "prepare"), StageState::Running);
    restarted.handle_node_register(11, registration(node, 0, 16, Vec::new()));
    assert_eq!(state_of(&restarted, id, "prepare"), StageState::Succeeded);
    assert_eq!(state_of(&restarted, id, "sweep"), StageState::Running);
}

#[test]
fn pipeline_requests_are_authorized_against_the_pipelines_team() {
    use crate::auth::access::Scope;
    use crate::auth::{self, Principal, Role, Target};
    use crate::requests::access as access_of;
    use xp_runtime::protocol::Request;

    let (mut core, _node) = cluster(0, 16);
    let (id, _) = submit_pipeline(&mut core, 1, THREE);
    let user = |team: &str, role| Principal::User {
        name: format!("{team}-{role}"),
        team: team.to_owned(),
        role,
    };
    let judge = |principal: &Principal, request: Request| {
        let access = access_of(&request);
        let resolved = core.resolve_scope(principal, &access.scope)?;
        let team = resolved.team.expect("a pipeline names its team");
        auth::authorize(principal, access.action, Target::Team(&team)).map_err(|refusal| {
            CoreError::InvalidSpec(xp_runtime::spec::SpecError::Parse {
                message: refusal.to_string(),
            })
        })
    };
    let status = || Request::PipelineStatus { pipeline: Some(id) };
    let cancel = || Request::CancelPipeline { pipeline: id };
    let retry = || Request::RetryPipeline { pipeline: id };
    assert!(judge(&user("vision", Role::Viewer), status()).is_ok());
    assert!(judge(&user("vision", Role::Viewer), cancel()).is_err());
    assert!(judge(&user("vision", Role::Member), cancel()).is_ok());
    assert!(judge(&user("vision", Role::Member), retry()).is_ok());
    assert!(judge(&user("nlp", Role::Member), retry()).is_err());
    assert!(judge(&user("nlp", Role::Viewer), status()).is_err());
    assert!(matches!(
        core.resolve_scope(&user("vision", Role::Viewer), &Scope::Pipeline(99)),
        Err(CoreError::PipelineNotFound { pipeline: 99 })
    ));
    let submit = Request::SubmitPipeline(PipelineSubmit {
        spec_json: PipelineSpec::from_yaml(THREE).unwrap().to_canonical_json(),
        code_version: String::new(),
        data_version: String::new(),
    });
    assert_eq!(
        access_of(&submit).scope,
        Scope::Submit {
            team: "vision".to_owned()
        }
    );
}

#[test]
fn a_reference_to_something_the_upstream_did_not_produce_fails_the_stage_saying_so() {
    let (mut core, node) = cluster(0, 16);
    let yaml = "name: refs\nstages:\n  a:\n    trial: {command: [echo, a]}\n  b:\n    needs: [a]\n    trial: {command: [ls, '{a.checkpoint}']}\n  c:\n    needs: [a]\n    trial: {command: [echo, '{a.best.metrics.loss}']}\n";
    let (id, _) = submit_pipeline(&mut core, 1, yaml);
    run_launched(&mut core, 2, node);
    let status = &core.pipelines_status(2, Some(id), &|_| true).unwrap()[0];
    let reason = |name: &str| {
        let stage = status
            .stages
            .iter()
            .find(|stage| stage.name == name)
            .unwrap();
        (stage.state, stage.reason.clone())
    };
    assert_eq!(
        reason("b"),
        (StageState::Failed, "`a` kept no checkpoint".to_owned())
    );
    assert_eq!(
        reason("c"),
        (
            StageState::Failed,
            "`a` produced no value for {a.best.metrics.loss}".to_owned()
        )
    );
    assert_eq!(status.state, "failed");
}

const ONE: &str = "name: one\nteam: vision\nstages:\n  a:\n    trial: {command: [echo, a]}\n";

/// Runs every launched worker to success, reporting `values` as its metrics.
fn succeed_launched(core: &mut HeadCore, now: u64, node: NodeId, values: &[(&str, f64)]) {
    let launched: Vec<_> = commands(core)
        .into_iter()
        .filter_map(|(_, command)| match command {
            HeadCommand::Launch(launch) => Some(launch.key),
            _ => None,
        })
        .collect();
    for key in launched {
        report(core, now, node, WorkerReport::Started { key, pid: 1 });
        report(
            core,
            now,
            node,
            WorkerReport::Metric {
                key,
                index: 1,
                step: Some(1),
                values: values
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), *value))
                    .collect(),
            },
        );
        report(
            core,
            now,
            node,
            WorkerReport::Exited {
                key,
                code: Some(0),
                signal: None,
            },
        );
    }
}

/// What a restarted head loads of `records`' pipelines: each written and read
/// back as the registry stores it (JSON), with the next id the registry
/// derives from the largest key, `next_pipeline_id`.
fn reloaded_pipelines(records: Vec<Record>, next_pipeline_id: u64) -> LoadedState {
    let pipelines = records
        .into_iter()
        .filter_map(|record| match record {
            Record::Pipeline(pipeline) => Some(pipeline),
            _ => None,
        })
        .map(|pipeline| serde_json::from_slice(&serde_json::to_vec(&pipeline).unwrap()).unwrap())
        .collect();
    LoadedState {
        pipelines,
        next_pipeline_id,
        ..LoadedState::default()
    }
}

#[test]
fn a_nan_metric_survives_storage_and_no_pipeline_id_is_given_twice() {
    let (mut core, node) = cluster(0, 16);
    let (id, _) = submit_pipeline(&mut core, 1, ONE);
    succeed_launched(&mut core, 2, node, &[("loss", f64::NAN), ("acc", 0.5)]);
    assert_eq!(state_of(&core, id, "a"), StageState::Succeeded);
    let loaded = reloaded_pipelines(core.take_records(), id + 1);
    let restarted = HeadCore::restore(CONFIG, loaded, 10);
    let status = &restarted.pipelines_status(10, Some(id), &|_| true).unwrap()[0];
    let metrics: BTreeMap<String, f64> = status.stages[0].best_metrics.iter().cloned().collect();
    assert!(metrics["loss"].is_nan(), "{metrics:?}");
    assert_eq!(metrics["acc"], 0.5);
    // A record the head can no longer read still holds its id: the registry
    // gives the next id past it (its own test), and the core keeps to that.
    let mut restarted = HeadCore::restore(CONFIG, reloaded_pipelines(Vec::new(), id + 2), 20);
    let (next, _) = submit_pipeline(&mut restarted, 21, ONE);
    assert_eq!(next, id + 2);
}

#[test]
fn a_team_never_reuses_another_teams_stage() {
    let (mut core, node) = cluster(0, 16);
    let (first, _) = submit_pipeline(&mut core, 1, ONE);
    succeed_launched(&mut core, 2, node, &[]);
    assert_eq!(state_of(&core, first, "a"), StageState::Succeeded);
    let (other, reused) = submit_pipeline(&mut core, 3, &ONE.replace("vision", "nlp"));
    assert_eq!(reused, 0);
    assert_eq!(state_of(&core, other, "a"), StageState::Running);
    let (same, reused) = submit_pipeline(&mut core, 4, ONE);
    assert_eq!(reused, 1);
    assert_eq!(state_of(&core, same, "a"), StageState::Reused);
}

#[test]
fn a_stage_refused_for_too_many_pending_trials_waits_and_starts_later() {
    use xp_runtime::protocol::{AdminAction, AdminRequest};

    // No node: submitted trials stay pending.
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    core.handle_admin(
        0,
        AdminRequest {
            action: AdminAction::ApplyPolicy {
                yaml: "queues: [{name: qv, team: vision}]\nadmission: {max_pending_per_team: 2, retry_after: 1s}\n"
                    .to_owned(),
            },
            who: "alice".to_owned(),
            why: "testing".to_owned(),
        },
    )
    .unwrap();
    let blocker = submit(
        &mut core,
        1,
        "name: two\nteam: vision\ntrial: {command: [sleep, '{s}']}\nsearch: {algorithm: grid, space: {s: {choice: [1, 2]}}}\n",
        false,
    );
    let (id, _) = submit_pipeline(&mut core, 2, ONE);
    let status = &core.pipelines_status(2, Some(id), &|_| true).unwrap()[0];
    assert_eq!(status.stages[0].state, StageState::Waiting);
    assert!(
        status.stages[0].reason.contains("waiting to be admitted"),
        "{:?}",
        status.stages[0].reason
    );
    core.handle_tick(3);
    assert_eq!(state_of(&core, id, "a"), StageState::Waiting);
    core.handle_cancel(4, &blocker.to_string()).unwrap();
    core.handle_tick(5);
    assert_eq!(state_of(&core, id, "a"), StageState::Running);
}

#[test]
fn a_one_stage_pipeline_gets_no_urgency_and_the_path_moves_as_stages_finish() {
    let (mut core, node) = cluster(0, 16);
    let (lone, _) = submit_pipeline(&mut core, 1, ONE);
    let experiment_of = |core: &HeadCore, id: u64, name: &str| {
        core.pipelines_status(1, Some(id), &|_| true).unwrap()[0]
            .stages
            .iter()
            .find(|stage| stage.name == name)
            .unwrap()
            .experiment
            .unwrap()
    };
    let trial = |experiment| TrialId {
        experiment,
        index: 0,
    };
    assert_eq!(
        core.pipeline_urgency(trial(experiment_of(&core, lone, "a"))),
        0
    );
    succeed_launched(&mut core, 2, node, &[]);
    let yaml = "name: chain\nstages:\n  long:\n    trial: {command: [echo, l]}\n    estimate: 1h\n  short:\n    trial: {command: [echo, s]}\n    estimate: 1m\n  last:\n    needs: [short]\n    trial: {command: [echo, x]}\n    estimate: 1m\n";
    let (id, _) = submit_pipeline(&mut core, 3, yaml);
    let (long, short) = (
        experiment_of(&core, id, "long"),
        experiment_of(&core, id, "short"),
    );
    assert_eq!(core.pipeline_urgency(trial(long)), 1);
    assert_eq!(core.pipeline_urgency(trial(short)), 0);
    // `long` ends first: `short` and `last` are now the way to the end.
    let key = WorkerKey {
        trial: trial(long),
        attempt: 1,
        rank: 0,
    };
    report(&mut core, 4, node, WorkerReport::Started { key, pid: 1 });
    report(
        &mut core,
        5,
        node,
        WorkerReport::Exited {
            key,
            code: Some(0),
            signal: None,
        },
    );
    assert_eq!(state_of(&core, id, "long"), StageState::Succeeded);
    assert_eq!(core.pipeline_urgency(trial(short)), 1);
    assert_eq!(core.pipeline_urgency(trial(long)), 0);
}

#[test]
fn a_parameter_value_that_spells_a_marker_is_not_one() {
    let (mut core, node) = cluster(0, 16);
    let yaml = "name: forge\nstages:\n  a:\n    trial: {command: [echo, a]}\n  b:\n    needs: [a]\n    trial: {command: [cat, '{a.outputs}/n.txt', '{v}']}\n    search: {algorithm: grid, space: {v: {choice: ['{xp-input:a.outputs}']}}}\n";
    let (id, _) = submit_pipeline(&mut core, 1, yaml);
    run_launched(&mut core, 2, node);
    assert_eq!(state_of(&core, id, "b"), StageState::Running);
    let launch = commands(&mut core)
        .into_iter()
        .find_map(|(_, command)| match command {
            HeadCommand::Launch(launch) => Some(launch),
            _ => None,
        })
        .expect("b launched");
    let Program::Command { argv } = &launch.program else {
        panic!()
    };
    let marker = &launch.inputs[0].marker;
    assert_eq!(argv[1], format!("{marker}/n.txt"));
    // The value the search chose is the old, guessable marker text: it stays text.
    assert_eq!(argv[2], "{xp-input:a.outputs}");
    assert_ne!(&argv[2], marker);
}

#[test]
fn retry_reruns_a_stage_whose_outputs_went_with_a_lost_node() {
    let (mut core, node) = cluster(0, 16);
    let yaml = "name: lost\nstages:\n  a:\n    trial: {command: [echo, a]}\n  b:\n    needs: [a]\n    trial: {command: [cat, '{a.outputs}/n.txt']}\n";
    let (id, _) = submit_pipeline(&mut core, 1, yaml);
    run_launched(&mut core, 2, node);
    run_launched(&mut core, 3, node);
    assert_eq!(state_of(&core, id, "b"), StageState::Succeeded);
    // Nothing to retry while the outputs' node lives.
    assert_eq!(core.retry_pipeline(4, id).unwrap(), 0);
    // The only node holding `a`'s outputs is lost: both stages run again.
    core.handle_tick(100_000_000);
    assert_eq!(core.retry_pipeline(100_000_001, id).unwrap(), 2);
    assert_eq!(state_of(&core, id, "a"), StageState::Running);
    assert_eq!(state_of(&core, id, "b"), StageState::Waiting);
    // A new pipeline does not reuse the lost result either.
    let (again, reused) = submit_pipeline(&mut core, 100_000_002, yaml);
    assert_eq!(reused, 0);
    assert_eq!(state_of(&core, again, "a"), StageState::Running);
}

#[test]
fn many_upstream_files_are_shown_briefly_and_too_many_fail_the_stage_saying_so() {
    let (mut core, node) = cluster(0, 16);
    let yaml = "name: many\nstages:\n  a:\n    trial: {command: [echo, a]}\n  b:\n    needs: [a]\n    trial: {command: [ls, '{a.outputs}']}\n";
    let run_a = |core: &mut HeadCore, now: u64, count: usize| {
        let key = commands(core)
            .into_iter()
            .find_map(|(_, command)| match command {
                HeadCommand::Launch(launch) => Some(launch.key),
                _ => None,
            })
            .expect("a launched");
        report(core, now, node, WorkerReport::Started { key, pid: 1 });
        let files = (0..count)
            .map(|index| CheckpointFile {
                name: format!("file-{index:05}"),
                object: ObjectId([(index % 200) as u8; 32]),
                size: 1,
            })
            .collect();
        report(
            core,
            now,
            node,
            WorkerReport::Outputs {
                key,
                files,
                error: None,
            },
        );
        report(
            core,
            now,
            node,
            WorkerReport::Exited {
                key,
                code: Some(0),
                signal: None,
            },
        );
    };
    let (id, _) = submit_pipeline(&mut core, 1, yaml);
    run_a(&mut core, 2, 12);
    assert_eq!(state_of(&core, id, "b"), StageState::Running);
    let status = &core.pipelines_status(3, Some(id), &|_| true).unwrap()[0];
    let shown = &status.stages[1].inputs[0].value;
    assert!(shown.starts_with("12 file(s): file-00000, "), "{shown}");
    assert!(shown.ends_with("file-00009, … (first 10)"), "{shown}");
    // Drop the first pipeline's launch of `b`.
    commands(&mut core);
    let (id, _) = submit_pipeline(
        &mut core,
        4,
        &yaml
            .replace("many", "more")
            .replace("[echo, a]", "[echo, aa]"),
    );
    run_a(&mut core, 5, 10_001);
    assert_eq!(
        state_of(&core, id, "b"),
        StageState::Failed,
        "{:?}",
        core.pipelines_status(6, Some(id), &|_| true).unwrap()[0].stages
    );
    let status = &core.pipelines_status(6, Some(id), &|_| true).unwrap()[0];
    assert!(
        status.stages[1]
            .reason
            .contains("more than a launch carries"),
        "{}",
        status.stages[1].reason
    );
}
