//! End to end with the real parts: the tantivy index, the ONNX cross-encoder and the local LLM server
//! that scripts/test.sh starts (LACUNA_TEST_LLM_URL). A small model answers poorly, so this checks
//! structure, not correctness: the loop terminates, every cited passage exists, every kept fact passed
//! verification, and the trace accounts for every step and LLM call.

mod support;

use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::{AnswerRecord, FactSource, QuestionEvent, TraceKind};

fn llm_url() -> String {
    std::env::var("LACUNA_TEST_LLM_URL")
        .expect("LACUNA_TEST_LLM_URL is not set: run the tests with scripts/test.sh, which starts the local LLM server")
}

#[actix::test]
async fn migres_with_the_local_llm_ends_in_a_cited_verified_answer() {
    let mut settings = support::settings(&llm_url());
    settings.llm.timeout_ms = 300_000;
    settings.llm.max_tokens = 256;
    settings.migres.max_iterations = 2;
    let (question, _, _) = support::question("hotpotqa", support::scripted::HUGO_QUESTION_ID);
    let parts = support::parts(&settings);
    let mut pipeline = Pipeline::start(PipelineKind::Migres, &settings, parts).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new("real-1", question)).await.unwrap();
    pipeline.stop();
    println!("{}", serde_json::to_string_pretty(&record).unwrap());

    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer record, got {record:?}") };
    assert!(!answer.answer.is_empty());
    assert!(answer.iterations >= 1 && answer.iterations <= 2, "stops within T iterations");

    let index = support::search();
    for fact in &answer.facts {
        match fact.source {
            FactSource::Verified => {
                assert!(!fact.citations.is_empty());
                for id in &fact.citations {
                    assert!(index.passage(id).unwrap().is_some(), "cited passage {id} exists in the index");
                    assert!(answer.passages.iter().any(|p| &p.id == id), "the record carries passage {id}");
                    let verified = answer.trace.iter().any(|s| {
                        matches!(&s.kind, TraceKind::Verdict { fact: f, passage_id, entailed: true, .. } if f == &fact.text && passage_id == id)
                    });
                    assert!(verified, "fact {:?} passed verification against {id}", fact.text);
                }
            }
            FactSource::ModelKnowledge => assert!(fact.citations.is_empty()),
        }
    }

    for iteration in 1..=answer.iterations {
        assert!(
            answer.trace.iter().any(|s| s.iteration == iteration && matches!(s.kind, TraceKind::Retrieved { .. })),
            "iteration {iteration} is in the trace"
        );
    }
    let decisions = answer.trace.iter().filter(|s| matches!(s.kind, TraceKind::Decision { .. })).count();
    assert!(decisions >= 1);
    let calls = answer.trace.iter().filter(|s| matches!(s.kind, TraceKind::LlmCall { .. })).count();
    assert_eq!(calls, answer.usage.llm_calls as usize, "every LLM call is in the trace");
    assert!(answer.usage.prompt_tokens > 0, "token usage is recorded");
}

/// The paper's baselines with the real model: one answer call over the k best passages, which the
/// record cites and which exist in the corpus.
#[actix::test]
async fn baselines_with_the_local_llm_answer_from_cited_passages() {
    let mut settings = support::settings(&llm_url());
    settings.llm.timeout_ms = 300_000;
    settings.llm.max_tokens = 256;
    let (question, _, _) = support::question("hotpotqa", support::scripted::HUGO_QUESTION_ID);
    let index = support::search();
    for kind in [PipelineKind::Vanilla, PipelineKind::VanillaS] {
        let mut pipeline = Pipeline::start(kind, &settings, support::parts(&settings)).await.unwrap();
        let record = pipeline.ask(QuestionEvent::new(format!("real-{kind}"), question.clone())).await.unwrap();
        pipeline.stop();
        println!("{kind}: {}", serde_json::to_string(&record).unwrap());
        let AnswerRecord::Answered(answer) = record else { panic!("{kind}: expected an answer, got {record:?}") };
        assert!(!answer.answer.is_empty());
        assert_eq!(answer.usage.llm_calls, 1, "{kind}: one answer call");
        assert_eq!(answer.iterations, 1);
        assert!(!answer.passages.is_empty() && answer.passages.len() <= settings.migres.top_k);
        for passage in &answer.passages {
            let stored = index.passage(&passage.id).unwrap().expect("a cited passage exists in the index");
            assert!(
                stored.text.contains(passage.text.split(". ").next().unwrap()),
                "{kind}: cited text is the passage's"
            );
        }
    }
}

fn small_real_settings() -> lacuna::config::Settings {
    let mut settings = support::settings(&llm_url());
    settings.llm.timeout_ms = 300_000;
    settings.llm.max_tokens = 256;
    settings.migres.retrieve_top_n = 10;
    settings
}

async fn ask_real(kind: PipelineKind, settings: &lacuna::config::Settings) -> lacuna::topics::Answered {
    let (question, _, _) = support::question("hotpotqa", support::scripted::HUGO_QUESTION_ID);
    let mut pipeline = Pipeline::start(kind, settings, support::parts(settings)).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new(format!("real-{kind}"), question)).await.unwrap();
    pipeline.stop();
    println!("{kind}: {}", serde_json::to_string(&record).unwrap());
    let AnswerRecord::Answered(answer) = record else { panic!("{kind}: expected an answer, got {record:?}") };
    // Whatever the model decided: every cited passage exists and every call is accounted for.
    let index = support::search();
    for passage in &answer.passages {
        assert!(index.passage(&passage.id).unwrap().is_some(), "{kind}: cited passage {} exists", passage.id);
    }
    let calls = answer.trace.iter().filter(|s| matches!(s.kind, TraceKind::LlmCall { .. })).count();
    assert_eq!(calls, answer.usage.llm_calls as usize, "{kind}: every LLM call is in the trace");
    *answer
}

#[actix::test]
async fn qpaug_with_the_local_llm_augments_generates_and_answers() {
    let settings = small_real_settings();
    let answer = ask_real(PipelineKind::Qpaug, &settings).await;
    assert!(!answer.answer.is_empty());
    assert_eq!(answer.usage.llm_calls, 3, "augmentation, passage generation, answer");
    assert!(answer.queries[0].len() > answer.question.len(), "the query is the question plus its augmentation");
    assert!(!answer.passages.is_empty() && answer.passages.len() < settings.qpaug.top_k);
    assert!(answer.trace.iter().any(|s| matches!(s.kind, TraceKind::Augmented { .. })));
}

#[actix::test]
async fn raisf_with_the_local_llm_ends_within_its_depth() {
    let mut settings = small_real_settings();
    settings.raisf.max_depth = 1;
    settings.raisf.top_k = 3;
    settings.raisf.max_sub_questions = 2;
    let answer = ask_real(PipelineKind::Raisf, &settings).await;
    assert!(!answer.answer.is_empty());
    assert!(support::deepest_node(&answer) <= 1, "no sub-question below D_th");
    assert!(answer.trace.iter().any(|s| matches!(s.kind, TraceKind::SelfKnowledge { .. })));
}

#[actix::test]
async fn rqrag_with_the_local_llm_scores_trajectories_by_their_logprobs() {
    let mut settings = small_real_settings();
    settings.rqrag.max_depth = 1;
    settings.rqrag.width = 2;
    let answer = ask_real(PipelineKind::Rqrag, &settings).await;
    assert!(!answer.candidates.is_empty() && answer.candidates.len() <= 2);
    for candidate in &answer.candidates {
        let logprobs = candidate.logprobs.as_ref().expect("the local server returns logprobs");
        assert!(logprobs.tokens > 0 && logprobs.sum <= 0.0);
    }
    assert!(answer.candidates.iter().any(|c| c.answer == answer.answer), "the answer is one trajectory's");
    assert!(support::deepest_node(&answer) <= 1);
}

/// The local server runs two slots, and two slots batch concurrent calls: `--deterministic` would
/// promise what the server cannot keep, so it refuses before any question is asked, and says how to
/// start a server it can trust.
#[test]
fn a_deterministic_eval_refuses_a_server_with_two_slots() {
    let data = support::dataset_folder("real-deterministic", "hotpotqa", &[support::scripted::HUGO_QUESTION_ID]);
    let out = support::scratch_dir("real-deterministic-run");
    let _ = std::fs::remove_file(out.join("answers.jsonl"));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .env("LACUNA__LLM__BASE_URL", llm_url())
        .args(["eval", "--dataset", data.to_str().unwrap(), "--pipeline", "vanilla-s", "--deterministic"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("one slot") && stderr.contains("LACUNA_LLM_PARALLEL=1"), "{stderr}");
    assert!(!out.join("answers.jsonl").exists(), "no question was asked");
}
