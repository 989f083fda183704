"""Give a built virtualenv's console scripts the installed interpreter's shebang.

    python fix-script-shebangs.py BUILD_VENV INSTALLED_VENV

pip (distlib) writes a script's first line as ``#!/path/to/python`` unless that path is
longer than the kernel accepts in a shebang (127 bytes); then it writes a /bin/sh
trampoline instead::

    #!/bin/sh
    '''exec' "/long/build/path/bin/python" "$0" "$@"
    ' '''

dh-virtualenv only rewrites ``#!...python`` first lines to the installed path, so a package
built in a deep directory would ship trampolines that exec the build machine's path (and
that lintian reports as shell scripts that fail a syntax check). This rewrites every such
trampoline in BUILD_VENV/bin to ``#!INSTALLED_VENV/bin/python``; other files are left as they
are. Exit 0 always; prints what it changed.
"""

import os
import sys


def main(build_venv: str, installed_venv: str) -> None:
    """Rewrite the trampolines in ``build_venv``/bin (see the module docstring)."""
    bindir = os.path.join(build_venv, "bin")
    shebang = f"#!{installed_venv}/bin/python\n".encode()
    for name in sorted(os.listdir(bindir)):
        path = os.path.join(bindir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n", 3)
        if len(lines) < 4 or lines[0] != b"#!/bin/sh" or not lines[1].startswith(b"'''exec'"):
            continue
        if lines[2].strip() != b"' '''":
            continue
        with open(path, "wb") as f:
            f.write(shebang + lines[3])
        print(f"fix-script-shebangs: {name}: trampoline -> {shebang.decode().strip()}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
