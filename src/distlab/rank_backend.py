"""A matplotlib backend for ranks: figures drawn on a rank show up in the cell that drew them.

Ranks have no screen; this renders with Agg and sends each figure to the kernel through the
rank's ``display``. It is selected with MPLBACKEND before the rank imports matplotlib.
"""

from __future__ import annotations

from typing import Any

from matplotlib import pyplot as plt
from matplotlib._pylab_helpers import Gcf
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

from distlab import rank_display

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args: Any, **kwargs: Any) -> None:
    """Display every open figure in the cell, then close it (like Jupyter's inline backend)."""
    for manager in Gcf.get_all_fig_managers():
        if rank_display.current_display is not None:
            rank_display.current_display(manager.canvas.figure)
        plt.close(manager.canvas.figure)
