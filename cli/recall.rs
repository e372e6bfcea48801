//! `lacuna recall`: recall@k of gold passages and indexing time, per dataset and backend.

use std::path::PathBuf;

use clap::Args;

use crate::config::{SearchBackend, Settings};
use crate::eval::dataset::Dataset;
use crate::eval::recall::{CUTOFFS, markdown, measure};
use crate::eval::split::Half;

#[derive(Args)]
pub struct RecallArgs {
    /// Dataset folders (questions.jsonl with gold_doc_ids + corpus.jsonl).
    #[arg(long, required = true, num_args = 1..)]
    dataset: Vec<PathBuf>,
    /// Backends to compare; meilisearch needs a server at search.meilisearch.url.
    #[arg(long, num_args = 1.., default_values = ["tantivy"])]
    backend: Vec<SearchBackend>,
    /// Only the first N questions of each dataset (of the half, with --half).
    #[arg(long)]
    limit: Option<usize>,
    /// Only the tuning or the check half of each dataset, as `lacuna eval --half` cuts it.
    #[arg(long, value_enum)]
    half: Option<Half>,
    /// The cutoffs k to report recall@k at, for example `--at 5 20 30 50` beside a
    /// `migres.retrieve_top_n` of 30.
    #[arg(long, num_args = 1.., value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    at: Vec<usize>,
}

pub async fn recall(settings: &Settings, args: RecallArgs) -> anyhow::Result<()> {
    let mut cutoffs = if args.at.is_empty() { CUTOFFS.to_vec() } else { args.at };
    cutoffs.sort_unstable();
    cutoffs.dedup();
    let mut rows = Vec::new();
    for dir in &args.dataset {
        let dataset = Dataset::load(dir, None)?.cut(args.half, args.limit);
        for backend in &args.backend {
            rows.push(measure(settings, *backend, &dataset, &cutoffs).await?);
        }
    }
    print!("{}", markdown(&rows, &cutoffs));
    Ok(())
}
