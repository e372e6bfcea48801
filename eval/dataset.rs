//! A dataset folder in the ../shared/data format: `questions.jsonl` (id, question, answers with
//! aliases, type, gold_doc_ids, ...) and `corpus.jsonl` (id, title, text), the passage pool.

use super::split::Half;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::actors::clients::TantivySearch;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EvalQuestion {
    pub id: String,
    pub question: String,
    /// The gold answer and its aliases: a prediction matching any of them is right.
    pub answers: Vec<String>,
    /// Set for yes/no questions (StrategyQA).
    #[serde(default)]
    pub answer_bool: Option<bool>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// Passages that hold the evidence, for retrieval recall.
    #[serde(default)]
    pub gold_doc_ids: Vec<String>,
}

impl EvalQuestion {
    /// A yes/no question by the dataset's own label (StrategyQA): it gets the yes/no instruction in
    /// its prompts. A comparison question does not, whatever its gold answer: a question in
    /// production carries no gold, so the prompt must not depend on it.
    pub fn is_yes_no(&self) -> bool {
        self.answer_bool.is_some() || self.kind.as_deref() == Some("yes/no")
    }

    /// The gold polarity of every question whose gold answer is yes or no (StrategyQA, and the
    /// comparison questions of HotpotQA and 2Wiki with a yes/no gold): it is scored on polarity.
    pub fn gold_bool(&self) -> Option<bool> {
        if let Some(gold) = self.answer_bool {
            return Some(gold);
        }
        let first = self.answers.first()?;
        if self.is_yes_no() {
            return super::score::polarity(first);
        }
        match super::score::normalize(first).as_str() {
            "yes" => Some(true),
            "no" => Some(false),
            _ => None,
        }
    }
}

#[derive(Clone)]
pub struct Dataset {
    /// The folder's name (hotpotqa, musique, ...).
    pub name: String,
    pub dir: PathBuf,
    pub questions: Vec<EvalQuestion>,
    /// Only this half's questions (`--half`).
    pub half: Option<Half>,
}

impl Dataset {
    /// Reads the first `limit` questions. A malformed line is an error naming the line: a benchmark
    /// must not silently score fewer questions than it says.
    pub fn load(dir: &Path, limit: Option<usize>) -> anyhow::Result<Dataset> {
        let path = dir.join("questions.jsonl");
        let file = std::fs::File::open(&path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let mut questions = Vec::new();
        for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
            if limit.is_some_and(|limit| questions.len() >= limit) {
                break;
            }
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let question: EvalQuestion = serde_json::from_str(&line)
                .map_err(|e| anyhow::anyhow!("{} line {}: not a question record: {e}", path.display(), n + 1))?;
            questions.push(question);
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "dataset".into());
        Ok(Dataset { name, dir: dir.to_path_buf(), questions, half: None })
    }

    /// Only the questions of `half` (all without one), the first `limit` of them.
    pub fn cut(mut self, half: Option<Half>, limit: Option<usize>) -> Dataset {
        if let Some(half) = half {
            self.questions.retain(|q| half.holds(&q.id));
            self.half = Some(half);
        }
        self.questions.truncate(limit.unwrap_or(usize::MAX));
        self
    }

    pub fn corpus(&self) -> PathBuf {
        self.dir.join("corpus.jsonl")
    }

    /// The BM25 index of the corpus, built once under `<cache>/eval-index` and reused while the
    /// corpus is unchanged (the directory name carries the corpus size and modification time).
    pub fn index_dir(&self) -> anyhow::Result<PathBuf> {
        let cache = crate::config::cache_dir().join("eval-index");
        let corpus = self.corpus();
        let meta = std::fs::metadata(&corpus).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", corpus.display()))?;
        let modified = meta.modified()?.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        let dir = cache.join(format!("{}-{}-{modified}", self.name, meta.len()));
        // The marker sits beside the index, outside tantivy's directory.
        let marker = dir.with_extension("complete");
        if !marker.exists() {
            // A half-built directory from an interrupted run is replaced by `build`.
            let count = TantivySearch::build(&dir, &corpus)?;
            std::fs::write(&marker, count.to_string())?;
            eprintln!("indexed {count} passages of {} into {}", self.name, dir.display());
        }
        Ok(dir)
    }
}
