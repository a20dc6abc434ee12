"""How the CLI writes counts for people: a count and its noun agree."""

from __future__ import annotations

import pytest

from forklift.cli import output


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
