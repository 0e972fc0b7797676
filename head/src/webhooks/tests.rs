//! The webhook queue's fairness, bounds and breaker (pure, time as an
//! argument), the back-off schedule, and a refused address never connected to.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::queue::{
    BREAKER_COOL_DOWN_MS, BREAKER_FAILURES, Dispatch, HOST_IN_FLIGHT, Next, TEAM_IN_FLIGHT, host_of,
};
use super::*;

#[test]
fn backoff_doubles_to_its_cap_with_jitter_in_the_upper_half() {
    let low: Vec<u64> = (1..=9).map(|failed| backoff_ms(failed, 0.0)).collect();
    assert_eq!(low, [250, 500, 1000, 2000, 4000, 8000, 15000, 15000, 15000]);
    let high: Vec<u64> = (1..=9)
        .map(|failed| backoff_ms(failed, 0.999_999))
        .collect();
    assert_eq!(
        high,
        [499, 999, 1999, 3999, 7999, 15999, 29999, 29999, 29999]
    );
    // Huge counts neither overflow nor pass the cap.
    assert!(backoff_ms(u32::MAX, 0.5) <= MAX_DELAY_MS);
    // The whole schedule of a delivery stays well under a few minutes.
    let worst: u64 = (1..MAX_ATTEMPTS)
        .map(|failed| backoff_ms(failed, 1.0))
        .sum();
    assert!(worst < 60_000, "{worst}");
}

fn delivery(alert: u64, team: &str, url: &str) -> WebhookDelivery {
    WebhookDelivery {
        alert,
        url: url.to_owned(),
        body: "{}".to_owned(),
        team: team.to_owned(),
    }
}

fn posted(next: Option<Next>) -> (u64, String) {
    match next {
        Some(Next::Post(delivery)) => (delivery.alert, delivery.team),
        other => panic!("expected a post, got {other:?}"),
    }
}

#[test]
fn a_flooding_team_drops_only_its_own_oldest() {
    let mut dispatch = Dispatch::new(6, 3);
    for alert in 1..=3 {
        assert_eq!(
            dispatch.push(delivery(alert, "flood", "http://a.example/")),
            None
        );
    }
    assert_eq!(
        dispatch.push(delivery(10, "quiet", "http://b.example/")),
        None
    );
    // Past its own bound, the flooding team loses its own oldest.
    let dropped = dispatch.push(delivery(4, "flood", "http://a.example/"));
    assert_eq!(
        dropped.map(|dropped| (dropped.alert, dropped.team)),
        Some((1, "flood".to_owned()))
    );
    assert_eq!(
        dispatch.push(delivery(11, "quiet", "http://b.example/")),
        None
    );
    assert_eq!(
        dispatch.push(delivery(12, "quiet", "http://b.example/")),
        None
    );
    // Full (6): the longest team gives way, not the one pushing.
    assert_eq!(dispatch.len(), 6);
    let dropped = dispatch.push(delivery(20, "third", "http://c.example/"));
    assert_eq!(dropped.map(|dropped| dropped.alert), Some(2));
    assert_eq!(dispatch.len(), 6);
}

#[test]
fn teams_take_turns() {
    let mut dispatch = Dispatch::new(100, 100);
    // Each delivery to its own host, so that no host bound interferes.
    for alert in 0..3 {
        dispatch.push(delivery(alert, "a", &format!("http://a{alert}.example/")));
    }
    dispatch.push(delivery(10, "b", "http://b0.example/"));
    dispatch.push(delivery(20, "c", "http://c0.example/"));
    let order: Vec<(u64, String)> = (0..5).map(|_| posted(dispatch.next(0))).collect();
    let teams: Vec<&str> = order.iter().map(|(_, team)| team.as_str()).collect();
    assert_eq!(teams, ["a", "b", "c", "a", "a"]);
    assert_eq!(order[0].0, 0, "a team's own deliveries go oldest first");
    assert!(dispatch.next(0).is_none());
}

#[test]
fn a_slow_host_and_a_busy_team_hold_few_slots() {
    let mut dispatch = Dispatch::new(100, 100);
    for alert in 0..10 {
        dispatch.push(delivery(alert, "a", "http://tarpit.example/"));
    }
    for alert in 10..20 {
        dispatch.push(delivery(alert, "a", &format!("http://h{alert}.example/")));
    }
    dispatch.push(delivery(100, "b", "http://fine.example/"));
    let mut of_a = 0;
    let mut to_tarpit = 0;
    let mut of_b = 0;
    while let Some(next) = dispatch.next(0) {
        let Next::Post(delivery) = next else {
            panic!("no host is failing")
        };
        if delivery.team == "a" {
            of_a += 1;
        } else {
            of_b += 1;
        }
        if delivery.url.contains("tarpit") {
            to_tarpit += 1;
        }
    }
    assert_eq!(to_tarpit, HOST_IN_FLIGHT);
    assert_eq!(of_a, TEAM_IN_FLIGHT);
    assert_eq!(of_b, 1, "the other team still gets its turn");
    // A slot freed lets the next one of that team go.
    dispatch.finished("a", &host_of("http://tarpit.example/"));
    assert!(matches!(dispatch.next(0), Some(Next::Post(_))));
}

#[test]
fn a_failing_host_is_skipped_for_a_cool_down() {
    let mut dispatch = Dispatch::new(100, 100);
    let host = host_of("http://down.example/hook?token=x");
    assert_eq!(host, "down.example:80");
    for _ in 1..BREAKER_FAILURES {
        dispatch.attempt_ended(&host, false, 1_000);
    }
    assert!(!dispatch.host_failing(&host, 1_000));
    dispatch.attempt_ended(&host, false, 1_000);
    assert!(dispatch.host_failing(&host, 1_000));
    // Its deliveries end at once, without a slot; others still go.
    dispatch.push(delivery(1, "a", "http://down.example/other"));
    dispatch.push(delivery(2, "a", "http://up.example/"));
    match dispatch.next(2_000) {
        Some(Next::HostFailing(skipped)) => assert_eq!(skipped.alert, 1),
        other => panic!("expected a skip, got {other:?}"),
    }
    assert_eq!(posted(dispatch.next(2_000)).0, 2);
    // After the cool-down it is tried again: one more failure reopens it.
    let later = 1_000 + BREAKER_COOL_DOWN_MS;
    assert!(!dispatch.host_failing(&host, later));
    dispatch.attempt_ended(&host, false, later);
    assert!(dispatch.host_failing(&host, later + 1));
    // A success closes it for good.
    dispatch.attempt_ended(&host, true, later + 2);
    assert!(!dispatch.host_failing(&host, later + 2));
    dispatch.attempt_ended(&host, false, later + 3);
    assert!(!dispatch.host_failing(&host, later + 3));
}

#[tokio::test]
async fn a_refused_address_fails_without_connecting() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!(
        "http://{}/hook?token=secret",
        listener.local_addr().unwrap()
    );
    let queue = Arc::new(WebhookQueue::new(8));
    let client = build_client(&queue).unwrap();
    let host = host_of(&url);
    let shutdown = CancellationToken::new();
    let outcome = deliver(
        &client,
        &queue,
        &host,
        &delivery(1, "a", &url),
        || 0,
        &shutdown,
    )
    .await;
    let Some(DeliveryOutcome::Failed { attempts, error }) = outcome else {
        panic!("expected a failure, got {outcome:?}");
    };
    assert_eq!(attempts, 0);
    assert!(error.contains("loopback"), "{error}");
    assert!(!error.contains("secret"), "{error}");
    assert!(listener.accept().is_err(), "a connection was made");
    // A name that resolves to loopback is refused by the resolver alike.
    let named = url.replace("127.0.0.1", "localhost");
    let outcome = deliver(
        &client,
        &queue,
        &host_of(&named),
        &delivery(2, "a", &named),
        || 0,
        &shutdown,
    )
    .await;
    assert!(
        matches!(&outcome, Some(DeliveryOutcome::Failed { attempts: 0, error }) if error.contains("loopback")),
        "{outcome:?}"
    );
    assert!(listener.accept().is_err(), "a connection was made");
}

#[tokio::test]
async fn an_allowed_address_is_posted_and_errors_stay_coarse() {
    let queue = Arc::new(WebhookQueue::new(8));
    queue.set_policy(&xp_sched::config::WebhookPolicy {
        allow_private: false,
        allow: vec!["127.0.0.0/8".parse().unwrap()],
    });
    let client = build_client(&queue).unwrap();
    // Nothing listens there: the error says so in a few words.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook?token=secret", closed.local_addr().unwrap());
    drop(closed);
    let shutdown = CancellationToken::new();
    let host = host_of(&url);
    let dying = delivery(1, "a", &url);
    let dead = deliver(&client, &queue, &host, &dying, || 0, &shutdown);
    let outcome = tokio::time::timeout(Duration::from_secs(120), dead)
        .await
        .expect("the retries end");
    match outcome {
        Some(DeliveryOutcome::Failed { attempts, error }) => {
            assert_eq!(attempts, MAX_ATTEMPTS);
            assert_eq!(error, "connection refused");
        }
        // The breaker opened on the last failures before the retries ran out.
        Some(DeliveryOutcome::HostFailing) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(queue.with(|dispatch| dispatch.host_failing(&host, 0)));
}
