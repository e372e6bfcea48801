//! Where a run's gold passages got lost on the way to the answer: retrieved, shown to an LLM, cited,
//! counted over its eval records. Each question's share was read off its trace once, when the run
//! was scored (`gold`), so `--compare` needs no trace.

use serde::Serialize;

use super::report::EvalRecord;

/// How far a run's gold passages got, over its questions with gold passage ids. "All" counts a
/// question whose every gold passage reached the step, "any" one that had at least one there.
/// The steps nest (cited ⊆ shown ⊆ retrieved): a passage seen at a later step counts as reached at
/// the earlier ones too, which also covers steps a trimmed trace lost.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Funnel {
    pub run: String,
    pub dataset: String,
    pub questions: usize,
    /// Questions with gold passage ids: the denominator of every share below.
    pub with_gold: usize,
    pub retrieved_all: usize,
    pub retrieved_any: usize,
    pub shown_all: usize,
    pub shown_any: usize,
    pub cited_all: usize,
    pub cited_any: usize,
    /// EM right, among the questions with gold passage ids.
    pub right: usize,
    /// Questions whose trace was cut to fit `bus.max_event_bytes`: their retrieval and shown
    /// counts are lower bounds.
    pub trimmed: usize,
}

impl Funnel {
    pub fn of(run: &str, dataset: &str, records: &[EvalRecord]) -> Funnel {
        let mut funnel =
            Funnel { run: run.into(), dataset: dataset.into(), questions: records.len(), ..Funnel::default() };
        for record in records.iter().filter(|r| !r.gold_doc_ids.is_empty()) {
            let reached = record.gold_reached.clone().unwrap_or_default();
            let gold = &record.gold_doc_ids;
            let all = |ids: &[String]| usize::from(gold.iter().all(|g| ids.contains(g)));
            let any = |ids: &[String]| usize::from(gold.iter().any(|g| ids.contains(g)));
            funnel.with_gold += 1;
            funnel.retrieved_all += all(&reached.retrieved);
            funnel.retrieved_any += any(&reached.retrieved);
            funnel.shown_all += all(&reached.shown);
            funnel.shown_any += any(&reached.shown);
            funnel.cited_all += all(&reached.cited);
            funnel.cited_any += any(&reached.cited);
            funnel.right += usize::from(record.is_right());
            funnel.trimmed += usize::from(reached.trimmed);
        }
        funnel
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::dataset::EvalQuestion;
    use crate::topics::{AnswerRecord, TraceKind};
    use crate::topics::{Answered, FactSource, KnownFact, Memory, Outcome, Passage};

    fn eval_record(gold: &[&str], answered: Answered) -> EvalRecord {
        let question = EvalQuestion {
            id: "q".into(),
            question: "Who?".into(),
            answers: vec!["Ed Solomon".into()],
            answer_bool: None,
            kind: None,
            gold_doc_ids: gold.iter().map(|g| g.to_string()).collect(),
        };
        EvalRecord::new(&question, AnswerRecord::Answered(Box::new(answered)))
    }

    #[test]
    fn the_funnel_follows_gold_passages_through_the_trace() {
        let mut memory = Memory::new("q", "Who?");
        let hits = vec![("p1".to_string(), 3.0), ("p2".to_string(), 2.0), ("x".to_string(), 1.0)];
        memory.record(
            "retrieve",
            TraceKind::Retrieved { query: "Who?".into(), hits, skipped_used_up: 0, generation: None },
        );
        let kept = |id: &str| TraceKind::SentencesKept {
            passage_id: id.into(),
            sentences: vec![],
            whole_passage: true,
            score: 1.0,
        };
        memory.record("sentence_filter", kept("p1"));
        memory.record("sentence_filter", kept("x"));
        memory.facts.push(KnownFact {
            text: "fact".into(),
            citations: vec!["p1".into()],
            source: FactSource::Verified,
            iteration: 1,
        });
        let passage = Passage { id: "p1".into(), title: String::new(), text: String::new() };
        memory.cited_passages.insert("p1".into(), passage);
        let answered = Answered::from_memory(memory, "Ed Solomon".into(), 1.0, String::new(), Outcome::Answered);

        let records = [
            eval_record(&["p1", "p2"], answered.clone()),
            eval_record(&["p1"], answered.clone()),
            eval_record(&[], answered),
        ];
        let f = Funnel::of("migres", "hotpotqa", &records);
        assert_eq!((f.questions, f.with_gold), (3, 2), "the question without gold ids is left out");
        assert_eq!((f.retrieved_all, f.retrieved_any), (2, 2));
        assert_eq!((f.shown_all, f.shown_any), (1, 2), "p2 was retrieved but not shown");
        assert_eq!((f.cited_all, f.cited_any), (1, 2));
        assert_eq!((f.right, f.trimmed), (2, 0));
    }
}
