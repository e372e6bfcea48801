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

use rdkafka::config::ClientConfig;

use super::wire::{OffsetNotes, transport};
use crate::topics::bus::BusError;

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
}
