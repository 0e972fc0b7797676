//! Alerts as `xp alerts` and the HTTP API show them: what rule fired on which
//! trial, with what value, and whether its webhooks were delivered.
//!
//! Views assembled by the head; the rules are declared in `crate::spec` and
//! evaluated by the head's core. Invariant: fields and variants are append-only.

use serde::{Deserialize, Serialize};

use crate::clock::UnixMillis;
use crate::ids::TrialId;

/// One alert raised on a trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertStatus {
    /// Its number, unique on this head and increasing.
    pub id: u64,
    /// The trial (its experiment is `trial.experiment`).
    pub trial: TrialId,
    /// The rule's name.
    pub rule: String,
    /// The rule's kind (`nonfinite`, `threshold`, ...).
    pub kind: String,
    /// The metric concerned, when the rule watches one.
    pub metric: Option<String>,
    /// The value that fired it (NaN and infinities included).
    pub value: Option<f64>,
    /// The step of the report that fired it.
    pub step: Option<u64>,
    /// When it was raised.
    pub at: UnixMillis,
    /// What happened, in words.
    pub message: String,
    /// The actions taken: `event`, `stop`, `webhook`.
    pub actions: Vec<String>,
    /// Where its webhook deliveries stand.
    pub delivery: DeliveryState,
    /// When its condition cleared, if it has.
    pub cleared_at: Option<UnixMillis>,
}

/// Where an alert's webhook deliveries stand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryState {
    /// The rule posts to no webhook.
    NotRequested,
    /// Queued or being retried; `attempts` made so far.
    Pending {
        /// Attempts made.
        attempts: u32,
    },
    /// Every webhook answered 2xx.
    Delivered {
        /// Attempts it took (the most of any webhook).
        attempts: u32,
        /// When the last delivery succeeded.
        at: UnixMillis,
    },
    /// A webhook was given up on after its attempts.
    Failed {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        error: String,
    },
    /// Dropped from the full delivery queue, never sent (or a head restart
    /// dropped it while in flight).
    Dropped,
    /// Not sent, for this reason (such as `host failing`: its host failed
    /// too often lately).
    DroppedBecause {
        /// Why.
        reason: String,
    },
}

impl DeliveryState {
    /// A short label: `none`, `pending`, `delivered`, `failed`, `dropped`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotRequested => "none",
            Self::Pending { .. } => "pending",
            Self::Delivered { .. } => "delivered",
            Self::Failed { .. } => "failed",
            Self::Dropped | Self::DroppedBecause { .. } => "dropped",
        }
    }
}
