//! QPaug, RA-ISF and RQ-RAG on the in-process bus with the real index and re-ranker and a scripted LLM
//! over HTTP: each answers the two-hop Hugo question with passages that exist, RA-ISF's recursion and
//! RQ-RAG's tree stop at their depth, and a fan-out whose children do not return in time still ends
//! its question.

mod support;

use std::time::Duration;

use lacuna::config::Settings;
use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::{AnswerRecord, Answered, Outcome, QuestionEvent, TraceKind};
use serde_json::json;
use support::fake_llm::{FakeLlm, Prompt, Reply, last_field, prompt_kind};
use support::methods::{OWN_PASSAGE, SUB1, SUB2, methods_script, slow_second_subquestion};
use support::scripted::HUGO_QUESTION_ID;

fn small(settings: &mut Settings) {
    // Few passages per query keep the re-ranker's CPU time (the cost here) small.
    settings.migres.retrieve_top_n = 8;
    settings.raisf.top_k = 3;
    settings.rqrag.top_k = 3;
}

async fn ask(kind: PipelineKind, settings: &Settings, id: &str, question: &str) -> AnswerRecord {
    let mut pipeline = Pipeline::start(kind, settings, support::parts(settings)).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new(id, question)).await.unwrap();
    pipeline.stop();
    record
}

fn answered(record: AnswerRecord) -> Answered {
    match record {
        AnswerRecord::Answered(answer) => *answer,
        other => panic!("expected an answer, got {other:?}"),
    }
}

/// Every passage the record cites is in the index, with the text the record shows.
fn assert_citations_exist(answer: &Answered) {
    let index = support::search();
    assert!(!answer.passages.is_empty(), "the answer cites passages");
    for passage in &answer.passages {
        let stored = index.passage(&passage.id).unwrap().expect("a cited passage exists in the index");
        assert!(stored.text.contains(passage.text.split("...").next().unwrap().trim()), "the record shows its text");
    }
}

/// The augmented query finds the first hop; the model's own passage supplies the second (the one long
/// query does not rank the FC Cartagena passage high: paper 002's case for passage augmentation).
#[actix::test]
async fn qpaug_searches_with_the_augmented_question_and_shows_its_own_passage_last() {
    let llm = FakeLlm::start(methods_script).await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    let (question, answers, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let answer = answered(ask(PipelineKind::Qpaug, &settings, HUGO_QUESTION_ID, &question).await);

    let prompts = llm.prompts.lock().unwrap().clone();
    let reader = prompts.iter().find(|p| prompt_kind(p) == Prompt::Reader).unwrap();
    assert_eq!(answer.answer, answers[0], "{reader}");
    assert_eq!(answer.queries, vec![format!("{question} {SUB1}\n{SUB2}")], "question plus augmentation");
    assert_citations_exist(&answer);
    assert_eq!(answer.passages.len(), settings.qpaug.top_k - 1, "K-1 retrieved passages");
    assert!(answer.passages.iter().any(|p| p.title == "Hugo Rodríguez Romero"), "the first hop was retrieved");
    let generated = answer.trace.iter().find_map(|s| match &s.kind {
        TraceKind::Augmented { generated_passage, .. } => Some(generated_passage.clone()),
        _ => None,
    });
    assert_eq!(generated.as_deref(), Some(OWN_PASSAGE), "the record shows what the model wrote");
    let own = format!("[{}] Your knowledge: {OWN_PASSAGE}", settings.qpaug.top_k);
    assert!(reader.contains(&own), "the generated passage is the K-th, labelled: {reader}");
    assert_eq!(answer.usage.llm_calls, 3, "augmentation, passage generation, answer");
}

#[actix::test]
async fn qpaug_leaves_out_a_none_passage() {
    let llm = FakeLlm::start(methods_script).await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    let record = ask(PipelineKind::Qpaug, &settings, "q-none", "Which county is FC Cartagena's city in?").await;
    answered(record);
    let prompts = llm.prompts.lock().unwrap().clone();
    let reader = prompts.iter().find(|p| prompt_kind(p) == Prompt::Reader).unwrap();
    assert!(!reader.contains("Your knowledge"), "[NONE] is not shown: {reader}");
}

/// `reader.compare_options` gives the one-call baselines MIGRES's two-option lever, for a
/// like-for-like comparison: the heights are copied from the passages shown, the code compares.
#[actix::test]
async fn a_baseline_with_compare_options_answers_a_two_option_question_by_the_copied_numbers() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::Reader => {
            Reply::Json(json!({"explanation": "Muztagh Ata is higher.", "answer": "Muztagh Ata", "confidence": 4}))
        }
        Prompt::CompareOptions => {
            Reply::Json(json!({"explanation": "the passages", "first": "7,509 metres", "second": "8,163 metres"}))
        }
        _ => Reply::Status(500),
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    let id = "5a756b175542996c70cfaef7";
    let (question, answers, _) = support::question("hotpotqa", id);
    let plain = answered(ask(PipelineKind::VanillaS, &settings, id, &question).await);
    assert_eq!(
        (plain.answer.as_str(), plain.usage.llm_calls),
        ("Muztagh Ata", 1),
        "off by default: the paper's baseline"
    );

    settings.reader.compare_options = true;
    let answer = answered(ask(PipelineKind::VanillaS, &settings, id, &question).await);
    assert_eq!(answer.answer, answers[0], "8,163 metres is higher");
    assert_eq!(answer.usage.llm_calls, 2);
    let prompts = llm.prompts.lock().unwrap().clone();
    let compare = prompts.iter().find(|p| prompt_kind(p) == Prompt::CompareOptions).unwrap();
    assert!(compare.contains("First option: Muztagh Ata\nSecond option: Manaslu"), "{compare}");
    assert!(compare.contains("Information: [1] "), "the documents shown are the Information: {compare}");
}

#[actix::test]
async fn raisf_decomposes_when_nothing_is_relevant_and_answers_from_the_sub_answers() {
    let llm = FakeLlm::start(methods_script).await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    let (question, answers, gold) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let answer = answered(ask(PipelineKind::Raisf, &settings, HUGO_QUESTION_ID, &question).await);

    assert_eq!(answer.answer, answers[0]);
    assert_eq!(answer.outcome, Outcome::Answered);
    let fanned = answer.trace.iter().find_map(|s| match &s.kind {
        TraceKind::FannedOut { children } => Some(children.iter().map(|(_, q)| q.clone()).collect::<Vec<_>>()),
        _ => None,
    });
    assert_eq!(fanned, Some(vec![SUB1.to_string(), SUB2.to_string()]));
    assert!(answer.trace.iter().any(
        |s| matches!(&s.kind, TraceKind::Joined { returned, missing, answers } if returned.len() == 2 && missing.is_empty() && answers.len() == 2)
    ));
    // The sub-answers rest on the two gold passages, which the root's record carries.
    assert_citations_exist(&answer);
    let mut cited: Vec<_> = answer.passages.iter().map(|p| p.id.clone()).collect();
    cited.sort();
    let mut gold = gold;
    gold.sort();
    assert_eq!(cited, gold);
    assert_eq!(answer.usage.llm_calls as usize, llm.calls(), "the children's calls are the root's too");
    assert_eq!(support::deepest_node(&answer), 1);
}

#[actix::test]
async fn raisf_recursion_stops_at_the_depth_threshold() {
    // Nothing is ever relevant and every question splits in two: only D_th stops it.
    let llm = FakeLlm::start(|prompt| {
        let question = last_field(prompt, "Question: ").to_string();
        match prompt_kind(prompt) {
            Prompt::SelfKnowledge => Reply::Json(json!({"known": false})),
            Prompt::Relevance => Reply::Json(json!({"relevant": false})),
            Prompt::Decompose => {
                Reply::Json(json!({"sub_questions": [format!("{question} (a)"), format!("{question} (b)")]}))
            }
            Prompt::Reader => Reply::Json(json!({"answer": "x", "confidence": 1, "explanation": "e"})),
            _ => Reply::Status(400),
        }
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    settings.raisf.max_depth = 2;
    settings.raisf.top_k = 1;
    let answer = answered(
        ask(PipelineKind::Raisf, &settings, "deep", "Who founded the club Hugo Rodríguez Romero plays for?").await,
    );

    assert_eq!(support::deepest_node(&answer), 2, "sub-questions reach depth D_th and no further");
    assert_eq!(llm.calls_of(Prompt::Decompose), 1 + 2, "the root and its two children decompose");
    assert_eq!(llm.calls_of(Prompt::SelfKnowledge), 1 + 2 + 4);
    assert_eq!(answer.outcome, Outcome::Answered);
    assert_eq!(answer.usage.llm_calls as usize, llm.calls());
}

#[actix::test]
async fn a_sub_question_that_fails_is_an_unanswered_child_not_a_lost_question() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::SelfKnowledge if last_field(prompt, "The problem is: ") == SUB1 => Reply::Status(400),
        _ => methods_script(prompt),
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    settings.retry.max_attempts = 1;
    let (question, _, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let answer = answered(ask(PipelineKind::Raisf, &settings, HUGO_QUESTION_ID, &question).await);
    assert!(answer.trace.iter().any(|s| matches!(&s.kind, TraceKind::Failed { .. })));
    assert_eq!(answer.answer, "Murcia", "answered from the sub-question that returned");
}

#[actix::test]
async fn a_fan_out_past_its_deadline_goes_on_with_the_children_that_returned() {
    // The second sub-question's first call takes longer than the join waits.
    let llm = FakeLlm::start(slow_second_subquestion).await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    settings.join.deadline_ms = 2000;
    settings.join.tick_ms = 100;
    let (question, _, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let answer = answered(ask(PipelineKind::Raisf, &settings, HUGO_QUESTION_ID, &question).await);
    assert_eq!(answer.outcome, Outcome::AnsweredAfterDeadline);
    let missing = answer.trace.iter().find_map(|s| match &s.kind {
        TraceKind::Joined { missing, .. } => Some(missing.clone()),
        _ => None,
    });
    assert_eq!(missing, Some(vec![format!("{HUGO_QUESTION_ID}#2")]));
}

#[actix::test]
async fn a_root_none_of_whose_children_return_ends_in_a_deadline_error() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::SelfKnowledge
            if last_field(prompt, "The problem is: ") != last_field(prompt, "The problem is: Hugo") =>
        {
            Reply::Delayed(Duration::from_secs(6), Box::new(Reply::Json(json!({"known": false}))))
        }
        _ => methods_script(prompt),
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    settings.join.deadline_ms = 1500;
    settings.join.tick_ms = 100;
    let (question, _, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let record = ask(PipelineKind::Raisf, &settings, HUGO_QUESTION_ID, &question).await;
    let AnswerRecord::Error(error) = record else { panic!("expected an error record, got {record:?}") };
    assert_eq!(error.error_type, "deadline_exceeded");
    assert_eq!(error.question_id, HUGO_QUESTION_ID);
}

#[actix::test]
async fn rqrag_chooses_among_its_trajectories_by_their_log_probabilities() {
    let llm = FakeLlm::start(methods_script).await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    settings.rqrag.max_depth = 1;
    settings.rqrag.width = 2;
    let (question, answers, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let answer = answered(ask(PipelineKind::Rqrag, &settings, HUGO_QUESTION_ID, &question).await);

    assert_eq!(answer.candidates.len(), 2, "one answer per trajectory");
    assert!(answer.candidates.iter().all(|c| c.logprobs.is_some()), "scored with the server's logprobs");
    assert_eq!(answer.answer, answers[0]);
    let chosen = answer.candidates.iter().find(|c| c.answer == answer.answer).unwrap();
    assert_eq!(chosen.queries.last().map(String::as_str), Some(SUB2), "the rewritten trajectory found the second hop");
    assert_citations_exist(&answer);
    for passage in &answer.passages {
        assert!(chosen.citations.contains(&passage.id), "the answer cites only its own trajectory's passages");
    }
    assert!(
        answer.trace.iter().any(|s| matches!(&s.kind, TraceKind::Selected { strategy, .. } if strategy == "ensemble"))
    );
    assert_eq!(answer.usage.llm_calls as usize, llm.calls());
    let requests = llm.requests.lock().unwrap().clone();
    assert!(requests.iter().any(|r| r["logprobs"] == true), "log-probabilities were asked for");
}

#[actix::test]
async fn rqrag_expands_the_tree_to_its_depth_and_width_and_no_further() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        // Each refinement asks something new, so no branch is cut for repeating a query.
        Prompt::Refine => Reply::Json(json!({"queries": [format!("query {}", rand_suffix())]})),
        Prompt::TrajectoryAnswer => Reply::Scored("Spain".into(), -1.0),
        _ => Reply::Status(400),
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    settings.rqrag.max_depth = 2;
    settings.rqrag.width = 2;
    settings.rqrag.selection = lacuna::config::Selection::Perplexity;
    let answer =
        answered(ask(PipelineKind::Rqrag, &settings, "tree", "Which club does Hugo Rodríguez Romero play for?").await);
    assert_eq!(llm.calls_of(Prompt::Refine), 2 + 4, "the root and its two children refine");
    assert_eq!(llm.calls_of(Prompt::TrajectoryAnswer), 4, "width^depth trajectories answer");
    assert_eq!(answer.candidates.len(), 4);
    assert_eq!(support::deepest_node(&answer), 2);
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

#[actix::test]
async fn raisf_answers_what_the_model_knows_without_retrieval_unless_the_check_is_off() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::SelfKnowledge => Reply::Json(json!({"known": true})),
        _ => methods_script(prompt),
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    let (question, _, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let known = answered(ask(PipelineKind::Raisf, &settings, "known", &question).await);
    assert_eq!(known.usage.llm_calls, 2, "the self-knowledge check and the answer");
    assert!(!known.trace.iter().any(|s| matches!(s.kind, TraceKind::Retrieved { .. })), "nothing retrieved");
    assert!(known.passages.is_empty());

    // The "w/o SKM" ablation: the module is never asked, and the question goes to retrieval.
    settings.raisf.self_knowledge_check = false;
    let before = llm.calls_of(Prompt::SelfKnowledge);
    let retrieved = answered(ask(PipelineKind::Raisf, &settings, HUGO_QUESTION_ID, &question).await);
    assert_eq!(llm.calls_of(Prompt::SelfKnowledge), before, "no self-knowledge call");
    assert!(retrieved.trace.iter().any(|s| matches!(s.kind, TraceKind::Retrieved { .. })));
    assert_eq!(retrieved.answer, "Murcia");
}
