//! `lacuna topics`: creates a pipeline's Kafka topics (idempotent), those its declaration uses, and
//! prints each with the stages that write and read it, for a deploy step such as the Helm
//! chart's topic Job. Stages create missing topics too; doing it once up front sets the partition
//! count before any replica starts.

use clap::Args;

use crate::config::Settings;
use crate::pipelines::{PipelineKind, StageDecl, graph};
use crate::topics::kafka::KafkaBus;

#[derive(Args)]
pub struct TopicsArgs {
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
}

pub async fn topics(settings: &Settings, args: TopicsArgs) -> anyhow::Result<()> {
    let kafka = args.pipeline.kafka_settings(&settings.kafka);
    args.pipeline.kafka_bus(settings).await?;
    let stages = args.pipeline.stages();
    let names = |pick: &dyn Fn(&StageDecl) -> bool| {
        let names: Vec<&str> = stages.iter().filter(|s| pick(s)).map(|s| s.name).collect();
        if names.is_empty() { "-".to_string() } else { names.join(", ") }
    };
    for topic in graph::topics(stages) {
        let writers = names(&|s| s.outputs.contains(&topic));
        let readers = names(&|s| s.inputs.contains(&topic));
        println!("{}{} ({} partitions): {writers} -> {readers}", kafka.topic_prefix, topic.name(), kafka.partitions);
    }
    if settings.search.follow_documents {
        let bus = KafkaBus::new(settings.kafka.clone(), &settings.bus)?;
        bus.ensure_documents_topic().await?;
        let topic = bus.documents_topic();
        println!("{topic} (compacted, every pipeline's): lacuna ingest, serve -> each retrieve replica's index");
        let dead = bus.documents_dead_letters_topic();
        println!("{dead} (compacted): each retrieve replica, for records that are not documents -> operators");
    }
    Ok(())
}
