"""The engine's import boundary: ``pactlib``'s engine modules import nothing from the book, the
testbeds, the models, the data or the analyses, and no third-party package but torch and
safetensors (standard library aside), and they run with nothing else installed."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pactlib"

#: The engine: what ``pip install pactlib`` (torch + safetensors) must be able to import and run.
ENGINE_MODULES = ("__init__", "taskvector", "checks", "io", "lazy", "matrix", "linalg", "subspaces", "shield",
                  "pact", "lora", "peft", "api", "cli", "command", "threads", "streaming", "paths", "safetensors_io", "order",
                  "clip_keys", "recipe", "native/__init__", "fastpath/__init__", "fastpath/kernels")
#: Third-party packages the engine may import.
ALLOWED_THIRD_PARTY = {"torch", "safetensors"}
#: pactlib sub-packages / modules outside the engine (named in the failure messages).
NOT_ENGINE = ("book", "testbeds", "models", "data", "eval", "fisher", "causal")
#: Packages a torch + safetensors install lacks: poisoned in the subprocess test.
POISONED = ("numpy", "yaml", "pandas", "matplotlib", "tqdm", "open_clip", "transformers", "efficientnet_pytorch",
            "efficientnet_lite_pytorch", "seaborn", "PIL", "scipy", "sklearn", "skimage", "papermill")


def engine_files() -> list[Path]:
    files = [PKG / f"{m}.py" for m in ENGINE_MODULES] + sorted((PKG / "merges").glob("*.py"))
    missing = [str(f.relative_to(ROOT)) for f in files if not f.is_file()]
    assert not missing, f"engine modules missing (renamed? update ENGINE_MODULES): {missing}"
    return files


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _engine_names() -> set[str]:
    return {_module_name(f) for f in engine_files()} | {"pactlib.merges"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, at any depth (inside functions,
    ``if TYPE_CHECKING``, ...), relative imports resolved; ``from X import y`` yields ``X.y`` too
    (``y`` may be a module), and ``importlib.import_module("...")`` / ``__import__("...")`` calls
    with a constant name count as imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    return out


def violations(path: Path) -> list[str]:
    """One message per (line, forbidden module): ``<file>:<line>: imports <module> (why)``."""
    engine = _engine_names()
    rel = path.relative_to(ROOT).as_posix()
    bad: dict[tuple[int, str], str] = {}
    for line, mod in sorted(imported_modules(path)):
        parts = mod.split(".")
        if parts[0] == "pactlib":
            # `from pactlib.x import name` is fine when some prefix of pactlib.x.name is an engine
            # module; anything under a non-engine sub-package is forbidden
            if len(parts) > 1 and parts[1] in NOT_ENGINE:
                bad.setdefault((line, f"pactlib.{parts[1]}"),
                               f"{rel}:{line}: imports {mod} (pactlib.{parts[1]} is not part of the engine)")
            elif mod != "pactlib" and not any(".".join(parts[:i]) in engine for i in range(len(parts), 1, -1)):
                bad.setdefault((line, mod), f"{rel}:{line}: imports {mod}, which is not an engine module")
        elif parts[0] not in ALLOWED_THIRD_PARTY and parts[0] not in sys.stdlib_module_names:
            bad.setdefault((line, parts[0]), f"{rel}:{line}: imports {mod} (third-party; the engine may use only "
                                             f"{sorted(ALLOWED_THIRD_PARTY)} and the standard library)")
    return list(bad.values())


@pytest.mark.parametrize("path", engine_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_engine_imports_stay_inside_the_boundary(path):
    bad = violations(path)
    assert not bad, "engine import boundary broken:\n" + "\n".join(bad)


def test_the_scan_sees_every_kind_of_import(tmp_path, monkeypatch):
    """The scanner itself: nested, relative and dynamic imports are all caught, with file and line."""
    pkg = tmp_path / "pactlib"
    (pkg / "merges").mkdir(parents=True)
    src = textwrap.dedent('''\
        import torch
        from . import merges
        from .io import load_state_dict
        import numpy as np
        def f():
            from .models.clip import load_clip_checkpoint
            from pactlib.book import paths
            import yaml
            import importlib
            importlib.import_module("pactlib.testbeds.lite0.zoo")
        from . import fisher
        ''')
    (pkg / "cli.py").write_text(src)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    monkeypatch.setattr(sys.modules[__name__], "engine_files", lambda: [pkg / "cli.py", pkg / "io.py"])
    bad = violations(pkg / "cli.py")
    assert [b.split(":")[1] for b in bad] == ["4", "6", "7", "8", "10", "11"], bad
    assert "pactlib/cli.py:4: imports numpy (third-party" in bad[0]
    assert "pactlib.models.clip" in bad[1] and "pactlib.models is not part of the engine" in bad[1]
    assert "pactlib.book" in bad[2] and "yaml" in bad[3] and "pactlib.testbeds.lite0.zoo" in bad[4]
    assert "pactlib.fisher" in bad[5]


# ----------------------------------------------------------------------------- torch + safetensors only

_SCRIPT = r'''
import importlib.abc, json, sys

POISONED = set(json.loads(sys.argv[1]))
OUT = sys.argv[2]


class Poison(importlib.abc.MetaPathFinder):
    """Every poisoned package (and its sub-modules) is not installed."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in POISONED:
            raise ModuleNotFoundError(f"No module named {name!r} (poisoned by test_boundary)", name=name)
        return None


for name in list(sys.modules):
    if name.split(".")[0] in POISONED:
        del sys.modules[name]
sys.meta_path.insert(0, Poison())

import warnings
warnings.simplefilter("ignore")  # torch without numpy says so; PACT on tiny layers warns
import torch
import pactlib
from pactlib import merges
from pactlib.cli import main
from pactlib.io import load_state_dict, save_state_dict

for name in POISONED:  # the finder works
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{name} imported despite the poison")

g = torch.Generator().manual_seed(0)
def sd(base=None):
    if base is None:
        return {"lin.weight": torch.randn(12, 10, generator=g), "lin.bias": torch.randn(12, generator=g),
                "conv.weight": torch.randn(6, 4, 3, 3, generator=g), "bn.weight": torch.ones(6),
                "bn.num_batches_tracked": torch.tensor(5), "head.weight": torch.randn(3, 6, generator=g)}
    return {k: (v + 0.05 * torch.randn(v.shape, generator=g)) if v.is_floating_point() else v.clone()
            for k, v in base.items()}

pre = sd()
fts = [sd(pre) for _ in range(3)]
done = []
for method in merges.names():
    for pact in (None, "pact", "s-pact"):
        out = pactlib.merge(method, pre, fts, alpha=0.5, pact=pact)
        assert out.keys() == pre.keys() and all(torch.isfinite(v.float()).all() for v in out.values())
        done.append([method, pact])

# pact merge on tiny files: safetensors in, a pickled state dict converted once, safetensors out
import os
d = os.path.dirname(OUT)
save_state_dict(pre, os.path.join(d, "pre.safetensors"))
torch.save(fts[0], os.path.join(d, "ft0.pt"))
paths = [os.path.join(d, "ft0.pt")]
for i, f in enumerate(fts[1:], 1):
    paths.append(os.path.join(d, f"ft{i}.safetensors"))
    save_state_dict(f, paths[-1])
cli = []
for method in merges.names():
    for pact in (None, "pact"):
        out_path = os.path.join(d, f"merged-{method}-{pact}.safetensors")
        argv = ["merge", "--method", method, "--alpha", "0.5", "--pretrained", os.path.join(d, "pre.safetensors"),
                "--finetuned", *paths, "--out", out_path]
        if pact:  # --set parsed without PyYAML
            argv += ["--pact", pact, "--set", "svd=exact"]
        rc = main(argv)
        assert rc == 0, (method, pact, rc)
        got = load_state_dict(out_path)
        want = pactlib.merge(method, pre, fts, alpha=0.5, pact=pact, **({"svd": "exact"} if pact else {}))
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), (method, pact)
        cli.append([method, pact])
assert main(["methods"]) == 0
loaded = sorted(m for m in sys.modules if m.split(".")[0] in POISONED
                or any(m == f"pactlib.{p}" or m.startswith(f"pactlib.{p}.")
                       for p in ("book", "testbeds", "models", "data", "eval", "fisher", "causal")))
rc_data = main(["data", "list"])  # the data plug-in needs numpy: listed, and says why when run
json.dump({"merges": done, "cli": cli, "loaded": loaded, "rc_data": rc_data}, open(OUT, "w"))
'''


def test_engine_runs_on_torch_and_safetensors_alone(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PACT_CONVERT_CACHE": str(tmp_path / "converted"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(POISONED), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    from pactlib import merges

    assert len(res["merges"]) == 3 * len(merges.names()) and len(res["cli"]) == 2 * len(merges.names())
    assert res["loaded"] == [], f"modules outside the engine were imported: {res['loaded']}"
    assert res["rc_data"] == 2
    assert "'pact data' is unavailable" in proc.stderr and "numpy" in proc.stderr


def test_safetensors_are_written_byte_for_byte_as_safetensors_writes_them(tmp_path):
    """pactlib writes safetensors without numpy (safetensors.torch's writer imports it): the same
    bytes as safetensors.torch.save_file, for every dtype, shape and key order."""
    import random

    import torch
    from safetensors.torch import save_file

    from pactlib.io import save_state_dict
    from pactlib.safetensors_io import ORDER

    rnd, g = random.Random(0), torch.Generator().manual_seed(0)
    names = ["a", "b", "B", "lin.weight", "é.x", "z/y", "a.b", "a_b", "A", "日本", 'x"q', "\\s", "10", "9"]
    for trial in range(60):
        sd = {}
        for i in range(rnd.randint(1, 10)):
            dtype = rnd.choice(ORDER)[0]
            shape = rnd.choice([(), (0,), (3,), (2, 3), (1, 0, 2), (4, 1, 2)])
            t = torch.randn(shape, generator=g) * 10
            sd[rnd.choice(names) + str(i)] = (t > 0) if dtype == torch.bool else t.to(dtype)
        if trial % 5 == 0:  # a non-contiguous view and a tensor sharing storage with another
            base = torch.randn(4, 6, generator=g)
            sd["view.t"], sd["view.row"] = base.t(), base[1]
        metadata = rnd.choice([None, {}, {"format": "pt"}])
        save_state_dict(sd, tmp_path / "ours.safetensors", metadata=metadata)
        save_file({k: v.contiguous().clone() for k, v in sd.items()}, tmp_path / "theirs.safetensors",
                  metadata=metadata)
        assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes(), \
            (trial, list(sd), metadata)
