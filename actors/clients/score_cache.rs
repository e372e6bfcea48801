//! The re-ranker's scores on disk, read back instead of scored again.
//!
//! The int8 graph does not score a pair the same on every CPU: without VNNI, ONNX Runtime's u8 x s8
//! kernels add byte products in 16-bit lanes that saturate, so an AVX2-only host scores some pairs
//! differently from the host that recorded a run, a keep decision at the threshold flips, a prompt
//! changes and a replayed LLM call misses. With the scores kept, a recorded run replays exactly on
//! any CPU (the golden replays, `tests/golden_replay.rs`, depend on it).
//!
//! One JSON line per score in `<dir>/scores.jsonl`, appended whole, so several processes can share
//! the file; a torn last line is skipped when read. The key is the SHA-256 of the graph file's own
//! SHA-256 and the pair's text: another graph, or another text, is another entry.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::onnx::ModelError;
use crate::config::{ScoreCacheMode, ScoreCacheSettings};
use crate::topics::provenance::{file_sha256, hex};

pub struct ScoreCache {
    replay: bool,
    /// Hex SHA-256 of the graph file the scores come from.
    graph: String,
    path: PathBuf,
    stored: Mutex<Stored>,
}

/// The scores read and stored, and the file new ones are appended to (none in replay).
struct Stored {
    scores: HashMap<String, f32>,
    file: Option<File>,
}

#[derive(Serialize, Deserialize)]
struct Line {
    key: String,
    score: f32,
}

impl ScoreCache {
    /// The cache for `graph`'s scores, or `None` when `settings.mode` is off.
    pub fn open(settings: &ScoreCacheSettings, graph: &Path) -> Result<Option<ScoreCache>, ModelError> {
        if settings.mode == ScoreCacheMode::Off {
            return Ok(None);
        }
        let load_error = |message: String| ModelError::Load { path: graph.to_path_buf(), message };
        let graph = file_sha256(graph).ok_or_else(|| load_error("cannot read it to key its scores".into()))?;
        let path = settings.dir.join("scores.jsonl");
        let cache_error = |e: std::io::Error| load_error(format!("score cache {}: {e}", path.display()));
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(cache_error(e)),
        };
        let scores = String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|line| serde_json::from_str::<Line>(line).ok())
            .map(|line| (line.key, line.score))
            .collect();
        let replay = settings.mode == ScoreCacheMode::Replay;
        let file = match replay {
            true => None,
            false => {
                std::fs::create_dir_all(&settings.dir).map_err(cache_error)?;
                let mut file = OpenOptions::new().create(true).append(true).open(&path).map_err(cache_error)?;
                if bytes.last().is_some_and(|&end| end != b'\n') {
                    // A writer that died mid-line: end the line, or the next score would join it.
                    file.write_all(b"\n").map_err(cache_error)?;
                }
                Some(file)
            }
        };
        Ok(Some(ScoreCache { replay, graph, path, stored: Mutex::new(Stored { scores, file }) }))
    }

    /// The entry's address: hex SHA-256 of the graph's hash, the query and the passage.
    pub fn key(&self, query: &str, passage: &str) -> String {
        let mut hash = Sha256::new();
        for part in [self.graph.as_str(), query, passage] {
            hash.update(part.as_bytes());
            hash.update([0u8]);
        }
        hex(&hash.finalize())
    }

    /// Each pair's key and stored score. In replay, a pair without one is a `NotCached` error.
    pub fn lookup(&self, pairs: &[(String, String)]) -> Result<Vec<(String, Option<f32>)>, ModelError> {
        let stored = self.stored.lock().expect("the score cache lock is never poisoned");
        let mut found = Vec::with_capacity(pairs.len());
        for (query, passage) in pairs {
            let key = self.key(query, passage);
            let score = stored.scores.get(&key).copied();
            if score.is_none() && self.replay {
                return Err(ModelError::NotCached(key));
            }
            found.push((key, score));
        }
        Ok(found)
    }

    /// Keeps new scores, in memory and appended to the file in one write.
    pub fn store(&self, new: &[(String, f32)]) -> Result<(), ModelError> {
        let mut stored = self.stored.lock().expect("the score cache lock is never poisoned");
        let Some(file) = stored.file.as_mut().filter(|_| !new.is_empty()) else { return Ok(()) };
        let lines: String = new
            .iter()
            .map(|(key, score)| serde_json::to_string(&Line { key: key.clone(), score: *score }).unwrap() + "\n")
            .collect();
        file.write_all(lines.as_bytes())
            .map_err(|e| ModelError::Inference(format!("score cache {}: {e}", self.path.display())))?;
        stored.scores.extend(new.iter().cloned());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, mode: ScoreCacheMode) -> ScoreCacheSettings {
        ScoreCacheSettings { mode, dir: dir.to_path_buf() }
    }

    fn scratch(name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("lacuna-score-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let graph = dir.join("model.onnx");
        std::fs::write(&graph, b"graph one").unwrap();
        (dir.join("scores"), graph)
    }

    fn pair(query: &str, passage: &str) -> (String, String) {
        (query.to_string(), passage.to_string())
    }

    #[test]
    fn a_stored_score_comes_back_in_another_process_and_replay_refuses_the_rest() {
        let (dir, graph) = scratch("back");
        let writer = ScoreCache::open(&settings(&dir, ScoreCacheMode::ReadWrite), &graph).unwrap().unwrap();
        let pairs = [pair("who", "Ann"), pair("who", "Bob")];
        let found = writer.lookup(&pairs).unwrap();
        assert!(found.iter().all(|(_, score)| score.is_none()));
        writer.store(&[(found[0].0.clone(), 3.917_f32)]).unwrap();

        let reader = ScoreCache::open(&settings(&dir, ScoreCacheMode::Replay), &graph).unwrap().unwrap();
        let scores = reader.lookup(&pairs[..1]).unwrap();
        assert_eq!(scores[0].1, Some(3.917_f32), "the score read back is the score stored, to the bit");
        let missing = reader.lookup(&pairs).unwrap_err();
        assert!(matches!(missing, ModelError::NotCached(ref key) if *key == found[1].0), "{missing}");
    }

    #[test]
    fn another_graph_or_text_is_another_entry_and_a_torn_line_is_skipped() {
        let (dir, graph) = scratch("keys");
        let cache = ScoreCache::open(&settings(&dir, ScoreCacheMode::ReadWrite), &graph).unwrap().unwrap();
        let key = cache.key("who", "Ann");
        assert_ne!(key, cache.key("who", "Ann."));
        assert_ne!(key, cache.key("whoAnn", ""), "the parts are separated");
        cache.store(&[(key.clone(), 1.5)]).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("scores.jsonl"))
            .unwrap()
            .write_all(b"{\"key\":\"ab")
            .unwrap();

        let reopened = ScoreCache::open(&settings(&dir, ScoreCacheMode::ReadWrite), &graph).unwrap().unwrap();
        let bob = reopened.key("who", "Bob");
        reopened.store(&[(bob, 2.5)]).unwrap();
        let scores = ScoreCache::open(&settings(&dir, ScoreCacheMode::Replay), &graph).unwrap().unwrap();
        let read = scores.lookup(&[pair("who", "Ann"), pair("who", "Bob")]).unwrap();
        assert_eq!((read[0].1, read[1].1), (Some(1.5), Some(2.5)), "a score stored after the torn line is kept");

        // A graph is hashed once per path and process (as for the provenance): another graph is
        // another file.
        let two = graph.with_file_name("other.onnx");
        std::fs::write(&two, b"graph two").unwrap();
        let other = ScoreCache::open(&settings(&dir, ScoreCacheMode::ReadWrite), &two).unwrap().unwrap();
        assert_eq!(other.lookup(&[pair("who", "Ann")]).unwrap()[0].1, None, "scores of another graph");
        let same = ScoreCache::open(&settings(&dir, ScoreCacheMode::ReadWrite), &graph).unwrap().unwrap();
        assert_eq!(same.lookup(&[pair("who", "Ann")]).unwrap()[0].1, Some(1.5));
    }
}
