//! Every metric Lacuna exports, in one place. Names follow docs/metrics.md (a test checks the two
//! agree): `lacuna_<subject>_<unit>[_total]`, base units, a `stage` label, error types from a fixed set.

use std::sync::LazyLock;

use prometheus::core::Collector;
use prometheus::{
    CounterVec, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    pub events_received: IntCounterVec,
    pub events_sent: IntCounterVec,
    pub events_failed: IntCounterVec,
    pub retries: IntCounterVec,
    pub dead_letters: IntCounterVec,
    pub processing_seconds: HistogramVec,
    pub in_flight: IntGaugeVec,
    pub progress_dropped: IntCounterVec,
    pub trace_spans_exported: IntCounterVec,
    pub trace_spans_dropped: IntCounterVec,
    pub serve_requests: IntCounterVec,
    pub serve_open_questions: IntGaugeVec,
    pub serve_registry_bytes: IntGaugeVec,
    pub producer_renewals: IntCounterVec,
    pub transactions: IntCounterVec,
    pub transaction_aborts: IntCounterVec,
    pub transaction_hold_seconds: HistogramVec,
    pub transaction_longest_hold_seconds: GaugeVec,
    pub serve_rejected: IntCounterVec,
    pub llm_calls: IntCounterVec,
    pub llm_errors: IntCounterVec,
    pub llm_request_seconds: HistogramVec,
    pub llm_in_flight: IntGaugeVec,
    pub llm_prompt_tokens: IntCounterVec,
    pub llm_completion_tokens: IntCounterVec,
    pub llm_cached_tokens: IntCounterVec,
    pub llm_cache_hits: IntCounterVec,
    pub llm_reasks: IntCounterVec,
    pub llm_cost: CounterVec,
    pub llm_circuit_open: IntGaugeVec,
    pub llm_circuit_opened: IntCounterVec,
    pub degraded: IntCounterVec,
    pub publish_retries: IntCounterVec,
    pub duplicates_skipped: IntCounterVec,
    pub events_let_go: IntCounterVec,
    pub nacks: IntCounterVec,
    pub dropped_deliveries: IntCounterVec,
    pub stage_failures: IntCounterVec,
    pub model_batch_size: HistogramVec,
    pub model_pairs: IntCounterVec,
    pub model_tokens: IntCounterVec,
    pub model_inference_seconds: HistogramVec,
    pub answers: IntCounterVec,
    pub answers_rejected: IntCounterVec,
    pub answer_iterations: HistogramVec,
    pub answer_llm_calls: HistogramVec,
    pub answer_passages: HistogramVec,
    pub queue_depth: IntGaugeVec,
    pub paused_partitions: IntGaugeVec,
    pub missing_acls: IntGaugeVec,
    pub waiting_records: IntGaugeVec,
    pub consumer_lag: IntGaugeVec,
    pub join_pending: IntGaugeVec,
    /// 1 while `/readyz` answers 200: the alert on a stage that is up but not working reads it.
    pub ready: IntGaugeVec,
    pub join_deadlines: IntCounterVec,
    pub join_late_results: IntCounterVec,
    pub index_applied_offset: IntGaugeVec,
    pub index_lag: IntGaugeVec,
    pub index_passages: IntGaugeVec,
    pub index_changes: IntCounterVec,
    pub index_commit_seconds: HistogramVec,
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter")
}

fn histogram(name: &str, help: &str, labels: &[&str], buckets: Vec<f64>) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels).expect("a valid histogram")
}

// From a millisecond to the LLM's minutes.
fn seconds() -> Vec<f64> {
    vec![0.001, 0.005, 0.02, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
}

fn counts(max: f64) -> Vec<f64> {
    let mut buckets = vec![0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0];
    buckets.retain(|b| *b <= max);
    buckets
}

impl Metrics {
    fn new() -> Metrics {
        let s = &["stage"];
        let metrics = Metrics {
            registry: Registry::new(),
            events_received: counter("lacuna_stage_events_received_total", "Events a stage took from the bus.", s),
            events_sent: counter("lacuna_stage_events_sent_total", "Events a stage published.", s),
            events_failed: counter(
                "lacuna_stage_events_failed_total",
                "Events a stage gave up on (error record and dead letter).",
                &["stage", "error_type"],
            ),
            retries: counter("lacuna_stage_retries_total", "Event retries after transient failures.", s),
            dead_letters: counter("lacuna_stage_dead_letters_total", "Events sent to the dead-letter topic.", s),
            processing_seconds: histogram(
                "lacuna_stage_processing_seconds",
                "Time from taking an event to acknowledging it.",
                s,
                seconds(),
            ),
            in_flight: IntGaugeVec::new(Opts::new("lacuna_stage_in_flight", "Events a stage is processing now."), s)
                .expect("a valid gauge"),
            llm_calls: counter("lacuna_llm_calls_total", "LLM calls that returned an answer.", s),
            llm_errors: counter(
                "lacuna_llm_errors_total",
                "LLM calls that failed after retries.",
                &["stage", "error_type"],
            ),
            llm_request_seconds: histogram(
                "lacuna_llm_request_seconds",
                "LLM call latency, retries included.",
                s,
                seconds(),
            ),
            llm_in_flight: IntGaugeVec::new(
                Opts::new(
                    "lacuna_llm_in_flight",
                    "LLM calls holding a concurrency slot now (sent or being retried); compare with llm_concurrency.",
                ),
                s,
            )
            .expect("a valid metric"),
            llm_prompt_tokens: counter("lacuna_llm_prompt_tokens_total", "Prompt tokens sent to the LLM.", s),
            llm_completion_tokens: counter("lacuna_llm_completion_tokens_total", "Tokens the LLM wrote.", s),
            llm_cached_tokens: counter(
                "lacuna_llm_cached_prompt_tokens_total",
                "Prompt tokens the server took from its prefix cache (when it reports them).",
                s,
            ),
            llm_cache_hits: counter(
                "lacuna_llm_cache_hits_total",
                "LLM calls answered from Lacuna's response cache (llm.cache) without reaching the endpoint.",
                s,
            ),
            llm_reasks: counter(
                "lacuna_llm_reasks_total",
                "LLM replies that could not be used and were asked again, by cause (unparsable, cut_at_max_tokens).",
                &["stage", "cause"],
            ),
            llm_cost: CounterVec::new(
                Opts::new("lacuna_llm_cost_total", "What the LLM calls cost by llm.prices, in its currency."),
                s,
            )
            .expect("a valid counter"),
            llm_circuit_open: IntGaugeVec::new(
                Opts::new(
                    "lacuna_llm_circuit_open",
                    "1 while calls to this LLM endpoint wait for a probe after repeated failures (llm.breaker).",
                ),
                &["endpoint"],
            )
            .expect("a valid gauge"),
            llm_circuit_opened: counter(
                "lacuna_llm_circuit_opened_total",
                "Times the circuit of an LLM endpoint opened after repeated failures.",
                &["endpoint"],
            ),
            degraded: counter(
                "lacuna_stage_degraded_total",
                "Events a stage handled in a degraded way instead of failing their question (docs/operations.md).",
                s,
            ),
            duplicates_skipped: counter(
                "lacuna_stage_duplicates_skipped_total",
                "Events a stage acknowledged without processing: it had already finished the same event (bus.dedupe_window).",
                s,
            ),
            events_let_go: counter(
                "lacuna_stage_events_let_go_total",
                "Events whose partition was revoked while the stage processed them: their outcome was dropped, the partition's new owner does them again.",
                s,
            ),
            publish_retries: counter(
                "lacuna_stage_publish_retries_total",
                "Publishes retried after a transient bus error.",
                s,
            ),
            nacks: counter(
                "lacuna_bus_nacks_total",
                "Deliveries refused on purpose because their outcome could not be published (the stage then fails).",
                &["topic"],
            ),
            dropped_deliveries: counter(
                "lacuna_bus_dropped_deliveries_total",
                "Deliveries dropped without ack or nack (a bug, or a stage stopped at once).",
                &["topic"],
            ),
            stage_failures: counter(
                "lacuna_stage_failures_total",
                "Stages that stopped working: a dead feed, a dead actor, an outcome that could not be published.",
                s,
            ),
            model_batch_size: histogram(
                "lacuna_model_batch_size",
                "Pairs per ONNX inference call.",
                &["model"],
                vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0],
            ),
            model_pairs: counter("lacuna_model_pairs_total", "Text pairs scored by an ONNX model.", &["model"]),
            model_tokens: counter(
                "lacuna_model_tokens_total",
                "Tokens fed to an ONNX model, by kind: real, or padded (real plus padding; the ratio is wasted work).",
                &["model", "kind"],
            ),
            model_inference_seconds: histogram(
                "lacuna_model_inference_seconds",
                "ONNX inference time per call.",
                &["model"],
                seconds(),
            ),
            answers: counter(
                "lacuna_answers_total",
                "Questions ended, by outcome (answered, answered_at_limit, answered_after_deadline, error).",
                &["outcome"],
            ),
            answers_rejected: counter(
                "lacuna_main_answers_rejected_total",
                "Answers the main module wrote but did not accept, by reason (not_confident, ungrounded).",
                &["reason"],
            ),
            answer_iterations: histogram(
                "lacuna_answer_iterations",
                "Iterations per answered question.",
                &[],
                counts(13.0),
            ),
            answer_llm_calls: histogram(
                "lacuna_answer_llm_calls",
                "LLM calls per answered question.",
                &[],
                counts(55.0),
            ),
            answer_passages: histogram(
                "lacuna_answer_passages",
                "Passages cited by the facts of an answered question.",
                &[],
                counts(34.0),
            ),
            queue_depth: IntGaugeVec::new(
                Opts::new("lacuna_bus_queue_depth", "Records waiting in an in-process topic."),
                &["topic"],
            )
            .expect("a valid gauge"),
            paused_partitions: IntGaugeVec::new(
                Opts::new(
                    "lacuna_kafka_paused_partitions",
                    "Partitions a consumer group paused because its stage is full.",
                ),
                &["group"],
            )
            .expect("a valid gauge"),
            missing_acls: IntGaugeVec::new(
                Opts::new(
                    "lacuna_kafka_missing_acls",
                    "1 for each ACL the cluster does not grant a stage that waits, unready, for it.",
                ),
                &["stage", "operation", "resource", "name", "principal"],
            )
            .expect("a valid gauge"),
            waiting_records: IntGaugeVec::new(
                Opts::new(
                    "lacuna_kafka_waiting_records",
                    "Records a consumer fetched and holds in memory because its stage is full.",
                ),
                &["group"],
            )
            .expect("a valid gauge"),
            consumer_lag: IntGaugeVec::new(
                Opts::new(
                    "lacuna_kafka_consumer_lag",
                    "Records not yet consumed on the partitions this process holds, per consumer group.",
                ),
                &["group"],
            )
            .expect("a valid gauge"),
            join_pending: IntGaugeVec::new(
                Opts::new("lacuna_join_pending", "Fanned-out nodes the join stage is waiting on children for."),
                &[],
            )
            .expect("a valid gauge"),
            ready: IntGaugeVec::new(
                Opts::new("lacuna_ready", "1 while the process is ready (/readyz answers 200), else 0."),
                &[],
            )
            .expect("a valid gauge"),
            join_deadlines: counter(
                "lacuna_join_deadlines_total",
                "Fan-outs the join gave up waiting for at their deadline (continued with the children back).",
                &[],
            ),
            progress_dropped: counter(
                "lacuna_progress_dropped_total",
                "Progress records a stage could not publish in time (best-effort: the question goes on).",
                s,
            ),
            trace_spans_exported: counter(
                "lacuna_trace_spans_exported_total",
                "Spans the OTLP backend accepted ([otel]).",
                &[],
            ),
            trace_spans_dropped: counter(
                "lacuna_trace_spans_dropped_total",
                "Spans dropped instead of slowing a question: the export queue was full (queue_full), or the backend failed or was too slow to take their batch (export_failed).",
                &["reason"],
            ),
            serve_requests: counter(
                "lacuna_serve_requests_total",
                "HTTP requests `lacuna serve` answered, by route and status code.",
                &["route", "status"],
            ),
            serve_open_questions: IntGaugeVec::new(
                Opts::new("lacuna_serve_open_questions", "Questions `lacuna serve` accepted that have no record yet."),
                &[],
            )
            .expect("a valid gauge"),
            serve_registry_bytes: IntGaugeVec::new(
                Opts::new(
                    "lacuna_serve_registry_bytes",
                    "What `lacuna serve`'s registry holds in events and records, in bytes (bounded by serve.registry_max_bytes).",
                ),
                &[],
            )
            .expect("a valid gauge"),
            producer_renewals: counter(
                "lacuna_kafka_producer_renewals_total",
                "Kafka producers replaced after a fatal error (a broker that lost the idempotent producer's state).",
                &[],
            ),
            transactions: counter(
                "lacuna_kafka_transactions_total",
                "Kafka transactions committed (exactly-once: a stage process's outputs and consumed positions).",
                &[],
            ),
            transaction_aborts: counter(
                "lacuna_kafka_transaction_aborts_total",
                "Kafka transactions aborted and rewound to the last commit, by cause (publish_failed, commit_failed, assignment_lost).",
                &["cause"],
            ),
            transaction_hold_seconds: histogram(
                "lacuna_kafka_transaction_hold_seconds",
                "How long each hold inside an open Kafka transaction lasted (exactly-once), by holder: an event between its first output and its acknowledgement, or a commit's own calls. Each is bounded by half of kafka.transaction_timeout_ms.",
                &["holder"],
                seconds(),
            ),
            transaction_longest_hold_seconds: GaugeVec::new(
                Opts::new(
                    "lacuna_kafka_transaction_longest_hold_seconds",
                    "The longest hold inside an open Kafka transaction since the process started, by holder (exactly-once).",
                ),
                &["holder"],
            )
            .expect("a valid gauge"),
            serve_rejected: counter(
                "lacuna_serve_rejected_total",
                "Questions `lacuna serve` refused, by reason (too_many_open, bad_request, unauthorized, ...).",
                &["reason"],
            ),
            join_late_results: counter(
                "lacuna_join_late_results_total",
                "Children's results that arrived after their parent had gone on (dropped).",
                &[],
            ),
            index_applied_offset: IntGaugeVec::new(
                Opts::new(
                    "lacuna_index_applied_offset",
                    "The next offset of each documents-topic partition this replica's index holds everything before (committed).",
                ),
                &["partition"],
            )
            .expect("a valid gauge"),
            index_lag: IntGaugeVec::new(
                Opts::new(
                    "lacuna_index_lag",
                    "Documents-topic records this replica's index has not committed yet, per partition.",
                ),
                &["partition"],
            )
            .expect("a valid gauge"),
            index_passages: IntGaugeVec::new(
                Opts::new("lacuna_index_passages", "Live passages in this replica's index, as of its last commit."),
                &[],
            )
            .expect("a valid gauge"),
            index_changes: counter(
                "lacuna_index_changes_total",
                "Documents-topic records applied to this replica's index: upsert, delete, or rejected (not a document).",
                &["change"],
            ),
            index_commit_seconds: histogram(
                "lacuna_index_commit_seconds",
                "Time to commit what a replica applied from the documents topic.",
                &[],
                seconds(),
            ),
        };
        for collector in metrics.collectors() {
            metrics.registry.register(collector).expect("metric names are unique");
        }
        // Series of a fixed label set start at 0, so a rate over them reads 0 rather than nothing
        // (traces off, or on and never dropping).
        metrics.trace_spans_exported.with_label_values::<&str>(&[]);
        for reason in ["queue_full", "export_failed"] {
            metrics.trace_spans_dropped.with_label_values(&[reason]);
        }
        metrics
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.events_received.clone()),
            Box::new(self.events_sent.clone()),
            Box::new(self.events_failed.clone()),
            Box::new(self.retries.clone()),
            Box::new(self.dead_letters.clone()),
            Box::new(self.processing_seconds.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.llm_calls.clone()),
            Box::new(self.llm_errors.clone()),
            Box::new(self.llm_request_seconds.clone()),
            Box::new(self.llm_in_flight.clone()),
            Box::new(self.llm_prompt_tokens.clone()),
            Box::new(self.llm_completion_tokens.clone()),
            Box::new(self.llm_cached_tokens.clone()),
            Box::new(self.llm_cache_hits.clone()),
            Box::new(self.llm_reasks.clone()),
            Box::new(self.llm_cost.clone()),
            Box::new(self.llm_circuit_open.clone()),
            Box::new(self.llm_circuit_opened.clone()),
            Box::new(self.degraded.clone()),
            Box::new(self.publish_retries.clone()),
            Box::new(self.duplicates_skipped.clone()),
            Box::new(self.events_let_go.clone()),
            Box::new(self.nacks.clone()),
            Box::new(self.dropped_deliveries.clone()),
            Box::new(self.stage_failures.clone()),
            Box::new(self.model_batch_size.clone()),
            Box::new(self.model_pairs.clone()),
            Box::new(self.model_tokens.clone()),
            Box::new(self.model_inference_seconds.clone()),
            Box::new(self.answers.clone()),
            Box::new(self.answers_rejected.clone()),
            Box::new(self.answer_iterations.clone()),
            Box::new(self.answer_llm_calls.clone()),
            Box::new(self.answer_passages.clone()),
            Box::new(self.queue_depth.clone()),
            Box::new(self.paused_partitions.clone()),
            Box::new(self.missing_acls.clone()),
            Box::new(self.waiting_records.clone()),
            Box::new(self.consumer_lag.clone()),
            Box::new(self.join_pending.clone()),
            Box::new(self.ready.clone()),
            Box::new(self.join_deadlines.clone()),
            Box::new(self.join_late_results.clone()),
            Box::new(self.progress_dropped.clone()),
            Box::new(self.trace_spans_exported.clone()),
            Box::new(self.trace_spans_dropped.clone()),
            Box::new(self.serve_requests.clone()),
            Box::new(self.serve_open_questions.clone()),
            Box::new(self.serve_registry_bytes.clone()),
            Box::new(self.producer_renewals.clone()),
            Box::new(self.transactions.clone()),
            Box::new(self.transaction_aborts.clone()),
            Box::new(self.transaction_hold_seconds.clone()),
            Box::new(self.transaction_longest_hold_seconds.clone()),
            Box::new(self.serve_rejected.clone()),
            Box::new(self.index_applied_offset.clone()),
            Box::new(self.index_lag.clone()),
            Box::new(self.index_passages.clone()),
            Box::new(self.index_changes.clone()),
            Box::new(self.index_commit_seconds.clone()),
        ]
    }

    /// The names of every exported metric family.
    pub fn names(&self) -> Vec<String> {
        self.collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()).collect::<Vec<_>>())
            .collect()
    }

    /// The Prometheus text exposition of everything observed so far.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
