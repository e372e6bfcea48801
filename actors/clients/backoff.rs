//! How long a client waits before trying again: doubling backoff with jitter for retries, and jitter
//! alone for periodic probes.

use std::time::Duration;

/// The pause before retry `attempt` (from 1): `base_ms`, doubled per attempt, at most six times,
/// ±20%. Every retry loop (LLM calls, Meilisearch calls, events, publishes) waits this way; the
/// jitter keeps the replicas that one outage failed together from retrying together.
pub fn backoff(base_ms: u64, attempt: u32) -> Duration {
    jittered(Duration::from_millis(base_ms.saturating_mul(1 << attempt.saturating_sub(1).min(6))))
}

/// `interval` ±20%, so that many processes waiting on one endpoint spread out.
pub fn jittered(interval: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let factor = 0.8 + 0.4 * f64::from(nanos % 1000) / 1000.0;
    interval.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    #[test]
    fn backoff_doubles_within_a_fifth_either_way() {
        for (attempt, base) in [(1, 100.0), (2, 200.0), (3, 400.0), (9, 6400.0)] {
            let ms = super::backoff(100, attempt).as_secs_f64() * 1000.0;
            assert!((0.8 * base..=1.2 * base).contains(&ms), "attempt {attempt}: {ms} ms");
        }
    }
}
