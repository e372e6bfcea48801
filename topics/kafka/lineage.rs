//! Exactly-once across restarts of one replica (`kafka.instance_id`): each process writes under a
//! transactional id of its own, and the id it uses is kept on the broker before it writes, so that
//! the replica's next process can abort what this one left open and fence it should it still run.
//!
//! Why not one stable id per replica: the broker gives a re-initialised id the same producer id,
//! and a broker that lists an aborted transaction in fetches that start past its end (noida-db
//! 0.2.3, the test broker, does; Apache Kafka lists only those that reach the fetch's offset) makes
//! a read_committed consumer that starts reading after the abort marker skip every later record of
//! that producer id, so a restarted stage's outputs were lost to such readers. Why not a new id
//! alone: a transaction left open then blocks its partitions' readers until the broker times it
//! out (`kafka.transaction_timeout_ms`), and the test broker never does.
//!
//! The id is kept as the metadata of a committed offset, in a group of its own that is never
//! joined (`<prefix><group>.<instance>.producer`), as `claims` keeps record starts.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;

use super::wire::{OffsetNotes, transport};
use crate::config::KafkaSettings;
use crate::topics::bus::BusError;

/// How many times settling asks for an id's transactions, each for up to
/// `kafka.transaction_timeout_ms`: once more after an ask that found no coordinator in time (its
/// node killed, another still loading the transaction log). Renewals that gave up after one ask
/// ended their process in the failure matrix, and each restart settled the same id in under a second.
pub(super) const SETTLE_ASKS: u32 = 2;

/// Settles the transactions written under `id`: re-initialising it, which the broker answers only
/// once a commit under way has finished, aborts a transaction still open and fences the producer
/// that wrote it. What a crashed predecessor left (`succeed`) and a producer left behind (`renew`).
/// An ask that runs out of time is resumed by the next (librdkafka: "retry call to resume").
pub(super) fn settle(
    base: &ClientConfig,
    settings: &KafkaSettings,
    max_event_bytes: usize,
    id: &str,
    timeout: Duration,
) -> Result<(), BusError> {
    let settling = super::producer(base, settings, max_event_bytes, Some((id, timeout)))?;
    let mut asked = 1;
    loop {
        match settling.init_transactions(timeout) {
            Err(KafkaError::Transaction(error)) if error.is_retriable() && asked < SETTLE_ASKS => {
                tracing::warn!(transactional_id = id, %error, "no coordinator settled the transactional id in time: asking again");
                asked += 1;
            }
            outcome => return outcome.map_err(super::transactions::init_failed),
        }
    }
}

/// How the committed metadata names the id.
const PREFIX: &str = "lacuna-producer:";

pub(super) struct Lineage {
    notes: OffsetNotes,
    /// Any topic's partition 0 (the process's first input): the group commits an offset there.
    topic: String,
}

impl Lineage {
    /// The replica whose ids start with `stable` (`<prefix><group>.<instance>`), keeping them on
    /// `topic`, which must exist.
    pub(super) fn new(base: &ClientConfig, stable: &str, topic: &str) -> Result<Lineage, BusError> {
        let notes = OffsetNotes::new(base, &format!("{stable}.producer")).map_err(transport)?;
        Ok(Lineage { notes, topic: topic.to_string() })
    }

    /// The transactional id the replica's last process wrote under, if one did.
    pub(super) fn last(&self) -> Result<Option<String>, BusError> {
        Ok(decode(&self.notes.read(&self.topic, 0).map_err(transport)?))
    }

    /// `id` is the one this process writes under: kept before its first write.
    pub(super) fn record(&self, id: &str) -> Result<(), BusError> {
        self.notes.write(&self.topic, 0, 0, format!("{PREFIX}{id}")).map_err(transport)
    }
}

/// A new id under `stable` for this process: its start time in nanoseconds tells it apart.
pub(super) fn fresh_id(stable: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{stable}.{}", nanos.as_nanos())
}

fn decode(metadata: &str) -> Option<String> {
    metadata.strip_prefix(PREFIX).filter(|id| !id.is_empty()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_metadata_names_an_id() {
        assert_eq!(decode("lacuna-producer:p.stage.r0.17"), Some("p.stage.r0.17".into()));
        assert_eq!(decode(""), None);
        assert_eq!(decode("lacuna-producer:"), None);
        assert_eq!(decode("lacuna-done:3-5"), None);
    }

    /// Issue 74's transaction-coordinator row: a renewal whose settling found no coordinator within
    /// one `kafka.transaction_timeout_ms` (its node killed, another still loading the transaction
    /// log) ended its process, and the restart settled the same id in under a second. A coordinator
    /// back within a second timeout must settle the id in place. On librdkafka's mock cluster, its
    /// one broker down for 2.5 s and a 2 s timeout.
    #[test]
    fn a_settling_that_finds_no_coordinator_within_one_timeout_asks_again() {
        use std::time::Duration;

        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        let mut settings = crate::config::Settings::load(None).unwrap();
        settings.kafka.brokers = cluster.bootstrap_servers();
        let mut base = crate::topics::kafka::config::client_config(&settings.kafka).unwrap();
        // Reconnects every 100 ms, so the broker is found as soon as it is back.
        base.set("reconnect.backoff.max.ms", "100");
        cluster.broker_down(1).unwrap();
        let settling = std::thread::spawn(move || {
            super::settle(&base, &settings.kafka, 1 << 20, "settle-again", Duration::from_secs(2))
        });
        std::thread::sleep(Duration::from_millis(2500));
        cluster.broker_up(1).unwrap();
        let settled = settling.join().unwrap();
        assert!(settled.is_ok(), "the id was not settled: {settled:?}");
    }
}
