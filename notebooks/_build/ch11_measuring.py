"""11 Measuring: latency and bandwidth sweeps on this machine; composed vs built-in all_reduce."""

from nbkit import code, dist, md, predict, setup

STEM = "11_measuring"

CELLS = [
    md(
        """
        # 11 · Measuring: how fast is it here?

        Notebook 09 gave formulas. Now measure: how long does a collective take on this
        machine, for small and large messages, and does the model fit? And a question the
        course has promised to answer honestly: is `reduce_scatter + all_gather` as fast as
        `all_reduce` here?
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. measure latency with a ping-pong between two ranks;
        2. run a size sweep of collectives with `distlab.bench.sweep` and read its nccl-tests
           style table (time, algbw, busbw);
        3. fit the alpha-beta model to measurements and read off latency and bandwidth;
        4. explain why, on CPUs with gloo, the composed all_reduce is slower than the built-in.
        """
    ),
    md(
        """
        ## The idea

        Timing a relay team. With a tiny baton (a few bytes), the time is all hand-over: the
        runners' reaction time, **latency** (alpha). With a heavy load, the time grows with the
        weight: **bandwidth** (1/beta). One stopwatch reading per size, from 4 KiB to 4 MiB,
        shows both regimes; fitting `t = alpha + beta * bytes` separates them.

        The rules of a fair race: warm up first (the first call sets up connections), start
        everyone together (a barrier), repeat the call many times, and report the **slowest**
        rank, because a collective is done only when everyone is done. (nccl-tests, the
        reference benchmark, warms up and repeats the same way, but by default it reports the
        *average* over ranks; its option `-a 3` reports the maximum, which is what this kit
        reports. On a quiet GPU cluster the two are close; on 4 ranks sharing 2 CPU cores they
        can differ a lot.)

        The benchmark all-reduces a buffer of ones, over and over. Here is one call, to see what
        it does to the buffers:

        ![The benchmark's buffer: ones on every rank become world_size after one all_reduce](figures/11_all_reduce_ones.svg)
        """
    ),
    setup(),
    dist(
        """
        ones = torch.ones(6, device=device)
        before = ones.clone()
        dist.all_reduce(ones)
        after = ones.clone()
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        before = %dist_pull before
        after = %dist_pull after
        show_buffers(before, title="before: a buffer of ones on each rank")
        show_buffers(after, title="after one all_reduce: every element is world_size")
        """
    ),
    md(
        """
        ### Latency: ping-pong

        Rank 0 sends one number to rank 1, which sends it back: one round trip is two
        messages, so the one-way latency is half the round-trip time. The other ranks skip
        this cell's loop and finish at once, so they do not compete for the CPU.
        """
    ),
    dist(
        """
        import time

        ping = torch.zeros(1, device=device)
        trips = 200
        one_way_us = None
        if rank in (0, 1):
            other = 1 - rank
            for i in range(trips + 10):  # the first 10 are warm-up
                if i == 10:
                    if device.type == "cuda":
                        torch.cuda.synchronize()  # NCCL works on a stream: let it finish first
                    t0 = time.perf_counter()
                if rank == 0:
                    dist.send(ping, other)
                    dist.recv(ping, other)
                else:
                    dist.recv(ping, other)
                    dist.send(ping, other)
            if device.type == "cuda":
                torch.cuda.synchronize()  # before reading the clock
            one_way_us = (time.perf_counter() - t0) / trips / 2 * 1e6
        if rank == 0:
            print(f"one-way latency of a 4-byte message: {one_way_us:.1f} us")
        """
    ),
    md(
        """
        ### A quick stopwatch: `%timeit` on every rank

        IPython's `%timeit` works in a `%%dist` cell: each rank times the line and prints its
        own result. Left to itself, `%timeit` picks how many loops to run from its own clock, and
        each rank would pick its own number: rank 0 might settle on 1,000 calls and rank 3 on
        10,000. A collective needs every rank to call it the same number of times, so the
        ranks with calls still to make would wait for ever for the others. The kit makes the
        ranks agree: each trial's time is the slowest rank's, so all of them pick the same count.
        """
    ),
    dist(
        """
        t = torch.ones(1024, device=device)  # 4 KiB


        def all_reduce_and_wait():
            dist.all_reduce(t)
            if device.type == "cuda":
                torch.cuda.synchronize()  # NCCL returns before the GPU has finished


        %timeit -r 3 all_reduce_and_wait()
        """
    ),
    md(
        """
        Each line is one rank's mean and spread. `%timeit` starts the ranks together only once,
        repeats the call, and reports every rank: good for a quick look, not for a table you
        publish. The sweep below does the careful version.

        ### A size sweep

        `distlab.bench.sweep` starts fresh ranks for each operation, runs the warm-up / barrier /
        repeat routine above for every size, and returns one row per size, with the slowest
        rank's time per call. We keep the sizes small (4 KiB to 4 MiB) so it takes seconds.
        We time `reduce_scatter` and `all_gather` too: at the same size `S`, a reduce_scatter of
        `S` bytes followed by an all_gather back to `S` bytes *is* the composed all_reduce of
        notebook 09, so its time is the sum of the two. (Exercise 1 has you write that
        function; `distlab.bench.sweep(fns=[your_function])` times it directly once you have.
        On a machine with 4 GPUs the cell picks NCCL, and you can compare for yourself.)
        """
    ),
    code(
        """
        import os

        from distlab import bench

        import torch

        WORLD = 4  # the sweep starts its own ranks, apart from the %%dist ones: try 2 or 8
        BACKEND = "nccl" if torch.cuda.device_count() >= WORLD else "gloo"  # gloo here
        print(f"{WORLD} ranks, backend {BACKEND}, {os.cpu_count()} CPU cores")
        rows = bench.sweep(["all_reduce", "reduce_scatter", "all_gather"], "4K:4M", [WORLD],
                           backend=BACKEND, iters=10, progress=False)
        print(bench.format_table(rows))
        """
    ),
    md(
        """
        The columns are the ones nccl-tests prints: `size` in bytes (for all_gather the output,
        for reduce_scatter the input), `time(us)` per call, `algbw = size / time` and `busbw =
        algbw * factor` (notebook 09). Plots make the trend easier to see:
        """
    ),
    code(
        """
        from distlab.viz import PNG

        display(PNG(bench.plot_bandwidth(rows)))
        display(PNG(bench.plot_fit(rows)))
        for (op, n), model in bench.fits(rows).items():
            print(f"{op:18s} on {n} ranks: {model}")
        """
    ),
    md(
        """
        Read the fit with care. Four ranks share this machine's CPU cores, and other programs
        may be running: the times are noisy, and a negative or tiny alpha just means the
        noise is larger than the latency. The ping-pong above is the more direct latency
        measurement.

        ## Predict, then run
        """
    ),
    predict(
        """
        Notebook 09 said `all_reduce = reduce_scatter + all_gather`, with the same bytes on the
        wire. On this machine (gloo on CPUs), is reduce_scatter + all_gather as fast as the
        built-in `all_reduce`? Is `reduce_scatter` alone faster than `all_reduce`?
        """,
        """
        No, and no. gloo has no reduce-scatter algorithm of its own: torch builds gloo's
        `reduce_scatter` out of all-reduces (pytorch issues #149869 and #118911). So on gloo
        `reduce_scatter` alone costs about as much as an `all_reduce`, or more, and the composed
        version pays that **plus** an all_gather. The next cell computes the ratios from the
        sweep. On GPUs, NCCL has real reduce-scatter and all-gather rings, and the two costs
        come out close.
        """,
    ),
    code(
        """
        import statistics


        def times(op):
            return {r["size"]: r["time_us"] for r in rows if r["op"] == op}


        builtin, rs, ag = times("all_reduce"), times("reduce_scatter"), times("all_gather")
        composed = {size: rs[size] + ag[size] for size in builtin}  # reduce_scatter, then all_gather
        print(f"{'size':>9} {'all_reduce us':>14} {'composed us':>12} {'composed/builtin':>17} "
              f"{'reduce_scatter/all_reduce':>26}")
        for size in builtin:
            print(f"{size:>9} {builtin[size]:>14.0f} {composed[size]:>12.0f} "
                  f"{composed[size] / builtin[size]:>17.2f} {rs[size] / builtin[size]:>26.2f}")
        median_ratio = statistics.median(composed[s] / builtin[s] for s in builtin)
        print(f"median: the composed all_reduce takes {median_ratio:.1f}x the built-in one here")
        """
    ),
    md(
        """
        That is the honest picture for this machine. The idea of notebook 09 is still right, and
        it is what ZeRO and FSDP rely on, but it pays off only where the library implements
        `reduce_scatter` as its own algorithm (NCCL on GPUs). **Measure on the hardware you
        will train on.**

        To run a bigger sweep outside the notebook (the same code, more sizes and world sizes):

        ```
        python -m distlab.bench --ops all_reduce,all_gather,reduce_scatter --sizes 1K:64M --world-sizes 2,4
        ```

        ## Pitfalls

        - **More ranks than cores.** Here 4 ranks share the cores; a rank may wait for a core,
          not for the network. Numbers from an oversubscribed machine say little about a cluster.
        - **No warm-up.** The first call sets up connections and buffers; timing it measures
          set-up, not communication.
        - **Timing one rank.** Report the slowest rank: the collective is done only when all
          are.
        - **A loop count from each rank's own clock** ("repeat until 0.2 s have passed"). The
          ranks stop after different numbers of calls and the collective deadlocks. Fix the
          count, or agree on it first (the kit's `%timeit` does).
        - **Too few repetitions** for small messages: the timer's resolution and noise dominate.
        - **Comparing algbw across world sizes.** Use busbw for that (notebook 09).
        - **Trusting a single run.** Other programs share this machine; run twice and compare.
        """
    ),
    md(
        """
        ## Self-check

        Check the benchmark's own arithmetic on the rows it returned, and that the two calls whose
        times we added really make an all_reduce.
        """
    ),
    code(
        """
        from distlab.costmodel import bus_factor

        expected_sizes = bench.parse_sizes("4K:4M")
        for op in ["all_reduce", "reduce_scatter", "all_gather"]:
            assert sorted(r["size"] for r in rows if r["op"] == op) == expected_sizes, op
        for r in rows:
            assert abs(r["algbw"] - r["size"] / (r["time_us"] * 1e-6) / 1e9) < 1e-9
            assert abs(r["busbw"] - r["algbw"] * bus_factor(r["op"], WORLD)) < 1e-9
        assert bus_factor("all_reduce", WORLD) == 2 * (WORLD - 1) / WORLD
        """
    ),
    dist(
        """
        from distlab.compat import all_gather_single, reduce_scatter_single

        v = torch.arange(3.0 * world_size, device=device) * (rank + 1)  # (3n,): divisible by n
        mine = torch.empty(3, device=device)
        reduce_scatter_single(mine, v)  # what the sweep timed as reduce_scatter ...
        composed_v = torch.empty_like(v)
        all_gather_single(composed_v, mine)  # ... then as all_gather
        w = v.clone()
        dist.all_reduce(w)
        composed_ok = torch.equal(composed_v, w)
        """
    ),
    code(
        """
        from distlab.i18n import passed

        oks = %dist_pull composed_ok
        assert all(oks), oks
        passed(note="the table's arithmetic holds and reduce_scatter + all_gather is an all_reduce")
        """
    ),
    md(
        """
        ## Summary

        - Latency: time tiny messages (ping-pong); bandwidth: time large ones.
        - A fair benchmark warms up, starts together, repeats, and reports the slowest rank.
        - `distlab.bench.sweep` prints nccl-tests style rows; `bench.fits` fits alpha and beta.
        - On gloo, `reduce_scatter` is built from all-reduces, so the composed all_reduce is
          slower than the built-in one. With NCCL on GPUs the composition costs about the same.

        ## Next

        [12 · Cost at scale](12_cost_at_scale.ipynb): from this machine's alpha and beta to a
        10B-parameter model on 64 GPUs: which scheme fits, and what its communication costs.
        To practise, open the exercises (`exercises/`): each one asks you to implement a
        primitive or an algorithm from these notebooks, and grades it.
        """
    ),
]
