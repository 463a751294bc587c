//! `AppendStream` (D-22): a caller's appends admitted in the order they arrive, their
//! durability awaited together, and the replies sent in the same order. Each append is
//! admitted (offsets assigned, WAL record queued) before the next message is read, so
//! a pipelined Kafka connection's batches to one partition are stored in send order.
//!
//! The admission in progress and the completions are polled side by side, never one
//! inside the other: an admission waits for its stream's lock, and a completion left
//! unpolled meanwhile must never be what that lock waits for (a "futurelock").

use crate::error::StreamdError;
use crate::node::{Appended, Node};
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, Stream, StreamExt};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tonic::{Status, Streaming};
use weir_proto::streamd::append_stream_reply::Result as Outcome;
use weir_proto::streamd::{AppendError, AppendReply, AppendStreamReply, AppendStreamRequest};

/// Appends admitted and not yet answered on one stream. Past it the next message is
/// not read, so a caller cannot queue unbounded work.
const MAX_PENDING: usize = 256;

/// The reply stream of one `AppendStream` call.
pub type Replies = Pin<Box<dyn Stream<Item = Result<AppendStreamReply, Status>> + Send>>;

struct State {
    node: Arc<Node>,
    /// `None` once the caller finished sending (or its stream broke).
    inbound: Option<Streaming<AppendStreamRequest>>,
    /// The append being admitted; the next message is read once it is.
    admitting: Option<BoxFuture<'static, BoxFuture<'static, AppendStreamReply>>>,
    pending: FuturesOrdered<BoxFuture<'static, AppendStreamReply>>,
}

/// Serves one `AppendStream` call. The replies end after the caller stops sending (or
/// the node stops taking work) and every admitted append is answered: an append the
/// caller sent that has no reply when the stream ends cleanly was never admitted.
pub fn serve(node: Arc<Node>, inbound: Streaming<AppendStreamRequest>) -> Replies {
    let state = State {
        node,
        inbound: Some(inbound),
        admitting: None,
        pending: FuturesOrdered::new(),
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        loop {
            let reading = st.inbound.is_some() && st.admitting.is_none() && st.pending.len() < MAX_PENDING;
            tokio::select! {
                // Answers first: they free room for more.
                biased;
                Some(reply) = st.pending.next(), if !st.pending.is_empty() => return Some((Ok(reply), st)),
                completion = admitted(&mut st.admitting), if st.admitting.is_some() => {
                    st.admitting = None;
                    st.pending.push_back(completion);
                }
                message = next_message(&mut st.inbound), if reading => match message {
                    Ok(Some(request)) => st.admitting = Some(Box::pin(admit(st.node.clone(), request))),
                    Ok(None) => st.inbound = None,
                    Err(status) => {
                        // The caller's side broke: what was admitted is still answered
                        // (and made durable); nothing more is read.
                        tracing::debug!(error = %status, "append stream from the caller ended");
                        st.inbound = None;
                    }
                },
                // A stopping or fenced node reads no more: the caller's lane ends once
                // what was admitted is answered, and it sends the rest elsewhere.
                _ = st.node.reads_end.cancelled(), if st.inbound.is_some() => st.inbound = None,
                _ = st.node.fenced.cancelled(), if st.inbound.is_some() => st.inbound = None,
                else => return None,
            }
        }
    }))
}

/// The next message (cancel safe: `Streaming` keeps a partial message).
async fn next_message(
    inbound: &mut Option<Streaming<AppendStreamRequest>>,
) -> Result<Option<AppendStreamRequest>, Status> {
    match inbound {
        Some(s) => s.message().await,
        None => std::future::pending().await,
    }
}

/// The admission in progress, once it is done (pending while there is none).
async fn admitted(
    admitting: &mut Option<BoxFuture<'static, BoxFuture<'static, AppendStreamReply>>>,
) -> BoxFuture<'static, AppendStreamReply> {
    match admitting {
        Some(a) => a.await,
        None => std::future::pending().await,
    }
}

/// Admits one append; the returned future waits for it to be durable.
async fn admit(node: Arc<Node>, request: AppendStreamRequest) -> BoxFuture<'static, AppendStreamReply> {
    let seq = request.seq;
    let started = Instant::now();
    let Some(append) = request.append else {
        let refused = Err(StreamdError::InvalidArgument(
            "an append stream message needs an append".into(),
        ));
        return Box::pin(std::future::ready(reply(seq, refused, 0, started)));
    };
    let bytes = append.batches.len();
    match node
        .admit_append(&append.stream, &append.batches, append.match_next_offset)
        .await
    {
        Ok(admitted) => Box::pin(async move { reply(seq, node.complete(admitted).await, bytes, started) }),
        Err(e) => Box::pin(std::future::ready(reply(seq, Err(e), bytes, started))),
    }
}

fn reply(seq: u64, result: Result<Appended, StreamdError>, bytes: usize, started: Instant) -> AppendStreamReply {
    crate::metrics::observe_append(&result, bytes, started);
    let outcome = match result {
        Ok(a) => Outcome::Ok(AppendReply {
            base_offset: a.base_offset,
            end_offset: a.end_offset,
            stream_epoch: a.stream_epoch,
            batch_base_offsets: a.batch_base_offsets,
        }),
        Err(e) => Outcome::Error(AppendError {
            code: e.code().as_str().to_string(),
            grpc_code: e.code().grpc_code() as i32,
            message: e.to_string(),
        }),
    };
    AppendStreamReply {
        seq,
        result: Some(outcome),
    }
}
