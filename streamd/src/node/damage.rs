//! Damaged data (issue 20): a committed range that fails its checksum, or is not what the
//! index says, is reported to the metadata log once, and from then on reads of it are
//! refused at once, naming the damage, until an operator restores the object or trims
//! past it (`weir streams repair`). Retrying a read of damaged data never helps.

use super::Node;
use crate::error::StreamdError;
use crate::stream::StreamHandle;
use std::sync::Arc;
use weir_meta::model::{Command, ObjectRange, StreamDamage};
use weir_shared::batch::split_batches;
use weir_shared::ids::StreamId;

/// How long a damage report not yet in the view holds off another of the same range.
const REPORT_PENDING: std::time::Duration = std::time::Duration::from_secs(30);

impl Node {
    /// The damage marked on `stream`, if any.
    pub fn damage(&self, stream: StreamId) -> Option<StreamDamage> {
        self.view
            .with(|s| s.streams.get(&stream).and_then(|r| r.damage.as_deref().cloned()))
    }

    /// Streams open here that are marked damaged, by name.
    pub fn damaged_streams(&self) -> Vec<String> {
        self.view.with(|s| {
            s.streams
                .damaged()
                .iter()
                .filter_map(|id| s.streams.get(id))
                .filter(|r| r.owner.as_ref() == Some(&self.me) && r.state == weir_meta::model::StreamState::Open)
                .map(|r| r.name.clone())
                .collect()
        })
    }

    /// Refuses a read at `offset` when it falls in `stream`'s marked damage.
    pub fn check_damage(&self, stream: StreamId, name: &str, offset: u64) -> Result<(), StreamdError> {
        match self.damage(stream) {
            Some(d) if (d.from.0..d.until.0).contains(&offset) => Err(StreamdError::Corrupt(format!(
                "stream '{name}' is damaged at offsets {}..{} ({}); an operator must restore it or trim past it (weir streams repair)",
                d.from, d.until, d.what
            ))),
            _ => Ok(()),
        }
    }

    /// Passes `result` through; a `Corrupt` one is reported as damage of `range` of
    /// `stream` first, in the background (the metadata log keeps the earliest).
    pub fn note_damage<T>(
        &self,
        stream: StreamId,
        range: &ObjectRange,
        result: Result<T, StreamdError>,
    ) -> Result<T, StreamdError> {
        if let Err(StreamdError::Corrupt(why)) = &result {
            let marked = self.damage(stream).is_some_and(|d| d.from <= range.start);
            if !marked && self.start_reporting(stream, range.start.0) {
                crate::metrics::metrics().damage_found.inc();
                tracing::error!(stream = %stream, object = %range.key, start = %range.start, end = %range.end, reason = %why, "damaged data found; reporting it, and it is not served");
                let command = Command::ReportDamage {
                    stream,
                    from: range.start,
                    until: range.end,
                    what: why.clone(),
                };
                let (metad, proposer) = (self.metad.clone(), self.proposer());
                let about = Some(stream.to_string());
                let reporting = self.damage_reporting.clone();
                self.tasks.spawn("damage", "report damage", about, async move {
                    if let Err(e) = metad.propose(&proposer, command).await {
                        reporting
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&stream);
                        tracing::warn!(stream = %stream, error = %e, "cannot report damage yet; the next read of it reports again");
                    }
                });
            }
        }
        result
    }

    /// Whether damage of `stream` from `start` is to be reported now: not when a report
    /// at or below it is under way (until the view shows it, or for
    /// [`REPORT_PENDING`] if it never does).
    fn start_reporting(&self, stream: StreamId, start: u64) -> bool {
        let now = std::time::Instant::now();
        let mut reporting = self.damage_reporting.lock().unwrap_or_else(|p| p.into_inner());
        // Reports long past are dropped, so the map holds only those under way.
        reporting.retain(|_, (_, since)| now.duration_since(*since) < REPORT_PENDING);
        match reporting.get(&stream) {
            Some((from, since)) if *from <= start && now.duration_since(*since) < REPORT_PENDING => false,
            _ => {
                reporting.insert(stream, (start, now));
                true
            }
        }
    }

    /// On a view change: when an operator cleared the damage of a served stream and
    /// its start is still below the damage (it was restored, not trimmed past), reads
    /// the range again at once, so damage that is still there is reported anew.
    pub fn recheck_cleared_damage(self: &Arc<Self>, handle: &StreamHandle) {
        let now = self.damage(handle.id);
        let before = {
            let mut seen = self.damage_seen.lock().unwrap_or_else(|p| p.into_inner());
            match &now {
                Some(d) => seen.insert(handle.id, d.clone()),
                None => seen.remove(&handle.id),
            }
        };
        let (Some(cleared), None) = (before, now) else { return };
        // Cleared: the range may be reported again.
        self.damage_reporting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle.id);
        if handle.start.load(std::sync::atomic::Ordering::Acquire) >= cleared.until.0 {
            return;
        }
        let (node, id, name) = (self.clone(), handle.id, handle.name.clone());
        self.tasks.spawn("damage", "recheck cleared damage", Some(name.clone()), async move {
            tracing::info!(stream = %name, from = %cleared.from, until = %cleared.until, "damage mark cleared; reading the range again");
            let mut at = cleared.from.0;
            while at < cleared.until.0 {
                let Ok(range) = node.range_at(id, at).await else { return };
                let checked = node.fetch_range_uncached(&range).await.and_then(|b| {
                    split_batches(&b)
                        .map(|_| ())
                        .map_err(|e| StreamdError::Corrupt(format!("object {}: {e}", range.key)))
                });
                if node.note_damage(id, &range, checked).is_err() {
                    return;
                }
                at = range.end.0;
            }
            tracing::info!(stream = %name, "the restored range reads back whole");
        });
    }
}
