//! Shared test helpers: the fake OpenAI-protocol LLM, a real index of a shared/data corpus, settings.
#![allow(dead_code)]

pub mod cluster;
pub mod disrupted;
pub mod fake_llm;
pub mod fake_meili;
pub mod faulty_bus;
pub mod methods;
pub mod onnx_graph;
pub mod phoenix;
pub mod scripted;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU16, Ordering};

use lacuna::actors::clients::{LlmClient, Reranker, TantivySearch};
use lacuna::config::Settings;

/// shared/data beside the repository (as in CI), or LACUNA_DATA.
pub fn data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LACUNA_DATA") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data")
}

/// A question of a dataset by id, as (question, answers, gold passage ids).
pub fn question(dataset: &str, id: &str) -> (String, Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(data_dir().join(dataset).join("questions.jsonl")).expect("dataset questions");
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        if value["id"] == id {
            let strings =
                |v: &serde_json::Value| v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
            return (
                value["question"].as_str().unwrap().to_string(),
                strings(&value["answers"]),
                strings(&value["gold_doc_ids"]),
            );
        }
    }
    panic!("no question {id} in {dataset}");
}

/// A directory of this test binary under the build's scratch space (not /tmp, which would fill up).
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(env!("CARGO_CRATE_NAME")).join(name);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// A dataset folder named `name` holding the questions `ids` of the shared/data set `dataset`, with
/// that set's real corpus linked (so `lacuna eval`'s cached index of it is built once).
pub fn dataset_folder(name: &str, dataset: &str, ids: &[&str]) -> PathBuf {
    let dir = scratch_dir(name);
    let all = std::fs::read_to_string(data_dir().join(dataset).join("questions.jsonl")).unwrap();
    let lines: Vec<&str> = ids
        .iter()
        .map(|id| all.lines().find(|l| l.contains(&format!("\"id\": \"{id}\""))).expect("question in the set"))
        .collect();
    std::fs::write(dir.join("questions.jsonl"), lines.join("\n") + "\n").unwrap();
    let corpus = dir.join("corpus.jsonl");
    // A link left by an earlier run may point into a checkout that is gone: make it afresh.
    if corpus.symlink_metadata().is_ok() {
        std::fs::remove_file(&corpus).unwrap();
    }
    std::os::unix::fs::symlink(data_dir().join(dataset).join("corpus.jsonl").canonicalize().unwrap(), corpus).unwrap();
    dir
}

/// A real BM25 index of the HotpotQA corpus, built once per test binary.
pub fn hotpot_index() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Test processes run side by side: each builds beside the shared folder and the first to
        // finish moves its build into place, so none opens a folder another is still writing.
        let dir = scratch_dir("hotpotqa-index");
        if !dir.join("meta.json").exists() {
            let own = scratch_dir(&format!("hotpotqa-index.{}", std::process::id()));
            TantivySearch::build(&own, &data_dir().join("hotpotqa/corpus.jsonl")).expect("index the HotpotQA corpus");
            let _ = std::fs::remove_dir(&dir);
            if std::fs::rename(&own, &dir).is_err() {
                std::fs::remove_dir_all(&own).expect("remove a spare index build");
            }
        }
        dir
    })
    .clone()
}

pub fn search() -> TantivySearch {
    TantivySearch::open(&hotpot_index()).unwrap()
}

/// Defaults pointing at the test index and the given LLM endpoint, with fast retries, and the loop
/// from the first iteration on (`--profile loop`): the scripted LLMs of these tests answer the loop's
/// prompts. The default's first read (on since issue 76) has tests of its own (`tests/pipeline.rs`,
/// `tests/golden_replay.rs`, `tests/real_llm.rs`), which turn it on.
pub fn settings(llm_url: &str) -> Settings {
    let mut settings = Settings::defaults();
    settings.migres.read_first = false;
    settings.search.index_dir = hotpot_index();
    settings.llm.base_url = llm_url.to_string();
    settings.llm.timeout_ms = 10_000;
    settings.llm.retry_backoff_ms = 10;
    settings.retry.backoff_ms = 10;
    settings
}

/// The main module's answer checks switched off (`acceptance = "flag"`, no grounding gate, no
/// two-option comparison) and no first read (the loop from the first iteration, as in [`settings`]),
/// as environment variables for `lacuna` processes. Tests of the delivery machinery use fake LLMs
/// that answer at once without evidence; the checks and the first read have tests of their own
/// (tests/stages, tests/pipeline.rs).
pub const ANSWER_CHECKS_OFF: [(&str, &str); 4] = [
    ("LACUNA__MIGRES__ACCEPTANCE", "flag"),
    ("LACUNA__MIGRES__GROUNDING_GATE", "false"),
    ("LACUNA__MIGRES__COMPARE_OPTIONS", "false"),
    ("LACUNA__MIGRES__READ_FIRST", "false"),
];

/// [`ANSWER_CHECKS_OFF`] on in-process settings.
pub fn answer_checks_off(settings: &mut Settings) {
    settings.migres.acceptance = lacuna::config::Acceptance::Flag;
    settings.migres.grounding_gate = false;
    settings.migres.compare_options = false;
    settings.migres.read_first = false;
}

pub fn llm(url: &str) -> LlmClient {
    LlmClient::new(settings(url).llm)
}

pub fn llm_with(settings: &Settings) -> LlmClient {
    LlmClient::new(settings.llm.clone())
}

/// The real cross-encoder, loaded once per test binary (scripts/setup.sh installs it).
pub fn reranker() -> Reranker {
    static RERANKER: OnceLock<Reranker> = OnceLock::new();
    RERANKER
        .get_or_init(|| {
            let settings = Settings::defaults();
            Reranker::load(&settings.rerank, &settings.onnx).expect("the re-ranker is installed: run scripts/setup.sh")
        })
        .clone()
}

/// The real index and re-ranker for a whole pipeline (verification by the LLM).
pub fn parts(settings: &Settings) -> lacuna::pipelines::parts::Parts {
    lacuna::pipelines::parts::Parts {
        search: Some(lacuna::actors::clients::Search::Tantivy(
            TantivySearch::open(&settings.search.index_dir).unwrap(),
        )),
        reranker: Some(reranker()),
        ..Default::default()
    }
}

/// The deepest node of a fanned-out question any trace step comes from (0 for the root), read from
/// the `stage@1.2` names the join gives its children's steps.
pub fn deepest_node(answer: &lacuna::topics::Answered) -> usize {
    answer
        .trace
        .iter()
        .filter_map(|s| s.stage.split_once('@'))
        .map(|(_, path)| path.split('.').count())
        .max()
        .unwrap_or(0)
}

/// MIGRES's query_gen started on `bus` as its declaration builds it, with `settings`' LLM.
pub async fn start_query_gen(
    bus: &std::sync::Arc<dyn lacuna::topics::Bus>,
    settings: &Settings,
) -> lacuna::actors::runner::RunningStage {
    let stage = lacuna::pipelines::PipelineKind::Migres.stage("query_gen").unwrap();
    stage.start(bus.clone(), settings, &lacuna::pipelines::parts::Parts::default()).await.unwrap()
}

/// `N` ports free on 127.0.0.1 now, for servers a test starts in processes of their own. Drawn below
/// Linux's ephemeral range (32768 on), where a port the kernel handed back by `bind(0)` could be
/// taken by an outgoing connection's source port before the server binds it (a stage once failed
/// to start with "Address already in use" that way).
pub fn free_ports<const N: usize>() -> [u16; N] {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let spread = (std::process::id() as u16 % 100) * 100;
    let mut held = Vec::new();
    let mut ports = [0; N];
    for port in &mut ports {
        loop {
            let candidate = 20_000 + (spread + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000;
            if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", candidate)) {
                held.push(listener);
                *port = candidate;
                break;
            }
        }
    }
    ports
}
