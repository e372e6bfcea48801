//! What made an answer record: the build, the pipeline, the configuration and prompts (as hashes),
//! the model, the re-ranker and the index generations read. Without it an answer can be neither
//! audited nor reproduced: the same question gets another answer once any of these moves.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{TraceKind, TraceStep};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Provenance {
    /// Lacuna's version.
    pub version: String,
    /// The git commit it was built from (`unknown` when built outside a checkout without
    /// `LACUNA_COMMIT`).
    pub commit: String,
    pub pipeline: String,
    /// The effective configuration (defaults, profile, file and environment, as loaded), with secret
    /// values left out.
    pub config_sha256: String,
    /// One hash per prompt template the pipeline's stages use with this configuration, by name.
    pub prompts_sha256: BTreeMap<String, String>,
    /// The model the LLM endpoint reports serving, else the configured `llm.model`.
    pub model: String,
    /// The re-ranker model file's hash, where the answering process can read the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reranker_sha256: Option<String>,
    /// The generations of the indexes this answer read (each retrieval's, once each, in order).
    pub index_generation: Vec<String>,
    /// The question's OpenTelemetry trace (`[otel]`): where to see where its time went. Absent when
    /// nothing traced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

impl Provenance {
    /// This provenance for an answer whose trace is `trace`: the index generations are the ones
    /// its retrievals read, when they recorded any (a question that never retrieved keeps the
    /// index's generation at start).
    pub fn for_trace(&self, trace: &[TraceStep]) -> Provenance {
        let mut read: Vec<String> = Vec::new();
        for step in trace {
            if let TraceKind::Retrieved { generation: Some(generation), .. } = &step.kind
                && !read.contains(generation)
            {
                read.push(generation.clone());
            }
        }
        let mut stamped = self.clone();
        if !read.is_empty() {
            stamped.index_generation = read;
        }
        stamped
    }
}
