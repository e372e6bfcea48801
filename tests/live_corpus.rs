//! A live corpus: documents added while a pipeline runs are searched, answered from and cited by the
//! next question, without a restart; a deleted document stops being cited.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lacuna::actors::clients::TantivySearch;
use lacuna::pipelines::parts::Parts;
use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::{AnswerRecord, Answered, QuestionEvent};
use serde_json::json;
use support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};

const QUESTION: &str = "Which lighthouse keeper first charted the Varnholt shoals?";
const MADE_UP: &str = "varnholt-shoals";

/// A reader that answers from the made-up passage when it is shown one, and cannot otherwise.
fn reader(prompt: &str) -> Reply {
    match prompt_kind(prompt) {
        Prompt::Reader if prompt.contains("Quillmoor") => {
            Reply::Json(json!({"answer": "Ada Quillmoor", "confidence": 5, "explanation": "the passage says so"}))
        }
        Prompt::Reader => Reply::Json(json!({"answer": "unknown", "confidence": 1, "explanation": "not shown"})),
        _ => Reply::Status(400),
    }
}

/// `lacuna ingest` in its own process, as a user runs it beside a running pipeline.
fn ingest(index: &Path, args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .env("LACUNA__SEARCH__INDEX_DIR", index)
        .arg("ingest")
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "ingest failed: {}", String::from_utf8_lossy(&output.stderr));
}

/// Asks until `wanted` holds of the answer (the running reader follows commits within a second or
/// so), at most 10 s; returns the last answer.
async fn ask_until(pipeline: &mut Pipeline, tag: &str, wanted: impl Fn(&Answered) -> bool) -> Answered {
    for attempt in 0..50 {
        let record = pipeline.ask(QuestionEvent::new(format!("{tag}-{attempt}"), QUESTION.to_string())).await.unwrap();
        let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
        if wanted(&answer) {
            return *answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{tag}: the running pipeline never saw the change");
}

fn cites_made_up(answer: &Answered) -> bool {
    answer.passages.iter().any(|p| p.id == MADE_UP)
}

#[actix::test]
async fn a_document_ingested_while_a_pipeline_runs_answers_the_next_question_and_a_delete_takes_it_back() {
    let dir = support::scratch_dir("live-corpus");
    // Real passages around the made-up one, so that BM25 and the re-ranker have competition.
    let corpus = dir.join("corpus.jsonl");
    let real = std::fs::read_to_string(support::data_dir().join("hotpotqa/corpus.jsonl")).unwrap();
    std::fs::write(&corpus, real.lines().take(300).collect::<Vec<_>>().join("\n")).unwrap();
    let index = dir.join("index");
    let _ = std::fs::remove_dir_all(&index);
    TantivySearch::build(&index, &corpus).unwrap();

    let llm = FakeLlm::start(reader).await;
    let mut settings = support::settings(&llm.base_url);
    settings.search.index_dir = index.clone();
    let parts = Parts::load(&settings, PipelineKind::Vanilla).unwrap();
    let mut pipeline = Pipeline::start(PipelineKind::Vanilla, &settings, parts).await.unwrap();

    let before = ask_until(&mut pipeline, "before", |_| true).await;
    assert!(!cites_made_up(&before) && before.answer == "unknown", "the corpus never held it: {:?}", before.answer);

    let documents = dir.join("documents.jsonl");
    let mut file = std::fs::File::create(&documents).unwrap();
    let made_up = json!({"id": MADE_UP, "title": "Varnholt shoals",
        "text": "The Varnholt shoals were first charted in 1871 by the lighthouse keeper Ada Quillmoor.",
        "metadata": {"url": "https://example.org/varnholt"}});
    writeln!(file, "{made_up}").unwrap();
    ingest(&index, &[documents.to_str().unwrap()]);

    let after = ask_until(&mut pipeline, "after", cites_made_up).await;
    assert_eq!(after.answer, "Ada Quillmoor");
    let generation = |answer: &Answered| answer.provenance.as_ref().unwrap().index_generation.clone();
    assert_ne!(generation(&after), generation(&before), "the record names the generation it read");

    ingest(&index, &["--delete", MADE_UP]);
    let deleted = ask_until(&mut pipeline, "deleted", |a| !cites_made_up(a)).await;
    assert_eq!(deleted.answer, "unknown");
    assert_ne!(generation(&deleted), generation(&after));
    pipeline.stop();
}

/// Ingesting a document again replaces all of its passages: a shorter version leaves none of the
/// longer one's behind. Bad lines are named and skipped; the good ones still go in.
#[actix::test]
async fn a_document_ingested_again_keeps_no_passage_of_its_older_version() {
    let dir = support::scratch_dir("live-corpus-replace");
    let index = dir.join("index");
    let _ = std::fs::remove_dir_all(&index);
    let write = |name: &str, lines: &[String]| {
        let path = dir.join(name);
        std::fs::write(&path, lines.join("\n")).unwrap();
        path
    };
    let sentence = "The keeper logged the weather at dawn and again at dusk every day of the year.";
    let long = json!({"id": "log", "title": "Keeper's log", "text": vec![sentence; 30].join(" ")}).to_string();
    let first = write("long.jsonl", &[long]);
    ingest(&index, &[first.to_str().unwrap()]);
    let search = TantivySearch::open(&index).unwrap();
    let ids = |search: &TantivySearch| {
        let mut ids: Vec<String> =
            search.search("keeper weather dawn", 50).unwrap().into_iter().map(|(p, _)| p.id).collect();
        ids.sort();
        ids
    };
    // 16 words a sentence: 6 whole sentences (96 words) a passage of at most 100.
    assert_eq!(ids(&search), ["log#1", "log#2", "log#3", "log#4", "log#5"]);

    let short = json!({"id": "log", "title": "Keeper's log", "text": sentence}).to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .env("LACUNA__SEARCH__INDEX_DIR", &index)
        .args([
            "ingest",
            write("short.jsonl", &[short, "{not json".into(), json!({"id": "empty", "text": " "}).to_string()])
                .to_str()
                .unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "two lines were skipped: {stderr}");
    assert!(stderr.contains("line 2: ") && stderr.contains("line 3: document \"empty\" has no text"), "{stderr}");
    let search = TantivySearch::open(&index).unwrap();
    assert_eq!(ids(&search), ["log"], "the good line went in, and replaced all five passages");
}
