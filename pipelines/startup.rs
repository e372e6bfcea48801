//! What a process does before it takes a question, whichever command it is (`run`, `stage`, `serve`,
//! `eval`, `ask`): it loads the parts its stages need, with the provenance of the answers they will
//! make (`Parts::load`), and with `search.follow_documents` it brings its local tantivy index up to
//! date with the documents topic and keeps it following while it works.

use std::future::Future;
use std::sync::Arc;

use crate::actors::clients::search::materialiser::Materialiser;
use crate::config::{SearchBackend, Settings};
use crate::pipelines::declaration::StageDecl;
use crate::pipelines::kind::PipelineKind;
use crate::pipelines::parts::{Part, Parts, PartsError};
use crate::pipelines::provenance::provenance;
use crate::topics::kafka::KafkaBus;

impl Parts {
    /// Everything the stages of `pipeline` need.
    pub fn load(settings: &Settings, pipeline: PipelineKind) -> Result<Parts, PartsError> {
        Self::load_for(settings, pipeline, pipeline.stages())
    }

    /// What `stages` (of `pipeline`) declare they need, with the provenance of their answers.
    pub fn load_for<'a>(
        settings: &Settings,
        pipeline: PipelineKind,
        stages: impl IntoIterator<Item = &'a StageDecl>,
    ) -> Result<Parts, PartsError> {
        let needed: Vec<Part> = stages.into_iter().flat_map(|s| s.needs.iter().copied()).collect();
        let mut parts = Parts::open(settings, &needed)?;
        parts.provenance = Some(Arc::new(provenance(settings, pipeline, parts.search.as_ref())));
        Ok(parts)
    }
}

/// With `search.follow_documents`, when this process searches (`searches`) the local tantivy index,
/// brings that index up to date with the documents topic (creating the topic if need be) and keeps
/// it following: the caller takes no question before its index holds every document published
/// before it started. `None` when not asked for.
pub async fn follow_documents(settings: &Settings, searches: bool, who: &str) -> anyhow::Result<Option<Materialiser>> {
    if !(settings.search.follow_documents && searches && settings.search.backend == SearchBackend::Tantivy) {
        return Ok(None);
    }
    let bus = Arc::new(KafkaBus::new(settings.kafka.clone(), &settings.bus)?);
    bus.ensure_documents_topic().await?;
    let mut materialiser = Materialiser::start(&bus, &settings.search)?;
    eprintln!("{who}: catching up with {}", bus.documents_topic());
    materialiser.caught_up().await.map_err(|reason| anyhow::anyhow!("cannot follow the documents topic: {reason}"))?;
    Ok(Some(materialiser))
}

/// Runs `work` while the materialiser, if any, keeps following: its failure ends the work with why
/// (`who` names the command), since answers would otherwise go on coming from an index that no
/// longer changes.
pub async fn while_following<T>(
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
