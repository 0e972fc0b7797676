//! Which webhook delivery is posted next: fair between teams, bounded per
//! team, and with a circuit breaker per destination host.
//!
//! [`Dispatch`] is pure (time is an argument, in milliseconds of a monotonic
//! clock); [`WebhookQueue`] wraps it in a lock for the actor (which pushes)
//! and the delivery task (which takes). Invariants:
//! - a team holds at most [`PER_TEAM_CAPACITY`] waiting deliveries and a push
//!   beyond drops that team's oldest; when all teams together hold
//!   [`QUEUE_CAPACITY`], the longest team's oldest goes: one team's flood only
//!   ever drops its own deliveries while others are under their share;
//! - teams are served round robin, and at most [`TEAM_IN_FLIGHT`] deliveries
//!   of one team and [`HOST_IN_FLIGHT`] to one host are posted at once, so a
//!   receiver that holds connections open (a tarpit) holds few slots;
//! - after [`BREAKER_FAILURES`] failed attempts in a row to one host, its
//!   deliveries are not sent for [`BREAKER_COOL_DOWN_MS`] (they end
//!   `dropped: host failing` at once); after that one success closes the
//!   breaker and one more failure opens it again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::Notify;

use super::address::AddressRule;
use xp_head_core::alerts::WebhookDelivery;

/// The most deliveries waiting, all teams together.
pub(crate) const QUEUE_CAPACITY: usize = 1024;
/// The most deliveries of one team waiting.
pub(crate) const PER_TEAM_CAPACITY: usize = 256;
/// Deliveries of one team posted at once.
pub(crate) const TEAM_IN_FLIGHT: u32 = 4;
/// Deliveries to one host posted at once.
pub(crate) const HOST_IN_FLIGHT: u32 = 2;
/// Failed attempts in a row that open a host's breaker.
pub(crate) const BREAKER_FAILURES: u32 = 5;
/// How long an open breaker skips its host.
pub(crate) const BREAKER_COOL_DOWN_MS: u64 = 60_000;
/// The most hosts whose failures are remembered (the idle ones go first).
const MAX_HOSTS: usize = 4096;

/// What to do with the next delivery.
#[derive(Debug, PartialEq)]
pub(crate) enum Next {
    /// Post it (then call [`Dispatch::finished`]).
    Post(WebhookDelivery),
    /// Its host's breaker is open: end it as `dropped: host failing`.
    HostFailing(WebhookDelivery),
}

#[derive(Debug, Default)]
struct Host {
    failures: u32,
    open_until: Option<u64>,
    in_flight: u32,
}

/// The waiting deliveries and what is in flight (see the module's invariants).
#[derive(Debug)]
pub(crate) struct Dispatch {
    teams: BTreeMap<String, VecDeque<WebhookDelivery>>,
    waiting: usize,
    capacity: usize,
    per_team: usize,
    /// The team served last: the next turn starts after it.
    last_team: Option<String>,
    team_in_flight: HashMap<String, u32>,
    hosts: HashMap<String, Host>,
}

/// The host (and port) a delivery goes to: what the breaker and the per-host
/// bound are kept by. An unparsable URL (refused when declared) is its own
/// host.
pub(crate) fn host_of(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(url) => format!(
            "{}:{}",
            url.host_str().unwrap_or_default().to_ascii_lowercase(),
            url.port_or_known_default().unwrap_or(0)
        ),
        Err(_) => url.to_owned(),
    }
}

impl Dispatch {
    /// An empty dispatch holding at most `capacity` deliveries, `per_team` of
    /// one team (each at least one).
    pub(crate) fn new(capacity: usize, per_team: usize) -> Self {
        Self {
            teams: BTreeMap::new(),
            waiting: 0,
            capacity: capacity.max(1),
            per_team: per_team.max(1),
            last_team: None,
            team_in_flight: HashMap::new(),
            hosts: HashMap::new(),
        }
    }

    /// Queues a delivery; returns the one dropped to make room, if any.
    pub(crate) fn push(&mut self, delivery: WebhookDelivery) -> Option<WebhookDelivery> {
        let own = self.teams.get(&delivery.team).map_or(0, VecDeque::len);
        let victim = if own >= self.per_team {
            Some(delivery.team.clone())
        } else if self.waiting >= self.capacity {
            // The longest queue gives way (the first such team in name order).
            self.teams
                .iter()
                .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
                .map(|(team, _)| team.clone())
        } else {
            None
        };
        let dropped = victim.and_then(|team| self.pop_front_of(&team, 0));
        self.waiting += 1;
        self.teams
            .entry(delivery.team.clone())
            .or_default()
            .push_back(delivery);
        dropped
    }

    fn pop_front_of(&mut self, team: &str, index: usize) -> Option<WebhookDelivery> {
        let queue = self.teams.get_mut(team)?;
        let delivery = queue.remove(index)?;
        if queue.is_empty() {
            self.teams.remove(team);
        }
        self.waiting -= 1;
        Some(delivery)
    }

    /// Whether `host`'s breaker is open at `now`.
    pub(crate) fn host_failing(&self, host: &str, now: u64) -> bool {
        self.hosts
            .get(host)
            .and_then(|state| state.open_until)
            .is_some_and(|until| now < until)
    }

    /// The next delivery to act on at `now`, round robin over teams: the
    /// first waiting one of the next team that may post, whose host may take
    /// another post or is failing. `None` when nothing may go now.
    pub(crate) fn next(&mut self, now: u64) -> Option<Next> {
        let order: Vec<String> = {
            let after = self.last_team.as_deref().unwrap_or("");
            let (later, earlier): (Vec<&String>, Vec<&String>) = self
                .teams
                .keys()
                .partition(|team| self.last_team.is_none() || team.as_str() > after);
            later.into_iter().chain(earlier).cloned().collect()
        };
        for team in order {
            let busy = self.team_in_flight.get(&team).copied().unwrap_or(0) >= TEAM_IN_FLIGHT;
            let queue = &self.teams[&team];
            let chosen = queue.iter().enumerate().find_map(|(index, delivery)| {
                let host = host_of(&delivery.url);
                if self.host_failing(&host, now) {
                    Some((index, host, true))
                } else if !busy
                    && self.hosts.get(&host).map_or(0, |state| state.in_flight) < HOST_IN_FLIGHT
                {
                    Some((index, host, false))
                } else {
                    None
                }
            });
            let Some((index, host, failing)) = chosen else {
                continue;
            };
            let delivery = self
                .pop_front_of(&team, index)
                .expect("the index was just found");
            self.last_team = Some(team.clone());
            if failing {
                return Some(Next::HostFailing(delivery));
            }
            *self.team_in_flight.entry(team).or_default() += 1;
            self.host_mut(&host).in_flight += 1;
            return Some(Next::Post(delivery));
        }
        None
    }

    /// Notes one attempt to `host` at `now`: a success closes its breaker, a
    /// failure counts towards opening it.
    pub(crate) fn attempt_ended(&mut self, host: &str, succeeded: bool, now: u64) {
        let state = self.host_mut(host);
        if succeeded {
            state.failures = 0;
            state.open_until = None;
        } else {
            state.failures = state.failures.saturating_add(1);
            if state.failures >= BREAKER_FAILURES {
                state.open_until = Some(now.saturating_add(BREAKER_COOL_DOWN_MS));
            }
        }
    }

    /// A posted delivery of `team` to `host` ended: its slots are free.
    pub(crate) fn finished(&mut self, team: &str, host: &str) {
        if let Some(count) = self.team_in_flight.get_mut(team) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.team_in_flight.remove(team);
            }
        }
        if let Some(state) = self.hosts.get_mut(host) {
            state.in_flight = state.in_flight.saturating_sub(1);
        }
    }

    fn host_mut(&mut self, host: &str) -> &mut Host {
        if !self.hosts.contains_key(host) && self.hosts.len() >= MAX_HOSTS {
            // Forget healthy idle hosts first: what they knew is "no failures".
            self.hosts
                .retain(|_, state| state.in_flight > 0 || state.failures > 0);
            if self.hosts.len() >= MAX_HOSTS {
                self.hosts.retain(|_, state| state.in_flight > 0);
            }
        }
        self.hosts.entry(host.to_owned()).or_default()
    }

    /// How many deliveries wait.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.waiting
    }
}

/// The dispatch shared by the actor and the delivery task, with the address
/// rule in force.
#[derive(Debug)]
pub(crate) struct WebhookQueue {
    dispatch: Mutex<Dispatch>,
    rule: Arc<RwLock<AddressRule>>,
    /// Woken by a push and by a post ending (a slot freed).
    pub(super) arrived: Notify,
}

impl WebhookQueue {
    /// An empty queue holding at most `capacity` deliveries (see [`Dispatch::new`]).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            dispatch: Mutex::new(Dispatch::new(capacity, PER_TEAM_CAPACITY.min(capacity))),
            rule: Arc::new(RwLock::new(AddressRule::default())),
            arrived: Notify::new(),
        }
    }

    /// Runs `f` on the dispatch under its lock (held for a moment only).
    pub(super) fn with<T>(&self, f: impl FnOnce(&mut Dispatch) -> T) -> T {
        f(&mut self.dispatch.lock().expect("no holder of this lock panics"))
    }

    /// Queues a delivery; returns the one dropped to make room, if any.
    /// Never blocks beyond a short lock.
    pub(crate) fn push(&self, delivery: WebhookDelivery) -> Option<WebhookDelivery> {
        let dropped = self.with(|dispatch| dispatch.push(delivery));
        self.arrived.notify_one();
        dropped
    }

    /// Sets the address rule from the policy (a no-op when unchanged).
    pub(crate) fn set_policy(&self, policy: &xp_sched::config::WebhookPolicy) {
        let rule = AddressRule::new(policy.clone());
        let unchanged = *self.rule.read().expect("no holder of this lock panics") == rule;
        if !unchanged {
            *self.rule.write().expect("no holder of this lock panics") = rule;
        }
    }

    /// The address rule, shared with the resolver.
    pub(super) fn rule(&self) -> Arc<RwLock<AddressRule>> {
        self.rule.clone()
    }
}
