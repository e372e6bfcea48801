use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lacuna::actors::clients::{LlmClient, LlmError, Schema};
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
async fn broken_json_is_a_clear_bad_response() {
    let llm = FakeLlm::start(|_| Reply::Text("the answer is {a: seven".into())).await;
    let error = support::llm(&llm.base_url).structured::<Value>("", "hi", &schema()).await.unwrap_err();
    assert_eq!(error.error_type(), "llm_bad_response");
}

#[tokio::test]
async fn an_unreachable_endpoint_is_reported_after_retries() {
    // Bind then drop a listener: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut settings = support::settings(&format!("http://127.0.0.1:{port}/v1")).llm;
    settings.max_retries = 1;
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
