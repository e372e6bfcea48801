//! RQ-RAG (paper 004, Section 2.3), query refinement over a tree of trajectories, on the same actors:
//!
//! questions, queries -> retrieve -> passages -> sentence_filter (top k) -> evidence -> refine
//!   -> (below the depth limit) joins + one queries event per refinement (rewrite, decompose,
//!      disambiguate), each a trajectory of its own, back to retrieve
//!   -> (at the limit) the trajectory's answer with its token log-probabilities -> joins
//! joins -> join -> joined -> select -> (below the root) joins, (at the root) answers
//!
//! `select` chooses by perplexity, confidence or ensemble; every trajectory's answer stays in the
//! answer record.

use std::sync::Arc;
use std::time::Duration;

use crate::actors::refine::Refine;
use crate::actors::select::Select;
use crate::actors::stage::{RunningStage, spawn_stage};
use crate::pipelines::migres::{llm_for, no_stage, spawn_join, spawn_retrieve, spawn_top_k_filter};
use crate::pipelines::parts::Parts;
use crate::settings::Settings;
use crate::topics::{Bus, BusError};

pub const STAGES: [&str; 5] = ["retrieve", "sentence_filter", "refine", "join", "select"];

pub async fn spawn_named(
    name: &str,
    bus: Arc<dyn Bus>,
    settings: &Settings,
    parts: &Parts,
) -> Result<RunningStage, BusError> {
    let (stages, retry, rqrag) = (&settings.stages, &settings.retry, &settings.rqrag);
    match name {
        "retrieve" => spawn_retrieve(true, bus, settings, parts).await,
        "sentence_filter" => spawn_top_k_filter(rqrag.top_k, bus, settings, parts).await,
        "refine" => {
            let deadline = Duration::from_millis(settings.join.deadline_ms);
            let stage = Refine::new(llm_for(settings, &stages.refine, name), rqrag.clone(), deadline);
            spawn_stage(stage, bus, &stages.refine, retry).await
        }
        "join" => spawn_join(bus, settings).await,
        "select" => spawn_stage(Select::new(rqrag.selection), bus, &stages.select, retry).await,
        other => Err(no_stage(other, &STAGES)),
    }
}
