//! Where a running stage stands, shared by its actor, its feeder and the delivery code: running,
//! stopped, or failed with why. `/readyz`, `lacuna stage` and an in-process run watch it.

use std::sync::Arc;

use tokio::sync::watch;

use crate::metrics::METRICS;

/// Where a started stage stands: what `/readyz`, `lacuna stage` and an in-process run watch.
#[derive(Clone, Debug, PartialEq)]
pub enum StageState {
    Running,
    /// Stopped or drained on request.
    Stopped,
    /// It can do no more work: its feed or actor died, or an outcome could not be published.
    Failed(String),
}

/// The shared, watchable state of one running stage.
#[derive(Clone)]
pub(super) struct Health {
    pub(super) name: &'static str,
    pub(super) state: Arc<watch::Sender<StageState>>,
}

impl Health {
    pub(super) fn fail(&self, reason: String) {
        if self.leave_running(StageState::Failed(reason.clone())) {
            METRICS.stage_failures.with_label_values(&[self.name]).inc();
            tracing::error!(stage = self.name, %reason, "stage failed");
        }
    }

    pub(super) fn stop(&self) {
        self.leave_running(StageState::Stopped);
    }

    /// Moves a running stage to `next`; a stage that already stopped or failed stays as it is.
    fn leave_running(&self, next: StageState) -> bool {
        self.state.send_if_modified(|state| {
            let running = *state == StageState::Running;
            if running {
                *state = next;
            }
            running
        })
    }
}
