//! The answers sink of `lacuna answers`: the answers topic drained into a JSONL file, one record per
//! question. The file is the sink's memory: a restarted sink skips the questions it already wrote.
//!
//! Beside the file, `<file>.positions` keeps the file's length and, per partition, the offset after
//! the last record written, replaced whole (write, sync, rename) after each line and before the
//! record is acknowledged, as the materialiser keeps its offsets in the tantivy commit. A restart cuts
//! the file back to that length (a line past it was never acknowledged: it comes again) and skips
//! records before those offsets (written, but their offsets not committed yet). With exactly-once
//! stages upstream the file is then exactly once without the skip by question id, which stays for
//! at-least-once topics, where a question can have two records.
//!
//! The positions name offsets of one topic on one cluster, so they are kept with that topic's
//! identity (the cluster's id and the topic's id): a topic deleted and created again, or another
//! cluster's under the same --out, starts again at offset 0, and its records would be skipped as
//! written. The sink refuses to start on them and says how to start over.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Duration;

use crate::topics::kafka::TopicIdentity;
use crate::topics::{Event, Subscription, VersionedAnswer};

/// The JSONL file a sink appends to.
pub struct AnswerFile {
    file: File,
    seen: HashSet<String>,
    /// `<file>.positions`, and what it holds.
    positions_path: std::path::PathBuf,
    positions: Positions,
}

/// What `<file>.positions` holds.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Positions {
    /// Bytes of the file that hold acknowledged records.
    length: u64,
    /// Per partition, the offset after the last record written.
    next: BTreeMap<i32, i64>,
    /// The topic those offsets are of. `None`: stored by a build before this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic: Option<TopicIdentity>,
}

impl AnswerFile {
    /// Opens `path` for appending, remembering the questions it already holds. A last line without
    /// its newline was cut short by a crash: it is cut off, since its record was not acknowledged
    /// and comes again. The file is read line by line, as bytes: a crash can cut a character in
    /// two, and a file that cannot be read is an error, not an empty file (that would write every
    /// answer again).
    pub fn open(path: &Path) -> std::io::Result<AnswerFile> {
        let positions_path = beside(path, ".positions");
        let length = std::fs::metadata(path).map_or(0, |m| m.len());
        // Positions without their file (deleted to start over) are forgotten with it.
        let positions: Option<Positions> = match std::fs::read(&positions_path) {
            Ok(bytes) if length > 0 => Some(serde_json::from_slice(&bytes)?),
            Ok(_) => None,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(error),
        };
        let mut seen = HashSet::new();
        // The bytes of whole, acknowledged lines: what the file keeps.
        let mut whole = 0u64;
        match File::open(path) {
            Ok(existing) => {
                let mut reader = std::io::BufReader::new(existing);
                let mut line = Vec::new();
                while reader.read_until(b'\n', &mut line)? > 0 {
                    let unacknowledged = positions.as_ref().is_some_and(|p| whole + line.len() as u64 > p.length);
                    if line.last() != Some(&b'\n') || unacknowledged {
                        break;
                    }
                    whole += line.len() as u64;
                    if let Ok(record) = serde_json::from_slice::<VersionedAnswer>(&line) {
                        seen.insert(record.record.question_id().to_string());
                    }
                    line.clear();
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        if length > whole {
            let bytes = length - whole;
            tracing::warn!(path = %path.display(), bytes, "cutting off lines never acknowledged (or cut short)");
            file.set_len(whole)?;
        }
        let positions = positions.map(|p| Positions { length: whole, ..p }).unwrap_or_default();
        Ok(AnswerFile { file, seen, positions_path, positions })
    }

    /// Ties the positions to the topic the sink reads, `topic`: an error that says what to do when
    /// they were kept for another (recreated, or another cluster's). Positions from a build before
    /// this one cannot be checked: they are taken as this topic's, and kept with its identity.
    pub fn bind(&mut self, topic: TopicIdentity) -> anyhow::Result<()> {
        match &self.positions.topic {
            Some(kept) if *kept != topic => anyhow::bail!(
                "{} holds positions of another answers topic ({kept}) than the broker's ({topic}): the topic was \
                 deleted and created again, or this is another cluster. Its records would be skipped as written \
                 before. To read this topic into the same file, delete {} (the question ids in the file still keep \
                 answers from being written twice), or give another --out",
                self.positions_path.display(),
                self.positions_path.display()
            ),
            Some(_) => Ok(()),
            None => {
                if !self.positions.next.is_empty() {
                    tracing::warn!(path = %self.positions_path.display(), %topic, "positions kept without their topic's identity (an older build): taken as this topic's");
                }
                self.positions.topic = Some(topic);
                Ok(self.save()?)
            }
        }
    }

    /// Whether the record at `offset` of `partition` is in the file already.
    pub fn holds(&self, (partition, offset): (i32, i64)) -> bool {
        self.positions.next.get(&partition).is_some_and(|next| offset < *next)
    }

    /// Appends `answer` unless its question is in the file already; true when it was written. The
    /// record and its newline go out in one write, flushed to disk before the caller acknowledges.
    pub fn append(&mut self, answer: &VersionedAnswer) -> std::io::Result<bool> {
        if self.seen.contains(answer.record.question_id()) {
            return Ok(false);
        }
        let mut line = serde_json::to_vec(answer)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.sync_data()?;
        self.positions.length += line.len() as u64;
        self.seen.insert(answer.record.question_id().to_string());
        Ok(true)
    }

    /// Records that everything up to `offset` of `partition` is in the file: written whole and
    /// synced before the record is acknowledged, so the file never holds less than it says.
    pub fn written(&mut self, (partition, offset): (i32, i64)) -> std::io::Result<()> {
        self.positions.next.insert(partition, offset + 1);
        self.save()
    }

    /// Replaces the positions file whole: written and synced aside, then renamed over it.
    fn save(&self) -> std::io::Result<()> {
        let temporary = beside(&self.positions_path, ".tmp");
        let mut file = File::create(&temporary)?;
        file.write_all(&serde_json::to_vec(&self.positions)?)?;
        file.sync_data()?;
        std::fs::rename(&temporary, &self.positions_path)
    }

    /// Questions in the file.
    pub fn len(&self) -> usize {
        self.seen.len()
    }
}

/// `path` with `suffix` added to its file name.
fn beside(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Drains `subscription` into `file` until the file holds `expect` records (forever when None).
/// No record for `idle` ends it too: a failure when `expect` is not reached. Each record is
/// acknowledged only once written: a crash before that re-reads it, and the file drops the copy.
pub async fn drain(
    subscription: &mut dyn Subscription,
    file: &mut AnswerFile,
    expect: Option<usize>,
    idle: Duration,
) -> anyhow::Result<()> {
    while expect.is_none_or(|expect| file.len() < expect) {
        let next = tokio::time::timeout(idle, subscription.next()).await;
        if let Ok(None) = next {
            // Its consumer stopped (fenced, say): what was written is committed where it still
            // can be, and a restart goes on from the last commit (the file skips what it holds).
            if let Err(error) = subscription.commit().await {
                tracing::warn!(%error, "the ended feed's positions could not be committed: a restart reads them again");
            }
            anyhow::bail!(
                "the answers feed ended with {} records written: its consumer stopped (see the log)",
                file.len()
            );
        }
        let Ok(Some(delivery)) = next else {
            subscription.commit().await?;
            return match expect {
                Some(expect) => Err(anyhow::anyhow!(
                    "no answer for {} s with {} of {expect} records written (--expect)",
                    idle.as_secs(),
                    file.len()
                )),
                None => Ok(()),
            };
        };
        if let Some(position) = delivery.position
            && file.holds(position)
        {
            tracing::info!(key = %delivery.record.key, "written before the last restart: skipped");
            delivery.ack();
            continue;
        }
        // One this build cannot read still ends its question, in an error record that says so.
        let answer = VersionedAnswer::from_payload(&delivery.record.payload).unwrap_or_else(|error| {
            tracing::error!(%error, key = %delivery.record.key, "undecodable answer record: written as an error");
            VersionedAnswer::unreadable(&delivery.record.key, "the answers sink", &error.to_string())
        });
        if !file.append(&answer)? {
            // At-least-once: a stage that crashed after publishing redid the question.
            tracing::info!(key = %delivery.record.key, "a second record for a question already written: skipped");
        }
        if let Some(position) = delivery.position {
            file.written(position)?;
        }
        delivery.ack();
    }
    subscription.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::topics::in_process::InProcessBus;
    use crate::topics::{AnswerRecord, Bus, ErrorRecord, Record, Topic};

    fn answer(id: &str) -> VersionedAnswer {
        VersionedAnswer::from(AnswerRecord::Error(ErrorRecord {
            question_id: id.into(),
            question: "Where?".into(),
            stage: "input".into(),
            error_type: "bad_input".into(),
            message: "test".into(),
            trace: Vec::new(),
            provenance: None,
        }))
    }

    /// A crash while a line was being written leaves part of it: its record was not acknowledged,
    /// so it comes again, and it must then stand on a line of its own, whole.
    #[test]
    fn a_line_cut_short_by_a_crash_is_dropped_and_its_record_written_whole_again() {
        let dir = std::env::temp_dir().join(format!("lacuna-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("answers.jsonl");
        let whole = serde_json::to_string(&answer("q1")).unwrap();
        let cut = &serde_json::to_string(&answer("q2")).unwrap()[..30];
        std::fs::write(&path, format!("{whole}\n{cut}")).unwrap();

        let mut file = AnswerFile::open(&path).unwrap();
        assert_eq!(file.len(), 1, "the cut line is no record");
        assert!(file.append(&answer("q2")).unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for line in lines {
            assert!(serde_json::from_str::<VersionedAnswer>(line).is_ok(), "a broken line: {line}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A crash can cut a line inside a character of more than one byte (a question with "é" in it),
    /// leaving a file that is not UTF-8 to its end: the sink must still find the questions it holds
    /// and cut the torn line, not read the file as empty and write them all again (issue 57, item 9).
    #[test]
    fn a_line_cut_inside_a_character_is_cut_off_and_the_file_still_remembers_its_questions() {
        let dir = std::env::temp_dir().join(format!("lacuna-sink-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("answers.jsonl");
        let whole = serde_json::to_string(&answer("q1")).unwrap();
        let mut torn = serde_json::to_string(&answer("q2")).unwrap().replace("Where?", "Où?").into_bytes();
        let at = torn.iter().position(|&b| b == 0xc3).unwrap() + 1;
        torn.truncate(at);
        let mut bytes = format!("{whole}\n").into_bytes();
        bytes.extend_from_slice(&torn);
        std::fs::write(&path, bytes).unwrap();

        let mut file = AnswerFile::open(&path).unwrap();
        assert_eq!(file.len(), 1, "q1 is remembered");
        assert!(!file.append(&answer("q1")).unwrap(), "and not written twice");
        assert!(file.append(&answer("q2")).unwrap());
        let text = std::fs::read_to_string(&path).expect("the torn bytes are gone");
        assert_eq!(text.lines().count(), 2, "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Positions kept beside the file: a line written but never acknowledged (the sink died before
    /// it saved its position) is cut, and a record written and saved but whose offset Kafka never
    /// committed is skipped by its offset when it comes again, not by its question id.
    #[test]
    fn the_file_keeps_its_positions_so_a_restart_neither_repeats_nor_loses_a_line() {
        let dir = std::env::temp_dir().join(format!("lacuna-sink-positions-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("answers.jsonl");
        let _ = std::fs::remove_file(&path);
        let mut file = AnswerFile::open(&path).unwrap();
        assert!(file.append(&answer("q1")).unwrap());
        file.written((0, 7)).unwrap();
        // Crash after the line, before its position was saved: the line goes, its record comes again.
        assert!(file.append(&answer("q2")).unwrap());
        drop(file);

        let mut file = AnswerFile::open(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1, "q2's unsaved line is cut");
        assert!(file.holds((0, 7)) && !file.holds((0, 8)) && !file.holds((1, 0)));
        assert!(file.append(&answer("q2")).unwrap(), "q2 is not remembered: it comes again and is written");
        file.written((0, 8)).unwrap();
        drop(file);
        let file = AnswerFile::open(&path).unwrap();
        assert_eq!((file.len(), std::fs::read_to_string(&path).unwrap().lines().count()), (2, 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An answer record this build cannot read still gives its question a line: an error record
    /// that says so, so the file has a record for every question and `--expect` is reached.
    #[tokio::test(start_paused = true)]
    async fn an_undecodable_answer_is_written_as_an_error_record_not_dropped() {
        let dir = std::env::temp_dir().join(format!("lacuna-sink-undecodable-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("answers.jsonl");
        let _ = std::fs::remove_file(&path);
        let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(8));
        let mut subscription = bus.subscribe(&[Topic::Answers], "sink").await.unwrap();
        let garbled = Record {
            topic: Topic::Answers,
            key: "q9".into(),
            payload: br#"{"schema_version": 99}"#.to_vec(),
            trace: Default::default(),
        };
        bus.publish(garbled).await.unwrap();
        let mut file = AnswerFile::open(&path).unwrap();
        drain(&mut *subscription, &mut file, Some(1), Duration::from_secs(5)).await.unwrap();
        let line: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&path).unwrap().trim()).unwrap();
        assert_eq!(
            (line["question_id"].as_str(), line["error_type"].as_str()),
            (Some("q9"), Some("undecodable_record"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `--expect N` is a promise about the file: a sink that goes idle before it has N records
    /// fails, so a test or a script waiting on it cannot mistake a short file for a full one.
    #[tokio::test(start_paused = true)]
    async fn a_sink_idle_before_it_has_the_expected_records_fails() {
        let dir = std::env::temp_dir().join(format!("lacuna-sink-idle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(8));
        let mut subscription = bus.subscribe(&[Topic::Answers], "sink").await.unwrap();
        bus.publish(answer("q1").to_record()).await.unwrap();
        let mut file = AnswerFile::open(&dir.join("answers.jsonl")).unwrap();
        let outcome = drain(&mut *subscription, &mut file, Some(2), Duration::from_secs(5)).await;
        assert_eq!(file.len(), 1);
        let error = outcome.err().map(|e| e.to_string());
        assert!(error.as_ref().is_some_and(|e| e.contains("1 of 2")), "{error:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A subscription whose feed ended (its consumer fenced, say) has nothing more to give.
    struct Ended;

    #[async_trait::async_trait]
    impl Subscription for Ended {
        async fn next(&mut self) -> Option<crate::topics::Delivery> {
            None
        }
    }

    /// A feed that ends is no idle stream: the sink fails at once and says its feed ended, so what
    /// restarts it (a Deployment, a script) does so, and nobody reads "no answer for 180 s" into
    /// a stream that stopped. Its positions are committed: the restart loses and repeats nothing.
    #[tokio::test(start_paused = true)]
    async fn a_sink_whose_feed_ended_fails_at_once_saying_so() {
        let dir = std::env::temp_dir().join(format!("lacuna-sink-ended-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut file = AnswerFile::open(&dir.join("answers.jsonl")).unwrap();
        let started = tokio::time::Instant::now();
        let outcome = drain(&mut Ended, &mut file, Some(2), Duration::from_secs(180)).await;
        let error = outcome.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("feed ended"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(1), "at once, not after the idle timeout");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
