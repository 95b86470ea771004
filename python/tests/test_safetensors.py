import json
import os
import tempfile
import unittest

import numpy as np

from xsilo_client import safetensors as st

from .support import safetensors_or_skip, skip, torch_or_skip


def sample_tensors():
    rng = np.random.default_rng(3)
    return {
        "f64": rng.normal(size=(2, 3)),
        "f32": rng.normal(size=(4,)).astype(np.float32),
        "f16": rng.normal(size=(3, 1)).astype(np.float16),
        "i64": np.array([-(2 ** 40), 7], dtype=np.int64),
        "i32": np.array([[-5, 6]], dtype=np.int32),
        "i16": np.array([-300, 300], dtype=np.int16),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u8": np.array([0, 255, 3], dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.float32(2.5),
        "empty": np.zeros((0, 5), dtype=np.float32),
    }


def raw_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return n, f.read(n)


def write_raw(path, header, data=b"", pad=True):
    """A file with the given header (dict or bytes) and data bytes, for corruption tests."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


class RoundTrip(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.file = os.path.join(self.tmp.name, "t.safetensors")

    def test_every_numpy_dtype_comes_back_with_its_dtype_shape_and_values(self):
        tensors = sample_tensors()
        st.save_file(tensors, self.file)
        back = st.load_file(self.file)
        self.assertEqual(set(back), set(tensors))
        for name, value in tensors.items():
            value = np.asarray(value)
            self.assertEqual(back[name].dtype, value.dtype, name)
            self.assertEqual(back[name].shape, value.shape, name)
            np.testing.assert_array_equal(back[name], value, err_msg=name)

    def test_header_names_the_safetensors_dtypes(self):
        st.save_file(sample_tensors(), self.file)
        header = json.loads(raw_header(self.file)[1])
        self.assertEqual({k: v["dtype"] for k, v in header.items()},
                         {"f64": "F64", "f32": "F32", "f16": "F16", "i64": "I64", "i32": "I32",
                          "i16": "I16", "i8": "I8", "u8": "U8", "bool": "BOOL", "scalar": "F32",
                          "empty": "F32"})
        self.assertEqual(header["scalar"]["shape"], [])
        self.assertEqual(header["empty"]["shape"], [0, 5])

    def test_header_is_padded_to_8_bytes_and_every_tensor_aligned_to_its_item_size(self):
        st.save_file(sample_tensors(), self.file)
        n, header = raw_header(self.file)
        self.assertEqual(n % 8, 0)
        self.assertTrue(header.endswith(b"}") or header.rstrip(b" ").endswith(b"}"))
        for name, info in json.loads(header).items():
            size = st.DTYPES[info["dtype"]].itemsize
            self.assertEqual((8 + n + info["data_offsets"][0]) % size, 0, name)

    def test_bf16_bits_round_trip_raw_and_convert_exactly_to_float32(self):
        values = np.array([1.0, -2.5, 0.15625, 2.0 ** 127, -0.0], dtype=np.float32)
        bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # these values are exact in bf16
        st.save_file({"w": st.BF16(bits.reshape(5, 1))}, self.file)
        self.assertEqual(json.loads(raw_header(self.file)[1])["w"]["dtype"], "BF16")
        raw = st.load_file(self.file, bf16="raw")["w"]
        self.assertEqual(raw.dtype, np.uint16)
        np.testing.assert_array_equal(raw.ravel(), bits)
        converted = st.load_file(self.file)["w"]
        self.assertEqual(converted.dtype, np.float32)
        self.assertEqual(converted.shape, (5, 1))
        np.testing.assert_array_equal(converted.ravel(), values)

    def test_metadata_round_trips_and_must_be_strings(self):
        st.save_file({"a": np.ones(2, np.float32)}, self.file, metadata={"format": "pt", "round": "3"})
        self.assertEqual(st.load_metadata(self.file), {"format": "pt", "round": "3"})
        with self.assertRaisesRegex(ValueError, "metadata must map str to str"):
            st.save_file({"a": np.ones(2)}, self.file, metadata={"round": 3})

    def test_arrays_are_read_only_views_of_the_mapping(self):
        st.save_file({"a": np.arange(1000, dtype=np.float32)}, self.file)
        a = st.load_file(self.file)["a"]
        self.assertFalse(a.flags.owndata)
        self.assertFalse(a.flags.writeable)
        with self.assertRaises(ValueError):
            a[0] = 1

    def test_writable_arrays_are_copy_on_write_and_leave_the_file_alone(self):
        st.save_file({"a": np.arange(10, dtype=np.float32)}, self.file)
        a = st.load_file(self.file, writable=True)["a"]
        self.assertFalse(a.flags.owndata)
        a[0] = 42
        self.assertEqual(st.load_file(self.file)["a"][0], 0)

    def test_big_endian_and_strided_inputs_are_written_little_endian_and_contiguous(self):
        big = np.arange(6, dtype=">f4").reshape(2, 3)
        strided = np.arange(12, dtype=np.int32).reshape(3, 4).T
        st.save_file({"big": big, "strided": strided}, self.file)
        back = st.load_file(self.file)
        self.assertEqual(back["big"].dtype, np.dtype("<f4"))
        np.testing.assert_array_equal(back["big"], big)
        np.testing.assert_array_equal(back["strided"], strided)

    def test_unsupported_dtypes_and_names_are_refused_naming_the_tensor(self):
        with self.assertRaisesRegex(ValueError, "tensor 'c'.*complex"):
            st.save_file({"c": np.zeros(2, np.complex64)}, self.file)
        with self.assertRaisesRegex(ValueError, "tensor 'u'.*uint16"):
            st.save_file({"u": np.zeros(2, np.uint16)}, self.file)
        with self.assertRaisesRegex(ValueError, "__metadata__"):
            st.save_file({"__metadata__": np.zeros(2)}, self.file)
        self.assertFalse(os.path.exists(self.file))

    def test_rewriting_replaces_the_file_and_leaves_no_temporary_files(self):
        st.save_file({"a": np.zeros(100, np.float32)}, self.file)
        st.save_file({"b": np.ones(3, np.float32)}, self.file)
        self.assertEqual(list(st.load_file(self.file)), ["b"])
        self.assertEqual(os.listdir(self.tmp.name), ["t.safetensors"])

    def test_a_file_without_tensors_is_valid(self):
        st.save_file({}, self.file, metadata={"k": "v"})
        self.assertEqual(st.load_file(self.file), {})
        self.assertEqual(st.load_metadata(self.file), {"k": "v"})


class Corruption(unittest.TestCase):
    """Every malformed file is refused with a ValueError that says what is wrong."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.file = os.path.join(self.tmp.name, "bad.safetensors")

    def refused(self, pattern):
        with self.assertRaisesRegex(ValueError, pattern):
            st.load_file(self.file)

    def test_empty_and_short_files(self):
        open(self.file, "wb").close()
        self.refused("empty")
        with open(self.file, "wb") as f:
            f.write(b"\x01\x02")
        self.refused("shorter than the 8-byte header length")

    def test_header_length_beyond_the_file(self):
        with open(self.file, "wb") as f:
            f.write((1000).to_bytes(8, "little") + b"{}")
        self.refused("header length 1000 does not fit the file of 10 bytes")

    def test_header_that_is_not_a_json_object(self):
        write_raw(self.file, b"{not json")
        self.refused("not valid JSON")
        write_raw(self.file, b"[1, 2]")
        self.refused("not a JSON object")
        write_raw(self.file, b'{"a": 1, "a": 2}')
        self.refused("'a' appears twice")

    def test_unknown_dtype_names_the_tensor(self):
        write_raw(self.file, {"w": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
        self.refused("tensor 'w': unsupported dtype 'F8'")

    def test_bad_shape_names_the_tensor(self):
        write_raw(self.file, {"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}, b"\0")
        self.refused("tensor 'w': shape")
        write_raw(self.file, {"w": {"dtype": "U8", "shape": "2", "data_offsets": [0, 2]}}, b"\0\0")
        self.refused("tensor 'w': shape")

    def test_offsets_out_of_range_name_the_tensor(self):
        write_raw(self.file, {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4)
        self.refused(r"tensor 'w': data_offsets \[0, 8\] out of the data's 4 bytes")
        write_raw(self.file, {"w": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}}, b"\0" * 4)
        self.refused("tensor 'w': data_offsets")
        write_raw(self.file, {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4)
        self.refused("tensor 'w': data_offsets")

    def test_offsets_inconsistent_with_dtype_and_shape_name_the_tensor(self):
        write_raw(self.file, {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
        self.refused(r"tensor 'w': data_offsets span 8 bytes but F32 \[3\] needs 12")

    def test_overlapping_tensors_are_refused(self):
        write_raw(self.file, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12)
        self.refused("tensor 'b' at \\[4, 12\\] overlaps 'a'")

    def test_gaps_and_trailing_bytes_are_refused(self):
        write_raw(self.file, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8)
        self.refused("tensor 'a' at \\[4, 8\\] leaves a gap")
        write_raw(self.file, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8)
        self.refused("4 bytes after the last tensor")

    def test_metadata_must_hold_strings(self):
        write_raw(self.file, {"__metadata__": {"round": 3}})
        self.refused("__metadata__ must map str to str")

    def test_a_valid_file_cut_short_is_refused(self):
        good = os.path.join(self.tmp.name, "good.safetensors")
        st.save_file({"a": np.ones(4, np.float32)}, good)
        with open(good, "rb") as f:
            data = f.read()
        with open(self.file, "wb") as f:
            f.write(data[:-1])
        self.refused("tensor 'a'")


class WithSafetensorsPackage(unittest.TestCase):
    """Files interoperate with the reference implementation (the safetensors package)."""

    def setUp(self):
        self.reference = safetensors_or_skip()
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def test_the_package_reads_what_we_write(self):
        path = os.path.join(self.tmp.name, "ours.safetensors")
        tensors = sample_tensors()
        st.save_file(tensors, path, metadata={"format": "np"})
        back = self.reference.numpy.load_file(path)
        self.assertEqual(set(back), set(tensors))
        for name, value in tensors.items():
            np.testing.assert_array_equal(back[name], np.asarray(value), err_msg=name)
            self.assertEqual(back[name].dtype, np.asarray(value).dtype, name)

    def test_we_read_what_the_package_writes(self):
        path = os.path.join(self.tmp.name, "theirs.safetensors")
        tensors = {k: np.asarray(v) for k, v in sample_tensors().items()}
        self.reference.numpy.save_file(tensors, path, metadata={"k": "v"})
        back = st.load_file(path)
        for name, value in tensors.items():
            np.testing.assert_array_equal(back[name], value, err_msg=name)
        self.assertEqual(st.load_metadata(path), {"k": "v"})

    def test_the_package_reads_torch_bf16_and_f16_we_write(self):
        torch = torch_or_skip()
        try:
            import safetensors.torch
        except ImportError as e:
            skip(f"safetensors.torch does not import with this torch ({e})")
        path = os.path.join(self.tmp.name, "torch.safetensors")
        tensors = {"bf": torch.randn(3, 4).to(torch.bfloat16), "h": torch.randn(5).half(),
                   "n": torch.tensor([3], dtype=torch.int64)}
        st.save_file(tensors, path)
        back = safetensors.torch.load_file(path)
        for name, value in tensors.items():
            self.assertEqual(back[name].dtype, value.dtype, name)
            self.assertTrue(torch.equal(back[name], value), name)


class TorchTensors(unittest.TestCase):
    def setUp(self):
        self.torch = torch_or_skip()
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.file = os.path.join(self.tmp.name, "t.safetensors")

    def test_every_torch_dtype_is_written_with_its_safetensors_dtype(self):
        torch = self.torch
        tensors = {"F64": torch.randn(2, dtype=torch.float64), "F32": torch.randn(2, 3),
                   "F16": torch.randn(4).half(), "BF16": torch.randn(2, 2).bfloat16(),
                   "I64": torch.tensor([1, -2]), "I32": torch.tensor([3], dtype=torch.int32),
                   "I16": torch.tensor([-4], dtype=torch.int16), "I8": torch.tensor([-5], dtype=torch.int8),
                   "U8": torch.tensor([250], dtype=torch.uint8), "BOOL": torch.tensor([True, False])}
        st.save_file(tensors, self.file)
        header = json.loads(raw_header(self.file)[1])
        self.assertEqual({k: v["dtype"] for k, v in header.items()}, {k: k for k in tensors})
        back = st.load_file(self.file, bf16="raw")
        for name, value in tensors.items():
            if name == "BF16":
                self.assertTrue(torch.equal(torch.from_numpy(back[name].astype(np.int16)).view(torch.bfloat16),
                                            value))
            else:
                self.assertTrue(torch.equal(torch.from_numpy(back[name].copy()), value), name)

    def test_tensors_needing_grad_and_non_contiguous_views_are_written(self):
        torch = self.torch
        w = torch.randn(3, 4, requires_grad=True)
        st.save_file({"w": w, "t": w.detach().t()}, self.file)
        back = st.load_file(self.file)
        np.testing.assert_array_equal(back["w"], w.detach().numpy())
        np.testing.assert_array_equal(back["t"], w.detach().t().numpy())

    def test_unsupported_torch_dtype_is_refused_naming_the_tensor(self):
        with self.assertRaisesRegex(ValueError, "tensor 'z'.*complex"):
            st.save_file({"z": self.torch.zeros(2, dtype=self.torch.complex64)}, self.file)


if __name__ == "__main__":
    unittest.main()
