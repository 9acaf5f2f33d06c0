"""Read the BitPipe panel of the BitPipe authors' schedule figure into per-device action lists.

Source: github.com/wuhouming/BitPipe, docs/BitPipe_images/BitPipe-v.svg (last changed in
commit ea6f6bbde4563bfecb426b7e31570d86ac83b93d).  The figure draws p = 4 devices and m = 4
micro-batches; its right-hand panel (x >= 470) is BitPipe, the panels to its left the two
V-shaped pipelines alone.  What the drawing encodes (read off the SVG and its legend):

- a ``<rect>`` of height 20 is one block; ``y`` 141 / 161 / 181 / 201 are devices 1-4;
- ``x`` is time, 10 px per unit; width 10 is a forward of one chunk, width 20 a backward;
- fill ``#4682b4`` (forward) / ``#eb8f6b`` (backward) is the first leg of a V (the stage on
  the way out, our chunk 0 or 2), ``#a9c4eb`` / ``#fadab9`` the second leg (the way back,
  chunk 1 or 3): in the left panels a micro-batch runs #4682b4 down the devices, then
  #a9c4eb back, then #fadab9 down and #eb8f6b back;
- the ``<text>`` in a block is the micro-batch (1-based); black text is the down pipeline
  (micro-batches 1, 2, entering at device 1), white the up pipeline (3, 4, entering at
  device 4); white blocks without text are idle.

So micro-batch ``n`` is our micro-batch ``n - 1`` (planner.simulate.bitpipe.pipelines: the first
m/2 go down), and the chunk is ``2 * pipe + leg``, which is the ``bitpipe`` stage map's chunk
numbering (planner.simulate.layouts).

    git -C <BitPipe checkout> show ea6f6bb:docs/BitPipe_images/BitPipe-v.svg > /tmp/bp.svg
    PYTHONPATH=. python scripts/bitpipe_figure.py /tmp/bp.svg > tests/bitpipe/figure_p4_m4.json
"""

from __future__ import annotations

import json
import re
import sys

SOURCE = {"repo": "wuhouming/BitPipe", "path": "docs/BitPipe_images/BitPipe-v.svg",
          "commit": "ea6f6bbde4563bfecb426b7e31570d86ac83b93d"}
DEVICE_ROWS_PX = (141.0, 161.0, 181.0, 201.0)
PANEL_START_PX = 470.0          # the BitPipe panel; the panels left of it are other schedules
UNIT_PX = 10.0                  # one forward chunk
FILLS = {"#4682b4": ("F", 0), "#a9c4eb": ("F", 1), "#fadab9": ("B", 1), "#eb8f6b": ("B", 0)}
TEXT_PIPE = {"#000000": 0, "#ffffff": 1}    # black: down pipeline, white: up

_BLOCK = re.compile(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" fill="([^"]+)"[^>]*/>'
                    r'(?:<g fill="([^"]+)"[^>]*><text[^>]*>([^<]*)</text></g>)?')


def parse(svg: str) -> list[list[dict]]:
    """Per device, the BitPipe panel's blocks in time order: kind, chunk, micro_batch (0-based),
    start (units from the panel's first block)."""
    blocks = []
    for x, y, width, height, fill, text_fill, text in _BLOCK.findall(svg):
        if float(height) != 20 or float(y) not in DEVICE_ROWS_PX or float(x) < PANEL_START_PX:
            continue
        if fill.lower() == "#ffffff":
            continue                                 # idle
        kind, leg = FILLS[fill.lower()]
        expected_px = UNIT_PX if kind == "F" else 2 * UNIT_PX
        if float(width) != expected_px:
            raise ValueError(f"{kind} block at x={x} y={y} is {width} px wide, not {expected_px}")
        pipe = TEXT_PIPE[text_fill.lower()]
        blocks.append((DEVICE_ROWS_PX.index(float(y)), float(x), kind, 2 * pipe + leg, int(text) - 1))
    origin = min(b[1] for b in blocks)
    out: list[list[dict]] = [[] for _ in DEVICE_ROWS_PX]
    for dev, x, kind, chunk, mb in sorted(blocks):
        out[dev].append({"kind": kind, "chunk": chunk, "micro_batch": mb,
                         "start": round((x - origin) / UNIT_PX)})
    return out


def to_json(devices: list[list[dict]]) -> str:
    """One line per device: ``[kind, chunk, micro_batch, start]`` per block."""
    rows = [json.dumps([[b["kind"], b["chunk"], b["micro_batch"], b["start"]] for b in dev]) for dev in devices]
    head = json.dumps({"source": SOURCE, "num_ranks": len(devices), "num_micro_batches": 4,
                       "format": "per rank: [kind, chunk, micro_batch, start in forward-chunk units]"})
    return head[:-1] + ', "ranks": [\n' + ",\n".join(rows) + "\n]}\n"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(to_json(parse(f.read())))
