"""Allocations from Python: make_buffers() allocates large bytearrays (through malloc),
small_objects() many small tuples (pymalloc, not seen by the agent).
usage: alloc.py SECONDS"""
import sys
import time


def make_buffers():
    keep = []
    for i in range(200):
        keep.append(bytearray(65536 + i))
    return len(keep)


def small_objects():
    return len([(i, i) for i in range(20000)])


end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    make_buffers()
    small_objects()
