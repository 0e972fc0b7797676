//! Tests of `xp checkpoints` in pages: pages in any size walk the whole list
//! once, in order, and a cursor from elsewhere neither repeats nor fails.

use xp_runtime::protocol::{CheckpointCursor, CheckpointFile, CheckpointsPage};

use super::*;

/// Four trials of three kept checkpoints each, all running on one node.
const FOUR_CHECKPOINTED: &str = "name: ck4\ntrial: {command: [train, '{x}'], resources: {cpu: 1}}\nsearch: {algorithm: grid, space: {x: {choice: [1, 2, 3, 4]}}}\ncheckpoints: {keep_last: 3, keep_best: 0}\n";

/// Submits [`FOUR_CHECKPOINTED`] on a node of four slots, starts its four
/// trials and files a checkpoint at each of `steps` of each, with the files
/// `files(trial index, step)` names; returns the experiment's id as text.
fn checkpointed(
    steps: &[u64],
    files: impl Fn(usize, u64) -> Vec<CheckpointFile>,
) -> (HeadCore, String) {
    let (mut core, node) = cluster(0, 4);
    let experiment = submit(&mut core, 1, FOUR_CHECKPOINTED, false);
    let launched = launches(&commands(&mut core));
    assert_eq!(launched.len(), 4);
    for (index, (_, key)) in launched.iter().enumerate() {
        let started = WorkerReport::Started { key: *key, pid: 1 };
        report(&mut core, 2, node, started);
        for &step in steps {
            let checkpoint = WorkerReport::Checkpoint {
                key: *key,
                step,
                files: files(index, step),
                backup: None,
                take_ms: 1,
            };
            report(&mut core, 3, node, checkpoint);
        }
    }
    (core, experiment.to_string())
}

/// The (trial index, step) of each checkpoint.
fn keys(page: &CheckpointsPage) -> Vec<(u32, u64)> {
    page.checkpoints
        .iter()
        .map(|checkpoint| (checkpoint.trial.index, checkpoint.step))
        .collect()
}

/// Every page of `experiment`'s checkpoints `limit` at a time, joined.
fn all_pages(core: &HeadCore, experiment: &str, limit: u32) -> Vec<(u32, u64)> {
    let mut joined = Vec::new();
    let mut after = None;
    for _ in 0..100 {
        let page = core.checkpoints_page(experiment, after, limit).unwrap();
        assert!(!page.checkpoints.is_empty(), "no empty page before the end");
        assert!(page.checkpoints.len() <= limit.max(1) as usize);
        joined.extend(keys(&page));
        match page.next {
            Some(next) => after = Some(next),
            None => return joined,
        }
    }
    panic!("the pages never ended");
}

#[test]
fn pages_of_checkpoints_walk_the_whole_list_once_in_order() {
    // Four checkpoints a trial, of which three are kept.
    let (core, id) = checkpointed(&[10, 20, 30, 40], |index, step| {
        let bytes = format!("{index}-{step}");
        vec![CheckpointFile {
            name: "state".to_owned(),
            object: xp_runtime::ids::ObjectId::of(bytes.as_bytes()),
            size: bytes.len() as u64,
        }]
    });
    let whole: Vec<(u32, u64)> = core
        .checkpoints(&id)
        .unwrap()
        .iter()
        .map(|checkpoint| (checkpoint.trial.index, checkpoint.step))
        .collect();
    let expected: Vec<(u32, u64)> = (0..4)
        .flat_map(|trial| [20, 30, 40].map(|step| (trial, step)))
        .collect();
    assert_eq!(whole, expected, "keep_last 3 of each trial, in trial order");
    for limit in [0, 1, 2, 3, 5, 12, 1000, u32::MAX] {
        assert_eq!(all_pages(&core, &id, limit), whole, "pages of {limit}");
    }
    // A page ends inside a trial and the next starts just after it.
    let first = core.checkpoints_page(&id, None, 4).unwrap();
    assert_eq!(keys(&first), [(0, 20), (0, 30), (0, 40), (1, 20)]);
    let next = first.next.unwrap();
    assert_eq!((next.trial.index, next.attempt, next.step), (1, 1, 20));

    // A cursor of another experiment starts this one from its first trial
    // (one before it) or ends it (one after it).
    let before = CheckpointCursor {
        trial: TrialId {
            experiment: ExperimentId { digest: 0, run: 0 },
            index: 7,
        },
        attempt: 9,
        step: 9,
    };
    let from_start = core.checkpoints_page(&id, Some(before), 1000).unwrap();
    assert_eq!(keys(&from_start), whole);
    let beyond = CheckpointCursor {
        trial: TrialId {
            experiment: ExperimentId {
                digest: u64::MAX,
                run: u32::MAX,
            },
            index: 0,
        },
        attempt: 0,
        step: 0,
    };
    let page = core.checkpoints_page(&id, Some(beyond), 1000).unwrap();
    assert!(page.checkpoints.is_empty() && page.next.is_none());
    assert!(core.checkpoints_page("no-such", None, 10).is_err());
}

#[test]
fn a_page_of_large_manifests_ends_near_its_byte_bound() {
    // 2,000 files of 1,000-byte names a checkpoint: about 2 MB each, so two
    // of the twelve fill a page whatever the limit.
    let (core, id) = checkpointed(&[1, 2, 3], |index, step| {
        (0..2000u32)
            .map(|file| CheckpointFile {
                name: format!("{file:0>1000}"),
                object: xp_runtime::ids::ObjectId::of(format!("{index}-{step}-{file}").as_bytes()),
                size: 1,
            })
            .collect()
    });
    let page = core.checkpoints_page(&id, None, 1000).unwrap();
    // As JSON, larger than on the wire.
    let bytes = serde_json::to_vec(&page.checkpoints).unwrap().len();
    assert!(page.next.is_some(), "more than one page");
    assert!(
        (2..=3).contains(&page.checkpoints.len()),
        "{} checkpoints in the page",
        page.checkpoints.len()
    );
    assert!(bytes < 8 << 20, "{bytes} bytes: half a frame");
    assert_eq!(all_pages(&core, &id, 1000).len(), 12);
}
