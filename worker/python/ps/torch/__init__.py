"""ps.torch: any PyTorch model trained data-parallel through the parameter server.

CPU or CUDA float32 parameters, one process per worker, optionally several
local replicas of the model per process (replicas=). docs/pytorch.md shows
it in use:

    import ps.torch
    ps.torch.init()                      # PS_SERVERS, RANK, WORLD_SIZE
    opt = ps.torch.DistributedOptimizer(None, model.named_parameters())
    for x, y in loader:                  # this worker's part of each batch
        opt.zero_grad()
        loss_fn(model(x), y).backward()  # buckets are pushed as they are ready
        opt.step(num_samples=len(x))     # waits for the next version

Errors are ps.Error (code, message), as ps._native raises them.
"""

from ps.torch._core import (DistributedOptimizer, broadcast_parameters, init, initialized,
                            rank, registration, shutdown, size)

__all__ = ["DistributedOptimizer", "broadcast_parameters", "init", "initialized", "rank",
           "registration", "shutdown", "size"]
