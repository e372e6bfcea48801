//! A fake LLM that speaks the OpenAI chat-completions protocol over real HTTP on 127.0.0.1, so the
//! real client code (schemas, retries, usage accounting) runs in tests. A script decides each reply
//! from the prompt.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the fake answers to one call.
pub enum Reply {
    /// The message content is this JSON, serialised.
    Json(Value),
    /// The message content is this text.
    Text(String),
    /// An HTTP error status with a short body.
    Status(u16),
    /// This text, each of its words a token with this log-probability when the request asks for
    /// `logprobs` (other replies get -0.5 per token).
    Scored(String, f64),
    /// The reply, after a pause.
    Delayed(std::time::Duration, Box<Reply>),
    /// This text, reported as stopped at `max_tokens` (`finish_reason: "length"`).
    Cut(String),
    /// HTTP 429 with `Retry-After` in whole seconds.
    Throttled(u64),
}

/// Which MIGRES prompt a user message is, recognised by its fixed instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt {
    Main,
    FinalAnswer,
    /// Copying a two-option question's dates or numbers (`migres.compare_options`).
    CompareOptions,
    QueryGen,
    Leaf,
    Knowledge,
    Entailment,
    /// The baselines' single answer call.
    Reader,
    /// The Acc† judge of `lacuna eval`.
    Judge,
    /// QPaug's question augmentation and passage generation.
    Augment,
    GeneratePassage,
    /// RA-ISF's modules.
    SelfKnowledge,
    Relevance,
    Decompose,
    /// RQ-RAG's query refinement and trajectory answer.
    Refine,
    TrajectoryAnswer,
    Other,
}

pub fn prompt_kind(prompt: &str) -> Prompt {
    if prompt.starts_with("You are an entailment judge") {
        Prompt::Entailment
    } else if prompt.starts_with("Answer the Question based solely") {
        Prompt::Main
    } else if prompt.starts_with("Answer the Question using the provided Information") {
        Prompt::FinalAnswer
    } else if prompt.starts_with("The Question asks which of two options") {
        Prompt::CompareOptions
    } else if prompt.starts_with("Based on the Original Question") {
        Prompt::QueryGen
    } else if prompt.starts_with("Given the following Question and Passages") {
        Prompt::Leaf
    } else if prompt.starts_with("Generate relevant information") {
        Prompt::Knowledge
    } else if prompt.starts_with("Answer the Question using the provided Documents") {
        Prompt::Reader
    } else if prompt.starts_with("In the following task, you are given a Question") {
        Prompt::Judge
    } else if prompt.starts_with("Question: ") && prompt.contains("Let's think step-by-step") {
        Prompt::Augment
    } else if prompt.starts_with("Your job is to act as a subject matter expert") {
        Prompt::GeneratePassage
    } else if prompt.starts_with("Can you use your own knowledge base") {
        Prompt::SelfKnowledge
    } else if prompt.starts_with("I will provide you with a piece of knowledge") {
        Prompt::Relevance
    } else if prompt.starts_with("Please break down this question") {
        Prompt::Decompose
    } else if prompt.starts_with("You are refining search queries") {
        Prompt::Refine
    } else if prompt.starts_with("Answer the Question using the Documents. If they are not enough") {
        Prompt::TrajectoryAnswer
    } else {
        Prompt::Other
    }
}

/// The text after the last occurrence of `label` up to the end of that line.
pub fn last_field<'a>(prompt: &'a str, label: &str) -> &'a str {
    prompt.rsplit(label).next().unwrap_or("").lines().next().unwrap_or("").trim()
}

/// The part of a prompt after its examples: where the question's own text is.
pub fn tail(prompt: &str) -> &str {
    let markers = [
        "Now judge this pair.",
        "Now answer this one.",
        "Now write the new queries for this one.",
        "Now do the same for these Passages.",
        "Now judge this one.",
        "Now break down this one.",
        "Now refine for this one.",
    ];
    markers.iter().find_map(|m| prompt.rsplit_once(m).map(|(_, t)| t)).unwrap_or(prompt)
}

/// (index, title) of each `Passage i: (Title: t)` line in a leaf prompt's own passages.
pub fn passages_in(prompt: &str) -> Vec<(usize, String, String)> {
    tail(prompt)
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("Passage ")?;
            let (index, rest) = rest.split_once(": (Title: ")?;
            let (title, text) = rest.split_once(") ")?;
            Some((index.parse().ok()?, title.to_string(), text.to_string()))
        })
        .collect()
}

pub struct FakeLlm {
    pub base_url: String,
    /// The user message of every call, in arrival order.
    pub prompts: Arc<Mutex<Vec<String>>>,
    /// The full request bodies.
    pub requests: Arc<Mutex<Vec<Value>>>,
}

impl FakeLlm {
    pub async fn start<F>(script: F) -> FakeLlm
    where
        F: Fn(&str) -> Reply + Send + Sync + 'static,
    {
        Self::start_on_request(move |user, _| script(user)).await
    }

    /// A fake whose script also sees the whole request body (its `seed`, `max_tokens`, ...).
    pub async fn start_on_request<F>(script: F) -> FakeLlm
    where
        F: Fn(&str, &Value) -> Reply + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let prompts = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(script);
        let (p, r) = (prompts.clone(), requests.clone());
        // A plain thread with its own runtime: the fake outlives whichever runtime the test uses.
        let std_listener = listener.into_std().unwrap();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::from_std(std_listener).unwrap();
                loop {
                    let Ok((mut socket, _)) = listener.accept().await else { return };
                    let (script, p, r) = (script.clone(), p.clone(), r.clone());
                    tokio::spawn(async move {
                        let Some(body) = read_request(&mut socket).await else { return };
                        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let user = request["messages"]
                            .as_array()
                            .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                            .and_then(|m| m["content"].as_str())
                            .unwrap_or("")
                            .to_string();
                        p.lock().unwrap().push(user.clone());
                        let scored = request["logprobs"] == true;
                        let mut reply = script(&user, &request);
                        r.lock().unwrap().push(request);
                        while let Reply::Delayed(pause, inner) = reply {
                            tokio::time::sleep(pause).await;
                            reply = *inner;
                        }
                        let mut headers = String::new();
                        if let Reply::Throttled(seconds) = reply {
                            headers = format!("retry-after: {seconds}\r\n");
                            reply = Reply::Status(429);
                        }
                        let (status, body) = match reply {
                            Reply::Json(value) => (200, completion(&value.to_string(), scored.then_some(-0.5), "stop")),
                            Reply::Text(text) => (200, completion(&text, scored.then_some(-0.5), "stop")),
                            Reply::Scored(text, logprob) => (200, completion(&text, scored.then_some(logprob), "stop")),
                            Reply::Cut(text) => (200, completion(&text, scored.then_some(-0.5), "length")),
                            Reply::Status(status) => (status, json!({"error": {"message": "scripted failure"}}).to_string()),
                            Reply::Delayed(..) | Reply::Throttled(_) => unreachable!("unwrapped above"),
                        };
                        let response = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = socket.write_all(response.as_bytes()).await;
                        let _ = socket.shutdown().await;
                    });
                }
            });
        });
        FakeLlm { base_url, prompts, requests }
    }

    pub fn calls(&self) -> usize {
        self.prompts.lock().unwrap().len()
    }

    pub fn calls_of(&self, kind: Prompt) -> usize {
        self.prompts.lock().unwrap().iter().filter(|p| prompt_kind(p) == kind).count()
    }
}

fn completion(content: &str, logprob: Option<f64>, finish_reason: &str) -> String {
    let logprobs = logprob.map(|logprob| {
        let tokens: Vec<Value> = content
            .split_whitespace()
            .map(|t| json!({"token": t, "logprob": logprob, "bytes": null, "top_logprobs": []}))
            .collect();
        json!({"content": tokens})
    });
    json!({
        "id": "fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": logprobs, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110, "prompt_tokens_details": {"cached_tokens": 40}},
    })
    .to_string()
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        let Some(end) = find(&buffer, b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < end + 4 + length {
            let n = socket.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        return Some(buffer[end + 4..end + 4 + length].to_vec());
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
