//! Tests of the policy file: parsing, validation naming the field, presets
//! and round trips.

use super::*;

fn check_ok(text: &str, expected: &dyn Fn(&PolicyConfig) -> bool) {
    let config = PolicyConfig::from_yaml(text).unwrap();
    assert!(expected(&config), "unexpected {config:#?}");
}

fn check_error(text: &str, needle: &str) {
    let error = PolicyConfig::from_yaml(text).unwrap_err().to_string();
    assert!(
        error.contains(needle),
        "{error:?} does not mention {needle:?}"
    );
}

const FULL: &str = "
queues:
  - name: vision
    team: vision
    cohort: research
    weight: 2
    quota: {gpu: 8, cpu: 64, memory: 512GiB}
    borrowing_limit: {gpu: 8}
    lending_limit: {gpu: 4}
  - name: nlp
    team: nlp
    cohort: research
    quota: {gpu: 0.5}
priority_classes: {low: 0, normal: 100, high: 1000}
aging: {rate_per_hour: 10, cap: 500}
preemption: {enabled: true, grace_period: 60s, min_run_time: 5m, max_loss: 30m}
attained_service: {thresholds_gpu_hours: [0.5, 8], promote_after: 3, reserve_after: 90m, delay_per_gpu: 10m}
placement: fragmentation_aware
order: priority
backfill: true
head_of_line: skip
admission: {max_pending_per_team: 100, retry_after: 5s}
";

#[test]
fn full_file_parses() {
    let config = PolicyConfig::from_yaml(FULL).unwrap();
    let vision = config.queue("vision").unwrap();
    assert_eq!(vision.weight, 2.0);
    assert_eq!(vision.quota.gpu_milli, Some(8000));
    assert_eq!(vision.quota.cpu_milli, Some(64_000));
    assert_eq!(vision.quota.memory_bytes, Some(512 << 30));
    assert_eq!(vision.borrowing_limit.gpu_milli, Some(8000));
    assert_eq!(vision.lending_limit.gpu_milli, Some(4000));
    assert_eq!(vision.lending_limit.cpu_milli, None);
    assert_eq!(config.queue("nlp").unwrap().quota.gpu_milli, Some(500));
    assert_eq!(config.queue("nlp").unwrap().weight, 1.0);
    assert_eq!(config.preemption.grace_period_ms, 60_000);
    assert_eq!(config.preemption.min_run_time_ms, 300_000);
    assert_eq!(config.admission.retry_after_ms, 5_000);
    assert_eq!(config.placement, PlacementKind::FragmentationAware);
    assert_eq!(config.order, Order::Priority);
    assert_eq!(config.head_of_line, HeadOfLine::Skip);
    assert!(config.backfill);
    assert_eq!(config.aging.unwrap().boost(3_600_000 * 3), 30);
    assert_eq!(config.aging.unwrap().boost(3_600_000 * 100), 500);
    assert_eq!(config.priority_value("high"), Some(1000));
    assert_eq!(config.priority_value("urgent"), None);
}

#[test]
fn empty_and_partial_files() {
    check_ok("", &|config| *config == PolicyConfig::base());
    check_ok("# nothing\n", &|config| *config == PolicyConfig::base());
    check_ok("backfill: true\n", &|config| {
        config.backfill && config.queues == default_queues() && !config.preemption.enabled
    });
    check_ok("preemption: {grace_period: 30s}\n", &|config| {
        config.preemption.enabled
            && config.preemption.grace_period_ms == 30_000
            && config.preemption.min_run_time_ms == 300_000
    });
    check_ok("placement: binpack\norder: fifo\n", &|config| {
        config.placement == PlacementKind::BinPack && config.order == Order::Fifo
    });
    check_ok("queues: [{name: a, quota: {memory: 1024}}]\n", &|config| {
        config.queues[0].quota.memory_bytes == Some(1024) && config.queues[0].team.is_none()
    });
}

#[test]
fn parse_errors_name_field_and_place() {
    check_error("backfil: true\n", "backfil");
    check_error("backfil: true\n", "line");
    check_error("queues:\n  - name: a\n    quota: {gpus: 1}\n", "gpus");
    check_error("order: random\n", "random");
    check_error("placement: tetris\n", "tetris");
    check_error("preemption: {grace_period: soon}\n", "soon");
    check_error(
        "queues: [{name: a, quota: {gpu: 0.0005}}]\n",
        "three decimals",
    );
    check_error("queues: [{name: a, quota: {gpu: -1}}]\n", "non-negative");
    check_error("queues: [{name: a, quota: {memory: lots}}]\n", "lots");
    check_error(&"#".repeat(MAX_POLICY_BYTES + 1), "limit");
}

#[test]
fn validation_names_queue_and_field() {
    check_error("queues: []\n", "`queues`");
    check_error("queues: [{name: a}, {name: a}]\n", "queues[a].name");
    check_error("queues: [{name: ''}]\n", "queues[0].name");
    check_error("queues: [{name: a, weight: 0}]\n", "queues[a].weight");
    check_error("queues: [{name: a, team: ''}]\n", "queues[a].team");
    check_error(
        "queues: [{name: a, quota: {gpu: 1}, borrowing_limit: {gpu: 1}}]\n",
        "queues[a].borrowing_limit.gpu",
    );
    check_error(
        "queues: [{name: a, cohort: c, borrowing_limit: {cpu: 1}}]\n",
        "queues[a].borrowing_limit.cpu",
    );
    check_error(
        "queues: [{name: a, cohort: c, quota: {gpu: 2}, lending_limit: {gpu: 3}}]\n",
        "queues[a].lending_limit.gpu",
    );
    check_error(
        "admission: {max_pending_per_team: 0}\n",
        "admission.max_pending_per_team",
    );
    check_error(
        "admission: {max_submission_bytes: 0}\n",
        "admission.max_submission_bytes",
    );
    check_error(
        "admission: {max_blobs_per_user: 0}\n",
        "admission.max_blobs_per_user",
    );
    check_error(
        "admission: {max_submission_bytes: 2GiB, max_team_bytes: 1GiB}\n",
        "admission.max_submission_bytes",
    );
}

#[test]
fn admission_sizes_read_as_byte_sizes_and_default_when_absent() {
    let config = PolicyConfig::from_yaml(
        "admission: {max_submission_bytes: 1MiB, max_team_bytes: 4194304, max_blob_bytes_per_user: 1GiB}\n",
    )
    .unwrap();
    assert_eq!(config.admission.max_submission_bytes, 1 << 20);
    assert_eq!(config.admission.max_team_bytes, 4 << 20);
    assert_eq!(config.admission.max_blob_bytes_per_user, 1 << 30);
    assert_eq!(config.admission.max_blobs_per_user, 16);
    let defaults = PolicyConfig::from_yaml("{}\n").unwrap().admission;
    assert_eq!(defaults.max_submission_bytes, 16 << 20);
    assert_eq!(defaults.max_team_bytes, 64 << 20);
    assert_eq!(defaults.max_pending_per_team, 10_000);
}

#[test]
fn presets() {
    for name in PolicyConfig::PRESETS {
        let config = PolicyConfig::preset(name).unwrap();
        config.validate().unwrap();
    }
    assert!(PolicyConfig::preset("tetris").is_none());
    let fifo = PolicyConfig::preset("fifo").unwrap();
    assert_eq!(fifo.order, Order::Fifo);
    assert!(!fifo.backfill && !fifo.preemption.enabled);
    assert_eq!(fifo.head_of_line, HeadOfLine::Strict);
    let priority = PolicyConfig::preset("priority").unwrap();
    assert!(priority.preemption.enabled && priority.order == Order::Priority);
    let fair = PolicyConfig::preset("fair").unwrap();
    assert!(fair.order == Order::Fair && !fair.backfill);
    assert!(PolicyConfig::preset("backfill").unwrap().backfill);
    let default = PolicyConfig::default();
    assert!(default.backfill && default.preemption.enabled && default.aging.is_none());
    assert_eq!(default.preemption.max_loss_ms, Some(5 * 60_000));
    assert_eq!(
        default.attained_service,
        Some(AttainedServiceConfig {
            thresholds_gpu_hours: vec![2.0, 32.0],
            promote_after: 2,
            reserve_after_ms: 48 * 3_600_000,
            delay_per_gpu_ms: 3_600_000,
            levels: LevelSource::Adaptive,
            quantiles: None,
            retired_smallest_first: None,
        })
    );
    assert_eq!(default.order, Order::Fair);
}

#[test]
fn attained_service_and_max_loss() {
    check_ok(FULL, &|config| {
        let las = config.attained_service.as_ref().unwrap();
        las.thresholds_gpu_hours == [0.5, 8.0]
            && las.promote_after == 3
            && las.reserve_after_ms == 90 * 60_000
            && las.delay_per_gpu_ms == 10 * 60_000
            && las.thresholds_gpu_ms() == [1_800_000, 28_800_000]
            && config.preemption.max_loss_ms == Some(30 * 60_000)
    });
    // A policy stored before `delay_per_gpu` replaced `smallest_first` loads.
    check_ok("attained_service: {smallest_first: true}\n", &|config| {
        config.attained_service.as_ref().unwrap().delay_per_gpu_ms == 3_600_000
    });
    check_ok(
        "attained_service: {}
",
        &|config| {
            config.attained_service == Some(AttainedServiceConfig::default())
                && config.preemption.max_loss_ms.is_none()
        },
    );
    check_ok(
        "attained_service: {thresholds_gpu_hours: []}
",
        &|config| {
            config
                .attained_service
                .as_ref()
                .unwrap()
                .thresholds_gpu_hours
                .is_empty()
        },
    );
    check_error(
        "attained_service: {thresholds_gpu_hours: [2, 1]}
",
        "attained_service.thresholds_gpu_hours",
    );
    check_error(
        "attained_service: {thresholds_gpu_hours: [0, 1]}
",
        "attained_service.thresholds_gpu_hours",
    );
    check_error(
        "attained_service: {thresholds_gpu_hours: [.inf]}
",
        "attained_service.thresholds_gpu_hours",
    );
    check_error(
        "attained_service: {thresholds_gpu_hours: [1, 2, 3, 4, 5, 6, 7, 8, 9]}
",
        "attained_service.thresholds_gpu_hours",
    );
    check_error(
        "attained_service: {levels: 3}
",
        "levels",
    );
    check_error(
        "preemption: {max_loss: soon}
",
        "soon",
    );
}

#[test]
fn default_queue_resolution() {
    let config = PolicyConfig::from_yaml(
            "queues: [{name: shared}, {name: v1, team: vision}, {name: v2, team: vision}, {name: default}]\n",
        )
        .unwrap();
    assert_eq!(config.default_queue_for("vision").unwrap().name, "v1");
    assert_eq!(config.default_queue_for("nlp").unwrap().name, "default");
    let config = PolicyConfig::from_yaml("queues: [{name: v, team: vision}]\n").unwrap();
    assert!(config.default_queue_for("nlp").is_none());
    assert!(!config.queues[0].accepts("nlp"));
}

#[test]
fn prices_per_gpu_model() {
    check_ok("prices: {default: 1.0, H100: 3.2}\n", &|config| {
        config.prices.get("H100") == Some(&3.2) && config.prices.get("default") == Some(&1.0)
    });
    check_ok("", &|config| config.prices.is_empty());
    check_error("prices: {H100: -1}\n", "prices.H100");
    check_error("prices: {H100: .nan}\n", "prices.H100");
    check_error("prices: {H100: cheap}\n", "cheap");
    check_error("prices: {'': 1}\n", "prices");
    check_ok(
        "webhooks: {allow_private: false, allow: [127.0.0.1/32, 'fd00::/8']}\n",
        &|config| !config.webhooks.allow_private && config.webhooks.allow.len() == 2,
    );
    check_error("webhooks: {allow: [not-a-network]}\n", "webhooks");
    check_error("webhooks: {allow_everything: true}\n", "allow_everything");
}

#[test]
fn round_trips_through_yaml() {
    let config = PolicyConfig::from_yaml(FULL).unwrap();
    let text = serde_saphyr::to_string(&config).unwrap();
    assert_eq!(PolicyConfig::from_yaml(&text).unwrap(), config);
}
