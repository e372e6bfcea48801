//! The `lacuna` binary as a user runs it: bad input gets a clear message and loses nothing.

mod support;

use std::process::Command;

use lacuna::config::Settings;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};

fn lacuna(llm_url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lacuna"));
    command
        .env("LACUNA__LLM__BASE_URL", llm_url)
        .env("LACUNA__SEARCH__INDEX_DIR", support::hotpot_index())
        .env("LACUNA__MIGRES__RETRIEVE_TOP_N", "5")
        .envs(support::ANSWER_CHECKS_OFF);
    command
}

fn answering_llm() -> impl Fn(&str) -> Reply {
    |prompt| match prompt_kind(prompt) {
        Prompt::Main => Reply::Json(
            json!({"answerable": true, "answer": "Spurs", "confidence": 4, "explanation": "e", "missing_information": ""}),
        ),
        Prompt::Leaf => Reply::Json(json!({"facts": []})),
        Prompt::Knowledge => Reply::Text("I don't know.".into()),
        _ => Reply::Status(400),
    }
}

#[tokio::test]
async fn run_writes_one_record_per_input_line_and_rejects_bad_lines_clearly() {
    let llm = FakeLlm::start(answering_llm()).await;
    let dir = support::scratch_dir("run");
    let questions = dir.join("questions.jsonl");
    let out = dir.join("answers.jsonl");
    let long = "why ".repeat(600);
    let lines = [
        json!({"id": "a", "question": "What was Tottenham Hotspur commonly referred to as?"}).to_string(),
        "{not json".to_string(),
        json!({"id": "empty", "question": "   "}).to_string(),
        json!({"id": "long", "question": long}).to_string(),
        json!({"id": "a", "question": "A second question with a repeated id?"}).to_string(),
        String::new(),
        json!({"question": "Which club did Len Worley play for?", "answers": ["x"]}).to_string(),
    ];
    std::fs::write(&questions, lines.join("\n")).unwrap();

    let status = lacuna(&llm.base_url)
        .args(["run", "--questions", questions.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());

    let records: Vec<Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 6, "one record per non-blank input line");
    let find =
        |id: &str, status: &str| records.iter().filter(|r| r["question_id"] == id && r["status"] == status).count();
    assert_eq!(find("a", "answered"), 1);
    assert_eq!(find("a", "error"), 1, "the repeated id is rejected, not merged");
    assert_eq!(find("line-2", "error"), 1, "a malformed line is reported by its line number");
    assert_eq!(find("empty", "error"), 1);
    assert_eq!(find("long", "error"), 1);
    assert_eq!(find("line-7", "answered"), 1, "a question without id gets its line number");
    for record in records.iter().filter(|r| r["status"] == "error") {
        assert_eq!(record["error_type"], "bad_input");
        assert!(!record["message"].as_str().unwrap().is_empty());
    }
}

#[tokio::test]
async fn an_unreachable_llm_is_a_clear_error_before_anything_is_consumed() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let output = lacuna(&format!("http://127.0.0.1:{port}/v1")).args(["ask", "Who directed Levity?"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unreachable") && stderr.contains("llm-server.sh"), "says what to do: {stderr}");
}

#[tokio::test]
async fn a_missing_index_says_how_to_build_one() {
    let llm = FakeLlm::start(answering_llm()).await;
    let output = lacuna(&llm.base_url)
        .env("LACUNA__SEARCH__INDEX_DIR", "/nonexistent/lacuna-index")
        .args(["ask", "Who directed Levity?"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("lacuna index --corpus"), "says how to build the index: {stderr}");
}

#[tokio::test]
async fn an_unknown_config_key_is_an_error() {
    let output =
        lacuna("http://127.0.0.1:9/v1").env("LACUNA__MIGRES__MAX_ITERATONS", "3").args(["ask", "q?"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("max_iteratons"));
}

#[tokio::test]
async fn json_logs_carry_the_stage_question_id_and_iteration() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::Main => Reply::Status(503),
        _ => answering_llm()(prompt),
    })
    .await;
    let dir = support::scratch_dir("json-logs");
    let (questions, out) = (dir.join("q.jsonl"), dir.join("a.jsonl"));
    std::fs::write(&questions, json!({"id": "logged", "question": "Which club did Len Worley play for?"}).to_string())
        .unwrap();
    let output = lacuna(&llm.base_url)
        .env("LACUNA__LOG__FORMAT", "json")
        .env("LACUNA_LOG", "lacuna=warn")
        .env("LACUNA__LLM__MAX_RETRIES", "0")
        .env("LACUNA__RETRY__MAX_ATTEMPTS", "2")
        .env("LACUNA__RETRY__BACKOFF_MS", "10")
        .args(["run", "--questions", questions.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let retry: Value = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["fields"]["message"] == "retrying event")
        .unwrap_or_else(|| panic!("a JSON line about the retry in:\n{stderr}"));
    assert_eq!(retry["span"]["stage"], "main");
    assert_eq!(retry["span"]["question_id"], "logged");
    assert_eq!(retry["span"]["iteration"], 1);
    assert_eq!(retry["level"], "WARN");
}

/// `--against-default` runs the default first and then the profile, on one fake LLM: a profile's cost
/// against the default's in one table. The fake answers with the question's own words, which no passage
/// writes, so every first read of the default goes round the loop: against `loop`, which has no first
/// read, its worst case, one read more.
#[test]
fn bench_puts_a_profile_beside_the_default() {
    let dir = support::scratch_dir("bench-profile");
    let dataset = support::data_dir().join("hotpotqa");
    let json = dir.join("pipeline.json");
    let status = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .args(["--profile", "loop", "bench", "pipeline", "--dataset", dataset.to_str().unwrap(), "--limit", "3"])
        .args(["--fake-llm-ms", "1,1", "--retrieve-top-n", "5", "--against-default", "--json", json.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let runs: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let (default, the_loop) = (&runs[0], &runs[1]);
    assert_eq!((default["label"].as_str(), the_loop["label"].as_str()), (Some("default"), Some("as configured")));
    assert_eq!((default["errors"].as_u64(), the_loop["errors"].as_u64()), (Some(0), Some(0)));
    let calls = |run: &Value| run["llm_calls"].as_u64().unwrap();
    assert!(calls(default) >= calls(the_loop) + 3, "a first read per question, then the loop: {runs}");
}

/// `lacuna bench` with its own fake LLM: the figures it promises are there and the run lost nothing.
#[test]
fn bench_reports_a_pipeline_run_and_the_rerankers_ways() {
    let dir = support::scratch_dir("bench");
    let dataset = support::data_dir().join("hotpotqa");
    let (pipeline_json, rerank_json) = (dir.join("pipeline.json"), dir.join("rerank.json"));
    let status = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .args(["bench", "pipeline", "--dataset", dataset.to_str().unwrap(), "--limit", "3", "--fake-llm-ms", "1,1"])
        .args(["--retrieve-top-n", "5", "--json", pipeline_json.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let runs: Value = serde_json::from_str(&std::fs::read_to_string(&pipeline_json).unwrap()).unwrap();
    let run = &runs[0];
    assert_eq!(run["questions"], 3, "one record per question: {run}");
    assert_eq!(run["errors"], 0, "the fake's schema-valid replies carry every question through: {run}");
    assert!(run["llm_calls"].as_u64().unwrap() >= 3 * 3, "MIGRES makes several calls per question: {run}");
    assert!(run["rerank_pairs"].as_u64().unwrap() > 0 && run["questions_per_second"].as_f64().unwrap() > 0.0);
    assert!(run["stage_busy_seconds"]["sentence_filter"].as_f64().unwrap() > 0.0, "{run}");

    let status = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .args(["bench", "rerank", "--dataset", dataset.to_str().unwrap(), "--pairs", "40"])
        .args(["--json", rerank_json.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let bench: Value = serde_json::from_str(&std::fs::read_to_string(&rerank_json).unwrap()).unwrap();
    assert_eq!(bench["pairs"], 40);
    let ways = bench["ways"].as_array().unwrap();
    assert!(ways.len() >= 5, "bare arrival, bare sorted, the stage three ways: {bench}");
    let padded = |prefix: &str| {
        let way = ways.iter().find(|w| w["name"].as_str().unwrap().starts_with(prefix)).unwrap();
        way["padded_per_real"].as_f64().unwrap()
    };
    assert_eq!(padded("stage path (as configured)"), 1.0, "pairs scored one at a time carry no padding");
    assert!(padded("stage path as in 41ae80c") > 1.0, "41ae80c's batches of 32 padded");
    assert!(bench["flips"].as_u64().unwrap() <= 40);
}

/// `lacuna recall --half tuning --at 30 5`: recall of the half's questions at the cutoffs asked for,
/// ascending, each at least the one before (what a cut of `migres.retrieve_top_n` to 30 gives up).
#[test]
fn recall_reports_the_cutoffs_asked_for_on_one_half() {
    let dataset = support::data_dir().join("hotpotqa");
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .args(["recall", "--dataset", dataset.to_str().unwrap(), "--half", "tuning", "--limit", "6"])
        .args(["--at", "30", "5"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.starts_with("| dataset | backend | questions | recall@5 | recall@30 | passages |"), "{stdout}");
    let row = stdout.lines().find(|l| l.starts_with("| hotpotqa | tantivy | 6 |")).expect(&stdout);
    let recall: Vec<f64> =
        row.split('|').filter_map(|cell| cell.trim().strip_suffix('%')).map(|v| v.parse().unwrap()).collect();
    assert_eq!(recall.len(), 2, "{row}");
    assert!(recall[0] <= recall[1] && recall[1] > 0.0, "{row}");
}

/// Kafka TLS and SASL settings reach librdkafka (its configuration dump, logged at debug, lists them)
/// while the secret read from the environment never appears in the logs; a secret variable that is
/// not set stops the command with a message naming it.
#[test]
fn kafka_properties_reach_the_client_and_secrets_never_the_logs() {
    let secret = "never-log-this-7f3a";
    let topics = |secret_variable: &str| {
        Command::new(env!("CARGO_BIN_EXE_lacuna"))
            .args(["topics", "--pipeline", "migres"])
            // Nothing listens there: the command fails after the short socket timeout below.
            .env("LACUNA__KAFKA__BROKERS", "127.0.0.1:1")
            .env(
                "LACUNA__KAFKA__PROPERTIES",
                "security.protocol=SASL_SSL;sasl.mechanisms=SCRAM-SHA-512;sasl.username=lacuna;socket.timeout.ms=2000;debug=conf,security",
            )
            .env("LACUNA__KAFKA__SECRET_PROPERTIES", format!("sasl.password={secret_variable}"))
            .env("LACUNA_TEST_KAFKA_SECRET", secret)
            .env("LACUNA_LOG", "debug")
            .output()
            .unwrap()
    };
    let output = topics("LACUNA_TEST_KAFKA_SECRET");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "no broker listens on 127.0.0.1:1");
    assert!(stderr.contains("security.protocol = sasl_ssl"), "the property reached librdkafka:\n{stderr}");
    assert!(stderr.contains("sasl.password = [redacted]"), "the secret reached librdkafka:\n{stderr}");
    assert!(!stderr.contains(secret), "the secret was logged:\n{stderr}");

    let output = topics("LACUNA_TEST_KAFKA_UNSET");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("the environment variable LACUNA_TEST_KAFKA_UNSET is not set"), "{stderr}");
}

/// `ask --llm-cache` asked twice: the second answer is the first, and reaches no LLM.
#[tokio::test]
async fn ask_with_the_llm_cache_answers_again_without_calling_the_llm() {
    let llm = FakeLlm::start(answering_llm()).await;
    let cache = support::scratch_dir("ask-llm-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let ask = || {
        let output = lacuna(&llm.base_url)
            .env("LACUNA__LLM__CACHE_DIR", &cache)
            .args(["ask", "--llm-cache", "--json", "What was Tottenham Hotspur commonly referred to as?"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let record: Value = serde_json::from_slice(&output.stdout).unwrap();
        record
    };
    // The method's calls: the start-up check that the endpoint answers is not one of them.
    let method_calls =
        || [Prompt::Main, Prompt::Leaf, Prompt::QueryGen].map(|kind| llm.calls_of(kind)).iter().sum::<usize>();
    let first = ask();
    let calls = method_calls();
    assert!(calls > 0 && first["answer"] == "Spurs", "{first}");
    let again = ask();
    assert_eq!(method_calls(), calls, "the second ask was answered from the cache");
    assert_eq!(again["answer"], first["answer"]);
    assert!(again["usage"]["cache_hits"].as_u64().unwrap() > 0, "{}", again["usage"]);
}

/// Every answer says what made it: the build, the pipeline, the configuration and prompts as
/// hashes, the model, the re-ranker file and the index generation its retrievals read.
#[tokio::test]
async fn an_answer_record_names_the_build_configuration_prompts_and_index_that_made_it() {
    let llm = FakeLlm::start(answering_llm()).await;
    let ask = |env: &[(&str, &str)]| {
        let output = lacuna(&llm.base_url)
            .envs(env.iter().copied())
            .args(["ask", "--json", "What was Tottenham Hotspur commonly referred to as?"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let record = ask(&[]);
    let provenance = &record["provenance"];
    let is_sha256 = |v: &Value| v.as_str().is_some_and(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(provenance["version"], env!("CARGO_PKG_VERSION"), "{provenance}");
    let commit = provenance["commit"].as_str().unwrap();
    assert!(commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()), "built in a git checkout: {commit}");
    assert_eq!(provenance["pipeline"], "migres");
    assert_eq!(provenance["model"], "local", "the fake endpoint reports no model: the configured name");
    assert!(is_sha256(&provenance["config_sha256"]), "{provenance}");
    for prompt in ["main", "query_gen", "leaf", "final_answer"] {
        assert!(is_sha256(&provenance["prompts_sha256"][prompt]), "{prompt}: {provenance}");
    }
    let installed = Settings::defaults().rerank.model_dir.join("model.onnx.sha256");
    let installed = std::fs::read_to_string(installed).unwrap();
    assert_eq!(provenance["reranker_sha256"], installed.split_whitespace().next().unwrap(), "the file scored with");
    // The generation each retrieval read, once.
    let read: Vec<&Value> = record["trace"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "retrieved")
        .map(|s| &s["generation"])
        .collect();
    assert!(!read.is_empty() && read.iter().all(|g| **g == provenance["index_generation"][0]), "{read:?}");
    assert!(provenance["index_generation"][0].as_str().unwrap().starts_with("tantivy:"), "{provenance}");
    assert_eq!(provenance["index_generation"].as_array().unwrap().len(), 1);

    // Another setting is another configuration; the prompts and the index are the same.
    let other = ask(&[("LACUNA__MIGRES__MAX_ITERATIONS", "4")]);
    assert_ne!(other["provenance"]["config_sha256"], provenance["config_sha256"]);
    assert_eq!(other["provenance"]["prompts_sha256"], provenance["prompts_sha256"]);
    assert_eq!(other["provenance"]["index_generation"], provenance["index_generation"]);
}

#[test]
fn ask_run_and_serve_take_a_profile_as_a_layer_of_settings() {
    let dir = support::scratch_dir("profile-layer");
    std::fs::write(dir.join("common.toml"), "[migres]\ntop_k = \"many\"\n").unwrap();
    for command in [&["ask", "Who?"][..], &["run", "--questions", "q.jsonl", "--out", "a.jsonl"], &["serve"]] {
        let out = lacuna("http://127.0.0.1:9/v1").arg("--profile").arg(&dir).args(command).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("top_k"),
            "{command:?}: the profile's layer is read: {stderr}"
        );
    }
    let out = lacuna("http://127.0.0.1:9/v1").args(["--profile", "nonesuch", "ask", "Who?"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("neither a built-in profile (paper, before, fast, adaptive, loop, shallow, levers)"),
        "{stderr}"
    );
}
