//! The actor's side of alerts: handing the webhook posts of stored alerts to
//! the delivery queue (and counting what was raised), recording how each
//! delivery ended, and answering `GET /api/alerts` (`xp alerts` is a request,
//! `xp_head_core::requests`).
//!
//! Invariant: a webhook is queued only after its alert is stored, like every
//! other output of the core; a full queue drops an oldest delivery, which is
//! stored as `dropped`, and the actor never waits on the queue.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::AlertStatus;

use super::{HeadState, Reply};
use xp_head_core::alerts::{AlertCursor, DeliveryOutcome, WebhookDelivery};
use xp_head_core::auth::Visibility;
use xp_head_core::pages::{Page, PageError};

/// What the core raised in one change, taken before its commit and acted on
/// only once it succeeded.
pub(super) struct AlertOutputs {
    deliveries: Vec<WebhookDelivery>,
    raised: Vec<(&'static str, &'static str)>,
}

impl HeadState {
    /// Takes the alert outputs of the change about to be committed.
    pub(super) fn take_alert_outputs(&mut self) -> AlertOutputs {
        AlertOutputs {
            deliveries: self.args.core.take_webhook_deliveries(),
            raised: self.args.core.take_alerts_raised(),
        }
    }

    /// Acts on the alert outputs of a committed change: counts them and queues
    /// their webhooks. A delivery dropped from the full queue is recorded as
    /// such (stored with the next change).
    pub(super) fn dispatch_alerts(&mut self, now: UnixMillis, outputs: AlertOutputs) {
        for (kind, action) in outputs.raised {
            self.args.metrics.alert_raised(kind, action);
        }
        if !outputs.deliveries.is_empty() {
            // The policy in force when posted decides where webhooks may go.
            self.args
                .webhooks
                .set_policy(self.args.core.webhook_policy());
        }
        for delivery in outputs.deliveries {
            if let Some(dropped) = self.args.webhooks.push(delivery) {
                self.args.metrics.webhook_delivery("dropped");
                tracing::warn!(
                    alert = dropped.alert,
                    team = %dropped.team,
                    "webhook queue full: an oldest delivery was dropped"
                );
                self.args
                    .core
                    .handle_alert_delivery(now, dropped.alert, DeliveryOutcome::Dropped);
            }
        }
    }

    /// How a webhook delivery ended; not stored during an outage (the alert
    /// stays `pending`).
    pub(super) fn alert_delivered(
        &mut self,
        now: UnixMillis,
        alert: u64,
        outcome: DeliveryOutcome,
    ) {
        if self.outage.is_some() {
            return;
        }
        self.args.core.handle_alert_delivery(now, alert, outcome);
        let _ = self.flush(now);
    }

    /// `GET /api/alerts`: a page of alerts, newest first.
    pub(super) fn alerts_page(
        &self,
        experiment: Option<ExperimentId>,
        limit: usize,
        cursor: Option<AlertCursor>,
        visibility: &Visibility,
    ) -> Result<Page<AlertStatus>, PageError> {
        self.args
            .core
            .alerts_page(experiment, limit, cursor, &|team| visibility.shows(team))
    }
}

/// The actor's alert messages, answered by [`HeadState::handle_alert_message`].
#[derive(Debug)]
pub(crate) enum AlertMsg {
    /// `GET /api/alerts`.
    Page {
        /// The experiment, if one.
        experiment: Option<ExperimentId>,
        /// Items wanted.
        limit: usize,
        /// Where the listing continues.
        cursor: Option<AlertCursor>,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The page.
        reply: Reply<Result<Page<AlertStatus>, PageError>>,
    },
    /// A webhook delivery ended.
    Delivered(u64, DeliveryOutcome),
}

impl HeadState {
    /// Handles one alert message.
    pub(super) fn handle_alert_message(&mut self, now: UnixMillis, message: AlertMsg) {
        match message {
            AlertMsg::Page {
                experiment,
                limit,
                cursor,
                visibility,
                reply,
            } => {
                let _ = reply.send(Ok(self.alerts_page(experiment, limit, cursor, &visibility)));
            }
            AlertMsg::Delivered(alert, outcome) => self.alert_delivered(now, alert, outcome),
        }
    }
}
