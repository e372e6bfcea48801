//! The paper's retrieve-then-read baselines (Table 3), on the same actors as MIGRES:
//!
//! questions -> retrieve -> passages -> sentence_filter (top k, no threshold) -> evidence -> reader -> answers
//!
//! VANILLA shows the k best re-ranked passages whole; VANILLA-s cuts each to its sentences scoring at
//! or above the re-ranker threshold. One LLM call per question, no loop.

use std::sync::Arc;

use crate::actors::reader::Reader;
use crate::actors::sentence_filter::FilterMode;
use crate::actors::stage::{RunningStage, spawn_stage};
use crate::pipelines::migres::{llm_for, no_stage, spawn_retrieve, spawn_sentence_filter};
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
    let stages = &settings.stages;
    match name {
        "retrieve" => spawn_retrieve(true, bus, settings, parts).await,
        "sentence_filter" => {
            let mode = if sentences { FilterMode::TOP_K_SENTENCES } else { FilterMode::TOP_K };
            spawn_sentence_filter(mode, bus, settings, parts).await
        }
        "reader" => {
            let reader = Reader::new(llm_for(settings, &stages.reader, "reader"));
            spawn_stage(reader, bus, &stages.reader, &settings.retry).await
        }
        other => Err(no_stage(other, &STAGES)),
    }
}
