//! The gate a commit closes: an event between its first output and its acknowledgement holds a
//! [`Pass`], and a commit waits for every pass to be given back (and keeps new ones out) so that a
//! transaction never holds part of an event. How long each hold lasts is measured, since the broker
//! aborts a transaction left open past `kafka.transaction_timeout_ms`.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

/// Commits wait for every holder to leave; holders wait while a commit runs.
#[derive(Default)]
pub(super) struct Gate {
    state: Mutex<GateState>,
    drained: Condvar,
    opened: tokio::sync::Notify,
}

#[derive(Default)]
struct GateState {
    holders: usize,
    closed: bool,
    /// Since when a commit (or a recovery) has kept it closed.
    closed_at: Option<tokio::time::Instant>,
}

/// Keeps commits out while it lives; how long it lived is a hold of the open transaction.
pub struct Pass(Arc<Gate>, std::time::Instant);

impl Drop for Pass {
    fn drop(&mut self) {
        {
            let mut state = self.0.state.lock().unwrap();
            state.holders -= 1;
            if state.holders == 0 {
                self.0.drained.notify_all();
            }
        }
        held("event", self.1.elapsed());
    }
}

/// Records a hold inside the open transaction: a commit waits for every event's, and the broker
/// aborts a transaction open longer than `kafka.transaction_timeout_ms`.
pub(super) fn held(holder: &str, duration: Duration) {
    let metrics = &crate::metrics::METRICS;
    metrics.transaction_hold_seconds.with_label_values(&[holder]).observe(duration.as_secs_f64());
    let longest = metrics.transaction_longest_hold_seconds.with_label_values(&[holder]);
    if duration.as_secs_f64() > longest.get() {
        longest.set(duration.as_secs_f64());
    }
}

/// What each hold inside a transaction may take at worst, of `kafka.transaction_timeout_ms`: half,
/// so that a hold and the commit after it together stay inside the timeout, and the broker never
/// aborts a transaction only because one call was slow.
pub(super) fn hold_budget(transaction_timeout: Duration) -> Duration {
    transaction_timeout / 2
}

impl Gate {
    pub(super) async fn enter(self: &Arc<Self>) -> Pass {
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            // Registered before the check, so an opening between the two is not missed.
            opened.as_mut().enable();
            {
                let mut state = self.state.lock().unwrap();
                if !state.closed {
                    state.holders += 1;
                    return Pass(self.clone(), std::time::Instant::now());
                }
            }
            opened.await;
        }
    }

    /// Blocks until no one holds a pass, and keeps new ones out until [`Gate::open`].
    pub(super) fn close(&self) {
        let mut state = self.state.lock().unwrap();
        state.closed = true;
        state.closed_at = Some(tokio::time::Instant::now());
        while state.holders > 0 {
            state = self.drained.wait(state).unwrap();
        }
    }

    pub(super) fn open(&self) {
        {
            let mut state = self.state.lock().unwrap();
            state.closed = false;
            state.closed_at = None;
        }
        self.opened.notify_waiters();
    }

    /// How long a commit has kept the gate closed, if one does.
    fn closed_for(&self) -> Option<Duration> {
        self.state.lock().unwrap().closed_at.map(|at| at.elapsed())
    }
}

/// Calls `on_stuck` once the gate has stayed closed longer than `limit`, then returns; returns
/// too once the gate is gone. A commit's broker calls are each bounded, so only a librdkafka call
/// that outlives its own timeout keeps the gate closed that long (librdkafka#5456:
/// `send_offsets_to_transaction` waits for a group coordinator that is gone), and nothing in the
/// process can end such a call.
pub(super) async fn watch(gate: Weak<Gate>, limit: Duration, on_stuck: impl FnOnce(Duration)) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(gate) = gate.upgrade() else { return };
        if let Some(closed) = gate.closed_for().filter(|closed| *closed > limit) {
            on_stuck(closed);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finding 4 of issue 74: every hold inside a transaction is timed, and the longest is shown, so
    /// that one near `kafka.transaction_timeout_ms` (the broker then aborts) is seen before it costs.
    #[tokio::test]
    async fn a_hold_inside_a_transaction_is_timed_and_the_longest_kept() {
        let gate = Arc::new(Gate::default());
        let histogram = crate::metrics::METRICS.transaction_hold_seconds.with_label_values(&["event"]);
        let before = histogram.get_sample_count();
        let pass = gate.enter().await;
        std::thread::sleep(Duration::from_millis(60));
        drop(pass);
        assert!(histogram.get_sample_count() > before);
        let longest = crate::metrics::METRICS.transaction_longest_hold_seconds.with_label_values(&["event"]).get();
        assert!(longest >= 0.06, "{longest}");
        held("event", Duration::from_millis(10));
        assert!(crate::metrics::METRICS.transaction_longest_hold_seconds.with_label_values(&["event"]).get() >= 0.06);
        assert_eq!(hold_budget(Duration::from_secs(10)), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_commit_waits_for_holders_and_keeps_new_ones_out() {
        let gate = Arc::new(Gate::default());
        let held = gate.enter().await;
        let closer = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.close();
                std::thread::sleep(Duration::from_millis(50));
                gate.open();
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!closer.is_finished(), "the commit waits for the pass held");
        drop(held);
        let entered = tokio::time::timeout(Duration::from_secs(5), gate.enter()).await;
        assert!(entered.is_ok(), "a new pass is given once the commit is done");
        closer.join().unwrap();
    }

    /// A commit whose librdkafka call outlives every timeout it was given keeps the gate closed,
    /// and every event of the process waits at it, for good: `send_offsets_to_transaction` waits
    /// for a group coordinator that is gone (librdkafka#5456, #5511; seen as a three-node run in
    /// which a stage held one event for minutes after a node was killed). The gate's watch sees the
    /// gate closed past its limit and says so once; a gate that opens in time is left alone.
    #[tokio::test(start_paused = true)]
    async fn a_gate_closed_past_its_limit_is_reported_and_one_that_opens_in_time_is_not() {
        let limit = Duration::from_secs(40);
        let gate = Arc::new(Gate::default());
        let (stuck, mut reported) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(watch(Arc::downgrade(&gate), limit, move |closed| stuck.send(closed).unwrap()));

        gate.close();
        tokio::time::sleep(limit - Duration::from_secs(5)).await;
        gate.open();
        tokio::time::sleep(limit).await;
        assert!(reported.try_recv().is_err(), "a commit that ended in time is no hang");

        gate.close();
        tokio::time::sleep(limit + Duration::from_secs(2)).await;
        let closed = reported.try_recv().expect("reported once the gate stayed closed past the limit");
        assert!(closed > limit, "{closed:?}");
        tokio::time::sleep(limit).await;
        assert!(reported.try_recv().is_err(), "reported once");
    }
}
