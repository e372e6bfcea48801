//! `lacuna bench rerank`: the same (question, passage) pairs scored three ways at the same batch size
//! and CPU budget: a bare ONNX session in arrival order, a bare session with length-sorted pairs, and
//! the re-rank stage's own path (workers, coalescing across events). It also checks what coalescing
//! does to the scores: the largest change and the keep/drop decisions it flips at the threshold.

use std::time::Instant;

use futures::future::join_all;
use ort::session::Session;
use serde::Serialize;

use crate::actors::clients::onnx::{PairEncoder, open_session};
use crate::actors::clients::rerank::titled;
use crate::actors::clients::{ModelError, Reranker, TantivySearch};
use crate::config::{ExecutionProvider, Graph, ModelSettings, Settings};
use crate::eval::dataset::Dataset;

/// One way of scoring the pairs, and how fast it went.
#[derive(Clone, Debug, Serialize)]
pub struct Way {
    pub name: String,
    pub sessions: usize,
    pub threads: usize,
    pub seconds: f64,
    pub pairs_per_second: f64,
    /// Tokens fed to the model (padding included) per real token.
    pub padded_per_real: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RerankBench {
    pub dataset: String,
    pub events: usize,
    pub pairs: usize,
    pub batch_size: usize,
    pub cpus: usize,
    pub execution_provider: String,
    pub ways: Vec<Way>,
    /// The stage's scores as configured against 41ae80c's (batches of 32 within each event).
    pub max_abs_delta: f32,
    pub threshold: f32,
    pub flips: usize,
    /// The float graph's scores against the installed graph's, when setup derived one.
    pub float_graph: Option<GraphAgreement>,
    /// The pairs the threshold keeps, by the passage's BM25 rank for its question: which pairs could
    /// ever change a keep decision.
    pub kept_by_rank: Vec<RankBucket>,
}

/// Pairs whose passage BM25 ranked `from..=to` for its query, and how many of them the stage keeps.
#[derive(Clone, Debug, Serialize)]
pub struct RankBucket {
    pub from: usize,
    pub to: usize,
    pub pairs: usize,
    pub kept: usize,
}

/// The rank buckets of [`kept_by_rank`], as (first, last) rank.
const RANK_BUCKETS: [(usize, usize); 6] = [(1, 5), (6, 10), (11, 20), (21, 30), (31, 50), (51, usize::MAX)];

/// `scores`, in the order of `events` (each event's pairs in BM25 rank order), bucketed by rank.
pub fn kept_by_rank(events: &[Vec<(String, String)>], scores: &[f32], threshold: f32) -> Vec<RankBucket> {
    let mut buckets: Vec<RankBucket> =
        RANK_BUCKETS.iter().map(|&(from, to)| RankBucket { from, to, pairs: 0, kept: 0 }).collect();
    let ranks = events.iter().flat_map(|event| 1..=event.len());
    for (rank, score) in ranks.zip(scores) {
        if let Some(bucket) = buckets.iter_mut().find(|b| (b.from..=b.to).contains(&rank)) {
            bucket.pairs += 1;
            bucket.kept += (*score >= threshold) as usize;
        }
    }
    buckets.retain(|b| b.pairs > 0);
    buckets
}

/// Two graphs' scores on the same pairs, each pair scored alone.
#[derive(Clone, Debug, Serialize)]
pub struct GraphAgreement {
    pub max_abs_delta: f32,
    pub mean_abs_delta: f32,
    /// Keep/drop decisions at the threshold that differ.
    pub flips: usize,
    /// Pairs the installed graph keeps.
    pub kept: usize,
}

/// The events of the bench: each question's retrieved passages, as the re-rank stage gets them.
pub fn events(settings: &Settings, dataset: &Dataset, pairs: usize) -> anyhow::Result<Vec<Vec<(String, String)>>> {
    let search = TantivySearch::open(&dataset.index_dir()?)?;
    let mut events = Vec::new();
    let mut total = 0;
    for question in &dataset.questions {
        if total >= pairs {
            break;
        }
        let hits = search.search(&question.question, settings.migres.retrieve_top_n)?;
        let event: Vec<(String, String)> = hits
            .into_iter()
            .take(pairs - total)
            .map(|(p, _)| (question.question.clone(), titled(&p.title, &p.text)))
            .collect();
        total += event.len();
        events.push(event);
    }
    anyhow::ensure!(total > 0, "{}: no passages retrieved", dataset.name);
    Ok(events)
}

pub async fn run(settings: &Settings, dataset: &Dataset, pairs: usize) -> anyhow::Result<RerankBench> {
    let events = events(settings, dataset, pairs)?;
    let all: Vec<(String, String)> = events.iter().flatten().cloned().collect();
    let cpus = crate::actors::clients::onnx::cpu_quota();
    let model = &settings.rerank;
    let batch_size = model.batch_size.max(1);
    let mut ways = Vec::new();

    // Bare sessions on the CPUs the stage uses; then the stage as configured, with its sessions and
    // threads swapped, without coalescing (when on), and as 41ae80c batched.
    let configured = Reranker::load(model, &settings.onnx)?;
    let (sessions, threads) = configured.model().parallelism();
    let provider = format!("{:?}", configured.model().provider()).to_lowercase();
    let encoder = &configured.model().encoder().clone();

    let model_path = configured.model().graph().to_path_buf();
    let cpus_used = sessions * threads;
    let mut bare =
        open_session(&model_path, &settings.onnx.library_path, cpus_used, settings.onnx.execution_provider)?.0;
    let arrival: Vec<usize> = (0..all.len()).collect();
    ways.push(bare_way("bare session, arrival order", encoder, &mut bare, &all, &arrival, cpus_used)?);
    let sorted = PairEncoder::length_order(&all);
    ways.push(bare_way("bare session, length-sorted", encoder, &mut bare, &all, &sorted, cpus_used)?);

    if batch_size != TODAY_BATCH {
        // What batching itself is worth on this machine: the bare session at 41ae80c's batch size.
        let today_encoder = encoder.with_batch_size(TODAY_BATCH);
        let name = format!("bare session, length-sorted, batch {TODAY_BATCH}");
        ways.push(bare_way(&name, &today_encoder, &mut bare, &all, &sorted, cpus_used)?);
    }
    drop(bare);

    let (configured_scores, way) = stage_way("stage path (as configured)", &configured, &events).await?;
    ways.push(way);
    drop(configured);
    let swapped = if sessions > 1 { (1, cpus_used) } else { (cpus_used, 1) };
    if swapped != (sessions, threads) {
        let other = Reranker::load(&with(model, swapped.0, swapped.1, model.coalesce_ms), &settings.onnx)?;
        ways.push(stage_way("stage path, sessions and threads swapped", &other, &events).await?.1);
    }
    if model.coalesce_ms > 0 {
        let per_event = Reranker::load(&with(model, sessions, threads, 0), &settings.onnx)?;
        ways.push(stage_way("stage path, coalesce_ms = 0", &per_event, &events).await?.1);
    }
    let today = Reranker::load(&as_in_41ae80c(model), &settings.onnx)?;
    let name = format!("stage path as in 41ae80c (1 session, 1 thread, batch {TODAY_BATCH} per event)");
    let (today_scores, way) = stage_way(&name, &today, &events).await?;
    ways.push(way);

    let threshold = settings.migres.rerank_threshold;
    let float_graph = float_agreement(settings, encoder, &all, cpus_used, threshold)?;
    if let Some(way) = float_graph.as_ref().map(|(_, way)| way.clone()) {
        ways.push(way);
    }
    let pairs = configured_scores.iter().zip(&today_scores);
    let max_abs_delta = pairs.clone().map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    let flips = pairs.filter(|(a, b)| (**a >= threshold) != (**b >= threshold)).count();
    Ok(RerankBench {
        dataset: dataset.name.clone(),
        events: events.len(),
        pairs: all.len(),
        batch_size,
        cpus,
        execution_provider: provider,
        ways,
        max_abs_delta,
        threshold,
        flips,
        float_graph: float_graph.map(|(agreement, _)| agreement),
        kept_by_rank: kept_by_rank(&events, &configured_scores, threshold),
    })
}

/// The float graph (`model.float.onnx`, derived at setup) against the installed one, on the CPU:
/// both score every pair alone, so the difference is the graphs', not the batches'. `None` when
/// setup derived no float graph.
fn float_agreement(
    settings: &Settings,
    encoder: &PairEncoder,
    pairs: &[(String, String)],
    threads: usize,
    threshold: f32,
) -> anyhow::Result<Option<(GraphAgreement, Way)>> {
    let model = &settings.rerank;
    let float = model.graph_path_of(Graph::Float);
    if !float.exists() {
        return Ok(None);
    }
    let alone = encoder.with_batch_size(1);
    let cpu = ExecutionProvider::Cpu;
    let mut installed =
        open_session(&model.graph_path_of(Graph::Installed), &settings.onnx.library_path, threads, cpu)?.0;
    let base = scores_alone(&alone, &mut installed, pairs)?;
    drop(installed);
    let mut session = open_session(&float, &settings.onnx.library_path, threads, cpu)?.0;
    let started = Instant::now();
    let other = scores_alone(&alone, &mut session, pairs)?;
    let seconds = started.elapsed().as_secs_f64();
    let deltas: Vec<f32> = base.iter().zip(&other).map(|(a, b)| (a - b).abs()).collect();
    let agreement = GraphAgreement {
        max_abs_delta: deltas.iter().copied().fold(0.0, f32::max),
        mean_abs_delta: deltas.iter().sum::<f32>() / deltas.len().max(1) as f32,
        flips: base.iter().zip(&other).filter(|(a, b)| (**a >= threshold) != (**b >= threshold)).count(),
        kept: base.iter().filter(|&&a| a >= threshold).count(),
    };
    let way = Way {
        name: "bare session, float graph, pairs alone".into(),
        sessions: 1,
        threads,
        seconds,
        pairs_per_second: pairs.len() as f64 / seconds,
        padded_per_real: 1.0,
    };
    Ok(Some((agreement, way)))
}

/// Every pair's score, each pair in a batch of its own.
fn scores_alone(
    encoder: &PairEncoder,
    session: &mut Session,
    pairs: &[(String, String)],
) -> Result<Vec<f32>, ModelError> {
    let mut scores = Vec::with_capacity(pairs.len());
    for pair in pairs {
        let row = encoder.run(session, encoder.encode(vec![pair.clone()])?)?;
        scores.push(row.first().and_then(|r| r.first()).copied().unwrap_or(f32::MIN));
    }
    Ok(scores)
}

/// The batch size of 41ae80c, which batched each event's pairs by 32.
const TODAY_BATCH: usize = 32;

/// `model` re-ranking as 41ae80c did: one session of one thread, batches of 32 within each event.
pub fn as_in_41ae80c(model: &ModelSettings) -> ModelSettings {
    ModelSettings { batch_size: TODAY_BATCH, ..with(model, 1, 1, 0) }
}

fn with(model: &ModelSettings, sessions: usize, threads: usize, coalesce_ms: u64) -> ModelSettings {
    ModelSettings { sessions, threads, coalesce_ms, ..model.clone() }
}

fn bare_way(
    name: &str,
    encoder: &PairEncoder,
    session: &mut Session,
    pairs: &[(String, String)],
    order: &[usize],
    threads: usize,
) -> Result<Way, ModelError> {
    let (mut real, mut padded) = (0, 0);
    let started = Instant::now();
    for chunk in order.chunks(encoder.batch_size) {
        let encoded = encoder.encode(chunk.iter().map(|&i| pairs[i].clone()).collect())?;
        (real, padded) = (real + encoded.real_tokens, padded + encoded.padded_tokens);
        encoder.run(session, encoded)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Way {
        name: name.into(),
        sessions: 1,
        threads,
        seconds,
        pairs_per_second: pairs.len() as f64 / seconds,
        padded_per_real: padded as f64 / real.max(1) as f64,
    })
}

/// Every event scored at once through `reranker`, as events waiting at the stage would be.
async fn stage_way(
    name: &str,
    reranker: &Reranker,
    events: &[Vec<(String, String)>],
) -> anyhow::Result<(Vec<f32>, Way)> {
    let tokens = |kind: &str| crate::metrics::METRICS.model_tokens.with_label_values(&["reranker", kind]).get();
    let (real, padded) = (tokens("real"), tokens("padded"));
    let started = Instant::now();
    let scores = join_all(events.iter().map(|event| reranker.score(event.clone()))).await;
    let seconds = started.elapsed().as_secs_f64();
    let scores: Vec<f32> = scores.into_iter().collect::<Result<Vec<_>, _>>()?.into_iter().flatten().collect();
    let (sessions, threads) = reranker.model().parallelism();
    let way = Way {
        name: name.into(),
        sessions,
        threads,
        seconds,
        pairs_per_second: scores.len() as f64 / seconds,
        padded_per_real: (tokens("padded") - padded) as f64 / (tokens("real") - real).max(1) as f64,
    };
    Ok((scores, way))
}

impl RerankBench {
    pub fn markdown(&self) -> String {
        let sorted =
            self.ways.iter().find(|w| w.name == "bare session, length-sorted").map_or(1.0, |w| w.pairs_per_second);
        let mut out = format!(
            "# lacuna bench rerank: {} pairs of {} ({} events), batch {}, {} CPUs, {}\n\n\
             | way | sessions × threads | seconds | pairs/s | × bare sorted | padded/real tokens |\n|---|---|---|---|---|---|\n",
            self.pairs, self.dataset, self.events, self.batch_size, self.cpus, self.execution_provider
        );
        for w in &self.ways {
            out += &format!(
                "| {} | {} × {} | {:.2} | {:.1} | {:.2} | {:.2} |\n",
                w.name,
                w.sessions,
                w.threads,
                w.seconds,
                w.pairs_per_second,
                w.pairs_per_second / sorted,
                w.padded_per_real
            );
        }
        out += &format!(
            "\nThe stage's scores as configured against 41ae80c's: max |Δscore| {:.4}; {} of {} keep/drop decisions flip at the threshold {:.2} ({:.2}%).\n",
            self.max_abs_delta,
            self.flips,
            self.pairs,
            self.threshold,
            100.0 * self.flips as f64 / self.pairs.max(1) as f64
        );
        match &self.float_graph {
            Some(g) => {
                out += &format!(
                    "The float graph's scores against the installed graph's, each pair alone on the CPU: max |Δscore| {:.4}, mean {:.4}; {} of {} keep/drop decisions flip at the threshold ({} kept by the installed graph).\n",
                    g.max_abs_delta, g.mean_abs_delta, g.flips, self.pairs, g.kept
                )
            }
            None => out += "No float graph (model.float.onnx): setup derives it with LACUNA_FLOAT_GRAPH=1.\n",
        }
        let kept: usize = self.kept_by_rank.iter().map(|b| b.kept).sum();
        out += "\nWhat the threshold keeps, by the passage's BM25 rank for its question:\n\n\
                | BM25 rank | pairs | kept | kept/pairs | share of all kept |\n|---|---|---|---|---|\n";
        for b in &self.kept_by_rank {
            let to = if b.to == usize::MAX { "".to_string() } else { b.to.to_string() };
            out += &format!(
                "| {}-{} | {} | {} | {:.1}% | {:.1}% |\n",
                b.from,
                to,
                b.pairs,
                b.kept,
                100.0 * b.kept as f64 / b.pairs.max(1) as f64,
                100.0 * b.kept as f64 / kept.max(1) as f64
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_are_counted_by_each_passages_rank_for_its_own_question() {
        let event = |n: usize| vec![(String::new(), String::new()); n];
        // Two questions: ranks 1-7 and 1-3. Kept: ranks 1 and 6 of the first, rank 2 of the second.
        let scores = [5.0, 1.0, 1.0, 1.0, 1.0, 4.0, 1.0, 1.0, 3.9, 1.0];
        let buckets = kept_by_rank(&[event(7), event(3)], &scores, 3.9);
        let summary: Vec<(usize, usize, usize)> = buckets.iter().map(|b| (b.from, b.pairs, b.kept)).collect();
        assert_eq!(summary, vec![(1, 8, 2), (6, 2, 1)]);
    }
}
