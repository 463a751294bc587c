//! A history checker: clients record every append attempt (payload, outcome, offset);
//! after the faults heal each stream is read back, and the checker asserts that every
//! acknowledged record is there at its offset exactly once (INV-2), that nothing is
//! read twice or out of order, and that nothing refused outright shows up.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// What one append attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged at this offset.
    Ok(u64),
    /// Refused before anything was applied (4xx, or a 503 that says so).
    Failed,
    /// May or may not have been applied (connection lost, outcome unknown).
    Unknown,
}

#[derive(Clone, Debug)]
pub struct Attempt {
    pub stream: String,
    pub payload: String,
    pub outcome: Outcome,
}

/// Every attempt of a run, from any number of clients.
#[derive(Default)]
pub struct History {
    attempts: Mutex<Vec<Attempt>>,
}

impl History {
    pub fn record(&self, stream: &str, payload: &str, outcome: Outcome) {
        self.attempts.lock().unwrap_or_else(|p| p.into_inner()).push(Attempt {
            stream: stream.into(),
            payload: payload.into(),
            outcome,
        });
    }

    pub fn attempts(&self) -> Vec<Attempt> {
        self.attempts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn acknowledged(&self) -> usize {
        self.attempts()
            .iter()
            .filter(|a| matches!(a.outcome, Outcome::Ok(_)))
            .count()
    }

    /// Checks the history against what each stream holds (`(offset, payload)` in read
    /// order); returns every violation found.
    pub fn check(&self, read_back: &HashMap<String, Vec<(u64, String)>>) -> Vec<String> {
        let mut problems = Vec::new();
        let attempts = self.attempts();
        let mut by_payload: HashMap<(&str, &str), &Attempt> = HashMap::new();
        for a in &attempts {
            by_payload.insert((a.stream.as_str(), a.payload.as_str()), a);
        }
        for (stream, records) in read_back {
            let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
            let mut last: Option<u64> = None;
            for (offset, payload) in records {
                if last.is_some_and(|l| *offset <= l) {
                    problems.push(format!("{stream}: offset {offset} after {last:?}: out of order"));
                }
                last = Some(*offset);
                if let Some(first) = seen.insert(payload, *offset) {
                    problems.push(format!("{stream}: '{payload}' read twice, at {first} and {offset}"));
                }
                match by_payload.get(&(stream.as_str(), payload.as_str())) {
                    None => problems.push(format!("{stream}: '{payload}' at {offset} was never appended")),
                    Some(a) if a.outcome == Outcome::Failed => {
                        problems.push(format!("{stream}: '{payload}' at {offset} was refused, yet applied"))
                    }
                    Some(a) => {
                        if let Outcome::Ok(acked) = a.outcome {
                            if acked != *offset {
                                problems.push(format!(
                                    "{stream}: '{payload}' acknowledged at {acked}, read at {offset}"
                                ));
                            }
                        }
                    }
                }
            }
        }
        for a in &attempts {
            if let Outcome::Ok(offset) = a.outcome {
                let found = read_back
                    .get(&a.stream)
                    .is_some_and(|r| r.iter().any(|(_, p)| p == &a.payload));
                if !found {
                    problems.push(format!(
                        "{}: acknowledged '{}' at {offset} is lost",
                        a.stream, a.payload
                    ));
                }
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(records: &[(u64, &str)]) -> HashMap<String, Vec<(u64, String)>> {
        HashMap::from([(
            "s".to_string(),
            records.iter().map(|(o, p)| (*o, p.to_string())).collect(),
        )])
    }

    #[test]
    fn the_checker_finds_lost_duplicated_and_phantom_records() {
        let h = History::default();
        h.record("s", "a", Outcome::Ok(0));
        h.record("s", "b", Outcome::Ok(1));
        h.record("s", "c", Outcome::Unknown);
        h.record("s", "d", Outcome::Failed);
        assert!(h.check(&read(&[(0, "a"), (1, "b"), (2, "c")])).is_empty());
        assert!(
            h.check(&read(&[(0, "a"), (1, "b")])).is_empty(),
            "unknown may be absent"
        );
        assert_eq!(h.check(&read(&[(0, "a")])).len(), 1, "lost b");
        assert!(!h.check(&read(&[(0, "a"), (1, "b"), (2, "b")])).is_empty(), "b twice");
        assert!(
            !h.check(&read(&[(0, "a"), (1, "b"), (2, "d")])).is_empty(),
            "refused d applied"
        );
        assert!(!h.check(&read(&[(0, "a"), (1, "b"), (2, "x")])).is_empty(), "phantom x");
        assert!(!h.check(&read(&[(1, "a"), (0, "b")])).is_empty(), "out of order");
    }
}
