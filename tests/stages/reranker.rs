//! The re-ranker's own path (worker sessions, rounds, coalescing across events) against a bare ONNX
//! session: the same batches give the same scores, and callers sharing a round each get their own.

use lacuna::actors::clients::onnx::{PairEncoder, open_session};
use lacuna::actors::clients::{ModelError, Reranker};
use lacuna::config::{ExecutionProvider, Graph, ModelSettings, ScoreCacheMode, ScoreCacheSettings, Settings};

/// Pairs of many lengths: a query against passages of one to twelve sentences.
fn pairs(query: &str, n: usize) -> Vec<(String, String)> {
    let sentence = "Hugo Rodríguez Romero is a Spanish footballer who plays for FC Cartagena as a winger.";
    let other = "The town hall of Seville was renovated in 1890 with a new marble staircase.";
    (0..n)
        .map(|i| {
            let text: Vec<&str> = (0..=(i * 7) % 12).map(|k| if (i + k) % 3 == 0 { sentence } else { other }).collect();
            (query.to_string(), format!("Passage {i}. {}", text.join(" ")))
        })
        .collect()
}

/// Batches of 32, where batch-mates matter (a GPU's settings): what a test of batching needs.
fn model(sessions: usize, coalesce_ms: u64) -> ModelSettings {
    ModelSettings {
        sessions,
        threads: 1,
        batch_size: 32,
        coalesce_ms,
        coalesce_max_pairs: 1000,
        ..Settings::defaults().rerank
    }
}

/// What a bare session scores for `pairs` batched as the stage batches one round: sorted by length,
/// cut at the batch size.
fn bare_scores(reranker: &Reranker, pairs: &[(String, String)]) -> Vec<f32> {
    let settings = Settings::defaults();
    let path = settings.rerank.model_dir.join("model.onnx");
    let (mut session, _) = open_session(&path, &settings.onnx.library_path, 1, ExecutionProvider::Cpu).unwrap();
    let encoder = reranker.model().encoder();
    let mut scores = vec![f32::NAN; pairs.len()];
    for chunk in PairEncoder::length_order(pairs).chunks(encoder.batch_size) {
        let encoded = encoder.encode(chunk.iter().map(|&i| pairs[i].clone()).collect()).unwrap();
        for (row, &i) in encoder.run(&mut session, encoded).unwrap().into_iter().zip(chunk) {
            scores[i] = row[0];
        }
    }
    scores
}

fn assert_close(stage: &[f32], bare: &[f32]) {
    assert_eq!(stage.len(), bare.len());
    for (i, (a, b)) in stage.iter().zip(bare).enumerate() {
        assert!((a - b).abs() <= 1e-4, "pair {i}: stage {a}, bare session {b}");
    }
}

#[tokio::test]
async fn the_stage_scores_equal_a_bare_session_given_the_same_batches() {
    let reranker = Reranker::load(&model(1, 0), &Settings::defaults().onnx).unwrap();
    let pairs = pairs("Which club does Hugo play for?", 45);
    let scores = reranker.score(pairs.clone()).await.unwrap();
    assert_close(&scores, &bare_scores(&reranker, &pairs));
    assert!(scores.iter().any(|s| *s != scores[0]), "real scores differ from pair to pair: {scores:?}");
}

#[tokio::test]
async fn events_sharing_a_round_each_get_their_own_scores_back() {
    // A long wait and a high pair cap put all three events into one round on the one session.
    let reranker = Reranker::load(&model(1, 3000), &Settings::defaults().onnx).unwrap();
    let (a, b, c) =
        (pairs("Which club does Hugo play for?", 20), pairs("Where is Seville?", 7), pairs("Who is Hugo?", 33));
    let (sa, sb, sc) = tokio::join!(reranker.score(a.clone()), reranker.score(b.clone()), reranker.score(c.clone()));
    let (sa, sb, sc) = (sa.unwrap(), sb.unwrap(), sc.unwrap());
    // The bare session sees the round the workers saw: the three events' pairs together.
    let round: Vec<(String, String)> = a.iter().chain(&b).chain(&c).cloned().collect();
    let bare = bare_scores(&reranker, &round);
    assert_close(&sa, &bare[..20]);
    assert_close(&sb, &bare[20..27]);
    assert_close(&sc, &bare[27..]);
}

#[tokio::test]
async fn cuda_runs_on_a_gpu_and_falls_back_to_the_cpu_elsewhere() {
    let mut onnx = Settings::defaults().onnx;
    onnx.execution_provider = ExecutionProvider::Cuda;
    let on_cuda = Reranker::load(&model(1, 0), &onnx).unwrap();
    let pairs = pairs("Which club does Hugo play for?", 12);
    let gpu = on_cuda.score(pairs.clone()).await.unwrap();
    let gpu_here = lacuna::actors::clients::gpu::cuda_in_runtime() && std::path::Path::new("/dev/nvidia0").exists();
    // The CPU scores the graph CUDA loaded: the float one where setup derived it.
    let graph = if on_cuda.model().graph().ends_with("model.float.onnx") { Graph::Float } else { Graph::Installed };
    let on_cpu = Reranker::load(&ModelSettings { graph, ..model(1, 0) }, &Settings::defaults().onnx).unwrap();
    let cpu = on_cpu.score(pairs).await.unwrap();
    if gpu_here {
        assert_eq!(on_cuda.model().provider(), ExecutionProvider::Cuda, "a GPU and the CUDA runtime are here");
        assert_eq!(graph, Graph::Float, "on CUDA the float graph runs (LACUNA_ORT=gpu scripts/setup.sh derives it)");
        for (g, c) in gpu.iter().zip(&cpu) {
            // Float kernels differ between providers (TF32 on the GPU): close, not equal.
            assert!((g - c).abs() < 0.1, "CUDA {g} against CPU {c}");
        }
    } else {
        println!("SKIPPED: no GPU or no CUDA build of ONNX Runtime here (LACUNA_ORT=gpu); checked the CPU fallback");
        assert_eq!(on_cuda.model().provider(), ExecutionProvider::Cpu, "without a GPU, cuda falls back to the CPU");
        assert_eq!(graph, Graph::Installed, "the CPU fallback loads the installed (int8) graph");
        assert_close(&gpu, &cpu);
    }
}

/// The float graph (derived at setup for the CUDA provider) scores what the int8 graph scores, up
/// to the int8 graph's quantisation of activations. A wrong dequantisation (a scale or zero point
/// missed) moves scores by whole units.
#[tokio::test]
async fn the_float_graph_scores_what_the_installed_graph_scores() {
    let installed = ModelSettings { graph: Graph::Installed, ..model(1, 0) };
    let float = ModelSettings { graph: Graph::Float, ..installed.clone() };
    assert!(
        float.graph_path(ExecutionProvider::Cpu).exists(),
        "no model.float.onnx: scripts/test.sh derives it (LACUNA_FLOAT_GRAPH=1 scripts/setup.sh)"
    );
    let onnx = Settings::defaults().onnx;
    let (a, b) = (Reranker::load(&installed, &onnx).unwrap(), Reranker::load(&float, &onnx).unwrap());
    assert!(b.model().graph().ends_with("model.float.onnx"), "{}", b.model().graph().display());
    let mut pairs = pairs("Which club does Hugo play for?", 12);
    pairs.extend(self::pairs("Where was the town hall renovated?", 12));
    let (x, y) = (a.score(pairs.clone()).await.unwrap(), b.score(pairs).await.unwrap());
    let spread = x.iter().copied().fold(f32::MIN, f32::max) - x.iter().copied().fold(f32::MAX, f32::min);
    assert!(spread > 5.0, "the pairs span relevant and irrelevant: {x:?}");
    for (int8, float) in x.iter().zip(&y) {
        assert!((int8 - float).abs() < 0.75, "int8 {int8} against float {float}");
    }
}

/// Released sessions are gone before the process exits (a CUDA session left to the exit aborts it);
/// a call after the release is an error, not a hang. (`release_sessions`, which `main` runs through
/// `telemetry::exit`, empties every model's slots the same way; it is process-wide, so this test
/// releases one model's.)
#[tokio::test]
async fn released_sessions_are_dropped_and_later_calls_fail() {
    let reranker = Reranker::load(&model(2, 0), &Settings::defaults().onnx).unwrap();
    let pairs = pairs("Who is Hugo?", 3);
    assert_eq!(reranker.score(pairs.clone()).await.unwrap().len(), 3);
    assert_eq!(reranker.model().release(), 2, "both sessions released");
    let error = reranker.score(pairs).await.unwrap_err().to_string();
    assert!(error.contains("released"), "{error}");
    assert_eq!(reranker.model().release(), 0, "nothing is left to release");
}

/// A process that used the CUDA provider exits with status 0, not the abort of a session torn down
/// after the CUDA driver ("CUDA failure 4: driver shutting down" in `cudaFreeHost`).
#[test]
fn a_process_that_used_cuda_exits_cleanly() {
    let gpu_here = lacuna::actors::clients::gpu::cuda_in_runtime() && std::path::Path::new("/dev/nvidia0").exists();
    if !gpu_here {
        println!("SKIPPED: no GPU or no CUDA build of ONNX Runtime here (LACUNA_ORT=gpu)");
        return;
    }
    let dataset = crate::support::data_dir().join("hotpotqa");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .args(["bench", "rerank", "--pairs", "64", "--dataset"])
        .arg(&dataset)
        .env("LACUNA__ONNX__EXECUTION_PROVIDER", "cuda")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(!stderr.contains("terminate called") && !stderr.contains("CUDA failure"), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("cuda"), "it ran on CUDA");
}

/// With the default settings a pair's score is its own: the same whatever else is scored with it or
/// at the same time, so an answer never depends on which events happened to share the re-ranker.
#[tokio::test]
async fn by_default_a_pairs_score_does_not_depend_on_what_else_is_scored() {
    let reranker = Reranker::load(&Settings::defaults().rerank, &Settings::defaults().onnx).unwrap();
    let crowd = pairs("Where is Seville?", 30);
    let alone = reranker.score(crowd[7..9].to_vec()).await.unwrap();
    let (together, _) = tokio::join!(reranker.score(crowd.clone()), reranker.score(pairs("Who is Hugo?", 20)));
    assert_close(&alone, &together.unwrap()[7..9]);
}

/// `rerank.cache`: a run that kept its scores reads them back to the bit in a later process, whatever
/// CPU it runs on, and a replay refuses a pair the recorded run never scored instead of scoring it.
#[tokio::test]
async fn kept_scores_read_back_to_the_bit_and_a_replay_refuses_a_pair_never_scored() {
    let dir = std::env::temp_dir().join(format!("lacuna-rerank-scores-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let with =
        |mode| ModelSettings { cache: ScoreCacheSettings { mode, dir: dir.clone() }, ..Settings::defaults().rerank };
    let onnx = Settings::defaults().onnx;
    let crowd = pairs("Which club does Hugo play for?", 12);
    let live = Reranker::load(&Settings::defaults().rerank, &onnx).unwrap().score(crowd.clone()).await.unwrap();
    let recorder = Reranker::load(&with(ScoreCacheMode::ReadWrite), &onnx).unwrap();
    assert_eq!(recorder.score(crowd[..8].to_vec()).await.unwrap(), live[..8], "stored as scored");
    // Half of these are stored, half scored now: each keeps its place.
    assert_eq!(recorder.score(crowd[4..].to_vec()).await.unwrap(), live[4..]);

    let replay = Reranker::load(&with(ScoreCacheMode::Replay), &onnx).unwrap();
    let reversed: Vec<_> = crowd.iter().rev().cloned().collect();
    let read: Vec<f32> = replay.score(reversed).await.unwrap().into_iter().rev().collect();
    assert_eq!(read, live, "every score read back, to the bit");
    let never = pairs("Who renovated the town hall?", 1);
    let refused = replay.score(never).await.unwrap_err();
    assert!(matches!(refused, ModelError::NotCached(_)), "{refused}");
    std::fs::remove_dir_all(dir).unwrap();
}
