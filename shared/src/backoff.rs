//! A doubling retry delay: the first wait, then twice the last, up to a cap; back to
//! the first after a success.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The wait before the next attempt; each call doubles the one after, up to the cap.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
        let waits: Vec<u64> = (0..10).map(|_| b.next_wait().as_millis() as u64).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        b.reset();
        assert_eq!(b.next_wait(), Duration::from_millis(250));
    }
}
