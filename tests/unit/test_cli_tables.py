"""The CLI's tables never shorten what a user must copy (ids, groups, topics), even when
the output is a pipe (which rich treats as 80 columns)."""

from __future__ import annotations

import pytest

from memstream.infra.cli.ops import _full_table, _print_full

LONG_ID = "dlq:memstream.journal/0@12345:summarizer:9f8e7d6c5b4a3210fedcba9876543210"


def test_long_ids_are_printed_whole(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [[LONG_ID, "message-projector", "memstream.journal/0@12345", "boom " * 60]]
    _print_full(
        _full_table("1 dead letter(s)", ["id", "processor", "origin", "error"], rows, "error")
    )
    out = capsys.readouterr().out
    assert LONG_ID in out and "message-projector" in out and "…" not in out
    assert "boom boom" in out  # the free-text column wraps instead of being cut


def test_lag_groups_and_topics_are_printed_whole(capsys: pytest.CaptureFixture[str]) -> None:
    group = "memstream-production-eu-west-1-message-projector-replay-generation-7"
    rows = [[group, "memstream-production-eu-west-1.journal", "0", "10", "12", "2", "0", "1.5s"]]
    cols = ["group", "topic", "partition", "committed", "end", "lag", "gap", "since commit"]
    _print_full(_full_table("consumer lag", cols, rows))
    out = capsys.readouterr().out
    assert group in out and "memstream-production-eu-west-1.journal" in out and "…" not in out
