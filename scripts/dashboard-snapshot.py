"""Renders the Grafana dashboard (helm/lacuna/dashboards/lacuna.json) from a live Lacuna process, for
machines without Prometheus or Grafana: scrapes /metrics every few seconds, evaluates each panel's
PromQL on the scraped series, and draws the panels in their dashboard layout into a PNG.

Only the PromQL the dashboard uses is understood: sum [by (labels)] (...), rate(metric[window]),
histogram_quantile(q, ...), a bare metric, and one top-level division. Rates use a 30 s window.

    python scripts/dashboard-snapshot.py --url http://127.0.0.1:9898/metrics --seconds 300 --out docs/dashboard.png

Needs prometheus-client and matplotlib (pip install prometheus-client matplotlib).
"""

import argparse
import json
import math
import os
import re
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

WINDOW = 30.0


def scrape(url):
    """{(name, labels frozenset): value} of every sample, histogram parts included."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def split_top(expr, sep):
    depth = 0
    for i, c in enumerate(expr):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and expr.startswith(sep, i):
            return expr[:i], expr[i + len(sep):]
    return None


def value_at(history, key, t):
    """The last scraped value of a series at or before time t."""
    best = None
    for when, samples in history:
        if when > t:
            break
        if key in samples:
            best = samples[key]
    return best


def evaluate(expr, history, t):
    expr = expr.strip()
    parts = split_top(expr, " / ")
    if parts:
        a, b = evaluate(parts[0], history, t), evaluate(parts[1], history, t)
        return {k: a[k] / b[k] for k in a if k in b and b[k]}
    m = re.fullmatch(r"histogram_quantile\(([\d.]+),\s*(.*)\)", expr, re.S)
    if m:
        return quantile(float(m.group(1)), evaluate(m.group(2), history, t))
    m = re.fullmatch(r"sum(?:\s+by\s*\(([^)]*)\))?\s*\((.*)\)", expr, re.S)
    if m:
        keep = [l.strip() for l in (m.group(1) or "").split(",") if l.strip()]
        out = {}
        for labels, v in evaluate(m.group(2), history, t).items():
            key = frozenset((k, val) for k, val in labels if k in keep)
            out[key] = out.get(key, 0.0) + v
        return out
    m = re.fullmatch(r"rate\((\w+)\[[^\]]*\]\)", expr)
    if m:
        name, out = m.group(1), {}
        for (n, labels) in {k for _, s in history for k in s if k[0] == name}:
            v1, v0 = value_at(history, (n, labels), t), value_at(history, (n, labels), t - WINDOW)
            if v1 is not None and v0 is not None:
                out[labels] = max(v1 - v0, 0.0) / WINDOW
        return out
    m = re.fullmatch(r"\w+", expr)
    if m:
        return {labels: v for (n, labels), v in history_at(history, t).items() if n == expr}
    raise ValueError(f"unsupported PromQL: {expr}")


def history_at(history, t):
    out = {}
    for when, samples in history:
        if when > t:
            break
        out = samples
    return out


def quantile(q, buckets):
    """Prometheus's histogram_quantile: linear interpolation inside the bucket holding rank q."""
    groups = {}
    for labels, v in buckets.items():
        d = dict(labels)
        le = float(d.pop("le"))
        groups.setdefault(frozenset(d.items()), []).append((le, v))
    out = {}
    for key, bs in groups.items():
        bs.sort()
        total = bs[-1][1] if bs else 0
        if total <= 0:
            continue
        rank, prev_le, prev_count = q * total, 0.0, 0.0
        for le, count in bs:
            if count >= rank:
                if math.isinf(le):
                    out[key] = prev_le
                else:
                    share = (rank - prev_count) / (count - prev_count) if count > prev_count else 0
                    out[key] = prev_le + (le - prev_le) * share
                break
            prev_le, prev_count = le, count
    return out


def legend(template, labels):
    d = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), template).strip() or "value"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--interval", type=float, default=5)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dashboard", default=os.path.join(os.path.dirname(__file__), "..", "helm", "lacuna", "dashboards", "lacuna.json"))
    parser.add_argument("--title", default="")
    args = parser.parse_args()

    dashboard = json.load(open(args.dashboard))
    history, start = [], time.time()
    while time.time() - start < args.seconds:
        try:
            history.append((time.time() - start, scrape(args.url)))
        except OSError as error:
            if history:
                break  # the process ended: draw what was seen
            print(f"waiting for {args.url}: {error}")
        time.sleep(args.interval)
    if len(history) < 2:
        raise SystemExit("fewer than two scrapes: nothing to draw")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(24, rows * 0.42))
    fig.suptitle(args.title or dashboard["title"], fontsize=16)
    times = [t for t, _ in history if t >= WINDOW] or [history[-1][0]]
    for p in panels:
        g = p["gridPos"]
        ax = fig.add_axes([g["x"] / 24 + 0.01, 1 - (g["y"] + g["h"]) / rows + 0.012, g["w"] / 24 - 0.02, g["h"] / rows - 0.045])
        ax.set_title(p["title"], fontsize=10, loc="left")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        if p["type"] == "bargauge":
            target = p["targets"][0]
            values = evaluate(target["expr"], history, history[-1][0])
            names = [legend(target["legendFormat"], k) for k in values]
            ax.barh(names, list(values.values()), color="tab:orange")
            ax.tick_params(labelsize=8)
            continue
        for target in p["targets"]:
            series = {}
            for t in times:
                for labels, v in evaluate(target["expr"], history, t).items():
                    series.setdefault(labels, []).append((t, v))
            for labels, points in sorted(series.items(), key=lambda kv: legend(target["legendFormat"], kv[0])):
                ax.plot([x for x, _ in points], [y for _, y in points], label=legend(target["legendFormat"], labels))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("seconds", fontsize=7)
        if unit:
            ax.set_ylabel(unit, fontsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left", ncol=2, framealpha=0.6)
    fig.savefig(args.out, dpi=70)
    print(f"{len(history)} scrapes over {history[-1][0]:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
