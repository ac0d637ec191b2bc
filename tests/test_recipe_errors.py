"""Recipes that cannot be read (pactlib.recipe.read_recipe, ``pact merge --config``): every
error names the file and the line, never a bare codec message or a RecursionError traceback."""
from __future__ import annotations

import pytest

from pactlib.cli import main
from pactlib.recipe import MAX_DEPTH, RecipeError, parse_yaml, read_recipe

GOOD = ("merge_method: task_arithmetic\n"
        "base_model: /m/base.safetensors\n"
        "models:\n"
        "  - model: /m/ft0.safetensors\n"
        "  - model: /m/ft1.safetensors\n"
        "parameters:\n"
        "  alpha: 0.3\n")


def _write(tmp_path, data: bytes | str):
    f = tmp_path / "r.yaml"
    f.write_bytes(data.encode() if isinstance(data, str) else data)
    return f


def _cli_error(f, tmp_path, capsys) -> str:
    assert main(["merge", "--config", str(f), "--out", str(tmp_path / "out") + "/"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pact: error: "), err
    return err[len("pact: error: "):-1]


def test_a_recipe_that_is_not_utf8_names_the_file_and_the_line(tmp_path, capsys):
    f = _write(tmp_path, GOOD.encode().replace(b"/m/ft1", b"/m/f\x9bt1"))
    want = f"{f} line 5: not UTF-8 text (byte 0x9b at column 16); a recipe is UTF-8 text"
    with pytest.raises(RecipeError) as e:
        read_recipe(f)
    assert str(e.value) == want
    assert _cli_error(f, tmp_path, capsys) == want


def test_a_recipe_not_utf8_on_its_first_line(tmp_path, capsys):
    f = _write(tmp_path, b"mer\x9bge_method: ties\n")
    assert _cli_error(f, tmp_path, capsys) == (f"{f} line 1: not UTF-8 text (byte 0x9b at column 4); "
                                               "a recipe is UTF-8 text")


@pytest.mark.parametrize("kind", ["yaml-blocks", "yaml-flow", "json"])
def test_a_recipe_nested_3000_levels_deep_names_the_line(tmp_path, capsys, kind):
    depth = 3000
    if kind == "yaml-blocks":
        text = GOOD + "pact:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(depth))
        line = GOOD.count("\n") + 1 + MAX_DEPTH  # the first key of the 65th level
    elif kind == "yaml-flow":
        text = GOOD + "pact: " + "[" * depth + "1" + "]" * depth + "\n"
        line = GOOD.count("\n") + 1
    else:
        text = '{"merge_method": "ties",\n"pact": ' + "[" * depth + "]" * depth + "}\n"
        line = 2
    f = _write(tmp_path, text)
    want = f"{f} line {line}: nested deeper than {MAX_DEPTH} levels (a recipe needs 3)"
    with pytest.raises(RecipeError) as e:
        read_recipe(f)
    assert str(e.value) == want
    assert _cli_error(f, tmp_path, capsys) == want
    # as deep as allowed: read
    limit = "".join(" " * i + f"k{i}:\n" for i in range(MAX_DEPTH - 1)) + " " * (MAX_DEPTH - 1) + "leaf: 1\n"
    data = parse_yaml(limit)
    for i in range(MAX_DEPTH - 1):
        data = data[f"k{i}"]
    assert data == {"leaf": 1}


@pytest.mark.parametrize("old, new, message", [
    ("alpha: 0.3", "alpha: half", "parameters.alpha: expected a finite number, got 'half' (line 7)"),
    ("base_model: /m/base.safetensors", "base_model: 5", "base_model: expected a path, got 5 (line 2)"),
    ("  - model: /m/ft1.safetensors", "  - model: [a, b]", "models[1].model: expected a path, got ['a', 'b'] (line 5)"),
    ("  - model: /m/ft1.safetensors", "  - 7", "models[1]: expected '- model: PATH', got 7 (line 5)"),
    ("  alpha: 0.3", "  alpha: 0.3\n  k: 5", "parameters.k: not a parameter of task_arithmetic (known: alpha; "
                                            "PACT options go under pact) (line 8)"),
    ("parameters:\n  alpha: 0.3\n", "parameters: 0.3\n", "parameters: expected a mapping (alpha: …, the method's "
                                                          "parameters), got 0.3 (line 6)"),
    ("parameters:\n  alpha: 0.3\n", "parameters:\n  k: 1\n", "parameters.alpha: missing (required: θ = θ0 + α·D) "
                                                              "(line 6)"),
])
def test_a_value_of_the_wrong_type_names_the_file_the_field_and_the_line(tmp_path, capsys, old, new, message):
    f = _write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(RecipeError) as e:
        read_recipe(f)
    assert str(e.value) == f"{f}: {message}"
    assert _cli_error(f, tmp_path, capsys) == f"{f}: {message}"
