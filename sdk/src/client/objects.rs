//! A driver's objects: storing, fetching and releasing them on the nodes'
//! object servers with the capability the head grants this connection's
//! driver session (`Request::ObjectCapability`).
//!
//! The capability is asked for on first use and again before it expires, or
//! when a server says it has expired or was revoked (a user's role changed);
//! a fetch asks for one that also names the object, which the head grants
//! when the object belongs to the team's checkpoints or outputs. What a
//! session's capability covers is the head's to decide (`object_access`);
//! servers check it on every request.
//!
//! Not here: the wire (`xp_runtime::object_wire`).

use std::sync::{Arc, Mutex, PoisonError};

use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::error_chain::error_chain;
use xp_runtime::ids::ObjectId;
use xp_runtime::object_wire::{Credential, FetchErrorCode, ObjectClient, ObjectClientError};
use xp_runtime::protocol::{
    Holder, ObjectCapability, ObjectSource, Request, Response, SESSION_CAPABILITY_MS,
};

use super::{Client, MAX_GET_BYTES, SdkError};

/// The connection's link to the object servers: made on first use, with the
/// expiry of the capability it presents.
#[derive(Debug, Default)]
pub(super) struct ObjectLink {
    client: tokio::sync::OnceCell<ObjectClient>,
    expires_ms: Mutex<u64>,
}

/// Whether a server's refusal may pass with a fresh capability.
fn wants_renewal(error: &ObjectClientError) -> bool {
    matches!(
        error,
        ObjectClientError::Refused {
            code: FetchErrorCode::Expired | FetchErrorCode::Revoked,
            ..
        }
    )
}

impl Client {
    /// A capability for this connection's session, also reading `objects`.
    async fn capability(&self, objects: Vec<ObjectId>) -> Result<ObjectCapability, SdkError> {
        let capability = expect_response!(
            self.request(Request::ObjectCapability { objects }).await?,
            Response::ObjectCapability(capability) => *capability
        )?;
        if let Holder::Session(session) = &capability.grant.holder {
            let _ = self.session.set(session.clone());
        }
        Ok(capability)
    }

    /// The link to the object servers, with a capability that is not about to
    /// expire (`renew`: a fresh one whatever its expiry).
    async fn object_client(&self, renew: bool) -> Result<&ObjectClient, SdkError> {
        let link = &self.objects;
        let client = link
            .client
            .get_or_try_init(|| async {
                let capability = self.capability(Vec::new()).await?;
                *link
                    .expires_ms
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = capability.grant.expires_ms;
                ObjectClient::new(Credential::Capability(Box::new(capability)))
                    .map_err(SdkError::ObjectLink)
            })
            .await?;
        let expires_ms = *link
            .expires_ms
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let half_life = SESSION_CAPABILITY_MS / 2;
        if renew || SystemClock.now().saturating_add(half_life) > expires_ms {
            let capability = self.capability(Vec::new()).await?;
            *link
                .expires_ms
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = capability.grant.expires_ms;
            client.set_credential(Credential::Capability(Box::new(capability)));
        }
        Ok(client)
    }

    /// Stores `bytes` in the cluster's object store (on the node that holds the
    /// fewest objects) and returns their id, which the trials of experiments
    /// submitted on this connection can [`get`] through their context (other
    /// trials cannot), and other connections of the same team by id. The object
    /// belongs to this connection: it is collected when the connection ends,
    /// unless a trial took a claim on it meanwhile. A store that would take the
    /// team over its quota on the node is refused, naming the quota.
    ///
    /// [`get`]: crate::TrialContext::get
    pub async fn put(&self, bytes: &[u8]) -> Result<ObjectId, SdkError> {
        let (session, nodes) = expect_response!(
            self.request(Request::StoreTargets).await?,
            Response::StoreTargets { session, nodes } => (session, nodes)
        )?;
        let session = self.session.get_or_init(|| session);
        let mut client = self.object_client(false).await?;
        let mut failures = Vec::new();
        for node in &nodes {
            let mut stored = client.store(node, session, bytes).await;
            if stored.as_ref().is_err_and(wants_renewal) {
                client = self.object_client(true).await?;
                stored = client.store(node, session, bytes).await;
            }
            match stored {
                Ok(id) if id == ObjectId::of(bytes) => return Ok(id),
                Ok(id) => failures.push(format!("node {} named it {id}", node.node)),
                Err(error) => failures.push(format!("node {}: {}", node.node, error_chain(&error))),
            }
        }
        Err(SdkError::Object(if nodes.is_empty() {
            "no ready node serves objects".to_owned()
        } else {
            format!("no node stored the object: {}", failures.join("; "))
        }))
    }

    /// Where object `id` is, as the head knows (waiting a moment for a put to
    /// reach it: [`xp_runtime::object_wire::locate_settled`]).
    async fn locate(&self, id: ObjectId) -> Result<Vec<ObjectSource>, SdkError> {
        xp_runtime::object_wire::locate_settled(|| async {
            expect_response!(
                self.request(Request::Locate { object: id }).await?,
                Response::Located(sources) => sources
            )
        })
        .await
    }

    /// Object `id`'s bytes, from whichever node holds it, verified against the
    /// id: one this connection's team's sessions stored, one of the experiments
    /// it submitted, or a checkpoint or output file of its team's work.
    pub async fn get(&self, id: ObjectId) -> Result<Vec<u8>, SdkError> {
        let sources = self.locate(id).await?;
        if sources.is_empty() {
            return Err(SdkError::Object(format!("no live node holds object {id}")));
        }
        let client = self.object_client(false).await?;
        let granted = Arc::new(Credential::Capability(Box::new(
            self.capability(vec![id]).await?,
        )));
        let mut failures = Vec::new();
        for source in &sources {
            match fetch(client, &granted, source, id).await {
                Ok(bytes) if ObjectId::of(&bytes) == id => return Ok(bytes.to_vec()),
                Ok(_) => failures.push(format!("node {} sent other bytes", source.node)),
                Err(error) => {
                    failures.push(format!("node {}: {}", source.node, error_chain(&error)))
                }
            }
        }
        Err(SdkError::Object(format!(
            "object {id} could not be fetched: {}",
            failures.join("; ")
        )))
    }

    /// Drops this connection's claim on object `id` wherever it is held; returns
    /// whether there was one.
    pub async fn delete(&self, id: ObjectId) -> Result<bool, SdkError> {
        // A connection that never stored an object has no claim to drop.
        let Some(session) = self.session.get() else {
            return Ok(false);
        };
        let sources = expect_response!(
            self.request(Request::Locate { object: id }).await?,
            Response::Located(sources) => sources
        )?;
        let mut client = self.object_client(false).await?;
        let mut existed = false;
        for source in &sources {
            let mut released = client.release(source, session, id).await;
            if released.as_ref().is_err_and(wants_renewal) {
                client = self.object_client(true).await?;
                released = client.release(source, session, id).await;
            }
            existed |= released.map_err(|error| SdkError::ObjectRelease {
                node: source.node,
                object: id,
                source: Box::new(error),
            })?;
        }
        Ok(existed)
    }
}

/// Fetches `id` from `source` presenting `granted`.
async fn fetch(
    client: &ObjectClient,
    granted: &Arc<Credential>,
    source: &ObjectSource,
    id: ObjectId,
) -> Result<Arc<[u8]>, ObjectClientError> {
    client
        .fetch_from_as(granted.clone(), source, id, None, MAX_GET_BYTES)
        .await
}
