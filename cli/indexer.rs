//! `lacuna indexer`: keeps the Meilisearch index (`search.meilisearch`) a copy of the documents topic
//! on `kafka.brokers`, for retrieve replicas that search Meilisearch (`search.backend =
//! "meilisearch"`). Run one per index: Meilisearch applies its tasks in order, and a second indexer
//! would only repeat the first's work. Serves /metrics, /healthz and /readyz (ready once caught up)
//! on `metrics.listen`; SIGTERM stops it between two batches or within one (a batch is applied again
//! on restart, which changes nothing).

use std::sync::Arc;

use clap::Args;

use super::stage::wait_for_shutdown_signal;
use crate::actors::clients::search::indexer::Indexer;
use crate::actors::clients::{MeiliSearch, backoff};
use crate::config::{SearchBackend, Settings};
use crate::topics::BusError;
use crate::topics::kafka::KafkaBus;

#[derive(Args)]
pub struct IndexerArgs {}

pub async fn indexer(settings: &Settings, _args: IndexerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        settings.search.backend == SearchBackend::Meilisearch,
        "lacuna indexer writes the Meilisearch index the retrieve replicas search: set search.backend = \"meilisearch\" \
         (with tantivy, each replica follows the documents topic itself: search.follow_documents)"
    );
    let ready = crate::serve::observe::start(&settings.metrics.listen).await?;
    let bus = Arc::new(KafkaBus::new(settings.kafka.clone(), &settings.bus)?);
    // A pod that comes up before its Kafka cluster does waits for it, unready, as it waits for
    // Meilisearch; only an error no retry mends (a refusal, a bad configuration) ends it.
    let mut attempt = 1;
    while let Err(error) = bus.ensure_documents_topic().await {
        if !matches!(error, BusError::Transport(_)) {
            return Err(error.into());
        }
        tracing::warn!(%error, attempt, "the documents topic cannot be reached yet: waiting for the brokers");
        tokio::select! {
            _ = wait_for_shutdown_signal() => return Ok(()),
            _ = tokio::time::sleep(backoff(1000, attempt.min(5))) => attempt += 1,
        }
    }
    let meili = settings.search.meilisearch.clone();
    let (url, index) = (meili.url.clone(), meili.index.clone());
    let indexer = Indexer::new(MeiliSearch::new(meili)?, &bus, &settings.search)?;
    eprintln!("indexer: applying {} to Meilisearch index {index:?} at {url}", bus.documents_topic());
    tokio::select! {
        _ = wait_for_shutdown_signal() => {
            eprintln!("indexer: stopped");
            Ok(())
        }
        result = indexer.run(ready) => {
            result?;
            anyhow::bail!("indexer: stopped following the documents topic")
        }
    }
}
