"""05 reduce and all_reduce: every ReduceOp, in-place semantics, async_op."""

from nbkit import code, dist, md, predict, setup

STEM = "05_reduce_all_reduce"

CELLS = [
    md(
        """
        # 05 · `reduce` and `all_reduce`: add it all up

        This is the collective data-parallel training lives on. Every rank computes gradients on
        its own slice of the batch; the update needs their **average**. `all_reduce` combines
        one tensor from every rank (sum, max, average, ...) and gives everyone the result.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. combine tensors onto one rank with `dist.reduce`, and onto all ranks with
           `dist.all_reduce`;
        2. pick a `dist.ReduceOp` (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR) and predict its
           result;
        3. explain why the input tensor is overwritten (in place), and when to `clone()`;
        4. start an all_reduce with `async_op=True` and finish it with `wait()`.
        """
    ),
    md(
        """
        ## The idea

        Four members each kept receipts for the same two accounts this week. Rank *r* spent
        `r + 1` on coffee and `10 * (r + 1)` on travel.

        - **reduce**: everyone hands their receipts to the accountant (`dst`), who adds them up.
          Only the accountant knows the totals.
        - **all_reduce**: the totals are added up and **everyone** gets a copy. Same as reduce
          followed by broadcast, but done in one step, usually faster (notebook 09 shows how).

        The sum is taken **element by element**: coffee with coffee, travel with travel.

        ![Reduce puts the sum on rank 0 only; all_reduce puts it on every rank](figures/05_reduce.svg)
        """
    ),
    setup(),
    dist(
        """
        receipts = torch.tensor([rank + 1.0, 10.0 * (rank + 1)], device=device)
        before = receipts.clone()
        dist.all_reduce(receipts, op=dist.ReduceOp.SUM)  # in place: receipts now holds the totals
        after = receipts.clone()
        after.tolist()
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        before = %dist_pull before
        after = %dist_pull after
        show_buffers(before, title="before all_reduce: [coffee, travel] per rank")
        show_buffers(after, title="after all_reduce(SUM): every rank holds the totals")
        """
    ),
    md(
        """
        ### `reduce`: only `dst` gets the answer

        With `dist.reduce(t, dst=0)` only rank 0's `t` is guaranteed to hold the total. The other
        ranks' tensors may be used as scratch space by the backend's algorithm. Look at what is
        left on them here:
        """
    ),
    dist(
        """
        t = torch.tensor([rank + 1.0, 10.0 * (rank + 1)], device=device)
        dist.reduce(t, dst=0)
        t.tolist()
        """
    ),
    md(
        """
        On 4 ranks, rank 0 holds `[10, 100]`. The other ranks hold whatever the algorithm left behind (with
        gloo here: partial sums). That is an implementation detail: on another backend or
        version it differs. **Only read the result on `dst`.**

        ### Every reduction operator

        `op` picks how values combine. Each rank holds `rank + 1`: 1, 2, 3, 4 on 4 ranks.
        """
    ),
    dist(
        """
        ops = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
        results = {}
        for name in ops:
            x = torch.tensor([rank + 1.0], device=device)
            dist.all_reduce(x, op=getattr(dist.ReduceOp, name))
            results[name] = x.item()

        # Bitwise ops need integer tensors, and NCCL does not support them.
        if dist.get_backend() != "nccl":
            for name in ["BAND", "BOR", "BXOR"]:
                x = torch.tensor([rank + 1], device=device)  # int64: 1, 2, 3, 4
                dist.all_reduce(x, op=getattr(dist.ReduceOp, name))
                results[name] = x.item()

        if rank == 0:
            for name, value in results.items():
                print(f"{name:8s} {value}")
        """
    ),
    md(
        """
        - On 4 ranks: `SUM` 1+2+3+4 = 10, `PRODUCT` 1·2·3·4 = 24, `MIN` 1, `MAX` 4.
        - `AVG` = SUM / world_size = 2.5. NCCL supports it, and so does gloo on the torch
          installed here (the cell above just used it). Where a backend refuses it, use `SUM` and
          divide by `world_size` yourself.
        - `BAND`, `BOR`, `BXOR`: bitwise AND, OR, XOR of the integers (0b001, 0b010, 0b011,
          0b100): AND 0, OR 7, XOR 4.
        - `PREMUL_SUM` (NCCL only) multiplies by a factor before summing; you will not need it
          directly.

        ## Predict, then run
        """
    ),
    predict(
        """
        Each rank holds `torch.tensor([rank, -rank])`. What does every rank hold after
        `all_reduce` with `MAX`? With `MIN`?
        """,
        """
        Element by element. `MAX`: first element max(0, 1, 2, 3) = 3, second max(0, -1, -2, -3)
        = 0, so `[3, 0]`. `MIN`: `[0, -3]`.
        """,
    ),
    dist(
        """
        hi = torch.tensor([rank, -rank], device=device)
        lo = hi.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        print("MAX", hi.tolist(), "MIN", lo.tolist())
        """
    ),
    md(
        """
        ### In place: the input is gone

        `all_reduce` has no output argument: it writes the result **into the tensor you pass**.
        Any other name for the same tensor (a view, or a second variable) changes too. If you
        still need your own values, `clone()` before.
        """
    ),
    dist(
        """
        local_grad = torch.tensor([float(rank)], device=device)
        alias = local_grad  # the same tensor, not a copy
        kept = local_grad.clone()  # a real copy
        dist.all_reduce(local_grad)
        print(f"alias {alias.item()}  kept {kept.item()}")
        """
    ),
    md(
        """
        ### Not waiting: `async_op=True`

        With `async_op=True` the call returns a work handle at once and the reduction runs in the
        background. This is how training overlaps communication with computation (notebook 10):
        start reducing one layer's gradients while the next layer is still computing.
        """
    ),
    dist(
        """
        grad = torch.ones(1000, device=device) * rank
        work = dist.all_reduce(grad, async_op=True)
        busy = sum(i * i for i in range(1000))  # independent work while the data moves
        work.wait()  # only now is grad safe to read
        grad[0].item()
        """
    ),
    md(
        """
        **What `wait()` means depends on the backend.** With gloo (here), `work.wait()` blocks the
        Python thread until the data has arrived: after it, the tensor is final. With NCCL the
        collective runs on a CUDA stream, and `work.wait()` only makes the *current stream* wait
        for it: the host returns at once, and later GPU work on that stream is ordered after the
        collective. That is enough for the next kernel, but not for the host: to read the result
        on the CPU (`.item()`, `.tolist()`, printing), or to read a clock for a timing, call
        `torch.cuda.synchronize()` first (or use CUDA events). Notebook 11 times NCCL that way.
        """
    ),
    md(
        """
        ## Pitfalls

        - **Reading `reduce`'s result on the wrong rank.** Only `dst` has it. Use `all_reduce`
          when everyone needs the result.
        - **Forgetting it is in place.** `clone()` first if you need your own values afterwards.
        - **Integer AVG and overflow.** Average floating-point tensors; a `PRODUCT` of many
          integers overflows silently.
        - **Averaging by hand.** `SUM` then `/ world_size` is the same as `AVG`; dividing by the
          wrong number (the local batch size, or a subgroup's size) is a common bug.
        - **Same shape and dtype on every rank**, and every rank must call it.
        - **Reading before `wait()`** with `async_op=True` reads unfinished data.
        - **Timing NCCL without synchronising.** On GPUs `wait()` does not block the host: read
          the clock only after `torch.cuda.synchronize()`.
        """
    ),
    md(
        """
        ## Self-check

        Compute, in the kernel, what every operator gives for the values 1 to `world_size`, and
        compare with the ranks' `results`.
        """
    ),
    code(
        """
        import functools
        import operator

        from distlab.i18n import passed

        results = %dist_pull results
        values = [r + 1 for r in range(len(results))]
        expected = {
            "SUM": float(sum(values)),
            "PRODUCT": float(functools.reduce(operator.mul, values)),
            "MIN": float(min(values)),
            "MAX": float(max(values)),
            "AVG": sum(values) / len(values),
            "BAND": functools.reduce(operator.and_, values),
            "BOR": functools.reduce(operator.or_, values),
            "BXOR": functools.reduce(operator.xor, values),
        }
        for got in results:  # every rank has every result
            for name, value in got.items():
                assert value == expected[name], (name, value, expected[name])
        passed(results[0])
        """
    ),
    md(
        """
        ## Summary

        - `reduce(t, dst)` combines every rank's `t` onto `dst`; the others' `t` is scratch.
        - `all_reduce(t)` gives every rank the combined result, in place.
        - `ReduceOp`: SUM, PRODUCT, MIN, MAX, AVG, and bitwise BAND, BOR, BXOR (not on NCCL).
        - `async_op=True` returns a work handle; `wait()` before reading.

        ## Next

        [06 · all_gather](06_all_gather.ipynb): instead of adding the pieces, everyone keeps all
        of them, side by side.
        """
    ),
]
