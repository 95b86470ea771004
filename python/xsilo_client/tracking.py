"""Log a finished federation into the tools researchers already use.

    from xsilo_client.tracking import log_to_mlflow
    run_id = log_to_mlflow("runs/pytorch", experiment="digits")

``log_to_mlflow`` reads a federation's folder (``xsilo sim --out``, or a server's ``state_dir``):
every row of ``metrics.csv`` becomes metrics at step = round, the audit log's summary becomes
params and tags (rounds committed and aborted, dropouts, the last model's SHA-256, the log's
head), and the files become artifacts. TensorBoard needs no helper: ``report.tensorboard`` in the
sim's config writes event files (docs/configs.md).
"""

import csv
import hashlib
import json
import math
import os

# metrics.csv columns that are not metrics of the model or the round.
_NOT_METRICS = {"round"}


def read_metrics(path):
    """The rows of a metrics.csv as dicts of column -> float (empty and NaN cells left out)."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out = {}
            for key, text in row.items():
                try:
                    value = float(text)
                except (TypeError, ValueError):
                    continue
                if math.isfinite(value):
                    out[key] = value
            if "round" in out:
                rows.append(out)
    return rows


def audit_summary(path):
    """What an audit log says about its federation: counts of records, rounds committed and
    aborted, dropouts, the last committed model's SHA-256 and the SHA-256 of its last line."""
    summary = {"records": 0, "rounds_committed": 0, "rounds_aborted": 0, "dropouts": 0}
    last_line = ""
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            last_line = line.rstrip("\n")
            record = json.loads(line)
            summary["records"] += 1
            if record.get("event") != "round":
                continue
            committed = record.get("status") == "committed"
            summary["rounds_committed" if committed else "rounds_aborted"] += 1
            summary["dropouts"] += len(record.get("dropouts") or [])
            if committed and record.get("model_sha256_after"):
                summary["model_sha256"] = record["model_sha256_after"]
    if last_line:
        summary["head_sha256"] = hashlib.sha256(last_line.encode()).hexdigest()
    return summary


def log_to_mlflow(folder, experiment=None, run_name=None, tracking_uri=None, params=None):
    """Logs the federation in ``folder`` into a new MLflow run and returns the run's id.

    ``experiment``: the experiment's name (created when missing; default: MLflow's own).
    ``tracking_uri``: where MLflow writes (default: MLflow's own, e.g. MLFLOW_TRACKING_URI).
    ``params``: more params of your own (the model, the data, ...). Needs ``mlflow``
    (``pip install mlflow``); raises ImportError saying so without it.
    """
    try:
        import mlflow
    except ImportError:
        raise ImportError("log_to_mlflow needs mlflow: pip install mlflow (or mlflow-skinny)") from None
    metrics_path = os.path.join(folder, "metrics.csv")
    if not os.path.exists(metrics_path):
        raise FileNotFoundError(f"{folder} has no metrics.csv: give the sim's --out folder or a server's state_dir")
    rows = read_metrics(metrics_path)
    audit_path = os.path.join(folder, "audit.jsonl")
    summary_path = os.path.join(folder, "summary.json")
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    if experiment:
        mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=run_name or os.path.basename(os.path.abspath(folder))) as run:
        logged_params = {"rounds": len(rows)}
        if os.path.exists(summary_path):
            with open(summary_path) as f:
                for key, value in json.load(f).items():
                    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                        logged_params[f"sim.{key}"] = value
        logged_params.update(params or {})
        mlflow.log_params(logged_params)
        for row in rows:
            step = int(row["round"])
            mlflow.log_metrics({k: v for k, v in row.items() if k not in _NOT_METRICS}, step=step)
        if os.path.exists(audit_path):
            audit = audit_summary(audit_path)
            mlflow.set_tags({f"xsilo.audit.{k}": str(v) for k, v in audit.items()})
            mlflow.log_artifact(audit_path)
        for name in ("metrics.csv", "summary.json", "audit.pub", "report.html"):
            if os.path.exists(os.path.join(folder, name)):
                mlflow.log_artifact(os.path.join(folder, name))
        return run.info.run_id
