//! Kafka connections per authenticated principal (issue 19): a token may hold at most
//! `--kafka-max-connections-per-principal` connections at once on this gateway, so one
//! leaked or shared credential cannot take every slot. A connection past it fails its
//! SASL authentication, naming the flag.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Open authenticated connections per principal.
pub struct Principals {
    max: usize,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

/// One connection's place in its principal's count, given back when it closes.
pub struct PrincipalSlot {
    name: String,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

impl Principals {
    pub fn new(max: usize) -> Self {
        Principals {
            max,
            open: Default::default(),
        }
    }

    /// A slot for one more connection of `name`, unless it has `max` already.
    pub fn take(&self, name: &str) -> Result<PrincipalSlot, String> {
        let mut open = self.open.lock().expect("principal counts");
        let n = open.entry(name.to_string()).or_default();
        if *n >= self.max {
            weir_shared::listener::count_refused("kafka", "max_connections_per_principal");
            return Err(format!(
                "token '{name}' already has {} Kafka connections to this gateway (--kafka-max-connections-per-principal)",
                self.max
            ));
        }
        *n += 1;
        Ok(PrincipalSlot {
            name: name.to_string(),
            open: self.open.clone(),
        })
    }
}

impl Drop for PrincipalSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().expect("principal counts");
        if let Some(n) = open.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 19: connections per principal.
    #[test]
    fn a_principal_holds_at_most_its_share_and_gets_slots_back() {
        let p = Principals::new(2);
        let a = p.take("app").expect("first");
        let _b = p.take("app").expect("second");
        let refused = p.take("app").err().expect("a third is refused");
        assert!(refused.contains("--kafka-max-connections-per-principal"), "{refused}");
        assert!(p.take("other").is_ok(), "another principal is not affected");
        drop(a);
        assert!(p.take("app").is_ok(), "a closed connection's slot comes back");
    }
}
