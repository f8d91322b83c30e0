#!/usr/bin/env python3
"""Fails when a file in src/ includes a header from a layer above its own.

The layers, lowest first. A layer may include its own headers and those of
any layer below it; the public headers in include/ are visible to core and
above only. Run by the test suite (tests/meson.build).
"""
import pathlib
import re
import sys

LAYERS = ["common", "codec", "bootstrap", "transport", "coll", "optim", "core"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path: str):
    parts = pathlib.PurePosixPath(path).parts
    if len(parts) >= 2 and parts[0] == "src" and parts[1] in LAYERS:
        return parts[1]
    return None


def main(root: pathlib.Path) -> int:
    errors = []
    for f in sorted((root / "src").rglob("*")):
        if f.suffix not in {".h", ".cc", ".cu", ".cuh", ".def"}:
            continue
        rel = f.relative_to(root).as_posix()
        mine = layer_of(rel)
        if mine is None:
            continue
        for inc in INCLUDE.findall(f.read_text()):
            theirs = layer_of(inc)
            if inc.startswith("squall/") and LAYERS.index(mine) < LAYERS.index("core"):
                errors.append(f"{rel}: includes public header {inc}; only core may")
            elif theirs is not None and LAYERS.index(theirs) > LAYERS.index(mine):
                errors.append(f"{rel}: layer '{mine}' includes {inc} from higher layer '{theirs}'")
    for e in errors:
        print(e, file=sys.stderr)
    print(f"layering: {'FAILED' if errors else 'ok'} ({len(LAYERS)} layers: {' < '.join(LAYERS)})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
