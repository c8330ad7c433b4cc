"""06 all_gather: list and single-tensor forms, uneven sizes, all_gather_object."""

from nbkit import code, dist, md, predict, setup

STEM = "06_all_gather"

CELLS = [
    md(
        """
        # 06 · `all_gather`: everyone gets everyone's piece

        `gather` brings every rank's piece to one rank. `all_gather` brings every rank's piece to
        **every** rank. Sharded training (ZeRO-3, FSDP) calls it before each layer to put the
        layer's full weights together from the shards each rank keeps.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. gather into a list with `dist.all_gather(tensor_list, tensor)`;
        2. gather into one flat tensor with `dist.all_gather_single(output, input)`, and know its
           older name `all_gather_into_tensor`;
        3. gather pieces of **different sizes** portably (share sizes, pad, gather, trim);
        4. gather Python objects with `dist.all_gather_object`.
        """
    ),
    md(
        """
        ## The idea

        A whiteboard with one column per team member. Each member writes their piece in their own
        column, then everyone takes a photo of the whole board. Afterwards everyone holds all the
        pieces, **in rank order**, and nobody added anything up.

        Below, rank *r* holds `[10r, 10r + 1]`. After `all_gather` every rank holds every
        rank's pair: four pairs on 4 ranks.

        ![All_gather: each rank's piece ends up on every rank, in rank order](figures/06_all_gather.svg)
        """
    ),
    setup(),
    dist(
        """
        mine = torch.tensor([10.0 * rank, 10.0 * rank + 1], device=device)  # (2,) on each rank
        pieces = [torch.empty(2, device=device) for _ in range(world_size)]  # world_size buffers
        dist.all_gather(pieces, mine)  # pieces[i] = rank i's `mine`, on every rank
        gathered = torch.cat(pieces)
        gathered.tolist()
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        before = %dist_pull mine
        after = %dist_pull gathered
        show_buffers(before, title="before all_gather: one piece per rank")
        show_buffers(after, title="after all_gather: every rank holds every piece")
        """
    ),
    md(
        """
        ### The single-tensor form: `all_gather_single`

        The list form allocates one tensor per rank. The single-tensor form writes into **one
        flat output**, `world_size` times the input's length, with rank *i*'s piece at
        `output[i * k:(i + 1) * k]`. That is what sharded training uses: the gathered weights land
        in one contiguous buffer, with no extra copy.

        Names: torch 2.13 calls it `dist.all_gather_single`. Before 2.13 it was
        `dist.all_gather_into_tensor`, which still works on 2.13 but prints a `FutureWarning`.
        Code that must run on both picks whichever exists (`distlab.compat.all_gather_single`
        does exactly this):

        ```python
        all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        ```
        """
    ),
    dist(
        """
        all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        flat = torch.empty(world_size * 2, device=device)  # (8,) on 4 ranks: 4 x (2,)
        all_gather_single(flat, mine)
        flat.view(world_size, 2).tolist()  # one row per rank
        """
    ),
    md(
        """
        To see the deprecation without printing to stderr, catch the warning on the ranks:
        """
    ),
    dist(
        """
        import warnings

        old_name = getattr(dist, "all_gather_into_tensor", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if old_name is not None:
                old_name(flat, mine)
        if rank == 0:
            for w in caught:
                print(f"{w.category.__name__}: {w.message}")
        """
    ),
    md(
        """
        ## Predict, then run
        """
    ),
    predict(
        """
        Rank *r* holds `torch.full((r + 1,), float(r))`: rank 0 one element, rank 3 four. Every
        rank passes `[torch.empty(i + 1) for i in range(world_size)]` to `dist.all_gather`. What
        happens with gloo?
        """,
        """
        It fails. gloo's `all_gather` requires every piece to have the same size, and raises
        `RuntimeError: ProcessGroupGloo::allgather: invalid tensor size ...`. Some backends
        accept uneven lists; code that must run everywhere pads (next cell).
        """,
    ),
    dist(
        """
        uneven = torch.full((rank + 1,), float(rank), device=device)
        slots = [torch.empty(i + 1, device=device) for i in range(world_size)]
        dist.all_gather(slots, uneven)
        [s.tolist() for s in slots]
        """,
        tags=["raises-exception"],
    ),
    md(
        """
        ### Uneven sizes, portably: share sizes, pad, gather, trim

        1. all_gather every rank's **length** (one number each);
        2. pad every piece to the longest length;
        3. all_gather the padded pieces (now equal);
        4. cut each piece back to its true length.
        """
    ),
    dist(
        """
        n = torch.tensor([uneven.numel()], device=device)
        lengths = [torch.zeros_like(n) for _ in range(world_size)]
        dist.all_gather(lengths, n)  # step 1: everyone learns every length
        lengths = [int(x.item()) for x in lengths]
        longest = max(lengths)

        padded = torch.zeros(longest, device=device)
        padded[: uneven.numel()] = uneven  # step 2
        out = torch.empty(world_size * longest, device=device)
        all_gather_single(out, padded)  # step 3
        rows = out.view(world_size, longest)
        trimmed = [rows[i, : lengths[i]] for i in range(world_size)]  # step 4
        [t.tolist() for t in trimmed]
        """
    ),
    md(
        """
        ### Python objects: `all_gather_object`

        For small Python values (a count, a dict of metrics, a list of strings)
        `dist.all_gather_object(object_list, obj)` pickles them and gives everyone the full list.
        """
    ),
    dist(
        """
        everyone = [None] * world_size
        dist.all_gather_object(everyone, {"rank": rank, "samples_seen": 32 * (rank + 1)})
        total_seen = sum(d["samples_seen"] for d in everyone)
        total_seen
        """
    ),
    md(
        """
        ## Pitfalls

        - **List form: one buffer per rank, correctly sized.** `tensor_list` has `world_size`
          tensors of the input's shape and dtype.
        - **Single form: output is `world_size` times the input**, concatenated along the first
          dimension. Reshape with `.view(world_size, ...)` for one row per rank.
        - **Uneven sizes** fail on gloo. Pad to one size (share the lengths first).
        - **The old name warns.** `all_gather_into_tensor` prints a `FutureWarning` on torch
          2.13; use `all_gather_single`, or the `getattr` fallback on mixed versions.
        - **Memory.** The output is `world_size` times the input on every rank: gathering a large
          tensor on many ranks can run out of memory.
        """
    ),
    md(
        """
        ## Self-check

        In the kernel, build what `gathered` must be on every rank, and what the padded
        procedure must return, then compare.
        """
    ),
    code(
        """
        from distlab.i18n import passed

        pulled = %dist_pull gathered
        world = range(len(pulled))  # one entry per rank
        expected = [v for r in world for v in (10.0 * r, 10.0 * r + 1)]
        assert all(g.tolist() == expected for g in pulled), pulled

        expected_trimmed = [[float(r)] * (r + 1) for r in world]
        pulled_trimmed = %dist_pull trimmed
        for per_rank in pulled_trimmed:
            assert [t.tolist() for t in per_rank] == expected_trimmed

        totals = %dist_pull total_seen
        assert totals == [sum(32 * (r + 1) for r in world)] * len(world)
        passed()
        """
    ),
    md(
        """
        ## Summary

        - `all_gather`: every rank ends with every rank's piece, in rank order.
        - List form `all_gather(list, t)`; single form `all_gather_single(out, t)` (torch 2.13),
          formerly `all_gather_into_tensor`.
        - Uneven pieces: gather the lengths, pad, gather, trim.
        - `all_gather_object` for small Python values.

        ## Next

        [07 · reduce_scatter](07_reduce_scatter.ipynb): the mirror image. Add everything up, but
        each rank keeps only its own part of the sum.
        """
    ),
]
