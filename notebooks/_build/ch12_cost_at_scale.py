"""12 Cost at scale: a 10B model on 64 GPUs, from the learner's own alpha-beta fit to ZeRO's memory table."""

from nbkit import code, dist, md, predict, setup

STEM = "12_cost_at_scale"

CELLS = [
    md(
        """
        # 12 · Cost at scale: a 10B model on 64 GPUs

        You have a model with 10 billion parameters and 64 GPUs in 8 nodes. Which way of
        training it fits in memory, and how long does each step spend communicating? This
        notebook answers with the tools of notebooks 09 to 11: the alpha-beta model, the ring,
        reduce_scatter + all_gather, and ZeRO. Every number below is computed in a cell, from
        the formulas and from figures whose source is given.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. move from the alpha-beta fit of *this* machine to published figures for GPU links
           (NVLink, PCIe, InfiniBand) and say how far apart they are;
        2. estimate an all_reduce of a model's gradients with a flat ring and with a
           hierarchical scheme (inside the node, across nodes, inside the node);
        3. compute memory per GPU for plain data parallelism and ZeRO stages 1, 2 and 3, and
           check the result against the ZeRO paper;
        4. compute the bytes each scheme moves per step, and the communication of tensor and
           pipeline parallelism;
        5. decide, for a model size, a GPU count and a network, what fits and what the
           communication costs.
        """
    ),
    md(
        """
        ## The idea

        Moving house. A small flat fits in one van, and what matters is how often the van
        drives (latency). A big house needs many trips, and what matters is how much the van
        holds (bandwidth). Inside a node the vans are fast (NVLink); between nodes they are
        slower (one network card per GPU). A good plan loads the fast vans first: sort
        everything inside each node, send only each GPU's share across the network, then sort
        again inside the node. That is the hierarchical all_reduce.

        ![Flat ring against hierarchical all_reduce: 8 nodes of 8 GPUs; the ring crosses the network at every node boundary with the whole buffer's traffic, the hierarchical scheme sends one eighth of it per GPU across the network](figures/12_hierarchical.svg)

        Memory is the other half. Mixed-precision training with Adam keeps, per parameter, 2
        bytes of bf16 weights, 2 bytes of bf16 gradients and 12 bytes of fp32 optimizer state
        (a master copy of the weight, momentum, variance): 16 bytes. ZeRO splits the 12, then
        the gradients, then the weights over the GPUs.
        """
    ),
    setup(),
    md(
        """
        ### Step 1: your machine's alpha and beta

        A quick all_reduce sweep on 4 ranks of this machine, fitted as in notebook 11 (a few seconds). On a
        busy machine the fit can come out negative or infinite (noise larger than the effect),
        so for the bandwidth we read the largest size's bus bandwidth directly:
        """
    ),
    code(
        """
        from distlab import bench

        WORLD = 4  # the sweep starts its own ranks, apart from the %%dist ones
        rows = bench.sweep(["all_reduce"], "4K:4M", [WORLD], iters=10, progress=False)
        print("alpha-beta fit:", bench.fits(rows)[("all_reduce", WORLD)])
        largest = max(rows, key=lambda r: r["size"])
        here = largest["busbw"] * 1e9  # bytes per second: the largest size is bandwidth-bound
        print(f"bus bandwidth here at {largest['size'] / 2**20:.0f} MiB: {largest['busbw']:.2f} GB/s")
        """
    ),
    md(
        """
        ### Step 2: real hardware

        Published link speeds, **per GPU and per direction** (what the `beta` of the model
        means):

        | link | GB/s per direction | source |
        | --- | --- | --- |
        | NVLink 4 (H100 SXM) | 450 | NVIDIA H100 datasheet: 900 GB/s, both directions together |
        | NVLink 3 (A100 SXM) | 300 | NVIDIA A100 datasheet: 600 GB/s, both directions together |
        | PCIe 5.0 x16 | 63 | PCI-SIG: 32 GT/s x 16 lanes, 128b/130b encoding |
        | PCIe 4.0 x16 | 31.5 | PCI-SIG: 16 GT/s x 16 lanes, 128b/130b encoding |
        | InfiniBand NDR, one port | 50 | NVIDIA ConnectX-7 datasheet: 400 Gb/s |
        | InfiniBand HDR, one port | 25 | NVIDIA ConnectX-6 datasheet: 200 Gb/s |

        A DGX H100 node has 8 GPUs on NVLink and 8 ConnectX-7 ports of 400 Gb/s for the
        compute network, one per GPU (NVIDIA DGX H100 datasheet). That is the node used below.

        Latency is harder to pin down: it depends on the library, the message path and the
        software. The model below **assumes** 5 microseconds per step inside a node and 15
        microseconds per step across nodes; change them and see that, for gradients of
        gigabytes, they hardly matter.
        """
    ),
    code(
        """
        GB = 1e9
        LINKS = {  # bytes per second, per GPU, per direction (table above)
            "NVLink 4": 450 * GB, "NVLink 3": 300 * GB, "PCIe 5.0 x16": 63 * GB,
            "PCIe 4.0 x16": 31.5 * GB, "IB NDR": 50 * GB, "IB HDR": 25 * GB,
        }
        ALPHA_INTRA, ALPHA_INTER = 5e-6, 15e-6  # assumed, seconds per step
        for name, speed in LINKS.items():
            print(f"{name:>13}: {speed / here:8.0f} x this machine's bus bandwidth")
        """
    ),
    md(
        """
        ### Step 3: one all_reduce of a 10B model's gradients

        10 billion bf16 gradients are `N = 20 GB`. The ring of notebook 09 takes
        `T = 2(n-1) alpha + 2(n-1)/n * N / B`, where `B` is the slowest link on the ring.

        - **8 GPUs, one node**: every link is NVLink.
        - **Flat ring over 64 or 512 GPUs**: the ring leaves each node through one GPU's
          network card, so `B` is 50 GB/s, and it has `2(n-1)` steps.
        - **Hierarchical**: reduce_scatter inside each node (NVLink), so each GPU holds the sum
          of 1/8 of the buffer over its node; all_reduce that 1/8 across the nodes, each GPU on
          its own network card, all 8 at once; all_gather inside the node.
        """
    ),
    code(
        """
        def ring_time(nbytes, n, alpha, bandwidth):
            \"\"\"All_reduce of nbytes on a ring of n ranks whose slowest link has this bandwidth.\"\"\"
            return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bandwidth


        def hierarchical_time(nbytes, nodes, per_node):
            inside = (per_node - 1) * ALPHA_INTRA + (per_node - 1) / per_node * nbytes / LINKS["NVLink 4"]
            across = ring_time(nbytes / per_node, nodes, ALPHA_INTER, LINKS["IB NDR"])
            return inside + across + inside  # reduce_scatter, all_reduce, all_gather


        N = 10e9 * 2  # bytes: 10B bf16 gradients
        print(f"{'GPUs':>5} {'flat ring':>10} {'hierarchical':>13}")
        for gpus in (8, 64, 512):
            nodes = gpus // 8
            if nodes == 1:
                flat = ring_time(N, gpus, ALPHA_INTRA, LINKS["NVLink 4"])
            else:
                flat = ring_time(N, gpus, ALPHA_INTER, LINKS["IB NDR"])
            print(f"{gpus:>5} {flat * 1e3:>8.0f} ms {hierarchical_time(N, nodes, 8) * 1e3:>10.0f} ms")
        """
    ),
    md(
        """
        Inside one node the all_reduce of 20 GB takes about 78 ms. A flat ring across nodes is
        about ten times slower, because one network card per node carries the ring's whole
        traffic while seven sit idle. The hierarchical scheme keeps all eight cards busy with
        1/8 of the data each, and its time hardly grows from 64 to 512 GPUs. (NCCL reaches a
        similar effect differently: it runs several rings at once, each through a different
        card.)
        """
    ),
    predict(
        """
        In the hierarchical scheme on 64 GPUs, which of the three phases takes longest, and
        why?
        """,
        """
        The all_reduce across nodes: it moves `2 * 7/8 * 2.5 GB` per GPU through a 50 GB/s card
        (about 88 ms), while each NVLink phase moves `7/8 * 20 GB` at 450 GB/s (about 39 ms).
        The network card is 9 times slower than NVLink and carries about 1/4 of the bytes.
        """,
    ),
    code(
        """
        inside = 7 / 8 * N / LINKS["NVLink 4"]
        across = ring_time(N / 8, 8, ALPHA_INTER, LINKS["IB NDR"])
        print(f"each NVLink phase {inside * 1e3:.0f} ms, across the nodes {across * 1e3:.0f} ms")
        """
    ),
    md(
        """
        ### Step 4: memory per GPU

        With `P` parameters on `n` GPUs and `K` bytes of optimizer state per parameter (12 for
        mixed-precision Adam), the ZeRO paper (Rajbhandari et al., 2020, section 5) gives:

        | scheme | bytes per GPU |
        | --- | --- |
        | data parallel | `(2 + 2 + K) P` |
        | ZeRO-1 (optimizer states sharded) | `2P + 2P + K P / n` |
        | ZeRO-2 (and gradients) | `2P + (2 + K) P / n` |
        | ZeRO-3 / FSDP (and parameters) | `(2 + 2 + K) P / n` |

        Activations and buffers come on top. First the paper's own example, its Figure 1:
        7.5B parameters on 64 GPUs.
        """
    ),
    code(
        """
        def memory_gb(params, gpus, stage, k=12):
            \"\"\"Model states per GPU, in GB (1e9 bytes), for mixed-precision training.\"\"\"
            weights, grads, states = 2 * params, 2 * params, k * params
            if stage >= 1:
                states /= gpus
            if stage >= 2:
                grads /= gpus
            if stage >= 3:
                weights /= gpus
            return (weights + grads + states) / GB


        figure_1 = [memory_gb(7.5e9, 64, stage) for stage in range(4)]
        print("ZeRO paper, Figure 1 (7.5B, 64 GPUs, K=12): 120, 31.4, 16.6, 1.88 GB")
        print("computed here:                               " + ", ".join(f"{m:.3g}" for m in figure_1))
        assert [round(m, 2) for m in figure_1] == [120.0, 31.41, 16.64, 1.88]
        """
    ),
    md(
        """
        Now the 10B model on 64 GPUs of 80 GB each:
        """
    ),
    code(
        """
        NAMES = ["data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3 / FSDP"]
        for stage, name in enumerate(NAMES):
            need = memory_gb(10e9, 64, stage)
            print(f"{name:>14}: {need:6.1f} GB per GPU {'fits' if need < 80 else 'does NOT fit'} in 80 GB")
        """
    ),
    md(
        """
        Sharded memory, in miniature: a "model" of 2 numbers per rank (8 on 4 ranks). With
        ZeRO-3 each rank keeps its 2 and all_gathers the rest only when a layer needs them.
        """
    ),
    dist(
        """
        from distlab.compat import all_gather_single

        full = torch.arange(2.0 * world_size, device=device)  # the model: 8 parameters on 4 ranks
        per_rank = full.numel() // world_size
        shard = full[rank * per_rank:(rank + 1) * per_rank].clone()  # what ZeRO-3 keeps
        gathered = torch.empty_like(full)
        all_gather_single(gathered, shard)  # what a layer sees, for a moment
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        shards = %dist_pull shard
        gathered = %dist_pull gathered
        show_buffers(shards, title="ZeRO-3: what each rank keeps")
        show_buffers(gathered, title="after all_gather: what a layer uses, then frees")
        """
    ),
    md(
        """
        ### Step 5: bytes on the wire per step

        Per GPU and per step, for `P` bf16 parameters (2 bytes each), following the ZeRO paper
        (section 7):

        - **Data parallel**: one all_reduce of the gradients, `2 (n-1)/n * 2P` bytes sent.
        - **ZeRO-1 and ZeRO-2**: a reduce_scatter of the gradients and an all_gather of the
          updated weights: `(n-1)/n * 2P` each, the same total as data parallel.
        - **ZeRO-3**: the weights are all_gathered twice (forward and backward) and the
          gradients reduce_scattered once: `3 (n-1)/n * 2P`, **1.5 times** data parallel.
        """
    ),
    code(
        """
        def bytes_per_step(params, gpus, stage):
            one_pass = (gpus - 1) / gpus * 2 * params  # one reduce_scatter or all_gather, bf16
            return (3 if stage == 3 else 2) * one_pass


        dp = bytes_per_step(10e9, 64, 0)
        for stage, name in enumerate(NAMES):
            sent = bytes_per_step(10e9, 64, stage)
            print(f"{name:>14}: {sent / GB:5.1f} GB sent per GPU per step ({sent / dp:.1f} x data parallel)")
        """
    ),
    md(
        """
        ### Step 6: tensor and pipeline parallelism

        **Tensor parallelism** (Megatron-LM, Shoeybi et al., 2019) splits each layer's matrices
        over `t` GPUs. Every transformer layer then needs **two all_reduces in the forward**
        (after attention, after the MLP) and two in the backward, each of the layer's
        activations: `b * s * h` numbers for `b` sequences of `s` tokens and hidden size `h`.
        That is why tensor parallelism stays inside a node, on NVLink.

        **Pipeline parallelism** cuts the layers into stages on different GPUs; between stages
        only the activations of one micro-batch travel, point-to-point: `b * s * h` numbers per
        micro-batch and boundary, forward, and as many gradients backward.

        A 10B model shaped like GPT (40 layers, `h = 4608`: `12 * 40 * 4608^2` is about 10.2B),
        micro-batches of `b = 1` sequence of `s = 4096` tokens:
        """
    ),
    code(
        """
        layers, h, b, s = 40, 4608, 1, 4096
        print(f"parameters: {12 * layers * h * h / 1e9:.1f}B")
        activation = b * s * h * 2  # bytes, bf16
        t = 8
        tp_layer = 4 * ring_time(activation, t, ALPHA_INTRA, LINKS["NVLink 4"])  # 2 forward + 2 backward
        print(f"tensor parallel on {t} GPUs: {4 * layers} all_reduces of {activation / 1e6:.0f} MB per step, "
              f"{tp_layer * layers * 1e3:.0f} ms on NVLink")
        pp_hop = 2 * activation / LINKS["IB NDR"]  # forward activation + backward gradient
        print(f"pipeline parallel: {activation / 1e6:.0f} MB per micro-batch and boundary each way, "
              f"{pp_hop * 1e3:.1f} ms per micro-batch across the network")
        """
    ),
    md(
        """
        ### Step 7: when communication hides behind compute

        A training step costs about `6 P` floating-point operations per token (2 forward, 4
        backward; Kaplan et al., 2020). An H100 SXM does at most 989 TFLOP/s in dense bf16
        (NVIDIA H100 datasheet); real training reaches a fraction of it, the model FLOPs
        utilisation (MFU). With an **assumed** MFU of 40%:
        """
    ),
    code(
        """
        PEAK, MFU = 989e12, 0.40  # FLOP/s (datasheet), assumed utilisation
        tokens_per_gpu = 8 * 4096  # 8 sequences of 4096 tokens per GPU per step
        compute = 6 * 10e9 * tokens_per_gpu / (PEAK * MFU)
        comm = hierarchical_time(N, 8, 8)
        print(f"compute per step {compute * 1e3:.0f} ms, gradient all_reduce {comm * 1e3:.0f} ms: "
              f"{'can hide behind' if comm < compute else 'longer than'} the backward pass")
        """
    ),
    md(
        """
        DDP and FSDP overlap the gradient communication with the backward pass (notebook 10), so
        as long as the all_reduce takes less than the backward (4 of the 6 operations per
        token, so 2/3 of the compute), it costs almost nothing. Below some number of tokens per
        GPU it no longer hides:
        """
    ),
    code(
        """
        threshold = comm / (2 / 3) * PEAK * MFU / (6 * 10e9)  # tokens where backward == all_reduce
        print(f"the all_reduce hides behind the backward above about {threshold:,.0f} tokens per GPU per step")
        """
    ),
    md(
        """
        That is why large-scale training keeps per-GPU batches large, and why a model that needs
        more GPUs than it has tokens for turns to tensor or pipeline parallelism.

        ### A decision table

        Model states per GPU (80 GB GPUs, mixed-precision Adam) and the gradient communication
        per step (hierarchical, DGX H100 nodes), for a few cases:
        """
    ),
    code(
        """
        print(f"{'model':>6} {'GPUs':>5} {'smallest scheme that fits':>26} {'GB/GPU':>7} {'comm ms':>8}")
        for params, gpus in [(1e9, 8), (10e9, 8), (10e9, 64), (70e9, 64), (70e9, 512)]:
            fits = [(stage, memory_gb(params, gpus, stage)) for stage in range(4)]
            stage, need = next(((s, m) for s, m in fits if m < 80), (None, fits[-1][1]))
            name = NAMES[stage] if stage is not None else "none: add tensor/pipeline"
            comm = hierarchical_time(2 * params, max(gpus // 8, 1), min(gpus, 8))
            comm *= 1.5 if stage == 3 else 1.0  # ZeRO-3 moves 1.5x (step 5)
            print(f"{params / 1e9:>5.0f}B {gpus:>5} {name:>26} {need:>7.1f} {comm * 1e3:>8.0f}")
        """
    ),
    md(
        """
        ## Predict, then run
        """
    ),
    predict(
        """
        For a 70B model on 64 GPUs, which is the smallest scheme that fits 80 GB of model
        states, how many GB per GPU does it need, and how many GPUs would ZeRO-3 need at least?
        """,
        """
        `16 * 70e9 / 64 = 17.5 GB`: it fits with ZeRO-3 (the table's answer). Data parallel
        would need `16 * 70 = 1120 GB` per GPU, ZeRO-1 `4 * 70 + 12 * 70 / 64 = 293 GB`, ZeRO-2
        `2 * 70 + 14 * 70 / 64 = 155 GB`. With ZeRO-3 the smallest count is
        `ceil(1120 / 80) = 14` GPUs, before activations.
        """,
    ),
    code(
        """
        import math

        print(memory_gb(70e9, 64, 3), "GB with ZeRO-3 on 64 GPUs;",
              math.ceil(16 * 70e9 / 80e9), "GPUs at least for 80 GB of model states")
        """
    ),
    md(
        """
        ### Worked problems

        1. Your cluster has InfiniBand HDR (25 GB/s per GPU) instead of NDR. How long does the
           hierarchical all_reduce of the 10B gradients take on 64 GPUs?

        <details><summary>Answer</summary>

        Only the middle phase changes: `2 * 7/8 * 2.5 GB / 25 GB/s = 175 ms`, plus
        `2 * 39 ms` inside the nodes: about 253 ms.

        </details>

        2. With ZeRO-3 the same model sends 1.5 times the bytes of data parallel. Why might it
           still be the right choice on 64 GPUs?

        <details><summary>Answer</summary>

        Because data parallel does not fit (160 GB per GPU of model states against 80 GB), and
        ZeRO-1 and ZeRO-2 need 42 GB and 22 GB. If ZeRO-2 fits with the activations, it moves
        less; if not, ZeRO-3 is the only one of the four that runs.

        </details>
        """
    ),
    md(
        """
        ## Pitfalls

        - **Bits and bytes.** Network cards are sold in gigabits per second: 400 Gb/s is
          50 GB/s.
        - **Both directions added.** NVLink's 900 GB/s counts both directions; one direction
          carries 450 GB/s.
        - **The slowest link decides a ring.** A ring is as fast as the link it crosses last.
        - **Model states are not all the memory.** Activations, temporary buffers and
          fragmentation come on top; the table is a lower bound.
        - **An assumed number is still an assumption.** Latencies and MFU above are
          assumptions; measure your own (notebook 11) before you decide.
        """
    ),
    md(
        """
        ## Self-check

        The formulas must agree with each other: ZeRO-3 on one GPU is data parallel, the
        hierarchical all_reduce on one node is a ring inside the node, and the ZeRO paper's
        figures come out.
        """
    ),
    code(
        """
        from distlab.i18n import passed

        assert memory_gb(10e9, 1, 3) == memory_gb(10e9, 1, 0) == 160
        one_node = hierarchical_time(N, 1, 8)
        assert abs(one_node - 2 * (7 * ALPHA_INTRA + 7 / 8 * N / LINKS["NVLink 4"])) < 1e-12
        assert bytes_per_step(10e9, 64, 3) == 1.5 * bytes_per_step(10e9, 64, 0)
        assert [round(m, 2) for m in figure_1] == [120.0, 31.41, 16.64, 1.88]
        passed()
        """
    ),
    md(
        """
        ## Summary

        - Real links are many times faster than ranks sharing a laptop's cores (step 2 printed
          how many); the model is the same, only alpha and beta change.
        - A 10B model's gradients are 20 GB; on 64 DGX H100 GPUs the hierarchical all_reduce
          takes about 0.17 s, a flat ring through one card per node about 0.8 s.
        - Mixed-precision Adam needs 16 bytes per parameter: 160 GB for 10B, so plain data
          parallelism does not fit; ZeRO-1, -2, -3 need 42, 22 and 2.5 GB per GPU on 64 GPUs.
        - ZeRO-3 moves 1.5 times the bytes of data parallel; tensor parallelism needs NVLink;
          pipeline parallelism sends only activations.
        - Communication is free while it hides behind the backward pass.

        ## Next

        Exercise 7 (`exercises/ex7_cost_model/`) asks you to write these cost functions in
        general (any precision, any optimizer, any cluster shape) and grades them. Then go back
        to [00 · Welcome](00_welcome.ipynb) whenever you want to run something on a fresh team.
        """
    ),
]
