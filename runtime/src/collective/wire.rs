//! The bytes collectives put on a link: the connection handshake and frame headers.
//!
//! This is a data-plane format between the ranks of one trial, which all run the
//! same build; it is not part of `runtime::protocol` and carries no version
//! negotiation beyond a magic and a version that must match exactly.
//!
//! Roles and order:
//! - The connecting rank (rank r, connecting to r+1) writes a [`Hello`] first: the
//!   magic, the version, the link kind, the shared per-attempt token and its rank.
//!   A shared-memory hello is followed by the ring file's path. The accepting rank
//!   answers one [`ACK`] byte when it trusts the hello, and drops the connection
//!   without a word when it does not.
//! - After that, the forward direction carries frames: a [`FrameHeader`] followed,
//!   for data, by exactly `len` payload bytes. Heartbeats may come between any two
//!   frames; an abort ends the stream's useful life.
//! - The reverse direction (r+1 back to r) carries only abort frames.

use super::element::Dtype;

/// The first bytes of every hello.
pub(crate) const MAGIC: [u8; 4] = *b"xpcl";
/// The wire version; both ends must use the same one.
pub(crate) const VERSION: u16 = 1;
/// The bytes of a [`Hello`] without the trailing path.
pub(crate) const HELLO_BYTES: usize = 48;
/// The byte the acceptor answers when it trusts a hello.
pub(crate) const ACK: u8 = 0xA5;
/// The bytes of a [`FrameHeader`].
pub(crate) const HEADER_BYTES: usize = 24;
/// The longest shared-memory path a hello may carry.
pub(crate) const MAX_PATH_BYTES: usize = 4096;

/// How the connecting rank wants the link carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum LinkKind {
    /// Frames on this TCP connection.
    Tcp = 1,
    /// Frames in a shared-memory ring; this TCP connection watches liveness and
    /// carries aborts back.
    Shm = 2,
    /// Frames on QUIC streams of this connection.
    Quic = 3,
}

/// The connecting rank's introduction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) kind: LinkKind,
    pub(crate) token: [u8; 32],
    pub(crate) rank: u32,
    /// The index of this stream among the link's QUIC streams (0 otherwise).
    pub(crate) stream: u32,
    /// For shared memory, the length of the path that follows; for QUIC, the number
    /// of streams the link uses; otherwise 0.
    pub(crate) extra: u16,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut out = [0u8; HELLO_BYTES];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6] = self.kind as u8;
        out[8..40].copy_from_slice(&self.token);
        out[40..44].copy_from_slice(&self.rank.to_le_bytes());
        out[44..46].copy_from_slice(&u16::try_from(self.stream).unwrap_or(u16::MAX).to_le_bytes());
        out[46..48].copy_from_slice(&self.extra.to_le_bytes());
        out
    }

    /// Decodes a hello; `None` when the magic, version or kind is wrong.
    pub(crate) fn decode(bytes: &[u8; HELLO_BYTES]) -> Option<Self> {
        if bytes[0..4] != MAGIC || u16::from_le_bytes([bytes[4], bytes[5]]) != VERSION {
            return None;
        }
        let kind = match bytes[6] {
            1 => LinkKind::Tcp,
            2 => LinkKind::Shm,
            3 => LinkKind::Quic,
            _ => return None,
        };
        let mut token = [0u8; 32];
        token.copy_from_slice(&bytes[8..40]);
        Some(Self {
            kind,
            token,
            rank: u32::from_le_bytes(bytes[40..44].try_into().expect("4 bytes")),
            stream: u32::from(u16::from_le_bytes([bytes[44], bytes[45]])),
            extra: u16::from_le_bytes([bytes[46], bytes[47]]),
        })
    }
}

/// Whether `presented` is `expected`, in time independent of where they differ.
pub(crate) fn token_matches(presented: &[u8; 32], expected: &[u8; 32]) -> bool {
    // blake3::Hash equality is constant-time.
    blake3::hash(presented) == blake3::hash(expected)
}

/// Which collective a data frame belongs to, so that ranks calling different
/// collectives fail instead of mixing buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum OpCode {
    /// An all-reduce.
    AllReduce = 1,
    /// A broadcast.
    Broadcast = 2,
    /// An all-gather.
    AllGather = 3,
    /// A barrier.
    Barrier = 4,
}

/// Why a rank gave up, as carried by an abort frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum FailureCause {
    /// The culprit closed its connection or its process ended.
    Closed = 1,
    /// The culprit sent nothing, or read nothing, for a whole timeout.
    Timeout = 2,
    /// The culprit sent something the protocol does not allow.
    Protocol = 3,
    /// The culprit called a different collective, or with a different length.
    Mismatch = 4,
    /// Something else failed.
    Other = 5,
}

impl FailureCause {
    fn from_code(code: u64) -> Self {
        match code {
            1 => Self::Closed,
            2 => Self::Timeout,
            3 => Self::Protocol,
            4 => Self::Mismatch,
            _ => Self::Other,
        }
    }
}

impl std::fmt::Display for FailureCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Closed => "closed",
            Self::Timeout => "timed out",
            Self::Protocol => "broke the protocol",
            Self::Mismatch => "called a different collective",
            Self::Other => "failed",
        })
    }
}

/// What a data frame claims to be; compared with what the receiver expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSummary {
    /// The collective.
    pub op: OpCode,
    /// The element type.
    pub dtype: Dtype,
    /// The sender's collective counter.
    pub seq: u32,
    /// The frame's index within the collective.
    pub index: u32,
    /// Payload bytes.
    pub len: u64,
}

/// One frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameHeader {
    /// `len` payload bytes follow.
    Data(FrameSummary),
    /// Nothing follows; the sender is alive and inside a collective.
    Heartbeat,
    /// The sender gave up because of `culprit`.
    Abort { culprit: u32, cause: FailureCause },
}

const TAG_DATA: u8 = 1;
const TAG_HEARTBEAT: u8 = 2;
const TAG_ABORT: u8 = 3;

impl FrameHeader {
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        match self {
            Self::Data(summary) => {
                out[0] = TAG_DATA;
                out[1] = summary.op as u8;
                out[2] = summary.dtype as u8;
                out[4..8].copy_from_slice(&summary.seq.to_le_bytes());
                out[8..12].copy_from_slice(&summary.index.to_le_bytes());
                out[16..24].copy_from_slice(&summary.len.to_le_bytes());
            }
            Self::Heartbeat => out[0] = TAG_HEARTBEAT,
            Self::Abort { culprit, cause } => {
                out[0] = TAG_ABORT;
                out[8..12].copy_from_slice(&culprit.to_le_bytes());
                out[16..24].copy_from_slice(&(*cause as u64).to_le_bytes());
            }
        }
        out
    }

    /// Decodes a header; `None` when it is not one.
    pub(crate) fn decode(bytes: &[u8; HEADER_BYTES]) -> Option<Self> {
        let word = |range: std::ops::Range<usize>| {
            u32::from_le_bytes(bytes[range].try_into().expect("4 bytes"))
        };
        let len = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        match bytes[0] {
            TAG_DATA => {
                let op = match bytes[1] {
                    1 => OpCode::AllReduce,
                    2 => OpCode::Broadcast,
                    3 => OpCode::AllGather,
                    4 => OpCode::Barrier,
                    _ => return None,
                };
                let dtype = match bytes[2] {
                    1 => Dtype::F32,
                    2 => Dtype::F64,
                    3 => Dtype::Bf16,
                    4 => Dtype::F16,
                    _ => return None,
                };
                Some(Self::Data(FrameSummary {
                    op,
                    dtype,
                    seq: word(4..8),
                    index: word(8..12),
                    len,
                }))
            }
            TAG_HEARTBEAT => Some(Self::Heartbeat),
            TAG_ABORT => Some(Self::Abort {
                culprit: word(8..12),
                cause: FailureCause::from_code(len),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let headers = [
            FrameHeader::Data(FrameSummary {
                op: OpCode::Broadcast,
                dtype: Dtype::Bf16,
                seq: u32::MAX,
                index: 7,
                len: 1 << 40,
            }),
            FrameHeader::Heartbeat,
            FrameHeader::Abort {
                culprit: 3,
                cause: FailureCause::Timeout,
            },
        ];
        for header in headers {
            assert_eq!(FrameHeader::decode(&header.encode()), Some(header));
        }
        assert_eq!(FrameHeader::decode(&[9; HEADER_BYTES]), None);
    }

    #[test]
    fn hellos_round_trip_and_refuse_garbage() {
        let hello = Hello {
            kind: LinkKind::Shm,
            token: [7; 32],
            rank: 5,
            stream: 2,
            extra: 31,
        };
        assert_eq!(Hello::decode(&hello.encode()), Some(hello));
        assert_eq!(Hello::decode(&[0; HELLO_BYTES]), None);
        assert!(token_matches(&[1; 32], &[1; 32]));
        assert!(!token_matches(&[1; 32], &[2; 32]));
    }

    /// Hostile bytes (tests/hostile_bytes.rs covers the other decoders): any 24
    /// header bytes and any 48 hello bytes decode to a value or to `None`, and
    /// whatever decodes encodes back to bytes that decode to the same value. Both
    /// decoders read fixed-size arrays into plain values, so they cannot allocate;
    /// a data frame's `len` is only compared with the length the receiver
    /// expects, whose buffer it already holds. `XP_FUZZ_SCALE` multiplies the cases.
    #[test]
    #[expect(clippy::print_stderr, reason = "say how many inputs ran")]
    fn hostile_headers_and_hellos_decode_or_refuse() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let scale: u32 = std::env::var("XP_FUZZ_SCALE")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(1);
        let cases = 20_000 * scale;
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let valid_header = FrameHeader::Data(FrameSummary {
            op: OpCode::AllReduce,
            dtype: Dtype::F32,
            seq: 9,
            index: 2,
            len: 4096,
        })
        .encode();
        let valid_hello = Hello {
            kind: LinkKind::Quic,
            token: [3; 32],
            rank: 1,
            stream: 0,
            extra: 4,
        }
        .encode();
        // Random bytes, and valid encodings with one to three bytes changed
        // (random bytes almost never carry the magic).
        let header_bytes = prop_oneof![
            proptest::collection::vec(any::<u8>(), HEADER_BYTES),
            proptest::collection::vec((0..HEADER_BYTES, any::<u8>()), 1..4).prop_map(
                move |edits| {
                    let mut bytes = valid_header.to_vec();
                    for (at, value) in edits {
                        bytes[at] = value;
                    }
                    bytes
                }
            ),
        ];
        let hello_bytes = prop_oneof![
            proptest::collection::vec(any::<u8>(), HELLO_BYTES),
            proptest::collection::vec((0..HELLO_BYTES, any::<u8>()), 1..4).prop_map(move |edits| {
                let mut bytes = valid_hello.to_vec();
                for (at, value) in edits {
                    bytes[at] = value;
                }
                bytes
            }),
        ];
        let decoded = std::cell::Cell::new(0u32);
        runner
            .run(&(header_bytes, hello_bytes), |(header, hello)| {
                let header: [u8; HEADER_BYTES] = header.try_into().expect("sized");
                let hello: [u8; HELLO_BYTES] = hello.try_into().expect("sized");
                if let Some(parsed) = FrameHeader::decode(&header) {
                    decoded.set(decoded.get() + 1);
                    prop_assert_eq!(FrameHeader::decode(&parsed.encode()), Some(parsed));
                }
                if let Some(parsed) = Hello::decode(&hello) {
                    decoded.set(decoded.get() + 1);
                    let again = Hello::decode(&parsed.encode());
                    prop_assert_eq!(again, Some(parsed));
                }
                Ok(())
            })
            .unwrap();
        eprintln!(
            "hostile collective wire: {cases} header and {cases} hello inputs, {} decoded",
            decoded.get()
        );
    }
}
