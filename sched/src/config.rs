//! The policy file: queues, cohorts, quotas, priority classes, aging, preemption,
//! placement, ordering, backfill and admission, plus the built-in presets.
//!
//! It only describes a policy; [`super::PolicyCore`] carries it out. Parsing is
//! strict: unknown fields are errors with the line and column from the YAML parser,
//! and [`PolicyConfig::validate`] names the queue and field of the first bad value.
//!
//! ```yaml
//! queues:                      # absent: one queue `default` open to every team
//!   - name: vision
//!     team: vision             # absent: the queue is open to every team
//!     cohort: research         # queues of one cohort lend each other idle quota
//!     weight: 2                # fair-share weight, > 0, default 1
//!     quota: {gpu: 8, cpu: 64, memory: 512GiB}
//!     borrowing_limit: {gpu: 8}
//!     lending_limit: {gpu: 4}
//! priority_classes: {low: 0, normal: 100, high: 1000}
//! aging: {rate_per_hour: 10, cap: 500}
//! preemption: {enabled: true, grace_period: 60s, min_run_time: 5m, max_loss: 30m}
//! attained_service: {thresholds_gpu_hours: [2, 32], promote_after: 2, reserve_after: 48h, delay_per_gpu: 1h}
//! placement: binpack           # spread | random | fragmentation_aware | fgd
//! order: fair                  # fifo | priority
//! backfill: true
//! head_of_line: strict         # skip
//! admission: {max_pending_per_team: 10000, retry_after: 5s, max_submission_bytes: 16MiB, max_team_bytes: 64MiB, max_blobs_per_user: 16, max_blob_bytes_per_user: 2GiB}
//! leases: {matlab-licence: 2, feature-store: 8, param-server-7: 1}
//! prices: {default: 1.0, H100: 3.2}  # per GPU-hour by model, for `xp report`
//! webhooks: {allow: [10.1.2.0/24]}   # or allow_private: true; else public addresses only
//! oversubscription: 1.5        # 1 to 4, default 1 (off)
//! objects: {memory: 1GiB, disk: 64GiB, teams: {vision: {disk: 1TiB}}}  # per team per node
//! ```
//!
//! `objects` bounds what each team may keep in one node's object store:
//! `memory` its objects in the memory tier, `disk` all of them (what is in
//! memory may spill to disk), per node, by default 1 GiB and 64 GiB; `teams`
//! overrides either for a named team. A team's objects are those its driver
//! sessions stored and those its trials keep there. A store through the
//! object server that would take the team over `disk` is refused with a message
//! naming the quota; one over `memory` goes to disk.
//!
//! `oversubscription` is policy-wide: fractional workers that opt in
//! (`TrialRequest`'s gang with `oversubscribe`) are placed at their share
//! divided by the factor (rounded up, [`crate::oversubscribed_charge`]), so a
//! GPU is promised up to that many times its capacity, betting that they do
//! not all fill their memory at once; the youngest of them is evicted through
//! its checkpoint before the GPU's memory runs out: live by the node
//! (`telemetry::eviction`), which watches each GPU's memory, for trials whose
//! `resources.oversubscribe` the head copies into the gang; in `xp sim` by
//! `sim::gpu_memory`. Workers that did not
//! opt in are placed at their share, so what they share is never promised
//! beyond the whole GPU to them; whole-GPU workers never share. A trial is
//! charged at the factor in force when it is submitted.
//!
//! A queue may also say `preemption: {approval: manual}`: a preemption of its
//! trials waits for an admin's approval (see [`Approval`]), and its `quota` may
//! name leases (`quota: {gpu: 8, leases: {matlab-licence: 1}}`).
//!
//! Choices, each with its reason:
//!
//! - A resource left out of `quota` is unlimited for that queue, and so is every
//!   resource of a queue without `quota`: writing `quota: {gpu: 8}` should limit
//!   GPUs, not silently forbid CPU. An unlimited resource neither borrows nor lends.
//! - `borrowing_limit` and `lending_limit` need a cohort and a finite quota for the
//!   resource they limit; a resource left out of them is not limited (borrow all the
//!   cohort has, lend all idle quota). A lending limit is at most the quota.
//! - A team's default queue is its first queue; a team with no queue of its own
//!   uses the queue named `default` when it is open to every team, else the first
//!   open queue.
//! - A section left out of a file is off or conservative: no aging, no preemption,
//!   no backfill, strict head of line, `fair` order, bin-packing. A `preemption`
//!   section that is present is enabled unless it says `enabled: false`.
//!   [`PolicyConfig::default`] is not the empty file but the `default` preset, the
//!   best policy we have.
//! - GPU and CPU amounts may be fractional (`gpu: 0.5`) and are kept in thousandths.
//! - Leases are named shared things (a licence, a database) with a capacity in
//!   units; a trial asks for units for its whole gang, not per worker, since a
//!   gang is one user of a licence or a parameter server. A lease quota is a hard
//!   cap per queue: leases are not lent or borrowed in a cohort (a licence seat is
//!   not idle GPU time), so `borrowing_limit` and `lending_limit` name no lease.
//! - Aging counts whole units: the boost is `floor(rate_per_hour × hours waited)`
//!   capped at `cap`, so effective priorities stay integers and orders stay exact.
//! - `attained_service` (least attained service, after Tiresias's discrete
//!   two-dimensional LAS) orders trials inside a queue, after effective priority,
//!   by how much GPU time they have received so far (GPUs × seconds run, summed
//!   over attempts; the core counts it from its own starts and stops, so no
//!   duration is needed): `thresholds_gpu_hours` cut it into levels (two
//!   thresholds, three levels; level 0 first), FIFO within a level by
//!   submission time made later by `delay_per_gpu` for each GPU beyond one
//!   (smaller gangs first, by a bounded time, so none starves). A waiting
//!   trial whose wait since it was last queued exceeds `promote_after` times the
//!   time it has run goes back to level 0 (its service counts afresh from there),
//!   so nothing starves; `0` turns promotion off. With `levels: adaptive`
//!   (the default) the edges follow the workload: they are quantiles
//!   (`quantiles`, by default 0.5, 0.75, ...) of the service the last 256
//!   completed trials received, `thresholds_gpu_hours` serving as the prior
//!   until 16 have completed, each edge moving at most one step of a 2^(1/4)
//!   grid per completion; and the durations written for the prior's workload
//!   scale with the first edge over the prior's (`preemption.min_run_time`
//!   both ways; the waits `reserve_after`, `delay_per_gpu` and the day after
//!   which any loss is accepted only longer, since under overload waits
//!   follow the backlog, not the trials' length; `preemption.grace_period`,
//!   never under 10 s, and `preemption.max_loss` only shorter), so the
//!   policy does not depend on the unit of time where trials are longer than
//!   the prior's.
//!   `levels: fixed` keeps the edges and durations as written. A promoted
//!   trial joins level 0's line at its promotion time. A gang with no room does not
//!   hold up smaller work of its queue that fits now, until it has waited
//!   `reserve_after`: then it holds the line (a backfill reservation with
//!   `backfill`, else a strict head of line) until it starts. With preemption on, a waiting
//!   trial may also stop a running trial of its own queue and base priority that
//!   sits at a higher level than its own (more service received); `fifo` ignores
//!   all of it. Leave `aging` out beside it: aging orders a class by waiting time,
//!   which would undo the levels (the `default` preset has none).
//! - `preemption.max_loss` bounds the work a victim may lose: the run time since
//!   its last checkpoint (all of its run when it never checkpointed). Victims are
//!   chosen cheapest first (under the limit, then lowest priority, then least
//!   GPU time lost, then most service received), so one over the limit is taken
//!   only when no cheaper set makes room, never for attained service alone, and
//!   (reclaims of borrowed quota excepted) only once the trial that needs the
//!   room has waited at least as long as the GPU time the victim would lose
//!   (GPUs × unsaved run; after a day, whatever it loses): until then it waits
//!   for work to end or checkpoint.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::place::Strategy;

mod text;
mod validate;
use self::text::{bytes_text, duration_text, memory_text, optional_duration_text, thousandths};

/// The largest policy document accepted, so a stray file cannot exhaust memory.
pub const MAX_POLICY_BYTES: usize = 1 << 20;

/// The resource names used in YAML, in quota errors and in [`super::WaitReason`],
/// indexed like the arrays the core keeps: GPU, CPU, memory.
pub const RESOURCE_NAMES: [&str; 3] = ["gpu", "cpu", "memory"];

/// The most leases a policy declares, and the most a trial or quota names.
pub const MAX_LEASES: usize = 256;
/// The largest capacity of one lease, and the most units one trial asks for.
pub use xp_runtime::spec::MAX_LEASE_UNITS;
/// Lease names: bounded length, a plain character set.
pub use xp_runtime::spec::check_lease_name;

/// The whole policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The queues, in declaration order (which breaks fair-share ties and picks a
    /// team's default queue).
    #[serde(default = "default_queues")]
    pub queues: Vec<QueueConfig>,
    /// Priority class names and their base priorities.
    #[serde(default = "default_priority_classes")]
    pub priority_classes: BTreeMap<String, i64>,
    /// Raises the effective priority of waiting trials; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aging: Option<AgingConfig>,
    /// When running trials may be stopped for waiting ones.
    #[serde(default = "PreemptionConfig::off")]
    pub preemption: PreemptionConfig,
    /// Least-attained-service order inside queues; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attained_service: Option<AttainedServiceConfig>,
    /// How gangs are laid out on nodes.
    #[serde(default)]
    pub placement: PlacementKind,
    /// Which waiting trial goes next.
    #[serde(default)]
    pub order: Order,
    /// Lets trials with a known end start ahead of a blocked trial when they end
    /// before it could start anyway.
    #[serde(default)]
    pub backfill: bool,
    /// What happens behind a trial that cannot start, when not backfilling.
    #[serde(default)]
    pub head_of_line: HeadOfLine,
    /// Backpressure on submissions.
    #[serde(default)]
    pub admission: AdmissionConfig,
    /// Named shared resources and their capacity in units.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leases: BTreeMap<String, u64>,
    /// Cluster-wide alert rules, applied to every experiment unless it declares
    /// a rule of the same name (`xp_runtime::spec::effective_rules`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<xp_runtime::spec::AlertRule>,
    /// Currency units per GPU-hour by GPU model (`declared` for `--gpus N`
    /// slots), with `default` for models not named; what `xp report` costs
    /// GPU-hours at. No prices: no cost.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, f64>,
    /// Which addresses alert webhooks may be posted to beyond public ones.
    #[serde(default, skip_serializing_if = "WebhookPolicy::is_default")]
    pub webhooks: WebhookPolicy,
    /// How many times its capacity a GPU may be promised to fractional workers
    /// that opt in (1 to [`MAX_OVERSUBSCRIPTION`]; 1 is off).
    #[serde(
        default = "no_oversubscription",
        skip_serializing_if = "is_no_oversubscription"
    )]
    pub oversubscription: f64,
    /// What each team may keep in one node's object store.
    #[serde(default, skip_serializing_if = "ObjectQuotas::is_default")]
    pub objects: ObjectQuotas,
}

/// What each team may keep in one node's object store (`objects:`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectQuotas {
    /// Bytes a team's objects may hold in a node's memory tier.
    #[serde(
        rename = "memory",
        default = "default_object_memory",
        with = "bytes_text"
    )]
    pub memory_bytes: u64,
    /// Bytes a team's objects may hold on a node in all.
    #[serde(rename = "disk", default = "default_object_disk", with = "bytes_text")]
    pub disk_bytes: u64,
    /// Quotas of named teams; a field left out is the default's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub teams: BTreeMap<String, TeamObjectQuota>,
}

/// One team's object quota; a field left out is [`ObjectQuotas`]' default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamObjectQuota {
    /// Bytes in a node's memory tier.
    #[serde(
        rename = "memory",
        default,
        with = "memory_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_bytes: Option<u64>,
    /// Bytes on a node in all.
    #[serde(
        rename = "disk",
        default,
        with = "memory_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub disk_bytes: Option<u64>,
}

fn default_object_memory() -> u64 {
    1 << 30
}

fn default_object_disk() -> u64 {
    64 << 30
}

impl Default for ObjectQuotas {
    /// 1 GiB of memory and 64 GiB in all per team per node, no team named.
    fn default() -> Self {
        Self {
            memory_bytes: default_object_memory(),
            disk_bytes: default_object_disk(),
            teams: BTreeMap::new(),
        }
    }
}

impl ObjectQuotas {
    /// Whether it is the default (left out when a policy is written).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// `team`'s memory and disk quota, in bytes.
    pub fn of(&self, team: &str) -> (u64, u64) {
        let named = self.teams.get(team).cloned().unwrap_or_default();
        (
            named.memory_bytes.unwrap_or(self.memory_bytes),
            named.disk_bytes.unwrap_or(self.disk_bytes),
        )
    }
}

/// The largest oversubscription factor a policy may declare.
pub const MAX_OVERSUBSCRIPTION: f64 = xp_runtime::spec::MAX_OVERSUBSCRIPTION_MILLI as f64 / 1000.0;

fn no_oversubscription() -> f64 {
    1.0
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if signature"
)]
fn is_no_oversubscription(factor: &f64) -> bool {
    *factor == 1.0
}

/// The most entries of [`WebhookPolicy::allow`].
pub const MAX_WEBHOOK_ALLOW: usize = 64;

/// Where the head may post alert webhooks. By default only public addresses:
/// loopback, link-local, private (RFC 1918, `fc00::/7`, `100.64.0.0/10`),
/// unspecified, multicast and broadcast ones are refused, so that a member
/// cannot make the head reach its own internal network. `allow_private: true`
/// lifts that; `allow` lifts it for these networks only (CIDRs such as
/// `10.1.2.0/24` or `127.0.0.1/32`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookPolicy {
    /// Every address is allowed.
    #[serde(default)]
    pub allow_private: bool,
    /// Networks allowed even though not public.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<ipnet::IpNet>,
}

impl WebhookPolicy {
    /// Whether nothing beyond public addresses is allowed (the default).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

fn default_queues() -> Vec<QueueConfig> {
    vec![QueueConfig::open("default")]
}

fn default_priority_classes() -> BTreeMap<String, i64> {
    BTreeMap::from([
        ("low".to_owned(), 0),
        ("normal".to_owned(), 100),
        ("high".to_owned(), 1000),
    ])
}

/// One queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// Unique among queues.
    pub name: String,
    /// The team whose trials it takes; `None` takes every team's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Queues of one cohort lend each other their idle quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    /// Fair-share weight; a queue of weight 2 gets twice the share of one of weight 1.
    #[serde(default = "one_f64")]
    pub weight: f64,
    /// Nominal quota; an absent resource is unlimited.
    #[serde(default)]
    pub quota: ResourceLimits,
    /// The most it may use beyond its quota, borrowed from its cohort.
    #[serde(default)]
    pub borrowing_limit: ResourceLimits,
    /// The most of its idle quota the rest of its cohort may use.
    #[serde(default)]
    pub lending_limit: ResourceLimits,
    /// How preemption treats its trials as victims.
    #[serde(default, skip_serializing_if = "QueuePreemption::is_automatic")]
    pub preemption: QueuePreemption,
}

/// How a queue's trials are preempted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueuePreemption {
    /// Whether a preemption of its trials needs a person's approval.
    #[serde(default)]
    pub approval: Approval,
}

impl QueuePreemption {
    /// Whether preemptions happen without asking (the default).
    pub fn is_automatic(&self) -> bool {
        self.approval == Approval::Automatic
    }
}

/// Who approves a preemption the policy wants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// The policy preempts by itself.
    #[default]
    Automatic,
    /// The preemption becomes a request that an admin approves or denies;
    /// nothing is stopped until it is approved. A denial holds for that
    /// victim and claimant until one of them leaves its place (the claimant
    /// starts or ends, or the victim stops), so the same request is not asked
    /// again while the situation that led to it lasts.
    Manual,
}

fn one_f64() -> f64 {
    1.0
}

impl QueueConfig {
    /// A queue open to every team, with no limits.
    pub fn open(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            team: None,
            cohort: None,
            weight: 1.0,
            quota: ResourceLimits::default(),
            borrowing_limit: ResourceLimits::default(),
            lending_limit: ResourceLimits::default(),
            preemption: QueuePreemption::default(),
        }
    }

    /// Whether trials of `team` may use it.
    pub fn accepts(&self, team: &str) -> bool {
        self.team.as_deref().is_none_or(|owner| owner == team)
    }
}

/// An amount per resource; `None` is unlimited (or, for limits, not limited).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceLimits {
    /// GPU thousandths; YAML `gpu: 1.5`.
    #[serde(
        rename = "gpu",
        default,
        with = "thousandths",
        skip_serializing_if = "Option::is_none"
    )]
    pub gpu_milli: Option<u64>,
    /// CPU thousandths; YAML `cpu: 0.5`.
    #[serde(
        rename = "cpu",
        default,
        with = "thousandths",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_milli: Option<u64>,
    /// Memory bytes; YAML `memory: 16GiB` or a plain integer.
    #[serde(
        rename = "memory",
        default,
        with = "memory_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_bytes: Option<u64>,
    /// Lease units by lease name (quotas only); a lease left out is unlimited.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leases: BTreeMap<String, u64>,
}

impl ResourceLimits {
    /// Limits in the core's resource order (GPU, CPU, memory).
    pub fn as_array(&self) -> [Option<u64>; 3] {
        [self.gpu_milli, self.cpu_milli, self.memory_bytes]
    }
}

/// Aging: effective priority = base + min(cap, floor(rate_per_hour × hours waited)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgingConfig {
    /// Priority points gained per hour of waiting.
    pub rate_per_hour: u64,
    /// The most aging adds.
    pub cap: u64,
}

impl AgingConfig {
    /// What aging adds after waiting `waited_ms`.
    pub fn boost(&self, waited_ms: u64) -> i64 {
        let gained = u128::from(self.rate_per_hour) * u128::from(waited_ms) / 3_600_000;
        let capped = gained.min(u128::from(self.cap));
        i64::try_from(capped).unwrap_or(i64::MAX)
    }
}

/// When running trials may be stopped for waiting ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreemptionConfig {
    /// Whether preemption happens at all.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long a victim may take to checkpoint before it is killed.
    #[serde(
        rename = "grace_period",
        default = "default_grace_ms",
        with = "duration_text"
    )]
    pub grace_period_ms: u64,
    /// A trial runs at least this long after each (re)start before it can be preempted.
    #[serde(
        rename = "min_run_time",
        default = "default_min_run_ms",
        with = "duration_text"
    )]
    pub min_run_time_ms: u64,
    /// A victim that would lose more run time than this (since its last
    /// checkpoint) is passed over while a cheaper set of victims makes room;
    /// `None` is no limit.
    #[serde(
        rename = "max_loss",
        default,
        with = "optional_duration_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_loss_ms: Option<u64>,
}

/// Least attained service: levels of GPU time received, promotion of long
/// waiters, and when a gang with no room holds the line (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttainedServiceConfig {
    /// Level edges in GPU-hours received, increasing; `n` edges make `n + 1`
    /// levels. Under `levels: adaptive` only the prior, used until enough
    /// trials have completed, and the number of edges.
    #[serde(default = "default_las_thresholds")]
    pub thresholds_gpu_hours: Vec<f64>,
    /// Where the level edges come from: `adaptive` (the default) follows the
    /// service that recently completed trials received (see the module docs),
    /// `fixed` keeps `thresholds_gpu_hours` as written.
    #[serde(default)]
    pub levels: LevelSource,
    /// Under `levels: adaptive`, the quantile of recently completed trials'
    /// service at each edge: one per threshold, increasing, within (0, 1).
    /// Absent: [`default_level_quantiles`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantiles: Option<Vec<f64>>,
    /// A waiting trial goes back to level 0 once its wait since it was last
    /// queued exceeds this many times the time it has run; 0 never.
    #[serde(default = "default_promote_after")]
    pub promote_after: u32,
    /// A trial with no room holds up the trials behind it in its queue only
    /// once it has waited this long since it was last queued.
    #[serde(
        rename = "reserve_after",
        default = "default_reserve_after_ms",
        with = "duration_text"
    )]
    pub reserve_after_ms: u64,
    /// Within a level, a trial queues as if submitted this much later for
    /// each GPU it asks beyond one: with no duration known, the GPU time a
    /// trial will take is expected to grow with its GPUs, so smaller gangs
    /// go first, but only by a bounded time, so no gang starves behind a
    /// stream of small trials (1 h by default; the delay of a gang is at most
    /// `reserve_after`). 0 is plain FIFO within a level; ignored beside
    /// `aging`, which orders by the real submission time.
    #[serde(
        rename = "delay_per_gpu",
        default = "default_delay_per_gpu_ms",
        with = "duration_text"
    )]
    pub delay_per_gpu_ms: u64,
    /// `smallest_first`, which `delay_per_gpu` replaced: read and ignored, so
    /// that a policy stored with it still loads; never written.
    #[serde(default, rename = "smallest_first", skip_serializing)]
    pub retired_smallest_first: Option<bool>,
}

/// The most level edges of `attained_service`.
pub const MAX_LAS_THRESHOLDS: usize = 8;

/// Where the attained-service level edges come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LevelSource {
    /// Quantiles of the service recently completed trials received, with
    /// `thresholds_gpu_hours` as the prior before there are enough.
    #[default]
    Adaptive,
    /// `thresholds_gpu_hours` as written.
    Fixed,
}

/// The quantile of completed trials' service at each of `n` adaptive edges
/// when the policy names none: the first edge at the median, each next one
/// halving what is left above the one before (0.5, 0.75, 0.875, ...), so that
/// every level holds half of the trials that reach it.
pub fn default_level_quantiles(n: usize) -> Vec<f64> {
    let mut above = 1.0;
    (0..n)
        .map(|_| {
            above /= 2.0;
            1.0 - above
        })
        .collect()
}

fn default_las_thresholds() -> Vec<f64> {
    vec![2.0, 32.0]
}

fn default_promote_after() -> u32 {
    2
}

fn default_delay_per_gpu_ms() -> u64 {
    3_600_000
}

fn default_reserve_after_ms() -> u64 {
    48 * 3_600_000
}

impl Default for AttainedServiceConfig {
    fn default() -> Self {
        Self {
            thresholds_gpu_hours: default_las_thresholds(),
            promote_after: default_promote_after(),
            reserve_after_ms: default_reserve_after_ms(),
            delay_per_gpu_ms: default_delay_per_gpu_ms(),
            levels: LevelSource::default(),
            quantiles: None,
            retired_smallest_first: None,
        }
    }
}

impl AttainedServiceConfig {
    /// The level edges in GPU-milliseconds, as the core counts service.
    pub fn thresholds_gpu_ms(&self) -> Vec<u64> {
        self.thresholds_gpu_hours
            .iter()
            .map(|hours| (hours * 3_600_000.0).round().min(u64::MAX as f64) as u64)
            .collect()
    }

    /// The quantile at each adaptive edge: as written, else the default rule.
    pub fn edge_quantiles(&self) -> Vec<f64> {
        self.quantiles
            .clone()
            .unwrap_or_else(|| default_level_quantiles(self.thresholds_gpu_hours.len()))
    }
}

/// The longest `delay_per_gpu` accepted: beyond it a gang's place would
/// mean nothing but "after everything smaller", which `reserve_after` ends
/// anyway.
pub const MAX_DELAY_PER_GPU_MS: u64 = 7 * 24 * 3_600_000;

fn yes() -> bool {
    true
}

fn default_grace_ms() -> u64 {
    60_000
}

fn default_min_run_ms() -> u64 {
    300_000
}

impl PreemptionConfig {
    /// Preemption disabled, with the default durations.
    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::on()
        }
    }

    /// Preemption enabled, 60 s grace, 5 min minimum run time, no loss limit.
    pub fn on() -> Self {
        Self {
            enabled: true,
            grace_period_ms: default_grace_ms(),
            min_run_time_ms: default_min_run_ms(),
            max_loss_ms: None,
        }
    }
}

/// How gangs are laid out on nodes; see [`Strategy`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementKind {
    /// Fill the fullest nodes first.
    #[default]
    #[serde(rename = "binpack")]
    BinPack,
    /// Prefer the emptiest nodes.
    Spread,
    /// Any fitting nodes (a baseline for `xp sim`); the seed comes from the core.
    Random,
    /// Bin-pack, keeping idle GPUs and nodes whole.
    FragmentationAware,
    /// FGD ("Beware of Fragmentation", ATC 2023): the node (and GPU) where
    /// the expected fragmentation against the recent trials' mix of asks
    /// grows least (see [`Strategy::FragmentationAware`]).
    Fgd,
}

impl PlacementKind {
    /// The node pool's strategy; `seed` is used by [`PlacementKind::Random`] only.
    pub fn strategy(self, seed: u64) -> Strategy {
        match self {
            Self::BinPack => Strategy::BinPack,
            Self::Spread => Strategy::Spread,
            Self::Random => Strategy::Random { seed },
            // The same strategy: the pool scores by FGD once it has a mix,
            // which the core keeps only under `Fgd`.
            Self::FragmentationAware | Self::Fgd => Strategy::FragmentationAware,
        }
    }
}

/// Which waiting trial goes next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Submission order over all queues; priorities are ignored.
    Fifo,
    /// Effective priority over all queues, then submission order.
    Priority,
    /// Between queues the lowest weighted dominant-resource share goes first;
    /// inside a queue, effective priority then submission order.
    #[default]
    Fair,
}

/// What happens behind a trial that cannot start, when not backfilling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadOfLine {
    /// Nothing behind it starts (per queue with `order: fair`; over all queues
    /// otherwise, except that a trial held back by its own queue's quota stops only
    /// that queue).
    #[default]
    Strict,
    /// The next trials are tried; big gangs may starve.
    Skip,
}

/// Backpressure on submissions, and what one submission and one user may
/// make the head hold.
///
/// A submission's expanded size is its trials times the bytes of each
/// trial's rendered configuration and command (the head's estimate, exact for
/// a grid and an upper bound for sampled searches); the head holds every
/// trial's configuration for as long as it keeps the experiment, so these
/// bound its memory and database per submission and per team.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionConfig {
    /// The most waiting (or held) trials a team may have, the submission
    /// being admitted included.
    #[serde(default = "default_max_pending")]
    pub max_pending_per_team: u64,
    /// The retry hint given with a refusal.
    #[serde(
        rename = "retry_after",
        default = "default_retry_ms",
        with = "duration_text"
    )]
    pub retry_after_ms: u64,
    /// The largest expanded size of one submission (`16MiB`).
    #[serde(default = "default_max_submission_bytes", with = "bytes_text")]
    pub max_submission_bytes: u64,
    /// The largest expanded size of a team's unfinished trials, the
    /// submission being admitted included (`64MiB`).
    #[serde(default = "default_max_team_bytes", with = "bytes_text")]
    pub max_team_bytes: u64,
    /// The most driver binaries one user keeps on the head at once.
    #[serde(default = "default_max_blobs_per_user")]
    pub max_blobs_per_user: u64,
    /// The most bytes of driver binaries one user keeps on the head (`2GiB`).
    #[serde(default = "default_max_blob_bytes_per_user", with = "bytes_text")]
    pub max_blob_bytes_per_user: u64,
    /// The memory a worker whose trial declares none is limited to and
    /// counted at (`2GiB`; the head gives less where the worker's CPUs'
    /// share of the smallest node's memory is less): no worker runs without
    /// a limit.
    #[serde(default = "default_memory_per_worker", with = "bytes_text")]
    pub default_memory_per_worker: u64,
}

fn default_max_pending() -> u64 {
    10_000
}

fn default_retry_ms() -> u64 {
    5_000
}

fn default_max_submission_bytes() -> u64 {
    16 << 20
}

fn default_max_team_bytes() -> u64 {
    64 << 20
}

fn default_max_blobs_per_user() -> u64 {
    16
}

fn default_max_blob_bytes_per_user() -> u64 {
    2 << 30
}

fn default_memory_per_worker() -> u64 {
    2 << 30
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_pending_per_team: default_max_pending(),
            retry_after_ms: default_retry_ms(),
            max_submission_bytes: default_max_submission_bytes(),
            max_team_bytes: default_max_team_bytes(),
            max_blobs_per_user: default_max_blobs_per_user(),
            max_blob_bytes_per_user: default_max_blob_bytes_per_user(),
            default_memory_per_worker: default_memory_per_worker(),
        }
    }
}

/// Why a policy file is rejected, or a new policy cannot replace the old one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The document is not valid YAML for this schema; the message carries the
    /// line and column.
    #[error("invalid policy file: {message}")]
    Parse {
        /// The parser's message, with the location it points at.
        message: String,
    },
    /// The document is larger than [`MAX_POLICY_BYTES`].
    #[error("policy file is {len} bytes, more than the limit of {max}")]
    TooLarge {
        /// The document's size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A field has a value outside what is allowed.
    #[error("invalid value for `{field}`: {reason}")]
    Invalid {
        /// Where, such as `queues[vision].lending_limit.gpu`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A new policy drops a queue that holds trials, and no queue of the new
    /// policy takes their team's work.
    #[error(
        "queue {queue} holds trials of team {team}, and the new policy has no queue for that team"
    )]
    NoQueueForTeam {
        /// The team.
        team: String,
        /// The queue that disappears.
        queue: String,
    },
}

impl Default for PolicyConfig {
    /// The `default` preset.
    fn default() -> Self {
        Self::preset("default").expect("the default preset exists")
    }
}

impl PolicyConfig {
    /// The names [`PolicyConfig::preset`] knows.
    pub const PRESETS: [&'static str; 5] = ["fifo", "priority", "fair", "backfill", "default"];

    /// What an empty policy file means: one open queue, fair order, strict head of
    /// line, nothing else.
    pub fn base() -> Self {
        Self {
            queues: default_queues(),
            priority_classes: default_priority_classes(),
            aging: None,
            preemption: PreemptionConfig::off(),
            attained_service: None,
            placement: PlacementKind::BinPack,
            order: Order::Fair,
            backfill: false,
            head_of_line: HeadOfLine::Strict,
            admission: AdmissionConfig::default(),
            leases: BTreeMap::new(),
            alerts: Vec::new(),
            prices: BTreeMap::new(),
            webhooks: WebhookPolicy::default(),
            oversubscription: 1.0,
            objects: ObjectQuotas::default(),
        }
    }

    /// The oversubscription factor in thousandths (1000: none).
    pub fn oversubscription_milli(&self) -> u64 {
        (self.oversubscription.clamp(1.0, MAX_OVERSUBSCRIPTION) * 1000.0).round() as u64
    }

    /// A built-in policy:
    ///
    /// - `fifo`: submission order, strict head of line, no backfill, no preemption.
    /// - `priority`: priority order, strict, no backfill, preemption by priority.
    /// - `fair`: weighted dominant-resource fair share between queues, strict per queue.
    /// - `backfill`: `fair` plus backfill.
    /// - `default`: `backfill` plus least attained service inside queues (the
    ///   default thresholds, promotion, `reserve_after` and `delay_per_gpu`),
    ///   preemption that loses at most 5 min of work
    ///   where it can (so mostly just after a checkpoint), and fragmentation-aware
    ///   placement; no aging, as promotion keeps anyone from starving within a
    ///   class.
    pub fn preset(name: &str) -> Option<Self> {
        let base = Self::base();
        let config = match name {
            "fifo" => Self {
                order: Order::Fifo,
                ..base
            },
            "priority" => Self {
                order: Order::Priority,
                preemption: PreemptionConfig::on(),
                ..base
            },
            "fair" => base,
            "backfill" => Self {
                backfill: true,
                ..base
            },
            "default" => Self {
                backfill: true,
                preemption: PreemptionConfig {
                    max_loss_ms: Some(5 * 60_000),
                    ..PreemptionConfig::on()
                },
                attained_service: Some(AttainedServiceConfig::default()),
                placement: PlacementKind::FragmentationAware,
                ..base
            },
            _ => return None,
        };
        Some(config)
    }

    /// Parses and validates a YAML policy document.
    pub fn from_yaml(text: &str) -> Result<Self, PolicyError> {
        if text.len() > MAX_POLICY_BYTES {
            return Err(PolicyError::TooLarge {
                len: text.len(),
                max: MAX_POLICY_BYTES,
            });
        }
        // An empty document (or one with only comments) is the empty policy.
        let config: Self = if text.lines().all(|line| {
            let line = line.trim();
            line.is_empty() || line.starts_with('#') || line == "---"
        }) {
            Self::base()
        } else {
            serde_saphyr::from_str(text).map_err(|error| PolicyError::Parse {
                message: error.to_string(),
            })?
        };
        config.validate()?;
        Ok(config)
    }

    /// The base priority of a priority class.
    pub fn priority_value(&self, class_name: &str) -> Option<i64> {
        self.priority_classes.get(class_name).copied()
    }

    /// The queue named `name`.
    pub fn queue(&self, name: &str) -> Option<&QueueConfig> {
        self.queues.iter().find(|queue| queue.name == name)
    }

    /// The queue a team's trials go to when they name none: its first own queue,
    /// else the open queue named `default`, else the first open queue.
    pub fn default_queue_for(&self, team: &str) -> Option<&QueueConfig> {
        self.queues
            .iter()
            .find(|queue| queue.team.as_deref() == Some(team))
            .or_else(|| {
                self.queues
                    .iter()
                    .find(|queue| queue.name == "default" && queue.team.is_none())
            })
            .or_else(|| self.queues.iter().find(|queue| queue.team.is_none()))
    }
}

#[cfg(test)]
mod tests;
