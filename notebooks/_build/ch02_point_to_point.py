"""02 Point-to-point: send/recv, isend/irecv, the classic deadlock, batch_isend_irecv, a ring."""

from nbkit import code, dist, md, predict, setup

STEM = "02_point_to_point"

CELLS = [
    md(
        """
        # 02 · Point-to-point: one member calls another

        Collectives involve the whole team. Before them comes the simplest kind of talk: one rank
        sends a tensor, one other rank receives it. Everything else can be built from this, and
        its one classic mistake, the deadlock, is worth seeing once with your own eyes.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. move a tensor from one rank to another with `dist.send` and `dist.recv`;
        2. start transfers without waiting with `dist.isend` / `dist.irecv`, and finish them with
           the returned work handle's `wait()`;
        3. explain why two ranks that both `recv` first deadlock, and fix it two ways;
        4. send and receive in one call with `dist.batch_isend_irecv`;
        5. pass a token around a ring of ranks.
        """
    ),
    md(
        """
        ## The idea

        A phone call. One teammate talks (`send`), one listens (`recv`), and both must be on the
        line at the same time. The listener must have a notepad ready of the right size: `recv`
        writes **into a tensor you allocated**, with the same shape and dtype as the one sent.

        `send` and `recv` are *blocking*: they return only when this rank's part is done. On gloo,
        a `send` returns after the matching `recv` has taken the data.

        Below, the even ranks talk and the odd ranks listen: 0 calls 1, 2 calls 3.

        ![Four ranks on a ring: each sends its number to the right and receives the left neighbour's](figures/02_ring_pass.svg)
        """
    ),
    setup(),
    dist(
        """
        buf = torch.zeros(3, device=device)
        if rank % 2 == 0:
            buf = torch.tensor([1.0, 2.0, 3.0], device=device) * (rank + 1)
        before = buf.clone()

        if rank % 2 == 0 and rank + 1 < world_size:  # on an odd count the last rank has no pair
            dist.send(buf, dst=rank + 1)  # even ranks send their (3,) tensor
        elif rank % 2 == 1:
            dist.recv(buf, src=rank - 1)  # odd ranks receive into their (3,) buffer

        after = buf.clone()
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        before = %dist_pull before
        after = %dist_pull after
        show_buffers(before, title="before: even ranks hold data")
        show_buffers(after, title="after send/recv: each odd rank has its left neighbour's data")
        """
    ),
    md(
        """
        ### Not waiting: `isend` and `irecv`

        `dist.isend` and `dist.irecv` return at once with a **work handle**. The transfer runs in
        the background; `work.wait()` blocks until it is done, and `work.is_completed()` asks
        without blocking. Until `wait()` returns, do not read the receive buffer and do not change
        the send buffer.

        With non-blocking calls every rank can send to its right neighbour *and* receive from its
        left one at the same time, without worrying about who goes first.
        """
    ),
    dist(
        """
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        out = torch.full((2,), float(rank), device=device)
        inbox = torch.empty(2, device=device)

        send_work = dist.isend(out, dst=right)
        recv_work = dist.irecv(inbox, src=left)
        # ...this rank could compute here while the data moves...
        send_work.wait()
        recv_work.wait()
        inbox.tolist()
        """
    ),
    md(
        """
        ## Predict, then run
        """
    ),
    predict(
        """
        Two ranks. Each one first calls `recv` from the other, then `send`s to the other. What
        happens?
        """,
        """
        Nothing, until a timeout. Each rank sits in `recv` waiting for the other to talk, and
        neither gets to its `send`. That is a **deadlock**. The process group would end it only
        after its own timeout (the cell after next prints it: 30 minutes for gloo). The cell
        below gives it a 3-second deadline; the magic then stops it, shows you where each rank
        was stuck, and restarts the ranks.
        """,
    ),
    md(
        """
        This cell runs on 2 ranks with a 3 s deadline. It fails on purpose (it is tagged
        `raises-exception`, so running the whole notebook carries on). Read the error: it shows
        the line each rank is waiting at. Both wait at line 3, in `dist.recv`.
        """
    ),
    dist(
        """
        other = 1 - rank
        inbox = torch.empty(1, device=device)
        dist.recv(inbox, src=other)  # both ranks wait to hear first...
        dist.send(torch.ones(1, device=device), dst=other)  # ...so nobody ever speaks
        """,
        options="-n 2 --timeout 3",
        tags=["raises-exception"],
    ),
    md(
        """
        Without `--timeout`, how long would they have waited? Not forever: every process group
        has a timeout, after which the waiting call raises. torch keeps the defaults in
        `torch.distributed.constants`; read them from the torch you have rather than trusting a
        number in a text. `%%dist` uses its own, shorter deadline (60 s unless `--timeout`), so a
        stuck cell ends long before.
        """
    ),
    code(
        """
        from torch.distributed import constants

        print("gloo process groups time out after", constants.default_pg_timeout)
        nccl = getattr(constants, "default_pg_nccl_timeout", None)
        print("NCCL process groups:", nccl if nccl is not None else "(not set in this CPU build of torch)")
        """
    ),
    md(
        """
        **Fix 1: agree on an order.** Rank 0 talks first and then listens; rank 1 listens first
        and then talks. For longer chains the usual rule is "even ranks send first, odd ranks
        receive first".
        """
    ),
    dist(
        """
        other = 1 - rank
        msg = torch.full((1,), 10.0 * (rank + 1), device=device)
        inbox = torch.empty(1, device=device)
        if rank == 0:
            dist.send(msg, dst=other)
            dist.recv(inbox, src=other)
        else:
            dist.recv(inbox, src=other)
            dist.send(msg, dst=other)
        inbox.item()
        """,
        options="-n 2",
    ),
    md(
        """
        **Fix 2: post both at once.** `dist.batch_isend_irecv` takes a list of `dist.P2POp`
        (an operation, a tensor, a peer) and starts all of them together; no order to agree on.
        """
    ),
    dist(
        """
        ops = [
            dist.P2POp(dist.isend, msg, other),
            dist.P2POp(dist.irecv, inbox, other),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        inbox.item()
        """,
        options="-n 2",
    ),
    predict(
        """
        What if both ranks `send` first and then `recv`?
        """,
        """
        Here, with gloo, it hangs too: a gloo `send` waits until the other side's `recv` has
        taken the data. Some backends buffer small messages, so such code can seem to work and
        then hang when the tensors grow. Never rely on it: order the calls, or post them together.
        """,
    ),
    md(
        """
        ### Passing a token round a ring

        Back to the whole team (4 ranks, unless you changed `-n`). Rank 0 starts a token at 1
        and sends it right. Each other rank receives
        it from the left, adds `rank + 1`, and sends it right. The last rank's right neighbour
        is rank 0, so the token comes home.
        """
    ),
    predict(
        """
        On 4 ranks, what does `token` hold on each rank at the end?
        """,
        """
        Rank 0 starts with 1. Rank 1 receives 1 and adds 2: **3**. Rank 2 adds 3: **6**. Rank 3
        adds 4: **10**, and sends it to rank 0, which receives **10**. So `[10, 3, 6, 10]`.
        """,
    ),
    dist(
        """
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        token = torch.zeros(1, device=device)
        if rank == 0:
            token += 1
            dist.send(token, dst=right)
            dist.recv(token, src=left)  # the token comes home
        else:
            dist.recv(token, src=left)
            token += rank + 1
            dist.send(token, dst=right)
        token.item()
        """
    ),
    md(
        """
        The same ring with `batch_isend_irecv`: every rank passes its own value right at once,
        in one step instead of `world_size` steps.
        """
    ),
    dist(
        """
        mine = torch.tensor([float(rank)], device=device)
        from_left = torch.empty(1, device=device)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, mine, right),
            dist.P2POp(dist.irecv, from_left, left),
        ])
        for work in works:
            work.wait()
        from_left.item()
        """
    ),
    md(
        """
        ## Pitfalls

        - **Both sides receive first: deadlock.** Agree on an order or post both at once.
        - **Shape and dtype must match.** `recv` writes into your buffer; allocate it with the
          sender's shape and dtype.
        - **Every send needs exactly one matching receive.** An unmatched `send` or `recv` waits
          until the process group's timeout (30 minutes for gloo), or until `%%dist` stops it.
        - **Touching buffers before `wait()`.** After `isend`, do not change the tensor; after
          `irecv`, do not read it, until `wait()` returns.
        - **Losing the work handle.** Keep the handle and call `wait()`; a program that never
          waits may exit before the data left.
        """
    ),
    md(
        """
        ## Self-check

        Compute in the kernel the token each rank holds after the ring, for any number of ranks,
        and compare with the ranks.
        """
    ),
    code(
        """
        from distlab.i18n import passed

        def ring_tokens(n):
            tokens = [0] * n
            value = 1  # rank 0 starts at 1
            for r in range(1, n):
                value += r + 1
                tokens[r] = value
            tokens[0] = value  # the token comes home
            return tokens


        pulled = %dist_pull token
        got = [t.item() for t in pulled]
        assert got == ring_tokens(len(got)), (got, ring_tokens(len(got)))
        passed(got)
        """
    ),
    md(
        """
        ## Summary

        - `send` / `recv` move one tensor between two ranks; the receiver pre-allocates.
        - `isend` / `irecv` return work handles; `wait()` before touching the buffers.
        - Two ranks that both wait to receive first deadlock. Fix it by ordering the calls or by
          posting them together with `batch_isend_irecv`.
        - A ring, "send right, receive from the left", is the pattern behind the fast collectives
          of notebook 09.

        ## Next

        [03 · broadcast](03_broadcast.ipynb): the captain gives one order to the whole team.
        """
    ),
]
