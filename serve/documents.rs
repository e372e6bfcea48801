//! The document routes of `lacuna serve`, behind a bearer token of their own
//! (`serve.documents_token_env`, a write scope apart from the questions' token; with none set the
//! routes are off: every request gets 401, saying so, as no token can open them):
//! - `POST /v1/documents`: adds a document, replacing every passage of an earlier version of it;
//! - `GET /v1/documents/{id}`: its passages as this server's index holds them;
//! - `DELETE /v1/documents/{id}`: removes it.
//!
//! In process they change the local tantivy index through the same writer as `lacuna ingest`, one
//! request at a time, and answer once the change is committed: the running pipelines search it
//! within a second. On the Meilisearch backend they change its index as `lacuna ingest` does, and
//! answer once Meilisearch has done the tasks. Over Kafka they publish to the `documents` topic,
//! which every retrieve replica follows (`search.follow_documents`), and answer 202 once the broker
//! has it; this server holds no index then, so GET answers 404 and says so.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::{IntoParams, ToSchema};

use super::http::{ApiError, ErrorBody, ErrorCode, bearer_matches, json_reply, read_body, require_json};
use crate::actors::clients::search::documents::{Document, DocumentError, check_id};
use crate::actors::clients::search::meili::Update;
use crate::actors::clients::{MeiliSearch, SearchError, TantivySearch, TantivyWriter};
use crate::topics::kafka::KafkaBus;

pub struct DocumentRoutes {
    /// The token these routes need; None: they are off.
    pub token: Option<String>,
    pub target: Target,
    pub max_document_bytes: usize,
    pub passage_words: usize,
    pub body_timeout: Duration,
}

/// Where a change goes.
pub enum Target {
    /// The local tantivy index, written by one request at a time (tantivy allows one writer).
    Local { dir: PathBuf, writing: Arc<tokio::sync::Mutex<()>> },
    /// The documents topic.
    Kafka(Arc<KafkaBus>),
    /// The Meilisearch index the pipelines search (`search.backend = "meilisearch"`, in process),
    /// opened for writing (created, keyed, its settings set) by the first change, not by every one.
    Meili { meili: MeiliSearch, opened: tokio::sync::OnceCell<()> },
}

/// What a change did.
#[derive(Serialize, ToSchema)]
pub struct DocumentChanged {
    pub id: String,
    /// `applied` (in process: committed, searched within a second) or `published` (over Kafka: the
    /// broker has it; each retrieve replica applies it within about `search.commit_interval_ms`).
    pub status: String,
    /// In process: the passages the document has now (0 once deleted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passages: Option<usize>,
    /// In process: the index generation after the change, as answer records name it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
}

/// A document as the index holds it: its passages, split by `search.passage_words`.
#[derive(Serialize, ToSchema)]
pub struct StoredDocument {
    pub id: String,
    pub title: String,
    pub metadata: BTreeMap<String, String>,
    pub passages: Vec<StoredPassage>,
    /// The index generation read.
    pub generation: String,
}

#[derive(Serialize, ToSchema)]
pub struct StoredPassage {
    /// The document's id, or `ID#n` when it has several passages.
    pub id: String,
    pub text: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // for the OpenAPI document: the handlers take the id as a string
pub struct DocumentId {
    /// The document's id: 1 to 200 characters, no `#`, white space or control characters.
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^#?%/\\s\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u200b-\\u200f\\u202a-\\u202e\\u2060-\\u2069\\ufeff]+$"
    )]
    pub id: String,
}

/// With its token configured, these routes need `Authorization: Bearer <documents token>`.
pub async fn authorize(State(routes): State<Arc<DocumentRoutes>>, request: Request, next: Next) -> Response {
    let Some(token) = &routes.token else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "the document routes are off: no token opens them until serve.documents_token_env names one",
        )
        .into_response();
    };
    if bearer_matches(request.headers(), token) {
        return next.run(request).await;
    }
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "the document routes need Authorization: Bearer <the token named by serve.documents_token_env>",
    )
    .into_response()
}

/// Add a document, or replace every passage of an earlier version of it.
#[utoipa::path(
    post,
    path = "/v1/documents",
    tag = "documents",
    security(("documents_bearer" = [])),
    request_body(content = Document, content_type = "application/json"),
    responses(
        (status = 200, description = "Applied to this server's index (in process).", body = DocumentChanged),
        (status = 202, description = "Published to the documents topic (over Kafka).", body = DocumentChanged),
        (status = 400, description = "Not a document: a bad id, an empty text, or not JSON.", body = ErrorBody),
        (status = 401, description = "The documents token is missing or wrong, or the routes are off (no serve.documents_token_env).", body = ErrorBody),
        (status = 413, description = "Over search.max_document_bytes, or over the bus's message size (over Kafka): no retry helps.", body = ErrorBody),
        (status = 415, description = "Not application/json.", body = ErrorBody),
        (status = 500, description = "The bus refused it for good (not authorised, no such topic): for the operator.", body = ErrorBody),
        (status = 503, description = "The index or the bus cannot take it now; retry.", body = ErrorBody),
    )
)]
pub async fn post_document(
    State(routes): State<Arc<DocumentRoutes>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    // Room for the JSON around a document of the largest size taken, escapes included; past it the
    // document is too large whatever its JSON.
    let limit = 2 * routes.max_document_bytes + 64 * 1024;
    let body = read_body(&headers, body, limit, routes.body_timeout).await.map_err(|mut error| {
        if error.status == StatusCode::PAYLOAD_TOO_LARGE {
            let max = routes.max_document_bytes;
            error.body.error.message =
                format!("the body is over {limit} bytes: a document is at most search.max_document_bytes = {max}");
        }
        error
    })?;
    let document: Document = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("expected {{\"id\", \"title\", \"text\", \"metadata\"}}: {e}")))?;
    document.check(routes.max_document_bytes).map_err(refused)?;
    match &routes.target {
        Target::Kafka(bus) => {
            let payload = serde_json::to_vec(&document).expect("documents serialise");
            let what = format!("document {}", document.id);
            bus.publish_document(&document.id, Some(&payload))
                .await
                .map_err(|e| ApiError::publish_failed(&e, &what, 1))?;
            Ok(json_reply(StatusCode::ACCEPTED, &published(&document.id)))
        }
        Target::Meili { .. } => {
            let id = document.id.clone();
            let passages = routes.apply_meili(Update { doc_id: id.clone(), document: Some(document) }).await?;
            let changed = DocumentChanged { id, status: "applied".into(), passages: Some(passages), generation: None };
            Ok(json_reply(StatusCode::OK, &changed))
        }
        Target::Local { .. } => {
            let (id, words) = (document.id.clone(), routes.passage_words);
            let (passages, generation) = routes.apply(move |writer| writer.upsert(&document, words)).await?;
            let changed = DocumentChanged { id, status: "applied".into(), passages: Some(passages), generation };
            Ok(json_reply(StatusCode::OK, &changed))
        }
    }
}

/// A document's passages, as this server's index holds them.
#[utoipa::path(
    get,
    path = "/v1/documents/{id}",
    tag = "documents",
    security(("documents_bearer" = [])),
    params(DocumentId),
    responses(
        (status = 200, description = "The document.", body = StoredDocument),
        (status = 400, description = "Not a document id.", body = ErrorBody),
        (status = 401, description = "The documents token is missing or wrong, or the routes are off (no serve.documents_token_env).", body = ErrorBody),
        (status = 404, description = "No such document here.", body = ErrorBody),
    )
)]
pub async fn get_document(
    State(routes): State<Arc<DocumentRoutes>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    check_id(&id).map_err(refused)?;
    let (document, generation) = match &routes.target {
        Target::Kafka(_) => {
            return Err(ApiError::not_found(
                "over Kafka this server publishes documents and holds no index: read them from a retrieve replica's",
            ));
        }
        Target::Meili { meili, .. } => {
            let document = meili.document(&id).await.map_err(unavailable)?;
            (document, meili.generation().await.unwrap_or_else(|| "meilisearch".into()))
        }
        Target::Local { dir, .. } => {
            let (dir, id) = (dir.clone(), id.clone());
            tokio::task::spawn_blocking(move || -> Result<_, SearchError> {
                let search = TantivySearch::open(&dir)?;
                let document = search.document(&id)?;
                let document = document
                    .map(|(passages, metadata)| (passages, serde_json::from_str(&metadata).unwrap_or_default()));
                Ok((document, search.generation()))
            })
            .await
            .map_err(unavailable)?
            .map_err(unavailable)?
        }
    };
    let Some((passages, metadata)) = document else {
        return Err(ApiError::not_found(format!("no document {id:?} in this server's index")));
    };
    let title = passages[0].title.clone();
    let passages = passages.into_iter().map(|p| StoredPassage { id: p.id, text: p.text }).collect();
    Ok(json_reply(StatusCode::OK, &StoredDocument { id, title, metadata, passages, generation }))
}

/// Remove a document (removing one that is not there is not an error).
#[utoipa::path(
    delete,
    path = "/v1/documents/{id}",
    tag = "documents",
    security(("documents_bearer" = [])),
    params(DocumentId),
    responses(
        (status = 200, description = "Deleted from this server's index (in process).", body = DocumentChanged),
        (status = 202, description = "Its deletion published to the documents topic (over Kafka).", body = DocumentChanged),
        (status = 400, description = "Not a document id.", body = ErrorBody),
        (status = 401, description = "The documents token is missing or wrong, or the routes are off (no serve.documents_token_env).", body = ErrorBody),
        (status = 500, description = "The bus refused it for good (not authorised, no such topic): for the operator.", body = ErrorBody),
        (status = 503, description = "The index or the bus cannot take it now; retry.", body = ErrorBody),
    )
)]
pub async fn delete_document(
    State(routes): State<Arc<DocumentRoutes>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    check_id(&id).map_err(refused)?;
    match &routes.target {
        Target::Kafka(bus) => {
            let what = format!("the deletion of {id}");
            bus.publish_document(&id, None).await.map_err(|e| ApiError::publish_failed(&e, &what, 1))?;
            Ok(json_reply(StatusCode::ACCEPTED, &published(&id)))
        }
        Target::Meili { .. } => {
            routes.apply_meili(Update { doc_id: id.clone(), document: None }).await?;
            Ok(json_reply(
                StatusCode::OK,
                &DocumentChanged { id, status: "applied".into(), passages: Some(0), generation: None },
            ))
        }
        Target::Local { .. } => {
            let deleted = id.clone();
            let (_, generation) = routes
                .apply(move |writer| {
                    writer.delete(&deleted);
                    Ok(0)
                })
                .await?;
            Ok(json_reply(
                StatusCode::OK,
                &DocumentChanged { id, status: "applied".into(), passages: Some(0), generation },
            ))
        }
    }
}

impl DocumentRoutes {
    /// One change to the local index, committed; the passages it reports and the new generation.
    async fn apply(
        &self,
        change: impl FnOnce(&mut TantivyWriter) -> Result<usize, SearchError> + Send + 'static,
    ) -> Result<(usize, Option<String>), ApiError> {
        let Target::Local { dir, writing } = &self.target else { unreachable!("called in process only") };
        // The guard goes with the blocking task: a request dropped mid-change (the client went away)
        // must not let the next one in while this one still holds tantivy's writer.
        let one_at_a_time = writing.clone().lock_owned().await;
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || {
            let _one_at_a_time = one_at_a_time;
            let mut writer = TantivyWriter::open(&dir)?;
            let passages = change(&mut writer)?;
            Ok((passages, Some(writer.commit()?)))
        })
        .await
        .map_err(unavailable)?
        .map_err(|e: SearchError| unavailable(e))
    }
}

impl DocumentRoutes {
    /// One change to the Meilisearch index, done; the passages the document has now.
    async fn apply_meili(&self, update: Update) -> Result<usize, ApiError> {
        let Target::Meili { meili, opened } = &self.target else { unreachable!("called on Meilisearch only") };
        opened.get_or_try_init(|| meili.open_for_writing()).await.map_err(unavailable)?;
        // A task of its own, like the tantivy writer's: a request dropped mid-change (the client went
        // away) must not stop it between its additions and its deletion, which leaves two versions.
        let (meili, words) = (meili.clone(), self.passage_words);
        let change = tokio::spawn(async move { meili.apply_now(&[update], words, "serve").await });
        let written = change.await.map_err(unavailable)?.map_err(unavailable)?;
        Ok(written.passages)
    }
}

fn published(id: &str) -> DocumentChanged {
    DocumentChanged { id: id.to_string(), status: "published".into(), passages: None, generation: None }
}

fn refused(error: DocumentError) -> ApiError {
    match error {
        DocumentError::TooLarge { .. } => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::TooLarge, error),
        other => ApiError::bad_request(other),
    }
}

/// The index is written by another process, or the bus or the disk failed: worth a retry.
fn unavailable(error: impl std::fmt::Display) -> ApiError {
    let mut refused = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, error);
    refused.retry_after = Some(1);
    refused
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use super::*;

    /// A request dropped while its change runs (the client went away) must keep the index's one
    /// writer until the change is done: the next request waits for it, rather than failing to open a
    /// second writer while the first still holds tantivy's lock (issue 57, item 9).
    #[tokio::test]
    async fn a_change_whose_request_was_dropped_keeps_the_writer_until_it_is_done() {
        let dir = std::env::temp_dir().join(format!("lacuna-serve-writer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let routes = DocumentRoutes {
            token: None,
            target: Target::Local { dir: dir.clone(), writing: Default::default() },
            max_document_bytes: 1 << 20,
            passage_words: 100,
            body_timeout: Duration::from_secs(5),
        };
        let first_done: Arc<Mutex<Option<Instant>>> = Arc::default();
        let done = first_done.clone();
        let slow = routes.apply(move |_| {
            std::thread::sleep(Duration::from_millis(500));
            *done.lock().unwrap() = Some(Instant::now());
            Ok(0)
        });
        assert!(tokio::time::timeout(Duration::from_millis(100), slow).await.is_err(), "dropped mid-change");
        let second = routes.apply(|_| Ok(0)).await;
        let finished = *first_done.lock().unwrap();
        assert!(second.is_ok(), "the second change waited for the writer instead of failing");
        assert!(finished.is_some(), "and it ran after the first change was done");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
