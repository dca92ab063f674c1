"""The main interpreter runs fnMain on the main thread while a sub-interpreter, made and
run on a second thread, runs fnSub (and zlib, which releases the GIL): each burns SECONDS / 2
of its own thread's CPU (by CPU, not wall: the two threads share the GIL, 3.11 has one for
all interpreters, and on a loaded machine the waiting thread can get almost none of a
wall-clock span).
usage: subinterp.py SECONDS"""
import sys
import threading
import time
import _xxsubinterpreters as interpreters

SUB = """
import time
import zlib

DATA = bytes(range(256)) * 256 + bytes(i * 7 %% 251 for i in range(65536))


def spin(n):
    x = 0
    for i in range(n):
        x += i * i
    return x


def fnSub(secs):
    end = time.thread_time() + secs
    while time.thread_time() < end:
        spin(2000)
        zlib.compress(DATA, 9)  # without the GIL: deflate under fnSub all the same


fnSub(%f)
"""


def spin(n):
    x = 0
    for i in range(n):
        x += i * i
    return x


def fnMain(secs):
    end = time.thread_time() + secs
    while time.thread_time() < end:
        spin(2000)


failed = []


def in_sub(secs):
    try:
        sid = interpreters.create()
        interpreters.run_string(sid, SUB % secs)
        interpreters.destroy(sid)
    except BaseException as e:
        failed.append(e)
        raise


secs = float(sys.argv[1]) / 2
t = threading.Thread(target=in_sub, args=(secs,))
t.start()
fnMain(secs)
t.join()
if failed:
    sys.exit(1)
print("done")
