//! The metadata state every node watches (the view), addressed row by row so that apply
//! can report exactly what changed (the watch deltas) and storage can persist only that.
//! It holds no per-object rows: those are in the object index (`index`, design 0002),
//! so its size follows the number of streams, never time or bytes written (D-19).

use super::acls::{AclBinding, Acls};
use super::quotas::{QuotaEntity, QuotaRow};
use super::rows::*;
use super::streams::Streams;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use weir_shared::ids::{Epoch, Incarnation, NodeId, StreamId};

/// The replicated state machine's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Applied log index this state reflects.
    pub applied_index: u64,
    pub settings: Option<ClusterSettings>,
    pub counters: Counters,
    pub nodes: BTreeMap<NodeId, NodeRow>,
    /// The streams, indexed by name, owner and transfer mark (`streams`).
    pub streams: Streams,
    pub topics: BTreeMap<String, TopicRow>,
    pub leases: BTreeMap<String, LeaseRow>,
    /// Stored as a list of rows: JSON map keys must be strings, and the key is in the row.
    #[serde(with = "takeover_list")]
    pub takeovers: BTreeMap<(NodeId, Epoch), TakeoverRow>,
    pub tokens: BTreeMap<String, TokenRow>,
    /// The cluster's ACLs (issue 59).
    #[serde(default)]
    pub acls: Acls,
    /// Client quotas by entity (issue 59), stored as a list of rows.
    #[serde(default, with = "quota_list")]
    pub quotas: BTreeMap<QuotaEntity, QuotaRow>,
}

/// Addresses one row. The variant order is stable storage (`codec::row_key_bytes`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowKey {
    Settings,
    Counters,
    Node(NodeId),
    Stream(StreamId),
    Topic(String),
    Lease(String),
    Takeover(NodeId, Epoch),
    Token(String),
    /// An ACL is its own key: a binding is there or not.
    Acl(AclBinding),
    Quota(QuotaEntity),
}

/// One row's value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Row {
    Settings(ClusterSettings),
    Counters(Counters),
    Node(NodeRow),
    Stream(StreamRow),
    Topic(TopicRow),
    Lease(LeaseRow),
    Takeover(TakeoverRow),
    Token(TokenRow),
    Acl(AclBinding),
    Quota(QuotaRow),
}

impl Row {
    pub fn key(&self) -> RowKey {
        match self {
            Row::Settings(_) => RowKey::Settings,
            Row::Counters(_) => RowKey::Counters,
            Row::Node(r) => RowKey::Node(r.id.clone()),
            Row::Stream(r) => RowKey::Stream(r.id),
            Row::Topic(r) => RowKey::Topic(r.name.clone()),
            Row::Lease(r) => RowKey::Lease(r.name.clone()),
            Row::Takeover(r) => RowKey::Takeover(r.dead.node.clone(), r.dead.epoch),
            Row::Token(r) => RowKey::Token(r.name.clone()),
            Row::Acl(b) => RowKey::Acl(b.clone()),
            Row::Quota(q) => RowKey::Quota(q.entity.clone()),
        }
    }
}

/// A row written (`Some`) or removed (`None`) by one applied entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub key: RowKey,
    pub row: Option<Row>,
}

/// What one applied log entry changed; watchers apply these in index order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    pub index: u64,
    pub changes: Vec<Change>,
}

impl State {
    /// The token whose secret is `secret` (a bearer token, or `weir --token`).
    pub fn token_by_secret(&self, secret: &str) -> Option<&TokenRow> {
        let digest = secret_sha256(secret);
        self.tokens.values().find(|t| t.secret_sha256 == digest)
    }

    /// The current value of a row.
    pub fn row(&self, key: &RowKey) -> Option<Row> {
        match key {
            RowKey::Settings => self.settings.map(Row::Settings),
            RowKey::Counters => Some(Row::Counters(self.counters.clone())),
            RowKey::Node(id) => self.nodes.get(id).cloned().map(Row::Node),
            RowKey::Stream(id) => self.streams.get(id).cloned().map(Row::Stream),
            RowKey::Topic(n) => self.topics.get(n).cloned().map(Row::Topic),
            RowKey::Lease(n) => self.leases.get(n).cloned().map(Row::Lease),
            RowKey::Takeover(n, e) => self.takeovers.get(&(n.clone(), *e)).cloned().map(Row::Takeover),
            RowKey::Token(n) => self.tokens.get(n).cloned().map(Row::Token),
            RowKey::Acl(b) => self.acls.contains(b).then(|| Row::Acl(b.clone())),
            RowKey::Quota(e) => self.quotas.get(e).cloned().map(Row::Quota),
        }
    }

    /// Every row, in key order (snapshots, storage rebuilds).
    pub fn rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        rows.extend(self.settings.map(Row::Settings));
        rows.push(Row::Counters(self.counters.clone()));
        rows.extend(self.nodes.values().cloned().map(Row::Node));
        rows.extend(self.streams.values().cloned().map(Row::Stream));
        rows.extend(self.topics.values().cloned().map(Row::Topic));
        rows.extend(self.leases.values().cloned().map(Row::Lease));
        rows.extend(self.takeovers.values().cloned().map(Row::Takeover));
        rows.extend(self.tokens.values().cloned().map(Row::Token));
        rows.extend(self.acls.iter().cloned().map(Row::Acl));
        rows.extend(self.quotas.values().cloned().map(Row::Quota));
        rows
    }

    /// Writes or removes one row; how replicas rebuild from storage and watchers follow deltas.
    pub fn set_row(&mut self, key: &RowKey, row: Option<Row>) {
        match (key, row) {
            (RowKey::Settings, Some(Row::Settings(s))) => self.settings = Some(s),
            (RowKey::Settings, None) => self.settings = None,
            (RowKey::Counters, Some(Row::Counters(c))) => self.counters = c,
            (RowKey::Counters, None) => self.counters = Counters::default(),
            (RowKey::Node(_), Some(Row::Node(r))) => {
                self.nodes.insert(r.id.clone(), r);
            }
            (RowKey::Node(id), None) => {
                self.nodes.remove(id);
            }
            (RowKey::Stream(_), Some(Row::Stream(r))) => {
                self.streams.insert(r);
            }
            (RowKey::Stream(id), None) => {
                self.streams.remove(id);
            }
            (RowKey::Topic(_), Some(Row::Topic(r))) => {
                self.topics.insert(r.name.clone(), r);
            }
            (RowKey::Topic(n), None) => {
                self.topics.remove(n);
            }
            (RowKey::Lease(_), Some(Row::Lease(r))) => {
                self.leases.insert(r.name.clone(), r);
            }
            (RowKey::Lease(n), None) => {
                self.leases.remove(n);
            }
            (RowKey::Takeover(..), Some(Row::Takeover(r))) => {
                self.takeovers.insert((r.dead.node.clone(), r.dead.epoch), r);
            }
            (RowKey::Takeover(n, e), None) => {
                self.takeovers.remove(&(n.clone(), *e));
            }
            (RowKey::Token(_), Some(Row::Token(r))) => {
                self.tokens.insert(r.name.clone(), r);
            }
            (RowKey::Token(n), None) => {
                self.tokens.remove(n);
            }
            (RowKey::Acl(_), Some(Row::Acl(b))) => {
                self.acls.insert(b);
            }
            (RowKey::Acl(b), None) => {
                self.acls.remove(b);
            }
            (RowKey::Quota(_), Some(Row::Quota(q))) => {
                self.quotas.insert(q.entity.clone(), q);
            }
            (RowKey::Quota(e), None) => {
                self.quotas.remove(e);
            }
            (key, Some(row)) => {
                // A row under a key of another kind is a bug in the writer, not data to keep.
                tracing::error!(?key, row_key = ?row.key(), "row does not match its key; ignored");
            }
        }
    }

    /// Applies a delta received from a watch.
    pub fn apply_delta(&mut self, delta: &Delta) {
        for change in &delta.changes {
            self.set_row(&change.key, change.row.clone());
        }
        self.applied_index = delta.index;
    }

    pub fn stream_by_name(&self, name: &str) -> Option<&StreamRow> {
        self.streams.by_name(name)
    }

    /// Whether `who` is the live current incarnation of its node.
    pub fn is_live(&self, who: &Incarnation) -> bool {
        self.nodes
            .get(&who.node)
            .is_some_and(|r| r.epoch == who.epoch && r.is_live())
    }
}

/// (De)serializes the takeover map as the list of its rows.
mod takeover_list {
    use super::TakeoverRow;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;
    use weir_shared::ids::{Epoch, NodeId};

    type Map = BTreeMap<(NodeId, Epoch), TakeoverRow>;

    pub fn serialize<S: Serializer>(map: &Map, s: S) -> Result<S::Ok, S::Error> {
        map.values().collect::<Vec<_>>().serialize(s)
    }

    /// Also reads the empty map that states without takeovers were once written with.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stored {
        List(Vec<TakeoverRow>),
        Empty(BTreeMap<String, serde::de::IgnoredAny>),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Map, D::Error> {
        Ok(match Stored::deserialize(d)? {
            Stored::List(rows) => rows
                .into_iter()
                .map(|r| ((r.dead.node.clone(), r.dead.epoch), r))
                .collect(),
            Stored::Empty(m) if m.is_empty() => Map::new(),
            Stored::Empty(_) => return Err(serde::de::Error::custom("takeovers must be a list of rows")),
        })
    }
}

/// (De)serializes the quota map as the list of its rows (an entity is no JSON map key).
mod quota_list {
    use super::{QuotaEntity, QuotaRow};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(map: &BTreeMap<QuotaEntity, QuotaRow>, s: S) -> Result<S::Ok, S::Error> {
        map.values().collect::<Vec<_>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<QuotaEntity, QuotaRow>, D::Error> {
        Ok(Vec::<QuotaRow>::deserialize(d)?
            .into_iter()
            .map(|r| (r.entity.clone(), r))
            .collect())
    }
}
