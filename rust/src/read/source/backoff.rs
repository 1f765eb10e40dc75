//! Exponential backoff with jitter between retries of one stream, and the server's
//! `Retry-After` (429 / 503) honoured in full.
//!
//! Jitter matters: when a server hiccups, every rank of a job fails at the same moment; without
//! it they would all retry in lockstep and hit the server together again. That holds for a
//! `Retry-After` too: a thousand ranks told "wait 30 s" must not all return at second 30.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::rng::{mix64, SplitMix64};

/// The delay rule's parameters (from `SourceOptions`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BackoffRule {
    pub initial: Duration,
    pub max: Duration,
    /// The longest `Retry-After` waited for; a longer one fails the read (`TooLong`).
    pub retry_after_max: Duration,
}

/// Jitter added on top of a `Retry-After`: up to a fifth of it, at most this much.
const RETRY_AFTER_JITTER_MAX: Duration = Duration::from_secs(30);

/// What to do before retry number `attempt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    Sleep(Duration),
    /// The server asked for a wait longer than `retry_after_max`: give up instead of sleeping.
    TooLong(Duration),
}

/// Delay before retry number `attempt` (1-based).
/// - Without a hint: uniform in [d/2, d], d = min(max, initial * 2^(attempt-1)).
/// - With `Retry-After: h` (h <= `retry_after_max`): the larger of that and h + j, where j is
///   uniform in (0, min(h/5, 30 s)] plus 1 ms, so the retry is never before the server's time.
/// - h > `retry_after_max`: `TooLong(h)`.
pub(crate) fn retry_delay(
    attempt: u32,
    hint: Option<Duration>,
    rule: &BackoffRule,
    rng: &mut SplitMix64,
) -> Wait {
    let max = rule.max.max(rule.initial);
    let doubling = 1u32 << attempt.saturating_sub(1).min(20);
    let ceiling = rule.initial.saturating_mul(doubling).min(max);
    let half = ceiling / 2;
    let backoff = half + Duration::from_nanos(rng.below(half.as_nanos().max(1) as u64));
    match hint {
        None => Wait::Sleep(backoff),
        Some(h) if h > rule.retry_after_max => Wait::TooLong(h),
        Some(h) => {
            let spread = (h / 5).min(RETRY_AFTER_JITTER_MAX);
            let jitter = Duration::from_millis(1)
                + Duration::from_nanos(rng.below(spread.as_nanos().max(1) as u64));
            Wait::Sleep(backoff.max(h + jitter))
        }
    }
}

pub(crate) struct Backoff {
    rule: BackoffRule,
    rng: SplitMix64,
}

impl Backoff {
    pub(crate) fn new(rule: BackoffRule) -> Self {
        // Not a reproducibility concern: only the timing of retries depends on this seed, and it
        // must differ between processes and threads so that they spread out.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let local = &nanos as *const u64 as u64;
        let seed = mix64(nanos ^ mix64(std::process::id() as u64) ^ mix64(local));
        Self {
            rule,
            rng: SplitMix64::new(seed),
        }
    }

    pub(crate) fn retry_after_max(&self) -> Duration {
        self.rule.retry_after_max
    }

    pub(crate) fn delay(&mut self, attempt: u32, server_hint: Option<Duration>) -> Wait {
        retry_delay(attempt, server_hint, &self.rule, &mut self.rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(initial_ms: u64, max_ms: u64, retry_after_max_s: u64) -> BackoffRule {
        BackoffRule {
            initial: Duration::from_millis(initial_ms),
            max: Duration::from_millis(max_ms),
            retry_after_max: Duration::from_secs(retry_after_max_s),
        }
    }

    fn sleep(w: Wait) -> Duration {
        match w {
            Wait::Sleep(d) => d,
            Wait::TooLong(h) => panic!("gave up on {h:?}"),
        }
    }

    #[test]
    fn delays_grow_stay_bounded_and_vary() {
        let mut b = Backoff::new(rule(100, 2000, 300));
        let d1 = sleep(b.delay(1, None));
        assert!(
            d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100),
            "{d1:?}"
        );
        let d4 = sleep(b.delay(4, None));
        assert!(
            d4 >= Duration::from_millis(400) && d4 <= Duration::from_millis(800),
            "{d4:?}"
        );
        for attempt in 10..40 {
            assert!(sleep(b.delay(attempt, None)) <= Duration::from_secs(2));
        }
        let samples: Vec<_> = (0..20).map(|_| sleep(b.delay(6, None))).collect();
        assert!(samples.iter().any(|d| *d != samples[0]), "no jitter");
    }

    #[test]
    fn a_retry_after_longer_than_backoff_max_is_waited_in_full_plus_jitter() {
        let r = rule(100, 2000, 300);
        let mut rng = SplitMix64::new(7);
        let hint = Duration::from_secs(60);
        let waits: Vec<_> = (0..200)
            .map(|i| sleep(retry_delay(1 + i % 5, Some(hint), &r, &mut rng)))
            .collect();
        for w in &waits {
            assert!(*w > hint, "{w:?} is not after the server's 60 s");
            assert!(
                *w <= hint + Duration::from_secs(12) + Duration::from_millis(1),
                "{w:?}"
            );
        }
        let distinct: std::collections::HashSet<_> = waits.iter().collect();
        assert!(distinct.len() > 150, "Retry-After waits are not spread out");
        // The jitter reaches well into its range (a fifth of 60 s), not only its start.
        assert!(waits.iter().any(|w| *w > hint + Duration::from_secs(9)));
    }

    #[test]
    fn a_short_retry_after_still_gets_positive_jitter_and_never_undercuts_the_backoff() {
        let r = rule(100, 2000, 300);
        let mut rng = SplitMix64::new(11);
        let hint = Duration::from_secs(1);
        for _ in 0..100 {
            let w = sleep(retry_delay(1, Some(hint), &r, &mut rng));
            assert!(w > hint && w <= hint + Duration::from_millis(201), "{w:?}");
            // Attempt 8: the backoff alone is in [1 s, 2 s] (capped at max), the hint 1 s.
            let w8 = sleep(retry_delay(8, Some(hint), &r, &mut rng));
            assert!(w8 >= Duration::from_secs(1), "{w8:?}");
        }
        // Retry-After: 0 means "now": the ordinary backoff applies.
        let w0 = sleep(retry_delay(1, Some(Duration::ZERO), &r, &mut rng));
        assert!(w0 >= Duration::from_millis(50), "{w0:?}");
    }

    #[test]
    fn a_retry_after_over_the_ceiling_gives_up_and_names_the_servers_wait() {
        let r = rule(100, 2000, 300);
        let mut rng = SplitMix64::new(3);
        let hour = Duration::from_secs(3600);
        assert_eq!(
            retry_delay(1, Some(hour), &r, &mut rng),
            Wait::TooLong(hour)
        );
        let at = Duration::from_secs(300);
        let w = sleep(retry_delay(1, Some(at), &r, &mut rng));
        assert!(w > at && w <= at + Duration::from_secs(30) + Duration::from_millis(1));
    }
}
