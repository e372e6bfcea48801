//! What `lacuna eval` writes: one [`EvalRecord`] per question (records.jsonl) and one [`Report`]
//! (report.json, report.md) with the papers' columns: accuracy (EM, F1, lenient EM, cover EM, Acc†)
//! and efficiency (Tables 4 and 5: LLM calls, iterations, passages per iteration, knowledge tokens),
//! plus wall time and throughput. Errors count as wrong answers: N is every question asked.

use serde::{Deserialize, Serialize};

use super::dataset::EvalQuestion;
use super::gold::GoldReached;
use super::score::{Scores, passage_recall, score, score_yes_no};
use crate::topics::{AnswerRecord, VersionedAnswer};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EvalRecord {
    pub id: String,
    pub question: String,
    pub gold: Vec<String>,
    /// None when the question ended in an error record.
    pub prediction: Option<String>,
    pub error_type: Option<String>,
    pub scores: Scores,
    /// The best scores of any candidate answer (RQ-RAG's trajectories): the method's upper bound,
    /// "any trajectory right" (paper 004). None when the record has no candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_bound: Option<Scores>,
    /// Acc†: the judge's verdict (or EM for exact and yes/no answers); None when not judged.
    pub judged_correct: Option<bool>,
    pub iterations: u32,
    pub llm_calls: u32,
    pub passages_shown: u32,
    /// Retrieved text plus model-written knowledge shown to the LLM, in tokens (paper Table 5).
    pub knowledge_tokens: u64,
    pub prompt_tokens: u64,
    /// Of the prompt tokens, those the LLM server took from its prefix cache, where it says so.
    #[serde(default)]
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub cache_hits: u32,
    /// Share of the gold passages among those the answer cites.
    pub cited_gold_recall: Option<f64>,
    /// The dataset's gold passages for the question, so `--compare` can tell where each question
    /// lost them (retrieved, shown, cited) from records.jsonl alone. Empty in older records.
    #[serde(default)]
    pub gold_doc_ids: Vec<String>,
    /// The passages the answer cites (its facts' citations and its passages), sorted.
    #[serde(default)]
    pub cited_ids: Vec<String>,
    /// How far each gold passage got (retrieved, shown, cited), read off the trace when the run was
    /// scored. None only in records written before it was (they carry `record`, read once on load).
    #[serde(default)]
    pub gold_reached: Option<GoldReached>,
    /// The whole answer record, trace included, in records written before 2026-11-26: read to fill
    /// the two fields above, never written again. A run's `answers.jsonl` keeps whole records.
    #[serde(default, skip_serializing)]
    pub record: Option<Box<VersionedAnswer>>,
}

impl EvalRecord {
    /// EM is 0 or 1 per question; compared with 0.5 rather than equality to 1.0 out of caution.
    pub fn is_right(&self) -> bool {
        self.scores.em >= 0.5
    }
}

impl EvalRecord {
    pub fn new(question: &EvalQuestion, record: AnswerRecord) -> Self {
        let mut out = EvalRecord {
            id: question.id.clone(),
            question: question.question.clone(),
            gold: question.answers.clone(),
            prediction: None,
            error_type: None,
            scores: Scores::default(),
            upper_bound: None,
            judged_correct: None,
            iterations: 0,
            llm_calls: 0,
            passages_shown: 0,
            knowledge_tokens: 0,
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            cache_hits: 0,
            cited_gold_recall: None,
            gold_doc_ids: question.gold_doc_ids.clone(),
            cited_ids: Vec::new(),
            gold_reached: None,
            record: None,
        };
        out.fill_reached(&record);
        match record {
            AnswerRecord::Answered(a) => {
                let score_one = |answer: &str| match question.gold_bool() {
                    Some(gold) => score_yes_no(answer, gold),
                    None => score(answer, &question.answers),
                };
                out.scores = score_one(&a.answer);
                out.upper_bound = a.candidates.iter().map(|c| score_one(&c.answer)).reduce(|best, s| Scores {
                    em: best.em.max(s.em),
                    f1: best.f1.max(s.f1),
                    lenient_em: best.lenient_em.max(s.lenient_em),
                    cover_em: best.cover_em.max(s.cover_em),
                });
                let u = &a.usage;
                out.iterations = a.iterations;
                out.llm_calls = u.llm_calls;
                out.passages_shown = u.passages_shown;
                out.knowledge_tokens = u.evidence_tokens + u.knowledge_tokens;
                out.prompt_tokens = u.prompt_tokens;
                out.cached_tokens = u.cached_tokens;
                out.completion_tokens = u.completion_tokens;
                out.cache_hits = u.cache_hits;
                let cited: Vec<String> = a.passages.iter().map(|p| p.id.clone()).collect();
                out.cited_gold_recall = passage_recall(&cited, &question.gold_doc_ids);
                out.prediction = Some(a.answer);
            }
            AnswerRecord::Error(e) => out.error_type = Some(e.error_type),
        }
        out
    }

    fn fill_reached(&mut self, record: &AnswerRecord) {
        let (cited, reached) = GoldReached::of(record, &self.gold_doc_ids);
        self.cited_ids = cited;
        self.gold_reached = Some(reached);
    }

    /// An eval record as a comparison reads it: one written with its whole answer record (before
    /// 2026-11-26) gets its cited ids and gold passages read off that record, which is then dropped.
    pub fn slimmed(mut self) -> Self {
        if let Some(record) = self.record.take()
            && self.gold_reached.is_none()
        {
            self.fill_reached(&record.record);
        }
        self
    }
}

/// Means over every question of a run. Optional columns are None when nothing measured them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub dataset: String,
    /// The half of the dataset the run covers (`--half`), when not all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half: Option<super::split::Half>,
    pub pipeline: String,
    /// The model the endpoint reports serving (or llm.model).
    pub model: String,
    pub date: String,
    pub questions: usize,
    pub answered: usize,
    pub errors: usize,
    pub em: f64,
    pub f1: f64,
    pub lenient_em: f64,
    pub cover_em: f64,
    /// Acc†, when `--judge` was given.
    pub acc_judged: Option<f64>,
    /// EM and lenient EM had the best candidate been chosen (RQ-RAG: any trajectory right), when
    /// the pipeline reports candidates; errors count as wrong.
    #[serde(default)]
    pub upper_bound_em: Option<f64>,
    #[serde(default)]
    pub upper_bound_lenient_em: Option<f64>,
    pub llm_calls: f64,
    pub iterations: f64,
    pub passages_per_iteration: f64,
    pub knowledge_tokens: f64,
    pub prompt_tokens: f64,
    /// Of the prompt tokens, the share the LLM server took from its prefix cache (0 where it does not
    /// report it).
    #[serde(default)]
    pub cached_share: f64,
    pub completion_tokens: f64,
    pub cited_gold_recall: Option<f64>,
    pub cache_hits: u64,
    pub wall_seconds: f64,
    pub questions_per_minute: f64,
    /// Questions answered by an earlier, interrupted part of the run (`--resume`); the wall time and
    /// rate are the last part's alone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumed: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

impl Report {
    pub fn from_records(records: &[EvalRecord], wall_seconds: f64) -> Report {
        let n = records.len().max(1) as f64;
        let all = |f: fn(&EvalRecord) -> f64| records.iter().map(f).sum::<f64>() / n;
        let answered: Vec<&EvalRecord> = records.iter().filter(|r| r.prediction.is_some()).collect();
        // Efficiency is a property of the questions that ran to an answer.
        let of_answered = |f: fn(&EvalRecord) -> f64| mean(answered.iter().map(|r| f(r))).unwrap_or(0.0);
        let judged = records.iter().all(|r| r.judged_correct.is_some() || r.prediction.is_none());
        let any_judged = records.iter().any(|r| r.judged_correct.is_some());
        Report {
            questions: records.len(),
            answered: answered.len(),
            errors: records.len() - answered.len(),
            em: all(|r| r.scores.em),
            f1: all(|r| r.scores.f1),
            lenient_em: all(|r| r.scores.lenient_em),
            cover_em: all(|r| r.scores.cover_em),
            upper_bound_em: records
                .iter()
                .any(|r| r.upper_bound.is_some())
                .then(|| all(|r| r.upper_bound.as_ref().map_or(0.0, |s| s.em))),
            upper_bound_lenient_em: records
                .iter()
                .any(|r| r.upper_bound.is_some())
                .then(|| all(|r| r.upper_bound.as_ref().map_or(0.0, |s| s.lenient_em))),
            acc_judged: (judged && any_judged).then(|| all(|r| f64::from(u8::from(r.judged_correct.unwrap_or(false))))),
            llm_calls: of_answered(|r| f64::from(r.llm_calls)),
            iterations: of_answered(|r| f64::from(r.iterations)),
            passages_per_iteration: of_answered(|r| f64::from(r.passages_shown) / f64::from(r.iterations.max(1))),
            knowledge_tokens: of_answered(|r| r.knowledge_tokens as f64),
            prompt_tokens: of_answered(|r| r.prompt_tokens as f64),
            completion_tokens: of_answered(|r| r.completion_tokens as f64),
            cached_share: {
                let (cached, prompt) =
                    answered.iter().fold((0, 0), |(c, p), r| (c + r.cached_tokens, p + r.prompt_tokens));
                if prompt > 0 { cached as f64 / prompt as f64 } else { 0.0 }
            },
            cited_gold_recall: mean(answered.iter().filter_map(|r| r.cited_gold_recall)),
            cache_hits: records.iter().map(|r| u64::from(r.cache_hits)).sum(),
            wall_seconds,
            questions_per_minute: if wall_seconds > 0.0 { records.len() as f64 * 60.0 / wall_seconds } else { 0.0 },
            ..Report::default()
        }
    }

    /// The report as a person reads it.
    pub fn markdown(&self) -> String {
        let pct = |v: f64| format!("{:.1}", 100.0 * v);
        let opt = |v: Option<f64>| v.map(pct).unwrap_or_else(|| "-".into());
        let mut out = format!(
            "# {} on {}\n\nModel `{}`, {} questions ({} answered, {} errors), {}.\n\n",
            self.pipeline, self.dataset, self.model, self.questions, self.answered, self.errors, self.date
        );
        out.push_str("| EM | F1 | lenient EM | cover EM | Acc† | LLM calls | iterations | passages/iter | knowledge tokens | cited gold recall |\n");
        out.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.0} | {} |\n\n",
            pct(self.em),
            pct(self.f1),
            pct(self.lenient_em),
            pct(self.cover_em),
            opt(self.acc_judged),
            self.llm_calls,
            self.iterations,
            self.passages_per_iteration,
            self.knowledge_tokens,
            opt(self.cited_gold_recall),
        ));
        if let (Some(em), Some(lenient)) = (self.upper_bound_em, self.upper_bound_lenient_em) {
            out.push_str(&format!(
                "Upper bound (the best of the candidate answers, e.g. any RQ-RAG trajectory): EM {}, lenient EM {}.\n\n",
                pct(em),
                pct(lenient)
            ));
        }
        out.push_str(&format!(
            "Wall time {:.0} s, {:.2} questions/minute; {:.0} prompt ({:.0}% from the server's prefix cache) + {:.0} completion tokens per question; {} LLM cache hits.\n",
            self.wall_seconds,
            self.questions_per_minute,
            self.prompt_tokens,
            100.0 * self.cached_share,
            self.completion_tokens,
            self.cache_hits
        ));
        if self.resumed > 0 {
            out.push_str(&format!(
                "Resumed: {} questions were answered before an interruption; the wall time is the last part's.\n",
                self.resumed
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topics::{Answered, ErrorRecord, Memory, Outcome};

    fn question(answer: &str) -> EvalQuestion {
        EvalQuestion {
            id: "q".into(),
            question: "Who?".into(),
            answers: vec![answer.into()],
            answer_bool: None,
            kind: None,
            gold_doc_ids: vec!["p1".into(), "p2".into()],
        }
    }

    #[test]
    fn errors_count_as_wrong_and_efficiency_comes_from_answers() {
        let mut memory = Memory::new("q", "Who?");
        memory.usage.llm_calls = 4;
        memory.usage.passages_shown = 6;
        memory.iteration = 2;
        let answered = Answered::from_memory(memory, "Ed Solomon".into(), 5.0, String::new(), Outcome::Answered);
        let right = EvalRecord::new(&question("Ed Solomon"), AnswerRecord::Answered(Box::new(answered)));
        let error = ErrorRecord {
            question_id: "q2".into(),
            question: "Who?".into(),
            stage: "leaf".into(),
            error_type: "llm_timeout".into(),
            message: "timed out".into(),
            trace: Vec::new(),
            provenance: None,
        };
        let wrong = EvalRecord::new(&question("x"), AnswerRecord::Error(error));
        let report = Report::from_records(&[right, wrong], 60.0);
        assert_eq!((report.questions, report.answered, report.errors), (2, 1, 1));
        assert_eq!(report.em, 0.5);
        assert_eq!(report.llm_calls, 4.0);
        assert_eq!(report.passages_per_iteration, 3.0);
        assert_eq!(report.questions_per_minute, 2.0);
        assert_eq!(report.acc_judged, None, "nothing was judged");
    }

    #[test]
    fn the_upper_bound_counts_a_question_right_when_any_candidate_is() {
        let candidate = |answer: &str| crate::topics::Candidate {
            answer: answer.into(),
            confidence: 0.5,
            explanation: String::new(),
            node: crate::topics::NodeRef::root("q"),
            queries: vec![],
            logprobs: None,
            trajectory_logprobs: None,
            citations: vec![],
        };
        let mut answered =
            Answered::from_memory(Memory::new("q", "Who?"), "Spain".into(), 0.5, String::new(), Outcome::Answered);
        answered.candidates = vec![candidate("Spain"), candidate("Murcia")];
        let record = EvalRecord::new(&question("Murcia"), AnswerRecord::Answered(Box::new(answered)));
        let report = Report::from_records(&[record], 1.0);
        assert_eq!(report.em, 0.0, "the chosen answer is wrong");
        assert_eq!(report.upper_bound_em, Some(1.0), "one trajectory was right");
        assert!(report.markdown().contains("Upper bound"));
    }

    #[test]
    fn the_prefix_cached_share_is_of_all_prompt_tokens_not_a_mean_of_shares() {
        let record = |prompt: u64, cached: u64| {
            let mut memory = Memory::new("q", "Who?");
            (memory.usage.prompt_tokens, memory.usage.cached_tokens) = (prompt, cached);
            let answered = Answered::from_memory(memory, "Ed Solomon".into(), 5.0, String::new(), Outcome::Answered);
            EvalRecord::new(&question("Ed Solomon"), AnswerRecord::Answered(Box::new(answered)))
        };
        let report = Report::from_records(&[record(1000, 900), record(3000, 700)], 60.0);
        assert_eq!(report.cached_share, 0.4);
        assert!(
            report.markdown().contains("2000 prompt (40% from the server's prefix cache)"),
            "{}",
            report.markdown()
        );
    }
}
