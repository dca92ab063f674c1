"""A CPU-bound Python program for bench/collector/python.sh: fixed work (ROUNDS rounds of
pure-Python arithmetic, dict and string work) under a stack ~12 Python frames deep.
usage: burn.py ROUNDS"""
import sys


def leaf(n):
    d = {}
    s = 0
    for i in range(n):
        s += i * i % 7
        d[i & 63] = str(i)
    return s + len(d)


def level(depth, n):
    if depth == 0:
        return leaf(n)
    return level(depth - 1, n)


def main(rounds):
    t = 0
    for _ in range(rounds):
        t += level(10, 2000)
    return t


main(int(sys.argv[1]))
