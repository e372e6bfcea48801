//! `lacuna submit` and `lacuna answers`: the edges of the system on Kafka. Submit publishes each
//! valid question, and an error record for each bad line, so the answers topic ends up with exactly
//! one record per input line. Answers writes each question's first record once, even across restarts.

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

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
                bus.publish(question.to_record()).await?;
                submitted += 1;
            }
            Some(Input::Rejected(error)) => {
                bus.publish(VersionedAnswer::from(AnswerRecord::Error(error)).to_record()).await?;
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
    // The file is the sink's memory: a restarted sink skips what it already wrote.
    let mut seen: HashSet<String> = HashSet::new();
    if let Ok(text) = std::fs::read_to_string(&args.out) {
        for line in text.lines() {
            if let Ok(record) = serde_json::from_str::<VersionedAnswer>(line) {
                seen.insert(record.record.question_id().to_string());
            }
        }
    }
    let mut out = std::fs::OpenOptions::new().create(true).append(true).open(&args.out)?;
    let bus = args.pipeline.kafka_bus(settings).await?;
    let mut subscription = bus.subscribe(&[Topic::Answers], "answers-sink").await?;
    let idle = args.idle_timeout_s.map(Duration::from_secs).unwrap_or(Duration::MAX);
    while args.expect.is_none_or(|expect| seen.len() < expect) {
        let Ok(Some(delivery)) = tokio::time::timeout(idle, subscription.next()).await else { break };
        match VersionedAnswer::from_payload(&delivery.record.payload) {
            Ok(answer) if seen.insert(answer.record.question_id().to_string()) => {
                serde_json::to_writer(&mut out, &answer)?;
                out.write_all(b"\n")?;
                out.flush()?;
            }
            Ok(_) => {}
            Err(error) => tracing::error!(%error, key = %delivery.record.key, "undecodable answer record skipped"),
        }
        // Acknowledged only once written: a crash before this re-reads the record, and `seen` drops it.
        delivery.ack();
    }
    subscription.commit().await?;
    eprintln!("{} answers in {}", seen.len(), args.out.display());
    Ok(())
}
