//! Framing: a 4-byte big-endian length, a 2-byte protocol version, then bincode.
//!
//! Invariant: no frame larger than [`MAX_FRAME_BYTES`] is ever buffered, a body is
//! buffered only as its bytes arrive, and every decode runs with a byte limit
//! within 16 times the payload's length (at least 16 KiB), so no hostile length
//! prefix or string length makes a process allocate much more than it was sent.
//! A sequence's announced length may still make serde reserve up to 1 MiB, so
//! before authentication only a hello (which has none) is decoded
//! ([`read_hello`]).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::protocol::{ErrorCode, Hello, Message, PROTOCOL_VERSION, RemoteError};

/// The largest frame, header excluded.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

const LIMIT: bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_FRAME_BYTES>,
> = bincode::config::standard().with_limit::<MAX_FRAME_BYTES>();

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer announced a frame over the limit.
    #[error("frame of {len} bytes exceeds the limit of {MAX_FRAME_BYTES}")]
    TooLarge {
        /// The announced length.
        len: usize,
    },
    /// The frame speaks another protocol version.
    #[error("protocol version {got} is not supported (this side speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion {
        /// The version in the frame.
        got: u16,
    },
    /// The payload is not a valid message.
    #[error("malformed frame: {0}")]
    Malformed(#[source] bincode::error::DecodeError),
    /// The payload decoded but left bytes over.
    #[error("malformed frame: {0} trailing bytes")]
    Trailing(usize),
    /// A frame shorter than its version field.
    #[error("malformed frame: shorter than its header")]
    Truncated,
    /// The first frame of a connection is not a hello.
    #[error("the first message must be a hello")]
    NotHello,
    /// The message could not be encoded (it would exceed the limit).
    #[error("message cannot be encoded: {0}")]
    Encode(#[source] bincode::error::EncodeError),
    /// The stream failed or ended inside a frame.
    #[error("stream error: {0}")]
    Io(#[from] std::io::Error),
}

impl FrameError {
    /// The error to send back to a peer that caused this.
    pub fn to_remote(&self) -> RemoteError {
        let code = match self {
            Self::TooLarge { .. } => ErrorCode::FrameTooLarge,
            Self::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            Self::Malformed(_) | Self::Trailing(_) | Self::Truncated => ErrorCode::MalformedFrame,
            Self::NotHello => ErrorCode::BadRequest,
            Self::Encode(_) | Self::Io(_) => ErrorCode::Internal,
        };
        RemoteError::new(code, self.to_string())
    }
}

/// Encodes `message` into one frame, header included.
pub fn encode(message: &Message) -> Result<Vec<u8>, FrameError> {
    let mut frame = vec![0u8; 6];
    bincode::serde::encode_into_std_write(message, &mut frame, LIMIT)
        .map_err(FrameError::Encode)?;
    let body_len = frame.len() - 4;
    if body_len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { len: body_len });
    }
    frame[..4].copy_from_slice(&(body_len as u32).to_be_bytes());
    frame[4..6].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    Ok(frame)
}

/// Decodes a frame body (version and payload, length prefix removed).
pub fn decode_body(body: &[u8]) -> Result<Message, FrameError> {
    decode_whole(payload_of(body)?)
}

/// A frame body's payload, once its version is checked.
fn payload_of(body: &[u8]) -> Result<&[u8], FrameError> {
    let (version, payload) = body.split_first_chunk::<2>().ok_or(FrameError::Truncated)?;
    let version = u16::from_be_bytes(*version);
    if version != PROTOCOL_VERSION {
        return Err(FrameError::UnsupportedVersion { got: version });
    }
    Ok(payload)
}

/// Decodes all of `payload` as a `T`.
fn decode_whole<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    let (message, used) = decode_payload(payload).map_err(FrameError::Malformed)?;
    if used != payload.len() {
        return Err(FrameError::Trailing(payload.len() - used));
    }
    Ok(message)
}

/// The most bytes bincode claims per payload byte: 8, a `u64` or a length
/// written as a 1-byte varint.
const MAX_CLAIM_PER_BYTE: usize = 8;

/// Decodes `payload` with a byte limit near its own length. Every string and
/// byte array's length is claimed against the limit before it is allocated,
/// and a legitimate payload claims at most [`MAX_CLAIM_PER_BYTE`] times its
/// length (its strings' bytes, and each integer's size in memory), so no
/// legitimate message is refused; a hostile one claims at most the limit. The limit is a
/// const generic: the smallest of a few steps that holds what the payload may
/// claim ([`MAX_CLAIM_PER_BYTE`] per byte).
///
/// Sequences are not covered: serde reserves room for up to 1 MiB of a
/// sequence's elements from its announced length; [`read_hello`] therefore
/// decodes nothing but a hello, which has none.
fn decode_payload<T: serde::de::DeserializeOwned>(
    payload: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    fn limited<T: serde::de::DeserializeOwned, const N: usize>(
        payload: &[u8],
    ) -> Result<(T, usize), bincode::error::DecodeError> {
        bincode::serde::decode_from_slice(payload, bincode::config::standard().with_limit::<N>())
    }
    const STEP_1: usize = 16 << 10;
    const STEP_2: usize = 256 << 10;
    const STEP_3: usize = 4 << 20;
    // bincode claims an integer's size in memory, not on the wire: a u64 or a
    // length written as a 1-byte varint claims 8 bytes. So a legitimate
    // payload claims up to 8 times its length (320 trial events in 9.7 KB
    // claim more than 16 KiB), and the step must hold that.
    let len = payload.len().saturating_mul(MAX_CLAIM_PER_BYTE);
    if len <= STEP_1 {
        limited::<T, STEP_1>(payload)
    } else if len <= STEP_2 {
        limited::<T, STEP_2>(payload)
    } else if len <= STEP_3 {
        limited::<T, STEP_3>(payload)
    } else {
        bincode::serde::decode_from_slice(payload, LIMIT)
    }
}

/// Reads one frame; `Ok(None)` when the stream ends cleanly before a frame.
pub async fn read_message<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<Message>, FrameError> {
    read_message_limited(reader, MAX_FRAME_BYTES).await
}

/// [`read_message`] with a tighter size limit.
pub async fn read_message_limited<R: AsyncRead + Unpin>(
    reader: &mut R,
    limit: usize,
) -> Result<Option<Message>, FrameError> {
    match read_body(reader, limit).await? {
        Some(body) => decode_body(&body).map(Some),
        None => Ok(None),
    }
}

/// Reads the first frame of a peer not yet authenticated: at most `limit`
/// bytes, and only a [`Hello`]. Any other message is refused before it is
/// decoded, since a few bytes announcing a long sequence in it would make
/// serde reserve up to 1 MiB; a hello holds only strings, whose lengths the
/// decode limit bounds by the frame's own length.
pub async fn read_hello<R: AsyncRead + Unpin>(
    reader: &mut R,
    limit: usize,
) -> Result<Option<Hello>, FrameError> {
    let Some(body) = read_body(reader, limit).await? else {
        return Ok(None);
    };
    // `Message::Hello` is variant 0, which bincode writes as the byte 0.
    match payload_of(&body)?.split_first() {
        Some((0, hello)) => decode_whole(hello).map(Some),
        Some(_) => Err(FrameError::NotHello),
        None => Err(FrameError::Truncated),
    }
}

/// Reads one frame's body (at most `limit` bytes); `Ok(None)` when the
/// stream ends cleanly before a frame.
async fn read_body<R: AsyncRead + Unpin>(
    reader: &mut R,
    limit: usize,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut header = [0u8; 4];
    let mut filled = 0;
    while filled < header.len() {
        let read = reader.read(&mut header[filled..]).await?;
        if read == 0 {
            if filled == 0 {
                return Ok(None);
            }
            return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        filled += read;
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > limit.min(MAX_FRAME_BYTES) {
        return Err(FrameError::TooLarge { len });
    }
    // Grown as the bytes arrive, not sized by the announced length: a peer
    // that announces 16 MiB and sends 20 bytes makes no 16 MiB buffer.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    let read = (&mut *reader)
        .take(len as u64)
        .read_to_end(&mut body)
        .await?;
    if read != len {
        return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(Some(body))
}

/// Writes one frame.
pub async fn write_message<W: AsyncWrite + Unpin>(
    writer: &mut W,
    message: &Message,
) -> Result<(), FrameError> {
    let frame = encode(message)?;
    writer.write_all(&frame).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ids::{ExperimentId, TrialId, WorkerKey};
    use crate::protocol::{NodeMessage, Request, WorkerReport};

    fn decode_frame(frame: &[u8]) -> Result<Message, FrameError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            read_message(&mut &frame[..])
                .await
                .map(|message| message.expect("a frame"))
        })
    }

    #[test]
    fn oversized_and_foreign_frames_are_refused() {
        let mut frame = ((MAX_FRAME_BYTES + 1) as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&[0; 16]);
        assert!(matches!(
            decode_frame(&frame),
            Err(FrameError::TooLarge { .. })
        ));

        let mut frame = encode(&Message::Request(Request::Nodes)).unwrap();
        frame[4..6].copy_from_slice(&99u16.to_be_bytes());
        assert!(matches!(
            decode_frame(&frame),
            Err(FrameError::UnsupportedVersion { got: 99 })
        ));

        let mut frame = encode(&Message::Request(Request::Nodes)).unwrap();
        frame.push(0);
        let len = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&len.to_be_bytes());
        assert!(matches!(decode_frame(&frame), Err(FrameError::Trailing(1))));
    }

    #[test]
    fn a_length_claimed_beyond_the_body_is_refused_before_it_is_allocated() {
        // A large legitimate message decodes whole under its step's limit.
        let message = Message::Error(RemoteError::new(ErrorCode::BadRequest, "x".repeat(1 << 20)));
        let frame = encode(&message).unwrap();
        assert!(decode_body(&frame[4..]).is_ok());
        // Its first bytes alone still claim the 1 MiB string: over the limit
        // of a body that short, refused before the string is made.
        let short = &frame[4..40];
        assert!(
            matches!(
                decode_body(short),
                Err(FrameError::Malformed(
                    bincode::error::DecodeError::LimitExceeded
                ))
            ),
            "{:?}",
            decode_body(short)
        );
        // An announced frame length the stream does not hold is an early end.
        let mut cut = frame[..4].to_vec();
        cut.extend_from_slice(&frame[4..64]);
        assert!(matches!(decode_frame(&cut), Err(FrameError::Io(_))));
    }

    #[test]
    fn before_authentication_only_a_hello_is_decoded() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let read = |frame: &[u8]| runtime.block_on(read_hello(&mut &frame[..], 16 << 10));
        let hello = Hello {
            token: "secret".to_owned(),
            role: crate::protocol::PeerRole::Client,
            agent: "a".repeat(1000),
        };
        let frame = encode(&Message::Hello(hello)).unwrap();
        assert_eq!(read(&frame).unwrap().unwrap().agent.len(), 1000);
        // Its first bytes alone: an early end (the claim is within the
        // smallest decode limit, 16 KiB, which is all it may cost).
        let mut short = frame[..40].to_vec();
        short[..4].copy_from_slice(&36u32.to_be_bytes());
        assert!(matches!(read(&short), Err(FrameError::Malformed(_))));
        let request = encode(&Message::Request(Request::Nodes)).unwrap();
        assert!(matches!(read(&request), Err(FrameError::NotHello)));
        assert!(matches!(read(&[]), Ok(None)));
    }

    proptest! {
        #[test]
        fn random_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut framed = (body.len() as u32 + 2).to_be_bytes().to_vec();
            framed.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
            framed.extend_from_slice(&body);
            let _ = decode_frame(&framed);
        }

        #[test]
        fn metric_reports_round_trip(digest in any::<u64>(), index in any::<u32>(), step in any::<Option<u64>>(), value in -1e9f64..1e9) {
            let key = WorkerKey { trial: TrialId { experiment: ExperimentId { digest, run: 1 }, index }, attempt: 1, rank: 0 };
            let report = WorkerReport::Metric { key, index: 7, step, values: vec![("loss".to_owned(), value)] };
            let frame = encode(&Message::FromNode(NodeMessage::Report { seq: 3, at: 1_700_000_000_000, report: report.clone() })).unwrap();
            match decode_frame(&frame).unwrap() {
                Message::FromNode(NodeMessage::Report { seq: 3, at: 1_700_000_000_000, report: decoded }) => prop_assert_eq!(decoded, report),
                other => prop_assert!(false, "decoded {other:?}"),
            }
        }
    }

    #[test]
    fn answers_dense_with_small_integers_decode() {
        // Each varint of a byte claims 8: 320 events in 9.7 KB claim over 16 KiB.
        use crate::ids::{ExperimentId, NodeId, TrialId};
        use crate::protocol::{
            AttemptStatus, ExperimentState, ExperimentStatus, Response, TrialEvent, TrialState,
            TrialStatus,
        };
        let experiment = ExperimentId { digest: 7, run: 1 };
        for n in [10u32, 60, 80, 100, 200] {
            let trials = (0..n)
                .map(|index| TrialStatus {
                    id: TrialId { experiment, index },
                    state: TrialState::Succeeded,
                    config_json: r#"{"seed":123456789}"#.to_owned(),
                    attempts: vec![AttemptStatus {
                        number: 1,
                        nodes: vec![NodeId::random()],
                        placed_at: 1,
                        running_at: Some(2),
                        ended_at: Some(3),
                        outcome: Some("succeeded".to_owned()),
                        resumed_from: None,
                    }],
                    metrics: Default::default(),
                    last_step: None,
                    reason: None,
                    reused_from: None,
                    waiting: None,
                    gpu_hours: 0.0,
                    cost: None,
                    malformed_metrics: None,
                })
                .collect();
            let status = Message::Response(Response::Status(vec![ExperimentStatus {
                id: experiment,
                name: "bench".to_owned(),
                team: "bench".to_owned(),
                state: ExperimentState::Succeeded,
                metric: None,
                maximize: false,
                submitted_at: 0,
                code_version: "none".to_owned(),
                data_version: "none".to_owned(),
                trials,
                objectives: Vec::new(),
                front: None,
            }]));
            let bytes = encode(&status).unwrap();
            let decoded = decode_body(&bytes[4..]);
            assert!(
                decoded.is_ok(),
                "status of {n} trials, {} bytes: {decoded:?}",
                bytes.len()
            );
            let events = Message::Response(Response::Events(
                (0..n * 4)
                    .map(|seq| TrialEvent {
                        seq: u64::from(seq),
                        at: 1_700_000_000_000,
                        trial: TrialId {
                            experiment,
                            index: seq / 4,
                        },
                        state: TrialState::Running,
                        attempt: 1,
                        reason: "placed on node".to_owned(),
                    })
                    .collect(),
            ));
            let bytes = encode(&events).unwrap();
            let decoded = decode_body(&bytes[4..]);
            assert!(
                decoded.is_ok(),
                "{} events, {} bytes: {decoded:?}",
                n * 4,
                bytes.len()
            );
        }
    }
}
