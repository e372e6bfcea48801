//! `lacuna bench pipeline`: a pipeline run in process over a dataset folder, against a real LLM
//! endpoint or the fake one, reporting where the time goes: questions/s, LLM calls in flight against
//! a fixed limit, busy seconds per stage, re-ranker pairs/s and padding, latency percentiles and
//! peak memory; and the answers scored against the dataset (EM, the gold passages each reached), so
//! a cost lever's figures and what it does to the answers come from one run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum as _;
use serde::Serialize;

use crate::bench::replica::{Replica, free_port};
use crate::config::Settings;
use crate::eval::dataset::Dataset;
use crate::eval::funnel::Funnel;
use crate::eval::report::EvalRecord;
use crate::metrics::METRICS;
use crate::pipelines::parts::Parts;
use crate::pipelines::{Pipeline, PipelineKind, Transport};
use crate::topics::{AnswerRecord, QuestionEvent};

/// The limit LLM concurrency is reported against, whatever the stages' own limits.
pub const LLM_LIMIT: f64 = 32.0;

#[derive(Clone, Debug, Serialize)]
pub struct PipelineBench {
    pub label: String,
    pub pipeline: String,
    /// `in-process` or `kafka`: runs compared in one table should have come the same way.
    pub transport: String,
    pub dataset: String,
    /// The half of the dataset the questions came from (`--half`), if cut to one.
    pub half: Option<crate::eval::split::Half>,
    pub questions: usize,
    pub errors: usize,
    pub open_questions: usize,
    pub seconds: f64,
    pub questions_per_second: f64,
    pub llm_calls: u64,
    /// Calls answered from the response cache (`--llm-cache`) instead of the endpoint.
    pub llm_cache_hits: u64,
    /// Mean LLM calls in flight between the first and the last answer, and that over [`LLM_LIMIT`].
    pub llm_in_flight: f64,
    pub llm_concurrency: f64,
    /// Seconds spent processing events, per stage (events in parallel add up).
    pub stage_busy_seconds: BTreeMap<String, f64>,
    /// Seconds spent waiting on LLM replies, per stage.
    pub stage_llm_seconds: BTreeMap<String, f64>,
    pub rerank_pairs: u64,
    /// Pairs per second of inference time (one worker's view) and of wall time.
    pub rerank_pairs_per_inference_second: f64,
    pub rerank_pairs_per_second: f64,
    pub rerank_inference_seconds: f64,
    pub padded_per_real: f64,
    pub latency_p50: f64,
    pub latency_p95: f64,
    /// The process's peak resident memory so far (VmHWM), in MiB.
    pub peak_rss_mib: f64,
    /// With stages in processes of their own: each process's stage and how it exited after SIGTERM.
    pub processes: Vec<(String, String)>,
    /// The answers scored as `lacuna eval` scores them.
    pub answers: Answers,
}

/// A run's answers scored against the dataset's answers and gold passages, as `lacuna eval` scores
/// them. With the fake LLM every query and answer is the question itself, so only the gold passages
/// retrieved and shown say something there: what search and the re-ranker's filter found for it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Answers {
    /// Exact match, over every question.
    pub em: f64,
    /// Mean share of the gold passages among those each answer cites, over the answered questions
    /// with gold passages; `None` without any.
    pub cited_gold_recall: Option<f64>,
    /// Questions with gold passage ids, and of those the ones whose every gold passage was retrieved,
    /// shown to an LLM, cited (`eval --compare`'s funnel).
    pub with_gold: usize,
    pub all_gold_retrieved: usize,
    pub all_gold_shown: usize,
    pub all_gold_cited: usize,
}

impl Answers {
    fn of(records: &[EvalRecord]) -> Answers {
        let funnel = Funnel::of("", "", records);
        let recalls: Vec<f64> = records.iter().filter_map(|r| r.cited_gold_recall).collect();
        Answers {
            em: records.iter().filter(|r| r.is_right()).count() as f64 / records.len().max(1) as f64,
            cited_gold_recall: (!recalls.is_empty()).then(|| recalls.iter().sum::<f64>() / recalls.len() as f64),
            with_gold: funnel.with_gold,
            all_gold_retrieved: funnel.retrieved_all,
            all_gold_shown: funnel.shown_all,
            all_gold_cited: funnel.cited_all,
        }
    }
}

/// A stage that runs in `replicas` processes of its own (`binary`, a `lacuna` executable) instead of
/// in the bench's process, on the run's Kafka topics.
#[derive(Clone, Debug)]
pub struct OutOfProcess {
    pub binary: std::path::PathBuf,
    pub stage: &'static str,
    pub replicas: usize,
}

/// Runs `dataset`'s questions through `kind` once with `settings` (whose LLM endpoint is already the
/// real or the fake one), over `transport`. On Kafka each run has topics and groups of its own (a
/// fresh prefix), so runs in one invocation never read each other's records.
pub async fn run_over(
    label: &str,
    (kind, transport): (PipelineKind, Transport),
    settings: &Settings,
    dataset: &Dataset,
    elsewhere: Option<&OutOfProcess>,
) -> anyhow::Result<PipelineBench> {
    let mut settings = settings.clone();
    if transport == Transport::Kafka {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
        settings.kafka.topic_prefix = format!("{}bench-{nanos}.", settings.kafka.topic_prefix);
    }
    if let Some(elsewhere) = elsewhere {
        anyhow::ensure!(transport == Transport::Kafka, "stages in processes of their own need --transport kafka");
        // A replica without a partition of its own would idle.
        settings.kafka.partitions = settings.kafka.partitions.max(elsewhere.replicas as i32);
    }
    run_on(label, (kind, transport), &settings, dataset, dataset.index_dir()?, elsewhere).await
}

/// [`run_over`], searching the index at `index_dir` (one that changes while it runs, for `bench
/// freshness`).
pub async fn run_on(
    label: &str,
    (kind, transport): (PipelineKind, Transport),
    settings: &Settings,
    dataset: &Dataset,
    index_dir: std::path::PathBuf,
    elsewhere: Option<&OutOfProcess>,
) -> anyhow::Result<PipelineBench> {
    let mut settings = settings.clone();
    settings.search.index_dir = index_dir;
    settings.bus.queue_capacity = settings.bus.queue_capacity.max(settings.run.max_open_questions + 1);
    reset_peak_rss();
    let parts = Parts::load(&settings, kind)?;
    let before = Snapshot::take();
    let mut pipeline = match elsewhere {
        None => Pipeline::start_with(kind, transport, &settings, parts).await?,
        Some(out) => {
            let bus = kind.kafka_bus(&settings).await?;
            Pipeline::start_on_without(kind, bus, &settings, parts, &[out.stage]).await?
        }
    };
    let mut processes = Vec::new();
    for (n, out) in elsewhere.iter().flat_map(|out| (0..out.replicas).map(move |n| (n, out))) {
        let log = std::env::temp_dir().join(format!("lacuna-bench-{}-{n}.log", out.stage));
        let mut replica = Replica::start_stage(&out.binary, &settings, (out.stage, kind.name()), &log, free_port()?)?;
        replica.wait_ready(Duration::from_secs(300))?;
        processes.push(replica);
    }

    // Sample the LLM calls in flight every 5 ms until the run ends.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        let started = Instant::now();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while sampling.load(Ordering::Relaxed) {
                samples.push((started.elapsed().as_secs_f64(), crate::actors::clients::llm::calls_in_flight()));
                std::thread::sleep(Duration::from_millis(5));
            }
            samples
        })
    };
    let started = Instant::now();
    let submitted: Arc<std::sync::Mutex<BTreeMap<String, f64>>> = Default::default();
    let questions = dataset.questions.iter().map(|q| {
        // Called as the runner admits the question: its latency starts here.
        submitted.lock().unwrap().insert(q.id.clone(), started.elapsed().as_secs_f64());
        QuestionEvent::new(q.id.clone(), q.question.clone()).yes_no(q.is_yes_no())
    });
    let mut finished: Vec<(f64, f64)> = Vec::new(); // (answered at, latency)
    let mut errors = 0;
    let mut scored = Vec::new();
    let by_id: std::collections::HashMap<&str, _> = dataset.questions.iter().map(|q| (q.id.as_str(), q)).collect();
    pipeline
        .run(questions, |record| {
            let at = started.elapsed().as_secs_f64();
            let since = submitted.lock().unwrap().get(record.question_id()).copied().unwrap_or(0.0);
            finished.push((at, at - since));
            errors += matches!(record, AnswerRecord::Error(_)) as usize;
            if let Some(question) = by_id.get(record.question_id()) {
                scored.push(EvalRecord::new(question, record));
            }
        })
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    pipeline.stop();
    let stage = elsewhere.map_or("", |out| out.stage);
    let processes: Vec<(String, String)> = processes
        .iter_mut()
        .map(|replica| (stage.to_string(), replica.stop().map_or("unknown".into(), |status| status.to_string())))
        .collect();
    sampling.store(false, Ordering::Relaxed);
    let samples = sampler.join().unwrap_or_default();
    let after = Snapshot::take();

    let first = finished.iter().map(|f| f.0).fold(f64::INFINITY, f64::min);
    let last = finished.iter().map(|f| f.0).fold(0.0, f64::max);
    let window: Vec<f64> = samples.iter().filter(|(t, _)| *t >= first && *t <= last).map(|(_, v)| *v as f64).collect();
    // Fewer than two answers leave no window: the whole run stands in for it.
    let in_flight = match window.is_empty() {
        true => samples.iter().map(|(_, v)| *v as f64).sum::<f64>() / samples.len().max(1) as f64,
        false => window.iter().sum::<f64>() / window.len() as f64,
    };
    let mut latencies: Vec<f64> = finished.iter().map(|f| f.1).collect();
    latencies.sort_by(f64::total_cmp);
    let pairs = after.pairs - before.pairs;
    let inference = after.inference_seconds - before.inference_seconds;
    Ok(PipelineBench {
        label: label.into(),
        pipeline: kind.name().into(),
        transport: transport.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default(),
        dataset: dataset.name.clone(),
        half: dataset.half,
        questions: finished.len(),
        errors,
        open_questions: settings.run.max_open_questions,
        seconds,
        questions_per_second: finished.len() as f64 / seconds,
        llm_calls: after.llm_calls - before.llm_calls,
        llm_cache_hits: after.llm_cache_hits - before.llm_cache_hits,
        llm_in_flight: in_flight,
        llm_concurrency: in_flight / LLM_LIMIT,
        stage_busy_seconds: difference(&after.busy, &before.busy),
        stage_llm_seconds: difference(&after.llm_seconds, &before.llm_seconds),
        rerank_pairs: pairs,
        rerank_pairs_per_inference_second: pairs as f64 / inference.max(1e-9),
        rerank_pairs_per_second: pairs as f64 / seconds,
        rerank_inference_seconds: inference,
        padded_per_real: (after.padded - before.padded) as f64 / (after.real - before.real).max(1) as f64,
        latency_p50: percentile(&latencies, 0.50),
        latency_p95: percentile(&latencies, 0.95),
        peak_rss_mib: peak_rss_mib(),
        processes,
        answers: Answers::of(&scored),
    })
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn difference(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Starts the peak resident set over from the present one (Linux: `5` to /proc/self/clear_refs), so
/// that each run of one invocation reports its own peak, not the largest of those before it.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The peak resident set of this process (VmHWM in /proc/self/status), in MiB; 0 where unknown.
pub fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// The process-wide counters a run moves; a run's figures are the differences.
struct Snapshot {
    busy: BTreeMap<String, f64>,
    llm_seconds: BTreeMap<String, f64>,
    llm_calls: u64,
    llm_cache_hits: u64,
    pairs: u64,
    inference_seconds: f64,
    real: u64,
    padded: u64,
}

impl Snapshot {
    fn take() -> Snapshot {
        let families = METRICS.registry.gather();
        // A metric family's value per `stage` label.
        let per_stage = |name: &str, value: fn(&prometheus::proto::Metric) -> f64| -> BTreeMap<String, f64> {
            let mut out = BTreeMap::new();
            for metric in families.iter().filter(|f| f.name() == name).flat_map(|f| f.get_metric()) {
                if let Some(stage) = metric.get_label().iter().find(|l| l.name() == "stage") {
                    *out.entry(stage.value().to_string()).or_insert(0.0) += value(metric);
                }
            }
            out
        };
        let sum = |m: &prometheus::proto::Metric| m.get_histogram().get_sample_sum();
        let counter = |m: &prometheus::proto::Metric| m.get_counter().get_value();
        let m = &METRICS;
        let tokens = |kind: &str| m.model_tokens.with_label_values(&["reranker", kind]).get();
        Snapshot {
            busy: per_stage("lacuna_stage_processing_seconds", sum),
            llm_seconds: per_stage("lacuna_llm_request_seconds", sum),
            llm_calls: per_stage("lacuna_llm_calls_total", counter).values().sum::<f64>() as u64,
            llm_cache_hits: per_stage("lacuna_llm_cache_hits_total", counter).values().sum::<f64>() as u64,
            pairs: m.model_pairs.with_label_values(&["reranker"]).get(),
            inference_seconds: m.model_inference_seconds.with_label_values(&["reranker"]).get_sample_sum(),
            real: tokens("real"),
            padded: tokens("padded"),
        }
    }
}

impl PipelineBench {
    pub fn markdown(runs: &[PipelineBench]) -> String {
        let Some(first) = runs.first() else { return String::new() };
        let half = first.half.map_or(String::new(), |half| format!(", {} half", half.name()));
        let mut out = format!(
            "# lacuna bench pipeline: {} on {}{half} ({}), {} questions, {} open\n\n\
             | run | questions/s | × first | LLM calls | LLM in flight (of {LLM_LIMIT}) | re-ranker pairs a question | re-ranker pairs/s (inference) | padded/real | p50 s | p95 s | peak RSS MiB | errors |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n",
            first.pipeline, first.dataset, first.transport, first.questions, first.open_questions
        );
        for r in runs {
            let cached = match r.llm_cache_hits {
                0 => String::new(),
                hits => format!(" (+{hits} cached)"),
            };
            out += &format!(
                "| {} | {:.3} | {:.2} | {}{} | {:.2} ({:.1}%) | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.0} | {} |\n",
                r.label,
                r.questions_per_second,
                r.questions_per_second / first.questions_per_second,
                r.llm_calls,
                cached,
                r.llm_in_flight,
                100.0 * r.llm_concurrency,
                r.rerank_pairs as f64 / r.questions.max(1) as f64,
                r.rerank_pairs_per_inference_second,
                r.padded_per_real,
                r.latency_p50,
                r.latency_p95,
                r.peak_rss_mib,
                r.errors
            );
        }
        out += "\nBusy seconds per stage (events processed in parallel add up; LLM seconds in brackets):\n\n| run | ";
        let stages: std::collections::BTreeSet<&String> =
            runs.iter().flat_map(|r| r.stage_busy_seconds.keys()).collect();
        out += &stages.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" | ");
        out += " | wall |\n|---|";
        out += &"---|".repeat(stages.len() + 1);
        out += "\n";
        for r in runs {
            out += &format!("| {} |", r.label);
            for stage in &stages {
                let busy = r.stage_busy_seconds.get(*stage).copied().unwrap_or(0.0);
                let llm = r.stage_llm_seconds.get(*stage).copied().unwrap_or(0.0);
                out += &format!(" {busy:.1} ({llm:.1}) |");
            }
            out += &format!(" {:.1} |\n", r.seconds);
        }
        out += "\nThe answers, scored as `lacuna eval` scores them (with --fake-llm-ms every query and answer is \
                the question: there only the gold retrieved and shown say something):\n\n\
                | run | EM | cited-gold recall | questions with gold | all gold retrieved | all gold shown | all gold cited |\n\
                |---|---|---|---|---|---|---|\n";
        for r in runs {
            let a = &r.answers;
            let share = |n: usize| format!("{:.1}%", 100.0 * n as f64 / a.with_gold.max(1) as f64);
            out += &format!(
                "| {} | {:.1} | {} | {} | {} | {} | {} |\n",
                r.label,
                100.0 * a.em,
                a.cited_gold_recall.map_or("-".into(), |v| format!("{:.1}", 100.0 * v)),
                a.with_gold,
                share(a.all_gold_retrieved),
                share(a.all_gold_shown),
                share(a.all_gold_cited)
            );
        }
        for r in runs.iter().filter(|r| !r.processes.is_empty()) {
            let exits: Vec<&str> = r.processes.iter().map(|(_, exit)| exit.as_str()).collect();
            out += &format!(
                "\n{}: {} {} processes, after SIGTERM: {}.",
                r.label,
                r.processes.len(),
                r.processes[0].0,
                exits.join("; ")
            );
        }
        out
    }
}
