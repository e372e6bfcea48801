//! A process that leaves before `main` returns (a failed Kafka transaction ends it with status 75,
//! through `telemetry::exit`) first sends its queued spans and drops its ONNX sessions, as `main`
//! does on its way out. In a test binary of its own: the exit hooks act on the whole process, and
//! `cargo test` runs a binary's tests in one.

mod support;

use lacuna::actors::clients::Reranker;
use lacuna::config::Settings;
use support::phoenix::OwnPhoenix;

/// The span is the failure's own trace, the one an operator looks for; with a ten-minute export
/// interval only the exit path can send it. A CUDA session left to the exit would turn status 75
/// into an abort; on the CPU a call after the release is an error.
#[test]
fn a_process_that_exits_early_sends_its_queued_spans_and_drops_its_sessions_first() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let phoenix = OwnPhoenix::start("early-exit");
    let mut otel = Settings::defaults().otel;
    otel.endpoint = phoenix.endpoint();
    otel.sampling_ratio = 1.0;
    otel.export_interval_ms = 600_000;
    let _traces = lacuna::telemetry::init(&otel, "test").unwrap().expect("traces on");
    let reranker = Reranker::load(&Settings::defaults().rerank, &Settings::defaults().onnx).unwrap();
    let pairs = vec![("Who is Hugo?".to_string(), "Hugo Rodríguez Romero is a Spanish footballer.".to_string())];
    assert_eq!(runtime.block_on(reranker.score(pairs.clone())).unwrap().len(), 1);
    {
        use opentelemetry::trace::{Span as _, Tracer as _};
        lacuna::telemetry::tracer().start("the last step before exiting").end();
    }

    lacuna::telemetry::exit::run_exit_hooks();

    let error = runtime.block_on(reranker.score(pairs)).unwrap_err().to_string();
    assert!(error.contains("released"), "{error}");
    let spans = runtime.block_on(phoenix.settled_spans());
    assert!(spans.iter().any(|s| s.name == "the last step before exiting"), "the queued span was sent: {spans:?}");
}
