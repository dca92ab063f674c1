"""Two Python functions in a 3:1 ratio of CPU: three() does three times one()'s work.
usage: ratio.py SECONDS"""
import sys
import time


def spin(n):
    x = 0
    for i in range(n):
        x += i
    return x


def three():
    return spin(30000) + spin(30000) + spin(30000)


def one():
    return spin(30000)


end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    three()
    one()
