//! `lacuna serve` over real HTTP, with the real index and re-ranker and a fake OpenAI-protocol LLM:
//! the SSE stream of a two-hop question in order and resumable, 429 past the open bound, 401 without
//! the token, clear errors for bad bodies, idempotent submission, and 500 questions under load each
//! ending in exactly one record.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use lacuna::config::Settings;
use lacuna::pipelines::{PipelineKind, Transport};
use lacuna::serve::{ServeOptions, Server, start};
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};
use support::fake_meili::FakeMeili;
use support::scripted::{HUGO_QUESTION_ID, hugo_script};

async fn serve(settings: &Settings, pipelines: &[PipelineKind]) -> Server {
    let loaded = settings.clone();
    let options =
        ServeOptions { transport: Transport::InProcess, pipelines: pipelines.to_vec(), listen: "127.0.0.1:0".into() };
    start(settings, options, move |_| Ok(support::parts(&loaded))).await.expect("serve starts")
}

/// A serve replica over Kafka for MIGRES, with no stages of its own.
async fn kafka_serve(settings: &Settings) -> Server {
    let options = ServeOptions {
        transport: Transport::Kafka,
        pipelines: vec![PipelineKind::Migres],
        listen: "127.0.0.1:0".into(),
    };
    start(settings, options, |_| unreachable!("no stages run in a Kafka serve")).await.unwrap()
}

fn url(server: &Server, path: &str) -> String {
    format!("http://{}{path}", server.address)
}

/// A reader that answers every VANILLA question after `delay`.
fn reader_after(delay: Duration) -> impl Fn(&str) -> Reply + Send + Sync + 'static {
    move |prompt| match prompt_kind(prompt) {
        Prompt::Reader => Reply::Delayed(
            delay,
            Box::new(Reply::Json(json!({"answer": "Paris", "confidence": 5, "explanation": "read it"}))),
        ),
        _ => Reply::Status(400),
    }
}

/// Few passages to re-rank: these tests are about the API, not the method.
fn vanilla_settings(llm: &FakeLlm) -> Settings {
    let mut settings = support::settings(&llm.base_url);
    settings.migres.retrieve_top_n = 3;
    settings
}

/// A GET with a bearer token, its body as JSON.
async fn get_json(client: &reqwest::Client, url: &str, token: &str) -> Value {
    client.get(url).bearer_auth(token).send().await.unwrap().json().await.unwrap()
}

/// One Server-Sent Event as parsed by a client.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    id: usize,
    name: String,
    data: Value,
}

/// Reads a whole event stream (it ends after the record).
async fn read_events(client: &reqwest::Client, url: &str, last_event_id: Option<usize>) -> Vec<Sse> {
    let mut request = client.get(url);
    if let Some(last) = last_event_id {
        request = request.header("last-event-id", last.to_string());
    }
    let mut response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut text = String::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), response.chunk()).await.unwrap().unwrap() {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    text.split("\n\n")
        .filter(|block| block.contains("data: "))
        .map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_else(|| panic!("{name} in {block}"))
                    .to_string()
            };
            Sse {
                id: field("id: ").parse().unwrap(),
                name: field("event: "),
                data: serde_json::from_str(&field("data: ")).unwrap(),
            }
        })
        .collect()
}

#[actix::test]
async fn a_questions_steps_stream_in_order_end_with_its_record_and_resume_after_last_event_id() {
    let llm = FakeLlm::start(hugo_script).await;
    let settings = support::settings(&llm.base_url);
    let server = serve(&settings, &[PipelineKind::Migres]).await;
    let client = reqwest::Client::new();
    let (question, answers, _) = support::question("hotpotqa", HUGO_QUESTION_ID);

    let response = client
        .post(url(&server, "/v1/questions"))
        .json(&json!({"id": "hugo", "question": question}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    assert_eq!(response.headers()["location"], "/v1/questions/hugo");
    let events = read_events(&client, &url(&server, "/v1/questions/hugo/events"), None).await;

    // Numbered from 0 without a gap, opened by `accepted`, closed by the record.
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), (0..events.len()).collect::<Vec<_>>());
    assert_eq!(events[0].name, "accepted");
    let record = events.last().unwrap();
    assert_eq!(record.name, "record");
    assert_eq!(record.data["status"], "answered");
    assert_eq!(record.data["answer"], answers[0]);

    // The loop as it happened: iteration 1 searches, keeps a fact, finds something missing and writes
    // a query; iteration 2 keeps the second fact and decides.
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    let position = |name: &str, nth: usize| {
        names
            .iter()
            .enumerate()
            .filter(|(_, n)| **n == name)
            .nth(nth)
            .unwrap_or_else(|| panic!("{name} #{nth} in {names:?}"))
            .0
    };
    let iteration = |n: u64| events.iter().position(|e| e.name == "iteration" && e.data["iteration"] == n).unwrap();
    assert!(iteration(1) < position("retrieved", 0));
    assert!(position("passage_scored", 0) < position("fact_kept", 0));
    assert!(position("fact_kept", 0) < position("decision", 0));
    assert_eq!(events[position("decision", 0)].data["step"]["answerable"], false);
    assert!(position("decision", 0) < position("queries_written", 0));
    assert!(position("queries_written", 0) < iteration(2));
    assert!(iteration(2) < position("fact_kept", 1));
    let last_decision = &events[position("decision", 1)];
    assert_eq!(last_decision.data["step"]["answer"], answers[0]);
    assert!(last_decision.id < record.id);
    // Every step of the record's trace was streamed once, none twice.
    let streamed = events.iter().filter(|e| e.data.get("step").is_some()).count();
    assert_eq!(streamed, record.data["trace"].as_array().unwrap().len());

    // A client that lost the stream after event k reads the rest, the same events, from k + 1.
    let k = events.len() / 2;
    let resumed = read_events(&client, &url(&server, "/v1/questions/hugo/events"), Some(k)).await;
    assert_eq!(resumed, events[k + 1..].to_vec());

    let done: Value = client.get(url(&server, "/v1/questions/hugo")).send().await.unwrap().json().await.unwrap();
    assert_eq!(done, record.data, "GET returns the record once done");
    server.stop();
}

#[actix::test]
async fn past_the_open_bound_a_post_gets_429_with_retry_after_and_later_gets_in() {
    let llm = FakeLlm::start(reader_after(Duration::from_millis(1500))).await;
    let mut settings = vanilla_settings(&llm);
    settings.serve.max_open_questions = 2;
    settings.serve.retry_after_s = 3;
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let post = |body: Value| client.post(url(&server, "/v1/questions")).json(&body).send();

    let three = json!({"questions": [{"question": "Where is the Louvre?"}, {"question": "Where is the Prado?"}, {"question": "Where is the Tate?"}]});
    let refused = post(three).await.unwrap();
    assert_eq!(refused.status(), 429, "a batch is taken whole or not at all");
    assert_eq!(refused.headers()["retry-after"], "3");
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "too_many_open");

    let two = post(json!({"questions": [{"question": "Where is the Louvre?"}, {"question": "Where is the Prado?"}]}))
        .await
        .unwrap();
    assert_eq!(two.status(), 202);
    let accepted: Value = two.json().await.unwrap();
    assert_eq!(post(json!({"question": "Where is the Tate?"})).await.unwrap().status(), 429);

    for question in accepted["questions"].as_array().unwrap() {
        let record = server.registry.wait_record(question["id"].as_str().unwrap(), Duration::from_secs(60)).await;
        assert_eq!(record.expect("a record")["answer"], "Paris");
    }
    assert_eq!(post(json!({"question": "Where is the Tate?"})).await.unwrap().status(), 202, "room again");
    server.stop();
}

#[actix::test]
async fn with_a_token_configured_v1_needs_it_and_the_page_and_probes_do_not() {
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let mut settings = vanilla_settings(&llm);
    settings.serve.token_env = "LACUNA_TEST_SERVE_TOKEN_UNSET".into();
    let unset = lacuna::serve::start(
        &settings,
        ServeOptions {
            transport: Transport::InProcess,
            pipelines: vec![PipelineKind::Vanilla],
            listen: "127.0.0.1:0".into(),
        },
        |_| unreachable!(),
    )
    .await;
    let error = unset.err().expect("a named but unset token variable is refused").to_string();
    assert!(error.contains("LACUNA_TEST_SERVE_TOKEN_UNSET"), "{error}");

    // SAFETY: set before the server starts, read once by it; no other test reads this variable.
    unsafe { std::env::set_var("LACUNA_TEST_SERVE_TOKEN", "s3cret-token") };
    settings.serve.token_env = "LACUNA_TEST_SERVE_TOKEN".into();
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let body = json!({"question": "Where is the Louvre?"});

    let without = client.post(url(&server, "/v1/questions")).json(&body).send().await.unwrap();
    assert_eq!(without.status(), 401);
    assert_eq!(without.headers()["www-authenticate"], "Bearer");
    assert_eq!(without.json::<Value>().await.unwrap()["error"]["code"], "unauthorized");
    for wrong in ["Bearer s3cret-toke", "Bearer s3cret-token2", "s3cret-token", "Basic s3cret-token"] {
        let response = client.get(url(&server, "/v1/questions")).header("authorization", wrong).send().await.unwrap();
        assert_eq!(response.status(), 401, "{wrong}");
    }
    let with = client.post(url(&server, "/v1/questions")).bearer_auth("s3cret-token").json(&body).send().await.unwrap();
    assert_eq!(with.status(), 202);
    assert_eq!(server.registry.open() + server.registry.list(10).len(), 2, "only the authorised question got in");
    for public in ["/", "/openapi.json", "/healthz", "/readyz", "/metrics"] {
        assert_eq!(client.get(url(&server, public)).send().await.unwrap().status(), 200, "{public}");
    }
    server.stop();
}

#[actix::test]
async fn bad_requests_get_clear_json_errors_and_nothing_is_accepted() {
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let mut settings = vanilla_settings(&llm);
    settings.serve.max_batch = 3;
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let post = |body: String| {
        client.post(url(&server, "/v1/questions")).header("content-type", "application/json").body(body).send()
    };

    let megabyte_question = json!({"question": "why?".repeat(250_000)}).to_string();
    let two_megabytes = json!({"question": "x".repeat(2_000_000)}).to_string();
    let cases: Vec<(String, u16, &str, &str)> = vec![
        ("{not json".into(), 400, "bad_request", "not JSON"),
        (json!({"question": "Where?", "colour": "red"}).to_string(), 400, "bad_request", "unknown field `colour`"),
        (json!({"question": "   "}).to_string(), 400, "bad_request", "the question is empty"),
        (json!({"text": "Where?"}).to_string(), 400, "bad_request", "unknown field `text`"),
        (json!({"id": "q1"}).to_string(), 400, "bad_request", "missing field `question`"),
        (json!({"question": "Where?", "pipeline": "rqrag"}).to_string(), 400, "bad_request", "not served here"),
        (json!({"question": "Where?", "id": "a/b"}).to_string(), 400, "bad_request", "letters, digits"),
        (json!({"questions": []}).to_string(), 400, "bad_request", "1 to 3 questions"),
        (
            json!({"questions": [{"question": "a"}, {"question": "b"}, {"question": "c"}, {"question": "d"}]})
                .to_string(),
            400,
            "bad_request",
            "1 to 3 questions",
        ),
        (
            json!({"questions": [{"question": "a", "id": "x"}, {"question": "b", "id": "x"}]}).to_string(),
            400,
            "bad_request",
            "same id",
        ),
        (
            json!({"questions": [{"question": "fine"}, {"question": ""}]}).to_string(),
            400,
            "bad_request",
            "questions[1]: the question is empty",
        ),
        (megabyte_question, 400, "bad_request", "1000000 characters, more than run.max_question_chars = 2000"),
        (two_megabytes, 413, "too_large", "over 1048576 bytes"),
    ];
    for (body, status, code, message) in cases {
        let response = post(body.clone()).await.unwrap();
        assert_eq!(response.status(), status, "{}", &body[..body.len().min(80)]);
        assert_eq!(response.headers()["content-type"], "application/json");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], code);
        let text = error["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{text:?} should say {message:?}");
    }
    let unknown = client.get(url(&server, "/v1/questions/nobody")).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    let wrong_method = client.delete(url(&server, "/v1/questions")).send().await.unwrap();
    assert_eq!(wrong_method.status(), 405);
    assert_eq!(server.registry.open(), 0);
    assert!(server.registry.list(10).is_empty(), "no bad request left a question behind");
    assert_eq!(llm.calls(), 0);
    server.stop();
}

#[actix::test]
async fn a_repeated_post_returns_the_same_question_never_a_second_one() {
    let llm = FakeLlm::start(reader_after(Duration::from_millis(300))).await;
    let server = serve(&vanilla_settings(&llm), &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let post = |body: Value, key: Option<&str>| {
        let mut request = client.post(url(&server, "/v1/questions")).json(&body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send()
    };
    let louvre = json!({"question": "Where is the Louvre?"});
    let first: Value = post(louvre.clone(), Some("k-1")).await.unwrap().json().await.unwrap();
    let again: Value = post(louvre.clone(), Some("k-1")).await.unwrap().json().await.unwrap();
    assert_eq!(first["id"], again["id"]);
    assert_eq!(
        (first["questions"][0]["duplicate"].clone(), again["questions"][0]["duplicate"].clone()),
        (json!(false), json!(true))
    );

    let mine = json!({"id": "mine-1", "question": "Where is the Prado?"});
    assert_eq!(post(mine.clone(), None).await.unwrap().status(), 202);
    let repeated: Value = post(mine, None).await.unwrap().json().await.unwrap();
    assert_eq!(repeated["id"], "mine-1");
    assert_eq!(repeated["questions"][0]["duplicate"], true);
    let conflict = post(json!({"id": "mine-1", "question": "Where is the Tate?"}), None).await.unwrap();
    assert_eq!(conflict.status(), 409);

    // POST /v1/answer with the same key waits for that same question's record.
    let mut waited = json!({"timeout_ms": 30_000});
    waited["question"] = louvre["question"].clone();
    let answered =
        client.post(url(&server, "/v1/answer")).header("idempotency-key", "k-1").json(&waited).send().await.unwrap();
    assert_eq!(answered.status(), 200);
    let record: Value = answered.json().await.unwrap();
    assert_eq!(record["question_id"], first["id"]);
    server.registry.wait_record("mine-1", Duration::from_secs(30)).await.expect("a record");
    assert_eq!(llm.calls_of(Prompt::Reader), 2, "two distinct questions, each answered once");
    server.stop();
}

#[actix::test]
async fn post_answer_waits_for_the_record_or_hands_back_the_location() {
    let llm = FakeLlm::start(reader_after(Duration::from_millis(800))).await;
    let server = serve(&vanilla_settings(&llm), &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let quick = client
        .post(url(&server, "/v1/answer"))
        .json(&json!({"question": "Where is the Louvre?", "timeout_ms": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(quick.status(), 202);
    let location = quick.headers()["location"].to_str().unwrap().to_string();
    let waited =
        client.post(url(&server, "/v1/answer")).json(&json!({"question": "Where is the Prado?"})).send().await.unwrap();
    assert_eq!(waited.status(), 200);
    assert_eq!(waited.json::<Value>().await.unwrap()["answer"], "Paris");
    // The two questions run side by side, so the first may finish after the second: wait for it.
    let first = location.trim_start_matches("/v1/questions/");
    server.registry.wait_record(first, Duration::from_secs(60)).await;
    let later: Value = client.get(url(&server, &location)).send().await.unwrap().json().await.unwrap();
    assert_eq!(later["status"], "answered", "the question went on past the wait: {later}");
    server.stop();
}

#[actix::test]
async fn five_hundred_questions_posted_at_once_end_as_five_hundred_records_none_twice() {
    let llm = FakeLlm::start(reader_after(Duration::from_millis(20))).await;
    let mut settings = vanilla_settings(&llm);
    settings.serve.retry_after_s = 1;
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let base = url(&server, "/v1/questions");
    // 64 clients for 500 questions, as fast as they can; a 429 is retried after its Retry-After.
    let mut clients = Vec::new();
    for worker in 0..64 {
        let (client, base) = (client.clone(), base.clone());
        clients.push(tokio::spawn(async move {
            let mut throttled = 0;
            for n in (worker..500).step_by(64) {
                let body = json!({"id": format!("load-{n}"), "question": format!("Where is museum number {n}?")});
                loop {
                    let response = client.post(&base).json(&body).send().await.unwrap();
                    match response.status().as_u16() {
                        202 => break,
                        429 => {
                            throttled += 1;
                            let after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
                            tokio::time::sleep(Duration::from_secs(after)).await;
                        }
                        other => panic!("unexpected {other}: {}", response.text().await.unwrap()),
                    }
                }
            }
            throttled
        }));
    }
    let mut throttled = 0;
    for handle in clients {
        throttled += handle.await.unwrap();
    }
    assert!(throttled > 0, "64 clients over a bound of 32 must have met a 429");
    let mut statuses: HashMap<String, usize> = HashMap::new();
    for n in 0..500 {
        let record = server.registry.wait_record(&format!("load-{n}"), Duration::from_secs(120)).await;
        let record = record.unwrap_or_else(|| panic!("no record for load-{n}"));
        *statuses.entry(record["status"].as_str().unwrap().to_string()).or_default() += 1;
    }
    assert_eq!(statuses.get("answered"), Some(&500), "{statuses:?}");
    let asked: BTreeSet<String> =
        llm.prompts.lock().unwrap().iter().filter(|p| prompt_kind(p) == Prompt::Reader).cloned().collect();
    assert_eq!(llm.calls_of(Prompt::Reader), 500, "each question answered once");
    assert_eq!(asked.len(), 500);
    assert_eq!(server.registry.open(), 0);
    eprintln!("500 questions, {throttled} answered 429 and retried");
    server.stop();
}

#[test]
fn the_openapi_document_describes_every_route_the_server_has() {
    let document: Value = serde_json::from_str(include_str!("../serve/openapi.json")).unwrap();
    let paths: BTreeSet<&str> = document["paths"].as_object().unwrap().keys().map(String::as_str).collect();
    let routes = BTreeSet::from([
        "/",
        "/openapi.json",
        "/metrics",
        "/healthz",
        "/readyz",
        "/v1/questions",
        "/v1/questions/{id}",
        "/v1/questions/{id}/events",
        "/v1/answer",
        "/v1/stages",
        "/v1/documents",
        "/v1/documents/{id}",
    ]);
    assert_eq!(paths, routes);
    let api = [include_str!("../serve/api.rs"), include_str!("../serve/documents.rs")].concat();
    for route in routes.iter().filter(|r| r.starts_with("/v1")) {
        assert!(api.contains(&format!("\"{route}\"")), "serve/api.rs or serve/documents.rs routes {route}");
    }
}

/// A `Last-Event-ID` outside the event ids the document allows (0 to 2^31 - 1) is refused with a
/// clear 400, on the header and on the query parameter alike: not a dropped connection (an
/// overflowing `+ 1` panicked the handler in debug builds) and not a silently empty stream.
#[actix::test]
async fn a_last_event_id_out_of_range_gets_400() {
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let server = serve(&vanilla_settings(&llm), &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let posted = client.post(url(&server, "/v1/questions")).json(&json!({"id": "range", "question": "Where?"}));
    assert_eq!(posted.send().await.unwrap().status(), 202);
    let events = url(&server, "/v1/questions/range/events");
    for last in ["18446744073709551615", "2147483648", "-1"] {
        let by_header = client.get(&events).header("last-event-id", last).send().await;
        let status = by_header.as_ref().map(|r| r.status().as_u16()).ok();
        assert_eq!(status, Some(400), "Last-Event-ID: {last} answered {by_header:?}");
        let by_query = client.get(format!("{events}?last_event_id={last}")).send().await;
        let status = by_query.as_ref().map(|r| r.status().as_u16()).ok();
        assert_eq!(status, Some(400), "?last_event_id={last} answered {by_query:?}");
    }
    let resumed = client.get(&events).header("last-event-id", "2147483647").send().await.unwrap();
    assert_eq!(resumed.status(), 200, "the largest id the document allows is taken");
    server.stop();
}

/// Only JSON bodies are read: a cross-site form can send text/plain without a preflight, and
/// with no token configured it would otherwise submit questions and spend LLM budget.
#[actix::test]
async fn a_body_that_is_not_declared_json_gets_415_and_nothing_is_accepted() {
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let server = serve(&vanilla_settings(&llm), &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let body = json!({"question": "Where is the Louvre?"}).to_string();
    for route in ["/v1/questions", "/v1/answer"] {
        for content_type in [Some("text/plain"), Some("application/x-www-form-urlencoded"), None] {
            let mut request = client.post(url(&server, route)).body(body.clone());
            if let Some(content_type) = content_type {
                request = request.header("content-type", content_type);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 415, "{route} with {content_type:?}");
            let error: Value = response.json().await.unwrap();
            assert_eq!(error["error"]["code"], "unsupported_media_type", "{error}");
        }
    }
    assert_eq!(server.registry.open() + server.registry.list(10).len(), 0, "nothing was accepted");
    let charset = client
        .post(url(&server, "/v1/questions"))
        .header("content-type", "application/json; charset=utf-8")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(charset.status(), 202, "parameters such as charset are fine");
    server.stop();
}

/// A client that sends its headers and then trickles its body gets 408 once `serve.body_timeout_ms`
/// passed, and nothing of its question is accepted: it cannot hold a handler for long.
#[actix::test]
async fn a_body_not_whole_within_the_body_timeout_gets_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let mut settings = vanilla_settings(&llm);
    settings.serve.body_timeout_ms = 300;
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let mut stream = tokio::net::TcpStream::connect(server.address).await.unwrap();
    let head = "POST /v1/questions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(b"{\"question\": ").await.unwrap();
    let mut reply = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut reply)).await;
    let read = read.expect("an answer before the client sends the rest").unwrap();
    let reply = String::from_utf8_lossy(&reply[..read]);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("\"timeout\""), "{reply}");
    assert_eq!(server.registry.open(), 0);
    server.stop();
}

/// Past `serve.max_event_streams` open streams a GET of events gets 503 with Retry-After, and a
/// stream that closes frees its place.
#[actix::test]
async fn past_the_stream_cap_an_events_request_gets_503_with_retry_after() {
    let llm = FakeLlm::start(reader_after(Duration::from_secs(60))).await;
    let mut settings = vanilla_settings(&llm);
    settings.serve.max_event_streams = 1;
    settings.serve.retry_after_s = 2;
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let posted = client.post(url(&server, "/v1/questions")).json(&json!({"id": "slow", "question": "Where?"}));
    assert_eq!(posted.send().await.unwrap().status(), 202);
    let events = url(&server, "/v1/questions/slow/events");
    let first = client.get(&events).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let second = client.get(&events).send().await.unwrap();
    assert_eq!(second.status(), 503, "a second stream past a cap of one");
    assert_eq!(second.headers().get("retry-after").map(|v| v.to_str().unwrap()), Some("2"));
    drop(first);
    let mut third = None;
    for _ in 0..50 {
        let response = client.get(&events).send().await.unwrap();
        if response.status() == 200 {
            third = Some(response);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(third.is_some(), "the closed stream's place was never freed");
    server.stop();
}

/// `GET /healthz` on a raw connection, read until the server closes it.
async fn get_healthz(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply)).await;
    read.expect("an answer, then the connection closed").unwrap();
    String::from_utf8_lossy(&reply).into_owned()
}

/// Past `serve.max_connections` a connection is answered 503 with Retry-After and closed, however
/// many idle ones hold the others; one that closes frees its place.
#[actix::test]
async fn past_the_connection_cap_a_connection_gets_503_and_is_closed() {
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let mut settings = vanilla_settings(&llm);
    settings.serve.max_connections = 2;
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    // Two slow clients that never send a request.
    let idle_one = tokio::net::TcpStream::connect(server.address).await.unwrap();
    let _idle_two = tokio::net::TcpStream::connect(server.address).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = tokio::net::TcpStream::connect(server.address).await.unwrap();
    let reply = get_healthz(&mut third).await;
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.to_ascii_lowercase().contains("retry-after: 1"), "{reply}");
    drop(idle_one);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fourth = tokio::net::TcpStream::connect(server.address).await.unwrap();
    let reply = get_healthz(&mut fourth).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    server.stop();
}

/// A stream on a question that never finishes ends after `serve.event_stream_max_s`; the client
/// resumes with `Last-Event-ID` if it still cares.
#[actix::test]
async fn an_event_stream_ends_after_its_maximum_life() {
    let llm = FakeLlm::start(reader_after(Duration::from_secs(600))).await;
    let mut settings = vanilla_settings(&llm);
    settings.serve.event_stream_max_s = 1;
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let posted = client.post(url(&server, "/v1/questions")).json(&json!({"id": "never", "question": "Where?"}));
    assert_eq!(posted.send().await.unwrap().status(), 202);
    let mut response = client.get(url(&server, "/v1/questions/never/events")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let ended =
        tokio::time::timeout(Duration::from_secs(20), async { while let Ok(Some(_)) = response.chunk().await {} })
            .await;
    assert!(ended.is_ok(), "the stream of an unfinished question was still open after 20 s");
    server.stop();
}

/// The document is generated from the handlers; the committed copy is what the server serves, so a
/// client can read the API without starting one. Every documented operation answers (none falls
/// through to the 404 of unknown routes), and every status is listed: no catch-all `default`.
#[actix::test]
async fn the_served_openapi_document_is_the_committed_copy_and_every_operation_answers() {
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let server = serve(&vanilla_settings(&llm), &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let served = client.get(url(&server, "/openapi.json")).send().await.unwrap().text().await.unwrap();
    let committed = include_str!("../serve/openapi.json");
    if served != committed && std::env::var_os("LACUNA_WRITE_OPENAPI").is_some() {
        std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/serve/openapi.json"), &served).unwrap();
    }
    assert!(served == committed, "serve/openapi.json is stale: rerun this test with LACUNA_WRITE_OPENAPI=1");
    let document: Value = serde_json::from_str(&served).unwrap();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            let responses = operation["responses"].as_object().unwrap();
            assert!(!responses.contains_key("default"), "{method} {path} lists a catch-all response");
            let concrete = path.replace("{id}", "nobody");
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let request =
                client.request(method.clone(), url(&server, &concrete)).header("content-type", "application/json");
            let response = request.body("{}").send().await.unwrap();
            let status = response.status().as_str().to_string();
            let body = response.text().await.unwrap_or_default();
            assert!(responses.contains_key(&status), "{method} {concrete} answered {status}, not documented");
            assert!(!body.contains("no route"), "{method} {path} is documented but not routed");
        }
    }
    server.stop();
}

/// Over Kafka, two serve replicas in front of the stages: a question posted to one is streamed and
/// answered by the other too (each reads every answer and progress partition in its own groups), and
/// posting its id again to the other returns the same question.
#[actix::test]
async fn over_kafka_any_replica_streams_and_answers_any_question() {
    let llm = FakeLlm::start(hugo_script).await;
    let mut settings = support::cluster::settings("serve", &llm.base_url);
    settings.bus.progress = true;
    let bus: std::sync::Arc<dyn lacuna::topics::Bus> = PipelineKind::Migres.kafka_bus(&settings).await.unwrap();
    let stages = lacuna::pipelines::Pipeline::start_on(PipelineKind::Migres, bus, &settings, support::parts(&settings))
        .await
        .unwrap();
    let replica = |name: &str| {
        let mut settings = settings.clone();
        settings.serve.replica_id = name.into();
        async move {
            let options = ServeOptions {
                transport: Transport::Kafka,
                pipelines: vec![PipelineKind::Migres],
                listen: "127.0.0.1:0".into(),
            };
            start(&settings, options, |_| unreachable!("no stages run in a Kafka serve")).await.unwrap()
        }
    };
    let (a, b) = (replica("a").await, replica("b").await);
    let client = reqwest::Client::new();
    let (question, answers, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let posted = client
        .post(url(&a, "/v1/questions"))
        .json(&json!({"id": "kafka-hugo", "question": question}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202, "accepted once the broker acknowledged it");

    // Generous: ten consumer groups join on a 2-core machine running other tests beside this one.
    let on_a = a.registry.wait_record("kafka-hugo", Duration::from_secs(240)).await.expect("a record on replica a");
    let mut on_b = None;
    for _ in 0..100 {
        on_b = b.registry.record("kafka-hugo");
        if on_b.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(on_b.as_ref(), Some(&on_a), "both replicas hold the one record");
    assert_eq!(on_a["answer"], answers[0]);
    let streamed = read_events(&client, &url(&b, "/v1/questions/kafka-hugo/events"), None).await;
    assert_eq!(streamed.last().unwrap().name, "record");
    assert!(streamed.iter().any(|e| e.name == "fact_kept"), "replica b streams the steps too");

    let again: Value = client
        .post(url(&b, "/v1/questions"))
        .json(&json!({"id": "kafka-hugo", "question": question}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["questions"][0]["duplicate"], true, "the other replica knows the id: {again}");

    // One Idempotency-Key posted to both replicas at once, before either can know the other's
    // question: the same id from both, and the question runs once (the twin event is skipped).
    let calls = llm.calls();
    let post = |server: &Server| {
        let body = json!({"question": question});
        client.post(url(server, "/v1/questions")).header("idempotency-key", "kafka-key").json(&body).send()
    };
    let (via_a, via_b) = tokio::join!(post(&a), post(&b));
    let via_a: Value = via_a.unwrap().json().await.unwrap();
    let via_b: Value = via_b.unwrap().json().await.unwrap();
    assert_eq!(via_a["id"], via_b["id"], "one key, one question: {via_a} {via_b}");
    let id = via_a["id"].as_str().unwrap();
    let record = b.registry.wait_record(id, Duration::from_secs(240)).await.expect("a record for the keyed question");
    assert_eq!(record["answer"], answers[0]);
    // A twin that ran would be one stage behind the first copy: give it time to show.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(llm.calls() - calls, calls, "the keyed question cost what one question costs");
    a.stop();
    b.stop();
    stages.stop();
}

/// Over Kafka a replica starting up reads only `serve.replay_window_s` of the answers topic, not
/// all of it, and says it is ready only once it holds every record that was there when it started.
#[actix::test]
async fn over_kafka_a_new_replica_replays_its_window_and_is_ready_once_caught_up() {
    use lacuna::topics::{AnswerRecord, ErrorRecord, Event, VersionedAnswer};
    let llm = FakeLlm::start(hugo_script).await;
    let mut settings = support::cluster::settings("serve-window", &llm.base_url);
    let bus = PipelineKind::Migres.kafka_bus(&settings).await.unwrap();
    let publish = |id: String| {
        let record = AnswerRecord::Error(ErrorRecord {
            question_id: id,
            question: "Who?".into(),
            stage: "leaf".into(),
            error_type: "llm_timeout".into(),
            message: "published by the test".into(),
            trace: Vec::new(),
            provenance: None,
        });
        let bus = bus.clone();
        async move { lacuna::topics::Bus::publish(&*bus, VersionedAnswer::from(record).to_record()).await.unwrap() }
    };
    for n in 0..10 {
        publish(format!("old-{n}")).await;
    }
    // The window starts inside this 4 s gap, at its middle or up to a second before it, however
    // long the 200 publishes below take (on a topic just created, the first ones wait for a leader).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let middle = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in 0..200 {
        publish(format!("new-{n}")).await;
    }
    settings.serve.replay_window_s = middle.elapsed().as_secs() + 1;
    settings.serve.replica_id = "late".into();
    let server = kafka_serve(&settings).await;
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    while client.get(url(&server, "/readyz")).send().await.unwrap().status() != 200 {
        assert!(started.elapsed() < Duration::from_secs(120), "not ready within two minutes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let missing: Vec<usize> = (0..200).filter(|n| server.registry.record(&format!("new-{n}")).is_none()).collect();
    assert!(missing.is_empty(), "ready before it read {} of the records there at its start", missing.len());
    let old: Vec<usize> = (0..10).filter(|n| server.registry.record(&format!("old-{n}")).is_some()).collect();
    assert!(old.is_empty(), "{} records from before the replay window were read", old.len());
    server.stop();
}

/// RA-ISF's sub-questions stream as nodes of their own: each child's steps under its node ("1",
/// "2"), the split and the join under the root, and the children's steps that the joined parent's
/// trace repeats are not streamed twice.
#[actix::test]
async fn a_fanned_out_question_streams_each_sub_question_under_its_own_node() {
    let llm = FakeLlm::start(support::methods::methods_script).await;
    let mut settings = support::settings(&llm.base_url);
    settings.migres.retrieve_top_n = 8;
    settings.raisf.top_k = 3;
    let server = serve(&settings, &[PipelineKind::Raisf]).await;
    let client = reqwest::Client::new();
    let (question, answers, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let posted = client
        .post(url(&server, "/v1/questions"))
        .json(&json!({"id": "tree", "question": question}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202);
    let events = read_events(&client, &url(&server, "/v1/questions/tree/events"), None).await;
    let record = &events.last().unwrap().data;
    assert_eq!(record["answer"], answers[0]);

    let nodes: BTreeSet<&str> = events.iter().filter_map(|e| e.data["node"].as_str()).collect();
    assert_eq!(nodes, BTreeSet::from(["1", "2", "root"]));
    let root_kinds: Vec<&str> = events.iter().filter(|e| e.data["node"] == "root").map(|e| e.name.as_str()).collect();
    assert!(root_kinds.contains(&"fanned_out") && root_kinds.contains(&"joined"), "{root_kinds:?}");
    let fanned = events.iter().find(|e| e.name == "fanned_out").unwrap();
    let joined = events.iter().find(|e| e.name == "joined").unwrap();
    for child in ["1", "2"] {
        let steps: Vec<&Sse> =
            events.iter().filter(|e| e.data["node"] == child && e.data.get("step").is_some()).collect();
        assert!(!steps.is_empty(), "node {child} streamed its steps");
        assert!(
            steps.iter().all(|s| fanned.id < s.id && s.id < joined.id),
            "node {child}'s steps come between split and join"
        );
    }
    // Each step of the record's trace once: the root's own, and each child's under its node.
    let streamed = events.iter().filter(|e| e.data.get("step").is_some()).count();
    assert_eq!(streamed, record["trace"].as_array().unwrap().len());
    server.stop();
}

#[actix::test]
async fn cors_is_off_until_an_origin_is_listed() {
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let client = reqwest::Client::new();
    for (origins, allowed) in [(vec![], false), (vec!["https://chat.example.com".to_string()], true)] {
        let mut settings = vanilla_settings(&llm);
        settings.serve.cors_origins = origins;
        let server = serve(&settings, &[PipelineKind::Vanilla]).await;
        for origin in ["https://chat.example.com", "https://evil.example.com"] {
            let response = client.get(url(&server, "/v1/questions")).header("origin", origin).send().await.unwrap();
            let granted =
                response.headers().get("access-control-allow-origin").map(|v| v.to_str().unwrap().to_string());
            let expected = (allowed && origin == "https://chat.example.com").then(|| origin.to_string());
            assert_eq!(granted, expected, "{origin} with cors_origins allowed={allowed}");
        }
        let preflight = client
            .request(reqwest::Method::OPTIONS, url(&server, "/v1/questions"))
            .header("origin", "https://chat.example.com")
            .header("access-control-request-method", "POST")
            .send()
            .await
            .unwrap();
        assert_eq!(preflight.status(), 204);
        assert_eq!(preflight.headers().contains_key("access-control-allow-origin"), allowed);
        server.stop();
    }
}

/// The document routes, in process: behind their own token (the questions' token does not open
/// them), a posted document is committed to the index the running pipeline searches and is cited by
/// the next answer; GET shows its passages, DELETE takes it back; bad documents get clear errors.
/// The index is a scratch copy: these routes write it.
#[actix::test]
async fn the_document_routes_change_the_live_index_behind_a_token_of_their_own() {
    let llm = FakeLlm::start(support::scripted::made_up_reader).await;
    let mut settings = vanilla_settings(&llm);
    let index = support::scratch_dir("serve-documents").join("index");
    let _ = std::fs::remove_dir_all(&index);
    let corpus = support::scratch_dir("serve-documents").join("corpus.jsonl");
    let real = std::fs::read_to_string(support::data_dir().join("hotpotqa/corpus.jsonl")).unwrap();
    std::fs::write(&corpus, real.lines().take(200).collect::<Vec<_>>().join("\n")).unwrap();
    lacuna::actors::clients::TantivySearch::build(&index, &corpus).unwrap();
    settings.search.index_dir = index;
    // SAFETY: set before the server starts, read once by it; no other test reads these variables.
    unsafe {
        std::env::set_var("LACUNA_TEST_QUESTIONS_TOKEN", "ask-token");
        std::env::set_var("LACUNA_TEST_DOCUMENTS_TOKEN", "write-token");
    }
    settings.serve.token_env = "LACUNA_TEST_QUESTIONS_TOKEN".into();
    settings.serve.documents_token_env = "LACUNA_TEST_DOCUMENTS_TOKEN".into();
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let documents = url(&server, "/v1/documents");
    let made_up = json!({"id": "varnholt", "title": "Varnholt shoals",
        "text": "The Varnholt shoals were first charted in 1871 by the lighthouse keeper Ada Quillmoor.",
        "metadata": {"url": "https://example.org/varnholt"}});

    for token in [None, Some("ask-token")] {
        let mut request = client.post(&documents).json(&made_up);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        assert_eq!(request.send().await.unwrap().status(), 401, "{token:?} does not open the document routes");
    }
    let refused = |body: Value, status: u16, words: &'static str| {
        let request = client.post(&documents).bearer_auth("write-token").json(&body);
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), status, "{body}");
            let message = response.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
            assert!(message.contains(words), "{message}");
        }
    };
    refused(json!({"id": "a#1", "text": "x"}), 400, "'#'").await;
    refused(json!({"id": "empty", "text": "  "}), 400, "has no text").await;
    refused(json!({"id": "big", "text": "x".repeat(600_000)}), 413, "over search.max_document_bytes").await;
    let plain = client.post(&documents).bearer_auth("write-token").body(made_up.to_string()).send().await.unwrap();
    assert_eq!(plain.status(), 415);

    let ask = async |id: &str| -> Value {
        let body = json!({"id": id, "question": "Which lighthouse keeper first charted the Varnholt shoals?"});
        let response =
            client.post(url(&server, "/v1/answer")).bearer_auth("ask-token").json(&body).send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.json::<Value>().await.unwrap()
    };
    let cited = |record: &Value| record["passages"].as_array().unwrap().iter().any(|p| p["id"] == "varnholt");
    assert!(!cited(&ask("before").await));

    let posted = client.post(&documents).bearer_auth("write-token").json(&made_up).send().await.unwrap();
    assert_eq!(posted.status(), 200);
    let posted: Value = posted.json().await.unwrap();
    assert_eq!((posted["status"].as_str(), posted["passages"].as_u64()), (Some("applied"), Some(1)));
    let got = get_json(&client, &format!("{documents}/varnholt"), "write-token").await;
    assert_eq!(got["metadata"]["url"], "https://example.org/varnholt");
    assert_eq!(got["passages"][0]["id"], "varnholt");
    // The running pipeline's reader follows commits within about a second.
    let mut after = Value::Null;
    for attempt in 0..30 {
        after = ask(&format!("after-{attempt}")).await;
        if cited(&after) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(cited(&after), "the answer cites the posted document: {after}");
    assert_eq!(after["answer"], "Ada Quillmoor");

    let deleted = client.delete(format!("{documents}/varnholt")).bearer_auth("write-token").send().await.unwrap();
    assert_eq!(deleted.status(), 200);
    let gone = client.get(format!("{documents}/varnholt")).bearer_auth("write-token").send().await.unwrap();
    assert_eq!(gone.status(), 404);
    server.stop();
}

#[actix::test]
async fn without_a_documents_token_the_document_routes_are_off() {
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let server = serve(&vanilla_settings(&llm), &[PipelineKind::Vanilla]).await;
    let response = reqwest::Client::new()
        .post(url(&server, "/v1/documents"))
        .json(&json!({"id": "d", "text": "t"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401, "no token opens them");
    let message = response.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("the document routes are off") && message.contains("serve.documents_token_env"),
        "{message}"
    );
    server.stop();
}

/// `settings` on the Meilisearch backend of `meili`'s index `index`, 20-word passages, with the
/// document routes open to the token "write-token" in the environment variable `token_env`.
fn on_meilisearch(mut settings: Settings, meili: &FakeMeili, index: &str, token_env: &str) -> Settings {
    settings.search.backend = lacuna::config::SearchBackend::Meilisearch;
    settings.search.meilisearch.url = meili.url.clone();
    settings.search.meilisearch.index = index.into();
    settings.search.passage_words = 20;
    // SAFETY: set before the server starts, read once by it; each test names a variable of its own.
    unsafe { std::env::set_var(token_env, "write-token") };
    settings.serve.documents_token_env = token_env.into();
    settings
}

/// In process on the Meilisearch backend, the document routes change the Meilisearch index the
/// pipelines search, as `lacuna ingest` does, not a local folder no stage reads.
#[actix::test]
async fn on_the_meilisearch_backend_the_document_routes_change_the_meilisearch_index() {
    let meili = FakeMeili::start();
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let settings = on_meilisearch(vanilla_settings(&llm), &meili, "kb", "LACUNA_TEST_MEILI_DOCUMENTS_TOKEN");
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let client = reqwest::Client::new();
    let text = (0..2).map(|n| format!("{} step {n}.", vec!["word"; 18].join(" "))).collect::<Vec<_>>().join(" ");
    let response = client
        .post(url(&server, "/v1/documents"))
        .bearer_auth("write-token")
        .json(&json!({"id": "manual", "title": "Manual", "text": text, "metadata": {"url": "https://example.org/manual"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let changed: Value = response.json().await.unwrap();
    assert_eq!((changed["status"].as_str(), changed["passages"].as_u64()), (Some("applied"), Some(2)), "{changed}");
    let ids = || meili.passage_ids("kb");
    assert_eq!(ids(), ["manual#1", "manual#2"], "the Meilisearch index holds its passages");
    let stored = get_json(&client, &url(&server, "/v1/documents/manual"), "write-token").await;
    assert_eq!(stored["passages"].as_array().map(Vec::len), Some(2), "{stored}");
    assert_eq!(stored["metadata"]["url"], "https://example.org/manual", "the document's metadata is kept: {stored}");
    let response = client.delete(url(&server, "/v1/documents/manual")).bearer_auth("write-token").send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(ids().is_empty(), "the delete took it out of Meilisearch");
    server.stop();
}

/// A document request dropped while Meilisearch is slow (the client went away, a proxy timed out)
/// still finishes its change: stopped between its additions and its deletion, it would leave the
/// older version's passages in the index beside the new one's (issue 57, item 9).
#[actix::test]
async fn on_the_meilisearch_backend_a_dropped_document_request_still_finishes_its_change() {
    let meili = FakeMeili::start();
    let llm = FakeLlm::start(reader_after(Duration::ZERO)).await;
    let settings = on_meilisearch(vanilla_settings(&llm), &meili, "kb-dropped", "LACUNA_TEST_MEILI_DROPPED_TOKEN");
    let server = serve(&settings, &[PipelineKind::Vanilla]).await;
    let manual = |sentences: usize| {
        let text = (0..sentences).map(|n| format!("{} step {n}.", vec!["word"; 18].join(" "))).collect::<Vec<_>>();
        json!({"id": "manual", "title": "Manual", "text": text.join(" ")})
    };
    let post = |timeout: Duration, body: Value| {
        let request = reqwest::Client::new().post(url(&server, "/v1/documents")).bearer_auth("write-token");
        request.timeout(timeout).json(&body).send()
    };
    assert_eq!(post(Duration::from_secs(30), manual(3)).await.unwrap().status(), 200);
    meili.set_task_delay(Duration::from_millis(600));
    assert!(post(Duration::from_millis(150), manual(1)).await.is_err(), "the client gave up");
    let ids = || meili.passage_ids("kb-dropped");
    for _ in 0..50 {
        if ids() == ["manual"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ids(), ["manual"], "the new version alone, its change done");
    server.stop();
}

/// A document the bus will never take (over the producer's message size) is refused for good: 413,
/// with no `Retry-After`, not a 503 a client would retry for ever (issue 57, item 9).
#[actix::test]
async fn over_kafka_a_document_too_large_for_the_bus_is_refused_for_good() {
    let llm = FakeLlm::start(hugo_script).await;
    let mut settings = support::cluster::settings("serve-too-large", &llm.base_url);
    // The producer takes records up to max_event_bytes + 64 KiB: a 150 KB document is over it, and
    // under search.max_document_bytes.
    settings.bus.max_event_bytes = 1000;
    // SAFETY: set before the server starts, read once by it; no other test reads this variable.
    unsafe { std::env::set_var("LACUNA_TEST_KAFKA_DOCUMENTS_TOKEN", "write-token") };
    settings.serve.documents_token_env = "LACUNA_TEST_KAFKA_DOCUMENTS_TOKEN".into();
    let server = kafka_serve(&settings).await;
    let response = reqwest::Client::new()
        .post(url(&server, "/v1/documents"))
        .bearer_auth("write-token")
        .json(&json!({"id": "big", "text": "word ".repeat(30_000)}))
        .send()
        .await
        .unwrap();
    let (status, retry_after) = (response.status(), response.headers().get("retry-after").cloned());
    let body = response.text().await.unwrap();
    assert_eq!(status, 413, "{body}");
    assert!(retry_after.is_none(), "no retry can help: {retry_after:?}");
    server.stop();
}

/// An answer record this build cannot read still ends its question: an error record that says so,
/// and the question's slot of `serve.max_open_questions` is freed (issue 57, item 5). Skipped, it
/// would stay open for good, and enough of them would refuse every later POST with 429.
#[actix::test]
async fn over_kafka_an_undecodable_answer_ends_its_question_and_frees_its_slot() {
    let llm = FakeLlm::start(hugo_script).await;
    let settings = support::cluster::settings("serve-undecodable", &llm.base_url);
    let bus = PipelineKind::Migres.kafka_bus(&settings).await.unwrap();
    let server = kafka_serve(&settings).await;
    let posted = reqwest::Client::new()
        .post(url(&server, "/v1/questions"))
        .json(&json!({"id": "garbled", "question": "Who charted the Varnholt shoals?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202);
    assert_eq!(server.registry.open(), 1);
    let garbled = lacuna::topics::Record {
        topic: lacuna::topics::Topic::Answers,
        key: "garbled".into(),
        payload: br#"{"schema_version": 99, "what": "a record of a later build"}"#.to_vec(),
        trace: Default::default(),
    };
    lacuna::topics::Bus::publish(&*bus, garbled).await.unwrap();
    let record = server.registry.wait_record("garbled", Duration::from_secs(30)).await.expect("the question ends");
    assert_eq!(record["error_type"], "undecodable_record", "{record}");
    assert_eq!(server.registry.open(), 0, "its slot is free");
    server.stop();
}
