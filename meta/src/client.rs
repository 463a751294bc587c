//! A client of the metadata log for streamd, gatewayd, the CLI and tests: propose,
//! linearizable read, watch and admin queries against any replica of a list.

use crate::model::codec;
use crate::model::command::{Command, Outcome, Proposal, Proposer};
use crate::model::rows::{AbortedTxn, ObjectRange, RangeTxns};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::ClientTlsConfig;
use weir_proto::metad::admin_client::AdminClient;
use weir_proto::metad::metad_client::MetadClient as GrpcMetadClient;
use weir_proto::metad::{
    AbortedTxn as ProtoAbortedTxn, AdminReply, AdminRequest, DrainRequest, LinearizableReadRequest,
    ObjectsCommittedRequest, ProposeRequest, Range, ReadRangesRequest, ReleasedObjectsRequest, TransferRequest,
    WatchEvent, WatchRequest,
};
use weir_shared::grpc::Channel;
use weir_shared::grpc::MAX_MESSAGE;
use weir_shared::ids::{ObjectKey, Offset, StreamId};

/// Most ranges (or object keys) one index call carries.
pub const MAX_PAGE: u32 = 1_000;

/// How fresh an index read must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// Confirmed with a quorum by the leader: reflects every entry committed before the call.
    Linearizable,
    /// Whatever replica answers, once it has applied at least this index.
    AtLeast(u64),
}

/// A page of a stream's ranges.
#[derive(Clone, Debug, Default)]
pub struct RangesPage {
    pub ranges: Vec<ObjectRange>,
    /// The answering replica's applied index when it read.
    pub applied_index: u64,
    /// More ranges follow in the direction read.
    pub more: bool,
}

/// A range as the index API carries it.
pub fn range_to_proto(r: &ObjectRange) -> Range {
    Range {
        object_key: r.key.0.clone(),
        start: r.start.0,
        end: r.end.0,
        pos: r.pos,
        len: r.len,
        crc: r.crc,
        max_timestamp: r.max_timestamp,
        lso_at_end: r.txns.lso_at_end,
        aborted: r
            .txns
            .aborted
            .iter()
            .map(|a| ProtoAbortedTxn {
                producer_id: a.producer_id,
                first_offset: a.first_offset,
                last_offset: a.last_offset,
            })
            .collect(),
    }
}

pub fn range_from_proto(r: Range) -> ObjectRange {
    ObjectRange {
        key: ObjectKey(r.object_key),
        start: Offset(r.start),
        end: Offset(r.end),
        pos: r.pos,
        len: r.len,
        crc: r.crc,
        max_timestamp: r.max_timestamp,
        txns: RangeTxns {
            lso_at_end: r.lso_at_end,
            aborted: r
                .aborted
                .into_iter()
                .map(|a| AbortedTxn {
                    producer_id: a.producer_id,
                    first_offset: a.first_offset,
                    last_offset: a.last_offset,
                })
                .collect(),
        },
    }
}

/// A channel whose calls carry the client's bearer token, if it has one.
type Authed = InterceptedService<Channel, Bearer>;

/// Adds `authorization: Bearer <token>` to every call: how `weir` authenticates to
/// metad with an admin token instead of a certificate (issue 18).
#[derive(Clone)]
struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// The client API's stub on `ch`, with the message limits of this API.
fn metad_stub(ch: Authed) -> GrpcMetadClient<Authed> {
    GrpcMetadClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

fn admin_stub(ch: Authed) -> AdminClient<Authed> {
    AdminClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}
use weir_shared::error_code::ErrorCode;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No replica answered, or none had a quorum; retry later. A proposal's outcome is unknown.
    #[error("metadata log unavailable: {0}")]
    Unavailable(String),
    /// The request itself was refused.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// What the request names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be carried out in the current state (its message says why).
    #[error("{0}")]
    Conflict(String),
    /// A reply could not be decoded.
    #[error("malformed reply: {0}")]
    Malformed(String),
    /// metad refused the caller: who it is may not ask this (D-21).
    #[error("{0}")]
    Denied(String),
    /// The leader's disk is under its refuse mark: no new topics, streams or tokens
    /// until space returns (issue 60). Retryable.
    #[error("{0}")]
    StorageFull(String),
}

impl ClientError {
    /// The system's code for this failure; HTTP and Kafka answers follow from it.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Unavailable(_) => ErrorCode::Unavailable,
            ClientError::Invalid(_) => ErrorCode::InvalidArgument,
            ClientError::NotFound(_) => ErrorCode::NotFound,
            ClientError::Conflict(_) => ErrorCode::Conflict,
            ClientError::Malformed(_) => ErrorCode::Internal,
            ClientError::Denied(_) => ErrorCode::Forbidden,
            ClientError::StorageFull(_) => ErrorCode::StorageFull,
        }
    }
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        let message = s.message().to_string();
        if ErrorCode::of_status(&s) == Some(ErrorCode::StorageFull) {
            return ClientError::StorageFull(message);
        }
        match s.code() {
            tonic::Code::NotFound => ClientError::NotFound(message),
            tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists => ClientError::Conflict(message),
            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => ClientError::Denied(message),
            _ if refused(&s) => ClientError::Invalid(message),
            _ => ClientError::Unavailable(format!("{}: {}", s.code(), message)),
        }
    }
}

/// An admin reply's JSON document.
fn json(reply: AdminReply) -> Result<serde_json::Value, ClientError> {
    serde_json::from_slice(&reply.json).map_err(|e| ClientError::Malformed(e.to_string()))
}

/// Whether a replica refused the request itself, so another replica would too.
fn refused(s: &tonic::Status) -> bool {
    use tonic::Code::*;
    ErrorCode::of_status(s) == Some(ErrorCode::StorageFull)
        || matches!(
            s.code(),
            InvalidArgument
                | NotFound
                | FailedPrecondition
                | AlreadyExists
                | PermissionDenied
                | Unauthenticated
                | OutOfRange
                | Unimplemented
        )
}

/// Talks to whichever replica of `addrs` answers, starting with the last that did.
pub struct MetadClient {
    channels: Vec<(String, Channel)>,
    preferred: AtomicUsize,
    timeout: Duration,
    bearer: Bearer,
}

impl MetadClient {
    /// A client of the replicas at `addrs` (`host:port`); calls give up after `timeout`.
    pub fn new(addrs: &[String], timeout: Duration) -> Result<Self, ClientError> {
        Self::with_tls(addrs, timeout, weir_shared::cluster_tls::installed())
    }

    /// As [`MetadClient::new`], with `tls` (mTLS) instead of this process's own.
    pub fn with_tls(
        addrs: &[String],
        timeout: Duration,
        tls: Option<&weir_shared::cluster_tls::ClusterTls>,
    ) -> Result<Self, ClientError> {
        Self::with_credentials(addrs, timeout, tls.map(|t| t.client()), None)
    }

    /// As [`MetadClient::new`], over `tls` (trusting the cluster's CA, with or without
    /// a certificate of its own), every call carrying `token` when given: an admin
    /// token, for a caller without a certificate.
    pub fn with_credentials(
        addrs: &[String],
        timeout: Duration,
        tls: Option<ClientTlsConfig>,
        token: Option<&str>,
    ) -> Result<Self, ClientError> {
        if addrs.is_empty() {
            return Err(ClientError::Invalid("no metad address given".into()));
        }
        let bearer = token
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {t}"))
                    .map_err(|_| ClientError::Invalid("the token has characters a header cannot carry".into()))
            })
            .transpose()?;
        let channels = addrs
            .iter()
            .map(|a| {
                weir_shared::grpc::channel_with(a, tls.clone())
                    .map(|c| (a.clone(), c))
                    .map_err(|e| ClientError::Invalid(format!("metad address '{a}': {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            channels,
            preferred: AtomicUsize::new(0),
            timeout,
            bearer: Bearer(bearer),
        })
    }

    /// Tries each replica once, from the preferred one, until one answers other than `unavailable`.
    async fn each<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: FnMut(Authed) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        self.each_within(self.timeout, true, call).await
    }

    /// As [`Self::each`], each attempt bounded by `timeout`. Without `retry_unanswered`
    /// an attempt that got no answer ends the call: a long call (a drain) may still be
    /// running, and asking another replica would start it twice.
    async fn each_within<T, F, Fut>(
        &self,
        timeout: Duration,
        retry_unanswered: bool,
        mut call: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Authed) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let start = self.preferred.load(Ordering::Relaxed);
        let mut last = ClientError::Unavailable("no replica tried".into());
        for i in 0..self.channels.len() {
            let idx = (start + i) % self.channels.len();
            let (addr, ch) = &self.channels[idx];
            let ch = InterceptedService::new(ch.clone(), self.bearer.clone());
            match tokio::time::timeout(timeout, call(ch)).await {
                Ok(Ok(v)) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    return Ok(v);
                }
                Ok(Err(status)) if refused(&status) => return Err(status.into()),
                Ok(Err(status)) => last = ClientError::Unavailable(format!("{addr}: {}", status.message())),
                Err(_) => {
                    last = ClientError::Unavailable(format!("{addr}: no answer within {timeout:?}"));
                    if !retry_unanswered {
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    }

    /// Proposes `command` as `proposer`; returns the applied index and the outcome.
    pub async fn propose(&self, proposer: &Proposer, command: Command) -> Result<(u64, Outcome), ClientError> {
        self.propose_with(proposer, command, self.timeout, true).await
    }

    /// As [`Self::propose`], with one bound on the whole wait: no other replica is asked
    /// after an attempt that got no answer within `timeout`.
    pub async fn propose_within(
        &self,
        proposer: &Proposer,
        command: Command,
        timeout: Duration,
    ) -> Result<(u64, Outcome), ClientError> {
        self.propose_with(proposer, command, timeout, false).await
    }

    /// How long one attempt at one replica may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// As [`Self::propose`], each replica's attempt bounded by `timeout` rather than the
    /// client's: for a command that is harmless twice (a heartbeat), so an attempt that
    /// got no answer moves on to the next replica.
    pub async fn propose_each_within(
        &self,
        proposer: &Proposer,
        command: Command,
        timeout: Duration,
    ) -> Result<(u64, Outcome), ClientError> {
        self.propose_with(proposer, command, timeout, true).await
    }

    async fn propose_with(
        &self,
        proposer: &Proposer,
        command: Command,
        timeout: Duration,
        retry_unanswered: bool,
    ) -> Result<(u64, Outcome), ClientError> {
        let bytes = codec::encode(&Proposal {
            proposer: proposer.clone(),
            command,
        });
        let reply = self
            .each_within(timeout, retry_unanswered, |ch| {
                let bytes = bytes.clone();
                async move { metad_stub(ch).propose(ProposeRequest { command: bytes }).await }
            })
            .await?
            .into_inner();
        let outcome = codec::decode(&reply.outcome).map_err(|e| ClientError::Malformed(e.to_string()))?;
        Ok((reply.log_index, outcome))
    }

    /// An index the leader confirmed committed with a quorum.
    pub async fn linearizable_read(&self) -> Result<u64, ClientError> {
        let reply = self
            .each(|ch| async move { metad_stub(ch).linearizable_read(LinearizableReadRequest {}).await })
            .await?;
        Ok(reply.into_inner().committed_index)
    }

    /// Opens a watch on some replica, resuming after `after_index` when given.
    pub async fn watch(&self, after_index: Option<u64>) -> Result<tonic::Streaming<WatchEvent>, ClientError> {
        let reply = self
            .each(|ch| async move { metad_stub(ch).watch(WatchRequest { after_index }).await })
            .await?;
        Ok(reply.into_inner())
    }

    /// A page of `stream`'s committed ranges from the object index: those holding
    /// `offset` and after it, or (`reverse`) those ending at or before it, newest first.
    pub async fn read_ranges(
        &self,
        stream: StreamId,
        offset: Offset,
        reverse: bool,
        limit: u32,
        consistency: Consistency,
    ) -> Result<RangesPage, ClientError> {
        let (linearizable, min_applied_index) = match consistency {
            Consistency::Linearizable => (true, 0),
            Consistency::AtLeast(i) => (false, i),
        };
        let request = ReadRangesRequest {
            stream: stream.0,
            offset: offset.0,
            reverse,
            limit: limit.min(MAX_PAGE),
            linearizable,
            min_applied_index,
        };
        let reply = self
            .each(|ch| async move { metad_stub(ch).read_ranges(request).await })
            .await?
            .into_inner();
        Ok(RangesPage {
            ranges: reply.ranges.into_iter().map(range_from_proto).collect(),
            applied_index: reply.applied_index,
            more: reply.more,
        })
    }

    /// Which of `keys` (at most [`MAX_PAGE`]) the object index holds, read linearizably:
    /// an object not among them is not committed at any index up to the read's.
    pub async fn objects_committed(&self, keys: &[ObjectKey]) -> Result<(BTreeSet<ObjectKey>, u64), ClientError> {
        if keys.len() > MAX_PAGE as usize {
            return Err(ClientError::Invalid(format!("at most {MAX_PAGE} keys per call")));
        }
        let request = ObjectsCommittedRequest {
            keys: keys.iter().map(|k| k.0.clone()).collect(),
            linearizable: true,
        };
        let reply = self
            .each(|ch| {
                let request = request.clone();
                async move { metad_stub(ch).objects_committed(request).await }
            })
            .await?
            .into_inner();
        Ok((
            reply.committed.into_iter().map(ObjectKey).collect(),
            reply.applied_index,
        ))
    }

    /// Up to [`MAX_PAGE`] objects released after log index `after` and not yet
    /// forgotten, in release order, read linearizably; whether more follow.
    pub async fn released_objects(&self, after: u64) -> Result<(Vec<(u64, ObjectKey)>, bool), ClientError> {
        let request = ReleasedObjectsRequest {
            after_index: after,
            limit: MAX_PAGE,
        };
        let reply = self
            .each(|ch| async move { metad_stub(ch).released_objects(request).await })
            .await?
            .into_inner();
        let objects = reply
            .objects
            .into_iter()
            .map(|o| (o.index, ObjectKey(o.object_key)))
            .collect();
        Ok((objects, reply.more))
    }

    /// An admin query (`nodes`, `streams`, `log`, ...) answered by some replica.
    pub async fn admin(&self, what: &str, from_index: u64, limit: u64) -> Result<serde_json::Value, ClientError> {
        let reply = self
            .each(|ch| {
                let what = what.to_string();
                async move {
                    admin_stub(ch)
                        .query(AdminRequest {
                            what,
                            from_index,
                            limit,
                            name: String::new(),
                        })
                        .await
                }
            })
            .await?;
        json(reply.into_inner())
    }

    /// One stream's row by name (`null` when there is none), with the applied index.
    pub async fn admin_stream(&self, name: &str) -> Result<serde_json::Value, ClientError> {
        let reply = self
            .each(|ch| {
                let name = name.to_string();
                async move {
                    admin_stub(ch)
                        .query(AdminRequest {
                            what: "stream".into(),
                            from_index: 0,
                            limit: 0,
                            name,
                        })
                        .await
                }
            })
            .await?;
        json(reply.into_inner())
    }

    /// Drain node: the leader moves every stream of `request.node` (or, for a stopping
    /// node, of the requester) by planned transfer; the JSON report. Waits up to `wait`.
    pub async fn drain(&self, request: DrainRequest, wait: Duration) -> Result<serde_json::Value, ClientError> {
        let reply = self
            .each_within(wait, false, |ch| {
                let request = request.clone();
                async move { admin_stub(ch).drain(request).await }
            })
            .await?;
        json(reply.into_inner())
    }

    /// Moves one stream by planned transfer (or checks that it could); the JSON outcome.
    pub async fn transfer(&self, request: TransferRequest, wait: Duration) -> Result<serde_json::Value, ClientError> {
        let reply = self
            .each_within(wait, false, |ch| {
                let request = request.clone();
                async move { admin_stub(ch).transfer(request).await }
            })
            .await?;
        json(reply.into_inner())
    }
}
