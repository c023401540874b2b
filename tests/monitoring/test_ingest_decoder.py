"""The reader's fast NodeSample decoder accepts and refuses exactly what the schema does.

``monitoring.services.ingest.decode_sample`` (msgspec, with the schema as its fallback) against
``agents.protocol.decode_sample`` (pydantic) on generated messages: valid ones, valid ones with one
field pushed to or past a bound, given the wrong type, dropped or doubled, and raw-text mutations.
Same outcome, same values when accepted, same reason when refused.
"""

import json

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents import protocol
from monitoring.services.ingest import FastNodeSample, decode_sample

P = protocol


def _bounded_int(lo, hi):
    return st.one_of(st.sampled_from([lo, hi, lo + 1, hi - 1]), st.integers(lo, hi))


def _bounded_float(lo, hi):
    return st.one_of(st.sampled_from([float(lo), float(hi), lo, hi]), st.floats(lo, hi))


def _optional(strategy):
    return st.one_of(st.none(), strategy)


gpu_fields = {
    "index": _bounded_int(0, P.MAX_GPUS - 1),
    "util_sm": _optional(_bounded_float(0, 100)),
    "util_mem": _optional(_bounded_float(0, 100)),
    "mem_used_mib": _optional(_bounded_int(0, P.MEMORY_MIB_MAX)),
    "mem_total_mib": _optional(_bounded_int(0, P.MEMORY_MIB_MAX)),
    "temperature_c": _optional(_bounded_float(P.TEMPERATURE_C_MIN, P.TEMPERATURE_C_MAX)),
    "power_w": _optional(_bounded_float(0, P.POWER_W_MAX)),
    "sm_clock_mhz": _optional(_bounded_int(0, P.CLOCK_MHZ_MAX)),
    "mem_clock_mhz": _optional(_bounded_int(0, P.CLOCK_MHZ_MAX)),
    "ecc_uncorrected": _optional(_bounded_int(0, P.COUNTER_MAX)),
    "xid_events": st.lists(_bounded_int(0, P.XID_MAX), max_size=3),
}
job_fields = {
    "job_id": _bounded_int(1, P.ID_MAX),
    "gpu_index": _bounded_int(0, P.MAX_GPUS - 1),
    "mem_used_mib": _bounded_int(0, P.MEMORY_MIB_MAX),
    "util_sm": _optional(_bounded_float(0, 100)),
}
REQUIRED_GPU, REQUIRED_JOB = {"index"}, {"job_id", "gpu_index", "mem_used_mib"}


def _record(fields, required):
    """A dict with every required field and any subset of the optional ones."""
    optional = sorted(set(fields) - required)
    return st.lists(st.sampled_from(optional), unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries({name: fields[name] for name in sorted(required) + chosen}))


node_names = st.one_of(st.sampled_from(["n1", "bench-00001", "a" * 63, "x.y_z-1"]),
                       st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z"))
top_fields = {
    "v": st.just(1),
    "kind": st.just("node_sample"),
    "node": node_names,
    "ts": _bounded_float(0, P.UNIX_TIME_MAX),
    "seq": _bounded_int(0, P.ID_MAX),
    "gpus": st.lists(_record(gpu_fields, REQUIRED_GPU), max_size=4),
    "jobs": st.lists(_record(job_fields, REQUIRED_JOB), max_size=3),
    "unattributed_mib": st.dictionaries(st.integers(0, P.MAX_GPUS - 1).map(str), _bounded_int(0, P.MEMORY_MIB_MAX),
                                        max_size=3),
    "running_jobs": st.lists(_bounded_int(1, P.ID_MAX), max_size=3),
    "running_launches": st.lists(st.text(max_size=64), max_size=2),
    "duty_cycles": st.lists(_bounded_float(0, 1), max_size=3),
}
valid_samples = _record(top_fields, {"v", "node", "ts", "seq", "gpus"})

# What a field may be replaced with: just past a bound, the wrong type, a lax form of the right one.
odd_values = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 64, 101, -0.0, 1.0, 1.5, "1", "5", "", "n1\n", " n1", "é",
                     [], {}, [1], {"0": 1}, 2**63, 2**63 - 1, 2**64, -(2**63), 1e308, 4_102_444_800.5,
                     16 * 1024 * 1024 + 1, 2**31, 10_000.0001, 200.0001, -100.0001, "node_sample", "x" * 65,
                     "\ud800", "\x00", {"index": 0}, [{"index": 64}], {"00": 1}, {"+1": 1}, {"64": 1}, {" 1": 1}]),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5),
)


@st.composite
def mutated_samples(draw):
    sample = draw(valid_samples)
    where = draw(st.sampled_from(["top", "gpu", "job", "drop", "extra", "none"]))
    if where == "top":
        sample[draw(st.sampled_from(sorted(top_fields)))] = draw(odd_values)
    elif where == "gpu" and sample.get("gpus"):
        gpu = draw(st.sampled_from(sample["gpus"]))
        gpu[draw(st.sampled_from(sorted(gpu_fields)))] = draw(odd_values)
    elif where == "job" and sample.get("jobs"):
        job = draw(st.sampled_from(sample["jobs"]))
        job[draw(st.sampled_from(sorted(job_fields)))] = draw(odd_values)
    elif where == "drop":
        sample.pop(draw(st.sampled_from(sorted(sample))))
    elif where == "extra":
        target = draw(st.sampled_from([sample, *sample.get("gpus", []), *sample.get("jobs", [])]))
        target[draw(st.sampled_from(["extra", "V", "Index", "sig"]))] = draw(odd_values)
    return sample


def _text(sample, how: str) -> str:
    text = json.dumps(sample, allow_nan=True)
    if how == "bom":
        return "\ufeff" + text
    if how == "spaces":
        return f" \n\t{text}\r\n"
    if how == "truncated":
        return text[:-1]
    if how == "duplicate_ts":  # a key twice: both parsers keep the last one
        return text[:-1] + ', "ts": 1e999}' if text.endswith("}") else text
    if how == "nan":
        return text.replace('"ts": ', '"ts": NaN, "x": ', 1)
    return text


def outcome(decode, fields):
    try:
        message = decode(fields)
    except protocol.ProtocolError as exc:
        return "refused", exc.reason
    values = msgspec.to_builtins(message) if isinstance(message, FastNodeSample) else message.model_dump()
    # Types matter as well as values (1 vs 1.0): compare what JSON would carry.
    return "accepted", json.dumps(values, sort_keys=True, default=str)


def assert_same(fields):
    assert outcome(decode_sample, fields) == outcome(protocol.decode_sample, fields)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_samples, st.sampled_from(["bytes", "str"]))
def test_valid_samples_decode_to_the_same_values(sample, encoding):
    raw = json.dumps(sample)
    fields = {b"m": raw.encode()} if encoding == "bytes" else {"m": raw}
    assert outcome(protocol.decode_sample, fields)[0] == "accepted"
    assert_same(fields)
    assert isinstance(decode_sample(fields), FastNodeSample)  # the fast path took it


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_samples(), st.sampled_from(["plain", "plain", "plain", "bom", "spaces", "truncated", "duplicate_ts",
                                           "nan"]),
       st.sampled_from(["bytes", "str"]), st.sampled_from([None, "sig", "other"]))
@example({"v": 1, "node": "n1\n", "ts": 1, "seq": 1, "gpus": []}, "plain", "bytes", None)
@example({"v": 1, "node": "n1", "ts": 1, "seq": 1, "gpus": [], "unattributed_mib": {"01": 5}}, "plain", "bytes", None)
@example({"v": 1, "node": "n1", "ts": 1, "seq": 1, "gpus": [{"index": 1.0}]}, "plain", "bytes", None)
@example({"v": 1, "node": "n1", "ts": "1", "seq": 1, "gpus": []}, "plain", "bytes", None)
@example({"v": True, "node": "n1", "ts": 1, "seq": 1, "gpus": []}, "plain", "bytes", None)
def test_mutated_samples_get_the_same_verdict_and_reason(sample, how, encoding, extra_field):
    raw = _text(sample, how)
    fields = {b"m": raw.encode("utf-8", "surrogatepass")} if encoding == "bytes" else {"m": raw}
    if extra_field == "sig":
        fields[b"sig"] = b"00"
    elif extra_field == "other":
        fields[b"other"] = b"x"
    assert_same(fields)


@pytest.mark.parametrize("fields", [
    {},
    {b"m": b"\xc3\x28 not utf-8"},
    {b"m": b"{}" + b" " * protocol.MAX_MESSAGE_BYTES},
    {b"m": b"[]"},
    {b"m": b"null"},
    {"m": '{"v": 1, "node": "n1", "ts": 1, "seq": 1, "gpus": []}', b"m": b"{}"},
])
def test_envelope_errors_are_the_schemas(fields):
    assert_same(fields)
