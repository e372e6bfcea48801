//! How far a follower of a whole topic has read: the end offsets it must reach before it is ready
//! (`follow`), marked off as the poller acknowledges records and as the broker reports each
//! partition's end.
//!
//! An offset alone cannot tell: under exactly-once a partition's last offset is the marker that
//! commits a transaction, which a read_committed reader is never handed, so no record's offset
//! reaches the high watermark. The follower's consumer has `enable.partition.eof` on, and the
//! broker's word that it read to the end settles the partition once what it handed out is done.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// The partitions a follower must read to the end of; true in its watch once every one is done.
pub struct CatchUp {
    behind: Mutex<HashMap<(String, i32), Behind>>,
    pub(super) done: watch::Sender<bool>,
}

/// A partition still behind: the offset it must reach, and what the poller handed out and what was
/// acknowledged of it.
struct Behind {
    end: i64,
    fetched: Option<i64>,
    acked: Option<i64>,
}

impl CatchUp {
    pub(super) fn new(ends: HashMap<(String, i32), i64>) -> Arc<CatchUp> {
        let done = watch::channel(ends.is_empty()).0;
        let behind = ends.into_iter().map(|(key, end)| (key, Behind { end, fetched: None, acked: None })).collect();
        Arc::new(CatchUp { behind: Mutex::new(behind), done })
    }

    /// The poller handed out this record.
    pub(super) fn fetched(&self, topic: &str, partition: i32, offset: i64) {
        if let Some(behind) = self.behind.lock().unwrap().get_mut(&(topic.to_string(), partition)) {
            behind.fetched = Some(offset);
        }
    }

    /// A record was taken and acknowledged: its partition is caught up once it reached the end.
    pub(super) fn acked(&self, topic: &str, partition: i32, offset: i64) {
        let mut behind = self.behind.lock().unwrap();
        let key = (topic.to_string(), partition);
        let Some(partition) = behind.get_mut(&key) else { return };
        partition.acked = Some(offset);
        if offset + 1 >= partition.end {
            behind.remove(&key);
            self.settle(&behind);
        }
    }

    /// The broker says the consumer has read all of `partition` (of the one topic a follower reads):
    /// caught up once the last record handed out is acknowledged, at once if that is so already.
    pub(super) fn end_of(&self, partition: i32) {
        let mut behind = self.behind.lock().unwrap();
        behind.retain(|(_, number), state| {
            if *number != partition {
                return true;
            }
            match state.fetched {
                Some(fetched) if state.acked.is_none_or(|acked| acked < fetched) => {
                    state.end = fetched + 1;
                    true
                }
                _ => false,
            }
        });
        self.settle(&behind);
    }

    fn settle(&self, behind: &HashMap<(String, i32), Behind>) {
        if behind.is_empty() {
            self.done.send_replace(true);
        }
    }
}
