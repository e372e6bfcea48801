//! The paper's retrieve-then-read baselines (Table 3), on the same actors as MIGRES:
//!
//! questions -> retrieve -> passages -> sentence_filter (top k, no threshold) -> evidence -> reader -> answers
//!
//! VANILLA shows the k best re-ranked passages whole; VANILLA-s cuts each to its sentences scoring at
//! or above the re-ranker threshold. One LLM call per question, no loop.

use std::sync::Arc;

use crate::actors::reader::Reader;
use crate::actors::retrieve::Retrieve;
use crate::actors::sentence_filter::{FilterMode, SentenceFilter};
use crate::actors::stage::{RunningStage, spawn_stage};
use crate::pipelines::migres::llm_for;
use crate::pipelines::parts::Parts;
use crate::settings::Settings;
use crate::topics::{Bus, BusError};

pub const STAGES: [&str; 3] = ["retrieve", "sentence_filter", "reader"];

/// Starts the stage called `name`; `sentences` selects VANILLA-s.
pub async fn spawn_named(
    name: &str,
    sentences: bool,
    bus: Arc<dyn Bus>,
    settings: &Settings,
    parts: &Parts,
) -> Result<RunningStage, BusError> {
    let (s, m, r) = (&settings.stages, &settings.migres, &settings.retry);
    let missing = |part: &str| BusError::Transport(format!("stage {name} needs the {part}, which was not loaded"));
    match name {
        "retrieve" => {
            let search = parts.search.clone().ok_or_else(|| missing("search index"))?;
            spawn_stage(Retrieve::new(search, m.clone()), bus, &s.retrieve, r).await
        }
        "sentence_filter" => {
            let reranker = parts.reranker.clone().ok_or_else(|| missing("re-ranker"))?;
            let mode = if sentences { FilterMode::TOP_K_SENTENCES } else { FilterMode::TOP_K };
            let llm = llm_for(settings, &s.sentence_filter, "sentence_filter");
            spawn_stage(SentenceFilter::new(reranker, llm, m.clone()).with_mode(mode), bus, &s.sentence_filter, r).await
        }
        "reader" => spawn_stage(Reader::new(llm_for(settings, &s.reader, "reader")), bus, &s.reader, r).await,
        other => Err(BusError::Transport(format!("no stage {other:?}; stages are {}", STAGES.join(", ")))),
    }
}
