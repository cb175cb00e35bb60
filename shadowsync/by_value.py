"""Send a model factory and the model it builds to other processes by value.

Every process of a job builds the user's `--model` (trainers, their Hogwild workers, the
launcher that checks the options), and a trainer hands its shared model to its workers by
pickle. Plain pickle sends a function or class by name, which another process can only
look up if it can import it: not one defined in a notebook cell or an interactive session
(whose `__main__` no other process has), nor a class defined inside the factory. Such
objects travel by value here, serialized by cloudpickle, as Ray and Dask send user code.

Only the code travels by value. A model's tensors still go the way multiprocessing sends
them (shared memory handles), so Hogwild workers share one copy as before.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING

import cloudpickle

from shadowsync.errors import UserError

if TYPE_CHECKING:  # config imports this module and must not import torch
    from torch import nn


def _by_name_fails(obj: object) -> bool:
    """Whether another process could not find `obj` by its module and name."""
    if getattr(obj, "__module__", None) == "__main__" or "<locals>" in getattr(
            obj, "__qualname__", ""):
        return True
    try:
        pickle.dumps(obj)
    except Exception:  # noqa: BLE001 - any failure means: not by name
        return True
    return False


class ByValue:
    """A function that pickles as its code (cloudpickle), and is called like it."""

    def __init__(self, fn: Callable[..., object], blob: bytes | None = None) -> None:
        self.fn = fn
        self.__module__ = getattr(fn, "__module__", "__main__")
        self.__qualname__ = getattr(fn, "__qualname__", type(fn).__name__)
        self.__name__ = getattr(fn, "__name__", self.__qualname__)
        self._blob = blob

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.fn(*args, **kwargs)

    def blob(self) -> bytes:
        if self._blob is None:
            self._blob = dumps(self.fn, f"model: {self.__module__}:{self.__qualname__}")
        return self._blob

    def __reduce__(self) -> tuple[Callable[[bytes], ByValue], tuple[bytes]]:
        return _load_function, (self.blob(),)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByValue) and other.blob() == self.blob()

    def __hash__(self) -> int:
        return hash(self.blob())


def _load_function(blob: bytes) -> ByValue:
    return ByValue(cloudpickle.loads(blob), blob)


def dumps(obj: object, what: str) -> bytes:
    """cloudpickle's bytes of `obj`, or a one-line UserError saying why it cannot travel."""
    try:
        return cloudpickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - e.g. a lock or an open file in a closure
        raise UserError(f"{what} cannot be sent to other processes, even by value "
                        f"(cloudpickle: {type(e).__name__}: {e})") from None


def portable(fn: Callable[..., object]) -> Callable[..., object]:
    """`fn` itself where other processes can import it, else `fn` sent by value (checked
    now: a factory that cannot travel at all fails here, in one line)."""
    if isinstance(fn, ByValue) or not _by_name_fails(fn):
        return fn
    wrapped = ByValue(fn)
    wrapped.blob()
    return wrapped


# -- model instances whose classes are not importable elsewhere --

_REGISTERED: set[type] = set()


def _reduce_module(module: nn.Module) -> tuple[Callable[[bytes, dict[str, object]], nn.Module],
                                             tuple[bytes, dict[str, object]]]:
    cls = type(module)
    return _rebuild_module, (dumps(cls, f"model class {cls.__qualname__}"), module.__dict__)


def _rebuild_module(class_blob: bytes, state: dict[str, object]) -> nn.Module:
    cls = cloudpickle.loads(class_blob)  # the same class again for the same blob
    module = cls.__new__(cls)
    module.__setstate__(state)
    return module


def send_modules_by_value(objects: tuple[object, ...]) -> None:
    """Make multiprocessing send the `nn.Module`s among `objects` whose class (or a
    submodule's) cannot be imported in another process by value: the class by cloudpickle,
    the state (shared-memory tensors included) as multiprocessing sends it."""
    if "torch" not in sys.modules:
        return
    from torch import nn  # config imports this module and must not import torch

    for obj in objects:
        if not isinstance(obj, nn.Module):
            continue
        for sub in obj.modules():
            cls = type(sub)
            if cls in _REGISTERED or not _by_name_fails(cls):
                continue
            dumps(cls, f"model class {cls.__qualname__}")  # fails here, in one line
            ForkingPickler.register(cls, _reduce_module)
            _REGISTERED.add(cls)
