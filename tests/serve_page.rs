//! The live page in a real browser: headless Chromium (Debian's, driven through chromedriver's
//! WebDriver HTTP protocol with our own HTTP client) loads `/`, submits a question through the form
//! and watches its trace grow until the answer. A screenshot taken mid-question is kept.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lacuna::pipelines::{PipelineKind, Transport};
use lacuna::serve::{ServeOptions, start};
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply};
use support::scripted::{HUGO_QUESTION_ID, hugo_script};

/// WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

struct Driver {
    process: Child,
    base: String,
    session: String,
    http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Driver {
    /// chromedriver on a free loopback port, with a headless Chromium session; `None` when the
    /// browser is not installed (scripts/test.sh installs it where it can).
    async fn start() -> Option<Driver> {
        let chromedriver = std::env::var("LACUNA_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        let chromium = std::env::var("LACUNA_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        if !std::path::Path::new(&chromedriver).exists() || !std::path::Path::new(&chromium).exists() {
            eprintln!("SKIPPED: no {chromedriver} or {chromium} (apt-get install chromium chromium-driver)");
            return None;
        }
        let port = free_port();
        let process = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let mut driver = Driver { process, base, session: String::new(), http };
        let started = Instant::now();
        while driver.http.get(format!("{}/status", driver.base)).send().await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "chromedriver did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium,
            // No sandbox: tests may run as root, which Chromium's sandbox refuses.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"],
        }}}});
        let session = driver.call("POST", "/session", Some(capabilities)).await;
        driver.session = session["sessionId"].as_str().expect("a session").to_string();
        Some(driver)
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "POST" => self.http.post(url).json(&body.unwrap_or(json!({}))),
            "DELETE" => self.http.delete(url),
            _ => self.http.get(url),
        };
        let reply: Value = request.send().await.unwrap().json().await.unwrap();
        assert!(reply["value"].get("error").is_none(), "{method} {path}: {reply}");
        reply["value"].clone()
    }

    async fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body).await
    }

    async fn element(&self, css: &str) -> String {
        let found = self.session_call("POST", "/element", Some(json!({"using": "css selector", "value": css}))).await;
        found[ELEMENT].as_str().unwrap().to_string()
    }

    async fn script(&self, script: &str) -> Value {
        self.session_call("POST", "/execute/sync", Some(json!({"script": script, "args": []}))).await
    }

    async fn screenshot(&self, path: &std::path::Path) {
        let png = self.session_call("GET", "/screenshot", None).await;
        std::fs::write(path, base64_decode(png.as_str().unwrap())).unwrap();
    }
}

/// Standard base64, as WebDriver sends screenshots (no dependency for one decode).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let bits = chunk.iter().enumerate().fold(0u32, |acc, (i, c)| acc | (u32::from(value(*c)) << (18 - 6 * i)));
        out.extend(bits.to_be_bytes()[1..chunk.len()].iter());
    }
    out
}

#[actix::test]
async fn the_live_page_submits_a_question_and_draws_its_trace_until_the_answer() {
    // Each LLM reply a little late, so the page is caught with the question half-way.
    let llm = FakeLlm::start(|prompt| Reply::Delayed(Duration::from_millis(300), Box::new(hugo_script(prompt)))).await;
    let settings = support::settings(&llm.base_url);
    let loaded = settings.clone();
    let options = ServeOptions {
        transport: Transport::InProcess,
        pipelines: vec![PipelineKind::Migres],
        listen: "127.0.0.1:0".into(),
    };
    let server = start(&settings, options, move |_| Ok(support::parts(&loaded))).await.unwrap();
    let Some(driver) = Driver::start().await else { return };
    let (question, answers, _) = support::question("hotpotqa", HUGO_QUESTION_ID);

    driver.session_call("POST", "/url", Some(json!({"url": format!("http://{}/", server.address)}))).await;
    let textarea = driver.element("#question").await;
    driver.session_call("POST", &format!("/element/{textarea}/value"), Some(json!({"text": question}))).await;
    let ask = driver.element("#ask").await;
    driver.session_call("POST", &format!("/element/{ask}/click"), None).await;

    let shots = support::scratch_dir("serve-page");
    let (mut mid_question, started) = (false, Instant::now());
    loop {
        let state = driver
            .script(
                "return {steps: document.querySelectorAll('#trace .step, #trace .passage').length,
                         iterations: document.querySelectorAll('#trace .iteration').length,
                         answer: (document.querySelector('#record .answer') || {}).textContent || null,
                         shown: document.getElementById('record').style.display}",
            )
            .await;
        if !mid_question && state["answer"].is_null() && state["iterations"].as_u64() >= Some(2) {
            driver.screenshot(&shots.join("mid-question.png")).await;
            mid_question = true;
        }
        if state["answer"].is_string() {
            assert_eq!(state["answer"], answers[0].as_str());
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "no answer on the page: {state}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(mid_question, "the page showed the second iteration before the answer");
    let trace = driver
        .script(
            "return {verified: document.querySelectorAll('#record .fact.verified').length,
                     kept: document.querySelectorAll('#trace .passage.kept').length,
                     decisions: document.querySelectorAll('#trace .decision').length,
                     queries: [...document.querySelectorAll('#trace .step.queries_written')].map(e => e.textContent),
                     listed: [...document.querySelectorAll('#questions li')].map(e => e.textContent)}",
        )
        .await;
    assert_eq!(trace["verified"], 2, "the answer's two verified facts: {trace}");
    assert!(trace["kept"].as_u64() >= Some(2), "passages kept, with their scores: {trace}");
    assert_eq!(trace["decisions"], 2, "one decision per iteration: {trace}");
    assert!(trace["queries"][0].as_str().unwrap().contains("FC Cartagena"), "the second hop's query: {trace}");
    driver.screenshot(&shots.join("answered.png")).await;
    eprintln!("screenshots in {}", shots.display());
    driver.session_call("DELETE", "", None).await;
    server.stop();
}
