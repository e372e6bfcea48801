//! Leaving the process before `main` returns (a Kafka transaction that failed ends its process with
//! status 75): what must end first is registered here, and [`exit`] runs it before the process goes.
//!
//! `std::process::exit` drops nothing, and the C runtime's `atexit` order is not ours: a CUDA
//! session torn down after the CUDA driver aborts the process (so the status 75 a restart policy
//! reads becomes a SIGABRT), and spans still queued for export are lost, those of the failure
//! included. `main` runs the same hooks on its way out.

use std::sync::Mutex;

/// A hook's name (what it ends) and the function that ends it.
type Hook = (&'static str, fn());

/// What runs before the process exits, in the order registered, each once.
static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// Runs `hook` before the process exits, once, whether through [`exit`] or out of `main`. A second
/// registration under the same `name` is ignored.
pub fn at_exit(name: &'static str, hook: fn()) {
    let mut hooks = HOOKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if !hooks.iter().any(|(registered, _)| *registered == name) {
        hooks.push((name, hook));
    }
}

/// Runs every registered hook now, in order, and forgets them; the names of those run.
pub fn run_exit_hooks() -> Vec<&'static str> {
    let hooks = std::mem::take(&mut *HOOKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    for (_, hook) in &hooks {
        hook();
    }
    hooks.into_iter().map(|(name, _)| name).collect()
}

/// How long the hooks and the C runtime's exit handlers get before the process ends without them.
const GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs the hooks, then ends the process with `code`. A hook or a library's exit handler that never
/// returns would keep a process that decided to end alive, not ready and consuming nothing, which
/// no restart policy restarts: past [`GRACE`] a watchdog ends it at once, with the same status.
pub fn exit(code: i32) -> ! {
    let _ = std::thread::Builder::new().name("exit-watchdog".into()).spawn(move || {
        std::thread::sleep(GRACE);
        // SAFETY: _exit ends the process without running anything more, which is the point.
        unsafe { libc::_exit(code) }
    });
    run_exit_hooks();
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn hooks_run_once_in_order_and_a_name_registers_once() {
        at_exit("first", || {
            RUNS.fetch_add(1, Ordering::SeqCst);
        });
        at_exit("second", || {
            RUNS.fetch_add(10, Ordering::SeqCst);
        });
        at_exit("first", || {
            RUNS.fetch_add(100, Ordering::SeqCst);
        });
        assert_eq!(run_exit_hooks(), ["first", "second"]);
        assert_eq!(RUNS.load(Ordering::SeqCst), 11);
        assert!(run_exit_hooks().is_empty(), "a hook runs once");
    }

    /// A process that decided to end (status 75, to be restarted) ends, with that status, even when
    /// what must end first never returns. On three Kafka nodes a stage logged its exit and was still
    /// there 5 minutes later: not ready, consuming nothing, and restarted by nothing. Run as a child
    /// process of this very test, which the exit ends.
    #[test]
    fn a_hook_that_never_returns_does_not_keep_an_exiting_process_alive() {
        const NAME: &str = "telemetry::exit::tests::a_hook_that_never_returns_does_not_keep_an_exiting_process_alive";
        if std::env::var_os("LACUNA_EXIT_PROBE").is_some() {
            at_exit("stuck", || {
                loop {
                    std::thread::park();
                }
            });
            exit(75);
        }
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--test-threads", "1"])
            .env("LACUNA_EXIT_PROBE", "1")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > std::time::Duration::from_secs(60) {
                child.kill().unwrap();
                panic!("the process was still there a minute after it decided to exit");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        assert_eq!(status.code(), Some(75), "{status:?}");
    }
}
