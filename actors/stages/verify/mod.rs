//! verify: keeps a fact only when one of the passages it cites entails it (MIGRES's NLI check), so
//! the answer rests on what the corpus says, not on what the model imagined. Facts from model
//! knowledge are checked against the generated text and kept labelled as model knowledge.
//!
//! With `nli.recite_uncited` > 0, a fact none of its citations entails is checked against the other
//! passages the leaf was shown, best first: the small leaf model often writes a true fact and cites
//! the wrong one of two passages ("EABL owns Tusker" citing the EABL passage, while the Tusker
//! passage says who owns it). The fact is kept citing the passage that entails it, and the trace
//! shows the failed verdicts on the leaf's own citations before it.
//!
//! With `nli.calls = "per_leaf"` one call judges all of a leaf call's facts and must quote the words
//! that state each; the code checks the quote (see `quotes`).

mod quotes;

use async_trait::async_trait;
use futures::future::join_all;

use crate::actors::clients::{CallStats, LlmClient, LlmError, Nli, NliError, Verdict};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::{degrade, note_call};
use crate::config::Settings;
use crate::config::{EntailmentPrompt, NliBackend};
use crate::config::{NliCalls, QuoteMatch, Unjudged};
use crate::topics::{
    CandidateFact, Event, EvidenceItem, EvidenceOrigin, FactSource, FactsEvent, KnownFact, Passage, Record,
    SCHEMA_VERSION, TraceKind, VerifiedEvent,
};

pub struct Verify {
    nli: Nli,
    /// How many passages the leaf was shown but did not cite are tried, when no citation entails a fact.
    recite_uncited: usize,
    calls: NliCalls,
    quote_match: QuoteMatch,
    unjudged: Unjudged,
}

/// What the check found for one fact: the verdicts in order, and the evidence item that entails it.
#[derive(Default)]
struct Checked<'a> {
    verdicts: Vec<Judged<'a>>,
    entailed_by: Option<&'a EvidenceItem>,
    /// Verdicts whose replies stayed unusable (counted as not entailed).
    broken: Vec<String>,
    /// Why the fact is dropped, when the per-leaf checks refused the judge's verdict.
    refused: Option<&'static str>,
}

/// One verdict on a fact: the passage, whether it entails the fact, the call that said so (per
/// fact), and the words quoted for it (per leaf; the fact itself when the passage holds it verbatim).
struct Judged<'a> {
    item: &'a EvidenceItem,
    entailed: bool,
    call: Option<CallStats>,
    quote: Option<String>,
}

impl Verify {
    pub fn new(nli: Nli) -> Self {
        Verify {
            nli,
            recite_uncited: 0,
            calls: NliCalls::PerFact,
            quote_match: QuoteMatch::Words,
            unjudged: Unjudged::Verbatim,
        }
    }

    pub fn with_recite_uncited(mut self, passages: usize) -> Self {
        self.recite_uncited = passages;
        self
    }

    /// How the LLM judge is asked; an ONNX model judges per fact whatever this says.
    pub fn with_calls(mut self, calls: NliCalls) -> Self {
        self.calls = calls;
        self
    }

    /// With `per_leaf`: what makes the judge's quote the passage's.
    pub fn with_quote_match(mut self, quote_match: QuoteMatch) -> Self {
        self.quote_match = quote_match;
        self
    }

    /// With `per_leaf`: which facts are kept without a call.
    pub fn with_unjudged(mut self, unjudged: Unjudged) -> Self {
        self.unjudged = unjudged;
        self
    }

    /// The evidence items a fact may rest on, by position: its valid citations, then (when it has
    /// one) up to `recite_uncited` passages shown but not cited, best first. A fact citing nothing
    /// valid is the leaf's invention, not a citation slip: no recite.
    fn allowed(&self, fact: &CandidateFact, evidence: &[EvidenceItem]) -> Vec<usize> {
        let position = |id: &String| evidence.iter().position(|e| &e.id == id);
        let mut allowed: Vec<usize> = fact.citations.iter().filter_map(position).collect();
        let recite = if allowed.is_empty() { 0 } else { self.recite_uncited };
        let uncited = (0..evidence.len())
            .filter(|&i| evidence[i].origin == EvidenceOrigin::Passage && !fact.citations.contains(&evidence[i].id))
            .take(recite);
        allowed.extend(uncited);
        allowed
    }

    /// Tries the fact's citations in order, then up to `recite_uncited` uncited passages (in the
    /// order shown, best first), and stops at the first that entails it.
    async fn check<'a>(&self, fact: &CandidateFact, evidence: &'a [EvidenceItem]) -> Result<Checked<'a>, NliError> {
        let mut checked = Checked::default();
        for item in self.allowed(fact, evidence).into_iter().map(|i| &evidence[i]) {
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
            checked.verdicts.push(Judged { item, entailed: verdict.entailed, call: verdict.llm_call, quote: None });
            if verdict.entailed {
                checked.entailed_by = Some(item);
                break;
            }
        }
        Ok(checked)
    }

    /// All facts in one call (`per_leaf`). A fact a passage it may rest on holds word for word is
    /// kept without asking; a reply still unusable after its re-asks leaves the asked facts out.
    async fn check_per_leaf<'a>(
        &self,
        llm: &LlmClient,
        facts: &[CandidateFact],
        evidence: &'a [EvidenceItem],
    ) -> Result<(Vec<Checked<'a>>, Option<CallStats>), StageError> {
        let mut checked: Vec<Checked<'a>> = facts.iter().map(|_| Checked::default()).collect();
        // The facts the judge is asked about, by position in `facts`, and what each may rest on.
        let (mut asked, mut claims) = (Vec::new(), Vec::new());
        for (n, fact) in facts.iter().enumerate() {
            let allowed = self.allowed(fact, evidence);
            if allowed.is_empty() {
                continue;
            }
            // The trace's quote is the fact itself when a passage holds it word for word, and
            // empty when its names and numbers alone kept it.
            let unjudged = match quotes::verbatim(&fact.text, evidence, &allowed) {
                Some(i) => Some((i, fact.text.clone())),
                None if self.unjudged == Unjudged::NamesAndNumbers => {
                    quotes::names_and_numbers_held(&fact.text, evidence, &allowed).map(|i| (i, String::new()))
                }
                None => None,
            };
            match unjudged {
                Some((i, quote)) => {
                    let quote = Some(quote);
                    checked[n].verdicts.push(Judged { item: &evidence[i], entailed: true, call: None, quote });
                    checked[n].entailed_by = Some(&evidence[i]);
                }
                None => {
                    asked.push(n);
                    claims.push(quotes::Claim { text: &fact.text, allowed });
                }
            }
        }
        if asked.is_empty() {
            return Ok((checked, None));
        }
        let (findings, stats) = match quotes::judge(llm, evidence, &claims, self.quote_match).await {
            Ok(judged) => judged,
            Err(error @ LlmError::BadResponse(_)) => {
                for (&n, claim) in asked.iter().zip(&claims) {
                    checked[n].broken.push(error.to_string());
                    let item = &evidence[claim.allowed[0]];
                    checked[n].verdicts.push(Judged { item, entailed: false, call: None, quote: None });
                }
                return Ok((checked, None));
            }
            Err(error) => return Err(error.into()),
        };
        for ((&n, claim), finding) in asked.iter().zip(&claims).zip(findings) {
            // The trace names the passage the judge named, else the fact's first citation.
            let item = &evidence[finding.passage.unwrap_or(claim.allowed[0])];
            let entailed = finding.refused.is_none();
            checked[n].verdicts.push(Judged { item, entailed, call: None, quote: Some(finding.quote) });
            checked[n].entailed_by = entailed.then_some(item);
            checked[n].refused = finding.refused;
        }
        Ok((checked, Some(stats)))
    }

    async fn verify(&self, event: FactsEvent) -> Result<VerifiedEvent, StageError> {
        let FactsEvent { mut memory, evidence, facts, .. } = event;
        let all_checked = match (&self.nli, self.calls) {
            (Nli::LlmJudge(llm, _), NliCalls::PerLeaf) => {
                let (checked, call) = self.check_per_leaf(llm, &facts, &evidence).await?;
                if let Some(stats) = call {
                    note_call(&mut memory, Self::NAME, "entailment", &stats);
                }
                checked
            }
            // Facts are checked concurrently; the NLI client's limit bounds the calls in flight.
            _ => join_all(facts.iter().map(|fact| self.check(fact, &evidence)))
                .await
                .into_iter()
                .collect::<Result<Vec<_>, NliError>>()?,
        };
        for (fact, checked) in facts.iter().zip(all_checked) {
            for message in &checked.broken {
                degrade(
                    &mut memory,
                    Self::NAME,
                    "llm_bad_response",
                    format!("verdict on {:?} counted as not entailed: {message}", fact.text),
                );
            }
            for judged in &checked.verdicts {
                if let Some(stats) = &judged.call {
                    note_call(&mut memory, Self::NAME, "entailment", stats);
                }
                let verdict = TraceKind::Verdict {
                    fact: fact.text.clone(),
                    passage_id: judged.item.id.clone(),
                    entailed: judged.entailed,
                    quote: judged.quote.clone(),
                };
                memory.record(Self::NAME, verdict);
            }
            let Some(source_item) = checked.entailed_by else {
                let reason = match checked.refused {
                    _ if checked.verdicts.is_empty() => "no valid citation",
                    Some(refused) => refused,
                    None => "not entailed by any cited passage",
                };
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

    /// None when the ONNX model judges; the per-leaf judge falls back to the per-fact one where it
    /// cannot judge (a re-cite).
    fn prompts(settings: &Settings) -> Vec<NamedPrompt> {
        let per_fact = match settings.nli.entailment_prompt {
            EntailmentPrompt::Strict => ("entailment", prompts::ENTAILMENT),
            EntailmentPrompt::Lenient => ("entailment_lenient", prompts::ENTAILMENT_LENIENT),
        };
        if settings.nli.backend == NliBackend::Onnx {
            Vec::new()
        } else if settings.nli.calls == NliCalls::PerLeaf {
            vec![("entailment_quotes", prompts::ENTAILMENT_QUOTES), per_fact]
        } else {
            vec![per_fact]
        }
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let event: FactsEvent = decode(record)?;
        Ok(vec![self.verify(event).await?.to_record()])
    }
}
