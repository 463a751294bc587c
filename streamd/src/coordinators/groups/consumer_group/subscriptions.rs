//! What the members subscribe to: a heartbeat's subscription applied to its member,
//! regexes compiled, and the subscriptions resolved against the topics; apart from the
//! membership (`mod.rs`) and the assignment made from them (`reconcile.rs`).

use super::{ConsumerGroup, Heartbeat, Member, Topics};
use std::collections::{BTreeMap, BTreeSet};
use uuid::Uuid;

impl ConsumerGroup {
    /// Whether some member subscribes to `topic`, by name or by regex (OffsetDelete
    /// refuses such a topic's offsets).
    pub fn subscribes_to(&self, topic: &str) -> bool {
        self.members.values().any(|m| {
            m.subscribed_names.iter().any(|n| n == topic)
                || (!topic.starts_with("__") && m.matcher.as_ref().is_some_and(|re| re.is_match(topic)))
        })
    }

    /// The user topics the members subscribe to, by name or by regex.
    pub(super) fn resolve(&self, topics: &dyn Topics) -> BTreeMap<String, (Uuid, u32)> {
        let mut names: BTreeSet<String> = BTreeSet::new();
        for m in self.members.values() {
            names.extend(m.subscribed_names.iter().cloned());
            if let Some(re) = &m.matcher {
                names.extend(topics.matching(re));
            }
        }
        names
            .into_iter()
            .filter_map(|n| topics.get(&n).map(|t| (n, t)))
            .collect()
    }

    /// The topic ids one member subscribes to, among the resolved topics.
    pub(super) fn subscribed_ids(&self, m: &Member) -> BTreeSet<Uuid> {
        // A regex never matches an internal topic (`__…`), even one another member
        // subscribes to by name.
        let by_regex = |name: &str| !name.starts_with("__") && m.matcher.as_ref().is_some_and(|re| re.is_match(name));
        self.resolved
            .iter()
            .filter(|(name, _)| m.subscribed_names.contains(name) || by_regex(name))
            .map(|(_, (id, _))| *id)
            .collect()
    }
}

impl Member {
    /// Applies a heartbeat's changed fields: whether its subscription changed.
    pub(super) fn update(&mut self, hb: &Heartbeat) -> bool {
        let mut changed = false;
        if let Some(t) = hb.rebalance_timeout {
            self.rebalance_timeout = t;
        }
        if let Some(r) = &hb.rack_id {
            self.rack_id = Some(r.clone()).filter(|r| !r.is_empty());
        }
        if let Some(names) = &hb.subscribed_names {
            let mut names = names.clone();
            names.sort();
            names.dedup();
            changed |= names != self.subscribed_names;
            self.subscribed_names = names;
        }
        if let Some(re) = &hb.subscribed_regex {
            let re = Some(re.clone()).filter(|r| !r.is_empty());
            changed |= re != self.subscribed_regex;
            if changed || self.matcher.is_none() {
                self.matcher = re.as_deref().and_then(|r| compile(r).ok());
            }
            self.subscribed_regex = re;
        }
        if let Some(a) = &hb.assignor {
            let a = Some(a.clone()).filter(|a| !a.is_empty());
            changed |= a != self.assignor;
            self.assignor = a;
        }
        self.client_id.clone_from(&hb.client_id);
        self.client_host.clone_from(&hb.client_host);
        changed
    }
}

/// A subscription regex, matched against whole topic names (Kafka's RE2/J semantics).
pub(super) fn compile(re: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(&format!("^(?:{re})$")).map_err(|e| format!("invalid SubscribedTopicRegex '{re}': {e}"))
}
