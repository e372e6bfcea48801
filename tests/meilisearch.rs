//! The Meilisearch backend. Against a real server when `MEILI_URL` is set (and `MEILI_MASTER_KEY` when
//! it has one): indexing is idempotent, search returns passages with ranking scores, a missing index is
//! named, and a pipeline runs on it unchanged. Without `MEILI_URL` those tests say they were skipped.
//! An unreachable server needs no server: its questions end in error records and dead letters.

mod support;

use std::io::Write;

use lacuna::actors::clients::search::Document;
use lacuna::actors::clients::search::meili::{Update, next_seq, topic_seq};
use lacuna::actors::clients::{MeiliSearch, Search, SearchError};
use lacuna::config::{MeiliSettings, Settings};
use lacuna::pipelines::parts::Parts;
use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::{AnswerRecord, QuestionEvent};
use serde_json::json;
use support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};
use support::fake_meili::FakeMeili;

/// The server's settings, or `None` (and a line on the test output saying so) when MEILI_URL is unset.
fn server(test: &str) -> Option<MeiliSettings> {
    let Some(url) = std::env::var("MEILI_URL").ok().filter(|u| !u.is_empty()) else {
        // Straight to stderr: the test harness does not capture this, so the skip is visible.
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: MEILI_URL is not set (see the README to run it)");
        return None;
    };
    let mut settings = Settings::defaults().search.meilisearch;
    settings.url = url;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    settings.index = format!("lacuna-test-{nanos}");
    Some(settings)
}

/// The settings of an index `index` on the fake server.
fn on_fake(fake: &FakeMeili, index: &str) -> MeiliSettings {
    let mut settings = Settings::defaults().search.meilisearch;
    settings.url = fake.url.clone();
    settings.index = index.into();
    settings
}

/// A real server's settings where `MEILI_URL` is set (a fresh index), else a fake's: tests that need
/// none of the fake's levers run on both, so the fake is held to what the server does.
fn real_or_fake(index: &str) -> (Option<FakeMeili>, MeiliSettings) {
    match std::env::var("MEILI_URL").ok().filter(|u| !u.is_empty()) {
        Some(_) => (None, server(index).expect("MEILI_URL is set")),
        None => {
            let fake = FakeMeili::start();
            let settings = on_fake(&fake, index);
            (Some(fake), settings)
        }
    }
}

fn hotpot_corpus() -> std::path::PathBuf {
    support::data_dir().join("hotpotqa/corpus.jsonl")
}

#[tokio::test]
async fn indexing_twice_leaves_one_copy_and_search_returns_scored_passages() {
    let Some(settings) = server("indexing_twice_leaves_one_copy_and_search_returns_scored_passages") else { return };
    let meili = MeiliSearch::new(settings.clone()).unwrap();
    let first = meili.build(&hotpot_corpus()).await.unwrap();
    let second = meili.build(&hotpot_corpus()).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(meili.documents().await.unwrap(), first.documents, "re-indexing is idempotent");

    let (question, _, gold) = support::question("hotpotqa", support::scripted::HUGO_QUESTION_ID);
    // Meilisearch returns only documents that match the words its matching strategy keeps, so
    // fewer hits than the limit is normal; more never is.
    let hits = meili.search(&question, 20).await.unwrap();
    assert!(!hits.is_empty() && hits.len() <= 20, "{} hits for a limit of 20", hits.len());
    assert_eq!(meili.search(&question, 1).await.unwrap().len(), 1, "the configured limit");
    assert!(hits.iter().all(|(_, score)| *score > 0.0 && *score <= 1.0), "_rankingScore is in (0, 1]");
    assert!(hits.windows(2).all(|w| w[0].1 >= w[1].1), "best first");
    assert!(hits.iter().any(|(p, _)| gold.contains(&p.id)), "a gold passage is among the hits");
    let stored = meili.passage(&hits[0].0.id).await.unwrap().unwrap();
    assert_eq!(stored, hits[0].0);
}

/// `search.meilisearch.task_timeout_ms` bounds how long one task may take. A task still processing
/// after `timeout_ms` (one request's bound) is waited for, not taken for a failed request whose batch
/// is uploaded again: each upload adds a task to the queue the indexer waits on (issue 57, item 3).
#[tokio::test]
async fn a_slow_task_is_waited_for_up_to_task_timeout_ms_and_its_batch_uploaded_once() {
    let fake = FakeMeili::start();
    let mut settings = on_fake(&fake, "slow-tasks");
    (settings.timeout_ms, settings.max_retries, settings.retry_backoff_ms) = (200, 1, 10);
    settings.task_timeout_ms = 10_000;
    let meili = MeiliSearch::new(settings.clone()).unwrap();
    meili.open_for_writing().await.unwrap();
    fake.set_task_delay(std::time::Duration::from_millis(1_500));
    let document: Document =
        serde_json::from_value(json!({"id": "slow", "title": "Slow", "text": "A slow task."})).unwrap();
    let update = Update { doc_id: "slow".into(), document: Some(document.clone()) };
    let written = meili.apply_now(std::slice::from_ref(&update), 100, "test").await;
    assert!(written.is_ok(), "{written:?}");
    assert_eq!(fake.uploads(), 1, "the batch went up once");

    // A task past task_timeout_ms is an error that says so, and no retry uploads it again.
    settings.task_timeout_ms = 500;
    fake.set_task_delay(std::time::Duration::from_secs(5));
    let error = MeiliSearch::new(settings).unwrap().apply_now(&[update], 100, "test").await.unwrap_err();
    assert!(error.to_string().contains("task_timeout_ms"), "{error}");
    assert_eq!(fake.uploads(), 2);
}

/// Uploads are bounded in bytes as well as in passages: one large document (each passage carries its
/// metadata) must not make a batch the server refuses, which would stop the indexer for good
/// (issue 57, item 4).
#[tokio::test]
async fn a_large_document_goes_up_in_uploads_under_max_batch_bytes() {
    let fake = FakeMeili::start();
    let mut settings = on_fake(&fake, "large-documents");
    settings.max_batch_bytes = 100_000;
    let meili = MeiliSearch::new(settings).unwrap();
    meili.open_for_writing().await.unwrap();
    fake.set_payload_limit(150_000);
    let text = vec!["A sentence of the manual."; 2_000].join(" ");
    let document: Document = serde_json::from_value(
        json!({"id": "manual", "title": "Manual", "text": text, "metadata": {"notes": "n".repeat(20_000)}}),
    )
    .unwrap();
    let update = Update { doc_id: "manual".into(), document: Some(document) };
    let written = meili.apply_now(&[update], 100, "test").await.expect("every upload under the limit");
    assert_eq!(fake.documents("large-documents").len(), written.passages);
    assert!(fake.uploads() >= 3, "{} uploads", fake.uploads());
}

/// Two writes of one document that overlap (two POSTs, a client's retry, `lacuna ingest` beside the
/// indexer) must leave one whole version of it, never none: each write adds its passages and then
/// deletes what it replaces, and the tasks of two writers interleave (issue 57, item 1).
#[tokio::test]
async fn overlapping_writes_of_one_document_leave_one_whole_version() {
    let fake = FakeMeili::start();
    let settings = on_fake(&fake, "overlapping");
    let meili = MeiliSearch::new(settings).unwrap();
    meili.open_for_writing().await.unwrap();
    // Each writer waits this long for its additions before it deletes: both additions go in first.
    fake.set_task_delay(std::time::Duration::from_millis(300));
    let version = |words: &str, sentences: usize| {
        let text = (0..sentences).map(|n| format!("{words} {n}.")).collect::<Vec<_>>().join(" ");
        let document: Document = serde_json::from_value(json!({"id": "doc", "title": "Doc", "text": text})).unwrap();
        Update { doc_id: "doc".into(), document: Some(document) }
    };
    for round in 0..3 {
        let (long, short) = (version("long version words", 3), version("short version text", 2));
        let (one, two) = tokio::join!(
            meili.apply_now(std::slice::from_ref(&long), 4, "one"),
            meili.apply_now(std::slice::from_ref(&short), 4, "two")
        );
        assert!(one.is_ok() && two.is_ok(), "{one:?} {two:?}");
        let (passages, _) = meili.document("doc").await.unwrap().unwrap_or_else(|| panic!("round {round}: erased"));
        let texts: Vec<&str> = passages.iter().map(|p| p.text.as_str()).collect();
        let whole = |update: &Update| update.document.as_ref().unwrap().passages(4).into_iter().map(|p| p.text);
        assert!(
            whole(&long).eq(texts.iter().map(|t| t.to_string()))
                || whole(&short).eq(texts.iter().map(|t| t.to_string())),
            "round {round}: one whole version, not {texts:?}"
        );
        let stored = fake.documents("overlapping");
        assert_eq!(stored.len(), passages.len(), "round {round}: no passage of the other version is left");
    }
}

/// A change numbered before another change of the same document, whose additions land after the
/// other's deletion (its upload was slow, or retried), must not bring back what the newer change
/// removed: a deleted document, or the passages of an older version.
#[tokio::test]
async fn an_older_write_landing_after_a_newer_change_brings_nothing_back() {
    let (_fake, settings) = real_or_fake("late-older");
    let meili = MeiliSearch::new(settings).unwrap();
    meili.open_for_writing().await.unwrap();
    let version = |text: &str| {
        let document: Document = serde_json::from_value(json!({"id": "doc", "title": "Doc", "text": text})).unwrap();
        Update { doc_id: "doc".into(), document: Some(document) }
    };
    let deletion = Update { doc_id: "doc".into(), document: None };

    let older = next_seq();
    meili.apply_now(&[deletion], 4, "delete").await.unwrap();
    meili.apply_at(&[(older, version("stale words of the old version."))], 4, "late").await.unwrap();
    assert_eq!(meili.document("doc").await.unwrap(), None, "the deleted document came back");
    assert!(meili.search("stale old version", 5).await.unwrap().is_empty(), "the deleted document is found");

    let older = next_seq();
    meili.apply_now(&[version("fresh words of the new version.")], 4, "rewrite").await.unwrap();
    meili.apply_at(&[(older, version("stale words of the old version."))], 4, "late").await.unwrap();
    let (passages, _) = meili.document("doc").await.unwrap().expect("the new version");
    assert!(passages.iter().all(|p| !p.text.contains("stale")), "{passages:?}");
    let found = meili.search("stale old version", 5).await.unwrap();
    assert!(found.iter().all(|(p, _)| !p.text.contains("stale")), "the old version is found: {found:?}");
}

/// Two indexers whose clocks are an hour apart (one rescheduled onto a node whose clock is behind):
/// the one behind applies a document's newer change (offset 9 of its partition), the other applies
/// the older change (offset 4) after it, as a replay after a crash does. Numbered by their clocks,
/// the older change won: the newer version was deleted as older, and a deletion's marker lost the
/// same way, so a deleted document stayed searchable (issue 75, item 3).
#[tokio::test]
async fn a_documents_changes_are_ordered_by_their_offsets_not_by_the_indexers_clocks() {
    let (_fake, settings) = real_or_fake("clocks-apart");
    let meili = MeiliSearch::new(settings).unwrap();
    meili.open_for_writing().await.unwrap();
    let version = |text: &str| {
        let document: Document = serde_json::from_value(json!({"id": "doc", "title": "Doc", "text": text})).unwrap();
        Update { doc_id: "doc".into(), document: Some(document) }
    };
    // Whichever indexer applies them, and whatever its clock says, offsets number them.
    meili.apply_at(&[(topic_seq(9), version("fresh words of the new version."))], 4, "behind").await.unwrap();
    meili.apply_at(&[(topic_seq(4), version("stale words of the old version."))], 4, "right").await.unwrap();
    let (passages, _) = meili.document("doc").await.unwrap().expect("the new version");
    assert!(
        passages[0].text.contains("fresh") && passages.iter().all(|p| !p.text.contains("stale")),
        "the older change won: {passages:?}"
    );

    // Offset 12 deletes the document; offset 10 is replayed after it.
    let deletion = Update { doc_id: "doc".into(), document: None };
    meili.apply_at(&[(topic_seq(12), deletion)], 4, "behind").await.unwrap();
    meili.apply_at(&[(topic_seq(10), version("stale words of the old version."))], 4, "right").await.unwrap();
    assert_eq!(meili.document("doc").await.unwrap(), None, "the deleted document came back");
    assert!(meili.search("stale old version", 5).await.unwrap().is_empty(), "the deleted document is found");
}

#[tokio::test]
async fn a_missing_meilisearch_index_is_named() {
    let Some(settings) = server("a_missing_meilisearch_index_is_named") else { return };
    let error = MeiliSearch::new(settings.clone()).unwrap().search("anything", 5).await.unwrap_err();
    assert!(matches!(&error, SearchError::MissingRemoteIndex { index, .. } if *index == settings.index), "{error}");
    assert!(!error.is_transient());
}

#[actix::test]
async fn the_vanilla_pipeline_runs_on_meilisearch_unchanged() {
    let Some(meili) = server("the_vanilla_pipeline_runs_on_meilisearch_unchanged") else { return };
    MeiliSearch::new(meili.clone()).unwrap().build(&hotpot_corpus()).await.unwrap();
    let llm = FakeLlm::start(|prompt: &str| match prompt_kind(prompt) {
        Prompt::Reader => Reply::Json(json!({"answer": "Murcia", "confidence": 4, "explanation": "read"})),
        _ => Reply::Status(400),
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    settings.search.meilisearch = meili.clone();
    settings.search.backend = lacuna::config::SearchBackend::Meilisearch;
    let parts = Parts {
        search: Some(Search::open(&settings.search).unwrap()),
        reranker: Some(support::reranker()),
        ..Default::default()
    };
    let (question, _, _) = support::question("hotpotqa", support::scripted::HUGO_QUESTION_ID);
    let mut pipeline = Pipeline::start(PipelineKind::Vanilla, &settings, parts).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new("meili-1", question)).await.unwrap();
    pipeline.stop();
    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    let index = MeiliSearch::new(meili).unwrap();
    for passage in &answer.passages {
        assert!(index.passage(&passage.id).await.unwrap().is_some(), "cited passage {} is in Meilisearch", passage.id);
    }
}

/// No server needed: nothing listens on port 9, so every search fails as retryable, the stage retries,
/// and the question ends in one error record (and a dead letter), not in silence.
#[actix::test]
async fn an_unreachable_meilisearch_ends_the_question_in_an_error_record() {
    let mut settings = support::settings("http://127.0.0.1:9/v1");
    settings.search.backend = lacuna::config::SearchBackend::Meilisearch;
    settings.search.meilisearch.url = "http://127.0.0.1:9".into();
    settings.search.meilisearch.max_retries = 1;
    settings.search.meilisearch.retry_backoff_ms = 10;
    settings.retry.max_attempts = 2;
    let search = Search::open(&settings.search).unwrap();
    let error = search.search("anything", 5).await.unwrap_err();
    assert!(error.is_transient() && error.to_string().contains("unreachable"), "{error}");

    let parts = Parts { search: Some(search), reranker: Some(support::reranker()), ..Default::default() };
    let mut pipeline = Pipeline::start(PipelineKind::Vanilla, &settings, parts).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new("meili-down", "Where is it?")).await.unwrap();
    let dead_letters = pipeline.dead_letters.clone();
    pipeline.stop();
    let AnswerRecord::Error(error) = record else { panic!("expected an error record, got {record:?}") };
    assert_eq!((error.stage.as_str(), error.error_type.as_str()), ("retrieve", "search"));
    assert!(error.message.contains("unreachable"), "{}", error.message);
    // The dead letter is counted by a task of its own; give it a moment.
    for _ in 0..50 {
        if dead_letters.load(std::sync::atomic::Ordering::Relaxed) == 1 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("no dead letter for the failed event");
}

/// Against a real server and the test broker: `lacuna indexer` applies the documents topic, a
/// document's shorter version leaves none of its older passages, and a tombstone takes it back.
#[actix::test]
async fn the_indexer_applies_the_documents_topic_to_a_real_server() {
    use lacuna::actors::clients::Document;
    use lacuna::bench::replica::{Replica, free_port};
    let Some(meili) = server("the_indexer_applies_the_documents_topic_to_a_real_server") else { return };
    let mut settings = support::cluster::settings("meili-real-indexer", "http://127.0.0.1:9/v1");
    settings.search.meilisearch = meili.clone();
    settings.search.passage_words = 20;
    settings.search.commit_interval_ms = 200;
    let bus = lacuna::topics::kafka::KafkaBus::new(settings.kafka.clone(), &settings.bus).unwrap();
    bus.ensure_documents_topic().await.unwrap();
    let manual = |sentences: usize| Document {
        id: "manual".into(),
        title: "Manual".into(),
        text: (0..sentences).map(|n| format!("{} step {n}.", vec!["word"; 18].join(" "))).collect::<Vec<_>>().join(" "),
        metadata: Default::default(),
    };
    lacuna::actors::runner::publish_documents(&bus, &settings.retry, &[manual(3)]).await.unwrap();
    let dir = support::scratch_dir("meili-real-indexer");
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_lacuna"));
    let mut indexer =
        Replica::start_indexer(binary, &settings, &dir.join("indexer.log"), free_port().unwrap()).unwrap();
    indexer.wait_ready(std::time::Duration::from_secs(60)).unwrap();
    let index = MeiliSearch::new(meili).unwrap();
    assert!(index.passage("manual#3").await.unwrap().is_some(), "ready means caught up");

    let until = |what: &'static str, check: fn(&[bool; 2]) -> bool| {
        let index = index.clone();
        async move {
            for _ in 0..150 {
                let held = [
                    index.passage("manual").await.unwrap().is_some(),
                    index.passage("manual#2").await.unwrap().is_some(),
                ];
                if check(&held) {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            panic!("{what} within 30 s");
        }
    };
    lacuna::actors::runner::publish_documents(&bus, &settings.retry, &[manual(1)]).await.unwrap();
    until("the shorter version, and none of the older passages", |[one, two]| *one && !*two).await;
    bus.publish_document("manual", None).await.unwrap();
    until("the tombstone applied", |[one, two]| !*one && !*two).await;
    indexer.stop();
}
