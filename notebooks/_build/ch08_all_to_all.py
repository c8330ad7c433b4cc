"""08 all_to_all: list and single forms, uneven splits, mixture-of-experts and sequence parallelism."""

from nbkit import code, dist, md, predict, setup

STEM = "08_all_to_all"

CELLS = [
    md(
        """
        # 08 · `all_to_all`: everyone sends a letter to everyone

        In every collective so far, a rank sent the same thing to everyone, or one piece to one
        root. In `all_to_all` each rank has a **different** piece **for each** other rank. It is
        the most general exchange, and the one mixture-of-experts models and sequence
        parallelism depend on.
        """
    ),
    md(
        """
        ## Learning goals

        After this notebook you can:

        1. exchange one piece between every pair of ranks with `dist.all_to_all(outputs, inputs)`;
        2. do it on flat tensors with `dist.all_to_all_single`, with equal or **uneven** splits;
        3. see it as a matrix transpose: row *r* (what rank *r* sends) becomes column *r*;
        4. route tokens to experts and back, as a mixture-of-experts layer does;
        5. switch a tensor from sequence-sharded to head-sharded, as sequence parallelism does.
        """
    ),
    md(
        """
        ## The idea

        A team's internal mail. Every member writes one letter to every member (one to
        themselves, too) and puts letter *j* in slot *j* of their outbox. The mail room
        delivers: afterwards member *j*'s inbox holds the letters addressed to *j*, in slot *r*
        the one from member *r*.

        Write the letters as a table: row *r* is rank *r*'s outbox, column *j* goes to rank *j*.
        `all_to_all` **transposes** the table. Below, the letter from *r* to *j* is the number
        `10r + j`.

        ![All_to_all transposes the table: rank r's j-th entry goes to rank j](figures/08_all_to_all.svg)
        """
    ),
    setup(),
    dist(
        """
        outbox = [torch.tensor([10.0 * rank + j], device=device) for j in range(world_size)]
        inbox = [torch.empty(1, device=device) for _ in range(world_size)]
        dist.all_to_all(inbox, outbox)  # inbox[r] = the letter rank r wrote to me

        sent = torch.cat(outbox)
        received = torch.cat(inbox)
        received.tolist()
        """
    ),
    code(
        """
        from distlab.viz import show_buffers

        sent = %dist_pull sent
        received = %dist_pull received
        show_buffers(sent, title="before: row r = rank r's outbox (letter to rank j in column j)")
        show_buffers(received, title="after all_to_all: the table transposed")
        """
    ),
    md(
        """
        ## Predict, then run
        """
    ),
    predict(
        """
        On 4 ranks, each rank's outbox is one flat tensor, `[4 * rank + j for j in range(4)]`,
        and we call
        `all_to_all_single(out, inp)` with equal splits. What does rank 2 receive?
        """,
        """
        Rank *r* sends element *j* (`4r + j`) to rank *j*. Rank 2 receives element 2 from every
        rank, in rank order: `[2, 6, 10, 14]`.
        """,
    ),
    dist(
        """
        inp = torch.arange(world_size, device=device) + world_size * rank  # (world_size,)
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)  # equal splits: element j goes to rank j
        out.tolist()
        """
    ),
    md(
        """
        ### Uneven splits: routing tokens to experts

        A mixture-of-experts (MoE) layer has several *experts* (small networks); here expert *e*
        lives on rank *e*. A router sends each token to one expert. Each rank has 6 tokens, and
        the counts per expert differ from rank to rank, so the pieces have **different sizes**.
        `all_to_all_single` takes the sizes:

        1. sort this rank's tokens by destination and count them: `send_counts`;
        2. `all_to_all_single` the counts, so each rank learns how many tokens it will receive;
        3. `all_to_all_single` the tokens with `input_split_sizes=send_counts` and
           `output_split_sizes=recv_counts` (the **dispatch**);
        4. each expert processes what it received;
        5. send the results back with the splits swapped (the **combine**), and unsort.
        """
    ),
    dist(
        """
        tokens = 100.0 * rank + torch.arange(6.0, device=device)  # 6 tokens, values 100r + t
        dest = (torch.arange(6, device=device) + rank) % world_size  # the router's choice

        order = torch.argsort(dest, stable=True)  # step 1: group tokens by destination
        send_counts = torch.bincount(dest, minlength=world_size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)  # step 2: exchange the counts

        send_sizes, recv_sizes = send_counts.tolist(), recv_counts.tolist()
        arrived = torch.empty(sum(recv_sizes), device=device)
        dist.all_to_all_single(arrived, tokens[order], recv_sizes, send_sizes)  # step 3: dispatch

        processed = arrived + 1000.0 * (rank + 1)  # step 4: expert `rank` marks its work

        back = torch.empty(6, device=device)
        dist.all_to_all_single(back, processed, send_sizes, recv_sizes)  # step 5: combine
        result = torch.empty_like(back)
        result[order] = back  # undo the sort
        print(f"sent {send_sizes}, received {recv_sizes}: expert {rank} got {arrived.tolist()}")
        """
    ),
    md(
        """
        Every token went to its expert and came back to its own place, marked by the expert that
        processed it. Note the argument order of `all_to_all_single(output, input,
        output_split_sizes, input_split_sizes)`: **output first**, for the tensors and for the
        sizes.

        ### Sequence parallelism: from "my tokens" to "my heads"

        With long sequences, each rank holds a slice of the sequence. On 4 ranks: 2 of 8
        positions, all 4 attention heads (one head per rank here). Attention needs the *whole* sequence, but each head is independent. So
        before attention, an all_to_all swaps the sharding: afterwards each rank holds **all 8
        positions for one head**. After attention a second all_to_all swaps back. This is the
        scheme of DeepSpeed-Ulysses (Jacobs et al., 2023).

        It is one of three kinds of sequence parallelism, and each uses a different primitive:

        - **Ulysses** (above): all_to_all, sequence-sharded to head-sharded and back.
        - **Megatron-LM sequence parallelism** (Korthikanti et al., 2022) works beside tensor
          parallelism: the layer norms and dropout run on sequence shards, an **all_gather**
          rebuilds the full sequence before a tensor-parallel block, and a **reduce_scatter**
          (instead of tensor parallelism's all_reduce) returns to sequence shards after it.
        - **Ring attention** (Liu et al., 2023) keeps the sequence sharded during attention: the
          key and value blocks travel around a ring of ranks with **send/recv**, each rank
          attending to one block per step while the next one is in flight.
        """
    ),
    dist(
        """
        seq_local, heads = 2, world_size
        positions = torch.arange(seq_local, device=device) + seq_local * rank  # my 2 positions
        x = 100.0 * positions[:, None] + torch.arange(heads, device=device)  # x[s, h] = 100s + h

        per_head = [c.contiguous() for c in x.chunk(world_size, dim=1)]  # piece j: head j, (2, 1)
        mine = [torch.empty(seq_local, 1, device=device) for _ in range(world_size)]
        dist.all_to_all(mine, per_head)
        one_head = torch.cat(mine, dim=0)  # (2 * world_size, 1): every position, head `rank`
        one_head.flatten().tolist()
        """
    ),
    md(
        """
        ## Pitfalls

        - **Output comes first**, for tensors and for split sizes:
          `all_to_all_single(output, input, output_split_sizes, input_split_sizes)`.
        - **The receiver must know the sizes.** With uneven splits, exchange the counts first
          (a small all_to_all), then allocate.
        - **Pieces must be contiguous.** Slicing along a later dimension gives views that are
          not; call `.contiguous()`.
        - **Every rank sends to every rank**, even zero elements: a split size of 0 is fine, but
          every rank must call.
        - **It is all-to-all traffic.** Every pair of ranks talks, so across machines it stresses
          the network more than a ring does. That is why MoE systems try to keep experts close.
        """
    ),
    md(
        """
        ## Self-check

        Compute in the kernel what each rank must hold after the letter exchange (the transpose)
        and after the MoE round trip, and compare.
        """
    ),
    code(
        """
        from distlab.i18n import passed

        received = %dist_pull received
        n = len(received)  # the number of ranks
        expected_received = [[10.0 * r + j for r in range(n)] for j in range(n)]
        assert [t.tolist() for t in received] == expected_received

        expected_moe = [
            [100.0 * r + t + 1000.0 * ((t + r) % n + 1) for t in range(6)] for r in range(n)
        ]
        results = %dist_pull result
        assert [t.tolist() for t in results] == expected_moe, results

        heads = %dist_pull one_head
        assert [h.flatten().tolist() for h in heads] == [
            [100.0 * s + h for s in range(2 * n)] for h in range(n)
        ]
        passed()
        """
    ),
    md(
        """
        ## Summary

        - `all_to_all`: rank *r*'s piece *j* goes to rank *j*, slot *r*: a transpose.
        - `all_to_all_single(out, inp, out_splits, in_splits)` on flat tensors, with uneven
          splits when you give the sizes (exchange counts first).
        - MoE layers dispatch tokens to experts and combine them back with two all_to_alls.
        - Sequence parallelism swaps "my positions, all heads" for "all positions, my heads".

        ## Next

        [09 · Composing collectives](09_composing.ipynb): build all_reduce from the pieces, watch
        the ring algorithm step by step, and count what it costs.
        """
    ),
]
