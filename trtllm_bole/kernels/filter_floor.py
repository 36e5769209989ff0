"""The top-k / top-p threshold of rows of logits without sorting them: a radix select per row.

The torch reference (:func:`trtllm_bole.reference.sampling.filter_floor`) sorts every row, which at a
real vocabulary was most of a sampled step's acceptance (151,936 tokens, a verify's 2,048 rows: 32 ms on
the H200, benchmarks/results/filter_floor_h200.json). The threshold is one logit a row. A float32 maps
to an int32 key in the same order (negative floats flip their other 31 bits), and a search by 4-bit
digits of the key, high digits first, counts the keys under the digits chosen so far by their next
digit, and goes on in the digit that holds what it seeks:

- top-k: the k-th largest key, by counts (``tl.histogram``): the digit where the count at or above it
  reaches the rank still sought;
- top-p: among the top-k keys, the last key the sorted walk keeps, by the mass ``exp((x - max) / t)``
  of each digit (a one-hot sum): the highest digit where the mass at or above it reaches ``top_p`` of the
  top-k mass (the mass before its first key is below ``top_p``).

One program a row, as wide as the rows leave it (:data:`SHAPES`). Eight passes over a row of 151,936 logits
for each key cost more than the sort (measured: ``filter_floor_h200_first_shape.json``), so the program first
narrows the search to a window of ``max - x`` that holds the key, a pass a level (16 windows of 1 nat, then
1/16 and 1/256 of one), until the window holds at most :data:`CAP` keys; it copies those to its scratch row
and runs the eight digit passes there. Top-k copies the keys above its window too when they fit (fewer than
k), so that top-p after it searches that copy without reading the row again (else it copies the top-k keys: at
most k and its ties, no window). A window that ties keep wider than ``CAP`` at the last level is searched in
the row.

Dividing by a positive temperature keeps the order of the logits, so the search runs on the logits as
they are (no ``[N, V]`` temporary, no division a logit) and divides the key it finds, rounded as torch
divides: the k-th largest of ``x / t`` is the k-th largest ``x`` divided. Rounding may tie a few ``x``
below the top-k floor with it after the division; top-p after top-k takes them in (the least ``x`` that
divides to the floor, by bisection of the keys).

The masses are float32 sums of ``exp((x - max) * (1 / t))`` in another order than the reference's
cumulative sum of its softmax, so a row whose mass
before its boundary token is within rounding of ``top_p`` may keep one value more or less than the
reference (:func:`trtllm_bole.testing.floor_agreement` bounds it); every other row gets the reference's
floor bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

INT32_MIN = tl.constexpr(-2147483648)
INT32_MAX = tl.constexpr(2147483647)
BLOCK = 512
NUM_WARPS = 4
SHAPES = ((2048, 16), (1024, 8), (BLOCK, NUM_WARPS))
"""(block, warps) of a program by how many share its SM (one, two, more): one program a row, so with few
rows a pass is a chain of dependent steps, and wider steps take fewer of them. H200, 151,936 logits, top-p
0.9 (benchmarks/results/filter_floor_h200.json's sweep): 64 rows 0.81 -> 0.43 ms, 4 rows 0.75 -> 0.40,
256 rows (1,024 at 8 warps) 1.06 -> 0.74; from 512 rows ``BLOCK`` at ``NUM_WARPS`` is the fastest with top-p
alone (with top-k before it 1,024 at 8 warps was 5% faster at 512 rows)."""
CAP = 4096
"""Most keys a window may hold to be copied out and searched there (a row's scratch: 16 KB)."""
LEVELS = tl.constexpr(3)
"""Window levels: 1, 1/16 and 1/256 nats of ``(max - x) / t``."""


@triton.jit
def _ordered(bits):
    """int32 keys in the order of the float32s whose bits they are (applied to a key: the bits back)."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _key_block(src, start, n, BLOCK: tl.constexpr):
    """``src[start:][:BLOCK]`` in float32, their keys, which are inside."""
    offs = start + tl.arange(0, BLOCK)
    inside = offs < n
    x = tl.load(src + offs, mask=inside, other=float("-inf")).to(tl.float32)
    x += 0.0  # -0.0 and 0.0 tie as in the sort
    return x, _ordered(x.to(tl.int32, bitcast=True)), inside


@triton.jit
def _divided(key, t):
    """The value of ``key`` divided by ``t``, rounded as torch divides."""
    return tl.math.div_rn(_ordered(key).to(tl.float32, bitcast=True), t)


@triton.jit
def _least_tied(key, t):
    """The least key whose value divided by ``t`` rounds to ``key``'s (``key`` unless the division ties
    smaller values with it): bisection of the keys, on which that quotient never decreases."""
    goal = _divided(key, t)
    lo = tl.full([], INT32_MIN, tl.int64)
    hi = key.to(tl.int64)
    if _divided(key - 1, t) >= goal:
        for _ in range(32):
            mid = (lo + hi) >> 1
            tied = _divided(mid.to(tl.int32), t) >= goal
            hi = tl.where(tied, mid, hi)
            lo = tl.where(tied, lo, mid + 1)
    return hi.to(tl.int32)


@triton.jit
def _window_index(x, mx, inv_t, scale):
    """``floor((mx - x) / t scale)``, the tail from ``16 scale - 1`` on in one: at ``scale = 16^(L-1)`` the
    index of x's window of level L (``16^L`` windows of ``16^(1-L)`` nats), whose index at level L - 1 is
    this one's ``>> 4`` (scaling by 16 is exact)."""
    return tl.minimum((mx - x) * inv_t * scale, 16.0 * scale - 1.0).to(tl.int32)


@triton.jit
def _row_max(src, n, BLOCK: tl.constexpr):
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        x, _, _ = _key_block(src, start, n, BLOCK)
        best = tl.maximum(best, x)
    return tl.max(best, axis=0)


@triton.jit
def _histograms(src, n, inv_t, least, mx, scale, window, prefix, known, shift, COARSE: tl.constexpr,
                WINDOWED: tl.constexpr, MASS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """How many of the keys ``>= least`` in ``src[:n]`` fall on each of 16 digits, and (``MASS``) their
    ``exp((x - mx) / t)``. ``COARSE``: the digits are the sub-windows of the window ``window`` at ``scale``
    (higher x, higher digit); else the 4 key bits at ``shift`` under the bits ``known`` to be ``prefix``,
    of the keys in the window (``WINDOWED``: ``window`` at ``scale``) or of all."""
    counts = tl.zeros([16], tl.int32)
    mass = tl.zeros([16, BLOCK], tl.float32)  # digits first: a lane's logits are its columns, not copied
    digits = tl.arange(0, 16)
    for start in range(0, n, BLOCK):
        x, key, member = _key_block(src, start, n, BLOCK)
        member &= key >= least
        if WINDOWED:
            index = _window_index(x, mx, inv_t, scale)
            if COARSE:
                member &= (index >> 4) == window
                digit = 15 - (index & 15)
            else:
                member &= index == window
        if not COARSE:
            unsigned = key ^ INT32_MIN
            member &= (unsigned & known) == prefix
            digit = (unsigned >> shift) & 15
        counts += tl.histogram(digit, 16, mask=member)
        if MASS:  # noqa: SIM102 (a constexpr: resolved when the kernel compiles, the test below at run time)
            if tl.max(member.to(tl.int32), axis=0) > 0:  # past the high digits most blocks hold none
                e = tl.where(member, tl.exp((x - mx) * inv_t), 0.0)
                mass += tl.where(digits[:, None] == digit[None, :], e[None, :], 0.0)
    return counts.to(tl.float32), tl.sum(mass, axis=1)


@triton.jit
def _at_or_above(values):
    """``[16]``: the sum of ``values`` over the digits at or above each digit."""
    digits = tl.arange(0, 16)
    return tl.sum(tl.where(digits[None, :] >= digits[:, None], values[None, :], 0.0), axis=1)


@triton.jit
def _select(counts, mass, carried, target, MASS: tl.constexpr):
    """The digit the search goes on in, its count and what the search carries there. Top-k (``carried``:
    the rank still sought, float): the digit holding the rank-th largest of the counted keys. Top-p
    (``carried``: the mass of the keys above the digits counted): the highest digit at which the mass at
    or above it reaches ``target`` (``-p`` until known: then ``p`` of the first count's mass, which counts
    every key), else (rounding) the lowest digit holding keys; ``carried`` adds the digits above it."""
    digits = tl.arange(0, 16)
    if MASS:
        target = tl.where(target < 0, -target * tl.sum(mass, axis=0), target)
        reached = ((carried + _at_or_above(mass)) >= target) & (counts > 0)
        digit = tl.max(tl.where(reached, digits, -1), axis=0)
        digit = tl.where(digit >= 0, digit, tl.min(tl.where(counts > 0, digits, 16), axis=0))
        carried += tl.sum(tl.where(digits > digit, mass, 0.0), axis=0)
    else:
        digit = tl.max(tl.where(_at_or_above(counts) >= carried, digits, -1), axis=0)
        carried -= tl.sum(tl.where(digits > digit, counts, 0.0), axis=0)
    return digit, tl.sum(tl.where(digits == digit, counts, 0.0), axis=0), carried, target


@triton.jit
def _radix(src, n, inv_t, least, mx, scale, window, carried, target, WINDOWED: tl.constexpr,
           MASS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """The key sought among the keys ``>= least`` of ``src[:n]`` (``WINDOWED``: in the window), 4 bits a
    pass; how many keys hold it, and what the search carried to it."""
    prefix = tl.zeros([], tl.int32)
    known = tl.zeros([], tl.int32)
    count = tl.zeros([], tl.float32)
    for i in range(8):
        shift = 28 - 4 * i
        counts, mass = _histograms(src, n, inv_t, least, mx, scale, window, prefix, known, shift, False,
                                   WINDOWED, MASS, BLOCK)  # fmt: skip
        digit, count, carried, target = _select(counts, mass, carried, target, MASS)
        prefix |= digit << shift
        known |= 15 << shift
    return prefix ^ INT32_MIN, count, carried


@triton.jit
def _compact(src, n, inv_t, least, mx, scale, window, above, out, BLOCK: tl.constexpr):
    """Copies the values of ``src[:n]`` whose keys are ``>= least`` and that the window ``window`` at
    ``scale`` holds (``above``: or a window above it; at ``1 / 16`` every key is in window 0) to ``out``,
    in row order. Returns the least key it copied."""
    base = tl.zeros([], tl.int32)
    lowest = tl.full([], INT32_MAX, tl.int32)
    for start in range(0, n, BLOCK):
        x, key, member = _key_block(src, start, n, BLOCK)
        index = _window_index(x, mx, inv_t, scale)
        member &= (key >= least) & tl.where(above, index <= window, index == window)
        taken = member.to(tl.int32)
        tl.store(out + base + tl.cumsum(taken, axis=0) - 1, x, mask=member)
        base += tl.sum(taken, axis=0)
        lowest = tl.minimum(lowest, tl.min(tl.where(member, key, INT32_MAX), axis=0))
    return lowest


@triton.jit
def _find(row, n, inv_t, least, size, mx, goal, scratch, MASS: tl.constexpr, BLOCK: tl.constexpr,
          CAP: tl.constexpr):  # fmt: skip
    """The key of the ``goal``-th largest (top-k) or of the nucleus's last token (top-p, ``goal`` its
    mass) among the ``size`` keys ``>= least``: while more than ``CAP`` keys are left, narrowed to a window
    of ``max - x`` (a pass over the row a level), then copied to ``scratch`` and searched there; a window
    that ties keep wider than that is searched in the row. Top-k copies the keys above its window too
    when they fit (fewer than k), so that top-p after it can search the scratch. Returns the key, how
    many keys it keeps (top-k), how many it copied and, if it copied every key above them, the least of
    them (else ``INT32_MAX``)."""
    carried = tl.where(MASS, 0.0, goal)
    target = -goal
    window = tl.zeros([], tl.int32)
    scale = tl.full([], 0.0625, tl.float32)  # every key's window index is 0 at 1 / 16
    count = size
    level = 0
    while (level < LEVELS) & (count > CAP):
        scale *= 16.0  # exact: 1, 16, 256
        counts, mass = _histograms(row, n, inv_t, least, mx, scale, window, 0, 0, 0, True, True, MASS, BLOCK)
        digit, count, carried, target = _select(counts, mass, carried, target, MASS)
        window = 16 * window + 15 - digit
        level += 1
    copied = tl.zeros([], tl.int32)
    lowest = tl.full([], INT32_MAX, tl.int32)
    if n <= CAP:
        key, ties, carried = _radix(row, n, inv_t, least, mx, scale, window, carried, target, False, MASS,
                                    BLOCK)  # fmt: skip
    elif count <= CAP:
        above = False if MASS else goal - carried + count <= CAP  # the keys above the window fit too
        if above:
            count += goal - carried
            carried = goal
        copy_least = _compact(row, n, inv_t, least, mx, scale, window, above, scratch, BLOCK)
        lowest = tl.where(above, copy_least, lowest)  # below the window's keys, the scratch holds all
        copied = count.to(tl.int32)
        key, ties, carried = _radix(scratch, copied, inv_t, least, mx, scale, window, carried, target, False,
                                    MASS, BLOCK)  # fmt: skip
    else:
        key, ties, carried = _radix(row, n, inv_t, least, mx, scale, window, carried, target, True, MASS,
                                    BLOCK)  # fmt: skip
    return key, goal - carried + ties, copied, lowest


@triton.jit
def _top_p_after_top_k(row, n, t, inv_t, least, size, mx, p, scratch, copied, lowest, BLOCK: tl.constexpr,
                       CAP: tl.constexpr):  # fmt: skip
    """Top-p's key among the keys the top-k floor ``least`` keeps, with the smaller logits that the
    division ties with it: in the scratch when top-k copied every one of them there, else in the row
    (counting them first if the division tied any)."""
    tied = _least_tied(least, t)
    # (the names unused below differ between the branches: Triton gives a name one type across an if)
    if tied >= lowest:
        none = tl.zeros([], tl.float32)  # mass above the keys searched
        key, _ties, _carried = _radix(scratch, copied, inv_t, tied, mx, 1.0, 0, none, -p, False, True, BLOCK)
    else:
        if tied < least:
            counts, _mass = _histograms(row, n, inv_t, tied, mx, 0.0, 0, 0, 0, 0, False, False, False, BLOCK)
            size = tl.sum(counts, axis=0)
        key, _kept, _copied, _lowest = _find(row, n, inv_t, tied, size, mx, p, scratch, True, BLOCK, CAP)
    return key


@triton.jit(do_not_specialize=["n", "row_stride"])
def _filter_floor_kernel(logits, temperature, top_k, top_p, floor, scratch, n, row_stride,
                         BLOCK: tl.constexpr, CAP: tl.constexpr):  # fmt: skip
    request = tl.program_id(0).to(tl.int64)
    row = logits + request * row_stride
    t = tl.load(temperature + request).to(tl.float32)
    inv_t = 1.0 / t
    own = scratch + request * CAP
    k = tl.load(top_k + request).to(tl.int32)
    p = tl.load(top_p + request).to(tl.float32)
    least = tl.full([], INT32_MIN, tl.int32)  # the floor's key; every key while neither filters
    top_k_filters = (k > 0) & (k < n)
    filters = top_k_filters | (p < 1)
    if filters:
        mx = _row_max(row, n, BLOCK)
        size = n.to(tl.float32)
        if top_k_filters:
            least, size, copied, lowest = _find(row, n, inv_t, least, size, mx, k.to(tl.float32), own, False,
                                                BLOCK, CAP)  # fmt: skip
            if p < 1:
                least = _top_p_after_top_k(row, n, t, inv_t, least, size, mx, p, own, copied, lowest, BLOCK,
                                           CAP)  # fmt: skip
        elif p < 1:
            least, _, _, _ = _find(row, n, inv_t, least, size, mx, p, own, True, BLOCK, CAP)
    tl.store(floor + request, tl.where(filters, _divided(least, t), float("-inf")))


def launch_shape(rows: int, sms: int) -> tuple[int, int]:
    """(block, warps) for ``rows`` programs on ``sms`` SMs (:data:`SHAPES`); ``(BLOCK, NUM_WARPS)`` where
    the SMs are unknown (``sms`` 0: the interpreter)."""
    sharing = -(-rows // sms) if sms else len(SHAPES)
    return SHAPES[min(max(sharing, 1), len(SHAPES)) - 1]


def filter_floor(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    *,
    cap: int = CAP,
    shape: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The smallest logit that top-k and top-p keep in each row of ``logits [N, V] / temperature [N]``
    (logits of any float dtype; ``top_k``, ``top_p`` ``[N]``). Returns ``[N]`` float32 (float64 storage for
    float64 logits: computed in float32), ``-inf`` where neither filters (the reference's contract).
    ``cap``: :data:`CAP` (tests lower it to reach every path on small rows); ``shape``: (block, warps), by
    default :func:`launch_shape`'s on a GPU and ``(BLOCK, NUM_WARPS)`` in the interpreter."""
    rows, vocab = logits.shape
    # The kernel reads a row at unit stride and the settings flat (a column of a settings table read
    # its neighbours' values).
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    temperature, top_p = temperature.contiguous(), top_p.contiguous()
    top_k = top_k.clamp(0, vocab)  # read as int32 by the kernel: ±2**32 + 5 were top-5, not off
    floor = torch.empty(rows, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    scratch = torch.empty((rows, cap) if vocab > cap else (1,), dtype=torch.float32, device=logits.device)
    if shape is None:
        sms = torch.cuda.get_device_properties(logits.device).multi_processor_count if logits.is_cuda else 0
        shape = launch_shape(rows, sms)
    block, warps = shape
    if rows:
        _filter_floor_kernel[(rows,)](
            logits, temperature, top_k, top_p, floor, scratch, vocab, logits.stride(0), BLOCK=block, CAP=cap,
            num_warps=warps,
        )  # fmt: skip
    return floor
