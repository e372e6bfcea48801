//! A `lacuna stage retrieve` process of VANILLA that follows the documents topic into a folder of its
//! own, or a `lacuna indexer` that applies it to a Meilisearch index, and its readiness: what `lacuna
//! bench freshness` times and the live-corpus tests kill.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::config::Settings;

pub struct Replica {
    child: Child,
    /// Where its metrics and `/readyz` answer; a replica started again on it is the same replica to
    /// anyone watching.
    pub port: u16,
}

impl Replica {
    /// Starts `binary` (a `lacuna` executable) as a retrieve replica on the brokers, topic prefix,
    /// partitions, commit interval and passage length of `settings`, following the documents topic
    /// into `folder`, with its metrics on 127.0.0.1:`port`. Its log goes to `folder`.log.
    pub fn start(binary: &Path, settings: &Settings, folder: &Path, port: u16) -> anyhow::Result<Replica> {
        let child = command(binary, settings, port)
            .env("LACUNA__SEARCH__FOLLOW_DOCUMENTS", "true")
            .env("LACUNA__SEARCH__INDEX_DIR", folder)
            .args(["stage", "retrieve", "--pipeline", "vanilla"])
            .stderr(std::fs::File::create(folder.with_extension("log"))?)
            .spawn()?;
        Ok(Replica { child, port })
    }

    /// Starts `binary` as `lacuna indexer` on the same settings, into the Meilisearch index of
    /// `settings` (its API key from the environment, as always). Its log goes to `log`.
    pub fn start_indexer(binary: &Path, settings: &Settings, log: &Path, port: u16) -> anyhow::Result<Replica> {
        let meili = &settings.search.meilisearch;
        let child = command(binary, settings, port)
            .env("LACUNA__SEARCH__BACKEND", "meilisearch")
            .env("LACUNA__SEARCH__MEILISEARCH__URL", &meili.url)
            .env("LACUNA__SEARCH__MEILISEARCH__INDEX", &meili.index)
            .env("LACUNA__SEARCH__MEILISEARCH__BATCH_SIZE", meili.batch_size.to_string())
            .arg("indexer")
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        Ok(Replica { child, port })
    }

    /// Starts `binary` as `lacuna stage STAGE --pipeline PIPELINE` on the same settings, calling the
    /// LLM of `settings`. Anything else it takes from this process's environment, as every `lacuna`
    /// does (`LACUNA__ONNX__EXECUTION_PROVIDER`, the model paths). Its log goes to `log`.
    pub fn start_stage(
        binary: &Path,
        settings: &Settings,
        (stage, pipeline): (&str, &str),
        log: &Path,
        port: u16,
    ) -> anyhow::Result<Replica> {
        let delivery = serde_json::to_value(settings.bus.delivery)?;
        let child = command(binary, settings, port)
            .env("LACUNA__LLM__BASE_URL", &settings.llm.base_url)
            .env("LACUNA__LLM__CACHE", settings.llm.cache.to_string())
            .env("LACUNA__BUS__DELIVERY", delivery.as_str().unwrap_or("at_least_once"))
            .args(["stage", stage, "--pipeline", pipeline])
            .stderr(std::fs::File::create(log)?)
            .spawn()?;
        Ok(Replica { child, port })
    }

    /// Waits until it is ready (caught up with the topic), at most `within`; an error when it exits first.
    pub fn wait_ready(&mut self, within: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        while !ready(self.port) {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("a replica exited before it was ready: {status}");
            }
            anyhow::ensure!(started.elapsed() < within, "a replica was not ready within {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then waits for it to drain and exit; how it exited.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        self.child.wait().ok()
    }

    /// SIGKILL: no drain, no last commit.
    pub fn kill(&mut self) {
        let _ = Command::new("kill").args(["-9", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `lacuna` command on the brokers, topic prefix, partitions, commit interval and passage length
/// of `settings`, its metrics on 127.0.0.1:`port`.
fn command(binary: &Path, settings: &Settings, port: u16) -> Command {
    let mut command = Command::new(binary);
    command
        .env("LACUNA__KAFKA__BROKERS", &settings.kafka.brokers)
        .env("LACUNA__KAFKA__TOPIC_PREFIX", &settings.kafka.topic_prefix)
        .env("LACUNA__KAFKA__PARTITIONS", settings.kafka.partitions.to_string())
        .env("LACUNA__SEARCH__COMMIT_INTERVAL_MS", settings.search.commit_interval_ms.to_string())
        .env("LACUNA__SEARCH__PASSAGE_WORDS", settings.search.passage_words.to_string())
        .env("LACUNA__METRICS__LISTEN", format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null());
    command
}

/// A port free on 127.0.0.1 now.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether `/readyz` on 127.0.0.1:`port` answers 200.
pub fn ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(stream, "GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    stream.read_to_string(&mut reply).is_ok() && reply.starts_with("HTTP/1.1 200")
}
