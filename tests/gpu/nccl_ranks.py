"""The 2-GPU NCCL deadlock drill.

    python nccl_ranks.py launcher PORT   # starts rank 0 and rank 1 in its own process group, exits
    python nccl_ranks.py rank R PORT

The launcher exits at once, so both ranks are re-parented away from it (as vLLM/SGLang workers
are) but stay in its process group. Each rank ignores SIGTERM, takes 4 GiB, joins a warm-up
all-reduce, then rank 0 enters an all-reduce that rank 1 never joins: rank 0 blocks in C++
(cuda synchronize) where no Python signal handler could run, rank 1 idles. Only SIGKILL ends them.
"""

import os
import signal
import subprocess
import sys
import time


def launcher(port: str) -> None:
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    ranks = [subprocess.Popen([sys.executable, __file__, "rank", str(r), port], env=env) for r in (0, 1)]
    print("LAUNCHED", " ".join(str(p.pid) for p in ranks), flush=True)


def rank(r: int, port: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(r)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=2,
                            device_id=torch.device("cuda", r))
    held = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    held.fill_(1)
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"rank{r} warm", flush=True)
    if r == 0:
        time.sleep(1)
        print("rank0 entering the collective rank 1 never joins", flush=True)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        print("rank0 UNREACHABLE", flush=True)
    else:
        print("rank1 idle", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1] == "launcher":
        launcher(sys.argv[2])
    else:
        rank(int(sys.argv[2]), sys.argv[3])
