"""Which of a model's tensors a script federates (``federate=``): partial federation, for
example only the LoRA adapters of a frozen base model. The server's model then holds only
those tensors; the others stay in the silo, as integer buffers always do."""

import fnmatch


def name_filter(federate):
    """A function name -> bool from ``federate`` (None for None: every tensor), a glob pattern
    ("*lora_*"), a list or tuple of patterns (a name matching any), or a function of the name.
    ValueError for anything else, or an empty list (it would federate nothing)."""
    if federate is None:
        return None
    if callable(federate):
        return lambda name: bool(federate(name))
    patterns = [federate] if isinstance(federate, str) else federate
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError("federate= must be a glob pattern, a list of them, or a function of the "
                         f"tensor name; got {federate!r}")
    if not patterns:
        raise ValueError("federate= is an empty list: it would federate no tensor")
    patterns = list(patterns)
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)
