"""The NCCL deadlock drill, one rank per GPU (2 on a 2-GPU node, 8 on an 8-GPU node).

    python nccl_ranks.py launcher PORT [WORLD [wait]]   # starts WORLD ranks (default 2) in its group
    python nccl_ranks.py rank R PORT [WORLD]

The launcher exits at once, so every rank is re-parented away from it (as vLLM/SGLang workers
are) but stays in its process group; with `wait` it stays until the ranks end (as torchrun or a
server's main process does), so the group can be supervised as a service that never gets ready. Each rank ignores SIGTERM, takes 4 GiB, joins a warm-up
all-reduce, then rank 0 enters an all-reduce that the other ranks never join: rank 0 blocks in C++
(cuda synchronize) where no Python signal handler could run, the others idle. Only SIGKILL ends them.
"""

import os
import signal
import subprocess
import sys
import time


def launcher(port: str, world: int) -> None:
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    ranks = [subprocess.Popen([sys.executable, __file__, "rank", str(r), port, str(world)], env=env)
             for r in range(world)]
    print("LAUNCHED", " ".join(str(p.pid) for p in ranks), flush=True)
    if "wait" in sys.argv[4:]:
        for p in ranks:
            p.wait()


def rank(r: int, port: str, world: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(r)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=world,
                            device_id=torch.device("cuda", r))
    held = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    held.fill_(1)
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"rank{r} warm", flush=True)
    if r == 0:
        time.sleep(1)
        print("rank0 entering the collective the other ranks never join", flush=True)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        print("rank0 UNREACHABLE", flush=True)
    else:
        print(f"rank{r} idle", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1] == "launcher":
        launcher(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    else:
        rank(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 2)
