//! Every topic's decoder against what can arrive on a topic: arbitrary bytes, arbitrary JSON, and
//! real events with one part replaced by anything. Each yields an event or a `bad_event` error,
//! never a panic, which on a stage's thread would take the stage down with its other events.
//! And events of the previous schema version, recorded from a build that wrote it
//! (tests/golden/v1), still decode and still reach an answer in this one.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lacuna::actors::runner::decode;
use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::dead_letter::DeadLetter;
use lacuna::topics::in_process::InProcessBus;
use lacuna::topics::*;
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::Value;
use support::fake_llm::FakeLlm;
use support::faulty_bus::FaultyBus;
use support::scripted::hugo_script;

/// What a stage of this build makes of `payload` on `topic`: `Ok` or the error type of its record.
fn outcome(topic: Topic, payload: &[u8]) -> Result<(), &'static str> {
    fn decoded<E: Event>(payload: &[u8]) -> Result<(), &'static str> {
        let record = Record { topic: E::TOPIC, key: "k".into(), payload: payload.to_vec(), trace: Default::default() };
        decode::<E>(&record).map(drop).map_err(|error| error.error_type())
    }
    match topic {
        Topic::Questions => decoded::<QuestionEvent>(payload),
        Topic::Passages => decoded::<PassagesEvent>(payload),
        Topic::Evidence => decoded::<EvidenceEvent>(payload),
        Topic::Facts => decoded::<FactsEvent>(payload),
        Topic::Verified => decoded::<VerifiedEvent>(payload),
        Topic::Missing => decoded::<MissingEvent>(payload),
        Topic::Queries => decoded::<QueriesEvent>(payload),
        Topic::Answers => decoded::<VersionedAnswer>(payload),
        Topic::DeadLetters => decoded::<DeadLetter>(payload),
        Topic::Nodes => decoded::<NodeEvent>(payload),
        // The join's table holds its input events.
        Topic::Joins | Topic::JoinState => decoded::<JoinEvent>(payload),
        Topic::Joined => decoded::<JoinedEvent>(payload),
        Topic::Progress => decoded::<ProgressEvent>(payload),
    }
}

fn assert_event_or_bad_event(topic: Topic, payload: &[u8]) -> Result<(), TestCaseError> {
    match outcome(topic, payload) {
        Ok(()) | Err("bad_event") => Ok(()),
        Err(other) => Err(TestCaseError::fail(format!("{topic:?}: {other} instead of bad_event"))),
    }
}

/// Bounded, so the property tests take seconds in the test command; PROPTEST_CASES=N searches longer.
fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(96);
    Config { cases, failure_persistence: None, ..Config::default() }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u32>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[a-z_ ]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,10}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn topic() -> impl Strategy<Value = Topic> {
    prop::sample::select(Topic::ALL.to_vec())
}

/// The recorded events of the previous schema version, by topic.
fn golden() -> Vec<(Topic, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1");
    let mut events = Vec::new();
    for topic in Topic::ALL {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("{}.jsonl", topic.name()))) else { continue };
        events.extend(text.lines().filter(|l| !l.is_empty()).map(|l| (topic, serde_json::from_str(l).unwrap())));
    }
    events
}

/// Every JSON pointer into `value`.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => map.iter().for_each(|(k, v)| pointers(v, format!("{at}/{k}"), out)),
        Value::Array(items) => items.iter().enumerate().for_each(|(i, v)| pointers(v, format!("{at}/{i}"), out)),
        _ => {}
    }
    out.push(at);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_are_an_event_or_a_bad_event(topic in topic(), bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        assert_event_or_bad_event(topic, &bytes)?;
    }

    #[test]
    fn arbitrary_json_is_an_event_or_a_bad_event(topic in topic(), value in json_value()) {
        assert_event_or_bad_event(topic, &serde_json::to_vec(&value).unwrap())?;
    }

    /// Real events with one value anywhere in them replaced: the deep fields random JSON never
    /// reaches, with every other field valid.
    #[test]
    fn a_real_event_with_any_part_replaced_is_an_event_or_a_bad_event(
        which in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        replacement in json_value(),
    ) {
        let events = golden();
        let (topic, mut event) = events[which.index(events.len())].clone();
        let mut paths = Vec::new();
        pointers(&event, String::new(), &mut paths);
        let path = &paths[at.index(paths.len())];
        match event.pointer_mut(path) {
            Some(target) => *target = replacement,
            None => event = replacement,
        }
        assert_event_or_bad_event(topic, &serde_json::to_vec(&event).unwrap())?;
    }
}

#[test]
fn events_of_the_previous_schema_version_decode() {
    let events = golden();
    let topics: std::collections::BTreeSet<Topic> = events.iter().map(|(topic, _)| *topic).collect();
    // `progress` came with version 2: no writer of version 1 exists to record.
    let older: Vec<Topic> = Topic::ALL.into_iter().filter(|t| *t != Topic::Progress).collect();
    assert_eq!(topics.into_iter().collect::<Vec<_>>(), older, "a recorded event for every topic");
    for (topic, event) in &events {
        assert_eq!(event["schema_version"], OLDEST_READABLE_SCHEMA_VERSION);
        let decoded = outcome(*topic, &serde_json::to_vec(event).unwrap());
        assert_eq!(decoded, Ok(()), "{topic:?} {event}");
    }
}

#[test]
fn versions_outside_the_readable_range_are_bad_events() {
    let (topic, mut event) = golden().into_iter().find(|(topic, _)| *topic == Topic::Missing).unwrap();
    for version in [OLDEST_READABLE_SCHEMA_VERSION - 1, SCHEMA_VERSION + 1] {
        event["schema_version"] = version.into();
        assert_eq!(outcome(topic, &serde_json::to_vec(&event).unwrap()), Err("bad_event"), "version {version}");
    }
}

/// A rolling upgrade leaves events of the previous version in flight: each one a stage of this
/// build takes from the middle of the MIGRES loop goes on to an answer, not to the dead letters.
#[actix::test]
async fn in_flight_events_of_the_previous_version_reach_an_answer() {
    let llm = FakeLlm::start(hugo_script).await;
    let settings = support::settings(&llm.base_url);
    let loop_topics = [Topic::Passages, Topic::Evidence, Topic::Facts, Topic::Verified, Topic::Missing, Topic::Queries];
    let events: Vec<(Topic, Value)> = golden().into_iter().filter(|(topic, _)| loop_topics.contains(topic)).collect();
    assert!(events.len() >= loop_topics.len());
    for (topic, event) in events {
        // The pipeline reads the answers itself: the bus shows them to the test as they are published.
        let published = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = published.clone();
        let bus =
            Arc::new(FaultyBus::new(Arc::new(InProcessBus::new(256))).failing(Topic::Answers, move |record, _| {
                seen.lock().unwrap().push(record.clone());
                None
            }));
        let pipeline =
            Pipeline::start_on(PipelineKind::Migres, bus.clone(), &settings, support::parts(&settings)).await.unwrap();
        let key = event["memory"]["question_id"].as_str().unwrap().to_string();
        bus.publish(Record { topic, key, payload: serde_json::to_vec(&event).unwrap(), trace: Default::default() })
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let answer = loop {
            if let Some(answer) = published.lock().unwrap().first() {
                break answer.clone();
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no record from a v1 {topic:?} event");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        pipeline.stop();
        let record = VersionedAnswer::from_payload(&answer.payload).unwrap().record;
        let AnswerRecord::Answered(answer) = record else { panic!("a v1 {topic:?} event ended in {record:?}") };
        assert_eq!(answer.answer, "Murcia", "from a v1 {topic:?} event");
    }
}
