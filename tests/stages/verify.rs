use lacuna::actors::clients::Nli;
use lacuna::actors::runner::Stage;
use lacuna::actors::stages::verify::Verify;
use lacuna::topics::{
    CandidateFact, Event, EvidenceItem, EvidenceOrigin, FactSource, FactsEvent, SCHEMA_VERSION, TraceKind,
    VerifiedEvent,
};
use serde_json::json;

use crate::helpers::{memory, single};
use crate::support;
use crate::support::fake_llm::{FakeLlm, Reply, last_field};

/// A judge that says "entailed" only when the premise contains the hypothesis word for word.
async fn literal_judge() -> FakeLlm {
    FakeLlm::start(|prompt| {
        let premise = last_field(prompt, "Premise: ");
        let hypothesis = last_field(prompt, "Hypothesis: ");
        Reply::Json(json!({"entailed": premise.contains(hypothesis)}))
    })
    .await
}

fn item(id: &str, text: &str, origin: EvidenceOrigin) -> EvidenceItem {
    EvidenceItem { id: id.into(), title: "T".into(), text: text.into(), score: 1.0, origin }
}

fn fact(text: &str, citations: &[&str]) -> CandidateFact {
    CandidateFact { text: text.into(), citations: citations.iter().map(|c| c.to_string()).collect() }
}

async fn verify(llm: &FakeLlm, evidence: Vec<EvidenceItem>, facts: Vec<CandidateFact>) -> VerifiedEvent {
    verify_reciting(llm, 0, evidence, facts).await
}

async fn verify_reciting(
    llm: &FakeLlm,
    recite_uncited: usize,
    evidence: Vec<EvidenceItem>,
    facts: Vec<CandidateFact>,
) -> VerifiedEvent {
    let stage = Verify::new(Nli::LlmJudge(support::llm(&llm.base_url), lacuna::config::EntailmentPrompt::Strict))
        .with_recite_uncited(recite_uncited);
    let event = FactsEvent { schema_version: SCHEMA_VERSION, memory: memory("q"), evidence, facts };
    single(stage.process(&event.to_record()).await.unwrap())
}

#[tokio::test]
async fn a_fact_no_cited_passage_entails_is_dropped() {
    let llm = literal_judge().await;
    let evidence = vec![item("a", "Hugo plays for FC Cartagena.", EvidenceOrigin::Passage)];
    let out = verify(&llm, evidence, vec![fact("Hugo plays for Real Madrid.", &["a"])]).await;
    assert!(out.memory.facts.is_empty());
    assert!(
        out.memory
            .trace
            .iter()
            .any(|s| matches!(&s.kind, TraceKind::FactDropped { reason, .. } if reason.contains("not entailed")))
    );
}

#[tokio::test]
async fn a_fact_is_kept_when_its_second_citation_entails_it() {
    let llm = literal_judge().await;
    let evidence = vec![
        item("a", "Something unrelated.", EvidenceOrigin::Passage),
        item("b", "Hugo plays for FC Cartagena.", EvidenceOrigin::Passage),
    ];
    let out = verify(&llm, evidence, vec![fact("Hugo plays for FC Cartagena.", &["a", "b"])]).await;
    let kept = &out.memory.facts[0];
    assert_eq!(kept.citations, vec!["b".to_string()], "the answer cites the passage that entails the fact");
    assert_eq!(kept.source, FactSource::Verified);
    assert_eq!(out.memory.uses("a"), 1, "every citation of a kept fact counts a use");
    assert_eq!(out.memory.uses("b"), 1);
    assert_eq!(out.memory.cited_passages["b"].text, "Hugo plays for FC Cartagena.");
    assert_eq!(out.memory.usage.llm_calls, 2, "each judgement is an LLM call");
}

#[tokio::test]
async fn a_true_fact_citing_the_wrong_passage_is_kept_citing_the_right_one() {
    let llm = literal_judge().await;
    let evidence = vec![
        item("eabl", "East African Breweries is a Kenya-based holding company.", EvidenceOrigin::Passage),
        item("tusker", "Tusker is owned by East African Breweries.", EvidenceOrigin::Passage),
        item("other", "Tusker is a lager.", EvidenceOrigin::Passage),
    ];
    let slip = || vec![fact("Tusker is owned by East African Breweries.", &["eabl"])];
    let out = verify(&llm, evidence.clone(), slip()).await;
    assert!(out.memory.facts.is_empty(), "the paper's check: citations only");

    let out = verify_reciting(&llm, 4, evidence, slip()).await;
    let kept = &out.memory.facts[0];
    assert_eq!(kept.citations, vec!["tusker".to_string()], "cites the passage that entails it");
    assert_eq!(out.memory.cited_passages["tusker"].text, "Tusker is owned by East African Breweries.");
    assert_eq!(out.memory.uses("tusker"), 1, "the entailing passage has done its work");
    let verdicts: Vec<(&str, bool)> = out
        .memory
        .trace
        .iter()
        .filter_map(|s| match &s.kind {
            TraceKind::Verdict { passage_id, entailed, .. } => Some((passage_id.as_str(), *entailed)),
            _ => None,
        })
        .collect();
    assert_eq!(
        verdicts,
        vec![("eabl", false), ("tusker", true)],
        "the leaf's citation first, then the others in order"
    );
}

#[tokio::test]
async fn reciting_is_bounded_and_never_rescues_an_uncited_fact() {
    let llm = literal_judge().await;
    let evidence = vec![
        item("a", "Something unrelated.", EvidenceOrigin::Passage),
        item("b", "Nothing here either.", EvidenceOrigin::Passage),
        item("c", "Hugo plays for FC Cartagena.", EvidenceOrigin::Passage),
    ];
    let out = verify_reciting(&llm, 1, evidence.clone(), vec![fact("Hugo plays for FC Cartagena.", &["a"])]).await;
    assert!(out.memory.facts.is_empty(), "only one uncited passage is tried, and it does not entail the fact");
    assert_eq!(llm.calls(), 2);
    let out = verify_reciting(&llm, 4, evidence, vec![fact("Hugo plays for FC Cartagena.", &[])]).await;
    assert!(out.memory.facts.is_empty(), "a fact with no valid citation is the leaf's invention");
    assert_eq!(llm.calls(), 2, "and costs no call");
}

#[tokio::test]
async fn a_fact_without_valid_citations_is_dropped_without_a_call() {
    let llm = literal_judge().await;
    let evidence = vec![item("a", "Hugo plays for FC Cartagena.", EvidenceOrigin::Passage)];
    let out = verify(&llm, evidence, vec![fact("Hugo plays for FC Cartagena.", &[])]).await;
    assert!(out.memory.facts.is_empty());
    assert_eq!(llm.calls(), 0);
}

#[tokio::test]
async fn a_fact_from_model_knowledge_is_kept_but_labelled_unverified() {
    let llm = literal_judge().await;
    let evidence = vec![item("knowledge-1", "Hugo plays for FC Cartagena.", EvidenceOrigin::ModelKnowledge)];
    let out = verify(&llm, evidence, vec![fact("Hugo plays for FC Cartagena.", &["knowledge-1"])]).await;
    let kept = &out.memory.facts[0];
    assert_eq!(kept.source, FactSource::ModelKnowledge);
    assert!(kept.citations.is_empty(), "model knowledge is no passage");
    assert!(out.memory.cited_passages.is_empty());
}

#[tokio::test]
async fn a_known_fact_is_not_added_twice() {
    let llm = literal_judge().await;
    let evidence = vec![item("a", "Hugo plays for FC Cartagena.", EvidenceOrigin::Passage)];
    let same = "Hugo plays for FC Cartagena.";
    let out = verify(&llm, evidence, vec![fact(same, &["a"]), fact(same, &["a"])]).await;
    assert_eq!(out.memory.facts.len(), 1);
}

/// The ONNX NLI path with a model the test builds: the entailment label index decides the verdict.
async fn verify_with_onnx(entailment_label: usize) -> VerifiedEvent {
    let dir = support::scratch_dir(&format!("nli-label-{entailment_label}"));
    std::fs::write(dir.join("model.onnx"), support::onnx_graph::length_classifier(24.0)).unwrap();
    let defaults = lacuna::config::Settings::defaults();
    std::fs::copy(defaults.rerank.model_dir.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let mut nli = defaults.nli.clone();
    nli.entailment_label = entailment_label;
    nli.model.model_dir = dir;
    let model = lacuna::actors::clients::OnnxNli::load(&nli, &defaults.onnx).expect("the test model loads");

    let long = "Hugo Rodríguez Romero, born on 30 December 1989 and simply known as Hugo, is a Spanish footballer who plays for FC Cartagena as a winger.";
    let evidence =
        vec![item("long", long, EvidenceOrigin::Passage), item("short", "Hugo is Spanish.", EvidenceOrigin::Passage)];
    let facts = vec![fact("Hugo plays for FC Cartagena as a winger.", &["long"]), fact("Hugo is Spanish.", &["short"])];
    let event = FactsEvent { schema_version: SCHEMA_VERSION, memory: memory("q"), evidence, facts };
    single(Verify::new(Nli::Onnx(model)).process(&event.to_record()).await.unwrap())
}

#[tokio::test]
async fn onnx_nli_keeps_facts_whose_entailment_label_wins() {
    let kept: Vec<_> = verify_with_onnx(0).await.memory.facts.into_iter().map(|f| f.citations[0].clone()).collect();
    assert_eq!(kept, vec!["long"], "label 0 wins for long pairs in the test model");
    let kept: Vec<_> = verify_with_onnx(1).await.memory.facts.into_iter().map(|f| f.citations[0].clone()).collect();
    assert_eq!(kept, vec!["short"], "with the entailment label at index 1 the verdicts flip");
}

#[tokio::test]
async fn a_verdict_that_stays_broken_counts_as_not_entailed_and_is_marked_degraded() {
    let llm = FakeLlm::start(|prompt| {
        if last_field(prompt, "Hypothesis: ").contains("Madrid") {
            Reply::Text("entailed: yes".into())
        } else {
            Reply::Json(json!({"entailed": true}))
        }
    })
    .await;
    let evidence = vec![item("a", "Hugo plays for FC Cartagena in Madrid.", EvidenceOrigin::Passage)];
    let facts = vec![fact("Hugo lives in Madrid.", &["a"]), fact("Hugo plays for FC Cartagena.", &["a"])];
    let out = verify(&llm, evidence, facts).await;
    let kept: Vec<&str> = out.memory.facts.iter().map(|f| f.text.as_str()).collect();
    assert_eq!(kept, vec!["Hugo plays for FC Cartagena."], "the other question's facts go on");
    let degraded = out.memory.trace.iter().filter(|s| matches!(s.kind, TraceKind::Degraded { .. })).count();
    assert_eq!(degraded, 1);
}

/// A per-leaf judge that says "supported" to every fact, quoting words of passage 0: whatever it
/// says, the code's checks decide.
async fn credulous_quoting_judge(quote: &'static str) -> FakeLlm {
    FakeLlm::start(move |prompt| {
        let asked = prompt.rsplit("Now check these facts.").next().unwrap_or_default();
        let facts = asked.lines().filter(|line| line.starts_with("Fact ")).count();
        let verdicts: Vec<_> =
            (0..facts).map(|i| json!({"fact": i, "passage": 0, "quote": quote, "supported": true})).collect();
        Reply::Json(json!({"verdicts": verdicts}))
    })
    .await
}

async fn verify_per_leaf(llm: &FakeLlm, evidence: Vec<EvidenceItem>, facts: Vec<CandidateFact>) -> VerifiedEvent {
    let stage = Verify::new(Nli::LlmJudge(support::llm(&llm.base_url), lacuna::config::EntailmentPrompt::Lenient))
        .with_calls(lacuna::config::NliCalls::PerLeaf);
    let event = FactsEvent { schema_version: SCHEMA_VERSION, memory: memory("q"), evidence, facts };
    single(stage.process(&event.to_record()).await.unwrap())
}

#[tokio::test]
async fn per_leaf_one_call_judges_every_fact_and_a_year_the_passage_lacks_is_refused() {
    let llm = credulous_quoting_judge("a Welsh folk band formed in Cardiff").await;
    let band = "The Orlen Brothers were a Welsh folk band formed in Cardiff. They released four albums.";
    let evidence = vec![item("orlen", band, EvidenceOrigin::Passage)];
    let facts = vec![
        // Written in the question's shape, with a year filled in that no passage gives.
        fact("The Orlen Brothers, the band of the question, were a folk band that disbanded in 1998.", &["orlen"]),
        fact("The Orlen Brothers, a band from Wales, were formed in Cardiff.", &["orlen"]),
        // The passage holds it word for word: no judge is asked about it.
        fact("They released four albums.", &["orlen"]),
    ];
    let out = verify_per_leaf(&llm, evidence, facts).await;
    assert_eq!(llm.calls(), 1, "one call for the facts that needed a judge");
    let kept: Vec<&str> = out.memory.facts.iter().map(|f| f.text.as_str()).collect();
    assert_eq!(
        kept,
        vec!["The Orlen Brothers, a band from Wales, were formed in Cardiff.", "They released four albums."]
    );
    assert!(out.memory.trace.iter().any(|s| matches!(&s.kind,
        TraceKind::FactDropped { fact, reason } if fact.contains("1998") && reason.contains("number"))));
    assert!(
        out.memory.trace.iter().any(|s| matches!(&s.kind,
        TraceKind::Verdict { fact, quote: Some(quote), entailed: true, .. } if fact == quote)),
        "the verbatim fact's quote is itself"
    );
}

#[tokio::test]
async fn per_leaf_a_quote_the_passage_does_not_hold_is_not_entailed() {
    let llm = credulous_quoting_judge("the band split up after its fourth album").await;
    let band = "The Orlen Brothers were a Welsh folk band formed in Cardiff. They released four albums.";
    let evidence = vec![item("orlen", band, EvidenceOrigin::Passage)];
    let out =
        verify_per_leaf(&llm, evidence, vec![fact("The Orlen Brothers split up after four albums.", &["orlen"])]).await;
    assert!(out.memory.facts.is_empty());
    assert!(out.memory.trace.iter().any(|s| matches!(&s.kind,
        TraceKind::FactDropped { reason, .. } if reason == "the quote is not in the passage")));
    let llm = credulous_quoting_judge("ignored").await;
    let evidence = vec![item("a", "Hugo plays for FC Cartagena.", EvidenceOrigin::Passage)];
    let out = verify_per_leaf(&llm, evidence, vec![fact("Hugo plays for FC Cartagena.", &["a"])]).await;
    assert_eq!((out.memory.facts.len(), llm.calls()), (1, 0), "every fact verbatim: no call at all");
}
