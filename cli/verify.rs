//! `lacuna verify-index`: reads the documents topic to its end and compares it with a retrieve
//! replica's tantivy index (`search.index_dir`): every live document at its last version, split by
//! `search.passage_words`, and nothing else. It prints what differs and fails when anything does. The
//! soak ends with it; an operator runs it to know that a replica is a copy of the topic (once its
//! writers have stopped and it has caught up: it reads the index as it is, mid-catch-up too).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::actors::clients::search::changes::parse_change;
use crate::actors::clients::{Document, TantivySearch};
use crate::config::Settings;
use crate::topics::Passage;
use crate::topics::kafka::{Changelog, KafkaBus};

#[derive(Args)]
pub struct VerifyIndexArgs {
    /// The tantivy index to compare (default: search.index_dir).
    #[arg(long)]
    index_dir: Option<PathBuf>,
    /// How long to wait for the topic's records up to the ends it had when the command started.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
}

/// How an index differs from the topic's live documents, by document id.
#[derive(Debug, Default, PartialEq)]
pub struct Difference {
    /// Live on the topic, absent from the index.
    pub missing: Vec<String>,
    /// In both, with other passages than the topic's last version makes.
    pub stale: Vec<String>,
    /// In the index, deleted on the topic or never on it.
    pub extra: Vec<String>,
}

impl Difference {
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.stale.is_empty() && self.extra.is_empty()
    }
}

/// The index's documents against the topic's last word on each key (`None`: a tombstone).
pub fn compare(
    topic: &HashMap<String, Option<Document>>,
    held: &BTreeMap<String, Vec<Passage>>,
    passage_words: usize,
) -> Difference {
    let mut difference = Difference::default();
    for (id, document) in topic {
        match (document, held.get(id)) {
            (Some(_), None) => difference.missing.push(id.clone()),
            (Some(document), Some(passages)) if *passages != document.passages(passage_words) => {
                difference.stale.push(id.clone())
            }
            _ => {}
        }
    }
    let live = |id: &String| topic.get(id).is_some_and(Option::is_some);
    difference.extra = held.keys().filter(|id| !live(id)).cloned().collect();
    difference.missing.sort();
    difference.stale.sort();
    difference
}

/// Each key's last valid record, reading every partition from its earliest record up to the end it
/// had at the start. A record that is not a document changes nothing, as a replica skips it.
fn read_topic(changelog: &Changelog, timeout: Duration) -> anyhow::Result<(HashMap<String, Option<Document>>, u64)> {
    let spans = changelog.spans()?;
    let mut left: HashMap<i32, i64> = spans.iter().filter(|s| s.high > s.low).map(|s| (s.partition, s.high)).collect();
    changelog.start(&spans.iter().map(|s| (s.partition, s.low)).collect())?;
    let (mut latest, mut records) = (HashMap::new(), 0u64);
    let deadline = std::time::Instant::now() + timeout;
    while !left.is_empty() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the documents topic was not read to its end within {} s ({} partitions left)",
            timeout.as_secs(),
            left.len()
        );
        let Some(change) = changelog.poll(Duration::from_millis(500))? else { continue };
        if left.get(&change.partition).is_some_and(|&end| change.offset + 1 >= end) {
            left.remove(&change.partition);
        }
        records += 1;
        if let Ok(document) = parse_change(&change) {
            latest.insert(change.key, document);
        }
    }
    Ok((latest, records))
}

pub async fn verify_index(settings: &Settings, args: VerifyIndexArgs) -> anyhow::Result<()> {
    let bus = KafkaBus::new(settings.kafka.clone(), &settings.bus)?;
    let changelog = bus.changelog()?;
    let topic_name = changelog.topic().to_string();
    let timeout = Duration::from_secs(args.timeout_s);
    let (topic, records) = tokio::task::spawn_blocking(move || read_topic(&changelog, timeout)).await??;
    let dir = args.index_dir.unwrap_or_else(|| settings.search.index_dir.clone());
    let held = TantivySearch::open(&dir)?.all_documents()?;
    let difference = compare(&topic, &held, settings.search.passage_words);
    let live = topic.values().filter(|d| d.is_some()).count();
    println!("{topic_name}: {records} records, {live} live documents; {}: {} documents", dir.display(), held.len());
    if difference.is_empty() {
        println!("the index holds exactly the topic's live documents, each at its last version");
        return Ok(());
    }
    let few = |ids: &[String]| {
        let shown: Vec<&str> = ids.iter().take(10).map(String::as_str).collect();
        format!("{}{}", shown.join(", "), if ids.len() > 10 { ", ..." } else { "" })
    };
    println!(
        "missing (live on the topic, not in the index): {} {}",
        difference.missing.len(),
        few(&difference.missing)
    );
    println!("stale (not the topic's last version): {} {}", difference.stale.len(), few(&difference.stale));
    println!("extra (deleted on the topic, or never on it): {} {}", difference.extra.len(), few(&difference.extra));
    anyhow::bail!("the index at {} is not a copy of {topic_name}", dir.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document(id: &str, text: &str) -> Document {
        Document { id: id.into(), title: "T".into(), text: text.into(), metadata: Default::default() }
    }

    #[test]
    fn an_index_differs_by_missing_stale_and_extra_documents() {
        let topic = HashMap::from([
            ("same".to_string(), Some(document("same", "one two three four"))),
            ("newer".to_string(), Some(document("newer", "version two words here"))),
            ("absent".to_string(), Some(document("absent", "x"))),
            ("deleted".to_string(), None),
        ]);
        let passages = |id: &str, text: &str| document(id, text).passages(2);
        let held = BTreeMap::from([
            ("same".to_string(), passages("same", "one two three four")),
            ("newer".to_string(), passages("newer", "version one")),
            ("deleted".to_string(), passages("deleted", "gone")),
            ("stranger".to_string(), passages("stranger", "never published")),
        ]);
        let difference = compare(&topic, &held, 2);
        assert_eq!(
            difference,
            Difference {
                missing: vec!["absent".into()],
                stale: vec!["newer".into()],
                extra: vec!["deleted".into(), "stranger".into()],
            }
        );
        let equal = BTreeMap::from([("same".to_string(), passages("same", "one two three four"))]);
        let topic = HashMap::from([("same".to_string(), Some(document("same", "one two three four")))]);
        assert!(compare(&topic, &equal, 2).is_empty());
        assert!(!compare(&topic, &equal, 3).is_empty(), "split by another passage_words, the passages differ");
    }
}
