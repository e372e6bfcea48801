//! `lacuna dlq replay`: sends dead letters back to the topic they came from, once the cause (an LLM
//! outage, a bad deploy) is fixed. Each goes out with its next attempt number: one more than the tries
//! its dead letter records.

use std::time::Duration;

use clap::{Args, Subcommand};

use crate::config::Settings;
use crate::pipelines::PipelineKind;
use crate::telemetry::TraceHeaders;
use crate::topics::bus::atomically;
use crate::topics::dead_letter::DeadLetter;
use crate::topics::{Bus, Event, Record, Topic};

#[derive(Args)]
pub struct DlqArgs {
    #[command(subcommand)]
    command: DlqCommand,
    /// The pipeline whose dead letters are read.
    #[arg(long, default_value = "migres", global = true)]
    pipeline: PipelineKind,
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Republish dead letters to their original topics (stops when none arrived for --idle-timeout-s).
    Replay {
        #[arg(long, default_value_t = 5)]
        idle_timeout_s: u64,
    },
}

pub async fn dlq(settings: &Settings, args: DlqArgs) -> anyhow::Result<()> {
    let DlqCommand::Replay { idle_timeout_s } = args.command;
    let bus = args.pipeline.kafka_bus(settings).await?;
    let mut subscription = bus.subscribe(&[Topic::DeadLetters], "dlq-replay").await?;
    let mut replayed = 0;
    while let Ok(Some(delivery)) = tokio::time::timeout(Duration::from_secs(idle_timeout_s), subscription.next()).await
    {
        // Exactly-once: the letter's replay and its acknowledgement commit together.
        let replay = async {
            match DeadLetter::from_payload(&delivery.record.payload) {
                Ok(letter) if letter.payload_truncated => {
                    tracing::error!(key = %letter.key, "dead letter cut to fit bus.max_event_bytes: cannot be replayed, skipped")
                }
                Ok(letter) => {
                    let record = Record {
                        topic: letter.original_topic,
                        key: letter.key,
                        payload: letter.payload.into_bytes(),
                        trace: TraceHeaders { traceparent: letter.traceparent, tracestate: letter.tracestate },
                    };
                    // Letters from before `attempts` was recorded say 0: they were tried at least once.
                    bus.publish_attempt(record, letter.attempts.max(1) + 1).await?;
                    replayed += 1;
                }
                Err(error) => tracing::error!(%error, "unreadable dead letter skipped"),
            }
            delivery.ack();
            anyhow::Ok(())
        };
        atomically(&*bus, replay).await?;
    }
    subscription.commit().await?;
    eprintln!("replayed {replayed} dead letters");
    Ok(())
}
