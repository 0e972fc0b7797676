//! The pipeline specification: named stages, each an experiment (with a
//! `search`) or a single trial (without), that run once the stages they `need`
//! have succeeded and may take their inputs from them.
//!
//! Parsing is as strict as [`ExperimentSpec`]'s (unknown fields refused with line
//! and column) and [`PipelineSpec::validate`] refuses, naming the stage: too many
//! stages, bad names, unknown needs, cycles (every stage on one is named), and
//! references to what no needed stage produces.
//!
//! A reference is a placeholder with a dot, `{STAGE.KIND...}`: `{s.outputs}`,
//! `{s.checkpoint}`, `{s.best.metric}`, `{s.best.metrics.NAME}` and
//! `{s.best.params.NAME}`. Search parameter names cannot hold a dot, so a dotted
//! placeholder is always a reference and never collides with the stage's own
//! `{param}` placeholders, which keep rendering per trial. References are
//! resolved when the stage is released ([`PipelineSpec::stage_experiment`]):
//! values are written in with their braces doubled, so the per-trial rendering
//! leaves them as they are; directories become [`input_marker`]s, which the node
//! running the trial replaces with the absolute directory it filled (the head
//! does not know node paths).
//!
//! Decision: a stage may reference only the stages it names in `needs` directly,
//! so what a stage reads is visible in its own declaration.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{
    CheckpointRetention, ExperimentSpec, Format, Priority, SearchSpec, SpecError, TrialSpec,
    check_header, default_team, invalid, parse_bounded,
};

/// The most stages one pipeline may have.
pub const MAX_STAGES: usize = 256;
/// The longest stage name.
pub const MAX_STAGE_NAME: usize = 64;

/// A whole pipeline: its owner and its stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// A human name.
    pub name: String,
    /// The team that owns the pipeline and its stages' experiments.
    #[serde(default = "default_team")]
    pub team: String,
    /// The scheduling queue of every stage; the team's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// The base priority of every stage.
    #[serde(default, skip_serializing_if = "Priority::is_default")]
    pub priority: Priority,
    /// A git work tree whose commit is the code version of every stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Files or directories hashed into the data version of every stage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<String>,
    /// The stages by name.
    pub stages: BTreeMap<String, StageSpec>,
}

/// One stage: an experiment, or a single trial when it has no `search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// The stages that must succeed before this one starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs: Vec<String>,
    /// The trial template; its command may reference what `needs` produce.
    pub trial: TrialSpec,
    /// The search that makes this stage an experiment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchSpec>,
    /// How long the stage is expected to take (such as `10m`), for the critical
    /// path until its history says better.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<String>,
    /// Which checkpoints are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<CheckpointRetention>,
}

impl StageSpec {
    /// The declared estimate in seconds, when given and valid.
    pub fn estimate_s(&self) -> Option<f64> {
        self.estimate
            .as_deref()
            .and_then(|text| humantime::parse_duration(text).ok())
            .map(|duration| duration.as_secs_f64())
    }
}

/// What a reference asks of a needed stage.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefKind {
    /// `{s.outputs}`: a directory with the files its best (or only) trial wrote
    /// under `XP_OUTPUT_DIR`.
    Outputs,
    /// `{s.checkpoint}`: a directory with its best trial's last checkpoint.
    Checkpoint,
    /// `{s.best.metric}`: the best trial's value of the stage's search metric.
    BestMetric,
    /// `{s.best.metrics.NAME}`: the best trial's last value of metric NAME.
    BestMetricNamed(String),
    /// `{s.best.params.NAME}`: the best trial's value of search parameter NAME.
    BestParam(String),
}

/// One `{STAGE.KIND}` reference of a stage's command.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StageRef {
    /// The stage referenced.
    pub stage: String,
    /// What of it.
    pub kind: RefKind,
}

impl StageRef {
    /// The text between the braces, such as `sweep.best.params.x`.
    pub fn text(&self) -> String {
        match &self.kind {
            RefKind::Outputs => format!("{}.outputs", self.stage),
            RefKind::Checkpoint => format!("{}.checkpoint", self.stage),
            RefKind::BestMetric => format!("{}.best.metric", self.stage),
            RefKind::BestMetricNamed(name) => format!("{}.best.metrics.{name}", self.stage),
            RefKind::BestParam(name) => format!("{}.best.params.{name}", self.stage),
        }
    }

    /// Whether it resolves to a directory the node fills.
    pub fn is_directory(&self) -> bool {
        matches!(self.kind, RefKind::Outputs | RefKind::Checkpoint)
    }

    fn parse(body: &str) -> Result<Self, String> {
        let (stage, rest) = body
            .split_once('.')
            .ok_or_else(|| format!("{{{body}}} is not a reference"))?;
        let parts: Vec<&str> = rest.split('.').collect();
        let kind = match parts.as_slice() {
            ["outputs"] => RefKind::Outputs,
            ["checkpoint"] => RefKind::Checkpoint,
            ["best", "metric"] => RefKind::BestMetric,
            ["best", "metrics", name] if is_identifier(name) => {
                RefKind::BestMetricNamed((*name).to_owned())
            }
            ["best", "params", name] if is_identifier(name) => {
                RefKind::BestParam((*name).to_owned())
            }
            _ => {
                return Err(format!(
                    "{{{body}}} is not a reference: use {{STAGE.outputs}}, {{STAGE.checkpoint}}, {{STAGE.best.metric}}, {{STAGE.best.metrics.NAME}} or {{STAGE.best.params.NAME}}"
                ));
            }
        };
        Ok(Self {
            stage: stage.to_owned(),
            kind,
        })
    }
}

/// What a directory reference becomes in a launched command: the node running
/// the trial replaces this exact text in its argv with the absolute directory
/// it filled (`{xp-input:STAGE.outputs:NONCE}`). It is not a placeholder for the
/// per-trial rendering, which leaves it as it is. `nonce` is the head's fresh
/// random text for one release of the stage, carried in the launch with the
/// marker, so no other text of the command (a search parameter's value, say)
/// can pass for a marker.
pub fn input_marker(reference: &StageRef, nonce: &str) -> String {
    format!("{{xp-input:{}:{nonce}}}", reference.text())
}

/// The name of the directory a node makes for one input (`STAGE.outputs`),
/// under the worker's `XP_INPUT_DIR`.
pub fn input_dir_name(reference: &StageRef) -> String {
    reference.text()
}

fn is_identifier(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

/// Whether `name` may name a stage: 1 to [`MAX_STAGE_NAME`] characters, a
/// letter first, then letters, digits, `_` and `-`.
pub fn is_stage_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_STAGE_NAME
        && chars
            .next()
            .is_some_and(|first| first.is_ascii_alphabetic())
        && chars.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
}

/// One dotted `{...}` of an argument: its byte range (braces included) and its body.
struct Dotted<'a> {
    range: std::ops::Range<usize>,
    body: &'a str,
}

/// The dotted placeholders of `arg`, scanned with the rules of
/// [`super::render_arg`]: `{{` and `}}` are literal braces and `${` is the shell's.
fn dotted_placeholders(arg: &str) -> Vec<Dotted<'_>> {
    let mut found = Vec::new();
    let mut at = 0;
    let mut previous = None;
    while at < arg.len() {
        let rest = &arg[at..];
        if rest.starts_with("{{") || rest.starts_with("}}") {
            previous = rest.chars().next();
            at += 2;
            continue;
        }
        let ch = rest.chars().next().expect("not at the end");
        if ch == '{' && previous != Some('$') {
            let body = &rest[1..];
            let len = body
                .find(|inner: char| {
                    !(inner.is_ascii_alphanumeric() || matches!(inner, '_' | '.' | '-'))
                })
                .unwrap_or(body.len());
            if len > 0 && body[len..].starts_with('}') && body[..len].contains('.') {
                found.push(Dotted {
                    range: at..at + len + 2,
                    body: &body[..len],
                });
                previous = Some('}');
                at += len + 2;
                continue;
            }
        }
        previous = Some(ch);
        at += ch.len_utf8();
    }
    found
}

/// Doubles every brace of `value`, so the per-trial rendering writes it as it is.
fn escape_braces(value: &str) -> String {
    value.replace('{', "{{").replace('}', "}}")
}

impl PipelineSpec {
    /// Parses and validates a YAML document.
    pub fn from_yaml(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_bounded(text, Format::Yaml)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates the canonical JSON form sent over the wire.
    pub fn from_json(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_bounded(text, Format::Json)?;
        spec.validate()?;
        Ok(spec)
    }

    /// The canonical JSON form (maps sorted by key).
    pub fn to_canonical_json(&self) -> String {
        serde_json::to_string(self).expect("a pipeline spec of plain data serialises to JSON")
    }

    /// Checks every stage, naming the first offending one.
    pub fn validate(&self) -> Result<(), SpecError> {
        check_header(
            &self.name,
            &self.team,
            self.queue.as_deref(),
            &self.priority,
        )?;
        self.validate_stage_count()?;
        for (name, stage) in &self.stages {
            self.validate_stage(name, stage)?;
        }
        self.refuse_cycle()?;
        for name in self.stages.keys() {
            self.validate_stage_experiment(name)?;
        }
        Ok(())
    }

    /// One to [`MAX_STAGES`] stages.
    fn validate_stage_count(&self) -> Result<(), SpecError> {
        if self.stages.is_empty() {
            return Err(invalid("stages", "a pipeline needs at least one stage"));
        }
        if self.stages.len() > MAX_STAGES {
            return Err(invalid(
                "stages",
                format!(
                    "a pipeline may have at most {MAX_STAGES} stages, not {}",
                    self.stages.len()
                ),
            ));
        }
        Ok(())
    }

    /// One stage on its own: its name, its `needs`, a command rather than an
    /// entry, and its estimate.
    fn validate_stage(&self, name: &str, stage: &StageSpec) -> Result<(), SpecError> {
        if !is_stage_name(name) {
            return Err(invalid(
                format!("stages.{name}"),
                format!(
                    "a stage name is 1 to {MAX_STAGE_NAME} characters: a letter, then letters, digits, '_' or '-'"
                ),
            ));
        }
        self.validate_needs(name, stage)?;
        if stage.trial.entry.is_some() {
            return Err(invalid(
                format!("stages.{name}.trial.entry"),
                format!(
                    "stage `{name}`: pipeline stages run commands; `entry` trainables are not supported in pipelines yet"
                ),
            ));
        }
        if let Some(estimate) = &stage.estimate
            && stage.estimate_s().is_none()
        {
            return Err(invalid(
                format!("stages.{name}.estimate"),
                format!("`{estimate}` is not a duration such as 10m or 2h"),
            ));
        }
        Ok(())
    }

    /// A stage's `needs`: other stages of this pipeline, each named once.
    fn validate_needs(&self, name: &str, stage: &StageSpec) -> Result<(), SpecError> {
        let mut seen = BTreeSet::new();
        for need in &stage.needs {
            if !self.stages.contains_key(need) {
                return Err(invalid(
                    format!("stages.{name}.needs"),
                    format!("stage `{name}` needs `{need}`, which is not a stage of this pipeline"),
                ));
            }
            if need == name {
                return Err(invalid(
                    format!("stages.{name}.needs"),
                    format!("stage `{name}` needs itself"),
                ));
            }
            if !seen.insert(need) {
                return Err(invalid(
                    format!("stages.{name}.needs"),
                    format!("stage `{name}` names `{need}` twice"),
                ));
            }
        }
        Ok(())
    }

    /// The `needs` must not loop.
    fn refuse_cycle(&self) -> Result<(), SpecError> {
        if let Some(cycle) = self.cycle() {
            let mut shown = cycle.clone();
            shown.push(cycle[0].clone());
            return Err(invalid(
                "stages",
                format!(
                    "the stages form a cycle: {} (stages {})",
                    shown.join(" → "),
                    cycle
                        .iter()
                        .map(|name| format!("`{name}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// A stage's references resolve, and its own experiment is valid.
    fn validate_stage_experiment(&self, name: &str) -> Result<(), SpecError> {
        self.check_references(name)?;
        // The stage's own experiment must be valid, references left in place
        // (they are not placeholders of the per-trial rendering).
        self.stage_template(name)
            .validate()
            .map_err(|error| match error {
                SpecError::Invalid { field, reason } => invalid(
                    format!("stages.{name}.{field}"),
                    format!("stage `{name}`: {reason}"),
                ),
                other => other,
            })?;
        Ok(())
    }

    /// One cycle of `needs`, in order, when the stages have one.
    fn cycle(&self) -> Option<Vec<String>> {
        // Depth-first with colours: reaching a stage still on the path closes a cycle.
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            OnPath,
            Done,
        }
        let names: Vec<&String> = self.stages.keys().collect();
        let index: BTreeMap<&String, usize> = names
            .iter()
            .enumerate()
            .map(|(i, name)| (*name, i))
            .collect();
        let mut marks = vec![Mark::New; names.len()];
        for start in 0..names.len() {
            if marks[start] != Mark::New {
                continue;
            }
            // Explicit stack of (stage, next need to look at): no recursion depth to bound.
            let mut path: Vec<(usize, usize)> = vec![(start, 0)];
            marks[start] = Mark::OnPath;
            while let Some((node, next)) = path.last().copied() {
                let needs = &self.stages[names[node]].needs;
                if next == needs.len() {
                    marks[node] = Mark::Done;
                    path.pop();
                    continue;
                }
                path.last_mut().expect("not empty").1 += 1;
                let Some(&need) = index.get(&needs[next]) else {
                    continue;
                };
                match marks[need] {
                    Mark::Done => {}
                    Mark::New => {
                        marks[need] = Mark::OnPath;
                        path.push((need, 0));
                    }
                    Mark::OnPath => {
                        let from = path
                            .iter()
                            .position(|(on, _)| *on == need)
                            .expect("a stage on the path is on the path");
                        // The path follows needs; execution order is the reverse.
                        let mut cycle: Vec<String> = path[from..]
                            .iter()
                            .rev()
                            .map(|(on, _)| names[*on].clone())
                            .collect();
                        let first = cycle
                            .iter()
                            .enumerate()
                            .min_by_key(|(_, name)| *name)
                            .map_or(0, |(i, _)| i);
                        cycle.rotate_left(first);
                        return Some(cycle);
                    }
                }
            }
        }
        None
    }

    /// The stage names in an order where each comes after everything it needs
    /// (alphabetical among those ready together).
    pub fn order(&self) -> Vec<String> {
        let mut done: BTreeSet<&String> = BTreeSet::new();
        let mut order = Vec::with_capacity(self.stages.len());
        while order.len() < self.stages.len() {
            let ready: Vec<&String> = self
                .stages
                .iter()
                .filter(|(name, stage)| {
                    !done.contains(name) && stage.needs.iter().all(|need| done.contains(need))
                })
                .map(|(name, _)| name)
                .collect();
            if ready.is_empty() {
                // A cycle: validation refuses these; stop rather than loop.
                break;
            }
            for name in ready {
                done.insert(name);
                order.push(name.clone());
            }
        }
        order
    }

    /// The references of stage `name`'s command, each once, in order.
    pub fn references(&self, name: &str) -> Vec<StageRef> {
        let mut refs = BTreeSet::new();
        if let Some(command) = self
            .stages
            .get(name)
            .and_then(|stage| stage.trial.command.as_ref())
        {
            for arg in command {
                for dotted in dotted_placeholders(arg) {
                    if let Ok(reference) = StageRef::parse(dotted.body) {
                        refs.insert(reference);
                    }
                }
            }
        }
        refs.into_iter().collect()
    }

    fn check_references(&self, name: &str) -> Result<(), SpecError> {
        let stage = &self.stages[name];
        let Some(command) = &stage.trial.command else {
            return Ok(());
        };
        for (arg_idx, arg) in command.iter().enumerate() {
            let field = format!("stages.{name}.trial.command[{arg_idx}]");
            for dotted in dotted_placeholders(arg) {
                let reference = StageRef::parse(dotted.body)
                    .map_err(|why| invalid(&field, format!("stage `{name}`: {why}")))?;
                let target = &reference.stage;
                let Some(upstream) = self.stages.get(target) else {
                    return Err(invalid(
                        &field,
                        format!(
                            "stage `{name}` references {{{}}}, but `{target}` is not a stage of this pipeline",
                            reference.text()
                        ),
                    ));
                };
                if !stage.needs.contains(target) {
                    return Err(invalid(
                        &field,
                        format!(
                            "stage `{name}` references {{{}}}, but does not need `{target}`: add it to needs",
                            reference.text()
                        ),
                    ));
                }
                let search = upstream.search.as_ref();
                match &reference.kind {
                    RefKind::BestParam(param) => {
                        if !search.is_some_and(|search| search.space.contains_key(param)) {
                            return Err(invalid(
                                &field,
                                format!(
                                    "stage `{name}` references {{{}}}, but `{target}` has no search parameter `{param}`",
                                    reference.text()
                                ),
                            ));
                        }
                    }
                    RefKind::BestMetric => {
                        if search.and_then(|search| search.metric.as_ref()).is_none() {
                            return Err(invalid(
                                &field,
                                format!(
                                    "stage `{name}` references {{{}}}, but `{target}` has no search metric",
                                    reference.text()
                                ),
                            ));
                        }
                    }
                    RefKind::Outputs | RefKind::Checkpoint | RefKind::BestMetricNamed(_) => {}
                }
            }
        }
        Ok(())
    }

    /// Stage `name` as an experiment with its references still in place.
    fn stage_template(&self, name: &str) -> ExperimentSpec {
        let stage = &self.stages[name];
        ExperimentSpec {
            name: format!("{}.{name}", self.name),
            team: self.team.clone(),
            priority: self.priority.clone(),
            queue: self.queue.clone(),
            code: self.code.clone(),
            data: self.data.clone(),
            trial: stage.trial.clone(),
            search: stage.search.clone().unwrap_or_default(),
            checkpoints: stage.checkpoints,
            alerts: Vec::new(),
        }
    }

    /// Stage `name` as the experiment to submit once what it needs succeeded:
    /// each reference replaced by `resolve`'s value (braces doubled, so the
    /// per-trial rendering keeps it), or by its [`input_marker`] (with `nonce`)
    /// for directories. A reference `resolve` has no value for is refused naming it.
    pub fn stage_experiment(
        &self,
        name: &str,
        nonce: &str,
        mut resolve: impl FnMut(&StageRef) -> Option<String>,
    ) -> Result<ExperimentSpec, SpecError> {
        let mut spec = self.stage_template(name);
        if let Some(command) = &mut spec.trial.command {
            for (arg_idx, arg) in command.iter_mut().enumerate() {
                let mut out = String::with_capacity(arg.len());
                let mut last = 0;
                for dotted in dotted_placeholders(arg) {
                    out.push_str(&arg[last..dotted.range.start]);
                    let reference = StageRef::parse(dotted.body).map_err(|why| {
                        invalid(format!("stages.{name}.trial.command[{arg_idx}]"), why)
                    })?;
                    let value = if reference.is_directory() {
                        escape_braces(&input_marker(&reference, nonce))
                    } else {
                        let value = resolve(&reference).ok_or_else(|| {
                            invalid(
                                format!("stages.{name}.trial.command[{arg_idx}]"),
                                format!(
                                    "stage `{name}`: `{}` produced no value for {{{}}}",
                                    reference.stage,
                                    reference.text()
                                ),
                            )
                        })?;
                        escape_braces(&value)
                    };
                    out.push_str(&value);
                    last = dotted.range.end;
                }
                out.push_str(&arg[last..]);
                *arg = out;
            }
        }
        spec.validate()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::{PipelineSpec, RefKind, StageRef, input_marker};
    use crate::spec::{SpecError, render_arg};

    const EXAMPLE: &str = include_str!("../../../examples/pipeline/digits-pipeline.yaml");

    fn refused(yaml: &str) -> String {
        match PipelineSpec::from_yaml(yaml) {
            Ok(_) => panic!("accepted:\n{yaml}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn the_example_of_the_issue_parses_and_orders_its_stages() {
        let spec = PipelineSpec::from_yaml(EXAMPLE).expect("the example parses");
        assert_eq!(spec.name, "digits-pipeline");
        assert_eq!(spec.order(), ["prepare", "sweep", "evaluate"]);
        assert_eq!(
            spec.references("evaluate"),
            [StageRef {
                stage: "sweep".to_owned(),
                kind: RefKind::BestParam("x".to_owned())
            }]
        );
        assert_eq!(
            spec.references("sweep"),
            [StageRef {
                stage: "prepare".to_owned(),
                kind: RefKind::Outputs
            }]
        );
        let json = spec.to_canonical_json();
        assert_eq!(PipelineSpec::from_json(&json).expect("round trip"), spec);
    }

    #[test]
    fn a_released_stage_has_values_and_markers_and_keeps_its_own_parameters() {
        let spec = PipelineSpec::from_yaml(EXAMPLE).expect("the example parses");
        let sweep = spec
            .stage_experiment("sweep", "n0nce", |_| None)
            .expect("sweep");
        let arg = &sweep.trial.command.as_ref().expect("command")[2];
        // The per-trial rendering fills {x} and leaves the marker for the node.
        let rendered =
            render_arg(arg, |name| (name == "x").then(|| "0.5".to_owned())).expect("renders");
        let marker = input_marker(
            &StageRef {
                stage: "prepare".to_owned(),
                kind: RefKind::Outputs,
            },
            "n0nce",
        );
        assert_eq!(marker, "{xp-input:prepare.outputs:n0nce}");
        assert!(
            rendered.contains(&format!("n=$(cat {marker}/n.txt)")),
            "{rendered}"
        );
        assert!(rendered.contains("\"y\": 0.5"), "{rendered}");
        let evaluate = spec
            .stage_experiment("evaluate", "n0nce", |reference| {
                (reference.kind == RefKind::BestParam("x".to_owned())).then(|| "{0.25}".to_owned())
            })
            .expect("evaluate");
        let arg = &evaluate.trial.command.as_ref().expect("command")[2];
        let rendered = render_arg(arg, |_| None).expect("a value's braces are not placeholders");
        assert_eq!(rendered, "echo best x = {0.25}");
        let missing = spec
            .stage_experiment("evaluate", "n0nce", |_| None)
            .unwrap_err();
        assert!(
            missing.to_string().contains("sweep.best.params.x"),
            "{missing}"
        );
    }

    #[test]
    fn a_cycle_is_refused_naming_every_stage_on_it() {
        let message = refused(
            "name: p\nstages:\n  a: {needs: [c], trial: {command: [true]}}\n  b: {needs: [a], trial: {command: [true]}}\n  c: {needs: [b], trial: {command: [true]}}\n  d: {trial: {command: [true]}}\n",
        );
        assert!(message.contains("a → b → c → a"), "{message}");
        assert!(!message.contains("`d`"), "{message}");
    }

    #[test]
    fn unknown_needs_and_references_are_refused_naming_the_stage() {
        let message = refused("name: p\nstages:\n  a: {needs: [nope], trial: {command: [true]}}\n");
        assert!(message.contains("stage `a` needs `nope`"), "{message}");
        let message = refused(
            "name: p\nstages:\n  a: {trial: {command: [true]}}\n  b: {needs: [a], trial: {command: [echo, '{a.best.params.lr}']}}\n",
        );
        assert!(
            message.contains("stage `b`") && message.contains("no search parameter `lr`"),
            "{message}"
        );
        let message = refused(
            "name: p\nstages:\n  a: {trial: {command: [true]}}\n  b: {trial: {command: [cat, '{a.outputs}/f']}}\n",
        );
        assert!(message.contains("does not need `a`"), "{message}");
        let message = refused(
            "name: p\nstages:\n  a: {trial: {command: [true]}}\n  b: {needs: [a], trial: {command: [cat, '{z.outputs}']}}\n",
        );
        assert!(message.contains("`z` is not a stage"), "{message}");
        let message = refused(
            "name: p\nstages:\n  a: {trial: {command: [true]}}\n  b: {needs: [a], trial: {command: [echo, '{a.best.metric}']}}\n",
        );
        assert!(message.contains("no search metric"), "{message}");
        let message = refused(
            "name: p\nstages:\n  a: {trial: {command: [true]}}\n  b: {needs: [a], trial: {command: [echo, '{a.bogus}']}}\n",
        );
        assert!(message.contains("is not a reference"), "{message}");
    }

    #[test]
    fn names_fields_and_sizes_are_bounded() {
        let message = refused("name: p\nstages:\n  a: {trial: {command: [true]}, bogus: 1}\n");
        assert!(
            message.contains("bogus") && message.contains("line"),
            "{message}"
        );
        let message = refused("name: p\nstages:\n  'a b': {trial: {command: [true]}}\n");
        assert!(message.contains("stage name"), "{message}");
        let message = refused("name: p\nstages: {}\n");
        assert!(message.contains("at least one stage"), "{message}");
        let mut many = String::from("name: p\nstages:\n");
        for index in 0..=super::MAX_STAGES {
            many.push_str(&format!("  s{index}: {{trial: {{command: [true]}}}}\n"));
        }
        assert!(refused(&many).contains("at most 256 stages"));
        let message =
            refused("name: p\nstages:\n  a: {trial: {command: [true]}, estimate: soon}\n");
        assert!(message.contains("estimate"), "{message}");
        let huge = "#".repeat(crate::spec::MAX_SPEC_BYTES + 1);
        assert!(matches!(
            PipelineSpec::from_yaml(&huge),
            Err(SpecError::TooLarge { .. })
        ));
        // A stage's own spec is checked too, naming the stage.
        let message = refused("name: p\nstages:\n  a: {trial: {command: [echo, '{nope}']}}\n");
        assert!(message.contains("stage `a`"), "{message}");
    }

    #[test]
    fn escaped_and_shell_braces_are_not_references() {
        let spec = PipelineSpec::from_yaml(
            "name: p\nstages:\n  a: {trial: {command: [sh, -c, 'echo ${a.b} {{a.outputs}}']}}\n",
        )
        .expect("no references");
        assert!(spec.references("a").is_empty());
    }
}
