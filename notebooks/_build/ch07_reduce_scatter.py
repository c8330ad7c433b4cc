"""07 reduce_scatter: list and single-tensor forms; the other half of all_reduce."""

from nbkit import code, dist, md, predict, setup

STEM = "07_reduce_scatter"

CELLS = [
    md(
        """
        # 07 · `reduce_scatter`: add up, and each keeps one part

        `all_reduce` gives every rank the whole sum. Often a rank needs only **its part** of
        the sum: in ZeRO-2 and FSDP each rank updates only its own shard of the parameters, so it
        needs only that shard's gradient. `reduce_scatter` computes the sum and hands rank *i*
        only slice *i* of it. It does less work than `all_reduce` and gives each rank
        `1 / world_size` of the result.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. sum a list of `world_size` tensors across ranks and keep slice *i* on rank *i* with
           `dist.reduce_scatter(output, input_list)`;
        2. do the same on one flat tensor with `dist.reduce_scatter_single(output, input)`, and
           know its older name `reduce_scatter_tensor`;
        3. rebuild `all_reduce` from `reduce_scatter` followed by `all_gather`;
        4. say why sharded training (ZeRO-2/3, FSDP) uses it for gradients.
        """
    ),
    md(
        """
        ## The idea

        The company has 4 departments and 4 accountants. Every accountant collected receipts for
        **all** departments: accountant *r* has `(r + 1) * [1, 2, 3, 4]`, one entry per
        department. Instead of everyone adding up everything, each accountant takes
        responsibility for **one** department: accountant *i* collects department *i*'s receipts
        from everyone and adds them up.

        Afterwards accountant *i* holds one number: department *i*'s total. Put side by side, the
        four totals are the full sum, `10 * [1, 2, 3, 4]`, **scattered** across the ranks.

        ![Reduce_scatter: every rank holds a full buffer; afterwards rank r holds the sum of slice r](figures/07_reduce_scatter.svg)
        """
    ),
    setup(),
    dist(
        """
        # One entry per department: (rank + 1) * [1, 2, 3, 4] on 4 ranks.
        receipts = (rank + 1) * torch.arange(1.0, world_size + 1, device=device)
        my_total = torch.empty(1, device=device)  # (1,): this rank's department only

        # List form: one input tensor per destination rank.
        dist.reduce_scatter(my_total, list(receipts.chunk(world_size)), op=dist.ReduceOp.SUM)
        my_total.item()
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        before = %dist_pull receipts
        after = %dist_pull my_total
        show_buffers(before, title="before reduce_scatter: every rank has every department")
        show_buffers(after, title="after: rank i holds the total of department i")
        """
    ),
    md(
        """
        ### The single-tensor form: `reduce_scatter_single`

        One flat input of `world_size * k` elements, one output of `k`: rank *i* gets the sum of
        `input[i * k:(i + 1) * k]`. This is the form sharded training uses, on a flat gradient
        buffer.

        Names: torch 2.13 calls it `dist.reduce_scatter_single`. Before 2.13 it was
        `dist.reduce_scatter_tensor`, which still works on 2.13 but prints a `FutureWarning`. On
        mixed versions pick whichever exists (as `distlab.compat.reduce_scatter_single` does):

        ```python
        reduce_scatter_single = (getattr(dist, "reduce_scatter_single", None)
                                 or dist.reduce_scatter_tensor)
        ```
        """
    ),
    dist(
        """
        reduce_scatter_single = (getattr(dist, "reduce_scatter_single", None)
                                 or dist.reduce_scatter_tensor)

        # A flat gradient buffer of 2 elements per rank: (8,) on 4 ranks.
        grads = torch.arange(2.0 * world_size, device=device) * (rank + 1)
        shard = torch.empty(2, device=device)  # (2,) = grads.numel() / world_size
        reduce_scatter_single(shard, grads)
        shard.tolist()
        """
    ),
    md(
        """
        ## Predict, then run
        """
    ),
    predict(
        """
        On 4 ranks, rank *r* held `arange(8) * (r + 1)`. What does rank 1's `shard`
        hold? And what if you use `op=dist.ReduceOp.MAX` instead?
        """,
        """
        The sum over ranks is `arange(8) * (1 + 2 + 3 + 4) = arange(8) * 10`. Rank 1 keeps slice
        1, elements 2 and 3: `[20.0, 30.0]`. With `MAX` the largest multiplier is 4, so rank 1
        gets `[8.0, 12.0]`.
        """,
    ),
    dist(
        """
        shard_max = torch.empty(2, device=device)
        reduce_scatter_single(shard_max, grads, op=dist.ReduceOp.MAX)
        print("SUM", shard.tolist(), "MAX", shard_max.tolist())
        """
    ),
    md(
        """
        ### reduce_scatter + all_gather = all_reduce

        After `reduce_scatter` each rank holds one finished slice of the sum. An `all_gather` of
        the slices gives every rank all of them: the full sum, exactly what `all_reduce` gives.
        Notebook 09 shows why this two-step form is how fast all_reduce algorithms work.
        """
    ),
    dist(
        """
        from distlab.compat import all_gather_single

        full = torch.empty(2 * world_size, device=device)
        all_gather_single(full, shard)  # every rank: every rank's summed slice

        reference = grads.clone()
        dist.all_reduce(reference)
        print(full.tolist(), torch.equal(full, reference))
        """
    ),
    md(
        """
        ### An honest note about gloo

        NCCL implements reduce_scatter as its own ring algorithm, which moves less data than an
        all_reduce. **gloo does not**: on the CPU backend, torch builds `reduce_scatter` out of
        all-reduces (pytorch issues #149869 and #118911). So on this machine `reduce_scatter`
        is not cheaper than `all_reduce`, and the composed all_reduce above is slower than the
        built-in one. Notebook 11 measures it. The idea still holds on GPUs, where it matters.

        ### Where training uses it

        | Scheme | Gradients | Parameters |
        |---|---|---|
        | DDP | `all_reduce` (every rank keeps all) | replicated |
        | ZeRO-2 | `reduce_scatter` (each keeps its shard) | replicated, updated by shard, then `all_gather` |
        | ZeRO-3 / FSDP | `reduce_scatter` | sharded; `all_gather` before each use |

        Notebook 10 builds the ZeRO-2 step by hand.
        """
    ),
    md(
        """
        ## Pitfalls

        - **Input is `world_size` times the output.** Single form: `input.numel() == world_size *
          output.numel()`. List form: `world_size` tensors, each the output's shape.
        - **Slice *i* goes to rank *i*.** The order of the input decides who owns what.
        - **Sizes that do not divide evenly.** Pad the flat buffer to a multiple of `world_size`
          (exercise 1 asks you to do this).
        - **The old name warns.** `reduce_scatter_tensor` prints a `FutureWarning` on torch 2.13.
        - **Not faster on gloo.** See the note above; measure before you optimise for CPU.
        """
    ),
    md(
        """
        ## Self-check

        Compute each rank's `shard` in the kernel from the rule "rank *i* keeps slice *i* of the
        sum", and compare.
        """
    ),
    code(
        """
        from distlab.i18n import passed

        pulled = %dist_pull shard
        n, k = len(pulled), 2  # ranks, elements per shard
        total = [sum(float(j * (r + 1)) for r in range(n)) for j in range(n * k)]  # sum over ranks
        expected = [total[i * k:(i + 1) * k] for i in range(n)]
        got = [t.tolist() for t in pulled]
        assert got == expected, (got, expected)
        totals = %dist_pull my_total
        # department i: (i + 1) * (1 + 2 + ... + n)
        assert [t.item() for t in totals] == [(i + 1.0) * n * (n + 1) / 2 for i in range(n)]
        passed(got)
        """
    ),
    md(
        """
        ## Summary

        - `reduce_scatter`: sum (or another op) over ranks; rank *i* keeps slice *i*.
        - List form `reduce_scatter(out, list)`; single form `reduce_scatter_single(out, flat)`
          (torch 2.13), formerly `reduce_scatter_tensor`.
        - `reduce_scatter` then `all_gather` equals `all_reduce`.
        - Sharded training reduce-scatters gradients so each rank updates only its shard.
        - On gloo it is built from all-reduces, so do not expect savings on CPU.

        ## Next

        [08 · all_to_all](08_all_to_all.ipynb): every rank sends a different piece to every
        other rank.
        """
    ),
]
