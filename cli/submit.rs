//! `lacuna submit` and `lacuna answers`: the edges of the system on Kafka. Submit publishes each
//! valid question, and an error record for each bad line, so the answers topic ends up with exactly
//! one record per input line. Answers writes each question's first record once, even across restarts.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::sink::{AnswerFile, drain};
use crate::actors::runner::publish_record;
use crate::config::Settings;
use crate::pipelines::PipelineKind;
use crate::pipelines::input::{Input, InputReader};
use crate::topics::{AnswerRecord, Bus, Event, Topic, VersionedAnswer};

#[derive(Args)]
pub struct SubmitArgs {
    /// JSONL with one {"id", "question"} object per line.
    #[arg(long)]
    questions: PathBuf,
    #[arg(long)]
    limit: Option<usize>,
    /// The pipeline whose questions topic receives them.
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
}

pub async fn submit(settings: &Settings, args: SubmitArgs) -> anyhow::Result<()> {
    let file = std::fs::File::open(&args.questions)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.questions.display()))?;
    let bus = args.pipeline.kafka_bus(settings).await?;
    let mut reader = InputReader::new(settings.run.max_question_chars);
    let (mut submitted, mut rejected) = (0, 0);
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        if args.limit.is_some_and(|limit| submitted + rejected >= limit) {
            break;
        }
        match reader.line(n + 1, &line?) {
            Some(Input::Question(question)) => {
                let mut record = question.to_record();
                record.trace = crate::telemetry::question_headers(&question.id, None);
                publish_record(&*bus, &settings.retry, "submit", record).await?;
                submitted += 1;
            }
            Some(Input::Rejected(error)) => {
                let record = VersionedAnswer::from(AnswerRecord::Error(error)).to_record();
                publish_record(&*bus, &settings.retry, "submit", record).await?;
                rejected += 1;
            }
            None => {}
        }
    }
    eprintln!("submitted {submitted} questions, {rejected} rejected lines (error records on the answers topic)");
    Ok(())
}

#[derive(Args)]
pub struct AnswersArgs {
    /// Appends one JSON record per question; ids already in the file are not written again.
    #[arg(long)]
    out: PathBuf,
    /// Stop once the file holds this many records.
    #[arg(long)]
    expect: Option<usize>,
    /// Stop after this many seconds without a new record (default: run until interrupted).
    #[arg(long)]
    idle_timeout_s: Option<u64>,
    /// The pipeline whose answers topic is read.
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
}

pub async fn answers(settings: &Settings, args: AnswersArgs) -> anyhow::Result<()> {
    let mut file = AnswerFile::open(&args.out)?;
    let bus = args.pipeline.kafka_bus(settings).await?;
    file.bind(bus.identify(&bus.topic_name(Topic::Answers)).await?)?;
    let mut subscription = bus.subscribe(&[Topic::Answers], "answers-sink").await?;
    let idle = args.idle_timeout_s.map(Duration::from_secs).unwrap_or(Duration::MAX);
    drain(&mut *subscription, &mut file, args.expect, idle).await?;
    eprintln!("{} answers in {}", file.len(), args.out.display());
    Ok(())
}
