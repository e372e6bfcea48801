//! QPaug (paper 002), question and passage augmentation, on the same actors:
//!
//! questions -> augment -> queries -> retrieve -> passages -> sentence_filter (top K-1) -> evidence -> reader -> answers
//!
//! augment writes the step-by-step decomposition that is searched with the question, and the model's
//! own passage, which the reader shows after the K-1 retrieved ones as "Your knowledge".

use std::sync::Arc;

use crate::actors::augment::Augment;
use crate::actors::reader::Reader;
use crate::actors::stage::{RunningStage, spawn_stage};
use crate::pipelines::migres::{llm_for, no_stage, spawn_retrieve, spawn_top_k_filter};
use crate::pipelines::parts::Parts;
use crate::settings::Settings;
use crate::topics::{Bus, BusError};

pub const STAGES: [&str; 4] = ["augment", "retrieve", "sentence_filter", "reader"];

pub async fn spawn_named(
    name: &str,
    bus: Arc<dyn Bus>,
    settings: &Settings,
    parts: &Parts,
) -> Result<RunningStage, BusError> {
    let (stages, retry) = (&settings.stages, &settings.retry);
    match name {
        "augment" => {
            spawn_stage(Augment::new(llm_for(settings, &stages.augment, "augment")), bus, &stages.augment, retry).await
        }
        "retrieve" => spawn_retrieve(false, bus, settings, parts).await,
        "sentence_filter" => spawn_top_k_filter(settings.qpaug.top_k - 1, bus, settings, parts).await,
        "reader" => {
            spawn_stage(Reader::new(llm_for(settings, &stages.reader, "reader")), bus, &stages.reader, retry).await
        }
        other => Err(no_stage(other, &STAGES)),
    }
}
