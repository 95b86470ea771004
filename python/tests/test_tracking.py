"""xsilo_client.tracking: a finished federation into MLflow, read back with MLflow's own client.

tests/data holds the first rounds of a real `xsilo sim` run of examples/tabular (its sim
metrics.csv and its signed audit log). MLflow is optional: without it the test skips, saying so
(scripts/python-extras.sh installs it into .venv-extras, which CTest's Python.ExtrasTests uses)."""

import os
import shutil
import tempfile
import unittest

from xsilo_client import tracking

from .support import skip

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


class AuditAndMetrics(unittest.TestCase):
    def test_the_audit_summary_counts_what_the_log_records(self):
        s = tracking.audit_summary(os.path.join(DATA, "audit.jsonl"))
        self.assertEqual((s["records"], s["rounds_committed"], s["rounds_aborted"], s["dropouts"]), (4, 3, 0, 0))
        self.assertEqual(len(s["model_sha256"]), 64)
        self.assertEqual(len(s["head_sha256"]), 64)

    def test_metrics_rows_leave_out_what_was_not_measured(self):
        rows = tracking.read_metrics(os.path.join(DATA, "metrics.csv"))
        self.assertEqual([r["round"] for r in rows], [1, 2, 3])
        self.assertNotIn("loss", rows[0])  # "nan": the script reports no test loss
        self.assertAlmostEqual(rows[2]["train_loss"], 0.0682)


class MlflowRun(unittest.TestCase):
    def test_a_federation_is_logged_as_one_run_and_reads_back(self):
        try:
            import mlflow
            from mlflow.tracking import MlflowClient
        except ImportError:
            skip("mlflow is not installed here (scripts/python-extras.sh puts it in .venv-extras)")
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "run")
            shutil.copytree(DATA, folder)
            uri = "file://" + os.path.join(tmp, "mlruns")
            # MLflow 3 keeps its file store behind a flag (its database store needs sqlalchemy,
            # which mlflow-skinny leaves out); the run reads back the same either way.
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
            run_id = tracking.log_to_mlflow(folder, experiment="xsilo-test", tracking_uri=uri,
                                            params={"model": "mlp"})
            client = MlflowClient(tracking_uri=uri)
            run = client.get_run(run_id)
            self.assertEqual(run.data.params["model"], "mlp")
            self.assertEqual(run.data.tags["xsilo.audit.rounds_committed"], "3")
            history = client.get_metric_history(run_id, "train_loss")
            self.assertEqual([(m.step, round(m.value, 6)) for m in sorted(history, key=lambda m: m.step)],
                             [(1, 0.164697), (2, 0.128158), (3, 0.0682)])
            self.assertEqual(client.get_metric_history(run_id, "loss"), [])  # never measured
            artifacts = {a.path for a in client.list_artifacts(run_id)}
            self.assertTrue({"metrics.csv", "audit.jsonl"} <= artifacts, artifacts)
            del mlflow
