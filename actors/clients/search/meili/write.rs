//! Writing a Meilisearch index as the live corpus: the documents `lacuna indexer` applies from the
//! documents topic, `lacuna ingest` and serve's document routes in process, and `lacuna index
//! --backend meilisearch`'s corpus. How passages are stored is in `mod.rs`.

use std::collections::BTreeMap;
use std::path::Path;

use meilisearch_sdk::documents::DocumentDeletionQuery;
use meilisearch_sdk::errors::ErrorCode;
use meilisearch_sdk::settings::Settings as IndexSettings;

use super::{
    APPLIED_KEY, AppliedDocument, FIELDS, MeiliSearch, PRIMARY_KEY, SEARCHED, Stored, newest_by_document, next_seq,
    of_documents,
};
use crate::actors::clients::search::changes::Applied;
use crate::actors::clients::search::documents::{Document, passage_number};
use crate::actors::clients::search::{SearchError, for_each_passage};
use crate::topics::Passage;

/// Documents named in one deletion filter.
const IDS_PER_FILTER: usize = 500;

/// What an upload of a corpus did.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexReport {
    pub documents: usize,
    pub batches: usize,
}

/// One document's latest change in a batch: its new version, or `None` to delete it.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub doc_id: String,
    pub document: Option<Document>,
}

/// `passages` in runs of at most `count` passages and `bytes` bytes of JSON; a passage larger than
/// `bytes` goes alone.
fn batches(passages: &[Stored], count: usize, bytes: usize) -> Vec<&[Stored]> {
    let (mut out, mut start, mut size) = (Vec::new(), 0, 0);
    for (i, passage) in passages.iter().enumerate() {
        let own = serde_json::to_vec(passage).map_or(0, |json| json.len()) + 1;
        if i > start && (i - start >= count.max(1) || size + own > bytes) {
            out.push(&passages[start..i]);
            (start, size) = (i, 0);
        }
        size += own;
    }
    if start < passages.len() {
        out.push(&passages[start..]);
    }
    out
}

/// Settings of an index Lacuna writes: what is searched, what comes back, and the attributes that
/// deletions filter on.
fn writable_settings() -> IndexSettings {
    IndexSettings::new()
        .with_searchable_attributes(SEARCHED)
        .with_displayed_attributes(FIELDS)
        .with_filterable_attributes(["doc_id", "id", "seq"])
}

/// The deletions that follow a batch's additions, each document's change numbered as in
/// `numbered`: its entries numbered before that change (upserted documents keep only the new
/// version, deleted ones their marker), and those written before entries had a `seq`. A newer
/// change's entries are never among them. Documents of one number share a clause; at most a few
/// hundred documents a filter.
pub fn deletion_filters(numbered: &[(u64, Update)]) -> Vec<String> {
    numbered
        .chunks(IDS_PER_FILTER)
        .map(|chunk| {
            let mut by_seq: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
            for (seq, update) in chunk {
                by_seq.entry(*seq).or_default().push(&update.doc_id);
            }
            let clause =
                |(seq, ids): (&u64, &Vec<&str>)| format!("{} AND (seq < {seq} OR seq NOT EXISTS)", of_documents(ids));
            match by_seq.len() {
                1 => by_seq.iter().map(clause).collect(),
                _ => by_seq.iter().map(|entry| format!("({})", clause(entry))).collect::<Vec<_>>().join(" OR "),
            }
        })
        .collect()
}

/// The `seq` of a change read from the documents topic: its offset, plus one (0 is a corpus file's).
/// A document's changes all sit in the partition its key hashes to, so their offsets order them
/// exactly, whichever indexer applies them and whatever its clock says; only a change of the
/// topic's partition count moves a key (docs/corpus.md).
pub fn topic_seq(offset: i64) -> u64 {
    offset.max(0) as u64 + 1
}

/// The numbers an in-process writer's clock gives ([`next_seq`]: microseconds since the epoch) start
/// above this; a topic's offsets stay below it. An index holding such numbers was written in
/// process, or by an indexer before offsets numbered its changes.
pub const CLOCK_SEQS: u64 = 1_000_000_000_000;

/// What a batch wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Written {
    pub upserts: usize,
    pub deletes: usize,
    pub passages: usize,
}

impl MeiliSearch {
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

    /// Writes passages, at most `batch_size` and `max_batch_bytes` to a task, and waits for every task.
    pub async fn write(&self, passages: &[Stored]) -> Result<(), SearchError> {
        let index = self.index();
        for batch in batches(passages, self.settings.batch_size, self.settings.max_batch_bytes) {
            let task = self.retrying("upload documents", || index.add_or_replace(batch, Some(PRIMARY_KEY))).await?;
            self.finished(&task).await??;
        }
        Ok(())
    }

    /// Applies a batch of document changes (one per document), each numbered as it is paired
    /// (`seq`, see `mod.rs`), split into passages of at most `passage_words` words and tagged `change`:
    /// additions first, then the deletions of what they replace and of deleted documents, then
    /// whatever a newer change of theirs that landed first makes older ([`Self::give_way`]). Returns
    /// once Meilisearch has done every task. A batch applied again changes nothing.
    pub async fn apply_at(
        &self,
        numbered: &[(u64, Update)],
        passage_words: usize,
        change: &str,
    ) -> Result<Written, SearchError> {
        let mut passages = Vec::new();
        for (seq, update) in numbered {
            match &update.document {
                Some(document) => passages.extend(document.passages(passage_words).into_iter().map(|p| Stored {
                    metadata: document.metadata.clone(),
                    ..Stored::versioned(p, &update.doc_id, change, *seq)
                })),
                None => passages.push(Stored::deletion(&update.doc_id, change, *seq)),
            }
        }
        self.write(&passages).await?;
        for filter in deletion_filters(numbered) {
            self.delete_where(&filter).await?;
        }
        self.give_way(numbered).await?;
        let upserts = numbered.iter().filter(|(_, u)| u.document.is_some()).count();
        let markers = numbered.len() - upserts;
        Ok(Written { upserts, deletes: markers, passages: passages.len() - markers })
    }

    /// Deletes the passages `filter` matches, and waits for it.
    async fn delete_where(&self, filter: &str) -> Result<(), SearchError> {
        let index = self.index();
        let task = self
            .retrying("delete documents", || async {
                let mut query = DocumentDeletionQuery::new(&index);
                query.with_filter(filter);
                index.delete_documents_with(&query).await
            })
            .await?;
        self.finished(&task).await??;
        Ok(())
    }

    /// After a batch is applied: of its documents, those a newer change wrote or deleted meanwhile
    /// lose what is older than that change. Meilisearch runs tasks in order, so a newer change whose
    /// deletion ran before this one's additions landed has its passages or its deletion marker in
    /// the index by now, and one whose deletion runs later removes them itself.
    async fn give_way(&self, numbered: &[(u64, Update)]) -> Result<(), SearchError> {
        let index = self.index();
        let mut newest: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for chunk in numbered.chunks(IDS_PER_FILTER) {
            let ids: Vec<&str> = chunk.iter().map(|(_, u)| u.doc_id.as_str()).collect();
            let lowest = chunk.iter().map(|(seq, _)| *seq).min().unwrap_or(0);
            let filter = format!("{} AND seq > {lowest}", of_documents(&ids));
            let mut query = meilisearch_sdk::documents::DocumentsQuery::new(&index);
            query.with_filter(&filter).with_fields(["doc_id", "seq"]).with_limit(100_000);
            let found = self.retrying("find newer changes", || query.execute::<serde_json::Value>()).await?;
            let held = newest_by_document(&found.results);
            for (seq, update) in chunk {
                if let Some(&(newer, _)) = held.get(&update.doc_id).filter(|(newer, _)| newer > seq) {
                    newest.insert(update.doc_id.clone(), (*seq, newer));
                }
            }
        }
        for (doc_id, (seq, newer)) in newest {
            tracing::info!(doc_id, seq, newer, "a newer change of the document came first: this one's passages go");
            self.delete_where(&format!("{} AND (seq < {newer} OR seq NOT EXISTS)", of_documents(&[&doc_id]))).await?;
        }
        Ok(())
    }

    /// A change made outside the documents topic (`lacuna ingest`, serve in process), numbered by
    /// this process's clock ([`next_seq`]) and tagged with where it came from and when. The index
    /// must be open for writing, and not be one an indexer keeps as a copy of the documents topic:
    /// there, offsets number changes, and a clock's numbers would outrank every one of them.
    pub async fn apply_now(
        &self,
        updates: &[Update],
        passage_words: usize,
        source: &str,
    ) -> Result<Written, SearchError> {
        if self.applied().await?.is_some() {
            return Err(SearchError::Refused(format!(
                "Meilisearch index {:?} is a copy of the documents topic (`lacuna indexer` keeps it): publish \
                 changes to the topic (`lacuna ingest --transport kafka`, or serve on Kafka) instead",
                self.settings.index
            )));
        }
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let seq = next_seq();
        let numbered: Vec<(u64, Update)> = updates.iter().map(|u| (seq, u.clone())).collect();
        self.apply_at(&numbered, passage_words, &format!("{source}-{nanos}")).await
    }

    /// Whether the index holds an entry numbered by a clock ([`CLOCK_SEQS`]).
    pub async fn clock_numbered(&self) -> Result<bool, SearchError> {
        let index = self.index();
        let filter = format!("seq >= {CLOCK_SEQS}");
        let mut query = meilisearch_sdk::documents::DocumentsQuery::new(&index);
        query.with_filter(&filter).with_fields(["seq"]).with_limit(1);
        let found =
            self.retrying("look for entries numbered by a clock", || query.execute::<serde_json::Value>()).await?;
        Ok(!found.results.is_empty())
    }

    /// A document's passages as the index holds them, in order, with its metadata; `None` when it has
    /// none. Of two versions held for a moment (a write between its addition and its deletion), the
    /// newest.
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
        let Some(newest) = stored.iter().map(|s| s.seq).max() else { return Ok(None) };
        stored.retain(|s| s.seq == newest);
        if stored.iter().any(|s| s.deleted) {
            return Ok(None);
        }
        stored.sort_by_key(|s| passage_number(&s.id));
        let metadata = stored[0].metadata.clone();
        let passages = stored.into_iter().map(Passage::from).collect();
        Ok(Some((passages, metadata)))
    }

    /// Deletes every passage, for an index rebuilt from the topic's start.
    pub async fn clear(&self) -> Result<(), SearchError> {
        let index = self.index();
        let task = self.retrying("delete all documents", || index.delete_all_documents()).await?;
        self.finished(&task).await??;
        Ok(())
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

    /// Creates the index if it does not exist, sets its attributes, and uploads the corpus in batches
    /// of `batch_size`, waiting for every task. Passages replace those with the same id, so
    /// re-indexing the same corpus leaves the index as it was.
    pub async fn build(&self, corpus: &Path) -> Result<IndexReport, SearchError> {
        let passages = read_corpus(corpus)?;
        self.open_for_writing().await?;
        self.write(&passages).await?;
        let batches = passages.len().div_ceil(self.settings.batch_size.max(1));
        Ok(IndexReport { documents: passages.len(), batches })
    }
}

/// The corpus's passages as Lacuna stores them, each its own document.
pub fn read_corpus(corpus: &Path) -> Result<Vec<Stored>, SearchError> {
    let mut passages = Vec::new();
    for_each_passage(corpus, |_, passage| {
        let doc_id = passage.id.clone();
        passages.push(Stored::new(passage, &doc_id, CORPUS_CHANGE));
        Ok(())
    })?;
    Ok(passages)
}

/// The `change` of passages written from a corpus file.
const CORPUS_CHANGE: &str = "corpus";

#[cfg(test)]
mod tests {
    use super::super::{applied_generation, key_of, valid_document_id, versioned_key};
    use super::*;

    #[test]
    fn a_batch_deletes_what_its_documents_replace_and_what_was_deleted() {
        let document =
            |id: &str| Document { id: id.into(), title: String::new(), text: "x".into(), metadata: BTreeMap::new() };
        let updates = vec![
            Update { doc_id: "a".into(), document: Some(document("a")) },
            Update { doc_id: "say \"b\"\\".into(), document: Some(document("say \"b\"\\")) },
            Update { doc_id: "c".into(), document: None },
        ];
        let at = |seq: u64| updates.iter().map(|u| (seq, u.clone())).collect::<Vec<_>>();
        assert_eq!(
            deletion_filters(&at(7)),
            vec![r#"doc_id IN ["a", "say \"b\"\\", "c"] AND (seq < 7 OR seq NOT EXISTS)"#.to_string()]
        );
        // Changes from the topic: each document at its own offset.
        let numbered = vec![(5, updates[0].clone()), (9, updates[2].clone()), (5, updates[1].clone())];
        assert_eq!(
            deletion_filters(&numbered),
            vec![
                r#"(doc_id IN ["a", "say \"b\"\\"] AND (seq < 5 OR seq NOT EXISTS)) OR (doc_id IN ["c"] AND (seq < 9 OR seq NOT EXISTS))"#
                    .to_string()
            ]
        );
        assert!(deletion_filters(&[]).is_empty());
        let many: Vec<(u64, Update)> =
            (0..1200).map(|n| (n, Update { doc_id: format!("d{n}"), document: None })).collect();
        assert_eq!(deletion_filters(&many).len(), 3, "500 documents a filter");
        assert!(topic_seq(0) == 1 && topic_seq(1_000_000) < CLOCK_SEQS && CLOCK_SEQS < next_seq());
    }

    #[test]
    fn passages_are_stored_with_their_document_and_change() {
        let document =
            Document { id: "a".into(), title: "T".into(), text: vec!["w"; 150].join(" "), metadata: BTreeMap::new() };
        let stored: Vec<Stored> = document.passages(100).into_iter().map(|p| Stored::new(p, "a", "0-9")).collect();
        assert_eq!(stored.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["a#1", "a#2"]);
        assert!(stored.iter().all(|s| s.doc_id == "a" && s.change == "0-9" && s.key == key_of(&s.id)));
        let json = serde_json::to_value(&stored[0]).unwrap();
        assert_eq!((&json["key"], &json["seq"]), (&serde_json::json!(key_of("a#1")), &serde_json::json!(0)));
        let mut older = json.clone();
        older.as_object_mut().unwrap().remove("seq");
        assert_eq!(serde_json::from_value::<Stored>(older).unwrap().seq, 0, "passages written before seq read as 0");

        let (first, second) = (next_seq(), next_seq());
        assert!(second > first, "strictly rising");
        let live = |seq| Stored::versioned(document.passages(100).remove(0), "a", "serve-1", seq);
        assert_eq!((live(first).id.as_str(), live(first).seq), ("a#1", first));
        assert!(valid_document_id(&live(first).key) && live(first).key == versioned_key("a#1", first));
        assert!(live(first).key != live(second).key && live(first).key != key_of("a#1"), "a key of its own");
        let applied = Applied {
            topic: "t".into(),
            next: BTreeMap::from([(0, 4), (1, 6)]),
            caught_up_at_ms: None,
            identity: None,
        };
        let document = AppliedDocument { key: APPLIED_KEY.into(), applied: applied.clone() };
        let json = serde_json::to_value(&document).unwrap();
        assert_eq!(json, serde_json::json!({"key": "applied", "applied": {"topic": "t", "next": {"0": 4, "1": 6}}}));
        let read: AppliedDocument = serde_json::from_str(&json.to_string()).unwrap();
        assert_eq!(read.applied, applied, "as the SDK reads it");
        assert_eq!(applied_generation("lacuna", &applied), "meilisearch:lacuna:applied=10");
    }
}
