//! The Grafana dashboard and the alerting rules against a real Prometheus: Debian's 2.42, unpacked by
//! scripts/prometheus.sh, whose folder LACUNA_PROMETHEUS names. Pipelines run in this process with a
//! scripted LLM over HTTP and provoke every series a panel shows (LLM errors and retries, a poison
//! event, cache hits, a join past its deadline); Prometheus scrapes `/metrics` every second, and each
//! dashboard expression goes through its query engine. The Kafka panels are evaluated against a run
//! over the test broker (LACUNA_TEST_KAFKA).

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lacuna::actors::clients::search::materialiser::Materialiser;
use lacuna::config::Price;
use lacuna::metrics::METRICS;
use lacuna::pipelines::{Pipeline, PipelineKind, Transport};
use lacuna::topics::in_process::InProcessBus;
use lacuna::topics::kafka::KafkaBus;
use lacuna::topics::{AnswerRecord, Bus, BusError, Event, Outcome, QuestionEvent, Record, Topic};
use serde_json::Value;
use support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};
use support::faulty_bus::FaultyBus;
use support::methods::second_subquestion_after;
use support::scripted::{HUGO_QUESTION_ID, hugo_script};

/// Panels whose series only a Kafka consumer, or an index following the documents topic, exports:
/// an in-process run leaves them empty.
const KAFKA_ONLY: [&str; 3] = ["lacuna_kafka_consumer_lag", "lacuna_kafka_paused_partitions", "lacuna_index_"];

/// A negative fixture: a dashboard query with a parenthesis missing. The check must reject it, or it
/// would not catch a broken panel either.
const BROKEN: &str = "sum by (stage) (rate(lacuna_stage_events_received_total[$__rate_interval])";

fn prometheus_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("LACUNA_PROMETHEUS").expect(
        "LACUNA_PROMETHEUS is not set: run the tests with scripts/test.sh, which installs Prometheus (scripts/prometheus.sh)",
    ))
}

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Every (panel title, expression) of the dashboard, with Grafana's `$__rate_interval` as one minute
/// (the test's activity fits in it; Prometheus itself does not know the variable).
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo("helm/lacuna/dashboards/lacuna.json")).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push((
                panel["title"].as_str().unwrap().to_string(),
                grafana_to_promql(target["expr"].as_str().unwrap()),
            ));
        }
    }
    assert!(queries.len() >= 15, "the dashboard has {} queries", queries.len());
    queries
}

fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
}

fn kafka_only(expr: &str) -> bool {
    KAFKA_ONLY.iter().any(|metric| expr.contains(metric))
}

/// A Prometheus server on 127.0.0.1 scraping one target every second, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
}

impl Prometheus {
    async fn start(name: &str, target: SocketAddr) -> Prometheus {
        let dir = support::scratch_dir(name);
        let _ = std::fs::remove_dir_all(dir.join("data"));
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: lacuna\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(prometheus_dir().join("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start prometheus");
        let server = Prometheus { child, url: format!("http://127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(response) = reqwest::get(format!("{}/-/ready", server.url)).await
                && response.status().is_success()
            {
                return server;
            }
            assert!(Instant::now() < deadline, "prometheus did not become ready on {}", server.url);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The instant result of `expr` now, or Prometheus's error (a parse error, say).
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let response = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = response.json().await.map_err(|e| e.to_string())?;
        match body["status"].as_str() {
            Some("success") => Ok(body["data"]["result"].as_array().cloned().unwrap_or_default()),
            _ => Err(format!("{}: {}", body["errorType"], body["error"])),
        }
    }

    /// Waits (up to 30 s) until every expression of `queries` returns data; then the failures, each
    /// a panel title, its expression and what went wrong.
    async fn failures_after_waiting(&self, queries: &[(String, String)]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut failures = Vec::new();
            for (title, expr) in queries {
                match self.query(expr).await {
                    Ok(result) if result.is_empty() => failures.push(format!("{title}: `{expr}` returned no data")),
                    Ok(_) => {}
                    Err(error) => failures.push(format!("{title}: `{expr}` was rejected: {error}")),
                }
            }
            if failures.is_empty() || Instant::now() > deadline {
                return failures;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn metrics_endpoint() -> SocketAddr {
    lacuna::serve::observe::serve("127.0.0.1:0", Arc::new(AtomicBool::new(true))).await.unwrap()
}

async fn ask(pipeline: &mut Pipeline, id: &str) -> AnswerRecord {
    let (question, _, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    pipeline.ask(QuestionEvent::new(id, question)).await.unwrap()
}

/// The Hugo question through MIGRES twice (the second time from the LLM cache), with the machinery's
/// faults on the way: the first leaf call fails (an LLM error, then a stage retry), the next three
/// leaf replies are not JSON (re-asks, then a degraded step), the first main call fails (the circuit
/// opens at `llm.breaker.failures = 1` and closes at the probe), a publish is refused once (a publish retry), a poison event on the facts
/// topic (a failed event and a dead letter), a price for the model (cost), and the first question's
/// event delivered twice (a duplicate skipped).
async fn migres_with_faults() {
    let (leaf_calls, main_failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let llm = FakeLlm::start(move |prompt| match prompt_kind(prompt) {
        // The first call of all fails as an error (a circuit opens only on an endpoint that has
        // answered before); the first main call, later, opens the circuit.
        Prompt::Leaf => match leaf_calls.fetch_add(1, Ordering::SeqCst) {
            0 => Reply::Status(500),
            1..=3 => Reply::Text("the facts are these".into()),
            _ => hugo_script(prompt),
        },
        Prompt::Main if !main_failed.swap(true, Ordering::SeqCst) => Reply::Status(500),
        _ => hugo_script(prompt),
    })
    .await;
    let mut settings = support::settings(&llm.base_url);
    settings.migres.retrieve_top_n = 8;
    settings.llm.max_retries = 0;
    settings.llm.breaker.failures = 1;
    settings.llm.breaker.probe_ms = 50;
    settings.llm.prices.insert(settings.llm.model.clone(), Price { prompt: 1.0, completion: 2.0, cached: None });
    settings.llm.cache = true;
    settings.llm.cache_dir = support::scratch_dir("llm-cache");
    let _ = std::fs::remove_dir_all(&settings.llm.cache_dir);
    let inner: Arc<dyn Bus> = Arc::new(InProcessBus::new(256));
    let refused_once = |_: &Record, n: usize| (n == 1).then(|| BusError::Transport("not the leader (injected)".into()));
    let bus: Arc<dyn Bus> = Arc::new(FaultyBus::new(inner).failing(Topic::Queries, refused_once));
    let mut pipeline =
        Pipeline::start_on(PipelineKind::Migres, bus.clone(), &settings, support::parts(&settings)).await.unwrap();
    let poison =
        Record { topic: Topic::Facts, key: "poison".into(), payload: b"{not json".to_vec(), trace: Default::default() };
    bus.publish(poison).await.unwrap();
    let (question, _, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let first = QuestionEvent::new("first", question.clone()).idempotent();
    let record = pipeline.ask(first.clone()).await.unwrap();
    assert!(matches!(record, AnswerRecord::Answered(ref a) if !a.degraded.is_empty()), "{record:?}");
    bus.publish(first.to_record()).await.unwrap();
    let record = pipeline.ask(QuestionEvent::new("again", question)).await.unwrap();
    assert!(matches!(record, AnswerRecord::Answered(_)), "{record:?}");
    // The twin went in before "again": the first stage, taking its input in order, has skipped it.
    assert!(METRICS.duplicates_skipped.with_label_values(&["retrieve"]).get() > 0, "the twin was skipped");
    pipeline.stop();
    assert!(llm.calls() > 0);
}

/// RA-ISF whose second sub-question answers after the join's deadline: the join waits, gives up, and
/// then sees the late result.
async fn raisf_past_its_deadline() {
    // The second sub-question's first call takes 25 s, the join waits 10: far enough apart to hold on
    // a loaded machine.
    let llm = FakeLlm::start(second_subquestion_after(Duration::from_secs(25))).await;
    let mut settings = support::settings(&llm.base_url);
    settings.raisf.top_k = 3;
    settings.join.deadline_ms = 10_000;
    settings.llm.timeout_ms = 60_000;
    settings.join.tick_ms = 100;
    let mut pipeline = Pipeline::start(PipelineKind::Raisf, &settings, support::parts(&settings)).await.unwrap();
    let record = ask(&mut pipeline, HUGO_QUESTION_ID).await;
    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    assert_eq!(answer.outcome, Outcome::AnsweredAfterDeadline);
    let late = || METRICS.join_late_results.with_label_values::<&str>(&[]).get();
    let deadline = Instant::now() + Duration::from_secs(60);
    while late() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pipeline.stop();
    assert!(late() > 0, "the slow child came back after the deadline");
}

#[actix::test]
async fn every_dashboard_query_runs_on_a_real_prometheus_and_shows_data() {
    let prometheus = Prometheus::start("in-process", metrics_endpoint().await).await;
    migres_with_faults().await;
    raisf_past_its_deadline().await;

    let rejected = prometheus.query(&grafana_to_promql(BROKEN)).await;
    assert!(
        matches!(&rejected, Err(error) if error.contains("parse")),
        "the broken fixture must be rejected: {rejected:?}"
    );
    let (kafka, in_process): (Vec<_>, Vec<_>) = dashboard_queries().into_iter().partition(|(_, e)| kafka_only(e));
    assert!(!kafka.is_empty(), "the dashboard has Kafka panels");
    let failures = prometheus.failures_after_waiting(&in_process).await;
    assert!(failures.is_empty(), "dashboard queries failed on Prometheus:\n{}", failures.join("\n"));
    // The Kafka panels must at least parse here; they get data in the broker test below.
    for (title, expr) in &kafka {
        assert!(prometheus.query(expr).await.is_ok(), "{title}: `{expr}` does not parse");
    }
}

#[actix::test]
async fn the_kafka_panels_show_data_from_a_run_over_the_broker() {
    let prometheus = Prometheus::start("kafka", metrics_endpoint().await).await;
    let llm = FakeLlm::start(hugo_script).await;
    let mut settings = support::cluster::settings("prometheus", &llm.base_url);
    settings.migres.retrieve_top_n = 8;
    // Exactly-once: the stop below then closes consumers whose close commits a transaction, which
    // hung 4 runs in about 20 (a consumer dropped inside the commit that waited on itself).
    settings.bus.delivery = lacuna::config::DeliveryGuarantee::ExactlyOnce;
    let mut pipeline =
        Pipeline::start_with(PipelineKind::Migres, Transport::Kafka, &settings, support::parts(&settings))
            .await
            .unwrap();
    let record = ask(&mut pipeline, HUGO_QUESTION_ID).await;
    assert!(matches!(record, AnswerRecord::Answered(_)), "{record:?}");
    let _replica = index_following_the_documents_topic(&settings).await;

    let kafka: Vec<_> = dashboard_queries().into_iter().filter(|(_, e)| kafka_only(e)).collect();
    let failures = prometheus.failures_after_waiting(&kafka).await;
    pipeline.stop();
    assert!(failures.is_empty(), "Kafka panels failed on Prometheus:\n{}", failures.join("\n"));
}

/// A retrieve replica's index as a copy of the documents topic, holding one published document:
/// what the live-corpus panels show.
async fn index_following_the_documents_topic(settings: &lacuna::config::Settings) -> Materialiser {
    let bus = Arc::new(KafkaBus::new(settings.kafka.clone(), &settings.bus).unwrap());
    bus.ensure_documents_topic().await.unwrap();
    let document = serde_json::json!({"id": "panels", "title": "Panels", "text": "A document for the index panels."});
    bus.publish_document("panels", Some(document.to_string().as_bytes())).await.unwrap();
    let mut search = settings.search.clone();
    search.index_dir = support::scratch_dir("prometheus-index").join("index");
    let _ = std::fs::remove_dir_all(&search.index_dir);
    let mut materialiser = Materialiser::start(&bus, &search).unwrap();
    materialiser.caught_up().await.unwrap();
    materialiser
}

/// The alerting rules the chart ships parse, and fire (or stay quiet) on the series of
/// tests/prometheus/alerts-test.yaml: lag growing for 10 minutes, a dead letter, 9% LLM errors
/// against 1%, a process not ready, a target down.
#[test]
fn the_alerting_rules_pass_promtool() {
    let promtool = prometheus_dir().join("promtool");
    for args in [
        ["check", "rules", "helm/lacuna/alerts/lacuna-rules.yaml"],
        ["test", "rules", "tests/prometheus/alerts-test.yaml"],
    ] {
        let output = Command::new(&promtool).args(args).current_dir(repo("")).output().expect("run promtool");
        assert!(
            output.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
