//! `lacuna eval --resume`: what an interrupted run already answered, and the check that the folder
//! belongs to the same run, so hours of answers are neither lost nor mixed with another system's.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::eval::dataset::EvalQuestion;
use crate::topics::{AnswerRecord, Event, VersionedAnswer};

/// What makes two parts one run; written to `run.json` in the output folder.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct RunIdentity {
    pub dataset: String,
    pub pipeline: String,
    pub label: Option<String>,
    pub profile: Option<String>,
    pub model: String,
}

/// Records `identity` in `out/run.json`. Resuming a folder whose run.json names another dataset,
/// pipeline, profile or model is refused (a folder from before run.json existed is taken as is).
pub fn claim_folder(out: &Path, identity: &RunIdentity, resume: bool) -> anyhow::Result<()> {
    let path = out.join("run.json");
    if resume && let Ok(text) = std::fs::read_to_string(&path) {
        let earlier: RunIdentity =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{} is unreadable: {e}", path.display()))?;
        if &earlier != identity {
            anyhow::bail!(
                "{} holds another run ({earlier:?}), not this one ({identity:?}): resume with the same \
                 settings, or choose another --out",
                out.display()
            );
        }
    }
    std::fs::write(&path, serde_json::to_vec_pretty(identity)?)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// Error records that an interruption or a failing server causes, not the question or the method:
/// their questions are asked again.
const INFRASTRUCTURE_ERRORS: &[&str] =
    &["llm_unreachable", "llm_timeout", "llm_http_status", "llm_cache_miss", "search", "bus"];

/// The answers of an interrupted run, in the order written, the first per question kept. Only the
/// last line may fail to parse, when the interruption cut it short (without its newline); its question
/// is asked again, as are those that ended in an infrastructure error. Any other unreadable line, or an
/// answer to a question outside `questions` (another dataset or `--limit`), is an error: a resume never
/// drops answers silently.
pub fn earlier_answers(path: &Path, questions: &HashMap<&str, &EvalQuestion>) -> anyhow::Result<Vec<VersionedAnswer>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    };
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let cut = lines.len() - 1; // the part after the last newline: empty unless a write was cut
    let mut seen = HashSet::new();
    let mut kept = Vec::new();
    for (n, line) in lines.iter().enumerate().filter(|(_, l)| !l.trim_ascii().is_empty()) {
        let answer = match VersionedAnswer::from_payload(line) {
            Ok(answer) => answer,
            Err(e) if n == cut => {
                eprintln!("{} ends in a cut line ({e}): its question is asked again", path.display());
                continue;
            }
            Err(e) => anyhow::bail!("{} line {}: {e}: mend or remove it to resume", path.display(), n + 1),
        };
        let id = answer.record.question_id().to_string();
        if !questions.contains_key(id.as_str()) {
            anyhow::bail!(
                "{} answers question {id}, which this dataset does not ask: resume into the folder of the same \
                 dataset and --limit, or choose another --out",
                path.display()
            );
        }
        if let AnswerRecord::Error(error) = &answer.record
            && INFRASTRUCTURE_ERRORS.contains(&error.error_type.as_str())
        {
            eprintln!("question {id} ended in {}: asked again", error.error_type);
            continue;
        }
        if seen.insert(id) {
            kept.push(answer);
        }
    }
    Ok(kept)
}

/// Replaces `path` with `answers`, one a line, through a temporary file: a failure on the way leaves
/// the earlier file whole.
pub fn rewrite(path: &Path, answers: &[VersionedAnswer]) -> anyhow::Result<()> {
    let mut text = Vec::new();
    for answer in answers {
        serde_json::to_writer(&mut text, answer)?;
        text.push(b'\n');
    }
    let temporary = path.with_extension("jsonl.partial");
    std::fs::write(&temporary, text)
        .and_then(|_| std::fs::rename(&temporary, path))
        .map_err(|e| anyhow::anyhow!("cannot rewrite {}: {e}", path.display()))
}
