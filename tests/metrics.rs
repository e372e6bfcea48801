//! The metrics spec (docs/metrics.md) against what the process exports, and the endpoints serving it.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lacuna::metrics::METRICS;
use lacuna::topics::in_process::InProcessBus;
use lacuna::topics::{Bus, Event, MissingEvent, SCHEMA_VERSION, Topic};
use serde_json::json;
use support::fake_llm::{FakeLlm, Reply};

#[test]
fn documented_metric_names_are_the_exported_ones() {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let documented: BTreeSet<String> = spec
        .lines()
        .filter_map(|line| line.strip_prefix("| `lacuna_"))
        .map(|rest| format!("lacuna_{}", rest.split('`').next().unwrap()))
        .collect();
    let exported: BTreeSet<String> = METRICS.names().into_iter().collect();
    assert_eq!(documented, exported);
    for line in spec.lines().filter(|l| l.starts_with("| `lacuna_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (name, kind) = (cells[1].trim_matches('`'), cells[2]);
        assert_eq!(name.ends_with("_total"), kind == "counter", "{name}: counters and only counters end in _total");
    }
}

async fn get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    let response = reqwest::get(format!("http://{address}{path}")).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[actix::test]
async fn a_stage_reports_its_events_and_llm_use_on_metrics() {
    let ready = Arc::new(AtomicBool::new(false));
    let address = lacuna::serve::observe::serve("127.0.0.1:0", ready.clone()).await.unwrap();
    assert_eq!(get(address, "/healthz").await.0, 200);
    assert_eq!(get(address, "/readyz").await.0, 503, "not ready before the stage runs");

    let llm = FakeLlm::start(|_| Reply::Json(json!({"queries": ["Where is FC Cartagena based?"]}))).await;
    let settings = support::settings(&llm.base_url);
    let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(16));
    let mut queries = bus.subscribe(&[Topic::Queries], "t").await.unwrap();
    let running = support::start_query_gen(&bus, &settings).await;
    ready.store(true, Ordering::Relaxed);
    assert_eq!(get(address, "/readyz").await.0, 200);

    let mut memory = lacuna::topics::Memory::new("m1", "Hugo plays for a team in the autonomous community of what?");
    memory.queries.push(memory.question.clone());
    bus.publish(MissingEvent { schema_version: SCHEMA_VERSION, memory, missing_information: "x".into() }.to_record())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), queries.next()).await.unwrap().unwrap();
    // The sent counter moves after the publish returns; give the actor its turn.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Nobody consumes `facts` here: two records wait in it.
    for n in 0..2 {
        let record = lacuna::topics::Record {
            topic: Topic::Facts,
            key: format!("f{n}"),
            payload: b"{}".to_vec(),
            trace: Default::default(),
        };
        bus.publish(record).await.unwrap();
    }

    let (status, text) = get(address, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        r#"lacuna_stage_events_received_total{stage="query_gen"} 1"#,
        r#"lacuna_stage_events_sent_total{stage="query_gen"} 1"#,
        r#"lacuna_stage_in_flight{stage="query_gen"} 0"#,
        r#"lacuna_llm_calls_total{stage="query_gen"} 1"#,
        r#"lacuna_llm_prompt_tokens_total{stage="query_gen"} 100"#,
        r#"lacuna_llm_cached_prompt_tokens_total{stage="query_gen"} 40"#,
        r#"lacuna_stage_processing_seconds_count{stage="query_gen"} 1"#,
        r#"lacuna_bus_queue_depth{topic="facts"} 2"#,
        r#"lacuna_bus_queue_depth{topic="missing"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in:\n{text}");
    }
    running.stop();
}
