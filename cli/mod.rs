//! The `lacuna` command line, a file per command: its arguments, and the work done with them.
//!
//! - `index`: builds the search index (tantivy BM25, or Meilisearch) from a corpus file.
//! - `ingest`: adds, replaces or deletes documents of the live corpus, searchable without a restart.
//! - `indexer`: keeps a Meilisearch index a copy of the documents topic, for retrieve replicas.
//! - `verify`: `lacuna verify-index`, a replica's index compared with the documents topic.
//! - `ask`: one question through the whole loop, printed for a person (or as JSON).
//! - `run`: a questions file streamed through the actors, one output line per input line.
//! - `serve`: the HTTP API and live page in front of the pipelines.
//! - `stage`: one stage as its own process and consumer group on Kafka.
//! - `submit`: `lacuna submit` (questions onto Kafka) and `lacuna answers` (the answers topic drained).
//! - `sink`: the answers sink behind `lacuna answers`, one JSONL record per question, across restarts.
//! - `dlq`: dead letters replayed to the topic they came from, once the cause is fixed.
//! - `topics`: creates a pipeline's Kafka topics and prints who writes and reads each.
//! - `acls`: the Kafka ACLs each of a pipeline's processes needs, for an authorizer.
//! - `graph`: a pipeline's topology from its declaration (the README's diagrams, the Helm chart's lists).
//! - `eval`: scores a pipeline on a dataset folder, or compares earlier runs.
//! - `calibrate`: the re-ranker threshold, by the paper's recipe.
//! - `recall`: recall@5/20/50 of gold passages and indexing time, per dataset and backend.
//! - `bench`: throughput figures and ratios for a pipeline, the re-ranker and document freshness.

mod acls;
mod ask;
mod bench;
mod calibrate;
mod dlq;
mod eval;
mod graph;
mod index;
mod indexer;
pub mod ingest;
mod recall;
mod run;
mod serve;
pub mod sink;
pub mod stage;
mod submit;
mod topics;
mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{LogFormat, LogSettings, Settings};
use crate::pipelines::PipelineKind;

#[derive(Parser)]
#[command(name = "lacuna", version, about = "Answers multi-hop questions with cited, verified facts (MIGRES)")]
pub struct Cli {
    /// A TOML file overriding config/default.toml (environment variables LACUNA__SECTION__KEY override both).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Settings from a profile, between the defaults and --config: `paper` (the MIGRES paper's
    /// settings, none of Lacuna's answer levers), `before` (the default before issue 47's cost
    /// levers), `fast` (the cheapest configuration within 1 EM of the default on the tuning half),
    /// `adaptive` (the default's method: one read first, the loop only for an answer a check finds
    /// unsupported), `loop` (the default before it: the loop from the first iteration), `shallow`
    /// (`loop` with 30 passages a query instead of 50), `levers` (the default with every issue-76
    /// lever on and the loop run as `fast`: the held-out candidate) or a directory of TOML layers
    /// (config/profiles.rs). `eval` adds the dataset's layers.
    #[arg(long, global = true)]
    profile: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the search index (tantivy BM25, or Meilisearch) from a corpus JSONL file of {"id", "title", "text"} lines.
    Index(index::IndexArgs),
    /// Add, replace or delete documents of the live corpus: searchable at once, no restart.
    Ingest(ingest::IngestArgs),
    /// Keep a Meilisearch index a copy of the documents topic, for retrieve replicas that search it.
    Indexer(indexer::IndexerArgs),
    /// Compare a retrieve replica's index with the documents topic: every live document at its last version, nothing else.
    VerifyIndex(verify::VerifyIndexArgs),
    /// Answer one question and show the facts and passages it rests on.
    Ask(ask::AskArgs),
    /// Answer every question of a JSONL file, one output line per input line.
    Run(run::RunArgs),
    /// Serve the HTTP API and the live page: questions in, answers and their trace streamed out.
    Serve(serve::ServeArgs),
    /// Run one stage as its own process and consumer group on Kafka.
    Stage(stage::StageArgs),
    /// Publish the questions of a JSONL file to the Kafka questions topic.
    Submit(submit::SubmitArgs),
    /// Write the answers topic to a JSONL file, one record per question.
    Answers(submit::AnswersArgs),
    /// Inspect and replay the dead-letter topic.
    Dlq(dlq::DlqArgs),
    /// Score a pipeline on a dataset folder (EM, F1, lenient EM, cover EM, Acc†, cost), or compare runs.
    Eval(eval::EvalArgs),
    /// Create a pipeline's Kafka topics (idempotent).
    Topics(topics::TopicsArgs),
    /// Print the Kafka ACLs each process of a pipeline needs, one rule a line.
    Acls(acls::AclsArgs),
    /// Print a pipeline's stages and topics: text, Mermaid, DOT, JSON, or the Helm chart's list.
    Graph(graph::GraphArgs),
    /// Find the re-ranker threshold that keeps a passage for 80% of a dataset's questions.
    Calibrate(calibrate::CalibrateArgs),
    /// Recall@k (5/20/50, or --at) of gold passages and indexing time, per dataset and search backend.
    Recall(recall::RecallArgs),
    /// Throughput figures: a pipeline in process (with a real or fake LLM), or the re-ranker alone.
    Bench(bench::BenchArgs),
}

impl Command {
    /// The command's name on the command line, for the trace resource (`lacuna.process`).
    fn name(&self) -> &'static str {
        match self {
            Command::Index(_) => "index",
            Command::Ingest(_) => "ingest",
            Command::Indexer(_) => "indexer",
            Command::VerifyIndex(_) => "verify-index",
            Command::Ask(_) => "ask",
            Command::Run(_) => "run",
            Command::Serve(_) => "serve",
            Command::Stage(_) => "stage",
            Command::Submit(_) => "submit",
            Command::Answers(_) => "answers",
            Command::Dlq(_) => "dlq",
            Command::Eval(_) => "eval",
            Command::Topics(_) => "topics",
            Command::Acls(_) => "acls",
            Command::Graph(_) => "graph",
            Command::Calibrate(_) => "calibrate",
            Command::Recall(_) => "recall",
            Command::Bench(_) => "bench",
        }
    }
}

pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let layers = match &cli.profile {
        Some(profile) => crate::config::profiles::layers(profile, None)?,
        None => Vec::new(),
    };
    let settings =
        Settings::load_with(cli.config.as_deref(), &layers).map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    settings.check_stage_names(PipelineKind::all_stage_names()).map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    init_logs(&settings.log);
    // Dropped as the command returns: what is queued goes out before the process ends.
    let _traces = crate::telemetry::init(&settings.otel, cli.command.name())
        .map_err(|e| anyhow::anyhow!("configuration: [otel]: {e:#}"))?;
    match cli.command {
        Command::Index(args) => index::index(&settings, args).await,
        Command::Ingest(args) => ingest::ingest(&settings, args).await,
        Command::Ask(args) => ask::ask(&settings, args).await,
        Command::Run(args) => run::run(&settings, args).await,
        Command::Serve(args) => serve::serve(&settings, args).await,
        Command::Stage(args) => stage::stage(&settings, args).await,
        Command::Indexer(args) => indexer::indexer(&settings, args).await,
        Command::VerifyIndex(args) => verify::verify_index(&settings, args).await,
        Command::Submit(args) => submit::submit(&settings, args).await,
        Command::Answers(args) => submit::answers(&settings, args).await,
        Command::Dlq(args) => dlq::dlq(&settings, args).await,
        Command::Eval(args) => eval::eval(&settings, cli.config.as_deref(), cli.profile, args).await,
        Command::Topics(args) => topics::topics(&settings, args).await,
        Command::Acls(args) => acls::acls(&settings, args),
        Command::Graph(args) => graph::graph(args),
        Command::Calibrate(args) => calibrate::calibrate_command(&settings, args).await,
        Command::Recall(args) => recall::recall(&settings, args).await,
        Command::Bench(args) => bench::bench(&settings, args).await,
    }
}

/// Logs go to stderr, filtered by `LACUNA_LOG` (e.g. `info`, `lacuna=debug`), as text or one JSON
/// object per line. Lines logged while a stage handles an event carry the event's span: stage,
/// question id and iteration.
fn init_logs(settings: &LogSettings) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("LACUNA_LOG").unwrap_or_else(|_| settings.filter.as_str().into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match settings.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
