//! Client quotas (issue 59): Kafka's byte-rate and request quotas (KIP-13, KIP-55,
//! KIP-124), set per user (a token's name), per client id, or both, with defaults, and
//! kept in the metadata log. Each gateway enforces them on what it serves, as each Kafka
//! broker does on its own traffic.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One side of a quota entity: a name, or the default for every name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaName {
    Default,
    Name(String),
}

/// Whom a quota is for: a user, a client id, or a user's client id. At least one side
/// is set.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QuotaEntity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<QuotaName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<QuotaName>,
}

/// What a quota limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaKey {
    /// Bytes a second produced (Kafka Produce, HTTP appends).
    ProducerByteRate,
    /// Bytes a second fetched (Kafka Fetch, HTTP reads).
    ConsumerByteRate,
    /// Percent of one second a second spent handling the entity's requests.
    RequestPercentage,
}

impl QuotaKey {
    pub const ALL: [QuotaKey; 3] = [
        QuotaKey::ProducerByteRate,
        QuotaKey::ConsumerByteRate,
        QuotaKey::RequestPercentage,
    ];

    /// Kafka's config name.
    pub fn name(self) -> &'static str {
        match self {
            QuotaKey::ProducerByteRate => "producer_byte_rate",
            QuotaKey::ConsumerByteRate => "consumer_byte_rate",
            QuotaKey::RequestPercentage => "request_percentage",
        }
    }

    pub fn from_name(name: &str) -> Option<QuotaKey> {
        QuotaKey::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A quota's value. Stored as its bits, so rows compare exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "f64", from = "f64")]
pub struct QuotaValue(u64);

impl QuotaValue {
    pub fn new(v: f64) -> QuotaValue {
        QuotaValue(v.to_bits())
    }

    pub fn get(self) -> f64 {
        f64::from_bits(self.0)
    }
}

impl From<f64> for QuotaValue {
    fn from(v: f64) -> Self {
        QuotaValue::new(v)
    }
}

impl From<QuotaValue> for f64 {
    fn from(v: QuotaValue) -> Self {
        v.get()
    }
}

/// Why `value` cannot be a quota of `key`, if it cannot.
pub fn invalid_value(key: QuotaKey, value: f64) -> Option<String> {
    if !value.is_finite() || value <= 0.0 {
        return Some(format!("{} must be a positive number, got {value}", key.name()));
    }
    if key != QuotaKey::RequestPercentage && value.fract() != 0.0 {
        return Some(format!(
            "{} is a whole number of bytes a second, got {value}",
            key.name()
        ));
    }
    None
}

/// One entity's quotas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaRow {
    pub entity: QuotaEntity,
    pub values: BTreeMap<QuotaKey, QuotaValue>,
}

/// The quota of `key` for `user` connecting with `client_id`, and the entity it counts
/// against (defaults filled in with the caller's names, so a default quota is each
/// user's or client's own, as in Kafka). Kafka's precedence: the user's client id, the
/// user's default client, the user, the default user's client id, the default user's
/// default client, the default user, the client id, the default client.
pub fn resolve<'a>(
    quotas: impl Fn(&QuotaEntity) -> Option<&'a QuotaRow>,
    key: QuotaKey,
    user: &str,
    client_id: &str,
) -> Option<(f64, QuotaEntity)> {
    use QuotaName::{Default, Name};
    let u = || Some(Name(user.to_string()));
    let c = || Some(Name(client_id.to_string()));
    let order = [
        (u(), c()),
        (u(), Some(Default)),
        (u(), None),
        (Some(Default), c()),
        (Some(Default), Some(Default)),
        (Some(Default), None),
        (None, c()),
        (None, Some(Default)),
    ];
    order.into_iter().find_map(|(user_side, client_side)| {
        let entity = QuotaEntity {
            user: user_side,
            client_id: client_side,
        };
        let value = quotas(&entity)?.values.get(&key)?.get();
        let counted = QuotaEntity {
            user: entity.user.as_ref().map(|_| Name(user.to_string())),
            client_id: entity.client_id.as_ref().map(|_| Name(client_id.to_string())),
        };
        Some((value, counted))
    })
}

/// How a DescribeClientQuotas component matches one side of an entity (Kafka's match
/// types 0, 1 and 2): `Exact` that name, `Default` the default, `Specified` anything set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuotaMatch {
    Exact(String),
    Default,
    Specified,
}

impl QuotaMatch {
    pub fn matches(&self, side: Option<&QuotaName>) -> bool {
        match (self, side) {
            (_, None) => false,
            (QuotaMatch::Exact(n), Some(QuotaName::Name(s))) => s == n,
            (QuotaMatch::Exact(_), Some(QuotaName::Default)) => false,
            (QuotaMatch::Default, Some(s)) => s == &QuotaName::Default,
            (QuotaMatch::Specified, Some(_)) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(user: Option<QuotaName>, client_id: Option<QuotaName>, rate: f64) -> QuotaRow {
        QuotaRow {
            entity: QuotaEntity { user, client_id },
            values: [(QuotaKey::ProducerByteRate, QuotaValue::new(rate))].into(),
        }
    }

    fn table(rows: Vec<QuotaRow>) -> BTreeMap<QuotaEntity, QuotaRow> {
        rows.into_iter().map(|r| (r.entity.clone(), r)).collect()
    }

    fn name(n: &str) -> Option<QuotaName> {
        Some(QuotaName::Name(n.into()))
    }

    #[test]
    fn the_most_specific_quota_applies_and_a_default_counts_per_name() {
        use QuotaName::Default;
        let t = table(vec![
            row(None, Some(Default), 10.0),
            row(None, name("app"), 20.0),
            row(Some(Default), None, 30.0),
            row(name("alice"), None, 40.0),
            row(name("alice"), name("app"), 50.0),
        ]);
        let at = |user: &str, client: &str| {
            resolve(|e| t.get(e), QuotaKey::ProducerByteRate, user, client).map(|(v, e)| (v as u64, e))
        };
        assert_eq!(at("alice", "app").unwrap().0, 50);
        assert_eq!(at("alice", "other").unwrap().0, 40);
        let (v, counted) = at("bob", "app").unwrap();
        assert_eq!(v, 30, "the default user comes before any client id");
        assert_eq!(
            counted,
            QuotaEntity {
                user: name("bob"),
                client_id: None
            },
            "bob's own"
        );
        assert_eq!(resolve(|e| t.get(e), QuotaKey::ConsumerByteRate, "alice", "app"), None);
        let clients_only = table(vec![row(None, Some(Default), 10.0), row(None, name("app"), 20.0)]);
        let at = |client: &str| resolve(|e| clients_only.get(e), QuotaKey::ProducerByteRate, "u", client);
        assert_eq!(at("app").map(|(v, _)| v as u64), Some(20));
        let (v, counted) = at("cli").unwrap();
        assert_eq!((v as u64, counted.client_id), (10, name("cli")));
    }

    #[test]
    fn values_are_positive_and_byte_rates_whole() {
        assert!(invalid_value(QuotaKey::ProducerByteRate, 1024.0).is_none());
        assert!(invalid_value(QuotaKey::ProducerByteRate, 0.0).is_some());
        assert!(invalid_value(QuotaKey::ConsumerByteRate, 10.5).is_some());
        assert!(invalid_value(QuotaKey::RequestPercentage, 12.5).is_none());
        assert!(invalid_value(QuotaKey::RequestPercentage, f64::NAN).is_some());
        assert_eq!(
            QuotaKey::from_name("request_percentage"),
            Some(QuotaKey::RequestPercentage)
        );
        assert_eq!(QuotaKey::from_name("controller_mutation_rate"), None);
    }

    #[test]
    fn components_match_names_defaults_or_anything_set() {
        let alice = QuotaName::Name("alice".into());
        assert!(QuotaMatch::Exact("alice".into()).matches(Some(&alice)));
        assert!(!QuotaMatch::Exact("alice".into()).matches(Some(&QuotaName::Default)));
        assert!(QuotaMatch::Default.matches(Some(&QuotaName::Default)));
        assert!(QuotaMatch::Specified.matches(Some(&alice)));
        assert!(!QuotaMatch::Specified.matches(None));
    }
}
