//! Kafka framing: a 4-byte big-endian size, then the request header and body. A size
//! above the limit closes the connection before anything of the frame is buffered.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::Decodable;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {0} bytes is over the limit of {1} bytes")]
    TooLarge(i64, usize),
    #[error("a frame did not arrive whole within {0:?} of its first byte (--header-read-timeout-sec)")]
    HeadTimeout(std::time::Duration),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame's bytes (without the size prefix). The first byte may take as long
/// as the connection may idle; the rest of the frame must follow within `within`, so a
/// peer trickling bytes cannot hold a connection and its buffer (issue 19).
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: usize, within: Duration) -> Result<Bytes, FrameError> {
    read_frame_noting(r, max, within, &AtomicBool::new(false)).await
}

/// [`read_frame`], setting `partial` from the frame's first byte until it is whole, so
/// a connection ended meanwhile knows it drops a request it never admitted (SD-INT-12).
pub async fn read_frame_noting<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    within: Duration,
    partial: &AtomicBool,
) -> Result<Bytes, FrameError> {
    let mut size = [0u8; 4];
    match r.read(&mut size[..1]).await {
        Ok(0) => return Err(FrameError::Closed),
        Ok(_) => {}
        Err(e) => return Err(e.into()),
    }
    partial.store(true, Ordering::Relaxed);
    let frame = tokio::time::timeout(within, read_rest(r, size, max))
        .await
        .map_err(|_| FrameError::HeadTimeout(within))?;
    partial.store(false, Ordering::Relaxed);
    frame
}

async fn read_rest<R: AsyncRead + Unpin>(r: &mut R, mut size: [u8; 4], max: usize) -> Result<Bytes, FrameError> {
    r.read_exact(&mut size[1..]).await?;
    let size = i32::from_be_bytes(size);
    if size < 0 || size as usize > max {
        return Err(FrameError::TooLarge(i64::from(size), max));
    }
    // The buffer grows with the bytes that arrive, never from the peer's length field
    // alone: a peer that claims a large frame and sends little costs little (issue 19).
    let size = size as usize;
    let mut buf = BytesMut::with_capacity(size.min(INITIAL_BUFFER));
    let mut limited = (&mut *r).take(size as u64);
    while buf.len() < size {
        buf.reserve((size - buf.len()).min(INITIAL_BUFFER.max(buf.len())));
        if limited.read_buf(&mut buf).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    Ok(buf.freeze())
}

/// What a frame's buffer starts at; it doubles at most as its bytes arrive.
const INITIAL_BUFFER: usize = 64 * 1024;

/// A decoded request, with its body bytes kept for forwarding.
pub struct Request {
    pub header: RequestHeader,
    pub key: ApiKey,
    pub body: Bytes,
    pub kind: RequestKind,
}

/// Why a frame could not be decoded; the connection is closed, as Kafka does.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("frame too short for a request header")]
    Short,
    #[error("unknown API key {0}")]
    UnknownKey(i16),
    /// A known API at a version this gateway does not implement.
    #[error("{key:?} v{version} is not supported")]
    Unsupported {
        key: ApiKey,
        version: i16,
        correlation_id: i32,
    },
    #[error("malformed {0:?} request: {1}")]
    Malformed(ApiKey, String),
}

/// Decodes a frame. `supported` says which versions of an API are implemented.
pub fn decode(mut frame: Bytes, supported: impl Fn(ApiKey, i16) -> bool) -> Result<Request, DecodeError> {
    if frame.len() < 8 {
        return Err(DecodeError::Short);
    }
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let key = ApiKey::try_from(api_key).map_err(|_| DecodeError::UnknownKey(api_key))?;
    if !supported(key, version) {
        return Err(DecodeError::Unsupported {
            key,
            version,
            correlation_id,
        });
    }
    let header = RequestHeader::decode(&mut frame, key.request_header_version(version))
        .map_err(|e| DecodeError::Malformed(key, e.to_string()))?;
    let body = frame.clone();
    let codec = super::versions::codec_version(key, version);
    let kind = RequestKind::decode(key, &mut frame, codec).map_err(|e| DecodeError::Malformed(key, e.to_string()))?;
    Ok(Request {
        header,
        key,
        body,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{MetadataRequest, RequestHeader};
    use kafka_protocol::protocol::Encodable;
    use proptest::prelude::*;

    fn encode(key: ApiKey, version: i16, body: &impl Encodable) -> Bytes {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .encode(&mut buf, key.request_header_version(version))
            .expect("header");
        body.encode(&mut buf, version).expect("body");
        buf.freeze()
    }

    #[test]
    fn a_request_round_trips() {
        let frame = encode(ApiKey::Metadata, 9, &MetadataRequest::default().with_topics(None));
        let r = decode(frame, |_, _| true).expect("decodes");
        assert_eq!(r.header.correlation_id, 7);
        assert!(matches!(r.kind, RequestKind::Metadata(_)));
    }

    #[test]
    fn unsupported_versions_and_unknown_keys_are_told_apart() {
        let frame = encode(ApiKey::Metadata, 9, &MetadataRequest::default());
        assert!(matches!(
            decode(frame, |_, _| false),
            Err(DecodeError::Unsupported { correlation_id: 7, .. })
        ));
        let unknown = Bytes::from_static(&[0x7f, 0x00, 0, 0, 0, 0, 0, 1, 0, 0]);
        assert!(matches!(decode(unknown, |_, _| true), Err(DecodeError::UnknownKey(_))));
    }

    #[test]
    fn a_huge_array_length_fails_cleanly() {
        // Metadata v1: header (key, version, correlation id, null client id), then a
        // topics array claiming i32::MAX entries with none present.
        let frame = Bytes::from_static(&[0, 3, 0, 1, 0, 0, 0, 1, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff]);
        assert!(matches!(decode(frame, |_, _| true), Err(DecodeError::Malformed(..))));
    }

    #[tokio::test]
    async fn an_oversized_frame_is_refused_before_it_is_read() {
        let mut input: &[u8] = &[0x10, 0, 0, 0, 1, 2, 3];
        assert!(matches!(
            read_frame(&mut input, 1024, Duration::from_secs(5)).await,
            Err(FrameError::TooLarge(268435456, 1024))
        ));
        let mut negative: &[u8] = &[0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame(&mut negative, 1024, Duration::from_secs(5)).await,
            Err(FrameError::TooLarge(-1, 1024))
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Arbitrary bytes never panic or abort the decoder, whatever API and version
        /// they claim to be.
        #[test]
        fn arbitrary_frames_never_crash_the_decoder(key in 0i16..80, version in -1i16..20, rest in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut frame = BytesMut::new();
            frame.extend_from_slice(&key.to_be_bytes());
            frame.extend_from_slice(&version.to_be_bytes());
            frame.extend_from_slice(&rest);
            let _ = decode(frame.freeze(), |_, _| true);
        }

        /// A valid header followed by garbage: every supported API's body decoder.
        #[test]
        fn arbitrary_bodies_never_crash_the_decoder(idx in 0usize..64, version in 0i16..14, body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let supported = crate::kafka::versions::SUPPORTED;
            let (key, _, _) = supported[idx % supported.len()];
            let mut frame = BytesMut::from(&encode(key, version, &EmptyBody)[..]);
            frame.extend_from_slice(&body);
            let _ = decode(frame.freeze(), |_, _| true);
        }
    }

    /// Encodes nothing: a header-only frame to append arbitrary bodies to.
    struct EmptyBody;
    impl Encodable for EmptyBody {
        fn encode<B: kafka_protocol::protocol::buf::ByteBufMut>(&self, _: &mut B, _: i16) -> anyhow::Result<()> {
            Ok(())
        }
        fn compute_size(&self, _: i16) -> anyhow::Result<usize> {
            Ok(0)
        }
    }
}
