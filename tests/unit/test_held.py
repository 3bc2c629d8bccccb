"""HeldError: an application callback's exception waits for the next call, and nothing else changes."""

from __future__ import annotations

from typing import Any

import pytest

from fastrecover.held import CONFIG_CALLBACKS, HeldError, held_callbacks
from fastrecover.steady import SteadyGate


def test_the_first_error_is_raised_once_by_the_next_call() -> None:
    held = HeldError()
    held.raise_held()  # nothing held: nothing raised
    first, second = ValueError("first"), KeyError("second")
    held.hold(first)
    held.hold(second)  # confluent_kafka keeps the first of a call's errors too
    with pytest.raises(ValueError, match="first"):
        held.raise_held()
    held.raise_held()  # raised once: gone


def test_a_guarded_callback_returns_what_the_callback_returns_and_holds_what_it_raises() -> None:
    held = HeldError()
    seen: list[tuple[Any, ...]] = []

    def ok(*args: Any) -> str:
        seen.append(args)
        return "answer"

    def fails(*_args: Any) -> None:
        raise RuntimeError("the application's callback fails")

    assert held.guarded(ok)(1, 2) == "answer" and seen == [(1, 2)]
    assert held.guarded(fails)("consumer", []) is None
    with pytest.raises(RuntimeError, match="callback fails"):
        held.raise_held()


@pytest.mark.parametrize("exit_error", [KeyboardInterrupt, SystemExit])
def test_what_ends_the_process_is_not_held(exit_error: type[BaseException]) -> None:
    held = HeldError()

    def leaves(*_args: Any) -> None:
        raise exit_error

    with pytest.raises(exit_error):
        held.guarded(leaves)()
    held.raise_held()  # nothing was held


def test_a_held_error_ends_the_steady_run_so_the_next_poll_takes_the_path_that_raises_it() -> None:
    gate = SteadyGate()
    gate.fast_calls = 64
    held = HeldError()
    held.ends_runs_of(gate)
    held.hold(RuntimeError("x"))
    assert gate.fast_calls == 0


def test_only_the_applications_callbacks_in_the_configuration_are_guarded() -> None:
    def callback(*_args: Any) -> None:
        raise RuntimeError("raised by " + str(_args))

    conf: dict[str, Any] = {key: callback for key in CONFIG_CALLBACKS}
    conf.update({"group.id": "g", "oauth_cb": callback, "error_cb": callback})
    guarded, held = held_callbacks(conf)
    assert conf["error_cb"] is callback, "the application's configuration is not changed"
    assert guarded["group.id"] == "g" and guarded["oauth_cb"] is callback
    for key in CONFIG_CALLBACKS:
        assert guarded[key] is not callback
        guarded[key]("err")
        with pytest.raises(RuntimeError, match="raised by"):
            held.raise_held()
    assert held_callbacks({"on_commit": None})[0] == {"on_commit": None}
