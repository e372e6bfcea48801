//! Which of a question's gold passages its answer record shows retrieved, shown to an LLM and cited:
//! read off the trace once, when the run is scored, and stored in the question's eval record
//! ([`GoldReached`]); `funnel` counts them over a run.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::topics::{AnswerRecord, TraceKind, TraceStep};

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
