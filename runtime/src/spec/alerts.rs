//! The `alerts:` section of an experiment spec (and of the head's policy, as
//! cluster-wide defaults): which conditions raise an alert on a trial, and what
//! is done when one does.
//!
//! A rule is one flat map, `kind` saying which fields it takes:
//!
//! ```yaml
//! alerts:
//!   - kind: nonfinite            # a metric is NaN or infinite (any metric, or `metric:`)
//!     action: [stop, {webhook: "https://hooks.example/xp"}]
//!   - name: grad-explodes
//!     kind: threshold            # `above:` and/or `below:`
//!     metric: grad_norm
//!     above: 1e3
//!   - kind: divergence           # EMA of `metric` past `factor` x its smoothed minimum
//!     metric: loss
//!     factor: 2                  # default 2
//!     smoothing: 0.9             # EMA weight of the past, default 0.9
//!     min_steps: 10              # reports before judging, default 10
//!   - kind: stalled              # a running trial reported nothing for `for`
//!     for: 10m
//!   - kind: gpu_underused        # GPU utilisation under `below` for `for`
//!     below: 0.2                 # default 0.2
//!     for: 15m                   # default 15m
//! ```
//!
//! `action` is `event` (always done), `stop` (the trial is stopped with the rule
//! as its reason) and `{webhook: URL}` (an http or https URL), one or a list.
//! A rule's name (`name:`, else its kind) identifies it: an experiment's rule
//! replaces the policy's rule of the same name, and a rule named `nonfinite`
//! replaces the built-in one, which raises an event for every non-finite value.
//!
//! Only the declaration, its validation and the merge live here (every process
//! parses specs); the head evaluates rules.

use serde::{Deserialize, Deserializer, Serialize};

use super::{SpecError, invalid};

/// The most rules one experiment (or the policy) may declare.
pub const MAX_ALERT_RULES: usize = 32;
/// The most actions one rule may take.
pub const MAX_ALERT_ACTIONS: usize = 4;
/// The longest webhook URL accepted.
pub const MAX_WEBHOOK_URL: usize = 2048;
/// Default [`AlertRule::factor`] of a divergence rule.
pub const DEFAULT_DIVERGENCE_FACTOR: f64 = 2.0;
/// Default [`AlertRule::smoothing`]: the EMA weight of the past.
pub const DEFAULT_SMOOTHING: f64 = 0.9;
/// Default [`AlertRule::min_steps`]: reports seen before divergence is judged.
pub const DEFAULT_MIN_STEPS: u64 = 10;
/// Default `below` of a `gpu_underused` rule.
pub const DEFAULT_GPU_BELOW: f64 = 0.2;
/// Default `for` of a `gpu_underused` rule, in milliseconds (15 minutes).
pub const DEFAULT_GPU_FOR_MS: u64 = 15 * 60 * 1000;
/// The longest `for` accepted (30 days).
pub const MAX_FOR_MS: u64 = 30 * 24 * 3600 * 1000;

/// What a rule watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A metric value is NaN or infinite.
    Nonfinite,
    /// A metric is above or below a bound.
    Threshold,
    /// A metric's EMA rose past a factor of its smoothed minimum.
    Divergence,
    /// A running trial reported nothing for a while.
    Stalled,
    /// A trial's GPU utilisation stayed low for a while.
    GpuUnderused,
}

impl AlertKind {
    /// The name used in YAML, JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nonfinite => "nonfinite",
            Self::Threshold => "threshold",
            Self::Divergence => "divergence",
            Self::Stalled => "stalled",
            Self::GpuUnderused => "gpu_underused",
        }
    }
}

/// What is done when a rule fires.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertAction {
    /// Record an event on the trial (always done, whether declared or not).
    Event,
    /// Stop the trial (state `stopped`), the rule as its reason.
    Stop,
    /// POST a JSON body to this http or https URL.
    Webhook(String),
}

impl AlertAction {
    /// A short label: `event`, `stop`, `webhook`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Event => "event",
            Self::Stop => "stop",
            Self::Webhook(_) => "webhook",
        }
    }
}

/// One declared rule, as written (fields a kind does not take are refused by
/// [`AlertRule::validate`]); [`AlertRule::condition`] gives it with defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertRule {
    /// The rule's name; its kind when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it watches.
    pub kind: AlertKind,
    /// The metric (`nonfinite`: optional, any metric when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// `threshold`: fires above this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above: Option<f64>,
    /// `threshold`: fires below this; `gpu_underused`: the utilisation bound (0 to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below: Option<f64>,
    /// `divergence`: how far above its smoothed minimum the EMA may rise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// `divergence`: the EMA weight of the past, in [0, 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smoothing: Option<f64>,
    /// `divergence`: reports seen before it is judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_steps: Option<u64>,
    /// `stalled`, `gpu_underused`: how long, such as `10m`.
    #[serde(rename = "for", default, skip_serializing_if = "Option::is_none")]
    pub for_duration: Option<String>,
    /// What is done when it fires (an event in any case).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "one_or_many"
    )]
    pub action: Vec<AlertAction>,
}

/// A rule's condition with its defaults filled in: what the head evaluates.
#[derive(Debug, Clone, PartialEq)]
pub enum AlertCondition {
    /// A value of `metric` (of any metric when `None`) is NaN or infinite.
    Nonfinite {
        /// The metric watched, or every metric.
        metric: Option<String>,
    },
    /// `metric` above `above` or below `below`.
    Threshold {
        /// The metric.
        metric: String,
        /// Upper bound.
        above: Option<f64>,
        /// Lower bound.
        below: Option<f64>,
    },
    /// The EMA of `metric` rose past `factor` times its smallest EMA.
    Divergence {
        /// The metric.
        metric: String,
        /// The factor.
        factor: f64,
        /// The EMA weight of the past.
        smoothing: f64,
        /// Reports seen before judging.
        min_steps: u64,
    },
    /// No report from a running trial for `for_ms`.
    Stalled {
        /// Milliseconds.
        for_ms: u64,
    },
    /// GPU utilisation under `below` for `for_ms`.
    GpuUnderused {
        /// Utilisation bound, 0 to 1.
        below: f64,
        /// Milliseconds.
        for_ms: u64,
    },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(AlertAction),
    Many(Vec<AlertAction>),
}

fn one_or_many<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<AlertAction>, D::Error> {
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(action) => vec![action],
        OneOrMany::Many(actions) => actions,
    })
}

impl AlertRule {
    /// A rule of this kind with nothing else set.
    pub fn of_kind(kind: AlertKind) -> Self {
        Self {
            name: None,
            kind,
            metric: None,
            above: None,
            below: None,
            factor: None,
            smoothing: None,
            min_steps: None,
            for_duration: None,
            action: Vec::new(),
        }
    }

    /// The built-in rule: an event for every non-finite value of any metric.
    pub fn builtin_nonfinite() -> Self {
        Self::of_kind(AlertKind::Nonfinite)
    }

    /// The name that identifies it: `name`, else the kind.
    pub fn effective_name(&self) -> &str {
        self.name.as_deref().unwrap_or(self.kind.as_str())
    }

    /// Whether it stops the trial when it fires.
    pub fn stops(&self) -> bool {
        self.action.contains(&AlertAction::Stop)
    }

    /// The webhook URLs it posts to.
    pub fn webhooks(&self) -> impl Iterator<Item = &str> {
        self.action.iter().filter_map(|action| match action {
            AlertAction::Webhook(url) => Some(url.as_str()),
            _ => None,
        })
    }

    /// The condition with defaults filled in; call on a validated rule.
    pub fn condition(&self) -> AlertCondition {
        let for_ms = self
            .for_duration
            .as_deref()
            .and_then(|text| humantime::parse_duration(text).ok())
            .map(|duration| duration.as_millis().min(u128::from(MAX_FOR_MS)) as u64);
        match self.kind {
            AlertKind::Nonfinite => AlertCondition::Nonfinite {
                metric: self.metric.clone(),
            },
            AlertKind::Threshold => AlertCondition::Threshold {
                metric: self.metric.clone().unwrap_or_default(),
                above: self.above,
                below: self.below,
            },
            AlertKind::Divergence => AlertCondition::Divergence {
                metric: self.metric.clone().unwrap_or_default(),
                factor: self.factor.unwrap_or(DEFAULT_DIVERGENCE_FACTOR),
                smoothing: self.smoothing.unwrap_or(DEFAULT_SMOOTHING),
                min_steps: self.min_steps.unwrap_or(DEFAULT_MIN_STEPS),
            },
            AlertKind::Stalled => AlertCondition::Stalled {
                for_ms: for_ms.unwrap_or(MAX_FOR_MS),
            },
            AlertKind::GpuUnderused => AlertCondition::GpuUnderused {
                below: self.below.unwrap_or(DEFAULT_GPU_BELOW),
                for_ms: for_ms.unwrap_or(DEFAULT_GPU_FOR_MS),
            },
        }
    }

    /// Checks the rule; `field` is its path, such as `alerts[0]`.
    pub fn validate(&self, field: &str) -> Result<(), SpecError> {
        self.validate_names(field)?;
        self.validate_fields_of_kind(field)?;
        self.validate_numbers(field)?;
        self.validate_duration(field)?;
        self.validate_actions(field)
    }

    /// The rule's own name and the metric it watches.
    fn validate_names(&self, field: &str) -> Result<(), SpecError> {
        if let Some(name) = &self.name {
            let ok = !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                return Err(invalid(
                    format!("{field}.name"),
                    "must be 1 to 64 letters, digits, `-`, `_` or `.`",
                ));
            }
        }
        if let Some(metric) = &self.metric
            && (metric.is_empty() || metric.len() > 128)
        {
            return Err(invalid(format!("{field}.metric"), "must be 1 to 128 bytes"));
        }
        Ok(())
    }

    /// Only the fields the rule's kind takes, and the metric where it needs one.
    fn validate_fields_of_kind(&self, field: &str) -> Result<(), SpecError> {
        let refuse_unless = |present: bool, name: &str, allowed: bool| {
            if present && !allowed {
                Err(invalid(
                    format!("{field}.{name}"),
                    format!("a `{}` rule does not take `{name}`", self.kind.as_str()),
                ))
            } else {
                Ok(())
            }
        };
        let kind = self.kind;
        use AlertKind::*;
        refuse_unless(
            self.metric.is_some(),
            "metric",
            matches!(kind, Nonfinite | Threshold | Divergence),
        )?;
        refuse_unless(self.above.is_some(), "above", kind == Threshold)?;
        refuse_unless(
            self.below.is_some(),
            "below",
            matches!(kind, Threshold | GpuUnderused),
        )?;
        refuse_unless(self.factor.is_some(), "factor", kind == Divergence)?;
        refuse_unless(self.smoothing.is_some(), "smoothing", kind == Divergence)?;
        refuse_unless(self.min_steps.is_some(), "min_steps", kind == Divergence)?;
        refuse_unless(
            self.for_duration.is_some(),
            "for",
            matches!(kind, Stalled | GpuUnderused),
        )?;
        if matches!(kind, Threshold | Divergence) && self.metric.is_none() {
            return Err(invalid(
                format!("{field}.metric"),
                format!("a `{}` rule needs the metric it watches", kind.as_str()),
            ));
        }
        Ok(())
    }

    /// Thresholds, factor, smoothing and step counts: finite and in range.
    fn validate_numbers(&self, field: &str) -> Result<(), SpecError> {
        let kind = self.kind;
        use AlertKind::*;
        for (name, value) in [
            ("above", self.above),
            ("below", self.below),
            ("factor", self.factor),
            ("smoothing", self.smoothing),
        ] {
            if value.is_some_and(|value| !value.is_finite()) {
                return Err(invalid(
                    format!("{field}.{name}"),
                    "must be a finite number",
                ));
            }
        }
        if kind == Threshold {
            match (self.above, self.below) {
                (None, None) => {
                    return Err(invalid(
                        format!("{field}.above"),
                        "a `threshold` rule needs `above`, `below` or both",
                    ));
                }
                (Some(above), Some(below)) if below >= above => {
                    return Err(invalid(
                        format!("{field}.below"),
                        "must be less than `above`: no value could be within both",
                    ));
                }
                _ => {}
            }
        }
        if self.factor.is_some_and(|factor| factor <= 1.0) {
            return Err(invalid(format!("{field}.factor"), "must be greater than 1"));
        }
        if self
            .smoothing
            .is_some_and(|smoothing| !(0.0..1.0).contains(&smoothing))
        {
            return Err(invalid(
                format!("{field}.smoothing"),
                "must be at least 0 and less than 1",
            ));
        }
        if self.min_steps.is_some_and(|steps| steps > 1_000_000_000) {
            return Err(invalid(format!("{field}.min_steps"), "must be at most 1e9"));
        }
        if kind == GpuUnderused
            && self
                .below
                .is_some_and(|below| !(below > 0.0 && below <= 1.0))
        {
            return Err(invalid(
                format!("{field}.below"),
                "GPU utilisation is a fraction: more than 0, at most 1",
            ));
        }
        Ok(())
    }

    /// `for`: present where the kind needs it, a duration between 1s and 30 days.
    fn validate_duration(&self, field: &str) -> Result<(), SpecError> {
        if self.kind == AlertKind::Stalled && self.for_duration.is_none() {
            return Err(invalid(
                format!("{field}.for"),
                "a `stalled` rule needs how long a trial may stay silent, such as `10m`",
            ));
        }
        if let Some(text) = &self.for_duration {
            let duration = humantime::parse_duration(text).map_err(|error| {
                invalid(
                    format!("{field}.for"),
                    format!("not a duration such as `10m`: {error}"),
                )
            })?;
            let ms = duration.as_millis();
            if ms < 1000 || ms > u128::from(MAX_FOR_MS) {
                return Err(invalid(
                    format!("{field}.for"),
                    "must be between 1s and 30 days",
                ));
            }
        }
        Ok(())
    }

    /// At most [`MAX_ALERT_ACTIONS`] actions, every webhook a URL we post to.
    fn validate_actions(&self, field: &str) -> Result<(), SpecError> {
        if self.action.len() > MAX_ALERT_ACTIONS {
            return Err(invalid(
                format!("{field}.action"),
                format!("at most {MAX_ALERT_ACTIONS} actions"),
            ));
        }
        for (index, action) in self.action.iter().enumerate() {
            if let AlertAction::Webhook(url) = action {
                check_webhook_url(url).map_err(|error| {
                    invalid(
                        format!("{field}.action[{index}].webhook"),
                        crate::error_chain::error_chain(&error),
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// Why a webhook URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookUrlError {
    /// The URL is longer than [`MAX_WEBHOOK_URL`].
    #[error("must be at most {MAX_WEBHOOK_URL} bytes")]
    TooLong {
        /// The URL's length in bytes.
        len: usize,
    },
    /// The text does not parse as a URL.
    #[error("not a URL")]
    NotAUrl(#[source] url::ParseError),
    /// The scheme is neither http nor https.
    #[error("only http and https URLs are posted to, not `{scheme}`")]
    Scheme {
        /// The URL's scheme.
        scheme: String,
    },
    /// The URL has no host, or an empty one.
    #[error("names no host")]
    NoHost,
}

/// Checks a webhook URL: http or https, with a host, at most [`MAX_WEBHOOK_URL`] bytes.
pub fn check_webhook_url(text: &str) -> Result<(), WebhookUrlError> {
    if text.len() > MAX_WEBHOOK_URL {
        return Err(WebhookUrlError::TooLong { len: text.len() });
    }
    let url = url::Url::parse(text).map_err(WebhookUrlError::NotAUrl)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(WebhookUrlError::Scheme {
            scheme: url.scheme().to_owned(),
        });
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(WebhookUrlError::NoHost);
    }
    Ok(())
}

/// Checks a list of rules (at most [`MAX_ALERT_RULES`], names unique); `field`
/// is the list's path, such as `alerts`.
pub fn validate_alert_rules(rules: &[AlertRule], field: &str) -> Result<(), SpecError> {
    if rules.len() > MAX_ALERT_RULES {
        return Err(invalid(field, format!("at most {MAX_ALERT_RULES} rules")));
    }
    let mut names = std::collections::BTreeSet::new();
    for (index, rule) in rules.iter().enumerate() {
        rule.validate(&format!("{field}[{index}]"))?;
        if !names.insert(rule.effective_name()) {
            return Err(invalid(
                format!("{field}[{index}].name"),
                format!(
                    "another rule is named `{}` (a rule without a name is named after its kind)",
                    rule.effective_name()
                ),
            ));
        }
    }
    Ok(())
}

/// The rules in force for an experiment: its own, the policy's defaults whose
/// name it does not use, and the built-in `nonfinite` rule unless a rule of that
/// name is among them.
pub fn effective_rules(defaults: &[AlertRule], own: &[AlertRule]) -> Vec<AlertRule> {
    let mut rules: Vec<AlertRule> = own.to_vec();
    for rule in defaults {
        if !rules
            .iter()
            .any(|mine| mine.effective_name() == rule.effective_name())
        {
            rules.push(rule.clone());
        }
    }
    if !rules
        .iter()
        .any(|rule| rule.effective_name() == AlertKind::Nonfinite.as_str())
    {
        rules.push(AlertRule::builtin_nonfinite());
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<AlertRule>, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Doc {
            alerts: Vec<AlertRule>,
        }
        let doc: Doc = serde_saphyr::from_str(text).map_err(|error| error.to_string())?;
        validate_alert_rules(&doc.alerts, "alerts").map_err(|error| error.to_string())?;
        Ok(doc.alerts)
    }

    fn check_error(text: &str, needle: &str) {
        let error = parse(text).expect_err(text);
        assert!(error.contains(needle), "{error} should mention {needle}");
    }

    #[test]
    fn every_kind_parses_with_defaults() {
        let rules = parse(
            "alerts:\n\
             - kind: nonfinite\n  action: [stop, {webhook: \"http://127.0.0.1:9/hook\"}]\n\
             - {name: grad, kind: threshold, metric: grad_norm, above: 1e3}\n\
             - {kind: divergence, metric: loss}\n\
             - {kind: stalled, for: 10m, action: stop}\n\
             - {kind: gpu_underused}\n",
        )
        .unwrap();
        assert_eq!(
            rules[0].action,
            vec![
                AlertAction::Stop,
                AlertAction::Webhook("http://127.0.0.1:9/hook".to_owned())
            ]
        );
        assert!(rules[0].stops());
        assert_eq!(rules[1].effective_name(), "grad");
        assert_eq!(
            rules[1].condition(),
            AlertCondition::Threshold {
                metric: "grad_norm".to_owned(),
                above: Some(1000.0),
                below: None
            }
        );
        assert_eq!(
            rules[2].condition(),
            AlertCondition::Divergence {
                metric: "loss".to_owned(),
                factor: 2.0,
                smoothing: 0.9,
                min_steps: 10
            }
        );
        assert_eq!(rules[3].action, vec![AlertAction::Stop]);
        assert_eq!(
            rules[3].condition(),
            AlertCondition::Stalled { for_ms: 600_000 }
        );
        assert_eq!(
            rules[4].condition(),
            AlertCondition::GpuUnderused {
                below: 0.2,
                for_ms: 900_000
            }
        );
        // The canonical JSON form reads back the same.
        let json = serde_json::to_string(&rules).unwrap();
        let back: Vec<AlertRule> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, rules);
    }

    #[test]
    fn bad_rules_are_refused_naming_the_field() {
        check_error("alerts: [{kind: threshold, metric: x}]", "alerts[0].above");
        check_error("alerts: [{kind: threshold, above: 1}]", "alerts[0].metric");
        check_error(
            "alerts: [{kind: nonfinite, above: 1}]",
            "does not take `above`",
        );
        check_error("alerts: [{kind: stalled}]", "alerts[0].for");
        check_error("alerts: [{kind: stalled, for: soon}]", "alerts[0].for");
        check_error(
            "alerts: [{kind: divergence, metric: l, factor: 0.5}]",
            "factor",
        );
        check_error(
            "alerts: [{kind: divergence, metric: l, smoothing: 1}]",
            "smoothing",
        );
        check_error("alerts: [{kind: gpu_underused, below: 2}]", "below");
        check_error(
            "alerts: [{kind: threshold, metric: x, above: 1, below: 2}]",
            "below",
        );
        check_error(
            "alerts: [{kind: nonfinite}, {kind: nonfinite}]",
            "alerts[1].name",
        );
        check_error("alerts: [{kind: nonfinite, colour: red}]", "colour");
        check_error("alerts: [{kind: loud}]", "loud");
        check_error(
            "alerts: [{kind: nonfinite, action: {webhook: \"ftp://x/y\"}}]",
            "alerts[0].action[0].webhook",
        );
        check_error(
            "alerts: [{kind: nonfinite, action: {webhook: \"not a url\"}}]",
            "not a URL",
        );
        let long = format!("http://h/{}", "a".repeat(MAX_WEBHOOK_URL));
        check_error(
            &format!("alerts: [{{kind: nonfinite, action: {{webhook: \"{long}\"}}}}]"),
            "at most",
        );
        let many: String = (0..=MAX_ALERT_RULES)
            .map(|index| format!("  - {{name: r{index}, kind: nonfinite}}\n"))
            .collect();
        check_error(&format!("alerts:\n{many}"), "at most 32 rules");
    }

    #[test]
    fn experiment_rules_replace_defaults_of_the_same_name() {
        let defaults = parse(
            "alerts:\n- {name: grad, kind: threshold, metric: g, above: 10}\n- {kind: stalled, for: 1h}\n",
        )
        .unwrap();
        let own =
            parse("alerts:\n- {name: grad, kind: threshold, metric: g, above: 99}\n").unwrap();
        let rules = effective_rules(&defaults, &own);
        let names: Vec<&str> = rules.iter().map(AlertRule::effective_name).collect();
        assert_eq!(names, ["grad", "stalled", "nonfinite"]);
        assert_eq!(rules[0].above, Some(99.0));
        // A rule named nonfinite replaces the built-in one.
        let own = parse("alerts:\n- {kind: nonfinite, action: stop}\n").unwrap();
        let rules = effective_rules(&[], &own);
        assert_eq!(rules.len(), 1);
        assert!(rules[0].stops());
    }
}
