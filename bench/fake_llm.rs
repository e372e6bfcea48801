//! A fake LLM for `lacuna bench`: an OpenAI-compatible chat-completions server on 127.0.0.1 that
//! answers after a set latency, so the real client (schemas, retries, connection pool) runs and the
//! pipeline's own costs show without a GPU.
//!
//! A structured call gets an instance of the JSON schema it sent, built from the prompt: strings are
//! the prompt's question (so generated queries retrieve real passages and the re-ranker does real
//! work), integers their minimum (passage 0, which a leaf prompt always shows), booleans a hash bit
//! of the request (so loops neither all stop at once nor all run to the limit). Plain calls get the
//! question back. Every token gets log-probability -0.5 when the request asks for them.
//!
//! With [`Faults`] it also fails as real endpoints do, at random: HTTP 500, a structured reply cut
//! mid-object, and a reply stopped at `max_tokens` (`finish_reason: "length"`). The soak test
//! (`scripts/soak.sh`) runs the stages against it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The latency of each answer: `mean` ± uniform `jitter`, plus a cost per prompt and per completion
/// token, as a real server's grows with what it reads and writes (a cost lever that sends fewer
/// but longer prompts shows it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency {
    pub mean: Duration,
    pub jitter: Duration,
    pub per_prompt_token: Duration,
    pub per_completion_token: Duration,
}

impl Latency {
    fn for_tokens(&self, prompt: u64, completion: u64) -> Duration {
        self.per_prompt_token * prompt as u32 + self.per_completion_token * completion as u32
    }
}

impl std::str::FromStr for Latency {
    type Err = String;

    /// `MEAN[,JITTER[,PER_PROMPT_TOKEN,PER_COMPLETION_TOKEN]]` in milliseconds, e.g. `300`,
    /// `300,100` or `0,0,0.2,30`.
    fn from_str(text: &str) -> Result<Self, String> {
        let ms = |part: &str| {
            part.trim().parse::<f64>().ok().filter(|v| *v >= 0.0).map(|v| Duration::from_secs_f64(v / 1000.0))
        };
        let parts: Option<Vec<Duration>> = text.split(',').map(ms).collect();
        match parts.as_deref() {
            Some(&[mean]) => Ok(Latency { mean, ..Latency::default() }),
            Some(&[mean, jitter]) => Ok(Latency { mean, jitter, ..Latency::default() }),
            Some(&[mean, jitter, per_prompt_token, per_completion_token]) => {
                Ok(Latency { mean, jitter, per_prompt_token, per_completion_token })
            }
            _ => Err(format!(
                "`{text}`: expected MEAN[,JITTER[,PER_PROMPT_TOKEN,PER_COMPLETION_TOKEN]] in milliseconds, e.g. 300, 300,100 or 0,0,0.2,30"
            )),
        }
    }
}

/// How often a chat completion fails, each a fraction of calls (0 to 1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// HTTP 500.
    pub server_error: f64,
    /// A structured reply cut mid-object (broken JSON).
    pub broken_json: f64,
    /// A reply cut at `max_tokens`: finish_reason "length".
    pub cut: f64,
}

impl std::str::FromStr for Faults {
    type Err = String;

    /// `500=PCT,json=PCT,cut=PCT` in percent, any subset, e.g. `500=5,json=3,cut=1`.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut faults = Faults::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || format!("`{part}`: expected 500=PCT, json=PCT or cut=PCT, e.g. 500=5,json=3,cut=1");
            let (kind, percent) = part.split_once('=').ok_or_else(bad)?;
            let fraction = percent.trim().parse::<f64>().ok().filter(|p| (0.0..=100.0).contains(p)).ok_or_else(bad)?;
            match kind.trim() {
                "500" => faults.server_error = fraction / 100.0,
                "json" => faults.broken_json = fraction / 100.0,
                "cut" => faults.cut = fraction / 100.0,
                _ => return Err(bad()),
            }
        }
        Ok(faults)
    }
}

/// What one call gets.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    ServerError,
    BrokenJson,
    Cut,
}

impl Faults {
    /// The fault of the `n`th call with this `body`, drawn uniformly from both.
    fn draw(&self, n: u64, body: &[u8]) -> Fault {
        let unit = (hash(body).wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % 1_000_000) as f64 / 1e6;
        if unit < self.server_error {
            Fault::ServerError
        } else if unit < self.server_error + self.broken_json {
            Fault::BrokenJson
        } else if unit < self.server_error + self.broken_json + self.cut {
            Fault::Cut
        } else {
            Fault::None
        }
    }
}

pub struct FakeLlm {
    pub base_url: String,
    calls: Arc<AtomicU64>,
}

impl FakeLlm {
    /// Serves on a thread of its own (its own runtime), so the fake's work never waits behind the
    /// pipeline's and outlives whichever runtime started it.
    pub fn start(latency: Latency) -> std::io::Result<FakeLlm> {
        Self::start_on("127.0.0.1:0", latency, Faults::default())
    }

    /// [`FakeLlm::start`] on a given address, failing as `faults` says.
    pub fn start_on(listen: &str, latency: Latency, faults: Faults) -> std::io::Result<FakeLlm> {
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let base_url = format!("http://{}/v1", listener.local_addr()?);
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        std::thread::Builder::new().name("fake-llm".into()).spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else { return };
                while let Ok((socket, _)) = listener.accept().await {
                    tokio::spawn(serve(socket, latency, faults, counter.clone()));
                }
            });
        })?;
        Ok(FakeLlm { base_url, calls })
    }

    /// Chat completions answered so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

/// One keep-alive connection: requests in turn until the client closes it.
async fn serve(mut socket: TcpStream, latency: Latency, faults: Faults, calls: Arc<AtomicU64>) {
    let mut buffer = Vec::new();
    while let Some((head, body)) = read_request(&mut socket, &mut buffer).await {
        let (status, reply) = if head.starts_with("GET") {
            (200, json!({"object": "list", "data": [{"id": "fake", "object": "model"}]}).to_string())
        } else {
            match serde_json::from_slice::<Value>(&body) {
                Ok(request) => {
                    let n = calls.fetch_add(1, Ordering::Relaxed);
                    let (status, reply, (prompt, written)) = match faults.draw(n, &body) {
                        Fault::ServerError => {
                            (500, json!({"error": {"message": "injected fault"}}).to_string(), (0, 0))
                        }
                        fault => {
                            let (reply, tokens) = completion(&request, fault);
                            (200, reply, tokens)
                        }
                    };
                    tokio::time::sleep(pause(latency, &body) + latency.for_tokens(prompt, written)).await;
                    (status, reply)
                }
                Err(e) => (400, json!({"error": {"message": format!("not JSON: {e}")}}).to_string()),
            }
        };
        let response = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
            reply.len()
        );
        if socket.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn pause(latency: Latency, body: &[u8]) -> Duration {
    let spread = latency.jitter.as_secs_f64();
    let unit = (hash(body) % 10_000) as f64 / 10_000.0; // uniform in [0, 1)
    Duration::from_secs_f64((latency.mean.as_secs_f64() + spread * (2.0 * unit - 1.0)).max(0.0))
}

fn hash(bytes: &[u8]) -> u64 {
    // FNV-1a: deterministic across runs, unlike the std hasher.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// The head (request line and headers) and body of the next request, or `None` when the
/// connection ends. Bytes past the body stay in `buffer` for the next request.
async fn read_request(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let mut chunk = [0u8; 16384];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_string();
            let length: usize = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                let body = buffer[end + 4..end + 4 + length].to_vec();
                buffer.drain(..end + 4 + length);
                return Some((head, body));
            }
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// A chat completion answering `request`, broken as `fault` says, and its (prompt, completion) tokens.
fn completion(request: &Value, fault: Fault) -> (String, (u64, u64)) {
    let user = request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let question = question_of(user);
    let seed = hash(request.to_string().as_bytes());
    let mut content = match request["response_format"]["json_schema"]["schema"].as_object() {
        Some(_) => instance(&request["response_format"]["json_schema"]["schema"], &question, seed).to_string(),
        None => question.clone(),
    };
    if matches!(fault, Fault::BrokenJson | Fault::Cut) {
        // Cut halfway, between characters.
        let half = content.char_indices().map(|(i, _)| i).nth(content.chars().count() / 2).unwrap_or(0);
        content.truncate(half);
    }
    let finish_reason = if fault == Fault::Cut { "length" } else { "stop" };
    let logprobs = (request["logprobs"] == true).then(|| {
        let tokens: Vec<Value> =
            content.split_whitespace().map(|t| json!({"token": t, "logprob": -0.5, "top_logprobs": []})).collect();
        json!({"content": tokens})
    });
    let prompt_tokens = user.split_whitespace().count() as u64;
    let completion_tokens = content.split_whitespace().count() as u64;
    let reply = json!({
        "id": "fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": logprobs, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    });
    (reply.to_string(), (prompt_tokens, completion_tokens))
}

/// The question a prompt is about: its last `Question:` line (after the examples), else its first
/// words.
fn question_of(prompt: &str) -> String {
    let line = prompt.lines().rev().find_map(|l| l.trim().strip_prefix("Question:")).map(str::trim);
    match line {
        Some(q) if !q.is_empty() => q.to_string(),
        _ => prompt.split_whitespace().take(12).collect::<Vec<_>>().join(" "),
    }
}

/// A value valid under `schema` (the subset of JSON Schema the stages send).
pub fn instance(schema: &Value, text: &str, seed: u64) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|values| values.first()) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("object") => {
            let mut object = Map::new();
            if let Some(properties) = schema["properties"].as_object() {
                for (n, (key, property)) in properties.iter().enumerate() {
                    object.insert(key.clone(), instance(property, text, seed.rotate_left(n as u32 + 1)));
                }
            }
            Value::Object(object)
        }
        Some("array") => {
            let min = schema["minItems"].as_u64().unwrap_or(0);
            let max = schema["maxItems"].as_u64().unwrap_or(u64::MAX);
            let items = min.max(1).min(max);
            Value::Array((0..items).map(|i| instance(&schema["items"], text, seed.rotate_left(i as u32 + 7))).collect())
        }
        Some("integer") => json!(schema["minimum"].as_i64().unwrap_or(0)),
        Some("number") => json!(schema["minimum"].as_f64().unwrap_or(0.0)),
        Some("boolean") => json!(seed & 1 == 1),
        Some("null") => Value::Null,
        _ => json!(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_follows_the_schema_it_was_built_from() {
        let schema = json!({
            "type": "object",
            "properties": {
                "facts": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
                    "fact": {"type": "string"},
                    "passages": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
                }}},
                "confidence": {"type": "integer", "minimum": 1, "maximum": 5},
                "label": {"type": "string", "enum": ["yes", "no"]},
                "answerable": {"type": "boolean"},
            },
        });
        let value = instance(&schema, "Who wrote it?", 3);
        assert_eq!(value["facts"][0]["fact"], "Who wrote it?");
        assert_eq!(value["facts"][0]["passages"], json!([0]));
        assert_eq!(value["confidence"], 1);
        assert_eq!(value["label"], "yes");
        assert!(value["answerable"].is_boolean());
    }

    #[test]
    fn faults_read_as_percentages_and_are_drawn_about_that_often() {
        let faults: Faults = "500=5,json=3,cut=1".parse().unwrap();
        assert_eq!(faults, Faults { server_error: 0.05, broken_json: 0.03, cut: 0.01 });
        assert!("500=5,teapot=1".parse::<Faults>().is_err());
        let drawn: Vec<Fault> = (0..100_000).map(|n| faults.draw(n, b"{}")).collect();
        let share = |fault| drawn.iter().filter(|f| **f == fault).count() as f64 / drawn.len() as f64;
        assert!((share(Fault::ServerError) - 0.05).abs() < 0.005, "{}", share(Fault::ServerError));
        assert!((share(Fault::BrokenJson) - 0.03).abs() < 0.005, "{}", share(Fault::BrokenJson));
        assert!((share(Fault::Cut) - 0.01).abs() < 0.005, "{}", share(Fault::Cut));
    }

    #[test]
    fn latency_reads_mean_and_jitter_in_milliseconds() {
        let l: Latency = "300,100".parse().unwrap();
        assert_eq!((l.mean, l.jitter), (Duration::from_millis(300), Duration::from_millis(100)));
        assert_eq!("1".parse::<Latency>().unwrap().jitter, Duration::ZERO);
        let tokens: Latency = "0,0,0.2,30".parse().unwrap();
        assert_eq!(
            tokens.for_tokens(1000, 10),
            Duration::from_millis(500),
            "0.2 ms a prompt token, 30 a completion token"
        );
        assert!("1,2,3".parse::<Latency>().is_err());
        assert!("fast".parse::<Latency>().is_err());
    }
}
