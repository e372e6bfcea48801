//! What one attempt at an event spent on LLM calls, counted where the calls are made. A stage writes
//! its calls into the question's usage only when it succeeds, so without this an attempt that
//! failed after some calls spent nothing as far as the budget knew, and a question that keeps
//! failing a stage was never stopped by its budget. The runner runs each attempt inside
//! [`counting`] and charges a failed attempt's spend to the question.

use std::cell::RefCell;
use std::future::Future;

use super::call_stats::CallStats;
use crate::topics::Usage;

tokio::task_local! {
    static SPENT: RefCell<Usage>;
}

/// Runs `attempt`, returning what its LLM calls spent beside its output. Calls made on other tasks
/// (none of the stages spawns any) are not seen.
pub async fn counting<F: Future>(attempt: F) -> (F::Output, Usage) {
    let mut output = None;
    let spent = SPENT
        .scope(RefCell::new(Usage::default()), async {
            output = Some(attempt.await);
            SPENT.with(|spent| spent.take())
        })
        .await;
    (output.expect("the attempt ran to its end"), spent)
}

/// Charges one call, answered or not, to the attempt being counted, if any. It counts as
/// [`crate::actors::shared::accounting::note_call`] does: one call, its tokens, and its cost.
pub(super) fn charge(stats: &CallStats) {
    let _ = SPENT.try_with(|spent| {
        let mut spent = spent.borrow_mut();
        spent.llm_calls += 1;
        spent.prompt_tokens += stats.prompt_tokens;
        spent.completion_tokens += stats.completion_tokens;
        spent.cached_tokens += stats.cached_tokens;
        spent.cost += stats.cost;
    });
}
