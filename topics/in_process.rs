//! The embedded bus: one bounded channel per topic inside the process. Publishing into a full topic
//! waits, which is the backpressure. Nothing survives the process, so acknowledgements are no-ops.

use std::collections::HashMap;
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

pub struct InProcessBus {
    channels: HashMap<Topic, Channel>,
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
        InProcessBus { channels }
    }
}

#[async_trait]
impl Bus for InProcessBus {
    async fn publish(&self, record: Record) -> Result<(), BusError> {
        let topic = record.topic;
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
