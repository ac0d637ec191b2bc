"""Start-up file of the book's kernels: torch's thread count is ``$PACT_THREADS`` from its import on.

``scripts/run_notebooks.py`` runs it in every kernel before the first cell
(``--IPKernelApp.exec_files``), with ``PACT_THREADS`` set to the kernel's count (``--threads``,
the set's ``threads:``, else cores / jobs). It does what ``torch.set_num_threads(N)`` at the top of
the notebook would do (as ``pact --threads N`` does), without importing torch itself: the call
runs right after the notebook's own ``import torch`` (a hook on that one import), so a kernel that
never imports torch starts as fast as before. The environment alone is not enough: torch takes
its count from MKL, which caps ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` at the physical cores.

Executed in the kernel's user namespace: it leaves no name there.
"""


def _pact_threads_on_torch_import() -> None:
    import importlib.abc
    import importlib.util
    import os
    import sys

    threads = int(os.environ["PACT_THREADS"])
    if "torch" in sys.modules:  # something imported it already
        sys.modules["torch"].set_num_threads(threads)
        return

    class TorchThreads(importlib.abc.MetaPathFinder):
        """Finds ``torch`` through the other finders and sets its thread count once it is loaded."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)  # once; and importlib.util.find_spec below must not come back here
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                module.set_num_threads(threads)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, TorchThreads())


_pact_threads_on_torch_import()
del _pact_threads_on_torch_import
