//! `lacuna graph`: a pipeline's topology as its declaration gives it. The README's diagrams and the
//! Helm chart's stage lists (`helm/lacuna/pipelines.yaml`) are this command's output.

use clap::{Args, ValueEnum};

use crate::pipelines::{PipelineKind, graph};

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// One line per stage: its inputs and outputs.
    Text,
    /// A Mermaid flowchart (GitHub renders it in Markdown).
    Mermaid,
    /// Graphviz DOT.
    Dot,
    /// Every pipeline's declaration as JSON.
    Json,
    /// Every pipeline's stages, singletons and topics, as helm/lacuna/pipelines.yaml.
    Helm,
}

#[derive(Args)]
pub struct GraphArgs {
    /// One pipeline (text, mermaid, dot); all of them when left out.
    #[arg(long)]
    pipeline: Option<PipelineKind>,
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
}

pub fn graph(args: GraphArgs) -> anyhow::Result<()> {
    let kinds = match args.pipeline {
        Some(kind) => vec![kind],
        None => PipelineKind::ALL.to_vec(),
    };
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&graph::json())?),
        Format::Helm => print!("{}", graph::helm_values()),
        Format::Text => kinds.iter().for_each(|k| print!("{}", graph::text(*k))),
        Format::Mermaid => kinds.iter().for_each(|k| print!("{}", graph::mermaid(*k))),
        Format::Dot => kinds.iter().for_each(|k| print!("{}", graph::dot(*k))),
    }
    Ok(())
}
