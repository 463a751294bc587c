//! Quotas on a Kafka connection (issue 59, KIP-219): each answered request is metered
//! against its user's and client id's quotas; what it owes is answered as the
//! response's `throttle_time_ms`, and the connection reads nothing more for that long.

use crate::api::Gateway;
use kafka_protocol::messages::ResponseKind;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir_meta::model::quotas::QuotaKey;

use super::caller::Caller;

pub struct Throttle {
    gw: Arc<Gateway>,
    user: String,
    client_id: String,
    /// The connection reads no request before this.
    until: Option<Instant>,
}

impl Throttle {
    pub fn new(gw: Arc<Gateway>) -> Throttle {
        Throttle {
            gw,
            user: String::new(),
            client_id: String::new(),
            until: None,
        }
    }

    /// Meters the caller's requests from now on (the principal is set by SASL, the
    /// client id by each request's header).
    pub fn follow(&mut self, caller: &Caller) {
        let user = caller
            .principal
            .as_deref()
            .unwrap_or(weir_meta::model::names::ANONYMOUS);
        if self.user != user {
            self.user = user.to_string();
        }
        if self.client_id != caller.client_id {
            self.client_id.clone_from(&caller.client_id);
        }
    }

    /// Until when the connection is muted, if it still is.
    pub fn muted_until(&self) -> Option<Instant> {
        self.until.filter(|u| *u > Instant::now())
    }

    /// Meters a Produce as it is admitted: pipelined requests are read before earlier
    /// ones are answered, so its bytes count (and mute the connection) at once. What
    /// it owes, for its response's `throttle_time_ms`.
    pub fn produce_admitted(&mut self, frame_bytes: usize) -> Duration {
        let owed = self.gw.quotas.charge(
            QuotaKey::ProducerByteRate,
            &self.user,
            &self.client_id,
            frame_bytes as f64,
        );
        self.mute(owed);
        owed
    }

    /// Meters one answered request: the records a Fetch answers, and `cost`, the time
    /// the gateway spent on it. Mutes the connection for what it owes, and answers that
    /// (at least what it owed at admission) as the response's `throttle_time_ms`.
    pub fn meter(&mut self, cost: Duration, admitted_owed: Duration, body: Option<&mut ResponseKind>) {
        let q = &self.gw.quotas;
        let (user, client) = (self.user.as_str(), self.client_id.as_str());
        let mut owed = q.charge(QuotaKey::RequestPercentage, user, client, cost.as_micros() as f64);
        if let Some(ResponseKind::Fetch(r)) = body.as_deref() {
            let bytes: usize = r
                .responses
                .iter()
                .flat_map(|t| &t.partitions)
                .filter_map(|p| p.records.as_ref().map(|b| b.len()))
                .sum();
            owed = owed.max(q.charge(QuotaKey::ConsumerByteRate, user, client, bytes as f64));
        }
        // The admission's throttle already muted the connection; only what is owed now
        // mutes it again.
        self.mute(owed);
        let ms = i32::try_from(owed.max(admitted_owed).as_millis()).unwrap_or(i32::MAX);
        match body {
            Some(ResponseKind::Produce(r)) => r.throttle_time_ms = r.throttle_time_ms.max(ms),
            Some(ResponseKind::Fetch(r)) => r.throttle_time_ms = r.throttle_time_ms.max(ms),
            _ => {}
        }
    }

    fn mute(&mut self, owed: Duration) {
        if owed.is_zero() {
            return;
        }
        crate::metrics::metrics()
            .quota_throttle_ms
            .with_label_values(&["kafka"])
            .inc_by(owed.as_millis() as u64);
        let until = Instant::now() + owed;
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }
}
