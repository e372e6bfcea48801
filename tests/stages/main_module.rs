use lacuna::actors::runner::Stage;
use lacuna::actors::stages::main::Main;
use lacuna::config::{Acceptance, DecisionPrompt, MigresSettings, Settings};
use lacuna::topics::{
    AnswerRecord, Event, FactSource, KnownFact, Memory, MissingEvent, OneShot, Outcome, Passage, SCHEMA_VERSION,
    VerifiedEvent, VersionedAnswer,
};
use serde_json::json;

use crate::helpers::{memory, single};
use crate::support;
use crate::support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};

fn decision(answerable: bool, answer: &str, missing: &str) -> Reply {
    Reply::Json(
        json!({"answerable": answerable, "answer": answer, "confidence": 4, "explanation": "because", "missing_information": missing}),
    )
}

/// A fact of iteration 1; a verified one cites passage "p".
fn fact(text: &str, source: FactSource) -> KnownFact {
    let citations = if source == FactSource::Verified { vec!["p".to_string()] } else { Vec::new() };
    KnownFact { text: text.into(), citations, source, iteration: 1 }
}

fn with_fact(mut m: Memory, iteration: u32) -> Memory {
    m.facts.push(KnownFact {
        text: "Hugo plays for FC Cartagena of Murcia.".into(),
        citations: vec!["p".into()],
        source: FactSource::Verified,
        iteration,
    });
    m.iteration = iteration;
    m
}

async fn run(llm: &FakeLlm, m: Memory) -> lacuna::topics::Record {
    run_with(llm, m, Settings::defaults().migres).await
}

async fn run_with(llm: &FakeLlm, m: Memory, settings: MigresSettings) -> lacuna::topics::Record {
    let stage = Main::new(support::llm(&llm.base_url), settings);
    let mut out =
        stage.process(&VerifiedEvent { schema_version: SCHEMA_VERSION, memory: m }.to_record()).await.unwrap();
    assert_eq!(out.len(), 1);
    out.pop().unwrap()
}

fn answered(record: lacuna::topics::Record) -> Box<lacuna::topics::Answered> {
    match VersionedAnswer::from_payload(&record.payload).unwrap().record {
        AnswerRecord::Answered(a) => a,
        AnswerRecord::Error(e) => panic!("unexpected error record {e:?}"),
    }
}

#[tokio::test]
async fn an_answerable_decision_ends_the_question_with_its_facts() {
    let llm = FakeLlm::start(|_| decision(true, "Murcia", "")).await;
    let a = answered(run(&llm, with_fact(memory("Where?"), 1)).await);
    assert_eq!(a.answer, "Murcia");
    assert_eq!(a.outcome, Outcome::Answered);
    assert_eq!(a.facts.len(), 1);
    assert!(
        llm.prompts.lock().unwrap()[0]
            .ends_with("Information: Hugo plays for FC Cartagena of Murcia.\nQuestion: Where?\nYour response:")
    );
}

#[tokio::test]
async fn unanswerable_sends_the_missing_information_on() {
    let llm = FakeLlm::start(|_| decision(false, "unanswerable", "The autonomous community of FC Cartagena.")).await;
    let record = run(&llm, with_fact(memory("Where?"), 1)).await;
    let missing: MissingEvent = single(vec![record]);
    assert_eq!(missing.missing_information, "The autonomous community of FC Cartagena.");
    assert_eq!(missing.memory.last_missing, missing.missing_information);
}

#[tokio::test]
async fn the_word_unanswerable_overrides_the_flag() {
    let llm = FakeLlm::start(|_| decision(true, "Unanswerable", "The team of Hugo.")).await;
    let record = run(&llm, memory("Where?")).await;
    let _missing: MissingEvent = single(vec![record]);
}

#[tokio::test]
async fn at_the_iteration_limit_it_answers_with_what_is_known() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::Main => decision(false, "unanswerable", "The autonomous community."),
        Prompt::FinalAnswer => Reply::Json(json!({"answer": "Murcia", "confidence": 2, "explanation": "guess"})),
        _ => Reply::Status(500),
    })
    .await;
    let t = Settings::defaults().migres.max_iterations;
    let a = answered(run(&llm, with_fact(memory("Where?"), t)).await);
    assert_eq!(a.outcome, Outcome::AnsweredAtLimit);
    assert_eq!(a.answer, "Murcia");
    assert_eq!(a.usage.llm_calls, 2);
}

#[tokio::test]
async fn an_iteration_without_new_facts_reuses_the_missing_information() {
    let llm = FakeLlm::start(|_| Reply::Status(500)).await;
    let mut m = with_fact(memory("Where?"), 1);
    m.iteration = 2;
    m.last_missing = "The autonomous community of FC Cartagena.".into();
    let missing: MissingEvent = single(vec![run(&llm, m).await]);
    assert_eq!(missing.missing_information, "The autonomous community of FC Cartagena.");
    assert_eq!(llm.calls(), 0, "main is not asked again when nothing changed");
}

#[tokio::test]
async fn with_stop_when_not_learning_an_iteration_that_verified_nothing_new_answers_now() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::FinalAnswer => Reply::Json(json!({"answer": "Murcia", "confidence": 2, "explanation": "facts"})),
        _ => Reply::Status(500),
    })
    .await;
    let settings = MigresSettings { stop_when_not_learning: true, ..Settings::defaults().migres };
    // Iteration 2 learned only a closed-book guess: that is not learning from the corpus.
    let mut m = with_fact(memory("Where?"), 1);
    m.facts.push(KnownFact { iteration: 2, ..fact("Hugo lives in Spain.", FactSource::ModelKnowledge) });
    m.iteration = 2;
    m.last_missing = "The autonomous community of FC Cartagena.".into();
    let a = answered(run_with(&llm, m.clone(), settings.clone()).await);
    assert_eq!((a.outcome, a.answer.as_str(), a.usage.llm_calls), (Outcome::AnsweredAtLimit, "Murcia", 1));
    assert!(a.trace.iter().any(|s| matches!(s.kind, lacuna::topics::TraceKind::StoppedLearning { new_facts: 1 })));

    // A new verified fact in iteration 2 keeps the loop going; so does the first iteration, whatever it found.
    let llm = FakeLlm::start(|_| decision(false, "unanswerable", "The autonomous community.")).await;
    let _goes_on: MissingEvent = single(vec![run_with(&llm, with_fact(m, 2), settings.clone()).await]);
    let _goes_on: MissingEvent = single(vec![run_with(&llm, memory("Where?"), settings).await]);
}

#[tokio::test]
async fn with_queries_from_main_the_decision_writes_the_next_queries() {
    let llm = FakeLlm::start(|_| {
        Reply::Json(json!({"explanation": "The team is known, not its community.",
            "missing_information": "The autonomous community of FC Cartagena.",
            "queries": ["In which autonomous community is FC Cartagena?"],
            "answerable": false, "answer": "unanswerable", "confidence": 1}))
    })
    .await;
    let settings = MigresSettings { queries_from_main: true, ..Settings::defaults().migres };
    let mut m = with_fact(memory("Where?"), 1);
    m.queries.push("Which team does Hugo play for?".into());
    let missing: MissingEvent = single(vec![run_with(&llm, m, settings).await]);
    assert_eq!(missing.memory.proposed_queries, vec!["In which autonomous community is FC Cartagena?".to_string()]);
    let prompt = llm.prompts.lock().unwrap()[0].clone();
    assert!(prompt.contains("Historical Questions: Where? Which team does Hugo play for?\nInformation:"), "{prompt}");
}

#[tokio::test]
async fn an_exhausted_question_is_answered_at_once() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::FinalAnswer => Reply::Json(json!({"answer": "Murcia", "confidence": 2, "explanation": "guess"})),
        _ => Reply::Status(500),
    })
    .await;
    let mut m = memory("Where?");
    m.exhausted = true;
    assert_eq!(answered(run(&llm, m).await).outcome, Outcome::AnsweredAtLimit);
}

#[tokio::test]
async fn a_yes_no_question_is_asked_for_yes_or_no() {
    let llm = FakeLlm::start(|_| decision(true, "no", "")).await;
    let mut m = with_fact(memory("q"), 1);
    m.yes_no = true;
    let answer = answered(run(&llm, m).await);
    assert_eq!(answer.answer, "no");
    let prompts = llm.prompts.lock().unwrap().clone();
    assert!(prompts[0].contains(r#"whether the answer to the Question is "yes" or "no""#), "{}", prompts[0]);

    let plain = FakeLlm::start(|_| decision(true, "Murcia", "")).await;
    run(&plain, with_fact(memory("q"), 1)).await;
    assert!(!plain.prompts.lock().unwrap()[0].contains(r#""yes" or "no""#), "other questions are not");
}

#[tokio::test]
async fn an_answer_the_facts_do_not_support_goes_round_the_loop() {
    // The first hop is known, and the model answers the second from belief (the README's question
    // was answered Andalusia this way).
    let llm = FakeLlm::start(|_| decision(true, "Andalusia", "")).await;
    let mut m = memory("Where?");
    m.facts.push(fact("Hugo plays for FC Cartagena.", FactSource::Verified));
    let missing: MissingEvent = single(vec![run(&llm, m.clone()).await]);
    assert_eq!(missing.missing_information, "because", "the explanation stands in for an empty summary");
    let held_back = missing.memory.trace.iter().find_map(|step| match &step.kind {
        lacuna::topics::TraceKind::Decision { held_back, .. } => held_back.clone(),
        _ => None,
    });
    assert_eq!(held_back.as_deref(), Some("ungrounded"), "the record says why the answer was held back");

    let mut no_gate = Settings::defaults().migres;
    no_gate.grounding_gate = false;
    assert_eq!(answered(run_with(&llm, m, no_gate).await).answer, "Andalusia");
}

#[tokio::test]
async fn an_answer_from_model_knowledge_alone_is_not_accepted() {
    let llm = FakeLlm::start(|_| decision(true, "Murcia", "")).await;
    let mut m = memory("Where?");
    m.facts.push(fact("FC Cartagena is based in Murcia.", FactSource::ModelKnowledge));
    let _missing: MissingEvent = single(vec![run(&llm, m).await]);
}

#[tokio::test]
async fn an_answer_needs_confidence_and_under_the_official_rule_nothing_missing() {
    let unsure = FakeLlm::start(|_| {
        Reply::Json(json!({"explanation": "probably", "missing_information": "", "answerable": true, "answer": "Murcia", "confidence": 3}))
    })
    .await;
    let _missing: MissingEvent = single(vec![run(&unsure, with_fact(memory("Where?"), 1)).await]);
    // A small model often adds something "missing" to an answer it is sure of: the official rule
    // (the default) holds it back, "confident" takes it.
    let still_missing = FakeLlm::start(|_| decision(true, "Murcia", "The province of FC Cartagena's stadium.")).await;
    let _missing: MissingEvent = single(vec![run(&still_missing, with_fact(memory("Where?"), 1)).await]);
    let mut confident = Settings::defaults().migres;
    confident.acceptance = Acceptance::Confident;
    assert_eq!(answered(run_with(&still_missing, with_fact(memory("Where?"), 1), confident).await).answer, "Murcia");

    let mut flag = Settings::defaults().migres;
    flag.acceptance = Acceptance::Flag;
    assert_eq!(answered(run_with(&unsure, with_fact(memory("Where?"), 1), flag).await).answer, "Murcia");
}

#[tokio::test]
async fn the_attempt_prompt_asks_for_an_answer_not_a_flag() {
    let mut attempt = Settings::defaults().migres;
    attempt.decision_prompt = DecisionPrompt::Attempt;
    let llm = FakeLlm::start(|_| {
        Reply::Json(json!({"explanation": "Hugo plays for FC Cartagena of Murcia.", "answer": "Murcia", "confidence": 5, "missing_information": ""}))
    })
    .await;
    assert_eq!(answered(run_with(&llm, with_fact(memory("Where?"), 1), attempt.clone()).await).answer, "Murcia");
    let request = llm.requests.lock().unwrap()[0].clone();
    let schema = &request["response_format"]["json_schema"]["schema"];
    let keys: Vec<&str> = schema["properties"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["explanation", "answer", "confidence", "missing_information"], "reasoning first, no flag");

    let unanswerable = FakeLlm::start(|_| {
        Reply::Json(json!({"explanation": "No team is named.", "answer": "unanswerable", "confidence": 1, "missing_information": "The team of Hugo."}))
    })
    .await;
    let missing: MissingEvent = single(vec![run_with(&unanswerable, with_fact(memory("Where?"), 1), attempt).await]);
    assert_eq!(missing.missing_information, "The team of Hugo.");

    let flag = FakeLlm::start(|_| decision(true, "Murcia", "")).await;
    answered(run(&flag, with_fact(memory("Where?"), 1)).await);
    let request = flag.requests.lock().unwrap()[0].clone();
    assert!(request["response_format"]["json_schema"]["schema"]["properties"]["answerable"].is_object());
}

#[tokio::test]
async fn at_the_limit_an_answer_held_back_is_given_without_another_call() {
    let llm = FakeLlm::start(|_| decision(true, "Andalusia", "")).await;
    let mut m = memory("Where?");
    m.iteration = Settings::defaults().migres.max_iterations;
    let a = answered(run(&llm, m).await);
    assert_eq!((a.answer.as_str(), a.outcome), ("Andalusia", Outcome::AnsweredAtLimit));
    assert_eq!(llm.calls(), 1);
}

#[tokio::test]
async fn at_the_limit_a_non_answer_is_asked_again_for_a_best_guess() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::FinalAnswer if prompt.contains("best guess") => {
            Reply::Json(json!({"explanation": "a guess", "answer": "Murcia", "confidence": 2}))
        }
        Prompt::FinalAnswer => {
            Reply::Json(json!({"explanation": "not in the facts", "answer": "None", "confidence": 1}))
        }
        _ => Reply::Status(500),
    })
    .await;
    let mut m = memory("Where?");
    m.exhausted = true;
    let a = answered(run(&llm, m).await);
    assert_eq!(a.answer, "Murcia");
    assert_eq!(a.usage.llm_calls, 2);
}

/// The facts settle nothing and the guess is "unknown" too: the best passage found, never shown
/// (under the threshold), says it plainly, and the reader fallback answers from it, citing it.
#[tokio::test]
async fn at_the_limit_a_non_answer_is_read_from_the_best_passages_found() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::FinalAnswer => {
            Reply::Json(json!({"explanation": "not in the facts", "answer": "unknown", "confidence": 1}))
        }
        Prompt::Reader if prompt.contains("[1] Tom Quill: Tom Quill was born in Lindon.") => {
            Reply::Json(json!({"explanation": "[1] says so", "answer": "Lindon", "confidence": 4}))
        }
        _ => Reply::Status(500),
    })
    .await;
    let rovers = passage("rovers", "Harwick Rovers", "Harwick Rovers play in blue.");
    let quill = passage("quill", "Tom Quill", "Tom Quill was born in Lindon.");
    let mut m = memory("Where was the goalkeeper of Harwick Rovers born?");
    m.exhausted = true;
    m.note_scored([(&rovers, 2.0), (&quill, 3.5)]);
    let a = answered(run(&llm, m.clone()).await);
    assert_eq!((a.answer.as_str(), a.outcome), ("Lindon", Outcome::AnsweredAtLimit));
    assert_eq!(a.usage.llm_calls, 3, "final answer, best guess, then the reader");
    let cited: Vec<&str> = a.passages.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(cited, ["quill", "rovers"], "the passages read are the answer's citations");

    let mut settings = Settings::defaults().migres;
    settings.reader_fallback = false;
    let a = answered(run_with(&llm, m.clone(), settings).await);
    assert_eq!((a.answer.as_str(), a.usage.llm_calls), ("unknown", 2), "the switch turns it off");

    // A reader reply that stays broken leaves the answer in hand, marked degraded, not an error.
    let broken = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::FinalAnswer => {
            Reply::Json(json!({"explanation": "not in the facts", "answer": "unknown", "confidence": 1}))
        }
        _ => Reply::Text("{\"explanation\": \"cut".into()),
    })
    .await;
    let a = answered(run(&broken, m).await);
    assert_eq!(a.answer, "unknown");
    assert_eq!(a.degraded, ["main"]);
    let degraded = a.trace.iter().find_map(|step| match &step.kind {
        lacuna::topics::TraceKind::Degraded { message, .. } => Some(message.clone()),
        _ => None,
    });
    assert!(degraded.is_some_and(|m| m.starts_with("reader fallback:")), "the trace says which call");
}

fn passage(id: &str, title: &str, text: &str) -> Passage {
    Passage { id: id.into(), title: title.into(), text: text.into() }
}

#[tokio::test]
async fn the_main_module_reads_the_passages_its_facts_cite() {
    let llm = FakeLlm::start(|_| decision(true, "Murcia", "")).await;
    let mut m = with_fact(memory("Where?"), 1);
    m.cited_passages.insert(
        "p".into(),
        Passage { id: "p".into(), title: "FC Cartagena".into(), text: "FC Cartagena is a club in Murcia.".into() },
    );
    answered(run(&llm, m).await);
    let prompt = llm.prompts.lock().unwrap()[0].clone();
    assert!(
        prompt.contains(
            "Passages behind these facts:\n(Title: FC Cartagena) FC Cartagena is a club in Murcia.\nQuestion: Where?"
        ),
        "{prompt}"
    );
}

#[tokio::test]
async fn self_consistency_votes_over_samples_with_their_own_seeds() {
    // Two of three samples answer Murcia: the vote answers Murcia.
    let llm = FakeLlm::start_on_request(|_, body| match body["seed"].as_u64() {
        Some(2) => decision(true, "Andalusia", ""),
        _ => decision(true, "Murcia", ""),
    })
    .await;
    let mut settings = Settings::defaults().migres;
    settings.decision_samples = 3;
    let a = answered(run_with(&llm, with_fact(memory("Where?"), 1), settings).await);
    assert_eq!(a.answer, "Murcia");
    assert_eq!(a.usage.llm_calls, 3, "each sample is a call");
    let requests = llm.requests.lock().unwrap().clone();
    let mut seeds: Vec<u64> = requests.iter().map(|r| r["seed"].as_u64().unwrap()).collect();
    seeds.sort();
    assert_eq!(seeds, vec![1, 2, 3]);
    assert!(requests.iter().all(|r| r["temperature"].as_f64().unwrap() > 0.5), "samples are drawn, not greedy");
}

/// A two-option comparison whose both dates are verified, answered the wrong way round by the
/// model (2WikiMultihopQA: Bernhardt died 1981, Boese 1958, "Payment on Demand" answered).
fn two_directors() -> Memory {
    let mut m = memory("Which film has the director died earlier, Payment On Demand or My Cousin From Warsaw?");
    for text in [
        "Curtis Bernhardt directed Payment on Demand.",
        "Carl Boese directed My Cousin from Warsaw.",
        "Curtis Bernhardt died on 22 February 1981.",
        "Carl Boese died on 6 July 1958.",
    ] {
        m.facts.push(fact(text, FactSource::Verified));
    }
    m
}

#[tokio::test]
async fn a_two_option_comparison_is_decided_by_the_copied_dates_not_the_model() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::Main => decision(true, "Payment on Demand", ""),
        Prompt::CompareOptions => Reply::Json(
            json!({"explanation": "Bernhardt died 1981, Boese 1958.", "first": "22 February 1981", "second": "6 July 1958"}),
        ),
        _ => Reply::Status(500),
    })
    .await;
    let a = answered(run(&llm, two_directors()).await);
    assert_eq!(a.answer, "My Cousin From Warsaw", "1958 is earlier than 1981");
    assert_eq!(a.usage.llm_calls, 2, "one more call, to copy the dates");
    let prompts = llm.prompts.lock().unwrap().clone();
    let compare = prompts.iter().find(|p| prompt_kind(p) == Prompt::CompareOptions).unwrap();
    assert!(compare.contains("First option: Payment On Demand\nSecond option: My Cousin From Warsaw"), "{compare}");
    assert!(compare.contains("Carl Boese died on 6 July 1958."), "the verified facts are read: {compare}");
    let settled = a.trace.iter().find_map(|step| match &step.kind {
        lacuna::topics::TraceKind::OptionsSettled { answer_before, answer, values } => {
            Some((answer_before.clone(), answer.clone(), values.len()))
        }
        _ => None,
    });
    assert_eq!(settled, Some(("Payment on Demand".into(), "My Cousin From Warsaw".into(), 2)), "the trace shows why");

    // A date the facts do not give leaves the model's answer; the lever off makes no extra call.
    let unknown = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::Main => decision(true, "Payment on Demand", ""),
        Prompt::CompareOptions => {
            Reply::Json(json!({"explanation": "no date for Boese", "first": "22 February 1981", "second": "unknown"}))
        }
        _ => Reply::Status(500),
    })
    .await;
    assert_eq!(answered(run(&unknown, two_directors()).await).answer, "Payment on Demand");
    let mut off = Settings::defaults().migres;
    off.compare_options = false;
    let plain = FakeLlm::start(|_| decision(true, "Payment on Demand", "")).await;
    assert_eq!(answered(run_with(&plain, two_directors(), off).await).answer, "Payment on Demand");
    assert_eq!(plain.calls(), 1);
}

/// Boese's death date is in a passage the re-ranker found but no fact cites: with
/// `compare_reads_found` the comparator reads it there, and the dates decide.
#[tokio::test]
async fn the_comparison_can_read_a_date_from_a_found_passage_no_fact_cites() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::Main => decision(true, "Payment on Demand", ""),
        Prompt::CompareOptions => {
            let second =
                if prompt.contains("Other passages found:\n(Title: Carl Boese) Carl Boese (1887 – 6 July 1958)") {
                    "6 July 1958"
                } else {
                    "unknown"
                };
            Reply::Json(json!({"explanation": "copied", "first": "22 February 1981", "second": second}))
        }
        _ => Reply::Status(500),
    })
    .await;
    let mut m = two_directors();
    m.facts.retain(|f| !f.text.contains("6 July 1958"));
    let boese = passage("boese", "Carl Boese", "Carl Boese (1887 – 6 July 1958) was a German film director.");
    m.note_scored([(&boese, 5.0)]);
    let mut settings = Settings::defaults().migres;
    settings.compare_reads_found = false;
    assert_eq!(answered(run_with(&llm, m.clone(), settings.clone()).await).answer, "Payment on Demand");
    settings.compare_reads_found = true;
    assert_eq!(answered(run_with(&llm, m, settings).await).answer, "My Cousin From Warsaw");
}

#[tokio::test]
async fn an_unusable_comparison_reply_keeps_the_answer_and_says_so() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::Main => decision(true, "Payment on Demand", ""),
        Prompt::CompareOptions => Reply::Text("{\"explanation\": \"cut".into()),
        _ => Reply::Status(500),
    })
    .await;
    let a = answered(run(&llm, two_directors()).await);
    assert_eq!(a.answer, "Payment on Demand");
    assert!(a.degraded.iter().any(|d| d.contains("main")), "{:?}", a.degraded);
}

/// `migres.ends_with_an_option`: the first read named a director, the loop another, and the loop's
/// own comparison lacked the first director's year. Compared once more over both reads' evidence,
/// the first read's passage gives it, and the question ends with an option.
#[tokio::test]
async fn with_ends_with_an_option_a_two_option_question_is_compared_over_both_reads() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::CompareOptions if prompt.contains("Passages read first:") => {
            Reply::Json(json!({"explanation": "copied", "first": "1931", "second": "1948"}))
        }
        Prompt::CompareOptions => {
            Reply::Json(json!({"explanation": "not given", "first": "unknown", "second": "1948"}))
        }
        _ => decision(true, "Ona Pell", ""),
    })
    .await;
    let mut m = memory("Which film has the director born earlier, Lone Tarn or Harrow Lights?");
    m.facts.push(fact("Ona Pell, the director of the second film, was born in 1948.", FactSource::Verified));
    m.cited_passages.insert("p".into(), passage("p", "Ona Pell", "Ona Pell (born 1948) is a film director."));
    m.iteration = 1;
    m.one_shot = Some(OneShot {
        answer: "Cal Verrin".into(),
        confidence: 3.0,
        explanation: "read".into(),
        passages: vec![passage("tarn", "Lone Tarn", "Lone Tarn is a 1970 film directed by Cal Verrin (born 1931).")],
        went_on: vec!["not_an_option".into()],
    });
    let on = MigresSettings { ends_with_an_option: true, ..Settings::defaults().migres };
    let a = answered(run_with(&llm, m.clone(), on).await);
    assert_eq!(a.answer, "Lone Tarn");
    assert_eq!(a.usage.llm_calls, 3, "the decision, the loop's comparison, the comparison over both reads");
    // Off, as the default ships: the first read's director stays.
    let a = answered(run(&llm, m).await);
    assert_eq!((a.answer.as_str(), a.usage.llm_calls), ("Cal Verrin", 2));
}

/// `migres.final_read`: when the loop ran after a first read, the reader reads once more over the
/// first read's passages and the loop's kept sentences, and its answer ends the question; the
/// passages it read become the answer's citations.
#[tokio::test]
async fn with_final_read_the_reader_answers_over_both_reads_passages() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        // Only with both passages before it does the reader reach the second hop.
        Prompt::Reader if prompt.contains("Ben Quill") && prompt.contains("Harwick Rovers") => {
            Reply::Json(json!({"explanation": "read", "answer": "Lindon", "confidence": 4}))
        }
        Prompt::Reader => Reply::Json(json!({"explanation": "read", "answer": "Harwick", "confidence": 4})),
        // The loop answers with the goalkeeper, not his father's birthplace.
        _ => decision(true, "Tom Quill", ""),
    })
    .await;
    let mut m = memory("Where was the father of the Harwick Rovers goalkeeper born?");
    m.facts.push(fact("Ben Quill, Tom Quill's father, was born in Lindon.", FactSource::Verified));
    m.cited_passages
        .insert("p".into(), passage("p", "Ben Quill", "Ben Quill, father of Tom Quill, was born in Lindon."));
    m.one_shot = Some(OneShot {
        answer: "Harwick".into(),
        confidence: 3.0,
        explanation: "read".into(),
        passages: vec![passage("rovers", "Harwick Rovers", "Harwick Rovers' goalkeeper is Tom Quill.")],
        went_on: vec!["ungrounded".into()],
    });
    let on = MigresSettings { final_read: true, ..Settings::defaults().migres };
    let a = answered(run_with(&llm, m.clone(), on).await);
    assert_eq!(a.answer, "Lindon");
    assert_eq!(a.usage.llm_calls, 2, "the decision, then the read over both");
    let cited: Vec<&str> = a.passages.iter().map(|p| p.id.as_str()).collect();
    assert!(cited.contains(&"rovers") && cited.contains(&"p"), "{cited:?}");
    // Off, as the default ships: both answers are written in their reads' evidence, so the first
    // read's stays.
    let a = answered(run(&llm, m).await);
    assert_eq!((a.answer.as_str(), a.usage.llm_calls), ("Harwick", 1));
}
