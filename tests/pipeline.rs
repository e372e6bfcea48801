//! The MIGRES pipeline on the in-process bus, with the real index and re-ranker and a scripted LLM
//! over HTTP: a multi-hop question answered with valid citations, and many questions at once each
//! ending in exactly one record.

mod support;

use std::collections::HashMap;

use lacuna::config::{GoOnWhen, Settings};
use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::{AnswerRecord, Answered, FactSource, Outcome, QuestionEvent, TraceKind};
use serde_json::json;
use support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};
use support::scripted::{HUGO_QUESTION_ID, SECOND_HOP_QUERY, hugo_script};

#[actix::test]
async fn a_two_hop_question_is_answered_with_verified_cited_facts() {
    let llm = FakeLlm::start(hugo_script).await;
    let settings = support::settings(&llm.base_url);
    let (question, answers, gold) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let mut pipeline = Pipeline::start(PipelineKind::Migres, &settings, support::parts(&settings)).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new(HUGO_QUESTION_ID, question.clone())).await.unwrap();
    pipeline.stop();

    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    assert_eq!(answer.answer, answers[0]);
    assert_eq!(answer.outcome, Outcome::Answered);
    assert_eq!(answer.iterations, 2, "the second hop needs a second iteration");
    assert_eq!(answer.queries, vec![question, SECOND_HOP_QUERY.to_string()]);

    // Every fact is verified and cites a passage that is in the index, with its text in the record.
    let index = support::search();
    let passages: HashMap<_, _> = answer.passages.iter().map(|p| (p.id.clone(), p)).collect();
    assert_eq!(answer.facts.len(), 2);
    for fact in &answer.facts {
        assert_eq!(fact.source, FactSource::Verified);
        for id in &fact.citations {
            let stored = index.passage(id).unwrap().expect("a cited passage exists in the index");
            assert!(stored.text.contains(&passages[id].text), "the record shows the passage's own text");
        }
    }
    let mut cited: Vec<_> = answer.facts.iter().flat_map(|f| f.citations.clone()).collect();
    cited.sort();
    let mut gold = gold;
    gold.sort();
    assert_eq!(cited, gold, "the facts rest on the two gold passages");

    // The trace tells the whole story, iteration by iteration.
    for iteration in 1..=2 {
        let kinds: Vec<_> = answer.trace.iter().filter(|s| s.iteration == iteration).map(|s| &s.kind).collect();
        assert!(kinds.iter().any(|k| matches!(k, TraceKind::Retrieved { .. })), "iteration {iteration} retrieved");
        assert!(
            kinds.iter().any(|k| matches!(k, TraceKind::PassageScored { kept: true, .. })),
            "iteration {iteration} kept a passage"
        );
        assert!(
            kinds.iter().any(|k| matches!(k, TraceKind::Verdict { entailed: true, .. })),
            "iteration {iteration} verified a fact"
        );
        assert!(kinds.iter().any(|k| matches!(k, TraceKind::Decision { .. })), "iteration {iteration} decided");
    }
    assert_eq!(answer.usage.llm_calls as usize, llm.calls(), "every LLM call is accounted to the question");
}

#[actix::test]
async fn every_question_ends_in_exactly_one_record_even_when_the_llm_fails() {
    // The main module fails for questions mentioning "American"; the others are answered at once.
    let llm = FakeLlm::start(|prompt| {
        match prompt_kind(prompt) {
            Prompt::Main if support::fake_llm::last_field(prompt, "Question: ").contains("American") => Reply::Status(500),
            Prompt::Main => Reply::Json(json!({"answerable": true, "answer": "yes", "confidence": 3, "explanation": "e", "missing_information": ""})),
            Prompt::Leaf => Reply::Json(json!({"facts": []})),
            Prompt::Knowledge => Reply::Text("I don't know.".into()),
            _ => Reply::Status(400),
        }
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    settings.llm.max_retries = 0;
    settings.retry.max_attempts = 1;
    settings.run.max_open_questions = 4;
    support::answer_checks_off(&mut settings);
    // Ten passages per question keep the re-ranker's CPU time (the cost here) small.
    settings.migres.retrieve_top_n = 10;
    let text = std::fs::read_to_string(support::data_dir().join("hotpotqa/questions.jsonl")).unwrap();
    let questions: Vec<QuestionEvent> = text
        .lines()
        .take(16)
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            QuestionEvent::new(v["id"].as_str().unwrap(), v["question"].as_str().unwrap())
        })
        .collect();
    let failing = questions.iter().filter(|q| q.question.contains("American")).count();
    assert!(failing > 0 && failing < questions.len(), "the sample mixes failing and passing questions");

    let mut pipeline = Pipeline::start(PipelineKind::Migres, &settings, support::parts(&settings)).await.unwrap();
    let mut records = Vec::new();
    pipeline.run(questions.clone(), |record| records.push(record)).await.unwrap();
    let dead_letters = pipeline.dead_letters.load(std::sync::atomic::Ordering::Relaxed);
    pipeline.stop();

    let mut ids: Vec<_> = records.iter().map(|r| r.question_id().to_string()).collect();
    ids.sort();
    let mut expected: Vec<_> = questions.iter().map(|q| q.id.clone()).collect();
    expected.sort();
    assert_eq!(ids, expected, "one record per question, none lost, none doubled");
    let errors = records.iter().filter(|r| matches!(r, AnswerRecord::Error(_))).count();
    assert_eq!(errors, failing);
    assert!(dead_letters <= errors as u64);
}

/// Broken replies: every entailment reply is broken on its first ask and fine when asked again; the
/// first iteration's leaf reply stays broken. The question is still answered, and its record says
/// which stage went on without what it asked for.
#[actix::test]
async fn broken_replies_are_asked_again_or_degrade_visibly_without_ending_the_question() {
    let llm = FakeLlm::start_on_request(|prompt, request| {
        let first_ask = request.get("seed").is_none();
        match prompt_kind(prompt) {
            Prompt::Entailment if first_ask => Reply::Text("{\"entailed\": tr".into()),
            Prompt::Leaf if !support::fake_llm::last_field(prompt, "Question: ").contains("FC Cartagena") => {
                Reply::Text("{\"facts\": [".into())
            }
            _ => hugo_script(prompt),
        }
    })
    .await;
    let settings = support::settings(&llm.base_url);
    let (question, answers, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let mut pipeline = Pipeline::start(PipelineKind::Migres, &settings, support::parts(&settings)).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new(HUGO_QUESTION_ID, question)).await.unwrap();
    pipeline.stop();

    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    assert_eq!(answer.answer, answers[0]);
    assert_eq!(answer.degraded, vec!["leaf".to_string()], "verify's replies were fixed by re-asking");
    let reasked = answer.trace.iter().any(|s| matches!(s.kind, TraceKind::LlmCall { reasks: 1, .. }));
    assert!(reasked, "the trace shows the re-asked calls");
}

/// Hugo's question through MIGRES with `migres.read_first` on and `configure`'s changes, against the
/// LLM at `url`: its answer.
async fn ask_reading_first(url: String, configure: impl FnOnce(&mut Settings)) -> Box<Answered> {
    let mut settings = support::settings(&url);
    settings.migres.read_first = true;
    configure(&mut settings);
    let (question, _, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let mut pipeline = Pipeline::start(PipelineKind::Migres, &settings, support::parts(&settings)).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new(HUGO_QUESTION_ID, question)).await.unwrap();
    pipeline.stop();
    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    answer
}

/// `migres.read_first` (the `adaptive` profile): the first iteration reads the question's best
/// passages once, as VANILLA-s does. An answer those passages write ends the question there, at one
/// call; one they do not write goes round the loop, whose answer replaces it only with better support.
#[actix::test]
async fn with_read_first_a_grounded_first_read_ends_the_question_and_an_ungrounded_one_goes_round_the_loop() {
    let first_read = |answer: &'static str| {
        move |prompt: &str| match prompt_kind(prompt) {
            Prompt::Reader => Reply::Json(json!({"answer": answer, "confidence": 4, "explanation": "read once"})),
            _ => hugo_script(prompt),
        }
    };
    let ask = |url: String| ask_reading_first(url, |_| {});
    let went_on = |answer: &lacuna::topics::Answered| {
        answer.trace.iter().find_map(|s| match &s.kind {
            TraceKind::ReadFirst { went_on, .. } => Some(went_on.clone()),
            _ => None,
        })
    };

    // Hugo's own passage writes "FC Cartagena": the first read stands, and nothing else is asked.
    let llm = FakeLlm::start(first_read("FC Cartagena")).await;
    let answer = ask(llm.base_url.clone()).await;
    assert_eq!(answer.answer, "FC Cartagena");
    assert_eq!((answer.usage.llm_calls, answer.iterations), (1, 1), "one read, no loop");
    assert_eq!(llm.calls_of(Prompt::Leaf), 0);
    assert_eq!(went_on(&answer), Some(Vec::new()));
    assert!(answer.passages.iter().any(|p| p.text.contains("FC Cartagena")), "it cites what it read");

    // No passage shown writes "Andalusia": the loop runs, and its verified Murcia replaces the read.
    let llm = FakeLlm::start(first_read("Andalusia")).await;
    let answer = ask(llm.base_url.clone()).await;
    assert_eq!(went_on(&answer), Some(vec!["ungrounded".to_string()]));
    assert_eq!(answer.answer, "Murcia");
    assert!(answer.iterations >= 2 && llm.calls_of(Prompt::Leaf) >= 2, "the loop ran");
    let chosen = answer.trace.iter().find_map(|s| match &s.kind {
        TraceKind::OneShotOrLoop { one_shot, chosen, .. } => Some((one_shot.clone(), chosen.clone())),
        _ => None,
    });
    assert_eq!(chosen, Some(("Andalusia".to_string(), "Murcia".to_string())));
}

/// The `unsure` check (issue 76, off by default): a first read its own passages write still goes
/// round the loop when the model wrote its answer unsure (its tokens' mean log-probability under
/// `migres.unsure_below`), and the loop's answer, which its evidence writes, replaces it; a sure one
/// ends the question at one call. The read asks for log-probabilities only with the check on.
#[actix::test]
async fn with_the_unsure_check_a_first_read_written_unsure_goes_round_the_loop() {
    let first_read = |logprob: f64| {
        move |prompt: &str| match prompt_kind(prompt) {
            Prompt::Reader => Reply::Scored(
                json!({"explanation": "read once", "answer": "FC Cartagena", "confidence": 4}).to_string(),
                logprob,
            ),
            _ => hugo_script(prompt),
        }
    };
    let ask =
        |url: String| ask_reading_first(url, |settings| settings.migres.read_first_goes_on_when.push(GoOnWhen::Unsure));
    let read_first = |answer: &lacuna::topics::Answered| {
        answer.trace.iter().find_map(|s| match &s.kind {
            TraceKind::ReadFirst { went_on, answer_logprobs, .. } => Some((went_on.clone(), answer_logprobs.clone())),
            _ => None,
        })
    };

    let sure = FakeLlm::start(first_read(-0.1)).await;
    let answer = ask(sure.base_url.clone()).await;
    assert_eq!((answer.answer.as_str(), answer.usage.llm_calls), ("FC Cartagena", 1));
    let (went_on, logprobs) = read_first(&answer).unwrap();
    assert!(went_on.is_empty());
    assert!(logprobs.is_some_and(|l| (l.sum / f64::from(l.tokens) - -0.1).abs() < 1e-9), "the trace keeps them");
    assert_eq!(sure.requests.lock().unwrap()[0]["logprobs"], true, "the read asked for them");

    let unsure = FakeLlm::start(first_read(-2.0)).await;
    let answer = ask(unsure.base_url.clone()).await;
    assert_eq!(read_first(&answer).unwrap().0, ["unsure"]);
    assert_eq!(answer.answer, "Murcia", "the loop's answer, written in its evidence, replaces the unsure read");
}

/// A first read whose reply stays unusable after its re-asks (cut at `max_tokens` each time, as the
/// 1.5B model did on two MuSiQue questions) must not end the question: the read is a shortcut, and
/// the loop is still there. The step is marked degraded and the loop answers.
#[actix::test]
async fn with_read_first_a_first_read_that_stays_broken_leaves_the_question_to_the_loop() {
    let llm = FakeLlm::start(|prompt: &str| match prompt_kind(prompt) {
        Prompt::Reader => Reply::Cut("{\"answer\": \"Mur".into()),
        _ => hugo_script(prompt),
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    settings.migres.read_first = true;
    let (question, answers, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let mut pipeline = Pipeline::start(PipelineKind::Migres, &settings, support::parts(&settings)).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new(HUGO_QUESTION_ID, question)).await.unwrap();
    pipeline.stop();
    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    assert_eq!(answer.answer, answers[0], "the loop answered");
    assert!(answer.degraded.contains(&"sentence_filter".to_string()), "{:?}", answer.degraded);
}
