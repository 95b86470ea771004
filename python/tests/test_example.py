"""examples/pytorch/train.py: central mode, the initial model, and one silo under an agent stand-in
(one worker, and two workers with torch.distributed over gloo)."""

import gzip
import math
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from xsilo_client import safetensors as st

from .support import PYTHON_DIR, REPO_DIR, FakeAgent, torch_or_skip

TRAIN_PY = os.path.join(REPO_DIR, "examples", "pytorch", "train.py")
DIGITS = os.path.join(REPO_DIR, "data", "digits.csv.gz")
CNN_TENSORS = {"conv1.weight": [16, 1, 3, 3], "conv1.bias": [16], "bn1.weight": [16], "bn1.bias": [16],
               "bn1.running_mean": [16], "bn1.running_var": [16], "conv2.weight": [32, 16, 3, 3],
               "conv2.bias": [32], "fc.weight": [10, 512], "fc.bias": [10]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Example(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch_or_skip()
        cls.tmp = tempfile.TemporaryDirectory()
        with gzip.open(DIGITS, "rt") as f:
            lines = f.read().splitlines()
        cls.train_csv = os.path.join(cls.tmp.name, "train.csv")
        cls.test_csv = os.path.join(cls.tmp.name, "test.csv")
        with open(cls.train_csv, "w") as f:
            f.write("\n".join(lines[:300]) + "\n")
        with open(cls.test_csv, "w") as f:
            f.write("\n".join(lines[300:400]) + "\n")
        cls.init = os.path.join(cls.tmp.name, "init.safetensors")
        out = cls.run_script(["--init", cls.init])
        assert out.returncode == 0, out.stderr

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @staticmethod
    def run_script(args, **kw):
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        for key in ("XSILO_TRAINER_FD", "XSILO_TRAIN_DATA", "XSILO_TEST_DATA", "RANK", "WORLD_SIZE"):
            env.pop(key, None)
        return subprocess.run([sys.executable, TRAIN_PY] + args, env=env, capture_output=True, text=True,
                              timeout=120, **kw)

    def test_init_writes_every_floating_tensor_as_float32_without_integer_buffers(self):
        tensors = st.load_file(self.init)
        self.assertEqual({k: list(v.shape) for k, v in tensors.items()}, CNN_TENSORS)
        self.assertTrue(all(v.dtype == np.float32 for v in tensors.values()))

    def test_central_training_prints_test_accuracy_and_saves_the_model(self):
        out_path = os.path.join(self.tmp.name, "central.safetensors")
        out = self.run_script(["--train", self.train_csv, "--test", self.test_csv, "--epochs", "2",
                               "--out", out_path])
        self.assertEqual(out.returncode, 0, out.stderr)
        last = [line for line in out.stdout.splitlines() if line.startswith("test accuracy")]
        self.assertEqual(len(last), 1, out.stdout)
        accuracy = float(last[0].split()[2])
        self.assertGreater(accuracy, 0.5, out.stdout)  # 10 classes: chance is 0.1
        self.assertIn("on 100 rows (300 training rows, 2 epochs)", last[0])
        self.assertEqual({k: list(v.shape) for k, v in st.load_file(out_path).items()}, CNN_TENSORS)

    def run_silo(self, workers, tasks):
        """Starts `workers` copies as the agent would and plays `tasks`; returns results per task."""
        exchange = tempfile.mkdtemp(dir=self.tmp.name)
        port = str(free_port())
        agents, procs = [], []
        try:
            for rank in range(workers):
                agent_end, trainer_end = socket.socketpair()
                agents.append(FakeAgent(agent_end))
                env = dict(os.environ, XSILO_TRAINER_FD=str(trainer_end.fileno()), XSILO_SILO="hospital-01",
                           XSILO_EXCHANGE_DIR=exchange, XSILO_TRAIN_DATA=self.train_csv,
                           XSILO_TEST_DATA=self.test_csv, RANK=str(rank), LOCAL_RANK=str(rank),
                           WORLD_SIZE=str(workers), LOCAL_WORLD_SIZE=str(workers),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port, CUDA_VISIBLE_DEVICES="",
                           PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=PYTHON_DIR)
                procs.append(subprocess.Popen([sys.executable, TRAIN_PY], env=env, pass_fds=[trainer_end.fileno()],
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                trainer_end.close()
            for agent in agents:
                hello = agent.receive()
                self.assertEqual((hello["type"], hello["protocol"], hello["world_size"]), ("hello", 1, workers))
                agent.send({"type": "welcome", "protocol": 1, "agent": "0.1.0", "silo": "hospital-01",
                            "exchange_dir": exchange})
            results = []
            for task in tasks:
                for agent in agents:
                    agent.send(task)
                if task["kind"] != "shutdown":
                    results.append([agent.receive() for agent in agents])
            for agent in agents:
                self.assertIsNone(agent.receive())
            outputs = [p.communicate(timeout=60) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
            for agent in agents:
                agent.close()
        for p, (_, err) in zip(procs, outputs):
            self.assertEqual(p.returncode, 0, err)
        return results, outputs

    def tasks(self):
        config = {"local_epochs": 1, "batch_size": 32, "learning_rate": 0.05, "round": 0}
        return [{"type": "task", "id": 1, "kind": "train", "round": 0, "model": self.init, "config": config},
                {"type": "task", "id": 2, "kind": "evaluate", "round": 1, "model": self.init, "config": {}},
                {"type": "task", "id": 3, "kind": "shutdown"}]

    def check_update(self, result, rank):
        self.assertEqual((result["type"], result["id"], result["rank"]), ("result", 1, rank))
        self.assertTrue(math.isfinite(result["metrics"]["loss"]))
        if rank != 0:
            self.assertIsNone(result["weights"])
            return None
        self.assertEqual(result["num_samples"], 300)
        update = st.load_file(result["weights"])
        self.assertEqual({k: list(v.shape) for k, v in update.items()}, CNN_TENSORS)
        self.assertTrue(all(v.dtype == np.float32 and np.isfinite(v).all() for v in update.values()))
        self.assertFalse(np.array_equal(update["fc.weight"], st.load_file(self.init)["fc.weight"]))
        return update

    def check_evaluation(self, result):
        self.assertIsNone(result["weights"])
        metrics = result["metrics"]
        self.assertEqual(set(metrics), {"eval_loss", "eval_accuracy", "eval_samples"})
        self.assertEqual(metrics["eval_samples"], 100)
        self.assertTrue(0 <= metrics["eval_accuracy"] <= 1)
        self.assertGreater(metrics["eval_loss"], 0)

    def test_one_worker_answers_train_and_evaluate_tasks_until_shutdown(self):
        (train, evaluation), outputs = self.run_silo(1, self.tasks())
        self.check_update(train[0], rank=0)
        self.check_evaluation(evaluation[0])
        self.assertIn("bn1.num_batches_tracked", outputs[0][1])  # logged as kept local

    def test_two_workers_train_with_gloo_and_rank_0_sends_the_weights(self):
        (train, evaluation), _ = self.run_silo(2, self.tasks())
        self.check_update(train[0], rank=0)
        self.check_update(train[1], rank=1)
        self.assertEqual(train[0]["metrics"], train[1]["metrics"])  # the loss is all-reduced
        for result in evaluation:
            self.check_evaluation(result)
        self.assertEqual(evaluation[0]["metrics"], evaluation[1]["metrics"])


if __name__ == "__main__":
    unittest.main()


class FiveLines(unittest.TestCase):
    """docs/bring-your-own-model.md's promise, measured: examples/tabular/train.py is
    examples/tabular/central.py federated with at most 8 changed lines (evaluation included)."""

    @staticmethod
    def code(path):
        import ast
        with open(path) as f:
            text = f.read()
        doc = ast.get_docstring(ast.parse(text), clean=False)
        if doc:  # the module docstring says which file it is: not part of the change
            text = text.replace(doc, "", 1)
        return text.splitlines()

    def test_the_federated_script_differs_from_the_central_one_by_at_most_eight_lines(self):
        import difflib
        tabular = os.path.join(REPO_DIR, "examples", "tabular")
        diff = list(difflib.unified_diff(self.code(os.path.join(tabular, "central.py")),
                                         self.code(os.path.join(tabular, "train.py")), lineterm="", n=0))
        added = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
        removed = [line for line in diff if line.startswith("-") and not line.startswith("---")]
        self.assertLessEqual(len(added), 8, "\n".join(diff))
        self.assertEqual((len(added), len(removed)), (7, 3), "\n".join(diff))  # the figures the docs give

    def test_the_federated_script_run_by_hand_trains_centrally(self):
        torch_or_skip()
        with tempfile.TemporaryDirectory() as tmp:
            rng = np.random.default_rng(0)
            x = rng.standard_normal((200, 5)).astype(np.float32)
            y = (x[:, 0] + x[:, 1] > 0).astype(int)
            for name, rows in (("train.csv", slice(0, 150)), ("test.csv", slice(150, 200))):
                np.savetxt(os.path.join(tmp, name), np.column_stack([x[rows], y[rows]]), delimiter=",",
                           header=",".join([f"x{i}" for i in range(5)] + ["label"]), comments="")
            env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
            env.pop("XSILO_TRAINER_FD", None)
            out = subprocess.run([sys.executable, os.path.join(REPO_DIR, "examples", "tabular", "train.py"),
                                  "--epochs", "10"], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            accuracy = float(out.stdout.split()[-1])
            self.assertGreater(accuracy, 0.85, out.stdout)
