use lacuna::topics::Memory;
use lacuna::topics::memory::normalize_query;

#[test]
fn a_passage_is_used_up_after_two_uses() {
    let mut m = Memory::new("q", "question");
    assert!(!m.is_used_up("p", 2));
    m.count_use("p");
    assert!(!m.is_used_up("p", 2), "shown once: may be shown again");
    m.count_use("p");
    assert!(m.is_used_up("p", 2), "shown and cited (or shown twice): never again");
}

#[test]
fn a_query_differing_only_in_case_and_punctuation_is_a_repeat() {
    let mut m = Memory::new("q", "Who directed Levity?");
    m.queries.push("What is Ed Solomon's nationality?".into());
    assert!(m.has_asked("who directed levity"));
    assert!(m.has_asked("What is Ed Solomon's nationality"));
    assert!(!m.has_asked("Where was Ed Solomon born?"));
    assert_eq!(normalize_query("  Who, directed  LEVITY? "), "who directed levity");
}

#[test]
fn facts_are_shown_joined_or_as_none() {
    let mut m = Memory::new("q", "question");
    assert_eq!(m.facts_text(), "None");
    for text in ["A is B.", "B is C."] {
        m.facts.push(lacuna::topics::KnownFact {
            text: text.into(),
            citations: vec![],
            source: lacuna::topics::FactSource::Verified,
            iteration: 1,
        });
    }
    assert_eq!(m.facts_text(), "A is B.; B is C.");
}

#[test]
fn the_memory_keeps_the_five_best_passages_shown_once_each() {
    use lacuna::topics::{EvidenceItem, EvidenceOrigin};
    let item = |id: &str, score: f32, origin| EvidenceItem {
        id: id.into(),
        title: "T".into(),
        text: format!("{id} at {score}"),
        score,
        origin,
    };
    let mut m = Memory::new("q", "question");
    m.note_shown(&[item("a", 4.0, EvidenceOrigin::Passage), item("b", 6.0, EvidenceOrigin::Passage)]);
    m.note_shown(&[
        item("knowledge-2", 9.0, EvidenceOrigin::ModelKnowledge),
        item("a", 7.0, EvidenceOrigin::Passage),
        item("b", 5.0, EvidenceOrigin::Passage),
        item("c", 3.0, EvidenceOrigin::Passage),
        item("d", 2.0, EvidenceOrigin::Passage),
        item("e", 1.0, EvidenceOrigin::Passage),
        item("f", 0.5, EvidenceOrigin::Passage),
    ]);
    let kept: Vec<(&str, &str)> = m.best_shown.iter().map(|e| (e.id.as_str(), e.text.as_str())).collect();
    assert_eq!(
        kept,
        [("a", "a at 7"), ("b", "b at 6"), ("c", "c at 3"), ("d", "d at 2"), ("e", "e at 1")],
        "best first, each once at its better score, model knowledge left out"
    );
}
