//! Alert webhooks: a fair, bounded queue the actor pushes to ([`queue`]), and
//! the task that posts each alert's JSON body, retrying with exponential
//! back-off, outside the actor.
//!
//! The actor never waits on a receiver: [`WebhookQueue::push`] takes a lock for
//! a moment and, when the queue is full, drops an oldest delivery (of the same
//! team, or of the team holding the most), which the actor records as
//! `dropped` and counts. The task ([`run`]) posts at most [`CONCURRENCY`]
//! deliveries at once, fairly between teams and few per host, each request
//! bounded by [`REQUEST_TIMEOUT`], with at most [`MAX_ATTEMPTS`] attempts
//! spaced by [`backoff_ms`], and tells the actor how each ended
//! (`AlertMsg::Delivered`), which stores it as the alert's delivery state. A
//! host that keeps failing is skipped for a while ([`queue`]'s breaker).
//!
//! Only public addresses are posted to unless the policy allows more
//! ([`address`]), judged on the address connected to. Redirects are not
//! followed and no proxy is used (either would connect elsewhere than the
//! address judged). What a receiver answers is not read beyond its status.
//! The URL often holds a secret token: it is never logged nor stored; errors
//! are stored coarse ("timed out", "connection refused", "HTTP 500").

pub(crate) mod address;
pub(crate) mod queue;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};
use xp_runtime::seeded::{SplitMix64, mix_seed};

use self::address::{FilteringResolver, Refused, Unresolved};
use self::queue::{Next, host_of};
pub(crate) use self::queue::{QUEUE_CAPACITY, WebhookQueue};
use crate::metrics::HeadMetrics;
use xp_head_core::alerts::{DeliveryOutcome, WebhookDelivery};

/// Attempts per delivery before it is given up.
pub(crate) const MAX_ATTEMPTS: u32 = 5;
/// The delay after the first failed attempt, before jitter.
pub(crate) const BASE_DELAY_MS: u64 = 500;
/// The longest delay between attempts, before jitter.
pub(crate) const MAX_DELAY_MS: u64 = 30_000;
/// The longest one request may take, connection included.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Deliveries posted at once, so one slow receiver does not hold up the others.
pub(crate) const CONCURRENCY: usize = 8;

/// The delay before attempt `failed + 1`, after `failed` failed attempts:
/// `BASE_DELAY_MS` doubled per failure, capped at `MAX_DELAY_MS`, of which the
/// upper half is scaled by `jitter` (in [0, 1)), so that deliveries that failed
/// together do not come back together ("equal jitter").
pub(crate) fn backoff_ms(failed: u32, jitter: f64) -> u64 {
    let doubled = BASE_DELAY_MS.saturating_mul(1u64 << failed.saturating_sub(1).min(32));
    let delay = doubled.min(MAX_DELAY_MS);
    let half = delay / 2;
    half + (half as f64 * jitter.clamp(0.0, 1.0)) as u64
}

/// Where a delivery's outcome goes: the actor, which stores it as the alert's
/// delivery state (`AlertMsg::Delivered`).
pub(crate) type Outcomes = Arc<dyn Fn(u64, DeliveryOutcome) + Send + Sync>;

/// Posts queued deliveries until `shutdown`; each outcome goes to `outcomes`.
pub(crate) async fn run(
    queue: Arc<WebhookQueue>,
    outcomes: Outcomes,
    metrics: Arc<HeadMetrics>,
    shutdown: CancellationToken,
) {
    let client = match build_client(&queue) {
        Ok(client) => client,
        Err(error) => {
            warn!(%error, "cannot build the webhook client; alert webhooks will not be posted");
            return;
        }
    };
    // The breaker's clock: monotonic, so a wall-clock step cannot open or
    // close it.
    let epoch = Instant::now();
    let now = move || u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
    let turns = Arc::new(Semaphore::new(CONCURRENCY));
    let mut posting = JoinSet::new();
    loop {
        // Start every delivery that may go now; a post ending wakes us again.
        while let Ok(turn) = turns.clone().try_acquire_owned() {
            let Some(next) = queue.with(|dispatch| dispatch.next(now())) else {
                break;
            };
            let delivery = match next {
                Next::HostFailing(delivery) => {
                    drop(turn);
                    report(
                        &outcomes,
                        &metrics,
                        delivery.alert,
                        DeliveryOutcome::HostFailing,
                    );
                    continue;
                }
                Next::Post(delivery) => delivery,
            };
            let (client, outcomes, metrics, shutdown, queue) = (
                client.clone(),
                outcomes.clone(),
                metrics.clone(),
                shutdown.clone(),
                queue.clone(),
            );
            let span = info_span!("webhook", alert = delivery.alert);
            posting.spawn(
                async move {
                    let host = host_of(&delivery.url);
                    let outcome = deliver(&client, &queue, &host, &delivery, now, &shutdown).await;
                    queue.with(|dispatch| dispatch.finished(&delivery.team, &host));
                    drop(turn);
                    queue.arrived.notify_one();
                    if let Some(outcome) = outcome {
                        report(&outcomes, &metrics, delivery.alert, outcome);
                    }
                }
                .instrument(span),
            );
        }
        while posting.try_join_next().is_some() {}
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = queue.arrived.notified() => {}
        }
    }
    posting.shutdown().await;
}

/// The client every delivery is posted with: bounded in time, no redirects,
/// no proxy, names resolved through the queue's address rule.
fn build_client(queue: &WebhookQueue) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(FilteringResolver::new(queue.rule())))
        .user_agent(concat!("xp-head/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Counts an outcome and hands it on.
fn report(outcomes: &Outcomes, metrics: &HeadMetrics, alert: u64, outcome: DeliveryOutcome) {
    metrics.webhook_delivery(match outcome {
        DeliveryOutcome::Delivered { .. } => "delivered",
        DeliveryOutcome::Failed { .. } => "failed",
        DeliveryOutcome::Dropped | DeliveryOutcome::HostFailing => "dropped",
    });
    outcomes(alert, outcome);
}

/// Posts one delivery with retries; `None` when shut down before it ended.
/// Each attempt's end feeds `host`'s breaker; once the breaker is open, the
/// retries stop (`HostFailing`). An address the rule refuses fails at once,
/// with no connection made.
async fn deliver(
    client: &reqwest::Client,
    queue: &WebhookQueue,
    host: &str,
    delivery: &WebhookDelivery,
    now: impl Fn() -> u64,
    shutdown: &CancellationToken,
) -> Option<DeliveryOutcome> {
    // An IP literal is connected to without resolving: judge it here.
    if let Some(ip) = literal_ip(&delivery.url) {
        let rule = queue.rule();
        let verdict = rule
            .read()
            .expect("no holder of this lock panics")
            .check(ip);
        if let Err(refused) = verdict {
            return Some(refusal(refused));
        }
    }
    let mut jitter = SplitMix64::new(mix_seed(delivery.alert, delivery.url.len() as u64));
    let mut last_error = String::new();
    for attempt in 1..=MAX_ATTEMPTS {
        let sent = client
            .post(&delivery.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(delivery.body.clone())
            .send();
        let answer = tokio::select! {
            () = shutdown.cancelled() => return None,
            answer = sent => answer,
        };
        match answer {
            Ok(response) if response.status().is_success() => {
                queue.with(|dispatch| dispatch.attempt_ended(host, true, now()));
                debug!(attempt, status = %response.status(), "webhook delivered");
                return Some(DeliveryOutcome::Delivered { attempts: attempt });
            }
            Ok(response) => last_error = format!("HTTP {}", response.status().as_u16()),
            Err(error) => {
                if let Some(refused) = find_in_chain::<Refused>(&error) {
                    // A resolved name the rule refuses: not the host's fault.
                    return Some(refusal(*refused));
                }
                last_error = coarse(&error);
                // The chain for operators, without the URL (it may hold a token).
                let chain = xp_runtime::error_chain::error_chain(&error.without_url());
                debug!(attempt, error = %chain, "webhook attempt failed");
            }
        }
        queue.with(|dispatch| dispatch.attempt_ended(host, false, now()));
        debug!(attempt, error = %last_error, "webhook attempt failed");
        if attempt < MAX_ATTEMPTS {
            let delay = backoff_ms(attempt, jitter.next_f64());
            tokio::select! {
                () = shutdown.cancelled() => return None,
                () = tokio::time::sleep(Duration::from_millis(delay)) => {}
            }
            if queue.with(|dispatch| dispatch.host_failing(host, now())) {
                return Some(DeliveryOutcome::HostFailing);
            }
        }
    }
    Some(DeliveryOutcome::Failed {
        attempts: MAX_ATTEMPTS,
        error: last_error,
    })
}

/// How a refused address ends a delivery: failed, no attempt made.
fn refusal(refused: Refused) -> DeliveryOutcome {
    DeliveryOutcome::Failed {
        attempts: 0,
        error: refused.to_string(),
    }
}

/// The URL's host when it is an IP address.
fn literal_ip(url: &str) -> Option<std::net::IpAddr> {
    match url::Url::parse(url).ok()?.host()? {
        url::Host::Ipv4(ip) => Some(ip.into()),
        url::Host::Ipv6(ip) => Some(ip.into()),
        url::Host::Domain(_) => None,
    }
}

/// The first error of type `E` in `error`'s source chain.
fn find_in_chain<'a, E: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut next = Some(error);
    while let Some(current) = next {
        if let Some(found) = current.downcast_ref::<E>() {
            return Some(found);
        }
        next = current.source();
    }
    None
}

/// What users see of a failed attempt: a few words, never the URL.
fn coarse(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "timed out".to_owned();
    }
    if find_in_chain::<Unresolved>(error).is_some() {
        return "cannot resolve the host".to_owned();
    }
    if let Some(io) = find_in_chain::<std::io::Error>(error) {
        return match io.kind() {
            std::io::ErrorKind::ConnectionRefused => "connection refused",
            std::io::ErrorKind::ConnectionReset => "connection reset",
            std::io::ErrorKind::TimedOut => "timed out",
            _ => "cannot connect",
        }
        .to_owned();
    }
    if error.is_connect() {
        "cannot connect".to_owned()
    } else {
        "request failed".to_owned()
    }
}
