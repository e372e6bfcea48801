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
fn the_memory_keeps_the_five_best_scored_passages_once_each() {
    use lacuna::topics::Passage;
    let passage = |id: &str| Passage { id: id.into(), title: "T".into(), text: format!("{id} says so.") };
    let [a, b, c, d, e, f] = ["a", "b", "c", "d", "e", "f"].map(passage);
    let mut m = Memory::new("q", "question");
    m.note_scored([(&a, 4.0), (&b, 6.0)]);
    m.note_scored([(&a, 7.0), (&b, 5.0), (&c, 3.0), (&d, 2.0), (&e, 1.0), (&f, 0.5), (&c, -1.0)]);
    let kept: Vec<(&str, f32)> = m.best_passages.iter().map(|p| (p.passage.id.as_str(), p.score)).collect();
    assert_eq!(
        kept,
        [("a", 7.0), ("b", 6.0), ("c", 3.0), ("d", 2.0), ("e", 1.0)],
        "best first, each once at its better score"
    );
}
