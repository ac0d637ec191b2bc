"""Bad input, part 2: overflow, dtypes, α, `pact merge` paths and `--set` values, unreadable
files, sharded indexes, LoRA ranks and PACT filters that change nothing. Each gives a clear
error (or warning) naming the problem, before any work, and leaves the inputs unchanged."""
import json
import operator
import warnings
import os

import pytest
import torch

import pactlib
from pactlib import CheckpointError, PactOptions, TaskVector, pact_filter, task_vectors_from
from pactlib import cli, lora
from pactlib.checks import MergeOverflowError
from pactlib.cli import main, parse_set
from pactlib.io import load_state_dict, save_state_dict
from pactlib.models.clip import load_clip_checkpoint

from conftest import make_checkpoints


def _clone(sd):
    return {k: v.clone() for k, v in sd.items()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.fixture
def files(tmp_path):
    """θ0 and two fine-tuned checkpoints on disk: (pre path, [ft paths], pre, fts)."""
    pre, fts = make_checkpoints(T=2)
    p = str(save_state_dict(pre, tmp_path / "pre.safetensors"))
    f = [str(save_state_dict(ft, tmp_path / f"ft{i}.pt")) for i, ft in enumerate(fts)]
    return p, f, pre, fts


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if `pact merge` loads a checkpoint."""
    def load(*a, **k):
        raise AssertionError("a checkpoint was loaded before the check")
    monkeypatch.setattr(cli, "load_checkpoint", load)


def _merge_args(pre, fts, out, *extra, method="task_arithmetic", alpha="1"):
    return ["merge", "--method", method, "--alpha", alpha, "--pretrained", pre, "--finetuned", *fts,
            "--out", str(out), *extra]


# -- 1. a merged value that overflows fp16 / bf16 ------------------------------------------------

def _overflowing(dtype, big):
    """θ0 and one fine-tuned checkpoint in ``dtype``: lin.bias[0] goes from big to 1.5·big."""
    pre, fts = make_checkpoints(T=1, dtype=dtype)
    pre["lin.bias"][0] = big
    fts[0]["lin.bias"][0] = 1.5 * big
    return pre, fts


@pytest.mark.parametrize("dtype,big,shown", [(torch.float16, 40000.0, "100000"), (torch.bfloat16, 2e38, "inf")])
def test_merge_overflowing_half_dtype_is_an_error(dtype, big, shown):
    pre, fts = _overflowing(dtype, big)
    before, before_ft = _clone(pre), _clone(fts[0])
    # α = 1 fits (θ = θt); α = 3 gives 1.5·big + 0.5·big·2 = 2.5·big (fp16: 1e5 > 65504)
    assert torch.isfinite(pactlib.merge("task_arithmetic", pre, fts, alpha=1.0)["lin.bias"]).all()
    with pytest.raises(MergeOverflowError) as e:
        pactlib.merge("task_arithmetic", pre, fts, alpha=3.0)
    msg = str(e.value)
    assert "'lin.bias'" in msg and str(dtype) in msg and "max |value|" in msg
    tv = TaskVector.from_checkpoints(pre, fts[0])
    with pytest.raises(OverflowError, match=rf"'lin\.bias'.*{shown}"):
        tv.apply_to(pre, 3.0)
    assert isinstance(e.value, CheckpointError)  # the CLI reports it as `pact: error: ...`
    _assert_same(pre, before)
    _assert_same(fts[0], before_ft)


def test_cli_overflow_is_an_error_and_writes_nothing(tmp_path, capsys):
    pre, fts = _overflowing(torch.float16, 40000.0)
    p = str(save_state_dict(pre, tmp_path / "pre.safetensors"))
    f = str(save_state_dict(fts[0], tmp_path / "ft.safetensors"))
    out = tmp_path / "merged.safetensors"
    assert main(_merge_args(p, [f], out, alpha="3")) == 2
    err = capsys.readouterr().err
    assert err.startswith("pact: error:") and "lin.bias" in err and "torch.float16" in err
    assert not out.exists()


# -- 2. task_vectors_from(dtype=half) -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64])
def test_task_vectors_from_refuses_non_compute_dtype(ckpts, dtype, monkeypatch):
    pre, fts = ckpts
    monkeypatch.setattr(pactlib.api, "task_names", lambda *a, **k: pytest.fail("work began before the dtype check"))
    with pytest.raises(ValueError, match=rf"{dtype}.*float32.*float64|float32.*float64.*{dtype}"):
        task_vectors_from(pre, fts, dtype=dtype)
    with pytest.raises(ValueError, match=str(dtype)):
        TaskVector.from_checkpoints(pre, fts[0], dtype=dtype)
    with pytest.raises(ValueError, match=str(dtype)):
        TaskVector({"w": torch.zeros(2)}, dtype=dtype)


# -- 3. α NaN / Inf -----------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_alpha_refused(ckpts, alpha):
    pre, fts = ckpts
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        pactlib.merge("task_arithmetic", pre, fts, alpha=alpha)
    tv = TaskVector.from_checkpoints(pre, fts[0])
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        tv.apply_to(pre, alpha)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        tv.apply_to(pre, "1")


@pytest.mark.parametrize("alpha", ["nan", "inf"])
def test_cli_non_finite_alpha_refused_before_loading(files, tmp_path, capsys, no_loading, alpha):
    p, f, _, _ = files
    assert main(_merge_args(p, f, tmp_path / "o.pt", alpha=alpha)) == 2
    assert "pact: error: alpha must be a finite number" in capsys.readouterr().err


# -- 4. --out is an input ---------------------------------------------------------------------

def test_cli_out_equal_to_an_input_refused_before_loading(files, tmp_path, capsys, no_loading, monkeypatch):
    p, f, _, _ = files
    before = {x: open(x, "rb").read() for x in (p, *f)}
    os.link(f[1], tmp_path / "alias.pt")  # another name for the same file
    monkeypatch.chdir(tmp_path)
    for out, named in ((p, p), ("./ft0.pt", f[0]), (tmp_path / "sub" / ".." / "ft1.pt", f[1]),
                       (tmp_path / "alias.pt", f[1])):
        assert main(_merge_args(p, f, out)) == 2
        err = capsys.readouterr().err
        assert "pact: error: --out" in err and named in err and "overwrite" in err
    assert {x: open(x, "rb").read() for x in (p, *f)} == before


# -- 5. --set values and parameter types ------------------------------------------------------

def test_parse_set_numbers_robustly():
    assert parse_set(["core_frac=1e-1", "k=20", "k2=2.5", "svd=rsvd", "x=true", "y=null", "layers=[a, b]"]) == \
        {"core_frac": 0.1, "k": 20, "k2": 2.5, "svd": "rsvd", "x": True, "y": None, "layers": ["a", "b"]}
    assert isinstance(parse_set(["core_frac=1e-1"])["core_frac"], float)
    with pytest.raises(ValueError, match="empty value for 'k'"):
        parse_set(["k="])
    with pytest.raises(ValueError, match="cannot parse the value of 'layers'"):
        parse_set(["layers=[a"])


def test_wrong_parameter_types_name_the_parameter(ckpts):
    pre, fts = ckpts
    before = [_clone(pre)] + [_clone(f) for f in fts]
    with pytest.raises(TypeError, match=r"ties: parameter 'k' must be a number \(float\), got str 'abc'"):
        pactlib.merge("ties", pre, fts, alpha=1.0, k="abc")
    with pytest.raises(TypeError, match="parameter 'k'.*got bool"):
        pactlib.merge("ties", pre, fts, alpha=1.0, k=True)
    with pytest.raises(TypeError, match="parameter 'common_frac'"):
        pactlib.merged_update("iso_cts", pre, task_vectors_from(pre, fts), common_frac="0.8")
    with pytest.raises(TypeError, match=r"parameter 'oversample' must be an integer"):
        pactlib.merge("iso_c", pre, fts, alpha=1.0, pact="pact", oversample=2.5)
    with pytest.raises(TypeError, match=r"parameter 'core_frac' must be a number \(float\) or null, got str"):
        pactlib.merge("iso_c", pre, fts, alpha=1.0, pact="pact", core_frac="0.1")
    with pytest.raises(TypeError, match="parameter 'lbw_tol'"):
        PactOptions(lbw_tol=True)
    with pytest.raises(ValueError, match=r"layers pattern '\(' is not a regular expression"):
        PactOptions(layers=["("])
    _assert_same(pre, before[0])
    for f, b in zip(fts, before[1:]):
        _assert_same(f, b)
    # an int is a valid float
    a = pactlib.merge("ties", pre, fts, alpha=1.0, k=20)
    b = pactlib.merge("ties", pre, fts, alpha=1.0, k=20.0)
    torch.testing.assert_close(a["lin.weight"], b["lin.weight"])


def test_cli_set_values_checked_before_loading(files, tmp_path, capsys, no_loading):
    p, f, _, _ = files
    out = tmp_path / "o.pt"
    for sets, expected in ((["k=abc"], "ties: parameter 'k' must be a number (float), got str 'abc'"),
                           (["k="], "empty value for 'k'"),
                           (["k=true"], "parameter 'k' must be a number (float), got bool"),
                           (["core_frac=2"], "PACT option(s) ['core_frac'] given but pact=None: set --pact pact (or s-pact)")):
        assert main(_merge_args(p, f, out, "--set", *sets, method="ties")) == 2
        assert expected in capsys.readouterr().err
    assert main(_merge_args(p, f, out, "--pact", "pact", "--set", "core_frac=2", method="ties")) == 2
    assert "core_frac must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("key,value,expected", [
    ("shield_tol", float("nan"), "PactOptions.shield_tol must be a finite number >= 0, got nan"),
    ("shield_tol", -1.0, "PactOptions.shield_tol must be a finite number >= 0, got -1.0"),
    ("oversample", -1, "PactOptions.oversample must be an integer >= 0, got -1"),
    ("active_n_iter", -2, "PactOptions.active_n_iter must be an integer >= 0, got -2"),
])
def test_pact_options_out_of_range_refused_before_merging(files, tmp_path, capsys, monkeypatch, no_loading,
                                                          key, value, expected):
    p, f, pre, fts = files

    def fail(*a, **k):
        raise AssertionError("merging started before the check")
    monkeypatch.setattr(pactlib.api, "task_vectors_from", fail)
    monkeypatch.setattr(pactlib.streaming, "open_checkpoint", fail)
    out = tmp_path / "o.safetensors"
    with pytest.raises(ValueError) as e:
        pactlib.merge("iso_c", pre, fts, alpha=1.0, pact="pact", **{key: value})
    assert str(e.value) == expected
    with pytest.raises(ValueError) as e:
        pactlib.merge_files("iso_c", p, f, out=out, alpha=1.0, pact="pact", svd="exact", **{key: value})
    assert str(e.value) == expected
    assert main(_merge_args(p, f, out, "--pact", "pact", "--set", f"{key}={value}", method="iso_c")) == 2
    assert capsys.readouterr().err == f"pact: error: {expected}\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ft0.pt", "ft1.pt", "pre.safetensors"]


def test_cli_set_exponent_float_accepted(files, tmp_path, capsys):
    p, f, pre, fts = files
    out = tmp_path / "o.safetensors"
    assert main(_merge_args(p, f, out, "--pact", "pact", "--set", "core_frac=2e-1", method="iso_c")) == 0
    want = pactlib.merge("iso_c", pre, fts, alpha=1.0, pact="pact", core_frac=0.2)
    got = load_state_dict(out)
    for k in want:
        torch.testing.assert_close(got[k], want[k])


# -- 6. unreadable files with --trust-pickle ----------------------------------------------------

class _Boom:
    def __reduce__(self):  # unpickling computes 1 / 0
        return operator.truediv, (1, 0)


def test_unreadable_files_with_trust_pickle_are_checkpoint_errors(files, tmp_path, capsys):
    p, f, _, _ = files
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00\x01garbage")
    (tmp_path / "garbage.pt").write_bytes(b"not a pickle at all")
    torch.save({"w": _Boom()}, tmp_path / "boom.pt")
    for name in ("garbage.safetensors", "garbage.pt", "boom.pt"):
        with pytest.raises(CheckpointError, match=rf"{name}: cannot read checkpoint"):
            load_clip_checkpoint(tmp_path / name, trust_pickle=True)
        out = tmp_path / "o.pt"
        assert main(_merge_args(p, [f[0], str(tmp_path / name)], out, "--trust-pickle")) == 2
        err = capsys.readouterr().err
        assert err.startswith("pact: error:") and name in err and "Traceback" not in err
        assert not out.exists()


# -- 7. malformed sharded-checkpoint index ------------------------------------------------------

INDEX = "model.safetensors.index.json"


@pytest.mark.parametrize("content,expected", [
    ("{not json", "not a readable JSON index"),
    (json.dumps({"metadata": {}}), "no 'weight_map'"),
    (json.dumps({"weight_map": {}}), "no 'weight_map'"),
    (json.dumps({"weight_map": {"a": 3}}), "must be the names of shard files in the index's folder, got 3"),
    (json.dumps({"weight_map": {"a": "../model/shard-1.safetensors"}}),  # a second user trial: followed out
     "must be the names of shard files in the index's folder, got '../model/shard-1.safetensors'"),
    (json.dumps({"weight_map": {"a": "shard-1.safetensors", "b": "shard-2.safetensors"}}),
     "missing from .*'shard-2.safetensors'"),
])
def test_malformed_index_names_the_file(tmp_path, content, expected):
    folder = tmp_path / "model"
    folder.mkdir()
    save_state_dict({"a": torch.zeros(2)}, folder / "shard-1.safetensors")
    (folder / INDEX).write_text(content)
    with pytest.raises(CheckpointError, match=rf"{INDEX}: .*{expected}"):
        load_clip_checkpoint(folder)


# -- 8. --out with an unsupported suffix --------------------------------------------------------

def test_out_suffix_checked_before_loading(files, tmp_path, capsys, no_loading):
    p, f, pre, _ = files
    assert main(_merge_args(p, f, tmp_path / "merged.txt")) == 2
    err = capsys.readouterr().err
    assert "merged.txt: unknown checkpoint extension '.txt'" in err and ".safetensors, .pt" in err
    with pytest.raises(CheckpointError, match=r"merged: a name without an extension, not a checkpoint file \(name "
                                              r"the file, e.g. model.safetensors\); use one of \.safetensors"):
        save_state_dict(pre, tmp_path / "merged")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ft0.pt", "ft1.pt", "pre.safetensors"]
    # a second user trial: a folder (or a name meant as one) got "unknown checkpoint extension '(none)'"
    for folder in ("x/", "Llama-3.2-1B/"):  # a dot in a folder's name is no extension
        with pytest.raises(CheckpointError, match=rf"{folder}: a folder, not a checkpoint file \(name the file"):
            save_state_dict(pre, f"{tmp_path}/{folder}")
    assert main(_merge_args(p, f, tmp_path / "new" / "deeper")) == 2
    err = capsys.readouterr().err
    assert "deeper: a name without an extension, not a checkpoint file" in err and "--out DIR/ (a trailing /)" in err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ft0.pt", "ft1.pt", "pre.safetensors"]


# -- 9. LoRA rank < 1 -----------------------------------------------------------------------

@pytest.mark.parametrize("rank,error", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)])
def test_lora_rank_checked_at_every_entry_point(ckpts, rank, error):
    pre, _ = ckpts
    before = _clone(pre)
    with pytest.raises(error, match="LoRA rank must be"):
        lora.init_adapters(pre, rank, generator=torch.Generator().manual_seed(0))
    with pytest.raises(error, match="LoRA rank must be"):
        lora.lora_scale(rank, 16.0)
    _assert_same(pre, before)


def test_lora_rank_zero_factors_refused(ckpts):
    pre, _ = ckpts
    A, B = torch.zeros(0, 10), torch.zeros(12, 0)
    with pytest.raises(ValueError, match=r"lin\.weight: LoRA rank must be >= 1"):
        lora.lora_task_vector(pre, {"lin.weight": (A, B)}, 1.0)


# -- 10. a PACT filter that changes nothing -------------------------------------------------

def test_layers_patterns_matching_nothing_warn(ckpts):
    pre, fts = ckpts
    tvs = task_vectors_from(pre, fts)
    with pytest.warns(UserWarning, match=r"layers pattern\(s\) \['typo'\] match no matrix layer") as rec:
        pact_filter(pre, tvs, options=PactOptions(layers=(r"^lin\.", "typo")))
    assert not any("changed no task vector" in str(w.message) for w in rec)  # ^lin. did filter
    with pytest.warns(UserWarning) as rec:
        out = pactlib.merge("task_arithmetic", pre, fts, alpha=1.0, pact="pact", layers=["nomatch"])
    assert [str(w.message).split(" (")[0] for w in rec] == [
        "pact: layers pattern(s) ['nomatch'] match no matrix layer",
        "pact changed no task vector: the layers patterns ['nomatch'] select no matrix layer; "
        "the merge is the plain method's"]
    plain = pactlib.merge("task_arithmetic", pre, fts, alpha=1.0)
    torch.testing.assert_close(out["lin.weight"], plain["lin.weight"])


def test_pact_filtering_nothing_warns(ckpts):
    pre, fts = ckpts
    only_vectors = {k: v for k, v in pre.items() if v.ndim < 2}
    with pytest.warns(UserWarning, match="changed no task vector: no matrix layer"):
        pactlib.merge("task_arithmetic", only_vectors, [{k: ft[k] for k in only_vectors} for ft in fts],
                      alpha=1.0, pact="s-pact")
    with pytest.warns(UserWarning, match="changed no task vector: every shield is empty"):
        pactlib.merge("task_arithmetic", pre, fts[:1], alpha=1.0, pact="pact")


def test_cli_prints_warnings(files, tmp_path, capsys):
    p, f, _, _ = files
    assert main(_merge_args(p, f, tmp_path / "o.pt", "--pact", "pact", "--set", "layers=[nomatch]")) == 0
    err = capsys.readouterr().err
    assert "pact: warning: pact: layers pattern(s) ['nomatch'] match no matrix layer" in err
    assert "pact: warning: pact changed no task vector" in err


def test_merged_update_takes_task_vectors_and_pact_options_as_merge_does(ckpts):
    """merged_update refuses state dicts (or one task vector) where task vectors belong, and takes
    PACT options as merge does: by name, or as ``options=``, not both, never with pact=None."""
    pre, fts = ckpts
    tvs = task_vectors_from(pre, fts)
    with pytest.raises(TypeError, match=r"task vector 0: expected a TaskVector, got dict .*task_vectors_from"):
        pactlib.merged_update("ties", pre, fts)
    with pytest.raises(TypeError, match="task vector 1: expected a TaskVector, got dict"):
        pactlib.merged_update("task_arithmetic", pre, [tvs[0], dict(fts[1])])
    with pytest.raises(TypeError, match="expected a sequence of TaskVector, got one TaskVector"):
        pactlib.merged_update("iso_c", pre, tvs[0])
    with pytest.raises(TypeError, match=r"PACT options given \(options=\) but pact=None"):
        pactlib.merged_update("iso_c", pre, tvs, options=PactOptions(core_frac=0.1))
    with pytest.raises(TypeError, match=r"PACT option\(s\) \['core_frac'\] given but pact=None"):
        pactlib.merged_update("iso_c", pre, tvs, core_frac=0.1)
    with pytest.raises(TypeError, match="both as options= and by name"):
        pactlib.merged_update("iso_c", pre, tvs, pact="pact", core_frac=0.1, options=PactOptions())
    by_name, rep = pactlib.merged_update("iso_c", pre, tvs, pact="pact", core_frac=0.3)
    given, _ = pactlib.merged_update("iso_c", pre, tvs, pact="pact", options=PactOptions(core_frac=0.3))
    default, _ = pactlib.merged_update("iso_c", pre, tvs, pact="pact")
    _assert_same(dict(by_name), dict(given))
    assert any(not torch.equal(by_name[k], default[k]) for k in default)  # the option took effect
    _assert_same(by_name.apply_to(pre, 0.7), pactlib.merge("iso_c", pre, fts, alpha=0.7, pact="pact", core_frac=0.3))


def test_merge_merged_update_and_merge_files_take_pact_options_alike(tmp_path, ckpts):
    """A second user trial: merged_update took ``options=`` but merge and merge_files refused it;
    ``options={...}`` (a dict) failed inside the filter; a generator of task vectors was used up
    by the new check. All three take options by name or as one PactOptions, with the same bits."""
    pre, fts = ckpts
    tvs = task_vectors_from(pre, fts)
    opts = PactOptions(core_frac=0.3)
    by_name = pactlib.merge("iso_c", pre, fts, alpha=0.5, pact="pact", core_frac=0.3)
    _assert_same(pactlib.merge("iso_c", pre, fts, alpha=0.5, pact="pact", options=opts), by_name)
    p0 = save_state_dict(pre, tmp_path / "p.safetensors")
    ps = [save_state_dict(f, tmp_path / f"f{i}.safetensors") for i, f in enumerate(fts)]
    pactlib.merge_files("iso_c", p0, ps, tmp_path / "o.safetensors", alpha=0.5, pact="pact", options=opts)
    _assert_same(load_state_dict(tmp_path / "o.safetensors"), by_name)
    with pytest.raises(TypeError, match=r"options: expected a PactOptions .*got dict; or give the options by name"):
        pactlib.merged_update("iso_c", pre, tvs, pact="pact", options={"core_frac": 0.1})
    with pytest.raises(TypeError, match=r"PACT options given \(options=\) but pact=None"):
        pactlib.merge("iso_c", pre, fts, alpha=0.5, options=opts)
    with pytest.raises(TypeError, match="both as options= and by name"):
        pactlib.merge_files("iso_c", p0, ps, tmp_path / "x.safetensors", alpha=0.5, pact="pact", options=opts,
                            core_frac=0.3)
    D, _ = pactlib.merged_update("task_arithmetic", pre, (tv for tv in tvs))  # a generator, read once
    _assert_same(D.apply_to(pre, 0.5), pactlib.merge("task_arithmetic", pre, fts, alpha=0.5))


def test_a_merge_built_on_svds_that_finds_no_matrix_says_so(tmp_path):
    """A second user trial: on GPT-2 keys the default rule (open_clip's text tower is entry-wise)
    sees no matrix, so Iso-C ran entry by entry, silently, where pact merge's --rule auto views
    GPT-2's matrices. In memory and streamed, the merge now says so and names the preset."""
    g = torch.Generator().manual_seed(0)
    pre = {"transformer.h.0.attn.c_attn.weight": torch.randn(8, 24, generator=g),
           "transformer.h.0.ln_1.weight": torch.ones(8)}
    fts = [{k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in pre.items()} for _ in range(2)]
    note = r"iso_c: no key is a matrix layer under this rule, so iso_c runs entry by entry; these keys are gpt2's"
    with pytest.warns(UserWarning, match=note):
        pactlib.merge("iso_c", pre, fts, alpha=1.0)
    p0 = save_state_dict(pre, tmp_path / "p.safetensors")
    ps = [save_state_dict(f, tmp_path / f"f{i}.safetensors") for i, f in enumerate(fts)]
    with pytest.warns(UserWarning, match=note):
        pactlib.merge_files("iso_c", p0, ps, tmp_path / "o.safetensors", alpha=1.0)
    from pactlib.matrix import MatrixRule

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with the preset, and for an entry-wise method, nothing to say
        pactlib.merge("iso_c", pre, fts, alpha=1.0, rule=MatrixRule.preset("gpt2"))
        pactlib.merge("ties", pre, fts, alpha=1.0)
