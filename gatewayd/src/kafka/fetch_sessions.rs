//! Incremental fetch sessions (KIP-227). A consumer of many partitions sends them all
//! once (a full fetch, epoch 0) and gets a session id; its later fetches (epoch 1, 2, …)
//! name only the partitions whose fetch position changed, and the answer holds only the
//! partitions with something new: records, a moved high watermark or log start, or an
//! error.
//!
//! Sessions are soft state of this gateway, bounded in count (`--kafka-fetch-sessions`)
//! and in partitions, per session and in all: nothing durable lives here (DESIGN.md's
//! stateless gateway). A client whose session is gone (evicted, or this gateway
//! restarted) gets FETCH_SESSION_ID_NOT_FOUND and starts a new one with a full fetch, as
//! Kafka clients do. A session answers only the principal that made it, holds only
//! partitions that principal may read, and every fetch through it is authorized again.

use super::errors;
use super::Kafka;
use crate::metrics::metrics;
use indexmap::IndexMap;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError as KafkaError;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::{Grants, Resource};

pub const FETCH_SESSION_ID_NOT_FOUND: i16 = KafkaError::FetchSessionIdNotFound.code();
pub const INVALID_FETCH_SESSION_EPOCH: i16 = KafkaError::InvalidFetchSessionEpoch.code();

/// Fetch v7 is the first with sessions.
const FIRST_VERSION: i16 = 7;
/// Epoch 0 opens a session; −1 asks for none (and closes the one named).
const INITIAL_EPOCH: i32 = 0;
const FINAL_EPOCH: i32 = -1;
/// Most partitions one session holds; a client with more fetches without a session.
pub const MAX_SESSION_PARTITIONS: usize = 10_000;
/// Most partitions all of a gateway's sessions hold together (about 200 MB at most).
pub const MAX_CACHED_PARTITIONS: usize = 1_000_000;

type Key = (String, i32);

/// One partition of a session: what the client last asked for, and what it was last
/// answered (to tell whether the next answer has anything new).
struct Cached {
    topic: TopicName,
    request: FetchPartition,
    answered: Option<(i64, i64, i64)>,
}

impl Cached {
    /// Copies what it keeps out of the request: a decoded request's strings and tagged
    /// fields share its frame, which must not live on in the cache.
    fn new(topic: &TopicName, request: &FetchPartition) -> Self {
        let mut request = request.clone();
        request.unknown_tagged_fields = Default::default();
        Self {
            topic: TopicName(StrBytes::from_string(topic.0.to_string())),
            request,
            answered: None,
        }
    }
}

struct Session {
    owner: String,
    /// The epoch the next incremental fetch must carry.
    next_epoch: i32,
    /// In fetch order: a partition that returned records goes to the back, so partitions
    /// further along get the byte budget in turn (as Kafka's sessions rotate).
    partitions: IndexMap<Key, Cached>,
    created: Instant,
    last_used: Instant,
}

#[derive(Default)]
struct Cache {
    sessions: HashMap<i32, Session>,
    /// Partitions held by all sessions.
    partitions: usize,
}

impl Cache {
    fn remove(&mut self, id: i32) {
        if let Some(s) = self.sessions.remove(&id) {
            self.partitions -= s.partitions.len();
        }
        metrics().kafka_fetch_sessions.set(self.sessions.len() as i64);
    }
}

/// This gateway's fetch sessions.
pub struct FetchSessions {
    max: usize,
    /// A session idle this long may be evicted for any new one; one this old may be
    /// evicted for a larger one (Kafka's `min.incremental.fetch.session.eviction.ms`).
    eviction: Duration,
    cache: Mutex<Cache>,
}

/// How one Fetch is served.
enum Plan {
    /// No session: the request as sent, answered whole, session id 0.
    Sessionless,
    /// A new session (`Some`) or none for want of room: answered whole.
    Full(Option<i32>),
    /// The session's partitions fetched, answered with what changed.
    Incremental(i32, Box<FetchRequest>),
}

fn next_epoch(e: i32) -> i32 {
    if e == i32::MAX {
        1
    } else {
        e + 1
    }
}

impl FetchSessions {
    pub fn new(max: usize, eviction: Duration) -> Self {
        Self {
            max,
            eviction,
            cache: Mutex::new(Cache::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides how `r` is served, updating its session; an error code ends the fetch.
    fn plan(&self, owner: &str, r: &FetchRequest, now: Instant) -> Result<Plan, i16> {
        let mut cache = self.lock();
        let mine = |s: &Session| s.owner == owner;
        if r.session_epoch == INITIAL_EPOCH || r.session_epoch == FINAL_EPOCH {
            if r.session_id != 0 && cache.sessions.get(&r.session_id).is_some_and(mine) {
                cache.remove(r.session_id);
            }
            if r.session_epoch == FINAL_EPOCH {
                metrics().kafka_fetches.with_label_values(&["sessionless"]).inc();
                return Ok(Plan::Sessionless);
            }
            let partitions: IndexMap<Key, Cached> = r
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| (t, p)))
                .map(|(t, p)| ((t.topic.0.to_string(), p.partition), Cached::new(&t.topic, p)))
                .collect();
            metrics().kafka_fetches.with_label_values(&["full"]).inc();
            let id = self.make_room(&mut cache, partitions.len(), now).then(|| {
                let id = loop {
                    let id = rand::random::<i32>() & i32::MAX;
                    if id != 0 && !cache.sessions.contains_key(&id) {
                        break id;
                    }
                };
                cache.partitions += partitions.len();
                cache.sessions.insert(
                    id,
                    Session {
                        owner: owner.to_string(),
                        next_epoch: next_epoch(INITIAL_EPOCH),
                        partitions,
                        created: now,
                        last_used: now,
                    },
                );
                id
            });
            metrics().kafka_fetch_sessions.set(cache.sessions.len() as i64);
            return Ok(Plan::Full(id));
        }
        let total = cache.partitions;
        let Some(session) = cache.sessions.get_mut(&r.session_id).filter(|s| mine(s)) else {
            metrics().kafka_fetches.with_label_values(&["session_not_found"]).inc();
            return Err(FETCH_SESSION_ID_NOT_FOUND);
        };
        if session.next_epoch != r.session_epoch {
            metrics().kafka_fetches.with_label_values(&["invalid_epoch"]).inc();
            return Err(INVALID_FETCH_SESSION_EPOCH);
        }
        let before = session.partitions.len();
        for t in &r.topics {
            for p in &t.partitions {
                let key = (t.topic.0.to_string(), p.partition);
                match session.partitions.get_mut(&key) {
                    Some(cached) => {
                        cached.request = p.clone();
                        cached.request.unknown_tagged_fields = Default::default();
                    }
                    None => {
                        session.partitions.insert(key, Cached::new(&t.topic, p));
                    }
                }
            }
        }
        for t in &r.forgotten_topics_data {
            for p in &t.partitions {
                session.partitions.shift_remove(&(t.topic.0.to_string(), *p));
            }
        }
        let after = session.partitions.len();
        session.next_epoch = next_epoch(session.next_epoch);
        session.last_used = now;
        let whole = session_request(r, &session.partitions);
        cache.partitions = total - before + after;
        if after > MAX_SESSION_PARTITIONS || cache.partitions > MAX_CACHED_PARTITIONS {
            cache.remove(r.session_id);
            metrics().kafka_fetches.with_label_values(&["session_not_found"]).inc();
            return Err(FETCH_SESSION_ID_NOT_FOUND);
        }
        metrics().kafka_fetches.with_label_values(&["incremental"]).inc();
        Ok(Plan::Incremental(r.session_id, Box::new(whole)))
    }

    /// Whether a new session of `size` partitions fits, evicting one if it must: the
    /// least recently used of those idle for the eviction time, or else of those older
    /// than it and smaller than the new one (so a burst of new sessions cannot push out
    /// busy ones, and consumers of few partitions do not push out each other).
    fn make_room(&self, cache: &mut Cache, size: usize, now: Instant) -> bool {
        if size == 0 || size > MAX_SESSION_PARTITIONS || self.max == 0 {
            return false;
        }
        let fits = |c: &Cache| c.sessions.len() < self.max && c.partitions + size <= MAX_CACHED_PARTITIONS;
        while !fits(cache) {
            let idle = |s: &Session| now.duration_since(s.last_used) >= self.eviction;
            let smaller = |s: &Session| now.duration_since(s.created) >= self.eviction && s.partitions.len() < size;
            let lru = |pick: &dyn Fn(&Session) -> bool| {
                cache
                    .sessions
                    .iter()
                    .filter(|(_, s)| pick(s))
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(id, _)| *id)
            };
            let Some(victim) = lru(&idle).or_else(|| lru(&smaller)) else {
                return false;
            };
            cache.remove(victim);
            metrics().kafka_fetch_sessions_evicted.inc();
        }
        true
    }

    /// Keeps what changed for the client since its last answer (all of it on a new
    /// session), remembering what it was told; partitions that returned records move
    /// to the back of the session's order.
    fn answered(&self, id: i32, resp: &mut FetchResponse, incremental: bool) {
        let mut cache = self.lock();
        let Some(session) = cache.sessions.get_mut(&id) else {
            return;
        };
        let mut served = vec![];
        for t in &mut resp.responses {
            let topic = t.topic.0.to_string();
            t.partitions.retain(|p| {
                let key = (topic.clone(), p.partition_index);
                let Some(cached) = session.partitions.get_mut(&key) else {
                    return true;
                };
                let now = (p.high_watermark, p.last_stable_offset, p.log_start_offset);
                let news = has_news(p) || cached.answered != Some(now);
                // After an error the partition is answered again once it clears.
                cached.answered = (p.error_code == errors::NONE).then_some(now);
                if p.records.as_ref().is_some_and(|r| !r.is_empty()) {
                    served.push(key);
                }
                news || !incremental
            });
        }
        for key in served {
            if let Some((k, v)) = session.partitions.shift_remove_entry(&key) {
                session.partitions.insert(k, v);
            }
        }
        resp.responses.retain(|t| !t.partitions.is_empty());
    }
}

/// The fetch an incremental request stands for: every partition of its session, in
/// the session's order, grouped into topics as they come.
fn session_request(r: &FetchRequest, partitions: &IndexMap<Key, Cached>) -> FetchRequest {
    let mut topics: Vec<FetchTopic> = vec![];
    for ((topic, _), cached) in partitions {
        if topics.last().is_none_or(|t| t.topic.0.as_str() != topic) {
            topics.push(FetchTopic::default().with_topic(cached.topic.clone()));
        }
        if let Some(t) = topics.last_mut() {
            t.partitions.push(cached.request.clone());
        }
    }
    r.clone().with_topics(topics).with_forgotten_topics_data(vec![])
}

fn has_news(p: &PartitionData) -> bool {
    p.error_code != errors::NONE || p.records.as_ref().is_some_and(|r| !r.is_empty())
}

/// Serves a Fetch (through its session from v7). Topics the token may not read are
/// answered TOPIC_AUTHORIZATION_FAILED and never enter a session.
pub async fn fetch(kafka: &Kafka, owner: &str, grants: &Grants, mut r: FetchRequest, version: i16) -> FetchResponse {
    let (allowed, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics)
        .into_iter()
        .partition(|t| grants.allows(Operation::Read, Resource::Topic(t.topic.0.as_str())));
    r.topics = allowed;
    let served = |r: FetchRequest| async move {
        if r.topics.is_empty() {
            FetchResponse::default()
        } else {
            super::fetch::fetch(kafka, r).await
        }
    };
    let sessions = &kafka.fetch_sessions;
    let plan = if version < FIRST_VERSION {
        Ok(Plan::Sessionless)
    } else {
        sessions.plan(owner, &r, Instant::now())
    };
    let mut resp = match plan {
        Err(code) => FetchResponse::default().with_error_code(code),
        Ok(Plan::Sessionless) => served(r).await,
        Ok(Plan::Full(id)) => {
            let mut resp = served(r).await;
            if let Some(id) = id {
                sessions.answered(id, &mut resp, false);
            }
            resp.with_session_id(id.unwrap_or(0))
        }
        Ok(Plan::Incremental(id, whole)) => {
            let mut resp = served(*whole).await;
            sessions.answered(id, &mut resp, true);
            resp.with_session_id(id)
        }
    };
    resp.responses.extend(super::scopes::fetch_denied(denied));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_request::ForgottenTopic;
    use kafka_protocol::messages::fetch_response::FetchableTopicResponse;
    use kafka_protocol::protocol::StrBytes;

    const EVICTION: Duration = Duration::from_secs(120);

    fn name(t: &str) -> TopicName {
        TopicName(StrBytes::from_string(t.to_string()))
    }

    fn request(id: i32, epoch: i32, parts: &[(&str, i32, i64)]) -> FetchRequest {
        let mut topics: Vec<FetchTopic> = vec![];
        for (t, p, offset) in parts {
            if topics.last().is_none_or(|x| x.topic.0.as_str() != *t) {
                topics.push(FetchTopic::default().with_topic(name(t)));
            }
            topics.last_mut().expect("topic").partitions.push(
                FetchPartition::default()
                    .with_partition(*p)
                    .with_fetch_offset(*offset)
                    .with_partition_max_bytes(1 << 20),
            );
        }
        FetchRequest::default()
            .with_session_id(id)
            .with_session_epoch(epoch)
            .with_topics(topics)
    }

    fn offsets(r: &FetchRequest) -> Vec<(String, i32, i64)> {
        r.topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (t.topic.0.to_string(), p.partition, p.fetch_offset))
            })
            .collect()
    }

    fn response(parts: &[(&str, i32, i64, &[u8])]) -> FetchResponse {
        let mut topics: Vec<FetchableTopicResponse> = vec![];
        for (t, p, hw, records) in parts {
            if topics.last().is_none_or(|x| x.topic.0.as_str() != *t) {
                topics.push(FetchableTopicResponse::default().with_topic(name(t)));
            }
            topics.last_mut().expect("topic").partitions.push(
                PartitionData::default()
                    .with_partition_index(*p)
                    .with_high_watermark(*hw)
                    .with_records(Some(bytes::Bytes::copy_from_slice(records))),
            );
        }
        FetchResponse::default().with_responses(topics)
    }

    fn answered(resp: &FetchResponse) -> Vec<(String, i32)> {
        resp.responses
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.topic.0.to_string(), p.partition_index)))
            .collect()
    }

    fn opened(s: &FetchSessions, owner: &str, parts: &[(&str, i32, i64)], now: Instant) -> i32 {
        match s.plan(owner, &request(0, 0, parts), now) {
            Ok(Plan::Full(Some(id))) => id,
            _ => panic!("a session opens"),
        }
    }

    // Issue 22 (KIP-227): a session remembers its partitions and their positions; an
    // incremental fetch updates and forgets some, and the answer holds what changed.
    #[test]
    fn an_incremental_fetch_merges_into_its_session_and_is_answered_with_changes_only() {
        let s = FetchSessions::new(10, EVICTION);
        let t = Instant::now();
        let id = opened(&s, "u", &[("a", 0, 0), ("a", 1, 0), ("b", 0, 0)], t);
        let mut full = response(&[("a", 0, 5, b"x"), ("a", 1, 0, b""), ("b", 0, 0, b"")]);
        s.answered(id, &mut full, false);
        assert_eq!(answered(&full).len(), 3, "a new session is answered whole");

        // a/0 moved on; b/0 is forgotten.
        let mut r = request(id, 1, &[("a", 0, 5)]);
        r.forgotten_topics_data = vec![ForgottenTopic::default().with_topic(name("b")).with_partitions(vec![0])];
        let Ok(Plan::Incremental(_, whole)) = s.plan("u", &r, t) else {
            panic!("incremental")
        };
        // a/0 returned records, so it went to the back.
        assert_eq!(offsets(&whole), vec![("a".into(), 1, 0), ("a".into(), 0, 5)]);
        // Nothing new on a/0; a/1's high watermark moved.
        let mut resp = response(&[("a", 0, 5, b""), ("a", 1, 3, b"")]);
        s.answered(id, &mut resp, true);
        assert_eq!(answered(&resp), vec![("a".into(), 1)]);
        // Nothing new at all: an empty answer.
        let Ok(Plan::Incremental(_, whole)) = s.plan("u", &request(id, 2, &[]), t) else {
            panic!("incremental")
        };
        assert_eq!(offsets(&whole).len(), 2, "the session's partitions are fetched");
        let mut resp = response(&[("a", 0, 5, b""), ("a", 1, 3, b"")]);
        s.answered(id, &mut resp, true);
        assert!(answered(&resp).is_empty());
    }

    // Issue 22 (KIP-227): a wrong epoch, an unknown id, and another principal's id are
    // refused as Kafka refuses them; epoch −1 closes the session.
    #[test]
    fn sessions_check_their_epoch_and_owner_and_close_at_the_final_epoch() {
        let s = FetchSessions::new(10, EVICTION);
        let t = Instant::now();
        let id = opened(&s, "u", &[("a", 0, 0)], t);
        assert!(matches!(
            s.plan("u", &request(id, 2, &[]), t),
            Err(INVALID_FETCH_SESSION_EPOCH)
        ));
        assert!(matches!(
            s.plan("other", &request(id, 1, &[]), t),
            Err(FETCH_SESSION_ID_NOT_FOUND)
        ));
        assert!(matches!(
            s.plan("u", &request(id + 1, 1, &[]), t),
            Err(FETCH_SESSION_ID_NOT_FOUND)
        ));
        assert!(matches!(
            s.plan("u", &request(id, 1, &[]), t),
            Ok(Plan::Incremental(..))
        ));
        assert!(matches!(
            s.plan("u", &request(id, FINAL_EPOCH, &[("a", 0, 0)]), t),
            Ok(Plan::Sessionless)
        ));
        assert!(matches!(
            s.plan("u", &request(id, 2, &[]), t),
            Err(FETCH_SESSION_ID_NOT_FOUND)
        ));
    }

    // Issue 22 (KIP-227): the cache is bounded. A full cache evicts a session idle for
    // the eviction time, or one older than that and smaller than the new one; never a
    // young or busy one as large. A client left without one is served whole.
    #[test]
    fn a_full_cache_evicts_idle_or_old_smaller_sessions_only() {
        let s = FetchSessions::new(1, EVICTION);
        let t = Instant::now();
        let at = |secs| t + Duration::from_secs(secs);
        let small = opened(&s, "u", &[("a", 0, 0)], t);
        let big = request(0, 0, &[("a", 0, 0), ("a", 1, 0)]);
        assert!(
            matches!(s.plan("u", &big, at(1)), Ok(Plan::Full(None))),
            "a young session stays"
        );
        assert!(matches!(
            s.plan("u", &request(small, 1, &[]), at(60)),
            Ok(Plan::Incremental(..))
        ));
        let Ok(Plan::Full(Some(big_id))) = s.plan("u", &big, at(121)) else {
            panic!("an old smaller session makes room, busy or not")
        };
        assert!(matches!(
            s.plan("u", &request(small, 2, &[]), at(121)),
            Err(FETCH_SESSION_ID_NOT_FOUND)
        ));
        assert!(
            matches!(
                s.plan("u", &request(0, 0, &[("a", 0, 0)]), at(200)),
                Ok(Plan::Full(None))
            ),
            "a smaller one does not push a larger one out"
        );
        assert!(matches!(
            s.plan("u", &request(0, 0, &[("a", 0, 0)]), at(241)),
            Ok(Plan::Full(Some(_)))
        ));
        assert!(matches!(
            s.plan("u", &request(big_id, 1, &[]), at(241)),
            Err(FETCH_SESSION_ID_NOT_FOUND)
        ));
        let none = FetchSessions::new(0, EVICTION);
        assert!(matches!(
            none.plan("u", &request(0, 0, &[("a", 0, 0)]), t),
            Ok(Plan::Full(None))
        ));
    }

    // Issue 22 (KIP-227): a partition that returned records goes to the back of its
    // session, so the partitions after it get the byte budget next (no starvation).
    #[test]
    fn partitions_that_returned_records_move_to_the_back() {
        let s = FetchSessions::new(10, EVICTION);
        let t = Instant::now();
        let id = opened(&s, "u", &[("a", 0, 0), ("a", 1, 0), ("b", 0, 0)], t);
        let mut full = response(&[("a", 0, 9, b"x"), ("a", 1, 9, b""), ("b", 0, 9, b"")]);
        s.answered(id, &mut full, false);
        let Ok(Plan::Incremental(_, whole)) = s.plan("u", &request(id, 1, &[("a", 0, 1)]), t) else {
            panic!("incremental")
        };
        assert_eq!(
            offsets(&whole),
            vec![("a".into(), 1, 0), ("b".into(), 0, 0), ("a".into(), 0, 1)]
        );
        assert_eq!(whole.topics.len(), 3, "a/0 is its own topic entry after b");
    }
}
