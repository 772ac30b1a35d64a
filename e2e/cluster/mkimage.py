#!/usr/bin/env python3
"""Pack root filesystem layers into a docker-archive tar that `ctr images import`
accepts. No Docker engine or registry needed.

usage:
  mkimage.py ROOTFS TAG OUT.tar [--base-layer LAYER.tar]... [--entrypoint '["/bin/x"]']
             [--cmd '[...]'] [--user 65532] [--env K=V]... [--workdir /]
  mkimage.py --layer-only ROOTFS LAYER.tar

Layers are streamed through files, never held in memory, so a root filesystem of a
gigabyte (the PyTorch trainer) packs in constant memory. `--layer-only` writes one layer
that a later call stacks under the top one with `--base-layer`: the harness caches the
PyTorch layer that way and only repacks the small layer holding the script.
"""
import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
import time

# Never packed: the runtime mounts these, and apt's caches only make the layer larger.
SKIP_CONTENTS = {"dev", "proc", "sys", "run"}


def write_layer(rootfs: str, out: str) -> None:
    """A reproducible layer: sorted entries, owner root, mtime 0, hard links kept."""
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, rootfs)
            if rel_dir in SKIP_CONTENTS:
                dirnames.clear()
                continue
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                arc = os.path.relpath(full, rootfs)
                info = tar.gettarinfo(full, arcname=arc)
                if info.ischr() or info.isblk() or info.isfifo():
                    continue
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layer-only", action="store_true")
    p.add_argument("rootfs")
    p.add_argument("tag_or_out")
    p.add_argument("out", nargs="?")
    p.add_argument("--base-layer", action="append", default=[])
    p.add_argument("--entrypoint", default="[]")
    p.add_argument("--cmd", default="[]")
    p.add_argument("--user", default="")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--workdir", default="/")
    a = p.parse_args()

    if a.layer_only:
        if a.out is not None:
            p.error("--layer-only takes ROOTFS and LAYER.tar")
        tmp = a.tag_or_out + ".tmp"
        write_layer(a.rootfs, tmp)
        os.replace(tmp, a.tag_or_out)
        print(f"mkimage: layer {a.tag_or_out} ({os.path.getsize(a.tag_or_out) // 1024} KiB)")
        return
    if a.out is None:
        p.error("missing OUT.tar")
    for base in a.base_layer:
        if not os.path.isfile(base):
            sys.exit(f"mkimage: --base-layer {base}: no such file")

    top = a.out + ".layer.tmp"
    write_layer(a.rootfs, top)
    layers = a.base_layer + [top]
    diff_ids = [sha256_file(layer) for layer in layers]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0)),
        "config": {
            "Entrypoint": json.loads(a.entrypoint) or None,
            "Cmd": json.loads(a.cmd) or None,
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"] + a.env,
            "User": a.user,
            "WorkingDir": a.workdir,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "trainyard e2e/cluster/mkimage.py"} for _ in layers],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    names = [f"layer{i}.tar" for i in range(len(layers))]
    manifest = [{"Config": config_name, "RepoTags": [a.tag_or_out], "Layers": names}]

    tmp_out = a.out + ".tmp"
    with tarfile.open(tmp_out, mode="w") as out:
        for name, data in ((config_name, config_bytes),
                           ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
        for name, layer in zip(names, layers):
            out.add(layer, arcname=name)
    os.remove(top)
    os.replace(tmp_out, a.out)
    size = sum(os.path.getsize(layer) for layer in a.base_layer) // 1024
    print(f"mkimage: {a.tag_or_out} -> {a.out} ({len(layers)} layer(s), {size} KiB below the top)")


if __name__ == "__main__":
    main()
