#!/usr/bin/python3
"""Checks a kill-storm run of `xsilo sim` (scripts/kill-storm.sh) and prints its summary table.

Reads OUT/audit.jsonl, OUT/faults.jsonl, OUT/server_resources.csv, OUT/state/metrics.csv and
runs `xsilo audit verify` with every silo's witnessed heads. Exits 1 when a check fails:

- every round number 1..rounds ended exactly once (a round record), in order: no committed
  round lost or repeated, no gap;
- each committed round starts from the model the previous commit left, across every restart
  (federation_start names that model and resumes after the last round recorded);
- every aborted round and every dropout has a non-empty reason;
- the server's metrics name the same rounds, once each;
- the audit log verifies, and every silo's witness is consistent with it;
- server RSS flat within 10 % (--rss-tolerance) and descriptors not growing: the median of
  the samples of rounds [100, 200) against the median of the last 100 rounds. Samples are
  taken at the same point of every round (as its row appears) from whichever server process
  runs then; with a server killed every dozen rounds or so, each 100-round window mixes
  processes of every age alike, so the windows compare like with like. Runs shorter than 300
  rounds skip this check (it says so).
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", help="the sim's --out folder")
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--xsilo", default="build/tools/xsilo")
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    a = ap.parse_args()
    out = a.out
    failures = []

    def fail(msg):
        failures.append(msg)

    records = [json.loads(l) for l in open(os.path.join(out, "audit.jsonl"), encoding="utf-8") if l.strip()]
    next_round, last_committed, model = 1, 0, None
    committed, aborted, starts = 0, [], 0
    for r in records:
        ev = r.get("event")
        if ev == "federation_start":
            starts += 1
            if model is not None and r["model_sha256"] != model:
                fail(f"restart at round {r['first_round']} resumed from another model than the last commit")
            model = r["model_sha256"]
            if r["first_round"] != next_round or r["resumed_from_round"] != last_committed:
                fail(f"restart resumed at {r['first_round']} after {r['resumed_from_round']}; expected {next_round} after {last_committed}")
        elif ev == "round":
            n = r["round"]
            if n != next_round:
                fail(f"round record {n} where {next_round} was due (lost or repeated)")
            next_round = n + 1
            if r["model_sha256_before"] != model:
                fail(f"round {n} did not start from the last committed model")
            for d in r.get("dropouts", []):
                if not d.get("reason"):
                    fail(f"round {n}: dropout {d.get('silo')} without a reason")
            if r["status"] == "committed":
                committed += 1
                last_committed = n
                model = r["model_sha256_after"]
            else:
                if not r.get("reason"):
                    fail(f"round {n} aborted without a reason")
                aborted.append((n, r.get("reason", "")))
    if next_round != a.rounds + 1:
        fail(f"the log ends at round {next_round - 1} of {a.rounds}")

    with open(os.path.join(out, "server", "metrics.csv")) as f:
        metric_rounds = [int(row["round"]) for row in csv.DictReader(f)]
    if metric_rounds != list(range(1, a.rounds + 1)):
        fail(f"the server's metrics.csv has {len(metric_rounds)} rows, not rounds 1..{a.rounds} once each")

    kills = {}
    with open(os.path.join(out, "faults.jsonl")) as f:
        for l in f:
            p = json.loads(l)["process"]
            kind = "server" if p == "server" else p.split("-")[0]
            kills[kind] = kills.get(kind, 0) + 1
    if starts != 1 + kills.get("server", 0):
        fail(f"{starts} federation_start records for {kills.get('server', 0)} server restarts")

    silos = sorted(os.listdir(os.path.join(out, "silos")))
    cmd = [a.xsilo, "audit", "verify", os.path.join(out, "audit.jsonl"), "--key", os.path.join(out, "audit.pub")]
    for s in silos:
        w = os.path.join(out, "silos", s, "state", "audit_heads.jsonl")
        if os.path.exists(w):
            cmd += ["--witness", w]
    v = subprocess.run(cmd, capture_output=True, text=True)
    verify = v.stdout.strip().splitlines()[-2:] if v.stdout.strip() else [v.stderr.strip()]
    if v.returncode != 0:
        fail("audit verify: " + (v.stdout + v.stderr).strip())

    res = []
    with open(os.path.join(out, "server_resources.csv")) as f:
        for row in csv.DictReader(f):
            res.append((int(row["round"]), int(row["pid"]), int(row["rss_kb"]), int(row["fds"])))

    def window(lo, hi):
        return [r for r in res if lo <= r[0] < hi]

    early, late = window(100, 200), window(a.rounds - 99, a.rounds + 1)
    rss_line = fds_line = "skipped: fewer than 300 rounds"
    if a.rounds >= 300 and early and late:
        e_rss, l_rss = statistics.median(r[2] for r in early), statistics.median(r[2] for r in late)
        e_fds, l_fds = statistics.median(r[3] for r in early), statistics.median(r[3] for r in late)
        change = (l_rss - e_rss) / e_rss
        rss_line = f"{e_rss / 1024:.1f} MiB -> {l_rss / 1024:.1f} MiB ({100 * change:+.1f} %; max {max(r[2] for r in res) / 1024:.1f} MiB)"
        fds_line = f"{e_fds:g} -> {l_fds:g} (max {max(r[3] for r in res)})"
        if abs(change) > a.rss_tolerance:
            fail(f"server RSS changed {100 * change:+.1f} % from rounds 100-199 to the last 100")
        if l_fds > e_fds:
            fail(f"server descriptors grew from {e_fds:g} to {l_fds:g}")
    # Within each server process too: its last sample holds no more descriptors than the run's
    # usual count plus one connection per silo (silos fail over to the server while their
    # edge is down). Not against the process's first sample: a restarted server's first round
    # can end before its edges have reconnected (4 descriptors, then 12).
    usual = statistics.median(r[3] for r in res) if res else 0
    first_last = {}
    for rnd, pid, rss, fds in res:
        first_last.setdefault(pid, [fds, fds])[1] = fds
    grew = [pid for pid, (f0, f1) in first_last.items() if f1 > usual + len(silos)]
    if grew:
        fail(f"descriptors grew within server processes {grew[:5]} (usual {usual:g}, ended above {usual + len(silos):g})")

    reasons = {}
    for n, why in aborted:
        reasons[why] = reasons.get(why, 0) + 1
    rows = [
        ("rounds", str(a.rounds)),
        ("committed", str(committed)),
        ("aborted", str(len(aborted))),
    ]
    rows += [(f"  aborted: {why}", str(c)) for why, c in sorted(reasons.items(), key=lambda x: -x[1])]
    rows += [("kills (SIGKILL + restart)", str(sum(kills.values())))]
    rows += [(f"  {k}", str(c)) for k, c in sorted(kills.items())]
    rows += [("server processes", str(len(first_last))),
             ("server RSS, median rounds 100-199 -> last 100", rss_line),
             ("server descriptors, same windows", fds_line),
             ("audit verify (all silos' witnesses)", "OK" if v.returncode == 0 else "FAILED"),
             ("checks", "all passed" if not failures else f"{len(failures)} FAILED")]
    print("| what | figure |\n| --- | --- |")
    for k, val in rows:
        print(f"| {k} | {val} |")
    for l in verify:
        print("#", l)
    for f in failures[:20]:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
