//! `AppendStream` (D-22): a caller's appends admitted in the order they arrive, their
//! durability awaited together, and the replies sent in the same order. Each append is
//! admitted (offsets assigned, WAL record queued) before the next message is read, so
//! a pipelined Kafka connection's batches to one partition are stored in send order.
//!
//! The admission in progress and the completions are polled side by side, never one
//! inside the other: an admission waits for its stream's lock, and a completion left
//! unpolled meanwhile must never be what that lock waits for (a "futurelock"). For the
//! same reason the call is driven by a task of its own, not by the reply stream: hyper
//! polls a reply stream only while HTTP/2 lets it send, and an admission holding the
//! stream's lock must not wait on the caller's flow control.

use crate::error::StreamdError;
use crate::node::{Appended, Node};
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, Stream, StreamExt};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use weir_proto::streamd::append_stream_reply::Result as Outcome;
use weir_proto::streamd::{AppendError, AppendReply, AppendStreamReply, AppendStreamRequest};
use weir_shared::error_code::ErrorCode;

/// Appends admitted and not yet taken by the caller (answered or not). Past it the next
/// message is not read, so a caller cannot queue unbounded work.
const MAX_PENDING: usize = 1024;

/// The reply stream of one `AppendStream` call.
pub type Replies = Pin<Box<dyn Stream<Item = Result<AppendStreamReply, Status>> + Send>>;

/// An admitted append's reply to come, and whether reading must stop after it.
type Admission = (BoxFuture<'static, AppendStreamReply>, bool);

/// Serves one `AppendStream` call. The replies end after the caller stops sending (or
/// the node stops taking work, or an append is refused in a way the caller retries) and
/// every admitted append is answered: an append the caller sent that has no reply when
/// the stream ends cleanly was never admitted.
pub fn serve(node: Arc<Node>, inbound: Streaming<AppendStreamRequest>) -> Replies {
    let (replies, rx) = mpsc::channel(MAX_PENDING);
    let calls = node.calls.clone();
    calls.spawn(drive(node, inbound, replies));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok))
}

/// Reads, admits and answers the call's appends until it ends or the caller goes away.
async fn drive(node: Arc<Node>, inbound: Streaming<AppendStreamRequest>, replies: mpsc::Sender<AppendStreamReply>) {
    let mut inbound = Some(inbound);
    let mut admitting: Option<BoxFuture<'static, Admission>> = None;
    let mut pending: FuturesOrdered<BoxFuture<'static, AppendStreamReply>> = FuturesOrdered::new();
    loop {
        if inbound.is_none() && admitting.is_none() && pending.is_empty() {
            return;
        }
        // Replies the caller has not taken yet count too: the channel always has room
        // for every pending one, and a caller that stops reading stops admissions.
        let outstanding = pending.len() + (MAX_PENDING - replies.capacity());
        let idle = inbound.is_some() && admitting.is_none();
        tokio::select! {
            // Answers first: they free room for more.
            biased;
            Some(reply) = pending.next(), if !pending.is_empty() => {
                if replies.try_send(reply).is_err() {
                    return;
                }
            }
            done = admitted(&mut admitting), if admitting.is_some() => {
                admitting = None;
                let (completion, stop_reading) = done;
                pending.push_back(completion);
                if stop_reading {
                    inbound = None;
                }
            }
            message = next_message(&mut inbound), if idle && outstanding < MAX_PENDING => match message {
                Ok(Some(request)) => admitting = Some(Box::pin(admit(node.clone(), request))),
                Ok(None) => inbound = None,
                Err(status) => {
                    // The caller's side broke: what was admitted is still answered
                    // (and made durable); nothing more is read.
                    tracing::debug!(error = %status, "append stream from the caller ended");
                    inbound = None;
                }
            },
            // Full: woken once the caller takes a reply.
            _ = replies.reserve(), if idle && outstanding >= MAX_PENDING => {}
            // A stopping or fenced node reads no more: the caller's lane ends once
            // what was admitted is answered, and it sends the rest elsewhere.
            _ = node.reads_end.cancelled(), if inbound.is_some() => inbound = None,
            _ = node.fenced.cancelled(), if inbound.is_some() => inbound = None,
            _ = replies.closed() => return,
        }
    }
}

/// The admission in progress, once it is done (pending while there is none).
async fn admitted(admitting: &mut Option<BoxFuture<'static, Admission>>) -> Admission {
    match admitting {
        Some(a) => a.await,
        None => std::future::pending().await,
    }
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

/// Admits one append; the returned future waits for it to be durable. Reading stops
/// after a refusal the caller retries (`not_owner`, `unavailable`): what it sent after
/// this append must not be admitted ahead of this append's retry.
async fn admit(node: Arc<Node>, request: AppendStreamRequest) -> Admission {
    let seq = request.seq;
    let started = Instant::now();
    let Some(append) = request.append else {
        let refused = Err(StreamdError::InvalidArgument(
            "an append stream message needs an append".into(),
        ));
        return (Box::pin(std::future::ready(reply(seq, refused, 0, started))), false);
    };
    let bytes = append.batches.len();
    match node
        .admit_client_append(
            &append.stream,
            &append.batches,
            append.match_next_offset,
            append.transactional_id.as_deref(),
        )
        .await
    {
        Ok(admitted) => (
            Box::pin(async move { reply(seq, node.complete(admitted).await, bytes, started) }),
            false,
        ),
        Err(e) => {
            let retried = matches!(e.code(), ErrorCode::NotOwner | ErrorCode::Unavailable);
            (
                Box::pin(std::future::ready(reply(seq, Err(e), bytes, started))),
                retried,
            )
        }
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
            draining: matches!(e, StreamdError::Draining),
        }),
    };
    AppendStreamReply {
        seq,
        result: Some(outcome),
    }
}
