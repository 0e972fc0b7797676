//! Pipelines in `xp sim`: the trace's dependency graph cut into pipelines, the
//! critical-path boost, and the per-pipeline makespans of the report.
//!
//! A pipeline is a connected part of the dependency graph with at least two
//! jobs (dependencies taken in either direction); a job without dependencies
//! and dependents is no pipeline. Its makespan runs from its first submission
//! to its last job's end, and counts only when every job of it completed.
//!
//! With a boost on, before every `decide` the simulator recomputes, for each
//! pipeline with a job waiting, the critical path ([`crate::dag`]) over
//! estimated durations, and hands the core an `urgency` per waiting job. The
//! estimates never read a job's true duration before it completes: a job's
//! estimate is the median of the last [`MAX_HISTORY`] completed durations of its
//! `kind`, else its declared `estimate_s`, else the mean duration of every job
//! completed so far (0 before the first). A job that was preempted counts its
//! kept progress as elapsed time.

use std::collections::{BTreeSet, VecDeque};

use super::engine::{JobRun, Phase};
use super::report::{PipelineReport, Summary};
use super::trace::Trace;
use crate::dag::{self, DagNode, NodeProgress};

/// Completed durations kept per kind for its median.
pub const MAX_HISTORY: usize = 101;

/// How `xp sim` boosts jobs on their pipeline's critical path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CriticalPathBoost {
    /// No boost: every job has urgency 0.
    #[default]
    Off,
    /// Urgency 1 for the waiting jobs on their pipeline's critical path (no
    /// slack), 0 for the others: within a queue, critical work goes first.
    Critical,
    /// Urgency is a job's tail: the estimated seconds from its start to its
    /// pipeline's end along the longest chain after it. The longest remaining
    /// chain goes first, across pipelines too (list scheduling by critical
    /// path length).
    Rank,
}

/// One pipeline: its jobs and their dependencies in local indices.
#[derive(Debug)]
struct Pipeline {
    /// Trace indexes, in trace order.
    members: Vec<u32>,
    /// Per member, the members it needs.
    needs: Vec<Vec<usize>>,
    /// A topological order of the members; `None` when they form a cycle (such
    /// jobs never start, so there is nothing to boost).
    order: Option<Vec<usize>>,
}

/// The pipelines of a trace.
#[derive(Debug)]
pub(super) struct Pipelines {
    pipelines: Vec<Pipeline>,
    /// The pipeline of each job, `u32::MAX` for a job in none.
    of_job: Vec<u32>,
}

fn find(parent: &mut [u32], mut node: u32) -> u32 {
    while parent[node as usize] != node {
        let grandparent = parent[parent[node as usize] as usize];
        parent[node as usize] = grandparent;
        node = grandparent;
    }
    node
}

impl Pipelines {
    /// Cuts the trace's dependency graph into pipelines.
    pub(super) fn new(trace: &Trace) -> Self {
        let count = trace.jobs.len();
        let mut parent: Vec<u32> = (0..count as u32).collect();
        for (index, job) in trace.jobs.iter().enumerate() {
            for &dep in &job.deps {
                let (a, b) = (find(&mut parent, index as u32), find(&mut parent, dep));
                if a != b {
                    parent[a.max(b) as usize] = a.min(b);
                }
            }
        }
        let mut size = vec![0u32; count];
        for index in 0..count as u32 {
            let root = find(&mut parent, index);
            size[root as usize] += 1;
        }
        let mut pipeline_of_root = vec![u32::MAX; count];
        let mut pipelines: Vec<Pipeline> = Vec::new();
        let mut of_job = vec![u32::MAX; count];
        let mut position = vec![0usize; count];
        for index in 0..count as u32 {
            let root = find(&mut parent, index) as usize;
            if size[root] < 2 {
                continue;
            }
            if pipeline_of_root[root] == u32::MAX {
                pipeline_of_root[root] =
                    u32::try_from(pipelines.len()).expect("fewer pipelines than jobs");
                pipelines.push(Pipeline {
                    members: Vec::new(),
                    needs: Vec::new(),
                    order: None,
                });
            }
            let pipeline = &mut pipelines[pipeline_of_root[root] as usize];
            of_job[index as usize] = pipeline_of_root[root];
            position[index as usize] = pipeline.members.len();
            pipeline.members.push(index);
        }
        for pipeline in &mut pipelines {
            pipeline.needs = pipeline
                .members
                .iter()
                .map(|&job| {
                    trace.jobs[job as usize]
                        .deps
                        .iter()
                        .map(|&dep| position[dep as usize])
                        .collect()
                })
                .collect();
            pipeline.order = dag::topo_order(&pipeline.needs).ok();
        }
        Self { pipelines, of_job }
    }

    /// The pipeline of a job, if it is in one.
    pub(super) fn of_job(&self, job: u32) -> Option<u32> {
        Some(self.of_job[job as usize]).filter(|&pipeline| pipeline != u32::MAX)
    }

    /// The pipelines' part of the report; `None` when the trace has none.
    /// `completed_at` gives the end of a job that completed.
    pub(super) fn report(
        &self,
        trace: &Trace,
        completed_at: impl Fn(u32) -> Option<u64>,
    ) -> Option<PipelineReport> {
        if self.pipelines.is_empty() {
            return None;
        }
        let mut makespans = Vec::new();
        for pipeline in &self.pipelines {
            let first_ms = pipeline
                .members
                .iter()
                .map(|&job| trace.jobs[job as usize].submit_ms)
                .min()
                .expect("a pipeline has at least two jobs");
            let ends: Option<Vec<u64>> = pipeline
                .members
                .iter()
                .map(|&job| completed_at(job))
                .collect();
            if let Some(last_ms) = ends.and_then(|ends| ends.into_iter().max()) {
                makespans.push(last_ms.saturating_sub(first_ms) as f64 / 1000.0);
            }
        }
        let completed = makespans.len() as u64;
        let total = makespans.iter().sum();
        Some(PipelineReport {
            pipelines: self.pipelines.len() as u64,
            completed,
            makespan: Summary::of(&mut makespans),
            makespan_total: total,
        })
    }
}

/// How far a job has got, as the boost sees it, and whether it waits in the
/// core (or in its team's backlog) for a placement.
pub(super) fn progress_of(
    run: &JobRun,
    duration_ms: Option<u64>,
    now: u64,
) -> (NodeProgress, bool) {
    // Work kept from earlier runs: known to the system, since it ran them.
    let kept_ms = match (duration_ms, run.remaining_ms) {
        (Some(duration), Some(remaining)) => duration.saturating_sub(remaining),
        _ => 0,
    };
    let seconds = |millis: u64| millis as f64 / 1000.0;
    match run.phase {
        Phase::Completed | Phase::Killed | Phase::Refused => (NodeProgress::Done, false),
        Phase::Running | Phase::Stopping | Phase::Resizing => {
            let elapsed = kept_ms + now.saturating_sub(run.start_ms);
            (
                NodeProgress::Running {
                    elapsed_s: seconds(elapsed),
                },
                false,
            )
        }
        Phase::Waiting | Phase::Backlogged if kept_ms > 0 => (
            NodeProgress::Running {
                elapsed_s: seconds(kept_ms),
            },
            true,
        ),
        Phase::Waiting | Phase::Backlogged => (NodeProgress::Waiting, true),
        Phase::Pending => (NodeProgress::Waiting, false),
    }
}

/// The boost's state: duration history, the pipelines under way, and the
/// urgency each job last had in the core.
#[derive(Debug)]
pub(super) struct Booster {
    mode: CriticalPathBoost,
    /// The kind of each job, `u32::MAX` for none.
    kind_of: Vec<u32>,
    /// Recent completed durations per kind, seconds.
    history: Vec<VecDeque<f64>>,
    /// The median of each kind's history.
    kind_estimate: Vec<Option<f64>>,
    completed_sum_s: f64,
    completed: u64,
    /// Pipelines with a job submitted and not every job done.
    active: BTreeSet<u32>,
    /// Per job, the urgency it has in the core (or will be submitted with).
    urgency: Vec<u32>,
}

impl Booster {
    /// The boost for `trace`; `None` when `mode` is off.
    pub(super) fn new(trace: &Trace, mode: CriticalPathBoost) -> Option<Self> {
        if mode == CriticalPathBoost::Off {
            return None;
        }
        let mut kinds: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        let kind_of = trace
            .jobs
            .iter()
            .map(|job| match &job.kind {
                Some(kind) => {
                    let next = u32::try_from(kinds.len()).expect("fewer kinds than jobs");
                    *kinds.entry(kind.as_str()).or_insert(next)
                }
                None => u32::MAX,
            })
            .collect();
        Some(Self {
            mode,
            kind_of,
            history: vec![VecDeque::new(); kinds.len()],
            kind_estimate: vec![None; kinds.len()],
            completed_sum_s: 0.0,
            completed: 0,
            active: BTreeSet::new(),
            urgency: vec![0; trace.jobs.len()],
        })
    }

    /// The urgency to submit a job with.
    pub(super) fn urgency(&self, job: u32) -> u32 {
        self.urgency[job as usize]
    }

    /// A job of this pipeline was submitted.
    pub(super) fn activate(&mut self, pipeline: u32) {
        self.active.insert(pipeline);
    }

    /// A job completed after `duration_s` of work: history for its kind.
    pub(super) fn record(&mut self, job: u32, duration_s: f64) {
        self.completed_sum_s += duration_s;
        self.completed += 1;
        let kind = self.kind_of[job as usize];
        if kind == u32::MAX {
            return;
        }
        let history = &mut self.history[kind as usize];
        if history.len() == MAX_HISTORY {
            history.pop_front();
        }
        history.push_back(duration_s);
        self.kind_estimate[kind as usize] = dag::estimate_duration(history.make_contiguous(), None);
    }

    fn estimate_s(&self, trace: &Trace, job: u32) -> f64 {
        let kind = self.kind_of[job as usize];
        let from_kind = (kind != u32::MAX)
            .then(|| self.kind_estimate[kind as usize])
            .flatten();
        let declared = trace.jobs[job as usize]
            .estimate_ms
            .map(|millis| millis as f64 / 1000.0);
        from_kind.or(declared).unwrap_or(if self.completed > 0 {
            self.completed_sum_s / self.completed as f64
        } else {
            0.0
        })
    }

    /// Recomputes the urgency of every waiting job of a pipeline under way and
    /// returns those that changed, as (job, urgency).
    pub(super) fn refresh(
        &mut self,
        pipelines: &Pipelines,
        trace: &Trace,
        progress: impl Fn(u32) -> (NodeProgress, bool),
    ) -> Vec<(u32, u32)> {
        let mut changes = Vec::new();
        let mut finished = Vec::new();
        for &index in &self.active {
            let pipeline = &pipelines.pipelines[index as usize];
            let states: Vec<(NodeProgress, bool)> =
                pipeline.members.iter().map(|&job| progress(job)).collect();
            if states.iter().all(|(state, _)| *state == NodeProgress::Done) {
                finished.push(index);
                continue;
            }
            let Some(order) = &pipeline.order else {
                continue;
            };
            if !states.iter().any(|&(_, waiting)| waiting) {
                continue;
            }
            let nodes: Vec<DagNode> = pipeline
                .members
                .iter()
                .zip(&states)
                .zip(&pipeline.needs)
                .map(|((&job, &(state, _)), needs)| DagNode {
                    needs: needs.clone(),
                    estimate_s: self.estimate_s(trace, job),
                    state,
                })
                .collect();
            let urgencies = match self.mode {
                CriticalPathBoost::Off => continue,
                CriticalPathBoost::Critical => match dag::critical_path(&nodes) {
                    Ok(path) => path.on_critical.iter().map(|&on| u32::from(on)).collect(),
                    Err(_) => continue,
                },
                CriticalPathBoost::Rank => tails(&nodes, order)
                    .into_iter()
                    .map(|tail| tail.ceil().min(f64::from(u32::MAX)) as u32)
                    .collect::<Vec<u32>>(),
            };
            for ((&job, &(_, waiting)), urgency) in
                pipeline.members.iter().zip(&states).zip(urgencies)
            {
                if waiting && self.urgency[job as usize] != urgency {
                    self.urgency[job as usize] = urgency;
                    changes.push((job, urgency));
                }
            }
        }
        for index in finished {
            self.active.remove(&index);
        }
        changes
    }
}

/// Per node, the longest remaining chain from its start to the end of the
/// graph, itself included, in seconds; `order` is a topological order.
fn tails(nodes: &[DagNode], order: &[usize]) -> Vec<f64> {
    let remaining: Vec<f64> = nodes
        .iter()
        .map(|node| match node.state {
            NodeProgress::Done => 0.0,
            NodeProgress::Running { elapsed_s } => (node.estimate_s - elapsed_s).max(0.0),
            NodeProgress::Waiting => node.estimate_s,
        })
        .collect();
    let mut after = vec![0.0f64; nodes.len()];
    let mut tail = vec![0.0f64; nodes.len()];
    for &node in order.iter().rev() {
        tail[node] = remaining[node] + after[node];
        for &need in &nodes[node].needs {
            after[need] = after[need].max(tail[node]);
        }
    }
    tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::trace::parse_trace;

    const HEADER: &str =
        "job_id,submit_s,duration_s,num_workers,gpus_per_worker,deps,estimate_s,kind";

    #[test]
    fn pipelines_are_connected_parts_of_two_or_more() {
        let trace = parse_trace(&format!(
            "{HEADER}\na,0,10,1,1,,,\nlone,0,10,1,1,,,\nb,0,10,1,1,a,,\nc,5,10,1,1,,,\nd,5,10,1,1,c;b,,\ne,9,1,1,1,,,\nf,9,1,1,1,e,,\n"
        ))
        .unwrap();
        let pipelines = Pipelines::new(&trace);
        assert_eq!(pipelines.pipelines.len(), 2);
        assert_eq!(pipelines.pipelines[0].members, vec![0, 2, 3, 4]);
        assert_eq!(
            pipelines.pipelines[0].needs,
            vec![vec![], vec![0], vec![], vec![2, 1]]
        );
        assert_eq!(pipelines.pipelines[1].members, vec![5, 6]);
        assert_eq!(pipelines.of_job(1), None);
        assert_eq!(pipelines.of_job(4), Some(0));
        // The first completes at 40 s from its first submission at 0; the second
        // never completes.
        let report = pipelines
            .report(&trace, |job| (job <= 4).then_some(40_000))
            .unwrap();
        assert_eq!((report.pipelines, report.completed), (2, 1));
        assert_eq!(report.makespan.unwrap().mean, 40.0);
        assert_eq!(report.makespan_total, 40.0);
        let lonely = parse_trace(&format!("{HEADER}\na,0,10,1,1,,,\n")).unwrap();
        assert!(
            Pipelines::new(&lonely)
                .report(&lonely, |_| Some(1))
                .is_none()
        );
    }

    #[test]
    fn estimates_prefer_history_then_declared_then_the_mean() {
        let trace = parse_trace(&format!(
            "{HEADER}\na,0,10,1,1,,100,k\nb,0,10,1,1,a,7,\nc,0,10,1,1,b,,k\nd,0,10,1,1,c,,\n"
        ))
        .unwrap();
        let mut booster = Booster::new(&trace, CriticalPathBoost::Critical).unwrap();
        assert_eq!(booster.estimate_s(&trace, 0), 100.0);
        assert_eq!(booster.estimate_s(&trace, 3), 0.0);
        booster.record(0, 30.0);
        booster.record(2, 50.0);
        assert_eq!(booster.estimate_s(&trace, 0), 40.0);
        assert_eq!(booster.estimate_s(&trace, 1), 7.0);
        assert_eq!(booster.estimate_s(&trace, 3), 40.0);
        for _ in 0..MAX_HISTORY {
            booster.record(0, 1.0);
        }
        assert_eq!(booster.history[0].len(), MAX_HISTORY);
        assert_eq!(booster.estimate_s(&trace, 2), 1.0);
        assert!(Booster::new(&trace, CriticalPathBoost::Off).is_none());
    }

    #[test]
    fn critical_jobs_and_tails_get_urgency() {
        // a (100 s) then b (100 s); beside them c (10 s); d needs b and c.
        let trace = parse_trace(&format!(
            "{HEADER}\na,0,100,1,1,,100,\nb,0,100,1,1,a,100,\nc,0,10,1,1,,10,\nd,0,5,1,1,b;c,5,\n"
        ))
        .unwrap();
        let pipelines = Pipelines::new(&trace);
        let waiting = |job: u32| {
            if job == 0 || job == 2 {
                (NodeProgress::Waiting, true)
            } else {
                (NodeProgress::Waiting, false)
            }
        };
        let mut critical = Booster::new(&trace, CriticalPathBoost::Critical).unwrap();
        critical.activate(0);
        assert_eq!(critical.refresh(&pipelines, &trace, waiting), vec![(0, 1)]);
        // Nothing changed: nothing to hand the core again.
        assert!(critical.refresh(&pipelines, &trace, waiting).is_empty());
        let mut rank = Booster::new(&trace, CriticalPathBoost::Rank).unwrap();
        rank.activate(0);
        assert_eq!(
            rank.refresh(&pipelines, &trace, waiting),
            vec![(0, 205), (2, 15)]
        );
        // a ran 60 s of its 100 before a preemption: its tail shrinks by 60 s.
        let preempted = |job: u32| match job {
            0 => (NodeProgress::Running { elapsed_s: 60.0 }, true),
            _ => waiting(job),
        };
        assert_eq!(rank.refresh(&pipelines, &trace, preempted), vec![(0, 145)]);
        // Once everything is done the pipeline leaves the active set.
        let done = |_| (NodeProgress::Done, false);
        assert!(rank.refresh(&pipelines, &trace, done).is_empty());
        assert!(rank.active.is_empty());
    }
}
