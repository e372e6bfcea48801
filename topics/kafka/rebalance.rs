//! The consumer's context: before a rebalance takes partitions away, it waits (bounded) for the work
//! started on them and commits; it also routes librdkafka's log lines and lag statistics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::claims::Claims;
use super::offsets::OffsetTracker;

/// What a revocation asks of the process's transactions under exactly-once, which carry the
/// positions (the consumer commits none itself). Implemented by `transactions.rs`, above this file.
pub(super) trait Transacting: Send + Sync {
    /// Commits the open transaction, with the positions of `revoking`, the consumer whose
    /// partitions are taken (at its close, no other part of the process can reach it), then runs
    /// `then` before any publish can join the next one.
    fn commit_then(&self, revoking: &BaseConsumer<TrackingContext>, then: &dyn Fn());
    /// Aborts the open transaction and rewinds every consumer, then runs `then`.
    fn abort_then(&self, reason: &str, then: &dyn Fn());
}

pub(super) struct TrackingContext {
    pub(super) tracker: Arc<Mutex<OffsetTracker>>,
    /// How long a revocation waits for the revoked partitions' started work.
    pub(super) drain_timeout: Duration,
    /// Records behind the end of the partitions this consumer holds.
    pub(super) lag: prometheus::IntGauge,
    /// The consumer group, as the broker knows it.
    pub(super) group: String,
    /// Exactly-once: the process's transactions, which carry the positions (the consumer commits
    /// none itself).
    pub(super) transactions: Option<Weak<dyn Transacting>>,
    /// Each record's starts, where the group counts them: a revocation lets go of its records.
    pub(super) claims: Option<Arc<Claims>>,
    /// The group took this consumer's assignment while it was away, and gave it none since: a fence
    /// now is by its own rejoin (`fenced.rs`).
    pub(super) lost: AtomicBool,
}

impl TrackingContext {
    pub(super) fn lost_since_assigned(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

impl ClientContext for TrackingContext {
    // librdkafka's own log lines (set `debug` through LACUNA_KAFKA_DEBUG, e.g. "cgrp") go to tracing.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel::*;
        match level {
            Emerg | Alert | Critical | Error => tracing::error!(target: "librdkafka", facility, "{message}"),
            Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            Notice | Info => tracing::info!(target: "librdkafka", facility, "{message}"),
            Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        // Counted from the offset stored when a record is done (the runner stores each in order),
        // and from the committed one until this process has stored any: librdkafka's committed
        // offset is the consumer's own commits, which exactly-once never makes (its positions go in
        // the transactions), so it stays at what the group had when the process joined. -1 means
        // unknown; partition -1 is librdkafka's internal "unassigned" one.
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|topic| topic.partitions.iter())
            .filter(|(id, _)| **id >= 0)
            .map(|(_, partition)| {
                if partition.consumer_lag_stored >= 0 { partition.consumer_lag_stored } else { partition.consumer_lag }
            })
            .filter(|lag| *lag >= 0)
            .sum();
        self.lag.set(lag);
    }
}

impl ConsumerContext for TrackingContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            if let Rebalance::Assign(assigned) = rebalance
                && assigned.count() > 0
            {
                self.lost.store(false, Ordering::SeqCst);
            }
            return;
        };
        let partitions: Vec<(String, i32)> =
            revoked.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
        let revoke = || self.tracker.lock().unwrap().revoke(&partitions);
        let transactions = self.transactions.as_ref().and_then(Weak::upgrade);
        if consumer.assignment_lost() {
            self.lost.store(true, Ordering::SeqCst);
            // Another member owns them already (this one was away past session.timeout.ms): waiting
            // for their work or committing their positions would publish or commit what is the new
            // owner's now. Nothing done on them here counts: exactly-once aborts what the open
            // transaction holds and rewinds; at-least-once stores nothing more for them.
            tracing::warn!(
                partitions = partitions.len(),
                "the group gave these partitions away while this member was away: letting their work go"
            );
            match &transactions {
                Some(transactions) => transactions.abort_then("the consumer's assignment was lost", &revoke),
                None => revoke(),
            }
            if let Some(claims) = &self.claims {
                claims.forget(&partitions);
            }
            return;
        }
        // Let the work already started on the revoked partitions finish and be acknowledged, so
        // their new owner starts after it instead of doing it again. This holds up the rebalance,
        // hence the bound (keep it under max.poll.interval.ms). Nothing more of them is started
        // meanwhile: it would be done twice, here for nothing and again by the new owner.
        self.tracker.lock().unwrap().close(&partitions);
        let started = std::time::Instant::now();
        loop {
            let in_flight = self.tracker.lock().unwrap().started(&partitions);
            if in_flight == 0 {
                break;
            }
            if started.elapsed() >= self.drain_timeout {
                tracing::warn!(in_flight, "rebalance: kafka.drain_timeout_ms passed; the new owner redoes the rest");
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Work still running on them finds them gone when it finishes, and publishes nothing: the
        // new owner does it again from the position committed here.
        if let Some(transactions) = &transactions {
            // Forgotten before the next transaction takes outputs: work that finished after this
            // commit must not publish into it (exactly-once would carry both its outputs and the
            // new owner's).
            transactions.commit_then(consumer, &revoke);
        } else if self.transactions.is_some() {
            revoke();
        } else {
            if let Err(error) = consumer.commit_consumer_state(CommitMode::Sync)
                && !is_no_offset(&error)
            {
                tracing::warn!(%error, "commit before rebalance failed");
            }
            revoke();
        }
        // After the commit, outside the transaction's gate: what was let go is no crash.
        if let Some(claims) = &self.claims {
            claims.release(&partitions);
        }
        tracing::info!(
            partitions = partitions.len(),
            waited_ms = started.elapsed().as_millis() as u64,
            "partitions revoked"
        );
    }
}

pub(super) fn is_no_offset(error: &KafkaError) -> bool {
    matches!(error, KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset))
}

/// A consumer's context for unit tests: the group `g`, no transactions and no claims.
#[cfg(test)]
pub(super) fn context_for_tests(tracker: Arc<Mutex<OffsetTracker>>) -> TrackingContext {
    TrackingContext {
        tracker,
        drain_timeout: Duration::from_secs(2),
        lag: prometheus::IntGauge::new("lag", "lag").unwrap(),
        group: "g".into(),
        transactions: None,
        claims: None,
        lost: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use rdkafka::TopicPartitionList;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};

    use super::{OffsetTracker, TrackingContext};

    /// A revocation waits for the work started on its partitions. A record of them that the stage
    /// takes meanwhile would run only to have its outcome dropped (its partition is gone when it
    /// ends) and be done again by the new owner: one LLM call twice, and the wait longer
    /// (`tests/broker.rs`'s rebalance test saw 34 calls for 32 questions on a loaded machine).
    #[test]
    fn a_revocation_waiting_for_started_work_lets_no_new_record_of_its_partitions_start() {
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        let assignment = tracker.lock().unwrap().register("t", 0, 5);
        tracker.lock().unwrap().register("t", 0, 6);
        assert!(tracker.lock().unwrap().claim("t", 0, 5, assignment));
        let consumer: BaseConsumer<TrackingContext> = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("group.id", "g")
            .create_with_context(super::context_for_tests(tracker.clone()))
            .unwrap();
        let taken = std::thread::scope(|scope| {
            let revoking = scope.spawn(|| {
                let mut revoked = TopicPartitionList::new();
                revoked.add_partition("t", 0);
                consumer.context().pre_rebalance(&consumer, &Rebalance::Revoke(&revoked));
            });
            std::thread::sleep(Duration::from_millis(200));
            let taken = tracker.lock().unwrap().claim("t", 0, 6, assignment);
            tracker.lock().unwrap().ack("t", 0, 5, assignment);
            revoking.join().unwrap();
            taken
        });
        assert!(!taken, "offset 6 was taken while its partition's revocation waited for offset 5");
        assert!(!tracker.lock().unwrap().owns("t", 0, 5, assignment), "the partition was revoked");
    }
}
