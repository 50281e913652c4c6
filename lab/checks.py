"""Argument checks shared by the atoms and the drivers, the thread and grad-mode guards of every training function,
and the machine line every quoted timing carries.

Every check raises ValueError with a message that starts with the argument's name, so a learner who
passes the wrong thing sees which argument and what was expected:

    check_tensor("advantages", advantages, ndim=1)      # a finite floating CPU tensor of one dimension
    check_int("steps", steps, low=1, high=100_000)      # a Python int, never a bool or a float
    check_real("epsilon", epsilon, low=0.0, high=1.0, high_open=True)

What counts as a tensor the atoms can handle: an ordinary (strided, not nested) CPU tensor of
float16, bfloat16, float32 or float64 for values; of int8, int16, int32 or int64 for ids (compared in
int64 by the atoms, so a narrow dtype never wraps around); of bool for masks. Meta, sparse, nested,
complex, unsigned and float8 tensors are refused with a ValueError naming the argument.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64)
_KINDS = ("float", "any_float", "int", "bool", "mask")


def dtype_name(dtype):
    """'float64' for torch.float64: a dtype as the JSON files and the messages name it."""
    return str(dtype).replace("torch.", "")


def _dtype_names(dtypes):
    return ", ".join(dtype_name(dtype) for dtype in dtypes)


def check_tensor(name, value, *, kind="float", ndim=None, allow_empty=False):
    """Validate one tensor argument and return it.

    kind: "float" (float16/bfloat16/float32/float64, every value finite), "any_float" (the same dtypes,
    values not checked: the caller checks the positions that count), "int" (int8/16/32/64; uint8 is
    refused because indexing reads it as a mask), "bool", or "mask" (bool, uint8, one of those integer
    dtypes or a float dtype, every value 0 or 1).
    Raises ValueError naming `name` when the value is not a tensor, not an ordinary CPU tensor (meta,
    sparse, nested), of the wrong dtype or number of dimensions, empty (unless allow_empty) or holds a
    non-finite value. Everything but the values is checked first (see check_matching).
    """
    check_tensor_form(name, value, kind=kind, ndim=ndim, allow_empty=allow_empty)
    return check_tensor_values(name, value, kind=kind)


def check_tensor_form(name, value, *, kind="float", ndim=None, allow_empty=False):
    """check_tensor without reading the values: type, layout, device, dtype, dimensions, emptiness."""
    if kind not in _KINDS:  # a programming error in the lab itself, not bad user input
        raise AssertionError(f"unknown tensor kind {kind!r}")
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.is_nested or value.layout != torch.strided:
        layout = "nested" if value.is_nested else str(value.layout).replace("torch.", "")
        raise ValueError(f"{name}: expected an ordinary dense tensor, got a {layout} tensor")
    if value.device.type != "cpu":  # meta tensors hold no values to check or compute with
        raise ValueError(f"{name}: expected a CPU tensor, got device {value.device.type!r}")
    floats = FLOAT_DTYPES if kind in ("float", "any_float", "mask") else ()
    ints = INT_DTYPES + ((torch.uint8,) if kind == "mask" else ()) if kind in ("int", "mask") else ()
    bools = (torch.bool,) if kind in ("bool", "mask") else ()
    allowed = floats + ints + bools
    if value.dtype not in allowed:
        expected = {"float": "a floating-point tensor", "any_float": "a floating-point tensor",
                    "int": "a signed integer tensor", "bool": "a bool tensor", "mask": "a 0/1 mask"}[kind]
        raise ValueError(f"{name}: expected {expected} ({_dtype_names(allowed)}), got {value.dtype}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimension(s), got shape {tuple(value.shape)}")
    if not allow_empty and value.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(value.shape)}")
    return value


def check_tensor_values(name, value, *, kind="float"):
    """The value part of check_tensor: finite ("float") or 0/1 ("mask"), read once per stored element."""
    if kind == "float" and not bool(torch.isfinite(stored(value)).all()):
        raise ValueError(f"{name}: expected finite values, found NaN or inf")
    if kind == "mask" and value.dtype != torch.bool:
        values = stored(value)
        if not bool(((values == 0) | (values == 1)).all()):
            raise ValueError(f"{name}: expected only 0/1 (or True/False) values")
    return value


def stored(tensor):
    """The detached tensor without its broadcast dimensions (stride 0, as `expand` makes): every value it
    holds, read once. A (1,) tensor expanded to 2**33 elements is one value, not 64 GB to scan."""
    index = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in tensor.stride())
    return tensor.detach()[index]


def check_same_shape(names_and_tensors):
    """Raise ValueError unless every tensor in [(name, tensor), ...] has the first one's shape."""
    first_name, first = names_and_tensors[0]
    for name, tensor in names_and_tensors[1:]:
        if tensor.shape != first.shape:
            raise ValueError(
                f"{name}: expected the shape of {first_name} {tuple(first.shape)}, got {tuple(tensor.shape)}"
            )


def check_same_dtype(names_and_tensors):
    """Raise ValueError unless every floating tensor in [(name, tensor), ...] shares one dtype."""
    first_name, first = names_and_tensors[0]
    for name, tensor in names_and_tensors[1:]:
        if tensor.dtype != first.dtype:
            raise ValueError(f"{name}: expected dtype {first.dtype} like {first_name}, got {tensor.dtype}")


def check_matching(pairs, *, kind="float", ndim=None):
    """check_tensor on every (name, tensor) of `pairs`, with the same shape and dtype as the first. The
    values are read last: a tensor of the wrong shape is refused before any of them is scanned."""
    for name, value in pairs:
        check_tensor_form(name, value, kind=kind, ndim=ndim)
    check_same_shape(pairs)
    check_same_dtype(pairs)
    for name, value in pairs:
        check_tensor_values(name, value, kind=kind)


def check_real(name, value, *, low=None, high=None, low_open=False, high_open=False):
    """Validate a real scalar (int or float, not bool, finite) within [low, high] and return it as float.

    low_open / high_open make that end of the range exclusive. Raises ValueError naming `name`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a real number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond the float range
        raise ValueError(f"{name}: expected a finite number, got an integer with {len(str(abs(value)))} digits") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name}: expected a value {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{name}: expected a value {'<' if high_open else '<='} {high}, got {value}")
    return value


def check_int(name, value, *, low=None, high=None):
    """Validate an integer argument (a Python int, never bool or float) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name}: expected an integer in [{low}, {high}], got {value}")
    return value


def check_indices(name, values, count):
    """Validate a list of indices into `count` items: a 1-D integer tensor (checked at once, by its least
    and greatest value) or a list/tuple of ints (each checked). Returns a list of ints in [0, count - 1]."""
    if isinstance(values, torch.Tensor):
        check_tensor(name, values, kind="int", ndim=1)
        if values.numel() and (int(values.min()) < 0 or int(values.max()) > count - 1):
            bad = values[(values < 0) | (values > count - 1)][0]
            raise ValueError(f"{name}: expected an integer in [0, {count - 1}], got {int(bad)}")
        return values.tolist()
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name}: expected a 1-D integer tensor or a list of ints, got {type(values).__name__}")
    return [check_int(name, value, low=0, high=count - 1) for value in values]


def check_choice(name, value, choices):
    """Validate a string option against a tuple of allowed values and return it."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def finite_result(name):
    """Decorator of an atom: when it checks its arguments (check=True, the default), it also checks its
    result, once: a NaN or inf from finite arguments (values or scalars too large for the dtype) is a
    ValueError naming `name`, the argument the result is blamed on, and the dtype, never a silent NaN.
    With check=False (a training loop's own tensors) the result is returned unread."""

    def decorate(atom):
        @functools.wraps(atom)
        def checked_atom(*args, **kwargs):
            result = atom(*args, **kwargs)
            if kwargs.get("check", True):
                for tensor in result if isinstance(result, tuple) else (result,):
                    if tensor.is_floating_point() and not bool(torch.isfinite(stored(tensor)).all()):
                        dtype = dtype_name(tensor.dtype)
                        raise ValueError(f"{name}: the result overflows {dtype} (NaN or inf from finite arguments: "
                                         f"values, or a scalar applied to them, too large for {dtype})")
            return result

        return checked_atom

    return decorate


def exp_limit(dtype):
    """The largest log-value whose exp() stays finite in `dtype`, less one nat of headroom (about 708.8
    for float64, 87.7 for float32, 10.1 for float16): the atoms clamp log-ratios there before exp()."""
    return math.log(torch.finfo(dtype).max) - 1.0


def machine():
    """CPU model, cores, Python and torch versions: the line every quoted time needs."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
            f"{platform.system()} {platform.machine()}")


def import_torch_lazy_modules():
    """Build and drop one optimizer: a process's first one imports torch._dynamo and sympy (1-2 s, several
    on a loaded machine). Called before forking workers, so that they inherit the modules instead of each
    importing them again, and before a clock starts, so that the import is not counted as a run's time."""
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])


@contextlib.contextmanager
def torch_threads(count):
    """Run a block (or, as a decorator, a function) with `count` torch threads, then restore the count.

    The lab's tensors hold a few dozen numbers: extra OpenMP threads only add waiting, and on a busy
    machine a tiny softmax then takes milliseconds instead of microseconds (a 3 s run took 45 s).
    One thread gives the same bytes.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def training_mode():
    """Run a block (or, as a decorator, a training function) with autograd on, whatever the caller's mode.

    A training loop calls backward(), so it needs gradient even when its caller runs under
    torch.no_grad() or torch.inference_mode(). enable_grad alone is not enough under inference_mode:
    the tensors made there record no graph ("element 0 of tensors does not require grad"), so
    inference_mode(False) comes first. Both modes are restored on the way out, an exception included.
    """
    with torch.inference_mode(False), torch.enable_grad():
        yield
