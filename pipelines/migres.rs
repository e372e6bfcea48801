//! The MIGRES pipeline:
//!
//! questions -> retrieve -> passages -> sentence_filter -> evidence -> leaf -> facts -> verify -> verified -> main -> answers
//! and main -> missing -> query_gen -> queries -> retrieve, until an answer or T iterations.

use std::sync::Arc;

use crate::actors::clients::{LlmClient, Nli};
use crate::actors::leaf::Leaf;
use crate::actors::main::Main;
use crate::actors::query_gen::QueryGen;
use crate::actors::retrieve::Retrieve;
use crate::actors::sentence_filter::SentenceFilter;
use crate::actors::stage::{RunningStage, spawn_stage};
use crate::actors::verify::Verify;
use crate::pipelines::parts::Parts;
use crate::settings::{Settings, StageSettings};
use crate::topics::{Bus, BusError};

/// The MIGRES stages, in the order of the loop.
pub const STAGES: [&str; 6] = ["retrieve", "sentence_filter", "leaf", "verify", "main", "query_gen"];

/// Starts the stage called `name` on `bus` with the parts it needs.
pub async fn spawn_named(
    name: &str,
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
            let stage =
                SentenceFilter::new(reranker, llm_for(settings, &s.sentence_filter, "sentence_filter"), m.clone());
            spawn_stage(stage, bus, &s.sentence_filter, r).await
        }
        "leaf" => spawn_stage(Leaf::new(llm_for(settings, &s.leaf, "leaf")), bus, &s.leaf, r).await,
        "verify" => {
            let nli = match &parts.onnx_nli {
                Some(model) => Nli::Onnx(model.clone()),
                None => Nli::LlmJudge(llm_for(settings, &s.verify, "verify")),
            };
            spawn_stage(Verify::new(nli), bus, &s.verify, r).await
        }
        "main" => spawn_stage(Main::new(llm_for(settings, &s.main, "main"), m.clone()), bus, &s.main, r).await,
        "query_gen" => {
            spawn_stage(QueryGen::new(llm_for(settings, &s.query_gen, "query_gen"), m.clone()), bus, &s.query_gen, r)
                .await
        }
        other => Err(BusError::Transport(format!("no stage {other:?}; stages are {}", STAGES.join(", ")))),
    }
}

/// A client for one stage, with that stage's own limit on LLM calls in flight.
pub(crate) fn llm_for(settings: &Settings, stage: &StageSettings, name: &str) -> LlmClient {
    let mut llm = settings.llm.clone();
    llm.max_concurrency = stage.llm_concurrency;
    LlmClient::new(llm).for_stage(name)
}
