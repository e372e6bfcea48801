//! The search index: tantivy on local disk, or Meilisearch (`[search]`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSettings {
    pub backend: SearchBackend,
    pub index_dir: PathBuf,
    /// A document added to the live corpus is split into passages of at most this many words
    /// (`actors/clients/search/documents.rs`); 0: one passage per document.
    pub passage_words: usize,
    /// The largest document taken (title, text and metadata, in bytes).
    pub max_document_bytes: usize,
    /// Over Kafka: each retrieve process keeps its local tantivy index as a copy of the `documents`
    /// topic (`actors/clients/search/materialiser.rs`), and `lacuna ingest --transport kafka`
    /// publishes there.
    pub follow_documents: bool,
    /// How often a replica following the documents topic commits what it applied: the longest a
    /// published document waits to be searchable, beyond the reader's own reload (about 0.5 s).
    pub commit_interval_ms: u64,
    pub meilisearch: MeiliSettings,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SearchBackend {
    /// A tantivy BM25 index on local disk (`search.index_dir`).
    Tantivy,
    /// An index on a Meilisearch server (`search.meilisearch`).
    Meilisearch,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MeiliSettings {
    pub url: String,
    /// The index uid.
    pub index: String,
    /// Name of the environment variable holding the API key (never the key itself).
    pub api_key_env: String,
    pub timeout_ms: u64,
    pub max_retries: u32,
    pub retry_backoff_ms: u64,
    /// Documents per upload when indexing.
    pub batch_size: usize,
    /// Bytes per upload, at most (a passage larger than this goes up alone): under Meilisearch's
    /// payload limit (100 MB by default) and the indexer's memory, however large the documents. The
    /// indexer stops gathering records at this many bytes of documents too.
    pub max_batch_bytes: usize,
    /// How long to wait for one indexing task.
    pub task_timeout_ms: u64,
    pub matching_strategy: MatchingStrategy,
}

/// Which query words Meilisearch may drop when not every word matches a document. Meilisearch does
/// not rank by any-word overlap the way BM25 does, so for a whole natural-language question this
/// decides most of its recall (README, "Recall: what you trade").
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MatchingStrategy {
    /// Drop the words from the end of the query first (Meilisearch's own default).
    Last,
    /// Keep every word.
    All,
    /// Drop the most frequent words first, so the rare, telling ones stay.
    Frequency,
}
