//! Writing a Meilisearch index as the live corpus: the documents `lacuna indexer` applies from the
//! documents topic, `lacuna ingest` in process, and `lacuna index --backend meilisearch`'s corpus.
//!
//! Every passage is stored as `{"key", "id", "doc_id", "title", "text", "change"}`, and the document's
//! `metadata` when it has any:
//! - `key` is the primary key. Meilisearch takes only letters, digits, `-` and `_` in one, and passage
//!   ids of split documents hold `#`, so an id it cannot take is stored under `sha256_<hex>` of itself
//!   ([`key_of`]); `id` keeps the passage id that searches return.
//! - `doc_id` and `change` are filterable. A batch tags its passages with one `change`, adds them
//!   (replacing by key), and then deletes its documents' passages of any other `change`: so a new,
//!   shorter version leaves no stale passage behind, and a search never finds a document absent
//!   between its two versions.
//!
//! The changelog offsets the index holds are stored beside it, in the index `<index>-applied`, after
//! each batch's tasks have succeeded. A batch applied again after a crash changes nothing.

use std::collections::BTreeMap;

use meilisearch_sdk::documents::DocumentDeletionQuery;
use meilisearch_sdk::errors::{Error as SdkError, ErrorCode};
use meilisearch_sdk::settings::Settings as IndexSettings;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::changes::Applied;
use super::documents::Document;
use super::meili::{FIELDS, SEARCHED, valid_document_id};
use super::{MeiliSearch, SearchError};
use crate::topics::Passage;

/// The primary key of every index Lacuna writes.
pub const PRIMARY_KEY: &str = "key";

/// Documents named in one deletion filter.
const IDS_PER_FILTER: usize = 500;

/// The Meilisearch document id of a passage: its own id where Meilisearch takes it, otherwise
/// `sha256_` and the hex digest of it (never an id Meilisearch would take as written, so the two
/// cannot meet).
pub fn key_of(passage_id: &str) -> String {
    if valid_document_id(passage_id) && !passage_id.starts_with("sha256_") {
        return passage_id.to_string();
    }
    let digest = Sha256::digest(passage_id.as_bytes());
    format!("sha256_{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// A passage as Lacuna writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    pub key: String,
    pub id: String,
    pub doc_id: String,
    pub title: String,
    pub text: String,
    pub change: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

impl Stored {
    pub fn new(passage: Passage, doc_id: &str, change: &str) -> Stored {
        Stored {
            key: key_of(&passage.id),
            id: passage.id,
            doc_id: doc_id.to_string(),
            title: passage.title,
            text: passage.text,
            change: change.to_string(),
            metadata: BTreeMap::new(),
        }
    }
}

/// One document's latest change in a batch: its new version, or `None` to delete it.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub doc_id: String,
    pub document: Option<Document>,
}

/// The offsets document in `<index>-applied` (nested, not flattened: serde reads a flattened map's
/// keys only as strings).
#[derive(Serialize, Deserialize)]
struct AppliedDocument {
    key: String,
    applied: Applied,
}

const APPLIED_KEY: &str = "applied";

/// Settings of an index Lacuna writes: what is searched, what comes back, and the attributes that
/// deletions filter on.
fn writable_settings() -> IndexSettings {
    IndexSettings::new()
        .with_searchable_attributes(SEARCHED)
        .with_displayed_attributes(FIELDS)
        .with_filterable_attributes(["doc_id", "change"])
}

/// A string as a Meilisearch filter value: double-quoted, with `"` and `\` escaped.
fn quoted(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The filter for the passages of these documents: `doc_id IN [...]`.
pub(super) fn of_documents<S: AsRef<str>>(doc_ids: &[S]) -> String {
    let ids: Vec<String> = doc_ids.iter().map(|id| quoted(id.as_ref())).collect();
    format!("doc_id IN [{}]", ids.join(", "))
}

/// The deletions that follow a batch's additions: the upserted documents' passages of any other
/// `change`, and every passage of the deleted documents. A few hundred documents per filter.
pub fn deletion_filters(updates: &[Update], change: &str) -> Vec<String> {
    let upserted: Vec<&str> = updates.iter().filter(|u| u.document.is_some()).map(|u| u.doc_id.as_str()).collect();
    let deleted: Vec<&str> = updates.iter().filter(|u| u.document.is_none()).map(|u| u.doc_id.as_str()).collect();
    let stale =
        upserted.chunks(IDS_PER_FILTER).map(|ids| format!("{} AND change != {}", of_documents(ids), quoted(change)));
    let gone = deleted.chunks(IDS_PER_FILTER).map(of_documents);
    stale.chain(gone).collect()
}

/// What a batch wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Written {
    pub upserts: usize,
    pub deletes: usize,
    pub passages: usize,
}

impl MeiliSearch {
    fn applied_index(&self) -> meilisearch_sdk::indexes::Index {
        self.client.index(format!("{}-applied", self.settings.index))
    }

    /// Creates `uid` with Lacuna's primary key unless it exists; an index that exists with another
    /// primary key (one `lacuna index` wrote before passages were keyed by `key`) is refused.
    async fn create_keyed(&self, uid: &str) -> Result<(), SearchError> {
        let created = self.retrying("create the index", || self.client.create_index(uid, Some(PRIMARY_KEY))).await?;
        match self.finished(&created).await? {
            Err(failure) if failure.is(ErrorCode::IndexAlreadyExists) => {}
            outcome => outcome?,
        }
        let index = self.client.index(uid);
        let key = self
            .retrying("read the index", || {
                let mut index = index.clone();
                async move { index.get_primary_key().await.map(|key| key.map(str::to_string)) }
            })
            .await?;
        match key.as_deref() {
            None | Some(PRIMARY_KEY) => Ok(()),
            Some(other) => Err(SearchError::Remote {
                message: format!(
                    "Meilisearch index {uid:?} has the primary key {other:?}, not {PRIMARY_KEY:?}: it was written by an \
                     earlier `lacuna index`; give search.meilisearch.index a new uid and index again"
                ),
                transient: false,
            }),
        }
    }

    /// Makes the index ready to be written: created, keyed by `key`, with its settings.
    pub async fn open_for_writing(&self) -> Result<(), SearchError> {
        self.create_keyed(&self.settings.index).await?;
        let index = self.index();
        let settings = writable_settings();
        let updated = self.retrying("set the index settings", || index.set_settings(&settings)).await?;
        self.finished(&updated).await??;
        Ok(())
    }

    /// Writes passages, `batch_size` to a task, and waits for every task.
    pub async fn write(&self, passages: &[Stored]) -> Result<(), SearchError> {
        let index = self.index();
        let batch_size = self.settings.batch_size.max(1);
        for batch in passages.chunks(batch_size) {
            let task = self.retrying("upload documents", || index.add_or_replace(batch, Some(PRIMARY_KEY))).await?;
            self.finished(&task).await??;
        }
        Ok(())
    }

    /// Applies a batch of document changes (one per document), split into passages of at most
    /// `passage_words` words and tagged `change`: additions first, then the deletions of what they
    /// replace and of deleted documents. Returns once Meilisearch has done every task.
    pub async fn apply(&self, updates: &[Update], passage_words: usize, change: &str) -> Result<Written, SearchError> {
        let mut passages = Vec::new();
        for update in updates {
            if let Some(document) = &update.document {
                passages.extend(
                    document.passages(passage_words).into_iter().map(|p| Stored {
                        metadata: document.metadata.clone(),
                        ..Stored::new(p, &update.doc_id, change)
                    }),
                );
            }
        }
        self.write(&passages).await?;
        let index = self.index();
        for filter in deletion_filters(updates, change) {
            let task = self
                .retrying("delete documents", || async {
                    let mut query = DocumentDeletionQuery::new(&index);
                    query.with_filter(&filter);
                    index.delete_documents_with(&query).await
                })
                .await?;
            self.finished(&task).await??;
        }
        let upserts = updates.iter().filter(|u| u.document.is_some()).count();
        Ok(Written { upserts, deletes: updates.len() - upserts, passages: passages.len() })
    }

    /// A change made outside the documents topic (`lacuna ingest`, serve in process), as [`Self::apply`]
    /// with a `change` of its own: where it came from and when. The index must be open for writing.
    pub async fn apply_now(
        &self,
        updates: &[Update],
        passage_words: usize,
        source: &str,
    ) -> Result<Written, SearchError> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        self.apply(updates, passage_words, &format!("{source}-{nanos}")).await
    }

    /// A document's passages as the index holds them, in order, with its metadata; `None` when it has
    /// none.
    pub async fn document(
        &self,
        doc_id: &str,
    ) -> Result<Option<(Vec<Passage>, BTreeMap<String, String>)>, SearchError> {
        let index = self.index();
        let filter = of_documents(&[doc_id]);
        let mut query = meilisearch_sdk::documents::DocumentsQuery::new(&index);
        // A document of search.max_document_bytes in passages of a few words stays under this.
        query.with_filter(&filter).with_limit(100_000);
        let mut stored = self.retrying("read a document", || query.execute::<Stored>()).await?.results;
        if stored.is_empty() {
            return Ok(None);
        }
        let number = |id: &str| id.rsplit_once('#').and_then(|(_, n)| n.parse::<usize>().ok()).unwrap_or(0);
        stored.sort_by_key(|s| number(&s.id));
        let metadata = stored[0].metadata.clone();
        let passages = stored.into_iter().map(|s| Passage { id: s.id, title: s.title, text: s.text }).collect();
        Ok(Some((passages, metadata)))
    }

    /// Deletes every passage, for an index rebuilt from the topic's start.
    pub async fn clear(&self) -> Result<(), SearchError> {
        let index = self.index();
        let task = self.retrying("delete all documents", || index.delete_all_documents()).await?;
        self.finished(&task).await??;
        Ok(())
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

    /// Stores the offsets the index now holds, once their batch's tasks have succeeded.
    pub async fn store_applied(&self, applied: &Applied) -> Result<(), SearchError> {
        let index = self.applied_index();
        let document = [AppliedDocument { key: APPLIED_KEY.into(), applied: applied.clone() }];
        // Meilisearch creates the index, keyed by `key`, with its first document.
        let task =
            self.retrying("store the applied offsets", || index.add_or_replace(&document, Some(PRIMARY_KEY))).await?;
        self.finished(&task).await??;
        Ok(())
    }
}

/// The generation a search of an index that stored `applied` reads: at least what it names.
pub fn generation(index: &str, applied: &Applied) -> String {
    format!("meilisearch:{index}:applied={}", applied.next.values().sum::<i64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passage_ids_meilisearch_refuses_get_a_key_of_their_own() {
        assert_eq!(key_of("hotpotqa-000001"), "hotpotqa-000001", "an id Meilisearch takes is its own key");
        let numbered = key_of("kb-article#2");
        assert!(numbered.starts_with("sha256_") && valid_document_id(&numbered), "{numbered}");
        assert_ne!(numbered, key_of("kb-article#3"));
        assert_eq!(numbered, key_of("kb-article#2"), "the same id, the same key");
        let lookalike = key_of(&numbered);
        assert_ne!(lookalike, numbered, "an id that looks like a hashed key is hashed again");
        assert!(valid_document_id(&key_of(&"é".repeat(300))), "long and non-ASCII ids too");
    }

    #[test]
    fn a_batch_deletes_what_its_documents_replace_and_what_was_deleted() {
        let document =
            |id: &str| Document { id: id.into(), title: String::new(), text: "x".into(), metadata: BTreeMap::new() };
        let updates = vec![
            Update { doc_id: "a".into(), document: Some(document("a")) },
            Update { doc_id: "say \"b\"\\".into(), document: Some(document("say \"b\"\\")) },
            Update { doc_id: "c".into(), document: None },
        ];
        assert_eq!(
            deletion_filters(&updates, "0-7"),
            vec![r#"doc_id IN ["a", "say \"b\"\\"] AND change != "0-7""#.to_string(), r#"doc_id IN ["c"]"#.to_string(),]
        );
        assert!(deletion_filters(&updates[2..], "t").len() == 1 && deletion_filters(&[], "t").is_empty());
        let many: Vec<Update> = (0..1200).map(|n| Update { doc_id: format!("d{n}"), document: None }).collect();
        assert_eq!(deletion_filters(&many, "t").len(), 3, "500 documents a filter");
    }

    #[test]
    fn passages_are_stored_with_their_document_and_change() {
        let document =
            Document { id: "a".into(), title: "T".into(), text: vec!["w"; 150].join(" "), metadata: BTreeMap::new() };
        let stored: Vec<Stored> = document.passages(100).into_iter().map(|p| Stored::new(p, "a", "0-9")).collect();
        assert_eq!(stored.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["a#1", "a#2"]);
        assert!(stored.iter().all(|s| s.doc_id == "a" && s.change == "0-9" && s.key == key_of(&s.id)));
        let json = serde_json::to_value(&stored[0]).unwrap();
        assert_eq!(json["key"], key_of("a#1"));
        let applied = Applied { topic: "t".into(), next: BTreeMap::from([(0, 4), (1, 6)]) };
        let document = AppliedDocument { key: APPLIED_KEY.into(), applied: applied.clone() };
        let json = serde_json::to_value(&document).unwrap();
        assert_eq!(json, serde_json::json!({"key": "applied", "applied": {"topic": "t", "next": {"0": 4, "1": 6}}}));
        let read: AppliedDocument = serde_json::from_str(&json.to_string()).unwrap();
        assert_eq!(read.applied, applied, "as the SDK reads it");
        assert_eq!(generation("lacuna", &applied), "meilisearch:lacuna:applied=10");
    }
}
