//! Skipping events a stage has already finished. After a crash, a stage re-runs the events it had
//! not committed and publishes their outputs again; without this, every stage after it would redo
//! those questions' remaining LLM calls. Each stage remembers the fingerprints of the last
//! `bus.dedupe_window` events it finished (outputs published) and acknowledges a repeat without
//! processing it.
//!
//! What the window covers, plainly: it lives in the stage's memory, so it catches duplicates that
//! reach a stage which has been running since it finished the first copy: the republished outputs of
//! a crashed or restarted stage upstream, and redeliveries after a rebalance within one process.
//! The crashed stage itself starts with an empty window and redoes its own uncommitted events.
//! Duplicates that get through still end in one record per question in `lacuna answers`' output
//! (the sink keeps the first per id); the answers topic itself may hold two.
//!
//! A fingerprint is the event without its `trace` and `usage` (timings and token counts differ
//! between two runs of the same work) plus its topic and key. An LLM that samples (temperature
//! above 0, no response cache) writes different outputs on a re-run, which are then not duplicates.
//! A question asked again carries a new `submission`, so it is never mistaken for a repeat.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::topics::Record;

/// What identifies a finished event, whatever its timings.
pub fn fingerprint(record: &Record) -> Option<u128> {
    let mut value: Value = serde_json::from_slice(&record.payload).ok()?;
    strip_run_details(&mut value);
    let mut hasher = Sha256::new();
    hasher.update(record.topic.name());
    hasher.update([0x1f]);
    hasher.update(&record.key);
    hasher.update([0x1f]);
    hasher.update(serde_json::to_vec(&value).ok()?);
    let digest = hasher.finalize();
    Some(u128::from_le_bytes(digest[..16].try_into().expect("a SHA-256 digest has 32 bytes")))
}

fn strip_run_details(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("trace");
            map.remove("usage");
            map.values_mut().for_each(strip_run_details);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_run_details),
        _ => {}
    }
}

/// The fingerprints of the last `capacity` events a stage finished.
pub struct Window {
    capacity: usize,
    seen: Mutex<(HashSet<u128>, VecDeque<u128>)>,
}

impl Window {
    /// `None` when `capacity` is 0: no skipping.
    pub fn new(capacity: usize) -> Option<Self> {
        (capacity > 0).then(|| Window { capacity, seen: Mutex::default() })
    }

    pub fn contains(&self, fingerprint: u128) -> bool {
        self.seen.lock().unwrap().0.contains(&fingerprint)
    }

    pub fn insert(&self, fingerprint: u128) {
        let (set, order) = &mut *self.seen.lock().unwrap();
        if set.insert(fingerprint) {
            order.push_back(fingerprint);
            if order.len() > self.capacity
                && let Some(oldest) = order.pop_front()
            {
                set.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topics::Topic;

    fn record(payload: &str) -> Record {
        Record { topic: Topic::Facts, key: "q".into(), payload: payload.as_bytes().to_vec(), trace: Default::default() }
    }

    #[test]
    fn timings_and_token_counts_do_not_make_an_event_new() {
        let first =
            record(r#"{"memory":{"iteration":1,"trace":[{"latency_ms":3}],"usage":{"llm_calls":1}},"facts":["a"]}"#);
        let again =
            record(r#"{"memory":{"iteration":1,"trace":[{"latency_ms":9}],"usage":{"llm_calls":2}},"facts":["a"]}"#);
        let next = record(r#"{"memory":{"iteration":2,"trace":[],"usage":{"llm_calls":2}},"facts":["a"]}"#);
        assert_eq!(fingerprint(&first), fingerprint(&again));
        assert_ne!(fingerprint(&first), fingerprint(&next));
        assert_eq!(fingerprint(&record("not json")), None);
    }

    #[test]
    fn the_window_forgets_the_oldest_beyond_its_capacity() {
        let window = Window::new(2).unwrap();
        (1..=3).for_each(|n| window.insert(n));
        assert_eq!((window.contains(1), window.contains(2), window.contains(3)), (false, true, true));
        assert!(Window::new(0).is_none());
    }
}
