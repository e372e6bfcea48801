//! `lacuna bench freshness`: how soon a document is searchable on every replica while questions run,
//! how long a new replica takes to catch up, and what ingestion costs question throughput.
//!
//! Documents are passages of the dataset's corpus under new ids, one passage each, published at a set
//! rate for a set time. A document counts as searchable on a replica once a reader of that replica's
//! folder finds it: the reader follows commits as the retrieve stage's does, so the figure includes
//! the same reload delay.
//! - In process one writer applies them and commits every `search.commit_interval_ms` (as `lacuna
//!   ingest` of a file a second would); the time runs from the hand-over to the writer.
//! - Over Kafka they are published to a documents topic of the bench's own, `--replicas`
//!   `lacuna stage retrieve` processes follow it, each into its own folder; the time runs from the
//!   broker's acknowledgement. Then `--catch-up` more passages are published and a new replica is
//!   timed from its start to ready.
//!
//! - With `search.backend = "meilisearch"` (over Kafka only) one `lacuna indexer` applies the topic to
//!   an index of the bench's own on the configured server, and a document counts as searchable once
//!   that index holds it; the catch-up times a new indexer into a new index.
//!
//! Throughput is VANILLA in this process with the fake LLM over the dataset's questions, searching
//! the ingested folder (or index): once before the ingestion starts, and once while it runs.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::pipeline::percentile;
use super::replica::{Replica, free_port};
use crate::actors::clients::{Document, MeiliSearch, TantivySearch, TantivyWriter};
use crate::config::{SearchBackend, Settings};
use crate::eval::dataset::Dataset;
use crate::pipelines::{PipelineKind, Transport};
use crate::topics::kafka::KafkaBus;

pub struct FreshnessOptions {
    pub transport: Transport,
    /// Documents (one passage each) per second.
    pub rate: f64,
    pub seconds: u64,
    pub replicas: usize,
    /// Over Kafka: passages a new replica catches up on at the end (0: skip).
    pub catch_up: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct FreshnessBench {
    pub transport: String,
    pub backend: String,
    pub replicas: usize,
    pub rate: f64,
    pub seconds: u64,
    pub commit_interval_ms: u64,
    pub published: usize,
    /// Published documents every replica found within the run.
    pub searchable: usize,
    pub p50_s: f64,
    pub p95_s: f64,
    pub max_s: f64,
    pub catch_up_passages: usize,
    /// From the new replica's start to ready, with every passage of the topic applied.
    pub catch_up_s: Option<f64>,
    pub questions: usize,
    pub questions_per_second_without: f64,
    pub questions_per_second_with: f64,
}

/// Documents published and not yet found on every replica: id, when published, where found.
type Pending = Arc<Mutex<VecDeque<(String, Instant, Vec<bool>)>>>;

pub async fn run(settings: &Settings, dataset: &Dataset, options: &FreshnessOptions) -> anyhow::Result<FreshnessBench> {
    let work = crate::config::cache_dir().join(format!("bench-freshness-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let corpus = corpus_passages(&dataset.corpus())?;
    let mut settings = settings.clone();
    let meili = settings.search.backend == SearchBackend::Meilisearch;
    anyhow::ensure!(
        !meili || options.transport == Transport::Kafka,
        "with search.backend = \"meilisearch\" the bench times `lacuna indexer`: give --transport kafka"
    );
    let binary = std::env::current_exe()?;
    let (mut replicas, folders, bus) = match options.transport {
        Transport::InProcess => {
            let folder = work.join("index");
            TantivySearch::build(&folder, &dataset.corpus())?;
            (Vec::new(), vec![folder], None)
        }
        Transport::Kafka => {
            let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
            settings.kafka.topic_prefix = format!("{}bench-freshness-{stamp}.", settings.kafka.topic_prefix);
            settings.search.meilisearch.index =
                format!("{}-bench-freshness-{stamp}", settings.search.meilisearch.index);
            let bus = Arc::new(KafkaBus::new(settings.kafka.clone(), &settings.bus)?);
            bus.ensure_documents_topic().await?;
            let base: Vec<Document> = corpus.iter().map(|(id, title, text)| document(id, title, text)).collect();
            crate::actors::runner::publish_documents(&bus, &settings.retry, &base).await?;
            let folders: Vec<PathBuf> = (0..options.replicas).map(|n| work.join(format!("replica-{n}"))).collect();
            let mut replicas = Vec::new();
            if meili {
                replicas.push(Replica::start_indexer(&binary, &settings, &work.join("indexer.log"), free_port()?)?);
            } else {
                for folder in &folders {
                    replicas.push(Replica::start(&binary, &settings, folder, free_port()?)?);
                }
            }
            for replica in &mut replicas {
                replica.wait_ready(Duration::from_secs(600))?;
            }
            (replicas, folders, Some(bus))
        }
    };
    let questions = dataset.questions.len();
    let throughput = |label: &'static str| {
        let (settings, dataset, folder) = (settings.clone(), dataset.clone(), folders[0].clone());
        async move {
            eprintln!("freshness: VANILLA over {} questions, {label}", dataset.questions.len());
            crate::bench::pipeline::run_on(
                label,
                (PipelineKind::Vanilla, Transport::InProcess),
                &settings,
                &dataset,
                folder,
                None,
            )
            .await
        }
    };
    let without = throughput("without ingestion").await?;

    // The ingestion and its prober run for `seconds`; the questions run again meanwhile.
    let pending: Pending = Default::default();
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (folders, pending, latencies, stop) = (folders.clone(), pending.clone(), latencies.clone(), stop.clone());
        let index = meili.then(|| MeiliSearch::new(settings.search.meilisearch.clone())).transpose()?;
        tokio::task::spawn_blocking(move || match index {
            Some(index) => tokio::runtime::Handle::current().block_on(probe_meili(&index, &pending, &latencies, &stop)),
            None => probe(&folders, &pending, &latencies, &stop),
        })
    };
    let publishing = {
        let (pending, stop, rate, seconds) = (pending.clone(), stop.clone(), options.rate, options.seconds);
        let corpus = corpus.clone();
        let interval = Duration::from_millis(settings.search.commit_interval_ms.max(1));
        let words = settings.search.passage_words;
        let index = folders[0].clone();
        let bus = bus.clone();
        tokio::spawn(async move {
            match bus {
                Some(bus) => publish_kafka(&bus, &corpus, rate, seconds, &pending).await,
                None => tokio::task::spawn_blocking(move || {
                    apply_locally(&index, &corpus, rate, seconds, interval, words, &pending, &stop)
                })
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r),
            }
        })
    };
    let with = throughput("while ingesting").await?;
    let published = publishing.await??;
    // Whatever is still pending gets a last few seconds to show up.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pending.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = prober.await;
    let mut latencies = latencies.lock().unwrap().clone();
    latencies.sort_by(f64::total_cmp);

    let catch_up_s = match (&bus, options.catch_up) {
        (Some(bus), n) if n > 0 => Some(catch_up(&settings, bus, &corpus, n, &work).await?),
        _ => None,
    };
    for replica in &mut replicas {
        replica.stop();
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(FreshnessBench {
        transport: match options.transport {
            Transport::InProcess => "in-process".into(),
            Transport::Kafka => "kafka".into(),
        },
        backend: if meili { "meilisearch".into() } else { "tantivy".into() },
        replicas: if meili { 1 } else { folders.len() },
        rate: options.rate,
        seconds: options.seconds,
        commit_interval_ms: settings.search.commit_interval_ms,
        published,
        searchable: latencies.len(),
        p50_s: percentile(&latencies, 0.50),
        p95_s: percentile(&latencies, 0.95),
        max_s: latencies.last().copied().unwrap_or(0.0),
        catch_up_passages: if catch_up_s.is_some() { options.catch_up } else { 0 },
        catch_up_s,
        questions,
        questions_per_second_without: without.questions_per_second,
        questions_per_second_with: with.questions_per_second,
    })
}

impl FreshnessBench {
    pub fn markdown(&self) -> String {
        let catch_up = match self.catch_up_s {
            Some(s) => format!("{s:.1} s for {} passages", self.catch_up_passages),
            None => "not measured".into(),
        };
        format!(
            "# lacuna bench freshness: {} ({}), {} replica(s), {} documents/s for {} s, commits every {} ms\n\n\
             | published | searchable on every replica | p50 s | p95 s | max s | catch-up of a new replica | questions/s without ingestion | questions/s while ingesting | ratio |\n\
             |---|---|---|---|---|---|---|---|---|\n\
             | {} | {} | {:.2} | {:.2} | {:.2} | {catch_up} | {:.3} | {:.3} | {:.2} |\n",
            self.transport,
            self.backend,
            self.replicas,
            self.rate,
            self.seconds,
            self.commit_interval_ms,
            self.published,
            self.searchable,
            self.p50_s,
            self.p95_s,
            self.max_s,
            self.questions_per_second_without,
            self.questions_per_second_with,
            self.questions_per_second_with / self.questions_per_second_without.max(1e-9),
        )
    }
}

/// The corpus's passages as (id, title, text).
fn corpus_passages(path: &Path) -> anyhow::Result<Vec<(String, String, String)>> {
    let mut passages = Vec::new();
    crate::actors::clients::search::for_each_passage(path, |_, p| {
        passages.push((p.id, p.title, p.text));
        Ok(())
    })?;
    anyhow::ensure!(!passages.is_empty(), "{} has no passages", path.display());
    Ok(passages)
}

fn document(id: &str, title: &str, text: &str) -> Document {
    Document { id: id.to_string(), title: title.to_string(), text: text.to_string(), metadata: Default::default() }
}

/// The `n`th new document: a corpus passage under a new id (one passage: corpus passages are short).
fn fresh(corpus: &[(String, String, String)], prefix: &str, n: usize) -> Document {
    let (_, title, text) = &corpus[n % corpus.len()];
    // Whole passages of at most 100 words stay one passage under the default split.
    let text: String = text.split_whitespace().take(90).collect::<Vec<_>>().join(" ");
    document(&format!("{prefix}-{n}"), title, &text)
}

/// In process: one writer, a document every 1/rate s, a commit every `interval`.
#[allow(clippy::too_many_arguments)]
fn apply_locally(
    index: &Path,
    corpus: &[(String, String, String)],
    rate: f64,
    seconds: u64,
    interval: Duration,
    words: usize,
    pending: &Pending,
    stop: &AtomicBool,
) -> anyhow::Result<usize> {
    let mut writer = TantivyWriter::open(index)?;
    let (started, mut last_commit, mut n) = (Instant::now(), Instant::now(), 0);
    let mut uncommitted = false;
    while started.elapsed() < Duration::from_secs(seconds) && !stop.load(Ordering::Relaxed) {
        let due = Duration::from_secs_f64(n as f64 / rate);
        if started.elapsed() >= due {
            let document = fresh(corpus, "fresh", n);
            writer.upsert(&document, words)?;
            pending.lock().unwrap().push_back((document.id, Instant::now(), Vec::new()));
            n += 1;
            uncommitted = true;
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
        if uncommitted && last_commit.elapsed() >= interval {
            writer.commit()?;
            (uncommitted, last_commit) = (false, Instant::now());
        }
    }
    writer.commit()?;
    Ok(n)
}

/// Over Kafka: a document every 1/rate s, each timed from its acknowledgement.
async fn publish_kafka(
    bus: &Arc<KafkaBus>,
    corpus: &[(String, String, String)],
    rate: f64,
    seconds: u64,
    pending: &Pending,
) -> anyhow::Result<usize> {
    let started = tokio::time::Instant::now();
    let mut sends = Vec::new();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep_until(started + Duration::from_secs_f64(n as f64 / rate)).await;
        let document = fresh(corpus, "fresh", n);
        let (bus, pending) = (bus.clone(), pending.clone());
        sends.push(tokio::spawn(async move {
            let payload = serde_json::to_vec(&document).expect("documents serialise");
            bus.publish_document(&document.id, Some(&payload)).await?;
            pending.lock().unwrap().push_back((document.id, Instant::now(), Vec::new()));
            Ok::<_, crate::topics::BusError>(())
        }));
        n += 1;
    }
    for send in sends {
        send.await??;
    }
    Ok(n)
}

/// Checks the pending documents on every folder's reader each time that reader's generation moves;
/// a document found on all of them is done, with its latency.
fn probe(folders: &[PathBuf], pending: &Pending, latencies: &Mutex<Vec<f64>>, stop: &AtomicBool) {
    let mut readers: Vec<Option<TantivySearch>> = folders.iter().map(|_| None).collect();
    let mut generations: Vec<String> = folders.iter().map(|_| String::new()).collect();
    while !stop.load(Ordering::Relaxed) {
        for (r, folder) in folders.iter().enumerate() {
            if readers[r].is_none() {
                readers[r] = TantivySearch::open(folder).ok();
            }
            let Some(reader) = &readers[r] else { continue };
            let generation = reader.generation();
            if generation == generations[r] {
                continue;
            }
            generations[r] = generation;
            let now = Instant::now();
            let mut pending = pending.lock().unwrap();
            for (id, _, found) in pending.iter_mut() {
                found.resize(folders.len(), false);
                if !found[r] && reader.has_document(id) {
                    found[r] = true;
                }
            }
            pending.retain(|(_, published, found)| {
                let everywhere = found.len() == folders.len() && found.iter().all(|f| *f);
                if everywhere {
                    latencies.lock().unwrap().push(now.duration_since(*published).as_secs_f64());
                }
                !everywhere
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asks the Meilisearch index which pending documents it holds, every 50 ms; one found is done.
async fn probe_meili(index: &MeiliSearch, pending: &Pending, latencies: &Mutex<Vec<f64>>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let ids: Vec<String> = pending.lock().unwrap().iter().take(500).map(|(id, _, _)| id.clone()).collect();
        match index.holding(&ids).await {
            Ok(held) => {
                let now = Instant::now();
                pending.lock().unwrap().retain(|(id, published, _)| {
                    let found = held.contains(id);
                    if found {
                        latencies.lock().unwrap().push(now.duration_since(*published).as_secs_f64());
                    }
                    !found
                });
            }
            Err(error) => tracing::warn!(%error, "freshness: cannot ask Meilisearch for the pending documents"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes `n` more passages, then times a new replica with an empty folder from start to ready.
async fn catch_up(
    settings: &Settings,
    bus: &Arc<KafkaBus>,
    corpus: &[(String, String, String)],
    n: usize,
    work: &Path,
) -> anyhow::Result<f64> {
    eprintln!("freshness: publishing {n} passages for the catch-up");
    let documents: Vec<Document> = (0..n).map(|i| fresh(corpus, "catch-up", i)).collect();
    crate::actors::runner::publish_documents(bus, &settings.retry, &documents).await?;
    let folder = work.join("replica-new");
    let started = Instant::now();
    let binary = std::env::current_exe()?;
    let mut replica = match settings.search.backend {
        SearchBackend::Tantivy => Replica::start(&binary, settings, &folder, free_port()?)?,
        // A new indexer into a new index: the catch-up of an empty Meilisearch.
        SearchBackend::Meilisearch => {
            let mut settings = settings.clone();
            settings.search.meilisearch.index.push_str("-new");
            Replica::start_indexer(&binary, &settings, &work.join("indexer-new.log"), free_port()?)?
        }
    };
    replica.wait_ready(Duration::from_secs(1800))?;
    let seconds = started.elapsed().as_secs_f64();
    replica.stop();
    Ok(seconds)
}
