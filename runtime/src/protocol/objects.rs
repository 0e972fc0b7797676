//! Where objects are and which objects a checkpoint is made of: a node's object
//! endpoint, the sources a fetching node may try, a checkpoint's files and the
//! checkpoint a launch resumes from.
//!
//! The bytes themselves never cross the control plane; they move on the object
//! wire (`crate::object_wire`) between object stores.
//!
//! Invariant: struct fields are append-only (bincode is not self-describing).

use serde::{Deserialize, Serialize};

use crate::ids::{NodeId, ObjectId};

/// A node's object server: QUIC on `port` of the node's advertised host, with a
/// self-signed certificate whose SHA-256 the head hands to fetching nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectEndpoint {
    /// The UDP port.
    pub port: u16,
    /// SHA-256 of the server's certificate (DER).
    pub cert_sha256: [u8; 32],
}

/// A node that holds an object, as a fetching node needs to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectSource {
    /// The node.
    pub node: NodeId,
    /// Its advertised host.
    pub host: String,
    /// Its object server.
    pub endpoint: ObjectEndpoint,
}

/// One file of a checkpoint: its name in the checkpoint directory and the object
/// holding its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointFile {
    /// The path relative to the checkpoint directory (`/`-separated, no `..`).
    pub name: String,
    /// The object with its bytes.
    pub object: ObjectId,
    /// Its length in bytes.
    pub size: u64,
}

/// Whether `name` may name a checkpoint file: a plain relative path, so that
/// restoring it cannot write outside the checkpoint directory.
pub fn is_safe_checkpoint_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 4096
        && std::path::Path::new(name)
            .components()
            .all(|component| matches!(component, std::path::Component::Normal(_)))
}

/// The checkpoint a launch resumes from: the node fills the worker's
/// `XP_CHECKPOINT_DIR` with these files before starting it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeFrom {
    /// The step the checkpoint was taken at (`XP_RESUME_STEP`).
    pub step: u64,
    /// The attempt that wrote it.
    pub attempt: u32,
    /// Its files.
    pub files: Vec<CheckpointFile>,
    /// Nodes holding its objects, best first.
    pub sources: Vec<ObjectSource>,
    /// A durable backup directory holding its objects, tried when no node can
    /// provide them.
    pub backup: Option<String>,
}

/// Which path an object's bytes take between nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum FetchPath {
    /// QUIC chunks, encrypted: the default.
    #[default]
    Quic,
    /// The plain TCP bulk path (`object_wire`'s `bulk`), falling back to QUIC
    /// where a source offers none.
    Tcp,
}

impl FetchPath {
    /// The path a trial's objects take, by its spec's `transport` (not the
    /// gang's, which is `shm` for any gang on one machine): `quic` keeps them
    /// encrypted; `tcp` and `shm` declare the network between machines trusted.
    pub fn for_transport(transport: crate::spec::CollectiveTransport) -> Self {
        match transport {
            crate::spec::CollectiveTransport::Quic => Self::Quic,
            crate::spec::CollectiveTransport::Tcp | crate::spec::CollectiveTransport::Shm => {
                Self::Tcp
            }
        }
    }
}
