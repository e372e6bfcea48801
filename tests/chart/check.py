"""Chart tests: lint helm/lacuna, render it with each helm/lacuna/ci/*.yaml, validate the manifests
against the Kubernetes schemas, and check what users rely on: a Deployment, a scaler and a disruption
budget per stage of the pipeline, never more replicas than partitions, a config the real binary loads,
a dashboard whose queries use only metrics Lacuna exports.

Run by scripts/chart-test.sh (which installs helm and kubernetes-validate) with HELM, KUBERNETES_VALIDATE
and LACUNA_BIN set. Exits non-zero with the failures listed.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "helm", "lacuna")
HELM = os.environ["HELM"]
VALIDATE = os.environ["KUBERNETES_VALIDATE"]
LACUNA = os.environ["LACUNA_BIN"]
K8S_VERSION = os.environ.get("LACUNA_K8S_VERSION", "1.30.0")

# The pipelines as the binary declares them (`lacuna graph --format json`): the chart must run exactly
# these stages, the one-replica ones as one replica, and create exactly these topics.
GRAPH = json.loads(subprocess.run([LACUNA, "graph", "--format", "json"], capture_output=True, text=True, check=True).stdout)
PIPELINES = {name: [s["name"] for s in p["stages"]] for name, p in GRAPH.items()}
# Stages that run as exactly one replica and are never autoscaled.
SINGLETONS = {s["name"] for p in GRAPH.values() for s in p["stages"] if s["one_replica"]}
# What each ci values file must produce: pipeline, scaler kind, partitions.
EXPECTED = {
    "default-values.yaml": ("migres", "HorizontalPodAutoscaler", 8),
    "keda-values.yaml": ("migres", "ScaledObject", 4),
    "vanilla-values.yaml": ("vanilla-s", None, 8),
    "raisf-values.yaml": ("raisf", "HorizontalPodAutoscaler", 8),
    "meilisearch-values.yaml": ("migres", "HorizontalPodAutoscaler", 8),
}

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
    return condition


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


def render(values_file, *extra):
    result = run([HELM, "template", "t", CHART, "-f", values_file, *extra])
    return result


def exported_metrics():
    with open(os.path.join(ROOT, "docs", "metrics.md")) as f:
        return set(re.findall(r"^\| `(lacuna_[a-z_]+)`", f.read(), re.M))


def check_dashboard(configmap, label):
    dashboard = json.loads(configmap["data"]["lacuna.json"])
    known = exported_metrics()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    check(len(exprs) >= 15, f"{label}: the dashboard has only {len(exprs)} queries")
    for expr in exprs:
        for name in re.findall(r"lacuna_[a-z_]+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            check(base in known, f"{label}: dashboard query uses {name}, which docs/metrics.md does not list")
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for needed in ["consumer lag", "latency", "tokens", "iterations", "outcomes", "dead letters", "paused"]:
        check(needed in titles, f"{label}: no dashboard panel about {needed}")


def check_config_loads(configmap, label):
    """The rendered lacuna.toml must load in the real binary (unknown keys are errors there)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "lacuna.toml")
        with open(config, "w") as f:
            f.write(configmap["data"]["lacuna.toml"])
        corpus = os.path.join(tmp, "corpus.jsonl")
        open(corpus, "w").close()
        # Loaded, then used to build a local index: a Meilisearch config is loaded the same way, but its
        # server is not there to build on.
        env = dict(os.environ, LACUNA__SEARCH__BACKEND="tantivy")
        result = run([LACUNA, "--config", config, "index", "--corpus", corpus, "--index-dir", os.path.join(tmp, "i")], env=env)
        check(result.returncode == 0, f"{label}: the rendered config does not load: {result.stderr.strip()}")


def check_values_file(name):
    pipeline, scaler, partitions = EXPECTED[name]
    label = f"ci/{name}"
    values_file = os.path.join(CHART, "ci", name)
    result = render(values_file)
    if not check(result.returncode == 0, f"{label}: helm template failed: {result.stderr.strip()}"):
        return
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(result.stdout)
        rendered = f.name
    validation = run([VALIDATE, "--strict", "--quiet", "--no-warn", "-k", K8S_VERSION, rendered])
    os.unlink(rendered)
    check(validation.returncode == 0, f"{label}: manifests fail the Kubernetes {K8S_VERSION} schemas:\n{validation.stdout}{validation.stderr}")

    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in by_kind.get("Deployment", [])}
    serve = deployments.pop("serve", None)
    if name == "keda-values.yaml":
        check_serve(serve, by_kind, pipeline, label)
    else:
        check(serve is None, f"{label}: a serve Deployment though serve.enabled is false")
    indexer = deployments.pop("indexer", None)
    if name == "meilisearch-values.yaml":
        check_indexer(indexer, deployments, by_kind, label)
    else:
        check(indexer is None, f"{label}: an indexer Deployment though meilisearch.enabled is false")
    stages = [s.replace("_", "-") for s in PIPELINES[pipeline]]
    check(sorted(deployments) == sorted(stages), f"{label}: Deployments {sorted(deployments)}, expected {sorted(stages)}")

    configmaps = {c["metadata"]["name"]: c for c in by_kind.get("ConfigMap", [])}
    config = configmaps.get("t-lacuna-config")
    if check(config is not None, f"{label}: no config ConfigMap"):
        check_config_loads(config, label)
    dashboard = configmaps.get("t-lacuna-dashboard")
    if check(dashboard is not None, f"{label}: no dashboard ConfigMap"):
        check(dashboard["metadata"]["labels"].get("grafana_dashboard") == "1", f"{label}: dashboard lacks the sidecar label")
        check_dashboard(dashboard, label)

    for stage, deployment in deployments.items():
        pod = deployment["spec"]["template"]
        container = pod["spec"]["containers"][0]
        args = container["args"]
        check(args[args.index("stage") + 1].replace("_", "-") == stage, f"{label}: {stage} runs {args}")
        check(args[args.index("--pipeline") + 1] == pipeline, f"{label}: {stage} runs pipeline {args}")
        check(container.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", f"{label}: {stage} has no /readyz probe")
        check(container.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", f"{label}: {stage} has no /healthz probe")
        check("resources" in container and "requests" in container["resources"], f"{label}: {stage} has no resource requests")
        check(pod["metadata"].get("annotations", {}).get("checksum/config"), f"{label}: {stage} has no config checksum")
        if stage.replace("-", "_") in SINGLETONS:
            check(deployment["spec"].get("replicas") == 1, f"{label}: {stage} must run as one replica")
        elif scaler is None:
            replicas = deployment["spec"].get("replicas")
            check(replicas is not None and replicas <= partitions, f"{label}: {stage} has {replicas} replicas for {partitions} partitions")

    pdbs = {p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] for p in by_kind.get("PodDisruptionBudget", [])}
    check(pdbs == set(stages), f"{label}: disruption budgets for {sorted(pdbs)}")

    if scaler is not None:
        scalers = by_kind.get(scaler, [])
        targets = {s["spec"]["scaleTargetRef"]["name"] for s in scalers}
        names = {d["metadata"]["name"] for c, d in deployments.items() if c.replace("-", "_") not in SINGLETONS}
        check(targets == names, f"{label}: {scaler}s target {sorted(targets)}, expected {sorted(names)}")
        for s in scalers:
            top = s["spec"].get("maxReplicas", s["spec"].get("maxReplicaCount"))
            check(top <= partitions, f"{label}: {s['metadata']['name']} scales to {top} > {partitions} partitions")
            if scaler == "ScaledObject":
                trigger = s["spec"]["triggers"][0]
                component = s["metadata"]["labels"]["app.kubernetes.io/component"].replace("-", "_")
                check(trigger["type"] == "kafka" and trigger["metadata"]["consumerGroup"] == f"lacuna.{component}",
                      f"{label}: {s['metadata']['name']} does not scale on its stage's consumer group")

    if name == "keda-values.yaml":
        topics = by_kind.get("KafkaTopic", [])
        expected = sorted("lacuna." + t for t in GRAPH[pipeline]["topics"])
        check(sorted(t["spec"]["topicName"] for t in topics) == expected, f"{label}: KafkaTopics, expected {expected}")
        # A pipeline that fans out keeps the join's state in a compacted topic.
        fanning = render(values_file, "--set", "pipeline=raisf")
        state = [d for d in yaml.safe_load_all(fanning.stdout) if d and d["kind"] == "KafkaTopic"
                 and d["spec"]["topicName"].endswith("join_state")]
        check(len(state) == 1 and state[0]["spec"].get("config", {}).get("cleanup.policy") == "compact",
              f"{label} with pipeline=raisf: join_state is not a compacted topic")
        check(all(t["spec"]["partitions"] == partitions for t in topics), f"{label}: KafkaTopic partitions")
        check(len(by_kind.get("PodMonitor", [])) == 1, f"{label}: no PodMonitor")
        # The alerting rules reach the operator as they are in the file promtool tests (tests/prometheus.rs).
        rules = by_kind.get("PrometheusRule", [])
        with open(os.path.join(CHART, "alerts", "lacuna-rules.yaml")) as f:
            expected_rules = yaml.safe_load(f)
        check(len(rules) == 1 and rules[0]["spec"] == expected_rules
              and rules[0]["metadata"]["labels"].get("release") == "prometheus",
              f"{label}: the PrometheusRule is not alerts/lacuna-rules.yaml with its extra labels")
        # Kafka over SASL_SSL: plain properties in the config, secrets only as Secret references.
        configs = [c["data"]["lacuna.toml"] for c in by_kind.get("ConfigMap", []) if "lacuna.toml" in c.get("data", {})]
        check(len(configs) == 1 and '"security.protocol=SASL_SSL"' in configs[0]
              and '"sasl.password=LACUNA_KAFKA_SECRET_0"' in configs[0] and '"ssl.ca.pem=LACUNA_KAFKA_SECRET_1"' in configs[0],
              f"{label}: kafka.properties / secretProperties are not in lacuna.toml as expected")
        for component, d in deployments.items():
            env = {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0].get("env", [])}
            refs = [env.get(f"LACUNA_KAFKA_SECRET_{i}", {}).get("valueFrom", {}).get("secretKeyRef") for i in (0, 1)]
            check(refs == [{"name": "kafka-lacuna", "key": "password"}, {"name": "my-cluster-cluster-ca-cert", "key": "ca.crt"}],
                  f"{label}: {component} does not read the Kafka secrets from their Secrets: {refs}")
        # Traces: the endpoint in lacuna.toml, the exporter's headers only as a Secret reference.
        check(len(configs) == 1 and 'endpoint = "http://otel-collector.monitoring:4317"' in configs[0]
              and 'protocol = "grpc"' in configs[0] and "sampling_ratio = 0.25" in configs[0],
              f"{label}: [otel] is not in lacuna.toml as set")
        for component, d in list(deployments.items()) + [("serve", serve)]:
            env = {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0].get("env", [])}
            ref = env.get("OTEL_EXPORTER_OTLP_HEADERS", {}).get("valueFrom", {}).get("secretKeyRef")
            check(ref == {"name": "otlp-headers", "key": "headers"}, f"{label}: {component} does not read the OTLP headers from their Secret: {ref}")
        env = deployments["leaf"]["spec"]["template"]["spec"]["containers"][0].get("env", [])
        check(any(e["name"] == "LACUNA_LLM_API_KEY" and e["valueFrom"]["secretKeyRef"]["name"] == "openai" for e in env),
              f"{label}: the API key does not come from the Secret")
    else:
        check(not by_kind.get("PrometheusRule"), f"{label}: a PrometheusRule without the operator's API")
        job = by_kind.get("Job", [])
        check(len(job) == 1 and "topics" in job[0]["spec"]["template"]["spec"]["containers"][0]["args"],
              f"{label}: no topic-creating Job")


def check_serve(serve, by_kind, pipeline, label):
    """`lacuna serve` in front of the Kafka stages: its Deployment, its Service, its token from the
    Secret, and the stages publishing progress for it."""
    if not check(serve is not None, f"{label}: serve.enabled rendered no serve Deployment"):
        return
    container = serve["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    check(args[args.index("serve"):] == ["serve", "--transport", "kafka", "--pipeline", pipeline], f"{label}: serve runs {args}")
    env = {e["name"]: e for e in container.get("env", [])}
    check(env.get("LACUNA_SERVE_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef") == {"name": "lacuna-serve", "key": "token"},
          f"{label}: the serve token does not come from its Secret")
    check(env.get("LACUNA_SERVE_DOCUMENTS_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef")
          == {"name": "lacuna-serve-documents", "key": "token"},
          f"{label}: the document routes' token does not come from its Secret")
    check(env.get("LACUNA__SERVE__REPLICA_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name",
          f"{label}: serve replicas do not get their own consumer groups")
    check(container.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", f"{label}: serve has no /readyz probe")
    services = [s for s in by_kind.get("Service", []) if s["metadata"]["labels"].get("app.kubernetes.io/component") == "serve"]
    check(len(services) == 1 and services[0]["spec"]["selector"]["app.kubernetes.io/component"] == "serve"
          and services[0]["spec"]["ports"][0]["targetPort"] == "http", f"{label}: no Service in front of serve")
    config = [c["data"]["lacuna.toml"] for c in by_kind.get("ConfigMap", []) if "lacuna.toml" in c.get("data", {})][0]
    check("progress = true" in config and 'token_env = "LACUNA_SERVE_TOKEN"' in config and "chat.example.com" in config
          and 'documents_token_env = "LACUNA_SERVE_DOCUMENTS_TOKEN"' in config,
          f"{label}: lacuna.toml lacks the stages' progress or serve's token and CORS settings")


def check_indexer(indexer, stages, by_kind, label):
    """The Meilisearch backend: one `lacuna indexer` pod, never two at once, ready once caught up; the
    retrieve pods and the indexer read the API key from its Secret; lacuna.toml searches Meilisearch."""
    if not check(indexer is not None, f"{label}: meilisearch.enabled rendered no indexer Deployment"):
        return
    container = indexer["spec"]["template"]["spec"]["containers"][0]
    check(container["args"][-1] == "indexer", f"{label}: the indexer runs {container['args']}")
    check(indexer["spec"].get("replicas") == 1 and indexer["spec"].get("strategy", {}).get("type") == "Recreate",
          f"{label}: the indexer must be one replica, recreated")
    check(container.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", f"{label}: the indexer has no /readyz probe")
    check(indexer["spec"]["template"]["metadata"].get("annotations", {}).get("checksum/config"), f"{label}: the indexer has no config checksum")
    key = {"name": "meilisearch-master-key", "key": "master-key"}
    def env_of(deployment):
        return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0].get("env") or []}

    for component, d in [("indexer", indexer), ("retrieve", stages["retrieve"])]:
        env = env_of(d)
        check(env.get("MEILI_MASTER_KEY", {}).get("valueFrom", {}).get("secretKeyRef") == key,
              f"{label}: {component} does not read the Meilisearch key from its Secret")
    others = [c for c, d in stages.items() if c != "retrieve" and "MEILI_MASTER_KEY" in env_of(d)]
    check(not others, f"{label}: stages that never call Meilisearch get its key: {others}")
    config = [c["data"]["lacuna.toml"] for c in by_kind.get("ConfigMap", []) if "lacuna.toml" in c.get("data", {})][0]
    check('backend = "meilisearch"' in config and 'url = "http://meilisearch.search:7700"' in config
          and 'index = "support-articles"' in config, f"{label}: lacuna.toml does not search the Meilisearch index")


def check_pipelines_file():
    """The chart's stage lists are generated from the declarations: the committed file must be current."""
    current = run([LACUNA, "graph", "--format", "helm"]).stdout
    with open(os.path.join(CHART, "pipelines.yaml")) as f:
        committed = f.read()
    check(committed == current, "helm/lacuna/pipelines.yaml is stale: run `lacuna graph --format helm > helm/lacuna/pipelines.yaml`")


def main():
    check_pipelines_file()
    lint = run([HELM, "lint", "--strict", CHART])
    check(lint.returncode == 0, f"helm lint failed:\n{lint.stdout}{lint.stderr}")
    for name in sorted(os.listdir(os.path.join(CHART, "ci"))):
        check(name in EXPECTED, f"ci/{name} has no expectations in tests/chart/check.py")
        if name in EXPECTED:
            check_values_file(name)
    # A config change changes every stage's pod template, so the stages roll onto the new config.
    default = os.path.join(CHART, "ci", "default-values.yaml")
    checksums = []
    for extra in [[], ["--set", "config.migres.max_iterations=3"]]:
        docs = [d for d in yaml.safe_load_all(render(default, *extra).stdout) if d and d["kind"] == "Deployment"]
        checksums.append({d["spec"]["template"]["metadata"]["annotations"]["checksum/config"] for d in docs})
    check(len(checksums[0]) == 1 and len(checksums[1]) == 1 and checksums[0] != checksums[1],
          f"config checksums do not follow the config: {checksums}")
    # GPU re-ranking: the stage asks for the GPU, lands on GPU nodes and runs its models on CUDA;
    # the other stages stay on CPUs.
    gpu = [d for d in yaml.safe_load_all(render(default, "--set", "stages.sentence_filter.gpu=1",
                                                "--set", "stages.sentence_filter.nodeSelector.gpu=nvidia").stdout)
           if d and d["kind"] == "Deployment"]
    for d in gpu:
        component = d["metadata"]["labels"]["app.kubernetes.io/component"]
        container = d["spec"]["template"]["spec"]["containers"][0]
        on_gpu = container["resources"].get("limits", {}).get("nvidia.com/gpu") == 1
        cuda = any(e["name"] == "LACUNA__ONNX__EXECUTION_PROVIDER" and e["value"] == "cuda" for e in container.get("env", []))
        if component == "sentence-filter":
            check(on_gpu and cuda and d["spec"]["template"]["spec"].get("nodeSelector") == {"gpu": "nvidia"},
                  f"gpu=1: sentence_filter does not get a GPU, CUDA and its node selector: {container}")
            check(container["resources"]["limits"].get("cpu") == "2", "gpu=1 dropped the stage's CPU limit")
        else:
            check(not on_gpu and not cuda, f"gpu=1 on sentence_filter put {component} on a GPU")
    # Settings for a stage no pipeline has (a typo) are refused with a message that says so.
    wrong = render(default, "--set", "stages.leef.replicas=2")
    check(wrong.returncode != 0 and 'stages.leef: no pipeline has a stage "leef"' in wrong.stderr,
          f"settings for an unknown stage rendered: {wrong.stderr.strip()}")
    # A stage setting the chart does not read is refused, not ignored: a stage cannot be switched off.
    unread = render(default, "--set", "stages.leaf.enabled=false")
    check(unread.returncode != 0 and "stages.leaf.enabled is not a stage setting" in unread.stderr,
          f"an unread stage setting rendered: {unread.stderr.strip()}")
    # Each pipeline renders exactly its declared stages, whatever other stages have settings.
    for pipeline, stages in PIPELINES.items():
        result = render(default, "--set", f"pipeline={pipeline}")
        if check(result.returncode == 0, f"pipeline={pipeline} does not render: {result.stderr.strip()}"):
            rendered = [d["metadata"]["labels"]["app.kubernetes.io/component"]
                        for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Deployment"]
            check(sorted(rendered) == sorted(s.replace("_", "-") for s in stages),
                  f"pipeline={pipeline}: Deployments {sorted(rendered)}, declared {stages}")
    if failures:
        print("chart tests FAILED:", *failures, sep="\n  - ")
        return 1
    print(f"chart tests passed: lint, {len(EXPECTED)} values files rendered and validated against Kubernetes {K8S_VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
