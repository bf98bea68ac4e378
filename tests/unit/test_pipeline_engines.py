"""Which in-process engines a process opens (``pipeline.engines_needed``): a
``memstream worker counters summarizer`` beside ``memstream up`` on the same data dir must
open neither chdb nor qdrant-edge (both lock their folder; the worker failed on chdb's)."""

from __future__ import annotations

from memstream.infra.cli.pipeline import engines_needed


def test_api_and_all_processors_open_both() -> None:
    assert engines_needed(True, []) == (True, True)  # memstream api
    assert engines_needed(True, None) == (True, True)  # memstream up
    assert engines_needed(False, None) == (True, True)  # memstream worker (all)


def test_a_worker_opens_only_what_its_projectors_write() -> None:
    assert engines_needed(False, ["counters", "summarizer"]) == (False, False)
    assert engines_needed(False, ["message-projector"]) == (True, False)
    assert engines_needed(False, ["memory-projector", "counters"]) == (False, True)
