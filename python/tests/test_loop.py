"""xc.tasks() and xc.run(): the short way to federate a script, against an agent stand-in.

The agent's messages are queued first (they fit the socket buffers), then the loop runs, then
the answers are read back: one thread, no timing."""

import contextlib
import io
import logging
import os

import numpy as np

from xsilo_client import loop
from xsilo_client import safetensors as st

from .support import torch_or_skip
from .test_privacy import FakeEngine
from .test_client import ClientTestCase


class Loops(ClientTestCase):
    def setUp(self):
        super().setUp()
        self.torch = torch_or_skip()

    def model(self):
        torch = self.torch
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
        return m

    def global_for(self, model, path, only=None):
        arrays = {k: v.detach().numpy() + 1 for k, v in model.state_dict().items()
                  if v.is_floating_point() and (only is None or k in only)}
        st.save_file(arrays, path)
        return arrays

    def test_the_agents_init_task_is_answered_with_the_models_own_weights(self):
        c = self.welcomed()
        model = self.model()
        self.agent.send({"type": "task", "id": 1, "kind": "init", "round": 0, "model": None, "config": {}})
        self.send_task(kind="shutdown", id=2)
        self.assertEqual(list(loop.tasks(c, model)), [])
        result = self.agent.receive()
        self.assertEqual((result["type"], result["id"]), ("result", 1))
        sent = st.load_file(result["weights"])
        # Floating tensors only (the BatchNorm counter stays local), the module's own values.
        self.assertEqual(set(sent), {"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var"})
        np.testing.assert_array_equal(sent["0.weight"], model.state_dict()["0.weight"].numpy())

    def test_an_init_task_without_a_model_is_refused_with_the_fix(self):
        c = self.welcomed()
        self.agent.send({"type": "task", "id": 1, "kind": "init", "round": 0, "model": None, "config": {}})
        self.send_task(kind="shutdown", id=2)
        self.assertEqual(list(loop.tasks(c)), [])
        error = self.agent.receive()
        self.assertEqual(error["type"], "error")
        self.assertIn("xc.tasks(model)", error["message"])

    def test_train_tasks_arrive_with_the_global_weights_loaded_and_local_epochs_read(self):
        c = self.welcomed()
        model = self.model()
        arrays = self.global_for(model, self.path("g.safetensors"))
        self.send_task(model=self.path("g.safetensors"), config={"local_epochs": 3, "learning_rate": 0.1})
        self.send_task(kind="shutdown", id=9)
        seen = []
        for task in loop.tasks(c, model):
            seen.append(task.local_epochs)
            np.testing.assert_array_equal(model.state_dict()["0.weight"].numpy(), arrays["0.weight"])
            c.send(model, num_samples=4, metrics={"loss": 1.0})
        self.assertEqual(seen, [3])
        self.assertEqual(self.agent.receive()["num_samples"], 4)

    def test_evaluate_tasks_the_script_did_not_ask_for_get_no_metrics_and_one_warning(self):
        c = self.welcomed()
        for i in range(2):
            self.send_task(kind="evaluate", id=10 + i)
        self.send_task(kind="shutdown", id=12)
        with self.assertLogs("xsilo_client", "WARNING") as logs:
            self.assertEqual(list(loop.tasks(c, None)), [])
        self.assertEqual(len(logs.records), 1)
        self.assertIn("evaluate=True", logs.output[0])
        for i in range(2):
            result = self.agent.receive()
            self.assertEqual((result["id"], result["metrics"]), (10 + i, {}))

    def test_a_task_left_unanswered_in_the_loop_is_a_clear_error(self):
        c = self.welcomed()
        self.send_task()
        with self.assertRaisesRegex(RuntimeError, "has no answer: call xc.send"):
            for _ in loop.tasks(c, None):
                pass

    def test_federate_sends_only_the_matching_tensors_and_keeps_the_rest_silently(self):
        c = self.welcomed()
        model = self.model()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        only = {"1.weight", "1.bias", "1.running_mean", "1.running_var"}
        self.global_for(model, self.path("g.safetensors"), only=only)
        self.agent.send({"type": "task", "id": 1, "kind": "init", "round": 0, "model": None, "config": {}})
        self.send_task(model=self.path("g.safetensors"))
        self.send_task(kind="shutdown", id=9)
        with self.assertLogs("xsilo_client", "WARNING") as logs:
            for task in loop.tasks(c, model, federate="1.*"):
                c.send(model, num_samples=1)
        # Only the integer counter is worth a word; the layer left out on purpose is not.
        self.assertEqual(logs.output, ["WARNING:xsilo_client:not federated, kept local (integer/bool tensors): "
                                       "1.num_batches_tracked"])
        self.assertEqual(set(st.load_file(self.agent.receive()["weights"])), {"1.weight", "1.bias", "1.running_mean",
                                                                              "1.running_var"})
        self.assertEqual(set(st.load_file(self.agent.receive()["weights"])), {"1.weight", "1.bias", "1.running_mean",
                                                                              "1.running_var"})
        # The layer the federation does not carry kept its own values; the federated one took the global.
        self.torch.testing.assert_close(model.state_dict()["0.weight"], before["0.weight"])
        self.torch.testing.assert_close(model.state_dict()["1.weight"], before["1.weight"] + 1)

    def test_run_calls_back_train_and_evaluate_and_sends_what_they_return(self):
        c = self.welcomed()
        model = self.model()
        self.global_for(model, self.path("g.safetensors"))
        self.send_task(kind="evaluate", id=1, model=self.path("g.safetensors"))
        self.send_task(id=2, model=self.path("g.safetensors"), config={"local_epochs": 2})
        self.send_task(kind="shutdown", id=3)
        calls = []

        def train(m, task):
            calls.append(("train", task.local_epochs))
            with self.torch.no_grad():
                m[0].weight.add_(1)
            return 7, {"loss": 0.5}

        def evaluate(m, task):
            calls.append(("evaluate", task.round))
            return {"eval_accuracy": 0.9, "eval_samples": 3}

        loop.run(c, model, train, evaluate=evaluate)
        self.assertEqual(calls, [("evaluate", 3), ("train", 2)])
        ev, tr = self.agent.receive(), self.agent.receive()
        self.assertEqual(ev["metrics"], {"eval_accuracy": 0.9, "eval_samples": 3})
        self.assertEqual((tr["num_samples"], tr["metrics"]), (7, {"loss": 0.5}))
        np.testing.assert_allclose(st.load_file(tr["weights"])["0.weight"], model.state_dict()["0.weight"].numpy())

    def test_a_failing_callback_fails_its_round_only_and_the_process_goes_on(self):
        c = self.welcomed()
        self.send_task(id=1, config={})
        self.send_task(id=2, config={})
        self.send_task(kind="shutdown", id=3)
        answers = iter([{"loss": 1.0}, RuntimeError("CUDA out of memory")])

        def train(m, task):
            a = next(answers)
            if isinstance(a, Exception):
                raise a
            return a

        with self.assertLogs("xsilo_client", "ERROR"):
            loop.run(c, None, train)
        first, second = self.agent.receive(), self.agent.receive()
        self.assertEqual((first["type"], first["id"]), ("error", 1))
        self.assertIn("num_samples", first["message"])  # a dict without the count
        self.assertEqual((second["type"], second["id"], second["message"]),
                         ("error", 2, "RuntimeError: CUDA out of memory"))


class CurrentTask(ClientTestCase):
    def test_xc_task_is_the_round_being_trained_under_epochs_and_none_between_rounds(self):
        import xsilo_client as xc
        torch = torch_or_skip()
        c = self.welcomed()
        previous, xc._client = xc._client, c
        self.addCleanup(setattr, xc, "_client", previous)
        model = torch.nn.Linear(3, 2)
        g = self.path("g.safetensors")
        st.save_file({k: v.detach().numpy() for k, v in model.state_dict().items()}, g)
        for i in (4, 5):
            self.send_task(id=i, round=i, model=g, config={"local_epochs": 2, "learning_rate": 0.1})
        self.send_task(kind="shutdown", id=9)
        seen = []
        for epoch in xc.epochs(model, num_samples=4):
            seen.append((epoch, xc.task().round, xc.task().config["learning_rate"]))
        self.assertEqual(seen, [(0, 4, 0.1), (1, 4, 0.1), (0, 5, 0.1), (1, 5, 0.1)])
        self.assertIsNone(xc.task())


class NonFiniteMetrics(ClientTestCase):
    def setUp(self):
        super().setUp()
        self.torch = torch_or_skip()

    def test_a_nan_loss_logged_under_epochs_does_not_end_the_script(self):
        # Before: xc.log(loss=nan) raised ValueError, the process exited and the agent restarted
        # it (optimizer and scheduler state lost) until it gave up.
        torch = self.torch
        c = self.welcomed()
        model = torch.nn.Linear(3, 2)
        g = self.path("g.safetensors")
        st.save_file({k: v.detach().numpy() for k, v in model.state_dict().items()}, g)
        for i in (1, 2):
            self.send_task(id=i, round=i, model=g, config={"local_epochs": 2})
        self.send_task(kind="shutdown", id=3)
        losses = iter([0.9, float("nan"), 0.4, 0.3])
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            for _ in loop.epochs(c, model, num_samples=4):
                c.log({"loss": torch.tensor(next(losses))})
        first, second = self.agent.receive(), self.agent.receive()
        self.assertEqual((first["type"], first["id"], first["metrics"]), ("result", 1, {}))
        self.assertEqual((second["type"], second["id"]), ("result", 2))
        self.assertAlmostEqual(second["metrics"]["loss"], 0.3, places=6)
        self.assertEqual(err.getvalue().count("metric 'loss' is nan"), 1)

    def test_a_nan_loss_returned_by_a_run_callback_is_left_out(self):
        c = self.welcomed()
        model = self.torch.nn.Linear(3, 2)
        g = self.path("g.safetensors")
        st.save_file({k: v.detach().numpy() for k, v in model.state_dict().items()}, g)
        self.send_task(id=1, model=g, config={})
        self.send_task(kind="shutdown", id=2)
        with contextlib.redirect_stderr(io.StringIO()):
            loop.run(c, model, lambda m, t: (3, {"loss": float("nan"), "steps": 10}))
        result = self.agent.receive()
        self.assertEqual((result["type"], result["num_samples"], result["metrics"]), ("result", 3, {"steps": 10}))


class Privacy(ClientTestCase):
    """privacy= on xc.epochs and xc.run: each round's train result reports its DP-SGD, as
    xc.send(privacy=...) does, so a silo with a privacy budget keeps the script's own loop."""

    def setUp(self):
        super().setUp()
        self.torch = torch_or_skip()

    def model(self):
        self.torch.manual_seed(0)
        return self.torch.nn.Linear(3, 2)

    def two_rounds(self, model):
        g = self.path("g.safetensors")
        st.save_file({k: v.detach().numpy() for k, v in model.state_dict().items()}, g)
        self.send_task(id=1, round=1, model=g, config={"local_epochs": 2})
        self.send_task(kind="evaluate", id=2, round=1, model=g)
        self.send_task(id=3, round=2, model=g, config={"local_epochs": 1})
        self.send_task(kind="shutdown", id=4)

    def test_epochs_reports_an_engines_steps_of_each_round(self):
        c, model, engine = self.welcomed(), self.model(), FakeEngine()
        engine.max_grad_norm = 1.5
        self.two_rounds(model)
        for _ in loop.epochs(c, model, num_samples=10, evaluate=lambda: {"eval_samples": 1}, privacy=engine):
            engine.accountant.step(1.1, 0.05, 20)  # one epoch of DP-SGD
        first, ev, second = self.agent.receive(), self.agent.receive(), self.agent.receive()
        self.assertEqual(first["privacy"], {"sample_rate": 0.05, "noise_multiplier": 1.1, "steps": 40,
                                            "clip_norm": 1.5})
        self.assertNotIn("privacy", ev)  # evaluate results carry none
        self.assertEqual(second["privacy"]["steps"], 20)

    def test_epochs_calls_a_privacy_function_after_each_rounds_last_epoch(self):
        c, model = self.welcomed(), self.model()
        self.two_rounds(model)
        steps = []
        for epoch in loop.epochs(c, model, num_samples=10, evaluate=lambda: {},
                                 privacy=lambda: {"sample_rate": 0.1, "noise_multiplier": 2, "steps": len(steps)}):
            steps.append(epoch)
        reports = [m.get("privacy") for m in (self.agent.receive() for _ in range(3))]
        self.assertEqual(reports, [{"sample_rate": 0.1, "noise_multiplier": 2.0, "steps": 2}, None,
                                   {"sample_rate": 0.1, "noise_multiplier": 2.0, "steps": 3}])

    def test_run_reports_privacy_from_an_engine_or_a_function_of_model_and_task(self):
        for kind in ("engine", "function"):
            with self.subTest(kind=kind):
                if kind == "function":  # a fresh channel for the second run
                    self.setUp()
                c, model, engine = self.welcomed(), self.model(), FakeEngine()
                self.two_rounds(model)

                def train(m, task):
                    engine.accountant.step(0.9, 0.02, 10 * task.local_epochs)
                    return 5

                seen = []

                def report(m, task):
                    seen.append((m is model, task.round))
                    return engine

                loop.run(c, model, train, evaluate=lambda m, t: {},
                         privacy=engine if kind == "engine" else report)
                results = [self.agent.receive() for _ in range(3)]
                self.assertEqual([r.get("privacy", {}).get("steps") for r in results], [20, None, 10])
                if kind == "function":
                    self.assertEqual(seen, [(True, 1), (True, 2)])

    def test_a_model_with_batch_norm_under_dp_sgd_is_warned_of_once(self):
        # Its running statistics are computed from the records without noise and federated.
        torch = self.torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
        c = self.welcomed()
        self.two_rounds(model)
        with self.assertLogs("xsilo_client", "WARNING") as logs:
            for _ in loop.epochs(c, model, num_samples=10, evaluate=lambda: {},
                                 privacy={"sample_rate": 0.1, "noise_multiplier": 2, "steps": 1}):
                pass
        warned = [line for line in logs.output if "BatchNorm" in line]
        self.assertEqual(len(warned), 1, logs.output)  # two train results, one warning
        self.assertIn("BatchNorm layers (1)", warned[0])
        self.assertIn("ModuleValidator.fix", warned[0])

    def test_batch_norm_kept_out_of_the_federation_or_absent_is_not_warned_of(self):
        torch = self.torch
        with_bn = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
        for name, model, federate in (("no BatchNorm", self.model(), None),
                                      ("BatchNorm kept local", with_bn, lambda n: not n.startswith("1."))):
            with self.subTest(name):
                self.setUp()
                c = self.welcomed()
                self.two_rounds(model)
                with self.assertLogs("xsilo_client", "INFO") as logs:
                    for _ in loop.epochs(c, model, num_samples=10, evaluate=lambda: {}, federate=federate,
                                         privacy={"sample_rate": 0.1, "noise_multiplier": 2, "steps": 1}):
                        logging.getLogger("xsilo_client").info("an epoch")
                self.assertFalse([line for line in logs.output if "BatchNorm" in line], logs.output)

    def test_run_by_hand_ignores_privacy(self):
        from xsilo_client import Client
        engine = FakeEngine()
        loop.run(Client(env={}), self.model(), lambda m, t: 3, privacy=engine)
        self.assertEqual(list(loop.epochs(Client(env={}), self.model(), 3, epochs=2, privacy=engine)), [0, 1])


class ByHand(ClientTestCase):
    """The same loop without an agent: it trains centrally."""

    def test_without_an_agent_the_loop_is_one_train_task_of_the_given_epochs(self):
        from xsilo_client import Client
        c = Client(env={})
        seen = []
        for task in loop.tasks(c, None, evaluate=True, epochs=5):
            seen.append((task.kind, task.local_epochs))
            c.send(metrics={"loss": 1.0})
        self.assertEqual(seen, [("train", 5), ("evaluate", 5)])


class Environment(ClientTestCase):
    def test_data_paths_come_from_the_agent_else_the_defaults(self):
        from xsilo_client import Client
        self.assertEqual(Client(env={}).data_paths(("a.csv", None)), ("a.csv", None))
        env = {"XSILO_TRAIN_DATA": "/d/train.csv", "XSILO_TEST_DATA": "/d/test.csv"}
        self.assertEqual(Client(env=env).data_paths(("a.csv", "b.csv")), ("/d/train.csv", "/d/test.csv"))

    def test_feature_statistics_reach_the_task_and_standardize(self):
        c = self.welcomed()
        self.agent.send({"type": "task", "id": 1, "kind": "train", "round": 1, "model": self.global_model(),
                         "config": {}, "feature_stats": {"mean": [1.0, 2.0], "var": [4.0, 0.0], "count": 10}})
        task = c.receive()
        self.assertEqual(task.feature_stats.count, 10)
        np.testing.assert_allclose(task.feature_stats.standardize(np.array([[3.0, 5.0]])), [[1.0, 3.0]])

    def test_the_process_group_the_script_joined_is_reported(self):
        torch = torch_or_skip()
        import torch.distributed as dist
        if not dist.is_available():
            self.skipTest("torch.distributed is not available")
        c = self.welcomed()
        self.send_task(kind="evaluate", id=1)
        c.receive()
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)
        c.send(metrics={})
        self.assertEqual(self.agent.receive()["process_group"], 1)
        del torch


logging.getLogger("xsilo_client").setLevel(logging.INFO)
del os
