"""The book's chapter parameters: one pydantic model per notebook, shared by notebook and runner.

Every chapter ``notebooks/NN_name.py`` has a ``parameters`` cell of literal defaults (papermill
injects a parameter set's values after it) and a model here with the same fields, in the same
order, with the same defaults (``tests/test_params.py`` holds the two together). The model says
the types and the allowed values; choices the library defines (merge methods, testbeds, zoo
profiles) are read from its registries when a value is checked, never copied here.

- The notebook checks its parameters in the cell after the ``parameters`` cell::

      P = chapters.MainResults.check(globals())

  ``P`` is the plain ``{name: value}`` dict that goes into the chapter's records.
- The runner (``scripts/run_notebooks.py``) checks every chapter and variant of a parameter set
  with :func:`validate` before it executes anything; a notebook without a model here (a test's
  notebook) gets one inferred from its ``parameters`` cell (:func:`inferred`: types only).

Type rules (pydantic's strict mode): a ``bool`` is never an ``int`` nor the reverse; an ``int``
is widened where a ``float`` is expected (``1`` -> ``1.0``); lists are lists; an unknown name
fails; a field without a default (``name = ...`` in the cell) must be given.

Book: "Running the book" page.
"""
from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, \
    field_validator

from pactlib.book.params import REQUIRED, ParameterError

__all__ = ["Chapter", "INJECTED", "injected_names", "MODELS", "model_for", "inferred", "defaults", "validate", "parse_defaults",
           "Method", "Testbed", "ScalarPerspective", "SubspacePerspective", "MainResults", "StaticVsDynamic",
           "LayerDepth", "Efficiency", "Lora", "Theory", "Sensitivity", "PaperScale"]


# ---------------------------------------------------------------------------------------------
# value rules (registries are looked up when a value is checked: this module imports nothing heavy)


def _unique(values: list) -> list:
    seen: list = []
    for i, x in enumerate(values):
        if x in seen:
            raise ValueError(f"a list without repeats (element {i} = {x!r} repeats)")
        seen.append(x)
    return values


def _merge_method(value: str) -> str:
    from pactlib import merges

    if value not in merges.names():
        raise ValueError(f"one of {list(merges.names())} (pactlib.merges.names())")
    return value


def _zoo_profile(value: str) -> str:
    from pactlib.testbeds.lite0.testbed import PROFILES

    if value not in PROFILES:
        raise ValueError(f"one of {list(PROFILES)} (Lite0 zoo profiles)")
    return value


def _testbed(family: str | None = None):
    def rule(value: str) -> str:
        from pactlib.testbeds import check_name, definitions, families

        try:
            got = check_name(value)
        except (KeyError, ValueError, TypeError) as e:
            defined = sorted(definitions())
            raise ValueError(f"a testbed name ({', '.join(f'{f}-...' for f in families())}"
                             f"{'; defined: ' + ', '.join(defined) if defined else ''}): "
                             f"{e.args[0] if e.args else e}") from None
        if family is not None and got != family:
            raise ValueError(f"a {family} testbed ({value!r} is of family {got!r})")
        return value
    return rule


def _minilm_or_empty(value: str) -> str:
    return _testbed("minilm")(value) if value else value


def _clip_or_none(value: str | None) -> str | None:
    return None if value is None else _testbed("clip")(value)


def _existing_path(value: str) -> str:
    if not (value and Path(value).expanduser().exists()):
        raise ValueError("the path of an existing file or folder (relative to the repository root)")
    return value


def _float(**limits: float) -> Any:
    return Annotated[float, Field(allow_inf_nan=False, **limits)]


def _int(lo: int) -> Any:
    return Annotated[int, Field(ge=lo)]


def _list(item: Any, *, unique: bool = False) -> Any:
    return Annotated[list[item], Field(min_length=1), *([AfterValidator(_unique)] if unique else [])]


def _shape(item: Any, n: int) -> Any:
    """A list of exactly ``n`` items (a shape: each item is one dimension)."""
    def rule(value: list) -> list:
        if len(value) != n:
            raise ValueError(f"a list of {n} items (one per dimension), not {len(value)}")
        return value
    return Annotated[list[item], AfterValidator(rule)]


Seeds = _list(_int(0), unique=True)
TestbedName = Annotated[str, AfterValidator(_testbed())]
TestbedNames = _list(TestbedName, unique=True)
MergeName = Annotated[str, AfterValidator(_merge_method)]
MergeNames = _list(MergeName, unique=True)
Fraction = _float(gt=0, le=1)
#: Images per task of an α search or a test: at least 8.
Limit = _int(8)


#: The first line of the cell papermill injects after a notebook's ``parameters`` cell.
INJECTED = "# Parameters"


def injected_names(namespace: Mapping[str, Any]) -> list[str]:
    """The names papermill's injected-parameters cell assigned, read from the kernel's input
    history (IPython's ``In`` list in ``namespace``): papermill itself only warns about a name the
    ``parameters`` cell lacks, so a chapter run with ``papermill -p`` checks it here. Empty outside
    a kernel, or when nothing was injected; a cell that does not parse is skipped."""
    names: list[str] = []
    for source in namespace.get("In") or ():
        if not (isinstance(source, str) and source.lstrip().startswith(INJECTED)):
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        names += [t.id for node in tree.body if isinstance(node, ast.Assign)
                  for t in node.targets if isinstance(t, ast.Name) and t.id not in names]
    return names


# ---------------------------------------------------------------------------------------------
# the models


class Chapter(BaseModel):
    """A chapter's parameters: fields in the order of its ``parameters`` cell, defaults equal to it
    (each parameter's meaning is its comment there)."""

    model_config = ConfigDict(strict=True, extra="forbid", validate_default=True)
    #: The notebook's file stem, e.g. ``"05_main_results"``.
    notebook: ClassVar[str] = ""

    @classmethod
    def check(cls, namespace: Mapping[str, Any]) -> dict[str, Any]:
        """The chapter's parameters from ``namespace`` (the notebook's ``globals()``), checked.

        Returns:
            ``{name: value}`` in field order (an ``int`` given for a ``float`` field widened).

        Raises:
            ParameterError: a parameter is not defined, still ``...`` (required, not given), of
                the wrong type or not allowed, or papermill was given a name the chapter does not
                have (:func:`injected_names`); every problem, each naming the parameter.
        """
        where = f"notebooks/{cls.notebook}.py"
        if unknown := [n for n in injected_names(namespace) if n not in cls.model_fields]:
            raise ParameterError(f"{where}: unknown parameter(s) {unknown} (given to papermill with -p); the "
                                 f"chapter's parameters: {list(cls.model_fields)}")
        absent = [n for n in cls.model_fields if n not in namespace]
        if absent:
            raise ParameterError(f"{where}: {absent} not defined (is the parameters cell run?)")
        unset = [n for n in cls.model_fields if namespace[n] is REQUIRED]
        if unset:
            raise ParameterError(f"{where}: required parameter(s) {unset} have no value (the cell says `...`: "
                                 f"give them in the parameter set or with -p)")
        return validate(cls, {n: namespace[n] for n in cls.model_fields}, where=where)


class Method(Chapter):
    """Chapter 1: ``notebooks/01_method.py``."""

    notebook: ClassVar[str] = "01_method"
    seed: _int(0) = 0
    task_angles: _list(_float(ge=-180, le=180)) = [0.0, 40.0]
    tilt_deg: _float(ge=0, le=90) = 20.0
    noise: _float(ge=0) = 0.05
    spectra_dim: _int(4) = 24
    spectra_tasks: _int(2) = 4
    rsvd_shape: _shape(_int(32), 2) = [512, 256]


class Testbed(Chapter):
    """Chapter 2: ``notebooks/02_testbed.py``."""

    notebook: ClassVar[str] = "02_testbed"
    testbed: TestbedName = "lite0-20"
    zoo_profile: Annotated[str, AfterValidator(_zoo_profile)] = "default"
    seeds: Seeds = [0, 1, 2]
    samples_per_task: _int(1) = 8
    minilm_testbed: Annotated[str, AfterValidator(_minilm_or_empty)] = "minilm-14"  # "" skips the MiniLM part
    minilm_seeds: Seeds = [0, 1, 2]
    val_limit: Limit = 100
    test_limit: Limit = 300
    minilm_val_limit: Limit = 48
    minilm_test_limit: Limit = 150


class ScalarPerspective(Chapter):
    """Chapter 3: ``notebooks/03_scalar_perspective.py``."""

    notebook: ClassVar[str] = "03_scalar_perspective"
    testbed: TestbedName = "lite0-8"
    seeds: Seeds = [0, 1, 2]
    fisher_samples: _int(1) = 32
    empirical_fisher: bool = False
    fisher_chunk: _int(1) = 64
    quantile: _float(ge=0.001, le=0.5) = 0.1
    touched_only: bool = True
    perturb_scales: _list(_float(ge=0)) = [1.0, 30.0]
    draws: _int(1) = 1
    alpha_points: _int(1) = 6
    val_limit: Limit = 64
    test_limit: Limit = 128


class SubspacePerspective(Chapter):
    """Chapter 4: ``notebooks/04_subspace_perspective.py``."""

    notebook: ClassVar[str] = "04_subspace_perspective"
    testbed: TestbedName = "lite0-8"
    seeds: Seeds = [0, 1, 2]
    draws: _int(1) = 2
    strengths: _list(_float(ge=0.01, le=1)) = [0.25, 1.0]
    margin: _float(ge=0, le=1) = 0.02
    val_limit: _int(1) = 16
    test_limit: Limit = 200


class MainResults(Chapter):
    """Chapter 5: ``notebooks/05_main_results.py``."""

    notebook: ClassVar[str] = "05_main_results"
    testbeds: TestbedNames = ["lite0-8", "lite0-14", "lite0-20"]
    seeds: Seeds = [0, 1, 2]
    seeds_large: Seeds = [0]
    methods: MergeNames = ["task_arithmetic", "ties", "tsv_m", "iso_c", "iso_cts"]
    alpha_points: _int(2) = 5
    val_limit: Limit = 100
    test_limit: Limit = 300


class StaticVsDynamic(Chapter):
    """Chapter 6: ``notebooks/06_static_vs_dynamic.py``."""

    notebook: ClassVar[str] = "06_static_vs_dynamic"
    testbed: TestbedName = "lite0-8"
    seeds: Seeds = [0, 1, 2]
    methods: MergeNames = ["task_arithmetic", "tsv_m", "iso_c"]
    alpha_points: _int(2) = 5
    val_limit: Limit = 100
    test_limit: Limit = 300


class LayerDepth(Chapter):
    """Chapter 7: ``notebooks/07_layer_depth.py``."""

    notebook: ClassVar[str] = "07_layer_depth"
    testbeds: TestbedNames = ["lite0-8", "lite0-20"]
    seeds: Seeds = [0, 1, 2]
    method: MergeName = "iso_c"
    alpha_points: _int(2) = 6
    alpha_min: _float(ge=1e-4, le=1) = 0.025
    most: Fraction = 0.5
    val_limit: Limit = 48
    test_limit: Limit = 150


class Efficiency(Chapter):
    """Chapter 8: ``notebooks/08_efficiency.py``."""

    notebook: ClassVar[str] = "08_efficiency"
    testbed: TestbedName = "lite0-8"
    seeds: Seeds = [0, 1, 2]
    method: MergeName = "iso_c"
    n_iters: _list(_int(0), unique=True) = [2, 8, 12]
    accuracy_n_iter: int = 12
    oversample: _int(0) = 40
    timing_repeats: _int(1) = 3
    min_speedup: _float(ge=1) = 2.0
    alpha_points: _int(2) = 5
    val_limit: Limit = 100
    test_limit: Limit = 300
    bench_json: str = "book/data/bench_filter.json"
    floor_json: str = "book/data/pact_floor.json"
    floor_wall_json: str = "book/data/pact_floor_2threads.json"
    scale_jsonl: str = "book/data/merge_scale.jsonl"

    @field_validator("accuracy_n_iter")
    @classmethod
    def _timed(cls, value: int, info: ValidationInfo) -> int:
        n_iters = info.data.get("n_iters")
        if n_iters is not None and value not in n_iters:
            raise ValueError(f"one of n_iters {n_iters} (the RSVD whose accuracy is measured is one of those timed)")
        return value


class Lora(Chapter):
    """Chapter 9: ``notebooks/09_lora.py``."""

    notebook: ClassVar[str] = "09_lora"
    testbed: TestbedName = "lite0-8"
    seeds: Seeds = [0, 1, 2]
    methods: MergeNames = ["task_arithmetic", "tsv_m", "iso_c"]
    alpha_points: _int(2) = 5
    alpha_max: _float(ge=0.2) = 3.0
    val_limit: Limit = 100
    test_limit: Limit = 300


class Theory(Chapter):
    """Chapter 10: ``notebooks/10_theory.py``."""

    notebook: ClassVar[str] = "10_theory"
    testbed: TestbedName = "lite0-8"
    seeds: Seeds = [0, 1, 2]
    loss_examples: _int(1) = 64
    fracs: _list(Fraction) = [0.25, 0.5, 1.0]
    val_limit: Limit = 64
    test_limit: Limit = 200

    @field_validator("val_limit")
    @classmethod
    def _covers_loss_batch(cls, value: int, info: ValidationInfo) -> int:
        need = info.data.get("loss_examples")
        if need is not None and value < need:
            raise ValueError(f">= loss_examples ({need}): the loss batch is taken from the validation images")
        return value


class Sensitivity(Chapter):
    """Chapter 11: ``notebooks/11_sensitivity.py``."""

    notebook: ClassVar[str] = "11_sensitivity"
    testbed: TestbedName = "lite0-8"
    seeds: Seeds = [0]
    method: MergeName = "iso_c"
    core_fracs: _list(Fraction) = [0.05, 0.1, 0.2, 0.4]
    active_fracs: _list(Fraction) = [0.025, 0.05, 0.1, 0.2]
    lbw_tols: _list(_float(ge=0, le=1)) = [0.2, 0.5, 0.8]
    max_shield_fracs: _list(Fraction) = [0.25, 0.5, 0.75]
    shield_tols: _list(_float(ge=0, le=10)) = [0.0001, 0.1, 0.3, 0.6]
    alpha_points: _int(2) = 5
    val_limit: Limit = 100
    test_limit: Limit = 300


class PaperScale(Chapter):
    """Chapter 12: ``notebooks/12_paper_scale.py``."""

    notebook: ClassVar[str] = "12_paper_scale"
    seed: _int(0) = 0
    testbed: Annotated[Optional[str], AfterValidator(_clip_or_none)] = None  # None: the tiny worked example
    reference_file: Annotated[str, AfterValidator(_existing_path)] = "book/reference_numbers.yaml"


#: notebook stem -> its model.
MODELS: dict[str, type[Chapter]] = {m.notebook: m for m in (
    Method, Testbed, ScalarPerspective, SubspacePerspective, MainResults, StaticVsDynamic, LayerDepth, Efficiency,
    Lora, Theory, Sensitivity, PaperScale)}


# ---------------------------------------------------------------------------------------------
# checking values


def parse_defaults(source: str, *, where: str = "parameters cell") -> dict[str, Any]:
    """``{name: default}`` of a ``parameters`` cell's ``name = literal`` lines, in order (``...``
    for a required parameter).

    Raises:
        ParameterError: the cell does not parse, holds anything but ``name = literal``
            assignments (and strings), or assigns a name twice.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ParameterError(f"{where}: cannot parse the parameters cell: {exc}") from exc
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) and node.value is not None else None
        if target is None:
            raise ParameterError(f"{where}, line {node.lineno}: a parameters cell may only hold "
                                 f"`name = literal` assignments, got {ast.unparse(node)!r}")
        if not isinstance(target, ast.Name):
            raise ParameterError(f"{where}, line {node.lineno}: assign to a plain name, got {ast.unparse(target)!r}")
        try:
            value = ast.literal_eval(node.value)
        except ValueError as exc:
            raise ParameterError(f"{where}, line {node.lineno}: the default of {target.id!r} must be a literal "
                                 f"(number, string, list, dict, None, ...), got {ast.unparse(node.value)!r}") from exc
        if target.id in out:
            raise ParameterError(f"{where}, line {node.lineno}: {target.id!r} is assigned twice")
        out[target.id] = value
    return out


def _kind(default: Any) -> Any:
    """The field type a default implies (lists of one element type check their elements)."""
    if default is None or default is REQUIRED:
        return Any
    if isinstance(default, (list, tuple)):
        kinds = {type(x) for x in default}
        return list[_kind(default[0])] if len(kinds) == 1 else list
    return type(default)


def inferred(notebook: str, cell_defaults: Mapping[str, Any]) -> type[Chapter]:
    """A model for a notebook without one in :data:`MODELS`: each field typed by its default
    (``None`` or ``...``: any type; ``...``: required), no value rules."""
    fields = {name: (_kind(d), ... if d is REQUIRED else d) for name, d in cell_defaults.items()}
    model = create_model(f"Chapter_{notebook}", __base__=Chapter, **fields)
    model.notebook = notebook
    return model


def model_for(notebook: str, cell_defaults: Mapping[str, Any] | None = None) -> type[Chapter]:
    """The model of ``notebook`` (a file stem): :data:`MODELS`'s, else :func:`inferred` from the
    defaults of its ``parameters`` cell.

    Raises:
        KeyError: no model and no defaults.
    """
    if notebook in MODELS:
        return MODELS[notebook]
    if cell_defaults is None:
        raise KeyError(f"no parameter model for notebook {notebook!r}; models: {sorted(MODELS)}")
    return inferred(notebook, cell_defaults)


def defaults(model: type[Chapter]) -> dict[str, Any]:
    """``{name: default}`` of a model in field order; ``...`` (:data:`REQUIRED`) where there is none."""
    return {name: REQUIRED if f.is_required() else f.get_default(call_default_factory=True)
            for name, f in model.model_fields.items()}


def _problem(err: dict, known: list[str], origins: Mapping[str, str]) -> str:
    name, *index = err["loc"] or ("?",)
    kind, value = err["type"], err.get("input")
    origin = f" (from {origins[name]})" if name in origins else ""
    if kind == "extra_forbidden":
        return f"unknown parameter {name!r}{origin}; known: {known}"
    if kind == "missing":
        return f"required parameter {name!r} has no value (its default is `...`)"
    where = f"parameter {name!r}{origin}" + "".join(f", element {i}" for i in index)
    what = err["msg"].removeprefix("Value error, ") if kind == "value_error" else err["msg"]
    what = f"must be {what}" if kind == "value_error" else what[0].lower() + what[1:]
    return f"{where}: {what}, got {value!r} ({'None' if value is None else type(value).__name__})"


def validate(model: type[Chapter], values: Mapping[str, Any], *, where: str,
             origins: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``values`` checked against ``model``, the missing ones filled with its defaults.

    Args:
        model: a chapter's model (:func:`model_for`).
        values: ``{name: value}``; a value ``...`` counts as not given.
        where: what the values are, for messages (a notebook, a set file, a variant).
        origins: ``{name: where its value was given}`` for messages (``"-p"``, ``"common"``, ...).

    Returns:
        Every parameter, ``{name: value}`` in field order, ints widened where floats are expected.

    Raises:
        ParameterError: ``"<where>: <problem>; <problem>..."``, every problem named by parameter:
            unknown (listing the known names), required and missing, wrong type, not allowed. Its
            ``problems`` attribute lists them one by one.
    """
    given = {k: v for k, v in values.items() if v is not REQUIRED}
    try:
        return model.model_validate(given).model_dump()
    except ValidationError as exc:
        known = sorted(model.model_fields)
        problems = list(dict.fromkeys(_problem(e, known, origins or {}) for e in exc.errors()))
        err = ParameterError(f"{where}: " + "; ".join(problems))
        err.problems = problems
        raise err from None
