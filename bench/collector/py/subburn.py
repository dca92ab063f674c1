"""burn.py's work in a sub-interpreter (made and run on a second thread) while the main
interpreter does the same on the main thread: the handler's cost where it must find the
state a thread runs (collector/README.md "Python"). usage: subburn.py ROUNDS"""
import os
import sys
import threading
import _xxsubinterpreters as interpreters

BURN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "burn.py")
rounds = int(sys.argv[1]) // 2
src = open(BURN).read().replace("main(int(sys.argv[1]))", "main(%d)" % rounds)


def in_sub():
    sid = interpreters.create()
    interpreters.run_string(sid, src)
    interpreters.destroy(sid)


t = threading.Thread(target=in_sub)
t.start()
exec(compile(src, BURN, "exec"), {"__name__": "burn"})
t.join()
