use lacuna::actors::runner::Stage;
use lacuna::actors::stages::query_gen::QueryGen;
use lacuna::config::{MigresSettings, Settings};
use lacuna::topics::{Event, MissingEvent, QueriesEvent, SCHEMA_VERSION, VerifiedEvent};
use serde_json::json;

use crate::helpers::{memory, single};
use crate::support;
use crate::support::fake_llm::{FakeLlm, Reply};

const QUESTION: &str = "Hugo Rodríguez Romero plays for a team in the autonomous community of what?";

async fn generate(queries: serde_json::Value) -> (FakeLlm, lacuna::topics::Record) {
    generate_for(queries, "The community.").await
}

async fn generate_for(queries: serde_json::Value, missing: &str) -> (FakeLlm, lacuna::topics::Record) {
    let llm = FakeLlm::start(move |_| Reply::Json(json!({"queries": queries.clone()}))).await;
    let stage = QueryGen::new(support::llm(&llm.base_url), Settings::defaults().migres);
    let mut m = memory(QUESTION);
    m.queries.push("Which team does Hugo Rodríguez Romero play for?".into());
    let event = MissingEvent { schema_version: SCHEMA_VERSION, memory: m, missing_information: missing.into() };
    let mut out = stage.process(&event.to_record()).await.unwrap();
    (llm, out.pop().unwrap())
}

#[tokio::test]
async fn repeated_trivial_and_surplus_queries_are_dropped() {
    let (_, record) = generate(json!([
        "which team does Hugo Rodríguez Romero play for",
        "Cartagena?",
        "In which autonomous community is FC Cartagena?",
        "In which autonomous community is FC Cartagena",
        "Where is FC Cartagena based?",
        "What league does FC Cartagena play in?",
        "Who founded FC Cartagena in 1995?",
    ]))
    .await;
    let out: QueriesEvent = single(vec![record]);
    assert_eq!(
        out.queries,
        vec![
            "In which autonomous community is FC Cartagena?".to_string(),
            "Where is FC Cartagena based?".to_string(),
            "What league does FC Cartagena play in?".to_string(),
        ]
    );
    assert_eq!(out.memory.iteration, 2, "new queries start the next iteration");
    assert_eq!(out.memory.queries.len(), 5, "the memory remembers every query asked");
}

#[tokio::test]
async fn with_no_new_query_the_missing_information_is_searched() {
    let (_, record) = generate(json!([QUESTION])).await;
    let out: QueriesEvent = single(vec![record]);
    assert_eq!(out.queries, vec!["The community.".to_string()]);
    assert_eq!(out.memory.iteration, 2);
}

#[tokio::test]
async fn no_new_query_sends_the_question_back_to_main_exhausted() {
    // The missing information was itself asked already.
    let (_, record) = generate_for(json!([QUESTION]), QUESTION).await;
    let out: VerifiedEvent = single(vec![record]);
    assert!(out.memory.exhausted);
    assert_eq!(out.memory.iteration, 1);
}

#[tokio::test]
async fn the_prompt_lists_earlier_queries_and_known_facts() {
    let (llm, _) = generate(json!(["Where is FC Cartagena based?"])).await;
    let prompt = llm.prompts.lock().unwrap()[0].clone();
    assert!(
        prompt.contains(&format!("Historical Questions: {QUESTION} Which team does Hugo Rodríguez Romero play for?"))
    );
    assert!(prompt.contains("Known Information: None\nMissing Information: The community.\nNew queries:"));
}

#[tokio::test]
async fn queries_the_main_module_wrote_are_taken_without_a_call_unless_none_is_new() {
    let llm = FakeLlm::start(|_| Reply::Json(json!({"queries": ["Where is FC Cartagena based?"]}))).await;
    let stage = QueryGen::new(support::llm(&llm.base_url), Settings::defaults().migres);
    let asked = "Which team does Hugo Rodríguez Romero play for?";
    let missing = |proposed: &[&str]| {
        let mut m = memory(QUESTION);
        m.queries.push(asked.into());
        m.proposed_queries = proposed.iter().map(|q| q.to_string()).collect();
        MissingEvent { schema_version: SCHEMA_VERSION, memory: m, missing_information: "The community.".into() }
    };
    let proposed = missing(&[asked, "In which autonomous community is FC Cartagena?"]);
    let out: QueriesEvent = single(stage.process(&proposed.to_record()).await.unwrap());
    assert_eq!(out.queries, vec!["In which autonomous community is FC Cartagena?".to_string()]);
    assert!(out.memory.proposed_queries.is_empty(), "taken, not carried into the next iteration");
    assert_eq!(llm.calls(), 0);

    let nothing_new = missing(&[asked]);
    let out: QueriesEvent = single(stage.process(&nothing_new.to_record()).await.unwrap());
    assert_eq!(out.queries, vec!["Where is FC Cartagena based?".to_string()], "the query generator is asked");
    assert_eq!(llm.calls(), 1);
}

/// A small model copies names from the prompts' worked examples into its queries ("Who was born
/// first, Ann Hui or Dorrin Maskell?" for a question about two other films). With
/// `migres.drop_example_names` such a query asks about nobody the question knows: it is dropped,
/// whether main or the query generator wrote it. A name the examples share with the question is the
/// question's own, and stays. The setting is off by default, and then the copy is asked.
#[tokio::test]
async fn with_drop_example_names_a_query_naming_someone_only_the_prompt_examples_know_is_dropped() {
    let llm = FakeLlm::start(|_| {
        Reply::Json(json!({"queries": ["When was Dorrin Maskell born?", "When was Fred Guiol born?"]}))
    })
    .await;
    let dropping = MigresSettings { drop_example_names: true, ..Settings::defaults().migres };
    let stage = QueryGen::new(support::llm(&llm.base_url), dropping);
    let event = |question: &str, proposed: &[&str]| {
        let mut m = memory(question);
        m.proposed_queries = proposed.iter().map(|q| q.to_string()).collect();
        MissingEvent { schema_version: SCHEMA_VERSION, memory: m, missing_information: "The birth dates.".into() }
    };
    let films = "Which film has the director who was born first, Love In A Fallen City or Mummy's Boys?";
    let copied = event(films, &["Who was born first, Ann Hui or Dorrin Maskell?", "Who directed Mummy's Boys?"]);
    let out: QueriesEvent = single(stage.process(&copied.to_record()).await.unwrap());
    assert_eq!(out.queries, vec!["Who directed Mummy's Boys?".to_string()], "main's copy is dropped");

    let only_copies = event(films, &["When did Dorrin Maskell die?"]);
    let out: QueriesEvent = single(stage.process(&only_copies.to_record()).await.unwrap());
    assert_eq!(out.queries, vec!["When was Fred Guiol born?".to_string()], "and so is the generator's");

    let own = event("Who directed the film Quillfeather?", &["When was the director of Quillfeather born?"]);
    let out: QueriesEvent = single(stage.process(&own.to_record()).await.unwrap());
    assert_eq!(out.queries, vec!["When was the director of Quillfeather born?".to_string()]);

    let by_default = QueryGen::new(support::llm(&llm.base_url), Settings::defaults().migres);
    let out: QueriesEvent = single(by_default.process(&copied.to_record()).await.unwrap());
    assert_eq!(out.queries.len(), 2, "off by default: the copy is asked too");
}
