#!/usr/bin/env python3
"""The GPU architectures a binary carries code for, read from its .nv_fatbin
section (this toolkit ships no cuobjdump here):

    objcopy -O binary --only-section=.nv_fatbin BINARY fatbin.bin
    python3 deploy/dev/gpu/fatbin_archs.py fatbin.bin    # e.g. "sm_80 sm_90 ptx:compute_90"

The section is a run of fat binaries, each a 16-byte header (magic
0xBA55ED50, version, header size, payload size) and entries, each with its
own header: kind (1 PTX, 2 ELF machine code) at byte 0, header size at 4,
padded payload size at 8, architecture (e.g. 90) at 28. Exit status 1 when
the file holds no fat binary.
"""

import struct
import sys

MAGIC = 0xBA55ED50


def archs(data):
    found = set()
    off = 0
    while off + 16 <= len(data):
        magic, _, header, size = struct.unpack_from("<IHHQ", data, off)
        if magic != MAGIC:
            off += 8  # fat binaries are 8-byte aligned in the section
            continue
        entry, end = off + header, off + header + size
        while entry + 32 <= end:
            kind, _, entry_header, padded = struct.unpack_from("<HHII", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            found.add(f"sm_{arch}" if kind == 2 else f"ptx:compute_{arch}")
            entry += entry_header + padded
        off = end
    return sorted(found)


def main():
    with open(sys.argv[1], "rb") as f:
        found = archs(f.read())
    print(" ".join(found))
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
