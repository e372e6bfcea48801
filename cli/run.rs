//! `lacuna run`: streams a questions file through the actors, many questions at once, and writes
//! exactly one line per input line: an answer record or an error record, in completion order. With
//! `search.follow_documents` its local index follows the documents topic, as a retrieve replica's does.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::Settings;
use crate::pipelines::input::{Input, InputReader};
use crate::pipelines::parts::Part;
use crate::pipelines::parts::{Parts, check_llm};
use crate::pipelines::startup::{follow_documents, while_following};
use crate::pipelines::{Pipeline, PipelineKind, Transport};
use crate::topics::{AnswerRecord, VersionedAnswer};

#[derive(Args)]
pub struct RunArgs {
    /// JSONL with one {"id", "question"} object per line (other fields are ignored).
    #[arg(long)]
    questions: PathBuf,
    /// Where to write one JSON record per input line.
    #[arg(long)]
    out: PathBuf,
    /// Only the first N questions.
    #[arg(long)]
    limit: Option<usize>,
    /// `in-process` (bounded queues in this process) or `kafka` (every stage a consumer group on
    /// kafka.brokers, all in this process).
    #[arg(long, default_value = "in-process")]
    transport: Transport,
    /// Which method answers.
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
    /// Answer repeated LLM calls from the response cache (llm.cache_dir).
    #[arg(long)]
    llm_cache: bool,
}

pub async fn run(settings: &Settings, args: RunArgs) -> anyhow::Result<()> {
    let mut settings = settings.clone();
    settings.llm.cache |= args.llm_cache;
    let settings = &settings;
    let file = std::fs::File::open(&args.questions)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.questions.display()))?;
    let mut reader = InputReader::new(settings.run.max_question_chars);
    let mut inputs = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        if let Some(input) = reader.line(n + 1, &line?) {
            inputs.push(input);
        }
        if args.limit.is_some_and(|limit| inputs.len() >= limit) {
            break;
        }
    }
    let ready = crate::serve::observe::start(&settings.metrics.listen).await?;
    let searches = args.pipeline.stages().iter().any(|stage| stage.needs(Part::Search));
    let mut materialiser = follow_documents(settings, searches, "run").await?;
    // Everything that can fail before the first question is checked before anything is written.
    let parts = Parts::load(settings, args.pipeline)?;
    let parts = parts.with_served_model(check_llm(settings).await.map_err(anyhow::Error::msg)?);

    let mut out = std::io::BufWriter::new(std::fs::File::create(&args.out)?);
    let progress = progress_bar(inputs.len() as u64);
    let (mut answered, mut errors) = (0, 0);
    let mut write = |record: AnswerRecord| -> std::io::Result<()> {
        match record {
            AnswerRecord::Answered(_) => answered += 1,
            AnswerRecord::Error(_) => errors += 1,
        }
        serde_json::to_writer(&mut out, &VersionedAnswer::from(record))?;
        out.write_all(b"\n")?;
        // Flushed per record: a crash loses no finished answer.
        out.flush()?;
        progress.inc(1);
        Ok(())
    };
    let mut questions = Vec::new();
    for input in inputs {
        match input {
            Input::Question(question) => questions.push(question),
            Input::Rejected(error) => write(AnswerRecord::Error(error))?,
        }
    }
    let mut pipeline = Pipeline::start_with(args.pipeline, args.transport, settings, parts).await?;
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut io_error = None;
    let answering = async {
        let keep = |record| {
            if let Err(e) = write(record) {
                io_error.get_or_insert(e);
            }
        };
        pipeline.run(questions, keep).await.map_err(anyhow::Error::from)
    };
    while_following(&mut materialiser, "run", answering).await?;
    pipeline.stop();
    progress.finish_and_clear();
    if let Some(e) = io_error {
        anyhow::bail!("writing {}: {e}", args.out.display());
    }
    eprintln!("{answered} answered, {errors} errors -> {}", args.out.display());
    Ok(())
}

pub fn progress_bar(len: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} questions, {elapsed} elapsed, eta {eta}")
            .expect("a valid template"),
    );
    bar
}
