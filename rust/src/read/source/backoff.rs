//! Exponential backoff with jitter between retries of one stream.
//!
//! Jitter matters: when a server hiccups, every rank of a job fails at the same moment; without
//! it they would all retry in lockstep and hit the server together again.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::rng::{mix64, SplitMix64};

pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    rng: SplitMix64,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        // Not a reproducibility concern: only the timing of retries depends on this seed, and it
        // must differ between processes and threads so that they spread out.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let local = &nanos as *const u64 as u64;
        let seed = mix64(nanos ^ mix64(std::process::id() as u64) ^ mix64(local));
        Self {
            initial,
            max: max.max(initial),
            rng: SplitMix64::new(seed),
        }
    }

    /// Delay before retry number `attempt` (1-based): uniform in [d/2, d] where
    /// d = min(max, initial * 2^(attempt-1)); at least `server_hint` (Retry-After), capped at `max`.
    pub(crate) fn delay(&mut self, attempt: u32, server_hint: Option<Duration>) -> Duration {
        let doubling = 1u32 << attempt.saturating_sub(1).min(20);
        let ceiling = self.initial.saturating_mul(doubling).min(self.max);
        let half = ceiling / 2;
        let jitter_nanos = self.rng.below(half.as_nanos().max(1) as u64);
        let delay = half + Duration::from_nanos(jitter_nanos);
        match server_hint {
            Some(hint) => delay.max(hint.min(self.max)),
            None => delay,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_stay_bounded_and_vary() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let d1 = b.delay(1, None);
        assert!(
            d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100),
            "{d1:?}"
        );
        let d4 = b.delay(4, None);
        assert!(
            d4 >= Duration::from_millis(400) && d4 <= Duration::from_millis(800),
            "{d4:?}"
        );
        for attempt in 10..40 {
            assert!(b.delay(attempt, None) <= Duration::from_secs(2));
        }
        let samples: Vec<_> = (0..20).map(|_| b.delay(6, None)).collect();
        assert!(samples.iter().any(|d| *d != samples[0]), "no jitter");
        assert!(b.delay(1, Some(Duration::from_secs(1))) >= Duration::from_secs(1));
        assert!(b.delay(1, Some(Duration::from_secs(60))) <= Duration::from_secs(2));
    }
}
