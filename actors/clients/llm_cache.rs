//! A content-addressed cache of LLM responses on disk. The key is the SHA-256 of the endpoint and the
//! whole request body (model, messages, temperature, max_tokens, response format): a call that differs
//! in any of them is a different entry. With it an evaluation rerun gives the same answers and costs
//! no LLM time, even with many questions in flight.
//!
//! One small JSON file per entry, written to a temporary name and renamed, so concurrent writers and
//! a crash never leave a half-written entry. Only answers the caller could use are stored, under the
//! call's first request even when it took re-asks: a broken reply is never read back as an answer.
//! A call whose replies stayed unusable through its re-asks is stored as that failure, which only a
//! replay reads back (`llm.cache_mode = "replay"`): the recorded run went on without the call, and so
//! must its replay.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::topics::provenance::hex;

#[derive(Clone, Debug)]
pub struct ResponseCache {
    dir: PathBuf,
}

/// What is kept of a response: the text and what it cost when it was first made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CachedResponse {
    pub text: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<crate::topics::AnswerLogprobs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_logprobs: Option<crate::topics::AnswerLogprobs>,
    /// The reply stopped at `max_tokens` (kept by free-text calls only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The call ended unusable after its re-asks, with this `llm_bad_response` message (`text` is
    /// then empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl CachedResponse {
    /// An entry with what a call spent and nothing else: the caller fills in its outcome.
    pub fn spent(spent: &super::CallStats) -> CachedResponse {
        CachedResponse {
            text: String::new(),
            prompt_tokens: spent.prompt_tokens,
            completion_tokens: spent.completion_tokens,
            cached_tokens: spent.cached_tokens,
            logprobs: None,
            answer_logprobs: None,
            truncated: false,
            failed: None,
        }
    }
}

impl ResponseCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ResponseCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry's address: hex SHA-256 of the endpoint URL and the serialised request body.
    pub fn key(endpoint: &str, body: &Value) -> String {
        let mut hash = Sha256::new();
        hash.update(endpoint.as_bytes());
        hash.update([0u8]);
        hash.update(body.to_string().as_bytes());
        hex(&hash.finalize())
    }

    fn path(&self, key: &str) -> PathBuf {
        // Two-level fan-out keeps directories small for tens of thousands of entries.
        self.dir.join(&key[..2]).join(format!("{key}.json"))
    }

    /// The stored response, if any. An unreadable entry is a miss (and is overwritten later).
    pub fn get(&self, key: &str) -> Option<CachedResponse> {
        let bytes = std::fs::read(self.path(key)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    pub fn put(&self, key: &str, response: &CachedResponse) -> std::io::Result<()> {
        let path = self.path(key);
        let parent = path.parent().expect("an entry path has a parent");
        std::fs::create_dir_all(parent)?;
        let temporary = parent.join(format!(".{key}.{}.tmp", std::process::id()));
        std::fs::write(&temporary, serde_json::to_vec(response).expect("a response serialises"))?;
        std::fs::rename(&temporary, &path)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn any_change_in_the_request_is_a_different_entry() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0.0});
        let same = ResponseCache::key("http://a/v1", &body);
        assert_eq!(same, ResponseCache::key("http://a/v1", &body.clone()));
        assert_ne!(same, ResponseCache::key("http://b/v1", &body));
        let mut hotter = body.clone();
        hotter["temperature"] = json!(0.7);
        assert_ne!(same, ResponseCache::key("http://a/v1", &hotter));
    }

    #[test]
    fn stored_responses_come_back() {
        let dir = std::env::temp_dir().join(format!("lacuna-llm-cache-{}", std::process::id()));
        let cache = ResponseCache::new(&dir);
        let key = ResponseCache::key("u", &json!({"x": 1}));
        assert_eq!(cache.get(&key), None);
        let response = CachedResponse {
            text: "Paris".into(),
            prompt_tokens: 9,
            completion_tokens: 2,
            cached_tokens: 0,
            logprobs: None,
            answer_logprobs: None,
            truncated: false,
            failed: None,
        };
        cache.put(&key, &response).unwrap();
        assert_eq!(cache.get(&key), Some(response));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
