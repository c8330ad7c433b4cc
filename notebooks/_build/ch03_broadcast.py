"""03 broadcast: the captain gives one order to everyone (and broadcast_object_list)."""

from nbkit import code, dist, md, predict, setup

STEM = "03_broadcast"

CELLS = [
    md(
        """
        # 03 · `broadcast`: the captain gives an order

        The first collective. From here on, **every rank of the group takes part in every call**;
        each one calls the same function with matching arguments. That is what makes a call
        collective.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. copy a tensor from one rank (`src`) to all ranks with `dist.broadcast`;
        2. prepare the receive buffers correctly (same shape, same dtype, on `device`);
        3. send Python objects (a config dict) with `dist.broadcast_object_list`;
        4. say where training uses broadcast: initial weights, configs, random seeds.
        """
    ),
    md(
        """
        ## The idea

        The team captain (rank 0) has an order written on a card: `[100, 200]`. Everyone else
        holds a blank card of the same size. The captain reads the order out once, and everyone
        writes it down. Afterwards every card, the captain's included, says `[100, 200]`.

        `dist.broadcast(tensor, src)` does exactly that. On `src`, `tensor` is the message; on
        every other rank, `tensor` is the blank card that gets **overwritten in place**.

        ![Broadcast from rank 0: before, only rank 0 holds 1 2 3 4; after, every rank does](figures/03_broadcast.svg)
        """
    ),
    setup(),
    dist(
        """
        if rank == 0:
            card = torch.tensor([100.0, 200.0], device=device)  # the captain's order
        else:
            card = torch.zeros(2, device=device)  # a blank card of the same shape and dtype
        before = card.clone()

        dist.broadcast(card, src=0)  # every rank calls it, with the same src

        after = card.clone()
        print(f"before {before.tolist()} -> after {after.tolist()}")
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        before = %dist_pull before
        after = %dist_pull after
        show_buffers(before, title="before broadcast(src=0)")
        show_buffers(after, title="after broadcast(src=0)")
        """
    ),
    md(
        """
        ### Any rank can be the captain

        `src` is any rank. Here each rank starts with its own number times 100, and rank 2 gives
        the order.
        """
    ),
    md(
        """
        ## Predict, then run
        """
    ),
    predict(
        """
        Every rank holds `torch.full((3,), 100.0 * rank)`. After `dist.broadcast(v, src=2)`, what
        does rank 3 hold? And rank 2?
        """,
        """
        Both hold `[200.0, 200.0, 200.0]`: rank 2's values. Rank 3's own `300.0`s are overwritten.
        """,
    ),
    dist(
        """
        v = torch.full((3,), 100.0 * rank, device=device)
        dist.broadcast(v, src=2)
        v.tolist()
        """
    ),
    md(
        """
        ### Where training uses it: same start for everyone

        Data-parallel training needs every rank to start from **the same weights**. Each rank
        creates the model with its own random numbers, so the weights differ; one broadcast of
        every parameter from rank 0 makes them equal. `DistributedDataParallel` does this for you
        when you wrap a model (notebook 10).
        """
    ),
    dist(
        """
        torch.manual_seed(rank)  # a different seed on every rank: different weights
        layer = torch.nn.Linear(4, 2).to(device)
        print("before:", round(layer.weight.sum().item(), 4))

        with torch.no_grad():
            for p in layer.parameters():
                dist.broadcast(p, src=0)
        print("after: ", round(layer.weight.sum().item(), 4))
        """
    ),
    md(
        """
        ### Broadcasting Python objects

        Not everything is a tensor: a config dict, a list of file names, a vocabulary.
        `dist.broadcast_object_list(objects, src)` pickles the objects on `src` and unpickles
        them on the others. Every rank passes a list **of the same length**; on the non-`src`
        ranks the list entries are placeholders that get replaced.
        """
    ),
    dist(
        """
        if rank == 0:
            box = [{"lr": 0.01, "batch_size": 32, "run": "exp-7"}]
        else:
            box = [None]  # same length: one placeholder
        dist.broadcast_object_list(box, src=0)
        config = box[0]
        config
        """
    ),
    md(
        """
        Object collectives pickle the objects, send their sizes and then their bytes as tensors,
        and (with NCCL) copy those to the GPU and back. Use them for small control data, never for
        tensors you could send directly.

        ### Not waiting: `async_op=True`

        Like `isend`, every collective takes `async_op=True` and then returns a work handle.
        The call returns at once; `wait()` before using the tensor.
        """
    ),
    dist(
        """
        w = torch.arange(4.0, device=device) if rank == 0 else torch.zeros(4, device=device)
        work = dist.broadcast(w, src=0, async_op=True)
        # ...other work could happen here...
        work.wait()
        w.tolist()
        """
    ),
    md(
        """
        ## Pitfalls

        - **Everyone must call it.** A broadcast called only on rank 0 waits for the others until
          the process group's timeout (or the cell's deadline, which comes first).
        - **Same `src` on every rank.** Two ranks that disagree about the captain never meet.
        - **Same shape and dtype.** The receiving buffer must match the source tensor; allocate
          it first. If only rank 0 knows the shape, broadcast the shape first (a small tensor),
          or use `broadcast_object_list`.
        - **In place.** The tensor on the receiving ranks is overwritten. `clone()` first if you
          still need the old values.
        - **Object lists with NCCL** need the current CUDA device set
          (`torch.cuda.set_device(local_rank)`), because the pickled bytes travel through the GPU.
        """
    ),
    md(
        """
        ## Self-check

        Every rank holds `torch.full((3,), 100.0 * rank)`. Rank 1 broadcasts. Compute the
        expected result for each rank in the kernel, then run and compare.
        """
    ),
    dist(
        """
        check = torch.full((3,), 100.0 * rank, device=device)
        dist.broadcast(check, src=1)
        """
    ),
    code(
        """
        from distlab.i18n import passed

        pulled = %dist_pull check
        expected = [[100.0] * 3 for _ in pulled]
        got = [t.tolist() for t in pulled]
        assert got == expected, got
        configs = %dist_pull config
        assert all(c == {"lr": 0.01, "batch_size": 32, "run": "exp-7"} for c in configs)
        passed()
        """
    ),
    md(
        """
        ## Summary

        - `dist.broadcast(tensor, src)`: afterwards every rank's `tensor` equals `src`'s.
        - Every rank calls it with the same `src`, and a buffer of the same shape and dtype.
        - `broadcast_object_list` sends small Python objects; it pickles them.
        - Training uses broadcast to give every rank the same starting weights and config.

        ## Next

        [04 · scatter and gather](04_scatter_gather.ipynb): the captain hands out different tasks
        to each member, and collects the reports.
        """
    ),
]
