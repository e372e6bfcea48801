//! `lacuna calibrate`: the re-ranker threshold for migres.rerank_threshold, by the paper's recipe.

use std::path::PathBuf;

use clap::Args;

use crate::actors::clients::{Reranker, TantivySearch};
use crate::config::Settings;
use crate::eval::calibrate::calibrate;
use crate::eval::dataset::Dataset;

#[derive(Args)]
pub struct CalibrateArgs {
    /// Dataset folders (questions.jsonl + corpus.jsonl); each is calibrated on its own.
    #[arg(long, required = true, num_args = 1..)]
    dataset: Vec<PathBuf>,
    /// Only the first N questions of each.
    #[arg(long)]
    limit: Option<usize>,
    /// The share of questions that must keep a passage.
    #[arg(long, default_value_t = 0.8)]
    keep: f64,
}

pub async fn calibrate_command(settings: &Settings, args: CalibrateArgs) -> anyhow::Result<()> {
    let reranker = Reranker::load(&settings.rerank, &settings.onnx)?;
    let mut lowest: Option<f32> = None;
    println!("| dataset | questions | threshold | questions kept | gold passages passing |");
    println!("|---|---|---|---|---|");
    for dir in &args.dataset {
        let dataset = Dataset::load(dir, args.limit)?;
        let search = TantivySearch::open(&dataset.index_dir()?)?;
        let c = calibrate(&search, &reranker, &dataset.questions, settings.migres.retrieve_top_n, args.keep).await?;
        let gold = c.gold_passing.map(|g| format!("{:.0}%", 100.0 * g)).unwrap_or_else(|| "-".into());
        println!("| {} | {} | {:.2} | {:.0}% | {gold} |", dataset.name, c.questions, c.threshold, 100.0 * c.kept);
        lowest = Some(lowest.map_or(c.threshold, |l| l.min(c.threshold)));
    }
    if let Some(threshold) = lowest {
        println!(
            "\nmigres.rerank_threshold = {threshold:.2} keeps at least {:.0}% of the questions of every dataset above \
             (re-ranker {}).",
            100.0 * args.keep,
            settings.rerank.model_dir.display()
        );
    }
    Ok(())
}
