//! Reading a whole compacted topic (a table) from its beginning to its current end, outside any
//! consumer group: how the join reads its state back on start.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::leaders;
use super::wire::transport;
use crate::topics::Topic;
use crate::topics::bus::{BusError, Record};

/// Reads every partition of `name` from its beginning to its current end, outside any consumer group,
/// keeping the latest record per key.
pub(super) fn read_whole_topic(
    mut base: ClientConfig,
    group: &str,
    name: &str,
    topic: Topic,
) -> Result<Vec<Record>, BusError> {
    let timeout = Duration::from_secs(10);
    let consumer: BaseConsumer = base
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(transport)?;
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in leaders::partitions(&consumer, name, timeout)? {
        // Read from the beginning whatever the low watermark says: librdkafka has answered a low
        // mark equal to the high one when the leader moved between its two requests, which would
        // skip the partition's whole state. An empty partition ends at once with its EOF.
        let (_, high) = leaders::watermarks(&consumer, name, partition, timeout)?;
        if high > 0 {
            ends.insert(partition, high);
            assignment.add_partition_offset(name, partition, Offset::Beginning).map_err(transport)?;
        }
    }
    let mut table: HashMap<String, (usize, Vec<u8>)> = HashMap::new();
    let mut read = 0;
    if !ends.is_empty() {
        consumer.assign(&assignment).map_err(transport)?;
    }
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while !ends.is_empty() {
        if std::time::Instant::now() > give_up {
            return Err(BusError::Transport(format!("reading table {name} timed out")));
        }
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                ends.remove(&partition);
            }
            Some(Err(error)) => return Err(transport(error)),
            Some(Ok(message)) => {
                let key = message.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
                match message.payload() {
                    Some(payload) if !payload.is_empty() => {
                        read += 1;
                        table.insert(key, (read, payload.to_vec()));
                    }
                    _ => {
                        table.remove(&key);
                    }
                }
                if ends.get(&message.partition()).is_some_and(|end| message.offset() + 1 >= *end) {
                    ends.remove(&message.partition());
                }
            }
        }
    }
    let mut records: Vec<_> = table.into_iter().collect();
    records.sort_by_key(|(_, (order, _))| *order);
    Ok(records.into_iter().map(|(key, (_, payload))| Record::new(topic, key, payload)).collect())
}

#[cfg(test)]
mod tests {
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::*;

    /// Apache Kafka answers NotLeaderForPartition for a while after it creates a topic, and whenever
    /// a partition's leadership moves: a start-up that reads then must ask again, not fail.
    #[test]
    fn a_table_whose_leader_is_being_elected_is_read_once_it_is() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("join-state", 1, 1).unwrap();
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", cluster.bootstrap_servers());
        let producer: BaseProducer = base.create().unwrap();
        producer.send(BaseRecord::to("join-state").key("q1").payload("pending")).unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
        let not_leader = RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION;
        cluster.request_errors(RDKafkaApiKey::ListOffsets, &[not_leader; 3]);

        let records = read_whole_topic(base, "reader", "join-state", Topic::JoinState).expect("read once led");
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].key, "q1");
    }
}
