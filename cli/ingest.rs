//! `lacuna ingest FILE.jsonl`: adds documents to the live corpus, replacing any earlier version of
//! each, and `--delete ID...` removes documents. Everything is applied in one commit of the local
//! tantivy index (`search.index_dir`), which every running reader of that folder searches within a
//! second: no restart, no re-index. A line that is not a valid document is reported with its number
//! and skipped; the others are applied, and the command then fails so that no script takes a partial
//! ingest for a whole one.
//!
//! With `search.backend = "meilisearch"` they are applied to the Meilisearch index the same way
//! `lacuna indexer` applies the topic's.
//!
//! With `--transport kafka` the documents are published to the `documents` topic instead (a
//! tombstone for each `--delete`), and every retrieve replica that follows it
//! (`search.follow_documents`) applies them to its own index.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use crate::actors::clients::search::documents::check_id;
use crate::actors::clients::search::meili::Update;
use crate::actors::clients::{Document, MeiliSearch, TantivyWriter};
use crate::actors::runner::{publish_documents, retry_publish};
use crate::config::{SearchBackend, Settings};
use crate::pipelines::Transport;
use crate::topics::kafka::KafkaBus;

#[derive(Args)]
pub struct IngestArgs {
    /// JSONL: one {"id", "title", "text", "metadata"} document per line (metadata: optional string values).
    file: Option<PathBuf>,
    /// Documents to delete, by id (after the file's documents are added).
    #[arg(long, num_args = 1..)]
    delete: Vec<String>,
    /// The tantivy index to change (default: search.index_dir).
    #[arg(long)]
    index_dir: Option<PathBuf>,
    /// `in-process` (write the local index) or `kafka` (publish to the documents topic on
    /// kafka.brokers, which the retrieve replicas follow).
    #[arg(long, default_value = "in-process")]
    transport: Transport,
}

pub async fn ingest(settings: &Settings, args: IngestArgs) -> anyhow::Result<()> {
    if args.file.is_none() && args.delete.is_empty() {
        anyhow::bail!("nothing to do: give a JSONL file of documents, --delete DOC_ID..., or both");
    }
    for id in &args.delete {
        check_id(id).map_err(|e| anyhow::anyhow!("--delete: {e}"))?;
    }
    let (documents, rejected) = match &args.file {
        Some(path) => read_documents(path, settings.search.max_document_bytes)?,
        None => (Vec::new(), Vec::new()),
    };
    if args.transport == Transport::Kafka {
        publish_all(settings, &documents, &args.delete).await?;
        return report(&rejected);
    }
    if settings.search.backend == SearchBackend::Meilisearch {
        return ingest_meilisearch(settings, documents, &args.delete, &rejected).await;
    }
    let dir = args.index_dir.unwrap_or_else(|| settings.search.index_dir.clone());
    let started = Instant::now();
    let words = settings.search.passage_words;
    let deletes = args.delete.len();
    let (added, passages, generation) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut writer = TantivyWriter::open(&dir)?;
        let mut passages = 0;
        for document in &documents {
            passages += writer.upsert(document, words)?;
        }
        for id in &args.delete {
            writer.delete(id);
        }
        Ok((documents.len(), passages, writer.commit()?))
    })
    .await??;
    eprintln!(
        "ingested {added} documents ({passages} passages), deleted {} in {:.1}s; the index is at generation {generation}",
        deletes,
        started.elapsed().as_secs_f32()
    );
    report(&rejected)
}

/// Applies the documents and deletions to the Meilisearch index directly, through the same batch
/// `lacuna indexer` applies (`meili/write.rs`), tagged with the time of this ingest.
async fn ingest_meilisearch(
    settings: &Settings,
    documents: Vec<Document>,
    deletes: &[String],
    rejected: &[(usize, String)],
) -> anyhow::Result<()> {
    let meili = MeiliSearch::new(settings.search.meilisearch.clone())?;
    let started = Instant::now();
    let mut updates: Vec<Update> =
        documents.into_iter().map(|d| Update { doc_id: d.id.clone(), document: Some(d) }).collect();
    // A deletion after the file's documents, as with tantivy: the same id's deletion wins.
    updates.retain(|u| !deletes.contains(&u.doc_id));
    updates.extend(deletes.iter().map(|id| Update { doc_id: id.clone(), document: None }));
    meili.open_for_writing().await?;
    let written = meili.apply_now(&updates, settings.search.passage_words, "ingest").await?;
    eprintln!(
        "ingested {} documents ({} passages), deleted {} in Meilisearch index {:?} in {:.1}s",
        written.upserts,
        written.passages,
        written.deletes,
        settings.search.meilisearch.index,
        started.elapsed().as_secs_f32()
    );
    report(rejected)
}

/// Each document, then each deletion, to the documents topic; acknowledged by the broker before the
/// command returns. Transient errors are retried; nothing is reported published that was not.
async fn publish_all(settings: &Settings, documents: &[Document], deletes: &[String]) -> anyhow::Result<()> {
    let bus = KafkaBus::new(settings.kafka.clone(), &settings.bus)?;
    bus.ensure_documents_topic().await?;
    let started = Instant::now();
    // The deletions after every document, so that one never overtakes the same id's new version.
    publish_documents(&bus, &settings.retry, documents).await?;
    let topic = bus.documents_topic();
    for id in deletes {
        retry_publish(&settings.retry, "ingest", &topic, || bus.publish_document(id, None)).await?;
    }
    eprintln!(
        "published {} documents and {} deletions to {} in {:.1}s",
        documents.len(),
        deletes.len(),
        bus.documents_topic(),
        started.elapsed().as_secs_f32()
    );
    Ok(())
}

fn report(rejected: &[(usize, String)]) -> anyhow::Result<()> {
    for (line, error) in rejected {
        eprintln!("line {line}: {error}");
    }
    if !rejected.is_empty() {
        anyhow::bail!("{} lines were not documents and were skipped (listed above)", rejected.len());
    }
    Ok(())
}

/// The documents of a JSONL file, and the lines that are not documents (number, why). A document
/// given twice counts once, as its last line.
fn read_documents(path: &PathBuf, max_bytes: usize) -> anyhow::Result<(Vec<Document>, Vec<(usize, String)>)> {
    let file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let (mut documents, mut rejected): (Vec<Document>, Vec<(usize, String)>) = (Vec::new(), Vec::new());
    let mut position: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    // Split on bytes: a line that is not UTF-8 is a bad line to report, not the end of the file.
    for (n, line) in std::io::BufReader::new(file).split(b'\n').enumerate() {
        let line = line.map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), n + 1))?;
        let Ok(line) = String::from_utf8(line) else {
            rejected.push((n + 1, "not UTF-8".to_string()));
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        let document = serde_json::from_str::<Document>(&line)
            .map_err(|e| e.to_string())
            .and_then(|d| d.check(max_bytes).map(|_| d).map_err(|e| e.to_string()));
        match document {
            Ok(document) => match position.get(&document.id) {
                Some(&at) => documents[at] = document,
                None => {
                    position.insert(document.id.clone(), documents.len());
                    documents.push(document);
                }
            },
            Err(error) => rejected.push((n + 1, error)),
        }
    }
    Ok((documents, rejected))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line that is not UTF-8 is a bad line like any other: reported with its number and skipped,
    /// the file's other documents read (issue 57: it used to end the whole ingest).
    #[test]
    fn a_line_that_is_not_utf8_is_reported_and_skipped() {
        let path = std::env::temp_dir().join(format!("lacuna-ingest-{}.jsonl", std::process::id()));
        let mut bytes = br#"{"id": "a", "text": "First."}"#.to_vec();
        bytes.extend_from_slice(b"\n{\"id\": \"b\", \"text\": \"caf\xe9\"}\n");
        bytes.extend_from_slice(br#"{"id": "c", "text": "Third."}"#);
        std::fs::write(&path, bytes).unwrap();
        let read = read_documents(&path, 1 << 20);
        std::fs::remove_file(&path).unwrap();
        let (documents, rejected) = read.expect("the file is read to its end");
        let ids: Vec<&str> = documents.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["a", "c"]);
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].0, 2, "{rejected:?}");
    }
}
