//! verify: keeps a fact only when one of the passages it cites entails it (MIGRES's NLI check), so
//! the answer rests on what the corpus says, not on what the model imagined. Facts from model
//! knowledge are checked against the generated text and kept labelled as model knowledge.
//!
//! With `nli.recite_uncited` > 0, a fact none of its citations entails is checked against the other
//! passages the leaf was shown, best first: the small leaf model often writes a true fact and cites
//! the wrong one of two passages ("EABL owns Tusker" citing the EABL passage, while the Tusker
//! passage says who owns it). The fact is kept citing the passage that entails it, and the trace
//! shows the failed verdicts on the leaf's own citations before it.

use async_trait::async_trait;
use futures::future::join_all;

use crate::actors::clients::{LlmError, Nli, NliError, Verdict};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::{degrade, note_call};
use crate::topics::{
    CandidateFact, Event, EvidenceItem, EvidenceOrigin, FactSource, FactsEvent, KnownFact, Passage, Record,
    SCHEMA_VERSION, TraceKind, VerifiedEvent,
};

pub struct Verify {
    nli: Nli,
    /// How many passages the leaf was shown but did not cite are tried, when no citation entails a fact.
    recite_uncited: usize,
}

/// What the check found for one fact: the verdicts in order, and the evidence item that entails it.
struct Checked<'a> {
    verdicts: Vec<(&'a EvidenceItem, bool, Option<crate::actors::clients::CallStats>)>,
    entailed_by: Option<&'a EvidenceItem>,
    /// Verdicts whose replies stayed unusable (counted as not entailed).
    broken: Vec<String>,
}

impl Verify {
    pub fn new(nli: Nli) -> Self {
        Verify { nli, recite_uncited: 0 }
    }

    pub fn with_recite_uncited(mut self, passages: usize) -> Self {
        self.recite_uncited = passages;
        self
    }

    /// Tries the fact's citations in order, then up to `recite_uncited` uncited passages (in the
    /// order shown, best first), and stops at the first that entails it.
    async fn check<'a>(&self, fact: &CandidateFact, evidence: &'a [EvidenceItem]) -> Result<Checked<'a>, NliError> {
        let mut checked = Checked { verdicts: Vec::new(), entailed_by: None, broken: Vec::new() };
        let cited: Vec<&EvidenceItem> =
            fact.citations.iter().filter_map(|id| evidence.iter().find(|e| &e.id == id)).collect();
        // A fact citing nothing valid is the leaf's invention, not a citation slip: no recite.
        let recite = if cited.is_empty() { 0 } else { self.recite_uncited };
        let uncited = evidence
            .iter()
            .filter(|e| e.origin == EvidenceOrigin::Passage && !fact.citations.contains(&e.id))
            .take(recite);
        for item in cited.into_iter().chain(uncited) {
            let verdict = match self.nli.judge(&premise(item), &fact.text).await {
                Ok(verdict) => verdict,
                // A verdict still broken after its re-asks counts as "not entailed": the fact
                // stays out unless another citation entails it.
                Err(NliError::Llm(error @ LlmError::BadResponse(_))) => {
                    checked.broken.push(error.to_string());
                    Verdict { entailed: false, llm_call: None }
                }
                Err(error) => return Err(error),
            };
            checked.verdicts.push((item, verdict.entailed, verdict.llm_call));
            if verdict.entailed {
                checked.entailed_by = Some(item);
                break;
            }
        }
        Ok(checked)
    }

    async fn verify(&self, event: FactsEvent) -> Result<VerifiedEvent, StageError> {
        let FactsEvent { mut memory, evidence, facts, .. } = event;
        // Facts are checked concurrently; the NLI client's limit bounds the calls in flight.
        let results = join_all(facts.iter().map(|fact| self.check(fact, &evidence))).await;
        for (fact, result) in facts.iter().zip(results) {
            let checked = result?;
            for message in &checked.broken {
                degrade(
                    &mut memory,
                    Self::NAME,
                    "llm_bad_response",
                    format!("verdict on {:?} counted as not entailed: {message}", fact.text),
                );
            }
            for (item, entailed, call) in &checked.verdicts {
                if let Some(stats) = call {
                    note_call(&mut memory, Self::NAME, "entailment", stats);
                }
                memory.record(
                    Self::NAME,
                    TraceKind::Verdict { fact: fact.text.clone(), passage_id: item.id.clone(), entailed: *entailed },
                );
            }
            let Some(source_item) = checked.entailed_by else {
                let reason =
                    if checked.verdicts.is_empty() { "no valid citation" } else { "not entailed by any cited passage" };
                memory.record(Self::NAME, TraceKind::FactDropped { fact: fact.text.clone(), reason: reason.into() });
                continue;
            };
            if memory.facts.iter().any(|known| known.text == fact.text) {
                memory.record(
                    Self::NAME,
                    TraceKind::FactDropped { fact: fact.text.clone(), reason: "already known".into() },
                );
                continue;
            }
            let known = match source_item.origin {
                EvidenceOrigin::Passage => {
                    // A passage that gave a kept fact has done its work (MIGRES memory rule): the
                    // leaf's citations, and the passage that entails it when that is another.
                    for id in &fact.citations {
                        if evidence.iter().any(|e| &e.id == id && e.origin == EvidenceOrigin::Passage) {
                            memory.count_use(id);
                        }
                    }
                    if !fact.citations.contains(&source_item.id) {
                        memory.count_use(&source_item.id);
                    }
                    memory.cited_passages.insert(
                        source_item.id.clone(),
                        Passage {
                            id: source_item.id.clone(),
                            title: source_item.title.clone(),
                            text: source_item.text.clone(),
                        },
                    );
                    KnownFact {
                        text: fact.text.clone(),
                        citations: vec![source_item.id.clone()],
                        source: FactSource::Verified,
                        iteration: memory.iteration,
                    }
                }
                EvidenceOrigin::ModelKnowledge => KnownFact {
                    text: fact.text.clone(),
                    citations: Vec::new(),
                    source: FactSource::ModelKnowledge,
                    iteration: memory.iteration,
                },
            };
            memory.record(
                Self::NAME,
                TraceKind::FactKept {
                    fact: known.text.clone(),
                    citations: known.citations.clone(),
                    verified: known.source == FactSource::Verified,
                },
            );
            memory.facts.push(known);
        }
        Ok(VerifiedEvent { schema_version: SCHEMA_VERSION, memory })
    }
}

/// The premise is what the leaf module was shown: `(Title: t) text`, or the bare generated text.
fn premise(item: &EvidenceItem) -> String {
    match item.origin {
        EvidenceOrigin::Passage => format!("(Title: {}) {}", item.title, item.text),
        EvidenceOrigin::ModelKnowledge => item.text.clone(),
    }
}

#[async_trait(?Send)]
impl Stage for Verify {
    const NAME: &'static str = "verify";

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let event: FactsEvent = decode(record)?;
        Ok(vec![self.verify(event).await?.to_record()])
    }
}
