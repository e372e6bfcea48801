use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lacuna::actors::clients::{LlmClient, LlmError, Schema};
use lacuna::config::CacheMode;
use serde_json::{Value, json};

use crate::support;
use crate::support::fake_llm::{FakeLlm, Reply};

fn schema() -> Schema {
    Schema { name: "x", schema: json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}) }
}

#[tokio::test]
async fn transient_errors_are_retried_and_usage_is_recorded() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = attempts.clone();
    let llm = FakeLlm::start(move |_| match seen.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::Status(503),
        1 => Reply::Status(429),
        _ => Reply::Json(json!({"a": 7})),
    })
    .await;
    let reply = support::llm(&llm.base_url).structured::<Value>("", "hi", &schema()).await.unwrap();
    assert_eq!(reply.value["a"], 7);
    assert_eq!(reply.stats.attempts, 3);
    assert_eq!((reply.stats.prompt_tokens, reply.stats.completion_tokens, reply.stats.cached_tokens), (100, 10, 40));
}

#[tokio::test]
async fn a_client_error_is_not_retried() {
    let llm = FakeLlm::start(|_| Reply::Status(400)).await;
    let error = support::llm(&llm.base_url).structured::<Value>("", "hi", &schema()).await.unwrap_err();
    assert!(matches!(error, LlmError::Status { status: 400, .. }));
    assert_eq!(llm.calls(), 1);
}

#[tokio::test]
async fn a_reply_that_stays_broken_is_a_clear_bad_response_after_its_reasks() {
    let llm = FakeLlm::start(|_| Reply::Text("the answer is {a: seven".into())).await;
    let error = support::llm(&llm.base_url).structured::<Value>("", "hi", &schema()).await.unwrap_err();
    assert_eq!(error.error_type(), "llm_bad_response");
    assert_eq!(llm.calls(), 3, "asked once and re-asked llm.max_reask = 2 times");
}

/// A server as deterministic as a greedy one: the same request always gets the same broken reply;
/// only a request with a seed gets a usable one.
#[tokio::test]
async fn a_broken_reply_is_asked_again_with_a_new_seed_and_never_cached() {
    let llm = FakeLlm::start_on_request(|_, request| match request.get("seed") {
        None => Reply::Text("{\"a\": ".into()),
        Some(_) => Reply::Json(json!({"a": 3})),
    })
    .await;
    let mut settings = support::settings(&llm.base_url).llm;
    settings.cache = true;
    settings.cache_dir = support::scratch_dir("reask-cache");
    let _ = std::fs::remove_dir_all(&settings.cache_dir);

    let reply = LlmClient::new(settings.clone()).structured::<Value>("", "hi", &schema()).await.unwrap();
    assert_eq!((reply.value["a"].as_i64(), reply.stats.reasks), (Some(3), 1));
    let second = llm.requests.lock().unwrap()[1].clone();
    assert!(second["temperature"].as_f64().unwrap() >= 0.4, "a greedy re-ask would repeat itself: {second}");
    assert_eq!(reply.stats.prompt_tokens, 200, "the broken reply's tokens are spent too");

    // Read back: the usable reply, without asking the server, and no broken text anywhere on disk.
    let again = LlmClient::new(settings.clone()).structured::<Value>("", "hi", &schema()).await.unwrap();
    assert_eq!((again.value["a"].as_i64(), again.stats.cache_hit, llm.calls()), (Some(3), true, 2));
    let entries = walk(&settings.cache_dir);
    assert_eq!(entries.len(), 1);
    let texts: Vec<Value> = entries.iter().map(|e| serde_json::from_str::<Value>(e).unwrap()["text"].clone()).collect();
    assert_eq!(texts, vec![json!("{\"a\":3}")], "only the usable reply is kept");
}

/// A recorded run in which a call stayed unusable through its re-asks (the run went on without it,
/// as the reader fallback does) replays as that same failure, sending nothing: a replay reproduces
/// the run it replays, its failed calls included. With `read_write` the call is asked again: a
/// broken reply is never read back as an answer.
#[tokio::test]
async fn a_call_that_stayed_broken_replays_as_the_same_bad_response() {
    let llm = FakeLlm::start(|_| Reply::Text("the answer is {a: seven".into())).await;
    let mut settings = support::settings(&llm.base_url).llm;
    settings.cache = true;
    settings.cache_dir = support::scratch_dir("broken-replay-cache");
    let _ = std::fs::remove_dir_all(&settings.cache_dir);
    let ask = |settings: &lacuna::config::LlmSettings| {
        let llm = LlmClient::new(settings.clone());
        async move { llm.structured::<Value>("", "hi", &schema()).await.unwrap_err() }
    };

    let recorded = ask(&settings).await;
    assert_eq!((recorded.error_type(), llm.calls()), ("llm_bad_response", 3));
    settings.cache_mode = CacheMode::Replay;
    let replayed = ask(&settings).await;
    assert_eq!((replayed.error_type(), replayed.to_string()), (recorded.error_type(), recorded.to_string()));
    assert_eq!(llm.calls(), 3, "a replay sends nothing");

    settings.cache_mode = CacheMode::ReadWrite;
    assert_eq!(ask(&settings).await.error_type(), "llm_bad_response");
    assert_eq!(llm.calls(), 6, "asked again, re-asks and all");
}

#[tokio::test]
async fn a_structured_reply_cut_at_max_tokens_is_asked_again_with_more_room() {
    let llm = FakeLlm::start_on_request(|_, request| match request["max_tokens"].as_u64() {
        Some(tokens) if tokens > 512 => Reply::Json(json!({"a": 1})),
        _ => Reply::Cut("{\"a\": 1".into()),
    })
    .await;
    let reply = support::llm(&llm.base_url).structured::<Value>("", "hi", &schema()).await.unwrap();
    assert_eq!(reply.value["a"], 1);
    let requests = llm.requests.lock().unwrap();
    assert_eq!((requests[0]["max_tokens"].as_u64(), requests[1]["max_tokens"].as_u64()), (Some(512), Some(1024)));
}

#[tokio::test]
async fn a_text_reply_cut_at_max_tokens_is_kept_as_cut() {
    let llm = FakeLlm::start(|_| Reply::Cut("Step 1: the club is".into())).await;
    let reply = support::llm(&llm.base_url).text("", "hi").await.unwrap();
    assert_eq!((reply.value.as_str(), reply.stats.truncated, llm.calls()), ("Step 1: the club is", true, 1));
}

/// The text of every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut texts = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            texts.extend(walk(&path));
        } else {
            texts.push(std::fs::read_to_string(path).unwrap());
        }
    }
    texts
}

#[tokio::test]
async fn an_unreachable_endpoint_is_reported_after_retries() {
    // Bind then drop a listener: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut settings = support::settings(&format!("http://127.0.0.1:{port}/v1")).llm;
    // More failures than open the circuit: an endpoint never reached is not an outage to wait out.
    settings.max_retries = settings.breaker.failures + 1;
    let error = LlmClient::new(settings).text("", "hi").await.unwrap_err();
    assert_eq!(error.error_type(), "llm_unreachable");
    assert!(error.to_string().contains(&port.to_string()), "the message names the endpoint: {error}");
}

#[tokio::test]
async fn requests_carry_the_configured_parameters() {
    let llm = FakeLlm::start(|_| Reply::Text("ok".into())).await;
    let mut settings = support::settings(&llm.base_url).llm;
    settings.api_key_env = "LACUNA_TEST_KEY_THAT_IS_UNSET".into();
    LlmClient::new(settings).text("", "hi").await.unwrap();
    let request = &llm.requests.lock().unwrap()[0];
    assert_eq!(request["temperature"], 0.0);
    assert_eq!(request["messages"].as_array().unwrap().len(), 1, "an empty system prompt is not sent");
}

#[tokio::test]
async fn a_429_is_retried_no_sooner_than_its_retry_after() {
    let calls = AtomicUsize::new(0);
    let llm = FakeLlm::start(move |_| match calls.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::Throttled(2),
        _ => Reply::Text("ok".into()),
    })
    .await;
    let started = std::time::Instant::now();
    support::llm(&llm.base_url).text("", "hi").await.unwrap();
    // Our own backoff is 10 ms here: only the server's word explains a wait this long.
    assert!(started.elapsed() >= Duration::from_secs(2), "asked again after {:?}", started.elapsed());
    assert_eq!(llm.calls(), 2);
}

/// An endpoint that answered once and then goes down: calls neither fail nor hammer it. They wait
/// while one probe at a time checks it, and all go through once it is back.
#[tokio::test]
async fn calls_wait_for_an_endpoint_that_went_down_instead_of_failing() {
    let down = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicUsize::new(0));
    let (is_down, failures) = (down.clone(), failed.clone());
    let llm = FakeLlm::start(move |_| {
        if is_down.load(Ordering::SeqCst) {
            failures.fetch_add(1, Ordering::SeqCst);
            Reply::Status(503)
        } else {
            Reply::Text("ok".into())
        }
    })
    .await;
    let mut settings = support::settings(&llm.base_url).llm;
    (settings.breaker.probe_ms, settings.breaker.max_probe_ms) = (200, 400);
    let client = LlmClient::new(settings.clone());
    client.text("", "hi").await.unwrap();

    down.store(true, Ordering::SeqCst);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.text("", "hi").await })
        })
        .collect();
    // Without the circuit every call would have failed after its 4 tries, 10-80 ms apart.
    tokio::time::sleep(Duration::from_secs(3)).await;
    down.store(false, Ordering::SeqCst);
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().value, "ok");
    }
    let failed = failed.load(Ordering::SeqCst);
    // The calls in flight (4, `max_concurrency`) fail until the circuit opens; after that only
    // probes go out, one per 200-400 ms.
    assert!(failed < 4 * 2 + 3_000 / 160, "{failed} failed requests: the endpoint was hammered, not probed");
    let opened = lacuna::metrics::METRICS.llm_circuit_opened.with_label_values(&[&settings.base_url]).get();
    assert!(opened >= 1, "the circuit opened");
}

#[tokio::test]
async fn a_call_gives_up_once_the_circuit_was_open_for_max_wait() {
    let calls = AtomicUsize::new(0);
    let llm = FakeLlm::start(move |_| match calls.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::Text("ok".into()),
        _ => Reply::Status(503),
    })
    .await;
    let mut settings = support::settings(&llm.base_url).llm;
    (settings.breaker.failures, settings.breaker.probe_ms, settings.breaker.max_wait_ms) = (2, 100, 1_000);
    let client = LlmClient::new(settings);
    client.text("", "hi").await.unwrap();
    let error = client.text("", "hi").await.unwrap_err();
    assert_eq!(error.error_type(), "llm_unreachable");
    assert!(error.to_string().contains("circuit open"), "{error}");
}
