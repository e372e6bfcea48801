//! Searching the local tantivy index: BM25 over titles and texts, the passage by id, and the
//! generation a search read (with what the commit says it applied from the documents topic).

use std::collections::BTreeMap;
use std::path::Path;

use ::tantivy::collector::{DocSetCollector, TopDocs};
use ::tantivy::query::{AllQuery, QueryParser, TermQuery};
use ::tantivy::schema::{IndexRecordOption, Value};
use ::tantivy::{Index, IndexReader, ReloadPolicy, TantivyDocument, Term};

use super::{Fields, commit_generation, schema};
use crate::actors::clients::search::SearchError;
use crate::actors::clients::search::documents::passage_number;
use crate::topics::Passage;

#[derive(Clone)]
pub struct TantivySearch {
    index: Index,
    reader: IndexReader,
    parser: std::sync::Arc<QueryParser>,
    fields: Fields,
    /// The last generation named, with what its commit says it applied (see [`Self::generation_of`]).
    applied: std::sync::Arc<std::sync::Mutex<(String, Option<u64>)>>,
}

impl TantivySearch {
    pub fn open(dir: &Path) -> Result<Self, SearchError> {
        if !dir.join("meta.json").exists() {
            return Err(SearchError::MissingIndex(dir.to_path_buf()));
        }
        let index = Index::open_in_dir(dir)?;
        let (_, fields) = schema();
        let reader = index.reader_builder().reload_policy(ReloadPolicy::OnCommitWithDelay).try_into()?;
        let parser = QueryParser::for_index(&index, vec![fields.title, fields.text]);
        Ok(TantivySearch { index, reader, parser: std::sync::Arc::new(parser), fields, applied: Default::default() })
    }

    /// BM25 top `limit` passages for a free-text query, best first.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<(Passage, f32)>, SearchError> {
        Ok(self.search_with_generation(query, limit)?.0)
    }

    /// The same, with the generation of the index the hits came from (one searcher for both).
    pub fn search_with_generation(
        &self,
        query: &str,
        limit: usize,
    ) -> Result<(Vec<(Passage, f32)>, String), SearchError> {
        // Lenient parsing: questions contain quotes, colons and parentheses that are not query syntax.
        let (query, _ignored) = self.parser.parse_query_lenient(&strip_syntax(query));
        let searcher = self.reader.searcher();
        let top = searcher.search(&query, &TopDocs::with_limit(limit.max(1)))?;
        let hits = top
            .into_iter()
            .map(|(score, address)| Ok((self.to_passage(&searcher.doc(address)?), score)))
            .collect::<Result<_, SearchError>>()?;
        Ok((hits, self.generation_of(&searcher)))
    }

    /// The generation of the index as a search reads it now.
    pub fn generation(&self) -> String {
        self.generation_of(&self.reader.searcher())
    }

    /// `tantivy:<passages>:<hash>`, and for an index a replica materialises from the documents topic
    /// `:applied=<n>`: the changelog records, summed over partitions, that it holds everything before
    /// (its commit stores them). The commit read from disk is taken only when its segments are the
    /// searcher's own, so a newer commit never lends its offsets to an older searcher.
    fn generation_of(&self, searcher: &::tantivy::Searcher) -> String {
        let base = commit_generation(searcher);
        let mut cached = self.applied.lock().unwrap();
        if cached.0 != base {
            *cached = (base.clone(), applied(&self.index, searcher));
        }
        match cached.1 {
            Some(applied) => format!("{base}:applied={applied}"),
            None => base,
        }
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

    /// Whether the index holds any passage of document `doc_id`.
    pub fn has_document(&self, doc_id: &str) -> bool {
        let query = TermQuery::new(Term::from_field_text(self.fields.doc, doc_id), IndexRecordOption::Basic);
        self.reader.searcher().search(&query, &::tantivy::collector::Count).is_ok_and(|n| n > 0)
    }

    /// The passages of document `doc_id`, in order, with its metadata (JSON as stored); None when
    /// the index has none.
    pub fn document(&self, doc_id: &str) -> Result<Option<(Vec<Passage>, String)>, SearchError> {
        let searcher = self.reader.searcher();
        let query = TermQuery::new(Term::from_field_text(self.fields.doc, doc_id), IndexRecordOption::Basic);
        // A document of search.max_document_bytes splits into a few thousand passages at most.
        let top = searcher.search(&query, &TopDocs::with_limit(100_000))?;
        let (mut passages, mut metadata) = (Vec::new(), String::new());
        for (_, address) in top {
            let doc: TantivyDocument = searcher.doc(address)?;
            metadata = doc.get_first(self.fields.metadata).and_then(|v| v.as_str()).unwrap_or_default().to_string();
            passages.push(self.to_passage(&doc));
        }
        if passages.is_empty() {
            return Ok(None);
        }
        passages.sort_by_key(|p| passage_number(&p.id));
        Ok(Some((passages, metadata)))
    }

    /// Every document the index holds, by id, with its passages in order (`lacuna verify-index`).
    pub fn all_documents(&self) -> Result<BTreeMap<String, Vec<Passage>>, SearchError> {
        let searcher = self.reader.searcher();
        let mut documents: BTreeMap<String, Vec<Passage>> = BTreeMap::new();
        for address in searcher.search(&AllQuery, &DocSetCollector)? {
            let doc: TantivyDocument = searcher.doc(address)?;
            let doc_id = doc.get_first(self.fields.doc).and_then(|v| v.as_str()).unwrap_or_default().to_string();
            documents.entry(doc_id).or_default().push(self.to_passage(&doc));
        }
        documents.values_mut().for_each(|passages| passages.sort_by_key(|p| passage_number(&p.id)));
        Ok(documents)
    }

    pub fn num_passages(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    fn to_passage(&self, doc: &TantivyDocument) -> Passage {
        let get = |field| doc.get_first(field).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        Passage { id: get(self.fields.id), title: get(self.fields.title), text: get(self.fields.text) }
    }
}

/// The changelog records the commit that `searcher` reads says it applied, if it says so.
fn applied(index: &Index, searcher: &::tantivy::Searcher) -> Option<u64> {
    let metas = index.load_metas().ok()?;
    let segments =
        |pairs: Vec<(String, u32)>| -> std::collections::BTreeSet<(String, u32)> { pairs.into_iter().collect() };
    let committed = segments(metas.segments.iter().map(|m| (m.id().uuid_string(), m.num_deleted_docs())).collect());
    let searched = segments(
        searcher.segment_readers().iter().map(|r| (r.segment_id().uuid_string(), r.num_deleted_docs())).collect(),
    );
    if committed != searched {
        return None;
    }
    let payload: serde_json::Value = serde_json::from_str(metas.payload.as_deref()?).ok()?;
    Some(payload.get("next")?.as_object()?.values().filter_map(serde_json::Value::as_u64).sum())
}

/// Keeps words only: query syntax characters (`:`, `"`, `+`, `-`, brackets) would change the query.
fn strip_syntax(query: &str) -> String {
    query.chars().map(|c| if c.is_alphanumeric() || c == '\'' { c } else { ' ' }).collect()
}
