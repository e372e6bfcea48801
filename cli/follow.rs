//! `search.follow_documents` for the commands that search in this process (`lacuna stage retrieve`,
//! `lacuna run`): the local tantivy index is first brought up to date with the documents topic,
//! then kept following it while the command works.

use std::future::Future;

use crate::actors::clients::search::materialiser::Materialiser;
use crate::config::{SearchBackend, Settings};
use crate::topics::kafka::KafkaBus;

/// With `search.follow_documents`, when this process searches (`searches`) the local tantivy index,
/// brings that index up to date with the documents topic (creating the topic if need be) and keeps
/// it following: the caller takes no question before its index holds every document published
/// before it started. `None` when not asked for.
pub(crate) async fn follow_documents(
    settings: &Settings,
    searches: bool,
    who: &str,
) -> anyhow::Result<Option<Materialiser>> {
    if !(settings.search.follow_documents && searches && settings.search.backend == SearchBackend::Tantivy) {
        return Ok(None);
    }
    let bus = std::sync::Arc::new(KafkaBus::new(settings.kafka.clone(), &settings.bus)?);
    bus.ensure_documents_topic().await?;
    let mut materialiser = Materialiser::start(&bus, &settings.search)?;
    eprintln!("{who}: catching up with {}", bus.documents_topic());
    materialiser.caught_up().await.map_err(|reason| anyhow::anyhow!("cannot follow the documents topic: {reason}"))?;
    Ok(Some(materialiser))
}

/// Runs `work` while the materialiser, if any, keeps following: its failure ends the work with why
/// (`who` names the command), since answers would otherwise go on coming from an index that no
/// longer changes.
pub(crate) async fn while_following<T>(
    materialiser: &mut Option<Materialiser>,
    who: &str,
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let Some(materialiser) = materialiser else { return work.await };
    tokio::select! {
        result = work => result,
        reason = materialiser.failed() => anyhow::bail!("{who}: the local index stopped following the documents topic: {reason}"),
    }
}
