"""C under Python and Python under C: compress_many() spends its time in zlib.compress,
sort_many() in list.sort calling the Python key function sort_key().
usage: calls.py SECONDS"""
import random
import sys
import time
import zlib

DATA = bytes(random.Random(1).getrandbits(8) for _ in range(4096)) * 64
ITEMS = [random.Random(2).random() for _ in range(20000)]


def compress_many():
    for _ in range(4):
        zlib.compress(DATA, 9)


def sort_key(v):
    return -v


def sort_many():
    for _ in range(2):
        sorted(ITEMS, key=sort_key)


end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    compress_many()
    sort_many()
