//! The aborted transactions a `read_committed` read is told about (issue 23): those
//! with data in what it returns. Their markers can lie far past the read, so they are
//! found in the committed ranges' summaries from the read's start on, up to the first
//! range at or past the read's end after which no transaction begun inside the read
//! can still be open, and then
//! in the stream's memory for markers not yet uploaded.

use super::Node;
use crate::error::StreamdError;
use crate::stream::StreamHandle;
use weir_meta::model::AbortedTxn;
use weir_shared::ids::StreamId;

impl Node {
    /// Aborted transactions with data in `[from, to)` of `handle`'s stream.
    pub(super) async fn aborted_in(
        &self,
        handle: &StreamHandle,
        from: u64,
        to: u64,
    ) -> Result<Vec<AbortedTxn>, StreamdError> {
        if from >= to {
            return Ok(Vec::new());
        }
        // Taken together: an upload committing meanwhile moves markers from memory into
        // a range past `committed`, which the walk below does not reach.
        let (committed, unuploaded) = {
            let inner = handle.inner.lock().await;
            (inner.committed_end, inner.txns.aborted_overlapping(from, to))
        };
        let (mut out, complete) = self.aborted_committed(handle.id, committed, from, to).await?;
        if !complete {
            out.extend(unuploaded);
        }
        Ok(out)
    }

    /// Aborted transactions with data in `[from, to)` of `stream` found in the
    /// summaries of its committed ranges below `committed`, and whether those are all:
    /// false when a transaction with data in the read may end past `committed`.
    pub(super) async fn aborted_committed(
        &self,
        stream: StreamId,
        committed: u64,
        from: u64,
        to: u64,
    ) -> Result<(Vec<AbortedTxn>, bool), StreamdError> {
        let mut out = Vec::new();
        let mut at = from;
        while at < committed {
            let range = self.range_at(stream, at).await?;
            out.extend(
                range
                    .txns
                    .aborted
                    .iter()
                    .filter(|a| a.first_offset < to && a.last_offset >= from),
            );
            at = range.end.0;
            // Past the read, with nothing begun below `to` open: every later marker
            // ends a transaction that has no data in the read.
            if at >= to && range.txns.lso_at_end.is_none_or(|l| l >= to) {
                return Ok((out, true));
            }
        }
        Ok((out, false))
    }
}
