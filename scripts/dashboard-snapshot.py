"""Renders the Grafana dashboard (helm/lacuna/dashboards/lacuna.json) into a PNG from a real Prometheus,
for machines without Grafana: each panel's queries are read with Prometheus's /api/v1/query_range and
drawn where the dashboard places them. Grafana's $__rate_interval becomes --rate-interval.

Either point it at a Prometheus that already scrapes Lacuna:

    python scripts/dashboard-snapshot.py --prometheus http://127.0.0.1:9090 --minutes 10 --out dashboard.png

or let it start Debian's Prometheus (scripts/prometheus.sh) on 127.0.0.1 scraping one Lacuna process
every 2 s for as long as that process serves /metrics (at most --seconds), then draw the whole run:

    python scripts/dashboard-snapshot.py --scrape 127.0.0.1:9898 --seconds 900 --out dashboard.png

Needs matplotlib (pip install matplotlib).
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def get_json(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:  # Prometheus explains a bad query in the body of a 400
        return json.load(error)


def query_range(prometheus, expr, start, end, step):
    """{labels frozenset: [(t, value)]} for expr over [start, end]; raises on a query Prometheus rejects."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    body = get_json(f"{prometheus}/api/v1/query_range?{params}")
    if body.get("status") != "success":
        raise SystemExit(f"Prometheus rejected `{expr}`: {body.get('error')}")
    return {
        frozenset(series["metric"].items()): [(float(t) - start, float(v)) for t, v in series["values"]]
        for series in body["data"]["result"]
    }


def port_answers(address):
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def scrape_with_own_prometheus(target, seconds, workdir):
    """Starts Prometheus scraping target every 2 s until the target stops answering (or seconds pass).
    Returns (the server's URL, its process, start, end)."""
    binaries = os.environ.get("LACUNA_PROMETHEUS") or subprocess.run(
        [os.path.join(ROOT, "scripts", "prometheus.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    with open(os.path.join(workdir, "prometheus.yml"), "w") as f:
        f.write("global:\n  scrape_interval: 2s\nscrape_configs:\n"
                f"  - job_name: lacuna\n    static_configs:\n      - targets: ['{target}']\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([
        os.path.join(binaries, "prometheus"), f"--config.file={workdir}/prometheus.yml",
        f"--storage.tsdb.path={workdir}/data", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ])
    url = f"http://127.0.0.1:{port}"
    while not port_answers(target):
        print(f"waiting for {target}")
        time.sleep(2)
    start = time.time()
    while time.time() - start < seconds and port_answers(target):
        time.sleep(2)
    end = time.time()
    time.sleep(3)  # the last scrape lands
    return url, server, start, end


def legend(template, labels):
    d = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), template or "").strip() or "value"


def draw(dashboard, prometheus, start, end, rate_interval, title, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = max(1, int((end - start) / 200))
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(24, rows * 0.42))
    fig.suptitle(title or dashboard["title"], fontsize=16)
    for p in panels:
        g = p["gridPos"]
        ax = fig.add_axes([g["x"] / 24 + 0.01, 1 - (g["y"] + g["h"]) / rows + 0.012, g["w"] / 24 - 0.02, g["h"] / rows - 0.045])
        ax.set_title(p["title"], fontsize=10, loc="left")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        for target in p["targets"]:
            expr = target["expr"].replace("$__rate_interval", rate_interval)
            series = query_range(prometheus, expr, start, end, step)
            if p["type"] == "bargauge":  # the last value of each series, as bars
                names = [legend(target.get("legendFormat"), k) for k in series]
                ax.barh(names, [points[-1][1] for points in series.values()], color="tab:orange")
                continue
            for labels, points in sorted(series.items(), key=lambda kv: legend(target.get("legendFormat"), kv[0])):
                ax.plot([t for t, _ in points], [v for _, v in points], label=legend(target.get("legendFormat"), labels))
        ax.tick_params(labelsize=7)
        if p["type"] != "bargauge":
            ax.set_xlabel("seconds", fontsize=7)
        if unit:
            ax.set_ylabel(unit, fontsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left", ncol=2, framealpha=0.6)
    fig.savefig(out, dpi=70)
    print(f"{end - start:.0f} s of Prometheus data -> {out}")


def main():
    parser = argparse.ArgumentParser()
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", help="URL of a Prometheus that scrapes Lacuna")
    source.add_argument("--scrape", help="HOST:PORT of a Lacuna /metrics endpoint to scrape with a Prometheus of our own")
    parser.add_argument("--minutes", type=float, default=15, help="with --prometheus: how far back to draw")
    parser.add_argument("--seconds", type=float, default=900, help="with --scrape: the longest to scrape")
    parser.add_argument("--rate-interval", default="30s", help="what Grafana's $__rate_interval stands for")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dashboard", default=os.path.join(ROOT, "helm", "lacuna", "dashboards", "lacuna.json"))
    parser.add_argument("--title", default="")
    args = parser.parse_args()

    with open(args.dashboard) as f:
        dashboard = json.load(f)
    if args.prometheus:
        end = time.time()
        draw(dashboard, args.prometheus.rstrip("/"), end - args.minutes * 60, end, args.rate_interval, args.title, args.out)
        return
    workdir = tempfile.mkdtemp(prefix="lacuna-dashboard-")
    server = None
    try:
        url, server, start, end = scrape_with_own_prometheus(args.scrape, args.seconds, workdir)
        draw(dashboard, url, start, end, args.rate_interval, args.title, args.out)
    finally:
        if server:
            server.terminate()
            server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
