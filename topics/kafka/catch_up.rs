//! How far a follower of whole topics has read: the end offsets it must reach before it is ready
//! (`follow`), marked off as the poller acknowledges records.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// The end offsets a follower must read up to; true in its watch once every one is acknowledged.
pub struct CatchUp {
    ends: Mutex<HashMap<(String, i32), i64>>,
    pub(super) done: watch::Sender<bool>,
}

impl CatchUp {
    pub(super) fn new(ends: HashMap<(String, i32), i64>) -> Arc<CatchUp> {
        let done = watch::channel(ends.is_empty()).0;
        Arc::new(CatchUp { ends: Mutex::new(ends), done })
    }

    /// A record was taken and acknowledged: its partition is caught up once it reached the end.
    pub(super) fn acked(&self, topic: &str, partition: i32, offset: i64) {
        let mut ends = self.ends.lock().unwrap();
        let key = (topic.to_string(), partition);
        if ends.get(&key).is_some_and(|end| offset + 1 >= *end) {
            ends.remove(&key);
            if ends.is_empty() {
                self.done.send_replace(true);
            }
        }
    }
}
