//! `lacuna stage NAME`: one stage as its own process and consumer group on Kafka. Start as many
//! replicas as the topic has partitions; SIGTERM (or Ctrl-C) drains in-flight work, commits, exits.

use clap::Args;

use crate::pipelines::parts::{Parts, check_llm};
use crate::pipelines::pipeline::PipelineKind;
use crate::settings::Settings;

#[derive(Args)]
pub struct StageArgs {
    /// One of the pipeline's stages (see `PipelineKind::stages`, e.g. retrieve ... query_gen for MIGRES, join for RA-ISF).
    name: String,
    /// The pipeline this stage belongs to: each pipeline has its own topics.
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
}

pub async fn stage(settings: &Settings, args: StageArgs) -> anyhow::Result<()> {
    let stages = args.pipeline.stages();
    if !stages.contains(&args.name.as_str()) {
        anyhow::bail!("{} has no stage {:?}; its stages are {}", args.pipeline, args.name, stages.join(", "));
    }
    let ready = crate::pipelines::observe::start(&settings.metrics.listen).await?;
    let parts = Parts::load_for(settings, &[args.name.as_str()])?;
    if args.name != "retrieve" {
        check_llm(settings).await.map_err(anyhow::Error::msg)?;
    }
    let kafka = args.pipeline.kafka_settings(&settings.kafka);
    let bus = args.pipeline.kafka_bus(&settings.kafka).await?;
    let running = args.pipeline.spawn_stage(&args.name, bus, settings, &parts).await?;
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    eprintln!("stage {} running on {} (group {}{})", args.name, kafka.brokers, kafka.topic_prefix, args.name);
    wait_for_shutdown_signal().await;
    eprintln!("stage {}: draining", args.name);
    running.drain().await;
    eprintln!("stage {}: stopped", args.name);
    Ok(())
}

async fn wait_for_shutdown_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler installs");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
