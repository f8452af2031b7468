#!/usr/bin/env python3
"""A NaN (or an infinity) written into one tensor of a checkpoint directory, the CRC-32 kept right.

    plant_nonfinite.py DIR TENSOR [nan|inf]

Finds TENSOR in DIR's *.safetensors files (model.safetensors, a shard of an index,
optimizer.safetensors), sets its middle element to NaN (default) or +infinity in place (F32, F16
or BF16), and, where DIR holds kiln's trainer_state.json, records the file's new CRC-32 there: the
file then passes every check but the finite one (runtime/checkpoint/finite_check.h), as weights
saved with a NaN in them would. Standard library only. Prints "FILE TENSOR".
"""
import glob
import json
import os
import struct
import sys
import zlib

BITS = {"F32": {"nan": b"\x00\x00\xc0\x7f", "inf": b"\x00\x00\x80\x7f"},
        "F16": {"nan": b"\x00\x7e", "inf": b"\x00\x7c"},
        "BF16": {"nan": b"\xc0\x7f", "inf": b"\x80\x7f"}}


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: plant_nonfinite.py DIR TENSOR [nan|inf]")
    d, name = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) == 4 else "nan"
    for path in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with open(path, "r+b") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            if name not in header:
                continue
            t = header[name]
            value = BITS[t["dtype"]][kind]
            begin, end = t["data_offsets"]
            count = (end - begin) // len(value)
            f.seek(8 + n + begin + (count // 2) * len(value))
            f.write(value)
        state = os.path.join(d, "trainer_state.json")
        if os.path.exists(state):
            s = json.load(open(state))
            s["files"][os.path.basename(path)] = zlib.crc32(open(path, "rb").read())
            json.dump(s, open(state, "w"))
        print(os.path.basename(path), name)
        return
    sys.exit(f"plant_nonfinite.py: no tensor {name!r} in {d}/*.safetensors")


if __name__ == "__main__":
    main()
