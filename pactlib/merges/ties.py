"""TIES-Merging (M2): trim, elect sign, disjoint mean.

Yadav et al., "TIES-Merging: Resolving Interference When Merging Models", NeurIPS 2023.
"""
from __future__ import annotations

from typing import Callable, Literal, Sequence

import torch
from torch import Tensor

from ..matrix import MatrixRule
from ..taskvector import TaskVector
from .registry import alpha_grid, register


def trim_count(numel: int, k: float) -> int:
    """How many of ``numel`` entries TIES keeps at ``k`` percent: ceil(k% · numel), at least 1.

    Raises:
        ValueError: ``k`` outside (0, 100].
    """
    if not (0 < k <= 100):
        raise ValueError(f"TIES trim percentage k must be in (0, 100], got {k}")
    return min(numel, max(1, int(-(-k * numel // 100))))


def trim_mask(x: Tensor, k: float) -> Tensor:
    """Boolean mask (same shape as x) of exactly ceil(k% · x.numel()) entries of largest |x|.

    Ties at the threshold are broken by position: with v the ``keep``-th largest |x|, every
    entry with |x| > v is kept, then the first (in flattened order) entries with |x| = v until
    the count is exact. The rule is explicit (``torch.topk`` picks tied entries in no specified
    order), so the streamed merge (:mod:`pactlib.streaming`), which finds v and the tie count in
    passes over the files, keeps the very same entries.

    Raises:
        ValueError: ``k`` outside (0, 100].
    """
    flat = x.reshape(-1).abs()
    keep = trim_count(flat.numel(), k)
    if keep == 0:
        return torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    v = torch.topk(flat, keep, sorted=False).values.min()  # the keep-th largest |x| (a value: no tie issue)
    mask = flat > v
    need = keep - int(mask.sum())
    if need > 0:
        mask[torch.nonzero(flat == v).reshape(-1)[:need]] = True
    return mask.reshape(x.shape)


class GlobalThreshold:
    """The exact TIES trim of T task vectors read in passes, in bounded memory (M2, scope global).

    For each task, the ``keep``-th largest |Δ| over the whole flattened task vector (``keep`` =
    :func:`trim_count`) is found by radix selection on the bit patterns of |Δ| (for non-negative
    floats the order of the bit patterns is the order of the values): each pass over the data
    histograms one 16-bit digit of the entries that share the digits found so far (2 passes for
    float32, 4 for float64; 65,536 counters per task). The result is v_t and how many entries
    equal to v_t are kept (the first ones by position), which is what :func:`trim_mask` keeps
    on the concatenated task vector: :meth:`mask` then trims chunk by chunk, in position order.

    Use: ``observe(t, values)`` for every chunk of every task, then ``end_pass()``; repeat while
    ``not done``; then ``mask(t, values)`` over every chunk of every task in position order.
    On (T, …) stacks of chunks: :func:`pactlib.streaming.find_thresholds` does the passes,
    :func:`pactlib.streaming.trim_stack` the masking. Memory: the counters plus one chunk,
    whatever the size of the task vectors. Chunks are CPU tensors. Threads: ``observe`` and
    ``mask`` of different tasks may run at once on different threads (each with its own ``work``);
    ``end_pass`` runs when they are done.

    Args:
        tasks: T. ``keep``: entries kept per task (:func:`trim_count` of the task vector's size).
        dtype: the task vectors' dtype, float32 or float64.
        count: counts a float32 CPU chunk in one fused pass instead of torch's expressions, the
            same counts: ``count(values, prefix, shift, hist) -> bool`` adds the chunk's digits to
            ``hist`` (one task's 2^16 int64 counters) and returns True, or returns False to leave it
            to torch (:func:`pactlib.streaming.native_count`, the C kernels when they are
            available). None: torch counts every chunk.

    Raises:
        ValueError: another ``dtype``.
    """

    DIGIT = 16

    def __init__(self, tasks: int, keep: int, dtype: torch.dtype, *,
                 count: Callable[[Tensor, int, int, Tensor], bool] | None = None):
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"GlobalThreshold: dtype must be float32 or float64, got {dtype}")
        self.int_dtype = torch.int32 if dtype == torch.float32 else torch.int64
        self.bits = 32 if dtype == torch.float32 else 64
        self.tasks, self.keep = tasks, keep
        self.shift = self.bits - self.DIGIT  # shift of the digit the current pass histograms
        self.prefix = [0] * tasks  # bit pattern of v_t found so far (digits above ``shift``)
        self.rank = [keep] * tasks  # rank (from the top, 1-based) of v_t among entries with that prefix
        self.above = [0] * tasks  # entries known to be > v_t
        self.hist = torch.zeros(tasks, 1 << self.DIGIT, dtype=torch.int64)
        self._left: list[int] | None = None  # ties still to keep, during the masking pass
        self.count = count

    @property
    def done(self) -> bool:
        return self.shift < 0

    def _bits(self, values: Tensor, work: dict | None = None) -> Tensor:
        """The bit patterns of |values|, flattened: a new tensor, or one of ``work``'s buffers."""
        if work is None:
            return values.detach().abs().reshape(-1).contiguous().view(self.int_dtype)
        flat = values.detach().reshape(-1)
        return torch.abs(flat, out=scratch(work, "abs", flat.numel(), flat.dtype)).view(self.int_dtype)

    def observe(self, t: int, values: Tensor, *, work: dict | None = None) -> None:
        """Count one chunk of task t's entries in this pass's histogram.

        After the first pass only the entries whose higher digits are v_t's so far count: with
        base = that prefix's smallest pattern, (b − base) >> shift is their digit, negative below
        the prefix and ≥ 2^16 above it; clamped to [−1, 2^16] and shifted by one, every entry
        lands in one of 2^16 + 2 bins, and the middle ones are the histogram (one bincount over the
        chunk, no selection of the entries first).

        ``work``: a dict the caller keeps from call to call; the chunk-sized temporaries then
        live in its buffers (the same counts). A float32 CPU chunk is counted in one fused pass
        by the ``count`` given to the constructor, when it takes it (the same counts)."""
        if self.count is not None and self.bits == 32 and values.dtype == torch.float32 and values.device.type == "cpu":
            if self.count(values.detach(), self.prefix[t], self.shift, self.hist[t]):
                return
        b = self._bits(values, work)
        top = self.shift + self.DIGIT
        if top < self.bits:
            b -= self.prefix[t] << top  # in place: b is a new tensor or work's buffer (:meth:`_bits`)
            if self.shift:
                b >>= self.shift
            b.clamp_(-1, 1 << self.DIGIT)
            b += 1
            self.hist[t] += torch.bincount(b, minlength=(1 << self.DIGIT) + 2)[1:(1 << self.DIGIT) + 1]
            return
        b >>= self.shift  # the top digit (|x| has no sign bit): a shift alone
        self.hist[t] += torch.bincount(b, minlength=1 << self.DIGIT)

    @classmethod
    def join(cls, parts: Sequence["GlobalThreshold"]) -> "GlobalThreshold":
        """One finished threshold of T tasks from T finished one-task thresholds (task t's from
        ``parts[t]``): the per-key TIES of the streamed merge finds each task's threshold on its
        own (:mod:`pactlib.streaming`), then masks the (T, …) chunks of the key with the joint one.

        Raises:
            ValueError: no parts, a part not finished or of more than one task, mixed dtypes.
        """
        if not parts or any(p.tasks != 1 or not p.done or p.bits != parts[0].bits for p in parts):
            raise ValueError("GlobalThreshold.join: needs finished one-task thresholds of one dtype")
        out = cls(len(parts), 0, torch.float32 if parts[0].bits == 32 else torch.float64)
        out.hist = torch.zeros(0, dtype=torch.int64)
        out.shift = parts[0].shift
        out.prefix = [p.prefix[0] for p in parts]
        out.rank = [p.rank[0] for p in parts]
        out.above = [p.above[0] for p in parts]
        out._left = list(out.rank)
        return out

    def end_pass(self) -> None:
        """Fix one more digit of every task's threshold from this pass's histogram."""
        for t in range(self.tasks):
            counts = self.hist[t]
            at_or_above = counts.flip(0).cumsum(0).flip(0)  # entries with digit >= j
            j = int((at_or_above >= self.rank[t]).nonzero().max())  # largest digit holding the rank
            higher = int(at_or_above[j + 1]) if j + 1 < counts.numel() else 0
            self.above[t] += higher
            self.rank[t] -= higher
            self.prefix[t] = (self.prefix[t] << self.DIGIT) | j
        self.shift -= self.DIGIT
        self.hist.zero_()
        if self.done:  # the masking's tie counts, set before any (possibly concurrent) mask call
            self._left = list(self.rank)

    def threshold(self, t: int) -> Tensor:
        """v_t, the ``keep``-th largest |Δt| (a 0-d tensor of the task vectors' dtype)."""
        if not self.done:
            raise RuntimeError("GlobalThreshold: passes not finished")
        return torch.tensor(self.prefix[t], dtype=self.int_dtype).view(
            torch.float32 if self.bits == 32 else torch.float64)

    def pending_ties(self) -> list[int]:
        """How many entries equal to v_t the masking pass still keeps, per task (the masking
        state that :meth:`mask` advances; :func:`pactlib.native.ties_merge` advances a copy).

        Raises:
            RuntimeError: the passes are not finished."""
        if not self.done:
            raise RuntimeError("GlobalThreshold: passes not finished")
        if self._left is None:
            self._left = list(self.rank)
        return list(self._left)

    def set_pending_ties(self, left: Sequence[int]) -> None:
        """Continue the masking pass from ``left`` (:meth:`pending_ties` after some chunks).

        Raises:
            ValueError: not one count per task, or a count below 0 or above the task's ties."""
        left = [int(x) for x in left]
        if len(left) != self.tasks or any(not 0 <= x <= r for x, r in zip(left, self.rank)):
            raise ValueError(f"GlobalThreshold: pending ties {left} for ties {self.rank}")
        self._left = left

    def mask(self, t: int, values: Tensor, *, work: dict | None = None) -> Tensor:
        """The trim mask of the next chunk of task t (chunks must come in position order).

        ``work``: as :meth:`observe`; the mask then is a view of one of its buffers (valid until
        the next call with it)."""
        if not self.done:
            raise RuntimeError("GlobalThreshold: passes not finished")
        if self._left is None:
            self._left = list(self.rank)  # entries equal to v_t still to keep
        b = self._bits(values, work)
        v = self.prefix[t]
        m = b > v if work is None else torch.gt(b, v, out=scratch(work, "mask", b.numel(), torch.bool))
        if self._left[t] > 0:
            tied = b == v if work is None else torch.eq(b, v, out=scratch(work, "same", b.numel(), torch.bool))
            idx = torch.nonzero(tied).reshape(-1)[: self._left[t]]
            m[idx] = True
            self._left[t] -= idx.numel()
        return m.reshape(values.shape)


def scratch(work: dict, name: str, n: int, dtype: torch.dtype) -> Tensor:
    """A 1-d tensor of ``n`` entries of ``dtype`` kept in ``work[name]`` from call to call (grown
    when too small, on ``work["device"]`` if set, else the CPU): the temporaries of a loop over
    chunks, allocated once."""
    b = work.get(name)
    if b is None or b.numel() < n or b.dtype != dtype:
        b = work[name] = torch.empty(max(n, 1), dtype=dtype, device=work.get("device", "cpu"))
    return b[:n]


def agree_count(agree: Tensor, *, out: Tensor | None = None) -> Tensor:
    """How many of the T rows agree, per entry: ``agree.sum(0)`` of a (T, …) bool tensor, in
    uint8 when T ≤ 255 (a byte sum over rows is one vectorized pass; torch's bool-to-int64 sum
    along dimension 0 is many times slower), else int32. The counts are exact either way, and a
    division by them gives the same floats as by int64 counts (each count converts exactly).
    ``out``: a tensor of the result's shape and dtype to write into."""
    T = agree.shape[0]
    if T <= 255:
        return torch.sum(agree.view(torch.uint8), 0, dtype=torch.uint8, out=out)
    out = torch.zeros(agree.shape[1:], dtype=torch.int32, device=agree.device) if out is None else out.zero_()
    for t in range(T):
        out += agree[t]
    return out


def count_dtype(tasks: int) -> torch.dtype:
    """The dtype of :func:`agree_count` for ``tasks`` rows."""
    return torch.uint8 if tasks <= 255 else torch.int32


def task_sum(stack: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Σt stack[t] of a (T, …) stack, entry by entry, in one fixed order whatever the entry's
    position, the chunking, the device and the SIMD width: the rows in blocks of 2^p (p =
    max(4, ⌈log2 T⌉ / 4)), each block summed in order into the first of four levels, a level
    passed up when full, the levels added last, and the result added to 0 (ATen's cascade sum
    over an outer dimension, on all of its columns: ``torch.sum(stack, 0)`` itself sums a
    chunk's last columns in another order, so its bits would depend on where a chunk ends).
    Sequential for T ≤ 16. :func:`pactlib.native.ties_merge` sums in the same order.

    ``out``: a tensor of ``stack.shape[1:]`` to write into (not one of the stack's rows)."""
    T = stack.shape[0]
    shape = stack.shape[1:]
    out = torch.zeros(shape, dtype=stack.dtype, device=stack.device) if out is None else out.zero_()
    if T <= 16:
        for t in range(T):
            out += stack[t]
        return out.add_(0.0)  # 0 + sum: −0 becomes +0, as the cascade's last step
    levels, power = 4, max(4, (T - 1).bit_length() // 4)
    step, mask = 1 << power, (1 << power) - 1
    acc = [out] + [torch.zeros(shape, dtype=stack.dtype, device=stack.device) for _ in range(levels - 1)]
    i = 0
    while i + step <= T:
        for _ in range(step):
            acc[0] += stack[i]
            i += 1
        for lv in range(1, levels):
            acc[lv] += acc[lv - 1]
            acc[lv - 1].zero_()
            if i & (mask << (lv * power)):
                break
    for j in range(i, T):
        acc[0] += stack[j]
    for lv in range(1, levels):
        acc[0] += acc[lv]
    return out.add_(0.0)


def ties_kernel(stack: Tensor, *, work: dict | None = None) -> Tensor:
    """Elect + disjoint mean of already trimmed updates (T, …) -> (…).

    The elected sign is sign(Σt trimmed Δt) (sums over tasks: :func:`task_sum`); entries agreeing with it (and non-zero) are averaged;
    where none agree (or the elected sign is 0) the result is 0. An entry agrees when
    Δt · sign > 0: the same entries as sign(Δt) = sign and Δt ≠ 0 (a sign of 0 agrees with
    none), in two passes instead of four.

    ``work``: a dict the caller keeps from call to call (chunk after chunk of a streamed merge);
    the temporaries then live in its buffers (the same operations, written with ``out=``: the same
    values), and only the result is a new tensor.
    """
    if work is None:
        elected = torch.sign(task_sum(stack))
        agree = (stack * elected) > 0
        count = agree_count(agree)
        total = task_sum(torch.where(agree, stack, torch.zeros_like(stack)))
        return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))

    def buf(name: str, shape, dtype: torch.dtype) -> Tensor:
        n = 1
        for d in shape:
            n *= d
        b = work.get(name)
        if b is None or b.numel() < n or b.dtype != dtype or b.device != stack.device:
            b = work[name] = torch.empty(max(n, 1), dtype=dtype, device=stack.device)
        return b[:n].view(tuple(shape))

    inner = stack.shape[1:]
    zero = torch.zeros((), dtype=stack.dtype, device=stack.device)
    elected = task_sum(stack, out=buf("sum", inner, stack.dtype))
    torch.sign(elected, out=elected)
    prod = torch.mul(stack, elected, out=buf("signs", stack.shape, stack.dtype))
    agree = torch.gt(prod, 0, out=buf("agree", stack.shape, torch.bool))
    count = agree_count(agree, out=buf("count", inner, count_dtype(stack.shape[0])))
    kept = torch.where(agree, stack, zero, out=prod)
    total = task_sum(kept, out=buf("total", inner, stack.dtype))
    some = torch.gt(count, 0, out=buf("some", inner, torch.bool))
    torch.div(total, count.clamp_(min=1), out=total)
    return torch.where(some, total, zero)


@register("ties", pretty="TIES", reference="Yadav et al., NeurIPS 2023", alphas=alpha_grid(0.05, 1.0, 0.05),
          per_key=lambda p: p["scope"] == "per_key")
def ties(task_vectors: list[TaskVector], *, rule: MatrixRule, k: float = 20.0,
         scope: Literal["global", "per_key"] = "global") -> TaskVector:
    """TIES (M2): keep each task's top ``k``% entries by |Δt|, elect signs, disjoint mean.

    Args:
        k: trim percentage kept per task (default 20).
        scope: ``"global"`` ranks each task's entries over the whole flattened task vector, as the
            reference implementation does; ``"per_key"`` ranks within each tensor.

    Raises:
        ValueError: ``k`` outside (0, 100] or an unknown ``scope``.
    """
    if scope not in ("global", "per_key"):
        raise ValueError(f"TIES scope must be 'global' or 'per_key', got {scope!r}")
    keys = list(task_vectors[0].keys())
    trimmed = []
    for tv in task_vectors:
        if scope == "global":
            flat = torch.cat([tv[key].reshape(-1) for key in keys])
            mask = trim_mask(flat, k)
            kept, out, off = flat * mask, {}, 0
            for key in keys:
                n = tv[key].numel()
                out[key] = kept[off:off + n].reshape(tv[key].shape)
                off += n
        else:
            out = {key: tv[key] * trim_mask(tv[key], k) for key in keys}
        trimmed.append(out)
    return TaskVector._wrap({key: ties_kernel(torch.stack([t[key] for t in trimmed])) for key in keys})
