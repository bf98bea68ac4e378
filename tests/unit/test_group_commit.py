"""Group commit of memory stores: the batcher (``GroupCommit``, asyncio only) and the pure
capacity rule of a group (``policy.group_fits``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstream.agents_ctx.memory import policy
from memstream.agents_ctx.memory.group_commit import GroupCommit


class Recorder:
    """A ``run`` that records its groups and answers each call with ``call * 10`` (a call
    below 0 gets its own error)."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, calls: Sequence[int]) -> list[int | Exception]:
        self.groups.append(list(calls))
        await self.gate.wait()
        return [ValueError(f"bad {c}") if c < 0 else c * 10 for c in calls]


async def test_a_lone_call_runs_at_once_alone() -> None:
    run = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(run, conflict_key=lambda c: c)
    assert await gc.submit("a", 1) == 10
    assert await gc.submit("a", 2) == 20
    assert run.groups == [[1], [2]]


async def test_calls_arriving_together_at_an_idle_key_form_one_group() -> None:
    run = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(run, conflict_key=lambda c: c)
    assert await asyncio.gather(*(gc.submit("a", i) for i in range(5))) == [0, 10, 20, 30, 40]
    assert run.groups == [[0, 1, 2, 3, 4]]


async def test_calls_queued_while_a_group_runs_form_the_next_group() -> None:
    run = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(run, conflict_key=lambda c: c, max_inflight=1)
    run.gate.clear()
    first = asyncio.create_task(gc.submit("a", 1))
    await asyncio.sleep(0.01)  # the first group is running, held at the gate
    rest = [asyncio.create_task(gc.submit("a", i)) for i in range(2, 7)]
    await asyncio.sleep(0.01)
    run.gate.set()
    assert await first == 10
    assert await asyncio.gather(*rest) == [20, 30, 40, 50, 60]
    assert run.groups == [[1], [2, 3, 4, 5, 6]]


async def test_each_call_gets_its_own_outcome_and_a_group_failure_reaches_all() -> None:
    run = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(run, conflict_key=lambda c: c)
    results = await asyncio.gather(*(gc.submit("a", i) for i in (1, -2, 3)), return_exceptions=True)
    assert results[0] == 10 and results[2] == 30
    assert isinstance(results[1], ValueError) and str(results[1]) == "bad -2"

    async def broken(calls: Sequence[int]) -> list[int | Exception]:
        raise RuntimeError("postgres went away")

    gc2: GroupCommit[int, int] = GroupCommit(broken, conflict_key=lambda c: c)
    out = await asyncio.gather(*(gc2.submit("a", i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in out)


async def test_a_group_never_holds_one_conflict_key_twice_and_order_is_kept() -> None:
    run = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(run, conflict_key=lambda c: c % 3, max_inflight=1)
    out = await asyncio.gather(*(gc.submit("a", i) for i in range(7)))
    assert out == [i * 10 for i in range(7)]
    for g in run.groups:
        assert len({c % 3 for c in g}) == len(g)
    assert sorted(c for g in run.groups for c in g) == list(range(7))
    # a call held back keeps its place: groups come out in arrival order per conflict key
    for k in range(3):
        seen = [c for g in run.groups for c in g if c % 3 == k]
        assert seen == sorted(seen)


async def test_keys_are_independent_and_groups_are_bounded() -> None:
    run = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(
        run, conflict_key=lambda c: c, max_group=4, max_inflight=1
    )
    await asyncio.gather(*(gc.submit("a" if i % 2 else "b", i) for i in range(20)))
    assert all(len(g) <= 4 for g in run.groups)
    assert all(len({c % 2 for c in g}) == 1 for g in run.groups)  # one key per group


async def test_a_caller_that_gives_up_does_not_block_the_others() -> None:
    run = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(run, conflict_key=lambda c: c, max_inflight=1)
    run.gate.clear()
    first = asyncio.create_task(gc.submit("a", 1))
    await asyncio.sleep(0.01)
    gone = asyncio.create_task(gc.submit("a", 2))
    kept = asyncio.create_task(gc.submit("a", 3))
    await asyncio.sleep(0.01)
    gone.cancel()
    run.gate.set()
    assert await first == 10 and await kept == 30
    assert run.groups == [[1], [3]]


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        GroupCommit(Recorder(), conflict_key=lambda c: c, max_group=0)


# --- policy.group_fits --------------------------------------------------------------------
def test_a_group_fits_up_to_the_limits_included() -> None:
    # user_profile: 100 per agent, 30 per user
    assert policy.group_fits("user_profile", {"u1": 30, None: 70}, ["u1"])
    assert not policy.group_fits("user_profile", {"u1": 31}, ["u1"])
    assert not policy.group_fits("user_profile", {"u1": 30, None: 71}, ["u1"])
    # another user past its limit (by replaces, which need no room) does not matter
    assert policy.group_fits("user_profile", {"u1": 10, "u2": 35}, ["u1"])
    assert policy.group_fits("observation", {}, [])


@given(
    existing=st.integers(0, 120),
    creates=st.integers(1, 40),
)
def test_group_fits_exactly_when_every_create_would_pass_one_at_a_time(
    existing: int, creates: int
) -> None:
    # one user's creates in user_profile, on top of `existing` entries of that user
    one_by_one = True
    for i in range(creates):
        try:
            policy.check_capacity("user_profile", "u1", policy.Usage(existing + i, existing + i))
        except Exception:
            one_by_one = False
            break
    total = existing + creates
    assert policy.group_fits("user_profile", {"u1": total}, ["u1"]) == one_by_one
