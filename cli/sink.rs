//! The answers sink of `lacuna answers`: the answers topic drained into a JSONL file, one record per
//! question. The file is the sink's memory: a restarted sink skips the questions it already wrote.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::topics::{Event, Subscription, VersionedAnswer};

/// The JSONL file a sink appends to.
pub struct AnswerFile {
    file: File,
    seen: HashSet<String>,
}

impl AnswerFile {
    /// Opens `path` for appending, remembering the questions it already holds.
    pub fn open(path: &Path) -> std::io::Result<AnswerFile> {
        let mut seen = HashSet::new();
        if let Ok(text) = std::fs::read_to_string(path) {
            for line in text.lines() {
                if let Ok(record) = serde_json::from_str::<VersionedAnswer>(line) {
                    seen.insert(record.record.question_id().to_string());
                }
            }
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(AnswerFile { file, seen })
    }

    /// Appends `answer` unless its question is in the file already; true when it was written.
    pub fn append(&mut self, answer: &VersionedAnswer) -> std::io::Result<bool> {
        if !self.seen.insert(answer.record.question_id().to_string()) {
            return Ok(false);
        }
        serde_json::to_writer(&mut self.file, answer)?;
        self.file.write_all(b"\n")?;
        self.file.flush()?;
        Ok(true)
    }

    /// Questions in the file.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Drains `subscription` into `file` until the file holds `expect` records (forever when None),
/// or until no record came for `idle`. Each record is acknowledged only once written: a crash before
/// that re-reads it, and the file drops the copy.
pub async fn drain(
    subscription: &mut dyn Subscription,
    file: &mut AnswerFile,
    expect: Option<usize>,
    idle: Duration,
) -> anyhow::Result<()> {
    while expect.is_none_or(|expect| file.len() < expect) {
        let Ok(Some(delivery)) = tokio::time::timeout(idle, subscription.next()).await else { break };
        match VersionedAnswer::from_payload(&delivery.record.payload) {
            Ok(answer) => {
                file.append(&answer)?;
            }
            Err(error) => tracing::error!(%error, key = %delivery.record.key, "undecodable answer record skipped"),
        }
        delivery.ack();
    }
    subscription.commit().await?;
    Ok(())
}
