"""04 scatter and gather: hand out one task to each rank, collect the reports."""

from nbkit import code, dist, md, predict, setup

STEM = "04_scatter_gather"

CELLS = [
    md(
        """
        # 04 · `scatter` and `gather`: hand out tasks, collect reports

        `broadcast` gives everyone **the same** message. Often the captain instead has a big job
        and wants to hand **a different piece** to each member, then collect what each one
        found. That is `scatter`, then `gather`: two operations that undo each other.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. split a list of tensors on one rank into one piece per rank with `dist.scatter`;
        2. collect one tensor from every rank into a list on one rank with `dist.gather`;
        3. say which arguments only the root rank passes, and what the others pass instead;
        4. collect Python objects with `dist.gather_object` and hand them out with
           `dist.scatter_object_list`.
        """
    ),
    md(
        """
        ## The idea

        The captain has 8 numbers to square and 4 team members. He cuts the list into 4 tasks of
        2 numbers and gives task *i* to member *i* (himself included): **scatter**. Everyone
        squares their two numbers. Then each member hands a report back and the captain lines
        them up in rank order: **gather**.

        Only the captain holds the full list, so only he passes it:

        - `dist.scatter(out, scatter_list, src=0)`: on `src`, `scatter_list` has `world_size`
          tensors; every rank (`src` too) receives its piece into `out`. Others pass `None`.
        - `dist.gather(t, gather_list, dst=0)`: every rank sends `t`; on `dst`, `gather_list` has
          `world_size` buffers that receive them in rank order. Others pass `None`.

        ![Scatter from rank 0 gives each rank one slice of the table; gather brings the slices back to rank 0](figures/04_scatter_gather.svg)
        """
    ),
    setup(),
    dist(
        """
        task = torch.zeros(2, device=device)  # every rank: room for one task of 2 numbers
        if rank == 0:
            job = torch.arange(1.0, 2 * world_size + 1, device=device)  # 8 numbers on 4 ranks
            tasks = list(job.chunk(world_size))  # world_size tasks of shape (2,)
        else:
            job, tasks = None, None  # only src passes the list
        before = job if rank == 0 else task.clone()

        dist.scatter(task, tasks, src=0)
        task.tolist()
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        before = %dist_pull before
        tasks_after = %dist_pull task
        show_buffers(before, title="before scatter: only rank 0 has data")
        show_buffers(tasks_after, title="after scatter(src=0): rank i holds task i")
        """
    ),
    md(
        """
        Now each member does its part, and the captain gathers the reports.
        """
    ),
    dist(
        """
        report = task * task  # the actual work, on each rank's own piece

        if rank == 0:
            reports = [torch.empty(2, device=device) for _ in range(world_size)]
        else:
            reports = None  # only dst passes the list
        dist.gather(report, reports, dst=0)

        if rank == 0:
            result = torch.cat(reports)
            print("captain's result:", result.tolist())
        """
    ),
    code(
        """
        reports_kernel = %dist_pull report
        show_buffers(reports_kernel, title="before gather: each rank's report")
        result = %dist_pull result --ranks 0
        others = [None] * (len(reports_kernel) - 1)  # the other ranks hold no result
        show_buffers(result + others, title="after gather(dst=0): rank 0 holds all")
        """
    ),
    md(
        """
        ## Predict, then run
        """
    ),
    predict(
        """
        On 4 ranks, rank 2 is the root. It holds `scatter_list = [10, 11, 12, 13]` (four
        one-element tensors), and everyone scatters, adds their rank, and gathers back to rank 2.
        What does rank 2's list hold at the end?
        """,
        """
        Rank *i* receives `10 + i` and adds *i*: `10 + 2i`. Rank 2 gathers them in rank order:
        `[10, 12, 14, 16]`.
        """,
    ),
    dist(
        """
        piece = torch.zeros(1, device=device)
        items = [torch.tensor([10.0 + i], device=device) for i in range(world_size)]
        dist.scatter(piece, items if rank == 2 else None, src=2)
        piece += rank
        back = [torch.empty(1, device=device) for _ in range(world_size)] if rank == 2 else None
        dist.gather(piece, back, dst=2)
        if rank == 2:
            print([t.item() for t in back])
        """
    ),
    md(
        """
        ### Python objects: `gather_object` and `scatter_object_list`

        Reports are often not tensors: a dict of metrics, a string. `dist.gather_object(obj,
        object_list, dst)` pickles each rank's object and fills `object_list` on `dst` (others
        pass `None`). Its sibling `dist.scatter_object_list(output_list, input_list, src)` hands
        out one object per rank.
        """
    ),
    dist(
        """
        metrics = {"rank": rank, "loss": round(1.0 / (rank + 1), 3)}
        all_metrics = [None] * world_size if rank == 0 else None
        dist.gather_object(metrics, all_metrics, dst=0)
        if rank == 0:
            for m in all_metrics:
                print(m)

        team = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
        names = [team[r % len(team)] for r in range(world_size)] if rank == 0 else None
        mine = [None]  # one slot for this rank's object
        dist.scatter_object_list(mine, names, src=0)
        print("my name is", mine[0])
        """
    ),
    md(
        """
        ## Pitfalls

        - **Only the root passes the list.** On other ranks pass `None`. With a list on a
          non-root rank, torch raises an error.
        - **The list has exactly `world_size` entries**, including one for the root itself.
        - **All pieces have the same shape and dtype.** For uneven pieces, pad them to one size
          (notebook 06 shows how), or use `all_to_all_single` with split sizes (notebook 08).
        - **The root is a bottleneck.** It sends or receives `(world_size - 1)` pieces alone.
          When everyone needs the result, prefer `all_gather` (notebook 06).
        - **Object versions with NCCL** need `torch.cuda.set_device(local_rank)` first.
        """
    ),
    md(
        """
        ## Self-check

        Compute the captain's gathered result for the squares example in the kernel (no torch
        needed: plain Python), and compare it with what rank 0 holds.
        """
    ),
    code(
        """
        from distlab.i18n import passed

        n = len(tasks_after)  # the number of ranks: 2 numbers each
        expected = [float(k * k) for k in range(1, 2 * n + 1)]
        got = result[0].tolist()
        assert got == expected, (got, expected)
        assert tasks_after[-1].tolist() == [2 * n - 1.0, 2 * n]  # the last task, the last rank
        passed(got)
        """
    ),
    md(
        """
        ## Summary

        - `scatter`: the root's list of `world_size` tensors, one piece to each rank.
        - `gather`: one tensor from each rank, into a list on the root, in rank order.
        - Only the root passes the list; the others pass `None`.
        - `gather_object` / `scatter_object_list` do the same for picklable Python objects.

        ## Next

        [05 · reduce and all_reduce](05_reduce_all_reduce.ipynb): instead of lining the reports
        up, add them together.
        """
    ),
]
