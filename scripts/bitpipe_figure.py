"""Read the BitPipe panels of the BitPipe authors' schedule figures into per-device action lists.

Source: github.com/wuhouming/BitPipe at commit ea6f6bbde4563bfecb426b7e31570d86ac83b93d (the last
to change either file), the two figures of its README, both p = 4 devices:

- ``docs/BitPipe_images/BitPipe-v.svg``: m = 4 micro-batches; its right-hand panel (x >= 470,
  rows y = 141 / 161 / 181 / 201) is BitPipe, the panels to its left the two V-shaped
  pipelines alone;
- ``docs/BitPipe_images/scale-moreb.svg``: m = 8; panel (b) "Direct concatenation" (rows
  y = 128 / 148 / 168 / 188, x >= 40) runs two units of four micro-batches back to back
  (panel (a), above it, is the same unit twice with a flush between).

What the drawing encodes (read off the SVGs and their legends):

- a ``<rect>`` of height 20 is one block; the panel's rows are devices 1-4 from the top;
- ``x`` is time, 10 px per unit; width 10 is a forward of one chunk, width 20 a backward;
- fill ``#4682b4`` (forward) / ``#eb8f6b`` (backward) is the first leg of a V (the stage on
  the way out, our chunk 0 or 2), ``#a9c4eb`` / ``#fadab9`` the second leg (the way back,
  chunk 1 or 3): in BitPipe-v's left panels a micro-batch runs #4682b4 down the devices, then
  #a9c4eb back, then #fadab9 down and #eb8f6b back;
- the ``<text>`` in a block is the micro-batch, 1-based and numbered by units of p: in each
  unit the first p/2 go down (entering at device 1), the next p/2 up (entering at device 4).
  BitPipe-v also draws the down ones' numbers black and the up ones' white; scale-moreb's
  text colours are not consistent (e.g. a white 5 where 5 is down), so the direction is taken
  from the number and the text colour is only checked where it is consistent (BitPipe-v);
- white blocks without text are idle.

Our numbering (planner.simulate.bitpipe.pipelines) puts the down micro-batches first: the
figure's unit j, place k (k < p/2: down) is the pipeline's micro-batch j * p/2 + k % (p/2),
and the chunk is ``2 * pipe + leg``, the ``bitpipe`` stage map's numbering
(planner.simulate.layouts).

    git -C <BitPipe checkout> show ea6f6bb:docs/BitPipe_images/BitPipe-v.svg > /tmp/bp.svg
    git -C <BitPipe checkout> show ea6f6bb:docs/BitPipe_images/scale-moreb.svg > /tmp/moreb.svg
    PYTHONPATH=. python scripts/bitpipe_figure.py BitPipe-v /tmp/bp.svg > tests/bitpipe/figure_p4_m4.json
    PYTHONPATH=. python scripts/bitpipe_figure.py scale-moreb /tmp/moreb.svg > tests/bitpipe/figure_p4_m8.json
"""

from __future__ import annotations

import json
import re
import sys

COMMIT = "ea6f6bbde4563bfecb426b7e31570d86ac83b93d"
# name -> (path, device rows' y in px, x where the BitPipe panel starts in px, micro-batches,
# whether the text colour tells the direction)
FIGURES = {
    "BitPipe-v": ("docs/BitPipe_images/BitPipe-v.svg", (141.0, 161.0, 181.0, 201.0), 470.0, 4, True),
    "scale-moreb": ("docs/BitPipe_images/scale-moreb.svg", (128.0, 148.0, 168.0, 188.0), 40.0, 8, False),
}
UNIT_PX = 10.0                  # one forward chunk
FILLS = {"#4682b4": ("F", 0), "#a9c4eb": ("F", 1), "#fadab9": ("B", 1), "#eb8f6b": ("B", 0)}
TEXT_PIPE = {"#000000": 0, "#ffffff": 1}    # black: down pipeline, white: up

_BLOCK = re.compile(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" fill="([^"]+)"[^>]*/>'
                    r'(?:<g fill="([^"]+)"[^>]*><text[^>]*>([^<]*)</text></g>)?')


def our_micro_batch(label: int, p: int, m: int) -> tuple[int, int]:
    """(pipeline, our micro-batch) of the figure's 1-based ``label`` (module docstring)."""
    unit, k = divmod(label - 1, p)
    pipe, i = divmod(k, p // 2)
    return pipe, pipe * (m // 2) + unit * (p // 2) + i


def parse(name: str, svg: str) -> list[list[dict]]:
    """Per device, the BitPipe panel's blocks in time order: kind, chunk, micro_batch (ours,
    0-based), start (units from the panel's first block)."""
    _, rows, x_min, m, colour_tells = FIGURES[name]
    p = len(rows)
    blocks = []
    for x, y, width, height, fill, text_fill, text in _BLOCK.findall(svg):
        if float(height) != 20 or float(y) not in rows or float(x) < x_min or fill.lower() not in FILLS:
            continue                                 # not a block of the panel, or idle
        kind, leg = FILLS[fill.lower()]
        expected_px = UNIT_PX if kind == "F" else 2 * UNIT_PX
        if float(width) != expected_px:
            raise ValueError(f"{kind} block at x={x} y={y} is {width} px wide, not {expected_px}")
        pipe, mb = our_micro_batch(int(text), p, m)
        if colour_tells and TEXT_PIPE[text_fill.lower()] != pipe:
            raise ValueError(f"block {text} at x={x} y={y}: text colour {text_fill} says the other pipeline")
        blocks.append((rows.index(float(y)), float(x), kind, 2 * pipe + leg, mb))
    origin = min(b[1] for b in blocks)
    out: list[list[dict]] = [[] for _ in rows]
    for dev, x, kind, chunk, mb in sorted(blocks):
        out[dev].append({"kind": kind, "chunk": chunk, "micro_batch": mb,
                         "start": round((x - origin) / UNIT_PX)})
    return out


def to_json(name: str, devices: list[list[dict]]) -> str:
    """One line per device: ``[kind, chunk, micro_batch, start]`` per block."""
    path, _, _, m, _ = FIGURES[name]
    rows = [json.dumps([[b["kind"], b["chunk"], b["micro_batch"], b["start"]] for b in dev]) for dev in devices]
    head = json.dumps({"source": {"repo": "wuhouming/BitPipe", "path": path, "commit": COMMIT},
                       "num_ranks": len(devices), "num_micro_batches": m,
                       "format": "per rank: [kind, chunk, micro_batch, start in forward-chunk units]"})
    return head[:-1] + ', "ranks": [\n' + ",\n".join(rows) + "\n]}\n"


if __name__ == "__main__":
    with open(sys.argv[2], encoding="utf-8") as f:
        sys.stdout.write(to_json(sys.argv[1], parse(sys.argv[1], f.read())))
