//! `lacuna stage NAME`: one stage as its own process and consumer group on Kafka. Start as many
//! replicas as the topic has partitions; SIGTERM (or Ctrl-C) drains in-flight work, commits, exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;

use crate::actors::runner::RunningStage;
use crate::config::Settings;
use crate::pipelines::PipelineKind;
use crate::pipelines::parts::Part;
use crate::pipelines::parts::{Parts, check_llm};
use crate::pipelines::startup::{follow_documents, while_following};

#[derive(Args)]
pub struct StageArgs {
    /// One of the pipeline's stages (`lacuna graph --pipeline P` lists them, e.g. retrieve ... query_gen for MIGRES, join for RA-ISF).
    name: String,
    /// The pipeline this stage belongs to: each pipeline has its own topics.
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
}

pub async fn stage(settings: &Settings, args: StageArgs) -> anyhow::Result<()> {
    let stage = args.pipeline.stage(&args.name)?;
    let ready = crate::serve::observe::start(&settings.metrics.listen).await?;
    let who = format!("stage {}", args.name);
    let mut materialiser = follow_documents(settings, stage.needs(Part::Search), &who).await?;
    let mut parts = Parts::load_for(settings, args.pipeline, [stage])?;
    if stage.needs(Part::Llm) {
        parts = parts.with_served_model(check_llm(settings).await.map_err(anyhow::Error::msg)?);
    }
    let kafka = args.pipeline.kafka_settings(&settings.kafka);
    let bus = args.pipeline.kafka_bus(settings).await?;
    let running = stage.start(bus, settings, &parts).await?;
    eprintln!("stage {} running on {} (group {}{})", args.name, kafka.brokers, kafka.topic_prefix, args.name);
    let result = while_following(&mut materialiser, &who, run_until_stopped(running, ready.clone())).await;
    // Unready on any failure: the stage's own already is, an index that stopped following is too.
    result.inspect_err(|_| ready.store(false, Ordering::Relaxed))
}

/// Serves a started stage, ready, until SIGTERM or Ctrl-C, then drains it. A stage that fails
/// turns unready and ends the process with an error, so that Kubernetes restarts it and the bus
/// hands its unfinished events to the new process.
pub async fn run_until_stopped(running: RunningStage, ready: Arc<AtomicBool>) -> anyhow::Result<()> {
    ready.store(true, Ordering::Relaxed);
    tokio::select! {
        _ = wait_for_shutdown_signal() => {}
        reason = running.failed() => {
            ready.store(false, Ordering::Relaxed);
            running.stop();
            anyhow::bail!("stage {} failed: {reason}", running.name);
        }
    }
    eprintln!("stage {}: draining", running.name);
    let name = running.name;
    running.drain().await;
    eprintln!("stage {name}: stopped");
    Ok(())
}

pub(crate) async fn wait_for_shutdown_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler installs");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
