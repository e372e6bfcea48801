//! `lacuna eval`: score a pipeline on a dataset folder, or compare earlier runs (`--compare`).

use std::io::BufRead;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use crate::cli::run::progress_bar;
use crate::config::Settings;
use crate::eval::builds::Build;
use crate::eval::compare::{Cost, comparison_markdown, svg_plot};
use crate::eval::dataset::Dataset;
use crate::eval::paired::{Comparison, Run};
use crate::eval::report::{EvalRecord, Report};
use crate::eval::split::Half;
use crate::eval::{EvalOptions, evaluate};
use crate::pipelines::{PipelineKind, Transport};

#[derive(Args)]
pub struct EvalArgs {
    /// A dataset folder with questions.jsonl and corpus.jsonl (the ../shared/data format).
    #[arg(long, required_unless_present = "compare")]
    dataset: Option<PathBuf>,
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
    /// The run's name in its report and in comparisons (default: the pipeline), e.g. for a variant
    /// run with other settings.
    #[arg(long)]
    label: Option<String>,
    /// Only the first N questions (of the half, with --half).
    #[arg(long)]
    limit: Option<usize>,
    /// Only the tuning or the check half of the dataset, by sha256 of the question id (docs/evaluation.md):
    /// levers are tuned on the first, a candidate default is run once on the second. With --compare,
    /// the stored runs are cut to the half before they are scored and paired.
    #[arg(long, value_enum)]
    half: Option<Half>,
    /// With --compare: also each run with the answer_span lever applied to its stored answers, as
    /// `<name>+spans`, over the cited passages of the dataset folders under this directory.
    #[arg(long, requires = "compare")]
    answer_spans: Option<PathBuf>,
    /// Questions inside the pipeline at once (default: run.max_open_questions).
    #[arg(long)]
    concurrency: Option<usize>,
    /// One question and one LLM call at a time, against a server with one slot: two runs of one build
    /// then answer alike, where concurrent requests batched by the server make answers differ from run
    /// to run (docs/evaluation.md, "The noise floor"). Costs wall time; refused when the server says it
    /// has more slots.
    #[arg(long, conflicts_with_all = ["concurrency", "compare"])]
    deterministic: bool,
    #[arg(long, default_value = "in-process")]
    transport: Transport,
    /// Also score Acc† with the LLM judge (eval.judge_*; default: the pipeline's own endpoint).
    #[arg(long)]
    judge: bool,
    /// Answer repeated LLM calls from the response cache: a rerun is deterministic and free. Keeps the
    /// re-ranker's scores too (`rerank.cache.mode = "read_write"` unless set), so the run replays on
    /// any CPU.
    #[arg(long)]
    llm_cache: bool,
    /// Go on with an interrupted run in the same --out: the answers its answers.jsonl holds are kept,
    /// only the other questions are asked, and the report covers them all.
    #[arg(long, conflicts_with = "compare")]
    resume: bool,
    /// Where records.jsonl, report.json and report.md go (with --compare: comparison.md, .json and
    /// .svg).
    #[arg(long)]
    out: PathBuf,
    /// Compare earlier runs instead: their output folders or report.json files.
    #[arg(long, num_args = 1.., conflicts_with = "dataset")]
    compare: Vec<PathBuf>,
}

/// `profile` (the global `--profile`) is applied with the dataset's own layers: the paper's
/// settings differ by dataset group (Table 11).
pub async fn eval(
    settings: &Settings,
    config: Option<&Path>,
    profile: Option<String>,
    args: EvalArgs,
) -> anyhow::Result<()> {
    if !args.compare.is_empty() {
        anyhow::ensure!(profile.is_none(), "--profile makes runs; --compare reads them");
        return compare(&args.compare, &args.out, args.half, args.answer_spans.as_deref());
    }
    let dir = args.dataset.expect("clap requires --dataset without --compare");
    let dataset = Dataset::load(&dir, None)?.cut(args.half, args.limit);
    let mut settings = match &profile {
        // The profile sits between the defaults and --config, as a layer of configuration.
        Some(profile) => {
            let layers = crate::config::profiles::layers(profile, Some(&dir))?;
            eprintln!("profile {profile}: {} layers for {}", layers.len(), dataset.name);
            Settings::load_with(config, &layers).map_err(|e| anyhow::anyhow!("configuration: {e}"))?
        }
        None => settings.clone(),
    };
    settings.llm.cache |= args.llm_cache;
    if args.llm_cache && settings.rerank.cache.mode == crate::config::ScoreCacheMode::Off {
        // The int8 graph scores some pairs otherwise on CPUs without VNNI: a run whose replies are
        // kept keeps its scores too, or elsewhere a flipped keep decision sends another prompt and
        // misses the replies (actors/clients/score_cache.rs).
        settings.rerank.cache.mode = crate::config::ScoreCacheMode::ReadWrite;
    }
    if args.deterministic {
        // Every stage's client sends one call at a time (a stage's llm_concurrency is its client's
        // limit), so the one slot sees a question's calls in one order; with one question open, that
        // order is the run's.
        PipelineKind::limit_llm_calls(&mut settings, 1);
    }
    let concurrency = if args.deterministic { 1 } else { args.concurrency.unwrap_or(settings.run.max_open_questions) };
    let options = EvalOptions {
        pipeline: args.pipeline,
        transport: args.transport,
        concurrency,
        deterministic: args.deterministic,
        judge: args.judge,
        label: args.label.clone(),
        profile,
        resume: args.resume,
    };
    eprintln!("{}: {} questions through {}", dataset.name, dataset.questions.len(), args.pipeline);
    let progress = progress_bar(dataset.questions.len() as u64);
    // metrics.listen serves /metrics during the run, so a long evaluation can be watched (and drawn
    // by scripts/dashboard-snapshot.py).
    let ready = crate::serve::observe::start(&settings.metrics.listen).await?;
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    let report = evaluate(&settings, &dataset, &options, &args.out, &mut |_| progress.inc(1)).await?;
    progress.finish_and_clear();
    print!("{}", report.markdown());
    eprintln!("records and report in {}", args.out.display());
    Ok(())
}

/// comparison.json: the reports and the paired comparison's numbers, for scripts.
#[derive(Serialize)]
struct ComparisonFile<'a> {
    reports: &'a [Report],
    #[serde(flatten)]
    paired: &'a Comparison,
}

fn compare(inputs: &[PathBuf], out: &Path, half: Option<Half>, spans: Option<&Path>) -> anyhow::Result<()> {
    let mut corpora = spans.map(crate::eval::spans::Corpora::new);
    let mut twins = Vec::new();
    let mut reports = Vec::new();
    let mut runs = Vec::new();
    let mut notes = Vec::new();
    let mut builds = Vec::new();
    for input in inputs {
        let Some(path) = report_path(input)? else {
            eprintln!("{}: a comparison's output, not a run; skipped", input.display());
            continue;
        };
        let text =
            std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let mut report: Report = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not an eval report: {e}", path.display()))?;
        // The paired comparison needs the per-question records beside the report; without them the
        // run is still in the means table.
        let records_path = path.with_file_name("records.jsonl");
        match read_records(&records_path) {
            Ok(records) => {
                if let Some(half) = half {
                    report = cut_to(half, &report, &records);
                }
                let records: Vec<EvalRecord> =
                    records.into_iter().filter(|r| half.is_none_or(|half| half.holds(&r.id))).collect();
                runs.push(Run::new(&report, &records));
                if let Some(corpora) = corpora.as_mut() {
                    let (twin, mapped, changed) = crate::eval::spans::with_spans(&report, &records, corpora)?;
                    eprintln!(
                        "{} on {}: answer_span changed {changed} of {} answers",
                        report.pipeline,
                        report.dataset,
                        records.len()
                    );
                    notes.push(format!(
                        "{} on {}: answer_span changed {changed} of {} answers",
                        report.pipeline,
                        report.dataset,
                        records.len()
                    ));
                    runs.push(Run::new(&twin, &mapped));
                    twins.push(twin);
                }
            }
            Err(_) if half.is_some() => {
                anyhow::bail!("{}: a run without its records.jsonl cannot be cut to a half", path.display())
            }
            Err(e) => {
                eprintln!("{e}: {} on {} left out of the paired comparison", report.pipeline, report.dataset);
                notes.push(format!("{} on {}: {e}, left out of the paired sections", report.pipeline, report.dataset));
            }
        }
        builds.extend(Build::of(&format!("{} on {}", report.pipeline, report.dataset), &path));
        reports.push(report);
    }
    for difference in crate::eval::builds::differences(&builds) {
        eprintln!("warning: {difference}");
        notes.push(format!("warning: {difference}"));
    }
    reports.extend(twins);
    let paired = Comparison::new(runs, notes);
    std::fs::create_dir_all(out)?;
    let markdown = comparison_markdown(&reports, Some(&paired));
    std::fs::write(out.join("comparison.md"), &markdown)?;
    let json = ComparisonFile { reports: &reports, paired: &paired };
    std::fs::write(out.join("comparison.json"), serde_json::to_vec_pretty(&json)?)?;
    // The frontier twice: EM against calls (throughput, latency) and against tokens (money).
    std::fs::write(out.join("comparison.svg"), svg_plot(&reports, Cost::Calls))?;
    std::fs::write(out.join("comparison-tokens.svg"), svg_plot(&reports, Cost::Tokens))?;
    print!("{markdown}");
    eprintln!("tables, numbers and plot in {}", out.display());
    Ok(())
}

/// `report` recomputed over the records of `half`; its wall time in proportion.
fn cut_to(half: Half, report: &Report, records: &[EvalRecord]) -> Report {
    let kept: Vec<EvalRecord> = records.iter().filter(|r| half.holds(&r.id)).cloned().collect();
    let share = kept.len() as f64 / records.len().max(1) as f64;
    Report {
        dataset: report.dataset.clone(),
        half: Some(half),
        pipeline: report.pipeline.clone(),
        model: report.model.clone(),
        date: report.date.clone(),
        ..Report::from_records(&kept, report.wall_seconds * share)
    }
}

/// Where an input's report is: the file itself, or report.json in a run's folder. A shell glob such as
/// `runs/*` also matches earlier comparisons' folders, which are skipped (`None`); a folder that holds
/// answers but no report is an interrupted run, which the error says how to finish.
fn report_path(input: &Path) -> anyhow::Result<Option<PathBuf>> {
    if !input.is_dir() {
        return Ok(Some(input.to_path_buf()));
    }
    let report = input.join("report.json");
    if report.exists() {
        Ok(Some(report))
    } else if input.join("comparison.json").exists() {
        Ok(None)
    } else if input.join("answers.jsonl").exists() {
        anyhow::bail!(
            "{} holds answers but no report.json: an interrupted run, which `lacuna eval --resume --out {0}` \
             (with its --dataset and --pipeline) finishes",
            input.display()
        )
    } else {
        anyhow::bail!("{} holds no report.json: not a `lacuna eval` run", input.display())
    }
}

/// A run's records.jsonl, one [`EvalRecord`] a line; a malformed line is an error naming it.
fn read_records(path: &Path) -> anyhow::Result<Vec<EvalRecord>> {
    let file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let mut records = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let record: EvalRecord = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("{} line {}: not an eval record: {e}", path.display(), n + 1))?;
        records.push(record.slimmed());
    }
    Ok(records)
}
