//! A transactional producer's initialisation, and the settling of an id another producer left:
//! what a restarted replica does with its predecessor's id, and what a renewal does with the id of
//! the producer it replaces. A broker that cannot do transactions is told at start.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, Producer};

use super::wire::transport;
use crate::topics::bus::BusError;

/// Initialises `producer`'s transactions. A broker that cannot do them (librdkafka finds no broker
/// with the transactions API, or the broker refuses the version it needs) is named as such, with
/// the setting that runs without them: the process stops at start rather than at its first commit.
pub(super) fn init_transactions(producer: &FutureProducer, timeout: Duration) -> Result<(), BusError> {
    producer.init_transactions(timeout).map_err(init_failed)
}

/// How many times settling asks for an id's transactions, each for up to
/// `kafka.transaction_timeout_ms`: once more after an ask that found no coordinator in time (its
/// node killed, another still loading the transaction log). Renewals that gave up after one ask
/// ended their process in the failure matrix, and each restart settled the same id in under a second.
pub(super) const SETTLE_ASKS: u32 = 2;

/// Settles the transactions written under `id` by `settling`, a producer made under that id:
/// re-initialising it, which the broker answers only once a commit under way has finished, aborts a
/// transaction still open and fences the producer that wrote it. An ask that runs out of time is
/// resumed by the next (librdkafka: "retry call to resume").
pub(super) fn settle(settling: &FutureProducer, id: &str, timeout: Duration) -> Result<(), BusError> {
    let mut asked = 1;
    loop {
        match settling.init_transactions(timeout) {
            Err(KafkaError::Transaction(error)) if error.is_retriable() && asked < SETTLE_ASKS => {
                tracing::warn!(transactional_id = id, %error, "no coordinator settled the transactional id in time: asking again");
                asked += 1;
            }
            outcome => return outcome.map_err(init_failed),
        }
    }
}

/// Why transactions could not be initialised, as [`init_transactions`] says it.
fn init_failed(error: KafkaError) -> BusError {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::UnsupportedFeature | RDKafkaErrorCode::UnsupportedVersion) => BusError::Config(format!(
            "exactly-once (bus.delivery = \"exactly_once\") needs Kafka transactions, and this broker cannot do \
             them: {error}. Run with bus.delivery = \"at_least_once\" (LACUNA__BUS__DELIVERY=at_least_once), or on \
             a broker with transactions (Apache Kafka 2.5 or later)"
        )),
        _ => transport(error),
    }
}

#[cfg(test)]
mod tests {
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
            crate::topics::kafka::settle(&base, &settings.kafka, 1 << 20, "settle-again", Duration::from_secs(2))
        });
        std::thread::sleep(Duration::from_millis(2500));
        cluster.broker_up(1).unwrap();
        let settled = settling.join().unwrap();
        assert!(settled.is_ok(), "the id was not settled: {settled:?}");
    }
}
