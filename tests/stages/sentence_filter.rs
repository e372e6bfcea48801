use lacuna::actors::runner::Stage;
use lacuna::actors::stages::sentence_filter::{FilterMode, SentenceFilter, split_sentences};
use lacuna::config::Settings;
use lacuna::topics::{
    Event, EvidenceEvent, EvidenceOrigin, Memory, Passage, PassagesEvent, RetrievedPassage, SCHEMA_VERSION,
};

use crate::helpers::{memory, single};
use crate::support::fake_llm::{FakeLlm, Reply};
use crate::support::{self, reranker};

const QUERY: &str = "Which football club does Hugo Rodríguez Romero play for?";

fn hit(id: &str, title: &str, text: &str) -> RetrievedPassage {
    RetrievedPassage {
        query: QUERY.to_string(),
        passage: Passage { id: id.into(), title: title.into(), text: text.into() },
        bm25: 1.0,
    }
}

fn hugo() -> RetrievedPassage {
    hit(
        "hugo",
        "Hugo Rodríguez Romero",
        "Hugo Rodríguez Romero (born 30 December 1989), simply known as Hugo, is a Spanish footballer who plays for FC Cartagena as a winger. The town hall of Seville was renovated in 1890 with a new marble staircase. Its ceilings were painted by local artisans over three decades. The building now hosts a museum of ceramics and tiles.",
    )
}

fn irrelevant(id: &str) -> RetrievedPassage {
    hit(
        id,
        "Photosynthesis",
        "Photosynthesis is a process used by plants to convert light energy into chemical energy.",
    )
}

async fn filter(hits: Vec<RetrievedPassage>, m: Memory, llm_url: &str) -> EvidenceEvent {
    // The filter itself: the default's first read, which asks the LLM before filtering, is tested in
    // tests/pipeline.rs.
    let mut migres = Settings::defaults().migres;
    migres.read_first = false;
    let stage = SentenceFilter::new(reranker(), support::llm(llm_url), migres);
    let event = PassagesEvent { schema_version: SCHEMA_VERSION, memory: m, queries: vec![QUERY.to_string()], hits };
    single(stage.process(&event.to_record()).await.unwrap())
}

#[tokio::test]
async fn irrelevant_passages_are_dropped_and_shown_ones_count_a_use() {
    let llm = FakeLlm::start(|_| Reply::Status(500)).await;
    let out = filter(vec![irrelevant("p1"), hugo(), irrelevant("p2")], memory("q"), &llm.base_url).await;
    let ids: Vec<_> = out.evidence.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, vec!["hugo"]);
    assert_eq!(out.memory.uses("hugo"), 1, "showing a passage is one use");
    assert_eq!(out.memory.uses("p1"), 0);
    assert_eq!(llm.calls(), 0, "no knowledge prompting when a passage survives");
}

/// The reader fallback's passages: the best-scored, whole, including one under the threshold.
#[tokio::test]
async fn the_memory_keeps_the_best_scored_passages_whole_shown_or_not() {
    let llm = FakeLlm::start(|_| Reply::Status(500)).await;
    let out = filter(vec![irrelevant("p1"), hugo()], memory("q"), &llm.base_url).await;
    let ids: Vec<_> = out.memory.best_passages.iter().map(|p| p.passage.id.as_str()).collect();
    assert_eq!(ids, ["hugo", "p1"], "best first, the one under the threshold too");
    assert_eq!(out.memory.best_passages[0].passage, hugo().passage, "whole, not cut to its sentences");
    assert_eq!(out.evidence.len(), 1, "only what passed is shown");
}

#[tokio::test]
async fn sentence_below_threshold_is_dropped() {
    let llm = FakeLlm::start(|_| Reply::Status(500)).await;
    let out = filter(vec![hugo()], memory("q"), &llm.base_url).await;
    let text = &out.evidence[0].text;
    assert!(text.contains("plays for FC Cartagena"), "the relevant sentence is kept: {text}");
    assert!(!text.contains("marble staircase"), "the irrelevant sentence is dropped: {text}");
}

#[tokio::test]
async fn at_most_k_passages_are_shown_best_first() {
    let llm = FakeLlm::start(|_| Reply::Status(500)).await;
    let hits = (0..8)
        .map(|i| {
            hit(
                &format!("p{i}"),
                "Hugo Rodríguez Romero",
                &format!("Hugo Rodríguez Romero is a Spanish footballer who plays for FC Cartagena, season {i}."),
            )
        })
        .collect();
    let out = filter(hits, memory("q"), &llm.base_url).await;
    assert_eq!(out.evidence.len(), Settings::defaults().migres.top_k);
    assert!(out.evidence.windows(2).all(|w| w[0].score >= w[1].score));
}

/// A memory in its second iteration: knowledge prompting starts there by default.
fn second_iteration(question: &str) -> Memory {
    let mut m = memory(question);
    m.iteration = 2;
    m
}

#[tokio::test]
async fn knowledge_prompting_when_nothing_survives() {
    let llm = FakeLlm::start(|_| Reply::Text("Hugo Rodríguez Romero plays for FC Cartagena.".into())).await;
    let out = filter(vec![irrelevant("p1")], second_iteration("q"), &llm.base_url).await;
    assert_eq!(out.evidence.len(), 1);
    assert_eq!(out.evidence[0].origin, EvidenceOrigin::ModelKnowledge);
    assert_eq!(out.evidence[0].id, "knowledge-2");
    assert_eq!(out.memory.usage.llm_calls, 1);
    assert_eq!(out.memory.usage.knowledge_tokens, 10);
}

#[tokio::test]
async fn the_first_iteration_does_not_prompt_for_knowledge() {
    // Its query is the whole question: the model's closed-book guess would become a "fact".
    let llm = FakeLlm::start(|_| Reply::Text("Hugo Rodríguez Romero plays for FC Cartagena.".into())).await;
    let out = filter(vec![irrelevant("p1")], memory("q"), &llm.base_url).await;
    assert!(out.evidence.is_empty());
    assert_eq!(llm.calls(), 0);
}

#[tokio::test]
async fn a_refusal_is_not_taken_as_knowledge() {
    let llm = FakeLlm::start(|_| Reply::Text("I don't know.".into())).await;
    let out = filter(vec![irrelevant("p1")], memory("q"), &llm.base_url).await;
    assert!(out.evidence.is_empty());
}

#[test]
fn sentences_split_at_capitals_not_at_abbreviations() {
    let parts =
        split_sentences("He met St. louis officials, e.g. the mayor. Then he left! \"Yes\" he said. 1990 was late.");
    assert_eq!(
        parts,
        vec!["He met St. louis officials, e.g. the mayor.", "Then he left!", "\"Yes\" he said.", "1990 was late."]
    );
}

/// The baselines' filter: no threshold, so even a threshold nothing reaches shows the k best.
async fn filter_in_mode(mode: FilterMode, hits: Vec<RetrievedPassage>, llm_url: &str) -> EvidenceEvent {
    let mut settings = Settings::defaults().migres;
    settings.rerank_threshold = 100.0;
    settings.top_k = 2;
    let stage = SentenceFilter::new(reranker(), support::llm(llm_url), settings).with_mode(mode);
    let event = PassagesEvent {
        schema_version: SCHEMA_VERSION,
        memory: second_iteration("q"),
        queries: vec![QUERY.to_string()],
        hits,
    };
    single(stage.process(&event.to_record()).await.unwrap())
}

#[tokio::test]
async fn top_k_mode_shows_the_k_best_passages_whole_without_a_threshold() {
    let llm = FakeLlm::start(|_| Reply::Text("I don't know.".into())).await;
    let hits = vec![irrelevant("p1"), hugo(), irrelevant("p2")];
    let out = filter_in_mode(FilterMode::TOP_K, hits, &llm.base_url).await;
    let ids: Vec<_> = out.evidence.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), 2, "k = 2 passages shown although none reaches the threshold");
    assert_eq!(ids[0], "hugo", "best first");
    assert_eq!(out.evidence[0].text, hugo().passage.text, "VANILLA shows passages whole");
    assert_eq!(out.memory.usage.passages_shown, 2);
    assert!(out.memory.usage.evidence_tokens > 20, "shown tokens are counted");
    assert_eq!(llm.calls(), 0, "baselines never prompt for knowledge");

    let migres = filter_in_mode(FilterMode::MIGRES, vec![hugo()], &llm.base_url).await;
    assert!(migres.evidence.is_empty(), "MIGRES applies the threshold");
    assert_eq!(llm.calls(), 1, "and prompts for knowledge when nothing passes");
}

#[tokio::test]
async fn an_overlong_passage_is_cut_to_max_snippet_words() {
    let llm = FakeLlm::start(|_| Reply::Status(500)).await;
    let mut long = hugo();
    long.passage.text = format!("{} {}", long.passage.text, "He scored many goals for the club. ".repeat(200));
    let out = filter_in_mode(FilterMode::TOP_K, vec![long], &llm.base_url).await;
    let words = out.evidence[0].text.split_whitespace().count();
    let limit = Settings::defaults().migres.max_snippet_words;
    assert_eq!(words, limit + 1, "cut to the limit, with an ellipsis");
    assert!(out.evidence[0].text.ends_with(" ..."));
}

#[tokio::test]
async fn top_k_sentences_mode_cuts_passages_to_their_relevant_sentences() {
    let llm = FakeLlm::start(|_| Reply::Status(500)).await;
    let mut settings = Settings::defaults().migres;
    settings.top_k = 2;
    let stage =
        SentenceFilter::new(reranker(), support::llm(&llm.base_url), settings).with_mode(FilterMode::TOP_K_SENTENCES);
    let hits = vec![irrelevant("p1"), hugo()];
    let event = PassagesEvent {
        schema_version: SCHEMA_VERSION,
        memory: second_iteration("q"),
        queries: vec![QUERY.to_string()],
        hits,
    };
    let out: EvidenceEvent = single(stage.process(&event.to_record()).await.unwrap());
    let hugo_item = out.evidence.iter().find(|e| e.id == "hugo").expect("hugo is among the top k");
    assert!(hugo_item.text.contains("plays for FC Cartagena"), "{}", hugo_item.text);
    assert!(!hugo_item.text.contains("marble staircase"), "irrelevant sentences are cut: {}", hugo_item.text);
}
