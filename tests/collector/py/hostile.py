"""Frames rewritten while sampled: generators, coroutines, recursion to the limit,
exceptions in flight, threads starting and ending, sub-interpreters made, run (with a
thread of their own) and destroyed all the time on another thread. Prints "done" at the
end.
usage: hostile.py SECONDS"""
import asyncio
import sys
import threading
import time
import _xxsubinterpreters as interpreters


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


SUB = """
import threading


def subgen(n):
    for i in range(n):
        yield i * i


def subwork():
    try:
        return sum(sum(subgen(50)) for _ in range(100)) // 0
    except ZeroDivisionError:
        return 0


t = threading.Thread(target=subwork)
t.start()
subwork()
t.join()
"""


made = []


def sub_interpreter():
    sid = interpreters.create(isolated=False)  # threads allowed
    interpreters.run_string(sid, SUB)
    interpreters.destroy(sid)
    made.append(int(sid))


def sub_churn(stop):
    while not stop.is_set():
        sub_interpreter()


stop = threading.Event()
churn = threading.Thread(target=sub_churn, args=(stop,))
churn.start()
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    gens()
    asyncio.run(fan())
    recurse()
    exceptions()
    threads()
    sub_interpreter()
stop.set()
churn.join()
print("sub-interpreters %d, last id %d" % (len(made), max(made)))
print("done")
