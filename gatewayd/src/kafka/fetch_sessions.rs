//! Incremental fetch sessions (KIP-227). A consumer of many partitions sends them all
//! once (a full fetch, epoch 0) and gets a session id; its later fetches (epoch 1, 2, …)
//! name only the partitions whose fetch position changed, and the answer holds only the
//! partitions with something new: records, a moved high watermark or log start, or an
//! error.
//!
//! Sessions are soft state of this gateway, bounded by `--kafka-fetch-sessions`: nothing
//! durable lives here (DESIGN.md's stateless gateway). A client whose session is gone
//! (evicted, or this gateway restarted) gets FETCH_SESSION_ID_NOT_FOUND and starts a new
//! one with a full fetch, as Kafka clients do. A session answers only the principal that
//! made it, and every fetch through it is authorized again (`scopes::fetch`).

use super::errors;
use super::Kafka;
use crate::metrics::metrics;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::ResponseError as KafkaError;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use weir_meta::model::scopes::Grants;

pub const FETCH_SESSION_ID_NOT_FOUND: i16 = KafkaError::FetchSessionIdNotFound.code();
pub const INVALID_FETCH_SESSION_EPOCH: i16 = KafkaError::InvalidFetchSessionEpoch.code();

/// Fetch v7 is the first with sessions.
const FIRST_VERSION: i16 = 7;
/// Epoch 0 opens a session; −1 asks for none (and closes the one named).
const INITIAL_EPOCH: i32 = 0;
const FINAL_EPOCH: i32 = -1;
/// A session idle this long may be evicted for any new one (Kafka's eviction rule).
const IDLE_EVICTABLE: Duration = Duration::from_secs(120);
/// Most partitions one session holds; a client with more fetches without a session.
pub const MAX_SESSION_PARTITIONS: usize = 10_000;

type Key = (String, i32);

/// One partition of a session: what the client last asked for, and what it was last
/// answered (to tell whether the next answer has anything new).
struct Cached {
    topic: TopicName,
    request: FetchPartition,
    answered: Option<(i64, i64, i64)>,
}

struct Session {
    owner: String,
    /// The epoch the next incremental fetch must carry.
    next_epoch: i32,
    partitions: BTreeMap<Key, Cached>,
    last_used: Instant,
}

/// This gateway's fetch sessions.
pub struct FetchSessions {
    max: usize,
    sessions: Mutex<HashMap<i32, Session>>,
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
    pub fn new(max: usize) -> Self {
        Self {
            max,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Session>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides how `r` is served, updating its session; an error code ends the fetch.
    fn plan(&self, owner: &str, r: &FetchRequest, now: Instant) -> Result<Plan, i16> {
        let mut sessions = self.lock();
        let mine = |s: &Session| s.owner == owner;
        if r.session_epoch == INITIAL_EPOCH || r.session_epoch == FINAL_EPOCH {
            if r.session_id != 0 && sessions.get(&r.session_id).is_some_and(mine) {
                sessions.remove(&r.session_id);
            }
            if r.session_epoch == FINAL_EPOCH {
                metrics().kafka_fetches.with_label_values(&["sessionless"]).inc();
                return Ok(Plan::Sessionless);
            }
            let partitions: BTreeMap<Key, Cached> = r
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| (t, p)))
                .map(|(t, p)| {
                    let cached = Cached {
                        topic: t.topic.clone(),
                        request: p.clone(),
                        answered: None,
                    };
                    ((t.topic.0.to_string(), p.partition), cached)
                })
                .collect();
            metrics().kafka_fetches.with_label_values(&["full"]).inc();
            let id = self.make_room(&mut sessions, partitions.len(), now).then(|| {
                let id = loop {
                    let id = rand::random::<i32>() & i32::MAX;
                    if id != 0 && !sessions.contains_key(&id) {
                        break id;
                    }
                };
                sessions.insert(
                    id,
                    Session {
                        owner: owner.to_string(),
                        next_epoch: next_epoch(INITIAL_EPOCH),
                        partitions,
                        last_used: now,
                    },
                );
                id
            });
            metrics().kafka_fetch_sessions.set(sessions.len() as i64);
            return Ok(Plan::Full(id));
        }
        let Some(session) = sessions.get_mut(&r.session_id).filter(|s| mine(s)) else {
            metrics().kafka_fetches.with_label_values(&["session_not_found"]).inc();
            return Err(FETCH_SESSION_ID_NOT_FOUND);
        };
        if session.next_epoch != r.session_epoch {
            metrics().kafka_fetches.with_label_values(&["invalid_epoch"]).inc();
            return Err(INVALID_FETCH_SESSION_EPOCH);
        }
        for t in &r.topics {
            for p in &t.partitions {
                let key = (t.topic.0.to_string(), p.partition);
                let cached = session.partitions.entry(key).or_insert_with(|| Cached {
                    topic: t.topic.clone(),
                    request: p.clone(),
                    answered: None,
                });
                cached.request = p.clone();
            }
        }
        for t in &r.forgotten_topics_data {
            for p in &t.partitions {
                session.partitions.remove(&(t.topic.0.to_string(), *p));
            }
        }
        if session.partitions.len() > MAX_SESSION_PARTITIONS {
            sessions.remove(&r.session_id);
            metrics().kafka_fetch_sessions.set(sessions.len() as i64);
            metrics().kafka_fetches.with_label_values(&["session_not_found"]).inc();
            return Err(FETCH_SESSION_ID_NOT_FOUND);
        }
        session.next_epoch = next_epoch(session.next_epoch);
        session.last_used = now;
        metrics().kafka_fetches.with_label_values(&["incremental"]).inc();
        let mut topics: Vec<FetchTopic> = vec![];
        for ((topic, _), cached) in &session.partitions {
            if topics.last().is_none_or(|t| t.topic.0.as_str() != topic) {
                topics.push(FetchTopic::default().with_topic(cached.topic.clone()));
            }
            if let Some(t) = topics.last_mut() {
                t.partitions.push(cached.request.clone());
            }
        }
        let whole = r.clone().with_topics(topics).with_forgotten_topics_data(vec![]);
        Ok(Plan::Incremental(r.session_id, Box::new(whole)))
    }

    /// Whether a new session of `size` partitions fits, evicting one if it must: the
    /// least recently used, when it has been idle a while or is smaller than the new one
    /// (so busy consumers of few partitions are not pushed out by each other).
    fn make_room(&self, sessions: &mut HashMap<i32, Session>, size: usize, now: Instant) -> bool {
        if size == 0 || size > MAX_SESSION_PARTITIONS || self.max == 0 {
            return false;
        }
        if sessions.len() < self.max {
            return true;
        }
        let victim = sessions
            .iter()
            .filter(|(_, s)| now.duration_since(s.last_used) >= IDLE_EVICTABLE || s.partitions.len() < size)
            .min_by_key(|(_, s)| s.last_used)
            .map(|(id, _)| *id);
        match victim {
            Some(id) => {
                sessions.remove(&id);
                metrics().kafka_fetch_sessions_evicted.inc();
                true
            }
            None => false,
        }
    }

    /// Keeps what changed for the client since its last answer (all of it on a new
    /// session), remembering what it was told.
    fn answered(&self, id: i32, resp: &mut FetchResponse, incremental: bool) {
        let mut sessions = self.lock();
        let Some(session) = sessions.get_mut(&id) else {
            return;
        };
        for t in &mut resp.responses {
            let topic = t.topic.0.to_string();
            t.partitions.retain(|p| {
                let Some(cached) = session.partitions.get_mut(&(topic.clone(), p.partition_index)) else {
                    return true;
                };
                let now = (p.high_watermark, p.last_stable_offset, p.log_start_offset);
                let news = has_news(p) || cached.answered != Some(now);
                // After an error the partition is answered again once it clears.
                cached.answered = (p.error_code == errors::NONE).then_some(now);
                news || !incremental
            });
        }
        resp.responses.retain(|t| !t.partitions.is_empty());
    }
}

fn has_news(p: &PartitionData) -> bool {
    p.error_code != errors::NONE || p.records.as_ref().is_some_and(|r| !r.is_empty())
}

/// Serves a Fetch through its session (v7+), authorizing it as `scopes::fetch` does.
pub async fn fetch(kafka: &Kafka, owner: &str, grants: &Grants, r: FetchRequest, version: i16) -> FetchResponse {
    if version < FIRST_VERSION {
        return super::scopes::fetch(kafka, grants, r).await;
    }
    let sessions = &kafka.fetch_sessions;
    match sessions.plan(owner, &r, Instant::now()) {
        Err(code) => FetchResponse::default().with_error_code(code).with_session_id(0),
        Ok(Plan::Sessionless) => super::scopes::fetch(kafka, grants, r).await.with_session_id(0),
        Ok(Plan::Full(id)) => {
            let mut resp = super::scopes::fetch(kafka, grants, r).await;
            if let Some(id) = id {
                sessions.answered(id, &mut resp, false);
            }
            resp.with_session_id(id.unwrap_or(0))
        }
        Ok(Plan::Incremental(id, whole)) => {
            let mut resp = super::scopes::fetch(kafka, grants, *whole).await;
            sessions.answered(id, &mut resp, true);
            resp.with_session_id(id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_request::ForgottenTopic;
    use kafka_protocol::messages::fetch_response::FetchableTopicResponse;
    use kafka_protocol::protocol::StrBytes;

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
        let s = FetchSessions::new(10);
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
        assert_eq!(offsets(&whole), vec![("a".into(), 0, 5), ("a".into(), 1, 0)]);
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
        let s = FetchSessions::new(10);
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

    // Issue 22 (KIP-227): the cache is bounded. A full cache evicts an idle or smaller
    // session, never a busy one as large; a client left without one is served whole.
    #[test]
    fn a_full_cache_evicts_idle_or_smaller_sessions_only() {
        let s = FetchSessions::new(1);
        let t = Instant::now();
        let small = opened(&s, "u", &[("a", 0, 0)], t);
        let big = opened(&s, "u", &[("a", 0, 0), ("a", 1, 0)], t);
        assert!(matches!(
            s.plan("u", &request(small, 1, &[]), t),
            Err(FETCH_SESSION_ID_NOT_FOUND)
        ));
        assert!(
            matches!(s.plan("u", &request(0, 0, &[("a", 0, 0)]), t), Ok(Plan::Full(None))),
            "a smaller one does not push a busy larger one out"
        );
        let later = t + IDLE_EVICTABLE;
        let again = opened(&s, "u", &[("a", 0, 0)], later);
        assert_ne!(again, big);
        assert!(matches!(
            s.plan("u", &request(big, 1, &[]), later),
            Err(FETCH_SESSION_ID_NOT_FOUND)
        ));
        assert!(matches!(
            FetchSessions::new(0).plan("u", &request(0, 0, &[("a", 0, 0)]), t),
            Ok(Plan::Full(None))
        ));
    }
}
