//! `lacuna bench`: throughput figures and ratios for a pipeline and for the re-ranker.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::bench::fake_llm::{FakeLlm, Faults, Latency};
use crate::bench::freshness::FreshnessOptions;
use crate::bench::pipeline::{OutOfProcess, PipelineBench};
use crate::config::{DeliveryGuarantee, Settings};
use crate::eval::dataset::Dataset;
use crate::pipelines::{PipelineKind, Transport};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Run a pipeline in process over a dataset folder and report where the time goes.
    Pipeline(PipelineArgs),
    /// Score the same pairs with a bare ONNX session (arrival order, length-sorted) and through the
    /// re-rank stage's path, and what coalescing does to the scores.
    Rerank(RerankArgs),
    /// Serve the built-in fake OpenAI-compatible LLM until stopped: schema-valid answers after a set
    /// latency, for trying a deployment (or the container image) without a model.
    FakeLlm(FakeLlmArgs),
    /// Publish documents at a set rate while questions run: how soon each is searchable on every
    /// retrieve replica, a new replica's catch-up, and question throughput with and without ingestion.
    Freshness(FreshnessArgs),
}

#[derive(Args)]
struct FreshnessArgs {
    /// A dataset folder: its corpus is the base index and the source of new documents (under new
    /// ids), its questions the throughput runs.
    #[arg(long)]
    dataset: PathBuf,
    /// `in-process` (one writer, this process) or `kafka` (the documents topic on kafka.brokers,
    /// followed by `--replicas` retrieve processes).
    #[arg(long, default_value = "in-process")]
    transport: Transport,
    /// Documents (one passage each) published per second.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// How long to publish.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// Over Kafka: retrieve replicas following the topic.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Over Kafka: passages a new replica catches up on at the end (0: skip).
    #[arg(long, default_value_t = 100_000)]
    catch_up: usize,
    /// Only the first N questions in each throughput run.
    #[arg(long, default_value_t = 40)]
    limit: usize,
    /// The fake LLM's latency, in milliseconds (MEAN[,JITTER]).
    #[arg(long, default_value = "30")]
    fake_llm_ms: Latency,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct FakeLlmArgs {
    #[arg(long, default_value = "127.0.0.1:8377")]
    listen: String,
    /// Answer after MEAN[,JITTER] milliseconds.
    #[arg(long, value_name = "MEAN[,JITTER]", default_value = "0")]
    ms: Latency,
    /// Fail this percentage of calls: HTTP 500, broken JSON, cut at max_tokens.
    #[arg(long, value_name = "500=PCT,json=PCT,cut=PCT", default_value = "")]
    faults: Faults,
}

#[derive(Args)]
struct PipelineArgs {
    /// A dataset folder with questions.jsonl and corpus.jsonl.
    #[arg(long)]
    dataset: PathBuf,
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
    /// Only the first N questions (of the half, with --half).
    #[arg(long)]
    limit: Option<usize>,
    /// Only the tuning or the check half of the dataset, as `lacuna eval --half` cuts it: with
    /// `--limit`, the questions an eval of the same half and limit ran.
    #[arg(long)]
    half: Option<crate::eval::split::Half>,
    /// Answer LLM calls from the response cache (llm.cache_dir, keyed by llm.base_url) before the
    /// endpoint. With `llm.cache_mode = "replay"` and the cache of an `eval --deterministic` run, run
    /// with `--open 1 --llm-concurrency 1`, the recorded model's answers come back without the model:
    /// the run's figures leave the LLM's time out and its answers are the model's.
    #[arg(long, conflicts_with = "fake_llm_ms")]
    llm_cache: bool,
    /// Questions inside the pipeline at once (default: run.max_open_questions).
    #[arg(long)]
    open: Option<usize>,
    /// Answer LLM calls with the built-in fake server instead of calling llm.base_url, after MEAN
    /// ± JITTER milliseconds plus, if given, so many per prompt and per completion token (e.g.
    /// `0,0,0.2,30`: a real server's time grows with what it reads and writes).
    #[arg(long, value_name = "MEAN[,JITTER[,PER_PROMPT_TOKEN,PER_COMPLETION_TOKEN]]")]
    fake_llm_ms: Option<Latency>,
    /// First run with the `before` profile (the default before issue 47's cost levers), then as
    /// configured: before and after in one run, on the same machine and fake LLM.
    #[arg(long, conflicts_with = "against_today")]
    before: bool,
    /// First run with the default's answer settings (config/default.toml's methods and NLI check),
    /// then as configured: a profile (`--profile adaptive`) against the default in one run, on the same
    /// machine and fake LLM.
    #[arg(long, conflicts_with_all = ["before", "against_today"])]
    against_default: bool,
    /// Set every stage's llm_concurrency (and llm.max_concurrency) to N.
    #[arg(long)]
    llm_concurrency: Option<usize>,
    /// Set migres.retrieve_top_n (passages retrieved per query, all re-ranked).
    #[arg(long)]
    retrieve_top_n: Option<usize>,
    /// First run with migres.retrieve_top_n = N, then as configured (with `--retrieve-top-n`, say):
    /// what re-ranking deeper or shallower costs, in one run, on the same machine and fake LLM.
    #[arg(long, value_name = "N", conflicts_with_all = ["before", "against_default", "against_today"])]
    against_retrieve_top_n: Option<usize>,
    /// `in-process`, or `kafka`: the pipeline's topics on kafka.brokers (fresh ones for each run),
    /// its stages in this process.
    #[arg(long, default_value = "in-process")]
    transport: Transport,
    /// Over Kafka: first run with `bus.delivery = "at_least_once"`, then with "exactly_once", and
    /// print both: what transactions cost, in one run, on the same machine and fake LLM.
    #[arg(long, conflicts_with_all = ["before", "against_default", "against_today"])]
    against_at_least_once: bool,
    /// Over Kafka: run STAGE in processes of its own (`lacuna stage STAGE`, this binary, this
    /// environment) instead of in this one, once per replica count: `sentence_filter=1,4,8` runs
    /// three times. Prints how each process exited after SIGTERM.
    #[arg(long, value_name = "STAGE=N[,N...]", conflicts_with_all = ["before", "against_default", "against_today", "against_at_least_once"])]
    stage_processes: Option<String>,
    /// Three runs exporting spans to this OTLP endpoint (`otel.protocol`): traces off, at
    /// `otel.sampling_ratio`, and at 100%; what tracing costs, in one run, on the same machine.
    #[arg(long, value_name = "ENDPOINT", conflicts_with_all = ["before", "against_default", "against_today", "against_at_least_once", "stage_processes"])]
    against_traces: Option<String>,
    /// First run with the re-ranking of 41ae80c (one session, one thread, batches of 32 within each
    /// event), then as configured, and print the ratio.
    #[arg(long)]
    against_today: bool,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct RerankArgs {
    /// A dataset folder: each question's retrieved passages make one event's pairs.
    #[arg(long)]
    dataset: PathBuf,
    /// How many pairs to score.
    #[arg(long, default_value_t = 500)]
    pairs: usize,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub async fn bench(settings: &Settings, args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        What::Pipeline(args) => pipeline(settings, args).await,
        What::FakeLlm(args) => {
            let fake = FakeLlm::start_on(&args.listen, args.ms, args.faults)?;
            eprintln!("fake LLM serving {} until stopped", fake.base_url);
            crate::cli::stage::wait_for_shutdown_signal().await;
            Ok(())
        }
        What::Freshness(args) => {
            let dataset = Dataset::load(&args.dataset, Some(args.limit))?;
            let fake = FakeLlm::start(args.fake_llm_ms)?;
            let mut settings = settings.clone();
            settings.llm.cache = false;
            settings.llm.base_url = fake.base_url.clone();
            let options = FreshnessOptions {
                transport: args.transport,
                rate: args.rate,
                seconds: args.seconds,
                replicas: args.replicas.max(1),
                catch_up: args.catch_up,
            };
            let bench = crate::bench::freshness::run(&settings, &dataset, &options).await?;
            print!("{}", bench.markdown());
            write_json(args.json.as_ref(), &bench)
        }
        What::Rerank(args) => {
            let dataset = Dataset::load(&args.dataset, None)?;
            let bench = crate::bench::rerank::run(settings, &dataset, args.pairs).await?;
            print!("{}", bench.markdown());
            write_json(args.json.as_ref(), &bench)
        }
    }
}

async fn pipeline(configured: &Settings, args: PipelineArgs) -> anyhow::Result<()> {
    let dataset = Dataset::load(&args.dataset, None)?.cut(args.half, args.limit);
    let fake = match args.fake_llm_ms {
        Some(latency) => Some(FakeLlm::start(latency)?),
        None => None,
    };
    // The bench's own knobs, applied alike to every configuration it runs.
    let tune = |mut settings: Settings| {
        settings.llm.cache = args.llm_cache;
        if let Some(fake) = &fake {
            settings.llm.base_url = fake.base_url.clone();
        }
        if let Some(open) = args.open {
            settings.run.max_open_questions = open.max(1);
        }
        if let Some(n) = args.llm_concurrency {
            crate::pipelines::PipelineKind::limit_llm_calls(&mut settings, n);
        }
        if let Some(n) = args.retrieve_top_n {
            settings.migres.retrieve_top_n = n;
        }
        settings
    };
    let settings = tune(configured.clone());
    // metrics.listen serves /metrics during the runs (scripts/dashboard-snapshot.py --scrape draws them).
    let ready = crate::serve::observe::start(&settings.metrics.listen).await?;
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    // Every run of the table goes the same way: a twin in process beside a run over Kafka would
    // compare the transports, not the configurations.
    let over = (args.pipeline, args.transport);
    let mut runs = Vec::new();
    if args.before {
        let before = tune(with_before_profile(configured)?);
        eprintln!("running with the before profile ...");
        runs.push(crate::bench::pipeline::run_over("before (profile)", over, &before, &dataset, None).await?);
    }
    if args.against_default {
        let default = tune(with_answer_settings_of(configured, &[])?);
        eprintln!("running with the default ...");
        runs.push(crate::bench::pipeline::run_over("default", over, &default, &dataset, None).await?);
    }
    if args.against_today {
        let mut today = settings.clone();
        today.rerank = crate::bench::rerank::as_in_41ae80c(&today.rerank);
        eprintln!("running with the re-ranking of 41ae80c ...");
        runs.push(crate::bench::pipeline::run_over("41ae80c re-ranking", over, &today, &dataset, None).await?);
    }
    if let Some(n) = args.against_retrieve_top_n {
        let mut deeper = settings.clone();
        deeper.migres.retrieve_top_n = n;
        let label = format!("retrieve_top_n {n}");
        eprintln!("running with {label} ...");
        runs.push(crate::bench::pipeline::run_over(&label, over, &deeper, &dataset, None).await?);
    }
    if args.against_at_least_once {
        anyhow::ensure!(
            args.transport == Transport::Kafka,
            "--against-at-least-once compares deliveries on Kafka: add --transport kafka"
        );
        for (label, delivery) in
            [("at-least-once", DeliveryGuarantee::AtLeastOnce), ("exactly-once", DeliveryGuarantee::ExactlyOnce)]
        {
            let mut settings = settings.clone();
            settings.bus.delivery = delivery;
            eprintln!("running {label} over Kafka ...");
            runs.push(crate::bench::pipeline::run_over(label, over, &settings, &dataset, None).await?);
        }
    } else if let Some(endpoint) = &args.against_traces {
        runs.extend(traced_runs(endpoint, over, &settings, &dataset).await?);
    } else if let Some(spec) = &args.stage_processes {
        for elsewhere in stage_processes(args.pipeline, spec)? {
            let label = format!("{} × {}", elsewhere.stage, elsewhere.replicas);
            eprintln!("running with {label} processes over Kafka ...");
            runs.push(crate::bench::pipeline::run_over(&label, over, &settings, &dataset, Some(&elsewhere)).await?);
        }
    } else {
        eprintln!("running as configured ...");
        runs.push(crate::bench::pipeline::run_over("as configured", over, &settings, &dataset, None).await?);
    }
    print!("{}", PipelineBench::markdown(&runs));
    if let Some(fake) = &fake {
        println!("\nThe fake LLM answered {} calls.", fake.calls());
    }
    write_json(args.json.as_ref(), &runs)
}

/// Traces off, at `otel.sampling_ratio`, and at 100%, each exporting to `endpoint`; prints the spans
/// each run sent and dropped.
async fn traced_runs(
    endpoint: &str,
    over: (crate::pipelines::PipelineKind, Transport),
    settings: &Settings,
    dataset: &Dataset,
) -> anyhow::Result<Vec<PipelineBench>> {
    anyhow::ensure!(
        crate::telemetry::endpoint(&settings.otel).is_none(),
        "--against-traces sets the endpoint itself: leave otel.endpoint and OTEL_EXPORTER_OTLP_ENDPOINT unset"
    );
    let default = settings.otel.sampling_ratio;
    let ratios = [
        (None, "traces off".to_string()),
        (Some(default), format!("traces at {default}")),
        (Some(1.0), "traces at 1".into()),
    ];
    let (mut runs, mut spans) = (Vec::new(), Vec::new());
    for (ratio, label) in ratios {
        let traces = match ratio {
            Some(ratio) => {
                let otel = crate::config::OtelSettings {
                    endpoint: endpoint.to_string(),
                    sampling_ratio: ratio,
                    ..settings.otel.clone()
                };
                crate::telemetry::init(&otel, "bench")?
            }
            None => None,
        };
        let before = crate::telemetry::export_counts();
        eprintln!("running with {label} ...");
        runs.push(crate::bench::pipeline::run_over(&label, over, settings, dataset, None).await?);
        // Shut down: what is queued goes out before the counts are read.
        drop(traces);
        crate::telemetry::uninstall();
        let after = crate::telemetry::export_counts();
        spans.push((label, after.0 - before.0, after.1 - before.1));
    }
    eprintln!("\n| run | spans exported | spans dropped |\n|---|---|---|");
    for (label, exported, dropped) in spans {
        eprintln!("| {label} | {exported} | {dropped} |");
    }
    Ok(runs)
}

/// `STAGE=N[,N...]`: one run per replica count, the stage one of `pipeline`'s.
fn stage_processes(pipeline: PipelineKind, spec: &str) -> anyhow::Result<Vec<OutOfProcess>> {
    let (name, counts) =
        spec.split_once('=').ok_or_else(|| anyhow::anyhow!("--stage-processes {spec}: expected STAGE=N[,N...]"))?;
    let stage = pipeline
        .stages()
        .iter()
        .map(|s| s.name)
        .find(|s| *s == name)
        .ok_or_else(|| anyhow::anyhow!("--stage-processes: {} has no stage {name}", pipeline.name()))?;
    let binary = std::env::current_exe()?;
    counts
        .split(',')
        .map(|n| {
            let replicas: usize =
                n.trim().parse().map_err(|_| anyhow::anyhow!("--stage-processes: {n:?} is not a count"))?;
            anyhow::ensure!(replicas > 0, "--stage-processes: at least one replica");
            Ok(OutOfProcess { binary: binary.clone(), stage, replicas })
        })
        .collect()
}

/// `configured` with the `before` profile's answer settings (MIGRES's levers, the NLI check, the key
/// order); endpoints, concurrency and the rest as configured.
fn with_before_profile(configured: &Settings) -> anyhow::Result<Settings> {
    with_answer_settings_of(configured, &crate::config::profiles::layers("before", None)?)
}

/// `configured` with the answer settings of the defaults under `layers`.
fn with_answer_settings_of(configured: &Settings, layers: &[String]) -> anyhow::Result<Settings> {
    let pinned = Settings::load_with(None, layers).map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    let mut before = configured.clone();
    before.migres = pinned.migres;
    before.nli = pinned.nli;
    before.llm.reasoning_first = pinned.llm.reasoning_first;
    Ok(before)
}

fn write_json(path: Option<&PathBuf>, value: &impl serde::Serialize) -> anyhow::Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_vec_pretty(value)?)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}
