//! Checking a policy: [`PolicyConfig::validate`], one function per section
//! of the file, each naming the first bad field. Parsing (and the units of
//! amounts and durations) is `text`'s; this only judges the values.

use std::collections::BTreeSet;

use super::{
    AttainedServiceConfig, MAX_DELAY_PER_GPU_MS, MAX_LAS_THRESHOLDS, MAX_LEASE_UNITS, MAX_LEASES,
    MAX_OVERSUBSCRIPTION, MAX_WEBHOOK_ALLOW, PolicyConfig, PolicyError, QueueConfig,
    RESOURCE_NAMES, check_lease_name,
};

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

impl PolicyConfig {
    /// Checks every value, naming the first offending queue and field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(self.oversubscription.is_finite()
            && (1.0..=MAX_OVERSUBSCRIPTION).contains(&self.oversubscription))
        {
            return Err(invalid(
                "oversubscription",
                format!("must be a number from 1 to {MAX_OVERSUBSCRIPTION}"),
            ));
        }
        self.validate_prices()?;
        self.validate_alerting()?;
        self.validate_queues()?;
        self.validate_leases()?;
        for name in self.priority_classes.keys() {
            if name.trim().is_empty() {
                return Err(invalid(
                    "priority_classes",
                    "a class name must not be empty",
                ));
            }
        }
        if let Some(las) = &self.attained_service {
            las.validate()?;
        }
        self.validate_admission()
    }

    /// `admission`: every limit at least 1, and a submission allowed what a
    /// team is (a larger submission could never be admitted).
    fn validate_admission(&self) -> Result<(), PolicyError> {
        let admission = &self.admission;
        let limits = [
            ("max_pending_per_team", admission.max_pending_per_team),
            ("max_submission_bytes", admission.max_submission_bytes),
            ("max_team_bytes", admission.max_team_bytes),
            ("max_blobs_per_user", admission.max_blobs_per_user),
            ("max_blob_bytes_per_user", admission.max_blob_bytes_per_user),
            (
                "default_memory_per_worker",
                admission.default_memory_per_worker,
            ),
        ];
        for (name, value) in limits {
            if value == 0 {
                return Err(invalid(format!("admission.{name}"), "must be at least 1"));
            }
        }
        if admission.max_submission_bytes > admission.max_team_bytes {
            return Err(invalid(
                "admission.max_submission_bytes",
                "must be at most admission.max_team_bytes",
            ));
        }
        Ok(())
    }

    /// `prices`: named models, finite prices of at least 0.
    fn validate_prices(&self) -> Result<(), PolicyError> {
        for (model, price) in &self.prices {
            if model.trim().is_empty() || model.len() > 128 {
                return Err(invalid("prices", "a GPU model name is 1 to 128 characters"));
            }
            if !(price.is_finite() && *price >= 0.0) {
                return Err(invalid(
                    format!("prices.{model}"),
                    "must be a finite number >= 0 (currency units per GPU-hour)",
                ));
            }
        }
        Ok(())
    }

    /// `webhooks.allow` and the default `alerts` rules.
    fn validate_alerting(&self) -> Result<(), PolicyError> {
        if self.webhooks.allow.len() > MAX_WEBHOOK_ALLOW {
            return Err(invalid(
                "webhooks.allow",
                format!("at most {MAX_WEBHOOK_ALLOW} networks"),
            ));
        }
        xp_runtime::spec::validate_alert_rules(&self.alerts, "alerts").map_err(
            |error| match error {
                xp_runtime::spec::SpecError::Invalid { field, reason } => invalid(field, reason),
                other => invalid("alerts", other.to_string()),
            },
        )?;
        Ok(())
    }

    /// At least one queue, each named once, and each queue's own fields.
    fn validate_queues(&self) -> Result<(), PolicyError> {
        if self.queues.is_empty() {
            return Err(invalid(
                "queues",
                "declare at least one queue, or leave `queues` out for one open queue",
            ));
        }
        let mut names = BTreeSet::new();
        for (index, queue) in self.queues.iter().enumerate() {
            if queue.name.trim().is_empty() {
                return Err(invalid(
                    format!("queues[{index}].name"),
                    "must not be empty",
                ));
            }
            if !names.insert(queue.name.as_str()) {
                return Err(invalid(
                    format!("queues[{}].name", queue.name),
                    "another queue has this name",
                ));
            }
            validate_queue(queue)?;
        }
        Ok(())
    }

    /// Checks the declared leases and every queue's lease quota.
    fn validate_leases(&self) -> Result<(), PolicyError> {
        if self.leases.len() > MAX_LEASES {
            return Err(invalid(
                "leases",
                format!("{} leases, more than {MAX_LEASES}", self.leases.len()),
            ));
        }
        for (name, capacity) in &self.leases {
            check_lease_name(name).map_err(|error| invalid("leases", error.to_string()))?;
            if *capacity == 0 || *capacity > MAX_LEASE_UNITS {
                return Err(invalid(
                    format!("leases.{name}"),
                    format!("capacity {capacity} is not between 1 and {MAX_LEASE_UNITS}"),
                ));
            }
        }
        for queue in &self.queues {
            let at = |field: &str| format!("queues[{}].{field}", queue.name);
            for (limits, what) in [
                (&queue.borrowing_limit, "borrowing_limit"),
                (&queue.lending_limit, "lending_limit"),
            ] {
                if !limits.leases.is_empty() {
                    return Err(invalid(
                        at(&format!("{what}.leases")),
                        "leases are not lent or borrowed; a lease quota is a hard cap",
                    ));
                }
            }
            for name in queue.quota.leases.keys() {
                if !self.leases.contains_key(name) {
                    return Err(invalid(
                        at(&format!("quota.leases.{name}")),
                        format!("the policy declares no lease {name:?} under `leases`"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// One queue's team, cohort, weight, and borrowing and lending limits.
fn validate_queue(queue: &QueueConfig) -> Result<(), PolicyError> {
    let at = |field: &str| format!("queues[{}].{field}", queue.name);
    if queue
        .team
        .as_deref()
        .is_some_and(|team| team.trim().is_empty())
    {
        return Err(invalid(
            at("team"),
            "must not be empty; leave it out for an open queue",
        ));
    }
    if queue
        .cohort
        .as_deref()
        .is_some_and(|cohort| cohort.trim().is_empty())
    {
        return Err(invalid(at("cohort"), "must not be empty"));
    }
    if !(queue.weight.is_finite() && queue.weight > 0.0) {
        return Err(invalid(
            at("weight"),
            format!("{} is not a positive number", queue.weight),
        ));
    }
    let quota = queue.quota.as_array();
    for (limits, what) in [
        (&queue.borrowing_limit, "borrowing_limit"),
        (&queue.lending_limit, "lending_limit"),
    ] {
        for (resource, limit) in limits.as_array().into_iter().enumerate() {
            let Some(limit) = limit else { continue };
            let field = at(&format!("{what}.{}", RESOURCE_NAMES[resource]));
            if queue.cohort.is_none() {
                return Err(invalid(field, "only a queue in a cohort borrows or lends"));
            }
            let Some(nominal) = quota[resource] else {
                return Err(invalid(
                    field,
                    "the quota of this resource is unlimited, so there is nothing to limit",
                ));
            };
            if what == "lending_limit" && limit > nominal {
                return Err(invalid(
                    field,
                    format!("{limit} is more than the quota {nominal}"),
                ));
            }
        }
    }
    Ok(())
}

impl AttainedServiceConfig {
    /// Checks the edges: finite, positive, strictly increasing, few.
    fn validate(&self) -> Result<(), PolicyError> {
        let field = "attained_service.thresholds_gpu_hours";
        if self.thresholds_gpu_hours.len() > MAX_LAS_THRESHOLDS {
            return Err(invalid(
                field,
                format!("at most {MAX_LAS_THRESHOLDS} thresholds"),
            ));
        }
        let mut previous = 0.0;
        for hours in &self.thresholds_gpu_hours {
            if !(hours.is_finite() && *hours > previous && *hours <= 1e9) {
                return Err(invalid(
                    field,
                    format!(
                        "{hours} is not a GPU-hour count above the one before it (and at most 1e9)"
                    ),
                ));
            }
            previous = *hours;
        }
        if let Some(quantiles) = &self.quantiles {
            let field = "attained_service.quantiles";
            if quantiles.len() != self.thresholds_gpu_hours.len() {
                return Err(invalid(
                    field,
                    format!(
                        "{} quantiles for {} thresholds: give one per threshold",
                        quantiles.len(),
                        self.thresholds_gpu_hours.len()
                    ),
                ));
            }
            let mut previous = 0.0;
            for quantile in quantiles {
                if !(*quantile > previous && *quantile < 1.0) {
                    return Err(invalid(
                        field,
                        format!("{quantile} is not a quantile above the one before it and below 1"),
                    ));
                }
                previous = *quantile;
            }
        }
        if self.delay_per_gpu_ms > MAX_DELAY_PER_GPU_MS {
            return Err(invalid(
                "attained_service.delay_per_gpu",
                "at most 7 days".to_owned(),
            ));
        }
        Ok(())
    }
}
