"""HSDP in the reference runner: which ranks form each ZeRO shard group and each replicate group
(planner.launch.hsdp_groups), on the rank numbering the runner gives a plan's devices."""

from __future__ import annotations

import pytest
from test_run_checks import make_plan, rep

from planner.launch import runner
from planner.launch.hsdp_groups import zero_groups

MODEL = {"name": "tiny", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
         "vocab_size": 64, "num_kv_heads": 2}


def _groups(tp: int, cp: int, shard_degree: int | None, stages: int = 1):
    """``stages`` stages of 4 replicas of tp x cp devices; each stage's zero_groups."""
    width = tp * cp
    layout = [((4 * k // stages, 4 * (k + 1) // stages),
               [rep(tp, 1, [f"n{k}:{j * width + i}" for i in range(width)]) for j in range(4)])
              for k in range(stages)]
    plan = make_plan(layout, model=MODEL, zero_stage=1, context_parallel=cp,
                     **({} if shard_degree is None else {"zero_shard_degree": shard_degree}))
    per_stage = runner.replica_ranks(plan, runner.rank_map(plan))
    return [zero_groups(reps, cp, plan.zero_shard_degree) for reps in per_stage]


@pytest.mark.parametrize("tp,cp,d,shard,replicate", [
    # dp 4, shard 2: two groups of two replicas; shard k of each group all-reduced across them
    (1, 1, 2, [(0, 1), (2, 3)], [(0, 2), (1, 3)]),
    # dp 4, shard 4: plain ZeRO, one group of all, nothing to replicate across
    (1, 1, 4, [(0, 1, 2, 3)], [(0,), (1,), (2,), (3,)]),
    # cp 2: a replica's two cp ranks join its group's shards (2 replicas x 2 = 4 shards)
    (1, 2, 2, [(0, 1, 2, 3), (4, 5, 6, 7)], [(0, 4), (1, 5), (2, 6), (3, 7)]),
    # tp 2: per tp position, its own groups over the ranks holding that tp shard
    (2, 1, 2, [(0, 2), (4, 6), (1, 3), (5, 7)], [(0, 4), (2, 6), (1, 5), (3, 7)]),
])
def test_membership(tp, cp, d, shard, replicate):
    (groups,) = _groups(tp, cp, d)
    assert [list(g) for g in groups.shard] == [list(g) for g in shard]
    assert [list(g) for g in groups.replicate] == [list(g) for g in replicate]


def test_full_shard_degree_is_the_runner_s_plain_zero_group():
    """d = n gives what the worker uses without HSDP: per tp position, every replica x cp."""
    for tp, cp in ((1, 1), (2, 1), (1, 2)):
        assert _groups(tp, cp, 4) == _groups(tp, cp, None)


@pytest.mark.parametrize("tp,cp,d", [(1, 1, 1), (1, 1, 2), (2, 2, 2), (2, 1, 4), (1, 2, 1)])
def test_every_rank_has_one_shard_and_its_holders_across_groups(tp, cp, d):
    """Two stages: each rank in one shard group of d x cp and one replicate group of n/d, whose
    members hold the same shard index (place in their shard group) and tp position."""
    n = 4
    for stage, groups in enumerate(_groups(tp, cp, d, stages=2)):
        ranks = sorted(r for g in groups.shard for r in g)
        assert ranks == list(range(stage * n * tp * cp, (stage + 1) * n * tp * cp))
        assert sorted(r for g in groups.replicate for r in g) == ranks
        assert {len(g) for g in groups.shard} == {d * cp}
        assert {len(g) for g in groups.replicate} == {n // d}
        for r in ranks:
            holders = groups.replicate_of(r)
            assert r in holders
            index = {groups.shard_of(h).index(h) for h in holders}
            assert index == {groups.shard_of(r).index(r)}
            assert {h % tp for h in holders} == {r % tp}   # tp innermost in the rank numbering


def test_a_degree_not_dividing_the_replicas_is_an_error():
    with pytest.raises(ValueError, match="zero_shard_degree 3 does not divide the stage's 4 replicas"):
        zero_groups([[0], [1], [2], [3]], 1, 3)


def test_what_the_runner_cannot_shard_is_refused_before_it_starts(monkeypatch):
    """Replicas of different tp in a stage have no common shard slicing: refused as for ZeRO."""
    import subprocess

    from planner.errors import InputError

    def boom(*a, **k):
        raise AssertionError("a process was started")
    monkeypatch.setattr(subprocess, "Popen", boom)
    plan = make_plan([((0, 4), [rep(2, 1, ["a:0", "a:1"]), rep(1, 1, ["a:2"]),
                                rep(2, 1, ["a:3", "a:4"]), rep(1, 1, ["a:5"])])],
                     model=MODEL, zero_stage=3, zero_shard_degree=2)
    with pytest.raises(InputError, match="zero_stage: 3 with replicas of different tp in stage 0"):
        runner.run_plan(plan, steps=1)
