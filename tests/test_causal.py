"""C2–C4 and C12 helpers: exact effects on synthetic state dicts, and the first-order check on a
quadratic loss whose expansion is known in closed form."""
import pytest
import torch

from pactlib.causal import ablate_subspaces, first_order_check, perturb, random_basis, random_masks_like, restore
from pactlib.book.study import depth_groups
from pactlib.testbeds import alpha_grid as grid


def test_random_masks_same_count_and_seeded():
    masks = {"a": torch.zeros(10, 10, dtype=torch.bool), "b": torch.zeros(50, dtype=torch.bool)}
    masks["a"][0, :7] = True
    masks["b"][:3] = True
    r = random_masks_like(masks, seed=1)
    assert sum(int(m.sum()) for m in r.values()) == 10
    assert all(torch.equal(r[k], random_masks_like(masks, seed=1)[k]) for k in r)


def test_perturb_changes_exactly_masked_entries():
    state = {"w": torch.zeros(4, 5), "b": torch.ones(3)}
    mask = {"w": torch.zeros(4, 5, dtype=torch.bool)}
    mask["w"][1, 2] = mask["w"][3, 0] = True
    out = perturb(state, mask, size=0.5, seed=0)
    diff = (out["w"] - state["w"]).abs()
    assert torch.equal(diff > 0, mask["w"]) and torch.allclose(diff[mask["w"]], torch.tensor(0.5))
    assert torch.equal(state["w"], torch.zeros(4, 5)) and out["b"] is state["b"]
    with pytest.raises(KeyError, match="'x'"):
        perturb(state, {"x": mask["w"]}, size=1.0, seed=0)


def test_restore_takes_source_values_on_mask():
    merged, source = {"w": torch.zeros(3, 3)}, {"w": torch.arange(9.0).reshape(3, 3)}
    m = {"w": torch.eye(3, dtype=torch.bool)}
    out = restore(merged, source, m)
    assert torch.equal(out["w"], torch.diag(torch.tensor([0.0, 4.0, 8.0])))


def test_ablation_removes_the_subspace_from_the_input_side():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(6, 8, 1, 1, generator=g)
    V = random_basis(8, 3, seed=2)
    out = ablate_subspaces({"pw.weight": W}, {"pw.weight": V})
    Wm = out["pw.weight"].reshape(6, 8)
    assert float((Wm @ V).abs().max()) < 1e-5
    # the part orthogonal to V is untouched
    P = torch.eye(8) - V @ V.T
    torch.testing.assert_close(Wm @ P, W.reshape(6, 8) @ P, atol=1e-5, rtol=1e-5)


def test_random_basis_within_complement():
    A = random_basis(10, 4, seed=0)
    B = random_basis(10, 3, seed=1, within=A)
    torch.testing.assert_close(B.T @ B, torch.eye(3), atol=1e-5, rtol=1e-5)
    assert float((A.T @ B).abs().max()) < 1e-5


def test_first_order_check_on_a_quadratic():
    g = torch.Generator().manual_seed(3)
    A, W = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
    S = random_basis(6, 2, seed=4)
    removed = {"w": (W @ S) @ S.T}

    def loss(p):
        return 0.5 * ((p["w"] - A) ** 2).sum()

    out = first_order_check(loss, {"w": W}, removed, {"w": S})
    G = W - A
    assert out["predicted"] == pytest.approx(-float((G * removed["w"]).sum()), rel=1e-5)
    # exact expansion of a quadratic: measured = predicted + ½‖removed‖²
    assert out["measured"] == pytest.approx(out["predicted"] + 0.5 * float((removed["w"] ** 2).sum()), rel=1e-4)
    assert out["bound"] >= abs(out["predicted"]) - 1e-6
    assert out["bound"] == pytest.approx(float((G @ S).norm() * removed["w"].norm()), rel=1e-5)


def test_grid_and_depth_groups():
    assert grid("task_arithmetic")[0] == 0.05 and len(grid("task_arithmetic")) == 20
    assert grid("iso_c", 4, spacing="linear") == (0.1, 1.0667, 2.0333, 3.0)
    geo = grid("task_arithmetic", 5, spacing="geometric")  # ratio (1.0 / 0.05)^(1/4) = 2.1147
    assert geo == (0.05, 0.1057, 0.2236, 0.4729, 1.0)
    assert all(b / a == pytest.approx(20 ** 0.25, rel=1e-3) for a, b in zip(geo, geo[1:]))
    assert grid("iso_c", 3, lo=0.0, hi=2.0, spacing="geometric") == (0.0, 1.0, 2.0)  # from 0: linear
    with pytest.raises(ValueError, match="spacing"):
        grid("iso_c", 4, spacing="log")
    g = depth_groups([f"k{i}" for i in range(7)])
    assert g["early"] == ["k0", "k1", "k2"] and g["late"] == ["k5", "k6"] and len(g["all"]) == 7
