//! The heavy parts a pipeline needs (search index, re-ranker, NLI model), loaded once at start-up
//! with errors that say how to fix them; `startup` loads those of a pipeline's stages.

use std::time::Duration;

use crate::actors::clients::breaker::Breaker;
use crate::actors::clients::{ModelError, OnnxNli, Reranker, Search, SearchError};
use crate::config::{NliBackend, Settings};
use crate::topics::Provenance;

/// What a stage needs besides the bus, loaded once per process before it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The LLM endpoint (checked to answer before the stage starts).
    Llm,
    /// The search index.
    Search,
    /// The cross-encoder.
    Reranker,
    /// The ONNX NLI model, when `nli.backend = "onnx"`.
    Nli,
}

impl Part {
    pub fn name(self) -> &'static str {
        match self {
            Part::Llm => "LLM endpoint",
            Part::Search => "search index",
            Part::Reranker => "re-ranker",
            Part::Nli => "NLI model",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PartsError {
    #[error(transparent)]
    Search(#[from] SearchError),
    #[error("re-ranker: {0} (install it with scripts/setup.sh)")]
    Reranker(ModelError),
    #[error("NLI model: {0}")]
    Nli(ModelError),
}

/// What the stages of one process need; a process running one stage loads only that stage's parts.
#[derive(Clone, Default)]
pub struct Parts {
    /// For the stages that need [`Part::Search`].
    pub search: Option<Search>,
    /// For the stages that need [`Part::Reranker`].
    pub reranker: Option<Reranker>,
    /// For the stages that need [`Part::Nli`], when `nli.backend = "onnx"`; otherwise the LLM judges.
    pub onnx_nli: Option<OnnxNli>,
    /// What made the answers this process's stages publish (`pipelines/provenance.rs`); none in tests
    /// that assemble their parts by hand.
    pub provenance: Option<std::sync::Arc<Provenance>>,
}

impl Parts {
    /// The parts in `needed`, without provenance (`Parts::load` adds it).
    pub fn open(settings: &Settings, needed: &[Part]) -> Result<Parts, PartsError> {
        let mut parts = Parts::default();
        if needed.contains(&Part::Search) {
            parts.search = Some(Search::open(&settings.search)?);
        }
        if needed.contains(&Part::Reranker) {
            parts.reranker = Some(Reranker::load(&settings.rerank, &settings.onnx).map_err(PartsError::Reranker)?);
        }
        if needed.contains(&Part::Nli) && settings.nli.backend == NliBackend::Onnx {
            parts.onnx_nli = Some(OnnxNli::load(&settings.nli, &settings.onnx).map_err(PartsError::Nli)?);
        }
        Ok(parts)
    }

    /// These parts, their provenance naming the model the endpoint reported (`check_llm`).
    pub fn with_served_model(mut self, served: Option<String>) -> Parts {
        if let (Some(provenance), Some(served)) = (self.provenance.as_mut(), served) {
            std::sync::Arc::make_mut(provenance).model = served;
        }
        self
    }
}

/// How many requests the LLM endpoint decodes at once, from llama.cpp's `GET /props`
/// (`total_slots`); `None` where the server does not say (another server, or no answer).
pub async fn served_slots(settings: &Settings) -> Option<u64> {
    let base = settings.llm.base_url.trim_end_matches('/');
    let root = base.strip_suffix("/v1").unwrap_or(base);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().ok()?;
    let response = client.get(format!("{root}/props")).send().await.ok()?.error_for_status().ok()?;
    let body: serde_json::Value = response.json().await.ok()?;
    body["total_slots"].as_u64()
}

/// Checks that the LLM endpoint answers at all, so a wrong URL fails at once with a clear message
/// instead of as one error record per question minutes later. Returns the model id the endpoint
/// reports (`/models`) when it reports one: local servers report a file path, shortened to its name.
/// Any answer, a 503 from a gateway in front of a server that is down included, marks the endpoint
/// as seen, so its circuit breaker applies: a process restarted during an outage pauses.
pub async fn check_llm(settings: &Settings) -> Result<Option<String>, String> {
    let url = format!("{}/models", settings.llm.base_url.trim_end_matches('/'));
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().map_err(|e| e.to_string())?;
    match client.get(&url).send().await {
        // Any answer means the endpoint is there; the model list is a bonus.
        Ok(response) => {
            Breaker::for_llm(&settings.llm).seen();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            let id = body["data"][0]["id"].as_str();
            Ok(id.map(|id| id.rsplit('/').next().unwrap_or(id).to_string()))
        }
        Err(e) => Err(format!(
            "LLM endpoint {} unreachable ({e}). Start the local server with `scripts/llm-server.sh start`, \
             or point LACUNA__LLM__BASE_URL at an OpenAI-compatible endpoint.",
            settings.llm.base_url
        )),
    }
}
