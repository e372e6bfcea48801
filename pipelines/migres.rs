//! The MIGRES pipeline:
//!
//! questions -> retrieve -> passages -> sentence_filter -> evidence -> leaf -> facts -> verify -> verified -> main -> answers
//! and main -> missing -> query_gen -> queries -> retrieve, until an answer or T iterations.

use std::sync::Arc;

use crate::actors::clients::{LlmClient, Nli};
use crate::actors::join::Join;
use crate::actors::leaf::Leaf;
use crate::actors::main::Main;
use crate::actors::query_gen::QueryGen;
use crate::actors::retrieve::Retrieve;
use crate::actors::sentence_filter::{FilterMode, SentenceFilter};
use crate::actors::stage::{RunningStage, spawn_stage};
use crate::actors::verify::Verify;
use crate::pipelines::parts::Parts;
use crate::settings::{LlmSettings, Settings, StageSettings};
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
    match name {
        "retrieve" => spawn_retrieve(true, bus, settings, parts).await,
        "sentence_filter" => spawn_sentence_filter(FilterMode::MIGRES, bus, settings, parts).await,
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
        other => Err(no_stage(other, &STAGES)),
    }
}

/// The error for a stage name a pipeline does not have.
pub(crate) fn no_stage(name: &str, stages: &[&str]) -> BusError {
    BusError::Transport(format!("no stage {name:?}; stages are {}", stages.join(", ")))
}

/// sentence_filter showing the `top_k` best re-ranked passages whole (QPaug, RA-ISF, RQ-RAG).
pub(crate) async fn spawn_top_k_filter(
    top_k: usize,
    bus: Arc<dyn Bus>,
    settings: &Settings,
    parts: &Parts,
) -> Result<RunningStage, BusError> {
    let mut own = settings.clone();
    own.migres.top_k = top_k;
    spawn_sentence_filter(FilterMode::TOP_K, bus, &own, parts).await
}

/// The retrieve stage, shared by every pipeline; `takes_questions` unless another stage starts them.
pub(crate) async fn spawn_retrieve(
    takes_questions: bool,
    bus: Arc<dyn Bus>,
    settings: &Settings,
    parts: &Parts,
) -> Result<RunningStage, BusError> {
    let search = parts.search.clone().ok_or_else(|| not_loaded("retrieve", "search index"))?;
    let mut retrieve = Retrieve::new(search, settings.migres.clone());
    if !takes_questions {
        retrieve = retrieve.queries_only();
    }
    spawn_stage(retrieve, bus, &settings.stages.retrieve, &settings.retry).await
}

/// The sentence_filter stage with the filtering a pipeline wants.
pub(crate) async fn spawn_sentence_filter(
    mode: FilterMode,
    bus: Arc<dyn Bus>,
    settings: &Settings,
    parts: &Parts,
) -> Result<RunningStage, BusError> {
    let reranker = parts.reranker.clone().ok_or_else(|| not_loaded("sentence_filter", "re-ranker"))?;
    let stages = &settings.stages;
    let llm = llm_for(settings, &stages.sentence_filter, "sentence_filter");
    let stage = SentenceFilter::new(reranker, llm, settings.migres.clone()).with_mode(mode);
    spawn_stage(stage, bus, &stages.sentence_filter, &settings.retry).await
}

pub(crate) fn not_loaded(stage: &str, part: &str) -> BusError {
    BusError::Transport(format!("stage {stage} needs the {part}, which was not loaded"))
}

/// A client for one stage, with that stage's own limit on LLM calls in flight.
pub(crate) fn llm_for(settings: &Settings, stage: &StageSettings, name: &str) -> LlmClient {
    llm_at(&settings.llm, stage, name)
}

/// The same on another endpoint (a module with its own model).
pub(crate) fn llm_at(llm: &LlmSettings, stage: &StageSettings, name: &str) -> LlmClient {
    let mut llm = llm.clone();
    llm.max_concurrency = stage.llm_concurrency;
    LlmClient::new(llm).for_stage(name)
}

/// The join stage, with the state it kept (shared by the pipelines that fan out).
pub(crate) async fn spawn_join(bus: Arc<dyn Bus>, settings: &Settings) -> Result<RunningStage, BusError> {
    let join = Join::restore(&*bus, std::time::Duration::from_millis(settings.join.tick_ms.max(10))).await?;
    spawn_stage(join, bus, &settings.stages.join, &settings.retry).await
}
