//! `lacuna index`: builds the tantivy BM25 index the retrieve stage reads.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use crate::actors::clients::TantivySearch;
use crate::settings::Settings;

#[derive(Args)]
pub struct IndexArgs {
    /// Corpus JSONL: one {"id", "title", "text"} object per line (the format of shared/data/*/corpus.jsonl).
    #[arg(long)]
    corpus: PathBuf,
    /// Where to write the index (default: search.index_dir).
    #[arg(long)]
    index_dir: Option<PathBuf>,
}

pub fn index(settings: &mut Settings, args: IndexArgs) -> anyhow::Result<()> {
    let dir = args.index_dir.unwrap_or_else(|| settings.search.index_dir.clone());
    let started = Instant::now();
    let count = TantivySearch::build(&dir, &args.corpus)?;
    eprintln!(
        "indexed {count} passages from {} into {} in {:.1}s",
        args.corpus.display(),
        dir.display(),
        started.elapsed().as_secs_f32()
    );
    Ok(())
}
