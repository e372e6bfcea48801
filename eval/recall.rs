//! `lacuna recall`: how well a retrieval backend finds the gold passages of a dataset's questions,
//! searched with the question itself: recall@k (the share of gold passages among the top k, averaged
//! over questions with gold passages) at each cutoff asked for, and how long indexing the corpus took.
//! This is what one trades when swapping BM25 for another retriever (the MIGRES paper's Appendix A found a
//! stronger but noisier retriever did not help the method).

use std::time::Instant;

use crate::actors::clients::{MeiliSearch, Search, TantivySearch};
use crate::config::{SearchBackend, Settings};
use crate::eval::dataset::Dataset;
use crate::eval::score::passage_recall;

/// The cutoffs reported unless others are asked for.
pub const CUTOFFS: [usize; 3] = [5, 20, 50];

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RecallRow {
    pub dataset: String,
    pub backend: String,
    pub questions: usize,
    /// Mean recall at each of the cutoffs it was measured at.
    pub recall: Vec<f64>,
    pub passages: usize,
    pub index_seconds: f64,
}

/// Mean recall@k for each cutoff over the questions that have gold passages.
pub async fn recall_at(search: &Search, dataset: &Dataset, cutoffs: &[usize]) -> anyhow::Result<(usize, Vec<f64>)> {
    let deepest = cutoffs.iter().copied().max().unwrap_or(0);
    let mut sums = vec![0.0; cutoffs.len()];
    let mut scored = 0;
    for question in dataset.questions.iter().filter(|q| !q.gold_doc_ids.is_empty()) {
        let found: Vec<String> =
            search.search(&question.question, deepest).await?.into_iter().map(|(p, _)| p.id).collect();
        for (sum, &k) in sums.iter_mut().zip(cutoffs) {
            *sum += passage_recall(&found[..k.min(found.len())], &question.gold_doc_ids).unwrap_or(0.0);
        }
        scored += 1;
    }
    Ok((scored, sums.into_iter().map(|s| s / scored.max(1) as f64).collect()))
}

/// Indexes `dataset`'s corpus into `backend` (timed), then measures its recall at `cutoffs` (ascending).
pub async fn measure(
    settings: &Settings,
    backend: SearchBackend,
    dataset: &Dataset,
    cutoffs: &[usize],
) -> anyhow::Result<RecallRow> {
    let started = Instant::now();
    let (search, passages) = match backend {
        SearchBackend::Tantivy => {
            let dir = crate::config::cache_dir().join("recall-index").join(&dataset.name);
            let count = TantivySearch::build(&dir, &dataset.corpus())?;
            (Search::Tantivy(TantivySearch::open(&dir)?), count)
        }
        SearchBackend::Meilisearch => {
            // One index per dataset, so the corpora do not mix.
            let mut meili = settings.search.meilisearch.clone();
            meili.index = format!("{}-{}", meili.index, dataset.name);
            let client = MeiliSearch::new(meili)?;
            let report = client.build(&dataset.corpus()).await?;
            (Search::Meili(client), report.documents)
        }
    };
    let index_seconds = started.elapsed().as_secs_f64();
    let (questions, recall) = recall_at(&search, dataset, cutoffs).await?;
    let backend = format!("{backend:?}").to_lowercase();
    Ok(RecallRow { dataset: dataset.name.clone(), backend, questions, recall, passages, index_seconds })
}

/// The rows, each measured at `cutoffs`, as a Markdown table with a column per cutoff.
pub fn markdown(rows: &[RecallRow], cutoffs: &[usize]) -> String {
    let columns: String = cutoffs.iter().map(|k| format!(" recall@{k} |")).collect();
    let mut out = format!("| dataset | backend | questions |{columns} passages | indexing |\n");
    out.push_str(&format!("|---|---|---|{}---|---|\n", "---|".repeat(cutoffs.len())));
    for r in rows {
        let pct: Vec<String> = r.recall.iter().map(|v| format!("{:.1}%", 100.0 * v)).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.2} s |\n",
            r.dataset,
            r.backend,
            r.questions,
            pct.join(" | "),
            r.passages,
            r.index_seconds
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_column_per_cutoff() {
        let row = RecallRow {
            dataset: "hotpotqa".into(),
            backend: "tantivy".into(),
            questions: 2,
            recall: vec![0.5, 0.75, 1.0],
            passages: 10,
            index_seconds: 0.25,
        };
        let table = markdown(&[row], &[5, 30, 50]);
        assert!(table.starts_with("| dataset | backend | questions | recall@5 | recall@30 | recall@50 | passages |"));
        assert!(table.contains("|---|---|---|---|---|---|---|---|\n"), "{table}");
        assert!(table.contains("| hotpotqa | tantivy | 2 | 50.0% | 75.0% | 100.0% | 10 | 0.25 s |"), "{table}");
    }
}
