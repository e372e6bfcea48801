//! `lacuna recall`: recall@5/20/50 of gold passages and indexing time, per dataset and backend.

use std::path::PathBuf;

use clap::Args;

use crate::config::{SearchBackend, Settings};
use crate::eval::dataset::Dataset;
use crate::eval::recall::{markdown, measure};

#[derive(Args)]
pub struct RecallArgs {
    /// Dataset folders (questions.jsonl with gold_doc_ids + corpus.jsonl).
    #[arg(long, required = true, num_args = 1..)]
    dataset: Vec<PathBuf>,
    /// Backends to compare; meilisearch needs a server at search.meilisearch.url.
    #[arg(long, num_args = 1.., default_values = ["tantivy"])]
    backend: Vec<SearchBackend>,
    /// Only the first N questions of each dataset.
    #[arg(long)]
    limit: Option<usize>,
}

pub async fn recall(settings: &Settings, args: RecallArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for dir in &args.dataset {
        let dataset = Dataset::load(dir, args.limit)?;
        for backend in &args.backend {
            rows.push(measure(settings, *backend, &dataset).await?);
        }
    }
    print!("{}", markdown(&rows));
    Ok(())
}
