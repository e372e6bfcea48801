//! `lacuna stage NAME`: one stage as its own process and consumer group on Kafka. Start as many
//! replicas as the topic has partitions; SIGTERM (or Ctrl-C) drains in-flight work, commits, exits.

use std::sync::Arc;

use clap::Args;

use crate::pipelines::migres::{STAGES, spawn_named};
use crate::pipelines::parts::{Parts, check_llm};
use crate::settings::Settings;
use crate::topics::kafka::KafkaBus;

#[derive(Args)]
pub struct StageArgs {
    /// retrieve, sentence_filter, leaf, verify, main or query_gen.
    name: String,
}

pub async fn stage(settings: &Settings, args: StageArgs) -> anyhow::Result<()> {
    if !STAGES.contains(&args.name.as_str()) {
        anyhow::bail!("no stage {:?}; stages are {}", args.name, STAGES.join(", "));
    }
    let ready = crate::pipelines::observe::start(&settings.metrics.listen).await?;
    let parts = Parts::load_for(settings, &[args.name.as_str()])?;
    if args.name != "retrieve" {
        check_llm(settings).await.map_err(anyhow::Error::msg)?;
    }
    let bus = kafka_bus(settings).await?;
    let running = spawn_named(&args.name, bus, settings, &parts).await?;
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "stage {} running on {} (group {}{})",
        args.name, settings.kafka.brokers, settings.kafka.topic_prefix, args.name
    );
    wait_for_shutdown_signal().await;
    eprintln!("stage {}: draining", args.name);
    running.drain().await;
    eprintln!("stage {}: stopped", args.name);
    Ok(())
}

/// The Kafka bus with every topic created.
pub async fn kafka_bus(settings: &Settings) -> anyhow::Result<Arc<KafkaBus>> {
    let bus = KafkaBus::new(settings.kafka.clone())?;
    bus.ensure_topics().await?;
    Ok(Arc::new(bus))
}

async fn wait_for_shutdown_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler installs");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
