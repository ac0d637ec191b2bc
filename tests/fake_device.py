"""A CPU-backed stand-in for an accelerator, so that device bugs show up on a machine without one.

:func:`fake_gpu` registers (once per process) PyTorch's Python-only PrivateUse1 backend under the
name ``"fakegpu"`` and, while active, runs every aten op through :class:`FakeGpuMode`:

- ``x.to("fakegpu")`` (and factories with ``device="fakegpu"``) give a :class:`FakeGpuTensor`, a
  wrapper that reports ``device == fakegpu:0`` and keeps its values in a CPU tensor;
  ``.cpu()`` / ``.to("cpu")`` give a plain CPU tensor back;
- an op that mixes fakegpu tensors with CPU tensors of one or more dimensions raises
  ``RuntimeError("Expected all tensors to be on the same device ...")``, as CUDA does (0-d CPU
  tensors are allowed, as on CUDA); so does indexing one device's tensor with another's indices;
- a random op given a CPU ``torch.Generator`` for fakegpu tensors raises, as CUDA does.

Every kernel runs on the CPU, so results equal the CPU's, bit for bit when the same kernels run.
Only what these rules check is checked (no streams, no memory): a test of device plumbing.

The backend is registered when this module is imported (once per process, for good): the
autograd engine sizes its per-device queues at the process's first backward pass, so a test
module importing this at collection gets a backend that backward passes can run on.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "fakegpu"


def _register() -> torch.device:
    if torch._C._get_privateuse1_backend_name() != NAME:
        from torch.utils import backend_registration

        backend_registration._setup_privateuseone_for_python_backend(NAME)
    return torch.device(NAME, 0)


DEVICE = _register()


class FakeGpuTensor(torch.Tensor):
    """A tensor on ``fakegpu:0`` whose values are the CPU tensor ``elem``."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                device=torch.device(NAME, 0), requires_grad=elem.requires_grad,
                                                storage_offset=elem.storage_offset())
        r.elem = elem
        return r

    def __repr__(self):
        return f"FakeGpuTensor({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # only under FakeGpuMode
        raise RuntimeError(f"a {NAME} tensor used outside fake_gpu(): {func}")


def _dev(x: torch.Tensor) -> str:
    return NAME if isinstance(x, FakeGpuTensor) else x.device.type


_COPIES = ("_to_copy", "copy_", "_copy_from", "_copy_from_and_resize")


class FakeGpuMode(TorchDispatchMode):
    """Checks the device rules (module docstring) and runs each op on the CPU values."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        name = func.overloadpacket.__name__
        devs = {_dev(x) for x in tensors if not (x.dim() == 0 and _dev(x) == "cpu")}
        if name not in _COPIES and len(devs) > 1:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{' and '.join(sorted(devs))}! ({func})")
        target = None
        if kwargs.get("device") is not None:
            target = torch.device(kwargs["device"]).type
            kwargs["device"] = torch.device("cpu")
        elif name == "copy_":
            target = _dev(args[0])
        else:
            target = next(iter(devs), None) or (_dev(tensors[0]) if tensors else "cpu")
        gen = kwargs.get("generator")
        if gen is not None and gen.device.type != target:
            raise RuntimeError(f"Expected a '{target}' device type for generator but found '{gen.device.type}'")
        un_args, un_kwargs = tree_map(lambda x: x.elem if isinstance(x, FakeGpuTensor) else x, (args, kwargs))
        out = func(*un_args, **un_kwargs)
        if func._schema.is_mutable and name.endswith("_") and args and isinstance(args[0], torch.Tensor):
            return args[0]  # in place (copy_, add_, index_put_, ...): the tensor itself
        if target == NAME:
            return tree_map(lambda x: FakeGpuTensor(x) if isinstance(x, torch.Tensor) else x, out)
        return out


@contextlib.contextmanager
def fake_gpu():
    """Within: the ``fakegpu`` device (module docstring). Yields ``torch.device("fakegpu", 0)``.

    A dispatch mode holds for the thread that entered it only, so torch runs single-threaded
    inside (:func:`pactlib.threads.single_threaded`): the streamed merges and filters spread layers
    over as many worker threads as torch has, and a worker would see a bare PrivateUse1 device."""
    from pactlib.threads import single_threaded

    with single_threaded(), FakeGpuMode():
        yield DEVICE
