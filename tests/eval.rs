//! `lacuna eval` and `lacuna calibrate` as a user runs them, on a slice of the real HotpotQA data with
//! the real index and re-ranker and a scripted LLM over HTTP: every question scored once, the paper's
//! columns in the report, runs compared, a cached rerun free and identical, the threshold recipe kept.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use lacuna::eval::calibrate::calibrate;
use lacuna::eval::dataset::Dataset;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Prompt, Reply, last_field, prompt_kind};
use support::scripted::{HUGO_QUESTION_ID, hugo_script};

const SPURS_ID: &str = "5ab48ec25542991779162cdc";
const WRONG: &str = "a wrong answer";

/// A dataset folder holding the given HotpotQA questions, its corpus the real one.
fn dataset(name: &str, ids: &[&str]) -> PathBuf {
    support::dataset_folder(name, "hotpotqa", ids)
}

/// Answers the baselines' reader by question (right for two, wrong for the rest), judges every
/// non-exact prediction correct, and plays MIGRES for the Hugo question.
fn eval_script(prompt: &str) -> Reply {
    match prompt_kind(prompt) {
        Prompt::Reader => {
            let question = last_field(prompt, "Question: ");
            let answer = if question.contains("Hugo") {
                "Murcia"
            } else if question.contains("Tottenham") {
                "Spurs"
            } else {
                WRONG
            };
            Reply::Json(json!({"answer": answer, "confidence": 4, "explanation": "scripted"}))
        }
        Prompt::Judge => Reply::Text("Yes".into()),
        _ => hugo_script(prompt),
    }
}

fn lacuna(llm_url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lacuna"));
    command.env("LACUNA__LLM__BASE_URL", llm_url).env("LACUNA__MIGRES__RETRIEVE_TOP_N", "20");
    // The scripted LLM answers the loop's prompts (`--profile loop`); the golden replays run eval
    // with the default's first read.
    command.env("LACUNA__MIGRES__READ_FIRST", "false");
    command
}

fn eval(llm_url: &str, dataset: &Path, pipeline: &str, out: &Path, extra: &[&str]) -> Value {
    let output = lacuna(llm_url)
        .args(["eval", "--dataset", dataset.to_str().unwrap(), "--pipeline", pipeline, "--out", out.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert!(output.status.success(), "eval failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap()
}

fn records(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out.join("records.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[tokio::test]
async fn eval_scores_every_question_judges_and_compares_pipelines() {
    let llm = FakeLlm::start(eval_script).await;
    let three = dataset("eval-three", &[HUGO_QUESTION_ID, SPURS_ID, "5a8b1a925542997f31a41c6e"]);
    let scratch = support::scratch_dir("eval-runs");
    let vanilla_out = scratch.join("vanilla");

    let vanilla = eval(&llm.base_url, &three, "vanilla", &vanilla_out, &["--judge"]);
    assert_eq!(vanilla["questions"], 3);
    assert_eq!(vanilla["answered"], 3);
    assert!((vanilla["em"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9, "{vanilla}");
    assert_eq!(vanilla["acc_judged"], 1.0, "the judge accepts the wrong answer");
    assert_eq!(llm.calls_of(Prompt::Judge), 1, "exact matches need no judge");
    assert_eq!(vanilla["llm_calls"], 1.0, "VANILLA makes one call per question");
    let per_iteration = vanilla["passages_per_iteration"].as_f64().unwrap();
    assert!(per_iteration > 0.0 && per_iteration <= 5.0, "k = 5 passages at most: {per_iteration}");
    assert!(vanilla["knowledge_tokens"].as_f64().unwrap() > 50.0, "shown passages are counted in tokens");
    assert_eq!(vanilla["pipeline"], "vanilla");
    assert_eq!(vanilla["dataset"], "eval-three");

    let per_question = records(&vanilla_out);
    assert_eq!(per_question.len(), 3, "one record per question");
    let wrong = per_question.iter().find(|r| r["prediction"] == WRONG).unwrap();
    assert_eq!(wrong["scores"]["em"], 0.0);
    assert_eq!(wrong["judged_correct"], true);
    // records.jsonl keeps what a comparison needs, not the trace; answers.jsonl keeps whole records.
    assert!(wrong.get("record").is_none() && !wrong.to_string().contains("\"trace\""), "{wrong}");
    assert!(wrong["cited_ids"].as_array().is_some_and(|ids| !ids.is_empty()), "{wrong}");
    assert!(wrong["gold_reached"]["retrieved"].is_array(), "{wrong}");
    let answers = std::fs::read_to_string(vanilla_out.join("answers.jsonl")).unwrap();
    let whole: Value =
        answers.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|a| a["answer"] == WRONG).unwrap();
    assert!(whole["trace"].as_array().is_some_and(|t| !t.is_empty()), "answers.jsonl keeps the trace");

    let one = dataset("eval-hugo", &[HUGO_QUESTION_ID]);
    let migres_out = scratch.join("migres");
    let migres = eval(&llm.base_url, &one, "migres", &migres_out, &[]);
    assert_eq!(migres["em"], 1.0, "{migres}");
    assert_eq!(migres["iterations"], 2.0, "the second hop takes a second iteration");
    assert_eq!(migres["cited_gold_recall"], 1.0, "the facts cite both gold passages");
    assert!(migres["llm_calls"].as_f64().unwrap() > 1.0);
    assert_eq!(migres["acc_judged"], Value::Null, "not judged without --judge");

    let compare = |out: &Path, inputs: &[&Path]| {
        lacuna(&llm.base_url).args(["eval", "--out", out.to_str().unwrap(), "--compare"]).args(inputs).output().unwrap()
    };
    let compare_out = scratch.join("compare");
    let output = compare(&compare_out, &[&vanilla_out, &migres_out]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(table.starts_with("| pipeline | eval-three | eval-hugo |"), "{table}");
    assert!(table.contains("| vanilla | 66.7 / 66.7 / 66.7 (1.0, n=3) | - |"), "{table}");
    assert!(table.contains("| migres | - | 100.0"), "{table}");
    let svg = std::fs::read_to_string(compare_out.join("comparison.svg")).unwrap();
    assert_eq!(svg.matches("<circle").count(), 4, "a dot per report and a legend mark per pipeline");

    // A glob over the runs' folder also matches the comparison's own folder, which is skipped; a run that
    // was interrupted before its report is refused with the way to finish it.
    let again = scratch.join("compare-again");
    let output = compare(&again, &[&vanilla_out, &migres_out, &compare_out]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8(output.stdout).unwrap(), table, "the comparison's folder adds nothing");
    assert!(String::from_utf8_lossy(&output.stderr).contains("a comparison's output, not a run; skipped"));
    let interrupted = scratch.join("interrupted");
    std::fs::create_dir_all(&interrupted).unwrap();
    std::fs::copy(migres_out.join("answers.jsonl"), interrupted.join("answers.jsonl")).unwrap();
    let output = compare(&again, &[&vanilla_out, &interrupted]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("an interrupted run, which `lacuna eval --resume"));

    // Both runs' builds asked with one reader prompt: no warning. Runs whose builds asked with
    // another text of it are named, with why, on stderr and in comparison.md.
    let output = compare(&compare_out, &[&vanilla_out, &migres_out]);
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut run: Value = serde_json::from_slice(&std::fs::read(vanilla_out.join("run.json")).unwrap()).unwrap();
    assert!(run["golden_sha256"].is_string(), "a run names the golden records its build was checked against");
    run["provenance"]["prompts_sha256"]["reader"] = json!("another text");
    std::fs::write(vanilla_out.join("run.json"), run.to_string()).unwrap();
    let output = compare(&compare_out, &[&vanilla_out, &migres_out]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("warning: vanilla on eval-three") && stderr.contains("prompt reader differs"), "{stderr}");
    let markdown = std::fs::read_to_string(compare_out.join("comparison.md")).unwrap();
    assert!(markdown.contains("prompt reader differs"), "{markdown}");
}

#[tokio::test]
async fn a_rerun_with_the_llm_cache_is_identical_and_makes_no_llm_calls() {
    let llm = FakeLlm::start(eval_script).await;
    let data = dataset("eval-cache", &[HUGO_QUESTION_ID, SPURS_ID]);
    let scratch = support::scratch_dir("eval-cache-runs");
    let (cache, scores) = (scratch.join("llm-cache"), scratch.join("scores"));
    let _ = std::fs::remove_dir_all(&cache);
    let _ = std::fs::remove_dir_all(&scores);
    let run = |out: PathBuf| {
        let output = lacuna(&llm.base_url)
            .env("LACUNA_LLM_CACHE_DIR", &cache)
            .env("LACUNA_RERANK_CACHE_DIR", &scores)
            .args(["eval", "--dataset", data.to_str().unwrap(), "--pipeline", "vanilla-s", "--llm-cache"])
            .args(["--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let report: Value = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
        (report, records(&out))
    };

    let (first, first_records) = run(scratch.join("first"));
    assert_eq!(llm.calls_of(Prompt::Reader), 2);
    assert_eq!(first["cache_hits"], 0);
    // The re-ranker's scores are kept beside the replies: without them a host whose int8 kernels differ
    // would flip a keep decision, send another prompt and miss the cache.
    let scores = std::fs::read_to_string(scores.join("scores.jsonl")).unwrap_or_default();
    assert!(scores.lines().count() > 10, "{} scores kept", scores.lines().count());
    let (second, second_records) = run(scratch.join("second"));
    assert_eq!(llm.calls_of(Prompt::Reader), 2, "the rerun is answered from the cache");
    assert_eq!(second["cache_hits"], 2);
    let predictions = |records: &[Value]| records.iter().map(|r| r["prediction"].clone()).collect::<Vec<_>>();
    assert_eq!(predictions(&first_records), predictions(&second_records));
    assert_eq!(first["em"], second["em"]);
    assert_eq!(first["prompt_tokens"], second["prompt_tokens"], "cached calls keep their recorded cost");
}

/// `bench pipeline --llm-cache` over a deterministic eval's response cache, in replay: the model's
/// answers come back without an endpoint, on the same half's questions, and the bench scores them as
/// the eval did. A cost lever's bench then reports what it does to the answers from the same run.
#[tokio::test]
async fn a_bench_replays_an_evals_answers_and_scores_them_alike() {
    let llm = FakeLlm::start(eval_script).await;
    // The Hugo question is in the check half, the other in the tuning half.
    let data = dataset("bench-replay", &[HUGO_QUESTION_ID, "5a8b1a925542997f31a41c6e"]);
    let scratch = support::scratch_dir("bench-replay-runs");
    let cache = scratch.join("llm-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let out = scratch.join("eval");
    let dir = data.to_str().unwrap();
    let output = lacuna(&llm.base_url)
        .env("LACUNA_LLM_CACHE_DIR", &cache)
        .env("LACUNA_RERANK_CACHE_DIR", scratch.join("scores"))
        .args(["eval", "--dataset", dir, "--pipeline", "migres", "--half", "check", "--deterministic", "--llm-cache"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    assert_eq!((report["questions"].as_u64(), report["em"].as_f64()), (Some(1), Some(1.0)), "{report}");
    let calls = llm.calls();

    let json = scratch.join("bench.json");
    let output = lacuna(&llm.base_url)
        .env("LACUNA_LLM_CACHE_DIR", &cache)
        .env("LACUNA__LLM__CACHE_MODE", "replay")
        .args(["bench", "pipeline", "--dataset", dir, "--half", "check", "--llm-cache", "--open", "1"])
        .args(["--llm-concurrency", "1", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(llm.calls(), calls, "every call of the bench is answered from the eval's cache");
    let runs: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let run = &runs[0];
    assert_eq!((run["questions"].as_u64(), run["errors"].as_u64()), (Some(1), Some(0)), "the check half only: {run}");
    assert_eq!(run["half"], "check");
    assert_eq!(run["llm_calls"], 0, "{run}");
    assert_eq!(run["llm_cache_hits"].as_f64(), report["llm_calls"].as_f64(), "the eval's calls, replayed: {run}");
    let answers = &run["answers"];
    assert_eq!(answers["em"], report["em"], "{run}");
    assert_eq!(answers["cited_gold_recall"], report["cited_gold_recall"], "{run}");
    assert_eq!((answers["with_gold"].as_u64(), answers["all_gold_cited"].as_u64()), (Some(1), Some(1)), "{run}");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("on bench-replay, check half") && table.contains("| as configured | 100.0 | 100.0 |"),
        "{table}"
    );
}

/// `--deterministic` exists so that two runs of one build answer alike: the server must never see two
/// calls at once, not even a question's own calls to two stages.
#[tokio::test]
async fn a_deterministic_run_sends_one_call_at_a_time_and_its_run_says_so() {
    let pause = std::time::Duration::from_millis(300);
    let calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = calls.clone();
    let llm = FakeLlm::start(move |prompt| {
        if prompt_kind(prompt) == Prompt::Reader {
            seen.lock().unwrap().push(Instant::now());
        }
        Reply::Delayed(pause, Box::new(eval_script(prompt)))
    })
    .await;
    let data = dataset("eval-deterministic", &[HUGO_QUESTION_ID, SPURS_ID, "5a8b1a925542997f31a41c6e"]);
    let out = support::scratch_dir("eval-deterministic-runs").join("vanilla-s");
    let _ = std::fs::remove_dir_all(&out);

    let report = eval(&llm.base_url, &data, "vanilla-s", &out, &["--deterministic"]);
    assert_eq!(report["questions"], 3);
    let starts = calls.lock().unwrap().clone();
    assert_eq!(starts.len(), 3);
    for pair in starts.windows(2) {
        assert!(pair[1] - pair[0] >= pause, "a call started while another was answered: {starts:?}");
    }
    let run: Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["deterministic"], true, "{run}");

    // Self-consistency asks main's samples at once: one call at a time holds inside a question too.
    let llm_calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = llm_calls.clone();
    let llm = FakeLlm::start(move |prompt| {
        if !prompt.is_empty() {
            seen.lock().unwrap().push(Instant::now());
        }
        Reply::Delayed(pause, Box::new(eval_script(prompt)))
    })
    .await;
    let hugo = dataset("eval-deterministic-migres", &[HUGO_QUESTION_ID]);
    let out = support::scratch_dir("eval-deterministic-runs").join("migres");
    let _ = std::fs::remove_dir_all(&out);
    let output = lacuna(&llm.base_url)
        .env("LACUNA__MIGRES__DECISION_SAMPLES", "3")
        .args(["eval", "--dataset", hugo.to_str().unwrap(), "--pipeline", "migres", "--deterministic"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let starts = llm_calls.lock().unwrap().clone();
    assert!(starts.len() >= 5, "{starts:?}");
    for pair in starts.windows(2) {
        assert!(pair[1] - pair[0] >= pause, "two calls of one question at once: {starts:?}");
    }
}

#[tokio::test]
async fn calibration_picks_the_highest_threshold_that_keeps_80_percent() {
    let data = Dataset::load(&support::data_dir().join("hotpotqa"), Some(10)).unwrap();
    let c = calibrate(&support::search(), &support::reranker(), &data.questions, 20, 0.8).await.unwrap();
    let keeping = |threshold: f32| c.best_scores.iter().filter(|s| **s >= threshold).count();
    assert_eq!(c.questions, 10);
    assert!(keeping(c.threshold) >= 8, "at least 80% keep a passage at {}", c.threshold);
    assert!(keeping(c.threshold + 1e-3) < 8, "a higher threshold would keep fewer than 80%");
    assert!(c.gold_passing.is_some_and(|g| g > 0.0), "some gold passages pass the threshold");
}

#[tokio::test]
async fn a_resumed_run_asks_only_the_questions_the_interruption_left() {
    let llm = FakeLlm::start(eval_script).await;
    let two = dataset("eval-resume", &[HUGO_QUESTION_ID, SPURS_ID]);
    let out = support::scratch_dir("eval-resume-runs").join("vanilla-s");
    let _ = std::fs::remove_dir_all(&out);
    let full = eval(&llm.base_url, &two, "vanilla-s", &out, &[]);
    assert_eq!(llm.calls_of(Prompt::Reader), 2);
    let answers = std::fs::read_to_string(out.join("answers.jsonl")).unwrap();
    let lines: Vec<String> = answers.lines().map(String::from).collect();
    assert_eq!(lines.len(), 2);
    let first: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(first["provenance"]["pipeline"], "vanilla-s", "every record says what made it");
    assert!(first["provenance"]["index_generation"][0].as_str().unwrap().starts_with("tantivy:"), "{first}");
    let interrupt = |text: String| {
        std::fs::write(out.join("answers.jsonl"), text).unwrap();
        let _ = std::fs::remove_file(out.join("report.json"));
    };

    // An interruption: one answer written whole, the next cut mid-line, no report yet.
    interrupt(format!("{}\n{}", lines[0], &lines[1][..lines[1].len() / 2]));
    let resumed = eval(&llm.base_url, &two, "vanilla-s", &out, &["--resume"]);
    assert_eq!(llm.calls_of(Prompt::Reader), 3, "only the question whose answer was cut is asked again");
    assert_eq!(resumed["resumed"], 1);
    assert_eq!(resumed["questions"], 2);
    assert_eq!(resumed["em"], full["em"], "the report covers both parts");
    let rewritten = std::fs::read_to_string(out.join("answers.jsonl")).unwrap();
    assert_eq!(rewritten.lines().count(), 2, "the cut line is replaced, not kept beside its answer");
    assert_eq!(records(&out).len(), 2);

    // A question that ended because the LLM server went away is asked again; one the method ended in an
    // error is not.
    let ended = |line: &str, error_type: &str| {
        let answer: Value = serde_json::from_str(line).unwrap();
        json!({"schema_version": answer["schema_version"], "status": "error", "question_id": answer["question_id"],
            "question": answer["question"], "stage": "main", "error_type": error_type, "message": "scripted"})
        .to_string()
    };
    interrupt(format!("{}\n{}\n", ended(&lines[0], "llm_timeout"), ended(&lines[1], "llm_bad_response")));
    let resumed = eval(&llm.base_url, &two, "vanilla-s", &out, &["--resume"]);
    assert_eq!(llm.calls_of(Prompt::Reader), 4, "the timed-out question only");
    assert_eq!((resumed["resumed"].clone(), resumed["errors"].clone()), (json!(1), json!(1)));

    // Another build or configuration that does not shape answers (here a timeout) changes the run's
    // provenance: the resume says so and goes on.
    let identity: Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(identity["provenance"]["pipeline"], "vanilla-s", "run.json records the provenance");
    // A resume that goes on: its stderr.
    let goes_on = |env: &[(&str, &str)]| {
        let output = lacuna(&llm.base_url)
            .envs(env.iter().copied())
            .args(["eval", "--dataset", two.to_str().unwrap(), "--pipeline", "vanilla-s", "--resume"])
            .args(["--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{stderr}");
        stderr
    };
    let stderr = goes_on(&[("LACUNA__LLM__TIMEOUT_MS", "123456")]);
    assert!(stderr.contains("under another provenance: provenance.config_sha256"), "{stderr}");
    assert_eq!(llm.calls_of(Prompt::Reader), 4, "nothing is asked again");

    // run.json names the CPU the re-ranker scored on (its int8 kernels decide some keep decisions); a
    // run resumed on another host is noted, not refused: its scores may come from a score cache.
    let mut identity: Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert!(identity["cpu"].as_str().is_some_and(|cpu| !cpu.is_empty()), "{identity}");
    identity["cpu"] = json!("another host (avx512_vnni)");
    std::fs::write(out.join("run.json"), identity.to_string()).unwrap();
    let stderr = goes_on(&[]);
    assert!(stderr.contains("under another provenance: cpu: \"another host (avx512_vnni)\" then"), "{stderr}");

    // Nothing is dropped silently: a broken line before the last, another pipeline's or configuration's
    // folder and answers to questions outside the dataset are all refused, and the answers stay as they were.
    let refused = |pipeline: &str, extra: &[&str], env: &[(&str, &str)], why: &str| {
        let before = std::fs::read_to_string(out.join("answers.jsonl")).unwrap();
        let output = lacuna(&llm.base_url)
            .envs(env.iter().copied())
            .args(["eval", "--dataset", two.to_str().unwrap(), "--pipeline", pipeline, "--resume"])
            .args(["--out", out.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(why), "{stderr}");
        assert_eq!(std::fs::read_to_string(out.join("answers.jsonl")).unwrap(), before, "answers untouched");
    };
    refused("vanilla", &[], &[], "pipeline: \"vanilla-s\" then, \"vanilla\" now");
    // The same pipeline under another setting that shapes its answers is another run too.
    let other_setting = [("LACUNA__READER__COMPARE_OPTIONS", "true")];
    refused("vanilla-s", &[], &other_setting, "settings.reader.compare_options: false then, true now");
    refused("vanilla-s", &["--limit", "1"], &[], "which this dataset does not ask");
    interrupt(format!("{{\"broken\n{}\n", lines[0]));
    refused("vanilla-s", &[], &[], "line 1");
    assert_eq!(llm.calls_of(Prompt::Reader), 4);
}
