//! Framing: a 4-byte big-endian length, a 2-byte protocol version, then bincode.
//!
//! Invariant: no frame larger than [`MAX_FRAME_BYTES`] is ever buffered, and every
//! decode runs with that limit, so a hostile length prefix or nested length cannot
//! make a process allocate without bound.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::protocol::{ErrorCode, Message, PROTOCOL_VERSION, RemoteError};

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
    let (version, payload) = body.split_first_chunk::<2>().ok_or(FrameError::Truncated)?;
    let version = u16::from_be_bytes(*version);
    if version != PROTOCOL_VERSION {
        return Err(FrameError::UnsupportedVersion { got: version });
    }
    let (message, used) =
        bincode::serde::decode_from_slice(payload, LIMIT).map_err(FrameError::Malformed)?;
    if used != payload.len() {
        return Err(FrameError::Trailing(payload.len() - used));
    }
    Ok(message)
}

/// Reads one frame; `Ok(None)` when the stream ends cleanly before a frame.
pub async fn read_message<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<Message>, FrameError> {
    read_message_limited(reader, MAX_FRAME_BYTES).await
}

/// [`read_message`] with a tighter size limit, for frames that are small by
/// nature (a hello from a peer not yet authenticated).
pub async fn read_message_limited<R: AsyncRead + Unpin>(
    reader: &mut R,
    limit: usize,
) -> Result<Option<Message>, FrameError> {
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
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await?;
    decode_body(&body).map(Some)
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
            let frame = encode(&Message::FromNode(NodeMessage::Report { seq: 3, report: report.clone() })).unwrap();
            match decode_frame(&frame).unwrap() {
                Message::FromNode(NodeMessage::Report { seq: 3, report: decoded }) => prop_assert_eq!(decoded, report),
                other => prop_assert!(false, "decoded {other:?}"),
            }
        }
    }
}
