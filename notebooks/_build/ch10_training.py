"""10 Collectives in training: gradients by hand vs DDP, bucketing, overlap, ZeRO and FSDP."""

from nbkit import code, dist, md, predict, setup

STEM = "10_training"

CELLS = [
    md(
        """
        # 10 · Collectives in training

        Data-parallel training is the primitives of this course put to work. Each rank holds a
        copy of the model and a different slice of the batch; after the backward pass, the ranks
        **average their gradients** so every copy takes the same step. This notebook does that by
        hand, then with `DistributedDataParallel`, and then looks at the tricks that make it
        fast (bucketing, overlap) and at the sharded schemes (ZeRO, FSDP) that make it fit.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. train data-parallel by hand: `all_reduce` the gradients, divide by `world_size`;
        2. show that DDP computes the same thing, and full-batch training on one process too;
        3. explain DDP's gradient **buckets** and see them with a communication hook;
        4. overlap communication with the backward pass using async all_reduces;
        5. name the collectives of ZeRO-1/2/3 and FSDP, do a ZeRO-2 step by hand, and trace FSDP.
        """
    ),
    md(
        """
        ## The idea

        Four teachers grade a pile of 48 exams with one shared marking guide (the model). Each
        takes 12 exams (a data shard). Grading suggests corrections to the guide (gradients), and
        each teacher's suggestions differ because their exams differ. If each teacher edited their
        own guide, the four guides would drift apart. So before editing, they **average** their
        suggestions, and everyone applies the same average. The guides stay identical, and the
        result is the same as one teacher grading all 48 exams.

        The average of the four local gradients equals the full-batch gradient because each
        local loss is a mean over an equal share of the batch. (48 samples split evenly over 2,
        3, 4, 6, 8, 12 or 16 ranks; on 5 ranks the shares differ and the average is off.)

        We define the model, the data and the settings once in the kernel and push them to the
        ranks, so every rank and the kernel build the same thing.

        ![Each rank's own gradient, then the same averaged gradient on every rank after all_reduce](figures/10_gradients.svg)
        """
    ),
    setup(),
    code(
        """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        def make_model():
            torch.manual_seed(0)  # the same initial weights wherever this runs
            return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


        gen = torch.Generator().manual_seed(1)
        X, Y = torch.randn(48, 8, generator=gen), torch.randn(48, 1, generator=gen)  # global batch
        LR, STEPS = 0.1, 5

        %dist_push make_model X Y LR STEPS
        """
    ),
    md(
        """
        ### By hand: all_reduce the gradients

        Each rank takes its share of the 48 samples (12 on 4 ranks), computes its gradients, sums them over ranks
        with `all_reduce`, divides by `world_size`, and steps.
        """
    ),
    dist(
        """
        import torch.nn as nn
        import torch.nn.functional as F

        xs = X.chunk(world_size)[rank].to(device)  # (12, 8) on 4 ranks: my share of the batch
        ys = Y.chunk(world_size)[rank].to(device)
        model = make_model().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=LR)

        for step in range(STEPS):
            opt.zero_grad()
            F.mse_loss(model(xs), ys).backward()
            if step == 0:
                local_grad = model[2].weight.grad.flatten()[:8].clone()  # for the picture
            for p in model.parameters():
                dist.all_reduce(p.grad)  # sum over ranks...
                p.grad /= world_size  # ...then average
            if step == 0:
                first_avg = [p.grad.clone() for p in model.parameters()]
                avg_grad = model[2].weight.grad.flatten()[:8].clone()
            opt.step()

        hand = [p.detach().clone() for p in model.parameters()]
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        local = %dist_pull local_grad
        averaged = %dist_pull avg_grad
        show_buffers(local, title="step 0: last layer's gradient (first 8 entries), per rank")
        show_buffers(averaged, title="after all_reduce / world_size: identical everywhere")
        """
    ),
    md(
        """
        ### The same with `DistributedDataParallel`

        `DDP` wraps the model. At construction it **broadcasts** rank 0's parameters (notebook
        03), and during `backward()` it **all-reduces** the gradients and divides by
        `world_size`. The training loop looks like single-process code.
        """
    ),
    dist(
        """
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(make_model().to(device))
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        for step in range(STEPS):
            opt.zero_grad()
            F.mse_loss(ddp(xs), ys).backward()  # gradients are averaged inside backward()
            opt.step()

        ddp_params = [p.detach().clone() for p in ddp.module.parameters()]
        max(float((a - b).abs().max()) for a, b in zip(hand, ddp_params))
        """
    ),
    md(
        """
        The largest difference between the hand-made and the DDP parameters, per rank: zero, or
        a rounding error (the sums may be added in a different order).

        ## Predict, then run
        """
    ),
    predict(
        """
        The model has 3 Linear layers of 32 x 32 (1056 float32 numbers each: 1024 weights, 32
        biases; 4224 bytes). We wrap it in DDP with `bucket_cap_mb=0.004` (4194 bytes) and record
        the size of every bucket DDP all-reduces. How many all_reduce calls does the **first**
        backward make, and how many the second?
        """,
        """
        First backward: **one** bucket of 3168 numbers. Before it has seen a backward pass, DDP
        puts all parameters in a single bucket. After the first iteration it **rebuilds** the
        buckets in the order the gradients actually became ready, with the size cap: from the
        second backward on, **three** buckets of 1056, one per layer (a bucket closes as soon
        as it reaches the cap, so each layer's 4224 bytes close one).
        """,
    ),
    dist(
        """
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        torch.manual_seed(0)
        wide = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                             nn.Linear(32, 32)).to(device)
        bucketed = DDP(wide, bucket_cap_mb=0.004)
        bucket_sizes = []


        def counting_hook(state, bucket):
            bucket_sizes.append(bucket.buffer().numel())  # numbers in this bucket
            return allreduce_hook(state, bucket)  # then do what DDP does by default


        bucketed.register_comm_hook(None, counting_hook)
        x_wide = torch.randn(8, 32, device=device)
        per_iteration = []
        for it in range(3):
            bucket_sizes.clear()
            bucketed(x_wide).sum().backward()
            per_iteration.append(list(bucket_sizes))
        per_iteration
        """
    ),
    md(
        """
        Why buckets? One all_reduce per parameter tensor pays the latency (`alpha`, notebook 09)
        once per tensor; one all_reduce of everything must wait until the whole backward is
        done. Buckets are the compromise: a few medium messages, and the first can start while
        the backward pass is still computing the earlier layers. DDP fills them in **reverse**
        parameter order (the order backward produces gradients). With the default settings the
        first bucket is small, 1 MiB, so that communication starts early; the others hold up to
        `bucket_cap_mb`, 25 MiB by default. (With `bucket_cap_mb` set, as above, every bucket
        uses it.) The next cell reads these numbers from the torch you have.

        """
    ),
    code(
        """
        import inspect

        import torch.distributed as tdist
        from torch.nn.parallel import distributed as ddp_module

        first = getattr(tdist, "_DEFAULT_FIRST_BUCKET_BYTES", None)  # private names: may move
        cap = getattr(ddp_module, "_DEFAULT_BUCKET_CAP_MB", None)
        if cap is None:
            cap = inspect.signature(ddp_module.DistributedDataParallel).parameters["bucket_cap_mb"].default
        print(f"first bucket: {first} bytes; later buckets: bucket_cap_mb = {cap} (MiB)")
        """
    ),
    md(
        """
        ### Overlapping communication with the backward pass

        Gradients become ready **last layer first**. DDP starts a bucket's all_reduce as soon as
        the bucket is full, while backward continues. Here is the same idea by hand: a hook on
        each parameter starts an **async** all_reduce the moment its gradient is ready, and we
        wait for all of them only at the end.
        """
    ),
    dist(
        """
        model2 = make_model().to(device)
        names = {p: name for name, p in model2.named_parameters()}
        pending, ready_order = [], []


        def start_all_reduce(p):
            ready_order.append(names[p])
            pending.append(dist.all_reduce(p.grad, async_op=True))  # runs in the background


        hooks = [p.register_post_accumulate_grad_hook(start_all_reduce) for p in model2.parameters()]
        F.mse_loss(model2(xs), ys).backward()  # the hooks fire during this call
        for work in pending:
            work.wait()
        for p in model2.parameters():
            p.grad /= world_size
        for h in hooks:
            h.remove()

        same = all(torch.allclose(p.grad, g) for p, g in zip(model2.parameters(), first_avg))
        print("ready order:", ready_order, "| same as by hand:", same)
        """
    ),
    md(
        """
        The last layer (`2.`) is ready first, so its all_reduce runs while the first layer's
        gradients are still being computed. On GPUs, NCCL runs on its own CUDA stream and the
        overlap hides much of the communication time. On this CPU-only machine, computation and
        gloo share the same 2 cores, so do not expect a speed-up here: the point is the order.

        ### Your own DDP step on a timeline

        Now watch DDP do it. A deeper model (6 layers of 512 x 512, about 1 MiB of float32
        weights each) in DDP with 2 MiB buckets: three buckets. Hooks on each layer record when
        its backward starts and ends; `--trace` records DDP's all_reduce of each bucket (DDP
        calls them from its communication hook). The first step builds the buckets; the traced
        cell runs the second.
        """
    ),
    dist(
        """
        import time

        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        torch.manual_seed(0)
        deep = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(6)]).to(device)
        spans = []  # this rank's backward, one entry per layer


        def started(module, grad_output):
            module.backward_started = time.perf_counter()


        def finished(module, grad_input, grad_output, index=0):
            spans.append({"label": f"layer {index}", "t_start": module.backward_started,
                          "t_end": time.perf_counter()})


        for i, layer in enumerate(deep):
            layer.register_full_backward_pre_hook(started)
            layer.register_full_backward_hook(lambda m, gi, go, i=i: finished(m, gi, go, i))
        ddp_deep = DDP(deep, bucket_cap_mb=2)
        ddp_deep.register_comm_hook(None, allreduce_hook)  # DDP's default, from Python: traceable
        batch = torch.randn(256, 512, device=device, requires_grad=True)  # so the first layer's hook fires too
        ddp_deep(batch).sum().backward()  # step 1: DDP rebuilds its buckets afterwards
        spans.clear()
        """
    ),
    dist(
        """
        ddp_deep(batch).sum().backward()  # step 2, traced
        """,
        options="-n 4 --trace",
    ),
    code(
        """
        import distlab
        from distlab.viz import PNG, timeline_figure

        spans = %dist_pull spans
        step = distlab.last_trace()
        display(PNG(timeline_figure(step, spans=spans,
                                    title="one DDP step: each layer's backward (grey), bucket all_reduces")))
        for rank, (work, calls) in enumerate(zip(spans, step)):
            reduces = [c for c in calls if c["op"] == "all_reduce"]
            backward_ends = max(s["t_end"] for s in work)
            first = min(c["t_start"] for c in reduces)
            print(f"rank {rank}: {len(reduces)} bucket all_reduces; the first started "
                  f"{(backward_ends - first) * 1e3:.1f} ms before the backward pass ended")
        """
    ),
    md(
        """
        Read the picture from the right: backward runs from layer 5 down to layer 0, and the
        bucket holding the last layers is all-reduced while the first layers are still
        computing. On GPUs that overlap can hide most of DDP's communication, as long as the
        backward takes longer than the all_reduces (notebook 12 computes when it does).

        ### Sharding: ZeRO and FSDP

        DDP keeps a full copy of everything on every rank: parameters, gradients and optimizer
        state (Adam keeps two more numbers per parameter). ZeRO (Rajbhandari et al., "ZeRO: Memory
        Optimizations Toward Training Trillion Parameter Models", SC 2020) shards them instead:

        | Scheme | Sharded across ranks | Collectives per step |
        |---|---|---|
        | DDP | nothing | `all_reduce` of gradients |
        | ZeRO-1 | optimizer state | `reduce_scatter` of gradients, `all_gather` of updated parameters |
        | ZeRO-2 | + gradients | same as ZeRO-1 |
        | ZeRO-3 / FSDP | + parameters | `all_gather` of parameters before each layer (forward and again in backward), `reduce_scatter` of gradients |

        Since `all_reduce = reduce_scatter + all_gather` (notebook 09), ZeRO-1 and ZeRO-2 move the
        same amount of data as DDP; ZeRO-3 gathers parameters twice, about 1.5 times as much (the
        ZeRO paper's analysis). What they save is memory: each rank updates only `1/n` of the
        parameters and keeps optimizer state only for those.

        A ZeRO-2 step by hand, on the flattened parameters:
        """
    ),
    dist(
        """
        from torch.nn.utils import parameters_to_vector, vector_to_parameters

        from distlab.compat import all_gather_single, reduce_scatter_single

        zmodel = make_model().to(device)
        P = sum(p.numel() for p in zmodel.parameters())  # 161 numbers
        per = -(-P // world_size)  # my shard: ceil(161 / 4) = 41 on 4 ranks
        flat_grad = torch.zeros(per * world_size, device=device)  # padded (to 164 on 4 ranks)
        flat_param = torch.zeros(per * world_size, device=device)

        for step in range(STEPS):
            zmodel.zero_grad()
            F.mse_loss(zmodel(xs), ys).backward()
            flat_grad[:P] = parameters_to_vector(p.grad for p in zmodel.parameters())
            grad_shard = torch.empty(per, device=device)
            reduce_scatter_single(grad_shard, flat_grad)  # I get the summed gradient of my shard
            grad_shard /= world_size

            flat_param[:P] = parameters_to_vector(zmodel.parameters()).detach()
            my_params = flat_param[rank * per:(rank + 1) * per].clone()
            my_params -= LR * grad_shard  # the optimizer touches only my 1/n of the parameters
            all_gather_single(flat_param, my_params)  # everyone gets every updated shard
            vector_to_parameters(flat_param[:P], zmodel.parameters())

        zero_params = [p.detach().clone() for p in zmodel.parameters()]
        max(float((a - b).abs().max()) for a, b in zip(hand, zero_params))
        """
    ),
    md(
        """
        ### FSDP: watch its collectives

        PyTorch's FSDP (`fully_shard`) does ZeRO-3. Each `Linear` becomes a unit whose parameters
        are split across the ranks; before the unit runs, FSDP all-gathers its parameters, and
        afterwards frees them again. `--trace` shows every call.
        """
    ),
    dist(
        """
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world_size,))
        fsdp_model = make_model().to(device)
        for layer in fsdp_model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)  # one unit per Linear
        fully_shard(fsdp_model, mesh=mesh)

        F.mse_loss(fsdp_model(xs), ys).backward()
        w = fsdp_model[0].weight
        rows = w.to_local().shape[0]  # my rows of the (16, 8) weight: 4 on 4 ranks
        start = rank * -(-w.shape[0] // world_size)  # dim 0 is split as torch.chunk splits it
        fsdp_ok = torch.allclose(w.grad.to_local(), first_avg[0][start:start + rows])
        print(f"I keep {tuple(w.to_local().shape)} of {tuple(w.shape)}; grad shard matches: {fsdp_ok}")
        """,
        options="-n 4 --trace",
    ),
    code(
        """
        import distlab

        ops = [r["op"] for r in distlab.last_trace()[0] if r.get("op") != "snapshot"]
        print(ops)
        """
    ),
    md(
        """
        Two units, so: two `all_gather_single` in the forward pass, two again in the backward
        pass (the parameters were freed after the forward), and two `reduce_scatter_single` of
        the gradients. Each rank's gradient shard is exactly its rows of the averaged gradient.

        ## Pitfalls

        - **Different initial weights.** Without a broadcast (DDP does it) or a common seed, the
          replicas start apart and stay apart.
        - **Dividing by the wrong number.** Average over ranks (`world_size`); your loss is
          already a mean over the local batch.
        - **Uneven shards.** If ranks get different batch sizes, the plain average of gradients
          is no longer the full-batch gradient; weight by sample counts.
        - **Forgetting `wait()`** on async all_reduces before `opt.step()` steps on half-reduced
          gradients.
        - **Expecting overlap on CPU.** Overlap pays off when communication and computation use
          different hardware (GPU streams, network); here they share two cores.
        - **Every rank must run the same backward.** A rank that skips a parameter (an unused
          branch) leaves DDP waiting for its bucket; see `find_unused_parameters`.
        """
    ),
    md(
        """
        ## Self-check

        Train the same model on the full batch of 48 in this kernel, on one process, with the
        same steps. By hand, DDP and ZeRO-2 must all land on these parameters, on every rank.
        """
    ),
    code(
        """
        from distlab.i18n import passed

        single = make_model()
        opt = torch.optim.SGD(single.parameters(), lr=LR)
        for _ in range(STEPS):
            opt.zero_grad()
            F.mse_loss(single(X), Y).backward()
            opt.step()
        reference = [p.detach() for p in single.parameters()]

        hand_all = %dist_pull hand
        ddp_all = %dist_pull ddp_params
        zero_all = %dist_pull zero_params
        for name, per_rank in [("by hand", hand_all), ("DDP", ddp_all), ("ZeRO-2", zero_all)]:
            for params in per_rank:
                assert all(torch.allclose(a.cpu(), b, atol=1e-6)
                           for a, b in zip(params, reference)), name
        buckets = %dist_pull per_iteration
        assert buckets[0] == [[3168], [1056, 1056, 1056], [1056, 1056, 1056]], buckets[0]
        fsdp = %dist_pull fsdp_ok
        assert all(fsdp)
        passed(note="by hand = DDP = ZeRO-2 = one process on the full batch")
        """
    ),
    md(
        """
        ## Summary

        - Data parallelism: average the gradients with `all_reduce` (sum, then divide by n).
        - DDP broadcasts the initial weights and all-reduces gradients in buckets during
          backward, last layer first, overlapping with the rest of the backward pass.
        - ZeRO-1/2 replace the all_reduce with `reduce_scatter` + `all_gather` and shard the
          optimizer state (and gradients); ZeRO-3 / FSDP also shard the parameters and all-gather
          them before each use.

        ## Next

        [11 · Measuring](11_measuring.ipynb): how fast are these primitives on this machine?
        """
    ),
]
