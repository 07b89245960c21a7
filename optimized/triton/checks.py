"""Argument checks shared by the TurboQuant launchers. Shape/dtype checks always run; checks that
read tensor values (ranges, NaN) need a device-to-host copy, so they are skipped while a CUDA graph
is being captured (a captured call replays the shapes a checked call already validated)."""
from __future__ import annotations

FLOAT_DTYPES = ("float16", "bfloat16", "float32")


def capturing(t) -> bool:
    import torch

    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_tensor(name: str, t, shape: tuple, dtypes: tuple[str, ...], device=None, contiguous: bool = False):
    """TypeError/ValueError naming ``name`` unless ``t`` is a torch tensor of ``shape`` (None
    entries: any size) and one of ``dtypes`` (torch dtype names), on ``device``; with ``contiguous``
    also C-contiguous (for tensors a kernel reads at ``ptr + i`` while the checks read them through
    their strides)."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if str(t.dtype).removeprefix("torch.") not in dtypes:
        raise TypeError(f"{name} must have dtype in {dtypes}, got {t.dtype}")
    if t.dim() != len(shape) or any(w is not None and s != w for s, w in zip(t.shape, shape)):
        want = ", ".join("*" if w is None else str(w) for w in shape)
        raise ValueError(f"{name} must have shape [{want}], got {list(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {list(t.stride())} for shape {list(t.shape)}")
    return t


def check_output(name: str, t, shape: tuple, dtypes: tuple[str, ...], device):
    """``check_tensor``, and strides a kernel can write through without leaving ``t`` or writing one
    element twice: rows contiguous (last stride 1) and no self-overlap (each stride, by size,
    at least the span of the dimensions inside it)."""
    check_tensor(name, t, shape, dtypes, device)
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} rows must be contiguous (last stride 1), got strides {list(t.stride())}")
    check_no_overlap(name, t)
    return t


def check_no_overlap(name: str, t) -> None:
    """ValueError naming ``name`` when two indices of ``t`` address the same element (a stride 0 of
    ``expand``, or strides smaller than the span of the dimensions inside them)."""
    span = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s > 1):
        if stride < span:
            raise ValueError(f"{name} overlaps itself: strides {list(t.stride())} for shape {list(t.shape)}")
        span = stride * size


def index_tensor(name: str, x, device):
    """A Python list or tuple of integers as an int32 tensor on ``device`` (anything else is
    returned as it is, for ``check_tensor``); TypeError naming ``name`` for non-integers."""
    import torch

    from reference.arguments import indices

    if not isinstance(x, (list, tuple)):
        return x
    return torch.from_numpy(indices(name, x)).to(device)


def check_finite(name: str, t) -> None:
    import torch

    if not capturing(t) and t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds NaN or Inf")


_FINITE: dict[int, tuple] = {}  # id -> (weak reference, version counter) of device tensors found finite


def check_finite_once(name: str, t) -> None:
    """``check_finite`` for a tensor that stays the same between calls (a decode's rotation). A tensor
    in CPU memory is checked every call (cheap, and a NumPy view of it writes without torch knowing).
    A device tensor is checked again only when ``t`` is another tensor or torch wrote it in place since
    (its version counter moved), so repeated calls allocate nothing on the device. The contract: a
    write torch does not make (another library through DLPack, a raw kernel on its pointer) is not
    seen; pass a fresh tensor after one."""
    import weakref

    if t.device.type == "cpu":
        check_finite(name, t)
        return
    seen = _FINITE.get(id(t))
    if seen is not None and seen[0]() is t and seen[1] == t._version:
        return
    check_finite(name, t)
    if capturing(t):
        return
    if len(_FINITE) >= 64:  # forget tensors that are gone
        for key in [k for k, (ref, _) in _FINITE.items() if ref() is None]:
            del _FINITE[key]
    _FINITE[id(t)] = (weakref.ref(t), t._version)


def check_range(name: str, t, lo: int, hi: int) -> None:
    """ValueError unless every element of the integer tensor ``t`` is in ``[lo, hi)``."""
    if capturing(t) or t.numel() == 0:
        return
    mn, mx = int(t.min()), int(t.max())
    if mn < lo or mx >= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}), got values in [{mn}, {mx}]")


def check_positive(name: str, n: int) -> None:
    if n < 1:
        raise ValueError(f"{name} must be at least 1 (zero-length input), got {n}")
