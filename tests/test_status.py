"""core.status: each typed status is written and read by the same code; a reader never defaults (no ROS).

Properties over every status type: what ``encode`` writes, ``decode`` reads back equal; a missing key is a
:class:`MissingStatusKey` naming it; a value of the wrong type is a :class:`BadStatusValue`; extras cannot
overwrite a typed key.
"""

from __future__ import annotations

import dataclasses
import math
from typing import get_type_hints

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rynn_teleop.core import status as status_module
from rynn_teleop.core.layout import SIDES
from rynn_teleop.core.session import DRIVERS
from rynn_teleop.core.status import (
    STATUS_OF_NODE,
    ArmIKStatus,
    BadStatusValue,
    Count,
    DriverStatus,
    Meter,
    MissingStatusKey,
    RecorderStatus,
    Status,
    StatusError,
    StatusKeyCollision,
    decode_meters,
    encode_meters,
)
from rynn_teleop.errors import RynnTeleopError

STATUSES = sorted({cls for cls in vars(status_module).values()
                   if isinstance(cls, type) and issubclass(cls, Status) and cls is not Status},
                  key=lambda cls: cls.__name__)
TEXT = st.text(max_size=40)  # any characters: separators, quotes, newlines, non-ASCII


def _strategy(hint, fmt: str):
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-(2**62), 2**62)
    if hint is float:  # values that survive the field's format (what the reader can get back)
        floats = st.floats(-1e6, 1e6, allow_nan=False)
        return floats.map(lambda v: float(format(v, fmt))) if fmt else floats
    if hint is str:
        return TEXT
    if hint == tuple[str, ...]:
        return st.lists(TEXT, max_size=4).map(tuple)
    if hint is Count:
        return st.builds(Count, st.integers(0, 10_000), st.integers(0, 10_000))
    if hint == dict[str, bool]:
        return st.fixed_dictionaries({s: st.booleans() for s in SIDES})
    raise AssertionError(f"no strategy for {hint}")


def statuses(cls):
    hints = get_type_hints(cls)
    return st.builds(cls, **{f.name: _strategy(hints[f.name], f.metadata.get("fmt", ""))
                             for f in dataclasses.fields(cls)})


ANY_STATUS = st.sampled_from(STATUSES).flatmap(statuses)


def test_every_status_type_is_covered_and_every_reader_has_one():
    assert {c.__name__ for c in STATUSES} == {"ArmIKStatus", "DriverStatus", "FeedStatus", "RecorderStatus",
                                              "ConsoleStatus", "TwinStatus", "PolicyStatus"}
    assert set(STATUS_OF_NODE.values()) == set(STATUSES)
    assert {"arm_ik", "camera_switch", "recorder", *DRIVERS} <= set(STATUS_OF_NODE)
    for cls in STATUSES:  # no two fields share a key: each key has one writer field
        assert len(set(cls.keys())) == len(cls.keys()), cls


@given(ANY_STATUS)
def test_what_is_written_reads_back_equal(status):
    values = status.encode()
    assert set(values) == set(type(status).keys()) and all(isinstance(v, str) for v in values.values())
    assert type(status).decode(values) == status
    # other keys beside it (meters, counters for people) do not matter to the reader
    assert type(status).decode({**values, "x.rate_hz": "1.0", "cycles": "7"}) == status


@given(ANY_STATUS, st.data())
def test_a_missing_key_is_a_named_error_never_a_default(status, data):
    values = status.encode()
    key = data.draw(st.sampled_from(sorted(values)))
    del values[key]
    with pytest.raises(MissingStatusKey) as err:
        type(status).decode(values)
    assert err.value.key == key and key in str(err.value) and isinstance(err.value, RynnTeleopError)
    assert set(err.value.present) == set(values)


BAD = {"engaged": "true", "estop": "1", "episode_messages": "4.5", "episode_elapsed_s": "fast",
       "episode_problems": "a; b", "topics_flowing": "3", "fallback_active": "", "left.active": "yes"}


@pytest.mark.parametrize("key,text", sorted(BAD.items()))
@given(data=st.data())
def test_a_value_of_another_type_is_a_named_error(key, text, data):
    (cls,) = [c for c in STATUSES if key in c.keys()]
    values = data.draw(statuses(cls)).encode()
    values[key] = text
    with pytest.raises(BadStatusValue) as err:
        cls.decode(values)
    assert err.value.key == key and err.value.value == text and repr(text) in str(err.value)


def test_the_constructor_validates_and_normalises():
    arm = ArmIKStatus(np.bool_(True), False, True, {"left": np.bool_(False), "right": True})
    assert arm.calibrated is True and arm.following["left"] is False  # numpy scalars become Python ones
    with pytest.raises(BadStatusValue, match="estop = 'True' is not True or False"):
        DriverStatus("sim", "track", "True", "", (), "active", "")  # a string where a flag belongs
    with pytest.raises(BadStatusValue, match="faults"):
        DriverStatus("sim", "track", False, "", "overcurrent", "active", "")  # a string is not a list of faults
    with pytest.raises(BadStatusValue, match="following"):
        ArmIKStatus(True, True, True, {"left": True})  # a side missing
    with pytest.raises(BadStatusValue, match="messages"):
        RecorderStatus(False, "", "/d", 0.0, 1.5, (), Count(0, 0), Count(0, 0), "")


def test_extras_cannot_overwrite_a_typed_key():
    driver = DriverStatus("sim", "track", False, "", (), "active", "")
    values = driver.values({"loop_errors": 0, "backend.temperature_c": 41})
    assert values["loop_errors"] == 0 and values["backend"] == "sim"
    with pytest.raises(StatusKeyCollision, match="estop"):
        driver.values({"estop": False})


def test_a_status_field_of_an_unknown_type_is_refused_when_used():
    @dataclasses.dataclass(frozen=True)
    class Odd(Status):
        PRODUCER = "test"
        things: list

    with pytest.raises(TypeError, match="cannot be"):
        Odd([1])


meter_floats = st.floats(0.0, 1e5, allow_nan=False)


@given(st.lists(st.builds(
    Meter, st.from_regex(r"[a-z_]{1,10}(\.[a-z]{1,5})?", fullmatch=True), meter_floats.map(lambda v: round(v, 1)),
    st.one_of(st.just(math.nan), st.integers(1, 1000).map(float)),
    meter_floats.map(lambda v: round(v, 2)), meter_floats.map(lambda v: round(v, 2)),
    st.one_of(st.just(math.nan), st.integers(1, 100).map(float))), unique_by=lambda m: m.name, max_size=5))
def test_meters_read_back_with_their_optional_parts(meters):
    values = encode_meters(meters)
    got = decode_meters(values)
    assert [m.name for m in got] == sorted(m.name for m in meters)
    by_name = {m.name: m for m in meters}
    for m in got:
        want = by_name[m.name]
        for part in Meter._fields[1:]:
            a, b = getattr(m, part), getattr(want, part)
            assert (math.isnan(a) and math.isnan(b)) or a == b, (m.name, part)
    assert all(f"{m.name}.nominal_hz" not in values for m in meters if math.isnan(m.nominal_hz))


def test_a_malformed_meter_is_a_named_error():
    with pytest.raises(BadStatusValue, match="command.latency_p99_ms"):
        decode_meters({"command.rate_hz": "200.0", "command.latency_p99_ms": "n/a"})
    assert issubclass(BadStatusValue, StatusError)
