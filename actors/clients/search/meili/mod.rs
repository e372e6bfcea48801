//! Meilisearch as the search backend (`search.backend = "meilisearch"`), for users who keep their
//! passages there, through Meilisearch's official client, `meilisearch-sdk`. The SDK builds every
//! request; what stays ours is the policy around it: a timeout on every call, retries with backoff on
//! what is worth retrying, and the mapping of its errors onto [`SearchError`], so a stage cannot tell
//! this backend from tantivy. This file holds the client and the shape of what Lacuna stores:
//! - `read`: searches, a passage by id, which documents the index holds, the generation it is at;
//! - `write`: the live corpus (`lacuna indexer`, `lacuna ingest`, serve) and `lacuna index`'s corpus.
//!
//! Every passage is stored as `{"key", "id", "doc_id", "title", "text", "change", "seq"}`, and the
//! document's `metadata` when it has any:
//! - `key` is the primary key. Meilisearch takes only letters, digits, `-` and `_` in one, and passage
//!   ids of split documents hold `#`, so an id it cannot take is stored under `sha256_<hex>` of itself
//!   ([`key_of`]); `id` keeps the passage id that searches return, with `title` and `text` searched.
//! - `doc_id`, `id` and `seq` are filterable. A live change numbers its entries with a `seq` that
//!   orders it among the document's changes: the indexer, its record's offset plus one
//!   ([`topic_seq`]: a document's changes sit in one partition, so offsets order them whatever the
//!   indexer's clock says); `lacuna ingest` and serve in process, which have no offset, their
//!   process's clock ([`next_seq`]: microseconds, strictly rising in the process, above
//!   [`CLOCK_SEQS`]), on an index no indexer keeps. It adds its passages under keys of their own
//!   ([`versioned_key`]), and then deletes its documents' passages of a lower `seq`. Two writes of one document that overlap (their tasks interleave as add, add,
//!   delete, delete) so leave the later version whole, never none: a deletion can only remove what is
//!   older than its own write, and no write replaces another's passages. A search never finds a
//!   document absent between two versions; it may find both for a moment, and reads keep one passage
//!   per id and, for a document, the newest version (`change` says where it came from).
//! - `lacuna index` writes a corpus file under the passage ids themselves, at `seq` 0: indexing it again
//!   replaces it in place, and any live change of one of its documents supersedes it.
//!
//! The changelog offsets the index holds are stored beside it, in the index `<index>-applied`, after
//! each batch's tasks have succeeded. A batch applied again after a crash changes nothing.

mod read;
mod write;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use meilisearch_sdk::client::Client;
use meilisearch_sdk::errors::{Error as SdkError, ErrorCode, ErrorType, MeilisearchError};
use meilisearch_sdk::indexes::Index;
use meilisearch_sdk::task_info::TaskInfo;
use meilisearch_sdk::tasks::Task;
use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};

pub use write::{CLOCK_SEQS, IndexReport, Update, Written, topic_seq};

use super::SearchError;
use super::changes::Applied;
use crate::config::MeiliSettings;
use crate::topics::Passage;
use crate::topics::provenance::hex;

/// The attributes a Lacuna index stores, searches (all but the id) and returns.
const FIELDS: [&str; 3] = ["id", "title", "text"];
const SEARCHED: [&str; 2] = ["title", "text"];

/// The primary key of every index Lacuna writes.
pub const PRIMARY_KEY: &str = "key";

/// The Meilisearch document id of a passage: its own id where Meilisearch takes it, otherwise
/// `sha256_` and the hex digest of it (never an id Meilisearch would take as written, so the two
/// cannot meet).
pub fn key_of(passage_id: &str) -> String {
    if valid_document_id(passage_id) && !passage_id.starts_with("sha256_") {
        return passage_id.to_string();
    }
    format!("sha256_{}", hex(&Sha256::digest(passage_id.as_bytes())))
}

/// The key of a passage a live change writes: its id and the change's `seq`, hashed (a NUL is never in
/// a key Meilisearch takes, so this never meets [`key_of`] a passage id). Each write has keys of its
/// own, so an older write that lands late replaces nothing of a newer one.
pub fn versioned_key(passage_id: &str, seq: u64) -> String {
    key_of(&format!("{passage_id}\u{0}{seq}"))
}

/// The `seq` of a change made in process (no offset): microseconds since the epoch (a filter compares
/// numbers as f64, exact to 2^53, about 285 years of them), strictly above every seq this process
/// gave before, so that two changes in one microsecond still have an order. Writers in other
/// processes are ordered by their clocks; two of them in the same microsecond would leave both
/// versions until the next write. Changes from the documents topic are numbered by offset instead.
pub fn next_seq() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_micros() as u64;
    let previous = LAST.fetch_max(now, Ordering::SeqCst);
    if previous < now { now } else { LAST.fetch_add(1, Ordering::SeqCst) + 1 }
}

/// A passage as Lacuna writes it. Passages written before `seq` existed read as 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    pub key: String,
    pub id: String,
    pub doc_id: String,
    pub title: String,
    pub text: String,
    pub change: String,
    #[serde(default)]
    pub seq: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// A deletion's marker, not a passage: it keeps the deletion's `seq` in the index, so that a
    /// change numbered before it whose additions land after it (a slow upload) finds it and removes
    /// them. The document's next write deletes it with the rest of what is older.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

impl Stored {
    /// A passage of a corpus file, under its own id, at seq 0.
    pub fn new(passage: Passage, doc_id: &str, change: &str) -> Stored {
        Stored {
            key: key_of(&passage.id),
            id: passage.id,
            doc_id: doc_id.to_string(),
            title: passage.title,
            text: passage.text,
            change: change.to_string(),
            seq: 0,
            metadata: BTreeMap::new(),
            deleted: false,
        }
    }

    /// The marker of `doc_id`'s deletion numbered `seq`: no words, so no search finds it.
    pub fn deletion(doc_id: &str, change: &str, seq: u64) -> Stored {
        let passage = Passage { id: format!("{doc_id}#deleted"), title: String::new(), text: String::new() };
        Stored { deleted: true, ..Stored::versioned(passage, doc_id, change, seq) }
    }

    /// A passage of a live change numbered `seq`, under a key of its own.
    pub fn versioned(passage: Passage, doc_id: &str, change: &str, seq: u64) -> Stored {
        Stored { key: versioned_key(&passage.id, seq), seq, ..Stored::new(passage, doc_id, change) }
    }
}

/// Of stored entries read with their `doc_id`, `seq` and `deleted` fields: each document's newest
/// `seq`, and whether that entry is a deletion's marker.
pub(super) fn newest_by_document(found: &[serde_json::Value]) -> BTreeMap<String, (u64, bool)> {
    let mut newest: BTreeMap<String, (u64, bool)> = BTreeMap::new();
    for stored in found {
        let Some(doc_id) = stored["doc_id"].as_str() else { continue };
        let entry = (stored["seq"].as_u64().unwrap_or(0), stored["deleted"].as_bool().unwrap_or(false));
        let held = newest.entry(doc_id.to_string()).or_insert(entry);
        if entry.0 > held.0 {
            *held = entry;
        }
    }
    newest
}

/// Meilisearch accepts document ids of letters, digits, `-` and `_`, at most 511 bytes.
pub fn valid_document_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 511 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A passage as a search of Meilisearch returns it: a hit. Ids written by other tools may be
/// numbers; they come back as strings, and a missing title or text as empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeiliHit {
    #[serde(deserialize_with = "id_as_string")]
    pub id: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub title: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub text: String,
}

impl From<Stored> for Passage {
    fn from(stored: Stored) -> Passage {
        Passage { id: stored.id, title: stored.title, text: stored.text }
    }
}

impl From<MeiliHit> for Passage {
    fn from(document: MeiliHit) -> Passage {
        Passage { id: document.id, title: document.title, text: document.text }
    }
}

fn id_as_string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::String(id) => Ok(id),
        serde_json::Value::Number(id) => Ok(id.to_string()),
        other => Err(serde::de::Error::custom(format!("a document id must be a string or a number, not {other}"))),
    }
}

fn null_as_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.unwrap_or_default())
}

/// The offsets document in `<index>-applied` (nested, not flattened: serde reads a flattened map's
/// keys only as strings).
#[derive(Serialize, Deserialize)]
struct AppliedDocument {
    key: String,
    applied: Applied,
}

const APPLIED_KEY: &str = "applied";

/// A string as a Meilisearch filter value: double-quoted, with `"` and `\` escaped.
fn quoted(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The filter for the passages of these documents: `doc_id IN [...]`.
fn of_documents<S: AsRef<str>>(doc_ids: &[S]) -> String {
    let ids: Vec<String> = doc_ids.iter().map(|id| quoted(id.as_ref())).collect();
    format!("doc_id IN [{}]", ids.join(", "))
}

/// The generation a search of an index that stored `applied` reads: at least what it names.
pub fn applied_generation(index: &str, applied: &Applied) -> String {
    format!("meilisearch:{index}:applied={}", applied.next.values().sum::<i64>())
}

#[derive(Clone)]
pub struct MeiliSearch {
    pub(super) client: Client,
    pub(super) settings: Arc<MeiliSettings>,
    /// The last generation read, and when (`generation`).
    generation_cache: Arc<std::sync::Mutex<Option<(tokio::time::Instant, Option<String>)>>>,
}

/// How long a generation read from the server is reused: about the indexer's batch interval.
const GENERATION_FOR: Duration = Duration::from_secs(1);

/// A finished task's outcome: a failed or canceled task is an error carrying Meilisearch's message and
/// code; one still enqueued or processing is not finished (the SDK waits until it is, or times out).
pub fn task_outcome(task: Task) -> Result<(), TaskFailure> {
    match task {
        Task::Succeeded { .. } => Ok(()),
        Task::Failed { content } => Err(TaskFailure { uid: content.task.uid, error: Some(content.error) }),
        Task::Enqueued { .. } | Task::Processing { .. } => Err(TaskFailure { uid: task.get_uid(), error: None }),
    }
}

/// A task that did not succeed: Meilisearch's error, or none when it never finished.
#[derive(Debug)]
pub struct TaskFailure {
    uid: u32,
    error: Option<MeilisearchError>,
}

impl TaskFailure {
    pub(super) fn is(&self, code: ErrorCode) -> bool {
        self.error.as_ref().is_some_and(|error| error.error_code == code)
    }
}

impl From<TaskFailure> for SearchError {
    fn from(failure: TaskFailure) -> SearchError {
        let message = match failure.error {
            Some(error) => {
                format!("Meilisearch task {} failed: {} ({})", failure.uid, error.error_message, error.error_code)
            }
            None => format!("Meilisearch task {} did not finish", failure.uid),
        };
        SearchError::Remote { message, transient: false }
    }
}

/// The SDK's errors as ours. What a retry may cure is transient: no connection, a timeout, 429, a
/// server-side failure (5xx, Meilisearch's `internal` and `system` errors). A bad request, a bad key or
/// a failed task is not, and a missing index is named with what to do.
pub fn search_error(error: SdkError, settings: &MeiliSettings) -> SearchError {
    let remote = |message: String, transient| SearchError::Remote { message, transient };
    match error {
        SdkError::Meilisearch(error) if error.error_code == ErrorCode::IndexNotFound => {
            SearchError::MissingRemoteIndex { index: settings.index.clone(), url: settings.url.clone() }
        }
        SdkError::Meilisearch(error) => {
            let transient = !matches!(error.error_type, ErrorType::InvalidRequest | ErrorType::Auth);
            remote(
                format!("Meilisearch answered {} ({}): {}", error.error_type, error.error_code, error.error_message),
                transient,
            )
        }
        SdkError::MeilisearchCommunication(error) => {
            let status = error.status_code;
            let message = error.message.unwrap_or_default();
            remote(format!("Meilisearch answered HTTP {status}: {message}"), status >= 500 || status == 429)
        }
        SdkError::HttpError(error) => {
            remote(format!("Meilisearch at {} unreachable: {error}", settings.url), !error.is_builder())
        }
        SdkError::Timeout => remote(
            format!(
                "a Meilisearch task was not done after search.meilisearch.task_timeout_ms ({} ms)",
                settings.task_timeout_ms
            ),
            false,
        ),
        SdkError::ParseError(error) => remote(format!("unexpected Meilisearch response: {error}"), false),
        other => remote(format!("Meilisearch client error: {other}"), false),
    }
}

/// The API key read from the environment variable the config names (`None` when unset or empty). The
/// key itself is never shown, and one an HTTP header cannot carry is refused here rather than left to
/// the client.
fn api_key(variable: &str, value: Option<String>) -> Result<Option<String>, SearchError> {
    let Some(key) = value.filter(|key| !key.is_empty()) else { return Ok(None) };
    if !key.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(SearchError::Remote {
            message: format!("the Meilisearch API key in ${variable} holds characters an HTTP header cannot carry"),
            transient: false,
        });
    }
    Ok(Some(key))
}

impl MeiliSearch {
    pub fn new(settings: MeiliSettings) -> Result<Self, SearchError> {
        let key = api_key(&settings.api_key_env, std::env::var(&settings.api_key_env).ok())?;
        let client =
            Client::new(settings.url.trim_end_matches('/'), key).map_err(|error| search_error(error, &settings))?;
        Ok(MeiliSearch { client, settings: Arc::new(settings), generation_cache: Default::default() })
    }

    fn index(&self) -> Index {
        self.client.index(&self.settings.index)
    }

    /// One SDK call under `timeout_ms`, retried with jittered backoff while it fails transiently, up to
    /// `max_retries` times. A call is safe to repeat: searches read, and uploads replace by id.
    pub(super) async fn retrying<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T, SearchError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, SdkError>>,
    {
        let timeout = Duration::from_millis(self.settings.timeout_ms);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = match tokio::time::timeout(timeout, call()).await {
                Ok(outcome) => outcome.map_err(|error| search_error(error, &self.settings)),
                Err(_) => Err(SearchError::Remote {
                    message: format!(
                        "Meilisearch at {} did not answer ({what}) within {} ms",
                        self.settings.url, self.settings.timeout_ms
                    ),
                    transient: true,
                }),
            };
            match outcome {
                Err(SearchError::Remote { transient: true, message }) if attempt <= self.settings.max_retries => {
                    let backoff = crate::actors::clients::backoff(self.settings.retry_backoff_ms, attempt);
                    tracing::warn!(attempt, backoff_ms = backoff.as_millis() as u64, error = %message, "Meilisearch call failed ({what}), retrying");
                    tokio::time::sleep(backoff).await;
                }
                outcome => return outcome,
            }
        }
    }

    fn applied_index(&self) -> meilisearch_sdk::indexes::Index {
        self.client.index(format!("{}-applied", self.settings.index))
    }

    /// Waits for an enqueued task to end, up to `task_timeout_ms` in all; its failure is the caller's
    /// to judge. Each look at the task is one request under `timeout_ms`, retried while the server does
    /// not answer; a task still processing is looked at again, never taken for a failed request (its
    /// batch would be uploaded again, adding a task to the queue being waited on).
    pub(super) async fn finished(&self, enqueued: &TaskInfo) -> Result<Result<(), TaskFailure>, SearchError> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.settings.task_timeout_ms);
        let mut pause = Duration::from_millis(50);
        loop {
            let task = self.retrying("read a task", || self.client.get_task(enqueued)).await?;
            if matches!(task, Task::Succeeded { .. } | Task::Failed { .. }) {
                return Ok(task_outcome(task));
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Err(search_error(SdkError::Timeout, &self.settings));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use meilisearch_sdk::search::SearchResult;

    use super::read::{passages, search_query};
    use super::write::read_corpus;
    use super::*;
    use crate::config::MatchingStrategy;
    use crate::config::Settings;

    fn settings() -> MeiliSettings {
        let mut settings = Settings::defaults().search.meilisearch;
        settings.url = "http://127.0.0.1:7700".into();
        settings.index = "hotpot".into();
        settings
    }

    fn sdk_error(body: serde_json::Value) -> SdkError {
        SdkError::Meilisearch(serde_json::from_value(body).unwrap())
    }

    #[test]
    fn the_sdk_sends_a_search_for_ranking_scores_and_the_passage_fields() {
        let client = Client::new("http://127.0.0.1:7700", None::<String>).unwrap();
        let index = client.index("hotpot");
        let body = serde_json::to_value(search_query(&index, "Who directed Levity?", 50, MatchingStrategy::Frequency))
            .unwrap();
        assert_eq!(body["q"], "Who directed Levity?");
        assert_eq!(body["limit"], 50);
        assert_eq!(body["showRankingScore"], true);
        assert_eq!(body["attributesToRetrieve"], json!(["id", "title", "text"]));
        assert_eq!(body["matchingStrategy"], "frequency");
        let body = |limit, strategy| serde_json::to_value(search_query(&index, "q", limit, strategy)).unwrap();
        assert_eq!(body(0, MatchingStrategy::Last)["limit"], 1, "a zero limit still asks for one hit");
        assert_eq!(body(5, MatchingStrategy::Last)["matchingStrategy"], "last");
        assert_eq!(body(5, MatchingStrategy::All)["matchingStrategy"], "all");
    }

    #[test]
    fn hits_map_to_passages_with_their_ranking_scores() {
        let body = json!([
            {"id": "p1", "title": "Levity", "text": "Levity is a 2003 film.", "_rankingScore": 0.93},
            {"id": 7, "title": null, "text": "An American writer.", "_rankingScore": 0.5},
        ]);
        let hits = passages(serde_json::from_value(body).unwrap()).unwrap();
        assert_eq!(hits.len(), 2);
        assert_eq!(
            hits[0].0,
            Passage { id: "p1".into(), title: "Levity".into(), text: "Levity is a 2003 film.".into() }
        );
        assert!((hits[0].1 - 0.93).abs() < 1e-6);
        assert_eq!((hits[1].0.id.as_str(), hits[1].0.title.as_str()), ("7", ""), "numeric ids come back as strings");
        let unscored = serde_json::from_value(json!([{"id": "p1", "text": "x"}])).unwrap();
        assert!(passages(unscored).is_err(), "a hit without a score is an error");
        assert!(serde_json::from_value::<Vec<SearchResult<MeiliHit>>>(json!([{"id": [1]}])).is_err());
    }

    #[test]
    fn task_failures_carry_their_message_and_code() {
        let task = |status: &str| {
            let mut task = json!({"uid": 3, "indexUid": "hotpot", "status": status, "type": "documentAdditionOrUpdate",
                "enqueuedAt": "2026-11-24T10:00:00Z", "startedAt": "2026-11-24T10:00:01Z",
                "finishedAt": "2026-11-24T10:00:02Z", "duration": "PT1S"});
            if status == "failed" {
                task["error"] = json!({"message": "Document identifier `a:b` is invalid.",
                    "code": "invalid_document_id", "type": "invalid_request", "link": "https://docs.meilisearch.com"});
            }
            serde_json::from_value::<Task>(task).unwrap()
        };
        assert!(task_outcome(task("succeeded")).is_ok());
        let failure = task_outcome(task("failed")).unwrap_err();
        assert!(!failure.is(ErrorCode::IndexAlreadyExists));
        let error = SearchError::from(failure).to_string();
        assert!(error.contains("task 3 failed") && error.contains("invalid_document_id"), "{error}");
        assert!(!SearchError::from(task_outcome(task("failed")).unwrap_err()).is_transient());
    }

    #[test]
    fn a_missing_index_is_named_and_server_errors_are_retryable() {
        let missing = sdk_error(json!({"message": "Index `hotpot` not found.", "code": "index_not_found",
            "type": "invalid_request", "link": "https://docs.meilisearch.com"}));
        let error = search_error(missing, &settings());
        assert!(matches!(&error, SearchError::MissingRemoteIndex { index, .. } if index == "hotpot"));
        assert!(error.to_string().contains("lacuna index --backend meilisearch"), "{error}");

        let internal = sdk_error(json!({"message": "boom", "code": "internal", "type": "internal", "link": ""}));
        assert!(search_error(internal, &settings()).is_transient());
        // Meilisearch's `system` errors (too many search requests, no space left) are unknown to the SDK.
        let busy = sdk_error(json!({"message": "Too many search requests running at the same time: 1000.",
            "code": "too_many_search_requests", "type": "system", "link": ""}));
        assert!(search_error(busy, &settings()).is_transient());
        let bad =
            sdk_error(json!({"message": "bad q", "code": "invalid_search_q", "type": "invalid_request", "link": ""}));
        assert!(!search_error(bad, &settings()).is_transient());
        let key = sdk_error(json!({"message": "The provided API key is invalid.", "code": "invalid_api_key",
            "type": "auth", "link": ""}));
        let error = search_error(key, &settings());
        assert!(!error.is_transient() && error.to_string().contains("API key is invalid"), "{error}");

        let proxy = |status_code| {
            SdkError::MeilisearchCommunication(meilisearch_sdk::errors::MeilisearchCommunicationError {
                status_code,
                message: None,
                url: "http://127.0.0.1:7700/indexes/hotpot/search".into(),
            })
        };
        assert!(search_error(proxy(503), &settings()).is_transient());
        assert!(search_error(proxy(429), &settings()).is_transient());
        assert!(!search_error(proxy(404), &settings()).is_transient());
        assert!(!search_error(SdkError::Timeout, &settings()).is_transient(), "a task past its timeout is not retried");
    }

    #[test]
    fn an_api_key_a_header_cannot_carry_is_refused_without_showing_it() {
        let error = api_key("MEILI_MASTER_KEY", Some("secret\nkey".into())).unwrap_err().to_string();
        assert!(error.contains("MEILI_MASTER_KEY") && !error.contains("secret"), "{error}");
        assert_eq!(api_key("MEILI_MASTER_KEY", Some("a-good-key".into())).unwrap().as_deref(), Some("a-good-key"));
        assert_eq!(api_key("MEILI_MASTER_KEY", Some(String::new())).unwrap(), None, "an empty key is no key");
        assert_eq!(api_key("MEILI_MASTER_KEY", None).unwrap(), None);
    }

    #[test]
    fn a_corpus_with_ids_meilisearch_refuses_is_stored_under_keys_of_their_own() {
        assert!(valid_document_id("hotpotqa-000001") && valid_document_id("a_b"));
        assert!(!valid_document_id("a:b") && !valid_document_id("") && !valid_document_id(&"x".repeat(512)));
        let dir = std::env::temp_dir().join(format!("lacuna-meili-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let corpus = dir.join("corpus.jsonl");
        std::fs::write(
            &corpus,
            "{\"id\": \"p1\", \"title\": \"T\", \"text\": \"x\"}\n\n{\"id\": \"bad id\", \"text\": \"y\"}\n",
        )
        .unwrap();
        let passages = read_corpus(&corpus).unwrap();
        assert_eq!(
            passages.iter().map(|p| (p.id.as_str(), p.doc_id.as_str())).collect::<Vec<_>>(),
            [("p1", "p1"), ("bad id", "bad id")]
        );
        assert_eq!(passages[0].key, "p1");
        assert!(passages[1].key.starts_with("sha256_") && valid_document_id(&passages[1].key));
        std::fs::write(&corpus, "{\"id\": \"p1\", \"text\": \"x\"}\nnot json\n").unwrap();
        let error = read_corpus(&corpus).unwrap_err().to_string();
        assert!(error.contains("line 2"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }

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
}
