//! `lacuna indexer` keeps a Meilisearch index a copy of the documents topic, over the real broker
//! that scripts/test.sh starts. No registry ships a Meilisearch server (../shared/ENVIRONMENT.md), so
//! the server here is a fake that speaks its HTTP API (tests/support/fake_meili.rs): the SDK, the
//! retries, the task waits and the indexer are the real ones. tests/meilisearch.rs runs against a
//! real server where MEILI_URL is set.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use lacuna::bench::replica::{Replica, free_port, ready};
use lacuna::config::{SearchBackend, Settings};
use lacuna::pipelines::parts::Parts;
use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::kafka::KafkaBus;
use lacuna::topics::{AnswerRecord, QuestionEvent};
use serde_json::json;
use support::fake_llm::FakeLlm;
use support::fake_meili::FakeMeili;
use support::scripted::made_up_reader;

const INDEX: &str = "live";
const QUESTION: &str = "Which lighthouse keeper first charted the Varnholt shoals?";

fn env(settings: &Settings) -> Vec<(&'static str, String)> {
    vec![
        ("LACUNA__KAFKA__BROKERS", settings.kafka.brokers.clone()),
        ("LACUNA__KAFKA__TOPIC_PREFIX", settings.kafka.topic_prefix.clone()),
        ("LACUNA__KAFKA__PARTITIONS", settings.kafka.partitions.to_string()),
        ("LACUNA__SEARCH__BACKEND", "meilisearch".into()),
        ("LACUNA__SEARCH__MEILISEARCH__URL", settings.search.meilisearch.url.clone()),
        ("LACUNA__SEARCH__MEILISEARCH__INDEX", INDEX.into()),
        ("LACUNA__SEARCH__PASSAGE_WORDS", settings.search.passage_words.to_string()),
    ]
}

/// A test's cluster settings, searching `meili`'s index.
fn on_meili(test: &str, llm_url: &str, meili: &FakeMeili) -> Settings {
    let mut settings = support::cluster::settings(test, llm_url);
    settings.search.backend = SearchBackend::Meilisearch;
    settings.search.meilisearch.url = meili.url.clone();
    settings.search.meilisearch.index = INDEX.into();
    settings
}

/// `lacuna indexer` as its own process, ready (caught up), its log beside `dir`.
fn indexer(settings: &Settings, dir: &Path, port: u16, n: usize) -> Replica {
    let binary = Path::new(env!("CARGO_BIN_EXE_lacuna"));
    let mut indexer = Replica::start_indexer(binary, settings, &dir.join(format!("indexer-{n}.log")), port).unwrap();
    indexer.wait_ready(Duration::from_secs(60)).unwrap();
    indexer
}

/// `lacuna ingest --transport kafka` with these documents (and `extra` arguments), as a user runs it.
fn publish(settings: &Settings, dir: &Path, documents: &[serde_json::Value], extra: &[&str]) -> Child {
    let file = dir.join(format!("documents-{}.jsonl", documents.len()));
    let mut out = std::fs::File::create(&file).unwrap();
    for document in documents {
        writeln!(out, "{document}").unwrap();
    }
    Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .envs(env(settings))
        .args(["ingest", "--transport", "kafka", file.to_str().unwrap()])
        .args(extra)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn published(mut child: Child) {
    assert!(child.wait().unwrap().success(), "lacuna ingest failed");
}

/// The passage ids the fake index holds.
fn ids(meili: &FakeMeili) -> Vec<String> {
    meili.passage_ids(INDEX)
}

/// Waits until the index holds exactly `wanted` passage ids, at most 30 s.
fn until_ids(meili: &FakeMeili, wanted: &[String], what: &str) {
    let mut wanted = wanted.to_vec();
    wanted.sort();
    let started = Instant::now();
    while ids(meili) != wanted {
        assert!(started.elapsed() < Duration::from_secs(30), "{what}: the index holds {:?}", ids(meili));
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn short(n: usize) -> serde_json::Value {
    json!({"id": format!("doc-{n}"), "title": format!("Document {n}"), "text": format!("Short document number {n}.")})
}

/// A document of three 20-word passages.
fn manual(sentences: usize) -> serde_json::Value {
    let sentence = |n: usize| format!("{} step {n}.", vec!["word"; 18].join(" "));
    json!({"id": "manual", "title": "Manual", "text": (0..sentences).map(sentence).collect::<Vec<_>>().join(" ")})
}

/// The indexer waits for a server that is not up yet, fills the empty server from the topic and is
/// ready once caught up; a made-up document
/// published while it runs is found and cited by the next answer, whose record names the
/// generation; a shorter version leaves no stale passage, a delete takes a document back, and a
/// record that is not a document is skipped. Killed with SIGKILL while a batch is published, it
/// comes back and the index holds exactly the topic's live documents. A Meilisearch outage is
/// waited out: nothing published meanwhile is skipped.
#[actix::test]
async fn the_indexer_keeps_a_meilisearch_index_a_copy_of_the_documents_topic_through_a_kill_and_an_outage() {
    let dir = support::scratch_dir("meili-indexer");
    let _ = std::fs::remove_file(dir.join("indexer.log"));
    let meili = FakeMeili::start();
    let llm = FakeLlm::start(made_up_reader).await;
    let mut settings = on_meili("meili-indexer", &llm.base_url, &meili);
    settings.search.passage_words = 20;
    settings.search.commit_interval_ms = 200;

    let bus = KafkaBus::new(settings.kafka.clone(), &settings.bus).unwrap();
    bus.ensure_documents_topic().await.unwrap();
    bus.publish_document("bad", Some(b"{not json")).await.unwrap();
    let mut documents: Vec<serde_json::Value> = (0..30).map(short).collect();
    documents.push(manual(3));
    published(publish(&settings, &dir, &documents, &[]));
    let mut live: Vec<String> = (0..30).map(|n| format!("doc-{n}")).collect();

    // Started while the server is down (a pod that comes up before Meilisearch does): it waits, unready.
    meili.set_down(true);
    let port = free_port().unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_lacuna"));
    let mut child = Replica::start_indexer(binary, &settings, &dir.join("indexer-1.log"), port).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(child.running(), "a server not up yet is waited for, not a reason to exit");
    assert!(!ready(port), "not ready before it has caught up");
    meili.set_down(false);
    child.wait_ready(Duration::from_secs(60)).unwrap();
    let with_manual = |live: &[String], passages: usize| -> Vec<String> {
        let manual = (1..=passages).map(|n| if passages == 1 { "manual".into() } else { format!("manual#{n}") });
        live.iter().cloned().chain(manual).collect()
    };
    assert_eq!(
        ids(&meili),
        {
            let mut w = with_manual(&live, 3);
            w.sort();
            w
        },
        "ready means caught up: every document, the bad record skipped"
    );

    let made_up = json!({"id": "varnholt-shoals", "title": "Varnholt shoals",
        "text": "The Varnholt shoals were first charted in 1871 by the lighthouse keeper Ada Quillmoor."});
    published(publish(&settings, &dir, &[made_up, manual(1)], &["--delete", "doc-0"]));
    live.retain(|id| id != "doc-0");
    live.push("varnholt-shoals".into());
    until_ids(&meili, &with_manual(&live, 1), "a new document, a shorter version, a delete");

    let parts = Parts::load(&settings, PipelineKind::Vanilla).unwrap();
    let mut pipeline = Pipeline::start(PipelineKind::Vanilla, &settings, parts).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new("q1", QUESTION.to_string())).await.unwrap();
    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    assert_eq!(answer.answer, "Ada Quillmoor");
    assert!(answer.passages.iter().any(|p| p.id == "varnholt-shoals"), "it cites the new document");
    let generation = &answer.provenance.as_ref().unwrap().index_generation;
    assert!(
        generation.iter().any(|g| g.starts_with("meilisearch:live:applied=")),
        "the record names the generation it read: {generation:?}"
    );

    // SIGKILL while a batch is being published: no last batch, no stored offsets beyond the tasks done.
    let batch: Vec<serde_json::Value> = (100..400).map(short).collect();
    let publishing = publish(&settings, &dir, &batch, &[]);
    std::thread::sleep(Duration::from_millis(300));
    child.kill();
    published(publishing);
    live.extend((100..400).map(|n| format!("doc-{n}")));
    let mut child = indexer(&settings, &dir, port, 2);
    assert_eq!(
        ids(&meili),
        {
            let mut w = with_manual(&live, 1);
            w.sort();
            w
        },
        "after a kill: exactly the topic's live documents"
    );

    meili.set_down(true);
    published(publish(&settings, &dir, &[short(999)], &[]));
    std::thread::sleep(Duration::from_secs(2));
    assert!(child.running(), "an outage is waited out, not a reason to exit");
    meili.set_down(false);
    live.push("doc-999".into());
    until_ids(&meili, &with_manual(&live, 1), "the document published during the outage");
}

/// The indexer gathers whole documents before it uploads. Bounded by count alone, catching up on
/// large documents holds up to `batch_size` of them at once, past a pod's memory limit (issue 57,
/// item 4). What it gathers is bounded by `search.meilisearch.max_batch_bytes` too: each batch is
/// applied, and its offsets stored, before more is read.
#[test]
fn catching_up_on_large_documents_gathers_at_most_max_batch_bytes_of_them_at_a_time() {
    let dir = support::scratch_dir("meili-large-gather");
    let meili = FakeMeili::start();
    let settings = on_meili("meili-large-gather", "http://127.0.0.1:9", &meili);
    // About 190 KB each.
    let text = vec!["A sentence of a large document."; 6_000].join(" ");
    let documents: Vec<serde_json::Value> =
        (0..10).map(|n| json!({"id": format!("large-{n}"), "title": "Large", "text": text})).collect();
    published(publish(&settings, &dir, &documents, &[]));
    let port = free_port().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .envs(env(&settings))
        .env("LACUNA__METRICS__LISTEN", format!("127.0.0.1:{port}"))
        .env("LACUNA__SEARCH__MEILISEARCH__MAX_BATCH_BYTES", "500000")
        .arg("indexer")
        .stderr(std::fs::File::create(dir.join("indexer.log")).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !ready(port) {
        assert!(started.elapsed() < Duration::from_secs(60), "the indexer caught up within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let batches = meili.uploads_to(&format!("{INDEX}-applied"));
    assert!(batches >= 4, "10 documents of 190 KB in batches of at most 500 KB, not {batches}");
}

/// `lacuna bench freshness` on the Meilisearch backend runs end to end: an indexer applies the
/// documents published at a set rate, each is timed until the index holds it, and a new indexer's
/// catch-up is timed. Its figures mean nothing against the fake; docs/performance.md has none until a
/// real server runs it.
#[test]
fn bench_freshness_times_the_meilisearch_indexer() {
    let dir = support::scratch_dir("meili-freshness");
    let meili = FakeMeili::start();
    let mut settings = support::cluster::settings("meili-freshness", "http://127.0.0.1:9/v1");
    settings.search.meilisearch.url = meili.url.clone();
    let json = dir.join("freshness.json");
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .envs(env(&settings))
        .env("LACUNA__SEARCH__MEILISEARCH__INDEX", INDEX)
        .args(["bench", "freshness", "--dataset"])
        .arg(support::data_dir().join("nq"))
        .args(["--transport", "kafka", "--rate", "20", "--seconds", "3", "--catch-up", "200", "--limit", "2"])
        .args(["--fake-llm-ms", "1", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(output.status.success(), "bench failed: {}", String::from_utf8_lossy(&output.stderr));
    let bench: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(bench["backend"], "meilisearch");
    assert!(bench["published"].as_u64().unwrap() >= 50, "{bench}");
    assert_eq!(bench["searchable"], bench["published"], "every document found in the index: {bench}");
    assert!(bench["catch_up_s"].as_f64().is_some_and(|s| s > 0.0), "{bench}");
    let new = meili.documents(&format!("{INDEX}-bench-freshness-{}-new", bench_stamp(&meili)));
    assert!(new.len() >= 200 + 113, "the new indexer applied the whole topic: {} passages", new.len());
}

/// The stamp of the bench's own index on the fake (it names its indexes after the time it started).
fn bench_stamp(meili: &FakeMeili) -> String {
    let uids = meili.indexes();
    let uid = uids.iter().find(|uid| uid.ends_with("-new")).expect("the catch-up index");
    uid.trim_end_matches("-new").rsplit('-').next().unwrap().to_string()
}

/// On the tantivy backend there is nothing for an indexer to write: it says what to set instead of
/// waiting for a Meilisearch nobody runs.
#[test]
fn the_indexer_refuses_to_start_on_the_tantivy_backend() {
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .env("LACUNA__SEARCH__BACKEND", "tantivy")
        .env("LACUNA__METRICS__LISTEN", "")
        .arg("indexer")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("search.backend = \"meilisearch\"") && error.contains("search.follow_documents"), "{error}");
}

/// A pod that comes up before its Kafka cluster does waits for it, unready, instead of exiting
/// (issue 57, item 7): once the broker is up the indexer creates the documents topic, catches up and
/// is ready.
#[test]
fn the_indexer_waits_for_a_broker_that_is_down_at_start() {
    let dir = support::scratch_dir("meili-indexer-no-broker");
    let meili = FakeMeili::start();
    let broker = support::cluster::OwnBroker::start();
    broker.run(&["stop"]);
    let mut settings = on_meili("meili-indexer-no-broker", "http://127.0.0.1:9", &meili);
    settings.kafka.brokers = broker.address();
    let port = free_port().unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_lacuna"));
    let mut child = Replica::start_indexer(binary, &settings, &dir.join("indexer.log"), port).unwrap();
    // Past the admin client's 60 s, after which the topic's creation gives up.
    std::thread::sleep(Duration::from_secs(65));
    assert!(child.running(), "a broker not up yet is waited for, not a reason to exit");
    assert!(!ready(port), "not ready without the topic");
    broker.run(&["start"]);
    child.wait_ready(Duration::from_secs(90)).expect("ready once the broker is up");
    child.stop();
}

/// Changes from the documents topic are numbered by their offsets (issue 75, item 3). An index whose
/// changes a clock numbered (microseconds since the epoch, far above any offset) would outrank them
/// all: one an indexer before this build kept (its offsets stored) is rebuilt from the topic at
/// start; one `lacuna ingest` wrote in process is refused with what to do; and a change in process
/// to an index an indexer keeps is refused too.
#[actix::test]
async fn an_index_numbered_by_a_clock_is_rebuilt_or_refused_and_a_followed_index_takes_no_change_in_process() {
    use lacuna::actors::clients::MeiliSearch;
    use lacuna::actors::clients::search::Document;
    use lacuna::actors::clients::search::changes::Applied;
    use lacuna::actors::clients::search::meili::{CLOCK_SEQS, Update};
    // On a real server where MEILI_URL is set (a fresh index), else on the fake.
    let fake = FakeMeili::start();
    let mut settings = on_meili("meili-clock-numbered", "http://127.0.0.1:9/v1", &fake);
    if let Some(url) = std::env::var("MEILI_URL").ok().filter(|u| !u.is_empty()) {
        settings.search.meilisearch.url = url;
        settings.search.meilisearch.index = settings.kafka.topic_prefix.replace('.', "-") + "clock";
    }
    let dir = support::scratch_dir("meili-clock-numbered");
    let client = MeiliSearch::new(settings.search.meilisearch.clone()).unwrap();
    client.open_for_writing().await.unwrap();
    let ghost: Document =
        serde_json::from_value(json!({"id": "ghost", "title": "Ghost", "text": "Written in process."})).unwrap();
    client.apply_now(&[Update { doc_id: "ghost".into(), document: Some(ghost) }], 0, "ingest").await.unwrap();
    published(publish(&settings, &dir, &[short(1)], &[]));

    let binary = Path::new(env!("CARGO_BIN_EXE_lacuna"));
    let log = dir.join("refused.log");
    let mut refused = Replica::start_indexer(binary, &settings, &log, free_port().unwrap()).unwrap();
    assert!(refused.wait_ready(Duration::from_secs(60)).is_err(), "it started on an index written in process");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("numbered by a clock") && said.contains("search.meilisearch.index"), "{said}");

    // As an indexer before this build left it: its offsets stored beside clock-numbered entries.
    let topic = format!("{}documents", settings.kafka.topic_prefix);
    client.store_applied(&Applied { topic, ..Default::default() }).await.unwrap();
    let mut rebuilt = indexer(&settings, &dir, free_port().unwrap(), 0);
    let wanted = std::collections::HashSet::from(["doc-1".to_string()]);
    let started = Instant::now();
    while client.holding(&["doc-1".into(), "ghost".into()]).await.unwrap() != wanted {
        assert!(started.elapsed() < Duration::from_secs(30), "the topic's document alone, within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!client.clock_numbered().await.unwrap(), "numbered by offset, below {CLOCK_SEQS}");

    let error = client.apply_now(&[Update { doc_id: "late".into(), document: None }], 0, "ingest").await.unwrap_err();
    assert!(error.to_string().contains("copy of the documents topic"), "{error}");
    rebuilt.stop();
}
