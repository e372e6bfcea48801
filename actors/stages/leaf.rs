//! leaf: the LLM distils useful facts from the shown evidence, each citing the passages that state
//! it (MIGRES leaf module, Appendix D). Citations are prompt positions, mapped back to passage ids.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::{LlmClient, LlmError, Schema};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::{degrade, note_call};
use crate::config::Settings;
use crate::topics::{CandidateFact, Event, EvidenceEvent, EvidenceItem, FactsEvent, Record, SCHEMA_VERSION, TraceKind};

/// At most this many facts per call: small models otherwise list every sentence.
const MAX_FACTS: usize = 6;

pub struct Leaf {
    llm: LlmClient,
}

#[derive(Deserialize, JsonSchema)]
struct LeafAnswer {
    #[schemars(length(max = MAX_FACTS))]
    facts: Vec<LeafFact>,
}

#[derive(Deserialize, JsonSchema)]
struct LeafFact {
    fact: String,
    #[serde(default)]
    #[schemars(length(min = 1))]
    passages: Vec<i64>,
}

fn schema() -> Schema {
    Schema::of::<LeafAnswer>("leaf_facts")
}

/// `Passage i: (Title: t) text`, numbered from 0 in this prompt, as in the MIGRES code.
pub fn render_passages(evidence: &[EvidenceItem]) -> String {
    evidence
        .iter()
        .enumerate()
        .map(|(i, item)| format!("Passage {i}: (Title: {}) {}", item.title, item.text))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Leaf {
    pub fn new(llm: LlmClient) -> Self {
        Leaf { llm }
    }

    async fn extract(&self, event: EvidenceEvent) -> Result<FactsEvent, StageError> {
        let EvidenceEvent { mut memory, queries, evidence, .. } = event;
        let mut facts = Vec::new();
        // Nothing shown, nothing to extract: skip the call.
        if !evidence.is_empty() {
            let prompt = prompts::fill(
                prompts::LEAF,
                &[("passages", &render_passages(&evidence)), ("queries", &queries.join(" "))],
            );
            let proposals = match self.llm.structured::<LeafAnswer>(prompts::SYSTEM, &prompt, &schema()).await {
                Ok(reply) => {
                    note_call(&mut memory, Self::NAME, "leaf", &reply.stats);
                    reply.value.facts
                }
                // A reply still broken after its re-asks gives no facts from this call: the loop
                // goes on with what it knows, as after an iteration that found nothing.
                Err(error @ LlmError::BadResponse(_)) => {
                    degrade(&mut memory, Self::NAME, error.error_type(), error.to_string());
                    Vec::new()
                }
                Err(error) => return Err(error.into()),
            };
            for proposed in proposals.into_iter().take(MAX_FACTS) {
                let text = proposed.fact.trim().to_string();
                if text.is_empty() {
                    continue;
                }
                let (mut citations, mut dropped) = (Vec::new(), Vec::new());
                for index in proposed.passages {
                    match usize::try_from(index).ok().and_then(|i| evidence.get(i)) {
                        Some(item) if !citations.contains(&item.id) => citations.push(item.id.clone()),
                        Some(_) => {}
                        None => dropped.push(index.to_string()),
                    }
                }
                memory.record(
                    Self::NAME,
                    TraceKind::FactProposed {
                        fact: text.clone(),
                        citations: citations.clone(),
                        dropped_citations: dropped,
                    },
                );
                facts.push(CandidateFact { text, citations });
            }
        }
        Ok(FactsEvent { schema_version: SCHEMA_VERSION, memory, evidence, facts })
    }
}

#[async_trait(?Send)]
impl Stage for Leaf {
    const NAME: &'static str = "leaf";

    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        vec![("leaf", prompts::LEAF)]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let event: EvidenceEvent = decode(record)?;
        Ok(vec![self.extract(event).await?.to_record()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request, and so the LLM cache's key, is that of the schema once written by hand: the
    /// facts' bound before their item schema, a fact's passages required and at least one.
    #[test]
    fn the_leaf_schema_asks_for_at_most_six_facts_each_citing_a_passage() {
        let expected = r#"{"type":"object","properties":{"facts":{"type":"array","maxItems":6,"items":{"type":"object","properties":{"fact":{"type":"string"},"passages":{"type":"array","items":{"type":"integer"},"minItems":1}},"required":["fact","passages"],"additionalProperties":false}}},"required":["facts"],"additionalProperties":false}"#;
        assert_eq!(schema().schema.to_string(), expected);
    }
}
