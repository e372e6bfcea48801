//! Reading a Meilisearch index: the searches a retrieve stage sends, scored by Meilisearch's
//! `_rankingScore` (0 to 1), a passage by id, which documents the index holds, and the generation a
//! search reads (the offsets `lacuna indexer` stored).

use meilisearch_sdk::documents::DocumentsQuery;
use meilisearch_sdk::errors::{Error as SdkError, ErrorCode};
use meilisearch_sdk::indexes::Index;
use meilisearch_sdk::search::{MatchingStrategies, SearchQuery, SearchResult, Selectors};

use super::{
    APPLIED_KEY, AppliedDocument, FIELDS, GENERATION_FOR, MeiliHit, MeiliSearch, Stored, applied_generation, key_of,
    newest_by_document, of_documents, quoted,
};
use crate::actors::clients::search::SearchError;
use crate::actors::clients::search::changes::Applied;
use crate::config::MatchingStrategy;
use crate::topics::Passage;

/// The search a retrieve stage sends: the top `limit` documents (at least one) with their ranking
/// scores and the passage fields, under the configured matching strategy.
pub fn search_query<'a>(
    index: &'a Index,
    query: &'a str,
    limit: usize,
    strategy: MatchingStrategy,
) -> SearchQuery<'a, meilisearch_sdk::DefaultHttpClient> {
    let mut search = index.search();
    search
        .with_query(query)
        .with_limit(limit.max(1))
        .with_matching_strategy(match strategy {
            MatchingStrategy::Last => MatchingStrategies::LAST,
            MatchingStrategy::All => MatchingStrategies::ALL,
            MatchingStrategy::Frequency => MatchingStrategies::FREQUENCY,
        })
        .with_show_ranking_score(true)
        .with_attributes_to_retrieve(Selectors::Some(&FIELDS));
    search
}

/// Search hits as passages with their ranking scores, best first (Meilisearch's order), one per
/// passage id: two versions of a document held for a moment may both match.
pub fn passages(hits: Vec<SearchResult<MeiliHit>>) -> Result<Vec<(Passage, f32)>, SearchError> {
    let mut seen = std::collections::HashSet::new();
    let mut passages = Vec::with_capacity(hits.len());
    for hit in hits {
        let Some(score) = hit.ranking_score else {
            return Err(SearchError::Remote {
                message: format!("Meilisearch returned document {:?} without its _rankingScore", hit.result.id),
                transient: false,
            });
        };
        // A deletion's marker has no words; only a search for none could return it.
        if hit.result.text.is_empty() && hit.result.title.is_empty() {
            continue;
        }
        if seen.insert(hit.result.id.clone()) {
            passages.push((hit.result.into(), score as f32));
        }
    }
    Ok(passages)
}

impl MeiliSearch {
    /// The top `limit` passages for a free-text query, best first, scored by `_rankingScore`.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<(Passage, f32)>, SearchError> {
        let index = self.index();
        let strategy = self.settings.matching_strategy;
        let results = self
            .retrying("search", || async { search_query(&index, query, limit, strategy).execute::<MeiliHit>().await })
            .await?;
        passages(results.hits)
    }

    /// The passage with this id, if the index has it: stored under [`key_of`] it (a corpus file,
    /// another tool's index), or by a live change under a key of its own (the newest such).
    pub async fn passage(&self, id: &str) -> Result<Option<Passage>, SearchError> {
        let (index, key) = (self.index(), key_of(id));
        let document = self
            .retrying("get a document", || async {
                match index.get_document::<MeiliHit>(&key).await {
                    Err(SdkError::Meilisearch(error)) if error.error_code == ErrorCode::DocumentNotFound => Ok(None),
                    outcome => outcome.map(Some),
                }
            })
            .await?;
        if let Some(document) = document {
            return Ok(Some(document.into()));
        }
        let filter = format!("id = {}", quoted(id));
        let mut query = DocumentsQuery::new(&index);
        query.with_filter(&filter).with_limit(100);
        let found = self
            .retrying("find a passage", || async {
                match query.execute::<Stored>().await {
                    // An index Lacuna did not write has no filterable `id`, and no live changes.
                    Err(SdkError::Meilisearch(error)) if error.error_code == ErrorCode::InvalidDocumentFilter => {
                        Ok(Vec::new())
                    }
                    outcome => outcome.map(|found| found.results),
                }
            })
            .await?;
        Ok(found.into_iter().max_by_key(|s| s.seq).map(Passage::from))
    }

    /// The generation searches read now, from the offsets `lacuna indexer` stored (read at most once
    /// a second); `None` for an index no indexer wrote, or when they cannot be read.
    pub async fn generation(&self) -> Option<String> {
        let now = tokio::time::Instant::now();
        if let Some((read, generation)) = &*self.generation_cache.lock().unwrap()
            && now.duration_since(*read) < GENERATION_FOR
        {
            return generation.clone();
        }
        let generation = match self.applied().await {
            Ok(applied) => applied.map(|applied| applied_generation(&self.settings.index, &applied)),
            Err(error) => {
                tracing::warn!(%error, "cannot read the Meilisearch index's applied offsets");
                None
            }
        };
        *self.generation_cache.lock().unwrap() = Some((now, generation.clone()));
        generation
    }

    /// Which of these documents the index holds passages of (one request: Lacuna's indexes filter on
    /// `doc_id`).
    pub async fn holding(&self, doc_ids: &[String]) -> Result<std::collections::HashSet<String>, SearchError> {
        if doc_ids.is_empty() {
            return Ok(Default::default());
        }
        let index = self.index();
        let filter = of_documents(doc_ids);
        let mut query = DocumentsQuery::new(&index);
        query.with_filter(&filter).with_fields(["doc_id", "seq", "deleted"]).with_limit(doc_ids.len() * 16);
        let found = self.retrying("find documents", || query.execute::<serde_json::Value>()).await?;
        // A document is held when its newest entry is a passage, not a deletion's marker.
        let newest = newest_by_document(&found.results);
        Ok(newest.into_iter().filter(|(_, (_, deleted))| !deleted).map(|(id, _)| id).collect())
    }

    /// How many documents the index holds.
    pub async fn documents(&self) -> Result<usize, SearchError> {
        let index = self.index();
        let mut query = DocumentsQuery::new(&index);
        query.with_limit(0);
        let documents = self.retrying("count documents", || query.execute::<MeiliHit>()).await?;
        Ok(documents.total as usize)
    }

    /// The changelog offsets the index holds, if any were stored.
    pub async fn applied(&self) -> Result<Option<Applied>, SearchError> {
        let index = self.applied_index();
        let stored = self
            .retrying("read the applied offsets", || async {
                match index.get_document::<AppliedDocument>(APPLIED_KEY).await {
                    Err(SdkError::Meilisearch(error))
                        if matches!(error.error_code, ErrorCode::DocumentNotFound | ErrorCode::IndexNotFound) =>
                    {
                        Ok(None)
                    }
                    outcome => outcome.map(Some),
                }
            })
            .await?;
        Ok(stored.map(|document| document.applied))
    }
}
