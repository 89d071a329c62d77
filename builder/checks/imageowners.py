"""Who the image runs as and who owns its system files (issue 51), read from the image's files on
the host (imagefiles.py: /etc/passwd, /etc/group, each entry's owner, mode and file capability).

The runtime user (the config's ``User``: ``name`` or ``uid``, each with an optional ``:group``) as
the runtime and the programs in the image resolve it:

- a user *name* with no /etc/passwd entry (or a group name with no /etc/group entry): runc refuses
  to start the container ("unable to find user");
- a numeric uid with no entry starts, but getpass.getuser() (torch's caches) needs USER or LOGNAME in
  the Env, or it raises;
- the home (HOME in the Env, else what runc sets: the passwd entry's home, else "/") exists, is a
  directory and is writable by the user; where both are set they agree; /tmp exists and is writable
  by the user.

System directories and the library/binary directories are owned by root (uid 0), so no other user
of the image can replace what every process loads or runs; no file carries a file capability (the
``security.capability`` extended attribute: a PAX ``SCHILY.xattr.security.capability`` record).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass

from builder.checks import imagefiles

SYSTEM_DIRS = (
    "/",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/usr",
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libexec",
    "/usr/local",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/usr/local/lib",
    # Debian's multiarch library directories (libc and most system libraries) and the loader's
    # configuration, which names more
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/etc/ld.so.conf.d",
)
# Their direct contents are judged too where they are directories holding what runs and loads.
CONTENT_DIRS = ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")
GETPASS_VARS = ("LOGNAME", "USER", "LNAME", "USERNAME")  # getpass.getuser() reads these first


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


def accounts(files: imagefiles.ImageFiles) -> list[Account]:
    found = []
    for line in files.texts.get("/etc/passwd", b"").decode("utf-8", "replace").splitlines():
        parts = line.split(":")
        if len(parts) >= 7 and parts[2].isdigit() and parts[3].isdigit():
            found.append(Account(parts[0], int(parts[2]), int(parts[3]), parts[5]))
    return found


def groups(files: imagefiles.ImageFiles) -> dict[str, int]:
    found = {}
    for line in files.texts.get("/etc/group", b"").decode("utf-8", "replace").splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            found[parts[0]] = int(parts[2])
    return found


def writable_by(entry: imagefiles.Entry, uid: int, gid: int) -> bool:
    """Whether ``uid`` (primary group ``gid``) may write in ``entry`` by its mode (root always may)."""
    if uid == 0:
        return True
    if entry.uid == uid:
        return bool(entry.mode & stat.S_IWUSR)
    if entry.gid == gid:
        return bool(entry.mode & stat.S_IWGRP)
    return bool(entry.mode & stat.S_IWOTH)


def user_findings(
    files: imagefiles.ImageFiles, user: str, env: dict[str, str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """(findings, notes) for the config's ``user`` as the runtime and the image resolve it."""
    name, _, group = (user or "root").partition(":")
    name = name or "root"
    known = accounts(files)
    account = next((a for a in known if (a.uid == int(name) if name.isdigit() else a.name == name)), None)
    found: list[tuple[str, str]] = []
    notes: list[str] = []
    if account is None and not name.isdigit():
        return [("/etc/passwd", f"User {name!r} has no entry: the runtime refuses to start the container")], notes
    if group and not group.isdigit() and group not in groups(files):
        found.append(("/etc/group", f"group {group!r} has no entry: the runtime refuses to start the container"))
    uid = account.uid if account else int(name)
    gid = int(group) if group.isdigit() else groups(files).get(group, account.gid if account else uid)
    if account is None:
        notes.append(f"uid {uid} has no /etc/passwd entry: getpass reads the Env, the runtime sets HOME=/ if unset")
        if not any(env.get(v) for v in GETPASS_VARS):
            found.append(
                (
                    "/etc/passwd",
                    f"uid {uid} has no entry and the Env sets no {'/'.join(GETPASS_VARS)}: getpass.getuser() raises",
                )
            )
    elif env.get("HOME") and env["HOME"].rstrip("/") != account.home.rstrip("/"):
        # Shown, not failed: the Env's HOME is the one the process gets (runc sets the passwd home
        # only when the Env has none), and that home is held to being writable below.
        notes.append(f"HOME={env['HOME']!r} in the Env, where {account.name}'s /etc/passwd home is {account.home!r}")
    # runc sets HOME, when the Env does not, to the passwd entry's home, else "/" (libcontainer setupUser)
    home = env.get("HOME") or (account.home if account else "") or "/"
    for what, path in (("home", home), ("/tmp", "/tmp")):
        entry = files.resolve(path)
        if entry is None and path == "/":  # an export carries no entry for the root directory itself
            found.append((path, f"the {what} of uid {uid} is the root directory, not shown writable by it"))
        elif entry is None or entry.kind != "dir":
            found.append((path, f"the {what} of uid {uid} is not a directory in the image"))
        elif not writable_by(entry, uid, gid):
            found.append(
                (
                    path,
                    f"the {what} of uid {uid} is not writable by it "
                    f"(mode {oct(entry.mode & 0o7777)}, owner {entry.uid}:{entry.gid})",
                )
            )
    return found, notes


def ownership_findings(files: imagefiles.ImageFiles) -> list[tuple[str, str]]:
    """System directories (and what the binary directories hold) not owned by root."""
    found = []
    for path in SYSTEM_DIRS:
        entry = files.entries.get(path)
        if entry is not None and entry.kind == "dir" and entry.uid != 0:
            found.append((path, f"owned by uid {entry.uid}, not root"))
    for top in CONTENT_DIRS:
        entry = files.entries.get(top)
        if entry is None or entry.kind != "dir":
            continue
        prefix = top + "/"
        for path, e in sorted(files.entries.items()):
            if path.startswith(prefix) and "/" not in path[len(prefix) :] and e.uid != 0 and e.kind != "link":
                found.append((path, f"owned by uid {e.uid}, not root"))
    return found


def capability_findings(files: imagefiles.ImageFiles) -> list[tuple[str, str]]:
    """Every file carrying a file capability."""
    return [
        (path, f"carries a file capability (security.capability {e.capability[:20].hex()})")
        for path, e in sorted(files.entries.items())
        if e.capability
    ]
