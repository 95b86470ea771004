"""The protocol against an agent stand-in, driven in one thread (the messages fit the socket buffers)."""

import contextlib
import io
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import unittest

import numpy as np

import xsilo_client as xc
from xsilo_client import safetensors as st
from xsilo_client import state
from xsilo_client.channel import MAX_FRAME_BYTES

from .support import PYTHON_DIR, AgentTestCase, FakeAgent


class ClientTestCase(AgentTestCase):
    def client(self, rank=0, world_size=1):
        env = {"XSILO_TRAINER_FD": str(self.trainer_sock.detach()), "RANK": str(rank),
               "WORLD_SIZE": str(world_size), "XSILO_SILO": "from-env"}
        c = xc.Client(env=env)
        self.addCleanup(c.close)
        return c

    def welcomed(self, **kw):
        c = self.client(**kw)
        self.welcome()
        c.init()
        self.assertEqual(self.agent.receive()["type"], "hello")
        return c

    def global_model(self, name="global-3.safetensors"):
        path = self.path(name)
        st.save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                      "b": np.array([0.5, -1.0], dtype=np.float32)}, path)
        return path

    def send_task(self, kind="train", id=7, round=3, config=None, model=None):
        message = {"type": "task", "id": id, "kind": kind}
        if kind != "shutdown":
            message.update(round=round, model=model or self.global_model(),
                           config={"local_epochs": 2} if config is None else config)
        self.agent.send(message)


class Handshake(ClientTestCase):
    def test_hello_carries_protocol_sdk_rank_world_size_and_pid(self):
        c = self.client(rank=1, world_size=2)
        self.welcome()
        c.init()
        hello = self.agent.receive()
        self.assertEqual(hello, {"type": "hello", "protocol": 1, "sdk": xc.__version__, "rank": 1,
                                 "world_size": 2, "pid": os.getpid()})
        self.assertEqual(c.silo(), "hospital-01")
        self.assertEqual(c.exchange_dir(), self.exchange)
        c.init()  # idempotent: no second hello
        self.agent.sock.setblocking(False)
        with self.assertRaises(BlockingIOError):
            self.agent.sock.recv(1)

    def test_agent_refusing_the_protocol_version_is_a_clear_error(self):
        c = self.client()
        self.agent.send({"type": "error", "message": "trainer protocol 1 is not supported; agent speaks 2"})
        with self.assertRaisesRegex(xc.ProtocolError, "refused this trainer.*agent speaks 2"):
            c.init()

    def test_welcome_with_another_protocol_version_names_both(self):
        c = self.client()
        self.welcome(protocol=2)
        with self.assertRaisesRegex(xc.ProtocolError, "speaks trainer protocol 2.*speaks 1"):
            c.init()

    def test_welcome_missing_a_required_key_is_refused(self):
        c = self.client()
        self.agent.send({"type": "welcome", "protocol": 1, "silo": "s"})
        with self.assertRaisesRegex(xc.ProtocolError, "lacks 'exchange_dir'"):
            c.init()

    def test_unknown_welcome_keys_are_ignored(self):
        c = self.client()
        self.welcome(future_key={"x": 1})
        c.init()
        self.assertEqual(c.silo(), "hospital-01")

    def test_agent_closing_before_welcome_is_a_connection_error(self):
        c = self.client()
        self.agent.sock.shutdown(socket.SHUT_WR)  # hello can still be sent, nothing comes back
        with self.assertRaisesRegex(ConnectionError, "before answering hello"):
            c.init()
        self.agent.close()
        with self.assertRaisesRegex(ConnectionError, "channel is closed"):
            self.client_on_closed_agent().init()

    def client_on_closed_agent(self):
        agent_end, self.trainer_sock = socket.socketpair()
        agent_end.close()
        return self.client()

    def test_without_an_agent_the_script_is_not_federated(self):
        c = xc.Client(env={"RANK": "0"})
        self.assertFalse(c.is_federated())
        self.assertIsNone(c.silo())
        self.assertEqual((c.rank(), c.world_size()), (0, 1))
        with self.assertRaisesRegex(RuntimeError, "XSILO_TRAINER_FD is not set"):
            c.init()

    def test_a_descriptor_that_is_not_an_open_socket_is_a_clear_error(self):
        with open(os.devnull) as f:
            for fd, error, pattern in [("abc", ValueError, "XSILO_TRAINER_FD='abc' is not a descriptor"),
                                       (str(f.fileno()), ConnectionError, "is not an open socket")]:
                with self.subTest(fd=fd), self.assertRaisesRegex(error, pattern):
                    xc.Client(env={"XSILO_TRAINER_FD": fd}).init()
            os.fstat(f.fileno())  # the file given by mistake stays open

    def test_a_rank_outside_the_world_is_refused(self):
        c = self.client(rank=2, world_size=2)
        with self.assertRaisesRegex(ValueError, "RANK=2"):
            c.init()


class Tasks(ClientTestCase):
    def test_train_task_writes_floating_tensors_and_reports_the_result(self):
        c = self.welcomed()
        self.send_task(config={"local_epochs": 2, "schedule": [1, 2]})
        task = c.receive()
        self.assertEqual((task.kind, task.id, task.round), ("train", 7, 3))
        self.assertEqual(task.config, {"local_epochs": 2, "schedule": [1, 2], "round": 3})
        self.assertEqual(task.model_path, self.path("global-3.safetensors"))
        arrays = task.arrays()
        np.testing.assert_array_equal(arrays["w"], np.arange(6, dtype=np.float32).reshape(2, 3))

        update = {"w": arrays["w"] + 1, "b": arrays["b"].astype(np.float16),
                  "steps": np.array(5, dtype=np.int64)}
        with self.assertLogs("xsilo_client", "INFO") as logs:
            c.send(update, num_samples=np.int64(120), metrics={"loss": np.float32(0.25)})
        self.assertEqual(len(logs.records), 1)
        self.assertIn("steps", logs.output[0])

        result = self.agent.receive()
        path = os.path.join(self.exchange, "update-3-7.safetensors")
        # The agent is told once which tensors stay local (it logs them at WARNING), and that
        # this process joined no torch.distributed group (it refuses local.workers > 1 then).
        self.assertEqual(result, {"type": "result", "id": 7, "rank": 0, "weights": path,
                                  "num_samples": 120, "metrics": {"loss": 0.25}, "process_group": 0,
                                  "notes": {"kept_local": ["steps"]}})
        self.assertEqual(logs.records[0].levelname, "WARNING")
        written = st.load_file(path)
        self.assertEqual(set(written), {"w", "b"})
        self.assertEqual(written["b"].dtype, np.float16)
        np.testing.assert_array_equal(written["w"], update["w"])
        self.assertEqual(os.listdir(self.exchange), ["update-3-7.safetensors"])

    def test_a_train_result_carries_the_dp_sgd_it_ran(self):
        c = self.welcomed()
        self.send_task()
        task = c.receive()
        c.send({"w": task.arrays()["w"]}, num_samples=10,
               privacy={"sample_rate": 0.1, "noise_multiplier": 1.5, "steps": 20})
        result = self.agent.receive()
        self.assertEqual(result["privacy"], {"sample_rate": 0.1, "noise_multiplier": 1.5, "steps": 20})

    def test_integer_tensors_are_logged_once_only(self):
        c = self.welcomed()
        records = []
        handler = logging.Handler(logging.INFO)
        handler.emit = records.append
        xc.client.log.addHandler(handler)
        self.addCleanup(xc.client.log.removeHandler, handler)
        old_level = xc.client.log.level
        xc.client.log.setLevel(logging.INFO)
        self.addCleanup(xc.client.log.setLevel, old_level)
        for i in range(3):
            self.send_task(id=i, round=i)
            c.receive()
            c.send({"w": np.zeros(2, np.float32), "n": np.array([1])}, num_samples=1)
            self.assertEqual(list(st.load_file(self.agent.receive()["weights"])), ["w"])
        self.assertEqual([r.getMessage() for r in records],
                         ["not federated, kept local (integer/bool tensors): n"])

    def test_float64_tensors_are_sent_as_float32(self):
        c = self.welcomed()
        self.send_task()
        c.receive()
        c.send({"w": np.array([1.5, 2.0])}, num_samples=3)
        path = self.agent.receive()["weights"]
        self.assertEqual(st.load_file(path)["w"].dtype, np.float32)

    def test_evaluate_task_sends_metrics_without_weights(self):
        c = self.welcomed()
        self.send_task(kind="evaluate", id=8)
        task = c.receive()
        self.assertEqual(task.kind, "evaluate")
        c.send({"w": np.zeros(1, np.float32)}, metrics={"eval_loss": np.float64(0.5),
                                                         "eval_accuracy": 0.75, "eval_samples": 40})
        result = self.agent.receive()
        self.assertEqual(result, {"type": "result", "id": 8, "rank": 0, "weights": None,
                                  "num_samples": None, "metrics": {"eval_loss": 0.5,
                                                                   "eval_accuracy": 0.75,
                                                                   "eval_samples": 40},
                                  "process_group": 0})
        self.assertEqual(os.listdir(self.exchange), [])

    def test_other_ranks_answer_train_tasks_without_weights(self):
        c = self.welcomed(rank=1, world_size=2)
        self.send_task()
        c.receive()
        c.send({"w": np.zeros(1, np.float32)}, metrics={"loss": 1})
        result = self.agent.receive()
        self.assertEqual((result["rank"], result["weights"], result["metrics"]), (1, None, {"loss": 1}))
        self.assertEqual(os.listdir(self.exchange), [])

    def test_shutdown_returns_none_and_closes_the_channel(self):
        c = self.welcomed()
        self.send_task(kind="shutdown", id=9)
        self.assertIsNone(c.receive())
        self.assertIsNone(c.receive())
        self.assertIsNone(self.agent.receive())  # EOF: the trainer closed its end

    def test_send_error_reports_the_current_task(self):
        c = self.welcomed()
        self.send_task(id=11)
        c.receive()
        c.send_error("out of memory")
        self.assertEqual(self.agent.receive(), {"type": "error", "id": 11, "message": "out of memory"})
        with self.assertRaisesRegex(RuntimeError, "call receive"):
            c.send_error("again")

    def test_unknown_task_kind_is_answered_with_an_error_and_the_next_task_runs(self):
        c = self.welcomed()
        self.agent.send({"type": "task", "id": 4, "kind": "distill", "round": 1, "model": "m"})
        self.send_task(id=5, round=1, kind="evaluate")
        task = c.receive()
        self.assertEqual(task.id, 5)
        error = self.agent.receive()
        self.assertEqual((error["type"], error["id"]), ("error", 4))
        self.assertIn("'distill'", error["message"])

    def test_task_missing_its_model_is_answered_with_an_error(self):
        c = self.welcomed()
        self.agent.send({"type": "task", "id": 4, "kind": "train", "round": 1, "config": {}})
        self.send_task(kind="shutdown", id=5)
        self.assertIsNone(c.receive())
        error = self.agent.receive()
        self.assertEqual((error["type"], error["id"]), ("error", 4))
        self.assertIn("'model'", error["message"])

    def test_task_without_an_id_is_a_protocol_error(self):
        c = self.welcomed()
        self.agent.send({"type": "task", "kind": "train"})
        with self.assertRaisesRegex(xc.ProtocolError, "integer id"):
            c.receive()

    def test_receive_twice_without_an_answer_is_refused(self):
        c = self.welcomed()
        self.send_task()
        c.receive()
        with self.assertRaisesRegex(RuntimeError, "task 7 \\(train\\) has no answer"):
            c.receive()

    def test_send_without_a_task_is_refused(self):
        c = self.welcomed()
        with self.assertRaisesRegex(RuntimeError, "call receive"):
            c.send(metrics={})


class Validation(ClientTestCase):
    def setUp(self):
        super().setUp()
        self.c = self.welcomed()
        self.send_task()
        self.task = self.c.receive()
        self.update = {"w": np.zeros(3, np.float32)}

    def test_metrics_must_be_finite_numbers(self):
        for metrics, pattern in [({"loss": "low"}, "'loss' must be a number"),
                                 ({"ok": True}, "'ok' must be a number"),
                                 ({"v": np.ones(2)}, "'v' must be one number"),
                                 ({1: 0.5}, "metric name 1"),
                                 ([0.5], "must be a dict")]:
            with self.subTest(metrics=metrics), self.assertRaisesRegex(ValueError, pattern):
                self.c.send(self.update, num_samples=1, metrics=metrics)
        # The task is still open: a valid answer goes through.
        self.c.send(self.update, num_samples=1, metrics={"loss": np.array(0.5)})
        self.assertEqual(self.agent.receive()["metrics"], {"loss": 0.5})

    def test_a_nan_or_infinite_metric_is_left_out_with_one_warning_and_the_result_still_goes(self):
        # Training that diverged: the weights decide (the agent refuses non-finite ones and keeps
        # the trainer running); a metric must not end the process.
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.c.send(self.update, num_samples=1, metrics={"loss": float("nan"), "acc": 0.5,
                                                            "grad": np.float32("inf")})
            self.send_task(id=8)
            self.c.receive()
            self.c.send(self.update, num_samples=1, metrics={"loss": torch_nan_or_float()})
        first, second = self.agent.receive(), self.agent.receive()
        self.assertEqual((first["type"], first["metrics"]), ("result", {"acc": 0.5}))
        self.assertEqual((second["type"], second["metrics"]), ("result", {}))
        self.assertIsNotNone(first["weights"])
        lines = err.getvalue().splitlines()
        self.assertEqual(len(lines), 2, lines)  # once for 'loss', once for 'grad'
        self.assertIn("metric 'loss' is nan: left out of the round's result", lines[0])
        self.assertIn("metric 'grad' is inf", lines[1])

    def test_a_non_finite_logged_metric_makes_it_missing_not_its_earlier_value(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.c.log({"loss": 0.7, "lr": 0.1})
            self.c.log({"loss": float("-inf")})
        self.assertEqual(self.c.take_logged(), {"lr": 0.1})
        self.assertIn("metric 'loss' is -inf", err.getvalue())

    def test_rank_0_train_result_needs_weights_and_positive_num_samples(self):
        with self.assertRaisesRegex(ValueError, "needs the trained state_dict"):
            self.c.send(num_samples=1)
        with self.assertRaisesRegex(ValueError, "needs num_samples"):
            self.c.send(self.update)
        for bad in (0, -3, 2.5, True):
            with self.subTest(num_samples=bad), self.assertRaisesRegex(ValueError, "positive integer"):
                self.c.send(self.update, num_samples=bad)
        with self.assertRaisesRegex(ValueError, "no floating-point tensors"):
            self.c.send({"n": np.arange(3)}, num_samples=1)
        self.assertEqual(os.listdir(self.exchange), [])

    def test_a_result_too_long_for_a_frame_is_refused_and_leaves_no_file(self):
        metrics = {f"metric_{i:07d}": 0.123456789 for i in range(60000)}
        with self.assertRaisesRegex(ValueError, "exceeds the protocol's limit"):
            self.c.send(self.update, num_samples=1, metrics=metrics)
        self.assertEqual(os.listdir(self.exchange), [])


class Framing(ClientTestCase):
    def test_agent_closing_without_shutdown_is_a_connection_error(self):
        c = self.welcomed()
        self.agent.close()
        with self.assertRaisesRegex(ConnectionError, "without a shutdown task"):
            c.receive()

    def test_agent_closing_mid_frame_is_a_connection_error(self):
        c = self.welcomed()
        self.agent.sock.sendall((100).to_bytes(4, "big") + b'{"type"')
        self.agent.close()
        with self.assertRaisesRegex(ConnectionError, "middle of a message \\(7 of 100"):
            c.receive()

    def test_frames_over_1_mib_are_refused(self):
        c = self.welcomed()
        self.agent.sock.sendall((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
        with self.assertRaisesRegex(xc.ProtocolError, "frame of 1048577 bytes"):
            c.receive()

    def test_frames_that_are_not_json_objects_are_refused(self):
        for payload, pattern in [(b"\xff\xfe", "not UTF-8 JSON"), (b"{oops", "not UTF-8 JSON"),
                                 (b"[1]", "JSON list, not an object"),
                                 (b'{"type": "task", "id": NaN}', "not UTF-8 JSON")]:
            with self.subTest(payload=payload):
                agent_end, self.trainer_sock = socket.socketpair()
                self.agent = FakeAgent(agent_end)
                self.addCleanup(self.agent.close)
                c = self.welcomed()
                self.agent.send_raw(payload)
                with self.assertRaisesRegex(xc.ProtocolError, pattern):
                    c.receive()

    def test_an_agent_error_while_waiting_for_a_task_is_raised(self):
        c = self.welcomed()
        self.agent.send({"type": "error", "message": "agent is stopping: bad config"})
        with self.assertRaisesRegex(xc.ProtocolError, "bad config"):
            c.receive()

    def test_a_frame_of_exactly_the_limit_is_accepted(self):
        c = self.welcomed()
        message = b'{"type":"task","id":9,"kind":"shutdown","pad":"'
        message += b"x" * (MAX_FRAME_BYTES - len(message) - 2) + b'"}'
        self.assertEqual(len(message), MAX_FRAME_BYTES)
        # 1 MiB exceeds the socket buffer: write while the client reads.
        writer = threading.Thread(target=self.agent.send_raw, args=(message,))
        writer.start()
        self.assertIsNone(c.receive())
        writer.join()


class StateDicts(ClientTestCase):
    def test_without_torch_state_dict_is_numpy_and_filled_from_the_last_update(self):
        saved = state._TORCH
        state._TORCH = False
        self.addCleanup(setattr, state, "_TORCH", saved)
        c = self.welcomed()
        self.send_task(id=1, round=0)
        sd = c.receive().state_dict()
        self.assertEqual(set(sd), {"w", "b"})
        self.assertIsInstance(sd["w"], np.ndarray)
        self.assertEqual(sd["w"].dtype, np.float32)
        c.send({"w": sd["w"], "b": sd["b"], "count": np.array([4])}, num_samples=1)
        self.agent.receive()
        self.send_task(id=2, round=1)
        sd = c.receive().state_dict()
        self.assertEqual(set(sd), {"w", "b", "count"})
        np.testing.assert_array_equal(sd["count"], [4])

    def test_like_takes_its_names_and_dtypes_and_refuses_mismatches(self):
        saved = state._TORCH
        state._TORCH = False
        self.addCleanup(setattr, state, "_TORCH", saved)
        c = self.welcomed()
        self.send_task()
        task = c.receive()
        like = {"w": np.zeros((2, 3), np.float16), "b": np.zeros(2, np.float32), "n": np.array(9)}
        sd = task.state_dict(like=like)
        self.assertEqual(list(sd), ["w", "b", "n"])
        self.assertEqual(sd["w"].dtype, np.float16)
        np.testing.assert_array_equal(sd["w"], np.arange(6).reshape(2, 3))
        self.assertEqual(int(sd["n"]), 9)
        with self.assertRaisesRegex(ValueError, "tensor 'w' has shape \\[2, 3\\], the local model \\[3, 2\\]"):
            task.state_dict(like={"w": np.zeros((3, 2)), "b": np.zeros(2)})
        with self.assertRaisesRegex(ValueError, "tensors the local model lacks: b"):
            task.state_dict(like={"w": np.zeros((2, 3))})


class ModuleApiInASubprocess(AgentTestCase):
    """The module-level API in a real script that inherits the descriptor, as under the agent."""

    SCRIPT = textwrap.dedent("""
        import logging, sys
        import numpy as np
        import xsilo_client as xc
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        assert xc.is_federated()
        xc.init()
        print("silo", xc.silo(), xc.rank(), xc.world_size(), flush=True)
        while (task := xc.receive()) is not None:
            weights = {k: v * 2 for k, v in task.arrays().items()}
            weights["counter"] = np.array(task.round)
            if task.kind == "evaluate":
                xc.send(metrics={"eval_accuracy": 0.5})
            else:
                xc.send(weights, num_samples=10, metrics={"loss": 1.0 / (1 + task.round)})
        print("done", flush=True)
    """)

    def test_script_runs_rounds_until_shutdown(self):
        model = self.path("global.safetensors")
        st.save_file({"w": np.ones(3, np.float32)}, model)
        fd = self.trainer_sock.fileno()
        env = dict(os.environ, XSILO_TRAINER_FD=str(fd), PYTHONPATH=PYTHON_DIR, RANK="0",
                   WORLD_SIZE="1", PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT], env=env, pass_fds=[fd],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.trainer_sock.close()
        try:
            hello = self.agent.receive()
            self.assertEqual((hello["type"], hello["pid"]), ("hello", proc.pid))
            self.welcome()
            results = []
            for i, kind in enumerate(["train", "evaluate", "train"]):
                self.agent.send({"type": "task", "id": 100 + i, "kind": kind, "round": i,
                                 "model": model, "config": {}})
                results.append(self.agent.receive())
            self.agent.send({"type": "task", "id": 200, "kind": "shutdown"})
            self.assertIsNone(self.agent.receive())
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(out.split("\n"), ["silo hospital-01 0 1", "done", ""])
        self.assertEqual([r["weights"] is not None for r in results], [True, False, True])
        self.assertEqual(results[2]["metrics"], {"loss": 1.0 / 3})
        np.testing.assert_array_equal(st.load_file(results[2]["weights"])["w"], [2, 2, 2])
        self.assertEqual(list(st.load_file(results[0]["weights"])), ["w"])
        self.assertEqual(err.count("counter"), 1, err)  # the integer tensor, logged once


if __name__ == "__main__":
    unittest.main()


def torch_nan_or_float():
    """A NaN as a torch scalar where torch is installed (what loss.item() would have been)."""
    try:
        import torch
    except ImportError:
        return float("nan")
    return torch.tensor(float("nan"))
