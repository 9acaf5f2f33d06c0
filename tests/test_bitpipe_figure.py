"""The generated BitPipe order against the BitPipe authors' own schedule figures (read by
scripts/bitpipe_figure.py from github.com/wuhouming/BitPipe @ ea6f6bb into tests/bitpipe/):
BitPipe-v.svg (p = 4, m = 4) exactly, in order and in makespan; scale-moreb.svg (p = 4, m = 8,
two units concatenated) up to the one place where the figure and the authors' runtime differ
(planner.simulate.bitpipe's docstring)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from planner.simulate.actions import Action, Schedule, StageTimes, execute, validate
from planner.simulate.bitpipe import bitpipe

DATA = Path(__file__).parent / "bitpipe"
ROOT = Path(__file__).parent.parent
CHUNK = StageTimes(forward_s=1, backward_s=2)   # the figures' blocks: F 10 px, B 20 px


def figure(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def lists(fig: dict) -> list[list[Action]]:
    return [[Action(kind, chunk, mb) for kind, chunk, mb, _ in rank] for rank in fig["ranks"]]


def as_schedule(fig: dict) -> Schedule:
    p, m = fig["num_ranks"], fig["num_micro_batches"]
    return Schedule("figure", p, 4, m, "bitpipe", tuple(map(tuple, lists(fig))), bitpipe(p, m).pipelines)


@pytest.mark.parametrize("name", ["figure_p4_m4.json", "figure_p4_m8.json"])
def test_figures_are_valid_bitpipe_schedules(name):
    """The extracted lists are complete and runnable on our stage map, and the figure's own
    block times never precede what its order allows (the executor starts each block as early
    as its rank and inputs allow)."""
    fig = figure(name)
    sched = as_schedule(fig)
    validate(sched)
    run = execute(sched, CHUNK)
    for r, rank in enumerate(fig["ranks"]):
        assert all(a.start_s <= start for a, (*_, start) in zip(run.rank_actions(r), rank))


def test_p4_m4_is_the_figure_exactly():
    fig = figure("figure_p4_m4.json")
    assert fig["source"] == {"repo": "wuhouming/BitPipe", "path": "docs/BitPipe_images/BitPipe-v.svg",
                             "commit": "ea6f6bbde4563bfecb426b7e31570d86ac83b93d"}
    generated = bitpipe(4, 4)
    assert [list(acts) for acts in generated.ranks] == lists(fig)
    # the figure ends its last backward at 28 units; so does the order at unit times
    end = max(start + (1 if kind == "F" else 2) for rank in fig["ranks"] for kind, _, _, start in rank)
    assert end == 28 == execute(generated, CHUNK).makespan_s


def test_p4_m8_is_the_figure_but_where_the_units_meet():
    """Ranks 1 and 2 are the figure's; on ranks 0 and 3 the authors' runtime runs F B F where
    the next unit's forwards meet this unit's drain, the figure F F B (one unit faster)."""
    fig = figure("figure_p4_m8.json")
    drawn = lists(fig)
    generated = [list(acts) for acts in bitpipe(4, 8).ranks]
    assert generated[1:3] == drawn[1:3]
    for r in (0, 3):
        swapped = list(drawn[r])
        i = 16                                      # after 6 warm-up F, 2 F-B pairs, 5 B, 1 F
        assert [a.kind for a in swapped[i - 1:i + 2]] == ["F", "F", "B"]
        swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
        assert generated[r] == swapped
    assert execute(as_schedule(fig), CHUNK).makespan_s == 53
    assert execute(bitpipe(4, 8), CHUNK).makespan_s == 54


def test_the_script_reads_the_same_lists_from_the_svg(tmp_path):
    """scripts/bitpipe_figure.py on a two-block SVG in the figure's encoding: the parse maps
    fill, width, row and number as the module docstring says."""
    spec = importlib.util.spec_from_file_location("bitpipe_figure", ROOT / "scripts" / "bitpipe_figure.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    block = ('<rect x="{x}" y="{y}" width="{w}" height="20" fill="{fill}" stroke="#000000"/>'
             '<g fill="{tc}" font-size="10px"><text x="0" y="0">{n}</text></g>')
    svg = "".join([block.format(x=472.71, y=141, w=10, fill="#4682b4", tc="#000000", n=1),
                   block.format(x=482.71, y=201, w=20, fill="#fadab9", tc="#FFFFFF", n=3),
                   block.format(x=100, y=141, w=10, fill="#4682b4", tc="#000000", n=2)])  # other panel
    out = mod.parse("BitPipe-v", svg)
    assert out[0] == [{"kind": "F", "chunk": 0, "micro_batch": 0, "start": 0}]
    assert out[3] == [{"kind": "B", "chunk": 3, "micro_batch": 2, "start": 1}]
    with pytest.raises(ValueError, match="text colour"):
        mod.parse("BitPipe-v", block.format(x=472.71, y=141, w=10, fill="#4682b4", tc="#FFFFFF", n=1))
