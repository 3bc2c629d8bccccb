"""The extension's interface number: a ``_fastpoll`` built from another ``_fastpoll.c`` is refused, loudly."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from fastrecover import _accel


def test_the_shipped_extension_carries_this_codes_interface() -> None:
    import fastrecover._fastpoll as built

    assert built.ABI == _accel.ABI, "rebuild the extension: `make venv`"
    assert _accel.checked(built) is built


@pytest.mark.parametrize("stale", [SimpleNamespace(), SimpleNamespace(ABI=_accel.ABI - 1)], ids=["unnumbered", "older"])
def test_a_module_of_another_interface_is_refused_with_the_cause_and_the_fix(
    stale: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    stale.__file__ = "/venv/fastrecover/_fastpoll.so"
    with caplog.at_level(logging.WARNING, logger="fastrecover.accel"):
        assert _accel.checked(stale) is None
    (record,) = caplog.records
    assert "/venv/fastrecover/_fastpoll.so" in record.message and "make venv" in record.message
    assert f"needs {_accel.ABI}" in record.message
