//! Traces in a real backend: questions through the six `lacuna stage` processes over the broker,
//! exported over OTLP/HTTP to Arize Phoenix (`scripts/phoenix.sh`) and read back through Phoenix's
//! HTTP API, as an operator would find them. The second test stops Phoenix mid-run.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use lacuna::pipelines::PipelineKind;
use lacuna::topics::{AnswerRecord, VersionedAnswer};
use support::cluster::{Cluster, answer_ids, bus, write_questions};
use support::fake_llm::FakeLlm;
use support::phoenix::{OwnPhoenix, Span};
use support::scripted::two_hops;

const QUESTIONS: usize = 6;

/// A cluster whose every process exports to `endpoint`, each question traced, a batch at least
/// every 200 ms; its questions submitted, and the answers sink running.
struct Traced {
    cluster: Cluster,
    sink: Child,
    answers: PathBuf,
    expected: BTreeSet<String>,
}

impl Traced {
    fn start(test: &str, endpoint: &str, llm_url: &str) -> Traced {
        let settings = support::cluster::settings(test, llm_url);
        tokio::runtime::Runtime::new().unwrap().block_on(bus(&settings));
        let env = [
            ("LACUNA__OTEL__ENDPOINT", endpoint),
            ("LACUNA__OTEL__SAMPLING_RATIO", "1"),
            ("LACUNA__OTEL__EXPORT_INTERVAL_MS", "200"),
            ("LACUNA__OTEL__EXPORT_TIMEOUT_MS", "2000"),
        ];
        let cluster = Cluster::start_with_env(&settings, llm_url, &env);
        let dir = support::scratch_dir(test);
        let (questions, answers) = (dir.join("questions.jsonl"), dir.join("answers.jsonl"));
        let _ = std::fs::remove_file(&answers);
        let expected = write_questions(&questions, QUESTIONS);
        let sink = cluster.sink(&answers, QUESTIONS, 180);
        let submitted = cluster.command(&["submit", "--questions", questions.to_str().unwrap()]).status().unwrap();
        assert!(submitted.success());
        Traced { cluster, sink, answers, expected }
    }

    /// Waits for the sink to hold a record of every question; then stops every stage with SIGTERM,
    /// so each drains and sends its last spans as it exits.
    fn finish(mut self) -> Vec<AnswerRecord> {
        assert!(self.sink.wait().unwrap().success(), "the sink got a record for every question");
        for stage in PipelineKind::Migres.stages() {
            let status = self.cluster.signal(stage.name, "-TERM").wait().unwrap();
            assert!(status.success(), "{} exits cleanly on SIGTERM: {status}", stage.name);
        }
        let records: Vec<AnswerRecord> = std::fs::read_to_string(&self.answers)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str::<VersionedAnswer>(line).unwrap().record)
            .collect();
        let ids: Vec<String> = records.iter().map(|r| r.question_id().to_string()).collect();
        assert_eq!(ids.len(), QUESTIONS, "exactly one record per question");
        assert_eq!(ids.into_iter().collect::<BTreeSet<_>>(), self.expected, "no question lost");
        records
    }
}

fn trace_id(record: &AnswerRecord) -> String {
    let AnswerRecord::Answered(answered) = record else { panic!("answered: {record:?}") };
    let provenance = answered.provenance.as_ref().expect("a stamped record");
    provenance.trace_id.clone().expect("the record names its trace")
}

/// The spans of a stage handling an event.
fn stage_spans(spans: &[Span]) -> Vec<&Span> {
    spans
        .iter()
        .filter(|span| span.text("lacuna.stage").is_some() && span.text("lacuna.question_id").is_some())
        .collect()
}

#[test]
fn every_question_is_one_trace_across_the_stage_processes_redeliveries_included() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let llm = runtime.block_on(FakeLlm::start(two_hops));
    let phoenix = OwnPhoenix::start("traces");
    let mut traced = Traced::start("traces", &phoenix.endpoint(), &llm.base_url);
    // Killed at work and restarted: the event it held is redelivered to the new process.
    traced.cluster.signal_at_work("leaf", "-KILL", Duration::from_secs(120)).wait().unwrap();
    traced.cluster.spawn("leaf");
    let records = traced.finish();
    let spans = runtime.block_on(phoenix.settled_spans());

    let by_question: BTreeMap<String, &AnswerRecord> =
        records.iter().map(|r| (r.question_id().to_string(), r)).collect();
    let traces: BTreeMap<&str, String> = by_question.iter().map(|(id, r)| (id.as_str(), trace_id(r))).collect();
    assert_eq!(traces.values().collect::<BTreeSet<_>>().len(), QUESTIONS, "a trace of its own per question");

    let stages: BTreeSet<&str> = PipelineKind::Migres.stages().iter().map(|s| s.name).collect();
    let mut replicas: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for span in stage_spans(&spans) {
        let question = span.text("lacuna.question_id").unwrap();
        assert_eq!(span.trace_id, traces[question], "{question}'s {} span is in its trace", span.name);
        replicas.entry(span.text("lacuna.stage").unwrap()).or_default().insert(span.text("lacuna.replica").unwrap());
    }
    for (question, trace) in &traces {
        let in_trace: Vec<&Span> = spans.iter().filter(|s| &s.trace_id == trace).collect();
        let seen: BTreeSet<&str> = in_trace.iter().filter_map(|s| s.text("lacuna.stage")).collect();
        assert_eq!(seen, stages, "{question}'s trace has a span from every stage");
        let roots: Vec<&&Span> = in_trace.iter().filter(|s| s.parent_id.is_none()).collect();
        assert_eq!(roots.len(), 1, "{question}'s trace has one root: {roots:?}");
        assert_eq!(roots[0].name, "question");
        // A flat timeline: every stage span hangs from the root, however many rounds the loop took.
        for span in
            in_trace.iter().filter(|s| s.text("lacuna.stage").is_some() && s.text("lacuna.question_id").is_some())
        {
            assert_eq!(span.parent_id.as_ref(), Some(&roots[0].span_id), "{question}: {} under the root", span.name);
        }
    }
    // Each stage's spans come from its own processes (the killed leaf's event span never ended).
    let all: Vec<&str> = replicas.values().flatten().copied().collect();
    assert_eq!(all.len(), all.iter().collect::<BTreeSet<_>>().len(), "no process serves two stages: {replicas:?}");

    // The event leaf held when it was killed, handled again by its successor, in the same trace.
    let redelivered: Vec<&Span> = stage_spans(&spans)
        .into_iter()
        .filter(|s| s.text("lacuna.stage") == Some("leaf") && s.number("lacuna.redeliveries").unwrap_or(0) >= 1)
        .collect();
    assert!(!redelivered.is_empty(), "a redelivered leaf event has a span");

    // Where every record was handled once, the LLM spans add up to the record's usage.
    let mut checked = 0;
    for (question, trace) in &traces {
        // A record is one (topic, partition, offset): handled twice after a crash, its work counts twice.
        let handled: Vec<(&str, &str, u64)> = stage_spans(&spans)
            .into_iter()
            .filter(|s| &s.trace_id == trace)
            .map(|s| {
                let topic = s.text("messaging.destination.name").unwrap();
                (
                    topic,
                    s.text("messaging.destination.partition.id").unwrap(),
                    s.number("messaging.kafka.offset").unwrap(),
                )
            })
            .collect();
        if handled.len() != handled.iter().collect::<BTreeSet<_>>().len() {
            continue;
        }
        let calls: Vec<&Span> =
            spans.iter().filter(|s| &s.trace_id == trace && s.text("gen_ai.operation.name") == Some("chat")).collect();
        let sum = |key: &str| calls.iter().map(|s| s.number(key).unwrap()).sum::<u64>();
        let AnswerRecord::Answered(answered) = by_question[*question] else { unreachable!() };
        assert_eq!(calls.len() as u32, answered.usage.llm_calls, "{question}: an LLM span per call");
        assert_eq!(sum("gen_ai.usage.input_tokens"), answered.usage.prompt_tokens, "{question}: input tokens");
        assert_eq!(sum("gen_ai.usage.output_tokens"), answered.usage.completion_tokens, "{question}: output tokens");
        assert_eq!(sum("gen_ai.usage.cache_read.input_tokens"), answered.usage.cached_tokens, "{question}: cached");
        assert!(calls.iter().all(|s| s.text("gen_ai.request.model").is_some()), "{question}: the model is named");
        checked += 1;
    }
    assert!(checked * 2 >= QUESTIONS, "only {checked} questions were handled once per event");
    // No prompt text by default.
    assert!(spans.iter().all(|s| !s.attributes.contains_key("gen_ai.input.messages")), "no prompt text");
}

#[test]
fn a_backend_that_stops_mid_run_costs_counted_spans_never_a_question() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let llm = runtime.block_on(FakeLlm::start(two_hops));
    let phoenix = OwnPhoenix::start("traces-outage");
    let mut traced = Traced::start("traces-outage", &phoenix.endpoint(), &llm.base_url);
    let started = Instant::now();
    while answer_ids(&traced.answers).is_empty() {
        assert!(started.elapsed() < Duration::from_secs(300), "a first answer within 5 minutes");
        std::thread::sleep(Duration::from_millis(100));
    }
    phoenix.stop();
    assert!(traced.sink.wait().unwrap().success(), "every question ends in a record with the backend down");

    // Summed over the stages' /metrics, read while they run.
    let counted = |series: &str| -> f64 {
        let value = |text: String| text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok());
        PipelineKind::Migres.stages().iter().filter_map(|s| traced.cluster.metrics(s.name).and_then(value)).sum()
    };
    assert!(counted("lacuna_trace_spans_exported_total ") > 0.0, "spans went out while the backend was up");
    // A failed batch is counted once its export gives up (export_timeout_ms).
    let dropped = "lacuna_trace_spans_dropped_total{reason=\"export_failed\"} ";
    let waited = Instant::now();
    while counted(dropped) == 0.0 {
        assert!(waited.elapsed() < Duration::from_secs(30), "the spans the stopped backend could not take are counted");
        std::thread::sleep(Duration::from_millis(200));
    }
    let records = traced.finish();
    assert!(records.iter().all(|r| matches!(r, AnswerRecord::Answered(_))), "every question answered");
}

#[test]
fn a_pipeline_in_one_process_exports_over_grpc_too() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let phoenix = OwnPhoenix::start("traces-grpc");
    let dataset = support::data_dir().join("hotpotqa");
    let bench = std::process::Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .args(["bench", "pipeline", "--dataset", dataset.to_str().unwrap(), "--limit", "2", "--fake-llm-ms", "0"])
        .env("LACUNA__OTEL__ENDPOINT", phoenix.grpc_endpoint())
        .env("LACUNA__OTEL__PROTOCOL", "grpc")
        .env("LACUNA__OTEL__SAMPLING_RATIO", "1")
        .output()
        .unwrap();
    assert!(bench.status.success(), "{}", String::from_utf8_lossy(&bench.stderr));
    let spans = runtime.block_on(phoenix.settled_spans());
    let questions: BTreeMap<&str, BTreeSet<&str>> =
        stage_spans(&spans).into_iter().fold(BTreeMap::new(), |mut map, s| {
            map.entry(s.text("lacuna.question_id").unwrap()).or_default().insert(s.trace_id.as_str());
            map
        });
    assert_eq!(questions.len(), 2, "both questions traced: {questions:?}");
    assert!(questions.values().all(|traces| traces.len() == 1), "one trace each: {questions:?}");
    for kind in ["LLM", "RETRIEVER", "RERANKER"] {
        assert!(spans.iter().any(|s| s.kind == kind), "a {kind} span");
    }
}
