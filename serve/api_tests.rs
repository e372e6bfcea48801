//! `POST /v1/questions` when the bus is slow to take a question: a client that gives up (hyper then
//! drops the handler) must leave neither an open slot nor an `Idempotency-Key` bound to a question
//! that was never sent (issue 75, item 1).

use std::sync::Mutex;

use async_trait::async_trait;
use tokio::time::{sleep, timeout};

use super::*;
use crate::config::Settings;
use crate::serve::documents::{DocumentRoutes, Target};
use crate::topics::bus::{BusError, Record, Subscription};

/// A bus that takes a record after `delay`, or never (a broker away, no timeout of its own).
struct SlowBus {
    delay: Option<Duration>,
    taken: Mutex<Vec<String>>,
}

#[async_trait]
impl Bus for SlowBus {
    async fn publish(&self, record: Record) -> Result<(), BusError> {
        match self.delay {
            Some(delay) => sleep(delay).await,
            None => std::future::pending().await,
        }
        self.taken.lock().unwrap().push(record.key);
        Ok(())
    }

    async fn subscribe(&self, _: &[Topic], _: &str) -> Result<Box<dyn Subscription>, BusError> {
        Err(BusError::Config("not in this test".into()))
    }

    async fn read_table(&self, _: Topic) -> Result<Vec<Record>, BusError> {
        Ok(Vec::new())
    }
}

fn api(bus: Arc<SlowBus>) -> Api {
    let settings = Settings::defaults();
    Api {
        registry: Arc::new(Registry::new(4, 100, 1 << 20)),
        buses: BTreeMap::from([("migres".to_string(), bus as Arc<dyn Bus>)]),
        default_pipeline: "migres".into(),
        settings: settings.serve.clone(),
        token: None,
        max_question_chars: 1000,
        transport: Transport::Kafka,
        stage_names: Vec::new(),
        ready: Arc::new(AtomicBool::new(true)),
        streams: Arc::new(tokio::sync::Semaphore::new(1)),
        documents: Arc::new(DocumentRoutes {
            token: None,
            target: Target::Local { dir: std::env::temp_dir(), writing: Default::default() },
            max_document_bytes: 1 << 20,
            passage_words: 100,
            body_timeout: Duration::from_secs(5),
        }),
    }
}

fn asked(key: &str) -> Vec<NewQuestion> {
    let question = "Who charted the Varnholt shoals?".to_string();
    vec![NewQuestion { id: None, key: Some(key.into()), question, pipeline: "migres".into(), yes_no: false }]
}

#[tokio::test(start_paused = true)]
async fn a_post_dropped_while_the_bus_never_takes_its_question_frees_its_slot_and_a_retry_is_no_duplicate() {
    let bus = Arc::new(SlowBus { delay: None, taken: Mutex::default() });
    let api = api(bus.clone());
    // The client gives up after a second: its handler is dropped mid-publish.
    assert!(timeout(Duration::from_secs(1), api.submit(asked("k1"), None)).await.is_err());
    // Retried with the same key while that publish may still be running: never "202, duplicate" for
    // a question the bus has not taken.
    match timeout(Duration::from_secs(1), api.submit(asked("k1"), None)).await {
        Ok(Ok(ids)) => assert!(ids[0].1, "told duplicate of a question never sent: {ids:?}"),
        Ok(Err(refused)) => assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body),
        Err(_) => {} // waited for the first publish
    }
    // Well past serve.publish_timeout_ms: the question was never taken, so it holds no slot.
    sleep(Duration::from_secs(120)).await;
    assert_eq!(api.registry.open(), 0, "a slot stays open for a question that was never sent");
    assert!(bus.taken.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_post_dropped_while_the_bus_is_slow_still_sends_its_question_once() {
    let bus = Arc::new(SlowBus { delay: Some(Duration::from_secs(5)), taken: Mutex::default() });
    let api = api(bus.clone());
    assert!(timeout(Duration::from_secs(1), api.submit(asked("k2"), None)).await.is_err());
    sleep(Duration::from_secs(10)).await;
    // The publish went on without its client: the question was sent, and holds its slot until its
    // record comes; a retry with the key is that question.
    assert_eq!(bus.taken.lock().unwrap().len(), 1, "the question a 202 would have named was never sent");
    assert_eq!(api.registry.open(), 1);
    let ids = api.submit(asked("k2"), None).await.expect("the same question");
    assert_eq!(ids.len(), 1);
    assert!(!ids[0].1, "a retry of a sent question is a duplicate");
    assert_eq!(bus.taken.lock().unwrap().len(), 1, "sent once");
}
