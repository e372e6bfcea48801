//! `lacuna stage NAME`: one stage as its own process and consumer group on Kafka. Start as many
//! replicas as the topic has partitions; SIGTERM (or Ctrl-C) drains in-flight work, commits, exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;

use crate::actors::runner::RunningStage;
use crate::config::{KafkaSettings, Settings};
use crate::pipelines::parts::Part;
use crate::pipelines::parts::{Parts, check_llm};
use crate::pipelines::startup::{follow_documents, while_following};
use crate::pipelines::{PipelineKind, acls};
use crate::topics::kafka::KafkaBus;

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
    // After the topics were made (where this principal may): one that is still missing is named.
    if !wait_for_acls(&bus, settings, args.pipeline, &args.name).await? {
        eprintln!("stage {}: stopped before it started (it lacked ACLs)", args.name);
        return Ok(());
    }
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

/// How often a stage that lacks an ACL asks again.
const ACLS_AGAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits, unready, until the cluster grants every topic and group ACL the stage needs
/// (`lacuna acls`), naming each that is missing (operation, resource, principal) until it is
/// granted. Started without them, a stage would exit on its first refusal and be restarted into
/// it again, or take records it cannot send on. A cluster without an authorizer grants all; a
/// cluster that cannot be asked is not waited for. False when SIGTERM came first.
async fn wait_for_acls(
    bus: &KafkaBus,
    settings: &Settings,
    pipeline: PipelineKind,
    name: &str,
) -> anyhow::Result<bool> {
    let principal = principal(&settings.kafka);
    let needed = acls::needed(settings, pipeline, name, &principal).unwrap_or_default();
    loop {
        let gauge = &crate::metrics::METRICS.missing_acls;
        gauge.reset();
        match bus.missing_acls(needed.clone()).await {
            Ok(missing) if missing.is_empty() => return Ok(true),
            Ok(missing) => {
                for acl in &missing {
                    gauge.with_label_values(&[name, acl.operation, acl.resource, &acl.name, &acl.principal]).set(1);
                }
                let missing: Vec<String> = missing.iter().map(ToString::to_string).collect();
                tracing::error!(
                    stage = name,
                    missing = %missing.join("; "),
                    "the cluster does not grant this stage an ACL it needs: it stays unready and asks again every {}s \
                     (`lacuna acls --only {name}` lists them all)",
                    ACLS_AGAIN.as_secs()
                );
            }
            Err(error) => {
                tracing::warn!(%error, "cannot ask the cluster which ACLs it grants this stage: starting without knowing");
                return Ok(true);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(ACLS_AGAIN) => {}
            _ = wait_for_shutdown_signal() => return Ok(false),
        }
    }
}

/// The principal the cluster knows this client as, for messages: `User:<sasl.username>` with SASL.
fn principal(kafka: &KafkaSettings) -> String {
    let username = kafka.properties.iter().find_map(|p| p.strip_prefix("sasl.username=").map(str::trim));
    match username {
        Some(name) => format!("User:{name}"),
        None => "this client's principal".to_string(),
    }
}

pub(crate) async fn wait_for_shutdown_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler installs");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
