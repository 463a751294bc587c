//! The server-side assignors of KIP-848's consumer groups: `uniform` (the default) and
//! `range`. Both are pure functions of the members' subscriptions, the topics' sizes
//! and (for `uniform`) the current target assignment, so they are testable alone.

use std::collections::{BTreeMap, BTreeSet};
use uuid::Uuid;

/// The partitions of each topic, by topic id.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// The assignors this coordinator runs, the first the default (Kafka's
/// `group.consumer.assignors`).
pub const ASSIGNORS: [&str; 2] = ["uniform", "range"];

/// One member as an assignor sees it: the topics it subscribes to (resolved to ids).
pub struct Subscriber<'a> {
    pub id: &'a str,
    pub topics: BTreeSet<Uuid>,
    /// Its partitions in the current target assignment (kept where they still fit).
    pub current: &'a Assignment,
}

/// Runs assignor `name` (one of [`ASSIGNORS`]): every partition of every subscribed topic
/// goes to exactly one member subscribed to its topic.
pub fn assign(name: &str, members: &[Subscriber<'_>], topics: &BTreeMap<Uuid, u32>) -> BTreeMap<String, Assignment> {
    match name {
        "range" => range(members, topics),
        _ => uniform(members, topics),
    }
}

pub fn is_known(name: &str) -> bool {
    ASSIGNORS.contains(&name)
}

/// Kafka's range assignor: per topic, its subscribers in id order take contiguous ranges,
/// the first ones one partition more when the count does not divide.
fn range(members: &[Subscriber<'_>], topics: &BTreeMap<Uuid, u32>) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members.iter().map(|m| (m.id.to_string(), Assignment::new())).collect();
    for (topic, &count) in topics {
        let mut subscribers: Vec<&str> = members
            .iter()
            .filter(|m| m.topics.contains(topic))
            .map(|m| m.id)
            .collect();
        subscribers.sort_unstable();
        if subscribers.is_empty() {
            continue;
        }
        let n = subscribers.len() as u32;
        let (each, extra) = (count / n, count % n);
        let mut next = 0;
        for (i, m) in subscribers.iter().enumerate() {
            let take = each + u32::from((i as u32) < extra);
            let parts: BTreeSet<i32> = (next..next + take).map(|p| p as i32).collect();
            next += take;
            if !parts.is_empty() {
                out.entry(m.to_string()).or_default().insert(*topic, parts);
            }
        }
    }
    out
}

/// Kafka's uniform assignor: partitions spread as evenly as the subscriptions allow,
/// moving as few as possible. Each member keeps the partitions of its current target
/// that it still subscribes to, up to its fair share; the rest go to the least loaded
/// subscriber; then partitions move, one at a time, from a member holding two more than
/// another subscriber of their topic, until none does.
fn uniform(members: &[Subscriber<'_>], topics: &BTreeMap<Uuid, u32>) -> BTreeMap<String, Assignment> {
    let mut load: BTreeMap<&str, BTreeSet<(Uuid, i32)>> = members.iter().map(|m| (m.id, BTreeSet::new())).collect();
    let subscribed = |m: &Subscriber<'_>, t: &Uuid| m.topics.contains(t) && topics.contains_key(t);
    let total: usize = topics
        .iter()
        .filter(|(t, _)| members.iter().any(|m| m.topics.contains(*t)))
        .map(|(_, &n)| n as usize)
        .sum();
    // The most any member keeps from before: an even split, rounded up.
    let share = if members.is_empty() {
        0
    } else {
        total.div_ceil(members.len())
    };
    let mut taken: BTreeSet<(Uuid, i32)> = BTreeSet::new();
    for m in members {
        for (t, parts) in m.current.iter().filter(|(t, _)| subscribed(m, t)) {
            for &p in parts.iter().filter(|&&p| p >= 0 && (p as u32) < topics[t]) {
                let mine = load.get_mut(m.id).expect("every member has a load");
                if mine.len() < share && taken.insert((*t, p)) {
                    mine.insert((*t, p));
                }
            }
        }
    }
    // The partitions left, those with the fewest subscribers first (they have the least
    // choice), each to the least loaded of its subscribers.
    let subscribers_of = |t: &Uuid| members.iter().filter(|m| m.topics.contains(t)).count();
    let mut left: Vec<(usize, Uuid, i32)> = topics
        .iter()
        .filter(|(t, _)| subscribers_of(t) > 0)
        .flat_map(|(t, &n)| (0..n as i32).map(move |p| (*t, p)))
        .filter(|tp| !taken.contains(tp))
        .map(|(t, p)| (subscribers_of(&t), t, p))
        .collect();
    left.sort_unstable();
    for (_, t, p) in left {
        let least = members
            .iter()
            .filter(|m| m.topics.contains(&t))
            .min_by_key(|m| (load[m.id].len(), m.id))
            .expect("a partition left has a subscriber");
        load.get_mut(least.id).expect("a load").insert((t, p));
    }
    // Balance: a move from a member to one of its partition's subscribers holding at
    // least two fewer. Each move lowers the sum of squared loads, so this ends.
    loop {
        let mut moved = false;
        let mut order: Vec<&str> = load.keys().copied().collect();
        order.sort_by_key(|id| std::cmp::Reverse(load[id].len()));
        'from: for from in order {
            let held: Vec<(Uuid, i32)> = load[from].iter().copied().collect();
            for (t, p) in held {
                let to = members
                    .iter()
                    .filter(|m| m.id != from && m.topics.contains(&t) && load[m.id].len() + 1 < load[from].len())
                    .min_by_key(|m| (load[m.id].len(), m.id));
                if let Some(to) = to {
                    load.get_mut(from).expect("a load").remove(&(t, p));
                    load.get_mut(to.id).expect("a load").insert((t, p));
                    moved = true;
                    break 'from;
                }
            }
        }
        if !moved {
            break;
        }
    }
    load.into_iter()
        .map(|(id, parts)| {
            let mut a = Assignment::new();
            for (t, p) in parts {
                a.entry(t).or_default().insert(p);
            }
            (id.to_string(), a)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u8) -> Uuid {
        Uuid::from_bytes([n; 16])
    }

    fn count(a: &BTreeMap<String, Assignment>, m: &str) -> usize {
        a[m].values().map(BTreeSet::len).sum()
    }

    fn every_partition_once(a: &BTreeMap<String, Assignment>, topics: &BTreeMap<Uuid, u32>) {
        let mut seen = BTreeSet::new();
        for parts in a.values() {
            for (t, ps) in parts {
                for p in ps {
                    assert!(seen.insert((*t, *p)), "{t}/{p} assigned twice");
                }
            }
        }
        let want: usize = topics.values().map(|&n| n as usize).sum();
        assert_eq!(seen.len(), want);
    }

    #[test]
    fn uniform_spreads_evenly_and_keeps_what_it_can() {
        let topics = BTreeMap::from([(t(1), 5), (t(2), 2)]);
        let none = Assignment::new();
        let both = BTreeSet::from([t(1), t(2)]);
        let two = [
            Subscriber {
                id: "a",
                topics: both.clone(),
                current: &none,
            },
            Subscriber {
                id: "b",
                topics: both.clone(),
                current: &none,
            },
        ];
        let first = uniform(&two, &topics);
        every_partition_once(&first, &topics);
        assert_eq!((count(&first, "a"), count(&first, "b")), (4, 3));
        // A third member joins: each keeps at most its share (3), no partition of a
        // member that stays under it moves, and the loads end 3/2/2 or so.
        let three = [
            Subscriber {
                id: "a",
                topics: both.clone(),
                current: &first["a"],
            },
            Subscriber {
                id: "b",
                topics: both.clone(),
                current: &first["b"],
            },
            Subscriber {
                id: "c",
                topics: both.clone(),
                current: &none,
            },
        ];
        let second = uniform(&three, &topics);
        every_partition_once(&second, &topics);
        let loads: Vec<usize> = ["a", "b", "c"].iter().map(|m| count(&second, m)).collect();
        assert!(
            loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1,
            "{loads:?}"
        );
        let kept_b: usize = first["b"]
            .iter()
            .map(|(t, ps)| {
                ps.iter()
                    .filter(|p| second["b"].get(t).is_some_and(|s| s.contains(p)))
                    .count()
            })
            .sum();
        assert!(kept_b >= 2, "b kept its partitions up to its share: {kept_b}");
        // c leaves: its partitions go, the others keep all of theirs.
        let back = [
            Subscriber {
                id: "a",
                topics: both.clone(),
                current: &second["a"],
            },
            Subscriber {
                id: "b",
                topics: both.clone(),
                current: &second["b"],
            },
        ];
        let third = uniform(&back, &topics);
        every_partition_once(&third, &topics);
        for m in ["a", "b"] {
            for (t, ps) in &second[m] {
                assert!(ps.is_subset(&third[m][t]), "{m} kept {t}");
            }
        }
    }

    #[test]
    fn uniform_honours_different_subscriptions() {
        let topics = BTreeMap::from([(t(1), 4), (t(2), 4)]);
        let none = Assignment::new();
        let members = [
            Subscriber {
                id: "a",
                topics: BTreeSet::from([t(1)]),
                current: &none,
            },
            Subscriber {
                id: "b",
                topics: BTreeSet::from([t(1), t(2)]),
                current: &none,
            },
            Subscriber {
                id: "c",
                topics: BTreeSet::from([t(2)]),
                current: &none,
            },
        ];
        let a = uniform(&members, &topics);
        every_partition_once(&a, &topics);
        assert!(a["a"].keys().all(|k| *k == t(1)));
        assert!(a["c"].keys().all(|k| *k == t(2)));
        let loads: Vec<usize> = ["a", "b", "c"].iter().map(|m| count(&a, m)).collect();
        assert!(
            loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1,
            "{loads:?}"
        );
    }

    #[test]
    fn range_gives_contiguous_ranges_per_topic() {
        let topics = BTreeMap::from([(t(1), 5)]);
        let none = Assignment::new();
        let one = BTreeSet::from([t(1)]);
        let members = [
            Subscriber {
                id: "b",
                topics: one.clone(),
                current: &none,
            },
            Subscriber {
                id: "a",
                topics: one.clone(),
                current: &none,
            },
        ];
        let a = range(&members, &topics);
        assert_eq!(a["a"][&t(1)], BTreeSet::from([0, 1, 2]));
        assert_eq!(a["b"][&t(1)], BTreeSet::from([3, 4]));
    }

    #[test]
    fn a_topic_nobody_subscribes_to_is_not_assigned() {
        let topics = BTreeMap::from([(t(1), 2), (t(2), 2)]);
        let none = Assignment::new();
        let members = [Subscriber {
            id: "a",
            topics: BTreeSet::from([t(1)]),
            current: &none,
        }];
        let a = uniform(&members, &topics);
        assert_eq!(a["a"].len(), 1);
        assert_eq!(count(&a, "a"), 2);
    }
}
