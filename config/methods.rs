//! The methods' sections: MIGRES (`[migres]`, the paper's hyper-parameters), the baselines' reader,
//! QPaug, RA-ISF, RQ-RAG, and the join their fan-outs come back through.

use serde::{Deserialize, Serialize};

use super::LlmOverride;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MigresSettings {
    pub max_iterations: u32,
    pub retrieve_top_n: usize,
    pub top_k: usize,
    pub max_new_queries: usize,
    pub max_passage_uses: u32,
    pub rerank_threshold: f32,
    pub knowledge_prompting: bool,
    pub min_query_chars: usize,
    pub min_snippet_words: usize,
    pub max_snippet_words: usize,
    /// The sentence filter's own threshold: a passage that passed `rerank_threshold` keeps its
    /// sentences that score at least this.
    pub sentence_threshold: f32,
    /// What the main module is asked: to set an `answerable` flag, or to attempt an answer.
    pub decision_prompt: DecisionPrompt,
    /// Which decisions of the main module end the loop with an answer.
    pub acceptance: Acceptance,
    /// An accepted answer must be found among the verified facts' words (yes/no answers excepted),
    /// and those facts must cite at least `min_answer_passages` passages; otherwise the loop goes on.
    /// Facts from model knowledge do not count: a closed-book guess is not evidence.
    pub grounding_gate: bool,
    pub min_answer_passages: usize,
    /// Knowledge prompting starts at this iteration (the paper: 1, before any query was written).
    pub knowledge_from_iteration: u32,
    /// The main module reads the passages its facts cite, not the facts alone.
    pub main_sees_passages: bool,
    /// At the iteration limit, a non-answer ("None", "unknown") is asked again for a best guess.
    pub best_guess: bool,
    /// At the iteration limit, an answer that is still a non-answer (after the best guess) is read
    /// from the passages the re-ranker scored best for any query, whole, as VANILLA reads its top-k.
    pub reader_fallback: bool,
    /// At the iteration limit, the final answer reads the verified facts alone whenever there are
    /// any: a knowledge-prompted "fact" is a closed-book guess and must not outvote a passage.
    pub limit_reads_verified: bool,
    /// Self-consistency: the main module's decision is the vote of this many samples, each at
    /// `sample_temperature` with its own seed (1: one greedy call).
    pub decision_samples: u32,
    pub sample_temperature: f32,
    /// When the LLM writes no new query, the missing-information summary itself is searched before
    /// the question is declared exhausted.
    pub missing_as_query: bool,
    /// A question naming two options ("Which film came out first, A or B?") is answered with the
    /// option its copied dates or numbers choose, compared in code, not by the model.
    pub compare_options: bool,
    /// The `compare_options` call also reads the best-scored passages that no fact cites.
    pub compare_reads_found: bool,
    /// The answer becomes the whole name holding its words in the cited passages and facts.
    pub answer_span: bool,
    /// An iteration after the first that verifies no new fact answers now, as at the limit.
    pub stop_when_not_learning: bool,
    /// With `decision_prompt = "flag"`, the main module writes the next queries in its decision's
    /// reply, and query_gen asks the LLM only when none of them is new.
    pub queries_from_main: bool,
    /// query_gen drops a query that names a capitalised word of the prompts' worked examples which
    /// nothing the question knows holds (05037f1).
    pub drop_example_names: bool,
    /// The first iteration reads the question's best passages once, as VANILLA-s with
    /// `compare_options` does, and that answer ends the question unless a check of
    /// `read_first_goes_on_when` finds it unsupported; the loop's answer then replaces it only when
    /// the loop's evidence holds it and the first read's does not (`actors/shared/one_shot.rs`).
    pub read_first: bool,
    /// With `read_first`: the checks, none of them the model's judgement of itself, any of which sends
    /// the one-shot answer round the loop.
    pub read_first_goes_on_when: Vec<GoOnWhen>,
    /// With `read_first`, a two-option question ends with one of its options: when neither the
    /// first read's answer nor the loop's names one, `compare_options` compares them once more over
    /// both reads' evidence, and an answer naming one option wins over one naming neither. Off by
    /// default (issue 76).
    pub ends_with_an_option: bool,
    /// With `read_first`, when the loop ran after a first read: the answer is read once more, by
    /// the reader over the first read's passages and the loop's kept sentences (within
    /// 3,000 prompt tokens), with `compare_options`, instead of chosen between the two answers.
    /// One call more for each question sent on. Off by default (issue 76).
    pub final_read: bool,
    /// With `read_first`, the first read asks for its answer's token log-probabilities and the trace
    /// keeps them (`ReadFirst.answer_logprobs`), to measure them as a stop signal; the `unsure`
    /// check asks for them whatever this says.
    pub read_first_logprobs: bool,
    /// The `unsure` check: a first read whose answer's tokens average a log-probability below this
    /// goes round the loop.
    pub unsure_below: f64,
}

/// A check of the one-shot answer (`migres.read_first`) that sends the question round the loop.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GoOnWhen {
    /// No passage shown writes the answer's words in a row (a yes or no always passes).
    Ungrounded,
    /// The answer is not of the kind the question asks for: a year or date for "when", a number for
    /// "how many", yes or no for a question that starts with "is" or "did" and names no two options.
    WrongType,
    /// A two-option question ("A or B?") answered with neither option, or with words of both.
    NotAnOption,
    /// A yes-or-no question about two things ("Are A and B both ...?", "... the same country?"),
    /// whatever it was answered: no passage writes a yes or no, and one read seldom holds both
    /// hops. The loop's yes or no then replaces the first read's. Off by default (issue 76).
    YesNoOfTwo,
    /// A question that asks for a place ("Where was ...?", "the place of birth of ...", "in what
    /// city"), whatever it was answered: in multi-hop questions the place is usually that of
    /// something the question names only through a relation ("the father of ..."), which one read
    /// seldom reaches. The loop's answer then replaces the first read's where the loop's evidence
    /// writes it. Off by default (issue 76).
    AsksPlace,
    /// The same for a question that asks for a date or year ("When ...?", "what year", "date of
    /// birth"). Off by default (issue 76).
    AsksDate,
    /// The same for a question that asks for a number ("How many ...?", "what percentage", "the
    /// population"). Off by default (issue 76).
    AsksNumber,
    /// The first read's answer tokens average a log-probability below `migres.unsure_below`: the
    /// model was unsure of the words it answered. No call more (the read's own log-probabilities).
    /// Off by default (issue 76).
    Unsure,
    /// A question about two named things ("Which came first, A or B?", "Are A and B both ...?")
    /// whose read showed no passage titled with one of them, whatever it was answered: it compared
    /// two things having read about one. The question's retrieval also asks one query per thing,
    /// whose passages the loop starts from (the read sees only the question's own). The loop's
    /// answer then replaces the first read's where the loop's evidence writes it. Off by default
    /// (issue 76).
    OptionUnseen,
}

impl GoOnWhen {
    pub fn name(self) -> &'static str {
        match self {
            GoOnWhen::Ungrounded => "ungrounded",
            GoOnWhen::WrongType => "wrong_type",
            GoOnWhen::NotAnOption => "not_an_option",
            GoOnWhen::YesNoOfTwo => "yes_no_of_two",
            GoOnWhen::AsksPlace => "asks_place",
            GoOnWhen::AsksDate => "asks_date",
            GoOnWhen::AsksNumber => "asks_number",
            GoOnWhen::Unsure => "unsure",
            GoOnWhen::OptionUnseen => "option_unseen",
        }
    }
}

/// When the main module's decision ends the loop.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Acceptance {
    /// `answerable` is true and the answer is not "unanswerable".
    Flag,
    /// Also a confidence of at least 4 and no missing information (the MIGRES code's rule).
    Official,
    /// Also a confidence of at least 4; what the model adds as missing does not matter.
    Confident,
}

/// The main module's prompt.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DecisionPrompt {
    /// The paper's: explanation, missing information, an `answerable` flag, then the answer. A small
    /// model talks itself out of answering: asked to name what is missing first, it always finds
    /// something, even when a fact states the answer.
    Flag,
    /// An answer attempt: explanation, then the answer or "unanswerable", then what is missing. The
    /// answer, not a flag, says whether the question is answered.
    Attempt,
}

/// The baselines' (and QPaug's) single answer call.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReaderSettings {
    /// `migres.compare_options` for the reader: a two-option comparison is decided by the options'
    /// dates or numbers, copied from the shown passages by one more call and compared in code.
    pub compare_options: bool,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QpaugSettings {
    /// K: passages in the answer prompt, the self-generated one included (K-1 retrieved).
    pub top_k: usize,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RaisfSettings {
    /// Ask the self-knowledge module first (false: always retrieve, the paper's "w/o SKM" ablation).
    pub self_knowledge_check: bool,
    /// D_th: sub-questions nest at most this deep; a node at this depth answers from what it has.
    pub max_depth: u32,
    /// Passages retrieved and checked for relevance per (sub-)question.
    pub top_k: usize,
    /// Sub-questions kept from one decomposition.
    pub max_sub_questions: usize,
    pub self_knowledge: LlmOverride,
    pub relevance: LlmOverride,
    pub decompose: LlmOverride,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// The answer with the lowest perplexity.
    Perplexity,
    /// The answer with the highest mean token probability.
    Confidence,
    /// The answer whose trajectories' confidences sum highest (answers compared normalised).
    Ensemble,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RqragSettings {
    /// Refinement steps along a trajectory before it must answer.
    pub max_depth: u32,
    /// Refinements tried at each step: the first `width` of rewrite, decompose, disambiguate.
    pub width: usize,
    /// Passages shown per step.
    pub top_k: usize,
    pub selection: Selection,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JoinSettings {
    /// A parent whose children are not all back this long after it split goes on without them.
    pub deadline_ms: u64,
    /// How often the join looks for parents past their deadline.
    pub tick_ms: u64,
}
