//! Client quotas enforced (issue 59): each gateway meters what it serves to each quota
//! entity, as each Kafka broker does, against the quotas in the metadata log. A meter
//! is a token bucket holding one second of its rate: what a request uses is taken from
//! it, and a bucket in debt owes the time its rate takes to pay the debt back. Kafka
//! answers that time as `throttle_time_ms` and mutes the connection for it; HTTP
//! answers the next request `429` with `Retry-After` until it is paid.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir_meta::model::quotas::{resolve, QuotaEntity, QuotaKey};
use weir_meta::View;

/// The longest throttle one request earns (Kafka's default quota window, 11 s, less a
/// second), so a client is never muted past its request timeouts.
const MAX_THROTTLE: Duration = Duration::from_secs(10);
/// Meters past which idle ones are forgotten (a client id per connection would
/// otherwise grow the map without bound).
const MAX_METERS: usize = 4096;
/// A meter idle this long is full again, and forgotten when the map is large.
const IDLE: Duration = Duration::from_secs(60);

struct Meter {
    rate: f64,
    /// Units left: up to one second of the rate; below zero, a debt.
    tokens: f64,
    last: Instant,
}

impl Meter {
    fn refill(&mut self, rate: f64, now: Instant) {
        if rate != self.rate {
            self.tokens = self.tokens.min(rate);
            self.rate = rate;
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.last = now;
    }

    /// How long the debt takes to pay back.
    fn owed(&self) -> Duration {
        match self.tokens < 0.0 {
            true => Duration::from_secs_f64(-self.tokens / self.rate).min(MAX_THROTTLE),
            false => Duration::ZERO,
        }
    }
}

/// This gateway's meters, one per quota key and entity in use.
pub struct Quotas {
    view: Arc<View>,
    meters: Mutex<HashMap<(QuotaKey, QuotaEntity), Meter>>,
}

impl Quotas {
    pub fn new(view: Arc<View>) -> Quotas {
        Quotas {
            view,
            meters: Mutex::new(HashMap::new()),
        }
    }

    /// The quota of `key` for `user` and `client_id`, and the entity it is metered on.
    fn quota(&self, key: QuotaKey, user: &str, client_id: &str) -> Option<(f64, QuotaEntity)> {
        self.view.with(|s| {
            if s.quotas.is_empty() {
                return None;
            }
            resolve(|e| s.quotas.get(e), key, user, client_id)
        })
    }

    /// Takes `used` units (bytes; microseconds for the request quota) from the meter of
    /// `user` and `client_id`; the throttle they owe after it, zero within quota.
    pub fn charge(&self, key: QuotaKey, user: &str, client_id: &str, used: f64) -> Duration {
        let Some((rate, entity)) = self.quota(key, user, client_id) else {
            return Duration::ZERO;
        };
        let rate = match key {
            // A percentage of each second, in microseconds.
            QuotaKey::RequestPercentage => rate * 10_000.0,
            _ => rate,
        };
        let now = Instant::now();
        let mut meters = self.meters.lock().unwrap_or_else(|p| p.into_inner());
        if meters.len() >= MAX_METERS {
            meters.retain(|_, m| now.saturating_duration_since(m.last) < IDLE);
        }
        let meter = meters.entry((key, entity)).or_insert(Meter {
            rate,
            tokens: rate,
            last: now,
        });
        meter.refill(rate, now);
        meter.tokens -= used;
        meter.owed()
    }

    /// What `user` and `client_id` still owe on any of `keys`, charging nothing: an HTTP
    /// request that arrives in debt is refused before it does any work.
    pub fn owed(&self, keys: &[QuotaKey], user: &str, client_id: &str) -> Duration {
        keys.iter()
            .map(|k| self.charge(*k, user, client_id, 0.0))
            .max()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meter_allows_a_second_of_its_rate_then_owes_the_excess() {
        let start = Instant::now();
        let mut m = Meter {
            rate: 1000.0,
            tokens: 1000.0,
            last: start,
        };
        m.tokens -= 1000.0;
        assert_eq!(m.owed(), Duration::ZERO, "a second's burst is free");
        m.tokens -= 500.0;
        assert_eq!(m.owed(), Duration::from_millis(500), "500 units over at 1000/s");
        m.refill(1000.0, start + Duration::from_millis(500));
        assert_eq!(m.owed(), Duration::ZERO, "paid back by waiting");
        m.refill(1000.0, start + Duration::from_secs(60));
        assert_eq!(m.tokens, 1000.0, "never more than a second's worth");
        m.tokens -= 1e9;
        assert_eq!(m.owed(), MAX_THROTTLE);
        m.refill(10.0, start + Duration::from_secs(60));
        assert!(m.tokens <= 10.0, "a lower rate caps what is left");
    }
}
