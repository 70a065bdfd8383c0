"""The CEL subset of packing.dra.cel: table cases of the selectors DeviceClasses and claims
use (attributes, capacity, quantities, semvers, CEL's error absorption), the cases that
must be UNKNOWN, and a property against cel-python for CEL's core operators on plain
values (cel-python lacks Kubernetes' libraries and heterogeneous equality, so only
same-typed ints, strings and bools are compared)."""

from __future__ import annotations

import celpy
import pytest
from dra_builders import device, semver
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.dra.cel import Outcome, compile_expression, evaluate

GPU = device("gpu-0", attrs={
    "type": "gpu", "productName": "NVIDIA H100 80GB HBM3", "architecture": "Hopper",
    "driverVersion": semver("580.126.20"), "cudaComputeCapability": semver("9.0.0"),
    "resource.kubernetes.io/pciBusID": "0000:18:00.0", "resource.kubernetes.io/numaNode": 1,
    "healthy": True}, capacity={"memory": "80Gi", "multiprocessors": 132})
MIG = device("gpu-0-mig-1g10gb-19-0", attrs={"type": "mig", "profile": "1g.10gb",
                                             "parentUUID": "GPU-1"},
             capacity={"memory": "9984Mi"})
D = "gpu.nvidia.com"
A = "device.attributes['gpu.nvidia.com']"
T, F, E, U = Outcome.TRUE, Outcome.FALSE, Outcome.ERROR, Outcome.UNKNOWN


@pytest.mark.parametrize(("expr", "dev", "want"), [
    # the NVIDIA chart's classes and the documented claim selectors
    (f"device.driver == '{D}' && {A}.type == 'gpu'", GPU, T),
    (f"device.driver == '{D}' && {A}.type == 'mig'", GPU, F),
    (f"{A}.profile == '1g.10gb'", MIG, T),
    ('device.attributes["gpu.nvidia.com"]["profile"] == "1g.10gb"', MIG, T),
    (f"{A}.profile in ['2g.20gb', '1g.10gb']", MIG, T),
    (f"{A}.profile in ['2g.20gb']", MIG, F),
    # a missing attribute is a runtime error ...
    (f"{A}.profile == '1g.10gb'", GPU, E),
    # ... which && and || absorb when the other side decides, in either order
    (f"{A}.type == 'mig' && {A}.profile == '1g.10gb'", GPU, F),
    (f"{A}.profile == '1g.10gb' && {A}.type == 'mig'", GPU, F),
    (f"{A}.profile == '1g.10gb' || {A}.type == 'gpu'", GPU, T),
    (f"{A}.profile == '1g.10gb' || {A}.type == 'mig'", GPU, E),
    (f"has({A}.profile) && {A}.profile == '1g.10gb'", GPU, F),
    (f"has({A}.profile)", MIG, T),
    # another domain is an empty map: a key of it is an error, a domain test is false
    ("device.attributes['other.com'].x == 1", GPU, E),
    ("'other.com' in device.attributes", GPU, F),
    (f"'{D}' in device.attributes", GPU, T),
    ("'productName' in device.attributes['gpu.nvidia.com']", GPU, T),
    # standard attributes live in their own domain
    ("device.attributes['resource.kubernetes.io'].numaNode == 1", GPU, T),
    ("device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:18')", GPU, T),
    # capacity is quantities, compared with the quantity library
    ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0", GPU, T),
    ("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('80Gi'))", GPU, F),
    ("device.capacity['gpu.nvidia.com'].memory.isLessThan(quantity('10Gi'))", MIG, T),
    ("device.capacity['gpu.nvidia.com'].memory == quantity('81920Mi')", GPU, T),
    ("device.capacity['gpu.nvidia.com'].multiprocessors.asInteger() > 100", GPU, T),
    ("device.capacity['gpu.nvidia.com'].memory.add(quantity('1Gi'))"
     ".isGreaterThan(quantity('80Gi'))", GPU, T),
    ("quantity('1.5Gi').sign() == 1 && isQuantity('12X') == false", GPU, T),
    ("quantity('12X').sign() == 1", GPU, E),
    # versions are semvers
    (f"{A}.driverVersion.isGreaterThan(semver('550.0.0'))", GPU, T),
    (f"{A}.driverVersion.compareTo(semver('580.126.20')) == 0", GPU, T),
    (f"{A}.cudaComputeCapability.major() >= 9", GPU, T),
    (f"{A}.driverVersion == semver('580.126.20')", GPU, T),
    ("semver('v1.2', true) == semver('1.2.0')", GPU, T),
    ("isSemver('1.02.3') == false && semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))",
     GPU, T),
    # heterogeneous equality is false, ordering across types an error
    (f"{A}.architecture == 9", GPU, F),
    (f"{A}.architecture != 9", GPU, T),
    (f"{A}.architecture > 9", GPU, E),
    ("1 == 1.0 && 2 < 2.5", GPU, T),
    # arithmetic, ternary, strings
    ("(7 / 2) * 2 + 7 % 2 == 7 && -7 / 2 == -3 && -7 % 2 == -1", GPU, T),
    ("1 / 0 == 1", GPU, E),
    ("9223372036854775807 + 1 > 0", GPU, E),
    (f"{A}.healthy ? {A}.type == 'gpu' : false", GPU, T),
    (f"size({A}.productName) > 4 && {A}.productName.contains('H100')", GPU, T),
    (f"{A}.architecture.lowerAscii() == 'hopper'", GPU, T),
    ("device.allowMultipleAllocations == false", GPU, T),
    ("[1, 2, 3][1] == 2 && size([1, 2]) == 2", GPU, T),
    ("r'a\\b' == 'a\\\\b' && \"\"\"x\"\"\" == 'x' && '\\u00e9' == 'é'", GPU, T),
    # a non-bool result is an error
    (f"{A}.productName", GPU, E),
])
def test_selectors(expr: str, dev: object, want: Outcome) -> None:
    assert evaluate(expr, dev, D).outcome is want  # type: ignore[arg-type]


@pytest.mark.parametrize("expr", [
    f"{A}.productName.matches('^NVIDIA')",  # regex: not evaluated
    "device.attributes['gpu.nvidia.com'].exists(k, k == 'type')",  # comprehension macros
    "{'a': 1}['a'] == 1",  # map literals
    "1u == 1u",  # unsigned ints
    "b'abc' == b'abc'",  # bytes
    "timestamp('2026-01-01T00:00:00Z') < now",  # timestamps, unknown identifiers
    "device.attributes['gpu.nvidia.com'].type.foo()",
    "quantity('-1').sign() == -1",  # a negative quantity
    "ip('10.0.0.1').family() == 4",
    "device.driver ==",  # not even CEL: a parse failure is unknown, never an error
])
def test_outside_the_subset_is_unknown(expr: str) -> None:
    assert evaluate(expr, GPU, D).outcome is U


@pytest.mark.parametrize(("expr", "want"), [
    # an unknown part decided by the other side of && / || stays decided ...
    (f"{A}.type == 'mig' && {A}.profile.matches('1g')", F),
    (f"{A}.type == 'gpu' || {A}.productName.matches('1g')", T),
    # ... but not otherwise; and an error beats an unknown in a strict function
    (f"{A}.type == 'gpu' && {A}.productName.matches('H100')", U),
    (f"{A}.productName.matches('1g') == (1 / 0 == 1)", E),
])
def test_unknown_meets_logic(expr: str, want: Outcome) -> None:
    assert evaluate(expr, GPU, D).outcome is want


def test_parsing_is_cached_and_pure() -> None:
    expr = f"{A}.type == 'gpu'"
    assert compile_expression(expr) is compile_expression(expr)
    assert evaluate(expr, GPU, D).outcome is T and evaluate(expr, MIG, D).outcome is F


# -- against cel-python --------------------------------------------------------------------

_INTS = st.integers(min_value=-50, max_value=50).map(str)
_STRS = st.sampled_from(["'a'", "'b'", "'ab'", "''"])


def _int_expr() -> st.SearchStrategy[str]:
    return st.recursive(_INTS, lambda sub: st.one_of(
        st.tuples(sub, st.sampled_from(["+", "-", "*", "/", "%"]), sub).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(_bool_leaf(sub), sub, sub).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})")),
        max_leaves=6)


def _bool_leaf(ints: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    cmp = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])
    return st.one_of(
        st.sampled_from(["true", "false"]),
        st.tuples(ints, cmp, ints).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(_STRS, cmp, _STRS).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(ints, st.lists(_INTS, max_size=3)).map(
            lambda t: f"({t[0]} in [{', '.join(t[1])}])"))


_BOOL = st.recursive(_bool_leaf(_int_expr()), lambda sub: st.one_of(
    st.tuples(sub, st.sampled_from(["&&", "||"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    sub.map(lambda s: f"!{s}")), max_leaves=8)


# cel-python's parser raises the recursion limit for itself.
@pytest.mark.filterwarnings("ignore:The recursion limit will not be reset")
@settings(max_examples=300, deadline=None)
@given(_BOOL)
def test_core_operators_agree_with_cel_python(expr: str) -> None:
    env = celpy.Environment()
    try:
        got = env.program(env.compile(expr)).evaluate({})
        want = Outcome.TRUE if bool(got) else Outcome.FALSE
        if isinstance(got, celpy.CELEvalError):
            want = Outcome.ERROR
    except celpy.CELEvalError:
        want = Outcome.ERROR
    assert evaluate(expr, GPU, D).outcome is want, expr
