//! The `object` WAL backend: each group commit is one object at the next sequential key
//! under `wal/<node>/<epoch>/`, written with put-if-absent. A takeover puts a fence
//! marker at the next free key, so the old writer's next conditional put fails and it
//! acknowledges nothing more. Survives the loss of the machine.
//!
//! Reclaim never deletes the newest object (the boundary, as SlateDB keeps its boundary
//! WAL): with every object deleted, a takeover would list nothing, fence key 1, and the
//! old writer's next put, far above it, would succeed and be acknowledged unreplayed.

use super::record::{decode_past_damage, decode_segment, segment_header, SegmentEnd};
use super::{Replay, SegmentId, WalDamage, WalError};
use bytes::{Bytes, BytesMut};
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::sync::Arc;
use weir_shared::ids::{Epoch, NodeId};

/// Marks a fence object; stable.
const FENCE_MAGIC: &[u8] = b"WEIRFENCE";

/// The key prefix of one incarnation's WAL.
pub fn incarnation_prefix(node: &NodeId, epoch: Epoch) -> ObjectPath {
    ObjectPath::from(format!("wal/{}/{:020}", node.as_str(), epoch.0))
}

fn key(prefix: &ObjectPath, seq: SegmentId) -> ObjectPath {
    prefix.clone().join(format!("{seq:020}"))
}

/// The writer side of an object WAL.
pub struct ObjectSink {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    next_seq: SegmentId,
}

impl ObjectSink {
    /// A WAL for a new incarnation, starting at sequence 1.
    pub fn create(store: Arc<dyn ObjectStore>, node: &NodeId, epoch: Epoch) -> Self {
        Self {
            store,
            prefix: incarnation_prefix(node, epoch),
            next_seq: 1,
        }
    }

    pub async fn persist(&mut self, group: Bytes) -> Result<(SegmentId, u64), WalError> {
        let mut body = BytesMut::with_capacity(group.len() + 8);
        body.extend_from_slice(&segment_header());
        body.extend_from_slice(&group);
        let seq = self.next_seq;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&key(&self.prefix, seq), PutPayload::from_bytes(body.freeze()), opts)
            .await
        {
            Ok(_) => {
                self.next_seq += 1;
                Ok((seq, group.len() as u64))
            }
            // Someone else wrote our next key: the fence marker of a takeover.
            Err(object_store::Error::AlreadyExists { .. }) => Err(WalError::Fenced),
            Err(e) => Err(WalError::Io(e.to_string())),
        }
    }

    /// The newest object written, which reclaim keeps.
    pub fn newest_segment(&self) -> Option<SegmentId> {
        self.next_seq.checked_sub(1).filter(|s| *s > 0)
    }

    pub async fn delete(&mut self, segment: SegmentId) -> Result<(), WalError> {
        match self.store.delete(&key(&self.prefix, segment)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(WalError::Io(e.to_string())),
        }
    }
}

/// Sorted sequence numbers of the objects under `prefix`.
async fn list_seqs(store: &dyn ObjectStore, prefix: &ObjectPath) -> Result<Vec<SegmentId>, WalError> {
    let metas: Vec<_> = store
        .list(Some(prefix))
        .try_collect()
        .await
        .map_err(|e| WalError::Io(e.to_string()))?;
    let mut seqs: Vec<SegmentId> = metas
        .iter()
        .filter_map(|m| m.location.filename()?.parse().ok())
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

/// Takes over the object WAL of `(node, epoch)` as `agent`: puts a fence marker at the
/// next free key (retrying past keys the writer wins), then replays every segment below
/// it. Idempotent: an existing fence marker is reused.
pub async fn take_over(
    store: Arc<dyn ObjectStore>,
    node: &NodeId,
    epoch: Epoch,
    agent: &str,
) -> Result<Replay, WalError> {
    let prefix = incarnation_prefix(node, epoch);
    let seqs = list_seqs(store.as_ref(), &prefix).await?;
    let mut fence = None;
    for seq in &seqs {
        let data = get(store.as_ref(), &key(&prefix, *seq)).await?;
        if data.starts_with(FENCE_MAGIC) {
            fence = Some(*seq);
            break;
        }
    }
    let fence = match fence {
        Some(f) => f,
        None => {
            let mut candidate = seqs.last().copied().unwrap_or(0) + 1;
            loop {
                let mut marker = FENCE_MAGIC.to_vec();
                marker.extend_from_slice(agent.as_bytes());
                let opts = PutOptions {
                    mode: PutMode::Create,
                    ..Default::default()
                };
                match store
                    .put_opts(&key(&prefix, candidate), PutPayload::from(marker), opts)
                    .await
                {
                    Ok(_) => break candidate,
                    // The writer got there first; fence the key after it.
                    Err(object_store::Error::AlreadyExists { .. }) => candidate += 1,
                    Err(e) => return Err(WalError::Io(e.to_string())),
                }
            }
        }
    };
    let mut replay = Replay::default();
    for seq in list_seqs(store.as_ref(), &prefix)
        .await?
        .into_iter()
        .filter(|s| *s < fence)
    {
        let data = get(store.as_ref(), &key(&prefix, seq)).await?;
        let (mut recs, end) = decode_segment(&data).map_err(|e| WalError::Corrupt(format!("WAL object {seq}: {e}")))?;
        replay.records.append(&mut recs);
        // Objects are written whole, so a bad record is damage, not a torn write.
        if let SegmentEnd::Invalid { at, reason } = end {
            let (mut after, damage) = decode_past_damage(&data, at, reason);
            for d in damage {
                let d = WalDamage {
                    place: format!("WAL object {}", key(&prefix, seq)),
                    damage: d,
                };
                tracing::error!(damage = %d, "damaged WAL object; the records after it are replayed");
                replay.damage.push(d);
            }
            replay.records.append(&mut after);
        }
    }
    Ok(replay)
}

async fn get(store: &dyn ObjectStore, path: &ObjectPath) -> Result<Bytes, WalError> {
    store
        .get(path)
        .await
        .map_err(|e| WalError::Io(e.to_string()))?
        .bytes()
        .await
        .map_err(|e| WalError::Io(e.to_string()))
}
