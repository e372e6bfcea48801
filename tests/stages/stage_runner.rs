use std::sync::Arc;
use std::time::Duration;

use lacuna::config::{DeliveryGuarantee, Settings};
use lacuna::topics::dead_letter::DeadLetter;
use lacuna::topics::in_process::InProcessBus;
use lacuna::topics::{AnswerRecord, Bus, Event, MissingEvent, Record, SCHEMA_VERSION, Topic, VersionedAnswer};
use serde_json::json;

use crate::helpers::memory;
use crate::support;
use crate::support::fake_llm::{FakeLlm, Reply};
use crate::support::faulty_bus::{FaultyBus, SlowClaim};

fn missing(id: &str) -> Record {
    let mut m = memory(&format!("Question number {id}, where is it?"));
    m.question_id = id.to_string();
    MissingEvent { schema_version: SCHEMA_VERSION, memory: m, missing_information: "The place.".into() }.to_record()
}

async fn next(subscription: &mut Box<dyn lacuna::topics::Subscription>) -> Record {
    tokio::time::timeout(Duration::from_secs(20), subscription.next())
        .await
        .expect("an output in time")
        .unwrap()
        .into_record()
}

#[actix::test]
async fn poison_event_ends_in_error_record_and_dead_letter_and_others_flow() {
    let llm = FakeLlm::start(|_| Reply::Json(json!({"queries": ["Where is the place of FC Cartagena?"]}))).await;
    let settings: Settings = support::settings(&llm.base_url);
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(16));
    let mut answers = bus.subscribe(&[Topic::Answers], "t").await.unwrap();
    let mut dead = bus.subscribe(&[Topic::DeadLetters], "t").await.unwrap();
    let mut queries = bus.subscribe(&[Topic::Queries], "t").await.unwrap();
    let running = support::start_query_gen(&bus, &settings).await;

    bus.publish(missing("good-1")).await.unwrap();
    bus.publish(Record {
        topic: Topic::Missing,
        key: "poison".into(),
        payload: b"{not json".to_vec(),
        trace: Default::default(),
    })
    .await
    .unwrap();
    bus.publish(missing("good-2")).await.unwrap();

    let error = match VersionedAnswer::from_payload(&next(&mut answers).await.payload).unwrap().record {
        AnswerRecord::Error(e) => e,
        other => panic!("expected an error record, got {other:?}"),
    };
    assert_eq!(
        (error.question_id.as_str(), error.stage.as_str(), error.error_type.as_str()),
        ("poison", "query_gen", "bad_event")
    );
    let letter = DeadLetter::from_payload(&next(&mut dead).await.payload).unwrap();
    assert_eq!(letter.payload, "{not json");
    assert_eq!(letter.original_topic, Topic::Missing);
    let mut flowed = vec![next(&mut queries).await.key, next(&mut queries).await.key];
    flowed.sort();
    assert_eq!(flowed, vec!["good-1", "good-2"]);
    assert_eq!(lacuna::actors::runner::StageCounters::get(&running.counters.failed), 1);
    running.stop();
}

#[actix::test]
async fn an_llm_that_keeps_failing_ends_in_an_error_record_after_retries() {
    let llm = FakeLlm::start(|_| Reply::Status(503)).await;
    let mut settings: Settings = support::settings(&llm.base_url);
    settings.llm.max_retries = 1;
    settings.retry.max_attempts = 2;
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(16));
    let mut answers = bus.subscribe(&[Topic::Answers], "t").await.unwrap();
    let _dead = bus.subscribe(&[Topic::DeadLetters], "t").await.unwrap();
    let running = support::start_query_gen(&bus, &settings).await;
    bus.publish(missing("q-503")).await.unwrap();

    let error = match VersionedAnswer::from_payload(&next(&mut answers).await.payload).unwrap().record {
        AnswerRecord::Error(e) => e,
        other => panic!("expected an error record, got {other:?}"),
    };
    assert_eq!(error.error_type, "llm_http_status");
    assert!(error.question.starts_with("Question number q-503"), "the record names the question");
    assert_eq!(llm.calls(), 4, "2 attempts of the event x 2 attempts of the call");
    assert_eq!(lacuna::actors::runner::StageCounters::get(&running.counters.retried), 1);
    running.stop();
}

/// A crashed stage upstream publishes its unfinished outputs again: the stage after it skips the
/// repeat (same event, other timings) instead of redoing the question's LLM calls, and still takes
/// the next iteration and a question asked anew.
#[actix::test]
async fn an_event_the_stage_already_finished_is_skipped_not_redone() {
    repeats_are_skipped(DeliveryGuarantee::AtLeastOnce).await;
}

/// `bus.delivery` is Kafka's: the in-process bus has no transactions, and its stages keep
/// skipping repeats under exactly-once (the default) as under at-least-once.
#[actix::test]
async fn an_event_finished_in_process_is_skipped_whatever_the_kafka_delivery() {
    repeats_are_skipped(DeliveryGuarantee::ExactlyOnce).await;
}

async fn repeats_are_skipped(delivery: DeliveryGuarantee) {
    // One at a time: both count on the process's one `duplicates_skipped` counter.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    let llm = FakeLlm::start(|_| Reply::Json(json!({"queries": ["Where is the place of FC Cartagena?"]}))).await;
    let mut settings: Settings = support::settings(&llm.base_url);
    settings.bus.delivery = delivery;
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(16));
    let mut queries = bus.subscribe(&[Topic::Queries], "t").await.unwrap();
    let running = support::start_query_gen(&bus, &settings).await;
    let skipped = || lacuna::metrics::METRICS.duplicates_skipped.with_label_values(&["query_gen"]).get();
    let before = skipped();

    let first = MissingEvent::from_payload(&missing("dup").payload).unwrap();
    let mut repeat = first.clone();
    repeat
        .memory
        .record("main", lacuna::topics::TraceKind::Failed { error_type: "x".into(), message: "timing".into() });
    repeat.memory.usage.prompt_tokens += 7;
    let mut next_iteration = first.clone();
    next_iteration.memory.iteration += 1;
    let mut asked_anew = first.clone();
    asked_anew.memory.submission = "another submission".into();
    // One after the other, as a republished output comes after the first copy was finished.
    bus.publish(first.to_record()).await.unwrap();
    next(&mut queries).await;
    for event in [&repeat, &next_iteration, &asked_anew] {
        bus.publish(event.to_record()).await.unwrap();
    }
    for _ in 0..2 {
        next(&mut queries).await;
    }
    let wait = tokio::time::timeout(Duration::from_millis(500), queries.next()).await;
    assert!(wait.is_err(), "the repeat was processed: a fourth output");
    assert_eq!(llm.calls(), 3, "no LLM call for the repeat");
    assert_eq!(skipped() - before, 1);
    running.stop();
}

/// A stage works on several events at once, up to its `max_in_flight` and its LLM concurrency:
/// with every LLM reply taking two seconds, the calls of queued events overlap instead of
/// following one another. A `max_in_flight` below `llm_concurrency` does not leave LLM slots idle.
#[actix::test]
async fn a_stage_works_on_several_events_at_once() {
    let arrivals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let llm = FakeLlm::start(move |_| {
        seen.lock().unwrap().push(std::time::Instant::now());
        Reply::Delayed(Duration::from_secs(2), Box::new(Reply::Json(json!({"queries": ["Where is it?"]}))))
    })
    .await;
    let mut settings: Settings = support::settings(&llm.base_url);
    let query_gen = settings.stages.entry("query_gen".into()).or_default();
    (query_gen.max_in_flight, query_gen.llm_concurrency) = (Some(1), Some(4));
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(16));
    let mut queries = bus.subscribe(&[Topic::Queries], "t").await.unwrap();
    let running = support::start_query_gen(&bus, &settings).await;
    for n in 0..4 {
        bus.publish(missing(&format!("overlap-{n}"))).await.unwrap();
    }
    for _ in 0..4 {
        next(&mut queries).await;
    }
    let arrivals = arrivals.lock().unwrap().clone();
    let overlapping = arrivals.iter().filter(|at| at.duration_since(arrivals[0]) < Duration::from_millis(1500)).count();
    assert!(overlapping >= 2, "only {overlapping} of the 4 calls were in flight together: one event at a time");
    running.stop();
}

/// A stage whose `max_in_flight` is above actix's default mailbox (16), started with a backlog
/// waiting, takes it all: the feeder may send before the actor has run, so the mailbox must be
/// sized when the actor is made, not when it starts. (The host bench's `--open 64
/// --llm-concurrency 32` failed retrieve with "its mailbox was full despite the in-flight bound".)
#[actix::test]
async fn a_stage_started_with_a_backlog_above_the_default_mailbox_takes_it_all() {
    let llm = FakeLlm::start(|_| Reply::Json(json!({"queries": ["Where is it?"]}))).await;
    let mut settings: Settings = support::settings(&llm.base_url);
    settings.stages.entry("query_gen".into()).or_default().max_in_flight = Some(40);
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(64));
    let mut queries = bus.subscribe(&[Topic::Queries], "t").await.unwrap();
    for n in 0..40 {
        bus.publish(missing(&format!("backlog-{n}"))).await.unwrap();
    }
    let running = support::start_query_gen(&bus, &settings).await;
    for _ in 0..40 {
        next(&mut queries).await;
    }
    running.stop();
}

/// On Kafka a record's claim reads and commits its starts on the broker, up to 10 s each against a
/// slow group coordinator. Taken on the stage's own thread, it froze every event of the stage
/// meanwhile, those holding an open transaction included (finding 4 of issue 74): the event already
/// at work must finish while the next one's claim waits.
#[actix::test]
async fn a_slow_claim_does_not_hold_up_the_events_already_at_work() {
    let reply = || Reply::Json(json!({"queries": ["Where is it?"]}));
    let llm = FakeLlm::start(move |_| Reply::Delayed(Duration::from_millis(300), Box::new(reply()))).await;
    let settings: Settings = support::settings(&llm.base_url);
    let inner: Arc<dyn Bus> = Arc::new(InProcessBus::new(16));
    let slow = SlowClaim { key: "slow".into(), blocks: Duration::from_secs(3), returned: Arc::default() };
    let bus: Arc<dyn Bus> = Arc::new(FaultyBus::new(inner.clone()).claiming_slowly(slow.clone()));
    let mut queries = inner.subscribe(&[Topic::Queries], "t").await.unwrap();
    let running = support::start_query_gen(&bus, &settings).await;
    bus.publish(missing("first")).await.unwrap();
    // "first" is at work (its LLM call takes 300 ms) when "slow" is claimed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    bus.publish(missing("slow")).await.unwrap();
    assert_eq!(next(&mut queries).await.key, "first");
    assert!(slow.returned.lock().unwrap().is_none(), "the event at work waited for the other's claim");
    assert_eq!(next(&mut queries).await.key, "slow");
    running.stop();
}
