//! The embedded bus: one bounded channel per topic inside the process. Publishing into a full topic
//! waits, which is the backpressure. Nothing survives the process, so acknowledgements are no-ops.
//! Table topics are a map per topic, which outlives a stage restarted inside the process.

use std::collections::{BTreeMap, HashMap};
use std::future::poll_fn;
use std::sync::Mutex;
use std::task::Poll;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::Topic;
use super::bus::{Bus, BusError, Delivery, Record, Subscription};

struct Channel {
    sender: mpsc::Sender<Record>,
    // Taken by the topic's single consumer: in one process each topic has one consuming stage.
    receiver: Mutex<Option<mpsc::Receiver<Record>>>,
}

/// A table topic: key -> (insertion number, payload), so reads keep the order of writes.
type Table = BTreeMap<String, (u64, Vec<u8>)>;

pub struct InProcessBus {
    channels: HashMap<Topic, Channel>,
    tables: Mutex<HashMap<Topic, Table>>,
    writes: std::sync::atomic::AtomicU64,
}

impl InProcessBus {
    pub fn new(capacity: usize) -> Self {
        let channels = Topic::ALL
            .into_iter()
            .map(|topic| {
                let (sender, receiver) = mpsc::channel(capacity.max(1));
                (topic, Channel { sender, receiver: Mutex::new(Some(receiver)) })
            })
            .collect();
        InProcessBus { channels, tables: Mutex::default(), writes: Default::default() }
    }
}

#[async_trait]
impl Bus for InProcessBus {
    async fn publish(&self, mut record: Record) -> Result<(), BusError> {
        // The publishing span's context goes with the record, as a Kafka header would.
        if record.trace.is_empty() {
            record.trace = crate::telemetry::current_headers();
        }
        let topic = record.topic;
        if topic.is_table() {
            let mut tables = self.tables.lock().unwrap();
            let table = tables.entry(topic).or_default();
            if record.payload.is_empty() {
                table.remove(&record.key);
            } else {
                let n = self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                table.insert(record.key, (n, record.payload));
            }
            return Ok(());
        }
        self.channels[&topic].sender.send(record).await.map_err(|_| BusError::Closed)?;
        report_depth(topic, &self.channels[&topic].sender);
        Ok(())
    }

    async fn subscribe(&self, topics: &[Topic], _group: &str) -> Result<Box<dyn Subscription>, BusError> {
        let mut receivers = Vec::new();
        for topic in topics {
            let receiver = self.channels[topic].receiver.lock().unwrap().take();
            receivers.push((*topic, receiver.ok_or(BusError::AlreadySubscribed(*topic))?));
        }
        Ok(Box::new(InProcessSubscription { receivers }))
    }

    async fn read_table(&self, topic: Topic) -> Result<Vec<Record>, BusError> {
        let tables = self.tables.lock().unwrap();
        let mut entries: Vec<_> = tables.get(&topic).into_iter().flatten().collect();
        entries.sort_by_key(|(_, (n, _))| *n);
        Ok(entries.into_iter().map(|(key, (_, payload))| Record::new(topic, key.clone(), payload.clone())).collect())
    }
}

struct InProcessSubscription {
    receivers: Vec<(Topic, mpsc::Receiver<Record>)>,
}

fn report_depth(topic: Topic, sender: &mpsc::Sender<Record>) {
    let depth = sender.max_capacity() - sender.capacity();
    crate::metrics::METRICS.queue_depth.with_label_values(&[topic.name()]).set(depth as i64);
}

#[async_trait]
impl Subscription for InProcessSubscription {
    async fn next(&mut self) -> Option<Delivery> {
        poll_fn(|cx| {
            let mut open = 0;
            // In priority order: the first topic with a record wins.
            for (topic, receiver) in &mut self.receivers {
                match receiver.poll_recv(cx) {
                    Poll::Ready(Some(record)) => {
                        let depth = receiver.len();
                        crate::metrics::METRICS.queue_depth.with_label_values(&[topic.name()]).set(depth as i64);
                        return Poll::Ready(Some(Delivery::new(record, 1, None)));
                    }
                    Poll::Ready(None) => {}
                    Poll::Pending => open += 1,
                }
            }
            if open == 0 { Poll::Ready(None) } else { Poll::Pending }
        })
        .await
    }
}
