"""Every op of the runtime as a race's Case (`races.Case`), on one group and backend, with the
values each rank must end with computed here from the seeds.

Rank r's data for chunk j of race k is `pattern(seed(k, r, j))`: distinct per rank, per chunk and
per race. Roots: reduce and gather to the group's last rank, broadcast and scatter from its first.
"""

from __future__ import annotations

import torch

import mcr

from .races import Case, fold, pattern, seed

N = 1024  # elements of a whole tensor
M = 256  # elements of one rank's chunk
WIDTH = 3  # the row width of the uneven all-to-all
LARGE = 8 << 20  # elements of the large AVG all-reduce (32 MiB of float32)

# the ops with a node-aware form (mcr.node_aware): the others would run flat
NODE_AWARE = (
    "all_reduce sum",
    "all_reduce avg",
    "all_reduce max",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single even",
    "all_to_all_single uneven",
)
R = mcr.ReduceOp
REDUCE = {"sum": R.SUM, "avg": R.AVG, "max": R.MAX}


def cases(rank: int, ranks: list, group, backend, dtype) -> dict:
    """{op name: make(k) -> Case} for every op on `group` (global `ranks`, this rank among them).
    `backend`: backend= for every call (None: the runtime's choice)."""
    g, me = len(ranks), ranks.index(rank)
    root, src = g - 1, 0  # group ranks
    kw = {"group": group, "backend": backend}

    def pat(k, r, j=0, n=N):
        return pattern(seed(k, r, j), n, dtype)

    made = {}

    def all_reduce(kind):
        def make(k):
            return Case(
                f"all_reduce {kind}",
                {"x": pat(k, me)},
                {},
                lambda b, a: mcr.all_reduce(b["x"], op=REDUCE[kind], async_op=a, **kw),
                {"x": fold(kind, [pat(k, r) for r in range(g)], dtype)},
            )

        return make

    for kind in REDUCE:
        made[f"all_reduce {kind}"] = all_reduce(kind)

    def reduce(k):  # AVG: a finisher at the root only
        want = {"x": fold("avg", [pat(k, r) for r in range(g)], dtype)} if me == root else {}
        run = lambda b, a: mcr.reduce(b["x"], ranks[root], op=R.AVG, async_op=a, **kw)  # noqa: E731
        return Case("reduce avg", {"x": pat(k, me)}, {}, run, want)

    def broadcast(k):
        run = lambda b, a: mcr.broadcast(b["x"], ranks[src], async_op=a, **kw)  # noqa: E731
        return Case("broadcast", {"x": pat(k, me)}, {}, run, {"x": pat(k, src)})

    def all_gather(k):
        outs = {f"o{r}": pat(k, r) for r in range(g)}
        run = lambda b, a: mcr.all_gather([b[f"o{r}"] for r in range(g)], b["x"], async_op=a, **kw)  # noqa: E731
        return Case("all_gather", {"x": pat(k, me)}, outs, run, outs)

    def all_gather_into_tensor(k):
        want = torch.cat([pat(k, r) for r in range(g)])
        run = lambda b, a: mcr.all_gather_into_tensor(b["out"], b["x"], async_op=a, **kw)  # noqa: E731
        return Case("all_gather_into_tensor", {"x": pat(k, me)}, {"out": want}, run, {"out": want})

    def gather(k):
        outs = {f"o{r}": pat(k, r) for r in range(g)} if me == root else {}

        def run(b, a):
            gl = [b[f"o{r}"] for r in range(g)] if me == root else None
            return mcr.gather(b["x"], gl, dst=ranks[root], async_op=a, **kw)

        return Case("gather", {"x": pat(k, me)}, outs, run, outs)

    def scatter(k):
        ins = {f"x{j}": pat(k, src, j, M) for j in range(g)} if me == src else {}

        def run(b, a):
            sl = [b[f"x{j}"] for j in range(g)] if me == src else None
            return mcr.scatter(b["out"], sl, src=ranks[src], async_op=a, **kw)

        want = pat(k, src, me, M)
        return Case("scatter", ins, {"out": want}, run, {"out": want})

    def reduce_scatter(k):  # SUM, the list form
        ins = {f"x{j}": pat(k, me, j, M) for j in range(g)}
        want = fold("sum", [pat(k, r, me, M) for r in range(g)], dtype)
        run = lambda b, a: mcr.reduce_scatter(b["out"], [b[f"x{j}"] for j in range(g)], async_op=a, **kw)  # noqa: E731
        return Case("reduce_scatter sum", ins, {"out": want}, run, {"out": want})

    def reduce_scatter_tensor(k):  # AVG: a finisher on the scattered part
        x = torch.cat([pat(k, me, j, M) for j in range(g)])
        want = fold("avg", [pat(k, r, me, M) for r in range(g)], dtype)
        run = lambda b, a: mcr.reduce_scatter_tensor(b["out"], b["x"], op=R.AVG, async_op=a, **kw)  # noqa: E731
        return Case("reduce_scatter_tensor avg", {"x": x}, {"out": want}, run, {"out": want})

    def sent(k, r, j):
        """What group rank r sends group rank j in the uneven all-to-alls: r + j + 1 rows."""
        return pat(k, r, j, (r + j + 1) * WIDTH)

    def all_to_all(k):  # the list form, uneven lengths
        ins = {f"x{j}": sent(k, me, j) for j in range(g)}
        outs = {f"o{r}": sent(k, r, me) for r in range(g)}

        def run(b, a):
            return mcr.all_to_all([b[f"o{r}"] for r in range(g)], [b[f"x{j}"] for j in range(g)], async_op=a, **kw)

        return Case("all_to_all", ins, outs, run, outs)

    def all_to_all_single_even(k):
        x = torch.cat([pat(k, me, j, M) for j in range(g)])
        want = torch.cat([pat(k, r, me, M) for r in range(g)])
        run = lambda b, a: mcr.all_to_all_single(b["out"], b["x"], async_op=a, **kw)  # noqa: E731
        return Case("all_to_all_single even", {"x": x}, {"out": want}, run, {"out": want})

    def all_to_all_single_uneven(k):
        x = torch.cat([sent(k, me, j) for j in range(g)]).view(-1, WIDTH)
        want = torch.cat([sent(k, r, me) for r in range(g)]).view(-1, WIDTH)
        in_splits, out_splits = [me + j + 1 for j in range(g)], [r + me + 1 for r in range(g)]

        def run(b, a):
            return mcr.all_to_all_single(b["out"], b["x"], out_splits, in_splits, async_op=a, **kw)

        return Case("all_to_all_single uneven", {"x": x}, {"out": want}, run, {"out": want})

    def send_recv(k):  # a ring: send/recv blocking, isend/irecv async
        nxt, prv = ranks[(me + 1) % g], ranks[(me - 1) % g]

        def run(b, a):
            if a:
                return [mcr.isend(b["x"], nxt, **kw), mcr.irecv(b["got"], prv, **kw)]
            if me % 2 == 0:
                mcr.send(b["x"], nxt, **kw)
                mcr.recv(b["got"], prv, **kw)
            else:
                mcr.recv(b["got"], prv, **kw)
                mcr.send(b["x"], nxt, **kw)
            return None

        want = pat(k, (me - 1) % g)
        return Case("send/recv", {"x": pat(k, me)}, {"got": want}, run, {"got": want})

    made.update(
        {
            "reduce avg": reduce,
            "broadcast": broadcast,
            "all_gather": all_gather,
            "all_gather_into_tensor": all_gather_into_tensor,
            "gather": gather,
            "scatter": scatter,
            "reduce_scatter": reduce_scatter,
            "reduce_scatter_tensor": reduce_scatter_tensor,
            "all_to_all": all_to_all,
            "all_to_all_single even": all_to_all_single_even,
            "all_to_all_single uneven": all_to_all_single_uneven,
        }
    )
    if g > 1:  # no backend sends to itself
        made["send/recv"] = send_recv
    return made


def large_avg(rank: int, ranks: list, group, backend, sleep_ms: float):
    """make(k): a 32 MiB float32 AVG all-reduce, where the staging copies and the host reduction
    take milliseconds: a copy-back or divide that the consumer is not ordered after is still
    running when the consumer reads."""
    g, me = len(ranks), ranks.index(rank)

    def make(k):
        data = [pattern(seed(k, r), LARGE, torch.float32) for r in range(g)]
        # the average of periodic inputs, one period folded then repeated (8M elements in float64 cost)
        want = fold("avg", [pattern(seed(k, r), 61, torch.float32) for r in range(g)], torch.float32)
        want = want.repeat(-(-LARGE // 61))[:LARGE]
        run = lambda b, a: mcr.all_reduce(b["x"], op=R.AVG, group=group, async_op=a, backend=backend)  # noqa: E731
        return Case("all_reduce avg 32 MiB", {"x": data[me]}, {}, run, {"x": want}, sleep_ms)

    return make
