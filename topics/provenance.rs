//! What made an answer record: the build, the pipeline, the configuration and prompts (as hashes),
//! the model, the re-ranker and the index generations read. Without it an answer can be neither
//! audited nor reproduced: the same question gets another answer once any of these moves.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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
/// A file's SHA-256, hashed once per path and process; `None` when it cannot be read (a process
/// that runs no re-ranking stage may not have the model). The re-ranker's graph is hashed for the
/// provenance and for its score cache's keys: 34 MB read once.
pub fn file_sha256(path: &Path) -> Option<String> {
    static HASHED: OnceLock<Mutex<HashMap<PathBuf, Option<String>>>> = OnceLock::new();
    let hashed = HASHED.get_or_init(Default::default);
    if let Some(known) = hashed.lock().expect("hash cache lock").get(path) {
        return known.clone();
    }
    let digest = std::fs::read(path).ok().map(|bytes| sha256_hex(&bytes));
    hashed.lock().expect("hash cache lock").insert(path.to_path_buf(), digest.clone());
    digest
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A digest as lower-case hex.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
