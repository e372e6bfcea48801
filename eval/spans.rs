//! The `answer_span` lever measured on stored runs (`lacuna eval --compare --answer-spans DATA`):
//! the lever only rewrites the final answer, so applying it to a run's stored answers gives the
//! answers the run would have given with it. Each run gets a twin, `<name>+spans`, whose answers
//! are mapped over the text of the passages they cite (the verified facts, which the stage also
//! reads, are not in eval records) and scored again, so the paired comparison shows its effect.

use std::collections::HashMap;
use std::path::Path;

use super::report::{EvalRecord, Report};
use super::score::score;
use crate::actors::shared::span::{evidence_span, strip_stray_punctuation};

/// The passages' text by id, of each dataset folder under `data` that the runs name.
pub struct Corpora {
    data: std::path::PathBuf,
    loaded: HashMap<String, HashMap<String, String>>,
}

impl Corpora {
    pub fn new(data: &Path) -> Corpora {
        Corpora { data: data.to_path_buf(), loaded: HashMap::new() }
    }

    fn of(&mut self, dataset: &str) -> anyhow::Result<&HashMap<String, String>> {
        if !self.loaded.contains_key(dataset) {
            let path = self.data.join(dataset).join("corpus.jsonl");
            let text = std::fs::read_to_string(&path)
                .map_err(|e| anyhow::anyhow!("cannot read {} for --answer-spans: {e}", path.display()))?;
            let mut passages = HashMap::new();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let value: serde_json::Value = serde_json::from_str(line)?;
                if let (Some(id), Some(body)) = (value["id"].as_str(), value["text"].as_str()) {
                    passages.insert(id.to_string(), body.to_string());
                }
            }
            self.loaded.insert(dataset.to_string(), passages);
        }
        Ok(&self.loaded[dataset])
    }
}

/// The twin of a run with its answers mapped, and how many answers the mapping changed.
pub fn with_spans(
    report: &Report,
    records: &[EvalRecord],
    corpora: &mut Corpora,
) -> anyhow::Result<(Report, Vec<EvalRecord>, usize)> {
    let passages = corpora.of(&report.dataset)?;
    let mut changed = 0;
    let mapped: Vec<EvalRecord> = records
        .iter()
        .map(|record| {
            let mut record = record.clone();
            let Some(prediction) = record.prediction.clone() else { return record };
            let yes_no = record.gold.iter().all(|g| matches!(g.to_lowercase().as_str(), "yes" | "no"));
            if yes_no {
                return record;
            }
            let texts: Vec<&str> =
                record.cited_ids.iter().filter_map(|id| passages.get(id).map(String::as_str)).collect();
            let answer = strip_stray_punctuation(&evidence_span(&prediction, &texts).unwrap_or(prediction.clone()));
            if answer != prediction {
                changed += 1;
                record.scores = score(&answer, &record.gold);
                record.prediction = Some(answer);
            }
            record
        })
        .collect();
    let twin = Report {
        dataset: report.dataset.clone(),
        half: report.half,
        pipeline: format!("{}+spans", report.pipeline),
        model: report.model.clone(),
        date: report.date.clone(),
        ..Report::from_records(&mapped, report.wall_seconds)
    };
    Ok((twin, mapped, changed))
}
