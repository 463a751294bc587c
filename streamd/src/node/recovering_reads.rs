//! Reads of a stream whose owner failed, while this incarnation takes its WAL over
//! (issue 60). Until the takeover commits the records only the dead owner's WAL holds,
//! no node serves the stream; yet everything below its committed end is in data
//! objects, immutable and indexed. The takeover's agent serves that much, read-only: a
//! takeover whose upload cannot complete (a full object volume, a store refusing
//! writes) leaves the stream readable up to its last committed offset, and the rest
//! follows once the upload succeeds and the stream is placed again.
//!
//! Nothing here can return a record the log has not committed, so it needs no fence:
//! the committed end only grows, and the reply's end is the one the read began with.

use super::read::{last_end, Budget, CommittedStream, Gathered, Isolation, ReadResult};
use super::Node;
use crate::error::StreamdError;
use std::time::Duration;
use weir_meta::model::{StreamState, TakeoverState};
use weir_shared::ids::StreamId;

/// A stream this incarnation may read while it recovers the stream's failed owner.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Recovering {
    pub id: StreamId,
    pub start: u64,
    pub committed_end: u64,
}

impl Node {
    /// The stream `name`, if its owner is dead and this live incarnation is the agent
    /// of that owner's pending takeover.
    pub(super) fn recovering(&self, name: &str) -> Option<Recovering> {
        if self.fenced.is_cancelled() || !self.is_admitted() {
            return None;
        }
        self.view.with(|s| {
            let me_live = s
                .nodes
                .get(&self.me.node)
                .is_some_and(|n| n.epoch == self.me.epoch && !n.fenced);
            let row = s.stream_by_name(name)?;
            let owner = row.owner.as_ref()?;
            let takeover = s.takeovers.get(&(owner.node.clone(), owner.epoch))?;
            let mine = takeover.state == TakeoverState::Pending && takeover.agent.as_ref() == Some(&self.me);
            (me_live && mine && row.state == StreamState::Open).then_some(Recovering {
                id: row.id,
                start: row.start_offset.0,
                committed_end: row.committed_end.0,
            })
        })
    }

    /// Reads committed batches of `stream` from `offset`, as [`Node::read`] does for a
    /// stream served here, up to its committed end (in `read_committed`, the last
    /// stable offset there). At the committed end it waits up to `wait` for the
    /// takeover to settle and answers nothing; past it, the records are not known yet
    /// and the read is refused retryably.
    pub(super) async fn read_recovering(
        &self,
        name: &str,
        stream: Recovering,
        offset: u64,
        budget: Budget,
        wait: Duration,
        isolation: Isolation,
    ) -> Result<ReadResult, StreamdError> {
        let Recovering {
            id,
            start,
            committed_end: end,
        } = stream;
        if offset < start {
            return Err(StreamdError::OffsetOutOfRange { offset, start, end });
        }
        if offset > end {
            return Err(StreamdError::Unavailable(format!(
                "stream '{name}' is being recovered from its failed owner's write-ahead log; offsets from {end} on are readable once that completes"
            )));
        }
        // The transactions open at the committed end are in its last range's summary.
        let lso = match end {
            0 => 0,
            _ => self.range_at(id, end - 1).await?.txns.lso_at_end.unwrap_or(end),
        };
        let limit = match isolation {
            Isolation::ReadUncommitted => end,
            Isolation::ReadCommitted => lso,
        };
        let mut result = ReadResult {
            batches: Default::default(),
            next_offset: offset,
            start_offset: start,
            end_offset: end,
            last_stable_offset: lso,
            aborted: Vec::new(),
        };
        if offset < limit {
            let committed = CommittedStream {
                id,
                name,
                end,
                handle: None,
            };
            let mut out = Gathered::default();
            self.read_committed(&committed, offset, limit, budget, &mut out).await?;
            result.batches = out.into_bytes();
            result.next_offset = last_end(&result.batches).unwrap_or(offset);
            if isolation == Isolation::ReadCommitted {
                result.aborted = self.aborted_committed(id, end, offset, result.next_offset).await?.0;
            }
            return Ok(result);
        }
        // At the end of what is readable: a long poll waits for the takeover to settle
        // (the stream then has an owner again, which the reader's next read reaches).
        let deadline = tokio::time::Instant::now() + wait;
        let mut applied = self.view.subscribe();
        while self.recovering(name).as_ref() == Some(&stream) {
            tokio::select! {
                changed = applied.changed() => if changed.is_err() { break },
                _ = tokio::time::sleep_until(deadline) => break,
                _ = self.fenced.cancelled() => break,
                _ = self.reads_end.cancelled() => {
                    return Err(StreamdError::Unavailable("the node is shutting down; read again".into()))
                }
            }
        }
        Ok(result)
    }
}
