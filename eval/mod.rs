//! `lacuna eval`: runs a dataset's questions through a pipeline and scores the answers the way the
//! papers do, so MIGRES's gains over the baselines (and their cost) can be checked on real data.
//!
//! - `dataset`: the ../shared/data folder format, and its BM25 index (built once, cached).
//! - `score`: EM, F1, MIGRES's lenient EM, cover EM, yes/no scoring.
//! - `judge`: Acc†, an LLM judging whether the prediction implies the gold answer.
//! - `report`: per-question records and the run's report.
//! - `compare`: several reports as one table and one plot.
//! - `paired`: runs compared question by question: wins, losses, and bootstrap intervals of the EM gap.
//! - `gold`: which gold passages a question's trace shows retrieved, shown and cited, read once at scoring.
//! - `funnel`: where a run's gold passages got lost, counted over its records: retrieved, shown, cited.
//! - `spans`: the `answer_span` lever applied to stored runs, each scored again as a `+spans` twin.
//! - `split`: the tuning half and the check half of a dataset, cut by a hash of each question's id.
//! - `calibrate`: the re-ranker threshold from the paper's recipe.
//! - `recall`: `lacuna recall`: recall@5/20/50 of gold passages per backend, and indexing time.
//! - `resume`: going on with an interrupted run.
//! - `builds`: which build made each run, and a warning when compared runs' builds answer differently.
//! - `host`: the CPU a run's re-ranker scored on, whose int8 kernels can move a keep decision.

pub mod builds;
pub mod calibrate;
pub mod compare;
pub mod dataset;
pub mod funnel;
pub mod gold;
pub mod host;
pub mod judge;
pub mod paired;
pub mod recall;
pub mod report;
pub mod resume;
pub mod score;
pub mod spans;
pub mod split;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use futures::StreamExt;

use crate::config::Settings;
use crate::pipelines::parts::{Parts, check_llm, served_slots};
use crate::pipelines::{Pipeline, PipelineKind, Transport};
use crate::topics::{AnswerRecord, QuestionEvent, VersionedAnswer};
use dataset::Dataset;
use judge::Judge;
use report::{EvalRecord, Report};

pub struct EvalOptions {
    pub pipeline: PipelineKind,
    pub transport: Transport,
    /// Questions inside the pipeline at once.
    pub concurrency: usize,
    /// One call at a time against a one-slot server (`lacuna eval --deterministic`): checked before the
    /// run starts, and recorded in run.json.
    pub deterministic: bool,
    /// Ask the judge for Acc†.
    pub judge: bool,
    /// The run's name in reports (default: the pipeline's).
    pub label: Option<String>,
    /// The profile the settings came from, recorded so a resume cannot mix two configurations.
    pub profile: Option<String>,
    /// Keep the answers an interrupted run left in `answers.jsonl` and ask only the rest.
    pub resume: bool,
}

/// Runs `dataset` through the pipeline and writes `answers.jsonl` (as answers arrive),
/// `records.jsonl`, `report.json` and `report.md` into `out`. `on_answer` hears of each question as
/// it finishes (the command line's progress bar).
pub async fn evaluate(
    settings: &Settings,
    dataset: &Dataset,
    options: &EvalOptions,
    out: &Path,
    on_answer: &mut dyn FnMut(&AnswerRecord),
) -> anyhow::Result<Report> {
    std::fs::create_dir_all(out).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", out.display()))?;
    let mut settings = settings.clone();
    settings.search.index_dir = dataset.index_dir()?;
    settings.run.max_open_questions = options.concurrency.max(1);
    // The loop of bounded queues needs room for every open question (see run.max_open_questions).
    settings.bus.queue_capacity = settings.bus.queue_capacity.max(settings.run.max_open_questions + 1);
    let parts = Parts::load(&settings, options.pipeline)?;
    // A replay sends nothing (a call the cache lacks is an `llm_cache_miss`), so it needs no endpoint:
    // the golden replays run where no model is served.
    let replay = settings.llm.cache && settings.llm.cache_mode == crate::config::CacheMode::Replay;
    let served = if replay { None } else { check_llm(&settings).await.map_err(anyhow::Error::msg)? };
    if options.deterministic && !replay {
        one_slot(&settings).await?;
    }
    let model = served.clone().unwrap_or_else(|| settings.llm.model.clone());
    let parts = parts.with_served_model(served);

    let questions: HashMap<&str, &dataset::EvalQuestion> =
        dataset.questions.iter().map(|q| (q.id.as_str(), q)).collect();
    if questions.len() != dataset.questions.len() {
        anyhow::bail!("{}: question ids are not unique", dataset.dir.display());
    }
    let label = options.label.clone().unwrap_or_else(|| options.pipeline.name().to_string());
    let identity = resume::RunIdentity {
        dataset: dataset.name.clone(),
        pipeline: options.pipeline.name().to_string(),
        label: options.label.clone(),
        profile: options.profile.clone(),
        model: model.clone(),
        settings: Some(resume::answer_settings(&settings)),
        provenance: parts.provenance.as_deref().cloned(),
        golden_sha256: Some(builds::golden_sha256()),
        cpu: host::cpu(),
        deterministic: options.deterministic,
    };
    resume::claim_folder(out, &identity, options.resume)?;
    let answers_path = out.join("answers.jsonl");
    let earlier = if options.resume { resume::earlier_answers(&answers_path, &questions)? } else { Vec::new() };
    let resumed = earlier.len();
    // Rewritten from what was kept, so a line cut short by the interruption is gone before appending.
    resume::rewrite(&answers_path, &earlier)?;
    let mut answers = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .append(true)
            .open(&answers_path)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", answers_path.display()))?,
    );
    for answer in &earlier {
        on_answer(&answer.record);
    }
    let mut finished: HashMap<String, AnswerRecord> =
        earlier.into_iter().map(|a| (a.record.question_id().to_string(), a.record)).collect();
    let events: Vec<QuestionEvent> = dataset
        .questions
        .iter()
        .filter(|q| !finished.contains_key(&q.id))
        .map(|q| QuestionEvent::new(q.id.clone(), q.question.clone()).yes_no(q.is_yes_no()))
        .collect();
    if resumed > 0 {
        eprintln!(
            "resuming: {resumed} questions already answered in {}, {} to go",
            answers_path.display(),
            events.len()
        );
    }
    let asked = events.len();

    let started = Instant::now();
    let mut pipeline = Pipeline::start_with(options.pipeline, options.transport, &settings, parts).await?;
    let mut io_error = None;
    pipeline
        .run(events, |record| {
            // Kept as they arrive: an interrupted evaluation still shows what it answered.
            let written = serde_json::to_writer(&mut answers, &VersionedAnswer::from(record.clone()))
                .map_err(std::io::Error::from)
                .and_then(|_| answers.write_all(b"\n"))
                .and_then(|_| answers.flush());
            if let Err(e) = written {
                io_error.get_or_insert(e);
            }
            on_answer(&record);
            finished.insert(record.question_id().to_string(), record);
        })
        .await?;
    pipeline.stop();
    let wall_seconds = started.elapsed().as_secs_f64();
    if let Some(e) = io_error {
        anyhow::bail!("writing {}: {e}", answers_path.display());
    }

    let mut records: Vec<EvalRecord> = dataset
        .questions
        .iter()
        .map(|q| {
            let record = finished.remove(&q.id).expect("the pipeline returns one record per question");
            EvalRecord::new(q, record)
        })
        .collect();
    if options.judge {
        judge_all(&settings, &mut records, &questions).await?;
    }
    let mut report = Report::from_records(&records, wall_seconds);
    if resumed > 0 {
        // The clock ran for this part only, so the rate is over the questions this part asked.
        report.resumed = resumed;
        report.questions_per_minute = if wall_seconds > 0.0 { asked as f64 * 60.0 / wall_seconds } else { 0.0 };
    }
    report.dataset = dataset.name.clone();
    report.half = dataset.half;
    report.pipeline = label;
    report.model = model;
    report.date = today();

    let mut lines = Vec::new();
    for record in &records {
        lines.extend(serde_json::to_vec(record)?);
        lines.push(b'\n');
    }
    std::fs::write(out.join("records.jsonl"), lines)?;
    std::fs::write(out.join("report.json"), serde_json::to_vec_pretty(&report)?)?;
    std::fs::write(out.join("report.md"), report.markdown())?;
    Ok(report)
}

/// `--deterministic` holds only where the server decodes one request at a time: with two slots it
/// batches concurrent calls, and a call's reply then depends on its neighbours.
async fn one_slot(settings: &Settings) -> anyhow::Result<()> {
    match served_slots(settings).await {
        Some(1) => Ok(()),
        Some(slots) => anyhow::bail!(
            "--deterministic needs an LLM server with one slot, and {} has {slots}: restart it with \
             `LACUNA_LLM_PARALLEL=1 scripts/llm-server.sh start`",
            settings.llm.base_url
        ),
        None => {
            eprintln!(
                "warning: {} does not say how many requests it serves at once (no /props); \
                 --deterministic holds only if it serves one",
                settings.llm.base_url
            );
            Ok(())
        }
    }
}

/// Acc† for every answered question: exact matches and yes/no questions need no judge.
async fn judge_all(
    settings: &Settings,
    records: &mut [EvalRecord],
    questions: &HashMap<&str, &dataset::EvalQuestion>,
) -> anyhow::Result<()> {
    let judge = Judge::new(&settings.llm, &settings.eval);
    let verdicts = futures::stream::iter(records.iter().enumerate())
        .map(|(i, record)| {
            let judge = judge.clone();
            let yes_no = questions.get(record.id.as_str()).is_some_and(|q| q.gold_bool().is_some());
            async move {
                let verdict = match &record.prediction {
                    None => Some(false),
                    Some(_) if yes_no || record.scores.em == 1.0 => Some(record.scores.em == 1.0),
                    Some(prediction) => {
                        match judge.implies(&record.question, prediction, &record.gold).await {
                            Ok(v) => Some(v),
                            // A judge failure leaves the question unjudged; the report then has no Acc†.
                            Err(error) => {
                                tracing::error!(%error, question_id = %record.id, "judge call failed");
                                None
                            }
                        }
                    }
                };
                (i, verdict)
            }
        })
        .buffer_unordered(settings.llm.max_concurrency.max(1))
        .collect::<Vec<_>>()
        .await;
    for (i, verdict) in verdicts {
        records[i].judged_correct = verdict;
    }
    Ok(())
}

/// Today's UTC date as YYYY-MM-DD (civil-from-days, so no calendar crate is needed).
pub fn today() -> String {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs() / 86_400;
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
