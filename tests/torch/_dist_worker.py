"""One rank of the torchrun test (tests/torch/test_distributed.py); not a test module itself.

Each rank reads its shard of a dataset for two epochs, once through ``asyncflow.DataLoader``
and once through a ``Pipeline`` whose source is the sampler; rank 0 gathers every rank's
indices and checks them, then writes its verdict to the file named by argv[1].
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from asyncflow import DataLoader, DistributedSampler, Pipeline

N, EPOCHS, SEED = 103, 2, 17


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = [{"index": i} for i in range(N)]
    sampler = DistributedSampler(dataset, seed=SEED)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=3)
    shards = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        via_loader = [i for batch in loader for i in batch["index"].tolist()]
        via_pipeline = list(Pipeline(sampler).map(lambda i: dataset[i]["index"], concurrency=2))
        assert via_loader == via_pipeline, (rank, epoch)
        shards.append(via_loader)
    gathered: list[list[list[int]]] = [[] for _ in range(world)]
    dist.all_gather_object(gathered, {"rank": rank, "world": world, "shards": shards,
                                      "seen": (sampler.rank, sampler.num_replicas)})
    if rank == 0:
        verdict = check(gathered, world)
        with open(out_path, "w") as fh:
            json.dump(verdict, fh)
    dist.barrier()
    dist.destroy_process_group()


def check(gathered: list, world: int) -> dict:
    ranks = sorted(gathered, key=lambda g: g["rank"])
    orders = []
    for epoch in range(EPOCHS):
        shards = [r["shards"][epoch] for r in ranks]
        per_rank = len(shards[0])
        assert all(len(s) == per_rank for s in shards), "unequal shard sizes"
        # interleaving the shards rebuilds the padded global order every rank drew
        order = [shards[i % world][i // world] for i in range(per_rank * world)]
        assert sorted(order[:N]) == list(range(N)), "shards do not cover the dataset once"
        assert order[N:] == order[: len(order) - N], "padding is not torch's"
        firsts = [set(s) - set(order[N:]) for s in shards]
        for a in range(world):
            for b in range(a + 1, world):
                assert not firsts[a] & firsts[b], "shards overlap beyond the padding"
        orders.append(order)
    assert orders[0] != orders[1], "the order did not change between epochs"
    return {
        "ok": True,
        "world": world,
        "ranks_seen": [r["seen"] for r in ranks],
        "per_rank": len(ranks[0]["shards"][0]),
        "orders": orders,
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    main(sys.argv[1])
