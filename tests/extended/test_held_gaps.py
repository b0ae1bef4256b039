"""The holders of MLX's functions that the first heap scan did not cover (issue 29):
a holder found by an earlier scan (rebound at every later block, not only at the
scanning one), a function stored after the last scan, ``staticmethod`` /
``classmethod`` wrappers, bound methods of one array, a local of the frame that
runs ``with`` through a context-manager wrapper, and objects implemented in C or
suspended generators (named: strict=True raises, the default mode warns). Each
test runs its holder in a block and compares with an mpmath oracle of the exact
double-word operand; the default mode is exercised without forcing a scan."""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import warnings

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import PrecisionDropError, dispatch

from test_held_functions import _carried, _exp_oracle, _square_oracle


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


@pytest.fixture
def scan_due(monkeypatch):
    monkeypatch.setitem(dispatch._watch, "due", True)


def test_an_lru_cache_wrapper_is_named(scan_due):
    cached = {"f": functools.lru_cache(mx.exp)}
    with pytest.raises(PrecisionDropError, match="lru_cache_wrapper.*exp"):
        with mp.extended_precision(strict=True):
            pass
    dispatch._watch["due"] = True
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
