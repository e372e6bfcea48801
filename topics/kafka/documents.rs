//! The corpus's changelog on Kafka: one compacted `<kafka.topic_prefix>documents` topic per
//! deployment, shared by every pipeline (the prefix as configured, never a pipeline's own). A
//! record is one whole document, keyed by its id, as `lacuna ingest` reads it; a tombstone deletes
//! the document.
//!
//! Keyed by document, not by passage: a new version of a document is then one record that replaces
//! all of its passages at once, and compaction keeps exactly its latest version. Keyed by passage, a
//! shorter new version would need a tombstone for each passage it no longer has, written by whoever
//! knew the old version's length. Each replica splits documents into passages by the same rule
//! (`Document::passages`, `search.passage_words`).

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::KafkaBus;
use super::leaders;
use super::wire::transport;
use crate::topics::bus::BusError;

const TIMEOUT: Duration = Duration::from_secs(10);

/// One record of the changelog: a document's new version, or its deletion (`document: None`).
pub struct Change {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub document: Option<Vec<u8>>,
}

/// A record of the documents topic that is not a valid document, as the dead letter a replica
/// publishes for it on `<kafka.topic_prefix>documents-dead-letters`. Keyed by where the record sits
/// (`<partition>/<offset>`) on a compacted topic: every replica that reads it writes the same key, so
/// compaction keeps one dead letter per bad record however many replicas follow the topic.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RejectedDocument {
    pub partition: i32,
    pub offset: i64,
    /// The record's key: the document id it claims.
    pub key: String,
    /// Why it is not a document.
    pub error: String,
    /// The record's value as text (lossy only when it was not UTF-8).
    pub payload: String,
}

impl RejectedDocument {
    pub fn dead_letter_key(&self) -> String {
        format!("{}/{}", self.partition, self.offset)
    }
}

/// What a partition holds now: records from `low` (the earliest retention and compaction left) to
/// `high` (the next offset to be written).
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub partition: i32,
    pub low: i64,
    pub high: i64,
}

impl KafkaBus {
    pub fn documents_topic(&self) -> String {
        format!("{}documents", self.settings.topic_prefix)
    }

    /// Where replicas put the documents topic's records that are not documents ([`RejectedDocument`]).
    pub fn documents_dead_letters_topic(&self) -> String {
        format!("{}documents-dead-letters", self.settings.topic_prefix)
    }

    /// Creates the documents topic and its dead letters' topic, both compacted, when they do not
    /// exist yet. A process that may write or read them need not be allowed to create them
    /// ([`KafkaBus::create_unseen`]): `lacuna ingest`, serve and the corpus's followers only ask
    /// for the ones they cannot see.
    pub async fn ensure_documents_topic(&self) -> Result<(), BusError> {
        let names = vec![self.documents_topic(), self.documents_dead_letters_topic()];
        self.create_unseen(names, |_| true).await
    }

    /// How long compaction keeps the documents topic's tombstones: its `delete.retention.ms`, or
    /// `kafka.documents_delete_retention_ms` where the broker does not say (DescribeConfigs refused
    /// or failed); why not, where neither does. Nothing is assumed: a follower that took a day for
    /// a topic keeping tombstones an hour would resume after missing deletions.
    pub async fn tombstone_retention(&self) -> Result<Duration, String> {
        let topic = self.documents_topic();
        let read = async {
            let admin: AdminClient<DefaultClientContext> = self.base.create().map_err(transport)?;
            let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
            let described = admin.describe_configs(&[ResourceSpecifier::Topic(&topic)], &options).await;
            let resource = described.map_err(transport)?.into_iter().next();
            let resource = resource.ok_or_else(|| BusError::Transport("no answer".into()))?.map_err(transport)?;
            let value = resource.get("delete.retention.ms").and_then(|entry| entry.value.clone());
            Ok::<_, BusError>(value.and_then(|ms| ms.parse::<u64>().ok()))
        };
        let why = match read.await {
            Ok(Some(ms)) => return Ok(Duration::from_millis(ms)),
            Ok(None) => "not in the configuration it describes".to_string(),
            Err(error) => error.to_string(),
        };
        match self.settings.documents_delete_retention_ms {
            0 => Err(format!(
                "cannot read the delete.retention.ms of topic {topic} ({why}): grant this client DescribeConfigs on \
                 it (docs/kafka.md, ACLs), or set kafka.documents_delete_retention_ms to that topic's \
                 delete.retention.ms"
            )),
            ms => {
                tracing::warn!(%why, topic, ms, "cannot read the topic's delete.retention.ms: taking kafka.documents_delete_retention_ms");
                Ok(Duration::from_millis(ms))
            }
        }
    }

    /// Publishes a document's new version (its JSON), or with `None` its deletion.
    pub async fn publish_document(&self, id: &str, document: Option<&[u8]>) -> Result<(), BusError> {
        let name = self.documents_topic();
        let mut record = FutureRecord::to(&name).key(id.as_bytes());
        if let Some(document) = document {
            record = record.payload(document);
        }
        self.send(record).await
    }

    /// Publishes the dead letter of a documents-topic record that is not a document.
    pub async fn publish_rejected_document(&self, rejected: &RejectedDocument) -> Result<(), BusError> {
        let name = self.documents_dead_letters_topic();
        let key = rejected.dead_letter_key();
        let payload = serde_json::to_vec(rejected).expect("a dead letter serialises");
        self.send(FutureRecord::to(&name).key(key.as_bytes()).payload(&payload)).await
    }

    /// A reader of the changelog outside any consumer group: every replica reads every partition.
    pub fn changelog(&self) -> Result<Changelog, BusError> {
        self.reader_of(&self.documents_topic())
    }

    /// A reader of a compacted topic of this deployment (`changelog`'s kind), for any topic name.
    pub fn reader_of(&self, topic: &str) -> Result<Changelog, BusError> {
        let group = format!("{}documents-reader", self.settings.topic_prefix);
        let consumer: BaseConsumer = self
            .base
            .clone()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // An offset out of range is read from the start, never from the end: a follower must
            // not skip records it has not applied.
            .set("auto.offset.reset", "earliest")
            .create()
            .map_err(transport)?;
        Ok(Changelog { consumer, topic: topic.to_string() })
    }
}

/// Blocking: a replica's materialiser runs it on a thread of its own.
pub struct Changelog {
    consumer: BaseConsumer,
    topic: String,
}

impl Changelog {
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Every partition of the topic, with its watermarks now.
    pub fn spans(&self) -> Result<Vec<Span>, BusError> {
        let mut spans = Vec::new();
        for partition in leaders::partitions(&self.consumer, &self.topic, TIMEOUT)? {
            let (low, high) = leaders::watermarks(&self.consumer, &self.topic, partition, TIMEOUT)?;
            spans.push(Span { partition, low, high });
        }
        spans.sort_by_key(|s| s.partition);
        Ok(spans)
    }

    /// Starts reading each partition at its offset in `from`.
    pub fn start(&self, from: &HashMap<i32, i64>) -> Result<(), BusError> {
        let mut assignment = TopicPartitionList::new();
        for (&partition, &offset) in from {
            assignment.add_partition_offset(&self.topic, partition, Offset::Offset(offset)).map_err(transport)?;
        }
        self.consumer.assign(&assignment).map_err(transport)
    }

    /// The next record, if one comes within `timeout`.
    pub fn poll(&self, timeout: Duration) -> Result<Option<Change>, BusError> {
        match self.consumer.poll(timeout) {
            None => Ok(None),
            Some(Err(error)) => Err(transport(error)),
            Some(Ok(message)) => Ok(Some(Change {
                partition: message.partition(),
                offset: message.offset(),
                key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default(),
                document: message.payload().filter(|p| !p.is_empty()).map(<[u8]>::to_vec),
            })),
        }
    }

    /// Sets each partition's end in `ends` to its high watermark now (a broker round trip each), for
    /// the lag metric; a partition the broker does not answer for keeps its old end. Whether every
    /// one was answered.
    pub fn refresh_ends(&self, ends: &mut HashMap<i32, i64>) -> bool {
        let mut all = true;
        for (&partition, end) in ends.iter_mut() {
            match self.consumer.fetch_watermarks(&self.topic, partition, Duration::from_secs(1)) {
                Ok((_, high)) => *end = high,
                Err(_) => all = false,
            }
        }
        all
    }
}
