//! `lacuna eval --resume`: what an interrupted run already answered, and the check that the folder
//! belongs to the same run, so hours of answers are neither lost nor mixed with another system's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::Settings;
use crate::eval::dataset::EvalQuestion;
use crate::topics::{AnswerRecord, Event, VersionedAnswer};

/// What makes two parts one run; written to `run.json` in the output folder.
#[derive(Debug, Serialize, Deserialize)]
pub struct RunIdentity {
    pub dataset: String,
    pub pipeline: String,
    pub label: Option<String>,
    pub profile: Option<String>,
    pub model: String,
    /// The settings that shape answers (`answer_settings`), so that a run resumed under another
    /// `LACUNA__...` override or `--config` is not two configurations in one report. Absent in folders
    /// from builds before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<Value>,
    /// What the answers' records say made them (`topics/provenance.rs`), as the run started. A resume
    /// under another build, configuration hash or index generation is reported, not refused: the
    /// settings above decide whether the parts are one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<crate::topics::Provenance>,
    /// The golden records the build was checked against, hashed (`builds`): two builds with the same
    /// answer the golden questions alike. Noted on a resume, as the provenance is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden_sha256: Option<String>,
    /// The CPU the re-ranker scored on (`host`). Noted on a resume, as the provenance is: with a score
    /// cache its scores are the recording host's anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Made with `--deterministic`: one call at a time against a one-slot server. A resume must keep
    /// it, or half the run would carry the batching noise the other half was run to avoid.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deterministic: bool,
}

/// The settings a pipeline's answers depend on: the methods' own sections, the LLM call's sampling
/// and the NLI check. Endpoints, paths, concurrency and caching are left out: they change how fast
/// a run goes, or where, not what it answers.
pub fn answer_settings(settings: &Settings) -> Value {
    let llm = &settings.llm;
    let nli = &settings.nli;
    let mut value = json!({
        "migres": settings.migres,
        "qpaug": settings.qpaug,
        "reader": settings.reader,
        "raisf": settings.raisf,
        "rqrag": settings.rqrag,
        "budget": settings.budget,
        "llm": {"temperature": llm.temperature, "max_tokens": llm.max_tokens, "reasoning_first": llm.reasoning_first,
            "max_reask": llm.max_reask, "reask_temperature": llm.reask_temperature},
        "nli": {"backend": nli.backend, "entailment_prompt": nli.entailment_prompt,
            "entailment_label": nli.entailment_label, "recite_uncited": nli.recite_uncited, "calls": nli.calls,
            "quote_match": nli.quote_match},
    });
    // Written only when it is not the default, so that runs stored before the key existed resume.
    if nli.unjudged != crate::config::Unjudged::default() {
        value["nli"]["unjudged"] = json!(nli.unjudged);
    }
    tidy_floats(&mut value);
    value
}

/// serde_json widens an f32 to the nearest f64 (3.9 becomes 3.9000000953674316); written back as the
/// f32's shortest form, run.json and the refusal below read as the settings were written.
fn tidy_floats(value: &mut Value) {
    match value {
        Value::Object(map) => map.values_mut().for_each(tidy_floats),
        Value::Number(n) => {
            if let Some(x) = n.as_f64().filter(|x| n.is_f64() && f64::from(*x as f32) == *x)
                && let Some(short) = (x as f32).to_string().parse().ok().and_then(serde_json::Number::from_f64)
            {
                *n = short;
            }
        }
        _ => {}
    }
}

/// Records `identity` in `out/run.json`. Resuming a folder whose run.json names another dataset,
/// pipeline, label, profile or model, or another value of a setting that shapes answers, is refused
/// (a folder from before run.json, or before it recorded settings, is taken as is).
pub fn claim_folder(out: &Path, identity: &RunIdentity, resume: bool) -> anyhow::Result<()> {
    let path = out.join("run.json");
    if resume && let Ok(text) = std::fs::read_to_string(&path) {
        let earlier: RunIdentity =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{} is unreadable: {e}", path.display()))?;
        let (noted, differences): (Vec<String>, Vec<String>) = differences(&earlier, identity)
            .into_iter()
            .partition(|d| ["provenance.", "golden_sha256", "cpu"].iter().any(|noted| d.starts_with(noted)));
        for difference in &noted {
            eprintln!("resuming {} under another provenance: {difference}", out.display());
        }
        if !differences.is_empty() {
            anyhow::bail!(
                "{} holds another run ({}): resume with the same settings, or choose another --out",
                out.display(),
                differences.join("; ")
            );
        }
    }
    std::fs::write(&path, serde_json::to_vec_pretty(identity)?)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// What differs between two runs' identities, as "what: then, now" lines.
fn differences(earlier: &RunIdentity, now: &RunIdentity) -> Vec<String> {
    let leaves = |run: &RunIdentity| {
        let mut leaves = BTreeMap::new();
        flatten("", &serde_json::to_value(run).expect("a run identity serializes"), &mut leaves);
        leaves
    };
    let (then, now) = (leaves(earlier), leaves(now));
    let compared = |(key, was): (&String, &Value)| {
        let is = match now.get(key) {
            Some(is) => is,
            // A setting only the earlier build records (removed since) is not compared, nor is any when
            // the earlier build recorded none; a setting added since arrives with a default that keeps
            // the old behaviour.
            None if key.starts_with("settings.") || key.starts_with("provenance.") => return None,
            None => &Value::Null,
        };
        (was != is).then(|| format!("{key}: {was} then, {is} now"))
    };
    then.iter().filter_map(compared).collect()
}

/// A JSON object's leaves by dotted path (`migres.sentence_threshold`).
fn flatten(prefix: &str, value: &Value, leaves: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                flatten(&path, value, leaves);
            }
        }
        leaf => {
            leaves.insert(prefix.to_string(), leaf.clone());
        }
    }
}

/// Error records that an interruption or a failing server causes, not the question or the method:
/// their questions are asked again.
const INFRASTRUCTURE_ERRORS: &[&str] =
    &["llm_unreachable", "llm_timeout", "llm_http_status", "llm_cache_miss", "rerank_cache_miss", "search", "bus"];

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
