"""The grading checks on their own: real ranks, real tensors, no nbgrader (see test_grading_contract)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cloudpickle
import nbformat
import pytest
import torch

import distlab
import distlab.grading
from distlab.grading import compare, exercise, harness, runner
from distlab.grading import ex1_all_reduce_rs_ag as ex1
from distlab.grading.catalog import ENTRIES
from distlab.grading.extract import solution_source
from distlab.grading.spec import PartResult, SubmissionResult

REPO = Path(__file__).resolve().parent.parent
EX1 = exercise("ex1")
# functions below go to the ranks by value, as a notebook's would (not as an import of this file)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def reference_all_reduce(tensor: Any, op: Any = None, group: Any = None) -> None:
    """A correct answer, written as a student would (single-tensor forms, padding)."""
    import torch
    import torch.distributed as dist

    op = dist.ReduceOp.SUM if op is None else op
    world = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    chunk = -(-flat.numel() // world)
    padded = torch.zeros(chunk * world, dtype=tensor.dtype)
    padded[: flat.numel()] = flat
    mine = torch.empty(chunk, dtype=tensor.dtype)
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs(mine, padded, op=op, group=group)
    ag(padded, mine, group=group)
    tensor.copy_(padded[: flat.numel()].reshape(tensor.shape))


def sums_locally(tensor: Any, op: Any = None, group: Any = None) -> None:
    """Wrong: never communicates, so every rank keeps its own tensor doubled."""
    tensor.mul_(2)


# --- trusted-side comparisons ---------------------------------------------------------------------
def test_tensors_travel_as_bytes_and_compare_exactly() -> None:
    want = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    record = harness.tensor_record(want.clone())
    assert set(record) == {"type", "dtype", "shape", "data"} and isinstance(record["data"], bytes)
    assert compare.tensor_problem(record, want, exact=True) is None
    assert compare.tensor_problem(harness.tensor_record(torch.tensor(3)), torch.tensor(3), exact=True) is None

    off = want.clone()
    off[1, 2] += 1
    text = compare.tensor_problem(harness.tensor_record(off), want, exact=True)
    assert text is not None and "expected [0, 1, 2, 3, 4, 5]" in text and "flat index 5" in text
    assert "dtype" in (compare.tensor_problem(harness.tensor_record(want.float()), want, exact=True) or "")
    assert "shape" in (compare.tensor_problem(harness.tensor_record(want.reshape(-1)), want, exact=True) or "")
    nan = want.clone()
    nan[0, 0] = float("nan")
    assert compare.tensor_problem(harness.tensor_record(nan), want, exact=False) is not None


def test_anything_but_a_plain_tensor_is_refused() -> None:
    class AlwaysEqual(torch.Tensor):
        def __eq__(self, other: object) -> bool:  # type: ignore[override]
            return True

    sneaky = torch.ones(3)
    sneaky.__class__ = AlwaysEqual
    text = compare.tensor_problem(harness.tensor_record(sneaky), torch.zeros(3), exact=True)
    assert text is not None and "AlwaysEqual instead of a torch.Tensor" in text
    assert compare.tensor_problem({"type": "torch.Tensor", "dtype": "float32", "shape": [3], "data": b"x"},
                                  torch.zeros(3), exact=True) == "sent back a malformed tensor"
    unchanged = compare.tensor_problem(harness.tensor_record(torch.ones(2)), torch.full((2,), 3.0),
                                       exact=True, original=torch.ones(2))
    assert unchanged is not None and "in place" in unchanged


def test_rank_results_are_unpickled_as_plain_data_only() -> None:
    assert runner.plain_loads(pickle.dumps({"data": b"\x00", "shape": [1], "ok": True})) == {
        "data": b"\x00", "shape": [1], "ok": True}
    with pytest.raises(pickle.UnpicklingError):
        runner.plain_loads(pickle.dumps(PartResult("x", True)))


def test_communication_rules() -> None:
    def log(*ops: tuple[str, str, int, int], violations: tuple[str, ...] = ()) -> dict[str, Any]:
        return {"ops": [{"via": v, "op": o, "out": out, "in": inp} for v, o, out, inp in ops],
                "violations": list(violations)}

    rule = {"allowed": ("reduce_scatter", "all_gather"), "required": ("reduce_scatter", "all_gather"),
            "limit_elements": 16}
    good = log(("dispatch", "_reduce_scatter_base_", 2, 8), ("dispatch", "_allgather_base_", 8, 2),
               ("python", "reduce_scatter_single", 0, 0), ("python", "all_gather_single", 0, 0))
    assert compare.comm_problem(good, **rule) is None
    assert "all_reduce" in (compare.comm_problem(log(("dispatch", "allreduce_", 8, 0)), **rule) or "")
    assert "backend directly" in (compare.comm_problem(log(("backend", "backend.allreduce", 0, 0)), **rule) or "")
    assert "rendezvous store" in (compare.comm_problem(log(("store", "store.set", 0, 0)), **rule) or "")
    assert "never called all_gather" in (compare.comm_problem(
        log(("dispatch", "reduce_scatter_", 2, 8)), **rule) or "")
    whole = log(("dispatch", "_reduce_scatter_base_", 2, 8), ("dispatch", "allgather_", 32, 8))
    assert "more than 16" in (compare.comm_problem(whole, **rule) or "")
    assert "tampered" in (compare.comm_problem(log(violations=("the dispatch recorder was removed",)),
                                               **rule) or "")


def test_only_the_answer_cells_are_graded() -> None:
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade_id": "setup"}}),
        nbformat.v4.new_code_cell("def all_reduce_rs_ag(t):\n    pass",
                                  metadata={"nbgrader": {"grade_id": "all_reduce_rs_ag", "solution": True}}),
        nbformat.v4.new_code_cell("helper = 2"),
    ])
    assert solution_source(nb, EX1.solution_ids) == "def all_reduce_rs_ag(t):\n    pass"
    assert solution_source(nbformat.v4.new_notebook(), EX1.solution_ids) == ""


def test_of_pasted_answer_cells_the_one_nbgrader_keeps_is_graded() -> None:
    """A pasted answer cell keeps its grade id. The parallel pass read both copies while nbgrader
    keeps the last, so the sources differed, the parallel result was thrown away and the student
    was graded a second time in nbgrader's own process (5 s more each on 2 cores)."""
    from nbgrader.preprocessors import DeduplicateIds

    answer = {"nbgrader": {"grade_id": "all_reduce_rs_ag", "solution": True, "grade": False, "locked": False}}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def all_reduce_rs_ag(*args):\n    pass", metadata=json.loads(json.dumps(answer))),
        nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade_id": "all_reduce_rs_ag"}}),  # no flags
        nbformat.v4.new_code_cell("def all_reduce_rs_ag(t):\n    return t", metadata=json.loads(json.dumps(answer))),
    ])
    read_here = solution_source(nb, EX1.solution_ids)
    deduplicated, _ = DeduplicateIds().preprocess(nbformat.from_dict(json.loads(json.dumps(nb))), {})
    assert read_here == solution_source(deduplicated, EX1.solution_ids) == \
        "x = 1\n\ndef all_reduce_rs_ag(t):\n    return t"
    assert solution_source(json.loads(nbformat.writes(nb)), EX1.solution_ids) == read_here  # plain JSON too


def test_answer_cells_are_read_past_metadata_nbgrader_cannot_read() -> None:
    """A hand-edited notebook: a list as a grade id made the parallel pass's reader raise."""
    from distlab.grading.extract import drop_unreadable_nbgrader_metadata, recover_answer_cell

    answer = {"nbgrader": {"grade_id": "all_reduce_rs_ag", "solution": True}}
    nb = {"cells": [
        {"cell_type": "code", "source": "a = 1", "metadata": {"nbgrader": {"grade_id": ["x"], "grade": True}}},
        {"cell_type": "code", "source": "b = 2", "metadata": {"nbgrader": "oops"}},
        {"cell_type": "code", "source": "c = 3", "metadata": []},
        "not a cell",
        {"cell_type": "code", "source": ["def all_reduce_rs_ag(t):\n", "    return t"], "metadata": answer},
    ]}
    assert solution_source(nb, EX1.solution_ids) == "def all_reduce_rs_ag(t):\n    return t"
    assert drop_unreadable_nbgrader_metadata(nb) == 3
    assert [c["metadata"] for c in nb["cells"] if isinstance(c, dict)] == [{}, {}, {}, answer]
    assert drop_unreadable_nbgrader_metadata(nb) == 0
    lost = {"cells": ["not a cell", {"cell_type": "code", "source": "a = 1", "metadata": {"nbgrader": {"grade_id": ["x"]}}},
                      {"cell_type": "code", "source": "def all_reduce_rs_ag(t):\n    return t", "metadata": {}}]}
    assert recover_answer_cell(lost, EX1.solution_ids, "all_reduce_rs_ag") == 2  # the cell's own place


def test_results_round_trip_as_json() -> None:
    result = SubmissionResult("ex1_all_reduce_rs_ag", "abc", [PartResult("ops", False, "why", 1.5, 3)], 2.0)
    assert SubmissionResult.from_json(result.to_json()) == result
    assert json.loads(result.to_json())["parts"][0]["message"] == "why"


# --- the notebook and the grader agree --------------------------------------------------------------
def test_catalog_reads_each_exercise_s_one_declaration_without_torch() -> None:
    """What the catalog reads from the source equals what the imported module declares, and
    every exercise module in the package is found (nothing else lists them)."""
    import subprocess
    import sys

    from distlab.grading import catalog

    modules = sorted(p.stem for p in Path(catalog.__file__).parent.glob("ex[0-9]*_*.py"))
    assert sorted(e.module.rsplit(".", 1)[1] for e in catalog.ENTRIES) == modules and len(modules) >= 7
    for known in catalog.ENTRIES:
        loaded = known.load()
        assert (loaded.key, loaded.assignment, loaded.function, loaded.solution_ids) == (
            known.key, known.assignment, known.function, known.solution_ids)
        assert tuple(p.name for p in loaded.parts) == known.parts
    reads = "import sys, distlab.grading.catalog as c; print(len(c.ENTRIES), 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", reads], capture_output=True, text=True,
                          check=True).stdout.split() == [str(len(modules)), "False"]


def test_a_new_exercise_module_is_discovered(tmp_path: Path) -> None:
    from distlab.grading import catalog

    module = tmp_path / "ex9_new.py"
    module.write_text('FUNCTION = "f"\nPARTS = (\n    Part("one", "t", ()),\n    Part("two", "t", ()),\n)\n'
                      'EXERCISE = Exercise(key="ex9", assignment="ex9_new", function=FUNCTION, '
                      'solution_ids=(FUNCTION, "extra"), setup_source="", parts=PARTS, rank_main=None, judge=None)\n')
    found = catalog._Declaration(module).entry()
    assert (found.key, found.assignment, found.function, found.solution_ids, found.parts) == (
        "ex9", "ex9_new", "f", ("f", "extra"), ("one", "two"))


def _repeated_windows(paths: list[Path], size: int = 6) -> list[str]:
    """Runs of ``size`` identical non-blank lines that two of ``paths`` share. The lines of an
    ``EXERCISE = Exercise(name=NAME, ...)`` declaration do not count: every exercise declares the
    same fields."""
    import itertools
    import re

    plain = re.compile(r"\w+=[\w.]+,|\)|[A-Z]+ = \w+\(")
    windows: dict[Path, set[tuple[str, ...]]] = {}
    for path in paths:
        lines = [line.strip() for line in path.read_text().splitlines()]
        windows[path] = {tuple(lines[i:i + size]) for i in range(len(lines) - size + 1)
                         if all(lines[i:i + size]) and not all(plain.fullmatch(x) for x in lines[i:i + size])}
    return [f"{a.name} and {b.name}: {sorted(windows[a] & windows[b])[0]}"
            for a, b in itertools.combinations(paths, 2) if windows[a] & windows[b]]


def test_no_two_exercises_repeat_code(tmp_path: Path) -> None:
    """What the exercises share (the rank loop, the checks, the in-kernel helper) lives once in
    harness, compare, training and runner, not copied from one exercise module to the next."""
    package = REPO / "src" / "distlab" / "grading"
    assert _repeated_windows(sorted(package.glob("ex*_*.py"))) == []
    # the check finds six lines copied from an exercise's judge, and lets a declaration's fields be
    ring = package / "ex2_ring_all_reduce.py"
    lines = ring.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def ring_problem("))
    copied = tmp_path / "ex9_copy.py"
    copied.write_text("\n".join(lines[start:start + 6]) + "\n")
    assert _repeated_windows([ring, copied]) != []
    declaration = "EXERCISE = Exercise(\n" + "".join(
        f"    {name}={name.upper()},\n" for name in ("setup_source", "parts", "rank_main", "judge")) + ")\n"
    twins = [tmp_path / "ex8_a.py", tmp_path / "ex9_b.py"]
    for twin in twins:
        twin.write_text(declaration)
    assert _repeated_windows(twins) == []


@pytest.mark.parametrize("name", [e.key for e in ENTRIES])
def test_notebook_cells_match_the_graded_parts(name: str) -> None:
    ex = exercise(name)
    nb = nbformat.read(REPO / "solutions" / ex.assignment / f"{ex.assignment}.ipynb", as_version=4)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    assert by_id["setup"].source == ex.setup_source  # the grader runs its own copy of this cell
    assert all(by_id[answer].metadata.nbgrader.solution for answer in ex.solution_ids)
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert [c.metadata.nbgrader.grade_id for c in tests] == [p.grade_id for p in ex.parts]
    for cell in tests:
        last = ast.parse(cell.source).body[-1]
        # nbgrader reads a trailing value as partial credit: only calls that return None may end a cell
        assert not isinstance(last, ast.Expr) or isinstance(last.value, ast.Call), cell.source


# --- real ranks ---------------------------------------------------------------------------------------
def _every_route() -> dict[str, Any]:
    """On each rank: communicate in every way a submission might, each watched separately."""
    import torch
    import torch.distributed as dist

    from distlab.grading import guard

    watcher = guard.install()
    routes = {
        "all_reduce": lambda t: dist.all_reduce(t),
        "process_group": lambda t: dist.group.WORLD.allreduce([t]).wait(),
        "backend": lambda t: dist.group.WORLD._get_backend(torch.device("cpu")).allreduce([t]).wait(),
        "store": lambda t: dist.distributed_c10d._get_default_store().set(f"k{dist.get_rank()}", "v"),
        "allowed": lambda t: (dist.reduce_scatter(torch.empty(2), list(t.chunk(2))),
                              dist.all_gather(list(torch.empty(4).chunk(2)), t[:2])),
    }
    logs = {}
    for name, route in routes.items():
        with watcher.watch() as log:
            route(torch.ones(4))
        logs[name] = log
    for name, around in _around_the_recorder().items():
        with watcher.watch() as log:
            around(torch.ones(4), log)
        logs[name] = log
    with watcher.watch() as log:
        from torch.utils._python_dispatch import _pop_mode

        _pop_mode()  # a submission switching the recorder off
    logs["tampered"] = log
    return logs


def _around_the_recorder() -> dict[str, Any]:
    """Ways to communicate that no hook sees: only the backends' own counters notice them."""
    import threading

    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.utils._python_dispatch import _disable_current_modes

    def modes_off(t: Any, log: Any) -> None:
        with _disable_current_modes():
            funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))

    def other_thread(t: Any, log: Any) -> None:  # dispatch modes belong to the thread that set them
        worker = threading.Thread(target=lambda: funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD)))
        worker.start()
        worker.join()

    def record_removed(t: Any, log: Any) -> None:
        dist.all_reduce(t)
        log["ops"].clear()

    return {"modes off": modes_off, "other thread": other_thread, "record removed": record_removed}


def test_guard_sees_every_route_to_the_wire() -> None:
    logs = distlab.run(_every_route, world_size=2, timeout=60)[0]
    rule = {"allowed": ("reduce_scatter", "all_gather"), "required": ()}
    assert "all_reduce" in (compare.comm_problem(logs["all_reduce"], **rule) or "")
    assert "all_reduce" in (compare.comm_problem(logs["process_group"], **rule) or "")
    assert not any(e["via"] == "python" for e in logs["process_group"]["ops"])  # invisible to the tracer
    assert "backend directly" in (compare.comm_problem(logs["backend"], **rule) or "")
    assert "rendezvous store" in (compare.comm_problem(logs["store"], **rule) or "")
    assert compare.comm_problem(logs["allowed"], **rule) is None
    assert logs["tampered"]["violations"] == ["the dispatch recorder was removed"]
    for honest in ("all_reduce", "process_group", "backend", "store", "allowed"):
        assert logs[honest]["violations"] == [], honest
    for around in ("modes off", "other thread", "record removed"):
        assert logs[around]["violations"] == ["1 communication(s) went around the recorder"], around
        assert "tampered with the grader's communication recorder" in (compare.comm_problem(logs[around], **rule) or "")


def _honest_routes() -> dict[str, tuple[int, list[str]]]:
    """On each rank: how far the C++ counters moved, and the violations, for honest communication."""
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from distlab.grading import guard

    warnings.simplefilter("ignore")  # torch 2.13's renames: not what this test is about
    watcher = guard.install()
    ws, r = dist.get_world_size(), dist.get_rank()
    pair = dist.new_group([0, 1])
    one, many = torch.ones(1), [torch.ones(1) for _ in range(ws)]
    routes = {
        "reduce_scatter list": lambda: dist.reduce_scatter(torch.empty(1), many),  # gloo: ws operations
        "monitored_barrier": lambda: dist.monitored_barrier(),  # rank 0 talks to every other rank
        "objects": lambda: (dist.all_gather_object([None] * ws, r), dist.broadcast_object_list([r], 0)),
        "subgroup": lambda: dist.all_reduce(torch.ones(1), group=pair) if r < 2 else None,
        "async": lambda: dist.all_reduce(torch.ones(2), async_op=True).wait(),
        "coalesced": lambda: dist.all_reduce_coalesced([torch.ones(1), torch.ones(2)]),
        "p2p": lambda: [w.wait() for w in (dist.isend(one, (r + 1) % ws), dist.irecv(torch.empty(1), (r - 1) % ws))],
        "functional": lambda: funcol.wait_tensor(funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)),
        "ddp": lambda: torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))(torch.ones(1, 4)).sum().backward(),
        "a group made inside": lambda: dist.all_reduce(torch.ones(1), group=dist.new_group(list(range(ws)))),
    }
    seen = {}
    for name, route in routes.items():
        with watcher.watch() as log:
            route()
        seen[name] = (sum(int(e.get("seq") or 0) for e in log["ops"]), log["violations"])
    return seen


def test_honest_communication_balances_the_counters() -> None:
    """The tamper check must never fire on a correct answer, however it communicates."""
    per_rank = distlab.run(_honest_routes, world_size=4, timeout=120)
    for rank, seen in enumerate(per_rank):
        for name, (_moved, violations) in seen.items():
            assert violations == [], (rank, name, violations)
        assert seen["reduce_scatter list"][0] >= 1 and seen["ddp"][0] >= 1, seen  # the counters do move
    assert per_rank[2]["subgroup"][0] == 0 and per_rank[0]["subgroup"][0] == 1


def test_visible_helper_passes_a_correct_function_and_explains_a_wrong_one() -> None:
    ex1.try_case(reference_all_reduce, world_size=3, shape=(2,), op="MAX", check_comm=True)
    with pytest.raises(AssertionError) as failure:
        ex1.try_case(sums_locally, world_size=3, shape=(7,))
    text = str(failure.value)
    assert text.startswith("world_size=3, shape=(7,) (numel=7), float32, op=SUM: rank 0 got [")
    assert "expected [" in text


def all_to_all_sum(tensor: Any) -> None:
    """Right sums from point-to-point messages, but not a ring: every rank sends its whole tensor
    to every other rank."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = tensor.clone()
    for step in range(1, world):
        got = torch.empty_like(tensor)
        ops = [dist.P2POp(dist.isend, mine, (rank + step) % world),
               dist.P2POp(dist.irecv, got, (rank - step) % world)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        tensor.add_(got)


def rebuild_the_other_ranks_input() -> Any:
    """What a submission would do to copy the reference: rebuild another rank's input itself."""
    import torch.distributed as dist

    from distlab.grading.cases import Case, make_input

    return make_input(Case((8,)), 2, 1 - dist.get_rank())


def test_a_rank_cannot_make_the_inputs_the_grader_sends_to_the_others() -> None:
    from distlab.grading.cases import Case, make_input

    with_data = [e.key for e in ENTRIES if e.key != "ex7"]  # ex7 calls formulas on numbers in its cases
    assert all(exercise(key).rank_inputs is not None for key in with_data)
    assert exercise("ex7").rank_inputs is None
    rebuilt = distlab.run(rebuild_the_other_ranks_input, world_size=2)
    for rank in (0, 1):  # what rank 1 - rank was sent, and what rank rank makes of it
        assert not torch.equal(rebuilt[rank], make_input(Case((8,)), 2, 1 - rank))
    assert torch.equal(make_input(Case((8,)), 2, 0), make_input(Case((8,)), 2, 0))  # the judge's twin
    # and the inputs a rank is sent are that rank's own, one per case
    batch = ex1.PARTS[0].batches[0]
    sent = [EX1.rank_inputs(batch, rank) for rank in range(batch.world_size)]  # type: ignore[misc]
    assert all(torch.equal(sent[r][i], make_input(case, batch.world_size, r))
               for r in range(batch.world_size) for i, case in enumerate(batch.cases))


def test_a_part_s_checks_decide_what_its_judge_checks_not_its_name() -> None:
    from distlab.grading import ex2_ring_all_reduce as ex2
    from distlab.grading.spec import Batch, Check, Part, Submission

    batch = Batch(3, (ex2.Case((6,)),))
    submission = Submission(ex2.FUNCTION, fn=all_to_all_sum)
    named_steps = Part("steps", "named like the graded part, checks nothing more", (batch,))
    assert runner.run_batch(ex2.EXERCISE, submission, named_steps, batch, 30) is None
    checks_steps = Part("any", "checks the steps", (batch,), frozenset({Check.STEPS}))
    assert "2(n-1) = 4 steps" in (runner.run_batch(ex2.EXERCISE, submission, checks_steps, batch, 30) or "")
    assert ex2.EXERCISE.part("steps").checks == {Check.STEPS}


def test_check_runs_a_hidden_part_from_the_kernel() -> None:
    distlab.grading.check("ex1", "subgroup", reference_all_reduce)
    with pytest.raises(AssertionError, match="ex1 part 'dtypes'"):
        distlab.grading.check("ex1", "dtypes", sums_locally)


def test_a_submission_that_cannot_load_fails_every_part_at_once() -> None:
    result = runner.grade_submission(EX1, "def all_reduce_rs_ag(tensor, op, group):\n    return (", 20)
    assert [p.passed for p in result.parts] == [False] * len(EX1.parts)
    assert all("does not compile: line 2" in p.message for p in result.parts)
    assert sum(p.seconds for p in result.parts[1:]) == 0  # only the first part started ranks
    # an IPython line above does not move the error to it: the student is told the line to fix
    result = runner.grade_submission(EX1, "%%time\n!pip list\ndef all_reduce_rs_ag(tensor, op, group):\n    return (", 20)
    assert all("does not compile: line 4" in p.message for p in result.parts), result.parts[0].message


def test_an_answer_cell_without_its_id_is_the_last_cell_defining_the_function() -> None:
    from distlab.grading.extract import recover_answer_cell, solution_source

    def cell(source: str, grade_id: str | None = None, kind: str = "code") -> dict:
        meta = {"nbgrader": {"grade_id": grade_id, "locked": True}} if grade_id else {}
        return {"cell_type": kind, "source": source, "metadata": meta}

    nb = {"cells": [cell("def f(x):\n    return 0", kind="markdown"), cell("def f(x):\n    return 1"),
                    cell("assert f(1) == 2", grade_id="test_f"), cell("%%dist\ndef f(x):\n    return 2"),
                    cell("print(f(1))")]}
    assert recover_answer_cell(nb, ("f",), "f") == 3
    assert solution_source(nb, ("f",)) == "%%dist\ndef f(x):\n    return 2"
    assert recover_answer_cell(nb, ("f",), "f") is None  # it has its id now: nothing more to do
    assert recover_answer_cell({"cells": [cell("def g(): pass")]}, ("f",), "f") is None
    assert recover_answer_cell({"cells": [cell("def f(): pass")]}, ("f", "f_helpers"), "f") is None



# --- the reference's timing, shared by the workers of one class ------------------------------------
_SHARED_WORKER = r"""
import json, os, sys, time
from distlab.grading.runner import Budgets
from distlab.grading.session import SharedBudgets
folder, log, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(os.path.join(folder, f"ready-{os.getpid()}"), "w").close()
while len([n for n in os.listdir(folder) if n.startswith("ready-")]) < 2:  # start together
    time.sleep(0.001)
got = []
for round_ in range(rounds):  # a class each: the two workers race for every one of them
    def measure():
        with open(log, "a") as handle:
            handle.write(f"{round_}\n")
        return Budgets({"divisible": 2.5 + round_}, 4.0, 20.0)
    got.append(SharedBudgets(os.path.join(folder, str(round_)), 20.0).get("ex1_all_reduce_rs_ag", measure).expected)
print(json.dumps(got))
"""
ROUNDS = 100


def test_the_workers_of_one_class_time_each_reference_once(tmp_path: Path) -> None:
    log = tmp_path / "measured.log"
    workers = [subprocess.Popen([sys.executable, "-c", _SHARED_WORKER, str(tmp_path), str(log), str(ROUNDS)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    expected = [{"divisible": 2.5 + r} for r in range(ROUNDS)]
    assert [json.loads(out) for out, _ in outputs] == [expected, expected]
    # in every round one of the two timed it and the other read it
    assert sorted(int(line) for line in log.read_text().splitlines()) == list(range(ROUNDS))
    assert not list(tmp_path.glob("*/*.claim"))


def test_a_worker_that_claims_just_as_another_lets_go_reads_its_budgets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a loaded machine once hit: this worker looked (no budgets yet), the other wrote them
    and gave its claim up, and this worker's claim then succeeded. It must read them, not time again."""
    from distlab.grading import session

    timed = runner.Budgets({"divisible": 3.0}, 5.0, 20.0)
    (tmp_path / "ex1_all_reduce_rs_ag.json").write_text(json.dumps(dataclasses.asdict(timed)))
    looks: list[str] = []
    real_read = session._read_budgets

    def read_too_early(path: str) -> runner.Budgets | None:
        looks.append(path)
        return None if len(looks) == 1 else real_read(path)  # the first look came before the write

    monkeypatch.setattr(session, "_read_budgets", read_too_early)
    measured: list[str] = []

    def measure() -> runner.Budgets:
        measured.append("again")
        return runner.Budgets({}, 0.0, 20.0)

    assert session.SharedBudgets(str(tmp_path), 20.0).get(EX1.assignment, measure) == timed
    assert measured == [] and not (tmp_path / "ex1_all_reduce_rs_ag.json.claim").exists()


def test_a_worker_waits_for_the_budgets_another_worker_is_timing(tmp_path: Path) -> None:
    from distlab.grading.session import SharedBudgets

    (tmp_path / "ex1_all_reduce_rs_ag.json.claim").write_text(str(os.getpid()))  # a live claimant
    measured: list[str] = []
    got: list[runner.Budgets] = []

    def measure() -> runner.Budgets:
        measured.append("here")
        return runner.Budgets({}, 0.0, 20.0)

    waiter = threading.Thread(target=lambda: got.append(SharedBudgets(str(tmp_path), 20.0).get(EX1.assignment, measure)))
    waiter.start()
    timed = runner.Budgets({"divisible": 3.0}, 5.0, 20.0)  # what the claimant then writes, as it does:
    written = tmp_path / "ex1_all_reduce_rs_ag.json.tmp"  # whole, then renamed (a reader never sees it half written)
    written.write_text(json.dumps(dataclasses.asdict(timed)))
    written.replace(tmp_path / "ex1_all_reduce_rs_ag.json")
    waiter.join(timeout=120)
    assert got == [timed] and measured == []


def test_a_claim_given_back_or_left_by_a_dead_worker_is_not_waited_for(tmp_path: Path) -> None:
    from distlab.errors import ReferenceFailed
    from distlab.grading.session import SharedBudgets

    shared = SharedBudgets(str(tmp_path), 1000.0)  # waiting out a claim would take hours: the test would time out
    timed = runner.Budgets({"divisible": 2.0}, 4.0, 1000.0)

    def failing() -> runner.Budgets:
        raise ReferenceFailed.on_part(EX1.assignment, "divisible", "wrong")

    with pytest.raises(ReferenceFailed):
        shared.get(EX1.assignment, failing)
    assert not (tmp_path / "ex1_all_reduce_rs_ag.json.claim").exists()  # given back
    assert shared.get(EX1.assignment, lambda: timed) == timed  # the next worker times it itself

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "ex1_all_reduce_rs_ag.json").unlink()
    (tmp_path / "ex1_all_reduce_rs_ag.json.claim").write_text(gone.stdout.strip())  # a worker that died timing it
    assert shared.get(EX1.assignment, lambda: timed) == timed
