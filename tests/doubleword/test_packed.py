"""Packed words (mlx_precise.doubleword.fusion.note_packed): dw_fused, dw_reduce and
dw_gemm write a result's two words as one array, and read the packed output of
another launch as one input. On emulate the values read packed have exactly the
bits of the same words read as two arrays, and the oracle's value (numpy
longdouble, exact float64 sums of the words) to the chain's bound; on the metal
path (lazy stand-in) a consumer reads the producer's packed output itself, with
no slice of it in between."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.doubleword import fusion
from mlx_precise.extended import low_word
from mlx_precise.testing import graph_counts, lazy_metal_executor

_PACKED = fusion.packed


def _f32(seed, shape, scale=1.0):
    rng = np.random.default_rng(seed)
    return mx.array((rng.standard_normal(shape) * scale).astype(np.float32))


def _value(y) -> np.ndarray:
    """hi + lo of a flow result in float64 / complex128 (exact for normalised words)."""
    wide = np.complex128 if y.dtype == mx.complex64 else np.float64
    lo = low_word(y)
    return np.array(y).astype(wide) + (0.0 if lo is None else np.array(lo).astype(wide))


def _bits(y):
    return np.array(y).view(np.uint32), np.array(low_word(y)).view(np.uint32)


def _both(fn, monkeypatch, *args):
    """fn(*args) in a strict block on emulate with packed reads, then with every
    packed output read as two arrays (fusion.packed finds none): the result's bits
    each time, and how many launches read packed words. Every op of fn is extended
    (the report names none in float32; strict=True raises for a drop)."""
    reads = []
    found = fusion.packed

    def counting(hi, lo):
        z = found(hi, lo)
        reads.append(z is not None)
        return z

    out = []
    for packed_on in (True, False):
        monkeypatch.setattr(fusion, "packed", counting if packed_on else lambda h, l: None)
        with mp.use_backend("emulate"), mp.extended_precision(strict=True) as rep:
            y = fn(*args)
            out.append((_bits(y), _value(y)))
        assert not rep.float32 and sum(rep.extended.values()) > 0, rep
    return out, sum(reads)


def _same_bits(out):
    (bits_p, _), (bits_s, _) = out
    for a, b in zip(bits_p, bits_s):
        np.testing.assert_array_equal(a, b)


def test_a_reduction_read_packed(monkeypatch):
    """x / sum(x * 1.5, -1): the sums (dw_reduce, 16 rows) are read packed by the
    quotient's program, broadcast along the last axis: the bits of the two-array
    read; the value the oracle's to 2^-44."""
    x = _f32(1, (16, 12)) + 3.0
    out, reads = _both(lambda a: a / mx.sum(a * 1.5, axis=-1, keepdims=True), monkeypatch, x)
    assert reads >= 1
    _same_bits(out)
    x64 = np.array(x).astype(np.longdouble)
    ref = x64 / (x64 * 1.5).sum(axis=-1, keepdims=True)
    got = out[0][1]
    assert np.all(np.abs(got - ref) <= 2.0**-44 * np.abs(ref))


def test_a_matmul_reads_and_writes_packed(monkeypatch):
    """exp(x / 3) @ (w * 1.25), then tanh of the product: the GEMM reads both
    programs' packed outputs, tanh's program the GEMM's: the bits of the two-array
    reads, and the value the oracle's (float64 exp / tanh of the exact operands:
    the chain's error is far below float64's 2^-53 relative)."""
    x, w = _f32(2, (4, 40, 24)), _f32(3, (24, 16))
    out, reads = _both(lambda a, b: mx.tanh(mx.exp(a / 3) @ (b * 1.25)), monkeypatch, x, w)
    assert reads >= 3
    _same_bits(out)
    a64 = np.exp(np.array(x).astype(np.float64) / 3)
    ref = np.tanh(a64 @ (np.array(w).astype(np.float64) * 1.25))
    assert np.max(np.abs(out[0][1] - ref)) <= 2.0**-40


def test_a_long_chain_reads_its_cut_packed(monkeypatch):
    """A chain longer than a program holds: the operand made a leaf is read from
    its launch's packed output (bits of the two-array read)."""
    x = _f32(4, (64,)) * 0.25

    def chain(a):
        s = a
        for k in range(24):
            s = s * 0.75 + a / (k + 3)
        return s

    out, reads = _both(chain, monkeypatch, x)
    assert reads >= 1
    _same_bits(out)
    ref = np.array(x).astype(np.longdouble)
    s = ref
    for k in range(24):
        s = s * 0.75 + ref / (k + 3)
    assert np.all(np.abs(out[0][1] - s) <= 2.0**-42 * np.abs(s))


@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan, 2.0**127, -(2.0**127)])
def test_special_values_read_packed(monkeypatch, special):
    """Inf, NaN and values near 2^127 in a packed output read by the next program
    and by a GEMM: the bits of the two-array reads (and float32's Inf / NaN where
    the float32 chain has them)."""
    xs = np.full((16,), 1.5, np.float32)
    xs[3] = special
    x = mx.array(xs)
    w = _f32(5, (16, 8))

    def fn(a, b):
        s = mx.sum(a * 0.5, axis=-1, keepdims=True)  # (1, 1): not packed (< 8 values)
        y = a.reshape(2, 8) * 2.0  # packed, read by the GEMM below and by the quotient
        return (y @ b[:8]) + y.sum() / s

    out, reads = _both(fn, monkeypatch, x, w)
    assert reads >= 1
    _same_bits(out)
    with np.errstate(all="ignore"):
        plain = np.array(fn(x, w))
    got = np.array(out[0][1])
    assert np.array_equal(np.isnan(got), np.isnan(plain))
    assert np.array_equal(np.isinf(got) & (got > 0), np.isinf(plain) & (plain > 0))


def test_outside_blocks_nothing_is_recorded():
    """The engines called outside blocks record no packed words (the caller holds
    the words and may update them in place)."""
    x = mp.DoubleWord.from_float32(_f32(6, (32,)))
    with mp.use_backend("emulate"):
        y = x * x + x
    assert fusion.packed(y.hi, y.lo) is None
    assert not fusion._packed


def test_packed_reads_on_the_metal_path(lazy_metal):
    """Lazy stand-in: the GEMM reads exp's packed output and the norm's program the
    sums' packed output: the graph is the launches and the slices of the result's
    words only."""
    x, w = _f32(7, (16, 32)), _f32(8, (32, 24))
    with mp.use_backend("metal"), mp.extended_precision():
        y = mx.exp(x) @ w
        g = graph_counts(y, low_word(y))["by_primitive"]
        z = x / mx.sum(x * x, axis=-1, keepdims=True)
        h = graph_counts(z, low_word(z))["by_primitive"]
    assert g == {"Depends": 2, "Slice": 2}, g
    assert h == {"Depends": 2, "Slice": 2}, h


@pytest.mark.parametrize("n", [64, 4096, 48])
def test_transforms_read_packed(monkeypatch, n):
    """rfft of a program's output, times a kernel, irfft: the transform's kernels
    (fft_real, the Stockham passes: two of them for n = 4096; Bluestein's for
    n = 48) and the product's program read the packed output of the kernel before
    them: the bits of the two-array reads, and numpy's float64 transforms of the
    exact operands to 1e-12 of the largest value."""
    x, k = _f32(9, (4, n)), _f32(10, (n // 2 + 1,))

    def fn(a, b):
        return mx.fft.irfft(mx.fft.rfft(a * 1.5) * b, n=n)

    out, reads = _both(fn, monkeypatch, x, k)
    assert reads >= 1
    _same_bits(out)
    ref = np.fft.irfft(np.fft.rfft(np.array(x).astype(np.float64) * 1.5)
                       * np.array(k).astype(np.float64), n=n)
    assert np.max(np.abs(out[0][1] - ref)) <= 1e-12 * np.max(np.abs(ref))


def test_a_transform_along_an_inner_axis_read_packed(monkeypatch):
    """fft along axis 1 of (4, 64, 8) (the transform's words hold the rows, axis 1
    last), then a complex product and a sum: the program reads the packed words
    through one reshape and transpose of them: the bits of the two-array reads, and
    numpy's float64 to 1e-12 of the largest value."""
    rng = np.random.default_rng(11)
    x = mx.array((rng.standard_normal((4, 64, 8))
                  + 1j * rng.standard_normal((4, 64, 8))).astype(np.complex64))
    c = mx.array((rng.standard_normal((64, 1)) + 1j).astype(np.complex64))

    def fn(a, b):
        return mx.fft.fft(a, axis=1) * b + a

    out, reads = _both(fn, monkeypatch, x, c)
    assert reads >= 1
    _same_bits(out)
    x64 = np.array(x).astype(np.complex128)
    ref = np.fft.fft(x64, axis=1) * np.array(c).astype(np.complex128) + x64
    got = np.array(out[0][1])
    assert np.max(np.abs(got - ref)) <= 1e-12 * np.max(np.abs(ref))


def test_a_depthwise_convolution_read_packed(monkeypatch):
    """A channels-last depthwise conv1d (Hyena's short filter: 3 taps, padding 2)
    writes packed words that the next program reads as one slot: the bits of the
    two-array read, and the float64 convolution of the exact operands (numpy)."""
    N, L, C = 2, 40, 16
    x, w = _f32(12, (N, L, C)), _f32(13, (C, 3, 1))

    def fn(a, b):
        return mx.conv1d(a * 1.5, b, padding=2, groups=C) * 0.75 + 1.0

    out, reads = _both(fn, monkeypatch, x, w)
    assert reads >= 1
    _same_bits(out)
    xp = np.pad(np.array(x).astype(np.float64) * 1.5, ((0, 0), (2, 2), (0, 0)))
    w64 = np.array(w).astype(np.float64)[:, :, 0]  # (C, 3)
    ref = sum(xp[:, k:k + L + 2, :] * w64[:, k] for k in range(3)) * 0.75 + 1.0
    assert np.max(np.abs(out[0][1] - ref)) <= 2.0**-44 * np.max(np.abs(ref))


@pytest.mark.parametrize("axes", [(1, 2), (2, 1)])
def test_two_dimensional_transforms_read_packed(monkeypatch, axes):
    """rfft2 over inner axes of a GEMM's output (FNO's spectral layer): the first
    transform's rows are one move and reshape of the GEMM's packed words, the second
    reads the first's packed words through one transpose; then irfft2. The bits of
    the two-array reads, and numpy's float64 transforms of the exact operands to
    1e-12 of the largest value."""
    x, w = _f32(14, (2, 16, 12, 4)), _f32(15, (4, 6))

    def fn(a, b):
        spectrum = mx.fft.rfft2(a @ b, axes=axes)
        return mx.fft.irfft2(spectrum * 0.5, s=(16, 12) if axes == (1, 2) else (12, 16),
                             axes=axes)

    out, reads = _both(fn, monkeypatch, x, w)
    assert reads >= 3
    _same_bits(out)
    y = np.array(x).astype(np.float64) @ np.array(w).astype(np.float64)
    s = (16, 12) if axes == (1, 2) else (12, 16)
    ref = np.fft.irfft2(np.fft.rfft2(y, axes=axes) * 0.5, s=s, axes=axes)
    assert np.max(np.abs(out[0][1] - ref)) <= 1e-12 * np.max(np.abs(ref))


@pytest.mark.parametrize("form", ["real factor", "real plus complex", "complex product",
                                  "inner-axis product"])
def test_parts_programs_read_packed_views(monkeypatch, form):
    """A parts program (complex words as (..., 2) float32 parts) reads views of
    packed words in place, the low words a plane of rows further along the views'
    first axis whatever their strides: a real factor with the parts axis added, a
    real operand padded to (x, 0), the real and imaginary halves of a transform's
    packed result (strided slices of its last axis). The bits of the two-array
    reads, and numpy's float64 to 1e-12 of the largest value."""
    rng = np.random.default_rng(16)
    x = _f32(17, (4, 32))
    c = mx.array((rng.standard_normal((4, 17)) + 1j * rng.standard_normal((4, 17)))
                 .astype(np.complex64))
    y = _f32(18, (4, 17))
    fns = {"real factor": lambda a, b, r: mx.fft.rfft(a) * (r * 1.5),
           "real plus complex": lambda a, b, r: (r * 1.5) + b * 2.0,
           "complex product": lambda a, b, r: mx.fft.rfft(a * 1.5) * mx.fft.rfft(a * 0.5),
           # transforms along an inner axis: each read through a transpose of its packed
           # words, the multiplier's parts reversed (a view of that transpose)
           "inner-axis product": lambda a, b, r: (
               mx.fft.fft((a * 1.5).reshape(4, 4, 8), axis=1)
               * mx.fft.fft((a * 0.5).reshape(4, 4, 8), axis=1))}
    out, reads = _both(fns[form], monkeypatch, x, c, y)
    assert reads >= 1
    _same_bits(out)
    x64, c64, y64 = (np.array(v).astype(np.complex128 if v.dtype == mx.complex64
                                        else np.float64) for v in (x, c, y))
    refs = {"real factor": np.fft.rfft(x64) * (y64 * 1.5),
            "real plus complex": y64 * 1.5 + c64 * 2.0,
            "complex product": np.fft.rfft(x64 * 1.5) * np.fft.rfft(x64 * 0.5),
            "inner-axis product": (np.fft.fft((x64 * 1.5).reshape(4, 4, 8), axis=1)
                                   * np.fft.fft((x64 * 0.5).reshape(4, 4, 8), axis=1))}
    ref = refs[form]
    assert np.max(np.abs(out[0][1] - ref)) <= 1e-12 * np.max(np.abs(ref))


MOVED = {  # fn of (real (4, 17), complex (4, 17)) and its float64 form
    # two programs' complex words: the product's halves and conj read packed
    "complex product": (lambda r, b: (b * 1.5 + 0.5) * (b * 0.5 - 1j),
                        lambda r, b: (b * 1.5 + 0.5) * (b * 0.5 - 1j)),
    # a reshaped real program's packed words (one reshape of them) as a real factor
    "reshaped real factor": (
        lambda r, b: (b.reshape(2, 2, 1, 17) * 2.0) * (r * 1.5).reshape(2, 2, 17)[..., None, :],
        lambda r, b: (b.reshape(2, 2, 1, 17) * 2.0) * (r * 1.5).reshape(2, 2, 17)[..., None, :]),
    # S4D's dtA[..., None] * arange: a program's complex floats read through new axes
    "expanded complex": (lambda r, b: mx.expand_dims((b * 1.5)[..., None], 0)
                         * mx.arange(3, dtype=mx.float32),
                         lambda r, b: (b * 1.5)[None, ..., None] * np.arange(3)),
    # a flattened complex product's floats read by exp (dw_math) and a real part
    "flattened complex exp": (lambda r, b: mx.exp(((b * 0.25) * (b * 0.5 + 1.0)).flatten()).real,
                              lambda r, b: np.exp(((b * 0.25) * (b * 0.5 + 1.0)).ravel()).real),
}


@pytest.mark.parametrize("form", list(MOVED))
def test_moved_words_read_packed(monkeypatch, form):
    """Words moved by an op that keeps their row-major order (a reshape, new axes)
    or read as another program's operand: the next kernel reads the packed words or
    the floats a kernel wrote (one view of them), with the bits of the two-array
    reads and of the complex words' own views (no record of the floats), and
    numpy's float64 value to 1e-12 of the largest."""
    fn, ref_fn = MOVED[form]
    rng = np.random.default_rng(19)
    r = _f32(20, (4, 17))
    b = mx.array((rng.standard_normal((4, 17)) + 1j * rng.standard_normal((4, 17)))
                 .astype(np.complex64))
    out, reads = _both(fn, monkeypatch, r, b)
    assert reads >= 1
    _same_bits(out)
    monkeypatch.setattr(fusion, "packed", _PACKED)  # (_both left it finding none)
    monkeypatch.setattr(fusion, "note_parts", lambda *a, **k: None)
    with mp.use_backend("emulate"), mp.extended_precision(strict=True) as rep:
        y = fn(r, b)
        plain = (_bits(y), _value(y))
    assert not rep.float32
    _same_bits([out[0], plain])
    ref = ref_fn(np.array(r).astype(np.float64), np.array(b).astype(np.complex128))
    assert np.max(np.abs(out[0][1] - ref)) <= 1e-12 * np.max(np.abs(ref))


MOVERS = {  # fn of x (4, 6, 10), w (10, 8) and its float64 form: movement ops of a
    # program's packed words that leave their first axis whole, read by the next kernel
    "transpose": (lambda x, w: mx.swapaxes(x * 1.5, 1, 2) * 2.0 + 1.0,
                  lambda x, w: np.swapaxes(x * 1.5, 1, 2) * 2.0 + 1.0),
    "basic index": (lambda x, w: (x * 1.5)[:, 1:5, ::2] * 3.0 + (x / 3)[..., 1:5, 2:3]
                    + (x * 0.5)[:, None][:, 0, 1:5, -1][..., None],
                    lambda x, w: (x * 1.5)[:, 1:5, ::2] * 3.0 + (x / 3)[..., 1:5, 2:3]
                    + (x * 0.5)[:, None][:, 0, 1:5, -1][..., None]),
    "split": (lambda x, w: (lambda a, b: a * mx.sigmoid(b))(*mx.split(x * 1.5, 2, axis=-1)),
              lambda x, w: (lambda a, b: a / (1 + np.exp(-b)))(*np.split(x * 1.5, 2, axis=-1))),
    "zero pad": (lambda x, w: mx.pad(x / 3, [(0, 0), (0, 3), (1, 0)]) * 2.0 + 0.5,
                 lambda x, w: np.pad(x / 3, [(0, 0), (0, 3), (1, 0)]) * 2.0 + 0.5),
    "transposed operand": (lambda x, w: (x * 1.5) @ (w * 0.5).T.T,
                           lambda x, w: (x * 1.5) @ (w * 0.5)),
    "product with a transpose": (lambda x, w: (x / 3) @ mx.swapaxes(x * 1.5, 1, 2),
                                 lambda x, w: (x / 3) @ np.swapaxes(x * 1.5, 1, 2)),
}


@pytest.mark.parametrize("form", list(MOVERS))
def test_movement_ops_read_packed(monkeypatch, form):
    """A movement op that leaves the first axis of its operand's packed words whole
    (a transpose keeping it, basic indices, a split or a zero pad of other axes, the
    operand of a transposed product) is read by the next kernel as that op of the
    packed words: the bits of the two-array reads, numpy's float64 to 1e-12."""
    fn, ref_fn = MOVERS[form]
    x, w = _f32(21, (4, 6, 10)), _f32(22, (10, 8))
    out, reads = _both(fn, monkeypatch, x, w)
    assert reads >= 1
    _same_bits(out)
    ref = ref_fn(np.array(x).astype(np.float64), np.array(w).astype(np.float64))
    assert np.max(np.abs(out[0][1] - ref)) <= 1e-12 * np.max(np.abs(ref))


def test_moved_words_on_the_metal_path():
    """On the metal path (lazy stand-in) the attention's q / k / v split of a fused
    projection is one split of its packed output: no split of each word, the
    transposed key read packed, and no slice but the result's high word."""
    x, w = _f32(23, (2, 16, 24)), _f32(24, (24, 72))
    with lazy_metal_executor(), mp.use_backend("metal"), mp.extended_precision():
        q, k, v = mx.split((x / 3) @ w, 3, axis=-1)
        y = (q @ mx.swapaxes(k, -1, -2)) @ v
        by = graph_counts(y)["by_primitive"]
    assert by.get("Split") == 1 and by.get("Slice") == 1 and by["Depends"] == 4, by


@pytest.mark.parametrize("n", [5, 64])
@pytest.mark.parametrize("special", [None, np.inf, np.nan, 0.0, 2.0**127])
def test_complex_division_reads_packed(monkeypatch, n, special):
    """x / y of two complex programs' words (cdw_div reads each as one buffer, its
    low words half a buffer further, and writes one packed output, whose low words
    the next program reads as written), padded (n = 5)
    or not, with an Inf, NaN or zero divisor part (float32's rule there) or a huge
    one (2^127: scaled, no overflow): the bits of the two-array reads; the value
    numpy's complex128 quotient of the exact operands to 2^-44 where finite."""
    rng = np.random.default_rng(25)
    a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    b = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    if special is not None:
        b[2] = special
    A, B = mx.array(a), mx.array(b)

    def fn(x, y):
        return ((x * 1.5 + 0.25) / (y * 0.75 - 1j)) * 2.0

    out, reads = _both(fn, monkeypatch, A, B)
    assert reads >= (1 if n >= 8 else 0)
    _same_bits(out)
    # the quotient's low words read as cdw_div wrote them: the bits of its complex view
    monkeypatch.setattr(fusion, "packed", _PACKED)
    monkeypatch.setattr(fusion, "note_parts", lambda *a, **k: None)
    with mp.use_backend("emulate"), mp.extended_precision(strict=True):
        y = fn(A, B)
        _same_bits([out[0], (_bits(y), _value(y))])
    a64, b64 = a.astype(np.complex128), b.astype(np.complex128)
    with np.errstate(all="ignore"):
        ref = ((a64 * 1.5 + 0.25) / (b64 * 0.75 - 1j)) * 2.0
    got = out[0][1]
    rule = special is not None and special != 2.0**127  # float32's rule applies there
    fine = np.isfinite(ref)
    fine[2] = not rule
    # (a quotient by 2^127 lands among float32's subnormals, which Apple GPUs and the
    # emulator flush to zero: absolute 2^-125 there, both parts)
    assert np.all(np.abs(got[fine] - ref[fine]) <= 2.0**-44 * np.abs(ref[fine]) + 2.0**-125)
    if rule:  # float32's quotient of the high words there
        with np.errstate(all="ignore"):
            plain = np.array(fn(A, B))
        for part in (np.real, np.imag):
            g, p = part(np.array(got[2], np.complex64)), part(plain[2])
            assert (np.isnan(g) and np.isnan(p)) or g == p, (g, p)


def test_moved_words_after_in_place_updates(monkeypatch):
    """A moved array updated in place, and the source of another updated after the
    move: the next kernel reads the updated words (the packed record of a moved
    array holds only with the very low words it was made with, and is made from its
    source's packed words only while those hold), with the bits of the two-array
    reads and numpy's float64 value."""

    def fn(x, w):
        y = x * 1.5                      # packed
        v = y.reshape(6, 40)             # recorded as a reshape of y's packed words
        v[0] = 5.0                       # v updated in place: its record no longer holds
        u = y[:, 1:3]                    # recorded from y's packed words
        y += 0.25                        # y updated after the move: u is the old value
        return v * 2.0 + 1.0, u * 3.0, y / 3

    def ref(x):
        y = x * 1.5
        v = y.reshape(6, 40).copy()
        v[0] = 5.0
        u = y[:, 1:3]
        return [v * 2.0 + 1.0, u * 3.0, (y + 0.25) / 3]

    x = _f32(26, (4, 6, 10))
    outs = []
    for packed_on in (True, False):
        monkeypatch.setattr(fusion, "packed", _PACKED if packed_on else lambda h, l: None)
        with mp.use_backend("emulate"), mp.extended_precision(strict=True) as rep:
            ys = fn(x, None)
            outs.append([(_bits(y), _value(y)) for y in ys])
        assert not rep.float32
    for (b1, v1), (b2, _) in zip(*outs):
        for a, b in zip(b1, b2):
            np.testing.assert_array_equal(a, b)
    for (_, got), want in zip(outs[0], ref(np.array(x).astype(np.float64))):
        assert np.max(np.abs(got - want)) <= 1e-12 * np.max(np.abs(want))


def _single(a):
    """x / sum(x) (the sum of everything: one row, written 8 times) and x * s with s
    a 0-d program's result (8 copies as well), then + 0-d float32 array (a leaf of
    one value: 8 copies of a broadcast view)."""
    s = mx.sum(a * 1.5)
    t = (s * 0.25 + 1.0) / 3.0
    return (a / s) * t + mx.array(0.375)


def test_single_values_read_from_their_copies(monkeypatch):
    """A single value a kernel writes 8 times (a sum of everything, a 0-d program's
    result) is read by the next program at element 0 of those copies, its low word 8
    elements further, and a 0-d float32 array through one 8-element broadcast view:
    on emulate the bits of the words read as arrays (sliced, reshaped and broadcast
    to the launch), and numpy longdouble's value to 2^-44; on the metal path (lazy
    stand-in) no Slice, Reshape or Broadcast node between the launches."""
    x = _f32(31, (16, 12)) + 3.0
    reads, out = [], []
    found = fusion._copied
    for copies in (True, False):
        monkeypatch.setattr(fusion, "_copied", (lambda h, l: reads.append(found(h, l))
                                                or reads[-1]) if copies else
                            lambda h, l: None)
        if not copies:  # single values broadcast to the launch's shape, as other small leaves
            monkeypatch.setattr(fusion, "_EIGHT", (16, 12))
            monkeypatch.setattr(fusion, "_SLOT_PLANS", {})
            monkeypatch.setattr(fusion, "_LAUNCHES", {})
            monkeypatch.setattr(fusion, "_REDUCTIONS", {})
        with mp.use_backend("emulate"), mp.extended_precision(strict=True) as rep:
            y = _single(x)
            out.append((_bits(y), _value(y)))
        assert not rep.float32, rep
    assert sum(z is not None for z in reads) >= 2
    _same_bits(out)
    x64 = np.array(x).astype(np.longdouble)
    s = (x64 * 1.5).sum()
    ref = (x64 / s) * ((s * 0.25 + 1) / 3) + 0.375
    assert np.all(np.abs(out[0][1] - ref) <= 2.0**-44 * np.abs(ref))
    monkeypatch.undo()
    with lazy_metal_executor(), mp.use_backend("metal"), mp.extended_precision():
        y = _single(x)
        by = graph_counts(y)["by_primitive"]
    # two launches (the sum; one program reading x, the sum's copies and the array);
    # the array's view of 8 elements and the result's high word (a slice of its packed
    # words) are the only other nodes
    assert by == {"Depends": 2, "Broadcast": 1, "Slice": 1}, by


def test_short_results_are_not_single_values():
    """A short result of several values (4 elements, written 8 times as well), read
    as a leaf where a chain is cut (an update repeated as an optimizer's, its chain
    outgrowing a program), is read as its words, each element its own: numpy
    longdouble's values to 2^-44 (a short result taken for a single value read
    element 0 for all four)."""
    x, b = _f32(32, (16, 4)) + 3.0, _f32(33, (4,))
    x64, b64 = (np.array(a).astype(np.longdouble) for a in (x, b))
    with mp.use_backend("emulate"), mp.extended_precision(strict=True):
        for _ in range(12):
            b = b * 0.75 + mx.sum(x, axis=0) / 3.0 - b / 7.0
            b64 = b64 * 0.75 + x64.sum(axis=0) / 3 - b64 / 7
        got = _value(b)
    assert np.all(np.abs(got - b64) <= 2.0**-42 * np.abs(b64))
