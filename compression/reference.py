"""The mathematics of each compressor, for ``--verify``: what the average of the workers'
decoded gradients must be, computed from every worker's local gradient in one process.

Nothing here is shared with the exchange path in ``compression/__init__.py`` (it imports none of
it): this is a second, plainer writing of the same definitions (see that module's docstring),
so that a bug in an encoder, in a decoder or in the exchange shows up as a difference.

``ReferenceMath.aggregate(names, per_rank, shapes)`` takes one bucket: the flat float64 local
gradients of the P workers (``per_rank[r]``), the names (parameter indices) and shapes of the
tensors packed in it, and returns ``(average, bound)``: the float64 average of the decoded
gradients, and either None (the method must match it as closely as the dense average, i.e.
fp32 reordering only) or a per-element float64 bound on how far a correct fp32/fp16
implementation may be from it. State (residuals, Q) is kept per worker and per tensor name,
separately from any live compressor.

Precision. What an encoder computes before sending is part of the compressor's definition (it
is what goes on the wire), so the reference computes it in the gradient's own dtype (fp32):
g/P before the half cast, g + residual, the residual updates. The selections (TopK's set, the
signs) are then bit-identical to a correct implementation, since fp32 arithmetic is exact to
reproduce; a float64 residual would drift from the fp32 one by an ulp and flip near-ties. Only
the decoding and the averaging are float64. Bounds:

- fp16: the P halves are summed by the collective in half precision, in an order we do not
  know; each of the P-1 additions rounds by at most 2^-11 of the partial sum (<= sum |h_i|),
  or 2^-25 in the subnormal range: bound (P-1) * (2^-11 * sum_i |h_i| + 2^-25).
- bf16: the same derivation with bfloat16's unit roundoff, 2^-8 (8 significant bits), and half
  its subnormal spacing, 2^-134: bound (P-1) * (2^-8 * sum_i |b_i| + 2^-134), b_i = g_i/P rounded
  to bfloat16 (once, from the gradient's dtype, as the encoder does).
- topk, eftopk, signum, signavg, efsignum, efsignum_scaled: None. The same entries are selected and the same values sent;
  the only difference is fp32 vs float64 summation of P values, as for dense.
- powersgd: None is not possible. PowerSGD is computed here twice, in float64 and, with its
  own state, in the compressor's precision (the "shadow", the same definition in the gradient's
  dtype). With error feedback and the warm-started Q, a rounding difference in one step changes
  the next step's inputs; on a gradient of lower rank than r (BatchNorm with a batch of 4 makes
  such gradients) these differences grow from step to step, and no independent writing follows
  an fp32 run for long. The distance between the shadow and float64 measures how far rounding
  alone moves the result of this very problem; the bound is POWERSGD_SHADOW_FACTOR times it,
  plus POWERSGD_BOUND_FACTOR * u * (kappa_1 + ... + kappa_t) * max |average| for the case where
  the two happen to agree (u: the unit roundoff of the gradient's dtype, kappa = Gram-Schmidt's
  amplification, summed over the steps so far). Well-conditioned tensors get a tight bound (the
  tests assert it stays far below a step); ill-conditioned ones get a loose one, and the
  allowance is printed. A float64 model (``--dtype float64``) has no shadow: the compressor
  and this reference then compute in the same precision, the bound is the floor term with
  u = 2^-53, and PowerSGD is checked to rounding level however ill-conditioned the problem.
"""
from __future__ import annotations

import zlib

import torch

# PowerSGD's bound (see the module docstring). Measured with one worker on BERT-tiny's and
# ResNet-18's gradients over 6 steps: |fp32 compressor - float64| <= 28 u * sum(kappa) *
# max |average| wherever the problem stays well conditioned (the worst: BERT's 30522 x 128
# embedding on step 1), so the floor term alone leaves a factor 2 there; where the difference
# grows (ResNet-18's last block from step 3), the shadow term follows it. 2 to 4 workers add the
# all-reduce's summation order. A wrong factor, a missing division, a transposed Q or a lost
# error-feedback term are off by O(1) of the result.
POWERSGD_BOUND_FACTOR = 64
POWERSGD_SHADOW_FACTOR = 8
FP32_UNIT = 2.0 ** -24
UNIT_ROUNDOFF = {torch.float32: FP32_UNIT, torch.float64: 2.0 ** -53}
FP16_UNIT = 2.0 ** -11
FP16_SUBNORMAL_HALF_SPACING = 2.0 ** -25
# bfloat16: 8 significant bits (7 stored), fp32's exponents (subnormal spacing 2^-133)
BF16_UNIT = 2.0 ** -8
BF16_SUBNORMAL_HALF_SPACING = 2.0 ** -134
# PowerSGD's initial Q of tensor ``name``: randn (fp32, CPU generator) seeded
# SEED + crc32(repr(name)), the same on every worker.
SEED = 1_000_003


def _orthonormal_basis(p: torch.Tensor, drop: float = 1e-4):
    """(basis, kappa): columns in order, each minus its components along the earlier basis
    vectors, normalised; zero when less than ``drop`` of its norm is left (P has rank below
    r). kappa = the largest |column| / |what is left of it| over kept columns: how much
    Gram-Schmidt amplifies a relative rounding error in P."""
    basis = torch.zeros_like(p)
    kappa = 1.0
    for i in range(p.shape[1]):
        v = p[:, i].clone()
        for j in range(i):
            v -= torch.dot(basis[:, j], v) * basis[:, j]
        whole, left = float(p[:, i].norm()), float(v.norm())
        if left > drop * whole:
            basis[:, i] = v / left
            kappa = max(kappa, whole / left)
    return basis, kappa


NAMES = ("none", "fp16", "topk", "eftopk", "signum", "signavg", "efsignum", "efsignum_scaled",
         "powersgd", "bf16")


# the options each reference needs (the compressors' own; their defaults are declared there)
NEEDS = {"topk": ("density",), "eftopk": ("density",),
         "powersgd": ("powersgd_rank", "powersgd_dense_steps")}


class ReferenceMath:
    """The built-in compressors' mathematics, one bucket at a time (``aggregate``), with the
    options of the compressor it checks (``--verify`` passes them resolved)."""

    def __init__(self, name: str, world: int, dtype=torch.float32,
                 density: float | None = None, powersgd_rank: int | None = None,
                 powersgd_dense_steps: int | None = None, fp16_divide: str = "before"):
        if name not in NAMES:
            raise ValueError(f"no reference for compressor {name!r}")
        given = {"density": density, "powersgd_rank": powersgd_rank,
                 "powersgd_dense_steps": powersgd_dense_steps}
        missing = [k for k in NEEDS.get(name, ()) if given[k] is None]
        if missing:
            raise TypeError(f"the {name} reference needs {', '.join(missing)}")
        if fp16_divide not in ("before", "after"):
            raise ValueError(f"fp16_divide must be 'before' or 'after', got {fp16_divide!r}")
        self.name, self.world, self.dtype = name, world, dtype
        # fp16: this suite divides by P in fp32 before the half cast; Horovod's fp16 casts,
        # sums in half and divides the half sum by P ("after"; hvd.Compression.fp16 with
        # op=Average).
        self.fp16_divide = fp16_divide
        self.density, self.rank, self.dense_steps = density, powersgd_rank, powersgd_dense_steps
        self.residual = {}  # (worker, tensor name) -> residual of that tensor, in self.dtype
        self.q = {}         # tensor name -> PowerSGD's Q (float64)
        self.steps = {}     # tensor name -> times aggregated
        self.kappa_sum = {}  # tensor name -> sum of Gram-Schmidt's amplification so far
        self.shadow_residual, self.shadow_q = {}, {}  # PowerSGD's fp32 shadow (see _powersgd)
        self.sensitivity = {}  # tensor name -> |fp32 shadow - float64| / max |float64|, last step

    # Each returns (average float64, bound float64 or None) for one bucket.
    def aggregate(self, names, per_rank, shapes):
        sizes = [int(torch.Size(s).numel()) for s in shapes]
        assert all(x.numel() == sum(sizes) for x in per_rank)
        return getattr(self, "_" + self.name)(list(names), per_rank, [tuple(s) for s in shapes],
                                              sizes)

    def _none(self, names, xs, shapes, sizes):
        return sum(xs) / self.world, None

    def _fp16(self, names, xs, shapes, sizes):
        after = self.fp16_divide == "after"
        scale = 1 if after else self.world
        halves = [(x.to(self.dtype) / scale).half().double() for x in xs]
        total = torch.zeros_like(xs[0])
        magnitude = torch.zeros_like(xs[0])
        for h in halves:
            total += h             # exact: P halves add exactly in float64
            magnitude += h.abs()
        bound = (self.world - 1) * (FP16_UNIT * magnitude + FP16_SUBNORMAL_HALF_SPACING)
        if after:
            # The half sum (off by at most `bound`) divided by P and rounded to half once more.
            p = self.world
            total, bound = total / p, (bound + FP16_UNIT * (magnitude + bound)) / p \
                + FP16_SUBNORMAL_HALF_SPACING
        return total, bound

    def _bf16(self, names, xs, shapes, sizes):
        """Each worker's g/P, divided in the gradient's dtype and rounded to bfloat16 once; the
        P of them summed in bfloat16 by the collective, each addition rounding."""
        sent = [(x.to(self.dtype) / self.world).to(torch.bfloat16).double() for x in xs]
        total = torch.zeros_like(xs[0])
        magnitude = torch.zeros_like(xs[0])
        for b in sent:
            total += b             # exact: P bfloat16 values add exactly in float64
            magnitude += b.abs()
        return total, (self.world - 1) * (BF16_UNIT * magnitude + BF16_SUBNORMAL_HALF_SPACING)

    # -- error feedback bookkeeping, per worker and tensor ---------------------------------------
    def _corrected(self, worker, names, x, sizes):
        """x + this worker's residual for the tensors of the bucket, in the wire dtype."""
        parts = []
        for name, n in zip(names, sizes):
            parts.append(self.residual.get((worker, name), torch.zeros(n, dtype=self.dtype)))
        return x.to(self.dtype) + torch.cat(parts).to(x.device)

    def _keep(self, worker, names, residual, sizes):
        start = 0
        for name, n in zip(names, sizes):
            self.residual[(worker, name)] = residual[start:start + n].clone()
            start += n

    def _topk(self, names, xs, shapes, sizes, feedback=False):
        n = sum(sizes)
        k = min(n, max(1, round(self.density * n)))
        total = torch.zeros(n, dtype=torch.float64, device=xs[0].device)
        for worker, x in enumerate(xs):
            c = self._corrected(worker, names, x, sizes) if feedback else x.to(self.dtype)
            # The k largest |c|, equal magnitudes in index order: a stable descending sort.
            chosen = torch.sort(c.double().abs(), descending=True, stable=True).indices[:k]
            sent = torch.zeros(n, dtype=torch.float64, device=x.device)
            sent[chosen] = c[chosen].double()
            total += sent
            if feedback:
                left = c.clone()
                left[chosen] = 0
                self._keep(worker, names, left, sizes)
        return total / self.world, None

    def _eftopk(self, names, xs, shapes, sizes):
        return self._topk(names, xs, shapes, sizes, feedback=True)

    def _signum(self, names, xs, shapes, sizes):
        votes = sum(torch.where(x.to(self.dtype) >= 0, 1.0, -1.0).double() for x in xs)
        return torch.sign(votes), None

    def _signavg(self, names, xs, shapes, sizes):
        """The original's signSGD: the workers' signs (a zero counts +1) averaged."""
        signs = sum(torch.where(x.to(self.dtype) >= 0, 1.0, -1.0).double() for x in xs)
        return signs / self.world, None

    def _efsignum(self, names, xs, shapes, sizes):
        """The original's EFSignCompressor: the signs of c = g + residual (a zero sends +1),
        averaged; the residual c - sign(c), 0 where c is 0."""
        total = torch.zeros(sum(sizes), dtype=torch.float64, device=xs[0].device)
        for worker, x in enumerate(xs):
            c = self._corrected(worker, names, x, sizes)
            total += torch.where(c >= 0, 1.0, -1.0).double()
            self._keep(worker, names, c - torch.sign(c), sizes)
        return total / self.world, None

    def _efsignum_scaled(self, names, xs, shapes, sizes):
        total = torch.zeros_like(xs[0])
        for worker, x in enumerate(xs):
            c = self._corrected(worker, names, x, sizes)
            sign = torch.where(c >= 0, 1.0, -1.0).to(self.dtype)
            decoded = torch.empty_like(c)
            start = 0
            for n in sizes:
                piece = c[start:start + n]
                scale = (piece.double().abs().sum() / n).to(self.dtype)
                decoded[start:start + n] = sign[start:start + n] * scale
                start += n
            total += decoded.double()
            self._keep(worker, names, c - decoded, sizes)
        return total / self.world, None

    def _powersgd(self, names, xs, shapes, sizes):
        total = sum(xs) / self.world  # the dense average, overwritten where a tensor is compressed
        bound = torch.zeros_like(total)
        start = 0
        for name, shape, n in zip(names, shapes, sizes):
            seg = slice(start, start + n)
            start += n
            self.steps[name] = self.steps.get(name, 0) + 1
            if len(shape) < 2 or self.steps[name] <= self.dense_steps:
                continue
            rows, cols = shape[0], n // shape[0]
            r = min(self.rank, rows, cols)
            if r * (rows + cols) >= rows * cols:
                continue
            grads = [x[seg].view(rows, cols) for x in xs]
            exact, kappa = self._power_step(name, grads, r, torch.float64)
            self.kappa_sum[name] = self.kappa_sum.get(name, 0.0) + kappa
            total[seg] = exact.reshape(-1)
            top = float(exact.abs().max())
            floor = POWERSGD_BOUND_FACTOR * UNIT_ROUNDOFF[self.dtype] * self.kappa_sum[name] * top
            if self.dtype == torch.float64:
                # The compressor's own precision: no shadow to measure against.
                self.sensitivity[name] = 0.0
                bound[seg] = floor
                continue
            shadow, _ = self._power_step(name, grads, r, self.dtype)
            gap = float((shadow - exact).abs().max())
            self.sensitivity[name] = gap / top if top else 0.0
            bound[seg] = POWERSGD_SHADOW_FACTOR * gap + floor
        return total, bound

    def _power_step(self, name, grads, r, dtype):
        """One PowerSGD step of one tensor for every worker, in ``dtype`` with that precision's
        own state (error-feedback residuals per worker, the shared Q): (P Q^T as float64,
        kappa of the orthonormalisation)."""
        residual = self.residual if dtype == torch.float64 else self.shadow_residual
        qs = self.q if dtype == torch.float64 else self.shadow_q
        rows, cols = grads[0].shape
        ms = []
        for worker, g in enumerate(grads):
            e = residual.get((worker, name))
            m = g.to(dtype)
            ms.append(m + e if e is not None else m.clone())
        q = qs.get(name)
        if q is None or q.shape != (cols, r):
            gen = torch.Generator().manual_seed(SEED + zlib.crc32(repr(name).encode()))
            q = torch.randn(cols, r, generator=gen, dtype=torch.float32).to(ms[0])
        p_sum = sum(m @ q for m in ms)
        basis, kappa = _orthonormal_basis(p_sum.double())
        basis = basis.to(dtype)
        q_mean = sum(m.t() @ basis for m in ms) / self.world
        approx = basis @ q_mean.t()
        for worker, m in enumerate(ms):
            residual[(worker, name)] = m - approx
        qs[name] = q_mean
        return approx.double(), kappa
