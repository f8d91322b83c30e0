#!/usr/bin/env python3
"""Fails when a source file includes a header from a layer above its own.

The layers in src/, lowest first. A layer may include its own headers and
those of any layer below it; the public headers in include/ are visible to
core and above only.

Above src/ sit the plugins (plugin/<name>/): each may include core and
everything below it, and its own headers, but never another plugin's; and
nothing in src/ may include a plugin. Only src/transport/nccl/ names NCCL's
header: everything else reaches NCCL through its table and DeviceComm.
Tests, benchmarks and tools are not layered. Run by the test suite
(tests/meson.build).
"""
import pathlib
import re
import sys

LAYERS = ["common", "codec", "bootstrap", "transport", "coll", "optim", "core"]
SOURCES = {".h", ".cc", ".cu", ".cuh", ".def", ".c", ".cpp", ".hpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
NCCL_HEADER = re.compile(r'^\s*#\s*include\s*[<"]nccl\.h[>"]', re.M)
NCCL_ROOM = "src/transport/nccl/"


def layer_of(path: str):
    """'core', 'codec', ... for src/<layer>/..., 'plugin/<name>' for plugins."""
    parts = pathlib.PurePosixPath(path).parts
    if len(parts) >= 2 and parts[0] == "src" and parts[1] in LAYERS:
        return parts[1]
    if len(parts) >= 2 and parts[0] == "plugin":
        return f"plugin/{parts[1]}"
    return None


def is_plugin(layer) -> bool:
    return layer is not None and layer.startswith("plugin/")


def check_include(rel: str, mine: str, inc: str):
    """The reason `rel` (in layer `mine`) may not include `inc`, or None."""
    theirs = layer_of(inc)
    if is_plugin(mine):
        if is_plugin(theirs) and theirs != mine:
            return f"{rel}: plugin '{mine}' includes {inc} from another plugin '{theirs}'"
        return None  # core and below, the public headers and its own files
    if is_plugin(theirs):
        return f"{rel}: layer '{mine}' includes {inc} from '{theirs}'; src/ never includes plugins"
    if inc.startswith("squall/") and LAYERS.index(mine) < LAYERS.index("core"):
        return f"{rel}: includes public header {inc}; only core and the plugins may"
    if theirs is not None and LAYERS.index(theirs) > LAYERS.index(mine):
        return f"{rel}: layer '{mine}' includes {inc} from higher layer '{theirs}'"
    return None


def main(root: pathlib.Path) -> int:
    errors = []
    files = sorted((root / "src").rglob("*")) + sorted((root / "plugin").rglob("*"))
    for f in files:
        if f.suffix not in SOURCES or not f.is_file():
            continue
        rel = f.relative_to(root).as_posix()
        mine = layer_of(rel)
        if mine is None:
            continue
        text = f.read_text(errors="replace")
        for inc in INCLUDE.findall(text):
            reason = check_include(rel, mine, inc)
            if reason:
                errors.append(reason)
        if NCCL_HEADER.search(text) and not rel.startswith(NCCL_ROOM):
            errors.append(f"{rel}: includes nccl.h; only {NCCL_ROOM} may (use its NCCL table "
                          "and DeviceComm)")
    for e in errors:
        print(e, file=sys.stderr)
    plugins = sorted({layer_of(p.relative_to(root).as_posix())
                      for p in (root / "plugin").glob("*") if p.is_dir()})
    print(f"layering: {'FAILED' if errors else 'ok'} "
          f"({' < '.join(LAYERS)} < plugins: {', '.join(plugins) or 'none'})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
