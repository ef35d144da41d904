"""What a filesystem branch keeps, as a jail sees it (checkpoints, forks and snapshots compared
entry by entry): ``SETUP`` makes one of every kind a cut must keep, ``manifest`` lists them."""

from __future__ import annotations

import json

from jailbox.sandbox import Sandbox

# What a checkpoint keeps, as the jail sees it: every entry under the writable parts of the host
# rootfs's tree, with kind, mode, owners, size, allocated blocks (holes), content hash, link
# target, user xattrs, and which entries share an inode.
MANIFEST = r"""
import hashlib, json, os, stat
out, inodes = {}, {}
for top in ("/root", "/etc", "/home", "/opt", "/var"):
    for here, dirs, files in os.walk(top):
        for name in [".", *dirs, *files]:
            path = os.path.normpath(os.path.join(here, name))
            st = os.lstat(path)
            entry = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
            if stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
                entry += [st.st_size, st.st_blocks * 512 < st.st_size, digest]
                if st.st_nlink > 1:
                    inodes.setdefault(st.st_ino, []).append(path)
                    entry.append(st.st_ino)
            elif stat.S_ISLNK(st.st_mode):
                entry.append(os.readlink(path))
            if not stat.S_ISLNK(st.st_mode):
                keys = [k for k in os.listxattr(path) if k.startswith("user.")]
                entry.append(sorted((k, os.getxattr(path, k).hex()) for k in keys))
            out[path] = entry
for paths in inodes.values():
    for path in paths:
        out[path][7] = min(paths)  # which entries share an inode, not its number
print(json.dumps(out, sort_keys=True))
"""

SETUP = r"""
set -e
mkdir -p /root/tree/sub /home/u
printf 'content\n' > /root/tree/file
head -c 300000 /dev/urandom > /root/tree/random
chmod 0600 /root/tree/random
truncate -s 8M /root/tree/sparse && printf 'end' | dd of=/root/tree/sparse bs=1 seek=4000000 conv=notrunc 2>/dev/null
ln -s /etc/passwd /root/tree/abs-link
ln -s ../nowhere /root/tree/dangling
ln /root/tree/file /root/tree/hardlink
mkfifo /root/tree/fifo
echo owned > /home/u/file && chown -R 1000:1001 /home/u && chmod 0640 /home/u/file
chown 65534:65534 /root/tree/sub
chmod 4755 /root/tree/file
python3 -c 'import os; os.setxattr("/root/tree/random", "user.note", b"kept")'
rm /etc/os-release
rm -rf /etc/profile.d && mkdir /etc/profile.d && echo new > /etc/profile.d/only
"""


def manifest(sb: Sandbox) -> dict:
    result = sb.exec(["python3", "-c", MANIFEST])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)
