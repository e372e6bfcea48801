//! RA-ISF (paper 003, Algorithm 1), retrieval-augmented iterative self-feedback, on the same actors:
//!
//! questions, nodes -> self_knowledge -> (known: answer) or queries -> retrieve -> passages
//!   -> sentence_filter (top k) -> evidence -> relevance -> (relevant passages: answer)
//!   or (below D_th) joins + nodes: one sub-question per node, solved from self_knowledge on
//!   joins -> join -> joined -> compose -> the answer from the sub-answers
//!
//! A node's answer goes to `answers` for a root question, to `joins` (its parent) otherwise. The three
//! modules (self-knowledge, relevance, decomposition) each take their endpoint from `raisf.*`.

use std::sync::Arc;
use std::time::Duration;

use crate::actors::compose::Compose;
use crate::actors::relevance::Relevance;
use crate::actors::self_knowledge::SelfKnowledge;
use crate::actors::stage::{RunningStage, spawn_stage};
use crate::pipelines::migres::{llm_at, llm_for, no_stage, spawn_join, spawn_retrieve, spawn_top_k_filter};
use crate::pipelines::parts::Parts;
use crate::settings::Settings;
use crate::topics::{Bus, BusError};

pub const STAGES: [&str; 6] = ["self_knowledge", "retrieve", "sentence_filter", "relevance", "join", "compose"];

pub async fn spawn_named(
    name: &str,
    bus: Arc<dyn Bus>,
    settings: &Settings,
    parts: &Parts,
) -> Result<RunningStage, BusError> {
    let (stages, retry, raisf) = (&settings.stages, &settings.retry, &settings.raisf);
    let deadline = Duration::from_millis(settings.join.deadline_ms);
    match name {
        "self_knowledge" => {
            let module = raisf
                .self_knowledge_check
                .then(|| llm_at(&raisf.self_knowledge.apply(&settings.llm), &stages.self_knowledge, name));
            let stage = SelfKnowledge::new(module, llm_for(settings, &stages.self_knowledge, name));
            spawn_stage(stage, bus, &stages.self_knowledge, retry).await
        }
        "retrieve" => spawn_retrieve(false, bus, settings, parts).await,
        "sentence_filter" => spawn_top_k_filter(raisf.top_k, bus, settings, parts).await,
        "relevance" => {
            let relevance = llm_at(&raisf.relevance.apply(&settings.llm), &stages.relevance, name);
            let decompose = llm_at(&raisf.decompose.apply(&settings.llm), &stages.relevance, name);
            let answerer = llm_for(settings, &stages.relevance, name);
            let stage = Relevance::new(relevance, decompose, answerer, raisf.clone(), deadline);
            spawn_stage(stage, bus, &stages.relevance, retry).await
        }
        "join" => spawn_join(bus, settings).await,
        "compose" => {
            spawn_stage(Compose::new(llm_for(settings, &stages.compose, name)), bus, &stages.compose, retry).await
        }
        other => Err(no_stage(other, &STAGES)),
    }
}
