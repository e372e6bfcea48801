//! `lacuna index`: builds the index the retrieve stage reads: a tantivy BM25 index on disk, or a
//! Meilisearch index (`--backend meilisearch`).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use crate::actors::clients::{MeiliSearch, TantivySearch};
use crate::config::{SearchBackend, Settings};

#[derive(Args)]
pub struct IndexArgs {
    /// Corpus JSONL: one {"id", "title", "text"} object per line (the format of shared/data/*/corpus.jsonl).
    #[arg(long)]
    corpus: PathBuf,
    /// Where the passages go (default: search.backend).
    #[arg(long)]
    backend: Option<SearchBackend>,
    /// tantivy: where to write the index (default: search.index_dir).
    #[arg(long)]
    index_dir: Option<PathBuf>,
    /// meilisearch: the index uid (default: search.meilisearch.index).
    #[arg(long)]
    index: Option<String>,
}

pub async fn index(settings: &Settings, args: IndexArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    match args.backend.unwrap_or(settings.search.backend) {
        SearchBackend::Tantivy => {
            let dir = args.index_dir.unwrap_or_else(|| settings.search.index_dir.clone());
            let count = TantivySearch::build(&dir, &args.corpus)?;
            eprintln!(
                "indexed {count} passages from {} into {} in {:.1}s",
                args.corpus.display(),
                dir.display(),
                started.elapsed().as_secs_f32()
            );
        }
        SearchBackend::Meilisearch => {
            let mut meili = settings.search.meilisearch.clone();
            if let Some(index) = args.index {
                meili.index = index;
            }
            let (url, index) = (meili.url.clone(), meili.index.clone());
            let report = MeiliSearch::new(meili)?.build(&args.corpus).await?;
            eprintln!(
                "indexed {} passages from {} into Meilisearch index {index:?} at {url} in {} batches, {:.1}s",
                report.documents,
                args.corpus.display(),
                report.batches,
                started.elapsed().as_secs_f32()
            );
        }
    }
    Ok(())
}
