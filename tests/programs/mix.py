# Threads, multiprocessing (fork and spawn) and ctypes in one CPython run;
# everything printed is deterministic.
import ctypes
import hashlib
import multiprocessing
import random
import sys
import threading


def square(x):
    return x * x


def digest_sum(i):
    return sum(hashlib.sha256(f"{i}:{j}".encode()).digest()[0] for j in range(3000))


def main():
    random.seed(12345)
    print("random", [random.randrange(1000) for _ in range(8)])

    results = [None] * 4
    lock = threading.Lock()
    counter = [0]

    def worker(i):
        results[i] = digest_sum(i)
        for _ in range(10000):
            with lock:
                counter[0] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("threads", results, counter[0])

    for method in ("fork", "spawn"):
        with multiprocessing.get_context(method).Pool(2) as pool:
            print(method, pool.map(square, range(12)), sum(pool.map(digest_sum, range(4))))

    # ctypes: plain calls into libc and a Python callback called from C
    # (libffi writes a closure trampoline at run time).
    libc = ctypes.CDLL("libc.so.6")
    libc.strlen.restype = ctypes.c_size_t
    print("strlen", libc.strlen(b"instrumented"))
    values = [random.randrange(-500, 500) for _ in range(64)]
    arr = (ctypes.c_int * len(values))(*values)
    cmp_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
    calls = [0]

    def cmp(a, b):
        calls[0] += 1
        return (a[0] > b[0]) - (a[0] < b[0])

    libc.qsort(arr, len(arr), ctypes.sizeof(ctypes.c_int), cmp_type(cmp))
    print("qsort", list(arr) == sorted(values), calls[0] > 0, list(arr)[:5])
    buf = ctypes.create_string_buffer(64)
    libc.snprintf(buf, 64, b"%d-%s-%.3f", 42, b"ctypes", ctypes.c_double(2.5))
    print("snprintf", buf.value.decode())
    sys.stderr.write("to stderr\n")
    sys.exit(3)


if __name__ == "__main__":
    main()
