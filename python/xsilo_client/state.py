"""State dicts as the federation sees them: torch tensors or numpy arrays, by name.

Only floating-point tensors are federated; integer and bool tensors (BatchNorm's
``num_batches_tracked``) stay local. torch is imported only when present and only when needed.
"""

import numpy as np

from .safetensors import BF16, is_torch_tensor

_TORCH = None


def torch_or_none():
    """The torch module, or None when it is not installed."""
    global _TORCH
    if _TORCH is None:
        try:
            import torch
            _TORCH = torch
        except ImportError:
            _TORCH = False
    return _TORCH or None


def as_state_dict(obj):
    """A state dict from a mapping or a module (DistributedDataParallel/DataParallel unwrapped)."""
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        if type(obj).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(obj, "module"):
            obj = obj.module
        return obj.state_dict()
    if hasattr(obj, "items") and callable(obj.items):
        return obj
    raise ValueError(f"expected a state dict or a torch module, got {type(obj).__name__}")


def is_floating(value):
    """True for floating-point tensors; ValueError for kinds the federation cannot carry."""
    if is_torch_tensor(value):
        if value.is_complex():
            raise ValueError(f"complex dtype {value.dtype} cannot be federated")
        return value.is_floating_point()
    if isinstance(value, BF16):
        return True
    dtype = np.asarray(value).dtype
    if dtype.kind == "c":
        raise ValueError(f"complex dtype {dtype} cannot be federated")
    return dtype.kind == "f" or dtype.name == "bfloat16"


def split_floating(state_dict):
    """(floating tensors by name, names of the other tensors), in the state dict's order."""
    floating, other = {}, []
    for name, value in state_dict.items():
        try:
            keep = is_floating(value)
        except ValueError as e:
            raise ValueError(f"tensor {name!r}: {e}") from None
        if keep:
            floating[name] = value
        else:
            other.append(name)
    return floating, other


def dtype_name(value):
    """'float64', 'float32', ... for a torch tensor or an array (the torch. prefix dropped)."""
    if is_torch_tensor(value):
        return str(value.dtype).replace("torch.", "")
    if isinstance(value, BF16):
        return "bfloat16"
    return np.asarray(value).dtype.name


def to_float32(value):
    """A floating tensor as float32 on the CPU (no copy when it already is)."""
    if is_torch_tensor(value):
        import torch
        return value.detach().to(device="cpu", dtype=torch.float32)
    if isinstance(value, BF16):
        value = (value.bits.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(value).astype(np.float32, copy=False)


def shape_of(value):
    if isinstance(value, BF16):
        return tuple(value.shape)
    return tuple(value.shape) if hasattr(value, "shape") else np.shape(value)


def convert_like(value, ref):
    """value (array or tensor) with ref's type, dtype and (for torch) device."""
    if is_torch_tensor(ref):
        import torch
        tensor = value if is_torch_tensor(value) else torch.from_numpy(np.asarray(value))
        return tensor.to(device=ref.device, dtype=ref.dtype)
    array = value.detach().cpu().numpy() if is_torch_tensor(value) else np.asarray(value)
    return array.astype(np.asarray(ref).dtype, copy=False)


def to_preferred(value):
    """A tensor as torch when torch is installed, else as numpy."""
    torch = torch_or_none()
    if torch is not None:
        return value if is_torch_tensor(value) else torch.from_numpy(np.asarray(value))
    return value.detach().cpu().numpy() if is_torch_tensor(value) else np.asarray(value)
