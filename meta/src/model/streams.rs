//! The view's streams, with the indexes the background loops look them up by: by name,
//! by owner incarnation and state, and the streams carrying a transfer mark or marked
//! damaged. Every write goes through [`Streams::insert`], [`Streams::remove`] or
//! [`Streams::update`], which keep the indexes current, so placement, failover
//! planning, drains and reconciliation visit the streams they act on, never every
//! stream (D-23).
//!
//! Reads count the rows they hand out ([`Streams::visits`]): the tests of those loops
//! assert that a change to one stream among many visits a constant number of rows.

use super::rows::{StreamRow, StreamState};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use weir_shared::ids::{Incarnation, NodeId, StreamId};

/// One owner's streams by state. The owner is an incarnation, so a node's dead
/// incarnations keep their own sets until their streams move.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owned {
    pub open: BTreeSet<StreamId>,
    pub closed: BTreeSet<StreamId>,
    pub deleted: BTreeSet<StreamId>,
}

impl Owned {
    fn set(&mut self, state: StreamState) -> &mut BTreeSet<StreamId> {
        match state {
            StreamState::Open => &mut self.open,
            StreamState::Closed => &mut self.closed,
            StreamState::Deleted => &mut self.deleted,
        }
    }

    fn is_empty(&self) -> bool {
        self.open.is_empty() && self.closed.is_empty() && self.deleted.is_empty()
    }

    /// Streams it holds that are not deleted: its load.
    pub fn load(&self) -> usize {
        self.open.len() + self.closed.len()
    }
}

/// What a row is indexed under; compared before and after a write.
#[derive(Clone, PartialEq, Eq)]
struct Keys {
    name: Option<String>,
    owner: Option<Incarnation>,
    state: StreamState,
    marked: bool,
    damaged: bool,
}

impl Keys {
    fn of(row: &StreamRow) -> Self {
        Self {
            // Deleted streams leave the name index, so the name can be reused at once.
            name: (row.state != StreamState::Deleted).then(|| row.name.clone()),
            owner: row.owner.clone(),
            state: row.state,
            marked: row.transfer_target.is_some(),
            damaged: row.damage.is_some(),
        }
    }
}

/// The streams of the view and their indexes.
#[derive(Debug, Default)]
pub struct Streams {
    /// Boxed: a map's nodes hold many entries, half empty after ascending inserts (new
    /// streams' ids ascend), and a row is some 300 bytes; a box wastes far less.
    rows: BTreeMap<StreamId, Box<StreamRow>>,
    /// Streams that are not deleted, by name.
    names: BTreeMap<String, StreamId>,
    /// Every stream by its owner (`None`: placed nowhere) and state.
    owners: BTreeMap<Option<Incarnation>, Owned>,
    /// Streams with a planned transfer's mark.
    marked: BTreeSet<StreamId>,
    /// Streams marked damaged.
    damaged: BTreeSet<StreamId>,
    /// Rows handed out by reads, for the tests of the loops that must not visit every
    /// stream. A relaxed counter: a few nanoseconds per row read.
    visits: AtomicU64,
}

impl Clone for Streams {
    fn clone(&self) -> Self {
        Self {
            rows: self.rows.clone(),
            names: self.names.clone(),
            owners: self.owners.clone(),
            marked: self.marked.clone(),
            damaged: self.damaged.clone(),
            visits: AtomicU64::new(0),
        }
    }
}

impl PartialEq for Streams {
    /// The rows decide; the indexes follow from them.
    fn eq(&self, other: &Self) -> bool {
        self.rows == other.rows
    }
}

impl Eq for Streams {}

impl Streams {
    fn visit<T>(&self, item: T) -> T {
        self.visits.fetch_add(1, Ordering::Relaxed);
        item
    }

    /// How many rows reads have handed out so far.
    pub fn visits(&self) -> u64 {
        self.visits.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn contains_key(&self, id: &StreamId) -> bool {
        self.rows.contains_key(id)
    }

    pub fn get(&self, id: &StreamId) -> Option<&StreamRow> {
        self.rows.get(id).map(|r| self.visit(&**r))
    }

    /// Every row in id order: a full scan, which no background loop makes.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&StreamId, &StreamRow)> {
        self.rows.iter().map(|(id, row)| self.visit((id, &**row)))
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &StreamRow> {
        self.iter().map(|(_, r)| r)
    }

    /// Every stream id in order (ids only: no rows are visited).
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &StreamId> {
        self.rows.keys()
    }

    /// The rows with ids in `range`, in order.
    pub fn range<R: std::ops::RangeBounds<StreamId>>(
        &self,
        range: R,
    ) -> impl DoubleEndedIterator<Item = (&StreamId, &StreamRow)> {
        self.rows.range(range).map(|(id, row)| self.visit((id, &**row)))
    }

    /// Writes a row; the row it replaced, if any.
    pub fn insert(&mut self, mut row: StreamRow) -> Option<StreamRow> {
        // Decoded rows come with spare capacity; every view holds every row.
        row.leader_epochs.shrink_to_fit();
        let id = row.id;
        let keys = Keys::of(&row);
        let old = self.rows.insert(id, Box::new(row));
        if let Some(old) = &old {
            self.unindex(id, &Keys::of(old));
        }
        self.index(id, keys);
        old.map(|r| *r)
    }

    /// Removes a row; the row removed, if any.
    pub fn remove(&mut self, id: &StreamId) -> Option<StreamRow> {
        let old = self.rows.remove(id)?;
        self.unindex(*id, &Keys::of(&old));
        Some(*old)
    }

    /// Changes a row in place and re-indexes it; `None` when there is no such row.
    pub fn update<R>(&mut self, id: &StreamId, f: impl FnOnce(&mut StreamRow) -> R) -> Option<R> {
        let row = self.rows.get_mut(id)?;
        let before = Keys::of(row);
        let result = f(row);
        debug_assert_eq!(row.id, *id, "a stream's id never changes");
        let after = Keys::of(row);
        if before != after {
            self.unindex(*id, &before);
            self.index(*id, after);
        }
        Some(result)
    }

    fn index(&mut self, id: StreamId, keys: Keys) {
        if let Some(name) = keys.name {
            self.names.insert(name, id);
        }
        self.owners.entry(keys.owner).or_default().set(keys.state).insert(id);
        if keys.marked {
            self.marked.insert(id);
        }
        if keys.damaged {
            self.damaged.insert(id);
        }
    }

    fn unindex(&mut self, id: StreamId, keys: &Keys) {
        if let Some(name) = &keys.name {
            // Another stream may hold the name by now (a row written out of order).
            if self.names.get(name) == Some(&id) {
                self.names.remove(name);
            }
        }
        if let Some(owned) = self.owners.get_mut(&keys.owner) {
            owned.set(keys.state).remove(&id);
            if owned.is_empty() {
                self.owners.remove(&keys.owner);
            }
        }
        if keys.marked {
            self.marked.remove(&id);
        }
        if keys.damaged {
            self.damaged.remove(&id);
        }
    }

    /// The stream named `name` that is not deleted.
    pub fn by_name(&self, name: &str) -> Option<&StreamRow> {
        self.names.get(name).and_then(|id| self.get(id))
    }

    /// Streams that are not deleted, by name (listings page through it).
    pub fn names(&self) -> &BTreeMap<String, StreamId> {
        &self.names
    }

    /// The streams of one owner incarnation.
    pub fn owned(&self, owner: &Incarnation) -> Option<&Owned> {
        self.owners.get(&Some(owner.clone()))
    }

    /// Every owner with its streams; `None` holds the streams placed nowhere. There are
    /// as many owners as incarnations that still hold a stream, not as many as streams.
    pub fn owners(&self) -> impl Iterator<Item = (Option<&Incarnation>, &Owned)> {
        self.owners.iter().map(|(o, s)| (o.as_ref(), s))
    }

    /// Streams that are not deleted per owning node, whatever its incarnation.
    pub fn load_by_node(&self) -> BTreeMap<NodeId, usize> {
        let mut load = BTreeMap::new();
        for (owner, owned) in self.owners() {
            if let Some(owner) = owner {
                *load.entry(owner.node.clone()).or_insert(0) += owned.load();
            }
        }
        load.retain(|_, n| *n > 0);
        load
    }

    /// Streams carrying a planned transfer's mark.
    pub fn marked(&self) -> &BTreeSet<StreamId> {
        &self.marked
    }

    /// Streams marked damaged.
    pub fn damaged(&self) -> &BTreeSet<StreamId> {
        &self.damaged
    }

    /// Whether the indexes say exactly what the rows do; the property tests' check.
    pub fn indexes_match_rows(&self) -> Result<(), String> {
        let mut rebuilt = Streams::default();
        for row in self.rows.values() {
            rebuilt.insert((**row).clone());
        }
        let same = |what: &str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(format!("{what} index differs from the rows"))
            }
        };
        same("name", rebuilt.names == self.names)?;
        same("owner", rebuilt.owners == self.owners)?;
        same("transfer mark", rebuilt.marked == self.marked)?;
        same("damage", rebuilt.damaged == self.damaged)
    }
}

impl FromIterator<StreamRow> for Streams {
    fn from_iter<I: IntoIterator<Item = StreamRow>>(rows: I) -> Self {
        let mut streams = Streams::default();
        for row in rows {
            streams.insert(row);
        }
        streams
    }
}

impl std::ops::Index<&StreamId> for Streams {
    type Output = StreamRow;

    /// The row of `id`; panics when there is none, as a map's index does.
    fn index(&self, id: &StreamId) -> &StreamRow {
        self.get(id).expect("no such stream")
    }
}

/// Stored as the map of rows, as before the indexes existed; they are rebuilt on load.
impl Serialize for Streams {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.rows.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Streams {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let rows = BTreeMap::<StreamId, StreamRow>::deserialize(d)?;
        Ok(rows.into_values().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::StreamConfig;
    use weir_shared::ids::{Epoch, StreamEpoch};

    fn row(id: u64, name: &str) -> StreamRow {
        StreamRow::new(StreamId(id), name.into(), None, &StreamConfig::default())
    }

    fn inc(node: &str, epoch: u64) -> Incarnation {
        Incarnation {
            node: NodeId::new(node),
            epoch: Epoch(epoch),
        }
    }

    /// Each write moves a stream between the sets it belongs to, and nothing else.
    #[test]
    fn writes_keep_the_indexes_of_a_stream_current() {
        let mut streams: Streams = (0..5).map(|i| row(i, &format!("s{i}"))).collect();
        assert_eq!(streams.owners().count(), 1, "all placed nowhere");
        let a1 = inc("a", 1);
        streams.update(&StreamId(2), |r| r.owner = Some(a1.clone()));
        streams.update(&StreamId(2), |r| {
            r.state = StreamState::Open;
            r.epoch = StreamEpoch(1);
            r.transfer_target = Some(NodeId::new("b"));
        });
        let owned = streams.owned(&a1).expect("a1 owns one");
        assert_eq!(owned.open.iter().copied().collect::<Vec<_>>(), [StreamId(2)]);
        assert!(owned.closed.is_empty());
        assert_eq!(streams.marked().iter().copied().collect::<Vec<_>>(), [StreamId(2)]);
        assert_eq!(streams.load_by_node(), BTreeMap::from([(NodeId::new("a"), 1)]));
        streams.update(&StreamId(2), |r| {
            r.state = StreamState::Deleted;
            r.transfer_target = None;
        });
        assert!(
            streams.by_name("s2").is_none(),
            "a deleted stream leaves the name index"
        );
        assert!(streams.marked().is_empty());
        assert_eq!(streams.owned(&a1).expect("still a1's").deleted.len(), 1);
        assert!(streams.load_by_node().is_empty(), "deleted streams are no load");
        streams.remove(&StreamId(2));
        assert!(
            streams.owned(&a1).is_none(),
            "an owner without streams leaves the index"
        );
        // A row replaced whole is re-indexed from what it replaced.
        let mut moved = row(3, "renamed");
        moved.owner = Some(inc("b", 4));
        streams.insert(moved);
        assert!(streams.by_name("s3").is_none() && streams.by_name("renamed").is_some());
        assert_eq!(streams.owned(&inc("b", 4)).expect("b4").closed.len(), 1);
        streams.indexes_match_rows().expect("consistent");
    }

    /// Stored as before the indexes: a map of rows, and the indexes rebuilt on load.
    #[test]
    fn streams_are_stored_as_their_rows_and_indexed_on_load() {
        let mut streams: Streams = (0..3).map(|i| row(i, &format!("s{i}"))).collect();
        streams.update(&StreamId(1), |r| r.owner = Some(inc("a", 1)));
        let json = serde_json::to_value(&streams).expect("encode");
        assert!(json.as_object().is_some_and(|m| m.contains_key("1")), "{json}");
        let back: Streams = serde_json::from_value(json).expect("decode");
        assert_eq!(back, streams);
        back.indexes_match_rows().expect("consistent");
        assert_eq!(back.owned(&inc("a", 1)).expect("a1").closed.len(), 1);
    }
}
