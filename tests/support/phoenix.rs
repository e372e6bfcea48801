//! Arize Phoenix, a real OpenTelemetry backend, on a port of a test's own (`scripts/phoenix.sh`):
//! it receives OTLP over HTTP and returns the spans it stored through its HTTP API. Stopped on drop.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

pub struct OwnPhoenix {
    port: u16,
    grpc_port: u16,
    dir: std::path::PathBuf,
}

impl OwnPhoenix {
    /// Installs Phoenix if the cache has none (a minute), then starts it.
    pub fn start(test: &str) -> OwnPhoenix {
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = super::scratch_dir(&format!("phoenix-{test}"));
        let phoenix = OwnPhoenix { port: free(), grpc_port: free(), dir };
        phoenix.run("start");
        phoenix
    }

    fn run(&self, command: &str) {
        let status = Command::new("scripts/phoenix.sh")
            .args([command, "--port", &self.port.to_string(), "--grpc-port", &self.grpc_port.to_string(), "--dir"])
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "scripts/phoenix.sh {command}");
    }

    /// The OTLP/gRPC endpoint.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The OTLP/HTTP endpoint (`otel.endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn stop(&self) {
        self.run("stop");
    }

    /// Every span, once Phoenix has stored all it received: it writes what it receives in batches,
    /// a moment later, so this reads until two reads 2 s apart agree (within a minute).
    pub async fn settled_spans(&self) -> Vec<Span> {
        let started = std::time::Instant::now();
        let mut spans = self.spans().await;
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            let again = self.spans().await;
            if again.len() == spans.len() || started.elapsed() > std::time::Duration::from_secs(60) {
                return again;
            }
            spans = again;
        }
    }

    /// Every span of the default project, through `GET /v1/projects/default/spans`, page by page.
    pub async fn spans(&self) -> Vec<Span> {
        let client = reqwest::Client::new();
        let (mut spans, mut cursor) = (Vec::new(), None::<String>);
        loop {
            let mut url = format!("{}/v1/projects/default/spans?limit=1000", self.endpoint());
            if let Some(cursor) = &cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let reply = client.get(&url).send().await.unwrap().error_for_status().unwrap();
            let page: Value = reply.json().await.unwrap();
            spans.extend(page["data"].as_array().unwrap().iter().map(Span::from));
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_string()),
                None => return spans,
            }
        }
    }
}

impl Drop for OwnPhoenix {
    fn drop(&mut self) {
        let _ = Command::new("scripts/phoenix.sh")
            .args(["stop", "--port", &self.port.to_string(), "--dir"])
            .arg(&self.dir)
            .status();
    }
}

/// A span as Phoenix returns it.
#[derive(Clone, Debug)]
pub struct Span {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_id: Option<String>,
    /// OpenInference's kind (`LLM`, `RETRIEVER`, ...), which Phoenix reads off the span's
    /// `openinference.span.kind` attribute.
    pub kind: String,
    pub status: String,
    pub attributes: BTreeMap<String, Value>,
}

impl Span {
    pub fn text(&self, key: &str) -> Option<&str> {
        self.attributes.get(key)?.as_str()
    }

    pub fn number(&self, key: &str) -> Option<u64> {
        self.attributes.get(key)?.as_u64()
    }
}

impl From<&Value> for Span {
    fn from(value: &Value) -> Span {
        let attributes = value["attributes"].as_object().map(|o| o.clone().into_iter().collect()).unwrap_or_default();
        Span {
            name: value["name"].as_str().unwrap_or_default().to_string(),
            trace_id: value["context"]["trace_id"].as_str().unwrap_or_default().to_string(),
            span_id: value["context"]["span_id"].as_str().unwrap_or_default().to_string(),
            parent_id: value["parent_id"].as_str().map(str::to_string),
            kind: value["span_kind"].as_str().unwrap_or_default().to_string(),
            status: value["status_code"].as_str().unwrap_or_default().to_string(),
            attributes,
        }
    }
}
