"""Where a checkpoint's time goes, for a trainer state of the given size on the device: `torch.save` of
device tensors (device-to-host copies into pageable memory, then the write), the manifest's sha256 of
the file (one thread, as `detent_rl.checkpoint` hashes), fsync, and for comparison the device-to-host
copy alone, pageable and pinned (with the pinned allocation timed apart).

    python3 bench/checkpoint_probe.py [--gib 5.5] [--dir ~]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=5.5, help="state size (fp32 tensors of 4 MiB)")
    ap.add_argument("--dir", default=str(Path.home()), help="where the file is written (and removed)")
    args = ap.parse_args()
    tensors = [torch.randn(1024, 1024, device="cuda") for _ in range(round(args.gib * 256))]
    path = Path(args.dir) / "checkpoint_probe.pt"
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.save(tensors, path)
    t1 = time.perf_counter()
    with open(path, "rb") as f:
        hashlib.file_digest(f, "sha256")
    t2 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    t3 = time.perf_counter()
    print(f"torch.save {t1 - t0:.2f} s, sha256 {t2 - t1:.2f} s, fsync {t3 - t2:.2f} s, "
          f"{path.stat().st_size / 2**30:.2f} GiB")
    path.unlink()
    t0 = time.perf_counter()
    [x.to("cpu") for x in tensors]
    t1 = time.perf_counter()
    pinned = [torch.empty(x.shape, pin_memory=True) for x in tensors]
    t2 = time.perf_counter()
    for p, x in zip(pinned, tensors):
        p.copy_(x, non_blocking=True)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    print(f"device to host: pageable {t1 - t0:.2f} s; pinned allocation {t2 - t1:.2f} s, pinned copy {t3 - t2:.2f} s")


if __name__ == "__main__":
    main()
