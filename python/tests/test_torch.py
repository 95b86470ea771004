"""The SDK with PyTorch modules: global models into modules, trained modules out."""

import json
import logging
import os
import unittest

import numpy as np

import xsilo_client as xc
from xsilo_client import safetensors as st

from .support import AgentTestCase, torch_or_skip


def small_net(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 3))


def header_dtypes(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: v["dtype"] for k, v in header.items()}


class TorchTestCase(AgentTestCase):
    def setUp(self):
        self.torch = torch_or_skip()
        super().setUp()
        self.net = small_net(self.torch)
        self.global_path = self.path("global-1.safetensors")
        xc.save_initial(self.net, self.global_path)
        self.c = xc.Client(env={"XSILO_TRAINER_FD": str(self.trainer_sock.detach())})
        self.addCleanup(self.c.close)
        self.welcome()
        self.c.init()
        self.agent.receive()

    def task(self, kind="train", id=1):
        self.agent.send({"type": "task", "id": id, "kind": kind, "round": 1, "model": self.global_path,
                         "config": {}})
        return self.c.receive()


class InitialModel(TorchTestCase):
    def test_save_initial_writes_float32_and_leaves_integer_buffers_out(self):
        torch = self.torch
        net = small_net(torch)
        net[0].half()
        net[3].double()
        path = self.path("init.safetensors")
        with self.assertLogs("xsilo_client", "INFO") as logs:
            names = xc.save_initial(net, path)
        self.assertIn("1.num_batches_tracked", logs.output[0])
        expected = [k for k, v in net.state_dict().items() if v.is_floating_point()]
        self.assertEqual(names, expected)
        self.assertEqual(header_dtypes(path), {k: "F32" for k in expected})
        back = st.load_file(path)
        for name in expected:
            np.testing.assert_array_equal(back[name], net.state_dict()[name].float().numpy(), err_msg=name)


class GlobalModelIn(TorchTestCase):
    def test_state_dict_is_float32_torch_tensors(self):
        sd = self.task().state_dict()
        self.assertTrue(all(isinstance(v, self.torch.Tensor) and v.dtype == self.torch.float32
                            for v in sd.values()))
        self.assertNotIn("1.num_batches_tracked", sd)

    def test_load_into_sets_the_global_weights_and_keeps_local_integer_buffers(self):
        torch = self.torch
        local = small_net(torch)
        with torch.no_grad():
            for p in local.parameters():
                p.add_(1.0)
        local[1].num_batches_tracked.fill_(17)
        self.task().load_into(local)
        for name, value in self.net.state_dict().items():
            if name == "1.num_batches_tracked":
                self.assertEqual(int(local.state_dict()[name]), 17)
            else:
                self.assertTrue(torch.equal(local.state_dict()[name], value), name)

    def test_load_into_casts_to_the_modules_dtypes(self):
        torch = self.torch
        local = small_net(torch).to(torch.bfloat16)
        self.task().load_into(local)
        self.assertEqual(local[3].weight.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(local[3].weight, self.net[3].weight.detach().to(torch.bfloat16)))

    def test_load_into_refuses_a_module_of_another_shape(self):
        torch = self.torch
        other = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4),
                                    torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
        with self.assertRaisesRegex(ValueError, "tensor '3.weight' has shape \\[3, 144\\], the local model \\[5, 144\\]"):
            self.task().load_into(other)

    def test_load_into_keeps_the_modules_own_variance_where_the_global_one_is_negative(self):
        # Found by `xsilo bench compression --sim examples/pytorch/sim.json`: sign compression
        # took a BatchNorm running variance below zero, and evaluation gave NaN.
        torch = self.torch
        tensors = {k: v.float() for k, v in self.net.state_dict().items() if v.is_floating_point()}
        var = tensors["1.running_var"].clone()
        var[0], var[2] = -0.02, 0.5
        tensors["1.running_var"] = var
        xc.save_initial(tensors, self.global_path)
        local = small_net(torch)
        with torch.no_grad():
            local[1].running_var.copy_(torch.tensor([0.3, 0.4, 0.6, 0.7]))
        with self.assertLogs("xsilo_client", "WARNING") as logs:
            self.task().load_into(local)
        self.assertIn("1 of 4 values of 1.running_var are negative", logs.output[0])
        self.assertTrue(torch.equal(local[1].running_var, torch.tensor([0.3, var[1].item(), 0.5, var[3].item()])))
        self.assertTrue(torch.equal(local[3].weight, self.net[3].weight.detach()))
        local.eval()
        self.assertTrue(torch.isfinite(local(torch.randn(2, 1, 8, 8))).all())

    def test_state_dict_without_like_fills_integer_buffers_from_the_last_update(self):
        torch = self.torch
        task = self.task(id=1)
        task.load_into(self.net)
        self.net[1].num_batches_tracked.fill_(5)
        self.c.send(self.net.state_dict(), num_samples=8)
        self.agent.receive()
        sd = self.task(id=2).state_dict()
        self.assertEqual(int(sd["1.num_batches_tracked"]), 5)
        fresh = small_net(torch)
        fresh.load_state_dict(sd)  # strict: every name is there


class TrainedModelOut(TorchTestCase):
    def test_half_and_bfloat16_weights_are_sent_in_their_own_dtype(self):
        torch = self.torch
        self.task()
        self.net[0].half()
        self.net[3].bfloat16()
        with self.assertLogs("xsilo_client", logging.INFO) as logs:
            self.c.send(self.net.state_dict(), num_samples=32, metrics={"loss": torch.tensor(0.5)})
        self.assertEqual(len(logs.records), 1)
        self.assertIn("1.num_batches_tracked", logs.output[0])
        result = self.agent.receive()
        self.assertEqual(result["metrics"], {"loss": 0.5})
        self.assertEqual(result["weights"], os.path.join(self.exchange, "update-1-1.safetensors"))
        dtypes = header_dtypes(result["weights"])
        self.assertEqual(dtypes, {"0.weight": "F16", "0.bias": "F16", "1.weight": "F32", "1.bias": "F32",
                                  "1.running_mean": "F32", "1.running_var": "F32",
                                  "3.weight": "BF16", "3.bias": "BF16"})
        back = st.load_file(result["weights"])
        self.assertTrue(torch.equal(torch.from_numpy(back["3.weight"].copy()), self.net[3].weight.float()))
        self.assertTrue(torch.equal(torch.from_numpy(back["0.bias"].copy()), self.net[0].bias))

    def test_a_module_is_accepted_in_place_of_its_state_dict(self):
        self.task()
        self.c.send(self.net, num_samples=4)
        path = self.agent.receive()["weights"]
        self.assertEqual(set(st.load_file(path)), set(header_dtypes(self.global_path)))

    def test_the_update_loads_back_into_pytorch(self):
        torch = self.torch
        self.task()
        self.c.send(self.net.state_dict(), num_samples=4)
        path = self.agent.receive()["weights"]
        loaded = {k: torch.from_numpy(v.copy()) for k, v in st.load_file(path).items()}
        fresh = small_net(torch)
        with torch.no_grad():
            for p in fresh.parameters():
                p.zero_()
        missing, unexpected = fresh.load_state_dict(loaded, strict=False)
        # BatchNorm fills in its own num_batches_tracked when the file lacks it (torch >= 1.x).
        self.assertEqual(unexpected, [])
        self.assertLessEqual(set(missing), {"1.num_batches_tracked"})
        for name, value in loaded.items():
            self.assertTrue(torch.equal(fresh.state_dict()[name], self.net.state_dict()[name]), name)


if __name__ == "__main__":
    unittest.main()
