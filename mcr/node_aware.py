"""Node-aware collectives: an op on a group that spans nodes, as phases inside each node and
between nodes, each phase on its own backend (the candidate `node:INTRA+INTER`).

A group with L ranks on each of N nodes splits two ways (`mcr.topology.Layout`): the node-local
group (my node's L ranks) and the peer group (the N ranks with my local index, one per node).

    all_reduce      reduce-scatter inside the node (each local rank holds 1/L, summed over the
                    node), all-reduce of that part across nodes, all-gather inside the node
    all_gather      all-gather across nodes (my local index's inputs from every node), then
                    all-gather of those inside the node
    reduce_scatter  reduce-scatter inside the node (each local rank holds the node's sum of the
                    N blocks its peers will own), reduce-scatter of that across nodes
    all_to_all      all-to-all inside the node (to local rank j everything bound for local
                    index j on any node), all-to-all across nodes; uneven splits and the list
                    form first all-gather every local rank's send sizes inside the node

So each byte crosses the network once, as in the flat op, and never L times over. Blocks are
reordered between phases where the group's rank order is not node-major (ranks placed
cyclically, `srun --distribution=cyclic`). Every phase is a blocking op that the runtime runs
(`phase(where, method, *args)`), so the watchdog, the mixing rules and the comm log see each one.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

import torch

from .group import Group
from .handle import Handle
from .topology import Layout

# Which phases each op runs where: the backend of the intra-node phases must run the first
# family, the inter-node phase's backend the second (Runtime checks `supports` for both).
PHASES = {
    "all_reduce": ("reduce_scatter", "all_reduce"),
    "all_gather": ("all_gather", "all_gather"),
    "reduce_scatter": ("reduce_scatter", "reduce_scatter"),
    "all_to_all": ("all_to_all", "all_to_all"),
}


@dataclass
class NodeGroups:
    """A group's node-local and peer groups, made once per group (`groups_of`)."""

    local: Group  # my node's members of the group, in rank order
    peers: Group  # the members with my local index, one per node, in node order
    rank_at: list  # rank_at[k][j]: the group rank of the member at node k, local index j

    @property
    def nodes(self) -> int:
        return self.peers.size

    @property
    def per_node(self) -> int:
        return self.local.size

    @property
    def node_major(self) -> bool:
        """Whether group rank k*L + j sits at node k, local index j (ranks placed in blocks)."""
        per = self.per_node
        return all(r == k * per + j for k, row in enumerate(self.rank_at) for j, r in enumerate(row))

    @classmethod
    def of(cls, group: Group, layout: Layout, local: Group, peers: Group) -> "NodeGroups":
        return cls(local, peers, [[group.group_rank(r) for r in node] for node in layout.local])


def run(method: str, args: tuple, groups: NodeGroups, phase) -> None:
    """Run the caller's op `method` (an mcr.backends method name) with its `args`, as phases."""
    RUNNERS[method](groups, phase, *args)


def run_route(rt, route, group, method, args, async_op):
    """A node-aware route's op on runtime `rt`: each phase a blocking op that `rt.run` runs and
    watches like any other (the watchdog names the phase), the whole logged once under its
    candidate's label. An async call runs its phases before it returns: a later phase needs an
    earlier one's result, and issuing it from another thread later would break the issue order
    the mixing rules rest on; the handle comes back complete."""
    plan, groups = route.plan, groups_of(rt, group)
    family, started = route.op.family, perf_counter()

    def phase(where, phase_method, *phase_args):
        backend, sub = (plan.intra, groups.local) if where == "intra" else (plan.inter, groups.peers)
        nbytes = phase_args[1 if phase_method != "all_reduce" else 0].nbytes
        what = f"{family} via {plan.label}: {where}-node {phase_method}"
        op = route.op._replace(family=what, label=backend.name, nbytes=nbytes, group_size=sub.size)
        rt.run(op, sub, backend, phase_method, phase_args, False)

    run(method, args, groups, phase)
    if rt.comm_log is not None:
        rt.comm_log.record(route.op, perf_counter() - started)
    if not async_op:
        return None
    handle = Handle(lambda: None, lambda: True)
    handle.wait()
    handle.op = route.op
    return handle


def groups_of(rt, group) -> NodeGroups:
    """The group's node-local and peer groups, made by their members the first time a node-aware
    op runs on the group (every member is at that op: the choice is agreed), and kept on the
    group. With MPI ops in flight they are made beside a thread that keeps those moving (rule 3)."""
    if group.node_groups is not None:
        return group.node_groups
    layout = rt.topology.layout(group.ranks)
    node = next(k for k, members in enumerate(layout.local) if rt.rank in members)
    index = layout.local[node].index(rt.rank)

    def build():
        # released with the group (Group.release), not kept past a group torch destroys
        local = rt.member_group(("node", group.gid, "local", node), layout.local[node], keep=False)
        peers = rt.member_group(("node", group.gid, "peers", index), layout.peers[index], keep=False)
        return NodeGroups.of(group, layout, local, peers)

    group.node_groups = rt.driver.during(build)  # gloo connects through the store meanwhile
    return group.node_groups


# --- all-reduce --------------------------------------------------------------------------------
def all_reduce(groups, phase, tensor, reduce_op):
    flat, per = tensor.view(-1), groups.per_node
    n = flat.numel()
    part = -(-n // per)  # each local rank's share, the message padded to a multiple of L
    whole = flat if n == part * per else torch.zeros(part * per, dtype=flat.dtype, device=flat.device)
    if whole is not flat:
        whole[:n].copy_(flat)
    mine = torch.empty(part, dtype=flat.dtype, device=flat.device)
    phase("intra", "reduce_scatter_tensor", mine, whole, reduce_op)
    if groups.nodes > 1:
        phase("inter", "all_reduce", mine, reduce_op)
    phase("intra", "all_gather_into_tensor", whole, mine)
    if whole is not flat:
        flat.copy_(whole[:n])


# --- all-gather ----------------------------------------------------------------------------------
def all_gather_into_tensor(groups, phase, output, tensor):
    nodes, per = groups.nodes, groups.per_node
    m = tensor.numel()
    across = torch.empty(nodes * m, dtype=tensor.dtype, device=tensor.device)  # [node k]
    phase("inter", "all_gather_into_tensor", across, tensor.view(-1))
    direct = groups.node_major and (nodes == 1 or per == 1)  # [local j][node k] is already rank order
    gathered = output.view(-1) if direct else torch.empty(per * nodes * m, dtype=tensor.dtype, device=tensor.device)
    phase("intra", "all_gather_into_tensor", gathered, across)
    if not direct:  # [local j][node k] -> group rank order
        blocks = gathered.view(per, nodes, m)
        out = output.view(-1, m)
        for k, row in enumerate(groups.rank_at):
            for j, r in enumerate(row):
                out[r].copy_(blocks[j, k])


def all_gather(groups, phase, output_list, tensor):
    packed = torch.empty(len(output_list) * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    all_gather_into_tensor(groups, phase, packed, tensor.contiguous())
    for out, part in zip(output_list, packed.view(len(output_list), -1)):
        out.copy_(part.view_as(out))


# --- reduce-scatter --------------------------------------------------------------------------------
def reduce_scatter_tensor(groups, phase, output, input, reduce_op):
    nodes, per = groups.nodes, groups.per_node
    m = output.numel()
    blocks = input.view(-1, m)  # group rank order
    if groups.node_major and (nodes == 1 or per == 1):
        by_local = input.view(-1)
    else:  # -> [local j][node k]: local rank j reduces what its peers at every node will own
        by_local = torch.cat([blocks[groups.rank_at[k][j]] for j in range(per) for k in range(nodes)])
    node_sum = torch.empty(nodes * m, dtype=output.dtype, device=output.device)
    phase("intra", "reduce_scatter_tensor", node_sum, by_local, reduce_op)
    phase("inter", "reduce_scatter_tensor", output.view(-1), node_sum, reduce_op)


def reduce_scatter(groups, phase, output, input_list, reduce_op):
    reduce_scatter_tensor(groups, phase, output, torch.cat([t.reshape(-1) for t in input_list]), reduce_op)


# --- all-to-all ------------------------------------------------------------------------------------
def _a2a(phase, where, out, inp, out_counts, in_counts, uneven):
    """One all-to-all phase on flat tensors. Splits go with every rank's call or with none (MPI's
    Alltoall and Alltoallv do not match), so `uneven` is the call's, not this rank's counts'."""
    phase(where, "all_to_all_single", out, inp, out_counts if uneven else None, in_counts if uneven else None)


def _regroup(flat, counts, order):
    """The blocks of `flat` (sizes `counts`, in order) concatenated in `order` (block indices)."""
    parts = flat.split(counts)
    return torch.cat([parts[i] for i in order]) if parts else flat


def all_to_all_counts(groups, phase, out_flat, in_flat, recv_counts, send_counts, uneven):
    """The all-to-all of flat tensors: `send_counts[g]` elements to group rank g, `recv_counts[g]`
    from it. `uneven` (the same on every rank: splits were given, or the list form): counts may
    differ, so each rank first learns its node's send counts."""
    nodes, per, at = groups.nodes, groups.per_node, groups.rank_at
    me_j = groups.local.rank
    if uneven:  # sent[j][g]: what local rank j sends group rank g (on the data's device: NCCL takes no CPU tensor)
        mine = torch.tensor(send_counts, dtype=torch.int64, device=in_flat.device)
        sent = torch.empty(per * len(send_counts), dtype=torch.int64, device=in_flat.device)
        phase("intra", "all_gather_into_tensor", sent, mine)
        sent = sent.view(per, -1).tolist()
    else:
        sent = [list(send_counts)] * per
    # phase 1, inside the node: to local rank j, my blocks for local index j on every node
    order1 = [at[k][j] for j in range(per) for k in range(nodes)]
    send1 = _regroup(in_flat, list(send_counts), order1)
    in1 = [sum(send_counts[at[k][j]] for k in range(nodes)) for j in range(per)]
    got1 = [[sent[j][at[k][me_j]] for k in range(nodes)] for j in range(per)]  # [src local j][dst node k]
    recv1 = torch.empty(sum(map(sum, got1)), dtype=in_flat.dtype, device=in_flat.device)
    _a2a(phase, "intra", recv1, send1, [sum(row) for row in got1], in1, uneven)
    # phase 2, across nodes: to node k, what my node's ranks sent for (k, my local index)
    sizes1 = [c for row in got1 for c in row]
    send2 = _regroup(recv1, sizes1, [j * nodes + k for k in range(nodes) for j in range(per)])
    in2 = [sum(got1[j][k] for j in range(per)) for k in range(nodes)]
    from_rank = [[recv_counts[at[k][j]] for j in range(per)] for k in range(nodes)]  # [src node k][src local j]
    direct = groups.node_major
    recv2 = out_flat if direct else torch.empty(out_flat.numel(), dtype=out_flat.dtype, device=out_flat.device)
    _a2a(phase, "inter", recv2, send2, [sum(row) for row in from_rank], in2, uneven)
    if not direct:  # [src node k][src local j] -> group rank order
        sizes2 = [c for row in from_rank for c in row]
        position = {at[k][j]: k * per + j for k in range(nodes) for j in range(per)}
        out_flat.copy_(_regroup(recv2, sizes2, [position[g] for g in range(len(recv_counts))]))


def all_to_all_single(groups, phase, output, input, output_splits, input_splits):
    n = groups.nodes * groups.per_node
    uneven = bool(output_splits or input_splits)
    in_row = input.numel() // max(1, input.shape[0]) if input.dim() else 1
    out_row = output.numel() // max(1, output.shape[0]) if output.dim() else 1
    send = [s * in_row for s in input_splits] if input_splits else [input.numel() // n] * n
    recv = [s * out_row for s in output_splits] if output_splits else [output.numel() // n] * n
    all_to_all_counts(groups, phase, output.view(-1), input.view(-1), recv, send, uneven)


def all_to_all(groups, phase, output_list, input_list):
    packed_in = torch.cat([t.reshape(-1) for t in input_list])
    recv = [t.numel() for t in output_list]
    packed_out = torch.empty(sum(recv), dtype=packed_in.dtype, device=packed_in.device)
    # the list form's sizes may differ on some ranks only: every rank exchanges its counts
    all_to_all_counts(groups, phase, packed_out, packed_in, recv, [t.numel() for t in input_list], True)
    for out, part in zip(output_list, packed_out.split(recv)):
        out.copy_(part.view_as(out))


RUNNERS = {
    "all_reduce": all_reduce,
    "all_gather": all_gather,
    "all_gather_into_tensor": all_gather_into_tensor,
    "reduce_scatter": reduce_scatter,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "all_to_all": all_to_all,
    "all_to_all_single": all_to_all_single,
}
