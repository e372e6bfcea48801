//! `lacuna topics`: creates a pipeline's Kafka topics (idempotent), for a deploy step such as the Helm
//! chart's topic Job. Stages create missing topics too; doing it once up front sets the partition
//! count before any replica starts.

use clap::Args;

use crate::pipelines::pipeline::PipelineKind;
use crate::settings::Settings;
use crate::topics::Topic;

#[derive(Args)]
pub struct TopicsArgs {
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
}

pub async fn topics(settings: &Settings, args: TopicsArgs) -> anyhow::Result<()> {
    let kafka = args.pipeline.kafka_settings(&settings.kafka);
    args.pipeline.kafka_bus(&settings.kafka).await?;
    for topic in Topic::ALL {
        println!("{}{} ({} partitions)", kafka.topic_prefix, topic.name(), kafka.partitions);
    }
    Ok(())
}
