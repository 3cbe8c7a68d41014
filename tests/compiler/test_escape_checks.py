"""The escaper's name and decl checks refuse with a located message, also for an empty list of words."""

from __future__ import annotations

import pytest

from plancompiler.shell import ValueRefused, escape


@pytest.mark.parametrize("value", [[], "", "a[$(id)]", ["a", "b"]])
def test_a_value_that_is_no_plain_name_is_refused_as_a_name(value: object) -> None:
    with pytest.raises(ValueRefused) as refused:
        escape(value, "bare", 3, 7, check="name")
    assert (refused.value.line, refused.value.col) == (3, 7)
    assert "must be a plain name" in str(refused.value)


def test_a_plain_name_and_a_decl_value_pass() -> None:
    assert escape("m0001", "bare", 1, 1, check="name") == "m0001"
    assert escape(["a", "b"], "bare", 1, 1, check="decl") == "a b"
    with pytest.raises(ValueRefused, match="compound"):
        escape("(x)", "dq", 1, 1, check="decl")
