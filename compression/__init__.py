"""Gradient compressors: what is sent instead of the dense fp32 gradient (docs/DESIGN.md section 7).

A compressor has one job, in the spirit of torch DDP's comm hooks: take a flat gradient tensor,
exchange it with the other workers in whatever encoded form it likes, and leave the average of
all workers' (decoded) gradients in that tensor. It knows nothing of buckets, hooks or
schedules; the method decides when and on what to call it::

    pending = compressor.reduce_async(key, flat, comm, shapes)   # encodes, starts communication
    pending.wait()                                               # flat now holds the average

``key`` is a stable name of the bucket; ``shapes`` the shapes of the gradients packed in it, in
order. State (error-feedback residuals, PowerSGD's Q) is kept per gradient tensor: when ``key`` is
a tuple with one entry per shape (what every method here passes: the parameters' indices),
entry j names tensor j, so the state follows a tensor when a method re-plans its buckets (fusion
does after its first step); any other key is opaque and its state is kept per key.

The compressors (pure torch, CPU or CUDA, no compiled extension):

- ``none``: dense all-reduce, divided by the number of workers P (by the all-reduce itself,
  ``ReduceOp.AVG``, where the backend can: ``Comm.average_op``).
- ``fp16``: g/P cast to half, all-reduced (summed) in half, cast back. Dividing before the cast,
  as DDP's fp16 hook does, keeps the half sum from overflowing where the average would not.
- ``bf16``: the same in bfloat16 (8 significant bits, fp32's exponent range): g/P computed in the
  gradient's dtype and rounded to bfloat16 once, all-reduced (summed) in bfloat16, cast back.
  (DDP's ``bf16_compress_hook`` casts to bfloat16 first and divides the bfloat16 copy, a second
  rounding unless P is a power of two; dividing first makes what is sent one rounding of g/P.)
- ``topk`` / ``eftopk``: keep the k = min(n, max(1, round(density * n))) entries of largest
  magnitude of the bucket (ties: the lower index, so every implementation of this mathematics
  picks the same set); all-gather the values (the gradient's dtype) and their int32 indices; the
  result is the scatter-add of every worker's entries, divided by P. ``eftopk`` adds error
  feedback: the residual (corrected gradient minus what was sent) is added to the next
  gradient before selection, so nothing is lost, only delayed.
- ``signum``: signSGD with majority vote (Bernstein et al. 2019). Each worker sends the bits
  ``g >= 0`` packed 32 per int32 (a zero votes +1: one bit has no zero); the result is
  sign(sum of the P votes), with no scale: the optimizer's learning rate is the step size, as in
  signSGD. An element with as many +1 as -1 votes (even P) gets 0.
- ``signavg``: signSGD as the original suite ran it (its ``mgwfbp/compression.py``
  SignCompressor through its optimizer's all-gather path): the same bits as ``signum``, but
  the result is the mean of the P workers' signs, (ayes - noes) / P, in {-1, -1 + 2/P, ..., 1},
  not their vote.
- ``efsignum``: signSGD with error feedback as the original suite ran it (its
  ``mgwfbp/compression.py`` EFSignCompressor): corrected c = g + residual; the sign bits of c
  are sent, unscaled (a zero sends +1, as ``signum``); the residual is c - sign(c) (torch's
  sign: 0 where c is 0); the result is the mean of the P workers' signs, as ``signavg``.
- ``efsignum_scaled``: EF-signSGD (Karimireddy et al. 2019): corrected c = g + residual; each
  tensor of the bucket is sent as its sign bits and one scale, mean |c| over that tensor; the
  residual is c - scale * sign(c); the result is the average over workers of scale * sign (no
  vote: the scales differ per worker, and averaging them is what the error-feedback analysis
  assumes).
- ``powersgd``: PowerSGD (Vogels et al. 2019), rank r (``powersgd_rank``). Every gradient of
  two or more dimensions is viewed as a matrix M (rows = first dimension) plus its error
  feedback; P = M Q is all-reduced (summed), orthonormalised (Gram-Schmidt in float64; a column
  with less than 1e-4 of its norm left is dropped), Q = M^T P is all-reduced and divided by
  the workers, and P Q^T is the result; the new residual is M - P Q^T and Q is kept for the
  next step (warm start). 1-D tensors (biases, norms) go uncompressed, as in DDP's PowerSGD
  hook, and so do matrices whose factors would not be smaller (r(n+m) >= nm); they are
  all-reduced dense beside P. Compression starts at the first step (``powersgd_dense_steps``
  0): DDP's hook all-reduces dense for its first 1000 iterations by default
  (``start_powerSGD_iter``), which would hide the compressor in a short benchmark. Its second
  all-reduce (Q) is issued inside ``wait()``: a method must start all its buckets before it
  waits for any (the bucketed methods do), so every rank issues the same collectives in the
  same order.

On CUDA, TopK's tie check and efsignum_scaled's scales read one number back to the host per bucket.

Compressors count through the ``Comm`` they exchange with, as methods do (one count of bytes per
run): every collective they start, the dense fp32 figures of each gradient they exchange
(``Comm.count_dense``) and their encode and decode time (``Comm.clock``, communication
excluded). Each compressor class declares its id, its options (``Options``), what it sends in
words (``sends``) and as figures (``declare``: per bucket of given shapes at P workers, the
collectives in issue order with their bytes, which are issued only when the bucket is waited
for, whether a dense tail goes, and what its encode and decode pass over: ``Sends``), which the
performance model prices; the running compressor and its declaration share their arithmetic
(``topk_count``, ``powersgd_plan``, ``sign_words``). ``COMPRESSORS`` is the registry the
command line, the sweep, the launchers and the model read: the compressors here, then those of
the modules named in ``DDLBENCH_COMPRESSORS`` (comma-separated), each of which may name its
reference mathematics (``reference``, a ``module:Class`` kept apart from its encoder) for
``--verify``. Nothing here imports torch at module level, so the declarations can be read
without it.
"""
from __future__ import annotations

# Python 3.14 has a standard-library package of this name (PEP 784: compression.zstd, .gzip,
# .bz2, .lzma, .zlib, ._common), and ours hides it when the repository root comes first on
# sys.path. zipfile, shutil and tarfile (also urllib3, fsspec) import compression.zstd under
# try/except ImportError, so they would quietly lose zstd. Looking in the library's directory
# after ours keeps our names ours (none collide) and lets its submodules load. This comes before
# the other imports: on 3.14 tempfile imports shutil, which imports compression.zstd.
import os as _os
import sysconfig as _sysconfig

_stdlib = _os.path.join(_sysconfig.get_paths()["stdlib"], "compression")
if _os.path.isdir(_stdlib) and _stdlib not in __path__:
    __path__.append(_stdlib)
del _os, _sysconfig, _stdlib

import importlib
import math
import os
import zlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from ddlbench.errors import UsageError
from ddlbench.options import COUNT, COUNT0, FRACTION, NoOptions, Options, collect, option

if TYPE_CHECKING:  # annotations only: the module itself imports no torch
    import torch

POWERSGD_SEED = 1_000_003
PLUGINS_ENV = "DDLBENCH_COMPRESSORS"
# The collectives a declaration names, with the size conventions of nccl-tests (and
# comm_bench): an all-reduce's size is the tensor every rank holds; an all-gather's the GATHERED
# output, P x each rank's contribution (``Comm``'s payload counts the contribution).
ALLREDUCE, ALLGATHER = "allreduce", "allgather"
INDEX_BYTES = 4   # TopK's indices are int32
WORD_BYTES = 4    # signs travel 32 per int32 word
HALF_BYTES = 2    # fp16 and bf16 send 16 bits an element whatever the gradient's dtype


@dataclass(frozen=True)
class Sends:
    """What a compressor sends for one bucket, declared without torch: ``collectives`` in the
    order it issues them, each (op, size) with op ``ALLREDUCE`` or ``ALLGATHER`` (sizes as
    above); the last ``at_wait`` of them are issued only when the bucket is waited for (they
    need the others' result: PowerSGD's Q); ``dense_tail``: one of them carries tensors sent
    uncompressed; ``codec_elements``: the dense elements its encode and decode pass over (what
    codec_bench's ``encode_s_per_element`` and ``decode_s_per_element`` are per);
    ``codec_class``: the compressor id whose codec_bench figures those are."""
    collectives: tuple[tuple[str, int], ...]
    at_wait: int = 0
    dense_tail: bool = False
    codec_elements: int = 0
    codec_class: str = ""

    @property
    def early(self) -> tuple[tuple[str, int], ...]:
        """The collectives issued when the bucket is handed over."""
        return self.collectives[:len(self.collectives) - self.at_wait]

    @property
    def late(self) -> tuple[tuple[str, int], ...]:
        """The collectives issued when the bucket is waited for."""
        return self.collectives[len(self.collectives) - self.at_wait:]


class Pending:
    """A started exchange; ``wait()`` completes it and leaves the average in place.

    ``work`` is a communication handle, a list of them, or None (nothing to wait for and
    nothing to finish)."""

    def __init__(self, work, finish):
        self._work = work
        self._finish = finish

    def wait(self) -> None:
        if self._work is None:
            return
        works = self._work if isinstance(self._work, (list, tuple)) else [self._work]
        for w in works:
            if w is not None:
                w.wait()
        self._work = None
        self._finish()


def tensor_names(key, shapes):
    """Names of the tensors packed in a bucket: ``key``'s entries when it is a tuple of ints
    with one entry per shape, else ``(key, j)``."""
    if shapes is None:
        return [(key, 0)]
    if (isinstance(key, tuple) and len(key) == len(shapes)
            and all(isinstance(k, int) for k in key)):
        return list(key)
    return [(key, j) for j in range(len(shapes))]


def _numel(shape) -> int:
    return math.prod(shape)


class Compressor:
    """One way of exchanging a flat gradient: subclasses declare ``id``, ``Options``,
    ``sends``, ``issues`` and ``declare`` (what goes on the wire), and implement
    ``reduce_async``; ``codec_class`` and ``reference`` when they are not the defaults."""

    id: ClassVar[str] = ""
    Options: ClassVar[type[Options]] = NoOptions
    sends: ClassVar[str] = ""  # what goes on the wire, in a few words
    issues: ClassVar[tuple[str, ...]] = (ALLREDUCE,)  # the collectives ``declare`` may name
    codec_class: ClassVar[str] = ""  # whose codec_bench figures its codec costs ("": its id)
    # ``module:Class`` of its mathematics written again for --verify (``compression.reference``
    # for the built-ins): constructed as (world, dtype=, **every compressor option), with
    # ``aggregate(names, per_rank, shapes) -> (average, bound)``; "": none
    reference: ClassVar[str] = ""
    # why it cannot exchange slices of a flat gradient, waited for on another thread than
    # issued them (ByteScheduler's chunks read it); None: it can
    not_chunked: ClassVar[str | None] = None

    def __init__(self, options: Options | None = None):
        self.options = options if options is not None else self.Options()

    def declare(self, shapes: list[tuple[int, ...]], nworkers: int,
                element_bytes: int) -> Sends:
        """What this compressor, with its options, sends for one bucket of gradients of
        ``shapes`` (``element_bytes`` each) among ``nworkers`` workers, per iteration in the
        steady state (``codec_elements`` and ``codec_class`` may be left out)."""
        raise NotImplementedError

    def sends_for(self, shapes, nworkers: int, element_bytes: int = 4) -> Sends:
        """``declare``'s answer for a bucket, its inputs and its collectives checked, with the
        whole bucket as ``codec_elements`` and the id as ``codec_class`` where not declared."""
        shapes = [tuple(int(d) for d in s) for s in shapes]
        if not shapes:
            raise UsageError("a bucket holds at least one tensor; got no shapes")
        if nworkers < 1:
            raise UsageError(f"nworkers must be positive, got {nworkers}")
        if element_bytes < 1:
            raise UsageError(f"element_bytes must be positive, got {element_bytes}")
        out = self.declare(shapes, nworkers, element_bytes)
        wrong = [op for op, _ in out.collectives if op not in self.issues]
        if wrong or not 0 <= out.at_wait <= len(out.collectives):
            raise TypeError(f"compressor {self.id!r} declares {list(out.collectives)} with "
                            f"{out.at_wait} at the wait; it issues only {self.issues}")
        return replace(out, codec_elements=out.codec_elements or sum(map(_numel, shapes)),
                       codec_class=out.codec_class or self.codec_class or self.id)

    def reduce_async(self, key, tensor, comm, shapes=None) -> Pending:
        """Start exchanging ``tensor`` (flat); ``shapes`` are the shapes of the gradients
        packed in it, in order, for compressors that work per tensor (PowerSGD, EF-signSGD)."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"compressor": self.id, **self.options.as_dict()}

    def encode(self, key, tensor, shapes=None) -> tuple:
        """The tensors to send for ``tensor`` (compressors that all-gather their encoding)."""
        raise NotImplementedError

    def _gather_encoded(self, key, tensor, comm, shapes):
        """Count the dense figure, encode (timed), start all-gathering every encoded tensor;
        returns (the handles, the gathered tensors)."""
        comm.count_dense(tensor.numel())
        with comm.clock("encode_s", tensor) as note:
            encoded = self.encode(key, tensor, shapes)
            note(*encoded)
        return _allgather_each(comm, *encoded)


class NoCompression(Compressor):
    """Dense all-reduce, then divide by the number of workers (the decode time), or an
    averaging all-reduce where the backend has one."""

    id = "none"
    sends = "the gradient in its own dtype, all-reduced"

    def declare(self, shapes, nworkers, element_bytes):
        """The bucket, all-reduced."""
        return Sends(((ALLREDUCE, sum(map(_numel, shapes)) * element_bytes),))

    def reduce_async(self, key, tensor, comm, shapes=None):
        comm.count_dense(tensor.numel())
        average_op = getattr(comm, "average_op", None)  # a stand-in Comm may have none
        average = average_op() if average_op is not None else None
        if average is not None:
            return Pending(comm.allreduce(tensor, op=average), _nothing)
        work = comm.allreduce(tensor)
        size = comm.size

        def finish():
            # Dividing by one worker would cost a pass over every gradient for nothing.
            if size > 1:
                with comm.clock("decode_s", tensor) as note:
                    note(tensor)
                    tensor.div_(size)
        return Pending(work, finish)


class _Cast16(Compressor):
    """g/P cast to a 16-bit float (``wire``, a torch dtype's name), all-reduced (summed) in it,
    cast back into the gradient."""

    wire: ClassVar[str] = ""

    def declare(self, shapes, nworkers, element_bytes):
        """The bucket in 16 bits an element, all-reduced."""
        return Sends(((ALLREDUCE, sum(map(_numel, shapes)) * HALF_BYTES),))

    def reduce_async(self, key, tensor, comm, shapes=None):
        import torch
        comm.count_dense(tensor.numel())
        with comm.clock("encode_s", tensor) as note:
            half = tensor.div(comm.size).to(getattr(torch, self.wire))
            note(half)
        work = comm.allreduce(half)

        def finish():
            with comm.clock("decode_s", tensor) as note:
                note(half)
                tensor.copy_(half)
        return Pending(work, finish)


class FP16(_Cast16):
    """g/P cast to half, all-reduced in half, cast back."""

    id = "fp16"
    sends = "g/P in fp16, all-reduced"
    wire = "float16"


class BF16(_Cast16):
    """g/P cast to bfloat16, all-reduced in bfloat16, cast back."""

    id = "bf16"
    sends = "g/P in bfloat16, all-reduced"
    wire = "bfloat16"


def _nothing() -> None:
    """A ``Pending``'s finish when the collective leaves the result as it is."""


def _allgather_each(comm, *tensors):
    """Start all-gathering each tensor into a new one holding every worker's copy in rank
    order (P times its size); returns (the handles, the gathered tensors)."""
    gathered = [t.new_empty(comm.size * t.numel()) for t in tensors]
    return [comm.allgather(out, t) for out, t in zip(gathered, tensors)], gathered


# -- state that follows the tensors --------------------------------------------------------

class _FlatResidual:
    """One flat residual per bucket, addressable per tensor, so that a tensor's residual moves
    with it into whatever bucket holds it next."""

    def __init__(self):
        self._flat = {}    # key -> flat residual
        self._where = {}   # tensor name -> (key, offset, numel)
        self._named = set()  # keys whose tensors have names

    def get(self, key, tensor, shapes) -> torch.Tensor:
        import torch
        flat = self._flat.get(key)
        if flat is not None and flat.numel() == tensor.numel():
            return flat
        flat = torch.zeros_like(tensor)
        if shapes is not None:
            names = tensor_names(key, shapes)
            offset = 0
            for name, shape in zip(names, shapes):
                n = _numel(shape)
                old = self._where.get(name)
                if old is not None and old[2] == n and old[0] in self._flat:
                    src = self._flat[old[0]]
                    flat[offset:offset + n].copy_(src[old[1]:old[1] + n])
                self._where[name] = (key, offset, n)
                offset += n
            self._named.add(key)
            # Buckets none of whose tensors live there any more are dropped.
            alive = {w[0] for w in self._where.values()}
            for k in [k for k in self._named if k not in alive]:
                self._named.discard(k)
                self._flat.pop(k, None)
        self._flat[key] = flat
        return flat

    def put(self, key, residual: torch.Tensor) -> None:
        self._flat[key] = residual


# -- TopK ----------------------------------------------------------------------------------

def topk_count(n: int, density: float) -> int:
    """k for a bucket of n elements: density * n rounded to the nearest integer, at least 1."""
    return min(n, max(1, round(density * n)))


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int64, ascending) of the k entries of largest magnitude of the flat ``x``;
    among equal magnitudes at the boundary the lower indices win. ``torch.topk`` picks an
    arbitrary subset of tied entries; a tie across the boundary is detected by counting and
    resolved by index, so the chosen set is a function of the values alone."""
    import torch
    a = x.abs()
    if k >= a.numel():
        return torch.arange(a.numel(), device=x.device)
    top, idx = torch.topk(a, k, sorted=False)
    threshold = top.min()
    if int((a == threshold).sum()) != int((top == threshold).sum()):
        above = torch.nonzero(a > threshold).view(-1)
        tied = torch.nonzero(a == threshold).view(-1)[:k - above.numel()]
        idx = torch.cat([above, tied])
    return torch.sort(idx).values


@dataclass(frozen=True)
class TopKOptions(Options):
    density: float = option(0.001, FRACTION, "TopK: fraction of each bucket's elements sent")


class TopK(Compressor):
    """The k largest-magnitude entries of each bucket, all-gathered and scatter-added."""

    id = "topk"
    Options = TopKOptions
    sends = "k = density x n values (gradient dtype) and their int32 indices, all-gathered"
    issues = (ALLGATHER,)
    error_feedback = False

    def __init__(self, options: TopKOptions | None = None):
        super().__init__(options)
        self.density = self.options.density
        self._residual = _FlatResidual()

    def declare(self, shapes, nworkers, element_bytes):
        """k = ``topk_count`` values all-gathered, then their int32 indices."""
        k = topk_count(sum(map(_numel, shapes)), self.density)
        return Sends(((ALLGATHER, nworkers * k * element_bytes),
                      (ALLGATHER, nworkers * k * INDEX_BYTES)))

    def encode(self, key, tensor, shapes=None):
        """(values, int32 indices) of the k largest-magnitude entries of the (corrected)
        gradient; with error feedback the residual becomes what was not sent."""
        import torch
        k = topk_count(tensor.numel(), self.density)
        if self.error_feedback:
            corrected = tensor + self._residual.get(key, tensor, shapes)
        else:
            corrected = tensor
        idx = topk_indices(corrected, k)
        values = corrected.index_select(0, idx)
        if self.error_feedback:
            self._residual.put(key, corrected.index_fill_(0, idx, 0))
        return values, idx.to(torch.int32)

    def reduce_async(self, key, tensor, comm, shapes=None):
        p = comm.size
        works, (all_values, all_indices) = self._gather_encoded(key, tensor, comm, shapes)

        def finish():
            with comm.clock("decode_s", tensor) as note:
                note(all_values, all_indices)
                tensor.zero_()
                tensor.index_add_(0, all_indices.long(), all_values)
                if p > 1:
                    tensor.div_(p)
        return Pending(works, finish)


class EFTopK(TopK):
    """TopK with error feedback: what was not sent is added to the next gradient."""

    id = "eftopk"
    sends = TopK.sends + "; the residual stays local"
    error_feedback = True


# -- signs, 32 per int32 --------------------------------------------------------------------

def sign_words(n: int) -> int:
    """How many int32 words hold the signs of n elements, 32 a word."""
    return (n + 31) // 32


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Bits ``x >= 0`` of the flat ``x``, 32 per int32 word: element 32*w + j is bit j of word
    w (bit 31 is the word's sign bit); the tail of the last word is zero."""
    import torch
    n = x.numel()
    m = sign_words(n)
    bits = torch.zeros(m * 32, dtype=torch.bool, device=x.device)
    torch.ge(x.reshape(-1), 0, out=bits[:n])
    bits = bits.view(m, 32)
    words = torch.zeros(m, dtype=torch.int64, device=x.device)
    for j in range(32):
        words.bitwise_or_(bits[:, j].to(torch.int64).bitwise_left_shift_(j))
    # Unsigned 32-bit value to the int32 with the same bits (two's complement), explicitly.
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.to(torch.int32)


_BYTE_BITS = {}  # (device, dtype, pm1) -> the 256 x 8 table of each byte value's bits


def _unpack(words: torch.Tensor, n: int, dtype, pm1: bool = False) -> torch.Tensor:
    """The n packed elements of ``words`` (int32, flat) as 0/1 in ``dtype`` (``pm1``: as
    -1/+1), through a table of the 256 byte values; the bytes are taken with shifts, so the
    result does not depend on the machine's byte order."""
    import torch
    key = (words.device, dtype, pm1)
    table = _BYTE_BITS.get(key)
    if table is None:
        bits = (torch.arange(256).view(-1, 1) >> torch.arange(8)) & 1
        table = _BYTE_BITS[key] = (bits * 2 - 1 if pm1 else bits).to(words.device, dtype)
    byte_values = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return table.index_select(0, byte_values.view(-1).long()).view(-1)[:n]


def unpack_signs(words: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of ``pack_signs``: n bools (True where the packed element was >= 0)."""
    import torch
    return _unpack(words.reshape(-1), n, torch.bool)


def majority_vote(words: torch.Tensor, n: int) -> torch.Tensor:
    """sign(sum of the votes) from the (P, m) packed words of P workers: float, in
    {-1, 0, +1} (0 where the votes tie)."""
    import torch
    p = words.shape[0]
    count = torch.uint8 if p < 256 else torch.int32  # the same dtype as the table: no casts
    ayes = torch.zeros(n, dtype=count, device=words.device)
    for w in words:
        ayes += _unpack(w, n, count)
    return torch.sign(2 * ayes.to(torch.int32) - p).to(torch.float32)


def average_signs(words: torch.Tensor, n: int) -> torch.Tensor:
    """The mean of the P workers' signs (+1 for a set bit, -1 otherwise) from their (P, m)
    packed words: float, (ayes - noes) / P."""
    import torch
    p = words.shape[0]
    count = torch.uint8 if p < 256 else torch.int32
    ayes = torch.zeros(n, dtype=count, device=words.device)
    for w in words:
        ayes += _unpack(w, n, count)
    return (2 * ayes.to(torch.int32) - p).to(torch.float32) / p


def _segment_sizes(tensor, shapes):
    if shapes is None:
        return [tensor.numel()]
    sizes = [_numel(s) for s in shapes]
    if sum(sizes) != tensor.numel():
        raise ValueError(f"shapes {shapes} do not add up to {tensor.numel()} elements")
    return sizes


class Signum(Compressor):
    """signSGD with majority vote: the sign bits, the sign of their sum."""

    id = "signum"
    sends = "sign bits, 32 per int32 word, all-gathered (majority vote)"
    issues = (ALLGATHER,)

    def declare(self, shapes, nworkers, element_bytes):
        """The sign words, all-gathered."""
        words = sign_words(sum(map(_numel, shapes)))
        return Sends(((ALLGATHER, nworkers * words * WORD_BYTES),))

    def encode(self, key, tensor, shapes=None):
        return (pack_signs(tensor),)

    def reduce_async(self, key, tensor, comm, shapes=None):
        p, n = comm.size, tensor.numel()
        work, (gathered,) = self._gather_encoded(key, tensor, comm, shapes)

        def finish():
            with comm.clock("decode_s", tensor) as note:
                note(gathered)
                tensor.copy_(self._combine(gathered.view(p, -1), n))
        return Pending(work, finish)

    @staticmethod
    def _combine(words, n: int):
        """Every worker's packed signs (one row each) into the result: the majority."""
        return majority_vote(words, n)


class SignAverage(Signum):
    """signSGD as the original's: the sign bits, their mean over the workers."""

    id = "signavg"
    sends = "sign bits, 32 per int32 word, all-gathered (the signs averaged, the original's)"

    @staticmethod
    def _combine(words, n: int):
        """The mean of the workers' signs, (ayes - noes) / P."""
        return average_signs(words, n)


class EFSignum(SignAverage):
    """The original's EFSignCompressor: the unscaled signs of the error-corrected gradient,
    averaged over the workers; the residual c - sign(c)."""

    id = "efsignum"
    sends = ("sign bits of the gradient plus residual, 32 per int32 word, all-gathered "
             "(unscaled, averaged: the original's); the residual stays local")

    def __init__(self, options: NoOptions | None = None):
        super().__init__(options)
        self._residual = _FlatResidual()

    def encode(self, key, tensor, shapes=None):
        """The packed sign words of c = g + residual; the residual becomes c - sign(c)."""
        corrected = tensor + self._residual.get(key, tensor, shapes)
        words = pack_signs(corrected)
        corrected.sub_(corrected.sign())  # the original's: torch.sign, 0 where c is 0
        self._residual.put(key, corrected)
        return (words,)


class EFSignumScaled(Compressor):
    """EF-signSGD: scaled signs of the error-corrected gradient, averaged over workers."""

    id = "efsignum_scaled"
    sends = "sign bits and one scale per tensor, all-gathered; the residual stays local"
    issues = (ALLGATHER,)

    def declare(self, shapes, nworkers, element_bytes):
        """The sign words all-gathered, then one scale (``element_bytes``) per tensor."""
        words = sign_words(sum(map(_numel, shapes)))
        return Sends(((ALLGATHER, nworkers * words * WORD_BYTES),
                      (ALLGATHER, nworkers * len(shapes) * element_bytes)))

    def __init__(self, options: NoOptions | None = None):
        super().__init__(options)
        self._residual = _FlatResidual()

    def encode(self, key, tensor, shapes=None):
        """(packed sign words, one scale per tensor of the bucket); the residual becomes
        c - scale * sign(c)."""
        import torch
        sizes = _segment_sizes(tensor, shapes)
        corrected = tensor + self._residual.get(key, tensor, shapes)
        # mean |c| per tensor, summed in float64 (reproducible to the last fp32 bit whatever
        # the order of the sum), rounded to the gradient's dtype: that is what is sent.
        magnitudes = corrected.abs()
        sums = torch.stack([part.sum(dtype=torch.float64) for part in magnitudes.split(sizes)])
        scales = (sums / torch.tensor(sizes, dtype=torch.float64, device=sums.device)) \
            .to(tensor.dtype)
        words = pack_signs(corrected)
        signs = torch.where(corrected >= 0, 1.0, -1.0).to(tensor.dtype)
        for part, sign, scale in zip(corrected.split(sizes), signs.split(sizes), scales.tolist()):
            part.sub_(sign, alpha=scale)  # residual = c - scale * sign(c)
        self._residual.put(key, corrected)
        return words, scales

    def reduce_async(self, key, tensor, comm, shapes=None):
        p, n = comm.size, tensor.numel()
        sizes = _segment_sizes(tensor, shapes)
        works, (all_words, all_scales) = self._gather_encoded(key, tensor, comm, shapes)

        def finish():
            with comm.clock("decode_s", tensor) as note:
                note(all_words, all_scales)
                tensor.zero_()
                scales_by_worker = all_scales.view(p, -1).tolist()  # one copy to the host
                for w, scales in zip(all_words.view(p, -1), scales_by_worker):
                    signs = _unpack(w, n, tensor.dtype, pm1=True)
                    for out, part, scale in zip(tensor.split(sizes), signs.split(sizes), scales):
                        out.add_(part, alpha=scale)
                if p > 1:
                    tensor.div_(p)
        return Pending(works, finish)


# -- PowerSGD --------------------------------------------------------------------------------

def orthonormalize_columns(p: torch.Tensor, drop: float = 1e-4) -> None:
    """Modified Gram-Schmidt on the columns of ``p`` (n x r), in place, computed in float64:
    the columns are as long as the matrix has rows (30522 for BERT's embeddings) and fp32 norms
    and dot products over that many terms lose ~1e-5 relative, which Gram-Schmidt amplifies; at
    n x r elements it costs little next to the products M Q and M^T P. A column left with less
    than ``drop`` of its own norm after removing the earlier directions (a matrix of rank below
    r) is set to zero instead of normalising rounding noise into an arbitrary direction: it
    then contributes nothing."""
    import torch
    m = p.to(torch.float64)
    norms = torch.linalg.vector_norm(m, dim=0)
    for i in range(m.shape[1]):
        col = m[:, i:i + 1]
        left = torch.linalg.vector_norm(col)
        col.mul_(torch.where(left > drop * norms[i], 1.0 / left.clamp_min(1e-30), 0.0))
        if i + 1 < m.shape[1]:
            rest = m[:, i + 1:]
            rest.sub_(col @ (col.t() @ rest))
    p.copy_(m)


def powersgd_plan(shape, rank: int):
    """(rows, cols, r) when a gradient of this shape is sent as rank-r factors, else None."""
    if len(shape) < 2:
        return None
    rows = shape[0]
    cols = _numel(shape) // rows if rows else 0
    r = min(rank, rows, cols)
    if r <= 0 or r * (rows + cols) >= rows * cols:
        return None
    return rows, cols, r


def powersgd_seed(name) -> int:
    """The seed of tensor ``name``'s initial Q: the same on every worker."""
    return POWERSGD_SEED + zlib.crc32(repr(name).encode())


@dataclass(frozen=True)
class PowerSGDOptions(Options):
    powersgd_rank: int = option(4, COUNT, "PowerSGD rank")
    powersgd_dense_steps: int = option(
        0, COUNT0, "PowerSGD: all-reduce dense for the first N steps (DDP's hook: 1000; here "
        "compression starts at the first step)", metavar="N")


class PowerSGD(Compressor):
    """Rank-r factors of each matrix, with error feedback and a warm-started Q."""

    id = "powersgd"
    Options = PowerSGDOptions
    sends = ("rank-r factors P and Q of each matrix, all-reduced one after the other; "
             "vectors dense")
    not_chunked = ("PowerSGD factorises whole matrices with a second all-reduce while "
                   "waiting")

    def __init__(self, options: PowerSGDOptions | None = None):
        super().__init__(options)
        self.rank = self.options.powersgd_rank
        self.dense_steps = self.options.powersgd_dense_steps
        self._q = {}       # tensor name -> Q (cols x r), shared by all workers
        self._error = {}   # tensor name -> error-feedback residual (rows x cols)
        self._calls = defaultdict(int)

    def describe(self) -> dict:
        return {**super().describe(), "powersgd_error_feedback": True,
                "powersgd_warm_start": True}

    def declare(self, shapes, nworkers, element_bytes):
        """Every tensor with a plan (``powersgd_plan``) puts its P factor (rows x r) into one
        all-reduce; the others go dense in one all-reduce after it (the dense tail); the Q
        factors (cols x r) follow in one all-reduce issued when the bucket is waited for (it
        needs the reduced P). The dense warm-up steps are not declared (steady state)."""
        plans = [powersgd_plan(shape, self.rank) for shape in shapes]
        low = [plan for plan in plans if plan is not None]
        dense = [_numel(shape) for shape, plan in zip(shapes, plans) if plan is None]
        out = []
        if low:
            out.append((ALLREDUCE, sum(rows * r for rows, _, r in low) * element_bytes))
        if dense:
            out.append((ALLREDUCE, sum(dense) * element_bytes))
        if low:
            out.append((ALLREDUCE, sum(cols * r for _, cols, r in low) * element_bytes))
        return Sends(tuple(out), at_wait=int(bool(low)), dense_tail=bool(dense))

    def _initial_q(self, name, cols, r, like):
        import torch
        gen = torch.Generator().manual_seed(powersgd_seed(name))
        return torch.randn(cols, r, generator=gen, dtype=torch.float32).to(like)

    def reduce_async(self, key, tensor, comm, shapes=None):
        import torch
        p = comm.size
        comm.count_dense(tensor.numel())
        shapes = [tuple(tensor.shape)] if shapes is None else [tuple(s) for s in shapes]
        sizes = _segment_sizes(tensor, shapes)
        names = tensor_names(key, shapes)
        with comm.clock("encode_s", tensor) as note:
            segments = tensor.split(sizes)
            low, dense = [], []   # (name, segment, M, Q, P) / segment
            for name, shape, seg in zip(names, shapes, segments):
                plan = powersgd_plan(shape, self.rank)
                self._calls[name] += 1
                if plan is None or self._calls[name] <= self.dense_steps:
                    dense.append(seg)
                    continue
                rows, cols, r = plan
                m = seg.view(rows, cols)
                err = self._error.get(name)
                m = m + err if err is not None and err.shape == m.shape else m.clone()
                q = self._q.get(name)
                if q is None or q.shape != (cols, r):
                    q = self._initial_q(name, cols, r, tensor)
                low.append([name, seg, m, q, None])
            p_buf = tensor.new_empty(sum(item[2].shape[0] * item[3].shape[1] for item in low))
            offset = 0
            for item in low:
                m, q = item[2], item[3]
                n = m.shape[0] * q.shape[1]
                item[4] = p_buf[offset:offset + n].view(m.shape[0], q.shape[1])
                torch.matmul(m, q, out=item[4])
                offset += n
            dense_buf = torch.cat(dense) if dense else None
            note(*(b for b in (p_buf, dense_buf) if b is not None))
        works = []
        if low:
            works.append(comm.allreduce(p_buf))
        if dense_buf is not None:
            works.append(comm.allreduce(dense_buf))

        def finish():
            import torch
            q_buf = None
            if low:
                with comm.clock("encode_s", tensor, at_wait=True) as note:
                    q_buf = tensor.new_empty(sum(item[3].numel() for item in low))
                    offset = 0
                    for item in low:
                        m, q, pm = item[2], item[3], item[4]
                        orthonormalize_columns(pm)
                        item[3] = q_buf[offset:offset + q.numel()].view_as(q)
                        torch.matmul(m.t(), pm, out=item[3])
                        offset += q.numel()
                    note(q_buf)
                comm.allreduce(q_buf).wait()
            with comm.clock("decode_s", tensor) as note:
                note(*(b for b in (p_buf if low else None, q_buf, dense_buf) if b is not None))
                if q_buf is not None and p > 1:
                    q_buf.div_(p)
                for name, seg, m, q, pm in low:
                    approx = seg.view_as(m)
                    torch.matmul(pm, q.t(), out=approx)
                    self._error[name] = m.sub_(approx)
                    self._q[name] = q
                if dense_buf is not None:
                    if p > 1:
                        dense_buf.div_(p)
                    from ddlbench.compat import copy_all
                    copy_all(dense, dense_buf.split([seg.numel() for seg in dense]))
        return Pending(works or [None], finish)


BUILTIN: dict[str, type[Compressor]] = {
    cls.id: cls for cls in (NoCompression, FP16, TopK, EFTopK, Signum, SignAverage, EFSignum,
                            EFSignumScaled, PowerSGD, BF16)}
# the built-ins' mathematics written again (--verify)
BUILTIN_REFERENCE = "compression.reference:ReferenceMath"


def _discover() -> dict[str, type[Compressor]]:
    """The built-in compressors, then every public ``Compressor`` subclass with an id of its
    own defined in a module named by ``DDLBENCH_COMPRESSORS``."""
    found = dict(BUILTIN)
    for name in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            module = importlib.import_module(name)
        except Exception as e:  # ImportError, or the module's own error
            raise UsageError(f"{PLUGINS_ENV}: cannot import {name!r}: "
                             f"{type(e).__name__}: {e}") from None
        for obj in vars(module).values():
            if not (isinstance(obj, type) and issubclass(obj, Compressor)
                    and obj.__module__ == module.__name__ and not obj.__name__.startswith("_")
                    and obj.__dict__.get("id")):
                continue
            if obj.id in found and found[obj.id] is not obj:
                raise UsageError(f"{PLUGINS_ENV}: compressor id {obj.id!r} is declared twice: "
                                 f"by {found[obj.id].__module__} and {obj.__module__}")
            found[obj.id] = obj
    return found


class _Registry(Mapping):
    """id -> class of every compressor, built-in and plugin, found when first read (a plugin
    module imports this package, so it cannot be imported while this package loads)."""

    def __init__(self):
        self._found = None

    def _all(self) -> dict[str, type[Compressor]]:
        if self._found is None:
            self._found = _discover()
        return self._found

    def __getitem__(self, name):
        return self._all()[name]

    def __iter__(self):
        return iter(self._all())

    def __len__(self):
        return len(self._all())


COMPRESSORS: Mapping[str, type[Compressor]] = _Registry()


def option_owners() -> dict:
    """Every compressor option by name: its declaration and (compressor id, default) of each
    compressor declaring it."""
    return collect((cid, cls.Options) for cid, cls in COMPRESSORS.items())


def specs() -> list:
    """Every compressor option, once."""
    return [spec for spec, _ in option_owners().values()]


def table() -> str:
    """The compressors as a Markdown table (id, options and defaults, what each sends)."""
    rows = ["| id | options (default) | sends |", "| --- | --- | --- |"]
    for cid, cls in COMPRESSORS.items():
        opts = ", ".join(f"`{s.flag}` ({s.format(s.default)})" for s in cls.Options.specs())
        rows.append(f"| `{cid}` | {opts or '-'} | {cls.sends} |")
    return "\n".join(rows)


def lookup(name: str) -> type[Compressor]:
    """The class of compressor ``name`` (a built-in without importing the plugins)."""
    if name in BUILTIN:
        return BUILTIN[name]
    if name not in COMPRESSORS:
        raise UsageError(f"unknown compressor {name!r}; known: {', '.join(COMPRESSORS)}")
    return COMPRESSORS[name]


def check_options(name: str, **values) -> None:
    """A clear line for an unknown compressor or a bad value of any compressor option."""
    lookup(name)
    known = {spec.name: spec for spec in specs()}
    for key, value in values.items():
        if key not in known:
            raise TypeError(f"no compressor option {key!r}")
        problem = known[key].problem(value)
        if problem:
            raise UsageError(problem)


def reference_of(name: str) -> str:
    """``module:Class`` of compressor ``name``'s reference mathematics (``reference``; the
    built-ins': ``compression.reference.ReferenceMath``); a clear line when it declares none."""
    cls = lookup(name)
    if cls.reference:
        return cls.reference
    if name in BUILTIN:
        return BUILTIN_REFERENCE
    raise UsageError(f"compressor {name!r} declares no reference mathematics (its "
                     f"'reference'): --verify cannot check it")


def declared(name: str, options=None) -> Compressor:
    """Compressor ``name`` with ``options`` (its ``Options``, a mapping of option values, or
    None: its defaults), for its declaration (``sends_for``): nothing is allocated."""
    cls = lookup(name)
    if options is None or isinstance(options, Mapping):
        options = cls.Options.resolve(options or {})
    return cls(options)


def create(name: str, **values) -> Compressor:
    """The compressor ``name`` with its options taken from ``values`` (option name -> value,
    None or missing: the default); every given option is checked, those of other compressors
    are ignored."""
    check_options(name, **values)
    cls = COMPRESSORS[name]
    return cls(cls.Options.resolve(values))
