//! Which event schema this build writes and reads. A build reads its own version and the one before,
//! so events in flight when a rolling upgrade starts are still processed by the new replicas. The
//! other direction needs the operator: while replicas of the previous build still run, set
//! `bus.write_schema_version` to the previous version and the new replicas write what the old ones
//! read; once the rollout is done, unset it.
//!
//! Version 2 (this build) added trace kinds (`degraded`, `trimmed`, and `unknown`, which stands for any
//! kind a later version adds) and optional fields (`degraded` on answers, `reasks` on LLM calls,
//! `attempts` on dead letters). Version 1 readers ignore unknown fields but not unknown trace kinds.

use serde_json::Value;

/// The version this build writes.
pub const SCHEMA_VERSION: u32 = 2;

/// The oldest version this build reads.
pub const OLDEST_READABLE_SCHEMA_VERSION: u32 = 1;

/// Trace kinds that version 1 readers reject.
const TRACE_KINDS_NEW_IN_2: [&str; 3] = ["degraded", "trimmed", "unknown"];

/// A payload of this build as a reader of `version` takes it. Trace steps that version has no kind
/// for are left out: the audit trail of the events written during a rollout is the poorer for it,
/// but no replica of the previous build sends them to the dead letters.
pub fn write_as(payload: Vec<u8>, version: u32) -> Vec<u8> {
    if version >= SCHEMA_VERSION || payload.is_empty() {
        return payload;
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(&payload) else { return payload };
    if let Some(written) = value.get_mut("schema_version") {
        *written = Value::from(version);
    }
    drop_new_trace_kinds(&mut value);
    serde_json::to_vec(&value).expect("a JSON value serialises")
}

/// Removes version 2's trace kinds from every `trace` array, however deep (a joined parent's
/// results carry their own).
fn drop_new_trace_kinds(value: &mut Value) {
    match value {
        Value::Object(object) => {
            for (key, child) in object.iter_mut() {
                if key == "trace"
                    && let Value::Array(steps) = child
                {
                    steps.retain(|step| !TRACE_KINDS_NEW_IN_2.contains(&step["kind"].as_str().unwrap_or_default()));
                }
                drop_new_trace_kinds(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(drop_new_trace_kinds),
        _ => {}
    }
}

/// Checks `bus.write_schema_version`.
pub fn check_write_version(version: u32) -> Result<(), String> {
    if (OLDEST_READABLE_SCHEMA_VERSION..=SCHEMA_VERSION).contains(&version) {
        Ok(())
    } else {
        Err(format!(
            "bus.write_schema_version = {version}: this build writes versions {OLDEST_READABLE_SCHEMA_VERSION} to {SCHEMA_VERSION}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn written_as_version_1_an_event_has_no_trace_kind_version_1_lacks() {
        let event = json!({
            "schema_version": 2,
            "memory": {"trace": [{"kind": "retrieved"}, {"kind": "degraded"}]},
            "results": [{"memory": {"trace": [{"kind": "trimmed"}, {"kind": "verdict"}]}}],
        });
        let written = write_as(serde_json::to_vec(&event).unwrap(), 1);
        let written: Value = serde_json::from_slice(&written).unwrap();
        assert_eq!(
            written,
            json!({
                "schema_version": 1,
                "memory": {"trace": [{"kind": "retrieved"}]},
                "results": [{"memory": {"trace": [{"kind": "verdict"}]}}],
            })
        );
    }

    #[test]
    fn the_current_version_is_written_unchanged() {
        let payload = br#"{"schema_version":2,"trace":[{"kind":"degraded"}]}"#.to_vec();
        assert_eq!(write_as(payload.clone(), SCHEMA_VERSION), payload);
    }
}
