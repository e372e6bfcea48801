//! Corpus files, as both backends index them: JSONL of `{"id", "title", "text"}` lines.

use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;

use super::SearchError;
use crate::topics::Passage;

#[derive(Deserialize)]
struct CorpusLine {
    id: String,
    #[serde(default)]
    title: String,
    text: String,
}

pub fn corpus_error(corpus: &Path, line: usize, message: String) -> SearchError {
    SearchError::Corpus { path: corpus.to_path_buf(), line, message }
}

/// Calls `each` with the line number and passage of every non-blank line of a corpus JSONL file
/// (`{"id", "title", "text"}`), stopping at the first error.
pub fn for_each_passage(
    corpus: &Path,
    mut each: impl FnMut(usize, Passage) -> Result<(), SearchError>,
) -> Result<(), SearchError> {
    let file = std::fs::File::open(corpus).map_err(|e| corpus_error(corpus, 0, e.to_string()))?;
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| corpus_error(corpus, n + 1, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let CorpusLine { id, title, text } =
            serde_json::from_str(&line).map_err(|e| corpus_error(corpus, n + 1, e.to_string()))?;
        each(n + 1, Passage { id, title, text })?;
    }
    Ok(())
}
