//! Passage retrieval. The embedded default is a tantivy BM25 index on local disk, built by `lacuna
//! index --corpus FILE.jsonl` from `{"id", "title", "text"}` lines; `search.backend = "meilisearch"`
//! reads a Meilisearch index instead. Stages hold a [`Search`] and cannot tell which. Each backend is
//! a folder in Vector's shape: its shared schema in `mod.rs`, then `read.rs` and `write.rs`.
//! - `tantivy/`: the local index, read and written (`lacuna index`, `ingest`, serve, a replica);
//! - `meili/`: a Meilisearch index, read and written the same ways;
//! - `corpus`: corpus files as both backends index them, with one error type;
//! - `documents`: documents of the live corpus, and the rule that splits one into passages;
//! - `changes`: what both followers of the documents topic share (offsets applied, lag, dead letters);
//! - `materialiser`: a retrieve replica's tantivy index following the documents topic;
//! - `indexer`: `lacuna indexer`, a Meilisearch index following the documents topic.

pub mod changes;
mod corpus;
pub mod documents;
pub mod indexer;
pub mod materialiser;
pub mod meili;
pub mod tantivy;

pub use corpus::{corpus_error, for_each_passage};
pub use documents::{Document, DocumentError};
pub use meili::MeiliSearch;
pub use tantivy::{TantivySearch, TantivyWriter};

use std::path::PathBuf;

use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _};
use opentelemetry::{Context, KeyValue};

use crate::config::{SearchBackend, SearchSettings};
use crate::topics::Passage;

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("no search index at {0}: build one with `lacuna index --corpus FILE.jsonl`")]
    MissingIndex(PathBuf),
    #[error("search index error: {0}")]
    Index(String),
    #[error("corpus {path} line {line}: {message}")]
    Corpus { path: PathBuf, line: usize, message: String },
    #[error(
        "no Meilisearch index {index:?} at {url}: build one with `lacuna index --backend meilisearch --corpus FILE.jsonl`"
    )]
    MissingRemoteIndex { index: String, url: String },
    /// An index its follower must not go on with as it is (it would hide or bring back documents); the
    /// message says what to do. No retry cures it.
    #[error("{0}")]
    Refused(String),
    /// A Meilisearch error; `transient` ones (unreachable, timeouts, 429, 5xx) are worth retrying.
    #[error("{message}")]
    Remote { message: String, transient: bool },
}

impl SearchError {
    pub fn is_transient(&self) -> bool {
        matches!(self, SearchError::Index(_) | SearchError::Remote { transient: true, .. })
    }
}

/// The retrieval client a pipeline was configured with.
#[derive(Clone)]
pub enum Search {
    Tantivy(TantivySearch),
    Meili(MeiliSearch),
}

impl Search {
    /// Opens the configured backend: the local index must exist; a Meilisearch index is checked on
    /// first use (a missing one is then a clear, non-retryable error).
    pub fn open(settings: &SearchSettings) -> Result<Search, SearchError> {
        Ok(match settings.backend {
            SearchBackend::Tantivy => Search::Tantivy(TantivySearch::open(&settings.index_dir)?),
            SearchBackend::Meilisearch => Search::Meili(MeiliSearch::new(settings.meilisearch.clone())?),
        })
    }

    /// The top `limit` passages for a free-text query, best first, with the backend's score.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<(Passage, f32)>, SearchError> {
        Ok(self.search_with_generation(query, limit).await?.0)
    }

    /// The same, with the generation of the index the hits came from, where the backend has one:
    /// tantivy's, or the offsets `lacuna indexer` last stored with a Meilisearch index.
    pub async fn search_with_generation(
        &self,
        query: &str,
        limit: usize,
    ) -> Result<(Vec<(Passage, f32)>, Option<String>), SearchError> {
        let attributes = vec![
            KeyValue::new("lacuna.search.query", query.to_string()),
            KeyValue::new("lacuna.search.k", limit as i64),
            KeyValue::new("lacuna.search.backend", self.backend_name()),
            KeyValue::new("openinference.span.kind", "RETRIEVER"),
            KeyValue::new("input.value", query.to_string()),
        ];
        let trace = crate::telemetry::child_span("search", SpanKind::Client, &Context::current(), attributes);
        let found = self.search_in(query, limit).await;
        let span = trace.span();
        match &found {
            Ok((hits, generation)) => {
                span.set_attribute(KeyValue::new("lacuna.search.hits", hits.len() as i64));
                if let Some(generation) = generation {
                    span.set_attribute(KeyValue::new("lacuna.index.generation", generation.clone()));
                }
            }
            Err(error) => span.set_status(Status::error(error.to_string())),
        }
        span.end();
        found
    }

    fn backend_name(&self) -> &'static str {
        match self {
            Search::Tantivy(_) => "tantivy",
            Search::Meili(_) => "meilisearch",
        }
    }

    async fn search_in(&self, query: &str, limit: usize) -> Result<(Vec<(Passage, f32)>, Option<String>), SearchError> {
        match self {
            Search::Tantivy(index) => {
                let (index, query) = (index.clone(), query.to_string());
                // tantivy search is synchronous; keep it off the actor's thread.
                let (hits, generation) =
                    tokio::task::spawn_blocking(move || index.search_with_generation(&query, limit))
                        .await
                        .map_err(|e| SearchError::Index(e.to_string()))??;
                Ok((hits, Some(generation)))
            }
            Search::Meili(meili) => {
                let hits = meili.search(query, limit).await?;
                Ok((hits, meili.generation().await))
            }
        }
    }

    /// The index's generation now, where the backend has one.
    pub fn generation(&self) -> Option<String> {
        match self {
            Search::Tantivy(index) => Some(index.generation()),
            Search::Meili(_) => None,
        }
    }
}
