//! A bus that fails chosen publishes, around the real in-process bus: how tests reach the paths a
//! broker error, a full disk or a record over the size limit would take.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lacuna::topics::bus::DeliveryHooks;
use lacuna::topics::{Bus, BusError, Delivery, Record, Subscription, Topic};

/// Decides, for each publish to its topic (counted from 1), whether it fails and how.
type Rule = Box<dyn Fn(&Record, usize) -> Option<BusError> + Send + Sync>;

pub struct FaultyBus {
    inner: Arc<dyn Bus>,
    rules: Vec<(Topic, Rule)>,
    /// Consumer groups whose feed ends after this many deliveries, as a dead poller's would.
    ending: Vec<(String, usize)>,
    counts: Mutex<std::collections::HashMap<Topic, usize>>,
    /// Every publish that was failed, as (topic, key).
    pub failed: Mutex<Vec<(Topic, String)>>,
    /// The record (by key) whose claim blocks its caller this long, and when that claim returned.
    slow_claim: Option<SlowClaim>,
}

/// A claim that blocks its thread, as Kafka's claims do while the group coordinator is slow.
#[derive(Clone)]
pub struct SlowClaim {
    pub key: String,
    pub blocks: Duration,
    pub returned: Arc<Mutex<Option<Instant>>>,
}

impl FaultyBus {
    pub fn new(inner: Arc<dyn Bus>) -> Self {
        FaultyBus {
            inner,
            rules: Vec::new(),
            ending: Vec::new(),
            counts: Mutex::default(),
            failed: Mutex::default(),
            slow_claim: None,
        }
    }

    /// Fails publishes to `topic` for which `rule(record, n)` gives an error.
    pub fn failing(
        mut self,
        topic: Topic,
        rule: impl Fn(&Record, usize) -> Option<BusError> + Send + Sync + 'static,
    ) -> Self {
        self.rules.push((topic, Box::new(rule)));
        self
    }

    /// Ends the feed of consumer group `group` after `deliveries` records.
    pub fn ending_feed(mut self, group: &str, deliveries: usize) -> Self {
        self.ending.push((group.to_string(), deliveries));
        self
    }

    /// Deliveries carry claim hooks, as Kafka's do; the claim of `slow.key` blocks its caller.
    pub fn claiming_slowly(mut self, slow: SlowClaim) -> Self {
        self.slow_claim = Some(slow);
        self
    }

    pub fn failures(&self) -> usize {
        self.failed.lock().unwrap().len()
    }
}

#[async_trait]
impl Bus for FaultyBus {
    async fn publish(&self, record: Record) -> Result<(), BusError> {
        let n = {
            let mut counts = self.counts.lock().unwrap();
            let n = counts.entry(record.topic).or_default();
            *n += 1;
            *n
        };
        for (topic, rule) in &self.rules {
            if *topic == record.topic
                && let Some(error) = rule(&record, n)
            {
                self.failed.lock().unwrap().push((record.topic, record.key.clone()));
                return Err(error);
            }
        }
        self.inner.publish(record).await
    }

    async fn subscribe(&self, topics: &[Topic], group: &str) -> Result<Box<dyn Subscription>, BusError> {
        let mut inner = self.inner.subscribe(topics, group).await?;
        if let Some(slow) = &self.slow_claim {
            inner = Box::new(ClaimingFeed { inner, slow: slow.clone() });
        }
        Ok(match self.ending.iter().find(|(g, _)| g == group) {
            Some((_, left)) => Box::new(EndingFeed { inner, left: *left }),
            None => inner,
        })
    }

    async fn read_table(&self, topic: Topic) -> Result<Vec<Record>, BusError> {
        self.inner.read_table(topic).await
    }
}

struct EndingFeed {
    inner: Box<dyn Subscription>,
    left: usize,
}

#[async_trait]
impl Subscription for EndingFeed {
    async fn next(&mut self) -> Option<Delivery> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        self.inner.next().await
    }
}

struct ClaimingFeed {
    inner: Box<dyn Subscription>,
    slow: SlowClaim,
}

#[async_trait]
impl Subscription for ClaimingFeed {
    async fn next(&mut self) -> Option<Delivery> {
        let record = self.inner.next().await?.into_record();
        let slow = (record.key == self.slow.key).then(|| self.slow.clone());
        let claim = Box::new(move || {
            if let Some(slow) = slow {
                std::thread::sleep(slow.blocks);
                *slow.returned.lock().unwrap() = Some(Instant::now());
            }
            Some(0)
        });
        let hooks = DeliveryHooks {
            claim,
            start: Box::new(|_| {}),
            owned: Box::new(|| true),
            ack: Box::new(|| {}),
            refused: Box::new(|_| {}),
        };
        Some(Delivery::new(record, 1, Some(hooks)))
    }
}
