#!/usr/bin/env python3
"""tests/layout/include_floors.py -- no folder includes one above it (DESIGN.md, "Layout").

Each source folder is one floor; a file may include its own folder and the floors below it,
never a floor above nor a sibling on its own floor. The floors, written once:

    distributed/                          0   the ground floor
    kernels/                              1   kiln's CUDA kernels and their composite references
    models/  optim/  data/                2   (siblings: none includes another)
    parallel/                             3
    plan/                                 4   torch-free, never the trainer
    runtime/ (trainer/ checkpoint/        5   one floor: its parts include each other
              inference/ observe/)
    launch/                               6   main() and the commands

bench/, tests/, examples/ and tools/ stand outside the house and may include anything; no floor
may include them. Exits 1 naming every climbing include (file:line: include), 0 otherwise.
    python3 tests/layout/include_floors.py [REPO_ROOT]
"""
import os
import re
import sys

FLOORS = {"distributed": 0, "kernels": 1, "models": 2, "optim": 2, "data": 2, "parallel": 3, "plan": 4, "runtime": 5,
          "launch": 6}
OUTSIDE = {"bench", "tests", "examples", "tools", "cmake"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def floor_of(path):
    top = path.split("/", 1)[0]
    return top, FLOORS.get(top)


def check(root):
    bad, seen = [], 0
    for top in FLOORS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                seen += 1
                src_top, src_floor = floor_of(rel)
                with open(os.path.join(root, rel), encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue
                        inc_top, inc_floor = floor_of(m.group(1))
                        if inc_top in OUTSIDE:
                            bad.append(f"{rel}:{n}: includes \"{m.group(1)}\" ({inc_top}/ stands outside the floors)")
                        elif inc_floor is None or inc_top == src_top:
                            continue  # a library's own header, or the file's own folder
                        elif inc_floor > src_floor:
                            bad.append(f"{rel}:{n}: includes \"{m.group(1)}\", a floor above ({src_top}/ is floor "
                                       f"{src_floor}, {inc_top}/ floor {inc_floor})")
                        elif inc_floor == src_floor:
                            bad.append(f"{rel}:{n}: includes \"{m.group(1)}\", a sibling on its floor ({src_top}/ and "
                                       f"{inc_top}/ are both floor {src_floor})")
    return bad, seen


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    bad, seen = check(os.path.normpath(root))
    if seen == 0:
        print("include_floors: no source files found under", root)
        return 1
    for b in bad:
        print(b)
    if bad:
        print(f"include_floors: {len(bad)} include(s) climb a floor, in {seen} files")
        return 1
    print(f"include_floors: {seen} files, every include on its own floor or below")
    return 0


if __name__ == "__main__":
    sys.exit(main())
