//! Paired comparison of eval runs, for `lacuna eval --compare`: two pipelines answered the same
//! questions, so the honest question is how often one was right where the other was wrong, and
//! whether the EM difference would survive another draw of questions. Means side by side (the
//! `compare` table) cannot say that; a paired bootstrap over the questions can.
//!
//! - Per pair of runs over the same dataset: wins, losses, ties, the EM difference A − B in points,
//!   and its 95% bootstrap interval, on the questions both runs have (matched by id).
//! - Per pair of pipelines (the report's `pipeline` label): the same over every dataset both ran,
//!   questions keyed by (dataset, id) since ids repeat across datasets.
//! - Per run: where the gold passages got lost on the way to the answer (retrieved, shown to an LLM,
//!   cited by the answer), next to EM on the same questions.
//!
//! Everything is deterministic: questions are visited in key order and the bootstrap draws from a
//! fixed-seed PRNG of its own, so a rerun of `--compare` writes the same intervals.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::funnel::Funnel;
use super::report::{EvalRecord, Report};

/// Bootstrap resamples per interval.
pub const RESAMPLES: usize = 10_000;
/// The bootstrap's seed. Each interval starts from it afresh, so a pair's interval does not depend
/// on which other runs were compared alongside it.
pub const SEED: u64 = 0x1ACC_0A5E_ED00_0001;
/// Two-sided coverage of the percentile interval.
pub const CONFIDENCE: f64 = 0.95;

/// splitmix64 (Steele, Lea & Flood 2014): a few lines, good enough statistically for resampling,
/// and no crate, so the intervals cannot change under a dependency upgrade.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` by multiply-shift (Lemire): no modulo, bias below n / 2^64.
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// A paired EM comparison of A and B on the same questions. Ties are split into both right and
/// both wrong; `ties` is their sum.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PairedEm {
    pub n: usize,
    /// A right, B wrong.
    pub wins: usize,
    /// A wrong, B right.
    pub losses: usize,
    pub both_right: usize,
    pub both_wrong: usize,
    pub ties: usize,
    /// EM of A and of B on these questions, in points.
    pub em_a: f64,
    pub em_b: f64,
    /// EM(A) − EM(B) in points: (wins − losses) / n × 100.
    pub diff: f64,
    /// The 95% percentile-bootstrap interval of `diff`, in points.
    pub ci_low: f64,
    pub ci_high: f64,
}

/// Wins, losses, ties, the EM difference and its bootstrap interval over `pairs` of (A right,
/// B right), one per question in a fixed order. None without questions.
pub fn paired_em(pairs: &[(bool, bool)]) -> Option<PairedEm> {
    if pairs.is_empty() {
        return None;
    }
    let count = |f: fn(&(bool, bool)) -> bool| pairs.iter().filter(|p| f(p)).count();
    let (wins, losses) = (count(|&(a, b)| a && !b), count(|&(a, b)| !a && b));
    let (both_right, both_wrong) = (count(|&(a, b)| a && b), count(|&(a, b)| !a && !b));
    let n = pairs.len();
    let points = |k: usize| 100.0 * k as f64 / n as f64;
    let diffs: Vec<i8> = pairs.iter().map(|&(a, b)| i8::from(a) - i8::from(b)).collect();
    let (ci_low, ci_high) = bootstrap_interval(&diffs, RESAMPLES, SEED);
    Some(PairedEm {
        n,
        wins,
        losses,
        both_right,
        both_wrong,
        ties: both_right + both_wrong,
        em_a: points(wins + both_right),
        em_b: points(losses + both_right),
        diff: 100.0 * (wins as f64 - losses as f64) / n as f64,
        ci_low,
        ci_high,
    })
}

/// The percentile bootstrap interval (in points) of the mean of per-question differences
/// (+1 win, −1 loss, 0 tie): each resample draws n questions with replacement, keeping each
/// question's A and B outcome together (that is what makes it paired). The bounds are the resampled
/// means at sorted ranks ⌊0.025·R⌋ and ⌈0.975·R⌉ − 1 (from 0). Sums stay integers until the end,
/// so the interval has no float noise: identical runs give exactly [0, 0].
pub fn bootstrap_interval(diffs: &[i8], resamples: usize, seed: u64) -> (f64, f64) {
    let n = diffs.len();
    if n == 0 || resamples == 0 {
        return (0.0, 0.0);
    }
    let mut rng = SplitMix64::new(seed);
    let mut sums: Vec<i64> = (0..resamples).map(|_| (0..n).map(|_| i64::from(diffs[rng.below(n)])).sum()).collect();
    sums.sort_unstable();
    let tail = (1.0 - CONFIDENCE) / 2.0;
    let low = ((tail * resamples as f64).floor() as usize).min(resamples - 1);
    let high = (((1.0 - tail) * resamples as f64).ceil() as usize).saturating_sub(1).min(resamples - 1);
    let points = |sum: i64| 100.0 * sum as f64 / n as f64;
    (points(sums[low]), points(sums[high]))
}

/// A question across datasets: ids repeat between datasets, so pooling keys by both.
pub type Key = (String, String);

/// (A right, B right) for every key both have, in key order (so resampling is reproducible
/// whatever order records.jsonl was written in).
pub fn aligned(a: &BTreeMap<Key, bool>, b: &BTreeMap<Key, bool>) -> Vec<(bool, bool)> {
    a.iter().filter_map(|(key, &right_a)| b.get(key).map(|&right_b| (right_a, right_b))).collect()
}

/// One run as the paired comparison needs it: its EM outcome per question and its gold-passage
/// funnel, read once from records.jsonl so the (large) records need not be kept.
#[derive(Clone, Debug)]
pub struct Run {
    /// The pipeline label, made unique per dataset (`label#2` for a second run of the same label on
    /// the same dataset).
    pub name: String,
    pub dataset: String,
    /// EM right (true) or wrong, by question key.
    pub right: BTreeMap<Key, bool>,
    pub funnel: Funnel,
}

impl Run {
    pub fn new(report: &Report, records: &[EvalRecord]) -> Run {
        let key = |r: &EvalRecord| (report.dataset.clone(), r.id.clone());
        Run {
            name: report.pipeline.clone(),
            dataset: report.dataset.clone(),
            right: records.iter().map(|r| (key(r), r.is_right())).collect(),
            funnel: Funnel::of(&report.pipeline, &report.dataset, records),
        }
    }
}

/// One dataset's row of a pipeline pair.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DatasetRow {
    pub dataset: String,
    #[serde(flatten)]
    pub em: PairedEm,
}

/// Two pipelines (A listed before B on the command line): a row per dataset both ran, and all
/// those questions pooled.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PipelinePair {
    pub a: String,
    pub b: String,
    pub per_dataset: Vec<DatasetRow>,
    pub pooled: PairedEm,
}

/// How the numbers were made, written beside them in comparison.json.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Method {
    pub metric: &'static str,
    pub resamples: usize,
    pub seed: u64,
    pub confidence: f64,
    pub interval: &'static str,
    pub ties: &'static str,
}

/// Everything `--compare` adds to the means table (comparison.json is this, serialised).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub method: Method,
    pub pairs: Vec<PipelinePair>,
    pub errors: Vec<Funnel>,
    /// What was left out and why (runs without records, pairs without shared questions).
    pub notes: Vec<String>,
}

impl Comparison {
    /// Compares every pair of runs, in the order given: pipelines in order of first appearance,
    /// and A is always the one that appeared first.
    pub fn new(mut runs: Vec<Run>, mut notes: Vec<String>) -> Comparison {
        name_uniquely(&mut runs);
        let names = ordered(runs.iter().map(|r| r.name.as_str()));
        let mut pairs = Vec::new();
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                match pipeline_pair(&runs, a, b) {
                    Some(pair) => pairs.push(pair),
                    None if shares_a_dataset(&runs, a, b) => {
                        notes.push(format!("{a} vs {b}: no question id in common, not compared"));
                    }
                    None => {}
                }
            }
        }
        let errors = runs.iter().map(|r| Funnel { run: r.name.clone(), ..r.funnel.clone() }).collect();
        Comparison { method: method(), pairs, errors, notes }
    }

    /// The paired table and the gold-passage table, as Markdown sections.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        out.push_str(&self.paired_markdown());
        out.push_str(&self.errors_markdown());
        for note in &self.notes {
            let _ = writeln!(out, "Note: {note}.");
        }
        out
    }

    fn paired_markdown(&self) -> String {
        let mut out = String::from("\n## Paired (EM)\n\n");
        if self.pairs.is_empty() {
            out.push_str("No two runs share questions.\n\n");
            return out;
        }
        out.push_str("| A vs B | dataset | n | wins | losses | ties (both right / both wrong) | ΔEM | 95% CI |\n");
        out.push_str("|---|---|---|---|---|---|---|---|\n");
        for pair in &self.pairs {
            let name = format!("{} vs {}", pair.a, pair.b);
            for row in &pair.per_dataset {
                out.push_str(&paired_row(&name, &row.dataset, &row.em));
            }
            let datasets = pair.per_dataset.len();
            let pooled = format!("**pooled** ({datasets} dataset{})", if datasets == 1 { "" } else { "s" });
            out.push_str(&paired_row(&name, &pooled, &pair.pooled));
        }
        let _ = writeln!(
            out,
            "\nOn the questions both runs have (matched by id; pooled rows by dataset and id). Wins: A right \
             and B wrong by EM; losses: the reverse; ties: both right plus both wrong. ΔEM = EM(A) − EM(B) \
             in points; 95% CI: paired bootstrap over questions, {RESAMPLES} resamples, seed {SEED:#x}, \
             percentile interval.\n"
        );
        out
    }

    fn errors_markdown(&self) -> String {
        let mut out = String::from("## Gold passages per run\n\n");
        if self.errors.iter().all(|f| f.with_gold == 0) {
            out.push_str(
                "No question has gold passage ids in records.jsonl (the dataset has none, or the runs predate \
                 `gold_doc_ids` in the records).\n\n",
            );
            return out;
        }
        out.push_str("| run | dataset | n | retrieved all gold | shown all gold | cited all gold | EM | retrieved any | shown any | cited any | trimmed traces |\n");
        out.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
        for f in self.errors.iter().filter(|f| f.with_gold > 0) {
            let pct = |k: usize| format!("{:.1}", 100.0 * k as f64 / f.with_gold as f64);
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                f.run,
                f.dataset,
                f.with_gold,
                pct(f.retrieved_all),
                pct(f.shown_all),
                pct(f.cited_all),
                pct(f.right),
                pct(f.retrieved_any),
                pct(f.shown_any),
                pct(f.cited_any),
                f.trimmed
            );
        }
        out.push_str(
            "\nIn % of the questions with gold passage ids (n). Retrieved: a search returned it; shown: it reached \
             an LLM's prompt (for MIGRES an upper bound: the trace lists the passages over the re-ranker threshold, \
             of which the best top_k are shown); cited: the answer's facts cite it (the baselines cite every passage \
             they were shown). EM on the same questions. Trimmed traces lost steps, so their counts are lower bounds.\n\n",
        );
        out
    }
}

fn method() -> Method {
    Method {
        metric: "em",
        resamples: RESAMPLES,
        seed: SEED,
        confidence: CONFIDENCE,
        interval: "percentile bootstrap, questions resampled with replacement, A and B outcomes kept together",
        ties: "both_right + both_wrong",
    }
}

fn paired_row(name: &str, dataset: &str, em: &PairedEm) -> String {
    format!(
        "| {name} | {dataset} | {} | {} | {} | {} ({} / {}) | {:+.1} | [{:+.1}, {:+.1}] |\n",
        em.n, em.wins, em.losses, em.ties, em.both_right, em.both_wrong, em.diff, em.ci_low, em.ci_high
    )
}

/// A second run of a label on the same dataset becomes `label#2` (and so on): a pair of runs and
/// a pooled series then never mix two runs of one dataset.
fn name_uniquely(runs: &mut [Run]) {
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    for run in runs.iter_mut() {
        let count = seen.entry((run.name.clone(), run.dataset.clone())).or_default();
        *count += 1;
        if *count > 1 {
            run.name = format!("{}#{count}", run.name);
        }
    }
}

fn shares_a_dataset(runs: &[Run], a: &str, b: &str) -> bool {
    runs.iter().any(|ra| ra.name == a && runs.iter().any(|rb| rb.name == b && rb.dataset == ra.dataset))
}

/// A's and B's runs per shared dataset, in A's order, and the pooled comparison. None when they
/// have no question in common.
fn pipeline_pair(runs: &[Run], a: &str, b: &str) -> Option<PipelinePair> {
    let mut per_dataset = Vec::new();
    let (mut pooled_a, mut pooled_b) = (BTreeMap::new(), BTreeMap::new());
    for run_a in runs.iter().filter(|r| r.name == a) {
        let Some(run_b) = runs.iter().find(|r| r.name == b && r.dataset == run_a.dataset) else { continue };
        if let Some(em) = paired_em(&aligned(&run_a.right, &run_b.right)) {
            per_dataset.push(DatasetRow { dataset: run_a.dataset.clone(), em });
        }
        pooled_a.extend(run_a.right.iter().map(|(k, v)| (k.clone(), *v)));
        pooled_b.extend(run_b.right.iter().map(|(k, v)| (k.clone(), *v)));
    }
    let pooled = paired_em(&aligned(&pooled_a, &pooled_b))?;
    Some(PipelinePair { a: a.to_string(), b: b.to_string(), per_dataset, pooled })
}

/// The values in order of first appearance, each once.
pub(super) fn ordered<'a>(values: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for v in values {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run from (id, right) pairs.
    fn run(name: &str, dataset: &str, outcomes: &[(&str, bool)]) -> Run {
        Run {
            name: name.into(),
            dataset: dataset.into(),
            right: outcomes.iter().map(|(id, r)| ((dataset.to_string(), id.to_string()), *r)).collect(),
            funnel: Funnel::default(),
        }
    }

    fn pairs(a: &[bool], b: &[bool]) -> Vec<(bool, bool)> {
        a.iter().copied().zip(b.iter().copied()).collect()
    }

    #[test]
    fn wins_losses_and_ties_are_counted_per_question() {
        let a = [true, true, true, false, false, true];
        let b = [false, true, false, true, false, true];
        let em = paired_em(&pairs(&a, &b)).unwrap();
        assert_eq!((em.n, em.wins, em.losses, em.both_right, em.both_wrong, em.ties), (6, 2, 1, 2, 1, 3));
        assert!((em.diff - 100.0 / 6.0).abs() < 1e-9, "{}", em.diff);
        assert!((em.em_a - em.em_b - em.diff).abs() < 1e-9);
    }

    #[test]
    fn the_interval_holds_the_difference_and_is_the_same_every_time() {
        // 40 questions: A wins 10, loses 4, ties 26.
        let a: Vec<bool> = (0..40).map(|i| i < 10 || (14..30).contains(&i)).collect();
        let b: Vec<bool> = (0..40).map(|i| (10..14).contains(&i) || (14..30).contains(&i)).collect();
        let first = paired_em(&pairs(&a, &b)).unwrap();
        assert_eq!((first.wins, first.losses), (10, 4));
        assert!(first.ci_low <= first.diff && first.diff <= first.ci_high, "{first:?}");
        assert!(first.ci_low < first.ci_high, "a real spread: {first:?}");
        assert_eq!(paired_em(&pairs(&a, &b)).unwrap(), first, "fixed seed: same interval");
        let diffs: Vec<i8> = pairs(&a, &b).iter().map(|&(x, y)| i8::from(x) - i8::from(y)).collect();
        assert_eq!(bootstrap_interval(&diffs, RESAMPLES, SEED), (first.ci_low, first.ci_high));
    }

    #[test]
    fn identical_runs_differ_by_exactly_nothing() {
        let a = [true, false, true, true, false];
        let em = paired_em(&pairs(&a, &a)).unwrap();
        assert_eq!((em.wins, em.losses, em.ties), (0, 0, 5));
        assert_eq!((em.diff, em.ci_low, em.ci_high), (0.0, 0.0, 0.0));
        assert_eq!(paired_em(&[]), None, "no questions, no comparison");
    }

    #[test]
    fn only_questions_both_runs_have_are_paired() {
        let a = run("migres", "hotpotqa", &[("q1", true), ("q2", true), ("q3", false)]);
        let b = run("vanilla", "hotpotqa", &[("q2", false), ("q3", false), ("q4", true)]);
        assert_eq!(aligned(&a.right, &b.right), vec![(true, false), (false, false)]);
    }

    #[test]
    fn pooling_keys_questions_by_dataset_and_id() {
        // The same id "1" in two datasets is two questions, with opposite outcomes.
        let runs = vec![
            run("migres", "hotpotqa", &[("1", true), ("2", true)]),
            run("vanilla", "hotpotqa", &[("1", false), ("2", true)]),
            run("migres", "musique", &[("1", false)]),
            run("vanilla", "musique", &[("1", true)]),
        ];
        let comparison = Comparison::new(runs, Vec::new());
        assert_eq!(comparison.pairs.len(), 1);
        let pair = &comparison.pairs[0];
        assert_eq!((pair.a.as_str(), pair.b.as_str()), ("migres", "vanilla"));
        let datasets: Vec<&str> = pair.per_dataset.iter().map(|r| r.dataset.as_str()).collect();
        assert_eq!(datasets, ["hotpotqa", "musique"]);
        assert_eq!((pair.per_dataset[0].em.wins, pair.per_dataset[1].em.losses), (1, 1));
        let pooled = &pair.pooled;
        assert_eq!(
            (pooled.n, pooled.wins, pooled.losses, pooled.ties),
            (3, 1, 1, 1),
            "keyed by id alone it would be 2"
        );
        assert_eq!(pooled.diff, 0.0);
        let md = comparison.markdown();
        assert!(md.contains("| migres vs vanilla | hotpotqa | 2 | 1 | 0 | 1 (1 / 0) | +50.0 |"), "{md}");
        assert!(md.contains("| migres vs vanilla | **pooled** (2 datasets) | 3 | 1 | 1 | 1 (1 / 0) | +0.0 |"), "{md}");
    }

    #[test]
    fn a_second_run_of_a_label_on_a_dataset_is_its_own_series() {
        let runs = vec![
            run("migres", "hotpotqa", &[("1", true)]),
            run("migres", "hotpotqa", &[("1", false)]),
            run("other", "musique", &[("1", false)]),
        ];
        let comparison = Comparison::new(runs, Vec::new());
        let names: Vec<(&str, &str)> = comparison.pairs.iter().map(|p| (p.a.as_str(), p.b.as_str())).collect();
        assert_eq!(names, [("migres", "migres#2")], "no shared dataset with `other`, so no pair");
        assert_eq!(comparison.pairs[0].pooled.wins, 1);
    }

    #[test]
    fn the_prng_is_splitmix64() {
        // The reference sequence for seed 0 (Vigna's splitmix64.c).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert!((0..1000).all(|_| rng.below(7) < 7));
    }
}
