"""How the CLI writes counts for people: a count and its noun agree."""

from __future__ import annotations

import pytest

from forklift.shown import output


@pytest.mark.parametrize(
    ("count", "noun", "nouns", "text"),
    [
        (0, "supervisor", None, "0 supervisors"),
        (1, "supervisor", None, "1 supervisor"),
        (2, "supervisor", None, "2 supervisors"),
        (1, "dead job", None, "1 dead job"),
        (7, "dead job", None, "7 dead jobs"),
        (1, "batch", "batches", "1 batch"),
        (3, "batch", "batches", "3 batches"),
    ],
)
def test_a_count_and_its_noun_agree(count: int, noun: str, nouns: str | None, text: str) -> None:
    assert output.plural(count, noun, nouns) == text


def test_an_age_is_never_negative() -> None:
    age = output.age
    assert [age(-0.4), age(0.0), age(42.2), age(600), age(3 * 3600)] == [
        "0s", "0s", "42s", "10m", "3.0h",
    ]  # fmt: skip
