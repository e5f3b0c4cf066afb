"""Unpacks a saved OCI image archive (podman save --format oci-archive) into a
directory, as a container runtime would lay out its root filesystem: every
layer in order, whiteouts applied. Prints the image's config (User,
Entrypoint, Cmd, Labels...) as JSON on stdout.

Running containers is refused on these machines (rlimit and cgroup setup), so
scripts/image --check runs the unpacked entrypoint in a chroot instead.

Usage: python oci_unpack.py <archive.tar> <rootfs dir>
"""
import json
import os
import shutil
import sys
import tarfile
import tempfile

# Extraction filters exist from Python 3.11.4 (Debian 12 ships 3.11.2); layer
# entries are checked above either way.
FILTER = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}


def blob(layout: str, digest: str) -> str:
    algorithm, value = digest.split(":", 1)
    return os.path.join(layout, "blobs", algorithm, value)


def apply_layer(path: str, rootfs: str) -> None:
    with tarfile.open(path, mode="r:*") as layer:
        members = []
        for member in layer.getmembers():
            name = os.path.normpath(member.name).lstrip("/")
            if name.startswith(".."):
                raise SystemExit(f"layer entry outside the root: {member.name}")
            base = os.path.basename(name)
            parent = os.path.join(rootfs, os.path.dirname(name))
            if base == ".wh..wh..opq":
                # Opaque directory: drop what lower layers put there.
                for entry in os.listdir(parent) if os.path.isdir(parent) else []:
                    target = os.path.join(parent, entry)
                    shutil.rmtree(target) if os.path.isdir(target) and not os.path.islink(target) else os.remove(target)
                continue
            if base.startswith(".wh."):
                target = os.path.join(parent, base[len(".wh."):])
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                elif os.path.lexists(target):
                    os.remove(target)
                continue
            members.append(member)
        layer.extractall(rootfs, members=members, numeric_owner=True, **FILTER)


def main() -> None:
    archive, rootfs = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as layout:
        with tarfile.open(archive) as tar:
            tar.extractall(layout, **FILTER)
        with open(os.path.join(layout, "index.json")) as f:
            index = json.load(f)
        if len(index["manifests"]) != 1:
            raise SystemExit(f"expected one image in {archive}, found {len(index['manifests'])}")
        with open(blob(layout, index["manifests"][0]["digest"])) as f:
            manifest = json.load(f)
        with open(blob(layout, manifest["config"]["digest"])) as f:
            config = json.load(f)
        os.makedirs(rootfs, exist_ok=True)
        for layer in manifest["layers"]:
            apply_layer(blob(layout, layer["digest"]), rootfs)
        # What the image weighs: its layers as stored (compressed or not).
        config["layersBytes"] = sum(layer["size"] for layer in manifest["layers"])
        json.dump(config, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
