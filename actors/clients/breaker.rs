//! A circuit breaker per LLM endpoint, shared by every client in the process. Without it an outage
//! burns each call's retries and each event's attempts in seconds and turns every question in flight
//! into an error record. With it, once the endpoint failed `llm.breaker.failures` times in a row,
//! calls stop going out and wait; one of them at a time probes the endpoint, at growing, jittered
//! intervals, and the first success lets them all go again. Waiting calls hold their stage's
//! in-flight slots, so the stages stop consuming: the questions wait on the bus, not in error records.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
// tokio's clock, so that tests run an outage of minutes under a paused clock in milliseconds.
use tokio::time::Instant;

use super::backoff::jittered;
use crate::config::{BreakerSettings, LlmSettings};

#[derive(Debug)]
enum State {
    Closed {
        failures: u32,
    },
    /// No call goes out before `retry_at`; then one probe, which may hold the endpoint until
    /// `probe_until` (its request's timeout) before another is let through.
    Open {
        since: Instant,
        retry_at: Instant,
        interval: Duration,
        probe_until: Option<Instant>,
    },
}

pub struct Breaker {
    endpoint: String,
    settings: BreakerSettings,
    /// How long a probe may take before it counts as lost (the request timeout).
    probe_timeout: Duration,
    state: Mutex<State>,
    /// Whether the endpoint ever answered in this process, the start-up check included. One that never did is more likely a
    /// wrong address or a server still starting than an outage: its calls fail as they always did,
    /// after their retries, rather than wait for half an hour.
    ever_up: AtomicBool,
    closed: Notify,
}

/// The call waited `llm.breaker.max_wait_ms` for the circuit and gives up; the field is how long
/// the circuit has been open.
#[derive(Debug)]
pub struct OpenTooLong(pub Duration);

impl Breaker {
    /// The process's breaker for the endpoint of `llm`, made with its settings on first use.
    pub fn for_llm(llm: &LlmSettings) -> Arc<Breaker> {
        Self::for_endpoint(&llm.base_url, &llm.breaker, Duration::from_millis(llm.timeout_ms))
    }

    fn for_endpoint(endpoint: &str, settings: &BreakerSettings, probe_timeout: Duration) -> Arc<Breaker> {
        static BREAKERS: LazyLock<Mutex<HashMap<String, Arc<Breaker>>>> = LazyLock::new(Default::default);
        BREAKERS
            .lock()
            .unwrap()
            .entry(endpoint.to_string())
            .or_insert_with(|| {
                Arc::new(Breaker {
                    endpoint: endpoint.to_string(),
                    settings: settings.clone(),
                    probe_timeout,
                    state: Mutex::new(State::Closed { failures: 0 }),
                    ever_up: AtomicBool::new(false),
                    closed: Notify::new(),
                })
            })
            .clone()
    }

    /// `closed` or `open`, for an LLM call's span.
    pub fn state_name(&self) -> &'static str {
        match &*self.state.lock().unwrap() {
            State::Closed { .. } => "closed",
            State::Open { .. } => "open",
        }
    }

    /// When a call that starts now gives up waiting: `llm.breaker.max_wait_ms` from now.
    pub fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_millis(self.settings.max_wait_ms)
    }

    /// Returns once a call may go out: at once while the endpoint is healthy; while it is not,
    /// when this call is the next probe or a probe found the endpoint back. A call past its
    /// `give_up_at` ([`Breaker::deadline`]) gives up; the circuit does not: the next call due to
    /// probe still goes out, however long the endpoint has been down, so its first answer closes it.
    pub async fn pass(&self, give_up_at: Instant) -> Result<(), OpenTooLong> {
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            // Registered before the state is read, so a close in between is not missed.
            closed.as_mut().enable();
            let now = Instant::now();
            let wake_at = match &mut *self.state.lock().unwrap() {
                State::Closed { .. } => return Ok(()),
                State::Open { since, retry_at, probe_until, .. } => {
                    let next = match *probe_until {
                        Some(until) if now < until => until,
                        _ if now < *retry_at => *retry_at,
                        _ => {
                            *probe_until = Some(now + self.probe_timeout);
                            return Ok(());
                        }
                    };
                    if now >= give_up_at {
                        return Err(OpenTooLong(now.duration_since(*since)));
                    }
                    next.min(give_up_at)
                }
            };
            tokio::select! {
                _ = closed => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// The endpoint answered something, a gateway's 503 included: it is there, so a failure from
    /// now on is an outage to wait out rather than a wrong address. The start-up check calls this.
    pub fn seen(&self) {
        self.ever_up.store(true, Ordering::Relaxed);
    }

    /// The endpoint answered (even with an error of the caller's making): it is up.
    pub fn succeeded(&self) {
        self.seen();
        let mut state = self.state.lock().unwrap();
        if let State::Open { since, .. } = *state {
            tracing::warn!(endpoint = %self.endpoint, down_s = since.elapsed().as_secs(), "LLM endpoint back: circuit closed");
            crate::metrics::METRICS.llm_circuit_open.with_label_values(&[&self.endpoint]).set(0);
            self.closed.notify_waiters();
        }
        *state = State::Closed { failures: 0 };
    }

    /// A server's Retry-After, counted up to `max_probe_ms`: the longest this breaker waits between
    /// probes of its own accord. `Retry-After: 3600` would otherwise hold every call until it gives up
    /// at `max_wait_ms`, long after the endpoint is back.
    pub fn capped(&self, retry_after: Option<Duration>) -> Duration {
        retry_after.unwrap_or_default().min(Duration::from_millis(self.settings.max_probe_ms))
    }

    /// The endpoint failed in a way worth retrying (unreachable, timeout, 429, 5xx); `retry_after`
    /// is the server's own word on when to come back. True when the circuit is open: the caller
    /// waits in [`Breaker::pass`] rather than spending one of its retries.
    pub fn failed(&self, retry_after: Option<Duration>) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        let (since, interval) = match *state {
            State::Closed { .. } if !self.ever_up.load(Ordering::Relaxed) => return false,
            State::Closed { failures } if failures + 1 < self.settings.failures => {
                *state = State::Closed { failures: failures + 1 };
                return false;
            }
            State::Closed { .. } => {
                tracing::error!(endpoint = %self.endpoint, failures = self.settings.failures, "LLM endpoint failing: circuit open, calls wait for a probe");
                let m = &crate::metrics::METRICS;
                m.llm_circuit_open.with_label_values(&[&self.endpoint]).set(1);
                m.llm_circuit_opened.with_label_values(&[&self.endpoint]).inc();
                (now, Duration::from_millis(self.settings.probe_ms))
            }
            // A call sent before the circuit opened: the wait already set stands.
            State::Open { probe_until: None, .. } => return true,
            // A failed probe: wait longer before the next.
            State::Open { since, interval, .. } => {
                (since, (interval * 2).min(Duration::from_millis(self.settings.max_probe_ms)))
            }
        };
        let wait = jittered(interval).max(self.capped(retry_after));
        *state = State::Open { since, retry_at: now + wait, interval, probe_until: None };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Probes after 100 ms, doubling up to 400 ms; a call waits at most `max_wait_ms`.
    fn breaker(failures: u32, max_wait_ms: u64) -> Breaker {
        let settings = BreakerSettings { failures, probe_ms: 100, max_probe_ms: 400, max_wait_ms };
        Breaker {
            endpoint: "http://test".into(),
            settings,
            probe_timeout: Duration::from_millis(50),
            state: Mutex::new(State::Closed { failures: 0 }),
            ever_up: AtomicBool::new(true),
            closed: Notify::new(),
        }
    }

    /// The time `pass` took, or None when it gave up.
    async fn waited(breaker: &Breaker) -> Option<Duration> {
        let start = Instant::now();
        breaker.pass(breaker.deadline()).await.ok().map(|()| start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn the_circuit_opens_after_failures_in_a_row_and_a_call_then_waits_for_the_probe_time() {
        let breaker = breaker(3, 60_000);
        assert!(!breaker.failed(None) && !breaker.failed(None), "two failures: still closed");
        assert_eq!(waited(&breaker).await, Some(Duration::ZERO));
        assert!(breaker.failed(None), "the third opens it");
        let wait = waited(&breaker).await.expect("the call becomes the probe");
        assert!((Duration::from_millis(80)..=Duration::from_millis(120)).contains(&wait), "{wait:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_successful_probe_closes_the_circuit_and_lets_every_waiting_call_go() {
        let breaker = Arc::new(breaker(1, 60_000));
        breaker.failed(None);
        waited(&breaker).await.expect("the probe");
        // While the probe is out, the others wait for it.
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                tokio::spawn({
                    let breaker = breaker.clone();
                    async move { waited(&breaker).await }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        breaker.succeeded();
        for call in waiting {
            assert!(call.await.unwrap().is_some_and(|w| w <= Duration::from_millis(10)), "released by the close");
        }
        assert_eq!(waited(&breaker).await, Some(Duration::ZERO), "closed");
    }

    #[tokio::test(start_paused = true)]
    async fn each_failed_probe_doubles_the_wait_up_to_its_cap() {
        let breaker = breaker(1, 60_000);
        breaker.failed(None);
        let mut waits = Vec::new();
        for _ in 0..4 {
            waits.push(waited(&breaker).await.expect("a probe").as_millis());
            breaker.failed(None);
        }
        let within = |ms: u128, base: u128| (base * 8 / 10..=base * 12 / 10).contains(&ms);
        assert!(within(waits[0], 100) && within(waits[1], 200) && within(waits[2], 400), "{waits:?}");
        assert!(within(waits[3], 400), "capped at max_probe_ms: {waits:?}");
    }

    /// A server's Retry-After is its word on when to come back, not a licence to stay away for an
    /// hour: it counts up to `max_probe_ms`, so a call is not held for `max_wait_ms` and failed while
    /// the endpoint is back (issue 57, item 8).
    #[tokio::test(start_paused = true)]
    async fn a_retry_after_longer_than_the_longest_probe_interval_waits_only_that_long() {
        let breaker = breaker(1, 60_000);
        assert!(breaker.failed(Some(Duration::from_secs(3600))));
        let wait = waited(&breaker).await;
        assert!(wait.is_some_and(|w| w <= Duration::from_millis(480)), "waited {wait:?} for a probe");
        assert_eq!(breaker.capped(Some(Duration::from_millis(150))), Duration::from_millis(150), "a short one stands");
    }

    /// `max_wait_ms` bounds how long one call waits, not how long the endpoint may be down: after
    /// an outage longer than it, the next probe still goes out, finds the endpoint back and closes
    /// the circuit, and calls go through again without a restart.
    #[tokio::test(start_paused = true)]
    async fn after_an_outage_longer_than_max_wait_the_circuit_closes_when_the_endpoint_answers() {
        let breaker = breaker(1, 1_000);
        breaker.failed(None);
        // A ten-second outage: every probe fails.
        let outage_ends = Instant::now() + Duration::from_secs(10);
        while Instant::now() < outage_ends {
            match breaker.pass(breaker.deadline()).await {
                Ok(()) => {
                    breaker.failed(None);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        // The endpoint is back: the next call is let through as a probe, and it closes the circuit.
        let probe = tokio::time::timeout(Duration::from_secs(2), breaker.pass(breaker.deadline())).await;
        assert!(matches!(probe, Ok(Ok(()))), "a call after the outage went out as a probe: {probe:?}");
        breaker.succeeded();
        assert_eq!(waited(&breaker).await, Some(Duration::ZERO), "closed: calls go out at once");
    }
}
