//! A MIGRES cluster for the broker tests: the real broker's address, per-test topic prefixes, and
//! each stage as its own `lacuna stage` process.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;

use lacuna::config::Settings;
use lacuna::pipelines::PipelineKind;
use lacuna::topics::kafka::KafkaBus;
use lacuna::topics::{QuestionEvent, VersionedAnswer};
use serde_json::json;

pub fn brokers() -> String {
    std::env::var("LACUNA_TEST_KAFKA")
        .expect("LACUNA_TEST_KAFKA is not set: run the tests with scripts/test.sh, which starts a broker")
}

/// One Apache Kafka node (`scripts/kafka.sh`) on ports of a test's own, for a test that stops or
/// crashes its broker (the shared one serves other tests meanwhile); stopped on drop.
pub struct OwnBroker {
    port: String,
    controller_port: String,
    nodes: u16,
}

impl OwnBroker {
    pub fn start() -> OwnBroker {
        let broker = OwnBroker::unstarted();
        broker.run(&["start"]);
        broker
    }

    /// One node's ports of its own, not started yet (`start`, `start_secure`, `start_traced`).
    pub fn unstarted() -> OwnBroker {
        let [client, controller] = super::free_ports();
        OwnBroker { port: client.to_string(), controller_port: controller.to_string(), nodes: 1 }
    }

    /// `scripts/kafka.sh start` on its ports with `tracer` (`strace` with a fault to inject)
    /// in front; returns what the script printed. The tracer stays attached to the node it
    /// started, so it is stopped (which lets the node go on) once the script printed its last line.
    pub fn start_traced(&self, tracer: &[&str]) -> String {
        let out = std::env::temp_dir().join(format!("lacuna-kafka-traced-{}.log", self.port));
        let file = std::fs::File::create(&out).unwrap();
        let mut traced = Command::new(tracer[0])
            .args(&tracer[1..])
            .args(["scripts/kafka.sh", "start", "--port", &self.port, "--controller-port", &self.controller_port])
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|error| panic!("{}: {error} (scripts/test.sh installs it)", tracer[0]));
        let started = std::time::Instant::now();
        let text = loop {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            if text.lines().any(|line| line.starts_with("kafka: "))
                || started.elapsed() > std::time::Duration::from_secs(120)
            {
                break text;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        let _ = traced.kill();
        let _ = traced.wait();
        text
    }

    /// Three combined nodes on `port`, `port` + 2 and `port` + 4 (their controllers one above), every
    /// internal topic replicated three times with `min.insync.replicas=2`.
    pub fn start_three(port: u16) -> OwnBroker {
        let broker = OwnBroker { port: port.to_string(), controller_port: String::new(), nodes: 3 };
        let status =
            Command::new("scripts/kafka.sh").args(["start", "--nodes", "3", "--port", &broker.port]).status().unwrap();
        assert!(status.success(), "scripts/kafka.sh start --nodes 3");
        broker
    }

    /// One node over SASL_SSL with SCRAM-SHA-512 and the StandardAuthorizer (`start --secure`):
    /// `users` and the super user `admin`, each with the password `<user>-secret`.
    pub fn start_secure(users: &[&str]) -> OwnBroker {
        let broker = OwnBroker::unstarted();
        broker.run(&["start", "--secure", "--users", &users.join(",")]);
        broker
    }

    /// The librdkafka properties of a client of a `--secure` node, but for its `sasl.username`.
    pub fn sasl_properties(&self) -> String {
        let cache = std::env::var("LACUNA_CACHE")
            .unwrap_or_else(|_| format!("{}/.cache/lacuna", std::env::var("HOME").unwrap()));
        let ca = format!("{cache}/run/kafka-{}/tls/ca.crt", self.port);
        format!("security.protocol=SASL_SSL;sasl.mechanisms=SCRAM-SHA-512;ssl.ca.location={ca}")
    }

    /// Adds (`add`) or removes (`remove`) ACLs, as `lacuna acls` prints them, on a `--secure` node.
    pub fn acls(&self, action: &str, table: &str) {
        let file = std::env::temp_dir().join(format!("lacuna-acls-{}-{}", self.port, std::process::id()));
        std::fs::write(&file, table).unwrap();
        let status = Command::new("scripts/kafka.sh")
            .args(["acls", action, file.to_str().unwrap(), "--port", &self.port])
            .status()
            .unwrap();
        assert!(status.success(), "scripts/kafka.sh acls {action}");
    }

    /// `scripts/kafka.sh COMMAND --node NODE` on a cluster of three: `restart --crash`, `kill`, `resume`.
    pub fn run_node(&self, command: &[&str], node: i32) {
        let status = Command::new("scripts/kafka.sh")
            .args(command)
            .args(["--node", &node.to_string(), "--port", &self.port])
            .status()
            .unwrap();
        assert!(status.success(), "scripts/kafka.sh {command:?} --node {node}");
    }

    /// The node coordinating the transactions of the first transactional id that starts with
    /// `prefix` (Kafka's TransactionsCommand), once one is listed.
    pub fn transaction_coordinator(&self, prefix: &str) -> i32 {
        let started = std::time::Instant::now();
        loop {
            let out = Command::new("scripts/kafka.sh").args(["transactions", "--port", &self.port]).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let found = text.lines().find_map(|line| {
                let mut columns = line.split_whitespace();
                let id = columns.next()?;
                id.starts_with(prefix).then(|| columns.next()?.parse().ok())?
            });
            if let Some(node) = found {
                return node;
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(60), "no transactional id {prefix}*: {text}");
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }

    /// `scripts/kafka.sh COMMAND...` on its ports, which must succeed: `start` (fresh storage),
    /// `stop`, `restart` (TERM, then the same storage) and `restart --crash` (KILL, as a crash).
    pub fn run(&self, command: &[&str]) {
        let node: &[&str] = if command.first() == Some(&"restart") { &["--node", "1"] } else { &[] };
        let status = Command::new("scripts/kafka.sh")
            .args(command)
            .args(node)
            .args(["--port", &self.port, "--controller-port", &self.controller_port])
            .status()
            .unwrap();
        assert!(status.success(), "scripts/kafka.sh {command:?}");
    }

    /// Its address, for `kafka.brokers` (every node's).
    pub fn address(&self) -> String {
        let first: u16 = self.port.parse().unwrap();
        (0..self.nodes).map(|i| format!("127.0.0.1:{}", first + 2 * i)).collect::<Vec<_>>().join(",")
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = Command::new("scripts/kafka.sh").args(["stop", "--port", &self.port]).status();
    }
}

/// Copies a stage's log to the test's, each line under `label`: the stages of a cluster log side by
/// side, and a failure is read by which process said what.
fn label_lines(log: std::process::ChildStderr, label: String) {
    use std::io::BufRead;
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(log).lines().map_while(Result::ok) {
            eprintln!("{label} {line}");
        }
    });
}

/// A topic prefix no other test run uses.
pub fn prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("t{nanos}-{test}.")
}

pub fn settings(test: &str, llm_url: &str) -> Settings {
    let mut settings = super::settings(llm_url);
    settings.kafka.brokers = brokers();
    settings.kafka.topic_prefix = prefix(test);
    settings.kafka.partitions = 4;
    settings.kafka.session_timeout_ms = 6000;
    settings.kafka.max_poll_interval_ms = 10000;
    // Settings refuse a drain as long as the poll interval.
    settings.kafka.drain_timeout_ms = 5000;
    super::answer_checks_off(&mut settings);
    settings
}

pub async fn bus(settings: &Settings) -> Arc<KafkaBus> {
    let bus = KafkaBus::new(settings.kafka.clone(), &settings.bus).unwrap();
    bus.ensure_topics(&lacuna::topics::Topic::ALL).await.unwrap();
    Arc::new(bus)
}

/// The six stages as separate `lacuna stage` processes, killed on drop. Each serves its metrics on
/// a port of its own, so a test can see what it is doing.
pub struct Cluster {
    env: Vec<(String, String)>,
    stages: Vec<(String, Child)>,
    metrics_ports: std::collections::HashMap<String, u16>,
    /// Each name's stage and `kafka.instance_id`, so a restart runs the same replica again.
    replicas: std::collections::HashMap<String, (String, String)>,
    /// On a `--secure` node ([`OwnBroker::sasl_properties`]): every process a principal of its own.
    sasl: Option<String>,
    /// The supervised sink ([`Cluster::start_sink`]): its process and arguments.
    sink: Option<(Child, Vec<String>)>,
    /// How many times the supervised sink exited before it had every answer and was started again.
    pub sink_restarts: usize,
    /// The stages that exited on their own and were started again ([`Cluster::restart_if_exited`]),
    /// once each time.
    pub restarted: Vec<String>,
}

impl Cluster {
    pub fn start(settings: &Settings, llm_url: &str) -> Cluster {
        Self::start_with_env(settings, llm_url, &[])
    }

    /// [`Cluster::start`] with more environment for every process.
    pub fn start_with_env(settings: &Settings, llm_url: &str, extra: &[(&str, &str)]) -> Cluster {
        Self::start_as(Self::environment(settings, llm_url, extra), None)
    }

    /// What every process of the cluster runs with.
    fn environment(settings: &Settings, llm_url: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = vec![
            ("LACUNA__KAFKA__BROKERS".into(), settings.kafka.brokers.clone()),
            ("LACUNA__KAFKA__TOPIC_PREFIX".into(), settings.kafka.topic_prefix.clone()),
            ("LACUNA__KAFKA__PARTITIONS".into(), "4".into()),
            ("LACUNA__KAFKA__SESSION_TIMEOUT_MS".into(), "6000".into()),
            ("LACUNA__KAFKA__MAX_POLL_INTERVAL_MS".into(), "10000".into()),
            ("LACUNA__KAFKA__DRAIN_TIMEOUT_MS".into(), "5000".into()),
            ("LACUNA__LLM__BASE_URL".into(), llm_url.into()),
            ("LACUNA__SEARCH__INDEX_DIR".into(), super::hotpot_index().display().to_string()),
            // One passage per question keeps the re-ranker, which all processes share two cores
            // with, from dominating the test's time.
            ("LACUNA__MIGRES__RETRIEVE_TOP_N".into(), "1".into()),
            // Static membership: a stage restarted under its name takes its partitions back at once.
            // (The test broker never expires a SIGKILLed member, and a dead group leader would
            // stall the group; Apache Kafka expires it after session.timeout.ms.)
            ("LACUNA__KAFKA__INSTANCE_ID".into(), "replica-0".into()),
        ];
        env.extend(super::ANSWER_CHECKS_OFF.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        env
    }

    /// The stages on a `--secure` node, each as the principal named after it (`User:retrieve`, with
    /// the password `retrieve-secret`); `submit` and `answers` as `User:submit` and
    /// `User:answers`, any other command as `User:admin`.
    pub fn start_secure(settings: &Settings, llm_url: &str, sasl: String) -> Cluster {
        Self::start_as(Self::environment(settings, llm_url, &[]), Some(sasl))
    }

    fn start_as(env: Vec<(String, String)>, sasl: Option<String>) -> Cluster {
        let mut cluster = Cluster {
            env,
            stages: Vec::new(),
            metrics_ports: Default::default(),
            replicas: Default::default(),
            sasl,
            sink: None,
            sink_restarts: 0,
            restarted: Vec::new(),
        };
        for stage in PipelineKind::Migres.stages() {
            cluster.spawn(stage.name);
        }
        cluster
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lacuna"));
        command.args(args).envs(self.env.iter().cloned());
        if let Some(sasl) = &self.sasl {
            let principal = match args {
                ["stage", stage, ..] => *stage,
                ["submit", ..] => "submit",
                ["answers", ..] => "answers",
                _ => "admin",
            };
            as_principal(&mut command, sasl, principal);
        }
        command
    }

    /// `lacuna answers` into `out`, exiting once `expect` questions have their record, or after
    /// `idle_s` seconds with no new one.
    pub fn sink(&self, out: &Path, expect: usize, idle_s: u32) -> Child {
        let (expect, idle_s) = (expect.to_string(), idle_s.to_string());
        let args = ["answers", "--out", out.to_str().unwrap(), "--expect", &expect, "--idle-timeout-s", &idle_s];
        self.command(&args).spawn().unwrap()
    }

    /// [`Cluster::sink`], supervised as a Deployment would: [`Cluster::restart_sink_if_failed`]
    /// starts it again when it exits before it has every answer (its consumer fenced, say).
    pub fn start_sink(&mut self, out: &Path, expect: usize, idle_s: u32) {
        let child = self.sink(out, expect, idle_s);
        let args = [out.to_str().unwrap().to_string(), expect.to_string(), idle_s.to_string()];
        self.sink = Some((child, args.to_vec()));
    }

    /// Starts the supervised sink again if it exited with a failure; whether it did. At most
    /// twice, so a sink that times out on a stream that really stopped still fails the test.
    pub fn restart_sink_if_failed(&mut self) -> bool {
        let Some((child, args)) = &mut self.sink else { return false };
        let failed = matches!(child.try_wait(), Ok(Some(status)) if !status.success());
        if !failed || self.sink_restarts >= 2 {
            return false;
        }
        let (out, expect, idle_s) = (PathBuf::from(&args[0]), args[1].parse().unwrap(), args[2].parse().unwrap());
        self.sink_restarts += 1;
        eprintln!("cluster: the sink exited before it had every answer and was started again");
        self.start_sink(&out, expect, idle_s);
        true
    }

    /// Waits for the supervised sink to exit with every answer, starting it again as
    /// [`Cluster::restart_sink_if_failed`] does; its last exit status.
    pub fn wait_sink(&mut self) -> std::process::ExitStatus {
        loop {
            let status = self.sink.as_mut().expect("a supervised sink").0.wait().unwrap();
            if status.success() || !self.restart_sink_if_failed() {
                return status;
            }
        }
    }

    /// The stage `name` (again, if it ran before: the same replica).
    pub fn spawn(&mut self, name: &str) {
        let (stage, instance) =
            self.replicas.get(name).cloned().unwrap_or_else(|| (name.to_string(), "replica-0".to_string()));
        self.spawn_replica(&stage, name, &instance);
    }

    /// A replica of `stage`, known here as `name`, under `kafka.instance_id` = `instance`: with
    /// another instance than the first, it joins the stage's group beside it.
    pub fn spawn_replica(&mut self, stage: &str, name: &str, instance: &str) {
        // A restarted stage keeps its port: whatever watches it finds it again.
        let port = *self.metrics_ports.entry(name.to_string()).or_insert_with(free_port);
        let listen = format!("127.0.0.1:{port}");
        let mut child = self
            .command(&["stage", stage])
            .env("LACUNA__METRICS__LISTEN", listen)
            .env("LACUNA__KAFKA__INSTANCE_ID", instance)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        label_lines(child.stderr.take().unwrap(), format!("{name}[{}]", child.id()));
        self.replicas.insert(name.to_string(), (stage.to_string(), instance.to_string()));
        self.stages.push((name.to_string(), child));
    }

    /// The stage's process id.
    pub fn pid(&self, name: &str) -> u32 {
        self.stages.iter().find(|(n, _)| n == name).map(|(_, child)| child.id()).unwrap()
    }

    /// Restarts the stage if its process has exited, as a Deployment would; whether it had.
    pub fn restart_if_exited(&mut self, name: &str) -> bool {
        let index = self.stages.iter().position(|(n, _)| n == name).unwrap();
        if !matches!(self.stages[index].1.try_wait(), Ok(Some(_))) {
            return false;
        }
        self.stages.remove(index);
        self.restarted.push(name.to_string());
        self.spawn(name);
        true
    }

    /// The names of the stage processes started, in order.
    pub fn names(&self) -> Vec<String> {
        self.stages.iter().map(|(name, _)| name.clone()).collect()
    }

    /// What the stage's `/metrics` says of `lacuna_stage_in_flight`: events it is processing now
    /// (None while it does not answer).
    pub fn in_flight(&self, name: &str) -> Option<i64> {
        let text = scrape(self.metrics_ports[name])?;
        let series = format!("lacuna_stage_in_flight{{stage=\"{name}\"}} ");
        text.lines().find_map(|line| line.strip_prefix(&series)?.trim().parse().ok())
    }

    /// The stage's `/metrics` as text (None while it does not answer).
    pub fn metrics(&self, name: &str) -> Option<String> {
        scrape(self.metrics_ports[name])
    }

    /// Sends `signal` to the stage once its metrics show work in flight, so the signal interrupts
    /// work rather than an idle process. Panics if the stage never has any within `within`.
    pub fn signal_at_work(&mut self, name: &str, signal: &str, within: std::time::Duration) -> Child {
        let started = std::time::Instant::now();
        while self.in_flight(name).unwrap_or(0) == 0 {
            assert!(started.elapsed() < within, "{name} had no work in flight within {within:?}");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        self.signal(name, signal)
    }

    /// Prints what a stalled run is read from: each stage's readiness and the metrics that say
    /// whether it holds work, waits on paused partitions or lags, then the broker's own view (every
    /// group's lag by partition, the transactions open past their timeout) through `scripts/kafka.sh`.
    pub fn print_stall(&self) {
        const SERIES: [&str; 6] = [
            "lacuna_stage_in_flight",
            "lacuna_kafka_paused_partitions",
            "lacuna_kafka_consumer_lag",
            "lacuna_kafka_waiting_records",
            "lacuna_kafka_transaction_aborts_total",
            "lacuna_kafka_producer_renewals_total",
        ];
        for (name, child) in &self.stages {
            eprintln!("stall: {name} ready={}", self.ready(name));
            let text = self.metrics(name).unwrap_or_default();
            for line in text.lines().filter(|line| SERIES.iter().any(|series| line.starts_with(series))) {
                eprintln!("stall: {name} {line}");
            }
            // A stage holding an event this long is stuck somewhere: where, every thread's stack says.
            if self.in_flight(name).unwrap_or(0) > 0 {
                let out = std::env::temp_dir().join(format!("lacuna-stall-{name}-{}.txt", child.id()));
                let stacks = Command::new("gdb")
                    .args(["-p", &child.id().to_string(), "-batch", "-ex", "thread apply all bt"])
                    .output();
                if let Ok(stacks) = stacks {
                    let _ = std::fs::write(&out, &stacks.stdout);
                    eprintln!("stall: {name} holds an event: its threads' stacks in {}", out.display());
                }
            }
        }
        let brokers = self.env.iter().find(|(key, _)| key == "LACUNA__KAFKA__BROKERS").map(|(_, value)| value.as_str());
        let port = brokers.and_then(|all| all.split(',').next()?.rsplit(':').next()).unwrap_or_default();
        for command in ["groups", "hanging"] {
            let _ = Command::new("scripts/kafka.sh").args([command, "--port", port]).status();
        }
    }

    /// Whether the stage's `/readyz` answers 200.
    pub fn ready(&self, name: &str) -> bool {
        get(self.metrics_ports[name], "/readyz").is_some_and(|reply| reply.starts_with("HTTP/1.1 200"))
    }

    /// Waits for the stage to be ready: a stage that has everything it needs still takes its time
    /// (its transactional id's coordinator, its first assignment) on a loaded machine. Panics after
    /// `within`.
    pub fn wait_ready(&self, name: &str, within: std::time::Duration) {
        let started = std::time::Instant::now();
        while !self.ready(name) {
            assert!(started.elapsed() < within, "{name} was not ready within {within:?}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Sends `signal` to the stage and keeps it in the cluster (SIGSTOP and SIGCONT, say).
    pub fn send(&self, name: &str, signal: &str) {
        Command::new("kill").args([signal, &self.pid(name).to_string()]).status().unwrap();
    }

    pub fn signal(&mut self, name: &str, signal: &str) -> Child {
        let index = self.stages.iter().position(|(n, _)| n == name).unwrap();
        let (_, child) = self.stages.remove(index);
        Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
        child
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some((child, _)) = &mut self.sink {
            let _ = child.kill();
            let _ = child.wait();
        }
        for (_, child) in &mut self.stages {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `count` questions of the HotpotQA set (repeated past its end), with ids q0, q1, ...
pub fn questions(count: usize) -> Vec<QuestionEvent> {
    let text = std::fs::read_to_string(super::data_dir().join("hotpotqa/questions.jsonl")).unwrap();
    let questions: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["question"].as_str().unwrap().to_string())
        .collect();
    (0..count).map(|n| QuestionEvent::new(format!("q{n}"), questions[n % questions.len()].clone())).collect()
}

/// Writes [`questions`] as a `lacuna submit` file and returns their ids.
pub fn write_questions(path: &Path, count: usize) -> BTreeSet<String> {
    let questions = questions(count);
    let lines: Vec<String> =
        questions.iter().map(|q| json!({"id": q.id, "question": q.question}).to_string()).collect();
    std::fs::write(path, lines.join("\n")).unwrap();
    questions.into_iter().map(|q| q.id).collect()
}

pub fn answer_ids(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        // The sink may be writing the last line right now.
        .filter_map(|l| serde_json::from_str::<VersionedAnswer>(l).ok())
        .map(|answer| answer.record.question_id().to_string())
        .collect()
}

/// A port free now, for a process to bind in a moment.
fn free_port() -> u16 {
    super::free_ports::<1>()[0]
}

/// The body of `/metrics` on `port`.
fn scrape(port: u16) -> Option<String> {
    let reply = get(port, "/metrics")?;
    Some(reply.split_once("\r\n\r\n")?.1.to_string())
}

/// Has `command` connect to a `--secure` node (its client properties `sasl`, from
/// [`OwnBroker::sasl_properties`]) as `User:principal`, whose password is `<principal>-secret`.
pub fn as_principal<'a>(command: &'a mut Command, sasl: &str, principal: &str) -> &'a mut Command {
    command
        .env("LACUNA__KAFKA__PROPERTIES", format!("{sasl};sasl.username={principal}"))
        .env("LACUNA__KAFKA__SECRET_PROPERTIES", "sasl.password=LACUNA_TEST_SASL_PASSWORD")
        .env("LACUNA_TEST_SASL_PASSWORD", format!("{principal}-secret"))
}

/// A plain `GET path` on 127.0.0.1:`port`, the whole reply; None when nothing answers.
pub fn get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    Some(reply)
}

/// A consumer's configuration for reading topics raw, as `isolation` reads them, committing nothing.
pub fn raw_reader(settings: &Settings, isolation: &str) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.kafka.brokers)
        .set("group.id", format!("{}raw-reader", settings.kafka.topic_prefix))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation);
    // A secured cluster's client properties (the raw reader is the test's, so a password may be plain).
    for property in &settings.kafka.properties {
        if let Some((key, value)) = property.split_once('=') {
            config.set(key, value);
        }
    }
    config
}

/// The offsets and keys of the records of `topic`'s `partition` from `offset` to its end, as
/// `isolation` reads them ("read_committed" or "read_uncommitted").
pub fn raw_records_from(
    settings: &Settings,
    topic: &str,
    (partition, offset): (i32, i64),
    isolation: &str,
) -> Vec<(i64, String)> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    let consumer: BaseConsumer = raw_reader(settings, isolation).set("enable.partition.eof", "true").create().unwrap();
    let mut list = rdkafka::TopicPartitionList::new();
    list.add_partition_offset(
        &format!("{}{topic}", settings.kafka.topic_prefix),
        partition,
        rdkafka::Offset::Offset(offset),
    )
    .unwrap();
    consumer.assign(&list).unwrap();
    let (mut records, started) = (Vec::new(), std::time::Instant::now());
    while started.elapsed() < std::time::Duration::from_secs(30) {
        match consumer.poll(std::time::Duration::from_millis(200)) {
            Some(Ok(message)) => records
                .push((message.offset(), String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned())),
            Some(Err(KafkaError::PartitionEOF(_))) => return records,
            _ => {}
        }
    }
    panic!("{topic} [{partition}] has no end in 30 s");
}

/// The question ids of every record on the raw answers topic, read as `isolation` reads them
/// ("read_committed" or "read_uncommitted"), from its start to its end: what the sink or a replica
/// sees before any dedupe.
pub fn raw_answer_keys(settings: &Settings, isolation: &str) -> Vec<String> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let topic = format!("{}answers", settings.kafka.topic_prefix);
    let consumer: BaseConsumer = raw_reader(settings, isolation).set("auto.offset.reset", "earliest").create().unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let (mut keys, mut quiet) = (Vec::new(), std::time::Instant::now());
    // Done once nothing came for 5 s (the partitions are assigned within that, too).
    while quiet.elapsed() < std::time::Duration::from_secs(5) {
        if let Some(Ok(message)) = consumer.poll(std::time::Duration::from_millis(200)) {
            keys.push(String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned());
            quiet = std::time::Instant::now();
        }
    }
    keys
}
