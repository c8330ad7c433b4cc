"""``make figures``: the pictures every notebook shows before any cell runs.

Each picture is drawn by the kit's own drawing code (``distlab.svg``) from a recorded run:
``--record`` runs the primitives on real gloo ranks and writes what every rank's buffer held
to figures/recorded.json; drawing reads only that file, so the SVGs are the same bytes on
every machine and tests/test_figures.py can check that they are rebuilt unchanged. The ring
of notebook 09 comes from distlab's recording of the instructor's ring (no answer is shipped).
Each edition gets its own pictures, the same numbers with its own words (notebooks/zh/figures/
from notebooks/_build/zh/figures.md): a caption with no translation stops the drawing.

    .venv/bin/python notebooks/_build/figures.py            # draw from the recorded runs
    .venv/bin/python notebooks/_build/figures.py --record   # run the ranks again, then draw
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIGURES = HERE.parent / "figures"
RECORDED = FIGURES / "recorded.json"
# each edition's pictures sit beside its notebooks; their words come from notebooks/_build/LANG/figures.md
EDITION_FIGURES = {"en": FIGURES, "zh": HERE.parent / "zh" / "figures"}


# --- recording: runs on real ranks ---------------------------------------------------------------
def _primitives() -> dict[str, Any]:
    """On every rank of 4: each primitive's buffers before and after, as lists."""
    import torch
    import torch.distributed as dist

    from distlab.compat import all_gather_single, reduce_scatter_single

    r, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {}

    x = torch.full((4,), float(r + 1))
    before = x.tolist()
    dist.all_reduce(x)
    out["all_reduce"] = [before, x.tolist()]

    pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    x = torch.full((3,), float(r + 1))
    before = x.tolist()
    dist.all_reduce(x, group=pairs[r % 2])
    out["groups"] = [before, x.tolist()]

    x = torch.full((2,), float(10 * r))
    got = torch.empty(2)
    requests = [dist.isend(x, (r + 1) % n), dist.irecv(got, (r - 1) % n)]
    for request in requests:
        request.wait()
    out["p2p"] = [x.tolist(), got.tolist()]

    x = torch.arange(1.0, 5.0) if r == 0 else torch.zeros(4)
    before = x.tolist()
    dist.broadcast(x, src=0)
    out["broadcast"] = [before, x.tolist()]

    table = torch.arange(8.0)
    piece = torch.zeros(2)
    dist.scatter(piece, list(table.chunk(n)) if r == 0 else None, src=0)
    gathered = [torch.zeros(2) for _ in range(n)] if r == 0 else None
    dist.gather(piece * 10, gathered, dst=0)
    out["scatter_gather"] = [table.tolist() if r == 0 else [], piece.tolist(),
                             torch.cat(gathered).tolist() if gathered else []]

    x = torch.full((3,), float(r + 1))
    before = x.tolist()
    y = x.clone()
    dist.reduce(y, dst=0)
    dist.all_reduce(x)
    out["reduce"] = [before, y.tolist() if r == 0 else before, x.tolist()]

    mine = torch.full((2,), float(r))
    everything = torch.zeros(2 * n)
    all_gather_single(everything, mine)
    out["all_gather"] = [mine.tolist(), everything.tolist()]

    x = torch.arange(8.0) + 10 * r
    shard = torch.zeros(2)
    reduce_scatter_single(shard, x)
    out["reduce_scatter"] = [x.tolist(), shard.tolist()]

    letters = [torch.tensor([10.0 * r + j]) for j in range(n)]
    inbox = [torch.zeros(1) for _ in range(n)]
    dist.all_to_all(inbox, letters)
    out["all_to_all"] = [torch.cat(letters).tolist(), torch.cat(inbox).tolist()]

    torch.manual_seed(r)
    grad = torch.randint(0, 9, (4,)).float()
    before = grad.tolist()
    dist.all_reduce(grad)
    out["gradients"] = [before, (grad / n).tolist()]

    ones = torch.ones(6)
    dist.all_reduce(ones)
    out["ones"] = [[1.0] * 6, ones.tolist()]
    return out


def _hierarchical() -> list[list[float]]:
    """On 8 ranks, 2 "nodes" of 4: reduce_scatter in the node, all_reduce across, all_gather."""
    import torch
    import torch.distributed as dist

    from distlab.compat import all_gather_single, reduce_scatter_single

    r = dist.get_rank()
    nodes = [dist.new_group(list(range(0, 4))), dist.new_group(list(range(4, 8)))]
    across = [dist.new_group([i, i + 4]) for i in range(4)]
    node, local = nodes[r // 4], across[r % 4]
    x = torch.arange(8.0) + r  # (8,)
    stages = [x.tolist()]
    mine = torch.zeros(2)
    reduce_scatter_single(mine, x, group=node)
    stages.append(mine.tolist())
    dist.all_reduce(mine, group=local)
    stages.append(mine.tolist())
    all_gather_single(x, mine, group=node)
    stages.append(x.tolist())
    return stages


def record() -> dict[str, Any]:
    import cloudpickle

    import distlab

    if __name__ != "__main__":  # imported (by the tests): ranks cannot import this file
        cloudpickle.register_pickle_by_value(sys.modules[__name__])

    per_rank = distlab.run(_primitives, world_size=4)
    data = {key: [rank[key] for rank in per_rank] for key in per_rank[0]}
    data["hierarchical"] = list(distlab.run(_hierarchical, world_size=8))
    return data


# --- drawing: from the recorded data only ------------------------------------------------------
Words = Callable[[str], str]  # English text -> the edition's


def _grid(bufs: list[Any], title: str, **kw: Any) -> tuple[str, int, int]:
    from distlab import svg

    return svg.buffers(bufs, title=title, **kw)


def _two(data: dict[str, Any], key: str, before: str, after: str, caption: str, tr: Words) -> str:
    from distlab import svg

    rows = data[key]
    return svg.compose([_grid([r[0] for r in rows], tr(before)), _grid([r[1] for r in rows], tr(after))],
                       caption=tr(caption))


def drawings(data: dict[str, Any], tr: Words = str) -> dict[str, str]:
    """File name -> SVG text, one per notebook, its words passed through ``tr``."""
    from distlab import svg
    from distlab.replay import recording, ring_frames

    pics = {
        "00_all_reduce.svg": _two(data, "all_reduce", "before: each rank's own numbers",
                                  "after all_reduce: everyone has the sum", "4 ranks, one all_reduce", tr),
        "01_groups.svg": _two(data, "groups", "before", "after all_reduce in groups {0, 2} and {1, 3}",
                              "two process groups of two ranks", tr),
        "03_broadcast.svg": _two(data, "broadcast", "before: only rank 0 has the data",
                                 "after broadcast(src=0)", "broadcast: one captain, everyone hears", tr),
        "06_all_gather.svg": _two(data, "all_gather", "before: one piece per rank",
                                  "after all_gather: every piece everywhere", "all_gather", tr),
        "07_reduce_scatter.svg": _two(data, "reduce_scatter", "before: a full buffer per rank",
                                      "after reduce_scatter: rank r holds the sum of slice r",
                                      "reduce_scatter", tr),
        "08_all_to_all.svg": _two(data, "all_to_all", "before: rank r holds 10r + j for each j",
                                  "after all_to_all: rank r holds 10j + r from each j",
                                  "all_to_all: a transpose of the team's table", tr),
        "10_gradients.svg": _two(data, "gradients", "each rank's gradient, from its own data",
                                 "after all_reduce / world_size: the same average everywhere",
                                 "data parallelism: averaging gradients", tr),
        "11_all_reduce_ones.svg": _two(data, "ones", "before: ones on every rank",
                                       "after one all_reduce: every element is world_size",
                                       "what the benchmark repeats", tr),
    }
    rows = data["p2p"]
    messages = [{"src": r, "dst": (r + 1) % len(rows)} for r in range(len(rows))]
    pics["02_ring_pass.svg"] = svg.compose(
        [svg.ring(len(rows), messages), _grid([r[0] for r in rows], tr("sent to the right")),
         _grid([r[1] for r in rows], tr("received from the left"))], across=True,
        caption=tr("isend to the right, irecv from the left"))
    rows = data["scatter_gather"]
    pics["04_scatter_gather.svg"] = svg.compose(
        [_grid([r[0] for r in rows], tr("before: rank 0 holds the table")),
         _grid([r[1] for r in rows], tr("after scatter: one slice each")),
         _grid([r[2] for r in rows], tr("after gather of 10 x slice: rank 0 holds them all"))],
        caption=tr("scatter, then gather"))
    rows = data["reduce"]
    pics["05_reduce.svg"] = svg.compose(
        [_grid([r[0] for r in rows], tr("before")), _grid([r[1] for r in rows], tr("after reduce(dst=0): only rank 0")),
         _grid([r[2] for r in rows], tr("after all_reduce: everyone"))], caption=tr("reduce and all_reduce"))
    frames = ring_frames(recording("ring_all_reduce_4ranks"))
    nums = [float(v) for f in frames for b in f.buffers if b for v in b]
    panels = []
    for k in (1, 3, 4, 6):
        f = frames[k]
        marks = {(r, i): svg.SENT for r in range(len(f.sent)) for i in f.sent[r]}
        marks.update({(r, i): svg.RECEIVED for r in range(len(f.received)) for i in f.received[r]})
        panels.append(_grid(f.buffers, tr("{step}: blue sent, orange received").format(step=tr(f.label)), marks=marks,
                            vrange=(min(nums), max(nums))))
    pics["09_ring.svg"] = svg.compose(panels, caption=tr("ring all_reduce on 4 ranks (recorded)"))
    stages = data["hierarchical"]
    labels = [tr("node {node} gpu {gpu}").format(node=r // 4, gpu=r % 4) for r in range(8)]
    titles = [tr(t) for t in ("before: 8 GPUs in 2 nodes", "reduce_scatter inside each node",
                              "all_reduce across the nodes (GPU i with GPU i)", "all_gather inside each node")]
    pics["12_hierarchical.svg"] = svg.compose(
        [svg.buffers([s[k] for s in stages], title=t, labels=labels) for k, t in enumerate(titles)],
        caption=tr("hierarchical all_reduce, 2 nodes of 4 GPUs (recorded on 8 ranks)"))
    return pics


class Untranslated(Exception):
    """Words of a picture with no entry in the edition's catalogue (the message holds stubs)."""


class EditionWords:
    """The edition's words for a picture's English text: itself in English, else its entry in
    notebooks/_build/LANG/figures.md; the English text without one is kept in ``missing``."""

    def __init__(self, lang: str) -> None:
        from distlab.edition import Catalogue

        self.catalogue = None if lang == "en" else Catalogue.load(HERE / lang / "figures.md")
        self.missing: list[str] = []

    def __call__(self, english: str) -> str:
        found = english if self.catalogue is None else self.catalogue.get(english)
        if found is None:
            self.missing.append(english)
        return english if found is None else found


def draw(out: Path | None = None, lang: str = "en") -> list[Path]:
    """Write the edition's pictures to ``out`` (its figures folder unless given)."""
    from distlab.edition import stubs

    data = json.loads(RECORDED.read_text())
    words = EditionWords(lang)
    pictures = drawings(data, words)
    if words.missing:
        raise Untranslated(f"pictures of the {lang} edition: no translation in "
                           f"notebooks/_build/{lang}/figures.md for\n{stubs(words.missing)}")
    out = out or EDITION_FIGURES[lang]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in sorted(pictures.items()):
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    return written


def main(argv: list[str]) -> int:
    if "--record" in argv or not RECORDED.exists():
        FIGURES.mkdir(parents=True, exist_ok=True)
        RECORDED.write_text(json.dumps(record(), indent=None, separators=(",", ":")) + "\n")
        print(f"recorded {RECORDED.relative_to(HERE.parent.parent)}")
    for lang in EDITION_FIGURES:
        for path in draw(lang=lang):
            print(f"wrote {path.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
