//! Passage retrieval from a Meilisearch server (`search.backend = "meilisearch"`), for users who keep
//! their passages there. Its REST API is small, so this speaks it with the HTTP client Lacuna already
//! has rather than pulling in an SDK: the requests are built and the responses mapped by the plain
//! functions below, which the unit tests check without a server.
//!
//! Documents are `{"id", "title", "text"}` with `id` the primary key; `title` and `text` are the
//! searchable attributes. Hits come back with Meilisearch's `_rankingScore` (0 to 1) as their score.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{SearchError, corpus_error, for_each_passage};
use crate::settings::{MatchingStrategy, MeiliSettings};
use crate::topics::Passage;

#[derive(Clone)]
pub struct MeiliSearch {
    http: reqwest::Client,
    settings: Arc<MeiliSettings>,
    api_key: Option<String>,
}

/// What an upload of a corpus did.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexReport {
    pub documents: usize,
    pub batches: usize,
}

/// The body of a search request.
pub fn search_request(query: &str, limit: usize, strategy: MatchingStrategy) -> Value {
    json!({
        "q": query,
        "limit": limit.max(1),
        "matchingStrategy": strategy,
        "showRankingScore": true,
        "attributesToRetrieve": ["id", "title", "text"],
    })
}

/// The settings every Lacuna index gets: what is searched, and what comes back.
pub fn index_settings() -> Value {
    json!({
        "searchableAttributes": ["title", "text"],
        "displayedAttributes": ["id", "title", "text"],
    })
}

/// A search response's hits as passages with their ranking scores, best first.
pub fn parse_hits(body: &Value) -> Result<Vec<(Passage, f32)>, SearchError> {
    let hits = body["hits"].as_array().ok_or_else(|| bad_response("no hits array", body))?;
    hits.iter()
        .map(|hit| {
            let passage = parse_document(hit)?;
            let score =
                hit["_rankingScore"].as_f64().ok_or_else(|| bad_response("a hit without _rankingScore", hit))?;
            Ok((passage, score as f32))
        })
        .collect()
}

fn parse_document(document: &Value) -> Result<Passage, SearchError> {
    let id = match &document["id"] {
        Value::String(id) => id.clone(),
        Value::Number(n) => n.to_string(),
        _ => return Err(bad_response("a document without an id", document)),
    };
    let text = |field: &str| document[field].as_str().unwrap_or_default().to_string();
    Ok(Passage { id, title: text("title"), text: text("text") })
}

fn bad_response(what: &str, body: &Value) -> SearchError {
    let mut shown = body.to_string();
    shown.truncate(200);
    SearchError::Remote { message: format!("unexpected Meilisearch response ({what}): {shown}"), transient: false }
}

/// Meilisearch accepts document ids of letters, digits, `-` and `_`, at most 511 bytes.
pub fn valid_document_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 511 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A task's outcome from `GET /tasks/{uid}`: `Ok(true)` when done, `Ok(false)` while it waits or runs.
pub fn task_done(task: &Value) -> Result<bool, SearchError> {
    match task["status"].as_str() {
        Some("succeeded") => Ok(true),
        Some("enqueued" | "processing") => Ok(false),
        Some(status) => {
            let error = &task["error"];
            Err(SearchError::Remote {
                message: format!(
                    "Meilisearch task {} {status}: {} ({})",
                    task["uid"],
                    error["message"].as_str().unwrap_or("no message"),
                    error["code"].as_str().unwrap_or("no code")
                ),
                transient: false,
            })
        }
        None => Err(bad_response("a task without status", task)),
    }
}

/// An error response: missing indexes are said so, server errors are worth retrying.
fn error_for(status: reqwest::StatusCode, body: &Value, index: &str, url: &str) -> SearchError {
    let code = body["code"].as_str().unwrap_or_default();
    if code == "index_not_found" {
        return SearchError::MissingRemoteIndex { index: index.to_string(), url: url.to_string() };
    }
    let message = body["message"].as_str().map(str::to_string).unwrap_or_else(|| body.to_string());
    SearchError::Remote {
        message: format!("Meilisearch answered {status} ({code}): {message}"),
        transient: status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS,
    }
}

impl MeiliSearch {
    pub fn new(settings: MeiliSettings) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(settings.timeout_ms))
            .build()
            .expect("a reqwest client with a timeout builds");
        // Only the variable's name is in the config; the key itself is never logged.
        let api_key = std::env::var(&settings.api_key_env).ok().filter(|key| !key.is_empty());
        MeiliSearch { http, settings: Arc::new(settings), api_key }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{}", self.settings.url.trim_end_matches('/'), path.trim_start_matches('/'))
    }

    /// One request with retries on connection errors, timeouts, 429 and 5xx.
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<Value, SearchError> {
        let url = self.url(path);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.send_once(method.clone(), &url, body).await {
                Err(SearchError::Remote { transient: true, message }) if attempt <= self.settings.max_retries => {
                    let backoff = crate::settings::backoff(self.settings.retry_backoff_ms, attempt);
                    tracing::warn!(attempt, backoff_ms = backoff.as_millis() as u64, error = %message, "Meilisearch call failed, retrying");
                    tokio::time::sleep(backoff).await;
                }
                outcome => return outcome,
            }
        }
    }

    async fn send_once(&self, method: reqwest::Method, url: &str, body: Option<&Value>) -> Result<Value, SearchError> {
        let mut request = self.http.request(method, url);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| SearchError::Remote {
            message: format!("Meilisearch at {} unreachable: {e}", self.settings.url),
            transient: true,
        })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            Ok(value)
        } else {
            Err(error_for(status, &value, &self.settings.index, &self.settings.url))
        }
    }

    /// The top `limit` passages for a free-text query, best first, scored by `_rankingScore`.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<(Passage, f32)>, SearchError> {
        let path = format!("indexes/{}/search", self.settings.index);
        let body = self
            .call(reqwest::Method::POST, &path, Some(&search_request(query, limit, self.settings.matching_strategy)))
            .await?;
        parse_hits(&body)
    }

    /// The passage with this id, if the index has it.
    pub async fn passage(&self, id: &str) -> Result<Option<Passage>, SearchError> {
        if !valid_document_id(id) {
            return Ok(None);
        }
        let path = format!("indexes/{}/documents/{id}", self.settings.index);
        match self.call(reqwest::Method::GET, &path, None).await {
            Ok(document) => Ok(Some(parse_document(&document)?)),
            Err(SearchError::Remote { message, .. }) if message.contains("document_not_found") => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Waits for a task to succeed; a failed or canceled task is an error carrying its message.
    async fn wait(&self, enqueued: &Value) -> Result<(), SearchError> {
        let uid = enqueued["taskUid"].as_u64().ok_or_else(|| bad_response("no taskUid", enqueued))?;
        let give_up = Instant::now() + Duration::from_millis(self.settings.task_timeout_ms);
        let mut pause = Duration::from_millis(20);
        loop {
            let task = self.call(reqwest::Method::GET, &format!("tasks/{uid}"), None).await?;
            if task_done(&task)? {
                return Ok(());
            }
            if Instant::now() > give_up {
                return Err(SearchError::Remote {
                    message: format!("Meilisearch task {uid} not done after {} ms", self.settings.task_timeout_ms),
                    transient: false,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Creates the index if it does not exist, sets its attributes, and uploads the corpus in batches,
    /// waiting for each task. Documents replace those with the same id, so re-indexing the same corpus
    /// leaves the index as it was.
    pub async fn build(&self, corpus: &Path) -> Result<IndexReport, SearchError> {
        let documents = read_corpus(corpus)?;
        let index = &self.settings.index;
        let created =
            self.call(reqwest::Method::POST, "indexes", Some(&json!({"uid": index, "primaryKey": "id"}))).await?;
        match self.wait(&created).await {
            Err(SearchError::Remote { message, .. }) if message.contains("index_already_exists") => {}
            outcome => outcome?,
        }
        let settings =
            self.call(reqwest::Method::PATCH, &format!("indexes/{index}/settings"), Some(&index_settings())).await?;
        self.wait(&settings).await?;
        let mut batches = 0;
        for batch in documents.chunks(self.settings.batch_size.max(1)) {
            let path = format!("indexes/{index}/documents?primaryKey=id");
            let enqueued = self.call(reqwest::Method::POST, &path, Some(&Value::Array(batch.to_vec()))).await?;
            self.wait(&enqueued).await?;
            batches += 1;
        }
        Ok(IndexReport { documents: documents.len(), batches })
    }
}

/// The corpus as Meilisearch documents, every id checked before anything is sent.
pub fn read_corpus(corpus: &Path) -> Result<Vec<Value>, SearchError> {
    let mut documents = Vec::new();
    for_each_passage(corpus, |line, passage| {
        if !valid_document_id(&passage.id) {
            let message = format!(
                "id {:?} is not a valid Meilisearch document id (letters, digits, - and _, at most 511 bytes)",
                passage.id
            );
            return Err(corpus_error(corpus, line, message));
        }
        documents.push(json!({"id": passage.id, "title": passage.title, "text": passage.text}));
        Ok(())
    })?;
    Ok(documents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_asks_for_ranking_scores_and_the_passage_fields() {
        let body = search_request("Who directed Levity?", 50, MatchingStrategy::Frequency);
        assert_eq!(body["q"], "Who directed Levity?");
        assert_eq!(body["limit"], 50);
        assert_eq!(body["showRankingScore"], true);
        assert_eq!(body["attributesToRetrieve"], json!(["id", "title", "text"]));
        assert_eq!(body["matchingStrategy"], "frequency");
        assert_eq!(search_request("q", 0, MatchingStrategy::Last)["limit"], 1, "a zero limit still asks for one hit");
        assert_eq!(search_request("q", 5, MatchingStrategy::Last)["matchingStrategy"], "last");
    }

    #[test]
    fn hits_map_to_passages_with_their_ranking_scores() {
        let body = json!({"hits": [
            {"id": "p1", "title": "Levity", "text": "Levity is a 2003 film.", "_rankingScore": 0.93},
            {"id": 7, "title": "Ed Solomon", "text": "An American writer.", "_rankingScore": 0.5},
        ], "query": "levity", "processingTimeMs": 1});
        let hits = parse_hits(&body).unwrap();
        assert_eq!(hits.len(), 2);
        assert_eq!(
            hits[0].0,
            Passage { id: "p1".into(), title: "Levity".into(), text: "Levity is a 2003 film.".into() }
        );
        assert!((hits[0].1 - 0.93).abs() < 1e-6);
        assert_eq!(hits[1].0.id, "7", "numeric ids come back as strings");
        assert!(parse_hits(&json!({"message": "oops"})).is_err());
        assert!(parse_hits(&json!({"hits": [{"id": "p1"}]})).is_err(), "a hit without a score is an error");
    }

    #[test]
    fn task_states_are_read_and_failures_carry_their_message() {
        assert!(!task_done(&json!({"uid": 3, "status": "enqueued"})).unwrap());
        assert!(!task_done(&json!({"uid": 3, "status": "processing"})).unwrap());
        assert!(task_done(&json!({"uid": 3, "status": "succeeded"})).unwrap());
        let failed = json!({"uid": 3, "status": "failed", "error": {"message": "Document identifier `a:b` is invalid.", "code": "invalid_document_id"}});
        let error = task_done(&failed).unwrap_err().to_string();
        assert!(error.contains("task 3 failed") && error.contains("invalid_document_id"), "{error}");
    }

    #[test]
    fn a_missing_index_is_named_and_server_errors_are_retryable() {
        let missing =
            json!({"message": "Index `hotpot` not found.", "code": "index_not_found", "type": "invalid_request"});
        let error = error_for(reqwest::StatusCode::NOT_FOUND, &missing, "hotpot", "http://m:7700");
        assert!(matches!(&error, SearchError::MissingRemoteIndex { index, .. } if index == "hotpot"));
        assert!(error.to_string().contains("lacuna index --backend meilisearch"), "{error}");
        let busy = error_for(reqwest::StatusCode::SERVICE_UNAVAILABLE, &json!({}), "i", "u");
        assert!(matches!(busy, SearchError::Remote { transient: true, .. }));
        let bad = error_for(reqwest::StatusCode::BAD_REQUEST, &json!({"code": "invalid_search_q"}), "i", "u");
        assert!(matches!(bad, SearchError::Remote { transient: false, .. }));
    }

    #[test]
    fn corpus_ids_are_checked_before_anything_is_sent() {
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
        let error = read_corpus(&corpus).unwrap_err().to_string();
        assert!(error.contains("line 3") && error.contains("bad id"), "{error}");
        std::fs::write(&corpus, "{\"id\": \"p1\", \"title\": \"T\", \"text\": \"x\"}\n").unwrap();
        assert_eq!(read_corpus(&corpus).unwrap(), vec![json!({"id": "p1", "title": "T", "text": "x"})]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
