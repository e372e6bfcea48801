//! The ONNX models: the re-ranker (`[rerank]`), the NLI check (`[nli]`) and where they run (`[onnx]`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    pub model_dir: PathBuf,
    pub batch_size: usize,
    pub max_length: usize,
    /// Sessions scoring at once, each on its own worker thread; 0: one per CPU of the quota.
    pub sessions: usize,
    /// Intra-op threads per session; 0: the CPU quota shared out among the sessions.
    pub threads: usize,
    /// How long a worker waits for more calls to fill a round; 0: one call per round.
    pub coalesce_ms: u64,
    /// The most pairs a round gathers.
    pub coalesce_max_pairs: usize,
    /// Which of the model's graphs the sessions load.
    #[serde(default)]
    pub graph: Graph,
    /// What replaces `batch_size`, `sessions`, `threads` and `coalesce_ms` when the sessions run on
    /// CUDA: a GPU wants few sessions and large batches, CPUs the opposite.
    #[serde(default)]
    pub cuda: Option<Parallelism>,
    /// Scores kept on disk and read back (the re-ranker's only; `clients/score_cache.rs`). Not part
    /// of a run's settings: a replayed score is the score that was computed.
    #[serde(default, skip_serializing)]
    pub cache: ScoreCacheSettings,
}

/// Where the re-ranker's scores are kept, and whether a pair the cache lacks may be scored.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ScoreCacheSettings {
    pub mode: ScoreCacheMode,
    /// Empty: $LACUNA_RERANK_CACHE_DIR, else <cache>/rerank-scores.
    #[serde(default)]
    pub dir: PathBuf,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ScoreCacheMode {
    /// Every pair is scored by the model.
    #[default]
    Off,
    /// A pair the cache holds gets its stored score; any other is scored and stored.
    ReadWrite,
    /// A pair the cache lacks is an error (`rerank_cache_miss`), never scored: proves a run reads
    /// the scores a recorded run computed, on any CPU.
    Replay,
}

/// How a model's pairs are spread over sessions and batches on one execution provider.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Parallelism {
    pub batch_size: usize,
    pub sessions: usize,
    pub threads: usize,
    pub coalesce_ms: u64,
}

/// The graph a model's sessions load from its folder.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Graph {
    /// The float graph on CUDA when setup derived one, the installed graph otherwise.
    #[default]
    Auto,
    /// `model.onnx` as installed (the re-ranker's is quantised to int8 for CPUs).
    Installed,
    /// `model.float.onnx`, derived from the installed graph at setup (`scripts/float-graph.py`): the
    /// CUDA provider has no kernels for the int8 graph's quantised operators.
    Float,
}

/// The installed graph's file name, and the float graph's.
pub const INSTALLED_GRAPH: &str = "model.onnx";
pub const FLOAT_GRAPH: &str = "model.float.onnx";

impl ModelSettings {
    /// The settings a model runs with on `provider`: the `cuda` table's values on CUDA.
    pub fn on(&self, provider: ExecutionProvider) -> ModelSettings {
        match (provider, self.cuda) {
            (ExecutionProvider::Cuda, Some(p)) => ModelSettings {
                batch_size: p.batch_size,
                sessions: p.sessions,
                threads: p.threads,
                coalesce_ms: p.coalesce_ms,
                ..self.clone()
            },
            _ => self.clone(),
        }
    }

    /// The file of `graph` itself, wherever the sessions run.
    pub fn graph_path_of(&self, graph: Graph) -> PathBuf {
        self.model_dir.join(if graph == Graph::Float { FLOAT_GRAPH } else { INSTALLED_GRAPH })
    }

    /// The graph file the sessions load on `provider`. `auto` takes the float graph on CUDA only
    /// when it exists; `float` insists on it.
    pub fn graph_path(&self, provider: ExecutionProvider) -> PathBuf {
        let float = self.graph_path_of(Graph::Float);
        match self.graph {
            Graph::Float => float,
            Graph::Auto if provider == ExecutionProvider::Cuda && float.exists() => float,
            Graph::Auto | Graph::Installed => self.graph_path_of(Graph::Installed),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NliBackend {
    Llm,
    Onnx,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NliSettings {
    pub backend: NliBackend,
    /// The LLM judge's prompt: `strict` (every part of a fact must be in the passage) or `lenient`
    /// (the fact's new information must be; words that name its subject as the question did need not).
    pub entailment_prompt: EntailmentPrompt,
    pub entailment_label: usize,
    /// A fact none of its citations entails is checked against up to this many passages the leaf
    /// was shown but did not cite, and kept citing the one that entails it (0: the paper's check).
    pub recite_uncited: usize,
    /// How the LLM judge is asked: one call per (fact, passage), or one call per leaf call that
    /// judges all its facts and quotes the words that state each (checked in code).
    pub calls: NliCalls,
    /// With `per_leaf`: what makes a judge's quote one of the passage's.
    pub quote_match: QuoteMatch,
    /// With `per_leaf`: which facts are kept without asking the judge.
    pub unjudged: Unjudged,
    pub model: ModelSettings,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NliCalls {
    /// The paper's check: one verdict call per fact and passage tried.
    PerFact,
    /// One call per leaf call. A fact its passage holds word for word needs no call; any other is
    /// entailed only when the judge quotes words of a passage it may rest on, the quote is in that
    /// passage and so are the fact's numbers.
    PerLeaf,
}

/// When a per-leaf judge's quote counts as the passage's.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum QuoteMatch {
    /// Its words, normalised, are a run of the passage's.
    #[default]
    Words,
    /// That, or every name and number in it (a word with a capital letter or a digit) is a word of
    /// the passage: a small judge often rewrites what it quotes ("died on 29 May 1899" for "– May
    /// 29, 1899)").
    NamesAndNumbers,
}

/// Which facts a per-leaf check keeps without a call to the judge.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Unjudged {
    /// A fact a passage it may rest on holds word for word.
    #[default]
    Verbatim,
    /// That, or a fact each of whose names and numbers (words with a capital letter or a digit) is a
    /// word of such a passage. The small judge accepts nearly every fact it can quote words for, so
    /// its call mostly re-checks what this rule checks; what it still catches, such as a relation
    /// the passage does not state between names it does, is what this lever gives up.
    NamesAndNumbers,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EntailmentPrompt {
    Strict,
    Lenient,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OnnxSettings {
    pub library_path: PathBuf,
    pub execution_provider: ExecutionProvider,
}

/// Where ONNX models run.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionProvider {
    Cpu,
    /// CUDA, falling back to the CPU with a warning when the runtime or the GPU is missing.
    Cuda,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    #[test]
    fn cuda_gets_its_own_batches_and_the_float_graph_when_there_is_one() {
        let dir = std::env::temp_dir().join(format!("lacuna-graph-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = ModelSettings { model_dir: dir.clone(), ..Settings::defaults().rerank };
        let (cpu, cuda) = (model.on(ExecutionProvider::Cpu), model.on(ExecutionProvider::Cuda));
        assert_eq!((cpu.batch_size, cpu.coalesce_ms), (1, 0), "the CPU keeps the default's pairs scored alone");
        assert!(cuda.batch_size > 1 && cuda.coalesce_ms > 0 && cuda.sessions > 0, "{cuda:?}");
        // Before setup derived the float graph, `auto` loads the installed one everywhere.
        assert_eq!(model.graph_path(ExecutionProvider::Cuda), dir.join(INSTALLED_GRAPH));
        std::fs::write(dir.join(FLOAT_GRAPH), b"").unwrap();
        assert_eq!(model.graph_path(ExecutionProvider::Cuda), dir.join(FLOAT_GRAPH));
        assert_eq!(model.graph_path(ExecutionProvider::Cpu), dir.join(INSTALLED_GRAPH), "the CPU keeps int8");
        let installed = ModelSettings { graph: Graph::Installed, ..model };
        assert_eq!(installed.graph_path(ExecutionProvider::Cuda), dir.join(INSTALLED_GRAPH));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
