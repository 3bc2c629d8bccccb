"""Pure logic of the store: row validation, progress merging, URL masking."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrecover.completion_map import encode_completed
from fastrecover.errors import CorruptTokenError
from fastrecover.ranges import RangeProgress
from fastrecover.store import mask_url
from fastrecover.store.models import merge_progress, token_from_row
from fastrecover.store.schema import upgrade_command
from fastrecover.tokens import TokenState


def _row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": 7,
        "group_id": "g",
        "topic": "t",
        "partition": 2,
        "start_offset": 100,
        "end_offset": 200,
        "committed_offset": 120,
        "completed": encode_completed(120, [125, 126, 190]),
        "skipped": 3,
        "owner": "w",
        "epoch": 4,
        "state": "open",
    }
    row.update(overrides)
    return row


def test_valid_row_becomes_token() -> None:
    token = token_from_row(_row())
    assert token.id == 7 and token.key.topic == "t" and token.partition == 2
    assert token.progress == RangeProgress(100, 200, 120, frozenset({125, 126, 190}))
    assert (token.skipped, token.owner, token.epoch, token.state) == (3, "w", 4, TokenState.OPEN)


def test_null_completion_map_and_owner_are_accepted() -> None:
    token = token_from_row(_row(completed=None, owner=None))
    assert token.progress.completed == frozenset() and token.owner is None


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"end_offset": 99}, "end_offset"),
        ({"start_offset": -1, "committed_offset": 0}, "start_offset"),
        ({"committed_offset": 201, "completed": ""}, "committed_offset"),
        ({"committed_offset": 99, "completed": ""}, "committed_offset"),
        ({"state": "Open"}, "state"),
        ({"state": "done"}, "state"),  # done but committed < end
        ({"completed": "1r!!"}, "completed"),
        ({"completed": encode_completed(120, [250])}, "completed"),  # beyond the range end
        ({"completed": 42}, "completed"),
        ({"partition": -1}, "partition"),
        ({"skipped": -5}, "skipped"),
        ({"epoch": -1}, "epoch"),
        ({"epoch": "1"}, "epoch"),
        ({"group_id": ""}, "group_id"),
        ({"owner": 12}, "owner"),
    ],
)
def test_corrupt_row_names_id_and_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(CorruptTokenError) as info:
        token_from_row(_row(**overrides))
    assert f"row id=7: field {field}=" in str(info.value)


def test_corrupt_completion_map_keeps_codec_error_as_cause() -> None:
    with pytest.raises(CorruptTokenError) as info:
        token_from_row(_row(completed="1bA"))
    assert info.value.__cause__ is not None


def _progress(start: int, size: int, data: st.DataObject) -> RangeProgress:
    end = start + size
    committed = data.draw(st.integers(start, end))
    above = list(range(committed + 1, end))
    completed = data.draw(st.frozensets(st.sampled_from(above), max_size=8)) if above else frozenset()
    return RangeProgress(start, end, committed, completed)


@given(st.integers(0, 1000), st.integers(0, 60), st.data())
def test_merge_never_loses_ground(start: int, size: int, data: st.DataObject) -> None:
    stored, new = _progress(start, size, data), _progress(start, size, data)
    merged = merge_progress(stored, new)
    assert merged.committed >= max(stored.committed, new.committed)
    for p in (stored, new):
        for offset in range(p.start, p.end):
            if p.is_finished(offset):
                assert merged.is_finished(offset)
    for offset in range(start, start + size):  # nothing finished out of thin air
        if merged.is_finished(offset):
            assert stored.is_finished(offset) or new.is_finished(offset)


def test_merge_rejects_different_ranges() -> None:
    with pytest.raises(ValueError, match=r"\[0, 10\).*\[0, 20\)"):
        merge_progress(RangeProgress(0, 20, 0), RangeProgress(0, 10, 0))


def test_mask_url_hides_password() -> None:
    assert mask_url("postgresql+psycopg://u:secret@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"
    assert mask_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    assert "secret" not in mask_url("not a url://u:secret@h")


def test_upgrade_command_is_shell_ready() -> None:
    assert upgrade_command("sqlite:////tmp/x.db") == "fastrecover db upgrade --store-url sqlite:////tmp/x.db"
    assert upgrade_command("postgresql+psycopg://u:pw@h/db?sslmode=require") == (
        "fastrecover db upgrade --store-url 'postgresql+psycopg://u:***@h/db?sslmode=require'"
    )
