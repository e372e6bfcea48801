//! Passage retrieval. The embedded default is a tantivy BM25 index on local disk, built by
//! `lacuna index --corpus FILE.jsonl` from `{"id", "title", "text"}` lines; `search.backend =
//! "meilisearch"` reads a Meilisearch index instead (`meili.rs`). Stages hold a [`Search`] and cannot
//! tell which.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tantivy::collector::TopDocs;
use tantivy::query::{QueryParser, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions, Value};
use tantivy::{Index, IndexReader, ReloadPolicy, TantivyDocument, Term, doc};

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
    Meili(super::meili::MeiliSearch),
}

impl Search {
    /// Opens the configured backend: the local index must exist; a Meilisearch index is checked on
    /// first use (a missing one is then a clear, non-retryable error).
    pub fn open(settings: &crate::settings::SearchSettings) -> Result<Search, SearchError> {
        Ok(match settings.backend {
            crate::settings::SearchBackend::Tantivy => Search::Tantivy(TantivySearch::open(&settings.index_dir)?),
            crate::settings::SearchBackend::Meilisearch => {
                Search::Meili(super::meili::MeiliSearch::new(settings.meilisearch.clone()))
            }
        })
    }

    /// The top `limit` passages for a free-text query, best first, with the backend's score.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<(Passage, f32)>, SearchError> {
        match self {
            Search::Tantivy(index) => {
                let (index, query) = (index.clone(), query.to_string());
                // tantivy search is synchronous; keep it off the actor's thread.
                tokio::task::spawn_blocking(move || index.search(&query, limit))
                    .await
                    .map_err(|e| SearchError::Index(e.to_string()))?
            }
            Search::Meili(meili) => meili.search(query, limit).await,
        }
    }
}

impl From<tantivy::TantivyError> for SearchError {
    fn from(e: tantivy::TantivyError) -> Self {
        SearchError::Index(e.to_string())
    }
}

#[derive(Clone, Copy)]
struct Fields {
    id: Field,
    title: Field,
    text: Field,
}

fn schema() -> (Schema, Fields) {
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
    (builder.build(), Fields { id, title, text })
}

#[derive(Clone)]
pub struct TantivySearch {
    reader: IndexReader,
    parser: std::sync::Arc<QueryParser>,
    fields: Fields,
}

#[derive(Deserialize)]
struct CorpusLine {
    id: String,
    #[serde(default)]
    title: String,
    text: String,
}

pub(crate) fn corpus_error(corpus: &Path, line: usize, message: String) -> SearchError {
    SearchError::Corpus { path: corpus.to_path_buf(), line, message }
}

/// Calls `each` with the line number and passage of every non-blank line of a corpus JSONL file
/// (`{"id", "title", "text"}`), stopping at the first error.
pub(crate) fn for_each_passage(
    corpus: &Path,
    mut each: impl FnMut(usize, Passage) -> Result<(), SearchError>,
) -> Result<(), SearchError> {
    let file = std::fs::File::open(corpus).map_err(|e| corpus_error(corpus, 0, e.to_string()))?;
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| corpus_error(corpus, n + 1, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let CorpusLine { id, title, text } =
            serde_json::from_str(&line).map_err(|e| corpus_error(corpus, n + 1, e.to_string()))?;
        each(n + 1, Passage { id, title, text })?;
    }
    Ok(())
}

impl TantivySearch {
    /// Builds a fresh index in `dir` from a corpus JSONL file; returns the number of passages.
    pub fn build(dir: &Path, corpus: &Path) -> Result<usize, SearchError> {
        // Open the corpus first: a wrong path must not cost the old index.
        std::fs::File::open(corpus).map_err(|e| corpus_error(corpus, 0, e.to_string()))?;
        // Rebuilding replaces the old index so re-running `lacuna index` never duplicates passages.
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| SearchError::Index(e.to_string()))?;
        }
        std::fs::create_dir_all(dir).map_err(|e| SearchError::Index(e.to_string()))?;
        let (schema, fields) = schema();
        let index = Index::create_in_dir(dir, schema)?;
        let mut writer = index.writer::<TantivyDocument>(100_000_000)?;
        let mut count = 0;
        for_each_passage(corpus, |_, passage| {
            writer.add_document(doc!(
                fields.id => passage.id,
                fields.title => passage.title,
                fields.text => passage.text,
            ))?;
            count += 1;
            Ok(())
        })?;
        writer.commit()?;
        Ok(count)
    }

    pub fn open(dir: &Path) -> Result<Self, SearchError> {
        if !dir.join("meta.json").exists() {
            return Err(SearchError::MissingIndex(dir.to_path_buf()));
        }
        let index = Index::open_in_dir(dir)?;
        let (_, fields) = schema();
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        let parser = QueryParser::for_index(&index, vec![fields.title, fields.text]);
        Ok(TantivySearch { reader, parser: std::sync::Arc::new(parser), fields })
    }

    /// BM25 top `limit` passages for a free-text query, best first.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<(Passage, f32)>, SearchError> {
        // Lenient parsing: questions contain quotes, colons and parentheses that are not query syntax.
        let (query, _ignored) = self.parser.parse_query_lenient(&strip_syntax(query));
        let searcher = self.reader.searcher();
        let top = searcher.search(&query, &TopDocs::with_limit(limit.max(1)))?;
        top.into_iter().map(|(score, address)| Ok((self.to_passage(&searcher.doc(address)?), score))).collect()
    }

    /// The passage with this id, if the index has it.
    pub fn passage(&self, id: &str) -> Result<Option<Passage>, SearchError> {
        let searcher = self.reader.searcher();
        let query = TermQuery::new(Term::from_field_text(self.fields.id, id), IndexRecordOption::Basic);
        let top = searcher.search(&query, &TopDocs::with_limit(1))?;
        match top.first() {
            Some((_, address)) => Ok(Some(self.to_passage(&searcher.doc(*address)?))),
            None => Ok(None),
        }
    }

    pub fn num_passages(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    fn to_passage(&self, doc: &TantivyDocument) -> Passage {
        let get = |field| doc.get_first(field).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        Passage { id: get(self.fields.id), title: get(self.fields.title), text: get(self.fields.text) }
    }
}

/// Keeps words only: query syntax characters (`:`, `"`, `+`, `-`, brackets) would change the query.
fn strip_syntax(query: &str) -> String {
    query.chars().map(|c| if c.is_alphanumeric() || c == '\'' { c } else { ' ' }).collect()
}
