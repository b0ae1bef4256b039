"""Two-operand einsums on the kernel backends as one GEMM launch that reads its
operands and writes its result in place through strides
(mlx_precise.linalg.gemm.strided_matmul): no transpose or reshape of an operand or
of the result. Checked on emulate against the decomposition into transposes,
reshapes and a batched matmul through the flow (the same sums in the same order:
the same bits) and against numpy's einsum in longdouble of the operands' exact
double-word values, to the GEMM's bound (K + 12) u^2 sum |a| |b| (docs/dwgemm.md;
complex: four real products per term, twice that)."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import low_word
from mlx_precise.extended.rules import linear
from mlx_precise.testing import graph_counts, lazy_metal_executor

U = 2.0 ** -24

# spec, shape of a, shape of b: batch letters, several free letters of an operand
# (batch dimensions with a zero stride in the other), permuted outputs, no
# contracted letter (outer products), a 0-d result, size-1 dimensions, and two
# contracted letters (the transposes' path)
CASES = [
    ("hn,hnl->hl", (5, 8), (5, 8, 12)),
    ("bxyi,ioxy->bxyo", (2, 3, 4, 6), (6, 5, 3, 4)),
    ("bij,jk->bik", (3, 7, 9), (9, 4)),
    ("ij,jk->ki", (6, 9), (9, 5)),
    ("abc,cd->dab", (3, 4, 7), (7, 5)),
    ("xab,yb->yxa", (2, 3, 6), (4, 6)),
    ("ab,cd->cabd", (3, 4), (2, 5)),
    ("i,i->", (11,), (11,)),
    ("bik,bkj->bji", (2, 1, 5), (2, 5, 3)),
    ("ij,ij->ji", (4, 6), (4, 6)),
    ("ijk,jkl->il", (3, 4, 5), (4, 5, 2)),
]
KINDS = ["real", "complex", "real-complex", "complex-real"]


def _operand(shape, seed, cx):
    """A carried operand (x / 3: a low word) and its exact value (longdouble)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if cx:
        x = (x + 1j * rng.standard_normal(shape).astype(np.float32)).astype(np.complex64)
    return mx.array(x)


def _value(y) -> np.ndarray:
    wide = np.clongdouble if y.dtype == mx.complex64 else np.longdouble
    lo = low_word(y)
    return np.array(y).astype(wide) + (0 if lo is None else np.array(lo).astype(wide))


def _bits(y):
    return tuple(np.ascontiguousarray(np.array(w)).view(np.uint32) for w in (y, low_word(y)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spec,sa,sb", CASES, ids=[c[0] for c in CASES])
def test_einsum_in_place_matches_decomposition_and_oracle(spec, sa, sb, kind):
    a_cx, b_cx = kind in ("complex", "complex-real"), kind in ("complex", "real-complex")
    A, B = _operand(sa, 1, a_cx), _operand(sb, 2, b_cx)
    with mp.use_backend("emulate"), mp.extended_precision(strict=True) as rep:
        a, b = A / 3, B * 1.7  # carried operands (a low word each)
        y = mx.einsum(spec, a, b)
        d = linear._einsum(spec, a, b)  # transposes, reshapes, one matmul
        va, vb = _value(a), _value(b)
        mx.eval(y, d)
    assert not rep.float32
    assert y.dtype == d.dtype and y.shape == d.shape == np.einsum(spec, np.array(A),
                                                                  np.array(B)).shape
    for u, v in zip(_bits(y), _bits(d)):
        np.testing.assert_array_equal(u, v)
    exact = np.einsum(spec, va, vb)
    scale = np.einsum(spec, np.abs(va), np.abs(vb))
    (ta, tb), out = spec.split("->")[0].split(","), spec.split("->")[1]
    K = int(np.prod([sa[ta.index(c)] for c in ta if c in tb and c not in out]))
    err = np.abs(_value(y) - exact)
    bound = (2 if (a_cx or b_cx) else 1) * (K + 12) * U * U * scale
    assert np.all(err <= bound), (float(np.max(err / np.maximum(bound, 1e-300))), spec)
    # float32's own einsum errs well above the bound somewhere (the check can fail)
    y32 = np.einsum(spec, np.array(va.astype(np.complex64 if a_cx else np.float32)),
                    np.array(vb.astype(np.complex64 if b_cx else np.float32)))
    assert np.any(np.abs(y32.astype(exact.dtype) - exact) > bound) or np.all(scale == 0)


def test_einsum_packed_and_kernel_words():
    """Operands that are other kernels' outputs: a fused program's packed words
    (real) and complex exp's words (read as the floats the kernel wrote): the same
    bits as the decomposition."""
    A, B = _operand((4, 8), 3, False), _operand((4, 8, 16), 4, True)
    with mp.use_backend("emulate"), mp.extended_precision(strict=True) as rep:
        a = mx.exp(A / 5) * 0.5 + 0.25  # a program's packed words
        b = mx.exp(B * 0.1)  # cexp: kernel words of complex values
        for x, z in (("hn,hnl->hl", (a.astype(mx.complex64), b)), ("hn,hnl->lh", (a, b)),
                     ("hl,hnl->hn", (b[:, 0] * 1.0, b))):
            y, d = mx.einsum(x, *z), linear._einsum(x, *z)
            for u, v in zip(_bits(y), _bits(d)):
                np.testing.assert_array_equal(u, v)
            val = np.einsum(x, *(_value(o) for o in z))
            rel = np.max(np.abs(_value(y) - val)) / np.max(np.abs(val))
            assert rel < 2.0 ** -44, (x, rel)
    assert not rep.float32


def test_einsum_moves_nothing_on_metal():
    """On the metal path (lazy stand-in) the einsum of FNO's spectral layer is one
    launch with no transpose or reshape around it."""
    A, B = _operand((2, 3, 4, 6), 5, True), _operand((6, 5, 3, 4), 6, True)
    with lazy_metal_executor():
        with mp.use_backend("metal"), mp.extended_precision():
            y = mx.einsum("bxyi,ioxy->bxyo", A, B)
            counts = graph_counts(y)
    by = counts["by_primitive"]
    assert counts["launches"] == 1 and "Transpose" not in by and "Reshape" not in by, by


def test_complex_result_read_as_kernel_floats(monkeypatch):
    """A complex product's words are recorded as the floats the GEMM wrote: its real
    and imaginary parts, a program over its parts, complex exp and a second einsum
    read those floats (packed); the same bits as reading the complex words (no
    record), and the oracle's values."""
    A, B = _operand((3, 8), 7, True), _operand((3, 8, 10), 8, True)

    def run():
        with mp.use_backend("emulate"), mp.extended_precision(strict=True) as rep:
            a = A / 3
            y = mx.einsum("hn,hnl->hl", a, B)
            outs = [y.real, y.imag, mx.real(y) * 2.0, y * 0.5 + 1.0, mx.exp(y * 0.01),
                    mx.einsum("hl,hl->h", y, y), mx.conj(y) * y]
            vals = [_value(a)]
            mx.eval(outs)
        assert not rep.float32
        return [_bits(o) for o in outs], [_value(o) for o in outs], vals[0]

    bits, vals, va = run()
    monkeypatch.setattr(mp.doubleword.fusion, "note_parts", lambda *a, **k: None)
    bits_plain, _, _ = run()
    for (u1, u2), (v1, v2) in zip(bits, bits_plain):
        np.testing.assert_array_equal(u1, v1)
        np.testing.assert_array_equal(u2, v2)
    y = np.einsum("hn,hnl->hl", va, np.array(B).astype(np.clongdouble))
    refs = [y.real, y.imag, 2 * y.real, y * 0.5 + 1]
    for v, r in zip(vals, refs):
        assert np.max(np.abs(v - r)) <= 2.0 ** -44 * np.max(np.abs(r)), r
