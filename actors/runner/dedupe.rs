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
//! On an exactly-once bus a record also comes again when the transaction of its outputs was aborted:
//! each fingerprint keeps that transaction, and one aborted no longer counts as finished.
//!
//! A fingerprint is the event without its `trace` and `usage` (timings and token counts differ
//! between two runs of the same work) plus its topic and key. An LLM that samples (temperature
//! above 0, no response cache) writes different outputs on a re-run, which are then not duplicates.
//! A question asked again carries a new `submission`, so it is never mistaken for a repeat.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::topics::{Record, Transaction};

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

/// The fingerprints of the last `capacity` events a stage finished, each with the transaction its
/// outputs went into on an exactly-once bus.
pub struct Window {
    capacity: usize,
    seen: Mutex<Seen>,
}

/// Each fingerprint with its transaction, and the fingerprints oldest first.
type Seen = (HashMap<u128, Option<Transaction>>, VecDeque<u128>);

impl Window {
    /// `None` when `capacity` is 0: no skipping.
    pub fn new(capacity: usize) -> Option<Self> {
        (capacity > 0).then(|| Window { capacity, seen: Mutex::default() })
    }

    /// Whether an event with this fingerprint was finished, in a transaction not aborted since.
    pub fn contains(&self, fingerprint: u128) -> bool {
        let seen = &self.seen.lock().unwrap().0;
        seen.get(&fingerprint).is_some_and(|transaction| !transaction.as_ref().is_some_and(Transaction::aborted))
    }

    pub fn insert(&self, fingerprint: u128, transaction: Option<Transaction>) {
        let (seen, order) = &mut *self.seen.lock().unwrap();
        if seen.insert(fingerprint, transaction).is_none() {
            order.push_back(fingerprint);
            if order.len() > self.capacity
                && let Some(oldest) = order.pop_front()
            {
                seen.remove(&oldest);
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
        (1..=3).for_each(|n| window.insert(n, None));
        assert_eq!((window.contains(1), window.contains(2), window.contains(3)), (false, true, true));
        assert!(Window::new(0).is_none());
    }

    /// Exactly-once: an event finished in a transaction the bus then aborted comes again from the
    /// last commit and must run again, its outputs having been thrown away; one finished in a
    /// transaction that committed (or is still open) is a repeat.
    #[test]
    fn an_event_whose_transaction_was_aborted_is_no_longer_finished() {
        let window = Window::new(4).unwrap();
        let (committed, aborted) = (Transaction::default(), Transaction::default());
        window.insert(1, Some(committed));
        window.insert(2, Some(aborted.clone()));
        assert!(window.contains(1) && window.contains(2), "finished while their transactions are open");
        aborted.abort();
        assert_eq!((window.contains(1), window.contains(2)), (true, false));
        window.insert(2, Some(Transaction::default()));
        assert!(window.contains(2), "redone in the next transaction, it is finished again");
    }
}
