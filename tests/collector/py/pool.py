"""A thread pool: three workers, each burning CPU in a function of its own.
usage: pool.py SECONDS"""
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def burn(secs):
    end = time.thread_time() + secs
    x = 0
    while time.thread_time() < end:
        for i in range(1000):
            x += i
    return x


def work_a(secs):
    return burn(secs)


def work_b(secs):
    return burn(secs)


def work_c(secs):
    return burn(secs)


secs = float(sys.argv[1])
with ThreadPoolExecutor(max_workers=3) as ex:
    fs = [ex.submit(f, secs) for f in (work_a, work_b, work_c)]
    for f in fs:
        f.result()
