"""MLX functions held before a block anywhere but a module global or a local of the
opening frame (an object's attribute, a dict, a list, a closure cell of a function
defined elsewhere, a default argument, a ``functools.partial``) are rebound to the
double-word stand-ins while blocks are open (a heap scan, holders.rebind_held),
and hold MLX's originals again after the last block; what cannot be rebound (a
tuple, a frozenset, an object implemented in C, a suspended generator) is named:
strict=True raises, the default mode warns."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import types
import warnings

import mlx.core as mx
import mlx.nn as nn
import mpmath
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import PrecisionDropError, dispatch, holders, low_word
from mlx_precise.extended.constructor import ARRAY


def _carried():
    """x * 3 in a block for 64 values in [0.1, 1.4]: exact products that need a
    low word."""
    return mx.array(np.linspace(0.1, 1.4, 64, dtype=np.float32)) * 3.0


def _exact(x) -> list:
    lo = low_word(x)
    assert lo is not None and np.any(np.array(lo) != 0)
    return [mpmath.mpf(float(h)) + mpmath.mpf(float(v)) for h, v in zip(np.array(x),
                                                                          np.array(lo))]


def _rounded(values) -> np.ndarray:
    return np.array([np.float32(float(v)) for v in values], dtype=np.float32)


def _exp_oracle(x) -> np.ndarray:
    """exp of the exact double-word values of x, correctly rounded to float32."""
    with mpmath.workprec(200):
        return _rounded(mpmath.exp(v) for v in _exact(x))


def _square_oracle(x) -> np.ndarray:
    with mpmath.workprec(200):
        return _rounded(v * v for v in _exact(x))


# ---- the holders, made before any block (as a model package would) ------------------
class _Act:
    def __init__(self):
        self.act = mx.exp


class _Slots:
    __slots__ = ("act",)

    def __init__(self):
        self.act = mx.exp


class _ClassAttr:
    act = mx.exp


class _Layer(nn.Module):  # mlx.nn modules are dicts with attributes
    def __init__(self):
        super().__init__()
        self.act = mx.exp

    def __call__(self, x):
        return self.act(x)


def _closure():
    g = mx.exp
    return lambda v: g(v)


def _default(v, act=mx.exp):
    return act(v)


# MLX's own functions, by id (a name holding them would be rebound inside blocks)
_EXP, _MUL = id(mx.exp), id(mx.array.__mul__)


def _holders():
    """name -> (a call through a holder made now, its oracle, a test that the holder
    holds MLX's original)."""
    act, slots, layer, closure = _Act(), _Slots(), _Layer(), _closure()
    table, listed = {"exp": mx.exp}, [mx.exp]
    partial = functools.partial(mx.exp)
    methods = {"mul": mx.array.__mul__}
    return {
        "attribute": (lambda x: act.act(x), _exp_oracle, lambda: id(act.act) == _EXP),
        "slot": (lambda x: slots.act(x), _exp_oracle, lambda: id(slots.act) == _EXP),
        "class attribute": (lambda x: _ClassAttr().act(x), _exp_oracle,
                            lambda: id(vars(_ClassAttr)["act"]) == _EXP),
        "mlx.nn module": (layer, _exp_oracle, lambda: id(layer.act) == _EXP),
        "dict": (lambda x: table["exp"](x), _exp_oracle, lambda: id(table["exp"]) == _EXP),
        "list": (lambda x: listed[0](x), _exp_oracle, lambda: id(listed[0]) == _EXP),
        "closure cell": (closure, _exp_oracle,
                         lambda: id(closure.__closure__[0].cell_contents) == _EXP),
        "default argument": (_default, _exp_oracle,
                             lambda: id(_default.__defaults__[0]) == _EXP),
        "partial": (partial, _exp_oracle, lambda: id(partial.func) == _EXP),
        "array method": (lambda x: methods["mul"](x, x), _square_oracle,
                         lambda: id(methods["mul"]) == _MUL),
    }


KINDS = list(_holders())


@pytest.fixture
def scan_due(monkeypatch):
    """The default mode's next block scans (as after a new reference to an MLX function)."""
    monkeypatch.setitem(holders.watch, "due", True)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "default"])
@pytest.mark.parametrize("kind", KINDS)
def test_held_function_is_extended_and_restored(kind, strict, scan_due):
    call, oracle, holds_original = _holders()[kind]
    assert holds_original()
    with mp.extended_precision(strict=strict) as report:
        x = _carried()
        assert not holds_original()  # the stand-in while the block is open
        y = call(x)
        expected = oracle(x)
    assert not report.float32
    assert sum(report.extended.values()) == 2  # x * 3, then the held function
    np.testing.assert_array_equal(np.array(y), expected)
    assert holds_original()  # MLX's own again
    z = mx.array(np.linspace(0.1, 4.2, 64, dtype=np.float32))
    np.testing.assert_array_equal(np.array(call(z)), np.array(
        mx.exp(z) if oracle is _exp_oracle else z * z))  # MLX's bits outside


@pytest.mark.parametrize("kind", ["attribute", "dict", "closure cell", "default argument"])
def test_without_the_scan_the_held_function_drops(kind, monkeypatch, scan_due):
    """The test above can fail: without the scan, MLX's own function consumes the
    carried value in float32, unseen on Python 3.11 (3.12+: reported, through
    sys.monitoring): the results are not all correctly rounded."""
    monkeypatch.setattr(holders, "rebind_held", lambda strict: None)
    monkeypatch.setattr(holders, "_places_held", [])  # (and none found before)
    call, oracle, _ = _holders()[kind]
    with mp.extended_precision() as report:
        x = _carried()
        y = call(x)
        expected = oracle(x)
    assert report.float32["exp"] == hasattr(sys, "monitoring")  # (3.12+: seen by the hook)
    assert report.extended["exp"] == 0
    assert np.any(np.array(y) != expected)


@pytest.mark.parametrize("kind", [tuple, frozenset])
def test_an_immutable_holder_raises_under_strict_and_warns_otherwise(kind, scan_due):
    frozen = kind([mx.exp])
    held = {"frozen": frozen}  # (the tuple is named through the dict that holds it)
    with pytest.raises(PrecisionDropError, match=f"{kind.__name__}.*'frozen'.*exp"):
        with mp.extended_precision(strict=True):
            pass
    assert dispatch._open == 0 and mx.exp is next(iter(held["frozen"]))  # all put back
    holders.watch["due"] = True
    with pytest.warns(RuntimeWarning, match="cannot be rebound"):
        with mp.extended_precision():
            pass
    holders.watch["due"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named once
        with mp.extended_precision():
            pass


def test_the_default_mode_scans_again_only_when_a_function_is_held_anew(scan_due):
    calls = []
    rebind = holders.rebind_held

    def counted(strict):
        calls.append(strict)
        rebind(strict)

    holders.rebind_held = counted
    try:
        with mp.extended_precision():
            pass
        for _ in range(20):  # nothing new holds an MLX function: no scan
            with mp.extended_precision():
                pass
        assert calls == [False]
        kept = [mx.exp]  # a new reference to mx.exp: scanned again
        with mp.extended_precision():
            assert kept[0] is not mx.exp.__wrapped__
        assert calls == [False, False]
        sys.modules["_held_functions_probe"] = types.ModuleType("_held_functions_probe")
        with mp.extended_precision():  # a module imported (it may bind mx.array)
            pass
        assert calls == [False, False, False]
        with mp.extended_precision(), mp.extended_precision(strict=True):
            pass  # strict scans (once per installation: the nested strict block here)
        assert calls == [False, False, False, True]
    finally:
        holders.rebind_held = rebind
        del sys.modules["_held_functions_probe"]


def test_strict_blocks_scan_until_every_reference_is_accounted_for(scan_due):
    """A strict scan that accounts for every reference to MLX's functions (all held
    by objects the collector tracks) seals them: later strict blocks scan only
    where a count changed (a holder made since), and one held where the collector
    cannot see it (here a local of another thread's running function) leaves them
    unsealed, so every strict block scans until it is gone."""
    calls = []
    rebind = holders.rebind_held

    def counted(strict):
        calls.append(strict)
        rebind(strict)

    def strict_block():
        with mp.extended_precision(strict=True):
            pass

    ready, done = threading.Event(), threading.Event()

    def hold():
        f = mx.sigmoid  # (a reference the collector does not see)
        ready.set()
        done.wait(60)
        del f

    holders.rebind_held = counted
    try:
        strict_block()
        assert holders.watch["sealed"]
        for _ in range(5):
            strict_block()
        assert calls == [True]
        late = [mx.exp]  # a holder made after the scan: its count tells
        with mp.extended_precision(strict=True):
            assert late[0] is not mx.exp.__wrapped__  # found and rebound
        assert calls == [True, True] and late[0] is mx.exp
        frozen = (mx.exp,)
        with pytest.raises(PrecisionDropError, match="tuple.*exp"):
            strict_block()
        del frozen
        thread = threading.Thread(target=hold)
        thread.start()
        ready.wait(60)
        strict_block()
        strict_block()
        assert not holders.watch["sealed"] and len(calls) == 5
        done.set()
        thread.join(60)
        strict_block()  # (the count fell: scanned, every reference accounted for)
        strict_block()
        assert holders.watch["sealed"] and len(calls) == 6
    finally:
        done.set()
        holders.rebind_held = rebind


def test_nested_blocks_and_a_strict_inner_block(monkeypatch):
    install = dispatch._install
    monkeypatch.setattr(dispatch, "_install", lambda: install() and False)  # no scan
    monkeypatch.setattr(dispatch, "_held_anew", lambda: False)  # (a new holder unseen)
    monkeypatch.setitem(holders.watch, "sealed", False)  # (so the strict block scans)
    table = {"exp": mx.exp}
    with mp.extended_precision():
        assert table["exp"] is mx.exp.__wrapped__  # the default block did not scan
        with mp.extended_precision(strict=True) as report:
            x = _carried()
            y = table["exp"](x)
            expected = _exp_oracle(x)
        assert table["exp"] is not mx.exp.__wrapped__  # until the last block closes
    assert table["exp"] is mx.exp
    assert report.extended["exp"] == 1
    np.testing.assert_array_equal(np.array(y), expected)


def test_other_threads_see_mlx_outside_their_blocks(scan_due):
    table = {"exp": mx.exp}
    z = mx.array(np.linspace(-3, 3, 64, dtype=np.float32))
    reference = np.array(mx.exp(z))
    opened, done, seen = threading.Event(), threading.Event(), []

    def other():
        opened.wait()
        seen.append((table["exp"] is mx.exp, np.array(table["exp"](z))))  # no block here
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with mp.extended_precision(strict=True) as report:
        opened.set()
        done.wait(30)
        x = _carried()
        y = table["exp"](x)
        expected = _exp_oracle(x)
    t.join()
    rebound, values = seen[0]
    assert rebound  # the holder holds the stand-in (mx.exp in a block) for every thread ...
    np.testing.assert_array_equal(values, reference)  # ... and runs MLX outside blocks
    assert report.extended["exp"] == 1 and table["exp"] is mx.exp
    np.testing.assert_array_equal(np.array(y), expected)


def _opener(x):
    with mp.extended_precision(strict=True) as report:
        f = sys._getframe(1).f_locals["f"]  # the caller's local, rebound by strict
        return f(x), _exp_oracle(x), report


def test_strict_rebinds_the_locals_of_the_calling_frames():
    f = mx.exp
    x = mx.array(np.linspace(0.1, 1.4, 64, dtype=np.float32))
    with mp.extended_precision():
        x = x * 3.0
    y, expected, report = _opener(x)
    assert report.extended["exp"] == 1
    np.testing.assert_array_equal(np.array(y), expected)
    assert f is mx.exp


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring: Python 3.12+")
def test_calls_the_rebinding_did_not_reach_are_reported_on_python_312(scan_due):
    """A tuple holding a function and a bound method of an array, made before the
    block: named at the open (a warning; strict=True raises), and their calls inside
    the block are seen by sys.monitoring (PEP 669) and reported."""
    with mp.extended_precision():
        x = _carried()
    frozen = (mx.exp, x.__mul__)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the tuple is named at the open)
        with mp.extended_precision() as report:
            frozen[0](x)
            frozen[1](x)
    assert report.float32 == {"exp": 1, "array.__mul__": 1}
    with pytest.raises(PrecisionDropError, match="tuple.*cannot be rebound"):
        with mp.extended_precision(strict=False):
            with mp.extended_precision(strict=True):
                pass  # (names the tuple: raises at the open)
    del frozen
    with mp.extended_precision() as report:  # the rules' own calls of MLX: not reported
        mx.exp(x)
    assert not report.float32


# ---- holders the first scan did not cover (issue 29) ------------------------------
# A holder found by an earlier scan (rebound at every later block, not only at the
# scanning one), a function stored after the last scan, ``staticmethod`` /
# ``classmethod`` wrappers, bound methods of one array, a local of the frame that
# runs ``with`` through a context-manager wrapper; objects implemented in C and
# suspended generators are named (strict=True raises, the default mode warns). The
# default mode is exercised without forcing a scan.


def _settled():
    """Open blocks until the default mode no longer scans (the state of a long run:
    the scan is behind us)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(3):
            with mp.extended_precision():
                pass


def _run(call, oracle=_exp_oracle, strict=False):
    with mp.extended_precision(strict=strict) as report:
        x = _carried()
        y = call(x)
        expected = oracle(x)
    return report, np.array(y), expected


def _assert_extended(report, y, expected, op="exp"):
    assert not report.float32, report
    assert report.extended[op] == 1, report
    np.testing.assert_array_equal(y, expected)


def test_a_holder_found_by_an_earlier_scan_is_rebound_at_every_block():
    table = {"exp": mx.exp}
    for _ in range(4):  # the first block scans; the later ones do not
        _assert_extended(*_run(lambda x: table["exp"](x)))
        assert table["exp"] is mx.exp


class _Box:
    def __init__(self):
        self.act = mx.abs


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_a_function_stored_after_the_last_scan(strict):
    box, table, cells = _Box(), {"act": mx.abs}, [mx.abs]
    _settled()
    box.act, table["act"], cells[0] = mx.exp, mx.exp, mx.exp  # (no import, no growth)
    for call in (lambda x: box.act(x), lambda x: table["act"](x), lambda x: cells[0](x)):
        _assert_extended(*_run(call, strict=strict))
    assert box.act is table["act"] is cells[0] is mx.exp


def test_a_replaced_holder_value_is_noticed():
    """A known holder reassigned between blocks while another one takes the function
    (the counts of references to mx.exp do not change)."""
    first, second = {"act": mx.exp}, {"act": mx.abs}
    _settled()
    first["act"], second["act"] = mx.abs, mx.exp
    _assert_extended(*_run(lambda x: second["act"](x)))


class _Static:
    act = staticmethod(mx.exp)


class _Classy:
    # (a classmethod of an MLX function receives the class first: mx.multiply(cls, ...)
    # is not useful, but the wrapper must not keep MLX's function inside a block)
    act = classmethod(mx.exp)


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_staticmethod_and_classmethod_wrappers(strict):
    _settled()
    _assert_extended(*_run(lambda x: _Static.act(x), strict=strict))
    _assert_extended(*_run(lambda x: _Static().act(x), strict=strict))
    with mp.extended_precision(strict=strict):
        assert vars(_Classy)["act"].__func__ is mx.exp  # (the stand-in inside)
    assert vars(_Static)["act"].__func__ is mx.exp and vars(_Classy)["act"].__func__ is mx.exp
    z = mx.array(np.linspace(-2, 2, 16, dtype=np.float32))
    np.testing.assert_array_equal(np.array(_Static.act(z)), np.array(mx.exp(z)))


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_bound_methods_of_one_array(strict):
    """``x.exp`` and ``x.__mul__`` of an array that carries a low word, bound between
    blocks and held in a dict and an attribute: the bound stand-in of the same array."""
    with mp.extended_precision():
        x = _carried()
    held = {"exp": x.exp}
    box = types.SimpleNamespace(mul=x.__mul__)
    _settled()
    with mp.extended_precision(strict=strict) as report:
        y, z = held["exp"](), box.mul(x)
    _assert_extended(report, np.array(y), _exp_oracle(x), op="exp")
    assert report.extended["__mul__"] == 1
    np.testing.assert_array_equal(np.array(z), _square_oracle(x))
    assert held["exp"].__func__ is mx.array.exp and held["exp"].__self__ is x


def test_a_bound_method_in_a_local_of_the_opening_frame():
    with mp.extended_precision():
        x = _carried()
    f = x.exp
    _settled()
    with mp.extended_precision() as report:
        y = f()
    _assert_extended(report, np.array(y), _exp_oracle(x))


def test_a_bound_method_held_only_by_a_tuple_is_named(scan_due):
    with mp.extended_precision():
        x = _carried()
    frozen = {"t": (x.exp,)}
    with pytest.raises(PrecisionDropError, match="exp"):
        with mp.extended_precision(strict=True):
            pass
    del frozen


@contextlib.contextmanager
def _precise(strict=False):
    """A user's wrapper around the block (the caller's ``with`` runs inside it)."""
    with mp.extended_precision(strict=strict) as report:
        yield report


class _Precise:
    def __enter__(self):
        self.block = mp.extended_precision()
        return self.block.__enter__()

    def __exit__(self, *exc):
        return self.block.__exit__(*exc)


@pytest.mark.parametrize("wrapper", [_precise, _Precise], ids=["generator", "class"])
def test_a_local_of_the_frame_running_with_through_a_wrapper(wrapper):
    f = mx.exp
    _settled()
    with wrapper() as report:
        x = _carried()
        y = f(x)
        expected = _exp_oracle(x)
    _assert_extended(report, np.array(y), expected)
    assert f is mx.exp


def test_a_thread_with_its_own_wrapped_block():
    """Locals are a thread's own: the thread that opens a block rebinds them (here a
    local bound before any block, used through a wrapper opened while another
    thread's block is open)."""
    bound, opened, out = threading.Event(), threading.Event(), []

    def work():
        f = mx.exp
        bound.set()
        opened.wait(60)
        with _precise() as report:
            x = _carried()
            out.append((report, np.array(f(x)), _exp_oracle(x)))

    _settled()
    t = threading.Thread(target=work)
    t.start()
    bound.wait(60)
    with mp.extended_precision():
        opened.set()
        t.join(60)
    _assert_extended(*out[0])


def test_an_lru_cache_wrapper_is_named(scan_due):
    cached = {"f": functools.lru_cache(mx.exp)}
    with pytest.raises(PrecisionDropError, match="lru_cache_wrapper.*exp"):
        with mp.extended_precision(strict=True):
            pass
    holders.watch["due"] = True
    with pytest.warns(RuntimeWarning, match="lru_cache_wrapper.*cannot be rebound"):
        with mp.extended_precision():
            pass
    del cached


def test_a_suspended_generator_holding_a_function_is_named(scan_due):
    def gen():
        f = mx.exp
        x = yield
        yield f(x)

    g = gen()
    next(g)
    with pytest.raises(PrecisionDropError, match="generator.*exp"):
        with mp.extended_precision(strict=True):
            pass
    g.close()


def test_outside_blocks_mlx_is_unchanged():
    """After all the above, the holders and MLX's names hold MLX's functions."""
    _settled()
    assert vars(_Static)["act"].__func__ is mx.exp
    assert dispatch._open == 0


def test_a_module_global_bound_to_mlx_array_is_the_constructor_inside(scan_due):
    """``from mlx.core import array`` in a module imported before the block: inside it
    ``array(x)`` copies the low word x carries, as ``mx.array`` does."""
    module = types.ModuleType("_held_class_probe")
    module.array = mx.array
    sys.modules[module.__name__] = module
    try:
        with mp.extended_precision():
            x = _carried()
            a = module.array(x)
        np.testing.assert_array_equal(np.array(a), np.array(x))
        np.testing.assert_array_equal(np.array(low_word(a)), np.array(low_word(x)))
        assert module.array is ARRAY
    finally:
        del sys.modules[module.__name__]


_FILLING = """
import mlx.core as mx, mlx_precise as mp
held = [mx.exp]  # a holder, so that a scan runs
def f():
    with mp.extended_precision(strict={strict}):
        y = mx.array([0.5]) * 3.0
    return float(y[0])
# tuple() fills its tuple from the generator while the blocks run: it has empty slots
print(tuple(max(f() for _ in range(2)) for k in "ab"))
"""


@pytest.mark.parametrize("strict", [False, True])
def test_a_block_inside_a_tuple_being_filled(strict):
    """A block opened by a generator that ``tuple()`` is consuming: the heap scan
    meets a tuple with empty slots (it crashed the interpreter, SIGSEGV, reading
    one), and skips it."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _FILLING.format(strict=strict)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.strip() == "(1.5, 1.5)"
