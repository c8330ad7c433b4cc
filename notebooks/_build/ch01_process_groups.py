"""01 Process groups: how ranks find each other, backends, init methods, subgroups, barrier."""

from nbkit import code, dist, md, predict, setup

STEM = "01_process_groups"

CELLS = [
    md(
        """
        # 01 · Process groups: forming the team

        Before anyone can pass a tensor to anyone, the processes must form a team: agree on how
        many members there are, give each a number, and open the phone lines between them. In
        `torch.distributed` that team is a **process group**, and `init_process_group` forms it.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. explain `init_process_group` and its three arguments that matter: backend, init method,
           and rank / world size;
        2. choose a backend: gloo (CPU), NCCL (NVIDIA GPUs), MPI (if torch was built with it);
        3. start a group by hand with the `file://`, `tcp://` and `env://` init methods;
        4. tell apart `rank`, `world_size` and `local_rank`;
        5. make subgroups with `new_group`, use `barrier`, and end with `destroy_process_group`.
        """
    ),
    md(
        """
        ## The idea

        Forming a team needs three agreements:

        - **A meeting point** (the *init method*). Everyone goes to the same place to sign up: an
          address and port where rank 0 listens (`tcp://` or `env://`), or a file on a shared disk
          (`file://`). Once everyone has signed up, they know how to reach each other.
        - **A roster** (`rank` and `world_size`). Four members, numbered 0 to 3. Everyone must
          agree on the size, and every number is used exactly once.
        - **A phone line** (the *backend*). **gloo** runs on CPUs and anywhere; **NCCL** is
          NVIDIA's library for GPUs and is what training on GPUs uses; **MPI** works when torch was
          built against an MPI library (`pip` wheels are not).

        After signing up, the group is the default group (`dist.group.WORLD`), and every
        collective uses it unless you pass another.

        Two more numbers. `local_rank` is the rank *on this machine*: with 2 machines of 4 GPUs,
        global ranks 0 to 7 have local ranks 0 to 3 on each machine, and a rank uses GPU
        `cuda:{local_rank}`. Here everything runs on one machine, so `local_rank == rank`.

        ![An all_reduce inside two process groups, ranks 0 and 2, ranks 1 and 3: each group sums only its own members](figures/01_groups.svg)
        """
    ),
    setup(),
    md(
        """
        ### What `%%dist` did for you

        When the ranks started, each one already called `init_process_group`. Ask them.
        """
    ),
    dist(
        """
        print(f"initialised={dist.is_initialized()} backend={dist.get_backend()} "
              f"rank={dist.get_rank()} world_size={dist.get_world_size()} "
              f"local_rank={local_rank} device={device}")
        """
    ),
    md(
        """
        Each rank holds a number, and the world group lists all members. Below, each rank makes a
        one-element tensor holding its rank; the picture shows the four buffers side by side.
        """
    ),
    dist(
        """
        me = torch.tensor([rank], device=device)
        members = dist.get_process_group_ranks(dist.group.WORLD)
        members
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        mes = %dist_pull me
        show_buffers(mes, title="each rank's number")
        """
    ),
    md(
        """
        ### Doing it by hand: three init methods

        Now form a team of 2 without the magic. The script below is an ordinary training-script
        start: read rank and world size, call `init_process_group`, do one `all_reduce`, and call
        `destroy_process_group` to leave. It does that three times, once per meeting point:

        - `file://PATH`: a file both processes can see. No port, so nothing can collide.
        - `tcp://ADDRESS:PORT`: where rank 0 listens. We use loopback, `127.0.0.1`.
        - `env://` (the default): the address and port come from the environment variables
          `MASTER_ADDR` and `MASTER_PORT`.

        We launch the script twice (rank 0 and rank 1) as separate Python processes. Real jobs use
        a launcher for this, usually `torchrun`, which starts the processes and sets the `env://`
        variables (`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`).
        """
    ),
    code(
        '''
        import os
        import socket
        import subprocess
        import sys
        import tempfile
        import textwrap
        import time

        SCRIPT = textwrap.dedent("""
            import sys
            import torch
            import torch.distributed as dist

            rank, world_size = int(sys.argv[1]), int(sys.argv[2])
            for init_method in sys.argv[3:]:
                dist.init_process_group("gloo", init_method=init_method,
                                        rank=rank, world_size=world_size)
                t = torch.tensor([rank + 1])
                dist.all_reduce(t)  # every rank: 1 + 2 = 3
                scheme = init_method.split(":")[0]
                print(f"{scheme}: rank {dist.get_rank()} of {dist.get_world_size()}, sum {t.item()}")
                dist.destroy_process_group()  # leave the team (and close its connections)
        """)


        def launch(init_methods, world_size=2, env=None, timeout=120):
            """Start one process per rank, wait for all, return every line they printed.
            When one fails, stop the others, as torchrun does: they would wait for it."""
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "train.py")
                with open(path, "w") as f:
                    f.write(SCRIPT)
                procs = [
                    subprocess.Popen(
                        [sys.executable, path, str(r), str(world_size), *init_methods],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        env={**os.environ, **(env or {})},
                    )
                    for r in range(world_size)
                ]
                deadline = time.monotonic() + timeout
                while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                    if any(p.returncode for p in procs):  # one failed
                        break
                    time.sleep(0.05)
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                results = [p.communicate() for p in procs]
            for p, (out, err) in zip(procs, results):
                if p.returncode and p.returncode > 0:
                    raise RuntimeError(err)
            if any(p.returncode for p in procs):
                raise RuntimeError(f"the ranks did not finish within {timeout} s")
            return [line for out, _ in results for line in out.splitlines()]


        def free_port():
            """Ask the OS for a free port on loopback (fine for a demo: see Pitfalls)."""
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]
        '''
    ),
    code(
        """
        for attempt in range(3):  # free_port() can race (see Pitfalls): then try new ports
            with tempfile.TemporaryDirectory() as tmp:
                methods = [f"file://{tmp}/rendezvous", f"tcp://127.0.0.1:{free_port()}", "env://"]
                env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
                try:
                    lines = launch(methods, env=env)
                    break
                except RuntimeError as error:
                    if "address already in use" not in str(error) or attempt == 2:
                        raise
        for line in lines:
            print(line)
        """
    ),
    md(
        """
        ### Subgroups: smaller teams inside the team

        `dist.new_group(ranks)` makes a group of some ranks. Two rules:

        - **every rank calls `new_group` for every group, in the same order**, even for groups it
          is not in (creating a group is itself a collective step on the world group);
        - a rank then only uses the groups it belongs to.

        Inside a group, ranks are renumbered from 0: `dist.get_rank(group)`.
        """
    ),
    dist(
        """
        evens = dist.new_group(list(range(0, world_size, 2)))  # [0, 2] on 4 ranks
        odds = dist.new_group(list(range(1, world_size, 2)))   # [1, 3] on 4 ranks
        mine = evens if rank % 2 == 0 else odds

        s = torch.tensor([rank], device=device)
        dist.all_reduce(s, group=mine)  # sums only over the ranks of `mine`
        print(f"global rank {rank} = rank {dist.get_rank(mine)} in "
              f"{dist.get_process_group_ranks(mine)}, sum {s.item()}")
        """
    ),
    md(
        """
        For the common case of equal consecutive blocks there is a shortcut:
        `dist.new_subgroups(group_size=2)` makes the groups `[0, 1]` and `[2, 3]` and returns the
        caller's own group first.
        """
    ),
    dist(
        """
        # group_size must divide world_size: on an odd count, one group holds every rank.
        size = 2 if world_size % 2 == 0 else world_size
        pair, all_pairs = dist.new_subgroups(group_size=size)
        p = torch.tensor([rank], device=device)
        dist.all_reduce(p, group=pair)
        p.item()
        """
    ),
    md(
        """
        ## Predict, then run
        """
    ),
    predict(
        """
        In the `evens` / `odds` cell above, what value of `s` does rank 3 hold, and what does
        `dist.get_rank(odds)` return on rank 3?
        """,
        """
        `odds` is `[1, 3]`, so `s` on rank 3 is `1 + 3 = 4`, and rank 3 is the second member of
        `odds`, so `dist.get_rank(odds)` is `1`.
        """,
    ),
    predict(
        """
        And `p` on each rank after the `new_subgroups(group_size=2)` cell?
        """,
        """
        The pairs are `[0, 1]` and `[2, 3]`: ranks 0 and 1 hold `0 + 1 = 1`, ranks 2 and 3 hold
        `2 + 3 = 5`. (Try `-n 6`: a third pair `[4, 5]` holds 9. On `-n 3` the cell makes one
        group of 3, because `new_subgroups` refuses a `group_size` that does not divide the
        world.)
        """,
    ),
    md(
        """
        ### Barrier: wait for everyone

        `dist.barrier()` returns on a rank only after **every** rank has reached it. Below, rank r
        first sleeps `0.2 * r` seconds, so rank 3 arrives last. We record when each rank arrived
        and when it left.
        """
    ),
    dist(
        """
        import time

        time.sleep(0.2 * rank)
        arrived = time.time()
        dist.barrier()
        left = time.time()
        """
    ),
    code(
        """
        arrived = %dist_pull arrived
        left = %dist_pull left
        t0 = min(arrived)
        for r in range(len(arrived)):
            print(f"rank {r}: arrived at {arrived[r] - t0:.3f} s, left at {left[r] - t0:.3f} s")

        # Nobody leaves before the last one has arrived.
        assert min(left) >= max(arrived)
        """
    ),
    md(
        """
        ### Ending: `destroy_process_group`

        A script calls `dist.destroy_process_group()` once at the end (see `SCRIPT` above): it
        closes the connections and frees the backend's resources. Do not call it inside a
        `%%dist` cell: the magic owns the group, and later cells need it. To get fresh ranks,
        use `%dist_restart`.
        """
    ),
    md(
        """
        ## Pitfalls

        - **Every rank creates every group.** The torch documentation requires all processes of
          the job to enter `new_group`, even those not in the new group. Called only on ranks 0
          and 2, it waits for the others until the process group's timeout.
        - **Fixed ports collide.** Port 29500 is the usual default; a second job or a leftover
          process on the same machine then fails with "address already in use". Use a free port,
          or `file://`. (Our `free_port()` has a small race: another program could take the port
          between the check and its use. The demo above then tries again with new ports.)
        - **NCCL needs one GPU per rank.** Two ranks on the same GPU fail with "Duplicate GPU
          detected". Pick the GPU with `local_rank`, not `rank`, on multi-machine jobs.
        - **Ranks in a group are renumbered.** `src` and `dst` arguments take *global* ranks;
          torch 2.13 also accepts `group_src` / `group_dst` for ranks within the group.
        - **Forgetting `destroy_process_group`** in a script leaves connections open until the
          process dies; with NCCL, recent torch versions print a warning about it at exit.
        """
    ),
    md(
        """
        ## Self-check

        For the `evens` / `odds` cell, compute in the kernel what each rank's `s` should be, then
        compare with the ranks.
        """
    ),
    code(
        """
        from distlab.i18n import passed

        pulled = %dist_pull s
        world = range(len(pulled))
        expected = [sum(q for q in world if q % 2 == r % 2) for r in world]
        got = [t.item() for t in pulled]
        assert got == expected, (got, expected)
        assert lines == [f"{m}: rank {r} of 2, sum 3" for r in range(2)
                         for m in ("file", "tcp", "env")], lines
        passed(got)
        """
    ),
    md(
        """
        ## Summary

        - A process group needs a backend, an init method and a roster (`rank`, `world_size`).
        - gloo for CPUs, NCCL for NVIDIA GPUs, MPI if torch was built with it.
        - `file://`, `tcp://` and `env://` are three meeting points; `torchrun` uses `env://`.
        - `new_group` and `new_subgroups` make smaller teams; every rank must create every group.
        - `barrier` waits for everyone; `destroy_process_group` ends the team.

        ## Next

        [02 · Point-to-point](02_point_to_point.ipynb): two members talk directly with `send` and
        `recv`, and we meet the classic deadlock.
        """
    ),
]
