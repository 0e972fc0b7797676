//! Identifiers that cross process boundaries.
//!
//! Every id is a newtype with a short, greppable `Display` and a `FromStr` that
//! accepts exactly what `Display` prints, so ids typed by people at a terminal
//! round-trip.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a string is not a valid id.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    /// The text does not have the shape of this kind of id.
    #[error("{text:?} is not a valid {kind} id (expected {expected})")]
    Malformed {
        /// The kind of id that was being parsed.
        kind: &'static str,
        /// The text that failed to parse.
        text: String,
        /// What a valid id of this kind looks like.
        expected: &'static str,
    },
}

/// An experiment: the first 64 bits of its content hash (config, code version,
/// data version), plus a run number that is 1 for the first run and grows with
/// each `--rerun` of the same content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExperimentId {
    /// The leading 64 bits of the experiment's content hash.
    pub digest: u64,
    /// Which run of this content this is, from 1.
    pub run: u32,
}

impl ExperimentId {
    /// The id of run `run` of the experiment whose full content hash is `content_hash`.
    pub fn from_content_hash(content_hash: &[u8; 32], run: u32) -> Self {
        let mut leading = [0u8; 8];
        leading.copy_from_slice(&content_hash[..8]);
        Self {
            digest: u64::from_be_bytes(leading),
            run,
        }
    }
}

impl fmt::Display for ExperimentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.digest)?;
        if self.run > 1 {
            write!(f, ".{}", self.run)?;
        }
        Ok(())
    }
}

impl FromStr for ExperimentId {
    type Err = IdError;
    fn from_str(text: &str) -> Result<Self, IdError> {
        let malformed = || IdError::Malformed {
            kind: "experiment",
            text: text.to_owned(),
            expected: "16 hex digits, optionally followed by .RUN",
        };
        let (hex_part, run) = match text.split_once('.') {
            Some((hex_part, run)) => (hex_part, run.parse::<u32>().map_err(|_| malformed())?),
            None => (text, 1),
        };
        if hex_part.len() != 16 || run == 0 {
            return Err(malformed());
        }
        let digest = u64::from_str_radix(hex_part, 16).map_err(|_| malformed())?;
        Ok(Self { digest, run })
    }
}

/// A trial: its experiment and its index within that experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TrialId {
    /// The experiment the trial belongs to.
    pub experiment: ExperimentId,
    /// The trial's index within its experiment, from 0.
    pub index: u32,
}

impl fmt::Display for TrialId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-t{}", self.experiment, self.index)
    }
}

impl FromStr for TrialId {
    type Err = IdError;
    fn from_str(text: &str) -> Result<Self, IdError> {
        let malformed = || IdError::Malformed {
            kind: "trial",
            text: text.to_owned(),
            expected: "EXPERIMENT-tINDEX, for example 3f2a9c0d11b2e4f7-t3",
        };
        let (experiment, index) = text.rsplit_once("-t").ok_or_else(malformed)?;
        Ok(Self {
            experiment: experiment.parse().map_err(|_| malformed())?,
            index: index.parse().map_err(|_| malformed())?,
        })
    }
}

/// A node, chosen by the node on its first start and kept in its data directory
/// so that a restarted node is recognised as the same machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub uuid::Uuid);

impl NodeId {
    /// A fresh random node id; called once per node data directory.
    #[expect(
        clippy::disallowed_methods,
        reason = "node ids are minted here, at the edge"
    )]
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4())
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.simple())
    }
}

impl FromStr for NodeId {
    type Err = IdError;
    fn from_str(text: &str) -> Result<Self, IdError> {
        uuid::Uuid::parse_str(text)
            .map(Self)
            .map_err(|_| IdError::Malformed {
                kind: "node",
                text: text.to_owned(),
                expected: "a UUID",
            })
    }
}

/// One worker of one attempt of a trial: the unit a node launches and reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerKey {
    /// The trial.
    pub trial: TrialId,
    /// The attempt, from 1; each retry or resume is a new attempt.
    pub attempt: u32,
    /// The worker's rank in the trial's gang, from 0.
    pub rank: u32,
}

impl fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/a{}/r{}", self.trial, self.attempt, self.rank)
    }
}

/// A blake3 hash naming an immutable blob the head keeps (a driver binary);
/// objects in the nodes' stores are named by [`ObjectId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlobHash(pub [u8; 32]);

impl BlobHash {
    /// The hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }
}

impl fmt::Display for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl FromStr for BlobHash {
    type Err = IdError;
    fn from_str(text: &str) -> Result<Self, IdError> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).map_err(|_| IdError::Malformed {
            kind: "blob",
            text: text.to_owned(),
            expected: "64 hex digits",
        })?;
        Ok(Self(bytes))
    }
}

/// The longest piece of a rejected id quoted back in a parse error, so that a
/// hostile multi-megabyte "id" does not become a multi-megabyte error.
const MAX_QUOTED_ID_CHARS: usize = 80;

/// The name of an object: the blake3 hash of its bytes.
///
/// Prints as 64 lowercase hex digits, which is also its file name on disk, and
/// parses from exactly that form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectId(pub [u8; 32]);

impl ObjectId {
    /// The id of `bytes`: hashing is the only way content gets a name.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({self})")
    }
}

impl FromStr for ObjectId {
    type Err = IdError;

    /// Accepts exactly what `Display` prints, so that a file name or a request
    /// naming the same object in another case cannot become a second entry.
    fn from_str(text: &str) -> Result<Self, IdError> {
        let malformed = || IdError::Malformed {
            kind: "object",
            text: text.chars().take(MAX_QUOTED_ID_CHARS).collect(),
            expected: "64 lowercase hex digits",
        };
        let is_lower_hex = |byte: &u8| byte.is_ascii_digit() || (b'a'..=b'f').contains(byte);
        if text.len() != 64 || !text.as_bytes().iter().all(is_lower_hex) {
            return Err(malformed());
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).map_err(|_| malformed())?;
        Ok(Self(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_round_trip<T: fmt::Display + FromStr + PartialEq + fmt::Debug>(id: T)
    where
        T::Err: fmt::Debug,
    {
        assert_eq!(id.to_string().parse::<T>().unwrap(), id);
    }

    #[test]
    fn ids_round_trip_through_display() {
        let experiment = ExperimentId {
            digest: 0x3f2a_9c0d_11b2_e4f7,
            run: 1,
        };
        check_round_trip(experiment);
        check_round_trip(ExperimentId {
            run: 3,
            ..experiment
        });
        check_round_trip(TrialId {
            experiment,
            index: 11,
        });
        check_round_trip(NodeId::random());
        check_round_trip(BlobHash::of(b"driver"));
        assert_eq!(experiment.to_string(), "3f2a9c0d11b2e4f7");
        assert_eq!(
            TrialId {
                experiment,
                index: 3
            }
            .to_string(),
            "3f2a9c0d11b2e4f7-t3"
        );
    }

    #[test]
    fn malformed_ids_are_rejected() {
        assert!("xyz".parse::<ExperimentId>().is_err());
        assert!("3f2a9c0d11b2e4f7.0".parse::<ExperimentId>().is_err());
        assert!("3f2a9c0d11b2e4f7".parse::<TrialId>().is_err());
        assert!("3f2a9c0d11b2e4f7-tx".parse::<TrialId>().is_err());
        assert!("00".parse::<BlobHash>().is_err());
    }
}
