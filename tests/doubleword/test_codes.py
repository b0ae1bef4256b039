"""The kernel codes of the double-word kernels, shared with Metal by name: the
generated blocks of the headers are exactly what Python generates, the kernels
compare with the names (never a bare number), and each name selects the operation
it names (checked against numpy, not against a position). Likewise the params
layouts, sentinels and codes of the Ozaki / ESC, fixed-point, double-word GEMM,
norm and int8 GEMM kernels."""

import re

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.core.kernels import METAL_DIR
from mlx_precise.doubleword import dw_kernels, fusion
from mlx_precise.doubleword import functions as dwmath
from mlx_precise.doubleword.dw_kernels import CDW_OP, CDW_OPS, DW_OP, DW_OPS, offsets
from mlx_precise.esc import engine as esc_engine
from mlx_precise.fixedpoint import qformat
from mlx_precise.int8 import engine as int8_engine
from mlx_precise.int8 import scaled as int8_scaled
from mlx_precise.linalg import gemm
from mlx_precise.norms import engine as norms_engine
from mlx_precise.ozaki import engine as ozaki_engine


def _header(name):
    return (METAL_DIR / "include" / name).read_text()


def _body(name):
    return (METAL_DIR / "kernels" / name).read_text()


def test_generated_blocks_are_in_the_headers():
    assert dw_kernels.codes_source() in _header("dw_ops.h")
    assert dwmath.codes_source() in _header("dw_math.h")
    assert fusion.codes_source() in _header("dw_fused.h")
    assert "constant constexpr int DW_OP_ADD = %d;" % DW_OP["add"] in dw_kernels.codes_source()
    assert esc_engine.codes_source() in _header("ozaki.h")
    assert ozaki_engine.codes_source() in _header("ozaki.h")
    assert qformat.codes_source() in _header("fixedpoint.h")
    assert "constant constexpr int OZ_NEG = %d;" % esc_engine.NEG in esc_engine.codes_source()
    assert gemm.codes_source() in _header("dw_gemm.h")
    assert int8_engine.codes_source() in _header("int8_gemm.h")
    assert int8_scaled.codes_source() in _header("int8_gemm.h")
    assert norms_engine.codes_source() in _header("norms.h")


_KERNELS_OF = {"dw_gemm.metal": (gemm.DW_GEMM, *gemm._UNBIASED.values())}


@pytest.mark.parametrize("layout, body, buffer", [
    (esc_engine.OZAKI_SCAN_PARAMS, "ozaki_scan.metal", "params"),
    (esc_engine.OZAKI_ESC_ESTIMATE_PARAMS, "ozaki_esc_estimate.metal", "params"),
    (esc_engine.OZAKI_ESC_PARAMS, "ozaki_esc.metal", "params"),
    (ozaki_engine.OZAKI_SLICE_PARAMS, "ozaki_slice.metal", "params"),
    (ozaki_engine.OZAKI_ACCUMULATE_PARAMS, "ozaki_accumulate.metal", "params"),
    (ozaki_engine.OZAKI_PRODUCTS_PARAMS, "ozaki_products.metal", "p"),
    (qformat.FX_PARAMS, "fixedpoint_quantize.metal", "params"),
    (qformat.FX_PARAMS, "fixedpoint_simulate.metal", "params"),
    (gemm.DW_GEMM_PARAMS, "dw_gemm.metal", "p"),
    (int8_engine.INT8_GEMM_I32_PARAMS, "int8_gemm_i32.metal", "p"),
    (int8_scaled.INT8_SCALED_MM_PARAMS, "int8_scaled_mm.metal", "p"),
    (norms_engine.NORM_TILE_PARAMS, "norm_tile.metal", "p"),
    (norms_engine.NORM_REDUCE_PARAMS, "norm_reduce.metal", "p"),
], ids=lambda v: v if isinstance(v, str) else v.prefix)
def test_kernels_read_params_by_name(layout, body, buffer):
    """Each field of the layout is read by its generated name, none by a number (in
    the body or in the line 1 a kernel of the body generates: dw_gemm's packed low
    words)."""
    src = _body(body) + "".join(k.prelude or "" for k in _KERNELS_OF.get(body, ()))
    assert not re.search(rf"\b{buffer}\[\s*\d", src)
    missing = [n for n in layout.names if f"{buffer}[{layout.metal_name(n)}]" not in src]
    assert not missing, f"never read: {missing}"


def test_scan_info_fields_by_name():
    """ozaki_scan writes every field of INFO at its name, and the estimate strides
    by OZ_INFO_COUNT, not by a number."""
    scan, estimate = _body("ozaki_scan.metal"), _body("ozaki_esc_estimate.metal")
    info = esc_engine.INFO
    for n in info.names:
        assert f"info[o + {info.metal_name(n)}]" in scan
    for src, strides in ((scan, 1), (estimate, 2)):
        assert src.count("ulong(OZ_INFO_COUNT) * (") == strides
        assert not re.search(r"info[AB]?\[[a-z]+ \+ \d", src)


def test_gemm_batch_records_by_name():
    """dw_gemm reads each field of a batch dimension's record by name, the records
    following the fixed fields (DW_GEMM_DIMS_AT) at a stride of DW_GEMM_DIM_COUNT."""
    src, dim = _body("dw_gemm.metal"), gemm.DW_GEMM_DIM
    for n in dim.names:
        assert f"p[rec + {dim.metal_name(n)}]" in src
    assert "const int rec = DW_GEMM_DIMS_AT + DW_GEMM_DIM_COUNT * d;" in src
    assert gemm.DW_GEMM_DIMS.dims_at == gemm.DW_GEMM_PARAMS.size
    assert gemm.DW_GEMM_PARAMS.size >= len(gemm.DW_GEMM_PARAMS.names)


def test_int8_epilogue_codes_by_name():
    """Int8ScaledEpilogue compares its kind with the generated names, and scaled_mm
    packs the kind at its named slot."""
    src, epi = _header("int8_gemm.h"), int8_scaled.EPILOGUE
    assert not re.search(r"\bkind\s*[=!<>]=?\s*\d", src)
    for n in ("azp", "azp_per_token"):
        assert f"kind == {epi.metal_name(n)}" in src
    lay = int8_scaled.INT8_SCALED_MM_PARAMS
    p = np.array(lay.pack(m=1, n=2, k=3, sa_step=0, sb_step=1, epilogue=epi["azp"],
                          has_bias=True))
    assert p.dtype == np.int32 and p.size == 8
    assert p[lay.index("epilogue")] == epi["azp"] and p[lay.index("has_bias")] == 1


def test_norm_codes_by_name():
    """The norm kernels compare the kind, the structure and norm_reduce's records
    with the generated names; every kind and structure has a branch or a test."""
    tile, reduce_ = _body("norm_tile.metal"), _body("norm_reduce.metal")
    assert not re.search(r"\b(kind|st)\s*[=!<>]=?\s*\d", tile)
    assert "p[NORM_REDUCE_RECORDS] == NORM_RECORDS_BLUE" in reduce_
    assert not re.search(r"\b(mode|records)\s*[=!<>]=?\s*\d", reduce_)
    codes = norms_engine.KIND, norms_engine.STRUCTURE
    missing = [c.metal_name(n) for c in codes for n in c.names
               if c.metal_name(n) not in tile and n != "trapezoid"]
    assert not missing, f"never named: {missing}"  # trapezoid: general's complement


@pytest.mark.parametrize("kind", ["max", "one", "inf", "fro"])
def test_each_norm_kind_code_computes_its_norm(kind):
    """norm_tile with p[NORM_TILE_KIND] = the code of ``kind`` (by name), reduced by
    norm_reduce: numpy's norm of the same kind (float32 data, exact in float64)."""
    a = np.arange(1, 13, dtype=np.float32).reshape(3, 4) * np.float32(1.5) - 7
    spec = norms_engine.make_spec(kind, "general", "lower", "nonunit", False)
    assert spec.kind == norms_engine.KIND[kind]
    got = norms_engine.kernel_partial(mx.array(a), spec, 2, "emulate").result
    x = np.abs(a.astype(np.float64))  # sums and squares exact in float64
    want = {"max": x.max(), "one": x.sum(axis=0).max(), "inf": x.sum(axis=1).max(),
            "fro": np.sqrt((x * x).sum())}[kind]
    assert float(got) == np.float32(want)


def test_fixedpoint_rounding_codes_by_name():
    """The kernels compare the rounding mode with the generated names, and the params
    buffer carries the threshold's float32 bit pattern at its named slot."""
    src = _header("fixedpoint.h")
    assert not re.search(r"rounding\s*[=!]=\s*\d", src)
    for n in ("half_even", "truncate"):
        assert f"rounding == {qformat.ROUNDING.metal_name(n)}" in src
    p = np.array(qformat._params(np.float32(0.999), qformat.ROUNDING["truncate"], 31))
    lay = qformat.FX_PARAMS
    assert p.dtype == np.int32 and p.size == 8
    assert p[lay.index("threshold_bits"):][:1].view(np.float32)[0] == np.float32(0.999)
    assert p[lay.index("bits")] == 31
    assert p[lay.index("rounding")] == qformat.ROUNDING["truncate"]


@pytest.mark.parametrize("body, param", [("dw_ops.metal", "OP"), ("cdw_ops.metal", "OP"),
                                         ("dw_math.metal", "FN")])
def test_kernels_compare_codes_by_name(body, param):
    src = _body(body)
    assert not re.search(rf"\b{param}\s*[=!<>]=?\s*\d", src.replace(f"{param} >= 0", ""))
    assert re.search(rf"\b{param} == [A-Z_]+", src)


def _from(header, start):
    """The text of a header from ``start`` on (a function the kernels share)."""
    text = _header(header)
    return text[text.index(start):]


def test_every_code_has_a_branch_in_its_kernel():
    for codes, src in ((DW_OP, _body("dw_ops.metal")), (CDW_OP, _body("cdw_ops.metal")),
                       # dwm_apply: the real functions (dw_math and the fused kernels);
                       # dwf_eval: a fused program's operations (dw_fused, dw_reduce)
                       (dwmath.FN, _body("dw_math.metal")
                        + _from("dw_math.h", "METAL_FUNC dw dwm_apply(")),
                       (fusion.OP, _from("dw_fused.h", "template <bool MATH>"))):
        missing = [codes.metal_name(n) for n in codes.names if codes.metal_name(n) not in src]
        assert not missing, f"never named: {missing}"


def _f32(v):
    return mx.array(np.asarray(v, np.float32))


X = np.array([0.3, 0.7, 1.5, 2.25, 0.125, 0.9, 1.1, 3.0], np.float32)
Y = np.array([1.25, 0.5, 0.75, 1.5, 2.0, 0.6, 1.9, 0.4], np.float32)
NUMPY = {
    "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "log2": np.log2,
    "log10": np.log10, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "erf": lambda x: np.array([__import__("math").erf(v) for v in x]),
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "reciprocal": lambda x: 1 / x,
    "power": np.power, "arctan2": np.arctan2,
}


@pytest.mark.parametrize("fn", dwmath.FN.names)
def test_each_function_code_computes_its_function(fn):
    """dw_math with FN = the code of ``fn`` (given by name) computes ``fn``."""
    x, y = X.astype(np.float64), Y.astype(np.float64)
    two = fn == "cexp"  # complex words: X + iY interleaved
    a = np.stack([X, Y], axis=-1).reshape(-1) if two else X
    (z,) = dwmath.DW_MATH(
        inputs=[_f32(a), _f32(np.zeros_like(a)), _f32(a if two else Y), _f32(0 * a),
                offsets(0, 0, a.size)],
        template={"FN": fn}, output_shapes=[(2 * a.size,)], output_dtypes=[mx.float32],
        grid=(X.size, 1, 1), threadgroup=(X.size, 1, 1), backend="emulate")
    words = np.array(z, np.float64).reshape(2, -1)  # packed: the high words, the low
    got = words[0] + words[1]
    if two:
        got = got[0::2] + 1j * got[1::2]
        want = np.exp(x + 1j * y)
    else:
        want = NUMPY[fn](x, y) if fn in dwmath.BINARY else NUMPY[fn](x)
    assert np.max(np.abs(got - want) / np.abs(want)) < 1e-13


@pytest.mark.parametrize("op", DW_OP.names)
def test_each_dw_op_code_computes_its_operation(op):
    rng = np.random.default_rng(DW_OP[op])
    xh = rng.uniform(1, 2, 16).astype(np.float32)
    yh = rng.uniform(0.25, 0.5, 16).astype(np.float32)  # |xh| >= |yh| for Fast2Sum
    xl = (xh * rng.uniform(-2**-25, 2**-25, 16)).astype(np.float32)
    yl = (yh * rng.uniform(-2**-25, 2**-25, 16)).astype(np.float32)
    if op in ("two_sum", "fast_two_sum", "two_prod"):
        xl = np.zeros_like(xl)
    zh, zl = DW_OPS(inputs=[_f32(a) for a in (xh, xl, yh, yl)], template={"OP": op},
                    output_shapes=[(16,), (16,)], output_dtypes=[mx.float32] * 2,
                    backend="emulate")
    zh, zl = np.array(zh, np.float64), np.array(zl, np.float64)
    x = xh.astype(np.float64) + xl
    y = yh.astype(np.float64) + yl
    if op == "recip_refine":  # step 0 of DW / DW from each faithful 1/yh: RN(1/yh)
        np.testing.assert_array_equal(zh, np.float32(1) / yh)
        assert np.max(np.abs(zl * yh - 1)) < 2.0**-23
        return
    want = {"two_sum": x + yh, "fast_two_sum": x + yh, "two_prod": x * yh, "add_fp": x + yh,
            "add": x + y, "mul_fp": x * yh, "mul": x * y, "div": x / y,
            "div_faithful": x / y}[op]
    assert np.max(np.abs(zh + zl - want) / np.abs(want)) < 2.0**-45


@pytest.mark.parametrize("op", CDW_OP.names)
def test_each_cdw_op_code_computes_its_operation(op):
    rng = np.random.default_rng(CDW_OP[op])
    parts = [rng.uniform(-2, 2, 16).astype(np.float32) for _ in range(4)]
    z = np.zeros(16, np.float32)
    ins = [parts[0], z, parts[1], z, parts[2], z, parts[3], z]
    rh, rl, ih, il = CDW_OPS(inputs=[_f32(a) for a in ins], template={"OP": op},
                             output_shapes=[(16,)] * 4, output_dtypes=[mx.float32] * 4,
                             backend="emulate")
    got = (np.array(rh, np.float64) + np.array(rl)) + 1j * (np.array(ih, np.float64) + np.array(il))
    x = parts[0].astype(np.float64) + 1j * parts[1]
    y = parts[2].astype(np.float64) + 1j * parts[3]
    want = x + y if op == "add" else x * y
    assert np.max(np.abs(got - want) / np.abs(want)) < 2.0**-44


def test_template_values_by_name_and_code():
    from mlx_precise.core.kernels import KernelInputError

    assert DW_OPS._template_args({"OP": "mul"}) == [("OP", DW_OP["mul"])]
    assert DW_OPS._template_args({"OP": 6}) == [("OP", 6)]
    with pytest.raises(KernelInputError, match="not a name of DW_OP"):
        DW_OPS._template_args({"OP": "pow"})
    with pytest.raises(KernelInputError, match="not a code of DW_OP"):
        DW_OPS._template_args({"OP": len(DW_OP.names)})
    assert DW_OPS.variants["OP"] == DW_OP.values
    assert dwmath.DW_MATH.variants["FN"] == dwmath.FN.values


def test_codes_and_layouts_by_name():
    from mlx_precise.core.kernels import Codes, ParamLayout, generated_block

    c = Codes("T_OP", ("first", "second"))
    assert c["second"] == 1 and c.metal_name("second") == "T_OP_SECOND"
    assert c.source() == ("constant constexpr int T_OP_FIRST = 0;\n"
                          "constant constexpr int T_OP_SECOND = 1;\n"
                          "constant constexpr int T_OP_COUNT = 2;\n")
    with pytest.raises(KeyError, match="unknown name 'third'"):
        c["third"]
    for bad in (("a", "a"), ("Upper",), ("count",)):
        with pytest.raises(ValueError):
            Codes("T", bad)
    lay = ParamLayout("T_P", ("n", "flag"), size=8)
    assert np.array(lay.pack(flag=True, n=5)).tolist() == [5, 1, 0, 0, 0, 0, 0, 0]
    with pytest.raises(KeyError, match="missing fields"):
        lay.pack(n=5)
    with pytest.raises(KeyError, match="unknown"):
        lay.pack(n=5, flag=0, extra=1)
    with pytest.raises(ValueError, match="fit in int32"):
        lay.pack(n=2**31, flag=0)
    wide = ParamLayout("T_W", ("n", "flag"), size=8, dtype=np.int64)
    p = np.array(wide.pack(n=2**40, flag=1))
    assert p.dtype == np.int64 and p.tolist() == [2**40, 1, 0, 0, 0, 0, 0, 0]
    assert np.array(wide.pack([7, -2**40], n=3, flag=0)).tolist() == [3, 0] + [0] * 6 + [7, -2**40]
    with pytest.raises(ValueError, match="fit in int32"):
        lay.pack([2**31], n=1, flag=0)
    assert "constant constexpr int T_P_FLAG = 1;" in generated_block("f()", c, lay)
