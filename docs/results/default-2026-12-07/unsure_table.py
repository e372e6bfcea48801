"""The `unsure` signal's table (issue 76), from unsure-first-reads.json beside this file: per first
read of the default-logprobs runs, the mean log-probability of its answer tokens (`mean`), the checks
that sent it on (`went_on`), its EM (`em`) and the EM of `--profile loop` on the question (`loop_em`).
For thresholds at quantiles of the first reads the default keeps: how many it would send on, and the
EM of those kept, and of those sent on before and after the loop. python3 unsure_table.py"""
import json
import os

rows = json.load(open(os.path.join(os.path.dirname(__file__), 'unsure-first-reads.json')))
kept = [r for r in rows if not r['went_on']]
means = sorted(r['mean'] for r in kept)
em = lambda xs, key: 100 * sum(x[key] for x in xs) / len(xs) if xs else 0.0
print(f"{len(rows)} first reads with log-probabilities, {len(kept)} kept by the default's checks (EM {em(kept, 'em'):.1f})")
print('| threshold | sent on by it | share of all | EM of the first reads still kept | EM of those sent on: first read | after the loop | loop wins / losses |')
print('|---|---|---|---|---|---|---|')
for q in [0.1, 0.2, 0.3, 0.4, 0.5]:
    t = means[int(q * len(means))]
    on = [r for r in kept if r['mean'] < t]
    still = [r for r in kept if r['mean'] >= t]
    wins = sum(r['loop_em'] > r['em'] for r in on)
    losses = sum(r['loop_em'] < r['em'] for r in on)
    print(f"| {t:.3f} ({int(q * 100)}% of kept) | {len(on)} | {100 * len(on) / len(rows):.1f}% | {em(still, 'em'):.1f} | "
          f"{em(on, 'em'):.1f} | {em(on, 'loop_em'):.1f} | {wins} / {losses} |")
