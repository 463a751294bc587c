//! The storage core's face for the coordinators above it (issue 63): what they may do
//! with the node, and nothing else. They append to and read their internal streams,
//! trim them, write a transaction's markers, learn which streams are served here and
//! at what epoch, read the metadata view, and run tasks the node waits for at teardown.
//! The node itself stays out of their reach (`scripts/check-layering.sh`).

use super::read::{Isolation, ReadResult};
use super::{Appended, MarkerWritten, Node, Tunables};
use crate::error::StreamdError;
use crate::partition::marker::Marker;
use std::sync::Arc;
use std::time::Duration;
use weir_meta::view::View;
use weir_shared::ids::{Incarnation, StreamEpoch, StreamId};
use weir_shared::task_kinds::KindTasks;

/// A handle on the node for the layers above the core.
#[derive(Clone)]
pub struct CoreApi(Arc<Node>);

impl CoreApi {
    pub fn new(node: Arc<Node>) -> Self {
        Self(node)
    }

    /// This incarnation.
    pub fn me(&self) -> &Incarnation {
        &self.0.me
    }

    /// The metadata view this node follows.
    pub fn view(&self) -> &View {
        &self.0.view
    }

    pub fn tunables(&self) -> &Tunables {
        &self.0.tunables
    }

    /// Work started for a stream (loads, markers, snapshots), waited for at teardown.
    pub fn tasks(&self) -> &KindTasks {
        &self.0.tasks
    }

    /// The epoch `stream` is served at here, or why it is not served.
    pub fn epoch(&self, stream: &str) -> Result<StreamEpoch, StreamdError> {
        Ok(self.0.stream(stream)?.epoch)
    }

    /// The epoch `stream` is served at here, when it is served and still taking writes.
    pub fn serving_epoch(&self, stream: &str) -> Option<StreamEpoch> {
        self.0.stream(stream).ok().filter(|h| h.is_serving()).map(|h| h.epoch)
    }

    /// Stream `id`'s name and epoch, when it is served here and still taking writes.
    pub fn serving(&self, id: StreamId) -> Option<(String, StreamEpoch)> {
        self.0
            .handle(id)
            .filter(|h| h.is_serving())
            .map(|h| (h.name.clone(), h.epoch))
    }

    /// `stream`'s durable end offset.
    pub fn durable_end(&self, stream: &str) -> Result<u64, StreamdError> {
        Ok(self.0.stream(stream)?.durable_end())
    }

    /// Appends `batches` to `stream`, once durable; a transactional batch of
    /// `transactional_id`'s producer is checked with its coordinator first.
    pub async fn append(
        &self,
        stream: &str,
        batches: &[u8],
        transactional_id: Option<&str>,
    ) -> Result<Appended, StreamdError> {
        let admitted = self.0.admit_append(stream, batches, None, transactional_id).await?;
        self.0.complete(admitted).await
    }

    /// Records of `stream` from `offset`, about `max_bytes` of them, uncommitted
    /// transactions included (a coordinator replays its own stream whole).
    pub async fn read(&self, stream: &str, offset: u64, max_bytes: usize) -> Result<ReadResult, StreamdError> {
        self.0
            .read(
                stream,
                offset,
                max_bytes,
                true,
                Duration::ZERO,
                Isolation::ReadUncommitted,
            )
            .await
    }

    /// Trims `stream` to start at `offset`; the start it has after.
    pub async fn trim(&self, stream: &str, offset: u64) -> Result<u64, StreamdError> {
        self.0.trim(stream, offset).await
    }

    /// Writes a transaction's marker into `stream`, which this node serves.
    pub async fn write_marker(&self, stream: &str, marker: &Marker) -> Result<MarkerWritten, StreamdError> {
        self.0.write_marker(stream, marker).await
    }
}
