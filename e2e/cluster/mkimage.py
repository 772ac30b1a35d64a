#!/usr/bin/env python3
"""Pack a root filesystem directory into a single-layer docker-archive tar
that `ctr images import` accepts. No Docker engine or registry needed.

usage: mkimage.py ROOTFS TAG OUT.tar --entrypoint '["/bin/x"]' [--user 65532] [--env K=V ...] [--workdir /]
"""
import argparse
import hashlib
import io
import json
import os
import tarfile
import time


def build_layer(rootfs: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                arc = os.path.relpath(full, rootfs)
                info = tar.gettarinfo(full, arcname=arc)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("rootfs")
    p.add_argument("tag")
    p.add_argument("out")
    p.add_argument("--entrypoint", default="[]")
    p.add_argument("--cmd", default="[]")
    p.add_argument("--user", default="")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--workdir", default="/")
    a = p.parse_args()

    layer = build_layer(a.rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
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
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "trainyard e2e/cluster/mkimage.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [a.tag], "Layers": ["layer.tar"]}]

    with tarfile.open(a.out, mode="w") as out:
        for name, data in ((config_name, config_bytes), ("layer.tar", layer),
                           ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    print(f"mkimage: {a.tag} -> {a.out} ({len(layer) // 1024} KiB layer)")


if __name__ == "__main__":
    main()
