//! Where a run's gold passages got lost on the way to the answer: retrieved, shown to an LLM, cited.
//! Each question's share is read off its trace once, when the run is scored, and stored in its
//! eval record ([`GoldReached`]), so `--compare` needs no trace.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::paired::is_right;
use super::report::EvalRecord;
use crate::topics::{AnswerRecord, TraceKind, TraceStep};

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
            funnel.right += usize::from(is_right(record));
            funnel.trimmed += usize::from(reached.trimmed);
        }
        funnel
    }
}

/// Which of a question's gold passages its record shows at each step (see [`Reached`]): all a
/// comparison needs of the trace, stored in the eval record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GoldReached {
    pub retrieved: Vec<String>,
    pub shown: Vec<String>,
    pub cited: Vec<String>,
    /// The trace was cut to fit `bus.max_event_bytes`: `retrieved` and `shown` are lower bounds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trimmed: bool,
}

impl GoldReached {
    /// The passages `record` cites, and how far each of `gold` got.
    pub fn of(record: &AnswerRecord, gold: &[String]) -> (Vec<String>, GoldReached) {
        let reached = Reached::of(record);
        let among = |set: &HashSet<&str>| gold.iter().filter(|g| set.contains(g.as_str())).cloned().collect();
        let gold_reached = GoldReached {
            retrieved: among(&reached.retrieved),
            shown: among(&reached.shown),
            cited: among(&reached.cited),
            trimmed: reached.trimmed,
        };
        let mut cited: Vec<String> = reached.cited.iter().map(|id| id.to_string()).collect();
        cited.sort();
        (cited, gold_reached)
    }
}

/// The passage ids one answer (or error) record shows at each step, as far as its record tells.
///
/// - retrieved: `Retrieved` hits and `PassageScored` passages (what a search returned).
/// - shown: what reached an LLM's prompt. `SentencesKept` (passages or sentences the filter kept for
///   the prompt), `Relevance` (RA-ISF's LLM judges each shown passage), `FactProposed` citations and
///   `Verdict`s (the leaf and verify calls read them), and whatever the answer cites. The trace does
///   not list the exact evidence of a prompt: in MIGRES mode the filter keeps every passage over the
///   re-ranker threshold and then shows the best `top_k` of them (skipping used-up and too-short
///   snippets) without a step saying which, so for MIGRES this is an upper bound. In the baselines'
///   top-k modes the kept list is already cut to `top_k`, so it is the shown set.
/// - cited: the answer's facts' citations and its `passages` (which for the reader-style baselines
///   are every passage shown: they cite all they were shown).
struct Reached<'a> {
    retrieved: HashSet<&'a str>,
    shown: HashSet<&'a str>,
    cited: HashSet<&'a str>,
    trimmed: bool,
}

impl<'a> Reached<'a> {
    fn of(record: &'a AnswerRecord) -> Reached<'a> {
        let (trace, cited): (&[TraceStep], HashSet<&str>) = match record {
            AnswerRecord::Answered(a) => {
                let facts = a.facts.iter().flat_map(|f| f.citations.iter());
                let passages = a.passages.iter().map(|p| &p.id);
                (&a.trace, facts.chain(passages).map(String::as_str).collect())
            }
            AnswerRecord::Error(e) => (&e.trace, HashSet::new()),
        };
        let mut reached = Reached { retrieved: HashSet::new(), shown: cited.clone(), cited, trimmed: false };
        for step in trace {
            reached.add(&step.kind);
        }
        let shown: Vec<&str> = reached.shown.iter().copied().collect();
        reached.retrieved.extend(shown);
        reached
    }

    fn add(&mut self, kind: &'a TraceKind) {
        match kind {
            TraceKind::Retrieved { hits, .. } => self.retrieved.extend(hits.iter().map(|(id, _)| id.as_str())),
            TraceKind::PassageScored { passage_id, .. } => {
                self.retrieved.insert(passage_id);
            }
            TraceKind::SentencesKept { passage_id, .. }
            | TraceKind::Relevance { passage_id, .. }
            | TraceKind::Verdict { passage_id, .. } => {
                self.shown.insert(passage_id);
            }
            TraceKind::FactProposed { citations, .. } => self.shown.extend(citations.iter().map(String::as_str)),
            TraceKind::Trimmed { .. } => self.trimmed = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::dataset::EvalQuestion;
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
