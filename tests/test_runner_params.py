"""The book runner's up-front parameter check (scripts/run_notebooks.py --check-only, what
``make book-check`` runs): a shape one item short or long fails there naming the parameter and
the length it needs, and a ``-p`` given twice fails naming the parameter, before any notebook runs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _runner():
    from conftest import load_runner

    return load_runner()


@pytest.mark.parametrize("value, got, n", [("[64]", "[64]", 1), ("[64, 32, 32]", "[64, 32, 32]", 3),
                                           ("[]", "[]", 0)])
def test_a_shape_of_the_wrong_length_fails_in_the_check(value, got, n, capsys):
    rn = _runner()
    assert rn.main(["--only", "01", "--check-only", "-p", f"rsvd_shape={value}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: bad parameters:",
        "  notebooks/01_method.py with params/default.yaml: parameter 'rsvd_shape' (from -p): must be a list of 2 "
        f"items (one per dimension), not {n}, got {got} (list)"]


def test_a_shape_of_the_right_length_passes(capsys):
    rn = _runner()
    assert rn.main(["--only", "01", "--check-only", "-p", "rsvd_shape=[64, 32]"]) == 0
    assert capsys.readouterr().out.startswith("parameters of 1 notebook(s) are valid")


def test_a_parameter_given_twice_is_named(capsys):
    rn = _runner()
    assert rn.main(["--only", "01", "--check-only", "-p", "spectra_dim=8", "-p", "spectra_dim=9"]) == 2
    assert capsys.readouterr().err == "error: -p spectra_dim: given twice ('8', then '9'); give each parameter once\n"


def test_a_parameter_given_twice_from_the_shell():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_notebooks.py"), "--only", "01", "--check-only",
                           "-p", "seeds=[0]", "-p", "spectra_dim=8", "-p", "spectra_dim = 8"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert (proc.returncode, proc.stderr) == (
        2, "error: -p spectra_dim: given twice ('8', then ' 8'); give each parameter once\n")


def test_parse_cli_refuses_a_repeated_name():
    from pactlib.book.params import ParameterError

    rn = _runner()
    with pytest.raises(ParameterError, match=r"^-p a: given twice \('1', then '1'\); give each parameter once$"):
        rn.parse_cli(["a=1", "b=2", "a=1"])
