"""The alpha-beta fit recovers known parameters; busbw uses the nccl-tests factors."""

from __future__ import annotations

import numpy as np
import pytest

from distlab import costmodel
from distlab.costmodel import AlphaBeta, bus_factor, busbw, fit_alpha_beta

SIZES = np.array([2.0**k for k in range(10, 27)])  # 1 KiB .. 64 MiB, as the benchmark sweeps


def test_fit_recovers_known_alpha_beta_exactly_without_noise() -> None:
    alpha, beta = 25e-6, 1 / 2.5e9  # 25 us latency, 2.5 GB/s
    model = fit_alpha_beta(SIZES, alpha + beta * SIZES)
    assert model.alpha == pytest.approx(alpha, rel=1e-9)
    assert model.beta == pytest.approx(beta, rel=1e-9)
    assert model.bandwidth == pytest.approx(2.5)


def test_fit_recovers_known_params_from_noisy_timings() -> None:
    rng = np.random.default_rng(0)
    alpha, beta = 40e-6, 1 / 1.2e9
    times = (alpha + beta * SIZES) * rng.lognormal(0.0, 0.05, size=SIZES.shape)  # 5% jitter
    model = fit_alpha_beta(SIZES, times)
    assert model.alpha == pytest.approx(alpha, rel=0.1)
    assert model.beta == pytest.approx(beta, rel=0.05)
    assert np.allclose(model.predict(SIZES), alpha + beta * SIZES, rtol=0.1)


def test_relative_fit_keeps_latency_that_a_plain_fit_loses() -> None:
    """Absolute least squares lets the 64 MiB point decide alpha too; weighting by 1/t does not."""
    rng = np.random.default_rng(1)
    alpha, beta = 10e-6, 1 / 5e9
    times = (alpha + beta * SIZES) * rng.lognormal(0.0, 0.05, size=SIZES.shape)
    relative = fit_alpha_beta(SIZES, times)
    plain = fit_alpha_beta(SIZES, times, relative=False)
    assert abs(relative.alpha - alpha) < abs(plain.alpha - alpha)


def test_fit_rejects_too_little_data() -> None:
    with pytest.raises(ValueError):
        fit_alpha_beta([1024.0], [1e-5])
    with pytest.raises(ValueError):
        fit_alpha_beta([1024.0, 1024.0], [1e-5, 2e-5])


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 4, 1.5), ("all_reduce", 2, 1.0), ("reduce_scatter", 4, 0.75),
        ("reduce_scatter_single", 4, 0.75), ("all_gather_into_tensor", 8, 0.875),
        ("all_to_all_single", 2, 0.5), ("broadcast", 4, 1.0), ("reduce", 8, 1.0),
        ("barrier", 4, 0.0), ("isend", 2, 1.0),
    ],
)
def test_bus_factors_are_nccl_tests(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == pytest.approx(factor)


def test_busbw_is_algbw_times_factor() -> None:
    # 4 MB all_reduce in 2 ms on 4 ranks: algbw 2 GB/s, busbw 3 GB/s
    assert costmodel.algbw(4e6, 2e-3) == pytest.approx(2.0)
    assert busbw("all_reduce", 4, 4e6, 2e-3) == pytest.approx(3.0)


def test_ring_model_counts_two_n_minus_one_steps() -> None:
    model = AlphaBeta(alpha=1e-5, beta=1e-9)
    assert costmodel.ring_all_reduce_time(model, 4, 4e6) == pytest.approx(6 * (1e-5 + 1e-3))
    assert costmodel.ring_all_reduce_time(model, 1, 4e6) == 0.0


def _notebook_12_functions() -> dict:
    """The cost functions notebook 12 defines for the learner, executed from its cells."""
    import sys
    from pathlib import Path

    build = Path(__file__).resolve().parents[1] / "notebooks" / "_build"
    sys.path.insert(0, str(build))
    try:
        import ch12_cost_at_scale as chapter
    finally:
        sys.path.pop(0)
    import ast

    namespace: dict = {}
    for cell in chapter.CELLS:
        if cell.cell_type != "code" or "%" in cell.source.split("\n", 1)[0] or "%dist" in cell.source:
            continue
        tree = ast.parse(cell.source)
        # the definitions only (functions and constants), not the cells' printing and plotting
        keep = [node for node in tree.body if isinstance(node, ast.FunctionDef)
                or (isinstance(node, ast.Assign) and all(name.id.isupper() for t in node.targets
                                                        for name in ast.walk(t) if isinstance(name, ast.Name)))]
        exec(compile(ast.Module(body=keep, type_ignores=[]), "ch12", "exec"), namespace)
    return namespace


def test_notebook_12_reproduces_the_zero_papers_figure_1() -> None:
    """Rajbhandari et al. 2020, Figure 1: 7.5B parameters, 64 GPUs, K = 12."""
    memory_gb = _notebook_12_functions()["memory_gb"]
    assert [round(memory_gb(7.5e9, 64, stage), 2) for stage in range(4)] == [120.0, 31.41, 16.64, 1.88]


def test_notebook_12_zero3_moves_one_and_a_half_times_data_parallel() -> None:
    ns = _notebook_12_functions()
    assert ns["bytes_per_step"](10e9, 64, 3) == 1.5 * ns["bytes_per_step"](10e9, 64, 0)
    assert ns["bytes_per_step"](10e9, 64, 1) == ns["bytes_per_step"](10e9, 64, 0)
    # one node: the hierarchical all_reduce is the ring inside the node
    ring, hier = ns["ring_time"], ns["hierarchical_time"]
    assert abs(hier(20e9, 1, 8) - ring(20e9, 8, ns["ALPHA_INTRA"], ns["LINKS"]["NVLink 4"])) < 1e-12
