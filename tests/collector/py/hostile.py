"""Frames rewritten while sampled: generators, coroutines, recursion to the limit,
exceptions in flight, threads starting and ending. Prints "done" at the end.
usage: hostile.py SECONDS"""
import asyncio
import sys
import threading
import time


def gen(n):
    for i in range(n):
        yield i * i


def gens():
    return sum(sum(gen(50)) for _ in range(200))


async def leaf(i):
    await asyncio.sleep(0)
    return i


async def fan():
    return sum(await asyncio.gather(*(leaf(i) for i in range(200))))


def deep(n):
    return deep(n + 1)


def recurse():
    try:
        deep(0)
    except RecursionError:
        pass


def raising(n):
    if n == 0:
        raise ValueError("x")
    return raising(n - 1)


def exceptions():
    for _ in range(200):
        try:
            raising(30)
        except ValueError:
            pass


def short_thread():
    gens()


def threads():
    ts = [threading.Thread(target=short_thread) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    gens()
    asyncio.run(fan())
    recurse()
    exceptions()
    threads()
print("done")
