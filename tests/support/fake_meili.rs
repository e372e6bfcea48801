//! A fake Meilisearch that speaks the part of its HTTP API Lacuna uses, on 127.0.0.1, so that the
//! real client code (meilisearch-sdk, our retries and task waits) runs in tests without a server:
//! no registry ships one (../shared/ENVIRONMENT.md). Every task is done when it is enqueued. Search
//! ranks by the share of query words a passage holds; deletions and fetches take the filters Lacuna
//! writes (`doc_id IN [...]`, optionally `AND (seq < N OR seq NOT EXISTS)` or `AND seq > N`, and `id = "..."`) and refuse
//! any other. `set_down` makes every
//! request answer 503, as a server that is restarting; `set_task_delay` makes each new task report
//! itself processing for a while, as a busy server's queue does.
//!
//! Where Meilisearch 1.50.0 answered otherwise than this fake did (docs/corpus.md, "Against a real
//! server"), the fake now answers as it does: a filter on an attribute not filterable is refused
//! (400 on a fetch; a failed task on a deletion, which Meilisearch checks only when it runs it), as is
//! one it cannot parse; a document whose id Meilisearch refuses fails its whole upload's task
//! (`invalid_document_id`), not the request; a deletion from a missing index fails its task
//! (`index_not_found`); and tasks carry Meilisearch's type names.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

#[derive(Default)]
struct Index {
    primary_key: Option<String>,
    documents: BTreeMap<String, Value>,
    /// The attributes filters may name (its settings' `filterableAttributes`).
    filterable: Vec<String>,
}

#[derive(Default)]
struct Server {
    indexes: HashMap<String, Index>,
    /// Each task as it will read when done, and when it is done.
    tasks: Vec<(Value, std::time::Instant)>,
    task_delay: std::time::Duration,
    uploads: usize,
    /// Document uploads by index.
    uploads_to: HashMap<String, usize>,
    /// Uploads larger than this are refused with 413, as Meilisearch's `http-payload-size-limit`.
    payload_limit: Option<usize>,
}

#[derive(Clone)]
struct Shared {
    server: Arc<Mutex<Server>>,
    down: Arc<AtomicBool>,
}

pub struct FakeMeili {
    pub url: String,
    shared: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

const AT: &str = "2026-11-27T10:00:00Z";

impl FakeMeili {
    /// Serves on a thread and runtime of its own, so that a test may block its own thread meanwhile.
    pub fn start() -> FakeMeili {
        let shared = Shared { server: Default::default(), down: Default::default() };
        let app = Router::new()
            .route("/indexes", post(create_index))
            .route("/indexes/{uid}", get(get_index))
            .route("/indexes/{uid}/settings", axum::routing::patch(settings))
            .route("/indexes/{uid}/documents", post(add_documents).delete(delete_all).get(count_documents))
            .route("/indexes/{uid}/documents/delete", post(delete_by_filter))
            .route("/indexes/{uid}/documents/fetch", post(fetch_by_filter))
            .route("/indexes/{uid}/documents/{id}", get(get_document))
            .route("/indexes/{uid}/search", post(search))
            .route("/tasks/{uid}", get(get_task))
            .layer(axum::middleware::from_fn_with_state(shared.clone(), unless_down))
            .with_state(shared.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let serving = axum::serve(listener, app).with_graceful_shutdown(async {
                    let _ = stopped.await;
                });
                serving.await.unwrap();
            });
        });
        FakeMeili { url, shared, stop: Some(stop) }
    }

    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
    }

    /// New tasks report `processing` for this long before they are done.
    pub fn set_task_delay(&self, delay: std::time::Duration) {
        self.shared.server.lock().unwrap().task_delay = delay;
    }

    /// Refuses document uploads whose body is larger than `bytes` with 413 `payload_too_large`.
    pub fn set_payload_limit(&self, bytes: usize) {
        self.shared.server.lock().unwrap().payload_limit = Some(bytes);
    }

    /// Document uploads received (POST .../documents).
    pub fn uploads(&self) -> usize {
        self.shared.server.lock().unwrap().uploads
    }

    /// The passage ids (`id`) the index `uid` holds, sorted; deletions' markers are not passages.
    pub fn passage_ids(&self, uid: &str) -> Vec<String> {
        let documents = self.documents(uid);
        let passages = documents.values().filter(|d| d["deleted"] != true);
        let mut ids: Vec<String> = passages.map(|d| d["id"].as_str().unwrap().to_string()).collect();
        ids.sort();
        ids
    }

    /// Document uploads received for the index `uid`.
    pub fn uploads_to(&self, uid: &str) -> usize {
        self.shared.server.lock().unwrap().uploads_to.get(uid).copied().unwrap_or(0)
    }

    /// The uids of its indexes.
    pub fn indexes(&self) -> Vec<String> {
        self.shared.server.lock().unwrap().indexes.keys().cloned().collect()
    }

    /// The documents of an index, by primary key.
    pub fn documents(&self, uid: &str) -> BTreeMap<String, Value> {
        let server = self.shared.server.lock().unwrap();
        server.indexes.get(uid).map(|index| index.documents.clone()).unwrap_or_default()
    }
}

impl Drop for FakeMeili {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn unless_down(
    State(shared): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if shared.down.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "restarting").into_response();
    }
    next.run(request).await
}

fn error(status: StatusCode, code: &str, message: String) -> Response {
    (status, Json(json!({"message": message, "code": code, "type": "invalid_request", "link": ""}))).into_response()
}

fn missing(uid: &str) -> Response {
    error(StatusCode::NOT_FOUND, "index_not_found", format!("Index `{uid}` not found."))
}

/// A failed task's error, as Meilisearch writes it.
fn failure(code: &str, message: String) -> Value {
    json!({"message": message, "code": code, "type": "invalid_request", "link": ""})
}

/// Why Meilisearch refuses `filter` on `index` (unparsed, or naming an attribute not filterable), or the filter.
fn checked_filter(index: &Index, filter: &str) -> Result<Filter, String> {
    let parsed = Filter::parse(filter).map_err(|_| format!("unexpected filter {filter}"))?;
    match parsed.attributes().into_iter().find(|a| !index.filterable.iter().any(|f| f == a)) {
        Some(attribute) => Err(format!("Attribute `{attribute}` is not filterable.\n1:1 {filter}")),
        None => Ok(parsed),
    }
}

/// Records a task, done after the task delay (failed with `failure` when given), and answers 202 with
/// its info.
fn task(server: &mut Server, uid: &str, kind: &str, failure: Option<Value>) -> Response {
    let number = server.tasks.len();
    let mut done = json!({"uid": number, "indexUid": uid, "status": "succeeded", "type": kind,
        "duration": "PT0S", "enqueuedAt": AT, "startedAt": AT, "finishedAt": AT});
    if let Some(failure) = failure {
        done["status"] = json!("failed");
        done["error"] = failure;
    }
    let ready = std::time::Instant::now() + server.task_delay;
    server.tasks.push((done, ready));
    let info = json!({"taskUid": number, "indexUid": uid, "status": "enqueued", "type": kind, "enqueuedAt": AT});
    (StatusCode::ACCEPTED, Json(info)).into_response()
}

async fn create_index(State(shared): State<Shared>, Json(body): Json<Value>) -> Response {
    let mut server = shared.server.lock().unwrap();
    let uid = body["uid"].as_str().unwrap().to_string();
    let failure = server.indexes.contains_key(&uid).then(|| {
        json!({"message": format!("Index `{uid}` already exists."), "code": "index_already_exists", "type": "invalid_request", "link": ""})
    });
    if failure.is_none() {
        let primary_key = body["primaryKey"].as_str().map(str::to_string);
        server.indexes.insert(uid.clone(), Index { primary_key, ..Default::default() });
    }
    task(&mut server, &uid, "indexCreation", failure)
}

async fn get_index(State(shared): State<Shared>, Path(uid): Path<String>) -> Response {
    let server = shared.server.lock().unwrap();
    match server.indexes.get(&uid) {
        Some(index) => {
            Json(json!({"uid": uid, "primaryKey": index.primary_key, "createdAt": AT, "updatedAt": AT})).into_response()
        }
        None => missing(&uid),
    }
}

async fn settings(State(shared): State<Shared>, Path(uid): Path<String>, Json(body): Json<Value>) -> Response {
    let mut server = shared.server.lock().unwrap();
    let Some(index) = server.indexes.get_mut(&uid) else { return missing(&uid) };
    if let Some(attributes) = body["filterableAttributes"].as_array() {
        index.filterable = attributes.iter().filter_map(|a| a.as_str().map(str::to_string)).collect();
    }
    task(&mut server, &uid, "settingsUpdate", None)
}

async fn add_documents(
    State(shared): State<Shared>,
    Path(uid): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    Json(documents): Json<Vec<Value>>,
) -> Response {
    let mut server = shared.server.lock().unwrap();
    server.uploads += 1;
    *server.uploads_to.entry(uid.clone()).or_default() += 1;
    let size = serde_json::to_vec(&documents).unwrap().len();
    if let Some(limit) = server.payload_limit.filter(|limit| size > *limit) {
        let message =
            format!("The provided payload reached the size limit. The maximum accepted payload size is {limit} B.");
        return error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message);
    }
    // Meilisearch creates an index with its first documents.
    let index = server.indexes.entry(uid.clone()).or_default();
    if index.primary_key.is_none() {
        index.primary_key = query.get("primaryKey").cloned();
    }
    let key = index.primary_key.clone().unwrap_or_else(|| "id".into());
    // Meilisearch checks ids when it runs the task, and then fails the whole upload.
    let valid = |id: &str| {
        !id.is_empty() && id.len() <= 511 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let refused = documents.iter().find_map(|document| match document[&key].as_str() {
        None => {
            Some(failure("missing_document_id", format!("Document doesn't have a `{key}` attribute: `{document}`.")))
        }
        Some(id) if !valid(id) => {
            Some(failure("invalid_document_id", format!("Document identifier `\"{id}\"` is invalid.")))
        }
        Some(_) => None,
    });
    if refused.is_none() {
        for document in documents {
            index.documents.insert(document[&key].as_str().unwrap().to_string(), document);
        }
    }
    task(&mut server, &uid, "documentAdditionOrUpdate", refused)
}

async fn delete_all(State(shared): State<Shared>, Path(uid): Path<String>) -> Response {
    let mut server = shared.server.lock().unwrap();
    if let Some(index) = server.indexes.get_mut(&uid) {
        index.documents.clear();
    }
    task(&mut server, &uid, "documentDeletion", None)
}

async fn count_documents(State(shared): State<Shared>, Path(uid): Path<String>) -> Response {
    let server = shared.server.lock().unwrap();
    match server.indexes.get(&uid) {
        Some(index) => {
            Json(json!({"results": [], "limit": 0, "offset": 0, "total": index.documents.len()})).into_response()
        }
        None => missing(&uid),
    }
}

/// The quoted strings of `text`, in order, unescaped.
fn quoted(text: &str) -> Vec<String> {
    let (mut out, mut chars) = (Vec::new(), text.chars());
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '"' => break,
                c => value.push(c),
            }
        }
        out.push(value);
    }
    out
}

/// A filter Lacuna writes.
enum Filter {
    /// `doc_id IN [...]`, and `AND (seq < N OR seq NOT EXISTS)` when `below` is N, or `AND seq > N`
    /// when `above` is.
    Documents { ids: Vec<String>, below: Option<u64>, above: Option<u64> },
    /// `id = "..."`.
    Passage(String),
    /// `seq >= N`.
    SeqAtLeast(u64),
    /// `(...) OR (...)`, each one of the above.
    Any(Vec<Filter>),
}

impl Filter {
    fn parse(filter: &str) -> Result<Filter, Response> {
        let refused =
            || error(StatusCode::BAD_REQUEST, "invalid_document_filter", format!("unexpected filter {filter}"));
        if filter.starts_with("id = ") {
            return quoted(filter).pop().map(Filter::Passage).ok_or_else(refused);
        }
        if let Some(seq) = filter.strip_prefix("seq >= ") {
            return seq.parse().map(Filter::SeqAtLeast).map_err(|_| refused());
        }
        if let Some(clauses) = filter.strip_prefix('(').and_then(|f| f.strip_suffix(')')) {
            return clauses.split(") OR (").map(Filter::parse).collect::<Result<_, _>>().map(Filter::Any);
        }
        let Some((ids, rest)) = filter.strip_prefix("doc_id IN [").and_then(|f| f.rsplit_once(']')) else {
            return Err(refused());
        };
        let (mut below, mut above) = (None, None);
        match rest.trim() {
            "" => {}
            rest if rest.starts_with("AND seq > ") => {
                above = Some(rest["AND seq > ".len()..].parse().map_err(|_| refused())?);
            }
            rest => {
                let seq = rest.strip_prefix("AND (seq < ").and_then(|r| r.strip_suffix(" OR seq NOT EXISTS)"));
                below = Some(seq.and_then(|n| n.parse().ok()).ok_or_else(refused)?);
            }
        }
        Ok(Filter::Documents { ids: quoted(ids), below, above })
    }

    /// The attributes it names.
    fn attributes(&self) -> Vec<&'static str> {
        match self {
            Filter::Documents { below, above, .. } if below.is_some() || above.is_some() => vec!["doc_id", "seq"],
            Filter::Documents { .. } => vec!["doc_id"],
            Filter::Passage(_) => vec!["id"],
            Filter::SeqAtLeast(_) => vec!["seq"],
            Filter::Any(filters) => filters.iter().flat_map(Filter::attributes).collect(),
        }
    }

    fn matches(&self, document: &Value) -> bool {
        match self {
            Filter::Passage(id) => document["id"] == id.as_str(),
            Filter::SeqAtLeast(least) => document["seq"].as_u64().is_some_and(|seq| seq >= *least),
            Filter::Any(filters) => filters.iter().any(|filter| filter.matches(document)),
            Filter::Documents { ids, below, above } => {
                let of_ids = document["doc_id"].as_str().is_some_and(|id| ids.iter().any(|i| i == id));
                let older = match (below, document["seq"].as_u64()) {
                    (Some(below), Some(seq)) => seq < *below,
                    _ => true,
                };
                let newer = above.is_none_or(|above| document["seq"].as_u64().is_some_and(|seq| seq > above));
                of_ids && older && newer
            }
        }
    }
}

async fn delete_by_filter(State(shared): State<Shared>, Path(uid): Path<String>, Json(body): Json<Value>) -> Response {
    let mut server = shared.server.lock().unwrap();
    // Meilisearch takes the deletion and checks its filter when it runs it.
    let refused = match server.indexes.get_mut(&uid) {
        None => Some(failure("index_not_found", format!("Index `{uid}` not found."))),
        Some(index) => match checked_filter(index, body["filter"].as_str().unwrap_or_default()) {
            Ok(filter) => {
                index.documents.retain(|_, d| !filter.matches(d));
                None
            }
            Err(why) => Some(failure("invalid_document_filter", format!("Index `{uid}`: {why}"))),
        },
    };
    task(&mut server, &uid, "documentDeletion", refused)
}

async fn fetch_by_filter(State(shared): State<Shared>, Path(uid): Path<String>, Json(body): Json<Value>) -> Response {
    let server = shared.server.lock().unwrap();
    let Some(index) = server.indexes.get(&uid) else { return missing(&uid) };
    let filter = match checked_filter(index, body["filter"].as_str().unwrap_or_default()) {
        Ok(filter) => filter,
        Err(why) => return error(StatusCode::BAD_REQUEST, "invalid_document_filter", why),
    };
    let found: Vec<Value> = index.documents.values().filter(|d| filter.matches(d)).cloned().collect();
    Json(json!({"results": found, "limit": found.len(), "offset": 0, "total": found.len()})).into_response()
}

async fn get_document(State(shared): State<Shared>, Path((uid, id)): Path<(String, String)>) -> Response {
    let server = shared.server.lock().unwrap();
    let Some(index) = server.indexes.get(&uid) else { return missing(&uid) };
    match index.documents.get(&id) {
        Some(document) => Json(document.clone()).into_response(),
        None => error(StatusCode::NOT_FOUND, "document_not_found", format!("Document `{id}` not found.")),
    }
}

async fn search(State(shared): State<Shared>, Path(uid): Path<String>, Json(body): Json<Value>) -> Response {
    let words = |text: &str| -> Vec<String> {
        text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
    };
    let query = words(body["q"].as_str().unwrap_or_default());
    let server = shared.server.lock().unwrap();
    let Some(index) = server.indexes.get(&uid) else { return missing(&uid) };
    let mut hits: Vec<(f64, Value)> = index
        .documents
        .values()
        .filter_map(|d| {
            let held = words(&format!("{} {}", d["title"].as_str().unwrap_or(""), d["text"].as_str().unwrap_or("")));
            let score = query.iter().filter(|w| held.contains(w)).count() as f64 / query.len().max(1) as f64;
            (score > 0.0).then(|| {
                (score, json!({"id": d["id"], "title": d["title"], "text": d["text"], "_rankingScore": score}))
            })
        })
        .collect();
    hits.sort_by(|a, b| b.0.total_cmp(&a.0));
    hits.truncate(body["limit"].as_u64().unwrap_or(20) as usize);
    let hits: Vec<Value> = hits.into_iter().map(|(_, hit)| hit).collect();
    Json(json!({"hits": hits, "processingTimeMs": 0, "query": body["q"]})).into_response()
}

async fn get_task(State(shared): State<Shared>, Path(uid): Path<usize>) -> Response {
    let server = shared.server.lock().unwrap();
    match server.tasks.get(uid) {
        Some((task, ready)) if std::time::Instant::now() < *ready => {
            let mut processing = task.clone();
            processing["status"] = json!("processing");
            for unfinished in ["duration", "finishedAt", "error"] {
                processing.as_object_mut().unwrap().remove(unfinished);
            }
            Json(processing).into_response()
        }
        Some((task, _)) => Json(task.clone()).into_response(),
        None => error(StatusCode::NOT_FOUND, "task_not_found", format!("Task `{uid}` not found.")),
    }
}
