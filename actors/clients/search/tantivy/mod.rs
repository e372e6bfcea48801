//! The embedded default: a tantivy BM25 index on local disk, with English stemming. This file holds
//! the index's schema and its generation, which both sides share:
//! - `read`: searches; readers follow the index's commits (`ReloadPolicy::OnCommitWithDelay`), so
//!   passages that `lacuna ingest`, `lacuna index` or `serve` commit are searched within a second;
//! - `write`: the one code path by which `lacuna index` (a bulk replace), `lacuna ingest`, `serve`'s
//!   document routes and a following replica change a corpus.

mod read;
mod write;

use ::tantivy::schema::{Field, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions};

pub use read::TantivySearch;
pub use write::TantivyWriter;

use super::SearchError;

impl From<tantivy::TantivyError> for SearchError {
    fn from(e: tantivy::TantivyError) -> Self {
        SearchError::Index(e.to_string())
    }
}

#[derive(Clone, Copy)]
pub(super) struct Fields {
    pub(super) id: Field,
    pub(super) title: Field,
    pub(super) text: Field,
    /// The document a passage belongs to: what replacing or deleting a document deletes by. Added
    /// after the others, so indexes built before it still read (they cannot be written).
    pub(super) doc: Field,
    /// The document's metadata as JSON, stored only.
    pub(super) metadata: Field,
}

pub(super) fn schema() -> (Schema, Fields) {
    let mut builder = Schema::builder();
    // English stemming, as BM25 baselines (pyserini) do; positions are not needed for bag-of-words BM25.
    let text_options = TextOptions::default()
        .set_indexing_options(
            TextFieldIndexing::default().set_tokenizer("en_stem").set_index_option(IndexRecordOption::WithFreqs),
        )
        .set_stored();
    let id = builder.add_text_field("id", STRING | STORED);
    let title = builder.add_text_field("title", text_options.clone());
    let text = builder.add_text_field("text", text_options);
    let doc = builder.add_text_field("doc", STRING | STORED);
    let metadata = builder.add_text_field("metadata", STORED);
    (builder.build(), Fields { id, title, text, doc, metadata })
}

/// A searcher's generation, `tantivy:<live passages>:<hash>`: the hash covers its segments and their
/// deletes, so any commit that changes what a search can return changes the generation, and two
/// replicas that built or applied the same commits agree on it.
pub(super) fn commit_generation(searcher: &::tantivy::Searcher) -> String {
    use sha2::{Digest, Sha256};
    let mut segments: Vec<String> = searcher
        .segment_readers()
        .iter()
        .map(|r| format!("{}-{}", r.segment_id().uuid_string(), r.num_deleted_docs()))
        .collect();
    segments.sort();
    let digest = Sha256::digest(segments.join(",").as_bytes());
    let short = crate::topics::provenance::hex(&digest[..4]);
    format!("tantivy:{}:{short}", searcher.num_docs())
}
