"""00 Welcome: what the course covers and how a %%dist cell runs."""

from nbkit import code, dist, md, predict, setup

STEM = "00_welcome"

CELLS = [
    md(
        """
        # 00 · Welcome: one notebook, four processes

        Training a large model on many GPUs is teamwork. Every GPU (every *rank*) computes on its
        own piece of the data, and then the team has to talk: share gradients, hand out
        parameters, collect results. That talk is done with a handful of **communication
        primitives** in `torch.distributed`. This course teaches each of them by running it, on
        real processes, right here in the notebook.

        | Notebook | Topic |
        |---|---|
        | 00 | Welcome: how `%%dist` cells work (this one) |
        | 01 | Process groups: how ranks find each other |
        | 02 | Point-to-point: `send`, `recv`, deadlock |
        | 03 | `broadcast`: the captain gives an order |
        | 04 | `scatter` and `gather`: hand out tasks, collect reports |
        | 05 | `reduce` and `all_reduce`: add everything up |
        | 06 | `all_gather`: everyone gets everyone's piece |
        | 07 | `reduce_scatter`: add up, and each keeps one part |
        | 08 | `all_to_all`: everyone sends a letter to everyone |
        | 09 | Composing collectives: the ring, cost models, bandwidth |
        | 10 | Collectives in training: DDP, bucketing, ZeRO and FSDP |
        | 11 | Measuring: latency and bandwidth on this machine |
        | 12 | Cost at scale: a 10B model on 64 GPUs |

        Every cell is written for any number of ranks. The course uses 4; change `-n 4` to 3 or
        8 in any notebook to see what changes.

        The course is also in Chinese: [中文版](zh/00_welcome.ipynb) (`make lab LANG=zh` opens it).
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. run a cell on 4 ranks with `%%dist -n 4` and read its labelled output;
        2. say what `rank`, `world_size` and `device` are on each rank;
        3. keep state on the ranks across cells, and move values between the ranks and this kernel
           with `%dist_pull` and `%dist_push`;
        4. recognise what a failing rank looks like;
        5. check which backends and devices your machine offers.
        """
    ),
    md(
        """
        ## The idea

        Picture a team of four people at four desks. A coordinator (this notebook's kernel) hands
        every member **the same instruction sheet** (the cell). Each member reads it and works
        through it at their own desk, with their own notepad (their own Python namespace). The
        only thing that differs between them is the number on their badge: the **rank**, 0 to 3.

        So one cell, run by four processes, can do four different things: `if rank == 0: ...`.

        First load the extension, then start the team: `%dist_start -n 4` starts 4 rank
        processes and returns when all of them have joined. (Skip it and the first `%%dist` cell
        starts them for you.)

        ![Four ranks' buffers before and after one all_reduce: each starts with its own number, all end with the sum](figures/00_all_reduce.svg)
        """
    ),
    setup(),
    md(
        """
        Now a cell that every rank runs. Each rank builds a small tensor filled with its own rank
        number and says hello. Output lines are labelled with the rank that printed them.
        """
    ),
    dist(
        """
        t = torch.full((3,), rank, device=device)
        print(f"hello from rank {rank} of {world_size}, my tensor is {t.tolist()}")
        """
    ),
    md(
        """
        The same cell ran four times, once per rank. Here is every rank's `t`, pulled back into
        this kernel and drawn as a grid: one row per rank, one coloured cell per element.
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        ts = %dist_pull t
        show_buffers(ts, title="t on each rank")
        """
    ),
    md(
        """
        ### Each rank keeps its own namespace

        Variables survive from one `%%dist` cell to the next, on each rank separately. If the
        last line of a cell is an expression, every rank shows its value.
        """
    ),
    dist(
        """
        x = rank * 10
        x + 1
        """
    ),
    md(
        """
        ## Predict, then run

        Every rank runs the cell below. Before you run it, write down what each rank shows.
        """
    ),
    predict(
        """
        ```python
        x = x + rank
        x
        ```
        """,
        """
        `x` was `rank * 10` and is now `rank * 10 + rank = 11 * rank`: rank 0 shows 0, rank 1
        shows 11, rank 2 shows 22, rank 3 shows 33. Each rank changed only its own `x`.
        """,
    ),
    dist(
        """
        x = x + rank
        x
        """
    ),
    md(
        """
        ### Moving values between the kernel and the ranks

        The kernel and the ranks are different processes: a variable in one is not visible in the
        other. Two line magics copy values across:

        - `%dist_pull NAME` returns a list, indexed by rank, of every rank's `NAME`;
        - `%dist_push NAME` sends this kernel's `NAME` to every rank.
        """
    ),
    code(
        """
        xs = %dist_pull x
        print(xs)

        scale = 0.5
        %dist_push scale
        """
    ),
    dist(
        """
        x * scale
        """
    ),
    md(
        """
        ### What a failure looks like

        When one rank raises, the whole cell fails, and the error tells you which rank failed and
        on which line of the cell. The cell below is tagged `raises-exception`, so running the
        notebook from top to bottom carries on past it.
        """
    ),
    dist(
        """
        if rank == 2:
            raise ValueError("rank 2 cannot find its input file")
        print("rank", rank, "is fine")
        """,
        tags=["raises-exception"],
    ),
    md(
        """
        The other ranks finished normally; the cell still failed, because one failing rank fails
        the team. Had the healthy ranks been waiting for rank 2 in a collective, they would have
        waited until the process group's timeout (30 minutes for gloo: notebook 02 shows where
        torch keeps it). `%%dist` does not let them: it stops such a cell shortly after the first
        failure, or at its deadline (`--timeout`, in seconds), shows where each rank was stuck,
        and restarts the ranks. Notebook 02 shows a cell that hangs.

        You can use the same engine from plain Python with `distlab.run(fn, world_size=...)`, which
        returns every rank's return value, and raises `distlab.errors.RankError` when a rank
        fails. The error records each failure: its rank, exception type and message.
        """
    ),
    code(
        """
        import distlab
        from distlab.errors import RankError


        def greet(word):
            import torch.distributed as dist

            return f"{word} from rank {dist.get_rank()}"


        print(distlab.run(greet, world_size=2, args=("hi",)))


        def unlucky():
            import torch.distributed as dist

            if dist.get_rank() == 1:
                raise KeyError("missing")
            return "ok"


        try:
            distlab.run(unlucky, world_size=2)
        except RankError as err:
            failure = err.failures[0]
            print("rank", failure.rank, "raised", failure.exc_type)
        """
    ),
    md(
        """
        ### Check your environment

        The course runs on CPUs with the **gloo** backend. On a machine with one NVIDIA GPU per
        rank the same cells run with `%%dist -n 4 --backend nccl`. Here is what this machine
        offers.
        """
    ),
    code(
        """
        import os

        import torch
        import torch.distributed as tdist

        print("torch", torch.__version__)
        print("torch.distributed available:", tdist.is_available())
        print("gloo:", tdist.is_gloo_available(), "| nccl:", tdist.is_nccl_available(),
              "| mpi:", tdist.is_mpi_available())
        print("CUDA GPUs:", torch.cuda.device_count(), "| CPU cores:", os.cpu_count())
        """
    ),
    dist(
        """
        print(dist.get_backend(), device)
        """
    ),
    md(
        """
        ## Pitfalls

        - **Ranks share nothing.** A variable set in the kernel does not exist on the ranks until
          you `%dist_push` it; a rank's variable is not in the kernel until you `%dist_pull` it.
        - **Output order is not execution order.** Lines from different ranks arrive as they are
          printed; rank 3's line may come before rank 0's. Do not read timing from it.
        - **One rank failing fails the cell.** Read the error: it says which rank and which line.
        - **Collectives need every rank.** A cell where only some ranks call a collective waits
          until the deadline. Notebook 02 shows this.
        """
    ),
    md(
        """
        ## Self-check

        Predict each rank's value of `x * x`, compute the list in the kernel, then check it
        against the ranks. The cell prints "self-check passed" when you are right.
        """
    ),
    dist(
        """
        sq = x * x
        """
    ),
    code(
        """
        from distlab.i18n import passed

        got = %dist_pull sq
        expected = [(11 * r) ** 2 for r in range(len(got))]  # x was 11 * rank
        assert got == expected, (got, expected)
        passed(got)
        """
    ),
    md(
        """
        ## Summary

        - `%%dist -n 4` runs the cell on 4 processes; each knows its `rank` and the `world_size`.
        - Each rank keeps its own variables across cells.
        - `%dist_pull` and `%dist_push` move values between the kernel and the ranks.
        - One failing rank fails the cell, and the error says which rank and which line.

        ## Next

        [01 · Process groups](01_process_groups.ipynb): how the ranks found each other before your
        first cell ran, and how to make smaller teams inside the team.
        """
    ),
]
