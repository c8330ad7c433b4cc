"""The timeline, tables, buffer grids and ring stepper render, from real traced runs.

The notebook in tests/fixtures_viz/ is executed headless through nbclient, as a learner's
notebook would be; the replay logic is checked in-process on traces from real gloo ranks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import cloudpickle
import nbclient
import nbformat
import pytest
import torch
import torch.distributed as dist
from kernel_session import AsyncUnixSocketKernelManager
from matplotlib.figure import Figure

import distlab
from distlab import replay, trace, viz
from distlab.replay import ring_frames
from grader import reference

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this file
cloudpickle.register_pickle_by_value(reference)  # nor the instructor's package

FIXTURE = Path(__file__).parent / "fixtures_viz" / "viz_demo.ipynb"
WIDGET = "application/vnd.jupyter.widget-view+json"


def _ring(numel: int) -> list[float]:
    t = torch.arange(numel, dtype=torch.float32) * (dist.get_rank() + 1)
    reference.ring_all_reduce(t)
    return t.tolist()


@pytest.fixture(scope="module")
def ring4() -> Any:
    """Ring all_reduce of 10 elements on 4 ranks: uneven chunks of 3, 3, 2, 2."""
    return distlab.run(_ring, world_size=4, trace=True, args=(10,))


@pytest.mark.slow
def test_fixture_notebook_renders_timeline_table_buffers_stepper_and_bench() -> None:
    nb = nbformat.read(FIXTURE, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # committed clean
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            kernel_manager_class=AsyncUnixSocketKernelManager).execute()
    outputs = [[dict(o) for o in c.outputs] for c in nb.cells if c.cell_type == "code"]
    flat = [o for cell in outputs for o in cell]
    assert not [o for o in flat if o.get("name") == "stderr" or o["output_type"] == "error"]

    def kinds(cell: list[dict[str, Any]]) -> list[str]:
        return [k for o in cell for k in o.get("data", {})]

    _imports, traced, buffers, stepper, sweep, fit, _load, magic, _stop = outputs
    assert "image/png" in kinds(traced) and "text/html" in kinds(traced)
    table = next(o["data"]["text/html"] for o in traced if "text/html" in o.get("data", {}))
    assert all(f"<caption>rank {r}</caption>" in table for r in range(3)) and "isend" in table
    assert "before all_reduce" in buffers[0]["data"]["text/html"]
    assert WIDGET in kinds(stepper)
    # bench.sweep in a notebook: a progress bar, the table, then the alpha-beta plot
    assert WIDGET in kinds(sweep)
    assert any("busbw(GB/s)" in o.get("text", "") for o in sweep)
    assert "image/png" in kinds(fit)
    # %%dist --trace: each rank's display() of a grid, then the timeline and table
    htmls = [o["data"]["text/html"] for o in magic if "text/html" in o.get("data", {})]
    assert any("seen on rank 0" in h for h in htmls) and any("seen on rank 1" in h for h in htmls)
    assert "image/png" in kinds(magic) and any("all_reduce" in h for h in htmls)


def test_ring_frames_replay_every_step_with_uneven_chunks(ring4: Any) -> None:
    n, expected = 4, [float(i * 10) for i in range(10)]  # sum of i*(r+1) over r = 10 i
    assert all(r == expected for r in ring4)
    frames = ring_frames(ring4)
    assert len(frames) == 2 * (n - 1) + 1
    assert frames[0].label == "start" and not frames[0].messages
    assert frames[0].buffers[2] == [float(i * 3) for i in range(10)]
    assert all(b == expected for b in frames[-1].buffers)
    bounds = [(0, 3), (3, 6), (6, 8), (8, 10)]  # torch.tensor_split(10 elements, 4)
    for step, f in enumerate(frames[1:]):
        assert sorted((m["src"], m["dst"]) for m in f.messages) == [(r, (r + 1) % n) for r in range(n)]
        for m in f.messages:
            assert f.sent[m["src"]] == f.received[m["dst"]]  # the chunk that left arrived
            assert m["bytes"] == 4 * len(f.sent[m["src"]])
        # step 1: rank r sends chunk r and accumulates chunk r-1
        if step == 0:
            assert [f.sent[r] for r in range(n)] == [set(range(*bounds[r])) for r in range(n)]


def test_stepper_widget_steps_through_frames(ring4: Any) -> None:
    box = viz.ring_stepper(ring4)
    controls, view = box.children
    play, back, slider, fwd = controls.children
    assert slider.max == play.max == 6 and "step 0 of 6" in view.value
    fwd.click()
    assert slider.value == 1 and "step 1 of 6: reduce-scatter 1" in view.value
    assert "rank 0 &rarr; rank 1: 12 B elements [0:3]" in view.value
    slider.value = 6
    assert "all-gather 3" in view.value and "<svg" in view.value
    fwd.click()  # stays on the last step
    back.click()
    assert slider.value == 5


def _own_ring_without_snapshots() -> None:
    """A learner's ring with batch_isend_irecv and no snapshot calls."""
    r, n = dist.get_rank(), dist.get_world_size()
    send, recv = torch.ones(2), torch.empty(2)
    for _ in range(n - 1):
        ops = [dist.P2POp(dist.isend, send, (r + 1) % n), dist.P2POp(dist.irecv, recv, (r - 1) % n)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def test_replay_from_trace_alone_shows_who_sent_to_whom() -> None:
    res = distlab.run(_own_ring_without_snapshots, world_size=3, trace=True)
    frames = ring_frames(res)
    assert len(frames) == 3 and all(b is None for b in frames[1].buffers)
    assert sorted((m["src"], m["dst"], m["bytes"]) for m in frames[2].messages) == [
        (0, 1, 8), (1, 2, 8), (2, 0, 8)]
    assert "no buffer snapshots traced" in viz.ring_stepper(res).children[1].value


def test_timeline_pairs_every_send_with_its_receive(ring4: Any) -> None:
    messages = viz.p2p_messages(ring4.trace)
    assert len(messages) == 4 * 2 * 3  # n ranks x 2(n-1) steps
    assert all(m["recv"] is not None and m["recv"]["rank"] == m["dst"] for m in messages)
    fig = viz.timeline_figure(ring4.trace)
    assert isinstance(fig, Figure)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == [f"rank {r}" for r in range(4)]
    assert viz.PNG(fig)._repr_png_().startswith(b"\x89PNG")


def test_on_a_cluster_the_timeline_and_table_say_which_ranks_share_a_node(ring4: Any) -> None:
    nodes = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    fig = viz.timeline_figure(ring4.trace, nodes=nodes)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["rank 0 @node-a", "rank 1 @node-a", "rank 2 @node-b", "rank 3 @node-b"]
    shaded = [p for p in fig.axes[0].patches if p.get_facecolor()[:3] != (1.0, 1.0, 1.0)
              and p.get_zorder() < 0]
    assert len(shaded) == 2  # node-b's two lanes
    html = viz.trace_table_html(ring4.trace, nodes)
    assert "<caption>rank 2 @node-b</caption>" in html and "<caption>rank 0 @node-a</caption>" in html


def test_table_shows_measured_and_theoretical_bytes(ring4: Any) -> None:
    html = viz.trace_table_html(ring4.trace)
    assert html.count("<caption>rank") == 4 and "theoretical bus bytes" in html
    # rank 0 sends chunks 0, 3, 2 then 1, 0, 3: 3+2+2+3+3+2 floats = 60 B
    rank0 = html.split("<caption>rank 1</caption>")[0]
    assert "<td>isend</td><td>6</td><td>60 B</td><td>60 B</td><td>0 B</td>" in rank0


def test_the_table_and_the_stepper_speak_the_learners_language(ring4: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTLAB_LANG", "zh")
    html = viz.trace_table_html(ring4.trace)
    assert "<th>调用次数</th>" in html and "<th>理论总线字节数</th>" in html and "calls" not in html
    assert "没有 torch.distributed 调用" in viz.trace_table_html([[]])
    frames = ring_frames(ring4)
    assert "第 1 步，共 6 步：reduce-scatter 1" in replay.render_frame(frames, 1)  # the traced label stays
    assert viz.ring_stepper(ring4).children[0].children[1].tooltip == "上一步"


def test_show_buffers_outside_a_kernel_returns_a_grid() -> None:
    grid = viz.show_buffers([torch.tensor([1.0, 2.0]), [[3, 4], [5, 6]]], title="two ranks")
    assert isinstance(grid, viz.BufferGrid)
    html = grid._repr_html_()
    assert "two ranks" in html and html.count("<tr>") == 3 and ">6</td>" in html
    assert repr(grid).splitlines() == ["two ranks", "rank 0: [1, 2]", "rank 1: [3, 4]",
                                       "rank 1: [5, 6]"]


def test_snapshot_is_a_no_op_when_not_recording() -> None:
    trace.snapshot(torch.ones(3))
    with trace.recording() as calls:
        pass
    assert calls == []


def test_static_frames_mark_what_each_rank_sent_and_received(ring4: Any) -> None:
    from distlab.replay import render_frame

    frames = ring_frames(ring4)
    for k in range(1, len(frames)):
        page = render_frame(frames, k)
        marked = page.count("3px solid #4e79a7"), page.count("3px solid #f28e2b")
        assert all(count >= 4 for count in marked), (k, marked)  # every rank sent and received a chunk


def test_timeline_draws_each_ranks_own_work_beside_its_calls() -> None:
    calls = [[{"op": "all_reduce", "t_start": 1.004, "t_end": 1.005, "t_wait": 1.012, "p2p": []}],
             [{"op": "all_reduce", "t_start": 1.006, "t_end": 1.007, "t_wait": 1.012, "p2p": []}]]
    work = [[{"label": f"layer {i}", "t_start": 1.0 + 0.003 * i, "t_end": 1.003 + 0.003 * i} for i in range(3)]
            for _ in range(2)]
    fig = viz.timeline_figure(calls, spans=work)
    (ax,) = fig.axes
    grey = [c for c in ax.collections if len(c.get_facecolor()) and tuple(c.get_facecolor()[0][:3]) == (0xbb / 255,) * 3]
    assert len(grey) == 6  # three layers on each of two ranks
    assert ax.get_xlim()[1] >= 12.0  # the axis spans from the first layer to the last wait (ms)
    labels = {t.get_text() for t in ax.texts}
    assert {"layer 0", "layer 1", "layer 2"} <= labels


def _font_with_chinese(path: Path, family: str) -> Path:
    """A real TrueType font whose every Chinese character (and full-width sign) is a square: enough
    for matplotlib to measure and draw Chinese text with it."""
    from fontTools.fontBuilder import FontBuilder
    from fontTools.pens.ttGlyphPen import TTGlyphPen

    pen = TTGlyphPen(None)
    for x, y in ((100, 0), (100, 800), (900, 800), (900, 0)):
        (pen.lineTo if x != 100 or y else pen.moveTo)((x, y))
    pen.closePath()
    builder = FontBuilder(1000, isTTF=True)
    builder.setupGlyphOrder([".notdef", "square"])
    wide = [*range(0x3000, 0x3040), *range(0x4E00, 0xA000), *range(0xFF00, 0xFFF0)]
    builder.setupCharacterMap({code: "square" for code in wide})
    builder.setupGlyf({".notdef": TTGlyphPen(None).glyph(), "square": pen.glyph()})
    builder.setupHorizontalMetrics({".notdef": (500, 0), "square": (1000, 100)})
    builder.setupHorizontalHeader(ascent=880, descent=-120)
    builder.setupNameTable({"familyName": family, "styleName": "Regular"})
    builder.setupOS2()
    builder.setupPost()
    builder.save(str(path))
    return path


def test_figures_speak_chinese_where_a_font_can_draw_it_and_english_elsewhere(
        ring4: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Chinese edition's figures were English; Chinese drawn in matplotlib's own font comes
    out as empty boxes, with a warning per character on stderr. Now they are Chinese where a font
    can draw it, and English, with no warning, where none can."""
    import warnings

    from matplotlib import font_manager

    from distlab import bench
    from distlab.figure_text import cjk_font

    monkeypatch.setenv("DISTLAB_LANG", "zh")
    title = "one DDP step: each layer's backward (grey), bucket all_reduces"  # as notebook 10 passes it
    rows = [{"op": "all_reduce", "world_size": 4, "size": size, "time_us": 50 + size / 1e3, "busbw": size / 1e5}
            for size in (1024, 65536)]

    def drawn() -> list[str]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a glyph missing from the font is a warning
            figures = [viz.timeline_figure(ring4.trace, title=title), bench.plot_fit(rows)]
            for fig in figures:
                assert viz.png_bytes(fig).startswith(b"\x89PNG")
        return [text.get_text() for fig in figures for ax in fig.axes
                for text in (ax.title, ax.xaxis.label, ax.yaxis.label)]

    english = ["one DDP step: each layer's backward (grey), bucket all_reduces", "time since first call (ms)",
               "time per call (us)", "message size (bytes)"]
    if cjk_font() is None:  # this machine's case: no font draws Chinese
        assert set(english) <= set(drawn()), drawn()
    monkeypatch.setattr(font_manager.fontManager, "ttflist", list(font_manager.fontManager.ttflist))
    font_manager.fontManager.addfont(str(_font_with_chinese(tmp_path / "square.ttf", "Noto Sans CJK SC")))
    chinese = drawn()
    assert "DDP 的一步：每层的反向传播（灰色），各个桶的 all_reduce" in chinese, chinese
    assert {"距第一次调用的时间 (ms)", "每次调用的时间 (us)", "消息大小（字节）"} <= set(chinese), chinese
