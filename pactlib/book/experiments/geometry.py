"""The geometry of PACT on a layer small enough to draw (book chapter 1, "The method").

A toy matrix layer W0: R^3 -> R^3 has a two-dimensional pre-trained core (P1, a plane of the
input space). Each task's update Δt is dominated by one input direction v_t tilted slightly out
of that plane (its active subspace, P2). The LBW subspace of task t (P3) is what of the core
survives outside v_t; the shield of task t (P4) is built from the *other* tasks' LBW
subspaces, and the filter (P5) removes the shield component of Δt. Every number comes from the
engine's own functions (:func:`pactlib.pact.layer_subspaces`, :func:`pactlib.shield.build_shield`,
:func:`pactlib.shield.filter_update`, :func:`pactlib.pact.pact_filter`); this module only builds
the toy inputs, collects the results and draws them.

Also here: the spectra of the merged updates of M1–M5 on a seeded low-rank toy, and the
randomized-SVD check of P7 on a planted-rank matrix.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from pactlib import merges
from pactlib.linalg import projector_distance, top_singular
from pactlib.matrix import DEFAULT_RULE
from pactlib.pact import LayerSubspaces, PactOptions, layer_subspaces, pact_filter
from pactlib.shield import Shield, build_shield, filter_update
from pactlib.subspaces import intrusion_energy
from pactlib.taskvector import TaskVector

__all__ = ["TOY_OPTIONS", "TOLERANCE", "Toy", "toy_layer", "toy_records", "toy_drawing_records", "draw_toy",
           "toy_verdict", "merge_spectra", "rsvd_check"]

#: The toy's identities hold when each measured gap is below this (float64 rounding, with room).
TOLERANCE = 1e-12

#: PACT options of the toy: in R^3, K = round(2/3 · 3) = 2 (the core is a plane), k = 1 (one
#: active direction per task), τ = 0.5 (the default of book/method.md, P3) and a shield cap of 2 directions.
TOY_OPTIONS = PactOptions(core_frac=2 / 3, active_frac=1 / 3, lbw_tol=0.5, max_shield_frac=2 / 3)
KEY = "toy.weight"


@dataclass
class Toy:
    """A 3 x 3 toy layer and everything PACT computes on it.

    All bases are expressed in the coordinates of W0's right singular vectors, so the core is
    the plane spanned by e1, e2 and e3 is the direction W0 barely uses.

    Attributes:
        W0: (3, 3) pre-trained matrix; deltas: T x (3, 3) task updates Δt.
        directions: T x (3,) the unit input direction v_t each update was built along.
        subspaces: core V0,K (3, 2), actives Vt,k (3, 1), LBW subspaces with σ (P1–P3).
        shields: T shields S_t (P4); filtered: T x (3, 3) Δ̃t (P5).
        static_filtered: T x (3, 3) the S-PACT updates (P6: shield = core).
        engine_filtered: T x (3, 3) the same filter run by :func:`pact_filter` on a one-layer
            checkpoint (must equal ``filtered``).
        options: the :class:`PactOptions` used.
    """

    W0: Tensor
    deltas: list[Tensor]
    directions: list[Tensor]
    subspaces: LayerSubspaces
    shields: list[Shield]
    filtered: list[Tensor]
    static_filtered: list[Tensor]
    engine_filtered: list[Tensor]
    options: PactOptions


def toy_layer(*, angles_deg: Sequence[float] = (0.0, 40.0), tilt_deg: float = 20.0,
              core_values: Sequence[float] = (3.0, 2.0, 0.3), noise: float = 0.05, seed: int = 0,
              options: PactOptions = TOY_OPTIONS) -> Toy:
    """Build the toy layer and run P1–P6 on it.

    W0 = diag(core_values) after a seeded rotation of its output space (the input coordinates
    are W0's right singular vectors). Task t's update is Δt = u_t v_tᵀ + noise · G_t with u_t a
    seeded unit vector, G_t seeded Gaussian (3, 3) and
    v_t = cos(tilt) (cos a_t e1 + sin a_t e2) + sin(tilt) e3, a_t = ``angles_deg[t]``.

    Args:
        angles_deg: T in-plane angles (degrees) of the tasks' directions, T >= 2.
        tilt_deg: how far (degrees) every v_t leans out of the core plane.
        core_values: W0's three singular values, descending (the top two span the core).
        noise: scale of the Gaussian part of each update.
        seed: seeds a local ``torch.Generator`` (the global RNG is not touched).
        options: :class:`PactOptions` (default :data:`TOY_OPTIONS`).

    Raises:
        ValueError: fewer than two tasks, core values not three descending positive numbers,
            or a negative noise.
    """
    if len(angles_deg) < 2:
        raise ValueError(f"toy_layer: give at least two task angles, got {list(angles_deg)}")
    s = [float(v) for v in core_values]
    if len(s) != 3 or not all(a >= b > 0 for a, b in zip(s, s[1:])) or s[-1] <= 0:
        raise ValueError(f"toy_layer: core_values must be three descending positive numbers, got {s}")
    if noise < 0:
        raise ValueError(f"toy_layer: noise must be >= 0, got {noise}")
    gen = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))  # output rotation
    W0 = U @ torch.diag(torch.tensor(s, dtype=torch.float64))  # (3, 3); right singular vectors = e_i
    tilt = math.radians(tilt_deg)
    dirs, deltas = [], []
    for a in angles_deg:
        a = math.radians(a)
        v = torch.tensor([math.cos(tilt) * math.cos(a), math.cos(tilt) * math.sin(a), math.sin(tilt)],
                         dtype=torch.float64)
        u = torch.randn(3, generator=gen, dtype=torch.float64)
        u = u / u.norm()
        dirs.append(v)
        deltas.append(torch.outer(u, v) + noise * torch.randn(3, 3, generator=gen, dtype=torch.float64))
    subs = layer_subspaces(W0, deltas, options)  # P1–P3
    T = len(deltas)
    shields = [build_shield([subs.lbw[j].basis for j in range(T) if j != t], 3,
                            max_frac=options.max_shield_frac, tol=options.shield_tol) for t in range(T)]  # P4
    filtered = [filter_update(d, sh.basis) for d, sh in zip(deltas, shields)]  # P5
    static = build_shield([subs.core], 3, max_frac=options.max_shield_frac, tol=options.shield_tol)
    static_filtered = [filter_update(d, static.basis) for d in deltas]  # P6
    tvs = [TaskVector({KEY: d}, name=f"task {t + 1}", dtype=torch.float64) for t, d in enumerate(deltas)]
    engine, _ = pact_filter({KEY: W0}, tvs, mode="pact", options=options, rule=DEFAULT_RULE)
    return Toy(W0, deltas, dirs, subs, shields, filtered, static_filtered, [tv[KEY] for tv in engine], options)


def _angle_to_plane(v: Tensor, basis: Tensor) -> float:
    """Angle (degrees) between the vector v (n,) and the subspace spanned by basis (n, r)."""
    inside = float((basis.mT @ v).norm() / v.norm())
    return math.degrees(math.acos(min(1.0, inside)))


def toy_records(toy: Toy, *, params: dict, seed: int) -> list[dict]:
    """One record per task of the toy: what P1–P6 did to it (for :mod:`pactlib.book.records`).

    Metrics: ``tilt_deg`` (angle of the active direction to the core), ``sigma_1``,
    ``sigma_2`` (survival values of P3), ``lbw_rank``, ``shield_rank``, ``removed_pact`` /
    ``removed_spact`` (share of ‖Δt‖²_F removed by PACT / S-PACT), ``intrusion_before`` /
    ``intrusion_after`` (share of the other tasks' update energy inside this task's LBW
    subspace, before and after PACT: :func:`pactlib.subspaces.intrusion_energy`) and
    ``lbw_active_overlap`` (max |cosine| between the LBW basis and the active direction: 0 by
    construction) and ``engine_gap`` (max |difference| between the step-by-step filter and
    :func:`pact_filter`).
    """
    from pactlib.book.records import make_record

    out, T = [], len(toy.deltas)
    for t in range(T):
        lbw = toy.subspaces.lbw[t]
        d, f, sf = toy.deltas[t], toy.filtered[t], toy.static_filtered[t]
        e0 = float((d ** 2).sum())
        others = [j for j in range(T) if j != t]
        sig = [float(x) for x in lbw.sigma] + [math.nan, math.nan]
        out.append(make_record(
            "toy-geometry", params=params, seed=seed, task=t + 1,
            metrics={"tilt_deg": _angle_to_plane(toy.subspaces.active[t][:, 0], toy.subspaces.core),
                     "sigma_1": sig[0], "sigma_2": sig[1],
                     "lbw_rank": lbw.basis.shape[1], "shield_rank": toy.shields[t].basis.shape[1],
                     "removed_pact": 1 - float((f ** 2).sum()) / e0,
                     "removed_spact": 1 - float((sf ** 2).sum()) / e0,
                     "intrusion_before": intrusion_energy([toy.deltas[j] for j in others], lbw.basis),
                     "intrusion_after": intrusion_energy([toy.filtered[j] for j in others], lbw.basis),
                     "lbw_active_overlap": float((lbw.basis.mT @ toy.subspaces.active[t]).abs().max())
                     if lbw.basis.shape[1] else 0.0,
                     "engine_gap": float((f - toy.engine_filtered[t]).abs().max())}))
    return out


def _line(ax, v: Tensor, *, three_d: bool, **kw) -> None:
    pts = torch.stack([-v, v]).numpy()
    ax.plot(*(pts.T if three_d else pts[:, :2].T), **kw)


def _arrow(ax, v: Tensor, *, three_d: bool, **kw) -> None:
    x = v.numpy()
    if three_d:
        ls = kw.pop("ls", "-")
        kw.pop("zorder", None)
        ax.quiver(0, 0, 0, *x, arrow_length_ratio=0.12, linewidth=1.8, linestyles=ls, **kw)
    else:
        zorder = kw.pop("zorder", 3)
        lw = 2.6 if kw.get("ls") == ":" else 1.6
        ax.annotate("", xy=(x[0], x[1]), xytext=(0, 0), zorder=zorder,
                    arrowprops=dict(arrowstyle="->", lw=lw, **kw))


def toy_drawing_records(toy: Toy, *, params: dict, seed: int) -> list[dict]:
    """What :func:`draw_toy` draws, as one record per task (method ``"toy-drawing"``), so the
    figure can be drawn from records alone.

    Extra fields (coordinates in W0's right singular basis, plain lists of floats):
    ``active`` (3,), the active direction v_t signed like the update's direction and scaled by
    ‖Δt‖_F; ``filtered`` (3,), the dominant input direction of Δ̃t (P5) signed like ``active``
    and scaled by ‖Δ̃t‖_F; ``lbw``, the LBW basis of the task as a list of its columns (3,).
    Metrics: ``lbw_rank``.
    """
    from pactlib.book.records import make_record

    out = []
    for t, d in enumerate(toy.deltas):
        act = toy.subspaces.active[t][:, 0]
        act = act * torch.sign(act @ toy.directions[t])  # the sign of a singular vector is arbitrary
        filt = top_singular(toy.filtered[t], 1).V[:, 0]
        filt = filt * torch.sign(filt @ act) if float(filt @ act) != 0 else filt
        lbw = toy.subspaces.lbw[t].basis
        out.append(make_record("toy-drawing", params=params, seed=seed, task=t + 1,
                               metrics={"lbw_rank": lbw.shape[1]},
                               active=act * float(d.norm()), filtered=filt * float(toy.filtered[t].norm()),
                               lbw=lbw.mT))
    return out


def draw_toy(fig, axes, toy: Toy | Sequence[Mapping]) -> None:
    """Draw the toy on two panels: a 3-D view (left) and the view from above the core plane.

    Grey disc: the core V0,K (P1). Per task (one colour each): solid arrow, the active
    direction v_t (P2, scaled by ‖Δt‖_F); dashed line, its LBW subspace (P3); dotted arrow, the
    dominant input direction of the PACT-filtered update Δ̃t (P5, scaled by ‖Δ̃t‖_F). The left
    axes object of ``axes`` is replaced by a 3-D one.

    ``toy``: a :class:`Toy`, or its :func:`toy_drawing_records` (in task order).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    recs = toy_drawing_records(toy, params={}, seed=0) if isinstance(toy, Toy) else list(toy)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    pos = axes[0].get_subplotspec()
    axes[0].remove()
    ax3 = fig.add_subplot(pos, projection="3d")
    ax2 = axes[1]
    th = np.linspace(0, 2 * np.pi, 90)
    rr, tt = np.meshgrid(np.linspace(0, 1, 2), th)
    ax3.plot_surface(rr * np.cos(tt), rr * np.sin(tt), 0 * rr, color="0.6", alpha=0.25, linewidth=0, shade=False)
    ax3.plot(np.cos(th), np.sin(th), 0 * th, color="0.5", lw=0.8)
    ax2.fill(np.cos(th), np.sin(th), color="0.9", zorder=0)
    f64 = dict(dtype=torch.float64)
    drawn = [(colors[t % len(colors)], torch.tensor(r["active"], **f64), torch.tensor(r["filtered"], **f64),
              torch.tensor(r["lbw"], **f64).reshape(-1, 3).mT) for t, r in enumerate(recs)]
    for t, (c, act, _, lbws) in enumerate(drawn):  # updates and LBW lines first ...
        for ax, three in ((ax3, True), (ax2, False)):
            _arrow(ax, act, three_d=three, color=c)
            for i in range(lbws.shape[1]):
                _line(ax, lbws[:, i] * 1.1, three_d=three, color=c, ls="--", lw=1.2,
                      label=f"task {t + 1}: LBW" if (not three and i == 0) else None)
        ax2.plot([], [], color=c, label=f"task {t + 1}: Δt (solid) / filtered Δ̃t (dotted)")
    for c, _, filt, _ in drawn:  # ... then the filtered updates on top
        for ax, three in ((ax3, True), (ax2, False)):
            _arrow(ax, filt, three_d=three, color=c, ls=":", zorder=5)
    ax3.set(xlim=(-1.1, 1.1), ylim=(-1.1, 1.1), zlim=(-0.6, 0.6), xlabel="$e_1$", ylabel="$e_2$", zlabel="$e_3$")
    ax3.set(xticks=[-1, 0, 1], yticks=[-1, 0, 1], zticks=[-0.5, 0, 0.5])
    ax3.view_init(elev=22, azim=-60)
    ax3.set_title("input space $\\mathbb{R}^3$; grey: core $V_{0,K}$")
    ax2.set(xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal", xlabel="$e_1$", ylabel="$e_2$",
            title="seen from above the core plane")
    ax2.legend(loc="lower left", fontsize=6, framealpha=0.9)


def toy_verdict(frame, *, tolerance: float = TOLERANCE) -> dict:
    """The verdict on "the filter's geometry (P3–P5) on the toy layer" from :func:`toy_records`'
    records (a frame): three conditions on exact values, no sampling error
    (:func:`pactlib.book.intervals.point`), each "< ``tolerance``": the largest intrusion energy
    after filtering, the largest |cosine| between an LBW basis and its task's active direction,
    and the largest difference between :func:`pact_filter` and the step-by-step filter.

    Raises:
        KeyError: the frame lacks one of those metrics.
    """
    from pactlib.book.intervals import point
    from pactlib.book.verdicts import condition, graded

    f = frame[frame["method"] == "toy-geometry"] if "method" in frame else frame
    worst = {"largest intrusion energy after filtering": float(f["metrics.intrusion_after"].abs().max()),
             "largest |cos| between an LBW basis and its active direction": float(f["metrics.lbw_active_overlap"].max()),
             "pact_filter vs the step-by-step filter, largest difference": float(f["metrics.engine_gap"].max())}
    conditions = [condition(name, point(v), threshold=tolerance, side="<", unit="") for name, v in worst.items()]
    before = f["metrics.intrusion_before"]
    note = (f"Values: {'; '.join(f'{k} {v:.1e}' for k, v in worst.items())}; intrusion energy before filtering "
            f"{before.min():.2f}–{before.max():.2f}; exact values of one seeded toy (no sampling error).")
    return graded(conditions, f"Identities of P3–P5 on the toy layer, each below {tolerance:g}", note=note)


def merge_spectra(*, n: int = 24, tasks: int = 4, rank: int = 3, seed: int = 0,
                  methods: Sequence[str] | None = None) -> dict[str, Tensor]:
    """Singular values of the merged update D of every method on one seeded toy layer (M1–M5).

    Each task's update is a seeded random rank-``rank`` (n, n) matrix plus 1 % noise. Returns
    ``{method: singular values (n,)}`` descending, computed through the registry
    (:func:`pactlib.merges.get`), so the same kernels run as on real checkpoints.

    Raises:
        ValueError: ``rank`` > ``n`` or fewer than two tasks.
    """
    if rank > n or tasks < 2:
        raise ValueError(f"merge_spectra: need rank <= n and >= 2 tasks, got rank={rank}, n={n}, tasks={tasks}")
    gen = torch.Generator().manual_seed(seed)
    tvs = []
    for t in range(tasks):
        d = torch.randn(n, rank, generator=gen) @ torch.randn(rank, n, generator=gen) / rank ** 0.5
        d = d + 0.01 * torch.randn(n, n, generator=gen)
        tvs.append(TaskVector({KEY: d}, name=f"task {t + 1}"))
    out = {}
    for m in methods or merges.names():
        D = merges.get(m)(tvs, rule=DEFAULT_RULE)
        out[m] = torch.linalg.svdvals(D[KEY])
    return out


def rsvd_check(*, m: int = 512, n: int = 256, rank: int = 16, r: int = 16, noise: float = 1e-3,
               oversample: int = 10, n_iter: int = 2, seed: int = 0, repeats: int = 3) -> dict[str, float]:
    """Exact vs randomized top-``r`` right singular subspace (P7) of a planted-rank matrix.

    The matrix is a seeded rank-``rank`` (m, n) product plus ``noise`` Gaussian noise. Returns
    ``projector_distance`` (spectral: sine of the largest principal angle) between the two
    subspaces and the seconds each call took (the fastest of ``repeats``: the minimum is the
    least disturbed by other work on the machine).

    Raises:
        ValueError: ``r`` > min(m, n) or ``repeats`` < 1.
    """
    if r > min(m, n) or repeats < 1:
        raise ValueError(f"rsvd_check: need r <= min(m, n) and repeats >= 1, got r={r}, shape=({m}, {n}), repeats={repeats}")
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(m, rank, generator=gen) @ torch.randn(rank, n, generator=gen) + noise * torch.randn(m, n, generator=gen)
    times = {"exact": [], "rsvd": []}
    for _ in range(repeats):
        for method in ("exact", "rsvd"):
            t0 = time.perf_counter()
            V = top_singular(A, r, method=method, oversample=oversample, n_iter=n_iter, seed=seed).V
            times[method].append(time.perf_counter() - t0)
            if method == "exact":
                exact = V
            else:
                approx = V
    return {"distance": projector_distance(exact, approx), "exact_seconds": min(times["exact"]),
            "rsvd_seconds": min(times["rsvd"])}
