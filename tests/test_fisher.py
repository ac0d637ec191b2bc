"""S1–S2: diagonal Fisher against a closed form; enrichment on constructed masks."""
import pytest
import torch
from torch import nn

from pactlib.fisher import diagonal_fisher, enrichment, enrichment_score, highest_mask, lowest_mask, scalar_lbw_masks


def _linear_model(gen):
    model = nn.Linear(5, 3)
    with torch.no_grad():
        model.weight.copy_(torch.randn(3, 5, generator=gen))
        model.bias.copy_(torch.randn(3, generator=gen))
    return model


def test_empirical_fisher_matches_closed_form(gen):
    model = _linear_model(gen)
    x = torch.randn(40, 5, generator=gen)
    y = torch.randint(0, 3, (40,), generator=gen)
    F = diagonal_fisher(model, [(x[:25], y[:25]), (x[25:], y[25:])], n_samples=40, empirical=True, chunk=7)
    with torch.no_grad():
        p = torch.softmax(model(x), -1)
    r = nn.functional.one_hot(y, 3).float() - p  # ∂ log p_y / ∂ logits
    gw = r[:, :, None] * x[:, None, :]  # (N, 3, 5)
    torch.testing.assert_close(F["weight"], (gw ** 2).mean(0), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(F["bias"], (r ** 2).mean(0), rtol=1e-4, atol=1e-6)


def test_sampled_fisher_is_seeded_and_converges_to_true_fisher(gen):
    model = _linear_model(gen)
    x = torch.randn(1, 5, generator=gen).repeat(4000, 1)
    y = torch.zeros(4000, dtype=torch.long)
    a = diagonal_fisher(model, [(x, y)], n_samples=4000, seed=1, chunk=500)
    b = diagonal_fisher(model, [(x, y)], n_samples=4000, seed=1, chunk=500)
    assert torch.equal(a["bias"], b["bias"])
    with torch.no_grad():
        p = torch.softmax(model(x[:1]), -1)[0]
    true_bias = torch.stack([(p * ((torch.arange(3) == c).float() - p[c]) ** 2).sum() for c in range(3)])
    # E_y[(1{y=c} - p_c)^2] = p_c (1 - p_c); the 4000-sample estimate is within ~5 %
    torch.testing.assert_close(true_bias, p * (1 - p))
    torch.testing.assert_close(a["bias"], true_bias, rtol=0.08, atol=1e-3)


class _Trimming(nn.Module):
    """A linear classifier whose forward does data-dependent control flow (reads a tensor's value,
    as the MiniLM encoder does when it trims padding): vmap cannot run it, a per-example loop can."""

    def __init__(self, gen):
        super().__init__()
        self.lin = _linear_model(gen)

    def forward(self, x):
        width = int((x != 0).sum(1).max())  # .item() under the hood
        return self.lin(torch.nn.functional.pad(x[:, :width], (0, x.shape[1] - width)))


def test_fisher_falls_back_to_a_per_example_loop_with_the_same_result(gen):
    model = _Trimming(gen)
    x = torch.randn(12, 5, generator=gen)
    y = torch.randint(0, 3, (12,), generator=gen)
    with pytest.raises(RuntimeError, match="vmap"):
        diagonal_fisher(model, [(x, y)], n_samples=12, empirical=True, per_sample="vmap")
    auto = diagonal_fisher(model, [(x, y)], n_samples=12, empirical=True, chunk=5)
    loop = diagonal_fisher(model, [(x, y)], n_samples=12, empirical=True, per_sample="loop")
    plain = diagonal_fisher(model.lin, [(x, y)], n_samples=12, empirical=True)  # vmap on the same map
    for k in ("weight", "bias"):
        torch.testing.assert_close(auto[f"lin.{k}"], plain[k], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(loop[f"lin.{k}"], plain[k], rtol=1e-5, atol=1e-7)
    # sampled labels: the same draws whichever way the gradients are taken
    a = diagonal_fisher(model, [(x, y)], n_samples=12, seed=3, per_sample="loop")
    b = diagonal_fisher(model.lin, [(x, y)], n_samples=12, seed=3)
    torch.testing.assert_close(a["lin.bias"], b["bias"], rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="per_sample"):
        diagonal_fisher(model, [(x, y)], n_samples=2, per_sample="batched")


def test_fisher_errors(gen):
    model = _linear_model(gen)
    x, y = torch.randn(4, 5), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="held only 4"):
        diagonal_fisher(model, [(x, y)], n_samples=10)
    with pytest.raises(ValueError, match="unknown parameter"):
        diagonal_fisher(model, [(x, y)], n_samples=2, names=["nope"])


def test_masks_exact_counts():
    v = torch.tensor([5.0, 1.0, 1.0, 1.0, 3.0, 0.5, 2.0, 4.0, 6.0, 7.0])
    assert int(lowest_mask(v, 0.2).sum()) == 2 and bool(lowest_mask(v, 0.2)[5])
    assert highest_mask(v, 0.2).nonzero().flatten().tolist() == [8, 9]


def test_enrichment_closed_forms():
    N = 100
    small = torch.zeros(N, dtype=torch.bool)
    small[:10] = True
    sens = torch.zeros(N, dtype=torch.bool)
    sens[:10] = True
    assert enrichment_score(small, sens) == pytest.approx(10.0)  # perfect overlap: 1/q
    sens2 = torch.zeros(N, dtype=torch.bool)
    sens2[5:15] = True
    assert enrichment_score(small, sens2) == pytest.approx(5.0)
    sens3 = torch.zeros(N, dtype=torch.bool)
    sens3[50:60] = True
    assert enrichment_score(small, sens3) == 0.0


def test_enrichment_on_state_dicts():
    delta = {"a": torch.arange(1.0, 101.0).reshape(10, 10), "b": torch.arange(101.0, 201.0)}
    fisher = {"a": 1000 - torch.arange(1.0, 101.0).reshape(10, 10), "b": torch.zeros(100)}
    e = enrichment(delta, fisher, q=0.1)
    # the 20 smallest |Δ| are a[0..19]; the 20 largest F are a[0..19] too (F = 1000 - index): E = 1/q
    assert e.n_params == 200 and e.n_small == 20 and e.n_both == 20
    assert e.score == pytest.approx(10.0)
    assert e.per_key["a"] == pytest.approx(10.0)
    masks = scalar_lbw_masks(delta, fisher, q=0.1)
    assert int(masks["a"].sum()) == 20 and int(masks["b"].sum()) == 0
    with pytest.raises(ValueError, match="shape mismatch"):
        enrichment({"a": torch.zeros(3)}, {"a": torch.zeros(4)})
