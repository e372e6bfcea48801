use lacuna::actors::runner::Stage;
use lacuna::actors::stages::leaf::Leaf;
use lacuna::topics::{Event, EvidenceEvent, EvidenceItem, EvidenceOrigin, FactsEvent, SCHEMA_VERSION, TraceKind};
use serde_json::json;

use crate::helpers::{memory, single};
use crate::support;
use crate::support::fake_llm::{FakeLlm, Reply, passages_in};

fn item(id: &str, title: &str, text: &str) -> EvidenceItem {
    EvidenceItem { id: id.into(), title: title.into(), text: text.into(), score: 5.0, origin: EvidenceOrigin::Passage }
}

fn evidence(items: Vec<EvidenceItem>) -> EvidenceEvent {
    EvidenceEvent {
        schema_version: SCHEMA_VERSION,
        memory: memory("q"),
        queries: vec!["Who does Hugo play for?".into()],
        evidence: items,
    }
}

#[tokio::test]
async fn facts_cite_passage_ids_not_prompt_positions() {
    let llm = FakeLlm::start(|prompt| {
        // Cite the passage titled "Hugo", wherever it sits in the prompt, and one that does not exist.
        let hugo = passages_in(prompt).into_iter().find(|(_, title, _)| title == "Hugo").unwrap().0;
        Reply::Json(json!({"facts": [
            {"fact": "Hugo plays for FC Cartagena.", "passages": [hugo, 7]},
            {"fact": "   ", "passages": [0]},
        ]}))
    })
    .await;
    let event = evidence(vec![
        item("p-other", "Other", "Other text here."),
        item("p-hugo", "Hugo", "Hugo plays for FC Cartagena."),
    ]);
    let out: FactsEvent = single(Leaf::new(support::llm(&llm.base_url)).process(&event.to_record()).await.unwrap());

    assert_eq!(out.facts.len(), 1, "blank facts are dropped");
    assert_eq!(
        out.facts[0].citations,
        vec!["p-hugo".to_string()],
        "position 1 maps to its id; position 7 does not exist"
    );
    assert_eq!(out.evidence.len(), 2, "evidence travels on for verification");
    assert_eq!(out.memory.usage.llm_calls, 1);
    let request = &llm.requests.lock().unwrap()[0];
    assert_eq!(request["response_format"]["type"], "json_schema", "structured calls send their schema");
    let prompt = &llm.prompts.lock().unwrap()[0];
    assert!(prompt.ends_with("Question: Who does Hugo play for?\nYour response:"), "the iteration's queries come last");
}

#[tokio::test]
async fn no_evidence_means_no_llm_call() {
    let llm = FakeLlm::start(|_| Reply::Status(500)).await;
    let out: FactsEvent =
        single(Leaf::new(support::llm(&llm.base_url)).process(&evidence(vec![]).to_record()).await.unwrap());
    assert!(out.facts.is_empty());
    assert_eq!(llm.calls(), 0);
}

#[tokio::test]
async fn fenced_json_from_a_server_without_schema_support_is_read() {
    let llm = FakeLlm::start(|_| {
        Reply::Text("```json\n{\"facts\": [{\"fact\": \"Hugo is Spanish.\", \"passages\": [0]}]}\n```".into())
    })
    .await;
    let out: FactsEvent = single(
        Leaf::new(support::llm(&llm.base_url))
            .process(&evidence(vec![item("p", "Hugo", "Hugo is Spanish.")]).to_record())
            .await
            .unwrap(),
    );
    assert_eq!(out.facts[0].text, "Hugo is Spanish.");
}

#[tokio::test]
async fn a_reply_that_stays_broken_gives_no_facts_and_marks_the_question_degraded() {
    let llm = FakeLlm::start(|_| Reply::Text("{\"facts\": [{\"fact\": ".into())).await;
    let out: FactsEvent = single(
        Leaf::new(support::llm(&llm.base_url))
            .process(&evidence(vec![item("p", "Hugo", "Hugo is Spanish.")]).to_record())
            .await
            .expect("a broken leaf reply does not end the question"),
    );
    assert!(out.facts.is_empty());
    assert_eq!(llm.calls(), 3, "asked, then re-asked twice");
    assert!(out.memory.trace.iter().any(|s| s.stage == "leaf" && matches!(s.kind, TraceKind::Degraded { .. })));
}
