"""09 Composing collectives: all_reduce = reduce_scatter + all_gather, the ring, cost models."""

from nbkit import code, dist, md, predict, setup

STEM = "09_composing"

CELLS = [
    md(
        """
        # 09 · Composing collectives: the ring and what it costs

        You know every primitive now. This notebook opens up the one that matters most,
        `all_reduce`: how it is built from `reduce_scatter` and `all_gather`, how the **ring
        algorithm** does both with nothing but neighbour-to-neighbour sends, why that is the
        best possible use of bandwidth, and how to predict its time with a two-number model.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. build `all_reduce` as `reduce_scatter` followed by `all_gather`, and check it;
        2. follow the ring all_reduce step by step on a traced run;
        3. show that each rank sends `2(n-1)/n` of the data, and why no algorithm can send less;
        4. estimate time with the alpha-beta model, and say when a tree beats a ring;
        5. compute **algbw** and **busbw** as nccl-tests defines them.
        """
    ),
    md(
        """
        ## The idea

        Four people sit at a round table. Each has a 4-page report; page *k* of everyone's report
        covers the same topic, and the team needs the sum of all four reports.

        Nobody shouts across the table. In each step, everybody passes **one page** to the
        person on their right and adds the page arriving from their left to their own copy. After
        3 steps, each person holds one page that contains everyone's contribution: that is a
        **reduce-scatter**. In 3 more steps the finished pages travel around the table until
        everyone has all of them: an **all-gather**. Everyone is busy at every step, and nobody
        ever handles more than one page at a time.

        First the composition itself, with the library calls.

        ![A recorded ring all_reduce on 4 ranks, step by step, with the chunk each rank sent and received marked](figures/09_ring.svg)
        """
    ),
    setup(),
    dist(
        """
        from distlab.compat import all_gather_single, reduce_scatter_single

        x = torch.arange(2.0 * world_size, device=device) + 10 * rank  # (8,) per rank on 4 ranks
        before = x.clone()

        shard = torch.empty(2, device=device)  # (x.numel() / world_size,)
        reduce_scatter_single(shard, x)  # rank r: sum of slice r
        composed = torch.empty_like(x)
        all_gather_single(composed, shard)  # everyone: all slices

        builtin = x.clone()
        dist.all_reduce(builtin)
        torch.equal(composed, builtin)
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        before = %dist_pull before
        shards = %dist_pull shard
        composed = %dist_pull composed
        show_buffers(before, title="before: x on each rank")
        show_buffers(shards, title="after reduce_scatter: rank r holds slice r of the sum")
        show_buffers(composed, title="after all_gather: the full sum everywhere = all_reduce")
        """
    ),
    md(
        """
        ### The ring, step by step

        A ring all_reduce needs nothing but the point-to-point calls of notebook 02 (`irecv`
        from the left, `isend` to the right). Each rank cuts its buffer into `n` chunks. In
        reduce-scatter step *s*, rank *r* sends chunk `(r - s) mod n` right and adds the chunk
        arriving from the left. After `n - 1` steps, rank *r* holds the finished sum of chunk
        `(r + 1) mod n`. Then `n - 1` all-gather steps pass the finished chunks around.

        Exercise 2 asks you to write this ring, so the kit does not hand you one. Instead, here
        is a **recording** of a ring on 4 ranks, with the input above on 4 ranks: every rank's
        `torch.distributed` calls, as `%%dist --trace` records them, and its buffer after each
        step. `--trace` records any cell this way and draws a timeline, one lane per rank, with
        a table of bytes.
        """
    ),
    code(
        """
        from distlab.replay import recording

        traces = recording("ring_all_reduce_4ranks")  # one list of call records per rank
        print([len(t) for t in traces], "records per rank; rank 0's first three:")
        for r in traces[0][:3]:
            print(" ", r["op"], r.get("peer"), r.get("sent"), r.get("recv"), r.get("label", ""))
        """
    ),
    md(
        """
        Step through it: press ▶ or drag the slider. Blue borders mark the chunk a rank sent in
        that step, orange the chunk it received and added. (The stepper is a live widget: it
        shows in a running notebook.) Once you have written your own ring in exercise 2, run it
        in a `%%dist -n 4 --trace` cell, call `distlab.trace.snapshot(buf, label)` after each
        step, and `ring_stepper(distlab.last_trace())` steps through yours.
        """
    ),
    code(
        """
        from distlab.viz import ring_stepper

        ring_stepper(traces)
        """
    ),
    md(
        """
        The same frames, all at once, marked the same way (these stay in a saved notebook,
        where the live stepper does not):
        """
    ),
    code(
        """
        from distlab.replay import ring_frames, show_frames

        frames = ring_frames(traces)
        show_frames(frames)  # blue: the chunk a rank sent in that step; orange: what it received
        """
    ),
    md(
        """
        ## Predict, then run
        """
    ),
    predict(
        """
        The buffer has 8 float32 elements: N = 32 bytes. With n = 4 ranks, how many bytes does
        each rank send in the whole ring all_reduce?
        """,
        """
        Each step sends one chunk of N / n = 8 bytes, and there are 2(n - 1) = 6 steps: 48 bytes,
        which is `2(n-1)/n * N = 1.5 * 32`. The next cell counts it from the trace.
        """,
    ),
    code(
        """
        def bytes_sent(rank_records):
            return sum(r.get("sent", 0) for r in rank_records if r.get("op") != "snapshot")


        n, N = len(traces), 8 * 4  # the recording's ranks, bytes in its buffer
        sent = [bytes_sent(t) for t in traces]
        print("bytes sent per rank:", sent, "| formula 2(n-1)/n * N =", 2 * (n - 1) / n * N)
        """
    ),
    md(
        """
        ### Why `2(n-1)/n` is the best possible

        Count what must leave each rank and what must arrive at it.

        - **Reduce.** For every element, each rank's contribution must leave that rank at least
          once (possibly already added to others'), except on the rank that finishes that
          element's sum. If the finishing is shared evenly, each rank finishes `N / n` bytes, so
          each rank sends at least `(n - 1)/n * N` bytes.
        - **Gather.** Every rank must end with all `N` bytes of the result but finished only
          `N / n` itself, so `(n - 1)/n * N` bytes must arrive at every rank. Someone sends them:
          on average another `(n - 1)/n * N` per rank.

        Together: `2(n - 1)/n * N` per rank on average, exactly what the ring sends. (The proof
        in full: P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters
        of workstations", J. Parallel Distrib. Comput., 2009.)

        Compare the naive way, `reduce` to rank 0 then `broadcast`: rank 0 alone receives
        `(n - 1) * N` and sends `(n - 1) * N`. With 64 ranks that is 63 times the buffer through
        one rank, against under 2 times for everyone with the ring. And note that the ring's
        per-rank traffic **barely grows with n**: it approaches `2N`.

        ### Time: the alpha-beta model

        Sending one message of `b` bytes costs `alpha + beta * b` seconds: `alpha` is the
        start-up latency, `1 / beta` the bandwidth. The ring makes `2(n - 1)` sequential steps,
        each moving `N / n`:

        `T_ring = 2(n - 1) * alpha + 2(n - 1)/n * N * beta`

        A **binomial tree** (the tree of exercise 3) does a reduce in `ceil(log2 n)` rounds: in
        each round, half of the ranks that still hold a partial sum send it to a partner, who
        adds it. The same tree run backwards is a broadcast, another `ceil(log2 n)` rounds. Each
        round sends the whole buffer (no pipelining), so:

        `T_tree = 2 * ceil(log2 n) * (alpha + N * beta)`

        (A *binary* tree, where every parent has two children, is a different tree: a parent
        receives from its two children one after the other, so each level costs two steps.
        This notebook's formula and picture are for the binomial tree.)

        For small messages `alpha` dominates, and `log2(n)` rounds beat `n - 1` steps: the tree
        wins. For large messages `beta` dominates, and the ring's `~2N` beats the tree's
        `2 log2(n) * N`. Real libraries pick per size; NCCL has had both a ring and a
        (pipelined, double binary) tree algorithm since version 2.4 (NVIDIA's blog post
        "Massively Scale Your Deep Learning Training with NCCL 2.4", 2019).

        Below, the two formulas with **made-up round numbers** (alpha = 5 microseconds,
        1/beta = 10 GB/s, n = 64), only to see the shape. Notebook 11 measures real values on
        this machine.
        """
    ),
    code(
        """
        import math

        import numpy as np
        from matplotlib.figure import Figure

        from distlab.costmodel import AlphaBeta, ring_all_reduce_time
        from distlab.viz import PNG

        model = AlphaBeta(alpha=5e-6, beta=1 / 10e9)  # illustration only, not measured
        n = 64
        sizes = np.logspace(2, 9, 50)  # 100 B .. 1 GB


        def tree_time(m, n, nbytes):  # binomial tree: reduce, then broadcast, whole buffer each round
            return 2 * math.ceil(math.log2(n)) * (m.alpha + m.beta * nbytes)


        ring = np.array([ring_all_reduce_time(model, n, s) for s in sizes])
        tree = np.array([tree_time(model, n, s) for s in sizes])
        crossover = sizes[np.argmax(ring < tree)]

        fig = Figure(figsize=(6, 3.5), dpi=90)
        ax = fig.add_subplot()
        ax.loglog(sizes, ring * 1e6, label="ring")
        ax.loglog(sizes, tree * 1e6, label="tree")
        ax.axvline(crossover, color="grey", ls=":")
        ax.set(xlabel="buffer size N (bytes)", ylabel="time (us)",
               title=f"all_reduce on n={n}, alpha=5 us, 1/beta=10 GB/s (illustrative)")
        ax.legend()
        fig.tight_layout()
        display(PNG(fig))
        print(f"the ring wins above about {crossover / 1e3:.0f} kB")
        """
    ),
    predict(
        """
        With the same model, n = 64, which is faster for a 4-byte all_reduce (say, a loss value
        or a flag), and by roughly how much?
        """,
        """
        The tree. Both are latency-bound: the ring takes `2 * 63 = 126` steps, the binomial tree
        `2 * ceil(log2 64) = 12` rounds. So the tree is about 10 times faster, `126 * 5 us = 630 us` against
        `12 * 5 us = 60 us`.
        """,
    ),
    md(
        """
        ### algbw and busbw (nccl-tests)

        The benchmark suite nccl-tests (file `doc/PERFORMANCE.md` in its repository) reports two
        bandwidths for a collective on a buffer of `S` bytes that takes `t` seconds:

        - **algbw** `= S / t`: how fast the *operation* went, from the user's point of view.
        - **busbw** `= algbw * factor(n)`: the bandwidth the *links* must have carried, so that
          the number is comparable with the hardware's link speed for any n. The factor is the
          per-rank traffic we just derived: `2(n - 1)/n` for all_reduce, `(n - 1)/n` for
          reduce_scatter, all_gather and all_to_all, `1` for broadcast and reduce.

        `distlab.costmodel` has the factors:
        """
    ),
    code(
        """
        from distlab.costmodel import bus_factor

        ops = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast"]
        print(f"{'op':15s}" + "".join(f"  n={k:<5d}" for k in (2, 4, 8, 64)))
        for op in ops:
            print(f"{op:15s}" + "".join(f"  {bus_factor(op, k):<7.3f}" for k in (2, 4, 8, 64)))
        """
    ),
    md(
        """
        Time one all_reduce on the ranks and compute both numbers. (A few ranks on this
        machine's CPUs: expect modest numbers; notebook 11 does this properly, over many sizes.)
        """
    ),
    dist(
        """
        import time

        buf = torch.ones(1 << 18, device=device)  # 262144 float32 = 1 MiB
        dist.all_reduce(buf)  # warm up
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()  # NCCL runs on a stream: finish before reading the clock
        t0 = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(buf)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / 5
        """
    ),
    code(
        """
        from distlab.costmodel import algbw, busbw

        per_rank = %dist_pull seconds
        seconds = max(per_rank)  # the slowest rank decides (nccl-tests averages ranks unless -a 3)
        S = (1 << 18) * 4
        print(f"S = {S} bytes, t = {seconds * 1e3:.2f} ms, "
              f"algbw = {algbw(S, seconds):.3f} GB/s, "
              f"busbw = {busbw('all_reduce', len(per_rank), S, seconds):.3f} GB/s")
        """
    ),
    md(
        """
        ## Pitfalls

        - **The ring's latency grows with n.** `2(n - 1)` steps: for small messages on many ranks
          a tree (or a different algorithm) is faster.
        - **busbw is a normalisation, not a measurement of a wire.** It assumes the ring's
          traffic. Compare busbw with link speed; compare algbw with your training step time.
        - **Composition is not free everywhere.** On GPUs with NCCL, reduce_scatter +
          all_gather costs about the same as all_reduce. On gloo, `reduce_scatter` is built from
          all-reduces (pytorch issues #149869, #118911), so the composition is slower there.
        - **The alpha-beta model ignores contention**, congestion and computation (the additions
          in the reduce steps). It is a first estimate, not a promise.
        - **Uneven chunks.** When N is not a multiple of n, some chunks are one element larger;
          `tensor_split` gives chunks whose sizes differ by at most one; padding the buffer to a
          multiple of n is the other way.
        """
    ),
    md(
        """
        ## Self-check

        Check the recorded ring's final buffers and your composed all_reduce against the sum,
        and the bytes each rank sent against the formula.
        """
    ),
    code(
        """
        from distlab.i18n import passed

        n, N = len(traces), 8 * 4  # the recording: 4 ranks, 8 float32 each
        expected = [sum(float(k + 10 * r) for r in range(n)) for k in range(8)]
        assert all(buffers == expected for buffers in frames[-1].buffers), frames[-1].buffers
        assert sent == [2 * (n - 1) * N // n] * n, sent

        w = len(composed)  # your ranks: 2 elements each
        yours = [sum(float(k + 10 * r) for r in range(w)) for k in range(2 * w)]
        assert all(c.tolist() == yours for c in composed), composed
        passed(expected, sent[0])
        """
    ),
    md(
        """
        ## Summary

        - `all_reduce = reduce_scatter + all_gather`.
        - The ring does both with neighbour sends: `2(n - 1)` steps, `2(n - 1)/n * N` bytes per
          rank, the minimum possible.
        - Alpha-beta: `T_ring = 2(n-1) alpha + 2(n-1)/n N beta`; trees win for small messages.
        - algbw = S / t; busbw = algbw times the op's factor, comparable with link speed.

        ## Next

        [10 · Collectives in training](10_training.ipynb): where these calls happen in a real
        training step: DDP, bucketing, overlap, ZeRO and FSDP.
        """
    ),
]
