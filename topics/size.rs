//! Keeping events under `bus.max_event_bytes`. Events carry their question's whole trace, which
//! grows with every iteration, so a long question could outgrow what the broker accepts. Before a
//! record would pass the limit, its trace loses its bulkiest and least useful parts first, and a
//! `trimmed` step says how many went; facts, passages and decisions are never touched. A joined
//! event's copies of its children's traces go first; the whole passages kept for the reader fallback
//! are cut to their start near the end, and last the trace is emptied. A record that still cannot be
//! made to fit is refused with the reason, for the stage to end its question with.

use serde_json::{Value, json};

use super::{Record, Topic};

/// Where the trace sits in each kind of payload: events carry it in their memory, answer and error
/// records at the top, a child's result in its result.
const TRACES: [&str; 3] = ["/memory/trace", "/trace", "/result/trace"];

/// One way to make a record smaller: over its trace, or over the whole value (how many passages or
/// repeated steps it shortened or dropped).
#[derive(Clone, Copy)]
enum Pass {
    Trace(fn(&mut Vec<Value>)),
    Whole(fn(&mut Value) -> Shortened),
}

/// What a [`Pass::Whole`] took out, for the `trimmed` marker.
enum Shortened {
    Passages(usize),
    ChildSteps(usize),
}

/// Passes, gentlest first; each runs only while the record is still too large. The last empties
/// the trace: a record must go out even without it, above all a question's only (error) record.
const PASSES: [Pass; 7] = [
    Pass::Whole(drop_repeated_child_traces),
    Pass::Trace(drop_unkept_scores),
    Pass::Trace(shorten_hit_lists),
    Pass::Trace(drop_all_scores),
    Pass::Trace(drop_oldest_half),
    Pass::Whole(shorten_best_passages),
    Pass::Trace(Vec::clear),
];

/// Where an event keeps the passages for the reader fallback (`Memory::best_passages`): up to five
/// whole passages, a few kilobytes, which the last pass cuts to this many bytes each. They go last:
/// the answer at the iteration limit may read them, and the start of a passage is its subject.
const BEST_PASSAGES: &str = "/memory/best_passages";
const BEST_PASSAGE_BYTES: usize = 512;

/// `record` as it is when it fits in `max_bytes`, else trimmed to fit; `Err` says why it cannot be.
pub fn fit(record: Record, max_bytes: usize) -> Result<Record, String> {
    if record.payload.len() <= max_bytes {
        return Ok(record);
    }
    let too_large = |size: usize| {
        format!("a {} record of {size} bytes exceeds bus.max_event_bytes = {max_bytes}", record.topic.name())
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(&record.payload) else {
        return Err(too_large(record.payload.len()));
    };
    if record.topic == Topic::DeadLetters {
        return shorten_dead_letter(record, value, max_bytes);
    }
    let Some(pointer) = TRACES.iter().find(|p| value.pointer(p).is_some_and(Value::is_array)) else {
        return Err(too_large(record.payload.len()));
    };
    let before = value.pointer(pointer).and_then(Value::as_array).map_or(0, Vec::len);
    let mut size = record.payload.len();
    let (mut shortened, mut child_steps, mut iteration) = (0, 0, 0);
    for pass in PASSES {
        match pass {
            Pass::Trace(pass) => pass(value.pointer_mut(pointer).and_then(Value::as_array_mut).expect("found above")),
            Pass::Whole(pass) => match pass(&mut value) {
                Shortened::Passages(count) => shortened += count,
                Shortened::ChildSteps(count) => child_steps += count,
            },
        }
        let trace = value.pointer_mut(pointer).and_then(Value::as_array_mut).expect("found above");
        let removed = before - trace.len();
        // The iteration of the last step left; kept once the trace is emptied.
        iteration = trace.last().and_then(|s| s["iteration"].as_u64()).unwrap_or(iteration);
        let mut marker = json!({
            "stage": "bus",
            "iteration": iteration,
            "kind": "trimmed",
            "removed_steps": removed,
            "limit_bytes": max_bytes,
        });
        if shortened > 0 {
            marker["shortened_passages"] = json!(shortened);
        }
        if child_steps > 0 {
            marker["removed_child_steps"] = json!(child_steps);
        }
        trace.push(marker);
        let payload = serde_json::to_vec(&value).expect("JSON re-serialises");
        size = payload.len();
        if size <= max_bytes {
            tracing::warn!(topic = record.topic.name(), key = %record.key, removed, bytes = size, "trace trimmed to fit bus.max_event_bytes");
            return Ok(Record { payload, ..record });
        }
        // The marker goes back on after the next pass, with its count.
        value.pointer_mut(pointer).and_then(Value::as_array_mut).expect("found above").pop();
    }
    Err(too_large(size))
}

fn kind(step: &Value) -> &str {
    step["kind"].as_str().unwrap_or_default()
}

/// Scores of passages that were never shown: the bulk of a trace, and what an audit needs least.
fn drop_unkept_scores(trace: &mut Vec<Value>) {
    trace.retain(|s| !(kind(s) == "passage_scored" && s["kept"] == false));
}

/// Each retrieval keeps its five best hits.
#[allow(clippy::ptr_arg)] // one signature for every pass in PASSES
fn shorten_hit_lists(trace: &mut Vec<Value>) {
    for step in trace.iter_mut().filter(|s| kind(s) == "retrieved") {
        if let Some(hits) = step["hits"].as_array_mut() {
            hits.truncate(5);
        }
    }
}

fn drop_all_scores(trace: &mut Vec<Value>) {
    trace.retain(|s| !matches!(kind(s), "passage_scored" | "sentences_kept"));
}

/// The earlier half of what is left: the latest iterations explain the answer.
fn drop_oldest_half(trace: &mut Vec<Value>) {
    let half = trace.len() / 2;
    trace.drain(..half);
}

/// A joined event's `results[]` repeat each child's trace, which the join also merged into the
/// parent's: the copies go first, as nothing downstream reads them.
fn drop_repeated_child_traces(value: &mut Value) -> Shortened {
    let mut dropped = 0;
    if value.pointer("/memory/trace").is_some() {
        for result in value.pointer_mut("/results").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(trace) = result.get_mut("trace").and_then(Value::as_array_mut) {
                dropped += trace.len();
                trace.clear();
            }
        }
    }
    Shortened::ChildSteps(dropped)
}

/// Cuts each passage kept for the reader fallback to its first [`BEST_PASSAGE_BYTES`]; how many.
fn shorten_best_passages(value: &mut Value) -> Shortened {
    Shortened::Passages(shorten_best(value))
}

fn shorten_best(value: &mut Value) -> usize {
    let Some(best) = value.pointer_mut(BEST_PASSAGES).and_then(Value::as_array_mut) else {
        return 0;
    };
    let mut shortened = 0;
    for text in best.iter_mut().filter_map(|scored| scored.pointer_mut("/passage/text")) {
        if let Some(long) = text.as_str().filter(|t| t.len() > BEST_PASSAGE_BYTES) {
            *text = Value::String(prefix(long, BEST_PASSAGE_BYTES));
            shortened += 1;
        }
    }
    shortened
}

/// The longest start of `text` that fits in `bytes`, cut between characters.
fn prefix(text: &str, bytes: usize) -> String {
    text.chars()
        .scan(0, |used, c| {
            *used += c.len_utf8();
            (*used <= bytes).then_some(c)
        })
        .collect()
}

/// A dead letter keeps the start of its payload and says it was cut: replaying it is then
/// impossible, but what failed and why stay readable.
fn shorten_dead_letter(record: Record, mut value: Value, max_bytes: usize) -> Result<Record, String> {
    let payload = value["payload"].as_str().unwrap_or_default();
    let keep = max_bytes.saturating_sub(record.payload.len() - payload.len() + 64);
    value["payload"] = Value::String(prefix(payload, keep));
    value["payload_truncated"] = Value::Bool(true);
    let payload = serde_json::to_vec(&value).expect("JSON re-serialises");
    if payload.len() > max_bytes {
        return Err(format!("a dead letter cannot be cut to bus.max_event_bytes = {max_bytes}"));
    }
    Ok(Record { payload, ..record })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(steps: usize) -> Record {
        let trace: Vec<Value> = (0..steps)
            .map(|i| json!({"stage": "sentence_filter", "iteration": 1, "kind": "passage_scored", "query": "q", "passage_id": format!("p{i}"), "score": 0.5, "kept": i == 0}))
            .collect();
        let payload = json!({"schema_version": 1, "memory": {"facts": ["kept"], "trace": trace}});
        Record {
            topic: Topic::Facts,
            key: "q".into(),
            payload: serde_json::to_vec(&payload).unwrap(),
            trace: Default::default(),
        }
    }

    #[test]
    fn a_record_that_fits_is_untouched() {
        let small = record(3);
        assert_eq!(fit(small.clone(), 1 << 20).unwrap(), small);
    }

    #[test]
    fn unkept_scores_go_first_and_a_marker_says_so() {
        let big = record(200);
        let fitted = fit(big.clone(), big.payload.len() / 2).unwrap();
        let value: Value = serde_json::from_slice(&fitted.payload).unwrap();
        let trace = value["memory"]["trace"].as_array().unwrap();
        assert_eq!(trace.len(), 2, "the kept passage's score and the marker");
        assert_eq!(trace[0]["kept"], true);
        assert_eq!((trace[1]["kind"].as_str(), trace[1]["removed_steps"].as_u64()), (Some("trimmed"), Some(199)));
        assert_eq!(value["memory"]["facts"], json!(["kept"]));
    }

    #[test]
    fn best_passages_are_cut_last_and_the_marker_counts_them() {
        let long = "Ångström ".repeat(300);
        let best: Vec<Value> = (0..5)
            .map(|i| json!({"passage": {"id": format!("p{i}"), "title": "t", "text": long}, "score": 1.0}))
            .collect();
        let payload = json!({"memory": {"facts": ["kept"], "best_passages": best, "trace": []}});
        let big = Record {
            topic: Topic::Facts,
            key: "q".into(),
            payload: serde_json::to_vec(&payload).unwrap(),
            trace: Default::default(),
        };
        let fitted = fit(big.clone(), big.payload.len() / 2).unwrap();
        let value: Value = serde_json::from_slice(&fitted.payload).unwrap();
        let best = value["memory"]["best_passages"].as_array().unwrap();
        assert_eq!(best.len(), 5, "every passage stays, shortened");
        for scored in best {
            let text = scored["passage"]["text"].as_str().unwrap();
            assert!(text.len() <= BEST_PASSAGE_BYTES && long.starts_with(text), "{} bytes", text.len());
        }
        assert_eq!(value["memory"]["trace"][0]["shortened_passages"], 5);
        assert_eq!(value["memory"]["facts"], json!(["kept"]));
    }

    /// A joined event repeats each child's trace in `results[]` beside the merged one in its memory:
    /// trimming must reach those copies before it refuses the parent.
    #[test]
    fn a_joined_event_is_trimmed_in_its_results_too() {
        let steps = |n: usize| -> Vec<Value> {
            (0..n)
                .map(|i| json!({"stage": "leaf@1", "iteration": 1, "kind": "facts", "facts": [format!("fact {i}")]}))
                .collect()
        };
        let results: Vec<Value> = (0..3)
            .map(|i| json!({"node": {"path": [i]}, "question": "q", "candidates": [], "trace": steps(400)}))
            .collect();
        let payload = json!({"memory": {"facts": ["kept"], "trace": steps(40)}, "results": results, "missing": []});
        let big = Record {
            topic: Topic::Joined,
            key: "q".into(),
            payload: serde_json::to_vec(&payload).unwrap(),
            trace: Default::default(),
        };
        let fitted = fit(big.clone(), big.payload.len() / 4);
        let fitted = fitted.expect("the children's repeated traces can go");
        let value: Value = serde_json::from_slice(&fitted.payload).unwrap();
        assert_eq!(value["results"].as_array().unwrap().len(), 3, "every child's result stays");
        assert_eq!(value["memory"]["facts"], json!(["kept"]));
    }

    /// An error record that still does not fit after every gentler pass loses its whole trace: it is
    /// the question's only record, so it must go out.
    #[test]
    fn an_error_record_always_fits_without_its_trace() {
        let steps: Vec<Value> = (0..500)
            .map(|i| json!({"stage": "leaf", "iteration": 1, "kind": "facts", "facts": [format!("fact {i}")]}))
            .collect();
        let payload = json!({"status": "error", "question_id": "q", "question": "Who?", "stage": "join", "error_type": "publish_rejected", "message": "too large", "trace": steps});
        let big = Record {
            topic: Topic::Answers,
            key: "q".into(),
            payload: serde_json::to_vec(&payload).unwrap(),
            trace: Default::default(),
        };
        let fitted = fit(big.clone(), 1024).expect("an error record fits without its trace");
        let value: Value = serde_json::from_slice(&fitted.payload).unwrap();
        assert_eq!(value["error_type"], "publish_rejected");
        assert_eq!(value["trace"].as_array().unwrap().last().unwrap()["kind"], "trimmed");
    }

    #[test]
    fn a_record_that_cannot_fit_is_refused_with_the_reason() {
        let error = fit(record(10), 20).unwrap_err();
        assert!(error.contains("exceeds bus.max_event_bytes = 20"), "{error}");
    }
}
